/* revoke.c - voiding an activity: Redis first, then MySQL, then the list;
 * and the Redis side of revokes, which every preheat applies again. */
#include "revoke.h"
#include "activity.h"
#include "actlist.h"
#include "cs.h"
#include "keys.h"
#include "log.h"
#include "mconn.h"
#include "preheat.h"
#include "preheat_int.h"
#include "rconn.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char SQL_ACTIVITY_EXISTS[] = "SELECT id FROM activity WHERE id = ?";
static const char SQL_REVOKE_LOCK[] = "SELECT status FROM activity WHERE id = ? FOR UPDATE";
static const char SQL_REVOKE_ACTIVITY[] = "UPDATE activity SET status = 4 WHERE id = ?";
static const char SQL_REVOKE_COUPONS[] =
    "UPDATE coupon SET status = 4 WHERE activity_id = ? AND status = 1";

/* Revoked activities that could still be on sale: preheat re-applies their
 * Redis side, so a revoke cut short after Redis lost it heals by itself. */
static const char SQL_VOIDED[] =
    "SELECT id FROM activity WHERE status = 4 AND distribute_end_time > NOW() - INTERVAL ? SECOND";
static const char SQL_VOIDED_CHANGED[] =
    "SELECT id FROM activity WHERE updated_at >= FROM_UNIXTIME(?) AND status = 4 "
    "AND distribute_end_time > NOW() - INTERVAL ? SECOND";

/* Ids in ACTIVITY:VOIDED, sorted, in one command. On CS_OK *ids is xmalloc'ed
 * (caller frees). */
static int revoke_voided_ids(struct rconn *rc, int64_t **ids, size_t *n, char *err, size_t errlen)
{
    redisReply *r = rconn_command(rc, KEY_ACTIVITY_VOIDED, "SMEMBERS %s", KEY_ACTIVITY_VOIDED);
    if (rconn_expect(rc, r, REDIS_REPLY_ARRAY, "SMEMBERS", KEY_ACTIVITY_VOIDED, err, errlen)
        != CS_OK)
        return CS_ERR;
    *ids = rconn_reply_ids(r, n);
    freeReplyObject(r);
    if (*n > 1)
        qsort(*ids, *n, sizeof(int64_t), cs_cmp_int64);
    return CS_OK;
}

/* The Redis side of a revoke: id in ACTIVITY:VOIDED, so every node answers
 * VOIDED, its version the highest, and its stock field a tombstone. A tombstone, not HDEL: a preheat
 * that read MySQL before the revoke finds the field present and cannot put
 * the stock back (HSETNX), and the script answers SOLD_OUT to a node that
 * has not yet seen the revoke, so nothing more is ever issued. Idempotent. */
int revoke_apply_redis(struct rconn *rc, int64_t id, char *err, size_t errlen)
{
    char skey[KEYS_MAX], vkey[KEYS_MAX];
    redisReply *r = rconn_command(rc, KEY_ACTIVITY_VOIDED, "SADD %s %" PRId64,
                                  KEY_ACTIVITY_VOIDED, id);
    if (rconn_expect(rc, r, 0, "SADD", KEY_ACTIVITY_VOIDED, err, errlen) != CS_OK)
        return CS_ERR;
    freeReplyObject(r);
    /* The highest version, before the tombstone: a preheat that read MySQL
     * before the revoke can then write neither its META (an "in progress"
     * sale) nor its window again. */
    keys_version(vkey, keys_shard(id));
    r = rconn_command(rc, vkey, "HSET %s %" PRId64 " %" PRId64, vkey, id, INT64_MAX);
    if (rconn_expect(rc, r, 0, "HSET", vkey, err, errlen) != CS_OK)
        return CS_ERR;
    freeReplyObject(r);
    keys_stock(skey, keys_shard(id));
    r = rconn_command(rc, skey, "HSET %s %" PRId64 " %d", skey, id, ACTIVITY_STOCK_VOIDED);
    if (rconn_expect(rc, r, 0, "HSET", skey, err, errlen) != CS_OK)
        return CS_ERR;
    freeReplyObject(r);
    return CS_OK;
}

struct revoke_ids {
    int64_t *v;
    size_t n, cap;
};

static int revoke_id_row(void *arg, int ncols, char **cols)
{
    struct revoke_ids *ids = arg;
    int64_t id;
    if (ncols < 1 || cols[0] == NULL || cs_parse_id(cols[0], strlen(cols[0]), &id) != CS_OK)
        return CS_OK;
    ids->v = cs_grow(ids->v, &ids->cap, ids->n + 1, sizeof(*ids->v));
    ids->v[ids->n++] = id;
    return CS_OK;
}

