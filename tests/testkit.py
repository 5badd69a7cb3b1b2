#!/usr/bin/env python3
"""testkit.py - the shell tests' helpers that need more than the shell.

    python3 "$top_srcdir/tests/testkit.py" SUBCOMMAND ARGS...

Each subcommand is a function cmd_NAME below (NAME with "_" for "-") whose
docstring says what it does and what it prints; the shell parses that
output, so its format is part of the contract. Servers (the proxies, the
listeners) run until killed. Nothing here judges answers: that is
tests/nemesis/checker.py's. Standard library only; a module is imported
where it is used, since json_get (tests/lib.sh) starts this for a test's
every answer that is not a flat object.
"""
import argparse
import json
import sys


# --- JSON -----------------------------------------------------------------------------

def _show(v):
    """A value as the shell wants it: strings unquoted, the rest as JSON."""
    print(v if isinstance(v, str) else json.dumps(v))


def _at(v, path):
    """The value at a dotted PATH of V (list indexes as numbers); None when
    a step finds no mapping. An index past a list's end raises IndexError."""
    for k in path.split(".") if path else []:
        v = v[int(k)] if isinstance(v, list) else v.get(k) if isinstance(v, dict) else None
    return v


def cmd_json_get(a):
    """json-get JSON KEY: prints the value of top-level KEY (strings
    unquoted, everything else as JSON); nothing when absent or null."""
    v = json.loads(a.json).get(a.key)
    if v is not None:
        _show(v)


def cmd_jat(a):
    """jat JSON PATH: prints the value at the dotted PATH (a.b.0.c, list
    indexes as numbers), strings unquoted, the rest as JSON; nothing when
    absent (exit 1 when an index is past a list's end)."""
    v = _at(json.loads(a.json), a.path)
    if v is not None:
        _show(v)


def cmd_json_pluck(a):
    """json-pluck [--sep S] JSON PATH FIELD: prints FIELD of each element of
    the list at PATH, joined by S (a space by default); an empty line when
    the list is empty or absent. Exit 1 (nothing printed) when JSON is not
    JSON or an element is not an object with FIELD."""
    try:
        items = _at(json.loads(a.json), a.path) or []
        out = a.sep.join(v if isinstance(v, str) else json.dumps(v)
                         for v in (x[a.field] for x in items))
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return 1
    print(out)


def cmd_json_len(a):
    """json-len JSON PATH: prints the length of the list (or object) at PATH."""
    print(len(_at(json.loads(a.json), a.path)))


def cmd_json_find(a):
    """json-find JSON PATH KEY VALUE FIELD...: in the list at PATH, the
    first element whose KEY is VALUE (compared as a string): prints its
    FIELDs as JSON, space-separated (true/false, numbers, strings quoted).
    Nothing, and exit 1, when no element matches."""
    for x in _at(json.loads(a.json), a.path) or []:
        if isinstance(x, dict) and str(x.get(a.key)) == a.value:
            print(" ".join(json.dumps(x.get(f)) for f in a.fields))
            return 0
    return 1


def cmd_jsonl_find(a):
    """jsonl-find FILE KEY VALUE FIELD: FIELD (strings unquoted) of every
    line of the JSON-lines FILE whose KEY is VALUE, one a line."""
    with open(a.file) as f:
        for line in f:
            e = json.loads(line)
            if e.get(a.key) == a.value:
                _show(e[a.field])


def cmd_json_max(a):
    """json-max FILE PATH FIELD: the largest FIELD (null as 0) among the
    values of the object (or list) at PATH of the JSON file FILE; 0 when it
    is empty or absent."""
    with open(a.file) as f:
        v = _at(json.load(f), a.path) or {}
    vals = v.values() if isinstance(v, dict) else v
    print(max([x[a.field] or 0 for x in vals] or [0]))


def cmd_load_codes(a):
    """load-codes FILE: a loadgen -j summary FILE's answers as Python prints
    them: "{'SEIZED': n, ...} by status {'200': n, ...}"."""
    with open(a.file) as f:
        d = json.load(f)
    print(d["codes"], "by status", d["status"])


# --- tokens ---------------------------------------------------------------------------

