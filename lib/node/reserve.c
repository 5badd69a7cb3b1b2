/* reserve.c - spending a node reserve, and the reserves' Lua scripts. */
#include "reserve.h"
#include "cs.h"
#include "keys.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdlib.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>






int reserve_crash_after_append;

void reserve_init_faults(void)
{
    const char *f = getenv("COUPONSEIZE_FAULT");
    reserve_crash_after_append = f != NULL && strcmp(f, "crash-after-journal") == 0;
}

void reserve_script_epoch(struct rargs *a, int64_t aid, const char *inc, int64_t epoch)
{
    int shard = keys_shard(aid);
    rargs_key(a, keys_stock, shard);
    rargs_key(a, keys_reserve, shard);
    rargs_akey(a, keys_reserve_epochs, aid);
    rargs_int(a, aid);
    rargs_str(a, inc);
    rargs_int(a, epoch);
}

int reserve_slot_of(const struct shm_reserves *rv, int64_t id)
{
    for (int i = 0; i < SHM_RESERVES; i++)
        if (atomic_load_explicit(&rv->slot[i].activity_id, memory_order_acquire) == id
            && atomic_load(&rv->slot[i].state) != RSV_EMPTY)
            return i;
    return -1;
}

int reserve_lease(const struct shm_reserves *rv, int shard, int lease_ms, int64_t now_mono,
                  int64_t *lo, int64_t *hi, int64_t *sent_out)
{
    const struct shm_rsv_lease *l = &rv->lease[shard];
    int64_t sent, recv, redis_ms;
    uint32_t seq;
    int tries = 0;

    do {
        seq = atomic_load(&l->seq);
        if (seq & 1) {
            if (++tries > 100)
                return CS_ERR;
            continue;
        }
        sent = atomic_load(&l->sent_mono);
        recv = atomic_load(&l->recv_mono);
        redis_ms = atomic_load(&l->redis_ms);
    } while ((seq & 1) || atomic_load(&l->seq) != seq);
    if (sent <= 0 || now_mono - sent >= lease_ms || recv < sent)
        return CS_ERR;
    /* Redis read its clock after the send and before the answer. */
    *lo = redis_ms + (now_mono - recv);
    *hi = redis_ms + (now_mono - sent);
    if (sent_out != NULL)
        *sent_out = sent;
    return CS_OK;
}

static uint64_t reserve_grant_key(int64_t id, int64_t uid)
{
    uint64_t x = (uint64_t)id * 0x9E3779B97F4A7C15ULL ^ (uint64_t)uid * 0xC2B2AE3D27D4EB4FULL;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 29;
    return x == 0 ? 1 : x;
}

int reserve_grant_find(const struct shm_reserves *rv, int64_t id, int64_t uid)
{
    uint64_t key = reserve_grant_key(id, uid);
    for (unsigned i = 0, h = (unsigned)key & (SHM_RGRANTS - 1); i < SHM_RGRANTS;
         i++, h = (h + 1) & (SHM_RGRANTS - 1)) {
        uint64_t k = atomic_load(&rv->grant[h].key);
        if (k == 0)
            return -1;
        if (k == key)
            return atomic_load(&rv->grant[h].state) > 0 ? (int)h : -1;
    }
    return -1;
}

