"""generator.py - the seeded schedule of a nemesis run: faults and admin events.

A schedule is a pure function of (seed, secs, nodes): the same seed gives the
same faults at the same offsets, the same targets and the same admin events,
so an anomaly's seed replays its schedule. Each event is a dict:
  {"at": seconds from the start, "kind": ..., "target": ..., "dur": seconds, ...}
Faults that use the same target never overlap (a process is killed or stopped
by one fault at a time); faults of different targets overlap freely.
A schedule also says which web nodes run with group commit on: one
"group-commit" event at 0 per such node (a setting of the stack, not a fault).
"""
import random

# kind -> (weight, target kind, duration range in s or None for instantaneous)
KINDS = {
    "kill-redis": (3, "redis", (1.0, 5.0)),      # kill -9, restart after dur
    "stop-redis": (2, "redis", (0.5, 4.0)),      # SIGSTOP, SIGCONT after dur
    "pause-redis": (2, "redis", (0.5, 3.0)),     # CLIENT PAUSE dur WRITE
    "kill-worker": (2, "node", None),            # kill -9 one worker (the supervisor restarts it)
    "kill-keeper": (2, "node", None),            # kill -9 the reserve keeper
    "kill-node": (2, "node", (1.0, 5.0)),        # kill -9 supervisor, workers, keeper; restart
    "stop-node": (1, "node", (0.5, 3.0)),        # SIGSTOP a whole coupon-fcgi
    "kill-sync": (1, "sync", (1.0, 4.0)),
    "stop-sync": (1, "sync", (0.5, 3.0)),
    "kill-mysql": (1, "mysql", (1.0, 4.0)),
    "stop-mysql": (1, "mysql", (0.5, 3.0)),
    "part-node-redis": (3, "node", (1.0, 6.0)),  # node n from every Redis node
    "part-master": (2, "redis", (2.5, 6.0)),     # one Redis node from everyone else
    "part-sync-mysql": (1, "sync", (1.0, 4.0)),  # coupon-sync from MariaDB
    "skew": (1, "node", (3.0, 8.0)),             # restart node n with its wall clock moved
}

# Drawn from a stream of their own (so that adding them left every other
# kind's schedule of a seed as it was): every fsync and fdatasync of one web
# node's processes held DELAY ms by strace for dur s, a slow journal disk.
SLOW_JOURNAL = ("slow-journal", (1.0, 5.0), (50, 600))

# Group commit (limits.batch_max, DESIGN.md "Group commit of seizes"): in a
# share of the schedules one web node, drawn by the seed, runs with batches
# of up to 32 and 16 workers, and gets load enough for batches to form. Drawn
# from a stream of its own, as are the faults made for it: the faults of the
# other kinds of a seed stay what they were.
GROUP_COMMIT = "group-commit"
BATCH = {"batch_max": 32, "workers": 16}
BATCH_SHARE = 0.5

# kind -> (weight, duration range in s or None for instantaneous): faults on
# one worker of a web node, the batched one when there is one.
WORKER_KINDS = {
    # kill -9 of a worker in a call: the leader of the call in flight
    # (reading Redis' answer) or a follower (asleep on its queue entry's
    # futex); only on a node with group commit on.
    "kill-batch-worker": (1, None),
    # SIGSTOP of one worker, SIGCONT after dur (a debugger, a long page fault).
    "stop-worker": (1, (0.2, 2.0)),
}

# Drawn from a stream of its own as well: an in-place upgrade of one web
# node (tests/stack upgrade-fcgiN: SIGUSR2, the binary then in the build
# tree; doc/operations.md "Upgrading in place") at a random moment, tried about
# every 8 s (every 6 s when it is the only kind asked for). It lasts as long
# as it takes (counted as UPGRADE_S), none on a node while another of its
# process faults, a slow journal or a worker fault acts on it, so it meets
# the Redis, MySQL and partition faults, the reserves and group commit.
UPGRADE = "upgrade-node"
UPGRADE_S = 3.0

REDIS_NODES = 6


def _targets(tkind, nodes):
    if tkind == "redis":
        return ["redis%d" % n for n in range(1, REDIS_NODES + 1)]
    if tkind == "node":
        return ["node%d" % n for n in range(1, nodes + 1)]
    return [tkind]


