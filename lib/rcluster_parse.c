/* rcluster_parse.c - the replies of a Redis Cluster read: MOVED / ASK, the
 * slot map (CLUSTER SHARDS, CLUSTER SLOTS), seed lists, and the replicas of
 * a shard that could be promoted. Pure functions, declared in rcluster.h. */
#include "rcluster.h"
#include "cs.h"

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

static int rc_is_str(const redisReply *r)
{
    return r != NULL && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS);
}

static void rc_add_range(struct rcluster_range **v, size_t *n, size_t *cap, long long from,
                         long long to, const char *host, size_t hostlen, int port)
{
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 16;
        *v = xrealloc(*v, *cap * sizeof(**v));
    }
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
            if (!rc_is_str(k))
                continue;
            if (strcmp(k->str, "port") == 0 && v->type == REDIS_REPLY_INTEGER)
                p = v->integer;
            else if (strcmp(k->str, "ip") == 0 && rc_is_str(v))
                ip = v->str, iplen = v->len;
            else if (strcmp(k->str, "endpoint") == 0 && rc_is_str(v))
                ep = v->str, eplen = v->len;
            else if (strcmp(k->str, "role") == 0 && rc_is_str(v))
                master = strcmp(v->str, "master") == 0;
            else if (strcmp(k->str, "health") == 0 && rc_is_str(v))
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
            if (!rc_is_str(k))
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
            m->type != REDIS_REPLY_ARRAY || m->elements < 2 || !rc_is_str(m->element[0]) ||
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

/* ---- the durability rule's count ------------------------------------------------ */

/* Whether node nd of CLUSTER SHARDS is host:port. */
static int rc_node_is(const redisReply *nd, const char *host, int port)
{
    long long p = 0;
    int named = 0;
    for (size_t j = 0; j + 1 < nd->elements; j += 2) {
        const redisReply *k = nd->element[j], *v = nd->element[j + 1];
        if (!rc_is_str(k))
            continue;
        if (strcmp(k->str, "port") == 0 && v->type == REDIS_REPLY_INTEGER)
            p = v->integer;
        else if ((strcmp(k->str, "ip") == 0 || strcmp(k->str, "endpoint") == 0 ||
                  strcmp(k->str, "hostname") == 0) && rc_is_str(v) && strcmp(v->str, host) == 0)
            named = 1;
    }
    return named && p == port;
}

/* The string field name of a CLUSTER SHARDS node, or "". */
static const char *rc_field(const redisReply *nd, const char *name)
{
    for (size_t j = 0; j + 1 < nd->elements; j += 2)
        if (rc_is_str(nd->element[j]) && strcmp(nd->element[j]->str, name) == 0 &&
            rc_is_str(nd->element[j + 1]))
            return nd->element[j + 1]->str;
    return "";
}

/* A replica the cluster could still promote: not marked failed. */
static int rc_node_standby(const redisReply *nd)
{
    const char *health = rc_field(nd, "health");
    return strcmp(rc_field(nd, "role"), "replica") == 0 &&
           (strcmp(health, "online") == 0 || strcmp(health, "loading") == 0);
}

/*
 * In a CLUSTER SHARDS reply given by host:port itself: the replicas of its
 * shard that are not failed. A replica is marked failed only once a majority
 * of masters agree it is unreachable; then it cannot win an election, so it
 * can never become a second writer of the shard. A replica the master merely
 * cannot reach (it is cut off itself, or the replica is) still counts: WAIT
 * for it fails and the grant is not confirmed. -1 when host:port is not a
 * master in the reply.
 */
int rcluster_parse_standbys(const redisReply *r, const char *host, int port)
{
    if (r == NULL || r->type != REDIS_REPLY_ARRAY)
        return -1;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *sh = r->element[i], *nodes = NULL;
        if (sh->type != REDIS_REPLY_ARRAY)
            return -1;
        for (size_t j = 0; j + 1 < sh->elements; j += 2)
            if (rc_is_str(sh->element[j]) && strcmp(sh->element[j]->str, "nodes") == 0)
                nodes = sh->element[j + 1];
        if (nodes == NULL || nodes->type != REDIS_REPLY_ARRAY)
            return -1;
        int found = 0, master = 0, n = 0;
        for (size_t j = 0; j < nodes->elements; j++) {
            const redisReply *nd = nodes->element[j];
            if (nd->type != REDIS_REPLY_ARRAY)
                return -1;
            if (rc_node_is(nd, host, port)) {
                found = 1;
                master = strcmp(rc_field(nd, "role"), "master") == 0;
            } else if (rc_node_standby(nd)) {
                n++;
            }
        }
        if (found)
            return master ? n : -1;
    }
    return -1;
}
