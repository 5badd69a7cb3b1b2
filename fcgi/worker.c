/* worker.c - the accept loop of one worker and the request helpers. */
#include "worker.h"
#include "conf.h"
#include "cs.h"
#include "log.h"
#include "keys.h"
#include "meta.h"
#include "mconn.h"
#include "rcluster.h"
#include "params.h"
#include "route.h"
#include "shm.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

volatile sig_atomic_t worker_stop;

/* Set only around FCGX_Accept_r(): a stop signal must end a wait for the next
 * request, and nothing else. */
static volatile sig_atomic_t worker_accepting;
static volatile sig_atomic_t worker_listen_fd = -1;
static volatile sig_atomic_t worker_kept_fd = -1; /* a kept connection being read */

/*
 * SIGTERM and SIGINT run with SA_RESTART, so inside a request an interrupted
 * read or write of libfcgi resumes instead of losing the answer (a poll or a
 * Redis connect still ends early: see doc/tuning.md). A blocked accept() resumes
 * too; so while waiting for the next request, the handler puts a socket that
 * does not listen under the listening descriptor's number (and under a kept
 * connection's, should the web server keep connections), and the resumed
 * call fails at once (EINVAL, ENOTCONN), which ends FCGX_Accept_r().
 * Descriptor tables are per process: the supervisor and the other workers
 * keep listening. This costs no system call per request, where masking the
 * signals outside accept() cost two. libfcgi's own FCGX_ShutdownPending() is
 * not used: after a connection it had to drop, it makes libfcgi retry a
 * closed descriptor forever.
 */
static void worker_on_term(int sig)
{
    int saved = errno;

    (void)sig;
    worker_stop = 1;
    if (worker_accepting) {
        /* socket(), dup2() and close() are async-signal-safe. Should socket()
         * fail, the worker stops after the next request instead. */
        int dud = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (dud >= 0) {
            dup2(dud, worker_listen_fd);
            if (worker_kept_fd >= 0)
                dup2(dud, worker_kept_fd);
            close(dud);
        }
    }
    errno = saved;
}

void req_reply(struct req *r, enum cs_code code, const char *msg, const char *extra,
               int retry_after_s)
{
    r->code = code;
    snprintf(r->msg, sizeof(r->msg), "%s", msg ? msg : http_code_msg(code));
    http_reply(r->out, code, msg, extra, retry_after_s);
}

int req_read_body(struct worker *w, struct req *r)
{
    if (r->content_length <= 0) {
        req_reply(r, CODE_BAD_REQUEST, "request body is empty", NULL, 0);
        return CS_ERR;
    }
    /* Never read past the cap: a large body is refused by its length alone. */
    if (r->content_length > w->conf->fcgi_max_body) {
        req_reply(r, CODE_TOO_LARGE, NULL, NULL, 0);
        return CS_ERR;
    }
    if (!http_is_json_type(r->content_type)) {
        req_reply(r, CODE_UNSUPPORTED_MEDIA_TYPE, NULL, NULL, 0);
        return CS_ERR;
    }
    if (r->body_read)
        return CS_OK;
    return req_read_raw(w, r);
}

int req_read_raw(struct worker *w, struct req *r)
{
    if (r->body_read)
        return CS_OK;
    if (r->content_length <= 0 || r->content_length > w->conf->fcgi_max_body) {
        r->body[0] = '\0';
        r->body_len = 0;
        return CS_OK;
    }
    int n = FCGX_GetStr(r->body, (int)r->content_length, r->fr->in);
    if (n != r->content_length) {
        req_reply(r, CODE_BAD_REQUEST, "request body shorter than Content-Length", NULL, 0);
        return CS_ERR;
    }
    r->body[n] = '\0';
    r->body_len = (size_t)n;
    r->body_read = 1;
    return CS_OK;
}

