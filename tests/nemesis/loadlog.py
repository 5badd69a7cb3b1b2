"""loadlog.py - the integration tests' judges of load logs, journals and traces.

A load log is what tests/bench/loadgen -L writes (and tests/testkit.py paced,
and the tests' own ask() helpers): a header "# start_epoch_ms E", then one
line per answer, "ms status code user us": ms since E when the answer came
(or, for paced, when the seize was sent), the HTTP status, the answer's code,
the user, the latency in microseconds. Each judge here is a function of what
it reads, unit-tested in test_checker.py, with a subcommand of checker.py
for the shell; the per-user rules are checker.user_faults(), the one place
they are written.
"""
import re
import struct
from collections import Counter, namedtuple

from checker import user_faults

Answer = namedtuple("Answer", "ms status code user us")


def read_log(path):
    """(start, answers) of the load log at PATH: start the header's epoch ms
    (None without a number there), answers a list of Answer in file order,
    ms a float. Other lines opening with "#" are skipped, and so is a last
    line without its newline (one being written while the log is read)."""
    start, out = None, []
    with open(path) as f:
        lines = f.read().split("\n")
    # The text after the last newline is a line not yet whole ("" if none).
    for i, line in enumerate(lines[:-1]):
        if line.startswith("#"):
            if i == 0 and line.split()[-1].isdigit():
                start = int(line.split()[-1])
            continue
        if not line.strip():
            continue
        ms, status, code, user, us = line.split()
        out.append(Answer(float(ms), int(status), code, int(user), int(us)))
    return start, out


def read_users(text):
    """The users of a column of user ids (one per coupon row, as mysql -N
    prints them): a dict user -> how many rows."""
    held = {}
    for u in text.split():
        held[int(u)] = held.get(int(u), 0) + 1
    return held


def _p99_ms(us):
    v = sorted(us)
    return v[min(len(v) - 1, int(len(v) * 0.99))] // 1000 if v else -1


def _longest_gap(times, lo, hi):
    """The longest time without an answer in [lo, hi], the window's ends
    counting as answers."""
    t = [lo] + [x for x in times if lo <= x <= hi] + [hi]
    return max(b - a for a, b in zip(t, t[1:]))


# --- upgrades: answers inside time windows ---------------------------------------------

def upgrade_windows(start, answers, windows):
    """Per window (name, t0, t1) (epoch ms, as the test took its upgrades),
    the answers that came inside it: lines "NAME: D ms, N answers {codes},
    p99 P ms, longest gap G ms" after one for the answers before the first
    window ("before: N answers, p99 P ms, longest gap G ms")."""
    rows = sorted((a.ms, a.code, a.us) for a in answers)
    times = [r[0] for r in rows]
    first = windows[0][1] - start
    before = [r for r in rows if r[0] < first]
    out = ["before: %d answers, p99 %d ms, longest gap %d ms" % (
        len(before), _p99_ms([r[2] for r in before]),
        _longest_gap(times, before[0][0], first) if before else -1)]
    for name, t0, t1 in windows:
        lo, hi = t0 - start, t1 - start
        during = [r for r in rows if lo <= r[0] <= hi]
        out.append("%s: %d ms, %d answers %s, p99 %d ms, longest gap %d ms" % (
            name, hi - lo, len(during), dict(Counter(r[1] for r in during)),
            _p99_ms([r[2] for r in during]), _longest_gap(times, lo, hi)))
    return out


def node_windows(logs, windows):
    """Per window (name, t0, t1), for each node's log of LOGS (a list of
    (start, answers)): "NAME upgraded in D ms; node 1: N answers {codes},
    longest gap G ms; node 2: ..."."""
    nodes = [sorted((start + a.ms, a.code) for a in answers) for start, answers in logs]
    out = []
    for name, lo, hi in windows:
        parts = []
        for i, rows in enumerate(nodes):
            during = [r for r in rows if lo <= r[0] <= hi]
            parts.append("node %d: %d answers %s, longest gap %d ms" % (
                i + 1, len(during), dict(Counter(r[1] for r in during)),
                _longest_gap([r[0] for r in rows], lo, hi)))
        out.append("%s upgraded in %d ms; %s" % (name, hi - lo, "; ".join(parts)))
    return out


def parse_windows(text):
    """Windows as the tests note them: lines "NAME T0 T1" (epoch ms)."""
    return [(w.split()[0], int(w.split()[1]), int(w.split()[2]))
            for w in text.splitlines() if w.strip()]


