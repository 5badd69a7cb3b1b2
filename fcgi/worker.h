/* worker.h - one prefork worker: its connections, caches and the request
 * being served. A worker serves one request at a time. */
#ifndef CS_WORKER_H
#define CS_WORKER_H

#include <fcgiapp.h>
#include <signal.h>
#include <stdint.h>

#include "auth.h"
#include "http.h"
#include "rconn.h"
#include "reserve.h"

struct cs_conf;
struct shm_node;
struct lcache;
struct mconn;
struct meta;

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
};

struct req {
    FCGX_Request *fr;
    FCGX_Stream *out;
    const char *method;
    char path[256];
    const char *query;
    const char *content_type;
    const char *authorization;
    const char *x_user_id;
    const char *x_user_role;
    int identity_twice;        /* a trusted identity param came more than once */
    long content_length;       /* -1 when absent */
    char *body;                /* NUL-terminated, owned by the worker */
    size_t body_len;
    int body_read;             /* the body is in body/body_len already */
    const char *idem_key;      /* Idempotency-Key header, or NULL */
    int route;
    enum cs_code code;         /* what was answered, for metrics */
    int64_t start_us;
    struct auth_identity who;  /* set by a successful req_auth() */
    char msg[160];             /* the msg answered by req_reply(), for the audit trail */
    const char *audit_action;  /* admin action to record after the handler, or NULL */
    int64_t audit_id;          /* activity the action was about (0: none known) */
};

/* Set by SIGTERM: finish the request in flight, then leave the accept loop. */
extern volatile sig_atomic_t worker_stop;

/* Runs the accept loop on listen_fd until worker_stop. Returns the exit code. */
int worker_main(const struct cs_conf *conf, int listen_fd, struct shm_node *shm, int index);

/* Answers the request; records the code for metrics. */
void req_reply(struct req *r, enum cs_code code, const char *msg, const char *extra,
               int retry_after_s);

/* Reads the JSON body within the configured cap. CS_OK, or CS_ERR after
 * answering 415 / 413 / 400. */
int req_read_body(struct worker *w, struct req *r);

/* Reads the body as it is, without judging it (none when absent or over
 * the cap: left to req_read_body); later req_read_body calls use what was
 * read. CS_OK, or CS_ERR after answering 400 (shorter than announced). */
int req_read_raw(struct worker *w, struct req *r);

/* For a POST whose body is optional (preheat): an empty body is fine when
 * no Content-Type or a JSON one was sent; any other Content-Type (a
 * cross-site form's text/plain, urlencoded or multipart) is 415, and a body
 * must be a JSON object sent as application/json (415 / 400). CS_OK with
 * the body read (possibly empty), else CS_ERR after answering. */
int req_read_optional_json(struct worker *w, struct req *r);

/* Authenticates the caller. need: 0 optional (returns CS_OK with
 * id->user_id 0 when no credential), 1 user, 2 admin. CS_ERR after answering
 * 401 / 403. */
int req_auth(struct worker *w, struct req *r, int need, struct auth_identity *id);

/* The node breaker, fed by seize-script calls only: worker_redis_allowed()
 * says whether a seize may be sent now (one probe at a time while open);
 * worker_redis_done() reports how the call went (RCONN_FAULT_NONE: a script
 * answer came back). Reads elsewhere never feed it: a Redis that answers
 * reads but refuses writes must keep it open. */
int worker_redis_allowed(struct worker *w);
void worker_redis_done(struct worker *w, enum rconn_fault fault);

/* Whether a read (metadata, status) is worth trying: not while the breaker
 * is open because Redis is unreachable, until its open interval is over.
 * Reads never feed the breaker. */
int worker_redis_readable(const struct worker *w);

/* A new connection with coupon-sync's longer command timeout, for work that
 * moves more than a seize may wait for (preheat, the activity list, a
 * revoke). Unconnected until its first command; the caller frees it with
 * rconn_free(). */
struct rconn *worker_long_rconn(const struct worker *w);

/* The breaker of a seize on shard: the node's breaker on a single Redis,
 * the shard's own on a cluster (one master failing never turns away seizes
 * for shards the others serve). */
int worker_seize_allowed(struct worker *w, int shard);
void worker_seize_done(struct worker *w, int shard, enum rconn_fault fault);
/* A seize got no answer after Redis answered none for a whole budget: not
 * slow but gone (a stopped Redis), so the breaker opens at once rather than
 * after redis.breaker_failures more seizes each waited out their budget. */
void worker_seize_silent(struct worker *w, int shard);
/* Redis answered a seize script on shard (any reply): it is there, if slow. */
void worker_seize_answered(struct worker *w, int shard);
/* How long Redis has answered no seize on shard (ms), node-wide. */
int64_t worker_seize_silence_ms(struct worker *w, int shard);

/* Records for the metrics how many replicas a grant on shard waits for now
 * (copies; -1 unknown) under the durability rule. */
void worker_note_copies(struct worker *w, int shard, int copies);

/* On a cluster with redis.wait_replicas > 0: the durability rule for every
 * shard, read now (cached per master, see rconn_copies()) into copies[]
 * (-1: its master is unknown or down) and recorded for the metrics. Returns
 * how many shards run with fewer copies than asked; 0 otherwise. */
int worker_durability(struct worker *w, int copies[]);

/* Seconds a client should wait while Redis is unavailable. */
int worker_retry_after(const struct worker *w);

#endif
