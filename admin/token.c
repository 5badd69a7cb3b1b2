/* token.c - signs couponseize-admin's short-lived admin token with libjwt,
 * the library coupon-fcgi checks tokens with. */
#include "token.h"
#include "conf.h"
#include "cs.h"

#include <jwt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TOKEN_ROOT_SUB 4294967296LL

int64_t token_subject(int64_t sub)
{
    if (sub > 0)
        return sub;
    const char *su = getenv("SUDO_UID");
    int64_t id;
    if (getuid() == 0 && su != NULL && cs_parse_id(su, strlen(su), &id) == CS_OK)
        return id;
    return getuid() != 0 ? (int64_t)getuid() : TOKEN_ROOT_SUB;
}

char *token_mint(const struct cs_conf *conf, int64_t sub, int ttl_s, char *err, size_t errlen)
{
    const char *secret = conf->auth_jwt_secret;
    jwt_t *jwt = NULL;
    char *out = NULL, subs[32];
    time_t now = time(NULL);
    int rc;

    if (secret == NULL || strlen(secret) < 32) {
        snprintf(err, errlen, "auth.jwt_secret is not set (or under 32 characters): no admin "
                 "token can be signed");
        return NULL;
    }
    snprintf(subs, sizeof(subs), "%lld", (long long)sub);
    if (jwt_new(&jwt) != 0) {
        snprintf(err, errlen, "jwt_new() failed");
        return NULL;
    }
    rc = jwt_set_alg(jwt, JWT_ALG_HS256, (const unsigned char *)secret, (int)strlen(secret));
    rc = rc ? rc : jwt_add_grant(jwt, "sub", subs);
    rc = rc ? rc : jwt_add_grant(jwt, "role", "admin");
    rc = rc ? rc : jwt_add_grant_int(jwt, "iat", (long)now);
    rc = rc ? rc : jwt_add_grant_int(jwt, "exp", (long)(now + ttl_s));
    if (rc == 0 && conf->auth_issuer != NULL && conf->auth_issuer[0] != '\0')
        rc = jwt_add_grant(jwt, "iss", conf->auth_issuer);
    if (rc == 0 && conf->auth_audience != NULL && conf->auth_audience[0] != '\0')
        rc = jwt_add_grant(jwt, "aud", conf->auth_audience);
    if (rc == 0)
        out = jwt_encode_str(jwt);
    if (out == NULL)
        snprintf(err, errlen, "signing the admin token failed (libjwt: %d)", rc);
    jwt_free(jwt); /* libjwt wipes its copy of the key */
    if (out == NULL)
        return NULL;
    /* libjwt 1.x allocates with malloc() unless told otherwise (we never
     * call jwt_set_alloc()), so free() in token_free() matches. */
    return out;
}

void token_free(char *token)
{
    if (token == NULL)
        return;
    explicit_bzero(token, strlen(token));
    free(token);
}
