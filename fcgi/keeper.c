/* keeper.c - the reserve keeper (DESIGN.md "Selling through a slow or
 * missing Redis"): sets reserves aside, renews the node's lease, replays the
 * journal and gives reserves back. One process per node; the workers spend
 * what it publishes in shared memory (lib/reserve.c).
 *
 * Each pass (KEEPER_TICK_MS):
 *   1. renew the lease of every shard that holds a reserve of this node; the
 *      answer carries the sale's stock, window and this node's open reserve;
 *   2. stop the reserves that must go back (sale over or revoked, stock at
 *      the low-water mark, fallback.reserve lowered, stopping) and fence them:
 *      no worker is left inside a grant;
 *   3. replay every journal record not yet replayed, one script per token,
 *      and WAIT for the durability rule before counting a record as done;
 *   4. give back the fenced reserves whose records are all replayed, close
 *      their epochs in MySQL;
 *   5. now and then, set aside a reserve for open sales with plenty of stock.
 */
#include "keeper.h"
#include "activity.h"
#include "conf.h"
#include "cs.h"
#include "journal.h"
#include "keys.h"
#include "log.h"
#include "mconn.h"
#include "rconn.h"
#include "reserve.h"
#include "shm.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <fcntl.h>

#define KEEPER_TICK_MS 100
#define KEEPER_ASIDE_MS 1000       /* how often open sales are looked at for a set-aside */
#define KEEPER_LIST_MS 2000        /* how often the activity list's generation is read */
#define KEEPER_ASIDE_BATCH 64      /* sales read from Redis per set-aside pass (two reads each) */
#define KEEPER_ASIDE_VISIT 1024    /* sales of the list gone through per pass */
#define KEEPER_STOP_MS 10000       /* a graceful stop gives up on Redis after this */

static const char SQL_RSV_NEXT[] =
    "SELECT COALESCE(MAX(epoch), 0) + 1 FROM reserve_epoch "
    "WHERE activity_id = ? AND incarnation = ?";
static const char SQL_RSV_OPEN[] =
    "INSERT INTO reserve_epoch (activity_id, incarnation, epoch, amount) VALUES (?, ?, ?, ?)";
static const char SQL_RSV_AMOUNT[] =
    "UPDATE reserve_epoch SET amount = ? "
    "WHERE activity_id = ? AND incarnation = ? AND epoch = ? AND state = 1";
static const char SQL_RSV_CLOSE[] =
    "UPDATE reserve_epoch SET state = 2, closed_by = 'node', returned = ?, "
    "amount = IF(? < 0, amount, ?), closed_at = NOW(3) "
    "WHERE activity_id = ? AND incarnation = ? AND epoch = ? AND state = 1";
static const char SQL_RSV_MINE[] =
    "SELECT activity_id, epoch, amount FROM reserve_epoch WHERE incarnation = ? AND state = 1";
static const char SQL_RSV_STATE[] =
    "SELECT state, COALESCE(closed_by, '') FROM reserve_epoch "
    "WHERE activity_id = ? AND incarnation = ? AND epoch = ?";

/* What the keeper knows of a slot beyond shared memory. */
struct kslot {
    int giveback;              /* stopped to be given back */
    int resume;                /* stopped until replayed (a restart, a restore) */
    int unconfirmed;           /* set aside, the durability rule not met yet */
    int in_doubt;              /* the set-aside script's answer was lost: ask again */
    int closed_elsewhere;      /* its epoch was closed by an admin: drop after replay */
    int64_t pending;           /* its records not yet replayed */
    int64_t stock, held;       /* from the last renewal */
    int field;                 /* the last renewal found this node's reserve field */
    int low_water;             /* given back at the low-water mark: no more for this sale */
};

struct kfile {
    char name[64];
    int index;
    uint64_t seg;
    uint64_t done;             /* records replayed and durable */
    int seen;
};

struct kact {
    int64_t id, start_ms, end_ms;
    int open_to_all;           /* no eligibleGroups */
};

/* Epochs closed by this node (given back after a full replay): their
 * records were replayed before, and are never replayed again. */
struct kclosed {
    int64_t aid;
    uint64_t epoch;
};

struct keeper {
    const struct cs_conf *conf;
    struct shm_node *shm;
    struct shm_reserves *rv;
    struct journal_dir jd;
    struct rconn *rc;
    struct mconn *mc;
    struct rscript s_aside, s_renew, s_replay, s_give;
    struct kslot loc[SHM_RESERVES];
    struct kfile *files;
    size_t nfiles;
    struct kclosed *closed;
    size_t nclosed;
    int renewed[KEYS_SHARDS];
    int64_t restored[KEYS_SHARDS];  /* restore generation seen; -1 none yet */
    struct kact *acts;
    size_t nacts;
    long long list_gen;
    size_t aside_next;         /* where the next set-aside pass goes on in acts */
    int64_t list_next_ms, aside_next_ms;
    int margin_ms;
};

static volatile sig_atomic_t keeper_stop;

static void keeper_on_term(int sig)
{
    (void)sig;
    keeper_stop = 1;
}

int keeper_wanted(const struct cs_conf *conf)
{
    if (conf->fallback_reserve > 0)
        return 1;
    DIR *d = opendir(conf->fallback_journal);
    if (d == NULL)
        return 0;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d)) != NULL) {
        int index;
        uint64_t seg;
        found = journal_parse_segment(e->d_name, &index, &seg) == CS_OK;
    }
    closedir(d);
    return found;
}

/* ---- small helpers ------------------------------------------------------------ */

struct kargs {
    const char *argv[16];
    size_t argl[16];
    char buf[16][48];
    int n;
};

static void ka_str(struct kargs *a, const char *s)
{
    a->argv[a->n] = s;
    a->argl[a->n] = strlen(s);
    a->n++;
}

static void ka_int(struct kargs *a, int64_t v)
{
    int n = snprintf(a->buf[a->n], sizeof(a->buf[0]), "%" PRId64, v);
    a->argv[a->n] = a->buf[a->n];
    a->argl[a->n] = (size_t)n;
    a->n++;
}

static void ka_key(struct kargs *a, size_t (*fn)(char *, int), int shard)
{
    fn(a->buf[a->n], shard);
    ka_str(a, a->buf[a->n]);
}

static void ka_akey(struct kargs *a, size_t (*fn)(char *, int64_t), int64_t id)
{
    fn(a->buf[a->n], id);
    ka_str(a, a->buf[a->n]);
}

static redisReply *keeper_eval(struct keeper *k, struct rscript *s, int nkeys, struct kargs *a,
                               struct rconn_site *site)
{
    struct rconn_site dummy;
    return rconn_evalsha_at(k->rc, s, nkeys, a->n, a->argv, a->argl, site ? site : &dummy);
}

