/* main.c - coupon-sync: drains the seize queues into MySQL; runs preheat, the status job
 * and reconciliation. */
#include "activity.h"
#include "conf.h"
#include "cs.h"
#include "drain.h"
#include "jobs.h"
#include "keys.h"
#include "log.h"
#include "schema.h"
#include "mconn.h"
#include "pool.h"
#include "preheat.h"
#include "rconn.h"
#include "sdnotify.h"
#include "smetrics.h"

#include <getopt.h>
#include <malloc.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Longest sleep of the main loop, so signals are acted on promptly. */
#define SYNCD_POLL_MS 100

struct syncd;

struct syncd_task {
    struct syncd *d;
    int shard;
};

struct syncd {
    const char *conf_path;
    struct cs_conf conf;       /* read by the workers: changed only while no pool runs */
    struct pool *pool;
    struct rconn *rc;          /* the main thread's own connections, for the jobs */
    struct mconn *mc;
    atomic_int busy[KEYS_SHARDS];
    atomic_int failed;         /* shard tasks that failed to drain or reconcile */
    struct syncd_task tasks[KEYS_SHARDS];
    int64_t next_preheat_ms, next_status_ms;
    int64_t next_full_ms;      /* the next full preheat and full expiry scan */
    struct preheat_mark mark;  /* where the periodic preheat left off */
    int relist;                /* expiry removed activities: ACTIVITY:LIST wants rewriting */
    int expire_full;           /* the next expiry pass parses every META field */
    unsigned long ticks;
    int once;                  /* --once: drain each shard until empty, however long */
};

static volatile sig_atomic_t syncd_got_term, syncd_got_hup;

/* Tells running tasks to stop after their batch. Set from the signal handler
 * too (a lock-free atomic store is async-signal-safe), so --once, which
 * waits on the pool, also stops after the batches in flight. */
static atomic_int syncd_stop_tasks;

static void syncd_on_signal(int sig)
{
    if (sig == SIGHUP) {
        syncd_got_hup = 1;
    } else {
        syncd_got_term = 1;
        atomic_store(&syncd_stop_tasks, 1);
    }
}

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: coupon-sync [-c PATH] [-t] [-f] [--once] [-h]\n"
            "Drains the coupon seize queues from Redis into MySQL, preheats activities,\n"
            "advances their status and reconciles stock counts.\n\n"
            "  -c, --config PATH  configuration file (default %s)\n"
            "  -t, --test         check the configuration file and exit (0 valid, 1 not)\n"
            "  -f, --foreground   stay in the foreground (always the case; for scripts)\n"
            "      --once         run one full tick: preheat, drain every shard until\n"
            "                     empty, status job, reconciliation; exit 0, or 1 when a\n"
            "                     shard or job failed (entries then stay queued)\n"
            "  -h, --help         show this help\n\n"
            "Signals: SIGTERM/SIGINT finish the current batch and exit; SIGHUP reloads\n"
            "the configuration.\n",
            CS_DEFAULT_CONF);
}

/* ---- the pool's per-thread context ---------------------------------------------------- */

static void *syncd_worker_new(void *udata)
{
    struct syncd *d = udata;
    mysql_thread_init();
    return drain_worker_new(&d->conf);
}

static void syncd_worker_free(void *ctx)
{
    drain_worker_free(ctx);
    mysql_thread_end();
}

static void syncd_task_run(void *ctx, void *arg)
{
    struct syncd_task *t = arg;
    struct syncd *d = t->d;
    struct drain_opts o = {
        .batch = d->conf.sync_batch,
        .lock_ttl_ms = d->conf.sync_lock_ttl_ms,
        .stop = &syncd_stop_tasks,
        /* A shard that a sale keeps filling yields after one tick's worth of
         * time, so with fewer threads than shards the others get their turn. */
        .budget_ms = d->once ? 0 : (int64_t)d->conf.sync_interval_s * 1000,
    };
    enum drain_result r = drain_shard(ctx, t->shard, &o);
    int mismatches;

    if (r == DRAIN_EMPTY) {
        smetrics_success(cs_now_ms());
        /* Reconciled right after the drain: nothing is half-moved now. */
        if (jobs_reconcile_shard(drain_worker_mconn(ctx), drain_worker_rconn(ctx), t->shard,
                                 d->conf.sync_lock_ttl_ms, d->conf.sync_reconcile_full_s,
                                 &mismatches) != CS_OK)
            atomic_fetch_add(&d->failed, 1);
    } else if (r == DRAIN_MORE) {
        smetrics_success(cs_now_ms()); /* it is moving, just not empty */
    } else if (r == DRAIN_FAILED) {
        atomic_fetch_add(&d->failed, 1);
    }
    if (r != DRAIN_EMPTY)
        log_debug("shard %d: task ended: %s", t->shard, drain_result_name(r));
    atomic_store(&d->busy[t->shard], 0);
}

