/* schema.h - the database schema this build is written for, and the check
 * both daemons (and couponseize-admin migrate) make against schema_migration.
 *
 * The schema's version is the number of the last file in sql/
 * (NNN_name.sql); each file records itself in schema_migration as
 * 'NNN_name'. A database is at version N when every file 001..N is recorded. */
#ifndef CS_SCHEMA_H
#define CS_SCHEMA_H

#include <mysql.h>
#include <stddef.h>

struct cs_conf;

/* The one place the expected version is defined: the number of the last
 * sql/NNN_*.sql this build ships. Bump it with every new migration file
 * (tests/unit checks it against sql/). */
#define CS_SCHEMA_VERSION 7

/* The command that brings a database to this build's schema. */
#define CS_SCHEMA_MIGRATE_CMD "couponseize-admin migrate"

enum schema_state {
    SCHEMA_ERROR = -1, /* schema_migration could not be read (see msg) */
    SCHEMA_OK = 0,     /* every file 001..CS_SCHEMA_VERSION recorded, none newer */
    SCHEMA_OLDER = 1,  /* a file up to CS_SCHEMA_VERSION is missing (or no table) */
    SCHEMA_NEWER = 2,  /* a file past CS_SCHEMA_VERSION is recorded */
};

/* The number NNN of a migration's name ("005_coupon_lifecycle", or a file
 * name "005_coupon_lifecycle.sql", with or without a directory); -1 when
 * the name does not start with digits followed by '_'. */
int schema_number(const char *name);

/* Reads schema_migration on my (connected; one prepared SELECT) and judges
 * it against CS_SCHEMA_VERSION. *have (may be NULL) gets the highest N such
 * that 001..N are all recorded (0: none). msg gets one line for the log
 * that says what is wrong and, for SCHEMA_OLDER, names
 * CS_SCHEMA_MIGRATE_CMD; "" for SCHEMA_OK. A missing schema_migration
 * table is SCHEMA_OLDER; any other failure SCHEMA_ERROR with
 * mysql_errno(my) left for the caller. Allocates nothing it does not free. */
enum schema_state schema_check(MYSQL *my, int *have, char *msg, size_t msglen);

/* At a daemon's start: connects with conf's [mysql] keys and runs
 * schema_check(). CS_ERR when the schema is older or newer (logged as an
 * error naming what to do): the daemon must exit. CS_OK when it matches,
 * and also when MySQL cannot be reached or refuses the SELECT (logged as a
 * warning; the daemon runs and retries MySQL as it always does). */
int schema_check_start(const struct cs_conf *conf);

#endif
