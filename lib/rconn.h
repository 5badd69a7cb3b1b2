/* rconn.h - Redis connection wrapper: timeouts, reconnect with backoff,
 * EVALSHA with SCRIPT LOAD on NOSCRIPT, sticky error, WAIT.
 *
 * One rconn per thread or process; never shared. Every command names the key
 * it routes by: on a single Redis every key goes to the one node; with
 * opts.cluster set, rcluster.c routes each command to the master of its key's
 * slot and follows MOVED / ASK there, so callers never know the difference. */
#ifndef CS_RCONN_H
#define CS_RCONN_H

#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>

struct rconn_opts {
    const char *host;
    int port;
    const char *password;      /* empty or NULL: no AUTH */
    const char *source_addr;   /* empty or NULL: the kernel picks the local address */
    int connect_timeout_ms;
    int command_timeout_ms;
    int no_backoff;            /* reconnect on every call (the caller has a breaker) */
    int cluster;               /* route by slot over a Redis Cluster */
    const char *nodes;         /* cluster seeds "host:port,host:port" */
    struct rcluster_shared *cluster_shared; /* node-wide map epoch and counters, or NULL */
};

/* RCONN_ERR_CONNECT, RCONN_ERR_BACKOFF and RCONN_ERR_DEADLINE fail before a
 * command is written: Redis certainly did not run it. After IO or TIMEOUT it
 * may have. */
enum rconn_err {
    RCONN_OK = 0,
    RCONN_ERR_IO,
    RCONN_ERR_TIMEOUT,
    RCONN_ERR_REPLY,
    RCONN_ERR_BACKOFF,
    RCONN_ERR_CONNECT,
    RCONN_ERR_DEADLINE,        /* the request's deadline passed before it was sent */
};

/* Why Redis cannot serve a write now, as far as one call tells. */
enum rconn_fault {
    RCONN_FAULT_NONE = 0,
    RCONN_FAULT_DOWN,          /* no connection, timeout, reset */
    RCONN_FAULT_READONLY,      /* a replica (READONLY) */
    RCONN_FAULT_OOM,           /* maxmemory reached under noeviction */
    RCONN_FAULT_MISCONF,       /* cannot persist: writes refused */
    RCONN_FAULT_BUSY,          /* a script or function runs too long */
    RCONN_FAULT_LOADING,       /* loading its data set */
    RCONN_FAULT_ERROR,         /* any other error reply */
    RCONN_FAULT__COUNT
};

struct rcluster;
struct rcluster_shared;

/* Where a command ran: the connection that carried it (and on a cluster the
 * node). A WAIT for that command's write must run on this connection and no
 * other: rconn_wait_at() fails when it is gone. conn_id 0: nowhere. */
struct rconn_site {
    uint64_t conn_id;
    int node;                  /* cluster node index; -1 on a single Redis */
};

struct rconn {
    redisContext *ctx;         /* single Redis: the connection; cluster: the node
                                  connection last used (NULL after it failed) */
    struct rcluster *cl;       /* routing state when opts.cluster */
    struct rconn_opts opts;
    int err;                   /* sticky rconn_err of the last failed call */
    int maybe_sent;            /* after rconn_evalsha() returned NULL: 1 when the
                                * EVALSHA may have run (written, reply lost) */
    char errstr[256];
    int64_t retry_at_ms;       /* monotonic; no reconnect attempt before this */
    int backoff_ms;
    int64_t deadline_ms;       /* monotonic request deadline; 0: none (see
                                  rconn_set_deadline()) */
    uint64_t conn_seq;         /* id of the latest connection opened */
    uint64_t conn_id;          /* single Redis: id of ctx */
    int timeout_ms;            /* read timeout of the next commands; 0: opts'
                                * command_timeout_ms (rconn_set_timeout()) */
    int timeout_lo_ms;         /* a socket already at lo..timeout_ms is left so */
    const redisContext *tmo_ctx; /* the socket whose timeout was last set, */
    int tmo_ms;                /* and to what: a repeat costs no system call */
};

/* A Lua script loaded from a file: source and its SHA1 as Redis computes it. */
struct rscript {
    char *src;
    size_t len;
    char sha[41];
};

struct cs_conf;

/* Fills *o from the [redis] keys of conf, with the given command timeout
 * (the workers use redis.command_timeout_ms, coupon-sync its own). */
void rconn_opts_from_conf(struct rconn_opts *o, const struct cs_conf *conf,
                          int command_timeout_ms);

/* Creates an unconnected rconn; the first command connects. Copies opts' strings. */
struct rconn *rconn_new(const struct rconn_opts *opts);
/* rconn_new() with rconn_opts_from_conf(conf, command_timeout_ms): coupon-sync's
 * connections, and a worker's for work that moves more than a seize may wait
 * for (preheat, the activity list, a revoke: sync.redis_timeout_ms). */
