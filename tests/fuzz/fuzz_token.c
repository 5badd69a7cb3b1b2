/* fuzz_token.c - libFuzzer harness: the Authorization header, through the
 * token front end and on to both signature verifiers and the claim checks.
 *
 * Input: the first byte picks the mode. Even: the rest is the header value
 * as sent. Odd: the rest is "HEADER-JSON\nCLAIMS-JSON", which the harness
 * encodes and signs with the right key (HMAC-SHA-256 from OpenSSL), so the
 * JSON that only a correctly signed token can bring reaches every check.
 * Every input goes through both verifiers; any disagreement (answer, user,
 * role or reason) aborts. */
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "req/auth.h"
#include "cs.h"

static const char SECRET[] = "fuzz-secret-0123456789abcdefghijklmnop";

static size_t b64url(const unsigned char *in, size_t n, char *out)
{
    static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)in[i] << 16;
        if (i + 1 < n)
            v |= (unsigned)in[i + 1] << 8;
        if (i + 2 < n)
            v |= in[i + 2];
        out[o++] = al[(v >> 18) & 63];
        out[o++] = al[(v >> 12) & 63];
        if (i + 1 < n)
            out[o++] = al[(v >> 6) & 63];
        if (i + 2 < n)
            out[o++] = al[v & 63];
    }
    out[o] = '\0';
    return o;
}

/* "Bearer " + b64(header) "." b64(claims) "." b64(HMAC): caller frees. */
static char *signed_token(const uint8_t *data, size_t size)
{
    const uint8_t *nl = memchr(data, '\n', size);
    size_t hl = nl ? (size_t)(nl - data) : size;
    const uint8_t *claims = nl ? nl + 1 : data + size;
    size_t cl = nl ? size - hl - 1 : 0;
    char *tok = malloc(7 + (hl + cl) * 4 / 3 + 8 + 64);
    size_t n = 7;

    memcpy(tok, "Bearer ", 7);
    n += b64url(data, hl, tok + n);
    tok[n++] = '.';
    n += b64url(claims, cl, tok + n);
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned ml = 0;
    HMAC(EVP_sha256(), SECRET, (int)sizeof(SECRET) - 1, (const unsigned char *)tok + 7, n - 7,
         mac, &ml);
    tok[n++] = '.';
    b64url(mac, ml, tok + n);
    return tok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    char *hdr;
    if (data[0] & 1) {
        hdr = signed_token(data + 1, size - 1);
    } else {
        hdr = malloc(size);
        memcpy(hdr, data + 1, size - 1);
        hdr[size - 1] = '\0';
    }

    const char *tok = NULL, *why = NULL;
    size_t len = 0;
    if (auth_token_front(hdr, &tok, &len, &why) == CS_OK) {
        if (tok < hdr || tok + len != hdr + strlen(hdr) || len > AUTH_MAX_TOKEN)
            abort();
    } else if (why == NULL) {
        abort();
    }

    /* Both verifiers, which must agree: OpenSSL's keyed HMAC (the default)
     * and libjwt's jwt_decode(). */
    static struct auth_cfg fast = {.mode = AUTH_MODE_JWT, .verifier = AUTH_VERIFY_OPENSSL};
    if (fast.mac == NULL) {
        fast.secret = (const unsigned char *)SECRET;
        fast.secret_len = sizeof(SECRET) - 1;
        if (auth_init(&fast) != CS_OK)
            abort();
    }
    struct auth_cfg cfg = fast;
    cfg.leeway_s = 30;
    cfg.audience = (data[0] & 2) ? "coupons" : NULL;
    cfg.issuer = (data[0] & 4) ? "idp" : NULL;
    struct auth_identity id, lid;
    const char *lwhy = NULL;
    why = NULL;
    enum auth_result r = auth_check(&cfg, hdr, NULL, NULL, 1700000000, &id, &why);
    if (r == AUTH_OK && id.user_id < 1)
        abort();
    if (r != AUTH_OK && (why == NULL || id.user_id != 0 || id.is_admin))
        abort();
    cfg.verifier = AUTH_VERIFY_LIBJWT;
    cfg.mac = NULL;
    enum auth_result l = auth_check(&cfg, hdr, NULL, NULL, 1700000000, &lid, &lwhy);
    if (l != r || lid.user_id != id.user_id || lid.is_admin != id.is_admin
        || (r != AUTH_OK && strcmp(why, lwhy) != 0))
        abort();
    /* The same bytes as a trusted gateway's header. */
    cfg.mode = AUTH_MODE_TRUSTED_HEADER;
    r = auth_check(&cfg, NULL, hdr, "admin", 0, &id, &why);
    if (r == AUTH_OK && id.user_id < 1)
        abort();
    free(hdr);
    return 0;
}
