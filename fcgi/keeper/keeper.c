/* keeper.c - the reserve keeper (doc/internals.md, "The reserves"): sets reserves aside, renews the node's lease, replays the
 * journal and gives reserves back. One process per node; the workers spend
 * what it publishes in shared memory (lib/node/reserve.c).
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
 *
 * The journal's part (replay, segments) is in keeper_journal.c, the rebuild
 * at start-up in keeper_rebuild.c, setting aside in keeper_aside.c, the
 * incarnation's claim in keeper_claim.c, step 1 in keeper_renew.c, the
 * decisions of steps 2 and 4 on each slot in keeper_slots.c, and what they
 * all share in keeper_base.c.
 */
#include "keeper.h"
#include "activity.h"
#include "cs.h"
#include "keeper_int.h"
#include "rargs.h"
#include "keys.h"
#include "log.h"
#include "reserve.h"
#include "reserve_admin.h"
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
#include <signal.h>
#include <sys/prctl.h>

static void keeper_on_term(int sig)
{
    (void)sig;
    keeper_stop = 1;
}

static void keeper_on_handover(int sig)
{
    (void)sig;
    keeper_handover = 1;
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


/* The lease stamps of every incarnation with an open epoch, one per (shard,
 * incarnation), are read each KEEPER_WATCH_MS; which incarnations those are
 * is read from MySQL each KEEPER_WATCH_LIST_MS (KEEPER_WATCH_RETRY_MS after
 * MySQL failed: the keeper's renewals must not wait on a MySQL outage). */
#define KEEPER_WATCH_MS 1000
#define KEEPER_WATCH_LIST_MS 10000
#define KEEPER_WATCH_RETRY_MS 30000
static const char SQL_OPEN_INCARNATIONS[] =
    "SELECT DISTINCT activity_id % 10, incarnation FROM reserve_epoch "
    "WHERE state = 1 ORDER BY 1, 2 LIMIT 256";
_Static_assert(KEYS_SHARDS == 10 && KEEPER_WATCH_MAX == 256, "SQL_OPEN_INCARNATIONS");
_Static_assert(KEEPER_WATCH_MAX < LEASE_WATCH_N, "admin reads need room in the lease watch");

static int row_watch(void *arg, int ncols, char **cols)
{
    struct keeper *k = arg;
    if (ncols < 2 || cols[0] == NULL || cols[1] == NULL || k->nwatch == KEEPER_WATCH_MAX
        || !reserve_admin_incarnation_ok(cols[1], strlen(cols[1])))
        return CS_OK;
    k->watch[k->nwatch].shard = atoi(cols[0]);
    memcpy(k->watch[k->nwatch].inc, cols[1], JOURNAL_ID_LEN + 1);
    k->nwatch++;
    return CS_OK;
}

/* Reads the lease stamp of every incarnation with an open epoch into the
 * node's lease watch (lib/node/lease_watch.h): an admin's return of a lost
 * node's reserve then judges its lease by this node's clock from about when
 * the node went quiet, not from the operator's first question. */
static void keeper_watch_leases(struct keeper *k)
{
    int64_t now = cs_boot_ms();

    if (now < k->watch_next_ms)
        return;
    k->watch_next_ms = now + KEEPER_WATCH_MS;
    if (now >= k->watch_list_ms) {
        k->nwatch = 0;
        if (mconn_query(k->mc, SQL_OPEN_INCARNATIONS, NULL, 0, row_watch, k) != CS_OK) {
            log_debug("reserve keeper: reading open incarnations: %s", k->mc->errstr);
            k->watch_list_ms = now + KEEPER_WATCH_RETRY_MS;
            return;
        }
        if (k->nwatch == KEEPER_WATCH_MAX)
            log_warn("reserve keeper: more than %d (shard, incarnation) pairs with open reserve "
                     "epochs; the leases of the others are watched from an admin's first look",
                     KEEPER_WATCH_MAX);
        k->watch_list_ms = cs_boot_ms() + KEEPER_WATCH_LIST_MS;
    }
    for (int i = 0; i < k->nwatch; i++) {
        char rkey[KEYS_MAX];
        keys_reserve(rkey, k->watch[i].shard);
        if (rconn_append(k->rc, rkey, "HMGET %s lease:%s lease:%s:ms", rkey, k->watch[i].inc,
                         k->watch[i].inc) != CS_OK)
            return;
    }
    for (int i = 0; i < k->nwatch; i++) {
        redisReply *r = NULL;
        if (rconn_get_reply(k->rc, &r) != CS_OK)
            return; /* the connection is dropped: nothing more to read */
        /* Taken after the answer came: never before the renewal it shows. */
        int64_t seen_at = cs_boot_ms(), longest;
        if (r->type == REDIS_REPLY_ARRAY && r->elements == 2)
            lease_watch_seen(&k->shm->lease_watch, k->watch[i].inc, k->watch[i].shard,
                             rconn_reply_int(r->element[0], -1), rconn_reply_int(r->element[1], 0),
                             seen_at, &longest);
        freeReplyObject(r);
    }
}

/* The part of a pass for an instance that holds its incarnation's claim
 * (or got no answer and was not refused). */
static void keeper_pass_held(struct keeper *k, int stopping)
{
    int shards[KEYS_SHARDS] = {0};

    /* Shards with a slot, with records left, or with tokens an admin's
     * return kept out of stock to put back. */
    for (int i = 0; i < SHM_RESERVES; i++)
        if (atomic_load(&k->rv->slot[i].state) != RSV_EMPTY)
            shards[keys_shard(atomic_load(&k->rv->slot[i].activity_id))] = 1;
    for (size_t i = 0; i < k->nrelease; i++)
        shards[keys_shard(k->release[i].aid)] = 1;
    int64_t depth = atomic_load(&k->rv->journal_depth);
    for (int s = 0; s < KEYS_SHARDS; s++) {
        k->renewed[s] = 0;
        if (shards[s] || depth > 0 || k->nfiles > 0)
            k->renewed[s] = keeper_renew(k, s) == CS_OK;
    }
    /* Fences first (a stopped slot with nobody inside), then the replay
     * that sees every record they will ever have, then the decisions. A
     * slot stopped only by this pass's decisions waits for the next one: a
     * grant made after the journal was read is not in its count. */
    for (int i = 0; i < SHM_RESERVES; i++)
        k->loc[i].fenced = atomic_load(&k->rv->slot[i].state) == RSV_STOPPED
                           && keeper_fenced(k, i);
    keeper_journal_replay(k);
    cs_pause_point("keeper-decide"); /* for the tests, see lib/cs.h */
    /* The list says which sales are open to all: known before a slot of a
     * restarted keeper opens, so a worker without metadata may grant. */
    int any = 0;
    for (int s = 0; s < KEYS_SHARDS; s++)
        any |= k->renewed[s];
    if (any)
        keeper_aside_read_list(k);
    keeper_slots(k, stopping);
    keeper_journal_retire(k);
    if (!stopping)
        keeper_aside_pass(k);
    keeper_journal_reset_grants(k);
}

static void keeper_pass(struct keeper *k, int stopping)
{
    k->nwait_short = 0;
    if (keeper_claim(k) == CS_OK) {
        keeper_pass_held(k, stopping);
    } else {
        for (int s = 0; s < KEYS_SHARDS; s++)
            k->renewed[s] = 0;
    }
    /* This node's own, whoever holds the claim. */
    keeper_journal_halt(k, 0);
    keeper_watch_leases(k);
}

/* Sets k up on the node segment and opens the journal directory (its
 * lock: one keeper per directory); CS_ERR, logged, when it cannot be
 * opened, with nothing to undo. */
static int keeper_open(struct keeper *k, const struct cs_conf *conf, struct shm_node *shm)
{
    struct rconn_opts ro;
    char err[512];

    memset(k, 0, sizeof(*k));
    k->conf = conf;
    k->shm = shm;
    k->rv = &shm->rsv;
    k->list_gen = -2;
    k->margin_ms = conf->fallback_budget_ms;
    for (int s = 0; s < KEYS_SHARDS; s++)
        k->restored[s] = -1;
    signal(SIGTERM, keeper_on_term);
    signal(SIGINT, keeper_on_term);
    signal(SIGHUP, SIG_IGN);
    signal(SIGUSR2, keeper_on_handover);

    if (journal_dir_open(&k->jd, conf->fallback_journal, err, sizeof(err)) != CS_OK) {
        log_error("reserve keeper: %s; no reserves on this node", err);
        return CS_ERR;
    }
    /* The journal's lock is this keeper's: a keeper named in the segment
     * now is one that died with nobody to clear its name (killed, its
     * supervisor gone), and workers must not trust the grants table this
     * keeper is about to empty and rebuild. */
    atomic_store(&k->rv->keeper_pid, 0);
    rconn_opts_from_conf(&ro, conf, conf->redis_command_timeout_ms);
    ro.cluster_shared = &shm->cluster;
    k->rc = rconn_new(&ro);
    k->mc = mconn_new(conf);
    rscript_from_text(&k->s_aside, script_reserve_set_aside);
    rscript_from_text(&k->s_renew, script_reserve_renew);
    rscript_from_text(&k->s_replay, script_reserve_replay);
    rscript_from_text(&k->s_give, script_reserve_give_back);
    rscript_from_text(&k->s_release, script_reserve_release);
    return CS_OK;
}

/* The end of a keeper: its slots told it is gone (RSV_STOPPED: workers
 * grant no more from them), its name cleared, everything freed. */
static void keeper_close(struct keeper *k)
{
    for (int i = 0; i < SHM_RESERVES; i++)
        if (atomic_load(&k->rv->slot[i].state) != RSV_EMPTY)
            atomic_store(&k->rv->slot[i].state, RSV_STOPPED);
    atomic_store(&k->rv->keeper_pid, 0);
    rscript_free(&k->s_aside);
    rscript_free(&k->s_renew);
    rscript_free(&k->s_replay);
    rscript_free(&k->s_give);
    rscript_free(&k->s_release);
    rconn_free(k->rc);
    mconn_free(k->mc);
    free(k->files);
    free(k->closed);
    free(k->release);
    free(k->acts);
    journal_dir_close(&k->jd);
    log_notice("reserve keeper stopped");
}

/* While stopping (SIGTERM, by stop_by): 1 once every reserve is given back
 * and the journal replayed; or when waiting holds up the stop for nothing
 * (past stop_by, or Redis away for a second: the next start replays and
 * returns them). */
static int keeper_stop_done(struct keeper *k, int64_t stop_by)
{
    int open = 0, cut = 0;

    for (int i = 0; i < SHM_RESERVES; i++)
        if (atomic_load(&k->rv->slot[i].state) != RSV_EMPTY) {
            open++;
            cut += !k->renewed[keys_shard(atomic_load(&k->rv->slot[i].activity_id))];
        }
    if (open == 0 && atomic_load(&k->rv->journal_depth) == 0)
        return 1;
    int64_t now = cs_mono_ms();
    if (now >= stop_by || (cut > 0 && now >= stop_by - KEEPER_STOP_MS + 1000)) {
        log_warn("reserve keeper: %d reserves not given back (Redis unreachable?); "
                 "the next start replays and returns them", open);
        return 1;
    }
    return 0;
}

/* The keeper's passes, one every KEEPER_TICK_MS, until it hands over
 * (SIGUSR2) or has stopped (SIGTERM, keeper_stop_done()). */
static void keeper_loop(struct keeper *k)
{
    int64_t stop_by = 0;

    for (;;) {
        int64_t t0 = cs_mono_ms();
        if (keeper_handover) {
            /* Every grant is fsync'd before its answer and DIR/tokens
             * before a segment goes: the journal holds all the next keeper
             * needs. Nothing is given back, so nothing is set aside twice. */
            log_notice("reserve keeper: handing over to the upgraded node's keeper; nothing "
                       "given back");
            return;
        }
        if (keeper_stop && stop_by == 0) {
            log_notice("reserve keeper: stopping: giving every reserve back");
            stop_by = t0 + KEEPER_STOP_MS;
        }
        int markers_down = k->stale_busy && keeper_markers_down(k);
        uint64_t passes = k->replay_passes;
        keeper_pass(k, stop_by != 0);
        if (markers_down && k->replay_passes != passes) {
            k->stale_busy = 0;
            atomic_store(&k->rv->keeper_pid, (int)getpid());
            log_notice("reserve keeper: the grants in flight at start-up are in the table");
        }
        if (stop_by != 0 && keeper_stop_done(k, stop_by))
            return;
        int64_t left = KEEPER_TICK_MS - (cs_mono_ms() - t0);
        if (left > 0)
            usleep((useconds_t)left * 1000);
    }
}

int keeper_main(const struct cs_conf *conf, struct shm_node *shm)
{
    struct keeper k;

    if (keeper_open(&k, conf, shm) != CS_OK)
        return 1;
    keeper_claim_init(&k);
    if (keeper_journal_rebuild(&k) == CS_OK) {
        /* A halt is never cleared by a (re)start: shared memory keeps it
         * for a keeper restarted under running workers, DIR/halted for a
         * new node. */
        keeper_journal_halt(&k, 1);
        /* The grants table is whole once rebuilt, unless a worker was
         * still inside a grant: its record may come after the scan. Then
         * the keeper runs (workers cannot grant meanwhile: no keeper runs
         * for them, so every marker still up is from before) and is named
         * only after a pass that began with every marker down has put such
         * records in the table (keeper_mark_granted()). */
        if (!k.stale_busy)
            atomic_store(&k.rv->keeper_pid, (int)getpid());
        log_notice("reserve keeper %d: %d coupons per sale, lease %d ms, journal %s",
                   (int)getpid(), conf->fallback_reserve, conf->fallback_lease_ms,
                   conf->fallback_journal);
        keeper_loop(&k);
    }
    keeper_close(&k);
    return 0;
}

