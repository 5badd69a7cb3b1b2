/* test_conf.c - configuration loading: defaults, types, bounds, errors with key and line. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conf.h"
#include "cs.h"
#include "runner.h"
#include "schema.h"

#include <dirent.h>
#include <sys/stat.h>

static char path[64];

static void write_conf(const char *text)
{
    strcpy(path, "/tmp/cs-conf-XXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (int)strlen(text));
    close(fd);
}

static int load(const char *text, struct cs_conf *c, char *err, size_t errlen)
{
    write_conf(text);
    int rc = conf_load(c, path, err, errlen);
    unlink(path);
    return rc;
}

static const char SECRET[] = "auth = { jwt_secret = \"0123456789abcdef0123456789abcdef\"; };\n";

START_TEST(defaults_apply)
{
    struct cs_conf c;
    char err[256];
    ck_assert_int_eq(load(SECRET, &c, err, sizeof(err)), CS_OK);
    ck_assert_int_eq(c.redis_port, 6379);
    ck_assert_int_eq(c.fcgi_workers, 4);
    ck_assert_int_eq(c.fcgi_threads, 1);
    ck_assert_int_eq(c.fcgi_max_body, 1024);
    ck_assert_int_eq(c.sync_interval_s, 60);
    ck_assert_int_eq(c.sync_batch, 500);
    ck_assert_int_eq(c.sync_threads, 10);
    ck_assert_int_eq(c.preheat_horizon_days, 30);
    ck_assert_str_eq(c.auth_mode, "jwt");
    ck_assert_str_eq(c.redis_host, "127.0.0.1");
    ck_assert_str_eq(c.auth_audience, "");
    ck_assert_str_eq(c.auth_issuer, "");
    conf_free(&c);
}
END_TEST

START_TEST(token_audience_and_issuer)
{
    struct cs_conf c;
    char err[256];
    ck_assert_int_eq(load("auth = { jwt_secret = \"0123456789abcdef0123456789abcdef\";\n"
                          "  audience = \"couponseize\"; issuer = \"https://id.example\"; };\n",
                          &c, err, sizeof(err)),
                     CS_OK);
    ck_assert_str_eq(c.auth_audience, "couponseize");
    ck_assert_str_eq(c.auth_issuer, "https://id.example");
    conf_free(&c);
    ck_assert_int_eq(load("auth = { jwt_secret = \"0123456789abcdef0123456789abcdef\";\n"
                          "  audience = [\"a\", \"b\"]; };\n",
                          &c, err, sizeof(err)),
                     CS_ERR);
    ck_assert_msg(strstr(err, "auth.audience") != NULL, "%s", err);
    ck_assert_int_eq(load("auth = { jwt_secret = \"0123456789abcdef0123456789abcdef\";\n"
                          "  issuer = 5; };\n",
                          &c, err, sizeof(err)),
                     CS_ERR);
    ck_assert_msg(strstr(err, "auth.issuer") != NULL, "%s", err);
}
END_TEST

START_TEST(values_override)
{
    struct cs_conf c;
    char err[256];
    ck_assert_int_eq(load("redis = { host = \"10.0.0.5\"; port = 7000; };\n"
                          "fcgi = { workers = 16; listen = \"127.0.0.1:9000\"; };\n"
                          "sync = { interval_s = 1; batch = 1000; };\n"
                          "auth = { mode = \"trusted-header\"; };\n",
                          &c, err, sizeof(err)),
                     CS_OK);
    ck_assert_str_eq(c.redis_host, "10.0.0.5");
    ck_assert_int_eq(c.redis_port, 7000);
    ck_assert_int_eq(c.fcgi_workers, 16);
    ck_assert_str_eq(c.fcgi_listen, "127.0.0.1:9000");
    ck_assert_int_eq(c.sync_interval_s, 1);
    ck_assert_int_eq(c.sync_batch, 1000);
    ck_assert_str_eq(c.auth_mode, "trusted-header");
    conf_free(&c);
}
END_TEST

static void expect_error(const char *text, const char *needle1, const char *needle2)
{
    struct cs_conf c;
    char err[256] = "";
    ck_assert_int_eq(load(text, &c, err, sizeof(err)), CS_ERR);
    ck_assert_msg(strstr(err, needle1) != NULL, "'%s' lacks '%s'", err, needle1);
    if (needle2)
        ck_assert_msg(strstr(err, needle2) != NULL, "'%s' lacks '%s'", err, needle2);
}

START_TEST(errors_name_key_and_line)
{
    expect_error("auth = { jwt_secret = \"0123456789abcdef0123456789abcdef\"; };\n"
                 "redis = {\n  port = 70000;\n};\n", "redis.port", ":3:");
    expect_error("redis = { prot = 1; };\n", "unknown key 'redis.prot'", ":1:");
    expect_error("redis = { port = \"6379\"; };\n", "redis.port", "integer");
    expect_error("redis = { host = 5; };\n", "redis.host", "string");
    expect_error("log = { level = \"loud\"; };\n", "log.level", NULL);
    expect_error("fcgi = { workers = 0; };\n", "fcgi.workers", "out of range");
    expect_error("fcgi = { threads = 65; };\n", "fcgi.threads", "out of range");
    expect_error("auth = { jwt_secret = \"0123456789abcdef0123456789abcdef\"; };\n"
                 "fcgi = { threads = 4; };\nlimits = { batch_max = 8; };\n",
                 "limits.batch_max", "fcgi.threads");
    expect_error("auth = { jwt_secret = \"0123456789abcdef0123456789abcdef\"; };\n"
                 "fcgi = { workers = 64; threads = 16; };\n", "fcgi.workers", "512");
    expect_error("redis = { port = 1 \n", ":2:", "syntax");
    expect_error("workers = 4;\n", "group", NULL);
    expect_error("auth = { mode = \"jwt\"; jwt_secret = \"short\"; };\n", "auth.jwt_secret", NULL);
}
END_TEST

START_TEST(cluster_keys)
{
    struct cs_conf c;
    char err[256];
    ck_assert_int_eq(load(SECRET, &c, err, sizeof(err)), CS_OK);
    ck_assert_int_eq(c.redis_cluster, 0);
    ck_assert_str_eq(c.redis_nodes, "");
    ck_assert_int_eq(c.redis_wait_replicas, 0);
    ck_assert_int_eq(c.redis_wait_timeout_ms, 100);
    conf_free(&c);
    ck_assert_int_eq(load("auth = { jwt_secret = \"0123456789abcdef0123456789abcdef\"; };\n"
                          "redis = { cluster = true; nodes = [\"10.0.0.1:7000\", \"r2:7001\"];\n"
                          "  wait_replicas = 1; wait_timeout_ms = 250; };\n",
                          &c, err, sizeof(err)),
                     CS_OK);
    ck_assert_int_eq(c.redis_cluster, 1);
    ck_assert_str_eq(c.redis_nodes, "10.0.0.1:7000,r2:7001");
    ck_assert_int_eq(c.redis_wait_replicas, 1);
    ck_assert_int_eq(c.redis_wait_timeout_ms, 250);
    conf_free(&c);
    /* A list is fine without the cluster (kept for when it is turned on). */
    ck_assert_int_eq(load("auth = { jwt_secret = \"0123456789abcdef0123456789abcdef\"; };\n"
                          "redis = { nodes = (\"a:1\"); };\n", &c, err, sizeof(err)),
                     CS_OK);
    conf_free(&c);
    expect_error("redis = { cluster = 1; };\n", "redis.cluster", "true or false");
    expect_error("redis = { cluster = \"yes\"; };\n", "redis.cluster", NULL);
    expect_error("redis = { nodes = \"a:1\"; };\n", "redis.nodes", "list");
    expect_error("redis = { nodes = [\"a:1,b:2\"]; };\n", "redis.nodes", NULL);
    expect_error("redis = { nodes = [\"\"]; };\n", "redis.nodes", NULL);
    expect_error("auth = { jwt_secret = \"0123456789abcdef0123456789abcdef\"; };\n"
                 "redis = { cluster = true; };\n", "redis.nodes", "host:port");
    expect_error("auth = { jwt_secret = \"0123456789abcdef0123456789abcdef\"; };\n"
                 "redis = { cluster = true; nodes = [\"a\"]; };\n", "redis.nodes", NULL);
    expect_error("auth = { jwt_secret = \"0123456789abcdef0123456789abcdef\"; };\n"
                 "redis = { cluster = true; nodes = [\"a:99999\"]; };\n", "redis.nodes", NULL);
    expect_error("redis = { wait_replicas = 17; };\n", "redis.wait_replicas", "out of range");
    expect_error("redis = { wait_timeout_ms = 0; };\n", "redis.wait_timeout_ms", "out of range");
}
END_TEST

