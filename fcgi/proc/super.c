/* super.c - prefork supervisor: bind, fork, reap, restart, reload, upgrade, stop. */
#include "super.h"
#include "node/listcopy.h"
#include "batch.h"
#include "conf.h"
#include "cs.h"
#include "keeper/keeper.h"
#include "log.h"
#include "rconn.h"
#include "sdnotify.h"
#include "shm.h"
#include "upgrade.h"
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
/* Reaped workers whose group-commit entries are still to be dropped (a
 * shard's lock was held when they were reaped). */
#define SUPER_MAX_UNBURIED 64
/* The longest an exited worker is kept unreaped (a zombie) while a
 * group-commit lock it must be buried under is busy. */
#define SUPER_BURY_MAX_MS 1000

/*
 * The process table: one row per child the supervisor keeps running, the
 * workers (rows 0 .. n-1, a row's index its worker's registry index) and
 * the reserve keeper (row n). Each is forked, reaped, restarted with
 * backoff when it dies young, signalled at reload and stop alike; what
 * differs by role is in super_fork(), super_proc_exited() and the upgrade's
 * hand-over (the keeper is handed over, not stopped).
 */
enum proc_role { PROC_WORKER, PROC_KEEPER };

struct proc {
    enum proc_role role;
    int index;                 /* a worker's; -1 for the keeper */
    pid_t pid;                 /* 0 = not running */
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

/* Forks the child of row p: a worker, or the reserve keeper; 0 when
 * fork() failed. */
static pid_t super_fork(struct cs_conf *conf, int listen_fd, struct shm_node *shm,
                        const struct proc *p)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        log_error("fork() failed: %s", strerror(errno));
        return 0;
    }
    if (pid > 0)
        return pid;
    /* A child never outlives its supervisor: nobody would restart it,
     * reload it or stop it. SIGTERM lets the request in flight finish;
     * the getppid() check covers a supervisor that died before prctl(). */
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent)
        _exit(1);
    /* Default signal handling back; the socket for a worker only. */
    sigprocmask(SIG_UNBLOCK, &super_sigs, NULL);
    signal(SIGCHLD, SIG_DFL);
    if (p->role == PROC_WORKER)
        _exit(worker_main(conf, listen_fd, shm, p->index));
    close(listen_fd);
    _exit(keeper_main(conf, shm));
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

/* Workers replaced by a reload, finishing their last request; killed if
 * they have not gone SUPER_STOP_GRACE_MS after being told to. */
struct retiree {
    pid_t pid;
    int64_t kill_at_ms;
};

/* What the supervisor's loop keeps between events. */
struct super {
    struct cs_conf *conf;
    const char *conf_path;
    int listen_fd;
    struct shm_node *shm;
    int n;                     /* fcgi.workers */
    struct proc *procs;        /* n workers, then the keeper (super_keeper()) */
    struct retiree *retiring;  /* grown as needed: a child no list knows is never
                                  killed at its grace, waited for at stop, nor buried */
    int nretiring, capretiring;
    struct {
        int32_t pid;
        int64_t since_ms;
    } unburied[SUPER_MAX_UNBURIED];  /* exited, kept unreaped: a lock was busy */
    int nunburied;
    int stopping;
    int64_t stop_deadline;
    int own_socket;            /* this supervisor (or the one it took over from) bound it */
    /* The in-place upgrade, the old supervisor's side: the new binary
     * while it starts, and whether it took over (then this one stops
     * without giving reserves back or removing the segment and socket). */
    pid_t upgrade_pid;
    int handover;
    /* ... and the new binary's side: the supervisor taken over from until
     * it has gone, whether it was told to go, and until when its workers
     * are waited for. The keeper is held back while the old one runs: one
     * keeper per journal directory (internals.md rule 15). */
    pid_t from_pid;
    int takeover_sent;
    int64_t takeover_by;
    int keeper_hold;
};

