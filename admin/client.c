/* client.c - one admin request over FastCGI (the record layer of the
 * FastCGI 1.0 specification, responder role, one request per connection) or
 * HTTP/1.1 (Connection: close, chunked answers decoded). No library beyond
 * libc: the tool ships with the daemons' dependencies only. */
#include "client.h"
#include "cs.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define FCGI_VERSION_1 1
#define FCGI_BEGIN_REQUEST 1
#define FCGI_END_REQUEST 3
#define FCGI_PARAMS 4
#define FCGI_STDIN 5
#define FCGI_STDOUT 6
#define FCGI_STDERR 7
#define FCGI_RESPONDER 1
#define FCGI_REQUEST_ID 1

/* A growable byte buffer. */
struct buf {
    char *p;
    size_t len, cap;
};

static void buf_add(struct buf *b, const void *data, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (b->len + n + 1 > cap)
            cap *= 2;
        b->p = xrealloc(b->p, cap);
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void buf_printf(struct buf *b, const char *fmt, ...)
{
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n > 0)
        buf_add(b, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Splits "HOST:PORT" (or "[V6]:PORT") into t->host and t->port. */
static int split_host_port(const char *s, struct client_target *t, const char *def_port)
{
    const char *colon;
    size_t hl;

    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (close == NULL)
            return CS_ERR;
        hl = (size_t)(close - s - 1);
        if (hl == 0 || hl >= sizeof(t->host))
            return CS_ERR;
        memcpy(t->host, s + 1, hl);
        t->host[hl] = '\0';
        colon = close[1] == ':' ? close + 1 : NULL;
        if (close[1] != '\0' && colon == NULL)
            return CS_ERR;
    } else {
        colon = strrchr(s, ':');
        hl = colon ? (size_t)(colon - s) : strlen(s);
        if (hl == 0 || hl >= sizeof(t->host))
            return CS_ERR;
        memcpy(t->host, s, hl);
        t->host[hl] = '\0';
    }
    const char *port = colon ? colon + 1 : def_port;
    if (port == NULL || port[0] == '\0' || strlen(port) >= sizeof(t->port)
        || strspn(port, "0123456789") != strlen(port))
        return CS_ERR;
    snprintf(t->port, sizeof(t->port), "%s", port);
    return CS_OK;
}

int client_parse(const char *url, struct client_target *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof(*t));
    if (strncmp(url, "http://", 7) == 0) {
        const char *hp = url + 7, *slash = strchr(hp, '/');
        char hostport[300];
        size_t n = slash ? (size_t)(slash - hp) : strlen(hp);
        if (n == 0 || n >= sizeof(hostport))
            goto bad;
        memcpy(hostport, hp, n);
        hostport[n] = '\0';
        t->kind = CLIENT_HTTP;
        if (split_host_port(hostport, t, "80") != CS_OK)
            goto bad;
        if (slash != NULL) {
            size_t pl = strlen(slash);
            while (pl > 0 && slash[pl - 1] == '/')
                pl--;
            if (pl >= sizeof(t->path))
                goto bad;
            memcpy(t->path, slash, pl);
            t->path[pl] = '\0';
        }
        return CS_OK;
    }
    if (strncmp(url, "https://", 8) == 0) {
        set_err(err, errlen, "%s: https is not supported; use the FastCGI socket (the default) "
                "or a plain http:// listener on loopback", url);
        return CS_ERR;
    }
    const char *rest = url;
    if (strncmp(rest, "fcgi://", 7) == 0) {
        t->kind = CLIENT_FCGI_TCP;
        if (split_host_port(rest + 7, t, NULL) != CS_OK)
            goto bad;
        return CS_OK;
    }
    if (strncmp(rest, "fcgi:", 5) == 0)
        rest += 5;
    else if (strncmp(rest, "unix:", 5) == 0)
        rest += 5;
    if (rest[0] == '/') {
        if (strlen(rest) >= sizeof(((struct sockaddr_un *)0)->sun_path))
            goto bad;
        t->kind = CLIENT_FCGI_UNIX;
        snprintf(t->path, sizeof(t->path), "%s", rest);
        return CS_OK;
    }
    t->kind = CLIENT_FCGI_TCP;
    if (rest == url && split_host_port(rest, t, NULL) == CS_OK)
        return CS_OK;
bad:
    set_err(err, errlen, "%s: not an address (http://HOST[:PORT], fcgi:/PATH, fcgi://HOST:PORT)",
            url);
    return CS_ERR;
}

/* Milliseconds left until deadline (cs_mono_ms()), at least 0. */
static int left_ms(int64_t deadline)
{
    int64_t l = deadline - cs_mono_ms();
    return l > 0 ? (int)(l > 60 * 60 * 1000 ? 60 * 60 * 1000 : l) : 0;
}