int req_read_optional_json(struct worker *w, struct req *r)
{
    int typed = r->content_type != NULL && *r->content_type != '\0';
    if (typed && !http_is_json_type(r->content_type)) {
        req_reply(r, CODE_UNSUPPORTED_MEDIA_TYPE, NULL, NULL, 0);
        return CS_ERR;
    }
    if (r->content_length <= 0) {
        r->body[0] = '\0';
        r->body_len = 0;
        return CS_OK;
    }
    if (req_read_body(w, r) != CS_OK)
        return CS_ERR;
    cJSON *doc = cJSON_ParseWithLengthOpts(r->body, r->body_len + 1, NULL, 1);
    int is_object = cJSON_IsObject(doc);
    cJSON_Delete(doc);
    if (!is_object) {
        req_reply(r, CODE_BAD_REQUEST, "body must be a JSON object", NULL, 0);
        return CS_ERR;
    }
    return CS_OK;
}

int req_auth(struct worker *w, struct req *r, int need, struct auth_identity *id)
{
    const char *why = "";
    enum auth_result res;
    if (w->auth.mode == AUTH_MODE_TRUSTED_HEADER && r->identity_twice) {
        /* Two copies of the identity: which one the server meant is unknown. */
        memset(id, 0, sizeof(*id));
        why = "identity param " PARAMS_USER_ID " or " PARAMS_USER_ROLE " given twice";
        res = AUTH_INVALID;
    } else {
        res = auth_check(&w->auth, r->authorization, r->x_user_id, r->x_user_role,
                         cs_now_ms() / 1000, id, &why);
    }
    if (res == AUTH_MISSING && need == 0) {
        id->user_id = 0;
        return CS_OK;
    }
    if (res != AUTH_OK) {
        log_debug("auth refused on %s: %s", r->path, why);
        req_reply(r, CODE_UNAUTHORIZED, why, NULL, 0);
        return CS_ERR;
    }
    if (res == AUTH_OK)
        r->who = *id;
    if (need == 2 && !id->is_admin) {
        req_reply(r, CODE_FORBIDDEN, NULL, NULL, 0);
        return CS_ERR;
    }
    return CS_OK;
}

/* How long one worker's probe of an open breaker may take before another
 * may probe: a seize waits for Redis up to its budget (fallback.budget_ms),
 * other calls a connect and two command timeouts (one resend). */
static int64_t worker_probe_lease(const struct cs_conf *c)
{
    int64_t call = 2 * ((int64_t)c->redis_connect_timeout_ms + c->redis_command_timeout_ms);
    return call > c->fallback_budget_ms ? call : c->fallback_budget_ms;
}

int worker_redis_allowed(struct worker *w)
{
    const struct cs_conf *c = w->conf;
    /* On a cluster the breakers are per shard (worker_seize_allowed()). */
    if (c->redis_cluster)
        return 1;
    return shm_breaker_allow(w->shm, cs_mono_ms(), worker_probe_lease(c));
}

int worker_redis_readable(const struct worker *w)
{
    /* Once the open interval is over a read is tried again: a node whose
     * seizes all need metadata it has not cached (a sale that started
     * during the outage) would otherwise never send the seize that probes
     * and closes the breaker. */
    return atomic_load(&w->shm->breaker_state) == BREAKER_CLOSED
           || atomic_load(&w->shm->redis_fault) != RCONN_FAULT_DOWN
           || cs_mono_ms() >= atomic_load(&w->shm->breaker_open_until_ms);
}

struct rconn *worker_long_rconn(const struct worker *w)
{
    struct rconn_opts ro;
    rconn_opts_from_conf(&ro, w->conf, w->conf->sync_redis_timeout_ms);
    return rconn_new(&ro);
}

