/* rargs.h - the arguments of one Redis script call, built in place: keys
 * made by a keys_* builder, numbers printed here, strings borrowed. */
#ifndef CS_RARGS_H
#define CS_RARGS_H

#include "rconn.h"

#include <stddef.h>
#include <stdint.h>

/* Room each argument made here has: a key (KEYS_MAX) or a number. */
#define RARGS_OWN 96

/* One argument: borrowed (p set) or made here (p NULL, in own). */
struct rarg {
    const char *p;
    size_t len;
    char own[RARGS_OWN];
};

/*
 * An argument list that grows as it is built (no fixed count to keep in
 * step with a loop). Start it as RARGS_INIT, add in call order, then run
 * it with rargs_evalsha() or rargs_command() as often as wanted;
 * rargs_free() frees it. Every add aborts on out-of-memory (xmalloc), so
 * there is nothing to check.
 */
struct rargs {
    struct rarg *v;
    size_t n, cap;
    const char **argv;         /* made from v by each call */
    size_t *argl;
    size_t vcap;
};

#define RARGS_INIT {NULL, 0, 0, NULL, NULL, 0}

/* s is borrowed: it must outlive every call that sends it. */
void rargs_str(struct rargs *a, const char *s);
/* s[0..len) is borrowed, as rargs_str(). */
void rargs_mem(struct rargs *a, const char *s, size_t len);
/* The decimal text of v, kept in a. */
void rargs_int(struct rargs *a, int64_t v);
/* A key made by fn (a keys_* builder) from a shard or an activity id. */
void rargs_key(struct rargs *a, size_t (*fn)(char *, int), int shard);
void rargs_akey(struct rargs *a, size_t (*fn)(char *, int64_t), int64_t id);
/* Drops the arguments past the first n (n <= a->n), to build the rest anew. */
void rargs_truncate(struct rargs *a, size_t n);
void rargs_free(struct rargs *a);

/* rconn_evalsha_at() of s with a's arguments, the first nkeys of them keys;
 * site may be NULL. The reply, or NULL as rconn_evalsha_at(). */
redisReply *rargs_evalsha(struct rconn *rc, const struct rscript *s, int nkeys, struct rargs *a,
                          struct rconn_site *site);
/* rconn_commandv_at() of a as the whole command (EVAL and its script
 * included), routed by key; site may be NULL. */
redisReply *rargs_command(struct rconn *rc, const char *key, struct rargs *a,
                          struct rconn_site *site);

#endif
