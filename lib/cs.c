/* cs.c - allocation wrappers and clocks. */
#include "cs.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

static void cs_oom(size_t n)
{
    fprintf(stderr, "couponseize: out of memory allocating %zu bytes\n", n);
    abort();
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL)
        cs_oom(n);
    return p;
}

void *xcalloc(size_t nmemb, size_t n)
{
    void *p = calloc(nmemb ? nmemb : 1, n ? n : 1);
    if (p == NULL)
        cs_oom(nmemb * n);
    return p;
}

void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (q == NULL)
        cs_oom(n);
    return q;
}

void *cs_grow(void *v, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return v;
    size_t c = *cap ? *cap * 2 : 16;
    if (c < need)
        c = need;
    if (c > SIZE_MAX / size)
        cs_oom(SIZE_MAX);
    *cap = c;
    return xrealloc(v, c * size);
}

char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = xmalloc(n);
    memcpy(p, s, n);
    return p;
}

void cs_init(void)
{
    cJSON_Hooks hooks = {xmalloc, free};
    cJSON_InitHooks(&hooks);
}

/* CLK's time in units of 1/PER_SEC of a second. */
static int64_t cs_clock(clockid_t clk, int64_t per_sec)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (int64_t)ts.tv_sec * per_sec + ts.tv_nsec / (1000000000 / per_sec);
}

int64_t cs_now_ms(void)
{
    return cs_clock(CLOCK_REALTIME, 1000);
}

int64_t cs_mono_ms(void)
{
    return cs_clock(CLOCK_MONOTONIC, 1000);
}

int64_t cs_boot_ms(void)
{
    return cs_clock(CLOCK_BOOTTIME, 1000);
}

int64_t cs_mono_us(void)
{
    return cs_clock(CLOCK_MONOTONIC, 1000000);
}

int cs_parse_id(const char *s, size_t len, int64_t *out)
{
    uint64_t v = 0;

    if (len == 0 || len > 19 || s[0] == '0')
        return CS_ERR;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return CS_ERR;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    /* 19 digits fit in uint64_t without wrapping; INT64_MAX is the bound. */
    if (v > (uint64_t)INT64_MAX)
        return CS_ERR;
    *out = (int64_t)v;
    return CS_OK;
}

int cs_cmp_int64(const void *x, const void *y)
{
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

/* Value of a base64url character, or -1. */
static int cs_b64url_val(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '-')
        return 62;
    if (c == '_')
        return 63;
    return -1;
}

/* Decodes unpadded base64url (RFC 7515 section 2) of n characters into out
 * (at least n * 3 / 4 + 1 bytes) and NUL-terminates it. Returns the decoded
 * length, or -1 when a character is outside the alphabet, the length cannot
 * be one of base64, or the unused low bits of the last character are set. */
long cs_b64url_decode(const char *in, size_t n, unsigned char *out)
{
    size_t o = 0;
    unsigned acc = 0;
    int bits = 0;

    if (n % 4 == 1)
        return -1;
    for (size_t i = 0; i < n; i++) {
        int v = cs_b64url_val((unsigned char)in[i]);
        if (v < 0)
            return -1;
        acc = (acc << 6) | (unsigned)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (unsigned char)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    /* Canonical encoding only: one token, one spelling. */
    if (acc != 0)
        return -1;
    out[o] = '\0';
    return (long)o;
}

void cs_pause_point(const char *name)
{
    const char *at = getenv("COUPONSEIZE_PAUSE_AT");
    size_t n = strlen(name);

    for (const char *p = at; p != NULL && *p != '\0';) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == n && memcmp(p, name, n) == 0) {
            /* stderr, not log.h: cs.c is linked alone into the fuzz harnesses. */
            fprintf(stderr, "couponseize: pause point %s: stopping until SIGCONT\n", name);
            raise(SIGSTOP);
            return;
        }
        p = comma ? comma + 1 : NULL;
    }
}

int cs_mutex_init_shared(pthread_mutex_t *m)
{
    pthread_mutexattr_t at;
    int err = pthread_mutexattr_init(&at);

    if (err != 0) {
        errno = err;
        return CS_ERR;
    }
    err = pthread_mutexattr_setpshared(&at, PTHREAD_PROCESS_SHARED);
    if (err == 0)
        err = pthread_mutexattr_setrobust(&at, PTHREAD_MUTEX_ROBUST);
    if (err == 0)
        err = pthread_mutex_init(m, &at);
    pthread_mutexattr_destroy(&at);
    if (err != 0) {
        errno = err;
        return CS_ERR;
    }
    return CS_OK;
}

int cs_fsync_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return CS_ERR;
    int rc = fsync(fd), saved = errno;
    close(fd);
    errno = saved;
    return rc == 0 ? CS_OK : CS_ERR;
}
