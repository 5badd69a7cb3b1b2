/* preheat.c - activities from MySQL into Redis: one MySQL pass, pipelined
 * writes per shard, then ACTIVITY:LIST (actlist.c). */
#include "preheat.h"
#include "activity.h"
#include "actlist.h"
#include "cs.h"
#include "keys.h"
#include "log.h"
#include "mconn.h"
#include "rconn.h"
#include "preheat_int.h"
#include "restore.h"
#include "revoke.h"
#include "scripts.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Activities that ended within the grace stay listed, so a late seize gets a
 * clear ENDED rather than NO_SUCH_ACTIVITY. Column 10 says whether MySQL
 * holds any coupon of it, or a node reserve that still keeps stock out (open,
 * or returned by an admin and not yet released): index probes, not counts.
 * Without either, an absent stock field is a new sale's (total_num); with
 * one, it is restored (restore.c). */
#define SQL_PREHEAT_COLS \
    "SELECT id, name, coupon_name, coupon_amount, coupon_threshold, total_num, " \
    "UNIX_TIMESTAMP(distribute_start_time)*1000, UNIX_TIMESTAMP(distribute_end_time)*1000, " \
    "validity_days, status, " \
    "EXISTS (SELECT 1 FROM coupon c WHERE c.activity_id = activity.id) " \
    "OR EXISTS (SELECT 1 FROM reserve_epoch r WHERE r.activity_id = activity.id " \
    "AND (r.state = 1 OR (r.parked > 0 AND r.released_at IS NULL))), " \
    "CAST(UNIX_TIMESTAMP(updated_at) * 1000000 AS SIGNED), " \
    "return_on_expiry, COALESCE(eligible_groups, '') FROM activity "
#define SQL_PREHEAT_SERVED \
    "status <> 4 AND distribute_end_time > NOW() - INTERVAL ? SECOND " \
    "AND distribute_start_time < NOW() + INTERVAL ? DAY "
static const char SQL_PREHEAT[] = SQL_PREHEAT_COLS "WHERE " SQL_PREHEAT_SERVED
    "ORDER BY distribute_start_time, id";
/* The periodic pass between full ones: rows changed since a time (by
 * idx_activity_updated) and rows whose start entered the horizon since then
 * (by idx_activity_start); each half reads only what its index finds. A row
 * in both comes twice (no temporary table to remove it): writing it twice is
 * harmless. */
static const char SQL_PREHEAT_CHANGED[] =
    "(" SQL_PREHEAT_COLS "WHERE updated_at >= FROM_UNIXTIME(?) AND " SQL_PREHEAT_SERVED ") UNION ALL "
    "(" SQL_PREHEAT_COLS "WHERE distribute_start_time >= FROM_UNIXTIME(?) + INTERVAL ? DAY AND "
    SQL_PREHEAT_SERVED ")";
/* MySQL's own clock: the marks of the periodic pass are compared with
 * updated_at, which MySQL writes, so no other clock may enter. */
static const char SQL_NOW[] = "SELECT UNIX_TIMESTAMP()";
static const char SQL_PREHEAT_ONE[] = SQL_PREHEAT_COLS
    "WHERE id = ? AND status <> 4 AND distribute_end_time > NOW() - INTERVAL ? SECOND "
    "AND distribute_start_time < NOW() + INTERVAL ? DAY";

/* ---- reading activities from MySQL --------------------------------------- */

void preheat_vec_free(struct preheat_vec *vec)
{
    for (size_t i = 0; i < vec->n; i++)
        cJSON_free(vec->txt[i]);
    free(vec->txt);
    free(vec->win);
    free(vec->ver);
    free(vec->v);
    free(vec->has_coupons);
    memset(vec, 0, sizeof(*vec));
}

static int64_t act_atoll(const char *s)
{
    return s ? strtoll(s, NULL, 10) : 0;
}

