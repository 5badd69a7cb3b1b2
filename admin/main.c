/* main.c - couponseize-admin: the node's admin command line. Mints a
 * short-lived admin token from the node's configuration and drives the admin
 * API on this node (couponseize-admin(8)); applies migrations. */
#include "client.h"
#include "config.h"
#include "conf.h"
#include "cs.h"
#include "keys.h"
#include "log.h"
#include "migrate.h"
#include "out.h"
#include "token.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define ADMIN_DEFAULT_TTL_S 60
#define ADMIN_DEFAULT_TIMEOUT_S 10
/* Sends of one write with one Idempotency-Key when no answer came: the key
 * makes a repeat answer what the first did and change nothing. */
#define ADMIN_WRITE_TRIES 3

struct opts {
    const char *conf_path, *url, *idem_key;
    int json, ttl_s, timeout_s, page, size, journal_lost;
    int64_t sub;
    struct migrate_opts mig;
    cJSON *fields;          /* create / update members from the options */
};

/* Prints j on one line of stdout (the --json answer). */
static void print_json(const cJSON *j)
{
    char *p = cJSON_PrintUnformatted(j);
    printf("%s\n", p);
    cJSON_free(p);
}

static void usage(FILE *f)
{
    fprintf(f,
        "Usage: couponseize-admin [OPTIONS] VERB [ARGS]\n"
        "Verbs:\n"
        "  create --name N --total K --start TIME --end TIME [fields]   a new sale\n"
        "  update ID [fields]          change a sale (before its start: any field;\n"
        "                              after: only a later --end)\n"
        "  topup ID K                  add K coupons to a sale's stock\n"
        "  preheat                     load sales from MySQL into Redis now\n"
        "  revoke ID                   void a sale: no further seizes, unused coupons voided\n"
        "  reconcile ID                set Redis' stock from MySQL\n"
        "  status [ID]                 one sale, or a page of them (--page, --size)\n"
        "  reserves [ID]               open node reserves (of sale ID)\n"
        "  return ID INCARNATION       return a lost node's reserve of sale ID\n"
        "                              (--journal-lost: its journal is gone for good)\n"
        "  token                       print an admin token (for the operator page)\n"
        "  migrate                     apply the SQL migrations the database lacks\n"
        "  keys ID                     the Redis keys (and fields) that hold sale ID\n"
        "Fields (create, update): --name S --total K --start TIME --end TIME\n"
        "  --validity-days D --coupon-name S --coupon-type 1|2 --amount X --threshold X\n"
        "  --return-on-expiry --eligible-groups G1,G2  (TIME: RFC 3339 with an offset)\n"
        "Options:\n"
        "  -c, --config FILE           configuration (default %s)\n"
        "  -u, --url URL               the admin API: fcgi:/PATH, fcgi://HOST:PORT or\n"
        "                              http://HOST[:PORT] (default: fcgi.listen)\n"
        "  -j, --json                  print the API's answer as JSON\n"
        "      --ttl SECONDS           the token's lifetime (default %d)\n"
        "      --timeout SECONDS       per request (default %d)\n"
        "      --sub ID                the admin id the token carries (default: your uid)\n"
        "      --idempotency-key KEY   for a write (default: a random one per run)\n"
        "      --page P, --size S      status without ID\n"
        "  migrate: --sql-dir DIR (default %s) --db-user USER (default: yours, as\n"
        "      mariadb(1)) --db-password-file FILE --db-socket PATH --db-name NAME --dry-run\n"
        "  -h, --help, -V, --version\n"
        "Exit status: 0 done; 2 usage; 3 not found; 4 conflict; 5 refused as invalid;\n"
        "  6 token or address refused; 7 unavailable (try again); 8 no answer;\n"
        "  9 configuration unreadable; 10 database newer; 11 database error; 1 other.\n",
        CS_DEFAULT_CONF, ADMIN_DEFAULT_TTL_S, ADMIN_DEFAULT_TIMEOUT_S, CS_DEFAULT_SQLDIR);
}

static int die_usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "couponseize-admin: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (couponseize-admin --help)\n");
    return ADMIN_EXIT_USAGE;
}

/* A positive integer option or argument, or -1. */
static int64_t parse_pos(const char *s)
{
    int64_t v;
    return cs_parse_id(s, strlen(s), &v) == CS_OK ? v : -1;
}

