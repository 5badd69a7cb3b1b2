/* conf.c - table-driven loading and validation of couponseize.conf. */
#include "conf.h"
#include "cs.h"
#include "rcluster.h"

#include <dirent.h>
#include <errno.h>
#include <libconfig.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* CT_BOOL is an int 0/1 written true/false; CT_LIST a list of strings
 * ["a", "b"], kept comma-joined (items may not hold commas). */
enum conf_type { CT_INT, CT_STR, CT_BOOL, CT_LIST };

struct conf_key {
    const char *name;   /* "group.key" */
    enum conf_type type;
    size_t off;
    long long min, max; /* CT_INT bounds; CT_STR: min 1 means non-empty required */
    long long idef;
    const char *sdef;
    const char *const *choices; /* CT_STR: allowed values, NULL-terminated */
    int obsolete;       /* read so that an older file loads, then ignored */
};

static const char *const levels[] = {"debug", "info", "notice", "warning", "error", NULL};
static const char *const targets[] = {"stderr", "syslog", NULL};
static const char *const modes[] = {"jwt", "trusted-header", NULL};
static const char *const verifiers[] = {"openssl", "libjwt", NULL};

#define I(n, f, lo, hi, d) {n, CT_INT, offsetof(struct cs_conf, f), lo, hi, d, NULL, NULL, 0}
#define S(n, f, req, d, ch) {n, CT_STR, offsetof(struct cs_conf, f), req, 0, 0, d, ch, 0}
#define B(n, f, d) {n, CT_BOOL, offsetof(struct cs_conf, f), 0, 1, d, NULL, NULL, 0}
#define O(n, f) {n, CT_STR, offsetof(struct cs_conf, f), 0, 0, 0, "", NULL, 1}
#define L(n, f, d) {n, CT_LIST, offsetof(struct cs_conf, f), 0, 0, 0, d, NULL, 0}

