/* worker_int.h - what the two accept loops of a worker share: the state of
 * one request handler (the worker, or one of its request threads) and the
 * serving of one accepted request. For fcgi/proc/ only. */
#ifndef CS_WORKER_INT_H
#define CS_WORKER_INT_H

#include <fcgiapp.h>
#include <stdatomic.h>
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

/* What one request handler (the one-request worker, or one request thread)
 * needs to take its next request: the listening socket, the descriptor made
 * readable at its stop, its stop flag, the flag its stopper reads to know
 * it may be blocked in accept(), and the drain of a kept connection. */
struct worker_src {
    int listen_fd;
    int wake_fd;
    _Atomic int *stop;
    _Atomic int *accepting;
    int drain_ms;              /* fcgi.kept_drain_ms */
    int64_t drain_until;       /* set at the stop, when a kept connection is open */
    char who[40];              /* "worker 3" or "worker 3 thread 1", for the log */
};

/* Takes the next request on fr for handler nc: a new connection
 * (worker_accept(); the registry slot taken again first while the registry
 * was full), or the next request of a kept one (worker_kept_wait()), read
 * by FCGX_Accept_r(). WORKER_NEXT_SERVE: fr holds a request to serve;
 * WORKER_NEXT_AGAIN: none this time (a connection that ended, a client gone
 * or silent), call again; WORKER_NEXT_STOP: the handler stops (a kept
 * connection past its drain is left open in fr for the caller to close). */
enum { WORKER_NEXT_SERVE, WORKER_NEXT_AGAIN, WORKER_NEXT_STOP };
int worker_next(struct worker_src *src, struct node_ctx *nc, FCGX_Request *fr);

/* The accept loops of a worker with fcgi.threads > 1 (worker_threads.c):
 * runs till SIGTERM or SIGINT, then lets every thread finish the request it
 * has. Returns the exit code. */
int worker_threads_main(const struct cs_conf *conf, int listen_fd, struct shm_node *shm,
                        int index);

#endif
