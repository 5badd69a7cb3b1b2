#!/usr/bin/env bash
# upgrade_nodes.sh - a rolling upgrade of two web nodes serving one sale, as
# a canary goes out: 8,000 users (4,000 through each node's nginx, paced at
# 250 a second each) seize a sale of 7,000 while node 1 is upgraded in place
# (tests/stack upgrade-fcgi) to a second build, both builds then serve the
# sale side by side, and node 2 follows (upgrade-fcgi2). Node 1 runs group
# commit (limits.batch_max = 32, 8 workers): for the seconds of its upgrade
# old and new workers share its shards' queues. Judged per user as
# upgrade.sh does: no 502 or 504 (every user answered by the service), every
# SEIZED holds a coupon, every holder was told SEIZED or UNKNOWN_OUTCOME,
# nothing oversold; each node's reserve passes to its new keeper without
# being given back. Prints per upgrade the answers on each node meanwhile
# and the longest time without one.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

[[ -x $LOADGEN ]] || skip_all "tests/bench/loadgen is not built (make check builds it)"
command -v python3 >/dev/null || skip_all "python3 is not installed"
[[ -x $top_builddir/coupon-fcgi ]] || skip_all "coupon-fcgi is not built"

upgrade_bins
build() { upgrade_build "$@"; }
export COUPON_WORKERS=3
export COUPON_CONF_OVERRIDES="fallback.reserve=20
${COUPON_CONF_OVERRIDES:-}"
export COUPON_CONF_OVERRIDES_NODE1="limits.batch_max=32
fcgi.workers=8
${COUPON_CONF_OVERRIDES_NODE1:-}"
cs_stack_up --nodes 2
cs_defer rm -rf "$BIN"
ADMIN=$(mint_jwt 1 admin)
ID=6301 TOTAL=7000 EACH=4000 RATE=250
read -ra URLS <<<"${COUPON_URLS//,/ }"
check_eq "two nodes" 2 "${#URLS[@]}"
# fcgi_pid N: node N's supervisor, as the stack records it.
fcgi_pid() { if (($1 == 1)); then cat "$COUPON_DIR/run/fcgi.pid"; else cat "$COUPON_DIR/run/fcgi$1.pid"; fi; }
check "node 1 runs build 1" cmp -s "/proc/$(fcgi_pid 1)/exe" "$BIN/build-1"
check "node 2 runs build 1" cmp -s "/proc/$(fcgi_pid 2)/exe" "$BIN/build-1"

mk_activity "$ID" "$TOTAL" -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "preheat answers 200" 200 "$HTTP_CODE"
EPOCHS="SELECT COUNT(*), COALESCE(SUM(state = 1), 0), COUNT(DISTINCT incarnation)
    FROM reserve_epoch WHERE activity_id = $ID"
check "both keepers set a reserve aside" wait_for 20 sql_is "$EPOCHS" $'2\t2\t2'
# Epochs that took tokens. Near the sale's end a keeper gives its reserve
# back at the low-water mark, and may then try a set-aside that the script
# refuses (amount 0, closed at once): nothing set aside, so not counted.
SET_ASIDE="SELECT GROUP_CONCAT(incarnation, ':', epoch ORDER BY incarnation, epoch)
    FROM reserve_epoch WHERE activity_id = $ID AND amount > 0"
epochs0=$(mysql_q "$SET_ASIDE")

LPIDS=()
for n in 1 2; do
    "$LOADGEN" -p "${URLS[n - 1]##*:}" -s "$COUPON_JWT_SECRET" -a "$ID" -c 16 -n "$EACH" -R "$RATE" \
        -b $((6301000000 + n * 10000000)) -L "$COUPON_DIR/load$n.log" -j >"$COUPON_DIR/load$n.json" &
    LPIDS+=($!)
    cs_defer stop_bg "$!"
done

