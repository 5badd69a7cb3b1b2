/* metrics.c - the node's metrics in Prometheus text, from its shared memory
 * (summed over workers); api_metrics.c serves them. */
#include "config.h"
#include "metrics.h"
#include "activity.h"
#include "conf.h"
#include "cs.h"
#include "keys.h"
#include "log.h"
#include "rconn.h"
#include "req/req.h"
#include "reserve.h"
#include "shm.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

void metrics_emit(struct metrics_out *o, const char *fmt, ...)
{
    va_list ap;
    if (o->len >= o->cap)
        return;
    va_start(ap, fmt);
    int n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        o->len += (size_t)n;
    if (o->len >= o->cap)
        o->len = o->cap - 1;
}

static void counter(struct metrics_out *o, const char *name, const char *help, uint64_t v)
{
    metrics_emit(o, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name,
         (unsigned long long)v);
}

#define LOAD(x) atomic_load_explicit((_Atomic uint64_t *)&(x), memory_order_relaxed)

/* A counter kept in a struct of shared memory: its name, where, its help. */
struct counter_def {
    const char *name;
    size_t off;
    const char *help;
};

static const struct counter_def node_counters[] = {
    {"couponseize_redis_errors_total", offsetof(struct shm_metrics, redis_errors),
     "Redis calls that failed."},
    {"couponseize_redis_timeouts_total", offsetof(struct shm_metrics, redis_timeouts),
     "Redis calls that timed out."},
    {"couponseize_breaker_opened_total", offsetof(struct shm_metrics, breaker_opened),
     "Times the Redis breaker opened."},
    {"couponseize_breaker_asked_alive_total", offsetof(struct shm_metrics, breaker_asked_alive),
     "Times no seize was answered for a budget but Redis answered a PING on a new "
     "connection, so the breaker stayed closed (a write pause, a stalled machine)."},
    {"couponseize_seize_resends_total", offsetof(struct shm_metrics, seize_resends),
     "Seize scripts sent once more on a fresh connection after a lost reply."},
    {"couponseize_seize_budget_gone_total", offsetof(struct shm_metrics, seize_budget_gone),
     "Seizes answered UNAVAILABLE without asking Redis: their budget "
     "(fallback.budget_ms) went before it, mostly waiting for a free worker."},
    {"couponseize_rate_limited_total", offsetof(struct shm_metrics, rate_limited),
     "Seizes refused by the node rate limit."},
    {"couponseize_soldout_hint_hits_total", offsetof(struct shm_metrics, soldout_hint_hits),
     "Seizes answered SOLD_OUT from the node flag without Redis."},
    {"couponseize_cache_hits_total", offsetof(struct shm_metrics, cache_hits),
     "Activity cache hits."},
    {"couponseize_cache_misses_total", offsetof(struct shm_metrics, cache_misses),
     "Activity cache misses."},
    {"couponseize_cache_evictions_total", offsetof(struct shm_metrics, cache_evictions),
     "Activity cache evictions."},
    {"couponseize_cache_load_failures_total", offsetof(struct shm_metrics, cache_load_failures),
     "Activity cache loads that failed."},
    {"couponseize_cache_stale_served_total", offsetof(struct shm_metrics, cache_stale_served),
     "Activity entries served stale while Redis was away."},
    {"couponseize_worker_restarts_total", offsetof(struct shm_metrics, worker_restarts),
     "Workers the supervisor replaced."},
};

static const struct counter_def batch_counters[] = {
    {"couponseize_batch_unsent_total", offsetof(struct batch_metrics, unsent),
     "Seizes whose deadline came while they waited for a call, or before theirs was "
     "sent: nothing was sent."},
    {"couponseize_batch_unknown_total", offsetof(struct batch_metrics, unknown),
     "Seizes taken into a call whose answer never reached them (leader dead or late)."},
    {"couponseize_batch_leader_deaths_total", offsetof(struct batch_metrics, leader_deaths),
     "Leaders of a call found dead by the seizes waiting on them."},
    {"couponseize_batch_leader_stalls_total", offsetof(struct batch_metrics, leader_stalls),
     "Leads taken from a leader found stopped or past its call's deadline."},
    {"couponseize_batch_lock_busy_total", offsetof(struct batch_metrics, lock_busy),
     "Seizes sent alone (or answers lost) because a queue's lock was held past its wait."},
};

