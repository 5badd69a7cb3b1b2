/* worker.c - the accept loop of one worker. */
#include "worker.h"
#include "worker_int.h"
#include "node/breaker.h"
#include "conf.h"
#include "cs.h"
#include "node/durability.h"
#include "log.h"
#include "node/meta.h"
#include "mconn.h"
#include "rcluster.h"
#include "req/req.h"
#include "api/route.h"
#include "scripts.h"
#include "node/seize_rules.h"
#include "shm.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

/* Lock-free atomics, so the signal handler may use them (C11 7.14.1.1). */
_Atomic int worker_stop;

/* Set only around accept(): a stop signal must end a wait for a new
 * connection, and nothing else. */
static _Atomic int worker_accepting;
static volatile sig_atomic_t worker_listen_fd = -1;
static int worker_wake_fd = -1; /* eventfd: readable once the worker stops */

/*
 * SIGTERM and SIGINT run with SA_RESTART, so inside a request an interrupted
 * read or write of libfcgi resumes instead of losing the answer (a poll or a
 * Redis connect still ends early: see doc/tuning.md). A blocked accept() resumes
 * too; so while waiting for a new connection, the handler puts a socket that
 * does not listen under the listening descriptor's number, and the resumed
 * call fails at once (EINVAL), which ends the wait. A connection already
 * accepted is never replaced so: its request is served. A kept connection
 * between two requests is waited on in poll() beside an eventfd the handler
 * makes readable (worker_kept_wait()).
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
    atomic_store(&worker_stop, 1);
    if (worker_wake_fd >= 0) {
        uint64_t one = 1;
        ssize_t n = write(worker_wake_fd, &one, sizeof(one));
        (void)n; /* a full counter is readable too */
    }
    if (atomic_load(&worker_accepting)) {
        /* socket(), dup2() and close() are async-signal-safe. Should socket()
         * fail, the worker stops after the next request instead. */
        int dud = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (dud >= 0) {
            dup2(dud, worker_listen_fd);
            close(dud);
        }
    }
    errno = saved;
}

/*
 * The accept of a new connection is the worker's, not libfcgi's: libfcgi's
 * OS_Accept() waits (poll() or select()) up to 2 s for a unix socket
 * connection's first bytes and closes the connection when that wait ends
 * early, and a stop signal ends it early (neither call is restarted). A request taken
 * off the listening socket, which no other worker can take any more, was
 * dropped so (nginx answers 502) whenever a reload or an upgrade stopped a
 * worker at that moment. Here a stop does not cut the wait short; the
 * connection is then handed to FCGX_Accept_r() as an open one, whose reads
 * (SA_RESTART) no stop ends either, and libfcgi never accepts itself (the
 * request's listening descriptor is -1). As libfcgi did: TCP_NODELAY on
 * TCP, only the IPv4 peers FCGI_WEB_SERVER_ADDRS names when it is set
 * (the FastCGI convention), and a connection silent
 * for 2 s is dropped, a TCP one too, so that none holds a stopping worker.
 */
#define WORKER_FIRST_BYTES_MS 2000
#define WORKER_WEB_ADDRS_MAX 64

static struct in_addr web_addrs[WORKER_WEB_ADDRS_MAX];
static int n_web_addrs; /* 0: every peer; -2: none (read in worker_main()) */

static void worker_read_web_addrs(void)
{
    const char *env = getenv("FCGI_WEB_SERVER_ADDRS");

    n_web_addrs = 0;
    if (env == NULL || *env == '\0')
        return;
    /* Whole, never cut: a cut "10.0.0.12" would admit 10.0.0.1. */
    char *buf = xstrdup(env);
    for (char *save = NULL, *a = strtok_r(buf, ", \t", &save); a != NULL;
         a = strtok_r(NULL, ", \t", &save)) {
        if (n_web_addrs == WORKER_WEB_ADDRS_MAX) {
            log_warn("FCGI_WEB_SERVER_ADDRS: more than %d addresses, the rest ignored",
                     WORKER_WEB_ADDRS_MAX);
            break;
        }
        if (inet_pton(AF_INET, a, &web_addrs[n_web_addrs]) == 1)
            n_web_addrs++;
        else
            log_warn("FCGI_WEB_SERVER_ADDRS: \"%s\" is not an IPv4 address, ignored", a);
    }
    free(buf);
    /* Set but naming nobody: libfcgi then served nobody over TCP either. */
    if (n_web_addrs == 0)
        n_web_addrs = -2;
}

