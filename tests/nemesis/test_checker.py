#!/usr/bin/env python3
"""test_checker.py - the nemesis checker on small hand-written histories."""
import os
import sys
import unittest

sys.dont_write_bytecode = True  # the source tree may be read-only (distcheck)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checker  # noqa: E402
import loadlog  # noqa: E402


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


def log(*answers, start=100000):
    """A load log's start and answers from (ms, status, code, user, us) tuples."""
    return start, [loadlog.Answer(*a) for a in answers]


class LoadLogs(unittest.TestCase):
    """loadlog.py: the judges the integration tests run on their logs."""

    def test_read_log_skips_a_torn_last_line(self):
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
            f.write("# start_epoch_ms 5000\n1.5 200 SEIZED 7 900\n# merged\n2.0 503 UNAVAI")
        try:
            self.assertEqual(loadlog.read_log(f.name),
                             (5000, [loadlog.Answer(1.5, 200, "SEIZED", 7, 900)]))
        finally:
            os.unlink(f.name)

    def test_upgrade_windows(self):
        start, a = log((10, 200, "SEIZED", 1, 2000), (20, 200, "SEIZED", 2, 3000),
                       (150, 200, "UNKNOWN_OUTCOME", 3, 900000), (400, 200, "SEIZED", 4, 1000))
        lines = loadlog.upgrade_windows(start, a, [("first", start + 100, start + 300)])
        self.assertEqual(lines, ["before: 2 answers, p99 3 ms, longest gap 80 ms",
                                 "first: 200 ms, 1 answers {'UNKNOWN_OUTCOME': 1}, p99 900 ms, "
                                 "longest gap 150 ms"])

    def test_node_windows(self):
        n1 = log((10, 200, "SEIZED", 1, 1), (60, 200, "SEIZED", 2, 1), start=1000)
        n2 = log((5, 200, "SOLD_OUT", 3, 1), start=1050)
        self.assertEqual(loadlog.node_windows([n1, n2], [("node1", 1000, 1100)]),
                         ["node1 upgraded in 100 ms; node 1: 2 answers {'SEIZED': 2}, longest gap 50 ms; "
                          "node 2: 1 answers {'SOLD_OUT': 1}, longest gap 55 ms"])

    def test_outage_finds_an_answer_other_than_503(self):
        # Redis gone from 1000 to 3000 (start 0): a 200 inside is bad, a
        # 502 anywhere is a 5xx other than 503.
        start, a = log((1500, 503, "UNAVAILABLE", 1, 1000), (2000, 200, "SEIZED", 2, 1000),
                       (2500, 502, "HTTP_502", 3, 1000), (3600, 200, "SEIZED", 4, 1000), start=0)
        self.assertEqual(loadlog.outage(start, a, 1000, 3000, 3500), (2, 100, 1, 0, 1000, 1, 2))

    def test_seized_held(self):
        a = log((1, 200, "SEIZED", 1, 1), (2, 200, "SEIZED", 2, 1), (3, 503, "UNAVAILABLE", 3, 1))[1]
        self.assertEqual(loadlog.seized_held(a, {1: 1, 2: 1}), (0, 0, 0))
        # User 2 told SEIZED holds none; 1 holds two; 3, told UNAVAILABLE, holds one.
        self.assertEqual(loadlog.seized_held(a, {1: 2, 3: 1}), (1, 0, 1))
        self.assertEqual(loadlog.seized_held(a, {1: 2, 3: 1}, slack=0), (1, 1, 1))

    def test_strict_holders(self):
        a = log((1, 200, "SEIZED", 1, 1), (2, 200, "SEIZED", 2, 1), (3, 200, "UNKNOWN_OUTCOME", 3, 1))[1]
        self.assertEqual(loadlog.strict_holders(a, {1: 1, 2: 1}), [])
        self.assertEqual(loadlog.strict_holders(a, {1: 2, 3: 1, 9: 1}), [1, 2, 3, 9])

    def test_late_grants(self):
        # SOLD_OUT answered at 100; user 3's seize sent at 150 was granted.
        a = log((100, 200, "SOLD_OUT", 1, 10000), (120, 200, "SEIZED", 2, 50000),
                (160, 200, "SEIZED", 3, 10000))[1]
        self.assertEqual(loadlog.late_grants(a), 1)
        self.assertEqual(loadlog.late_grants(a[:2]), 0)

    def test_window_latency(self):
        start, a = log((10, 200, "SEIZED", 1, 5000), (30, 200, "SEIZED", 2, 7000), start=0)
        self.assertEqual(loadlog.window_latency(start, a, 20, 40), (7000, 1))
        self.assertEqual(loadlog.window_latency(start, a, 50, 60), (-1, 0))

    def test_told_holds_line_by_line(self):
        told = [(1, "SEIZED"), (2, "UNKNOWN_OUTCOME"), (3, "UNAVAILABLE"), (4, "SEIZED"),
                (5, "SOLD_OUT"), (6, "UNKNOWN_OUTCOME")]
        held = {1: 1, 2: 1, 4: 2, 5: 1, 6: 2}
        self.assertEqual(loadlog.misjudged(told, held),
                         [(4, "SEIZED", 2), (5, "SOLD_OUT", 1), (6, "UNKNOWN_OUTCOME", 2)])
        self.assertEqual(loadlog.misjudged([(1, "SEIZED")], {}), [(1, "SEIZED", 0)])

    def test_books_across_phases(self):
        # Shard 0: user 1 told SEIZED in phase a holds one; user 2 told
        # SEIZED in phase b holds none; user 3 holds one it was told
        # SOLD_OUT for; user 4's UNKNOWN_OUTCOME allows its coupon.
        logs = {"a": [log((1, 200, "SEIZED", 1, 1), (2, 200, "SOLD_OUT", 3, 1))[1]],
                "b": [log((1, 200, "SEIZED", 2, 1), (2, 200, "UNKNOWN_OUTCOME", 4, 1))[1]]}
        self.assertEqual(loadlog.books("b", logs, [{1: 1, 3: 1, 4: 1}]),
                         ["# b answers: SEIZED 1, UNKNOWN_OUTCOME 1",
                          "BAD shard 0: 1 users told SEIZED hold no coupon, e.g. [2]",
                          "BAD shard 0: 1 holders were told neither SEIZED nor UNKNOWN_OUTCOME, e.g. [3]"])
        self.assertEqual(loadlog.books("a", {"a": logs["a"]}, [{1: 1}]),
                         ["# a answers: SEIZED 1, SOLD_OUT 1"])

    def test_pauses(self):
        start, a = log((100, 200, "SEIZED", 1, 1), (200, 200, "SOLD_OUT", 2, 1),
                       (900, 200, "SEIZED", 3, 1), (1000, 200, "SEIZED", 4, 1), start=0)
        self.assertEqual(loadlog.pauses(start, a, 500, 950), (800, 400, 1))
        self.assertEqual(loadlog.pauses(start, a, 2000, 3000), (0, -1, 0))

    def test_cluster_report(self):
        def shard(users, code="SEIZED", t=1000):
            return log(*[(t + k, 200, code, u, 1) for k, u in enumerate(users)], start=0)
        logs = [shard(range(i * 1000, i * 1000 + 120)) for i in range(3)]
        held = [{u: 1 for u in range(i * 1000, i * 1000 + 120)} for i in range(3)]
        lines = loadlog.cluster_report(logs, held, {1}, 500, 900, 100, 200, 2)
        self.assertEqual([x for x in lines if x.startswith("BAD")], [])
        # Shard 0 loses a coupon of a SEIZED user; shard 2 (unaffected) had
        # only 50 requests, all after the rejoin but SOLD_OUT.
        held[0].pop(5)
        logs[2] = shard(range(2000, 2050), "SOLD_OUT")
        bad = [x for x in loadlog.cluster_report(logs, held, {1}, 500, 900, 100, 200, 1)
               if x.startswith("BAD")]
        self.assertEqual(bad, ["BAD shard 0: 1 users told SEIZED hold no coupon, e.g. [5]",
                               "BAD shard 2: 120 holders were told neither SEIZED nor UNKNOWN_OUTCOME, "
                               "e.g. [2000, 2001, 2002]",
                               "BAD shard 2: only 50 requests", "BAD shard 2: no SEIZED after the failover",
                               "BAD shard 2 (unaffected): lost 50 of 50 requests (>= 0.5 %)"])

    def test_journal_records_stop_at_a_torn_tail(self):
        import struct
        rec = 8 + 36

        def record(a, u, length=rec - 8):
            return struct.pack("<II", length, 0) + struct.pack("<qQIqq", a, 3, 1, u, 0)
        data = record(41, 7) + record(41, 8)
        self.assertEqual(loadlog.journal_records(data + record(41, 9)[:20], rec),
                         [(41, 3, 1, 7), (41, 3, 1, 8)])
        self.assertEqual(loadlog.journal_records(record(41, 7) + record(41, 8, length=5), rec),
                         [(41, 3, 1, 7)])

    def test_dir_fsynced(self):
        d = "/j"
        made = 'openat(AT_FDCWD, "/j/w1-1.jnl", O_RDWR|O_CREAT|O_APPEND, 0640) = 5'
        opened = 'openat(AT_FDCWD, "/j", O_RDONLY|O_DIRECTORY) = 6'
        self.assertTrue(loadlog.dir_fsynced([made, opened, "fsync(6) = 0"], d))
        self.assertFalse(loadlog.dir_fsynced([made, opened, "fsync(5) = 0"], d))
        self.assertFalse(loadlog.dir_fsynced([opened, "fsync(6) = 0", made], d))
        self.assertFalse(loadlog.dir_fsynced([made, opened, "fsync(6) = -1 EIO"], d))

    def test_freshness(self):
        body = '{"code":"OK","stale":false,"activity":{"name":"New","startTime":5}}'
        self.assertEqual(loadlog.freshness(body, "New 5", ["activity.name", "activity.startTime"]), "ok")
        self.assertEqual(loadlog.freshness(body, "Newer 5", ["activity.name", "activity.startTime"]),
                         "old[New 5]")
        self.assertEqual(loadlog.freshness('{"stale":true}', "x", ["a"]), "unsure")
        self.assertEqual(loadlog.freshness("<html>", "x", ["a"]), "old[not JSON: '<html>']")

    def test_soak_truth(self):
        a = log((1, 200, "SEIZED", 1, 1), (2, 200, "UNKNOWN_OUTCOME", 2, 1),
                (3, 0, "CONNECTION_ERROR", 3, 1), (4, 200, "SOLD_OUT", 4, 1))[1]
        c, ok = loadlog.soak_truth(a, {1: 1, 3: 1})
        self.assertTrue(ok)
        self.assertEqual((c["seized"], c["unknown_or_lost"], c["held_of_those"]), (1, 2, 1))
        c, ok = loadlog.soak_truth(a, {2: 1, 4: 1, 5: 1})
        self.assertFalse(ok)
        self.assertEqual((c["seized_not_held"], c["held_without_answer"], c["refused_but_held"]),
                         (1, 2, 1))


if __name__ == "__main__":
    unittest.main()
