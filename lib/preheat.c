/* preheat.c - activities from MySQL into Redis: preheat (one MySQL pass,
 * pipelined writes per shard) and revoke. */
#include "preheat.h"
#include "activity.h"
#include "cs.h"
#include "keys.h"
#include "log.h"
#include "mconn.h"
#include "rconn.h"
#include "restore.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Activities that ended within the grace stay listed, so a late seize gets a
 * clear ENDED rather than NO_SUCH_ACTIVITY. The last column says whether MySQL
 * holds any coupon of it (an index probe, not a count). */
#define SQL_PREHEAT_COLS \
    "SELECT id, name, coupon_name, coupon_amount, coupon_threshold, total_num, " \
    "UNIX_TIMESTAMP(distribute_start_time)*1000, UNIX_TIMESTAMP(distribute_end_time)*1000, " \
    "validity_days, status, " \
    "EXISTS (SELECT 1 FROM coupon c WHERE c.activity_id = activity.id) FROM activity "
static const char SQL_PREHEAT[] = SQL_PREHEAT_COLS
    "WHERE status <> 4 AND distribute_end_time > NOW() - INTERVAL ? SECOND "
    "AND distribute_start_time < NOW() + INTERVAL ? DAY "
    "ORDER BY distribute_start_time, id";
static const char SQL_PREHEAT_ONE[] = SQL_PREHEAT_COLS
    "WHERE id = ? AND status <> 4 AND distribute_end_time > NOW() - INTERVAL ? SECOND "
    "AND distribute_start_time < NOW() + INTERVAL ? DAY";
/* Revoked activities that could still be on sale: preheat re-applies their
 * Redis side, so a revoke cut short after Redis lost it heals by itself. */
static const char SQL_VOIDED[] =
    "SELECT id FROM activity WHERE status = 4 AND distribute_end_time > NOW() - INTERVAL ? SECOND";
static const char SQL_ACTIVITY_EXISTS[] = "SELECT id FROM activity WHERE id = ?";
static const char SQL_REVOKE_LOCK[] = "SELECT status FROM activity WHERE id = ? FOR UPDATE";
static const char SQL_REVOKE_ACTIVITY[] = "UPDATE activity SET status = 4 WHERE id = ?";
static const char SQL_REVOKE_COUPONS[] =
    "UPDATE coupon SET status = 4 WHERE activity_id = ? AND status = 1";

/* ---- reading activities from MySQL --------------------------------------- */

struct act_vec {
    struct activity *v;
    unsigned char *has_coupons; /* parallel to v: MySQL holds coupons of it */
    char **txt;                /* parallel to v: activity_to_text(), made once */
    char (*win)[48];           /* parallel to v: WINDOW value "<startMs>,<endMs>" */
    size_t n, cap;
};

static void act_vec_free(struct act_vec *vec)
{
    for (size_t i = 0; i < vec->n; i++)
        cJSON_free(vec->txt[i]);
    free(vec->txt);
    free(vec->win);
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
    struct act_vec *vec = arg;
    if (ncols != 11)
        return CS_ERR;
    if (vec->n == vec->cap) {
        vec->cap = vec->cap ? vec->cap * 2 : 16;
        vec->v = xrealloc(vec->v, vec->cap * sizeof(*vec->v));
        vec->has_coupons = xrealloc(vec->has_coupons, vec->cap);
        vec->txt = xrealloc(vec->txt, vec->cap * sizeof(*vec->txt));
        vec->win = xrealloc(vec->win, vec->cap * sizeof(*vec->win));
    }
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
    vec->txt[vec->n - 1] = activity_to_text(a);
    snprintf(vec->win[vec->n - 1], sizeof(vec->win[0]), "%" PRId64 ",%" PRId64, a->start_ms,
             a->end_ms);
    return CS_OK;
}

/* Selects the activities preheat serves (one of them when id > 0), in one
 * query. On CS_OK vec holds them (caller frees with act_vec_free). */
static int act_select(struct mconn *mc, int horizon_days, int grace_s, int64_t id,
                      struct act_vec *vec, char *err, size_t errlen)
{
    struct mval all[] = {MV_INT(grace_s), MV_INT(horizon_days)};
    struct mval one[] = {MV_INT(id), MV_INT(grace_s), MV_INT(horizon_days)};
    int rc;

