/* worker.h - one prefork worker: its connections, caches and the loop that
 * accepts its requests one at a time. Handlers get the worker's state
 * (struct worker); none of them calls into the loop. */
#ifndef CS_WORKER_H
#define CS_WORKER_H

#include <signal.h>

#include "auth.h"
#include "rconn.h"
#include "reserve.h"

struct cs_conf;
struct shm_node;
struct meta;
struct mconn;

struct worker {
    const struct cs_conf *conf;
    struct rconn *rc;
    struct rscript script;
    struct shm_node *shm;
    struct meta *meta;
    struct mconn *mc;          /* admin routes only; connected on first use */
    struct auth_cfg auth;
    int index;
    int slot;                  /* in the node's worker registry; -1 none */
    struct reserve_journal rj; /* grants from the node's reserve */
    /* A seize found Redis silent for a budget: once its user is answered,
     * the loop asks Redis whether it is there (breaker_seize_ask()). */
    int ask_pending;
    int ask_shard;
    struct rconn_site ask_site;
    int ask_slot;              /* >= 0: ask_site is the slot map's node for it */
};

/* Set by SIGTERM: finish the request in flight, then leave the accept loop. */
extern volatile sig_atomic_t worker_stop;

/* Runs the accept loop on listen_fd until worker_stop. Returns the exit code. */
int worker_main(const struct cs_conf *conf, int listen_fd, struct shm_node *shm, int index);

#endif
