/* keeper_claim.c - one live instance per node incarnation (internals.md
 * rule 15): the reserve keeper claims its incarnation in Redis on every pass. */
#include "keeper_int.h"
#include "cs.h"
#include "keys.h"
#include "rargs.h"
#include "log.h"
#include "scripts.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>


/* "host boot-id pid" of this keeper. */
void keeper_claim_init(struct keeper *k)
{
    char host[128] = "?", boot[64] = "?";
    if (gethostname(host, sizeof(host)) != 0)
        snprintf(host, sizeof(host), "?");
    host[sizeof(host) - 1] = '\0';
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f != NULL) {
        if (fscanf(f, "%63s", boot) != 1)
            snprintf(boot, sizeof(boot), "?");
        fclose(f);
    }
    snprintf(k->claim, sizeof(k->claim), "%s %s %d", host, boot, (int)getpid());
}

/* Whether holder names a process of this machine's current boot that is
 * gone: a keeper of this incarnation that died here (a restart). */
static int keeper_claim_stale(const struct keeper *k, const char *holder)
{
    char host[128], boot[64], mhost[128], mboot[64];
    int pid, mpid;
    if (sscanf(holder, "%127s %63s %d", host, boot, &pid) != 3
        || sscanf(k->claim, "%127s %63s %d", mhost, mboot, &mpid) != 3)
        return 0;
    return strcmp(host, mhost) == 0 && strcmp(boot, mboot) == 0 && pid != mpid && pid > 0
           && kill(pid, 0) != 0 && errno == ESRCH;
}

/* Whether this instance's last confirmed claim may still hold at now
 * (cs_boot_ms()): sent less than its time to live ago. Until then no slot
 * opens (keeper_slot_resume): another instance may hold the incarnation
 * and spend the same token numbers, unseen by claims that a failover may
 * lose, or whose answers are lost. */
int keeper_claim_confirmed(const struct keeper *k, int64_t now)
{
    return k->claim_sent > 0
           && now - k->claim_sent < k->conf->fallback_lease_ms + KEEPER_CLAIM_SLACK_MS;
}

int keeper_claim_lasts(const struct keeper *k)
{
    return keeper_claim_confirmed(k, cs_boot_ms() + k->conf->redis_command_timeout_ms);
}

/* Whether a slot spends at its own count: what a claim taken anew stops. */
static int keeper_any_live(const struct keeper *k)
{
    for (int i = 0; i < SHM_RESERVES; i++)
        if (atomic_load(&k->rv->slot[i].state) != RSV_EMPTY && k->loc[i].phase == KP_LIVE)
            return 1;
    return 0;
}

/* Stops every slot until it is replayed and resumed from Redis' field
 * (keeper_slot_hold); returns how many were open (LIVE or CLOSED) before. */
static int keeper_hold_all(struct keeper *k)
{
    int open = 0;
    for (int i = 0; i < SHM_RESERVES; i++)
        if (atomic_load(&k->rv->slot[i].state) != RSV_EMPTY) {
            open += k->loc[i].phase == KP_LIVE || k->loc[i].phase == KP_CLOSED;
            keeper_slot_hold(k, i);
        }
    return open;
}

/*
 * Claims this incarnation in Redis for as long as the lease, and then some
 * (internals.md rule 15): the journal directory's flock keeps a second instance
 * off this host's directory only, not off a copied image or a restored
 * backup. CS_OK when this instance holds it, or Redis did not answer and it
 * was not refused (k->claimed and k->claim_sent keep what they were: in a
 * cluster the claim lives on another master than a shard the renewal
 * reaches, and a lease never outlasts the last claim confirmed, see
 * keeper_renew()); CS_ERR when another live instance holds it, as far as
 * the last answer says: nothing of this pass may be done.
 */
