/* jobs.h - coupon-sync's jobs besides draining: preheat, the status job and the
 * queue-depth gauge (main thread), reconciliation (each shard's task). */
#ifndef CS_JOBS_H
#define CS_JOBS_H

#include <stdint.h>

struct mconn;
struct rconn;

/* activity_preheat() with logging; failures go through smetrics (logged once
 * per outage). CS_OK or CS_ERR. */
int jobs_preheat(struct mconn *mc, struct rconn *rc, int horizon_days, int grace_s);

/* activity_advance_status() with logging, as jobs_preheat(). */
int jobs_status(struct mconn *mc, struct rconn *rc);

/*
 * For every activity of SHARD in COUPON:ACTIVITY:META:{i} (not revoked)
 * checks Redis stock + entries queued for it + coupons in MySQL == total_num
 * (one pipeline, one query), holding the shard lock
 * (lock_ttl_ms) so no drain moves entries while they are counted; when the
 * lock is taken the shard is skipped. Call it right after the shard was
 * drained: entries committed but not yet HDEL'd (a crashed drain) would count
 * twice. A mismatch that reads the same twice (a live sale moves the numbers)
 * is logged at warning and counted in
 * couponseize_sync_reconcile_mismatches_total; *mismatches gets the count.
 * Thread-safe for different shards; MUST NOT run twice at once for one shard.
 */
int jobs_reconcile_shard(struct mconn *mc, struct rconn *rc, int shard, int lock_ttl_ms,
                         int *mismatches);

/* Removes from Redis every activity whose window ended more than grace_s
 * ago (by its COUPON:ACTIVITY:META field) and of which nothing is queued:
 * stock field, seize list, window and META fields. A late seize then answers
 * ENDED (a worker's cached metadata) or NO_SUCH_ACTIVITY, never SEIZED.
 * *removed gets the count. */
int jobs_expire(struct rconn *rc, int grace_s, int *removed);

/*
 * The coupon lifecycle's pass (lib/coupon.c): first return on expiry (MySQL
 * per coupon, then the Redis step per shard under the shard's sync lock,
 * lock_ttl_ms), then the plain expiry in batches of batch rows. *expired
 * gets the coupons expired without return, *returned those returned; both
 * counted in the metrics. CS_OK or CS_ERR (logged through smetrics).
 */
int jobs_coupons(struct mconn *mc, struct rconn *rc, int batch, int lock_ttl_ms,
                 uint64_t *expired, uint64_t *returned);

/* HLEN of every queue shard into the queue-depth gauges; *total gets the sum. */
int jobs_queue_depth(struct rconn *rc, int64_t *total);

/* Frees what reconciliation remembers between calls; at exit. */
void jobs_cleanup(void);

#endif
