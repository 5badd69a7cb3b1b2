/* jobs_reconcile.c - coupon-sync's reconciliation: stock + queued + coupons = total. */
#include "jobs.h"
#include "cs.h"
#include "drain.h"
#include "keys.h"
#include "log.h"
#include "mconn.h"
#include "preheat.h"
#include "rconn.h"
#include "smetrics.h"

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
     * reserves hold of each (counted with the stock: not sold, not free),
     * less what a restore counted twice (':debt', lua/restore.lua). */
    size_t sent = 0;
    for (size_t i = 0; i < n; i++) {
        struct rec_item *it = &items[i];
        if (keys_shard(it->id) != shard)
            continue;
        it->read = 1;
        it->found = it->has_stock = 0;
        it->total = it->coupons = it->queued = it->stock = it->delta = 0;
        if (rconn_append(rc, skey, "HGET %s %" PRId64, skey, it->id) != CS_OK
            || rconn_append(rc, rkey, "HMGET %s %" PRId64 ":held %" PRId64 ":debt", rkey, it->id,
                            it->id) != CS_OK) {
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
            if (r[1]->type == REDIS_REPLY_ARRAY && r[1]->elements == 2 && it->stock >= 0) {
                for (int j = 0; j < 2; j++)
                    if (r[1]->element[j]->type == REDIS_REPLY_STRING)
                        it->stock += (j ? -1 : 1) * strtoll(r[1]->element[j]->str, NULL, 10);
            }
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
    size_t n, cap;
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
    w->v = cs_grow(w->v, &w->cap, w->n + 1, sizeof(*w->v));
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
        smetrics_add(SM_MISMATCHES, (uint64_t)*mismatches);
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
        rec_warned[i].n = rec_warned[i].cap = 0;
    }
}
