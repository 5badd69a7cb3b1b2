/* lcache.c - W-TinyLFU / LRU bounded cache with expire, refresh and stale reads. */
#include "lcache.h"
#include "cs.h"

#include <stdlib.h>
#include <string.h>

#define LCACHE_MAX_CAPACITY ((size_t)1 << 24) /* keeps every table size in range */
#define SKETCH_ROWS 4
#define SKETCH_MAX 15                       /* 4-bit counters saturate here */
#define SKETCH_HALVE 0x7777777777777777ULL  /* clears the bit shifted in from the next counter */
#define SAMPLE_FACTOR 10                    /* age the sketch every 10 x capacity increments */
#define WINDOW_PERCENT 1
#define PROTECTED_PERCENT 80
#define ADMIT_WARM 5                        /* see admit() */
#define DEFAULT_SEED 0x6c63616368652d31ULL  /* "lcache-1" */

enum { Q_WINDOW, Q_PROBATION, Q_PROTECTED, Q_COUNT };

struct node {
    int64_t key;
    void *value;
    size_t weight;
    int64_t write_ms;
    int64_t refresh_at;       /* when the outstanding refresh was claimed or failed */
    struct node *prev, *next; /* access order inside its queue, prev = older */
    struct node *hnext;       /* hash chain; free-list link while unused */
    unsigned char queue;      /* Q_* */
    unsigned char refreshing; /* a refresh is claimed (or backing off after failure) */
    unsigned char expired_seen;
};

/* head = least recently used, tail = most recently used. */
struct queue {
    struct node *head, *tail;
    size_t len;
};

/* Count-min sketch: SKETCH_ROWS rows of 4-bit counters packed 16 to a word,
 * plus an optional doorkeeper Bloom filter that absorbs first sightings. */
struct sketch {
    uint64_t *table;
    size_t row_words;
    unsigned shift;               /* 64 - log2(counters per row) */
    uint64_t mul[SKETCH_ROWS];    /* odd multipliers, one hash per row */
    uint64_t *door;               /* NULL when the doorkeeper is off */
    size_t door_words;
    unsigned door_shift;          /* 64 - log2(doorkeeper bits) */
    size_t additions;
    size_t sample;
};

struct lcache {
    size_t capacity;
    size_t max_weight;
    int policy;
    int64_t expire_ms;
    int64_t refresh_ms;
    void (*free_value)(void *);
    size_t (*weigh)(int64_t, const void *);
    uint64_t seed;
    uint64_t rng;

    struct node **buckets;
    unsigned bucket_shift;        /* 64 - log2(bucket count) */
    struct node *pool;            /* capacity + 1 nodes: a put inserts before it evicts */
    struct node *free_nodes;

    struct queue q[Q_COUNT];
    size_t window_max;
    size_t protected_max;
    size_t count;
    size_t weight;

    struct sketch sk;
    struct lcache_stats st;
};

/* splitmix64 finalizer: spreads every key bit over the whole word. */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

static uint64_t key_hash(const struct lcache *c, int64_t key)
{
    return mix64((uint64_t)key ^ c->seed);
}

static uint64_t rng_next(struct lcache *c)
{
    /* xorshift64*: only used to break admission ties, so quality is ample. */
    c->rng ^= c->rng >> 12;
    c->rng ^= c->rng << 25;
    c->rng ^= c->rng >> 27;
    return c->rng * 0x2545f4914f6cdd1dULL;
}

static unsigned log2_ceil(size_t n)
{
    unsigned b = 0;

    while (((size_t)1 << b) < n)
        b++;
    return b;
}

/* ---- frequency sketch ---- */

