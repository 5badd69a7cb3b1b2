/* test_admin.c - couponseize-admin's addresses, exit statuses and HTTP
 * client (admin/client.c, admin/out.c) against a canned server. */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client.h"
#include "cs.h"
#include "out.h"
#include "runner.h"

START_TEST(parse_addresses)
{
    struct client_target t;
    char err[256];

    ck_assert_int_eq(client_parse("/run/couponseize/fcgi.sock", &t, err, sizeof(err)), CS_OK);
    ck_assert_int_eq(t.kind, CLIENT_FCGI_UNIX);
    ck_assert_str_eq(t.path, "/run/couponseize/fcgi.sock");
    ck_assert_int_eq(client_parse("unix:/tmp/a.sock", &t, err, sizeof(err)), CS_OK);
    ck_assert_int_eq(t.kind, CLIENT_FCGI_UNIX);
    ck_assert_str_eq(t.path, "/tmp/a.sock");
    ck_assert_int_eq(client_parse("fcgi:/tmp/b.sock", &t, err, sizeof(err)), CS_OK);
    ck_assert_str_eq(t.path, "/tmp/b.sock");
    ck_assert_int_eq(client_parse("127.0.0.1:9000", &t, err, sizeof(err)), CS_OK);
    ck_assert_int_eq(t.kind, CLIENT_FCGI_TCP);
    ck_assert_str_eq(t.host, "127.0.0.1");
    ck_assert_str_eq(t.port, "9000");
    ck_assert_int_eq(client_parse("fcgi://[::1]:9001", &t, err, sizeof(err)), CS_OK);
    ck_assert_str_eq(t.host, "::1");
    ck_assert_str_eq(t.port, "9001");
    ck_assert_int_eq(client_parse("http://127.0.0.1", &t, err, sizeof(err)), CS_OK);
    ck_assert_int_eq(t.kind, CLIENT_HTTP);
    ck_assert_str_eq(t.port, "80");
    ck_assert_str_eq(t.path, "");
    ck_assert_int_eq(client_parse("http://localhost:8080/shop/", &t, err, sizeof(err)), CS_OK);
    ck_assert_str_eq(t.host, "localhost");
    ck_assert_str_eq(t.port, "8080");
    ck_assert_str_eq(t.path, "/shop");
    static const char *const bad[] = {"", "https://127.0.0.1", "http://", "http://:80",
                                      "http://h:8x", "fcgi://host", "relative.sock",
                                      "fcgi://[::1", "host:"};
    for (size_t i = 0; i < CS_ARRAY_LEN(bad); i++)
        ck_assert_msg(client_parse(bad[i], &t, err, sizeof(err)) == CS_ERR, "took '%s'", bad[i]);
}
END_TEST

START_TEST(exit_statuses)
{
    ck_assert_int_eq(out_exit_for(200), ADMIN_EXIT_OK);
    ck_assert_int_eq(out_exit_for(201), ADMIN_EXIT_OK);
    ck_assert_int_eq(out_exit_for(404), ADMIN_EXIT_NOT_FOUND);
    ck_assert_int_eq(out_exit_for(409), ADMIN_EXIT_CONFLICT);
    ck_assert_int_eq(out_exit_for(400), ADMIN_EXIT_INVALID);
    ck_assert_int_eq(out_exit_for(422), ADMIN_EXIT_INVALID);
    ck_assert_int_eq(out_exit_for(401), ADMIN_EXIT_DENIED);
    ck_assert_int_eq(out_exit_for(403), ADMIN_EXIT_DENIED);
    ck_assert_int_eq(out_exit_for(503), ADMIN_EXIT_UNAVAILABLE);
    ck_assert_int_eq(out_exit_for(429), ADMIN_EXIT_UNAVAILABLE);
    ck_assert_int_eq(out_exit_for(500), ADMIN_EXIT_ERROR);
}
END_TEST

/* A server that reads one request and answers `answer`, then closes. */
struct canned {
    int lfd;
    const char *answer;
    char request[4096];
};

static void *canned_serve(void *arg)
{
    struct canned *c = arg;
    int fd = accept(c->lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    size_t n = 0;
    while (n < sizeof(c->request) - 1) {
        ssize_t r = read(fd, c->request + n, sizeof(c->request) - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
        c->request[n] = '\0';
        char *end = strstr(c->request, "\r\n\r\n");
        if (end != NULL && strstr(c->request, "Content-Length: 8\r\n") != NULL
            && strlen(end + 4) >= 8)
            break;
    }
    ssize_t w = write(fd, c->answer, strlen(c->answer));
    (void)w;
    close(fd);
    return NULL;
}

START_TEST(http_chunked_answer)
{
    struct canned c = {.answer = "HTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\n"
                                 "Transfer-Encoding: chunked\r\n\r\n"
                                 "5\r\n{\"cod\r\n"
                                 "10\r\ne\":\"ENDED\",\"x\":1\r\n1\r\n}\r\n0\r\n\r\n"};
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    c.lfd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_eq(bind(c.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    ck_assert_int_eq(listen(c.lfd, 1), 0);
    ck_assert_int_eq(getsockname(c.lfd, (struct sockaddr *)&sa, &sl), 0);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, canned_serve, &c), 0);

    char url[64], err[256];
    struct client_target t;
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/pre", ntohs(sa.sin_port));
    ck_assert_int_eq(client_parse(url, &t, err, sizeof(err)), CS_OK);
    struct client_req req = {.method = "PUT", .path = "/market/admin/coupon/activity",
                             .body = "{\"id\":7}", .token = "tok.en.x", .idem_key = "k1",
                             .timeout_ms = 5000};
    struct client_resp resp;
    ck_assert_msg(client_do(&t, &req, &resp, err, sizeof(err)) == CS_OK, "%s", err);
    pthread_join(th, NULL);
    close(c.lfd);
    ck_assert_int_eq(resp.status, 409);
    ck_assert_str_eq(resp.body, "{\"code\":\"ENDED\",\"x\":1}");
    free(resp.body);
    ck_assert_msg(strncmp(c.request, "PUT /pre/market/admin/coupon/activity HTTP/1.1\r\n", 48) == 0,
                  "request line: %.60s", c.request);
    ck_assert_ptr_nonnull(strstr(c.request, "Authorization: Bearer tok.en.x\r\n"));
    ck_assert_ptr_nonnull(strstr(c.request, "Idempotency-Key: k1\r\n"));
    ck_assert_ptr_nonnull(strstr(c.request, "Content-Type: application/json\r\n"));
    ck_assert_ptr_nonnull(strstr(c.request, "\r\n\r\n{\"id\":7}"));
}
END_TEST

START_TEST(no_answer)
{
    struct client_target t;
    struct client_resp resp;
    char err[256];
    struct client_req req = {.method = "GET", .path = "/market/health", .timeout_ms = 1000};
    ck_assert_int_eq(client_parse("/nonexistent/dir/fcgi.sock", &t, err, sizeof(err)), CS_OK);
    ck_assert_int_eq(client_do(&t, &req, &resp, err, sizeof(err)), CS_ERR);
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/dir/fcgi.sock"));
    ck_assert_ptr_null(resp.body);
}
END_TEST

int main(void)
{
    cs_init();
    Suite *s = suite_create("admin");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, parse_addresses);
    tcase_add_test(tc, exit_statuses);
    tcase_add_test(tc, http_chunked_answer);
    tcase_add_test(tc, no_answer);
    suite_add_tcase(s, tc);
    return cs_run_suite(s, 0);
}