/* An Idempotency-Key of 32 hex digits from getrandom(). */
static void random_key(char out[33])
{
    unsigned char r[16];
    size_t got = 0;
    /* Without getrandom() (never on Linux 3.17+), the clock and pid differ
     * per run, which is all a key needs. */
    int64_t seed[2] = {cs_mono_us() ^ cs_now_ms(), (int64_t)getpid()};
    memcpy(r, seed, sizeof(r));
    while (got < sizeof(r)) {
        ssize_t n = getrandom(r + got, sizeof(r) - got, 0);
        if (n > 0)
            got += (size_t)n;
        else if (errno != EINTR)
            break;
    }
    for (size_t i = 0; i < sizeof(r); i++)
        snprintf(out + 2 * i, 3, "%02x", r[i]);
}

/* Sets a create/update member from an option. */
static int add_field(struct opts *o, const char *opt, const char *val)
{
    cJSON *v = NULL;
    int64_t n;

    if (strcmp(opt, "totalNum") == 0 || strcmp(opt, "validityDays") == 0
        || strcmp(opt, "couponType") == 0) {
        if ((n = parse_pos(val)) < 0)
            return die_usage("'%s' is not a positive integer", val);
        v = cJSON_CreateRaw(val);
    } else if (strcmp(opt, "returnOnExpiry") == 0) {
        v = cJSON_CreateTrue();
    } else if (strcmp(opt, "eligibleGroups") == 0) {
        v = cJSON_CreateArray();
        char *copy = xstrdup(val), *save = NULL;
        for (char *g = strtok_r(copy, ",", &save); g; g = strtok_r(NULL, ",", &save))
            cJSON_AddItemToArray(v, cJSON_CreateString(g));
        free(copy);
    } else {
        v = cJSON_CreateString(val);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(o->fields, opt);
    cJSON_AddItemToObject(o->fields, opt, v);
    return ADMIN_EXIT_OK;
}

/* Reads the configuration the daemons read, with their loader: whatever
 * holds auth.jwt_secret for them holds it for this tool. */
static int load_conf(const struct opts *o, struct cs_conf *conf)
{
    char err[1024];
    if (conf_load(conf, o->conf_path, err, sizeof(err)) != CS_OK) {
        fprintf(stderr, "couponseize-admin: %s\n", err);
        if ((access(o->conf_path, R_OK) != 0 && errno == EACCES)
            || strstr(err, "ermission denied") != NULL)
            fprintf(stderr, "couponseize-admin: only root and the group couponseize may read "
                    "it, and so sign admin tokens (try sudo)\n");
        return ADMIN_EXIT_CONFIG;
    }
    return ADMIN_EXIT_OK;
}

/* The API answer's printing and exit status. */
static int report(const struct opts *o, const char *verb, const struct client_resp *r)
{
    cJSON *root = cJSON_ParseWithLength(r->body, r->len);
    int rc = out_exit_for(r->status);

    if (o->json) {
        if (root != NULL) {
            print_json(root);
        } else {
            cJSON *w = cJSON_CreateObject();
            cJSON_AddStringToObject(w, "code", "BAD_ANSWER");
            cJSON_AddNumberToObject(w, "status", r->status);
            cJSON_AddStringToObject(w, "body", r->body);
            print_json(w);
            cJSON_Delete(w);
        }
    } else if (root != NULL && rc == ADMIN_EXIT_OK) {
        out_human(stdout, root);
    } else if (root != NULL) {
        /* One line that says it all, then what else the answer carries. */
        const cJSON *code = cJSON_GetObjectItemCaseSensitive(root, "code");
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(root, "msg");
        fprintf(stderr, "couponseize-admin: %s: %d %s: %s\n", verb, r->status,
                cJSON_IsString(code) ? code->valuestring : "?",
                cJSON_IsString(msg) ? msg->valuestring : "");
        out_members(stderr, root);
    } else {
        fprintf(stderr, "couponseize-admin: %s: %d, not JSON: %.200s\n", verb, r->status,
                r->body);
    }
    if (root == NULL && rc == ADMIN_EXIT_OK)
        rc = ADMIN_EXIT_ERROR;
    cJSON_Delete(root);
    return rc;
}

/* The outcome when no answer came; maybe_done: a write was sent, so it may
 * have been done. */
static int no_answer(const struct opts *o, const char *verb, const char *why, int maybe_done)
{
    fprintf(stderr, "couponseize-admin: %s: %s%s\n", verb, why,
            maybe_done ? "; it may have been done: look with status before you repeat it (a repeat "
                    "with the same --idempotency-key is safe)" : "");
    if (o->json) {
        cJSON *w = cJSON_CreateObject();
        cJSON_AddStringToObject(w, "code", "NO_ANSWER");
        cJSON_AddStringToObject(w, "msg", why);
        print_json(w);
        cJSON_Delete(w);
    }
    return ADMIN_EXIT_NO_ANSWER;
}

/* Sends one admin request with a fresh token and reports the answer. A
 * write is sent again with the same Idempotency-Key when no answer came. */
static int call(const struct opts *o, const struct cs_conf *conf, const char *verb,
                const char *method, const char *path, const char *body)
{
    struct client_target t;
    char err[512], key[33], subs[32];
    const char *url = o->url != NULL ? o->url : conf->fcgi_listen;
    int write = strcmp(method, "GET") != 0, rc;

    if (client_parse(url, &t, err, sizeof(err)) != CS_OK)
        return die_usage("%s", err);
    int64_t sub = token_subject(o->sub);
    snprintf(subs, sizeof(subs), "%lld", (long long)sub);
    struct client_req req = {.method = method, .path = path, .body = body,
                             .timeout_ms = o->timeout_s * 1000};
    int trusted = strcmp(conf->auth_mode, "trusted-header") == 0;
    if (trusted) {
        /* The web server names the caller; on the FastCGI socket this tool
         * is the web server. Through one, there is no way to say who. */
        if (t.kind == CLIENT_HTTP) {
            fprintf(stderr, "couponseize-admin: auth.mode is trusted-header: use the FastCGI "
                    "socket (no --url http://...)\n");
            return ADMIN_EXIT_CONFIG;
        }
        req.user_id = subs;
    }
    if (write) {
        random_key(key);
        req.idem_key = o->idem_key != NULL ? o->idem_key : key;
    }
    struct client_resp resp;
    int sent = 0;
    rc = CS_ERR;
    for (int i = 0; i < (write ? ADMIN_WRITE_TRIES : 1) && rc != CS_OK; i++) {
        /* A token per send, so that a repeat after a long wait is not refused
         * as expired. */
        char *token = NULL;
        if (!trusted && (token = token_mint(conf, sub, o->ttl_s, err, sizeof(err))) == NULL) {
            fprintf(stderr, "couponseize-admin: %s\n", err);
            return ADMIN_EXIT_CONFIG;
        }
        req.token = token;
        rc = client_do(&t, &req, &resp, err, sizeof(err));
        sent |= resp.sent;
        req.token = NULL;
        token_free(token);
    }
    if (rc != CS_OK) {
        if (strstr(err, "Permission denied") != NULL && t.kind == CLIENT_FCGI_UNIX)
            snprintf(err + strlen(err), sizeof(err) - strlen(err),
                     " (the socket is the web server's: run as root)");
        return no_answer(o, verb, err, write && sent);
    }
    rc = report(o, verb, &resp);
    free(resp.body);
    return rc;
}

/* An {"id": ID, ...} body with the id written exactly as given (ids go to
 * 2^63-1, past what a double holds), first, then the members of more (may
 * be NULL). The caller frees it. */
static char *id_body(const char *id, const cJSON *more)
{
    char *rest = more != NULL ? cJSON_PrintUnformatted(more) : NULL;
    size_t n = strlen(id) + (rest ? strlen(rest) : 0) + 16;
    char *s = xmalloc(n);
    if (rest == NULL || strcmp(rest, "{}") == 0)
        snprintf(s, n, "{\"id\":%s}", id);
    else
        snprintf(s, n, "{\"id\":%s,%s", id, rest + 1);
    cJSON_free(rest);
    return s;
}

static int need_args(int argc, int want_min, int want_max, const char *verb)
{
    if (argc < want_min || argc > want_max)
        return die_usage("%s: wrong number of arguments", verb);
    return ADMIN_EXIT_OK;
}

static int need_id(const char *s)
{
    return parse_pos(s) > 0 ? ADMIN_EXIT_OK
                            : die_usage("'%s' is not an id (an integer 1..2^63-1)", s);
}

static int verb_migrate(const struct opts *o, const struct cs_conf *conf)
{
    struct migrate_report rep;
    enum migrate_result r = migrate_run(conf, &o->mig, &rep);
    int rc = r == MIGRATE_OK ? ADMIN_EXIT_OK : r == MIGRATE_NEWER ? ADMIN_EXIT_SCHEMA_NEWER
           : ADMIN_EXIT_DB;

    if (o->json) {
        cJSON *j = cJSON_CreateObject(), *arr = cJSON_CreateArray();
        cJSON_AddStringToObject(j, "code", r == MIGRATE_OK ? "OK" : r == MIGRATE_NEWER
                                ? "SCHEMA_NEWER" : "MIGRATE_FAILED");
        cJSON_AddStringToObject(j, "msg", r == MIGRATE_OK ? (o->mig.dry_run ? "dry run" : "ok")
                                                          : rep.msg);
        for (int i = 0; i < rep.napplied; i++)
            cJSON_AddItemToArray(arr, cJSON_CreateString(rep.applied[i]));
        cJSON_AddItemToObject(j, o->mig.dry_run ? "pending" : "applied", arr);
        cJSON_AddNumberToObject(j, "version", rep.db_version);
        cJSON_AddStringToObject(j, "versionName", rep.db_newest);
        cJSON_AddNumberToObject(j, "known", CS_SCHEMA_VERSION);
        print_json(j);
        cJSON_Delete(j);
    } else {
        for (int i = 0; i < rep.napplied; i++)
            printf("%s %s\n", o->mig.dry_run ? "would apply" : "applied", rep.applied[i]);
        if (r == MIGRATE_OK)
            printf("schema %s%s (this build knows %d)%s\n", rep.db_newest[0] ? rep.db_newest
                   : "(none)", o->mig.dry_run ? " now" : "", CS_SCHEMA_VERSION,
                   rep.napplied == 0 ? ": nothing to do" : "");
    }
    if (r != MIGRATE_OK)
        fprintf(stderr, "couponseize-admin: migrate: %s\n", rep.msg);
    return rc;
}

/*
 * keys ID: where sale ID lives in Redis, one "NAME KEY [FIELD]" line each
 * (doc/internals.md, "Redis keys"; FIELD may name a pattern, "<user>"), spelt by the builders coupon-fcgi and
 * coupon-sync use (lib/keys.c), for redis-cli on call and for the tests.
 * Needs neither the configuration nor a server.
 */
static int verb_keys(const struct opts *o, const char *id_s)
{
    int64_t id = parse_pos(id_s);
    if (id <= 0)
        return die_usage("'%s' is not an id (an integer 1..2^63-1)", id_s);
    int sh = keys_shard(id);
    char k[16][KEYS_MAX], f[16][64];
    const char *name[16];
    int n = 0;

#define KEY_ROW(nm, builder, arg, fmt, ...)                                    \
    do {                                                                       \
        name[n] = nm;                                                          \
        builder(k[n], arg);                                                    \
        snprintf(f[n], sizeof(f[n]), fmt, __VA_ARGS__);                        \
        n++;                                                                   \
    } while (0)
    KEY_ROW("stock", keys_stock, sh, "%lld", (long long)id);
    KEY_ROW("window", keys_window, sh, "%lld", (long long)id);
    KEY_ROW("meta", keys_meta, sh, "%lld", (long long)id);
    KEY_ROW("version", keys_version, sh, "%lld", (long long)id);
    KEY_ROW("ends", keys_ends, sh, "%lld", (long long)id);          /* a sorted set's member */
    KEY_ROW("seized", keys_seize_list, id, "%s", "");
    KEY_ROW("queue", keys_queue, sh, "%lld:<user>", (long long)id);
    KEY_ROW("dead", keys_dead, sh, "%lld:<user>", (long long)id);
    KEY_ROW("sync_lock", keys_sync_lock, sh, "%s", "");
    KEY_ROW("fence", keys_fence, sh, "%s", "");
    KEY_ROW("reserve", keys_reserve, sh, "%lld:held", (long long)id);
    KEY_ROW("reserve_epochs", keys_reserve_epochs, id, "%s", "");
    KEY_ROW("reserve_dead", keys_reserve_dead, sh, "%s", "");
#undef KEY_ROW

    if (o->json) {
        cJSON *j = cJSON_CreateObject(), *keys = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "code", "OK");
        cJSON_AddNumberToObject(j, "id", (double)id);
        cJSON_AddNumberToObject(j, "shard", sh);
        cJSON_AddNumberToObject(j, "slot", keys_shard_slot(sh));
        for (int i = 0; i < n; i++) {
            cJSON *e = cJSON_AddObjectToObject(keys, name[i]);
            cJSON_AddStringToObject(e, "key", k[i]);
            if (f[i][0] != '\0')
                cJSON_AddStringToObject(e, "field", f[i]);
        }
        cJSON_AddItemToObject(j, "keys", keys);
        print_json(j);
        cJSON_Delete(j);
    } else {
        for (int i = 0; i < n; i++)
            printf("%s %s%s%s\n", name[i], k[i], f[i][0] ? " " : "", f[i]);
    }
    return ADMIN_EXIT_OK;
}

