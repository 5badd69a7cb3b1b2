/* fuzz_query.c - libFuzzer harness: query strings (http_query_param). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cs.h"
#include "req/http.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* The first byte picks the output buffer size (1..64), the rest is the
     * query string, NUL-terminated as the FastCGI parameter is. */
    if (size == 0)
        return 0;
    size_t outlen = (size_t)(data[0] % 64) + 1;
    char *q = malloc(size);
    memcpy(q, data + 1, size - 1);
    q[size - 1] = '\0';
    char *out = malloc(outlen);
    static const char *const names[] = {"id", "page", "size", "i", ""};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        memset(out, 'x', outlen);
        if (http_query_param(q, names[i], out, outlen) == CS_OK) {
            size_t n = strnlen(out, outlen);
            if (n >= outlen)
                abort(); /* not terminated inside the buffer */
            if (strstr(q, out) == NULL)
                abort(); /* the value comes from the query */
        }
    }
    free(out);
    free(q);
    return 0;
}
