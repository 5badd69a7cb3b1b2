/* journal_bench.c - what a grant from the reserve pays for its journal record:
 * append + fdatasync per record, and a scan (replay's read) of what was written.
 *
 * Usage: journal_bench [DIR [N]]   (default: a new directory under /tmp, 1000)
 *
 * Appends N records to worker 0's journal of DIR, one fdatasync each, then
 * scans them back. Prints the per-append median, p99 and max, and the scan
 * time. The directory should be on the disk the journal will live on: /tmp
 * is often tmpfs, where an fsync costs nothing.
 */
#include "cs.h"
#include "journal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static int count(void *arg, const struct journal_rec *r)
{
    (void)r;
    (*(uint64_t *)arg)++;
    return 0;
}

int main(int argc, char **argv)
{
    char tmpl[] = "/tmp/cs-journal-bench.XXXXXX", err[512], path[4200];
    const char *dir = argc > 1 ? argv[1] : mkdtemp(tmpl);
    int n = argc > 2 ? atoi(argv[2]) : 1000;
    struct journal_dir jd;
    struct journal j;

    if (dir == NULL || n <= 0) {
        fprintf(stderr, "usage: journal_bench [DIR [N]]\n");
        return 2;
    }
    if (journal_dir_open(&jd, dir, err, sizeof(err)) != CS_OK
        || journal_open(&j, &jd, 0, err, sizeof(err)) != CS_OK) {
        fprintf(stderr, "journal_bench: %s\n", err);
        return 1;
    }
    int64_t *us = xmalloc((size_t)n * sizeof(*us));
    for (int i = 0; i < n; i++) {
        struct journal_rec r = {.activity_id = 1, .epoch = 1, .token = (uint32_t)i,
                                .user_id = 1000 + i, .seize_ms = cs_now_ms()};
        int64_t t0 = cs_mono_us();
        if (journal_append(&j, &r) != CS_OK)
            return 1;
        us[i] = cs_mono_us() - t0;
    }
    journal_close(&j);
    qsort(us, (size_t)n, sizeof(*us), cmp_i64);
    snprintf(path, sizeof(path), "%s/w0.jnl", dir);
    uint64_t seen = 0;
    int64_t t0 = cs_mono_us();
    if (journal_scan(path, count, &seen, NULL) != 0)
        return 1;
    int64_t scan_us = cs_mono_us() - t0;
    printf("journal %s: %d appends, fdatasync each: median %lld us, p99 %lld us, max %lld us; "
           "scan of %llu records %lld us\n", dir, n, (long long)us[n / 2],
           (long long)us[n * 99 / 100], (long long)us[n - 1], (unsigned long long)seen,
           (long long)scan_us);
    journal_dir_close(&jd);
    free(us);
    return 0;
}
