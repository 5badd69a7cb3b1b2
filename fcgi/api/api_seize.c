/* api_seize.c - POST /market/consumer/coupon/seize: one EVALSHA per seize, or a
 * place in the shard's next batch call (seize_batch.c). */
#include "api.h"
#include "node/breaker.h"
#include "conf.h"
#include "cs.h"
#include "node/durability.h"
#include "keys.h"
#include "log.h"
#include "node/meta.h"
#include "req/params.h"
#include "req/req.h"
#include "scripts.h"
#include "node/seize_batch.h"
#include "node/seize_rules.h"
#include "shm.h"
#include "node/ctx.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * The bounds [*lo, *hi] of Redis' clock that the fast path's window check
 * judges by (seize_rules_admit(); the script, by Redis' clock, is the
 * authority): Redis' clock as the keeper's last lease renewal on the
 * activity's shard bounds it where there is one, so a node whose own clock
 * is off never turns users away from an open sale. Without a renewal
 * (reserves off, none open, lease over) this host's clock, now_ms.
 */
static void seize_clock(const struct node_ctx *nc, int64_t id, int64_t now_ms, int64_t *lo,
                        int64_t *hi)
{
    *lo = *hi = now_ms;
    if (nc->conf->fallback_reserve > 0)
        (void)reserve_lease(&nc->shm->rsv, keys_shard(id), nc->conf->fallback_lease_ms,
                            cs_boot_ms(), lo, hi, NULL); /* leases run on CLOCK_BOOTTIME */
}

/*
 * Answers a seize that never reached Redis (refused, unreachable, the
 * breaker open): granted from the node's reserve while one is open and the
 * lease holds (internals.md rule 4),
 * else UNAVAILABLE, a promise that nothing was issued. meta_known: the
 * caller judged the activity's eligibility from its metadata (0: it could
 * not read it, and only a sale open to all is granted from).
 */
static void seize_unreached(struct node_ctx *nc, struct req *r, int64_t id, int64_t uid,
                            int meta_known)
{
    const struct cs_conf *c = nc->conf;
    char extra[96];

    switch (reserve_grant(nc->shm, nc->slot, c->fallback_journal, &nc->rj, c->fallback_lease_ms,
                          c->fallback_budget_ms, id, uid, meta_known)) {
    case RESERVE_SEIZED:
        /* The stock in Redis is not known here; the coupon reaches it (and
         * MySQL after it) when the journal is replayed. */
        snprintf(extra, sizeof(extra),
                 "\"activityId\":%" PRId64 ",\"remaining\":null,\"pending\":true", id);
        req_reply(r, CODE_SEIZED, "seized from this node's reserve", extra, 0);
        return;
    case RESERVE_ALREADY:
        req_reply(r, CODE_ALREADY_SEIZED, NULL, NULL, 0);
        return;
    case RESERVE_UNKNOWN:
        req_reply(r, CODE_UNKNOWN_OUTCOME, NULL, NULL, breaker_retry_after(nc->conf));
        return;
    case RESERVE_NO_KEEPER:
        /* A node with reserves whose keeper is between two runs (a restart,
         * an upgrade in place): this user may hold a grant in the journal
         * that the grants table does not show yet, so UNAVAILABLE (nothing
         * issued) cannot be promised. */
        if (c->fallback_reserve > 0) {
            req_reply(r, CODE_UNKNOWN_OUTCOME, "this node's reserve keeper is restarting", NULL,
                      breaker_retry_after(nc->conf));
            return;
        }
        break;
    case RESERVE_NONE:
        break;
    }
    req_reply(r, CODE_UNAVAILABLE, NULL, NULL, breaker_retry_after(nc->conf));
}

/* The EVALSHA of one seize: keys and arguments, built once, sent up to
 * three times (a resend after a lost reply, a retry after the window heal). */
struct seize_call {
    char k_stock[KEYS_MAX], k_list[KEYS_MAX], k_queue[KEYS_MAX], k_window[KEYS_MAX];
    char k_fence[KEYS_MAX];
    char s_aid[24], s_uid[24];
    const char *argv[6];
    size_t argl[6];
    int shard;
    struct rconn_site site;    /* the connection whose answer counts: a WAIT runs there */
    int64_t deadline_ms;       /* monotonic: the answer is due by then */
};

