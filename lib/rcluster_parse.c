/* rcluster_parse.c - the replies of a Redis Cluster read: MOVED / ASK, the
 * slot map (CLUSTER SHARDS, CLUSTER SLOTS), seed lists, and the replicas of
 * a shard that could be promoted. Pure functions, declared in rcluster.h. */
#include "rcluster.h"
#include "cs.h"
#include "rconn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- parsing ------------------------------------------------------------------------- */

/* Splits "host:port" at its last colon. */
static int rc_split_addr(const char *s, size_t len, char *host, size_t hostlen, int *port)
{
    const char *colon = NULL;
    for (size_t i = 0; i < len; i++)
        if (s[i] == ':')
            colon = s + i;
    if (colon == NULL || (size_t)(colon - s) >= hostlen)
        return CS_ERR;
    const char *p = colon + 1, *end = s + len;
    long v = 0;
    if (p == end)
        return CS_ERR;
    for (; p < end; p++) {
        if (*p < '0' || *p > '9' || v > 65535)
            return CS_ERR;
        v = v * 10 + (*p - '0');
    }
    if (v < 1 || v > 65535)
        return CS_ERR;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    *port = (int)v;
    return CS_OK;
}

int rcluster_parse_redirect(const char *str, size_t len, struct rcluster_redirect *out)
{
    memset(out, 0, sizeof(*out));
    if (len > 6 && memcmp(str, "MOVED ", 6) == 0) {
        str += 6;
        len -= 6;
    } else if (len > 4 && memcmp(str, "ASK ", 4) == 0) {
        out->ask = 1;
        str += 4;
        len -= 4;
    } else {
        return CS_ERR;
    }
    size_t i = 0;
    int slot = 0;
    for (; i < len && str[i] >= '0' && str[i] <= '9' && i < 6; i++)
        slot = slot * 10 + (str[i] - '0');
    if (i == 0 || i >= len || str[i] != ' ' || slot >= RCLUSTER_SLOTS)
        return CS_ERR;
    out->slot = slot;
    return rc_split_addr(str + i + 1, len - i - 1, out->host, sizeof(out->host), &out->port);
}

static void rc_add_range(struct rcluster_range **v, size_t *n, size_t *cap, long long from,
                         long long to, const char *host, size_t hostlen, int port)
{
    *v = cs_grow(*v, cap, *n + 1, sizeof(**v));
    struct rcluster_range *g = &(*v)[(*n)++];
    g->from = (int)from;
    g->to = (int)to;
    if (hostlen >= sizeof(g->host))
        hostlen = sizeof(g->host) - 1;
    memcpy(g->host, host, hostlen);
    g->host[hostlen] = '\0';
    g->port = port;
}

/* The master of one CLUSTER SHARDS entry whose health is "online" (or not
 * given): its address, or CS_ERR. The "endpoint" is the address clients
 * are meant to use; "ip" when it is unknown ("?" or empty). */
static int rc_shard_master(const redisReply *nodes, const char *self_host, const char **host,
                           size_t *hostlen, int *port)
{
    for (size_t i = 0; i < nodes->elements; i++) {
        const redisReply *nd = nodes->element[i];
        const char *ip = NULL, *ep = NULL;
        size_t iplen = 0, eplen = 0;
        long long p = 0;
        int master = 0, failed = 0;
        if (nd->type != REDIS_REPLY_ARRAY)
            return CS_ERR;
        for (size_t j = 0; j + 1 < nd->elements; j += 2) {
            const redisReply *k = nd->element[j], *v = nd->element[j + 1];
            if (!rconn_reply_is_str(k))
                continue;
            if (strcmp(k->str, "port") == 0 && v->type == REDIS_REPLY_INTEGER)
                p = v->integer;
            else if (strcmp(k->str, "ip") == 0 && rconn_reply_is_str(v))
                ip = v->str, iplen = v->len;
            else if (strcmp(k->str, "endpoint") == 0 && rconn_reply_is_str(v))
                ep = v->str, eplen = v->len;
            else if (strcmp(k->str, "role") == 0 && rconn_reply_is_str(v))
                master = strcmp(v->str, "master") == 0;
            else if (strcmp(k->str, "health") == 0 && rconn_reply_is_str(v))
                failed = strcmp(v->str, "online") != 0;
        }
        /* Redis 7.2 groups by shard id: a failed old master may be listed
         * beside the promoted one. Only a healthy master serves. */
        if (!master || failed)
            continue;
        if (ep != NULL && eplen > 0 && strcmp(ep, "?") != 0)
            *host = ep, *hostlen = eplen;
        else if (ip != NULL && iplen > 0)
            *host = ip, *hostlen = iplen;
        else
            *host = self_host, *hostlen = strlen(self_host);
        if (p < 1 || p > 65535)
            return CS_ERR;
        *port = (int)p;
        return CS_OK;
    }
    return CS_ERR;
}

