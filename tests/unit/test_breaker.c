/* test_breaker.c - the one circuit breaker, for the node and for each shard,
 * on a shared-memory segment made by the test. */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "node/breaker.h"
#include "conf.h"
#include "cs.h"
#include "keys.h"
#include "log.h"
#include "rconn.h"
#include "shm.h"
#include "runner.h"

static char name[64];
static struct shm_node *node;
static struct cs_conf conf;

static void setup(void)
{
    char err[256];
    snprintf(name, sizeof(name), "/cs-test-brk-%d", (int)getpid());
    node = shm_node_open(name, 1, err, sizeof(err));
    ck_assert_msg(node != NULL, "%s", err);
    conf_defaults(&conf);
    conf.redis_breaker_failures = 3;
    conf.redis_breaker_open_ms = 500;
}

static void teardown(void)
{
    shm_node_close(node);
    shm_node_unlink(name);
    conf_free(&conf);
}

START_TEST(breaker_opens_probes_and_closes)
{
    struct shm_breaker *b = &node->breaker;
    int64_t t = 1000000;
    ck_assert(breaker_allow(b, t, 100));
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(breaker_failure(b, t, 3, 500), 0);
    ck_assert_int_eq(breaker_failure(b, t, 3, 500), 1); /* third opens */
    ck_assert_int_eq(atomic_load(&b->state), BREAKER_OPEN);
    ck_assert(!breaker_allow(b, t + 499, 100));
    /* After the open interval exactly one caller probes. */
    ck_assert(breaker_allow(b, t + 500, 100));
    ck_assert(!breaker_allow(b, t + 501, 100));
    ck_assert_int_eq(atomic_load(&b->state), BREAKER_HALF_OPEN);
    /* A failed probe opens it again, whatever the threshold. */
    ck_assert_int_eq(breaker_failure(b, t + 510, 3, 500), 0); /* not from closed */
    ck_assert_int_eq(atomic_load(&b->state), BREAKER_OPEN);
    ck_assert(!breaker_allow(b, t + 600, 100));
    ck_assert(breaker_allow(b, t + 1010, 100));
    ck_assert_int_eq(breaker_success(b), 1);
    ck_assert_int_eq(atomic_load(&b->state), BREAKER_CLOSED);
    ck_assert_int_eq(breaker_success(b), 0); /* already closed */
    ck_assert(breaker_allow(b, t + 1011, 100));
}
END_TEST

START_TEST(success_resets_the_count)
{
    struct shm_breaker *b = &node->breaker;
    int64_t t = 1000000;
    breaker_failure(b, t, 3, 500);
    breaker_failure(b, t, 3, 500);
    breaker_success(b);
    ck_assert_int_eq(breaker_failure(b, t, 3, 500), 0);
    ck_assert_int_eq(breaker_failure(b, t, 3, 500), 0);
    ck_assert_int_eq(breaker_failure(b, t, 3, 500), 1);
}
END_TEST

START_TEST(probe_of_a_killed_worker_expires)
{
    int64_t t = cs_mono_ms();
    for (int i = 0; i < 5; i++)
        breaker_failure(&node->breaker, t - 1000, 5, 100);
    pid_t pid = fork();
    if (pid == 0) {
        char err[256];
        struct shm_node *mine = shm_node_open(name, 0, err, sizeof(err));
        /* Take the probe, then die without reporting. */
        if (mine && breaker_allow(&mine->breaker, cs_mono_ms(), 1000))
            raise(SIGKILL);
        _exit(1);
    }
    int status;
    waitpid(pid, &status, 0);
    ck_assert(WIFSIGNALED(status));
    ck_assert(!breaker_allow(&node->breaker, cs_mono_ms(), 1000)); /* lease still held */
    usleep(1100 * 1000);
    ck_assert(breaker_allow(&node->breaker, cs_mono_ms(), 1000));  /* lease ran out */
}
END_TEST

START_TEST(node_or_shard)
{
    conf.redis_cluster = 0;
    ck_assert_ptr_eq(breaker_of(&conf, node, 3), &node->breaker);
    ck_assert_ptr_eq(breaker_of(&conf, node, -1), &node->breaker);
    conf.redis_cluster = 1;
    ck_assert_ptr_eq(breaker_of(&conf, node, 3), &node->shard_breaker[3]);
    ck_assert_ptr_null(breaker_of(&conf, node, KEYS_SHARDS));
    ck_assert_ptr_null(breaker_of(&conf, node, -1));
    conf.redis_cluster = 0;
}
END_TEST

