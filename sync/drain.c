/* drain.c - one shard task of coupon-sync: Redis queue -> MySQL, batch by batch. */
#include "drain.h"
#include "conf.h"
#include "cs.h"
#include "keys.h"
#include "log.h"
#include "mconn.h"
#include "rconn.h"
#include "scripts.h"
#include "smetrics.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define DRAIN_PARAMS_PER_ROW 6
#define DRAIN_LOG_DEAD_MAX 10      /* dead letters logged one by one per batch */
#define DRAIN_SHAPES 8             /* INSERT statements of 1, 2, 4 ... 128 rows */
#define DRAIN_STMT_ROWS (1 << (DRAIN_SHAPES - 1))
#define DRAIN_TXN_ATTEMPTS 3       /* for deadlocks, lock wait timeouts, a stale connection */

#define ER_LOCK_WAIT_TIMEOUT 1205
#define ER_LOCK_DEADLOCK 1213

static const char SQL_ACTIVITY[] = "SELECT id, validity_days, status FROM activity WHERE id = ?";
static const char SQL_ACTIVITY_LOCK[] = "SELECT status FROM activity WHERE id = ? FOR UPDATE";
/* LEAST: a stock_num lowered by hand below what was sold must not make the
 * coupons unwritable (UNSIGNED underflow) and block the shard; the coupons
 * are recorded and reconciliation reports the activity. */
static const char SQL_STOCK[] =
    "UPDATE activity SET stock_num = stock_num - LEAST(stock_num, ?) WHERE id = ?";
static const char SQL_INSERT_HEAD[] =
    "INSERT IGNORE INTO coupon (activity_id,user_id,status,seized_at,valid_until) VALUES ";
static const char SQL_INSERT_ROW[] =
    "(?,?,?,FROM_UNIXTIME(?),FROM_UNIXTIME(?) + INTERVAL ? DAY)";


struct drain_entry {
    const char *field, *value;
    size_t flen, vlen;
    int64_t aid, uid;
    char seized[24];           /* seconds with exact milliseconds, "1700000000.123" */
    unsigned long seized_len;
    const char *dead;          /* reason it cannot be written, NULL when fine */
};

/* Per-task cache of SELECT ... FROM activity (id 0 marks an empty slot). */
struct drain_act {
    int64_t id;
    int found;
    int validity_days;
};

struct drain_worker {
    struct rconn *rc;
    struct mconn *mc;

    /* The INSERT of 2^i rows; mconn caches statements by these pointers,
     * so they live as long as the worker's mconn. */
    char *sqls[DRAIN_SHAPES];

    struct drain_entry *ents;
    size_t ents_cap;
    struct mval *params;
    size_t params_cap;
    const char **argv;
    size_t *argvlen;
    size_t argv_cap;

    struct drain_act *acts;
    size_t acts_cap, acts_n;

    int shard;
    char qkey[KEYS_MAX], dkey[KEYS_MAX], lkey[KEYS_MAX];
    char token[DRAIN_TOKEN_MAX];
    int lock_ttl_ms;

    /* The durability rule (see drain_fence()). */
    int wait_replicas, wait_timeout_ms;
    struct rconn_site scan_site;   /* the connection the batch was read on */
};

/* ---- the multi-row INSERT ------------------------------------------------------------ */

/*
 * Rows per INSERT statement: powers of two up to DRAIN_STMT_ROWS. A group of
 * n rows of one activity goes out as full DRAIN_STMT_ROWS statements and one
 * last statement of the next power of two, padded (at most half padding).
 * Every shape is prepared once per connection, before its first batch, so
 * the statements a connection holds do not grow with the batch sizes it
 * happens to meet: coupon-sync's memory is the same after a minute as after
 * a day. libmariadb keeps a MYSQL_BIND per parameter of a prepared statement;
 * 255 rows x 6 parameters is about 170 KB per connection.
 */
static int drain_bucket(int n)
{
    int b = 1;
    while (b < n && b < DRAIN_STMT_ROWS)
        b *= 2;
    return b;
}