static int rc_parse_shards(const redisReply *r, const char *self_host, struct rcluster_range **v,
                           size_t *n, size_t *cap)
{
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *sh = r->element[i], *slots = NULL, *nodes = NULL;
        if (sh->type != REDIS_REPLY_ARRAY)
            return CS_ERR;
        for (size_t j = 0; j + 1 < sh->elements; j += 2) {
            const redisReply *k = sh->element[j];
            if (!rconn_reply_is_str(k))
                continue;
            if (strcmp(k->str, "slots") == 0)
                slots = sh->element[j + 1];
            else if (strcmp(k->str, "nodes") == 0)
                nodes = sh->element[j + 1];
        }
        if (slots == NULL || nodes == NULL || slots->type != REDIS_REPLY_ARRAY ||
            nodes->type != REDIS_REPLY_ARRAY || slots->elements % 2 != 0)
            return CS_ERR;
        if (slots->elements == 0)
            continue; /* a master without slots serves nothing */
        const char *host;
        size_t hostlen;
        int port;
        /* A shard whose master is unknown (mid-failover) is left out: its
         * slots stay unmapped until the next refresh. */
        if (rc_shard_master(nodes, self_host, &host, &hostlen, &port) != CS_OK)
            continue;
        for (size_t j = 0; j < slots->elements; j += 2) {
            const redisReply *a = slots->element[j], *b = slots->element[j + 1];
            if (a->type != REDIS_REPLY_INTEGER || b->type != REDIS_REPLY_INTEGER ||
                a->integer < 0 || b->integer >= RCLUSTER_SLOTS || a->integer > b->integer)
                return CS_ERR;
            rc_add_range(v, n, cap, a->integer, b->integer, host, hostlen, port);
        }
    }
    return CS_OK;
}

static int rc_parse_slots(const redisReply *r, const char *self_host, struct rcluster_range **v,
                          size_t *n, size_t *cap)
{
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3)
            return CS_ERR;
        const redisReply *a = e->element[0], *b = e->element[1], *m = e->element[2];
        if (a->type != REDIS_REPLY_INTEGER || b->type != REDIS_REPLY_INTEGER ||
            a->integer < 0 || b->integer >= RCLUSTER_SLOTS || a->integer > b->integer ||
            m->type != REDIS_REPLY_ARRAY || m->elements < 2 || !rconn_reply_is_str(m->element[0]) ||
            m->element[1]->type != REDIS_REPLY_INTEGER || m->element[1]->integer < 1 ||
            m->element[1]->integer > 65535)
            return CS_ERR;
        const char *host = m->element[0]->str;
        size_t hostlen = m->element[0]->len;
        if (hostlen == 0 || strcmp(host, "?") == 0)
            host = self_host, hostlen = strlen(self_host);
        rc_add_range(v, n, cap, a->integer, b->integer, host, hostlen,
                     (int)m->element[1]->integer);
    }
    return CS_OK;
}

int rcluster_parse_map(const redisReply *r, int shards, const char *self_host,
                       struct rcluster_range **out, size_t *n)
{
    struct rcluster_range *v = NULL;
    size_t cap = 0;
    *out = NULL;
    *n = 0;
    if (r == NULL || r->type != REDIS_REPLY_ARRAY)
        return CS_ERR;
    int rc = shards ? rc_parse_shards(r, self_host, &v, n, &cap)
                    : rc_parse_slots(r, self_host, &v, n, &cap);
    if (rc != CS_OK) {
        free(v);
        *n = 0;
        return CS_ERR;
    }
    *out = v;
    return CS_OK;
}

int rcluster_parse_nodes(const char *list, struct rcluster_range *out, int max)
{
    int n = 0;
    const char *p = list;
    while (*p != '\0') {
        size_t len = strcspn(p, ",");
        if (len > 0) {
            if (n == max)
                return -1;
            memset(&out[n], 0, sizeof(out[n]));
            if (rc_split_addr(p, len, out[n].host, sizeof(out[n].host), &out[n].port) != CS_OK ||
                out[n].host[0] == '\0')
                return -1;
            n++;
        }
        p += len;
        if (*p == ',')
            p++;
    }
    return n;
}

/* ---- the durability rule's count: replicas that could take over ---------------------- */

/*
 * Redis (clusterHandleSlaveFailover()) lets a replica fail over while its
 * data age, less one node timeout, is at most node timeout x factor + ping
 * period. The age runs from its last byte from the master while its link is
 * up, but from the moment it noticed the link down once it is not
 * (repl_down_since): on a silent cut, up to repl-timeout + 2 s (its once a
 * second cron, whole seconds) after that last byte. The master's last pong
 * from the replica may be half a node timeout older than that byte (a node
 * is pinged at least every node timeout / 2), and the age is counted in
 * whole seconds: one node timeout and one second more cover both.
 */
