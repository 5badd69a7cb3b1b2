/* rcluster.h - Redis Cluster routing on plain hiredis, behind rconn: the slot
 * map (CLUSTER SHARDS, CLUSTER SLOTS before Redis 7), one lazily opened
 * connection per node, MOVED / ASK / TRYAGAIN / CLUSTERDOWN / LOADING /
 * NOSCRIPT handling, and pipelines whose commands go to their slots' nodes.
 *
 * An rcluster belongs to one rconn (one thread or process, never shared).
 * Node-wide facts (the map epoch, the refresh throttle, counters) live in a
 * struct rcluster_shared that every process of a node maps. */
#ifndef CS_RCLUSTER_H
#define CS_RCLUSTER_H

#include <hiredis/hiredis.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define RCLUSTER_SLOTS 16384
#define RCLUSTER_MAX_NODES 64
#define RCLUSTER_MAX_REDIRECTS 5
/* No process refreshes its map more often than this. */
#define RCLUSTER_REFRESH_MIN_MS 1000
/* Nor does the node as a whole, except a process that has no map at all. */
#define RCLUSTER_NODE_REFRESH_MIN_MS 100
/* A master's healthy replicas are counted anew (INFO replication) at most
 * this often per process. */
#define RCLUSTER_REPL_CHECK_MS 500
/* Shards whose copies are reported in rcluster_shared (the ten tags). */
#define RCLUSTER_SHARDS 16

/* Node-wide part, in the shared-memory segment (or process memory for
 * coupon-sync, whose threads share it). Lock-free atomics only. */
struct rcluster_shared {
    _Atomic uint64_t epoch;          /* bumped when a refresh finds the map changed */
    _Atomic int64_t refresh_ms;      /* cs_mono_ms() of the latest refresh on the node */
    _Atomic uint64_t moved;          /* MOVED redirections followed */
    _Atomic uint64_t ask;            /* ASK redirections followed */
    _Atomic uint64_t tryagain;       /* TRYAGAIN / CLUSTERDOWN / LOADING retries */
    _Atomic uint64_t refreshes;      /* slot-map refreshes done */
    _Atomic uint64_t refresh_failures;
    _Atomic uint64_t wait_shortfalls; /* WAIT saw fewer replicas than asked */
    /* Per shard, as the latest grant or health check saw its master: the
     * replicas a grant waits for (the durability rule), -1 never seen. */
    _Atomic int32_t shard_copies[RCLUSTER_SHARDS];
    _Atomic int32_t copies_wanted;    /* redis.wait_replicas of the workers */
};

/* One contiguous slot range and the master serving it. */
struct rcluster_range {
    int from, to;                    /* inclusive */
    char host[64];
    int port;
};

/* A redirection error reply. */
struct rcluster_redirect {
    int ask;                         /* 1 ASK, 0 MOVED */
    int slot;
    char host[64];                   /* empty: the node that answered */
    int port;
};

struct rconn;
struct rconn_site;
struct rscript;
struct rcluster;

/* Parses "MOVED 3999 127.0.0.1:6381" / "ASK 3999 host:port" (IPv6 hosts have
 * colons: the port follows the last one). CS_OK, or CS_ERR when str is no
 * redirection. */
int rcluster_parse_redirect(const char *str, size_t len, struct rcluster_redirect *out);

/* Parses a CLUSTER SHARDS reply (shards = 1) or a CLUSTER SLOTS reply
 * (shards = 0) into the ranges served by masters. An empty host in the reply
 * (the node does not know its own address) becomes self_host. On CS_OK *out
 * is an xmalloc'ed array of *n ranges (caller frees); CS_ERR on a reply of
 * another shape. */
int rcluster_parse_map(const redisReply *r, int shards, const char *self_host,
                       struct rcluster_range **out, size_t *n);

/* Parses "host:port,host:port" (seed list as rconn_opts carries it). Returns
 * the number of seeds written to out (at most max), or -1 when one is not
 * host:port with a port 1..65535. */
int rcluster_parse_nodes(const char *list, struct rcluster_range *out, int max);

/* Creates the routing state of rc (rc->opts.cluster set, rc->opts.nodes the
 * seeds). Nothing is connected until the first command. */
struct rcluster *rcluster_new(struct rconn *rc);
void rcluster_free(struct rcluster *cl);

/* Closes every node connection (the next command reconnects). */
void rcluster_drop(struct rcluster *cl);

/* Drops the node connection ctx, one of ours, after an I/O error on it. */
void rcluster_drop_ctx(struct rcluster *cl, redisContext *ctx);