static char *drain_insert_text(int rows)
{
    size_t head = strlen(SQL_INSERT_HEAD), row = strlen(SQL_INSERT_ROW);
    char *sql = xmalloc(head + (size_t)rows * (row + 1) + 1), *p = sql;
    memcpy(p, SQL_INSERT_HEAD, head);
    p += head;
    for (int i = 0; i < rows; i++) {
        if (i > 0)
            *p++ = ',';
        memcpy(p, SQL_INSERT_ROW, row);
        p += row;
    }
    *p = '\0';
    return sql;
}

/* The INSERT text for a bucket size (a power of two <= DRAIN_STMT_ROWS). */
static const char *drain_insert_sql(const struct drain_worker *w, int rows)
{
    int i = 0;
    while ((1 << i) < rows)
        i++;
    return w->sqls[i];
}

/* Prepares every INSERT shape on the current connection (cached ones cost a lookup). */
static int drain_prepare(struct drain_worker *w)
{
    for (int i = 0; i < DRAIN_SHAPES; i++)
        if (mconn_prepare(w->mc, w->sqls[i]) != CS_OK)
            return CS_ERR;
    return CS_OK;
}

/* ---- worker ------------------------------------------------------------------- */

struct drain_worker *drain_worker_new(const struct cs_conf *conf)
{
    struct drain_worker *w = xcalloc(1, sizeof(*w));
    w->rc = rconn_new_conf(conf, conf->sync_redis_timeout_ms);
    w->mc = mconn_new(conf);
    w->wait_replicas = conf->redis_wait_replicas;
    w->wait_timeout_ms = conf->redis_wait_timeout_ms;
    for (int i = 0; i < DRAIN_SHAPES; i++)
        w->sqls[i] = drain_insert_text(1 << i);
    return w;
}

void drain_worker_free(struct drain_worker *w)
{
    if (w == NULL)
        return;
    /* Statements first: they are keyed by the SQL strings freed below. */
    mconn_free(w->mc);
    rconn_free(w->rc);
    for (int i = 0; i < DRAIN_SHAPES; i++)
        free(w->sqls[i]);
    free(w->ents);
    free(w->params);
    free(w->argv);
    free(w->argvlen);
    free(w->acts);
    free(w);
}

struct rconn *drain_worker_rconn(struct drain_worker *w)
{
    return w->rc;
}

struct mconn *drain_worker_mconn(struct drain_worker *w)
{
    return w->mc;
}

const char *drain_result_name(enum drain_result r)
{
    switch (r) {
    case DRAIN_EMPTY:
        return "empty";
    case DRAIN_BUSY:
        return "locked by another process";
    case DRAIN_STOPPED:
        return "stopped";
    case DRAIN_MORE:
        return "time budget used, the rest next tick";
    case DRAIN_LOST_LOCK:
        return "lost the lock";
    case DRAIN_FAILED:
        return "failed";
    }
    return "?";
}

static void *drain_grow(void *p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return p;
    size_t n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    *cap = n;
    return xrealloc(p, n * size);
}

static void drain_argv_reserve(struct drain_worker *w, size_t n)
{
    size_t cap = w->argv_cap;
    w->argv = drain_grow(w->argv, &cap, n, sizeof(*w->argv));
    w->argvlen = drain_grow(w->argvlen, &w->argv_cap, n, sizeof(*w->argvlen));
}

/* ---- activities ------------------------------------------------------------------------ */

static void drain_acts_reset(struct drain_worker *w)
{
    if (w->acts_n > 0)
        memset(w->acts, 0, w->acts_cap * sizeof(*w->acts));
    w->acts_n = 0;
}

static struct drain_act *drain_acts_slot(struct drain_act *acts, size_t cap, int64_t id)
{
    size_t i = ((uint64_t)id * 0x9E3779B97F4A7C15ull) & (cap - 1);
    while (acts[i].id != 0 && acts[i].id != id)
        i = (i + 1) & (cap - 1);
    return &acts[i];
}