/* Row of SQL_PREHEAT / SQL_PREHEAT_ONE. */
static int act_row(void *arg, int ncols, char **cols)
{
    struct preheat_vec *vec = arg;
    if (ncols != 14)
        return CS_ERR;
    if (vec->n == vec->cap) {
        vec->cap = vec->cap ? vec->cap * 2 : 16;
        vec->v = xrealloc(vec->v, vec->cap * sizeof(*vec->v));
        vec->has_coupons = xrealloc(vec->has_coupons, vec->cap);
        vec->txt = xrealloc(vec->txt, vec->cap * sizeof(*vec->txt));
        vec->win = xrealloc(vec->win, vec->cap * sizeof(*vec->win));
        vec->ver = xrealloc(vec->ver, vec->cap * sizeof(*vec->ver));
    }
    vec->ver[vec->n] = act_atoll(cols[11]);
    vec->has_coupons[vec->n] = act_atoll(cols[10]) != 0;
    struct activity *a = &vec->v[vec->n++];
    memset(a, 0, sizeof(*a));
    a->id = act_atoll(cols[0]);
    activity_copy_text(a->name, sizeof(a->name), cols[1]);
    activity_copy_text(a->coupon_name, sizeof(a->coupon_name), cols[2]);
    activity_copy_text(a->coupon_amount, sizeof(a->coupon_amount), cols[3] ? cols[3] : "0.00");
    activity_copy_text(a->coupon_threshold, sizeof(a->coupon_threshold),
                  cols[4] ? cols[4] : "0.00");
    a->total_num = act_atoll(cols[5]);
    a->start_ms = act_atoll(cols[6]);
    a->end_ms = act_atoll(cols[7]);
    a->validity_days = (int)act_atoll(cols[8]);
    a->status = (int)act_atoll(cols[9]);
    a->return_on_expiry = act_atoll(cols[12]) != 0;
    activity_copy_text(a->groups, sizeof(a->groups), cols[13] ? cols[13] : "");
    vec->txt[vec->n - 1] = activity_to_text(a);
    snprintf(vec->win[vec->n - 1], sizeof(vec->win[0]), "%" PRId64 ",%" PRId64, a->start_ms,
             a->end_ms);
    return CS_OK;
}

/* Selects the activities preheat serves (one of them when id > 0; with
 * since_s > 0 only those changed or entered the horizon since then), in one
 * query. On CS_OK vec holds them (caller frees with act_vec_free). */
int preheat_select(struct mconn *mc, int horizon_days, int grace_s, int64_t id,
                   int64_t since_s, struct preheat_vec *vec, char *err, size_t errlen)
{
    struct mval all[] = {MV_INT(grace_s), MV_INT(horizon_days)};
    struct mval one[] = {MV_INT(id), MV_INT(grace_s), MV_INT(horizon_days)};
    struct mval chg[] = {MV_INT(since_s),      MV_INT(grace_s), MV_INT(horizon_days),
                         MV_INT(since_s),      MV_INT(horizon_days), MV_INT(grace_s),
                         MV_INT(horizon_days)};
    int rc;

    memset(vec, 0, sizeof(*vec));
    if (id > 0)
        rc = mconn_query(mc, SQL_PREHEAT_ONE, one, 3, act_row, vec);
    else if (since_s > 0)
        rc = mconn_query(mc, SQL_PREHEAT_CHANGED, chg, 7, act_row, vec);
    else
        rc = mconn_query(mc, SQL_PREHEAT, all, 2, act_row, vec);
    if (rc != CS_OK) {
        snprintf(err, errlen, "selecting activities: %s", mc->errstr);
        preheat_vec_free(vec);
        return CS_ERR;
    }
    return CS_OK;
}

/* ---- preheat: one MySQL pass, pipelined writes per shard ------------------ */

/* Fields per pipelined HSET of META. */
#define ACT_PIPE_FIELDS 256

/* The META, WINDOW and VER values of vec->v[i]. */
static const char *act_meta_value(const struct preheat_vec *vec, size_t i)
{
    return vec->txt[i];
}

static const char *act_window_value(const struct preheat_vec *vec, size_t i)
{
    return vec->win[i];
}

/* Appends one command to rc's pipeline and counts it in *cmds. */
static int act_appendv(struct rconn *rc, const char *key, int argc, const char **argv,
                       const size_t *argl, size_t *cmds)
{
    int ret = rconn_appendv(rc, key, argc, argv, argl);
    if (ret == CS_OK)
        (*cmds)++;
    return ret;
}

/* Appends HMGET KEY id ... for idx[0..cnt), ACT_PIPE_FIELDS ids a command;
 * *cmds counts the commands. */
