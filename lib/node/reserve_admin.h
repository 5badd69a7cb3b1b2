/* reserve_admin.h - what an operator sees and does with node reserves
 * (internals.md rules 8 and 16): the open
 * epochs per node incarnation with what Redis says of them, and returning
 * the reserve of a node that was lost, once its lease is over.
 *
 * Both run in a worker of coupon-fcgi for the admin routes
 * GET /market/admin/coupon/reserves and POST .../reserve/return; the node
 * that held the reserve finds its epoch closed when it comes back (its
 * keeper stops spending it and replays what its journal holds, rule 7).
 */
#ifndef CS_RESERVE_ADMIN_H
#define CS_RESERVE_ADMIN_H

#include <stddef.h>
#include <stdint.h>

#include "journal.h"
#include "lease_watch.h"

struct mconn;
struct rconn;

/* At most this many epochs in one listing. */
#define RESERVE_ADMIN_LIST_MAX 200

/* One open epoch, as MySQL and Redis see it. */
struct reserve_view {
    int64_t activity_id;
    char incarnation[JOURNAL_ID_LEN + 1];
    int64_t epoch;
    int64_t amount;            /* set aside (MySQL) */
    int64_t left;              /* the reserve field in Redis; -1 when absent or unknown */
    int64_t lease_age_ms;      /* ms since the incarnation last renewed, by Redis' clock;
                                  -1 when it never did or Redis could not be read */
    int lease_expired;         /* the admin may return it now: no renewal within the lease
                                  by Redis' clock, nor by this node's (the lease watch) */
    int64_t lease_ms;          /* the lease judged by: the longer of the caller's and the
                                  one the node published with its renewal */
    int64_t stamp;             /* the renewal's stamp as read ("lease:<inc>"); -1 absent */
    int64_t watched_ms;        /* how long this node has seen that stamp unchanged, by its
                                  CLOCK_BOOTTIME; -1 without a watch */
    int64_t wait_ms;           /* how much longer before a return may be done; 0 expired */
};

/* Past the lease, how much longer this node must have seen a stamp
 * unchanged: the keeper reads the stamps once a second, and the last
 * renewals of a node may be lost with a failed-over master. */
#define RESERVE_WATCH_MARGIN_MS 2000

struct reserve_list {
    struct reserve_view *v;    /* xmalloc'ed; reserve_admin_list_free() */
    size_t n;
    int truncated;             /* more open epochs than were listed */
    int redis_ok;              /* 0: Redis could not be read (left, lease unknown) */
    int64_t held;              /* with one activity: its "<id>:held" in Redis (-1 unknown) */
};

/*
 * Lists the open epochs (MySQL reserve_epoch, state 1) of activity id, or of
 * every activity when id is 0 (the first RESERVE_ADMIN_LIST_MAX, by
 * activity, incarnation, epoch), with what Redis holds of each: tokens left
 * in its reserve field and the age of its node's last lease renewal. A lease
 * counts as expired when more than lease_ms passed since the renewal (or
 * there was none), as the give-back script judges it, and watch (NULL: none)
 * has seen the same stamp for longer than lease_ms + RESERVE_WATCH_MARGIN_MS
 * on this node's clock. Returns CS_OK (Redis
 * failing leaves out->redis_ok 0), or CS_ERR with err set when MySQL failed.
 * The caller frees *out with reserve_admin_list_free().
 */
int reserve_admin_list(struct mconn *mc, struct rconn *rc, int64_t id, int lease_ms,
                       struct lease_watch *watch, struct reserve_list *out, char *err,
                       size_t errlen);
void reserve_admin_list_free(struct reserve_list *l);

/* Whether s (len bytes) is an incarnation id: JOURNAL_ID_LEN lowercase hex
 * digits, as lib/node/journal.c makes them. */
int reserve_admin_incarnation_ok(const char *s, size_t len);

enum reserve_return_outcome {
    RRET_RETURNED,             /* given back now: `returned` tokens are in stock again */
    RRET_CLOSED,               /* Redis had closed it already (a return whose MySQL step
                                  failed): closed in MySQL now, what went back unknown */
    RRET_NONE_OPEN,            /* MySQL has no open epoch of that incarnation and activity */
    RRET_LEASE_NOT_EXPIRED,    /* the node renewed within the lease: it may still spend */
    RRET_NOT_IN_REDIS,         /* open in MySQL, unknown to Redis (lost, not restored yet) */
};

struct reserve_return {
    enum reserve_return_outcome outcome;
    int epochs;                /* epochs closed by this call */
    int64_t returned;          /* tokens put back into stock by this call */
    int64_t amount;            /* what the epochs closed had set aside */
    int64_t lease_age_ms;      /* -1 unknown */
    int64_t lease_ms;          /* the lease waited for: the node's own when it published one */
    int64_t wait_ms;           /* with RRET_LEASE_NOT_EXPIRED: how much longer to wait */
    int64_t parked;            /* tokens the node may have granted, kept out of stock until it
                                  replays (a return of a journal not declared lost) */
    int64_t lost;              /* journal declared lost: tokens put back that the node may have
                                  granted (their grants are lost with its journal) */
};

struct reserve_admin_opts {
    int lease_ms;              /* fallback.lease_ms */
    int wait_replicas;         /* redis.wait_replicas: the durability rule */
    int wait_timeout_ms;
    int journal_lost;          /* the operator declares the node's journal lost */
    struct lease_watch *watch; /* the node's lease watch (NULL: Redis' clock alone) */
};

/*
 * Returns to stock the open reserve of incarnation inc (JOURNAL_ID_LEN hex
 * digits, checked by the caller) for activity id, epoch by epoch: the
 * give-back script with the lease check (script_reserve_give_back, ARGV[4] =
 * lease_ms), then the durability rule, then the epoch closed in MySQL
 * (state 2, closed_by 'admin', returned). The lease waited for is the
 * longer of lease_ms and the one the node published with its last renewal,
 * by Redis' clock and by o->watch's (the stamp read then is the one the
 * script must still find: a renewal in between refuses the return).
 * What the node may have granted and not replayed (its reserve field) stays
 * out of stock (res->parked) until the node comes back and replays, unless
 * the operator declares its journal lost (o->journal_lost): then it goes
 * back to stock, with what earlier returns kept out (res->lost), and the
 * grants the node did not replay are lost with its journal. Safe to repeat:
 * a return whose MySQL step failed is closed in MySQL by the next call
 * (RRET_CLOSED).
 * CS_OK with *res; CS_ERR with err set when MySQL or Redis failed or the
 * give-back was not confirmed by the copies the rule asks for (then a
 * repeat finishes it).
 */
int reserve_admin_return(struct mconn *mc, struct rconn *rc, const struct reserve_admin_opts *o,
                         int64_t id, const char *inc, struct reserve_return *res, char *err,
                         size_t errlen);

#endif