static void seize_call_init(struct seize_call *sc, int64_t id, int64_t uid)
{
    int shard = keys_shard(id);
    sc->shard = shard;
    sc->argl[0] = keys_stock(sc->k_stock, shard);
    sc->argl[1] = keys_seize_list(sc->k_list, id);
    sc->argl[2] = keys_queue(sc->k_queue, shard);
    sc->argl[3] = keys_window(sc->k_window, shard);
    sc->argl[4] = (size_t)snprintf(sc->s_aid, sizeof(sc->s_aid), "%" PRId64, id);
    sc->argl[5] = (size_t)snprintf(sc->s_uid, sizeof(sc->s_uid), "%" PRId64, uid);
    sc->argv[0] = sc->k_stock;
    sc->argv[1] = sc->k_list;
    sc->argv[2] = sc->k_queue;
    sc->argv[3] = sc->k_window;
    sc->argv[4] = sc->s_aid;
    sc->argv[5] = sc->s_uid;
}

/* The seize's deadline (seize_rules_deadline()): fallback.budget_ms from
 * when the web server got the request (or the worker took it). */
static int64_t seize_deadline(const struct node_ctx *nc, const struct req *r)
{
    int64_t got = params_request_start_ms(FCGX_GetParam("HTTP_X_REQUEST_START", r->fr->envp));
    return seize_rules_deadline(nc->conf->fallback_budget_ms, r->start_us / 1000, got,
                                cs_now_ms(), cs_mono_ms());
}

/* One EVALSHA that waits at most wait_ms for its answer (and at least wait_ms
 * less 10 %: a socket already set within that range is left alone, so that
 * a deadline moving by a few ms between seizes costs no system call). */
static redisReply *seize_send(struct node_ctx *nc, struct seize_call *sc, int wait_ms)
{
    rconn_set_timeout_range(nc->rc, wait_ms - wait_ms / 10, wait_ms);
    redisReply *rep = rconn_evalsha_at(nc->rc, &nc->script, 4, 6, sc->argv, sc->argl,
                                      &sc->site);
    rconn_set_timeout(nc->rc, 0);
    return rep;
}

/*
 * After a resend answered -1 (already seized): was the coupon granted by
 * this request's first EVALSHA, whose reply was lost, or by an earlier
 * request? The seize list holds the grant's time by Redis' clock; a grant
 * no older (by that same clock) than this request is this request's.
 * Sets *remaining to the stock now, -1 when unknown. Returns CODE_SEIZED or
 * CODE_ALREADY_SEIZED; CODE_SEIZED too when the lookup fails, since the
 * user holds a coupon either way.
 */
static enum cs_code seize_settle_resent(struct node_ctx *nc, struct seize_call *sc,
                                        int64_t age_ms, long long *remaining)
{
    redisReply *rep[3] = {NULL, NULL, NULL};
    enum cs_code code = CODE_SEIZED;
    int got = 0;

    *remaining = -1;
    if (rconn_append(nc->rc, sc->k_list, "HGET %s %s", sc->k_list, sc->s_uid) == CS_OK
        && rconn_append(nc->rc, sc->k_list, "TIME") == CS_OK
        && rconn_append(nc->rc, sc->k_stock, "HGET %s %s", sc->k_stock, sc->s_aid) == CS_OK)
        while (got < 3 && rconn_get_reply(nc->rc, &rep[got]) == CS_OK)
            got++;
    long long now_ms = got == 3 ? rconn_time_ms(rep[1]) : -1;
    if (now_ms >= 0 && rep[0]->type == REDIS_REPLY_STRING) {
        long long seized_ms = strtoll(rep[0]->str, NULL, 10);
        /* 50 ms of slack for the clock reads on either side. */
        if (now_ms - seized_ms > age_ms + 50)
            code = CODE_ALREADY_SEIZED;
        if (rep[2]->type == REDIS_REPLY_STRING)
            *remaining = strtoll(rep[2]->str, NULL, 10);
    } else {
        log_warn("seize %s for %s: cannot tell whether the resend's coupon is new: %s",
                 sc->s_aid, sc->s_uid, got == 3 ? "unexpected reply" : nc->rc->errstr);
    }
    for (int i = 0; i < got; i++)
        freeReplyObject(rep[i]);
    return code;
}

