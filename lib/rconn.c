/* rconn.c - Redis connection wrapper over hiredis' blocking API. */
#include "rconn.h"
#include "conf.h"
#include "rcluster.h"
#include "cs.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define RCONN_BACKOFF_MIN_MS 50
#define RCONN_BACKOFF_MAX_MS 2000

static struct timeval ms_to_tv(int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return tv;
}

void rconn_opts_from_conf(struct rconn_opts *o, const struct cs_conf *conf,
                          int command_timeout_ms)
{
    memset(o, 0, sizeof(*o));
    o->host = conf->redis_host;
    o->port = conf->redis_port;
    o->password = conf->redis_password;
    o->source_addr = conf->redis_source_addr;
    o->connect_timeout_ms = conf->redis_connect_timeout_ms;
    o->command_timeout_ms = command_timeout_ms;
    o->cluster = conf->redis_cluster;
    o->nodes = conf->redis_nodes;
}

struct rconn *rconn_new_conf(const struct cs_conf *conf, int command_timeout_ms)
{
    struct rconn_opts ro;
    rconn_opts_from_conf(&ro, conf, command_timeout_ms);
    return rconn_new(&ro);
}

struct rconn *rconn_new(const struct rconn_opts *opts)
{
    struct rconn *rc = xcalloc(1, sizeof(*rc));
    rc->opts = *opts;
    rc->opts.host = xstrdup(opts->host ? opts->host : "127.0.0.1");
    rc->opts.password = xstrdup(opts->password ? opts->password : "");
    rc->opts.source_addr = xstrdup(opts->source_addr ? opts->source_addr : "");
    rc->opts.nodes = xstrdup(opts->nodes ? opts->nodes : "");
    if (rc->opts.cluster)
        rc->cl = rcluster_new(rc);
    return rc;
}

void rconn_free(struct rconn *rc)
{
    if (rc == NULL)
        return;
    rconn_drop(rc);
    rcluster_free(rc->cl);
    free((char *)rc->opts.nodes);
    free((char *)rc->opts.host);
    free((char *)rc->opts.password);
    free((char *)rc->opts.source_addr);
    free(rc);
}

void rconn_set_err(struct rconn *rc, int err, const char *what, const char *why)
{
    rc->err = err;
    snprintf(rc->errstr, sizeof(rc->errstr), "%.64s: %.180s", what, why);
}

int rconn_ctx_errno(const redisContext *c)
{
    if (c->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ETIMEDOUT))
        return RCONN_ERR_TIMEOUT;
    if (strstr(c->errstr, "timed out") != NULL || strstr(c->errstr, "Resource temporarily") != NULL)
        return RCONN_ERR_TIMEOUT;
    return RCONN_ERR_IO;
}

void rconn_drop(struct rconn *rc)
{
    if (rc->cl != NULL) {
        rcluster_drop(rc->cl);
        rc->ctx = NULL;
        return;
    }
    if (rc->ctx != NULL) {
        redisFree(rc->ctx);
        rc->ctx = NULL;
    }
}

/* After a failure the next connect waits a growing backoff, so a dead Redis
 * costs each request a clock read rather than a connect timeout. */
static void rconn_fail(struct rconn *rc)
{
    if (rc->cl != NULL) {
        rcluster_drop_ctx(rc->cl, rc->ctx);
        rc->ctx = NULL;
        return;
    }
    rconn_drop(rc);
    rc->backoff_ms = rc->backoff_ms ? rc->backoff_ms * 2 : RCONN_BACKOFF_MIN_MS;
    if (rc->backoff_ms > RCONN_BACKOFF_MAX_MS)
        rc->backoff_ms = RCONN_BACKOFF_MAX_MS;
    rc->retry_at_ms = cs_mono_ms() + rc->backoff_ms;
}

void rconn_set_timeout(struct rconn *rc, int ms)
{
    rc->timeout_ms = ms > 0 ? ms : 0;
    rc->timeout_lo_ms = 0;
}

void rconn_set_timeout_range(struct rconn *rc, int lo_ms, int hi_ms)
{
    rconn_set_timeout(rc, hi_ms);
    rc->timeout_lo_ms = lo_ms > 0 && lo_ms <= hi_ms ? lo_ms : 0;
}

