/* noop-fcgi.c - a FastCGI responder that does nothing: the benchmark's floor. */

/*
 * Every request gets "200 OK" and the same small JSON body, after its body
 * has been read and thrown away. Measuring it through the same web server and
 * load generator as coupon-fcgi shows how much of a latency or throughput
 * figure belongs to the web server and libfcgi rather than to couponseize.
 *
 *   noop-fcgi                    serve the listening socket on fd 0, as
 *                                spawn-fcgi (-F N) and systemd provide it
 *   noop-fcgi -s PATH [-n N]     bind the unix socket PATH (or ":PORT" for TCP)
 *                                itself and prefork N workers (default 4)
 *
 * In -s mode the parent only supervises: SIGTERM or SIGINT stops the workers
 * and removes the socket.
 */
#include <fcgiapp.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define NOOP_MAX_WORKERS 1024

#define NOOP_BODY "{\"code\":\"OK\",\"msg\":\"ok\"}"

/* Headers and body of the one answer; the length is counted by the compiler. */
static const char noop_reply_fmt[] =
    "Status: 200 OK\r\n"
    "Content-Type: application/json; charset=utf-8\r\n"
    "Content-Length: %zu\r\n"
    "\r\n"
    "%s";
static char noop_out[256];
static int noop_out_len;

static volatile sig_atomic_t noop_stop;

static void noop_on_signal(int sig)
{
    (void)sig;
    noop_stop = 1;
}

static void noop_usage(FILE *out)
{
    fprintf(out, "usage: noop-fcgi [-s PATH|:PORT] [-n WORKERS] [-b BACKLOG]\n"
                 "  without -s: serve the listening socket on fd 0 (spawn-fcgi)\n");
}

/* Answers requests on listen_fd until accept fails. Returns the exit status. */
static int noop_serve(int listen_fd)
{
    FCGX_Request req;
    char buf[4096];

    if (FCGX_InitRequest(&req, listen_fd, 0) != 0) {
        fprintf(stderr, "noop-fcgi: FCGX_InitRequest() failed\n");
        return 1;
    }
    while (FCGX_Accept_r(&req) >= 0) {
        /* Drain the body so the web server never sees a half-read request. */
        while (FCGX_GetStr(buf, (int)sizeof(buf), req.in) > 0)
            ;
        FCGX_PutStr(noop_out, noop_out_len, req.out);
        FCGX_Finish_r(&req);
    }
    FCGX_Free(&req, 1);
    return 0;
}

static int noop_parse_int(const char *s, long lo, long hi, long *out)
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
static int noop_prefork(int listen_fd, long n)
{
    pid_t pids[NOOP_MAX_WORKERS];
    long started = 0;
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = noop_on_signal;
    sigemptyset(&sa.sa_mask);
    /* No SA_RESTART: waitpid() must return when we are told to stop. */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    for (; started < n; started++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("noop-fcgi: fork()");
            break;
        }
        if (pid == 0) {
            signal(SIGTERM, SIG_DFL);
            signal(SIGINT, SIG_DFL);
            _exit(noop_serve(listen_fd));
        }
        pids[started] = pid;
    }

    long alive = started;
    while (alive > 0 && !noop_stop) {
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

int main(int argc, char **argv)
{
    const char *path = NULL;
    long workers = 4, backlog = 1024;
    int opt;

    while ((opt = getopt(argc, argv, "s:n:b:h")) != -1) {
        switch (opt) {
        case 's':
            path = optarg;
            break;
        case 'n':
            if (noop_parse_int(optarg, 1, NOOP_MAX_WORKERS, &workers) != 0) {
                fprintf(stderr, "noop-fcgi: -n wants 1..%d\n", NOOP_MAX_WORKERS);
                return 2;
            }
            break;
        case 'b':
            if (noop_parse_int(optarg, 1, 65535, &backlog) != 0) {
                fprintf(stderr, "noop-fcgi: -b wants 1..65535\n");
                return 2;
            }
            break;
        case 'h':
            noop_usage(stdout);
            return 0;
        default:
            noop_usage(stderr);
            return 2;
        }
    }
    if (optind != argc) {
        noop_usage(stderr);
        return 2;
    }

    noop_out_len = snprintf(noop_out, sizeof(noop_out), noop_reply_fmt, sizeof(NOOP_BODY) - 1,
                            NOOP_BODY);
    if (FCGX_Init() != 0) {
        fprintf(stderr, "noop-fcgi: FCGX_Init() failed\n");
        return 1;
    }
    if (path == NULL) {
        if (FCGX_IsCGI()) {
            fprintf(stderr, "noop-fcgi: fd 0 is not a listening socket; "
                            "run under spawn-fcgi or use -s PATH\n");
            return 2;
        }
        return noop_serve(0);
    }

    if (path[0] != ':')
        unlink(path); /* a stale socket from a killed run would make bind() fail */
    int fd = FCGX_OpenSocket(path, (int)backlog);
    if (fd < 0) {
        fprintf(stderr, "noop-fcgi: FCGX_OpenSocket(%s) failed: %s\n", path, strerror(errno));
        return 1;
    }
    int rc = noop_prefork(fd, workers);
    close(fd);
    if (path[0] != ':')
        unlink(path);
    return rc;
}