/* The keeper's row, the table's last. */
static inline struct proc *super_keeper(const struct super *s)
{
    return &s->procs[s->n];
}

/* Forks row p's child now; without one (fork() failed, or no keeper
 * wanted by the configuration) tries again in a second, or never. */
static void super_proc_start(struct super *s, struct proc *p, int64_t now)
{
    int wanted = p->role == PROC_WORKER || keeper_wanted(s->conf);

    p->pid = wanted ? super_fork(s->conf, s->listen_fd, s->shm, p) : 0;
    p->started_ms = now;
    p->restart_at_ms = p->pid == 0 && wanted ? now + 1000 : 0;
}

/* The keeper held back while the old supervisor of an upgrade runs is
 * started at the next tick (one keeper per journal directory, internals.md
 * rule 15). */
static void super_keeper_release(struct super *s, int64_t now)
{
    s->keeper_hold = 0;
    super_keeper(s)->restart_at_ms = keeper_wanted(s->conf) ? now : 0;
}

/* Sends sig to every child: the table's and the retiring workers. */
static void super_signal_all(const struct super *s, int sig)
{
    for (int i = 0; i <= s->n; i++)
        if (s->procs[i].pid > 0)
            kill(s->procs[i].pid, sig);
    for (int i = 0; i < s->nretiring; i++)
        kill(s->retiring[i].pid, sig);
}

/* SIGTERM / SIGINT: every worker finishes its request in flight and goes. */
static void super_on_stop(struct super *s, int64_t now)
{
    if (s->stopping)
        return;
    log_notice("stopping: waiting for workers to finish their requests");
    sdnotify_stopping();
    s->stopping = 1;
    s->stop_deadline = now + SUPER_STOP_GRACE_MS;
    super_signal_all(s, SIGTERM); /* the keeper gives reserves back while workers finish */
    /* A new binary still starting goes too (it has not taken over). */
    if (s->upgrade_pid > 0)
        kill(s->upgrade_pid, SIGTERM);
}

/*
 * The in-place upgrade (doc/operations.md, "Upgrading in place"), after
 * nginx's USR2 / WINCH / QUIT, with the steps in this order:
 *
 *   1. SIGUSR2 to the running (old) supervisor: it forks and execs the
 *      binary now on disk with its command line, the listening socket and
 *      UPGRADE_ENV (upgrade_exec()). Meanwhile it serves as before.
 *   2. The new binary checks the configuration and the schema as any start
 *      does, joins the node segment only if its layout is this build's
 *      (SHM_OPEN_EXISTING), and forks its workers: both generations accept
 *      on the one socket. Any refusal is an exit non-zero, which the old
 *      supervisor logs (super_reap()); it never stopped serving.
 *   3. Once every new worker is registered in the segment (about to
 *      accept), the new supervisor sends SIGQUIT to the old one.
 *   4. The old one names the new one the service's main process (systemd),
 *      tells its workers to finish their requests and go (SIGTERM, as at a
 *      stop or reload) and its keeper to hand over (SIGUSR2: stop without
 *      giving anything back; every grant is fsync'd in the journal before
 *      its answer, so nothing is left to write).
 *   5. Once that keeper is reaped, the old supervisor sends SIGUSR1 to the
 *      new one, which starts its keeper: it adopts the journal as a keeper
 *      restarted under running workers does (keeper_journal_rebuild(),
 *      internals.md rules 6, 14, 15). The old one exits once its workers
 *      are gone, leaving the segment and the socket to the new one.
 */
static void super_on_upgrade(struct super *s, int64_t now)
{
    (void)now;
    if (s->upgrade_pid > 0 || s->from_pid > 0) {
        log_warn("upgrade: one is under way already; SIGUSR2 ignored");
        return;
    }
    sdnotify_reloading();
    s->upgrade_pid = upgrade_exec(s->listen_fd, s->own_socket);
    if (s->upgrade_pid <= 0) {
        s->upgrade_pid = 0;
        sdnotify_ready();
        return;
    }
    log_notice("upgrade: started the new binary as pid %d; serving until its workers accept",
               (int)s->upgrade_pid);
}

