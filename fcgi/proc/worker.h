/* worker.h - one prefork worker: its connections, caches and the loop that
 * accepts its requests one at a time. Handlers get the worker's state as a
 * struct node_ctx (node/ctx.h); none of them calls into the loop. */
#ifndef CS_WORKER_H
#define CS_WORKER_H

#include <stdatomic.h>

#include "node/ctx.h"

struct shm_node;

/* Set by SIGTERM: finish the request in flight, then leave the accept loop. */
extern _Atomic int worker_stop;

/* Runs the accept loop on listen_fd until worker_stop. Returns the exit code. */
int worker_main(const struct cs_conf *conf, int listen_fd, struct shm_node *shm, int index);

#endif
