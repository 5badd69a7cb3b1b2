/* meta.c - per-worker activity metadata over lcache. */
#include "meta.h"
#include "conf.h"
#include "cs.h"
#include "keys.h"
#include "lcache.h"
#include "log.h"
#include "shm.h"
#include "worker.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define META_FORGET_RELOAD_MS 100

struct meta_entry {
    enum meta_kind kind;
    struct activity a;
};

struct meta {
    struct lcache *cache;
    struct lcache_opts opts;
    int64_t refresh_ms;
    int64_t stale_ms;

    /* The last snapshot read from Redis, sorted by id. */
    struct activity *acts;
    int64_t *remaining;        /* parallel to acts; -1 unknown */
    size_t nacts;
    int64_t *voided;           /* sorted */
    size_t nvoided;
    int64_t snap_at;           /* cs_mono_ms() of the load, 0 = never */

    struct lcache_stats pushed;
};

static void meta_entry_free(void *p)
{
    free(p);
}

/* cache.size is bounded by the config table, so lcache_new() cannot refuse. */
static struct lcache *meta_cache_new(const struct lcache_opts *o)
{
    struct lcache *c = lcache_new(o);
    if (c == NULL) {
        log_error("lcache_new() refused cache.size = %zu", o->capacity);
        abort();
    }
    return c;
}

struct meta *meta_new(const struct cs_conf *conf)
{
    struct meta *m = xcalloc(1, sizeof(*m));
    m->opts.capacity = (size_t)conf->cache_size;
    m->opts.policy = LCACHE_POLICY_TINYLFU;
    m->opts.expire_ms = conf->cache_expire_ms;
    m->opts.refresh_ms = conf->cache_refresh_ms;
    m->opts.free_value = meta_entry_free;
    m->opts.seed = (uint64_t)cs_now_ms() ^ ((uint64_t)getpid() << 32);
    m->refresh_ms = conf->cache_refresh_ms;
    m->stale_ms = conf->cache_stale_ms;
    m->cache = meta_cache_new(&m->opts);
    return m;
}

void meta_free(struct meta *m)
{
    if (m == NULL)
        return;
    lcache_free(m->cache);
    free(m->acts);
    free(m->remaining);
    free(m->voided);
    free(m);
}