void worker_redis_done(struct worker *w, enum rconn_fault fault)
{
    const struct cs_conf *c = w->conf;

    if (c->redis_cluster)
        return;
    if (atomic_load_explicit(&w->shm->redis_fault, memory_order_relaxed) != (int)fault)
        atomic_store(&w->shm->redis_fault, (int)fault);
    if (fault == RCONN_FAULT_NONE) {
        if (shm_breaker_success(w->shm))
            log_notice("redis is back: breaker closed");
        return;
    }
    if (w->rc->err == RCONN_ERR_TIMEOUT)
        atomic_fetch_add(&w->shm->m.redis_timeouts, 1);
    else
        atomic_fetch_add(&w->shm->m.redis_errors, 1);
    if (shm_breaker_failure(w->shm, cs_mono_ms(), c->redis_breaker_failures,
                            c->redis_breaker_open_ms))
        log_warn("redis breaker opened (%s): %s; seizes answer 503 until a probe succeeds",
                 rconn_fault_name(fault), w->rc->errstr);
}

int worker_seize_allowed(struct worker *w, int shard)
{
    const struct cs_conf *c = w->conf;
    if (!c->redis_cluster)
        return worker_redis_allowed(w);
    return shm_shard_allow(&w->shm->shard_breaker[shard], cs_mono_ms(), worker_probe_lease(c));
}

void worker_seize_done(struct worker *w, int shard, enum rconn_fault fault)
{
    const struct cs_conf *c = w->conf;
    if (!c->redis_cluster) {
        worker_redis_done(w, fault);
        return;
    }
    struct shm_breaker *b = &w->shm->shard_breaker[shard];
    if (fault == RCONN_FAULT_NONE) {
        if (shm_shard_success(b))
            log_notice("redis shard %d is back: its breaker closed", shard);
        return;
    }
    if (w->rc->err == RCONN_ERR_TIMEOUT)
        atomic_fetch_add(&w->shm->m.redis_timeouts, 1);
    else
        atomic_fetch_add(&w->shm->m.redis_errors, 1);
    if (shm_shard_failure(w->shm, b, cs_mono_ms(), c->redis_breaker_failures,
                          c->redis_breaker_open_ms))
        log_warn("redis breaker of shard %d opened (%s): %s; its seizes answer 503 until a "
                 "probe succeeds", shard, rconn_fault_name(fault), w->rc->errstr);
}

void worker_seize_silent(struct worker *w, int shard)
{
    const struct cs_conf *c = w->conf;
    int64_t now = cs_mono_ms();
    atomic_fetch_add(&w->shm->m.redis_timeouts, 1);
    if (!c->redis_cluster) {
        if (atomic_load_explicit(&w->shm->redis_fault, memory_order_relaxed) != RCONN_FAULT_DOWN)
            atomic_store(&w->shm->redis_fault, RCONN_FAULT_DOWN);
        if (shm_breaker_failure(w->shm, now, 1, c->redis_breaker_open_ms))
            log_warn("redis breaker opened: no seize answered for %d ms (fallback.budget_ms); "
                     "seizes answer 503 until a probe succeeds", c->fallback_budget_ms);
        return;
    }
    if (shard < 0 || shard >= KEYS_SHARDS)
        return;
    if (shm_shard_failure(w->shm, &w->shm->shard_breaker[shard], now, 1, c->redis_breaker_open_ms))
        log_warn("redis breaker of shard %d opened: no seize answered for %d ms "
                 "(fallback.budget_ms); its seizes answer 503 until a probe succeeds", shard,
                 c->fallback_budget_ms);
}

static _Atomic int64_t *worker_answer_slot(struct worker *w, int shard)
{
    if (w->conf->redis_cluster && shard >= 0 && shard < KEYS_SHARDS)
        return &w->shm->shard_breaker[shard].answer_ms;
    return &w->shm->seize_answer_ms;
}

void worker_seize_answered(struct worker *w, int shard)
{
    _Atomic int64_t *at = worker_answer_slot(w, shard);
    int64_t now = cs_mono_ms();
    /* Shared by every worker: written only when it moved, not per seize. */
    if (now - atomic_load_explicit(at, memory_order_relaxed) >= 5)
        atomic_store_explicit(at, now, memory_order_relaxed);
}

