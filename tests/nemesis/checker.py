"""checker.py - judges a nemesis run from its history and the stores alone.

check(history, stores) -> (anomalies, stats). history: the client's records
(see client.py). stores: what Redis and MySQL hold after heal and drain, as
read_stores() reads it:
  {"lease_ms": 3000, "drained": true,
   "sales": {"101": {"role": "sellout", "total": 40, "start_ms": .., "end_ms": ..,
                      "status": 2, "stock": 0, "held": 0,
                      "seize_list": [users], "rows": [[user, status, seized_ms], ..]}}}
Each anomaly is {"kind": ..., "sale": A, "user": U (when about one), "msg": ...}.

The rules one user's answers keep against the coupons that user holds are
user_faults(); the integration tests judge a loadgen log by them too
(judge_log(), and `checker.py loadgen LOG` for the shell: tests/lib.sh's
seize_judge and seize_judge_all), so one tested judge decides per user.
The tests' other judges of logs, journals and traces (upgrade windows, a
Redis outage, sharded loads, journal records) are loadlog.py's, each a
subcommand of main() (checker.py -h), unit-tested in test_checker.py.
"""
import json
import os
import subprocess
import sys

# Answers that leave the outcome open (see client.py), and answers that
# promise nothing was granted.
INDETERMINATE = {"UNKNOWN_OUTCOME", "TIMEOUT", "RESET"}
GRANTS = {"SEIZED"}
SLACK_MS = 1000


def _open(code):
    return code in INDETERMINATE or code.startswith("HTTP_")


def user_faults(codes, n, is_open=_open):
    """What is wrong with one user's answers CODES (every answer to that
    user for one sale) when the user holds N coupons of it: a list of
    kinds, empty when nothing is. double: holds two or more; lost: told
    SEIZED (or ALREADY_SEIZED) and holds none; false-negative: holds one
    but was told neither SEIZED nor an answer that leaves the outcome open
    (IS_OPEN)."""
    faults = []
    if n > 1:
        faults.append("double")
    granted = any(c in GRANTS for c in codes)
    if n == 0 and (granted or "ALREADY_SEIZED" in codes):
        faults.append("lost")
    if n >= 1 and not granted and not any(is_open(c) for c in codes):
        faults.append("false-negative")
    return faults