static int drain_act_row(void *arg, int ncols, char **cols)
{
    struct drain_act *a = arg;
    if (ncols != 3 || cols[1] == NULL)
        return CS_ERR;
    a->found = 1;
    a->validity_days = atoi(cols[1]);
    return CS_OK;
}

/* The cached activity ID, looked up in MySQL on first use. NULL on a MySQL error. */
static struct drain_act *drain_act_get(struct drain_worker *w, int64_t id)
{
    if (w->acts_cap == 0 || (w->acts_n + 1) * 2 > w->acts_cap) {
        size_t ncap = w->acts_cap ? w->acts_cap * 2 : 64;
        struct drain_act *n = xcalloc(ncap, sizeof(*n));
        for (size_t i = 0; i < w->acts_cap; i++)
            if (w->acts[i].id != 0)
                *drain_acts_slot(n, ncap, w->acts[i].id) = w->acts[i];
        free(w->acts);
        w->acts = n;
        w->acts_cap = ncap;
    }
    struct drain_act *a = drain_acts_slot(w->acts, w->acts_cap, id);
    if (a->id == id)
        return a;

    struct drain_act tmp = {.id = id};
    struct mval p[] = {MV_INT(id)};
    if (mconn_query(w->mc, SQL_ACTIVITY, p, 1, drain_act_row, &tmp) != CS_OK)
        return NULL;
    *a = tmp;
    w->acts_n++;
    return a;
}

/* ---- one batch ---------------------------------------------------------------------------- */

/* Orders writable entries by activity then user (one lock order for every
 * transaction), dead ones last. */
static int drain_entry_cmp(const void *x, const void *y)
{
    const struct drain_entry *a = x, *b = y;
    if ((a->dead != NULL) != (b->dead != NULL))
        return a->dead != NULL ? 1 : -1;
    if (a->aid != b->aid)
        return a->aid < b->aid ? -1 : 1;
    return (a->uid > b->uid) - (a->uid < b->uid);
}

/* Fills w->ents from n field/value pairs of an HSCAN reply; marks what can
 * never be written. */
static void drain_parse(struct drain_worker *w, redisReply **kv, size_t n)
{
    w->ents = drain_grow(w->ents, &w->ents_cap, n, sizeof(*w->ents));
    for (size_t i = 0; i < n; i++) {
        struct drain_entry *e = &w->ents[i];
        const redisReply *f = kv[2 * i], *v = kv[2 * i + 1];
        int64_t ms;
        memset(e, 0, sizeof(*e));
        e->field = f->str;
        e->flen = f->len;
        e->value = v->str ? v->str : "";
        e->vlen = v->str ? v->len : 0;
        if (f->type != REDIS_REPLY_STRING ||
            keys_parse_queue_field(f->str, f->len, &e->aid, &e->uid) != CS_OK)
            e->dead = "malformed field";
        else if (v->type != REDIS_REPLY_STRING || cs_parse_id(v->str, v->len, &ms) != CS_OK)
            e->dead = "value is not a number";
        else
            /* Decimal text, not a double: MySQL rounds a double's
             * 1700000000.1229999 down to .122 in DATETIME(3). */
            e->seized_len = (unsigned long)snprintf(e->seized, sizeof(e->seized),
                                                    "%" PRId64 ".%03d", ms / 1000, (int)(ms % 1000));
    }
}

static int drain_act_status_row(void *arg, int ncols, char **cols)
{
    if (ncols != 1 || cols[0] == NULL)
        return CS_ERR;
    *(int *)arg = atoi(cols[0]);
    return CS_OK;
}

/* Writes the coupons of ents[0..n) (writable, sorted by activity) and the stock
 * decrements in one transaction. *inserted gets the new rows. */
