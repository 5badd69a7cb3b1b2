/* test_shm.c - node shared memory: flags, token bucket, across processes. */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cs.h"
#include "shm.h"
#include "runner.h"

static char name[64];
static struct shm_node *node;

static void setup(void)
{
    char err[256];
    snprintf(name, sizeof(name), "/cs-test-%d", (int)getpid());
    node = shm_node_open(name, 1, err, sizeof(err));
    ck_assert_msg(node != NULL, "%s", err);
}

static void teardown(void)
{
    shm_node_close(node);
    shm_node_unlink(name);
}

START_TEST(flags_hold_until_deadline)
{
    int64_t now = cs_mono_ms();
    ck_assert(!shm_flag_test(node->soldout, 5, now));
    shm_flag_set(node->soldout, 5, now + 1000);
    ck_assert(shm_flag_test(node->soldout, 5, now));
    ck_assert(!shm_flag_test(node->soldout, 6, now));
    ck_assert(!shm_flag_test(node->soldout, 5, now + 1000));
    shm_flag_clear(node->soldout, 5);
    ck_assert(!shm_flag_test(node->soldout, 5, now));
    /* Many ids: each recorded flag reads back. */
    for (int64_t id = 1; id <= 500; id++)
        shm_flag_set(node->voided, id * 7919, INT64_MAX);
    for (int64_t id = 1; id <= 500; id++)
        ck_assert(shm_flag_test(node->voided, id * 7919, now));
    ck_assert(!shm_flag_test(node->voided, 3, now));
}
END_TEST

START_TEST(bucket_limits_rate)
{
    int retry = 0, ok = 0;
    int64_t t = 5000000;
    ck_assert(shm_bucket_take(node, t, 0, 0, &retry)); /* 0 = off */
    for (int i = 0; i < 100; i++)
        ok += shm_bucket_take(node, t, 10, 4, &retry);
    ck_assert_int_eq(ok, 5); /* one plus the burst of four */
    ck_assert_int_ge(retry, 1);
    /* A second later the bucket is full again: capacity is 1 + burst. */
    ok = 0;
    for (int i = 0; i < 100; i++)
        ok += shm_bucket_take(node, t + 1000000, 10, 4, &retry);
    ck_assert_int_eq(ok, 5);
    /* Steady state: offered 40/s for 2 s, about 10/s get through. */
    ok = 0;
    for (int i = 1; i <= 80; i++)
        ok += shm_bucket_take(node, t + 2000000 + i * 25000, 10, 4, &retry);
    ck_assert_int_ge(ok, 20);
    ck_assert_int_le(ok, 26);
}
END_TEST