int keeper_claim(struct keeper *k)
{
    char key[KEYS_MAX];
    const char *stale = "";
    char held[192] = "";
    keys_reserve_claim(key, k->jd.incarnation);
    int ttl_ms = k->conf->fallback_lease_ms + KEEPER_CLAIM_SLACK_MS;
    for (int tries = 0; tries < 2; tries++) {
        struct rargs a = RARGS_INIT;
        rargs_str(&a, "EVAL");
        rargs_str(&a, script_keeper_claim);
        rargs_str(&a, "1");
        rargs_str(&a, key);
        rargs_str(&a, k->claim);
        rargs_int(&a, ttl_ms);
        rargs_str(&a, stale);
        struct rconn_site at;
        int64_t sent = cs_boot_ms();
        redisReply *r = rargs_command(k->rc, key, &a, &at);
        int64_t recv = cs_boot_ms();
        rargs_free(&a);
        if (r == NULL || (r->type != REDIS_REPLY_INTEGER && r->type != REDIS_REPLY_STRING)) {
            if (r != NULL)
                freeReplyObject(r);
            /* No answer changes nothing: an instance refused stays refused
             * (it must not renew, replay or give back an epoch the holder
             * spends); any other goes on (a lease never outlasts its last
             * confirmed claim, and one never confirmed makes no lease), so
             * a node started while Redis is away still counts its journal. */
            return atomic_load(&k->rv->claim_refused) ? CS_ERR : CS_OK;
        }
        if (r->type == REDIS_REPLY_INTEGER) {
            /* Not held all along: taken anew (it expired while this keeper
             * was frozen or cut off, or a dead holder was replaced), or the
             * last claim confirmed may have expired since (an answer "2"
             * lost on the way makes the next one read 1, and a failover may
             * lose the claims not confirmed; the key lives the TTL from when
             * Redis ran that claim, after it was sent). Another instance of
             * the incarnation may have spent tokens of its epochs, with the
             * same numbers: every slot resumes from Redis' field, after the
             * replay, before it spends again (internals.md rules 14, 15). A
             * lapse that lasts holds the slots once: none resumes before a
             * claim is confirmed again, nor before the first one is
             * (keeper_slot_resume()). */
            int taken_anew = r->integer == 2;
            int lapsed = k->claim_sent > 0 && !keeper_claim_confirmed(k, recv);
            freeReplyObject(r);
            if (!k->claimed && atomic_load(&k->rv->claim_refused))
                log_notice("reserve keeper: incarnation %s is this instance's again (%s)",
                           k->jd.incarnation, k->claim);
            int resumed = taken_anew || (lapsed && keeper_any_live(k)) ? keeper_hold_all(k) : 0;
            if (resumed > 0)
                log_warn("reserve keeper: incarnation %s was not this instance's all along "
                         "(%s): %d reserves resume from Redis once replayed",
                         k->jd.incarnation, stale[0] != '\0' ? stale : "the claim expired",
                         resumed);
            k->claimed = 1;
            /* A claim only the master holds may be lost in a failover, and
             * another instance take the incarnation: the lease runs from
             * the last claim the durability rule confirmed. */
            if (keeper_durable(k, 0, &at, 0) == CS_OK)
                k->claim_sent = sent;
            atomic_store(&k->rv->claim_refused, 0);
            return CS_OK;
        }
        snprintf(held, sizeof(held), "%s", r->str);
        freeReplyObject(r);
        if (!keeper_claim_stale(k, held))
            break;
        stale = held;
    }
    k->claimed = 0;
    k->claim_sent = 0; /* what was confirmed before is not ours any more */
    atomic_store(&k->rv->claim_refused, 1);
    /* Nothing spends while another instance holds the incarnation: its
     * token numbers are the same as ours. */
    keeper_hold_all(k);
    int64_t now = cs_mono_ms();
    if (k->claim_warn_ms == 0 || now - k->claim_warn_ms >= 60000) {
        k->claim_warn_ms = now;
        log_error("reserve keeper: incarnation %s is held by another live instance (%s; this is "
                  "%s): a copied image or a restored journal directory? No grants from reserves "
                  "while it holds it", k->jd.incarnation, held, k->claim);
    }
    return CS_ERR;
}