/* Sends the formatted command cmd[0..len) to the master of key's slot (any
 * master when key is NULL) and follows redirections within its deadline
 * (rc->opts.command_timeout_ms from now, or the request deadline when that
 * is nearer: no hop, reload or refresh runs past it). With s set, a NOSCRIPT
 * answer loads s on the node that gave it (once per node) and resends.
 * Returns the reply (the caller frees it; an error reply such as a TRYAGAIN
 * that outlived the deadline is a reply) or NULL with rc->err set when the
 * command may or may not have run (I/O error, timeout) or could not be sent
 * (RCONN_ERR_CONNECT, _BACKOFF, _DEADLINE). When site is not NULL it is set
 * to the connection that answered (conn_id 0 when none did). */
redisReply *rcluster_exec(struct rconn *rc, const char *key, const char *cmd, size_t len,
                          struct rscript *s, struct rconn_site *site);

/* The live connection of site, or NULL when it was closed or replaced since. */
redisContext *rcluster_site_ctx(struct rcluster *cl, const struct rconn_site *site);

/* Drops site's connection after an I/O error on it. */
void rcluster_site_fail(struct rcluster *cl, const struct rconn_site *site);

/* Forgets the receive timeout of site's connection, set outside the cluster
 * layer (a WAIT's): the next command there sets its own. */
void rcluster_site_disarm(struct rcluster *cl, const struct rconn_site *site);

/* How long (ms, by the master's clock) a replica flagged failed must have
 * been silent before Redis cannot promote it any more: its data is then
 * older than cluster-node-timeout x cluster-replica-validity-factor +
 * repl-ping-replica-period allows, counted from when it noticed its link
 * down (up to repl-timeout later): node timeout x (factor + 2) + (ping
 * period + repl-timeout + 3) s. -1 when no age stops it (factor 0) or a
 * setting is out of range. */
long long rcluster_stale_ms(long long node_timeout_ms, long long validity_factor,
                            long long ping_period_s, long long repl_timeout_s);

/* In the CLUSTER NODES text of a master (its "myself,master" line), read
 * at now_ms by its clock: its replicas that could be promoted in its place,
 * every one but those flagged "fail" and silent for more than stale_ms
 * (stale_ms < 0: every one). -1 when the text is not a master's. */
int rcluster_parse_copies(const char *text, long long now_ms, long long stale_ms);

/* The durability rule on a cluster (see rconn_copies()): the replicas of
 * site's node that could take over, at most wanted. */
int rcluster_copies(struct rcluster *cl, const struct rconn_site *site, int wanted);

/* Pipelining: rcluster_append() queues a formatted command (takes ownership
 * of cmd, a redisFormatCommand() buffer) on its slot's node; rcluster_get_reply()
 * hands the replies back in the order of the appends. A redirected command of
 * the pipeline is resent on its own once every node's replies are in. */
int rcluster_append(struct rconn *rc, const char *key, char *cmd, size_t len);
int rcluster_get_reply(struct rconn *rc, redisReply **reply);

/* Calls fn for each master of the current map (refreshing it first when
 * due): its "host:port", a PING verdict (1 answered PONG) and its replica
 * count under the durability rule for `wanted` (rcluster_copies(); -1 when
 * it is down). Returns the number of masters. */
int rcluster_each_master(struct rconn *rc, int wanted,
                         void (*fn)(void *arg, const char *addr, int up, int copies),
                         void *arg);

/* The replicas a grant on slot's master waits for under the durability rule
 * (see rcluster_copies()); -1 when no node serves the slot or it is down. */
int rcluster_slot_copies(struct rconn *rc, unsigned slot, int wanted);

/* Into *site: the node the slot map names for slot, with no connection of
 * its own (rcluster_site_ctx() answers NULL for it); only its address is
 * for use, by a caller that sent nothing there itself. The map is brought
 * up to date first when another process of the node saw it change (a
 * failover), within deadline (monotonic ms). */
void rcluster_slot_site(struct rcluster *cl, unsigned slot, struct rconn_site *site,
                        int64_t deadline);

/* The address of the node a call at site went to, into host (hostlen bytes)
 * and *port; CS_ERR when site names no node. */
int rcluster_site_addr(const struct rcluster *cl, const struct rconn_site *site, char *host,
                       size_t hostlen, int *port);

/* "host:port" of the master serving slot, or "" when unknown. */
const char *rcluster_slot_addr(struct rcluster *cl, unsigned slot);

#endif
