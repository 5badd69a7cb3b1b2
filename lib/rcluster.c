/* rcluster.c - Redis Cluster slot routing over hiredis' blocking API. */
#include "rcluster.h"
#include "rcluster_int.h"
#include "cs.h"
#include "keys.h"
#include "log.h"
#include "rconn.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The process' own shared block when the caller gives none (coupon-sync). */
static struct rcluster_shared rc_local_shared;

/* ---- nodes --------------------------------------------------------------------------- */

static int rc_node_find(struct rcluster *cl, const char *host, int port)
{
    for (int i = 0; i < cl->nnodes; i++)
        if (cl->nodes[i].port == port && strcmp(cl->nodes[i].host, host) == 0)
            return i;
    return -1;
}

static void rc_node_close(struct rcluster *cl, int i);

/* The node of host:port, added when new; -1 when the table is full of
 * nodes still in use. */
static int rc_node_get(struct rcluster *cl, const char *host, int port)
{
    int i = rc_node_find(cl, host, port);
    if (i >= 0)
        return i;
    if (cl->nnodes == RCLUSTER_MAX_NODES) {
        /* Reuse a node no slot points to and that is not a seed. */
        uint8_t used[RCLUSTER_MAX_NODES] = {0};
        for (int s = 0; s < RCLUSTER_SLOTS; s++)
            if (cl->slot_node[s] != RC_NO_NODE)
                used[cl->slot_node[s]] = 1;
        for (i = 0; i < cl->nnodes; i++)
            if (!used[i] && !cl->nodes[i].seed)
                break;
        if (i == cl->nnodes)
            return -1;
        rc_node_close(cl, i); /* rc->ctx may point at it */
    } else {
        i = cl->nnodes++;
    }
    struct rc_node *nd = &cl->nodes[i];
    memset(nd, 0, sizeof(*nd));
    snprintf(nd->host, sizeof(nd->host), "%s", host);
    nd->port = port;
    nd->copies = -1;
    return i;
}

static void rc_node_close(struct rcluster *cl, int i)
{
    struct rc_node *nd = &cl->nodes[i];
    if (nd->ctx != NULL) {
        if (cl->rc->ctx == nd->ctx)
            cl->rc->ctx = NULL;
        redisFree(nd->ctx);
        nd->ctx = NULL;
    }
}

void rc_node_fail(struct rcluster *cl, int i)
{
    struct rc_node *nd = &cl->nodes[i];
    rc_node_close(cl, i);
    nd->backoff_ms = nd->backoff_ms ? nd->backoff_ms * 2 : 50;
    if (nd->backoff_ms > 2000)
        nd->backoff_ms = 2000;
    nd->retry_at_ms = cs_mono_ms() + nd->backoff_ms;
    cl->need_refresh = 1;
}

redisContext *rc_node_ctx(struct rcluster *cl, int i)
{
    struct rc_node *nd = &cl->nodes[i];
    if (nd->ctx != NULL)
        return nd->ctx;
    if (!cl->rc->opts.no_backoff && nd->retry_at_ms != 0 && cs_mono_ms() < nd->retry_at_ms) {
        rconn_set_err(cl->rc, RCONN_ERR_BACKOFF, nd->host, "waiting to reconnect");
        return NULL;
    }
    nd->ctx = rconn_open(cl->rc, nd->host, nd->port);
    if (nd->ctx == NULL) {
        rc_node_fail(cl, i);
        return NULL;
    }
    nd->conn_id = ++cl->rc->conn_seq;
    nd->armed_ms = cl->rc->opts.command_timeout_ms;
    nd->safe_alone = 0; /* settings are read again on a new connection */
    nd->backoff_ms = 0;
    nd->retry_at_ms = 0;
    return nd->ctx;
}

static struct timeval rc_tv(int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return tv;
}

int64_t rc_deadline(const struct rconn *rc)
{
    int64_t d = cs_mono_ms() + rconn_timeout(rc);
    return rc->deadline_ms != 0 && rc->deadline_ms < d ? rc->deadline_ms : d;
}

