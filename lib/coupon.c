/* coupon.c - the coupon lifecycle: mine, use, release, expiry, return on expiry. */
#include "coupon.h"
#include "cs.h"
#include "keys.h"
#include "log.h"
#include "mconn.h"
#include "rargs.h"
#include "rconn.h"
#include "scripts.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The state a refusal is judged by: status, the order using it, whether it
 * is past valid_until (by MySQL's clock, as the UPDATEs judge). Every
 * statement of use and release names the owner: a coupon of another user is
 * not found, exactly as a missing one. */
static const char SQL_ACTIVITY_OF[] = "SELECT activity_id FROM coupon WHERE id = ?";
static const char SQL_STATE[] =
    "SELECT status, order_id, valid_until <= NOW(3) FROM coupon WHERE id = ? AND user_id = ?";
/* The one statement that decides a race: only an unused, still valid coupon
 * becomes used, so of two orders exactly one changes the row. */
static const char SQL_USE[] =
    "UPDATE coupon SET status = 2, order_id = ?, used_at = NOW(3) "
    "WHERE id = ? AND user_id = ? AND status = 1 AND valid_until > NOW(3)";
/* Unused again even when past valid_until: the expiry pass then expires it
 * and, when its activity says so, gives its stock back (one path for both).
 * BINARY: the order id is compared byte for byte, never with the column's
 * PAD SPACE collation (which would take "o-1 " for "o-1"). */
static const char SQL_RELEASE[] =
    "UPDATE coupon SET status = 1, order_id = NULL, used_at = NULL "
    "WHERE id = ? AND user_id = ? AND status = 2 AND order_id = BINARY ?";

/* "mine": status as shown (an unused coupon past validity is expired). */
#define MINE_STATUS "IF(c.status = 1 AND c.valid_until <= NOW(3), 3, c.status)"
static const char SQL_MINE[] =
    "SELECT c.id, c.activity_id, a.name, " MINE_STATUS ", "
    "CAST(UNIX_TIMESTAMP(c.seized_at) * 1000 AS SIGNED), "
    "CAST(UNIX_TIMESTAMP(c.valid_until) * 1000 AS SIGNED), a.coupon_type, a.coupon_amount, "
    "a.coupon_threshold, c.order_id FROM coupon c JOIN activity a ON a.id = c.activity_id "
    "WHERE c.user_id = ? AND (? = 0 OR " MINE_STATUS " = ?) "
    "ORDER BY c.seized_at DESC, c.id DESC LIMIT ? OFFSET ?";
static const char SQL_MINE_COUNT[] =
    "SELECT COUNT(*) FROM coupon c WHERE c.user_id = ? AND (? = 0 OR " MINE_STATUS " = ?)";

/* Activities whose expired coupons go back to stock now: left out of the
 * plain expiry (a non-locking read, so the pass never waits on a return
 * that holds an activity row while it waits on a coupon row). */
static const char SQL_RETURNING[] =
    "SELECT id FROM activity WHERE return_on_expiry = 1 AND status <> 4 "
    "AND distribute_start_time <= NOW() AND distribute_end_time > NOW()";
/* Ranges over idx_coupon_due (status, valid_until): only the coupons due. */
static const char SQL_EXPIRE[] =
    "UPDATE coupon SET status = 3 WHERE status = 1 AND valid_until <= NOW(3) "
    "AND FIND_IN_SET(activity_id, ?) = 0 ORDER BY valid_until LIMIT ?";

static const char SQL_RETURN_DUE[] =
    "SELECT c.id, c.activity_id FROM coupon c JOIN activity a ON a.id = c.activity_id "
    "WHERE c.status = 1 AND c.valid_until <= NOW(3) AND c.returned = 0 "
    "AND a.return_on_expiry = 1 AND a.status <> 4 AND a.distribute_start_time <= NOW() "
    "AND a.distribute_end_time > NOW() ORDER BY c.valid_until LIMIT ?";
/* Locks the activity row first, as the drain, revoke and top-up do: they
 * are then ordered before or after this return, never interleaved. */
static const char SQL_RETURN_LOCK[] =
    "SELECT return_on_expiry = 1 AND status <> 4 AND distribute_start_time <= NOW() "
    "AND distribute_end_time > NOW() FROM activity WHERE id = ? FOR UPDATE";
static const char SQL_RETURN_COUPON[] =
    "UPDATE coupon SET status = 3, returned = 1, live_key = id "
    "WHERE id = ? AND status = 1 AND returned = 0 AND valid_until <= NOW(3)";
static const char SQL_RETURN_STOCK[] =
    "UPDATE activity SET stock_num = stock_num + 1 WHERE id = ? AND stock_num < total_num";
static const char SQL_RETURN_PENDING[] =
    "SELECT id, activity_id, user_id, CAST(UNIX_TIMESTAMP(seized_at) * 1000 AS SIGNED) "
    "FROM coupon WHERE returned = 1 ORDER BY id LIMIT ?";
static const char SQL_RETURN_MARK[] = "UPDATE coupon SET returned = 2 WHERE id = ? AND returned = 1";


static const char *const status_names[] = {"UNKNOWN", "UNUSED", "USED", "EXPIRED", "VOIDED"};

const char *coupon_status_name(int status)
{
    return status >= COUPON_UNUSED && status <= COUPON_VOIDED ? status_names[status]
                                                                : status_names[0];
}

int coupon_status_parse(const char *s, int *status)
{
    for (int i = COUPON_UNUSED; i <= COUPON_VOIDED; i++)
        if (strcasecmp(s, status_names[i]) == 0) {
            *status = i;
            return CS_OK;
        }
    return CS_ERR;
}

int coupon_order_id_ok(const char *s, size_t len)
{
    if (s == NULL || len == 0 || len > COUPON_ORDER_MAX)
        return 0;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x21 || (unsigned char)s[i] > 0x7e)
            return 0;
    return 1;
}