/* ---- start, stop, reload ---------------------------------------------------------------- */

static int syncd_start(struct syncd *d)
{
    const struct cs_conf *c = &d->conf;

    if (!syncd_got_term)
        atomic_store(&syncd_stop_tasks, 0);
    d->rc = rconn_new_conf(c, c->sync_redis_timeout_ms);
    d->mc = mconn_new(c);
    d->pool = pool_new(c->sync_threads, syncd_worker_new, syncd_worker_free, d);
    if (d->pool == NULL) {
        mconn_free(d->mc);
        rconn_free(d->rc);
        d->mc = NULL;
        d->rc = NULL;
        return CS_ERR;
    }
    return CS_OK;
}

/* Tells running tasks to stop after their batch and waits for them. */
static void syncd_stop(struct syncd *d)
{
    atomic_store(&syncd_stop_tasks, 1);
    pool_free(d->pool);
    d->pool = NULL;
    mconn_free(d->mc);
    rconn_free(d->rc);
    d->mc = NULL;
    d->rc = NULL;
}

static void syncd_log_init(const struct cs_conf *c)
{
    log_init("coupon-sync", log_level_parse(c->log_level), c->log_target);
}

/* SIGHUP: a bad file is logged and the running configuration kept. */
static int syncd_reload(struct syncd *d)
{
    struct cs_conf next;
    char err[512];

    if (conf_load(&next, d->conf_path, err, sizeof(err)) != CS_OK) {
        log_error("reload failed, keeping the running configuration: %s", err);
        return CS_OK;
    }
    sdnotify_reloading();
    log_notice("reloading %s", d->conf_path);
    syncd_stop(d);
    conf_free(&d->conf);
    d->conf = next;
    syncd_log_init(&d->conf);
    d->next_preheat_ms = 0; /* the horizon may have changed: a full pass */
    d->next_full_ms = 0;
    if (syncd_start(d) != CS_OK)
        return CS_ERR;
    sdnotify_ready();
    return CS_OK;
}

/* ---- ticks ---------------------------------------------------------------------------- */

static void syncd_submit_all(struct syncd *d)
{
    for (int i = 0; i < KEYS_SHARDS; i++) {
        /* A shard whose last task still runs is skipped, not queued behind it. */
        if (atomic_exchange(&d->busy[i], 1) != 0) {
            log_debug("shard %d: previous task still running; skipped this tick", i);
            continue;
        }
        d->tasks[i].d = d;
        d->tasks[i].shard = i;
        pool_submit(d->pool, syncd_task_run, &d->tasks[i]);
    }
}

/* The periodic preheat: what changed since the last pass, or everything
 * when d->mark is unset. */
static int syncd_preheat(struct syncd *d)
{
    if (jobs_preheat(d->mc, d->rc, d->conf.preheat_horizon_days, d->conf.sync_cleanup_grace_s,
                     &d->mark, d->relist) != CS_OK)
        return CS_ERR;
    d->relist = 0;
    return CS_OK;
}

/* The main thread's jobs of a tick. CS_ERR when one of them failed. */
static int syncd_jobs(struct syncd *d, int64_t now)
{
    const struct cs_conf *c = &d->conf;
    int ret = CS_OK;
    int64_t depth = -1;

    int full = now >= d->next_full_ms;
    if (now >= d->next_preheat_ms || full) {
        if (full)
            d->mark.since_s = 0;
        if (syncd_preheat(d) != CS_OK)
            ret = CS_ERR;
        d->next_preheat_ms = now + (int64_t)c->preheat_interval_s * 1000;
    }
    if (now >= d->next_status_ms || full) {
        int removed = 0;
        uint64_t expired, returned;
        if (jobs_status(d->mc, d->rc) != CS_OK
            || jobs_expire(d->rc, c->sync_cleanup_grace_s, full || d->expire_full, &removed)
                   != CS_OK)
            ret = CS_ERR;
        else
            d->expire_full = 0;
        if (removed > 0)
            d->relist = 1;
        if (jobs_coupons(d->mc, d->rc, c->sync_expire_batch, c->sync_lock_ttl_ms, &expired,
                         &returned) != CS_OK)
            ret = CS_ERR;
        d->next_status_ms = now + (int64_t)c->sync_status_interval_s * 1000;
    }
    if (full)
        d->next_full_ms = now + (int64_t)c->preheat_full_interval_s * 1000;
    if (jobs_queue_depth(d->rc, &depth) != CS_OK)
        ret = CS_ERR;
    if (c->sync_metrics_file[0] != '\0')
        smetrics_write(c->sync_metrics_file);
    /* What the tick's batches freed goes back to the system, not into
     * the arenas' free lists. */
    malloc_trim(0);
    sdnotify_status("tick %lu: %llu coupons written, %lld queued, %llu errors", d->ticks,
                    (unsigned long long)smetrics_rows(), (long long)depth,
                    (unsigned long long)smetrics_errors());
    d->ticks++;
    return ret;
}