int rc_arm(struct rcluster *cl, int i, int64_t deadline)
{
    struct rc_node *nd = &cl->nodes[i];
    int64_t left = deadline - cs_mono_ms();
    int ms = rconn_timeout(cl->rc);
    if (left <= 0) {
        rconn_set_err(cl->rc, RCONN_ERR_DEADLINE, "redis cluster",
                      "the request deadline passed before the command was sent");
        return CS_ERR;
    }
    if (left + RC_ARM_SLACK_MS < ms)
        ms = (int)left;
    /* rconn_set_timeout_range(): a socket already within lo..ms keeps it. */
    int lo = cl->rc->timeout_lo_ms;
    if (ms != nd->armed_ms && !(lo > 0 && nd->armed_ms >= lo && nd->armed_ms <= ms)) {
        redisSetTimeout(nd->ctx, rc_tv(ms));
        nd->armed_ms = ms;
    }
    return CS_OK;
}

struct rcluster *rcluster_new(struct rconn *rc)
{
    struct rcluster *cl = xcalloc(1, sizeof(*cl));
    struct rcluster_range seeds[RCLUSTER_MAX_NODES / 2];
    cl->rc = rc;
    cl->sh = rc->opts.cluster_shared ? rc->opts.cluster_shared : &rc_local_shared;
    memset(cl->slot_node, RC_NO_NODE, sizeof(cl->slot_node));
    cl->seed = (unsigned)getpid() ^ (unsigned)cs_mono_us();
    int n = rcluster_parse_nodes(rc->opts.nodes ? rc->opts.nodes : "", seeds,
                                 (int)CS_ARRAY_LEN(seeds));
    for (int i = 0; i < n; i++) {
        int k = rc_node_get(cl, seeds[i].host, seeds[i].port);
        if (k >= 0)
            cl->nodes[k].seed = 1;
    }
    return cl;
}

static void rc_pipe_reset(struct rcluster *cl)
{
    for (size_t i = 0; i < cl->npipe; i++) {
        redisFreeCommand(cl->pipe[i].cmd);
        if (cl->pipe[i].reply != NULL)
            freeReplyObject(cl->pipe[i].reply);
    }
    cl->npipe = cl->next = 0;
    cl->reading = 0;
}

void rcluster_drop(struct rcluster *cl)
{
    rc_pipe_reset(cl);
    for (int i = 0; i < cl->nnodes; i++)
        rc_node_close(cl, i);
}

void rcluster_drop_ctx(struct rcluster *cl, redisContext *ctx)
{
    for (int i = 0; i < cl->nnodes; i++)
        if (cl->nodes[i].ctx == ctx && ctx != NULL)
            rc_node_fail(cl, i);
}

void rcluster_free(struct rcluster *cl)
{
    if (cl == NULL)
        return;
    rcluster_drop(cl);
    free(cl->pipe);
    free(cl);
}

/* ---- the slot map -------------------------------------------------------------------- */

/* Asks node i for the map: CLUSTER SHARDS, or CLUSTER SLOTS on Redis < 7. */
static int rc_fetch_map(struct rcluster *cl, int i, struct rcluster_range **v, size_t *n,
                        int64_t deadline)
{
    redisContext *c = rc_node_ctx(cl, i);
    if (c == NULL || rc_arm(cl, i, deadline) != CS_OK)
        return CS_ERR;
    for (int shards = 1; shards >= 0; shards--) {
        redisReply *r = redisCommand(c, shards ? "CLUSTER SHARDS" : "CLUSTER SLOTS");
        if (r == NULL) {
            rconn_set_err(cl->rc, RCONN_ERR_IO, "CLUSTER SHARDS failed", c->errstr);
            rc_node_fail(cl, i);
            return CS_ERR;
        }
        if (r->type == REDIS_REPLY_ERROR) {
            rconn_set_err(cl->rc, RCONN_ERR_REPLY, shards ? "CLUSTER SHARDS" : "CLUSTER SLOTS",
                          r->str);
            freeReplyObject(r);
            continue;
        }
        int ok = rcluster_parse_map(r, shards, cl->nodes[i].host, v, n);
        freeReplyObject(r);
        if (ok == CS_OK && *n > 0)
            return CS_OK;
        free(*v);
        *v = NULL;
        rconn_set_err(cl->rc, RCONN_ERR_REPLY, "cluster map", "no slots served");
        return CS_ERR;
    }
    return CS_ERR;
}

