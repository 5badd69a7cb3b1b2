/* activity_db.c - activities in MySQL as the admin API reads and writes
 * them, and the rules of a change. */
#include "activity_db.h"
#include "cs.h"
#include "mconn.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ADB_COLS                                                                             \
    "id, name, coupon_name, coupon_type, coupon_amount, coupon_threshold, total_num, "      \
    "stock_num, CAST(UNIX_TIMESTAMP(distribute_start_time) AS SIGNED) * 1000, "              \
    "CAST(UNIX_TIMESTAMP(distribute_end_time) AS SIGNED) * 1000, validity_days, status, "    \
    "CAST(UNIX_TIMESTAMP(created_at) AS SIGNED) * 1000, "                                   \
    "CAST(UNIX_TIMESTAMP(NOW()) AS SIGNED) * 1000, return_on_expiry, "                     \
    "COALESCE(eligible_groups, '')"

static const char SQL_GET[] = "SELECT " ADB_COLS " FROM activity WHERE id = ?";
static const char SQL_LOCK[] = "SELECT " ADB_COLS " FROM activity WHERE id = ? FOR UPDATE";
static const char SQL_PAGE[] =
    "SELECT " ADB_COLS " FROM activity ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?";
static const char SQL_COUNT[] = "SELECT COUNT(*) FROM activity";
/* status follows from the window, as the status job would set it. */
static const char SQL_INSERT[] =
    "INSERT INTO activity (name, coupon_name, coupon_type, coupon_amount, coupon_threshold, "
    "total_num, stock_num, distribute_start_time, distribute_end_time, validity_days, "
    "return_on_expiry, eligible_groups, status) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, FROM_UNIXTIME(?), FROM_UNIXTIME(?), ?, ?, NULLIF(?, ''), "
    "CASE WHEN FROM_UNIXTIME(?) > NOW() THEN 1 WHEN FROM_UNIXTIME(?) > NOW() THEN 2 ELSE 3 END)";
static const char SQL_LAST_ID[] = "SELECT LAST_INSERT_ID()";
static const char SQL_COUPON_COUNTS[] =
    "SELECT status, returned <> 0, COUNT(*) FROM coupon WHERE activity_id = ? "
    "GROUP BY status, returned <> 0";
/* NULL keeps a column; total and stock move by the same delta, so the
 * invariant total = stock + coupons holds in this one statement. MariaDB
 * assigns left to right: status sees the new window. */
static const char SQL_UPDATE[] =
    "UPDATE activity SET name = COALESCE(?, name), coupon_name = COALESCE(?, coupon_name), "
    "coupon_type = COALESCE(?, coupon_type), coupon_amount = COALESCE(?, coupon_amount), "
    "coupon_threshold = COALESCE(?, coupon_threshold), total_num = total_num + ?, "
    "stock_num = stock_num + ?, "
    "distribute_start_time = COALESCE(FROM_UNIXTIME(?), distribute_start_time), "
    "distribute_end_time = COALESCE(FROM_UNIXTIME(?), distribute_end_time), "
    "validity_days = COALESCE(?, validity_days), "
    "return_on_expiry = COALESCE(?, return_on_expiry), "
    "eligible_groups = IF(? IS NULL, eligible_groups, NULLIF(?, '')), "
    "status = CASE WHEN distribute_start_time > NOW() THEN 1 "
    "WHEN distribute_end_time > NOW() THEN 2 ELSE 3 END WHERE id = ?";

struct adb_rows {
    struct activity_row *v;
    size_t n, cap;
};

static int64_t adb_ll(const char *s)
{
    return s ? strtoll(s, NULL, 10) : 0;
}

static int adb_row(void *arg, int ncols, char **c)
{
    struct adb_rows *rows = arg;
    if (ncols != 16)
        return CS_ERR;
    rows->v = cs_grow(rows->v, &rows->cap, rows->n + 1, sizeof(*rows->v));
    struct activity_row *r = &rows->v[rows->n++];
    memset(r, 0, sizeof(*r));
    /* ids are BIGINT UNSIGNED; the API serves 1..2^63-1 (strtoull, then the cast). */
    r->a.id = (int64_t)strtoull(c[0] ? c[0] : "0", NULL, 10);
    snprintf(r->a.name, sizeof(r->a.name), "%s", c[1] ? c[1] : "");
    snprintf(r->a.coupon_name, sizeof(r->a.coupon_name), "%s", c[2] ? c[2] : "");
    r->coupon_type = (int)adb_ll(c[3]);
    snprintf(r->a.coupon_amount, sizeof(r->a.coupon_amount), "%s", c[4] ? c[4] : "0.00");
    snprintf(r->a.coupon_threshold, sizeof(r->a.coupon_threshold), "%s", c[5] ? c[5] : "0.00");
    r->a.total_num = adb_ll(c[6]);
    r->stock_num = adb_ll(c[7]);
    r->a.start_ms = adb_ll(c[8]);
    r->a.end_ms = adb_ll(c[9]);
    r->a.validity_days = (int)adb_ll(c[10]);
    r->a.status = (int)adb_ll(c[11]);
    r->created_ms = adb_ll(c[12]);
    r->db_now_ms = adb_ll(c[13]);
    r->a.return_on_expiry = adb_ll(c[14]) != 0;
    snprintf(r->a.groups, sizeof(r->a.groups), "%s", c[15] ? c[15] : "");
    return CS_OK;
}

