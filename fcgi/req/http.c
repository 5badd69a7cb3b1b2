/* http.c - API response codes, strict request body parsing, reply writing. */
#include "http.h"
#include "cs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct {
    int status;
    const char *name;
    const char *msg;
} codes[CODE__COUNT] = {
    [CODE_OK] = {200, "OK", "ok"},
    [CODE_SEIZED] = {200, "SEIZED", "you got a coupon"},
    [CODE_ALREADY_SEIZED] = {409, "ALREADY_SEIZED", "one coupon per user per activity"},
    [CODE_SOLD_OUT] = {409, "SOLD_OUT", "all coupons of this activity are gone"},
    [CODE_NOT_STARTED] = {409, "NOT_STARTED", "the activity has not started yet"},
    [CODE_ENDED] = {409, "ENDED", "the activity has ended"},
    [CODE_VOIDED] = {409, "VOIDED", "the activity was revoked"},
    [CODE_NO_SUCH_ACTIVITY] = {404, "NO_SUCH_ACTIVITY", "no such activity"},
    [CODE_BAD_REQUEST] = {400, "BAD_REQUEST", "malformed request"},
    [CODE_UNAUTHORIZED] = {401, "UNAUTHORIZED", "missing or invalid token"},
    [CODE_FORBIDDEN] = {403, "FORBIDDEN", "admin role required"},
    [CODE_NOT_FOUND] = {404, "NOT_FOUND", "no such route"},
    [CODE_METHOD_NOT_ALLOWED] = {405, "METHOD_NOT_ALLOWED", "method not allowed on this route"},
    [CODE_TOO_LARGE] = {413, "TOO_LARGE", "request body too large"},
    [CODE_UNSUPPORTED_MEDIA_TYPE] = {415, "UNSUPPORTED_MEDIA_TYPE",
                                     "Content-Type must be application/json"},
    [CODE_TOO_MANY_REQUESTS] = {429, "TOO_MANY_REQUESTS", "too many requests, retry later"},
    [CODE_UNAVAILABLE] = {503, "UNAVAILABLE",
                          "service temporarily unavailable, nothing was issued; retry later"},
    [CODE_UNKNOWN_OUTCOME] = {503, "UNKNOWN_OUTCOME",
                              "no answer from the coupon store: the coupon may be yours; "
                              "check status or seize again"},
    [CODE_INTERNAL_ERROR] = {500, "INTERNAL_ERROR", "internal error"},
    [CODE_IDEMPOTENCY_KEY_IN_USE] = {409, "IDEMPOTENCY_KEY_IN_USE",
                                     "the first request with this Idempotency-Key has not been "
                                     "answered; retry with the same key shortly"},
    [CODE_IDEMPOTENCY_KEY_REUSED] = {422, "IDEMPOTENCY_KEY_REUSED",
                                     "this Idempotency-Key was used for another request"},
    [CODE_NOT_ELIGIBLE] = {403, "NOT_ELIGIBLE", "this activity is for other user groups"},
    [CODE_NO_SUCH_COUPON] = {404, "NO_SUCH_COUPON", "no such coupon"},
    [CODE_ALREADY_USED] = {409, "ALREADY_USED", "the coupon was used by another order"},
    [CODE_EXPIRED] = {409, "EXPIRED", "the coupon has expired"},
    [CODE_UNUSED] = {409, "UNUSED", "the coupon is not used by any order"},
    [CODE_LEASE_NOT_EXPIRED] = {409, "LEASE_NOT_EXPIRED",
                                "the node renewed its lease within fallback.lease_ms and may "
                                "still spend its reserve; retry once the lease is over"},
    [CODE_NO_OPEN_RESERVE] = {404, "NO_OPEN_RESERVE",
                              "no open reserve of that node incarnation for this activity"},
    [CODE_RESERVE_NOT_IN_REDIS] = {409, "RESERVE_NOT_IN_REDIS",
                                   "the epoch is open in MySQL but unknown to Redis (Redis lost "
                                   "its data?): a preheat restores it first"},
};

int http_code_status(enum cs_code code)
{
    return codes[code].status;
}

const char *http_code_name(enum cs_code code)
{
    return codes[code].name;
}

const char *http_code_msg(enum cs_code code)
{
    return codes[code].msg;
}

static const char *reason_phrase(int status)
{
    switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 503: return "Service Unavailable";
    default: return "Internal Server Error";
    }
}