/* Seize failures on a single Redis open the node's breaker, count once in
 * breaker_opened, and record the fault for health; a success closes it. */
static void seize_failures_open(int cluster, int shard)
{
    struct rconn_opts ro;
    conf.redis_cluster = cluster;
    rconn_opts_from_conf(&ro, &conf, 100);
    struct rconn *rc = rconn_new(&ro);
    rconn_set_err(rc, RCONN_ERR_IO, "test", "connection refused");
    struct shm_breaker *b = breaker_of(&conf, node, shard);

    for (int i = 0; i < 2; i++) {
        breaker_seize_done(&conf, node, shard, RCONN_FAULT_DOWN, rc);
        ck_assert(breaker_seize_allowed(&conf, node, shard));
    }
    breaker_seize_done(&conf, node, shard, RCONN_FAULT_DOWN, rc);
    ck_assert(!breaker_seize_allowed(&conf, node, shard));
    ck_assert_int_eq(atomic_load(&b->state), BREAKER_OPEN);
    ck_assert_uint_eq(atomic_load(&node->m.breaker_opened), 1);
    ck_assert_uint_eq(atomic_load(&node->m.redis_errors), 3);
    if (!cluster) {
        ck_assert_int_eq(atomic_load(&node->breaker.fault), RCONN_FAULT_DOWN);
        ck_assert(!breaker_readable(node)); /* unreachable: no reads either */
    } else {
        /* Only that shard: the others still sell. */
        ck_assert(breaker_seize_allowed(&conf, node, (shard + 1) % KEYS_SHARDS));
        ck_assert(breaker_readable(node));
    }
    /* The probe after the open interval, and its success. */
    atomic_store(&b->open_until_ms, cs_mono_ms() - 1);
    ck_assert(breaker_seize_allowed(&conf, node, shard));
    ck_assert(!breaker_seize_allowed(&conf, node, shard));
    breaker_seize_done(&conf, node, shard, RCONN_FAULT_NONE, rc);
    ck_assert_int_eq(atomic_load(&b->state), BREAKER_CLOSED);
    ck_assert(breaker_seize_allowed(&conf, node, shard));
    if (!cluster)
        ck_assert_int_eq(atomic_load(&node->breaker.fault), RCONN_FAULT_NONE);
    rconn_free(rc);
    conf.redis_cluster = 0;
}

START_TEST(seize_failures_open_the_node_breaker)
{
    seize_failures_open(0, 4);
}
END_TEST

START_TEST(seize_failures_open_one_shard)
{
    seize_failures_open(1, 4);
}
END_TEST

START_TEST(silence_opens_at_once)
{
    ck_assert_int_eq(breaker_seize_silence_ms(&conf, node, 2), INT64_MAX); /* never answered */
    breaker_seize_answered(&conf, node, 2);
    ck_assert_int_lt(breaker_seize_silence_ms(&conf, node, 2), 50);
    breaker_seize_silent(&conf, node, 2);
    ck_assert_int_eq(atomic_load(&node->breaker.state), BREAKER_OPEN);
    ck_assert_int_eq(atomic_load(&node->breaker.fault), RCONN_FAULT_DOWN);
    ck_assert_uint_eq(atomic_load(&node->m.redis_timeouts), 1);
}
END_TEST

/* A seize left unanswered: slow (a seize answered within the budget), to be
 * asked about (silent for one budget), or gone (silent for two). */
