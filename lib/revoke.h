/* revoke.h - voiding an activity (POST /market/admin/coupon/revoke). */
#ifndef CS_REVOKE_H
#define CS_REVOKE_H

#include <stddef.h>
#include <stdint.h>

struct mconn;
struct rconn;

/* Revoke, Redis first: id added to ACTIVITY:VOIDED and the stock field set
 * to ACTIVITY_STOCK_VOIDED; then in MySQL status 4 and unused coupons voided;
 * then ACTIVITY:LIST rewritten without it. A failure part way leaves Redis
 * voided (never MySQL voided while Redis sells); a repeat finishes it.
 * Idempotent. *found = 0 when no such activity. */
int revoke_activity(struct mconn *mc, struct rconn *rc, int64_t id, int horizon_days,
                    int *found, char *err, size_t errlen);

#endif
