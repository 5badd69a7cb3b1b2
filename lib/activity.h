/* activity.h - activities: the ACTIVITY:LIST JSON form, status by the clock,
 * what Redis holds of them live, and the status job. Moving them from MySQL
 * into Redis (preheat, revoke) is preheat.h. One implementation, used by
 * coupon-fcgi and coupon-sync. */
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
    int return_on_expiry;      /* an expired unused coupon gives its stock back */
    /* eligible_groups: compact JSON array of group names ("[\"new\"]"), ""
     * when anyone may seize. Names are [A-Za-z0-9_.:-] (the admin API checks),
     * so a name never holds a quote. */
    char groups[600];
};

/* Whether a caller whose token names the groups names[0..n) may seize A:
 * always when A has no groups, else when one of the names is exactly one of
 * A's (each of A's parsed from its JSON, compared whole). A groups text that
 * does not parse as an array lets nobody in. */
int activity_groups_allow(const struct activity *a, const char (*names)[40], int n);

/* Status of A at NOW_MS: VOIDED if voided in MySQL, else from the window
 * (start <= now < end is IN_PROGRESS). */
int activity_status_at(const struct activity *a, int64_t now_ms);

/* "NOT_STARTED", "IN_PROGRESS", "ENDED", "VOIDED". */
const char *activity_status_name(int status);

/* ACTIVITY:LIST element: {"id","idStr","name","couponName","couponAmount",
 * "couponThreshold","totalNum","startTime","endTime","validityDays","status"}
 * with times in ms since the epoch. The caller owns the returned object. */
cJSON *activity_to_json(const struct activity *a);

/* Copies src (NULL: "") into dst[size], one of struct activity's text fields,
 * without cutting a UTF-8 sequence in half: MySQL columns hold characters,
 * the struct fields hold bytes. */
void activity_copy_text(char *dst, size_t size, const char *src);

/* Parses one ACTIVITY:LIST element; CS_ERR when a required field is missing. */
int activity_from_json(const cJSON *obj, struct activity *a);

/* Parses a whole ACTIVITY:LIST value. On CS_OK *out is an xmalloc'ed array of
 * *n activities (caller frees). */
int activity_list_parse(const char *json, size_t len, struct activity **out, size_t *n);

/* The compact JSON of A that META and ACTIVITY:LIST hold (activity_to_json,
 * unformatted). The caller frees it with cJSON_free(). */
char *activity_to_text(const struct activity *a);

/* Stock field value of a revoked activity: below zero, so lua/seize.lua
 * never grants from it, and present, so preheat never recreates it. */
#define ACTIVITY_STOCK_VOIDED -1

/* What a read of an activity's stock field found. */
enum activity_stock_state {
    ACT_STOCK_UNKNOWN,         /* not read: Redis failed, or answered an error */
    ACT_STOCK_ABSENT,          /* no field: not preheated, or expired */
    ACT_STOCK_SET,             /* present; below 0 after a revoke (ACTIVITY_STOCK_VOIDED) */
};

/* One stock field to read: id in, the rest out. */
struct activity_stock {
    int64_t id;
    enum activity_stock_state state;
    int64_t value;             /* the field (plus what open node reserves hold of it)
                                * when ACT_STOCK_SET, else 0 */
};

/* Reads the stock fields of s[0..n) (HGET, pipelined: one round trip) into
 * their state and value. CS_OK when every one was read (present or absent).
 * CS_ERR when the connection failed (those not read yet stay
 * ACT_STOCK_UNKNOWN) or Redis answered one with an error (LOADING, BUSY ...:
 * that one stays ACT_STOCK_UNKNOWN, the others are read, so the connection
 * stays in step). */
int activity_stock_read(struct rconn *rc, struct activity_stock *s, size_t n);

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