int reserve_grant_add(struct shm_reserves *rv, int64_t id, int64_t uid, int *entry)
{
    uint64_t key = reserve_grant_key(id, uid);
    for (unsigned i = 0, h = (unsigned)key & (SHM_RGRANTS - 1); i < SHM_RGRANTS;
         i++, h = (h + 1) & (SHM_RGRANTS - 1)) {
        struct shm_rgrant *g = &rv->grant[h];
        uint64_t k = atomic_load(&g->key);
        if (k == 0) {
            /* Kept at most half full, so a probe stays short. */
            if (atomic_load(&rv->ngrants) >= SHM_RGRANTS / 2)
                break;
            if (!atomic_compare_exchange_strong(&g->key, &k, key) && k != key)
                continue;
            if (k == 0) {
                atomic_store(&g->activity_id, id);
                atomic_store(&g->user_id, uid);
                atomic_store(&g->state, RGRANT_PENDING);
                atomic_fetch_add(&rv->ngrants, 1);
                *entry = (int)h;
                return CS_OK;
            }
        }
        if (k != key)
            continue;
        /* This user's entry (a 64-bit hash that collided counts as the same
         * user: a refusal, never a second grant). A cancelled one is taken
         * back by exactly one caller. */
        int st = RGRANT_CANCELLED;
        *entry = (int)h;
        if (atomic_compare_exchange_strong(&g->state, &st, RGRANT_PENDING))
            return CS_OK;
        return CS_ERR;
    }
    *entry = -1;
    return CS_ERR;
}

int reserve_granted(const struct shm_reserves *rv, int64_t id, int64_t uid, int *replayed)
{
    int e = reserve_grant_find(rv, id, uid);
    if (e < 0)
        return 0;
    int st = atomic_load(&rv->grant[e].state);
    if (st < RGRANT_GRANTED)
        return 0;
    *replayed = st == RGRANT_REPLAYED;
    return 1;
}

/* Whether the open file j is still the one linked at path: the keeper
 * deletes a replayed segment that nobody has locked, and a worker's open
 * and lock are two steps, so the file may have gone in between. */
static int reserve_journal_linked(const struct journal *j, const char *path)
{
    struct stat fs, ps;
    return fstat(j->fd, &fs) == 0 && stat(path, &ps) == 0 && fs.st_nlink > 0
           && fs.st_dev == ps.st_dev && fs.st_ino == ps.st_ino;
}

static int reserve_journal_ready(struct reserve_journal *rj, const char *jdir, int wslot,
                                 uint64_t seg)
{
    char path[PATH_MAX], err[256];
    struct stat st;

    if (rj->seg == seg && rj->j.fd >= 0)
        return rj->j.failed ? CS_ERR : CS_OK;
    if (rj->seg != 0)
        journal_close(&rj->j);
    rj->seg = 0;
    journal_segment_path(path, sizeof(path), jdir, wslot, seg);
    for (int tries = 0;; tries++) {
        if (journal_open_path(&rj->j, path, err, sizeof(err)) != CS_OK) {
            log_error("reserve journal: %s", err);
            return CS_ERR;
        }
        /* Locked now: the keeper deletes nothing locked, so once the file
         * is still linked here it stays so. A record appended to one that
         * was deleted would never be replayed (rule 19). */
        if (reserve_journal_linked(&rj->j, path))
            break;
        journal_close(&rj->j);
        if (tries == 3) {
            log_error("reserve journal: %s was deleted under this worker %d times; not "
                      "granting", path, tries + 1);
            return CS_ERR;
        }
        log_warn("reserve journal: %s was deleted between its open and its lock; opened again",
                 path);
    }
    /* A new file is durable only once its directory entry is: a power cut
     * must not take a segment whose grants were answered SEIZED. Judged by
     * the file as opened, not by a look before the open: an empty one may
     * be another's creation whose directory was never synced (a worker of
     * this slot killed between its create and its fsync). */
    if ((fstat(rj->j.fd, &st) != 0 || st.st_size == 0) && cs_fsync_dir(jdir) != CS_OK) {
        log_error("reserve journal: fsync(%s) failed: %s; no more grants from the reserve", jdir,
                  strerror(errno));
        rj->j.failed = 1; /* kept, so that no later grant uses it unsynced */
        rj->seg = seg;
        return CS_ERR;
    }
    rj->seg = seg;
    return CS_OK;
}

/* An entry this grant added, given up: CANCELLED unless it is no longer
 * PENDING (the keeper marked it granted from a journal record). */
