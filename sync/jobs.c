/* jobs.c - coupon-sync's preheat, status, expiry and coupon jobs, and the queue depth. */
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

/* Routes a job failure: a dropped connection is an outage of that dependency
 * (logged once), anything else is logged as it comes. */
void jobs_fail(struct mconn *mc, struct rconn *rc, const char *what, const char *err)
{
    char why[600];
    snprintf(why, sizeof(why), "%s: %s", what, err);
    if (rc != NULL && rc->ctx == NULL)
        smetrics_dep_fail(SM_DEP_REDIS, why);
    else if (mc != NULL && mc->my == NULL)
        smetrics_dep_fail(SM_DEP_MYSQL, why);
    else {
        smetrics_add(SM_ERRORS, 1);
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
    *ids = rconn_reply_ids(r, n);
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
        || rconn_append(rc, rkey, "HDEL %s %" PRId64 " %" PRId64 ":held %" PRId64 ":low %" PRId64
                        ":debt", rkey, id, id, id, id) != CS_OK
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
    smetrics_add(SM_EXPIRED, *expired + *returned);
    smetrics_add(SM_RETURNED, *returned);
    smetrics_dep_ok(SM_DEP_MYSQL);
    if (*expired > 0 || *returned > 0)
        log_info("coupon job: %" PRIu64 " coupons expired, %" PRIu64
                 " of them returned to stock (%" PRId64 " ms)",
                 *expired + *returned, *returned, cs_mono_ms() - t0);
    return CS_OK;
}
