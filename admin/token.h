/* token.h - the short-lived admin token couponseize-admin signs with the
 * node's own key (auth.jwt_secret, as lib/conf.c loads it). */
#ifndef CS_ADMIN_TOKEN_H
#define CS_ADMIN_TOKEN_H

#include <stddef.h>
#include <stdint.h>

struct cs_conf;

/* The admin id a token of this process carries as "sub" (and admin_audit
 * records): --sub when given (sub > 0), else the invoking user's uid
 * (SUDO_UID under sudo), else, for root, 2^32 (no uid is that). */
int64_t token_subject(int64_t sub);

/* Signs an HS256 token: sub, role "admin", iat, exp = now + ttl_s, and the
 * iss and aud that auth.issuer and auth.audience ask for. Returns a malloc'd
 * string the caller wipes and frees (token_free), or NULL with a message in
 * err (no secret configured, libjwt failed). */
char *token_mint(const struct cs_conf *conf, int64_t sub, int ttl_s, char *err, size_t errlen);

/* Wipes and frees a token of token_mint(). NULL is fine. */
void token_free(char *token);

#endif
