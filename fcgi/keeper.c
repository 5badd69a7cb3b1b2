/* keeper.c - the reserve keeper (doc/internals.md, "The reserves"): sets reserves aside, renews the node's lease, replays the
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
 *
 * The journal's part (replay, segments) is in keeper_journal.c, the rebuild
 * at start-up in keeper_rebuild.c, setting aside in keeper_aside.c, the
 * incarnation's claim in keeper_claim.c.
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

static const char SQL_RSV_CLOSE[] =
    "UPDATE reserve_epoch SET state = 2, closed_by = 'node', returned = ?, "
    "amount = IF(? < 0, amount, ?), closed_at = NOW(3) "
    "WHERE activity_id = ? AND incarnation = ? AND epoch = ? AND state = 1";
static const char SQL_RSV_STATE[] =
    "SELECT state, COALESCE(closed_by, '') FROM reserve_epoch "
    "WHERE activity_id = ? AND incarnation = ? AND epoch = ?";


volatile sig_atomic_t keeper_stop;

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

int keeper_epoch_busy(const struct keeper *k, int64_t aid, uint64_t epoch)
{
    /* busy[] is read first: the activity and epoch a worker marks are
     * written before it, and a grant that marks this epoch after the read
     * sees its slot stopped. */
    for (int w = 0; w < SHM_MAX_WORKERS; w++)
        if (atomic_load(&k->rv->busy[w]) != 0 && atomic_load(&k->rv->busy_aid[w]) == aid
            && atomic_load(&k->rv->busy_epoch[w]) == epoch)
            return 1;
    return 0;
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

/* ---- the lease and the slots ---------------------------------------------------- */

static void keeper_parse_window(const char *w, int64_t *start, int64_t *end)
{
    long long s, e;
    if (w != NULL && sscanf(w, "%lld,%lld", &s, &e) == 2) {
        *start = s;
        *end = e;
    }
}

/* Activities renewed per call of lua/reserve_renew.lua; more take more calls. */
#define KEEPER_RENEW_PER_CALL 11

/* The renewal's answer by position: Redis' TIME, the shard's restore
 * generation, then RENEW_PER strings for each activity asked about. */
enum { RENEW_TIME_S, RENEW_TIME_US, RENEW_GEN, RENEW_HEAD };
enum { RENEW_FIELD, RENEW_STOCK, RENEW_WINDOW, RENEW_HELD, RENEW_PER };

/* One renewal call: the slots it asks about, in ARGV order, and when it
 * went and came back. */
struct krenew {
    int slot[KEEPER_RENEW_PER_CALL];
    int n;
    int64_t sent, recv, redis_ms;
    struct rconn_site at;
};

/* Adds to c and a's ARGV the next slots of shard from *next on, at most
 * KEEPER_RENEW_PER_CALL; *next is where the next call goes on. */
static void keeper_renew_pick(struct keeper *k, int shard, int *next, struct krenew *c,
                              struct rargs *a)
{
    c->n = 0;
    for (; *next < SHM_RESERVES && c->n < KEEPER_RENEW_PER_CALL; (*next)++) {
        struct shm_rsv_slot *s = &k->rv->slot[*next];
        int64_t id = atomic_load(&s->activity_id);
        if (atomic_load(&s->state) == RSV_EMPTY || keys_shard(id) != shard)
            continue;
        c->slot[c->n++] = *next;
        rargs_int(a, id);
    }
}

/* Runs call c: CS_OK with its answer in *out, as many elements as c asks
 * for, or CS_ERR when Redis did not answer so. */
