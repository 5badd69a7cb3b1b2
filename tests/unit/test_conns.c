/* test_conns.c - error paths of the Redis and MySQL connection wrappers, and
 * EVALSHA's reload on NOSCRIPT against a throwaway redis-server. */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "conf.h"
#include "cs.h"
#include "mconn.h"
#include "rconn.h"
#include "redis_server.h"
#include "runner.h"

/* A TCP listener on a free loopback port that never answers. */
static int silent_listener(int *port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    ck_assert_int_eq(listen(fd, 16), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    *port = ntohs(sa.sin_port);
    return fd;
}

static int closed_port(void)
{
    int port, fd = silent_listener(&port);
    close(fd);
    return port;
}

START_TEST(redis_refused_sets_sticky_error_and_backs_off)
{
    struct rconn_opts o = {.host = "127.0.0.1", .port = closed_port(), .password = "",
                           .connect_timeout_ms = 200, .command_timeout_ms = 200,
                           .no_backoff = 0};
    struct rconn *rc = rconn_new(&o);
    ck_assert_ptr_null(rconn_command(rc, NULL, "PING"));
    ck_assert_int_eq(rc->err, RCONN_ERR_CONNECT);
    ck_assert_ptr_nonnull(strstr(rc->errstr, "redisConnect"));
    /* Within the backoff no connect is attempted at all. */
    int64_t t0 = cs_mono_us();
    ck_assert_ptr_null(rconn_command(rc, NULL, "PING"));
    ck_assert_int_eq(rc->err, RCONN_ERR_BACKOFF);
    ck_assert_int_lt(cs_mono_us() - t0, 100000); /* no connect timeout was waited */
    ck_assert_int_eq(rconn_append(rc, NULL, "PING"), CS_ERR);
    rconn_free(rc);
}
END_TEST

START_TEST(redis_silent_server_times_out)
{
    int port, lfd = silent_listener(&port);
    struct rconn_opts o = {.host = "127.0.0.1", .port = port, .password = "",
                           .connect_timeout_ms = 200, .command_timeout_ms = 100,
                           .no_backoff = 1};
    struct rconn *rc = rconn_new(&o);
    int64_t t0 = cs_mono_ms();
    ck_assert_ptr_null(rconn_command(rc, NULL, "PING"));
    int64_t took = cs_mono_ms() - t0;
    ck_assert_int_eq(rc->err, RCONN_ERR_TIMEOUT);
    ck_assert_int_ge(took, 90);
    ck_assert_int_lt(took, 2000);
    ck_assert_ptr_null(rc->ctx); /* thrown away after the error */
    rconn_free(rc);
    close(lfd);
}
END_TEST

/* An EVALSHA that never left the process is told apart from one whose
 * reply was lost: only the second may have granted a coupon. */
START_TEST(evalsha_says_whether_it_was_sent)
{
    struct rscript s = {.src = (char *)"return 1", .len = 8,
                        .sha = "e0e1f9fabfc9d4800c877a703b823ac0578ff8db"};
    const char *argv[1] = {"k"};

    struct rconn_opts refused = {.host = "127.0.0.1", .port = closed_port(), .password = "",
                           .connect_timeout_ms = 200, .command_timeout_ms = 100,
                           .no_backoff = 1};
    struct rconn *rc = rconn_new(&refused);
    ck_assert_ptr_null(rconn_evalsha(rc, &s, 1, 1, argv, NULL));
    ck_assert_int_eq(rc->maybe_sent, 0);
    rconn_free(rc);

    int port, lfd = silent_listener(&port);
    struct rconn_opts silent = {.host = "127.0.0.1", .port = port, .password = "",
                           .connect_timeout_ms = 200, .command_timeout_ms = 100,
                           .no_backoff = 1};
    rc = rconn_new(&silent);
    ck_assert_ptr_null(rconn_evalsha(rc, &s, 1, 1, argv, NULL));
    ck_assert_int_eq(rc->err, RCONN_ERR_TIMEOUT);
    ck_assert_int_eq(rc->maybe_sent, 1);
    rconn_free(rc);
    close(lfd);
}
END_TEST

START_TEST(error_replies_name_their_fault)
{
    static const struct {
        const char *text;
        enum rconn_fault fault;
    } cases[] = {
        {"OOM command not allowed when used memory > 'maxmemory'.", RCONN_FAULT_OOM},
        {"READONLY You can't write against a read only replica.", RCONN_FAULT_READONLY},
        {"MISCONF Errors writing to the AOF file: No space left on device", RCONN_FAULT_MISCONF},
        {"BUSY Redis is busy running a script.", RCONN_FAULT_BUSY},
        {"BUSYKEY Target key name already exists.", RCONN_FAULT_ERROR},
        {"LOADING Redis is loading the dataset in memory", RCONN_FAULT_LOADING},
        {"ERR unknown command", RCONN_FAULT_ERROR},
        {"OOMX", RCONN_FAULT_ERROR},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        redisReply r = {.type = REDIS_REPLY_ERROR, .str = (char *)cases[i].text,
                        .len = strlen(cases[i].text)};
        ck_assert_msg(rconn_reply_fault(&r) == cases[i].fault, "%s", cases[i].text);
    }
    redisReply ok = {.type = REDIS_REPLY_INTEGER, .integer = 3};
    ck_assert_int_eq(rconn_reply_fault(&ok), RCONN_FAULT_NONE);
    ck_assert_int_eq(rconn_reply_fault(NULL), RCONN_FAULT_DOWN);
    ck_assert_str_eq(rconn_fault_name(RCONN_FAULT_OOM), "oom");
    ck_assert_str_eq(rconn_fault_name(RCONN_FAULT_NONE), "up");
}
END_TEST

static pid_t redis_pid;
static int redis_port;

static void redis_start(void)
{
    if (redis_port == 0)
        redis_port = closed_port();
    redis_pid = test_redis_start(redis_port);
}

static void redis_stop(void)
{
    test_redis_stop(redis_pid);
}

START_TEST(evalsha_reloads_on_noscript)
{
    if (system("command -v redis-server >/dev/null 2>&1") != 0)
        ck_abort_msg("redis-server is not installed (./bootstrap installs it)");
    struct rconn_opts o = {.host = "127.0.0.1", .port = redis_port, .password = "",
                           .connect_timeout_ms = 500, .command_timeout_ms = 500,
                           .no_backoff = 1};
    struct rconn *rc = rconn_new(&o);
    struct rscript s = {0};
    s.src = xstrdup("return tonumber(ARGV[1]) + 1");
    s.len = strlen(s.src);
    const char *argv[] = {"k", "41"};

    redisReply *r = rconn_evalsha(rc, &s, 1, 2, argv, NULL);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->type, REDIS_REPLY_INTEGER);
    ck_assert_int_eq(r->integer, 42);
    freeReplyObject(r);
    ck_assert_int_eq(strlen(s.sha), 40);

    /* The server forgets the script: the next call loads it again. */
    r = rconn_command(rc, NULL, "SCRIPT FLUSH");
    freeReplyObject(r);
    r = rconn_evalsha(rc, &s, 1, 2, argv, NULL);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->integer, 42);
    freeReplyObject(r);

    /* It really went through EVALSHA, loading the script twice. */
    r = rconn_command(rc, NULL, "INFO commandstats");
    ck_assert_ptr_nonnull(r);
    ck_assert_ptr_nonnull(strstr(r->str, "cmdstat_evalsha:calls=3,"));
    ck_assert_ptr_null(strstr(r->str, "cmdstat_eval:"));
    ck_assert_ptr_nonnull(strstr(r->str, "load:calls=2,")); /* cmdstat_script|load */
    freeReplyObject(r);

    /* A reply error is a reply, not a broken connection. */
    r = rconn_command(rc, NULL, "NOSUCHCOMMAND");
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->type, REDIS_REPLY_ERROR);
    freeReplyObject(r);
    ck_assert_ptr_nonnull(rc->ctx);

    /* Server gone: the wrapper reports it and reconnects once it is back. */
    redis_stop();
    ck_assert_ptr_null(rconn_command(rc, NULL, "PING"));
    ck_assert_int_ne(rc->err, RCONN_OK);
    redis_start();
    r = rconn_command(rc, NULL, "PING");
    ck_assert_ptr_nonnull(r);
    freeReplyObject(r);
    rscript_free(&s);
    rconn_free(rc);
}
END_TEST

