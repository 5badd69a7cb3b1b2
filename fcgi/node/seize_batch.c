/* seize_batch.c - the seize handler's side of group commit: the one call a
 * leader makes for the seizes it took (lua/seize_batch.lua), and each
 * seize's answer from what its leader wrote (doc/internals.md "Group commit of seizes", G1-G5). */
#include "seize_batch.h"
#include "seize_rules.h"
#include "batch.h"
#include "breaker.h"
#include "conf.h"
#include "cs.h"
#include "durability.h"
#include "req/http.h"
#include "keys.h"
#include "log.h"
#include "meta.h"
#include "rcluster.h"
#include "req/req.h"
#include "scripts.h"
#include "shm.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

/* The keys and arguments of one batch call: per process (a worker leads at
 * most one call at a time), too big for the stack. */
struct sb_call {
    char k_stock[KEYS_MAX], k_queue[KEYS_MAX], k_window[KEYS_MAX], k_fence[KEYS_MAX];
    char k_list[BATCH_MAX][KEYS_MAX];
    char num[BATCH_MAX][3][24];
    const char *argv[3 + BATCH_MAX * 4];
    size_t argl[3 + BATCH_MAX * 4];
    int nkeys, argc;
    struct rconn_site site;
};

_Static_assert(3 + BATCH_MAX * 4 <= RCONN_EVAL_ARGS, "a full batch fits one EVALSHA");

static struct sb_call call;
static struct batch_take take;
static struct rscript script; /* loaded once per process; rconn reloads it on NOSCRIPT */

/* Keys: the shard's stock, queue and window, then each activity's seize
 * list once; arguments: (activityId, userId, index of its list) per seize. */
static void sb_build(struct sb_call *c, const struct batch_take *t)
{
    int64_t aid[BATCH_MAX];
    int which[BATCH_MAX], nlists = 0;

    c->argl[0] = keys_stock(c->k_stock, t->shard);
    c->argl[1] = keys_queue(c->k_queue, t->shard);
    c->argl[2] = keys_window(c->k_window, t->shard);
    c->argv[0] = c->k_stock;
    c->argv[1] = c->k_queue;
    c->argv[2] = c->k_window;
    for (int i = 0; i < t->n; i++) {
        int j = 0;
        while (j < nlists && aid[j] != t->item[i].activity_id)
            j++;
        if (j == nlists) {
            aid[nlists] = t->item[i].activity_id;
            c->argl[3 + nlists] = keys_seize_list(c->k_list[nlists], aid[nlists]);
            c->argv[3 + nlists] = c->k_list[nlists];
            nlists++;
        }
        which[i] = j;
    }
    c->nkeys = 3 + nlists;
    c->argc = c->nkeys;
    for (int i = 0; i < t->n; i++) {
        char (*s)[24] = c->num[i];
        size_t l0 = (size_t)snprintf(s[0], 24, "%" PRId64, t->item[i].activity_id);
        size_t l1 = (size_t)snprintf(s[1], 24, "%" PRId64, t->item[i].user_id);
        size_t l2 = (size_t)snprintf(s[2], 24, "%d", 4 + which[i]);
        c->argv[c->argc] = s[0], c->argl[c->argc++] = l0;
        c->argv[c->argc] = s[1], c->argl[c->argc++] = l1;
        c->argv[c->argc] = s[2], c->argl[c->argc++] = l2;
    }
}

static void sb_all(struct batch_take *t, enum batch_outcome outcome)
{
    for (int i = 0; i < t->n; i++)
        t->item[i].outcome = outcome;
}

/* One send of the call that waits at most wait_ms for its answer. */
static redisReply *sb_send(struct node_ctx *nc, struct sb_call *c, int wait_ms)
{
    rconn_set_timeout_range(nc->rc, wait_ms - wait_ms / 10, wait_ms);
    redisReply *rep = rconn_evalsha_at(nc->rc, &script, c->nkeys, c->argc, c->argv, c->argl,
                                      &c->site);
    rconn_set_timeout(nc->rc, 0);
    return rep;
}

/*
 * Sends the batch as seize_eval() sends one seize: within the leader's
 * deadline, with room kept for one resend on a fresh connection when the
 * answer is lost. Returns the reply (an array, the caller frees it) or NULL
 * after marking every entry NOT_SENT (Redis certainly did not run it) or
 * UNKNOWN (it may have), the breaker told. *resent: sent twice.
 */