START_TEST(unanswered_waits_asks_or_opens)
{
    struct rconn_opts o = {.host = "127.0.0.1", .port = 1, .connect_timeout_ms = 100,
                           .command_timeout_ms = 100, .no_backoff = 1};
    struct rconn *rc = rconn_new(&o);
    _Atomic int64_t *at = &node->breaker.answer_ms;
    conf.fallback_budget_ms = 1000;
    rconn_set_err(rc, RCONN_ERR_TIMEOUT, "seize", "timed out");

    atomic_store(at, cs_mono_ms() - 800);
    ck_assert_int_eq(breaker_seize_unanswered(&conf, node, 0, rc), BREAKER_WAITED);
    atomic_store(at, cs_mono_ms() - 1500);
    ck_assert_int_eq(breaker_seize_unanswered(&conf, node, 0, rc), BREAKER_ASK);
    ck_assert_int_eq(atomic_load(&node->breaker.state), BREAKER_CLOSED);
    ck_assert_uint_eq(atomic_load(&node->m.redis_timeouts), 2);
    ck_assert_int_eq(atomic_load(&node->breaker.failures), 0); /* neither is a failure */

    /* Asked, and a seize was answered meanwhile: nothing to do (the
     * worker does not even bring its slot map up to date). */
    atomic_store(at, cs_mono_ms());
    ck_assert_int_eq(breaker_seize_ask_due(&conf, node, 0), 0);
    ck_assert_int_eq(breaker_seize_ask(&conf, node, 0, rc, &(struct rconn_site){0, -1}), 1);
    ck_assert_int_eq(atomic_load(&node->breaker.state), BREAKER_CLOSED);
    /* Silent for the budget less the margin (a seize whose budget went
     * while every worker waited): due; a little less: not. */
    atomic_store(at, cs_mono_ms() - 800);
    ck_assert_int_eq(breaker_seize_ask_due(&conf, node, 0), 0);
    atomic_store(at, cs_mono_ms() - 905);
    ck_assert_int_eq(breaker_seize_ask_due(&conf, node, 0), 1);
    /* Asked, and nothing listens where Redis was: open, counted once. */
    atomic_store(at, cs_mono_ms() - 1500);
    ck_assert_int_eq(breaker_seize_ask_due(&conf, node, 0), 1);
    ck_assert_int_eq(breaker_seize_ask(&conf, node, 0, rc, &(struct rconn_site){0, -1}), 0);
    ck_assert_int_eq(atomic_load(&node->breaker.state), BREAKER_OPEN);
    ck_assert_int_eq(atomic_load(&node->breaker.fault), RCONN_FAULT_DOWN);
    ck_assert_uint_eq(atomic_load(&node->m.redis_timeouts), 2);
    ck_assert_uint_eq(atomic_load(&node->m.breaker_asked_alive), 0);
    ck_assert_int_eq(breaker_seize_ask_due(&conf, node, 0), 0); /* open: nothing to ask */
    /* The ask left the seize's own error as it was. */
    ck_assert_int_eq(rc->err, RCONN_ERR_TIMEOUT);
    ck_assert_str_eq(rc->errstr, "seize: timed out");

    /* Silent for two budgets: open at once, without asking. */
    ck_assert_int_eq(breaker_success(&node->breaker), 1);
    atomic_store(at, cs_mono_ms() - 2500);
    ck_assert_int_eq(breaker_seize_unanswered(&conf, node, 0, rc), BREAKER_FAILED);
    ck_assert_int_eq(atomic_load(&node->breaker.state), BREAKER_OPEN);

    /* A failed connection, not a timeout: a failure like any other. */
    ck_assert_int_eq(breaker_success(&node->breaker), 1);
    atomic_store(at, cs_mono_ms());
    rconn_set_err(rc, RCONN_ERR_CONNECT, "connect", "refused");
    ck_assert_int_eq(breaker_seize_unanswered(&conf, node, 0, rc), BREAKER_FAILED);
    ck_assert_int_eq(atomic_load(&node->breaker.failures), 1);
    ck_assert_int_eq(atomic_load(&node->breaker.state), BREAKER_CLOSED);
    rconn_free(rc);
}
END_TEST

START_TEST(retry_after_and_probe_lease)
{
    conf.redis_breaker_open_ms = 1;
    ck_assert_int_eq(breaker_retry_after(&conf), 1);
    conf.redis_breaker_open_ms = 1000;
    ck_assert_int_eq(breaker_retry_after(&conf), 1);
    conf.redis_breaker_open_ms = 1001;
    ck_assert_int_eq(breaker_retry_after(&conf), 2);
    conf.redis_connect_timeout_ms = 100;
    conf.redis_command_timeout_ms = 200;
    conf.fallback_budget_ms = 1000;
    ck_assert_int_eq(breaker_probe_lease(&conf), 1000); /* the budget */
    conf.redis_command_timeout_ms = 900;
    ck_assert_int_eq(breaker_probe_lease(&conf), 2000); /* two connects and commands */
}
END_TEST

int main(void)
{
    log_init("test_breaker", LOG_LVL_ERROR, "stderr");
    Suite *s = suite_create("breaker");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, breaker_opens_probes_and_closes);
    tcase_add_test(tc, success_resets_the_count);
    tcase_add_test(tc, probe_of_a_killed_worker_expires);
    tcase_add_test(tc, node_or_shard);
    tcase_add_test(tc, seize_failures_open_the_node_breaker);
    tcase_add_test(tc, seize_failures_open_one_shard);
    tcase_add_test(tc, silence_opens_at_once);
    tcase_add_test(tc, unanswered_waits_asks_or_opens);
    tcase_add_test(tc, retry_after_and_probe_lease);
    suite_add_tcase(s, tc);
    return cs_run_suite(s, 0);
}