static int act_append_hmget(struct rconn *rc, const char *key, const struct preheat_vec *vec,
                            const size_t *idx, size_t cnt, size_t *cmds)
{
    const char **argv = xmalloc((2 + ACT_PIPE_FIELDS) * sizeof(*argv));
    size_t *argl = xmalloc((2 + ACT_PIPE_FIELDS) * sizeof(*argl));
    char (*ids)[24] = xmalloc(ACT_PIPE_FIELDS * sizeof(*ids));
    int ret = CS_OK;

    argv[0] = "HMGET";
    argl[0] = 5;
    argv[1] = key;
    argl[1] = strlen(key);
    for (size_t off = 0; off < cnt && ret == CS_OK; off += ACT_PIPE_FIELDS) {
        size_t m = cnt - off < ACT_PIPE_FIELDS ? cnt - off : ACT_PIPE_FIELDS;
        for (size_t k = 0; k < m; k++) {
            argv[2 + k] = ids[k];
            argl[2 + k] = (size_t)snprintf(ids[k], sizeof(ids[k]), "%" PRId64,
                                           vec->v[idx[off + k]].id);
        }
        ret = act_appendv(rc, key, (int)(2 + m), argv, argl, cmds);
    }
    free(ids);
    free(argl);
    free(argv);
    return ret;
}

/* Reads the next reply of a pipeline; on failure says in err what was read. */
static int act_get_reply(struct rconn *rc, redisReply **r, const char *what, char *err,
                         size_t errlen)
{
    if (rconn_get_reply(rc, r) == CS_OK)
        return CS_OK;
    snprintf(err, errlen, "%s: %s", what, rc->errstr);
    return CS_ERR;
}

/* Says in err that the reply r to what is not the one expected. */
static int act_unexpected(const redisReply *r, const char *what, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s: %s", what,
             r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
    return CS_ERR;
}

/* Reads the replies of act_append_hmget(): for each of the cnt fields, calls
 * fn(arg, k, reply element). */
static int act_read_hmget(struct rconn *rc, size_t cnt, const char *what,
                          void (*fn)(void *arg, size_t k, const redisReply *v), void *arg,
                          char *err, size_t errlen)
{
    int ret = CS_OK;
    for (size_t off = 0; off < cnt; off += ACT_PIPE_FIELDS) {
        size_t m = cnt - off < ACT_PIPE_FIELDS ? cnt - off : ACT_PIPE_FIELDS;
        redisReply *r;
        if (act_get_reply(rc, &r, what, err, errlen) != CS_OK)
            return CS_ERR;
        if ((r->type != REDIS_REPLY_ARRAY || r->elements != m) && ret == CS_OK)
            ret = act_unexpected(r, what, err, errlen);
        for (size_t k = 0; ret == CS_OK && k < m; k++)
            fn(arg, off + k, r->element[k]);
        freeReplyObject(r);
    }
    return ret;
}

struct act_cmp {
    const struct preheat_vec *vec;
    const size_t *idx;
    unsigned char *flag;
    const char *(*value)(const struct preheat_vec *, size_t);
};

/* flag[k]: the field differs from what preheat would write. */
static void act_field_differs(void *arg, size_t k, const redisReply *v)
{
    struct act_cmp *c = arg;
    if (v->type != REDIS_REPLY_STRING) {
        c->flag[k] = 1;
        return;
    }
    const char *txt = c->value(c->vec, c->idx[k]);
    c->flag[k] = strlen(txt) != v->len || memcmp(txt, v->str, v->len) != 0;
}

/* flag[k]: the VER field is not the version read from MySQL. */
static void act_version_differs(void *arg, size_t k, const redisReply *v)
{
    struct act_cmp *c = arg;
    char txt[24];
    int n = snprintf(txt, sizeof(txt), "%" PRId64, c->vec->ver[c->idx[k]]);
    c->flag[k] = v->type != REDIS_REPLY_STRING || (size_t)n != v->len ||
                 memcmp(txt, v->str, v->len) != 0;
}

/* flag[k]: the stock field is absent. */
static void act_stock_absent(void *arg, size_t k, const redisReply *v)
{
    struct act_cmp *c = arg;
    c->flag[k] = v->type == REDIS_REPLY_NIL;
}

/* Activities per EVAL of script_preheat_publish. */
#define ACT_PUB_BATCH 128
#define ACT_PUB_ARGS 7

