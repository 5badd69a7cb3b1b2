#!/usr/bin/env bash
# dashboard.sh - the Grafana dashboard (etc/grafana/couponseize.json) shows
# data: a real Prometheus scrapes a live stack under load (the workers'
# /market/admin/metrics through nginx, and coupon-sync's metrics file served
# over HTTP), and every panel's query, run through Prometheus' HTTP API, must
# return at least one series. The dashboard is checked for importability
# (schema, datasource variable), the shipped alert rules load in the same
# Prometheus, and a few panels are checked against the truth (stock in Redis,
# worker count).
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

PROMETHEUS=$(command -v prometheus || echo /usr/bin/prometheus)
[[ -x $PROMETHEUS ]] || skip_all "prometheus is not installed (Debian: prometheus)"
[[ -x $LOADGEN ]] || skip_all "tests/bench/loadgen is not built (make check builds it)"
command -v python3 >/dev/null 2>&1 || skip_all "python3 is not installed"
DASH=$top_srcdir/etc/grafana/couponseize.json

# --- the file itself: what Grafana's import needs ----------------------------------
out=$(python3 - "$DASH" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
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
print("; ".join(bad))
PY
)
check_eq "dashboard: importable (schema, ids, datasource variable)" "" "$out"

cs_stack_up

# reserve_port: a free loopback port, reserved in the stack's port registry
# and released with the stack (tests/stack down).
reserve_port() {
    local reg=${COUPON_PORT_REGISTRY:-/tmp/couponseize-ports-$(id -u)} p i
    for ((i = 0; i < 300; i++)); do
        p=$((20000 + (RANDOM * 32768 + RANDOM) % 12000))
        mkdir "$reg/$p" 2>/dev/null || continue
        printf '%s\n' "$COUPON_DIR" >"$reg/$p/owner"
        printf '%s\n' "$p" >>"$COUPON_DIR/run/ports"
        if python3 -c 'import socket,sys; socket.socket().bind(("127.0.0.1", int(sys.argv[1])))' \
            "$p" 2>/dev/null; then
            echo "$p"
            return 0
        fi
    done
    return 1
}

ADMIN=$(mint_jwt 1 admin)
mk_activity 501 300 -60 3600
mk_activity 502 1000000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "preheat answers 200" 200 "$HTTP_CODE"

# stop_bg PID: stops a server this test started and waits for it to go.
stop_bg() { kill "$1" 2>/dev/null && wait "$1" 2>/dev/null; }

# coupon-sync's textfile, served as node_exporter's textfile collector would.
WEB_PORT=$(reserve_port) || { echo "Bail out! no free port"; exit 99; }
python3 -m http.server "$WEB_PORT" --bind 127.0.0.1 --directory "$COUPON_DIR" \
    >"$COUPON_DIR/http.server.log" 2>&1 &
WEB_PID=$!
cs_defer stop_bg "$WEB_PID"

PROM_PORT=$(reserve_port) || { echo "Bail out! no free port"; exit 99; }
PROM=http://127.0.0.1:$PROM_PORT
cat >"$COUPON_DIR/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $top_srcdir/etc/prometheus/couponseize-alerts.yml
scrape_configs:
  - job_name: coupon-fcgi
    metrics_path: /market/admin/metrics
    static_configs:
      - targets: ['127.0.0.1:$COUPON_HTTP_PORT']
  - job_name: coupon-sync
    metrics_path: /sync.prom
    static_configs:
      - targets: ['127.0.0.1:$WEB_PORT']
EOF
"$PROMETHEUS" --config.file="$COUPON_DIR/prometheus.yml" \
    --storage.tsdb.path="$COUPON_DIR/prometheus" --web.listen-address="127.0.0.1:$PROM_PORT" \
    --log.level=warn >"$COUPON_DIR/prometheus.log" 2>&1 &
PROM_PID=$!
cs_defer stop_bg "$PROM_PID"

