/* test_route.c - the route table (fcgi/api/route.c) in-process, each handler a
 * stub that records it ran: which path and method reach which handler,
 * what a wrong method answers, and when Idempotency-Key and the audit
 * trail come in. */
#include <check.h>
#include <string.h>

#include "api/api.h"
#include "req/audit.h"
#include "req/idem.h"
#include "req/req.h"
#include "api/route.h"
#include "node/ctx.h"
#include "runner.h"

static const char *ran;        /* the handler that ran, by name */
static int audited, idem_runs, replied_status;
static enum cs_code replied;
static char allow[64];

#define STUB(name)                                                                     \
    void name(struct node_ctx *nc, struct req *r)                                          \
    {                                                                                  \
        (void)nc;                                                                       \
        ran = #name;                                                                   \
        r->who.is_admin = 1;                                                           \
        r->code = CODE_OK;                                                             \
    }
STUB(api_seize)
STUB(api_status)
STUB(api_admin_preheat)
STUB(api_admin_revoke)
STUB(api_admin_reconcile)
STUB(api_admin_health)
STUB(api_metrics)
STUB(api_activity)
STUB(api_coupon_mine)
STUB(api_coupon_use)
STUB(api_coupon_release)
STUB(api_reserve_list)
STUB(api_reserve_return)

enum idem_step idem_begin(struct mconn *mc, struct req *r, struct idem_claim *ic)
{
    (void)mc, (void)r, (void)ic;
    idem_runs++;
    return IDEM_RUN;
}

void idem_end(struct mconn *mc, struct idem_claim *ic)
{
    (void)mc, (void)ic;
}

void audit_record(struct mconn *mc, struct req *r)
{
    (void)mc, (void)r;
    audited++;
}

void req_reply(struct req *r, enum cs_code code, const char *msg, const char *extra,
               int retry_after_s)
{
    (void)msg, (void)extra, (void)retry_after_s;
    r->code = code;
    replied = code;
}

void http_reply_with(FCGX_Stream *out, enum cs_code code, const char *msg, const char *extra,
                     const char *headers)
{
    (void)out, (void)msg, (void)extra;
    replied = code;
    replied_status = 1;
    snprintf(allow, sizeof(allow), "%s", headers ? headers : "");
}

static struct node_ctx nc;
static struct req r;

static void dispatch(const char *method, const char *path, const char *idem_key)
{
    memset(&r, 0, sizeof(r));
    ran = NULL;
    audited = idem_runs = replied_status = 0;
    replied = CODE_OK;
    allow[0] = '\0';
    r.method = method;
    snprintf(r.path, sizeof(r.path), "%s", path);
    r.idem_key = idem_key;
    route_dispatch(&nc, &r);
}

START_TEST(each_path_reaches_its_handler)
{
    static const struct {
        const char *method, *path, *handler;
        int route;
    } cases[] = {
        {"POST", "/market/consumer/coupon/seize", "api_seize", ROUTE_SEIZE},
        {"GET", "/market/consumer/coupon/status", "api_status", ROUTE_STATUS},
        {"HEAD", "/market/consumer/coupon/status", "api_status", ROUTE_STATUS},
        {"POST", "/market/admin/coupon/preheat", "api_admin_preheat", ROUTE_PREHEAT},
        {"POST", "/market/admin/coupon/revoke", "api_admin_revoke", ROUTE_REVOKE},
        {"POST", "/market/admin/coupon/reconcile", "api_admin_reconcile", ROUTE_RECONCILE},
        {"GET", "/market/health", "api_admin_health", ROUTE_HEALTH},
        {"GET", "/market/admin/metrics", "api_metrics", ROUTE_METRICS},
        {"PUT", "/market/admin/coupon/activity", "api_activity", ROUTE_ACTIVITY},
        {"DELETE", "/market/admin/coupon/activity", "api_activity", ROUTE_ACTIVITY},
        {"GET", "/market/consumer/coupon/mine", "api_coupon_mine", ROUTE_MINE},
        {"POST", "/market/service/coupon/use", "api_coupon_use", ROUTE_USE},
        {"POST", "/market/service/coupon/release", "api_coupon_release", ROUTE_RELEASE},
        {"GET", "/market/admin/coupon/reserves", "api_reserve_list", ROUTE_RESERVES},
        {"POST", "/market/admin/coupon/reserve/return", "api_reserve_return",
         ROUTE_RESERVE_RETURN},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dispatch(cases[i].method, cases[i].path, NULL);
        ck_assert_msg(ran != NULL && strcmp(ran, cases[i].handler) == 0, "%s %s ran %s",
                      cases[i].method, cases[i].path, ran ? ran : "nothing");
        ck_assert_int_eq(r.route, cases[i].route);
        ck_assert_str_ne(route_names[r.route], "");
    }
}
END_TEST

START_TEST(unknown_path_is_404_other)
{
    dispatch("GET", "/market/consumer/coupon/seize/", NULL);
    ck_assert_ptr_null(ran);
    ck_assert_int_eq(replied, CODE_NOT_FOUND);
    ck_assert_int_eq(r.route, ROUTE_OTHER);
    ck_assert_str_eq(route_names[ROUTE_OTHER], "other");
}
END_TEST

START_TEST(wrong_method_is_405_with_allow)
{
    dispatch("GET", "/market/consumer/coupon/seize", NULL);
    ck_assert_ptr_null(ran);
    ck_assert_int_eq(replied, CODE_METHOD_NOT_ALLOWED);
    ck_assert_int_eq(r.code, CODE_METHOD_NOT_ALLOWED);
    ck_assert_str_eq(allow, "Allow: POST\r\n");
    dispatch("POST", "/market/health", NULL);
    ck_assert_ptr_null(ran);
    ck_assert_str_eq(allow, "Allow: GET, HEAD\r\n");
    ck_assert_int_eq(r.route, ROUTE_HEALTH); /* counted under its route */
}
END_TEST

START_TEST(admin_actions_are_audited)
{
    dispatch("POST", "/market/admin/coupon/preheat", NULL);
    ck_assert_int_eq(audited, 1);
    ck_assert_str_eq(r.audit_action, "preheat");
    dispatch("GET", "/market/consumer/coupon/status", NULL);
    ck_assert_int_eq(audited, 0);
}
END_TEST

START_TEST(idempotency_key_only_on_admin_writes)
{
    dispatch("POST", "/market/admin/coupon/revoke", "k1");
    ck_assert_int_eq(idem_runs, 1);
    ck_assert_str_eq(ran, "api_admin_revoke");
    ck_assert_int_eq(audited, 1);
    dispatch("POST", "/market/consumer/coupon/seize", "k1");
    ck_assert_int_eq(idem_runs, 0);
    ck_assert_str_eq(ran, "api_seize");
    dispatch("GET", "/market/admin/coupon/activity", "k1");
    ck_assert_int_eq(idem_runs, 0); /* a read is never remembered */
}
END_TEST

int main(void)
{
    Suite *s = suite_create("route");
    TCase *tc = tcase_create("table");
    tcase_add_test(tc, each_path_reaches_its_handler);
    tcase_add_test(tc, unknown_path_is_404_other);
    tcase_add_test(tc, wrong_method_is_405_with_allow);
    tcase_add_test(tc, admin_actions_are_audited);
    tcase_add_test(tc, idempotency_key_only_on_admin_writes);
    suite_add_tcase(s, tc);
    return cs_run_suite(s, 0);
}
