/* actlist.c - ACTIVITY:LIST, the activities on sale as one JSON array:
 * its generation, its check-and-set write, its in-place splice of one
 * activity, its rewrite from MySQL, and what a periodic preheat wrote. */
#include "actlist.h"
#include "activity.h"
#include "cs.h"
#include "keys.h"
#include "mconn.h"
#include "preheat.h"
#include "preheat_int.h"
#include "rconn.h"
#include "revoke.h"
#include "scripts.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Growing text buffer. */
struct actlist_buf {
    char *p;
    size_t len, cap;
};

static void actlist_buf_add(struct actlist_buf *b, const char *s, size_t n)
{
    b->p = cs_grow(b->p, &b->cap, b->len + n + 1, 1);
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

/* Generation of ACTIVITY:LIST (0 before the first write), read before the
 * MySQL read a list write is made from. */
int actlist_gen(struct rconn *rc, long long *gen, char *err, size_t errlen)
{
    redisReply *r = rconn_command(rc, KEY_ACTIVITY_LIST_GEN, "GET %s", KEY_ACTIVITY_LIST_GEN);
    if (rconn_expect(rc, r, 0, "GET", KEY_ACTIVITY_LIST_GEN, err, errlen) != CS_OK)
        return CS_ERR;
    *gen = r->type == REDIS_REPLY_STRING ? strtoll(r->str, NULL, 10) : 0;
    freeReplyObject(r);
    return CS_OK;
}

/* Sets ACTIVITY:LIST to the JSON array of vec, made from a MySQL read that
 * began after generation GEN was read, unless it holds that already. CS_OK
 * with *stale = 1 when another writer wrote meanwhile: nothing was written,
 * and the caller reads MySQL again. Written element by element: a whole
 * cJSON tree of 20,000 activities would cost tens of megabytes. */
int actlist_write(struct rconn *rc, const struct preheat_vec *vec, long long gen, int *stale,
                          char *err, size_t errlen)
{
    struct actlist_buf b = {0};

    *stale = 0;
    actlist_buf_add(&b, "[", 1);
    for (size_t i = 0; i < vec->n; i++) {
        if (i > 0)
            actlist_buf_add(&b, ",", 1);
        actlist_buf_add(&b, vec->txt[i], strlen(vec->txt[i]));
    }
    actlist_buf_add(&b, "]", 1);
    /* Unchanged (the usual case of a periodic preheat): nothing to write, so
     * nothing for the append-only file to fsync. */
    redisReply *r = rconn_command(rc, KEY_ACTIVITY_LIST, "GET %s", KEY_ACTIVITY_LIST);
    int same = r != NULL && r->type == REDIS_REPLY_STRING && r->len == b.len &&
               memcmp(r->str, b.p, b.len) == 0;
    if (r != NULL)
        freeReplyObject(r);
    if (same) {
        free(b.p);
        return CS_OK;
    }
    r = rconn_command(rc, KEY_ACTIVITY_LIST, "EVAL %s 2 %s %s %b %lld", script_activity_list_cas,
                      KEY_ACTIVITY_LIST, KEY_ACTIVITY_LIST_GEN, b.p, b.len, gen);
    free(b.p);
    if (rconn_expect(rc, r, REDIS_REPLY_INTEGER, "EVAL list write", KEY_ACTIVITY_LIST, err,
                     errlen) != CS_OK)
        return CS_ERR;
    *stale = r->integer == SCRIPT_LIST_RACED;
    freeReplyObject(r);
    return CS_OK;
}

/* FNV-1a of s. */
static uint64_t actlist_hash(const char *s)
{
    uint64_t h = 14695981039346656037ULL;
    for (; *s != '\0'; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

static int actlist_listed_cmp(const void *x, const void *y)
{
    const struct preheat_listed *a = x, *b = y;
    return (a->id > b->id) - (a->id < b->id);
}

/* Remembers in mark what ACTIVITY:LIST was written with. */
void actlist_mark(struct preheat_mark *mark, const struct preheat_vec *vec)
{
    mark->listed = xrealloc(mark->listed, (vec->n + 1) * sizeof(*mark->listed));
    for (size_t i = 0; i < vec->n; i++) {
        mark->listed[i].id = vec->v[i].id;
        mark->listed[i].hash = actlist_hash(vec->txt[i]);
    }
    mark->nlisted = vec->n;
    qsort(mark->listed, mark->nlisted, sizeof(*mark->listed), actlist_listed_cmp);
    mark->have_list = 1;
}

/* Whether an activity of vec is not in the list as mark remembers it. */
int actlist_differs(const struct preheat_mark *mark, const struct preheat_vec *vec)
{
    if (!mark->have_list)
        return vec->n > 0;
    for (size_t i = 0; i < vec->n; i++) {
        struct preheat_listed key = {.id = vec->v[i].id};
        const struct preheat_listed *hit =
            mark->nlisted > 0 ? bsearch(&key, mark->listed, mark->nlisted, sizeof(key),
                                        actlist_listed_cmp)
                              : NULL;
        if (hit == NULL || hit->hash != actlist_hash(vec->txt[i]))
            return 1;
    }
    return 0;
}

static const char *actlist_skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    return p;
}

/* Builds into out the list value LIST (len bytes) with ID's element removed
 * and, when txt is not NULL, txt inserted at its place by (start, id), the
 * order of SQL_PREHEAT. Element by element, never a cJSON tree of the whole
 * list. CS_ERR when LIST is not an array of activities. */
static int actlist_splice_text(const char *list, size_t len, int64_t id, const struct activity *a,
                                const char *txt, struct actlist_buf *out)
{
    const char *p = actlist_skip_ws(list, list + len), *end = list + len;
    int n = 0, placed = txt == NULL;

    if (p == end || *p != '[')
        return CS_ERR;
    actlist_buf_add(out, "[", 1);
    p = actlist_skip_ws(p + 1, end);
    while (p < end && *p != ']') {
        const char *next = NULL;
        struct activity e;
        cJSON *o = cJSON_ParseWithLengthOpts(p, (size_t)(end - p), &next, 0);
        int ok = o != NULL && next != NULL && activity_from_json(o, &e) == CS_OK;
        cJSON_Delete(o);
        if (!ok)
            return CS_ERR;
        if (!placed && (e.start_ms > a->start_ms || (e.start_ms == a->start_ms && e.id > id))) {
            if (n++ > 0)
                actlist_buf_add(out, ",", 1);
            actlist_buf_add(out, txt, strlen(txt));
            placed = 1;
        }
        if (e.id != id) {
            if (n++ > 0)
                actlist_buf_add(out, ",", 1);
            actlist_buf_add(out, p, (size_t)(next - p));
        }
        p = actlist_skip_ws(next, end);
        if (p < end && *p == ',')
            p = actlist_skip_ws(p + 1, end);
    }
    if (p == end)
        return CS_ERR;
    if (!placed) {
        if (n > 0)
            actlist_buf_add(out, ",", 1);
        actlist_buf_add(out, txt, strlen(txt));
    }
    actlist_buf_add(out, "]", 1);
    return CS_OK;
}

/* Puts activity ID's element into ACTIVITY:LIST in place: vec holds ID as
 * MySQL had it after generation GEN was read (or nothing: it left the list).
 * One read and one write of the list, not a read of every activity in MySQL.
 * CS_OK with *stale = 1 when another writer wrote since GEN (nothing
 * written: the caller reads the row again); CS_ERR when the list cannot be
 * read or written, or is malformed (then *malformed = 1). */
int actlist_splice(struct rconn *rc, int64_t id, const struct preheat_vec *vec, long long gen,
                           int *stale, int *malformed, char *err, size_t errlen)
{
    struct actlist_buf b = {0};
    int ret = CS_ERR;

    *stale = 0;
    *malformed = 0;
    redisReply *r = rconn_command(rc, KEY_ACTIVITY_LIST, "GET %s", KEY_ACTIVITY_LIST);
    if (rconn_expect(rc, r, 0, "GET", KEY_ACTIVITY_LIST, err, errlen) != CS_OK)
        return CS_ERR;
    const struct activity *a = vec->n > 0 ? &vec->v[0] : NULL;
    const char *txt = vec->n > 0 ? vec->txt[0] : NULL;
    if (r->type == REDIS_REPLY_NIL) {
        actlist_buf_add(&b, "[", 1);
        if (txt != NULL)
            actlist_buf_add(&b, txt, strlen(txt));
        actlist_buf_add(&b, "]", 1);
    } else if (r->type != REDIS_REPLY_STRING
               || actlist_splice_text(r->str, r->len, id, a, txt, &b) != CS_OK) {
        snprintf(err, errlen, "%s is not a JSON array of activities", KEY_ACTIVITY_LIST);
        *malformed = 1;
        goto out;
    }
    if (r->type == REDIS_REPLY_STRING && r->len == b.len && memcmp(r->str, b.p, b.len) == 0) {
        ret = CS_OK; /* already in place: nothing to write */
        goto out;
    }
    freeReplyObject(r);
    r = rconn_command(rc, KEY_ACTIVITY_LIST, "EVAL %s 2 %s %s %b %lld", script_activity_list_cas,
                      KEY_ACTIVITY_LIST, KEY_ACTIVITY_LIST_GEN, b.p, b.len, gen);
    if (rconn_expect(rc, r, REDIS_REPLY_INTEGER, "EVAL list write", KEY_ACTIVITY_LIST, err,
                     errlen) != CS_OK) {
        r = NULL;
        goto out;
    }
    *stale = r->integer == SCRIPT_LIST_RACED;
    ret = CS_OK;
out:
    if (r != NULL)
        freeReplyObject(r);
    free(b.p);
    return ret;
}

/* Rewrites ACTIVITY:LIST from a fresh MySQL read (generation first, then the
 * SELECT, then a write that holds only if no one wrote meanwhile), so the
 * list never goes back in time: every writer whose MySQL read is older than
 * the last write reads again. CS_ERR with a message in err. */
int actlist_rewrite(struct mconn *mc, struct rconn *rc, int horizon_days, int grace_s,
                         char *err, size_t errlen)
{
    for (int tries = 0; tries < ACTLIST_TRIES; tries++) {
        struct preheat_vec vec;
        long long gen;
        int stale = 0, ret;

        if (actlist_gen(rc, &gen, err, errlen) != CS_OK
            || preheat_select(mc, horizon_days, grace_s, 0, 0, &vec, err, errlen) != CS_OK)
            return CS_ERR;
        ret = revoke_drop_voided(rc, &vec, err, errlen);
        if (ret == CS_OK)
            ret = actlist_write(rc, &vec, gen, &stale, err, errlen);
        preheat_vec_free(&vec);
        if (ret != CS_OK || !stale)
            return ret;
    }
    snprintf(err, errlen, "%s: %d writers came between", KEY_ACTIVITY_LIST, ACTLIST_TRIES);
    return CS_ERR;
}