static const struct conf_key conf_keys[] = {
    S("log.level", log_level, 1, "info", levels),
    S("log.target", log_target, 1, "stderr", targets),

    S("fcgi.listen", fcgi_listen, 1, "/run/couponseize/fcgi.sock", NULL),
    I("fcgi.workers", fcgi_workers, 1, 512, 4),
    I("fcgi.threads", fcgi_threads, 1, 64, 1),
    I("fcgi.kept_drain_ms", fcgi_kept_drain_ms, 0, 25000, 15000),
    I("fcgi.backlog", fcgi_backlog, 1, 65535, 1024),
    S("fcgi.shm_name", fcgi_shm_name, 1, "/couponseize", NULL),
    /* The seize script is built in; a value is warned of, then ignored. */
    O("fcgi.script", fcgi_script),
    I("fcgi.max_body", fcgi_max_body, 16, 1048576, 1024),

    S("redis.host", redis_host, 1, "127.0.0.1", NULL),
    I("redis.port", redis_port, 0, 65535, 6379),
    S("redis.password", redis_password, 0, "", NULL),
    S("redis.source_addr", redis_source_addr, 0, "", NULL),
    I("redis.connect_timeout_ms", redis_connect_timeout_ms, 1, 60000, 200),
    I("redis.command_timeout_ms", redis_command_timeout_ms, 1, 60000, 200),
    I("redis.breaker_failures", redis_breaker_failures, 1, 1000000, 5),
    I("redis.breaker_open_ms", redis_breaker_open_ms, 10, 600000, 500),
    B("redis.cluster", redis_cluster, 0),
    L("redis.nodes", redis_nodes, ""),
    I("redis.wait_replicas", redis_wait_replicas, 0, 16, 0),
    I("redis.wait_timeout_ms", redis_wait_timeout_ms, 1, 60000, 100),

    I("fallback.budget_ms", fallback_budget_ms, 50, 60000, 1000),
    I("fallback.reserve", fallback_reserve, 0, 100000, 1000),
    I("fallback.lease_ms", fallback_lease_ms, 100, 3600000, 10000),
    S("fallback.journal", fallback_journal, 1, CS_DEFAULT_JOURNAL, NULL),

    S("mysql.host", mysql_host, 0, "127.0.0.1", NULL),
    I("mysql.port", mysql_port, 0, 65535, 3306),
    S("mysql.socket", mysql_socket, 0, "", NULL),
    S("mysql.user", mysql_user, 1, "couponseize", NULL),
    S("mysql.password", mysql_password, 0, "", NULL),
    S("mysql.database", mysql_database, 1, "couponseize", NULL),
    I("mysql.timeout_s", mysql_timeout_s, 1, 3600, 5),

    S("auth.mode", auth_mode, 1, "jwt", modes),
    S("auth.jwt_secret", auth_jwt_secret, 0, "", NULL),
    S("auth.jwt_secret_file", auth_jwt_secret_file, 0, "", NULL),
    S("auth.verifier", auth_verifier, 1, "openssl", verifiers),
    I("auth.leeway_s", auth_leeway_s, 0, 3600, 0),
    S("auth.audience", auth_audience, 0, "", NULL),
    S("auth.issuer", auth_issuer, 0, "", NULL),
    B("auth.user_may_use", auth_user_may_use, 0),

    I("limits.node_rps", limits_node_rps, 0, 100000000, 0),
    I("limits.burst", limits_burst, 0, 100000000, 0),
    I("limits.soldout_recheck_ms", limits_soldout_recheck_ms, 0, 3600000, 1000),
    I("limits.batch_max", limits_batch_max, 1, 256, 1),

    I("cache.size", cache_size, 16, 10000000, 4096),
    I("cache.expire_ms", cache_expire_ms, 10, 86400000, 60000),
    I("cache.refresh_ms", cache_refresh_ms, 10, 86400000, 1000),
    I("cache.stale_ms", cache_stale_ms, 0, 86400000, 600000),

    I("preheat.horizon_days", preheat_horizon_days, 0, 3650, 30),
    I("preheat.interval_s", preheat_interval_s, 1, 86400, 60),
    I("preheat.full_interval_s", preheat_full_interval_s, 1, 604800, 600),

    I("sync.interval_s", sync_interval_s, 1, 86400, 60),
    I("sync.batch", sync_batch, 1, 10000, 500),
    I("sync.threads", sync_threads, 1, 10, 10),
    I("sync.lock_ttl_ms", sync_lock_ttl_ms, 100, 3600000, 30000),
    I("sync.redis_timeout_ms", sync_redis_timeout_ms, 1, 600000, 2000),
    S("sync.metrics_file", sync_metrics_file, 0, "", NULL),
    I("sync.status_interval_s", sync_status_interval_s, 1, 86400, 60),
    I("sync.expire_batch", sync_expire_batch, 1, 100000, 1000),
    I("sync.cleanup_grace_s", sync_cleanup_grace_s, 0, 31536000, 86400),
    I("sync.reconcile_full_s", sync_reconcile_full_s, 1, 604800, 600),
};

#define FIELD(conf, k, T) ((T *)((char *)(conf) + (k)->off))

void conf_defaults(struct cs_conf *conf)
{
    memset(conf, 0, sizeof(*conf));
    for (size_t i = 0; i < CS_ARRAY_LEN(conf_keys); i++) {
        const struct conf_key *k = &conf_keys[i];
        if (k->type == CT_INT || k->type == CT_BOOL)
            *FIELD(conf, k, int) = (int)k->idef;
        else
            *FIELD(conf, k, char *) = xstrdup(k->sdef);
    }
}

void conf_free(struct cs_conf *conf)
{
    for (size_t i = 0; i < CS_ARRAY_LEN(conf_keys); i++) {
        const struct conf_key *k = &conf_keys[i];
        if (k->type == CT_STR || k->type == CT_LIST) {
            free(*FIELD(conf, k, char *));
            *FIELD(conf, k, char *) = NULL;
        }
    }
}

static const struct conf_key *conf_find(const char *name)
{
    for (size_t i = 0; i < CS_ARRAY_LEN(conf_keys); i++)
        if (strcmp(conf_keys[i].name, name) == 0)
            return &conf_keys[i];
    return NULL;
}