def check(history, stores):
    anomalies = []

    def bad(kind, sale, user, msg):
        a = {"kind": kind, "sale": sale, "msg": msg}
        if user is not None:
            a["user"] = user
        anomalies.append(a)

    seizes = [h for h in history if h.get("type") == "seize"]
    by_pair = {}
    for h in seizes:
        by_pair.setdefault((h["user"], h["sale"]), []).append(h)
    by_sale = {}
    for h in seizes:
        by_sale.setdefault(h["sale"], []).append(h)
    status = {}
    for h in history:
        if h.get("type") == "status" and h.get("seized") is not None and not h.get("stale"):
            status.setdefault((h["user"], h["sale"]), []).append(h)

    if not stores.get("drained", True):
        bad("not-drained", None, None, "queues or journals still held entries after the drain "
            "deadline: %s" % stores.get("drain_note", ""))

    lease = stores.get("lease_ms", 10000)
    for sid, s in sorted(stores["sales"].items()):
        sale = int(sid)
        rows = s["rows"]
        held = {}
        for user, st, at in rows:
            held.setdefault(user, []).append((st, at))
        total = s["total"]
        # --- per user ------------------------------------------------------
        users = set(held) | {u for (u, a) in by_pair if a == sale}
        for user in sorted(users):
            ops = by_pair.get((user, sale), [])
            n = len(held.get(user, []))
            codes = [o["code"] for o in ops]
            if n > 1:  # user_faults() says "double" too; the message names the count
                bad("double", sale, user, "holds %d coupons of sale %d" % (n, sale))
            granted = [o for o in ops if o["code"] in GRANTS]
            faults = user_faults(codes, n)
            if "lost" in faults and granted:
                bad("lost", sale, user, "told SEIZED (node %d, sent %d) and holds no coupon"
                    % (granted[0]["node"], granted[0]["t0"]))
            elif "lost" in faults:
                bad("lost", sale, user, "told ALREADY_SEIZED and holds no coupon")
            if "false-negative" in faults:
                bad("false-negative", sale, user, "holds a coupon but was only told %s"
                    % ",".join(sorted(set(codes))) if codes else "holds a coupon it never asked for")
            if any(_open(c) for c in codes):
                answers = status.get((user, sale), [])
                if not answers:
                    bad("unsettled", sale, user, "outcome open (%s) and status?id never answered"
                        % ",".join(sorted(set(c for c in codes if _open(c)))))
                for a in answers:
                    if bool(a["seized"]) != (n >= 1) or a.get("pending"):
                        bad("unsettled", sale, user, "status?id on node %d says seized=%s%s, "
                            "MySQL holds %d" % (a["node"], a["seized"],
                                                " (pending)" if a.get("pending") else "", n))
        # --- per sale ------------------------------------------------------
        # A final SOLD_OUT (stock 0, no reserve open) is final: nobody who
        # asks after it was answered is granted one.
        finals = [o["t1"] for o in by_sale.get(sale, []) if o["code"] == "SOLD_OUT"
                  and o.get("final", True)]
        if finals:
            after = [o for o in by_sale.get(sale, []) if o["code"] in GRANTS and o["t0"] > min(finals)]
            if after:
                bad("sold-after-sold-out", sale, after[0]["user"], "%d SEIZED answers to seizes sent "
                    "after a final SOLD_OUT was answered (at %d; first: node %d, sent %d)"
                    % (len(after), min(finals), after[0]["node"], after[0]["t0"]))
        if len(rows) > total:
            bad("oversell", sale, None, "%d coupons of a total of %d" % (len(rows), total))
        if s["role"] != "revoked":
            stock = s["stock"] if s["stock"] is not None else 0
            if stock + s["held"] + len(rows) != total:
                bad("unbalanced", sale, None, "stock %d + reserves %d + coupons %d != total %d"
                    % (stock, s["held"], len(rows), total))
        listed = set(s.get("seize_list") or [])
        if s.get("seize_list") is not None and listed != set(held):
            bad("stores-disagree", sale, None, "seize list has %d users, MySQL %d (only in the "
                "list: %s; only in MySQL: %s)" % (len(listed), len(held),
                                                  sorted(listed - set(held))[:5],
                                                  sorted(set(held) - listed)[:5]))
        if s["role"] == "revoked":
            acks = [h["t1"] for h in history if h.get("type") == "admin" and h.get("op") == "revoke"
                    and h.get("sale") == sale and h.get("http") == 200]
            if acks:
                cut = acks[0] + lease + SLACK_MS
                late = [o for o in seizes if o["sale"] == sale and o["code"] in GRANTS and o["t0"] > cut]
                if late:
                    bad("sold-after-revoke", sale, late[0]["user"], "%d SEIZED answers sent more than "
                        "the lease after the revoke was answered (first: node %d at %d, revoke %d)"
                        % (len(late), late[0]["node"], late[0]["t0"], acks[0]))
                late = [r for r in rows if r[2] > cut]
                if late:
                    bad("sold-after-revoke", sale, late[0][0], "%d coupons seized after the revoke "
                        "(first at %d, revoke %d)" % (len(late), late[0][2], acks[0]))
                live = [r for r in rows if r[1] != 4]
                if live:
                    bad("revoked-unvoided", sale, live[0][0], "%d coupons of the revoked sale are "
                        "not voided" % len(live))
        if s.get("start_ms") and s.get("end_ms") and s["role"] == "window":
            lo, hi = s["start_ms"] - SLACK_MS, s["end_ms"] + SLACK_MS
            out = [o for o in seizes if o["sale"] == sale and o["code"] in GRANTS
                   and (o["t0"] > hi or o["t1"] < lo)]
            if out:
                bad("sold-outside-window", sale, out[0]["user"], "%d SEIZED answers outside the "
                    "window [%d, %d] (first sent %d)" % (len(out), s["start_ms"], s["end_ms"], out[0]["t0"]))
            out = [r for r in rows if not lo <= r[2] <= hi]
            if out:
                bad("sold-outside-window", sale, out[0][0], "%d coupons seized outside the window "
                    "[%d, %d] (first at %d)" % (len(out), s["start_ms"], s["end_ms"], out[0][2]))
    return anomalies, stats(history)