int64_t worker_seize_silence_ms(struct worker *w, int shard)
{
    int64_t at = atomic_load_explicit(worker_answer_slot(w, shard), memory_order_relaxed);
    return at > 0 ? cs_mono_ms() - at : INT64_MAX;
}

void worker_note_copies(struct worker *w, int shard, int copies)
{
    if (shard < 0 || shard >= RCLUSTER_SHARDS)
        return;
    _Atomic int32_t *v = &w->shm->cluster.shard_copies[shard];
    int32_t stored = copies < 0 ? 0 : copies + 1; /* 0: unknown (a new segment is zeroed) */
    if (atomic_load_explicit(v, memory_order_relaxed) != stored)
        atomic_store(v, stored);
}

int worker_durability(struct worker *w, int copies[])
{
    const struct cs_conf *c = w->conf;
    int degraded = 0;

    for (int i = 0; i < KEYS_SHARDS; i++) {
        char key[KEYS_MAX];
        size_t len = keys_stock(key, i);
        copies[i] = -1;
        if (!c->redis_cluster || c->redis_wait_replicas <= 0)
            continue;
        copies[i] = rcluster_slot_copies(w->rc, keys_slot(key, len), c->redis_wait_replicas);
        worker_note_copies(w, i, copies[i]);
        degraded += copies[i] >= 0 && copies[i] < c->redis_wait_replicas;
    }
    if (c->redis_cluster)
        atomic_store(&w->shm->cluster.copies_wanted, c->redis_wait_replicas);
    return degraded;
}

int worker_retry_after(const struct worker *w)
{
    int s = (w->conf->redis_breaker_open_ms + 999) / 1000;
    return s > 0 ? s : 1;
}

/* Fills r from the FastCGI parameters. */
static void req_init(struct req *r, FCGX_Request *fr, char *body)
{
    memset(r, 0, sizeof(*r));
    r->fr = fr;
    r->out = fr->out;
    r->body = body;
    r->start_us = cs_mono_us();
    params_fill(r, fr->envp);
}

static void req_account(struct worker *w, struct req *r)
{
    int route = r->route < SHM_ROUTES ? r->route : SHM_ROUTES - 1;
    int code = (int)r->code < SHM_CODES ? (int)r->code : SHM_CODES - 1;
    atomic_fetch_add_explicit(&w->shm->m.requests[route][code], 1, memory_order_relaxed);
    if (r->route == ROUTE_SEIZE)
        shm_observe_latency(w->shm, cs_mono_us() - r->start_us);
    meta_push_stats(w->meta, w->shm);
}

/*
 * Ends the request. libfcgi closes a connection by shutting down its write
 * side and then waiting (poll, up to 2 s) until the web server has closed
 * its end, so that input still unread cannot turn the close into a reset
 * that loses the answer. When the input has been read to its end, the web
 * server has sent all it will and there is nothing to lose: the connection
 * is closed at once (libfcgi's "detached" close), which saves shutdown,
 * poll and read per request and the wait for the web server in between.
 */
static void req_finish(FCGX_Request *fr)
{
    if (!fr->keepConnection && fr->in != NULL && FCGX_GetChar(fr->in) == EOF
        && FCGX_GetError(fr->in) == 0)
        fr->detached = 1;
    FCGX_Finish_r(fr);
}

