/* keeper_base.c - what the reserve keeper's files share: its stop flag, the
 * durability rule for its writes, the epochs it closed or must release, the
 * fence and the freeing of a slot, and an epoch's row in MySQL. It calls
 * nothing of the other keeper files, so that each of them, and a test, can
 * link it alone (keeper_int.h says who calls what). */
#include "cs.h"
#include "keeper_int.h"
#include "keys.h"
#include "log.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char SQL_RSV_CLOSE[] =
    "UPDATE reserve_epoch SET state = 2, closed_by = 'node', returned = ?, "
    "amount = IF(? < 0, amount, ?), closed_at = NOW(3) "
    "WHERE activity_id = ? AND incarnation = ? AND epoch = ? AND state = 1";
static const char SQL_RSV_STATE[] =
    "SELECT state, COALESCE(closed_by, '') FROM reserve_epoch "
    "WHERE activity_id = ? AND incarnation = ? AND epoch = ?";

volatile sig_atomic_t keeper_stop;
volatile sig_atomic_t keeper_handover;

/* The durability rule for a write that ran at site (fence: it wrote nothing). */
int keeper_durable(struct keeper *k, int shard, const struct rconn_site *site, int fence)
{
    char fkey[KEYS_MAX];
    if (k->conf->redis_wait_replicas <= 0)
        return CS_OK;
    /* A site whose replicas fell short once this pass is not asked again
     * until the next: with a replica gone, every WAIT would run its whole
     * timeout, and a pass of one per shard would outlast the lease. */
    for (int i = 0; i < k->nwait_short; i++)
        if (k->wait_short[i].conn_id == site->conn_id && k->wait_short[i].node == site->node)
            return CS_ERR;
    int copies = rconn_copies(k->rc, site, k->conf->redis_wait_replicas);
    if (fence)
        keys_fence(fkey, shard);
    if (rconn_wait_at(k->rc, site, fence ? fkey : NULL, copies,
                      k->conf->redis_wait_timeout_ms) == CS_OK)
        return CS_OK;
    if (k->nwait_short < (int)CS_ARRAY_LEN(k->wait_short))
        k->wait_short[k->nwait_short++] = *site;
    return CS_ERR;
}

int keeper_is_closed(const struct keeper *k, int64_t aid, uint64_t epoch)
{
    for (size_t i = 0; i < k->nclosed; i++)
        if (k->closed[i].aid == aid && k->closed[i].epoch == epoch)
            return 1;
    return 0;
}

void keeper_add_closed(struct keeper *k, int64_t aid, uint64_t epoch)
{
    if (keeper_is_closed(k, aid, epoch))
        return;
    k->closed = cs_grow(k->closed, &k->closed_cap, k->nclosed + 1, sizeof(*k->closed));
    k->closed[k->nclosed++] = (struct kclosed){aid, epoch};
}

void keeper_add_release(struct keeper *k, int64_t aid, uint64_t epoch)
{
    for (size_t i = 0; i < k->nrelease; i++)
        if (k->release[i].aid == aid && k->release[i].epoch == epoch)
            return;
    k->release = cs_grow(k->release, &k->release_cap, k->nrelease + 1, sizeof(*k->release));
    k->release[k->nrelease++] = (struct krelease){aid, epoch, 0};
}

/* Registry slot w's busy marker, up: 1 while its worker may still be inside
 * the grant. A worker that is gone (one no supervisor reaps and clears: an
 * orphan of a supervisor that died, killed) writes nothing more, and a
 * record it appended is read by the next replay pass: its marker is taken
 * down here. */
static int keeper_marker_live(const struct keeper *k, int w)
{
    int32_t pid = atomic_load(&k->shm->worker_pid[w]);
    if (pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH))
        return 1;
    atomic_store(&k->rv->busy[w], 0);
    return 0;
}

int keeper_epoch_busy(const struct keeper *k, int64_t aid, uint64_t epoch)
{
    /* busy[] is read first: the activity and epoch a worker marks are
     * written before it, and a grant that marks this epoch after the read
     * sees its slot stopped. */
    for (int w = 0; w < SHM_MAX_WORKERS; w++)
        if (atomic_load(&k->rv->busy[w]) != 0 && atomic_load(&k->rv->busy_aid[w]) == aid
            && atomic_load(&k->rv->busy_epoch[w]) == epoch && keeper_marker_live(k, w))
            return 1;
    return 0;
}

int keeper_markers_down(const struct keeper *k)
{
    for (int w = 0; w < SHM_MAX_WORKERS; w++)
        if (atomic_load(&k->rv->busy[w]) != 0 && keeper_marker_live(k, w))
            return 0;
    return 1;
}

/* Slot i: no new grants, and whether every grant in flight of its epoch is
 * done (a worker inside one since before a keeper restart included: it is
 * matched by activity and epoch, not by the slot it named then). */
int keeper_fenced(struct keeper *k, int i)
{
    struct shm_rsv_slot *s = &k->rv->slot[i];
    atomic_store(&s->state, RSV_STOPPED);
    return !keeper_epoch_busy(k, atomic_load(&s->activity_id), atomic_load(&s->epoch));
}

void keeper_slot_hold(struct keeper *k, int i)
{
    atomic_store(&k->rv->slot[i].state, RSV_STOPPED);
    if (k->loc[i].phase == KP_LIVE || k->loc[i].phase == KP_CLOSED)
        k->loc[i].phase = KP_RESUME;
}

void keeper_slot_free(struct keeper *k, int i)
{
    struct shm_rsv_slot *s = &k->rv->slot[i];
    atomic_store(&s->state, RSV_EMPTY);
    atomic_store(&s->activity_id, 0);
    memset(&k->loc[i], 0, sizeof(k->loc[i]));
}

/* ---- MySQL --------------------------------------------------------------------- */


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
int keeper_epoch_state(struct keeper *k, int64_t aid, uint64_t epoch, char *by,
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

int keeper_close_epoch(struct keeper *k, int64_t aid, uint64_t epoch, int64_t returned,
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

int keeper_reply_int(const struct keeper *k, redisReply *r, long long *v, char *why,
                     size_t whylen)
{
    int ret = CS_ERR;
    if (r != NULL && r->type == REDIS_REPLY_INTEGER) {
        *v = r->integer;
        ret = CS_OK;
    } else {
        snprintf(why, whylen, "%s", r == NULL ? k->rc->errstr
                                  : r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
    }
    if (r != NULL)
        freeReplyObject(r);
    return ret;
}