/* Waits until fd is ready for events or the deadline passes. */
static int wait_fd(int fd, short events, int64_t deadline)
{
    struct pollfd p = {.fd = fd, .events = events};
    for (;;) {
        int n = poll(&p, 1, left_ms(deadline));
        if (n > 0)
            return CS_OK;
        if (n == 0) {
            errno = ETIMEDOUT;
            return CS_ERR;
        }
        if (errno != EINTR)
            return CS_ERR;
    }
}

/* Connects a non-blocking socket to fd's address within the deadline. */
static int connect_within(int fd, const struct sockaddr *sa, socklen_t sl, int64_t deadline)
{
    if (connect(fd, sa, sl) == 0)
        return CS_OK;
    if (errno != EINPROGRESS && errno != EAGAIN)
        return CS_ERR;
    if (wait_fd(fd, POLLOUT, deadline) != CS_OK)
        return CS_ERR;
    int soerr = 0;
    socklen_t len = sizeof(soerr);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0)
        return CS_ERR;
    if (soerr != 0) {
        errno = soerr;
        return CS_ERR;
    }
    return CS_OK;
}

/* Opens a connection to t; the fd, or -1 with a message in err. */
static int client_connect(const struct client_target *t, int64_t deadline, char *err,
                          size_t errlen)
{
    if (t->kind == CLIENT_FCGI_UNIX) {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%.107s", t->path);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0 || connect_within(fd, (struct sockaddr *)&sa, sizeof(sa), deadline) != CS_OK) {
            set_err(err, errlen, "connect(%s) failed: %s", t->path, strerror(errno));
            if (fd >= 0)
                close(fd);
            return -1;
        }
        return fd;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *ai;
    int rc = getaddrinfo(t->host, t->port, &hints, &res);
    if (rc != 0) {
        set_err(err, errlen, "getaddrinfo(%s) failed: %s", t->host, gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    set_err(err, errlen, "connect(%s:%s) failed", t->host, t->port);
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0)
            continue;
        if (connect_within(fd, ai->ai_addr, ai->ai_addrlen, deadline) == CS_OK)
            break;
        set_err(err, errlen, "connect(%s:%s) failed: %s", t->host, t->port, strerror(errno));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

static int write_all(int fd, const char *p, size_t n, int64_t deadline)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (wait_fd(fd, POLLOUT, deadline) != CS_OK)
                return CS_ERR;
            continue;
        }
        return CS_ERR;
    }
    return CS_OK;
}

/* Reads until the peer closes (or, for FastCGI, stop() says the answer is
 * complete), appending to b. */
static int read_all(int fd, struct buf *b, int64_t deadline, int (*stop)(const struct buf *))
{
    char tmp[8192];
    for (;;) {
        if (stop != NULL && stop(b))
            return CS_OK;
        ssize_t r = read(fd, tmp, sizeof(tmp));
        if (r > 0) {
            buf_add(b, tmp, (size_t)r);
            continue;
        }
        if (r == 0)
            return CS_OK;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (wait_fd(fd, POLLIN, deadline) != CS_OK)
                return CS_ERR;
            continue;
        }
        return CS_ERR;
    }
}

/* --- FastCGI -------------------------------------------------------------- */

static void fcgi_record(struct buf *b, int type, const char *content, size_t len)
{
    unsigned char h[8] = {FCGI_VERSION_1, (unsigned char)type, 0, FCGI_REQUEST_ID,
                          (unsigned char)(len >> 8), (unsigned char)len, 0, 0};
    buf_add(b, h, sizeof(h));
    if (len > 0)
        buf_add(b, content, len);
}

/* Appends one name-value pair in FastCGI's length encoding. */
static void fcgi_pair(struct buf *b, const char *name, const char *value)
{
    size_t lens[2] = {strlen(name), strlen(value)};
    for (int i = 0; i < 2; i++) {
        if (lens[i] < 128) {
            unsigned char c = (unsigned char)lens[i];
            buf_add(b, &c, 1);
        } else {
            unsigned char c[4] = {(unsigned char)((lens[i] >> 24) | 0x80),
                                  (unsigned char)(lens[i] >> 16), (unsigned char)(lens[i] >> 8),
                                  (unsigned char)lens[i]};
            buf_add(b, c, 4);
        }
    }
    buf_add(b, name, lens[0]);
    buf_add(b, value, lens[1]);
}

/* Splits data into records of type, at most 65535 bytes each, and the empty
 * record that ends the stream. */
static void fcgi_stream(struct buf *out, int type, const char *data, size_t len)
{
    while (len > 0) {
        size_t n = len > 65535 ? 65535 : len;
        fcgi_record(out, type, data, n);
        data += n;
        len -= n;
    }
    fcgi_record(out, type, NULL, 0);
}