static int keeper_renew_call(struct keeper *k, int shard, struct krenew *c, struct rargs *a,
                             redisReply **out)
{
    c->sent = cs_boot_ms();
    redisReply *r = rargs_evalsha(k->rc, &k->s_renew, 3, a, &c->at);
    c->recv = cs_boot_ms();
    if (r == NULL || r->type != REDIS_REPLY_ARRAY
        || r->elements != RENEW_HEAD + RENEW_PER * (size_t)c->n) {
        log_debug("reserve keeper: renewing shard %d: %s", shard,
                  r != NULL && r->type == REDIS_REPLY_ERROR ? r->str : k->rc->errstr);
        if (r != NULL)
            freeReplyObject(r);
        return CS_ERR;
    }
    c->redis_ms = strtoll(r->element[RENEW_TIME_S]->str, NULL, 10) * 1000
                  + strtoll(r->element[RENEW_TIME_US]->str, NULL, 10) / 1000;
    *out = r;
    return CS_OK;
}

/* The shard's restore generation is gen: when it moved, Redis was
 * restored, and every slot of the shard stops until replayed. */
static void keeper_renew_restored(struct keeper *k, int shard, int64_t gen)
{
    if (k->restored[shard] >= 0 && gen != k->restored[shard]) {
        log_warn("reserve keeper: shard %d was restored; reserves stop until replayed", shard);
        for (int i = 0; i < SHM_RESERVES; i++) {
            int64_t id = atomic_load(&k->rv->slot[i].activity_id);
            if (atomic_load(&k->rv->slot[i].state) != RSV_EMPTY && keys_shard(id) == shard)
                keeper_slot_hold(k, i);
        }
    }
    k->restored[shard] = gen;
}

/* Whether an element of the renewal's answer holds a value ('' is none). */
static int keeper_renew_has(const redisReply *e)
{
    return e->type == REDIS_REPLY_STRING && e->len > 0;
}

/* What the renewal says of slot i: e is its RENEW_PER elements. */
static void keeper_renew_slot(struct keeper *k, int i, redisReply **e)
{
    struct kslot *l = &k->loc[i];
    struct shm_rsv_slot *s = &k->rv->slot[i];

    l->field = keeper_renew_has(e[RENEW_FIELD]);
    if (l->field && l->phase == KP_AWAITS_RESTORE)
        l->phase = KP_RESUME; /* restored: replay, then resume */
    /* Its reserve is gone from Redis (an admin returned it after the lease
     * ran out, or Redis lost it): stopped before this renewal makes the
     * lease good again, so no worker spends it meanwhile. keeper_slots()
     * decides what comes next. */
    if (!l->field && l->phase != KP_IN_DOUBT && atomic_load(&s->state) == RSV_OPEN)
        atomic_store(&s->state, RSV_STOPPED);
    l->stock = keeper_renew_has(e[RENEW_STOCK]) ? strtoll(e[RENEW_STOCK]->str, NULL, 10)
                                                : INT64_MIN;
    l->held = e[RENEW_HELD]->type == REDIS_REPLY_STRING ? strtoll(e[RENEW_HELD]->str, NULL, 10)
                                                        : 0;
    if (keeper_renew_has(e[RENEW_WINDOW])) {
        int64_t st = atomic_load(&s->start_ms), en = atomic_load(&s->end_ms);
        keeper_parse_window(e[RENEW_WINDOW]->str, &st, &en);
        atomic_store(&s->start_ms, st);
        atomic_store(&s->end_ms, en);
    }
}

/* The stamp a renewal wrote is what an admin's return judges the lease by:
 * a renewal only the master holds may be lost with it in a failover, and
 * the new master's older stamp would let a return come while this node
 * still spends. So the durability rule holds for a renewal before it makes
 * the lease good (internals.md rule 16). CS_OK when it does. */
static int keeper_renew_durable(struct keeper *k, int shard, const struct rconn_site *at)
{
    if (keeper_durable(k, shard, at, 0) == CS_OK)
        return CS_OK;
    int64_t now = cs_mono_ms();
    if (k->renew_warn_ms == 0 || now - k->renew_warn_ms >= 10000) {
        k->renew_warn_ms = now;
        log_warn("reserve keeper: the renewal of shard %d is not on %d replicas (%s): "
                 "the lease is not extended", shard, k->conf->redis_wait_replicas,
                 k->rc->errstr);
    }
    return CS_ERR;
}

