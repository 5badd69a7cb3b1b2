/* breaker.c - the circuit breaker, for the node and for each shard. */
#include "breaker.h"
#include "conf.h"
#include "cs.h"
#include "keys.h"
#include "log.h"
#include "seize_rules.h"
#include "shm.h"

#include <inttypes.h>
#include <stdatomic.h>

int breaker_allow(struct shm_breaker *b, int64_t now_ms, int64_t lease_ms)
{
    if (atomic_load(&b->state) == BREAKER_CLOSED)
        return 1;
    if (now_ms < atomic_load(&b->open_until_ms))
        return 0;
    /* One probe at a time; a probe whose worker died loses its lease. */
    int64_t lease = atomic_load(&b->probe_until_ms);
    if (lease > now_ms)
        return 0;
    if (!atomic_compare_exchange_strong(&b->probe_until_ms, &lease, now_ms + lease_ms))
        return 0;
    atomic_store(&b->state, BREAKER_HALF_OPEN);
    return 1;
}

int breaker_success(struct shm_breaker *b)
{
    if (atomic_load(&b->failures) != 0)
        atomic_store(&b->failures, 0);
    if (atomic_load(&b->state) == BREAKER_CLOSED)
        return 0;
    int prev = atomic_exchange(&b->state, BREAKER_CLOSED);
    atomic_store(&b->probe_until_ms, 0);
    return prev != BREAKER_CLOSED;
}

int breaker_failure(struct shm_breaker *b, int64_t now_ms, int threshold, int open_ms)
{
    int f = atomic_fetch_add(&b->failures, 1) + 1;
    int state = atomic_load(&b->state);

    if (state == BREAKER_HALF_OPEN || (state == BREAKER_CLOSED && f >= threshold)) {
        atomic_store(&b->open_until_ms, now_ms + open_ms);
        atomic_store(&b->probe_until_ms, 0);
        return atomic_exchange(&b->state, BREAKER_OPEN) == BREAKER_CLOSED;
    }
    return 0;
}

struct shm_breaker *breaker_of(const struct cs_conf *c, struct shm_node *shm, int shard)
{
    if (!c->redis_cluster)
        return &shm->breaker;
    if (shard < 0 || shard >= KEYS_SHARDS)
        return NULL;
    return &shm->shard_breaker[shard];
}

int64_t breaker_probe_lease(const struct cs_conf *c)
{
    int64_t call = 2 * ((int64_t)c->redis_connect_timeout_ms + c->redis_command_timeout_ms);
    return call > c->fallback_budget_ms ? call : c->fallback_budget_ms;
}

int breaker_seize_allowed(const struct cs_conf *c, struct shm_node *shm, int shard)
{
    struct shm_breaker *b = breaker_of(c, shm, shard);
    return b == NULL || breaker_allow(b, cs_mono_ms(), breaker_probe_lease(c));
}

/* The node's last seize fault, for health and the metrics: written only when
 * it changed. */
static void breaker_note_fault(struct shm_node *shm, enum rconn_fault fault)
{
    if (atomic_load_explicit(&shm->breaker.fault, memory_order_relaxed) != (int)fault)
        atomic_store(&shm->breaker.fault, (int)fault);
}

/* Opens b after a failure when it is due; counts and logs an opening. */
static void breaker_fail(const struct cs_conf *c, struct shm_node *shm, struct shm_breaker *b,
                         int shard, int threshold, const char *why, const char *errstr)
{
    if (!breaker_failure(b, cs_mono_ms(), threshold, c->redis_breaker_open_ms))
        return;
    atomic_fetch_add(&shm->m.breaker_opened, 1);
    if (errstr == NULL && !c->redis_cluster)
        log_warn("redis breaker opened: no seize answered for %d ms (fallback.budget_ms); "
                 "seizes answer 503 until a probe succeeds", c->fallback_budget_ms);
    else if (errstr == NULL)
        log_warn("redis breaker of shard %d opened: no seize answered for %d ms "
                 "(fallback.budget_ms); its seizes answer 503 until a probe succeeds", shard,
                 c->fallback_budget_ms);
    else if (!c->redis_cluster)
        log_warn("redis breaker opened (%s): %s; seizes answer 503 until a probe succeeds",
                 why, errstr);
    else
        log_warn("redis breaker of shard %d opened (%s): %s; its seizes answer 503 until a "
                 "probe succeeds", shard, why, errstr);
}

void breaker_seize_done(const struct cs_conf *c, struct shm_node *shm, int shard,
                        enum rconn_fault fault, const struct rconn *rc)
{
    struct shm_breaker *b = breaker_of(c, shm, shard);

    if (b == NULL)
        return;
    if (!c->redis_cluster)
        breaker_note_fault(shm, fault);
    if (fault == RCONN_FAULT_NONE) {
        if (!breaker_success(b))
            return;
        if (c->redis_cluster)
            log_notice("redis shard %d is back: its breaker closed", shard);
        else
            log_notice("redis is back: breaker closed");
        return;
    }
    breaker_count_failure(shm, rc);
    breaker_fail(c, shm, b, shard, c->redis_breaker_failures, rconn_fault_name(fault),
                 rc->errstr);
}

void breaker_count_failure(struct shm_node *shm, const struct rconn *rc)
{
    if (rc->err == RCONN_ERR_TIMEOUT)
        atomic_fetch_add(&shm->m.redis_timeouts, 1);
    else
        atomic_fetch_add(&shm->m.redis_errors, 1);
}