/* Whether b holds an FCGI_END_REQUEST record (read no further then). */
static int fcgi_ended(const struct buf *b)
{
    size_t off = 0;
    while (off + 8 <= b->len) {
        const unsigned char *h = (const unsigned char *)b->p + off;
        size_t clen = ((size_t)h[4] << 8) | h[5], total = 8 + clen + h[6];
        if (off + total > b->len)
            return 0;
        if (h[1] == FCGI_END_REQUEST)
            return 1;
        off += total;
    }
    return 0;
}

/* Builds the request's records: the params a web server would pass. */
static void fcgi_build(struct buf *out, const struct client_req *req, size_t body_len)
{
    static const unsigned char begin[8] = {0, FCGI_RESPONDER, 0, 0, 0, 0, 0, 0};
    struct buf params = {0};
    char num[32];
    const char *q = strchr(req->path, '?');
    char script[512];
    size_t sl = q ? (size_t)(q - req->path) : strlen(req->path);

    if (sl >= sizeof(script))
        sl = sizeof(script) - 1;
    memcpy(script, req->path, sl);
    script[sl] = '\0';
    fcgi_record(out, FCGI_BEGIN_REQUEST, (const char *)begin, sizeof(begin));
    fcgi_pair(&params, "GATEWAY_INTERFACE", "CGI/1.1");
    fcgi_pair(&params, "SERVER_PROTOCOL", "HTTP/1.1");
    fcgi_pair(&params, "SERVER_SOFTWARE", "couponseize-admin");
    fcgi_pair(&params, "SERVER_NAME", "localhost");
    fcgi_pair(&params, "REMOTE_ADDR", "127.0.0.1");
    fcgi_pair(&params, "REQUEST_METHOD", req->method);
    fcgi_pair(&params, "REQUEST_URI", req->path);
    fcgi_pair(&params, "SCRIPT_NAME", script);
    fcgi_pair(&params, "DOCUMENT_URI", script);
    fcgi_pair(&params, "QUERY_STRING", q ? q + 1 : "");
    if (req->body != NULL) {
        snprintf(num, sizeof(num), "%zu", body_len);
        fcgi_pair(&params, "CONTENT_TYPE", "application/json");
        fcgi_pair(&params, "CONTENT_LENGTH", num);
    }
    if (req->token != NULL) {
        struct buf auth = {0};
        buf_printf(&auth, "Bearer ");
        buf_add(&auth, req->token, strlen(req->token));
        fcgi_pair(&params, "HTTP_AUTHORIZATION", auth.p);
        explicit_bzero(auth.p, auth.len);
        free(auth.p);
    }
    if (req->user_id != NULL) {
        fcgi_pair(&params, "COUPONSEIZE_USER_ID", req->user_id);
        fcgi_pair(&params, "COUPONSEIZE_USER_ROLE", "admin");
    }
    if (req->idem_key != NULL)
        fcgi_pair(&params, "HTTP_IDEMPOTENCY_KEY", req->idem_key);
    fcgi_stream(out, FCGI_PARAMS, params.p, params.len);
    explicit_bzero(params.p, params.len);
    free(params.p);
    fcgi_stream(out, FCGI_STDIN, req->body, body_len);
}

/* Collects the FCGI_STDOUT stream of the records in in into out. */
static int fcgi_collect(const struct buf *in, struct buf *out, char *err, size_t errlen)
{
    size_t off = 0;
    while (off + 8 <= in->len) {
        const unsigned char *h = (const unsigned char *)in->p + off;
        size_t clen = ((size_t)h[4] << 8) | h[5], total = 8 + clen + h[6];
        if (h[0] != FCGI_VERSION_1 || off + total > in->len)
            break;
        if (h[1] == FCGI_STDOUT)
            buf_add(out, h + 8, clen);
        else if (h[1] == FCGI_END_REQUEST)
            return CS_OK;
        off += total;
    }
    set_err(err, errlen, "the FastCGI answer ended early (%zu bytes): did coupon-fcgi die?",
            in->len);
    return CS_ERR;
}

/* --- HTTP ----------------------------------------------------------------- */

static void http_build(struct buf *out, const struct client_target *t,
                       const struct client_req *req, size_t body_len)
{
    int v6 = strchr(t->host, ':') != NULL;
    buf_printf(out, "%s %s%s HTTP/1.1\r\nHost: %s%s%s:%s\r\nConnection: close\r\n"
               "User-Agent: couponseize-admin\r\nAccept: application/json\r\n",
               req->method, t->path, req->path, v6 ? "[" : "", t->host, v6 ? "]" : "", t->port);
    if (req->token != NULL) {
        buf_printf(out, "Authorization: Bearer ");
        buf_add(out, req->token, strlen(req->token));
        buf_printf(out, "\r\n");
    }
    if (req->idem_key != NULL)
        buf_printf(out, "Idempotency-Key: %s\r\n", req->idem_key);
    if (req->body != NULL)
        buf_printf(out, "Content-Type: application/json\r\nContent-Length: %zu\r\n", body_len);
    else if (strcmp(req->method, "GET") != 0)
        buf_printf(out, "Content-Length: 0\r\n");
    buf_printf(out, "\r\n");
    if (req->body != NULL)
        buf_add(out, req->body, body_len);
}