static void reserve_grant_cancel(struct shm_reserves *rv, int entry)
{
    int pending = RGRANT_PENDING;
    atomic_compare_exchange_strong(&rv->grant[entry].state, &pending, RGRANT_CANCELLED);
}

enum reserve_outcome reserve_grant(struct shm_node *shm, int wslot, const char *jdir,
                                   struct reserve_journal *rj, int lease_ms, int margin_ms,
                                   int64_t id, int64_t uid, int meta_known)
{
    struct shm_reserves *rv = &shm->rsv;
    int64_t now = cs_boot_ms(), lo, hi, sent;

    /* A user this node granted (its journal says so) is answered so even
     * when nothing is spendable now: a stopped reserve (a restart, a replay
     * pending), a lapsed lease or a halted node must not say UNAVAILABLE to
     * someone who holds a coupon. The keeper is read before the table and
     * after: a lookup that missed while a new keeper rebuilt the table
     * (none runs meanwhile: it empties the table, then refills it from the
     * journal) says nothing. */
    int keeper = atomic_load(&rv->keeper_pid);
    int e = reserve_grant_find(rv, id, uid);
    if (e >= 0)
        return atomic_load(&rv->grant[e].state) >= RGRANT_GRANTED ? RESERVE_ALREADY
                                                                   : RESERVE_UNKNOWN;
    if (keeper == 0 || atomic_load(&rv->keeper_pid) != keeper)
        return RESERVE_NO_KEEPER;
    if (wslot < 0 || wslot >= SHM_MAX_WORKERS || atomic_load(&rv->halted))
        return RESERVE_NONE;
    int i = reserve_slot_of(rv, id);
    if (i < 0)
        return RESERVE_NONE;
    struct shm_rsv_slot *s = &rv->slot[i];
    if (atomic_load(&s->state) != RSV_OPEN || (!meta_known && !atomic_load(&s->open_to_all))
        || reserve_lease(rv, keys_shard(id), lease_ms, now, &lo, &hi, &sent) != CS_OK
        || lo < atomic_load(&s->start_ms) || hi >= atomic_load(&s->end_ms) - margin_ms)
        return RESERVE_NONE;
    /* The lease this grant was checked against ends here, whatever renewal
     * comes later: one sent after a partition healed (and an admin's return
     * meanwhile) says nothing of the time this grant was made in. */
    int64_t until = sent + lease_ms;

    /* The busy marker goes up before the state is read again: a keeper that
     * stopped the slot either sees the marker and waits for this grant, or
     * this grant sees the slot stopped (both sequentially consistent).
     * The marker names the epoch (read before it, checked again after): a
     * keeper fences an epoch, wherever its slot is now. */
    uint64_t epoch = atomic_load(&s->epoch);
    atomic_store(&rv->busy_aid[wslot], id);
    atomic_store(&rv->busy_epoch[wslot], epoch);
    atomic_store(&rv->busy[wslot], i + 1);
    enum reserve_outcome out = RESERVE_NONE;
    if (atomic_load(&s->state) != RSV_OPEN || atomic_load(&s->activity_id) != id
        || atomic_load(&s->epoch) != epoch)
        goto done;
    int32_t amount = atomic_load(&s->amount);
    uint64_t seg = atomic_load(&rv->journal_seg);
    if (seg == 0 || atomic_load(&s->next) >= amount)
        goto done;
    int entry;
    if (reserve_grant_add(rv, id, uid, &entry) != CS_OK) {
        /* Granted by another worker meanwhile (perhaps still being written:
         * then this request cannot know), or the table is full. */
        if (entry >= 0)
            out = atomic_load(&rv->grant[entry].state) >= RGRANT_GRANTED ? RESERVE_ALREADY
                                                                         : RESERVE_UNKNOWN;
        goto done;
    }
    int32_t token = atomic_fetch_add(&s->next, 1);
    if (token >= amount) {
        /* Spent meanwhile; the entry says nothing was granted: it must not
         * stay, or the user would be told ALREADY_SEIZED. Only from
         * PENDING: the keeper may have marked it from a record of the same
         * user that its table had lost. */
        reserve_grant_cancel(rv, entry);
        goto done;
    }
    if (reserve_journal_ready(rj, jdir, wslot, seg) != CS_OK) {
        /* Nothing written: the token stays unused and goes back with the
         * reserve; the user holds nothing. A failed sync stops the node. */
        reserve_grant_cancel(rv, entry);
        if (rj->seg == seg && rj->j.failed && !atomic_exchange(&rv->halted, 1))
            atomic_fetch_add(&rv->journal_failures, 1);
        goto done;
    }
    struct journal_rec rec = {
        .activity_id = id,
        .epoch = epoch,
        .token = (uint32_t)token,
        .user_id = uid,
        .seize_ms = lo + (hi - lo) / 2,
    };
    atomic_fetch_add(&rv->journal_depth, 1);
    int64_t zero = 0;
    atomic_compare_exchange_strong(&rv->oldest_unreplayed_ms, &zero, cs_now_ms());
    if (journal_append(&rj->j, &rec) != CS_OK) {
        /* The record may or may not be on disk: the answer cannot be
         * either way, and the node grants no more. */
        atomic_store(&rv->halted, 1);
        atomic_fetch_add(&rv->journal_failures, 1);
        out = RESERVE_UNKNOWN;
        goto done;
    }
    /* A fault for the tests: the worker dies with the grant on disk and
     * the answer not sent (internals.md rule 6). */
    if (reserve_crash_after_append)
        raise(SIGKILL);
    /* Unless the keeper already replayed it. */
    int pending = RGRANT_PENDING;
    atomic_compare_exchange_strong(&rv->grant[entry].state, &pending, RGRANT_GRANTED);
    atomic_fetch_add(&rv->spent, 1);
    out = RESERVE_SEIZED;
    /* An fsync that ended after the lease checked above: an admin may have
     * returned the reserve meanwhile, so the grant may not be honoured (rule
     * 16). It is on disk and replayed like any other, but the answer cannot
     * say so. The lease as it stands now would not do: renewed once the
     * partition healed, it would cover a grant made outside any lease. */
    if (cs_boot_ms() >= until)
        out = RESERVE_UNKNOWN;
done:
    atomic_store(&rv->busy[wslot], 0);
    return out;
}

