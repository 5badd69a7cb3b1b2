/* test_seize_rules.c - a seize's deadline and waits, its checks before
 * Redis, and the meaning of the seize script's answers (fcgi/node/seize_rules.c). */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "scripts.h"
#include "node/seize_rules.h"
#include "runner.h"

START_TEST(outcome_mapping)
{
    ck_assert_int_eq(seize_rules_outcome(0), CODE_SEIZED);
    ck_assert_int_eq(seize_rules_outcome(999), CODE_SEIZED);
    ck_assert_int_eq(seize_rules_outcome(SCRIPT_SEIZE_ALREADY), CODE_ALREADY_SEIZED);
    ck_assert_int_eq(seize_rules_outcome(SCRIPT_SEIZE_SOLD_OUT), CODE_SOLD_OUT);
    ck_assert_int_eq(seize_rules_outcome(SCRIPT_SEIZE_UNKNOWN), CODE_NO_SUCH_ACTIVITY);
    ck_assert_int_eq(seize_rules_outcome(SCRIPT_SEIZE_NOT_STARTED), CODE_NOT_STARTED);
    ck_assert_int_eq(seize_rules_outcome(SCRIPT_SEIZE_ENDED), CODE_ENDED);
    /* No stock now, but node reserves are open (not final). */
    ck_assert_int_eq(seize_rules_outcome(SCRIPT_SEIZE_FOR_NOW), CODE_SOLD_OUT);
    ck_assert_int_eq(seize_rules_outcome(-7), CODE_INTERNAL_ERROR);
    /* The values are the script's contract (internals.md S1). */
    ck_assert_int_eq(SCRIPT_SEIZE_ALREADY, -1);
    ck_assert_int_eq(SCRIPT_SEIZE_SOLD_OUT, -2);
    ck_assert_int_eq(SCRIPT_SEIZE_UNKNOWN, -3);
    ck_assert_int_eq(SCRIPT_SEIZE_NOT_STARTED, -4);
    ck_assert_int_eq(SCRIPT_SEIZE_ENDED, -5);
    ck_assert_int_eq(SCRIPT_SEIZE_FOR_NOW, -6);
}
END_TEST

START_TEST(margin_is_a_tenth_at_most_100)
{
    ck_assert_int_eq(seize_rules_margin(1000), 100);
    ck_assert_int_eq(seize_rules_margin(5000), 100);
    ck_assert_int_eq(seize_rules_margin(300), 30);
    ck_assert_int_eq(seize_rules_margin(5), 0);
}
END_TEST

START_TEST(deadline_from_the_budget)
{
    /* Taken at mono 10,000 with no start time from the web server: the
     * budget less the margin. */
    ck_assert_int_eq(seize_rules_deadline(1000, 10000, -1, 5000000, 10000), 10900);
    /* Later in the request, the same deadline. */
    ck_assert_int_eq(seize_rules_deadline(1000, 10000, -1, 5000200, 10200), 10900);
}
END_TEST

START_TEST(deadline_counts_the_wait_for_a_worker)
{
    /* The web server got it 300 ms before the worker took it. */
    int64_t now = 5000000, mono = 10000, taken = 10000;
    ck_assert_int_eq(seize_rules_deadline(1000, taken, now - 300, now, mono), 10600);
    /* Measured later in the request: the same wait. */
    ck_assert_int_eq(seize_rules_deadline(1000, taken, now - 300, now + 50, mono + 50), 10600);
    /* A clock far off (ten budgets or more) or in the future: not believed. */
    ck_assert_int_eq(seize_rules_deadline(1000, taken, now - 10000, now, mono), 10900);
    ck_assert_int_eq(seize_rules_deadline(1000, taken, now + 500, now, mono), 10900);
}
END_TEST