int rconn_timeout(const struct rconn *rc)
{
    return rc->timeout_ms > 0 ? rc->timeout_ms : rc->opts.command_timeout_ms;
}

void rconn_apply_timeout(struct rconn *rc, redisContext *c)
{
    int ms = rconn_timeout(rc);
    /* The request deadline cuts it (not by a few ms: no system call for
     * that); a command sent past the deadline keeps the whole timeout. */
    if (rc->deadline_ms != 0) {
        int64_t left = rc->deadline_ms - cs_mono_ms();
        if (left > 0 && left + 10 < ms)
            ms = (int)left;
    }
    if (c == NULL || (c == rc->tmo_ctx && ms == rc->tmo_ms))
        return;
    if (c == rc->tmo_ctx && rc->timeout_lo_ms > 0 && rc->tmo_ms >= rc->timeout_lo_ms
        && rc->tmo_ms <= ms)
        return;
    redisSetTimeout(c, ms_to_tv(ms));
    rc->tmo_ctx = c;
    rc->tmo_ms = ms;
}

/* A blocking context connected from source_addr within timeout_ms, or one
 * with err set, or NULL when out of memory. hiredis 0.14 binds a source
 * address only on a non-blocking connect, so this waits for the connect
 * itself and then turns the socket blocking as redisConnect would leave it. */
static redisContext *connect_bound(const char *host, int port, const char *source_addr,
                                   int timeout_ms)
{
    redisContext *c = redisConnectBindNonBlock(host, port, source_addr);
    if (c == NULL || c->err)
        return c;
    struct pollfd pfd = {.fd = c->fd, .events = POLLOUT};
    int n;
    do
        n = poll(&pfd, 1, timeout_ms);
    while (n < 0 && errno == EINTR);
    int soerr = 0;
    socklen_t len = sizeof(soerr);
    if (n == 0)
        soerr = ETIMEDOUT;
    else if (n < 0)
        soerr = errno;
    else if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0)
        soerr = errno;
    if (soerr == 0) {
        int fl = fcntl(c->fd, F_GETFL);
        if (fl < 0 || fcntl(c->fd, F_SETFL, fl & ~O_NONBLOCK) < 0)
            soerr = errno;
    }
    if (soerr != 0) {
        c->err = REDIS_ERR_IO;
        snprintf(c->errstr, sizeof(c->errstr), "connect from %s: %s", source_addr,
                 strerror(soerr));
        return c;
    }
    c->flags |= REDIS_BLOCK;
    return c;
}

redisContext *rconn_open(struct rconn *rc, const char *host, int port)
{
    redisContext *c;
    /* A node with its own address leaves from it, so a firewall rule can
     * tell its connections from those of the other nodes on the host. */
    if (rc->opts.source_addr[0] != '\0')
        c = connect_bound(host, port, rc->opts.source_addr, rc->opts.connect_timeout_ms);
    else
        c = redisConnectWithTimeout(host, port, ms_to_tv(rc->opts.connect_timeout_ms));
    if (c == NULL) {
        rconn_set_err(rc, RCONN_ERR_CONNECT, "redisConnect()", "cannot allocate context");
        return NULL;
    }
    if (c->err) {
        rconn_set_err(rc, RCONN_ERR_CONNECT, "redisConnect() failed", c->errstr);
        redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, ms_to_tv(rc->opts.command_timeout_ms));
    /* A new context may reuse a freed one's address: what its socket has
     * is what was just set. */
    rc->tmo_ctx = c;
    rc->tmo_ms = rc->opts.command_timeout_ms;
    if (rc->opts.password[0] != '\0') {
        redisReply *r = redisCommand(c, "AUTH %s", rc->opts.password);
        if (r == NULL || r->type == REDIS_REPLY_ERROR) {
            /* The reply text never contains the password. */
            rconn_set_err(rc, RCONN_ERR_CONNECT, "AUTH failed", r ? r->str : c->errstr);
            if (r)
                freeReplyObject(r);
            redisFree(c);
            return NULL;
        }
        freeReplyObject(r);
    }
    return c;
}

