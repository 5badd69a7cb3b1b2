/* coupon_api.c - /market/consumer/coupon/mine and /market/service/coupon/{use,release}:
 * parse, call lib/coupon.c, answer. */
#include "conf.h"
#include "coupon.h"
#include "cs.h"
#include "log.h"
#include "mconn.h"
#include "route.h"
#include "worker.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MINE_PAGE_DEFAULT 20
#define MINE_PAGE_MAX 100
/* Integers above 2^53 do not survive a JSON number reader that uses doubles:
 * such ids are taken as strings ("idStr"). */
#define COUPON_ID_NUM_MAX 9007199254740992.0

static void coupon_send(struct req *r, cJSON *root)
{
    char *txt = cJSON_PrintUnformatted(root);
    r->code = CODE_OK;
    snprintf(r->msg, sizeof(r->msg), "%s", cJSON_GetStringValue(cJSON_GetObjectItem(root, "msg")));
    http_reply_raw(r->out, 200, "application/json; charset=utf-8", txt, strlen(txt), NULL);
    cJSON_free(txt);
    cJSON_Delete(root);
}

static void coupon_mysql_down(struct worker *w, struct req *r, const char *what)
{
    log_error("%s: %s", what, w->mc->errstr);
    req_reply(r, CODE_UNAVAILABLE, "MySQL unavailable", NULL, 5);
}

static int query_int(const char *query, const char *name, int64_t dflt, int64_t lo, int64_t hi,
                     int64_t *out)
{
    char buf[24];
    if (http_query_param(query, name, buf, sizeof(buf)) != CS_OK) {
        *out = dflt;
        return CS_OK;
    }
    char *end;
    long long v = strtoll(buf, &end, 10);
    if (buf[0] == '\0' || *end != '\0' || v < lo || v > hi)
        return CS_ERR;
    *out = v;
    return CS_OK;
}

/* ---- GET /market/consumer/coupon/mine ------------------------------------------------ */

static cJSON *coupon_json(const struct coupon_row *c)
{
    char idstr[24];
    cJSON *o = cJSON_CreateObject();
    snprintf(idstr, sizeof(idstr), "%" PRId64, c->id);
    cJSON_AddNumberToObject(o, "id", (double)c->id);
    cJSON_AddStringToObject(o, "idStr", idstr);
    cJSON_AddNumberToObject(o, "activityId", (double)c->activity_id);
    cJSON_AddStringToObject(o, "activityName", c->activity_name);
    cJSON_AddStringToObject(o, "status", coupon_status_name(c->status));
    cJSON_AddNumberToObject(o, "seizedAt", (double)c->seized_ms);
    cJSON_AddNumberToObject(o, "validUntil", (double)c->valid_until_ms);
    cJSON_AddNumberToObject(o, "couponType", c->coupon_type);
    cJSON_AddStringToObject(o, "couponAmount", c->coupon_amount);
    cJSON_AddStringToObject(o, "couponThreshold", c->coupon_threshold);
    if (c->order_id[0] != '\0')
        cJSON_AddStringToObject(o, "orderId", c->order_id);
    else
        cJSON_AddNullToObject(o, "orderId");
    return o;
}

void coupon_mine_handle(struct worker *w, struct req *r)
{
    struct auth_identity who;
    char sbuf[16];
    int status = 0;
    int64_t page, size, total;

    if (req_auth(w, r, 1, &who) != CS_OK)
        return;
    if (http_query_param(r->query, "status", sbuf, sizeof(sbuf)) == CS_OK
        && coupon_status_parse(sbuf, &status) != CS_OK) {
        req_reply(r, CODE_BAD_REQUEST, "status must be unused, used, expired or voided",
                  "\"field\":\"status\"", 0);
        return;
    }
    if (query_int(r->query, "page", 1, 1, 1000000, &page) != CS_OK) {
        req_reply(r, CODE_BAD_REQUEST, "page must be an integer 1..1000000", "\"field\":\"page\"",
                  0);
        return;
    }
    if (query_int(r->query, "size", MINE_PAGE_DEFAULT, 1, MINE_PAGE_MAX, &size) != CS_OK) {
        req_reply(r, CODE_BAD_REQUEST, "size must be an integer 1..100", "\"field\":\"size\"", 0);
        return;
    }
    struct coupon_row *rows;
    size_t n;
    if (coupon_mine(w->mc, who.user_id, status, size, (page - 1) * size, &rows, &n, &total)
        != CS_OK) {
        coupon_mysql_down(w, r, "reading a user's coupons");
        return;
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "code", "OK");
    cJSON_AddStringToObject(root, "msg", "ok");
    cJSON_AddNumberToObject(root, "now", (double)cs_now_ms());
    cJSON_AddNumberToObject(root, "page", (double)page);
    cJSON_AddNumberToObject(root, "size", (double)size);
    cJSON_AddNumberToObject(root, "total", (double)total);
    cJSON *arr = cJSON_AddArrayToObject(root, "coupons");
    for (size_t i = 0; i < n; i++)
        cJSON_AddItemToArray(arr, coupon_json(&rows[i]));
    free(rows);
    coupon_send(r, root);
}

/* ---- POST /market/service/coupon/{use,release} --------------------------------------- */

/* Reads {"couponId": C, "orderId": "..."}: couponId a JSON integer 1..2^53
 * or a decimal string 1..2^63-1, orderId 1..64 bytes of printable ASCII;
 * each exactly once. CS_OK, or CS_ERR with a static reason and field. */
