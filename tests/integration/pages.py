"""pages.py - the buyer and operator pages in headless Chromium against a
running stack (started by pages.sh, whose environment this reads). Prints one
"PASS name" or "FAIL name :: why" line per check, "# ..." for diagnostics.

usage: pages.py OUTPUT_DIR   (screenshots go there)
"""

import base64
import hashlib
import hmac
import json
import math
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.environ["top_srcdir"], "tests"))
from webdriver import Browser, WebDriverError  # noqa: E402

URL = os.environ["COUPON_URL"]
SECRET = os.environ["COUPON_JWT_SECRET"]
LOADGEN = os.path.join(os.environ["top_builddir"], "tests", "bench", "loadgen")
OUT = sys.argv[1]
FAILED = 0


def say(line):
    print(line, flush=True)


def check(name, cond, why=""):
    global FAILED
    if cond:
        say("PASS " + name)
    else:
        FAILED += 1
        say("FAIL %s :: %s" % (name, why))
    return cond


def b64url(b):
    return base64.urlsafe_b64encode(b).decode().rstrip("=")


def jwt(sub, role=None):
    now = int(time.time())
    payload = {"sub": str(sub), "iat": now, "exp": now + 3600}
    if role:
        payload["role"] = role
    head = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64url(json.dumps(payload).encode())
    sig = hmac.new(SECRET.encode(), ("%s.%s" % (head, body)).encode(), hashlib.sha256).digest()
    return "%s.%s.%s" % (head, body, b64url(sig))


ADMIN = jwt(1, "admin")


def call(method, path, body=None, token=ADMIN):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(URL + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=30) as res:
            status, raw = res.status, res.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def seize_requests():
    """Seize requests this node has answered, whatever the outcome (metrics)."""
    _, text = call("GET", "/market/admin/metrics")
    return sum(int(n) for n in re.findall(
        r'^couponseize_requests_total\{route="seize",code="[A-Z_]+"\} (\d+)', text, re.M))


def mysql(sql):
    return subprocess.run(
        ["mariadb", "--no-defaults", "--host=localhost", "--socket=" + os.environ["MYSQL_SOCKET"],
         "-u" + os.environ["MYSQL_USER"], "-p" + os.environ["MYSQL_PASSWORD"], "-N", "-B",
         os.environ["MYSQL_DATABASE"], "-e", sql],
        check=True, capture_output=True, text=True).stdout.strip()


def rcli(*args):
    return subprocess.run(
        ["redis-cli", "-h", os.environ["REDIS_HOST"], "-p", os.environ["REDIS_PORT"]] + list(args),
        check=True, capture_output=True, text=True).stdout.strip()


def lost_reserve(aid, inc, n):
    """A reserve of n coupons of activity aid held by node incarnation inc
    that never renews (a node that died), written as the set-aside script and
    the keeper would: MySQL row first, then stock -> reserve in Redis."""
    shard = int(aid) % 10
    mysql("INSERT INTO reserve_epoch (activity_id, incarnation, epoch, amount) "
          "VALUES (%s, '%s', 1, %d)" % (aid, inc, n))
    script = ("redis.call('HINCRBY', KEYS[1], ARGV[1], -ARGV[3]) "
              "redis.call('HSET', KEYS[2], ARGV[1] .. ':' .. ARGV[2], ARGV[3]) "
              "redis.call('HINCRBY', KEYS[2], ARGV[1], 1) "
              "redis.call('HINCRBY', KEYS[2], ARGV[1] .. ':held', ARGV[3]) "
              "redis.call('HSET', KEYS[3], ARGV[2] .. ':1', 'open:' .. ARGV[3])")
    rcli("EVAL", script, "3", "COUPON:RESOURCE:STOCK:{%d}" % shard, "COUPON:RESERVE:{%d}" % shard,
         "COUPON:RESERVE:EPOCH:%s_{%d}" % (aid, shard), str(aid), inc, str(n))


def rfc3339(t):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def create(name, total, start_off, end_off, **extra):
    now = time.time()
    body = {"name": name, "totalNum": total, "distributeStartTime": rfc3339(now + start_off),
            "distributeEndTime": rfc3339(now + end_off), "couponName": name, "couponAmount": "5"}
    body.update(extra)
    st, j = call("POST", "/market/admin/coupon/activity", body)
    if st != 201:
        raise SystemExit("create %s: %s %s" % (name, st, j))
    return j["idStr"]


