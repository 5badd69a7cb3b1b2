/* revoke.h - voiding an activity (POST /market/admin/coupon/revoke). */
#ifndef CS_REVOKE_H
#define CS_REVOKE_H

#include <stddef.h>
#include <stdint.h>

struct mconn;
struct preheat_vec;
struct rconn;

/* Revoke, Redis first: id added to ACTIVITY:VOIDED and the stock field set
 * to ACTIVITY_STOCK_VOIDED; then in MySQL status 4 and unused coupons voided;
 * then ACTIVITY:LIST rewritten without it. A failure part way leaves Redis
 * voided (never MySQL voided while Redis sells); a repeat finishes it.
 * Idempotent. *found = 0 when no such activity. */
int revoke_activity(struct mconn *mc, struct rconn *rc, int64_t id, int horizon_days,
                    int *found, char *err, size_t errlen);

/* The Redis side of a revoke: id in ACTIVITY:VOIDED, its version the
 * highest, its stock field the tombstone ACTIVITY_STOCK_VOIDED. A preheat
 * re-applies it for every voided activity. Idempotent. CS_ERR with a
 * message in err. */
int revoke_apply_redis(struct rconn *rc, int64_t id, char *err, size_t errlen);

/* Re-applies the Redis side of every revoke MySQL knows of that could still
 * matter (ended less than grace_s ago), or with since_s > 0 of those made
 * since then (by hand in SQL too), so MySQL never says voided while Redis
 * sells. *n gets how many (may be NULL). */
int revoke_reapply(struct mconn *mc, struct rconn *rc, int64_t since_s, int grace_s, int *n,
                   char *err, size_t errlen);

/* Drops from vec the activities whose id is in ACTIVITY:VOIDED: revoked
 * since the SELECT, they stay out of the list, and their stock field holds
 * the revoke's tombstone. */
int revoke_drop_voided(struct rconn *rc, struct preheat_vec *vec, char *err, size_t errlen);

#endif
