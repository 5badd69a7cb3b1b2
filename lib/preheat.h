/* preheat.h - activities from MySQL into Redis: preheat (the ACTIVITY:LIST,
 * META, WINDOW and stock fields of every activity on sale or soon). The list
 * itself is actlist.h's, the Redis side of a revoke revoke.h's. Used by
 * coupon-fcgi's admin routes and coupon-sync's jobs. */
#ifndef CS_PREHEAT_H
#define CS_PREHEAT_H

#include <stddef.h>
#include <stdint.h>

struct mconn;
struct rconn;

struct preheat_result {
    int loaded;                /* activities written to ACTIVITY:LIST */
    int created;               /* stock fields newly set */
    int restored;              /* of those, rebuilt from MySQL after Redis data loss */
    int written;               /* activities whose fields were (re)written in Redis */
    int stale;                 /* refused: Redis holds a newer version of them */
    int adjusted;              /* stock fields moved by a change of total_num */
    int clamped;               /* of those, held at 0: the total fell below the grants */
    int changed;               /* activities read by a pass since a mark */
    int listed;                /* a pass since a mark rewrote ACTIVITY:LIST */
    int64_t select_ms;         /* time spent reading MySQL */
    int64_t write_ms;          /* time spent reading and writing Redis */
};

/* Seconds an activity stays served after its window ended (sync.cleanup_grace_s
 * default), so a late seize answers ENDED. */
#define ACTIVITY_GRACE_S 86400

/* Preheat: re-applies the Redis side of every revoke (status 4 in MySQL);
 * selects from MySQL in one query the activities not voided, not ended (or
 * ended less than grace_s ago, so late seizes answer ENDED), starting within
 * horizon_days; per shard, pipelined, writes each one's COUPON:ACTIVITY:META
 * field (activity_to_text) and COUPON:ACTIVITY:WINDOW field when they
 * changed, and then, only if absent, its stock field (a live sale is never
 * reset); ACTIVITY:LIST last. When a stock field is absent but MySQL or the
 * queue hold coupons of the activity (Redis lost its data), stock = total_num
 * - coupons in MySQL - entries still queued, and the seize list is rebuilt
 * from MySQL and the queue before the stock field appears. Safe to run from
 * several processes at once. CS_ERR with a message in err on failure. */
int activity_preheat(struct mconn *mc, struct rconn *rc, int horizon_days, int grace_s,
                     struct preheat_result *res, char *err, size_t errlen);

/* The same for activity ID alone (after it was created or changed): its
 * META, WINDOW and stock fields, then ACTIVITY:LIST rewritten from a fresh
 * MySQL read, so the change is listed at once. res->loaded is 0 when ID is
 * not one preheat serves (unknown, voided, ended past the grace, beyond the
 * horizon); it then leaves the list.
 *
 * Every write of ACTIVITY:LIST (here, preheat, revoke) reads its generation
 * (KEY_ACTIVITY_LIST_GEN) before MySQL and writes only if it is unchanged,
 * bumping it; a writer that lost reads MySQL again. So the list never goes
 * back to a MySQL read older than one already published. */
int activity_preheat_one(struct mconn *mc, struct rconn *rc, int64_t id, int horizon_days,
                         int grace_s, struct preheat_result *res, char *err, size_t errlen);

/* Where the periodic preheat left off: MySQL's clock (seconds) when its last
 * pass began (0 before the first), and what ACTIVITY:LIST was last written
 * with (id and a hash of its element, sorted by id), so a pass rewrites the
 * list only when an element of it changed. Zero it to start; free with
 * preheat_mark_free(). */
struct preheat_listed {
    int64_t id;
    uint64_t hash;
};
struct preheat_mark {
    int64_t since_s;
    struct preheat_listed *listed;
    size_t nlisted;
    int have_list;             /* listed holds what the list was written with */
};

void preheat_mark_free(struct preheat_mark *mark);

/* Seconds a pass since a mark reaches back before it: a transaction stamps
 * updated_at when its statement runs and becomes visible when it commits,
 * and an UPDATE that commits this much later than it ran may be missed until
 * the next full pass. */
#define PREHEAT_OVERLAP_S 30

/*
 * activity_preheat(), reading only what changed when mark says where the
 * last pass left off: rows whose updated_at is at most PREHEAT_OVERLAP_S
 * older than mark->since_s, rows whose start entered the horizon since
 * then, and revokes made since then. ACTIVITY:LIST is then rewritten (from
 * a full read) only when an element of it changed, a revoke was read, or
 * relist is set.
 * With mark NULL, or mark->since_s 0, it is a full pass. On CS_OK
 * mark->since_s (when mark is not NULL) becomes MySQL's clock at the start
 * of the pass; on CS_ERR it is left as it was, so nothing is skipped.
 * Every write of an activity's fields compares the version (updated_at, in
 * microseconds, kept in COUPON:ACTIVITY:VER) and keeps the newer, so a pass
 * that read MySQL before a change committed cannot undo the change.
 */
int activity_preheat_pass(struct mconn *mc, struct rconn *rc, int horizon_days, int grace_s,
                          struct preheat_mark *mark, int relist, struct preheat_result *res,
                          char *err, size_t errlen);

/* MySQL's clock (UNIX_TIMESTAMP()) into *now_s: the marks of the passes that
 * read rows changed since then are taken by it, not by this host's clock.
 * CS_ERR with a message in err. */
int preheat_mysql_now(struct mconn *mc, int64_t *now_s, char *err, size_t errlen);

#endif
