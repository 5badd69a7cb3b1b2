/* api_activity.c - /market/admin/coupon/activity: create, read, page and update
 * activities (stock top-up included) over HTTP. */
#include "actinput.h"
#include "activity.h"
#include "activity_db.h"
#include "node/listcopy.h"
#include "api.h"
#include "conf.h"
#include "cs.h"
#include "keys.h"
#include "log.h"
#include "mconn.h"
#include "node/meta.h"
#include "preheat.h"
#include "req/req.h"
#include "shm.h"
#include "node/ctx.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ACT_PAGE_DEFAULT 20
#define ACT_PAGE_MAX 200

/* ---- Redis ----------------------------------------------------------------------- */

enum act_stock { STOCK_UNKNOWN, STOCK_ABSENT, STOCK_VOIDED, STOCK_PRESENT };

/* The stock fields of n activities in one pipelined round trip. CS_ERR when
 * Redis could not be read (every kind stays STOCK_UNKNOWN). */
static int act_redis_stock(struct node_ctx *nc, const struct activity_row *rows, size_t n,
                           enum act_stock *kind, int64_t *val)
{
    struct activity_stock *s = xmalloc(n * sizeof(*s));

    for (size_t i = 0; i < n; i++)
        s[i] = (struct activity_stock){.id = rows[i].a.id};
    int ret = activity_stock_read(nc->rc, s, n);
    for (size_t i = 0; i < n; i++) {
        val[i] = s[i].value;
        if (ret != CS_OK)
            kind[i] = STOCK_UNKNOWN;
        else if (s[i].state == ACT_STOCK_ABSENT)
            kind[i] = STOCK_ABSENT;
        else
            kind[i] = s[i].value < 0 ? STOCK_VOIDED : STOCK_PRESENT;
    }
    free(s);
    return ret;
}

/* Entries waiting in each shard's sync queue (HLEN, pipelined); -1 each when
 * Redis could not be read. Returns the sum (or -1). */
static int64_t act_queue_depth(struct node_ctx *nc, int64_t depth[KEYS_SHARDS])
{
    char key[KEYS_MAX];
    int sent = 0, ok = 1;
    int64_t sum = 0;

    for (int i = 0; i < KEYS_SHARDS; i++)
        depth[i] = -1;
    for (; sent < KEYS_SHARDS; sent++) {
        keys_queue(key, sent);
        if (rconn_append(nc->rc, key, "HLEN %s", key) != CS_OK) {
            ok = 0;
            break;
        }
    }
    for (int i = 0; ok && i < sent; i++) {
        redisReply *rep;
        if (rconn_get_reply(nc->rc, &rep) != CS_OK) {
            ok = 0;
            break;
        }
        if (rep->type == REDIS_REPLY_INTEGER) {
            depth[i] = rep->integer;
            sum += rep->integer;
        } else {
            ok = 0;
        }
        freeReplyObject(rep);
    }
    return ok ? sum : -1;
}

/* Brings Redis in line with MySQL after a change of activity ID: what
 * preheat writes for it (window, metadata, a stock field still absent or
 * moved by a change of total, its place in ACTIVITY:LIST), judged against
 * the version in Redis in one script, after the commit. CS_OK or CS_ERR
 * (logged); *res says what was written. */
static int act_refresh(struct node_ctx *nc, int64_t id, struct preheat_result *res)
{
    char err[256];
    /* Its own connection, with coupon-sync's longer timeout: the list it
     * rewrites may be megabytes, more than a seize may wait for. */
    struct rconn *lrc = rconn_new_conf(nc->conf, nc->conf->sync_redis_timeout_ms);
    int rc = activity_preheat_one(nc->mc, lrc, id, nc->conf->preheat_horizon_days,
                                  nc->conf->sync_cleanup_grace_s, res, err, sizeof(err));
    rconn_free(lrc);
    if (rc != CS_OK)
        log_error("preheat after an activity change failed: %s", err);
    meta_invalidate_node(nc->shm);
    listcopy_invalidate(nc->conf, nc->shm);
    return rc;
}

/* ---- answers --------------------------------------------------------------------- */

/* Adds "coupons": {unused, used, expired, returned, voided} of activity id
 * to o (null when MySQL could not tell). */