/*
 * glibc keeps, per thread, a cache of freed chunks of each small size
 * (tcache, up to 7 per size) for the thread to reuse. The ten pool threads
 * meet ever new sizes (hiredis replies, MariaDB packets) for tens of
 * minutes, so their caches fill slowly and RSS crept by about 1 MB over a
 * 20-minute make soak while the live heap stayed flat (valgrind massif);
 * with the cache off it stayed flat. The cache can only be switched off
 * before the process starts (a glibc tunable), so the daemon sets it and
 * executes itself once more, keeping its PID (systemd is not confused).
 * An administrator's own glibc.malloc.tcache_count wins. Best effort: if
 * the exec fails, the daemon runs as it is.
 */
static void syncd_tcache_off(char **argv)
{
    static const char knob[] = "glibc.malloc.tcache_count";
    const char *t = getenv("GLIBC_TUNABLES");
    char buf[1024];

    if (t != NULL && strstr(t, knob) != NULL)
        return;
    if (snprintf(buf, sizeof(buf), "%s%s%s=0", t ? t : "", t ? ":" : "", knob)
        >= (int)sizeof(buf))
        return;
    if (setenv("GLIBC_TUNABLES", buf, 1) != 0)
        return;
    execv("/proc/self/exe", argv);
    unsetenv("GLIBC_TUNABLES");
    if (t != NULL)
        setenv("GLIBC_TUNABLES", t, 1);
}

/* --once: everything one tick does, each shard drained until empty (and then
 * reconciled by its task). */
static int syncd_once(struct syncd *d)
{
    int ret = CS_OK;

    d->once = 1;
    d->next_preheat_ms = d->next_status_ms = 0;
    d->mark.since_s = 0;
    if (syncd_preheat(d) != CS_OK)
        ret = CS_ERR;
    d->next_preheat_ms = d->next_full_ms = INT64_MAX; /* done above, before the drain */
    syncd_submit_all(d);
    pool_wait_idle(d->pool);
    int removed; /* after the drain: what it emptied can go */
    if (jobs_expire(d->rc, d->conf.sync_cleanup_grace_s, 1, &removed) != CS_OK)
        ret = CS_ERR;
    if (syncd_jobs(d, cs_mono_ms()) != CS_OK)
        ret = CS_ERR;
    if (atomic_load(&d->failed) > 0)
        ret = CS_ERR;
    log_info("one tick done: %llu coupons written, %d shard tasks failed",
             (unsigned long long)smetrics_rows(), atomic_load(&d->failed));
    return ret;
}

static int syncd_run(struct syncd *d)
{
    int64_t next_tick = cs_mono_ms();

    while (!syncd_got_term) {
        if (syncd_got_hup) {
            syncd_got_hup = 0;
            if (syncd_reload(d) != CS_OK)
                return CS_ERR;
        }
        int64_t now = cs_mono_ms();
        if (now >= next_tick) {
            syncd_submit_all(d);
            syncd_jobs(d, now);
            next_tick += (int64_t)d->conf.sync_interval_s * 1000;
            if (next_tick <= now)
                next_tick = now + (int64_t)d->conf.sync_interval_s * 1000;
            continue;
        }
        int64_t wait = next_tick - now < SYNCD_POLL_MS ? next_tick - now : SYNCD_POLL_MS;
        struct timespec ts = {0, (long)wait * 1000000L};
        nanosleep(&ts, NULL); /* a signal cuts it short */
    }
    return CS_OK;
}

/* ---- main ------------------------------------------------------------------------------- */

