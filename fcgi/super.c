/* super.c - prefork supervisor: bind, fork, reap, restart, reload, stop. */
#include "super.h"
#include "alist.h"
#include "conf.h"
#include "cs.h"
#include "keeper.h"
#include "log.h"
#include "rconn.h"
#include "sdnotify.h"
#include "shm.h"
#include "worker.h"

#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define SUPER_STOP_GRACE_MS 30000
#define SUPER_BACKOFF_MAX_MS 5000
#define SUPER_MAX_RETIRING 1024

struct slot {
    pid_t pid;
    int64_t started_ms;
    int64_t restart_at_ms;     /* 0 = running or nothing scheduled */
    int backoff_ms;
};

static const char *unix_path(const char *listen)
{
    if (strncmp(listen, "unix:", 5) == 0)
        return listen + 5;
    return listen[0] == '/' ? listen : NULL;
}

int super_listen(const struct cs_conf *conf)
{
    const char *path = unix_path(conf->fcgi_listen);
    int fd;

    if (path != NULL) {
        struct sockaddr_un sa;
        memset(&sa, 0, sizeof(sa));
        sa.sun_family = AF_UNIX;
        if (strlen(path) >= sizeof(sa.sun_path)) {
            log_error("fcgi.listen: socket path too long: %s", path);
            return -1;
        }
        strcpy(sa.sun_path, path);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            log_error("socket(AF_UNIX) failed: %s", strerror(errno));
            return -1;
        }
        unlink(path); /* a stale socket from an earlier run */
        if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
            log_error("bind(%s) failed: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
        /* Access is governed by the directory the socket lives in. */
        chmod(path, 0666);
    } else {
        char host[256];
        const char *colon = strrchr(conf->fcgi_listen, ':');
        if (colon == NULL || colon == conf->fcgi_listen
            || (size_t)(colon - conf->fcgi_listen) >= sizeof(host)) {
            log_error("fcgi.listen must be a socket path or HOST:PORT, not \"%s\"",
                      conf->fcgi_listen);
            return -1;
        }
        memcpy(host, conf->fcgi_listen, (size_t)(colon - conf->fcgi_listen));
        host[colon - conf->fcgi_listen] = '\0';
        char *h = host;
        if (h[0] == '[') {
            h++;
            h[strlen(h) - 1] = '\0';
        }
        struct addrinfo hints, *ai;
        memset(&hints, 0, sizeof(hints));
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
        int rc = getaddrinfo(h, colon + 1, &hints, &ai);
        if (rc != 0) {
            log_error("getaddrinfo(%s) failed: %s", conf->fcgi_listen, gai_strerror(rc));
            return -1;
        }
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int one = 1;
        if (fd >= 0)
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
            log_error("bind(%s) failed: %s", conf->fcgi_listen, strerror(errno));
            if (fd >= 0)
                close(fd);
            freeaddrinfo(ai);
            return -1;
        }
        freeaddrinfo(ai);
    }
    if (listen(fd, conf->fcgi_backlog) != 0) {
        log_error("listen(%s) failed: %s", conf->fcgi_listen, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

static sigset_t super_sigs;

static pid_t super_spawn(struct cs_conf *conf, int listen_fd, struct shm_node *shm, int index)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        log_error("fork() failed: %s", strerror(errno));
        return 0;
    }
    if (pid == 0) {
        /* A worker never outlives its supervisor: nobody would restart it,
         * reload it or stop it. SIGTERM lets the request in flight finish;
         * the getppid() check covers a supervisor that died before prctl(). */
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent)
            _exit(1);
        /* The worker gets default signal handling back, and the socket. */
        sigprocmask(SIG_UNBLOCK, &super_sigs, NULL);
        signal(SIGCHLD, SIG_DFL);
        _exit(worker_main(conf, listen_fd, shm, index));
    }
    return pid;
}

/* The reserve keeper: forked like a worker, restarted like one. */
static pid_t super_spawn_keeper(struct cs_conf *conf, struct shm_node *shm, int listen_fd)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        log_error("fork() failed: %s", strerror(errno));
        return 0;
    }
    if (pid == 0) {
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent)
            _exit(1);
        close(listen_fd);
        sigprocmask(SIG_UNBLOCK, &super_sigs, NULL);
        signal(SIGCHLD, SIG_DFL);
        _exit(keeper_main(conf, shm));
    }
    return pid;
}

static void super_describe_exit(int index, pid_t pid, int status, int64_t lived_ms)
{
    if (WIFSIGNALED(status))
        log_error("worker %d (pid %d) killed by signal %d (%s) after %lld ms; restarting",
                  index, (int)pid, WTERMSIG(status), strsignal(WTERMSIG(status)),
                  (long long)lived_ms);
    else
        log_error("worker %d (pid %d) exited with status %d after %lld ms; restarting", index,
                  (int)pid, WEXITSTATUS(status), (long long)lived_ms);
}

