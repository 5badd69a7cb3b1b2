/* route.h - the routes of coupon-fcgi and their handlers. */
#ifndef CS_ROUTE_H
#define CS_ROUTE_H

struct worker;
struct req;

/* Finds the route of r->path, checks the method (405 otherwise) and runs
 * its handler; unknown paths get 404 NOT_FOUND. */
void route_dispatch(struct worker *w, struct req *r);

void seize_handle(struct worker *w, struct req *r);
void status_handle(struct worker *w, struct req *r);
void admin_preheat(struct worker *w, struct req *r);
void admin_revoke(struct worker *w, struct req *r);
/* POST /market/admin/coupon/reconcile {"id": N}: Redis stock back to
 * MySQL's total minus the seize list (reconcile.h). */
void admin_reconcile(struct worker *w, struct req *r);
void admin_health(struct worker *w, struct req *r);
void metrics_handle(struct worker *w, struct req *r);
/* GET / POST / PUT /market/admin/coupon/activity (activity_api.c). */
void activity_handle(struct worker *w, struct req *r);
/* GET /market/consumer/coupon/mine, POST /market/service/coupon/{use,release}
 * (coupon_api.c). use and release set r->audit_action when an admin calls. */
void coupon_mine_handle(struct worker *w, struct req *r);
void coupon_use_handle(struct worker *w, struct req *r);
void coupon_release_handle(struct worker *w, struct req *r);
/* GET /market/admin/coupon/reserves[?id=N], POST /market/admin/coupon/reserve/return
 * {"id": N, "incarnation": "..."} (reserve_api.c, lib/reserve_admin.h). */
void reserve_list_handle(struct worker *w, struct req *r);
void reserve_return_handle(struct worker *w, struct req *r);

#endif