/* ---- use and release ---------------------------------------------------------------- */

struct coupon_state {
    int found, status, past;
    char order[COUPON_ORDER_MAX + 1];
};

static int state_row(void *arg, int ncols, char **c)
{
    struct coupon_state *st = arg;
    if (ncols != 3 || c[0] == NULL)
        return CS_ERR;
    st->found = 1;
    st->status = atoi(c[0]);
    snprintf(st->order, sizeof(st->order), "%s", c[1] ? c[1] : "");
    st->past = c[2] != NULL && atoi(c[2]) != 0;
    return CS_OK;
}

/* The state of coupon id if it is user's (else st->found = 0). */
static int state_read(struct mconn *mc, int64_t id, int64_t user, struct coupon_state *st)
{
    struct mval p[] = {MV_INT(id), MV_INT(user)};
    memset(st, 0, sizeof(*st));
    return mconn_query(mc, SQL_STATE, p, 2, state_row, st);
}

static int same_order(const struct coupon_state *st, const char *order, size_t len)
{
    return strlen(st->order) == len && memcmp(st->order, order, len) == 0;
}

/* The refusal (or idempotent success) a use meets on a coupon in state st. */
static enum coupon_result use_judge(const struct coupon_state *st, const char *order,
                                    size_t len)
{
    switch (st->status) {
    case COUPON_USED:
        return same_order(st, order, len) ? COUPON_R_OK : COUPON_R_ALREADY_USED;
    case COUPON_EXPIRED:
        return COUPON_R_EXPIRED;
    case COUPON_VOIDED:
        return COUPON_R_VOIDED;
    default:
        return st->past ? COUPON_R_EXPIRED : COUPON_R_UNUSED;
    }
}

int coupon_use(struct mconn *mc, int64_t id, int64_t user, const char *order, size_t len,
               enum coupon_result *res)
{
    struct coupon_state st;