/* Installs a fetched map; returns 1 when it differs from the one held. */
static int rc_install_map(struct rcluster *cl, const struct rcluster_range *v, size_t n)
{
    /* Not static: coupon-sync's threads each refresh their own map. */
    uint8_t *map = xmalloc(RCLUSTER_SLOTS);
    memset(map, RC_NO_NODE, RCLUSTER_SLOTS);
    for (size_t k = 0; k < n; k++) {
        int nd = rc_node_get(cl, v[k].host, v[k].port);
        if (nd < 0)
            continue;
        for (int s = v[k].from; s <= v[k].to; s++)
            map[s] = (uint8_t)nd;
    }
    int changed = memcmp(map, cl->slot_node, RCLUSTER_SLOTS) != 0;
    memcpy(cl->slot_node, map, RCLUSTER_SLOTS);
    free(map);
    cl->have_map = 1;
    return changed;
}

/* Refreshes the map from the first node that answers, starting after the
 * last one that failed so a dead master is not asked first; gives up at
 * deadline. */
static int rc_refresh(struct rcluster *cl, int64_t deadline)
{
    int64_t now = cs_mono_ms();
    uint64_t epoch = atomic_load(&cl->sh->epoch);
    cl->refresh_ms = now;
    atomic_store(&cl->sh->refresh_ms, now);
    int start = (int)(rand_r(&cl->seed) % (unsigned)(cl->nnodes ? cl->nnodes : 1));
    for (int k = 0; k < cl->nnodes; k++) {
        int i = (start + k) % cl->nnodes;
        /* A node in its reconnect backoff is skipped, not waited for. */
        if (cl->nodes[i].ctx == NULL && cl->nodes[i].retry_at_ms > now)
            continue;
        if (cs_mono_ms() >= deadline)
            break;
        struct rcluster_range *v = NULL;
        size_t n = 0;
        if (rc_fetch_map(cl, i, &v, &n, deadline) != CS_OK)
            continue;
        int first = !cl->have_map;
        int changed = rc_install_map(cl, v, n);
        free(v);
        atomic_fetch_add_explicit(&cl->sh->refreshes, 1, memory_order_relaxed);
        cl->need_refresh = 0;
        cl->seen_epoch = epoch;
        /* A process' first map is news to no one else. */
        if (changed && !first) {
            cl->seen_epoch = atomic_fetch_add(&cl->sh->epoch, 1) + 1;
            log_info("redis cluster: slot map updated from %s:%d", cl->nodes[i].host,
                     cl->nodes[i].port);
        }
        return CS_OK;
    }
    atomic_fetch_add_explicit(&cl->sh->refresh_failures, 1, memory_order_relaxed);
    log_debug("redis cluster: no node gave a slot map: %s", cl->rc->errstr);
    return CS_ERR;
}

void rc_maybe_refresh(struct rcluster *cl, int64_t deadline)
{
    int64_t now = cs_mono_ms();
    if (cl->have_map && !cl->need_refresh && cl->seen_epoch == atomic_load(&cl->sh->epoch))
        return;
    if (cl->refresh_ms != 0 && now - cl->refresh_ms < RCLUSTER_REFRESH_MIN_MS)
        return;
    if (cl->have_map) {
        int64_t last = atomic_load(&cl->sh->refresh_ms);
        if (now - last < RCLUSTER_NODE_REFRESH_MIN_MS)
            return;
        if (!atomic_compare_exchange_strong(&cl->sh->refresh_ms, &last, now))
            return;
    }
    rc_refresh(cl, deadline);
}

static int rc_any_master(struct rcluster *cl)
{
    for (int s = 0; s < RCLUSTER_SLOTS; s++)
        if (cl->slot_node[s] != RC_NO_NODE)
            return cl->slot_node[s];
    return -1;
}

static unsigned rc_key_slot(const char *key)
{
    return key ? keys_slot(key, strlen(key)) : RCLUSTER_SLOTS;
}

