/* rcluster_copies.c - the durability rule on a cluster: how many replicas
 * of a master could take over, read from its settings and CLUSTER NODES;
 * the sites (node and connection) a grant's WAIT goes to; and the masters
 * walked for health. */
#include "rcluster_int.h"
#include "cs.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* CONFIG GET name on node i: its reply (the caller frees it), or NULL after
 * the connection failed (dropped). */
static redisReply *rc_config_get(struct rcluster *cl, int i, const char *name)
{
    struct rc_node *nd = &cl->nodes[i];
    redisReply *r = redisCommand(nd->ctx, "CONFIG GET %s", name);
    if (r == NULL) {
        rconn_set_err(cl->rc, rconn_ctx_errno(nd->ctx), "CONFIG GET failed", nd->ctx->errstr);
        rc_node_fail(cl, i);
    }
    return r;
}

/* The value in a CONFIG GET reply, or NULL (refused, or no such setting). */
static const char *rc_config_value(const redisReply *r)
{
    return r->type == REDIS_REPLY_ARRAY && r->elements == 2 && rconn_reply_is_str(r->element[1])
               ? r->element[1]->str
               : NULL;
}

/* CONFIG GET name on node i as a number: 1 with it in *v, -1 when it is
 * refused or not a number, 0 when the connection failed. */
static int rc_config_num(struct rcluster *cl, int i, const char *name, long long *v)
{
    redisReply *r = rc_config_get(cl, i, name);
    if (r == NULL)
        return 0;
    const char *s = rc_config_value(r);
    char *end = NULL;
    int ok = s != NULL && (*v = strtoll(s, &end, 10), end != s && *end == '\0');
    freeReplyObject(r);
    return ok ? 1 : -1;
}

/* 1 when node i (connected) persists each write before answering
 * (appendonly yes, appendfsync always), so a master of it may stand on its
 * own AOF; -1 when it does not or CONFIG GET is refused; 0 when the
 * connection failed (asked again later). */
static int rc_node_safe_alone(struct rcluster *cl, int i)
{
    static const struct {
        const char *name, *want;
    } need[] = {{"appendonly", "yes"}, {"appendfsync", "always"}};
    struct rc_node *nd = &cl->nodes[i];

    for (size_t k = 0; k < CS_ARRAY_LEN(need); k++) {
        redisReply *r = rc_config_get(cl, i, need[k].name);
        if (r == NULL)
            return 0;
        const char *v = rc_config_value(r);
        int ok = v != NULL && strcmp(v, need[k].want) == 0;
        if (!ok)
            log_warn("redis cluster: %s:%d: %s is not %s (or CONFIG GET is refused: %s); its "
                     "grants wait for redis.wait_replicas replicas even when none is left",
                     nd->host, nd->port, need[k].name, need[k].want,
                     r->type == REDIS_REPLY_ERROR ? r->str : "no error");
        freeReplyObject(r);
        if (!ok)
            return -1;
    }
    /* Not a safety matter, but the outage the rule exists to avoid: such a
     * master refuses every write (NOREPLICAS) once its replicas are gone. */
    long long v;
    int got = rc_config_num(cl, i, "min-replicas-to-write", &v);
    if (got == 0)
        return 0;
    if (got > 0 && v != 0)
        log_warn("redis cluster: %s:%d has min-replicas-to-write %lld: once its replicas are "
                 "lost it refuses every grant", nd->host, nd->port, v);
    /* How long a failed replica stays promotable (rcluster_parse_copies()). */
    long long nt, factor, ping, rto, stale = -1;
    if ((got = rc_config_num(cl, i, "cluster-node-timeout", &nt)) > 0 &&
        (got = rc_config_num(cl, i, "cluster-replica-validity-factor", &factor)) > 0 &&
        (got = rc_config_num(cl, i, "repl-ping-replica-period", &ping)) > 0 &&
        (got = rc_config_num(cl, i, "repl-timeout", &rto)) > 0)
        stale = rcluster_stale_ms(nt, factor, ping, rto);
    if (got == 0)
        return 0;
    if (stale < 0) {
        cl->stale_unbounded = 1;
        log_warn("redis cluster: %s:%d: cluster-replica-validity-factor is 0 (or unreadable): "
                 "a replica of any age may be promoted, so grants wait for a failed replica "
                 "until it is forgotten", nd->host, nd->port);
    } else if (stale > cl->stale_max) {
        cl->stale_max = stale;
    }
    return 1;
}

/* The replicas of node i that could take over (rcluster_parse_copies()),
 * read from its CLUSTER NODES and its clock in one round trip; -1 unknown. */
static int rc_node_copies_read(struct rcluster *cl, int i)
{
    struct rc_node *nd = &cl->nodes[i];
    redisReply *nodes = NULL, *t = NULL;
    int n = -1;

    if (redisAppendCommand(nd->ctx, "CLUSTER NODES") != REDIS_OK ||
        redisAppendCommand(nd->ctx, "TIME") != REDIS_OK ||
        redisGetReply(nd->ctx, (void **)&nodes) != REDIS_OK ||
        redisGetReply(nd->ctx, (void **)&t) != REDIS_OK) {
        rconn_set_err(cl->rc, rconn_ctx_errno(nd->ctx), "CLUSTER NODES failed", nd->ctx->errstr);
        if (nodes != NULL)
            freeReplyObject(nodes);
        rc_node_fail(cl, i);
        return -1;
    }
    int64_t now_ms = rconn_time_ms(t);
    if (rconn_reply_is_str(nodes) && now_ms >= 0)
        n = rcluster_parse_copies(nodes->str, now_ms, cl->stale_unbounded ? -1 : cl->stale_max);
    freeReplyObject(nodes);
    freeReplyObject(t);
    return n;
}

