/* schema.c - the schema version check against schema_migration (schema.h). */
#include "schema.h"
#include "cs.h"
#include "log.h"
#include "mconn.h"

#include <ctype.h>
#include <errno.h>
#include <mysqld_error.h>
#include <stdio.h>
#include <string.h>

#define SQL_SCHEMA_VERSIONS "SELECT version FROM schema_migration"

int schema_number(const char *name)
{
    const char *slash = strrchr(name, '/');
    const char *p = slash != NULL ? slash + 1 : name;
    long n = 0;

    if (!isdigit((unsigned char)*p))
        return -1;
    for (; isdigit((unsigned char)*p); p++) {
        n = n * 10 + (*p - '0');
        if (n > 1000000)
            return -1;
    }
    return *p == '_' ? (int)n : -1;
}

/* Reads every version of schema_migration: recorded[n] for 1..max_known,
 * *newest the highest number seen (newest_name its name). */
static int schema_read(MYSQL *my, unsigned char *recorded, int *newest, char *newest_name,
                       size_t namelen, char *msg, size_t msglen)
{
    MYSQL_STMT *st = mysql_stmt_init(my);
    char ver[65];
    unsigned long len = 0;
    my_bool isnull = 0;
    MYSQL_BIND out;
    int rc = SCHEMA_ERROR;

    if (st == NULL) {
        snprintf(msg, msglen, "mysql_stmt_init() failed: %s", mysql_error(my));
        return SCHEMA_ERROR;
    }
    if (mysql_stmt_prepare(st, SQL_SCHEMA_VERSIONS, strlen(SQL_SCHEMA_VERSIONS)) != 0) {
        if (mysql_stmt_errno(st) == ER_NO_SUCH_TABLE) {
            snprintf(msg, msglen, "the database has no schema_migration table: no migration was "
                     "applied; run \"%s\"", CS_SCHEMA_MIGRATE_CMD);
            rc = SCHEMA_OLDER;
        } else {
            snprintf(msg, msglen, "reading schema_migration: mysql_stmt_prepare() failed: %s",
                     mysql_stmt_error(st));
        }
        goto out;
    }
    memset(&out, 0, sizeof(out));
    out.buffer_type = MYSQL_TYPE_STRING;
    out.buffer = ver;
    out.buffer_length = sizeof(ver) - 1;
    out.length = &len;
    out.is_null = &isnull;
    if (mysql_stmt_execute(st) != 0 || mysql_stmt_bind_result(st, &out) != 0) {
        snprintf(msg, msglen, "reading schema_migration: %s", mysql_stmt_error(st));
        goto out;
    }
    for (;;) {
        int f = mysql_stmt_fetch(st);
        if (f == MYSQL_NO_DATA)
            break;
        if (f == 1) {
            snprintf(msg, msglen, "reading schema_migration: mysql_stmt_fetch() failed: %s",
                     mysql_stmt_error(st));
            goto out;
        }
        if (isnull)
            continue;
        ver[len < sizeof(ver) - 1 ? len : sizeof(ver) - 1] = '\0';
        int n = schema_number(ver);
        if (n < 0)
            continue;
        if (n <= CS_SCHEMA_VERSION)
            recorded[n] = 1;
        if (n > *newest) {
            *newest = n;
            snprintf(newest_name, namelen, "%s", ver);
        }
    }
    rc = SCHEMA_OK;
out:
    mysql_stmt_close(st);
    return rc;
}

enum schema_state schema_check(MYSQL *my, int *have, char *msg, size_t msglen)
{
    unsigned char recorded[CS_SCHEMA_VERSION + 1] = {0};
    char newest_name[65] = "";
    int newest = 0, upto = 0;

    msg[0] = '\0';
    if (have != NULL)
        *have = 0;
    int rc = schema_read(my, recorded, &newest, newest_name, sizeof(newest_name), msg, msglen);
    if (rc != SCHEMA_OK)
        return (enum schema_state)rc;
    while (upto < CS_SCHEMA_VERSION && recorded[upto + 1])
        upto++;
    if (have != NULL)
        *have = upto;
    if (newest > CS_SCHEMA_VERSION) {
        snprintf(msg, msglen, "the database schema is newer than this build knows: "
                 "schema_migration holds '%s', this build knows up to %03d; install the "
                 "couponseize version that migrated it", newest_name, CS_SCHEMA_VERSION);
        return SCHEMA_NEWER;
    }
    if (upto < CS_SCHEMA_VERSION) {
        snprintf(msg, msglen, "the database schema is older than this build: migration %03d "
                 "is not recorded in schema_migration (this build needs 001..%03d); run \"%s\"",
                 upto + 1, CS_SCHEMA_VERSION, CS_SCHEMA_MIGRATE_CMD);
        return SCHEMA_OLDER;
    }
    return SCHEMA_OK;
}

int schema_check_start(const struct cs_conf *conf)
{
    struct mconn *mc = mconn_new(conf);
    char msg[512];
    int have = 0, rc = CS_OK;

    if (mconn_ensure(mc) != CS_OK) {
        log_warn("schema not checked: MySQL cannot be reached now (%s); it is checked at the "
                 "next start", mc->errstr);
        goto out;
    }
    switch (schema_check(mc->my, &have, msg, sizeof(msg))) {
    case SCHEMA_OK:
        log_info("database schema %03d, as this build expects", have);
        break;
    case SCHEMA_OLDER:
    case SCHEMA_NEWER:
        log_error("refusing to start: %s", msg);
        rc = CS_ERR;
        break;
    case SCHEMA_ERROR:
        log_warn("schema not checked: %s%s", msg,
                 mconn_err_is_denied_errno(mysql_errno(mc->my))
                     ? " (the MySQL user lacks SELECT on schema_migration: see the grant in "
                       "doc/operations.md)"
                     : "");
        break;
    }
out:
    mconn_free(mc);
    return rc;
}