static int drain_txn(struct drain_worker *w, size_t n, uint64_t *inserted)
{
    struct mconn *mc = w->mc;
    uint64_t total = 0;

    if (drain_prepare(w) != CS_OK || mconn_begin(mc) != CS_OK)
        return CS_ERR;
    for (size_t i = 0; i < n;) {
        int64_t aid = w->ents[i].aid;
        size_t j = i;
        while (j < n && w->ents[j].aid == aid)
            j++;

        /* Locking the activity row first fetches its current status (a revoke
         * since the lookup makes these coupons void) and orders this
         * transaction after a concurrent revoke, which locks the row the
         * same way, instead of deadlocking on coupon rows. */
        int status = 0;
        struct mval lp[] = {MV_INT(aid)};
        if (mconn_query(mc, SQL_ACTIVITY_LOCK, lp, 1, drain_act_status_row, &status) != CS_OK)
            goto fail;
        if (status == 0) {
            char why[64];
            snprintf(why, sizeof(why), "activity %" PRId64 " vanished", aid);
            mconn_set_err(mc, 0, "locking the activity row", why);
            goto fail;
        }
        int64_t cstatus = status == 4 ? 4 : 1;
        struct drain_act *act = drain_act_get(w, aid);
        if (act == NULL)
            goto fail;
        int64_t days = act->validity_days;

        uint64_t affected = 0;
        for (size_t k = i; k < j; k += DRAIN_STMT_ROWS) {
            int rows = (int)(j - k < DRAIN_STMT_ROWS ? j - k : DRAIN_STMT_ROWS);
            int stmt_rows = drain_bucket(rows);
            uint64_t got = 0;
            w->params = drain_grow(w->params, &w->params_cap,
                                   (size_t)stmt_rows * DRAIN_PARAMS_PER_ROW, sizeof(*w->params));
            for (int r = 0; r < stmt_rows; r++) {
                /* Padding repeats the last row: INSERT IGNORE skips the duplicate,
                 * and affected rows still count only real inserts. */
                const struct drain_entry *e = &w->ents[k + (size_t)(r < rows ? r : rows - 1)];
                struct mval *p = &w->params[(size_t)r * DRAIN_PARAMS_PER_ROW];
                p[0] = MV_INT(e->aid);
                p[1] = MV_INT(e->uid);
                p[2] = MV_INT(cstatus);
                p[3] = MV_TXT(e->seized, e->seized_len);
                p[4] = MV_TXT(e->seized, e->seized_len);
                p[5] = MV_INT(days);
            }
            if (mconn_exec(mc, drain_insert_sql(w, stmt_rows), w->params,
                           stmt_rows * DRAIN_PARAMS_PER_ROW, &got) != CS_OK)
                goto fail;
            affected += got;
        }
        if (affected > 0) {
            struct mval sp[] = {MV_INT((int64_t)affected), MV_INT(aid)};
            if (mconn_exec(mc, SQL_STOCK, sp, 2, NULL) != CS_OK)
                goto fail;
        }
        total += affected;
        i = j;
    }
    if (mconn_commit(mc) != CS_OK)
        goto fail;
    *inserted = total;
    return CS_OK;
fail:
    mconn_rollback(mc);
    return CS_ERR;
}

/* Puts "CMD KEY: why" in rc's sticky error for an answer r that was not the
 * one wanted (why: Redis' error, or "unexpected reply"); rc->err stays. */
