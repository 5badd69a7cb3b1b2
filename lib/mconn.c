/* mconn.c - MySQL connection wrapper: prepared statements, explicit reconnect. */
#include "mconn.h"
#include "conf.h"
#include "cs.h"
#include "log.h"

#include <errmsg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Enough for VARCHAR(255) of utf8mb4 (1020 bytes), the widest text column read. */
#define MCONN_COL_BUF 1024

struct mconn *mconn_new(const struct cs_conf *conf)
{
    struct mconn *mc = xcalloc(1, sizeof(*mc));
    mc->host = xstrdup(conf->mysql_host);
    mc->socket = xstrdup(conf->mysql_socket);
    mc->user = xstrdup(conf->mysql_user);
    mc->password = xstrdup(conf->mysql_password);
    mc->database = xstrdup(conf->mysql_database);
    mc->port = conf->mysql_port;
    mc->timeout_s = conf->mysql_timeout_s;
    return mc;
}

void mconn_free(struct mconn *mc)
{
    if (mc == NULL)
        return;
    mconn_drop(mc);
    free(mc->host);
    free(mc->socket);
    free(mc->user);
    free(mc->password);
    free(mc->database);
    free(mc);
}

void mconn_drop(struct mconn *mc)
{
    for (int i = 0; i < mc->nstmts; i++)
        mysql_stmt_close(mc->stmts[i].stmt);
    mc->nstmts = 0;
    if (mc->my != NULL) {
        mysql_close(mc->my);
        mc->my = NULL;
    }
}

void mconn_set_err(struct mconn *mc, unsigned err, const char *what, const char *why)
{
    mc->err = err;
    /* A refusal by privilege is no outage: say so in every log line that
     * carries errstr, so the admin fixes the grant instead of MySQL. */
    if (mconn_err_is_denied_errno(err))
        snprintf(mc->errstr, sizeof(mc->errstr), "%s refused, a privilege is missing: %s "
                 "(grant: doc/operations.md)", what, why);
    else
        snprintf(mc->errstr, sizeof(mc->errstr), "%s failed: %s", what, why);
}

int mconn_err_is_denied_errno(unsigned err)
{
    switch (err) {
    case 1044: /* ER_DBACCESS_DENIED_ERROR */
    case 1045: /* ER_ACCESS_DENIED_ERROR: the user or password is refused */
    case 1142: /* ER_TABLEACCESS_DENIED_ERROR */
    case 1143: /* ER_COLUMNACCESS_DENIED_ERROR */
    case 1227: /* ER_SPECIFIC_ACCESS_DENIED_ERROR */
    case 1370: /* ER_PROCACCESS_DENIED_ERROR */
        return 1;
    default:
        return 0;
    }
}

int mconn_err_is_denied(const struct mconn *mc)
{
    return mconn_err_is_denied_errno(mc->err);
}

int mconn_err_is_conn(const struct mconn *mc)
{
    switch (mc->err) {
    case CR_SERVER_GONE_ERROR:
    case CR_SERVER_LOST:
    case CR_CONNECTION_ERROR:
    case CR_CONN_HOST_ERROR:
    case CR_SERVER_LOST_EXTENDED:
    case CR_COMMANDS_OUT_OF_SYNC:
    case 1053: /* ER_SERVER_SHUTDOWN */
    case 1927: /* ER_CONNECTION_KILLED */
        return 1;
    default:
        return mc->my == NULL;
    }
}

int mconn_ensure(struct mconn *mc)
{
    if (mc->my != NULL)
        return CS_OK;

    MYSQL *my = mysql_init(NULL);
    if (my == NULL) {
        mconn_set_err(mc, CR_OUT_OF_MEMORY, "mysql_init()", "out of memory");
        return CS_ERR;
    }
    unsigned t = (unsigned)mc->timeout_s;
    mysql_options(my, MYSQL_OPT_CONNECT_TIMEOUT, &t);
    mysql_options(my, MYSQL_OPT_READ_TIMEOUT, &t);
    mysql_options(my, MYSQL_OPT_WRITE_TIMEOUT, &t);
    mysql_options(my, MYSQL_SET_CHARSET_NAME, "utf8mb4");
    const char *sock = mc->socket[0] ? mc->socket : NULL;
    const char *host = sock ? "localhost" : mc->host;
    if (mysql_real_connect(my, host, mc->user, mc->password, mc->database,
                           (unsigned)mc->port, sock, 0) == NULL) {
        mconn_set_err(mc, mysql_errno(my), "mysql_real_connect()", mysql_error(my));
        mysql_close(my);
        return CS_ERR;
    }
    mc->my = my;
    mc->err = 0;
    mc->errstr[0] = '\0';
    /* Times are the database's local time; sessions use the server's zone. */
    return CS_OK;
}

