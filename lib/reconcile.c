/* reconcile.c - brings one activity's Redis stock back to MySQL's numbers
 * (after an update whose Redis step failed once MySQL had committed). */
#include "reconcile.h"
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

static const char SQL_LOCK[] =
    "SELECT total_num, status, distribute_end_time <= NOW(), "
    "updated_at >= NOW() - INTERVAL ? SECOND FROM activity WHERE id = ? FOR UPDATE";


struct lock_row {
    int found;
    int64_t total;
    int status, ended, recent;
};

static int lock_row_cb(void *arg, int ncols, char **c)
{
    struct lock_row *row = arg;
    if (ncols != 4 || c[0] == NULL || c[1] == NULL)
        return CS_ERR;
    row->found = 1;
    row->total = strtoll(c[0], NULL, 10);
    row->status = atoi(c[1]);
    row->ended = c[2] != NULL && atoi(c[2]) != 0;
    row->recent = c[3] != NULL && atoi(c[3]) != 0;
    return CS_OK;
}

/* Runs script_reconcile; CS_OK with the script's three numbers in out. */
static int reconcile_script(struct rconn *rc, int64_t id, int64_t total, long long out[3],
                            char *err, size_t errlen)
{
    struct rargs a = RARGS_INIT;
    char stock[KEYS_MAX];
    keys_stock(stock, keys_shard(id));
    rargs_str(&a, "EVAL");
    rargs_str(&a, script_reconcile);
    rargs_str(&a, "3");
    rargs_key(&a, keys_stock, keys_shard(id));
    rargs_akey(&a, keys_seize_list, id);
    rargs_key(&a, keys_reserve, keys_shard(id));
    rargs_int(&a, id);
    rargs_int(&a, total);
    redisReply *rep = rargs_command(rc, stock, &a, NULL);
    rargs_free(&a);
    if (rep == NULL) {
        snprintf(err, errlen, "EVAL reconcile %s: %s", stock, rc->errstr);
        return CS_ERR;
    }
    int ok = rep->type == REDIS_REPLY_ARRAY && rep->elements == 3;
    for (size_t i = 0; ok && i < 3; i++) {
        ok = rep->element[i]->type == REDIS_REPLY_INTEGER;
        if (ok)
            out[i] = rep->element[i]->integer;
    }
    if (!ok)
        snprintf(err, errlen, "EVAL reconcile %s: %s", stock,
                 rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    freeReplyObject(rep);
    return ok ? CS_OK : CS_ERR;
}

int reconcile_activity(struct mconn *mc, struct rconn *rc, int64_t id, int guard_s,
                       struct reconcile_result *res, char *err, size_t errlen)
{
    struct lock_row row = {0};
    struct mval p[] = {MV_INT(guard_s), MV_INT(id)};
    long long out[3];

    memset(res, 0, sizeof(*res));
    if (mconn_begin(mc) != CS_OK
        || mconn_query(mc, SQL_LOCK, p, (int)CS_ARRAY_LEN(p), lock_row_cb, &row) != CS_OK) {
        snprintf(err, errlen, "MySQL: %s", mc->errstr);
        mconn_rollback(mc);
        return CS_ERR;
    }
    res->total = row.total;
    if (!row.found)
        res->outcome = RECONCILE_NO_SUCH;
    else if (row.status == 4)
        res->outcome = RECONCILE_VOIDED;
    else if (row.ended || row.status == 3)
        res->outcome = RECONCILE_ENDED;
    else if (row.recent)
        res->outcome = RECONCILE_BUSY;
    if (res->outcome != RECONCILE_DONE) {
        mconn_rollback(mc);
        return CS_OK;
    }
    /* Under the row lock: no update commits a new total meanwhile. */
    int rc_ok = reconcile_script(rc, id, row.total, out, err, errlen);
    mconn_rollback(mc);        /* nothing was written in MySQL: release the lock */
    if (rc_ok != CS_OK)
        return CS_ERR;
    if (out[0] == SCRIPT_RECONCILE_NO_STOCK) {
        res->outcome = RECONCILE_NOT_PREHEATED;
    } else if (out[0] == SCRIPT_RECONCILE_VOIDED) {
        res->outcome = RECONCILE_VOIDED;
    } else {
        res->before = out[0];
        res->after = out[1];
        res->sold = out[2];
    }
    return CS_OK;
}
