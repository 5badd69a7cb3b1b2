/* listcopy.c - per-node copy of ACTIVITY:LIST in shared memory, for the list route. */
#include "listcopy.h"
#include "breaker.h"
#include "conf.h"
#include "cs.h"
#include "keys.h"
#include "log.h"
#include "rconn.h"
#include "shm.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LISTCOPY_MAGIC 0x3154534c41534355ULL /* "UCSALST1" */
/* A rebuild taking longer than this is presumed dead; another worker may try. */
#define LISTCOPY_LEASE_MS 10000
/* A copy this old means refreshes are failing: answers say "stale". */
#define LISTCOPY_STALE_MS 5000
/* How long a worker waits for the first copy another worker is building. */
#define LISTCOPY_FIRST_WAIT_MS 3000

/* Segment layout: header, off[count + 1] (into text), text. */
struct listcopy_hdr {
    uint64_t magic;
    uint64_t count;
    uint64_t text_len;
};

static void listcopy_name(char *buf, size_t size, const char *shm_name, uint64_t gen)
{
    snprintf(buf, size, "%s.list.%" PRIu64, shm_name, gen);
}

struct listcopy_build {
    char *text;
    size_t len, cap;
    uint64_t *off;
    size_t n, ocap;
};

static void listcopy_add(struct listcopy_build *b, const char *s, size_t n)
{
    b->off = cs_grow(b->off, &b->ocap, b->n + 2, sizeof(*b->off));
    b->text = cs_grow(b->text, &b->cap, b->len + n, 1);
    b->off[b->n++] = b->len;
    memcpy(b->text + b->len, s, n);
    b->len += n;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static const char *listcopy_skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    return p;
}

/* Splits the ACTIVITY:LIST value into b, one element at a time (a cJSON tree
 * of the whole list would cost tens of megabytes); an element whose id is in
 * voided (sorted) is rewritten with status VOIDED. */
static int listcopy_split(const char *json, size_t len, const int64_t *voided, size_t nvoided,
                       struct listcopy_build *b)
{
    const char *p = listcopy_skip_ws(json, json + len), *end = json + len;

    if (p == end || *p != '[')
        return CS_ERR;
    p = listcopy_skip_ws(p + 1, end);
    while (p < end && *p != ']') {
        const char *next = NULL;
        struct activity a;
        cJSON *o = cJSON_ParseWithLengthOpts(p, (size_t)(end - p), &next, 0);
        if (o == NULL || next == NULL || activity_from_json(o, &a) != CS_OK) {
            cJSON_Delete(o);
            return CS_ERR;
        }
        cJSON_Delete(o);
        if (nvoided > 0 && bsearch(&a.id, voided, nvoided, sizeof(int64_t), cmp_i64)) {
            a.status = ACT_VOIDED;
            char *txt = activity_to_text(&a);
            listcopy_add(b, txt, strlen(txt));
            cJSON_free(txt);
        } else {
            listcopy_add(b, p, (size_t)(next - p));
        }
        p = listcopy_skip_ws(next, end);
        if (p < end && *p == ',')
            p = listcopy_skip_ws(p + 1, end);
    }
    return p < end ? CS_OK : CS_ERR;
}

static int listcopy_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return CS_ERR;
        p += w;
        n -= (size_t)w;
    }
    return CS_OK;
}

/* Writes segment GEN from b. */
static int listcopy_write_segment(const char *shm_name, uint64_t gen, const struct listcopy_build *b)
{
    char name[256];
    struct listcopy_hdr h = {LISTCOPY_MAGIC, b->n, b->len};
    uint64_t last = b->len;

    listcopy_name(name, sizeof(name), shm_name, gen);
    shm_unlink(name); /* a leftover of a rebuild that died */
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
        log_error("shm_open(%s) failed: %s", name, strerror(errno));
        return CS_ERR;
    }
    int ok = listcopy_write_all(fd, &h, sizeof(h)) == CS_OK
             && (b->n == 0 || listcopy_write_all(fd, b->off, b->n * sizeof(*b->off)) == CS_OK)
             && listcopy_write_all(fd, &last, sizeof(last)) == CS_OK
             && (b->len == 0 || listcopy_write_all(fd, b->text, b->len) == CS_OK);
    if (!ok) {
        log_error("writing %s failed: %s", name, strerror(errno));
        shm_unlink(name);
    }
    close(fd);
    return ok ? CS_OK : CS_ERR;
}

/* Reads ACTIVITY:LIST and ACTIVITY:VOIDED and publishes them as the next
 * generation, begun at START (cs_mono_ms). The caller holds the lease. When
 * the list's generation in Redis is the one the copy was read at, and the
 * list was read less than LISTCOPY_FULL_MS ago, only the copy's time moves: one
 * small GET instead of megabytes. On a connection of its own, with
 * coupon-sync's longer timeout: a list of megabytes may take longer than a
 * seize may wait, and the connection's read buffer (as big as the list)
 * goes away with it instead of staying in the worker. */
