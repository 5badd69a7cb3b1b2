/* lcache_bench.c - hit ratio of W-TinyLFU vs LRU on Zipf traces, with and without scans. */
/*
 * Usage: lcache_bench [--json]
 *
 * Replays a fixed-seed Zipf(0.9) trace of 1,000,000 accesses over 100,000 keys,
 * and the same trace with a scan of 20,000 never-repeated keys spliced in every
 * 100,000 accesses (9 scans), through caches of 1,000 and 5,000 entries. Each access is
 * lcache_get and, on a miss, lcache_put - what a worker does. Prints one line
 * per trace and capacity, or with --json one JSON object on stdout.
 *
 * Exit status: 0 when W-TinyLFU beats LRU on every trace and capacity, 1 when
 * it does not (a regression), 2 on a usage error.
 */
#include "lcache.h"
#include "cs.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_ACCESSES 1000000
#define BENCH_KEYS 100000
#define BENCH_ZIPF_S 0.9
#define BENCH_SCAN_LEN 20000
#define BENCH_SCAN_EVERY 100000
#define BENCH_SEED 0x5eed5eedULL
#define SCAN_KEY_BASE ((int64_t)1 << 40) /* above every Zipf key: never repeats */

struct trace {
    const char *name;
    int64_t *keys;
    size_t len;
};

struct result {
    const char *trace;
    size_t capacity;
    double tinylfu, lru, tinylfu_dk;
    double tinylfu_ns, lru_ns;
};

static uint64_t bench_rng = BENCH_SEED;

