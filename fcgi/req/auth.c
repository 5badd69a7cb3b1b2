/* auth.c - caller identity from an HS256 JWT or a trusted gateway header. */
#include "auth.h"
#include "cs.h"

#include <jansson.h>
#include <jwt.h>
#include <math.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Decodes one segment of n characters and parses it with libjwt's own JSON
 * parser (jansson), refusing a member name that occurs twice anywhere (RFC
 * 7515 section 4 lets a reader refuse such a header; readers disagree on
 * which one wins). Returns the object (caller decrefs) or NULL. */
static json_t *segment_object(const char *seg, size_t n)
{
    unsigned char raw[AUTH_MAX_TOKEN * 3 / 4 + 2]; /* n <= AUTH_MAX_TOKEN */
    json_t *obj = NULL;
    long len = cs_b64url_decode(seg, n, raw);

    /* A NUL inside the JSON would end it early for a reader of C strings. */
    if (len > 0 && memchr(raw, '\0', (size_t)len) == NULL)
        obj = json_loadb((const char *)raw, (size_t)len, JSON_REJECT_DUPLICATES, NULL);
    if (obj != NULL && !json_is_object(obj)) {
        json_decref(obj);
        obj = NULL;
    }
    return obj;
}

/* A token taken apart by token_parse(). */
struct token {
    const char *text;          /* header.payload.signature */
    size_t len, signed_len;    /* signed_len: header.payload, what the MAC covers */
    unsigned char sig[48];     /* the 32-byte signature */
    json_t *claims;
};

/* The checks of auth_token_front(), keeping the claims for the caller. */
static int token_parse(const char *authorization, struct token *tk, const char **why)
{
    memset(tk, 0, sizeof(*tk));
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
    size_t sl = tl - (size_t)(d2 + 1 - t);
    if (sl != 43 || cs_b64url_decode(d2 + 1, sl, tk->sig) != 32) {
        *why = "malformed token";
        return CS_ERR;
    }

    json_t *head = segment_object(t, (size_t)(d1 - t));
    if (head == NULL) {
        *why = "token header is not a JSON object";
        return CS_ERR;
    }
    /* JOSE names are case-sensitive: "hs256" is not HS256 (RFC 7515 4.1.1). */
    const char *alg = json_string_value(json_object_get(head, "alg"));
    int alg_ok = alg != NULL && strcmp(alg, "HS256") == 0;
    /* No extension is understood here, so any "crit" must be refused
     * (RFC 7515 4.1.11). */
    int crit = json_object_get(head, "crit") != NULL;
    /* libjwt's rule: a string "typ" of a signed token says JWT, in any case. */
    const char *typ = json_string_value(json_object_get(head, "typ"));
    int typ_ok = typ == NULL || strcasecmp(typ, "JWT") == 0;
    json_decref(head);
    if (!alg_ok) {
        *why = "only HS256 tokens are accepted";
        return CS_ERR;
    }
    if (crit) {
        *why = "token has a crit header";
        return CS_ERR;
    }
    if (!typ_ok) {
        *why = "token typ is not JWT";
        return CS_ERR;
    }

    tk->claims = segment_object(d1 + 1, (size_t)(d2 - d1 - 1));
    if (tk->claims == NULL) {
        *why = "token claims are not a JSON object";
        return CS_ERR;
    }
    tk->text = t;
    tk->len = tl;
    tk->signed_len = (size_t)(d2 - t);
    return CS_OK;
}

int auth_token_front(const char *authorization, const char **token, size_t *len,
                     const char **why)
{
    struct token tk;
    if (token_parse(authorization, &tk, why) != CS_OK)
        return CS_ERR;
    json_decref(tk.claims);
    *token = tk.text;
    *len = tk.len;
    return CS_OK;
}

/* ---- the signature ------------------------------------------------------------------ */

struct auth_mac {
    EVP_MAC *mac;
    EVP_MAC_CTX *ctx;          /* keyed once; each token re-initialises it */
};