def cmd_jwt_sign(a):
    """jwt-sign KEY INPUT: the HS256 signature of INPUT ("header.payload")
    with KEY, base64url without padding."""
    import base64
    import hashlib
    import hmac
    d = hmac.new(a.key.encode(), a.input.encode(), hashlib.sha256).digest()
    print(base64.urlsafe_b64encode(d).decode().rstrip("="))


def cmd_jwt_payload(a):
    """jwt-payload [--sorted] TOKEN: the payload of the JWT TOKEN, as it is
    (the decoded bytes), or with --sorted parsed and printed again as JSON
    with its keys sorted ("key": value)."""
    import base64
    p = a.token.split(".")[1]
    raw = base64.urlsafe_b64decode(p + "=" * (-len(p) % 4))
    print(json.dumps(json.loads(raw), sort_keys=True) if a.sorted else raw.decode())


# --- ports and sockets ----------------------------------------------------------------

def cmd_free_port(a):
    """free-port: prints a loopback port nothing listens on now (the
    kernel's pick)."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    print(s.getsockname()[1])


def cmd_port_free(a):
    """port-free PORT: exit 0 when a socket can bind 127.0.0.1:PORT now, 1
    when not; prints nothing."""
    import socket
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", a.port))
    except OSError:
        return 1
    return 0


def cmd_redis_proxy(a):
    """redis-proxy LPORT RPORT: a TCP proxy on 127.0.0.1:LPORT to
    127.0.0.1:RPORT (the stack's Redis), every byte passed both ways; a
    connection whose upstream cannot be reached is closed. Runs until
    killed (which drops every connection through it at once); prints
    nothing."""
    import asyncio

    async def pipe(r, w):
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            w.close()

    async def client(cr, cw):
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", a.rport)
        except OSError:
            cw.close()
            return
        await asyncio.gather(pipe(cr, uw), pipe(ur, cw))

    async def main():
        srv = await asyncio.start_server(client, "127.0.0.1", a.lport)
        async with srv:
            await srv.serve_forever()
    asyncio.run(main())


def cmd_lossy_proxy(a):
    """lossy-proxy [--seed S] [--one-in N] LPORT RPORT: a TCP proxy on
    127.0.0.1:LPORT to Redis on 127.0.0.1:RPORT that drops about one in N
    (15) replies to a script (a chunk from Redis opening with "*" or ":")
    and cuts that connection, as a network that fails after Redis ran the
    command; random.seed(S) (33). A thread per direction and connection;
    runs until killed; prints nothing."""
    import random
    import socket
    import threading
    random.seed(a.seed)

    def pipe(src, dst, cut):
        try:
            while True:
                b = src.recv(65536)
                if not b:
                    break
                if cut and b[:1] in (b"*", b":") and random.random() < 1 / a.one_in:
                    break
                dst.sendall(b)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def serve(c):
        r = socket.create_connection(("127.0.0.1", a.rport))
        threading.Thread(target=pipe, args=(c, r, False), daemon=True).start()
        pipe(r, c, True)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", a.lport))
    listener.listen(128)
    while True:
        c, _ = listener.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()


def cmd_notify_listen(a):
    """notify-listen SOCK LOG: a stand-in for systemd's notification socket:
    a unix datagram socket bound at SOCK that appends "PID MESSAGE" to LOG
    for every datagram (line-buffered), PID the sender's from its
    credentials ("?" without them), newlines of MESSAGE as "|". Runs until
    killed."""
    import socket
    import struct
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    s.bind(a.sock)
    with open(a.log, "a", buffering=1) as out:
        while True:
            msg, anc, _, _ = s.recvmsg(4096, socket.CMSG_SPACE(12))
            pid = [struct.unpack("iii", d[:12])[0] for lvl, typ, d in anc
                   if lvl == socket.SOL_SOCKET and typ == socket.SCM_CREDENTIALS]
            out.write("%s %s\n" % (pid[0] if pid else "?", msg.decode().replace("\n", "|")))


def cmd_mute_fcgi(a):
    """mute-fcgi SOCK LOG: a FastCGI server on the unix socket SOCK that
    reads each request up to its empty FCGI_STDIN record and closes the
    connection without an answer, appending the request's
    HTTP_IDEMPOTENCY_KEY (32 hex digits, or "none") to LOG. Runs until
    killed."""
    import re
    import socket
    s = socket.socket(socket.AF_UNIX)
    s.bind(a.sock)
    s.listen(8)
    while True:
        c, _ = s.accept()
        data = b""
        while b"\x05\x00\x01\x00\x00" not in data:  # the empty FCGI_STDIN record ends it
            d = c.recv(65536)
            if not d:
                break
            data += d
        m = re.search(rb"HTTP_IDEMPOTENCY_KEY([0-9a-f]{32})", data)
        with open(a.log, "a") as f:
            f.write((m.group(1).decode() if m else "none") + "\n")
        c.close()


def cmd_unix_silent(a):
    """unix-silent SOCK INOFILE [SECONDS]: connects to the unix socket SOCK,
    writes the inode of its end to INOFILE (atomically, through
    INOFILE.tmp), then sends nothing for SECONDS (20) and exits."""
    import os
    import socket
    import time
    s = socket.socket(socket.AF_UNIX)
    s.connect(a.sock)
    with open(a.inofile + ".tmp", "w") as f:
        f.write("%d\n" % os.fstat(s.fileno()).st_ino)
    os.rename(a.inofile + ".tmp", a.inofile)
    time.sleep(a.seconds)


def cmd_raw_request(a):
    """raw-request PORT SECONDS REQUEST: sends REQUEST (backslash escapes as
    printf's: \\r\\n) on a new connection to 127.0.0.1:PORT, then nothing;
    prints what came back (latin-1) before the peer closed or SECONDS of
    silence passed."""
    import socket
    s = socket.create_connection(("127.0.0.1", a.port))
    s.sendall(a.request.encode().decode("unicode_escape").encode("latin-1"))
    s.settimeout(a.seconds)
    data = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            data += d
    except OSError:
        pass
    sys.stdout.write(data.decode("latin-1"))


# --- HTTP clients -----------------------------------------------------------------------

def _token(key, sub, claims=None):
    """An HS256 JWT for user SUB, expiring in an hour (claims as json.dumps
    writes them: {"sub": "7", "exp": ...})."""
    import base64
    import hashlib
    import hmac
    import time

    def b64(b):
        return base64.urlsafe_b64encode(b).decode().rstrip("=")
    h = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    p = b64(json.dumps(claims or {"sub": str(sub), "exp": int(time.time()) + 3600}).encode())
    return h + "." + p + "." + b64(hmac.new(key, (h + "." + p).encode(), hashlib.sha256).digest())


def cmd_shard_sample(a):
    """shard-sample URL SECRET BASE: for each shard s of 0-9, activity
    BASE + 2011 s: seize it twice and ask its status as user 7, in one
    process (starting one per request is slow here). Prints, space
    separated, "[ID: (answers)]" for each activity whose answers are not
    SEIZED remaining 4, ALREADY_SEIZED, status IN_PROGRESS remaining 4,
    mine.seized, not stale; an empty line when all are."""
    import urllib.error
    import urllib.request
    key = a.secret.encode()

    def req(path, body=None, sub=None):
        r = urllib.request.Request(a.url + path, data=body and body.encode(),
                                   headers={"Content-Type": "application/json"})
        if sub:
            r.add_header("Authorization", "Bearer " + _token(key, sub))
        try:
            return json.load(urllib.request.urlopen(r, timeout=30))
        except urllib.error.HTTPError as e:
            return json.load(e)
    bad = []
    for s in range(10):
        i = a.base + 2011 * s  # i % 10 == s
        x = req("/market/consumer/coupon/seize", '{"id":%d}' % i, 7)
        y = req("/market/consumer/coupon/seize", '{"id":%d}' % i, 7)
        st = req("/market/consumer/coupon/status?id=%d" % i, None, 7)
        got = (x["code"], x.get("remaining"), y["code"], st["activity"]["status"],
               st["activity"]["remaining"], st["mine"]["seized"], st["stale"])
        if got != ("SEIZED", 4, "ALREADY_SEIZED", "IN_PROGRESS", 4, True, False):
            bad.append("[%d: %s]" % (i, got))
    print(" ".join(bad))


def cmd_walk_pages(a):
    """walk-pages URL PAGES: reads pages 1..PAGES of 200 of the status list
    at URL; prints how many distinct activity ids they showed."""
    import urllib.request
    seen = set()
    for p in range(1, a.pages + 1):
        url = "%s/market/consumer/coupon/status?page=%d&size=200" % (a.url, p)
        seen.update(x["id"] for x in json.load(urllib.request.urlopen(url, timeout=30))["activities"])
    print(len(seen))


def cmd_paced(a):
    """paced PORT PATH ACTIVITY USERBASE RATE SECONDS LOG SECRET [GO]: RATE
    seizes a second of ACTIVITY at 127.0.0.1:PORT PATH for SECONDS (SIGTERM
    ends it early), user USERBASE + n for the n-th, each on its own
    connection and thread (at most 64 in flight). Writes LOG: "#
    start_epoch_ms E", then per answer "sent_ms_since_start status code user
    latency_us" (status 0 and NO_ANSWER when none came, NO_CODE for an
    answer without one). With GO, makes LOG.ready once started and sends
    from when the file GO exists (a loaded machine can take seconds to
    start python; that time must not come out of a lease)."""
    import base64
    import hashlib
    import hmac
    import http.client
    import os
    import signal
    import threading
    import time

    def b64(b):
        return base64.urlsafe_b64encode(b).rstrip(b"=")
    head = b64(b'{"alg":"HS256","typ":"JWT"}')

    def token(uid):
        now = int(time.time())
        p = b64(json.dumps({"sub": str(uid), "iat": now, "exp": now + 3600}).encode())
        s = b64(hmac.new(a.secret.encode(), head + b"." + p, hashlib.sha256).digest())
        return (head + b"." + p + b"." + s).decode()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    out = open(a.log, "w", buffering=1)
    lock = threading.Lock()
    slots = threading.BoundedSemaphore(64)
    body = json.dumps({"id": a.activity})
    if a.go:
        open(a.log + ".ready", "w").close()
        while not os.path.exists(a.go) and not stop.is_set():
            time.sleep(0.005)
    start = time.time()
    out.write("# start_epoch_ms %d\n" % int(start * 1000))

    def one(uid, sent, tok):
        t0 = time.monotonic()
        status, code = 0, "NO_ANSWER"
        try:
            c = http.client.HTTPConnection("127.0.0.1", a.port, timeout=10)
            c.request("POST", a.path, body=body, headers={
                "Content-Type": "application/json", "Authorization": "Bearer " + tok})
            r = c.getresponse()
            status = r.status
            code = json.loads(r.read()).get("code", "NO_CODE")
            c.close()
        except Exception:
            pass
        us = int((time.monotonic() - t0) * 1e6)
        with lock:
            out.write("%d %d %s %d %d\n" % (sent, status, code, uid, us))
        slots.release()
    threads, n = [], 0
    due = time.monotonic()
    end = due + a.seconds
    while not stop.is_set() and time.monotonic() < end:
        slots.acquire()
        tok = token(a.userbase + n)
        sent = int((time.time() - start) * 1000)
        th = threading.Thread(target=one, args=(a.userbase + n, sent, tok))
        th.start()
        threads.append(th)
        n += 1
        due += 1.0 / a.rate
        d = due - time.monotonic()
        if d > 0:
            stop.wait(d)
    for th in threads:
        th.join()
    out.close()


# --- Prometheus and Grafana ---------------------------------------------------------------

def cmd_promq(a):
    """promq PROM QUERY: the result of an instant QUERY to the Prometheus at
    PROM, one "LABELS VALUE" line per series (LABELS as JSON with sorted
    keys); "ERROR ..." when Prometheus could not be asked or refused it."""
    import urllib.parse
    import urllib.request
    url = a.prom + "/api/v1/query?" + urllib.parse.urlencode({"query": a.query})
    try:
        r = json.load(urllib.request.urlopen(url, timeout=10))
    except Exception as e:
        body = getattr(e, "read", lambda: b"")().decode(errors="replace")
        print("ERROR", e, body[:300])
        return 0
    if r.get("status") != "success":
        print("ERROR", r.get("error"))
        return 0
    for s in r["data"]["result"]:
        print(json.dumps(s["metric"], sort_keys=True), s["value"][1])


def cmd_prom_panels(a):
    """prom-panels PROM DASH: runs every panel query of the Grafana dashboard
    DASH against the Prometheus at PROM (Grafana's $__rate_interval as 1m,
    $__interval as 5s, $__range as 5m); prints per query a tab-separated
    line "ok|not_ok TITLE REFID N|WHY QUERY", N the series returned, WHY
    "empty" or the error."""
    import urllib.parse
    import urllib.request
    with open(a.dash) as f:
        panels = json.load(f)["panels"]
    for p in panels:
        for t in p.get("targets", []):
            q = (t["expr"].replace("$__rate_interval", "1m").replace("$__interval", "5s")
                 .replace("$__range", "5m"))
            url = a.prom + "/api/v1/query?" + urllib.parse.urlencode({"query": q})
            try:
                r = json.load(urllib.request.urlopen(url, timeout=10))
                res = r["data"]["result"] if r.get("status") == "success" else None
                why = "empty" if res == [] else r.get("error", "")
            except Exception as e:
                res, why = None, str(e)
            n = len(res) if res else 0
            print("ok" if n else "not_ok", p["title"], t["refId"], n if n else why, q, sep="\t")


def cmd_prom_rules(a):
    """prom-rules: reads Prometheus' /api/v1/rules answer on stdin; prints
    "RULES ERRORS": how many rules it has loaded, how many in health "err"."""
    g = json.load(sys.stdin)["data"]["groups"]
    r = [x for grp in g for x in grp["rules"]]
    print(len(r), sum(x.get("health") == "err" for x in r))


def cmd_prom_firing(a):
    """prom-firing: reads Prometheus' /api/v1/alerts answer on stdin; prints
    the names of the alerts firing, sorted, space-separated."""
    al = json.load(sys.stdin)["data"]["alerts"]
    print(" ".join(sorted(x["labels"]["alertname"] for x in al if x["state"] == "firing")))


def cmd_dashboard_lint(a):
    """dashboard-lint DASH: what Grafana's import of the dashboard DASH needs
    and it lacks (schemaVersion 36 or later, id null, a Prometheus
    datasource variable every panel's queries use, unique panel ids, a
    query in each panel, the global queue depth summed once over nodes);
    prints the faults joined by "; ", an empty line when there are none."""
    with open(a.dash) as f:
        d = json.load(f)
    bad = []
    if not isinstance(d.get("schemaVersion"), int) or d["schemaVersion"] < 36:
        bad.append("schemaVersion %r is older than Grafana 9" % d.get("schemaVersion"))
    if d.get("id") is not None:
        bad.append("id must be null, or import overwrites another dashboard")
    v = [t for t in d.get("templating", {}).get("list", []) if t.get("type") == "datasource"]
    if not v or v[0].get("query") != "prometheus":
        bad.append("no Prometheus datasource variable")
    name = v[0]["name"] if v else "?"
    ids = set()
    for p in d.get("panels", []):
        if p.get("id") in ids:
            bad.append("panel id %s twice" % p.get("id"))
        ids.add(p.get("id"))
        if p.get("type") == "row":
            continue
        for t in [p] + p.get("targets", []):
            ds = t.get("datasource", {})
            if ds.get("uid") != "${%s}" % name:
                bad.append("%s: datasource %r is not the variable" % (p.get("title"), ds))
        if not p.get("targets"):
            bad.append("%s: no query" % p.get("title"))
        # Every node reads the same global queue: a sum over nodes counts it
        # once per node. Each shard's max over nodes, then the sum over shards.
        for t in p.get("targets", []):
            if "queue_depth" not in t.get("expr", "") or "timestamp" in t["expr"]:
                continue
            if "max by (shard)" not in t["expr"]:
                bad.append("%s: %s counts the global queue once per node" % (p.get("title"), t["expr"]))
    print("; ".join(bad))


def cmd_promtool_test(a):
    """promtool-test DIR RULES [control]: a promtool rules test (YAML, to
    stdout) of the alert rules file RULES over two nodes' scrapes,
    DIR/before-n1.prom and DIR/after-n1.prom (node1:80) and n2's
    (node2:80): each series at its before value for 10 minutes, then its
    after value for 50 (up = 1 throughout), every alert of RULES expected
    silent at 5, 12, 20, 40 and 60 min. "control": node 2's
    couponseize_redis_aof_always is 0 after."""
    import re

    def parse(p):
        out = {}
        for line in open(p):
            if line.startswith("#") or not line.strip():
                continue
            m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{.*\})?)\s+(\S+)', line)
            if m:
                out[m.group(1)] = m.group(2)
        return out
    d, rules, control = a.dir, a.rules, a.control
    series = {}
    for n, inst in (("n1", "node1:80"), ("n2", "node2:80")):
        b, af = parse(f"{d}/before-{n}.prom"), parse(f"{d}/after-{n}.prom")
        for job in ("coupon-fcgi",):
            series[f'up{{job="{job}",instance="{inst}"}}'] = ("1", "1")
        for k in set(b) | set(af):
            name, _, labels = k.partition("{")
            labels = labels.rstrip("}")
            lab = f'job="coupon-fcgi",instance="{inst}"' + ("," + labels if labels else "")
            v0, v1 = b.get(k, af.get(k)), af.get(k, b.get(k))
            if control and n == "n2" and name == "couponseize_redis_aof_always":
                v1 = "0"
            series[f"{name}{{{lab}}}"] = (v0, v1)
    names = re.findall(r'^\s*- alert:\s*(\S+)', open(rules).read(), re.M)
    print(f"rule_files: [{rules}]\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:")
    for s, (v0, v1) in sorted(series.items()):
        print(f"      - series: '{s}'\n        values: '{v0}x10 {v1}x50'")
    print("    alert_rule_test:")
    for n in names:
        for t in ("5m", "12m", "20m", "40m", "60m"):
            print(f"      - eval_time: {t}\n        alertname: {n}\n        exp_alerts: []")


def cmd_csv_growth(a):
    """csv-growth FILE COLUMN: how much COLUMN of the samples in the CSV
    FILE (a header row; column t_s the seconds since the start) grew from
    the first sample at 120 s or later (the first one when none is) to the
    last: prints "PERCENT FIRST LAST", PERCENT with one decimal."""
    import csv
    with open(a.file) as f:
        rows = list(csv.DictReader(f))
    base = [r for r in rows if int(r["t_s"]) >= 120] or rows
    x, y = int(base[0][a.column]), int(rows[-1][a.column])
    print("%.1f %d %d" % (100.0 * (y - x) / max(x, 1), x, y))


# --- benchmarks ------------------------------------------------------------------------

def cmd_bench_row(a):
    """bench-row JSON LABEL: one row of a benchmark table from a loadgen -j
    summary JSON: "LABEL rps R  p99 P ms  {codes}" (LABEL padded to 26)."""
    r = json.loads(a.json)
    print("%-26s rps %7.0f  p99 %7.1f ms  %s" % (a.label, r["rps"], r["p99_ms"], r["codes"]),
          flush=True)


def cmd_ab_row(a):
    """ab-row JSON LABEL APP1 APP0 REDIS1 REDIS0 NGINX1 NGINX0 BUSY1 BUSY0:
    one row of tests/bench/ab from a loadgen -j summary JSON and the CPU
    ticks (after, before) of the app's processes, Redis, nginx and the
    machine (busy): rps, p50 and p99, then each one's CPU in us a request,
    then the answers by code."""
    import os
    r = json.loads(a.json)
    n, us = r["requests"], 1e6 / os.sysconf("SC_CLK_TCK")

    def per(x, y):
        return (int(x) - int(y)) * us / n
    print("%-16s rps %7.0f  p50 %6.2f ms  p99 %7.1f ms  workers %6.1f us/req  redis %6.1f us/req  "
          "nginx %6.1f us/req  machine %6.1f us/req  %s"
          % (a.label, r["rps"], r["p50_ms"], r["p99_ms"], per(a.app1, a.app0),
             per(a.redis1, a.redis0), per(a.nginx1, a.nginx0),
             per(a.busy1, a.busy0), r["codes"]), flush=True)


# --- configuration ------------------------------------------------------------------------

def cmd_local_conf(a):
    """local-conf STATE OUT KEY=VALUE...: merges the settings ("group.key"
    = a libconfig value) into those kept in the JSON file STATE and writes
    them all to OUT as libconfig groups, mode 0640, group couponseize (as
    root: the package's local.conf), through OUT.tmp. Prints nothing."""
    import grp
    import os
    kv = json.load(open(a.state)) if os.path.exists(a.state) else {}
    for e in a.edits:
        k, v = e.split("=", 1)
        kv[k] = v
    json.dump(kv, open(a.state, "w"))
    groups = {}
    for k, v in kv.items():
        g, key = k.split(".", 1)
        groups.setdefault(g, []).append(f"  {key} = {v};")
    text = "# the admin's settings (deb.sh)\n" + "".join(
        f"{g} = {{\n" + "\n".join(lines) + "\n};\n" for g, lines in groups.items())
    fd = os.open(a.out + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    os.write(fd, text.encode())
    os.close(fd)
    os.chown(a.out + ".tmp", 0, grp.getgrnam("couponseize").gr_gid)
    os.rename(a.out + ".tmp", a.out)


# --- the command line ---------------------------------------------------------------------

def parser():
    p = argparse.ArgumentParser(prog="testkit.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True, metavar="SUBCOMMAND")

    def add(name, *args):
        fn = globals()["cmd_" + name.replace("-", "_")]
        text = " ".join(fn.__doc__.split())
        sp = sub.add_parser(name, help=text.split(": ", 1)[1].split(". ")[0], description=fn.__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        for arg in args:
            names, kw = (arg, {}) if isinstance(arg, str) else arg
            sp.add_argument(*(names if isinstance(names, tuple) else (names,)), **kw)
        sp.set_defaults(fn=fn)
    num = {"type": int}
    add("json-get", "json", "key")
    add("jat", "json", "path")
    add("json-pluck", ("--sep", {"default": " "}), "json", "path", "field")
    add("json-len", "json", "path")
    add("json-find", "json", "path", "key", "value", ("fields", {"nargs": "+"}))
    add("jsonl-find", "file", "key", "value", "field")
    add("json-max", "file", "path", "field")
    add("load-codes", "file")
    add("jwt-sign", "key", "input")
    add("jwt-payload", ("--sorted", {"action": "store_true"}), "token")
    add("free-port")
    add("port-free", ("port", num))
    add("redis-proxy", ("lport", num), ("rport", num))
    add("lossy-proxy", ("--seed", {"type": int, "default": 33}),
        ("--one-in", {"type": int, "default": 15}), ("lport", num), ("rport", num))
    add("notify-listen", "sock", "log")
    add("mute-fcgi", "sock", "log")
    add("unix-silent", "sock", "inofile", ("seconds", {"type": float, "nargs": "?", "default": 20}))
    add("raw-request", ("port", num), ("seconds", {"type": float}), "request")
    add("shard-sample", "url", "secret", ("base", num))
    add("walk-pages", "url", ("pages", num))
    add("paced", ("port", num), "path", ("activity", num), ("userbase", num),
        ("rate", {"type": float}), ("seconds", {"type": float}), "log", "secret",
        ("go", {"nargs": "?"}))
    add("promq", "prom", "query")
    add("prom-panels", "prom", "dash")
    add("prom-rules")
    add("prom-firing")
    add("dashboard-lint", "dash")
    add("promtool-test", "dir", "rules", ("control", {"nargs": "?", "default": ""}))
    add("local-conf", "state", "out", ("edits", {"nargs": "*"}))
    add("csv-growth", "file", "column")
    add("bench-row", "json", "label")
    add("ab-row", "json", "label", "app1", "app0", "redis1", "redis0", "nginx1", "nginx0", "busy1",
        "busy0")
    return p


def main(argv):
    a = parser().parse_args(argv)
    return a.fn(a) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
