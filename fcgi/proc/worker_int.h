/* worker_int.h - what the two accept loops of a worker share: the state of
 * one request handler (the worker, or one of its request threads) and the
 * serving of one accepted request. For fcgi/proc/ only. */
#ifndef CS_WORKER_INT_H
#define CS_WORKER_INT_H

#include <fcgiapp.h>
#include <stdint.h>

#include "node/ctx.h"

struct req;
struct shm_node;

/* Fills *w for one request handler: its own Redis and MySQL connections,
 * metadata cache and token verifier. index is the worker's number.
 * Returns CS_OK, or CS_ERR after logging why (undo with worker_fini()). */
int worker_init(struct node_ctx *w, const struct cs_conf *conf, struct shm_node *shm, int index);

/* Takes a slot of the node's worker registry under this process's pid (-1
 * when the registry is full: the handler grants nothing from reserves), just
 * before the handler accepts: an upgrade's new supervisor reads a worker
 * registered as one that accepts. quiet: no warning when the registry is
 * full (a retry before each new connection). */
void worker_register(struct node_ctx *w, int quiet);

/* Frees what worker_init() made and gives back its registry slot. */
void worker_fini(struct node_ctx *w);

/* Serves the request FCGX_Accept_r() just accepted on fr: routes it,
 * answers it, counts it, finishes it (the connection stays open when the
 * web server keeps it), then does the handler's after-answer work (the
 * breaker's question to a silent Redis, the release of an old journal
 * segment). body is the handler's buffer of fcgi.max_body + 1 bytes. */
void worker_serve(struct node_ctx *w, FCGX_Request *fr, struct req *r, char *body);

/* Accepts the next connection on listen_fd and waits up to 2 s for its
 * first bytes, which no signal cuts short (worker.c says why). Returns the
 * connection, to be put in an FCGX_Request's ipcFd whose listen_sock is -1,
 * with keepConnection set till the request is read (libfcgi's
 * FCGX_Accept_r() first finishes the last request, and closes its
 * connection unless kept), or -1 with errno set (worker_accept_transient()
 * tells whether to go on).
 * Safe from several threads at once. */
int worker_accept(int listen_fd);

/* Waits for the next request (or the end) of the kept connection fd: 1 once
 * it has something to read. Once stopping (stopping set, or wake_fd
 * readable), waits till *drain_until, set to drain_ms from the first such
 * wait, and returns 0 when that passes; -1 (logged) when poll() fails: the
 * caller closes the connection. The web server may send a request
 * on a kept connection the moment the worker closes it, and gets no answer
 * then (nginx: 502, a seize not sent again), so a stopping handler serves a
 * kept connection till the web server closes it or the drain is over. */
int worker_kept_wait(int fd, int wake_fd, int stopping, int64_t *drain_until, int drain_ms);

/* 1 when an accept that failed with err is worth trying again at once. */
int worker_accept_transient(int err);

/* The accept loops of a worker with fcgi.threads > 1 (worker_threads.c):
 * runs till SIGTERM or SIGINT, then lets every thread finish the request it
 * has. Returns the exit code. */
int worker_threads_main(const struct cs_conf *conf, int listen_fd, struct shm_node *shm,
                        int index);

#endif