static void drain_reply_err(struct rconn *rc, const char *cmd, const char *key,
                            const redisReply *r)
{
    char what[KEYS_MAX + 16];
    snprintf(what, sizeof(what), "%s %s", cmd, key);
    rconn_set_err(rc, rc->err, what, r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
}

/* Logs a failed call to DEP once per outage; see smetrics_dep_fail(). */
static int drain_fail(struct drain_worker *w, enum smetrics_dep dep)
{
    char why[320];
    if (dep == SM_DEP_MYSQL)
        snprintf(why, sizeof(why), "shard %d: %s", w->shard, w->mc->errstr);
    else
        snprintf(why, sizeof(why), "shard %d: %s", w->shard, w->rc->errstr);
    smetrics_dep_fail(dep, why);
    return CS_ERR;
}

/* Runs a command built in w->argv; CS_OK when Redis did not answer an error. */
static int drain_redis_argv(struct drain_worker *w, const char *key, int argc)
{
    redisReply *r = rconn_commandv(w->rc, key, argc, w->argv, w->argvlen);
    if (r == NULL)
        return drain_fail(w, SM_DEP_REDIS);
    if (r->type == REDIS_REPLY_ERROR) {
        drain_reply_err(w->rc, w->argv[0], key, r);
        freeReplyObject(r);
        return drain_fail(w, SM_DEP_REDIS);
    }
    freeReplyObject(r);
    return CS_OK;
}

/* HDEL ents[from..to) from the queue. */
static int drain_hdel(struct drain_worker *w, size_t from, size_t to)
{
    if (from == to)
        return CS_OK;
    drain_argv_reserve(w, to - from + 2);
    w->argv[0] = "HDEL";
    w->argvlen[0] = 4;
    w->argv[1] = w->qkey;
    w->argvlen[1] = strlen(w->qkey);
    for (size_t i = from; i < to; i++) {
        w->argv[2 + i - from] = w->ents[i].field;
        w->argvlen[2 + i - from] = w->ents[i].flen;
    }
    return drain_redis_argv(w, w->qkey, (int)(to - from + 2));
}

/* Moves ents[from..to) to the dead-letter hash: HSET there first, then HDEL
 * from the queue, so a crash in between leaves a copy, never a loss. */
static int drain_dead(struct drain_worker *w, size_t from, size_t to)
{
    size_t n = to - from;
    if (n == 0)
        return CS_OK;
    char **vals = xcalloc(n, sizeof(*vals));
    int ret = CS_ERR;

    drain_argv_reserve(w, 2 * n + 2);
    w->argv[0] = "HSET";
    w->argvlen[0] = 4;
    w->argv[1] = w->dkey;
    w->argvlen[1] = strlen(w->dkey);
    for (size_t i = 0; i < n; i++) {
        const struct drain_entry *e = &w->ents[from + i];
        size_t rl = strlen(e->dead);
        /* "reason=<why>; value=<orig value>", the value copied byte for byte. */
        vals[i] = xmalloc(rl + e->vlen + 17);
        int hl = snprintf(vals[i], rl + 17, "reason=%s; value=", e->dead);
        memcpy(vals[i] + hl, e->value, e->vlen);
        w->argv[2 + 2 * i] = e->field;
        w->argvlen[2 + 2 * i] = e->flen;
        w->argv[3 + 2 * i] = vals[i];
        w->argvlen[3 + 2 * i] = (size_t)hl + e->vlen;
        if (i < DRAIN_LOG_DEAD_MAX)
            log_warn("shard %d: queue entry '%.*s' moved to %s: %s", w->shard,
                     (int)(e->flen < 80 ? e->flen : 80), e->field, w->dkey, e->dead);
    }
    if (n > DRAIN_LOG_DEAD_MAX)
        log_warn("shard %d: %zu more entries moved to %s", w->shard, n - DRAIN_LOG_DEAD_MAX,
                 w->dkey);
    if (drain_redis_argv(w, w->dkey, (int)(2 * n + 2)) != CS_OK)
        goto out;
    if (drain_hdel(w, from, to) != CS_OK)
        goto out;
    smetrics_add(SM_DEAD, n);
    ret = CS_OK;
out:
    for (size_t i = 0; i < n; i++)
        free(vals[i]);
    free(vals);
    return ret;
}

/* Looks up every activity of the batch; unknown ones become dead letters. */
static int drain_lookup(struct drain_worker *w, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct drain_entry *e = &w->ents[i];
        if (e->dead != NULL)
            continue;
        struct drain_act *a = drain_act_get(w, e->aid);
        if (a == NULL)
            return CS_ERR;
        if (!a->found)
            e->dead = "unknown activity";
    }
    return CS_OK;
}

static int drain_lock_eval(struct rconn *rc, int shard, const char *script, const char *token,
                           int ttl_ms, struct rconn_site *site);