def schedule(seed, secs, nodes=2, kinds=None, batch=None):
    """The events of one run, sorted by "at": faults, then the admin events
    "move-window" (at 30 % of the run) and "revoke" (at 45 %), and one
    "group-commit" event at 0 per node that runs with group commit on.
    batch: None, the seed draws (on for one node when kinds names
    kill-batch-worker); "on", the node the seed draws whatever the share;
    "off"; or a list of node numbers."""
    rng = random.Random("nemesis:%d" % seed)
    names = sorted(k for k in (kinds if kinds else KINDS) if k in KINDS)
    weights = [KINDS[k][0] for k in names]
    busy = {}  # target -> time it is free again
    events = []
    t = rng.uniform(1.0, 2.5)
    # Faults start until a little before the end; the run heals at secs.
    while names and t < secs - 1.5:
        kind = rng.choices(names, weights)[0]
        _, tkind, durs = KINDS[kind]
        targets = _targets(tkind, nodes)
        target = rng.choice(targets)
        dur = 0.0 if durs is None else round(rng.uniform(*durs), 2)
        dur = min(dur, max(0.0, secs - t))
        # Process faults on one target exclude each other; partitions of
        # one node from Redis and a kill of that node may overlap.
        key = target if not kind.startswith("part-") else kind + ":" + target
        if busy.get(key, 0.0) <= t:
            ev = {"at": round(t, 2), "kind": kind, "target": target, "dur": dur}
            if kind == "skew":
                ev["offset_s"] = rng.choice([-1, 1]) * rng.randint(5, 120)
            busy[key] = t + dur + 0.3
            events.append(ev)
        t += rng.expovariate(1.0 / 1.6)
    if kinds is None or SLOW_JOURNAL[0] in kinds:
        only = kinds is not None and all(k == SLOW_JOURNAL[0] for k in kinds)
        events += _slow_journal(seed, secs, nodes, only, events)
    on = batched_nodes(seed, nodes, batch, kinds)
    asked = [k for k in WORKER_KINDS if kinds is None or k in kinds]
    if asked:
        only = kinds is not None and all(k in WORKER_KINDS for k in kinds)
        events += _worker_faults(seed, secs, nodes, on, asked, only, events)
    if kinds is None or UPGRADE in kinds:
        only = kinds is not None and all(k == UPGRADE for k in kinds)
        events += _upgrades(seed, secs, nodes, only, events)
    for n in on:
        events.append(dict({"at": 0.0, "kind": GROUP_COMMIT, "target": "node%d" % n, "dur": 0.0},
                           **BATCH))
    events.append({"at": round(secs * 0.30, 2), "kind": "move-window", "target": "admin", "dur": 0.0})
    events.append({"at": round(secs * 0.45, 2), "kind": "revoke", "target": "admin", "dur": 0.0})
    events.sort(key=lambda e: (e["at"], e["kind"]))
    return events


# Faults on a web node's processes: a slow-journal or a fault on one worker
# never overlaps one of them on the same node (one fault acts on a process at
# a time).
NODE_PROCESS_KINDS = ("kill-worker", "kill-keeper", "kill-node", "stop-node", "skew")


def _slow_journal(seed, secs, nodes, only, others):
    """The slow-journal faults of a run, one node at a time (about one every
    6 s; every 2 s when they are the only kind asked for), none on a node
    while one of others' process faults acts on it."""
    rng = random.Random("nemesis-slow:%d" % seed)
    busy = [(e["target"], e["at"], e["at"] + e["dur"] + 0.3) for e in others
            if e["kind"] in NODE_PROCESS_KINDS]
    events = []
    t = rng.uniform(1.0, 4.0)
    while t < secs - 1.5:
        dur = round(min(rng.uniform(*SLOW_JOURNAL[1]), secs - t), 2)
        ev = {"at": round(t, 2), "kind": SLOW_JOURNAL[0],
              "target": "node%d" % rng.randint(1, nodes), "dur": dur,
              "delay_ms": rng.randint(*SLOW_JOURNAL[2])}
        if not any(n == ev["target"] and a < t + dur + 0.3 and t < b for n, a, b in busy):
            events.append(ev)
        t += dur + 0.3 + rng.expovariate(1.0 / (2.0 if only else 6.0))
    return events