static const struct counter_def reserve_counters[] = {
    {"couponseize_reserve_set_aside_total", offsetof(struct shm_reserves, set_aside),
     "Coupons set aside for this node."},
    {"couponseize_reserve_spent_total", offsetof(struct shm_reserves, spent),
     "Seizes answered SEIZED from this node's reserve."},
    {"couponseize_reserve_replayed_total", offsetof(struct shm_reserves, replayed),
     "Reserve grants replayed from the journal into Redis."},
    {"couponseize_reserve_returned_total", offsetof(struct shm_reserves, returned),
     "Reserved coupons given back to the stock."},
    {"couponseize_reserve_duplicates_total", offsetof(struct shm_reserves, duplicates),
     "Replayed grants of users who held a coupon already (theirs went back to stock)."},
    {"couponseize_reserve_dead_letters_total", offsetof(struct shm_reserves, dead_letters),
     "Replayed grants with no reserve and no stock to take from (see "
     "COUPON:RESERVE:DEAD)."},
    {"couponseize_reserve_anomalies_total", offsetof(struct shm_reserves, anomalies),
     "Replayed grants whose token was already replayed for another user: spent twice, in "
     "COUPON:RESERVE:DEAD (from stock when there was any)."},
    {"couponseize_reserve_journals_declared_lost_total",
     offsetof(struct shm_reserves, journals_lost),
     "Admin returns on this node that declared a lost node's journal lost (its "
     "unreplayed grants are lost with it)."},
    {"couponseize_journal_failures_total", offsetof(struct shm_reserves, journal_failures),
     "Journal writes that failed (the node then grants from reserves no more)."},
};

/* Emits the n counters of defs, read from the struct at base. */
static void counters(struct metrics_out *o, const void *base, const struct counter_def *defs,
                     size_t n)
{
    for (size_t i = 0; i < n; i++)
        counter(o, defs[i].name, defs[i].help,
                LOAD(*(const uint64_t *)((const char *)base + defs[i].off)));
}

/* Per-shard load and the Redis Cluster routing counters. */
static void metrics_shards(struct metrics_out *o, const struct shm_node *node)
{
    const struct shm_metrics *m = &node->m;
    const struct rcluster_shared *cl = &node->cluster;

    metrics_emit(o, "# HELP couponseize_seize_scripts_total Seize scripts sent to Redis, by shard.\n"
            "# TYPE couponseize_seize_scripts_total counter\n");
    for (int i = 0; i < KEYS_SHARDS; i++)
        metrics_emit(o, "couponseize_seize_scripts_total{shard=\"%d\"} %llu\n", i,
             (unsigned long long)LOAD(m->seize_shard[i]));
    metrics_emit(o, "# HELP couponseize_seized_total Coupons granted, by shard.\n"
            "# TYPE couponseize_seized_total counter\n");
    for (int i = 0; i < KEYS_SHARDS; i++)
        metrics_emit(o, "couponseize_seized_total{shard=\"%d\"} %llu\n", i,
             (unsigned long long)LOAD(m->seized_shard[i]));
    metrics_emit(o, "# HELP couponseize_shard_breaker_state Per-shard breaker on a cluster: 0 closed, "
            "1 open, 2 half-open.\n# TYPE couponseize_shard_breaker_state gauge\n");
    for (int i = 0; i < KEYS_SHARDS; i++)
        metrics_emit(o, "couponseize_shard_breaker_state{shard=\"%d\"} %d\n", i,
             atomic_load((_Atomic int *)&node->shard_breaker[i].state));
    metrics_emit(o, "# HELP couponseize_redis_redirects_total Redis Cluster redirections followed.\n"
            "# TYPE couponseize_redis_redirects_total counter\n"
            "couponseize_redis_redirects_total{kind=\"moved\"} %llu\n"
            "couponseize_redis_redirects_total{kind=\"ask\"} %llu\n",
         (unsigned long long)LOAD(cl->moved), (unsigned long long)LOAD(cl->ask));
    counter(o, "couponseize_redis_tryagain_total",
            "Commands retried after TRYAGAIN, CLUSTERDOWN or LOADING.", LOAD(cl->tryagain));
    counter(o, "couponseize_redis_slot_map_refreshes_total", "Cluster slot-map refreshes.",
            LOAD(cl->refreshes));
    counter(o, "couponseize_redis_slot_map_refresh_failures_total",
            "Cluster slot-map refreshes no node answered.", LOAD(cl->refresh_failures));
    counter(o, "couponseize_redis_wait_shortfalls_total",
            "Grants WAIT did not see on the replicas the durability rule asks (answered "
            "UNKNOWN_OUTCOME).",
            LOAD(cl->wait_shortfalls));

    int wanted = atomic_load(&cl->copies_wanted), degraded = 0;
    metrics_emit(o, "# HELP couponseize_redis_shard_copies Replicas a grant on the shard waits for "
            "now (the durability rule: its master's replicas the cluster could promote, at "
            "most redis.wait_replicas).\n# TYPE couponseize_redis_shard_copies gauge\n");
    for (int i = 0; i < KEYS_SHARDS; i++) {
        int v = atomic_load(&cl->shard_copies[i]) - 1;
        if (v < 0)
            continue;
        metrics_emit(o, "couponseize_redis_shard_copies{shard=\"%d\"} %d\n", i, v);
        degraded += v < wanted;
    }
    metrics_emit(o, "# HELP couponseize_durability_degraded_shards Shards whose grants are held by "
            "fewer copies than redis.wait_replicas asks.\n"
            "# TYPE couponseize_durability_degraded_shards gauge\n"
            "couponseize_durability_degraded_shards %d\n", degraded);
}

