/* api_admin.c - preheat, revoke, reconcile and health routes. */
#include "node/listcopy.h"
#include "api.h"
#include "node/breaker.h"
#include "conf.h"
#include "cs.h"
#include "node/durability.h"
#include "keys.h"
#include "log.h"
#include "mconn.h"
#include "node/meta.h"
#include "preheat.h"
#include "rcluster.h"
#include "reconcile.h"
#include "req/req.h"
#include "revoke.h"
#include "reserve.h"
#include "shm.h"
#include "node/ctx.h"

#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>

void api_admin_preheat(struct node_ctx *nc, struct req *r)
{
    struct auth_identity who;
    struct preheat_result res;
    char err[256], extra[192];

    /* Checked here, not only by nginx's snippet: behind lighttpd or Apache a
     * cross-site form (text/plain, urlencoded, multipart) reaches the app. */
    if (req_auth(r, 2, &who) != CS_OK || req_read_optional_json(r) != CS_OK)
        return;
    /* Its own connection, with coupon-sync's longer timeout: writing
     * thousands of activities takes longer than one seize may wait. */
    struct rconn *rc = rconn_new_conf(nc->conf, nc->conf->sync_redis_timeout_ms);
    int ok = activity_preheat(nc->mc, rc, nc->conf->preheat_horizon_days,
                              nc->conf->sync_cleanup_grace_s, &res, err, sizeof(err));
    rconn_free(rc);
    /* Tens of megabytes for a big preheat were just freed: give them back,
     * so the worker that served it does not keep that footprint. */
    malloc_trim(0);
    if (ok != CS_OK) {
        log_error("preheat failed: %s", err);
        req_reply(r, CODE_UNAVAILABLE, "preheat failed: MySQL or Redis unavailable", NULL, 5);
        return;
    }
    meta_invalidate_node(nc->shm);
    listcopy_invalidate(nc->conf, nc->shm);
    log_notice("preheat by admin %" PRId64 ": %d loaded, %d created, %d restored "
               "(MySQL %" PRId64 " ms, Redis %" PRId64 " ms)",
               who.user_id, res.loaded, res.created, res.restored, res.select_ms, res.write_ms);
    snprintf(extra, sizeof(extra),
             "\"loaded\":%d,\"created\":%d,\"restored\":%d,\"mysqlMs\":%" PRId64
             ",\"redisMs\":%" PRId64, res.loaded, res.created, res.restored, res.select_ms,
             res.write_ms);
    req_reply(r, CODE_OK, NULL, extra, 0);
}

void api_admin_revoke(struct node_ctx *nc, struct req *r)
{
    struct auth_identity who;
    char err[256], extra[64];
    int64_t id;
    int found = 0;

    if (req_admin_id(r, &who, &id) != CS_OK)
        return;
    struct rconn *rc = rconn_new_conf(nc->conf, nc->conf->sync_redis_timeout_ms);
    int ok = revoke_activity(nc->mc, rc, id, nc->conf->preheat_horizon_days, &found, err,
                             sizeof(err));
    rconn_free(rc);
    if (ok != CS_OK) {
        log_error("revoke of activity %" PRId64 " failed: %s", id, err);
        req_reply(r, CODE_UNAVAILABLE, "revoke failed: MySQL or Redis unavailable", NULL, 5);
        return;
    }
    if (!found) {
        req_reply(r, CODE_NO_SUCH_ACTIVITY, NULL, NULL, 0);
        return;
    }
    /* Every worker of this node answers VOIDED from now on. */
    shm_flag_set(nc->shm->voided, id, INT64_MAX);
    meta_invalidate_node(nc->shm);
    listcopy_invalidate(nc->conf, nc->shm);
    log_notice("activity %" PRId64 " revoked by admin %" PRId64, id, who.user_id);
    snprintf(extra, sizeof(extra), "\"activityId\":%" PRId64, id);
    req_reply(r, CODE_OK, "activity revoked", extra, 0);
}

void api_admin_reconcile(struct node_ctx *nc, struct req *r)
{
    struct auth_identity who;
    struct reconcile_result res;
    char err[256], extra[192];
    int64_t id;

    if (req_admin_id(r, &who, &id) != CS_OK)
        return;
    /* An update's Redis step runs within one command timeout of its commit. */
    int guard_s = nc->conf->redis_command_timeout_ms / 1000 + 2;
    if (reconcile_activity(nc->mc, nc->rc, id, guard_s, &res, err, sizeof(err)) != CS_OK) {
        log_error("reconcile of activity %" PRId64 " failed: %s", id, err);
        req_reply(r, CODE_UNAVAILABLE, "reconcile failed: MySQL or Redis unavailable", NULL, 5);
        return;
    }
    switch (res.outcome) {
    case RECONCILE_NO_SUCH:
        req_reply(r, CODE_NO_SUCH_ACTIVITY, NULL, NULL, 0);
        return;
    case RECONCILE_ENDED:
        req_reply(r, CODE_ENDED, NULL, NULL, 0);
        return;
    case RECONCILE_VOIDED:
        req_reply(r, CODE_VOIDED, NULL, NULL, 0);
        return;
    case RECONCILE_BUSY:
        req_reply(r, CODE_UNAVAILABLE, "the activity changed just now; retry in a few seconds",
                  NULL, guard_s);
        return;
    case RECONCILE_NOT_PREHEATED:
        snprintf(extra, sizeof(extra), "\"activityId\":%" PRId64 ",\"redisStock\":\"not preheated\"",
                 id);
        req_reply(r, CODE_OK, "not preheated: preheat sets the stock from MySQL", extra, 0);
        return;
    case RECONCILE_DONE:
        break;
    }
    if (res.after > 0)
        shm_flag_clear(nc->shm->soldout, id);
    meta_invalidate_node(nc->shm);
    if (res.after != res.before)
        log_notice("activity %" PRId64 " reconciled by admin %" PRId64 ": Redis stock %" PRId64
                   " -> %" PRId64 " (MySQL total %" PRId64 ", %" PRId64 " seized)",
                   id, who.user_id, res.before, res.after, res.total, res.sold);
    snprintf(extra, sizeof(extra),
             "\"activityId\":%" PRId64 ",\"totalNum\":%" PRId64 ",\"seized\":%" PRId64
             ",\"redisBefore\":%" PRId64 ",\"redisAfter\":%" PRId64,
             id, res.total, res.sold, res.before, res.after);
    req_reply(r, CODE_OK, res.after != res.before ? "Redis stock reconciled" : "already in line",
              extra, 0);
}