static void syncd_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = syncd_on_signal;
    sigemptyset(&sa.sa_mask);
    /* No SA_RESTART: the main loop's sleep must end on a signal. */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    /* A write to a Redis or MySQL server that went away must fail, not kill us. */
    sa.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &sa, NULL);
}

/* The command line: -1 to go on, or the exit status to leave with now. */
static int syncd_args(int argc, char **argv, const char **path, int *test, int *once)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'}, {"test", no_argument, NULL, 't'},
        {"foreground", no_argument, NULL, 'f'},   {"once", no_argument, NULL, 'O'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
    };
    int opt;

    while ((opt = getopt_long(argc, argv, "c:tfh", longopts, NULL)) != -1) {
        switch (opt) {
        case 'c':
            *path = optarg;
            break;
        case 't':
            *test = 1;
            break;
        case 'f':
            break;
        case 'O':
            *once = 1;
            break;
        case 'h':
            usage(stdout);
            return EXIT_SUCCESS;
        default:
            usage(stderr);
            return EXIT_FAILURE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "coupon-sync: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return EXIT_FAILURE;
    }
    return -1;
}

/* Serves until SIGTERM (or one tick with --once); the exit status. */
static int syncd_serve(struct syncd *d, int once)
{
    int status;

    if (once)
        return syncd_once(d) == CS_OK ? EXIT_SUCCESS : EXIT_FAILURE;
    /* A full preheat at start, before the first drain. */
    syncd_preheat(d);
    d->next_preheat_ms = cs_mono_ms() + (int64_t)d->conf.preheat_interval_s * 1000;
    d->next_full_ms = cs_mono_ms() + (int64_t)d->conf.preheat_full_interval_s * 1000;
    /* The first status pass scans every META field for expiry (fields
     * written before COUPON:ACTIVITY:ENDS existed). */
    d->expire_full = 1;
    sdnotify_ready();
    status = syncd_run(d) == CS_OK ? EXIT_SUCCESS : EXIT_FAILURE;
    sdnotify_stopping();
    log_notice("stopping: finishing the batches in flight");
    return status;
}

int main(int argc, char **argv)
{
    static struct syncd d; /* static: zeroed, and too big for nobody's stack */
    const char *path = CS_DEFAULT_CONF;
    int test = 0, once = 0, status = EXIT_FAILURE;
    char err[512];

    cs_init();
    /* glibc gives each thread that allocates its own arena (up to 8 per
     * core), and an arena keeps what its thread freed: with ten pool
     * threads taking shards in turn, RSS crept up tick after tick (see
     * make soak). Two arenas shared by all threads keep it flat; the pool
     * threads hardly contend for them (a batch waits on MySQL and Redis,
     * not on malloc). MALLOC_ARENA_MAX in the environment still wins. */
    if (getenv("MALLOC_ARENA_MAX") == NULL)
        mallopt(M_ARENA_MAX, 2);
    int leave = syncd_args(argc, argv, &path, &test, &once);
    if (leave >= 0)
        return leave;

    if (!test && !once)
        syncd_tcache_off(argv);
    if (conf_load(&d.conf, path, err, sizeof(err)) != CS_OK) {
        fprintf(stderr, "coupon-sync: %s\n", err);
        if (test)
            fprintf(stderr, "configuration file %s test failed\n", path);
        return EXIT_FAILURE;
    }
    if (test) {
        printf("configuration file %s test is successful\n", path);
        conf_free(&d.conf);
        return EXIT_SUCCESS;
    }
    d.conf_path = path;
    syncd_log_init(&d.conf);
    syncd_signals();
    /* Not thread-safe when left to the first mysql_init() of a worker. */
    if (mysql_library_init(0, NULL, NULL) != 0) {
        log_error("mysql_library_init() failed");
        goto out_conf;
    }
    if (schema_check_start(&d.conf) != CS_OK)
        goto out_lib;
    if (syncd_start(&d) != CS_OK)
        goto out_lib;
    log_notice("coupon-sync started: %d threads, batch %d, every %d s, config %s",
               d.conf.sync_threads, d.conf.sync_batch, d.conf.sync_interval_s, path);
    status = syncd_serve(&d, once);
    if (d.pool != NULL)
        syncd_stop(&d);
    if (d.conf.sync_metrics_file[0] != '\0')
        smetrics_write(d.conf.sync_metrics_file);
    log_notice("coupon-sync stopped: %llu coupons written",
               (unsigned long long)smetrics_rows());
out_lib:
    mysql_library_end();
out_conf:
    preheat_mark_free(&d.mark);
    jobs_cleanup();
    conf_free(&d.conf);
    return status;
}