def stats(history, sale=102):
    """The answer mix, and the longest stretch in which the sale that never
    sells out granted nothing (between two SEIZED answers), with the faults
    that were active across it."""
    seizes = [h for h in history if h.get("type") == "seize"]
    mix = {}
    for h in seizes:
        mix[h["code"]] = mix.get(h["code"], 0) + 1
    out = {"seizes": len(seizes), "mix": mix}
    times = sorted(h["t1"] for h in seizes if h["sale"] == sale and h["code"] in GRANTS)
    if len(times) >= 2:
        gap, a, b = max((times[i + 1] - times[i], times[i], times[i + 1])
                        for i in range(len(times) - 1))
        active = {}
        for h in history:
            if h.get("type") == "nemesis":
                active.setdefault(h["idx"], [h["f"] + " " + h["target"], None, None])
                active[h["idx"]][1 if h["phase"] == "start" else 2] = h["t0"]
        # A fault with a duration spans [start, stop]; a kill of a worker or
        # a keeper is an instant.
        during = sorted(f for f, t0, t1 in active.values()
                        if t0 is not None and t0 <= b and (t1 if t1 is not None else t0) >= a)
        out["longest_no_sale"] = {"sale": sale, "ms": gap, "from": a, "to": b, "faults": during}
    stops = stopped_worker_answers(history)
    if stops:
        out["stopped_worker"] = stops
    return out


def stopped_worker_answers(history):
    """What a stopped worker cost its node: the answers to seizes sent to
    that node while one of its workers was stopped (stop-worker), by code,
    and the slowest of them (ms); None without such a fault."""
    spans = {}
    for h in history:
        if h.get("type") == "nemesis" and h["f"] == "stop-worker" and not h.get("error"):
            sp = spans.setdefault(h["idx"], [int(h["target"][4:]), None, None])
            sp[1 if h["phase"] == "start" else 2] = h["t1"] if h["phase"] == "start" else h["t0"]
    spans = [sp for sp in spans.values() if sp[1] is not None and sp[2] is not None]
    if not spans:
        return None
    codes, slowest, n = {}, 0, 0
    for h in history:
        if h.get("type") != "seize":
            continue
        if any(node == h["node"] and a <= h["t0"] <= b for node, a, b in spans):
            n += 1
            codes[h["code"]] = codes.get(h["code"], 0) + 1
            slowest = max(slowest, h["t1"] - h["t0"])
    return {"faults": len(spans), "seizes": n, "codes": codes, "slowest_ms": slowest}


# --- reading the stores ---------------------------------------------------------

def _run(args, inp=None):
    r = subprocess.run(args, input=inp, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError("%s failed: %s" % (args[0], r.stderr.strip()))
    return r.stdout


def mysql(env, sql, root=False):
    """Runs sql as the application's user, or as the stack's root (root=True)
    for what goes beyond the application's grant."""
    who = ["-uroot"] if root else ["-u" + env["MYSQL_USER"], "-p" + env["MYSQL_PASSWORD"]]
    out = _run(["mariadb", "--no-defaults", "--host=localhost", "--socket=" + env["MYSQL_SOCKET"]]
               + who + ["-N", "-B", env["MYSQL_DATABASE"], "-e", sql])
    return [line.split("\t") for line in out.splitlines() if line]


def redis(env, *args):
    hp = env["REDIS_NODES"].replace("\\", "").split(",")[0]
    host, port = hp.rsplit(":", 1)
    return _run(["redis-cli", "-c", "-h", host, "-p", port] + [str(a) for a in args])


BALANCE_LUA = ("return {redis.call('HGET', KEYS[1], ARGV[1]) or '', "
               "redis.call('HGET', KEYS[2], ARGV[1] .. ':held') or '0'}")


def sale_keys(sale):
    """The Redis keys of sale as `couponseize-admin keys` spells them with the
    daemons' own builders (lib/keys.c): name -> key."""
    top = os.environ.get("top_builddir") or os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                         "..", "..")
    admin = os.path.join(top, "couponseize-admin")
    return {name: k for name, k, *_ in
            (line.split() for line in _run([admin, "keys", str(sale)]).splitlines())}


def read_stores(env, roles, lease_ms):
    """The stores after the drain: for each sale of roles (id -> role) its
    MySQL activity and coupons and its Redis stock, reserves and seize list."""
    out = {"lease_ms": lease_ms, "sales": {}}
    for sale, role in sorted(roles.items()):
        k = sale_keys(sale)
        a = mysql(env, "SELECT total_num, status, UNIX_TIMESTAMP(distribute_start_time) * 1000, "
                  "UNIX_TIMESTAMP(distribute_end_time) * 1000 FROM activity WHERE id = %d" % sale)[0]
        rows = mysql(env, "SELECT user_id, status, ROUND(UNIX_TIMESTAMP(seized_at) * 1000) FROM coupon "
                     "WHERE activity_id = %d ORDER BY seized_at" % sale)
        st, held = redis(env, "EVAL", BALANCE_LUA, 2, k["stock"], k["reserve"],
                         sale).split("\n")[:2]
        listed = redis(env, "HKEYS", k["seized"]).split()
        out["sales"][str(sale)] = {
            "role": role, "total": int(a[0]), "status": int(a[1]),
            "start_ms": int(float(a[2])), "end_ms": int(float(a[3])),
            "stock": int(st) if st.strip() else None, "held": int(held or 0),
            "seize_list": [int(u) for u in listed],
            "rows": [[int(u), int(s), int(float(t))] for u, s, t in rows],
        }
    return out


