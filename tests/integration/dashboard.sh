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
out=$(testkit dashboard-lint "$DASH")
check_eq "dashboard: importable (schema, ids, datasource variable)" "" "$out"

# Prometheus starts while the stack comes up; it learns the stack's ports from
# file_sd target files written once the stack is up. Its directory and ports
# are this test's own, cleaned up on every exit path (cs_cleanup).
PDIR=$(mktemp -d "${TMPDIR:-/tmp}/cs-prom.XXXXXX") || exit 99
mkdir -p "$PDIR/run"
cs_defer release_ports # before any port is reserved: no exit path keeps them
REG=${COUPON_PORT_REGISTRY:-/tmp/couponseize-ports-$(id -u)}
trap cs_cleanup EXIT
trap 'exit 130' INT TERM

# reserve_port: a free loopback port, reserved in the port registry the
# stacks share (its owner counts as alive while $PDIR/run exists).
reserve_port() {
    local p i
    mkdir -p "$REG" 2>/dev/null
    for ((i = 0; i < 300; i++)); do
        p=$((20000 + (RANDOM * 32768 + RANDOM) % 12000))
        mkdir "$REG/$p" 2>/dev/null || continue
        printf '%s\n' "$PDIR" >"$REG/$p/owner"
        printf '%s\n' "$p" >>"$PDIR/ports"
        if testkit port-free "$p"; then
            echo "$p"
            return 0
        fi
    done
    return 1
}
# release_ports: gives the reserved ports back and removes $PDIR.
release_ports() {
    local p
    while read -r p; do rm -rf "${REG:?}/$p"; done <"$PDIR/ports"
    rm -rf "$PDIR"
}
# stop_bg PID: stops a server this test started and waits for it to go.

WEB_PORT=$(reserve_port) && PROM_PORT=$(reserve_port) || { echo "Bail out! no free port"; exit 99; }
PROM=http://127.0.0.1:$PROM_PORT
echo '[]' >"$PDIR/fcgi.json"
echo '[]' >"$PDIR/sync.json"
cat >"$PDIR/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $top_srcdir/etc/prometheus/couponseize-alerts.yml
scrape_configs:
  - job_name: coupon-fcgi
    metrics_path: /market/admin/metrics
    file_sd_configs:
      - files: ['$PDIR/fcgi.json']
  - job_name: coupon-sync
    metrics_path: /sync.prom
    file_sd_configs:
      - files: ['$PDIR/sync.json']
EOF
"$PROMETHEUS" --config.file="$PDIR/prometheus.yml" --storage.tsdb.path="$PDIR/data" \
    --web.listen-address="127.0.0.1:$PROM_PORT" --log.level=warn >"$PDIR/prometheus.log" 2>&1 &
PROM_PID=$!
cs_defer stop_bg "$PROM_PID"

cs_stack_up
ADMIN=$(mint_jwt 1 admin)
mk_activity 501 300 -60 3600
mk_activity 502 1000000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "preheat answers 200" 200 "$HTTP_CODE"
diag "stack up after ${SECONDS} s"

# coupon-sync's textfile, served as node_exporter's textfile collector would.
python3 -m http.server "$WEB_PORT" --bind 127.0.0.1 --directory "$COUPON_DIR" \
    >"$PDIR/http.server.log" 2>&1 &
WEB_PID=$!
cs_defer stop_bg "$WEB_PID"
printf '[{"targets": ["127.0.0.1:%s"]}]\n' "$COUPON_HTTP_PORT" >"$PDIR/fcgi.json.tmp"
mv "$PDIR/fcgi.json.tmp" "$PDIR/fcgi.json"
printf '[{"targets": ["127.0.0.1:%s"]}]\n' "$WEB_PORT" >"$PDIR/sync.json.tmp"
mv "$PDIR/sync.json.tmp" "$PDIR/sync.json"

# promq QUERY: the result of an instant query, one "labels value" line per
# series ("ERROR ..." when Prometheus refused it).
promq() { testkit promq "$PROM" "$1"; }
up_is() { [[ $(promq "sum(up{job=\"$1\"})" | awk '{print $NF}') == 1 ]]; }