/* Appends the EVALs of script_preheat_publish for pub[0..cnt) of shard SHARD; stock[k]
 * is the stock field to create, or -1 for none. *cmds counts the commands. */
static int act_append_publish(struct rconn *rc, int shard, const struct preheat_vec *vec,
                              const size_t *pub, const int64_t *stock, size_t cnt, size_t *cmds)
{
    enum { FIXED = 8 };
    char keys[5][KEYS_MAX];
    const char **argv = xmalloc((FIXED + ACT_PUB_ARGS * ACT_PUB_BATCH) * sizeof(*argv));
    size_t *argl = xmalloc((FIXED + ACT_PUB_ARGS * ACT_PUB_BATCH) * sizeof(*argl));
    char (*num)[5][24] = xmalloc(ACT_PUB_BATCH * sizeof(*num));
    int ret = CS_OK;

    keys_meta(keys[0], shard);
    keys_window(keys[1], shard);
    keys_version(keys[2], shard);
    keys_ends(keys[3], shard);
    keys_stock(keys[4], shard);
    argv[0] = "EVAL";
    argv[1] = script_preheat_publish;
    argv[2] = "5";
    for (int k = 0; k < 5; k++)
        argv[3 + k] = keys[k];
    for (int k = 0; k < FIXED; k++)
        argl[k] = strlen(argv[k]);
    for (size_t off = 0; off < cnt && ret == CS_OK; off += ACT_PUB_BATCH) {
        size_t m = cnt - off < ACT_PUB_BATCH ? cnt - off : ACT_PUB_BATCH;
        for (size_t k = 0; k < m; k++) {
            size_t i = pub[off + k], a = FIXED + ACT_PUB_ARGS * k;
            const struct activity *act = &vec->v[i];
            argv[a] = num[k][0];
            argl[a] = (size_t)snprintf(num[k][0], 24, "%" PRId64, act->id);
            argv[a + 1] = num[k][1];
            argl[a + 1] = (size_t)snprintf(num[k][1], 24, "%" PRId64, vec->ver[i]);
            argv[a + 2] = vec->txt[i];
            argl[a + 2] = strlen(vec->txt[i]);
            argv[a + 3] = vec->win[i];
            argl[a + 3] = strlen(vec->win[i]);
            argv[a + 4] = num[k][2];
            argl[a + 4] = (size_t)snprintf(num[k][2], 24, "%" PRId64, act->end_ms);
            argv[a + 5] = num[k][3];
            argl[a + 5] = stock[off + k] < 0
                              ? (num[k][3][0] = '\0', 0)
                              : (size_t)snprintf(num[k][3], 24, "%" PRId64, stock[off + k]);
            argv[a + 6] = num[k][4];
            argl[a + 6] = (size_t)snprintf(num[k][4], 24, "%" PRId64, act->total_num);
        }
        ret = act_appendv(rc, keys[0], (int)(FIXED + ACT_PUB_ARGS * m), argv, argl, cmds);
    }
    free(num);
    free(argl);
    free(argv);
    return ret;
}

/* Reads the replies of act_append_publish(): counts created stock fields in
 * res, marks refused activities in stale[] (parallel to pub) and puts the
 * META that stays in their place in vec, so ACTIVITY:LIST shows the newer. */