/* Rejects settings the table does not know, so a typo never goes unnoticed. */
static int conf_check_unknown(config_setting_t *root, const char *path, char *err, size_t errlen)
{
    int n = config_setting_length(root);
    for (int i = 0; i < n; i++) {
        config_setting_t *g = config_setting_get_elem(root, (unsigned)i);
        const char *gname = config_setting_name(g);
        if (config_setting_type(g) != CONFIG_TYPE_GROUP) {
            snprintf(err, errlen, "%s:%d: '%s' must be a group like %s = { ... };", path,
                     config_setting_source_line(g), gname, gname);
            return CS_ERR;
        }
        int m = config_setting_length(g);
        for (int j = 0; j < m; j++) {
            config_setting_t *s = config_setting_get_elem(g, (unsigned)j);
            char full[128];
            snprintf(full, sizeof(full), "%s.%s", gname, config_setting_name(s));
            if (conf_find(full) == NULL) {
                snprintf(err, errlen, "%s:%d: unknown key '%s'", path,
                         config_setting_source_line(s), full);
                return CS_ERR;
            }
        }
    }
    return CS_OK;
}

/* A list of non-empty strings without commas, joined with ','. */
static int conf_apply_list(struct cs_conf *conf, const struct conf_key *k, config_setting_t *s,
                           const char *path, char *err, size_t errlen)
{
    int line = config_setting_source_line(s);
    int t = config_setting_type(s);
    if (t != CONFIG_TYPE_ARRAY && t != CONFIG_TYPE_LIST) {
        snprintf(err, errlen, "%s:%d: '%s' must be a list of strings like [\"a\", \"b\"]",
                 path, line, k->name);
        return CS_ERR;
    }
    int n = config_setting_length(s);
    size_t cap = 1, len = 0;
    for (int i = 0; i < n; i++) {
        const char *v = config_setting_get_string_elem(s, i);
        if (v == NULL || v[0] == '\0' || strchr(v, ',') != NULL) {
            snprintf(err, errlen, "%s:%d: '%s' item %d must be a non-empty string without ','",
                     path, line, k->name, i + 1);
            return CS_ERR;
        }
        cap += strlen(v) + 1;
    }
    char *joined = xmalloc(cap);
    joined[0] = '\0';
    for (int i = 0; i < n; i++) {
        const char *v = config_setting_get_string_elem(s, i);
        len += (size_t)snprintf(joined + len, cap - len, "%s%s", i ? "," : "", v);
    }
    free(*FIELD(conf, k, char *));
    *FIELD(conf, k, char *) = joined;
    return CS_OK;
}

static int conf_apply(struct cs_conf *conf, const struct conf_key *k, config_setting_t *s,
                      const char *path, char *err, size_t errlen)
{
    int line = config_setting_source_line(s);

    if (k->type == CT_INT) {
        int t = config_setting_type(s);
        if (t != CONFIG_TYPE_INT && t != CONFIG_TYPE_INT64) {
            snprintf(err, errlen, "%s:%d: '%s' must be an integer", path, line, k->name);
            return CS_ERR;
        }
        long long v = config_setting_get_int64(s);
        if (v < k->min || v > k->max) {
            snprintf(err, errlen, "%s:%d: '%s' = %lld is out of range %lld..%lld", path, line,
                     k->name, v, k->min, k->max);
            return CS_ERR;
        }
        *FIELD(conf, k, int) = (int)v;
        return CS_OK;
    }

    if (k->type == CT_BOOL) {
        if (config_setting_type(s) != CONFIG_TYPE_BOOL) {
            snprintf(err, errlen, "%s:%d: '%s' must be true or false", path, line, k->name);
            return CS_ERR;
        }
        *FIELD(conf, k, int) = config_setting_get_bool(s) ? 1 : 0;
        return CS_OK;
    }
    if (k->type == CT_LIST)
        return conf_apply_list(conf, k, s, path, err, errlen);

    const char *v = config_setting_get_string(s);
    if (v == NULL) {
        snprintf(err, errlen, "%s:%d: '%s' must be a string", path, line, k->name);
        return CS_ERR;
    }
    if (k->min && v[0] == '\0') {
        snprintf(err, errlen, "%s:%d: '%s' must not be empty", path, line, k->name);
        return CS_ERR;
    }
    if (k->choices != NULL) {
        const char *const *c;
        for (c = k->choices; *c != NULL; c++)
            if (strcmp(*c, v) == 0)
                break;
        if (*c == NULL) {
            snprintf(err, errlen, "%s:%d: '%s' = \"%s\" is not one of the allowed values", path,
                     line, k->name, v);
            return CS_ERR;
        }
    }
    free(*FIELD(conf, k, char *));
    *FIELD(conf, k, char *) = xstrdup(v);
    return CS_OK;
}

