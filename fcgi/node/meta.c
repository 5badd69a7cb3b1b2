/* meta.c - per-worker activity metadata over lcache. */
#include "meta.h"
#include "conf.h"
#include "cs.h"
#include "keys.h"
#include "lcache.h"
#include "log.h"
#include "shm.h"
#include "breaker.h"
#include "rconn.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One cached activity, compact: a cache of cache.size entries must stay a
 * few hundred kilobytes, not size x sizeof(struct activity). */
struct meta_entry {
    enum meta_kind kind;
    int status, validity_days, return_on_expiry;
    int64_t id, total_num, start_ms, end_ms;
    int64_t remaining;         /* last stock seen, -1 unknown */
    char coupon_amount[24], coupon_threshold[24];
    size_t coupon_name_off;    /* into text */
    size_t groups_off;         /* into text */
    char text[];               /* name NUL coupon_name NUL groups NUL */
};

struct meta {
    struct lcache *cache;
    struct lcache_opts opts;
    int64_t stale_ms;
    struct meta_entry *last;   /* of the last meta_lookup(); valid until a put */
    struct lcache_stats pushed;
    uint64_t epoch;            /* shm meta_epoch the cache was filled under */
    struct shm_node *shm;      /* the node's: its epoch, its breaker */
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

struct meta *meta_new(const struct cs_conf *conf, struct shm_node *shm)
{
    struct meta *m = xcalloc(1, sizeof(*m));
    m->shm = shm;
    m->opts.capacity = (size_t)conf->cache_size;
    m->opts.policy = LCACHE_POLICY_TINYLFU;
    m->opts.expire_ms = conf->cache_expire_ms;
    m->opts.refresh_ms = conf->cache_refresh_ms;
    m->opts.free_value = meta_entry_free;
    m->opts.seed = (uint64_t)cs_now_ms() ^ ((uint64_t)getpid() << 32);
    m->stale_ms = conf->cache_stale_ms;
    m->cache = meta_cache_new(&m->opts);
    return m;
}

void meta_free(struct meta *m)
{
    if (m == NULL)
        return;
    lcache_free(m->cache);
    free(m);
}

static struct meta_entry *meta_entry_new(enum meta_kind kind, const struct activity *a,
                                         int64_t remaining)
{
    size_t nl = strlen(a->name), cl = strlen(a->coupon_name), gl = strlen(a->groups);
    struct meta_entry *e = xmalloc(sizeof(*e) + nl + cl + gl + 3);
    e->kind = kind;
    e->status = a->status;
    e->validity_days = a->validity_days;
    e->return_on_expiry = a->return_on_expiry;
    e->id = a->id;
    e->total_num = a->total_num;
    e->start_ms = a->start_ms;
    e->end_ms = a->end_ms;
    e->remaining = remaining;
    memcpy(e->coupon_amount, a->coupon_amount, sizeof(e->coupon_amount));
    memcpy(e->coupon_threshold, a->coupon_threshold, sizeof(e->coupon_threshold));
    memcpy(e->text, a->name, nl + 1);
    e->coupon_name_off = nl + 1;
    memcpy(e->text + nl + 1, a->coupon_name, cl + 1);
    e->groups_off = nl + cl + 2;
    memcpy(e->text + e->groups_off, a->groups, gl + 1);
    return e;
}

static void meta_entry_copy(const struct meta_entry *e, struct activity *a)
{
    memset(a, 0, offsetof(struct activity, name) + 1);
    a->id = e->id;
    a->total_num = e->total_num;
    a->start_ms = e->start_ms;
    a->end_ms = e->end_ms;
    a->validity_days = e->validity_days;
    a->status = e->status;
    memcpy(a->coupon_amount, e->coupon_amount, sizeof(a->coupon_amount));
    memcpy(a->coupon_threshold, e->coupon_threshold, sizeof(a->coupon_threshold));
    snprintf(a->name, sizeof(a->name), "%s", e->text);
    snprintf(a->coupon_name, sizeof(a->coupon_name), "%s", e->text + e->coupon_name_off);
    a->return_on_expiry = e->return_on_expiry;
    snprintf(a->groups, sizeof(a->groups), "%s", e->text + e->groups_off);
}

/* Reads ID's META field and its membership of ACTIVITY:VOIDED in one round
 * trip. On CS_OK *out is a new entry; CS_ERR when Redis could not be read. */
static int meta_load(struct meta *m, struct rconn *rc, int64_t id, int64_t remaining, struct meta_entry **out)
{
    char key[KEYS_MAX], field[24];
    redisReply *meta = NULL, *voided = NULL;
    struct activity a;
    enum meta_kind kind = META_ABSENT;

    if (!breaker_readable(m->shm))
        return CS_ERR;
    keys_meta(key, keys_shard(id));
    snprintf(field, sizeof(field), "%" PRId64, id);
    if (rconn_append(rc, key, "HGET %s %s", key, field) != CS_OK
        || rconn_append(rc, KEY_ACTIVITY_VOIDED, "SISMEMBER %s %s", KEY_ACTIVITY_VOIDED,
                        field) != CS_OK
        || rconn_get_reply(rc, &meta) != CS_OK || rconn_get_reply(rc, &voided) != CS_OK) {
        if (meta)
            freeReplyObject(meta);
        return CS_ERR;
    }
    /* LOADING, BUSY ...: Redis said nothing about the activity, so what is
     * cached stands (treating it as absent would answer NO_SUCH_ACTIVITY
     * while Redis loads its data). */
    if (meta->type == REDIS_REPLY_ERROR || voided->type == REDIS_REPLY_ERROR) {
        log_debug("reading %s field %s: %s", key, field,
                  meta->type == REDIS_REPLY_ERROR ? meta->str : voided->str);
        freeReplyObject(meta);
        freeReplyObject(voided);
        return CS_ERR;
    }
    memset(&a, 0, sizeof(a));
    a.id = id;
    if (meta->type == REDIS_REPLY_STRING) {
        cJSON *o = cJSON_ParseWithLength(meta->str, meta->len);
        if (o != NULL && activity_from_json(o, &a) == CS_OK && a.id == id)
            kind = META_FOUND;
        else
            log_error("%s field %s holds malformed JSON; treating it as absent", key, field);
        cJSON_Delete(o);
        if (kind != META_FOUND) {
            memset(&a, 0, sizeof(a));
            a.id = id;
        }
    } else if (meta->type != REDIS_REPLY_NIL) {
        log_error("HGET %s: unexpected reply type %d", key, meta->type);
    }
    /* The voided set wins: a META written by a preheat that raced a revoke
     * may still show the activity on sale. */
    if ((voided->type == REDIS_REPLY_INTEGER && voided->integer == 1)
        || (kind == META_FOUND && a.status == ACT_VOIDED)) {
        kind = META_VOIDED;
        a.status = ACT_VOIDED;
    }
    freeReplyObject(meta);
    freeReplyObject(voided);
    *out = meta_entry_new(kind, &a, remaining);
    return CS_OK;
}

/* Stores a freshly loaded entry and copies it out. lcache_put() may free it
 * at once (admission with a tiny cache), so the copy comes first. */
static enum meta_kind meta_store(struct meta *m, int64_t id, struct meta_entry *e, int64_t now,
                                 struct activity *out)
{
    enum meta_kind kind = e->kind;
    meta_entry_copy(e, out);
    lcache_put(m->cache, id, e, now);
    m->last = lcache_region_of(m->cache, id) != LCACHE_REGION_NONE ? e : NULL;
    return kind;
}

/* meta_load(), and once more while before deadline_ms (0: no second try). */
static int meta_load_within(struct meta *m, struct rconn *rc, int64_t id, int64_t remaining,
                            struct meta_entry **out, int64_t deadline_ms)
{
    if (meta_load(m, rc, id, remaining, out) == CS_OK)
        return CS_OK;
    if (deadline_ms == 0 || cs_mono_ms() >= deadline_ms || !breaker_readable(m->shm))
        return CS_ERR;
    return meta_load(m, rc, id, remaining, out);
}

enum meta_kind meta_lookup(struct meta *m, struct rconn *rc, int64_t id, struct activity *out,
                           int *stale)
{
    return meta_lookup_within(m, rc, id, out, stale, 0);
}

enum meta_kind meta_lookup_within(struct meta *m, struct rconn *rc, int64_t id,
                                  struct activity *out, int *stale, int64_t deadline_ms)
{
    int64_t now = cs_mono_ms();
    void *v = NULL;
    struct meta_entry *e, *fresh;