static int act_read_publish(struct rconn *rc, struct preheat_vec *vec, const size_t *pub,
                            size_t cnt, unsigned char *stale, struct preheat_result *res,
                            char *err, size_t errlen)
{
    int ret = CS_OK;
    for (size_t off = 0; off < cnt; off += ACT_PUB_BATCH) {
        size_t m = cnt - off < ACT_PUB_BATCH ? cnt - off : ACT_PUB_BATCH;
        redisReply *r;
        if (act_get_reply(rc, &r, "EVAL publish", err, errlen) != CS_OK)
            return CS_ERR;
        if ((r->type != REDIS_REPLY_ARRAY || r->elements < 3 || r->elements % 2 != 1 ||
             r->element[0]->type != REDIS_REPLY_INTEGER ||
             r->element[1]->type != REDIS_REPLY_INTEGER ||
             r->element[2]->type != REDIS_REPLY_INTEGER) && ret == CS_OK)
            ret = act_unexpected(r, "EVAL publish", err, errlen);
        if (ret == CS_OK) {
            res->created += (int)r->element[0]->integer;
            res->adjusted += (int)r->element[1]->integer;
            res->clamped += (int)r->element[2]->integer;
            res->written += (int)(m - (r->elements - 3) / 2);
        }
        for (size_t e = 3; ret == CS_OK && e + 1 < r->elements; e += 2) {
            const redisReply *f = r->element[e], *v = r->element[e + 1];
            int64_t id;
            if (f->type != REDIS_REPLY_STRING || cs_parse_id(f->str, f->len, &id) != CS_OK)
                continue;
            for (size_t k = off; k < off + m; k++) {
                size_t i = pub[k];
                if (vec->v[i].id != id)
                    continue;
                stale[k] = 1;
                res->stale++;
                if (v->type == REDIS_REPLY_STRING && v->len > 0) {
                    cJSON_free(vec->txt[i]);
                    vec->txt[i] = cJSON_malloc(v->len + 1);
                    memcpy(vec->txt[i], v->str, v->len);
                    vec->txt[i][v->len] = '\0';
                }
                break;
            }
        }
        freeReplyObject(r);
    }
    return ret;
}

/* What act_publish_shard() learns of the activities idx[0..cnt) of one
 * shard, k for the k-th of idx, and what it publishes (pub[0..npub), j for
 * the j-th). */
struct act_shard {
    size_t cnt, npub;
    unsigned char *differs, *wdiffers, *vdiffers; /* META, WINDOW, VER differ */
    unsigned char *absent;     /* no stock field */
    int64_t *queued;           /* entries queued, the q-th absent one */
    size_t *pub;               /* index in vec of the j-th to publish */
    int64_t *pstock;           /* the stock field to write, -1 none */
    unsigned char *restore;    /* restore_stock() after the script */
    unsigned char *stale;      /* the script refused it: a newer one is there */
};

static void act_shard_init(struct act_shard *sh, size_t cnt)
{
    sh->cnt = cnt;
    sh->npub = 0;
    sh->differs = xmalloc(cnt + 1);
    sh->wdiffers = xmalloc(cnt + 1);
    sh->vdiffers = xmalloc(cnt + 1);
    sh->absent = xmalloc(cnt + 1);
    sh->queued = xmalloc((cnt + 1) * sizeof(*sh->queued));
    sh->pub = xmalloc((cnt + 1) * sizeof(*sh->pub));
    sh->pstock = xmalloc((cnt + 1) * sizeof(*sh->pstock));
    sh->restore = xcalloc(cnt + 1, 1);
    sh->stale = xcalloc(cnt + 1, 1);
}

static void act_shard_free(struct act_shard *sh)
{
    free(sh->stale);
    free(sh->restore);
    free(sh->pstock);
    free(sh->pub);
    free(sh->queued);
    free(sh->absent);
    free(sh->vdiffers);
    free(sh->wdiffers);
    free(sh->differs);
}

/* The first round trip: reads META, WINDOW, VER and stock of each activity
 * and marks what differs from what preheat would write, and which stock
 * fields are absent. CS_ERR with err. */
static int act_shard_read(struct rconn *rc, int shard, const struct preheat_vec *vec,
                          const size_t *idx, struct act_shard *sh, char *err, size_t errlen)
{
    char mkey[KEYS_MAX], wkey[KEYS_MAX], vkey[KEYS_MAX], skey[KEYS_MAX];
    struct act_cmp cm = {vec, idx, sh->differs, act_meta_value};
    struct act_cmp cw = {vec, idx, sh->wdiffers, act_window_value};
    struct act_cmp cv = {vec, idx, sh->vdiffers, NULL};
    struct act_cmp cs = {vec, idx, sh->absent, NULL};
    size_t cmds = 0, cnt = sh->cnt;

    keys_meta(mkey, shard);
    keys_window(wkey, shard);
    keys_version(vkey, shard);
    keys_stock(skey, shard);
    if (act_append_hmget(rc, mkey, vec, idx, cnt, &cmds) != CS_OK
        || act_append_hmget(rc, wkey, vec, idx, cnt, &cmds) != CS_OK
        || act_append_hmget(rc, vkey, vec, idx, cnt, &cmds) != CS_OK
        || act_append_hmget(rc, skey, vec, idx, cnt, &cmds) != CS_OK) {
        snprintf(err, errlen, "pipeline to shard %d: %s", shard, rc->errstr);
        return CS_ERR;
    }
    if (act_read_hmget(rc, cnt, "HMGET META", act_field_differs, &cm, err, errlen) != CS_OK
        || act_read_hmget(rc, cnt, "HMGET WINDOW", act_field_differs, &cw, err, errlen) != CS_OK
        || act_read_hmget(rc, cnt, "HMGET VER", act_version_differs, &cv, err, errlen) != CS_OK
        || act_read_hmget(rc, cnt, "HMGET STOCK", act_stock_absent, &cs, err, errlen) != CS_OK)
        return CS_ERR;
    return CS_OK;
}