static int listcopy_rebuild(const struct cs_conf *conf, struct shm_node *shm, int64_t start)
{
    struct rconn *rc;
    redisReply *list = NULL, *vs = NULL, *gr = NULL;
    struct listcopy_build b = {0};
    int64_t *voided = NULL;
    size_t nvoided = 0;
    long long rgen = -1;
    int ret = CS_ERR;

    if (!breaker_readable(shm))
        return CS_ERR;
    rc = rconn_new_conf(conf, conf->sync_redis_timeout_ms);
    gr = rconn_command(rc, KEY_ACTIVITY_LIST_GEN, "GET %s", KEY_ACTIVITY_LIST_GEN);
    if (gr == NULL) {
        log_warn("reading %s for the list copy: %s", KEY_ACTIVITY_LIST_GEN, rc->errstr);
        goto out;
    }
    if (gr->type == REDIS_REPLY_ERROR)
        goto out; /* LOADING, BUSY ...: the copy there is stands */
    rgen = gr->type == REDIS_REPLY_STRING ? strtoll(gr->str, NULL, 10) : 0;
    if (atomic_load(&shm->list_gen) != 0 && rgen == atomic_load(&shm->list_redis_gen)
        && start - atomic_load(&shm->list_full_ms) < LISTCOPY_FULL_MS) {
        atomic_store(&shm->list_built_ms, start);
        ret = CS_OK;
        goto out;
    }
    /* The generation was read first: a write after it is seen at the next
     * refresh, never hidden behind an old generation. */
    if (rconn_append(rc, KEY_ACTIVITY_VOIDED, "SMEMBERS %s", KEY_ACTIVITY_VOIDED) != CS_OK
        || rconn_append(rc, KEY_ACTIVITY_LIST, "GET %s", KEY_ACTIVITY_LIST) != CS_OK
        || rconn_get_reply(rc, &vs) != CS_OK || rconn_get_reply(rc, &list) != CS_OK) {
        log_warn("reading %s for the list copy: %s", KEY_ACTIVITY_LIST, rc->errstr);
        goto out;
    }
    /* LOADING, BUSY ...: the copy there is stands. */
    if (list->type == REDIS_REPLY_ERROR || vs->type == REDIS_REPLY_ERROR)
        goto out;
    if (vs->type == REDIS_REPLY_ARRAY && vs->elements > 0) {
        voided = xmalloc(vs->elements * sizeof(*voided));
        for (size_t i = 0; i < vs->elements; i++) {
            const redisReply *e = vs->element[i];
            if (e->type == REDIS_REPLY_STRING && cs_parse_id(e->str, e->len, &voided[nvoided])
                                                     == CS_OK)
                nvoided++;
        }
        qsort(voided, nvoided, sizeof(*voided), cmp_i64);
    }
    if (list->type == REDIS_REPLY_STRING) {
        if (listcopy_split(list->str, list->len, voided, nvoided, &b) != CS_OK) {
            log_error("%s holds malformed JSON; listing nothing", KEY_ACTIVITY_LIST);
            b.n = b.len = 0;
        }
    } else if (list->type != REDIS_REPLY_NIL) {
        log_error("GET %s: unexpected reply type %d", KEY_ACTIVITY_LIST, list->type);
        goto out;
    }
    /* The big reply and the connection go before the segment is written. */
    freeReplyObject(list);
    list = NULL;
    rconn_free(rc);
    rc = NULL;

    uint64_t old = atomic_load(&shm->list_gen), gen = old + 1;
    if (listcopy_write_segment(conf->fcgi_shm_name, gen, &b) != CS_OK)
        goto out;
    atomic_store(&shm->list_redis_gen, rgen);
    atomic_store(&shm->list_full_ms, start);
    atomic_store(&shm->list_gen, gen);
    atomic_store(&shm->list_built_ms, start);
    if (old != 0) {
        char name[256];
        listcopy_name(name, sizeof(name), conf->fcgi_shm_name, old);
        shm_unlink(name); /* readers that opened it keep it until they close */
    }
    ret = CS_OK;
out:
    if (gr)
        freeReplyObject(gr);
    if (list)
        freeReplyObject(list);
    if (vs)
        freeReplyObject(vs);
    rconn_free(rc);
    free(voided);
    free(b.text);
    free(b.off);
    /* Megabytes were just allocated and freed: give them back, so a worker's
     * footprint does not keep the list's size. */
    if (b.len > 0)
        malloc_trim(0);
    return ret;
}

/* Rebuilds the copy when it is older than cache.refresh_ms, or was read
 * before an admin change on this node, and no other worker is at it.
 * *failed when this worker tried and failed. */
static void listcopy_refresh(const struct cs_conf *conf, struct shm_node *shm, int *failed)
{
    int64_t now = cs_mono_ms();
    int64_t built = atomic_load(&shm->list_built_ms);

    *failed = 0;
    if (atomic_load(&shm->list_gen) != 0 && now - built < conf->cache_refresh_ms
        && built > atomic_load(&shm->list_invalid_ms))
        return;
    int64_t lease = atomic_load(&shm->list_lease_until_ms);
    if (lease > now || !atomic_compare_exchange_strong(&shm->list_lease_until_ms, &lease,
                                                       now + LISTCOPY_LEASE_MS))
        return; /* someone else rebuilds; their copy or the current one serves */
    if (listcopy_rebuild(conf, shm, now) != CS_OK)
        *failed = 1;
    /* Failing, the lease is kept until the refresh interval is over, so a
     * dead Redis is asked once a second per node, not once per request. */
    atomic_store(&shm->list_lease_until_ms, *failed ? now + LISTCOPY_REFRESH_MS : 0);
}

