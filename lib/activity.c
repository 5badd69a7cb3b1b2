/* activity.c - activities between MySQL and Redis: JSON form, preheat with restore, revoke,
 * the status job. */
#include "activity.h"
#include "cs.h"
#include "keys.h"
#include "log.h"
#include "mconn.h"
#include "rconn.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Pairs per HSET when rebuilding a seize list, so no single command gets huge. */
#define ACT_HSET_CHUNK 1000

/* Activities that ended within the last day stay listed, so a late seize gets
 * a clear ENDED rather than NO_SUCH_ACTIVITY. */
static const char SQL_PREHEAT[] =
    "SELECT id, name, coupon_name, coupon_amount, coupon_threshold, total_num, "
    "UNIX_TIMESTAMP(distribute_start_time)*1000, UNIX_TIMESTAMP(distribute_end_time)*1000, "
    "validity_days, status FROM activity "
    "WHERE status <> 4 AND distribute_end_time > NOW() - INTERVAL 1 DAY "
    "AND distribute_start_time < NOW() + INTERVAL ? DAY "
    "ORDER BY distribute_start_time, id";
/* Revoked activities that could still be on sale: preheat re-applies their
 * Redis side, so a revoke cut short after Redis lost it heals by itself. */
static const char SQL_VOIDED[] =
    "SELECT id FROM activity WHERE status = 4 AND distribute_end_time > NOW() - INTERVAL 1 DAY";
static const char SQL_ACTIVITY_EXISTS[] = "SELECT id FROM activity WHERE id = ?";
static const char SQL_COUPON_USERS[] =
    "SELECT user_id, CAST(UNIX_TIMESTAMP(seized_at)*1000 AS SIGNED) FROM coupon "
    "WHERE activity_id = ?";
static const char SQL_REVOKE_LOCK[] = "SELECT status FROM activity WHERE id = ? FOR UPDATE";
static const char SQL_REVOKE_ACTIVITY[] = "UPDATE activity SET status = 4 WHERE id = ?";
static const char SQL_REVOKE_COUPONS[] =
    "UPDATE coupon SET status = 4 WHERE activity_id = ? AND status = 1";
static const char SQL_STATUS_START[] =
    "UPDATE activity SET status = 2 WHERE status = 1 AND distribute_start_time <= NOW() "
    "AND distribute_end_time > NOW()";
static const char SQL_STATUS_END[] =
    "UPDATE activity SET status = 3 WHERE status IN (1,2) AND distribute_end_time <= NOW()";

/* ---- status and JSON form ------------------------------------------------ */

int activity_status_at(const struct activity *a, int64_t now_ms)
{
    if (a->status == ACT_VOIDED)
        return ACT_VOIDED;
    if (now_ms < a->start_ms)
        return ACT_NOT_STARTED;
    if (now_ms >= a->end_ms)
        return ACT_ENDED;
    return ACT_IN_PROGRESS;
}

const char *activity_status_name(int status)
{
    switch (status) {
    case ACT_NOT_STARTED:
        return "NOT_STARTED";
    case ACT_IN_PROGRESS:
        return "IN_PROGRESS";
    case ACT_ENDED:
        return "ENDED";
    case ACT_VOIDED:
        return "VOIDED";
    default:
        return "UNKNOWN";
    }
}

/* Copies src into dst[size] without cutting a UTF-8 sequence in half: MySQL
 * columns hold characters, the struct fields hold bytes. */
static void act_copy_text(char *dst, size_t size, const char *src)
{
    size_t n = src ? strlen(src) : 0;
    if (n >= size) {
        n = size - 1;
        while (n > 0 && ((unsigned char)src[n] & 0xC0) == 0x80)
            n--;
    }
    if (n > 0)
        memcpy(dst, src, n);
    dst[n] = '\0';
}