/* The HS256 key from auth.jwt_secret_file into conf->auth_jwt_secret: the
 * file's bytes, one trailing newline (LF or CRLF) removed. CS_OK, or CS_ERR
 * with err naming the file and the reason (never its content). */
static int conf_read_secret(struct cs_conf *conf, const char *path, char *err, size_t errlen)
{
    const char *f = conf->auth_jwt_secret_file;
    char buf[4097];
    size_t n;

    if (conf->auth_jwt_secret[0] != '\0') {
        snprintf(err, errlen, "%s: 'auth.jwt_secret' and 'auth.jwt_secret_file' are both set; "
                 "keep one (set the other to \"\")", path);
        return CS_ERR;
    }
    FILE *fp = fopen(f, "r");
    if (fp == NULL) {
        int e = errno;
        snprintf(err, errlen, "%s: 'auth.jwt_secret_file' = \"%s\": cannot open it: %s%s", path,
                 f, strerror(e),
                 e == EACCES ? " (it must be readable by the daemons' group, e.g. 0640 "
                               "root:couponseize)" : "");
        return CS_ERR;
    }
    n = fread(buf, 1, sizeof(buf), fp);
    int bad = ferror(fp);
    fclose(fp);
    if (bad) {
        snprintf(err, errlen, "%s: 'auth.jwt_secret_file' = \"%s\": cannot read it", path, f);
        return CS_ERR;
    }
    if (n == sizeof(buf)) {
        snprintf(err, errlen, "%s: 'auth.jwt_secret_file' = \"%s\" is longer than %zu bytes",
                 path, f, sizeof(buf) - 1);
        return CS_ERR;
    }
    if (n > 0 && buf[n - 1] == '\n')
        n--;
    if (n > 0 && buf[n - 1] == '\r')
        n--;
    if (memchr(buf, '\0', n) != NULL || memchr(buf, '\n', n) != NULL) {
        snprintf(err, errlen, "%s: 'auth.jwt_secret_file' = \"%s\" must hold the key on one "
                 "line, without NUL bytes", path, f);
        return CS_ERR;
    }
    buf[n] = '\0';
    free(conf->auth_jwt_secret);
    conf->auth_jwt_secret = xstrdup(buf);
    explicit_bzero(buf, sizeof(buf));
    return CS_OK;
}

/* Checks that involve more than one key. */
static int conf_check_cross(const struct cs_conf *conf, const char *path, char *err, size_t errlen)
{
    if (strcmp(conf->auth_mode, "jwt") == 0 && strlen(conf->auth_jwt_secret) < 32) {
        if (conf->auth_jwt_secret_file[0] != '\0')
            snprintf(err, errlen, "%s: the key in 'auth.jwt_secret_file' = \"%s\" must be at "
                     "least 32 characters when auth.mode = \"jwt\"", path,
                     conf->auth_jwt_secret_file);
        else
            snprintf(err, errlen, "%s: 'auth.jwt_secret' (or the file 'auth.jwt_secret_file' "
                     "names) must be at least 32 characters when auth.mode = \"jwt\"", path);
        return CS_ERR;
    }
    /* Each request thread holds a slot of the node's worker registry, and a
     * reload starts the new workers before the old ones leave: twice the
     * node's threads must fit (SHM_MAX_WORKERS, lib/node/shm.h). */
    if (conf->fcgi_workers * conf->fcgi_threads > 512) {
        snprintf(err, errlen, "%s: 'fcgi.workers' x 'fcgi.threads' = %d x %d must be at most "
                 "512", path, conf->fcgi_workers, conf->fcgi_threads);
        return CS_ERR;
    }
    /* Group commit keys its queue entries by process (lib/node/batch.h):
     * a worker with request threads would have many seizes in one entry. */
    if (conf->fcgi_threads > 1 && conf->limits_batch_max > 1) {
        snprintf(err, errlen, "%s: 'limits.batch_max' = %d (group commit) needs 'fcgi.threads' "
                 "= 1; group commit does not work with request threads yet (fcgi.threads = %d)",
                 path, conf->limits_batch_max, conf->fcgi_threads);
        return CS_ERR;
    }
    if (conf->redis_cluster) {
        struct rcluster_range seeds[RCLUSTER_MAX_NODES / 2];
        int n = rcluster_parse_nodes(conf->redis_nodes, seeds, (int)CS_ARRAY_LEN(seeds));
        if (n <= 0) {
            snprintf(err, errlen, "%s: 'redis.nodes' must list 1..%d \"host:port\" seeds when "
                     "redis.cluster = true", path, (int)CS_ARRAY_LEN(seeds));
            return CS_ERR;
        }
    }
    return CS_OK;
}

