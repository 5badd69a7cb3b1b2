/* conf.h - the one configuration file both binaries read (libconfig syntax). */
#ifndef CS_CONF_H
#define CS_CONF_H

#include <stddef.h>
#include <stdint.h>

#ifndef CS_DEFAULT_CONF
#define CS_DEFAULT_CONF "/etc/couponseize/couponseize.conf"
#endif
#ifndef CS_DEFAULT_JOURNAL
#define CS_DEFAULT_JOURNAL "/var/lib/couponseize/journal"
#endif

struct cs_conf {
    /* log */
    char *log_level;
    char *log_target;

    /* fcgi */
    char *fcgi_listen;
    int fcgi_workers;
    int fcgi_threads;           /* request threads per worker; 1: one request at a time */
    int fcgi_kept_drain_ms;     /* a stopping worker serves a kept connection this long at most */
    int fcgi_backlog;
    char *fcgi_shm_name;
    char *fcgi_script;          /* obsolete, ignored: the seize script is built in */
    int fcgi_max_body;

    /* redis */
    char *redis_host;
    int redis_port;
    char *redis_password;
    char *redis_source_addr;       /* local address outgoing connections bind, or "" */
    int redis_connect_timeout_ms;
    int redis_command_timeout_ms;
    int redis_breaker_failures;
    int redis_breaker_open_ms;
    int redis_cluster;             /* boolean */
    char *redis_nodes;             /* list of "host:port", stored comma-joined */
    int redis_wait_replicas;
    int redis_wait_timeout_ms;

    /* fallback */
    int fallback_budget_ms;        /* every seize is answered within this */
    int fallback_reserve;          /* coupons per activity per node; 0 = no reserves */
    int fallback_lease_ms;         /* spend only this long after Redis last answered */
    char *fallback_journal;        /* the node's journal directory */

    /* mysql */
    char *mysql_host;
    int mysql_port;
    char *mysql_socket;
    char *mysql_user;
    char *mysql_password;
    char *mysql_database;
    int mysql_timeout_s;

    /* auth */
    char *auth_mode;
    char *auth_jwt_secret;         /* the key, read from auth_jwt_secret_file when set */
    char *auth_jwt_secret_file;    /* "" or a file holding the key on one line */
    char *auth_verifier;
    int auth_leeway_s;
    char *auth_audience;
    char *auth_issuer;
    int auth_user_may_use;         /* boolean: a coupon's owner may use/release it */

    /* limits */
    int limits_node_rps;
    int limits_burst;
    int limits_soldout_recheck_ms;
    int limits_batch_max;      /* seizes of one shard sent in one script call; 1: one each */

    /* cache */
    int cache_size;
    int cache_expire_ms;
    int cache_refresh_ms;
    int cache_stale_ms;

    /* preheat */
    int preheat_horizon_days;
    int preheat_interval_s;
    int preheat_full_interval_s;   /* a full preheat pass at least this often */

    /* sync */
    int sync_interval_s;
    int sync_batch;
    int sync_threads;
    int sync_lock_ttl_ms;
    int sync_redis_timeout_ms;
    char *sync_metrics_file;
    int sync_status_interval_s;
    int sync_reconcile_full_s;     /* reconcile every open sale at least this often */
    int sync_expire_batch;
    int sync_cleanup_grace_s;
};

/* Loads and validates PATH into *conf in one pass, then the files
 * PATH.d/NAME.conf in name order (if that directory exists), each setting
 * keys over what came before: the packaged file stays as shipped and an
 * admin's settings live in PATH.d. Every key has a default; a
 * key that is unknown, of the wrong type or out of bounds is an error. On
 * error returns CS_ERR and writes a message naming the file, line and key into
 * err. On success the caller owns *conf and frees it with conf_free(). */
int conf_load(struct cs_conf *conf, const char *path, char *err, size_t errlen);

/* Fills *conf with the built-in defaults. */
void conf_defaults(struct cs_conf *conf);

void conf_free(struct cs_conf *conf);

/* Prints every key with its type, bounds and default (for documentation). */
void conf_dump_keys(void);

#endif