/* Counts in sh->queued what the queue holds of each activity whose stock
 * field is absent, in the order of idx. CS_ERR with err. */
static int act_shard_queued(struct rconn *rc, int shard, const struct preheat_vec *vec,
                            const size_t *idx, struct act_shard *sh, char *err, size_t errlen)
{
    size_t nmissing = 0;
    int64_t *mids = xmalloc((sh->cnt + 1) * sizeof(*mids));
    for (size_t k = 0; k < sh->cnt; k++)
        if (sh->absent[k])
            mids[nmissing++] = vec->v[idx[k]].id;
    if (nmissing == 0) {
        free(mids);
        return CS_OK;
    }
    /* The queue is matched against the absent ids by binary search. */
    int64_t *sorted = xmalloc(nmissing * sizeof(*sorted));
    int64_t *qsorted = xmalloc(nmissing * sizeof(*qsorted));
    memcpy(sorted, mids, nmissing * sizeof(*sorted));
    qsort(sorted, nmissing, sizeof(*sorted), cs_cmp_int64);
    int qrc = activity_count_queued(rc, shard, sorted, nmissing, qsorted, err, errlen);
    for (size_t k = 0; qrc == CS_OK && k < nmissing; k++) {
        const int64_t *hit = bsearch(&mids[k], sorted, nmissing, sizeof(int64_t), cs_cmp_int64);
        sh->queued[k] = qsorted[hit - sorted];
    }
    free(qsorted);
    free(sorted);
    free(mids);
    return qrc;
}

/* Picks what to publish: every activity where a field differs or the stock
 * field is absent. A new activity (no coupon in MySQL, nothing queued)
 * gets total_num; any other absent stock field is restored afterwards. */
static void act_shard_plan(const struct preheat_vec *vec, const size_t *idx, struct act_shard *sh)
{
    for (size_t k = 0, q = 0; k < sh->cnt; k++) {
        if (!sh->differs[k] && !sh->wdiffers[k] && !sh->vdiffers[k] && !sh->absent[k])
            continue;
        size_t i = idx[k];
        sh->pstock[sh->npub] = -1;
        if (sh->absent[k]) {
            if (!vec->has_coupons[i] && sh->queued[q] == 0)
                sh->pstock[sh->npub] = vec->v[i].total_num;
            else
                sh->restore[sh->npub] = 1;
            q++;
        }
        sh->pub[sh->npub++] = i;
    }
}

/* Restores the stock fields the plan left to restore_stock(), but for
 * those the script refused. CS_ERR with err. */
static int act_shard_restore(struct mconn *mc, struct rconn *rc, struct preheat_vec *vec,
                             const struct act_shard *sh, struct preheat_result *res, char *err,
                             size_t errlen)
{
    for (size_t k = 0; k < sh->npub; k++) {
        int created, restored;
        if (!sh->restore[k] || sh->stale[k])
            continue;
        if (restore_stock(mc, rc, &vec->v[sh->pub[k]], &created, &restored, err, errlen)
            != CS_OK)
            return CS_ERR;
        res->created += created;
        res->restored += restored;
    }
    return CS_OK;
}

/*
 * Publishes the activities idx[0..cnt) of vec, all of shard SHARD, in two
 * pipelined round trips: the first reads their META, WINDOW, VER and stock
 * fields (HMGET), the second runs script_preheat_publish for those where one differs
 * or the stock field is absent. Reading first keeps a preheat that changes
 * nothing from writing (and fsyncing) megabytes. A new activity (no coupon
 * in MySQL, nothing queued) gets total_num; any other absent stock field
 * goes through restore_stock(). A queue entry can only exist while its
 * stock field does (the script needs it to grant), and the stock field is
 * only removed with the queue empty of it, so "nothing queued now" cannot
 * hide an entry that moved to MySQL after the SELECT.
 */
