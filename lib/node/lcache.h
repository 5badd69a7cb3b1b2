/* lcache.h - per-process bounded cache (W-TinyLFU or LRU) of values keyed by activity id. */
#ifndef CS_LCACHE_H
#define CS_LCACHE_H

#include <stddef.h>
#include <stdint.h>

/*
 * A Caffeine-style local cache: bounded by entry count (and optionally by total
 * weight), W-TinyLFU admission (a 1% admission window LRU in front of a
 * segmented LRU main space, 20% probation / 80% protected, guarded by a 4-bit
 * count-min sketch that halves itself every 10 x capacity increments),
 * expire-after-write, refresh-after-write and stale-if-error reads.
 *
 * NOT thread-safe and holds no locks: one cache per worker process (or per
 * thread), never shared. Every function takes the caller's clock as now_ms,
 * so the cache never reads a clock itself; use one monotonic source
 * (cs_mono_ms) for all calls on a cache.
 *
 * Ownership: the cache owns every value put into it and releases it with
 * opts.free_value exactly once - when the entry is replaced by lcache_put with
 * a different pointer, evicted, removed, or the cache is freed. A value pointer
 * returned by a read stays valid until the next lcache_put, lcache_remove or
 * lcache_free on the same cache; copy what you need before those.
 *
 * An expired entry is not dropped at expiry: it stays (counting against the
 * bound) until it is replaced, removed or evicted, so that lcache_get_stale
 * can still serve it while the backing store is down.
 */

enum lcache_policy {
    LCACHE_POLICY_TINYLFU = 0, /* W-TinyLFU: the production policy */
    LCACHE_POLICY_LRU = 1      /* plain LRU, same API; for comparison in benchmarks */
};

struct lcache_opts {
    size_t capacity;   /* max entries, >= 1 */
    size_t max_weight; /* max total weight; 0 = bounded by entry count only */
    int policy;        /* enum lcache_policy */
    int64_t expire_ms; /* expire-after-write; 0 = never expires */
    int64_t refresh_ms; /* refresh-after-write; 0 = never asks for refresh */
    int doorkeeper;    /* nonzero: Bloom-filter doorkeeper in front of the sketch */
    uint64_t seed;     /* hash/admission seed; 0 = a fixed default. Pass a random
                          one in production to make hash flooding harder. */
    void (*free_value)(void *value);                 /* NULL: values are not owned */
    size_t (*weigh)(int64_t key, const void *value); /* NULL: every entry weighs 1 */
};

enum lcache_state {
    LCACHE_MISS,        /* absent or expired */
    LCACHE_HIT,         /* fresh */
    LCACHE_HIT_REFRESH  /* fresh enough to serve; this caller should reload it now */
};

enum lcache_region {
    LCACHE_REGION_NONE,      /* not resident */
    LCACHE_REGION_WINDOW,    /* admission window (every entry, in LRU mode) */
    LCACHE_REGION_PROBATION, /* main space, seen once in main */
    LCACHE_REGION_PROTECTED  /* main space, hit again while in probation */
};

struct lcache_stats {
    uint64_t hits;          /* lcache_get answered HIT or HIT_REFRESH */
    uint64_t misses;        /* lcache_get answered MISS (absent or expired) */
    uint64_t stale_hits;    /* lcache_get_stale returned a value */
    uint64_t evictions;     /* entries dropped by the size/weight bound */
    uint64_t expirations;   /* written values lcache_get found expired (once per put) */
    uint64_t load_failures; /* lcache_refresh_failed + lcache_load_failed calls */
    uint64_t puts;          /* lcache_put calls */
    size_t size;            /* entries now resident */
    size_t weight;          /* total weight now resident */
};

struct lcache;

/* Returns a new empty cache, or NULL when opts are invalid (capacity 0,
 * or above 2^24, negative expire_ms/refresh_ms, unknown policy). Aborts on
 * out-of-memory. Free it with lcache_free. */
struct lcache *lcache_new(const struct lcache_opts *opts);

/* Frees every value (opts.free_value) and the cache. NULL is a no-op. */
void lcache_free(struct lcache *c);

/* Looks key up at now_ms. On HIT/HIT_REFRESH stores the value in *value (NULL
 * on MISS) and records the access (recency + frequency). An entry at least
 * expire_ms old is a MISS but is kept for lcache_get_stale. An entry at least
 * refresh_ms old answers HIT_REFRESH to exactly one caller, who MUST then call
 * lcache_put (success) or lcache_refresh_failed (failure); everyone else gets
 * HIT meanwhile. A claim that is never settled is handed out again refresh_ms
 * after it was made. */
enum lcache_state lcache_get(struct lcache *c, int64_t key, int64_t now_ms, void **value);

/* Stale-if-error read, for when the backing store is down. Returns the value
 * of key if it is resident and at most max_stale_ms past expire_ms (a fresh
 * entry qualifies too; a negative max_stale_ms admits only fresh ones), else
 * NULL. Stores the entry's age (now_ms - write time) in *age_ms when age_ms is
 * not NULL and a value is returned. Records the access, counts stale_hits, but
 * leaves hits/misses alone (the lcache_get before it already counted). */
void *lcache_get_stale(struct lcache *c, int64_t key, int64_t now_ms, int64_t max_stale_ms,
                       int64_t *age_ms);

/* Inserts or replaces key with value (not NULL: lcache_get_stale answers NULL
 * for "nothing") written at now_ms; it is fresh again and any refresh claim on
 * it is settled. Counts as an access. The old value is freed unless it is the
 * same pointer. The cache takes value over: it may be evicted (and freed) by
 * this very call when the bound is tight, and a value heavier than max_weight
 * is freed at once without being stored. May evict other entries. */
void lcache_put(struct lcache *c, int64_t key, void *value, int64_t now_ms);

/* Removes key and frees its value. Returns CS_OK, or CS_ERR if absent. */
int lcache_remove(struct lcache *c, int64_t key);

/* The refresh claimed through HIT_REFRESH failed at now_ms: counts a load
 * failure and keeps serving the current value; one caller gets HIT_REFRESH
 * again once refresh_ms have passed since now_ms (a back-off, so a dead store
 * is not hammered). Absent key: counts the failure only. */
void lcache_refresh_failed(struct lcache *c, int64_t key, int64_t now_ms);

/* A load after a MISS failed: counts a load failure. */
void lcache_load_failed(struct lcache *c);

/* Copies the counters and gauges into *out. */
void lcache_stats(const struct lcache *c, struct lcache_stats *out);

/* Number of resident entries (expired ones included). */
size_t lcache_size(const struct lcache *c);

/* Region key lives in, for tests and diagnostics; not counted as an access. */
enum lcache_region lcache_region_of(const struct lcache *c, int64_t key);

#endif