int rc_slot_node(struct rcluster *cl, unsigned slot)
{
    if (slot >= RCLUSTER_SLOTS)
        return rc_any_master(cl);
    return cl->slot_node[slot] == RC_NO_NODE ? -1 : cl->slot_node[slot];
}

const char *rcluster_slot_addr(struct rcluster *cl, unsigned slot)
{
    static __thread char buf[80];
    int i = slot < RCLUSTER_SLOTS ? rc_slot_node(cl, slot) : -1;
    if (i < 0)
        return "";
    snprintf(buf, sizeof(buf), "%s:%d", cl->nodes[i].host, cl->nodes[i].port);
    return buf;
}

/* ---- commands ------------------------------------------------------------------------ */

/* Sleeps a jittered, growing back-off when it ends before the deadline;
 * returns 0 (and does not sleep) when it would not. */
static int rc_backoff(struct rcluster *cl, int attempt, int64_t deadline)
{
    int ms = RC_BACKOFF_MIN_MS << (attempt < 5 ? attempt : 5);
    if (ms > RC_BACKOFF_MAX_MS)
        ms = RC_BACKOFF_MAX_MS;
    ms = ms / 2 + (int)(rand_r(&cl->seed) % (unsigned)(ms / 2 + 1));
    if (cs_mono_ms() + ms >= deadline)
        return 0;
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    return 1;
}

static int rc_err_is(const redisReply *r, const char *prefix)
{
    size_t n = strlen(prefix);
    return r->type == REDIS_REPLY_ERROR && r->len >= n && memcmp(r->str, prefix, n) == 0 &&
           (r->len == n || r->str[n] == ' ');
}

/* Loads s on the node behind c (after ASKING when asking). CS_OK or CS_ERR;
 * on I/O error *io is set. */
