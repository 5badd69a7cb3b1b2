/* prefork.c - the prefork parent of the benchmark's bare FastCGI responders. */
#include "prefork.h"

#include <fcgiapp.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t prefork_stop;

static void prefork_on_signal(int sig)
{
    (void)sig;
    prefork_stop = 1;
}

int prefork_parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* Forks n workers on listen_fd and waits. Returns the exit status. */
static int prefork_workers(const char *prog, int listen_fd, long n, int (*serve)(int))
{
    pid_t pids[PREFORK_MAX_WORKERS];
    long started = 0;
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = prefork_on_signal;
    sigemptyset(&sa.sa_mask);
    /* No SA_RESTART: waitpid() must return when we are told to stop. */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    for (; started < n && started < PREFORK_MAX_WORKERS; started++) {
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "%s: fork(): %s\n", prog, strerror(errno));
            break;
        }
        if (pid == 0) {
            signal(SIGTERM, SIG_DFL);
            signal(SIGINT, SIG_DFL);
            _exit(serve(listen_fd));
        }
        pids[started] = pid;
    }

    long alive = started;
    while (alive > 0 && !prefork_stop) {
        if (waitpid(-1, NULL, 0) > 0)
            alive--;
        else if (errno == ECHILD)
            break;
    }
    for (long i = 0; i < started; i++)
        kill(pids[i], SIGTERM);
    while (waitpid(-1, NULL, 0) > 0 || errno == EINTR)
        ;
    return started == n ? 0 : 1;
}

int prefork_run(const char *prog, const char *path, long backlog, long workers,
                int (*serve)(int listen_fd))
{
    if (path[0] != ':')
        unlink(path); /* a stale socket from a killed run would make bind() fail */
    int fd = FCGX_OpenSocket(path, (int)backlog);
    if (fd < 0) {
        fprintf(stderr, "%s: FCGX_OpenSocket(%s) failed: %s\n", prog, path, strerror(errno));
        return 1;
    }
    int rc = prefork_workers(prog, fd, workers, serve);
    close(fd);
    if (path[0] != ':')
        unlink(path);
    return rc;
}