static int worker_peer_ok(const struct sockaddr_storage *ss)
{
    const struct sockaddr_in *in = (const struct sockaddr_in *)ss;

    if (ss->ss_family != AF_INET || n_web_addrs == 0)
        return 1;
    for (int i = 0; i < n_web_addrs; i++)
        if (web_addrs[i].s_addr == in->sin_addr.s_addr)
            return 1;
    return 0;
}

/* Accepts the next connection on listen_fd and waits up to 2 s for its
 * first bytes, which no signal cuts short (worker.c says why). Returns the
 * connection, to be put in an FCGX_Request's ipcFd whose listen_sock is -1,
 * with keepConnection set till the request is read (libfcgi's
 * FCGX_Accept_r() first finishes the last request, and closes its
 * connection unless kept), or -1 with errno set (worker_accept_transient()
 * tells whether to go on).
 * Safe from several threads at once. */
static int worker_accept(int listen_fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    struct pollfd pf;
    int64_t until;
    int fd, one = 1;

    fd = accept4(listen_fd, (struct sockaddr *)&ss, &len, SOCK_CLOEXEC);
    if (fd < 0)
        return -1;
    if (ss.ss_family == AF_INET || ss.ss_family == AF_INET6) {
        if (!worker_peer_ok(&ss)) {
            close(fd);
            errno = ECONNREFUSED;
            return -1;
        }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    pf.fd = fd;
    pf.events = POLLIN;
    until = cs_mono_ms() + WORKER_FIRST_BYTES_MS;
    for (;;) {
        int64_t left = until - cs_mono_ms();
        int n = poll(&pf, 1, left > 0 ? (int)left : 0);
        if (n > 0)
            return fd;
        if (n < 0 && errno == EINTR)
            continue;
        close(fd);
        errno = n == 0 ? ETIMEDOUT : errno;
        return -1;
    }
}

/* 1 when an accept that failed with err is worth trying again at once. */
static int worker_accept_transient(int err)
{
    switch (err) {
    case EINTR:
    case ECONNABORTED:
    case ECONNREFUSED:
    case ECONNRESET:
    case EPROTO:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case EPERM: /* a firewall's refusal of the new connection */
        return 1;
    default:
        return 0;
    }
}

/* Waits for the next request (or the end) of the kept connection fd: 1 once
 * it has something to read. Once stopping (stopping set, or wake_fd
 * readable), waits till *drain_until, set to drain_ms from the first such
 * wait, and returns 0 when that passes; -1 (logged) when poll() fails: the
 * caller closes the connection. The web server may send a request
 * on a kept connection the moment the worker closes it, and gets no answer
 * then (nginx: 502, a seize not sent again), so a stopping handler serves a
 * kept connection till the web server closes it or the drain is over. */
static int worker_kept_wait(int fd, int wake_fd, int stopping, int64_t *drain_until,
                            int drain_ms)
{
    struct pollfd pf[2] = {
        {.fd = fd, .events = POLLIN},
        {.fd = wake_fd, .events = POLLIN},
    };

    for (;;) {
        int timeout = -1;
        if (stopping) {
            if (*drain_until == 0)
                *drain_until = cs_mono_ms() + drain_ms;
            int64_t left = *drain_until - cs_mono_ms();
            timeout = left > 0 ? (int)left : 0;
        }
        int n = poll(pf, stopping ? 1 : 2, timeout);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            log_error("poll() on a kept connection failed: %s; closing it", strerror(errno));
            return -1;
        }
        if (n > 0 && pf[0].revents != 0)
            return 1;
        if (n == 0)
            return 0; /* the drain is over */
        stopping = 1;   /* the wake descriptor: the worker stops */
    }
}