int rconn_ping_fresh(struct rconn *rc, const struct rconn_site *site, int timeout_ms)
{
    char host[256];
    int port = rc->opts.port;

    if (rc->cl != NULL) {
        if (rcluster_site_addr(rc->cl, site, host, sizeof(host), &port) != CS_OK)
            return 0;
    } else {
        snprintf(host, sizeof(host), "%s", rc->opts.host);
    }
    int err = rc->err;
    char errstr[sizeof(rc->errstr)];
    memcpy(errstr, rc->errstr, sizeof(errstr));
    const redisContext *tmo_ctx = rc->tmo_ctx;
    int tmo_ms = rc->tmo_ms, connect_ms = rc->opts.connect_timeout_ms;
    int command_ms = rc->opts.command_timeout_ms;

    /* The AUTH inside rconn_open() waits by the probe's timeout too. */
    rc->opts.connect_timeout_ms = timeout_ms;
    rc->opts.command_timeout_ms = timeout_ms;
    redisContext *c = rconn_open(rc, host, port);
    rc->opts.connect_timeout_ms = connect_ms;
    rc->opts.command_timeout_ms = command_ms;
    int alive = 0;
    if (c != NULL) {
        redisSetTimeout(c, ms_to_tv(timeout_ms));
        redisReply *r = redisCommand(c, "PING");
        alive = r != NULL; /* any answer, even an error: it is there */
        if (r != NULL)
            freeReplyObject(r);
        redisFree(c);
    }
    rc->tmo_ctx = tmo_ctx;
    rc->tmo_ms = tmo_ms;
    rc->err = err;
    memcpy(rc->errstr, errstr, sizeof(errstr));
    return alive;
}

int rconn_ensure(struct rconn *rc)
{
    /* A cluster connects to each node when a command first needs it. */
    if (rc->ctx != NULL || rc->cl != NULL)
        return CS_OK;
    if (!rc->opts.no_backoff && rc->retry_at_ms != 0 && cs_mono_ms() < rc->retry_at_ms) {
        if (rc->err == RCONN_OK)
            rconn_set_err(rc, RCONN_ERR_BACKOFF, "redis", "waiting to reconnect");
        else
            rc->err = RCONN_ERR_BACKOFF;
        return CS_ERR;
    }

    rc->ctx = rconn_open(rc, rc->opts.host, rc->opts.port);
    if (rc->ctx == NULL) {
        rconn_fail(rc);
        return CS_ERR;
    }
    rc->conn_id = ++rc->conn_seq;
    rc->err = RCONN_OK;
    rc->errstr[0] = '\0';
    rc->backoff_ms = 0;
    rc->retry_at_ms = 0;
    return CS_OK;
}

redisContext *rconn_ctx_for_key(struct rconn *rc, const char *key)
{
    (void)key; /* one node serves every slot; a cluster routes in rcluster_exec() */
    if (rconn_ensure(rc) != CS_OK)
        return NULL;
    return rc->ctx;
}

static redisReply *rconn_check(struct rconn *rc, redisReply *r, const char *what)
{
    if (r == NULL) {
        rconn_set_err(rc, rc->ctx ? rconn_ctx_errno(rc->ctx) : RCONN_ERR_IO, what,
                      rc->ctx ? rc->ctx->errstr : "no connection");
        rconn_fail(rc);
        return NULL;
    }
    return r;
}

void rconn_set_deadline(struct rconn *rc, int64_t deadline_ms)
{
    rc->deadline_ms = deadline_ms;
}

/*
 * The one funnel of every command (as hiredis' redisCommand() is append and
 * read): cmd, len as redisFormatCommand*() made them (len < 0: they could
 * not), sent to the node of key and its reply read; cmd is freed here. s
 * for NOSCRIPT handling on a cluster (may be NULL); the node that answered
 * in *site (may be NULL).
 */
static redisReply *rconn_exec(struct rconn *rc, const char *key, char *cmd, int len,
                              struct rscript *s, struct rconn_site *site)
{
    redisReply *r = NULL;