START_TEST(missing_file)
{
    struct cs_conf c;
    char err[256];
    ck_assert_int_eq(conf_load(&c, "/nonexistent/couponseize.conf", err, sizeof(err)), CS_ERR);
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/couponseize.conf"));
}
END_TEST

START_TEST(shipped_example_documents_every_key)
{
    /* Each key of the table appears in etc/couponseize.conf. */
    const char *src = getenv("top_srcdir");
    char p[512], line[256], *buf;
    snprintf(p, sizeof(p), "%s/etc/couponseize.conf", src ? src : ".");
    FILE *f = fopen(p, "r");
    ck_assert_ptr_nonnull(f);
    buf = xcalloc(1, 65536);
    ck_assert_int_gt(fread(buf, 1, 65535, f), 0);
    fclose(f);
    FILE *keys = tmpfile();
    ck_assert_ptr_nonnull(keys);
    FILE *saved = stdout;
    stdout = keys;
    conf_dump_keys();
    fflush(keys);
    stdout = saved;
    rewind(keys);
    int n = 0;
    while (fgets(line, sizeof(line), keys) != NULL) {
        char *dot = strchr(line, '.'), *sp = strchr(line, ' ');
        ck_assert_ptr_nonnull(dot);
        *sp = '\0';
        /* The key must stand inside its own group's block. */
        char group[64], needle[96];
        snprintf(group, sizeof(group), "\n%.*s = {", (int)(dot - line), line);
        snprintf(needle, sizeof(needle), "  %s = ", dot + 1);
        const char *g = strstr(buf, group);
        ck_assert_msg(g != NULL, "example config lacks the group of %s", line);
        const char *end = strstr(g, "\n};");
        const char *k = strstr(g, needle);
        ck_assert_msg(k != NULL && end != NULL && k < end, "example config lacks %s", line);
        n++;
    }
    fclose(keys);
    free(buf);
    ck_assert_int_gt(n, 30);
}
END_TEST