long long rcluster_stale_ms(long long node_timeout_ms, long long validity_factor,
                            long long ping_period_s, long long repl_timeout_s)
{
    /* Factor 0: a replica of any age may be promoted. */
    if (validity_factor <= 0 || validity_factor > 1000000 || node_timeout_ms < 0 ||
        node_timeout_ms > 86400000LL || ping_period_s < 0 || ping_period_s > 86400 ||
        repl_timeout_s < 0 || repl_timeout_s > 86400)
        return -1;
    return node_timeout_ms * (validity_factor + 2) + (ping_period_s + repl_timeout_s + 3) * 1000;
}

/* One line of CLUSTER NODES, split at its spaces (fields 0..7; the slots
 * after them are not needed). */
struct rc_nodes_line {
    const char *f[8];
    size_t len[8];
};

/* Splits the line [s, end) into its first eight fields; CS_ERR when it has
 * fewer. */
static int rc_nodes_split(const char *s, const char *end, struct rc_nodes_line *l)
{
    int n = 0;
    while (s < end && n < 8) {
        while (s < end && *s == ' ')
            s++;
        const char *b = s;
        while (s < end && *s != ' ')
            s++;
        if (s > b) {
            l->f[n] = b;
            l->len[n] = (size_t)(s - b);
            n++;
        }
    }
    return n == 8 ? CS_OK : CS_ERR;
}

/* 1 when the comma-separated flags of l hold flag exactly ("fail", not
 * "fail?"). */
static int rc_nodes_flag(const struct rc_nodes_line *l, const char *flag)
{
    size_t fl = strlen(flag);
    const char *p = l->f[2], *end = l->f[2] + l->len[2];
    while (p < end) {
        const char *c = memchr(p, ',', (size_t)(end - p));
        size_t n = (size_t)((c != NULL ? c : end) - p);
        if (n == fl && memcmp(p, flag, fl) == 0)
            return 1;
        p += n + 1;
    }
    return 0;
}

/* Field i of l, a time in ms; 0 when it is none ("0") or not a number. */
static int64_t rc_nodes_ms(const struct rc_nodes_line *l, int i)
{
    int64_t v;
    return cs_parse_id(l->f[i], l->len[i], &v) == CS_OK ? v : 0;
}

/* The next line of CLUSTER NODES at *s (before end) with its eight fields
 * in *l, *s moved past it; 0 when there is none left. */
static int rc_nodes_next(const char **s, const char *end, struct rc_nodes_line *l)
{
    while (*s < end) {
        const char *nl = memchr(*s, '\n', (size_t)(end - *s));
        const char *le = nl != NULL ? nl : end;
        if (le > *s && le[-1] == '\r')
            le--;
        int ok = le > *s && rc_nodes_split(*s, le, l) == CS_OK;
        *s = nl != NULL ? nl + 1 : end;
        if (ok)
            return 1;
    }
    return 0;
}

/*
 * In the CLUSTER NODES text of a master (the line flagged "myself,master"):
 * its replicas that could still be promoted in its place. A replica stops
 * counting only when it cannot win an election any more: flagged "fail" by
 * the cluster AND not heard of (its last pong, else its oldest unanswered
 * ping) for longer than stale_ms by the master's clock now_ms, past which its
 * data is too old for Redis to let it fail over (rcluster_stale_ms()). A
 * replica marked failed a moment ago still could: cut off from this master
 * but not from the others, it is promoted once the master fails in turn,
 * and what it missed meanwhile is lost. stale_ms < 0: every replica counts.
 * -1 when the text holds no "myself,master" line or cannot be read.
 */
int rcluster_parse_copies(const char *text, long long now_ms, long long stale_ms)
{
    struct rc_nodes_line l;
    const char *s, *end, *my_id = NULL;
    size_t my_len = 0;
    int n = 0;

    if (text == NULL)
        return -1;
    end = text + strlen(text);
    for (s = text; my_id == NULL && rc_nodes_next(&s, end, &l);) {
        if (!rc_nodes_flag(&l, "myself"))
            continue;
        if (!rc_nodes_flag(&l, "master"))
            return -1;
        my_id = l.f[0];
        my_len = l.len[0];
    }
    if (my_id == NULL)
        return -1;
    for (s = text; rc_nodes_next(&s, end, &l);) {
        if (l.len[3] != my_len || memcmp(l.f[3], my_id, my_len) != 0 ||
            !(rc_nodes_flag(&l, "slave") || rc_nodes_flag(&l, "replica")))
            continue;
        if (stale_ms >= 0 && rc_nodes_flag(&l, "fail")) {
            int64_t pong = rc_nodes_ms(&l, 5), heard = pong > 0 ? pong : rc_nodes_ms(&l, 4);
            if (heard > 0 && now_ms - heard > stale_ms)
                continue; /* too stale to be promoted */
        }
        n++;
    }
    return n;
}
