/* jobs.c - preheat, status job, reconciliation and queue depth for coupon-sync. */
#include "jobs.h"
#include "activity.h"
#include "coupon.h"
#include "cs.h"
#include "drain.h"
#include "keys.h"
#include "log.h"
#include "mconn.h"
#include "preheat.h"
#include "rconn.h"
#include "smetrics.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Pause before re-reading an activity whose numbers did not add up. */
#define JOBS_RECHECK_MS 200

/* Seconds after its end that a sale is still reconciled by the full pass:
 * its last entries are drained by then. */
#define JOBS_RECONCILE_ENDED_S 3600

/* Which activities of a shard a reconciliation reads: those changed since a
 * time (a drain's stock decrement, a top-up and a change made by hand all
 * stamp updated_at; by idx_activity_updated), or, in the rare full pass,
 * every sale open or ended within JOBS_RECONCILE_ENDED_S (by
 * idx_activity_end). Never all that exist. */
#define SQL_REC_CHANGED "a.updated_at >= FROM_UNIXTIME(?) AND a.id % 10 = ? AND a.status <> 4"
#define SQL_REC_OPEN \
    "a.distribute_end_time > NOW() - INTERVAL ? SECOND AND a.id % 10 = ? AND a.status <> 4"
static const char SQL_REC_IDS_CHANGED[] = "SELECT a.id FROM activity a WHERE " SQL_REC_CHANGED;
static const char SQL_REC_IDS_OPEN[] = "SELECT a.id FROM activity a WHERE " SQL_REC_OPEN;
/* Total and coupons of the same activities, in one query: one per activity
 * was 2,000 round trips a shard with 20,000 on sale. A return whose Redis
 * step is still to follow (returned = 1) counts here as Redis still sees it:
 * its user in the seize list, its stock not back (the coupon job does that
 * step and marks it 2 under the shard lock). */
#define SQL_REC_COUNTS \
    "SELECT a.id, a.total_num, (SELECT COUNT(*) FROM coupon c WHERE c.activity_id = a.id " \
    "AND c.returned <> 2) " \
    "FROM activity a WHERE "
static const char SQL_RECONCILE_CHANGED[] = SQL_REC_COUNTS SQL_REC_CHANGED;
static const char SQL_RECONCILE_OPEN[] = SQL_REC_COUNTS SQL_REC_OPEN;

/* The activities one reconciliation reads: full, or changed since since_s. */
struct rec_sel {
    int full;
    int64_t since_s;
    int shard;
};

/* Routes a job failure: a dropped connection is an outage of that dependency
 * (logged once), anything else is logged as it comes. */
static void jobs_fail(struct mconn *mc, struct rconn *rc, const char *what, const char *err)
{
    char why[600];
    snprintf(why, sizeof(why), "%s: %s", what, err);
    if (rc != NULL && rc->ctx == NULL)
        smetrics_dep_fail(SM_DEP_REDIS, why);
    else if (mc != NULL && mc->my == NULL)
        smetrics_dep_fail(SM_DEP_MYSQL, why);
    else {
        smetrics_add_errors(1);
        log_error("%s", why);
    }
}

int jobs_preheat(struct mconn *mc, struct rconn *rc, int horizon_days, int grace_s,
                 struct preheat_mark *mark, int relist)
{
    struct preheat_result res;
    char err[512];
    int full = mark->since_s == 0;

    if (activity_preheat_pass(mc, rc, horizon_days, grace_s, mark, relist, &res, err,
                              sizeof(err)) != CS_OK) {
        jobs_fail(mc, rc, "preheat", err);
        return CS_ERR;
    }
    smetrics_dep_ok(SM_DEP_MYSQL);
    smetrics_dep_ok(SM_DEP_REDIS);
    if (res.stale > 0)
        log_info("preheat: %d activities left as they are: Redis holds a newer version",
                 res.stale);
    if (res.clamped > 0)
        log_error("preheat: %d stock fields held at 0: their total_num fell below what Redis "
                  "had granted (POST /market/admin/coupon/reconcile tells by how much)",
                  res.clamped);
    if (res.created > 0 || res.restored > 0 || res.adjusted > 0)
        log_info("preheat%s: %d activities written, %d stock fields created, %d restored, "
                 "%d moved by a change of total",
                 full ? "" : " (changes)", res.written, res.created, res.restored, res.adjusted);
    else if (full)
        log_debug("preheat: %d activities listed, %d written", res.loaded, res.written);
    else
        log_debug("preheat (changes): %d read, %d written%s", res.changed, res.written,
                  res.listed ? ", list rewritten" : "");
    return CS_OK;
}