/* Fails the call; a connection-level error also drops the connection. */
static int mconn_fail_stmt(struct mconn *mc, MYSQL_STMT *st, const char *what)
{
    mconn_set_err(mc, mysql_stmt_errno(st), what, mysql_stmt_error(st));
    if (mconn_err_is_conn(mc))
        mconn_drop(mc);
    return CS_ERR;
}

static MYSQL_STMT *mconn_stmt(struct mconn *mc, const char *sql)
{
    if (mconn_ensure(mc) != CS_OK)
        return NULL;
    for (int i = 0; i < mc->nstmts; i++)
        if (mc->stmts[i].sql == sql)
            return mc->stmts[i].stmt;

    MYSQL_STMT *st = mysql_stmt_init(mc->my);
    if (st == NULL) {
        mconn_set_err(mc, mysql_errno(mc->my), "mysql_stmt_init()", mysql_error(mc->my));
        return NULL;
    }
    if (mysql_stmt_prepare(st, sql, strlen(sql)) != 0) {
        mconn_fail_stmt(mc, st, "mysql_stmt_prepare()");
        mysql_stmt_close(st);
        return NULL;
    }
    if (mc->nstmts == MCONN_MAX_STMTS) {
        /* Cache full: evict the oldest. Callers use a handful of fixed SQL texts. */
        mysql_stmt_close(mc->stmts[0].stmt);
        memmove(&mc->stmts[0], &mc->stmts[1], sizeof(mc->stmts[0]) * (MCONN_MAX_STMTS - 1));
        mc->nstmts--;
    }
    mc->stmts[mc->nstmts].sql = sql;
    mc->stmts[mc->nstmts].stmt = st;
    mc->nstmts++;
    return st;
}

int mconn_prepare(struct mconn *mc, const char *sql)
{
    return mconn_stmt(mc, sql) != NULL ? CS_OK : CS_ERR;
}

static int mconn_bind_exec(struct mconn *mc, MYSQL_STMT *st, const struct mval *p, int n)
{
    /* Multi-row INSERTs bind thousands of parameters: the heap takes over
     * past what the stack array holds. */
    MYSQL_BIND stack_b[64], *b = stack_b;
    if ((unsigned long)n != mysql_stmt_param_count(st)) {
        mconn_set_err(mc, 0, "mconn_bind_exec()", "parameter count mismatch");
        return CS_ERR;
    }
    if (n > (int)CS_ARRAY_LEN(stack_b))
        b = xcalloc((size_t)n, sizeof(*b));
    else
        memset(b, 0, sizeof(b[0]) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) {
        switch (p[i].t) {
        case MV_NULL:
            b[i].buffer_type = MYSQL_TYPE_NULL;
            break;
        case MV_I64:
            b[i].buffer_type = MYSQL_TYPE_LONGLONG;
            b[i].buffer = (void *)&p[i].i;
            break;
        case MV_DOUBLE:
            b[i].buffer_type = MYSQL_TYPE_DOUBLE;
            b[i].buffer = (void *)&p[i].d;
            break;
        case MV_STR:
            b[i].buffer_type = MYSQL_TYPE_STRING;
            b[i].buffer = (void *)p[i].s;
            b[i].buffer_length = p[i].len;
            b[i].length = (unsigned long *)&p[i].len;
            break;
        }
    }
    int bound = n == 0 || mysql_stmt_bind_param(st, b) == 0;
    if (b != stack_b)
        free(b); /* mysql_stmt_bind_param() copied the array */
    if (!bound)
        return mconn_fail_stmt(mc, st, "mysql_stmt_bind_param()");
    if (mysql_stmt_execute(st) != 0)
        return mconn_fail_stmt(mc, st, "mysql_stmt_execute()");
    return CS_OK;
}

