/* smetrics.c - coupon-sync metrics (atomics) and the Prometheus text file. */
#include "config.h"
#include "smetrics.h"
#include "cs.h"
#include "keys.h"
#include "log.h"

#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static atomic_uint_fast64_t sm_count[SM_COUNTERS];
static atomic_int_fast64_t sm_depth[KEYS_SHARDS];
static atomic_int_fast64_t sm_last_success_ms;
static atomic_int sm_down[2];
static _Atomic int64_t sm_down_at[2]; /* cs_mono_ms() when the outage was noticed */

/* A success this soon after a failure may be an operation that began before
 * the outage (another thread's commit finishing); it does not end it. */
#define SM_RECOVERY_AFTER_MS 1000

static const char *const sm_dep_names[] = {"Redis", "MySQL"};

/* Name and help of each counter, by enum smetrics_counter. */
static const struct {
    const char *name, *help;
} sm_counters[SM_COUNTERS] = {
    [SM_ROWS] = {"couponseize_sync_rows_total", "Coupon rows inserted into MySQL."},
    [SM_BATCHES] = {"couponseize_sync_batches_total", "Batches committed to MySQL."},
    [SM_ERRORS] = {"couponseize_sync_errors_total",
                   "Failed drain tasks and jobs (Redis or MySQL errors)."},
    [SM_DEAD] = {"couponseize_sync_dead_letters_total",
                 "Queue entries moved to QUEUE:COUPON:SEIZE:DEAD:{i}."},
    [SM_EXPIRED] = {"couponseize_sync_coupons_expired_total",
                    "Unused coupons past valid_until marked expired (returned ones included)."},
    [SM_RETURNED] = {"couponseize_sync_coupons_returned_total",
                     "Expired coupons whose stock went back to their open sale (return on "
                     "expiry)."},
    [SM_MISMATCHES] = {"couponseize_sync_reconcile_mismatches_total",
                       "Activities where Redis stock + queued + MySQL coupons != total_num."},
};

void smetrics_add(enum smetrics_counter c, uint64_t n)
{
    atomic_fetch_add(&sm_count[c], n);
}

void smetrics_set_depth(int shard, int64_t depth)
{
    if (shard >= 0 && shard < KEYS_SHARDS)
        atomic_store(&sm_depth[shard], depth);
}

void smetrics_success(int64_t now_ms)
{
    int_fast64_t cur = atomic_load(&sm_last_success_ms);
    while (cur < now_ms && !atomic_compare_exchange_weak(&sm_last_success_ms, &cur, now_ms)) {
    }
}

uint64_t smetrics_rows(void)
{
    return atomic_load(&sm_count[SM_ROWS]);
}

uint64_t smetrics_errors(void)
{
    return atomic_load(&sm_count[SM_ERRORS]);
}

void smetrics_dep_fail(enum smetrics_dep dep, const char *why)
{
    atomic_fetch_add(&sm_count[SM_ERRORS], 1);
    if (atomic_load(&sm_down[dep]) == 0)
        atomic_store(&sm_down_at[dep], cs_mono_ms());
    if (atomic_exchange(&sm_down[dep], 1) == 0)
        log_error("%s failing: %s; queued entries stay in Redis and are retried every tick "
                  "(logged again only after it recovers)", sm_dep_names[dep], why);
}

void smetrics_dep_ok(enum smetrics_dep dep)
{
    /* A load first keeps the common path free of cache-line writes. */
    if (atomic_load(&sm_down[dep]) &&
        cs_mono_ms() - atomic_load(&sm_down_at[dep]) >= SM_RECOVERY_AFTER_MS &&
        atomic_exchange(&sm_down[dep], 0) == 1)
        log_notice("%s works again", sm_dep_names[dep]);
}

static void sm_counter(FILE *f, const char *name, const char *help, uint64_t v)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s counter\n%s %" PRIu64 "\n", name, help, name, name, v);
}

int smetrics_write(const char *path)
{
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= sizeof(tmp)) {
        log_error("metrics file name too long: %s", path);
        return CS_ERR;
    }
    FILE *f = fopen(tmp, "w");
    if (f == NULL) {
        log_error("fopen(%s) failed: %s", tmp, strerror(errno));
        return CS_ERR;
    }
    fprintf(f, "# HELP couponseize_build_info The running build of coupon-sync (always 1).\n"
               "# TYPE couponseize_build_info gauge\n"
               "couponseize_build_info{program=\"coupon-sync\",version=\"%s\"} 1\n",
            PACKAGE_VERSION);
    for (int c = 0; c < SM_COUNTERS; c++)
        sm_counter(f, sm_counters[c].name, sm_counters[c].help, atomic_load(&sm_count[c]));
    fprintf(f, "# HELP couponseize_sync_queue_depth Entries waiting in QUEUE:COUPON:SEIZE:SYNC:{i}.\n"
               "# TYPE couponseize_sync_queue_depth gauge\n");
    for (int i = 0; i < KEYS_SHARDS; i++)
        fprintf(f, "couponseize_sync_queue_depth{shard=\"%d\"} %" PRIdFAST64 "\n", i,
                atomic_load(&sm_depth[i]));
    int64_t last = atomic_load(&sm_last_success_ms);
    fprintf(f, "# HELP couponseize_sync_last_success_timestamp_seconds "
               "Unix time of the last drain task that finished without error.\n"
               "# TYPE couponseize_sync_last_success_timestamp_seconds gauge\n"
               "couponseize_sync_last_success_timestamp_seconds %.3f\n", (double)last / 1000.0);
    /* What malloc holds, over all its arenas: in use by the program, free
     * but kept, and in blocks of their own (mmap). Tells a leak (in_use
     * grows) from fragmentation (free grows). */
    struct mallinfo2 mi = mallinfo2();
    fprintf(f, "# HELP couponseize_sync_heap_bytes Heap bytes by malloc's account.\n"
               "# TYPE couponseize_sync_heap_bytes gauge\n"
               "couponseize_sync_heap_bytes{state=\"in_use\"} %zu\n"
               "couponseize_sync_heap_bytes{state=\"free\"} %zu\n"
               "couponseize_sync_heap_bytes{state=\"mmap\"} %zu\n",
            mi.uordblks, mi.fordblks, mi.hblkhd);

    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        log_error("writing %s failed: %s", tmp, strerror(errno));
        unlink(tmp);
        return CS_ERR;
    }
    if (rename(tmp, path) != 0) {
        log_error("rename(%s, %s) failed: %s", tmp, path, strerror(errno));
        unlink(tmp);
        return CS_ERR;
    }
    return CS_OK;
}