int jobs_status(struct mconn *mc, struct rconn *rc)
{
    uint64_t changed;
    char err[512];

    (void)rc;
    if (activity_advance_status(mc, &changed, err, sizeof(err)) != CS_OK) {
        jobs_fail(mc, NULL, "status job", err);
        return CS_ERR;
    }
    smetrics_dep_ok(SM_DEP_MYSQL);
    if (changed > 0)
        log_info("status job: %" PRIu64 " activities moved on", changed);
    return CS_OK;
}

int jobs_queue_depth(struct rconn *rc, int64_t *total)
{
    char key[KEYS_MAX];
    int64_t sum = 0;

    for (int i = 0; i < KEYS_SHARDS; i++) {
        keys_queue(key, i);
        redisReply *r = rconn_command(rc, key, "HLEN %s", key);
        if (r == NULL || r->type != REDIS_REPLY_INTEGER) {
            jobs_fail(NULL, rc, "HLEN", r ? "unexpected reply" : rc->errstr);
            if (r != NULL)
                freeReplyObject(r);
            return CS_ERR;
        }
        smetrics_set_depth(i, r->integer);
        sum += r->integer;
        freeReplyObject(r);
    }
    *total = sum;
    return CS_OK;
}

/* ---- expiry: ended activities leave Redis ---------------------------------------- */

/* Ids of shard SHARD whose window ended before cutoff_ms, from the META hash. */
static int exp_candidates(struct rconn *rc, int shard, int64_t cutoff_ms, int64_t **ids,
                          size_t *n, char *err, size_t errlen)
{
    char key[KEYS_MAX], cursor[24] = "0";
    size_t cap = 0;

    keys_meta(key, shard);
    *ids = NULL;
    *n = 0;
    do {
        redisReply *r = rconn_hscan(rc, key, cursor, sizeof(cursor), NULL, 500, err, errlen);
        if (r == NULL) {
            free(*ids);
            *ids = NULL;
            return CS_ERR;
        }
        const redisReply *kv = r->element[1];
        for (size_t i = 0; i + 1 < kv->elements; i += 2) {
            const redisReply *f = kv->element[i], *v = kv->element[i + 1];
            struct activity a;
            int64_t id;
            if (cs_parse_id(f->str, f->len, &id) != CS_OK)
                continue;
            cJSON *o = cJSON_ParseWithLength(v->str, v->len);
            int ok = o != NULL && activity_from_json(o, &a) == CS_OK;
            cJSON_Delete(o);
            /* A field that does not parse is not ours to judge: left alone. */
            if (!ok || a.end_ms >= cutoff_ms)
                continue;
            *ids = cs_grow(*ids, &cap, *n + 1, sizeof(**ids));
            (*ids)[(*n)++] = id;
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
    return CS_OK;
}

/* Ids of shard SHARD that ENDS says ended before cutoff_ms: only what is due
 * is read. */
#define EXP_BATCH 5000
static int exp_due(struct rconn *rc, int shard, int64_t cutoff_ms, int64_t **ids, size_t *n,
                   char *err, size_t errlen)
{
    char key[KEYS_MAX];

    keys_ends(key, shard);
    *ids = NULL;
    *n = 0;
    redisReply *r = rconn_command(rc, key, "ZRANGEBYSCORE %s -inf (%" PRId64 " LIMIT 0 %d", key,
                                  cutoff_ms, EXP_BATCH);
    if (rconn_expect(rc, r, REDIS_REPLY_ARRAY, "ZRANGEBYSCORE", key, err, errlen) != CS_OK)
        return CS_ERR;
    *ids = xmalloc((r->elements + 1) * sizeof(**ids));
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        if (e->type == REDIS_REPLY_STRING && cs_parse_id(e->str, e->len, &(*ids)[*n]) == CS_OK)
            (*n)++;
    }
    freeReplyObject(r);
    return CS_OK;
}

/* How many reserve epochs of activity id are open, plus one while tokens an
 * admin's return kept out of stock wait for their node's replay (counted in
 * ':held'): their grants need the sale (-1: Redis failed). */
static int exp_reserves_open(struct rconn *rc, int shard, int64_t id)
{
    char key[KEYS_MAX];
    keys_reserve(key, shard);
    redisReply *r = rconn_command(rc, key, "HMGET %s %" PRId64 " %" PRId64 ":held", key, id, id);
    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
        if (r != NULL)
            freeReplyObject(r);
        return -1;
    }
    int n = r->element[0]->type == REDIS_REPLY_STRING ? atoi(r->element[0]->str) : 0;
    if (r->element[1]->type == REDIS_REPLY_STRING && atoll(r->element[1]->str) > 0)
        n++;
    freeReplyObject(r);
    return n;
}