/* Runs VERB with its arguments. */
static int run_verb(struct opts *o, const struct cs_conf *conf, const char *verb, int argc,
                    char **argv)
{
    char path[512];
    char *body = NULL;
    int rc;

    if (strcmp(verb, "create") == 0) {
        if ((rc = need_args(argc, 0, 0, verb)) != 0)
            return rc;
        static const char *const required[] = {"name", "totalNum", "distributeStartTime",
                                               "distributeEndTime"};
        for (size_t i = 0; i < CS_ARRAY_LEN(required); i++)
            if (cJSON_GetObjectItemCaseSensitive(o->fields, required[i]) == NULL)
                return die_usage("create needs --name, --total, --start and --end (%s missing)",
                                 required[i]);
        body = cJSON_PrintUnformatted(o->fields);
        rc = call(o, conf, verb, "POST", "/market/admin/coupon/activity", body);
    } else if (strcmp(verb, "update") == 0) {
        if ((rc = need_args(argc, 1, 1, verb)) != 0 || (rc = need_id(argv[0])) != 0)
            return rc;
        if (o->fields->child == NULL)
            return die_usage("%s: say what to change (--end TIME, --total K, ...)", verb);
        body = id_body(argv[0], o->fields);
        rc = call(o, conf, verb, "PUT", "/market/admin/coupon/activity", body);
    } else if (strcmp(verb, "topup") == 0) {
        if ((rc = need_args(argc, 2, 2, verb)) != 0 || (rc = need_id(argv[0])) != 0)
            return rc;
        if (parse_pos(argv[1]) < 0)
            return die_usage("topup: '%s' is not a positive number of coupons", argv[1]);
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToObject(m, "addStock", cJSON_CreateRaw(argv[1]));
        body = id_body(argv[0], m);
        cJSON_Delete(m);
        rc = call(o, conf, verb, "PUT", "/market/admin/coupon/activity", body);
    } else if (strcmp(verb, "preheat") == 0) {
        if ((rc = need_args(argc, 0, 0, verb)) != 0)
            return rc;
        rc = call(o, conf, verb, "POST", "/market/admin/coupon/preheat", NULL);
    } else if (strcmp(verb, "revoke") == 0 || strcmp(verb, "reconcile") == 0) {
        if ((rc = need_args(argc, 1, 1, verb)) != 0 || (rc = need_id(argv[0])) != 0)
            return rc;
        body = id_body(argv[0], NULL);
        snprintf(path, sizeof(path), "/market/admin/coupon/%s", verb);
        rc = call(o, conf, verb, "POST", path, body);
    } else if (strcmp(verb, "status") == 0) {
        if ((rc = need_args(argc, 0, 1, verb)) != 0 || (argc == 1 && (rc = need_id(argv[0]))))
            return rc;
        if (argc == 1)
            snprintf(path, sizeof(path), "/market/admin/coupon/activity?id=%s", argv[0]);
        else
            snprintf(path, sizeof(path), "/market/admin/coupon/activity?page=%d&size=%d",
                     o->page, o->size);
        rc = call(o, conf, verb, "GET", path, NULL);
    } else if (strcmp(verb, "reserves") == 0) {
        if ((rc = need_args(argc, 0, 1, verb)) != 0 || (argc == 1 && (rc = need_id(argv[0]))))
            return rc;
        snprintf(path, sizeof(path), "/market/admin/coupon/reserves%s%s", argc ? "?id=" : "",
                 argc ? argv[0] : "");
        rc = call(o, conf, verb, "GET", path, NULL);
    } else if (strcmp(verb, "return") == 0) {
        if ((rc = need_args(argc, 2, 2, verb)) != 0 || (rc = need_id(argv[0])) != 0)
            return rc;
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "incarnation", argv[1]);
        if (o->journal_lost)
            cJSON_AddTrueToObject(m, "journalLost");
        body = id_body(argv[0], m);
        cJSON_Delete(m);
        rc = call(o, conf, verb, "POST", "/market/admin/coupon/reserve/return", body);
    } else if (strcmp(verb, "token") == 0) {
        char err[512];
        if ((rc = need_args(argc, 0, 0, verb)) != 0)
            return rc;
        char *tok = token_mint(conf, token_subject(o->sub), o->ttl_s, err, sizeof(err));
        if (tok == NULL) {
            fprintf(stderr, "couponseize-admin: %s\n", err);
            return ADMIN_EXIT_CONFIG;
        }
        if (o->json)
            printf("{\"code\":\"OK\",\"token\":\"%s\",\"expiresIn\":%d}\n", tok, o->ttl_s);
        else
            printf("%s\n", tok);
        token_free(tok);
        rc = ADMIN_EXIT_OK;
    } else if (strcmp(verb, "migrate") == 0) {
        if ((rc = need_args(argc, 0, 0, verb)) != 0)
            return rc;
        rc = verb_migrate(o, conf);
    } else {
        return die_usage("unknown verb '%s'", verb);
    }
    free(body); /* cJSON allocates with malloc (cs_init) */
    return rc;
}

