/* test_journal.c - the grant journal: records survive reopening, a torn tail
 * is cut off, damage is refused, the directory lock and the incarnation id,
 * and only a directory and files that nobody else can write are trusted. */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cs.h"
#include "journal.h"
#include "runner.h"

static char dir[64];
static char err[512];

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/cs-journal.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

static struct journal_rec rec_n(uint32_t n)
{
    struct journal_rec r = {.activity_id = 2200 + n % 3, .epoch = 7, .token = n,
                            .user_id = 9000000000LL + n, .seize_ms = 1764540000000LL + n};
    return r;
}

struct seen {
    uint32_t n;
    int in_order;
};

static int count_rec(void *arg, const struct journal_rec *r)
{
    struct seen *s = arg;
    struct journal_rec want = rec_n(s->n);
    if (r->activity_id != want.activity_id || r->epoch != want.epoch || r->token != want.token
        || r->user_id != want.user_id || r->seize_ms != want.seize_ms)
        s->in_order = 0;
    s->n++;
    return 0;
}

static off_t file_size(const char *path)
{
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    return st.st_size;
}

START_TEST(crc32c_known_value)
{
    /* The check value of CRC-32C (RFC 3720, iSCSI). */
    ck_assert_uint_eq(journal_crc32c(0, "123456789", 9), 0xE3069283u);
    ck_assert_uint_eq(journal_crc32c(journal_crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
}
END_TEST

START_TEST(records_survive_reopen)
{
    struct journal_dir jd;
    struct journal j;
    char path[128], inc[JOURNAL_ID_LEN + 1];

    ck_assert_int_eq(journal_dir_open(&jd, dir, err, sizeof(err)), CS_OK);
    ck_assert_int_eq((int)strlen(jd.incarnation), JOURNAL_ID_LEN);
    memcpy(inc, jd.incarnation, sizeof(inc));
    ck_assert_int_eq(journal_open(&j, &jd, 3, err, sizeof(err)), CS_OK);
    for (uint32_t i = 0; i < 1000; i++) {
        struct journal_rec r = rec_n(i);
        ck_assert_int_eq(journal_append(&j, &r), CS_OK);
    }
    ck_assert_uint_eq(j.records, 1000);
    journal_close(&j);
    journal_dir_close(&jd);

    /* The same directory names the same incarnation. */
    ck_assert_int_eq(journal_dir_open(&jd, dir, err, sizeof(err)), CS_OK);
    ck_assert_str_eq(jd.incarnation, inc);
    ck_assert_int_eq(journal_open(&j, &jd, 3, err, sizeof(err)), CS_OK);
    ck_assert_uint_eq(j.records, 1000);
    ck_assert_uint_eq(j.truncated, 0);
    journal_close(&j);
    snprintf(path, sizeof(path), "%s/w3.jnl", dir);
    struct seen s = {0, 1};
    uint64_t end = 0;
    ck_assert_int_eq(journal_scan(path, count_rec, &s, &end), 0);
    ck_assert_uint_eq(s.n, 1000);
    ck_assert_int_eq(s.in_order, 1);
    ck_assert_uint_eq(end, 1000 * JOURNAL_RECORD);
    journal_dir_close(&jd);
}
END_TEST

START_TEST(torn_tail_is_cut_off)
{
    struct journal_dir jd;
    struct journal j;
    char path[128];

    ck_assert_int_eq(journal_dir_open(&jd, dir, err, sizeof(err)), CS_OK);
    ck_assert_int_eq(journal_open(&j, &jd, 0, err, sizeof(err)), CS_OK);
    for (uint32_t i = 0; i < 10; i++) {
        struct journal_rec r = rec_n(i);
        ck_assert_int_eq(journal_append(&j, &r), CS_OK);
    }
    journal_close(&j);
    snprintf(path, sizeof(path), "%s/w0.jnl", dir);

    /* Part of an 11th record: a crash between write() and fsync. */
    unsigned char part[JOURNAL_RECORD];
    memset(part, 0xab, sizeof(part));
    int fd = open(path, O_WRONLY | O_APPEND);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, part, 20), 20);
    close(fd);
    ck_assert_int_eq(journal_open(&j, &jd, 0, err, sizeof(err)), CS_OK);
    ck_assert_uint_eq(j.records, 10);
    ck_assert_uint_eq(j.truncated, 20);
    ck_assert_int_eq(file_size(path), 10 * JOURNAL_RECORD);
    /* Appending goes on after the last valid record. */
    struct journal_rec r = rec_n(10);
    ck_assert_int_eq(journal_append(&j, &r), CS_OK);
    journal_close(&j);
    struct seen s = {0, 1};
    ck_assert_int_eq(journal_scan(path, count_rec, &s, NULL), 0);
    ck_assert_uint_eq(s.n, 11);
    ck_assert_int_eq(s.in_order, 1);

    /* A whole record whose bytes are wrong (a torn sector): cut off too. */
    fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    unsigned char b;
    ck_assert_int_eq(pread(fd, &b, 1, 10 * JOURNAL_RECORD + 30), 1);
    b ^= 0xff;
    ck_assert_int_eq(pwrite(fd, &b, 1, 10 * JOURNAL_RECORD + 30), 1);
    close(fd);
    ck_assert_int_eq(journal_open(&j, &jd, 0, err, sizeof(err)), CS_OK);
    ck_assert_uint_eq(j.records, 10);
    ck_assert_uint_eq(j.truncated, JOURNAL_RECORD);
    journal_close(&j);
    journal_dir_close(&jd);
}
END_TEST

