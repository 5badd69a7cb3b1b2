/* rargs.c - the arguments of one Redis script call, built in place. */
#include "rargs.h"
#include "cs.h"
#include "keys.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(RARGS_OWN >= KEYS_MAX && RARGS_OWN >= 21, "a key or an int64 fits in own");

static struct rarg *rargs_next(struct rargs *a)
{
    a->v = cs_grow(a->v, &a->cap, a->n + 1, sizeof(*a->v));
    return &a->v[a->n++];
}

void rargs_mem(struct rargs *a, const char *s, size_t len)
{
    struct rarg *r = rargs_next(a);
    r->p = s;
    r->len = len;
}

void rargs_str(struct rargs *a, const char *s)
{
    rargs_mem(a, s, strlen(s));
}

void rargs_int(struct rargs *a, int64_t v)
{
    struct rarg *r = rargs_next(a);
    r->p = NULL;
    r->len = (size_t)snprintf(r->own, sizeof(r->own), "%" PRId64, v);
}

void rargs_key(struct rargs *a, size_t (*fn)(char *, int), int shard)
{
    struct rarg *r = rargs_next(a);
    r->p = NULL;
    r->len = fn(r->own, shard);
}

void rargs_akey(struct rargs *a, size_t (*fn)(char *, int64_t), int64_t id)
{
    struct rarg *r = rargs_next(a);
    r->p = NULL;
    r->len = fn(r->own, id);
}

void rargs_truncate(struct rargs *a, size_t n)
{
    if (n < a->n)
        a->n = n;
}

void rargs_free(struct rargs *a)
{
    free(a->v);
    free(a->argv);
    free(a->argl);
    *a = (struct rargs)RARGS_INIT;
}

/* Points argv/argl at the arguments as they are now (v may have moved). */
static void rargs_vec(struct rargs *a)
{
    if (a->n > a->vcap) {
        size_t cap = a->vcap;
        a->argv = cs_grow(a->argv, &cap, a->n, sizeof(*a->argv));
        a->argl = xrealloc(a->argl, cap * sizeof(*a->argl));
        a->vcap = cap;
    }
    for (size_t i = 0; i < a->n; i++) {
        a->argv[i] = a->v[i].p != NULL ? a->v[i].p : a->v[i].own;
        a->argl[i] = a->v[i].len;
    }
}

redisReply *rargs_evalsha(struct rconn *rc, const struct rscript *s, int nkeys, struct rargs *a,
                          struct rconn_site *site)
{
    struct rconn_site dummy;
    rargs_vec(a);
    return rconn_evalsha_at(rc, s, nkeys, (int)a->n, a->argv, a->argl,
                            site != NULL ? site : &dummy);
}

redisReply *rargs_command(struct rconn *rc, const char *key, struct rargs *a,
                          struct rconn_site *site)
{
    rargs_vec(a);
    return rconn_commandv_at(rc, key, (int)a->n, a->argv, a->argl, site);
}