struct rconn *rconn_new_conf(const struct cs_conf *conf, int command_timeout_ms);
void rconn_free(struct rconn *rc);

/* Connects now if not connected (a cluster: always CS_OK, its nodes are
 * connected when used). CS_OK, or CS_ERR with rc->err/errstr set
 * (RCONN_ERR_BACKOFF while waiting out the reconnect backoff). */
int rconn_ensure(struct rconn *rc);

/* Drops the connection(s); the next command reconnects (after backoff if any). */
void rconn_drop(struct rconn *rc);

/* Sets the sticky error: err and "what: why". */
void rconn_set_err(struct rconn *rc, int err, const char *what, const char *why);

/* Opens a connection to host:port with rc's timeouts and password. NULL with
 * rc->err set on failure. The caller owns the context (redisFree). */
redisContext *rconn_open(struct rconn *rc, const char *host, int port);

/* Sets the read timeout of the commands that follow (until set again) to
 * ms; 0 goes back to opts.command_timeout_ms. Costs nothing until a command
 * is sent; a socket is only touched when its timeout must change. On a
 * cluster it also bounds a command's redirections and back-offs, and the
 * request deadline (rconn_set_deadline()) still cuts it. */
void rconn_set_timeout(struct rconn *rc, int ms);

/* As rconn_set_timeout(rc, hi_ms), but a socket whose timeout already lies
 * in lo_ms..hi_ms keeps it: a deadline that moves by a few ms from one call
 * to the next then costs no system call. */
void rconn_set_timeout_range(struct rconn *rc, int lo_ms, int hi_ms);

/* The read timeout the next command gets, in ms. */
int rconn_timeout(const struct rconn *rc);

/* Puts the timeout of rconn_set_timeout() on c (a connection of rc) before
 * a command is sent on it, cut to the request deadline when that is nearer
 * (single Redis; the cluster layer arms its node connections itself). */
void rconn_apply_timeout(struct rconn *rc, redisContext *c);

/* The rconn_err of a failed hiredis context (a read timeout shows as EAGAIN). */
int rconn_ctx_errno(const redisContext *c);

/* The connection serving KEY's slot on a single Redis. On a cluster, commands
 * go through rcluster_exec() instead and this returns the last used one. */
redisContext *rconn_ctx_for_key(struct rconn *rc, const char *key);

/* Sets the request deadline (monotonic ms, 0 clears it): no command is sent
 * and no WAIT waits past it, whatever redirections, reloads or refreshes a
 * cluster asks for. Each command is also bounded by rconn_timeout(). */
void rconn_set_deadline(struct rconn *rc, int64_t deadline_ms);

/* Runs one command routed by KEY (may be NULL for keyless commands). Returns
 * the reply (caller frees with freeReplyObject) or NULL on I/O error or
 * timeout, with rc->err set and the connection dropped. An error reply
 * (REDIS_REPLY_ERROR) is returned as a reply, not treated as a failure. */
redisReply *rconn_command(struct rconn *rc, const char *key, const char *fmt, ...);
redisReply *rconn_commandv(struct rconn *rc, const char *key, int argc, const char **argv,
                           const size_t *argvlen);

/* Pipelining: append N commands, then read N replies with rconn_get_reply().
 * An append error or a read error drops the connection (CS_ERR). */
int rconn_append(struct rconn *rc, const char *key, const char *fmt, ...);
int rconn_appendv(struct rconn *rc, const char *key, int argc, const char **argv,
                  const size_t *argvlen);
int rconn_get_reply(struct rconn *rc, redisReply **reply);

/* Checks reply R of command CMD on KEY, as rconn_command() returned it: CS_OK
 * when R is of type TYPE (0: of any type but an error), and the caller frees
 * it. Otherwise frees R and returns CS_ERR with "CMD KEY: why" in err, why
 * being rc->errstr (R is NULL), Redis' error reply or "unexpected reply". */
int rconn_expect(struct rconn *rc, redisReply *r, int type, const char *cmd, const char *key,
                 char *err, size_t errlen);

/* One step of HSCAN KEY from cursor[size] with COUNT count, and MATCH
 * pattern unless match is NULL: moves cursor on ("0" when the scan is done)
 * and returns the [cursor, fields] reply (caller frees), or NULL with
 * "HSCAN KEY: why" in err as rconn_expect(). */
redisReply *rconn_hscan(struct rconn *rc, const char *key, char *cursor, size_t size,
                        const char *match, int count, char *err, size_t errlen);

/* The fault an error reply (REDIS_REPLY_ERROR) names, RCONN_FAULT_ERROR for
 * one it does not know; RCONN_FAULT_NONE for any other reply. */