/* The durability rule for a write that ran at site (fence: it wrote nothing). */
static int keeper_durable(struct keeper *k, int shard, const struct rconn_site *site, int fence)
{
    char fkey[KEYS_MAX];
    if (k->conf->redis_wait_replicas <= 0)
        return CS_OK;
    int copies = rconn_copies(k->rc, site, k->conf->redis_wait_replicas);
    if (fence)
        keys_fence(fkey, shard);
    return rconn_wait_at(k->rc, site, fence ? fkey : NULL, copies,
                         k->conf->redis_wait_timeout_ms);
}

static int keeper_is_closed(const struct keeper *k, int64_t aid, uint64_t epoch)
{
    for (size_t i = 0; i < k->nclosed; i++)
        if (k->closed[i].aid == aid && k->closed[i].epoch == epoch)
            return 1;
    return 0;
}

static void keeper_add_closed(struct keeper *k, int64_t aid, uint64_t epoch)
{
    if (keeper_is_closed(k, aid, epoch))
        return;
    k->closed = xrealloc(k->closed, (k->nclosed + 1) * sizeof(*k->closed));
    k->closed[k->nclosed++] = (struct kclosed){aid, epoch};
}

static void keeper_lease_set(struct shm_reserves *rv, int shard, int64_t sent, int64_t recv,
                             int64_t redis_ms)
{
    struct shm_rsv_lease *l = &rv->lease[shard];
    atomic_fetch_add(&l->seq, 1);
    atomic_store(&l->sent_mono, sent);
    atomic_store(&l->recv_mono, recv);
    atomic_store(&l->redis_ms, redis_ms);
    atomic_fetch_add(&l->seq, 1);
}

/* Slot i: no new grants, and whether every grant in flight is done. */
static int keeper_fenced(struct keeper *k, int i)
{
    atomic_store(&k->rv->slot[i].state, RSV_STOPPED);
    for (int w = 0; w < SHM_MAX_WORKERS; w++)
        if (atomic_load(&k->rv->busy[w]) == i + 1)
            return 0;
    return 1;
}

static void keeper_slot_free(struct keeper *k, int i)
{
    struct shm_rsv_slot *s = &k->rv->slot[i];
    atomic_store(&s->state, RSV_EMPTY);
    atomic_store(&s->activity_id, 0);
    memset(&k->loc[i], 0, sizeof(k->loc[i]));
}

/* ---- MySQL --------------------------------------------------------------------- */

static int row_int(void *arg, int ncols, char **cols)
{
    if (ncols >= 1 && cols[0] != NULL)
        *(int64_t *)arg = strtoll(cols[0], NULL, 10);
    return CS_OK;
}

struct state_row {
    int state;
    char by[16];
};

static int row_state(void *arg, int ncols, char **cols)
{
    struct state_row *r = arg;
    if (ncols >= 2 && cols[0] != NULL) {
        r->state = atoi(cols[0]);
        snprintf(r->by, sizeof(r->by), "%s", cols[1] ? cols[1] : "");
    }
    return CS_OK;
}

/* The epoch's row: 1 open, 2 closed (by in *by), 0 no row, -1 MySQL failed. */
static int keeper_epoch_state(struct keeper *k, int64_t aid, uint64_t epoch, char *by,
                              size_t bylen)
{
    struct state_row r = {0, ""};
    struct mval p[] = {MV_INT(aid), MV_TXT(k->jd.incarnation, JOURNAL_ID_LEN),
                       MV_INT((int64_t)epoch)};
    if (mconn_query(k->mc, SQL_RSV_STATE, p, 3, row_state, &r) != CS_OK) {
        log_warn("reserve keeper: reading epoch %" PRId64 "/%" PRIu64 ": %s", aid, epoch,
                 k->mc->errstr);
        return -1;
    }
    snprintf(by, bylen, "%s", r.by);
    return r.state;
}

static int keeper_close_epoch(struct keeper *k, int64_t aid, uint64_t epoch, int64_t returned,
                              int64_t amount)
{
    struct mval p[] = {MV_INT(returned), MV_INT(amount), MV_INT(amount), MV_INT(aid),
                       MV_TXT(k->jd.incarnation, JOURNAL_ID_LEN), MV_INT((int64_t)epoch)};
    if (mconn_exec(k->mc, SQL_RSV_CLOSE, p, 6, NULL) != CS_OK) {
        log_warn("reserve keeper: closing epoch %" PRId64 "/%" PRIu64 " in MySQL: %s", aid,
                 epoch, k->mc->errstr);
        return CS_ERR;
    }
    return CS_OK;
}

/* ---- the journal --------------------------------------------------------------- */

static struct kfile *keeper_file(struct keeper *k, const char *name, int index, uint64_t seg)
{
    for (size_t i = 0; i < k->nfiles; i++)
        if (strcmp(k->files[i].name, name) == 0)
            return &k->files[i];
    k->files = xrealloc(k->files, (k->nfiles + 1) * sizeof(*k->files));
    struct kfile *f = &k->files[k->nfiles++];
    memset(f, 0, sizeof(*f));
    snprintf(f->name, sizeof(f->name), "%s", name);
    f->index = index;
    f->seg = seg;
    return f;
}

/* Lists the segments in the directory into k->files (those gone are dropped). */
static void keeper_list_files(struct keeper *k)
{
    DIR *d = opendir(k->jd.path);
    if (d == NULL)
        return;
    for (size_t i = 0; i < k->nfiles; i++)
        k->files[i].seen = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int index;
        uint64_t seg;
        if (strlen(e->d_name) < sizeof(k->files[0].name)
            && journal_parse_segment(e->d_name, &index, &seg) == CS_OK)
            keeper_file(k, e->d_name, index, seg)->seen = 1;
    }
    closedir(d);
    size_t m = 0;
    for (size_t i = 0; i < k->nfiles; i++)
        if (k->files[i].seen)
            k->files[m++] = k->files[i];
    k->nfiles = m;
}

struct krec {
    struct journal_rec r;
    struct kfile *f;
    uint64_t pos;              /* record number in its file */
};

struct kscan {
    struct krec *v;
    size_t n, cap;
    struct kfile *f;
    uint64_t pos;
};

static int keeper_scan_rec(void *arg, const struct journal_rec *rec)
{
    struct kscan *s = arg;
    uint64_t pos = s->pos++;
    if (pos < s->f->done)
        return 0;
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 256;
        s->v = xrealloc(s->v, s->cap * sizeof(*s->v));
    }
    s->v[s->n++] = (struct krec){*rec, s->f, pos};
    return 0;
}

/* Every record not yet replayed, file by file in order. */
static void keeper_read_journal(struct keeper *k, struct kscan *s)
{
    char path[PATH_MAX];
    memset(s, 0, sizeof(*s));
    keeper_list_files(k);
    for (size_t i = 0; i < k->nfiles; i++) {
        s->f = &k->files[i];
        s->pos = 0;
        snprintf(path, sizeof(path), "%s/%s", k->jd.path, s->f->name);
        if (journal_scan(path, keeper_scan_rec, s, NULL) < 0 && errno != ENOENT)
            log_warn("reserve keeper: reading %s: %s", path, strerror(errno));
    }
}

