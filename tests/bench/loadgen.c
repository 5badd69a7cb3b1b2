/* loadgen.c - closed-loop HTTP/1.1 load generator for the seize route.
 *
 * Keeps C keep-alive connections busy until N requests are answered; each
 * request carries its own HS256 token (user = base + request number, or one
 * fixed user), so every request is a distinct user. Prints the count of
 * each response code, throughput and latency percentiles, as text or JSON.
 *
 *   loadgen -p PORT -s SECRET -a ACTIVITY [-c 64] [-n 2000] [-b USERBASE]
 *           [-U] [-u PATH] [-m METHOD] [-d BODY] [-T trusted-header] [-j]
 *           [-D SECONDS] [-L FILE] [-r ROLE] [-B FILE] [-R RPS]
 *
 * -r ROLE adds a "role" claim to every token (e.g. "service" for the coupon
 * use route). -B FILE takes the bodies from FILE, one a line: request n
 * sends line n (modulo the count), so each request can name its own coupon
 * and order.
 * -D runs for SECONDS instead of stopping after N requests (N is then only a
 * cap). -L writes one line per response: "ms_since_start status code user
 * latency_us", after a first line "# start_epoch_ms E". SIGTERM or SIGINT ends
 * the run early: requests in flight are answered, then the summary is printed.
 * -R paces the load: request n is not sent before start + n / RPS seconds (a
 * connection whose next request is not due yet waits idle), so a run of N
 * requests spreads over N / RPS seconds at least; the C connections still cap
 * what is in flight. Latency is measured from the send, not from when the
 * request was due.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jwt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CODES 32
#define BUF 8192

struct conn {
    int fd;
    char out[BUF];
    size_t outlen, outoff;
    char in[BUF];
    size_t inlen;
    int64_t sent_us;
    int64_t user;
    int busy;
    int closing; /* the last response said "Connection: close" */
};

static struct {
    const char *host, *path, *method, *secret, *body, *mode, *role, *bodyfile;
    int port, conc, total, same_user, json;
    int64_t activity, user_base;
    double duration, rate;
    const char *logpath;
} opt = {"127.0.0.1", "/market/consumer/coupon/seize", "POST", NULL, NULL, "jwt", NULL, NULL,
         0, 64, 2000, 0, 0, 1, 1000000, 0, 0, NULL};

static char **bodies; /* -B: one body per line */
static int nbodies;

static void load_bodies(const char *path)
{
    FILE *f = fopen(path, "r");
    char line[512];
    if (f == NULL) {
        perror(path);
        exit(2);
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '\0')
            continue;
        bodies = realloc(bodies, (size_t)(nbodies + 1) * sizeof(*bodies));
        if (bodies == NULL || (bodies[nbodies] = strdup(line)) == NULL)
            abort();
        nbodies++;
    }
    fclose(f);
    if (nbodies == 0) {
        fprintf(stderr, "loadgen: %s has no bodies\n", path);
        exit(2);
    }
}

static FILE *resp_log;
static volatile sig_atomic_t stop_now; /* SIGTERM/SIGINT: no new requests, then report */

static void on_stop(int sig)
{
    (void)sig;
    stop_now = 1;
}
static int64_t t_start;

static char code_names[MAX_CODES][40];
static long code_counts[MAX_CODES];
static int ncodes;
static long status_counts[600];
static int64_t *lat;
static int started, done, errors;
static long waits, events; /* epoll_wait calls, and the events they returned */

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* The log is flushed at least every 100 ms, so a test can follow the load
 * while it runs (tests/lib.sh wait_answers) without a write per answer. */
static void log_response(const struct conn *c, int status, const char *code, int64_t now)
{
    static int64_t flushed_us;
    if (resp_log == NULL)
        return;
    fprintf(resp_log, "%.3f %d %s %lld %lld\n", (double)(now - t_start) / 1000.0, status, code,
            (long long)c->user, (long long)(now - c->sent_us));
    if (now - flushed_us >= 100000) {
        fflush(resp_log);
        flushed_us = now;
    }
}