static void act_add_counts(struct node_ctx *nc, int64_t id, cJSON *o)
{
    struct activity_counts k;
    if (activity_db_counts(nc->mc, id, &k) != CS_OK) {
        cJSON_AddNullToObject(o, "coupons");
        return;
    }
    cJSON *c = cJSON_AddObjectToObject(o, "coupons");
    cJSON_AddNumberToObject(c, "unused", (double)k.by_status[1]);
    cJSON_AddNumberToObject(c, "used", (double)k.by_status[2]);
    cJSON_AddNumberToObject(c, "expired", (double)k.by_status[3]);
    cJSON_AddNumberToObject(c, "returned", (double)k.returned);
    cJSON_AddNumberToObject(c, "voided", (double)k.by_status[4]);
}

static cJSON *act_json(const struct activity_row *r, int64_t now_ms, enum act_stock kind,
                       int64_t stock)
{
    char t[32];
    cJSON *o = activity_to_json(&r->a);
    cJSON_ReplaceItemInObjectCaseSensitive(
        o, "status", cJSON_CreateString(activity_status_name(activity_status_at(&r->a, now_ms))));
    cJSON_AddNumberToObject(o, "couponType", r->coupon_type);
    cJSON_AddNumberToObject(o, "stockNum", (double)r->stock_num);
    actinput_format_time(r->a.start_ms / 1000, t, sizeof(t));
    cJSON_AddStringToObject(o, "distributeStartTime", t);
    actinput_format_time(r->a.end_ms / 1000, t, sizeof(t));
    cJSON_AddStringToObject(o, "distributeEndTime", t);
    cJSON_AddNumberToObject(o, "createdAt", (double)r->created_ms);
    /* remaining: Redis' live stock (null when not preheated or unknown). */
    if (kind == STOCK_PRESENT)
        cJSON_AddNumberToObject(o, "remaining", (double)stock);
    else if (kind == STOCK_VOIDED)
        cJSON_AddNumberToObject(o, "remaining", 0);
    else
        cJSON_AddNullToObject(o, "remaining");
    cJSON_AddBoolToObject(o, "preheated", kind == STOCK_PRESENT || kind == STOCK_VOIDED);
    return o;
}

static cJSON *act_root(const char *msg)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "code", "OK");
    cJSON_AddStringToObject(root, "msg", msg);
    cJSON_AddNumberToObject(root, "now", (double)cs_now_ms());
    return root;
}

static void act_send(struct req *r, int status, const char *msg, cJSON *root)
{
    char *txt = cJSON_PrintUnformatted(root);
    r->code = CODE_OK;
    snprintf(r->msg, sizeof(r->msg), "%s", msg);
    http_reply_raw(r->out, status, "application/json; charset=utf-8", txt, strlen(txt), NULL);
    cJSON_free(txt);
    cJSON_Delete(root);
}

static void act_bad(struct req *r, const struct actinput_err *e)
{
    char extra[64];
    if (e->field != NULL && e->field[0] != '\0') {
        snprintf(extra, sizeof(extra), "\"field\":\"%s\"", e->field);
        req_reply(r, CODE_BAD_REQUEST, e->msg, extra, 0);
    } else {
        req_reply(r, CODE_BAD_REQUEST, e->msg, NULL, 0);
    }
}

static void act_bad_field(struct req *r, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void act_bad_field(struct req *r, const char *field, const char *fmt, ...)
{
    struct actinput_err e = {.field = field};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.msg, sizeof(e.msg), fmt, ap);
    va_end(ap);
    act_bad(r, &e);
}

static void act_mysql_down(struct node_ctx *nc, struct req *r, const char *what)
{
    req_mysql_fail(r, nc->mc, what, NULL);
}

/* Answers one activity as it is now: 200 (or 201 after a create). */
static void act_answer_one(struct node_ctx *nc, struct req *r, int status, const char *msg,
                           int64_t id, cJSON *root)
{
    struct activity_row row;
    enum act_stock kind;
    int64_t stock;
    int found;

    if (activity_db_get(nc->mc, id, 0, &row, &found) != CS_OK) {
        cJSON_Delete(root);
        act_mysql_down(nc, r, "reading an activity");
        return;
    }
    if (!found) {
        cJSON_Delete(root);
        req_reply(r, CODE_NO_SUCH_ACTIVITY, NULL, NULL, 0);
        return;
    }
    int stale = act_redis_stock(nc, &row, 1, &kind, &stock) != CS_OK;
    if (root == NULL)
        root = act_root(msg);
    cJSON *one = act_json(&row, cs_now_ms(), kind, stock);
    act_add_counts(nc, id, one);
    cJSON_AddItemToObject(root, "activity", one);
    cJSON_AddBoolToObject(root, "stale", stale);
    act_send(r, status, msg, root);
}