/* SIGQUIT from the new binary (step 4): its workers accept. */
static void super_on_handover(struct super *s, int64_t now)
{
    siginfo_t si = {0};

    cs_pause_point("super-handover");
    /* Asked, then gone before this one acts (its exit is not reaped yet):
     * handing over would leave the node to nobody. super_reap() reports
     * the exit as a refused upgrade and this one serves on. */
    if (waitid(P_PID, (id_t)s->upgrade_pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0
        && si.si_pid == s->upgrade_pid) {
        log_error("upgrade: supervisor %d asked for the hand-over but has exited; this one "
                  "serves on", (int)s->upgrade_pid);
        return;
    }
    log_notice("upgrade: supervisor %d accepts; this one's workers finish their requests and "
               "go, the reserve keeper hands over", (int)s->upgrade_pid);
    sdnotify_mainpid((int)s->upgrade_pid);
    s->handover = 1;
    s->stopping = 1;
    s->stop_deadline = now + SUPER_STOP_GRACE_MS;
    for (int i = 0; i < s->n; i++)
        if (s->procs[i].pid > 0)
            kill(s->procs[i].pid, SIGTERM);
    for (int i = 0; i < s->nretiring; i++)
        kill(s->retiring[i].pid, SIGTERM);
    if (super_keeper(s)->pid > 0)
        kill(super_keeper(s)->pid, SIGUSR2);
    else
        kill(s->upgrade_pid, SIGUSR1); /* no keeper here: the new one may start its own */
    cs_pause_point("super-handed-over");
}

/* The new binary's side (step 3): SIGQUIT to the old supervisor once every
 * worker of this one is registered (or, past UPGRADE_READY_MS, at least
 * one); 1 when it gave up (no worker came up): this one stops and the old
 * one serves on. The old supervisor gone first (killed) is a take-over
 * too: its workers and keeper die with it. */
static int super_takeover_tick(struct super *s, int64_t now)
{
    if (s->from_pid == 0)
        return 0;
    if (getppid() != s->from_pid) {
        log_notice("upgrade: supervisor %d has gone; this one serves alone", (int)s->from_pid);
        s->from_pid = 0;
        s->takeover_sent = 1;
        if (s->keeper_hold)
            super_keeper_release(s, now);
        sdnotify_status("%d workers", s->n);
        return 0;
    }
    if (s->takeover_sent)
        return 0;
    int ready = 0;
    for (int i = 0; i < s->n; i++) {
        int32_t pid = (int32_t)s->procs[i].pid;
        for (int w = 0; pid > 0 && w < SHM_MAX_WORKERS; w++)
            if (atomic_load(&s->shm->worker_pid[w]) == pid) {
                ready++;
                break;
            }
    }
    if (ready < s->n && (now < s->takeover_by || ready == 0)) {
        if (now < s->takeover_by)
            return 0;
        log_error("upgrade: no worker of this binary came up in %d ms; supervisor %d serves "
                  "on", UPGRADE_READY_MS, (int)s->from_pid);
        return 1;
    }
    /* Said before the signal: the old one may be gone a moment after it. */
    log_notice("upgrade: supervisor %d took over from %d: %d of %d workers accept",
               (int)getpid(), (int)s->from_pid, ready, s->n);
    if (kill(s->from_pid, SIGQUIT) != 0) {
        log_error("upgrade: kill(%d, SIGQUIT) failed: %s; supervisor %d serves on",
                  (int)s->from_pid, strerror(errno), (int)s->from_pid);
        return 1;
    }
    s->takeover_sent = 1;
    return 0;
}

/* Adds a worker told to go to those retiring; never refused. */
static void super_retire(struct super *s, pid_t pid, int64_t now)
{
    if (s->nretiring == s->capretiring) {
        s->capretiring = s->capretiring > 0 ? s->capretiring * 2 : 64;
        s->retiring = xrealloc(s->retiring, (size_t)s->capretiring * sizeof(*s->retiring));
    }
    s->retiring[s->nretiring++] =
        (struct retiree){.pid = pid, .kill_at_ms = now + SUPER_STOP_GRACE_MS};
}

/* SIGHUP: the configuration read again, and the workers replaced one by one. */
static void super_on_reload(struct super *s, int64_t now)
{
    struct cs_conf *conf = s->conf;
    struct cs_conf fresh;
    char err[256];

    if (conf_load(&fresh, s->conf_path, err, sizeof(err)) != CS_OK) {
        log_error("reload refused, keeping the running configuration: %s", err);
        return;
    }
    sdnotify_reloading();
    if (strcmp(fresh.fcgi_listen, conf->fcgi_listen) != 0
        || fresh.fcgi_workers != conf->fcgi_workers
        || strcmp(fresh.fcgi_shm_name, conf->fcgi_shm_name) != 0)
        log_warn("fcgi.listen, fcgi.workers and fcgi.shm_name change only on restart");
    /* The workers keep the segment this supervisor created, and that is the
     * one removed at stop. */
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
    for (int i = 0; i < s->n; i++) {
        struct proc *p = &s->procs[i];
        pid_t old = p->pid;
        super_proc_start(s, p, now);
        p->backoff_ms = 0;
        if (old > 0) {
            kill(old, SIGTERM);
            super_retire(s, old, now);
        }
    }
    /* The keeper gives its reserves back and starts again with the new
     * settings (a lowered fallback.reserve among them) once it has gone
     * (super_proc_exited()). */
    if (super_keeper(s)->pid > 0)
        kill(super_keeper(s)->pid, SIGTERM);
    else
        super_keeper(s)->restart_at_ms = keeper_wanted(conf) ? now : 0;
    log_notice("configuration reloaded from %s; workers replaced", s->conf_path);
    sdnotify_ready();
}

/*
 * Row p's child ended: started again, later and later while it dies young
 * (super_backoff()); not while the supervisor stops. A worker only ends
 * when told to, so any end of one is logged and counted as a death; a
 * keeper's clean exit (it gave its reserves back at a reload) is not. A
 * keeper handing over (upgrade step 5) is not started again: its going
 * lets the new supervisor start its own.
 */
static void super_proc_exited(struct super *s, struct proc *p, int status, int64_t now)
{
    pid_t pid = p->pid;
    int64_t lived = now - p->started_ms;
    int died = WIFSIGNALED(status) || WEXITSTATUS(status) != 0;

    p->pid = 0;
    if (p->role == PROC_KEEPER) {
        atomic_store(&s->shm->rsv.keeper_pid, 0);
        if (s->handover) {
            /* Gone and reaped: its claim is stale and the journal's lock
             * free for the new supervisor's keeper. */
            log_notice("upgrade: reserve keeper (pid %d) handed over (%s %d)", (int)pid,
                       WIFSIGNALED(status) ? "signal" : "status",
                       WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
            if (s->upgrade_pid > 0) /* never 0: kill(0, ...) is the whole process group */
                kill(s->upgrade_pid, SIGUSR1);
            return;
        }
    }
    if (s->stopping)
        return;
    if (p->role == PROC_WORKER) {
        super_describe_exit(p->index, pid, status, lived);
        atomic_fetch_add(&s->shm->m.worker_restarts, 1);
        died = 1;
    } else if (died) {
        log_error("reserve keeper (pid %d) ended (%s %d) after %lld ms; restarting", (int)pid,
                  WIFSIGNALED(status) ? "signal" : "status",
                  WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status),
                  (long long)lived);
    }
    p->backoff_ms = died ? (int)super_backoff(p->backoff_ms, lived) : 0;
    p->restart_at_ms = now + p->backoff_ms;
}

/*
 * Drops an exited worker's group-commit entries and lead (batch_reaped()),
 * then its registry slot, BEFORE it is reaped: a zombie's pid cannot be
 * given to a new process, so the bury never touches another worker's entry.
 * A shard whose lock another process holds leaves it unreaped till the next
 * tick, at most SUPER_BURY_MAX_MS (a worker stopped holding the lock must
 * not keep the dead one from being replaced); past that it is reaped
 * unburied: its followers find it dead by its pid, and the worker given its
 * slot clears the entry under its shard's lock (batch_join()). 1 when it
 * may be reaped now.
 */
static int super_bury(struct super *s, int32_t pid, int64_t now)
{
    int i = 0;

    while (i < s->nunburied && s->unburied[i].pid != pid)
        i++;
    int busy = batch_reaped(&s->shm->batch, pid);
    if (busy && i == s->nunburied && s->nunburied < SUPER_MAX_UNBURIED) {
        s->unburied[s->nunburied].pid = pid;
        s->unburied[s->nunburied++].since_ms = now;
        return 0;
    }
    if (busy && i < s->nunburied && now - s->unburied[i].since_ms < SUPER_BURY_MAX_MS)
        return 0;
    if (busy)
        log_warn("worker %d: group-commit queue locked by another process for %d ms; "
                 "its entries left to its followers", (int)pid, SUPER_BURY_MAX_MS);
    if (i < s->nunburied)
        s->unburied[i] = s->unburied[--s->nunburied];
    shm_worker_unregister(s->shm, pid);
    return 1;
}

/*
 * The new supervisor of an upgrade died after it took over (step 4 done,
 * perhaps step 5), while this one was still here: this one serves again
 * rather than leave the node to nobody, as on a refused upgrade. Not after
 * a clean exit (a stop of the node), and not under systemd, whose main
 * process the dead one was (super_on_exit()). Its
 * workers told to go finish and go; new ones start now. The keeper, told
 * to hand over, is started again once it has exited (super_proc_exited(),
 * no longer handing over), or now if it has: it adopts the journal as after
 * any restart. The dead one's workers end with it (PR_SET_PDEATHSIG).
 */
static void super_resume(struct super *s, int64_t now)
{
    s->handover = 0;
    s->stopping = 0;
    for (int i = 0; i < s->n; i++) {
        struct proc *p = &s->procs[i];
        if (p->pid > 0)
            super_retire(s, p->pid, now);
        p->pid = 0;
        p->backoff_ms = 0;
        p->restart_at_ms = now;
    }
    if (super_keeper(s)->pid == 0)
        super_keeper(s)->restart_at_ms = keeper_wanted(s->conf) ? now : 0;
    sdnotify_mainpid((int)getpid());
    sdnotify_ready();
}

/* A child ended: an upgrade's new binary, a replaced worker, or a row of
 * the table. */
static void super_on_exit(struct super *s, pid_t pid, int status, int64_t now)
{
    if (pid == s->upgrade_pid) {
        /* Before it took over: it refused (step 2), and this one serves on. */
        if (!s->handover) {
            log_error("upgrade refused: the new binary (pid %d) %s %d; this supervisor "
                      "keeps serving", (int)pid, WIFSIGNALED(status) ? "died of signal"
                                                                      : "exited with status",
                      WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
            if (!s->stopping)
                sdnotify_ready();
            s->upgrade_pid = 0;
        } else if ((WIFSIGNALED(status) || WEXITSTATUS(status) != 0)
                   && getenv("NOTIFY_SOCKET") == NULL) {
            log_error("upgrade: the new supervisor (pid %d) ended after taking over (%s %d); "
                      "this one serves again", (int)pid,
                      WIFSIGNALED(status) ? "signal" : "status",
                      WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
            s->upgrade_pid = 0;
            super_resume(s, now);
        } else {
            /* Stopped (exit 0): the node was told to stop, and this one,
             * handed over, goes as its workers do. Under systemd the dead
             * one was the unit's main process: systemd, not this one,
             * decides what runs next. */
            log_error("upgrade: the new supervisor (pid %d) ended after taking over (%s %d); "
                      "this one, handed over, goes too", (int)pid,
                      WIFSIGNALED(status) ? "signal" : "status",
                      WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
            s->upgrade_pid = 0;
        }
        return;
    }
    for (int i = 0; i < s->nretiring; i++)
        if (s->retiring[i].pid == pid) {
            s->retiring[i] = s->retiring[--s->nretiring];
            return;
        }
    for (int i = 0; i <= s->n; i++)
        if (s->procs[i].pid == pid) {
            super_proc_exited(s, &s->procs[i], status, now);
            return;
        }
}

/* 1 when child pid has exited and may be reaped now: a worker once
 * buried (super_bury()), the keeper and an upgrade's new binary at once.
 * Reaps nothing. */
static int super_exited(struct super *s, pid_t pid, int64_t now)
{
    siginfo_t ci;

    memset(&ci, 0, sizeof(ci));
    if (pid <= 0 || waitid(P_PID, (id_t)pid, &ci, WEXITED | WNOHANG | WNOWAIT) != 0
        || ci.si_pid != pid)
        return 0;
    return pid == super_keeper(s)->pid || pid == s->upgrade_pid
           || super_bury(s, (int32_t)pid, now);
}

/* 1 when pid is a child of the table, a retiree or the new binary of an
 * upgrade under way. */
static int super_knows(const struct super *s, pid_t pid)
{
    if (pid <= 0)
        return 0;
    if (pid == s->upgrade_pid)
        return 1;
    for (int i = 0; i <= s->n; i++)
        if (s->procs[i].pid == pid)
            return 1;
    for (int i = 0; i < s->nretiring; i++)
        if (s->retiring[i].pid == pid)
            return 1;
    return 0;
}

/*
 * Reaps the exited children that no list knows, buried first as a worker
 * is (super_bury()): there should be none, but one forgotten would stay a
 * zombie till the supervisor ends (and a worker's registry slot taken), and
 * a process may have had children before it ran the supervisor. Asked by
 * waitid(WNOWAIT), which reports, of the children that exited, the one
 * forked first: a known one still kept for its bury (SUPER_BURY_MAX_MS at
 * most) ends the sweep till a later tick.
 */
static void super_sweep(struct super *s, int64_t now)
{
    for (;;) {
        siginfo_t ci;
        int status;

        memset(&ci, 0, sizeof(ci));
        if (waitid(P_ALL, 0, &ci, WEXITED | WNOHANG | WNOWAIT) != 0 || ci.si_pid <= 0)
            return;
        pid_t pid = ci.si_pid;
        if (super_knows(s, pid) || !super_bury(s, (int32_t)pid, now)
            || waitpid(pid, &status, WNOHANG) != pid)
            return;
        log_warn("reaped child %d, which no list of the supervisor held (%s %d)", (int)pid,
                 WIFSIGNALED(status) ? "signal" : "status",
                 WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    }
}

/* Reaps child pid if it exited and may be reaped now. */
static void super_reap_one(struct super *s, pid_t pid, int64_t now)
{
    int status;

    if (super_exited(s, pid, now) && waitpid(pid, &status, WNOHANG) == pid)
        super_on_exit(s, pid, status, now);
}

/* Reaps every child that exited and may be: those retiring, the keeper, an
 * upgrade's new binary and the workers, each by its own pid (a zombie kept
 * for its bury must not be taken by a wait for any child), then any other
 * (super_sweep()). The keeper goes before the new binary: its hand-over is
 * told to a new binary that may have exited since. */
static void super_reap(struct super *s, int64_t now)
{
    /* From the last: super_on_exit() moves the last retiree into the place
     * of the one reaped, and that one was seen already. */
    for (int i = s->nretiring - 1; i >= 0; i--)
        super_reap_one(s, s->retiring[i].pid, now);
    super_reap_one(s, super_keeper(s)->pid, now);
    super_reap_one(s, s->upgrade_pid, now);
    for (int i = 0; i < s->n; i++)
        super_reap_one(s, s->procs[i].pid, now);
    super_sweep(s, now);
}

/* While stopping: 1 once every child is gone; those past the grace are killed. */
static int super_stop_tick(struct super *s, int64_t now)
{
    int alive = s->nretiring;
    for (int i = 0; i <= s->n; i++)
        alive += s->procs[i].pid > 0;
    if (alive == 0)
        return 1;
    if (now >= s->stop_deadline) {
        log_warn("%d processes did not stop in time; killing them", alive);
        super_signal_all(s, SIGKILL);
        s->stop_deadline = now + 5000;
    }
    return 0;
}

/* Serving: replaced workers past their grace killed, the rows whose wait
 * is over started (the keeper not while held). */
static void super_tick(struct super *s, int64_t now)
{
    for (int i = 0; i < s->nretiring; i++) {
        if (s->retiring[i].kill_at_ms <= now) {
            log_warn("replaced worker %d did not stop in %d ms; killing it",
                     (int)s->retiring[i].pid, SUPER_STOP_GRACE_MS);
            kill(s->retiring[i].pid, SIGKILL);
            s->retiring[i].kill_at_ms = now + 5000;
        }
    }
    for (int i = 0; i <= s->n; i++) {
        struct proc *p = &s->procs[i];
        if (p->pid == 0 && p->restart_at_ms != 0 && p->restart_at_ms <= now
            && !(p->role == PROC_KEEPER && s->keeper_hold))
            super_proc_start(s, p, now);
    }
}

/* Makes the table and forks the workers and, with reserves on, the keeper
 * (an upgrade's new binary: once the old one's has gone). */
static void super_start(struct super *s, int64_t now)
{
    s->procs = xcalloc((size_t)s->n + 1, sizeof(*s->procs));
    for (int i = 0; i <= s->n; i++) {
        s->procs[i].role = i < s->n ? PROC_WORKER : PROC_KEEPER;
        s->procs[i].index = i < s->n ? i : -1;
    }
    for (int i = 0; i < s->n; i++)
        super_proc_start(s, &s->procs[i], now);
    if (s->keeper_hold)
        super_keeper(s)->restart_at_ms = keeper_wanted(s->conf) ? now : 0;
    else
        super_proc_start(s, super_keeper(s), now);
}

/* One signal the supervisor waits for (super_sigs), as it came. */
static void super_on_signal(struct super *s, int sig, const siginfo_t *si, int64_t now)
{
    if (sig == SIGTERM || sig == SIGINT)
        super_on_stop(s, now);
    else if (sig == SIGHUP && !s->stopping && s->upgrade_pid > 0)
        log_warn("reload refused while an upgrade is under way");
    else if (sig == SIGHUP && !s->stopping && upgrade_binary_replaced()) {
        /* systemctl reload after a package upgrade: rolling the workers
         * would fork the old build again. */
        log_notice("reload: the binary on disk is a new build; upgrading in place");
        super_on_upgrade(s, now);
    } else if (sig == SIGHUP && !s->stopping)
        super_on_reload(s, now);
    else if (sig == SIGUSR2 && !s->stopping)
        super_on_upgrade(s, now);
    else if (sig == SIGQUIT && s->upgrade_pid > 0 && si->si_pid == s->upgrade_pid && !s->stopping)
        super_on_handover(s, now);
    else if (sig == SIGUSR1 && s->keeper_hold && si->si_pid == s->from_pid)
        super_keeper_release(s, now);
    else if (sig == SIGQUIT || sig == SIGUSR1)
        log_warn("SIG%s from pid %d ignored (only an upgrade's own supervisors send it)",
                 sig == SIGQUIT ? "QUIT" : "USR1", (int)si->si_pid);
}

/* The end of super_run(): the socket, the list copy and the segment go
 * unless handed over, or never taken over (then they are the other
 * supervisor's). */
static void super_close(struct super *s)
{
    const struct cs_conf *conf = s->conf;
    int keep = s->handover || (s->from_pid > 0 && !s->takeover_sent);
    const char *path = unix_path(conf->fcgi_listen);

    if (!keep && s->own_socket && path != NULL)
        unlink(path);
    close(s->listen_fd);
    if (!keep)
        listcopy_unlink(s->shm, conf->fcgi_shm_name);
    shm_node_close(s->shm);
    if (!keep)
        shm_node_unlink(conf->fcgi_shm_name);
    free(s->procs);
    free(s->retiring);
    free(s);
    if (keep)
        log_notice("coupon-fcgi %d stopped; the node is the other supervisor's",
                   (int)getpid());
    else
        log_notice("coupon-fcgi stopped");
}

int super_run(struct cs_conf *conf, const char *conf_path, int listen_fd, int own_socket,
              const struct upgrade_from *from)
{
    char err[320];
    /* The new binary of an upgrade shares the node segment with the old
     * one's workers (the group commit's queues, the worker registry, the
     * reserves' slots and grants): only one of this very layout will do. */
    struct shm_node *shm = shm_node_open(conf->fcgi_shm_name,
                                         from != NULL ? SHM_OPEN_EXISTING : SHM_OPEN_FRESH, err,
                                         sizeof(err));
    if (shm == NULL) {
        log_error("%s%s", from != NULL ? "upgrade refused: " : "", err);
        return 1;
    }

    /* The new binary of an upgrade inherits these blocked (upgrade_exec()). */
    sigemptyset(&super_sigs);
    sigaddset(&super_sigs, SIGCHLD);
    sigaddset(&super_sigs, SIGTERM);
    sigaddset(&super_sigs, SIGINT);
    sigaddset(&super_sigs, SIGHUP);
    sigaddset(&super_sigs, SIGUSR1);
    sigaddset(&super_sigs, SIGUSR2);
    sigaddset(&super_sigs, SIGQUIT);
    sigprocmask(SIG_BLOCK, &super_sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct super *s = xcalloc(1, sizeof(*s));
    s->conf = conf;
    s->conf_path = conf_path;
    s->listen_fd = listen_fd;
    s->own_socket = own_socket;
    s->shm = shm;
    s->n = conf->fcgi_workers;
    if (from != NULL) {
        s->from_pid = from->old_pid;
        s->keeper_hold = 1;
        s->takeover_by = cs_mono_ms() + UPGRADE_READY_MS;
    }
    super_start(s, cs_mono_ms());
    log_notice("coupon-fcgi supervisor %d serving %s with %d workers%s", (int)getpid(),
               conf->fcgi_listen, s->n, from != NULL ? " (upgrade)" : "");
    /* The new binary of an upgrade is no main process yet: the old one
     * names it (super_on_handover()). */
    if (from == NULL) {
        sdnotify_ready();
        sdnotify_status("%d workers", s->n);
    }

    int rc = 0;
    for (;;) {
        /* Quick turns while the new binary waits for its workers. */
        struct timespec ts = {0, (s->from_pid > 0 && !s->takeover_sent ? 10 : 200) * 1000000L};
        siginfo_t si;
        int sig = sigtimedwait(&super_sigs, &si, &ts);
        int64_t now = cs_mono_ms();

        if (sig > 0)
            super_on_signal(s, sig, &si, now);
        super_reap(s, now);
        if (!s->stopping && super_takeover_tick(s, now)) {
            super_on_stop(s, now);
            rc = 1;
        }
        if (s->stopping) {
            if (super_stop_tick(s, now))
                break;
            continue;
        }
        super_tick(s, now);
    }

    super_close(s);
    return rc;
}