static void count_code(const char *name)
{
    for (int i = 0; i < ncodes; i++)
        if (strcmp(code_names[i], name) == 0) {
            code_counts[i]++;
            return;
        }
    if (ncodes < MAX_CODES) {
        snprintf(code_names[ncodes], sizeof(code_names[0]), "%s", name);
        code_counts[ncodes++] = 1;
    }
}

static char *mint(int64_t user)
{
    jwt_t *j;
    char sub[24];
    snprintf(sub, sizeof(sub), "%lld", (long long)user);
    if (jwt_new(&j) != 0)
        abort();
    jwt_add_grant(j, "sub", sub);
    if (opt.role != NULL)
        jwt_add_grant(j, "role", opt.role);
    jwt_add_grant_int(j, "exp", (long)time(NULL) + 3600);
    jwt_set_alg(j, JWT_ALG_HS256, (const unsigned char *)opt.secret, (int)strlen(opt.secret));
    char *t = jwt_encode_str(j);
    jwt_free(j);
    return t;
}

static void build_request(struct conn *c, int n)
{
    c->user = opt.same_user ? opt.user_base : opt.user_base + n;
    int64_t user = opt.same_user ? opt.user_base : opt.user_base + n;
    char body[512], auth[1200];
    if (nbodies > 0)
        snprintf(body, sizeof(body), "%s", bodies[n % nbodies]);
    else if (opt.body)
        snprintf(body, sizeof(body), "%s", opt.body);
    else
        snprintf(body, sizeof(body), "{\"id\":%lld}", (long long)opt.activity);
    if (strcmp(opt.mode, "jwt") == 0 && opt.secret) {
        char *t = mint(user);
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s\r\n", t);
        free(t);
    } else if (strcmp(opt.mode, "trusted-header") == 0) {
        snprintf(auth, sizeof(auth), "X-User-Id: %lld\r\n", (long long)user);
    } else {
        auth[0] = '\0';
    }
    int len;
    if (strcmp(opt.method, "GET") != 0)
        len = snprintf(c->out, sizeof(c->out),
                       "%s %s HTTP/1.1\r\nHost: %s\r\n%sContent-Type: application/json\r\n"
                       "Content-Length: %zu\r\n\r\n%s",
                       opt.method, opt.path, opt.host, auth, strlen(body), body);
    else
        len = snprintf(c->out, sizeof(c->out), "%s %s HTTP/1.1\r\nHost: %s\r\n%s\r\n",
                       opt.method, opt.path, opt.host, auth);
    c->outlen = (size_t)len;
    c->outoff = 0;
}

static int connect_one(void)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)opt.port)};
    inet_pton(AF_INET, opt.host, &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        perror("connect");
        exit(2);
    }
    fcntl(fd, F_SETFL, O_NONBLOCK);
    return fd;
}

/* Finds a header (case-insensitive) in the header block [p, hend). */
static const char *find_header(const char *p, const char *hend, const char *name)
{
    size_t n = strlen(name);
    for (; p + n < hend; p++)
        if (p[0] == '\n' && strncasecmp(p + 1, name, n) == 0)
            return p + 1 + n;
    return NULL;
}

/* Walks a chunked body from *body; returns the bytes it takes when complete
 * (copying the data of the first chunk to data), else 0. */
static size_t chunked_length(const char *body, size_t avail, char *data, size_t datalen)
{
    size_t pos = 0;
    int first = 1;
    for (;;) {
        const char *eol = memmem(body + pos, avail - pos, "\r\n", 2);
        if (eol == NULL)
            return 0;
        size_t size = strtoul(body + pos, NULL, 16);
        pos = (size_t)(eol - body) + 2;
        if (size == 0)
            return avail - pos >= 2 ? pos + 2 : 0;
        if (avail - pos < size + 2)
            return 0;
        if (first) {
            size_t n = size < datalen - 1 ? size : datalen - 1;
            memcpy(data, body + pos, n);
            data[n] = '\0';
            first = 0;
        }
        pos += size + 2;
    }
}

