/* test_rcluster.c - Redis Cluster routing: key slots against CLUSTER KEYSLOT,
 * parsing of CLUSTER SHARDS / SLOTS and MOVED / ASK, and redirections met on
 * a real two-master cluster of throwaway redis-servers. */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cs.h"
#include "keys.h"
#include "rcluster.h"
#include "rconn.h"
#include "runner.h"

/* ---- parsing ------------------------------------------------------------------------- */

/* Builds a reply from RESP text, as hiredis would read it off the wire. */
static redisReply *resp(const char *text)
{
    redisReader *rd = redisReaderCreate();
    void *r = NULL;
    ck_assert_int_eq(redisReaderFeed(rd, text, strlen(text)), REDIS_OK);
    ck_assert_int_eq(redisReaderGetReply(rd, &r), REDIS_OK);
    ck_assert_ptr_nonnull(r);
    redisReaderFree(rd);
    return r;
}

/* A TIME reply in milliseconds, its parts as bulk or status strings; -1
 * for anything else. */
START_TEST(time_replies_parse)
{
    const struct {
        const char *text;
        long long ms;
    } c[] = {
        {"*2\r\n$10\r\n1700000000\r\n$6\r\n123456\r\n", 1700000000123LL},
        {"*2\r\n+1700000000\r\n+999999\r\n", 1700000000999LL},
        {"*2\r\n$10\r\n1700000000\r\n:5\r\n", -1},
        {"*1\r\n$10\r\n1700000000\r\n", -1},
        {"-ERR unknown command\r\n", -1},
        {"$10\r\n1700000000\r\n", -1},
    };
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        redisReply *r = resp(c[i].text);
        ck_assert_int_eq(rconn_time_ms(r), c[i].ms);
        freeReplyObject(r);
    }
    ck_assert_int_eq(rconn_time_ms(NULL), -1);
}
END_TEST

START_TEST(redirects_parse)
{
    struct rcluster_redirect d;
    const char *m = "MOVED 3999 127.0.0.1:6381";
    ck_assert_int_eq(rcluster_parse_redirect(m, strlen(m), &d), CS_OK);
    ck_assert_int_eq(d.ask, 0);
    ck_assert_int_eq(d.slot, 3999);
    ck_assert_str_eq(d.host, "127.0.0.1");
    ck_assert_int_eq(d.port, 6381);
    const char *a = "ASK 16383 ::1:7002";
    ck_assert_int_eq(rcluster_parse_redirect(a, strlen(a), &d), CS_OK);
    ck_assert_int_eq(d.ask, 1);
    ck_assert_int_eq(d.slot, 16383);
    ck_assert_str_eq(d.host, "::1");
    ck_assert_int_eq(d.port, 7002);
    /* No host: the node that answered (cluster-preferred-endpoint-type unknown). */
    const char *e = "MOVED 1 :7003";
    ck_assert_int_eq(rcluster_parse_redirect(e, strlen(e), &d), CS_OK);
    ck_assert_str_eq(d.host, "");
    ck_assert_int_eq(d.port, 7003);
    static const char *const bad[] = {"MOVED", "MOVED 3999", "MOVED 16384 h:1", "MOVED x h:1",
                                      "MOVED 1 h", "MOVED 1 h:", "MOVED 1 h:0", "MOVED 1 h:70000",
                                      "ASK 1 h:1x", "TRYAGAIN Multiple keys", "NOSCRIPT x",
                                      "MOVED  1 h:1"};
    for (size_t i = 0; i < CS_ARRAY_LEN(bad); i++)
        ck_assert_msg(rcluster_parse_redirect(bad[i], strlen(bad[i]), &d) == CS_ERR,
                      "accepted %s", bad[i]);
}
END_TEST

/* CLUSTER SHARDS of Redis 7.0: two shards, one with two ranges and a
 * replica listed first, one without slots; the second master has no
 * endpoint ("?") so its ip counts. */