    /* A release between the UPDATE and the read below can make the coupon
     * unused again: then the UPDATE is simply tried once more. */
    for (int tries = 0; tries < 3; tries++) {
        uint64_t affected = 0;
        struct mval p[] = {MV_TXT(order, len), MV_INT(id), MV_INT(user)};
        if (mconn_exec(mc, SQL_USE, p, 3, &affected) != CS_OK)
            return CS_ERR;
        if (affected == 1) {
            *res = COUPON_R_OK;
            return CS_OK;
        }
        if (state_read(mc, id, user, &st) != CS_OK)
            return CS_ERR;
        if (!st.found) {
            *res = COUPON_R_NO_SUCH;
            return CS_OK;
        }
        *res = use_judge(&st, order, len);
        if (*res != COUPON_R_UNUSED)
            return CS_OK;
    }
    *res = COUPON_R_ALREADY_USED;
    return CS_OK;
}

int coupon_release(struct mconn *mc, int64_t id, int64_t user, const char *order, size_t len,
                   enum coupon_result *res, int *expired)
{
    struct coupon_state st;
    uint64_t affected = 0;

    *expired = 0;
    struct mval p[] = {MV_INT(id), MV_INT(user), MV_TXT(order, len)};
    if (mconn_exec(mc, SQL_RELEASE, p, 3, &affected) != CS_OK)
        return CS_ERR;
    if (state_read(mc, id, user, &st) != CS_OK)
        return CS_ERR;
    if (affected == 1) {
        *res = COUPON_R_OK;
        *expired = st.found && (st.status == COUPON_EXPIRED || st.past);
        return CS_OK;
    }
    if (!st.found) {
        *res = COUPON_R_NO_SUCH;
        return CS_OK;
    }
    /* Used by this same order cannot be: the UPDATE would have matched. */
    *res = st.status == COUPON_USED ? COUPON_R_ALREADY_USED : use_judge(&st, order, len);
    return CS_OK;
}

static int activity_row(void *arg, int ncols, char **c)
{
    if (ncols != 1 || c[0] == NULL)
        return CS_ERR;
    *(int64_t *)arg = (int64_t)strtoull(c[0], NULL, 10);
    return CS_OK;
}

int coupon_activity_of(struct mconn *mc, int64_t id, int64_t *activity_id)
{
    struct mval p[] = {MV_INT(id)};
    *activity_id = 0;
    return mconn_query(mc, SQL_ACTIVITY_OF, p, 1, activity_row, activity_id);
}

/* ---- mine ----------------------------------------------------------------------- */

struct mine_rows {
    struct coupon_row *v;
    size_t n, cap;
};

static int64_t ll(const char *s)
{
    return s ? strtoll(s, NULL, 10) : 0;
}

static int mine_row(void *arg, int ncols, char **c)
{
    struct mine_rows *m = arg;
    if (ncols != 10)
        return CS_ERR;
    m->v = cs_grow(m->v, &m->cap, m->n + 1, sizeof(*m->v));
    struct coupon_row *r = &m->v[m->n++];
    memset(r, 0, sizeof(*r));
    r->id = (int64_t)strtoull(c[0] ? c[0] : "0", NULL, 10);
    r->activity_id = (int64_t)strtoull(c[1] ? c[1] : "0", NULL, 10);
    snprintf(r->activity_name, sizeof(r->activity_name), "%s", c[2] ? c[2] : "");
    r->status = (int)ll(c[3]);
    r->seized_ms = ll(c[4]);
    r->valid_until_ms = ll(c[5]);
    r->coupon_type = (int)ll(c[6]);
    snprintf(r->coupon_amount, sizeof(r->coupon_amount), "%s", c[7] ? c[7] : "0.00");
    snprintf(r->coupon_threshold, sizeof(r->coupon_threshold), "%s", c[8] ? c[8] : "0.00");
    snprintf(r->order_id, sizeof(r->order_id), "%s", c[9] ? c[9] : "");
    return CS_OK;
}

static int count_row(void *arg, int ncols, char **c)
{
    if (ncols != 1)
        return CS_ERR;
    *(int64_t *)arg = ll(c[0]);
    return CS_OK;
}