/* Returns 1 when c->in holds a whole response, parsing it. */
static int response_complete(struct conn *c)
{
    char *hend = memmem(c->in, c->inlen, "\r\n\r\n", 4);
    char body[BUF];
    size_t used;

    if (hend == NULL)
        return 0;
    size_t hlen = (size_t)(hend - c->in) + 4;
    const char *te = find_header(c->in, hend, "Transfer-Encoding:");
    if (te != NULL && strncasecmp(te + strspn(te, " "), "chunked", 7) == 0) {
        size_t blen = chunked_length(c->in + hlen, c->inlen - hlen, body, sizeof(body));
        if (blen == 0)
            return 0;
        used = hlen + blen;
    } else {
        const char *cl = find_header(c->in, hend, "Content-Length:");
        size_t clen = cl ? strtoul(cl, NULL, 10) : 0;
        if (c->inlen < hlen + clen)
            return 0;
        size_t n = clen < sizeof(body) - 1 ? clen : sizeof(body) - 1;
        memcpy(body, c->in + hlen, n);
        body[n] = '\0';
        used = hlen + clen;
    }
    /* nginx ends a kept connection after keepalive_requests answers (1000
     * by default) with this header: the next request goes on a new one. */
    const char *conn = find_header(c->in, hend, "Connection:");
    c->closing = conn != NULL && strncasecmp(conn + strspn(conn, " "), "close", 5) == 0;
    int status = atoi(c->in + 9);
    if (status > 0 && status < 600)
        status_counts[status]++;
    char name[40];
    const char *code = strstr(body, "\"code\":\"");
    if (code) {
        code += 8;
        size_t n = strcspn(code, "\"");
        if (n >= sizeof(name))
            n = sizeof(name) - 1;
        memcpy(name, code, n);
        name[n] = '\0';
    } else {
        snprintf(name, sizeof(name), "HTTP_%d", status);
    }
    count_code(name);
    log_response(c, status, name, now_us());
    /* Keep any bytes past this response (there should be none). */
    memmove(c->in, c->in + used, c->inlen - used);
    c->inlen -= used;
    return 1;
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* -R: whether request number n may be sent now (always without -R). */
static int due(int64_t t0, int n)
{
    return opt.rate <= 0 || now_us() >= t0 + (int64_t)((double)n * 1e6 / opt.rate);
}

int main(int argc, char **argv)
{
    int o;
    while ((o = getopt(argc, argv, "h:p:u:m:s:a:c:n:b:Ud:T:jD:L:r:B:R:")) != -1) {
        switch (o) {
        case 'h': opt.host = optarg; break;
        case 'p': opt.port = atoi(optarg); break;
        case 'u': opt.path = optarg; break;
        case 'm': opt.method = optarg; break;
        case 's': opt.secret = optarg; break;
        case 'a': opt.activity = atoll(optarg); break;
        case 'c': opt.conc = atoi(optarg); break;
        case 'n': opt.total = atoi(optarg); break;
        case 'b': opt.user_base = atoll(optarg); break;
        case 'U': opt.same_user = 1; break;
        case 'd': opt.body = optarg; break;
        case 'T': opt.mode = optarg; break;
        case 'j': opt.json = 1; break;
        case 'D': opt.duration = atof(optarg); break;
        case 'L': opt.logpath = optarg; break;
        case 'r': opt.role = optarg; break;
        case 'B': opt.bodyfile = optarg; break;
        case 'R': opt.rate = atof(optarg); break;
        default:
            fprintf(stderr, "usage: loadgen -p PORT [-s SECRET] [-a ID] [-c CONC] [-n TOTAL] "
                            "[-b USERBASE] [-U] [-u PATH] [-m METHOD] [-d BODY] "
                            "[-T jwt|trusted-header|none] [-j] [-r ROLE] [-B BODYFILE] "
                            "[-D SECONDS] [-L FILE] [-R RPS]\n");
            return 2;
        }
    }
    if (opt.bodyfile != NULL)
        load_bodies(opt.bodyfile);
    if (opt.port <= 0 || opt.conc <= 0 || opt.total <= 0) {
        fprintf(stderr, "loadgen: -p PORT is required; -c and -n must be positive\n");
        return 2;
    }
    if (opt.duration > 0 && opt.total == 2000)
        opt.total = 100000000; /* -D without -n: no count limit */
    if (opt.conc > opt.total)
        opt.conc = opt.total;
    if (opt.logpath) {
        resp_log = fopen(opt.logpath, "w");
        if (resp_log == NULL) {
            perror(opt.logpath);
            return 2;
        }
        struct timespec rt;
        clock_gettime(CLOCK_REALTIME, &rt);
        fprintf(resp_log, "# start_epoch_ms %lld\n", (long long)rt.tv_sec * 1000 + rt.tv_nsec / 1000000);
    }
    size_t latcap = opt.total < 20000000 ? (size_t)opt.total : 20000000;
    lat = calloc(latcap, sizeof(int64_t));
    struct conn *conns = calloc((size_t)opt.conc, sizeof(struct conn));
    int ep = epoll_create1(0);

    /* Pre-build the first requests so minting is not on the clock. */
    int64_t t0 = now_us();
    t_start = t0;
    int64_t deadline = opt.duration > 0 ? t0 + (int64_t)(opt.duration * 1e6) : INT64_MAX;
    struct sigaction sa = {.sa_handler = on_stop, .sa_flags = SA_RESTART};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    /* -R: connections whose next request is not due yet. */
    struct conn **idle = calloc((size_t)opt.conc, sizeof(*idle));
    int nidle = 0;
    for (int i = 0; i < opt.conc; i++) {
        struct conn *c = &conns[i];
        c->fd = connect_one();
        if (!due(t0, started)) {
            struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
            epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
            idle[nidle++] = c;
            continue;
        }
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
        epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
        build_request(c, started++);
        c->busy = 1;
        c->sent_us = now_us();
    }
    struct epoll_event evs[256];
    int inflight = opt.conc - nidle;
    int64_t last_progress = now_us();
#define MORE() (started < opt.total && now_us() < deadline && !stop_now)
    while (inflight > 0 || (nidle > 0 && MORE())) {
        /* Idle connections take the requests that are due. */
        while (nidle > 0 && MORE() && due(t0, started)) {
            struct conn *c = idle[--nidle];
            if (c->fd < 0) {
                c->fd = connect_one();
                struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
                epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
            } else {
                struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
                epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
            }
            build_request(c, started++);
            c->busy = 1;
            c->sent_us = now_us();
            inflight++;
        }
        int timeout = 1000;
        if (nidle > 0 && MORE()) {
            int64_t wait = t0 + (int64_t)((double)started * 1e6 / opt.rate) - now_us();
            timeout = wait <= 0 ? 0 : (int)((wait + 999) / 1000);
        }
        int n = epoll_wait(ep, evs, 256, timeout);
        waits++;
        if (n > 0)
            events += n;
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (inflight > 0 && now_us() - last_progress > 10000000) {
                fprintf(stderr, "loadgen: no progress for 10 s (%d of %d done)\n", done,
                        opt.total);
                break;
            }
            continue;
        }
        for (int i = 0; i < n; i++) {
            struct conn *c = evs[i].data.ptr;
            if (!c->busy) {
                /* An idle keep-alive connection the server closed: a new
                 * one when its next request is due. */
                char b[64];
                ssize_t r = c->fd >= 0 ? read(c->fd, b, sizeof(b)) : 1;
                if (r == 0 || (r < 0 && errno != EAGAIN)) {
                    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                    close(c->fd);
                    c->fd = -1;
                }
                continue;
            }
            if ((evs[i].events & EPOLLOUT) && c->outoff < c->outlen) {
                ssize_t w = write(c->fd, c->out + c->outoff, c->outlen - c->outoff);
                if (w > 0)
                    c->outoff += (size_t)w;
                if (c->outoff == c->outlen) {
                    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
                    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
                }
            }
            if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                ssize_t r = read(c->fd, c->in + c->inlen, BUF - 1 - c->inlen);
                if (r <= 0 && !(r < 0 && errno == EAGAIN)) {
                    /* Server closed: count the request as an error and reconnect. */
                    errors++;
                    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                    close(c->fd);
                    c->fd = -1;
                    c->inlen = 0;
                    if ((size_t)done < latcap)
                        lat[done] = now_us() - c->sent_us;
                    done++;
                    last_progress = now_us();
                    count_code("CONNECTION_ERROR");
                    log_response(c, 0, "CONNECTION_ERROR", now_us());
                    inflight--;
                    c->busy = 0;
                    if (MORE() && due(t0, started)) {
                        c->fd = connect_one();
                        build_request(c, started++);
                        c->busy = 1;
                        c->sent_us = now_us();
                        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
                        epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
                        inflight++;
                    } else if (MORE()) {
                        idle[nidle++] = c;
                    }
                    continue;
                }
                if (r > 0)
                    c->inlen += (size_t)r;
                if (response_complete(c)) {
                    if ((size_t)done < latcap)
                        lat[done] = now_us() - c->sent_us;
                    done++;
                    last_progress = now_us();
                    inflight--;
                    c->busy = 0;
                    if (c->closing) {
                        epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                        close(c->fd);
                        c->fd = -1;
                        c->inlen = 0;
                        c->closing = 0;
                        if (MORE())
                            idle[nidle++] = c; /* connects when its next request is due */
                        continue;
                    }
                    if (MORE() && due(t0, started)) {
                        build_request(c, started++);
                        c->busy = 1;
                        c->sent_us = now_us();
                        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
                        epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
                        inflight++;
                    } else if (MORE()) {
                        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
                        epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
                        idle[nidle++] = c;
                    } else {
                        epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                    }
                }
            }
        }
    }
