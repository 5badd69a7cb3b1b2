/* out.h - couponseize-admin's exit statuses and its human output of the
 * admin API's answers. */
#ifndef CS_ADMIN_OUT_H
#define CS_ADMIN_OUT_H

#include <cjson/cJSON.h>
#include <stdio.h>

/* Exit statuses, by outcome (couponseize-admin(8), EXIT STATUS). */
enum admin_exit {
    ADMIN_EXIT_OK = 0,
    ADMIN_EXIT_ERROR = 1,        /* an answer no other status covers (500), a failure of the tool */
    ADMIN_EXIT_USAGE = 2,        /* a bad command line */
    ADMIN_EXIT_NOT_FOUND = 3,    /* 404: no such activity, no open reserve */
    ADMIN_EXIT_CONFLICT = 4,     /* 409: ended, voided, lease not expired, key in use */
    ADMIN_EXIT_INVALID = 5,      /* 400, 413, 415, 422: the API refused what was sent */
    ADMIN_EXIT_DENIED = 6,       /* 401, 403: token refused (another key?), or the ACL */
    ADMIN_EXIT_UNAVAILABLE = 7,  /* 429, 502, 503, 504: not done now; a repeat is safe */
    ADMIN_EXIT_NO_ANSWER = 8,    /* no connection or no answer: the outcome is not known */
    ADMIN_EXIT_CONFIG = 9,       /* the configuration (or the key) cannot be read */
    ADMIN_EXIT_SCHEMA_NEWER = 10, /* migrate: the database is newer than this build */
    ADMIN_EXIT_DB = 11,          /* migrate: MySQL refused, or an SQL file failed */
};

/* The exit status for an answer of HTTP status. */
int out_exit_for(int status);

/* Prints an answer for people: its msg, then its members as "key: value"
 * lines, nested objects indented, arrays of objects as a table (the
 * columns that matter for activities and reserves, every scalar member of
 * the first row for others). */
void out_human(FILE *f, const cJSON *root);

/* The same without the msg line (code, msg and now left out). */
void out_members(FILE *f, const cJSON *root);

#endif
