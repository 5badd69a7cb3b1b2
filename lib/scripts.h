/* scripts.h - the Lua scripts of lua/, as C strings made by make from the
 * files (lib/scripts.c, see Makefile.am: lines that begin with "--" are left
 * out), and what each answers. Each file's header says its KEYS, ARGV and
 * answers; lua/seize.lua is also installed and read at start-up
 * (fcgi.script), so an operator can read what runs. */
#ifndef CS_SCRIPTS_H
#define CS_SCRIPTS_H

extern const char script_seize[];
extern const char script_seize_batch[];
extern const char script_activity_list_cas[];
extern const char script_preheat_publish[];
extern const char script_coupon_return[];
extern const char script_reconcile[];
extern const char script_restore[];
extern const char script_lock_renew[];
extern const char script_lock_release[];
extern const char script_keeper_claim[];
extern const char script_reserve_set_aside[];
extern const char script_reserve_renew[];
extern const char script_reserve_replay[];
extern const char script_reserve_give_back[];
extern const char script_reserve_release[];

/* What the scripts answer. Each enum is read in one place: the seize's in
 * fcgi/node/seize_rules.c, the reserves' in the keeper and lib/reserve_admin.c. */

/* lua/seize.lua, and each entry of lua/seize_batch.lua: the stock left after
 * the grant (>= 0), or one of these. */
enum script_seize {
    SCRIPT_SEIZE_ALREADY = -1,     /* the user is in the seize list already */
    SCRIPT_SEIZE_SOLD_OUT = -2,    /* no stock left (or the revoke tombstone) */
    SCRIPT_SEIZE_UNKNOWN = -3,     /* no stock or window field: not preheated */
    SCRIPT_SEIZE_NOT_STARTED = -4, /* before the start, by Redis' clock */
    SCRIPT_SEIZE_ENDED = -5,       /* at or after the end, by Redis' clock */
    SCRIPT_SEIZE_FOR_NOW = -6      /* no stock, but node reserves hold some */
};

/* lua/reserve_set_aside.lua: the amount set aside (> 0), or this. */
enum script_aside { SCRIPT_ASIDE_REFUSED = -1 };

/* lua/reserve_give_back.lua: what went back to stock (>= 0), or one of these. */
enum script_give_back {
    SCRIPT_GIVE_NOT_OPEN = -1,     /* the epoch is not open: given back already */
    SCRIPT_GIVE_TOO_SOON = -2,     /* the node renewed within the lease */
    SCRIPT_GIVE_NO_STOCK = -3      /* no stock field: nothing written, ask later */
};

/* lua/reserve_release.lua: how many went back (>= 0), or this. */
enum script_release { SCRIPT_RELEASE_NO_STOCK = -3 };

/* lua/reserve_replay.lua, for one token. */
enum script_replay {
    SCRIPT_REPLAY_BEFORE = 0,       /* replayed before: nothing changed */
    SCRIPT_REPLAY_GRANTED = 1,      /* from its open epoch into the seize list */
    SCRIPT_REPLAY_DUPLICATE = 2,    /* the user holds one: the token back to stock */
    SCRIPT_REPLAY_FROM_STOCK = 3,   /* an unknown or closed epoch: from stock */
    SCRIPT_REPLAY_PARKED = 4,       /* from what an admin's return kept out */
    SCRIPT_REPLAY_TWICE_STOCK = 5,  /* as -4, and this user's grant took from stock */
    SCRIPT_REPLAY_DEAD = -1,        /* no reserve, no stock: the dead letters */
    SCRIPT_REPLAY_NO_STOCK = -3,    /* no stock field: nothing written, it waits */
    SCRIPT_REPLAY_SPENT_TWICE = -4, /* another user's token: the dead letters */
    SCRIPT_REPLAY_SPENT_TWICE_KNOWN = -6 /* -4 before: in the dead letters already */
};

/* lua/reconcile.lua: {before, after, sold}, or {one of these, 0, 0}. */
enum script_reconcile { SCRIPT_RECONCILE_NO_STOCK = -3, SCRIPT_RECONCILE_VOIDED = -4 };

/* lua/coupon_return.lua. */
enum script_return {
    SCRIPT_RETURN_NONE = 0,        /* the entry is gone or newer: nothing done */
    SCRIPT_RETURN_DONE = 1,        /* the user out of the seize list, stock + 1 */
    SCRIPT_RETURN_NO_STOCK = -3,
    SCRIPT_RETURN_VOIDED = -4
};

/* lua/activity_list_cas.lua: the list's new generation, or this. */
enum script_list_cas { SCRIPT_LIST_RACED = -1 };

/* lua/keeper_claim.lua answers 1 when the claim was this instance's and
 * still is, 2 when it is this instance's anew, else the holder;
 * lua/lock_renew.lua and lua/lock_release.lua 1 or 0. */

/* Every script by its file's name without ".lua", for the tests that load
 * each one alone. */
struct script_text {
    const char *name;
    const char *text;
};
extern const struct script_text script_all[];
extern const int script_count;

#endif