/* Decodes a chunked body in place; its new length, or -1 when malformed. */
static long dechunk(char *p, size_t len)
{
    size_t in = 0, outl = 0;
    for (;;) {
        char *end;
        if (in >= len)
            return -1;
        unsigned long n = strtoul(p + in, &end, 16);
        char *nl = memchr(p + in, '\n', len - in);
        if (nl == NULL || end == p + in)
            return -1;
        in = (size_t)(nl - p) + 1;
        if (n == 0)
            return (long)outl;
        if (n > len - in)
            return -1;
        memmove(p + outl, p + in, n);
        outl += n;
        in += n;
        if (in < len && p[in] == '\r')
            in++;
        if (in < len && p[in] == '\n')
            in++;
    }
}

/* Splits a CGI or HTTP answer in raw into status and body. http: a status
 * line comes first; otherwise (CGI) a "Status:" header, 200 without one. */
static int parse_answer(struct buf *raw, int http, struct client_resp *resp, char *err,
                        size_t errlen)
{
    char *hend = raw->p ? strstr(raw->p, "\r\n\r\n") : NULL;
    size_t skip = 4;
    if (hend == NULL && raw->p != NULL && (hend = strstr(raw->p, "\n\n")) != NULL)
        skip = 2;
    if (hend == NULL) {
        set_err(err, errlen, "no answer headers (%zu bytes came back)", raw->len);
        return CS_ERR;
    }
    *hend = '\0';
    int status = http ? -1 : 200, chunked = 0;
    char *line = raw->p, *save = NULL;
    for (char *l = strtok_r(line, "\r\n", &save); l != NULL; l = strtok_r(NULL, "\r\n", &save)) {
        if (http && status < 0) {
            if (strncmp(l, "HTTP/1.", 7) != 0 || sscanf(l + 8, " %d", &status) != 1)
                break;
        } else if (!http && strncasecmp(l, "Status:", 7) == 0) {
            status = atoi(l + 7);
        } else if (strncasecmp(l, "Transfer-Encoding:", 18) == 0 && strcasestr(l, "chunked")) {
            chunked = 1;
        }
    }
    if (status < 100 || status > 599) {
        set_err(err, errlen, "the answer has no HTTP status");
        return CS_ERR;
    }
    char *body = hend + skip;
    size_t blen = raw->len - (size_t)(body - raw->p);
    if (chunked) {
        long n = dechunk(body, blen);
        if (n < 0) {
            set_err(err, errlen, "a malformed chunked answer");
            return CS_ERR;
        }
        blen = (size_t)n;
    }
    resp->status = status;
    resp->body = xmalloc(blen + 1);
    memcpy(resp->body, body, blen);
    resp->body[blen] = '\0';
    resp->len = blen;
    return CS_OK;
}

int client_do(const struct client_target *t, const struct client_req *req,
              struct client_resp *resp, char *err, size_t errlen)
{
    int64_t deadline = cs_mono_ms() + req->timeout_ms;
    struct buf out = {0}, in = {0}, stdout_ = {0};
    size_t body_len = req->body ? strlen(req->body) : 0;
    int rc = CS_ERR, http = t->kind == CLIENT_HTTP;

    memset(resp, 0, sizeof(*resp));
    int fd = client_connect(t, deadline, err, errlen);
    if (fd < 0)
        return CS_ERR;
    if (http)
        http_build(&out, t, req, body_len);
    else
        fcgi_build(&out, req, body_len);
    resp->sent = 1;
    if (write_all(fd, out.p, out.len, deadline) != CS_OK) {
        set_err(err, errlen, "sending the request failed: %s", strerror(errno));
        goto done;
    }
    if (read_all(fd, &in, deadline, http ? NULL : fcgi_ended) != CS_OK) {
        set_err(err, errlen, "no answer within %d ms: %s", req->timeout_ms, strerror(errno));
        goto done;
    }
    if (http) {
        rc = parse_answer(&in, 1, resp, err, errlen);
    } else if (fcgi_collect(&in, &stdout_, err, errlen) == CS_OK) {
        rc = parse_answer(&stdout_, 0, resp, err, errlen);
    }
done:
    close(fd);
    if (out.p != NULL) {
        explicit_bzero(out.p, out.len); /* it held the token */
        free(out.p);
    }
    free(in.p);
    free(stdout_.p);
    return rc;
}
