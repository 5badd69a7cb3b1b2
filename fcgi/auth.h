/* auth.h - who is calling: HS256 JWT (libjwt) or a gateway's X-User-Id. */
#ifndef CS_AUTH_H
#define CS_AUTH_H

#include <stddef.h>
#include <stdint.h>

enum auth_mode { AUTH_MODE_JWT, AUTH_MODE_TRUSTED_HEADER };

struct auth_cfg {
    enum auth_mode mode;
    const unsigned char *secret;
    size_t secret_len;
    int leeway_s;
};

enum auth_result { AUTH_OK, AUTH_MISSING, AUTH_INVALID };

struct auth_identity {
    int64_t user_id;
    int is_admin;
};

/* Checks the caller. In JWT mode: authorization must be "Bearer <JWT>",
 * HS256 only (alg none and every other alg are rejected), valid signature,
 * numeric "exp" in the future (plus leeway), "sub" a decimal user id
 * 1..2^63-1; "role":"admin" makes an admin. In trusted-header mode the user
 * id comes from x_user_id and X-User-Role: admin (role) makes an admin.
 * Returns AUTH_OK and fills *id, AUTH_MISSING when no credential was sent,
 * AUTH_INVALID otherwise (with a static reason in *why). */
enum auth_result auth_check(const struct auth_cfg *cfg, const char *authorization,
                            const char *x_user_id, const char *x_user_role, int64_t now_s,
                            struct auth_identity *id, const char **why);

#endif