/* A record on disk is a grant, whether or not its worker lived to answer:
 * the user is told ALREADY_SEIZED from now on, not UNKNOWN_OUTCOME. */
static void keeper_mark_granted(struct keeper *k, int64_t aid, int64_t uid)
{
    int e = reserve_grant_find(k->rv, aid, uid);
    int pending = RGRANT_PENDING;
    if (e >= 0)
        atomic_compare_exchange_strong(&k->rv->grant[e].state, &pending, RGRANT_GRANTED);
}

static void keeper_mark_replayed(struct keeper *k, int64_t aid, int64_t uid)
{
    int e = reserve_grant_find(k->rv, aid, uid);
    if (e >= 0)
        atomic_store(&k->rv->grant[e].state, RGRANT_REPLAYED);
}

/*
 * Replays what the journal holds for shards Redis answers on, then WAITs
 * per shard; a record counts as done (its file's mark moves past it) only
 * once its shard met the durability rule. Counts what is left per slot.
 */
static void keeper_replay(struct keeper *k)
{
    struct kscan s;
    struct rconn_site site[KEYS_SHARDS];
    int wrote[KEYS_SHARDS] = {0}, failed[KEYS_SHARDS] = {0}, durable[KEYS_SHARDS];
    int64_t t0 = cs_mono_ms();
    int replayed = 0;

    keeper_read_journal(k, &s);
    for (size_t i = 0; i < s.n; i++) {
        struct krec *kr = &s.v[i];
        const struct journal_rec *r = &kr->r;
        int shard = keys_shard(r->activity_id);
        if (keeper_is_closed(k, r->activity_id, r->epoch))
            continue; /* replayed before its epoch was given back */
        keeper_mark_granted(k, r->activity_id, r->user_id);
        if (!k->renewed[shard] || failed[shard])
            continue;
        struct kargs a = {.n = 0};
        ka_key(&a, keys_stock, shard);
        ka_akey(&a, keys_seize_list, r->activity_id);
        ka_key(&a, keys_queue, shard);
        ka_key(&a, keys_reserve, shard);
        ka_akey(&a, keys_reserve_epochs, r->activity_id);
        ka_key(&a, keys_reserve_dead, shard);
        ka_int(&a, r->activity_id);
        ka_int(&a, r->user_id);
        ka_str(&a, k->jd.incarnation);
        ka_int(&a, (int64_t)r->epoch);
        ka_int(&a, r->token);
        ka_int(&a, r->seize_ms);
        struct rconn_site at;
        redisReply *rep = keeper_eval(k, &k->s_replay, 6, &a, &at);
        if (rep == NULL || rep->type != REDIS_REPLY_INTEGER) {
            log_warn("reserve keeper: replaying activity %" PRId64 " token %" PRIu64 "/%u: %s",
                     r->activity_id, r->epoch, r->token,
                     rep != NULL && rep->type == REDIS_REPLY_ERROR ? rep->str : k->rc->errstr);
            failed[shard] = 1;
            if (rep != NULL)
                freeReplyObject(rep);
            continue;
        }
        long long res = rep->integer;
        freeReplyObject(rep);
        if (res == -3) {
            /* No stock field: Redis lost its data and is not restored yet,
             * or the sale is not preheated. Nothing was written; later. */
            log_debug("reserve keeper: activity %" PRId64 " has no stock field; replay waits",
                      r->activity_id);
            failed[shard] = 1;
            continue;
        }
        site[shard] = at;
        wrote[shard] = 1;
        replayed++;
        if (res == 2)
            atomic_fetch_add(&k->rv->duplicates, 1);
        if (res == -1) {
            atomic_fetch_add(&k->rv->dead_letters, 1);
            log_error("reserve keeper: activity %" PRId64 ": token %" PRIu64 "/%u of user %" PRId64
                      " had no open reserve and no stock to take; it is in %s",
                      r->activity_id, r->epoch, r->token, r->user_id, "COUPON:RESERVE:DEAD");
        }
        if (res != 0)
            atomic_fetch_add(&k->rv->replayed, 1);
        keeper_mark_replayed(k, r->activity_id, r->user_id);
    }
    for (int i = 0; i < KEYS_SHARDS; i++)
        durable[i] = !wrote[i] || keeper_durable(k, i, &site[i], 0) == CS_OK;

    /* Per file, the done mark moves over the leading records that are done. */
    for (size_t i = 0; i < k->nfiles; i++)
        k->files[i].seen = 0;
    for (int i = 0; i < SHM_RESERVES; i++)
        k->loc[i].pending = 0;
    int64_t depth = 0, oldest = 0;
    for (size_t i = 0; i < s.n; i++) {
        struct krec *kr = &s.v[i];
        const struct journal_rec *r = &kr->r;
        int shard = keys_shard(r->activity_id);
        int done = keeper_is_closed(k, r->activity_id, r->epoch)
                   || (k->renewed[shard] && !failed[shard] && durable[shard]);
        if (done && kr->f->seen == 0 && kr->pos == kr->f->done) {
            kr->f->done = kr->pos + 1;
            continue;
        }
        kr->f->seen = 1; /* stuck at an earlier record */
        depth++;
        if (oldest == 0 || r->seize_ms < oldest)
            oldest = r->seize_ms;
        int slot = reserve_slot_of(k->rv, r->activity_id);
        if (slot >= 0 && atomic_load(&k->rv->slot[slot].epoch) == r->epoch)
            k->loc[slot].pending++;
    }
    /* Workers add to the depth between passes; the pass sets what it found. */
    atomic_store(&k->rv->journal_depth, depth);
    atomic_store(&k->rv->oldest_unreplayed_ms, oldest);
    if (replayed > 0) {
        int64_t took = cs_mono_ms() - t0;
        atomic_store(&k->rv->last_replay_ms, took);
        log_notice("reserve keeper: replayed %d journal records in %" PRId64 " ms; %" PRId64
                   " left", replayed, took, depth);
    }
    free(s.v);
}

/*
 * A segment that is wholly replayed, older than the one workers append to,
 * and locked by nobody is deleted. When everything is replayed, workers are
 * moved to a new segment, so the old ones can go.
 */