static int rc_script_load(struct rconn *rc, redisContext *c, int asking, struct rscript *s,
                          int *io)
{
    redisReply *r;
    *io = 0;
    if (asking && (r = redisCommand(c, "ASKING")) != NULL)
        freeReplyObject(r);
    r = redisCommand(c, "SCRIPT LOAD %b", s->src, s->len);
    if (r == NULL) {
        *io = 1;
        /* A timeout stays a timeout: the breaker's silence rule, not a
         * node found down, decides what a stalled master means. */
        rconn_set_err(rc, rconn_ctx_errno(c), "SCRIPT LOAD failed", c->errstr);
        return CS_ERR;
    }
    int ok = r->type == REDIS_REPLY_STRING && r->len == 40;
    if (ok && s->sha[0] == '\0') {
        memcpy(s->sha, r->str, 40);
        s->sha[40] = '\0';
    }
    if (!ok)
        rconn_set_err(rc, RCONN_ERR_REPLY, "SCRIPT LOAD failed",
                      r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
    freeReplyObject(r);
    return ok ? CS_OK : CS_ERR;
}

/* Sends cmd on node i (ASKING first when asking) and reads its reply. NULL
 * on I/O error, with rc->err set and the node closed. */
static redisReply *rc_send(struct rcluster *cl, int i, int asking, const char *cmd, size_t len)
{
    struct rconn *rc = cl->rc;
    redisContext *c = cl->nodes[i].ctx;
    void *r = NULL;

    rc->ctx = c;
    if ((asking && redisAppendCommand(c, "ASKING") != REDIS_OK) ||
        redisAppendFormattedCommand(c, cmd, len) != REDIS_OK)
        goto io;
    if (asking) {
        if (redisGetReply(c, &r) != REDIS_OK || r == NULL)
            goto io;
        freeReplyObject(r);
        r = NULL;
    }
    if (redisGetReply(c, &r) != REDIS_OK || r == NULL)
        goto io;
    return r;
io:
    rconn_set_err(rc, rconn_ctx_errno(c), "redis command failed", c->errstr);
    rc_node_fail(cl, i);
    return NULL;
}

static void rc_site_set(struct rcluster *cl, struct rconn_site *site, int i)
{
    if (site == NULL)
        return;
    site->node = i;
    site->conn_id = i >= 0 && cl->nodes[i].ctx != NULL ? cl->nodes[i].conn_id : 0;
}

/* rcluster_exec() for a slot (RCLUSTER_SLOTS: any master), until deadline. */
static redisReply *rc_exec_slot(struct rconn *rc, unsigned slot, const char *cmd, size_t len,
                                struct rscript *s, int64_t deadline, struct rconn_site *site)
{
    struct rcluster *cl = rc->cl;
    int ask = -1, redirects = 0, waits = 0;
    uint64_t loaded = 0;       /* nodes this call loaded the script on */

    rc_site_set(cl, site, -1);
    for (;;) {
        /* Every hop, reload and refresh is inside the deadline; what has
         * been sent so far was redirected or refused, so nothing ran. */
        if (cs_mono_ms() >= deadline) {
            rconn_set_err(rc, RCONN_ERR_DEADLINE, "redis cluster",
                          "the request deadline passed before the command was sent");
            return NULL;
        }
        rc_maybe_refresh(cl, deadline);
        int i = ask >= 0 ? ask : rc_slot_node(cl, slot);
        if (i < 0) {
            cl->need_refresh = 1;
            rconn_set_err(rc, RCONN_ERR_CONNECT, "redis cluster", "no node serves the slot");
            if (rc_backoff(cl, waits++, deadline))
                continue;
            return NULL;
        }
        if (rc_node_ctx(cl, i) == NULL) {
            /* Nothing was sent: another node may know where the slot went. */
            if (rc_backoff(cl, waits++, deadline))
                continue;
            return NULL;
        }
        if (rc_arm(cl, i, deadline) != CS_OK)
            return NULL;
        /* Noted before the send: a call that times out still names the
         * node it was written to, so the breaker can ask that node. */
        rc_site_set(cl, site, i);
        redisReply *r = rc_send(cl, i, ask >= 0, cmd, len);
        if (r == NULL)
            return NULL;
        rc->err = RCONN_OK;
        rc->errstr[0] = '\0';
        if (r->type != REDIS_REPLY_ERROR)
            return r;

        struct rcluster_redirect red;
        if (rcluster_parse_redirect(r->str, r->len, &red) == CS_OK) {
            if (++redirects > RCLUSTER_MAX_REDIRECTS)
                return r;
            const char *host = red.host[0] ? red.host : cl->nodes[i].host;
            int to = rc_node_get(cl, host, red.port);
            freeReplyObject(r);
            if (to < 0) {
                rconn_set_err(rc, RCONN_ERR_CONNECT, "redis cluster", "too many nodes");
                return NULL;
            }
            if (red.ask) {
                atomic_fetch_add_explicit(&cl->sh->ask, 1, memory_order_relaxed);
                ask = to;
            } else {
                atomic_fetch_add_explicit(&cl->sh->moved, 1, memory_order_relaxed);
                cl->slot_node[red.slot] = (uint8_t)to;
                cl->need_refresh = 1;
                ask = -1;
            }
            continue;
        }
        if (rc_err_is(r, "TRYAGAIN") || rc_err_is(r, "CLUSTERDOWN") || rc_err_is(r, "LOADING")) {
            /* Nothing ran. A slot mid-migration, a failover, a restart. */
            if (rc_err_is(r, "CLUSTERDOWN"))
                cl->need_refresh = 1;
            if (!rc_backoff(cl, waits++, deadline))
                return r;
            atomic_fetch_add_explicit(&cl->sh->tryagain, 1, memory_order_relaxed);
            freeReplyObject(r);
            continue;
        }
        /* Scripts are not replicated on Redis 7.0: a promoted replica, or
         * the next node after a redirection, may lack it too. */
        if (s != NULL && !(loaded & (1ull << i)) && rc_err_is(r, "NOSCRIPT")) {
            int io;
            loaded |= 1ull << i;
            if (rc_script_load(rc, cl->nodes[i].ctx, ask >= 0, s, &io) != CS_OK) {
                if (io) {
                    rc_node_fail(cl, i);
                    freeReplyObject(r);
                    return NULL;
                }
                return r;
            }
            freeReplyObject(r);
            continue;
        }
        return r;
    }
}

redisReply *rcluster_exec(struct rconn *rc, const char *key, const char *cmd, size_t len,
                          struct rscript *s, struct rconn_site *site)
{
    return rc_exec_slot(rc, rc_key_slot(key), cmd, len, s, rc_deadline(rc), site);
}

/* ---- pipelines ----------------------------------------------------------------------- */

int rcluster_append(struct rconn *rc, const char *key, char *cmd, size_t len)
{
    struct rcluster *cl = rc->cl;
    if (cl->reading)
        rc_pipe_reset(cl); /* the previous pipeline was left unread */
    cl->pipe = cs_grow(cl->pipe, &cl->cap, cl->npipe + 1, sizeof(*cl->pipe));
    struct rc_pipe *p = &cl->pipe[cl->npipe++];
    memset(p, 0, sizeof(*p));
    p->cmd = cmd;
    p->len = len;
    p->slot = rc_key_slot(key);
    p->node = -1;

    /* Only before the first append: a refresh on a node with commands of
     * this pipeline in flight would read their replies as its own. */
    if (cl->npipe == 1) {
        cl->pipe_deadline = rc_deadline(rc);
        rc_maybe_refresh(cl, cl->pipe_deadline);
    }
    int i = rc_slot_node(cl, p->slot);
    /* Unsent commands are sent on their own once the others are read. */
    if (i < 0 || rc_node_ctx(cl, i) == NULL)
        return CS_OK;
    if (redisAppendFormattedCommand(cl->nodes[i].ctx, cmd, len) != REDIS_OK) {
        rc_node_fail(cl, i);
        return CS_OK;
    }
    p->node = i;
    return CS_OK;
}

/* Reads every reply of the pipeline, node by node in append order, then
 * resends on its own each command that was not sent or was redirected. */
static void rc_pipe_collect(struct rcluster *cl)
{
    struct rconn *rc = cl->rc;
    rc->err = RCONN_OK;
    for (size_t k = 0; k < cl->npipe; k++) {
        struct rc_pipe *p = &cl->pipe[k];
        if (p->node < 0)
            continue;
        redisContext *c = cl->nodes[p->node].ctx;
        void *r = NULL;
        if (c == NULL || redisGetReply(c, &r) != REDIS_OK || r == NULL) {
            if (c != NULL) {
                rconn_set_err(rc, rconn_ctx_errno(c), "redisGetReply() failed", c->errstr);
                rc_node_fail(cl, p->node);
            }
            p->failed = 1;
            continue;
        }
        p->reply = r;
    }
    for (size_t k = 0; k < cl->npipe; k++) {
        struct rc_pipe *p = &cl->pipe[k];
        if (p->failed)
            continue;
        if (p->reply != NULL) {
            const redisReply *r = p->reply;
            struct rcluster_redirect red;
            if (r->type != REDIS_REPLY_ERROR ||
                (rcluster_parse_redirect(r->str, r->len, &red) != CS_OK &&
                 !rc_err_is(r, "TRYAGAIN") && !rc_err_is(r, "CLUSTERDOWN") &&
                 !rc_err_is(r, "LOADING")))
                continue;
            freeReplyObject(p->reply);
            p->reply = NULL;
        }
        /* The pipeline's deadline, not a fresh one per resend. */
        p->reply = rc_exec_slot(rc, p->slot, p->cmd, p->len, NULL, cl->pipe_deadline, NULL);
        if (p->reply == NULL)
            p->failed = 1;
    }
    cl->reading = 1;
}

int rcluster_get_reply(struct rconn *rc, redisReply **reply)
{
    struct rcluster *cl = rc->cl;
    *reply = NULL;
    if (!cl->reading)
        rc_pipe_collect(cl);
    if (cl->next >= cl->npipe) {
        rconn_set_err(rc, RCONN_ERR_IO, "redisGetReply()", "no command pending");
        return CS_ERR;
    }
    struct rc_pipe *p = &cl->pipe[cl->next++];
    int ret = CS_OK;
    if (p->failed) {
        if (rc->err == RCONN_OK)
            rconn_set_err(rc, RCONN_ERR_IO, "redisGetReply()", "connection lost");
        ret = CS_ERR;
    } else {
        *reply = p->reply;
        p->reply = NULL;
    }
    if (cl->next == cl->npipe)
        rc_pipe_reset(cl);
    return ret;
}
