/* floor-fcgi.c - the least a seize responder can do: the benchmark's floor. */

/*
 * A bare libfcgi + hiredis responder: per request it reads the user id from
 * the bearer token's payload (base64url "sub", NOT verified), the activity id
 * from the body ({"id":N}), runs one EVALSHA of a minimal seize script on the
 * same four keys as lua/seize.lua, and answers in the same JSON shape as
 * coupon-fcgi. No authentication, no metadata cache, no metrics, no breaker.
 * Measured next to coupon-fcgi through the same web server, Redis and worker
 * count, it shows what authentication, the node's checks and accounting cost.
 *
 *   floor-fcgi -s PATH -r HOST:PORT [-n WORKERS] [-b BACKLOG] [-f SCRIPT] [-w USEC]
 *
 * -f sends the Lua file SCRIPT instead of the built-in minimal script. -w
 * spends USEC microseconds of the worker's CPU on each request before its
 * EVALSHA (a busy loop): a longer node-side path, and nothing else. SIGTERM
 * or SIGINT stops the workers and removes the socket. Not for production: it
 * believes any token.
 */
#include "cs.h"
#include "keys.h"
#include "prefork.h"

#include <fcgiapp.h>
#include <hiredis/hiredis.h>

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The same keys and answers as lua/seize.lua, minus the window parse: the
 * window field must exist, the stock must be positive. */
static const char floor_minimal_script[] =
    "if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then return -1 end\n"
    "local s = redis.call('HGET', KEYS[1], ARGV[1])\n"
    "if not s or not redis.call('HGET', KEYS[4], ARGV[1]) then return -3 end\n"
    "s = tonumber(s)\n"
    "if s <= 0 then return -2 end\n"
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "redis.call('HINCRBY', KEYS[1], ARGV[1], -1)\n"
    "redis.call('HSET', KEYS[2], ARGV[2], now)\n"
    "redis.call('HSET', KEYS[3], ARGV[1] .. ':' .. ARGV[2], now)\n"
    "return s - 1\n";

static const char *floor_script = floor_minimal_script;
static char floor_sha[41];
static const char *floor_host = "127.0.0.1";
static int floor_port = 6379;
static void floor_usage(FILE *out)
{
    fprintf(out, "usage: floor-fcgi -s PATH|:PORT -r HOST:PORT [-n WORKERS] [-b BACKLOG] "
                 "[-f SCRIPT] [-w USEC]\n");
}

static void floor_reply(FCGX_Stream *out, const char *status, const char *code, const char *msg,
                        const char *extra)
{
    char body[256];
    int n = snprintf(body, sizeof(body), "{\"code\":\"%s\",\"msg\":\"%s\"%s%s}", code, msg,
                     extra ? "," : "", extra ? extra : "");
    FCGX_FPrintF(out,
                 "Status: %s\r\nContent-Type: application/json; charset=utf-8\r\n"
                 "Cache-Control: no-store\r\nContent-Length: %d\r\n\r\n",
                 status, n);
    FCGX_PutStr(body, n, out);
}

/* The "sub" of "Bearer h.p.s" read from p without any check; 0 when absent. */
static int64_t floor_token_sub(const char *auth)
{
    unsigned char json[1024];

    if (auth == NULL || strncmp(auth, "Bearer ", 7) != 0)
        return 0;
    const char *p = strchr(auth + 7, '.');
    const char *end = p != NULL ? strchr(p + 1, '.') : NULL;
    if (end == NULL || (size_t)(end - p - 1) * 3 / 4 + 1 > sizeof(json)
        || cs_b64url_decode(p + 1, (size_t)(end - p - 1), json) < 0)
        return 0;
    const char *s = strstr((const char *)json, "\"sub\":");
    if (s == NULL)
        return 0;
    s += 6;
    while (*s == ' ' || *s == '"')
        s++;
    return strtoll(s, NULL, 10);
}

/* Connects to Redis and loads the script; NULL on failure (logged). */
static redisContext *floor_connect(void)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout(floor_host, floor_port, tv);
    if (c == NULL || c->err) {
        fprintf(stderr, "floor-fcgi: redis %s:%d: %s\n", floor_host, floor_port,
                c ? c->errstr : "out of memory");
        if (c)
            redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    redisReply *r = redisCommand(c, "SCRIPT LOAD %s", floor_script);
    if (r == NULL || r->type != REDIS_REPLY_STRING || r->len != 40) {
        fprintf(stderr, "floor-fcgi: SCRIPT LOAD failed\n");
        if (r)
            freeReplyObject(r);
        redisFree(c);
        return NULL;
    }
    memcpy(floor_sha, r->str, 41);
    freeReplyObject(r);
    return c;
}

static long floor_work_us; /* -w */

/* Spends floor_work_us of this thread's CPU time. */
static void floor_spin(void)
{
    struct timespec t0, t;
    if (floor_work_us <= 0)
        return;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    do
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000L + (t.tv_nsec - t0.tv_nsec) / 1000 < floor_work_us);
}

