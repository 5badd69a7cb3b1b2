/* req.h - one request as a handler sees it, and the helpers that answer
 * it, read its body and authenticate its caller. */
#ifndef CS_REQ_H
#define CS_REQ_H

#include <fcgiapp.h>
#include <stdint.h>

#include "auth.h"
#include "http.h"

struct mconn;

/* The routes, for the metrics (per route and code) and the route table. */
enum route_id {
    ROUTE_SEIZE,
    ROUTE_STATUS,
    ROUTE_PREHEAT,
    ROUTE_REVOKE,
    ROUTE_HEALTH,
    ROUTE_METRICS,
    ROUTE_ACTIVITY,
    ROUTE_RECONCILE,
    ROUTE_MINE,
    ROUTE_USE,
    ROUTE_RELEASE,
    ROUTE_RESERVES,
    ROUTE_RESERVE_RETURN,
    ROUTE_OTHER,
    ROUTE__COUNT
};

/* The name of each route in the metrics' route="..." label. */
extern const char *const route_names[ROUTE__COUNT];

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
    long max_body;             /* fcgi.max_body: no body past it is read */
    const struct auth_cfg *auth; /* how req_auth() checks a caller */
    size_t body_len;
    int body_read;             /* the body is in body/body_len already */
    const char *idem_key;      /* Idempotency-Key header, or NULL */
    int route;                 /* enum route_id, for metrics */
    enum cs_code code;         /* what was answered, for metrics */
    int64_t start_us;
    struct auth_identity who;  /* set by a successful req_auth() */
    char msg[160];             /* the msg answered by req_reply(), for the audit trail */
    const char *audit_action;  /* admin action to record after the handler, or NULL */
    int64_t audit_id;          /* activity the action was about (0: none known) */
};

/* Starts r on the accepted request fr: its FastCGI parameters, body the
 * worker's buffer of max_body + 1 bytes, auth how its caller is checked. */
void req_init(struct req *r, FCGX_Request *fr, char *body, long max_body,
              const struct auth_cfg *auth);

/* Ends the request fr (FCGX_Finish_r()), closing the connection at once
 * when its input has been read to the end. */
void req_finish(FCGX_Request *fr);

/* Answers the request; records the code for metrics. */
void req_reply(struct req *r, enum cs_code code, const char *msg, const char *extra,
               int retry_after_s);

/* Answers a MySQL failure of mc while doing `what` (logged with mc's error):
 * 503 UNAVAILABLE with Retry-After when MySQL failed or could not be reached;
 * 500 INTERNAL_ERROR when it refused for lack of a privilege (a grant to
 * fix, not an outage to wait out), logged as such. `done` is the answer's msg
 * in the first case (NULL: "MySQL unavailable"). */
void req_mysql_fail(struct req *r, const struct mconn *mc, const char *what, const char *done);

/* Reads the JSON body within the configured cap. CS_OK, or CS_ERR after
 * answering 415 / 413 / 400. */
int req_read_body(struct req *r);

/* Reads the body as it is, without judging it (none when absent or over
 * the cap: left to req_read_body); later req_read_body calls use what was
 * read. CS_OK, or CS_ERR after answering 400 (shorter than announced). */
int req_read_raw(struct req *r);

/* For a POST whose body is optional (preheat): an empty body is fine when
 * no Content-Type or a JSON one was sent; any other Content-Type (a
 * cross-site form's text/plain, urlencoded or multipart) is 415, and a body
 * must be a JSON object sent as application/json (415 / 400). CS_OK with
 * the body read (possibly empty), else CS_ERR after answering. */
int req_read_optional_json(struct req *r);

/* Authenticates the caller. need: 0 optional (returns CS_OK with
 * id->user_id 0 when no credential), 1 user, 2 admin. CS_ERR after answering
 * 401 / 403. */
int req_auth(struct req *r, int need, struct auth_identity *id);

/* An admin's action on one activity: authenticated (need 2), the body read
 * and exactly {"id": N} (400 BAD_REQUEST otherwise), the id audited. CS_OK
 * with *id, else CS_ERR after answering. */
int req_admin_id(struct req *r, struct auth_identity *who, int64_t *id);

#endif
