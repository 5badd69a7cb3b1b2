/* revoke.c - voiding an activity: Redis first, then MySQL, then the list. */
#include "revoke.h"
#include "activity.h"
#include "cs.h"
#include "log.h"
#include "mconn.h"
#include "preheat.h"
#include "rconn.h"

#include <inttypes.h>
#include <stdio.h>

static const char SQL_ACTIVITY_EXISTS[] = "SELECT id FROM activity WHERE id = ?";
static const char SQL_REVOKE_LOCK[] = "SELECT status FROM activity WHERE id = ? FOR UPDATE";
static const char SQL_REVOKE_ACTIVITY[] = "UPDATE activity SET status = 4 WHERE id = ?";
static const char SQL_REVOKE_COUPONS[] =
    "UPDATE coupon SET status = 4 WHERE activity_id = ? AND status = 1";

static int revoke_found_row(void *arg, int ncols, char **cols)
{
    (void)ncols;
    (void)cols;
    *(int *)arg = 1;
    return CS_OK;
}

int revoke_activity(struct mconn *mc, struct rconn *rc, int64_t id, int horizon_days,
                    int *found, char *err, size_t errlen)
{
    struct mval p[] = {MV_INT(id)};

    *found = 0;
    if (mconn_query(mc, SQL_ACTIVITY_EXISTS, p, 1, revoke_found_row, found) != CS_OK) {
        snprintf(err, errlen, "%s", mc->errstr);
        return CS_ERR;
    }
    if (!*found)
        return CS_OK;
    /* Redis first: once MySQL says voided, nothing is on sale any more. A
     * failure after this point leaves Redis voided and MySQL not yet; a
     * repeat finishes it, and preheat never puts the stock back. */
    if (preheat_apply_void(rc, id, err, errlen) != CS_OK)
        return CS_ERR;

    if (mconn_begin(mc) != CS_OK)
        goto fail;
    /* The row lock orders this against coupon-sync, which takes the same
     * lock before it inserts coupons with the activity's current status. */
    int locked = 0;
    if (mconn_query(mc, SQL_REVOKE_LOCK, p, 1, revoke_found_row, &locked) != CS_OK
        || mconn_exec(mc, SQL_REVOKE_ACTIVITY, p, 1, NULL) != CS_OK
        || mconn_exec(mc, SQL_REVOKE_COUPONS, p, 1, NULL) != CS_OK || mconn_commit(mc) != CS_OK) {
        mconn_rollback(mc);
        goto fail;
    }

    /* The list is rewritten with the default grace; the next preheat
     * applies the configured one. */
    int ret = preheat_list_rewrite(mc, rc, horizon_days, ACTIVITY_GRACE_S, err, errlen);
    log_notice("activity %" PRId64 " revoked", id);
    return ret;

fail:
    snprintf(err, errlen, "%s", mc->errstr);
    return CS_ERR;
}