    if (site != NULL) {
        site->conn_id = 0;
        site->node = -1;
    }
    if (len < 0) {
        rconn_set_err(rc, RCONN_ERR_REPLY, "redisFormatCommand()", "cannot format");
        return NULL;
    }
    if (rc->cl != NULL) {
        r = rcluster_exec(rc, key, cmd, (size_t)len, s, site);
    } else {
        redisContext *c = rconn_ctx_for_key(rc, key);
        if (c != NULL) {
            void *reply = NULL;
            rconn_apply_timeout(rc, c);
            if (redisAppendFormattedCommand(c, cmd, (size_t)len) == REDIS_OK)
                (void)redisGetReply(c, &reply);
            r = rconn_check(rc, reply, "redis command failed");
            if (r != NULL && site != NULL)
                site->conn_id = rc->conn_id;
        }
    }
    redisFreeCommand(cmd);
    return r;
}

/* The one funnel of every append: as rconn_exec(), the reply left to
 * rconn_get_reply(). A cluster keeps cmd with its pipeline. */
static int rconn_append_cmd(struct rconn *rc, const char *key, char *cmd, int len)
{
    if (len < 0) {
        rconn_set_err(rc, RCONN_ERR_REPLY, "redisFormatCommand()", "cannot format");
        return CS_ERR;
    }
    if (rc->cl != NULL)
        return rcluster_append(rc, key, cmd, (size_t)len);
    redisContext *c = rconn_ctx_for_key(rc, key);
    int ok = c != NULL;
    if (ok) {
        rconn_apply_timeout(rc, c);
        ok = redisAppendFormattedCommand(c, cmd, (size_t)len) == REDIS_OK;
        if (!ok) {
            rconn_set_err(rc, RCONN_ERR_IO, "redisAppendCommand() failed", c->errstr);
            rconn_fail(rc);
        }
    }
    redisFreeCommand(cmd);
    return ok ? CS_OK : CS_ERR;
}

redisReply *rconn_command(struct rconn *rc, const char *key, const char *fmt, ...)
{
    char *cmd = NULL;
    va_list ap;
    va_start(ap, fmt);
    int len = redisvFormatCommand(&cmd, fmt, ap);
    va_end(ap);
    return rconn_exec(rc, key, cmd, len, NULL, NULL);
}

/* rconn_commandv_at() with s for NOSCRIPT handling on a cluster. */
static redisReply *rconn_argv_at(struct rconn *rc, const char *key, int argc,
                                 const char **argv, const size_t *argvlen, struct rscript *s,
                                 struct rconn_site *site)
{
    char *cmd = NULL;
    int len = redisFormatCommandArgv(&cmd, argc, argv, argvlen);
    return rconn_exec(rc, key, cmd, len, s, site);
}

redisReply *rconn_commandv(struct rconn *rc, const char *key, int argc, const char **argv,
                           const size_t *argvlen)
{
    return rconn_argv_at(rc, key, argc, argv, argvlen, NULL, NULL);
}

redisReply *rconn_commandv_at(struct rconn *rc, const char *key, int argc, const char **argv,
                              const size_t *argvlen, struct rconn_site *site)
{
    return rconn_argv_at(rc, key, argc, argv, argvlen, NULL, site);
}

int rconn_append(struct rconn *rc, const char *key, const char *fmt, ...)
{
    char *cmd = NULL;
    va_list ap;
    va_start(ap, fmt);
    int len = redisvFormatCommand(&cmd, fmt, ap);
    va_end(ap);
    return rconn_append_cmd(rc, key, cmd, len);
}

int rconn_appendv(struct rconn *rc, const char *key, int argc, const char **argv,
                  const size_t *argvlen)
{
    char *cmd = NULL;
    int len = redisFormatCommandArgv(&cmd, argc, argv, argvlen);
    return rconn_append_cmd(rc, key, cmd, len);
}

int rconn_get_reply(struct rconn *rc, redisReply **reply)
{
    void *r = NULL;
    if (rc->cl != NULL)
        return rcluster_get_reply(rc, reply);
    *reply = NULL;
    if (rc->ctx == NULL) {
        rconn_set_err(rc, RCONN_ERR_IO, "redisGetReply()", "no connection");
        return CS_ERR;
    }
    if (redisGetReply(rc->ctx, &r) != REDIS_OK || r == NULL) {
        rconn_check(rc, NULL, "redisGetReply() failed");
        return CS_ERR;
    }
    *reply = r;
    return CS_OK;
}