int super_run(struct cs_conf *conf, const char *conf_path, int listen_fd, int own_socket)
{
    char err[256];
    struct shm_node *shm = shm_node_open(conf->fcgi_shm_name, 1, err, sizeof(err));
    if (shm == NULL) {
        log_error("%s", err);
        return 1;
    }

    sigemptyset(&super_sigs);
    sigaddset(&super_sigs, SIGCHLD);
    sigaddset(&super_sigs, SIGTERM);
    sigaddset(&super_sigs, SIGINT);
    sigaddset(&super_sigs, SIGHUP);
    sigprocmask(SIG_BLOCK, &super_sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    int n = conf->fcgi_workers;
    struct slot *slots = xcalloc((size_t)n, sizeof(*slots));
    /* Workers replaced by a reload, finishing their last request; killed if
     * they have not gone SUPER_STOP_GRACE_MS after being told to. */
    struct retiree {
        pid_t pid;
        int64_t kill_at_ms;
    } retiring[SUPER_MAX_RETIRING];
    int nretiring = 0;
    int64_t now = cs_mono_ms();

    for (int i = 0; i < n; i++) {
        slots[i].pid = super_spawn(conf, listen_fd, shm, i);
        slots[i].started_ms = now;
        if (slots[i].pid == 0)
            slots[i].restart_at_ms = now + 1000;
    }
    pid_t keeper = 0;
    int64_t keeper_at = 0, keeper_backoff = 0, keeper_started = 0;
    if (keeper_wanted(conf)) {
        keeper = super_spawn_keeper(conf, shm, listen_fd);
        keeper_started = now;
        if (keeper == 0)
            keeper_at = now + 1000;
    }
    log_notice("coupon-fcgi supervisor %d serving %s with %d workers", (int)getpid(),
               conf->fcgi_listen, n);
    sdnotify_ready();
    sdnotify_status("%d workers", n);

    int stopping = 0;
    int64_t stop_deadline = 0;
    for (;;) {
        struct timespec ts = {0, 200 * 1000000};
        siginfo_t si;
        int sig = sigtimedwait(&super_sigs, &si, &ts);
        now = cs_mono_ms();

        if (sig == SIGTERM || sig == SIGINT) {
            if (!stopping) {
                log_notice("stopping: waiting for workers to finish their requests");
                sdnotify_stopping();
                stopping = 1;
                stop_deadline = now + SUPER_STOP_GRACE_MS;
                for (int i = 0; i < n; i++)
                    if (slots[i].pid > 0)
                        kill(slots[i].pid, SIGTERM);
                for (int i = 0; i < nretiring; i++)
                    kill(retiring[i].pid, SIGTERM);
                /* It gives the reserves back while the workers finish. */
                if (keeper > 0)
                    kill(keeper, SIGTERM);
            }
        } else if (sig == SIGHUP && !stopping) {
            struct cs_conf fresh;
            struct rscript script;
            if (conf_load(&fresh, conf_path, err, sizeof(err)) != CS_OK) {
                log_error("reload refused, keeping the running configuration: %s", err);
            } else if (rscript_load_file(&script, fresh.fcgi_script, err, sizeof(err)) != CS_OK) {
                /* Workers that cannot load the script would all die. */
                log_error("reload refused, keeping the running configuration: %s", err);
                conf_free(&fresh);
            } else {
                rscript_free(&script);
                sdnotify_reloading();
                if (strcmp(fresh.fcgi_listen, conf->fcgi_listen) != 0
                    || fresh.fcgi_workers != conf->fcgi_workers
                    || strcmp(fresh.fcgi_shm_name, conf->fcgi_shm_name) != 0)
                    log_warn("fcgi.listen, fcgi.workers and fcgi.shm_name change only on restart");
                /* The workers keep the segment this supervisor created, and
                 * that is the one removed at stop. */
                fresh.fcgi_workers = conf->fcgi_workers;
                free(fresh.fcgi_listen);
                fresh.fcgi_listen = xstrdup(conf->fcgi_listen);
                free(fresh.fcgi_shm_name);
                fresh.fcgi_shm_name = xstrdup(conf->fcgi_shm_name);
                conf_free(conf);
                *conf = fresh;
                int lvl = log_level_parse(conf->log_level);
                log_init("coupon-fcgi", lvl, conf->log_target);
                /* Rolling: each new worker is up before its predecessor is told to go. */
                for (int i = 0; i < n; i++) {
                    pid_t old = slots[i].pid;
                    slots[i].pid = super_spawn(conf, listen_fd, shm, i);
                    slots[i].started_ms = now;
                    slots[i].backoff_ms = 0;
                    if (old > 0) {
                        kill(old, SIGTERM);
                        if (nretiring < SUPER_MAX_RETIRING)
                            retiring[nretiring++] = (struct retiree){
                                .pid = old, .kill_at_ms = now + SUPER_STOP_GRACE_MS};
                    }
                }
                /* The keeper gives its reserves back and starts again with
                 * the new settings (a lowered fallback.reserve among them). */
                if (keeper > 0)
                    kill(keeper, SIGTERM);
                else if (keeper_wanted(conf))
                    keeper_at = now;
                log_notice("configuration reloaded from %s; workers replaced", conf_path);
                sdnotify_ready();
            }
        }

        /* Reap everything that exited. */
        int status;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
            int found = 0;
            if (pid == keeper) {
                keeper = 0;
                atomic_store(&shm->rsv.keeper_pid, 0);
                if (stopping)
                    continue;
                int64_t lived = now - keeper_started;
                if (WIFSIGNALED(status) || WEXITSTATUS(status) != 0) {
                    log_error("reserve keeper (pid %d) ended (%s %d) after %lld ms; restarting",
                              (int)pid, WIFSIGNALED(status) ? "signal" : "status",
                              WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status),
                              (long long)lived);
                    keeper_backoff = lived < 1000
                        ? (keeper_backoff ? (keeper_backoff * 2 > SUPER_BACKOFF_MAX_MS
                                                 ? SUPER_BACKOFF_MAX_MS : keeper_backoff * 2)
                                          : 100)
                        : 0;
                } else {
                    keeper_backoff = 0;
                }
                keeper_at = now + keeper_backoff;
                continue;
            }
            shm_worker_unregister(shm, (int32_t)pid); /* a worker that crashed left it */
            for (int i = 0; i < nretiring; i++)
                if (retiring[i].pid == pid) {
                    retiring[i] = retiring[--nretiring];
                    found = 1;
                    break;
                }
            if (found)
                continue;
            for (int i = 0; i < n; i++) {
                if (slots[i].pid != pid)
                    continue;
                slots[i].pid = 0;
                if (stopping)
                    break;
                int64_t lived = now - slots[i].started_ms;
                super_describe_exit(i, pid, status, lived);
                atomic_fetch_add(&shm->m.worker_restarts, 1);
                /* A worker that dies young is restarted later and later. */
                if (lived < 1000)
                    slots[i].backoff_ms = slots[i].backoff_ms
                        ? (slots[i].backoff_ms * 2 > SUPER_BACKOFF_MAX_MS
                               ? SUPER_BACKOFF_MAX_MS : slots[i].backoff_ms * 2)
                        : 100;
                else
                    slots[i].backoff_ms = 0;
                slots[i].restart_at_ms = now + slots[i].backoff_ms;
                break;
            }
        }

        if (stopping) {
            int alive = nretiring + (keeper > 0);
            for (int i = 0; i < n; i++)
                alive += slots[i].pid > 0;
            if (alive == 0)
                break;
            if (now >= stop_deadline) {
                log_warn("%d workers did not stop in time; killing them", alive);
                for (int i = 0; i < n; i++)
                    if (slots[i].pid > 0)
                        kill(slots[i].pid, SIGKILL);
                for (int i = 0; i < nretiring; i++)
                    kill(retiring[i].pid, SIGKILL);
                if (keeper > 0)
                    kill(keeper, SIGKILL);
                stop_deadline = now + 5000;
            }
            continue;
        }
        for (int i = 0; i < nretiring; i++) {
            if (retiring[i].kill_at_ms <= now) {
                log_warn("replaced worker %d did not stop in %d ms; killing it",
                         (int)retiring[i].pid, SUPER_STOP_GRACE_MS);
                kill(retiring[i].pid, SIGKILL);
                retiring[i].kill_at_ms = now + 5000;
            }
        }
        if (keeper == 0 && keeper_at != 0 && keeper_at <= now) {
            keeper = keeper_wanted(conf) ? super_spawn_keeper(conf, shm, listen_fd) : 0;
            keeper_started = now;
            keeper_at = keeper == 0 && keeper_wanted(conf) ? now + 1000 : 0;
        }
        for (int i = 0; i < n; i++) {
            if (slots[i].pid == 0 && slots[i].restart_at_ms <= now) {
                slots[i].pid = super_spawn(conf, listen_fd, shm, i);
                slots[i].started_ms = now;
                slots[i].restart_at_ms = slots[i].pid == 0 ? now + 1000 : 0;
            }
        }
    }

    const char *path = unix_path(conf->fcgi_listen);
    if (own_socket && path != NULL)
        unlink(path);
    close(listen_fd);
    alist_unlink(shm, conf->fcgi_shm_name);
    shm_node_close(shm);
    shm_node_unlink(conf->fcgi_shm_name);
    free(slots);
    log_notice("coupon-fcgi stopped");
    return 0;
}