int auth_init(struct auth_cfg *cfg)
{
    cfg->mac = NULL;
    if (cfg->mode != AUTH_MODE_JWT || cfg->verifier != AUTH_VERIFY_OPENSSL)
        return CS_OK;

    struct auth_mac *m = xcalloc(1, sizeof(*m));
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
        OSSL_PARAM_construct_end(),
    };
    m->mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    m->ctx = m->mac != NULL ? EVP_MAC_CTX_new(m->mac) : NULL;
    if (m->ctx == NULL || EVP_MAC_init(m->ctx, cfg->secret, cfg->secret_len, params) != 1) {
        EVP_MAC_CTX_free(m->ctx);
        EVP_MAC_free(m->mac);
        free(m);
        return CS_ERR;
    }
    cfg->mac = m;
    return CS_OK;
}

void auth_fini(struct auth_cfg *cfg)
{
    struct auth_mac *m = cfg->mac;
    if (m == NULL)
        return;
    EVP_MAC_CTX_free(m->ctx);
    EVP_MAC_free(m->mac);
    free(m);
    cfg->mac = NULL;
}

/* HMAC-SHA-256 of the signed part with the configured key, compared in
 * constant time with the token's signature. */
static int signature_ok(const struct auth_cfg *cfg, const struct token *tk)
{
    unsigned char mac[EVP_MAX_MD_SIZE];
    size_t ml = 0;

    if (cfg->mac != NULL) {
        EVP_MAC_CTX *ctx = cfg->mac->ctx;
        /* A NULL key re-initialises with the key set by auth_init(). */
        if (EVP_MAC_init(ctx, NULL, 0, NULL) != 1
            || EVP_MAC_update(ctx, (const unsigned char *)tk->text, tk->signed_len) != 1
            || EVP_MAC_final(ctx, mac, &ml, sizeof(mac)) != 1)
            return 0;
    } else {
        unsigned len = 0;
        if (HMAC(EVP_sha256(), cfg->secret, (int)cfg->secret_len,
                 (const unsigned char *)tk->text, tk->signed_len, mac, &len) == NULL)
            return 0;
        ml = len;
    }
    return ml == 32 && CRYPTO_memcmp(mac, tk->sig, 32) == 0;
}

/* libjwt's verdict on the same token: its own decoding and HMAC. */
static int libjwt_ok(const struct auth_cfg *cfg, const struct token *tk)
{
    /* A copy because libjwt wants a NUL-terminated token it may scribble on. */
    char buf[AUTH_MAX_TOKEN + 1];
    jwt_t *jwt = NULL;
    int ok;

    memcpy(buf, tk->text, tk->len);
    buf[tk->len] = '\0';
    ok = jwt_decode(&jwt, buf, cfg->secret, (int)cfg->secret_len) == 0 && jwt != NULL;
    if (ok) {
        /* libjwt's own reading of the header must agree with the front end's. */
        const char *alg = jwt_get_header(jwt, "alg");
        char *crit = jwt_get_headers_json(jwt, "crit");
        ok = jwt_get_alg(jwt) == JWT_ALG_HS256 && alg != NULL && strcmp(alg, "HS256") == 0
             && crit == NULL;
        free(crit);
    }
    if (jwt != NULL)
        jwt_free(jwt);
    return ok;
}

/* ---- the claims --------------------------------------------------------------------- */

/* Reads a NumericDate claim (RFC 7519 section 2: seconds, fractions allowed).
 * Returns CS_OK with *v, or CS_ERR when absent (*present 0) or not a
 * number (*present 1). */
static int numeric_date(const json_t *claims, const char *name, double *v, int *present)
{
    const json_t *n = json_object_get(claims, name);

    *present = n != NULL;
    if (!json_is_number(n))
        return CS_ERR;
    *v = json_number_value(n);
    return isfinite(*v) ? CS_OK : CS_ERR;
}

/* True when "aud" is the audience or an array holding it (RFC 7519 4.1.3). */
static int audience_matches(const json_t *claims, const char *audience)
{
    const json_t *aud = json_object_get(claims, "aud"), *e;
    size_t i;

    if (json_is_string(aud))
        return strcmp(json_string_value(aud), audience) == 0;
    json_array_foreach(aud, i, e)
        if (json_is_string(e) && strcmp(json_string_value(e), audience) == 0)
            return 1;
    return 0;
}