enum rconn_fault rconn_reply_fault(const redisReply *r);

/* "up", "down", "readonly", "oom", "misconf", "busy", "loading", "error". */
const char *rconn_fault_name(enum rconn_fault f);

/* 1 for a bulk or status string reply, 0 otherwise (NULL too). */
int rconn_reply_is_str(const redisReply *r);

/* The milliseconds of a TIME reply (seconds, microseconds, as bulk or status
 * strings); -1 for a reply that is not one (NULL, an error). */
int64_t rconn_time_ms(const redisReply *t);

/* The integer in bulk-string reply r, or dflt (nil, empty, not a string). */
int64_t rconn_reply_int(const redisReply *r, int64_t dflt);
/* The ids (cs_parse_id()) among the string elements of array reply r, in a
 * malloc'd array the caller frees; their count in *n. */
int64_t *rconn_reply_ids(const redisReply *r, size_t *n);
/* HGET key field, read as an integer: CS_OK with *v (dflt when the field
 * is not there), CS_ERR when Redis did not answer or answered anything else. */
int rconn_hget_int(struct rconn *rc, const char *key, const char *field, int64_t dflt,
                   int64_t *v);

/* Sets *s to a copy of the script text (rscript_free() frees it). */
void rscript_from_text(struct rscript *s, const char *text);
void rscript_free(struct rscript *s);

/* The most keys + args an EVALSHA takes (argc of rconn_evalsha()). */
#define RCONN_EVAL_ARGS 1040

/* EVALSHA s with nkeys keys then args (all in argv, at most RCONN_EVAL_ARGS);
 * on NOSCRIPT loads the script with SCRIPT LOAD and retries once. Returns the reply or NULL as
 * rconn_command(); after NULL, rc->maybe_sent tells whether the EVALSHA
 * was written (so Redis may have run it) or never left this process. */
redisReply *rconn_evalsha(struct rconn *rc, const struct rscript *s, int nkeys, int argc,
                          const char **argv, const size_t *argvlen);

/* rconn_evalsha() that also tells where the answer came from: *site is the
 * connection that answered (conn_id 0 when none did). */
redisReply *rconn_evalsha_at(struct rconn *rc, const struct rscript *s, int nkeys, int argc,
                             const char **argv, const size_t *argvlen,
                             struct rconn_site *site);

/* rconn_commandv() that fills *site as rconn_evalsha_at(). */
redisReply *rconn_commandv_at(struct rconn *rc, const char *key, int argc, const char **argv,
                              const size_t *argvlen, struct rconn_site *site);

/*
 * The durability rule: how many replicas a write that ran at site must reach
 * before it is safe, when `wanted` are asked for. On a single Redis, wanted.
 * On a cluster, the replicas of the master's shard that the cluster could
 * still promote in its place (its own CLUSTER NODES, less those a majority
 * marked failed AND silent past rcluster_stale_ms()), at most wanted; 0 when
 * none is left: it then stands on its own AOF. A replica the master merely
 * cannot reach still counts, so a master cut off from the majority never
 * confirms a grant. A node that does not persist every write (appendonly
 * yes, appendfsync always, read with CONFIG GET on each new connection),
 * refuses CONFIG or CLUSTER NODES, or cannot be asked now counts wanted:
 * the rule never relaxes on a guess. Cached per node for
 * RCLUSTER_REPL_CHECK_MS. Never fails.
 */
int rconn_copies(struct rconn *rc, const struct rconn_site *site, int wanted);

/* WAIT on the connection of site for `replicas` (0: CS_OK at once) within
 * timeout_ms, cut to the request deadline. With fence_key set, a write to
 * fence_key (INCR) goes first on that connection, for when the command at
 * site wrote nothing (a resend that found the grant already made): the WAIT
 * then covers everything the node held before it. CS_OK when enough
 * acknowledged; else CS_ERR with rc->errstr saying how many did
 * (RCONN_ERR_REPLY for a shortfall, also when site's connection is gone:
 * nothing can be confirmed; RCONN_ERR_DEADLINE when the request deadline
 * left no time to send it: a slow answer, not a shortfall; IO/TIMEOUT when
 * the connection failed, which drops it). */
int rconn_wait_at(struct rconn *rc, const struct rconn_site *site, const char *fence_key,
                  int replicas, int timeout_ms);

/* Whether the Redis a call at site went to (a single Redis: the one) answers
 * a PING on a new connection, made and answered within timeout_ms: is it
 * there at all, when a call on the usual connection got no answer. The
 * connection is closed again; rc's usual connection and its last error are
 * left as they were. 0 when site names no cluster node. */
int rconn_ping_fresh(struct rconn *rc, const struct rconn_site *site, int timeout_ms);


#endif
