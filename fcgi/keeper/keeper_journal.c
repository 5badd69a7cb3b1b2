/* keeper_journal.c - the reserve keeper's journal: replaying it into Redis,
 * deleting replayed segments, and the tokens file that outlives them. */
#include "keeper_int.h"
#include "rargs.h"
#include "activity.h"
#include "cs.h"
#include "keys.h"
#include "log.h"
#include "reserve.h"
#include "scripts.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

static const char SQL_SALE_ENDED[] =
    "SELECT distribute_end_time <= NOW() FROM activity WHERE id = ?";
/* The user's coupon of a sale that counts, or the one this grant made. */
static const char SQL_GRANT_HELD[] =
    "SELECT COUNT(*) FROM coupon WHERE activity_id = ? AND user_id = ? AND (live_key = 0 "
    "OR CAST(UNIX_TIMESTAMP(seized_at) * 1000 AS SIGNED) = ?)";
/* What an admin's return kept out of stock is released: a restore no longer
 * keeps it out (sql/007_reserve_parked.sql). Not only rows closed by the
 * admin yet: the node may see the return's Redis half and release before
 * the return's MySQL step closes the row, which leaves released_at alone. */
static const char SQL_RELEASED[] =
    "UPDATE reserve_epoch SET released_at = NOW(3) WHERE activity_id = ? AND incarnation = ? "
    "AND epoch = ? AND released_at IS NULL";

/* ---- the journal --------------------------------------------------------------- */

static struct kfile *keeper_file(struct keeper *k, const char *name, int index, uint64_t seg)
{
    for (size_t i = 0; i < k->nfiles; i++)
        if (strcmp(k->files[i].name, name) == 0)
            return &k->files[i];
    k->files = cs_grow(k->files, &k->files_cap, k->nfiles + 1, sizeof(*k->files));
    struct kfile *f = &k->files[k->nfiles++];
    memset(f, 0, sizeof(*f));
    snprintf(f->name, sizeof(f->name), "%s", name);
    f->index = index;
    f->seg = seg;
    return f;
}

void keeper_list_files(struct keeper *k)
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
    int answered;              /* this pass wrote it to Redis, or to the dead letters */
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
    s->v = cs_grow(s->v, &s->cap, s->n + 1, sizeof(*s->v));
    s->v[s->n++] = (struct krec){*rec, s->f, pos, 0};
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
 * the user is told ALREADY_SEIZED from now on, not UNKNOWN_OUTCOME. A
 * record the table does not know (written by a worker that was still inside
 * its grant when this keeper rebuilt the table, after the start-up scan) is
 * added, so the user is not granted a second token meanwhile. */
static void keeper_mark_granted(struct keeper *k, int64_t aid, int64_t uid)
{
    int e = reserve_grant_find(k->rv, aid, uid);
    int pending = RGRANT_PENDING;
    if (e < 0 && reserve_grant_add(k->rv, aid, uid, &e) != CS_OK && e < 0)
        return; /* the table is full: the replay still makes the grant known */
    if (e >= 0)
        atomic_compare_exchange_strong(&k->rv->grant[e].state, &pending, RGRANT_GRANTED);
}

static void keeper_mark_replayed(struct keeper *k, int64_t aid, int64_t uid)
{
    int e = reserve_grant_find(k->rv, aid, uid);
    if (e < 0)
        (void)reserve_grant_add(k->rv, aid, uid, &e);
    if (e >= 0)
        atomic_store(&k->rv->grant[e].state, RGRANT_REPLAYED);
}

/* A row of one column read as a flag: 1 when not 0. */
static int row_flag(void *arg, int ncols, char **cols)
{
    int *flag = arg;
    if (ncols >= 1 && cols[0] != NULL)
        *flag = atoi(cols[0]) != 0;
    return CS_OK;
}

/* Per replay pass: what MySQL said of a sale whose stock field is missing. */
struct kgone {
    int64_t aid;
    int gone;                  /* 1 gone for good, 0 waits, -1 MySQL did not answer */
};

