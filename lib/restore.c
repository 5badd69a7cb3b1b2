/* restore.c - an activity's stock field, rebuilt with its seize list from MySQL
 * and the queue when Redis lost its data. */
#include "restore.h"
#include "activity.h"
#include "cs.h"
#include "keys.h"
#include "log.h"
#include "mconn.h"
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

/* Reserve epochs still open: coupons that nodes hold (DESIGN.md rule 10). */
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
    char skey[KEYS_MAX], rkey[KEYS_MAX], ekey[KEYS_MAX], id[24], st[24], gen[24], nopen[24];
    char dbuf[24];
    int shard = keys_shard(a->id);
    size_t n = 12 + 3 * (e->n + parked->n);
    const char **argv = xmalloc(n * sizeof(*argv));
    size_t *argl = xmalloc(n * sizeof(*argl));
    char (*num)[2][24] = xmalloc((e->n + parked->n + 1) * sizeof(*num));
    int ret = CS_ERR;

    keys_stock(skey, shard);
    keys_reserve(rkey, shard);
    keys_reserve_epochs(ekey, a->id);
    snprintf(id, sizeof(id), "%" PRId64, a->id);
    snprintf(st, sizeof(st), "%" PRId64, stock);
    /* Not a counter: its field goes with the data, so a count would start
     * at 1 again after a second loss, and a node away for both the loss and
     * the restore would see the number it knew. */
    uint64_t g;
    if (getrandom(&g, sizeof(g), 0) != (ssize_t)sizeof(g))
        g = (uint64_t)cs_now_ms();
    snprintf(gen, sizeof(gen), "%" PRId64, (int64_t)(g >> 1) + 1);
    size_t c = 0;
    argv[c++] = "EVAL";
    argv[c++] = script_restore;
    argv[c++] = "3";
    argv[c++] = skey;
    argv[c++] = rkey;
    argv[c++] = ekey;
    argv[c++] = id;
    argv[c++] = st;
    argv[c++] = gen;
    argv[c++] = with_reserves ? "1" : "0";
    snprintf(nopen, sizeof(nopen), "%zu", with_reserves ? e->n : 0);
    argv[c++] = nopen;
    snprintf(dbuf, sizeof(dbuf), "%" PRId64, with_reserves ? debt : 0);
    argv[c++] = dbuf;
    size_t k = 0;
    for (int pass = 0; with_reserves && pass < 2; pass++) {
        const struct open_epochs *l = pass == 0 ? e : parked;
        for (size_t i = 0; i < l->n; i++, k++) {
            snprintf(num[k][0], sizeof(num[k][0]), "%" PRId64, l->v[i].epoch);
            snprintf(num[k][1], sizeof(num[k][1]), "%" PRId64, l->v[i].amount);
            argv[c++] = l->v[i].inc;
            argv[c++] = num[k][0];
            argv[c++] = num[k][1];
        }
    }
    for (size_t i = 0; i < c; i++)
        argl[i] = strlen(argv[i]);
    struct rconn_site at;
    redisReply *r = rconn_commandv_at(rc, skey, (int)c, argv, argl, &at);
    if (rconn_expect(rc, r, REDIS_REPLY_INTEGER, "EVAL", skey, err, errlen) == CS_OK) {
        *created = r->integer == 1;
        freeReplyObject(r);
        ret = CS_OK;
    }
    free(num);
    free(argl);
    free(argv);
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

