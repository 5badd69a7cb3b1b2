/* auth_bench.c - CPU per token of auth_check(): what one request's verification costs. */

/*
 * Mints N distinct HS256 tokens (libjwt), then times auth_check() over all of
 * them, R times, in this one process: with auth.verifier "openssl", then
 * "libjwt". CPU time (CLOCK_PROCESS_CPUTIME_ID), so
 * a busy machine moves it little. Compare with a worker's CPU per request
 * (make bench, "CPU microseconds per request") to see verification's share.
 *
 *   auth_bench [-n TOKENS] [-r REPEATS] [-j]
 */
#include "req/auth.h"
#include "cs.h"

#include <jwt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char SECRET[] = "bench-secret-0123456789abcdefghijklmnop";

static double cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static char *mint(long user, long exp)
{
    jwt_t *j;
    char sub[24], *t, *out;
    snprintf(sub, sizeof(sub), "%ld", user);
    if (jwt_new(&j) != 0)
        abort();
    jwt_add_grant(j, "sub", sub);
    jwt_add_grant_int(j, "exp", exp);
    jwt_set_alg(j, JWT_ALG_HS256, (const unsigned char *)SECRET, (int)strlen(SECRET));
    t = jwt_encode_str(j);
    jwt_free(j);
    out = malloc(strlen(t) + 8);
    sprintf(out, "Bearer %s", t);
    free(t);
    return out;
}

int main(int argc, char **argv)
{
    int n = 200, reps = 50, json = 0, o;
    while ((o = getopt(argc, argv, "n:r:j")) != -1) {
        switch (o) {
        case 'n': n = atoi(optarg); break;
        case 'r': reps = atoi(optarg); break;
        case 'j': json = 1; break;
        default:
            fprintf(stderr, "usage: auth_bench [-n TOKENS] [-r REPEATS] [-j]\n");
            return 2;
        }
    }
    if (n < 1 || reps < 1) {
        fprintf(stderr, "auth_bench: -n and -r want >= 1\n");
        return 2;
    }
    long now = (long)time(NULL);
    char **tok = malloc(sizeof(*tok) * (size_t)n);
    for (int i = 0; i < n; i++)
        tok[i] = mint(1000 + i, now + 3600);
    long bad = 0;
    double verify[2];

    /* The two verifiers, one after the other, over the same tokens. */
    for (int v = 0; v < 2; v++) {
        struct auth_cfg cfg = {.mode = AUTH_MODE_JWT,
                               .verifier = v == 0 ? AUTH_VERIFY_OPENSSL : AUTH_VERIFY_LIBJWT,
                               .secret = (const unsigned char *)SECRET,
                               .secret_len = strlen(SECRET)};
        struct auth_identity id;
        const char *why;
        if (auth_init(&cfg) != CS_OK)
            return 1;
        double t0 = cpu_us();
        for (int r = 0; r < reps; r++)
            for (int i = 0; i < n; i++)
                bad += auth_check(&cfg, tok[i], NULL, NULL, now, &id, &why) != AUTH_OK;
        verify[v] = (cpu_us() - t0) / ((double)n * reps);
        auth_fini(&cfg);
    }

    for (int i = 0; i < n; i++)
        free(tok[i]);
    free(tok);
    if (bad != 0) {
        fprintf(stderr, "auth_bench: %ld tokens refused\n", bad);
        return 1;
    }
    if (json)
        printf("{\"verify_us\":%.3f,\"libjwt_us\":%.3f,\"tokens\":%d,\"repeats\":%d}\n",
               verify[0], verify[1], n, reps);
    else
        printf("auth_check %.2f us of CPU per token with OpenSSL, %.2f us with libjwt "
               "(%d tokens x %d)\n", verify[0], verify[1], n, reps);
    return 0;
}