/* auth.jwt_secret_file: the key read from its own file, one trailing
 * newline dropped; both keys set, a short key, a missing file refused with
 * the file named and never the key. */
START_TEST(secret_file)
{
    struct cs_conf c;
    char err[512] = "", sp[64], text[256];
    strcpy(sp, "/tmp/cs-secret-XXXXXX");
    int fd = mkstemp(sp);
    ck_assert_int_ge(fd, 0);
    const char key[] = "fedcba9876543210fedcba9876543210-key\n";
    ck_assert_int_eq(write(fd, key, strlen(key)), (int)strlen(key));
    close(fd);

    snprintf(text, sizeof(text), "auth = { jwt_secret_file = \"%s\"; };\n", sp);
    ck_assert_int_eq(load(text, &c, err, sizeof(err)), CS_OK);
    ck_assert_str_eq(c.auth_jwt_secret, "fedcba9876543210fedcba9876543210-key");
    conf_free(&c);

    snprintf(text, sizeof(text),
             "auth = { jwt_secret = \"0123456789abcdef0123456789abcdef\"; "
             "jwt_secret_file = \"%s\"; };\n", sp);
    expect_error(text, "both set", NULL);

    FILE *f = fopen(sp, "w");
    ck_assert_ptr_nonnull(f);
    fputs("short\n", f);
    fclose(f);
    snprintf(text, sizeof(text), "auth = { jwt_secret_file = \"%s\"; };\n", sp);
    ck_assert_int_eq(load(text, &c, err, sizeof(err)), CS_ERR);
    ck_assert_msg(strstr(err, "at least 32") != NULL && strstr(err, sp) != NULL, "%s", err);
    ck_assert_msg(strstr(err, "short") == NULL, "the key is in the message: %s", err);
    unlink(sp);
    expect_error(text, "cannot open it", sp);
}
END_TEST

/* PATH.d/NAME.conf in name order over PATH: later files win, other names
 * are ignored, an error names the fragment's file and line. */
