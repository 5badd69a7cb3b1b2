#!/usr/bin/env python3
"""test_checker.py - the nemesis checker on small hand-written histories."""
import os
import sys
import unittest

sys.dont_write_bytecode = True  # the source tree may be read-only (distcheck)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checker  # noqa: E402


def seize(user, code, sale=102, node=1, t0=1000, t1=1010):
    return {"type": "seize", "user": user, "sale": sale, "node": node, "t0": t0, "t1": t1,
            "http": 200, "code": code}


def status(user, seized, sale=102, node=1, pending=False):
    return {"type": "status", "user": user, "sale": sale, "node": node, "t0": 9000, "t1": 9001,
            "http": 200, "code": "OK", "seized": seized, "pending": pending}


def sale(role="plenty", total=10, rows=(), stock=None, held=0, status=2, listed=None,
         start_ms=0, end_ms=10 ** 13):
    rows = [list(r) for r in rows]
    if stock is None:
        stock = total - held - len(rows)
    return {"role": role, "total": total, "status": status, "start_ms": start_ms,
            "end_ms": end_ms, "stock": stock, "held": held,
            "seize_list": sorted({r[0] for r in rows}) if listed is None else listed,
            "rows": rows}


def stores(**sales):
    return {"lease_ms": 3000, "drained": True,
            "sales": {k.lstrip("s"): v for k, v in sales.items()}}


def kinds(history, st):
    return sorted(a["kind"] for a in checker.check(history, st)[0])