cJSON *activity_to_json(const struct activity *a)
{
    cJSON *o = cJSON_CreateObject();
    char id[24];
    /* Ids go up to 2^63-1, past what a double holds: "id" is written with
     * exact digits, and "idStr" carries them for readers (JavaScript, and
     * activity_from_json) that would round a number. Times stay below 2^53. */
    snprintf(id, sizeof(id), "%" PRId64, a->id);
    cJSON_AddItemToObject(o, "id", cJSON_CreateRaw(id));
    cJSON_AddStringToObject(o, "idStr", id);
    cJSON_AddStringToObject(o, "name", a->name);
    cJSON_AddStringToObject(o, "couponName", a->coupon_name);
    /* Money stays decimal text so no binary rounding creeps in. */
    cJSON_AddStringToObject(o, "couponAmount", a->coupon_amount);
    cJSON_AddStringToObject(o, "couponThreshold", a->coupon_threshold);
    cJSON_AddNumberToObject(o, "totalNum", (double)a->total_num);
    cJSON_AddNumberToObject(o, "startTime", (double)a->start_ms);
    cJSON_AddNumberToObject(o, "endTime", (double)a->end_ms);
    cJSON_AddNumberToObject(o, "validityDays", a->validity_days);
    cJSON_AddNumberToObject(o, "status", a->status);
    return o;
}

/* Reads an integral number field (a number, or a decimal string). */
static int act_json_int(const cJSON *obj, const char *name, int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (cJSON_IsNumber(v)) {
        if (v->valuedouble < -9.2e18 || v->valuedouble > 9.2e18)
            return CS_ERR;
        *out = (int64_t)v->valuedouble;
        return CS_OK;
    }
    if (cJSON_IsString(v) && v->valuestring[0] != '\0') {
        char *end;
        long long x = strtoll(v->valuestring, &end, 10);
        if (*end != '\0')
            return CS_ERR;
        *out = x;
        return CS_OK;
    }
    return CS_ERR;
}

/* Reads an optional text field; numbers are accepted for the money fields. */
static void act_json_text(const cJSON *obj, const char *name, char *dst, size_t size,
                          const char *dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (cJSON_IsString(v))
        act_copy_text(dst, size, v->valuestring);
    else if (cJSON_IsNumber(v))
        snprintf(dst, size, "%.2f", v->valuedouble);
    else
        act_copy_text(dst, size, dflt);
}

int activity_from_json(const cJSON *obj, struct activity *a)
{
    int64_t v;

    memset(a, 0, sizeof(*a));
    if (!cJSON_IsObject(obj))
        return CS_ERR;
    const cJSON *idstr = cJSON_GetObjectItemCaseSensitive(obj, "idStr");
    if (cJSON_IsString(idstr)) {
        if (cs_parse_id(idstr->valuestring, strlen(idstr->valuestring), &a->id) != CS_OK)
            return CS_ERR;
    } else if (act_json_int(obj, "id", &a->id) != CS_OK || a->id <= 0) {
        return CS_ERR;
    }
    if (act_json_int(obj, "totalNum", &a->total_num) != CS_OK)
        return CS_ERR;
    if (act_json_int(obj, "startTime", &a->start_ms) != CS_OK)
        return CS_ERR;
    if (act_json_int(obj, "endTime", &a->end_ms) != CS_OK)
        return CS_ERR;
    if (act_json_int(obj, "status", &v) != CS_OK || v < ACT_NOT_STARTED || v > ACT_VOIDED)
        return CS_ERR;
    a->status = (int)v;
    a->validity_days = act_json_int(obj, "validityDays", &v) == CS_OK ? (int)v : 0;
    act_json_text(obj, "name", a->name, sizeof(a->name), "");
    act_json_text(obj, "couponName", a->coupon_name, sizeof(a->coupon_name), "");
    act_json_text(obj, "couponAmount", a->coupon_amount, sizeof(a->coupon_amount), "0.00");
    act_json_text(obj, "couponThreshold", a->coupon_threshold, sizeof(a->coupon_threshold),
                  "0.00");
    return CS_OK;
}