/*
 * Whether activity aid, with no stock field in Redis, is gone for good: MySQL
 * has no such activity, or its sale has ended (an ended sale is never
 * preheated or restored again, and cleanup removed it). 0 while it is on or
 * before sale (Redis lost its data and is not restored yet: the token
 * waits), -1 when MySQL did not answer. Asked once per activity per pass.
 */
static int keeper_sale_gone(struct keeper *k, struct kgone *seen, size_t *nseen, size_t cap,
                            int64_t aid)
{
    for (size_t i = 0; i < *nseen; i++)
        if (seen[i].aid == aid)
            return seen[i].gone;
    int ended = -1, gone;
    struct mval p[] = {MV_INT(aid)};
    if (mconn_query(k->mc, SQL_SALE_ENDED, p, 1, row_flag, &ended) != CS_OK) {
        log_warn("reserve keeper: reading activity %" PRId64 ": %s", aid, k->mc->errstr);
        gone = -1;
    } else {
        gone = ended != 0; /* no row (-1) or ended (1) */
    }
    if (*nseen < cap)
        seen[(*nseen)++] = (struct kgone){aid, gone};
    return gone;
}

/*
 * Whether MySQL holds what rec granted: 1 when its user holds a coupon of the
 * sale that counts, or the one rec made (same seize time); 0 when not; -1
 * when MySQL did not answer. A record read again after its sale was cleaned
 * up (a restarted keeper reads every segment still on disk from its start;
 * the sale's replay markers went with its fields) owes its user nothing then.
 */
static int keeper_grant_held(struct keeper *k, const struct journal_rec *r)
{
    int n = -1;
    struct mval p[] = {MV_INT(r->activity_id), MV_INT(r->user_id), MV_INT(r->seize_ms)};
    if (mconn_query(k->mc, SQL_GRANT_HELD, p, 3, row_flag, &n) != CS_OK) {
        log_warn("reserve keeper: reading the coupon of user %" PRId64 " of activity %" PRId64
                 ": %s", r->user_id, r->activity_id, k->mc->errstr);
        return -1;
    }
    return n;
}

/* Puts rec in the shard's dead letters: its sale is gone from Redis. 1 when
 * it is new there, 0 when it was there already (a record read again: a
 * restarted keeper, or one held behind an earlier record that waits), with
 * *at the node that wrote it; -1 when Redis did not answer. */
static int keeper_dead_letter(struct keeper *k, const struct journal_rec *r, const char *why,
                              struct rconn_site *at)
{
    char key[KEYS_MAX], field[128], value[160];
    keys_reserve_dead(key, keys_shard(r->activity_id));
    int fl = snprintf(field, sizeof(field), "%" PRId64 ":%s:%" PRIu64 ":%u", r->activity_id,
                      k->jd.incarnation, r->epoch, r->token);
    int vl = snprintf(value, sizeof(value), "%" PRId64 ":%" PRId64 ":%s", r->user_id,
                      r->seize_ms, why);
    const char *argv[] = {"HSET", key, field, value};
    const size_t argl[] = {4, strlen(key), (size_t)fl, (size_t)vl};
    redisReply *rep = rconn_commandv_at(k->rc, key, 4, argv, argl, at);
    int ret = rep != NULL && rep->type == REDIS_REPLY_INTEGER ? rep->integer > 0 : -1;
    if (rep != NULL)
        freeReplyObject(rep);
    return ret;
}

/*
 * Puts back to stock what admins' returns of this node's epochs kept out
 * of it, for each epoch with no record left to replay in s (all done), on a
 * shard Redis answered on. Forgotten once released (or nothing was parked).
 */
static int keeper_epoch_has_slot(const struct keeper *k, int64_t aid, uint64_t epoch)
{
    for (int i = 0; i < SHM_RESERVES; i++) {
        const struct shm_rsv_slot *sl = &k->rv->slot[i];
        if (atomic_load(&sl->state) != RSV_EMPTY && atomic_load(&sl->activity_id) == aid
            && atomic_load(&sl->epoch) == epoch)
            return 1;
    }
    return 0;
}