/* ---- GET ------------------------------------------------------------------------- */

static void act_get(struct node_ctx *nc, struct req *r)
{
    static const char *const bnames[] = {"closed", "open", "half-open"};
    char idbuf[32];
    int64_t id, page, size, total = 0, depth[KEYS_SHARDS];

    if (http_query_param(r->query, "id", idbuf, sizeof(idbuf)) == CS_OK) {
        if (cs_parse_id(idbuf, strlen(idbuf), &id) != CS_OK) {
            act_bad_field(r, "id", "id must be an integer 1..9223372036854775807");
            return;
        }
        act_answer_one(nc, r, 200, "ok", id, NULL);
        return;
    }
    if (http_query_int(r->query, "page", 1, 1, 1000000, &page) != CS_OK) {
        act_bad_field(r, "page", "page must be an integer 1..1000000");
        return;
    }
    if (http_query_int(r->query, "size", ACT_PAGE_DEFAULT, 1, ACT_PAGE_MAX, &size) != CS_OK) {
        act_bad_field(r, "size", "size must be an integer 1..%d", ACT_PAGE_MAX);
        return;
    }
    struct activity_row *rows;
    size_t n;
    if (activity_db_page(nc->mc, page, size, &rows, &n, &total) != CS_OK) {
        act_mysql_down(nc, r, "paging activities");
        return;
    }
    enum act_stock *kind = xmalloc(sizeof(*kind) * (n + 1));
    int64_t *stock = xmalloc(sizeof(*stock) * (n + 1));
    int stale = act_redis_stock(nc, rows, n, kind, stock) != CS_OK;
    int64_t qsum = stale ? -1 : act_queue_depth(nc, depth);

    cJSON *root = act_root("ok");
    cJSON_AddNumberToObject(root, "page", (double)page);
    cJSON_AddNumberToObject(root, "size", (double)size);
    cJSON_AddNumberToObject(root, "total", (double)total);
    cJSON *arr = cJSON_AddArrayToObject(root, "activities");
    int64_t now = cs_now_ms();
    for (size_t i = 0; i < n; i++) {
        cJSON *o = act_json(&rows[i], now, kind[i], stock[i]);
        act_add_counts(nc, rows[i].a.id, o);
        cJSON_AddItemToArray(arr, o);
    }
    /* What an operator watches besides the stock: the sync backlog and the
     * node's Redis breaker. */
    if (qsum >= 0) {
        cJSON_AddNumberToObject(root, "queueDepth", (double)qsum);
        cJSON *q = cJSON_AddArrayToObject(root, "queue");
        for (int i = 0; i < KEYS_SHARDS; i++)
            cJSON_AddItemToArray(q, cJSON_CreateNumber((double)depth[i]));
    } else {
        cJSON_AddNullToObject(root, "queueDepth");
    }
    int bstate = atomic_load(&nc->shm->breaker.state);
    cJSON_AddStringToObject(root, "breaker", bnames[bstate >= 0 && bstate < 3 ? bstate : 1]);
    cJSON_AddBoolToObject(root, "stale", stale || qsum < 0);
    free(kind);
    free(stock);
    free(rows);
    act_send(r, 200, "ok", root);
}

/* ---- POST: create ---------------------------------------------------------------- */