int activity_list_parse(const char *json, size_t len, struct activity **out, size_t *n)
{
    cJSON *root = cJSON_ParseWithLength(json, len);
    int rc = CS_ERR;
    struct activity *arr = NULL;
    size_t cnt = 0;

    if (root == NULL || !cJSON_IsArray(root))
        goto out;
    arr = xcalloc((size_t)cJSON_GetArraySize(root) + 1, sizeof(*arr));
    const cJSON *el;
    cJSON_ArrayForEach(el, root)
    {
        if (activity_from_json(el, &arr[cnt]) != CS_OK)
            goto out;
        cnt++;
    }
    *out = arr;
    *n = cnt;
    arr = NULL;
    rc = CS_OK;
out:
    free(arr);
    cJSON_Delete(root);
    return rc;
}

/* ---- reading activities from MySQL --------------------------------------- */

struct act_vec {
    struct activity *v;
    size_t n, cap;
};

static int64_t act_atoll(const char *s)
{
    return s ? strtoll(s, NULL, 10) : 0;
}

/* Row of SQL_PREHEAT. */
static int act_row(void *arg, int ncols, char **cols)
{
    struct act_vec *vec = arg;
    if (ncols != 10)
        return CS_ERR;
    if (vec->n == vec->cap) {
        vec->cap = vec->cap ? vec->cap * 2 : 16;
        vec->v = xrealloc(vec->v, vec->cap * sizeof(*vec->v));
    }
    struct activity *a = &vec->v[vec->n++];
    memset(a, 0, sizeof(*a));
    a->id = act_atoll(cols[0]);
    act_copy_text(a->name, sizeof(a->name), cols[1]);
    act_copy_text(a->coupon_name, sizeof(a->coupon_name), cols[2]);
    act_copy_text(a->coupon_amount, sizeof(a->coupon_amount), cols[3] ? cols[3] : "0.00");
    act_copy_text(a->coupon_threshold, sizeof(a->coupon_threshold),
                  cols[4] ? cols[4] : "0.00");
    a->total_num = act_atoll(cols[5]);
    a->start_ms = act_atoll(cols[6]);
    a->end_ms = act_atoll(cols[7]);
    a->validity_days = (int)act_atoll(cols[8]);
    a->status = (int)act_atoll(cols[9]);
    return CS_OK;
}

/* Selects the activities preheat serves. On CS_OK vec holds them (caller frees v). */
static int act_select(struct mconn *mc, int horizon_days, struct act_vec *vec, char *err,
                      size_t errlen)
{
    struct mval p[] = {MV_INT(horizon_days)};
    memset(vec, 0, sizeof(*vec));
    if (mconn_query(mc, SQL_PREHEAT, p, 1, act_row, vec) != CS_OK) {
        snprintf(err, errlen, "selecting activities: %s", mc->errstr);
        free(vec->v);
        vec->v = NULL;
        vec->n = 0;
        return CS_ERR;
    }
    return CS_OK;
}

/* SET ACTIVITY:LIST to the JSON array of vec. */
static int act_write_list(struct rconn *rc, const struct act_vec *vec, char *err, size_t errlen)
{
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; i < vec->n; i++)
        cJSON_AddItemToArray(arr, activity_to_json(&vec->v[i]));
    char *json = cJSON_PrintUnformatted(arr);
    cJSON_Delete(arr);
    if (json == NULL) {
        snprintf(err, errlen, "cJSON_PrintUnformatted() failed");
        return CS_ERR;
    }
    redisReply *r = rconn_command(rc, KEY_ACTIVITY_LIST, "SET %s %s", KEY_ACTIVITY_LIST, json);
    free(json);
    if (r == NULL) {
        snprintf(err, errlen, "SET %s: %s", KEY_ACTIVITY_LIST, rc->errstr);
        return CS_ERR;
    }
    int ok = r->type != REDIS_REPLY_ERROR;
    if (!ok)
        snprintf(err, errlen, "SET %s: %s", KEY_ACTIVITY_LIST, r->str);
    freeReplyObject(r);
    return ok ? CS_OK : CS_ERR;
}

