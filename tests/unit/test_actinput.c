/* test_actinput.c - the activity fields of the admin API: RFC 3339 times,
 * money, ranges, and errors that name their field. */
#include <check.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "actinput.h"
#include "activity_db.h"
#include "cs.h"
#include "runner.h"

START_TEST(rfc3339_times)
{
    int64_t t = 0;
    ck_assert_int_eq(actinput_parse_time("1970-01-01T00:00:00Z", &t), CS_OK);
    ck_assert_int_eq(t, 0);
    ck_assert_int_eq(actinput_parse_time("2026-12-01T20:00:00+08:00", &t), CS_OK);
    ck_assert_int_eq(t, 1796126400);
    ck_assert_int_eq(actinput_parse_time("2026-12-01T12:00:00Z", &t), CS_OK);
    ck_assert_int_eq(t, 1796126400);
    ck_assert_int_eq(actinput_parse_time("2026-12-01t07:30:00.999-04:30", &t), CS_OK);
    ck_assert_int_eq(t, 1796126400);
    ck_assert_int_eq(actinput_parse_time("2024-02-29T00:00:00Z", &t), CS_OK);
    ck_assert_int_eq(t, 1709164800);
    ck_assert_int_eq(actinput_parse_time("2038-01-19T03:14:07Z", &t), CS_OK);
    ck_assert_int_eq(t, 2147483647);

    static const char *const bad[] = {
        "", "2026-12-01", "2026-12-01T20:00:00", "2026-12-01T20:00Z", "2026-12-01T20:00:00+8:00",
        "2026-13-01T00:00:00Z", "2026-02-29T00:00:00Z", "2026-04-31T00:00:00Z",
        "2026-12-01T24:00:00Z", "2026-12-01T20:60:00Z", "2026-12-01T20:00:60Z",
        "2026-12-01T20:00:00.Z", "2026-12-01T20:00:00+24:00", "2026-12-01T20:00:00Zjunk",
        "1969-12-31T23:59:59Z", "2038-01-19T03:14:08Z", "２026-12-01T20:00:00Z",
    };
    for (size_t i = 0; i < CS_ARRAY_LEN(bad); i++)
        ck_assert_msg(actinput_parse_time(bad[i], &t) == CS_ERR, "accepted %s", bad[i]);

    char buf[32];
    actinput_format_time(1796126400, buf, sizeof(buf));
    ck_assert_str_eq(buf, "2026-12-01T12:00:00Z");
}
END_TEST

/* Parses json with actinput_parse; returns its result and fills *in, *e. */
static int parse(const char *json, int for_update, struct actinput *in, struct actinput_err *e);

/* returnOnExpiry and eligibleGroups: read, written back compact, and refused
 * with their field named when malformed. */
START_TEST(lifecycle_fields)
{
    struct actinput in;
    struct actinput_err e;

    ck_assert_int_eq(parse("{\"returnOnExpiry\":true,\"eligibleGroups\":[\"new-user\", \"vip.1\"]}",
                           0, &in, &e), CS_OK);
    ck_assert_int_eq(in.return_on_expiry, 1);
    ck_assert_str_eq(in.groups, "[\"new-user\",\"vip.1\"]");
    ck_assert_uint_eq(in.set, ACTIN_RETURN | ACTIN_GROUPS);
    ck_assert_int_eq(parse("{\"returnOnExpiry\":false,\"eligibleGroups\":[]}", 1, &in, &e), CS_OK);
    ck_assert_int_eq(in.return_on_expiry, 0);
    ck_assert_str_eq(in.groups, "");

    static const char *const bad[][2] = {
        {"{\"returnOnExpiry\":1}", "returnOnExpiry"},
        {"{\"returnOnExpiry\":\"yes\"}", "returnOnExpiry"},
        {"{\"eligibleGroups\":\"vip\"}", "eligibleGroups"},
        {"{\"eligibleGroups\":[\"a b\"]}", "eligibleGroups"},
        {"{\"eligibleGroups\":[\"\"]}", "eligibleGroups"},
        {"{\"eligibleGroups\":[\"x\\\"y\"]}", "eligibleGroups"},
        {"{\"eligibleGroups\":[1]}", "eligibleGroups"},
        {"{\"eligibleGroups\":[\"vip\",\"vip\"]}", "eligibleGroups"},
        {"{\"eligibleGroups\":[\"123456789012345678901234567890123\"]}", "eligibleGroups"},
        {"{\"eligibleGroups\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\","
         "\"l\",\"m\",\"n\",\"o\",\"p\",\"q\"]}", "eligibleGroups"},
    };
    for (size_t i = 0; i < CS_ARRAY_LEN(bad); i++) {
        ck_assert_msg(parse(bad[i][0], 0, &in, &e) == CS_ERR, "accepted %s", bad[i][0]);
        ck_assert_str_eq(e.field, bad[i][1]);
    }
}
END_TEST

