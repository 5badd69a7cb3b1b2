/* restore.c - an activity's stock field, rebuilt with its seize list from MySQL
 * and the queue when Redis lost its data. */
#include "restore.h"
#include "activity.h"
#include "cs.h"
#include "keys.h"
#include "log.h"
#include "mconn.h"
#include "rargs.h"
#include "rconn.h"
#include "scripts.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* Pairs per HSET when rebuilding a seize list, so no single command gets huge. */
#define ACT_HSET_CHUNK 1000

/* Only coupons that count: a returned coupon gave its stock back and its
 * user left the seize list (sql/005_coupon_lifecycle.sql). */
static const char SQL_COUPON_USERS[] =
    "SELECT user_id, CAST(UNIX_TIMESTAMP(seized_at)*1000 AS SIGNED) FROM coupon "
    "WHERE activity_id = ? AND returned = 0";

/* Reserve epochs still open: coupons that nodes hold (internals.md rule 10). */
static const char SQL_OPEN_EPOCHS[] =
    "SELECT incarnation, epoch, amount FROM reserve_epoch WHERE activity_id = ? AND state = 1";
/* Epochs an admin returned whose node has not replayed yet: what the return
 * kept out of stock waits for those grants (rule 16). */
static const char SQL_PARKED_EPOCHS[] =
    "SELECT incarnation, epoch, parked FROM reserve_epoch WHERE activity_id = ? AND state = 2 "
    "AND closed_by = 'admin' AND parked > 0 AND released_at IS NULL";

struct open_epoch {
    char inc[40];
    int64_t epoch, amount;
};

struct open_epochs {
    struct open_epoch *v;
    size_t n, cap;
    int64_t sum;
};

static int open_epoch_row(void *arg, int ncols, char **cols)
{
    struct open_epochs *e = arg;
    if (ncols != 3 || cols[0] == NULL || cols[1] == NULL || cols[2] == NULL)
        return CS_ERR;
    e->v = cs_grow(e->v, &e->cap, e->n + 1, sizeof(*e->v));
    struct open_epoch *o = &e->v[e->n++];
    snprintf(o->inc, sizeof(o->inc), "%s", cols[0]);
    o->epoch = strtoll(cols[1], NULL, 10);
    o->amount = strtoll(cols[2], NULL, 10);
    e->sum += o->amount;
    return CS_OK;
}


/* script_restore for activity a: CS_OK with *created (1: written now). */
static int restore_write(struct rconn *rc, const struct activity *a, int64_t stock,
                         int64_t debt, int with_reserves, const struct open_epochs *e,
                         const struct open_epochs *parked, int *created, char *err, size_t errlen)
{
    struct rargs args = RARGS_INIT;
    int shard = keys_shard(a->id);
    int ret = CS_ERR;

    /* Not a counter: its field goes with the data, so a count would start
     * at 1 again after a second loss, and a node away for both the loss and
     * the restore would see the number it knew. */
    uint64_t g;
    if (getrandom(&g, sizeof(g), 0) != (ssize_t)sizeof(g))
        g = (uint64_t)cs_now_ms();
    rargs_str(&args, "EVAL");
    rargs_str(&args, script_restore);
    rargs_str(&args, "3");
    rargs_key(&args, keys_stock, shard);
    rargs_key(&args, keys_reserve, shard);
    rargs_akey(&args, keys_reserve_epochs, a->id);
    rargs_int(&args, a->id);
    rargs_int(&args, stock);
    rargs_int(&args, (int64_t)(g >> 1) + 1);
    rargs_str(&args, with_reserves ? "1" : "0");
    rargs_int(&args, with_reserves ? (int64_t)e->n : 0);
    rargs_int(&args, with_reserves ? debt : 0);
    for (int pass = 0; with_reserves && pass < 2; pass++) {
        const struct open_epochs *l = pass == 0 ? e : parked;
        for (size_t i = 0; i < l->n; i++) {
            rargs_str(&args, l->v[i].inc);
            rargs_int(&args, l->v[i].epoch);
            rargs_int(&args, l->v[i].amount);
        }
    }
    char skey[KEYS_MAX];
    keys_stock(skey, shard);
    redisReply *r = rargs_command(rc, skey, &args, NULL);
    if (rconn_expect(rc, r, REDIS_REPLY_INTEGER, "EVAL", skey, err, errlen) == CS_OK) {
        *created = r->integer == 1;
        freeReplyObject(r);
        ret = CS_OK;
    }
    rargs_free(&args);
    return ret;
}

/* Pending HSET of seize-list pairs, flushed every ACT_HSET_CHUNK pairs. */
struct act_hset {
    struct rconn *rc;
    char key[KEYS_MAX];
    const char **argv;
    size_t *argvlen;
    char (*bufs)[2][24];
    int npairs;
    int64_t total;             /* pairs added so far */
    int failed;
    char *err;
    size_t errlen;
};