static int floor_serve(int listen_fd)
{
    FCGX_Request req;
    char body[1024];
    redisContext *rc = floor_connect();

    if (rc == NULL || FCGX_InitRequest(&req, listen_fd, 0) != 0)
        return 1;
    while (FCGX_Accept_r(&req) >= 0) {
        int n = FCGX_GetStr(body, (int)sizeof(body) - 1, req.in);
        body[n > 0 ? n : 0] = '\0';
        char spill[256];
        while (FCGX_GetStr(spill, (int)sizeof(spill), req.in) > 0) /* drain anything longer */
            ;
        int64_t uid = floor_token_sub(FCGX_GetParam("HTTP_AUTHORIZATION", req.envp));
        const char *idp = strstr(body, "\"id\":");
        int64_t id = idp ? strtoll(idp + 5, NULL, 10) : 0;
        if (uid <= 0 || id <= 0) {
            floor_reply(req.out, "400 Bad Request", "BAD_REQUEST", "malformed request", NULL);
            FCGX_Finish_r(&req);
            continue;
        }
        floor_spin();
        int shard = keys_shard(id);
        char k1[KEYS_MAX], k2[KEYS_MAX], k3[KEYS_MAX], k4[KEYS_MAX], a[24], u[24];
        keys_stock(k1, shard);
        keys_seize_list(k2, id);
        keys_queue(k3, shard);
        keys_window(k4, shard);
        snprintf(a, sizeof(a), "%" PRId64, id);
        snprintf(u, sizeof(u), "%" PRId64, uid);
        redisReply *r = redisCommand(rc, "EVALSHA %s 4 %s %s %s %s %s %s", floor_sha, k1, k2, k3,
                                     k4, a, u);
        if (r == NULL || r->type != REDIS_REPLY_INTEGER) {
            floor_reply(req.out, "503 Service Unavailable", "UNAVAILABLE", "redis", NULL);
        } else if (r->integer >= 0) {
            char extra[96];
            snprintf(extra, sizeof(extra), "\"activityId\":%" PRId64 ",\"remaining\":%lld", id,
                     r->integer);
            floor_reply(req.out, "200 OK", "SEIZED", "you got a coupon", extra);
        } else if (r->integer == -1) {
            floor_reply(req.out, "409 Conflict", "ALREADY_SEIZED", "one coupon per user", NULL);
        } else if (r->integer == -2) {
            floor_reply(req.out, "409 Conflict", "SOLD_OUT", "all coupons are gone", NULL);
        } else {
            floor_reply(req.out, "404 Not Found", "NO_SUCH_ACTIVITY", "no such activity", NULL);
        }
        if (r != NULL)
            freeReplyObject(r);
        FCGX_Finish_r(&req);
        if (rc->err) { /* lost the connection: one more try for the next request */
            redisFree(rc);
            rc = floor_connect();
            if (rc == NULL)
                return 1;
        }
    }
    redisFree(rc);
    return 0;
}

static char *floor_read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    long workers = 4, backlog = 1024;
    int opt;

    while ((opt = getopt(argc, argv, "s:n:b:r:f:w:h")) != -1) {
        switch (opt) {
        case 's': path = optarg; break;
        case 'n':
            if (prefork_parse_long(optarg, 1, PREFORK_MAX_WORKERS, &workers) != 0) {
                fprintf(stderr, "floor-fcgi: -n wants 1..%d\n", PREFORK_MAX_WORKERS);
                return 2;
            }
            break;
        case 'b':
            if (prefork_parse_long(optarg, 1, 65535, &backlog) != 0) {
                fprintf(stderr, "floor-fcgi: -b wants 1..65535\n");
                return 2;
            }
            break;
        case 'r': {
            static char host[256];
            const char *colon = strrchr(optarg, ':');
            long port;
            if (colon == NULL || (size_t)(colon - optarg) >= sizeof(host)
                || prefork_parse_long(colon + 1, 1, 65535, &port) != 0) {
                fprintf(stderr, "floor-fcgi: -r wants HOST:PORT\n");
                return 2;
            }
            memcpy(host, optarg, (size_t)(colon - optarg));
            host[colon - optarg] = '\0';
            floor_host = host;
            floor_port = (int)port;
            break;
        }
        case 'w':
            if (prefork_parse_long(optarg, 0, 1000000, &floor_work_us) != 0) {
                fprintf(stderr, "floor-fcgi: -w wants 0..1000000\n");
                return 2;
            }
            break;
        case 'f':
            floor_script = floor_read_file(optarg);
            if (floor_script == NULL) {
                fprintf(stderr, "floor-fcgi: cannot read %s\n", optarg);
                return 2;
            }
            break;
        case 'h': floor_usage(stdout); return 0;
        default: floor_usage(stderr); return 2;
        }
    }
    if (optind != argc || path == NULL) {
        floor_usage(stderr);
        return 2;
    }
    if (FCGX_Init() != 0) {
        fprintf(stderr, "floor-fcgi: FCGX_Init() failed\n");
        return 1;
    }
    return prefork_run("floor-fcgi", path, backlog, workers, floor_serve);
}
