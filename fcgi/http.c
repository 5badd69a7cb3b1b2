/* http.c - API response codes, strict request body parsing, reply writing. */
#include "http.h"
#include "cs.h"

#include <cjson/cJSON.h>
#include <stdio.h>
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

enum cs_code http_seize_outcome(long long result)
{
    if (result >= 0)
        return CODE_SEIZED;
    switch (result) {
    case -1: return CODE_ALREADY_SEIZED;
    case -2: return CODE_SOLD_OUT;
    case -3: return CODE_NO_SUCH_ACTIVITY;
    case -4: return CODE_NOT_STARTED;
    case -5: return CODE_ENDED;
    default: return CODE_INTERNAL_ERROR;
    }
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
    case 429: return "Too Many Requests";
    case 503: return "Service Unavailable";
    default: return "Internal Server Error";
    }
}

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* Skips a JSON string starting at the quote; returns the byte after it. */
static const char *skip_string(const char *p, const char *end)
{
    for (p++; p < end; p++) {
        if (*p == '\\')
            p++;
        else if (*p == '"')
            return p + 1;
    }
    return end;
}

/* Skips one JSON value (already known to be well-formed). */
static const char *skip_value(const char *p, const char *end)
{
    int depth = 0;
    for (; p < end; p++) {
        switch (*p) {
        case '"':
            p = skip_string(p, end) - 1;
            if (depth == 0)
                return p + 1;
            break;
        case '{':
        case '[':
            depth++;
            break;
        case '}':
        case ']':
            if (depth == 0)
                return p;
            if (--depth == 0)
                return p + 1;
            break;
        case ',':
            if (depth == 0)
                return p;
            break;
        default:
            break;
        }
    }
    return p;
}

/* cJSON checks the document; the raw number token is then read from the
 * text itself, because a double cannot hold every id up to 2^63-1. */
int http_parse_id_body(const char *body, size_t len, int64_t *id, const char **why)
{
    const char *end = body + len, *p;
    cJSON *doc;

    if (len == 0) {
        *why = "empty body";
        return CS_ERR;
    }
    /* Trailing bytes after the value are an error too: the parse must end
     * at the NUL that follows the body. */
    doc = cJSON_ParseWithLengthOpts(body, len + 1, NULL, 1);
    if (doc == NULL) {
        *why = "body is not valid JSON";
        return CS_ERR;
    }
    int is_obj = cJSON_IsObject(doc);
    const cJSON *item = is_obj ? cJSON_GetObjectItemCaseSensitive(doc, "id") : NULL;
    int is_num = item != NULL && cJSON_IsNumber(item);
    cJSON_Delete(doc);
    if (!is_obj) {
        *why = "body must be a JSON object";
        return CS_ERR;
    }
    if (item == NULL) {
        *why = "id is missing";
        return CS_ERR;
    }
    if (!is_num) {
        *why = "id must be a JSON integer";
        return CS_ERR;
    }

    p = skip_ws(body, end) + 1; /* past '{' */
    for (;;) {
        p = skip_ws(p, end);
        if (p >= end || *p != '"')
            break;
        const char *k = p + 1;
        p = skip_string(p, end);
        int is_id = p - k == 3 && memcmp(k, "id", 2) == 0;
        p = skip_ws(p, end);
        if (p >= end || *p != ':')
            break;
        p = skip_ws(p + 1, end);
        if (is_id) {
            const char *v = p;
            while (p < end && ((*p >= '0' && *p <= '9') || *p == '-' || *p == '+' || *p == '.'
                               || *p == 'e' || *p == 'E'))
                p++;
            if (cs_parse_id(v, (size_t)(p - v), id) != CS_OK) {
                *why = "id must be an integer 1..9223372036854775807";
                return CS_ERR;
            }
            return CS_OK;
        }
        p = skip_value(p, end);
        p = skip_ws(p, end);
        if (p >= end || *p != ',')
            break;
        p++;
    }
    *why = "id is missing";
    return CS_ERR;
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

void http_reply_raw(FCGX_Stream *out, int status, const char *content_type, const char *body,
                    size_t len, const char *headers)
{
    char head[320];
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
