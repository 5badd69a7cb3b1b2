/* keeper_int.h - what the reserve keeper's files share: its state, and each
 * file's functions the others call. Not a contract for anything outside the
 * keeper. Calls run one way, so a test links the files it needs from the
 * bottom up:
 *
 *   keeper_base.c     the stop flag, durability, closed epochs, fences, MySQL
 *   keeper_claim.c    the incarnation's claim                     (base)
 *   keeper_journal.c  replay and segments                         (base, claim)
 *   keeper_aside.c    the activity list and setting aside         (base, claim)
 *   keeper_renew.c    the lease of a shard                        (base)
 *   keeper_slots.c    the decisions on each slot                  (base, claim)
 *   keeper_rebuild.c  the state rebuilt at start-up, the halt     (base, journal)
 *   keeper.c          renewal, the pass, the process              (all of them)
 */
#ifndef CS_KEEPER_INT_H
#define CS_KEEPER_INT_H

#include "conf.h"
#include "journal.h"
#include "mconn.h"
#include "rconn.h"
#include "shm.h"

#include <signal.h>
#include <stdint.h>

#define KEEPER_TICK_MS 100
#define KEEPER_WATCH_MAX 256    /* below LEASE_WATCH_N: admin reads find room */
#define KEEPER_ASIDE_MS 1000       /* how often open sales are looked at for a set-aside */
#define KEEPER_LIST_MS 2000        /* how often the activity list's generation is read */
#define KEEPER_ASIDE_BATCH 64      /* sales read from Redis per set-aside pass (two reads each) */
#define KEEPER_ASIDE_VISIT 1024    /* sales of the list gone through per pass */
#define KEEPER_STOP_MS 10000       /* a graceful stop gives up on Redis after this */
#define KEEPER_CLAIM_SLACK_MS 5000 /* a claim outlives the lease by this much */

/*
 * Where a slot is in its life, beyond its state in shared memory (internals.md
 * rules 3, 8, 10 and 16, "The keeper's slot phases"); one phase at a time:
 *
 *   a set-aside     -> RESUME, or UNCONFIRMED (then RESUME once confirmed),
 *                      or IN_DOUBT (asked again) when its answer was lost;
 *   RESUME          -> LIVE once everything on disk is replayed and Redis'
 *                      field read (keeper_slot_resume(): every slot opens
 *                      through it, so no token another instance of this
 *                      incarnation spent is handed out again);
 *   a restart, a restore, the claim lost: LIVE and CLOSED -> RESUME (a
 *                      restore may bring a closed epoch's field back);
 *   its field gone  -> AWAITS_RESTORE (open in MySQL; RESUME when the field
 *                      is back) or CLOSED (freed once replayed);
 *   a reason to give back -> GIVEBACK (freed once given back).
 */
enum kphase {
    KP_LIVE = 0,           /* opened whenever the claim holds and nothing is halted */
    KP_IN_DOUBT,           /* the set-aside script's answer was lost: ask again */
    KP_UNCONFIRMED,        /* set aside, the durability rule not met yet */
    KP_RESUME,             /* stopped until replayed (a restart, a restore, the claim lost) */
    KP_AWAITS_RESTORE,     /* open in MySQL, gone from Redis: Redis lost it */
    KP_CLOSED,             /* closed elsewhere (an admin, or no row): freed once replayed */
    KP_GIVEBACK,           /* stopped to be given back */
};

/* What the keeper knows of a slot beyond shared memory: its phase, and the
 * facts of the last renewal and of this pass beside it. */
struct kslot {
    enum kphase phase;
    int fenced;                /* stopped, no grant of its epoch in flight, before this
                                  pass read the journal: the replay saw every record it
                                  will ever have (rule 8) */
    int64_t pending;           /* its records not yet replayed */
    int64_t stock, held;       /* from the last renewal */
    int field;                 /* the last renewal found this node's reserve field */
    int low_water;             /* given back at the low-water mark: no more for this sale */
};

struct kfile {
    char name[64];
    int index;
    uint64_t seg;
    uint64_t done;             /* records replayed and durable */
    int seen;
};