static int worker_init(struct worker *w, const struct cs_conf *conf, struct shm_node *shm,
                       int index)
{
    char err[256];
    struct rconn_opts ro;

    rconn_opts_from_conf(&ro, conf, conf->redis_command_timeout_ms);
    ro.no_backoff = 1; /* the node breaker is the backoff */
    ro.cluster_shared = &shm->cluster;
    memset(w, 0, sizeof(*w));
    w->conf = conf;
    w->shm = shm;
    w->index = index;
    if (rscript_load_file(&w->script, conf->fcgi_script, err, sizeof(err)) != CS_OK) {
        log_error("%s", err);
        return CS_ERR;
    }
    w->rc = rconn_new(&ro);
    w->mc = mconn_new(conf);
    w->meta = meta_new(conf);
    w->auth.mode = strcmp(conf->auth_mode, "trusted-header") == 0 ? AUTH_MODE_TRUSTED_HEADER
                                                                  : AUTH_MODE_JWT;
    w->auth.secret = (const unsigned char *)conf->auth_jwt_secret;
    w->auth.secret_len = strlen(conf->auth_jwt_secret);
    w->auth.leeway_s = conf->auth_leeway_s;
    w->auth.audience = conf->auth_audience;
    w->auth.issuer = conf->auth_issuer;
    w->auth.verifier = strcmp(conf->auth_verifier, "libjwt") == 0 ? AUTH_VERIFY_LIBJWT
                                                                  : AUTH_VERIFY_OPENSSL;
    if (auth_init(&w->auth) != CS_OK) {
        log_error("auth: OpenSSL has no HMAC-SHA-256");
        return CS_ERR;
    }
    /* Counted by the metrics route; a full registry only hides this worker there. */
    w->rj.j.fd = -1;
    reserve_init_faults();
    w->slot = shm_worker_register(shm, (int32_t)getpid());
    if (w->slot < 0)
        log_warn("worker %d: no free slot in the worker registry (metrics omit it, and it "
                 "grants nothing from reserves)", index);
    return CS_OK;
}

static void worker_fini(struct worker *w)
{
    if (w->rj.seg != 0)
        journal_close(&w->rj.j);
    if (w->shm != NULL)
        shm_worker_unregister(w->shm, (int32_t)getpid());
    auth_fini(&w->auth);
    meta_free(w->meta);
    mconn_free(w->mc);
    rconn_free(w->rc);
    rscript_free(&w->script);
}

int worker_main(const struct cs_conf *conf, int listen_fd, struct shm_node *shm, int index)
{
    struct worker w;
    FCGX_Request fr;
    struct req r;
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = worker_on_term;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    /* Otherwise FCGX_Init() installs libfcgi's SIGUSR1 handler, which would
     * fail the reads and writes of a request in flight. */
    signal(SIGUSR1, SIG_IGN);

    if (worker_init(&w, conf, shm, index) != CS_OK)
        return 1;
    char *body = xmalloc((size_t)conf->fcgi_max_body + 1);

    if (FCGX_Init() != 0 || FCGX_InitRequest(&fr, listen_fd, FCGI_FAIL_ACCEPT_ON_INTR) != 0) {
        log_error("FCGX_InitRequest() failed on fd %d", listen_fd);
        free(body);
        worker_fini(&w);
        return 1;
    }
    worker_listen_fd = listen_fd;
    log_debug("worker %d ready on fd %d", index, listen_fd);

    for (;;) {
        worker_kept_fd = fr.ipcFd; /* >= 0 only when the web server keeps it */
        worker_accepting = 1;
        /* A signal from here on either is seen now or ends the accept. */
        int rc = worker_stop ? -1 : FCGX_Accept_r(&fr);
        worker_accepting = 0;
        if (rc < 0) {
            if (worker_stop)
                break;
            /* A client that went away mid-handshake; keep serving, but do
             * not spin if the listening socket itself is broken. */
            usleep(1000);
            continue;
        }
        /* Accepted, even if the signal came meanwhile: serve it, then go. */
        req_init(&r, &fr, body);
        route_dispatch(&w, &r);
        req_account(&w, &r);
        req_finish(&fr);
        /* The keeper moved the node to a new journal segment: let go of
         * the old one, so it can be deleted once replayed. */
        if (w.rj.seg != 0 && w.rj.seg != atomic_load(&shm->rsv.journal_seg)) {
            journal_close(&w.rj.j);
            w.rj.seg = 0;
        }
        if (worker_stop)
            break;
    }
    FCGX_Free(&fr, 0);
    free(body);
    worker_fini(&w);
    log_debug("worker %d stopped", index);
    return 0;
}
