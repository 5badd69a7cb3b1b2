/* migrate.c - applies the SQL files of sql/ a database has not recorded in
 * schema_migration (each file records itself there as well), in order. */
#include "migrate.h"
#include "conf.h"
#include "cs.h"
#include "mconn.h"

#include <dirent.h>
#include <errno.h>
#include <pwd.h>
#include <mysqld_error.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIGRATE_MAX_FILES 64
#define MIGRATE_MAX_SQL (4 * 1024 * 1024)
#define MIGRATE_LOCK_S 30
#define MIGRATE_TIMEOUT_S 600

struct sqlfile {
    char version[64];   /* "001_schema" */
    int number;         /* 1 */
};

/* Whether name is "NNN_word.sql"; fills f. */
static int sqlfile_parse(const char *name, struct sqlfile *f)
{
    size_t n = strlen(name), d = strspn(name, "0123456789");
    if (d < 1 || d > 6 || name[d] != '_' || n < d + 6 || n - 4 >= sizeof(f->version)
        || strcmp(name + n - 4, ".sql") != 0)
        return CS_ERR;
    for (size_t i = d + 1; i < n - 4; i++)
        if (!(name[i] == '_' || name[i] == '-' || (name[i] >= 'a' && name[i] <= 'z')
              || (name[i] >= 'A' && name[i] <= 'Z') || (name[i] >= '0' && name[i] <= '9')))
            return CS_ERR;
    memcpy(f->version, name, n - 4);
    f->version[n - 4] = '\0';
    f->number = atoi(name);
    return CS_OK;
}

static int sqlfile_cmp(const void *a, const void *b)
{
    const struct sqlfile *x = a, *y = b;
    return x->number != y->number ? (x->number < y->number ? -1 : 1)
                                  : strcmp(x->version, y->version);
}

/* The migration files of dir, in order. Their count, or -1 (rep->msg set). */
static int list_files(const char *dir, struct sqlfile *files, struct migrate_report *rep)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;

    if (d == NULL) {
        snprintf(rep->msg, sizeof(rep->msg), "opendir(%s) failed: %s", dir, strerror(errno));
        return -1;
    }
    while ((e = readdir(d)) != NULL) {
        if (sqlfile_parse(e->d_name, &files[n]) != CS_OK)
            continue;
        if (++n == MIGRATE_MAX_FILES)
            break;
    }
    closedir(d);
    qsort(files, (size_t)n, sizeof(*files), sqlfile_cmp);
    return n;
}

/* Recorded versions, as read by applied_row(). */
struct applied {
    char (*v)[64];
    int n, cap;
};

static int applied_row(void *arg, int ncols, char **cols)
{
    struct applied *a = arg;
    if (ncols < 1 || cols[0] == NULL || a->n == a->cap)
        return CS_OK;
    snprintf(a->v[a->n++], sizeof(a->v[0]), "%s", cols[0]);
    return CS_OK;
}

static int applied_has(const struct applied *a, const char *version)
{
    for (int i = 0; i < a->n; i++)
        if (strcmp(a->v[i], version) == 0)
            return 1;
    return 0;
}

/* The newest recorded version (by its number) into rep. */
static void applied_newest(const struct applied *a, struct migrate_report *rep)
{
    rep->db_version = 0;
    rep->db_newest[0] = '\0';
    for (int i = 0; i < a->n; i++) {
        int num = atoi(a->v[i]);
        if (num > rep->db_version || (num == rep->db_version && rep->db_newest[0] == '\0')) {
            rep->db_version = num;
            snprintf(rep->db_newest, sizeof(rep->db_newest), "%s", a->v[i]);
        }
    }
}

/* Reads every recorded version; a database without the table has none. */
static int read_applied(struct mconn *mc, struct applied *a, struct migrate_report *rep)
{
    a->n = 0;
    if (mconn_query(mc, "SELECT version FROM schema_migration", NULL, 0, applied_row, a)
        == CS_OK)
        return CS_OK;
    if (mc->err == ER_NO_SUCH_TABLE)
        return CS_OK;
    snprintf(rep->msg, sizeof(rep->msg), "reading schema_migration failed: %s", mc->errstr);
    return CS_ERR;
}