/* Opens shard's breaker at once: Redis answered no seize for a budget. */
static void breaker_open_silent(const struct cs_conf *c, struct shm_node *shm, int shard)
{
    struct shm_breaker *b = breaker_of(c, shm, shard);
    if (b == NULL)
        return;
    if (!c->redis_cluster)
        breaker_note_fault(shm, RCONN_FAULT_DOWN);
    breaker_fail(c, shm, b, shard, 1, NULL, NULL);
}

void breaker_seize_silent(const struct cs_conf *c, struct shm_node *shm, int shard)
{
    atomic_fetch_add(&shm->m.redis_timeouts, 1);
    breaker_open_silent(c, shm, shard);
}

/* The silence after which Redis is asked: as long as a seize sent right
 * after the last answer waits for its own (the budget less the margin). A
 * seize whose budget went while every worker waited on Redis sees no more
 * than that, and no timeout past a budget may come at all. */
static int64_t breaker_ask_after_ms(const struct cs_conf *c)
{
    return c->fallback_budget_ms - seize_rules_margin(c->fallback_budget_ms);
}

enum breaker_unanswered breaker_seize_unanswered(const struct cs_conf *c, struct shm_node *shm,
                                                 int shard, const struct rconn *rc)
{
    if (rc->err != RCONN_ERR_TIMEOUT) {
        breaker_seize_done(c, shm, shard, RCONN_FAULT_DOWN, rc);
        return BREAKER_FAILED;
    }
    int64_t silence = breaker_seize_silence_ms(c, shm, shard);
    if (silence < breaker_ask_after_ms(c)) {
        atomic_fetch_add(&shm->m.redis_timeouts, 1);
        return BREAKER_WAITED;
    }
    if (silence < 2 * (int64_t)c->fallback_budget_ms) {
        atomic_fetch_add(&shm->m.redis_timeouts, 1);
        return BREAKER_ASK;
    }
    breaker_seize_silent(c, shm, shard);
    return BREAKER_FAILED;
}

int breaker_seize_ask_due(const struct cs_conf *c, struct shm_node *shm, int shard)
{
    struct shm_breaker *b = breaker_of(c, shm, shard);
    return b != NULL && atomic_load(&b->state) == BREAKER_CLOSED
           && breaker_seize_silence_ms(c, shm, shard) >= breaker_ask_after_ms(c);
}

int breaker_seize_ask(const struct cs_conf *c, struct shm_node *shm, int shard, struct rconn *rc,
                      const struct rconn_site *site)
{
    struct shm_breaker *b = breaker_of(c, shm, shard);
    if (b == NULL || atomic_load(&b->state) != BREAKER_CLOSED)
        return 0; /* another worker opened it meanwhile: nothing to ask */
    int64_t silence = breaker_seize_silence_ms(c, shm, shard);
    if (silence < breaker_ask_after_ms(c))
        return 1; /* another worker's seize was answered meanwhile */
    /* No longer than the margin a late seize is given: the users queued
     * behind this worker wait for it. */
    int ms = seize_rules_margin(c->fallback_budget_ms);
    if (ms > c->redis_connect_timeout_ms)
        ms = c->redis_connect_timeout_ms;
    if (rconn_ping_fresh(rc, site, ms)) {
        atomic_fetch_add(&shm->m.breaker_asked_alive, 1);
        log_notice("redis answered no seize for %" PRId64 " ms but answers a PING: slow, "
                   "not gone; the breaker stays closed", silence);
        return 1;
    }
    /* The ping took a while: open only what is still closed and silent. */
    if (atomic_load(&b->state) == BREAKER_CLOSED
        && breaker_seize_silence_ms(c, shm, shard) >= breaker_ask_after_ms(c))
        breaker_open_silent(c, shm, shard);
    return 0;
}

/* Where the last answer to a seize on shard is noted: the shard's breaker on
 * a cluster, else the node's. */
static _Atomic int64_t *breaker_answer_slot(const struct cs_conf *c, struct shm_node *shm,
                                            int shard)
{
    struct shm_breaker *b = breaker_of(c, shm, shard);
    return b != NULL ? &b->answer_ms : &shm->breaker.answer_ms;
}

void breaker_seize_answered(const struct cs_conf *c, struct shm_node *shm, int shard)
{
    _Atomic int64_t *at = breaker_answer_slot(c, shm, shard);
    int64_t now = cs_mono_ms();
    /* Shared by every worker: written only when it moved, not per seize. */
    if (now - atomic_load_explicit(at, memory_order_relaxed) >= 5)
        atomic_store_explicit(at, now, memory_order_relaxed);
}

int64_t breaker_seize_silence_ms(const struct cs_conf *c, struct shm_node *shm, int shard)
{
    int64_t at = atomic_load_explicit(breaker_answer_slot(c, shm, shard), memory_order_relaxed);
    return at > 0 ? cs_mono_ms() - at : INT64_MAX;
}

int breaker_readable(struct shm_node *shm)
{
    /* Once the open interval is over a read is tried again: a node whose
     * seizes all need metadata it has not cached (a sale that started
     * during the outage) would otherwise never send the seize that probes
     * and closes the breaker. */
    return atomic_load(&shm->breaker.state) == BREAKER_CLOSED
           || atomic_load(&shm->breaker.fault) != RCONN_FAULT_DOWN
           || cs_mono_ms() >= atomic_load(&shm->breaker.open_until_ms);
}

int breaker_retry_after(const struct cs_conf *c)
{
    int s = (c->redis_breaker_open_ms + 999) / 1000;
    return s > 0 ? s : 1;
}