static const char SHARDS[] =
    "*3\r\n"
    "*4\r\n$5\r\nslots\r\n*4\r\n:0\r\n:5460\r\n:10923\r\n:10923\r\n$5\r\nnodes\r\n*2\r\n"
    "*12\r\n$2\r\nid\r\n$3\r\nbbb\r\n$4\r\nport\r\n:7004\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n"
    "$8\r\nendpoint\r\n$9\r\n127.0.0.1\r\n$4\r\nrole\r\n$7\r\nreplica\r\n$6\r\nhealth\r\n"
    "$6\r\nonline\r\n"
    "*12\r\n$2\r\nid\r\n$3\r\naaa\r\n$4\r\nport\r\n:7001\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n"
    "$8\r\nendpoint\r\n$9\r\nlocalhost\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$6\r\nhealth\r\n"
    "$6\r\nonline\r\n"
    "*4\r\n$5\r\nslots\r\n*2\r\n:5461\r\n:10922\r\n$5\r\nnodes\r\n*1\r\n"
    "*10\r\n$2\r\nid\r\n$3\r\nccc\r\n$4\r\nport\r\n:7002\r\n$2\r\nip\r\n$8\r\n10.0.0.2\r\n"
    "$8\r\nendpoint\r\n$1\r\n?\r\n$4\r\nrole\r\n$6\r\nmaster\r\n"
    "*4\r\n$5\r\nslots\r\n*0\r\n$5\r\nnodes\r\n*1\r\n"
    "*6\r\n$2\r\nid\r\n$3\r\nddd\r\n$4\r\nport\r\n:7003\r\n$4\r\nrole\r\n$6\r\nmaster\r\n";

/* CLUSTER SLOTS: an empty host means the node that was asked. */
static const char SLOTS[] =
    "*2\r\n"
    "*4\r\n:0\r\n:8191\r\n*3\r\n$9\r\n127.0.0.1\r\n:7001\r\n$3\r\naaa\r\n"
    "*3\r\n$9\r\n127.0.0.1\r\n:7004\r\n$3\r\nbbb\r\n"
    "*3\r\n:8192\r\n:16383\r\n*3\r\n$0\r\n\r\n:7002\r\n$3\r\nccc\r\n";

START_TEST(maps_parse)
{
    struct rcluster_range *v;
    size_t n;
    redisReply *r = resp(SHARDS);
    ck_assert_int_eq(rcluster_parse_map(r, 1, "seed", &v, &n), CS_OK);
    freeReplyObject(r);
    ck_assert_uint_eq(n, 3);
    ck_assert_int_eq(v[0].from, 0);
    ck_assert_int_eq(v[0].to, 5460);
    ck_assert_str_eq(v[0].host, "localhost");
    ck_assert_int_eq(v[0].port, 7001);
    ck_assert_int_eq(v[1].from, 10923);
    ck_assert_int_eq(v[1].to, 10923);
    ck_assert_int_eq(v[2].from, 5461);
    ck_assert_str_eq(v[2].host, "10.0.0.2");
    ck_assert_int_eq(v[2].port, 7002);
    free(v);

    r = resp(SLOTS);
    ck_assert_int_eq(rcluster_parse_map(r, 0, "seed", &v, &n), CS_OK);
    freeReplyObject(r);
    ck_assert_uint_eq(n, 2);
    ck_assert_str_eq(v[0].host, "127.0.0.1");
    ck_assert_int_eq(v[0].port, 7001);
    ck_assert_int_eq(v[1].from, 8192);
    ck_assert_int_eq(v[1].to, 16383);
    ck_assert_str_eq(v[1].host, "seed");
    ck_assert_int_eq(v[1].port, 7002);
    free(v);

    /* Shapes that are not a map. */
    static const char *const bad[] = {
        "-ERR unknown command\r\n", "*1\r\n:1\r\n", "*1\r\n*3\r\n:5\r\n:1\r\n*0\r\n",
        "*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\nh\r\n:1\r\n",
        "*1\r\n*4\r\n$5\r\nslots\r\n*1\r\n:0\r\n$5\r\nnodes\r\n*0\r\n"};
    for (size_t i = 0; i < CS_ARRAY_LEN(bad); i++) {
        r = resp(bad[i]);
        ck_assert_msg(rcluster_parse_map(r, 1, "s", &v, &n) == CS_ERR &&
                          rcluster_parse_map(r, 0, "s", &v, &n) == CS_ERR,
                      "accepted reply %zu", i);
        freeReplyObject(r);
    }
}
END_TEST