/* MySQL says e's parked tokens are released before Redis puts them back:
 * everything of e is replayed, so nothing waits for them, and a restore
 * that came between the two steps must not keep them out again. */
static int keeper_mark_released(struct keeper *k, struct krelease *e)
{
    if (e->marked)
        return CS_OK;
    struct mval p[] = {MV_INT(e->aid), MV_TXT(k->jd.incarnation, JOURNAL_ID_LEN),
                       MV_INT((int64_t)e->epoch)};
    if (mconn_exec(k->mc, SQL_RELEASED, p, 3, NULL) != CS_OK) {
        log_warn("reserve keeper: activity %" PRId64 " epoch %" PRIu64 ": marking what the "
                 "admin's return kept out of stock released in MySQL: %s; again next pass",
                 e->aid, e->epoch, k->mc->errstr);
        return CS_ERR;
    }
    e->marked = 1;
    return CS_OK;
}

static void keeper_journal_release(struct keeper *k, const struct kscan *s, const int *durable,
                                   const int *failed)
{
    size_t m = 0;
    int mysql_failed = 0; /* one timeout a pass at most while MySQL is away */
    for (size_t i = 0; i < k->nrelease; i++) {
        struct krelease *e = &k->release[i];
        int shard = keys_shard(e->aid), left = 0;
        /* A slot is freed only once no worker can be writing into it (the
         * slot fenced): while the epoch still has one, a worker may be in
         * the middle of a record of it that this scan could not see yet,
         * and the parked token it spends must not go back to stock. */
        left = keeper_epoch_has_slot(k, e->aid, e->epoch);
        for (size_t j = 0; j < s->n && !left; j++) {
            const struct krec *kr = &s->v[j];
            left = kr->r.activity_id == e->aid && kr->r.epoch == e->epoch
                   && !(kr->answered && !failed[shard] && durable[shard]);
        }
        long long back = -1;
        if (!left && k->renewed[shard] && !mysql_failed
            && keeper_claim_lasts(k)
            && !(mysql_failed = keeper_mark_released(k, e) != CS_OK)) {
            struct rargs a = RARGS_INIT;
            struct rconn_site at;
            reserve_script_epoch(&a, e->aid, k->jd.incarnation, (int64_t)e->epoch);
            redisReply *r = rargs_evalsha(k->rc, &k->s_release, 3, &a, &at);
            rargs_free(&a);
            if (r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer >= 0
                && keeper_durable(k, shard, &at, r->integer == 0) == CS_OK)
                back = r->integer;
            if (r != NULL)
                freeReplyObject(r);
        }
        if (back < 0) {
            k->release[m++] = *e;
            continue;
        }
        if (back > 0) {
            atomic_fetch_add(&k->rv->returned, (uint64_t)back);
            log_notice("reserve keeper: activity %" PRId64 " epoch %" PRIu64 ": replayed; the %lld "
                       "coupons the admin's return kept out of stock are back in it", e->aid,
                       e->epoch, back);
        }
    }
    k->nrelease = m;
}

/* What one replay pass has done so far, per shard. */
struct kpass {
    struct rconn_site site[KEYS_SHARDS]; /* where the shard's last write went */
    int wrote[KEYS_SHARDS];              /* something was written: WAIT for it */
    int failed[KEYS_SHARDS];             /* a call failed: the rest waits */
    int replayed;                        /* records the script took this pass */
    struct kgone seen[64];               /* sales found gone, or not */
    size_t nseen;
};

/* The record's sale has no stock field (the script's SCRIPT_REPLAY_NO_STOCK).
 * Redis lost its data and is not restored yet: nothing was written, the
 * token waits. Or the sale is gone (ended and cleaned up): the token has
 * nowhere to go but the dead letters, unless MySQL holds what it granted.
 * Either way it stops no other token (rule 17). */
