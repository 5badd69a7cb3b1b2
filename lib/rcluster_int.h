/* rcluster_int.h - the parts of a cluster connection shared by rcluster.c
 * (routing, pipelines) and rcluster_copies.c (the durability rule);
 * not part of the library's interface. */
#ifndef CS_RCLUSTER_INT_H
#define CS_RCLUSTER_INT_H

#include "rcluster.h"
#include "rconn.h"

#include <stdint.h>

#define RC_NO_NODE 0xff
#define RC_BACKOFF_MIN_MS 5
#define RC_BACKOFF_MAX_MS 100
/* A reply that would end within this much of the deadline keeps the
 * command timeout: no setsockopt() per command for a few milliseconds. */
#define RC_ARM_SLACK_MS 10

struct rc_node {
    char host[64];
    int port;
    redisContext *ctx;
    uint64_t conn_id;          /* rc->conn_seq when ctx was opened */
    int armed_ms;              /* receive timeout set on ctx */
    int64_t retry_at_ms;       /* monotonic; no reconnect before this */
    int backoff_ms;
    int seed;
    /* The durability rule (rc_node_copies()). */
    int safe_alone;            /* 0 not checked on this connection, 1 its
                                  settings let it stand alone, -1 they do not */
    int copies;                /* replicas that could take over; -1 unknown */
    int64_t copies_ms;         /* when copies was read; 0 never */
};

/* One command of a pipeline. */
struct rc_pipe {
    char *cmd;
    size_t len;
    unsigned slot;
    int node;                  /* where it was sent; -1 not sent */
    redisReply *reply;
    int failed;                /* read failed: the connection is gone */
};

struct rcluster {
    struct rconn *rc;
    struct rcluster_shared *sh;
    struct rc_node nodes[RCLUSTER_MAX_NODES];
    int nnodes;
    /* The replica's settings decide whether it may fail over, and only the
     * masters are read: the longest bound any node asked for, -1 once one
     * had none (rc_node_copies_read()). */
    long long stale_max;
    int stale_unbounded;
    uint8_t slot_node[RCLUSTER_SLOTS];
    int have_map;
    int need_refresh;
    uint64_t seen_epoch;
    int64_t refresh_ms;        /* this process' latest refresh attempt */
    unsigned seed;             /* rand_r state for the jitter */

    struct rc_pipe *pipe;
    size_t npipe, cap, next;
    int reading;               /* replies of the pipeline have been collected */
    int64_t pipe_deadline;     /* of the pipeline's first append: resends keep it */
};

/* Closes node i after a failure; its next connect waits a growing backoff
 * unless the caller keeps its own (rconn_opts.no_backoff). */
void rc_node_fail(struct rcluster *cl, int i);

/* The connection to node i, opened now if needed; NULL with rc->err set. */
redisContext *rc_node_ctx(struct rcluster *cl, int i);

/* The deadline of a command started now: command_timeout_ms, or the
 * request deadline when nearer. */
int64_t rc_deadline(const struct rconn *rc);

/* Bounds the next reply on node i (connected) by deadline. CS_ERR, with
 * rc->err RCONN_ERR_DEADLINE, when it has passed: send nothing. */
int rc_arm(struct rcluster *cl, int i, int64_t deadline);

/* Refreshes when due: no map yet, a redirection or failure asked for one,
 * or another process of the node found the map changed. Throttled to one
 * refresh a second per process and one every 100 ms per node. */
void rc_maybe_refresh(struct rcluster *cl, int64_t deadline);

/* The node serving slot (any master for RCLUSTER_SLOTS), or -1. */
int rc_slot_node(struct rcluster *cl, unsigned slot);

#endif