/* One CLUSTER SHARDS node of Redis 7.x, appended to buf. */
static void shard_node(char *buf, size_t cap, const char *ip, int port, const char *role,
                       const char *health)
{
    char p[8];
    snprintf(p, sizeof(p), "%d", port);
    size_t n = strlen(buf);
    snprintf(buf + n, cap - n,
             "*10\r\n$2\r\nid\r\n$1\r\nx\r\n$4\r\nport\r\n:%d\r\n$2\r\nip\r\n$%zu\r\n%s\r\n"
             "$4\r\nrole\r\n$%zu\r\n%s\r\n$6\r\nhealth\r\n$%zu\r\n%s\r\n",
             port, strlen(ip), ip, strlen(role), role, strlen(health), health);
}

/* Redis 7.2 lists a failed old master beside the promoted one in its shard:
 * the map takes the healthy one. */
START_TEST(failed_nodes_are_left_out)
{
    char buf[2048] = "*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:16383\r\n$5\r\nnodes\r\n*4\r\n";
    shard_node(buf, sizeof(buf), "10.0.0.1", 7001, "master", "failed");
    shard_node(buf, sizeof(buf), "10.0.0.2", 7002, "master", "online");
    shard_node(buf, sizeof(buf), "10.0.0.3", 7003, "replica", "online");
    shard_node(buf, sizeof(buf), "10.0.0.4", 7004, "replica", "fail");
    struct rcluster_range *v;
    size_t n;
    redisReply *r = resp(buf);
    ck_assert_int_eq(rcluster_parse_map(r, 1, "seed", &v, &n), CS_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert_str_eq(v[0].host, "10.0.0.2");
    ck_assert_int_eq(v[0].port, 7002);
    free(v);
    freeReplyObject(r);
}
END_TEST

/* The durability rule counts, from the CLUSTER NODES of the master asked,
 * its replicas that could still be promoted: a failed replica stops counting
 * only once its silence is older than the validity bound (Redis would not
 * promote it); one flagged failed a moment ago still counts. */
START_TEST(copies_count_replicas_that_can_be_promoted)
{
    /* The shipped fragment: node timeout 2 s, factor 5, ping 1 s, repl-timeout 5 s. */
    const long long now = 1700000100000LL, w = rcluster_stale_ms(2000, 5, 1, 5);
    char text[2048];

    ck_assert_int_eq(w, 2000 * 7 + (1 + 5 + 3) * 1000);
    ck_assert_int_eq(rcluster_stale_ms(15000, 10, 10, 60), 15000 * 12 + 73000); /* Redis' */
    ck_assert_int_eq(rcluster_stale_ms(2000, 0, 1, 5), -1); /* factor 0: any age */
    ck_assert_int_eq(rcluster_stale_ms(2000, -1, 1, 5), -1);
    ck_assert_int_eq(rcluster_stale_ms(2000, 5, 1, -1), -1);
    snprintf(text, sizeof(text),
             "aaa 10.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460\n"
             /* healthy replica */
             "bbb 10.0.0.2:7002@17002 slave aaa 0 %lld 1 connected\n"
             /* failed a while ago, but still young enough to be promoted */
             "ccc 10.0.0.3:7003@17003 slave,fail aaa %lld %lld 1 disconnected\n"
             /* failed, its last pong past the bound (its newer ping unanswered) */
             "ddd 10.0.0.4:7004@17004 slave,fail aaa %lld %lld 1 disconnected\n"
             /* only suspected: counts whatever its age */
             "eee 10.0.0.5:7005@17005 slave,fail? aaa %lld 0 1 disconnected\n"
             /* failed, never answered since this master started: its oldest
              * unanswered ping is past the bound */
             "hhh 10.0.0.8:7008@17008 slave,fail aaa %lld 0 1 disconnected\n"
             /* failed, nothing known: counts */
             "iii 10.0.0.9:7009@17009 slave,fail aaa 0 0 1 disconnected\n"
             /* failed exactly at the bound: still counts; spelled "replica" */
             "jjj 10.0.0.10:7010@17010 replica,fail aaa %lld %lld 1 disconnected\r\n"
             /* another master's replica, and another master */
             "fff 10.0.0.6:7006@17006 slave ggg 0 %lld 2 connected\n"
             "ggg 10.0.0.7:7007@17007 master - 0 %lld 2 connected 5461-16383\n",
             now - 100,                  /* bbb */
             now - 1000, now - (w - 4000), /* ccc */
             now - 1000, now - (w + 2000), /* ddd */
             now - 5000 * w,             /* eee */
             now - (w + 1000),           /* hhh */
             now - 10, now - w,          /* jjj */
             now - 100, now - 100);
    /* bbb ccc eee iii jjj */
    ck_assert_int_eq(rcluster_parse_copies(text, now, w), 5);
    ck_assert_int_eq(rcluster_parse_copies(text, now, -1), 7); /* no bound: all count */
    /* later: ccc and jjj are past it too */
    ck_assert_int_eq(rcluster_parse_copies(text, now + 5000, w), 3);

    /* Asked of a replica, or of text that is not CLUSTER NODES: unknown. */
    ck_assert_int_eq(rcluster_parse_copies("aaa 10.0.0.1:7001@17001 myself,slave bbb 0 0 1 "
                                           "connected\n", now, w), -1);
    ck_assert_int_eq(rcluster_parse_copies("ERR nonsense", now, w), -1);
    ck_assert_int_eq(rcluster_parse_copies("", now, w), -1);
    ck_assert_int_eq(rcluster_parse_copies(NULL, now, w), -1);
    /* A master alone. */
    ck_assert_int_eq(rcluster_parse_copies("aaa 10.0.0.1:7001@17001 myself,master - 0 0 1 "
                                           "connected 0-16383\r\n", now, w), 0);
}
END_TEST

START_TEST(seed_lists_parse)
{
    struct rcluster_range s[4];
    ck_assert_int_eq(rcluster_parse_nodes("127.0.0.1:7001,redis-b:7002", s, 4), 2);
    ck_assert_str_eq(s[1].host, "redis-b");
    ck_assert_int_eq(s[1].port, 7002);
    ck_assert_int_eq(rcluster_parse_nodes("", s, 4), 0);
    ck_assert_int_eq(rcluster_parse_nodes("h:1,h", s, 4), -1);
    ck_assert_int_eq(rcluster_parse_nodes(":1", s, 4), -1);
    ck_assert_int_eq(rcluster_parse_nodes("a:1,b:2,c:3,d:4,e:5", s, 4), -1);
}
END_TEST

/* ---- two fake nodes that send a client back and forth -------------------------------- */

/* A listening socket on 127.0.0.1 and its port. */
static int fake_listen(int *port)
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

/* The fake node (a child process): CLUSTER ... is answered with a map that
 * gives it every slot; anything else, 150 ms later, with MOVED to other. A
 * blocking client sends one command at a time, so one read is one command. */
static void fake_serve(int lfd, int self, int other)
{
    signal(SIGCHLD, SIG_IGN);
    for (;;) {
        int c = accept(lfd, NULL, NULL);
        if (c < 0)
            continue;
        if (fork() == 0) {
            char buf[4096], out[512];
            ssize_t n;
            while ((n = read(c, buf, sizeof(buf))) > 0) {
                if (memmem(buf, (size_t)n, "CLUSTER", 7) != NULL) {
                    snprintf(out, sizeof(out),
                             "*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:16383\r\n$5\r\nnodes\r\n"
                             "*1\r\n*8\r\n$4\r\nport\r\n:%d\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n"
                             "$4\r\nrole\r\n$6\r\nmaster\r\n$6\r\nhealth\r\n$6\r\nonline\r\n",
                             self);
                } else {
                    usleep(150000);
                    snprintf(out, sizeof(out), "-MOVED 1584 127.0.0.1:%d\r\n", other);
                }
                if (write(c, out, strlen(out)) < 0)
                    break;
            }
            _exit(0);
        }
        close(c);
    }
}

/* Two nodes that answer MOVED to each other after 150 ms each: a command
 * ends by its deadline (command_timeout_ms, or the request deadline when
 * nearer), not after five slow hops. */
START_TEST(redirects_end_by_the_deadline)
{
    int port[2], lfd[2];
    pid_t pid[2];
    lfd[0] = fake_listen(&port[0]);
    lfd[1] = fake_listen(&port[1]);
    for (int i = 0; i < 2; i++) {
        pid[i] = fork();
        ck_assert_int_ge(pid[i], 0);
        if (pid[i] == 0)
            fake_serve(lfd[i], port[i], port[1 - i]);
    }
    close(lfd[0]);
    close(lfd[1]);

    char nodes[64];
    snprintf(nodes, sizeof(nodes), "127.0.0.1:%d", port[0]);
    struct rcluster_shared sh;
    memset(&sh, 0, sizeof(sh));
    struct rconn_opts o = {.host = "127.0.0.1", .password = "", .connect_timeout_ms = 500,
                           .command_timeout_ms = 200, .no_backoff = 1, .cluster = 1,
                           .nodes = nodes, .cluster_shared = &sh};
    struct rconn *rc = rconn_new(&o);
    int64_t t0 = cs_mono_ms();
    redisReply *r = rconn_command(rc, "lo{3}", "SET lo{3} 1");
    int64_t took = cs_mono_ms() - t0;
    ck_assert_ptr_null(r);
    ck_assert_msg(took < 330, "SET took %lld ms with command_timeout_ms = 200", (long long)took);
    ck_assert_uint_ge(atomic_load(&sh.moved), 1);

    /* A request deadline nearer than the command timeout wins; once it has
     * passed nothing is sent at all. */
    rconn_set_deadline(rc, cs_mono_ms() + 60);
    t0 = cs_mono_ms();
    r = rconn_command(rc, "lo{3}", "SET lo{3} 1");
    took = cs_mono_ms() - t0;
    ck_assert_ptr_null(r);
    ck_assert_msg(took < 190, "SET took %lld ms with a 60 ms request deadline", (long long)took);
    struct timespec ts = {0, 70 * 1000000L};
    nanosleep(&ts, NULL);
    r = rconn_command(rc, "lo{3}", "SET lo{3} 1");
    ck_assert_ptr_null(r);
    ck_assert_int_eq(rc->err, RCONN_ERR_DEADLINE);
    rconn_free(rc);

    for (int i = 0; i < 2; i++) {
        kill(pid[i], SIGKILL);
        waitpid(pid[i], NULL, 0);
    }
}
END_TEST

/* ---- a real two-master cluster ------------------------------------------------------- */

static pid_t srv_pid[2];
static int srv_port[2];
static char srv_dir[64];

/* A free loopback port below 55535: the cluster bus listens on port + 10000,
 * and the port and its bus port must both be free. */
static int free_port(void)
{
    srand((unsigned)getpid() ^ (unsigned)cs_mono_us());
    for (int tries = 0; tries < 1000; tries++) {
        int p = 20000 + rand() % 12000, ok = 1;
        for (int k = 0; k < 2 && ok; k++) {
            struct sockaddr_in sa = {.sin_family = AF_INET,
                                     .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                                     .sin_port = htons((uint16_t)(p + 10000 * k))};
            int fd = socket(AF_INET, SOCK_STREAM, 0);
            ok = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
            close(fd);
        }
        if (ok && p != srv_port[0])
            return p;
    }
    ck_abort_msg("no free port");
    return -1;
}

/* A plain connection to server i (no routing), for set-up and checks. */
static redisContext *direct(int i)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", srv_port[i], tv);
    ck_assert_ptr_nonnull(c);
    ck_assert_int_eq(c->err, 0);
    return c;
}