static void keeper_retire_segments(struct keeper *k)
{
    char path[PATH_MAX];
    uint64_t cur = atomic_load(&k->rv->journal_seg);
    int bump = 0;

    for (size_t i = 0; i < k->nfiles; i++) {
        struct kfile *f = &k->files[i];
        if (f->seg >= cur) {
            bump |= f->done > 0 && atomic_load(&k->rv->journal_depth) == 0;
            continue;
        }
        snprintf(path, sizeof(path), "%s/%s", k->jd.path, f->name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        uint64_t end = 0;
        if (flock(fd, LOCK_EX | LOCK_NB) == 0 && journal_scan(path, NULL, NULL, &end) == 0
            && end / JOURNAL_RECORD <= f->done) {
            unlink(path);
            /* A file of that name made later is a new one. */
            f->done = 0;
            log_info("reserve keeper: journal segment %s replayed; deleted", f->name);
        }
        close(fd);
    }
    /* Everything replayed: workers move to a new segment, so that the
     * current one can be deleted once they let go of it. */
    if (bump)
        atomic_store(&k->rv->journal_seg, cur + 1);
}

/* ---- the lease and the slots ---------------------------------------------------- */

static void keeper_parse_window(const char *w, int64_t *start, int64_t *end)
{
    long long s, e;
    if (w != NULL && sscanf(w, "%lld,%lld", &s, &e) == 2) {
        *start = s;
        *end = e;
    }
}

/* Renews the lease of shard; CS_OK when Redis answered. */
static int keeper_renew(struct keeper *k, int shard)
{
    struct kargs a = {.n = 0};
    int idx[12], n = 0;

    ka_key(&a, keys_reserve, shard);
    ka_key(&a, keys_stock, shard);
    ka_key(&a, keys_window, shard);
    ka_str(&a, k->jd.incarnation);
    /* At most 12 activities per call (struct kargs); more take more calls. */
    int next = 0;
    int64_t first_sent = -1, first_recv = 0, first_ms = 0;
    do {
        a.n = 4;
        n = 0;
        for (; next < SHM_RESERVES && n < 12; next++) {
            struct shm_rsv_slot *s = &k->rv->slot[next];
            int64_t id = atomic_load(&s->activity_id);
            if (atomic_load(&s->state) == RSV_EMPTY || keys_shard(id) != shard)
                continue;
            idx[n++] = next;
            ka_int(&a, id);
        }
        int64_t sent = cs_mono_ms();
        redisReply *r = keeper_eval(k, &k->s_renew, 3, &a, NULL);
        int64_t recv = cs_mono_ms();
        if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 3 + 4 * (size_t)n) {
            log_debug("reserve keeper: renewing shard %d: %s", shard,
                      r != NULL && r->type == REDIS_REPLY_ERROR ? r->str : k->rc->errstr);
            if (r != NULL)
                freeReplyObject(r);
            return CS_ERR;
        }
        int64_t redis_ms = strtoll(r->element[0]->str, NULL, 10) * 1000
                           + strtoll(r->element[1]->str, NULL, 10) / 1000;
        int64_t gen = strtoll(r->element[2]->str, NULL, 10);
        if (k->restored[shard] >= 0 && gen != k->restored[shard]) {
            /* Redis was restored: stop spending until replayed. */
            log_warn("reserve keeper: shard %d was restored; reserves stop until replayed", shard);
            for (int i = 0; i < SHM_RESERVES; i++) {
                int64_t id = atomic_load(&k->rv->slot[i].activity_id);
                if (atomic_load(&k->rv->slot[i].state) != RSV_EMPTY && keys_shard(id) == shard) {
                    atomic_store(&k->rv->slot[i].state, RSV_STOPPED);
                    k->loc[i].resume = 1;
                }
            }
        }
        k->restored[shard] = gen;
        for (int j = 0; j < n; j++) {
            struct kslot *l = &k->loc[idx[j]];
            struct shm_rsv_slot *s = &k->rv->slot[idx[j]];
            redisReply **e = &r->element[3 + 4 * j];
            l->field = e[0]->type == REDIS_REPLY_STRING && e[0]->len > 0;
            /* Its reserve is gone from Redis (an admin returned it after the
             * lease ran out, or Redis lost it): stopped before this renewal
             * makes the lease good again, so no worker spends it meanwhile.
             * keeper_slots() decides what comes next. */
            if (!l->field && !l->in_doubt && atomic_load(&s->state) == RSV_OPEN)
                atomic_store(&s->state, RSV_STOPPED);
            l->stock = e[1]->type == REDIS_REPLY_STRING && e[1]->len > 0
                           ? strtoll(e[1]->str, NULL, 10) : INT64_MIN;
            l->held = e[3]->type == REDIS_REPLY_STRING ? strtoll(e[3]->str, NULL, 10) : 0;
            if (e[2]->type == REDIS_REPLY_STRING && e[2]->len > 0) {
                int64_t st = atomic_load(&s->start_ms), en = atomic_load(&s->end_ms);
                keeper_parse_window(e[2]->str, &st, &en);
                atomic_store(&s->start_ms, st);
                atomic_store(&s->end_ms, en);
            }
        }
        if (first_sent < 0) {
            first_sent = sent;
            first_recv = recv;
            first_ms = redis_ms;
        }
        freeReplyObject(r);
    } while (next < SHM_RESERVES && n == 12);
    /* The lease is made good only now, once every slot whose reserve is gone
     * is stopped; the first call's times, the oldest, are the ones kept. */
    keeper_lease_set(k->rv, shard, first_sent, first_recv, first_ms);
    return CS_OK;
}

/* Reads the true amount of a rebuilt slot's epoch from Redis; CS_OK with
 * *amount, CS_ERR when Redis did not answer, or *amount -1: not open there. */
static int keeper_epoch_amount(struct keeper *k, int64_t aid, uint64_t epoch, int64_t *amount)
{
    char key[KEYS_MAX], field[64];
    keys_reserve_epochs(key, aid);
    snprintf(field, sizeof(field), "%s:%" PRIu64, k->jd.incarnation, epoch);
    redisReply *r = rconn_command(k->rc, key, "HGET %s %s", key, field);
    if (r == NULL || (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_NIL)) {
        if (r != NULL)
            freeReplyObject(r);
        return CS_ERR;
    }
    long long n;
    *amount = r->type == REDIS_REPLY_STRING && sscanf(r->str, "open:%lld", &n) == 1 ? n : -1;
    freeReplyObject(r);
    return CS_OK;
}

