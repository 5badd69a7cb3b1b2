"""client.py - load over several sales on every node, recorded as a history.

The history is JSON lines, one per operation, written as answers arrive:
  {"type": "seize", "user": U, "sale": A, "node": N, "t0": ms, "t1": ms,
   "http": 200, "code": "SEIZED", "thread": T}
  (a seize of a burst thread, which loads one node with group commit on,
  has "burst": true)
  (a SOLD_OUT that says it is not final, reserves being open, has "final": false)
  {"type": "admin", "op": "revoke" | "move-window" | "preheat", "sale": A, ...}
  {"type": "status", "user": U, "sale": A, "node": N, "seized": bool, ...}
t0 is when the request was sent, t1 when its answer (or its failure) came,
both wall-clock epoch milliseconds of this host. code is the answer's "code",
or, when there is none: REFUSED (the connection was refused: nothing was
sent), TIMEOUT / RESET (sent, no answer: the outcome is unknown), HTTP_nnn
(an answer without a JSON code).
"""
import base64
import hashlib
import hmac
import http.client
import json
import random
import socket
import threading
import time

# Answers that leave a user's outcome open: they may or may not hold a coupon.
INDETERMINATE = {"UNKNOWN_OUTCOME", "TIMEOUT", "RESET"}


def now_ms():
    return int(time.time() * 1000)


def b64url(b):
    return base64.urlsafe_b64encode(b).decode().rstrip("=")


def mint_jwt(secret, sub, role=None, ttl=7200):
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = {"sub": str(sub), "iat": int(time.time()), "exp": int(time.time()) + ttl}
    if role:
        claims["role"] = role
    payload = b64url(json.dumps(claims).encode())
    sig = hmac.new(secret.encode(), ("%s.%s" % (header, payload)).encode(), hashlib.sha256).digest()
    return "%s.%s.%s" % (header, payload, b64url(sig))


class History:
    """Append-only JSON lines, shared by the threads."""

    def __init__(self, path):
        self.f = open(path, "a")
        self.lock = threading.Lock()

    def add(self, rec):
        line = json.dumps(rec, sort_keys=True)
        with self.lock:
            self.f.write(line + "\n")
            self.f.flush()

    def close(self):
        self.f.close()


class Http:
    """One keep-alive connection per (thread, node)."""

    def __init__(self, urls, timeout=4.0):
        self.hosts = [u.split("//", 1)[1] for u in urls]
        self.timeout = timeout
        self.conns = {}

    def request(self, node, method, path, body=None, token=None):
        """(http status or None, code, parsed body or None)."""
        hdr = {}
        if body is not None:
            body = json.dumps(body)
            hdr["Content-Type"] = "application/json"
        if token:
            hdr["Authorization"] = "Bearer " + token
        c = self.conns.get(node)
        if c is None:
            host, port = self.hosts[node - 1].rsplit(":", 1)
            c = http.client.HTTPConnection(host, int(port), timeout=self.timeout)
            try:
                c.connect()
            except ConnectionRefusedError:
                return None, "REFUSED", None
            except OSError:
                return None, "REFUSED", None
            self.conns[node] = c
        try:
            c.request(method, path, body=body, headers=hdr)
            r = c.getresponse()
            data = r.read()
        except socket.timeout:
            self.drop(node)
            return None, "TIMEOUT", None
        except (OSError, http.client.HTTPException):
            self.drop(node)
            return None, "RESET", None
        if r.getheader("Connection", "").lower() == "close":
            self.drop(node)
        try:
            j = json.loads(data)
            return r.status, j.get("code") or "HTTP_%d" % r.status, j
        except ValueError:
            return r.status, "HTTP_%d" % r.status, None

    def drop(self, node):
        c = self.conns.pop(node, None)
        if c:
            c.close()


# Which sale a request goes to, and how many users may ask for it.
MIX = [(101, 0.25, 400), (102, 0.35, 3000), (103, 0.2, 3000), (104, 0.2, 3000)]
# The burst threads' mix: mostly the sale that never sells out, whose
# seizes then come together on one shard, from more users.
BURST_MIX = [(101, 0.1, 400), (102, 0.6, 30000), (103, 0.15, 3000), (104, 0.15, 3000)]