int activity_db_get(struct mconn *mc, int64_t id, int lock, struct activity_row *out,
                    int *found)
{
    struct adb_rows rows = {0};
    struct mval p[] = {MV_INT(id)};
    int rc = mconn_query(mc, lock ? SQL_LOCK : SQL_GET, p, 1, adb_row, &rows);
    *found = rc == CS_OK && rows.n == 1;
    if (*found)
        *out = rows.v[0];
    free(rows.v);
    return rc;
}

static int adb_count_row(void *arg, int ncols, char **c)
{
    if (ncols != 1)
        return CS_ERR;
    *(int64_t *)arg = adb_ll(c[0]);
    return CS_OK;
}

int activity_db_page(struct mconn *mc, int64_t page, int64_t size, struct activity_row **rows,
                     size_t *n, int64_t *total)
{
    struct adb_rows got = {0};
    struct mval p[] = {MV_INT(size), MV_INT((page - 1) * size)};
    *rows = NULL;
    *n = 0;
    *total = 0;
    if (mconn_query(mc, SQL_PAGE, p, 2, adb_row, &got) != CS_OK
        || mconn_query(mc, SQL_COUNT, NULL, 0, adb_count_row, total) != CS_OK) {
        free(got.v);
        return CS_ERR;
    }
    *rows = got.v;
    *n = got.n;
    return CS_OK;
}

static int adb_counts_row(void *arg, int ncols, char **c)
{
    struct activity_counts *k = arg;
    if (ncols != 3 || c[0] == NULL || c[2] == NULL)
        return CS_ERR;
    int st = atoi(c[0]);
    int64_t n = strtoll(c[2], NULL, 10);
    if (st >= 1 && st <= 4)
        k->by_status[st] += n;
    if (c[1] != NULL && atoi(c[1]) != 0)
        k->returned += n;
    return CS_OK;
}

int activity_db_counts(struct mconn *mc, int64_t id, struct activity_counts *out)
{
    struct mval p[] = {MV_INT(id)};
    memset(out, 0, sizeof(*out));
    return mconn_query(mc, SQL_COUPON_COUNTS, p, 1, adb_counts_row, out);
}

/* LAST_INSERT_ID() is unsigned: anything past 2^63-1 comes out as -1. */
static int adb_last_id_row(void *arg, int ncols, char **c)
{
    if (ncols != 1 || c[0] == NULL)
        return CS_ERR;
    unsigned long long v = strtoull(c[0], NULL, 10);
    *(int64_t *)arg = v > (unsigned long long)INT64_MAX ? -1 : (int64_t)v;
    return CS_OK;
}

int activity_db_insert(struct mconn *mc, const struct actinput *in, int64_t *id)
{
    struct mval p[] = {
        MV_TXT(in->name, strlen(in->name)),
        MV_TXT(in->coupon_name, strlen(in->coupon_name)),
        MV_INT(in->coupon_type),
        MV_TXT(in->coupon_amount, strlen(in->coupon_amount)),
        MV_TXT(in->coupon_threshold, strlen(in->coupon_threshold)),
        MV_INT(in->total_num),
        MV_INT(in->total_num),
        MV_INT(in->start_s),
        MV_INT(in->end_s),
        MV_INT(in->validity_days),
        MV_INT(in->return_on_expiry),
        MV_TXT(in->groups, strlen(in->groups)),
        MV_INT(in->start_s),
        MV_INT(in->end_s),
    };
    *id = 0;
    if (mconn_exec(mc, SQL_INSERT, p, (int)CS_ARRAY_LEN(p), NULL) != CS_OK)
        return CS_ERR;
    return mconn_query(mc, SQL_LAST_ID, NULL, 0, adb_last_id_row, id);
}

/* Fields of in that differ from the row (a field sent with its current
 * value changes nothing and is allowed at any time). */
static unsigned adb_changed(const struct actinput *in, const struct activity_row *row)
{
    unsigned ch = in->set;
    if ((ch & ACTIN_NAME) && strcmp(in->name, row->a.name) == 0)
        ch &= ~ACTIN_NAME;
    if ((ch & ACTIN_COUPON_NAME) && strcmp(in->coupon_name, row->a.coupon_name) == 0)
        ch &= ~ACTIN_COUPON_NAME;
    if ((ch & ACTIN_COUPON_TYPE) && in->coupon_type == row->coupon_type)
        ch &= ~ACTIN_COUPON_TYPE;
    if ((ch & ACTIN_COUPON_AMOUNT) && strcmp(in->coupon_amount, row->a.coupon_amount) == 0)
        ch &= ~ACTIN_COUPON_AMOUNT;
    if ((ch & ACTIN_COUPON_THRESHOLD)
        && strcmp(in->coupon_threshold, row->a.coupon_threshold) == 0)
        ch &= ~ACTIN_COUPON_THRESHOLD;
    if ((ch & ACTIN_TOTAL) && in->total_num == row->a.total_num)
        ch &= ~ACTIN_TOTAL;
    if ((ch & ACTIN_START) && in->start_s * 1000 == row->a.start_ms)
        ch &= ~ACTIN_START;
    if ((ch & ACTIN_END) && in->end_s * 1000 == row->a.end_ms)
        ch &= ~ACTIN_END;
    if ((ch & ACTIN_VALIDITY) && in->validity_days == row->a.validity_days)
        ch &= ~ACTIN_VALIDITY;
    return ch;
}