static void keeper_replay_gone(struct keeper *k, struct kpass *p, struct krec *kr)
{
    const struct journal_rec *r = &kr->r;
    int shard = keys_shard(r->activity_id);

    if (keeper_sale_gone(k, p->seen, &p->nseen, CS_ARRAY_LEN(p->seen), r->activity_id) != 1) {
        log_debug("reserve keeper: activity %" PRId64 " has no stock field; its replay "
                  "waits", r->activity_id);
        return;
    }
    int held = keeper_grant_held(k, r);
    if (held < 0)
        return;
    if (held > 0) {
        kr->answered = 1;
        log_info("reserve keeper: activity %" PRId64 ": token %" PRIu64 "/%u of user %"
                 PRId64 ": the sale is gone from Redis and the user's coupon is in MySQL",
                 r->activity_id, r->epoch, r->token, r->user_id);
        return;
    }
    struct rconn_site dl;
    int fresh = keeper_dead_letter(k, r, "sale gone from Redis", &dl);
    if (fresh < 0) {
        p->failed[shard] = 1;
        return;
    }
    p->site[shard] = dl;
    p->wrote[shard] = 1;
    kr->answered = 1;
    if (fresh == 0) {
        log_info("reserve keeper: activity %" PRId64 ": token %" PRIu64 "/%u of user %"
                 PRId64 " is in the dead letters already", r->activity_id, r->epoch,
                 r->token, r->user_id);
        return;
    }
    atomic_fetch_add(&k->rv->dead_letters, 1);
    log_error("reserve keeper: activity %" PRId64 ": token %" PRIu64 "/%u of user %" PRId64
              " has no sale in Redis to go to (ended and removed); it is in the dead "
              "letters %s", r->activity_id, r->epoch, r->token, r->user_id,
              "COUPON:RESERVE:DEAD");
}

/* Counts and logs what the replay script answered for a record it took. */
static void keeper_replay_answer(struct keeper *k, struct kpass *p, const struct journal_rec *r,
                                 long long res)
{
    if (res == SCRIPT_REPLAY_SPENT_TWICE_KNOWN) {
        /* Read again after its -4: counted and logged then. */
        log_info("reserve keeper: activity %" PRId64 ": token %" PRIu64 "/%u of user %" PRId64
                 " (spent twice) went to the dead letters when first replayed", r->activity_id,
                 r->epoch, r->token, r->user_id);
        return;
    }
    p->replayed++;
    if (res == SCRIPT_REPLAY_SPENT_TWICE || res == SCRIPT_REPLAY_TWICE_STOCK) {
        /* The token was replayed before for someone else: the node (or
         * another instance of its incarnation) spent it twice. The script
         * wrote this user's grant into the dead letters, so the record is
         * done with; it is never counted as the token replayed. When the
         * sale had stock, the user was given a coupon from it too. */
        atomic_fetch_add(&k->rv->dead_letters, 1);
        atomic_fetch_add(&k->rv->anomalies, 1);
        log_error("reserve keeper: activity %" PRId64 ": token %" PRIu64 "/%u of user %" PRId64
                  " was replayed before for another user (spent twice); it is in %s%s",
                  r->activity_id, r->epoch, r->token, r->user_id, "COUPON:RESERVE:DEAD",
                  res == SCRIPT_REPLAY_TWICE_STOCK
                      ? ", and the user's coupon was taken from the stock instead" : "");
        if (res == SCRIPT_REPLAY_TWICE_STOCK)
            keeper_mark_replayed(k, r->activity_id, r->user_id);
        return;
    }
    if (res == SCRIPT_REPLAY_DUPLICATE)
        atomic_fetch_add(&k->rv->duplicates, 1);
    if (res == SCRIPT_REPLAY_DEAD) {
        atomic_fetch_add(&k->rv->dead_letters, 1);
        log_error("reserve keeper: activity %" PRId64 ": token %" PRIu64 "/%u of user %" PRId64
                  " had no open reserve and no stock to take; it is in %s",
                  r->activity_id, r->epoch, r->token, r->user_id, "COUPON:RESERVE:DEAD");
    }
    if (res != SCRIPT_REPLAY_BEFORE)
        atomic_fetch_add(&k->rv->replayed, 1);
    keeper_mark_replayed(k, r->activity_id, r->user_id);
}

/* Sends one record of an open epoch through the replay script (its shard
 * renewed and nothing failed on it this pass). */