def hms(text):
    m = re.search(r"(\d+):(\d\d):(\d\d)$", text or "")
    return int(m.group(1)) * 3600 + int(m.group(2)) * 60 + int(m.group(3)) if m else None


def card_js(sel, field):
    return "const c = document.querySelector('%s'); return c ? c.%s : null;" % (sel, field)


def buyer(b, ids):
    a, later, load, vip = ids
    names = {a: "Coffee 5 off", later: "Opens in an hour", load: "Load test sale"}
    b.get(URL + "/market/ui/buyer.html#token=" + jwt(4242))
    n = b.wait(lambda: b.js("return document.querySelectorAll('#list .card').length") >= 3, 15)
    check("buyer: the page lists the three sales", n, "cards: %s" % b.js(
        "return document.querySelectorAll('#list .card').length"))
    for i, want_state in ((a, "On sale"), (later, "Not started"), (load, "On sale")):
        sel = '#list [data-id="%s"]' % i
        check("buyer: sale %s shown by its name" % i,
              b.js(card_js(sel + " .name", "textContent")) == names[i],
              b.js(card_js(sel + " .name", "textContent")))
        check("buyer: sale %s in state %s" % (i, want_state),
              b.js(card_js(sel + " .state", "textContent")) == want_state,
              b.js(card_js(sel + " .state", "textContent")))
        cd = b.js(card_js(sel + " .countdown", "textContent"))
        check("buyer: sale %s has a countdown" % i,
              re.fullmatch(r"(Starts|Ends) in (\d+d )?\d\d:\d\d:\d\d", cd or ""), cd)
    sel = '#list [data-id="%s"]' % later
    # Each reading comes with the browser's clock at that moment, so the
    # checks are judged by how much time really passed between the readings
    # (a busy machine stretches the round trips), not by the sleep.
    read_cd = ("const c = document.querySelector('%s .countdown');"
               "return [c ? c.textContent : null, Date.now()];" % sel)
    text1, d1 = b.js(read_cd)
    time.sleep(2.2)
    text2, d2 = b.js(read_cd)
    t1, t2, gap = hms(text1), hms(text2), (d2 - d1) / 1000
    # The page shows whole seconds, re-rendered every 250 ms: over GAP seconds
    # it drops by floor(GAP - 0.3) .. ceil(GAP + 0.3), and at least by 1.
    check("buyer: the countdown runs (down by the %.1f s that passed, +-1)" % gap,
          t1 is not None and t2 is not None
          and max(1, math.floor(gap - 0.3)) <= t1 - t2 <= math.ceil(gap + 0.3),
          "%s then %s" % (t1, t2))
    _, st = call("GET", "/market/consumer/coupon/status")
    after = time.time() * 1000
    start = int(next(x["startTime"] for x in st["activities"] if x["idStr"] == later))
    # start - now by the server's clock when the status answer was made, moved
    # back to the moment of the page's reading (the time that passed since).
    want = (start - st["now"]) / 1000 + (after - d2) / 1000
    check("buyer: the countdown is by the server's clock (within 3 s of start - now)",
          t2 is not None and abs(t2 - want) <= 3, "page %s, server %.1f" % (t2, want))
    check("buyer: no seize button before the start",
          b.js(card_js(sel + " .seize", "disabled")) is True)

    sel = '#list [data-id="%s"]' % a
    before = seize_requests()
    # Two clicks in one go: the second lands while the first is in flight.
    off = b.js("const x = document.querySelector(arguments[0]); x.click();"
               "const d = x.disabled; x.click(); return d;", sel + " .seize")
    check("buyer: the button is disabled while the request is in flight", off is True, off)
    out = b.wait(lambda: b.js(card_js(sel + " .outcome", "textContent"))
                 if "got it" in (b.js(card_js(sel + " .outcome", "textContent")) or "") else None, 10)
    check("buyer: the outcome is shown in words", out, b.js(card_js(sel + " .outcome", "textContent")))
    after = seize_requests()
    check("buyer: two clicks sent one seize (server side)", after - before == 1,
          "seize requests +%d" % (after - before))
    try:
        b.click(b.find(sel + " .seize"))  # a real click on the disabled button
    except WebDriverError as e:
        say("# click on the disabled button: %s" % e)
    b.js("document.querySelector(arguments[0]).click()", sel + " .seize")
    time.sleep(1)
    check("buyer: a click after the final answer sends nothing (server side)",
          seize_requests() == after, "seize requests %d -> %d" % (after, seize_requests()))
    check("buyer: the button stays disabled after the answer",
          b.js(card_js(sel + " .seize", "disabled")) is True)
    _, st = call("GET", "/market/consumer/coupon/status?id=" + a, token=jwt(4242))
    check("buyer: the server holds the coupon for the page's user",
          st.get("mine", {}).get("seized") is True, st)
    sel = '#list [data-id="%s"]' % vip
    check("buyer: a sale for other groups says who may seize",
          "Only for: vip (not you)" == b.js(card_js(sel + " .who-may", "textContent")),
          b.js(card_js(sel + " .who-may", "textContent")))
    check("buyer: its button is off for this buyer", b.js(card_js(sel + " .seize", "disabled")) is True)
    check("buyer: an open sale says so", "Open to everyone" == b.js(
        card_js('#list [data-id="%s"] .who-may' % a, "textContent")))
    # coupon-sync writes the coupon within a tick; the list refreshes every 5 s.
    mine = '#mine tbody tr[data-id]'
    ok = b.wait(lambda: b.js("return document.querySelectorAll('%s').length" % mine) == 1, 20)
    check("buyer: my coupons lists the seized coupon", ok,
          b.js(card_js("#mine-info", "textContent")))
    cells = b.js("return [...document.querySelectorAll('%s td')].map(x => x.textContent)" % mine)
    check("buyer: my coupon shows its sale and state",
          cells and cells[0] == "Coffee 5 off" and cells[2] == "Unused", cells)
    b.js("window.scrollTo(0, 0)")
    b.screenshot(os.path.join(OUT, "pages-buyer.png"))
    say("# screenshot: %s" % os.path.join(OUT, "pages-buyer.png"))