int worker_next(struct worker_src *src, struct node_ctx *nc, FCGX_Request *fr)
{
    if (fr->ipcFd >= 0) {
        /* The web server keeps the connection: its next request, or its
         * end; once stopping, for fcgi.kept_drain_ms at most. */
        int ready = worker_kept_wait(fr->ipcFd, src->wake_fd, atomic_load(src->stop),
                                     &src->drain_until, src->drain_ms);
        if (ready < 0) {
            close(fr->ipcFd);
            fr->ipcFd = -1;
            return WORKER_NEXT_AGAIN;
        }
        if (ready == 0) {
            log_info("%s: closing a kept connection the web server has not closed in "
                     "fcgi.kept_drain_ms (%d ms)", src->who, src->drain_ms);
            return WORKER_NEXT_STOP;
        }
    } else {
        /* A full registry (generations of workers still finishing after
         * reloads) frees up as they go. */
        if (nc->slot < 0)
            worker_register(nc, 1);
        /* The flag before the stop check, the stop flag before the dud in
         * the stopper: either this handler sees the stop, or the stopper
         * sees it accepting and the accept meets the dud. */
        atomic_store(src->accepting, 1);
        int fd = atomic_load(src->stop) ? -1 : worker_accept(src->listen_fd);
        atomic_store(src->accepting, 0);
        if (fd < 0) {
            if (atomic_load(src->stop))
                return WORKER_NEXT_STOP;
            /* A client that went away or stayed silent: next one. A broken
             * listening socket must not be spun on. */
            if (!worker_accept_transient(errno)) {
                log_error("%s: accept() failed: %s", src->who, strerror(errno));
                usleep(100000);
            }
            return WORKER_NEXT_AGAIN;
        }
        /* Accepted, even if the stop came meanwhile: served, then gone. */
        fr->ipcFd = fd;
        fr->keepConnection = 1; /* or FCGX_Accept_r() first closes it */
    }
    if (FCGX_Accept_r(fr) < 0)
        /* The connection ended before a request: libfcgi closed it. */
        return atomic_load(src->stop) ? WORKER_NEXT_STOP : WORKER_NEXT_AGAIN;
    return WORKER_NEXT_SERVE;
}

/* Counts the request in the node's metrics. */
static void worker_account(struct node_ctx *w, struct req *r)
{
    int route = r->route < SHM_ROUTES ? r->route : SHM_ROUTES - 1;
    int code = (int)r->code < SHM_CODES ? (int)r->code : SHM_CODES - 1;
    atomic_fetch_add_explicit(&w->shm->m.requests[route][code], 1, memory_order_relaxed);
    if (r->route == ROUTE_SEIZE)
        shm_observe_latency(w->shm, cs_mono_us() - r->start_us);
    meta_push_stats(w->meta, w->shm);
}

int worker_init(struct node_ctx *w, const struct cs_conf *conf, struct shm_node *shm, int index)
{
    struct rconn_opts ro;

    rconn_opts_from_conf(&ro, conf, conf->redis_command_timeout_ms);
    ro.no_backoff = 1; /* the node breaker is the backoff */
    ro.cluster_shared = &shm->cluster;
    memset(w, 0, sizeof(*w));
    w->slot = -1; /* none till registered: worker_fini() frees no one else's */
    w->conf = conf;
    w->shm = shm;
    w->index = index;
    rscript_from_text(&w->script, script_seize);
    w->rc = rconn_new(&ro);
    w->mc = mconn_new(conf);
    w->meta = meta_new(conf, shm);
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
    w->rj.j.fd = -1;
    reserve_init_faults();
    return CS_OK;
}

void worker_register(struct node_ctx *w, int quiet)
{
    /* Counted by the metrics route; a full registry only hides this worker there. */
    w->slot = shm_worker_register(w->shm, (int32_t)getpid());
    if (w->slot < 0 && !quiet)
        log_warn("worker %d: no free slot in the worker registry (metrics omit it, and it "
                 "grants nothing from reserves)", w->index);
}

void worker_fini(struct node_ctx *w)
{
    if (w->rj.seg != 0)
        journal_close(&w->rj.j);
    if (w->shm != NULL)
        shm_worker_unregister_slot(w->shm, w->slot, (int32_t)getpid());
    auth_fini(&w->auth);
    meta_free(w->meta);
    mconn_free(w->mc);
    rconn_free(w->rc);
    rscript_free(&w->script);
}

