/* lease_watch.h - how long this node has seen a lost node's lease stamp stay
 * the same, on this node's own CLOCK_BOOTTIME (internals.md rule 16).
 *
 * A node renews its lease per shard by writing Redis' time into
 * "lease:<incarnation>" of COUPON:RESERVE:{i}, and spends from its reserve
 * until fallback.lease_ms after it sent the renewal, by its own
 * CLOCK_BOOTTIME. An admin's return of that reserve may not come sooner.
 * Redis' TIME at both ends is a wall clock (stepped by NTP, another host's
 * after a failover), so the return also asks this table: the stamp must have
 * stayed the same for the lease, as this node's clock counts it, since this
 * node first read it. Every observation is a real read taken after the
 * renewal it shows was written, so an age from here is never longer than
 * the time since that renewal was sent; only the rates of the two nodes'
 * clocks are trusted, not their readings.
 *
 * The table lives in node shared memory. The reserve keeper reads the
 * stamps of every incarnation with an open epoch each second, so a node
 * lost an hour ago is not watched only from an operator's first question;
 * the admin routes read them too. One robust process-shared lock.
 *
 * A renewal that a master acknowledged and lost in a failover before any
 * replica had it never counted: the keeper makes a lease good only once the
 * durability rule held for its renewal (fcgi/keeper/keeper.c, keeper_renew()).
 */
#ifndef CS_LEASE_WATCH_H
#define CS_LEASE_WATCH_H

#include <pthread.h>
#include <stdint.h>

#define LEASE_WATCH_N 512        /* (incarnation, shard) pairs watched at once */
#define LEASE_WATCH_INC_LEN 32   /* JOURNAL_ID_LEN */

struct lease_watch_entry {
    char inc[LEASE_WATCH_INC_LEN + 1];  /* "" for a free entry */
    int32_t shard;
    int64_t stamp;               /* the lease field as last read; -1 absent */
    int64_t seen_ms;             /* cs_boot_ms() of the first read that showed it */
    int64_t used_ms;             /* the last read: the least recent entry is reused */
    int64_t lease_ms;            /* the longest lease the node published with a stamp */
};

struct lease_watch {
    pthread_mutex_t lock;        /* robust, process-shared */
    struct lease_watch_entry e[LEASE_WATCH_N];
};

/* Initialises a zeroed table in shared memory. CS_OK, else CS_ERR (errno). */
int lease_watch_init(struct lease_watch *lw);

/*
 * Records that a read answered at now_ms (cs_boot_ms(), taken after the
 * answer came) showed stamp and the published lease lease_ms (0: none) for
 * (inc, shard), and returns how long this node has seen that same stamp: 0
 * for a first look, a changed stamp, or a read older than the last one
 * recorded. *longest_ms: the longest lease seen published for it. A full
 * table forgets its least recently read entry, and a lock whose owner died
 * holding it forgets them all (either starts over: later, never sooner).
 */
int64_t lease_watch_seen(struct lease_watch *lw, const char *inc, int shard, int64_t stamp,
                         int64_t lease_ms, int64_t now_ms, int64_t *longest_ms);

#endif