static char *read_file(const char *path, struct migrate_report *rep)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(rep->msg, sizeof(rep->msg), "fopen(%.1000s) failed: %s", path, strerror(errno));
        return NULL;
    }
    char *s = xmalloc(MIGRATE_MAX_SQL + 1);
    size_t n = fread(s, 1, MIGRATE_MAX_SQL + 1, f);
    int bad = ferror(f) || n > MIGRATE_MAX_SQL;
    fclose(f);
    if (bad) {
        snprintf(rep->msg, sizeof(rep->msg), "reading %.1000s failed (or it is over %d bytes)", path,
                 MIGRATE_MAX_SQL);
        free(s);
        return NULL;
    }
    s[n] = '\0';
    return s;
}

/* Runs the statements of one file, as the mariadb client would: they are
 * the package's own text, not built from input, so they go as they are. */
static int run_file(struct mconn *mc, const char *dir, const struct sqlfile *f,
                    struct migrate_report *rep)
{
    char path[1024];
    snprintf(path, sizeof(path), "%.900s/%.63s.sql", dir, f->version);
    char *sql = read_file(path, rep);
    if (sql == NULL)
        return CS_ERR;
    MYSQL *my = mc->my;
    int rc = mysql_real_query(my, sql, strlen(sql));
    int stmt = 1;
    while (rc == 0) {
        MYSQL_RES *res = mysql_store_result(my);
        if (res != NULL)
            mysql_free_result(res);
        int next = mysql_next_result(my);
        if (next == -1)
            break;
        stmt++;
        rc = next;
    }
    free(sql);
    if (rc != 0) {
        snprintf(rep->msg, sizeof(rep->msg), "%.1000s: statement %d failed: %.800s (%u)", path, stmt,
                 mysql_error(my), mysql_errno(my));
        mconn_drop(mc);
        return CS_ERR;
    }
    struct mval v = MV_TXT(f->version, strlen(f->version));
    if (mconn_exec(mc, "INSERT IGNORE INTO schema_migration (version) VALUES (?)", &v, 1, NULL)
        != CS_OK) {
        snprintf(rep->msg, sizeof(rep->msg), "%.1000s ran, recording it failed: %s", path,
                 mc->errstr);
        return CS_ERR;
    }
    return CS_OK;
}

/* Reads the password file: its first line. NULL (rep->msg set) on error. */
static char *read_password(const char *path, struct migrate_report *rep)
{
    FILE *f = fopen(path, "r");
    char line[512];
    if (f == NULL) {
        snprintf(rep->msg, sizeof(rep->msg), "fopen(%.1000s) failed: %s", path, strerror(errno));
        return NULL;
    }
    if (fgets(line, sizeof(line), f) == NULL)
        line[0] = '\0';
    fclose(f);
    line[strcspn(line, "\r\n")] = '\0';
    char *p = xstrdup(line);
    explicit_bzero(line, sizeof(line));
    return p;
}

/* Whether host names this machine's loopback. */
static int is_loopback(const char *host)
{
    return host == NULL || host[0] == '\0' || strcmp(host, "localhost") == 0
           || strncmp(host, "127.", 4) == 0 || strcmp(host, "::1") == 0;
}

/* Lock or unlock the named lock of migrations on mc. */
static int migrate_lock(struct mconn *mc, int take, struct migrate_report *rep)
{
    struct applied got = {.v = (char(*)[64])xmalloc(64), .cap = 1};
    int rc;
    if (take)
        rc = mconn_query(mc, "SELECT GET_LOCK('couponseize-migrate', 30)", NULL, 0, applied_row,
                         &got);
    else
        rc = mconn_query(mc, "SELECT RELEASE_LOCK('couponseize-migrate')", NULL, 0, applied_row,
                         &got);
    if (take && (rc != CS_OK || got.n != 1 || strcmp(got.v[0], "1") != 0)) {
        snprintf(rep->msg, sizeof(rep->msg), "another migrate holds the lock for over %d s%s%s",
                 MIGRATE_LOCK_S, rc != CS_OK ? ": " : "", rc != CS_OK ? mc->errstr : "");
        rc = CS_ERR;
    }
    free(got.v);
    return rc;
}

