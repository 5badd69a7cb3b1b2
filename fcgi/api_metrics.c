/* api_metrics.c - GET /market/admin/metrics: the node's metrics (metrics.c)
 * with what only a worker can read: the sync queues' depths, the live stock
 * of the activities on sale, the durability rule. */
#include "alist.h"
#include "api.h"
#include "breaker.h"
#include "conf.h"
#include "cs.h"
#include "durability.h"
#include "http.h"
#include "keys.h"
#include "log.h"
#include "metrics.h"
#include "req.h"
#include "shm.h"
#include "worker.h"

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
static void api_metrics_read_queues(struct worker *w)
{
    struct shm_qdepth *q = &w->shm->qdepth;
    int64_t now = cs_now_ms(), mono = cs_mono_ms();
    int64_t lease = atomic_load(&q->lease_ms);

    if (now - atomic_load(&q->read_ms) < 1000 || lease > mono
        || atomic_load(&w->shm->breaker.state) == BREAKER_OPEN
        || !atomic_compare_exchange_strong(&q->lease_ms, &lease,
                                           mono + w->conf->redis_command_timeout_ms * 11 + 100))
        return;
    int64_t depth[SHM_QUEUE_SHARDS];
    int ok = 1;
    for (int i = 0; i < SHM_QUEUE_SHARDS && ok; i++) {
        char key[KEYS_MAX];
        keys_queue(key, i);
        redisReply *rep = rconn_command(w->rc, key, "HLEN %s", key);
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
        log_debug("queue depths for metrics not read: %s", w->rc->errstr);
    }
    atomic_store(&q->lease_ms, 0);
}

/* Live stock of the activities on sale now (first METRICS_MAX_ACTIVITIES in
 * list order), from the node's copy of the activity list and one pipelined
 * read of their stock fields. Nothing while the breaker is open: a scrape
 * must not add load to a Redis that is failing. */
static void api_metrics_activities(struct worker *w, struct metrics_out *o)
{
    struct activity_stock st[METRICS_MAX_ACTIVITIES];
    int64_t total[METRICS_MAX_ACTIVITIES];
    size_t n = 0;
    int64_t now = cs_now_ms();

    if (atomic_load(&w->shm->breaker.state) == BREAKER_OPEN)
        return;
    for (size_t page = 1; n < METRICS_MAX_ACTIVITIES; page++) {
        struct alist_page pg;
        if (alist_page(w->conf, w->shm, page, METRICS_LIST_PAGE, &pg) != CS_OK)
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
        alist_page_free(&pg);
        if (last)
            break;
    }
    if (n == 0)
        return;
    activity_stock_read(w->rc, st, n); /* what was not read is left out below */
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

void api_metrics(struct worker *w, struct req *r)
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
    api_metrics_read_queues(w);
    int copies[KEYS_SHARDS];
    durability_read(w->conf, w->rc, w->shm, copies);
    size_t cap = 128 * 1024;
    char *buf = xmalloc(cap);
    struct metrics_out o = {buf, cap, metrics_render(w->shm, w->conf->fallback_lease_ms, buf, cap)};
    metrics_workers(w->shm, &o);
    api_metrics_activities(w, &o);
    metrics_config(w->conf, &o);
    size_t n = o.len;
    r->code = CODE_OK;
    http_reply_raw(r->out, 200, "text/plain; version=0.0.4; charset=utf-8", buf, n, NULL);
    free(buf);
}