static void keeper_replay_rec(struct keeper *k, struct kpass *p, struct krec *kr)
{
    const struct journal_rec *r = &kr->r;
    int shard = keys_shard(r->activity_id);
    struct rargs a = RARGS_INIT;

    rargs_key(&a, keys_stock, shard);
    rargs_akey(&a, keys_seize_list, r->activity_id);
    rargs_key(&a, keys_queue, shard);
    rargs_key(&a, keys_reserve, shard);
    rargs_akey(&a, keys_reserve_epochs, r->activity_id);
    rargs_key(&a, keys_reserve_dead, shard);
    rargs_int(&a, r->activity_id);
    rargs_int(&a, r->user_id);
    rargs_str(&a, k->jd.incarnation);
    rargs_int(&a, (int64_t)r->epoch);
    rargs_int(&a, r->token);
    rargs_int(&a, r->seize_ms);
    struct rconn_site at;
    redisReply *rep = rargs_evalsha(k->rc, &k->s_replay, 6, &a, &at);
    rargs_free(&a);
    long long res;
    char why[256];
    if (keeper_reply_int(k, rep, &res, why, sizeof(why)) != CS_OK) {
        log_warn("reserve keeper: replaying activity %" PRId64 " token %" PRIu64 "/%u: %s",
                 r->activity_id, r->epoch, r->token, why);
        p->failed[shard] = 1;
        return;
    }
    if (res == SCRIPT_REPLAY_NO_STOCK) {
        keeper_replay_gone(k, p, kr);
        return;
    }
    kr->answered = 1;
    p->site[shard] = at;
    p->wrote[shard] = 1;
    keeper_replay_answer(k, p, r, res);
}

/* Per file, moves the done mark over the leading records that are done.
 * Counts what is left per reserve slot; returns how many are left, and sets
 * *oldest to the seize time of the oldest of them (0 when none is). */
