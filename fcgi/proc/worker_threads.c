/* worker_threads.c - a worker of fcgi.threads request threads, each serving
 * one FastCGI connection at a time on the shared listening socket. */
#include "worker_int.h"
#include "conf.h"
#include "cs.h"
#include "log.h"
#include "node/durability.h"
#include "req/req.h"

#include <errno.h>
#include <mysql.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

/*
 * Each thread has its own FCGX_Request on the listening socket and its own
 * struct node_ctx (Redis connection, metadata cache, registry slot, reserve
 * journal), so a handler shares nothing with the other threads of its
 * process but what every process of the node shares already (the segment).
 * accept() on one socket from many threads is safe and wakes one of them.
 * A thread whose web server keeps the connection serves its next request on
 * it, so a kept connection pins one thread of many, not a whole worker.
 *
 * Stopping (doc/internals.md, "Request threads"): SIGTERM and SIGINT are
 * blocked in every thread and taken by the main thread in sigwait(). It
 * sets the stop flag, makes the stop eventfd readable, puts a socket that
 * does not listen under the listening descriptor's number, and sends
 * WT_SIGNAL (SA_RESTART, a handler that does nothing) to every thread that
 * may be blocked in accept(): the restarted accept() meets the dud and
 * fails (EINVAL), which ends worker_accept(). The listening descriptor
 * stays open as long as the process serves, so its number never names
 * anything else. A kept connection between two requests is never read
 * blindly: its thread waits in poll() on it and the stop eventfd, so
 * no descriptor but the listening one is ever replaced (a closed kept
 * connection's number may already be another thread's socket).
 * What a thread has accepted it serves, though the stop comes before the
 * request's first bytes (worker_accept()); once stopping, it serves a kept
 * connection till the web server closes it, fcgi.kept_drain_ms at most
 * (worker_kept_wait()).
 */

struct wt_pool;

struct wt_thread {
    pthread_t tid;
    int started;
    _Atomic int accepting;       /* inside worker_accept(): maybe blocked in accept() */
    _Atomic int done;            /* the thread has left its loop */
    int no;                      /* 0..fcgi.threads - 1 */
    struct wt_pool *pool;
    struct node_ctx nc;
    FCGX_Request fr;
    char *body;
};

struct wt_pool {
    int listen_fd;
    int stop_fd;                 /* eventfd: readable once the worker stops */
    _Atomic int stop;
    int index;                   /* the worker's number */
    int drain_ms;                /* fcgi.kept_drain_ms */
    int n;
    struct wt_thread *t;
};

/* The threads' own wake-up: a real-time signal nobody else sends (SIGUSR1
 * is libfcgi's, SIGUSR2 the supervisor's upgrade signal, ignored here as in
 * the one-request worker). */
#define WT_SIGNAL (SIGRTMIN + 2)

static void wt_on_wake(int sig)
{
    (void)sig;
}

static void *wt_run(void *arg)
{
    struct wt_thread *t = arg;
    struct wt_pool *p = t->pool;
    struct req r;

    struct worker_src src = {.listen_fd = p->listen_fd, .wake_fd = p->stop_fd,
                             .stop = &p->stop, .accepting = &t->accepting,
                             .drain_ms = p->drain_ms};
    snprintf(src.who, sizeof(src.who), "worker %d thread %d", p->index, t->no);
    mysql_thread_init();
    for (;;) {
        int next = worker_next(&src, &t->nc, &t->fr);
        if (next == WORKER_NEXT_STOP)
            break;
        if (next == WORKER_NEXT_AGAIN)
            continue;
        worker_serve(&t->nc, &t->fr, &r, t->body);
        /* A kept connection is served on till the web server closes it. */
        if (atomic_load(&p->stop) && t->fr.ipcFd < 0)
            break;
    }
    /* A kept connection is closed outright: libfcgi's own close would wait
     * up to 2 s for the web server to close its end. */
    if (t->fr.ipcFd >= 0) {
        close(t->fr.ipcFd);
        t->fr.ipcFd = -1;
    }
    FCGX_Free(&t->fr, 0);
    mysql_thread_end();
    atomic_store(&t->done, 1);
    return NULL;
}

/* Ends every thread's wait for a request (see the top of the file) and
 * waits for them to finish the requests they have.
 * MUST: the stop flag is set before the dud goes in, and each thread's
 *       accepting flag is read after: a thread that saw no stop has marked
 *       itself accepting, and is signalled once the dud is in place, so its
 *       accept() (resumed or not yet begun) meets the dud. One signal is
 *       enough then.
 * A signal cuts short no wait of a connection already accepted (see
 * worker_accept()), so the threads are signalled again once a second, a
 * safety net for a thread that was between its flag and its accept(). */