def operator(b, ids):
    a, _, load, _ = ids
    sel = '#rows [data-id="%s"]' % load
    b._s("POST", "/window/rect", {"width": 1100, "height": 1000})
    b.get(URL + "/market/ui/operator.html#token=" + ADMIN)
    ok = b.wait(lambda: b.js(card_js(sel + " .remaining", "dataset.value")) == "100000", 15)
    check("operator: the load sale shows its full stock", ok,
          b.js(card_js(sel + " .remaining", "dataset.value")))
    # pages.sh runs the stack with fallback.reserve = 20: the node sets a
    # reserve aside for the load sale within seconds of its start.
    rsel = sel + " .reserves tbody tr"
    ok = b.wait(lambda: b.js("return document.querySelectorAll(arguments[0]).length", rsel) == 1, 20)
    check("operator: the load sale shows the node's reserve", ok,
          mysql("SELECT incarnation, state FROM reserve_epoch WHERE activity_id = %s" % load))
    cells = b.js("return [...document.querySelectorAll(arguments[0])].map(x => x.textContent)",
                 rsel + " td") or []
    inc = mysql("SELECT incarnation FROM reserve_epoch WHERE activity_id = %s AND state = 1" % load)
    check("operator: the reserve row names the node, left / set aside and a live lease",
          len(cells) == 4 and inc and cells[0] == inc[:8] and cells[1] == "20 / 20"
          and re.fullmatch(r"\d+\.\d s ago", cells[2]), cells)
    check("operator: its Return button is off while the node's lease lives",
          b.js(card_js(rsel + " .return", "disabled")) is True)
    port = URL.rsplit(":", 1)[1]
    # The load runs until the page has shown three readings (SIGTERM: loadgen
    # stops and reports), 60 s at most: a busy machine slows the page's
    # refreshes, and a load of fixed length could end before three came.
    lg = subprocess.Popen([LOADGEN, "-p", port, "-s", SECRET, "-a", load, "-c", "2",
                           "-n", "1000000", "-b", "500000", "-D", "60", "-j"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    seen = []
    shot = False
    while lg.poll() is None:
        v = b.js(card_js(sel + " .remaining", "dataset.value"))
        if v and (not seen or seen[-1] != int(v)):
            seen.append(int(v))
        if not shot and len(seen) >= 3:
            b.screenshot(os.path.join(OUT, "pages-operator-load.png"))
            shot = True
            lg.terminate()
        time.sleep(0.25)
    summary = json.loads(lg.stdout.read())
    granted = int(summary.get("codes", {}).get("SEIZED", 0))
    say("# load: %d granted; the page showed %s" % (granted, seen))
    check("operator: remaining stock falls on the page while the load runs (3+ readings)",
          len(seen) >= 3 and all(x > y for x, y in zip(seen, seen[1:])) and seen[-1] < 100000, seen)
    rates = b.js(card_js("#node .rates", "textContent")) or ""
    check("operator: seize rate by outcome shown", "SEIZED" in rates, rates)
    check("operator: breaker state shown", b.js(card_js("#node .breaker", "textContent")) == "closed",
          b.js(card_js("#node .breaker", "textContent")))
    check("operator: sync queue depth shown",
          re.fullmatch(r"\d+", b.js(card_js("#node .queue", "textContent")) or ""),
          b.js(card_js("#node .queue", "textContent")))
    want = 100000 - granted
    ok = b.wait(lambda: b.js(card_js(sel + " .remaining", "dataset.value")) == str(want), 15)
    check("operator: the page ends at exactly total - granted (%d)" % want, ok,
          b.js(card_js(sel + " .remaining", "dataset.value")))

    k = b.find(sel + " .topup-k")
    b.clear(k)
    b.type(k, "25")
    b.click(b.find(sel + " .topup"))
    msg = b.wait(lambda: b.js(card_js("#msg", "textContent")) if "Added 25" in (
        b.js(card_js("#msg", "textContent")) or "") else None, 10)
    check("operator: top-up from the page confirmed", msg, b.js(card_js("#msg", "textContent")))
    ok = b.wait(lambda: b.js(card_js(sel + " .remaining", "dataset.value")) == str(want + 25), 15)
    check("operator: the page shows the stock raised by 25", ok,
          b.js(card_js(sel + " .remaining", "dataset.value")))
    _, j = call("GET", "/market/admin/coupon/activity?id=" + load)
    act = j.get("activity", {})
    check("operator: the API has total 100025 and remaining %d" % (want + 25),
          act.get("totalNum") == 100025 and act.get("remaining") == want + 25, act)
    used = '#rows [data-id="%s"] .coupons' % a
    ok = b.wait(lambda: (b.js(card_js(used, "textContent")) or "").startswith(
        "coupons: 1 unused, 0 used, 0 expired (0 returned)"), 10)
    check("operator: coupon counts by state shown", ok, b.js(card_js(used, "textContent")))
    row = mysql("SELECT action, result FROM admin_audit WHERE activity_id = %s "
                "ORDER BY id DESC LIMIT 1" % load)
    check("operator: the top-up is in admin_audit", row == "topup\tOK", row)

    # A node that died holding a reserve: its row shows the lease expired,
    # and "Return" (two clicks) puts its coupons back in stock.
    lost = "0123456789abcdef0123456789abcdef"
    stock = lambda: int(rcli("HGET", "COUPON:RESOURCE:STOCK:{%d}" % (int(load) % 10), load))
    lost_reserve(load, lost, 7)
    s0 = stock()
    lsel = sel + ' .reserves tr[data-incarnation="%s"]' % lost
    ok = b.wait(lambda: b.js(card_js(lsel + " .return", "disabled")) is False, 15)
    check("operator: a lost node's reserve shows, expired, with Return on", ok,
          b.js(card_js(lsel, "textContent")))
    # Polled, not read once: a refresh that fell between the MySQL row and
    # the Redis write of lost_reserve() shows the row with "? / 7" until the next.
    cells = lambda: b.js("return [...document.querySelectorAll(arguments[0])].map(x => x.textContent)",
                         lsel + " td")[:3]
    ok = b.wait(lambda: cells() == [lost[:8], "7 / 7", "never, expired"], 15)
    check("operator: ... named by its short id, 7 / 7, lease never renewed", ok,
          b.js(card_js(lsel, "textContent")))
    b.js("document.querySelector(arguments[0]).scrollIntoView()", sel)
    b.screenshot(os.path.join(OUT, "pages-operator-reserves.png"))
    b.click(b.find(lsel + " .return"))
    armed = b.js(card_js(lsel + " .return", "textContent"))
    b.click(b.find(lsel + " .return"))
    msg = b.wait(lambda: b.js(card_js("#msg", "textContent")) if "Returned node" in (
        b.js(card_js("#msg", "textContent")) or "") else None, 10)
    check("operator: Return asks once more, then closes it, the 7 kept out of stock",
          armed == "Sure?" and msg and "0 coupons back in stock; 7 kept out of stock until "
          "that node replays" in msg, (armed, b.js(card_js("#msg", "textContent"))))
    check("operator: the stock is unchanged (the node may have granted them)", stock() == s0,
          (s0, stock()))
    gone = b.wait(lambda: b.js("return document.querySelector(arguments[0]) === null", lsel), 10)
    check("operator: the returned reserve leaves the page", gone)
    row = mysql("SELECT state, closed_by, returned FROM reserve_epoch WHERE activity_id = %s "
                "AND incarnation = '%s'" % (load, lost))
    check("operator: MySQL has the epoch closed by admin", row == "2\tadmin\t0", row)
    row = mysql("SELECT action, result FROM admin_audit WHERE activity_id = %s "
                "ORDER BY id DESC LIMIT 1" % load)
    check("operator: the return is in admin_audit", row == "reserve_return\tOK", row)
    b.js("document.querySelector(arguments[0]).scrollIntoView()", sel)
    b.screenshot(os.path.join(OUT, "pages-operator.png"))
    say("# screenshots: %s" % ", ".join(os.path.join(OUT, "pages-operator%s.png" % x)
                                         for x in ("-load", "-reserves", "")))


def token_fragment(b):
    """A link's #token= never replaces a stored token without asking, and a
    malformed fragment does not break the page."""
    key = "couponseize.buyerToken"
    mine, other = jwt(4242), jwt(31337)
    stored = lambda: b.js("return localStorage.getItem(arguments[0])", key)
    cards = lambda: b.js("return document.querySelectorAll('#list .card').length") or 0
    asked = lambda: b.js("return !!document.querySelector('.token-ask')")

    def load(fragment):
        b.get("about:blank")  # a new document, not a same-page fragment change
        b.get(URL + "/market/ui/buyer.html" + fragment)
        return b.wait(lambda: cards() >= 3, 15)

    b.js("localStorage.setItem(arguments[0], arguments[1])", key, mine)
    check("token: the page loads with a foreign #token=", load("#token=" + other), cards())
    check("token: a foreign token is not stored without asking", stored() == mine,
          "stored sub %s" % (stored() or "")[-12:])
    check("token: the page asks before replacing the stored token", asked())
    check("token: the fragment is gone from the address bar",
          "#" not in b.js("return location.href"), b.js("return location.href"))
    b.click(b.find(".token-ask .token-keep"))
    check("token: 'Keep mine' keeps it and closes the question",
          stored() == mine and not asked(), (asked(), stored() == mine))

    load("#token=" + other)
    b.click(b.find(".token-ask .token-replace"))
    ok = b.wait(lambda: stored() == other, 5)
    check("token: 'Use the new token' stores the link's token", ok)
    b.wait(lambda: cards() >= 3, 15)
    check("token: ... and the page then runs without asking again", not asked())

    b.js("localStorage.setItem(arguments[0], arguments[1])", key, mine)
    load("#token=" + mine)
    check("token: the stored token again: no question", not asked())
    for frag in ("#token=%E0", "#token=%", "#token=%E0%A4%A&x=1", "#token="):
        ok = load(frag)
        check("token: the page survives %s" % frag, ok and not asked() and stored() == mine,
              "cards %s, asked %s, stored kept %s" % (cards(), asked(), stored() == mine))


def main():
    ids = (create("Coffee 5 off", 5, -60, 3600),
           create("Opens in an hour", 100, 3600, 7200),
           create("Load test sale", 100000, -60, 3600),
           create("VIP only", 10, -60, 3600, eligibleGroups=["vip"]))
    say("# activities %s" % (ids,))
    workdir = os.environ["COUPON_DIR"]
    t0 = time.time()
    with Browser(workdir, width=412, height=915) as b:
        buyer(b, ids)
        token_fragment(b)
        operator(b, ids)
    say("# browser part took %.1f s" % (time.time() - t0))
    return 0  # the failed checks are counted by pages.sh


if __name__ == "__main__":
    sys.exit(main())
