/* route.h - the route table of coupon-fcgi: path and method to handler (api.h). */
#ifndef CS_ROUTE_H
#define CS_ROUTE_H

struct node_ctx;
struct req;

/* Finds the route of r->path, checks the method (405 otherwise) and runs
 * its handler; unknown paths get 404 NOT_FOUND. */
void route_dispatch(struct node_ctx *nc, struct req *r);

#endif