/* Gives slot i's reserve back: script, durability, MySQL. */
static void keeper_give_back(struct keeper *k, int i)
{
    struct shm_rsv_slot *s = &k->rv->slot[i];
    int64_t aid = atomic_load(&s->activity_id);
    uint64_t epoch = atomic_load(&s->epoch);
    int shard = keys_shard(aid);
    struct kargs a = {.n = 0};
    struct rconn_site at;

    ka_key(&a, keys_stock, shard);
    ka_key(&a, keys_reserve, shard);
    ka_akey(&a, keys_reserve_epochs, aid);
    ka_int(&a, aid);
    ka_str(&a, k->jd.incarnation);
    ka_int(&a, (int64_t)epoch);
    ka_int(&a, 0);
    ka_int(&a, k->loc[i].low_water);
    redisReply *r = keeper_eval(k, &k->s_give, 3, &a, &at);
    if (r == NULL || r->type != REDIS_REPLY_INTEGER) {
        log_warn("reserve keeper: giving back activity %" PRId64 " epoch %" PRIu64 ": %s", aid,
                 epoch, r != NULL && r->type == REDIS_REPLY_ERROR ? r->str : k->rc->errstr);
        if (r != NULL)
            freeReplyObject(r);
        return;
    }
    long long back = r->integer;
    freeReplyObject(r);
    if (keeper_durable(k, shard, &at, back < 0) != CS_OK) {
        log_warn("reserve keeper: give-back of activity %" PRId64 " not confirmed: %s", aid,
                 k->rc->errstr);
        return; /* asked again next pass: the script answers -1 then */
    }
    if (back < 0) {
        char by[16];
        if (keeper_epoch_state(k, aid, epoch, by, sizeof(by)) == 2) {
            keeper_add_closed(k, aid, epoch);
            keeper_slot_free(k, i);
            return;
        }
        back = 0;
    }
    if (keeper_close_epoch(k, aid, epoch, back, -1) != CS_OK)
        return;
    atomic_fetch_add(&k->rv->returned, (uint64_t)back);
    log_info("reserve keeper: activity %" PRId64 " epoch %" PRIu64 ": %lld given back (%d granted)",
             aid, epoch, back, atomic_load(&s->next) < atomic_load(&s->amount)
                                   ? atomic_load(&s->next) : atomic_load(&s->amount));
    keeper_add_closed(k, aid, epoch);
    keeper_slot_free(k, i);
}

/* Decides what each slot of a renewed shard does next. */
static void keeper_slots(struct keeper *k, int stopping)
{
    int64_t now = cs_mono_ms();

    for (int i = 0; i < SHM_RESERVES; i++) {
        struct shm_rsv_slot *s = &k->rv->slot[i];
        struct kslot *l = &k->loc[i];
        int state = atomic_load(&s->state);
        if (state == RSV_EMPTY)
            continue;
        int64_t aid = atomic_load(&s->activity_id);
        uint64_t epoch = atomic_load(&s->epoch);
        int shard = keys_shard(aid);
        if (stopping && !l->giveback) {
            l->giveback = 1;
            atomic_store(&s->state, RSV_STOPPED);
        }
        if (!k->renewed[shard])
            continue;
        int64_t lo, hi;
        int lease = reserve_lease(k->rv, shard, k->conf->fallback_lease_ms, now, &lo, &hi)
                    == CS_OK;

        if (l->in_doubt)
            continue; /* keeper_set_aside() asks again */
        if (!l->field) {
            /* Not open in Redis: closed by an admin, or Redis lost it. */
            atomic_store(&s->state, RSV_STOPPED);
            char by[16];
            int st = keeper_epoch_state(k, aid, epoch, by, sizeof(by));
            if (st == 2 || st == 0) {
                l->closed_elsewhere = 1;
                if (keeper_fenced(k, i) && l->pending == 0) {
                    log_warn("reserve keeper: activity %" PRId64 " epoch %" PRIu64
                             " was closed elsewhere (%s); this node spends no more of it",
                             aid, epoch, st == 2 ? by : "no row");
                    keeper_slot_free(k, i);
                }
            } else {
                l->resume = 1; /* waits for a restore to bring it back */
            }
            continue;
        }
        /* The reasons to give back. */
        const char *why = NULL;
        if (stopping)
            why = "stopping";
        else if (k->conf->fallback_reserve == 0)
            why = "fallback.reserve is 0";
        else if (l->stock < 0 && l->stock != INT64_MIN)
            why = "revoked";
        else if (l->stock == INT64_MIN)
            why = "no stock field";
        else if (lease && hi >= atomic_load(&s->end_ms) - k->margin_ms)
            why = "the sale ends";
        else if (l->stock < 2 * l->held)
            why = "stock at the low-water mark", l->low_water = 1;
        else if (atomic_load(&s->next) >= atomic_load(&s->amount) && l->pending == 0
                 && atomic_load(&s->state) == RSV_OPEN)
            why = "spent";
        if (why != NULL && !l->giveback) {
            log_info("reserve keeper: activity %" PRId64 ": giving back its reserve (%s)", aid,
                     why);
            l->giveback = 1;
        }
        if (l->giveback) {
            if (keeper_fenced(k, i) && l->pending == 0)
                keeper_give_back(k, i);
            continue;
        }
        if (l->unconfirmed) {
            struct rconn_site at = {0, -1};
            char fkey[KEYS_MAX];
            keys_fence(fkey, shard);
            /* A fence write on the shard's master, and WAIT there. */
            redisReply *r = rconn_commandv_at(k->rc, fkey, 2, (const char *[]){"INCR", fkey},
                                              (const size_t[]){4, strlen(fkey)}, &at);
            if (r != NULL) {
                freeReplyObject(r);
                if (keeper_durable(k, shard, &at, 0) == CS_OK)
                    l->unconfirmed = 0;
            }
            if (l->unconfirmed)
                continue;
        }
        if (l->resume) {
            if (!keeper_fenced(k, i) || l->pending > 0)
                continue;
            int64_t amount;
            if (keeper_epoch_amount(k, aid, epoch, &amount) != CS_OK)
                continue;
            if (amount < 0) {
                l->field = 0;
                continue;
            }
            if (amount < atomic_load(&s->amount))
                atomic_store(&s->amount, (int32_t)amount);
            l->resume = 0;
        }
        if (atomic_load(&s->state) != RSV_OPEN && !atomic_load(&k->rv->halted)) {
            atomic_store(&s->state, RSV_OPEN);
            log_info("reserve keeper: activity %" PRId64 " epoch %" PRIu64
                     ": %d of %d tokens spendable", aid, epoch,
                     atomic_load(&s->amount) - atomic_load(&s->next), atomic_load(&s->amount));
        }
    }
}

/* ---- setting aside --------------------------------------------------------------- */

/* Whether each slot's sale is open to all users, from the list just read (a
 * sale not in it: no, so a worker without metadata grants nothing of it). */
static void keeper_slots_eligibility(struct keeper *k)
{
    for (int i = 0; i < SHM_RESERVES; i++) {
        struct shm_rsv_slot *s = &k->rv->slot[i];
        if (atomic_load(&s->state) == RSV_EMPTY)
            continue;
        int64_t id = atomic_load(&s->activity_id);
        int all = 0;
        for (size_t j = 0; j < k->nacts; j++)
            if (k->acts[j].id == id) {
                all = k->acts[j].open_to_all;
                break;
            }
        atomic_store(&s->open_to_all, all);
    }
}