START_TEST(flags_are_seen_by_other_processes)
{
    pid_t pid = fork();
    if (pid == 0) {
        char err[256];
        struct shm_node *mine = shm_node_open(name, 0, err, sizeof(err));
        if (mine == NULL)
            _exit(2);
        shm_flag_set(mine->soldout, 77, cs_mono_ms() + 60000);
        atomic_fetch_add(&mine->m.cache_hits, 5);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ck_assert(shm_flag_test(node->soldout, 77, cs_mono_ms()));
    ck_assert_uint_eq(atomic_load(&node->m.cache_hits), 5);
}
END_TEST

/* spawn-fcgi starts workers at once; the first creates the segment while the
 * others join it, and all of them must end up on the same one. */
START_TEST(concurrent_first_open_shares_one_segment)
{
    char rname[64], err[256];
    snprintf(rname, sizeof(rname), "/cs-test-race-%d", (int)getpid());
    for (int round = 0; round < 200; round++) {
        int go[2];
        ck_assert_int_eq(pipe(go), 0);
        shm_node_unlink(rname);
        for (int i = 0; i < 8; i++) {
            if (fork() == 0) {
                char c;
                close(go[1]);
                if (read(go[0], &c, 1) < 0)
                    _exit(3);
                struct shm_node *n = shm_node_open(rname, 0, err, sizeof(err));
                if (n == NULL)
                    _exit(2);
                atomic_fetch_add(&n->m.cache_hits, 1);
                _exit(0);
            }
        }
        close(go[0]);
        close(go[1]); /* releases all eight at once */
        for (int i = 0; i < 8; i++) {
            int status;
            wait(&status);
            ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        }
        struct shm_node *n = shm_node_open(rname, 0, err, sizeof(err));
        ck_assert_ptr_nonnull(n);
        uint64_t joined = atomic_load(&n->m.cache_hits);
        ck_assert_msg(joined == 8, "round %d: %llu of 8 workers on this segment", round,
                      (unsigned long long)joined);
        shm_node_close(n);
    }
    shm_node_unlink(rname);
}
END_TEST

/* An in-place upgrade's new binary joins only a segment of its own layout,
 * and never makes or replaces one (the old one's workers are in it). */
START_TEST(existing_only_joins_this_layout)
{
    char err[256], other[80];
    node->soldout[0].id = 77;
    struct shm_node *n = shm_node_open(name, SHM_OPEN_EXISTING, err, sizeof(err));
    ck_assert_msg(n != NULL, "%s", err);
    ck_assert_int_eq(atomic_load(&n->soldout[0].id), 77); /* the same segment */
    ck_assert_uint_eq(n->version, shm_layout_version());
    shm_node_close(n);

    snprintf(other, sizeof(other), "%s-none", name);
    ck_assert(shm_node_open(other, SHM_OPEN_EXISTING, err, sizeof(err)) == NULL);
    ck_assert(strstr(err, "shm_open") != NULL);

    /* A segment of another version: refused, left as it is. */
    node->version = shm_layout_version() + 1;
    ck_assert(shm_node_open(name, SHM_OPEN_EXISTING, err, sizeof(err)) == NULL);
    ck_assert_msg(strstr(err, "cannot run beside") != NULL, "%s", err);
    ck_assert_uint_eq(node->version, shm_layout_version() + 1);
    ck_assert_int_eq(atomic_load(&node->soldout[0].id), 77);
    node->version = shm_layout_version();
}
END_TEST

START_TEST(latency_histogram)
{
    shm_observe_latency(node, 100);
    shm_observe_latency(node, 600);
    shm_observe_latency(node, 5000000);
    ck_assert_uint_eq(atomic_load(&node->m.seize_lat[0]), 1);
    ck_assert_uint_eq(atomic_load(&node->m.seize_lat[2]), 1);
    ck_assert_uint_eq(atomic_load(&node->m.seize_lat[SHM_LAT_BUCKETS - 1]), 1);
    ck_assert_uint_eq(atomic_load(&node->m.seize_lat_count), 3);
    ck_assert_uint_eq(atomic_load(&node->m.seize_lat_sum_us), 5000700);
}
END_TEST

START_TEST(registry_slots_of_threads)
{
    int32_t me = (int32_t)getpid();
    int a = shm_worker_register(node, me);
    int b = shm_worker_register(node, me);
    int c = shm_worker_register(node, me);
    ck_assert(a >= 0 && b >= 0 && c >= 0 && a != b && b != c && a != c);
    atomic_store(&node->rsv.busy[b], 3);
    /* A thread that stops frees its own slot only. */
    shm_worker_unregister_slot(node, b, me);
    ck_assert_int_eq(atomic_load(&node->worker_pid[b]), 0);
    ck_assert_int_eq(atomic_load(&node->rsv.busy[b]), 0);
    ck_assert_int_eq(atomic_load(&node->worker_pid[a]), me);
    /* ... and never a slot another process was given since. */
    atomic_store(&node->worker_pid[b], me + 1);
    shm_worker_unregister_slot(node, b, me);
    ck_assert_int_eq(atomic_load(&node->worker_pid[b]), me + 1);
    atomic_store(&node->worker_pid[b], 0);
    /* The supervisor's bury frees every slot of the process. */
    shm_worker_unregister(node, me);
    ck_assert_int_eq(atomic_load(&node->worker_pid[a]), 0);
    ck_assert_int_eq(atomic_load(&node->worker_pid[c]), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("shm");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, flags_hold_until_deadline);
    tcase_add_test(tc, bucket_limits_rate);
    tcase_add_test(tc, flags_are_seen_by_other_processes);
    tcase_add_test(tc, latency_histogram);
    tcase_add_test(tc, registry_slots_of_threads);
    tcase_add_test(tc, existing_only_joins_this_layout);
    tcase_add_test(tc, concurrent_first_open_shares_one_segment);
    suite_add_tcase(s, tc);
    return cs_run_suite(s, 0);
}