    *stale = 0;
    m->last = NULL;
    uint64_t epoch = atomic_load_explicit(&m->shm->meta_epoch, memory_order_relaxed);
    if (epoch != m->epoch) {
        /* An admin change on this node: read it, not what was cached. */
        meta_push_stats(m, m->shm);
        meta_invalidate(m);
        m->epoch = epoch;
    }
    switch (lcache_get(m->cache, id, now, &v)) {
    case LCACHE_HIT:
        e = v;
        break;
    case LCACHE_HIT_REFRESH:
        /* This caller refreshes this one entry; the rest of the cache and
         * every other caller keep what they have. */
        e = v;
        if (meta_load_within(m, rc, id, e->remaining, &fresh, deadline_ms) != CS_OK) {
            lcache_refresh_failed(m->cache, id, now);
            *stale = 1;
            break;
        }
        return meta_store(m, id, fresh, now, out);
    default:
        if (meta_load_within(m, rc, id, -1, &fresh, deadline_ms) != CS_OK) {
            lcache_load_failed(m->cache);
            e = lcache_get_stale(m->cache, id, now, m->stale_ms, NULL);
            if (e == NULL)
                return META_UNAVAILABLE;
            *stale = 1;
            break;
        }
        return meta_store(m, id, fresh, now, out);
    }
    m->last = e;
    meta_entry_copy(e, out);
    return e->kind;
}

int64_t meta_last_remaining(struct meta *m, int64_t id)
{
    return m->last != NULL && m->last->id == id ? m->last->remaining : -1;
}

void meta_set_remaining(struct meta *m, int64_t id, int64_t remaining)
{
    if (m->last != NULL && m->last->id == id)
        m->last->remaining = remaining;
}

void meta_forget(struct meta *m, int64_t id)
{
    if (m->last != NULL && m->last->id == id)
        m->last = NULL;
    lcache_remove(m->cache, id);
}

void meta_invalidate(struct meta *m)
{
    lcache_free(m->cache);
    m->cache = meta_cache_new(&m->opts);
    m->pushed = (struct lcache_stats){0};
    m->last = NULL;
}

void meta_invalidate_node(struct shm_node *shm)
{
    atomic_fetch_add(&shm->meta_epoch, 1);
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