static void keeper_read_list(struct keeper *k)
{
    int64_t now = cs_mono_ms();
    if (now < k->list_next_ms)
        return;
    redisReply *g = rconn_command(k->rc, KEY_ACTIVITY_LIST_GEN, "GET %s", KEY_ACTIVITY_LIST_GEN);
    if (g == NULL)
        return; /* read again on the next pass that reaches Redis */
    k->list_next_ms = now + KEEPER_LIST_MS;
    long long gen = g->type == REDIS_REPLY_STRING ? strtoll(g->str, NULL, 10) : -1;
    freeReplyObject(g);
    if (gen == k->list_gen && gen >= 0 && k->acts != NULL)
        return;
    redisReply *r = rconn_command(k->rc, KEY_ACTIVITY_LIST, "GET %s", KEY_ACTIVITY_LIST);
    if (r == NULL)
        return;
    struct activity *all = NULL;
    size_t n = 0;
    if (r->type == REDIS_REPLY_STRING && activity_list_parse(r->str, r->len, &all, &n) == CS_OK) {
        free(k->acts);
        k->acts = xmalloc((n + 1) * sizeof(*k->acts));
        k->nacts = 0;
        for (size_t i = 0; i < n; i++)
            if (all[i].status != ACT_VOIDED)
                k->acts[k->nacts++] = (struct kact){all[i].id, all[i].start_ms, all[i].end_ms,
                                                    all[i].groups[0] == '\0'};
        free(all);
        k->list_gen = gen;
        keeper_slots_eligibility(k);
    }
    freeReplyObject(r);
}

/* How many unreplayed records of activity aid the last pass found. */
static int64_t keeper_pending_of(const struct keeper *k, int64_t aid)
{
    int i = reserve_slot_of(k->rv, aid);
    return i >= 0 ? k->loc[i].pending : 0;
}

/* Asks the set-aside script for slot i's epoch (again). */
static void keeper_aside_script(struct keeper *k, int i)
{
    struct shm_rsv_slot *s = &k->rv->slot[i];
    struct kslot *l = &k->loc[i];
    int64_t aid = atomic_load(&s->activity_id);
    uint64_t epoch = atomic_load(&s->epoch);
    int shard = keys_shard(aid);
    int64_t want = k->conf->fallback_reserve;
    struct kargs a = {.n = 0};
    struct rconn_site at;

    ka_key(&a, keys_stock, shard);
    ka_key(&a, keys_window, shard);
    ka_key(&a, keys_reserve, shard);
    ka_akey(&a, keys_reserve_epochs, aid);
    ka_int(&a, aid);
    ka_str(&a, k->jd.incarnation);
    ka_int(&a, (int64_t)epoch);
    ka_int(&a, want);
    redisReply *r = keeper_eval(k, &k->s_aside, 4, &a, &at);
    if (r == NULL || r->type != REDIS_REPLY_INTEGER) {
        /* Perhaps done, perhaps not: the same epoch is asked again. */
        log_warn("reserve keeper: setting aside for activity %" PRId64 ": %s", aid,
                 r != NULL && r->type == REDIS_REPLY_ERROR ? r->str : k->rc->errstr);
        if (r != NULL)
            freeReplyObject(r);
        l->in_doubt = 1;
        return;
    }
    long long n = r->integer;
    freeReplyObject(r);
    l->in_doubt = 0;
    if (n <= 0) {
        if (keeper_close_epoch(k, aid, epoch, 0, 0) == CS_OK) {
            keeper_add_closed(k, aid, epoch);
            keeper_slot_free(k, i);
        } else {
            l->in_doubt = 1;
        }
        return;
    }
    /* MySQL says no more than Redis took before a token is spent: a restore
     * and a restart both count from it. */
    if (n < want) {
        struct mval p[] = {MV_INT(n), MV_INT(aid), MV_TXT(k->jd.incarnation, JOURNAL_ID_LEN),
                           MV_INT((int64_t)epoch)};
        if (mconn_exec(k->mc, SQL_RSV_AMOUNT, p, 4, NULL) != CS_OK) {
            log_warn("reserve keeper: recording the amount of activity %" PRId64 ": %s; giving "
                     "it back", aid, k->mc->errstr);
            atomic_store(&s->amount, (int32_t)n);
            l->giveback = 1;
            return;
        }
    }
    atomic_store(&s->amount, (int32_t)n);
    atomic_fetch_add(&k->rv->set_aside, (uint64_t)n);
    l->unconfirmed = keeper_durable(k, shard, &at, 0) != CS_OK;
    log_info("reserve keeper: activity %" PRId64 " epoch %" PRIu64 ": %lld set aside%s", aid, epoch,
             n, l->unconfirmed ? " (not yet confirmed by replicas)" : "");
}

static void keeper_set_aside(struct keeper *k)
{
    int64_t now_ms = cs_now_ms(), mono = cs_mono_ms();

    /* Answers lost earlier are asked for again. */
    for (int i = 0; i < SHM_RESERVES; i++)
        if (k->loc[i].in_doubt && k->renewed[keys_shard(atomic_load(&k->rv->slot[i].activity_id))])
            keeper_aside_script(k, i);
    if (mono < k->aside_next_ms || k->conf->fallback_reserve <= 0
        || atomic_load(&k->rv->halted))
        return;
    k->aside_next_ms = mono + KEEPER_ASIDE_MS;
    keeper_read_list(k);
    if (atomic_load(&k->rv->ngrants) >= SHM_RGRANTS / 4)
        return;
    /* A few sales a pass, round the list: with thousands on sale a pass
     * costs what it looks at, not what exists. */
    size_t looked = 0;
    for (size_t v = 0; v < k->nacts && v < KEEPER_ASIDE_VISIT && looked < KEEPER_ASIDE_BATCH;
         v++) {
        if (k->aside_next >= k->nacts)
            k->aside_next = 0;
        const struct kact *act = &k->acts[k->aside_next++];
        /* Open by this clock, with room before the end; the script judges by Redis'. */
        if (now_ms < act->start_ms || now_ms >= act->end_ms - 2 * k->margin_ms
            || reserve_slot_of(k->rv, act->id) >= 0 || keeper_pending_of(k, act->id) > 0)
            continue;
        int shard = keys_shard(act->id);
        int i;
        for (i = 0; i < SHM_RESERVES; i++)
            if (atomic_load(&k->rv->slot[i].state) == RSV_EMPTY)
                break;
        if (i == SHM_RESERVES)
            return;
        looked++;
        /* Only while stock is plentiful: read first, so a low stock costs no
         * MySQL row. */
        char skey[KEYS_MAX], rkey[KEYS_MAX];
        keys_stock(skey, shard);
        keys_reserve(rkey, shard);
        redisReply *r = rconn_command(k->rc, skey, "HGET %s %" PRId64, skey, act->id);
        if (r == NULL)
            return;
        int64_t stock = r->type == REDIS_REPLY_STRING ? strtoll(r->str, NULL, 10) : -1;
        freeReplyObject(r);
        r = rconn_command(k->rc, rkey, "HGET %s %" PRId64 ":held", rkey, act->id);
        if (r == NULL)
            return;
        int64_t held = r->type == REDIS_REPLY_STRING ? strtoll(r->str, NULL, 10) : 0;
        freeReplyObject(r);
        int64_t n = stock / 10 < k->conf->fallback_reserve ? stock / 10 : k->conf->fallback_reserve;
        if (n <= 0 || stock - n < 2 * (held + n))
            continue;
        /* MySQL first: a restore counts the epoch from its row. */
        int64_t epoch = 0;
        struct mval p[] = {MV_INT(act->id), MV_TXT(k->jd.incarnation, JOURNAL_ID_LEN)};
        if (mconn_query(k->mc, SQL_RSV_NEXT, p, 2, row_int, &epoch) != CS_OK || epoch <= 0) {
            log_warn("reserve keeper: numbering an epoch: %s", k->mc->errstr);
            return;
        }
        struct mval q[] = {MV_INT(act->id), MV_TXT(k->jd.incarnation, JOURNAL_ID_LEN),
                           MV_INT(epoch), MV_INT(k->conf->fallback_reserve)};
        if (mconn_exec(k->mc, SQL_RSV_OPEN, q, 4, NULL) != CS_OK) {
            log_warn("reserve keeper: recording an epoch: %s", k->mc->errstr);
            return;
        }
        struct shm_rsv_slot *s = &k->rv->slot[i];
        memset(&k->loc[i], 0, sizeof(k->loc[i]));
        atomic_store(&s->activity_id, act->id);
        atomic_store(&s->epoch, (uint64_t)epoch);
        atomic_store(&s->amount, 0);
        atomic_store(&s->next, 0);
        atomic_store(&s->start_ms, act->start_ms);
        atomic_store(&s->end_ms, act->end_ms);
        atomic_store(&s->open_to_all, act->open_to_all);
        k->loc[i].field = 1;
        k->loc[i].stock = stock;
        atomic_store(&s->state, RSV_PENDING);
        keeper_aside_script(k, i);
    }
}