static int64_t keeper_journal_advance(struct keeper *k, struct kscan *s, const int *durable,
                                      const int *failed, int64_t *oldest_ms)
{
    for (size_t i = 0; i < k->nfiles; i++)
        k->files[i].seen = 0;
    for (int i = 0; i < SHM_RESERVES; i++)
        k->loc[i].pending = 0;
    int64_t depth = 0, oldest = 0;
    for (size_t i = 0; i < s->n; i++) {
        struct krec *kr = &s->v[i];
        const struct journal_rec *r = &kr->r;
        int shard = keys_shard(r->activity_id);
        int done = keeper_is_closed(k, r->activity_id, r->epoch)
                   || (kr->answered && !failed[shard] && durable[shard]);
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
    *oldest_ms = oldest;
    return depth;
}

/*
 * Replays what the journal holds for shards Redis answers on, then WAITs
 * per shard; a record counts as done (its file's mark moves past it) only
 * once its shard met the durability rule. Counts what is left per slot.
 */
void keeper_journal_replay(struct keeper *k)
{
    struct kscan s;
    struct kpass p = {.replayed = 0};
    int durable[KEYS_SHARDS];
    int64_t t0 = cs_mono_ms(), depth, oldest;

    keeper_read_journal(k, &s);
    for (size_t i = 0; i < s.n; i++) {
        struct krec *kr = &s.v[i];
        const struct journal_rec *r = &kr->r;
        int shard = keys_shard(r->activity_id);
        if (keeper_is_closed(k, r->activity_id, r->epoch)) {
            /* Replayed before its epoch was given back: the status route
             * must not call it pending (a restarted keeper rebuilt the
             * user's grant from the record). */
            keeper_mark_replayed(k, r->activity_id, r->user_id);
            continue;
        }
        keeper_mark_granted(k, r->activity_id, r->user_id);
        if (k->renewed[shard] && !p.failed[shard])
            keeper_replay_rec(k, &p, kr);
    }
    for (int i = 0; i < KEYS_SHARDS; i++)
        durable[i] = !p.wrote[i] || keeper_durable(k, i, &p.site[i], 0) == CS_OK;

    depth = keeper_journal_advance(k, &s, durable, p.failed, &oldest);
    keeper_journal_release(k, &s, durable, p.failed);
    /* Workers add to the depth between passes; the pass sets what it found. */
    atomic_store(&k->rv->journal_depth, depth);
    atomic_store(&k->rv->oldest_unreplayed_ms, oldest);
    if (p.replayed > 0) {
        int64_t took = cs_mono_ms() - t0;
        atomic_store(&k->rv->last_replay_ms, took);
        log_notice("reserve keeper: replayed %d journal records in %" PRId64 " ms; %" PRId64
                   " left", p.replayed, took, depth);
    }
    free(s.v);
    k->replay_passes++;
}

/* ---- the tokens file: what deleted segments spent ------------------------------------ */

/* DIR/tokens holds, per open epoch of this node, the next token to hand
 * out ("<activity> <epoch> <next>" a line). It is written and made durable
 * before any segment is deleted, so that a restart never hands out again a
 * token whose record is gone with its segment (internals.md rule 14). */
#define KEEPER_TOKENS "tokens"

/* Writes DIR/tokens from the slots (temporary file, fsync, rename, fsync of
 * the directory). CS_ERR when any step failed: then nothing may be deleted. */
static int keeper_tokens_write(struct keeper *k)
{
    char path[PATH_MAX], tmp[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", k->jd.path, KEEPER_TOKENS);
    snprintf(tmp, sizeof(tmp), "%s/%s.tmp", k->jd.path, KEEPER_TOKENS);
    FILE *f = fopen(tmp, "we");
    if (f == NULL) {
        log_error("reserve keeper: fopen(%s) failed: %s; no segment is deleted", tmp,
                  strerror(errno));
        return CS_ERR;
    }
    for (int i = 0; i < SHM_RESERVES; i++) {
        struct shm_rsv_slot *s = &k->rv->slot[i];
        if (atomic_load(&s->state) == RSV_EMPTY)
            continue;
        fprintf(f, "%" PRId64 " %" PRIu64 " %" PRId32 "\n", atomic_load(&s->activity_id),
                atomic_load(&s->epoch), atomic_load(&s->next));
    }
    /* ferror() too: a write that failed while the loop filled the buffer
     * leaves nothing for fflush() to report, and a short file renamed into
     * place would let segments go whose tokens it does not hold. */
    int bad = ferror(f) || fflush(f) != 0 || fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0 || cs_fsync_dir(k->jd.path) != CS_OK) {
        log_error("reserve keeper: writing %s failed: %s; no segment is deleted", path,
                  strerror(errno));
        unlink(tmp);
        return CS_ERR;
    }
    return CS_OK;
}

void keeper_tokens_read(struct keeper *k)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", k->jd.path, KEEPER_TOKENS);
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        if (errno != ENOENT)
            log_error("reserve keeper: fopen(%s) failed: %s", path, strerror(errno));
        return;
    }
    long long aid, next;
    unsigned long long epoch;
    while (fscanf(f, "%lld %llu %lld", &aid, &epoch, &next) == 3) {
        int i = reserve_slot_of(k->rv, (int64_t)aid);
        if (i < 0 || atomic_load(&k->rv->slot[i].epoch) != epoch || next > INT32_MAX)
            continue;
        if ((int32_t)next > atomic_load(&k->rv->slot[i].next))
            atomic_store(&k->rv->slot[i].next, (int32_t)next);
    }
    fclose(f);
}

/*
 * A segment that is wholly replayed, older than the one workers append to,
 * and locked by nobody is deleted. When everything is replayed, workers are
 * moved to a new segment, so the old ones can go.
 */
void keeper_journal_retire(struct keeper *k)
{
    char path[PATH_MAX];
    uint64_t cur = atomic_load(&k->rv->journal_seg);
    int bump = 0, tokens_kept = 0;

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
            /* Its records say which tokens were spent: that goes to the
             * tokens file first, once per pass. */
            if (!tokens_kept && keeper_tokens_write(k) != CS_OK) {
                close(fd);
                break;
            }
            tokens_kept = 1;
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