/* splitmix64: fixed seed, so every run replays the same trace. */
static uint64_t bench_next(void)
{
    uint64_t z = (bench_rng += 0x9e3779b97f4a7c15ULL);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double bench_uniform(void)
{
    return (double)(bench_next() >> 11) * 0x1.0p-53;
}

/* Activity-id-like key for Zipf rank r: scattered, not 1..n in rank order. */
static int64_t bench_rank_key(size_t r)
{
    return (int64_t)(((uint64_t)r * 0x9e3779b97f4a7c15ULL) >> 24) + 1;
}

static void bench_zipf(struct trace *t)
{
    double *cdf = xmalloc(BENCH_KEYS * sizeof(*cdf));
    double sum = 0;

    for (size_t r = 0; r < BENCH_KEYS; r++) {
        sum += 1.0 / pow((double)(r + 1), BENCH_ZIPF_S);
        cdf[r] = sum;
    }
    t->name = "zipf0.9";
    t->len = BENCH_ACCESSES;
    t->keys = xmalloc(t->len * sizeof(*t->keys));
    for (size_t i = 0; i < t->len; i++) {
        double u = bench_uniform() * sum;
        size_t lo = 0, hi = BENCH_KEYS - 1;

        while (lo < hi) { /* first rank whose cumulative weight reaches u */
            size_t mid = lo + (hi - lo) / 2;

            if (cdf[mid] < u)
                lo = mid + 1;
            else
                hi = mid;
        }
        t->keys[i] = bench_rank_key(lo);
    }
    free(cdf);
}

static void bench_scanned(const struct trace *zipf, struct trace *t)
{
    size_t scans = (zipf->len - 1) / BENCH_SCAN_EVERY; /* between blocks only */
    size_t j = 0;
    int64_t next_scan_key = SCAN_KEY_BASE;

    t->name = "zipf0.9+scan";
    t->len = zipf->len + scans * BENCH_SCAN_LEN;
    t->keys = xmalloc(t->len * sizeof(*t->keys));
    for (size_t i = 0; i < zipf->len; i++) {
        if (i > 0 && i % BENCH_SCAN_EVERY == 0)
            for (size_t s = 0; s < BENCH_SCAN_LEN; s++)
                t->keys[j++] = next_scan_key++;
        t->keys[j++] = zipf->keys[i];
    }
}

/* Replays t through a fresh cache; returns the hit ratio, *ns_per_op the cost. */
static double bench_run(const struct trace *t, size_t capacity, int policy, int doorkeeper,
                        double *ns_per_op)
{
    static int dummy; /* values are not owned: one shared non-NULL pointer */
    struct lcache_opts o = {
        .capacity = capacity, .policy = policy, .doorkeeper = doorkeeper,
    };
    struct lcache *c = lcache_new(&o);
    struct lcache_stats st;
    int64_t t0, t1;

    t0 = cs_mono_us();
    for (size_t i = 0; i < t->len; i++)
        if (lcache_get(c, t->keys[i], (int64_t)i, NULL) == LCACHE_MISS)
            lcache_put(c, t->keys[i], &dummy, (int64_t)i);
    t1 = cs_mono_us();
    lcache_stats(c, &st);
    lcache_free(c);
    *ns_per_op = (double)(t1 - t0) * 1000.0 / (double)t->len;
    return (double)st.hits / (double)(st.hits + st.misses);
}

int main(int argc, char **argv)
{
    static const size_t capacities[] = { 1000, 5000 };
    struct trace traces[2];
    struct result res[CS_ARRAY_LEN(traces) * CS_ARRAY_LEN(capacities)];
    size_t nres = 0;
    int json = 0, pass = 1;
    double unused;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else {
            fprintf(stderr, "usage: %s [--json]\n", argv[0]);
            return 2;
        }
    }

    bench_zipf(&traces[0]);
    bench_scanned(&traces[0], &traces[1]);

    for (size_t t = 0; t < CS_ARRAY_LEN(traces); t++) {
        for (size_t k = 0; k < CS_ARRAY_LEN(capacities); k++) {
            struct result *r = &res[nres++];

            r->trace = traces[t].name;
            r->capacity = capacities[k];
            r->tinylfu = bench_run(&traces[t], r->capacity, LCACHE_POLICY_TINYLFU, 0,
                                   &r->tinylfu_ns);
            r->lru = bench_run(&traces[t], r->capacity, LCACHE_POLICY_LRU, 0, &r->lru_ns);
            r->tinylfu_dk = bench_run(&traces[t], r->capacity, LCACHE_POLICY_TINYLFU, 1,
                                      &unused);
            if (!(r->tinylfu > r->lru))
                pass = 0;
            if (!json)
                printf("lcache %s cap=%zu tinylfu=%.4f lru=%.4f tinylfu+doorkeeper=%.4f\n",
                       r->trace, r->capacity, r->tinylfu, r->lru, r->tinylfu_dk);
        }
    }

    if (json) {
        printf("{\"bench\":\"lcache\",\"accesses\":%d,\"keys\":%d,\"zipf_s\":%.2f,"
               "\"scan_len\":%d,\"scan_every\":%d,\"results\":[",
               BENCH_ACCESSES, BENCH_KEYS, BENCH_ZIPF_S, BENCH_SCAN_LEN, BENCH_SCAN_EVERY);
        for (size_t i = 0; i < nres; i++)
            printf("%s{\"trace\":\"%s\",\"capacity\":%zu,\"tinylfu\":%.4f,\"lru\":%.4f,"
                   "\"tinylfu_doorkeeper\":%.4f,\"tinylfu_ns_per_op\":%.1f,"
                   "\"lru_ns_per_op\":%.1f}",
                   i ? "," : "", res[i].trace, res[i].capacity, res[i].tinylfu, res[i].lru,
                   res[i].tinylfu_dk, res[i].tinylfu_ns, res[i].lru_ns);
        printf("],\"pass\":%s}\n", pass ? "true" : "false");
    } else if (!pass) {
        printf("lcache FAIL: W-TinyLFU did not beat LRU on every trace\n");
    }

    for (size_t t = 0; t < CS_ARRAY_LEN(traces); t++)
        free(traces[t].keys);
    return pass ? EXIT_SUCCESS : EXIT_FAILURE;
}
