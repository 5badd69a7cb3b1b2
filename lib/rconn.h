/* rconn.h - Redis connection wrapper: timeouts, reconnect with backoff,
 * EVALSHA with SCRIPT LOAD on NOSCRIPT, sticky error.
 *
 * One rconn per thread or process; never shared. Every command names the key
 * it routes by, so Redis Cluster slot routing (CRC16 of the {tag}, CLUSTER
 * SLOTS, MOVED/ASK) can be added inside rconn_ctx_for_key() without touching
 * callers. Today all slots map to the single configured node. */
#ifndef CS_RCONN_H
#define CS_RCONN_H

#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>

struct rconn_opts {
    const char *host;
    int port;
    const char *password;      /* empty or NULL: no AUTH */
    int connect_timeout_ms;
    int command_timeout_ms;
    int no_backoff;            /* reconnect on every call (the caller has a breaker) */
};

/* RCONN_ERR_CONNECT and RCONN_ERR_BACKOFF fail before a command is written:
 * Redis certainly did not run it. After IO or TIMEOUT it may have. */
enum rconn_err {
    RCONN_OK = 0,
    RCONN_ERR_IO,
    RCONN_ERR_TIMEOUT,
    RCONN_ERR_REPLY,
    RCONN_ERR_BACKOFF,
    RCONN_ERR_CONNECT,
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

struct rconn {
    redisContext *ctx;
    struct rconn_opts opts;
    int err;                   /* sticky rconn_err of the last failed call */
    int maybe_sent;            /* after rconn_evalsha() returned NULL: 1 when the
                                * EVALSHA may have run (written, reply lost) */
    char errstr[256];
    int64_t retry_at_ms;       /* monotonic; no reconnect attempt before this */
    int backoff_ms;
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
void rconn_free(struct rconn *rc);

/* Connects now if not connected. CS_OK, or CS_ERR with rc->err/errstr set
 * (RCONN_ERR_BACKOFF while waiting out the reconnect backoff). */
int rconn_ensure(struct rconn *rc);

/* Drops the connection; the next command reconnects (after backoff if any). */
void rconn_drop(struct rconn *rc);

/* The connection serving KEY's slot (the seam for Redis Cluster). */
redisContext *rconn_ctx_for_key(struct rconn *rc, const char *key);

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

/* The fault an error reply (REDIS_REPLY_ERROR) names, RCONN_FAULT_ERROR for
 * one it does not know; RCONN_FAULT_NONE for any other reply. */
enum rconn_fault rconn_reply_fault(const redisReply *r);

/* "up", "down", "readonly", "oom", "misconf", "busy", "loading", "error". */
const char *rconn_fault_name(enum rconn_fault f);

/* Loads a script file into *s. CS_ERR with a message in err when unreadable. */
int rscript_load_file(struct rscript *s, const char *path, char *err, size_t errlen);
void rscript_free(struct rscript *s);

/* EVALSHA s with nkeys keys then args (all in argv); on NOSCRIPT loads the
 * script with SCRIPT LOAD and retries once. Returns the reply or NULL as
 * rconn_command(); after NULL, rc->maybe_sent tells whether the EVALSHA
 * was written (so Redis may have run it) or never left this process. */
redisReply *rconn_evalsha(struct rconn *rc, const struct rscript *s, int nkeys, int argc,
                          const char **argv, const size_t *argvlen);

#endif