static int act_publish_shard(struct mconn *mc, struct rconn *rc, int shard,
                             struct preheat_vec *vec, const size_t *idx, size_t cnt,
                             struct preheat_result *res, char *err, size_t errlen)
{
    struct act_shard sh;
    size_t cmds = 0;
    int ret = CS_ERR;

    act_shard_init(&sh, cnt);
    if (act_shard_read(rc, shard, vec, idx, &sh, err, errlen) != CS_OK
        || act_shard_queued(rc, shard, vec, idx, &sh, err, errlen) != CS_OK)
        goto out;
    act_shard_plan(vec, idx, &sh);
    if (act_append_publish(rc, shard, vec, sh.pub, sh.pstock, sh.npub, &cmds) != CS_OK) {
        snprintf(err, errlen, "pipeline to shard %d: %s", shard, rc->errstr);
        goto out;
    }
    if (act_read_publish(rc, vec, sh.pub, sh.npub, sh.stale, res, err, errlen) != CS_OK
        || act_shard_restore(mc, rc, vec, &sh, res, err, errlen) != CS_OK)
        goto out;
    ret = CS_OK;
out:
    /* A failure may leave replies of the pipeline unread: start afresh. */
    if (ret != CS_OK)
        rconn_drop(rc);
    act_shard_free(&sh);
    return ret;
}

/* Publishes every activity of vec, shard by shard. */
static int act_publish(struct mconn *mc, struct rconn *rc, struct preheat_vec *vec,
                       struct preheat_result *res, char *err, size_t errlen)
{
    size_t *idx = xmalloc((vec->n + 1) * sizeof(*idx));
    int ret = CS_OK;

    for (int shard = 0; shard < KEYS_SHARDS && ret == CS_OK; shard++) {
        size_t cnt = 0;
        for (size_t i = 0; i < vec->n; i++)
            if (keys_shard(vec->v[i].id) == shard)
                idx[cnt++] = i;
        if (cnt > 0)
            ret = act_publish_shard(mc, rc, shard, vec, idx, cnt, res, err, errlen);
    }
    free(idx);
    return ret;
}

/* Row of SQL_NOW: arg is the int64_t it goes into; *got set (arg[1]). */
static int preheat_now_row(void *arg, int ncols, char **cols)
{
    int64_t *v = arg;
    if (ncols != 1 || cols[0] == NULL || cs_parse_id(cols[0], strlen(cols[0]), &v[0]) != CS_OK)
        return CS_ERR;
    v[1] = 1;
    return CS_OK;
}

/* MySQL's clock, in seconds since the epoch. */
int preheat_mysql_now(struct mconn *mc, int64_t *now_s, char *err, size_t errlen)
{
    int64_t v[2] = {0, 0};
    if (mconn_query(mc, SQL_NOW, NULL, 0, preheat_now_row, v) != CS_OK || v[1] != 1) {
        snprintf(err, errlen, "reading MySQL's clock: %s", mc->errstr);
        return CS_ERR;
    }
    *now_s = v[0];
    return CS_OK;
}

void preheat_mark_free(struct preheat_mark *mark)
{
    free(mark->listed);
    memset(mark, 0, sizeof(*mark));
}