/* A write that fails the way a seize would (OOM, READONLY, MISCONF, BUSY,
 * LOADING, no connection) and changes nothing that matters. */
static enum rconn_fault admin_health_probe(struct node_ctx *nc)
{
    redisReply *rep = rconn_command(nc->rc, KEY_HEALTH, "SET %s %d PX 10000", KEY_HEALTH,
                                    nc->index);
    enum rconn_fault fault = rconn_reply_fault(rep);
    if (rep != NULL)
        freeReplyObject(rep);
    return fault;
}

struct health_masters {
    char buf[1024];
    size_t len;
    int up, n;
};

static void health_master(void *arg, const char *addr, int up, int copies)
{
    (void)copies; /* reported per shard, see admin_health_cluster() */
    struct health_masters *h = arg;
    if (h->len < sizeof(h->buf))
        h->len += (size_t)snprintf(h->buf + h->len, sizeof(h->buf) - h->len, "%s\"%s\":\"%s\"",
                                   h->n ? "," : "", addr, up ? "up" : "down");
    if (h->len >= sizeof(h->buf))
        h->len = sizeof(h->buf) - 1;
    h->n++;
    h->up += up;
}

/* On a cluster health names each master: "up" when all answer, "degraded"
 * (still 200: the shards on the others sell) when some do, 503 "down" when
 * none does. "durability" is "degraded" while a shard's grants are held by
 * fewer copies than redis.wait_replicas asks (its master has lost its
 * replicas), with those shards listed; "ok" otherwise. */
static void admin_health_cluster(struct node_ctx *nc, struct req *r)
{
    struct health_masters h = {.len = 0};
    char extra[1400], shards[64] = "";
    int copies[KEYS_SHARDS];
    size_t sl = 0;

    rcluster_each_master(nc->rc, nc->conf->redis_wait_replicas, health_master, &h);
    int degraded = durability_read(nc->conf, nc->rc, nc->shm, copies);
    for (int i = 0; i < KEYS_SHARDS && degraded > 0; i++)
        if (copies[i] >= 0 && copies[i] < nc->conf->redis_wait_replicas)
            sl += (size_t)snprintf(shards + sl, sizeof(shards) - sl, "%s%d", sl ? "," : "", i);
    const char *state = h.n > 0 && h.up == h.n ? "up" : h.up > 0 ? "degraded" : "down";
    snprintf(extra, sizeof(extra),
             "\"redis\":\"%s\",\"masters\":{%s},\"durability\":\"%s\","
             "\"degraded_shards\":[%s],\"worker\":%d",
             state, h.buf, degraded > 0 ? "degraded" : "ok", shards, nc->index);
    if (h.up > 0)
        req_reply(r, CODE_OK, NULL, extra, 0);
    else
        req_reply(r, CODE_UNAVAILABLE, "no redis master is reachable", extra,
                  breaker_retry_after(nc->conf));
}

void api_admin_health(struct node_ctx *nc, struct req *r)
{
    static const char *const bnames[] = {"closed", "open", "half-open"};
    char extra[160];
    enum rconn_fault fault;

    if (nc->conf->redis_cluster) {
        admin_health_cluster(nc, r);
        return;
    }

    /*
     * Health answers "can a seize be granted now". While the breaker is
     * closed a write probe says so, and does not feed the breaker (only
     * seizes do). While it is open, the answer is why the last seizes failed;
     * once the open interval is over, health may be the breaker's probe, so a
     * node that a load balancer took out of rotation on this answer (and
     * that therefore sees no seizes) still comes back by itself.
     */
    if (atomic_load(&nc->shm->breaker.state) == BREAKER_CLOSED) {
        fault = admin_health_probe(nc);
    } else if (breaker_seize_allowed(nc->conf, nc->shm, 0)) {
        fault = admin_health_probe(nc);
        breaker_seize_done(nc->conf, nc->shm, 0, fault, nc->rc);
    } else {
        fault = (enum rconn_fault)atomic_load(&nc->shm->breaker.fault);
        if (fault == RCONN_FAULT_NONE)
            fault = RCONN_FAULT_DOWN;
    }
    int bstate = atomic_load(&nc->shm->breaker.state);
    /* "seize": where a seize can be granted from now: "redis", "reserve"
     * (Redis is away, and this node holds an open reserve within its lease)
     * or "none". */
    snprintf(extra, sizeof(extra),
             "\"seize\":\"%s\",\"redis\":\"%s\",\"breaker\":\"%s\",\"worker\":%d",
             reserve_seize_source(nc->shm, fault == RCONN_FAULT_NONE, nc->conf->fallback_lease_ms),
             rconn_fault_name(fault),
             bnames[bstate < 3 && bstate >= 0 ? bstate : 1], nc->index);
    if (fault == RCONN_FAULT_NONE)
        req_reply(r, CODE_OK, NULL, extra, 0);
    else
        req_reply(r, CODE_UNAVAILABLE, "redis cannot grant a seize now", extra,
                  breaker_retry_after(nc->conf));
}