def batched_nodes(seed, nodes=2, batch=None, kinds=None):
    """The web nodes that run with group commit on (see schedule())."""
    rng = random.Random("nemesis-batch:%d" % seed)
    drawn = rng.random() < BATCH_SHARE
    node = rng.randint(1, nodes)
    if batch is None:
        forced = kinds is not None and "kill-batch-worker" in kinds
        return [node] if drawn or forced else []
    if batch == "on":
        return [node]
    if batch == "off":
        return []
    return sorted(set(int(n) for n in batch))


def _worker_faults(seed, secs, nodes, batched, asked, only, others):
    """The faults on one worker (WORKER_KINDS, those in asked) of a run,
    about one every 2.5 s (every 1.5 s when they are the only kinds asked for),
    one at a time, on the batched nodes (a stop-worker on any node when none
    is), none on a node while another process fault or a slow journal acts
    on it. Every draw is made whatever is kept, so the kinds asked change
    which events are kept, not when the others come."""
    rng = random.Random("nemesis-worker:%d" % seed)
    names = sorted(WORKER_KINDS)
    weights = [WORKER_KINDS[k][0] for k in names]
    busy = [(e["target"], e["at"], e["at"] + e["dur"] + 0.3) for e in others
            if e["kind"] in NODE_PROCESS_KINDS or e["kind"] == SLOW_JOURNAL[0]]
    events = []
    t = rng.uniform(1.0, 3.0)
    while t < secs - 1.5:
        kind = rng.choices(names, weights)[0]
        durs = WORKER_KINDS[kind][1]
        dur = rng.uniform(*durs) if durs else 0.0
        dur = round(min(dur, secs - t), 2)
        pick = rng.random()
        pool = batched or ([] if kind == "kill-batch-worker" else list(range(1, nodes + 1)))
        if kind in asked and pool:
            target = "node%d" % pool[int(pick * len(pool))]
            if not any(n == target and a < t + dur + 0.3 and t < b for n, a, b in busy):
                events.append({"at": round(t, 2), "kind": kind, "target": target, "dur": dur})
        t += dur + 0.3 + rng.expovariate(1.0 / (1.0 if only else 2.0))
    return events


def _upgrades(seed, secs, nodes, only, others):
    """The in-place upgrades of a run (UPGRADE), one at a time, none on a
    node while one of others' process faults, slow journals or worker faults
    acts on it (before, during or after the UPGRADE_S it is counted)."""
    rng = random.Random("nemesis-upgrade:%d" % seed)
    busy = [(e["target"], e["at"], e["at"] + e["dur"] + 0.3) for e in others
            if e["kind"] in NODE_PROCESS_KINDS or e["kind"] == SLOW_JOURNAL[0]
            or e["kind"] in WORKER_KINDS]
    events = []
    t = rng.uniform(2.0, 6.0)
    while t < secs - UPGRADE_S:
        target = "node%d" % rng.randint(1, nodes)
        if not any(n == target and a < t + UPGRADE_S and t < b for n, a, b in busy):
            events.append({"at": round(t, 2), "kind": UPGRADE, "target": target, "dur": 0.0})
        t += UPGRADE_S + rng.expovariate(1.0 / (3.0 if only else 5.0))
    return events


def all_kinds():
    """Every fault kind a schedule may hold."""
    return sorted(KINDS) + [SLOW_JOURNAL[0]] + sorted(WORKER_KINDS) + [UPGRADE]


def sales(secs):
    """The sales of a run: id -> what it is. Ids fall on four shards."""
    return {
        101: {"role": "sellout", "total": 40},
        102: {"role": "plenty", "total": 1000000},
        103: {"role": "revoked", "total": 400},
        # Offsets from the setup, which comes about 2.5 s before the load: the
        # end is moved (at 30 % of the run) before it has come.
        104: {"role": "window", "total": 600, "start_s": 4.0, "end_s": round(secs * 0.5 + 3, 1),
              "new_end_s": round(secs * 0.75 + 3, 1)},
    }


if __name__ == "__main__":
    import json
    import sys
    for e in schedule(int(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 30):
        print(json.dumps(e))
