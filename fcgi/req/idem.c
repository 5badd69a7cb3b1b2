/* idem.c - Idempotency-Key on admin writes: a repeated key answers what the
 * first request with it answered, and changes nothing. */
#include "idem.h"
#include "cs.h"
#include "http.h"
#include "log.h"
#include "mconn.h"
#include "req.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Keys are remembered for a day; older rows are deleted a few at a time by
 * the requests that bring new keys. */
#define SQL_IDEM_PURGE                                                                        \
    "DELETE FROM admin_idempotency WHERE created_at < NOW(3) - INTERVAL 1 DAY LIMIT 100"
#define SQL_IDEM_CLAIM                                                                        \
    "INSERT IGNORE INTO admin_idempotency (admin_sub, idem_key, request_method, "           \
    "request_path, request_body) VALUES (?, ?, ?, ?, ?)"
#define SQL_IDEM_GET                                                                          \
    "SELECT request_method, request_path, request_body, http_status, response_headers, "     \
    "response_body FROM admin_idempotency WHERE admin_sub = ? AND idem_key = ?"
#define SQL_IDEM_DONE                                                                         \
    "UPDATE admin_idempotency SET http_status = ?, response_headers = ?, response_body = ? " \
    "WHERE admin_sub = ? AND idem_key = ? AND http_status IS NULL"

struct idem_row {
    int found;
    int same;                  /* the same method, path and body */
    int status;                /* 0 while unanswered */
    char headers[256];
    char *body;                /* xmalloc'd */
};

struct idem_get {
    const struct req *r;
    struct idem_row *row;
};

static int idem_row_cb(void *arg, int ncols, char **c)
{
    struct idem_get *g = arg;
    struct idem_row *row = g->row;
    if (ncols != 6)
        return CS_ERR;
    row->found = 1;
    row->same = c[0] && c[1] && c[2] && strcmp(c[0], g->r->method) == 0
                && strcmp(c[1], g->r->path) == 0 && strlen(c[2]) == g->r->body_len
                && memcmp(c[2], g->r->body, g->r->body_len) == 0;
    row->status = c[3] ? atoi(c[3]) : 0;
    snprintf(row->headers, sizeof(row->headers), "%s", c[4] ? c[4] : "");
    free(row->body);
    row->body = xstrdup(c[5] ? c[5] : "");
    return CS_OK;
}

/* The key as sent, or the inside of an RFC 8941 sf-string ("..."), which is
 * how the httpapi draft writes it. 1..255 printable ASCII, no quote or
 * backslash inside. CS_OK with the key in out, else CS_ERR. */
static int idem_key_parse(const char *h, char *out, size_t outlen)
{
    size_t n = strlen(h);
    if (n >= 2 && h[0] == '"' && h[n - 1] == '"') {
        h++;
        n -= 2;
    }
    if (n == 0 || n > 255 || n >= outlen)
        return CS_ERR;
    for (size_t i = 0; i < n; i++)
        if (h[i] < 0x21 || h[i] > 0x7e || h[i] == '"' || h[i] == '\\')
            return CS_ERR;
    memcpy(out, h, n);
    out[n] = '\0';
    return CS_OK;
}

static void idem_mysql_down(struct mconn *mc, struct req *r)
{
    req_mysql_fail(r, mc, "admin_idempotency", "MySQL unavailable; nothing was done");
}

/* Answers the stored answer again, marked as a replay. */
static void idem_replay(struct req *r, const struct idem_row *row)
{
    char headers[320];
    snprintf(headers, sizeof(headers), "%sIdempotent-Replayed: true\r\n", row->headers);
    r->code = CODE_OK;
    snprintf(r->msg, sizeof(r->msg), "replay");
    http_reply_raw(r->out, row->status, "application/json; charset=utf-8", row->body,
                   strlen(row->body), headers);
}

enum idem_step idem_begin(struct mconn *mc, struct req *r, struct idem_claim *ic)
{
    char *key = ic->key, *sub = ic->sub;
    struct idem_row row = {0};
    struct auth_identity who;

    if (idem_key_parse(r->idem_key, key, sizeof(ic->key)) != CS_OK) {
        req_reply(r, CODE_BAD_REQUEST, "Idempotency-Key must be 1..255 printable ASCII characters",
                  NULL, 0);
        return IDEM_ANSWERED;
    }
    /* Only an admin's key is remembered: anyone else gets the handler's own
     * 401 / 403 without a row. The body is read once, here, and the handler
     * reads it from r. */
    if (req_auth(r, 2, &who) != CS_OK || req_read_raw(r) != CS_OK)
        return IDEM_ANSWERED;
    snprintf(sub, sizeof(ic->sub), "%" PRId64, who.user_id);

    uint64_t claimed = 0;
    struct mval claim[] = {
        MV_TXT(sub, strlen(sub)),          MV_TXT(key, strlen(key)),
        MV_TXT(r->method, strlen(r->method)), MV_TXT(r->path, strlen(r->path)),
        MV_TXT(r->body, r->body_len),
    };
    if (mconn_exec(mc, SQL_IDEM_PURGE, NULL, 0, NULL) != CS_OK
        || mconn_exec(mc, SQL_IDEM_CLAIM, claim, (int)CS_ARRAY_LEN(claim), &claimed) != CS_OK) {
        idem_mysql_down(mc, r);
        return IDEM_ANSWERED;
    }
    if (claimed == 0) {
        struct idem_get g = {r, &row};
        if (mconn_query(mc, SQL_IDEM_GET, claim, 2, idem_row_cb, &g) != CS_OK) {
            idem_mysql_down(mc, r);
        } else if (!row.found) {
            /* Purged between the two statements: a day old, so not a retry. */
            req_reply(r, CODE_IDEMPOTENCY_KEY_IN_USE, NULL, NULL, 1);
        } else if (!row.same) {
            req_reply(r, CODE_IDEMPOTENCY_KEY_REUSED, NULL, NULL, 0);
        } else if (row.status == 0) {
            req_reply(r, CODE_IDEMPOTENCY_KEY_IN_USE, NULL, NULL, 1);
        } else {
            idem_replay(r, &row);
        }
        free(row.body);
        return IDEM_ANSWERED;
    }

    http_capture_start(&ic->cap);
    return IDEM_RUN;
}

void idem_end(struct mconn *mc, struct idem_claim *ic)
{
    struct http_capture *cap = &ic->cap;

    http_capture_stop();
    if (cap->status == 0) {
        free(cap->body);
        return;
    }
    struct mval done[] = {
        MV_INT(cap->status),
        MV_TXT(cap->headers, strlen(cap->headers)),
        MV_TXT(cap->body, cap->len),
        MV_TXT(ic->sub, strlen(ic->sub)),
        MV_TXT(ic->key, strlen(ic->key)),
    };
    /* Not recorded: a retry answers IDEMPOTENCY_KEY_IN_USE, never a second run. */
    if (mconn_exec(mc, SQL_IDEM_DONE, done, (int)CS_ARRAY_LEN(done), NULL) != CS_OK)
        log_error("admin_idempotency: the answer to key %s of admin %s was not recorded: %s",
                  ic->key, ic->sub, mc->errstr);
    free(cap->body);
}