/* Makes the shard's lease good from the first call c of this renewal, the
 * oldest; once every slot whose reserve is gone is stopped. It runs from
 * the last claim Redis answered when that is older: a node that cannot
 * reach its claim (another master in a cluster) must stop spending once
 * the claim may have expired and another instance taken it. An earlier
 * send only widens the bounds on Redis' clock. */
static int keeper_renew_lease(struct keeper *k, int shard, const struct krenew *c)
{
    if (k->claim_sent <= 0)
        return k->claimed ? CS_OK : CS_ERR; /* answered ours, never confirmed: no lease */
    int64_t sent = k->claim_sent < c->sent ? k->claim_sent : c->sent;
    keeper_lease_set(k->rv, shard, sent, c->recv, c->redis_ms);
    return CS_OK;
}

/* Renews the lease of shard; CS_OK when Redis answered. */
static int keeper_renew(struct keeper *k, int shard)
{
    struct rargs a = RARGS_INIT;
    struct krenew c = {.n = 0}, first = {.sent = -1};
    int next = 0, durable = 1, ret = CS_ERR;

    rargs_key(&a, keys_reserve, shard);
    rargs_key(&a, keys_stock, shard);
    rargs_key(&a, keys_window, shard);
    rargs_str(&a, k->jd.incarnation);
    rargs_int(&a, k->conf->fallback_lease_ms);
    size_t fixed = a.n;
    do {
        rargs_truncate(&a, fixed);
        keeper_renew_pick(k, shard, &next, &c, &a);
        redisReply *r;
        if (keeper_renew_call(k, shard, &c, &a, &r) != CS_OK)
            goto out;
        keeper_renew_restored(k, shard, strtoll(r->element[RENEW_GEN]->str, NULL, 10));
        for (int j = 0; j < c.n; j++)
            keeper_renew_slot(k, c.slot[j], &r->element[RENEW_HEAD + RENEW_PER * j]);
        freeReplyObject(r);
        if (first.sent < 0)
            first = c;
        if (durable && keeper_renew_durable(k, shard, &c.at) != CS_OK)
            durable = 0;
    } while (next < SHM_RESERVES && c.n == KEEPER_RENEW_PER_CALL);
    /* Redis answered: its facts stand; the lease only once durable. */
    ret = durable ? keeper_renew_lease(k, shard, &first) : CS_OK;
out:
    rargs_free(&a);
    return ret;
}

/* Reads the true amount of a rebuilt slot's epoch from Redis; CS_OK with
 * *amount, CS_ERR when Redis did not answer, or *amount -1: not open there
 * (-2: closed there, -1: unknown to it). */
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
    *amount = r->type != REDIS_REPLY_STRING ? -1
              : sscanf(r->str, "open:%lld", &n) == 1 ? n
              : strcmp(r->str, "closed") == 0 ? -2 : -1;
    freeReplyObject(r);
    return CS_OK;
}

/* What this node's reserve field of activity aid holds in Redis: CS_OK with
 * *left (-1: no field), CS_ERR when Redis did not answer. */
static int keeper_field_left(struct keeper *k, int64_t aid, int64_t *left)
{
    char key[KEYS_MAX], field[64];
    keys_reserve(key, keys_shard(aid));
    snprintf(field, sizeof(field), "%" PRId64 ":%s", aid, k->jd.incarnation);
    return rconn_hget_int(k->rc, key, field, -1, left);
}

