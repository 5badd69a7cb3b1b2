/* activity.h - activities: the ACTIVITY:LIST JSON form, status by the clock,
 * and the operations that move them between MySQL and Redis (preheat with
 * restore, revoke, the status job). One implementation, used by coupon-fcgi's
 * admin routes and coupon-sync's jobs. */
#ifndef CS_ACTIVITY_H
#define CS_ACTIVITY_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

struct mconn;
struct rconn;

enum activity_status {
    ACT_NOT_STARTED = 1,
    ACT_IN_PROGRESS = 2,
    ACT_ENDED = 3,
    ACT_VOIDED = 4,
};

struct activity {
    int64_t id;
    char name[513];            /* VARCHAR(128) of utf8mb4: up to 512 bytes */
    char coupon_name[513];
    char coupon_amount[24];    /* decimal text as MySQL gives it, e.g. "10.00" */
    char coupon_threshold[24];
    int64_t total_num;
    int64_t start_ms;          /* distribute_start_time, ms since the epoch */
    int64_t end_ms;            /* distribute_end_time */
    int validity_days;
    int status;                /* activity.status as stored in MySQL */
};

/* Status of A at NOW_MS: VOIDED if voided in MySQL, else from the window
 * (start <= now < end is IN_PROGRESS). */
int activity_status_at(const struct activity *a, int64_t now_ms);

/* "NOT_STARTED", "IN_PROGRESS", "ENDED", "VOIDED". */
const char *activity_status_name(int status);

/* ACTIVITY:LIST element: {"id","idStr","name","couponName","couponAmount",
 * "couponThreshold","totalNum","startTime","endTime","validityDays","status"}
 * with times in ms since the epoch. The caller owns the returned object. */
cJSON *activity_to_json(const struct activity *a);

/* Parses one ACTIVITY:LIST element; CS_ERR when a required field is missing. */
int activity_from_json(const cJSON *obj, struct activity *a);

/* Parses a whole ACTIVITY:LIST value. On CS_OK *out is an xmalloc'ed array of
 * *n activities (caller frees). */
int activity_list_parse(const char *json, size_t len, struct activity **out, size_t *n);

struct preheat_result {
    int loaded;                /* activities written to ACTIVITY:LIST */
    int created;               /* stock fields newly set */
    int restored;              /* of those, rebuilt from MySQL after Redis data loss */
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

/* The same for activity ID alone (after it was created or changed), leaving
 * ACTIVITY:LIST to the next preheat. res->loaded is 0 when ID is not one
 * preheat serves (unknown, voided, ended past the grace, beyond the horizon). */
int activity_preheat_one(struct mconn *mc, struct rconn *rc, int64_t id, int horizon_days,
                         int grace_s, struct preheat_result *res, char *err, size_t errlen);

/* The compact JSON of A that META and ACTIVITY:LIST hold (activity_to_json,
 * unformatted). The caller frees it with cJSON_free(). */
char *activity_to_text(const struct activity *a);

/* Stock field value of a revoked activity: below zero, so lua/seize.lua
 * never grants from it, and present, so preheat never recreates it. */
#define ACTIVITY_STOCK_VOIDED -1

/* Revoke, Redis first: id added to ACTIVITY:VOIDED and the stock field set
 * to ACTIVITY_STOCK_VOIDED; then in MySQL status 4 and unused coupons voided;
 * then ACTIVITY:LIST rewritten without it. A failure part way leaves Redis
 * voided (never MySQL voided while Redis sells); a repeat finishes it.
 * Idempotent. *found = 0 when no such activity. */
int activity_revoke(struct mconn *mc, struct rconn *rc, int64_t id, int horizon_days,
                    int *found, char *err, size_t errlen);

/* Counts the entries of queue shard SHARD ("<activity>:<user>" fields) of
 * each activity of ids[0..n), which MUST be sorted ascending: queued[i] gets
 * those of ids[i] (queued is parallel to ids, n long). One HSCAN pass over the
 * shard; an entry HSCAN returns twice is counted twice. CS_ERR with a message
 * in err when Redis fails. */
int activity_count_queued(struct rconn *rc, int shard, const int64_t *ids, size_t n,
                          int64_t *queued, char *err, size_t errlen);

/* Status job: moves activity.status 1 -> 2 -> 3 by the clock. *changed gets
 * the rows updated. */
int activity_advance_status(struct mconn *mc, uint64_t *changed, char *err, size_t errlen);

#endif