/*
 * Removes from Redis what activity ID left behind, in one pipeline, stock
 * field first: with it gone the script grants nothing (-3), so deleting the
 * seize list after it can never let a user seize twice. UNLINK frees a big
 * seize list in Redis' background thread instead of stalling every client.
 */
static int exp_remove(struct rconn *rc, int shard, int64_t id, char *err, size_t errlen)
{
    char skey[KEYS_MAX], lkey[KEYS_MAX], wkey[KEYS_MAX], mkey[KEYS_MAX], vkey[KEYS_MAX];
    char ekey[KEYS_MAX], rkey[KEYS_MAX], pkey[KEYS_MAX];
    int ret = CS_OK;

    keys_stock(skey, shard);
    keys_seize_list(lkey, id);
    keys_window(wkey, shard);
    keys_meta(mkey, shard);
    keys_version(vkey, shard);
    keys_ends(ekey, shard);
    /* The version and the end time go last: until then a preheat that
     * still reads the activity finds its version and writes nothing older. */
    keys_reserve(rkey, shard);
    keys_reserve_epochs(pkey, id);
    /* The reserves' bookkeeping and replay markers go with the rest: every
     * epoch of the activity is closed by now (checked by the caller). */
    if (rconn_append(rc, skey, "HDEL %s %" PRId64, skey, id) != CS_OK
        || rconn_append(rc, lkey, "UNLINK %s", lkey) != CS_OK
        || rconn_append(rc, wkey, "HDEL %s %" PRId64, wkey, id) != CS_OK
        || rconn_append(rc, mkey, "HDEL %s %" PRId64, mkey, id) != CS_OK
        || rconn_append(rc, rkey, "HDEL %s %" PRId64 " %" PRId64 ":held %" PRId64 ":low", rkey,
                        id, id, id) != CS_OK
        || rconn_append(rc, pkey, "UNLINK %s", pkey) != CS_OK
        || rconn_append(rc, vkey, "HDEL %s %" PRId64, vkey, id) != CS_OK
        || rconn_append(rc, ekey, "ZREM %s %" PRId64, ekey, id) != CS_OK) {
        snprintf(err, errlen, "expiring activity %" PRId64 ": %s", id, rc->errstr);
        return CS_ERR;
    }
    for (int i = 0; i < 8; i++) {
        redisReply *r;
        if (rconn_get_reply(rc, &r) != CS_OK) {
            snprintf(err, errlen, "expiring activity %" PRId64 ": %s", id, rc->errstr);
            return CS_ERR;
        }
        if (r->type == REDIS_REPLY_ERROR && ret == CS_OK) {
            snprintf(err, errlen, "expiring activity %" PRId64 ": %s", id, r->str);
            ret = CS_ERR;
        }
        freeReplyObject(r);
    }
    return ret;
}