/* ---- restore: seize list and stock after Redis lost its data -------------- */

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
    if (r == NULL || r->type == REDIS_REPLY_ERROR) {
        snprintf(h->err, h->errlen, "HSET %s: %s", h->key, r ? r->str : h->rc->errstr);
        h->failed = 1;
    }
    if (r != NULL)
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
        redisReply *r = rconn_command(rc, qkey, "HSCAN %s %s MATCH %s COUNT 1000", qkey,
                                      cursor, match);
        if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
            snprintf(err, errlen, "HSCAN %s: %s", qkey,
                     r == NULL ? rc->errstr : r->type == REDIS_REPLY_ERROR ? r->str
                                                                          : "unexpected reply");
            if (r != NULL)
                freeReplyObject(r);
            return CS_ERR;
        }
        snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
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

/*
 * Creates the stock field of a when absent. When MySQL or the queue already
 * hold coupons of it (Redis lost its data), the seize list is rebuilt first and
 * the stock becomes total - in MySQL - queued. *created / *restored are set
 * when this call created the field.
 */
static int act_ensure_stock(struct mconn *mc, struct rconn *rc, const struct activity *a,
                            int *created, int *restored, char *err, size_t errlen)
{
    char skey[KEYS_MAX], field[24];
    int ret = CS_ERR;
    struct act_hset h;

    *created = *restored = 0;
    keys_stock(skey, keys_shard(a->id));
    snprintf(field, sizeof(field), "%" PRId64, a->id);

    redisReply *r = rconn_command(rc, skey, "HEXISTS %s %s", skey, field);
    if (r == NULL || r->type != REDIS_REPLY_INTEGER) {
        snprintf(err, errlen, "HEXISTS %s: %s", skey, r ? "unexpected reply" : rc->errstr);
        if (r != NULL)
            freeReplyObject(r);
        return CS_ERR;
    }
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

    int64_t stock = a->total_num - in_mysql - queued;
    if (stock < 0)
        stock = 0;
    r = rconn_command(rc, skey, "HSETNX %s %s %" PRId64, skey, field, stock);
    if (r == NULL || r->type != REDIS_REPLY_INTEGER) {
        snprintf(err, errlen, "HSETNX %s: %s", skey, r ? "unexpected reply" : rc->errstr);
        if (r != NULL)
            freeReplyObject(r);
        goto out;
    }
    *created = r->integer == 1;
    freeReplyObject(r);
    if (*created && in_mysql + queued > 0) {
        *restored = 1;
        log_notice("activity %" PRId64 ": stock restored to %" PRId64 " (total %" PRId64
                   ", %" PRId64 " coupons in MySQL, %" PRId64 " queued)",
                   a->id, stock, a->total_num, in_mysql, queued);
    }
    ret = CS_OK;
out:
    act_hset_done(&h);
    return ret;
}

/* Ids in ACTIVITY:VOIDED: revoked activities never get a stock field again. */
static int act_is_voided(struct rconn *rc, int64_t id, int *voided, char *err, size_t errlen)
{
    redisReply *r = rconn_command(rc, KEY_ACTIVITY_VOIDED, "SISMEMBER %s %" PRId64,
                                  KEY_ACTIVITY_VOIDED, id);
    if (r == NULL || r->type != REDIS_REPLY_INTEGER) {
        snprintf(err, errlen, "SISMEMBER %s: %s", KEY_ACTIVITY_VOIDED,
                 r ? "unexpected reply" : rc->errstr);
        if (r != NULL)
            freeReplyObject(r);
        return CS_ERR;
    }
    *voided = r->integer == 1;
    freeReplyObject(r);
    return CS_OK;
}

/* Sets COUPON:ACTIVITY:WINDOW:{i} of a to its MySQL window (HSET: an admin
 * may have moved the end). */