START_TEST(mysql_unreachable_is_a_connection_error)
{
    struct cs_conf c;
    conf_defaults(&c);
    free(c.mysql_socket);
    c.mysql_socket = xstrdup("/nonexistent/mysql.sock");
    c.mysql_timeout_s = 1;
    struct mconn *mc = mconn_new(&c);
    struct mval p[1] = {MV_INT(1)};
    uint64_t aff = 99;
    ck_assert_int_eq(mconn_exec(mc, "SELECT ?", p, 1, &aff), CS_ERR);
    ck_assert_ptr_nonnull(strstr(mc->errstr, "mysql_real_connect"));
    ck_assert(mconn_err_is_conn(mc));
    ck_assert_uint_eq(aff, 99);
    ck_assert_int_eq(mconn_begin(mc), CS_ERR);
    ck_assert_int_eq(mconn_commit(mc), CS_ERR);
    mconn_rollback(mc); /* harmless without a connection */
    mconn_free(mc);
    conf_free(&c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("conns");
    TCase *tc = tcase_create("errors");
    tcase_add_test(tc, redis_refused_sets_sticky_error_and_backs_off);
    tcase_add_test(tc, redis_silent_server_times_out);
    tcase_add_test(tc, evalsha_says_whether_it_was_sent);
    tcase_add_test(tc, error_replies_name_their_fault);
    tcase_add_test(tc, mysql_unreachable_is_a_connection_error);
    suite_add_tcase(s, tc);
    TCase *tr = tcase_create("redis");
    tcase_add_unchecked_fixture(tr, redis_start, redis_stop);
    tcase_add_test(tr, evalsha_reloads_on_noscript);
    suite_add_tcase(s, tr);
    /* Fork mode would kill the fixture's server with the first test child. */
    return cs_run_suite(s, 1);
}