int jobs_expire(struct rconn *rc, int grace_s, int full, int *removed)
{
    int64_t cutoff = cs_now_ms() - (int64_t)grace_s * 1000;
    char err[512];

    *removed = 0;
    for (int shard = 0; shard < KEYS_SHARDS; shard++) {
        int64_t *ids;
        size_t n;
        if ((full ? exp_candidates(rc, shard, cutoff, &ids, &n, err, sizeof(err))
                  : exp_due(rc, shard, cutoff, &ids, &n, err, sizeof(err))) != CS_OK)
            goto fail;
        if (n == 0) {
            free(ids);
            continue;
        }
        qsort(ids, n, sizeof(*ids), cs_cmp_int64);
        int64_t *queued = xmalloc(n * sizeof(*queued));
        int ok = activity_count_queued(rc, shard, ids, n, queued, err, sizeof(err)) == CS_OK;
        for (size_t i = 0; ok && i < n; i++) {
            if (queued[i] > 0) /* coupon-sync has not written all of it yet */
                continue;
            int open = exp_reserves_open(rc, shard, ids[i]);
            if (open != 0) { /* a node still holds a reserve of it (or Redis failed) */
                if (open > 0)
                    log_debug("activity %" PRId64 ": %d reserve epochs still open; kept", ids[i],
                              open);
                continue;
            }
            ok = exp_remove(rc, shard, ids[i], err, sizeof(err)) == CS_OK;
            if (ok) {
                (*removed)++;
                log_info("activity %" PRId64 " ended over %d s ago: removed from Redis", ids[i],
                         grace_s);
            }
        }
        free(queued);
        free(ids);
        if (!ok)
            goto fail;
    }
    smetrics_dep_ok(SM_DEP_REDIS);
    return CS_OK;
fail:
    jobs_fail(NULL, rc, "expire", err);
    return CS_ERR;
}

/* ---- coupons: expiry and return on expiry ------------------------------------------ */

/* The Redis step of the returns in ret[0..n): per shard under its sync lock,
 * script then mark, so reconciliation (which takes the same lock) never sees
 * one done without the other. A busy shard waits for the next pass. */
static int coupons_redis(struct mconn *mc, struct rconn *rc, const struct coupon_return *ret,
                         size_t n, int lock_ttl_ms, char *err, size_t errlen)
{
    for (int shard = 0; shard < KEYS_SHARDS; shard++) {
        char token[DRAIN_TOKEN_MAX];
        size_t mine = 0;
        for (size_t i = 0; i < n; i++)
            mine += keys_shard(ret[i].activity_id) == shard;
        if (mine == 0)
            continue;
        int got = drain_lock_take(rc, shard, lock_ttl_ms, token, sizeof(token));
        if (got < 0) {
            snprintf(err, errlen, "sync lock of shard %d: %s", shard, rc->errstr);
            return CS_ERR;
        }
        if (got == 0)
            continue;
        int ok = 1;
        for (size_t i = 0; ok && i < n; i++) {
            if (keys_shard(ret[i].activity_id) != shard)
                continue;
            int r = coupon_return_redis(rc, &ret[i], err, errlen);
            if (r == CS_ERR) {
                ok = 0;
                break;
            }
            if (coupon_return_mark(mc, ret[i].id) != CS_OK) {
                snprintf(err, errlen, "marking coupon %" PRId64 " returned: %s", ret[i].id,
                         mc->errstr);
                ok = 0;
                break;
            }
            log_info("coupon %" PRId64 " of activity %" PRId64 " expired: stock given back%s",
                     ret[i].id, ret[i].activity_id,
                     r == 1 ? "" : " (in MySQL; Redis had nothing to give back)");
        }
        if (drain_lock_release(rc, shard, token) < 0 && ok) {
            snprintf(err, errlen, "sync lock of shard %d: %s", shard, rc->errstr);
            ok = 0;
        }
        if (!ok)
            return CS_ERR;
    }
    return CS_OK;
}