static int act_write_window(struct rconn *rc, const struct activity *a, char *err,
                            size_t errlen)
{
    char key[KEYS_MAX];
    keys_window(key, keys_shard(a->id));
    redisReply *r = rconn_command(rc, key, "HSET %s %" PRId64 " %" PRId64 ",%" PRId64, key,
                                  a->id, a->start_ms, a->end_ms);
    if (r == NULL || r->type == REDIS_REPLY_ERROR) {
        snprintf(err, errlen, "HSET %s: %s", key, r ? r->str : rc->errstr);
        if (r != NULL)
            freeReplyObject(r);
        return CS_ERR;
    }
    freeReplyObject(r);
    return CS_OK;
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
    if (r == NULL || r->type == REDIS_REPLY_ERROR) {
        snprintf(err, errlen, "SADD %s: %s", KEY_ACTIVITY_VOIDED, r ? r->str : rc->errstr);
        if (r != NULL)
            freeReplyObject(r);
        return CS_ERR;
    }
    freeReplyObject(r);
    keys_stock(skey, keys_shard(id));
    r = rconn_command(rc, skey, "HSET %s %" PRId64 " %d", skey, id, ACTIVITY_STOCK_VOIDED);
    if (r == NULL || r->type == REDIS_REPLY_ERROR) {
        snprintf(err, errlen, "HSET %s: %s", skey, r ? r->str : rc->errstr);
        if (r != NULL)
            freeReplyObject(r);
        return CS_ERR;
    }
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
static int act_reapply_voids(struct mconn *mc, struct rconn *rc, char *err, size_t errlen)
{
    struct act_ids ids = {0};
    int ret = CS_OK;
    if (mconn_query(mc, SQL_VOIDED, NULL, 0, act_id_row, &ids) != CS_OK) {
        snprintf(err, errlen, "selecting revoked activities: %s", mc->errstr);
        free(ids.v);
        return CS_ERR;
    }
    for (size_t i = 0; i < ids.n && ret == CS_OK; i++)
        ret = act_apply_void(rc, ids.v[i], err, errlen);
    free(ids.v);
    return ret;
}

int activity_preheat(struct mconn *mc, struct rconn *rc, int horizon_days,
                     struct preheat_result *res, char *err, size_t errlen)
{
    struct act_vec vec;
    int ret = CS_ERR;

    memset(res, 0, sizeof(*res));
    if (act_select(mc, horizon_days, &vec, err, errlen) != CS_OK)
        return CS_ERR;
    if (act_reapply_voids(mc, rc, err, errlen) != CS_OK)
        goto out;
    size_t kept = 0;
    for (size_t i = 0; i < vec.n; i++) {
        int created, restored, voided;
        /* An activity revoked since the SELECT stays out of the list; its
         * stock field holds the revoke's tombstone, so HSETNX below could
         * not bring the stock back either way. */
        if (act_is_voided(rc, vec.v[i].id, &voided, err, errlen) != CS_OK)
            goto out;
        if (voided)
            continue;
        /* The window before the stock: the script refuses an activity
         * without one, so the stock field never opens a sale by itself. */
        if (act_write_window(rc, &vec.v[i], err, errlen) != CS_OK
            || act_ensure_stock(mc, rc, &vec.v[i], &created, &restored, err, errlen) != CS_OK)
            goto out;
        res->created += created;
        res->restored += restored;
        vec.v[kept++] = vec.v[i];
    }
    vec.n = kept;
    /* Written last, so every listed activity already has its stock field. */
    if (act_write_list(rc, &vec, err, errlen) != CS_OK)
        goto out;
    res->loaded = (int)vec.n;
    ret = CS_OK;
out:
    free(vec.v);
    return ret;
}

/* ---- revoke and the status job --------------------------------------------- */

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

    struct act_vec vec;
    if (act_select(mc, horizon_days, &vec, err, errlen) != CS_OK)
        return CS_ERR;
    int ret = act_write_list(rc, &vec, err, errlen);
    free(vec.v);
    log_notice("activity %" PRId64 " revoked", id);
    return ret;

fail:
    snprintf(err, errlen, "%s", mc->errstr);
    return CS_ERR;
}

int activity_advance_status(struct mconn *mc, uint64_t *changed, char *err, size_t errlen)
{
    uint64_t a = 0, b = 0;

    *changed = 0;
    if (mconn_exec(mc, SQL_STATUS_START, NULL, 0, &a) != CS_OK ||
        mconn_exec(mc, SQL_STATUS_END, NULL, 0, &b) != CS_OK) {
        snprintf(err, errlen, "status job: %s", mc->errstr);
        return CS_ERR;
    }
    *changed = a + b;
    return CS_OK;
}