/* Reads one file and applies the keys it sets over what conf holds. */
static int conf_apply_file(struct cs_conf *conf, const char *path, char *err, size_t errlen)
{
    config_t cfg;
    int rc = CS_ERR;

    config_init(&cfg);
    if (config_read_file(&cfg, path) != CONFIG_TRUE) {
        if (config_error_type(&cfg) == CONFIG_ERR_FILE_IO)
            snprintf(err, errlen, "%s: cannot read the file", path);
        else
            snprintf(err, errlen, "%s:%d: %s", path, config_error_line(&cfg),
                     config_error_text(&cfg));
        goto out;
    }
    if (conf_check_unknown(config_root_setting(&cfg), path, err, errlen) != CS_OK)
        goto out;
    for (size_t i = 0; i < CS_ARRAY_LEN(conf_keys); i++) {
        config_setting_t *s = config_lookup(&cfg, conf_keys[i].name);
        if (s != NULL && conf_apply(conf, &conf_keys[i], s, path, err, errlen) != CS_OK)
            goto out;
    }
    rc = CS_OK;
out:
    config_destroy(&cfg);
    return rc;
}

static int conf_name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The files PATH.d/NAME.conf in name order, applied over PATH: the local
 * settings an admin keeps out of the packaged file. A missing directory is
 * none; one that cannot be read is an error. */
static int conf_apply_dir(struct cs_conf *conf, const char *path, char *err, size_t errlen)
{
    char dir[4096], file[4096 + 256];
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = CS_OK;

    if ((size_t)snprintf(dir, sizeof(dir), "%s.d", path) >= sizeof(dir))
        return CS_OK;
    DIR *d = opendir(dir);
    if (d == NULL) {
        if (errno == ENOENT || errno == ENOTDIR)
            return CS_OK;
        snprintf(err, errlen, "%s: cannot read the directory: %s", dir, strerror(errno));
        return CS_ERR;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        /* NAME.conf only: no hidden files, editor backups or dpkg leftovers. */
        if (e->d_name[0] == '.' || len < 6 || strcmp(e->d_name + len - 5, ".conf") != 0)
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            names = xrealloc(names, cap * sizeof(*names));
        }
        names[n++] = xstrdup(e->d_name);
    }
    closedir(d);
    if (n > 0)
        qsort(names, n, sizeof(*names), conf_name_cmp);
    for (size_t i = 0; i < n; i++) {
        if (rc == CS_OK) {
            snprintf(file, sizeof(file), "%s/%s", dir, names[i]);
            rc = conf_apply_file(conf, file, err, errlen);
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int conf_load(struct cs_conf *conf, const char *path, char *err, size_t errlen)
{
    int rc = CS_ERR;

    conf_defaults(conf);
    if (conf_apply_file(conf, path, err, errlen) != CS_OK
        || conf_apply_dir(conf, path, err, errlen) != CS_OK)
        goto out;
    if (conf->auth_jwt_secret_file[0] != '\0'
        && conf_read_secret(conf, path, err, errlen) != CS_OK)
        goto out;
    if (conf_check_cross(conf, path, err, errlen) != CS_OK)
        goto out;
    rc = CS_OK;
out:
    if (rc != CS_OK)
        conf_free(conf);
    return rc;
}

void conf_dump_keys(void)
{
    for (size_t i = 0; i < CS_ARRAY_LEN(conf_keys); i++) {
        const struct conf_key *k = &conf_keys[i];
        if (k->obsolete)
            continue;
        if (k->type == CT_INT)
            printf("%s int %lld..%lld default %lld\n", k->name, k->min, k->max, k->idef);
        else if (k->type == CT_BOOL)
            printf("%s bool default %s\n", k->name, k->idef ? "true" : "false");
        else if (k->type == CT_LIST)
            printf("%s list of strings default []\n", k->name);
        else
            printf("%s string default \"%s\"\n", k->name, k->sdef);
    }
}