check "Prometheus is ready" wait_for 30 curl -sf -o /dev/null "$PROM/-/ready"
check "Prometheus scrapes the workers' metrics through nginx" wait_for 30 up_is coupon-fcgi
check "Prometheus scrapes coupon-sync's metrics file" wait_for 30 up_is coupon-sync
rules=$(curl -s "$PROM/api/v1/rules" | testkit prom-rules)
check_match "the shipped alert rules load and evaluate (rules, errors: $rules)" '^[1-9][0-9]* 0$' "$rules"

# --- load: one sale sells out, one keeps selling ---------------------------------
t0=$(date +%s)
seize_load_bg "$COUPON_DIR/load502.json" 502 16 4000 300000
cs_defer stop_bg "$LOAD_PID"
out=$(seize_load 501 16 1000 100000)
check_eq "activity 501 sold out: 300 SEIZED" 300 "$(code_count "$out" SEIZED)"
wait "$LOAD_PID"
out502=$(cat "$COUPON_DIR/load502.json")
check_eq "activity 502: 4,000 SEIZED" 4000 "$(code_count "$out502" SEIZED)"
diag "load took $(($(date +%s) - t0)) s; ${SECONDS} s since the start"
# Prometheus has scraped past the end of the load, and coupon-sync has written
# the coupons (its metrics file says so).
scraped_all() {
    [[ $(promq 'sum(couponseize_requests_total{route="seize"})' | awk '{print $NF}') == 5000 ]]
}
check "Prometheus saw all 5,000 seizes" wait_for 30 scraped_all
synced() { (($(promq 'sum(couponseize_sync_rows_total)' | awk '{print int($NF)}') >= 4300)); }
check "coupon-sync's metrics show the coupons written" wait_for 60 synced

diag "data in Prometheus after ${SECONDS} s"
# --- every panel's query returns data ---------------------------------------------
# Grafana's interval variables are set as Grafana would for a 1 s scrape and
# the last few minutes on screen.
while IFS=$'\t' read -r verdict title ref n q; do
    if [[ $verdict == ok ]]; then
        ok "panel \"$title\" query $ref returns data ($n series)"
    else
        not_ok "panel \"$title\" query $ref returns data" "query: $q" "answer: $n"
    fi
done < <(testkit prom-panels "$PROM" "$DASH")

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
check_eq "couponseize_workers_configured: fcgi.workers" "${COUPON_WORKERS:-4}" \
    "$(promq 'max(couponseize_workers_configured)' | awk '{print $NF}')"
check_eq "couponseize_fallback_budget_seconds: fallback.budget_ms" 1 \
    "$(promq 'max(couponseize_fallback_budget_seconds)' | awk '{print $NF}')"
builds=$(promq 'count by (program) (couponseize_build_info{version!=""})' | sort | tr '\n' ' ')
check_match "couponseize_build_info of both daemons ($builds)" 'coupon-fcgi.*coupon-sync' "$builds"
# A healthy stack under load pages nobody: no rule fires (a rule with a
# "for" may be pending for a moment, e.g. while a sale sells out).
firing=$(curl -s "$PROM/api/v1/alerts" | testkit prom-firing)
check_eq "no alert fires on the healthy stack" "" "$firing"
rss=$(promq 'min(couponseize_worker_rss_bytes)' | awk '{print int($NF)}')
check "panel Worker RSS: every worker above 1 MB ($rss bytes)" test "${rss:-0}" -gt 1048576
# The new series (workers, per-activity stock) pass Prometheus' own lint.
if command -v promtool >/dev/null 2>&1; then
    out=$(curl -s --max-time 10 "$COUPON_URL/market/admin/metrics" | promtool check metrics 2>&1)
    check_eq "promtool check metrics accepts a scrape with sales on ($out)" 0 "$?"
fi
diag "checks done after ${SECONDS} s"
finish
