/* keeper_slots.c - the reserve keeper's decisions on its slots, once a
 * pass has renewed their shards and replayed the journal: what Redis and
 * MySQL say of each epoch, and whether it is given back, confirmed,
 * resumed, opened or freed (the phases in keeper_int.h). */
#include "cs.h"
#include "keeper_int.h"
#include "keys.h"
#include "log.h"
#include "rargs.h"
#include "reserve.h"
#include "scripts.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

    reserve_script_epoch(&a, aid, k->jd.incarnation, (int64_t)epoch);
    rargs_int(&a, 0);
    rargs_int(&a, k->loc[i].low_water);
    redisReply *r = rargs_evalsha(k->rc, &k->s_give, 3, &a, &at);
    rargs_free(&a);
    long long back;
    char why[256];
    if (keeper_reply_int(k, r, &back, why, sizeof(why)) != CS_OK) {
        log_warn("reserve keeper: giving back activity %" PRId64 " epoch %" PRIu64 ": %s", aid,
                 epoch, why);
        return;
    }
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
void keeper_slots(struct keeper *k, int stopping)
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
