/* auth.c - caller identity from an HS256 JWT or a trusted gateway header. */
#include "auth.h"
#include "cs.h"

#include <errno.h>
#include <jwt.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define AUTH_MAX_TOKEN 4096

enum auth_result auth_check(const struct auth_cfg *cfg, const char *authorization,
                            const char *x_user_id, const char *x_user_role, int64_t now_s,
                            struct auth_identity *id, const char **why)
{
    memset(id, 0, sizeof(*id));

    if (cfg->mode == AUTH_MODE_TRUSTED_HEADER) {
        if (x_user_id == NULL || *x_user_id == '\0') {
            *why = "X-User-Id header missing";
            return AUTH_MISSING;
        }
        if (cs_parse_id(x_user_id, strlen(x_user_id), &id->user_id) != CS_OK) {
            *why = "X-User-Id must be a decimal user id";
            return AUTH_INVALID;
        }
        id->is_admin = x_user_role != NULL && strcmp(x_user_role, "admin") == 0;
        return AUTH_OK;
    }

    if (authorization == NULL || *authorization == '\0') {
        *why = "Authorization header missing";
        return AUTH_MISSING;
    }
    if (strncasecmp(authorization, "Bearer ", 7) != 0) {
        *why = "Authorization must be a Bearer token";
        return AUTH_INVALID;
    }
    const char *token = authorization + 7;
    while (*token == ' ')
        token++;
    size_t tl = strlen(token);
    if (tl == 0 || tl > AUTH_MAX_TOKEN) {
        *why = "malformed token";
        return AUTH_INVALID;
    }

    jwt_t *jwt = NULL;
    enum auth_result res = AUTH_INVALID;
    /* A copy because libjwt wants a NUL-terminated token it may scribble on. */
    char buf[AUTH_MAX_TOKEN + 1];
    memcpy(buf, token, tl + 1);
    if (jwt_decode(&jwt, buf, cfg->secret, (int)cfg->secret_len) != 0 || jwt == NULL) {
        *why = "token signature or format invalid";
        goto out;
    }
    if (jwt_get_alg(jwt) != JWT_ALG_HS256) {
        *why = "only HS256 tokens are accepted";
        goto out;
    }

    errno = 0;
    long exp = jwt_get_grant_int(jwt, "exp");
    if (errno != 0 || exp <= 0) {
        *why = "token has no numeric exp";
        goto out;
    }
    if ((int64_t)exp + cfg->leeway_s <= now_s) {
        *why = "token expired";
        goto out;
    }

    const char *sub = jwt_get_grant(jwt, "sub");
    if (sub != NULL) {
        if (cs_parse_id(sub, strlen(sub), &id->user_id) != CS_OK) {
            *why = "token sub must be a decimal user id";
            goto out;
        }
    } else {
        /* "sub": 42 as a JSON number is accepted as well. */
        errno = 0;
        long s = jwt_get_grant_int(jwt, "sub");
        if (errno != 0 || s <= 0) {
            *why = "token sub must be a decimal user id";
            goto out;
        }
        id->user_id = s;
    }
    const char *role = jwt_get_grant(jwt, "role");
    id->is_admin = role != NULL && strcmp(role, "admin") == 0;
    res = AUTH_OK;
out:
    if (jwt != NULL)
        jwt_free(jwt);
    return res;
}
