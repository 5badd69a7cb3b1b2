/* fuzz_conf.c - libFuzzer harness: the configuration loader (conf_load). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conf.h"
#include "cs.h"

static char path[64];

/* libconfig 1.5 leaks on some malformed files (its scanner's string buffer
 * when a file ends inside a string, a token after a syntax error): library
 * bugs, found by this harness, costing a few bytes per failed load at
 * start-up. Leaks inside libconfig are not reported; ours still are. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libconfig.so\n";
}

static void cleanup(void)
{
    unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* libconfig's @include would read other files (and may block on a
     * device); the loader trusts its file, so such inputs are skipped. */
    if (memmem(data, size, "@include", 8) != NULL)
        return 0;
    if (path[0] == '\0') {
        snprintf(path, sizeof(path), "/tmp/cs-fuzz-conf.%d", (int)getpid());
        atexit(cleanup);
    }
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        abort();
    if (size > 0 && fwrite(data, 1, size, f) != size)
        abort();
    fclose(f);

    struct cs_conf c;
    char err[256];
    err[0] = '\0';
    if (conf_load(&c, path, err, sizeof(err)) == CS_OK) {
        if (c.fcgi_workers < 1 || c.fcgi_max_body < 16 || c.auth_mode == NULL
            || c.auth_audience == NULL || c.redis_host[0] == '\0')
            abort();
        conf_free(&c);
    } else if (err[0] == '\0') {
        abort();
    }
    return 0;
}