enum {
    OPT_TTL = 256, OPT_TIMEOUT, OPT_SUB, OPT_IDEM, OPT_PAGE, OPT_SIZE, OPT_JOURNAL_LOST,
    OPT_SQL_DIR, OPT_DB_USER, OPT_DB_PWFILE, OPT_DB_SOCKET, OPT_DB_NAME, OPT_DRY_RUN,
    OPT_NAME, OPT_TOTAL, OPT_START, OPT_END, OPT_VALIDITY, OPT_CNAME, OPT_CTYPE, OPT_AMOUNT,
    OPT_THRESHOLD, OPT_ROE, OPT_GROUPS,
};

/* Option → create/update member. */
static const char *const field_of[] = {
    [OPT_NAME - OPT_NAME] = "name", [OPT_TOTAL - OPT_NAME] = "totalNum",
    [OPT_START - OPT_NAME] = "distributeStartTime", [OPT_END - OPT_NAME] = "distributeEndTime",
    [OPT_VALIDITY - OPT_NAME] = "validityDays", [OPT_CNAME - OPT_NAME] = "couponName",
    [OPT_CTYPE - OPT_NAME] = "couponType", [OPT_AMOUNT - OPT_NAME] = "couponAmount",
    [OPT_THRESHOLD - OPT_NAME] = "couponThreshold", [OPT_ROE - OPT_NAME] = "returnOnExpiry",
    [OPT_GROUPS - OPT_NAME] = "eligibleGroups",
};