/* Writes the window of a (known from ACTIVITY:LIST) when Redis has none:
 * data preheated before the script judged windows itself. HSETNX: what
 * preheat wrote always wins. */
static int seize_heal_window(struct node_ctx *nc, struct seize_call *sc, const struct activity *a)
{
    redisReply *rep = rconn_command(nc->rc, sc->k_window, "HSETNX %s %s %" PRId64 ",%" PRId64,
                                    sc->k_window, sc->s_aid, a->start_ms, a->end_ms);
    int ok = rep != NULL && rep->type == REDIS_REPLY_INTEGER;
    if (ok && rep->integer == 1)
        log_notice("activity %" PRId64 ": window written from the activity list", a->id);
    if (rep != NULL)
        freeReplyObject(rep);
    return ok ? CS_OK : CS_ERR;
}

/*
 * Sends the seize script within the seize's deadline and feeds the breaker
 * with its failures (a success is reported by the caller, once the grant is
 * confirmed). CODE_OK with the script's answer in *res; CODE_UNAVAILABLE
 * when Redis certainly did not run it (no connection, no time left to send
 * it, or an error reply such as OOM, READONLY, BUSY: Redis refused it);
 * CODE_UNKNOWN_OUTCOME when it was written, its answer was lost, and
 * sending it once more on a fresh connection got no answer before the
 * deadline either. *resent is set when it was sent a second time.
 *
 * A slow Redis is waited for: only a refused or failed connection, an error
 * reply, or a seize left unanswered for its whole budget counts against the
 * breaker; an answer that came late but in time does not.
 */
static enum cs_code seize_eval(struct node_ctx *nc, struct seize_call *sc, long long *res,
                               int *resent)
{
    int64_t left = sc->deadline_ms - cs_mono_ms();
    if (left < 10) {
        /* Nothing sent: the budget went to what came before (the wait
         * for a free worker, a metadata read on a cold cache). */
        rconn_set_err(nc->rc, RCONN_ERR_DEADLINE, "seize", "no time left in the budget");
        seize_budget_gone(nc, sc->shard, 1);
        return CODE_UNAVAILABLE;
    }
    redisReply *rep = seize_send(nc, sc, seize_rules_first_wait(nc->conf->redis_command_timeout_ms, left));
    if (rep != NULL)
        breaker_seize_answered(nc->conf, nc->shm, sc->shard);
    if (rep == NULL && nc->rc->maybe_sent) {
        /* The script is idempotent per user, so the same call once more
         * tells the truth (rconn dropped the old connection). */
        breaker_count_failure(nc->shm, nc->rc);
        left = sc->deadline_ms - cs_mono_ms();
        if (left < 5) {
            log_debug("seize %s for %s: %s; no time left to ask again", sc->s_aid, sc->s_uid,
                      nc->rc->errstr);
            seize_unanswered(nc, sc->shard, &sc->site);
            return CODE_UNKNOWN_OUTCOME;
        }
        atomic_fetch_add_explicit(&nc->shm->m.seize_resends, 1, memory_order_relaxed);
        log_debug("seize %s for %s: %s; sending it once more", sc->s_aid, sc->s_uid,
                  nc->rc->errstr);
        *resent = 1;
        rep = seize_send(nc, sc, (int)left);
        if (rep != NULL)
            breaker_seize_answered(nc->conf, nc->shm, sc->shard);
        if (rep == NULL || rep->type != REDIS_REPLY_INTEGER) {
            log_debug("seize %s for %s: no answer to the resend either (%s)", sc->s_aid,
                      sc->s_uid, rep != NULL && rep->type == REDIS_REPLY_ERROR ? rep->str
                                                                               : nc->rc->errstr);
            if (rep != NULL)
                seize_breaker_done(nc, sc->shard, rconn_reply_fault(rep));
            else
                seize_unanswered(nc, sc->shard, &sc->site);
            if (rep != NULL)
                freeReplyObject(rep);
            return CODE_UNKNOWN_OUTCOME;
        }
    }
    if (rep == NULL) {
        seize_breaker_done(nc, sc->shard, RCONN_FAULT_DOWN);
        log_debug("seize %s for %s: %s", sc->s_aid, sc->s_uid, nc->rc->errstr);
        return CODE_UNAVAILABLE;
    }
    if (rep->type != REDIS_REPLY_INTEGER) {
        enum rconn_fault fault = rconn_reply_fault(rep);
        log_error("EVALSHA seize.lua for activity %s: %s", sc->s_aid,
                  rep->type == REDIS_REPLY_ERROR ? rep->str : "non-integer reply");
        freeReplyObject(rep);
        seize_breaker_done(nc, sc->shard, fault == RCONN_FAULT_NONE ? RCONN_FAULT_ERROR : fault);
        return CODE_UNAVAILABLE;
    }
    *res = rep->integer;
    freeReplyObject(rep);
    return CODE_OK;
}