static void sketch_init(struct sketch *sk, size_t capacity, int doorkeeper, uint64_t seed)
{
    /* 4 counters per row per entry (16 per entry overall), as Caffeine sizes
     * its table: 8 bytes of sketch per cached entry. */
    unsigned bits = log2_ceil(capacity < 16 ? 16 : capacity) + 2;

    sk->row_words = ((size_t)1 << bits) / 16;
    sk->shift = 64 - bits;
    sk->table = xcalloc(SKETCH_ROWS * sk->row_words, sizeof(uint64_t));
    for (int i = 0; i < SKETCH_ROWS; i++)
        sk->mul[i] = mix64(seed + 0x9e3779b97f4a7c15ULL * (uint64_t)(i + 1)) | 1;
    sk->additions = 0;
    sk->sample = SAMPLE_FACTOR * capacity;
    sk->door = NULL;
    sk->door_words = 0;
    sk->door_shift = 0;
    if (doorkeeper) {
        /* At most `sample` first sightings land in it between resets: 8+ bits
         * per sighting and 2 probes keep false positives under ~5%, and a
         * false positive only lets a first sighting count as a second. */
        unsigned dbits = log2_ceil(sk->sample < 64 ? 64 : sk->sample) + 3;
        sk->door_words = ((size_t)1 << dbits) / 64;
        sk->door_shift = 64 - dbits;
        sk->door = xcalloc(sk->door_words, sizeof(uint64_t));
    }
}

static void sketch_destroy(struct sketch *sk)
{
    free(sk->table);
    free(sk->door);
}

static size_t sketch_index(const struct sketch *sk, int row, uint64_t h)
{
    return (size_t)((h * sk->mul[row]) >> sk->shift);
}

static void sketch_age(struct sketch *sk)
{
    size_t n = SKETCH_ROWS * sk->row_words;

    for (size_t i = 0; i < n; i++)
        sk->table[i] = (sk->table[i] >> 1) & SKETCH_HALVE;
    if (sk->door != NULL)
        memset(sk->door, 0, sk->door_words * sizeof(uint64_t));
    sk->additions /= 2;
}

/* Sets the doorkeeper bits of h; returns 1 if all were already set. */
static int door_test_and_set(struct sketch *sk, uint64_t h)
{
    size_t b1 = (size_t)((h * 0xc2b2ae3d27d4eb4fULL) >> sk->door_shift);
    size_t b2 = (size_t)((h * 0x165667b19e3779f9ULL) >> sk->door_shift);
    uint64_t m1 = 1ULL << (b1 & 63), m2 = 1ULL << (b2 & 63);
    int seen = (sk->door[b1 >> 6] & m1) && (sk->door[b2 >> 6] & m2);

    sk->door[b1 >> 6] |= m1;
    sk->door[b2 >> 6] |= m2;
    return seen;
}

static int door_contains(const struct sketch *sk, uint64_t h)
{
    size_t b1 = (size_t)((h * 0xc2b2ae3d27d4eb4fULL) >> sk->door_shift);
    size_t b2 = (size_t)((h * 0x165667b19e3779f9ULL) >> sk->door_shift);

    return (sk->door[b1 >> 6] >> (b1 & 63) & 1) && (sk->door[b2 >> 6] >> (b2 & 63) & 1);
}

static void sketch_increment(struct sketch *sk, uint64_t h)
{
    int added = 0;

    if (sk->door != NULL && !door_test_and_set(sk, h)) {
        added = 1;
    } else {
        for (int row = 0; row < SKETCH_ROWS; row++) {
            size_t idx = sketch_index(sk, row, h);
            uint64_t *w = &sk->table[(size_t)row * sk->row_words + (idx >> 4)];
            unsigned sh = (unsigned)(idx & 15) << 2;

            if (((*w >> sh) & 15) < SKETCH_MAX) {
                *w += 1ULL << sh;
                added = 1;
            }
        }
    }
    /* Saturated keys do not advance the clock, as in Caffeine. */
    if (added && ++sk->additions >= sk->sample)
        sketch_age(sk);
}

static unsigned sketch_frequency(const struct sketch *sk, uint64_t h)
{
    unsigned f = SKETCH_MAX;

    for (int row = 0; row < SKETCH_ROWS; row++) {
        size_t idx = sketch_index(sk, row, h);
        uint64_t w = sk->table[(size_t)row * sk->row_words + (idx >> 4)];
        unsigned v = (unsigned)(w >> ((idx & 15) << 2)) & 15;

        if (v < f)
            f = v;
    }
    if (sk->door != NULL && door_contains(sk, h))
        f++;
    return f;
}

