/* keeper_rebuild.c - the reserve keeper at start-up: what the node holds,
 * rebuilt from MySQL's open epochs, the journal and the tokens file; and the
 * halt that outlives restarts. */
#include "keeper_int.h"
#include "activity.h"
#include "cs.h"
#include "keys.h"
#include "log.h"
#include "reserve.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char SQL_RSV_MINE[] =
    "SELECT activity_id, epoch, amount FROM reserve_epoch WHERE incarnation = ? AND state = 1";
/* Epochs an admin closed lately: what their returns kept out of stock waits
 * for this node's replay (internals.md rule 16). */
static const char SQL_RSV_ADMIN_CLOSED[] =
    "SELECT activity_id, epoch, released_at IS NOT NULL FROM reserve_epoch "
    "WHERE incarnation = ? AND state = 2 "
    "AND closed_by = 'admin' AND closed_at > NOW() - INTERVAL 30 DAY LIMIT 10000";

/* ---- start-up ---------------------------------------------------------------------- */

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
    k->loc[i].phase = KP_RESUME;
    k->loc[i].field = 1;
    atomic_store(&s->state, RSV_STOPPED);
    return CS_OK;
}

static int keeper_admin_closed_row(void *arg, int ncols, char **cols)
{
    struct keeper *k = arg;
    if (ncols >= 3 && cols[0] != NULL && cols[1] != NULL) {
        keeper_add_release(k, strtoll(cols[0], NULL, 10), strtoull(cols[1], NULL, 10));
        /* Released in MySQL, perhaps not yet in Redis: the release runs
         * again, the mark need not. */
        k->release[k->nrelease - 1].marked = cols[2] != NULL && atoi(cols[2]) != 0;
    }
    return CS_OK;
}

/* Runs the query sql (this incarnation as its one parameter) until MySQL
 * answers it, once a second; CS_ERR only when the keeper is told to stop. */
static int keeper_query_until(struct keeper *k, const char *sql, const struct mval *p,
                              mconn_row_fn fn, const char *what)
{
    while (mconn_query(k->mc, sql, p, 1, fn, k) != CS_OK) {
        log_warn("reserve keeper: reading this node's %s from MySQL: %s; again in 1 s", what,
                 k->mc->errstr);
        if (keeper_stop || keeper_handover)
            return CS_ERR;
        sleep(1);
    }
    return CS_OK;
}

/*
 * What this incarnation holds, rebuilt: the open epochs from MySQL, and per
 * epoch the tokens already granted from the journal (never from
 * configuration or Redis). Torn tails are cut first. Every slot starts
 * stopped; it opens once its records are replayed.
 */
