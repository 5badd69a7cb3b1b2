/* ctx.h - what a request's handler gets from the process that runs it: the
 * node's connections, caches and segment, and the seize's after-answer work.
 * The process layer (fcgi/proc/) fills one in and owns its lifetime; routes
 * (fcgi/api/) and the seize machinery (fcgi/node/) only use it, so nothing
 * below fcgi/proc/ includes a process header (doc/internals.md, L). */
#ifndef CS_NODE_CTX_H
#define CS_NODE_CTX_H

#include "req/auth.h"
#include "rconn.h"
#include "reserve.h"

struct cs_conf;
struct shm_node;
struct meta;
struct mconn;

struct node_ctx {
    const struct cs_conf *conf;
    struct rconn *rc;
    struct rscript script;
    struct shm_node *shm;
    struct meta *meta;
    struct mconn *mc;          /* admin routes only; connected on first use */
    struct auth_cfg auth;
    int index;                 /* the worker's number, for answers and logs */
    int slot;                  /* in the node's worker registry; -1 none */
    struct reserve_journal rj; /* grants from the node's reserve */
    /* A seize found Redis silent for a budget: once its user is answered,
     * the process asks Redis whether it is there (breaker_seize_ask()). */
    int ask_pending;
    int ask_shard;
    struct rconn_site ask_site;
    int ask_slot;              /* >= 0: ask_site is the slot map's node for it */
};

#endif
