/* api_coupon.c - /market/consumer/coupon/mine and /market/service/coupon/{use,release}:
 * parse, call lib/coupon.c, answer. */
#include "api.h"
#include "conf.h"
#include "coupon.h"
#include "cs.h"
#include "req/http.h"
#include "log.h"
#include "mconn.h"
#include "req/req.h"
#include "node/ctx.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MINE_PAGE_DEFAULT 20
#define MINE_PAGE_MAX 100
/* Integers above 2^53 - 1 do not survive a JSON number reader that uses
 * doubles (9007199254740993 reads as ...992): such ids are taken as strings
 * ("idStr"), never as numbers. */
#define COUPON_ID_NUM_MAX 9007199254740991.0

static void coupon_send(struct req *r, cJSON *root)
{
    char *txt = cJSON_PrintUnformatted(root);
    r->code = CODE_OK;
    snprintf(r->msg, sizeof(r->msg), "%s", cJSON_GetStringValue(cJSON_GetObjectItem(root, "msg")));
    http_reply_raw(r->out, 200, "application/json; charset=utf-8", txt, strlen(txt), NULL);
    cJSON_free(txt);
    cJSON_Delete(root);
}

static void coupon_mysql_down(struct node_ctx *nc, struct req *r, const char *what)
{
    req_mysql_fail(r, nc->mc, what, NULL);
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

void api_coupon_mine(struct node_ctx *nc, struct req *r)
{
    struct auth_identity who;
    char sbuf[16];
    int status = 0;
    int64_t page, size, total;

    if (req_auth(r, 1, &who) != CS_OK)
        return;
    if (http_query_param(r->query, "status", sbuf, sizeof(sbuf)) == CS_OK
        && coupon_status_parse(sbuf, &status) != CS_OK) {
        req_reply(r, CODE_BAD_REQUEST, "status must be unused, used, expired or voided",
                  "\"field\":\"status\"", 0);
        return;
    }
    if (http_query_int(r->query, "page", 1, 1, 1000000, &page) != CS_OK) {
        req_reply(r, CODE_BAD_REQUEST, "page must be an integer 1..1000000", "\"field\":\"page\"",
                  0);
        return;
    }
    if (http_query_int(r->query, "size", MINE_PAGE_DEFAULT, 1, MINE_PAGE_MAX, &size) != CS_OK) {
        req_reply(r, CODE_BAD_REQUEST, "size must be an integer 1..100", "\"field\":\"size\"", 0);
        return;
    }
    struct coupon_row *rows;
    size_t n;
    if (coupon_mine(nc->mc, who.user_id, status, size, (page - 1) * size, &rows, &n, &total)
        != CS_OK) {
        coupon_mysql_down(nc, r, "reading a user's coupons");
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

/* What a use or release body says. */
struct coupon_req {
    int64_t id, user;          /* user 0: not given */
    char order[COUPON_ORDER_MAX + 1];
    size_t olen;
};

/* An id member: a JSON integer 1..2^53-1, or a decimal string
 * 1..2^63-1. CS_OK, or CS_ERR with a static reason. */
static int coupon_id_member(const cJSON *m, int64_t *out, const char **why)
{
    if (cJSON_IsNumber(m)) {
        double d = m->valuedouble;
        if (d < 1 || d > COUPON_ID_NUM_MAX || d != (double)(int64_t)d) {
            *why = "must be an integer 1..9007199254740991 (2^53-1), or a decimal string";
            return CS_ERR;
        }
        *out = (int64_t)d;
        return CS_OK;
    }
    if (cJSON_IsString(m)) {
        if (cs_parse_id(m->valuestring, strlen(m->valuestring), out) != CS_OK) {
            *why = "must be a decimal id 1..9223372036854775807";
            return CS_ERR;
        }
        return CS_OK;
    }
    *why = "must be an integer";
    return CS_ERR;
}

/* Reads {"couponId": C, "userId": U, "orderId": "..."} (see coupon_id_member()
 * for the ids; orderId 1..64 bytes of 0x21..0x7e), each at most once; userId
 * may be missing (the caller decides). No string may hold NUL: the body
 * passes http_json_check() first, so strlen() is each string's length.
 * CS_OK, or CS_ERR with a reason in why[whylen] and a static field name. */
static int coupon_body(const char *body, size_t len, struct coupon_req *q, char *why,
                       size_t whylen, const char **field)
{
    static const char *const names[] = {"couponId", "userId", "orderId"};
    const cJSON *m, *v[3] = {NULL, NULL, NULL};
    const char *reason;
    cJSON *doc = NULL;
    int ret = CS_ERR, dup = 0;

    *field = "";
    memset(q, 0, sizeof(*q));
    if (http_json_check(body, len, &reason) != CS_OK) {
        snprintf(why, whylen, "%s", reason);
        goto out;
    }
    doc = cJSON_ParseWithLengthOpts(body, len + 1, NULL, 1);
    if (!cJSON_IsObject(doc)) {
        snprintf(why, whylen, "body must be a JSON object");
        goto out;
    }
    cJSON_ArrayForEach(m, doc)
        for (int i = 0; i < 3; i++)
            if (strcmp(m->string, names[i]) == 0) {
                dup |= v[i] != NULL;
                v[i] = m;
            }
    if (dup) {
        snprintf(why, whylen, "couponId, userId and orderId may each appear once");
        goto out;
    }
    for (int i = 0; i < 2; i++) {
        *field = names[i];
        if (v[i] == NULL) {
            if (i == 0) {
                snprintf(why, whylen, "couponId is required");
                goto out;
            }
            continue;
        }
        if (coupon_id_member(v[i], i == 0 ? &q->id : &q->user, &reason) != CS_OK) {
            snprintf(why, whylen, "%s %s", names[i], reason);
            goto out;
        }
    }
    *field = "orderId";
    if (v[2] == NULL) {
        snprintf(why, whylen, "orderId is required");
        goto out;
    }
    if (!cJSON_IsString(v[2])) {
        snprintf(why, whylen, "orderId must be a string");
        goto out;
    }
    q->olen = strlen(v[2]->valuestring);
    if (!coupon_order_id_ok(v[2]->valuestring, q->olen)) {
        snprintf(why, whylen, "orderId must be 1..64 bytes of printable ASCII "
                              "without spaces (0x21..0x7e)");
        goto out;
    }
    memcpy(q->order, v[2]->valuestring, q->olen + 1);
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

/*
 * Who may: the order system (role "service") and admins, naming the coupon's
 * owner in userId; for use only, with auth.user_may_use, the owner with a
 * user token, whose own id userId is (taken from the token when missing). A
 * release is the order system's alone: only it knows an order was
 * cancelled. A coupon that is not userId's is answered as a missing one.
 */
static void coupon_change(struct node_ctx *nc, struct req *r, int release)
{
    const char *verb = release ? "release" : "use";
    struct auth_identity who;
    struct coupon_req q;
    char extra[96], why[128];
    const char *field;
    int as_user = 0;

    if (req_auth(r, 1, &who) != CS_OK)
        return;
    if (who.is_admin)
        r->audit_action = verb;
    else if (!who.is_service) {
        if (release) {
            req_reply(r, CODE_FORBIDDEN, "only the order system releases a coupon", NULL, 0);
            return;
        }
        if (!nc->conf->auth_user_may_use) {
            req_reply(r, CODE_FORBIDDEN, "service or admin role required", NULL, 0);
            return;
        }
        as_user = 1;
    }
    if (req_read_body(r) != CS_OK)
        return;
    if (coupon_body(r->body, r->body_len, &q, why, sizeof(why), &field) != CS_OK) {
        snprintf(extra, sizeof(extra), "\"field\":\"%s\"", field);
        req_reply(r, CODE_BAD_REQUEST, why, field[0] ? extra : NULL, 0);
        return;
    }
    if (q.user == 0 && !as_user) {
        req_reply(r, CODE_BAD_REQUEST, "userId is required: the user whose coupon it is",
                  "\"field\":\"userId\"", 0);
        return;
    }
    /* A user acts for themself only; naming another id finds nothing, as a
     * missing coupon, so no user learns which coupons exist. */
    int64_t user = as_user ? who.user_id : q.user;
    enum coupon_result res = COUPON_R_NO_SUCH;
    int expired = 0, rc = CS_OK;
    if (!as_user || q.user == 0 || q.user == who.user_id)
        rc = release ? coupon_release(nc->mc, q.id, user, q.order, q.olen, &res, &expired)
                     : coupon_use(nc->mc, q.id, user, q.order, q.olen, &res);
    if (q.user == 0)
        q.user = user;
    if (rc != CS_OK) {
        log_error("coupon %" PRId64 " %s by order %s failed", q.id, verb, q.order);
        coupon_mysql_down(nc, r, release ? "releasing a coupon" : "using a coupon");
        return;
    }
    enum cs_code code = coupon_code(res);
    /* The audit row names the coupon's activity (the body names the coupon). */
    if (who.is_admin && coupon_activity_of(nc->mc, q.id, &r->audit_id) != CS_OK)
        r->audit_id = 0;
    log_info("coupon %" PRId64 " of user %" PRId64 " %s by order %s (%s %" PRId64 "): %s", q.id,
             q.user, verb, q.order, who.is_admin ? "admin" : who.is_service ? "service" : "owner",
             who.user_id, http_code_name(code));
    if (code != CODE_OK) {
        snprintf(extra, sizeof(extra), "\"couponId\":%" PRId64 ",\"userId\":%" PRId64, q.id,
                 q.user);
        req_reply(r, code, NULL, extra, 0);
        return;
    }
    char idstr[24], userstr[24];
    snprintf(idstr, sizeof(idstr), "%" PRId64, q.id);
    snprintf(userstr, sizeof(userstr), "%" PRId64, q.user);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "code", "OK");
    cJSON_AddStringToObject(root, "msg", release ? "coupon released" : "coupon used");
    cJSON_AddItemToObject(root, "couponId", cJSON_CreateRaw(idstr));
    cJSON_AddStringToObject(root, "idStr", idstr);
    /* The owner, so the order system can check it is its buyer's coupon. */
    cJSON_AddItemToObject(root, "userId", cJSON_CreateRaw(userstr));
    cJSON_AddStringToObject(root, "userIdStr", userstr);
    cJSON_AddStringToObject(root, "orderId", q.order);
    cJSON_AddStringToObject(root, "status",
                            release ? (expired ? "EXPIRED" : "UNUSED") : "USED");
    coupon_send(r, root);
}

void api_coupon_use(struct node_ctx *nc, struct req *r)
{
    coupon_change(nc, r, 0);
}

void api_coupon_release(struct node_ctx *nc, struct req *r)
{
    coupon_change(nc, r, 1);
}