START_TEST(deadline_keeps_one_short_try)
{
    /* Waited 950 ms for a worker with a 1 s budget: a try until the
     * budget ends, 50 ms. */
    int64_t now = 5000000, mono = 10000;
    ck_assert_int_eq(seize_rules_deadline(1000, mono, now - 950, now, mono), mono + 50);
    /* Waited 850 ms: the margin, which still ends within the budget. */
    ck_assert_int_eq(seize_rules_deadline(1000, mono, now - 850, now, mono), mono + 100);
    /* Waited 2 s: the budget is gone, the deadline is already past (the
     * seize is answered unsent). */
    ck_assert_int_le(seize_rules_deadline(1000, mono, now - 2000, now, mono), mono);
    /* Taken long ago (mono is past the budget): past as well. */
    ck_assert_int_le(seize_rules_deadline(1000, 10000, -1, now, 12000), 12000);
}
END_TEST

START_TEST(first_wait_keeps_room_for_a_resend)
{
    /* A command timeout is kept when it is at most a quarter of what is left. */
    ck_assert_int_eq(seize_rules_first_wait(200, 900), 700);
    ck_assert_int_eq(seize_rules_first_wait(200, 800), 600);
    /* Else a quarter. */
    ck_assert_int_eq(seize_rules_first_wait(500, 800), 600);
    ck_assert_int_eq(seize_rules_first_wait(200, 40), 30);
}
END_TEST

static struct activity sale(void)
{
    struct activity a;
    memset(&a, 0, sizeof(a));
    a.id = 7;
    a.status = ACT_IN_PROGRESS;
    a.start_ms = 1000000;
    a.end_ms = 2000000;
    return a;
}

START_TEST(admit_judges_the_window_by_the_bounds)
{
    struct activity a = sale();
    ck_assert_int_eq(seize_rules_admit(&a, NULL, 0, 1500000, 1500000, 0), CODE_OK);
    ck_assert_int_eq(seize_rules_admit(&a, NULL, 0, 999000, 999999, 0), CODE_NOT_STARTED);
    /* Only a window missed by the whole bound is refused. */
    ck_assert_int_eq(seize_rules_admit(&a, NULL, 0, 999000, 1000000, 0), CODE_OK);
    ck_assert_int_eq(seize_rules_admit(&a, NULL, 0, 1999999, 2000500, 0), CODE_OK);
    ck_assert_int_eq(seize_rules_admit(&a, NULL, 0, 2000000, 2000500, 0), CODE_ENDED);
    a.status = ACT_VOIDED;
    ck_assert_int_eq(seize_rules_admit(&a, NULL, 0, 1500000, 1500000, 0), CODE_VOIDED);
}
END_TEST

START_TEST(admit_takes_the_soldout_hint_last)
{
    struct activity a = sale();
    ck_assert_int_eq(seize_rules_admit(&a, NULL, 0, 1500000, 1500000, 1), CODE_SOLD_OUT);
    /* A closed window answers as such, hint or not. */
    ck_assert_int_eq(seize_rules_admit(&a, NULL, 0, 2500000, 2500000, 1), CODE_ENDED);
}
END_TEST

START_TEST(admit_checks_groups_first)
{
    struct activity a = sale();
    const char mine[2][40] = {"old", "vip"};
    const char other[1][40] = {"new-user"};
    snprintf(a.groups, sizeof(a.groups), "[\"vip\"]");
    ck_assert_int_eq(seize_rules_admit(&a, mine, 2, 1500000, 1500000, 0), CODE_OK);
    ck_assert_int_eq(seize_rules_admit(&a, other, 1, 1500000, 1500000, 0), CODE_NOT_ELIGIBLE);
    ck_assert_int_eq(seize_rules_admit(&a, NULL, 0, 2500000, 2500000, 1), CODE_NOT_ELIGIBLE);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("seize_rules");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, outcome_mapping);
    tcase_add_test(tc, margin_is_a_tenth_at_most_100);
    tcase_add_test(tc, deadline_from_the_budget);
    tcase_add_test(tc, deadline_counts_the_wait_for_a_worker);
    tcase_add_test(tc, deadline_keeps_one_short_try);
    tcase_add_test(tc, first_wait_keeps_room_for_a_resend);
    tcase_add_test(tc, admit_judges_the_window_by_the_bounds);
    tcase_add_test(tc, admit_takes_the_soldout_hint_last);
    tcase_add_test(tc, admit_checks_groups_first);
    suite_add_tcase(s, tc);
    return cs_run_suite(s, 0);
}