def load_history(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]



# --- a loadgen log, for the integration tests -------------------------------------

def _no_answer(code):
    """A load whose workers are killed: a 5xx without a code of ours or a
    dropped connection tells the user nothing either way."""
    return code.startswith("HTTP_5") or code == "CONNECTION_ERROR"


def judge_log(path, rows, kills=False):
    """Judges the answers of a loadgen -L log (a header line, then one
    "ms status code user us" line per answer) per user with user_faults(),
    against ROWS (the user of every coupon row of the sale, a user once per
    coupon). Without KILLS every user of ROWS is judged, asked or not, and
    only UNKNOWN_OUTCOME leaves an outcome open; with KILLS only the users
    of the log are, and an answer without a code of ours (_no_answer) leaves
    it open too. Counts are of each user's last answer. Returns a dict:
    seized unknown unavailable sold_out already no_answer (users), answers,
    users, p99_ms max_ms, bad_seized (told SEIZED or ALREADY_SEIZED, holds
    none), bad_holders (holds one, told nothing that allows it), doubles."""
    told, lat = {}, []
    with open(path) as f:
        f.readline()
        for line in f:
            _ms, _status, code, user, us = line.split()
            told.setdefault(int(user), []).append(code)
            lat.append(int(us))
    held = {}
    for u in rows:
        held[u] = held.get(u, 0) + 1
    is_open = (lambda c: c in INDETERMINATE or _no_answer(c)) if kills else (
        lambda c: c == "UNKNOWN_OUTCOME")
    users = set(told) if kills else set(told) | set(held)
    out = {"bad_seized": 0, "bad_holders": 0, "doubles": 0}
    for u in users:
        faults = user_faults(told.get(u, []), held.get(u, 0), is_open)
        out["bad_seized"] += "lost" in faults
        out["bad_holders"] += "false-negative" in faults
        out["doubles"] += "double" in faults
    last = [c[-1] for c in told.values()]
    for key, code in (("seized", "SEIZED"), ("unknown", "UNKNOWN_OUTCOME"),
                      ("unavailable", "UNAVAILABLE"), ("sold_out", "SOLD_OUT"),
                      ("already", "ALREADY_SEIZED")):
        out[key] = last.count(code)
    out["no_answer"] = sum(1 for c in last if _no_answer(c))
    lat.sort()
    out["p99_ms"] = lat[int(len(lat) * 0.99)] // 1000 if lat else -1
    out["max_ms"] = lat[-1] // 1000 if lat else -1
    out["answers"], out["users"] = len(lat), len(told)
    return out


def _check_run(a):
    """HISTORY STORES: check() of a nemesis run; prints each anomaly as JSON
    and a verdict line; exit 1 on an anomaly."""
    hist = load_history(a.history)
    with open(a.stores) as f:
        st = json.load(f)
    an, s = check(hist, st)
    for x in an:
        print(json.dumps(x))
    print("%s: %d anomalies, %d seizes" % ("INVALID" if an else "VALID", len(an), s["seizes"]))
    return 1 if an else 0


def _loadgen(a):
    """LOG [--kills] [--window T0 T1] FIELD...: judge_log() of LOG against
    the coupon rows' users on stdin (whitespace separated, a user once per
    coupon); prints the FIELDs asked for on one line. --window T0 T1 adds the fields window_p99_us and
    window_answers: the answers to seizes sent between T0 and T1 (epoch ms)."""
    import loadlog
    r = judge_log(a.log, [int(x) for x in sys.stdin.read().split()], a.kills)
    if a.window:
        start, answers = loadlog.read_log(a.log)
        r["window_p99_us"], r["window_answers"] = loadlog.window_latency(start, answers, *a.window)
    print(" ".join(str(r[f]) for f in a.fields))