# promq QUERY: the result of an instant query, one "labels value" line per
# series ("ERROR ..." when Prometheus refused it).
promq() {
    python3 - "$PROM" "$1" <<'PY'
import json, sys, urllib.parse, urllib.request
url = sys.argv[1] + "/api/v1/query?" + urllib.parse.urlencode({"query": sys.argv[2]})
try:
    r = json.load(urllib.request.urlopen(url, timeout=10))
except Exception as e:
    body = getattr(e, "read", lambda: b"")().decode(errors="replace")
    print("ERROR", e, body[:300]); sys.exit(0)
if r.get("status") != "success":
    print("ERROR", r.get("error")); sys.exit(0)
for s in r["data"]["result"]:
    print(json.dumps(s["metric"], sort_keys=True), s["value"][1])
PY
}
up_is() { [[ $(promq "sum(up{job=\"$1\"})" | awk '{print $NF}') == 1 ]]; }

check "Prometheus is ready" wait_for 30 curl -sf "$PROM/-/ready"
check "Prometheus scrapes the workers' metrics through nginx" wait_for 30 up_is coupon-fcgi
check "Prometheus scrapes coupon-sync's metrics file" wait_for 30 up_is coupon-sync
rules=$(curl -s "$PROM/api/v1/rules" | python3 -c '
import json, sys
g = json.load(sys.stdin)["data"]["groups"]
r = [x for grp in g for x in grp["rules"]]
print(len(r), sum(x.get("health") == "err" for x in r))')
check_match "the shipped alert rules load and evaluate (rules, errors: $rules)" '^[1-9][0-9]* 0$' "$rules"

# --- load: one sale sells out, one keeps selling ---------------------------------
t0=$(date +%s)
seize_load_bg "$COUPON_DIR/load502.json" 502 16 15000 300000
out=$(seize_load 501 32 3000 100000)
check_eq "activity 501 sold out: 300 SEIZED" 300 "$(code_count "$out" SEIZED)"
wait "$LOAD_PID"
out502=$(cat "$COUPON_DIR/load502.json")
check_eq "activity 502: 15,000 SEIZED" 15000 "$(code_count "$out502" SEIZED)"
diag "load took $(($(date +%s) - t0)) s"
# Prometheus has scraped past the end of the load, and coupon-sync has written
# the coupons (its metrics file says so).
scraped_all() {
    [[ $(promq 'sum(couponseize_requests_total{route="seize"})' | awk '{print $NF}') == 18000 ]]
}
check "Prometheus saw all 18,000 seizes" wait_for 30 scraped_all
synced() { (($(promq 'sum(couponseize_sync_rows_total)' | awk '{print int($NF)}') >= 15300)); }
check "coupon-sync's metrics show the coupons written" wait_for 60 synced

# --- every panel's query returns data ---------------------------------------------
# Grafana's interval variables, as Grafana would set them for a 1 s scrape and
# the last few minutes on screen.
while IFS=$'\t' read -r title ref expr; do
    q=${expr//'$__rate_interval'/1m}
    q=${q//'$__interval'/5s}
    q=${q//'$__range'/5m}
    res=$(promq "$q")
    if [[ -z $res || $res == ERROR* ]]; then
        not_ok "panel \"$title\" query $ref returns data" "query: $q" "answer: ${res:-empty}"
    else
        ok "panel \"$title\" query $ref returns data ($(wc -l <<<"$res") series)"
    fi
done < <(python3 -c '
import json, sys
for p in json.load(open(sys.argv[1]))["panels"]:
    for t in p.get("targets", []):
        print(p["title"], t["refId"], t["expr"], sep="\t")' "$DASH")

# --- some panels against the truth -------------------------------------------------
val() { promq "$1" | grep -F "$2" | awk '{print $NF}'; }
check_eq "panel Sold out: activity 501 is 1" 1 \
    "$(val 'max by (activity) (couponseize_activity_sold_out)' '"activity": "501"')"
check_eq "panel Sold out: activity 502 is 0" 0 \
    "$(val 'max by (activity) (couponseize_activity_sold_out)' '"activity": "502"')"
check_eq "panel Remaining stock: activity 502 as in Redis" "$(stock_of 502)" \
    "$(val 'max by (activity) (couponseize_activity_remaining)' '"activity": "502"')"
check_eq "panel Workers: ${COUPON_WORKERS:-4} alive" "${COUPON_WORKERS:-4}" \
    "$(promq 'sum(couponseize_workers)' | awk '{print $NF}')"
rss=$(promq 'min(couponseize_worker_rss_bytes)' | awk '{print int($NF)}')
check "panel Worker RSS: every worker above 1 MB ($rss bytes)" test "${rss:-0}" -gt 1048576
finish