/*
 * Before MySQL hears of a batch, its entries must be held by as many copies
 * as the durability rule asks (rconn_copies()), or a failover could erase
 * grants that are rows already: stock + rows would exceed the total and the
 * user could seize again. A write of our own (the lock renewal) and then
 * WAIT, on the very connection the batch was read on: replication is one
 * ordered stream, so replicas that acknowledge the renewal hold every entry
 * the master held before it. A master cut off from the majority refuses the
 * renewal (CLUSTERDOWN) or falls short on WAIT, and the batch stays queued.
 * CS_OK, or CS_ERR (logged once per outage).
 */
static int drain_fence(struct drain_worker *w)
{
    struct rconn_site site;

    if (w->wait_replicas <= 0)
        return CS_OK;
    int held = drain_lock_eval(w->rc, w->shard, script_lock_renew, w->token, w->lock_ttl_ms, &site);
    if (held < 0)
        return drain_fail(w, SM_DEP_REDIS);
    if (held == 0) {
        rconn_set_err(w->rc, RCONN_ERR_REPLY, w->lkey, "the shard lock was lost");
        return drain_fail(w, SM_DEP_REDIS);
    }
    if (site.conn_id != w->scan_site.conn_id) {
        /* The slot moved between the read and the renewal: the new master's
         * replicas say nothing about what the old one held. */
        rconn_set_err(w->rc, RCONN_ERR_REPLY, w->qkey, "the shard moved under the batch");
        return drain_fail(w, SM_DEP_REDIS);
    }
    int copies = rconn_copies(w->rc, &site, w->wait_replicas);
    if (rconn_wait_at(w->rc, &site, NULL, copies, w->wait_timeout_ms) != CS_OK)
        return drain_fail(w, SM_DEP_REDIS);
    return CS_OK;
}

static int drain_retryable(const struct mconn *mc)
{
    return mc->err == ER_LOCK_DEADLOCK || mc->err == ER_LOCK_WAIT_TIMEOUT ||
           mconn_err_is_conn(mc);
}

/*
 * One batch: n field/value pairs of an HSCAN reply. MySQL first (nothing in
 * Redis changes until the transaction is committed), then the dead letters,
 * then HDEL of what was committed.
 */
static int drain_batch(struct drain_worker *w, redisReply **kv, size_t n, int batch)
{
    uint64_t inserted = 0;
    int ok = CS_ERR;

    drain_parse(w, kv, n);
    /* A deadlock victim, a lock wait timeout or a connection that went stale
     * since the last tick deserves another try before the batch waits a tick. */
    for (int attempt = 1; ok != CS_OK; attempt++) {
        ok = drain_lookup(w, n);
        if (ok != CS_OK && (attempt >= DRAIN_TXN_ATTEMPTS || !drain_retryable(w->mc)))
            return drain_fail(w, SM_DEP_MYSQL);
    }
    if (drain_fence(w) != CS_OK)
        return CS_ERR;
    qsort(w->ents, n, sizeof(*w->ents), drain_entry_cmp);
    size_t good = 0;
    while (good < n && w->ents[good].dead == NULL)
        good++;

    for (int attempt = 1; good > 0; attempt++) {
        if (drain_txn(w, good, &inserted) == CS_OK)
            break;
        if (attempt >= DRAIN_TXN_ATTEMPTS || !drain_retryable(w->mc))
            return drain_fail(w, SM_DEP_MYSQL);
        log_debug("shard %d: retrying the batch: %s", w->shard, w->mc->errstr);
    }
    smetrics_dep_ok(SM_DEP_MYSQL);

    if (drain_dead(w, good, n) != CS_OK || drain_hdel(w, 0, good) != CS_OK)
        return CS_ERR;
    smetrics_dep_ok(SM_DEP_REDIS);
    if (good > 0) {
        smetrics_add(SM_ROWS, inserted);
        smetrics_add(SM_BATCHES, 1);
    }
    log_debug("shard %d: batch of %zu: %" PRIu64 " coupons written, %zu dead letters",
              w->shard, n, inserted, n - good);
    return CS_OK;
}

/* ---- the shard lock ---------------------------------------------------------------------- */