int rconn_expect(struct rconn *rc, redisReply *r, int type, const char *cmd, const char *key,
                 char *err, size_t errlen)
{
    const char *why;

    if (r == NULL)
        why = rc->errstr;
    else if (r->type == REDIS_REPLY_ERROR)
        why = r->str;
    else if (type == 0 || r->type == type)
        return CS_OK;
    else
        why = "unexpected reply";
    snprintf(err, errlen, "%s %s: %s", cmd, key, why);
    if (r != NULL)
        freeReplyObject(r);
    return CS_ERR;
}

redisReply *rconn_hscan(struct rconn *rc, const char *key, char *cursor, size_t size,
                        const char *match, int count, char *err, size_t errlen)
{
    redisReply *r;

    if (match != NULL)
        r = rconn_command(rc, key, "HSCAN %s %s MATCH %s COUNT %d", key, cursor, match, count);
    else
        r = rconn_command(rc, key, "HSCAN %s %s COUNT %d", key, cursor, count);
    if (rconn_expect(rc, r, REDIS_REPLY_ARRAY, "HSCAN", key, err, errlen) != CS_OK)
        return NULL;
    if (r->elements != 2) {
        snprintf(err, errlen, "HSCAN %s: unexpected reply", key);
        freeReplyObject(r);
        return NULL;
    }
    snprintf(cursor, size, "%s", r->element[0]->str);
    return r;
}

int rconn_reply_is_str(const redisReply *r)
{
    return r != NULL && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS);
}

int64_t rconn_reply_int(const redisReply *r, int64_t dflt)
{
    if (r != NULL && r->type == REDIS_REPLY_STRING && r->len > 0)
        return strtoll(r->str, NULL, 10);
    return dflt;
}

int64_t rconn_time_ms(const redisReply *t)
{
    if (t == NULL || t->type != REDIS_REPLY_ARRAY || t->elements != 2
        || !rconn_reply_is_str(t->element[0]) || !rconn_reply_is_str(t->element[1]))
        return -1;
    return strtoll(t->element[0]->str, NULL, 10) * 1000
           + strtoll(t->element[1]->str, NULL, 10) / 1000;
}

enum rconn_fault rconn_reply_fault(const redisReply *r)
{
    static const struct {
        const char *prefix;
        enum rconn_fault fault;
    } known[] = {
        {"READONLY", RCONN_FAULT_READONLY}, {"OOM", RCONN_FAULT_OOM},
        {"MISCONF", RCONN_FAULT_MISCONF},   {"BUSY", RCONN_FAULT_BUSY},
        {"LOADING", RCONN_FAULT_LOADING},   {"MASTERDOWN", RCONN_FAULT_DOWN},
        {"CLUSTERDOWN", RCONN_FAULT_DOWN},  {"TRYAGAIN", RCONN_FAULT_BUSY},
    };
    if (r == NULL)
        return RCONN_FAULT_DOWN;
    if (r->type != REDIS_REPLY_ERROR)
        return RCONN_FAULT_NONE;
    for (size_t i = 0; i < CS_ARRAY_LEN(known); i++) {
        size_t n = strlen(known[i].prefix);
        /* "BUSY Redis is busy..." but not "BUSYKEY": the code ends at a space. */
        if (r->len >= n && strncmp(r->str, known[i].prefix, n) == 0
            && (r->len == n || r->str[n] == ' '))
            return known[i].fault;
    }
    return RCONN_FAULT_ERROR;
}

const char *rconn_fault_name(enum rconn_fault f)
{
    static const char *const names[RCONN_FAULT__COUNT] = {
        [RCONN_FAULT_NONE] = "up",         [RCONN_FAULT_DOWN] = "down",
        [RCONN_FAULT_READONLY] = "readonly", [RCONN_FAULT_OOM] = "oom",
        [RCONN_FAULT_MISCONF] = "misconf", [RCONN_FAULT_BUSY] = "busy",
        [RCONN_FAULT_LOADING] = "loading", [RCONN_FAULT_ERROR] = "error",
    };
    return (unsigned)f < RCONN_FAULT__COUNT ? names[f] : "error";
}

