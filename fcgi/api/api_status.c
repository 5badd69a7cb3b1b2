/* api_status.c - GET /market/consumer/coupon/status[?id=N]. */
#include "node/listcopy.h"
#include "api.h"
#include "node/breaker.h"
#include "conf.h"
#include "cs.h"
#include "keys.h"
#include "log.h"
#include "node/meta.h"
#include "req/req.h"
#include "node/ctx.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The list route's page size: default and largest. */
#define STATUS_PAGE_DEFAULT 50
#define STATUS_PAGE_MAX 200

static cJSON *status_activity_json(const struct activity *a, int64_t now, int64_t remaining)
{
    cJSON *o = activity_to_json(a);
    cJSON_ReplaceItemInObjectCaseSensitive(o, "status",
        cJSON_CreateString(activity_status_name(activity_status_at(a, now))));
    if (remaining >= 0)
        cJSON_AddNumberToObject(o, "remaining", (double)remaining);
    else
        cJSON_AddNullToObject(o, "remaining");
    return o;
}

/* Reads the live stock of n activities in one pipelined round trip. Where
 * it cannot be read (Redis away, LOADING, BUSY ...) the last known value
 * stands and *stale is set. */
static void status_stock(struct node_ctx *nc, const struct activity *acts, size_t n,
                         int64_t *out, int *stale)
{
    for (size_t i = 0; i < n; i++)
        out[i] = meta_last_remaining(nc->meta, acts[i].id);
    if (n == 0)
        return;
    if (*stale || !breaker_readable(nc->shm)) {
        *stale = 1;
        return;
    }
    struct activity_stock *s = xmalloc(n * sizeof(*s));
    for (size_t i = 0; i < n; i++)
        s[i] = (struct activity_stock){.id = acts[i].id};
    if (activity_stock_read(nc->rc, s, n) != CS_OK)
        *stale = 1;
    for (size_t i = 0; i < n; i++) {
        if (s[i].state != ACT_STOCK_SET)
            continue;
        out[i] = s[i].value;
        meta_set_remaining(nc->meta, acts[i].id, out[i]);
    }
    free(s);
}

/* mine: seized = in the seize list; persisted = seized, no longer queued
 * (coupon-sync removes a queue entry only after its MySQL commit) and not
 * moved to the dead letters (which it does when the entry cannot be written).
 * A grant from this node's reserve not yet replayed is seized and pending,
 * known without Redis. With Redis not read (stale), nothing else is said. */
static int status_mine(struct node_ctx *nc, int64_t aid, int64_t uid, cJSON *mine, int stale)
{
    char klist[KEYS_MAX], kqueue[KEYS_MAX], kdead[KEYS_MAX], fuser[24], fqueue[KEYS_MAX];
    redisReply *rep[3] = {NULL, NULL, NULL};
    int ok = 0, got = 0;

    /* A grant from this node's reserve that Redis has not seen yet: the
     * journal holds it, and it reaches Redis and MySQL when replayed. */
    int replayed = 0;
    if (reserve_granted(&nc->shm->rsv, aid, uid, &replayed) && !replayed) {
        cJSON_AddBoolToObject(mine, "seized", 1);
        cJSON_AddBoolToObject(mine, "persisted", 0);
        cJSON_AddBoolToObject(mine, "pending", 1);
        return CS_OK;
    }
    if (stale || !breaker_readable(nc->shm))
        return CS_ERR;
    keys_seize_list(klist, aid);
    keys_queue(kqueue, keys_shard(aid));
    keys_dead(kdead, keys_shard(aid));
    snprintf(fuser, sizeof(fuser), "%" PRId64, uid);
    keys_queue_field(fqueue, aid, uid);
    if (rconn_append(nc->rc, klist, "HEXISTS %s %s", klist, fuser) == CS_OK
        && rconn_append(nc->rc, kqueue, "HEXISTS %s %s", kqueue, fqueue) == CS_OK
        && rconn_append(nc->rc, kdead, "HEXISTS %s %s", kdead, fqueue) == CS_OK) {
        while (got < 3 && rconn_get_reply(nc->rc, &rep[got]) == CS_OK)
            got++;
        ok = got == 3;
        for (int i = 0; ok && i < 3; i++)
            ok = rep[i]->type == REDIS_REPLY_INTEGER;
    }
    if (ok) {
        int seized = rep[0]->integer == 1;
        cJSON_AddBoolToObject(mine, "seized", seized);
        cJSON_AddBoolToObject(mine, "persisted",
                              seized && rep[1]->integer == 0 && rep[2]->integer == 0);
    }
    for (int i = 0; i < got; i++)
        freeReplyObject(rep[i]);
    return ok ? CS_OK : CS_ERR;
}

/* Adds "mine" for user uid (none when uid is 0) to root: read live or not
 * at all (null), never an old copy. */
static void status_add_mine(struct node_ctx *nc, cJSON *root, int64_t aid, int64_t uid, int stale)
{
    if (uid <= 0)
        return;
    cJSON *mine = cJSON_CreateObject();
    if (status_mine(nc, aid, uid, mine, stale) == CS_OK) {
        cJSON_AddItemToObject(root, "mine", mine);
    } else {
        cJSON_Delete(mine);
        cJSON_AddNullToObject(root, "mine");
    }
}

/* {"code":"OK","msg":"ok"}, to which the answer's members are added. */
static cJSON *status_root(void)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "code", "OK");
    cJSON_AddStringToObject(root, "msg", "ok");
    /* The server's clock, so a page counts down to the start by it. */
    cJSON_AddNumberToObject(root, "now", (double)cs_now_ms());
    return root;
}