/* The Redis part of a seize: the script, its settling and its WAIT; answers r. */
static void seize_grant(struct node_ctx *nc, struct req *r, struct seize_call *sc,
                        struct activity *a, int64_t uid)
{
    int64_t sent_at = cs_mono_ms();
    int resent = 0;
    long long res;

    enum cs_code code = seize_eval(nc, sc, &res, &resent);
    if (code == CODE_OK && res == SCRIPT_SEIZE_UNKNOWN && seize_heal_window(nc, sc, a) == CS_OK)
        code = seize_eval(nc, sc, &res, &resent); /* -3 changed nothing: ask again */
    if (code == CODE_UNAVAILABLE) {
        seize_unreached(nc, r, a->id, uid, 1); /* Redis certainly did not run it */
        return;
    }
    if (code != CODE_OK) {
        req_reply(r, code, NULL, NULL, breaker_retry_after(nc->conf));
        return;
    }

    if (res == SCRIPT_SEIZE_FOR_NOW) {
        seize_breaker_done(nc, sc->shard, RCONN_FAULT_NONE);
        seize_answer(nc, r, a, CODE_SOLD_OUT, res);
        return;
    }
    code = seize_rules_outcome(res);
    int settled = resent && res == SCRIPT_SEIZE_ALREADY;
    if (settled)
        code = seize_settle_resent(nc, sc, cs_mono_ms() - sent_at, &res);
    if (code == CODE_SEIZED)
        atomic_fetch_add_explicit(&nc->shm->m.seized_shard[sc->shard], 1, memory_order_relaxed);
    if ((code == CODE_SEIZED || code == CODE_ALREADY_SEIZED) &&
        seize_durable(nc, sc->shard, &sc->site, sc->k_fence, settled) != CS_OK) {
        /* Granted, not confirmed: the shard cannot keep what it sells now,
         * so its breaker hears of it like of any failure. A grant read back
         * (already seized) may be one whose own answer was lost
         * (UNKNOWN_OUTCOME) and that no replica holds yet: a failover now
         * would undo it, so it is held to the same rule. No fence write for
         * it (an fsync'd write per repeated press): Redis sets a client's
         * replication offset after every command it runs, a read-only
         * script too (processCommand(), Redis 7.0), so this WAIT already
         * covers the grant the script read. */
        log_warn("seize %" PRId64 " for %s: %s, not confirmed: %s", a->id, sc->s_uid,
                 code == CODE_SEIZED ? "granted" : "already seized", nc->rc->errstr);
        seize_unconfirmed(nc, sc->shard);
        req_reply(r, CODE_UNKNOWN_OUTCOME, NULL, NULL, breaker_retry_after(nc->conf));
        return;
    }
    seize_breaker_done(nc, sc->shard, RCONN_FAULT_NONE);
    seize_answer(nc, r, a, code, res);
}

/* The two ways a batched seize may be answered by this file (seize_batch.h). */
static void seize_alone(struct node_ctx *nc, struct req *r, struct activity *a, int64_t uid,
                        void *sc)
{
    seize_grant(nc, r, sc, a, uid);
}

static void seize_unreached_op(struct node_ctx *nc, struct req *r, struct activity *a, int64_t uid,
                               void *sc)
{
    (void)sc;
    seize_unreached(nc, r, a->id, uid, 1);
}

static const struct seize_batch_ops seize_ops = {seize_alone, seize_unreached_op};

/*
 * The request's own checks, before anything costs the node: a known user,
 * a well-formed body, then the node's rate (only such a request spends it:
 * a flood of garbage must not lock real users out) and its void hint.
 * CS_OK with the activity in *id, else CS_ERR after answering.
 */