int coupon_mine(struct mconn *mc, int64_t user, int status, int64_t size, int64_t offset,
                struct coupon_row **rows, size_t *n, int64_t *total)
{
    struct mine_rows m = {0};
    struct mval p[] = {MV_INT(user), MV_INT(status), MV_INT(status), MV_INT(size),
                       MV_INT(offset)};

    *rows = NULL;
    *n = 0;
    *total = 0;
    if (mconn_query(mc, SQL_MINE, p, 5, mine_row, &m) != CS_OK
        || mconn_query(mc, SQL_MINE_COUNT, p, 3, count_row, total) != CS_OK) {
        free(m.v);
        return CS_ERR;
    }
    *rows = m.v;
    *n = m.n;
    return CS_OK;
}

/* ---- expiry and return on expiry ------------------------------------------------ */

struct id_list {
    char *csv;
    size_t len, cap;
};

static int returning_row(void *arg, int ncols, char **c)
{
    struct id_list *l = arg;
    if (ncols != 1 || c[0] == NULL)
        return CS_ERR;
    size_t k = strlen(c[0]);
    l->csv = cs_grow(l->csv, &l->cap, l->len + k + 2, 1);
    if (l->len > 0)
        l->csv[l->len++] = ',';
    memcpy(l->csv + l->len, c[0], k);
    l->len += k;
    l->csv[l->len] = '\0';
    return CS_OK;
}

int coupon_expire_due(struct mconn *mc, int batch, uint64_t *expired)
{
    struct id_list keep = {0};
    int ret = CS_ERR;

    *expired = 0;
    if (mconn_query(mc, SQL_RETURNING, NULL, 0, returning_row, &keep) != CS_OK)
        goto out;
    for (;;) {
        uint64_t affected = 0;
        struct mval p[] = {MV_TXT(keep.csv ? keep.csv : "", keep.len), MV_INT(batch)};
        /* Autocommit: each batch is its own short transaction. */
        if (mconn_exec(mc, SQL_EXPIRE, p, 2, &affected) != CS_OK)
            goto out;
        *expired += affected;
        if (affected < (uint64_t)batch)
            break;
    }
    ret = CS_OK;
out:
    free(keep.csv);
    return ret;
}

struct due_list {
    int64_t (*v)[2];
    size_t n, cap;
};

static int due_row(void *arg, int ncols, char **c)
{
    struct due_list *d = arg;
    if (ncols != 2 || c[0] == NULL || c[1] == NULL)
        return CS_ERR;
    d->v = cs_grow(d->v, &d->cap, d->n + 1, sizeof(*d->v));
    d->v[d->n][0] = (int64_t)strtoull(c[0], NULL, 10);
    d->v[d->n][1] = (int64_t)strtoull(c[1], NULL, 10);
    d->n++;
    return CS_OK;
}

static int flag_row(void *arg, int ncols, char **c)
{
    if (ncols != 1)
        return CS_ERR;
    *(int *)arg = c[0] != NULL && atoi(c[0]) != 0;
    return CS_OK;
}

/* One return's MySQL transaction. *done: the coupon was returned now. */
static int return_one(struct mconn *mc, int64_t id, int64_t aid, int *done)
{
    int open = 0;
    uint64_t affected = 0;
    struct mval pa[] = {MV_INT(aid)}, pc[] = {MV_INT(id)};

    *done = 0;
    if (mconn_begin(mc) != CS_OK)
        return CS_ERR;
    if (mconn_query(mc, SQL_RETURN_LOCK, pa, 1, flag_row, &open) != CS_OK)
        goto fail;
    if (open) {
        if (mconn_exec(mc, SQL_RETURN_COUPON, pc, 1, &affected) != CS_OK)
            goto fail;
        if (affected == 1) {
            uint64_t moved = 0;
            if (mconn_exec(mc, SQL_RETURN_STOCK, pa, 1, &moved) != CS_OK)
                goto fail;
            if (moved != 1) {
                /* stock_num = total_num with a coupon that counts: the
                 * numbers were off before; leave this coupon alone. */
                log_warn("activity %" PRId64 ": stock_num already equals total_num; "
                         "coupon %" PRId64 " not returned",
                         aid, id);
                mconn_rollback(mc);
                return CS_OK;
            }
            *done = 1;
        }
    }
    if (mconn_commit(mc) != CS_OK) {
        *done = 0;
        return CS_ERR;
    }
    return CS_OK;
fail:
    mconn_rollback(mc);
    return CS_ERR;
}

