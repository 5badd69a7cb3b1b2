/* coupon.h - a coupon after the seize: the owner's list, use and release by an
 * order, expiry, and return on expiry (doc/lifecycle.md;
 * internals.md L1, L2). Served to coupon-fcgi's routes and coupon-sync's jobs.
 *
 * Every function takes the caller's own connection (one per thread). */
#ifndef CS_COUPON_H
#define CS_COUPON_H

#include <stddef.h>
#include <stdint.h>

struct mconn;
struct rconn;

/* coupon.status in MySQL. */
enum coupon_status {
    COUPON_UNUSED = 1,
    COUPON_USED = 2,
    COUPON_EXPIRED = 3,
    COUPON_VOIDED = 4,
};

/* What a use or release came to. */
enum coupon_result {
    COUPON_R_OK,               /* done (or done before by the same order: use is idempotent) */
    COUPON_R_NO_SUCH,          /* no coupon of that id and user */
    COUPON_R_ALREADY_USED,     /* used by another order */
    COUPON_R_EXPIRED,          /* past valid_until (or marked expired) */
    COUPON_R_VOIDED,           /* its activity was revoked */
    COUPON_R_UNUSED,           /* release of a coupon no order uses */
};

#define COUPON_ORDER_MAX 64

/* "UNUSED", "USED", "EXPIRED", "VOIDED" (anything else: "UNKNOWN"). */
const char *coupon_status_name(int status);

/* Parses "unused" | "used" | "expired" | "voided" (any case) into *status.
 * CS_OK or CS_ERR. */
int coupon_status_parse(const char *s, int *status);

/* True when s[0..len) is a valid order id: 1..COUPON_ORDER_MAX bytes of
 * 0x21..0x7e (printable ASCII; no space, no control byte, no NUL). Order ids
 * are compared byte for byte. */
int coupon_order_id_ok(const char *s, size_t len);

/*
 * Marks coupon id of user used by order (len bytes, checked by
 * coupon_order_id_ok()). A coupon of another user is COUPON_R_NO_SUCH, as a
 * missing one: the owner is part of every statement, so the answer never
 * tells whether the id exists. One conditional UPDATE (unused, still valid)
 * decides: of two orders racing for one coupon exactly one gets
 * COUPON_R_OK; the same order again gets COUPON_R_OK too.
 * *res gets the outcome; returns CS_ERR only when MySQL failed (mc->errstr).
 */
int coupon_use(struct mconn *mc, int64_t id, int64_t user, const char *order, size_t len,
               enum coupon_result *res);

/*
 * Undoes the use of coupon id of user by order: unused again. A coupon
 * released past valid_until is answered COUPON_R_OK with *expired = 1; the
 * expiry pass marks it expired (and gives its stock back if its activity
 * says so). Another user's coupon is COUPON_R_NO_SUCH; anything but "used by
 * this order" is refused with the coupon's state in *res.
 * Returns CS_ERR only when MySQL failed.
 */
int coupon_release(struct mconn *mc, int64_t id, int64_t user, const char *order, size_t len,
                   enum coupon_result *res, int *expired);

/* The activity of coupon id into *activity_id (0 when there is no such
 * coupon). CS_OK or CS_ERR (mc->errstr). */
int coupon_activity_of(struct mconn *mc, int64_t id, int64_t *activity_id);

/* One coupon as "mine" shows it. */
struct coupon_row {
    int64_t id, activity_id;
    char activity_name[129];
    int status;                /* as shown: an unused coupon past validity is EXPIRED */
    int64_t seized_ms, valid_until_ms;
    int coupon_type;
    char coupon_amount[24], coupon_threshold[24];
    char order_id[COUPON_ORDER_MAX + 1]; /* "" unless used */
};

/*
 * The coupons of user (status 0: all, else that status as shown), newest
 * first, size rows from offset. *rows (free() it) and *n get the page,
 * *total the count of all matching. CS_OK or CS_ERR (mc->errstr).
 */
int coupon_mine(struct mconn *mc, int64_t user, int status, int64_t size, int64_t offset,
                struct coupon_row **rows, size_t *n, int64_t *total);

/*
 * The expiry pass: unused coupons past valid_until become expired, batch rows
 * per statement, by the index on (status, valid_until), so it touches only
 * the coupons due. Coupons of an activity with return_on_expiry whose sale is
 * still open are left to coupon_return_due(). *expired gets the count.
 * CS_OK or CS_ERR (mc->errstr).
 */
int coupon_expire_due(struct mconn *mc, int batch, uint64_t *expired);

/* A return whose MySQL step is done (returned = 1): what the Redis step needs. */
struct coupon_return {
    int64_t id, activity_id, user_id, seized_ms;
};

/*
 * The MySQL step of return on expiry, for at most batch coupons due: per
 * coupon one transaction that locks the activity row (so a revoke, top-up or
 * drain of that activity is ordered before or after it), checks the sale is
 * still open and return_on_expiry set, marks the coupon expired and returned
 * (returned = 1, live_key = id) and adds one to stock_num: total_num =
 * stock_num + coupons with returned = 0 holds at every commit.
 * Then lists, into *out (free() it) and *n, every coupon with returned = 1
 * (these and ones left by an earlier pass), for coupon_return_redis().
 * *returned gets the count of coupons returned now. CS_OK or CS_ERR.
 */
int coupon_return_due(struct mconn *mc, int batch, uint64_t *returned,
                      struct coupon_return **out, size_t *n);

/*
 * The Redis step of a return, in one script on the shard's slot: when the
 * stock field exists and is >= 0 (not revoked) and the user's seize-list
 * entry still carries the coupon's seize time, removes the user from the
 * seize list and adds one to the stock. Idempotent: a repeat (the entry is
 * gone, or the user has seized again since) changes nothing. Returns 1 done,
 * 0 nothing to do (already done, revoked, not preheated), CS_ERR when Redis
 * did not answer (err set; retry later).
 * MUST be called holding the shard's sync lock, with coupon_return_mark()
 * after it before the lock is released: reconciliation then never sees the
 * stock back in Redis with the coupon still counted.
 */
int coupon_return_redis(struct rconn *rc, const struct coupon_return *c, char *err,
                        size_t errlen);

/* Records that the Redis step of coupon id is done (returned = 2). */
int coupon_return_mark(struct mconn *mc, int64_t id);

#endif