void rscript_from_text(struct rscript *s, const char *text)
{
    memset(s, 0, sizeof(*s));
    s->src = xstrdup(text);
    s->len = strlen(text);
}

void rscript_free(struct rscript *s)
{
    free(s->src);
    s->src = NULL;
}

static int rconn_script_load(struct rconn *rc, struct rscript *s, const char *key)
{
    redisReply *r = rconn_command(rc, key, "SCRIPT LOAD %b", s->src, s->len);
    if (r == NULL)
        return CS_ERR;
    if (r->type != REDIS_REPLY_STRING || r->len != 40) {
        rconn_set_err(rc, RCONN_ERR_REPLY, "SCRIPT LOAD failed",
                      r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
        freeReplyObject(r);
        return CS_ERR;
    }
    memcpy(s->sha, r->str, 40);
    s->sha[40] = '\0';
    freeReplyObject(r);
    return CS_OK;
}

redisReply *rconn_evalsha(struct rconn *rc, const struct rscript *cs, int nkeys, int argc,
                          const char **argv, const size_t *argvlen)
{
    return rconn_evalsha_at(rc, cs, nkeys, argc, argv, argvlen, NULL);
}

static int rconn_not_sent(const struct rconn *rc)
{
    return rc->err == RCONN_ERR_CONNECT || rc->err == RCONN_ERR_BACKOFF ||
           rc->err == RCONN_ERR_DEADLINE;
}

redisReply *rconn_evalsha_at(struct rconn *rc, const struct rscript *cs, int nkeys, int argc,
                             const char **argv, const size_t *argvlen,
                             struct rconn_site *site)
{
    /* The SHA is a cache of what the server computed; it is filled lazily. */
    struct rscript *s = (struct rscript *)cs;
    const char *key = nkeys > 0 ? argv[0] : NULL;
    /* Room for a batch call (seize_batch.c): 3 + 256 keys + 3 per seize. */
    const char *av[RCONN_EVAL_ARGS + 3];
    size_t avl[RCONN_EVAL_ARGS + 3];
    char nk[12];

    rc->maybe_sent = 0;
    if (site != NULL) {
        site->conn_id = 0;
        site->node = -1;
    }
    if (argc + 3 > (int)CS_ARRAY_LEN(av)) {
        rconn_set_err(rc, RCONN_ERR_REPLY, "rconn_evalsha()", "too many arguments");
        return NULL;
    }
    if (s->sha[0] == '\0' && rconn_script_load(rc, s, key) != CS_OK)
        return NULL;

    av[0] = "EVALSHA";
    avl[0] = 7;
    av[1] = s->sha;
    avl[1] = 40;
    avl[2] = (size_t)snprintf(nk, sizeof(nk), "%d", nkeys);
    av[2] = nk;
    for (int i = 0; i < argc; i++) {
        av[i + 3] = argv[i];
        avl[i + 3] = argvlen ? argvlen[i] : strlen(argv[i]);
    }
    if (rc->cl != NULL) {
        /* NOSCRIPT is answered per node: the cluster layer loads it there. */
        redisReply *r = rconn_argv_at(rc, key, argc + 3, av, avl, s, site);
        if (r == NULL)
            rc->maybe_sent = !rconn_not_sent(rc);
        return r;
    }
    for (int attempt = 0;; attempt++) {
        redisReply *r = rconn_argv_at(rc, key, argc + 3, av, avl, NULL, site);
        if (r == NULL) {
            rc->maybe_sent = !rconn_not_sent(rc);
            return NULL;
        }
        if (attempt == 0 && r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0) {
            freeReplyObject(r);
            if (rconn_script_load(rc, s, key) != CS_OK)
                return NULL;
            continue;
        }
        return r;
    }
}

int rconn_copies(struct rconn *rc, const struct rconn_site *site, int wanted)
{
    if (wanted <= 0)
        return 0;
    return rc->cl != NULL ? rcluster_copies(rc->cl, site, wanted) : wanted;
}

/* The live connection of site, or NULL. */
static redisContext *rconn_site_ctx(struct rconn *rc, const struct rconn_site *site)
{
    if (rc->cl != NULL)
        return rcluster_site_ctx(rc->cl, site);
    return site != NULL && site->conn_id != 0 && site->conn_id == rc->conn_id ? rc->ctx : NULL;
}

static void rconn_wait_fail(struct rconn *rc, const struct rconn_site *site, redisContext *c,
                            const char *what)
{
    rconn_set_err(rc, rconn_ctx_errno(c), what, c->errstr);
    if (rc->cl != NULL)
        rcluster_site_fail(rc->cl, site);
    else
        rconn_fail(rc);
}

int rconn_wait_at(struct rconn *rc, const struct rconn_site *site, const char *fence_key,
                  int replicas, int timeout_ms)
{
    if (replicas <= 0)
        return CS_OK;
    redisContext *c = rconn_site_ctx(rc, site);
    if (c == NULL) {
        rconn_set_err(rc, RCONN_ERR_REPLY, "WAIT", "the connection that ran the command is gone");
        goto shortfall;
    }
    /* The request deadline bounds the WAIT too. */
    if (rc->deadline_ms != 0) {
        int64_t left = rc->deadline_ms - cs_mono_ms();
        if (left < timeout_ms)
            timeout_ms = (int)left;
    }
    if (timeout_ms <= 0) {
        rconn_set_err(rc, RCONN_ERR_DEADLINE, "WAIT", "the request deadline passed");
        goto shortfall;
    }
    /* The reply may take the whole WAIT timeout: the socket must outlast it. */
    redisSetTimeout(c, ms_to_tv(timeout_ms + rc->opts.command_timeout_ms));
    /* The socket keeps no timeout of its own after this: set again before
     * the next command on it. */
    if (rc->cl != NULL)
        rcluster_site_disarm(rc->cl, site);
    else
        rc->tmo_ctx = NULL;
    redisReply *r = NULL;
    if (fence_key != NULL) {
        r = redisCommand(c, "INCR %s", fence_key);
        if (r == NULL) {
            rconn_wait_fail(rc, site, c, "INCR (WAIT fence) failed");
            return CS_ERR;
        }
        int ok = r->type == REDIS_REPLY_INTEGER;
        if (!ok)
            rconn_set_err(rc, RCONN_ERR_REPLY, "INCR (WAIT fence)",
                          r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
        freeReplyObject(r);
        if (!ok)
            goto shortfall;
    }
    r = redisCommand(c, "WAIT %d %d", replicas, timeout_ms);
    if (r == NULL) {
        rconn_wait_fail(rc, site, c, "WAIT failed");
        return CS_ERR;
    }
    int ret = CS_OK;
    if (r->type != REDIS_REPLY_INTEGER || r->integer < replicas) {
        char why[96];
        if (r->type == REDIS_REPLY_INTEGER)
            snprintf(why, sizeof(why), "%lld of %d replicas acknowledged in %d ms", r->integer,
                     replicas, timeout_ms);
        else
            snprintf(why, sizeof(why), "%.90s",
                     r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
        rconn_set_err(rc, RCONN_ERR_REPLY, "WAIT", why);
        ret = CS_ERR;
    }
    freeReplyObject(r);
    if (ret == CS_OK)
        return CS_OK;
shortfall:
    if (rc->opts.cluster_shared != NULL)
        atomic_fetch_add(&rc->opts.cluster_shared->wait_shortfalls, 1);
    return CS_ERR;
}

int64_t *rconn_reply_ids(const redisReply *r, size_t *n)
{
    int64_t *ids = xmalloc(sizeof(*ids) * (r->elements + 1));
    *n = 0;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        if (e->type == REDIS_REPLY_STRING && cs_parse_id(e->str, e->len, &ids[*n]) == CS_OK)
            (*n)++;
    }
    return ids;
}

int rconn_hget_int(struct rconn *rc, const char *key, const char *field, int64_t dflt,
                   int64_t *v)
{
    redisReply *r = rconn_command(rc, key, "HGET %s %s", key, field);
    int ok = r != NULL && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_NIL);
    if (ok)
        *v = r->type == REDIS_REPLY_STRING ? strtoll(r->str, NULL, 10) : dflt;
    if (r != NULL)
        freeReplyObject(r);
    return ok ? CS_OK : CS_ERR;
}
