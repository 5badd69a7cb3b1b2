/* api_reserve.c - the admin routes of node reserves: the list per node
 * incarnation, and the return of a lost node's reserve (lib/node/reserve_admin.c). */
#include "api.h"
#include "conf.h"
#include "cs.h"
#include "log.h"
#include "req/req.h"
#include "reserve_admin.h"
#include "shm.h"
#include "node/ctx.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static void rsv_bad(struct req *r, const char *field, const char *msg)
{
    char extra[48];
    snprintf(extra, sizeof(extra), "\"field\":\"%s\"", field);
    req_reply(r, CODE_BAD_REQUEST, msg, extra, 0);
}

static void rsv_add_int(cJSON *o, const char *name, int64_t v)
{
    char buf[24];
    snprintf(buf, sizeof(buf), "%" PRId64, v);
    cJSON_AddItemToObject(o, name, cJSON_CreateRaw(buf));
}

/* v, or null when negative (unknown). */
static void rsv_add_known(cJSON *o, const char *name, int64_t v)
{
    if (v < 0)
        cJSON_AddNullToObject(o, name);
    else
        rsv_add_int(o, name, v);
}

void api_reserve_list(struct node_ctx *nc, struct req *r)
{
    struct auth_identity who;
    struct reserve_list l;
    char idbuf[32], err[256];
    int64_t id = 0;

    if (req_auth(r, 2, &who) != CS_OK)
        return;
    if (http_query_param(r->query, "id", idbuf, sizeof(idbuf)) == CS_OK
        && cs_parse_id(idbuf, strlen(idbuf), &id) != CS_OK) {
        rsv_bad(r, "id", "id must be an integer 1..9223372036854775807");
        return;
    }
    if (reserve_admin_list(nc->mc, nc->rc, id, nc->conf->fallback_lease_ms, &nc->shm->lease_watch, &l,
                           err, sizeof(err))
        != CS_OK) {
        log_error("reserve list: %s", err);
        req_reply(r, CODE_UNAVAILABLE, "MySQL unavailable", NULL, 5);
        return;
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "code", "OK");
    cJSON_AddStringToObject(root, "msg", "ok");
    rsv_add_int(root, "now", cs_now_ms());
    if (id > 0) {
        rsv_add_int(root, "activityId", id);
        rsv_add_known(root, "held", l.held);
    }
    rsv_add_int(root, "leaseMs", nc->conf->fallback_lease_ms);
    cJSON_AddBoolToObject(root, "stale", !l.redis_ok);
    cJSON_AddBoolToObject(root, "truncated", l.truncated);
    cJSON *arr = cJSON_AddArrayToObject(root, "reserves");
    for (size_t i = 0; i < l.n; i++) {
        const struct reserve_view *v = &l.v[i];
        cJSON *o = cJSON_CreateObject();
        rsv_add_int(o, "activityId", v->activity_id);
        char ids[24];
        snprintf(ids, sizeof(ids), "%" PRId64, v->activity_id);
        cJSON_AddStringToObject(o, "activityIdStr", ids);
        cJSON_AddStringToObject(o, "incarnation", v->incarnation);
        rsv_add_int(o, "epoch", v->epoch);
        rsv_add_int(o, "amount", v->amount);
        rsv_add_known(o, "left", v->left);
        rsv_add_known(o, "leaseAgeMs", v->lease_age_ms);
        rsv_add_known(o, "leaseWatchedMs", v->watched_ms);
        cJSON_AddBoolToObject(o, "leaseExpired", l.redis_ok && v->lease_expired);
        cJSON_AddItemToArray(arr, o);
    }
    reserve_admin_list_free(&l);
    char *txt = cJSON_PrintUnformatted(root);
    r->code = CODE_OK;
    snprintf(r->msg, sizeof(r->msg), "ok");
    http_reply_raw(r->out, 200, "application/json; charset=utf-8", txt, strlen(txt), NULL);
    cJSON_free(txt);
    cJSON_Delete(root);
}

/* The body besides its id (read exactly by http_parse_id_body()): one
 * "incarnation", a string of JOURNAL_ID_LEN lowercase hex digits, and
 * optionally "journalLost", a boolean (the operator declares the node's
 * journal lost); any other member, one twice, or a NUL in any string is
 * refused. CS_OK with inc and *lost filled, else CS_ERR after answering 400. */
static int rsv_parse_incarnation(struct req *r, char inc[JOURNAL_ID_LEN + 1], int *lost)
{
    cJSON *doc = cJSON_ParseWithLengthOpts(r->body, r->body_len + 1, NULL, 1);
    const cJSON *m;
    const char *bad = NULL, *field = "incarnation";
    int seen = 0, seen_lost = 0;

    *lost = 0;
    /* No string may hold NUL: cJSON would end the incarnation there. */
    if (http_json_check(r->body, r->body_len, &bad) != CS_OK) {
        cJSON_Delete(doc);
        req_reply(r, CODE_BAD_REQUEST, bad, NULL, 0);
        return CS_ERR;
    }
    cJSON_ArrayForEach(m, doc)
    {
        if (strcmp(m->string, "id") == 0)
            continue;
        if (strcmp(m->string, "journalLost") == 0) {
            if (seen_lost++ || !cJSON_IsBool(m)) {
                bad = seen_lost > 1 ? "journalLost is given twice"
                                    : "journalLost must be true or false";
                field = "journalLost";
                break;
            }
            *lost = cJSON_IsTrue(m);
            continue;
        }
        if (strcmp(m->string, "incarnation") != 0) {
            bad = "unknown field: give id, incarnation and journalLost only";
            field = "";
            break;
        }
        if (seen++) {
            bad = "incarnation is given twice";
            break;
        }
        if (!cJSON_IsString(m)
            || !reserve_admin_incarnation_ok(m->valuestring, strlen(m->valuestring))) {
            bad = "incarnation must be the node's 32 lowercase hex digits";
            break;
        }
        memcpy(inc, m->valuestring, JOURNAL_ID_LEN + 1);
    }
    if (bad == NULL && !seen)
        bad = "incarnation is required";
    cJSON_Delete(doc);
    if (bad != NULL) {
        rsv_bad(r, field, bad);
        return CS_ERR;
    }
    return CS_OK;
}