struct kact {
    int64_t id, start_ms, end_ms;
    int open_to_all;           /* no eligibleGroups */
};

/* Epochs of this node an admin closed: what the return kept out of stock
 * goes back once no record of the epoch is left unreplayed. */
struct krelease {
    int64_t aid;
    uint64_t epoch;
    int marked;                /* MySQL says released already */
};

/* Epochs closed by this node (given back after a full replay): their
 * records were replayed before, and are never replayed again. */
struct kclosed {
    int64_t aid;
    uint64_t epoch;
};

struct keeper {
    const struct cs_conf *conf;
    struct shm_node *shm;
    struct shm_reserves *rv;
    struct journal_dir jd;
    struct rconn *rc;
    struct mconn *mc;
    struct rscript s_aside, s_renew, s_replay, s_give, s_release;
    struct kslot loc[SHM_RESERVES];
    struct kfile *files;
    size_t nfiles, files_cap;
    struct kclosed *closed;
    size_t nclosed, closed_cap;
    struct krelease *release;
    size_t nrelease, release_cap;
    int renewed[KEYS_SHARDS];
    int64_t restored[KEYS_SHARDS];  /* restore generation seen; -1 none yet */
    struct kact *acts;
    size_t nacts;
    long long list_gen;
    size_t aside_next;         /* where the next set-aside pass goes on in acts */
    int64_t list_next_ms, aside_next_ms;
    int margin_ms;
    int halt_kept;             /* DIR/halted is written for the halt in shared memory */
    int stale_busy;            /* a worker was inside a grant after the rebuild's wait */
    uint64_t replay_passes;    /* keeper_journal_replay() calls so far */
    char claim[192];           /* "host boot-id pid": this instance, in its incarnation's claim */
    int claimed;               /* the last claim Redis answered was granted */
    int64_t claim_sent;        /* cs_boot_ms() when the last claim confirmed was sent; 0 none */
    int64_t claim_warn_ms;
    int64_t renew_warn_ms;     /* cs_mono_ms() of the last "renewal not durable" warning */
    struct rconn_site wait_short[KEYS_SHARDS + 1]; /* sites whose WAIT fell short this pass */
    int nwait_short;
    int64_t halt_warn_ms;      /* when writing DIR/halted last failed (logged) */
    int64_t watch_next_ms;     /* cs_boot_ms() of the next read of the lease stamps */
    int64_t watch_list_ms;     /* ... of the next read of whose stamps to read */
    struct {
        int shard;
        char inc[JOURNAL_ID_LEN + 1];
    } watch[KEEPER_WATCH_MAX]; /* (shard, incarnation) pairs with an open epoch */
    int nwatch;
};

/* Set by SIGTERM: give everything back and stop. */
extern volatile sig_atomic_t keeper_stop;
/* Set by SIGUSR2 (an in-place upgrade): stop at once without giving
 * anything back; the new supervisor's keeper adopts the journal. */
extern volatile sig_atomic_t keeper_handover;

/* ---- keeper_base.c ---- */
/* The durability rule for a write that ran at site (fence: it wrote nothing). */
int keeper_durable(struct keeper *k, int shard, const struct rconn_site *site, int fence);
/* Epochs this node closed itself (given back after a full replay). */
int keeper_is_closed(const struct keeper *k, int64_t aid, uint64_t epoch);
/* Whether a worker is inside a grant of activity aid's epoch. */
int keeper_epoch_busy(const struct keeper *k, int64_t aid, uint64_t epoch);
/* 1 when no worker is inside a grant. Both take down the markers of workers
 * that are gone. */
int keeper_markers_down(const struct keeper *k);
void keeper_add_closed(struct keeper *k, int64_t aid, uint64_t epoch);
/* An epoch an admin closed: its parked tokens are released after the replay. */
void keeper_add_release(struct keeper *k, int64_t aid, uint64_t epoch);
/* Slot i: no new grants, and whether every grant in flight is done. */
int keeper_fenced(struct keeper *k, int i);
void keeper_slot_free(struct keeper *k, int i);
/* Slot i stops until everything on disk is replayed (a restore, the claim
 * lost): a live slot resumes after the replay; the others keep their phase. */