int mconn_exec(struct mconn *mc, const char *sql, const struct mval *params, int nparams,
               uint64_t *affected)
{
    MYSQL_STMT *st = mconn_stmt(mc, sql);
    if (st == NULL)
        return CS_ERR;
    if (mconn_bind_exec(mc, st, params, nparams) != CS_OK)
        return CS_ERR;
    if (affected != NULL)
        *affected = (uint64_t)mysql_stmt_affected_rows(st);
    return CS_OK;
}

int mconn_query(struct mconn *mc, const char *sql, const struct mval *params, int nparams,
                mconn_row_fn fn, void *arg)
{
    MYSQL_STMT *st = mconn_stmt(mc, sql);
    if (st == NULL)
        return CS_ERR;
    if (mconn_bind_exec(mc, st, params, nparams) != CS_OK)
        return CS_ERR;

    int ncols = (int)mysql_stmt_field_count(st);
    if (ncols > MCONN_MAX_COLS) {
        mysql_stmt_free_result(st);
        mconn_set_err(mc, 0, "mconn_query()", "too many columns");
        return CS_ERR;
    }
    MYSQL_BIND rb[MCONN_MAX_COLS];
    char bufs[MCONN_MAX_COLS][MCONN_COL_BUF];
    unsigned long lens[MCONN_MAX_COLS];
    my_bool nulls[MCONN_MAX_COLS];
    char *cols[MCONN_MAX_COLS];
    memset(rb, 0, sizeof(rb));
    /* Every column is fetched as text; the server converts numbers. */
    for (int i = 0; i < ncols; i++) {
        rb[i].buffer_type = MYSQL_TYPE_STRING;
        rb[i].buffer = bufs[i];
        rb[i].buffer_length = MCONN_COL_BUF - 1;
        rb[i].length = &lens[i];
        rb[i].is_null = &nulls[i];
    }
    if (ncols > 0 && mysql_stmt_bind_result(st, rb) != 0)
        return mconn_fail_stmt(mc, st, "mysql_stmt_bind_result()");

    int rc = CS_OK, f;
    while ((f = mysql_stmt_fetch(st)) == 0 || f == MYSQL_DATA_TRUNCATED) {
        for (int i = 0; i < ncols; i++) {
            /* The client leaves the length of a NULL column unset. */
            if (nulls[i]) {
                cols[i] = NULL;
                continue;
            }
            unsigned long l = lens[i] < MCONN_COL_BUF - 1 ? lens[i] : MCONN_COL_BUF - 1;
            bufs[i][l] = '\0';
            cols[i] = bufs[i];
        }
        if (rc == CS_OK && fn(arg, ncols, cols) != CS_OK)
            rc = CS_ERR; /* keep fetching so the statement is reusable */
    }
    if (f == 1) {
        mysql_stmt_free_result(st);
        return mconn_fail_stmt(mc, st, "mysql_stmt_fetch()");
    }
    mysql_stmt_free_result(st);
    if (rc != CS_OK)
        mconn_set_err(mc, 0, "mconn_query()", "row callback stopped the query");
    return rc;
}

static int mconn_fail_conn(struct mconn *mc, const char *what)
{
    mconn_set_err(mc, mysql_errno(mc->my), what, mysql_error(mc->my));
    if (mconn_err_is_conn(mc))
        mconn_drop(mc);
    return CS_ERR;
}

int mconn_begin(struct mconn *mc)
{
    if (mconn_ensure(mc) != CS_OK)
        return CS_ERR;
    if (mysql_autocommit(mc->my, 0) != 0)
        return mconn_fail_conn(mc, "mysql_autocommit(0)");
    return CS_OK;
}

int mconn_commit(struct mconn *mc)
{
    if (mc->my == NULL) {
        mconn_set_err(mc, CR_SERVER_LOST, "mysql_commit()", "connection lost");
        return CS_ERR;
    }
    if (mysql_commit(mc->my) != 0)
        return mconn_fail_conn(mc, "mysql_commit()");
    mysql_autocommit(mc->my, 1);
    return CS_OK;
}

void mconn_rollback(struct mconn *mc)
{
    if (mc->my == NULL)
        return;
    if (mysql_rollback(mc->my) != 0) {
        mconn_fail_conn(mc, "mysql_rollback()");
        return;
    }
    mysql_autocommit(mc->my, 1);
}