def _windows(a):
    """LOG WINDOWS: the answers of LOG inside each upgrade window (WINDOWS:
    lines "NAME T0 T1", epoch ms), a line per window after one for those
    before (loadlog.upgrade_windows)."""
    import loadlog
    start, answers = loadlog.read_log(a.log)
    print("\n".join(loadlog.upgrade_windows(start, answers, loadlog.parse_windows(a.windows))))


def _node_windows(a):
    """WINDOWS LOG...: per upgrade window, each node's answers in it, a node
    a LOG (loadlog.node_windows)."""
    import loadlog
    logs = [loadlog.read_log(p) for p in a.logs]
    print("\n".join(loadlog.node_windows(logs, loadlog.parse_windows(a.windows))))


def _outage(a):
    """LOG T_STOP T_START T_READY: prints "bad_during first_ok_after
    non503_5xx conn_err p99_503_us n503 seized" (loadlog.outage)."""
    import loadlog
    start, answers = loadlog.read_log(a.log)
    print(*loadlog.outage(start, answers, a.t_stop, a.t_start, a.t_ready))


def _seized_held(a):
    """LOG: told SEIZED against the coupon rows' users on stdin; prints
    "lost extra dups" (loadlog.seized_held)."""
    import loadlog
    print(*loadlog.seized_held(loadlog.read_log(a.log)[1], loadlog.read_users(sys.stdin.read())))


def _strict(a):
    """ROWS LOG...: ROWS "user count" lines; prints how many users break
    "told SEIZED: exactly one coupon; a coupon: told SEIZED", then the
    first ten of them (loadlog.strict_holders)."""
    import loadlog
    held = {}
    with open(a.rows) as f:
        for line in f:
            u, n = line.split()
            held[int(u)] = int(n)
    answers = [x for p in a.logs for x in loadlog.read_log(p)[1]]
    bad = loadlog.strict_holders(answers, held)
    print(len(bad), *bad[:10])


def _late_grants(a):
    """LOG: prints how many seizes sent after the first SOLD_OUT answer were
    told SEIZED (loadlog.late_grants)."""
    import loadlog
    print(loadlog.late_grants(loadlog.read_log(a.log)[1]))


def _misjudged(a):
    """TAG LOG...: the "user code" lines of the LOGs against the coupon
    rows' users on stdin (loadlog.told_holds); writes "# TAG user U was told
    CODE and holds N" to stderr for each that is wrong, and prints how many."""
    import loadlog
    bad = loadlog.misjudged(loadlog.read_told(a.logs), loadlog.read_users(sys.stdin.read()))
    for u, code, n in bad:
        sys.stderr.write("# %s user %d was told %s and holds %d\n" % (a.tag, u, code, n))
    print(len(bad))


def _books(a):
    """LOGS PHASE PHASES: the loads of PHASES (space-separated) against the
    coupon rows, per shard: LOGS/PH.I.log the answers of shard I (0-9) in
    phase PH, LOGS/rows.I its rows' users; prints "# ..." and "BAD ..."
    lines (loadlog.books)."""
    import loadlog
    logs = {ph: [loadlog.read_log("%s/%s.%d.log" % (a.logs, ph, i))[1] for i in range(10)]
            for ph in a.phases.split()}
    held = []
    for i in range(10):
        with open("%s/rows.%d" % (a.logs, i)) as f:
            held.append(loadlog.read_users(f.read()))
    print("\n".join(loadlog.books(a.phase, logs, held)))


def _pauses(a):
    """LOGS PHASE T0 T1 SHARDS: per shard of SHARDS (space-separated),
    "shard I GAP RESUMED INSIDE" of LOGS/PHASE.I.log (loadlog.pauses)."""
    import loadlog
    for i in map(int, a.shards.split()):
        start, answers = loadlog.read_log("%s/%s.%d.log" % (a.logs, a.phase, i))
        print("shard %d %d %d %d" % ((i,) + loadlog.pauses(start, answers, a.t0, a.t1)))


def _cluster(a):
    """LOGS AFFECTED KILL_T REJOIN_T MIG_START MIG_END MIG_SHARD: the
    cluster load of LOGS/I.log against LOGS/I.rows, shards 0-9; prints "#
    ..." and "BAD ..." lines (loadlog.cluster_report)."""
    import loadlog
    logs, held = [], []
    for i in range(10):
        logs.append(loadlog.read_log("%s/%d.log" % (a.logs, i)))
        with open("%s/%d.rows" % (a.logs, i)) as f:
            held.append(loadlog.read_users(f.read()))
    print("\n".join(loadlog.cluster_report(logs, held, {int(x) for x in a.affected.split()},
                                           a.kill_t, a.rejoin_t, a.mig_start, a.mig_end,
                                           a.mig_shard)))