/* ---- start-up ---------------------------------------------------------------------- */

struct rebuild {
    struct keeper *k;
    int64_t aid;
    uint64_t epoch;
    int32_t next;
};

static int keeper_rebuild_rec(void *arg, const struct journal_rec *rec)
{
    struct keeper *k = arg;
    int i = reserve_slot_of(k->rv, rec->activity_id);
    if ((i < 0 || atomic_load(&k->rv->slot[i].epoch) != rec->epoch)
        && !keeper_is_closed(k, rec->activity_id, rec->epoch)) {
        /* Not open: an epoch this node gave back was replayed to the end
         * first, so its records are done; one an admin closed is not. */
        char by[16];
        if (keeper_epoch_state(k, rec->activity_id, rec->epoch, by, sizeof(by)) == 2
            && strcmp(by, "node") == 0)
            keeper_add_closed(k, rec->activity_id, rec->epoch);
    }
    if (i >= 0 && atomic_load(&k->rv->slot[i].epoch) == rec->epoch) {
        struct shm_rsv_slot *s = &k->rv->slot[i];
        if ((int32_t)rec->token + 1 > atomic_load(&s->next))
            atomic_store(&s->next, (int32_t)rec->token + 1);
    }
    int e;
    if (reserve_grant_add(k->rv, rec->activity_id, rec->user_id, &e) == CS_OK || e >= 0)
        atomic_store(&k->rv->grant[e].state, RGRANT_GRANTED);
    return 0;
}

static int keeper_mine_row(void *arg, int ncols, char **cols)
{
    struct keeper *k = arg;
    if (ncols < 3 || cols[0] == NULL || cols[1] == NULL || cols[2] == NULL)
        return CS_OK;
    int i;
    for (i = 0; i < SHM_RESERVES; i++)
        if (atomic_load(&k->rv->slot[i].state) == RSV_EMPTY)
            break;
    if (i == SHM_RESERVES) {
        log_error("reserve keeper: more open epochs than %d slots", SHM_RESERVES);
        return CS_OK;
    }
    struct shm_rsv_slot *s = &k->rv->slot[i];
    memset(&k->loc[i], 0, sizeof(k->loc[i]));
    atomic_store(&s->activity_id, strtoll(cols[0], NULL, 10));
    atomic_store(&s->epoch, strtoull(cols[1], NULL, 10));
    atomic_store(&s->amount, (int32_t)strtol(cols[2], NULL, 10));
    atomic_store(&s->next, 0);
    atomic_store(&s->start_ms, 0);
    atomic_store(&s->end_ms, 0);
    atomic_store(&s->open_to_all, 0); /* until the activity list is read */
    k->loc[i].resume = 1;
    k->loc[i].field = 1;
    atomic_store(&s->state, RSV_STOPPED);
    return CS_OK;
}

/*
 * What this incarnation holds, rebuilt: the open epochs from MySQL, and per
 * epoch the tokens already granted from the journal (never from
 * configuration or Redis). Torn tails are cut first. Every slot starts
 * stopped; it opens once its records are replayed.
 */
static int keeper_rebuild(struct keeper *k)
{
    char path[PATH_MAX], err[256];
    struct shm_reserves *rv = k->rv;

    /* A keeper restarted under running workers: nobody is inside a grant
     * once every slot is stopped and the markers are down. */
    for (int i = 0; i < SHM_RESERVES; i++)
        if (atomic_load(&rv->slot[i].state) != RSV_EMPTY)
            atomic_store(&rv->slot[i].state, RSV_STOPPED);
    for (int tries = 0; tries < 300; tries++) {
        int busy = 0;
        for (int w = 0; w < SHM_MAX_WORKERS; w++)
            busy += atomic_load(&rv->busy[w]) != 0;
        if (busy == 0)
            break;
        usleep(10000);
    }
    for (int i = 0; i < SHM_RESERVES; i++)
        keeper_slot_free(k, i);
    memset(rv->grant, 0, sizeof(rv->grant));
    atomic_store(&rv->ngrants, 0);

    struct mval p[] = {MV_TXT(k->jd.incarnation, JOURNAL_ID_LEN)};
    while (mconn_query(k->mc, SQL_RSV_MINE, p, 1, keeper_mine_row, k) != CS_OK) {
        log_warn("reserve keeper: reading this node's open epochs from MySQL: %s; again in 1 s",
                 k->mc->errstr);
        if (keeper_stop)
            return CS_ERR;
        sleep(1);
    }
    keeper_list_files(k);
    uint64_t maxseg = 0;
    for (size_t i = 0; i < k->nfiles; i++) {
        struct kfile *f = &k->files[i];
        struct journal j;
        snprintf(path, sizeof(path), "%s/%s", k->jd.path, f->name);
        /* Cuts a torn tail; a segment a live worker holds is its own. */
        if (journal_open_path(&j, path, err, sizeof(err)) == CS_OK)
            journal_close(&j);
        else
            log_warn("reserve keeper: %s", err);
        journal_scan(path, keeper_rebuild_rec, k, NULL);
        if (f->seg > maxseg)
            maxseg = f->seg;
    }
    atomic_store(&rv->journal_seg, maxseg + 1);
    int open = 0;
    for (int i = 0; i < SHM_RESERVES; i++)
        open += atomic_load(&rv->slot[i].state) != RSV_EMPTY;
    log_notice("reserve keeper: incarnation %s; %d open epochs, %zu journal segments, "
               "%u users granted from reserves", k->jd.incarnation, open, k->nfiles,
               atomic_load(&rv->ngrants));
    return CS_OK;
}