/* ---- queues ---- */

static void queue_unlink(struct queue *q, struct node *n)
{
    if (n->prev != NULL)
        n->prev->next = n->next;
    else
        q->head = n->next;
    if (n->next != NULL)
        n->next->prev = n->prev;
    else
        q->tail = n->prev;
    n->prev = n->next = NULL;
    q->len--;
}

static void queue_push(struct queue *q, struct node *n)
{
    n->next = NULL;
    n->prev = q->tail;
    if (q->tail != NULL)
        q->tail->next = n;
    else
        q->head = n;
    q->tail = n;
    q->len++;
}

/* Moves n to the most recently used end of queue qid (possibly its own). */
static void node_move(struct lcache *c, struct node *n, int qid)
{
    queue_unlink(&c->q[n->queue], n);
    queue_push(&c->q[qid], n);
    n->queue = (unsigned char)qid;
}

/* ---- hash table ---- */

static struct node **table_slot(const struct lcache *c, uint64_t h)
{
    return &c->buckets[h >> c->bucket_shift];
}

static struct node *table_find(const struct lcache *c, int64_t key, uint64_t h)
{
    for (struct node *n = *table_slot(c, h); n != NULL; n = n->hnext)
        if (n->key == key)
            return n;
    return NULL;
}

static void table_unlink(struct lcache *c, struct node *n)
{
    struct node **pp = table_slot(c, key_hash(c, n->key));

    while (*pp != n)
        pp = &(*pp)->hnext;
    *pp = n->hnext;
}

/* ---- policy ---- */

static int over_bound(const struct lcache *c)
{
    return c->count > c->capacity || (c->max_weight != 0 && c->weight > c->max_weight);
}

/* Drops n: out of the table and its queue, value freed, node back to the pool. */
static void node_drop(struct lcache *c, struct node *n)
{
    table_unlink(c, n);
    queue_unlink(&c->q[n->queue], n);
    c->count--;
    c->weight -= n->weight;
    if (c->free_value != NULL)
        c->free_value(n->value);
    n->value = NULL;
    n->hnext = c->free_nodes;
    c->free_nodes = n;
}

static void node_evict(struct lcache *c, struct node *n)
{
    c->st.evictions++;
    node_drop(c, n);
}

/* TinyLFU admission: does the candidate leaving the window deserve the place
 * of the probation victim? */
static int admit(struct lcache *c, const struct node *cand, const struct node *victim)
{
    unsigned cf = sketch_frequency(&c->sk, key_hash(c, cand->key));
    unsigned vf = sketch_frequency(&c->sk, key_hash(c, victim->key));

    if (cf > vf)
        return 1;
    if (cf <= ADMIT_WARM)
        return 0;
    /* Caffeine's guard against hash flooding: an attacker who inflates the
     * victim's counters through collisions would otherwise keep every warm
     * candidate out forever; letting one in 128 through breaks that. */
    return (rng_next(c) & 127) == 0;
}

/* Records an access of n: frequency, then recency / promotion. */
static void node_access(struct lcache *c, struct node *n, uint64_t h)
{
    if (c->policy == LCACHE_POLICY_LRU) {
        node_move(c, n, Q_WINDOW);
        return;
    }
    sketch_increment(&c->sk, h);
    if (n->queue == Q_PROBATION) {
        node_move(c, n, Q_PROTECTED);
        /* Protected is full: its oldest entry gets another chance in probation. */
        while (c->q[Q_PROTECTED].len > c->protected_max)
            node_move(c, c->q[Q_PROTECTED].head, Q_PROBATION);
    } else {
        node_move(c, n, n->queue);
    }
}