/* The one JSON reader of request bodies. It checks the whole document
 * against RFC 8259 (UTF-8 included) and reads the top-level members on the
 * way, so no second parser can see another "id" than the one acted on. */
struct jscan {
    const char *p, *end;
    int depth;
    int nul;                   /* a string (name or value) holds \u0000 */
};

#define JSCAN_MAX_DEPTH 32

static void js_ws(struct jscan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

static int js_hex4(const char *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return CS_ERR;
    }
    *out = v;
    return CS_OK;
}

/* Length of the well-formed UTF-8 sequence at p (RFC 3629: no overlong
 * forms, no surrogates, nothing above U+10FFFF), or 0. */
static size_t js_utf8(const unsigned char *p, const unsigned char *end)
{
    unsigned char c = p[0];
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;

    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    if ((size_t)(end - p) < n || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF)
            return 0;
    return n;
}

/* Reads a string at the opening quote. When dec is not NULL, its decoded
 * text is compared with "id": *is_id is set when it decodes to exactly that,
 * *escaped when the raw text holds a backslash. */
static int js_string(struct jscan *s, int *is_id, int *escaped)
{
    char dec[3];
    size_t n = 0; /* decoded characters; dec holds the first two (0 = not ASCII) */

    s->p++;
    if (escaped)
        *escaped = 0;
    while (s->p < s->end) {
        unsigned char c = (unsigned char)*s->p;
        char ch = 0;
        if (c == '"') {
            s->p++;
            if (is_id)
                *is_id = n == 2 && dec[0] == 'i' && dec[1] == 'd';
            return CS_OK;
        }
        if (c < 0x20)
            return CS_ERR;
        if (c == '\\') {
            if (escaped)
                *escaped = 1;
            if (s->end - s->p < 2)
                return CS_ERR;
            switch (s->p[1]) {
            case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
                ch = s->p[1] == '"' || s->p[1] == '\\' || s->p[1] == '/' ? s->p[1] : 0;
                s->p += 2;
                break;
            case 'u': {
                unsigned u;
                if (s->end - s->p < 6 || js_hex4(s->p + 2, &u) != CS_OK)
                    return CS_ERR;
                s->p += 6;
                if (u >= 0x20 && u < 0x7F)
                    ch = (char)u;
                /* cJSON decodes it into a C string that ends there: the
                 * text after it would be read by one reader and not another. */
                if (u == 0)
                    s->nul = 1;
                /* A surrogate pair is one character; a lone surrogate is
                 * refused (RFC 7493 2.1), as cJSON and others refuse it. */
                if (u >= 0xDC00 && u <= 0xDFFF)
                    return CS_ERR;
                if (u >= 0xD800 && u <= 0xDBFF) {
                    if (s->end - s->p < 6 || s->p[0] != '\\' || s->p[1] != 'u'
                        || js_hex4(s->p + 2, &u) != CS_OK || u < 0xDC00 || u > 0xDFFF)
                        return CS_ERR;
                    s->p += 6;
                }
                break;
            }
            default:
                return CS_ERR;
            }
        } else if (c < 0x80) {
            ch = (char)c;
            s->p++;
        } else {
            size_t l = js_utf8((const unsigned char *)s->p, (const unsigned char *)s->end);
            if (l == 0)
                return CS_ERR;
            s->p += l;
        }
        if (n < 2)
            dec[n] = ch;
        n++;
    }
    return CS_ERR;
}

/* -? (0 | [1-9][0-9]*) (.[0-9]+)? ([eE][+-]?[0-9]+)? */
static int js_number(struct jscan *s)
{
    const char *p = s->p, *e = s->end;
#define DIGIT(q) ((q) < e && *(q) >= '0' && *(q) <= '9')
    if (p < e && *p == '-')
        p++;
    if (p < e && *p == '0')
        p++;
    else if (DIGIT(p))
        while (DIGIT(p))
            p++;
    else
        return CS_ERR;
    if (p < e && *p == '.') {
        p++;
        if (!DIGIT(p))
            return CS_ERR;
        while (DIGIT(p))
            p++;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < e && (*p == '+' || *p == '-'))
            p++;
        if (!DIGIT(p))
            return CS_ERR;
        while (DIGIT(p))
            p++;
    }
#undef DIGIT
    s->p = p;
    return CS_OK;
}

static int js_value(struct jscan *s);