/* The registered claims of a verified token. */
static enum auth_result check_claims(const struct auth_cfg *cfg, const json_t *claims,
                                     int64_t now_s, struct auth_identity *id, const char **why)
{
    double exp, nbf;
    int present;

    if (numeric_date(claims, "exp", &exp, &present) != CS_OK) {
        *why = present ? "token exp must be a NumericDate" : "token has no exp";
        return AUTH_INVALID;
    }
    if (exp + cfg->leeway_s <= (double)now_s) {
        *why = "token expired";
        return AUTH_INVALID;
    }
    if (numeric_date(claims, "nbf", &nbf, &present) != CS_OK) {
        if (present) {
            *why = "token nbf must be a NumericDate";
            return AUTH_INVALID;
        }
    } else if (nbf - cfg->leeway_s > (double)now_s) {
        *why = "token not valid yet (nbf)";
        return AUTH_INVALID;
    }
    if (cfg->issuer != NULL && cfg->issuer[0] != '\0') {
        const char *iss = json_string_value(json_object_get(claims, "iss"));
        if (iss == NULL || strcmp(iss, cfg->issuer) != 0) {
            *why = "token iss is not the configured issuer";
            return AUTH_INVALID;
        }
    }
    if (cfg->audience != NULL && cfg->audience[0] != '\0'
        && !audience_matches(claims, cfg->audience)) {
        *why = "token aud does not name this service";
        return AUTH_INVALID;
    }

    const json_t *sub = json_object_get(claims, "sub");
    if (json_is_string(sub)) {
        if (cs_parse_id(json_string_value(sub), json_string_length(sub), &id->user_id) != CS_OK) {
            *why = "token sub must be a decimal user id";
            return AUTH_INVALID;
        }
    } else if (json_is_integer(sub) && json_integer_value(sub) > 0) {
        /* "sub": 42 as a JSON integer is accepted as well (not 42.0). */
        id->user_id = (int64_t)json_integer_value(sub);
    } else {
        *why = "token sub must be a decimal user id";
        return AUTH_INVALID;
    }
    const char *role = json_string_value(json_object_get(claims, "role"));
    id->is_admin = role != NULL && strcmp(role, "admin") == 0;
    id->is_service = role != NULL && strcmp(role, "service") == 0;
    const json_t *groups = json_object_get(claims, "groups"), *g;
    size_t gi;
    id->ngroups = 0;
    json_array_foreach(groups, gi, g)
    {
        /* A name that cannot be an activity's group never matches: skipped. */
        if (id->ngroups < AUTH_MAX_GROUPS && json_is_string(g)
            && json_string_length(g) < sizeof(id->groups[0]) && json_string_length(g) > 0)
            snprintf(id->groups[id->ngroups++], sizeof(id->groups[0]), "%s",
                     json_string_value(g));
    }
    return AUTH_OK;
}

enum auth_result auth_check(const struct auth_cfg *cfg, const char *authorization,
                            const char *x_user_id, const char *x_user_role, int64_t now_s,
                            struct auth_identity *id, const char **why)
{
    memset(id, 0, sizeof(*id));

    if (cfg->mode == AUTH_MODE_TRUSTED_HEADER) {
        if (x_user_id == NULL || *x_user_id == '\0') {
            *why = "no COUPONSEIZE_USER_ID param from the web server (X-User-Id headers are not read)";
            return AUTH_MISSING;
        }
        if (cs_parse_id(x_user_id, strlen(x_user_id), &id->user_id) != CS_OK) {
            *why = "COUPONSEIZE_USER_ID must be a decimal user id";
            return AUTH_INVALID;
        }
        id->is_admin = x_user_role != NULL && strcmp(x_user_role, "admin") == 0;
        id->is_service = x_user_role != NULL && strcmp(x_user_role, "service") == 0;
        return AUTH_OK;
    }

    if (authorization == NULL || *authorization == '\0') {
        *why = "Authorization header missing";
        return AUTH_MISSING;
    }
    struct token tk;
    if (token_parse(authorization, &tk, why) != CS_OK)
        return AUTH_INVALID;

    enum auth_result res = AUTH_INVALID;
    int ok = cfg->verifier == AUTH_VERIFY_LIBJWT ? libjwt_ok(cfg, &tk) : signature_ok(cfg, &tk);
    if (!ok)
        *why = "token signature or format invalid";
    else
        res = check_claims(cfg, tk.claims, now_s, id, why);
    if (res != AUTH_OK)
        memset(id, 0, sizeof(*id));
    json_decref(tk.claims);
    return res;
}
