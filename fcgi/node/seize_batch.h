/* seize_batch.h - a seize through the node's group commit (lib/node/batch.c). */
#ifndef CS_SEIZE_BATCH_H
#define CS_SEIZE_BATCH_H

#include <stdint.h>

#include "activity.h"
#include "breaker.h"
#include "req/req.h"
#include "ctx.h"

/* The seize handler's own ways of answering one seize, each answering r. */
struct seize_batch_ops {
    /* Today's path: one EVALSHA of seize.lua for this seize alone. */
    void (*alone)(struct node_ctx *nc, struct req *r, struct activity *a, int64_t uid, void *arg);
    /* The seize never reached Redis: the node's reserve, else UNAVAILABLE. */
    void (*unreached)(struct node_ctx *nc, struct req *r, struct activity *a, int64_t uid,
                      void *arg);
};

/*
 * Answers the seize of activity a by user uid, due by deadline_ms
 * (monotonic; the caller has set it on w->rc too): with limits.batch_max > 1
 * through the shard's queue, alone (ops->alone) when no other seize of the
 * shard waits or batching is off. Eligibility, the sold-out hint, the rate
 * limit and the breaker MUST have been judged before: every seize that gets
 * here goes to Redis or to ops->unreached.
 */
void seize_batched(struct node_ctx *nc, struct req *r, struct activity *a, int64_t uid,
                   int64_t deadline_ms, const struct seize_batch_ops *ops, void *arg);

/*
 * Answers r from a judgement the script settled, for a seize alone and for
 * one of a batch alike: code (seize_rules_outcome(), settled) and res, the
 * script's answer (the stock left after a grant, < 0 when not known). The
 * durability rule and the breaker are the caller's; this keeps the sold-out
 * hint, says what remains after a grant, and tells a sale that vanished
 * from Redis from one voided meanwhile.
 */
void seize_answer(struct node_ctx *nc, struct req *r, struct activity *a, enum cs_code code,
                  long long res);

/*
 * The durability rule, for a seize alone and for a batch alike: with
 * redis.wait_replicas, a grant is SEIZED only once it is held by as many
 * copies as the rule asks (rconn_copies(): the replicas of the granting
 * master that could take over, at most wait_replicas; none left: its own
 * AOF), so a failover right after cannot lose a coupon someone was told of;
 * an "already seized" is held to the same rule. The WAIT runs at site, the
 * connection that granted; with fence set (the answer found the grant
 * already made, so that connection wrote nothing) a write of shard's fence
 * key (built into k_fence, KEYS_MAX) goes first. CS_OK when confirmed.
 */
int seize_durable(struct node_ctx *nc, int shard, struct rconn_site *site, char *k_fence,
                  int fence);

/* The breaker of shard hears how a seize call on w->rc went (breaker.h). */
static inline void seize_breaker_done(struct node_ctx *nc, int shard, enum rconn_fault fault)
{
    breaker_seize_done(nc->conf, nc->shm, shard, fault, nc->rc);
}

/* The durability rule did not confirm a seize call's grants on shard:
 * a failure of its breaker (a shard that cannot keep what it sells stops
 * selling), unless the budget left no time to ask (a slow answer: the
 * silence rule judges those, and a pause shorter than the budget must not
 * open the breaker). */
static inline void seize_unconfirmed(struct node_ctx *nc, int shard)
{
    if (nc->rc->err != RCONN_ERR_DEADLINE)
        seize_breaker_done(nc, shard, RCONN_FAULT_ERROR);
}

/* A seize call on shard, written at site, got no answer within its budget
 * (breaker_seize_unanswered()): a Redis silent for a budget is asked
 * whether it is there once the user is answered (the worker loop). */
static inline void seize_unanswered(struct node_ctx *nc, int shard, const struct rconn_site *site)
{
    if (breaker_seize_unanswered(nc->conf, nc->shm, shard, nc->rc) == BREAKER_ASK) {
        nc->ask_pending = 1;
        nc->ask_shard = shard;
        nc->ask_site = *site;
        nc->ask_slot = -1;
    }
}

/* n seizes on shard were answered without Redis: their budget went before
 * they could be sent (waiting for a worker, or for the call ahead). That
 * says nothing new of Redis while it answers, but when no seize has been
 * answered for a whole budget the worker asks it, once its user is
 * answered, as after a timeout: a stall that holds every worker lets no
 * seize time out past a budget, and would otherwise never open the breaker. */
static inline void seize_budget_gone(struct node_ctx *nc, int shard, uint64_t n)
{
    atomic_fetch_add_explicit(&nc->shm->m.seize_budget_gone, n, memory_order_relaxed);
    if (!nc->ask_pending && breaker_seize_ask_due(nc->conf, nc->shm, shard)) {
        nc->ask_pending = 1;
        nc->ask_shard = shard;
        nc->ask_site = (struct rconn_site){.conn_id = 0, .node = -1};
        nc->ask_slot = nc->rc->cl != NULL ? (int)keys_shard_slot(shard) : -1;
    }
}

#endif