int drain_lock_take(struct rconn *rc, int shard, int ttl_ms, char *token, size_t toklen)
{
    static atomic_ulong seq;
    char lkey[KEYS_MAX], host[64] = "";
    uint64_t rnd = 0;

    keys_sync_lock(lkey, shard);
    if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != (ssize_t)sizeof(rnd))
        rnd = (uint64_t)cs_mono_us();
    gethostname(host, sizeof(host) - 1);
    snprintf(token, toklen, "%.40s:%d:%lu:%016" PRIx64, host, (int)getpid(),
             atomic_fetch_add(&seq, 1), rnd);

    redisReply *r = rconn_command(rc, lkey, "SET %s %s NX PX %d", lkey, token, ttl_ms);
    if (r == NULL)
        return -1;
    int ret = r->type == REDIS_REPLY_STATUS ? 1 : r->type == REDIS_REPLY_NIL ? 0 : -1;
    if (ret < 0)
        drain_reply_err(rc, "SET", lkey, r);
    freeReplyObject(r);
    return ret;
}

/* Runs a compare-and-X script on the lock: 1 done, 0 not ours, -1 error.
 * site (may be NULL) is set to the connection that ran it. */
static int drain_lock_eval(struct rconn *rc, int shard, const char *script, const char *token,
                           int ttl_ms, struct rconn_site *site)
{
    char lkey[KEYS_MAX], ttl[16];

    keys_sync_lock(lkey, shard);
    snprintf(ttl, sizeof(ttl), "%d", ttl_ms);
    const char *argv[] = {"EVAL", script, "1", lkey, token, ttl};
    redisReply *r = rconn_commandv_at(rc, lkey, 6, argv, NULL, site);
    if (r == NULL)
        return -1;
    int ret = r->type == REDIS_REPLY_INTEGER ? r->integer == 1 : -1;
    if (ret < 0)
        drain_reply_err(rc, "EVAL on", lkey, r);
    freeReplyObject(r);
    return ret;
}

int drain_lock_renew(struct rconn *rc, int shard, const char *token, int ttl_ms)
{
    return drain_lock_eval(rc, shard, script_lock_renew, token, ttl_ms, NULL);
}

int drain_lock_release(struct rconn *rc, int shard, const char *token)
{
    return drain_lock_eval(rc, shard, script_lock_release, token, 0, NULL);
}

/* ---- the task ------------------------------------------------------------------------------ */

/* HLEN of the queue, or -1 on error. */
static long long drain_depth(struct drain_worker *w)
{
    redisReply *r = rconn_command(w->rc, w->qkey, "HLEN %s", w->qkey);
    if (r == NULL) {
        drain_fail(w, SM_DEP_REDIS);
        return -1;
    }
    long long n = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (n < 0)
        drain_reply_err(w->rc, "HLEN", w->qkey, r);
    freeReplyObject(r);
    if (n < 0)
        drain_fail(w, SM_DEP_REDIS);
    return n;
}

/* Scans the queue page by page until it is empty; see drain_shard(). */
static enum drain_result drain_loop(struct drain_worker *w, const struct drain_opts *o)
{
    char cursor[24] = "0";
    int64_t deadline = o->budget_ms > 0 ? cs_mono_ms() + o->budget_ms : INT64_MAX;

