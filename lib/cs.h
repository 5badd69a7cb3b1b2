/* cs.h - status codes, allocation and clock helpers shared by every module. */
#ifndef CS_H
#define CS_H

#include <stddef.h>
#include <pthread.h>
#include <stdint.h>

#define CS_OK 0
#define CS_ERR -1

/* Allocation wrappers: abort the process with a log line on out-of-memory, so
 * callers never check for NULL. */
void *xmalloc(size_t n);
void *xcalloc(size_t nmemb, size_t n);
void *xrealloc(void *p, size_t n);
/* The array v of elements of size bytes with room for at least need of
 * them: *cap doubles (16 at first) when need is past it, as the growable
 * arrays of nginx and Redis do. v may be NULL with *cap 0. */
void *cs_grow(void *v, size_t *cap, size_t need, size_t size);
char *xstrdup(const char *s);

/* Process-wide set-up both binaries run first: cJSON allocates through
 * xmalloc, so out-of-memory has one policy everywhere. */
void cs_init(void);

/* Milliseconds since the Unix epoch (CLOCK_REALTIME). */
int64_t cs_now_ms(void);

/* Milliseconds from an arbitrary fixed point (CLOCK_MONOTONIC). */
int64_t cs_mono_ms(void);

/* Milliseconds from boot, counting time suspended (CLOCK_BOOTTIME): for the
 * reserves' lease, which must not run long while a VM is suspended, as
 * CLOCK_MONOTONIC would (it stops then). */
int64_t cs_boot_ms(void);

/* Initialises *m for shared memory: process-shared and robust (a process
 * killed holding it leaves the next locker EOWNERDEAD to repair, not a
 * wedged lock). CS_OK, else CS_ERR with errno set. */
int cs_mutex_init_shared(pthread_mutex_t *m);

/* Microseconds from an arbitrary fixed point (CLOCK_MONOTONIC). */
int64_t cs_mono_us(void);

/* Parses a decimal integer 1..INT64_MAX that fills all of s[0..len): digits
 * only, no sign, spaces or leading zero. Returns CS_OK and stores it in *out,
 * or CS_ERR for anything else (including overflow). */
int cs_parse_id(const char *s, size_t len, int64_t *out);

/* qsort() / bsearch() comparator of int64_t, ascending. */
int cs_cmp_int64(const void *x, const void *y);

/* Decodes unpadded base64url (RFC 7515 section 2) of n characters into out
 * (at least n * 3 / 4 + 1 bytes) and NUL-terminates it. Returns the decoded
 * length, or -1 when a character is outside the alphabet, the length cannot
 * be one of base64, or the unused low bits of the last character are set
 * (one value, one spelling). */
long cs_b64url_decode(const char *in, size_t n, unsigned char *out);

/* A named point where a test can stop this process: when the environment
 * variable COUPONSEIZE_PAUSE_AT names NAME (one name, or several separated
 * by commas), the process logs that it stops and raises SIGSTOP; SIGCONT
 * lets it go on. Tests use it to put a write of another process between two
 * steps that must hold against it (a preheat between its MySQL read and its
 * Redis write), so an interleaving is made, not waited for. Unset, it costs
 * one getenv() per call, on paths that run once a pass, never per request. */
void cs_pause_point(const char *name);

/* fsync() of the directory at path, so that a file made, renamed or
 * removed in it survives a crash. CS_OK, or CS_ERR with errno set. */
int cs_fsync_dir(const char *path);

#define CS_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