static int coupon_body(const char *body, size_t len, int64_t *id, char *order, size_t *olen,
                       const char **why, const char **field)
{
    cJSON *doc = cJSON_ParseWithLengthOpts(body, len + 1, NULL, 1);
    const cJSON *m, *cid = NULL, *oid = NULL;
    int ret = CS_ERR, dup = 0;

    *field = "";
    if (!cJSON_IsObject(doc)) {
        *why = "body must be a JSON object";
        goto out;
    }
    cJSON_ArrayForEach(m, doc)
    {
        if (strcmp(m->string, "couponId") == 0)
            dup |= cid != NULL, cid = m;
        else if (strcmp(m->string, "orderId") == 0)
            dup |= oid != NULL, oid = m;
    }
    if (dup) {
        *why = "couponId and orderId may each appear once";
        goto out;
    }
    *field = "couponId";
    if (cid == NULL) {
        *why = "couponId is required";
        goto out;
    }
    if (cJSON_IsNumber(cid)) {
        double d = cid->valuedouble;
        if (d < 1 || d > COUPON_ID_NUM_MAX || d != (double)(int64_t)d) {
            *why = "couponId must be an integer 1..2^53 (or a decimal string)";
            goto out;
        }
        *id = (int64_t)d;
    } else if (cJSON_IsString(cid)) {
        if (cs_parse_id(cid->valuestring, strlen(cid->valuestring), id) != CS_OK) {
            *why = "couponId must be a decimal id 1..9223372036854775807";
            goto out;
        }
    } else {
        *why = "couponId must be an integer";
        goto out;
    }
    *field = "orderId";
    if (oid == NULL) {
        *why = "orderId is required";
        goto out;
    }
    if (!cJSON_IsString(oid)) {
        *why = "orderId must be a string";
        goto out;
    }
    *olen = strlen(oid->valuestring);
    if (!coupon_order_id_ok(oid->valuestring, *olen)) {
        *why = "orderId must be 1..64 characters of printable ASCII";
        goto out;
    }
    memcpy(order, oid->valuestring, *olen + 1);
    *field = "";
    ret = CS_OK;
out:
    cJSON_Delete(doc);
    return ret;
}

static enum cs_code coupon_code(enum coupon_result res)
{
    switch (res) {
    case COUPON_R_OK:
        return CODE_OK;
    case COUPON_R_NO_SUCH:
        return CODE_NO_SUCH_COUPON;
    case COUPON_R_FORBIDDEN:
        return CODE_FORBIDDEN;
    case COUPON_R_ALREADY_USED:
        return CODE_ALREADY_USED;
    case COUPON_R_EXPIRED:
        return CODE_EXPIRED;
    case COUPON_R_VOIDED:
        return CODE_VOIDED;
    case COUPON_R_UNUSED:
        return CODE_UNUSED;
    }
    return CODE_INTERNAL_ERROR;
}

static void coupon_change(struct worker *w, struct req *r, int release)
{
    const char *verb = release ? "release" : "use";
    struct auth_identity who;
    char order[COUPON_ORDER_MAX + 1], extra[64];
    const char *why, *field;
    size_t olen = 0;
    int64_t id = 0, owner = 0;

    if (req_auth(w, r, 1, &who) != CS_OK)
        return;
    if (who.is_admin)
        r->audit_action = verb;
    else if (!who.is_service) {
        if (!w->conf->auth_user_may_use) {
            req_reply(r, CODE_FORBIDDEN, "service or admin role required", NULL, 0);
            return;
        }
        owner = who.user_id;
    }
    if (req_read_body(w, r) != CS_OK)
        return;
    if (coupon_body(r->body, r->body_len, &id, order, &olen, &why, &field) != CS_OK) {
        snprintf(extra, sizeof(extra), "\"field\":\"%s\"", field);
        req_reply(r, CODE_BAD_REQUEST, why, field[0] ? extra : NULL, 0);
        return;
    }
    enum coupon_result res;
    int expired = 0, rc = release ? coupon_release(w->mc, id, order, olen, owner, &res, &expired)
                                  : coupon_use(w->mc, id, order, olen, owner, &res);
    if (rc != CS_OK) {
        log_error("coupon %" PRId64 " %s by order %s failed", id, verb, order);
        coupon_mysql_down(w, r, release ? "releasing a coupon" : "using a coupon");
        return;
    }
    enum cs_code code = coupon_code(res);
    /* The audit row names the coupon's activity (the body names the coupon). */
    if (who.is_admin && coupon_activity_of(w->mc, id, &r->audit_id) != CS_OK)
        r->audit_id = 0;
    log_info("coupon %" PRId64 " %s by order %s (%s %" PRId64 "): %s", id, verb, order,
             who.is_admin ? "admin" : who.is_service ? "service" : "owner", who.user_id,
             http_code_name(code));
    if (code != CODE_OK) {
        snprintf(extra, sizeof(extra), "\"couponId\":%" PRId64, id);
        req_reply(r, code,
                  code == CODE_FORBIDDEN ? "the coupon belongs to another user" : NULL, extra, 0);
        return;
    }
    char idstr[24];
    snprintf(idstr, sizeof(idstr), "%" PRId64, id);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "code", "OK");
    cJSON_AddStringToObject(root, "msg", release ? "coupon released" : "coupon used");
    cJSON_AddNumberToObject(root, "couponId", (double)id);
    cJSON_AddStringToObject(root, "idStr", idstr);
    cJSON_AddStringToObject(root, "orderId", order);
    cJSON_AddStringToObject(root, "status",
                            release ? (expired ? "EXPIRED" : "UNUSED") : "USED");
    coupon_send(r, root);
}

void coupon_use_handle(struct worker *w, struct req *r)
{
    coupon_change(w, r, 0);
}

void coupon_release_handle(struct worker *w, struct req *r)
{
    coupon_change(w, r, 1);
}