START_TEST(damage_is_refused)
{
    struct journal_dir jd;
    struct journal j;
    char path[128];

    ck_assert_int_eq(journal_dir_open(&jd, dir, err, sizeof(err)), CS_OK);
    ck_assert_int_eq(journal_open(&j, &jd, 1, err, sizeof(err)), CS_OK);
    for (uint32_t i = 0; i < 10; i++) {
        struct journal_rec r = rec_n(i);
        ck_assert_int_eq(journal_append(&j, &r), CS_OK);
    }
    journal_close(&j);
    snprintf(path, sizeof(path), "%s/w1.jnl", dir);
    /* A flipped byte in record 3: seven valid records follow it, so this is
     * no torn append, and truncating would forget granted coupons. */
    int fd = open(path, O_RDWR);
    unsigned char b;
    ck_assert_int_eq(pread(fd, &b, 1, 3 * JOURNAL_RECORD + 12), 1);
    b ^= 0x01;
    ck_assert_int_eq(pwrite(fd, &b, 1, 3 * JOURNAL_RECORD + 12), 1);
    close(fd);
    ck_assert_int_eq(journal_open(&j, &jd, 1, err, sizeof(err)), CS_ERR);
    ck_assert_ptr_nonnull(strstr(err, "damaged"));
    ck_assert_int_eq(file_size(path), 10 * JOURNAL_RECORD);
    journal_dir_close(&jd);
}
END_TEST

START_TEST(one_instance_per_directory)
{
    struct journal_dir a, b;
    struct journal j1, j2;

    ck_assert_int_eq(journal_dir_open(&a, dir, err, sizeof(err)), CS_OK);
    ck_assert_int_eq(journal_dir_open(&b, dir, err, sizeof(err)), CS_ERR);
    ck_assert_ptr_nonnull(strstr(err, "in use"));
    /* A worker file is locked by its writer. */
    ck_assert_int_eq(journal_open(&j1, &a, 2, err, sizeof(err)), CS_OK);
    ck_assert_int_eq(journal_open(&j2, &a, 2, err, sizeof(err)), CS_ERR);
    journal_close(&j1);
    journal_dir_close(&a);
    ck_assert_int_eq(journal_dir_open(&b, dir, err, sizeof(err)), CS_OK);
    journal_dir_close(&b);

    /* Another directory is another incarnation. */
    char other[96];
    snprintf(other, sizeof(other), "%s/sub/dir", dir);
    ck_assert_int_eq(journal_dir_open(&a, dir, err, sizeof(err)), CS_OK);
    ck_assert_int_eq(journal_dir_open(&b, other, err, sizeof(err)), CS_OK);
    ck_assert_str_ne(a.incarnation, b.incarnation);
    journal_dir_close(&a);
    journal_dir_close(&b);
}
END_TEST

