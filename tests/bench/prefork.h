/* prefork.h - what the benchmark's bare FastCGI responders (noop-fcgi,
 * floor-fcgi) share: their option parsing of numbers, and a parent that binds
 * the socket, forks the workers and stops them on SIGTERM or SIGINT. */
#ifndef CS_BENCH_PREFORK_H
#define CS_BENCH_PREFORK_H

#define PREFORK_MAX_WORKERS 1024

/* Parses s as a decimal in lo..hi into *out: 0, or -1 when it is not one. */
int prefork_parse_long(const char *s, long lo, long hi, long *out);

/*
 * Binds the unix socket PATH (":PORT" for TCP) with BACKLOG, forks WORKERS
 * processes that each return serve(listen_fd) as their exit status, and waits.
 * SIGTERM or SIGINT to the parent stops the workers; the socket is removed
 * on the way out. FCGX_Init() MUST have run. Messages go to stderr prefixed
 * with PROG. Returns the parent's exit status: 0 when every worker started.
 */
int prefork_run(const char *prog, const char *path, long backlog, long workers,
                int (*serve)(int listen_fd));

#endif
