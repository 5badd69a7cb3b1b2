/* jobs.h - coupon-sync's jobs besides draining: preheat, the status job and the
 * queue-depth gauge (main thread), reconciliation (each shard's task). */
#ifndef CS_JOBS_H
#define CS_JOBS_H

#include <stdint.h>

struct mconn;
struct rconn;

/* activity_preheat() with logging; failures go through smetrics (logged once
 * per outage). CS_OK or CS_ERR. */
int jobs_preheat(struct mconn *mc, struct rconn *rc, int horizon_days);

/* activity_advance_status() with logging, as jobs_preheat(). */
int jobs_status(struct mconn *mc, struct rconn *rc);

/*
 * For every activity of SHARD in ACTIVITY:LIST checks Redis stock + entries
 * queued for it + coupons in MySQL == total_num, holding the shard lock
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

/* HLEN of every queue shard into the queue-depth gauges; *total gets the sum. */
int jobs_queue_depth(struct rconn *rc, int64_t *total);

/* Frees what reconciliation remembers between calls; at exit. */
void jobs_cleanup(void);

#endif