    memset(vec, 0, sizeof(*vec));
    if (id > 0)
        rc = mconn_query(mc, SQL_PREHEAT_ONE, one, 3, act_row, vec);
    else
        rc = mconn_query(mc, SQL_PREHEAT, all, 2, act_row, vec);
    if (rc != CS_OK) {
        snprintf(err, errlen, "selecting activities: %s", mc->errstr);
        act_vec_free(vec);
        return CS_ERR;
    }
    return CS_OK;
}

/* Growing text buffer. */
struct act_buf {
    char *p;
    size_t len, cap;
};

static void act_buf_add(struct act_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->p = xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

/* Writes ACTIVITY:LIST only when its generation is still the one read before
 * the MySQL read behind the new value, and bumps the generation: KEYS[1] the
 * list, KEYS[2] its generation, ARGV[1] the value, ARGV[2] the generation
 * seen. Returns the new generation, or -1 when another writer came between. */
static const char ACT_LIST_CAS[] =
    "local g = tonumber(redis.call('GET', KEYS[2]) or '0') "
    "if g ~= tonumber(ARGV[2]) then return -1 end "
    "redis.call('SET', KEYS[1], ARGV[1]) "
    "return redis.call('INCR', KEYS[2])";

/* Generation of ACTIVITY:LIST (0 before the first write), read before the
 * MySQL read a list write is made from. */
static int act_list_gen(struct rconn *rc, long long *gen, char *err, size_t errlen)
{
    redisReply *r = rconn_command(rc, KEY_ACTIVITY_LIST_GEN, "GET %s", KEY_ACTIVITY_LIST_GEN);
    if (rconn_expect(rc, r, 0, "GET", KEY_ACTIVITY_LIST_GEN, err, errlen) != CS_OK)
        return CS_ERR;
    *gen = r->type == REDIS_REPLY_STRING ? strtoll(r->str, NULL, 10) : 0;
    freeReplyObject(r);
    return CS_OK;
}

/* Sets ACTIVITY:LIST to the JSON array of vec, made from a MySQL read that
 * began after generation GEN was read, unless it holds that already. CS_OK
 * with *stale = 1 when another writer wrote meanwhile: nothing was written,
 * and the caller reads MySQL again. Written element by element: a whole
 * cJSON tree of 20,000 activities would cost tens of megabytes. */
static int act_write_list(struct rconn *rc, const struct act_vec *vec, long long gen, int *stale,
                          char *err, size_t errlen)
{
    struct act_buf b = {0};

    *stale = 0;
    act_buf_add(&b, "[", 1);
    for (size_t i = 0; i < vec->n; i++) {
        if (i > 0)
            act_buf_add(&b, ",", 1);
        act_buf_add(&b, vec->txt[i], strlen(vec->txt[i]));
    }
    act_buf_add(&b, "]", 1);
    /* Unchanged (the usual case of a periodic preheat): nothing to write, so
     * nothing for the append-only file to fsync. */
    redisReply *r = rconn_command(rc, KEY_ACTIVITY_LIST, "GET %s", KEY_ACTIVITY_LIST);
    int same = r != NULL && r->type == REDIS_REPLY_STRING && r->len == b.len &&
               memcmp(r->str, b.p, b.len) == 0;
    if (r != NULL)
        freeReplyObject(r);
    if (same) {
        free(b.p);
        return CS_OK;
    }
    r = rconn_command(rc, KEY_ACTIVITY_LIST, "EVAL %s 2 %s %s %b %lld", ACT_LIST_CAS,
                      KEY_ACTIVITY_LIST, KEY_ACTIVITY_LIST_GEN, b.p, b.len, gen);
    free(b.p);
    if (rconn_expect(rc, r, REDIS_REPLY_INTEGER, "EVAL list write", KEY_ACTIVITY_LIST, err,
                     errlen) != CS_OK)
        return CS_ERR;
    *stale = r->integer < 0;
    freeReplyObject(r);
    return CS_OK;
}

/* ---- preheat: one MySQL pass, pipelined writes per shard ------------------ */

/* Fields per pipelined HSET of META. */
#define ACT_PIPE_FIELDS 256

/* Ids in ACTIVITY:VOIDED, sorted, in one command. On CS_OK *ids is xmalloc'ed
 * (caller frees). */
static int act_voided_ids(struct rconn *rc, int64_t **ids, size_t *n, char *err, size_t errlen)
{
    redisReply *r = rconn_command(rc, KEY_ACTIVITY_VOIDED, "SMEMBERS %s", KEY_ACTIVITY_VOIDED);
    if (rconn_expect(rc, r, REDIS_REPLY_ARRAY, "SMEMBERS", KEY_ACTIVITY_VOIDED, err, errlen)
        != CS_OK)
        return CS_ERR;
    *ids = xmalloc(sizeof(int64_t) * (r->elements + 1));
    *n = 0;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        if (e->type == REDIS_REPLY_STRING && cs_parse_id(e->str, e->len, &(*ids)[*n]) == CS_OK)
            (*n)++;
    }
    freeReplyObject(r);
    if (*n > 1)
        qsort(*ids, *n, sizeof(int64_t), cs_cmp_int64);
    return CS_OK;
}

