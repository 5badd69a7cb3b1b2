/* test_super.c - the supervisor's back-off before starting again a worker
 * or keeper that died (fcgi/proc/super.h), and the variable an in-place
 * upgrade passes to the new binary (fcgi/proc/upgrade.h). */
#include <check.h>

#include "proc/super.h"
#include "proc/upgrade.h"
#include "runner.h"

START_TEST(young_deaths_wait_longer_and_longer)
{
    int64_t b = 0;
    static const int64_t want[] = {100, 200, 400, 800, 1600, 3200, 5000, 5000};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        b = super_backoff(b, 10);
        ck_assert_int_eq(b, want[i]);
    }
}
END_TEST

START_TEST(a_long_life_starts_again_at_once)
{
    ck_assert_int_eq(super_backoff(0, 1000), 0);
    ck_assert_int_eq(super_backoff(3200, 1000), 0);
    ck_assert_int_eq(super_backoff(5000, 60000), 0);
    /* ...and a young death after it starts the climb from the bottom. */
    ck_assert_int_eq(super_backoff(super_backoff(5000, 60000), 999), 100);
}
END_TEST

START_TEST(never_past_the_cap)
{
    ck_assert_int_eq(super_backoff(SUPER_BACKOFF_MAX_MS, 0), SUPER_BACKOFF_MAX_MS);
    ck_assert_int_eq(super_backoff(SUPER_BACKOFF_MAX_MS - 1, 0), SUPER_BACKOFF_MAX_MS);
    ck_assert_int_eq(super_backoff(2400, 0), 4800);
}
END_TEST

START_TEST(upgrade_variable_parses)
{
    struct upgrade_from u;
    ck_assert_int_eq(upgrade_parse("1:4242:3:0", &u), 0);
    ck_assert_int_eq(u.proto, 1);
    ck_assert_int_eq(u.old_pid, 4242);
    ck_assert_int_eq(u.fd, 3);
    ck_assert_int_eq(u.own_socket, 0);
    ck_assert_int_eq(upgrade_parse("7:100:12:1", &u), 0);
    ck_assert_int_eq(u.proto, 7);
    ck_assert_int_eq(u.own_socket, 1);
}
END_TEST

START_TEST(upgrade_variable_refuses_junk)
{
    struct upgrade_from u;
    static const char *bad[] = {
        NULL, "", "1", "1:4242:3", "1:4242:3:0:9", "1:4242:3:2", "0:4242:3:0", "1:1:3:0",
        "1:0:3:0", "1:4242:-1:0", "1:4242:3:0 ", "x:4242:3:0",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_msg(upgrade_parse(bad[i], &u) != 0, "accepted '%s'", bad[i] ? bad[i] : "NULL");
}
END_TEST

START_TEST(upgrade_version_line_parses)
{
    int proto = 0;
    unsigned layout = 0;
    ck_assert_int_eq(upgrade_parse_version("coupon-fcgi 0.2.0 upgrade-protocol 1 segment-layout 14",
                                           &proto, &layout), 0);
    ck_assert_int_eq(proto, 1);
    ck_assert_uint_eq(layout, 14);
    /* A build before -V printed its usage on stderr and nothing here. */
    ck_assert_int_ne(upgrade_parse_version("", &proto, &layout), 0);
    ck_assert_int_ne(upgrade_parse_version(NULL, &proto, &layout), 0);
    ck_assert_int_ne(upgrade_parse_version("usage: coupon-fcgi [-c PATH]", &proto, &layout), 0);
    ck_assert_int_ne(upgrade_parse_version("coupon-fcgi 0.2.0 upgrade-protocol x", &proto, &layout),
                     0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("super");
    TCase *tc = tcase_create("backoff");
    tcase_add_test(tc, young_deaths_wait_longer_and_longer);
    tcase_add_test(tc, a_long_life_starts_again_at_once);
    tcase_add_test(tc, never_past_the_cap);
    suite_add_tcase(s, tc);
    TCase *up = tcase_create("upgrade");
    tcase_add_test(up, upgrade_variable_parses);
    tcase_add_test(up, upgrade_variable_refuses_junk);
    tcase_add_test(up, upgrade_version_line_parses);
    suite_add_tcase(s, up);
    return cs_run_suite(s, 0);
}
