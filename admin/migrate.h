/* migrate.h - couponseize-admin migrate: the SQL files of sql/ that the
 * database has not recorded in schema_migration, applied in order. */
#ifndef CS_ADMIN_MIGRATE_H
#define CS_ADMIN_MIGRATE_H

#include <stddef.h>

struct cs_conf;

/* The schema this build knows: the number of its newest sql/NNN_*.sql.
 * lib/schema.h (CS_SCHEMA_VERSION), where the daemons check the schema at
 * start, is the one place for it when present; this is the fallback. */
#if defined(__has_include)
#if __has_include("schema.h")
#include "schema.h"
#endif
#endif
#ifndef CS_SCHEMA_VERSION
#define CS_SCHEMA_VERSION 7
#endif

#ifndef CS_DEFAULT_SQLDIR
#define CS_DEFAULT_SQLDIR "/usr/share/couponseize/sql"
#endif

enum migrate_result {
    MIGRATE_OK,          /* applied what was missing, or nothing was */
    MIGRATE_NEWER,       /* the database records a schema newer than CS_SCHEMA_VERSION */
    MIGRATE_DB_ERROR,    /* cannot connect, or a file failed (the message names it) */
    MIGRATE_FILES_ERROR, /* the SQL directory is unreadable or lacks a file */
};

struct migrate_opts {
    const char *sql_dir;
    const char *db_user;           /* NULL: the invoking system user, as mariadb(1) */
    const char *db_password_file;  /* NULL: no password (unix_socket authentication) */
    const char *db_socket;         /* NULL: as the configuration says */
    const char *db_name;           /* NULL: mysql.database */
    int dry_run;
};

/* What migrate_run() did, for the caller to print. */
struct migrate_report {
    char applied[64][64];      /* versions applied (or, dry run, to apply), in order */
    int napplied;
    int db_version;            /* the newest recorded version's number after the run */
    char db_newest[64];        /* and its name */
    char msg[2048];            /* what went wrong, when it did */
};

/* Connects as opts and conf say, takes a named lock (GET_LOCK) so that two
 * runs never interleave, and applies every sql file numbered up to
 * CS_SCHEMA_VERSION whose version is not in schema_migration, recording
 * each after it ran. Refuses (MIGRATE_NEWER, nothing done) a database that
 * records a version past CS_SCHEMA_VERSION. */
enum migrate_result migrate_run(const struct cs_conf *conf, const struct migrate_opts *opts,
                                struct migrate_report *rep);

#endif