struct pending_list {
    struct coupon_return *v;
    size_t n, cap;
};

static int pending_row(void *arg, int ncols, char **c)
{
    struct pending_list *l = arg;
    if (ncols != 4 || c[0] == NULL || c[1] == NULL || c[2] == NULL || c[3] == NULL)
        return CS_ERR;
    l->v = cs_grow(l->v, &l->cap, l->n + 1, sizeof(*l->v));
    struct coupon_return *r = &l->v[l->n++];
    r->id = (int64_t)strtoull(c[0], NULL, 10);
    r->activity_id = (int64_t)strtoull(c[1], NULL, 10);
    r->user_id = (int64_t)strtoull(c[2], NULL, 10);
    r->seized_ms = strtoll(c[3], NULL, 10);
    return CS_OK;
}

int coupon_return_due(struct mconn *mc, int batch, uint64_t *returned,
                      struct coupon_return **out, size_t *n)
{
    struct due_list due = {0};
    struct pending_list pend = {0};
    struct mval pb[] = {MV_INT(batch)};
    int ret = CS_ERR;

    *returned = 0;
    *out = NULL;
    *n = 0;
    if (mconn_query(mc, SQL_RETURN_DUE, pb, 1, due_row, &due) != CS_OK)
        goto out;
    for (size_t i = 0; i < due.n; i++) {
        int done;
        if (return_one(mc, due.v[i][0], due.v[i][1], &done) != CS_OK)
            goto out;
        *returned += (uint64_t)done;
    }
    if (mconn_query(mc, SQL_RETURN_PENDING, pb, 1, pending_row, &pend) != CS_OK)
        goto out;
    *out = pend.v;
    *n = pend.n;
    pend.v = NULL;
    ret = CS_OK;
out:
    free(pend.v);
    free(due.v);
    return ret;
}

int coupon_return_redis(struct rconn *rc, const struct coupon_return *c, char *err,
                        size_t errlen)
{
    struct rargs a = RARGS_INIT;
    char skey[KEYS_MAX];

    keys_stock(skey, keys_shard(c->activity_id));
    rargs_str(&a, "EVAL");
    rargs_str(&a, script_coupon_return);
    rargs_str(&a, "2");
    rargs_key(&a, keys_stock, keys_shard(c->activity_id));
    rargs_akey(&a, keys_seize_list, c->activity_id);
    rargs_int(&a, c->activity_id);
    rargs_int(&a, c->user_id);
    rargs_int(&a, c->seized_ms);
    redisReply *r = rargs_command(rc, skey, &a, NULL);
    rargs_free(&a);
    if (r == NULL) {
        snprintf(err, errlen, "EVAL return of coupon %" PRId64 ": %s", c->id, rc->errstr);
        return CS_ERR;
    }
    int ret;
    if (r->type != REDIS_REPLY_INTEGER) {
        snprintf(err, errlen, "EVAL return of coupon %" PRId64 ": %s", c->id,
                 r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
        ret = CS_ERR;
    } else {
        ret = r->integer == SCRIPT_RETURN_DONE ? 1 : 0;
    }
    freeReplyObject(r);
    return ret;
}

int coupon_return_mark(struct mconn *mc, int64_t id)
{
    struct mval p[] = {MV_INT(id)};
    return mconn_exec(mc, SQL_RETURN_MARK, p, 1, NULL);
}