static void act_hset_init(struct act_hset *h, struct rconn *rc, int64_t id, char *err,
                          size_t errlen)
{
    memset(h, 0, sizeof(*h));
    h->rc = rc;
    keys_seize_list(h->key, id);
    h->argv = xmalloc((2 + 2 * ACT_HSET_CHUNK) * sizeof(*h->argv));
    h->argvlen = xmalloc((2 + 2 * ACT_HSET_CHUNK) * sizeof(*h->argvlen));
    h->bufs = xmalloc(ACT_HSET_CHUNK * sizeof(*h->bufs));
    h->err = err;
    h->errlen = errlen;
}

static void act_hset_flush(struct act_hset *h)
{
    if (h->npairs == 0 || h->failed)
        return;
    h->argv[0] = "HSET";
    h->argvlen[0] = 4;
    h->argv[1] = h->key;
    h->argvlen[1] = strlen(h->key);
    redisReply *r = rconn_commandv(h->rc, h->key, 2 + 2 * h->npairs, h->argv, h->argvlen);
    if (rconn_expect(h->rc, r, 0, "HSET", h->key, h->err, h->errlen) != CS_OK)
        h->failed = 1;
    else
        freeReplyObject(r);
    h->npairs = 0;
}

static void act_hset_add(struct act_hset *h, const char *user, size_t ulen, const char *ms,
                         size_t mslen)
{
    if (h->failed)
        return;
    char *ub = h->bufs[h->npairs][0], *mb = h->bufs[h->npairs][1];
    ulen = ulen < 23 ? ulen : 23;
    mslen = mslen < 23 ? mslen : 23;
    memcpy(ub, user, ulen);
    memcpy(mb, ms, mslen);
    h->argv[2 + 2 * h->npairs] = ub;
    h->argvlen[2 + 2 * h->npairs] = ulen;
    h->argv[3 + 2 * h->npairs] = mb;
    h->argvlen[3 + 2 * h->npairs] = mslen;
    h->total++;
    if (++h->npairs == ACT_HSET_CHUNK)
        act_hset_flush(h);
}

static void act_hset_done(struct act_hset *h)
{
    free(h->argv);
    free(h->argvlen);
    free(h->bufs);
}

/* Row of SQL_COUPON_USERS: one coupon, added to the seize list. */
static int act_coupon_row(void *arg, int ncols, char **cols)
{
    struct act_hset *h = arg;
    if (ncols != 2 || cols[0] == NULL)
        return CS_ERR;
    const char *ms = cols[1] ? cols[1] : "0";
    act_hset_add(h, cols[0], strlen(cols[0]), ms, strlen(ms));
    return CS_OK;
}

/* Adds to h every queued entry of activity a ("<id>:<user>" in its shard's
 * queue) and counts them in *queued. */