START_TEST(conf_d_fragments)
{
    char dir[64], main_path[128], frag[192];
    struct cs_conf c;
    char err[512] = "";
    strcpy(dir, "/tmp/cs-confd-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(main_path, sizeof(main_path), "%s/couponseize.conf", dir);
    FILE *f = fopen(main_path, "w");
    fputs("auth = { jwt_secret = \"0123456789abcdef0123456789abcdef\"; };\n"
          "redis = { port = 7000; host = \"10.0.0.1\"; };\n", f);
    fclose(f);
    snprintf(frag, sizeof(frag), "%s.d", main_path);
    ck_assert_int_eq(mkdir(frag, 0700), 0);
    static const struct {
        const char *name, *text;
    } files[] = {
        {"20-later.conf", "redis = { port = 7002; };\n"},
        {"10-local.conf", "redis = { port = 7001; };\nmysql = { password = \"pw\"; };\n"},
        {".hidden.conf", "redis = { port = 1; };\n"},
        {"30-old.conf.dpkg-old", "redis = { port = 2; };\n"},
        {"40-backup.conf~", "redis = { port = 3; };\n"},
    };
    for (size_t i = 0; i < CS_ARRAY_LEN(files); i++) {
        snprintf(frag, sizeof(frag), "%s.d/%s", main_path, files[i].name);
        f = fopen(frag, "w");
        fputs(files[i].text, f);
        fclose(f);
    }
    ck_assert_int_eq(conf_load(&c, main_path, err, sizeof(err)), CS_OK);
    ck_assert_int_eq(c.redis_port, 7002);
    ck_assert_str_eq(c.redis_host, "10.0.0.1");
    ck_assert_str_eq(c.mysql_password, "pw");
    conf_free(&c);

    snprintf(frag, sizeof(frag), "%s.d/50-bad.conf", main_path);
    f = fopen(frag, "w");
    fputs("\nredis = { prot = 1; };\n", f);
    fclose(f);
    ck_assert_int_eq(conf_load(&c, main_path, err, sizeof(err)), CS_ERR);
    ck_assert_msg(strstr(err, "50-bad.conf:2:") != NULL && strstr(err, "redis.prot") != NULL,
                  "%s", err);
    unlink(frag);
    for (size_t i = 0; i < CS_ARRAY_LEN(files); i++) {
        snprintf(frag, sizeof(frag), "%s.d/%s", main_path, files[i].name);
        unlink(frag);
    }
    snprintf(frag, sizeof(frag), "%s.d", main_path);
    rmdir(frag);
    unlink(main_path);
    rmdir(dir);
}
END_TEST

/* CS_SCHEMA_VERSION is the number of the last file in sql/, and the numbers
 * run 1..N without a gap or a repeat. */
START_TEST(schema_version_matches_sql)
{
    ck_assert_int_eq(schema_number("005_coupon_lifecycle"), 5);
    ck_assert_int_eq(schema_number("/usr/share/couponseize/sql/012_x.sql"), 12);
    ck_assert_int_eq(schema_number("demo_data.sql"), -1);
    ck_assert_int_eq(schema_number("7.sql"), -1);

    const char *src = getenv("top_srcdir");
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/sql", src != NULL ? src : ".");
    DIR *d = opendir(dir);
    ck_assert_msg(d != NULL, "cannot open %s", dir);
    int seen[1000] = {0}, max = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        int v = schema_number(e->d_name);
        if (v < 0 || n < 4 || strcmp(e->d_name + n - 4, ".sql") != 0)
            continue;
        ck_assert_int_lt(v, 1000);
        ck_assert_msg(!seen[v], "two files numbered %03d in sql/", v);
        seen[v] = 1;
        max = v > max ? v : max;
    }
    closedir(d);
    ck_assert_int_eq(max, CS_SCHEMA_VERSION);
    for (int v = 1; v <= max; v++)
        ck_assert_msg(seen[v], "sql/ has no file numbered %03d", v);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("conf");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, defaults_apply);
    tcase_add_test(tc, values_override);
    tcase_add_test(tc, token_audience_and_issuer);
    tcase_add_test(tc, errors_name_key_and_line);
    tcase_add_test(tc, cluster_keys);
    tcase_add_test(tc, missing_file);
    tcase_add_test(tc, shipped_example_documents_every_key);
    tcase_add_test(tc, secret_file);
    tcase_add_test(tc, conf_d_fragments);
    tcase_add_test(tc, schema_version_matches_sql);
    suite_add_tcase(s, tc);
    return cs_run_suite(s, 0);
}
