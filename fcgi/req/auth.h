/* auth.h - who is calling: an HS256 JWT or a gateway's X-User-Id. */
#ifndef CS_AUTH_H
#define CS_AUTH_H

#include <stddef.h>
#include <stdint.h>

enum auth_mode { AUTH_MODE_JWT, AUTH_MODE_TRUSTED_HEADER };

/* Who checks the HS256 signature: OpenSSL's HMAC with a context keyed once
 * (the default), or libjwt's jwt_decode(), which re-reads the whole token.
 * Both see the same token and apply the same rules. */
enum auth_verifier { AUTH_VERIFY_OPENSSL, AUTH_VERIFY_LIBJWT };

struct auth_mac;

struct auth_cfg {
    enum auth_mode mode;
    enum auth_verifier verifier;
    const unsigned char *secret;
    size_t secret_len;
    int leeway_s;
    const char *audience;  /* NULL or "": any (or no) aud */
    const char *issuer;    /* NULL or "": any (or no) iss */
    struct auth_mac *mac;  /* set by auth_init(); NULL: a one-shot HMAC per token */
};

#define AUTH_MAX_TOKEN 4096

enum auth_result { AUTH_OK, AUTH_MISSING, AUTH_INVALID };

#define AUTH_MAX_GROUPS 16

struct auth_identity {
    int64_t user_id;
    int is_admin;
    int is_service;            /* role "service": the order system (coupon use/release) */
    /* The token's "groups" claim (array of strings): its first
     * AUTH_MAX_GROUPS names of at most 39 bytes; others are ignored. */
    int ngroups;
    char groups[AUTH_MAX_GROUPS][40];
};

/* Keys the HMAC context of cfg once (JWT mode, OpenSSL verifier), so no
 * token pays for setting it up. CS_ERR when OpenSSL cannot. auth_fini()
 * frees it. */
int auth_init(struct auth_cfg *cfg);
void auth_fini(struct auth_cfg *cfg);

/* Checks the caller. In JWT mode: authorization must be "Bearer <JWT>" and
 * pass auth_token_front(); the HS256 signature must verify (cfg->verifier);
 * then "exp" (a NumericDate, fractions allowed) must be in the future and
 * "nbf", when present, not in the future (both with leeway_s); when
 * cfg->issuer is set, "iss" must equal it; when cfg->audience is set, "aud"
 * (a string or an array of strings) must contain it; "sub" a decimal user
 * id 1..2^63-1 (a string, or a JSON integer); "role":"admin" makes an admin, "role":"service"
 * the order system; "groups" (an array of strings, optional) fills id->groups. In trusted-header mode the user id
 * comes from x_user_id and x_user_role "admin" makes an admin (the params
 * COUPONSEIZE_USER_ID and COUPONSEIZE_USER_ROLE, see params.h).
 * Returns AUTH_OK and fills *id, AUTH_MISSING when no credential was sent,
 * AUTH_INVALID otherwise (with a static reason in *why). */
enum auth_result auth_check(const struct auth_cfg *cfg, const char *authorization,
                            const char *x_user_id, const char *x_user_role, int64_t now_s,
                            struct auth_identity *id, const char **why);

/* What is checked before any signature: authorization is "Bearer "
 * (any case) and a token of at most AUTH_MAX_TOKEN bytes made of three
 * canonical unpadded base64url segments; the header is a JSON object
 * (libjwt's parser, jansson) without a name twice at any depth, "alg"
 * exactly "HS256", no "crit", and a string "typ", if any, "JWT" in any
 * case; the claims are such an object too; the signature is 32 bytes. Returns CS_OK with the
 * token (inside authorization, NUL-terminated there) in *token, *len, or
 * CS_ERR with a static reason in *why. Verifies no signature. */
int auth_token_front(const char *authorization, const char **token, size_t *len,
                     const char **why);

#endif