class Load:
    """threads x (pick a sale, a user, a node; seize; record) until stop().

    burst {node: n}: n more threads for each such node (one with group
    commit on), each sending one seize to that node alone at every tick of
    its node (every burst_ms), so that seizes arrive together and ride in
    one call. Every thread takes users of its own residue modulo the number
    of threads, so threads rarely race on one user."""

    def __init__(self, seed, urls, secret, history, threads=6, think_ms=(2, 12), burst=None,
                 burst_ms=25):
        self.seed = seed
        self.urls = urls
        self.secret = secret
        self.history = history
        self.nthreads = threads
        self.think = think_ms
        self.burst = sorted((burst or {}).items())
        self.burst_ms = burst_ms
        self.total = threads + sum(n for _, n in self.burst)
        self.ticks = {node: [0, threading.Condition()] for node, _ in self.burst}
        self.stopping = threading.Event()
        self.tokens = {}
        self.tlock = threading.Lock()
        self.threads = []

    def token(self, user):
        with self.tlock:
            t = self.tokens.get(user)
            if t is None:
                t = self.tokens[user] = mint_jwt(self.secret, user)
            return t

    def start(self):
        for i in range(self.nthreads):
            th = threading.Thread(target=self.run, args=(i,), daemon=True)
            th.start()
            self.threads.append(th)
        i = self.nthreads
        for node, n in self.burst:
            for _ in range(n):
                th = threading.Thread(target=self.run, args=(i, node), daemon=True)
                th.start()
                self.threads.append(th)
                i += 1
            th = threading.Thread(target=self.ticker, args=(node,), daemon=True)
            th.start()
            self.threads.append(th)

    def stop(self):
        self.stopping.set()
        for tick in self.ticks.values():
            with tick[1]:
                tick[1].notify_all()
        for th in self.threads:
            th.join(10)

    def ticker(self, node):
        tick = self.ticks[node]
        while not self.stopping.wait(self.burst_ms / 1000.0):
            with tick[1]:
                tick[0] += 1
                tick[1].notify_all()

    def run(self, i, burst_node=None):
        rng = random.Random("client:%d:%d" % (self.seed, i))
        h = Http(self.urls)
        recent = []  # (user, sale) this thread asked lately: users come back
        mix = BURST_MIX if burst_node else MIX
        sales = [m[0] for m in mix]
        weights = [m[1] for m in mix]
        pool = {m[0]: m[2] for m in mix}
        seen = 0
        while not self.stopping.is_set():
            if burst_node:
                # The next tick of the node (a tick missed while this
                # thread's seize was out is not made up).
                tick = self.ticks[burst_node]
                with tick[1]:
                    while tick[0] <= seen and not self.stopping.is_set():
                        tick[1].wait(1.0)
                    seen = tick[0]
                if self.stopping.is_set():
                    break
            if recent and rng.random() < 0.3:
                user, sale = rng.choice(recent)
            else:
                sale = rng.choices(sales, weights)[0]
                # Thread i takes users of its own residue so threads rarely
                # race on one user, while each user still sees both nodes.
                user = rng.randrange(1, pool[sale] // self.total) * self.total + i
                recent.append((user, sale))
                if len(recent) > 40:
                    recent.pop(0)
            node = burst_node or rng.randint(1, len(self.urls))
            t0 = now_ms()
            st, code, j = h.request(node, "POST", "/market/consumer/coupon/seize", {"id": sale},
                                    self.token(user))
            rec = {"type": "seize", "user": user, "sale": sale, "node": node,
                   "t0": t0, "t1": now_ms(), "http": st, "code": code, "thread": i}
            if burst_node:
                rec["burst"] = True
            if code == "SOLD_OUT" and j is not None and j.get("final") is False:
                rec["final"] = False
            self.history.add(rec)
            if not burst_node:
                time.sleep(rng.uniform(*self.think) / 1000.0)


def admin(h, history, secret, op, sale, method, path, body, tries=8, stop=None):
    """An admin call until it answers 2xx (at most tries times, and not
    once the event stop is set), each attempt recorded; returns the last
    (status, code, body)."""
    tok = mint_jwt(secret, 1, "admin")
    res = (None, "NOT_TRIED", None)
    for attempt in range(tries):
        if stop is not None and stop.is_set():
            break
        node = 1 + attempt % len(h.hosts)
        t0 = now_ms()
        res = h.request(node, method, path, body, tok)
        history.add({"type": "admin", "op": op, "sale": sale, "node": node, "t0": t0,
                     "t1": now_ms(), "http": res[0], "code": res[1]})
        if res[0] is not None and 200 <= res[0] < 300:
            break
        time.sleep(0.5)
    return res


def settle(urls, secret, history, pairs):
    """status?id with each user's token on every node, for the (user, sale)
    pairs whose outcome is open; recorded as "status" lines."""
    h = Http(urls, timeout=5)
    for user, sale in sorted(pairs):
        for node in range(1, len(urls) + 1):
            t0 = now_ms()
            st, code, j = h.request(node, "GET", "/market/consumer/coupon/status?id=%d" % sale,
                                    None, mint_jwt(secret, user))
            mine = (j or {}).get("mine") or {}
            history.add({"type": "status", "user": user, "sale": sale, "node": node, "t0": t0,
                         "t1": now_ms(), "http": st, "code": code,
                         "seized": mine.get("seized"), "pending": mine.get("pending", False),
                         "stale": (j or {}).get("stale", False)})
