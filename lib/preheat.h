/* preheat.h - activities from MySQL into Redis: preheat (the ACTIVITY:LIST,
 * META, WINDOW and stock fields of every activity on sale or soon) and
 * revoke. Used by coupon-fcgi's admin routes and coupon-sync's jobs. */
#ifndef CS_PREHEAT_H
#define CS_PREHEAT_H

#include <stddef.h>
#include <stdint.h>

struct mconn;
struct rconn;

struct preheat_result {
    int loaded;                /* activities written to ACTIVITY:LIST */
    int created;               /* stock fields newly set */
    int restored;              /* of those, rebuilt from MySQL after Redis data loss */
    int64_t select_ms;         /* time spent reading MySQL */
    int64_t write_ms;          /* time spent reading and writing Redis */
};

/* Seconds an activity stays served after its window ended (sync.cleanup_grace_s
 * default), so a late seize answers ENDED. */
#define ACTIVITY_GRACE_S 86400

/* Preheat: re-applies the Redis side of every revoke (status 4 in MySQL);
 * selects from MySQL in one query the activities not voided, not ended (or
 * ended less than grace_s ago, so late seizes answer ENDED), starting within
 * horizon_days; per shard, pipelined, writes each one's COUPON:ACTIVITY:META
 * field (activity_to_text) and COUPON:ACTIVITY:WINDOW field when they
 * changed, and then, only if absent, its stock field (a live sale is never
 * reset); ACTIVITY:LIST last. When a stock field is absent but MySQL or the
 * queue hold coupons of the activity (Redis lost its data), stock = total_num
 * - coupons in MySQL - entries still queued, and the seize list is rebuilt
 * from MySQL and the queue before the stock field appears. Safe to run from
 * several processes at once. CS_ERR with a message in err on failure. */
int activity_preheat(struct mconn *mc, struct rconn *rc, int horizon_days, int grace_s,
                     struct preheat_result *res, char *err, size_t errlen);

/* The same for activity ID alone (after it was created or changed): its
 * META, WINDOW and stock fields, then ACTIVITY:LIST rewritten from a fresh
 * MySQL read, so the change is listed at once. res->loaded is 0 when ID is
 * not one preheat serves (unknown, voided, ended past the grace, beyond the
 * horizon); it then leaves the list.
 *
 * Every write of ACTIVITY:LIST (here, preheat, revoke) reads its generation
 * (KEY_ACTIVITY_LIST_GEN) before MySQL and writes only if it is unchanged,
 * bumping it; a writer that lost reads MySQL again. So the list never goes
 * back to a MySQL read older than one already published. */
int activity_preheat_one(struct mconn *mc, struct rconn *rc, int64_t id, int horizon_days,
                         int grace_s, struct preheat_result *res, char *err, size_t errlen);

/* Revoke, Redis first: id added to ACTIVITY:VOIDED and the stock field set
 * to ACTIVITY_STOCK_VOIDED; then in MySQL status 4 and unused coupons voided;
 * then ACTIVITY:LIST rewritten without it. A failure part way leaves Redis
 * voided (never MySQL voided while Redis sells); a repeat finishes it.
 * Idempotent. *found = 0 when no such activity. */
int activity_revoke(struct mconn *mc, struct rconn *rc, int64_t id, int horizon_days,
                    int *found, char *err, size_t errlen);

#endif