int jobs_coupons(struct mconn *mc, struct rconn *rc, int batch, int lock_ttl_ms,
                 uint64_t *expired, uint64_t *returned)
{
    char err[512] = "";
    int64_t t0 = cs_mono_ms();

    *expired = *returned = 0;
    /* Returns first: a coupon due in an open sale with return_on_expiry is
     * theirs; the plain pass below leaves those activities alone. */
    for (int round = 0; round < 1000; round++) {
        struct coupon_return *pend;
        size_t n;
        uint64_t now_returned;
        if (coupon_return_due(mc, batch, &now_returned, &pend, &n) != CS_OK) {
            snprintf(err, sizeof(err), "return on expiry: %s", mc->errstr);
            jobs_fail(mc, NULL, "coupon job", err);
            return CS_ERR;
        }
        *returned += now_returned;
        int ok = coupons_redis(mc, rc, pend, n, lock_ttl_ms, err, sizeof(err)) == CS_OK;
        free(pend);
        if (!ok) {
            jobs_fail(mc, rc, "coupon job", err);
            return CS_ERR;
        }
        if (now_returned < (uint64_t)batch)
            break;
    }
    if (coupon_expire_due(mc, batch, expired) != CS_OK) {
        snprintf(err, sizeof(err), "expiry: %s", mc->errstr);
        jobs_fail(mc, NULL, "coupon job", err);
        return CS_ERR;
    }
    smetrics_add_expired(*expired + *returned);
    smetrics_add_returned(*returned);
    smetrics_dep_ok(SM_DEP_MYSQL);
    if (*expired > 0 || *returned > 0)
        log_info("coupon job: %" PRIu64 " coupons expired, %" PRIu64
                 " of them returned to stock (%" PRId64 " ms)",
                 *expired + *returned, *returned, cs_mono_ms() - t0);
    return CS_OK;
}

/* ---- reconciliation ----------------------------------------------------------------- */

struct rec_item {
    int64_t id;
    int read;                  /* read in this pass (its shard was not busy) */
    int found;                 /* still in MySQL */
    int has_stock;             /* stock field present in Redis */
    int64_t total, coupons, queued, stock, delta;
};

/* A queued (activity, user) pair; the queue is deduplicated because HSCAN may
 * return an entry twice. */
struct rec_pair {
    int64_t aid, uid;
};

static int rec_item_cmp(const void *x, const void *y)
{
    const struct rec_item *a = x, *b = y;
    return (a->id > b->id) - (a->id < b->id);
}

static int rec_pair_cmp(const void *x, const void *y)
{
    const struct rec_pair *a = x, *b = y;
    if (a->aid != b->aid)
        return (a->aid > b->aid) - (a->aid < b->aid);
    return (a->uid > b->uid) - (a->uid < b->uid);
}

static struct rec_item *rec_find(struct rec_item *items, size_t n, int64_t id)
{
    struct rec_item key = {.id = id};
    return n > 0 ? bsearch(&key, items, n, sizeof(*items), rec_item_cmp) : NULL;
}

struct rec_rows {
    struct rec_item *items;
    size_t n;
};

/* Row of SQL_RECONCILE: fills the item of that id, if it is one. */
static int rec_mysql_row(void *arg, int ncols, char **cols)
{
    struct rec_rows *rr = arg;
    int64_t id;
    if (ncols != 3 || cols[0] == NULL || cols[1] == NULL || cols[2] == NULL)
        return CS_ERR;
    if (cs_parse_id(cols[0], strlen(cols[0]), &id) != CS_OK)
        return CS_OK;
    struct rec_item *it = rec_find(rr->items, rr->n, id);
    if (it != NULL) {
        it->found = 1;
        it->total = strtoll(cols[1], NULL, 10);
        it->coupons = strtoll(cols[2], NULL, 10);
    }
    return CS_OK;
}