/* The replicas a grant on node i waits for under the durability rule:
 * min(wanted, its replicas that could take over), wanted when they cannot be
 * counted. */
static int rc_node_copies(struct rcluster *cl, int i, int wanted)
{
    struct rc_node *nd = &cl->nodes[i];
    int64_t now = cs_mono_ms();

    if (wanted <= 0)
        return 0;
    if (nd->copies_ms == 0 || now - nd->copies_ms >= RCLUSTER_REPL_CHECK_MS) {
        if (rc_node_ctx(cl, i) == NULL || rc_arm(cl, i, rc_deadline(cl->rc)) != CS_OK)
            return wanted;
        if (nd->safe_alone == 0)
            nd->safe_alone = rc_node_safe_alone(cl, i);
        if (nd->ctx == NULL)
            return wanted;
        nd->copies = -1;
        if (nd->safe_alone > 0)
            nd->copies = rc_node_copies_read(cl, i);
        if (nd->ctx == NULL)
            return wanted;
        nd->copies_ms = now;
    }
    return nd->copies < 0 || nd->copies > wanted ? wanted : nd->copies;
}

redisContext *rcluster_site_ctx(struct rcluster *cl, const struct rconn_site *site)
{
    if (site == NULL || site->conn_id == 0 || site->node < 0 || site->node >= cl->nnodes)
        return NULL;
    const struct rc_node *nd = &cl->nodes[site->node];
    return nd->ctx != NULL && nd->conn_id == site->conn_id ? nd->ctx : NULL;
}

int rcluster_site_addr(const struct rcluster *cl, const struct rconn_site *site, char *host,
                       size_t hostlen, int *port)
{
    if (site == NULL || site->node < 0 || site->node >= cl->nnodes)
        return CS_ERR;
    snprintf(host, hostlen, "%s", cl->nodes[site->node].host);
    *port = cl->nodes[site->node].port;
    return CS_OK;
}

void rcluster_slot_site(struct rcluster *cl, unsigned slot, struct rconn_site *site,
                        int64_t deadline)
{
    /* A follower may have sent nothing since the failover that its leader
     * saw: asking the old master would take a live shard for a dead one. */
    rc_maybe_refresh(cl, deadline);
    site->conn_id = 0;
    site->node = slot < RCLUSTER_SLOTS ? rc_slot_node(cl, slot) : -1;
}

void rcluster_site_fail(struct rcluster *cl, const struct rconn_site *site)
{
    if (rcluster_site_ctx(cl, site) != NULL)
        rc_node_fail(cl, site->node);
}

void rcluster_site_disarm(struct rcluster *cl, const struct rconn_site *site)
{
    if (rcluster_site_ctx(cl, site) != NULL)
        cl->nodes[site->node].armed_ms = 0;
}

int rcluster_copies(struct rcluster *cl, const struct rconn_site *site, int wanted)
{
    if (wanted <= 0)
        return 0;
    if (rcluster_site_ctx(cl, site) == NULL)
        return wanted;
    return rc_node_copies(cl, site->node, wanted);
}

int rcluster_slot_copies(struct rconn *rc, unsigned slot, int wanted)
{
    struct rcluster *cl = rc->cl;
    rc_maybe_refresh(cl, rc_deadline(rc));
    int i = slot < RCLUSTER_SLOTS ? rc_slot_node(cl, slot) : -1;
    if (i < 0 || rc_node_ctx(cl, i) == NULL)
        return -1;
    return rc_node_copies(cl, i, wanted);
}

/* ---- masters ------------------------------------------------------------------------- */

int rcluster_each_master(struct rconn *rc, int wanted,
                         void (*fn)(void *arg, const char *addr, int up, int copies),
                         void *arg)
{
    struct rcluster *cl = rc->cl;
    uint8_t seen[RCLUSTER_MAX_NODES] = {0};
    int n = 0;

    rc_maybe_refresh(cl, rc_deadline(rc));
    for (int s = 0; s < RCLUSTER_SLOTS; s++) {
        int i = cl->slot_node[s];
        if (i == RC_NO_NODE || seen[i])
            continue;
        seen[i] = 1;
        n++;
        int up = 0;
        redisContext *c = rc_node_ctx(cl, i);
        if (c != NULL && rc_arm(cl, i, rc_deadline(rc)) == CS_OK) {
            redisReply *r = redisCommand(c, "PING");
            if (r == NULL)
                rc_node_fail(cl, i);
            else {
                up = r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0;
                freeReplyObject(r);
            }
        }
        char addr[80];
        snprintf(addr, sizeof(addr), "%s:%d", cl->nodes[i].host, cl->nodes[i].port);
        fn(arg, addr, up, up ? rc_node_copies(cl, i, wanted) : -1);
    }
    return n;
}