# --- a Redis outage --------------------------------------------------------------------

def outage(start, answers, t_stop, t_start, t_ready):
    """A load across a Redis outage (Redis killed at T_STOP, started at
    T_START, answering PING at T_READY; epoch ms). Returns (bad_during,
    first_ok_after, non503_5xx, conn_err, p99_503_us, n503, seized):
    answers to seizes sent from 200 ms after the stop and answered before
    the start that were not 503; ms from T_READY to the first SEIZED after
    the start (-99999: none); 5xx other than 503 and connection errors over
    the whole load; p99 and count of the 503s inside; SEIZED answers."""
    rows = [(start + a.ms, a.status, a.code, a.user, a.us) for a in answers]
    during = [r for r in rows if t_stop + 200 <= r[0] - r[4] / 1000 and r[0] <= t_start]
    ok_after = [r[0] - t_ready for r in rows if r[0] > t_start and r[2] == "SEIZED"]
    lat503 = sorted(r[4] for r in during if r[1] == 503)
    return (sum(1 for r in during if r[1] != 503),
            int(min(ok_after)) if ok_after else -99999,
            sum(1 for r in rows if r[1] >= 500 and r[1] != 503),
            sum(1 for r in rows if r[2] == "CONNECTION_ERROR"),
            lat503[int(len(lat503) * 0.99)] if lat503 else -1,
            len(lat503),
            sum(1 for r in rows if r[2] == "SEIZED"))


def _codes_by_user(answers):
    told = {}
    for a in answers:
        told.setdefault(a.user, []).append(a.code)
    return told


def _never_open(code):
    return False


def seized_held(answers, held, slack=8):
    """Told SEIZED against the coupon rows HELD (user -> rows), where
    nothing leaves an outcome open: (lost, extra, dups): users told SEIZED
    holding none, 1 when more than SLACK holders were never told SEIZED
    (the seizes in flight when Redis was killed: granted, their answers
    lost), else 0, and the rows beyond one per user."""
    told = _codes_by_user(answers)
    lost = fn = 0
    for u in set(told) | set(held):
        f = user_faults(told.get(u, []), held.get(u, 0), _never_open)
        lost += "lost" in f
        fn += "false-negative" in f
    return lost, int(fn > slack), sum(n - 1 for n in held.values())


def strict_holders(answers, held):
    """Each user told SEIZED holds exactly one coupon, and nobody else
    holds one (no answer leaves an outcome open). Returns the users that
    break it, sorted."""
    told = _codes_by_user(answers)
    return sorted(u for u in set(told) | set(held)
                  if user_faults(told.get(u, []), held.get(u, 0), _never_open))


def late_grants(answers):
    """First come, first served: how many seizes sent (answer time less
    latency) after the first SOLD_OUT answer came were told SEIZED."""
    sold = [a.ms for a in answers if a.code == "SOLD_OUT"]
    first = min(sold) if sold else float("inf")
    return sum(1 for a in answers if a.code == "SEIZED" and a.ms - a.us / 1000.0 > first)


def window_latency(start, answers, t0, t1):
    """(p99_us, n) of the answers to seizes sent between T0 and T1 (epoch
    ms); p99 -1 without any."""
    lat = sorted(a.us for a in answers if t0 <= start + a.ms - a.us / 1000 <= t1)
    return (lat[int(len(lat) * 0.99)] if lat else -1), len(lat)


# --- told and held, line by line ---------------------------------------------------------

def told_holds(code, n):
    """A user told CODE who holds N coupons holds what they were told:
    SEIZED exactly one, UNKNOWN_OUTCOME none or one, anything else none."""
    if code == "SEIZED":
        return n == 1
    if code == "UNKNOWN_OUTCOME":
        return n in (0, 1)
    return n == 0


def misjudged(told, held):
    """The "user code" lines TOLD (in order, a user as often as asked)
    whose user does not hold what they were told (told_holds) against
    HELD (user -> coupons): a list of (user, code, n)."""
    return [(u, c, held.get(u, 0)) for u, c in told if not told_holds(c, held.get(u, 0))]


def read_told(paths):
    """The "user code" lines of the files PATHS, in order."""
    out = []
    for p in paths:
        with open(p) as f:
            for line in f:
                if line.strip():
                    u, code = line.split()
                    out.append((int(u), code))
    return out


# --- sharded loads (partition.sh, cluster.sh) ---------------------------------------------