/* The node's reserves: what it holds, spends, replays and gives back. */
static void metrics_reserves(struct metrics_out *o, const struct shm_node *node, int lease_ms)
{
    const struct shm_reserves *rv = &node->rsv;
    int open = 0;
    for (int i = 0; i < SHM_RESERVES; i++)
        open += atomic_load((_Atomic int *)&rv->slot[i].state) != RSV_EMPTY;
    metrics_emit(o, "# HELP couponseize_reserve_keeper_up Whether this node's reserve keeper runs.\n"
            "# TYPE couponseize_reserve_keeper_up gauge\ncouponseize_reserve_keeper_up %d\n",
         atomic_load((_Atomic int *)&rv->keeper_pid) != 0);
    metrics_emit(o, "# HELP couponseize_reserve_held Coupons this node may still grant from its "
            "open reserves.\n# TYPE couponseize_reserve_held gauge\n"
            "couponseize_reserve_held %lld\n", (long long)reserve_held(rv));
    metrics_emit(o, "# HELP couponseize_reserve_lease_left_seconds How long this node could still "
            "grant from an open reserve were Redis gone now (its lease left; 0: it could not).\n"
            "# TYPE couponseize_reserve_lease_left_seconds gauge\n"
            "couponseize_reserve_lease_left_seconds %.3f\n",
         (double)reserve_lease_left(node, lease_ms) / 1000);
    metrics_emit(o, "# HELP couponseize_reserve_epochs Reserve epochs of this node not yet closed.\n"
            "# TYPE couponseize_reserve_epochs gauge\ncouponseize_reserve_epochs %d\n", open);
    counters(o, rv, reserve_counters, sizeof(reserve_counters) / sizeof(reserve_counters[0]));
    metrics_emit(o, "# HELP couponseize_reserve_claim_refused 1 while another live instance (a copied "
            "image, a restored journal) holds this node's incarnation: no grants from reserves.\n"
            "# TYPE couponseize_reserve_claim_refused gauge\ncouponseize_reserve_claim_refused %d\n",
         atomic_load((_Atomic int *)&rv->claim_refused));
    metrics_emit(o, "# HELP couponseize_journal_depth Journal records not yet replayed into Redis.\n"
            "# TYPE couponseize_journal_depth gauge\ncouponseize_journal_depth %lld\n",
         (long long)atomic_load((_Atomic int64_t *)&rv->journal_depth));
    int64_t oldest = atomic_load((_Atomic int64_t *)&rv->oldest_unreplayed_ms);
    int64_t lag = oldest > 0 ? cs_now_ms() - oldest : 0;
    metrics_emit(o, "# HELP couponseize_journal_replay_lag_seconds Age of the oldest journal record "
            "not yet replayed (0: none).\n# TYPE couponseize_journal_replay_lag_seconds gauge\n"
            "couponseize_journal_replay_lag_seconds %.3f\n", lag > 0 ? (double)lag / 1000 : 0.0);
    metrics_emit(o, "# HELP couponseize_journal_replay_duration_seconds How long the last replay "
            "pass that replayed something took.\n"
            "# TYPE couponseize_journal_replay_duration_seconds gauge\n"
            "couponseize_journal_replay_duration_seconds %.3f\n",
         (double)atomic_load((_Atomic int64_t *)&rv->last_replay_ms) / 1000);
    metrics_emit(o, "# HELP couponseize_reserve_halted 1 when a journal write failed and this node "
            "grants from reserves no more (until an operator removes <fallback.journal>/halted).\n"
            "# TYPE couponseize_reserve_halted gauge\ncouponseize_reserve_halted %d\n",
         atomic_load((_Atomic int *)&rv->halted));
}

