/* fuzz_params.c - libFuzzer harness: FastCGI parameters -> struct req. */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "req/params.h"
#include "req/req.h"

#define MAX_PARAMS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* NUL-separated "NAME=VALUE" strings, as libfcgi hands them over. */
    char *buf = malloc(size + 1);
    char *env[MAX_PARAMS + 1];
    size_t n = 0;

    memcpy(buf, data, size);
    buf[size] = '\0';
    for (char *p = buf; p < buf + size && n < MAX_PARAMS; p += strlen(p) + 1)
        env[n++] = p;
    env[n] = NULL;

    struct req r;
    memset(&r, 0x5a, sizeof(r));
    params_fill(&r, env);
    if (r.method == NULL || r.query == NULL)
        abort();
    if (memchr(r.path, '\0', sizeof(r.path)) == NULL)
        abort();
    if (r.content_length < -1)
        abort();
    /* Reading every string it points at must stay inside the input. */
    volatile size_t sink = strlen(r.method) + strlen(r.query) + strlen(r.path);
    if (r.content_type)
        sink += strlen(r.content_type);
    if (r.authorization)
        sink += strlen(r.authorization);
    (void)sink;
    free(buf);
    return 0;
}