static int seize_admission(struct node_ctx *nc, struct req *r, struct auth_identity *who,
                           int64_t *id)
{
    const struct cs_conf *c = nc->conf;
    const char *why;
    int retry;

    if (req_auth(r, 1, who) != CS_OK || req_read_body(r) != CS_OK)
        return CS_ERR;
    if (http_parse_id_body(r->body, r->body_len, id, &why) != CS_OK) {
        req_reply(r, CODE_BAD_REQUEST, why, NULL, 0);
        return CS_ERR;
    }
    if (!shm_bucket_take(nc->shm, cs_mono_us(), c->limits_node_rps, c->limits_burst, &retry)) {
        atomic_fetch_add_explicit(&nc->shm->m.rate_limited, 1, memory_order_relaxed);
        req_reply(r, CODE_TOO_MANY_REQUESTS, NULL, NULL, retry);
        return CS_ERR;
    }
    /* Node-wide hints first: they cost no Redis round trip. */
    if (shm_flag_test(nc->shm->voided, *id, cs_mono_ms())) {
        req_reply(r, CODE_VOIDED, NULL, NULL, 0);
        return CS_ERR;
    }
    return CS_OK;
}

/*
 * The activity's metadata, read within the seize's deadline (a metadata
 * read gets at most a third of what is left). CS_OK with it in *a, else
 * CS_ERR after answering (unknown, voided, or unreadable: the reserve's
 * business then, its eligibility unknown).
 */
static int seize_lookup(struct node_ctx *nc, struct req *r, int64_t id, int64_t uid,
                        int64_t deadline_ms, struct activity *a)
{
    int stale;
    int64_t left = deadline_ms - cs_mono_ms();

    if (left / 3 < nc->conf->redis_command_timeout_ms)
        rconn_set_timeout(nc->rc, (int)(left / 3));
    rconn_set_deadline(nc->rc, deadline_ms);
    enum meta_kind kind = meta_lookup(nc->meta, nc->rc, id, a, &stale);
    rconn_set_deadline(nc->rc, 0);
    rconn_set_timeout(nc->rc, 0);
    switch (kind) {
    case META_ABSENT:
        req_reply(r, CODE_NO_SUCH_ACTIVITY, NULL, NULL, 0);
        return CS_ERR;
    case META_VOIDED:
        req_reply(r, CODE_VOIDED, NULL, NULL, 0);
        return CS_ERR;
    case META_UNAVAILABLE:
        seize_unreached(nc, r, id, uid, 0); /* its eligibleGroups unknown */
        return CS_ERR;
    case META_FOUND:
        break;
    }
    return CS_OK;
}

void api_seize(struct node_ctx *nc, struct req *r)
{
    struct auth_identity who;
    struct activity a;
    struct seize_call sc;
    int64_t id, now = cs_now_ms(), lo, hi;

    if (seize_admission(nc, r, &who, &id) != CS_OK)
        return;
    sc.deadline_ms = seize_deadline(nc, r);
    if (seize_lookup(nc, r, id, who.user_id, sc.deadline_ms, &a) != CS_OK)
        return;
    /* Cached facts only; the script judges the window by Redis' clock. */
    seize_clock(nc, id, now, &lo, &hi);
    enum cs_code code = seize_rules_admit(&a, (const char (*)[40])who.groups, who.ngroups, lo,
                                          hi, shm_flag_test(nc->shm->soldout, id, cs_mono_ms()));
    if (code != CODE_OK) {
        if (code == CODE_SOLD_OUT)
            atomic_fetch_add_explicit(&nc->shm->m.soldout_hint_hits, 1, memory_order_relaxed);
        req_reply(r, code, NULL, NULL, 0);
        return;
    }
    if (!breaker_seize_allowed(nc->conf, nc->shm, keys_shard(id))) {
        seize_unreached(nc, r, id, who.user_id, 1);
        return;
    }

    seize_call_init(&sc, id, who.user_id);
    atomic_fetch_add_explicit(&nc->shm->m.seize_shard[sc.shard], 1, memory_order_relaxed);
    /* One deadline for every Redis step of this request, the seize's
     * budget (seize_deadline()): the script and its resend, redirections,
     * reloads, map refreshes, the settling and the WAIT all end by it. */
    rconn_set_deadline(nc->rc, sc.deadline_ms);
    seize_batched(nc, r, &a, who.user_id, sc.deadline_ms, &seize_ops, &sc);
    rconn_set_deadline(nc->rc, 0);
}