size_t metrics_render(const struct shm_node *node, int lease_ms, char *buf, size_t cap)
{
    struct metrics_out o = {buf, cap, 0};
    const struct shm_metrics *m = &node->m;

    buf[0] = '\0';
    metrics_emit(&o, "# HELP couponseize_requests_total Requests answered, by route and code.\n"
             "# TYPE couponseize_requests_total counter\n");
    for (int r = 0; r < ROUTE__COUNT && r < SHM_ROUTES; r++)
        for (int c = 0; c < CODE__COUNT && c < SHM_CODES; c++) {
            uint64_t v = LOAD(m->requests[r][c]);
            if (v != 0)
                metrics_emit(&o, "couponseize_requests_total{route=\"%s\",code=\"%s\"} %llu\n",
                     route_names[r], http_code_name((enum cs_code)c), (unsigned long long)v);
        }

    metrics_emit(&o, "# HELP couponseize_seize_duration_seconds Time to answer a seize.\n"
             "# TYPE couponseize_seize_duration_seconds histogram\n");
    uint64_t cum = 0;
    for (int b = 0; b < SHM_LAT_BUCKETS; b++) {
        cum += LOAD(m->seize_lat[b]);
        if (b == SHM_LAT_BUCKETS - 1)
            metrics_emit(&o, "couponseize_seize_duration_seconds_bucket{le=\"+Inf\"} %llu\n",
                 (unsigned long long)cum);
        else
            metrics_emit(&o, "couponseize_seize_duration_seconds_bucket{le=\"%g\"} %llu\n",
                 (double)shm_lat_bounds_us[b] / 1e6, (unsigned long long)cum);
    }
    metrics_emit(&o, "couponseize_seize_duration_seconds_sum %.6f\n",
         (double)LOAD(m->seize_lat_sum_us) / 1e6);
    metrics_emit(&o, "couponseize_seize_duration_seconds_count %llu\n",
         (unsigned long long)LOAD(m->seize_lat_count));

    counters(&o, m, node_counters, sizeof(node_counters) / sizeof(node_counters[0]));
    metrics_emit(&o, "# HELP couponseize_breaker_state Redis breaker: 0 closed, 1 open, 2 half-open.\n"
             "# TYPE couponseize_breaker_state gauge\ncouponseize_breaker_state %d\n",
         atomic_load((_Atomic int *)&node->breaker.state));
    const struct batch_metrics *bm = &node->batch.m;
    metrics_emit(&o, "# HELP couponseize_batch_size Seizes of one script call led by a worker "
             "(group commit; 1: it went alone).\n# TYPE couponseize_batch_size histogram\n");
    cum = 0;
    for (int b = 0; b < BATCH_SIZE_BUCKETS; b++) {
        cum += LOAD(bm->size[b]);
        metrics_emit(&o, "couponseize_batch_size_bucket{le=\"%d\"} %llu\n", 1 << b,
             (unsigned long long)cum);
    }
    metrics_emit(&o, "couponseize_batch_size_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    metrics_emit(&o, "couponseize_batch_size_sum %llu\ncouponseize_batch_size_count %llu\n",
         (unsigned long long)LOAD(bm->size_sum), (unsigned long long)LOAD(bm->calls));
    counters(&o, bm, batch_counters, sizeof(batch_counters) / sizeof(batch_counters[0]));
    int fault = atomic_load((_Atomic int *)&node->breaker.fault);
    metrics_emit(&o, "# HELP couponseize_redis_fault Why the last seize call failed (1 on the "
             "fault named; all 0 after a success).\n# TYPE couponseize_redis_fault gauge\n");
    for (int f = RCONN_FAULT_DOWN; f < RCONN_FAULT__COUNT; f++)
        metrics_emit(&o, "couponseize_redis_fault{fault=\"%s\"} %d\n",
             rconn_fault_name((enum rconn_fault)f), f == fault);
    metrics_shards(&o, node);
    metrics_reserves(&o, node, lease_ms);

    /* Read from Redis by the workers, so the depths stay current when
     * coupon-sync is dead (its own gauge then freezes). */
    int64_t read_ms = atomic_load(&node->qdepth.read_ms);
    if (read_ms > 0) {
        metrics_emit(&o, "# HELP couponseize_queue_depth Coupons granted but not yet in MySQL: "
                 "HLEN of QUEUE:COUPON:SEIZE:SYNC:{i}, read by the workers.\n"
                 "# TYPE couponseize_queue_depth gauge\n");
        for (int i = 0; i < SHM_QUEUE_SHARDS; i++)
            metrics_emit(&o, "couponseize_queue_depth{shard=\"%d\"} %lld\n", i,
                 (long long)atomic_load(&node->qdepth.depth[i]));
        metrics_emit(&o, "# HELP couponseize_queue_depth_read_timestamp_seconds When the workers "
                 "last read couponseize_queue_depth from Redis.\n"
                 "# TYPE couponseize_queue_depth_read_timestamp_seconds gauge\n"
                 "couponseize_queue_depth_read_timestamp_seconds %.3f\n",
             (double)read_ms / 1000.0);
    }
    return o.len;
}

