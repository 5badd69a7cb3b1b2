/* activity_db.h - activities in MySQL as the admin API reads and writes
 * them, and the rules of a change: what may change before a sale starts and
 * what after. Every function takes the caller's own connection. */
#ifndef CS_ACTIVITY_DB_H
#define CS_ACTIVITY_DB_H

#include "activity.h"
#include "actinput.h"

#include <stddef.h>
#include <stdint.h>

struct mconn;

/* One activity row as the admin API shows it. */
struct activity_row {
    struct activity a;
    int coupon_type;
    int64_t stock_num;
    int64_t created_ms;
    int64_t db_now_ms;         /* MySQL's clock when the row was read */
};

/* Coupons of one activity by state. */
struct activity_counts {
    int64_t by_status[5];      /* index: coupon.status 1..4 */
    int64_t returned;
};

/* Reads activity id, with lock set under a row lock (SELECT ... FOR UPDATE,
 * inside the caller's transaction). CS_OK with *found; CS_ERR when MySQL
 * failed (mc->errstr). */
int activity_db_get(struct mconn *mc, int64_t id, int lock, struct activity_row *out,
                    int *found);

/* Page page (from 1) of size rows, newest first, and *total of all. On CS_OK
 * *rows is xmalloc'ed (caller frees; NULL when *n is 0). */
int activity_db_page(struct mconn *mc, int64_t page, int64_t size, struct activity_row **rows,
                     size_t *n, int64_t *total);

/* Coupons of activity id by state, from idx_coupon_activity_state alone. */
int activity_db_counts(struct mconn *mc, int64_t id, struct activity_counts *out);

/* Inserts a new activity of in (defaults filled by the caller), its status
 * from the window. *id gets the new id, or -1 when AUTO_INCREMENT went past
 * 2^63-1 (an id no client could name). */
int activity_db_insert(struct mconn *mc, const struct actinput *in, int64_t *id);

/* What an accepted change does: the fields it changes (ACTIN_* bits, those
 * sent with their current value left out) and the stock's move. */
struct activity_change {
    unsigned ch;
    int64_t delta;
};

/* What the rules say of a change. */
enum activity_verdict {
    ACTIVITY_CHANGE_OK,
    ACTIVITY_CHANGE_VOIDED,    /* revoked: it cannot change */
    ACTIVITY_CHANGE_ENDED,     /* ended: it cannot change */
    ACTIVITY_CHANGE_BAD,       /* a field may not take that value now: e names it */
};

/*
 * The rules of a change of row (read under its lock) by in: nothing once
 * revoked or ended; once started only a later end and a top-up; an end after
 * the start; a total not below the coupons issued, nor past ACTIN_MAX_TOTAL.
 * ACTIVITY_CHANGE_OK with *c filled; else why not, with e->msg (and e->field
 * for ACTIVITY_CHANGE_BAD).
 */
enum activity_verdict activity_change_rules(const struct actinput *in, const struct activity_row *row,
                                            struct activity_change *c,
                                            struct actinput_err *e);

/* The UPDATE of an accepted change c of activity id by in, inside the
 * caller's transaction: total and stock move by the same delta. */
int activity_db_update(struct mconn *mc, const struct actinput *in,
                       const struct activity_change *c, int64_t id);

#endif