/* Restores the bounds after an insert or a weight change. */
static void lcache_evict(struct lcache *c)
{
    struct node *cand = NULL;

    if (c->policy == LCACHE_POLICY_TINYLFU) {
        /* Window overflow goes to the MRU end of probation; the first one moved
         * (and those after it) are the candidates. */
        while (c->q[Q_WINDOW].len > c->window_max) {
            struct node *n = c->q[Q_WINDOW].head;

            node_move(c, n, Q_PROBATION);
            if (cand == NULL)
                cand = n;
        }
        while (cand != NULL && over_bound(c)) {
            struct node *victim = c->q[Q_PROBATION].head;
            struct node *next = cand->next;

            /* victim == cand: probation holds nothing older to compete with. */
            if (victim != cand && admit(c, cand, victim)) {
                node_evict(c, victim);
            } else {
                node_evict(c, cand);
                cand = next;
            }
        }
    }
    /* Weight bound still exceeded (or LRU mode): drop the least valuable first. */
    while (over_bound(c)) {
        struct node *n = c->q[Q_PROBATION].head;

        if (n == NULL)
            n = c->q[Q_PROTECTED].head;
        if (n == NULL)
            n = c->q[Q_WINDOW].head;
        node_evict(c, n);
    }
}

/* ---- API ---- */

struct lcache *lcache_new(const struct lcache_opts *opts)
{
    struct lcache *c;
    size_t nbuckets;
    unsigned bbits;

    if (opts->capacity == 0 || opts->capacity > LCACHE_MAX_CAPACITY || opts->expire_ms < 0 ||
        opts->refresh_ms < 0 ||
        (opts->policy != LCACHE_POLICY_TINYLFU && opts->policy != LCACHE_POLICY_LRU))
        return NULL;

    c = xcalloc(1, sizeof(*c));
    c->capacity = opts->capacity;
    c->max_weight = opts->max_weight;
    c->policy = opts->policy;
    c->expire_ms = opts->expire_ms;
    c->refresh_ms = opts->refresh_ms;
    c->free_value = opts->free_value;
    c->weigh = opts->weigh;
    c->seed = opts->seed != 0 ? opts->seed : DEFAULT_SEED;
    c->rng = mix64(c->seed) | 1;

    /* Load factor <= 1 at all times; at least 16 buckets so the shift is < 64. */
    bbits = log2_ceil(c->capacity + 1 < 16 ? 16 : c->capacity + 1);
    nbuckets = (size_t)1 << bbits;
    c->bucket_shift = 64 - bbits;
    c->buckets = xcalloc(nbuckets, sizeof(*c->buckets));

    c->pool = xcalloc(c->capacity + 1, sizeof(*c->pool));
    for (size_t i = c->capacity + 1; i-- > 0;) {
        c->pool[i].hnext = c->free_nodes;
        c->free_nodes = &c->pool[i];
    }

    if (c->policy == LCACHE_POLICY_TINYLFU) {
        size_t main_max;

        c->window_max = c->capacity * WINDOW_PERCENT / 100;
        if (c->window_max == 0)
            c->window_max = 1;
        main_max = c->capacity - c->window_max;
        c->protected_max = main_max * PROTECTED_PERCENT / 100;
        sketch_init(&c->sk, c->capacity, opts->doorkeeper, c->seed);
    } else {
        c->window_max = c->capacity;
        c->protected_max = 0;
    }
    return c;
}

void lcache_free(struct lcache *c)
{
    if (c == NULL)
        return;
    if (c->free_value != NULL)
        for (int qid = 0; qid < Q_COUNT; qid++)
            for (struct node *n = c->q[qid].head; n != NULL; n = n->next)
                c->free_value(n->value);
    if (c->policy == LCACHE_POLICY_TINYLFU)
        sketch_destroy(&c->sk);
    free(c->pool);
    free(c->buckets);
    free(c);
}

enum lcache_state lcache_get(struct lcache *c, int64_t key, int64_t now_ms, void **value)
{
    uint64_t h = key_hash(c, key);
    struct node *n = table_find(c, key, h);
    int64_t age;

