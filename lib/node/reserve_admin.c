/* reserve_admin.c - node reserves as an operator sees and returns them. */
#include "reserve_admin.h"
#include "cs.h"
#include "keys.h"
#include "log.h"
#include "mconn.h"
#include "rargs.h"
#include "rconn.h"
#include "reserve.h"
#include "scripts.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char SQL_OPEN_ONE[] =
    "SELECT activity_id, incarnation, epoch, amount FROM reserve_epoch "
    "WHERE activity_id = ? AND state = 1 ORDER BY incarnation, epoch LIMIT ?";
static const char SQL_OPEN_ALL[] =
    "SELECT activity_id, incarnation, epoch, amount FROM reserve_epoch "
    "WHERE state = 1 ORDER BY activity_id, incarnation, epoch LIMIT ?";
static const char SQL_OPEN_OF[] =
    "SELECT activity_id, incarnation, epoch, amount FROM reserve_epoch "
    "WHERE activity_id = ? AND incarnation = ? AND state = 1 ORDER BY epoch LIMIT ?";
static const char SQL_CLOSED_BY_ADMIN[] =
    "SELECT epoch FROM reserve_epoch WHERE activity_id = ? AND incarnation = ? AND state = 2 "
    "AND closed_by = 'admin' ORDER BY epoch LIMIT ?";
static const char SQL_CLOSE[] =
    "UPDATE reserve_epoch SET state = 2, closed_by = 'admin', returned = ?, parked = ?, "
    "closed_at = NOW(3) WHERE activity_id = ? AND incarnation = ? AND epoch = ? AND state = 1";
/* What a return kept out of stock is released: a restore no longer keeps
 * it out (sql/007_reserve_parked.sql). */
static const char SQL_RELEASED[] =
    "UPDATE reserve_epoch SET released_at = NOW(3) WHERE activity_id = ? AND incarnation = ? "
    "AND epoch = ? AND closed_by = 'admin' AND released_at IS NULL";

/* One worker serves one request at a time: the script's SHA is loaded once
 * per process (rconn loads it on first use and on NOSCRIPT). */
static struct rscript ra_give, ra_release;

static const struct rscript *ra_give_script(void)
{
    if (ra_give.src == NULL)
        rscript_from_text(&ra_give, script_reserve_give_back);
    return &ra_give;
}

static const struct rscript *ra_release_script(void)
{
    if (ra_release.src == NULL)
        rscript_from_text(&ra_release, script_reserve_release);
    return &ra_release;
}

