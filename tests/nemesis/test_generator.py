#!/usr/bin/env python3
"""test_generator.py - the nemesis schedules: a pure function of the seed."""
import hashlib
import json
import os
import sys
import unittest

sys.dont_write_bytecode = True  # the source tree may be read-only (distcheck)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generator  # noqa: E402

OTHERS = sorted(generator.KINDS)
# Kinds drawn from streams of their own, and the group-commit setting.
OWN = {"slow-journal", generator.GROUP_COMMIT, generator.UPGRADE} | set(generator.WORKER_KINDS)

# sha256 of the schedules (the kinds of OWN left out) of seeds 1-40, 12 and 30 s,
# as the generator drew them when the campaigns in doc/nemesis.md ran: the
# seeds kept there as regression cases must replay the same faults.
PINNED = "21a29d9af54049da44100ea97d99399745b9bf7e3782ec59461f4a6758a916a8"


class TestGenerator(unittest.TestCase):
    def test_same_seed_same_schedule(self):
        for seed in range(1, 50):
            self.assertEqual(generator.schedule(seed, 12), generator.schedule(seed, 12))

    def test_slow_journal_leaves_the_other_kinds_as_they_were(self):
        # Seeds kept as regression cases replay the faults they had before
        # slow-journal came in: its events come from a stream of their own.
        for seed in range(1, 200):
            mixed = [e for e in generator.schedule(seed, 12) if e["kind"] not in OWN]
            self.assertEqual(mixed, [e for e in generator.schedule(seed, 12, 2, OTHERS)
                                     if e["kind"] != generator.GROUP_COMMIT])

    def test_schedules_as_pinned(self):
        h = hashlib.sha256()
        for seed in range(1, 41):
            for secs in (12, 30):
                evs = [e for e in generator.schedule(seed, secs) if e["kind"] not in OWN]
                h.update(json.dumps(evs, sort_keys=True).encode())
        self.assertEqual(h.hexdigest(), PINNED)

    def test_slow_journal_beside_no_process_fault_of_its_node(self):
        for seed in range(1, 200):
            evs = generator.schedule(seed, 30)
            procs = [e for e in evs if e["kind"] in generator.NODE_PROCESS_KINDS]
            for s in (e for e in evs if e["kind"] == "slow-journal"):
                for p in procs:
                    if p["target"] == s["target"]:
                        self.assertFalse(p["at"] < s["at"] + s["dur"] + 0.3
                                         and s["at"] < p["at"] + p["dur"] + 0.3, (seed, s, p))

    def test_slow_journal_events(self):
        seen = 0
        for seed in range(1, 100):
            evs = [e for e in generator.schedule(seed, 12, 2, ["slow-journal"])
                   if e["target"] != "admin" and e["kind"] != generator.GROUP_COMMIT]
            end = 0.0
            for e in evs:
                seen += 1
                self.assertEqual(e["kind"], "slow-journal")
                self.assertIn(e["target"], ("node1", "node2"))
                self.assertTrue(50 <= e["delay_ms"] <= 600)
                self.assertTrue(0 < e["dur"] <= 5.0)
                self.assertGreaterEqual(e["at"], end)  # one at a time
                self.assertLess(e["at"] + e["dur"], 12.01)
                end = e["at"] + e["dur"]
        self.assertGreater(seen, 100)

    def test_slow_journal_as_before_the_worker_kinds(self):
        # The worker faults and group commit came after slow-journal: its
        # events are what they were (one stream each).
        for seed in range(1, 100):
            for batch in (None, "on", "off"):
                sj = [e for e in generator.schedule(seed, 30, 2, None, batch)
                      if e["kind"] == "slow-journal"]
                self.assertEqual(sj, generator._slow_journal(
                    seed, 30, 2, False, [e for e in generator.schedule(seed, 30, 2, OTHERS)
                                         if e["kind"] != generator.GROUP_COMMIT]))

    def test_group_commit_on_a_share_of_the_seeds(self):
        on = 0
        for seed in range(1, 201):
            evs = generator.schedule(seed, 12)
            gc = [e for e in evs if e["kind"] == generator.GROUP_COMMIT]
            self.assertLessEqual(len(gc), 1)
            for e in gc:
                on += 1
                self.assertEqual((e["at"], e["dur"]), (0.0, 0.0))
                self.assertIn(e["target"], ("node1", "node2"))
                self.assertEqual((e["batch_max"], e["workers"]), (32, 16))
                self.assertEqual([e["target"]], ["node%d" % n for n in generator.batched_nodes(seed)])
            # The kinds asked do not change whether, or where, it is on.
            self.assertEqual(gc, [e for e in generator.schedule(seed, 12, 2, ["kill-redis"])
                                  if e["kind"] == generator.GROUP_COMMIT])
            # --batch on: the node the seed draws; off: none.
            on_ev = [e for e in generator.schedule(seed, 12, 2, None, "on")
                     if e["kind"] == generator.GROUP_COMMIT]
            self.assertEqual(len(on_ev), 1)
            if gc:
                self.assertEqual(gc, on_ev)
            self.assertFalse([e for e in generator.schedule(seed, 12, 2, None, "off")
                              if e["kind"] == generator.GROUP_COMMIT])
            both = [e["target"] for e in generator.schedule(seed, 12, 2, None, [1, 2])
                    if e["kind"] == generator.GROUP_COMMIT]
            self.assertEqual(both, ["node1", "node2"])
        self.assertTrue(70 <= on <= 130, on)  # about half

    def test_group_commit_leaves_the_other_faults_as_they_were(self):
        for seed in range(1, 100):
            ref = [e for e in generator.schedule(seed, 30) if e["kind"] not in OWN]
            for batch in ("on", "off", [1, 2]):
                self.assertEqual(ref, [e for e in generator.schedule(seed, 30, 2, None, batch)
                                       if e["kind"] not in OWN])

    def test_worker_faults(self):
        seen = {k: 0 for k in generator.WORKER_KINDS}
        for seed in range(1, 200):
            evs = generator.schedule(seed, 30)
            on = ["node%d" % n for n in generator.batched_nodes(seed)]
            procs = [e for e in evs if e["kind"] in generator.NODE_PROCESS_KINDS
                     or e["kind"] == "slow-journal"]
            end = 0.0
            for w in (e for e in evs if e["kind"] in generator.WORKER_KINDS):
                seen[w["kind"]] += 1
                if w["kind"] == "kill-batch-worker":
                    self.assertEqual(w["dur"], 0.0)
                    self.assertIn(w["target"], on)  # only where batches form
                else:
                    self.assertTrue(0.2 <= w["dur"] <= 2.0, w)
                    self.assertIn(w["target"], on or ["node1", "node2"])
                self.assertGreaterEqual(w["at"], end)  # one at a time
                self.assertLess(w["at"], 30 - 1.5)
                end = w["at"] + w["dur"]
                for p in procs:  # never beside another fault on the node's processes
                    if p["target"] == w["target"]:
                        self.assertFalse(p["at"] < w["at"] + w["dur"] + 0.3
                                         and w["at"] < p["at"] + p["dur"] + 0.3, (seed, w, p))
        for k, n in seen.items():
            self.assertGreater(n, 150, k)

    def test_worker_faults_alone(self):
        # Asked for alone, kill-batch-worker turns group commit on and comes
        # often; the other kinds of the seed are absent.
        for seed in range(1, 50):
            evs = generator.schedule(seed, 12, 2, ["kill-batch-worker", "stop-worker"])
            on = ["node%d" % n for n in generator.batched_nodes(seed, 2, "on")]
            self.assertEqual([e["target"] for e in evs if e["kind"] == generator.GROUP_COMMIT], on)
            faults = [e for e in evs if e["target"] != "admin" and e["kind"] != generator.GROUP_COMMIT]
            self.assertTrue(faults)
            self.assertEqual({e["kind"] for e in faults} - set(generator.WORKER_KINDS), set())
            self.assertEqual({e["target"] for e in faults}, set(on))
            kills = [e for e in generator.schedule(seed, 12, 2, ["kill-batch-worker"])
                     if e["target"] != "admin" and e["kind"] != generator.GROUP_COMMIT]
            self.assertEqual({e["kind"] for e in kills} - {"kill-batch-worker"}, set())
            # With group commit off there is no batch to kill a worker of.
            self.assertFalse([e for e in generator.schedule(seed, 12, 2, ["kill-batch-worker"], "off")
                              if e["kind"] == "kill-batch-worker"])

    def test_every_kind_is_known(self):
        self.assertEqual(generator.all_kinds(), OTHERS + ["slow-journal", "kill-batch-worker",
                                                          "stop-worker", "upgrade-node"])

    def test_upgrades_beside_no_process_fault_of_their_node(self):
        seen = 0
        for seed in range(1, 200):
            evs = generator.schedule(seed, 30)
            procs = [e for e in evs if e["kind"] in generator.NODE_PROCESS_KINDS
                     or e["kind"] == "slow-journal" or e["kind"] in generator.WORKER_KINDS]
            ups = [e for e in evs if e["kind"] == generator.UPGRADE]
            seen += len(ups)
            for u in ups:
                self.assertIn(u["target"], ("node1", "node2"))
                for p in procs:
                    if p["target"] == u["target"]:
                        self.assertFalse(p["at"] < u["at"] + generator.UPGRADE_S
                                         and u["at"] < p["at"] + p["dur"] + 0.3, (seed, u, p))
            for a, b in zip(ups, ups[1:]):
                self.assertGreaterEqual(b["at"] - a["at"], generator.UPGRADE_S)
        self.assertGreater(seen, 150)

    def test_upgrades_alone(self):
        for seed in range(1, 50):
            evs = [e for e in generator.schedule(seed, 30, 2, [generator.UPGRADE])
                   if e["target"] != "admin" and e["kind"] != generator.GROUP_COMMIT]
            self.assertTrue(evs)
            self.assertEqual({e["kind"] for e in evs}, {generator.UPGRADE})


if __name__ == "__main__":
    unittest.main()
