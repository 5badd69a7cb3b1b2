/* params.c - FastCGI parameters -> struct req, apart from libfcgi's loop. */
#include "params.h"
#include "req.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How many params in env are named name (a "NAME=VALUE" string each). */
static int param_count(char **env, const char *name)
{
    size_t n = strlen(name);
    int count = 0;
    for (; env != NULL && *env != NULL; env++)
        if (strncmp(*env, name, n) == 0 && (*env)[n] == '=')
            count++;
    return count;
}

int64_t params_request_start_ms(const char *v)
{
    int64_t whole = 0, frac_ms = 0;
    int digits = 0;

    if (v == NULL)
        return -1;
    if (v[0] == 't' && v[1] == '=')
        v += 2;
    for (; *v >= '0' && *v <= '9'; v++) {
        if (++digits > 18)
            return -1;
        whole = whole * 10 + (*v - '0');
    }
    if (digits == 0)
        return -1;
    if (*v == '.') {
        /* seconds.fraction: milliseconds from the first three digits */
        int n = 0;
        for (v++; *v >= '0' && *v <= '9'; v++, n++)
            if (n < 3)
                frac_ms = frac_ms * 10 + (*v - '0');
        if (n == 0)
            return -1;
        for (; n < 3; n++)
            frac_ms *= 10;
        if (*v != '\0' || whole >= 100000000000LL)
            return -1;
        return whole * 1000 + frac_ms;
    }
    if (*v != '\0')
        return -1;
    if (whole >= 100000000000000LL) /* microseconds (15+ digits today) */
        return whole / 1000;
    if (whole >= 100000000000LL)    /* milliseconds (13 digits today) */
        return whole;
    return whole * 1000;            /* seconds */
}

void params_fill(struct req *r, char **env)
{
    const char *uri, *cl;

    r->method = FCGX_GetParam("REQUEST_METHOD", env);
    if (r->method == NULL)
        r->method = "GET";
    r->content_type = FCGX_GetParam("CONTENT_TYPE", env);
    r->authorization = FCGX_GetParam("HTTP_AUTHORIZATION", env);
    /* The trusted identity comes from params that no request header can
     * produce: all three servers pass a client's headers as HTTP_* (lighttpd
     * maps X_User_Id and X.User.Id to HTTP_X_USER_ID as well), so a client
     * could otherwise add a second copy that FCGX_GetParam() finds first. A
     * param that comes twice anyway (a server configured to add it twice)
     * is refused by auth_check(), never picked from. */
    r->x_user_id = FCGX_GetParam(PARAMS_USER_ID, env);
    r->x_user_role = FCGX_GetParam(PARAMS_USER_ROLE, env);
    /* Counted only when present: a request without them (every request in
     * the default jwt mode) pays no extra scan of its params. */
    r->identity_twice = (r->x_user_id != NULL && param_count(env, PARAMS_USER_ID) > 1)
                        || (r->x_user_role != NULL && param_count(env, PARAMS_USER_ROLE) > 1);
    r->idem_key = FCGX_GetParam("HTTP_IDEMPOTENCY_KEY", env);
    r->query = FCGX_GetParam("QUERY_STRING", env);
    cl = FCGX_GetParam("CONTENT_LENGTH", env);
    r->content_length = -1;
    if (cl != NULL && *cl != '\0') {
        char *end;
        errno = 0;
        long v = strtol(cl, &end, 10);
        r->content_length = (errno == 0 && *end == '\0' && v >= 0) ? v : -1;
        /* An absurd length is still "too large", never a negative read. */
        if (errno == ERANGE)
            r->content_length = LONG_MAX;
    }

    /* REQUEST_URI is what nginx, lighttpd and Apache all pass; fall back to
     * SCRIPT_NAME + PATH_INFO for front ends that do not. */
    uri = FCGX_GetParam("REQUEST_URI", env);
    if (uri != NULL && *uri != '\0') {
        size_t n = strcspn(uri, "?");
        if (n >= sizeof(r->path))
            n = sizeof(r->path) - 1;
        memcpy(r->path, uri, n);
        r->path[n] = '\0';
    } else {
        const char *sn = FCGX_GetParam("SCRIPT_NAME", env);
        const char *pi = FCGX_GetParam("PATH_INFO", env);
        snprintf(r->path, sizeof(r->path), "%s%s", sn ? sn : "", pi ? pi : "");
    }
    if (r->query == NULL) {
        const char *q = uri ? strchr(uri, '?') : NULL;
        r->query = q ? q + 1 : "";
    }
}