/* Counts the entries of queue shard SHARD per listed activity. */
static int rec_scan_shard(struct rconn *rc, int shard, struct rec_item *items, size_t n,
                          char *err, size_t errlen)
{
    char key[KEYS_MAX], cursor[24] = "0";
    struct rec_pair *pairs = NULL;
    size_t np = 0, cap = 0;

    keys_queue(key, shard);
    do {
        redisReply *r = rconn_hscan(rc, key, cursor, sizeof(cursor), NULL, 1000, err, errlen);
        if (r == NULL) {
            free(pairs);
            return CS_ERR;
        }
        const redisReply *kv = r->element[1];
        for (size_t i = 0; i + 1 < kv->elements; i += 2) {
            struct rec_pair p;
            const redisReply *f = kv->element[i];
            if (keys_parse_queue_field(f->str, f->len, &p.aid, &p.uid) != CS_OK ||
                rec_find(items, n, p.aid) == NULL)
                continue;
            pairs = cs_grow(pairs, &cap, np + 1, sizeof(*pairs));
            pairs[np++] = p;
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);

    if (np > 0)
        qsort(pairs, np, sizeof(*pairs), rec_pair_cmp);
    for (size_t i = 0; i < np; i++)
        if (i == 0 || rec_pair_cmp(&pairs[i], &pairs[i - 1]) != 0)
            rec_find(items, n, pairs[i].aid)->queued++;
    free(pairs);
    return CS_OK;
}

/*
 * Reads the three numbers of every item of SHARD and computes delta = stock +
 * queued + coupons - total. The caller holds the shard lock, so no drain moves
 * entries meanwhile (an entry between its commit and its HDEL would count
 * twice). A seize during the reads can still move the numbers; the stock is
 * read first, so such a race makes the sum come out high, never low.
 */
static int rec_read_shard(struct mconn *mc, struct rconn *rc, struct rec_item *items, size_t n,
                          const struct rec_sel *sel, char *err, size_t errlen, int *mysql_failed)
{
    int shard = sel->shard;
    char skey[KEYS_MAX], rkey[KEYS_MAX];

    *mysql_failed = 0;
    keys_stock(skey, shard);
    keys_reserve(rkey, shard);
    /* Pipelined: one round trip for the shard's stock fields and what node
     * reserves hold of each (counted with the stock: not sold, not free). */
    size_t sent = 0;
    for (size_t i = 0; i < n; i++) {
        struct rec_item *it = &items[i];
        if (keys_shard(it->id) != shard)
            continue;
        it->read = 1;
        it->found = it->has_stock = 0;
        it->total = it->coupons = it->queued = it->stock = it->delta = 0;
        if (rconn_append(rc, skey, "HGET %s %" PRId64, skey, it->id) != CS_OK
            || rconn_append(rc, rkey, "HGET %s %" PRId64 ":held", rkey, it->id) != CS_OK) {
            snprintf(err, errlen, "HGET %s: %s", skey, rc->errstr);
            return CS_ERR;
        }
        sent += 2;
    }
    int ok = 1;
    for (size_t i = 0; i < n && sent > 0; i++) {
        struct rec_item *it = &items[i];
        if (keys_shard(it->id) != shard)
            continue;
        redisReply *r[2];
        for (int j = 0; j < 2; j++) {
            sent--;
            if (rconn_get_reply(rc, &r[j]) != CS_OK) {
                if (j == 1)
                    freeReplyObject(r[0]);
                snprintf(err, errlen, "HGET %s: %s", skey, rc->errstr);
                return CS_ERR;
            }
            if (r[j]->type == REDIS_REPLY_ERROR && ok) {
                snprintf(err, errlen, "HGET %s: %s", j ? rkey : skey, r[j]->str);
                ok = 0;
            }
        }
        if (r[0]->type == REDIS_REPLY_STRING) {
            it->has_stock = 1;
            it->stock = strtoll(r[0]->str, NULL, 10);
            if (r[1]->type == REDIS_REPLY_STRING && it->stock >= 0)
                it->stock += strtoll(r[1]->str, NULL, 10);
        }
        freeReplyObject(r[0]);
        freeReplyObject(r[1]);
    }
    if (!ok)
        return CS_ERR;
    if (rec_scan_shard(rc, shard, items, n, err, errlen) != CS_OK)
        return CS_ERR;
    struct mval p[] = {sel->full ? MV_INT(JOBS_RECONCILE_ENDED_S) : MV_INT(sel->since_s),
                       MV_INT(shard)};
    struct rec_rows rr = {items, n};
    if (mconn_query(mc, sel->full ? SQL_RECONCILE_OPEN : SQL_RECONCILE_CHANGED, p, 2,
                    rec_mysql_row, &rr) != CS_OK) {
        snprintf(err, errlen, "%s", mc->errstr);
        *mysql_failed = 1;
        return CS_ERR;
    }
    for (size_t i = 0; i < n; i++) {
        struct rec_item *it = &items[i];
        if (keys_shard(it->id) == shard)
            it->delta = it->stock + it->queued + it->coupons - it->total;
    }
    return CS_OK;
}

/* Whether items[i] is worth a look: listed, in MySQL, with a live stock field. */
static int rec_checked(const struct rec_item *it)
{
    return it->found && it->has_stock;
}

/* Last mismatch warned about per activity, so a standing one is not repeated
 * at warning level every tick. One list per shard: a shard is reconciled by
 * one task at a time. */
struct rec_warned {
    struct {
        int64_t id, delta;
    } *v;
    size_t n;
};
static struct rec_warned rec_warned[KEYS_SHARDS];

static int rec_already_warned(struct rec_warned *w, int64_t id, int64_t delta)
{
    for (size_t i = 0; i < w->n; i++)
        if (w->v[i].id == id) {
            int same = w->v[i].delta == delta;
            w->v[i].delta = delta;
            return same;
        }
    w->v = xrealloc(w->v, (w->n + 1) * sizeof(*w->v));
    w->v[w->n].id = id;
    w->v[w->n].delta = delta;
    w->n++;
    return 0;
}

static void rec_forget(struct rec_warned *w, int64_t id)
{
    for (size_t i = 0; i < w->n; i++)
        if (w->v[i].id == id) {
            w->v[i] = w->v[--w->n];
            return;
        }
}

/* Reads SHARD once, and when something does not add up once more after a
 * pause, holding the shard lock. *skipped when someone else holds it. */
static int rec_shard(struct mconn *mc, struct rconn *rc, int lock_ttl_ms, const struct rec_sel *sel,
                     struct rec_item *items, struct rec_item *again, size_t n, int *skipped,
                     char *err, size_t errlen, int *mysql_failed)
{
    int shard = sel->shard;
    char token[DRAIN_TOKEN_MAX];
    int ret = CS_ERR;

    *skipped = 0;
    *mysql_failed = 0;
    int got = drain_lock_take(rc, shard, lock_ttl_ms, token, sizeof(token));
    if (got < 0) {
        snprintf(err, errlen, "%s", rc->errstr);
        return CS_ERR;
    }
    if (got == 0) {
        *skipped = 1; /* being drained: the drain reconciles it when done */
        return CS_OK;
    }
    if (rec_read_shard(mc, rc, items, n, sel, err, errlen, mysql_failed) != CS_OK)
        goto out;
    int suspects = 0;
    for (size_t i = 0; i < n; i++)
        suspects += items[i].delta != 0;
    if (suspects > 0) {
        /* A live sale moves the numbers while they are read: report only
         * what reads the same twice. */
        struct timespec ts = {0, JOBS_RECHECK_MS * 1000000L};
        nanosleep(&ts, NULL);
        if (rec_read_shard(mc, rc, again, n, sel, err, errlen, mysql_failed) != CS_OK)
            goto out;
    }
    ret = CS_OK;
out:
    if (drain_lock_release(rc, shard, token) < 0 && ret == CS_OK) {
        snprintf(err, errlen, "%s", rc->errstr);
        ret = CS_ERR;
    }
    return ret;
}

/* Per shard: MySQL's clock when its last reconciliation began (0: none),
 * and when the next full one is due. A shard is reconciled by one task at a
 * time. */
static int64_t rec_since_s[KEYS_SHARDS];
static int64_t rec_next_full_ms[KEYS_SHARDS];

struct rec_ids {
    struct rec_item *items;
    size_t n, cap;
};

static int rec_id_row(void *arg, int ncols, char **cols)
{
    struct rec_ids *r = arg;
    int64_t id;
    if (ncols < 1 || cols[0] == NULL || cs_parse_id(cols[0], strlen(cols[0]), &id) != CS_OK)
        return CS_OK;
    r->items = cs_grow(r->items, &r->cap, r->n + 1, sizeof(*r->items));
    memset(&r->items[r->n], 0, sizeof(r->items[0]));
    r->items[r->n++].id = id;
    return CS_OK;
}

int jobs_reconcile_shard(struct mconn *mc, struct rconn *rc, int shard, int lock_ttl_ms,
                         int full_interval_s, int *mismatches)
{
    struct rec_item *items = NULL, *again = NULL;
    struct rec_ids ids = {0};
    struct rec_sel sel = {.shard = shard};
    size_t n = 0;
    char err[512];
    int ret = CS_ERR, mysql_failed = 0, skipped = 0;
    int64_t now_s = 0, mono = cs_mono_ms();

    *mismatches = 0;
    /* The shard's activities from MySQL, by index: those changed since the
     * last pass (with an overlap for transactions that commit after they
     * stamp updated_at), or all open ones in the rare full pass. */
    char cerr[256];
    if (preheat_mysql_now(mc, &now_s, cerr, sizeof(cerr)) != CS_OK) {
        jobs_fail(mc, NULL, "reconcile", cerr);
        return CS_ERR;
    }
    sel.full = rec_since_s[shard] == 0 || mono >= rec_next_full_ms[shard];
    sel.since_s = rec_since_s[shard] - PREHEAT_OVERLAP_S;
    struct mval p[] = {sel.full ? MV_INT(JOBS_RECONCILE_ENDED_S) : MV_INT(sel.since_s),
                       MV_INT(shard)};
    if (mconn_query(mc, sel.full ? SQL_REC_IDS_OPEN : SQL_REC_IDS_CHANGED, p, 2, rec_id_row,
                    &ids) != CS_OK) {
        free(ids.items);
        jobs_fail(mc, NULL, "reconcile: selecting activities", mc->errstr);
        return CS_ERR;
    }
    items = ids.items;
    n = ids.n;
    if (n == 0) {
        ret = CS_OK;
        goto done;
    }
    qsort(items, n, sizeof(*items), rec_item_cmp);
    /* A listed id twice would be counted twice: keep one. */
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (m == 0 || items[m - 1].id != items[i].id)
            items[m++] = items[i];
    n = m;
    again = xcalloc(n + 1, sizeof(*again));
    memcpy(again, items, n * sizeof(*items));

    if (rec_shard(mc, rc, lock_ttl_ms, &sel, items, again, n, &skipped, err, sizeof(err),
                  &mysql_failed) != CS_OK) {
        jobs_fail(mysql_failed ? mc : NULL, mysql_failed ? NULL : rc, "reconcile", err);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const struct rec_item *a = &items[i], *b = &again[i];
        /* Only a standing mismatch counts: with a sale running, stock and
         * queue are read one after the other and may differ by the seizes in
         * between, so all three numbers must be the same in both reads. */
        if (!a->read || !b->read || !rec_checked(a) || !rec_checked(b) || a->delta == 0 ||
            a->delta != b->delta || a->stock != b->stock || a->queued != b->queued ||
            a->coupons != b->coupons) {
            rec_forget(&rec_warned[shard], a->id);
            continue;
        }
        (*mismatches)++;
        if (rec_already_warned(&rec_warned[shard], b->id, b->delta))
            log_debug("reconcile: activity %" PRId64 " still off by %+" PRId64, b->id, b->delta);
        else
            log_warn("reconcile: activity %" PRId64 ": Redis stock %" PRId64 " + queued %" PRId64
                     " + coupons in MySQL %" PRId64 " = %" PRId64 ", total_num %" PRId64
                     " (off by %+" PRId64 ")",
                     b->id, b->stock, b->queued, b->coupons,
                     b->stock + b->queued + b->coupons, b->total, b->delta);
    }
    /* It read Redis and MySQL: an outage of either is over (logged once,
     * even when no drain has anything to write). */
    if (!skipped) {
        smetrics_dep_ok(SM_DEP_MYSQL);
        smetrics_dep_ok(SM_DEP_REDIS);
    }
    if (*mismatches > 0)
        smetrics_add_mismatches((uint64_t)*mismatches);
    log_debug("reconcile: shard %d: %zu activities%s%s, %d mismatches", shard, n,
              sel.full ? " (full)" : "", skipped ? " (skipped: locked)" : "", *mismatches);
    ret = CS_OK;
    if (skipped) /* read again next time, from the same mark */
        goto out;
done:
    /* Where the next pass starts, once this one has read everything. */
    rec_since_s[shard] = now_s;
    if (sel.full)
        rec_next_full_ms[shard] = mono + (int64_t)full_interval_s * 1000;
    ret = CS_OK;
out:
    free(again);
    free(items);
    return ret;
}

void jobs_cleanup(void)
{
    for (int i = 0; i < KEYS_SHARDS; i++) {
        rec_since_s[i] = rec_next_full_ms[i] = 0;
        free(rec_warned[i].v);
        rec_warned[i].v = NULL;
        rec_warned[i].n = 0;
    }
}
