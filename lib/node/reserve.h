/* reserve.h - node reserves: what a worker may grant while Redis cannot be
 * reached (doc/internals.md, "The reserves").
 *
 * The reserve keeper (fcgi/keeper/keeper.c) sets aside epochs of numbered tokens
 * in Redis, renews the node's lease on each shard, replays the journal and
 * gives reserves back; it publishes what may be spent in node shared memory
 * (struct shm_reserves). A worker whose seize never reached Redis spends one
 * token here: it checks the lease, takes the next token, appends the grant
 * to its journal segment and fsyncs it before the answer.
 */
#ifndef CS_RESERVE_H
#define CS_RESERVE_H

#include <stdint.h>

#include "journal.h"
#include "rargs.h"
#include "scripts.h"
#include "shm.h"

enum reserve_outcome {
    RESERVE_NONE = 0,          /* nothing granted, nothing written: answer as without reserves */
    RESERVE_SEIZED,            /* the grant is on disk: SEIZED */
    RESERVE_ALREADY,           /* this node granted the user a coupon of it already */
    RESERVE_UNKNOWN,           /* the journal write failed midway: UNKNOWN_OUTCOME */
    RESERVE_NO_KEEPER,         /* nothing granted, and no keeper runs: the grants table
                                * may miss a grant the journal holds (a keeper
                                * restarting or upgrading rebuilds it) */
};

/* A worker's journal segment, opened at its first grant. */
struct reserve_journal {
    struct journal j;
    uint64_t seg;              /* 0: none open */
};

/* Fault injection for the tests: COUPONSEIZE_FAULT=crash-after-journal in
 * a worker's environment makes it die (SIGKILL) right after a grant's
 * journal record is on disk, before the answer. Read once at start-up. */
extern int reserve_crash_after_append;
void reserve_init_faults(void);

/* Adds to a what the give-back and release scripts (lua/reserve_give_back.lua,
 * lua/reserve_release.lua) take first: KEYS stock, reserve and epochs of
 * activity aid, then ARGV aid, incarnation inc, epoch. */
void reserve_script_epoch(struct rargs *a, int64_t aid, const char *inc, int64_t epoch);

/* The slot holding activity id's reserve (any state), or -1. */
int reserve_slot_of(const struct shm_reserves *rv, int64_t id);

/*
 * Redis' clock on shard now, estimated from the last renewal: *lo and *hi
 * bound it (the renewal ran somewhere between its send and its answer).
 * CS_ERR when the shard has no renewal, or the last one was sent lease_ms
 * or longer ago: the lease is over. *sent (when not NULL) is the send time
 * of the renewal judged, so that a caller can hold on to the lease it
 * checked: it ends at *sent + lease_ms whatever renewals come later.
 */
int reserve_lease(const struct shm_reserves *rv, int shard, int lease_ms, int64_t now_mono,
                  int64_t *lo, int64_t *hi, int64_t *sent);

/*
 * Grants user uid a coupon of activity id from this node's reserve, when
 * one is open, the lease holds and Redis' estimated time lies inside the
 * window less margin_ms. wslot is the worker's registry slot (the busy
 * marker and the journal file are its own). jdir is the journal directory.
 * A user this node granted already (the grants table, rebuilt from the
 * journal at start-up) gets RESERVE_ALREADY, or RESERVE_UNKNOWN while that
 * grant's answer is not known (being written, or its worker died), whether
 * or not anything is spendable now. meta_known is 0 when the caller could
 * not read the activity's metadata (so could not judge its eligibleGroups):
 * then only a sale open to all users is granted from.
 */
enum reserve_outcome reserve_grant(struct shm_node *shm, int wslot, const char *jdir,
                                   struct reserve_journal *rj, int lease_ms, int margin_ms,
                                   int64_t id, int64_t uid, int meta_known);

/* Whether this node granted uid a coupon of id from a reserve; *replayed
 * says whether the grant reached Redis already. */
int reserve_granted(const struct shm_reserves *rv, int64_t id, int64_t uid, int *replayed);

/* The grants table: add (CS_OK), or CS_ERR when already there (*entry set)
 * or full (*entry -1). */
int reserve_grant_add(struct shm_reserves *rv, int64_t id, int64_t uid, int *entry);
int reserve_grant_find(const struct shm_reserves *rv, int64_t id, int64_t uid);

/* What the node can sell now on shard: "redis" (breaker closed), "reserve"
 * (a reserve is open and the lease holds) or "none". */
const char *reserve_seize_source(const struct shm_node *shm, int redis_ok, int lease_ms);

/* How long (ms) this node could still grant from an open reserve with
 * tokens left, were Redis gone now: the most any such reserve's lease has
 * left, 0 when none would (no open reserve, no lease, halted). */
int64_t reserve_lease_left(const struct shm_node *shm, int lease_ms);

/* Tokens open for spending on this node (sum over open slots). */
int64_t reserve_held(const struct shm_reserves *rv);

#endif