static int cmp_act(const void *a, const void *b)
{
    int64_t x = ((const struct activity *)a)->id, y = ((const struct activity *)b)->id;
    return (x > y) - (x < y);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* bsearch() over a sorted array that may be empty (and then NULL). */
static struct activity *find_act(struct activity *acts, size_t n, int64_t id)
{
    struct activity key = {.id = id};
    return n > 0 ? bsearch(&key, acts, n, sizeof(*acts), cmp_act) : NULL;
}

static int is_voided(const struct meta *m, int64_t id)
{
    return m->nvoided > 0 && bsearch(&id, m->voided, m->nvoided, sizeof(int64_t), cmp_i64);
}

/* Reads ACTIVITY:LIST and ACTIVITY:VOIDED in one round trip. */
static int meta_load(struct worker *w)
{
    struct meta *m = w->meta;
    redisReply *list = NULL, *voided = NULL;
    struct activity *acts = NULL;
    size_t n = 0;
    int ok = 0;

    if (!worker_redis_readable(w))
        goto fail;
    if (rconn_append(w->rc, KEY_ACTIVITY_LIST, "GET %s", KEY_ACTIVITY_LIST) != CS_OK
        || rconn_append(w->rc, KEY_ACTIVITY_VOIDED, "SMEMBERS %s", KEY_ACTIVITY_VOIDED) != CS_OK
        || rconn_get_reply(w->rc, &list) != CS_OK || rconn_get_reply(w->rc, &voided) != CS_OK)
        goto fail;
    /* LOADING, BUSY ...: Redis said nothing about the activities, so the
     * old snapshot stands (an empty list here would turn every activity
     * into NO_SUCH_ACTIVITY while Redis loads its data). */
    if (list->type == REDIS_REPLY_ERROR || voided->type == REDIS_REPLY_ERROR) {
        log_debug("reading %s: %s", KEY_ACTIVITY_LIST,
                  list->type == REDIS_REPLY_ERROR ? list->str : voided->str);
        goto fail;
    }
    ok = 1;
    if (list->type == REDIS_REPLY_STRING) {
        if (activity_list_parse(list->str, list->len, &acts, &n) != CS_OK) {
            log_error("%s holds malformed JSON; treating it as empty", KEY_ACTIVITY_LIST);
            acts = NULL;
            n = 0;
        }
    } else if (list->type != REDIS_REPLY_NIL) {
        log_error("GET %s: unexpected reply type %d", KEY_ACTIVITY_LIST, list->type);
    }
    if (n > 1)
        qsort(acts, n, sizeof(*acts), cmp_act);

    int64_t *old_rem = m->remaining;
    struct activity *old_acts = m->acts;
    size_t old_n = m->nacts;
    m->remaining = xmalloc(sizeof(int64_t) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) {
        struct activity *hit = find_act(old_acts, old_n, acts[i].id);
        m->remaining[i] = hit ? old_rem[hit - old_acts] : -1;
    }
    free(old_rem);
    free(old_acts);
    m->acts = acts;
    m->nacts = n;

    free(m->voided);
    m->voided = NULL;
    m->nvoided = 0;
    if (voided->type == REDIS_REPLY_ARRAY && voided->elements > 0) {
        m->voided = xmalloc(sizeof(int64_t) * voided->elements);
        for (size_t i = 0; i < voided->elements; i++) {
            redisReply *e = voided->element[i];
            int64_t id;
            if (e->type == REDIS_REPLY_STRING && cs_parse_id(e->str, e->len, &id) == CS_OK)
                m->voided[m->nvoided++] = id;
        }
        if (m->nvoided > 1)
            qsort(m->voided, m->nvoided, sizeof(int64_t), cmp_i64);
    }
    /* The voided set wins: a list written by a preheat that raced a revoke
     * may still show the activity. */
    for (size_t i = 0; i < m->nacts; i++)
        if (is_voided(m, m->acts[i].id))
            m->acts[i].status = ACT_VOIDED;
    m->snap_at = cs_mono_ms();
fail:
    if (list)
        freeReplyObject(list);
    if (voided)
        freeReplyObject(voided);
    return ok ? CS_OK : CS_ERR;
}

static int meta_snap_fresh(const struct meta *m, int64_t now)
{
    return m->snap_at != 0 && now - m->snap_at < m->refresh_ms;
}

/* Resolves ID from the snapshot into a new cache entry. */
static struct meta_entry *meta_resolve(struct meta *m, int64_t id)
{
    struct meta_entry *e = xcalloc(1, sizeof(*e));
    struct activity *a = find_act(m->acts, m->nacts, id);

    if (a != NULL) {
        e->kind = a->status == ACT_VOIDED ? META_VOIDED : META_FOUND;
        e->a = *a;
    } else if (is_voided(m, id)) {
        e->kind = META_VOIDED;
        e->a.id = id;
        e->a.status = ACT_VOIDED;
    } else {
        e->kind = META_ABSENT;
        e->a.id = id;
    }
    return e;
}

enum meta_kind meta_lookup(struct worker *w, int64_t id, struct activity *out, int *stale)
{
    struct meta *m = w->meta;
    int64_t now = cs_mono_ms();
    void *v = NULL;
    struct meta_entry *e;

    *stale = 0;
    switch (lcache_get(m->cache, id, now, &v)) {
    case LCACHE_HIT:
        e = v;
        break;
    case LCACHE_HIT_REFRESH:
        /* This caller refreshes; everyone else keeps the current entry. */
        if (!meta_snap_fresh(m, now) && meta_load(w) != CS_OK) {
            lcache_refresh_failed(m->cache, id, now);
            e = v;
            *stale = 1;
            break;
        }
        e = meta_resolve(m, id);
        lcache_put(m->cache, id, e, now);
        break;
    default:
        if (!meta_snap_fresh(m, now) && meta_load(w) != CS_OK) {
            lcache_load_failed(m->cache);
            e = lcache_get_stale(m->cache, id, now, m->stale_ms, NULL);
            if (e == NULL)
                return META_UNAVAILABLE;
            *stale = 1;
            break;
        }
        e = meta_resolve(m, id);
        lcache_put(m->cache, id, e, now);
        break;
    }
    *out = e->a;
    return e->kind;
}

int meta_list(struct worker *w, const struct activity **acts, size_t *n, int *stale)
{
    struct meta *m = w->meta;
    int64_t now = cs_mono_ms();

    *stale = 0;
    if (!meta_snap_fresh(m, now) && meta_load(w) != CS_OK) {
        if (m->snap_at == 0 || now - m->snap_at > m->opts.expire_ms + m->stale_ms)
            return CS_ERR;
        *stale = 1;
    }
    *acts = m->acts;
    *n = m->nacts;
    return CS_OK;
}

int64_t meta_last_remaining(struct meta *m, int64_t id)
{
    struct activity *a = find_act(m->acts, m->nacts, id);
    return a ? m->remaining[a - m->acts] : -1;
}

void meta_set_remaining(struct meta *m, int64_t id, int64_t remaining)
{
    struct activity *a = find_act(m->acts, m->nacts, id);
    if (a != NULL)
        m->remaining[a - m->acts] = remaining;
}

void meta_forget(struct meta *m, int64_t id)
{
    lcache_remove(m->cache, id);
    /* However many seizes ask, the list is read again at most this often. */
    if (cs_mono_ms() - m->snap_at >= META_FORGET_RELOAD_MS)
        m->snap_at = 0;
}

void meta_invalidate(struct meta *m)
{
    lcache_free(m->cache);
    m->cache = meta_cache_new(&m->opts);
    m->pushed = (struct lcache_stats){0};
    m->snap_at = 0;
}

void meta_push_stats(struct meta *m, struct shm_node *shm)
{
    struct lcache_stats s;
    lcache_stats(m->cache, &s);
    if (s.hits != m->pushed.hits)
        atomic_fetch_add_explicit(&shm->m.cache_hits, s.hits - m->pushed.hits, memory_order_relaxed);
    if (s.misses != m->pushed.misses)
        atomic_fetch_add_explicit(&shm->m.cache_misses, s.misses - m->pushed.misses,
                                  memory_order_relaxed);
    if (s.evictions != m->pushed.evictions)
        atomic_fetch_add_explicit(&shm->m.cache_evictions, s.evictions - m->pushed.evictions,
                                  memory_order_relaxed);
    if (s.load_failures != m->pushed.load_failures)
        atomic_fetch_add_explicit(&shm->m.cache_load_failures,
                                  s.load_failures - m->pushed.load_failures, memory_order_relaxed);
    if (s.stale_hits != m->pushed.stale_hits)
        atomic_fetch_add_explicit(&shm->m.cache_stale_served, s.stale_hits - m->pushed.stale_hits,
                                  memory_order_relaxed);
    m->pushed = s;
}