int restore_stock(struct mconn *mc, struct rconn *rc, const struct activity *a, int *created,
                  int *restored, char *err, size_t errlen)
{
    char skey[KEYS_MAX], field[24];
    int ret = CS_ERR;
    struct act_hset h;

    *created = *restored = 0;
    keys_stock(skey, keys_shard(a->id));
    snprintf(field, sizeof(field), "%" PRId64, a->id);

    redisReply *r = rconn_command(rc, skey, "HEXISTS %s %s", skey, field);
    if (rconn_expect(rc, r, REDIS_REPLY_INTEGER, "HEXISTS", skey, err, errlen) != CS_OK)
        return CS_ERR;
    int exists = r->integer == 1;
    freeReplyObject(r);
    if (exists)
        return CS_OK; /* a live sale is never reset */

    /*
     * Read the queue BEFORE MySQL. With the stock field absent no seize can
     * add entries, but coupon-sync may move one from the queue into MySQL
     * between the two reads. In this order such an entry is counted twice
     * (the stock comes out one low: undersell); the other order would miss it
     * (one coupon too many: oversell). Undersell is the safe side.
     */
    int64_t queued = 0;
    act_hset_init(&h, rc, a->id, err, errlen);
    if (act_scan_queue(rc, a, &h, &queued, err, errlen) != CS_OK)
        goto out;
    struct mval p[] = {MV_INT(a->id)};
    if (mconn_query(mc, SQL_COUPON_USERS, p, 1, act_coupon_row, &h) != CS_OK) {
        snprintf(err, errlen, "selecting coupons of activity %" PRId64 ": %s", a->id,
                 mc->errstr);
        goto out;
    }
    int64_t in_mysql = h.total - queued;
    /* The seize list is complete before the stock field lets anyone seize. */
    act_hset_flush(&h);
    if (h.failed)
        goto out;
    /* So are the reserves nodes hold: their coupons are not in the stock. */
    struct open_epochs eps = {0};
    if (mconn_query(mc, SQL_OPEN_EPOCHS, p, 1, open_epoch_row, &eps) != CS_OK) {
        snprintf(err, errlen, "selecting reserve epochs of activity %" PRId64 ": %s", a->id,
                 mc->errstr);
        free(eps.v);
        goto out;
    }
    struct open_epochs parked = {0};
    if (mconn_query(mc, SQL_PARKED_EPOCHS, p, 1, open_epoch_row, &parked) != CS_OK) {
        snprintf(err, errlen, "selecting returned reserve epochs of activity %" PRId64 ": %s",
                 a->id, mc->errstr);
        free(eps.v);
        free(parked.v);
        goto out;
    }
    int64_t reserved = eps.sum;
    size_t nepochs = eps.n;
    /* Below 0 when tokens replayed before the loss are counted twice (as
     * coupons and in their epoch): the stock is 0 and the rest a debt that
     * what the reserves give back pays first (lua/restore.lua). */
    int64_t stock = a->total_num - in_mysql - queued - reserved - parked.sum, debt = 0;
    if (stock < 0) {
        debt = -stock;
        stock = 0;
    }
    int rc2 = restore_write(rc, a, stock, debt,
                            in_mysql + queued > 0 || eps.n > 0 || parked.n > 0, &eps, &parked,
                            created, err, errlen);
    free(eps.v);
    free(parked.v);
    if (rc2 != CS_OK)
        goto out;
    if (*created && in_mysql + queued + reserved + parked.sum > 0) {
        char extra[192] = "";
        int off = 0;
        if (parked.n > 0)
            off = snprintf(extra, sizeof(extra), ", %" PRId64 " kept out by %zu returns "
                           "awaiting their node's replay", parked.sum, parked.n);
        if (debt > 0 && off >= 0 && (size_t)off < sizeof(extra))
            snprintf(extra + off, sizeof(extra) - (size_t)off, "; %" PRId64 " counted twice, "
                     "paid from what the reserves give back", debt);
        *restored = 1;
        log_notice("activity %" PRId64 ": stock restored to %" PRId64 " (total %" PRId64
                   ", %" PRId64 " coupons in MySQL, %" PRId64 " queued, %" PRId64
                   " in %zu open node reserves%s)",
                   a->id, stock, a->total_num, in_mysql, queued, reserved, nepochs, extra);
    }
    ret = CS_OK;
out:
    act_hset_done(&h);
    return ret;
}