enum migrate_result migrate_run(const struct cs_conf *conf, const struct migrate_opts *opts,
                                struct migrate_report *rep)
{
    struct sqlfile files[MIGRATE_MAX_FILES];
    struct cs_conf c = *conf;   /* a shallow copy with the DBA's account */
    struct applied a = {.v = (char(*)[64])xmalloc(256 * 64), .cap = 256};
    enum migrate_result res = MIGRATE_DB_ERROR;
    char *password = NULL;
    struct mconn *mc = NULL;
    struct passwd *pw = getpwuid(geteuid());
    char osuser[64] = "root";
    int nfiles, locked = 0;

    memset(rep, 0, sizeof(*rep));
    nfiles = list_files(opts->sql_dir, files, rep);
    if (nfiles < 0 || (nfiles > 0 && files[nfiles - 1].number < CS_SCHEMA_VERSION)
        || nfiles == 0) {
        if (nfiles >= 0)
            snprintf(rep->msg, sizeof(rep->msg), "%s holds migrations up to %d; this build "
                     "needs %d: is it this build's directory?", opts->sql_dir,
                     nfiles > 0 ? files[nfiles - 1].number : 0, CS_SCHEMA_VERSION);
        res = MIGRATE_FILES_ERROR;
        goto out;
    }
    /* The application's account may not create or alter tables. Without
     * --db-user, connect as "sudo mariadb" does: as the invoking system
     * user (root under sudo), no password (unix_socket authentication),
     * over the local server's socket when the configured one is this host. */
    if (pw != NULL)
        snprintf(osuser, sizeof(osuser), "%s", pw->pw_name);
    c.mysql_user = opts->db_user != NULL ? (char *)opts->db_user : osuser;
    c.mysql_password = (char *)"";
    if (opts->db_password_file != NULL) {
        if ((password = read_password(opts->db_password_file, rep)) == NULL)
            goto out;
        c.mysql_password = password;
    }
    if (opts->db_user == NULL && opts->db_socket == NULL && c.mysql_socket[0] == '\0'
        && is_loopback(c.mysql_host))
        c.mysql_host = (char *)"localhost"; /* the client library's default socket */
    if (opts->db_socket != NULL)
        c.mysql_socket = (char *)opts->db_socket;
    if (opts->db_name != NULL)
        c.mysql_database = (char *)opts->db_name;
    /* DDL on a big table outlasts the daemons' short mysql.timeout_s. */
    c.mysql_timeout_s = MIGRATE_TIMEOUT_S;
    mc = mconn_new(&c);
    if (mconn_ensure(mc) != CS_OK) {
        snprintf(rep->msg, sizeof(rep->msg), "connecting to MySQL as %s failed: %s",
                 c.mysql_user, mc->errstr);
        goto out;
    }
    if (mysql_set_server_option(mc->my, MYSQL_OPTION_MULTI_STATEMENTS_ON) != 0) {
        snprintf(rep->msg, sizeof(rep->msg), "mysql_set_server_option() failed: %s",
                 mysql_error(mc->my));
        goto out;
    }
    if (migrate_lock(mc, 1, rep) != CS_OK)
        goto out;
    locked = 1;
    if (read_applied(mc, &a, rep) != CS_OK)
        goto out;
    applied_newest(&a, rep);
    if (rep->db_version > CS_SCHEMA_VERSION) {
        snprintf(rep->msg, sizeof(rep->msg), "the database records schema %s, newer than this "
                 "build knows (%d): upgrade couponseize on this node, do not run old code on "
                 "it", rep->db_newest, CS_SCHEMA_VERSION);
        res = MIGRATE_NEWER;
        goto out;
    }
    for (int i = 0; i < nfiles; i++) {
        if (files[i].number > CS_SCHEMA_VERSION || applied_has(&a, files[i].version))
            continue;
        if (!opts->dry_run && run_file(mc, opts->sql_dir, &files[i], rep) != CS_OK)
            goto out;
        if (rep->napplied < 64)
            snprintf(rep->applied[rep->napplied++], sizeof(rep->applied[0]), "%s",
                     files[i].version);
    }
    if (!opts->dry_run && read_applied(mc, &a, rep) != CS_OK)
        goto out;
    applied_newest(&a, rep);
    res = MIGRATE_OK;
out:
    if (locked && mc->my != NULL)
        migrate_lock(mc, 0, rep);
    if (mc != NULL)
        mconn_free(mc);
    if (password != NULL) {
        explicit_bzero(password, strlen(password));
        free(password);
    }
    free(a.v);
    return res;
}