/* Re-applies the Redis side of the revokes SQL (with its np params) selects.
 * *n gets how many (may be NULL). */
static int revoke_reapply_query(struct mconn *mc, struct rconn *rc, const char *sql,
                             struct mval *p, int np, int *n, char *err, size_t errlen)
{
    struct revoke_ids ids = {0};
    int ret = CS_OK;
    if (mconn_query(mc, sql, p, np, revoke_id_row, &ids) != CS_OK) {
        snprintf(err, errlen, "selecting revoked activities: %s", mc->errstr);
        free(ids.v);
        return CS_ERR;
    }
    for (size_t i = 0; i < ids.n && ret == CS_OK; i++)
        ret = revoke_apply_redis(rc, ids.v[i], err, errlen);
    if (n != NULL)
        *n = (int)ids.n;
    free(ids.v);
    return ret;
}

/* Drops from vec the activities whose id is in ACTIVITY:VOIDED: revoked
 * since the SELECT, they stay out of the list, and their stock field holds
 * the revoke's tombstone. */
int revoke_drop_voided(struct rconn *rc, struct preheat_vec *vec, char *err, size_t errlen)
{
    int64_t *voided;
    size_t nvoided, kept = 0;

    if (revoke_voided_ids(rc, &voided, &nvoided, err, errlen) != CS_OK)
        return CS_ERR;
    for (size_t i = 0; i < vec->n; i++) {
        if (nvoided > 0 && bsearch(&vec->v[i].id, voided, nvoided, sizeof(int64_t), cs_cmp_int64)) {
            cJSON_free(vec->txt[i]);
            continue;
        }
        if (kept != i) {
            vec->has_coupons[kept] = vec->has_coupons[i];
            vec->txt[kept] = vec->txt[i];
            memcpy(vec->win[kept], vec->win[i], sizeof(vec->win[0]));
            vec->ver[kept] = vec->ver[i];
            vec->v[kept] = vec->v[i];
        }
        kept++;
    }
    vec->n = kept;
    free(voided);
    return CS_OK;
}

int revoke_reapply(struct mconn *mc, struct rconn *rc, int64_t since_s, int grace_s, int *n,
                   char *err, size_t errlen)
{
    struct mval all[] = {MV_INT(grace_s)};
    struct mval chg[] = {MV_INT(since_s), MV_INT(grace_s)};
    if (since_s > 0)
        return revoke_reapply_query(mc, rc, SQL_VOIDED_CHANGED, chg, 2, n, err, errlen);
    return revoke_reapply_query(mc, rc, SQL_VOIDED, all, 1, n, err, errlen);
}

static int revoke_found_row(void *arg, int ncols, char **cols)
{
    (void)ncols;
    (void)cols;
    *(int *)arg = 1;
    return CS_OK;
}

int revoke_activity(struct mconn *mc, struct rconn *rc, int64_t id, int horizon_days,
                    int *found, char *err, size_t errlen)
{
    struct mval p[] = {MV_INT(id)};

    *found = 0;
    if (mconn_query(mc, SQL_ACTIVITY_EXISTS, p, 1, revoke_found_row, found) != CS_OK) {
        snprintf(err, errlen, "%s", mc->errstr);
        return CS_ERR;
    }
    if (!*found)
        return CS_OK;
    /* Redis first: once MySQL says voided, nothing is on sale any more. A
     * failure after this point leaves Redis voided and MySQL not yet; a
     * repeat finishes it, and preheat never puts the stock back. */
    if (revoke_apply_redis(rc, id, err, errlen) != CS_OK)
        return CS_ERR;

    if (mconn_begin(mc) != CS_OK)
        goto fail;
    /* The row lock orders this against coupon-sync, which takes the same
     * lock before it inserts coupons with the activity's current status. */
    int locked = 0;
    if (mconn_query(mc, SQL_REVOKE_LOCK, p, 1, revoke_found_row, &locked) != CS_OK
        || mconn_exec(mc, SQL_REVOKE_ACTIVITY, p, 1, NULL) != CS_OK
        || mconn_exec(mc, SQL_REVOKE_COUPONS, p, 1, NULL) != CS_OK || mconn_commit(mc) != CS_OK) {
        mconn_rollback(mc);
        goto fail;
    }

    /* The list is rewritten with the default grace; the next preheat
     * applies the configured one. */
    int ret = actlist_rewrite(mc, rc, horizon_days, ACTIVITY_GRACE_S, err, errlen);
    log_notice("activity %" PRId64 " revoked", id);
    return ret;

fail:
    snprintf(err, errlen, "%s", mc->errstr);
    return CS_ERR;
}