def _shard_faults(shard, told, held):
    """BAD lines of one shard: users told SEIZED holding none, holders told
    neither SEIZED nor UNKNOWN_OUTCOME."""
    lost, fneg = [], []
    for u in set(told) | set(held):
        f = user_faults(told.get(u, []), held.get(u, 0), lambda c: c == "UNKNOWN_OUTCOME")
        if "lost" in f:
            lost.append(u)
        if "false-negative" in f:
            fneg.append(u)
    bad = []
    if lost:
        bad.append(f"shard {shard}: {len(lost)} users told SEIZED hold no coupon, e.g. {sorted(lost)[:3]}")
    if fneg:
        bad.append(f"shard {shard}: {len(fneg)} holders were told neither SEIZED nor UNKNOWN_OUTCOME, "
                   f"e.g. {sorted(fneg)[:3]}")
    return bad


def books(phase, logs, held):
    """The answers of every phase so far against the coupon rows, per shard.
    LOGS: {phase: [answers of shard 0, ...]}; HELD: [rows of shard 0 (user ->
    rows), ...]. Returns lines: "# PHASE answers: CODE n, ..." (PHASE's
    answers over every shard), then "BAD shard I: ..." for each fault."""
    totals, bad = Counter(), []
    for i, rows in enumerate(held):
        told = {}
        for ph, shards in logs.items():
            for a in shards[i]:
                if ph == phase:
                    totals[a.code] += 1
                told.setdefault(a.user, []).append(a.code)
        bad += _shard_faults(i, told, {u: 1 for u in rows})
    out = ["# " + phase + " answers: " + ", ".join(f"{k} {v}" for k, v in sorted(totals.items()))]
    return out + ["BAD " + b for b in bad]


def pauses(start, answers, t0, t1):
    """The longest time without a SEIZED among the SEIZED answers of one
    shard's log that ends at or after T0 (epoch ms), how long after T0 the
    first SEIZED from T0 on came (selling again; -1: none) and how many
    SEIZED answers came between T0 and T1: (gap, resumed, inside)."""
    last, gap, resumed, inside = None, 0, None, 0
    for a in answers:
        if a.code != "SEIZED":
            continue
        t = start + a.ms
        if last is not None and t >= t0 and t - last >= gap:
            gap, resumed = t - last, t
        elif t >= t0 and resumed is None:
            resumed = t
        inside += t0 <= t <= t1
        last = t
    return int(gap), (int(resumed - t0) if resumed is not None else -1), inside


def cluster_report(logs, held, affected, kill_t, rejoin_t, mig_start, mig_end, mig_shard):
    """A load over a Redis Cluster whose master of the AFFECTED shards was
    killed at KILL_T, back as a replica at REJOIN_T, and MIG_SHARD's slot
    migrated between MIG_START and MIG_END (epoch ms). LOGS: [(start,
    answers) of shard 0, ...]; HELD: [rows of shard 0 (user -> rows), ...].
    Returns lines, "# ..." to show and "BAD ..." per fault: the per-user
    faults, a shard with fewer than 100 requests or no SEIZED after the
    rejoin, an unaffected shard that lost 0.5 % of its requests or more."""
    out, bad = [], []
    lost_ok = total_ok = 0
    for i, ((start, answers), rows) in enumerate(zip(logs, held)):
        told, codes = {}, Counter()
        last_seized = first_fail = last_fail = recovered = None
        mig_req = mig_lost = 0
        for a in answers:
            t = start + a.ms
            told.setdefault(a.user, []).append(a.code)
            codes[a.code] += 1
            if a.code == "SEIZED":
                last_seized = t
                if last_fail is not None and recovered is None:
                    recovered = t
            elif kill_t <= t <= rejoin_t:
                first_fail = first_fail or t
                last_fail = t
                recovered = None
            if mig_start <= t <= mig_end + 1000:
                mig_req += 1
                mig_lost += a.code != "SEIZED"
        n = len(answers)
        lost = n - codes.get("SEIZED", 0)
        out.append(f"# shard {i}: {n} requests, codes {dict(codes)}, {len(rows)} rows"
                   + (" (affected)" if i in affected else ""))
        bad += _shard_faults(i, told, {u: 1 for u in rows})
        if n < 100:
            bad.append(f"shard {i}: only {n} requests")
        if last_seized is None or last_seized < rejoin_t:
            bad.append(f"shard {i}: no SEIZED after the failover")
        if i not in affected:
            lost_ok += lost
            total_ok += n
            if lost * 1000 >= 5 * n:
                bad.append(f"shard {i} (unaffected): lost {lost} of {n} requests (>= 0.5 %)")
        if i in affected and i != mig_shard and first_fail is not None and recovered is not None:
            out.append(f"# shard {i}: failures from {int(first_fail - kill_t)} ms to "
                       f"{int(last_fail - kill_t)} ms after the kill; SEIZED again "
                       f"{int(recovered - kill_t)} ms after it")
        if i == mig_shard:
            out.append(f"# shard {i}: {mig_lost} of {mig_req} requests lost during the migration")
    out.append(f"# unaffected shards lost {lost_ok} of {total_ok} requests")
    return out + ["BAD " + b for b in bad]


