/* mconn.h - MySQL/MariaDB connection wrapper: prepared statements only,
 * explicit reconnect (never MYSQL_OPT_RECONNECT), utf8mb4.
 *
 * One mconn per thread; never shared. Statements are prepared once per
 * connection and cached by their SQL text pointer (pass string literals). */
#ifndef CS_MCONN_H
#define CS_MCONN_H

#include <mysql.h>
#include <stdint.h>

struct cs_conf;

enum mval_type { MV_NULL, MV_I64, MV_DOUBLE, MV_STR };

/* One statement parameter. */
struct mval {
    enum mval_type t;
    int64_t i;
    double d;
    const char *s;
    unsigned long len;
};

#define MV_INT(v) ((struct mval){.t = MV_I64, .i = (v)})
#define MV_DBL(v) ((struct mval){.t = MV_DOUBLE, .d = (v)})
#define MV_TXT(v, n) ((struct mval){.t = MV_STR, .s = (v), .len = (n)})

#define MCONN_MAX_STMTS 32
#define MCONN_MAX_COLS 16

struct mconn {
    MYSQL *my;
    char *host, *socket, *user, *password, *database;
    int port, timeout_s;
    char errstr[256];          /* sticky message of the last failure */
    unsigned err;              /* mysql error number of the last failure, 0 if none */
    struct {
        const char *sql;
        MYSQL_STMT *stmt;
    } stmts[MCONN_MAX_STMTS];
    int nstmts;
};

/* Called per result row; cols[i] is NUL-terminated (NULL for SQL NULL).
 * Return CS_OK to go on, CS_ERR to stop. */
typedef int (*mconn_row_fn)(void *arg, int ncols, char **cols);

/* Creates an unconnected mconn from the [mysql] keys of conf. */
struct mconn *mconn_new(const struct cs_conf *conf);
void mconn_free(struct mconn *mc);

/* Connects when not connected. CS_OK or CS_ERR with errstr set. */
int mconn_ensure(struct mconn *mc);

/* Sets the sticky error: err (a mysql error number, 0 for one of ours) and
 * "what failed: why". The one writer of mc->err and mc->errstr. */
void mconn_set_err(struct mconn *mc, unsigned err, const char *what, const char *why);

/* Closes the connection and forgets its statements; the next call reconnects. */
void mconn_drop(struct mconn *mc);

/* Prepares SQL on the connection now (connecting first) unless it is
 * cached already, so later calls find it. CS_OK or CS_ERR with errstr set. */
int mconn_prepare(struct mconn *mc, const char *sql);

/* Executes SQL with params; *affected (may be NULL) gets the affected rows.
 * Returns CS_OK or CS_ERR (errstr set; a connection-level error drops the
 * connection so the next call reconnects). */
int mconn_exec(struct mconn *mc, const char *sql, const struct mval *params, int nparams,
               uint64_t *affected);

/* Executes a SELECT with params and calls fn for every row. */
int mconn_query(struct mconn *mc, const char *sql, const struct mval *params, int nparams,
                mconn_row_fn fn, void *arg);

/* Transaction control through the client API. */
int mconn_begin(struct mconn *mc);
int mconn_commit(struct mconn *mc);
void mconn_rollback(struct mconn *mc);

/* True when the last failure was a lost or refused connection. */
int mconn_err_is_conn(const struct mconn *mc);

/* True when the last failure was MySQL refusing for lack of a privilege
 * (ER_TABLEACCESS_DENIED_ERROR and its kin) or refusing the credentials:
 * a configuration error, never an outage. errstr then says so and points
 * at the documented grant. */
int mconn_err_is_denied(const struct mconn *mc);
int mconn_err_is_denied_errno(unsigned err);

#endif