static void status_send(struct req *r, cJSON *root)
{
    char *txt = cJSON_PrintUnformatted(root);
    r->code = CODE_OK;
    http_reply_raw(r->out, 200, "application/json; charset=utf-8", txt, strlen(txt), NULL);
    cJSON_free(txt);
    cJSON_Delete(root);
}

/* The answer is due fallback.budget_ms after the web server took the
 * request (less a tenth of it, at most 100 ms, for the answer itself). */
static int64_t status_deadline(const struct node_ctx *nc, const struct req *r)
{
    int budget = nc->conf->fallback_budget_ms;
    int margin = budget / 10 < 100 ? budget / 10 : 100;
    return r->start_us / 1000 + budget - margin;
}

/* Looks ID up within the request's budget (meta_lookup_within()). */
static enum meta_kind status_lookup(struct node_ctx *nc, const struct req *r, int64_t id,
                                    struct activity *a, int *stale)
{
    int64_t deadline = status_deadline(nc, r);
    rconn_set_deadline(nc->rc, deadline);
    enum meta_kind kind = meta_lookup_within(nc->meta, nc->rc, id, a, stale, deadline);
    rconn_set_deadline(nc->rc, 0);
    return kind;
}

static void status_one(struct node_ctx *nc, struct req *r, int64_t id, int64_t uid)
{
    struct activity a;
    int stale = 0;
    int64_t now = cs_now_ms();
    cJSON *root, *obj;

    switch (status_lookup(nc, r, id, &a, &stale)) {
    case META_ABSENT:
        req_reply(r, CODE_NO_SUCH_ACTIVITY, NULL, NULL, 0);
        return;
    case META_UNAVAILABLE:
        req_reply(r, CODE_UNAVAILABLE, NULL, NULL, breaker_retry_after(nc->conf));
        return;
    case META_VOIDED:
        root = status_root();
        cJSON_AddBoolToObject(root, "stale", stale);
        obj = cJSON_AddObjectToObject(root, "activity");
        char idtxt[24];
        snprintf(idtxt, sizeof(idtxt), "%" PRId64, id);
        cJSON_AddItemToObject(obj, "id", cJSON_CreateRaw(idtxt));
        cJSON_AddStringToObject(obj, "idStr", idtxt);
        cJSON_AddStringToObject(obj, "status", "VOIDED");
        cJSON_AddNumberToObject(obj, "remaining", 0);
        /* A user told UNKNOWN_OUTCOME before the revoke learns here whether
         * the seize took (a repeated seize only answers VOIDED). */
        status_add_mine(nc, root, id, uid, stale);
        status_send(r, root);
        return;
    case META_FOUND:
        break;
    }
    int64_t remaining;
    status_stock(nc, &a, 1, &remaining, &stale);
    root = status_root();
    cJSON_AddItemToObject(root, "activity", status_activity_json(&a, now, remaining));
    status_add_mine(nc, root, id, uid, stale);
    cJSON_AddBoolToObject(root, "stale", stale);
    status_send(r, root);
}

/* Query parameter NAME as an integer in 1..max; DFLT when absent. */
static int status_page_param(const char *query, const char *name, size_t dflt, size_t max,
                             size_t *out)
{
    char buf[24];
    int64_t v;

    if (http_query_param(query, name, buf, sizeof(buf)) != CS_OK) {
        *out = dflt;
        return CS_OK;
    }
    if (cs_parse_id(buf, strlen(buf), &v) != CS_OK || (uint64_t)v > max)
        return CS_ERR;
    *out = (size_t)v;
    return CS_OK;
}

void api_status(struct node_ctx *nc, struct req *r)
{
    struct auth_identity who;
    char idbuf[32];
    int64_t id;

    if (http_query_param(r->query, "id", idbuf, sizeof(idbuf)) == CS_OK) {
        if (cs_parse_id(idbuf, strlen(idbuf), &id) != CS_OK) {
            req_reply(r, CODE_BAD_REQUEST, "id must be an integer 1..9223372036854775807",
                      NULL, 0);
            return;
        }
        /* The token is optional here; a bad one is still refused. */
        if (req_auth(r, 0, &who) != CS_OK)
            return;
        status_one(nc, r, id, who.user_id);
        return;
    }

    size_t page, size;
    if (status_page_param(r->query, "page", 1, SIZE_MAX / STATUS_PAGE_MAX, &page) != CS_OK
        || status_page_param(r->query, "size", STATUS_PAGE_DEFAULT, SIZE_MAX, &size)
               != CS_OK) {
        req_reply(r, CODE_BAD_REQUEST, "page and size must be integers >= 1", NULL, 0);
        return;
    }
    if (size > STATUS_PAGE_MAX)
        size = STATUS_PAGE_MAX;
    struct listcopy_page pg;
    if (listcopy_page(nc->conf, nc->shm, page, size, &pg) != CS_OK) {
        req_reply(r, CODE_UNAVAILABLE, NULL, NULL, breaker_retry_after(nc->conf));
        return;
    }
    int64_t now = cs_now_ms();
    int stale = pg.stale;
    int64_t *rem = xmalloc(sizeof(int64_t) * (pg.n ? pg.n : 1));
    status_stock(nc, pg.acts, pg.n, rem, &stale);
    cJSON *root = status_root();
    cJSON_AddBoolToObject(root, "stale", stale);
    cJSON_AddNumberToObject(root, "total", (double)pg.total);
    cJSON_AddNumberToObject(root, "page", (double)page);
    cJSON_AddNumberToObject(root, "size", (double)size);
    cJSON *arr = cJSON_AddArrayToObject(root, "activities");
    for (size_t i = 0; i < pg.n; i++)
        cJSON_AddItemToArray(arr, status_activity_json(&pg.acts[i], now, rem[i]));
    free(rem);
    listcopy_page_free(&pg);
    status_send(r, root);
}