START_TEST(append_after_failure_refused)
{
    struct journal_dir jd;
    struct journal j;

    ck_assert_int_eq(journal_dir_open(&jd, dir, err, sizeof(err)), CS_OK);
    ck_assert_int_eq(journal_open(&j, &jd, 4, err, sizeof(err)), CS_OK);
    struct journal_rec r = rec_n(0);
    j.failed = 1; /* as after a failed fsync */
    ck_assert_int_eq(journal_append(&j, &r), CS_ERR);
    ck_assert_uint_eq(j.records, 0);
    journal_close(&j);
    journal_dir_close(&jd);
}
END_TEST

/* A user other than this process's, for chown() (-1 when that is not
 * possible: not root). */
static uid_t other_uid(void)
{
    return geteuid() == 0 ? (uid_t)65534 : (uid_t)-1;
}

START_TEST(directory_others_may_write_refused)
{
    struct journal_dir jd;

    ck_assert_int_eq(chmod(dir, 0770), 0);
    ck_assert_int_eq(journal_dir_open(&jd, dir, err, sizeof(err)), CS_ERR);
    ck_assert_ptr_nonnull(strstr(err, "group and others cannot write"));
    ck_assert_int_eq(chmod(dir, 0777), 0);
    ck_assert_int_eq(journal_dir_open(&jd, dir, err, sizeof(err)), CS_ERR);
    ck_assert_int_eq(chmod(dir, 0702), 0);
    ck_assert_int_eq(journal_dir_open(&jd, dir, err, sizeof(err)), CS_ERR);
    /* Nothing was made in a directory that was refused. */
    char path[128];
    snprintf(path, sizeof(path), "%s/incarnation", dir);
    ck_assert_int_ne(access(path, F_OK), 0);
    ck_assert_int_eq(chmod(dir, 0750), 0);
    ck_assert_int_eq(journal_dir_open(&jd, dir, err, sizeof(err)), CS_OK);
    journal_dir_close(&jd);
}
END_TEST

START_TEST(directory_of_another_user_refused)
{
    struct journal_dir jd;
    char sub[96];

    if (other_uid() == (uid_t)-1)
        return; /* only root can give a directory away */
    snprintf(sub, sizeof(sub), "%s/theirs", dir);
    ck_assert_int_eq(mkdir(sub, 0700), 0);
    ck_assert_int_eq(chown(sub, other_uid(), (gid_t)-1), 0);
    ck_assert_int_eq(journal_dir_open(&jd, sub, err, sizeof(err)), CS_ERR);
    ck_assert_ptr_nonnull(strstr(err, "owned by uid"));
    /* Nor through a symbolic link to it. */
    char link[96];
    snprintf(link, sizeof(link), "%s/link", dir);
    ck_assert_int_eq(symlink(sub, link), 0);
    ck_assert_int_eq(journal_dir_open(&jd, link, err, sizeof(err)), CS_ERR);
    /* Nor a file where the directory should be. */
    snprintf(sub, sizeof(sub), "%s/file", dir);
    close(open(sub, O_WRONLY | O_CREAT, 0600));
    ck_assert_int_eq(journal_dir_open(&jd, sub, err, sizeof(err)), CS_ERR);
}
END_TEST