static int parse(const char *json, int for_update, struct actinput *in, struct actinput_err *e)
{
    cJSON *doc = cJSON_Parse(json);
    ck_assert_ptr_nonnull(doc);
    int rc = actinput_parse(doc, for_update, in, e);
    cJSON_Delete(doc);
    return rc;
}

START_TEST(fields_are_read)
{
    struct actinput in;
    struct actinput_err e;
    ck_assert_int_eq(parse("{\"name\":\"Sale 十\",\"totalNum\":100,"
                           "\"distributeStartTime\":\"2026-12-01T20:00:00+08:00\","
                           "\"distributeEndTime\":\"2026-12-01T22:00:00+08:00\","
                           "\"validityDays\":7,\"couponName\":\"\",\"couponType\":2,"
                           "\"couponAmount\":\"007.5\",\"couponThreshold\":99.99}",
                           0, &in, &e),
                     CS_OK);
    ck_assert_str_eq(in.name, "Sale 十");
    ck_assert_int_eq(in.total_num, 100);
    ck_assert_int_eq(in.end_s - in.start_s, 7200);
    ck_assert_int_eq(in.validity_days, 7);
    ck_assert_int_eq(in.coupon_type, 2);
    ck_assert_str_eq(in.coupon_amount, "7.50");
    ck_assert_str_eq(in.coupon_threshold, "99.99");
    ck_assert_uint_eq(in.set, ACTIN_NAME | ACTIN_TOTAL | ACTIN_START | ACTIN_END | ACTIN_VALIDITY
                                  | ACTIN_COUPON_NAME | ACTIN_COUPON_TYPE | ACTIN_COUPON_AMOUNT
                                  | ACTIN_COUPON_THRESHOLD);

    ck_assert_int_eq(parse("{\"id\":12345678901234567890,\"addStock\":5}", 1, &in, &e), CS_OK);
    ck_assert_uint_eq(in.set, ACTIN_ADD);
    ck_assert_int_eq(in.add_stock, 5);
}
END_TEST

START_TEST(errors_name_the_field)
{
    static const struct {
        const char *json;
        int for_update;
        const char *field;
    } bad[] = {
        {"{\"name\":\"\"}", 0, "name"},
        {"{\"name\":5}", 0, "name"},
        {"{\"name\":\"a\\u0001b\"}", 0, "name"},
        {"{\"totalNum\":0}", 0, "totalNum"},
        {"{\"totalNum\":1.5}", 0, "totalNum"},
        {"{\"totalNum\":\"3\"}", 0, "totalNum"},
        {"{\"totalNum\":1e10}", 0, "totalNum"},
        {"{\"validityDays\":0}", 0, "validityDays"},
        {"{\"couponType\":3}", 0, "couponType"},
        {"{\"couponAmount\":\"1.234\"}", 0, "couponAmount"},
        {"{\"couponAmount\":-1}", 0, "couponAmount"},
        {"{\"couponAmount\":\"1e3\"}", 0, "couponAmount"},
        {"{\"couponThreshold\":\"12345678901\"}", 0, "couponThreshold"},
        {"{\"distributeStartTime\":\"tomorrow\"}", 0, "distributeStartTime"},
        {"{\"distributeEndTime\":1796126400}", 0, "distributeEndTime"},
        {"{\"addStock\":0}", 1, "addStock"},
        {"{\"totalNum\":1,\"totalNum\":2}", 0, "totalNum"},
        {"{\"addStock\":1}", 0, ""},
        {"{\"id\":1}", 0, ""},
        {"{\"colour\":\"red\"}", 1, ""},
    };
    struct actinput in;
    struct actinput_err e;
    for (size_t i = 0; i < CS_ARRAY_LEN(bad); i++) {
        ck_assert_msg(parse(bad[i].json, bad[i].for_update, &in, &e) == CS_ERR, "accepted %s",
                      bad[i].json);
        ck_assert_msg(strcmp(e.field, bad[i].field) == 0, "%s: field %s", bad[i].json, e.field);
        ck_assert(strchr(e.msg, '"') == NULL && strchr(e.msg, '\\') == NULL);
    }
    /* A key that could break the JSON of the answer is not quoted back. */
    ck_assert_int_eq(parse("{\"a\\\"b\":1}", 0, &in, &e), CS_ERR);
    ck_assert_str_eq(e.msg, "unknown field");
}
END_TEST

