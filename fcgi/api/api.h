/* api.h - the route handlers of coupon-fcgi, one file api_NAME.c each, all
 * called by route.c's table with the worker's state and the request; each
 * answers the request (req.h) itself. */
#ifndef CS_API_H
#define CS_API_H

struct node_ctx;
struct req;

/* POST /market/consumer/coupon/seize (api_seize.c). */
void api_seize(struct node_ctx *nc, struct req *r);
/* GET /market/consumer/coupon/status (api_status.c). */
void api_status(struct node_ctx *nc, struct req *r);
/* POST /market/admin/coupon/preheat, /revoke, /reconcile (Redis stock back to
 * MySQL's total minus the seize list, reconcile.h), GET /market/health
 * (api_admin.c). */
void api_admin_preheat(struct node_ctx *nc, struct req *r);
void api_admin_revoke(struct node_ctx *nc, struct req *r);
void api_admin_reconcile(struct node_ctx *nc, struct req *r);
void api_admin_health(struct node_ctx *nc, struct req *r);
/* GET /market/admin/metrics (api_metrics.c). */
void api_metrics(struct node_ctx *nc, struct req *r);
/* GET / POST / PUT /market/admin/coupon/activity (api_activity.c). */
void api_activity(struct node_ctx *nc, struct req *r);
/* GET /market/consumer/coupon/mine, POST /market/service/coupon/{use,release}
 * (api_coupon.c). use and release set r->audit_action when an admin calls. */
void api_coupon_mine(struct node_ctx *nc, struct req *r);
void api_coupon_use(struct node_ctx *nc, struct req *r);
void api_coupon_release(struct node_ctx *nc, struct req *r);
/* GET /market/admin/coupon/reserves[?id=N], POST /market/admin/coupon/reserve/return
 * {"id": N, "incarnation": "..."} (api_reserve.c, lib/node/reserve_admin.h). */
void api_reserve_list(struct node_ctx *nc, struct req *r);
void api_reserve_return(struct node_ctx *nc, struct req *r);

#endif
