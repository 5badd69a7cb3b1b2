/* redis_server.h - a throwaway redis-server on a loopback port for the unit
 * tests that need one (test_conns, test_scripts, test_keeper): no save, no
 * AOF, its output dropped; started once per suite (an unchecked fixture). */
#ifndef CS_TEST_REDIS_SERVER_H
#define CS_TEST_REDIS_SERVER_H

#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rconn.h"

/* Starts redis-server on 127.0.0.1:port and returns its pid once it answers
 * PING (5 s at most; the tests that use it then fail on their own calls). */
static inline pid_t test_redis_start(int port)
{
    char p[16];
    snprintf(p, sizeof(p), "%d", port);
    pid_t pid = fork();
    if (pid == 0) {
        if (freopen("/dev/null", "w", stdout) == NULL)
            _exit(127);
        execlp("redis-server", "redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", (char *)NULL);
        _exit(127);
    }
    struct rconn_opts o = {.host = "127.0.0.1", .port = port, .password = "",
                           .connect_timeout_ms = 200, .command_timeout_ms = 500,
                           .no_backoff = 1};
    struct rconn *rc = rconn_new(&o);
    for (int i = 0; i < 100; i++) {
        redisReply *r = rconn_command(rc, NULL, "PING");
        if (r) {
            freeReplyObject(r);
            break;
        }
        usleep(50000);
    }
    rconn_free(rc);
    return pid;
}

static inline void test_redis_stop(pid_t pid)
{
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
}

#endif
