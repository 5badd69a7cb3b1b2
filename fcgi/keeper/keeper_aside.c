/* keeper_aside.c - the reserve keeper setting reserves aside: which sales,
 * how much, recorded in MySQL before the Redis script takes them. */
#include "keeper_int.h"
#include "rargs.h"
#include "activity.h"
#include "cs.h"
#include "keys.h"
#include "log.h"
#include "reserve.h"

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

static const char SQL_RSV_NEXT[] =
    "SELECT COALESCE(MAX(epoch), 0) + 1 FROM reserve_epoch "
    "WHERE activity_id = ? AND incarnation = ?";
static const char SQL_RSV_OPEN[] =
    "INSERT INTO reserve_epoch (activity_id, incarnation, epoch, amount) VALUES (?, ?, ?, ?)";
static const char SQL_RSV_AMOUNT[] =
    "UPDATE reserve_epoch SET amount = ? "
    "WHERE activity_id = ? AND incarnation = ? AND epoch = ? AND state = 1";

static int row_int(void *arg, int ncols, char **cols)
{
    if (ncols >= 1 && cols[0] != NULL)
        *(int64_t *)arg = strtoll(cols[0], NULL, 10);
    return CS_OK;
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

void keeper_aside_read_list(struct keeper *k)
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
    struct rargs a = RARGS_INIT;
    struct rconn_site at;

    rargs_key(&a, keys_stock, shard);
    rargs_key(&a, keys_window, shard);
    rargs_key(&a, keys_reserve, shard);
    rargs_akey(&a, keys_reserve_epochs, aid);
    rargs_int(&a, aid);
    rargs_str(&a, k->jd.incarnation);
    rargs_int(&a, (int64_t)epoch);
    rargs_int(&a, want);
    redisReply *r = rargs_evalsha(k->rc, &k->s_aside, 4, &a, &at);
    rargs_free(&a);
    long long n;
    char why[256];
    if (keeper_reply_int(k, r, &n, why, sizeof(why)) != CS_OK) {
        /* Perhaps done, perhaps not: the same epoch is asked again. */
        log_warn("reserve keeper: setting aside for activity %" PRId64 ": %s", aid, why);
        l->phase = KP_IN_DOUBT;
        return;
    }
    if (n <= 0) { /* SCRIPT_ASIDE_REFUSED, or nothing to take */
        if (keeper_close_epoch(k, aid, epoch, 0, 0) == CS_OK) {
            keeper_add_closed(k, aid, epoch);
            keeper_slot_free(k, i);
        } else {
            l->phase = KP_IN_DOUBT;
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
            l->phase = KP_GIVEBACK;
            return;
        }
    }
    atomic_store(&s->amount, (int32_t)n);
    atomic_fetch_add(&k->rv->set_aside, (uint64_t)n);
    /* Opened only through keeper_slot_resume(): what Redis holds of the
     * epoch may be less than its amount if another instance of this
     * incarnation spent from it while this one waited for the answer. */
    l->phase = keeper_durable(k, shard, &at, 0) == CS_OK ? KP_RESUME : KP_UNCONFIRMED;
    log_info("reserve keeper: activity %" PRId64 " epoch %" PRIu64 ": %lld set aside%s", aid, epoch,
             n, l->phase == KP_UNCONFIRMED ? " (not yet confirmed by replicas)" : "");
}

/* Redis' clock now (TIME on the node of shard 0's keys, plus half the round
 * trip) in *now_ms; CS_ERR when Redis did not answer. */
static int keeper_redis_now(struct keeper *k, int64_t *now_ms)
{
    char key[KEYS_MAX];
    keys_stock(key, 0);
    int64_t sent = cs_mono_ms();
    redisReply *r = rconn_command(k->rc, key, "TIME");
    int64_t rtt = cs_mono_ms() - sent;
    int rc = CS_ERR;
    int64_t t = rconn_time_ms(r);
    if (t >= 0) {
        *now_ms = t + rtt / 2;
        rc = CS_OK;
    }
    if (r != NULL)
        freeReplyObject(r);
    return rc;
}

void keeper_aside_pass(struct keeper *k)
{
    int64_t now_ms = cs_now_ms(), mono = cs_mono_ms();

    /* Not on a claim that may have expired: an epoch of this incarnation
     * set aside now could be another instance's too. */
    if (!keeper_claim_confirmed(k, cs_boot_ms()))
        return;

    /* Answers lost earlier are asked for again. */
    for (int i = 0; i < SHM_RESERVES; i++) {
        int shard = keys_shard(atomic_load(&k->rv->slot[i].activity_id));
        if (k->loc[i].phase == KP_IN_DOUBT && k->renewed[shard])
            keeper_aside_script(k, i);
    }
    if (mono < k->aside_next_ms || k->conf->fallback_reserve <= 0
        || atomic_load(&k->rv->halted))
        return;
    k->aside_next_ms = mono + KEEPER_ASIDE_MS;
    keeper_aside_read_list(k);
    /* Which sales are open is Redis' clock's to say (the script judges by
     * it too): a node whose own clock is off must still set aside for an
     * open sale, and with it renew the lease its workers judge windows by.
     * This host's clock only when Redis does not answer. */
    (void)keeper_redis_now(k, &now_ms);
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
        /* Open by that clock, with room before the end; the script judges by Redis'. */
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

