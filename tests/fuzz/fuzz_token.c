/* fuzz_token.c - libFuzzer harness: the Authorization header, through the
 * token front end and on to libjwt and the claim checks. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "cs.h"

static const char SECRET[] = "fuzz-secret-0123456789abcdefghijklmnop";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *hdr = malloc(size + 1);
    memcpy(hdr, data, size);
    hdr[size] = '\0';

    const char *tok = NULL, *why = NULL;
    size_t len = 0;
    if (auth_token_front(hdr, &tok, &len, &why) == CS_OK) {
        if (tok < hdr || tok + len != hdr + strlen(hdr) || len > AUTH_MAX_TOKEN)
            abort();
    } else if (why == NULL) {
        abort();
    }

    struct auth_cfg cfg = {AUTH_MODE_JWT, (const unsigned char *)SECRET, sizeof(SECRET) - 1, 30,
                           "coupons", NULL};
    struct auth_identity id;
    why = NULL;
    enum auth_result r = auth_check(&cfg, hdr, NULL, NULL, 1700000000, &id, &why);
    if (r == AUTH_OK && id.user_id < 1)
        abort();
    if (r != AUTH_OK && why == NULL)
        abort();
    /* The same bytes as a trusted gateway's header. */
    cfg.mode = AUTH_MODE_TRUSTED_HEADER;
    r = auth_check(&cfg, NULL, hdr, "admin", 0, &id, &why);
    if (r == AUTH_OK && id.user_id < 1)
        abort();
    free(hdr);
    return 0;
}
