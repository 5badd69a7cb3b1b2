/* jobs.h - coupon-sync's jobs besides draining: preheat, the status job and the
 * queue-depth gauge (main thread), reconciliation (each shard's task). */
#ifndef CS_JOBS_H
#define CS_JOBS_H

#include <stdint.h>

struct mconn;
struct rconn;
struct preheat_mark;

/* activity_preheat_pass() with logging: a full pass when mark->since_s is 0,
 * else what changed since mark (relist: rewrite ACTIVITY:LIST even when
 * nothing changed). Failures go through smetrics (logged once per outage).
 * CS_OK or CS_ERR. */
int jobs_preheat(struct mconn *mc, struct rconn *rc, int horizon_days, int grace_s,
                 struct preheat_mark *mark, int relist);

/* activity_advance_status() with logging, as jobs_preheat(). */
int jobs_status(struct mconn *mc, struct rconn *rc);

/*
 * For the activities of SHARD (not revoked) that changed in MySQL since the
 * shard's last reconciliation (updated_at: a drain, a top-up, a change by
 * hand), and every full_interval_s for every sale open or ended within the
 * hour, checks Redis stock + entries queued for it + coupons in MySQL == total_num
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
                         int full_interval_s, int *mismatches);

/* Removes from Redis every activity whose window ended more than grace_s
 * ago and of which nothing is queued: stock field, seize list, window, META,
 * VER and ENDS entries. It finds them in COUPON:ACTIVITY:ENDS:{i} (sorted
 * by end time: only what is due is read), or with full set by parsing every
 * META field (for fields written before ENDS existed; rare). A late seize
 * then answers ENDED (a worker's cached metadata) or NO_SUCH_ACTIVITY, never
 * SEIZED. *removed gets the count. */
int jobs_expire(struct rconn *rc, int grace_s, int full, int *removed);

/*
 * The coupon lifecycle's pass (lib/coupon.c): first return on expiry (MySQL
 * per coupon, then the Redis step per shard under the shard's sync lock,
 * lock_ttl_ms), then the plain expiry in batches of batch rows. *expired
 * gets the coupons expired without return, *returned those returned; both
 * counted in the metrics. CS_OK or CS_ERR (logged through smetrics).
 */
int jobs_coupons(struct mconn *mc, struct rconn *rc, int batch, int lock_ttl_ms,
                 uint64_t *expired, uint64_t *returned);

/* Routes a job's failure: a dropped connection (rc->ctx or mc->my NULL) is an
 * outage of that dependency, logged once by smetrics; anything else is
 * counted as an error and logged at error. Either of mc, rc may be NULL. */
void jobs_fail(struct mconn *mc, struct rconn *rc, const char *what, const char *err);

/* HLEN of every queue shard into the queue-depth gauges; *total gets the sum. */
int jobs_queue_depth(struct rconn *rc, int64_t *total);

/* Frees what reconciliation remembers between calls; at exit. */
void jobs_cleanup(void);

#endif