void api_reserve_return(struct node_ctx *nc, struct req *r)
{
    struct auth_identity who;
    struct reserve_return res;
    const char *why;
    char inc[JOURNAL_ID_LEN + 1], err[384], extra[256];
    int64_t id;

    if (req_auth(r, 2, &who) != CS_OK || req_read_body(r) != CS_OK)
        return;
    if (http_parse_id_body(r->body, r->body_len, &id, &why) != CS_OK) {
        rsv_bad(r, "id", why);
        return;
    }
    r->audit_id = id;
    int lost;
    if (rsv_parse_incarnation(r, inc, &lost) != CS_OK)
        return;
    struct reserve_admin_opts o = {
        .lease_ms = nc->conf->fallback_lease_ms,
        .wait_replicas = nc->conf->redis_wait_replicas,
        .wait_timeout_ms = nc->conf->redis_wait_timeout_ms,
        .journal_lost = lost,
        .watch = &nc->shm->lease_watch,
    };
    if (reserve_admin_return(nc->mc, nc->rc, &o, id, inc, &res, err, sizeof(err)) != CS_OK) {
        log_error("reserve return of activity %" PRId64 " incarnation %s: %s", id, inc, err);
        req_reply(r, CODE_UNAVAILABLE,
                  "return not finished: MySQL or Redis unavailable; repeat it (it is safe)", NULL,
                  5);
        return;
    }
    int n = snprintf(extra, sizeof(extra), "\"activityId\":%" PRId64 ",\"incarnation\":\"%s\"",
                     id, inc);
    switch (res.outcome) {
    case RRET_NONE_OPEN:
        req_reply(r, CODE_NO_OPEN_RESERVE, NULL, extra, 0);
        return;
    case RRET_NOT_IN_REDIS:
        req_reply(r, CODE_RESERVE_NOT_IN_REDIS, NULL, extra, 0);
        return;
    case RRET_LEASE_NOT_EXPIRED: {
        /* By the node's own lease (it published it with its renewal), on
         * Redis' clock and on this node's. */
        int64_t wait = res.wait_ms > 0 ? res.wait_ms : 1000;
        snprintf(extra + n, sizeof(extra) - (size_t)n,
                 ",\"leaseMs\":%" PRId64 ",\"leaseAgeMs\":%" PRId64 ",\"waitMs\":%" PRId64,
                 res.lease_ms, res.lease_age_ms, wait);
        req_reply(r, CODE_LEASE_NOT_EXPIRED, NULL, extra, (int)(wait > 0 ? wait / 1000 + 1 : 1));
        return;
    }
    case RRET_RETURNED:
    case RRET_CLOSED:
        break;
    }
    if (res.returned > 0)
        shm_flag_clear(nc->shm->soldout, id); /* the stock rose: no sold-out hint here */
    if (lost) {
        /* Never silent: the grants the node made and did not replay are
         * gone with its journal (log, metric, alert, answer, audit). */
        atomic_fetch_add(&nc->shm->rsv.journals_lost, 1);
        log_error("reserve of activity %" PRId64 " incarnation %s returned by admin %" PRId64
                  " with its journal declared lost: %" PRId64 " coupons back in stock; grants "
                  "that node made and did not replay are lost with its journal",
                  id, inc, who.user_id, res.returned);
    } else {
        log_notice("reserve of activity %" PRId64 " incarnation %s returned by admin %" PRId64
                   ": %d epochs closed, %" PRId64 " of %" PRId64 " coupons back in stock, %" PRId64
                   " kept out until the node replays%s",
                   id, inc, who.user_id, res.epochs, res.returned, res.amount, res.parked,
                   res.outcome == RRET_CLOSED ? " (given back in Redis before)" : "");
    }
    char ret[24] = "null"; /* closed before: what went back then is not known */
    if (res.outcome == RRET_RETURNED)
        snprintf(ret, sizeof(ret), "%" PRId64, res.returned);
    snprintf(extra + n, sizeof(extra) - (size_t)n,
             ",\"epochs\":%d,\"amount\":%" PRId64 ",\"returned\":%s,\"parked\":%" PRId64
             ",\"journalLost\":%s", res.epochs, res.amount, ret, res.parked,
             lost ? "true" : "false");
    const char *msg = res.outcome == RRET_CLOSED ? "epoch closed; it was given back in Redis before"
                      : lost ? "reserve returned to stock with the node's journal declared lost: "
                               "grants it made and did not replay are lost with it"
                      : res.parked > 0 ? "epoch closed; what the node may have granted stays out "
                                         "of stock until it replays (or its journal is declared "
                                         "lost)"
                                       : "reserve returned to stock";
    req_reply(r, CODE_OK, msg, extra, 0);
}