/* Reads the options into o; -1 to go on to the verb (argv[optind]), or the
 * exit status (--help, --version, a bad option). */
static int parse_opts(struct opts *o, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'}, {"url", required_argument, NULL, 'u'},
        {"json", no_argument, NULL, 'j'}, {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'}, {"ttl", required_argument, NULL, OPT_TTL},
        {"timeout", required_argument, NULL, OPT_TIMEOUT},
        {"sub", required_argument, NULL, OPT_SUB},
        {"idempotency-key", required_argument, NULL, OPT_IDEM},
        {"page", required_argument, NULL, OPT_PAGE}, {"size", required_argument, NULL, OPT_SIZE},
        {"journal-lost", no_argument, NULL, OPT_JOURNAL_LOST},
        {"sql-dir", required_argument, NULL, OPT_SQL_DIR},
        {"db-user", required_argument, NULL, OPT_DB_USER},
        {"db-password-file", required_argument, NULL, OPT_DB_PWFILE},
        {"db-socket", required_argument, NULL, OPT_DB_SOCKET},
        {"db-name", required_argument, NULL, OPT_DB_NAME},
        {"dry-run", no_argument, NULL, OPT_DRY_RUN},
        {"name", required_argument, NULL, OPT_NAME}, {"total", required_argument, NULL, OPT_TOTAL},
        {"start", required_argument, NULL, OPT_START}, {"end", required_argument, NULL, OPT_END},
        {"validity-days", required_argument, NULL, OPT_VALIDITY},
        {"coupon-name", required_argument, NULL, OPT_CNAME},
        {"coupon-type", required_argument, NULL, OPT_CTYPE},
        {"amount", required_argument, NULL, OPT_AMOUNT},
        {"threshold", required_argument, NULL, OPT_THRESHOLD},
        {"return-on-expiry", no_argument, NULL, OPT_ROE},
        {"eligible-groups", required_argument, NULL, OPT_GROUPS},
        {NULL, 0, NULL, 0},
    };
    int c, rc;
    int64_t n;

    while ((c = getopt_long(argc, argv, "c:u:jhV", longopts, NULL)) != -1) {
        switch (c) {
        case 'c': o->conf_path = optarg; break;
        case 'u': o->url = optarg; break;
        case 'j': o->json = 1; break;
        case 'h': usage(stdout); return ADMIN_EXIT_OK;
        case 'V': printf("couponseize-admin %s\n", PACKAGE_VERSION); return ADMIN_EXIT_OK;
        case OPT_TTL:
        case OPT_TIMEOUT:
        case OPT_PAGE:
        case OPT_SIZE:
            if ((n = parse_pos(optarg)) < 0 || n > 86400 * 7)
                return die_usage("'%s' is not a number in 1..604800", optarg);
            *(c == OPT_TTL ? &o->ttl_s : c == OPT_TIMEOUT ? &o->timeout_s
              : c == OPT_PAGE ? &o->page : &o->size) = (int)n;
            break;
        case OPT_SUB:
            if ((o->sub = parse_pos(optarg)) < 0)
                return die_usage("--sub '%s' is not an id", optarg);
            break;
        case OPT_IDEM:
            if (strlen(optarg) < 1 || strlen(optarg) > 255
                || strspn(optarg, " !\"#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                          "[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~") != strlen(optarg))
                return die_usage("--idempotency-key '%s': 1..255 printable ASCII characters",
                                 optarg);
            o->idem_key = optarg;
            break;
        case OPT_JOURNAL_LOST: o->journal_lost = 1; break;
        case OPT_SQL_DIR: o->mig.sql_dir = optarg; break;
        case OPT_DB_USER: o->mig.db_user = optarg; break;
        case OPT_DB_PWFILE: o->mig.db_password_file = optarg; break;
        case OPT_DB_SOCKET: o->mig.db_socket = optarg; break;
        case OPT_DB_NAME: o->mig.db_name = optarg; break;
        case OPT_DRY_RUN: o->mig.dry_run = 1; break;
        default:
            if (c >= OPT_NAME && c <= OPT_GROUPS) {
                if ((rc = add_field(o, field_of[c - OPT_NAME], optarg ? optarg : "")) != 0)
                    return rc;
                break;
            }
            usage(stderr);
            return ADMIN_EXIT_USAGE;
        }
    }
    return -1;
}

int main(int argc, char **argv)
{
    struct opts o = {.conf_path = CS_DEFAULT_CONF, .ttl_s = ADMIN_DEFAULT_TTL_S,
                     .timeout_s = ADMIN_DEFAULT_TIMEOUT_S, .page = 1, .size = 50,
                     .mig = {.sql_dir = CS_DEFAULT_SQLDIR}};
    struct cs_conf conf;
    int rc;

    cs_init();
    log_init("couponseize-admin", LOG_LVL_WARNING, "stderr");
    o.fields = cJSON_CreateObject();
    if ((rc = parse_opts(&o, argc, argv)) >= 0)
        return rc;
    /* GNU getopt moves the verb and its arguments, in their order, behind
     * the options, so options may follow the verb as well. */
    if (optind >= argc) {
        usage(stderr);
        return ADMIN_EXIT_USAGE;
    }
    if (strcmp(argv[optind], "keys") == 0) {
        rc = argc - optind - 1 == 1 ? verb_keys(&o, argv[optind + 1])
                                    : die_usage("%s: wrong number of arguments", "keys");
        cJSON_Delete(o.fields);
        return rc;
    }
    if ((rc = load_conf(&o, &conf)) != ADMIN_EXIT_OK)
        return rc;
    rc = run_verb(&o, &conf, argv[optind], argc - optind - 1, argv + optind + 1);
    conf_free(&conf);
    cJSON_Delete(o.fields);
    return rc;
}