#undef MORE
    free(idle);
    double secs = (double)(now_us() - t0) / 1e6;
    if (resp_log)
        fclose(resp_log);
    int nlat = (size_t)done < latcap ? done : (int)latcap;
    qsort(lat, (size_t)nlat, sizeof(int64_t), cmp64);
    double p50 = nlat ? lat[nlat / 2] / 1000.0 : 0, p99 = nlat ? lat[(size_t)(nlat * 0.99)] / 1000.0 : 0;
    double p999 = nlat ? lat[(size_t)(nlat * 0.999)] / 1000.0 : 0, pmax = nlat ? lat[nlat - 1] / 1000.0 : 0;
    if (opt.json) {
        printf("{\"requests\":%d,\"seconds\":%.3f,\"rps\":%.1f,\"p50_ms\":%.3f,\"p99_ms\":%.3f,"
               "\"p999_ms\":%.3f,\"max_ms\":%.3f,\"errors\":%d,\"waits\":%ld,\"events\":%ld,"
               "\"codes\":{",
               done, secs, done / secs, p50, p99, p999, pmax, errors, waits, events);
        for (int i = 0; i < ncodes; i++)
            printf("%s\"%s\":%ld", i ? "," : "", code_names[i], code_counts[i]);
        printf("},\"status\":{");
        int first = 1;
        for (int s = 0; s < 600; s++)
            if (status_counts[s]) {
                printf("%s\"%d\":%ld", first ? "" : ",", s, status_counts[s]);
                first = 0;
            }
        printf("}}\n");
    } else {
        printf("requests %d in %.3f s: %.1f rps, p50 %.3f ms, p99 %.3f ms, max %.3f ms\n", done,
               secs, done / secs, p50, p99, pmax);
        for (int i = 0; i < ncodes; i++)
            printf("  %-24s %ld\n", code_names[i], code_counts[i]);
    }
    fflush(stdout);
    for (int i = 0; i < opt.conc; i++)
        if (conns[i].fd > 0)
            close(conns[i].fd);
    close(ep);
    free(conns);
    free(lat);
    return (opt.duration > 0 || done == opt.total) && inflight == 0 ? 0 : 1;
}