static int act_scan_queue(struct rconn *rc, const struct activity *a, struct act_hset *h,
                          int64_t *queued, char *err, size_t errlen)
{
    char qkey[KEYS_MAX], match[32], cursor[24] = "0";
    size_t plen = (size_t)snprintf(match, sizeof(match), "%" PRId64 ":*", a->id) - 1;

    keys_queue(qkey, keys_shard(a->id));
    *queued = 0;
    do {
        redisReply *r = rconn_hscan(rc, qkey, cursor, sizeof(cursor), match, 1000, err, errlen);
        if (r == NULL)
            return CS_ERR;
        redisReply *kv = r->element[1];
        for (size_t i = 0; i + 1 < kv->elements; i += 2) {
            const redisReply *f = kv->element[i], *v = kv->element[i + 1];
            int64_t aid, uid;
            /* A malformed entry never becomes a coupon (coupon-sync dead-letters it). */
            if (keys_parse_queue_field(f->str, f->len, &aid, &uid) != CS_OK || aid != a->id)
                continue;
            act_hset_add(h, f->str + plen, f->len - plen, v->str, v->len);
            (*queued)++;
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
    return h->failed ? CS_ERR : CS_OK;
}

/* Whether activity a's stock field is in Redis: CS_OK with *exists, or
 * CS_ERR with err. */
static int restore_stock_exists(struct rconn *rc, const struct activity *a, int *exists,
                                char *err, size_t errlen)
{
    char skey[KEYS_MAX], field[24];

    keys_stock(skey, keys_shard(a->id));
    snprintf(field, sizeof(field), "%" PRId64, a->id);
    redisReply *r = rconn_command(rc, skey, "HEXISTS %s %s", skey, field);
    if (rconn_expect(rc, r, REDIS_REPLY_INTEGER, "HEXISTS", skey, err, errlen) != CS_OK)
        return CS_ERR;
    *exists = r->integer == 1;
    freeReplyObject(r);
    return CS_OK;
}

/*
 * Rebuilds activity a's seize list from its queue and MySQL, complete
 * before the stock field lets anyone seize: CS_OK with the coupons MySQL
 * holds in *in_mysql and the entries still queued in *queued.
 *
 * The queue is read BEFORE MySQL. With the stock field absent no seize can
 * add entries, but coupon-sync may move one from the queue into MySQL
 * between the two reads. In this order such an entry is counted twice (the
 * stock comes out one low: undersell); the other order would miss it (one
 * coupon too many: oversell). Undersell is the safe side.
 */
static int restore_seize_list(struct mconn *mc, struct rconn *rc, const struct activity *a,
                              int64_t *in_mysql, int64_t *queued, char *err, size_t errlen)
{
    struct act_hset h;
    int ret = CS_ERR;

    act_hset_init(&h, rc, a->id, err, errlen);
    if (act_scan_queue(rc, a, &h, queued, err, errlen) != CS_OK)
        goto out;
    struct mval p[] = {MV_INT(a->id)};
    if (mconn_query(mc, SQL_COUPON_USERS, p, 1, act_coupon_row, &h) != CS_OK) {
        snprintf(err, errlen, "selecting coupons of activity %" PRId64 ": %s", a->id,
                 mc->errstr);
        goto out;
    }
    *in_mysql = h.total - *queued;
    act_hset_flush(&h);
    if (!h.failed)
        ret = CS_OK;
out:
    act_hset_done(&h);
    return ret;
}

/* The reserves nodes hold of activity a, from MySQL: the open epochs in *eps
 * and those an operator's return kept out of stock in *parked (the caller
 * frees both .v, also on CS_ERR). */
static int restore_epochs(struct mconn *mc, const struct activity *a, struct open_epochs *eps,
                          struct open_epochs *parked, char *err, size_t errlen)
{
    struct mval p[] = {MV_INT(a->id)};
    if (mconn_query(mc, SQL_OPEN_EPOCHS, p, 1, open_epoch_row, eps) != CS_OK) {
        snprintf(err, errlen, "selecting reserve epochs of activity %" PRId64 ": %s", a->id,
                 mc->errstr);
        return CS_ERR;
    }
    if (mconn_query(mc, SQL_PARKED_EPOCHS, p, 1, open_epoch_row, parked) != CS_OK) {
        snprintf(err, errlen, "selecting returned reserve epochs of activity %" PRId64 ": %s",
                 a->id, mc->errstr);
        return CS_ERR;
    }
    return CS_OK;
}

/* Logs what a restore of activity a counted. */
static void restore_log(const struct activity *a, int64_t stock, int64_t debt, int64_t in_mysql,
                        int64_t queued, const struct open_epochs *eps,
                        const struct open_epochs *parked)
{
    char extra[192] = "";
    int off = 0;
    if (parked->n > 0)
        off = snprintf(extra, sizeof(extra), ", %" PRId64 " kept out by %zu returns "
                       "awaiting their node's replay", parked->sum, parked->n);
    if (debt > 0 && off >= 0 && (size_t)off < sizeof(extra))
        snprintf(extra + off, sizeof(extra) - (size_t)off, "; %" PRId64 " counted twice, "
                 "paid from what the reserves give back", debt);
    log_notice("activity %" PRId64 ": stock restored to %" PRId64 " (total %" PRId64
               ", %" PRId64 " coupons in MySQL, %" PRId64 " queued, %" PRId64
               " in %zu open node reserves%s)",
               a->id, stock, a->total_num, in_mysql, queued, eps->sum, eps->n, extra);
}

int restore_stock(struct mconn *mc, struct rconn *rc, const struct activity *a, int *created,
                  int *restored, char *err, size_t errlen)
{
    struct open_epochs eps = {0}, parked = {0};
    int64_t in_mysql = 0, queued = 0;
    int exists, ret = CS_ERR;

    *created = *restored = 0;
    if (restore_stock_exists(rc, a, &exists, err, errlen) != CS_OK)
        return CS_ERR;
    if (exists)
        return CS_OK; /* a live sale is never reset */
    if (restore_seize_list(mc, rc, a, &in_mysql, &queued, err, errlen) != CS_OK)
        return CS_ERR;
    /* So are the reserves nodes hold: their coupons are not in the stock. */
    if (restore_epochs(mc, a, &eps, &parked, err, errlen) != CS_OK)
        goto out;
    /* Below 0 when tokens replayed before the loss are counted twice (as
     * coupons and in their epoch): the stock is 0 and the rest a debt that
     * what the reserves give back pays first (lua/restore.lua). */
    int64_t stock = a->total_num - in_mysql - queued - eps.sum - parked.sum, debt = 0;
    if (stock < 0) {
        debt = -stock;
        stock = 0;
    }
    if (restore_write(rc, a, stock, debt, in_mysql + queued > 0 || eps.n > 0 || parked.n > 0,
                      &eps, &parked, created, err, errlen) != CS_OK)
        goto out;
    if (*created && in_mysql + queued + eps.sum + parked.sum > 0) {
        *restored = 1;
        restore_log(a, stock, debt, in_mysql, queued, &eps, &parked);
    }
    ret = CS_OK;
out:
    free(eps.v);
    free(parked.v);
    return ret;
}