void worker_serve(struct node_ctx *w, FCGX_Request *fr, struct req *r, char *body)
{
    const struct cs_conf *conf = w->conf;
    struct shm_node *shm = w->shm;

    req_init(r, fr, body, conf->fcgi_max_body, &w->auth);
    route_dispatch(w, r);
    worker_account(w, r);
    req_finish(fr);
    if (w->ask_pending) {
        w->ask_pending = 0;
        /* A follower of a group commit sent nothing itself: it asks the
         * node the slot map names, brought up to date first if another
         * process of the node saw it change (a failover); not at all if
         * another worker's seize was answered or opened the breaker
         * meanwhile. */
        if (breaker_seize_ask_due(conf, shm, w->ask_shard)) {
            if (w->ask_slot >= 0 && w->rc->cl != NULL)
                rcluster_slot_site(w->rc->cl, (unsigned)w->ask_slot, &w->ask_site,
                                   cs_mono_ms()
                                       + seize_rules_margin(conf->fallback_budget_ms));
            breaker_seize_ask(conf, shm, w->ask_shard, w->rc, &w->ask_site);
        }
    }
    /* The keeper moved the node to a new journal segment: let go of
     * the old one, so it can be deleted once replayed. */
    if (w->rj.seg != 0 && w->rj.seg != atomic_load(&shm->rsv.journal_seg)) {
        journal_close(&w->rj.j);
        w->rj.seg = 0;
    }
}

int worker_main(const struct cs_conf *conf, int listen_fd, struct shm_node *shm, int index)
{
    struct node_ctx w;
    FCGX_Request fr;
    struct req r;
    struct sigaction sa;

    worker_read_web_addrs();
    if (conf->fcgi_threads > 1)
        return worker_threads_main(conf, listen_fd, shm, index);
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
    /* The supervisor's upgrade signal: a "systemctl kill -s USR2" that
     * reaches every process of the unit must not end the workers at once. */
    signal(SIGUSR2, SIG_IGN);

    if (worker_init(&w, conf, shm, index) != CS_OK)
        return 1;
    char *body = xmalloc((size_t)conf->fcgi_max_body + 1);

    /* -1: libfcgi never accepts itself (worker_accept() above). */
    if (FCGX_Init() != 0 || FCGX_InitRequest(&fr, -1, FCGI_FAIL_ACCEPT_ON_INTR) != 0) {
        log_error("FCGX_InitRequest() failed on fd %d", listen_fd);
        free(body);
        worker_fini(&w);
        return 1;
    }
    worker_listen_fd = listen_fd;
    worker_wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (worker_wake_fd < 0) {
        log_error("eventfd() failed: %s", strerror(errno));
        FCGX_Free(&fr, 0);
        free(body);
        worker_fini(&w);
        return 1;
    }
    log_debug("worker %d ready on fd %d", index, listen_fd);
    /* One worker says at start when a single Redis does not persist each
     * write (the metrics route keeps the gauge). */
    if (index == 0)
        (void)durability_single(conf, w.rc);
    /* Registered last: an upgrade's new supervisor takes over once every
     * worker of its own is registered, so registered means about to accept
     * (a Redis that hangs the check above holds the hand-over, not the
     * node's accepting). */
    worker_register(&w, 0);

    struct worker_src src = {.listen_fd = listen_fd, .wake_fd = worker_wake_fd,
                             .stop = &worker_stop, .accepting = &worker_accepting,
                             .drain_ms = conf->fcgi_kept_drain_ms};
    snprintf(src.who, sizeof(src.who), "worker %d", index);
    for (;;) {
        int next = worker_next(&src, &w, &fr);
        if (next == WORKER_NEXT_STOP)
            break;
        if (next == WORKER_NEXT_AGAIN)
            continue;
        worker_serve(&w, &fr, &r, body);
        /* A kept connection is served on till the web server closes it. */
        if (atomic_load(&worker_stop) && fr.ipcFd < 0)
            break;
    }
    if (fr.ipcFd >= 0) {
        /* Closed outright: libfcgi's own close waits up to 2 s for the web
         * server to close its end. */
        close(fr.ipcFd);
        fr.ipcFd = -1;
    }
    FCGX_Free(&fr, 0);
    free(body);
    worker_fini(&w);
    log_debug("worker %d stopped", index);
    return 0;
}
