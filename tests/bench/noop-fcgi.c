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
#include "prefork.h"

#include <fcgiapp.h>

#include <stdio.h>
#include <unistd.h>

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
            if (prefork_parse_long(optarg, 1, PREFORK_MAX_WORKERS, &workers) != 0) {
                fprintf(stderr, "noop-fcgi: -n wants 1..%d\n", PREFORK_MAX_WORKERS);
                return 2;
            }
            break;
        case 'b':
            if (prefork_parse_long(optarg, 1, 65535, &backlog) != 0) {
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
    return prefork_run("noop-fcgi", path, backlog, workers, noop_serve);
}