static void act_create(struct node_ctx *nc, struct req *r)
{
    struct actinput in;
    struct actinput_err e;
    static const unsigned required[] = {ACTIN_NAME, ACTIN_TOTAL, ACTIN_START, ACTIN_END};

    const char *why;

    if (req_read_body(r) != CS_OK)
        return;
    /* No string may hold NUL: cJSON would cut "a\u0000b" to "a". */
    if (http_json_check(r->body, r->body_len, &why) != CS_OK) {
        req_reply(r, CODE_BAD_REQUEST, why, NULL, 0);
        return;
    }
    cJSON *doc = cJSON_ParseWithLengthOpts(r->body, r->body_len + 1, NULL, 1);
    if (doc == NULL) {
        req_reply(r, CODE_BAD_REQUEST, "body is not valid JSON", NULL, 0);
        return;
    }
    int rc = actinput_parse(doc, 0, &in, &e);
    cJSON_Delete(doc);
    if (rc != CS_OK) {
        act_bad(r, &e);
        return;
    }
    for (size_t i = 0; i < CS_ARRAY_LEN(required); i++)
        if (!(in.set & required[i])) {
            act_bad_field(r, actinput_field(required[i]), "%s is required",
                          actinput_field(required[i]));
            return;
        }
    if (in.end_s <= in.start_s) {
        act_bad_field(r, "distributeEndTime",
                      "distributeEndTime must be after distributeStartTime");
        return;
    }
    if (!(in.set & ACTIN_COUPON_TYPE))
        in.coupon_type = 1;
    if (!(in.set & ACTIN_COUPON_AMOUNT))
        snprintf(in.coupon_amount, sizeof(in.coupon_amount), "0.00");
    if (!(in.set & ACTIN_COUPON_THRESHOLD))
        snprintf(in.coupon_threshold, sizeof(in.coupon_threshold), "0.00");
    if (!(in.set & ACTIN_VALIDITY))
        in.validity_days = 30;

    int64_t id;
    if (activity_db_insert(nc->mc, &in, &id) != CS_OK) {
        act_mysql_down(nc, r, "creating an activity");
        return;
    }
    if (id <= 0) {
        /* AUTO_INCREMENT went past 2^63-1: an id no client could name. */
        log_error("created activity has an id beyond 2^63-1; refusing to serve it");
        req_reply(r, CODE_INTERNAL_ERROR, "activity ids are exhausted", NULL, 0);
        return;
    }
    r->audit_id = id;
    log_notice("activity %" PRId64 " created by admin %" PRId64 ": %" PRId64 " coupons",
               id, r->who.user_id, in.total_num);
    struct preheat_result res;
    int preheated = act_refresh(nc, id, &res) == CS_OK;

    /* The new id at the top as well, exact and as a string. */
    char idtxt[24];
    snprintf(idtxt, sizeof(idtxt), "%" PRId64, id);
    cJSON *root = act_root("activity created");
    cJSON_AddItemToObject(root, "id", cJSON_CreateRaw(idtxt));
    cJSON_AddStringToObject(root, "idStr", idtxt);
    cJSON_AddBoolToObject(root, "preheatOk", preheated);
    act_answer_one(nc, r, 201, "activity created", id, root);
}

/* ---- PUT: update and top-up -------------------------------------------------------- */

/*
 * The order of a stock change, so that no moment ever has more coupons on
 * sale in Redis than MySQL counts (total = stock + coupons in MySQL at every
 * moment; Redis stock + queued + coupons <= total, equal again at the end):
 *   1. lock the row, check the state, UPDATE total and stock by delta;
 *   2. while the lock holds, read whether Redis has the stock field yet;
 *   3. COMMIT;
 *   4. field present: HINCRBY it (by script: never the revoke tombstone);
 *      field absent: leave it - preheat sets it from the new total.
 * Redis never runs ahead of MySQL: coupon-sync could otherwise write coupons
 * that MySQL's stock cannot cover. Reading presence before the COMMIT
 * means a preheat that sees the new total cannot be topped up a second time.
 */
/* The audit trail calls a PUT whose only member besides "id" is "addStock" a
 * top-up, whether or not it is then accepted. */
static int act_is_topup(const char *body, size_t len)
{
    cJSON *doc = cJSON_ParseWithLengthOpts(body, len + 1, NULL, 1);
    const cJSON *obj = cJSON_IsObject(doc) ? doc : NULL, *m;
    int add = 0, other = 0;
    cJSON_ArrayForEach(m, obj)
    {
        if (strcmp(m->string, "addStock") == 0)
            add++;
        else if (strcmp(m->string, "id") != 0)
            other++;
    }
    cJSON_Delete(doc);
    return add == 1 && other == 0;
}

/* Why an update is refused, answered once its transaction is rolled back. */
struct act_refusal {
    enum cs_code code;         /* 0: not refused; CODE_BAD_REQUEST: e names the field */
    struct actinput_err e;     /* the field and message (or the message alone) */
    int retry_after_s;
    int mysql_down;            /* MySQL failed: act_mysql_down() */
};