int64_t reserve_held(const struct shm_reserves *rv)
{
    int64_t held = 0;
    for (int i = 0; i < SHM_RESERVES; i++) {
        const struct shm_rsv_slot *s = &rv->slot[i];
        if (atomic_load(&s->state) != RSV_OPEN)
            continue;
        int32_t left = atomic_load(&s->amount) - atomic_load(&s->next);
        if (left > 0)
            held += left;
    }
    return held;
}

int64_t reserve_lease_left(const struct shm_node *shm, int lease_ms)
{
    const struct shm_reserves *rv = &shm->rsv;
    int64_t now = cs_boot_ms(), lo, hi, sent, best = 0;

    if (atomic_load(&rv->keeper_pid) == 0 || atomic_load(&rv->halted))
        return 0;
    for (int i = 0; i < SHM_RESERVES; i++) {
        const struct shm_rsv_slot *s = &rv->slot[i];
        if (atomic_load(&s->state) != RSV_OPEN
            || atomic_load(&s->next) >= atomic_load(&s->amount))
            continue;
        if (reserve_lease(rv, keys_shard(atomic_load(&s->activity_id)), lease_ms, now, &lo, &hi,
                          &sent)
                == CS_OK
            && lease_ms - (now - sent) > best)
            best = lease_ms - (now - sent);
    }
    return best;
}

const char *reserve_seize_source(const struct shm_node *shm, int redis_ok, int lease_ms)
{
    if (redis_ok)
        return "redis";
    /* A lease holds exactly while it has time left (reserve_lease()). */
    return reserve_lease_left(shm, lease_ms) > 0 ? "reserve" : "none";
}