/* A row of activity 7: total 100, 40 issued, window [start, end) around
 * MySQL's clock now. */
static struct activity_row rules_row(int64_t now, int64_t start, int64_t end, int status)
{
    struct activity_row r;
    memset(&r, 0, sizeof(r));
    r.a.id = 7;
    snprintf(r.a.name, sizeof(r.a.name), "sale");
    r.a.total_num = 100;
    r.stock_num = 60;
    r.a.start_ms = start;
    r.a.end_ms = end;
    r.a.status = status;
    r.db_now_ms = now;
    return r;
}

START_TEST(change_rules)
{
    int64_t now = 1700000000000LL;
    struct activity_change c;
    struct actinput_err e;
    struct actinput in;

    /* Not started: the total may fall to the coupons issued, not below. */
    struct activity_row r = rules_row(now, now + 60000, now + 120000, ACT_NOT_STARTED);
    memset(&in, 0, sizeof(in));
    in.set = ACTIN_TOTAL;
    in.total_num = 40;
    ck_assert_int_eq(activity_change_rules(&in, &r, &c, &e), ACTIVITY_CHANGE_OK);
    ck_assert_int_eq(c.delta, -60);
    in.total_num = 39;
    ck_assert_int_eq(activity_change_rules(&in, &r, &c, &e), ACTIVITY_CHANGE_BAD);
    ck_assert_str_eq(e.field, "totalNum");
    /* The window: an end at or before the start is refused. */
    memset(&in, 0, sizeof(in));
    in.set = ACTIN_END;
    in.end_s = (now + 60000) / 1000;
    ck_assert_int_eq(activity_change_rules(&in, &r, &c, &e), ACTIVITY_CHANGE_BAD);
    ck_assert_str_eq(e.field, "distributeEndTime");

    /* Started: only a later end and a top-up; a field sent with its value
     * as it is changes nothing and passes. */
    r = rules_row(now, now - 60000, now + 60000, ACT_IN_PROGRESS);
    memset(&in, 0, sizeof(in));
    in.set = ACTIN_NAME;
    snprintf(in.name, sizeof(in.name), "other");
    ck_assert_int_eq(activity_change_rules(&in, &r, &c, &e), ACTIVITY_CHANGE_BAD);
    ck_assert_str_eq(e.field, "name");
    snprintf(in.name, sizeof(in.name), "sale");
    ck_assert_int_eq(activity_change_rules(&in, &r, &c, &e), ACTIVITY_CHANGE_OK);
    ck_assert_uint_eq(c.ch, 0);
    memset(&in, 0, sizeof(in));
    in.set = ACTIN_END;
    in.end_s = (now + 30000) / 1000;
    ck_assert_int_eq(activity_change_rules(&in, &r, &c, &e), ACTIVITY_CHANGE_BAD);
    in.end_s = (now + 90000) / 1000;
    ck_assert_int_eq(activity_change_rules(&in, &r, &c, &e), ACTIVITY_CHANGE_OK);
    memset(&in, 0, sizeof(in));
    in.set = ACTIN_ADD;
    in.add_stock = 5;
    ck_assert_int_eq(activity_change_rules(&in, &r, &c, &e), ACTIVITY_CHANGE_OK);
    ck_assert_int_eq(c.delta, 5);
    in.add_stock = ACTIN_MAX_TOTAL;
    ck_assert_int_eq(activity_change_rules(&in, &r, &c, &e), ACTIVITY_CHANGE_BAD);
    ck_assert_str_eq(e.field, "addStock");

    /* Ended (by MySQL's clock, whatever the status says) and revoked. */
    in.add_stock = 5;
    r = rules_row(now, now - 60000, now, ACT_IN_PROGRESS);
    ck_assert_int_eq(activity_change_rules(&in, &r, &c, &e), ACTIVITY_CHANGE_ENDED);
    r = rules_row(now, now - 60000, now + 60000, ACT_VOIDED);
    ck_assert_int_eq(activity_change_rules(&in, &r, &c, &e), ACTIVITY_CHANGE_VOIDED);
    ck_assert(strstr(e.msg, "revoked") != NULL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("actinput");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, rfc3339_times);
    tcase_add_test(tc, fields_are_read);
    tcase_add_test(tc, errors_name_the_field);
    tcase_add_test(tc, lifecycle_fields);
    tcase_add_test(tc, change_rules);
    suite_add_tcase(s, tc);
    return cs_run_suite(s, 0);
}
