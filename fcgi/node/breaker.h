/* breaker.h - the circuit breaker in front of Redis: one for the node on a
 * single Redis, one per shard on a cluster, each a struct shm_breaker in the
 * node's shared memory, fed by seize-script calls only. */
#ifndef CS_BREAKER_H
#define CS_BREAKER_H

#include <stdint.h>

#include "rconn.h"

struct cs_conf;
struct shm_node;
struct shm_breaker;

/*
 * One breaker. breaker_allow() returns 1 when a call may be made at now_ms:
 * always while closed; once the open interval is over, to exactly one caller
 * at a time (the probe, holding a lease of lease_ms; a probe whose worker
 * died loses its lease). breaker_success() returns 1 when it closed an open
 * breaker; breaker_failure() returns 1 when it opened a closed one (after
 * threshold failures in a row, or at once from half-open).
 */
int breaker_allow(struct shm_breaker *b, int64_t now_ms, int64_t lease_ms);
int breaker_success(struct shm_breaker *b);
int breaker_failure(struct shm_breaker *b, int64_t now_ms, int threshold, int open_ms);

/* The breaker of a seize on shard: the node's on a single Redis, the shard's
 * own on a cluster (one master failing never turns away seizes for shards
 * the others serve). NULL on a cluster for a shard out of range. */
struct shm_breaker *breaker_of(const struct cs_conf *c, struct shm_node *shm, int shard);

/* How long one worker's probe of an open breaker may take before another may
 * probe: a seize waits for Redis up to its budget (fallback.budget_ms), other
 * calls a connect and two command timeouts (one resend). */
int64_t breaker_probe_lease(const struct cs_conf *c);

/* Whether a seize on shard may be sent now (one probe at a time while open). */
int breaker_seize_allowed(const struct cs_conf *c, struct shm_node *shm, int shard);

/* Reports how a seize call on shard went (RCONN_FAULT_NONE: a script answer
 * came back); rc is the connection it used, for the timeout/error counters
 * and the log. Reads elsewhere never feed a breaker: a Redis that answers
 * reads but refuses writes must keep it open. */
void breaker_seize_done(const struct cs_conf *c, struct shm_node *shm, int shard,
                        enum rconn_fault fault, const struct rconn *rc);

/* Counts a failed call on rc in the node's metrics: a timeout, or an error. */
void breaker_count_failure(struct shm_node *shm, const struct rconn *rc);

/* A seize got no answer after Redis answered none for a whole budget: not
 * slow but gone (a stopped Redis), so the breaker opens at once rather than
 * after redis.breaker_failures more seizes each waited out their budget. */
void breaker_seize_silent(const struct cs_conf *c, struct shm_node *shm, int shard);

enum breaker_unanswered {
    BREAKER_WAITED,            /* slow, not gone: counted as a timeout only */
    BREAKER_ASK,               /* silent for a budget: ask Redis once answered */
    BREAKER_FAILED             /* a failure (which opens it after the threshold),
                                  or silent for two budgets (opened) */
};

/*
 * A seize call (or a batch) was written to Redis on shard and got no answer
 * within its budget; rc is the connection it waited on. A slow Redis is not
 * a missing one, and a machine that stalled is not a silent Redis:
 *   - a failed connection (not a timeout) is a breaker failure;
 *   - while Redis answered some seize within the budget less the margin
 *     (as long as a seize waits for its answer), a timeout is counted and
 *     nothing more (a write pause shorter than the budget);
 *   - no seize answered for that long, but not for two budgets: BREAKER_ASK,
 *     the caller answers its user and then calls breaker_seize_ask(), which
 *     opens the breaker unless Redis answers a PING on a new connection
 *     (a write pause or a stalled machine answers at once, a cut or stopped
 *     Redis does not);
 *   - silent for two budgets: the breaker opens at once.
 */
enum breaker_unanswered breaker_seize_unanswered(const struct cs_conf *c, struct shm_node *shm,
                                                 int shard, const struct rconn *rc);

/* Whether an ask (after BREAKER_ASK, or a seize whose budget went before it
 * could be sent) is wanted: shard's breaker is closed and no seize on it was
 * answered for the budget less the margin, as long as a seize waits. A
 * caller with work to do before asking (a slot-map refresh) checks this
 * first. */
int breaker_seize_ask_due(const struct cs_conf *c, struct shm_node *shm, int shard);

/* After BREAKER_ASK, once the user is answered: opens shard's breaker at
 * once unless it is no longer closed, a seize was answered meanwhile, or the
 * Redis of site answers a PING on a new connection within the margin
 * (seize_rules_margin(), at most redis.connect_timeout_ms). Returns 1 when
 * Redis answered. */
int breaker_seize_ask(const struct cs_conf *c, struct shm_node *shm, int shard, struct rconn *rc,
                      const struct rconn_site *site);

/* Redis answered a seize script on shard (any reply): it is there, if slow. */
void breaker_seize_answered(const struct cs_conf *c, struct shm_node *shm, int shard);

/* How long Redis has answered no seize on shard (ms), node-wide. */
int64_t breaker_seize_silence_ms(const struct cs_conf *c, struct shm_node *shm, int shard);

/* Whether a read (metadata, status) is worth trying: not while the node's
 * breaker is open because Redis is unreachable, until its open interval is
 * over. Reads never feed the breaker. */
int breaker_readable(struct shm_node *shm);

/* Seconds a client should wait while Redis is unavailable. */
int breaker_retry_after(const struct cs_conf *c);

#endif
