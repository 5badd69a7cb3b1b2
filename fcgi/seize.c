/* seize.c - POST /market/consumer/coupon/seize: one EVALSHA per seize. */
#include "conf.h"
#include "cs.h"
#include "keys.h"
#include "log.h"
#include "meta.h"
#include "route.h"
#include "shm.h"
#include "worker.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* The window check on cached metadata; CODE_OK when a seize may be tried. */
static enum cs_code seize_window(const struct activity *a, int64_t now_ms)
{
    switch (activity_status_at(a, now_ms)) {
    case ACT_NOT_STARTED: return CODE_NOT_STARTED;
    case ACT_ENDED: return CODE_ENDED;
    case ACT_VOIDED: return CODE_VOIDED;
    default: return CODE_OK;
    }
}

static void seize_unavailable(struct worker *w, struct req *r)
{
    req_reply(r, CODE_UNAVAILABLE, NULL, NULL, worker_retry_after(w));
}

void seize_handle(struct worker *w, struct req *r)
{
    const struct cs_conf *c = w->conf;
    struct auth_identity who;
    struct activity a;
    int64_t id, now = cs_now_ms();
    const char *why;
    int retry, stale;

    if (!shm_bucket_take(w->shm, cs_mono_us(), c->limits_node_rps, c->limits_burst, &retry)) {
        atomic_fetch_add_explicit(&w->shm->m.rate_limited, 1, memory_order_relaxed);
        req_reply(r, CODE_TOO_MANY_REQUESTS, NULL, NULL, retry);
        return;
    }
    if (req_auth(w, r, 1, &who) != CS_OK || req_read_body(w, r) != CS_OK)
        return;
    if (http_parse_id_body(r->body, r->body_len, &id, &why) != CS_OK) {
        req_reply(r, CODE_BAD_REQUEST, why, NULL, 0);
        return;
    }

    /* Node-wide hints first: they cost no Redis round trip. */
    if (shm_flag_test(w->shm->voided, id, cs_mono_ms())) {
        req_reply(r, CODE_VOIDED, NULL, NULL, 0);
        return;
    }
    switch (meta_lookup(w, id, &a, &stale)) {
    case META_ABSENT:
        req_reply(r, CODE_NO_SUCH_ACTIVITY, NULL, NULL, 0);
        return;
    case META_VOIDED:
        req_reply(r, CODE_VOIDED, NULL, NULL, 0);
        return;
    case META_UNAVAILABLE:
        seize_unavailable(w, r);
        return;
    case META_FOUND:
        break;
    }
    enum cs_code window = seize_window(&a, now);
    if (window != CODE_OK) {
        req_reply(r, window, NULL, NULL, 0);
        return;
    }
    if (shm_flag_test(w->shm->soldout, id, cs_mono_ms())) {
        atomic_fetch_add_explicit(&w->shm->m.soldout_hint_hits, 1, memory_order_relaxed);
        req_reply(r, CODE_SOLD_OUT, NULL, NULL, 0);
        return;
    }
    if (!worker_redis_allowed(w)) {
        seize_unavailable(w, r);
        return;
    }

    char k_stock[KEYS_MAX], k_list[KEYS_MAX], k_queue[KEYS_MAX], s_aid[24], s_uid[24], s_now[24];
    int shard = keys_shard(id);
    const char *argv[6] = {k_stock, k_list, k_queue, s_aid, s_uid, s_now};
    size_t argl[6];
    argl[0] = keys_stock(k_stock, shard);
    argl[1] = keys_seize_list(k_list, id);
    argl[2] = keys_queue(k_queue, shard);
    argl[3] = (size_t)snprintf(s_aid, sizeof(s_aid), "%" PRId64, id);
    argl[4] = (size_t)snprintf(s_uid, sizeof(s_uid), "%" PRId64, who.user_id);
    argl[5] = (size_t)snprintf(s_now, sizeof(s_now), "%" PRId64, now);

    redisReply *rep = rconn_evalsha(w->rc, &w->script, 3, 6, argv, argl);
    if (rep == NULL) {
        worker_redis_done(w, 0);
        log_debug("seize %" PRId64 " for %" PRId64 ": %s", id, who.user_id, w->rc->errstr);
        seize_unavailable(w, r);
        return;
    }
    /* LOADING, BUSY, READONLY, OOM ...: Redis is there but not serving,
     * which the breaker must see as a failure. */
    worker_redis_done(w, rep->type == REDIS_REPLY_INTEGER);
    if (rep->type != REDIS_REPLY_INTEGER) {
        log_error("EVALSHA seize.lua for activity %" PRId64 ": %s", id,
                  rep->type == REDIS_REPLY_ERROR ? rep->str : "non-integer reply");
        freeReplyObject(rep);
        /* Nothing is known to have been issued; the client may retry. */
        seize_unavailable(w, r);
        return;
    }
    long long res = rep->integer;
    freeReplyObject(rep);

    enum cs_code code = http_seize_outcome(res);
    int64_t recheck = cs_mono_ms() + c->limits_soldout_recheck_ms;
    if (code == CODE_SEIZED) {
        char extra[96];
        if (res == 0 && c->limits_soldout_recheck_ms > 0)
            shm_flag_set(w->shm->soldout, id, recheck);
        snprintf(extra, sizeof(extra), "\"activityId\":%" PRId64 ",\"remaining\":%lld", id, res);
        req_reply(r, CODE_SEIZED, NULL, extra, 0);
        return;
    }
    if (code == CODE_SOLD_OUT && c->limits_soldout_recheck_ms > 0)
        shm_flag_set(w->shm->soldout, id, recheck);
    if (code == CODE_NO_SUCH_ACTIVITY) {
        /* The stock field is gone: Redis lost its data, or the activity was
         * revoked elsewhere before the tombstone landed. */
        meta_forget(w->meta, id);
        if (meta_lookup(w, id, &a, &stale) == META_VOIDED)
            code = CODE_VOIDED;
    }
    req_reply(r, code, NULL, NULL, 0);
}
