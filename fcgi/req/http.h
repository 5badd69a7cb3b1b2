/* http.h - response codes of the API, JSON body parsing and reply writing. */
#ifndef CS_HTTP_H
#define CS_HTTP_H

#include <fcgiapp.h>
#include <stddef.h>
#include <stdint.h>

/* Every response carries one of these as "code" (doc/api.md). */
enum cs_code {
    CODE_OK,
    CODE_SEIZED,
    CODE_ALREADY_SEIZED,
    CODE_SOLD_OUT,
    CODE_NOT_STARTED,
    CODE_ENDED,
    CODE_VOIDED,
    CODE_NO_SUCH_ACTIVITY,
    CODE_BAD_REQUEST,
    CODE_UNAUTHORIZED,
    CODE_FORBIDDEN,
    CODE_NOT_FOUND,
    CODE_METHOD_NOT_ALLOWED,
    CODE_TOO_LARGE,
    CODE_UNSUPPORTED_MEDIA_TYPE,
    CODE_TOO_MANY_REQUESTS,
    CODE_UNAVAILABLE,
    CODE_UNKNOWN_OUTCOME,
    CODE_INTERNAL_ERROR,
    CODE_IDEMPOTENCY_KEY_IN_USE,
    CODE_IDEMPOTENCY_KEY_REUSED,
    CODE_NOT_ELIGIBLE,
    CODE_NO_SUCH_COUPON,
    CODE_ALREADY_USED,
    CODE_EXPIRED,
    CODE_UNUSED,
    CODE_LEASE_NOT_EXPIRED,
    CODE_NO_OPEN_RESERVE,
    CODE_RESERVE_NOT_IN_REDIS,
    CODE__COUNT
};

int http_code_status(enum cs_code code);      /* 200, 409, ... */
const char *http_code_name(enum cs_code code); /* "SEIZED", ... */
const char *http_code_msg(enum cs_code code);  /* default human message */

/* Parses a seize/revoke body of len bytes: one valid JSON document (RFC 8259,
 * UTF-8, no byte-order mark, nothing after it) that is an object with exactly
 * one member named "id", its name written without escapes, whose value is a
 * JSON integer 1..2^63-1 without sign, fraction or exponent. Other members
 * are allowed and ignored. A duplicate "id", or a name such as "\u0069d"
 * that decodes to "id", is an error: any other JSON reader of the same body
 * then reads the same id or refuses it too. Returns CS_OK with *id, or
 * CS_ERR with a short reason in *why (a static string). */
int http_parse_id_body(const char *body, size_t len, int64_t *id, const char **why);

/* Checks a body of len bytes before cJSON reads it: one valid JSON document
 * (as http_parse_id_body() takes it: RFC 8259, UTF-8, no byte-order mark,
 * nothing after it) in which no string, member name or value, holds U+0000.
 * cJSON keeps no string lengths and cuts a string at "\u0000", so once this
 * passed, strlen() of a cJSON string is its whole length. Returns CS_OK, or
 * CS_ERR with a short reason in *why (a static string). */
int http_json_check(const char *body, size_t len, const char **why);

/* True when the Content-Type names JSON (application/json, any parameters). */
int http_is_json_type(const char *content_type);

/* Finds "name=value" in a query string; copies the value (maybe empty) (not unescaped,
 * truncated to outlen-1) and returns CS_OK, or CS_ERR when absent. */
int http_query_param(const char *query, const char *name, char *out, size_t outlen);

/* The integer query parameter name: *out = dflt when absent; CS_ERR when
 * present but not a decimal integer within [lo, hi]. */
int http_query_int(const char *query, const char *name, int64_t dflt, int64_t lo, int64_t hi,
                   int64_t *out);

/* Writes a complete response: status line, JSON headers, optional
 * Retry-After (retry_after_s > 0), and the body {"code","msg"[,extra]}.
 * extra, when not NULL, is a JSON fragment of members without braces,
 * e.g. "\"activityId\":5". msg NULL uses the default message; msg is
 * written as is, so it MUST NOT contain characters that need JSON escaping. */
void http_reply(FCGX_Stream *out, enum cs_code code, const char *msg, const char *extra,
                int retry_after_s);

/* http_reply() with extra header lines ("Name: value\r\n"..., or NULL)
 * in place of Retry-After. */
void http_reply_with(FCGX_Stream *out, enum cs_code code, const char *msg, const char *extra,
                     const char *headers);

/* Writes a response with a body built by the caller, plus optional extra
 * header lines ("Name: value\r\n"..., or NULL). */
void http_reply_raw(FCGX_Stream *out, int status, const char *content_type, const char *body,
                    size_t len, const char *headers);

/* A copy of the answer written while a capture is on (Idempotency-Key). */
struct http_capture {
    int status;                /* 0 until an answer was written */
    char headers[256];         /* the extra header lines, cut to fit */
    char *body;                /* xmalloc'd; the caller frees it */
    size_t len;
};

/* From now until http_capture_stop(), every answer written is also copied
 * into *c (the last one wins). One capture at a time per process: a worker
 * serves one request at a time. */
void http_capture_start(struct http_capture *c);
void http_capture_stop(void);

#endif
