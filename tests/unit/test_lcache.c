/* test_lcache.c - unit tests of the W-TinyLFU / LRU local cache (lib/node/lcache.c). */
#include "lcache.h"
#include "cs.h"
#include "runner.h"

#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* check reports every passing ck_assert through a pipe; inner loops that
 * assert millions of times use this instead, which only speaks on failure. */
#define REQUIRE(cond)                                                         \
    do {                                                                      \
        if (!(cond))                                                          \
            ck_abort_msg("%s:%d: '%s' failed", __FILE__, __LINE__, #cond);    \
    } while (0)

/* Tracked values: the cache frees them through tv_free, which fails the test
 * on a double free; tv_assert_all_freed catches leaks. */
#define TV_MAX 200000

enum { TV_UNUSED, TV_LIVE, TV_FREED };

struct tv {
    int64_t id;
    size_t weight;
    int state;
};

static struct tv tvs[TV_MAX];
static size_t tv_next;
static size_t tv_freed;

static void tv_reset(void)
{
    memset(tvs, 0, sizeof(tvs));
    tv_next = 0;
    tv_freed = 0;
}

static struct tv *tv_new(int64_t id, size_t weight)
{
    struct tv *v;

    REQUIRE(tv_next < TV_MAX);
    v = &tvs[tv_next++];
    v->id = id;
    v->weight = weight;
    v->state = TV_LIVE;
    return v;
}

static void tv_free(void *p)
{
    struct tv *v = p;

    REQUIRE(v->state == TV_LIVE);
    v->state = TV_FREED;
    tv_freed++;
}

static size_t tv_weigh(int64_t key, const void *p)
{
    (void)key;
    return ((const struct tv *)p)->weight;
}

static size_t tv_live(void)
{
    return tv_next - tv_freed;
}

static void tv_assert_all_freed(void)
{
    for (size_t i = 0; i < tv_next; i++)
        REQUIRE(tvs[i].state == TV_FREED);
}

static uint64_t rng_state;

static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static struct lcache *mk(size_t capacity, int policy, int64_t expire_ms, int64_t refresh_ms)
{
    struct lcache_opts o = {
        .capacity = capacity,
        .policy = policy,
        .expire_ms = expire_ms,
        .refresh_ms = refresh_ms,
        .free_value = tv_free,
    };
    struct lcache *c;

    tv_reset();
    c = lcache_new(&o);
    ck_assert_ptr_nonnull(c);
    return c;
}

static void put(struct lcache *c, int64_t key, int64_t now)
{
    lcache_put(c, key, tv_new(key, 1), now);
}

static int resident(struct lcache *c, int64_t key)
{
    return lcache_region_of(c, key) != LCACHE_REGION_NONE;
}

START_TEST(test_new_rejects_bad_opts)
{
    struct lcache_opts o = { .capacity = 0 };

    ck_assert_ptr_null(lcache_new(&o));
    o.capacity = 10;
    o.expire_ms = -1;
    ck_assert_ptr_null(lcache_new(&o));
    o.expire_ms = 0;
    o.refresh_ms = -5;
    ck_assert_ptr_null(lcache_new(&o));
    o.refresh_ms = 0;
    o.policy = 7;
    ck_assert_ptr_null(lcache_new(&o));
    o.policy = LCACHE_POLICY_LRU;
    o.capacity = ((size_t)1 << 24) + 1;
    ck_assert_ptr_null(lcache_new(&o));
    lcache_free(NULL);
}
END_TEST

START_TEST(test_put_get_replace_remove)
{
    struct lcache *c = mk(10, LCACHE_POLICY_TINYLFU, 0, 0);
    struct tv *v1 = tv_new(1, 1), *v2 = tv_new(1, 1);
    void *got = (void *)&got;

    ck_assert_int_eq(lcache_get(c, 1, 0, &got), LCACHE_MISS);
    ck_assert_ptr_null(got);
    lcache_put(c, 1, v1, 0);
    ck_assert_int_eq(lcache_get(c, 1, 1, &got), LCACHE_HIT);
    ck_assert_ptr_eq(got, v1);

    /* Same pointer again: not freed. */
    lcache_put(c, 1, v1, 2);
    ck_assert_int_eq(v1->state, TV_LIVE);
    /* Replacement frees the old value exactly once. */
    lcache_put(c, 1, v2, 3);
    ck_assert_int_eq(v1->state, TV_FREED);
    ck_assert_int_eq(lcache_get(c, 1, 4, &got), LCACHE_HIT);
    ck_assert_ptr_eq(got, v2);
    ck_assert_uint_eq(lcache_size(c), 1);

    ck_assert_int_eq(lcache_remove(c, 1), CS_OK);
    ck_assert_int_eq(v2->state, TV_FREED);
    ck_assert_int_eq(lcache_remove(c, 1), CS_ERR);
    ck_assert_int_eq(lcache_get(c, 1, 5, NULL), LCACHE_MISS);
    ck_assert_uint_eq(lcache_size(c), 0);

    put(c, 2, 6);
    put(c, 3, 6);
    lcache_free(c);
    tv_assert_all_freed();
    ck_assert_uint_eq(tv_freed, 4);
}
END_TEST

START_TEST(test_lru_eviction_order)
{
    struct lcache *c = mk(3, LCACHE_POLICY_LRU, 0, 0);
    struct lcache_stats st;

    put(c, 1, 0);
    put(c, 2, 0);
    put(c, 3, 0);
    ck_assert_int_eq(lcache_get(c, 1, 1, NULL), LCACHE_HIT); /* order now 2 3 1 */
    put(c, 4, 2);
    ck_assert(!resident(c, 2));
    ck_assert(resident(c, 1) && resident(c, 3) && resident(c, 4));
    put(c, 5, 3); /* evicts 3 */
    ck_assert(!resident(c, 3));
    ck_assert_int_eq(lcache_get(c, 4, 4, NULL), LCACHE_HIT); /* order 1 5 4 */
    put(c, 6, 5);                                             /* evicts 1 */
    ck_assert(!resident(c, 1));
    ck_assert(resident(c, 5) && resident(c, 4) && resident(c, 6));
    ck_assert_int_eq(lcache_region_of(c, 6), LCACHE_REGION_WINDOW);

    lcache_stats(c, &st);
    ck_assert_uint_eq(st.evictions, 3);
    ck_assert_uint_eq(st.size, 3);
    ck_assert_uint_eq(tv_freed, 3);
    lcache_free(c);
    tv_assert_all_freed();
}
END_TEST

START_TEST(test_window_probation_protected)
{
    struct lcache *c = mk(100, LCACHE_POLICY_TINYLFU, 0, 0);

    put(c, 1, 0);
    ck_assert_int_eq(lcache_region_of(c, 1), LCACHE_REGION_WINDOW);
    /* The window holds 1% of 100 = 1 entry: the next put pushes 1 into probation. */
    put(c, 2, 0);
    ck_assert_int_eq(lcache_region_of(c, 1), LCACHE_REGION_PROBATION);
    ck_assert_int_eq(lcache_region_of(c, 2), LCACHE_REGION_WINDOW);
    /* A hit in probation promotes to protected. */
    ck_assert_int_eq(lcache_get(c, 1, 1, NULL), LCACHE_HIT);
    ck_assert_int_eq(lcache_region_of(c, 1), LCACHE_REGION_PROTECTED);
    /* A hit in the window stays in the window. */
    ck_assert_int_eq(lcache_get(c, 2, 1, NULL), LCACHE_HIT);
    ck_assert_int_eq(lcache_region_of(c, 2), LCACHE_REGION_WINDOW);
    ck_assert_int_eq(lcache_region_of(c, 99), LCACHE_REGION_NONE);
    lcache_free(c);
    tv_assert_all_freed();
}
END_TEST

START_TEST(test_protected_overflow_demotes)
{
    struct lcache *c = mk(100, LCACHE_POLICY_TINYLFU, 0, 0);

    /* window 1, main 99, protected 80% of 99 = 79. */
    for (int64_t k = 1; k <= 100; k++)
        put(c, k, 0);
    ck_assert_uint_eq(lcache_size(c), 100);
    for (int64_t k = 1; k <= 79; k++)
        ck_assert_int_eq(lcache_get(c, k, 1, NULL), LCACHE_HIT);
    ck_assert_int_eq(lcache_region_of(c, 1), LCACHE_REGION_PROTECTED);
    /* The 80th promotion overflows protected: its LRU (key 1) goes back. */
    ck_assert_int_eq(lcache_get(c, 80, 1, NULL), LCACHE_HIT);
    ck_assert_int_eq(lcache_region_of(c, 80), LCACHE_REGION_PROTECTED);
    ck_assert_int_eq(lcache_region_of(c, 1), LCACHE_REGION_PROBATION);
    ck_assert_int_eq(lcache_region_of(c, 2), LCACHE_REGION_PROTECTED);
    ck_assert_uint_eq(lcache_size(c), 100);
    lcache_free(c);
    tv_assert_all_freed();
}
END_TEST

/* Keys 1..100 are each seen three times, then 500 one-hit wonders stream by. */
static void hot_then_scan(struct lcache *c)
{
    for (int64_t k = 1; k <= 100; k++)
        put(c, k, 0);
    for (int r = 0; r < 2; r++)
        for (int64_t k = 1; k <= 100; k++)
            ck_assert_int_eq(lcache_get(c, k, 1, NULL), LCACHE_HIT);
    for (int64_t k = 1000; k < 1500; k++) {
        ck_assert_int_eq(lcache_get(c, k, 2, NULL), LCACHE_MISS);
        put(c, k, 2);
    }
}

START_TEST(test_admission_rejects_one_hit_wonders)
{
    for (int dk = 0; dk <= 1; dk++) {
        struct lcache_opts o = {
            .capacity = 100, .policy = LCACHE_POLICY_TINYLFU, .doorkeeper = dk,
            .free_value = tv_free,
        };
        struct lcache *c;
        struct lcache_stats st;

        tv_reset();
        c = lcache_new(&o);
        hot_then_scan(c);
        /* Key 100 was still in the window when the scan began; every key
         * that reached main survives the scan. */
        for (int64_t k = 1; k <= 99; k++)
            ck_assert_msg(resident(c, k), "doorkeeper=%d: hot key %lld evicted", dk, (long long)k);
        lcache_stats(c, &st);
        ck_assert_uint_eq(st.size, 100);
        ck_assert_uint_eq(st.evictions, 500);
        ck_assert_uint_eq(tv_live(), 100);
        lcache_free(c);
        tv_assert_all_freed();
    }
}
END_TEST

START_TEST(test_lru_flushed_by_scan)
{
    struct lcache *c = mk(100, LCACHE_POLICY_LRU, 0, 0);
    int left = 0;

    hot_then_scan(c);
    for (int64_t k = 1; k <= 100; k++)
        left += resident(c, k);
    ck_assert_int_eq(left, 0);
    lcache_free(c);
    tv_assert_all_freed();
}
END_TEST

START_TEST(test_admission_lets_frequent_candidate_in)
{
    struct lcache *c = mk(100, LCACHE_POLICY_TINYLFU, 0, 0);
    struct lcache_stats before, after;

    hot_then_scan(c);
    lcache_stats(c, &before);
    /* 7777 is hit 5 times while in the window (frequency 6 > 3), so when it
     * leaves the window it beats the probation victim. */
    put(c, 7777, 3);
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(lcache_get(c, 7777, 3, NULL), LCACHE_HIT);
    ck_assert_int_eq(lcache_region_of(c, 7777), LCACHE_REGION_WINDOW);
    put(c, 8888, 4);
    ck_assert_int_eq(lcache_region_of(c, 7777), LCACHE_REGION_PROBATION);
    lcache_stats(c, &after);
    /* Two evictions: 1499 (window candidate of the first put) and one victim. */
    ck_assert_uint_eq(after.evictions - before.evictions, 2);
    ck_assert(!resident(c, 1499));
    ck_assert_uint_eq(lcache_size(c), 100);
    lcache_free(c);
    tv_assert_all_freed();
}
END_TEST

START_TEST(test_sketch_aging)
{
    /* capacity 2: window 1, main 1 (all probation), sample 20 increments. */
    struct lcache *c = mk(2, LCACHE_POLICY_TINYLFU, 0, 0);
    int64_t filler = 100000, winner = 0;

    put(c, 1, 0);
    for (int i = 0; i < 30; i++)
        lcache_get(c, 1, 0, NULL); /* saturates at 15 */
    put(c, filler++, 0);
    ck_assert_int_eq(lcache_region_of(c, 1), LCACHE_REGION_PROBATION);

    /* Each round: a key seen 4 times (never > 5, so no random admission)
     * then a filler pushes it out of the window to face key 1. Without aging
     * key 1 stays at 15 forever; with it, it decays until 4 beats it. */
    for (int64_t r = 0; r < 20 && winner == 0; r++) {
        int64_t k = 1000 + r;

        put(c, k, 0);
        for (int i = 0; i < 3; i++)
            ck_assert_int_eq(lcache_get(c, k, 0, NULL), LCACHE_HIT);
        put(c, filler++, 0);
        if (r == 0)
            ck_assert_msg(resident(c, 1), "fresh saturated key lost to frequency 4");
        if (!resident(c, 1)) {
            winner = k;
            ck_assert_int_eq(lcache_region_of(c, k), LCACHE_REGION_PROBATION);
        }
    }
    ck_assert_msg(winner != 0, "old hot key never aged out");
    ck_assert_uint_eq(lcache_size(c), 2);
    lcache_free(c);
    tv_assert_all_freed();
}
END_TEST

START_TEST(test_capacity_one)
{
    for (int p = LCACHE_POLICY_TINYLFU; p <= LCACHE_POLICY_LRU; p++) {
        struct lcache *c = mk(1, p, 0, 0);

        put(c, 1, 0);
        put(c, 2, 0);
        ck_assert_uint_eq(lcache_size(c), 1);
        ck_assert(resident(c, 2));
        ck_assert_uint_eq(tv_live(), 1);
        lcache_free(c);
        tv_assert_all_freed();
    }
}
END_TEST

START_TEST(test_expire_after_write)
{
    struct lcache *c = mk(10, LCACHE_POLICY_TINYLFU, 1000, 0);
    struct lcache_stats st;
    void *got;

    put(c, 1, 0);
    ck_assert_int_eq(lcache_get(c, 1, 999, &got), LCACHE_HIT);
    ck_assert_ptr_nonnull(got);
    ck_assert_int_eq(lcache_get(c, 1, 1000, &got), LCACHE_MISS);
    ck_assert_ptr_null(got);
    ck_assert_int_eq(lcache_get(c, 1, 5000, &got), LCACHE_MISS);
    /* Expired entries stay resident for stale reads. */
    ck_assert_uint_eq(lcache_size(c), 1);
    lcache_stats(c, &st);
    ck_assert_uint_eq(st.hits, 1);
    ck_assert_uint_eq(st.misses, 2);
    ck_assert_uint_eq(st.expirations, 1);
    /* A new write is fresh for another expire_ms. */
    put(c, 1, 5000);
    ck_assert_int_eq(lcache_get(c, 1, 5999, NULL), LCACHE_HIT);
    ck_assert_int_eq(lcache_get(c, 1, 6000, NULL), LCACHE_MISS);
    lcache_stats(c, &st);
    ck_assert_uint_eq(st.expirations, 2);
    ck_assert_uint_eq(tv_freed, 1);
    lcache_free(c);
    tv_assert_all_freed();
}
END_TEST

START_TEST(test_refresh_after_write)
{
    for (int p = LCACHE_POLICY_TINYLFU; p <= LCACHE_POLICY_LRU; p++) {
        struct lcache *c = mk(10, p, 1000, 100);
        struct lcache_stats st;

        put(c, 1, 0);
        ck_assert_int_eq(lcache_get(c, 1, 99, NULL), LCACHE_HIT);
        /* Only the first caller past refresh_ms is told to refresh. */
        ck_assert_int_eq(lcache_get(c, 1, 100, NULL), LCACHE_HIT_REFRESH);
        ck_assert_int_eq(lcache_get(c, 1, 100, NULL), LCACHE_HIT);
        ck_assert_int_eq(lcache_get(c, 1, 199, NULL), LCACHE_HIT);
        /* That refresh never finished: retried refresh_ms after the claim. */
        ck_assert_int_eq(lcache_get(c, 1, 200, NULL), LCACHE_HIT_REFRESH);
        ck_assert_int_eq(lcache_get(c, 1, 201, NULL), LCACHE_HIT);
        /* The refresher puts: fresh again. */
        put(c, 1, 210);
        ck_assert_int_eq(lcache_get(c, 1, 309, NULL), LCACHE_HIT);
        ck_assert_int_eq(lcache_get(c, 1, 310, NULL), LCACHE_HIT_REFRESH);
        /* The refresh fails: back-off of refresh_ms from the failure. */
        lcache_refresh_failed(c, 1, 320);
        ck_assert_int_eq(lcache_get(c, 1, 419, NULL), LCACHE_HIT);
        ck_assert_int_eq(lcache_get(c, 1, 420, NULL), LCACHE_HIT_REFRESH);
        ck_assert_int_eq(lcache_get(c, 1, 421, NULL), LCACHE_HIT);
        /* Past expire_ms it is a miss, refresh or not. */
        ck_assert_int_eq(lcache_get(c, 1, 1210, NULL), LCACHE_MISS);
        lcache_refresh_failed(c, 42, 1300); /* absent key: counted only */

        lcache_stats(c, &st);
        ck_assert_uint_eq(st.hits, 11);
        ck_assert_uint_eq(st.misses, 1);
        ck_assert_uint_eq(st.load_failures, 2);
        ck_assert_uint_eq(st.puts, 2);
        lcache_free(c);
        tv_assert_all_freed();
    }
}
END_TEST

START_TEST(test_stale_if_error)
{
    struct lcache *c = mk(10, LCACHE_POLICY_TINYLFU, 1000, 0);
    struct lcache_stats st;
    struct tv *v = tv_new(1, 1);
    int64_t age = -1;

    lcache_put(c, 1, v, 0);
    ck_assert_ptr_null(lcache_get_stale(c, 2, 10, 500, &age));
    ck_assert_int_eq(age, -1);
    /* Fresh entries qualify, even with a negative bound. */
    ck_assert_ptr_eq(lcache_get_stale(c, 1, 999, -1, &age), v);
    ck_assert_int_eq(age, 999);
    ck_assert_ptr_null(lcache_get_stale(c, 1, 1000, -1, &age));
    /* Redis down: get misses, the stale read serves up to 500 ms past expiry. */
    ck_assert_int_eq(lcache_get(c, 1, 1200, NULL), LCACHE_MISS);
    lcache_load_failed(c);
    ck_assert_ptr_eq(lcache_get_stale(c, 1, 1200, 500, &age), v);
    ck_assert_int_eq(age, 1200);
    ck_assert_ptr_eq(lcache_get_stale(c, 1, 1500, 500, NULL), v);
    ck_assert_ptr_null(lcache_get_stale(c, 1, 1501, 500, &age));
    ck_assert_int_eq(age, 1200);
    ck_assert_ptr_eq(lcache_get_stale(c, 1, 1000, 0, &age), v);

    lcache_stats(c, &st);
    ck_assert_uint_eq(st.stale_hits, 4);
    ck_assert_uint_eq(st.hits, 0);
    ck_assert_uint_eq(st.misses, 1);
    ck_assert_uint_eq(st.load_failures, 1);
    ck_assert_uint_eq(st.expirations, 1);
    ck_assert_int_eq(v->state, TV_LIVE);
    lcache_free(c);
    tv_assert_all_freed();
}
END_TEST

START_TEST(test_stats_counts)
{
    struct lcache *c = mk(2, LCACHE_POLICY_LRU, 0, 0);
    struct lcache_stats st;

    put(c, 1, 0);
    put(c, 2, 0);
    lcache_get(c, 1, 1, NULL);  /* hit */
    lcache_get(c, 3, 1, NULL);  /* miss */
    put(c, 3, 1);               /* evicts 2 */
    lcache_get(c, 2, 1, NULL);  /* miss */
    lcache_remove(c, 1);        /* not an eviction */
    lcache_get(c, 3, 2, NULL);  /* hit */
    lcache_load_failed(c);
    lcache_stats(c, &st);
    ck_assert_uint_eq(st.hits, 2);
    ck_assert_uint_eq(st.misses, 2);
    ck_assert_uint_eq(st.puts, 3);
    ck_assert_uint_eq(st.evictions, 1);
    ck_assert_uint_eq(st.load_failures, 1);
    ck_assert_uint_eq(st.expirations, 0);
    ck_assert_uint_eq(st.stale_hits, 0);
    ck_assert_uint_eq(st.size, 1);
    ck_assert_uint_eq(st.weight, 1);
    lcache_free(c);
    tv_assert_all_freed();
}
END_TEST

START_TEST(test_weight_bound)
{
    for (int p = LCACHE_POLICY_TINYLFU; p <= LCACHE_POLICY_LRU; p++) {
        struct lcache_opts o = {
            .capacity = 100, .max_weight = 10, .policy = p,
            .free_value = tv_free, .weigh = tv_weigh,
        };
        struct lcache *c;
        struct lcache_stats st;
        struct tv *big;

        tv_reset();
        c = lcache_new(&o);
        for (int64_t k = 1; k <= 5; k++) {
            lcache_put(c, k, tv_new(k, 4), 0);
            lcache_stats(c, &st);
            ck_assert_uint_le(st.weight, 10);
        }
        ck_assert_uint_eq(lcache_size(c), 2);
        /* Heavier than the whole cache: freed at once, old mapping gone. */
        big = tv_new(5, 11);
        lcache_put(c, 5, big, 1);
        ck_assert_int_eq(big->state, TV_FREED);
        ck_assert(!resident(c, 5));
        lcache_stats(c, &st);
        ck_assert_uint_eq(st.evictions, 4);
        ck_assert_uint_eq(st.weight, lcache_size(c) * 4);
        ck_assert_uint_eq(tv_live(), lcache_size(c));
        /* Growing an entry's weight in place also respects the bound. */
        lcache_put(c, 6, tv_new(6, 1), 2);
        lcache_put(c, 6, tv_new(6, 9), 3);
        lcache_stats(c, &st);
        ck_assert_uint_le(st.weight, 10);
        ck_assert_uint_eq(tv_live(), lcache_size(c));
        lcache_free(c);
        tv_assert_all_freed();
    }
}
END_TEST

/* 100k mixed operations on a skewed key space: the bounds hold after every
 * one, and the cache owns exactly the values it holds (each freed once). */
static void random_workload(int policy, int doorkeeper, size_t max_weight)
{
    struct lcache_opts o = {
        .capacity = 64, .max_weight = max_weight, .policy = policy,
        .expire_ms = 50, .refresh_ms = 20, .doorkeeper = doorkeeper,
        .seed = 12345, .free_value = tv_free, .weigh = tv_weigh,
    };
    struct lcache *c;
    struct lcache_stats st;
    uint64_t gets = 0, puts = 0;
    int64_t now = 0;

    tv_reset();
    rng_state = 42;
    c = lcache_new(&o);
    for (int i = 0; i < 100000; i++) {
        int64_t key = (int64_t)(rnd() % (rnd() % 500 + 1));
        unsigned op = (unsigned)(rnd() % 100);
        size_t w = rnd() % 100 == 0 ? 200 : rnd() % 8 + 1;
        void *got;

        now += (int64_t)(rnd() % 3);
        if (op < 50) {
            enum lcache_state s = lcache_get(c, key, now, &got);

            gets++;
            if (s != LCACHE_MISS)
                REQUIRE(((struct tv *)got)->id == key);
            if (s == LCACHE_MISS && rnd() % 4 == 0) {
                lcache_load_failed(c);
                got = lcache_get_stale(c, key, now, 30, NULL);
                if (got != NULL)
                    REQUIRE(((struct tv *)got)->id == key);
            } else if (s != LCACHE_HIT) {
                if (s == LCACHE_HIT_REFRESH && rnd() % 2 == 0) {
                    lcache_refresh_failed(c, key, now);
                } else {
                    lcache_put(c, key, tv_new(key, w), now);
                    puts++;
                }
            }
        } else if (op < 60) {
            lcache_remove(c, key);
        } else if (op < 70) {
            int64_t age;

            got = lcache_get_stale(c, key, now, 10, &age);
            if (got != NULL) {
                REQUIRE(((struct tv *)got)->id == key);
                REQUIRE(age <= 60);
            }
        } else {
            lcache_put(c, key, tv_new(key, w), now);
            puts++;
        }
        lcache_stats(c, &st);
        REQUIRE(st.size <= 64);
        if (max_weight != 0)
            REQUIRE(st.weight <= max_weight);
        REQUIRE(st.size == lcache_size(c));
        REQUIRE(tv_live() == st.size);
    }
    lcache_stats(c, &st);
    ck_assert_uint_eq(st.hits + st.misses, gets);
    ck_assert_uint_eq(st.puts, puts);
    ck_assert_uint_gt(st.hits, 0);
    ck_assert_uint_gt(st.evictions, 0);
    ck_assert_uint_gt(st.expirations, 0);
    lcache_free(c);
    tv_assert_all_freed();
}

START_TEST(test_random_workload_bounds)
{
    static const size_t weights[] = { 0, 150 };

    for (int p = LCACHE_POLICY_TINYLFU; p <= LCACHE_POLICY_LRU; p++)
        for (int dk = 0; dk <= 1; dk++)
            for (size_t w = 0; w < CS_ARRAY_LEN(weights); w++)
                random_workload(p, dk, weights[w]);
}
END_TEST

static Suite *lcache_suite(void)
{
    Suite *s = suite_create("lcache");
    TCase *tc = tcase_create("core");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_new_rejects_bad_opts);
    tcase_add_test(tc, test_put_get_replace_remove);
    tcase_add_test(tc, test_lru_eviction_order);
    tcase_add_test(tc, test_window_probation_protected);
    tcase_add_test(tc, test_protected_overflow_demotes);
    tcase_add_test(tc, test_admission_rejects_one_hit_wonders);
    tcase_add_test(tc, test_lru_flushed_by_scan);
    tcase_add_test(tc, test_admission_lets_frequent_candidate_in);
    tcase_add_test(tc, test_sketch_aging);
    tcase_add_test(tc, test_capacity_one);
    tcase_add_test(tc, test_expire_after_write);
    tcase_add_test(tc, test_refresh_after_write);
    tcase_add_test(tc, test_stale_if_error);
    tcase_add_test(tc, test_stats_counts);
    tcase_add_test(tc, test_weight_bound);
    tcase_add_test(tc, test_random_workload_bounds);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return cs_run_suite(lcache_suite(), 0);
}
