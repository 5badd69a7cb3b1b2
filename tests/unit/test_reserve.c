/* test_reserve.c - reserve_grant()'s branches on a shared-memory segment and
 * a journal directory made by the test: what a seize that never reached
 * Redis is granted from the node's reserve. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cs.h"
#include "journal.h"
#include "keys.h"
#include "log.h"
#include "reserve.h"
#include "shm.h"
#include "runner.h"

#define AID 4242
#define LEASE_MS 3000
#define MARGIN_MS 100

static char name[64], jdir[64];
static struct shm_node *node;
static struct reserve_journal rj;

/* A keeper that renewed shard's lease just now, Redis' clock at redis_ms,
 * and an open reserve of AID with amount tokens, its window around it. */
static void setup(void)
{
    char err[256];
    snprintf(name, sizeof(name), "/cs-test-rsv-%d", (int)getpid());
    node = shm_node_open(name, 1, err, sizeof(err));
    ck_assert_msg(node != NULL, "%s", err);
    snprintf(jdir, sizeof(jdir), "/tmp/cs-test-rsv-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(jdir));
    memset(&rj, 0, sizeof(rj));
    rj.j.fd = -1;

    struct shm_reserves *rv = &node->rsv;
    int64_t now = cs_boot_ms();
    struct shm_rsv_lease *l = &rv->lease[keys_shard(AID)];
    atomic_store(&l->sent_mono, now - 10);
    atomic_store(&l->recv_mono, now - 5);
    atomic_store(&l->redis_ms, 5000000);
    atomic_store(&rv->keeper_pid, (int)getpid());
    atomic_store(&rv->journal_seg, 1);
    struct shm_rsv_slot *s = &rv->slot[0];
    atomic_store(&s->activity_id, AID);
    atomic_store(&s->epoch, 1);
    atomic_store(&s->amount, 2);
    atomic_store(&s->next, 0);
    atomic_store(&s->start_ms, 4000000);
    atomic_store(&s->end_ms, 6000000);
    atomic_store(&s->open_to_all, 1);
    atomic_store(&s->state, RSV_OPEN);
}

static void teardown(void)
{
    char cmd[128];
    if (rj.seg != 0)
        journal_close(&rj.j);
    shm_node_close(node);
    shm_node_unlink(name);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", jdir);
    ck_assert_int_eq(system(cmd), 0);
}

static enum reserve_outcome grant(int64_t uid, int meta_known)
{
    return reserve_grant(node, 0, jdir, &rj, LEASE_MS, MARGIN_MS, AID, uid, meta_known);
}

START_TEST(grants_then_knows_the_user)
{
    ck_assert_int_eq(grant(1, 1), RESERVE_SEIZED);
    ck_assert_int_eq(grant(1, 1), RESERVE_ALREADY);
    ck_assert_int_eq(grant(2, 1), RESERVE_SEIZED);
    ck_assert_int_eq(atomic_load(&node->rsv.spent), 2);
    ck_assert_int_eq(atomic_load(&node->rsv.journal_depth), 2);
    int replayed;
    ck_assert(reserve_granted(&node->rsv, AID, 1, &replayed));
}
END_TEST

START_TEST(spent_reserve_grants_nothing)
{
    ck_assert_int_eq(grant(1, 1), RESERVE_SEIZED);
    ck_assert_int_eq(grant(2, 1), RESERVE_SEIZED);
    ck_assert_int_eq(grant(3, 1), RESERVE_NONE); /* two tokens, both spent */
    ck_assert_int_eq(grant(3, 1), RESERVE_NONE);
}
END_TEST

START_TEST(no_worker_slot_no_keeper_no_reserve)
{
    ck_assert_int_eq(reserve_grant(node, -1, jdir, &rj, LEASE_MS, MARGIN_MS, AID, 1, 1),
                     RESERVE_NONE);
    ck_assert_int_eq(reserve_grant(node, 0, jdir, &rj, LEASE_MS, MARGIN_MS, AID + 1, 1, 1),
                     RESERVE_NONE); /* no reserve of that sale */
    atomic_store(&node->rsv.keeper_pid, 0);
    ck_assert_int_eq(grant(1, 1), RESERVE_NO_KEEPER);
}
END_TEST

/* A keeper restarting (an upgrade in place hands over to a new one): the
 * new keeper empties the grants table and refills it from the journal, and
 * no keeper runs meanwhile. A user granted before is then not in the table:
 * the answer must not be NONE (UNAVAILABLE: nothing issued). */
START_TEST(a_grant_the_table_lost_to_a_rebuild_is_not_denied)
{
    ck_assert_int_eq(grant(7, 1), RESERVE_SEIZED);
    atomic_store(&node->rsv.keeper_pid, 0);
    memset(node->rsv.grant, 0, sizeof(node->rsv.grant)); /* the rebuild's start */
    atomic_store(&node->rsv.ngrants, 0);
    ck_assert_int_ne(grant(7, 1), RESERVE_NONE);
    ck_assert_int_ne(grant(7, 1), RESERVE_SEIZED);
}
END_TEST

/* A worker without a registry slot grants nothing, but still knows who holds
 * a grant: not UNAVAILABLE to them. */
START_TEST(a_worker_without_a_slot_knows_the_grants)
{
    ck_assert_int_eq(grant(8, 1), RESERVE_SEIZED);
    ck_assert_int_eq(reserve_grant(node, -1, jdir, &rj, LEASE_MS, MARGIN_MS, AID, 8, 1),
                     RESERVE_ALREADY);
}
END_TEST

START_TEST(only_an_open_slot_grants)
{
    atomic_store(&node->rsv.slot[0].state, RSV_OPEN + 1);
    ck_assert_int_eq(grant(1, 1), RESERVE_NONE);
}
END_TEST

START_TEST(only_within_the_lease)
{
    struct shm_rsv_lease *l = &node->rsv.lease[keys_shard(AID)];
    atomic_store(&l->sent_mono, cs_boot_ms() - LEASE_MS);
    ck_assert_int_eq(grant(1, 1), RESERVE_NONE);
    atomic_store(&l->sent_mono, 0); /* never renewed */
    ck_assert_int_eq(grant(1, 1), RESERVE_NONE);
}
END_TEST

START_TEST(only_inside_the_window_less_the_margin)
{
    struct shm_rsv_slot *s = &node->rsv.slot[0];
    atomic_store(&s->start_ms, 5000100); /* Redis' clock is at most 5,000,010 */
    ck_assert_int_eq(grant(1, 1), RESERVE_NONE);
    atomic_store(&s->start_ms, 4000000);
    atomic_store(&s->end_ms, 5000000 + MARGIN_MS); /* within the margin of the end */
    ck_assert_int_eq(grant(1, 1), RESERVE_NONE);
    atomic_store(&s->end_ms, 5000000 + MARGIN_MS + 1000);
    ck_assert_int_eq(grant(1, 1), RESERVE_SEIZED);
}
END_TEST

START_TEST(unknown_eligibility_needs_a_sale_open_to_all)
{
    atomic_store(&node->rsv.slot[0].open_to_all, 0);
    ck_assert_int_eq(grant(1, 0), RESERVE_NONE);
    ck_assert_int_eq(grant(1, 1), RESERVE_SEIZED);
}
END_TEST

START_TEST(halted_node_grants_nothing_but_knows_its_grants)
{
    ck_assert_int_eq(grant(1, 1), RESERVE_SEIZED);
    atomic_store(&node->rsv.halted, 1);
    ck_assert_int_eq(grant(2, 1), RESERVE_NONE);
    ck_assert_int_eq(grant(1, 1), RESERVE_ALREADY);
}
END_TEST

START_TEST(no_journal_segment_no_grant)
{
    atomic_store(&node->rsv.journal_seg, 0);
    ck_assert_int_eq(grant(1, 1), RESERVE_NONE);
    /* Nothing was taken: the user may be granted once a segment is there. */
    atomic_store(&node->rsv.journal_seg, 1);
    ck_assert_int_eq(grant(1, 1), RESERVE_SEIZED);
}
END_TEST

START_TEST(unwritable_journal_cancels_the_grant)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", jdir);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(grant(1, 1), RESERVE_NONE);
    ck_assert_int_eq(atomic_load(&node->rsv.slot[0].next), 1); /* the token stays unused */
    ck_assert_int_eq(grant(1, 1), RESERVE_NONE); /* cancelled, never ALREADY */
    ck_assert_ptr_nonnull(mkdtemp(strcpy(jdir, "/tmp/cs-test-rsv-XXXXXX")));
}
END_TEST

int main(void)
{
    log_init("test_reserve", LOG_LVL_ERROR + 1, "stderr");
    Suite *s = suite_create("reserve");
    TCase *tc = tcase_create("grant");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, grants_then_knows_the_user);
    tcase_add_test(tc, spent_reserve_grants_nothing);
    tcase_add_test(tc, no_worker_slot_no_keeper_no_reserve);
    tcase_add_test(tc, only_an_open_slot_grants);
    tcase_add_test(tc, only_within_the_lease);
    tcase_add_test(tc, only_inside_the_window_less_the_margin);
    tcase_add_test(tc, unknown_eligibility_needs_a_sale_open_to_all);
    tcase_add_test(tc, halted_node_grants_nothing_but_knows_its_grants);
    tcase_add_test(tc, a_grant_the_table_lost_to_a_rebuild_is_not_denied);
    tcase_add_test(tc, a_worker_without_a_slot_knows_the_grants);
    tcase_add_test(tc, no_journal_segment_no_grant);
    tcase_add_test(tc, unwritable_journal_cancels_the_grant);
    suite_add_tcase(s, tc);
    return cs_run_suite(s, 0);
}