static void wt_stop(struct wt_pool *p)
{
    uint64_t one = 1;
    int dud = -1, placed = -1;

    atomic_store(&p->stop, 1);
    if (write(p->stop_fd, &one, sizeof(one)) != (ssize_t)sizeof(one))
        log_error("worker %d: write(eventfd) failed: %s", p->index, strerror(errno));
    for (int round = 0;; round++) {
        int left = 0;
        if (dud < 0) {
            /* Should socket() or dup2() fail, the next round tries again,
             * and the threads are signalled each round meanwhile. */
            dud = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (dud >= 0 && dup2(dud, p->listen_fd) < 0) {
                log_error("worker %d: dup2() failed: %s", p->index, strerror(errno));
                close(dud);
                dud = -1;
            }
            if (dud >= 0)
                placed = round;
        }
        int signal_now = placed < 0 || (round - placed) % 50 == 0;
        for (int i = 0; i < p->n; i++) {
            struct wt_thread *t = &p->t[i];
            if (!t->started || atomic_load(&t->done))
                continue;
            left++;
            if (signal_now && atomic_load(&t->accepting))
                pthread_kill(t->tid, WT_SIGNAL);
        }
        if (left == 0)
            break;
        if (round == 0)
            log_debug("worker %d: waiting for %d request threads", p->index, left);
        usleep(20000);
    }
    if (dud >= 0)
        close(dud);
}

/* Every thread's state, made before any thread runs. */
static int wt_prepare(struct wt_pool *p, const struct cs_conf *conf, struct shm_node *shm)
{
    for (int i = 0; i < p->n; i++) {
        struct wt_thread *t = &p->t[i];
        t->no = i;
        t->pool = p;
        if (worker_init(&t->nc, conf, shm, p->index) != CS_OK)
            return CS_ERR;
        t->body = xmalloc((size_t)conf->fcgi_max_body + 1);
        /* -1: libfcgi never accepts itself (worker_accept()). */
        if (FCGX_InitRequest(&t->fr, -1, FCGI_FAIL_ACCEPT_ON_INTR) != 0) {
            log_error("FCGX_InitRequest() failed");
            return CS_ERR;
        }
    }
    return CS_OK;
}

static void wt_release(struct wt_pool *p)
{
    for (int i = 0; i < p->n; i++) {
        struct wt_thread *t = &p->t[i];
        if (t->started)
            pthread_join(t->tid, NULL);
        if (t->pool != NULL)
            worker_fini(&t->nc);
        free(t->body);
    }
    free(p->t);
    if (p->stop_fd >= 0)
        close(p->stop_fd);
}

int worker_threads_main(const struct cs_conf *conf, int listen_fd, struct shm_node *shm,
                        int index)
{
    struct wt_pool p;
    struct sigaction sa;
    sigset_t stop;
    int rc = 1, sig, err;

    /* Blocked before any thread exists, so every thread inherits it and
     * only the main thread's sigwait() takes them. */
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = wt_on_wake;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(WT_SIGNAL, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* The supervisor's upgrade signal, should it reach every process of
     * the unit: not this worker's business. */
    signal(SIGUSR2, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    /* Otherwise FCGX_Init() installs libfcgi's SIGUSR1 handler, which would
     * fail the reads and writes of a request in flight. */
    signal(SIGUSR1, SIG_IGN);

    memset(&p, 0, sizeof(p));
    p.listen_fd = listen_fd;
    p.index = index;
    p.drain_ms = conf->fcgi_kept_drain_ms;
    p.n = conf->fcgi_threads;
    p.t = xcalloc((size_t)p.n, sizeof(*p.t));
    p.stop_fd = eventfd(0, EFD_CLOEXEC);
    if (p.stop_fd < 0) {
        log_error("eventfd() failed: %s", strerror(errno));
        goto out;
    }
    /* Neither is safe to leave to the first of several threads. */
    if (mysql_library_init(0, NULL, NULL) != 0) {
        log_error("mysql_library_init() failed");
        goto out;
    }
    if (FCGX_Init() != 0) {
        log_error("FCGX_Init() failed");
        goto out;
    }
    if (wt_prepare(&p, conf, shm) != CS_OK)
        goto out;
    /* One worker says at start when a single Redis does not persist each
     * write, before its first thread owns the connection. */
    if (index == 0)
        (void)durability_single(conf, p.t[0].nc.rc);
    /* Registered just before they accept (worker_main() says why). */
    for (int i = 0; i < p.n; i++)
        worker_register(&p.t[i].nc, 0);
    for (int i = 0; i < p.n; i++) {
        err = pthread_create(&p.t[i].tid, NULL, wt_run, &p.t[i]);
        if (err != 0) {
            log_error("worker %d: pthread_create() failed: %s", index, strerror(err));
            wt_stop(&p);
            goto out;
        }
        p.t[i].started = 1;
    }
    log_debug("worker %d ready on fd %d with %d request threads", index, listen_fd, p.n);
    do {
        err = sigwait(&stop, &sig);
    } while (err != 0 || (sig != SIGTERM && sig != SIGINT));
    wt_stop(&p);
    rc = 0;
    log_debug("worker %d stopped", index);
out:
    wt_release(&p);
    return rc;
}
