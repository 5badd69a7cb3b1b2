/* auth.c - caller identity from an HS256 JWT or a trusted gateway header. */
#include "auth.h"
#include "cs.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <jwt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Value of a base64url character, or -1. */
static int b64url_val(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '-')
        return 62;
    if (c == '_')
        return 63;
    return -1;
}

/* Decodes unpadded base64url (RFC 7515 section 2) of n characters into out
 * (at least n * 3 / 4 + 1 bytes) and NUL-terminates it. Returns the decoded
 * length, or -1 when a character is outside the alphabet, the length cannot
 * be one of base64, or the unused low bits of the last character are set. */
static long b64url_decode(const char *in, size_t n, unsigned char *out)
{
    size_t o = 0;
    unsigned acc = 0;
    int bits = 0;

    if (n % 4 == 1)
        return -1;
    for (size_t i = 0; i < n; i++) {
        int v = b64url_val((unsigned char)in[i]);
        if (v < 0)
            return -1;
        acc = (acc << 6) | (unsigned)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (unsigned char)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    /* Canonical encoding only: one token, one spelling. */
    if (acc != 0)
        return -1;
    out[o] = '\0';
    return (long)o;
}

/* True when an object member name occurs twice (RFC 7515 section 4 lets a
 * reader refuse such a header; readers disagree on which one wins). */
static int has_duplicate_names(const cJSON *obj)
{
    for (const cJSON *a = obj->child; a != NULL; a = a->next)
        for (const cJSON *b = a->next; b != NULL; b = b->next)
            if (strcmp(a->string, b->string) == 0)
                return 1;
    return 0;
}

/* Decodes one segment of n characters and parses it as a JSON object
 * without duplicate names. Returns the object (caller frees) or NULL. */
static cJSON *segment_object(const char *seg, size_t n)
{
    unsigned char *raw = xmalloc(n * 3 / 4 + 2);
    cJSON *obj = NULL;
    long len = b64url_decode(seg, n, raw);

    /* A NUL inside the JSON would end it early for cJSON but not for libjwt. */
    if (len > 0 && memchr(raw, '\0', (size_t)len) == NULL)
        obj = cJSON_ParseWithLengthOpts((const char *)raw, (size_t)len + 1, NULL, 1);
    free(raw);
    if (obj != NULL && (!cJSON_IsObject(obj) || has_duplicate_names(obj))) {
        cJSON_Delete(obj);
        obj = NULL;
    }
    return obj;
}

int auth_token_front(const char *authorization, const char **token, size_t *len,
                     const char **why)
{
    if (strncasecmp(authorization, "Bearer ", 7) != 0) {
        *why = "Authorization must be a Bearer token";
        return CS_ERR;
    }
    const char *t = authorization + 7;
    while (*t == ' ')
        t++;
    size_t tl = strlen(t);
    if (tl == 0 || tl > AUTH_MAX_TOKEN) {
        *why = "malformed token";
        return CS_ERR;
    }

    /* header.payload.signature, each base64url without padding. */
    const char *d1 = memchr(t, '.', tl);
    const char *d2 = d1 ? memchr(d1 + 1, '.', tl - (size_t)(d1 + 1 - t)) : NULL;
    if (d1 == NULL || d2 == NULL || memchr(d2 + 1, '.', tl - (size_t)(d2 + 1 - t)) != NULL) {
        *why = "malformed token";
        return CS_ERR;
    }
    /* HMAC-SHA-256 is 32 bytes: 43 characters. */
    unsigned char sig[48];
    size_t sl = tl - (size_t)(d2 + 1 - t);
    if (sl != 43 || b64url_decode(d2 + 1, sl, sig) != 32) {
        *why = "malformed token";
        return CS_ERR;
    }

    cJSON *head = segment_object(t, (size_t)(d1 - t));
    if (head == NULL) {
        *why = "token header is not a JSON object";
        return CS_ERR;
    }
    /* JOSE names are case-sensitive: "hs256" is not HS256 (RFC 7515 4.1.1). */
    const cJSON *alg = cJSON_GetObjectItemCaseSensitive(head, "alg");
    int alg_ok = cJSON_IsString(alg) && strcmp(alg->valuestring, "HS256") == 0;
    /* No extension is understood here, so any "crit" must be refused
     * (RFC 7515 4.1.11). */
    int crit = cJSON_GetObjectItemCaseSensitive(head, "crit") != NULL;
    cJSON_Delete(head);
    if (!alg_ok) {
        *why = "only HS256 tokens are accepted";
        return CS_ERR;
    }
    if (crit) {
        *why = "token has a crit header";
        return CS_ERR;
    }

    cJSON *claims = segment_object(d1 + 1, (size_t)(d2 - d1 - 1));
    if (claims == NULL) {
        *why = "token claims are not a JSON object";
        return CS_ERR;
    }
    cJSON_Delete(claims);
    *token = t;
    *len = tl;
    return CS_OK;
}

/* Reads a NumericDate claim as libjwt parsed it (RFC 7519 section 2: seconds,
 * fractions allowed). Returns CS_OK with *v, or CS_ERR when absent (*present
 * 0) or not a number (*present 1). */
static int numeric_date(jwt_t *jwt, const char *name, double *v, int *present)
{
    char *text = jwt_get_grants_json(jwt, name);
    int rc = CS_ERR;

    *present = text != NULL;
    if (text != NULL && (text[0] == '-' || (text[0] >= '0' && text[0] <= '9'))) {
        char *end;
        errno = 0;
        double d = strtod(text, &end);
        if (*end == '\0' && errno == 0 && isfinite(d)) {
            *v = d;
            rc = CS_OK;
        }
    }
    free(text);
    return rc;
}

/* True when "aud" is the audience or an array holding it (RFC 7519 4.1.3). */
static int audience_matches(jwt_t *jwt, const char *audience)
{
    char *text = jwt_get_grants_json(jwt, "aud");
    int ok = 0;

    if (text == NULL)
        return 0;
    cJSON *aud = cJSON_Parse(text);
    free(text);
    if (cJSON_IsString(aud)) {
        ok = strcmp(aud->valuestring, audience) == 0;
    } else if (cJSON_IsArray(aud)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, aud)
            if (cJSON_IsString(e) && strcmp(e->valuestring, audience) == 0)
                ok = 1;
    }
    cJSON_Delete(aud);
    return ok;
}