static redisReply *dcmd(int i, const char *fmt, ...)
{
    redisContext *c = direct(i);
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    ck_assert_ptr_nonnull(r);
    redisFree(c);
    return r;
}

static void dcheck(int i, const char *fmt, ...)
{
    redisContext *c = direct(i);
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    ck_assert_ptr_nonnull(r);
    ck_assert_msg(r->type != REDIS_REPLY_ERROR, "%s", r->str);
    freeReplyObject(r);
    redisFree(c);
}

static void node_id(int i, char *out)
{
    redisReply *r = dcmd(i, "CLUSTER MYID");
    ck_assert_int_eq(r->type, REDIS_REPLY_STRING);
    snprintf(out, 41, "%s", r->str);
    freeReplyObject(r);
}

static void cluster_start(void)
{
    snprintf(srv_dir, sizeof(srv_dir), "/tmp/cs-rcluster.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(srv_dir));
    for (int i = 0; i < 2; i++) {
        char port[16], dir[96];
        srv_port[i] = free_port();
        snprintf(port, sizeof(port), "%d", srv_port[i]);
        snprintf(dir, sizeof(dir), "%s/%d", srv_dir, i);
        mkdir(dir, 0700);
        srv_pid[i] = fork();
        if (srv_pid[i] == 0) {
            freopen("/dev/null", "w", stdout);
            execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1",
                   "--dir", dir, "--save", "", "--appendonly", "no", "--cluster-enabled", "yes",
                   "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
                   (char *)NULL);
            _exit(127);
        }
    }
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 100; k++) {
            struct timeval tv = {0, 200000};
            redisContext *c = redisConnectWithTimeout("127.0.0.1", srv_port[i], tv);
            int ok = c != NULL && c->err == 0;
            if (c)
                redisFree(c);
            if (ok)
                break;
            usleep(50000);
        }
    }
    dcheck(0, "CLUSTER MEET 127.0.0.1 %d", srv_port[1]);
    dcheck(0, "CLUSTER ADDSLOTSRANGE 0 8191");
    dcheck(1, "CLUSTER ADDSLOTSRANGE 8192 16383");
    for (int k = 0; k < 200; k++) {
        int ok = 1;
        for (int i = 0; i < 2; i++) {
            redisReply *r = dcmd(i, "CLUSTER INFO");
            ok &= strstr(r->str, "cluster_state:ok") != NULL &&
                  strstr(r->str, "cluster_known_nodes:2") != NULL;
            freeReplyObject(r);
        }
        if (ok)
            return;
        usleep(50000);
    }
    ck_abort_msg("the two-node cluster did not come up");
}