    for (;;) {
        if (atomic_load(o->stop))
            return DRAIN_STOPPED;
        char count[16];
        snprintf(count, sizeof(count), "%d", o->batch);
        const char *argv[] = {"HSCAN", w->qkey, cursor, "COUNT", count};
        redisReply *r = rconn_commandv_at(w->rc, w->qkey, 5, argv, NULL, &w->scan_site);
        if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[1]->type != REDIS_REPLY_ARRAY) {
            if (r != NULL) {
                drain_reply_err(w->rc, "HSCAN", w->qkey, r);
                freeReplyObject(r);
            }
            drain_fail(w, SM_DEP_REDIS);
            return DRAIN_FAILED;
        }
        snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
        size_t n = r->element[1]->elements / 2;
        /* COUNT is a hint: a small hash comes back whole, so cut it into batches. */
        for (size_t off = 0; off < n; off += (size_t)o->batch) {
            size_t len = n - off < (size_t)o->batch ? n - off : (size_t)o->batch;
            if (off > 0 && atomic_load(o->stop)) {
                freeReplyObject(r);
                return DRAIN_STOPPED;
            }
            if (drain_batch(w, r->element[1]->element + 2 * off, len, o->batch) != CS_OK) {
                freeReplyObject(r);
                return DRAIN_FAILED;
            }
            int held = drain_lock_renew(w->rc, w->shard, w->token, o->lock_ttl_ms);
            if (held != 1) {
                freeReplyObject(r);
                if (held < 0) {
                    drain_fail(w, SM_DEP_REDIS);
                    return DRAIN_FAILED;
                }
                log_warn("shard %d: lost the lock %s; stopping this task", w->shard, w->lkey);
                return DRAIN_LOST_LOCK;
            }
        }
        freeReplyObject(r);
        if (strcmp(cursor, "0") == 0) {
            /* A full scan is done; entries added meanwhile may have been missed. */
            long long left = drain_depth(w);
            if (left < 0)
                return DRAIN_FAILED;
            if (left == 0)
                return DRAIN_EMPTY;
            if (cs_mono_ms() >= deadline)
                return DRAIN_MORE;
        }
    }
}

/*
 * The token of the lock each shard's last task could not release (Redis went
 * away mid-task). A Redis restarted from its AOF brings that lock back, and
 * the next task of this process takes it over by its token instead of
 * waiting out sync.lock_ttl_ms with the shard's coupons unwritten. A shard
 * has one task at a time (main.c skips a shard whose task still runs), and
 * the pool's queue orders one task's writes before the next one's reads.
 */
static char drain_kept[KEYS_SHARDS][DRAIN_TOKEN_MAX];

enum drain_result drain_shard(struct drain_worker *w, int shard, const struct drain_opts *o)
{
    w->shard = shard;
    w->lock_ttl_ms = o->lock_ttl_ms;
    keys_queue(w->qkey, shard);
    keys_dead(w->dkey, shard);
    keys_sync_lock(w->lkey, shard);
    drain_acts_reset(w);

    /* The common tick finds nothing: one HLEN, no lock. */
    long long depth = drain_depth(w);
    if (depth < 0)
        return DRAIN_FAILED;
    smetrics_dep_ok(SM_DEP_REDIS);
    if (depth == 0)
        return DRAIN_EMPTY;

    /* The lock saves duplicate work; correctness never depends on it: two
     * writers of one batch insert each coupon once (UNIQUE key, INSERT
     * IGNORE) and decrement the stock by the rows each actually inserted. */
    int got = drain_lock_take(w->rc, shard, o->lock_ttl_ms, w->token, sizeof(w->token));
    if (got == 0 && drain_kept[shard][0] != '\0') {
        /* Held: perhaps by this process's own earlier task. */
        got = drain_lock_renew(w->rc, shard, drain_kept[shard], o->lock_ttl_ms);
        if (got == 1) {
            snprintf(w->token, sizeof(w->token), "%s", drain_kept[shard]);
            log_info("shard %d: took the lock %s back by its token (Redis kept it)", shard,
                     w->lkey);
        }
    }
    if (got < 0) {
        drain_fail(w, SM_DEP_REDIS);
        return DRAIN_FAILED;
    }
    if (got == 0)
        return DRAIN_BUSY;
    drain_kept[shard][0] = '\0';

    enum drain_result res = drain_loop(w, o);
    /* Without a connection (Redis went away) the lock stays until it
     * expires or the next task takes it back by its token. */
    if (res != DRAIN_LOST_LOCK
        && (w->rc->ctx == NULL || drain_lock_release(w->rc, shard, w->token) < 0)) {
        snprintf(drain_kept[shard], sizeof(drain_kept[shard]), "%s", w->token);
        if (w->rc->ctx != NULL)
            drain_fail(w, SM_DEP_REDIS);
    }
    return res;
}
