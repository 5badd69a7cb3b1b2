/* runner.h - the one main() of every unit test program. */
#ifndef CS_TEST_RUNNER_H
#define CS_TEST_RUNNER_H

#include <check.h>

/* Runs suite s and returns the process exit code (0 when every test passed).
 * nofork keeps the tests in this process (for fixtures that own a server). */
static inline int cs_run_suite(Suite *s, int nofork)
{
    SRunner *sr = srunner_create(s);
    if (nofork)
        srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}

#endif