int keeper_journal_rebuild(struct keeper *k)
{
    char path[PATH_MAX], err[256];
    struct shm_reserves *rv = k->rv;

    /* A keeper restarted under running workers: nobody is inside a grant
     * once every slot is stopped and the markers are down. */
    for (int i = 0; i < SHM_RESERVES; i++)
        if (atomic_load(&rv->slot[i].state) != RSV_EMPTY)
            atomic_store(&rv->slot[i].state, RSV_STOPPED);
    for (int tries = 0; tries < 300 && !keeper_markers_down(k); tries++)
        usleep(10000);
    /* Not waited for longer (the node must not stay without a keeper), but
     * not forgotten: the marker names its activity and epoch, so every
     * fence of that epoch fails (nothing given back, no slot freed) until
     * the grant ends or the supervisor reaps its worker and clears it. */
    for (int w = 0; w < SHM_MAX_WORKERS; w++) {
        if (atomic_load(&rv->busy[w]) == 0)
            continue;
        k->stale_busy = 1;
        log_error("reserve keeper: worker %d is still inside a grant of activity %" PRId64
                  " epoch %" PRIu64 " after 3 s (a stuck write?); that epoch stays fenced "
                  "until it is done", (int)atomic_load(&k->shm->worker_pid[w]),
                  atomic_load(&rv->busy_aid[w]), atomic_load(&rv->busy_epoch[w]));
    }
    /* A grant still in flight after the wait took its token already: the
     * next token each slot had is kept, so it is never handed out again,
     * and its record, written after the scan below, enters the table at the
     * next replay pass (keeper_mark_granted()). */
    struct khad {
        int64_t aid;
        uint64_t epoch;
        int32_t next;
    } had[SHM_RESERVES];
    int nhad = 0;
    for (int i = 0; i < SHM_RESERVES; i++) {
        if (atomic_load(&rv->slot[i].state) != RSV_EMPTY)
            had[nhad++] = (struct khad){atomic_load(&rv->slot[i].activity_id),
                                         atomic_load(&rv->slot[i].epoch),
                                         atomic_load(&rv->slot[i].next)};
        keeper_slot_free(k, i);
    }
    memset(rv->grant, 0, sizeof(rv->grant));
    atomic_store(&rv->ngrants, 0);

    struct mval p[] = {MV_TXT(k->jd.incarnation, JOURNAL_ID_LEN)};
    if (keeper_query_until(k, SQL_RSV_MINE, p, keeper_mine_row, "open epochs") != CS_OK)
        return CS_ERR;
    for (int h = 0; h < nhad; h++) {
        int i = reserve_slot_of(rv, had[h].aid);
        if (i >= 0 && atomic_load(&rv->slot[i].epoch) == had[h].epoch
            && had[h].next > atomic_load(&rv->slot[i].next))
            atomic_store(&rv->slot[i].next, had[h].next);
    }
    keeper_tokens_read(k);
    if (keeper_query_until(k, SQL_RSV_ADMIN_CLOSED, p, keeper_admin_closed_row,
                           "epochs closed by an admin") != CS_OK)
        return CS_ERR;
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
void keeper_journal_reset_grants(struct keeper *k)
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

/* ---- the halt ------------------------------------------------------------------------ */

#define KEEPER_HALTED "halted"

void keeper_journal_halt(struct keeper *k, int start)
{
    char path[PATH_MAX];
    struct shm_reserves *rv = k->rv;
    snprintf(path, sizeof(path), "%s/%s", k->jd.path, KEEPER_HALTED);
    int there = access(path, F_OK) == 0;

    if (start) {
        if (there) {
            atomic_store(&rv->halted, 1);
            log_error("reserve keeper: halted by %s (a journal write failed before); no grants "
                      "from reserves until an operator removes it", path);
        }
        k->halt_kept = there;
        return;
    }
    if (k->halt_kept && !there) {
        /* The operator cleared it. Workers move to a new segment: the one
         * whose write failed is never appended to again. */
        k->halt_kept = 0;
        atomic_store(&rv->halted, 0);
        atomic_fetch_add(&rv->journal_seg, 1);
        log_notice("reserve keeper: %s removed; grants from reserves resume", path);
        return;
    }
    if (!atomic_load(&rv->halted) || k->halt_kept)
        return;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    static const char text[] = "a journal write failed; remove this file once the disk is "
                               "fixed to let the node grant from reserves again\n";
    int ok = fd >= 0 && write(fd, text, sizeof(text) - 1) == (ssize_t)(sizeof(text) - 1)
             && fsync(fd) == 0;
    if (fd >= 0 && close(fd) != 0)
        ok = 0;
    if (ok && cs_fsync_dir(k->jd.path) == CS_OK) {
        k->halt_kept = 1;
        log_error("reserve keeper: a journal write failed: halted until an operator removes %s",
                  path);
        return;
    }
    int64_t now = cs_mono_ms();
    if (k->halt_warn_ms == 0 || now - k->halt_warn_ms >= 60000) {
        k->halt_warn_ms = now;
        log_error("reserve keeper: writing %s failed: %s; halted while this node runs, but a "
                  "restart would not know", path, strerror(errno));
    }
}