class TestChecker(unittest.TestCase):
    def test_valid_history(self):
        h = [seize(1, "SEIZED"), seize(1, "ALREADY_SEIZED", node=2), seize(2, "UNAVAILABLE"),
             seize(3, "SOLD_OUT")]
        self.assertEqual(kinds(h, stores(s102=sale(rows=[(1, 1, 1005)]))), [])

    def test_seized_without_coupon_is_lost(self):
        h = [seize(1, "SEIZED")]
        self.assertIn("lost", kinds(h, stores(s102=sale(rows=[]))))

    def test_two_coupons_of_one_sale(self):
        h = [seize(1, "SEIZED"), seize(1, "SEIZED", node=2)]
        self.assertIn("double", kinds(h, stores(s102=sale(rows=[(1, 1, 1005), (1, 1, 1006)],
                                                          listed=[1]))))

    def test_seized_on_both_nodes_holding_one_is_valid(self):
        # An outage: both nodes grant from their reserves, one coupon stays.
        h = [seize(1, "SEIZED", node=1), seize(1, "SEIZED", node=2)]
        self.assertEqual(kinds(h, stores(s102=sale(rows=[(1, 1, 1005)]))), [])

    def test_unavailable_only_but_holds_one(self):
        h = [seize(1, "UNAVAILABLE"), seize(1, "ALREADY_SEIZED")]
        self.assertEqual(kinds(h, stores(s102=sale(rows=[(1, 1, 1005)]))), ["false-negative"])

    def test_unknown_settled_either_way(self):
        h = [seize(1, "UNKNOWN_OUTCOME"), status(1, True), seize(2, "TIMEOUT"), status(2, False)]
        self.assertEqual(kinds(h, stores(s102=sale(rows=[(1, 1, 1005)]))), [])

    def test_unknown_status_disagrees_with_mysql(self):
        h = [seize(1, "UNKNOWN_OUTCOME"), status(1, True)]
        self.assertEqual(kinds(h, stores(s102=sale(rows=[]))), ["unsettled"])

    def test_unknown_never_settled(self):
        h = [seize(1, "UNKNOWN_OUTCOME")]
        self.assertEqual(kinds(h, stores(s102=sale(rows=[]))), ["unsettled"])

    def test_unknown_still_pending(self):
        h = [seize(1, "UNKNOWN_OUTCOME"), status(1, True, pending=True)]
        self.assertEqual(kinds(h, stores(s102=sale(rows=[(1, 1, 1005)]))), ["unsettled"])

    def test_more_rows_than_total(self):
        h = [seize(u, "SEIZED", sale=101) for u in (1, 2, 3)]
        st = stores(s101=sale(role="sellout", total=2, stock=0,
                              rows=[(1, 1, 1), (2, 1, 2), (3, 1, 3)]))
        self.assertEqual(kinds(h, st), ["oversell", "unbalanced"])

    def test_stock_raised(self):
        st = stores(s102=sale(total=10, stock=10, rows=[(1, 1, 1005)]))
        self.assertEqual(kinds([seize(1, "SEIZED")], st), ["unbalanced"])

    def test_reserves_count_in_the_balance(self):
        st = stores(s102=sale(total=10, stock=4, held=5, rows=[(1, 1, 1005)]))
        self.assertEqual(kinds([seize(1, "SEIZED")], st), [])

    def test_stores_disagree(self):
        st = stores(s102=sale(rows=[(1, 1, 1005)], listed=[1, 2]))
        self.assertEqual(kinds([seize(1, "SEIZED")], st), ["stores-disagree"])

    def test_sold_after_revoke(self):
        rev = {"type": "admin", "op": "revoke", "sale": 103, "t0": 5000, "t1": 5010, "http": 200}
        h = [rev, seize(1, "SEIZED", sale=103, t0=4000, t1=4005),
             seize(2, "SEIZED", sale=103, t0=20000, t1=20005)]
        st = stores(s103=sale(role="revoked", status=4, stock=-1,
                              rows=[(1, 4, 4002), (2, 4, 20002)]))
        self.assertEqual(kinds(h, st), ["sold-after-revoke", "sold-after-revoke"])

    def test_grant_within_the_lease_after_revoke_is_allowed(self):
        rev = {"type": "admin", "op": "revoke", "sale": 103, "t0": 5000, "t1": 5010, "http": 200}
        h = [rev, seize(1, "SEIZED", sale=103, t0=6000, t1=6005)]
        st = stores(s103=sale(role="revoked", status=4, stock=-1, rows=[(1, 4, 6002)]))
        self.assertEqual(kinds(h, st), [])

    def test_revoked_coupon_left_live(self):
        rev = {"type": "admin", "op": "revoke", "sale": 103, "t0": 5000, "t1": 5010, "http": 200}
        h = [rev, seize(1, "SEIZED", sale=103, t0=4000, t1=4005)]
        st = stores(s103=sale(role="revoked", status=4, stock=-1, rows=[(1, 1, 4002)]))
        self.assertEqual(kinds(h, st), ["revoked-unvoided"])

    def test_unknown_on_a_revoked_sale_settles_by_status(self):
        rev = {"type": "admin", "op": "revoke", "sale": 103, "t0": 5000, "t1": 5010, "http": 200}
        h = [rev, seize(1, "UNKNOWN_OUTCOME", sale=103), status(1, True, sale=103)]
        st = stores(s103=sale(role="revoked", status=4, stock=-1, rows=[(1, 4, 1005)]))
        self.assertEqual(kinds(h, st), [])

    def test_status_without_mine_does_not_settle(self):
        # Seed 59: a revoked sale's status said nothing of the user.
        rev = {"type": "admin", "op": "revoke", "sale": 103, "t0": 5000, "t1": 5010, "http": 200}
        h = [rev, seize(1, "UNKNOWN_OUTCOME", sale=103), status(1, None, sale=103)]
        st = stores(s103=sale(role="revoked", status=4, stock=-1, rows=[(1, 4, 1005)]))
        self.assertEqual(kinds(h, st), ["unsettled"])

    def test_sold_outside_window(self):
        h = [seize(1, "SEIZED", sale=104, t0=50000, t1=50010)]
        st = stores(s104=sale(role="window", start_ms=1000, end_ms=30000, rows=[(1, 1, 50005)]))
        self.assertEqual(kinds(h, st), ["sold-outside-window", "sold-outside-window"])

    def test_granted_after_a_final_sold_out(self):
        h = [seize(1, "SEIZED", sale=101, t0=100, t1=110), seize(2, "SOLD_OUT", sale=101, t0=200, t1=210),
             seize(3, "SEIZED", sale=101, t0=300, t1=310)]
        st = stores(s101=sale(role="sellout", total=2, stock=0, rows=[(1, 1, 105), (3, 1, 305)]))
        self.assertEqual(kinds(h, st), ["sold-after-sold-out"])

    def test_granted_after_a_sold_out_for_now(self):
        so = seize(2, "SOLD_OUT", sale=101, t0=200, t1=210)
        so["final"] = False
        h = [seize(1, "SEIZED", sale=101, t0=100, t1=110), so, seize(3, "SEIZED", sale=101, t0=300, t1=310)]
        st = stores(s101=sale(role="sellout", total=2, stock=0, rows=[(1, 1, 105), (3, 1, 305)]))
        self.assertEqual(kinds(h, st), [])

    # Group commit: a worker killed in a call, and answers that went to the
    # wrong entry (a stale leader's answer in a reused entry), are judged per user.
    def test_worker_killed_in_a_call_is_open_until_settled(self):
        h = [seize(1, "HTTP_502"), seize(2, "HTTP_502"), status(1, True), status(2, False)]
        self.assertEqual(kinds(h, stores(s102=sale(rows=[(1, 1, 1005)]))), [])
        h = [seize(1, "HTTP_502")]
        self.assertEqual(kinds(h, stores(s102=sale(rows=[(1, 1, 1005)]))), ["unsettled"])

    def test_answers_swapped_inside_a_batch(self):
        # User 1 is told user 2's SEIZED, user 2 user 1's SOLD_OUT; the
        # stores hold user 2's coupon: each user's answer is judged.
        h = [seize(1, "SEIZED", sale=101), seize(2, "SOLD_OUT", sale=101, t0=1000, t1=1020)]
        self.assertEqual(kinds(h, stores(s101=sale(role="sellout", total=1, rows=[(2, 1, 1005)]))),
                         ["false-negative", "lost"])

    def test_seized_with_an_answer_meant_for_another_sale(self):
        # Told SEIZED from another seize's entry while its own call sold
        # nothing: lost, however the other sale's stores look.
        h = [seize(1, "SEIZED", sale=101), seize(2, "SEIZED", sale=102)]
        self.assertEqual(kinds(h, stores(s101=sale(role="sellout", total=1, rows=[]),
                                         s102=sale(rows=[(2, 1, 1005)]))), ["lost"])

    def test_answers_while_a_worker_is_stopped(self):
        def fault(phase, t):
            return {"type": "nemesis", "f": "stop-worker", "target": "node2", "idx": 7,
                    "phase": phase, "t0": t, "t1": t}
        h = [fault("start", 1000), seize(1, "SEIZED", node=2, t0=1100, t1=1900),
             seize(2, "UNAVAILABLE", node=2, t0=1500, t1=1600), seize(3, "SEIZED", node=1, t0=1200),
             seize(4, "SEIZED", node=2, t0=2500, t1=2510), fault("stop", 2000)]
        self.assertEqual(checker.stats(h)["stopped_worker"],
                         {"faults": 1, "seizes": 2, "codes": {"SEIZED": 1, "UNAVAILABLE": 1},
                          "slowest_ms": 800})
        self.assertNotIn("stopped_worker", checker.stats([seize(1, "SEIZED")]))

    def test_not_drained(self):
        st = stores(s102=sale())
        st["drained"] = False
        self.assertEqual(kinds([], st), ["not-drained"])