void listcopy_invalidate(const struct cs_conf *conf, struct shm_node *shm)
{
    int64_t now = cs_mono_ms(), deadline = now + LISTCOPY_FIRST_WAIT_MS;
    int failed = 0;

    atomic_store(&shm->list_invalid_ms, now);
    /* A rebuild another worker began before now may be publishing: wait
     * for the lease, then read again. */
    while (!failed && atomic_load(&shm->list_built_ms) <= now && cs_mono_ms() < deadline) {
        listcopy_refresh(conf, shm, &failed);
        if (atomic_load(&shm->list_built_ms) <= now) {
            struct timespec ts = {0, 5 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
}

/* Reads the page from segment GEN. CS_ERR with errno ENOENT when the segment
 * was replaced meanwhile. */
static int listcopy_read(const char *shm_name, uint64_t gen, size_t page, size_t size,
                      struct listcopy_page *out)
{
    char name[256];
    struct stat st;
    int ret = CS_ERR;

    listcopy_name(name, sizeof(name), shm_name, gen);
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd < 0)
        return CS_ERR;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(struct listcopy_hdr) + 8) {
        close(fd);
        errno = EINVAL;
        return CS_ERR;
    }
    size_t len = (size_t)st.st_size;
    const char *map = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return CS_ERR;
    const struct listcopy_hdr *h = (const void *)map;
    const uint64_t *off = (const void *)(map + sizeof(*h));
    const char *text = (const char *)(off + h->count + 1);
    if (h->magic != LISTCOPY_MAGIC || sizeof(*h) + (h->count + 1) * 8 + h->text_len != len) {
        errno = EINVAL;
        goto out;
    }
    out->total = h->count;
    /* Checked before multiplying, so a huge page number cannot wrap around. */
    if (page - 1 > h->count / size || (page - 1) * size >= h->count) {
        ret = CS_OK;
        goto out;
    }
    size_t first = (page - 1) * size;
    size_t last = first + size < h->count ? first + size : h->count;
    out->acts = xmalloc((last - first) * sizeof(*out->acts));
    for (size_t i = first; i < last; i++) {
        cJSON *o = cJSON_ParseWithLength(text + off[i], off[i + 1] - off[i]);
        if (o != NULL && activity_from_json(o, &out->acts[out->n]) == CS_OK)
            out->n++;
        cJSON_Delete(o);
    }
    ret = CS_OK;
out:
    munmap((void *)map, len);
    return ret;
}

int listcopy_page(const struct cs_conf *conf, struct shm_node *shm, size_t page, size_t size,
               struct listcopy_page *out)
{
    int failed;

    memset(out, 0, sizeof(*out));
    listcopy_refresh(conf, shm, &failed);
    int64_t deadline = cs_mono_ms() + LISTCOPY_FIRST_WAIT_MS;
    for (int tries = 0; tries < 1000; tries++) {
        uint64_t gen = atomic_load(&shm->list_gen);
        if (gen == 0) {
            /* The first copy: another worker may be building it now. */
            if (failed || cs_mono_ms() >= deadline)
                return CS_ERR;
            struct timespec ts = {0, 10 * 1000000L};
            nanosleep(&ts, NULL);
            listcopy_refresh(conf, shm, &failed);
            continue;
        }
        if (listcopy_read(conf->fcgi_shm_name, gen, page, size, out) == CS_OK) {
            out->stale = failed
                         || cs_mono_ms() - atomic_load(&shm->list_built_ms) > LISTCOPY_STALE_MS;
            return CS_OK;
        }
        if (errno != ENOENT) {
            log_error("reading the activity list copy %" PRIu64 ": %s", gen, strerror(errno));
            return CS_ERR;
        }
        if (atomic_load(&shm->list_gen) == gen) {
            /* Not replaced, gone (removed by hand, or named after an
             * fcgi.shm_name a reload changed): build a new one now. */
            atomic_store(&shm->list_built_ms, 0);
            listcopy_refresh(conf, shm, &failed);
            if (failed || cs_mono_ms() >= deadline)
                return CS_ERR;
            if (atomic_load(&shm->list_gen) == gen) {
                struct timespec ts = {0, 10 * 1000000L};
                nanosleep(&ts, NULL); /* another worker is building it */
            }
        }
        /* Replaced between the load of gen and the open: read the new one. */
    }
    return CS_ERR;
}

void listcopy_page_free(struct listcopy_page *p)
{
    free(p->acts);
    memset(p, 0, sizeof(*p));
}

void listcopy_unlink(struct shm_node *shm, const char *shm_name)
{
    char name[256];
    uint64_t gen = atomic_load(&shm->list_gen);
    if (gen == 0)
        return;
    listcopy_name(name, sizeof(name), shm_name, gen);
    shm_unlink(name);
}