/* Reads n pipelined replies; CS_ERR (message in err) when one is an error or
 * not of the expected type. All n are read, so the connection stays in step. */
static int act_pipe_replies(struct rconn *rc, size_t n, int type, const char *what,
                            long long *ints, char *err, size_t errlen)
{
    int ret = CS_OK;
    for (size_t i = 0; i < n; i++) {
        redisReply *r;
        if (rconn_get_reply(rc, &r) != CS_OK) {
            snprintf(err, errlen, "%s: %s", what, rc->errstr);
            return CS_ERR;
        }
        if (r->type != type && ret == CS_OK) {
            snprintf(err, errlen, "%s: %s", what,
                     r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
            ret = CS_ERR;
        }
        if (ints != NULL)
            ints[i] = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
        freeReplyObject(r);
    }
    return ret;
}

/* The META and WINDOW values of vec->v[i]. */
static const char *act_meta_value(const struct act_vec *vec, size_t i)
{
    return vec->txt[i];
}

static const char *act_window_value(const struct act_vec *vec, size_t i)
{
    return vec->win[i];
}

/* Appends CMD KEY id [value] ... for idx[0..cnt), ACT_PIPE_FIELDS ids a
 * command: HSET with value(vec, i) after each id, or HMGET (value NULL)
 * with ids only. *cmds counts the commands. */
static int act_append_fields(struct rconn *rc, const char *cmd, const char *key,
                             const struct act_vec *vec, const size_t *idx, size_t cnt,
                             const char *(*value)(const struct act_vec *, size_t), size_t *cmds)
{
    size_t per = value != NULL ? 2 : 1;
    const char **argv = xmalloc((2 + per * ACT_PIPE_FIELDS) * sizeof(*argv));
    size_t *argl = xmalloc((2 + per * ACT_PIPE_FIELDS) * sizeof(*argl));
    char (*ids)[24] = xmalloc(ACT_PIPE_FIELDS * sizeof(*ids));
    int ret = CS_OK;

    argv[0] = cmd;
    argl[0] = strlen(cmd);
    argv[1] = key;
    argl[1] = strlen(key);
    for (size_t off = 0; off < cnt && ret == CS_OK; off += ACT_PIPE_FIELDS) {
        size_t m = cnt - off < ACT_PIPE_FIELDS ? cnt - off : ACT_PIPE_FIELDS;
        for (size_t k = 0; k < m; k++) {
            size_t i = idx[off + k], a = 2 + per * k;
            argv[a] = ids[k];
            argl[a] = (size_t)snprintf(ids[k], sizeof(ids[k]), "%" PRId64, vec->v[i].id);
            if (value != NULL) {
                argv[a + 1] = value(vec, i);
                argl[a + 1] = strlen(argv[a + 1]);
            }
        }
        ret = rconn_appendv(rc, key, (int)(2 + per * m), argv, argl);
        if (ret == CS_OK)
            (*cmds)++;
    }
    free(ids);
    free(argl);
    free(argv);
    return ret;
}

/* Reads the replies of act_append_fields(HMGET): for each of the cnt fields, calls
 * fn(arg, k, reply element). */
static int act_read_hmget(struct rconn *rc, size_t cnt, const char *what,
                          void (*fn)(void *arg, size_t k, const redisReply *v), void *arg,
                          char *err, size_t errlen)
{
    int ret = CS_OK;
    for (size_t off = 0; off < cnt; off += ACT_PIPE_FIELDS) {
        size_t m = cnt - off < ACT_PIPE_FIELDS ? cnt - off : ACT_PIPE_FIELDS;
        redisReply *r;
        if (rconn_get_reply(rc, &r) != CS_OK) {
            snprintf(err, errlen, "%s: %s", what, rc->errstr);
            return CS_ERR;
        }
        if ((r->type != REDIS_REPLY_ARRAY || r->elements != m) && ret == CS_OK) {
            snprintf(err, errlen, "%s: %s", what,
                     r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
            ret = CS_ERR;
        }
        for (size_t k = 0; ret == CS_OK && k < m; k++)
            fn(arg, off + k, r->element[k]);
        freeReplyObject(r);
    }
    return ret;
}

struct act_cmp {
    const struct act_vec *vec;
    const size_t *idx;
    unsigned char *flag;
    const char *(*value)(const struct act_vec *, size_t);
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

/* flag[k]: the stock field is absent. */
static void act_stock_absent(void *arg, size_t k, const redisReply *v)
{
    struct act_cmp *c = arg;
    c->flag[k] = v->type == REDIS_REPLY_NIL;
}

/*
 * Publishes the activities idx[0..cnt) of vec, all of shard SHARD, in two
 * pipelined round trips: the first reads their META and stock fields (HMGET),
 * the second writes the META fields that changed and then, behind them on the
 * same connection, the absent stock fields of new activities. Reading first
 * keeps a preheat that changes nothing from writing (and fsyncing) megabytes.
 * A new activity (no coupon in MySQL, nothing queued) gets total_num; any
 * other absent stock field goes through restore_stock(). A queue
 * entry can only exist while its stock field does (the script needs it to
 * grant), and the stock field is only removed with the queue empty of it, so
 * "nothing queued now" cannot hide an entry that moved to MySQL after the
 * SELECT.
 */
static int act_publish_shard(struct mconn *mc, struct rconn *rc, int shard,
                             const struct act_vec *vec, const size_t *idx, size_t cnt,
                             struct preheat_result *res, char *err, size_t errlen)
{
    char mkey[KEYS_MAX], wkey[KEYS_MAX], skey[KEYS_MAX], field[24];
    size_t cmds = 0, nchanged = 0, nwchanged = 0, nmissing = 0, fast = 0;
    unsigned char *differs = xmalloc(cnt + 1), *absent = xmalloc(cnt + 1);
    unsigned char *wdiffers = xmalloc(cnt + 1);
    size_t *changed = xmalloc((cnt + 1) * sizeof(*changed));
    size_t *wchanged = xmalloc((cnt + 1) * sizeof(*wchanged));
    size_t *missing = xmalloc((cnt + 1) * sizeof(*missing));
    int64_t *mids = xmalloc((cnt + 1) * sizeof(*mids));
    int64_t *queued = xmalloc((cnt + 1) * sizeof(*queued));
    long long *ints = xmalloc((cnt + 1) * sizeof(*ints));
    struct act_cmp cm = {vec, idx, differs, act_meta_value};
    struct act_cmp cw = {vec, idx, wdiffers, act_window_value};
    struct act_cmp cs = {vec, idx, absent, NULL};
    int ret = CS_ERR;

    keys_meta(mkey, shard);
    keys_window(wkey, shard);
    keys_stock(skey, shard);
    if (act_append_fields(rc, "HMGET", mkey, vec, idx, cnt, NULL, &cmds) != CS_OK
        || act_append_fields(rc, "HMGET", wkey, vec, idx, cnt, NULL, &cmds) != CS_OK
        || act_append_fields(rc, "HMGET", skey, vec, idx, cnt, NULL, &cmds) != CS_OK)
        goto io;
    if (act_read_hmget(rc, cnt, "HMGET META", act_field_differs, &cm, err, errlen) != CS_OK
        || act_read_hmget(rc, cnt, "HMGET WINDOW", act_field_differs, &cw, err, errlen) != CS_OK
        || act_read_hmget(rc, cnt, "HMGET STOCK", act_stock_absent, &cs, err, errlen) != CS_OK)
        goto out;
    for (size_t k = 0; k < cnt; k++) {
        if (differs[k])
            changed[nchanged++] = idx[k];
        if (wdiffers[k])
            wchanged[nwchanged++] = idx[k];
        if (absent[k]) {
            missing[nmissing] = idx[k];
            mids[nmissing++] = vec->v[idx[k]].id;
        }
    }
    if (nmissing > 0) {
        /* The queue is matched against the absent ids by binary search. */
        int64_t *sorted = xmalloc(nmissing * sizeof(*sorted));
        int64_t *qsorted = xmalloc(nmissing * sizeof(*qsorted));
        memcpy(sorted, mids, nmissing * sizeof(*sorted));
        qsort(sorted, nmissing, sizeof(*sorted), cs_cmp_int64);
        int qrc = activity_count_queued(rc, shard, sorted, nmissing, qsorted, err, errlen);
        for (size_t k = 0; qrc == CS_OK && k < nmissing; k++) {
            const int64_t *hit = bsearch(&mids[k], sorted, nmissing, sizeof(int64_t), cs_cmp_int64);
            queued[k] = qsorted[hit - sorted];
        }
        free(qsorted);
        free(sorted);
        if (qrc != CS_OK)
            goto out;
    }

    /* META and WINDOW before stock: whoever sees the stock field finds the
     * metadata, and the script refuses an activity without a window, so the
     * stock field never opens a sale by itself. HSET, not HSETNX: an admin
     * may have moved the end. */
    cmds = 0;
    if (act_append_fields(rc, "HSET", mkey, vec, changed, nchanged, act_meta_value, &cmds) != CS_OK
        || act_append_fields(rc, "HSET", wkey, vec, wchanged, nwchanged, act_window_value,
                             &cmds) != CS_OK)
        goto io;
    for (size_t k = 0; k < nmissing; k++) {
        const struct activity *a = &vec->v[missing[k]];
        if (vec->has_coupons[missing[k]] || queued[k] > 0)
            continue;
        snprintf(field, sizeof(field), "%" PRId64, a->id);
        if (rconn_append(rc, skey, "HSETNX %s %s %" PRId64, skey, field, a->total_num) != CS_OK)
            goto io;
        fast++;
    }
    if (act_pipe_replies(rc, cmds, REDIS_REPLY_INTEGER, "HSET META/WINDOW", NULL, err, errlen)
            != CS_OK
        || act_pipe_replies(rc, fast, REDIS_REPLY_INTEGER, "HSETNX", ints, err, errlen)
               != CS_OK)
        goto out;
    for (size_t k = 0; k < fast; k++)
        res->created += ints[k] == 1;
    for (size_t k = 0; k < nmissing; k++) {
        int created, restored;
        if (!vec->has_coupons[missing[k]] && queued[k] == 0)
            continue;
        if (restore_stock(mc, rc, &vec->v[missing[k]], &created, &restored, err, errlen)
            != CS_OK)
            goto out;
        res->created += created;
        res->restored += restored;
    }
    ret = CS_OK;
    goto out;
io:
    snprintf(err, errlen, "pipeline to shard %d: %s", shard, rc->errstr);
out:
    /* A failure may leave replies of the pipeline unread: start afresh. */
    if (ret != CS_OK)
        rconn_drop(rc);
    free(ints);
    free(queued);
    free(mids);
    free(missing);
    free(wchanged);
    free(changed);
    free(wdiffers);
    free(absent);
    free(differs);
    return ret;
}

/* Publishes every activity of vec, shard by shard. */
static int act_publish(struct mconn *mc, struct rconn *rc, const struct act_vec *vec,
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

/* The Redis side of a revoke: id in ACTIVITY:VOIDED, so every node answers
 * VOIDED, and its stock field a tombstone. A tombstone, not HDEL: a preheat
 * that read MySQL before the revoke finds the field present and cannot put
 * the stock back (HSETNX), and the script answers SOLD_OUT to a node that
 * has not yet seen the revoke, so nothing more is ever issued. Idempotent. */
static int act_apply_void(struct rconn *rc, int64_t id, char *err, size_t errlen)
{
    char skey[KEYS_MAX];
    redisReply *r = rconn_command(rc, KEY_ACTIVITY_VOIDED, "SADD %s %" PRId64,
                                  KEY_ACTIVITY_VOIDED, id);
    if (rconn_expect(rc, r, 0, "SADD", KEY_ACTIVITY_VOIDED, err, errlen) != CS_OK)
        return CS_ERR;
    freeReplyObject(r);
    keys_stock(skey, keys_shard(id));
    r = rconn_command(rc, skey, "HSET %s %" PRId64 " %d", skey, id, ACTIVITY_STOCK_VOIDED);
    if (rconn_expect(rc, r, 0, "HSET", skey, err, errlen) != CS_OK)
        return CS_ERR;
    freeReplyObject(r);
    return CS_OK;
}

struct act_ids {
    int64_t *v;
    size_t n, cap;
};

static int act_id_row(void *arg, int ncols, char **cols)
{
    struct act_ids *ids = arg;
    int64_t id;
    if (ncols < 1 || cols[0] == NULL || cs_parse_id(cols[0], strlen(cols[0]), &id) != CS_OK)
        return CS_OK;
    if (ids->n == ids->cap) {
        ids->cap = ids->cap ? ids->cap * 2 : 16;
        ids->v = xrealloc(ids->v, ids->cap * sizeof(*ids->v));
    }
    ids->v[ids->n++] = id;
    return CS_OK;
}

/* Re-applies the Redis side of every revoke MySQL knows of that could still
 * matter, so MySQL never says voided while Redis sells. */
static int act_reapply_voids(struct mconn *mc, struct rconn *rc, int grace_s, char *err,
                             size_t errlen)
{
    struct act_ids ids = {0};
    struct mval p[] = {MV_INT(grace_s)};
    int ret = CS_OK;
    if (mconn_query(mc, SQL_VOIDED, p, 1, act_id_row, &ids) != CS_OK) {
        snprintf(err, errlen, "selecting revoked activities: %s", mc->errstr);
        free(ids.v);
        return CS_ERR;
    }
    for (size_t i = 0; i < ids.n && ret == CS_OK; i++)
        ret = act_apply_void(rc, ids.v[i], err, errlen);
    free(ids.v);
    return ret;
}

/* Drops from vec the activities whose id is in ACTIVITY:VOIDED: revoked
 * since the SELECT, they stay out of the list, and their stock field holds
 * the revoke's tombstone. */
static int act_drop_voided(struct rconn *rc, struct act_vec *vec, char *err, size_t errlen)
{
    int64_t *voided;
    size_t nvoided, kept = 0;

    if (act_voided_ids(rc, &voided, &nvoided, err, errlen) != CS_OK)
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
            vec->v[kept] = vec->v[i];
        }
        kept++;
    }
    vec->n = kept;
    free(voided);
    return CS_OK;
}

/* Tries at rewriting ACTIVITY:LIST before giving up to the next preheat:
 * each lost try means another writer published a newer MySQL read. */
#define ACT_LIST_TRIES 5

/* Rewrites ACTIVITY:LIST from a fresh MySQL read (generation first, then the
 * SELECT, then a write that holds only if no one wrote meanwhile), so the
 * list never goes back in time: every writer whose MySQL read is older than
 * the last write reads again. CS_ERR with a message in err. */
static int act_list_rewrite(struct mconn *mc, struct rconn *rc, int horizon_days, int grace_s,
                            char *err, size_t errlen)
{
    for (int tries = 0; tries < ACT_LIST_TRIES; tries++) {
        struct act_vec vec;
        long long gen;
        int stale = 0, ret;

        if (act_list_gen(rc, &gen, err, errlen) != CS_OK
            || act_select(mc, horizon_days, grace_s, 0, &vec, err, errlen) != CS_OK)
            return CS_ERR;
        ret = act_drop_voided(rc, &vec, err, errlen);
        if (ret == CS_OK)
            ret = act_write_list(rc, &vec, gen, &stale, err, errlen);
        act_vec_free(&vec);
        if (ret != CS_OK || !stale)
            return ret;
    }
    snprintf(err, errlen, "%s: %d writers came between", KEY_ACTIVITY_LIST, ACT_LIST_TRIES);
    return CS_ERR;
}

int activity_preheat(struct mconn *mc, struct rconn *rc, int horizon_days, int grace_s,
                     struct preheat_result *res, char *err, size_t errlen)
{
    struct act_vec vec;
    long long gen;
    int ret = CS_ERR, stale = 0;

    memset(res, 0, sizeof(*res));
    int64_t t0 = cs_mono_ms();
    if (act_list_gen(rc, &gen, err, errlen) != CS_OK
        || act_select(mc, horizon_days, grace_s, 0, &vec, err, errlen) != CS_OK)
        return CS_ERR;
    int64_t t1 = cs_mono_ms();
    if (act_reapply_voids(mc, rc, grace_s, err, errlen) != CS_OK ||
        act_drop_voided(rc, &vec, err, errlen) != CS_OK ||
        act_publish(mc, rc, &vec, res, err, errlen) != CS_OK)
        goto out;
    /* Written last, so every listed activity already has its stock field.
     * An admin change that wrote the list after our MySQL read wins: the
     * list is read again rather than put back. */
    if (act_write_list(rc, &vec, gen, &stale, err, errlen) != CS_OK
        || (stale && act_list_rewrite(mc, rc, horizon_days, grace_s, err, errlen) != CS_OK))
        goto out;
    res->loaded = (int)vec.n;
    res->select_ms = t1 - t0;
    res->write_ms = cs_mono_ms() - t1;
    ret = CS_OK;
out:
    act_vec_free(&vec);
    return ret;
}

int activity_preheat_one(struct mconn *mc, struct rconn *rc, int64_t id, int horizon_days,
                         int grace_s, struct preheat_result *res, char *err, size_t errlen)
{
    struct act_vec vec;
    int ret = CS_ERR;

    memset(res, 0, sizeof(*res));
    if (act_select(mc, horizon_days, grace_s, id, &vec, err, errlen) != CS_OK)
        return CS_ERR;
    if (act_drop_voided(rc, &vec, err, errlen) != CS_OK ||
        act_publish(mc, rc, &vec, res, err, errlen) != CS_OK)
        goto out;
    res->loaded = (int)vec.n;
    /* Its place in ACTIVITY:LIST (added, moved, or gone when it left the
     * horizon), after its stock field exists. */
    ret = act_list_rewrite(mc, rc, horizon_days, grace_s, err, errlen);
out:
    act_vec_free(&vec);
    return ret;
}

/* ---- revoke ---------------------------------------------------------------- */

static int act_found_row(void *arg, int ncols, char **cols)
{
    (void)ncols;
    (void)cols;
    *(int *)arg = 1;
    return CS_OK;
}

int activity_revoke(struct mconn *mc, struct rconn *rc, int64_t id, int horizon_days,
                    int *found, char *err, size_t errlen)
{
    struct mval p[] = {MV_INT(id)};

    *found = 0;
    if (mconn_query(mc, SQL_ACTIVITY_EXISTS, p, 1, act_found_row, found) != CS_OK) {
        snprintf(err, errlen, "%s", mc->errstr);
        return CS_ERR;
    }
    if (!*found)
        return CS_OK;
    /* Redis first: once MySQL says voided, nothing is on sale any more. A
     * failure after this point leaves Redis voided and MySQL not yet; a
     * repeat finishes it, and preheat never puts the stock back. */
    if (act_apply_void(rc, id, err, errlen) != CS_OK)
        return CS_ERR;

    if (mconn_begin(mc) != CS_OK)
        goto fail;
    /* The row lock orders this against coupon-sync, which takes the same
     * lock before it inserts coupons with the activity's current status. */
    int locked = 0;
    if (mconn_query(mc, SQL_REVOKE_LOCK, p, 1, act_found_row, &locked) != CS_OK
        || mconn_exec(mc, SQL_REVOKE_ACTIVITY, p, 1, NULL) != CS_OK
        || mconn_exec(mc, SQL_REVOKE_COUPONS, p, 1, NULL) != CS_OK || mconn_commit(mc) != CS_OK) {
        mconn_rollback(mc);
        goto fail;
    }

    /* The list is rewritten with the default grace; the next preheat
     * applies the configured one. */
    int ret = act_list_rewrite(mc, rc, horizon_days, ACTIVITY_GRACE_S, err, errlen);
    log_notice("activity %" PRId64 " revoked", id);
    return ret;

fail:
    snprintf(err, errlen, "%s", mc->errstr);
    return CS_ERR;
}