/* Gives slot i's reserve back: script, durability, MySQL. */
static void keeper_give_back(struct keeper *k, int i)
{
    struct shm_rsv_slot *s = &k->rv->slot[i];
    int64_t aid = atomic_load(&s->activity_id);
    uint64_t epoch = atomic_load(&s->epoch);
    int shard = keys_shard(aid);
    struct rargs a = RARGS_INIT;
    struct rconn_site at;

    rargs_key(&a, keys_stock, shard);
    rargs_key(&a, keys_reserve, shard);
    rargs_akey(&a, keys_reserve_epochs, aid);
    rargs_int(&a, aid);
    rargs_str(&a, k->jd.incarnation);
    rargs_int(&a, (int64_t)epoch);
    rargs_int(&a, 0);
    rargs_int(&a, k->loc[i].low_water);
    redisReply *r = rargs_evalsha(k->rc, &k->s_give, 3, &a, &at);
    rargs_free(&a);
    if (r == NULL || r->type != REDIS_REPLY_INTEGER) {
        log_warn("reserve keeper: giving back activity %" PRId64 " epoch %" PRIu64 ": %s", aid,
                 epoch, r != NULL && r->type == REDIS_REPLY_ERROR ? r->str : k->rc->errstr);
        if (r != NULL)
            freeReplyObject(r);
        return;
    }
    long long back = r->integer;
    freeReplyObject(r);
    if (back == SCRIPT_GIVE_NO_STOCK) {
        /* No stock field to give back to (a restore under way): later. */
        log_debug("reserve keeper: activity %" PRId64 " has no stock field; give-back waits", aid);
        return;
    }
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

/* A slot whose reserve field the last renewal did not find: closed by an
 * admin, or Redis lost it. MySQL says which, asked once (not every pass
 * while it lasts); the slot is freed once closed elsewhere and replayed. */
static void keeper_slot_unopened(struct keeper *k, int i)
{
    struct shm_rsv_slot *s = &k->rv->slot[i];
    struct kslot *l = &k->loc[i];
    int64_t aid = atomic_load(&s->activity_id);
    uint64_t epoch = atomic_load(&s->epoch);

    atomic_store(&s->state, RSV_STOPPED);
    if (l->phase != KP_CLOSED && l->phase != KP_AWAITS_RESTORE) {
        char by[16];
        int st = keeper_epoch_state(k, aid, epoch, by, sizeof(by));
        if (st == 2 || st == 0) {
            l->phase = KP_CLOSED;
            if (st == 2 && strcmp(by, "admin") == 0)
                keeper_add_release(k, aid, epoch);
            log_warn("reserve keeper: activity %" PRId64 " epoch %" PRIu64
                     " was closed elsewhere (%s); this node spends no more of it",
                     aid, epoch, st == 2 ? by : "no row");
        } else if (st == 1) {
            /* Open in MySQL. Closed in Redis means an admin's return
             * whose MySQL step did not happen (yet): closed all the
             * same, never waited for as a restore that never comes. */
            int64_t amount;
            if (keeper_epoch_amount(k, aid, epoch, &amount) != CS_OK)
                return;
            if (amount == -2) {
                l->phase = KP_CLOSED;
                keeper_add_release(k, aid, epoch);
                log_warn("reserve keeper: activity %" PRId64 " epoch %" PRIu64
                         " was closed in Redis (an admin's return; MySQL not yet); "
                         "this node spends no more of it", aid, epoch);
            } else {
                l->phase = KP_AWAITS_RESTORE; /* a restore brings it back */
            }
        }
    }
    if (l->phase == KP_CLOSED && keeper_fenced(k, i) && l->fenced && l->pending == 0)
        keeper_slot_free(k, i);
}

/* Why slot i's reserve should go back now (NULL: no reason); lease and hi
 * are the shard's lease check at this pass. */
static const char *keeper_slot_why_back(struct keeper *k, int i, int stopping, int lease,
                                        int64_t hi)
{
    struct shm_rsv_slot *s = &k->rv->slot[i];
    struct kslot *l = &k->loc[i];

    if (stopping)
        return "stopping";
    if (k->conf->fallback_reserve == 0)
        return "fallback.reserve is 0";
    if (l->stock < 0 && l->stock != INT64_MIN)
        return "revoked";
    if (l->stock == INT64_MIN)
        return NULL; /* a restore under way: never a reason to give back (rule 18) */
    if (lease && hi >= atomic_load(&s->end_ms) - k->margin_ms)
        return "the sale ends";
    if (l->stock < 2 * l->held) {
        l->low_water = 1;
        return "stock at the low-water mark";
    }
    if (atomic_load(&s->next) >= atomic_load(&s->amount) && l->pending == 0
        && atomic_load(&s->state) == RSV_OPEN)
        return "spent";
    return NULL;
}

/* Meets the durability rule for a set-aside not yet confirmed: a fence
 * write on the shard's master, and WAIT there. CS_OK once confirmed. */
static int keeper_slot_confirm(struct keeper *k, int i, int shard)
{
    struct kslot *l = &k->loc[i];
    struct rconn_site at = {0, -1};
    char fkey[KEYS_MAX];

    if (l->phase != KP_UNCONFIRMED)
        return CS_OK;
    keys_fence(fkey, shard);
    redisReply *r = rconn_commandv_at(k->rc, fkey, 2, (const char *[]){"INCR", fkey},
                                      (const size_t[]){4, strlen(fkey)}, &at);
    if (r != NULL) {
        freeReplyObject(r);
        if (keeper_durable(k, shard, &at, 0) == CS_OK)
            l->phase = KP_RESUME; /* opens once its field is read */
    }
    return l->phase == KP_UNCONFIRMED ? CS_ERR : CS_OK;
}

/* A slot stopped until replayed (a new set-aside, a restart, a restore, the
 * claim lost): once everything on disk is replayed, it resumes at what Redis
 * says is left of the epoch. CS_OK when it may open (again). */
static int keeper_slot_resume(struct keeper *k, int i)
{
    struct shm_rsv_slot *s = &k->rv->slot[i];
    struct kslot *l = &k->loc[i];
    int64_t aid = atomic_load(&s->activity_id);
    uint64_t epoch = atomic_load(&s->epoch);

    if (l->phase != KP_RESUME)
        return CS_OK;
    /* Not before a claim of this instance is confirmed: the one that
     * confirms it resumes every slot from Redis' field (keeper_claim). */
    if (!keeper_claim_confirmed(k, cs_boot_ms()))
        return CS_ERR;
    if (!keeper_fenced(k, i) || !l->fenced || l->pending > 0)
        return CS_ERR;
    int64_t amount;
    if (keeper_epoch_amount(k, aid, epoch, &amount) != CS_OK)
        return CS_ERR;
    if (amount < 0) {
        l->field = 0;
        /* Closed in Redis (an admin's return): closed for this slot too,
         * which frees it once replayed, even while a field of the same
         * incarnation is there (another instance's set-aside). */
        if (amount == -2)
            keeper_slot_unopened(k, i);
        return CS_ERR;
    }
    if (amount < atomic_load(&s->amount))
        atomic_store(&s->amount, (int32_t)amount);
    /* Everything on disk is replayed now, so Redis' field is what is
     * left of the epoch; a segment deleted with its records must not
     * make the node hand out their tokens again (rule 14). */
    int64_t left;
    if (keeper_field_left(k, aid, &left) != CS_OK)
        return CS_ERR;
    if (left < 0) {
        l->field = 0;
        return CS_ERR;
    }
    int32_t used = atomic_load(&s->amount) - (int32_t)left;
    if (used > atomic_load(&s->next)) {
        log_warn("reserve keeper: activity %" PRId64 " epoch %" PRIu64 ": Redis holds "
                 "%" PRId64 " of its %d tokens; resuming at token %d, not %d", aid, epoch,
                 left, atomic_load(&s->amount), used, atomic_load(&s->next));
        atomic_store(&s->next, used);
    }
    l->phase = KP_LIVE;
    return CS_OK;
}

/* Decides what each slot of a renewed shard does next: unopened, given
 * back, confirmed, resumed, then open. */
static void keeper_slots(struct keeper *k, int stopping)
{
    int64_t now = cs_boot_ms();

    for (int i = 0; i < SHM_RESERVES; i++) {
        struct shm_rsv_slot *s = &k->rv->slot[i];
        struct kslot *l = &k->loc[i];
        if (atomic_load(&s->state) == RSV_EMPTY)
            continue;
        int64_t aid = atomic_load(&s->activity_id);
        int shard = keys_shard(aid);
        if (stopping) {
            atomic_store(&s->state, RSV_STOPPED);
            if (l->phase == KP_LIVE || l->phase == KP_UNCONFIRMED || l->phase == KP_RESUME)
                l->phase = KP_GIVEBACK;
        }
        if (!k->renewed[shard])
            continue;
        int64_t lo, hi;
        int lease = reserve_lease(k->rv, shard, k->conf->fallback_lease_ms, now, &lo, &hi, NULL)
                    == CS_OK;

        if (l->phase == KP_IN_DOUBT)
            continue; /* keeper_aside_pass() asks again */
        /* A closed epoch only waits to be freed, even when its field is
         * back (a set-aside of another instance of this incarnation): it
         * never opens or goes back again at its own count. */
        if (!l->field || l->phase == KP_CLOSED) {
            keeper_slot_unopened(k, i);
            continue;
        }
        const char *why = keeper_slot_why_back(k, i, stopping, lease, hi);
        if (why != NULL && l->phase != KP_GIVEBACK) {
            log_info("reserve keeper: activity %" PRId64 ": giving back its reserve (%s)", aid,
                     why);
            l->phase = KP_GIVEBACK;
        }
        if (l->phase == KP_GIVEBACK) {
            /* Not on a claim that may have expired by the time the script
             * runs (a pass may give back many): another instance may spend
             * this epoch's tokens, not yet replayed into its field. */
            if (keeper_fenced(k, i) && l->fenced && l->pending == 0 && keeper_claim_lasts(k))
                keeper_give_back(k, i);
            continue;
        }
        if (keeper_slot_confirm(k, i, shard) != CS_OK || keeper_slot_resume(k, i) != CS_OK)
            continue;
        if (atomic_load(&s->state) != RSV_OPEN && !atomic_load(&k->rv->halted) && k->claimed) {
            atomic_store(&s->state, RSV_OPEN);
            log_info("reserve keeper: activity %" PRId64 " epoch %" PRIu64
                     ": %d of %d tokens spendable", aid, atomic_load(&s->epoch),
                     atomic_load(&s->amount) - atomic_load(&s->next), atomic_load(&s->amount));
        }
    }
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
 * node's lease watch (lib/lease_watch.h): an admin's return of a lost
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
    rscript_from_text(&k.s_aside, script_reserve_set_aside);
    rscript_from_text(&k.s_renew, script_reserve_renew);
    rscript_from_text(&k.s_replay, script_reserve_replay);
    rscript_from_text(&k.s_give, script_reserve_give_back);
    rscript_from_text(&k.s_release, script_reserve_release);

    int rc = 0;
    keeper_claim_init(&k);
    if (keeper_journal_rebuild(&k) != CS_OK)
        goto out;
    /* A halt is never cleared by a (re)start: shared memory keeps it for a
     * keeper restarted under running workers, DIR/halted for a new node. */
    keeper_journal_halt(&k, 1);
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
    rscript_free(&k.s_release);
    rconn_free(k.rc);
    mconn_free(k.mc);
    free(k.files);
    free(k.closed);
    free(k.release);
    free(k.acts);
    journal_dir_close(&k.jd);
    log_notice("reserve keeper stopped");
    return rc;
}

