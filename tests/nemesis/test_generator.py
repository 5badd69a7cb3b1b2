#!/usr/bin/env python3
"""test_generator.py - the nemesis schedules: a pure function of the seed."""
import os
import sys
import unittest

sys.dont_write_bytecode = True  # the source tree may be read-only (distcheck)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generator  # noqa: E402

OTHERS = sorted(generator.KINDS)


class TestGenerator(unittest.TestCase):
    def test_same_seed_same_schedule(self):
        for seed in range(1, 50):
            self.assertEqual(generator.schedule(seed, 12), generator.schedule(seed, 12))

    def test_slow_journal_leaves_the_other_kinds_as_they_were(self):
        # Seeds kept as regression cases replay the faults they had before
        # slow-journal came in: its events come from a stream of their own.
        for seed in range(1, 200):
            mixed = [e for e in generator.schedule(seed, 12) if e["kind"] != "slow-journal"]
            self.assertEqual(mixed, generator.schedule(seed, 12, 2, OTHERS))

    def test_slow_journal_events(self):
        seen = 0
        for seed in range(1, 100):
            evs = [e for e in generator.schedule(seed, 12, 2, ["slow-journal"])
                   if e["target"] != "admin"]
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

    def test_every_kind_is_known(self):
        self.assertEqual(generator.all_kinds(), OTHERS + ["slow-journal"])


if __name__ == "__main__":
    unittest.main()