/* The node's workers from the registry in shared memory: how many are alive
 * and the resident memory of each (from /proc; a slot whose process is gone
 * is skipped). */
void metrics_workers(const struct shm_node *node, struct metrics_out *o)
{
    long page = sysconf(_SC_PAGESIZE);
    int alive = 0;

    metrics_emit(o, "# HELP couponseize_worker_rss_bytes Resident memory of each worker process, "
            "by registry slot.\n# TYPE couponseize_worker_rss_bytes gauge\n");
    int32_t seen[SHM_MAX_WORKERS];
    int nseen = 0;

    for (int i = 0; i < SHM_MAX_WORKERS; i++) {
        int32_t pid = atomic_load((_Atomic int32_t *)&node->worker_pid[i]);
        if (pid <= 0)
            continue;
        /* A worker with request threads holds a slot per thread: one
         * process, counted and measured once, under its first slot. */
        int j = 0;
        while (j < nseen && seen[j] != pid)
            j++;
        if (j < nseen)
            continue;
        seen[nseen++] = pid;
        char path[64];
        unsigned long size, resident;
        snprintf(path, sizeof(path), "/proc/%d/statm", (int)pid);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        int got = fscanf(f, "%lu %lu", &size, &resident);
        fclose(f);
        if (got != 2)
            continue;
        alive++;
        metrics_emit(o, "couponseize_worker_rss_bytes{worker=\"%d\"} %llu\n", i,
             (unsigned long long)resident * (unsigned long long)page);
    }
    metrics_emit(o, "# HELP couponseize_workers Worker processes of this node that are alive.\n"
            "# TYPE couponseize_workers gauge\ncouponseize_workers %d\n", alive);
}

void metrics_config(const struct cs_conf *conf, struct metrics_out *o)
{
    metrics_emit(o, "# HELP couponseize_build_info The running build of coupon-fcgi (always 1).\n"
            "# TYPE couponseize_build_info gauge\n"
            "couponseize_build_info{program=\"coupon-fcgi\",version=\"%s\"} 1\n",
         PACKAGE_VERSION);
    metrics_emit(o, "# HELP couponseize_fallback_budget_seconds fallback.budget_ms: every seize is "
            "answered within it.\n# TYPE couponseize_fallback_budget_seconds gauge\n"
            "couponseize_fallback_budget_seconds %.3f\n", (double)conf->fallback_budget_ms / 1000);
    metrics_emit(o, "# HELP couponseize_workers_configured fcgi.workers: the workers the "
            "supervisor keeps alive.\n# TYPE couponseize_workers_configured gauge\n"
            "couponseize_workers_configured %d\n", conf->fcgi_workers);
    metrics_emit(o, "# HELP couponseize_fallback_reserve fallback.reserve: coupons per open sale "
            "set aside for this node (0: no reserves, no keeper).\n"
            "# TYPE couponseize_fallback_reserve gauge\ncouponseize_fallback_reserve %d\n",
         conf->fallback_reserve);
    metrics_emit(o, "# HELP couponseize_sync_metrics_file_configured 1 when this node's "
            "configuration names sync.metrics_file (coupon-sync's metrics are then expected).\n"
            "# TYPE couponseize_sync_metrics_file_configured gauge\n"
            "couponseize_sync_metrics_file_configured %d\n",
         conf->sync_metrics_file != NULL && conf->sync_metrics_file[0] != '\0');
}
