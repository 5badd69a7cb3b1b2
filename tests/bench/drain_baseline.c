/* drain_baseline.c - the per-row queue drain of the common Java design, for comparison
 * with coupon-sync's batches in tests/bench/drain.sh.
 *
 * For every queue entry: one transaction (INSERT IGNORE one coupon, UPDATE the
 * stock by the rows inserted, COMMIT), then one HDEL. Entries are read with
 * HSCAN like coupon-sync does, and the activity lookup is cached, so the only
 * difference measured is the write path. Threads: -t N (default 1) threads,
 * thread k drains shards k, k+N, ...; drain.sh passes coupon-sync's
 * sync.threads so both sides get the same parallelism.
 *
 * Usage: drain_baseline -c CONF [-t THREADS]
 * Prints "rows=<n> seconds=<s>" and exits 0, or 1 on an error. */
#include "conf.h"
#include "cs.h"
#include "keys.h"
#include "log.h"
#include "mconn.h"
#include "rconn.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BASE_MAX_THREADS 10
#define BASE_MAX_ACTS 1024

static const char SQL_ACTIVITY[] = "SELECT validity_days FROM activity WHERE id = ?";
static const char SQL_INSERT[] =
    "INSERT IGNORE INTO coupon (activity_id,user_id,status,seized_at,valid_until) "
    "VALUES (?,?,1,FROM_UNIXTIME(?),FROM_UNIXTIME(?) + INTERVAL ? DAY)";
static const char SQL_STOCK[] = "UPDATE activity SET stock_num = stock_num - ? WHERE id = ?";

static struct cs_conf base_conf;
static int base_threads = 1;
static atomic_uint_fast64_t base_rows;
static atomic_int base_failed;

struct base_act {
    int64_t id;
    int days;
};

static int base_days_row(void *arg, int ncols, char **cols)
{
    if (ncols == 1 && cols[0] != NULL)
        *(int *)arg = atoi(cols[0]);
    return CS_OK;
}

/* validity_days of activity ID (cached), or -1 when unknown or on error. */
static int base_days(struct mconn *mc, struct base_act *acts, int *nacts, int64_t id)
{
    for (int i = 0; i < *nacts; i++)
        if (acts[i].id == id)
            return acts[i].days;
    int days = -1;
    struct mval p[] = {MV_INT(id)};
    if (mconn_query(mc, SQL_ACTIVITY, p, 1, base_days_row, &days) != CS_OK)
        return -1;
    if (days >= 0 && *nacts < BASE_MAX_ACTS) {
        acts[*nacts].id = id;
        acts[*nacts].days = days;
        (*nacts)++;
    }
    return days;
}

/* One entry the per-row way: its own transaction, then its own HDEL. */
static int base_entry(struct rconn *rc, struct mconn *mc, const char *qkey, const redisReply *f,
                      const redisReply *v, struct base_act *acts, int *nacts)
{
    int64_t aid, uid, ms;
    if (keys_parse_queue_field(f->str, f->len, &aid, &uid) != CS_OK ||
        cs_parse_id(v->str, v->len, &ms) != CS_OK)
        return CS_OK; /* not this program's business */
    int days = base_days(mc, acts, nacts, aid);
    if (days < 0)
        return CS_ERR;

    uint64_t affected = 0;
    double s = (double)ms / 1000.0;
    struct mval ip[] = {MV_INT(aid), MV_INT(uid), MV_DBL(s), MV_DBL(s), MV_INT(days)};
    if (mconn_begin(mc) != CS_OK || mconn_exec(mc, SQL_INSERT, ip, 5, &affected) != CS_OK)
        goto fail;
    struct mval sp[] = {MV_INT((int64_t)affected), MV_INT(aid)};
    if (affected > 0 && mconn_exec(mc, SQL_STOCK, sp, 2, NULL) != CS_OK)
        goto fail;
    if (mconn_commit(mc) != CS_OK)
        goto fail;
    atomic_fetch_add(&base_rows, affected);

    redisReply *r = rconn_command(rc, qkey, "HDEL %s %b", qkey, f->str, f->len);
    if (r == NULL) {
        fprintf(stderr, "drain_baseline: HDEL: %s\n", rc->errstr);
        return CS_ERR;
    }
    freeReplyObject(r);
    return CS_OK;
fail:
    fprintf(stderr, "drain_baseline: %s\n", mc->errstr);
    mconn_rollback(mc);
    return CS_ERR;
}