START_TEST(files_not_ours_refused)
{
    struct journal_dir jd;
    struct journal j;
    char path[128], target[128];

    ck_assert_int_eq(journal_dir_open(&jd, dir, err, sizeof(err)), CS_OK);
    /* A symbolic link is never followed, whether it points at a file or at nothing. */
    snprintf(target, sizeof(target), "%s/elsewhere", dir);
    close(open(target, O_WRONLY | O_CREAT, 0600));
    snprintf(path, sizeof(path), "%s/w1.jnl", dir);
    ck_assert_int_eq(symlink(target, path), 0);
    ck_assert_int_eq(journal_open(&j, &jd, 1, err, sizeof(err)), CS_ERR);
    ck_assert_int_eq(journal_scan(path, NULL, NULL, NULL), -1);
    snprintf(path, sizeof(path), "%s/w2.jnl", dir);
    ck_assert_int_eq(symlink("/nonexistent/w2.jnl", path), 0);
    ck_assert_int_eq(journal_open(&j, &jd, 2, err, sizeof(err)), CS_ERR);
    /* A FIFO is not a journal, and opening it does not block. */
    snprintf(path, sizeof(path), "%s/w3.jnl", dir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    ck_assert_int_eq(journal_open(&j, &jd, 3, err, sizeof(err)), CS_ERR);
    ck_assert_ptr_nonnull(strstr(err, "not a regular file"));
    ck_assert_int_eq(journal_scan(path, NULL, NULL, NULL), -1);
    ck_assert_int_eq(errno, EPERM);
    /* A file of another user (root only can make one). */
    if (other_uid() != (uid_t)-1) {
        struct journal j4;
        ck_assert_int_eq(journal_open(&j4, &jd, 4, err, sizeof(err)), CS_OK);
        struct journal_rec r = rec_n(0);
        ck_assert_int_eq(journal_append(&j4, &r), CS_OK);
        journal_close(&j4);
        snprintf(path, sizeof(path), "%s/w4.jnl", dir);
        ck_assert_int_eq(chown(path, other_uid(), (gid_t)-1), 0);
        ck_assert_int_eq(journal_open(&j4, &jd, 4, err, sizeof(err)), CS_ERR);
        ck_assert_int_eq(journal_scan(path, NULL, NULL, NULL), -1);
        ck_assert_int_eq(errno, EPERM);
    }
    journal_dir_close(&jd);

    /* The lock and incarnation files are checked the same way. */
    snprintf(path, sizeof(path), "%s/incarnation", dir);
    ck_assert_int_eq(rename(path, target), 0);
    ck_assert_int_eq(symlink(target, path), 0);
    ck_assert_int_eq(journal_dir_open(&jd, dir, err, sizeof(err)), CS_ERR);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(rename(target, path), 0);
    snprintf(path, sizeof(path), "%s/lock", dir);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    ck_assert_int_eq(journal_dir_open(&jd, dir, err, sizeof(err)), CS_ERR);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(journal_dir_open(&jd, dir, err, sizeof(err)), CS_OK);
    journal_dir_close(&jd);
}
END_TEST

START_TEST(incarnation_read_is_bounded)
{
    struct journal_dir jd;
    char path[128];
    const char *id = "0123456789abcdef0123456789abcdef";

    /* 33 hex digits fill the read buffer to its last byte but one: the id
     * is the first 32 (under valgrind or ASan, nothing is read past). */
    snprintf(path, sizeof(path), "%s/incarnation", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "%sf", id);
    fclose(f);
    ck_assert_int_eq(journal_dir_open(&jd, dir, err, sizeof(err)), CS_OK);
    ck_assert_str_eq(jd.incarnation, id);
    journal_dir_close(&jd);
    f = fopen(path, "w");
    fprintf(f, "0123456789abcdef0123456789abcdeX\n");
    fclose(f);
    ck_assert_int_eq(journal_dir_open(&jd, dir, err, sizeof(err)), CS_ERR);
    ck_assert_ptr_nonnull(strstr(err, "not an incarnation id"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("journal");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, crc32c_known_value);
    tcase_add_test(tc, records_survive_reopen);
    tcase_add_test(tc, torn_tail_is_cut_off);
    tcase_add_test(tc, damage_is_refused);
    tcase_add_test(tc, one_instance_per_directory);
    tcase_add_test(tc, append_after_failure_refused);
    tcase_add_test(tc, directory_others_may_write_refused);
    tcase_add_test(tc, directory_of_another_user_refused);
    tcase_add_test(tc, files_not_ours_refused);
    tcase_add_test(tc, incarnation_read_is_bounded);
    suite_add_tcase(s, tc);
    return cs_run_suite(s, 0);
}
