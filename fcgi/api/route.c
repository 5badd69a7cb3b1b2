/* route.c - maps a request path and method to its handler. */
#include "route.h"
#include "api.h"
#include "req/audit.h"
#include "req/http.h"
#include "req/idem.h"
#include "req/req.h"
#include "node/ctx.h"

#include <string.h>

static const struct {
    const char *path;
    const char *method;        /* NULL: the handler checks the method itself */
    enum route_id id;
    void (*handler)(struct node_ctx *, struct req *);
    const char *audit;         /* admin action recorded in admin_audit, or NULL */
    int admin_write;           /* takes Idempotency-Key (its POST / PUT) */
} routes[] = {
    {"/market/consumer/coupon/seize", "POST", ROUTE_SEIZE, api_seize, NULL, 0},
    {"/market/consumer/coupon/status", "GET", ROUTE_STATUS, api_status, NULL, 0},
    {"/market/admin/coupon/preheat", "POST", ROUTE_PREHEAT, api_admin_preheat, "preheat", 1},
    {"/market/admin/coupon/revoke", "POST", ROUTE_REVOKE, api_admin_revoke, "revoke", 1},
    {"/market/admin/coupon/reconcile", "POST", ROUTE_RECONCILE, api_admin_reconcile, "reconcile", 1},
    {"/market/health", "GET", ROUTE_HEALTH, api_admin_health, NULL, 0},
    {"/market/admin/metrics", "GET", ROUTE_METRICS, api_metrics, NULL, 0},
    {"/market/admin/coupon/activity", NULL, ROUTE_ACTIVITY, api_activity, NULL, 1},
    {"/market/consumer/coupon/mine", "GET", ROUTE_MINE, api_coupon_mine, NULL, 0},
    /* Audited when an admin token calls (the handler sets the action). */
    {"/market/service/coupon/use", "POST", ROUTE_USE, api_coupon_use, NULL, 0},
    {"/market/service/coupon/release", "POST", ROUTE_RELEASE, api_coupon_release, NULL, 0},
    {"/market/admin/coupon/reserves", "GET", ROUTE_RESERVES, api_reserve_list, NULL, 0},
    {"/market/admin/coupon/reserve/return", "POST", ROUTE_RESERVE_RETURN, api_reserve_return,
     "reserve_return", 1},
};

void route_dispatch(struct node_ctx *nc, struct req *r)
{
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        if (strcmp(r->path, routes[i].path) != 0)
            continue;
        r->route = routes[i].id;
        /* HEAD is GET without a body as far as routing goes. */
        if (routes[i].method != NULL && strcmp(r->method, routes[i].method) != 0
            && !(strcmp(routes[i].method, "GET") == 0 && strcmp(r->method, "HEAD") == 0)) {
            /* RFC 9110: a 405 names the methods the route takes. */
            r->code = CODE_METHOD_NOT_ALLOWED;
            http_reply_with(r->out, r->code, NULL, NULL,
                            strcmp(routes[i].method, "GET") == 0 ? "Allow: GET, HEAD\r\n"
                                                                 : "Allow: POST\r\n");
            return;
        }
        r->audit_action = routes[i].audit;
        if (r->idem_key != NULL && routes[i].admin_write && strcmp(r->method, "GET") != 0
            && strcmp(r->method, "HEAD") != 0) {
            struct idem_claim ic;
            if (idem_begin(nc->mc, r, &ic) == IDEM_RUN) {
                routes[i].handler(nc, r);
                idem_end(nc->mc, &ic);
            }
            /* A replay or a refused key is no new action: no audit row. */
            if (r->audit_action != NULL && r->who.is_admin && strcmp(r->msg, "replay") != 0
                && r->code != CODE_IDEMPOTENCY_KEY_IN_USE && r->code != CODE_IDEMPOTENCY_KEY_REUSED)
                audit_record(nc->mc, r);
            return;
        }
        routes[i].handler(nc, r);
        /* Only callers that proved to be admins leave a trace (not 401/403). */
        if (r->audit_action != NULL && r->who.is_admin)
            audit_record(nc->mc, r);
        return;
    }
    r->route = ROUTE_OTHER;
    req_reply(r, CODE_NOT_FOUND, NULL, NULL, 0);
}