/* Empties the grants table when nothing is open and everything replayed. */
static void keeper_reset_grants(struct keeper *k)
{
    struct shm_reserves *rv = k->rv;
    if (atomic_load(&rv->ngrants) == 0 || atomic_load(&rv->journal_depth) != 0)
        return;
    for (int i = 0; i < SHM_RESERVES; i++)
        if (atomic_load(&rv->slot[i].state) != RSV_EMPTY)
            return;
    for (int w = 0; w < SHM_MAX_WORKERS; w++)
        if (atomic_load(&rv->busy[w]) != 0)
            return;
    memset(rv->grant, 0, sizeof(rv->grant));
    atomic_store(&rv->ngrants, 0);
}

static void keeper_pass(struct keeper *k, int stopping)
{
    int shards[KEYS_SHARDS] = {0};

    /* Shards with a slot, or with records left. */
    for (int i = 0; i < SHM_RESERVES; i++)
        if (atomic_load(&k->rv->slot[i].state) != RSV_EMPTY)
            shards[keys_shard(atomic_load(&k->rv->slot[i].activity_id))] = 1;
    int64_t depth = atomic_load(&k->rv->journal_depth);
    for (int s = 0; s < KEYS_SHARDS; s++) {
        k->renewed[s] = 0;
        if (shards[s] || depth > 0 || k->nfiles > 0)
            k->renewed[s] = keeper_renew(k, s) == CS_OK;
    }
    /* Fences first (a stopped slot with nobody inside), then the replay
     * that sees every record they will ever have, then the decisions. */
    for (int i = 0; i < SHM_RESERVES; i++)
        if (atomic_load(&k->rv->slot[i].state) == RSV_STOPPED)
            keeper_fenced(k, i);
    keeper_replay(k);
    /* The list says which sales are open to all: known before a slot of a
     * restarted keeper opens, so a worker without metadata may grant. */
    int any = 0;
    for (int s = 0; s < KEYS_SHARDS; s++)
        any |= k->renewed[s];
    if (any)
        keeper_read_list(k);
    keeper_slots(k, stopping);
    keeper_retire_segments(k);
    if (!stopping)
        keeper_set_aside(k);
    keeper_reset_grants(k);
    atomic_store(&k->rv->keeper_tick_ms, cs_mono_ms());
}

static int keeper_load_script(struct rscript *s, const char *text)
{
    memset(s, 0, sizeof(*s));
    s->src = xstrdup(text);
    s->len = strlen(text);
    return CS_OK;
}

int keeper_main(const struct cs_conf *conf, struct shm_node *shm)
{
    struct keeper k;
    struct rconn_opts ro;
    char err[512];

    memset(&k, 0, sizeof(k));
    k.conf = conf;
    k.shm = shm;
    k.rv = &shm->rsv;
    k.list_gen = -2;
    k.margin_ms = conf->fallback_budget_ms;
    for (int s = 0; s < KEYS_SHARDS; s++)
        k.restored[s] = -1;
    signal(SIGTERM, keeper_on_term);
    signal(SIGINT, keeper_on_term);
    signal(SIGHUP, SIG_IGN);

    if (journal_dir_open(&k.jd, conf->fallback_journal, err, sizeof(err)) != CS_OK) {
        log_error("reserve keeper: %s; no reserves on this node", err);
        return 1;
    }
    rconn_opts_from_conf(&ro, conf, conf->redis_command_timeout_ms);
    ro.cluster_shared = &shm->cluster;
    k.rc = rconn_new(&ro);
    k.mc = mconn_new(conf);
    keeper_load_script(&k.s_aside, RESERVE_LUA_SET_ASIDE);
    keeper_load_script(&k.s_renew, RESERVE_LUA_RENEW);
    keeper_load_script(&k.s_replay, RESERVE_LUA_REPLAY);
    keeper_load_script(&k.s_give, RESERVE_LUA_GIVE_BACK);

    int rc = 0;
    if (keeper_rebuild(&k) != CS_OK)
        goto out;
    atomic_store(&k.rv->halted, 0);
    atomic_store(&k.rv->keeper_pid, (int)getpid());
    log_notice("reserve keeper %d: %d coupons per sale, lease %d ms, journal %s", (int)getpid(),
               conf->fallback_reserve, conf->fallback_lease_ms, conf->fallback_journal);

    int64_t stop_by = 0;
    for (;;) {
        int64_t t0 = cs_mono_ms();
        if (keeper_stop && stop_by == 0) {
            log_notice("reserve keeper: stopping: giving every reserve back");
            stop_by = t0 + KEEPER_STOP_MS;
        }
        keeper_pass(&k, stop_by != 0);
        if (stop_by != 0) {
            int open = 0, cut = 0;
            for (int i = 0; i < SHM_RESERVES; i++)
                if (atomic_load(&k.rv->slot[i].state) != RSV_EMPTY) {
                    open++;
                    cut += !k.renewed[keys_shard(atomic_load(&k.rv->slot[i].activity_id))];
                }
            if (open == 0 && atomic_load(&k.rv->journal_depth) == 0)
                break;
            /* Redis is away: waiting holds up the stop for nothing. */
            if (cs_mono_ms() >= stop_by || (cut > 0 && cs_mono_ms() >= stop_by - KEEPER_STOP_MS + 1000)) {
                log_warn("reserve keeper: %d reserves not given back (Redis unreachable?); "
                         "the next start replays and returns them", open);
                rc = 0;
                break;
            }
        }
        int64_t left = KEEPER_TICK_MS - (cs_mono_ms() - t0);
        if (left > 0)
            usleep((useconds_t)left * 1000);
    }
out:
    for (int i = 0; i < SHM_RESERVES; i++)
        if (atomic_load(&k.rv->slot[i].state) != RSV_EMPTY)
            atomic_store(&k.rv->slot[i].state, RSV_STOPPED);
    atomic_store(&k.rv->keeper_pid, 0);
    rscript_free(&k.s_aside);
    rscript_free(&k.s_renew);
    rscript_free(&k.s_replay);
    rscript_free(&k.s_give);
    rconn_free(k.rc);
    mconn_free(k.mc);
    free(k.files);
    free(k.closed);
    free(k.acts);
    journal_dir_close(&k.jd);
    log_notice("reserve keeper stopped");
    return rc;
}
