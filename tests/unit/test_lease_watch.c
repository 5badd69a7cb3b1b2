/* test_lease_watch.c - the table of lease stamps a node watches
 * (lib/node/lease_watch.c) on a shared mapping of the test's own: a first look
 * and a changed stamp start over, an unchanged one ages by the caller's
 * clock, a late read never sets a stamp back, the longest published lease
 * is kept, a full table forgets the least recently read entry, and a
 * process killed while holding the lock leaves it usable, every watch
 * started over. */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cs.h"
#include "lease_watch.h"
#include "runner.h"

static struct lease_watch *lw;
static const char *INC_A = "0123456789abcdef0123456789abcdef";
static const char *INC_B = "fedcba9876543210fedcba9876543210";

static int64_t longest;

/* One read of (inc, shard) showing stamp, no lease published. */
static int64_t seen(const char *inc, int shard, int64_t stamp, int64_t now)
{
    return lease_watch_seen(lw, inc, shard, stamp, 0, now, &longest);
}

static void setup(void)
{
    lw = mmap(NULL, sizeof(*lw), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert(lw != MAP_FAILED);
    ck_assert_int_eq(lease_watch_init(lw), CS_OK);
}

static void teardown(void)
{
    munmap(lw, sizeof(*lw));
}

START_TEST(first_look_and_change_start_over)
{
    ck_assert_int_eq(seen(INC_A, 3, 5000, 100), 0);
    ck_assert_int_eq(seen(INC_A, 3, 5000, 350), 250);
    ck_assert_int_eq(seen(INC_A, 3, 5000, 1100), 1000);
    /* A renewal: a new stamp is watched from the read that showed it. */
    ck_assert_int_eq(seen(INC_A, 3, 6000, 1200), 0);
    ck_assert_int_eq(seen(INC_A, 3, 6000, 1700), 500);
    /* A stamp that goes back (a failed-over master lost the last renewals)
     * is a change too. */
    ck_assert_int_eq(seen(INC_A, 3, 5500, 1800), 0);
    /* No stamp at all (-1) is watched like any other. */
    ck_assert_int_eq(seen(INC_A, 3, -1, 1900), 0);
    ck_assert_int_eq(seen(INC_A, 3, -1, 2900), 1000);
}
END_TEST

START_TEST(shards_and_incarnations_apart)
{
    ck_assert_int_eq(seen(INC_A, 1, 5000, 100), 0);
    ck_assert_int_eq(seen(INC_A, 2, 5000, 200), 0);
    ck_assert_int_eq(seen(INC_B, 1, 5000, 300), 0);
    ck_assert_int_eq(seen(INC_A, 1, 5000, 1100), 1000);
    ck_assert_int_eq(seen(INC_A, 2, 5000, 1100), 900);
    ck_assert_int_eq(seen(INC_B, 1, 5000, 1100), 800);
}
END_TEST

START_TEST(an_older_read_never_ages_an_entry)
{
    ck_assert_int_eq(seen(INC_A, 0, 5000, 1000), 0);
    /* A reader that took its clock before the entry was made. */
    ck_assert_int_eq(seen(INC_A, 0, 5000, 900), 0);
    ck_assert_int_eq(seen(INC_A, 0, 5000, 1500), 500);
    /* A renewal, then a read answered before it but recorded after: it
     * must not set the stamp back (a failover that brings the old stamp
     * back would then count from the old read). */
    ck_assert_int_eq(seen(INC_A, 0, 6000, 1600), 0);
    ck_assert_int_eq(seen(INC_A, 0, 5000, 1550), 0);
    ck_assert_int_eq(seen(INC_A, 0, 6000, 2600), 1000);
}
END_TEST

START_TEST(longest_published_lease_is_kept)
{
    ck_assert_int_eq(lease_watch_seen(lw, INC_A, 5, 5000, 10000, 100, &longest), 0);
    ck_assert_int_eq(longest, 10000);
    /* The field lost with the stamp: the lease seen before still counts. */
    ck_assert_int_eq(lease_watch_seen(lw, INC_A, 5, -1, 0, 200, &longest), 0);
    ck_assert_int_eq(longest, 10000);
    ck_assert_int_eq(lease_watch_seen(lw, INC_A, 5, -1, 3000, 300, &longest), 100);
    ck_assert_int_eq(longest, 10000);
    ck_assert_int_eq(lease_watch_seen(lw, INC_A, 5, 7000, 20000, 400, &longest), 0);
    ck_assert_int_eq(longest, 20000);
}
END_TEST

START_TEST(full_table_forgets_the_least_recently_read)
{
    char inc[LEASE_WATCH_INC_LEN + 1];
    for (int i = 0; i < LEASE_WATCH_N; i++) {
        snprintf(inc, sizeof(inc), "%032x", i);
        ck_assert_int_eq(seen(inc, 0, 7, 1000 + i), 0);
    }
    /* Entry 0 is read again: entry 1 is now the least recent. */
    snprintf(inc, sizeof(inc), "%032x", 0);
    ck_assert_int_eq(seen(inc, 0, 7, 5000), 4000);
    snprintf(inc, sizeof(inc), "%032x", LEASE_WATCH_N);
    ck_assert_int_eq(seen(inc, 0, 7, 5001), 0);
    /* Entry 0 is still watched; entry 1 starts over. */
    snprintf(inc, sizeof(inc), "%032x", 0);
    ck_assert_int_eq(seen(inc, 0, 7, 6000), 5000);
    snprintf(inc, sizeof(inc), "%032x", 1);
    ck_assert_int_eq(seen(inc, 0, 7, 6000), 0);
}
END_TEST

START_TEST(dead_lock_owner_leaves_it_usable)
{
    ck_assert_int_eq(seen(INC_A, 4, 5000, 100), 0);
    pid_t p = fork();
    ck_assert_int_ge(p, 0);
    if (p == 0) {
        pthread_mutex_lock(&lw->lock);
        raise(SIGKILL);
        _exit(1);
    }
    int st;
    ck_assert_int_eq(waitpid(p, &st, 0), p);
    ck_assert(WIFSIGNALED(st));
    /* It may have left an entry half written: every watch starts over. */
    ck_assert_int_eq(seen(INC_A, 4, 5000, 600), 0);
    ck_assert_int_eq(seen(INC_A, 4, 5000, 700), 100);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("lease_watch");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, first_look_and_change_start_over);
    tcase_add_test(tc, shards_and_incarnations_apart);
    tcase_add_test(tc, an_older_read_never_ages_an_entry);
    tcase_add_test(tc, longest_published_lease_is_kept);
    tcase_add_test(tc, full_table_forgets_the_least_recently_read);
    tcase_add_test(tc, dead_lock_owner_leaves_it_usable);
    suite_add_tcase(su, tc);
    return cs_run_suite(su, 0);
}