void reserve_admin_list_free(struct reserve_list *l)
{
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

int reserve_admin_incarnation_ok(const char *s, size_t len)
{
    if (s == NULL || len != JOURNAL_ID_LEN)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

struct ra_rows {
    struct reserve_list *l;
    size_t cap, max;
};

static int ra_row(void *arg, int ncols, char **cols)
{
    struct ra_rows *rr = arg;
    struct reserve_list *l = rr->l;

    if (ncols < 4 || cols[0] == NULL || cols[1] == NULL || cols[2] == NULL || cols[3] == NULL
        || !reserve_admin_incarnation_ok(cols[1], strlen(cols[1])))
        return CS_OK;
    if (l->n == rr->max) {
        l->truncated = 1;
        return CS_OK;
    }
    l->v = cs_grow(l->v, &rr->cap, l->n + 1, sizeof(*l->v));
    struct reserve_view *v = &l->v[l->n++];
    memset(v, 0, sizeof(*v));
    v->activity_id = strtoll(cols[0], NULL, 10);
    memcpy(v->incarnation, cols[1], JOURNAL_ID_LEN);
    v->incarnation[JOURNAL_ID_LEN] = '\0';
    v->epoch = strtoll(cols[2], NULL, 10);
    v->amount = strtoll(cols[3], NULL, 10);
    v->left = -1;
    v->lease_age_ms = -1;
    v->lease_expired = 0;
    v->stamp = -1;
    v->watched_ms = -1;
    return CS_OK;
}

/* Appends what Redis says of view v: its reserve field, its node's last
 * renewal and the lease it published with it, and the shard master's clock
 * (TIME on the same master as the lease, routed by the reserve key). Four
 * commands. */
static int ra_append_view(struct rconn *rc, const struct reserve_view *v)
{
    char rkey[KEYS_MAX];
    keys_reserve(rkey, keys_shard(v->activity_id));
    if (rconn_append(rc, rkey, "HGET %s %" PRId64 ":%s", rkey, v->activity_id, v->incarnation)
            != CS_OK
        || rconn_append(rc, rkey, "HGET %s lease:%s", rkey, v->incarnation) != CS_OK
        || rconn_append(rc, rkey, "HGET %s lease:%s:ms", rkey, v->incarnation) != CS_OK
        || rconn_append(rc, rkey, "TIME") != CS_OK)
        return CS_ERR;
    return CS_OK;
}

/* Reads the four replies of ra_append_view() into v, and what watch (NULL:
 * none) has seen of its stamp. */
static int ra_read_view(struct rconn *rc, struct reserve_view *v, int lease_ms,
                        struct lease_watch *watch)
{
    redisReply *r[4] = {NULL, NULL, NULL, NULL};
    int ret = CS_OK;
    for (int i = 0; i < 4; i++)
        if (rconn_get_reply(rc, &r[i]) != CS_OK) {
            ret = CS_ERR;
            goto out;
        }
    /* Taken after the answer came: never before the renewal it shows. */
    int64_t seen_at = cs_boot_ms();
    v->left = rconn_reply_int(r[0], -1);
    int64_t last = rconn_reply_int(r[1], -1), now = rconn_time_ms(r[3]);
    /* The node spends by its own lease, which may be longer than ours. */
    int64_t theirs = rconn_reply_int(r[2], 0);
    if (now < 0) {
        ret = CS_ERR;
        goto out;
    }
    v->stamp = last;
    v->watched_ms = -1;
    if (watch != NULL) {
        /* Redis' clock is a wall clock, of whichever host is master now:
         * the lease must also have run out by this node's. The watch keeps
         * the longest lease the node published (lost with a stamp, its
         * field must not make ours count). */
        v->watched_ms = lease_watch_seen(watch, v->incarnation, keys_shard(v->activity_id),
                                         last, theirs, seen_at, &theirs);
    }
    v->lease_ms = theirs > lease_ms ? theirs : lease_ms;
    v->lease_age_ms = last >= 0 ? now - last : -1;
    /* As script_reserve_give_back judges it: no renewal at all counts as long ago. */
    v->lease_expired = last < 0 || now - last > v->lease_ms;
    v->wait_ms = v->lease_expired ? 0 : v->lease_ms - v->lease_age_ms + 1;
    if (watch != NULL) {
        int64_t need = v->lease_ms + RESERVE_WATCH_MARGIN_MS + 1 - v->watched_ms;
        if (need > 0) {
            v->lease_expired = 0;
            if (need > v->wait_ms)
                v->wait_ms = need;
        }
    }
out:
    for (int i = 0; i < 4; i++)
        if (r[i] != NULL)
            freeReplyObject(r[i]);
    return ret;
}

/* Fills left and the lease of every view, one pipeline; CS_ERR when Redis
 * failed (views left unknown). */
static int ra_redis_views(struct rconn *rc, struct reserve_list *l, int lease_ms,
                          struct lease_watch *watch)
{
    for (size_t i = 0; i < l->n; i++)
        if (ra_append_view(rc, &l->v[i]) != CS_OK)
            return CS_ERR;
    for (size_t i = 0; i < l->n; i++)
        if (ra_read_view(rc, &l->v[i], lease_ms, watch) != CS_OK) {
            /* A failed read dropped the connection: nothing more to read. */
            for (size_t j = 0; j < l->n; j++) {
                l->v[j].left = -1;
                l->v[j].lease_age_ms = -1;
                l->v[j].lease_expired = 0;
            }
            return CS_ERR;
        }
    return CS_OK;
}

static int ra_held(struct rconn *rc, int64_t id, int64_t *held)
{
    char rkey[KEYS_MAX], field[32];
    keys_reserve(rkey, keys_shard(id));
    snprintf(field, sizeof(field), "%" PRId64 ":held", id);
    return rconn_hget_int(rc, rkey, field, 0, held);
}

int reserve_admin_list(struct mconn *mc, struct rconn *rc, int64_t id, int lease_ms,
                       struct lease_watch *watch, struct reserve_list *out, char *err,
                       size_t errlen)
{
    struct ra_rows rr = {.l = out, .cap = 0, .max = RESERVE_ADMIN_LIST_MAX};

    memset(out, 0, sizeof(*out));
    out->held = -1;
    /* One more than shown: whether the list was cut. */
    struct mval one[] = {MV_INT(id), MV_INT(RESERVE_ADMIN_LIST_MAX + 1)};
    struct mval all[] = {MV_INT(RESERVE_ADMIN_LIST_MAX + 1)};
    int rc_my = id > 0 ? mconn_query(mc, SQL_OPEN_ONE, one, 2, ra_row, &rr)
                       : mconn_query(mc, SQL_OPEN_ALL, all, 1, ra_row, &rr);
    if (rc_my != CS_OK) {
        snprintf(err, errlen, "reading open reserve epochs from MySQL: %s", mc->errstr);
        reserve_admin_list_free(out);
        return CS_ERR;
    }
    out->redis_ok = ra_redis_views(rc, out, lease_ms, watch) == CS_OK;
    if (out->redis_ok && id > 0 && ra_held(rc, id, &out->held) != CS_OK) {
        out->held = -1;
        out->redis_ok = 0;
    }
    if (!out->redis_ok)
        log_warn("reserve list: Redis could not be read: %s", rc->errstr);
    return CS_OK;
}

/* ---- returning a lost node's reserve ------------------------------------------------ */

/* The epoch's state in Redis ("open:<n>", "closed"; "" when absent) into st. */
static int ra_epoch_state(struct rconn *rc, int64_t id, const char *inc, int64_t epoch, char *st,
                          size_t stlen)
{
    char ekey[KEYS_MAX];
    keys_reserve_epochs(ekey, id);
    redisReply *r = rconn_command(rc, ekey, "HGET %s %s:%" PRId64, ekey, inc, epoch);
    if (r == NULL || (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_NIL)) {
        if (r != NULL)
            freeReplyObject(r);
        return CS_ERR;
    }
    snprintf(st, stlen, "%s", r->type == REDIS_REPLY_STRING ? r->str : "");
    freeReplyObject(r);
    return CS_OK;
}

/* The durability rule for what ran at site (fence: it wrote nothing, so a
 * write of the fence key goes first and the WAIT covers what was there). */
static int ra_durable(struct rconn *rc, const struct reserve_admin_opts *o, int shard,
                      const struct rconn_site *site, int fence)
{
    char fkey[KEYS_MAX];
    if (o->wait_replicas <= 0)
        return CS_OK;
    keys_fence(fkey, shard);
    int copies = rconn_copies(rc, site, o->wait_replicas);
    return rconn_wait_at(rc, site, fence ? fkey : NULL, copies, o->wait_timeout_ms);
}

/* Closes the epoch in MySQL: returned (what went back to stock) and parked
 * (what the return kept out for the node's replay), each -1 for unknown. */
static int ra_close_mysql(struct mconn *mc, int64_t id, const char *inc, int64_t epoch,
                          int64_t returned, int64_t parked, char *err, size_t errlen)
{
    struct mval p[] = {returned >= 0 ? MV_INT(returned) : (struct mval){.t = MV_NULL},
                       parked >= 0 ? MV_INT(parked) : (struct mval){.t = MV_NULL},
                       MV_INT(id), MV_TXT(inc, JOURNAL_ID_LEN), MV_INT(epoch)};
    if (mconn_exec(mc, SQL_CLOSE, p, 5, NULL) != CS_OK) {
        snprintf(err, errlen, "closing epoch %" PRId64 " in MySQL: %s", epoch, mc->errstr);
        return CS_ERR;
    }
    return CS_OK;
}

/*
 * The give-back script said the epoch is not open in Redis (-1). Its node
 * may be giving it back itself right now (script done, MySQL not yet): only
 * once its lease is over is that ruled out. Then "closed" is a return whose
 * MySQL step failed (or a refused set-aside whose node died before closing
 * it): closed in MySQL now, with what went back unknown (NULL).
 */
static int ra_not_open(struct mconn *mc, struct rconn *rc, const struct reserve_admin_opts *o,
                       const struct reserve_view *v, struct reserve_return *res, char *err,
                       size_t errlen)
{
    char st[64];
    struct reserve_view lv = *v;

    if (ra_append_view(rc, &lv) != CS_OK || ra_read_view(rc, &lv, o->lease_ms, o->watch) != CS_OK
        || ra_epoch_state(rc, v->activity_id, v->incarnation, v->epoch, st, sizeof(st))
               != CS_OK) {
        snprintf(err, errlen, "reading reserve epoch %" PRId64 " from Redis: %s", v->epoch,
                 rc->errstr);
        return CS_ERR;
    }
    res->lease_age_ms = lv.lease_age_ms;
    res->lease_ms = lv.lease_ms;
    if (!lv.lease_expired) {
        res->outcome = RRET_LEASE_NOT_EXPIRED;
        res->wait_ms = lv.wait_ms;
        return CS_OK;
    }
    if (st[0] == '\0') {
        res->outcome = RRET_NOT_IN_REDIS;
        return CS_OK;
    }
    if (strcmp(st, "closed") != 0) {
        snprintf(err, errlen, "reserve epoch %" PRId64 " is \"%s\" in Redis but the give-back "
                 "found it not open", v->epoch, st);
        return CS_ERR;
    }
    struct rconn_site at = {0, -1};
    char ekey[KEYS_MAX];
    keys_reserve_epochs(ekey, v->activity_id);
    /* What was read must outlive a failover before MySQL says so: a fence
     * write and WAIT on the master that answered. */
    if (o->wait_replicas > 0) {
        redisReply *r = rconn_commandv_at(rc, ekey, 2, (const char *[]){"EXISTS", ekey},
                                          (const size_t[]){6, strlen(ekey)}, &at);
        if (r == NULL || ra_durable(rc, o, keys_shard(v->activity_id), &at, 1) != CS_OK) {
            if (r != NULL)
                freeReplyObject(r);
            snprintf(err, errlen, "reserve epoch %" PRId64 ": not confirmed by replicas: %s",
                     v->epoch, rc->errstr);
            return CS_ERR;
        }
        freeReplyObject(r);
    }
    /* What the return's Redis half kept out, for a restore to keep out. */
    long long parked = -1;
    redisReply *pr = rconn_command(rc, ekey, "HGET %s %s:%" PRId64 ":parked", ekey,
                                   v->incarnation, v->epoch);
    if (pr != NULL && pr->type == REDIS_REPLY_STRING)
        parked = strtoll(pr->str, NULL, 10);
    else if (pr != NULL && pr->type == REDIS_REPLY_NIL)
        parked = 0;
    if (pr != NULL)
        freeReplyObject(pr);
    if (parked < 0) {
        snprintf(err, errlen, "reading what epoch %" PRId64 " kept out of stock from Redis: %s",
                 v->epoch, rc->errstr);
        return CS_ERR;
    }
    if (ra_close_mysql(mc, v->activity_id, v->incarnation, v->epoch, -1, parked, err, errlen)
        != CS_OK)
        return CS_ERR;
    res->epochs++;
    res->amount += v->amount;
    if (res->outcome != RRET_RETURNED)
        res->outcome = RRET_CLOSED;
    return CS_OK;
}

struct ra_epochs {
    int64_t v[RESERVE_ADMIN_LIST_MAX];
    size_t n;
};

static int ra_epoch_row(void *arg, int ncols, char **cols)
{
    struct ra_epochs *e = arg;
    if (ncols >= 1 && cols[0] != NULL && e->n < RESERVE_ADMIN_LIST_MAX)
        e->v[e->n++] = strtoll(cols[0], NULL, 10);
    return CS_OK;
}

/* The journal of (id, inc) declared lost: what earlier returns of its
 * epochs kept out of stock goes back (script_reserve_release), into res. */
static int ra_release_lost(struct mconn *mc, struct rconn *rc, const struct reserve_admin_opts *o,
                           int64_t id, const char *inc, struct reserve_return *res, char *err,
                           size_t errlen)
{
    struct ra_epochs e = {.n = 0};
    struct mval p[] = {MV_INT(id), MV_TXT(inc, JOURNAL_ID_LEN), MV_INT(RESERVE_ADMIN_LIST_MAX)};
    if (mconn_query(mc, SQL_CLOSED_BY_ADMIN, p, 3, ra_epoch_row, &e) != CS_OK) {
        snprintf(err, errlen, "reading closed reserve epochs from MySQL: %s", mc->errstr);
        return CS_ERR;
    }
    int shard = keys_shard(id);
    for (size_t i = 0; i < e.n; i++) {
        /* MySQL first: once the journal is declared lost nothing waits for
         * those tokens, and a restore between the two steps must not keep
         * them out again. */
        struct mval rp[] = {MV_INT(id), MV_TXT(inc, JOURNAL_ID_LEN), MV_INT(e.v[i])};
        if (mconn_exec(mc, SQL_RELEASED, rp, 3, NULL) != CS_OK) {
            snprintf(err, errlen, "marking epoch %" PRId64 " released in MySQL: %s", e.v[i],
                     mc->errstr);
            return CS_ERR;
        }
        struct rargs a = RARGS_INIT;
        reserve_script_epoch(&a, id, inc, e.v[i]);
        struct rconn_site at = {0, -1};
        redisReply *r = rargs_evalsha(rc, ra_release_script(), 3, &a, &at);
        rargs_free(&a);
        if (r == NULL || r->type != REDIS_REPLY_INTEGER || r->integer == SCRIPT_RELEASE_NO_STOCK) {
            snprintf(err, errlen, "releasing epoch %" PRId64 " in Redis: %s", e.v[i],
                     r == NULL ? rc->errstr
                     : r->type == REDIS_REPLY_ERROR ? r->str : "the sale has no stock field");
            if (r != NULL)
                freeReplyObject(r);
            return CS_ERR;
        }
        long long back = r->integer;
        freeReplyObject(r);
        if (back > 0 && ra_durable(rc, o, shard, &at, 0) != CS_OK) {
            snprintf(err, errlen, "epoch %" PRId64 ": %lld coupons released in Redis but not "
                     "confirmed by replicas: %s", e.v[i], back, rc->errstr);
            return CS_ERR;
        }
        res->returned += back;
        res->lost += back;
        if (back > 0)
            res->outcome = RRET_RETURNED;
    }
    return CS_OK;
}

/* What the lease of v says when it has not run out: how old it is, how
 * long it lasts and how long to wait (at least min_wait_ms when that is
 * not 0), unless an earlier epoch was returned already. */
static void ra_not_expired(struct reserve_return *res, const struct reserve_view *v,
                           int64_t min_wait_ms)
{
    res->lease_age_ms = v->lease_age_ms;
    res->lease_ms = v->lease_ms;
    res->wait_ms = min_wait_ms > 0 && v->wait_ms <= 0 ? min_wait_ms : v->wait_ms;
    if (res->outcome != RRET_RETURNED)
        res->outcome = RRET_LEASE_NOT_EXPIRED;
}

/* Runs the give-back script for epoch v of (id, inc) as an operator's
 * return: CS_OK with what went back in *back (or a SCRIPT_GIVE_* below 0)
 * and what was kept out of stock in *parked, and the node that ran it in
 * *at; CS_ERR with err when Redis did not answer so. */
static int ra_give_back(struct rconn *rc, const struct reserve_admin_opts *o, int64_t id,
                        const char *inc, const struct reserve_view *v, long long *back,
                        long long *parked, struct rconn_site *at, char *err, size_t errlen)
{
    struct rargs a = RARGS_INIT;

    /* KEYS stock, reserve, epochs; ARGV activity, incarnation, epoch, the
     * lease that must have passed (the one judged by: the script takes the
     * longer of it and the field, which may have been lost with the stamp),
     * not at the low-water mark, whether the journal is declared lost, the
     * stamp read before. */
    reserve_script_epoch(&a, id, inc, v->epoch);
    rargs_int(&a, v->lease_ms > 0 ? v->lease_ms : 1);
    rargs_str(&a, "0");
    rargs_str(&a, o->journal_lost ? "1" : "0");
    rargs_int(&a, v->stamp);
    redisReply *r = rargs_evalsha(rc, ra_give_script(), 3, &a, at);
    rargs_free(&a);
    *parked = 0;
    if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2
        && r->element[0]->type == REDIS_REPLY_INTEGER
        && r->element[1]->type == REDIS_REPLY_INTEGER) {
        /* {0, parked}: closed, what the node may have granted kept out. */
        *back = r->element[0]->integer;
        *parked = r->element[1]->integer;
        freeReplyObject(r);
        return CS_OK;
    }
    if (r == NULL || r->type != REDIS_REPLY_INTEGER) {
        snprintf(err, errlen, "giving back epoch %" PRId64 " in Redis: %s", v->epoch,
                 r != NULL && r->type == REDIS_REPLY_ERROR ? r->str : rc->errstr);
        if (r != NULL)
            freeReplyObject(r);
        return CS_ERR;
    }
    *back = r->integer;
    freeReplyObject(r);
    return CS_OK;
}

/* One epoch's step of reserve_admin_return(): go on with the next epoch,
 * stop there (res says why), or stop on an error (in err). */
enum ra_step { RA_NEXT, RA_DONE, RA_FAILED };

static enum ra_step ra_return_epoch(struct mconn *mc, struct rconn *rc,
                                    const struct reserve_admin_opts *o, int64_t id,
                                    const char *inc, struct reserve_view *v,
                                    struct reserve_return *res, char *err, size_t errlen)
{
    struct rconn_site at = {0, -1};
    long long back, parked;

    /* The lease by Redis' clock and by this node's, first: the stamp read
     * here is the one the script must still find. */
    if (ra_append_view(rc, v) != CS_OK || ra_read_view(rc, v, o->lease_ms, o->watch) != CS_OK) {
        snprintf(err, errlen, "reading the lease of epoch %" PRId64 " from Redis: %s",
                 v->epoch, rc->errstr);
        return RA_FAILED;
    }
    if (!v->lease_expired) {
        ra_not_expired(res, v, 0);
        return RA_DONE;
    }
    if (ra_give_back(rc, o, id, inc, v, &back, &parked, &at, err, errlen) != CS_OK)
        return RA_FAILED;
    if (back == SCRIPT_GIVE_TOO_SOON) {
        /* The node renewed within the lease: it may still be spending. */
        struct reserve_view lv = *v;
        if (ra_append_view(rc, &lv) == CS_OK
            && ra_read_view(rc, &lv, o->lease_ms, o->watch) == CS_OK)
            ra_not_expired(res, &lv, 1000);
        else if (res->outcome != RRET_RETURNED)
            res->outcome = RRET_LEASE_NOT_EXPIRED;
        return RA_DONE;
    }
    if (back == SCRIPT_GIVE_NO_STOCK) {
        /* The sale's stock field is missing (Redis lost it, a restore is
         * under way): what went back would be lost. Nothing written. */
        if (res->outcome != RRET_RETURNED)
            res->outcome = RRET_NOT_IN_REDIS;
        return RA_DONE;
    }
    if (back == SCRIPT_GIVE_NOT_OPEN)
        return ra_not_open(mc, rc, o, v, res, err, errlen) == CS_OK ? RA_NEXT : RA_FAILED;
    if (ra_durable(rc, o, keys_shard(id), &at, 0) != CS_OK) {
        snprintf(err, errlen, "epoch %" PRId64 " was given back in Redis (%lld coupons) but "
                 "not confirmed by replicas: %s; a repeat closes it", v->epoch, back,
                 rc->errstr);
        return RA_FAILED;
    }
    if (ra_close_mysql(mc, id, inc, v->epoch, back, parked, err, errlen) != CS_OK) {
        log_error("reserve return: activity %" PRId64 " incarnation %s epoch %" PRId64
                  ": %lld coupons went back to stock in Redis, but MySQL still has the "
                  "epoch open: %s", id, inc, v->epoch, back, err);
        return RA_FAILED;
    }
    res->outcome = RRET_RETURNED;
    res->epochs++;
    res->returned += back;
    res->parked += parked;
    if (o->journal_lost)
        res->lost += back;
    res->amount += v->amount;
    return RA_NEXT;
}

int reserve_admin_return(struct mconn *mc, struct rconn *rc, const struct reserve_admin_opts *o,
                         int64_t id, const char *inc, struct reserve_return *res, char *err,
                         size_t errlen)
{
    struct reserve_list l;
    struct ra_rows rr = {.l = &l, .cap = 0, .max = RESERVE_ADMIN_LIST_MAX};

    memset(res, 0, sizeof(*res));
    memset(&l, 0, sizeof(l));
    res->outcome = RRET_NONE_OPEN;
    res->lease_age_ms = -1;
    res->lease_ms = o->lease_ms;
    struct mval p[] = {MV_INT(id), MV_TXT(inc, JOURNAL_ID_LEN), MV_INT(RESERVE_ADMIN_LIST_MAX)};
    if (mconn_query(mc, SQL_OPEN_OF, p, 3, ra_row, &rr) != CS_OK) {
        snprintf(err, errlen, "reading open reserve epochs from MySQL: %s", mc->errstr);
        return CS_ERR;
    }
    enum ra_step step = RA_NEXT;
    for (size_t i = 0; i < l.n && step == RA_NEXT; i++)
        step = ra_return_epoch(mc, rc, o, id, inc, &l.v[i], res, err, errlen);
    reserve_admin_list_free(&l);
    if (step == RA_FAILED)
        return CS_ERR;
    if (o->journal_lost && res->outcome != RRET_LEASE_NOT_EXPIRED
        && res->outcome != RRET_NOT_IN_REDIS)
        return ra_release_lost(mc, rc, o, id, inc, res, err, errlen);
    return CS_OK;
}