static enum activity_verdict adb_refuse(struct actinput_err *e, const char *field,
                                        const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static enum activity_verdict adb_refuse(struct actinput_err *e, const char *field,
                                        const char *fmt, ...)
{
    va_list ap;
    e->field = field;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return ACTIVITY_CHANGE_BAD;
}

enum activity_verdict activity_change_rules(const struct actinput *in,
                                            const struct activity_row *row,
                                            struct activity_change *c,
                                            struct actinput_err *e)
{
    int64_t now = row->db_now_ms;

    e->field = NULL;
    e->msg[0] = '\0';
    c->ch = 0;
    c->delta = 0;
    if (row->a.status == ACT_VOIDED) {
        snprintf(e->msg, sizeof(e->msg), "the activity was revoked; it cannot change");
        return ACTIVITY_CHANGE_VOIDED;
    }
    if (row->a.status == ACT_ENDED || now >= row->a.end_ms) {
        snprintf(e->msg, sizeof(e->msg), "the activity has ended; it cannot change");
        return ACTIVITY_CHANGE_ENDED;
    }
    c->ch = adb_changed(in, row);
    if (now >= row->a.start_ms) {
        unsigned fixed = c->ch & ~(unsigned)(ACTIN_END | ACTIN_ADD);
        if (fixed != 0) {
            unsigned bit = fixed & -fixed;
            return adb_refuse(e, actinput_field(bit),
                              "%s cannot change once the sale has started "
                              "(only a later distributeEndTime and addStock)",
                              actinput_field(bit));
        }
        if ((c->ch & ACTIN_END) && in->end_s * 1000 < row->a.end_ms)
            return adb_refuse(e, "distributeEndTime",
                              "distributeEndTime can only move later once the sale has "
                              "started");
    } else {
        int64_t start = (c->ch & ACTIN_START) ? in->start_s * 1000 : row->a.start_ms;
        int64_t end = (c->ch & ACTIN_END) ? in->end_s * 1000 : row->a.end_ms;
        if (end <= start)
            return adb_refuse(e, "distributeEndTime",
                              "distributeEndTime must be after distributeStartTime");
        if (c->ch & ACTIN_TOTAL) {
            int64_t issued = row->a.total_num - row->stock_num;
            if (in->total_num < issued)
                return adb_refuse(e, "totalNum",
                                  "totalNum is below the %" PRId64 " coupons already issued",
                                  issued);
            c->delta = in->total_num - row->a.total_num;
        }
    }
    if (c->ch & ACTIN_ADD) {
        if (row->a.total_num + in->add_stock > ACTIN_MAX_TOTAL)
            return adb_refuse(e, "addStock", "addStock would take totalNum past %lld",
                              ACTIN_MAX_TOTAL);
        c->delta = in->add_stock;
    }
    return ACTIVITY_CHANGE_OK;
}

static struct mval adb_opt_txt(unsigned ch, unsigned bit, const char *s)
{
    return (ch & bit) ? MV_TXT(s, strlen(s)) : (struct mval){.t = MV_NULL};
}

static struct mval adb_opt_int(unsigned ch, unsigned bit, int64_t v)
{
    return (ch & bit) ? MV_INT(v) : (struct mval){.t = MV_NULL};
}

int activity_db_update(struct mconn *mc, const struct actinput *in,
                       const struct activity_change *c, int64_t id)
{
    unsigned ch = c->ch;
    struct mval p[] = {
        adb_opt_txt(ch, ACTIN_NAME, in->name),
        adb_opt_txt(ch, ACTIN_COUPON_NAME, in->coupon_name),
        adb_opt_int(ch, ACTIN_COUPON_TYPE, in->coupon_type),
        adb_opt_txt(ch, ACTIN_COUPON_AMOUNT, in->coupon_amount),
        adb_opt_txt(ch, ACTIN_COUPON_THRESHOLD, in->coupon_threshold),
        MV_INT(c->delta),
        MV_INT(c->delta),
        adb_opt_int(ch, ACTIN_START, in->start_s),
        adb_opt_int(ch, ACTIN_END, in->end_s),
        adb_opt_int(ch, ACTIN_VALIDITY, in->validity_days),
        adb_opt_int(ch, ACTIN_RETURN, in->return_on_expiry),
        adb_opt_txt(ch, ACTIN_GROUPS, in->groups),
        adb_opt_txt(ch, ACTIN_GROUPS, in->groups),
        MV_INT(id),
    };
    return mconn_exec(mc, SQL_UPDATE, p, (int)CS_ARRAY_LEN(p), NULL);
}
