/* api_metrics.c - GET /market/admin/metrics: the node's metrics (metrics.c)
 * with what only a worker can read: the sync queues' depths, the live stock
 * of the activities on sale, the durability rule. */
#include "node/listcopy.h"
#include "api.h"
#include "node/breaker.h"
#include "conf.h"
#include "cs.h"
#include "node/durability.h"
#include "req/http.h"
#include "keys.h"
#include "log.h"
#include "node/metrics.h"
#include "req/req.h"
#include "shm.h"
#include "node/ctx.h"

#include <stdatomic.h>
#include <stdlib.h>

/* Activities on sale now whose stock the metrics show, at most: a label
 * value each, so a marketplace with thousands of sales at once does not
 * flood Prometheus. */
#define METRICS_MAX_ACTIVITIES 100
#define METRICS_LIST_PAGE 500

/* Refreshes the node's queue depths when they are a second old or more and no
 * other worker is reading them. Ten HLENs, one per shard (each routed by its
 * own key). Skipped while the breaker is open: the depths then keep their
 * last value and read timestamp. */
static void api_metrics_read_queues(struct node_ctx *nc)
{
    struct shm_qdepth *q = &nc->shm->qdepth;
    int64_t now = cs_now_ms(), mono = cs_mono_ms();
    int64_t lease = atomic_load(&q->lease_ms);

    if (now - atomic_load(&q->read_ms) < 1000 || lease > mono
        || atomic_load(&nc->shm->breaker.state) == BREAKER_OPEN
        || !atomic_compare_exchange_strong(&q->lease_ms, &lease,
                                           mono + nc->conf->redis_command_timeout_ms * 11 + 100))
        return;
    int64_t depth[SHM_QUEUE_SHARDS];
    int ok = 1;
    for (int i = 0; i < SHM_QUEUE_SHARDS && ok; i++) {
        char key[KEYS_MAX];
        keys_queue(key, i);
        redisReply *rep = rconn_command(nc->rc, key, "HLEN %s", key);
        ok = rep != NULL && rep->type == REDIS_REPLY_INTEGER;
        if (ok)
            depth[i] = rep->integer;
        if (rep != NULL)
            freeReplyObject(rep);
    }
    if (ok) {
        for (int i = 0; i < SHM_QUEUE_SHARDS; i++)
            atomic_store(&q->depth[i], depth[i]);
        atomic_store(&q->read_ms, now);
    } else {
        log_debug("queue depths for metrics not read: %s", nc->rc->errstr);
    }
    atomic_store(&q->lease_ms, 0);
}

/* Live stock of the activities on sale now (first METRICS_MAX_ACTIVITIES in
 * list order), from the node's copy of the activity list and one pipelined
 * read of their stock fields. Nothing while the breaker is open: a scrape
 * must not add load to a Redis that is failing. */
static void api_metrics_activities(struct node_ctx *nc, struct metrics_out *o)
{
    struct activity_stock st[METRICS_MAX_ACTIVITIES];
    int64_t total[METRICS_MAX_ACTIVITIES];
    size_t n = 0;
    int64_t now = cs_now_ms();

    if (atomic_load(&nc->shm->breaker.state) == BREAKER_OPEN)
        return;
    for (size_t page = 1; n < METRICS_MAX_ACTIVITIES; page++) {
        struct listcopy_page pg;
        if (listcopy_page(nc->conf, nc->shm, page, METRICS_LIST_PAGE, &pg) != CS_OK)
            break;
        int last = pg.n < METRICS_LIST_PAGE || page * METRICS_LIST_PAGE >= pg.total;
        for (size_t i = 0; i < pg.n && n < METRICS_MAX_ACTIVITIES; i++) {
            /* The list is in start-time order: the rest start later still. */
            if (pg.acts[i].start_ms > now) {
                last = 1;
                break;
            }
            if (activity_status_at(&pg.acts[i], now) != ACT_IN_PROGRESS)
                continue;
            st[n] = (struct activity_stock){.id = pg.acts[i].id};
            total[n++] = pg.acts[i].total_num;
        }
        listcopy_page_free(&pg);
        if (last)
            break;
    }
    if (n == 0)
        return;
    activity_stock_read(nc->rc, st, n); /* what was not read is left out below */
    metrics_emit(o, "# HELP couponseize_activity_remaining Coupons left in Redis, per activity on "
            "sale now.\n# TYPE couponseize_activity_remaining gauge\n");
    for (size_t i = 0; i < n; i++)
        if (st[i].state == ACT_STOCK_SET && st[i].value >= 0)
            metrics_emit(o, "couponseize_activity_remaining{activity=\"%lld\"} %lld\n",
                 (long long)st[i].id, (long long)st[i].value);
    metrics_emit(o, "# HELP couponseize_activity_sold_out 1 when an activity on sale now has no "
            "coupon left.\n# TYPE couponseize_activity_sold_out gauge\n");
    for (size_t i = 0; i < n; i++)
        if (st[i].state == ACT_STOCK_SET && st[i].value >= 0)
            metrics_emit(o, "couponseize_activity_sold_out{activity=\"%lld\"} %d\n",
                 (long long)st[i].id, st[i].value == 0);
    metrics_emit(o, "# HELP couponseize_activity_coupons Coupons an activity on sale now offers in "
            "all (totalNum).\n# TYPE couponseize_activity_coupons gauge\n");
    for (size_t i = 0; i < n; i++)
        if (st[i].state == ACT_STOCK_SET && st[i].value >= 0)
            metrics_emit(o, "couponseize_activity_coupons{activity=\"%lld\"} %lld\n",
                 (long long)st[i].id, (long long)total[i]);
}

void api_metrics(struct node_ctx *nc, struct req *r)
{
    struct auth_identity who;

    /* No credential: the web server's ACL on /market/admin/ is the guard
     * (Prometheus scrapes from a trusted address). A credential must be admin. */
    if (req_auth(r, 0, &who) != CS_OK)
        return;
    if (who.user_id != 0 && !who.is_admin) {
        req_reply(r, CODE_FORBIDDEN, NULL, NULL, 0);
        return;
    }
    api_metrics_read_queues(nc);
    int copies[KEYS_SHARDS];
    durability_read(nc->conf, nc->rc, nc->shm, copies);
    size_t cap = 128 * 1024;
    char *buf = xmalloc(cap);
    struct metrics_out o = {buf, cap, metrics_render(nc->shm, nc->conf->fallback_lease_ms, buf, cap)};
    metrics_workers(nc->shm, &o);
    /* Not while the breaker is open: a scrape must not add load to a Redis
     * that is failing (the gauge is then absent, not 0). */
    int aof = atomic_load(&nc->shm->breaker.state) == BREAKER_OPEN ? -1
                                                                   : durability_single(nc->conf, nc->rc);
    if (aof >= 0)
        metrics_emit(&o, "# HELP couponseize_redis_aof_always 1 when the (single) Redis persists "
                     "each write before answering (appendonly yes, appendfsync always), 0 when "
                     "not.\n# TYPE couponseize_redis_aof_always gauge\n"
                     "couponseize_redis_aof_always %d\n", aof);
    api_metrics_activities(nc, &o);
    metrics_config(nc->conf, &o);
    size_t n = o.len;
    r->code = CODE_OK;
    http_reply_raw(r->out, 200, "text/plain; version=0.0.4; charset=utf-8", buf, n, NULL);
    free(buf);
}