/* Reads an array or object at its opening bracket (nested values only). */
static int js_container(struct jscan *s)
{
    char close = *s->p == '{' ? '}' : ']';

    if (++s->depth > JSCAN_MAX_DEPTH)
        return CS_ERR;
    s->p++;
    js_ws(s);
    if (s->p < s->end && *s->p == close) {
        s->p++;
        s->depth--;
        return CS_OK;
    }
    for (;;) {
        if (close == '}') {
            if (s->p >= s->end || *s->p != '"' || js_string(s, NULL, NULL) != CS_OK)
                return CS_ERR;
            js_ws(s);
            if (s->p >= s->end || *s->p != ':')
                return CS_ERR;
            s->p++;
            js_ws(s);
        }
        if (js_value(s) != CS_OK)
            return CS_ERR;
        js_ws(s);
        if (s->p >= s->end)
            return CS_ERR;
        if (*s->p == close) {
            s->p++;
            s->depth--;
            return CS_OK;
        }
        if (*s->p != ',')
            return CS_ERR;
        s->p++;
        js_ws(s);
    }
}

static int js_literal(struct jscan *s, const char *lit, size_t n)
{
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, lit, n) != 0)
        return CS_ERR;
    s->p += n;
    return CS_OK;
}

static int js_value(struct jscan *s)
{
    if (s->p >= s->end)
        return CS_ERR;
    switch (*s->p) {
    case '"': return js_string(s, NULL, NULL);
    case '{':
    case '[': return js_container(s);
    case 't': return js_literal(s, "true", 4);
    case 'f': return js_literal(s, "false", 5);
    case 'n': return js_literal(s, "null", 4);
    default: return js_number(s);
    }
}

int http_parse_id_body(const char *body, size_t len, int64_t *id, const char **why)
{
    struct jscan s = {body, body + len, 1, 0};
    const char *idv = NULL;
    size_t idl = 0;

    if (len == 0) {
        *why = "empty body";
        return CS_ERR;
    }
    /* Some parsers skip a byte-order mark and some refuse it: refused here. */
    if (len >= 3 && memcmp(body, "\xEF\xBB\xBF", 3) == 0) {
        *why = "body must not start with a byte-order mark";
        return CS_ERR;
    }
    js_ws(&s);
    if (s.p >= s.end || *s.p != '{') {
        *why = s.p < s.end && (*s.p == '[' || *s.p == '"' || *s.p == '-' || *s.p == 't'
                               || *s.p == 'f' || *s.p == 'n' || (*s.p >= '0' && *s.p <= '9'))
                   ? "body must be a JSON object"
                   : "body is not valid JSON";
        return CS_ERR;
    }
    s.p++;
    js_ws(&s);
    if (s.p < s.end && *s.p == '}')
        s.p++;
    else
        for (;;) {
            int is_id = 0, escaped = 0;
            if (s.p >= s.end || *s.p != '"' || js_string(&s, &is_id, &escaped) != CS_OK)
                goto invalid;
            if (is_id && escaped) {
                *why = "id must be written plainly, without escapes";
                return CS_ERR;
            }
            if (is_id && idv != NULL) {
                *why = "id appears more than once";
                return CS_ERR;
            }
            js_ws(&s);
            if (s.p >= s.end || *s.p != ':')
                goto invalid;
            s.p++;
            js_ws(&s);
            const char *v = s.p;
            if (js_value(&s) != CS_OK)
                goto invalid;
            if (is_id) {
                idv = v;
                idl = (size_t)(s.p - v);
            }
            js_ws(&s);
            if (s.p < s.end && *s.p == '}') {
                s.p++;
                break;
            }
            if (s.p >= s.end || *s.p != ',')
                goto invalid;
            s.p++;
            js_ws(&s);
        }
    js_ws(&s);
    /* Trailing bytes (a NUL inside the body included) make it invalid. */
    if (s.p != s.end)
        goto invalid;
    if (idv == NULL) {
        *why = "id is missing";
        return CS_ERR;
    }
    /* A JSON integer without sign, fraction or exponent, in 1..2^63-1. */
    if (*idv == '"' || *idv == '{' || *idv == '[' || *idv == 't' || *idv == 'f'
        || *idv == 'n') {
        *why = "id must be a JSON integer";
        return CS_ERR;
    }
    if (cs_parse_id(idv, idl, id) != CS_OK) {
        *why = "id must be an integer 1..9223372036854775807";
        return CS_ERR;
    }
    return CS_OK;
invalid:
    *why = "body is not valid JSON";
    return CS_ERR;
}