int activity_preheat_pass(struct mconn *mc, struct rconn *rc, int horizon_days, int grace_s,
                          struct preheat_mark *mark, int relist, struct preheat_result *res,
                          char *err, size_t errlen)
{
    struct preheat_vec vec;
    int64_t now_s = 0, since_s = 0;
    long long gen;
    int ret = CS_ERR, voids = 0, stale = 0;

    memset(res, 0, sizeof(*res));
    int64_t t0 = cs_mono_ms();
    if (mark != NULL) {
        if (preheat_mysql_now(mc, &now_s, err, errlen) != CS_OK)
            return CS_ERR;
        if (mark->since_s > 0)
            since_s = mark->since_s - PREHEAT_OVERLAP_S;
    }
    if (actlist_gen(rc, &gen, err, errlen) != CS_OK
        || preheat_select(mc, horizon_days, grace_s, 0, since_s, &vec, err, errlen) != CS_OK)
        return CS_ERR;
    cs_pause_point("preheat-read");
    int64_t t1 = cs_mono_ms();
    if (revoke_reapply(mc, rc, since_s, grace_s, &voids, err, errlen) != CS_OK)
        goto out;
    if (vec.n > 0 && revoke_drop_voided(rc, &vec, err, errlen) != CS_OK)
        goto out;
    cs_pause_point("preheat-publish");
    if (vec.n > 0 && act_publish(mc, rc, &vec, res, err, errlen) != CS_OK)
        goto out;
    if (since_s > 0) {
        res->changed = (int)vec.n;
        /* Only what changed was read: ACTIVITY:LIST is rebuilt from a full
         * read, and only when an element of it changed (a drain stamps
         * updated_at with every batch, and changes no element). */
        int differs = actlist_differs(mark, &vec);
        preheat_vec_free(&vec);
        if (!differs && voids == 0 && !relist)
            goto done;
        if (actlist_gen(rc, &gen, err, errlen) != CS_OK
            || preheat_select(mc, horizon_days, grace_s, 0, 0, &vec, err, errlen) != CS_OK)
            return CS_ERR;
        if (revoke_drop_voided(rc, &vec, err, errlen) != CS_OK)
            goto out;
        res->listed = 1;
    }
    /* Written last, so every listed activity already has its stock field.
     * An admin change that wrote the list after our MySQL read wins: the
     * list is read again rather than put back (and what it then holds is
     * not known here: the next pass that reads a change rewrites it). */
    if (actlist_write(rc, &vec, gen, &stale, err, errlen) != CS_OK
        || (stale && actlist_rewrite(mc, rc, horizon_days, grace_s, err, errlen) != CS_OK))
        goto out;
    if (mark != NULL && !stale)
        actlist_mark(mark, &vec);
    else if (mark != NULL)
        mark->have_list = 0;
    res->loaded = (int)vec.n;
done:
    res->select_ms = t1 - t0;
    res->write_ms = cs_mono_ms() - t1;
    if (mark != NULL)
        mark->since_s = now_s;
    ret = CS_OK;
out:
    preheat_vec_free(&vec);
    return ret;
}

int activity_preheat(struct mconn *mc, struct rconn *rc, int horizon_days, int grace_s,
                     struct preheat_result *res, char *err, size_t errlen)
{
    return activity_preheat_pass(mc, rc, horizon_days, grace_s, NULL, 0, res, err, errlen);
}

int activity_preheat_one(struct mconn *mc, struct rconn *rc, int64_t id, int horizon_days,
                         int grace_s, struct preheat_result *res, char *err, size_t errlen)
{
    for (int tries = 0; tries < ACTLIST_TRIES; tries++) {
        struct preheat_vec vec;
        long long gen;
        int stale = 0, malformed = 0, ret;

        memset(res, 0, sizeof(*res));
        /* The list's generation before the row is read: a write of the list
         * after that (another change of ID included) makes us read again,
         * so an older row can never replace a newer one in the list. */
        if (actlist_gen(rc, &gen, err, errlen) != CS_OK
            || preheat_select(mc, horizon_days, grace_s, id, 0, &vec, err, errlen) != CS_OK)
            return CS_ERR;
        ret = revoke_drop_voided(rc, &vec, err, errlen);
        if (ret == CS_OK)
            ret = act_publish(mc, rc, &vec, res, err, errlen);
        res->loaded = (int)vec.n;
        /* Its place in ACTIVITY:LIST (added, moved, or gone when it left the
         * horizon), after its stock field exists. */
        if (ret == CS_OK) {
            ret = actlist_splice(rc, id, &vec, gen, &stale, &malformed, err, errlen);
            if (ret != CS_OK && malformed) /* rebuilt whole from MySQL */
                ret = actlist_rewrite(mc, rc, horizon_days, grace_s, err, errlen);
        }
        preheat_vec_free(&vec);
        if (ret != CS_OK || !stale)
            return ret;
    }
    snprintf(err, errlen, "%s: %d writers came between", KEY_ACTIVITY_LIST, ACTLIST_TRIES);
    return CS_ERR;
}