static redisReply *sb_eval(struct node_ctx *nc, struct batch_take *t, int64_t deadline_ms,
                           int *resent)
{
    int64_t left = deadline_ms - cs_mono_ms();
    if (left < BATCH_LEAD_MIN_MS) {
        /* Handed the lead (or a call) with its budget gone: as a seize
         * whose deadline came while it waited, nothing is sent. */
        rconn_set_err(nc->rc, RCONN_ERR_DEADLINE, "seize batch", "no time left in the budget");
        atomic_fetch_add_explicit(&nc->shm->batch.m.unsent, (uint64_t)t->n, memory_order_relaxed);
        seize_budget_gone(nc, t->shard, (uint64_t)t->n);
        sb_all(t, BATCH_OUT_NOT_SENT);
        return NULL;
    }
    int64_t keep = nc->conf->redis_command_timeout_ms;
    if (keep > left / 4)
        keep = left / 4;
    redisReply *rep = sb_send(nc, &call, (int)(left - keep));
    if (rep != NULL)
        breaker_seize_answered(nc->conf, nc->shm, t->shard);
    if (rep == NULL && nc->rc->maybe_sent) {
        /* The script is idempotent per user: the same call once more tells
         * each user the truth. */
        breaker_count_failure(nc->shm, nc->rc);
        left = deadline_ms - cs_mono_ms();
        if (left < 5) {
            seize_unanswered(nc, t->shard, &call.site);
            sb_all(t, BATCH_OUT_UNKNOWN);
            return NULL;
        }
        atomic_fetch_add_explicit(&nc->shm->m.seize_resends, 1, memory_order_relaxed);
        log_debug("seize batch of %d on shard %d: %s; sending it once more", t->n, t->shard,
                  nc->rc->errstr);
        *resent = 1;
        rep = sb_send(nc, &call, (int)left);
        if (rep != NULL)
            breaker_seize_answered(nc->conf, nc->shm, t->shard);
        if (rep == NULL || rep->type != REDIS_REPLY_ARRAY) {
            if (rep != NULL)
                seize_breaker_done(nc, t->shard, rconn_reply_fault(rep));
            else
                seize_unanswered(nc, t->shard, &call.site);
            if (rep != NULL)
                freeReplyObject(rep);
            sb_all(t, BATCH_OUT_UNKNOWN);
            return NULL;
        }
    }
    if (rep == NULL) {
        seize_breaker_done(nc, t->shard, RCONN_FAULT_DOWN);
        sb_all(t, BATCH_OUT_NOT_SENT);
        return NULL;
    }
    if (rep->type != REDIS_REPLY_ARRAY) {
        /* An error reply before the script ran (OOM, READONLY, BUSY...): it
         * writes nothing before its last read, so it changed nothing. */
        enum rconn_fault fault = rconn_reply_fault(rep);
        log_error("EVALSHA seize_batch.lua on shard %d: %s", t->shard,
                  rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
        freeReplyObject(rep);
        seize_breaker_done(nc, t->shard, fault == RCONN_FAULT_NONE ? RCONN_FAULT_ERROR : fault);
        sb_all(t, BATCH_OUT_NOT_SENT);
        return NULL;
    }
    return rep;
}

int seize_durable(struct node_ctx *nc, int shard, struct rconn_site *site, char *k_fence,
                  int fence)
{
    const struct cs_conf *c = nc->conf;
    if (c->redis_wait_replicas <= 0)
        return CS_OK;
    int copies = rconn_copies(nc->rc, site, c->redis_wait_replicas);
    if (c->redis_cluster)
        durability_note(nc->shm, shard, copies);
    /* The fence key is needed only on this rare path: built here, not per seize. */
    if (fence)
        keys_fence(k_fence, shard);
    return rconn_wait_at(nc->rc, site, fence ? k_fence : NULL, copies, c->redis_wait_timeout_ms);
}

/* The leader's call: answers every entry of t (outcome, code, res). */
static void sb_lead(struct node_ctx *nc, struct batch_take *t, int64_t deadline_ms)
{
    int resent = 0, grants = 0, already = 0;
    int64_t sent_at = cs_mono_ms();

    if (script.src == NULL)
        rscript_from_text(&script, script_seize_batch);
    sb_build(&call, t);
    redisReply *rep = sb_eval(nc, t, deadline_ms, &resent);
    if (rep == NULL)
        return;
    int ok = rep->elements == (size_t)(1 + 2 * t->n);
    for (size_t i = 0; ok && i < rep->elements; i++)
        ok = rep->element[i]->type == REDIS_REPLY_INTEGER;
    if (!ok) {
        log_error("EVALSHA seize_batch.lua on shard %d: %zu elements for %d seizes", t->shard,
                  rep->elements, t->n);
        freeReplyObject(rep);
        seize_breaker_done(nc, t->shard, RCONN_FAULT_ERROR);
        sb_all(t, BATCH_OUT_UNKNOWN); /* it ran: what it did is not known */
        return;
    }
    long long now_ms = rep->element[0]->integer, age_ms = cs_mono_ms() - sent_at;
    for (int i = 0; i < t->n; i++) {
        struct batch_item *it = &t->item[i];
        long long res = rep->element[1 + 2 * i]->integer;
        long long seized_ms = rep->element[2 + 2 * i]->integer;
        it->outcome = BATCH_OUT_ANSWERED;
        it->res = res;
        it->code = seize_rules_outcome(res);
        /* After a resend, -1 may be this very call's grant whose answer
         * was lost: a grant no older than the first send is (50 ms of
         * slack for the clock reads), as seize_settle_resent() judges. */
        if (resent && res == SCRIPT_SEIZE_ALREADY)
            it->code = now_ms - seized_ms > age_ms + 50 ? CODE_ALREADY_SEIZED : CODE_SEIZED;
        if (it->code == CODE_SEIZED)
            grants++;
        else if (it->code == CODE_ALREADY_SEIZED)
            already++;
    }
    freeReplyObject(rep);
    if (grants == 0 && already == 0) {
        seize_breaker_done(nc, t->shard, RCONN_FAULT_NONE);
        return;
    }
    atomic_fetch_add_explicit(&nc->shm->m.seized_shard[t->shard], (uint64_t)grants,
                              memory_order_relaxed);
    /* The script has run: the next call need not wait for this one's WAIT. */
    if (nc->conf->redis_wait_replicas > 0)
        batch_handoff(&nc->shm->batch, t);
    /* "Already seized" is held to the rule too, without a fence write
     * (seize_grant()). */
    if (seize_durable(nc, t->shard, &call.site, call.k_fence, resent) != CS_OK) {
        log_warn("seize batch of %d on shard %d: %d granted, %d already seized, not confirmed: "
                 "%s", t->n, t->shard, grants, already, nc->rc->errstr);
        seize_unconfirmed(nc, t->shard);
        for (int i = 0; i < t->n; i++)
            if (t->item[i].code == CODE_SEIZED || t->item[i].code == CODE_ALREADY_SEIZED)
                t->item[i].outcome = BATCH_OUT_UNKNOWN;
        return;
    }
    seize_breaker_done(nc, t->shard, RCONN_FAULT_NONE);
}

void seize_answer(struct node_ctx *nc, struct req *r, struct activity *a, enum cs_code code,
                  long long res)
{
    const struct cs_conf *c = nc->conf;
    char extra[96];
    int stale;

    if (res == SCRIPT_SEIZE_FOR_NOW) {
        /* No stock in Redis, but reserves are open: they may come back, so
         * this is not final, and no sold-out hint is kept. */
        req_reply(r, CODE_SOLD_OUT, "sold out for now; coupons held in node reserves may return",
                  "\"final\":false", 1);
        return;
    }
    /* With reserves on, the last coupon of the stock is not the last of
     * the sale (nodes may give theirs back): only the script's -2 is. */
    if ((code == CODE_SOLD_OUT || (code == CODE_SEIZED && res == 0 && c->fallback_reserve == 0))
        && c->limits_soldout_recheck_ms > 0)
        shm_flag_set(nc->shm->soldout, a->id, cs_mono_ms() + c->limits_soldout_recheck_ms);
    if (code == CODE_SEIZED) {
        if (res >= 0)
            snprintf(extra, sizeof(extra), "\"activityId\":%" PRId64 ",\"remaining\":%lld", a->id,
                     res);
        else /* granted before a lost reply; the stock now could not be read */
            snprintf(extra, sizeof(extra), "\"activityId\":%" PRId64 ",\"remaining\":null", a->id);
        req_reply(r, CODE_SEIZED, NULL, extra, 0);
        return;
    }
    if (code == CODE_NO_SUCH_ACTIVITY) {
        /* The stock field is gone: Redis lost its data, or the activity was
         * revoked elsewhere before the tombstone landed. */
        meta_forget(nc->meta, a->id);
        if (meta_lookup(nc->meta, nc->rc, a->id, a, &stale) == META_VOIDED)
            code = CODE_VOIDED;
    }
    req_reply(r, code, NULL, NULL, 0);
}

/* Answers r from what the leader wrote, as seize_grant() answers its own
 * script's reply (the breaker and the WAIT were the leader's). */
static void sb_answer(struct node_ctx *nc, struct req *r, struct activity *a, int64_t uid,
                      const struct batch_item *it, const struct seize_batch_ops *ops, void *arg)
{
    if (it->outcome == BATCH_OUT_NOT_SENT) {
        ops->unreached(nc, r, a, uid, arg);
        return;
    }
    if (it->outcome != BATCH_OUT_ANSWERED) {
        req_reply(r, CODE_UNKNOWN_OUTCOME, NULL, NULL, breaker_retry_after(nc->conf));
        return;
    }
    if (it->res == SCRIPT_SEIZE_UNKNOWN) {
        /* Stock or window missing: nothing changed, so the seize goes
         * alone, whose path writes a missing window and asks again. */
        ops->alone(nc, r, a, uid, arg);
        return;
    }
    seize_answer(nc, r, a, (enum cs_code)it->code, it->res);
}

/* A seize that waited for the call ahead of it (or for its own call) its
 * whole budget was left unanswered by Redis as surely as one that waited on
 * its own EVALSHA: the breaker hears of it as of that one, by the silence
 * rule (a budget with no seize answered asks the shard's master, two open
 * it), or a stalled Redis would take one failure per call, not per seize,
 * to open it. A seize that gave up early (its leader died) says nothing of
 * Redis. */
static void sb_unanswered(struct node_ctx *nc, int shard, int64_t deadline_ms)
{
    if (cs_mono_ms() < deadline_ms)
        return;
    rconn_set_err(nc->rc, RCONN_ERR_TIMEOUT, "seize batch",
                  "no answer within the budget behind the call in flight");
    /* The leader wrote the call; where it went is resolved from the slot
     * map by the worker loop, after the user is answered (a refresh of the
     * map may take a connect's time). */
    struct rconn_site site = {.conn_id = 0, .node = -1};
    seize_unanswered(nc, shard, &site);
    if (nc->ask_pending && nc->rc->cl != NULL)
        nc->ask_slot = (int)keys_shard_slot(shard);
}

void seize_batched(struct node_ctx *nc, struct req *r, struct activity *a, int64_t uid,
                   int64_t deadline_ms, const struct seize_batch_ops *ops, void *arg)
{
    struct batch_area *b = &nc->shm->batch;
    struct batch_item mine = {.activity_id = a->id, .user_id = uid};
    int max = nc->conf->limits_batch_max;

    if (max <= 1 || nc->slot < 0 || nc->slot >= BATCH_ENTRIES || !atomic_load(&b->ready)) {
        ops->alone(nc, r, a, uid, arg);
        return;
    }
    switch (batch_join(b, keys_shard(a->id), nc->slot, max, &mine, deadline_ms, &take)) {
    case BATCH_LEADER:
        if (take.n == 1) {
            /* Nobody waits: today's call, while the seizes that come
             * meanwhile queue behind it for the next one. */
            ops->alone(nc, r, a, uid, arg);
            batch_finish(b, &take);
            return;
        }
        sb_lead(nc, &take, deadline_ms);
        batch_finish(b, &take);
        sb_answer(nc, r, a, uid, &take.item[take.self], ops, arg);
        return;
    case BATCH_ANSWERED:
        sb_answer(nc, r, a, uid, &mine, ops, arg);
        return;
    case BATCH_UNSENT:
        sb_unanswered(nc, keys_shard(a->id), deadline_ms);
        /* Given up at its deadline (not early, behind a leader that died). */
        if (cs_mono_ms() >= deadline_ms - BATCH_LEAD_MIN_MS)
            seize_budget_gone(nc, keys_shard(a->id), 1);
        ops->unreached(nc, r, a, uid, arg);
        return;
    case BATCH_UNKNOWN:
        sb_unanswered(nc, keys_shard(a->id), deadline_ms);
        req_reply(r, CODE_UNKNOWN_OUTCOME, NULL, NULL, breaker_retry_after(nc->conf));
        return;
    case BATCH_BUSY:
        /* A shard's lock held past BATCH_LOCK_WAIT_MS (its holder stopped
         * or starved): queued nowhere, so it goes alone, at once. */
        ops->alone(nc, r, a, uid, arg);
        return;
    }
}
