/* keeper_renew.c - the reserve keeper's renewal of a shard's lease
 * (lua/reserve_renew.lua): what Redis says of each slot's sale and of this
 * node's reserve field, and the lease the workers spend by. */
#include "cs.h"
#include "keeper_int.h"
#include "keys.h"
#include "log.h"
#include "rargs.h"
#include "reserve.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

/* Publishes the lease of shard for the workers, under its sequence count. */
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

/* Reads "<startMs>,<endMs>" from w into *start and *end; leaves them as they
 * are when w is not one. */
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
int keeper_renew(struct keeper *k, int shard)
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