void keeper_slot_hold(struct keeper *k, int i);
/* The epoch's row: 1 open, 2 closed (by in *by), 0 no row, -1 MySQL failed. */
int keeper_epoch_state(struct keeper *k, int64_t aid, uint64_t epoch, char *by, size_t bylen);
/* Closes the epoch in MySQL as the node's (amount < 0: leaves the amount). */
int keeper_close_epoch(struct keeper *k, int64_t aid, uint64_t epoch, int64_t returned,
                       int64_t amount);

/* ---- keeper_journal.c ---- */
/* Lists the segments in the directory into k->files (those gone are dropped). */
void keeper_list_files(struct keeper *k);
/* Raises each slot's next token to what DIR/tokens says was handed out. */
void keeper_tokens_read(struct keeper *k);
/* Replays the records not yet replayed on the shards Redis answers on, and
 * counts what is left per slot (k->loc[].pending, the depth metrics). */
void keeper_journal_replay(struct keeper *k);
/* Deletes wholly replayed segments; moves workers to a new one when all is replayed. */
void keeper_journal_retire(struct keeper *k);

/* ---- keeper_rebuild.c ---- */
/* At start-up: open epochs from MySQL, tokens spent from the journal, torn tails cut. */
int keeper_journal_rebuild(struct keeper *k);
/* Empties the grants table once nothing is open and everything replayed. */
void keeper_journal_reset_grants(struct keeper *k);
/* A halt (a failed journal write) outlives keeper and node restarts: kept
 * as DIR/halted until an operator removes that file (rule 19). At start-up
 * (start = 1) a file there halts the node; on each pass a halt in shared
 * memory is written to the file, and a file removed clears the halt. */
void keeper_journal_halt(struct keeper *k, int start);

/* The integer a script answered in r (which it frees): CS_OK with *v, or
 * CS_ERR with why not in why (Redis' error reply, or the connection's). */
int keeper_reply_int(const struct keeper *k, redisReply *r, long long *v, char *why,
                     size_t whylen);

/* ---- keeper_claim.c ---- */
/* This keeper's "host boot-id pid", for its claim. */
void keeper_claim_init(struct keeper *k);
/* Claims the incarnation in Redis for the lease and then some. CS_OK when
 * this instance holds it, or Redis did not answer and it was not refused;
 * CS_ERR (every slot stopped) while another live instance holds it, as far
 * as the last answer says: nothing of this pass may be done. */
int keeper_claim(struct keeper *k);
/* Whether the last claim the durability rule confirmed may still hold at
 * now (cs_boot_ms()); otherwise no slot opens, and nothing is given back,
 * released or set aside: another instance may hold the incarnation. */
int keeper_claim_confirmed(const struct keeper *k, int64_t now);
/* The same for a Redis call started now: its claim holds until the command
 * timeout has passed too (give-back, release). */
int keeper_claim_lasts(const struct keeper *k);

/* ---- keeper_renew.c ---- */
/* Renews the lease of shard (lua/reserve_renew.lua) and reads what Redis
 * says of its slots' sales (k->loc[]: field, stock, held; the window into
 * shared memory). A slot whose reserve field is gone stops; a restore
 * generation that moved holds every slot of the shard. The lease is made
 * good only once the durability rule holds for the renewal and a claim was
 * confirmed. CS_OK when Redis answered. */
int keeper_renew(struct keeper *k, int shard);

/* ---- keeper_slots.c ---- */
/* Decides what each slot of a renewed shard does next (k->renewed[]), after
 * the pass fenced its slots (k->loc[].fenced) and replayed the journal
 * (k->loc[].pending): freed when closed elsewhere and replayed, given back
 * (stopping: every slot), confirmed, resumed from Redis' field, opened. */
void keeper_slots(struct keeper *k, int stopping);

/* ---- keeper_aside.c ---- */
/* Reads the activity list when its generation moved (throttled). */
void keeper_aside_read_list(struct keeper *k);
/* Asks again for set-asides whose answer was lost, and now and then sets
 * reserves aside for open sales with plenty of stock. */
void keeper_aside_pass(struct keeper *k);

#endif