    if (value != NULL)
        *value = NULL;
    if (n == NULL) {
        c->st.misses++;
        return LCACHE_MISS;
    }
    age = now_ms - n->write_ms;
    if (c->expire_ms != 0 && age >= c->expire_ms) {
        /* Kept, not dropped: lcache_get_stale may still need it. */
        c->st.misses++;
        if (!n->expired_seen) {
            n->expired_seen = 1;
            c->st.expirations++;
        }
        return LCACHE_MISS;
    }
    c->st.hits++;
    node_access(c, n, h);
    if (value != NULL)
        *value = n->value;
    if (c->refresh_ms != 0 && age >= c->refresh_ms &&
        (!n->refreshing || now_ms - n->refresh_at >= c->refresh_ms)) {
        n->refreshing = 1;
        n->refresh_at = now_ms;
        return LCACHE_HIT_REFRESH;
    }
    return LCACHE_HIT;
}

void *lcache_get_stale(struct lcache *c, int64_t key, int64_t now_ms, int64_t max_stale_ms,
                       int64_t *age_ms)
{
    uint64_t h = key_hash(c, key);
    struct node *n = table_find(c, key, h);
    int64_t age;

    if (n == NULL)
        return NULL;
    age = now_ms - n->write_ms;
    if (c->expire_ms != 0 && age >= c->expire_ms &&
        (max_stale_ms < 0 || age - c->expire_ms > max_stale_ms))
        return NULL;
    c->st.stale_hits++;
    node_access(c, n, h);
    if (age_ms != NULL)
        *age_ms = age;
    return n->value;
}

void lcache_put(struct lcache *c, int64_t key, void *value, int64_t now_ms)
{
    uint64_t h = key_hash(c, key);
    struct node *n = table_find(c, key, h);
    size_t w = c->weigh != NULL ? c->weigh(key, value) : 1;

    c->st.puts++;
    if (c->max_weight != 0 && w > c->max_weight) {
        /* Could never fit: storing it would flush the whole cache first. */
        int owned = n != NULL && n->value == value; /* node_drop frees it then */

        if (n != NULL)
            node_drop(c, n);
        if (!owned && c->free_value != NULL)
            c->free_value(value);
        c->st.evictions++;
        return;
    }
    if (n != NULL) {
        if (n->value != value && c->free_value != NULL)
            c->free_value(n->value);
        c->weight = c->weight - n->weight + w;
    } else {
        n = c->free_nodes;
        c->free_nodes = n->hnext;
        n->key = key;
        n->hnext = *table_slot(c, h);
        *table_slot(c, h) = n;
        n->queue = Q_WINDOW;
        queue_push(&c->q[Q_WINDOW], n);
        c->count++;
        c->weight += w;
    }
    n->value = value;
    n->weight = w;
    n->write_ms = now_ms;
    n->refresh_at = 0;
    n->refreshing = 0;
    n->expired_seen = 0;
    node_access(c, n, h);
    lcache_evict(c);
}

int lcache_remove(struct lcache *c, int64_t key)
{
    struct node *n = table_find(c, key, key_hash(c, key));

    if (n == NULL)
        return CS_ERR;
    node_drop(c, n);
    return CS_OK;
}

void lcache_refresh_failed(struct lcache *c, int64_t key, int64_t now_ms)
{
    struct node *n = table_find(c, key, key_hash(c, key));

    c->st.load_failures++;
    if (n != NULL) {
        /* Stay claimed, restamped: the next claim comes refresh_ms from now. */
        n->refreshing = 1;
        n->refresh_at = now_ms;
    }
}

void lcache_load_failed(struct lcache *c)
{
    c->st.load_failures++;
}

void lcache_stats(const struct lcache *c, struct lcache_stats *out)
{
    *out = c->st;
    out->size = c->count;
    out->weight = c->weight;
}

size_t lcache_size(const struct lcache *c)
{
    return c->count;
}

enum lcache_region lcache_region_of(const struct lcache *c, int64_t key)
{
    const struct node *n = table_find(c, key, key_hash(c, key));

    if (n == NULL)
        return LCACHE_REGION_NONE;
    switch (n->queue) {
    case Q_PROBATION:
        return LCACHE_REGION_PROBATION;
    case Q_PROTECTED:
        return LCACHE_REGION_PROTECTED;
    default:
        return LCACHE_REGION_WINDOW;
    }
}