static int base_shard(struct rconn *rc, struct mconn *mc, int shard)
{
    char qkey[KEYS_MAX], cursor[24] = "0";
    struct base_act acts[BASE_MAX_ACTS];
    int nacts = 0;

    keys_queue(qkey, shard);
    for (;;) {
        redisReply *r = rconn_command(rc, qkey, "HSCAN %s %s COUNT 500", qkey, cursor);
        if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
            fprintf(stderr, "drain_baseline: HSCAN failed: %s\n", r ? "bad reply" : rc->errstr);
            if (r != NULL)
                freeReplyObject(r);
            return CS_ERR;
        }
        snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
        const redisReply *kv = r->element[1];
        for (size_t i = 0; i + 1 < kv->elements; i += 2)
            if (base_entry(rc, mc, qkey, kv->element[i], kv->element[i + 1], acts, &nacts) !=
                CS_OK) {
                freeReplyObject(r);
                return CS_ERR;
            }
        freeReplyObject(r);
        if (strcmp(cursor, "0") != 0)
            continue;
        r = rconn_command(rc, qkey, "HLEN %s", qkey);
        long long left = r != NULL && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
        if (r != NULL)
            freeReplyObject(r);
        if (left <= 0)
            return left == 0 ? CS_OK : CS_ERR;
    }
}

static void *base_thread(void *arg)
{
    int k = (int)(intptr_t)arg;
    struct rconn_opts ro = {
        .host = base_conf.redis_host,
        .port = base_conf.redis_port,
        .password = base_conf.redis_password,
        .connect_timeout_ms = base_conf.redis_connect_timeout_ms,
        .command_timeout_ms = 5000,
    };
    mysql_thread_init();
    struct rconn *rc = rconn_new(&ro);
    struct mconn *mc = mconn_new(&base_conf);
    for (int s = k; s < KEYS_SHARDS; s += base_threads)
        if (base_shard(rc, mc, s) != CS_OK) {
            atomic_store(&base_failed, 1);
            break;
        }
    mconn_free(mc);
    rconn_free(rc);
    mysql_thread_end();
    return NULL;
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    char err[512];
    int opt;
    pthread_t th[BASE_MAX_THREADS];

    int bad = 0;
    while ((opt = getopt(argc, argv, "c:t:")) != -1) {
        if (opt == 'c')
            path = optarg;
        else if (opt == 't')
            base_threads = atoi(optarg);
        else
            bad = 1;
    }
    if (bad || path == NULL || base_threads < 1 || base_threads > BASE_MAX_THREADS) {
        fprintf(stderr, "usage: drain_baseline -c CONF [-t THREADS(1..%d)]\n",
                BASE_MAX_THREADS);
        return 1;
    }
    if (conf_load(&base_conf, path, err, sizeof(err)) != CS_OK) {
        fprintf(stderr, "drain_baseline: %s\n", err);
        return 1;
    }
    log_init("drain_baseline", LOG_LVL_WARNING, "stderr");
    mysql_library_init(0, NULL, NULL);

    int64_t t0 = cs_mono_us();
    int started = 0;
    for (int k = 0; k < base_threads; k++) {
        int e = pthread_create(&th[k], NULL, base_thread, (void *)(intptr_t)k);
        if (e != 0) {
            fprintf(stderr, "drain_baseline: pthread_create() failed: %s\n", strerror(e));
            atomic_store(&base_failed, 1);
            break;
        }
        started++;
    }
    for (int k = 0; k < started; k++)
        pthread_join(th[k], NULL);
    double secs = (double)(cs_mono_us() - t0) / 1e6;

    printf("rows=%" PRIu64 " seconds=%.3f\n", (uint64_t)atomic_load(&base_rows), secs);
    mysql_library_end();
    conf_free(&base_conf);
    return atomic_load(&base_failed) ? 1 : 0;
}
