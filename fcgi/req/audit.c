/* audit.c - writes the admin_audit row of an admin action. */
#include "audit.h"
#include "cs.h"
#include "http.h"
#include "log.h"
#include "mconn.h"
#include "req.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char SQL_AUDIT[] =
    "INSERT INTO admin_audit (admin_sub, action, activity_id, request_body, http_status, "
    "result, message) VALUES (?, ?, ?, ?, ?, ?, ?)";

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is not one. */
static size_t audit_utf8_len(const unsigned char *s, size_t n)
{
    size_t len;
    unsigned min;
    unsigned c = s[0];

    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2, min = 0x80, c &= 0x1F;
    else if (c >= 0xE0 && c <= 0xEF)
        len = 3, min = 0x800, c &= 0x0F;
    else if (c >= 0xF0 && c <= 0xF4)
        len = 4, min = 0x10000, c &= 0x07;
    else
        return 0;
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        c = (c << 6) | (s[i] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
        return 0;
    return len;
}

/* A copy of body[0..len) with every byte that is not valid UTF-8 replaced by
 * '?': the column is utf8mb4, and a body the client mangled must still leave
 * its trace. The caller frees it. */
static char *audit_clean_body(const char *body, size_t len)
{
    char *out = xmalloc(len + 1);
    size_t i = 0;
    while (i < len) {
        size_t n = audit_utf8_len((const unsigned char *)body + i, len - i);
        if (n == 0 || (n == 1 && body[i] == '\0')) {
            out[i++] = '?';
            continue;
        }
        memcpy(out + i, body + i, n);
        i += n;
    }
    out[len] = '\0';
    return out;
}

void audit_record(struct mconn *mc, struct req *r)
{
    char sub[24];
    /* Only what the handler established: never the body's "id" on its own
     * (a refused create's body may name any activity). */
    int64_t aid = r->audit_id;

    snprintf(sub, sizeof(sub), "%" PRId64, r->who.user_id);
    char *body = audit_clean_body(r->body_len > 0 ? r->body : "", r->body_len);
    const char *result = http_code_name(r->code);
    struct mval p[] = {
        MV_TXT(sub, strlen(sub)),
        MV_TXT(r->audit_action, strlen(r->audit_action)),
        aid > 0 ? MV_INT(aid) : (struct mval){.t = MV_NULL},
        MV_TXT(body, r->body_len),
        MV_INT(http_code_status(r->code)),
        MV_TXT(result, strlen(result)),
        MV_TXT(r->msg, strlen(r->msg)),
    };
    if (mconn_exec(mc, SQL_AUDIT, p, (int)CS_ARRAY_LEN(p), NULL) != CS_OK)
        log_error("admin_audit: INSERT of %s by admin %s (activity %" PRId64 ", answered %s) "
                  "failed: %s",
                  r->audit_action, sub, aid, result, mc->errstr);
    free(body);
}