int http_json_check(const char *body, size_t len, const char **why)
{
    struct jscan s = {body, body + len, 0, 0};

    if (len >= 3 && memcmp(body, "\xEF\xBB\xBF", 3) == 0) {
        *why = "body must not start with a byte-order mark";
        return CS_ERR;
    }
    js_ws(&s);
    if (js_value(&s) != CS_OK) {
        *why = "body is not valid JSON";
        return CS_ERR;
    }
    js_ws(&s);
    if (s.p != s.end) {
        *why = "body is not valid JSON";
        return CS_ERR;
    }
    if (s.nul) {
        *why = "no string may hold a NUL character";
        return CS_ERR;
    }
    return CS_OK;
}

int http_is_json_type(const char *ct)
{
    static const char json[] = "application/json";
    if (ct == NULL)
        return 0;
    while (*ct == ' ')
        ct++;
    if (strncasecmp(ct, json, sizeof(json) - 1) != 0)
        return 0;
    ct += sizeof(json) - 1;
    return *ct == '\0' || *ct == ';' || *ct == ' ';
}

int http_query_param(const char *query, const char *name, char *out, size_t outlen)
{
    size_t nl = strlen(name);
    const char *p = query;

    while (p != NULL && *p != '\0') {
        const char *amp = strchr(p, '&');
        size_t seg = amp ? (size_t)(amp - p) : strlen(p);
        if (seg > nl && strncmp(p, name, nl) == 0 && p[nl] == '=') {
            size_t vl = seg - nl - 1;
            if (vl >= outlen)
                vl = outlen - 1;
            memcpy(out, p + nl + 1, vl);
            out[vl] = '\0';
            return CS_OK;
        }
        p = amp ? amp + 1 : NULL;
    }
    return CS_ERR;
}

int http_query_int(const char *query, const char *name, int64_t dflt, int64_t lo, int64_t hi,
                   int64_t *out)
{
    char buf[24];
    if (http_query_param(query, name, buf, sizeof(buf)) != CS_OK) {
        *out = dflt;
        return CS_OK;
    }
    char *end;
    long long v = strtoll(buf, &end, 10);
    if (buf[0] == '\0' || *end != '\0' || v < lo || v > hi)
        return CS_ERR;
    *out = v;
    return CS_OK;
}

/* Per thread: a worker's request threads each capture their own answer. */
static _Thread_local struct http_capture *capture;

void http_capture_start(struct http_capture *c)
{
    memset(c, 0, sizeof(*c));
    capture = c;
}

void http_capture_stop(void)
{
    capture = NULL;
}

void http_reply_raw(FCGX_Stream *out, int status, const char *content_type, const char *body,
                    size_t len, const char *headers)
{
    char head[320];
    if (capture != NULL) {
        capture->status = status;
        snprintf(capture->headers, sizeof(capture->headers), "%s", headers ? headers : "");
        free(capture->body);
        capture->body = xmalloc(len + 1);
        memcpy(capture->body, body, len);
        capture->body[len] = '\0';
        capture->len = len;
    }
    int n = snprintf(head, sizeof(head),
                     "Status: %d %s\r\nContent-Type: %s\r\nCache-Control: no-store\r\n"
                     "%sContent-Length: %zu\r\n\r\n",
                     status, reason_phrase(status), content_type, headers ? headers : "", len);
    if (n >= (int)sizeof(head))
        n = sizeof(head) - 1;
    FCGX_PutStr(head, n, out);
    FCGX_PutStr(body, (int)len, out);
}

void http_reply(FCGX_Stream *out, enum cs_code code, const char *msg, const char *extra,
                int retry_after_s)
{
    char retry[40];

    if (retry_after_s > 0)
        snprintf(retry, sizeof(retry), "Retry-After: %d\r\n", retry_after_s);
    http_reply_with(out, code, msg, extra, retry_after_s > 0 ? retry : NULL);
}

void http_reply_with(FCGX_Stream *out, enum cs_code code, const char *msg, const char *extra,
                     const char *headers)
{
    char body[2048];
    int n = snprintf(body, sizeof(body), "{\"code\":\"%s\",\"msg\":\"%s\"%s%s}",
                     codes[code].name, msg ? msg : codes[code].msg, extra ? "," : "",
                     extra ? extra : "");
    if (n >= (int)sizeof(body))
        n = sizeof(body) - 1;
    http_reply_raw(out, codes[code].status, "application/json; charset=utf-8", body,
                   (size_t)n, headers);
}