static void cluster_stop(void)
{
    for (int i = 0; i < 2; i++)
        if (srv_pid[i] > 0) {
            kill(srv_pid[i], SIGKILL);
            waitpid(srv_pid[i], NULL, 0);
        }
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", srv_dir);
    if (srv_dir[0] != '\0' && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", srv_dir);
}

/* keys_slot() of every key the code builds equals CLUSTER KEYSLOT. */
START_TEST(key_slots_match_the_server)
{
    char k[KEYS_MAX];
    int checked = 0;
    for (int i = 0; i < 4 * KEYS_SHARDS; i++) {
        size_t (*shard_keys[])(char *, int) = {keys_stock, keys_queue, keys_dead, keys_sync_lock,
                                               keys_window, keys_fence};
        for (size_t b = 0; b < CS_ARRAY_LEN(shard_keys); b++) {
            size_t n = i < KEYS_SHARDS ? shard_keys[b](k, i) : 0;
            if (n == 0)
                continue;
            redisReply *r = dcmd(0, "CLUSTER KEYSLOT %b", k, n);
            ck_assert_int_eq(r->type, REDIS_REPLY_INTEGER);
            ck_assert_msg(r->integer == keys_slot(k, n), "%s: %lld vs %u", k, r->integer,
                          keys_slot(k, n));
            freeReplyObject(r);
            checked++;
        }
        int64_t ids[] = {i + 1, 1000000007LL + i, 9223372036854775807LL - i};
        for (size_t j = 0; j < CS_ARRAY_LEN(ids); j++) {
            size_t n = keys_seize_list(k, ids[j]);
            redisReply *r = dcmd(0, "CLUSTER KEYSLOT %b", k, n);
            ck_assert_msg(r->integer == keys_slot(k, n), "%s", k);
            /* and it shares the slot of its shard's stock */
            char s[KEYS_MAX];
            size_t sn = keys_stock(s, keys_shard(ids[j]));
            ck_assert_uint_eq(keys_slot(s, sn), keys_slot(k, n));
            freeReplyObject(r);
            checked++;
        }
    }
    const char *global[] = {KEY_ACTIVITY_LIST, KEY_ACTIVITY_VOIDED, KEY_HEALTH};
    for (size_t j = 0; j < CS_ARRAY_LEN(global); j++) {
        redisReply *r = dcmd(0, "CLUSTER KEYSLOT %s", global[j]);
        ck_assert_int_eq(r->integer, keys_slot(global[j], strlen(global[j])));
        freeReplyObject(r);
    }
    /* The ten tags' slots the documentation relies on. */
    static const int tag_slot[KEYS_SHARDS] = {13907, 9842, 5649, 1584, 14039,
                                              9974,  5781, 1716, 14171, 10106};
    for (int i = 0; i < KEYS_SHARDS; i++) {
        size_t n = keys_stock(k, i);
        ck_assert_int_eq((int)keys_slot(k, n), tag_slot[i]);
    }
    ck_assert_int_ge(checked, 50 + 120);
}
END_TEST

static struct rcluster_shared shared;

static struct rconn *cluster_rconn(int seed)
{
    char nodes[64];
    snprintf(nodes, sizeof(nodes), "127.0.0.1:%d", srv_port[seed]);
    struct rconn_opts o = {.host = "127.0.0.1", .password = "", .connect_timeout_ms = 500,
                           .command_timeout_ms = 1000, .no_backoff = 1, .cluster = 1,
                           .nodes = nodes, .cluster_shared = &shared};
    return rconn_new(&o);
}

/* Which server holds key (EXISTS there). */
static int holder(const char *key)
{
    for (int i = 0; i < 2; i++) {
        /* ASKING: an importing node answers for the keys it already has. */
        redisContext *c = direct(i);
        redisReply *r = redisCommand(c, "ASKING");
        freeReplyObject(r);
        r = redisCommand(c, "EXISTS %s", key);
        ck_assert_ptr_nonnull(r);
        int has = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
        freeReplyObject(r);
        redisFree(c);
        if (has)
            return i;
    }
    return -1;
}

START_TEST(commands_follow_slots_moved_and_ask)
{
    /* Seeded with the second node only: the map says where each slot is. */
    struct rconn *rc = cluster_rconn(1);
    const char *lo = "lo{3}", *hi = "hi{0}"; /* slots 1584 and 13907 */
    redisReply *r = rconn_command(rc, lo, "SET %s a", lo);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->type, REDIS_REPLY_STATUS);
    freeReplyObject(r);
    r = rconn_command(rc, hi, "SET %s b", hi);
    freeReplyObject(r);
    ck_assert_int_eq(holder(lo), 0);
    ck_assert_int_eq(holder(hi), 1);

    /* A pipeline across both masters: replies in the order of the appends. */
    ck_assert_int_eq(rconn_append(rc, hi, "GET %s", hi), CS_OK);
    ck_assert_int_eq(rconn_append(rc, lo, "GET %s", lo), CS_OK);
    ck_assert_int_eq(rconn_append(rc, hi, "STRLEN %s", hi), CS_OK);
    redisReply *a, *b, *c;
    ck_assert_int_eq(rconn_get_reply(rc, &a), CS_OK);
    ck_assert_int_eq(rconn_get_reply(rc, &b), CS_OK);
    ck_assert_int_eq(rconn_get_reply(rc, &c), CS_OK);
    ck_assert_str_eq(a->str, "b");
    ck_assert_str_eq(b->str, "a");
    ck_assert_int_eq(c->integer, 1);
    freeReplyObject(a);
    freeReplyObject(b);
    freeReplyObject(c);

    /* EVALSHA: NOSCRIPT on a node loads the script there. */
    struct rscript s = {0};
    s.src = xstrdup("return redis.call('GET', KEYS[1])");
    s.len = strlen(s.src);
    const char *argv_lo[] = {lo}, *argv_hi[] = {hi};
    r = rconn_evalsha(rc, &s, 1, 1, argv_lo, NULL);
    ck_assert_ptr_nonnull(r);
    ck_assert_str_eq(r->str, "a");
    freeReplyObject(r);
    r = rconn_evalsha(rc, &s, 1, 1, argv_hi, NULL); /* never loaded on node 1 */
    ck_assert_ptr_nonnull(r);
    ck_assert_str_eq(r->str, "b");
    freeReplyObject(r);

    /* Slot 1584 migrates from node 0 to node 1. */
    char id0[41], id1[41];
    node_id(0, id0);
    node_id(1, id1);
    dcheck(1, "CLUSTER SETSLOT 1584 IMPORTING %s", id0);
    dcheck(0, "CLUSTER SETSLOT 1584 MIGRATING %s", id1);
    /* A key not yet on the target: ASK, ASKING, written on the target. */
    const char *lo2 = "lo2{3}";
    r = rconn_command(rc, lo2, "SET %s c", lo2);
    ck_assert_ptr_nonnull(r);
    ck_assert_msg(r->type == REDIS_REPLY_STATUS, "%s", r->str);
    freeReplyObject(r);
    ck_assert_int_eq(holder(lo2), 1);
    /* A key still on the source is served there. */
    r = rconn_command(rc, lo, "GET %s", lo);
    ck_assert_str_eq(r->str, "a");
    freeReplyObject(r);
    /* Multi-key script over keys split between the two: TRYAGAIN, then the
     * deadline (1 s) runs out and the error is the answer. */
    struct rscript s2 = {0};
    s2.src = xstrdup("return redis.call('MGET', KEYS[1], KEYS[2])");
    s2.len = strlen(s2.src);
    const char *two[] = {lo, lo2};
    int64_t t0 = cs_mono_ms();
    r = rconn_evalsha(rc, &s2, 2, 2, two, NULL);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->type, REDIS_REPLY_ERROR);
    ck_assert_msg(strncmp(r->str, "TRYAGAIN", 8) == 0, "%s", r->str);
    ck_assert_int_ge(cs_mono_ms() - t0, 500);
    freeReplyObject(r);

    /* The migration ends: MIGRATE the key, SETSLOT NODE on both. */
    dcheck(0, "MIGRATE 127.0.0.1 %d %s 0 2000", srv_port[1], lo);
    dcheck(1, "CLUSTER SETSLOT 1584 NODE %s", id1);
    dcheck(0, "CLUSTER SETSLOT 1584 NODE %s", id1);
    r = rconn_evalsha(rc, &s2, 2, 2, two, NULL);
    ck_assert_ptr_nonnull(r);
    ck_assert_msg(r->type == REDIS_REPLY_ARRAY, "%s", r->type == REDIS_REPLY_ERROR ? r->str : "");
    ck_assert_str_eq(r->element[0]->str, "a");
    ck_assert_str_eq(r->element[1]->str, "c");
    freeReplyObject(r);
    /* The map now sends slot 1584 to node 1 (learned from MOVED). */
    char addr1[32];
    snprintf(addr1, sizeof(addr1), "127.0.0.1:%d", srv_port[1]);
    ck_assert_str_eq(rcluster_slot_addr(rc->cl, 1584), addr1);
    ck_assert_uint_ge(atomic_load(&shared.ask), 1);
    ck_assert_uint_ge(atomic_load(&shared.moved), 1);
    ck_assert_uint_ge(atomic_load(&shared.tryagain), 1);

    /* A pipeline whose map is stale gets its MOVED command resent. */
    dcheck(1, "CLUSTER SETSLOT 1584 MIGRATING %s", id0);
    dcheck(0, "CLUSTER SETSLOT 1584 IMPORTING %s", id1);
    dcheck(1, "MIGRATE 127.0.0.1 %d %s 0 2000 KEYS %s %s", srv_port[0], "", lo, lo2);
    dcheck(0, "CLUSTER SETSLOT 1584 NODE %s", id0);
    dcheck(1, "CLUSTER SETSLOT 1584 NODE %s", id0);
    uint64_t moved = atomic_load(&shared.moved);
    ck_assert_int_eq(rconn_append(rc, lo, "GET %s", lo), CS_OK);
    ck_assert_int_eq(rconn_append(rc, hi, "GET %s", hi), CS_OK);
    ck_assert_int_eq(rconn_get_reply(rc, &a), CS_OK);
    ck_assert_int_eq(rconn_get_reply(rc, &b), CS_OK);
    /* One MOVED followed, or none when a slot-map refresh (throttled, so
     * possibly one queued by the redirects above) already learned the move. */
    ck_assert_uint_le(atomic_load(&shared.moved), moved + 1);
    ck_assert_msg(a->type == REDIS_REPLY_STRING, "%s", a->str);
    ck_assert_str_eq(a->str, "a");
    ck_assert_str_eq(b->str, "b");
    freeReplyObject(a);
    freeReplyObject(b);

    rscript_free(&s);
    rscript_free(&s2);
    rconn_free(rc);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("rcluster");
    TCase *tc = tcase_create("parse");
    tcase_add_test(tc, time_replies_parse);
    tcase_add_test(tc, redirects_parse);
    tcase_add_test(tc, maps_parse);
    tcase_add_test(tc, seed_lists_parse);
    tcase_add_test(tc, failed_nodes_are_left_out);
    tcase_add_test(tc, copies_count_replicas_that_can_be_promoted);
    tcase_add_test(tc, redirects_end_by_the_deadline);
    suite_add_tcase(s, tc);
    TCase *tr = tcase_create("cluster");
    tcase_add_unchecked_fixture(tr, cluster_start, cluster_stop);
    tcase_set_timeout(tr, 60);
    tcase_add_test(tr, key_slots_match_the_server);
    tcase_add_test(tr, commands_follow_slots_moved_and_ask);
    suite_add_tcase(s, tr);
    /* Fork mode would kill the fixture's servers with the first test child. */
    return cs_run_suite(s, 1);
}