WINDOWS=""
# upgrade N BUILD AFTER: after AFTER more answers on node N, node N to build BUILD.
upgrade() {
    local n=$1 bn=$2 old t0 t1 rc=0 svc=fcgi
    ((n > 1)) && svc=fcgi$n
    old=$(fcgi_pid "$n")
    wait_answers "$COUPON_DIR/load$n.log" "$3" || not_ok "node $n: the load is answered"
    build "$bn" || not_ok "build $bn made"
    t0=$(date +%s%3N)
    stack "upgrade-$svc" 2>"$COUPON_DIR/up$n.err" || rc=$?
    t1=$(date +%s%3N)
    sed 's/^/# /' "$COUPON_DIR/up$n.err"
    WINDOWS+="node$n $t0 $t1"$'\n'
    check_eq "node $n: upgrade-$svc exits 0" 0 "$rc"
    check "node $n: a new supervisor ($old -> $(fcgi_pid "$n"))" test "$old" != "$(fcgi_pid "$n")"
    check "node $n: it runs build $bn" cmp -s "/proc/$(fcgi_pid "$n")/exe" "$BIN/build-$bn"
}

upgrade 1 2 1000
# The canary: node 1 on build 2, node 2 on build 1, one sale.
# shellcheck disable=SC2034 # read by wait_for's eval
a1=$(answers "$COUPON_DIR/load1.log") a2=$(answers "$COUPON_DIR/load2.log")
check "side by side: node 2 still on build 1" cmp -s "/proc/$(fcgi_pid 2)/exe" "$BIN/build-1"
check "side by side: both nodes answer" \
    wait_for 20 eval '(($(answers "$COUPON_DIR/load1.log") > a1 + 200 && $(answers "$COUPON_DIR/load2.log") > a2 + 200))'
upgrade 2 3 300
epochs1=$(mysql_q "$SET_ASIDE")
check_eq "both upgraded: each node's epoch is the one set aside before (none set aside again)" \
    "$epochs0" "$epochs1"
if [[ $epochs1 != "$epochs0" ]]; then
    diag "reserve_epoch: $(mysql_q "SELECT incarnation, epoch, state, amount, closed_by, returned, created_at, closed_at
        FROM reserve_epoch WHERE activity_id = $ID ORDER BY incarnation, epoch" | tr '\t\n' ' |')"
    for n in 1 2; do
        diag "node $n's keepers: $(grep -h 'reserve keeper' "$COUPON_DIR/node$n/fcgi.log" | cut -c1-220 | tail -n 25)"
    done
fi
# (Given back at the low-water mark near the sale's end, maybe: never at a hand-over.)
for n in 1 2; do
    check_eq "node $n: its keeper handed over once" 1 \
        "$(grep -c 'reserve keeper: handing over' "$COUPON_DIR/node$n/fcgi.log")"
    check_eq "node $n: nothing given back at a stop" 0 \
        "$(grep -c 'stopping: giving every reserve back' "$COUPON_DIR/node$n/fcgi.log")"
done

for p in "${LPIDS[@]}"; do wait "$p"; done
check "coupon-sync drained the queue" wait_for 60 drained $((ID % 10))

checker node-windows "$WINDOWS" "$COUPON_DIR/load1.log" "$COUPON_DIR/load2.log" >"$COUPON_DIR/windows.txt"
while read -r line; do diag "$line"; done <"$COUPON_DIR/windows.txt"
body=$(curl -s --max-time 10 -H "Authorization: Bearer $ADMIN" "${URLS[0]}/market/admin/metrics")
diag "node 1 (group commit): $(awk '$1 == "couponseize_batch_size_sum" { s = $2 }
    $1 == "couponseize_batch_size_count" { c = $2 }
    END { printf "%d seizes in %d calls", s, c }' <<<"$body")"

{ cat "$COUPON_DIR/load1.log"; grep -v '^#' "$COUPON_DIR/load2.log"; } >"$COUPON_DIR/load.log"
seize_judge_all "rolling" "$ID" "$COUPON_DIR/load.log"
check_eq "every user got an answer from the service (no 502, 504, nothing dropped)" 0 "$NOANSWER"
check_eq "all $((2 * EACH)) users answered" $((2 * EACH)) "$N"
rows=$(rows_of "$ID")
check "nothing oversold ($rows rows of $TOTAL)" test "$rows" -le "$TOTAL"
check "rows: at least the users told SEIZED, at most those and the UNKNOWN_OUTCOMEs" \
    test "$SEIZED" -le "$rows" -a "$rows" -le $((SEIZED + UNKNOWN))
check "stock + reserves + coupons = total" balanced "$ID" "$TOTAL"
finish