static int act_refuse_field(struct act_refusal *no, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int act_refuse_field(struct act_refusal *no, const char *field, const char *fmt, ...)
{
    va_list ap;
    no->code = CODE_BAD_REQUEST;
    no->e.field = field;
    va_start(ap, fmt);
    vsnprintf(no->e.msg, sizeof(no->e.msg), fmt, ap);
    va_end(ap);
    return CS_ERR;
}

static int act_refuse(struct act_refusal *no, enum cs_code code, const char *msg, int retry_s)
{
    no->code = code;
    snprintf(no->e.msg, sizeof(no->e.msg), "%s", msg ? msg : "");
    no->retry_after_s = retry_s;
    return CS_ERR;
}

static void act_refusal_answer(struct node_ctx *nc, struct req *r, const struct act_refusal *no,
                               const char *what)
{
    if (no->mysql_down)
        act_mysql_down(nc, r, what);
    else if (no->code == CODE_BAD_REQUEST)
        act_bad(r, &no->e);
    else
        req_reply(r, no->code, no->e.msg[0] ? no->e.msg : NULL, NULL, no->retry_after_s);
}

/* What an accepted update changes: the fields (ACTIN_* bits), the stock by
 * delta, and what Redis held of the stock before (for the answer). */
struct act_change {
    struct activity_change c;
    enum act_stock kind;
    int64_t rstock;
};

/*
 * The checks of an update against the row locked for it: the rules of a
 * change (activity_change_rules()) and, when the stock moves, the total
 * against what Redis has granted. CS_OK with *c filled, else CS_ERR with
 * *no saying why; nothing answered, nothing written.
 */
static int act_update_check(struct node_ctx *nc, const struct actinput *in,
                            const struct activity_row *row, struct act_change *c,
                            struct act_refusal *no)
{
    switch (activity_change_rules(in, row, &c->c, &no->e)) {
    case ACTIVITY_CHANGE_OK:
        break;
    case ACTIVITY_CHANGE_VOIDED:
        no->code = CODE_VOIDED; /* no->e.msg says why */
        return CS_ERR;
    case ACTIVITY_CHANGE_ENDED:
        no->code = CODE_ENDED;
        return CS_ERR;
    case ACTIVITY_CHANGE_BAD:
        no->code = CODE_BAD_REQUEST;
        return CS_ERR;
    }
    c->kind = STOCK_UNKNOWN;
    c->rstock = 0;
    if (c->c.delta != 0) {
        if (act_redis_stock(nc, row, 1, &c->kind, &c->rstock) != CS_OK) {
            log_error("top-up of activity %" PRId64 ": Redis unreadable: %s", row->a.id,
                      nc->rc->errstr);
            return act_refuse(no, CODE_UNAVAILABLE, "Redis unavailable: nothing was changed",
                              5);
        }
        if (c->kind == STOCK_PRESENT && c->rstock + c->c.delta < 0)
            return act_refuse_field(no, "totalNum",
                                    "totalNum is below what Redis has already granted");
    }
    return CS_OK;
}

/* The body of an update: its id and the fields it changes. CS_OK, else
 * CS_ERR after answering 400. */
static int act_update_parse(struct req *r, struct actinput *in, int64_t *id)
{
    struct actinput_err e;
    const char *why;

    if (req_read_body(r) != CS_OK)
        return CS_ERR;
    r->audit_action = act_is_topup(r->body, r->body_len) ? "topup" : "update";
    if (http_parse_id_body(r->body, r->body_len, id, &why) != CS_OK) {
        act_bad_field(r, "id", "%s", why);
        return CS_ERR;
    }
    r->audit_id = *id;
    if (http_json_check(r->body, r->body_len, &why) != CS_OK) {
        req_reply(r, CODE_BAD_REQUEST, why, NULL, 0);
        return CS_ERR;
    }
    cJSON *doc = cJSON_ParseWithLengthOpts(r->body, r->body_len + 1, NULL, 1);
    int rc = actinput_parse(doc, 1, in, &e);
    cJSON_Delete(doc);
    if (rc != CS_OK) {
        act_bad(r, &e);
        return CS_ERR;
    }
    if (in->set == 0) {
        act_bad_field(r, "", "nothing to change: give at least one field besides id");
        return CS_ERR;
    }
    if ((in->set & ACTIN_TOTAL) && (in->set & ACTIN_ADD)) {
        act_bad_field(r, "addStock", "give totalNum or addStock, not both");
        return CS_ERR;
    }

    return CS_OK;
}

/* What the answer says of the Redis stock after an update that moved the
 * stock by delta (the refresh preheated, with res, or not; kind what Redis
 * held before). */
static const char *act_update_note(int64_t id, int64_t delta, int preheated,
                                   const struct preheat_result *res, enum act_stock kind)
{
    if (delta == 0)
        return "unchanged";
    if (!preheated) {
        log_error("activity %" PRId64 ": MySQL stock moved by %+" PRId64
                  " but Redis was not reached; the next preheat pass moves the Redis "
                  "stock (POST /market/admin/coupon/preheat to do it now)", id, delta);
        return "failed";
    }
    if (res->clamped > 0) {
        log_error("activity %" PRId64 ": the total fell below what Redis had granted; "
                  "Redis stock held at 0", id);
        return "failed";
    }
    if (res->adjusted > 0)
        return "updated";
    if (res->created > 0)
        return "not preheated"; /* absent until now: made from MySQL's new total */
    if (kind == STOCK_VOIDED)
        return "revoked";
    if (res->stale > 0 || res->written > 0)
        return "updated"; /* another writer of this version (a preheat pass) moved it first */
    return "not preheated";
}

static void act_update(struct node_ctx *nc, struct req *r)
{
    struct actinput in;
    struct activity_row row;
    int64_t id;
    int found;

    if (act_update_parse(r, &in, &id) != CS_OK)
        return;

    if (mconn_begin(nc->mc) != CS_OK) {
        act_mysql_down(nc, r, "updating an activity");
        return;
    }
    /* Checks, then the write; every refusal rolls back here, once. */
    struct act_refusal no = {.code = 0};
    struct act_change c;
    if (activity_db_get(nc->mc, id, 1, &row, &found) != CS_OK)
        no.mysql_down = 1;
    else if (!found)
        act_refuse(&no, CODE_NO_SUCH_ACTIVITY, NULL, 0);
    else if (act_update_check(nc, &in, &row, &c, &no) == CS_OK
             && activity_db_update(nc->mc, &in, &c.c, id) != CS_OK)
        no.mysql_down = 1;
    if (no.mysql_down || no.code != 0) {
        mconn_rollback(nc->mc);
        act_refusal_answer(nc, r, &no, "updating an activity");
        return;
    }
    int64_t delta = c.c.delta;
    enum act_stock kind = c.kind;
    char pause[48];
    snprintf(pause, sizeof(pause), "update-commit:%" PRId64, id);
    cs_pause_point(pause);
    if (mconn_commit(nc->mc) != CS_OK) {
        /* A lost connection at COMMIT leaves the outcome unknown; Redis was
         * not touched, so a repeat after a GET is safe. */
        log_error("COMMIT of the update of activity %" PRId64 " failed: %s", id,
                  nc->mc->errstr);
        req_reply(r, CODE_UNAVAILABLE,
                  "MySQL failed at commit: GET the activity to see whether it changed", NULL,
                  5);
        return;
    }

    /* Redis follows from one versioned write after the commit, never from
     * the read above: the publish script moves the stock field by the new
     * total minus the one Redis last saw, so a preheat that read MySQL
     * before this commit neither undoes the change nor lets it count twice,
     * and a pass after a failure here still brings it (see script_preheat_publish). */
    struct preheat_result res;
    int preheated = act_refresh(nc, id, &res) == CS_OK;
    const char *redis_note = act_update_note(id, delta, preheated, &res, kind);
    /* This node sells again at once; other nodes' sold-out hints expire
     * within limits.soldout_recheck_ms. */
    if (delta > 0)
        shm_flag_clear(nc->shm->soldout, id);
    log_notice("activity %" PRId64 " updated by admin %" PRId64 " (stock %+" PRId64
               ", Redis %s)",
               id, r->who.user_id, delta, redis_note);

    cJSON *root = act_root(delta > 0 ? "stock added" : "activity updated");
    cJSON_AddNumberToObject(root, "added", (double)delta);
    cJSON_AddStringToObject(root, "redisStock", redis_note);
    cJSON_AddBoolToObject(root, "preheatOk", preheated);
    act_answer_one(nc, r, 200, delta > 0 ? "stock added" : "activity updated", id, root);
}

void api_activity(struct node_ctx *nc, struct req *r)
{
    int is_get = strcmp(r->method, "GET") == 0 || strcmp(r->method, "HEAD") == 0;
    int is_post = strcmp(r->method, "POST") == 0, is_put = strcmp(r->method, "PUT") == 0;

    if (!is_get && !is_post && !is_put) {
        r->code = CODE_METHOD_NOT_ALLOWED;
        snprintf(r->msg, sizeof(r->msg), "%s", http_code_msg(r->code));
        http_reply_with(r->out, r->code, NULL, NULL, "Allow: GET, HEAD, POST, PUT\r\n");
        return;
    }
    struct auth_identity who;
    if (req_auth(r, 2, &who) != CS_OK)
        return;
    if (is_get) {
        act_get(nc, r);
        return;
    }
    r->audit_action = is_post ? "create" : "update";
    if (is_post)
        act_create(nc, r);
    else
        act_update(nc, r);
}
