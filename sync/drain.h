/* drain.h - moves one shard's queue of seized coupons from Redis into MySQL in batches. */
#ifndef CS_DRAIN_H
#define CS_DRAIN_H

#include <stdatomic.h>
#include <stdint.h>
#include <stddef.h>

struct cs_conf;
struct mconn;
struct rconn;
struct drain_worker;

enum drain_result {
    DRAIN_EMPTY,               /* the shard's queue was drained */
    DRAIN_BUSY,                /* another process holds the shard's lock: skipped */
    DRAIN_STOPPED,             /* *stop was set; stopped after a whole batch */
    DRAIN_MORE,                /* budget_ms used up with entries left: next tick */
    DRAIN_LOST_LOCK,           /* the lock expired or was taken over; stopped */
    DRAIN_FAILED,              /* Redis or MySQL failed; the rest stays queued */
};

struct drain_opts {
    int batch;                 /* entries per MySQL transaction (sync.batch) */
    int lock_ttl_ms;           /* sync.lock_ttl_ms */
    const atomic_int *stop;    /* polled between batches */
    int64_t budget_ms;         /* 0, or stop after a full scan past this long */
};

/* A worker owns one Redis and one MySQL connection (made from conf's redis and
 * mysql keys, connected lazily) plus its buffers. One per thread; MUST NOT be
 * shared between threads. Free with drain_worker_free() on the same thread. */
struct drain_worker *drain_worker_new(const struct cs_conf *conf);
void drain_worker_free(struct drain_worker *w);

/* The worker's connections, for other work of the same task on the same thread. */
struct rconn *drain_worker_rconn(struct drain_worker *w);
struct mconn *drain_worker_mconn(struct drain_worker *w);

/*
 * Drains queue shard SHARD until it is empty: takes the shard lock, then per
 * batch writes the coupons and the stock decrement in one MySQL transaction,
 * commits, and only then HDELs the batch. Entries that can never be written
 * (malformed field or value, unknown activity) move to the shard's dead-letter
 * hash. Failures are logged once per outage and counted in smetrics; nothing is
 * removed from the queue that is not committed or dead-lettered.
 */
enum drain_result drain_shard(struct drain_worker *w, int shard, const struct drain_opts *o);

const char *drain_result_name(enum drain_result r);

/*
 * The shard lock LOCK:COUPON:SYNC:{i} (SET NX PX with a random token). Every
 * writer of a shard's queue into MySQL and every reader that needs the shard
 * still (reconciliation) takes it. Each returns 1 on success, 0 when the lock
 * is someone else's, -1 on a Redis error (rc->errstr says why).
 */
#define DRAIN_TOKEN_MAX 96

/* Takes the lock for ttl_ms; writes the token (toklen >= DRAIN_TOKEN_MAX). */
int drain_lock_take(struct rconn *rc, int shard, int ttl_ms, char *token, size_t toklen);

/* Extends the lock to ttl_ms when it still holds TOKEN (compare-and-PEXPIRE). */
int drain_lock_renew(struct rconn *rc, int shard, const char *token, int ttl_ms);

/* Deletes the lock when it still holds TOKEN (compare-and-delete). */
int drain_lock_release(struct rconn *rc, int shard, const char *token);

#endif