def _journal(a):
    """REC FILE...: the whole records of journal segment FILEs of REC bytes
    a record, one "activity epoch token user" a line (loadlog.journal_records)."""
    import loadlog
    for p in a.files:
        with open(p, "rb") as f:
            for r in loadlog.journal_records(f.read(), a.rec):
                print(*r)


def _dir_fsynced(a):
    """STRACE DIR: exit 0 when the strace shows DIR fsync'd after a segment's
    creation, 1 when not (loadlog.dir_fsynced)."""
    import loadlog
    with open(a.strace) as f:
        return 0 if loadlog.dir_fsynced(f.read().splitlines(), a.dir) else 1


def _fresh(a):
    """BODY WANT PATH...: prints ok, unsure or old[...] (loadlog.freshness)."""
    import loadlog
    print(loadlog.freshness(a.body, a.want, a.paths))


def _soak(a):
    """ROWS LOG...: ROWS "activity user" lines of coupons; prints the counts
    "seized=N held=N ..." and exits 1 when a user does not hold what the
    answers allow (loadlog.soak_truth)."""
    import loadlog
    with open(a.rows) as f:
        held = loadlog.read_users(" ".join(line.split()[1] for line in f if line.strip()))
    c, ok = loadlog.soak_truth([x for p in a.logs for x in loadlog.read_log(p)[1]], held)
    print("seized=%(seized)d held=%(held)d unknown_or_lost=%(unknown_or_lost)d "
          "held_of_those=%(held_of_those)d refused=%(refused)d seized_not_held=%(seized_not_held)d "
          "held_without_answer=%(held_without_answer)d refused_but_held=%(refused_but_held)d" % c)
    return 0 if ok else 1


def main(argv):
    """checker.py HISTORY STORES: check() of a nemesis run. checker.py
    SUBCOMMAND ARGS: a judge of the integration tests (checker.py -h lists
    them; most are loadlog.py's)."""
    import argparse
    p = argparse.ArgumentParser(prog="checker.py", description=main.__doc__)
    sub = p.add_subparsers(dest="cmd", metavar="SUBCOMMAND")
    num = {"type": int}

    def add(name, fn, *args):
        text = " ".join(fn.__doc__.split())
        sp = sub.add_parser(name, help=text.split(". ")[0], description=fn.__doc__)
        for arg in args:
            names, kw = (arg, {}) if isinstance(arg, str) else arg
            sp.add_argument(*(names if isinstance(names, tuple) else (names,)), **kw)
        sp.set_defaults(fn=fn)
    add("run", _check_run, "history", "stores")
    add("loadgen", _loadgen, "log", ("--kills", {"action": "store_true"}),
        ("--window", {"nargs": 2, "type": int, "metavar": ("T0", "T1")}), ("fields", {"nargs": "+"}))
    add("windows", _windows, "log", "windows")
    add("node-windows", _node_windows, "windows", ("logs", {"nargs": "+"}))
    add("outage", _outage, "log", ("t_stop", num), ("t_start", num), ("t_ready", num))
    add("seized-held", _seized_held, "log")
    add("strict", _strict, "rows", ("logs", {"nargs": "+"}))
    add("late-grants", _late_grants, "log")
    add("misjudged", _misjudged, "tag", ("logs", {"nargs": "+"}))
    add("books", _books, "logs", "phase", "phases")
    add("pauses", _pauses, "logs", "phase", ("t0", num), ("t1", num), "shards")
    add("cluster", _cluster, "logs", "affected", ("kill_t", num), ("rejoin_t", num),
        ("mig_start", num), ("mig_end", num), ("mig_shard", num))
    add("journal", _journal, ("rec", num), ("files", {"nargs": "+"}))
    add("dir-fsynced", _dir_fsynced, "strace", "dir")
    add("fresh", _fresh, "body", "want", ("paths", {"nargs": "*"}))
    add("soak", _soak, "rows", ("logs", {"nargs": "+"}))
    args = argv[1:]
    if len(args) == 2 and args[0] not in sub.choices:
        args = ["run"] + args
    a = p.parse_args(args)
    if a.cmd is None:
        p.print_usage(sys.stderr)
        return 2
    return a.fn(a) or 0


if __name__ == "__main__":
    sys.dont_write_bytecode = True  # the source tree may be read-only (distcheck)
    sys.exit(main(sys.argv))