# --- the node journal and its system calls -------------------------------------------------

def journal_records(data, rec):
    """The whole records at the start of one journal segment's bytes DATA
    (lib/node/journal.h: a little-endian length and CRC, then activity,
    epoch, token, user, ms), each REC bytes: a list of (activity, epoch,
    token, user). Stops at the first record whose length is not REC - 8 or
    that is cut short (a torn tail)."""
    out, off = [], 0
    while off + rec <= len(data):
        length, _crc = struct.unpack_from("<II", data, off)
        if length != rec - 8:
            break
        a, e, t, u, _ms = struct.unpack_from("<qQIqq", data, off + 8)
        out.append((a, e, t, u))
        off += rec
    return out


def dir_fsynced(lines, directory):
    """In an strace of a worker (LINES), after it created a journal segment
    (an openat of a ".jnl" file with O_CREAT), it opened DIRECTORY
    (O_DIRECTORY) and fsync'd that descriptor successfully: True or False."""
    created = next((i for i, x in enumerate(lines) if '.jnl"' in x and "O_CREAT" in x), None)
    if created is None:
        return False
    fds = set()
    for x in lines[created + 1:]:
        m = re.search(r'openat\(AT_FDCWD, "%s", [^)]*O_DIRECTORY[^)]*\)\s*=\s*(\d+)'
                      % re.escape(directory), x)
        if m:
            fds.add(m.group(1))
        m = re.search(r'\bfsync\((\d+)\)\s*=\s*0', x)
        if m and m.group(1) in fds:
            return True
    return False


# --- a status answer after a write -------------------------------------------------------

def freshness(body, want, paths):
    """Read your writes: "ok" when the status answer BODY (text) shows WANT
    (the values at the dotted PATHS, space-separated); "unsure" when it
    says it could not read Redis (UNAVAILABLE, or "stale": true); otherwise
    "old[what it showed]"."""
    import json
    try:
        b = json.loads(body)
    except ValueError:
        return "old[not JSON: %r]" % body[:80]
    if b.get("code") == "UNAVAILABLE" or b.get("stale") is True:
        return "unsure"
    got = []
    for path in paths:
        v = b
        for k in path.split("."):
            v = v[int(k)] if isinstance(v, list) else v.get(k) if isinstance(v, dict) else None
        got.append("" if v is None else v if isinstance(v, str) else json.dumps(v))
    got = " ".join(got)
    return "ok" if got == want else "old[%s]" % got


# --- a soak ------------------------------------------------------------------------------

def soak_truth(answers, held):
    """The users of a long load against the coupon rows (HELD: user ->
    rows): every SEIZED holds one, a holder was told SEIZED or
    UNKNOWN_OUTCOME or lost its answer (CONNECTION_ERROR), a user told
    anything else holds none. Returns (counts, ok), counts a dict seized held
    unknown_or_lost held_of_those refused seized_not_held
    held_without_answer refused_but_held."""
    told = {}
    for a in answers:
        told.setdefault(a.code, set()).add(a.user)
    seized = told.pop("SEIZED", set())
    maybe = told.pop("UNKNOWN_OUTCOME", set()) | told.pop("CONNECTION_ERROR", set())
    refused = set().union(*told.values()) if told else set()
    h = set(held)
    c = {"seized": len(seized), "held": len(h), "unknown_or_lost": len(maybe),
         "held_of_those": len(h & maybe), "refused": len(refused),
         "seized_not_held": len(seized - h), "held_without_answer": len(h - seized - maybe),
         "refused_but_held": len(refused & h)}
    return c, not (c["seized_not_held"] or c["held_without_answer"] or c["refused_but_held"])
