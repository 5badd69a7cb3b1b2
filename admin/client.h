/* client.h - couponseize-admin's one request to the admin API: FastCGI
 * straight to coupon-fcgi's socket, or HTTP/1.1 through the web server. */
#ifndef CS_ADMIN_CLIENT_H
#define CS_ADMIN_CLIENT_H

#include <stddef.h>

enum client_kind { CLIENT_FCGI_UNIX, CLIENT_FCGI_TCP, CLIENT_HTTP };

/* Where requests go. */
struct client_target {
    enum client_kind kind;
    char host[256];     /* FCGI_TCP, HTTP */
    char port[16];      /* FCGI_TCP, HTTP */
    char path[512];     /* FCGI_UNIX: the socket; HTTP: a prefix before /market/ ("" none) */
};

/* Parses URL into *t: "http://HOST[:PORT][/PREFIX]" (through a web server;
 * plain HTTP only), "fcgi:/PATH" or "unix:/PATH" or "/PATH" (FastCGI on a
 * unix socket), "fcgi://HOST:PORT" or "HOST:PORT" (FastCGI over TCP): the
 * forms fcgi.listen takes, plus http://. CS_OK, or CS_ERR with a message in
 * err. */
int client_parse(const char *url, struct client_target *t, char *err, size_t errlen);

/* One request. */
struct client_req {
    const char *method;    /* "GET", "POST", "PUT" */
    const char *path;      /* "/market/admin/...", with "?query" when any */
    const char *body;      /* JSON or NULL */
    const char *token;     /* bearer token or NULL; never logged */
    const char *idem_key;  /* Idempotency-Key or NULL */
    const char *user_id;   /* trusted-header mode over FastCGI: the caller, else NULL */
    int timeout_ms;        /* for the whole exchange */
};

/* What came back. */
struct client_resp {
    int status;            /* HTTP status */
    char *body;            /* NUL-terminated, malloc'd; the caller frees it */
    size_t len;
    int sent;              /* 1 once the request was being sent: with no answer, it
                            * may have been done */
};

/* Sends req to t and reads the whole answer into *resp. CS_OK with an answer
 * (of any status), or CS_ERR when no answer came (connect refused, timeout,
 * a malformed answer) with a message in err; *resp is then empty. */
int client_do(const struct client_target *t, const struct client_req *req,
              struct client_resp *resp, char *err, size_t errlen);

#endif