class LoadgenLog(unittest.TestCase):
    """judge_log(): the integration tests' per-user judge of a loadgen log."""

    def judge(self, answers, rows, kills=False):
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
            f.write("ms status code user us\n")
            for i, (user, code) in enumerate(answers):
                f.write("%d 200 %s %d %d\n" % (i, code, user, 1000 * (i + 1)))
        try:
            return checker.judge_log(f.name, rows, kills)
        finally:
            os.unlink(f.name)

    def test_truthful_log(self):
        r = self.judge([(1, "SEIZED"), (2, "SOLD_OUT"), (3, "UNKNOWN_OUTCOME"), (4, "UNKNOWN_OUTCOME")],
                       [1, 3])
        self.assertEqual((r["bad_seized"], r["bad_holders"], r["doubles"]), (0, 0, 0))
        self.assertEqual((r["seized"], r["sold_out"], r["unknown"], r["answers"]), (1, 1, 2, 4))

    def test_seized_without_a_coupon(self):
        self.assertEqual(self.judge([(1, "SEIZED"), (2, "SEIZED")], [1])["bad_seized"], 1)

    def test_a_coupon_told_unavailable(self):
        self.assertEqual(self.judge([(1, "UNAVAILABLE")], [1])["bad_holders"], 1)

    def test_a_coupon_never_asked_for(self):
        # Without kills every holder of the rows is judged, asked or not.
        self.assertEqual(self.judge([(1, "SEIZED")], [1, 9])["bad_holders"], 1)
        self.assertEqual(self.judge([(1, "SEIZED")], [1, 9], kills=True)["bad_holders"], 0)

    def test_a_dropped_connection_leaves_it_open_only_under_kills(self):
        self.assertEqual(self.judge([(1, "HTTP_502")], [1])["bad_holders"], 1)
        r = self.judge([(1, "HTTP_502"), (2, "CONNECTION_ERROR")], [1, 2], kills=True)
        self.assertEqual((r["bad_holders"], r["no_answer"]), (0, 2))

    def test_two_coupons(self):
        self.assertEqual(self.judge([(1, "SEIZED")], [1, 1])["doubles"], 1)

    def test_an_early_seized_is_judged_though_a_later_answer_differs(self):
        self.assertEqual(self.judge([(1, "SEIZED"), (1, "ALREADY_SEIZED")], [])["bad_seized"], 1)

    def test_user_faults(self):
        self.assertEqual(checker.user_faults(["SEIZED"], 1), [])
        self.assertEqual(checker.user_faults(["SEIZED"], 0), ["lost"])
        self.assertEqual(checker.user_faults(["SOLD_OUT"], 1), ["false-negative"])
        self.assertEqual(checker.user_faults(["TIMEOUT"], 1), [])
        self.assertEqual(checker.user_faults(["SEIZED"], 2), ["double"])


if __name__ == "__main__":
    unittest.main()