/* The registered claims of a verified token, as libjwt read them. */
static enum auth_result check_claims(const struct auth_cfg *cfg, jwt_t *jwt, int64_t now_s,
                                     struct auth_identity *id, const char **why)
{
    double exp, nbf;
    int present;

    if (numeric_date(jwt, "exp", &exp, &present) != CS_OK) {
        *why = present ? "token exp must be a NumericDate" : "token has no exp";
        return AUTH_INVALID;
    }
    if (exp + cfg->leeway_s <= (double)now_s) {
        *why = "token expired";
        return AUTH_INVALID;
    }
    if (numeric_date(jwt, "nbf", &nbf, &present) != CS_OK) {
        if (present) {
            *why = "token nbf must be a NumericDate";
            return AUTH_INVALID;
        }
    } else if (nbf - cfg->leeway_s > (double)now_s) {
        *why = "token not valid yet (nbf)";
        return AUTH_INVALID;
    }
    if (cfg->issuer != NULL && cfg->issuer[0] != '\0') {
        const char *iss = jwt_get_grant(jwt, "iss");
        if (iss == NULL || strcmp(iss, cfg->issuer) != 0) {
            *why = "token iss is not the configured issuer";
            return AUTH_INVALID;
        }
    }
    if (cfg->audience != NULL && cfg->audience[0] != '\0'
        && !audience_matches(jwt, cfg->audience)) {
        *why = "token aud does not name this service";
        return AUTH_INVALID;
    }

    const char *sub = jwt_get_grant(jwt, "sub");
    if (sub != NULL) {
        if (cs_parse_id(sub, strlen(sub), &id->user_id) != CS_OK) {
            *why = "token sub must be a decimal user id";
            return AUTH_INVALID;
        }
    } else {
        /* "sub": 42 as a JSON number is accepted as well. */
        errno = 0;
        long s = jwt_get_grant_int(jwt, "sub");
        if (errno != 0 || s <= 0) {
            *why = "token sub must be a decimal user id";
            return AUTH_INVALID;
        }
        id->user_id = s;
    }
    const char *role = jwt_get_grant(jwt, "role");
    id->is_admin = role != NULL && strcmp(role, "admin") == 0;
    return AUTH_OK;
}

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
    const char *token;
    size_t tl;
    if (auth_token_front(authorization, &token, &tl, why) != CS_OK)
        return AUTH_INVALID;

    jwt_t *jwt = NULL;
    enum auth_result res = AUTH_INVALID;
    /* A copy because libjwt wants a NUL-terminated token it may scribble on. */
    char buf[AUTH_MAX_TOKEN + 1];
    memcpy(buf, token, tl + 1);
    if (jwt_decode(&jwt, buf, cfg->secret, (int)cfg->secret_len) != 0 || jwt == NULL) {
        *why = "token signature or format invalid";
        goto out;
    }
    /* libjwt's own reading of the header must agree with the front end's. */
    const char *alg = jwt_get_header(jwt, "alg");
    if (jwt_get_alg(jwt) != JWT_ALG_HS256 || alg == NULL || strcmp(alg, "HS256") != 0) {
        *why = "only HS256 tokens are accepted";
        goto out;
    }
    char *crit = jwt_get_headers_json(jwt, "crit");
    if (crit != NULL) {
        free(crit);
        *why = "token has a crit header";
        goto out;
    }
    res = check_claims(cfg, jwt, now_s, id, why);
    if (res != AUTH_OK)
        memset(id, 0, sizeof(*id));
out:
    if (jwt != NULL)
        jwt_free(jwt);
    return res;
}
