/* req_names.c - the route names of req.h, in a file of their own so that a
 * test of the route table links them without the request helpers. */
#include "req.h"

const char *const route_names[ROUTE__COUNT] = {
    [ROUTE_SEIZE] = "seize",
    [ROUTE_STATUS] = "status",
    [ROUTE_PREHEAT] = "preheat",
    [ROUTE_REVOKE] = "revoke",
    [ROUTE_HEALTH] = "health",
    [ROUTE_METRICS] = "metrics",
    [ROUTE_ACTIVITY] = "activity",
    [ROUTE_RECONCILE] = "reconcile",
    [ROUTE_MINE] = "mine",
    [ROUTE_USE] = "use",
    [ROUTE_RELEASE] = "release",
    [ROUTE_RESERVES] = "reserves",
    [ROUTE_RESERVE_RETURN] = "reserve_return",
    [ROUTE_OTHER] = "other",
};
