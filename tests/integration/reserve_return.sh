#!/usr/bin/env bash
# reserve_return.sh - an operator's return never unmakes a grant (internals.md
# rule 16), with real servers, kill -9 and every answer judged per user
# afterwards:
#  (a) node 2 spends by a 10 s lease (x CS_TIME_SCALE), the node answering
#      the admin by 2 s.
#      Redis is killed, node 2 grants three coupons and is killed (kill -9)
#      before it could replay; Redis is back. The return waits for node 2's
#      own lease (published with its lease stamp), not the caller's; then it
#      closes the epoch and keeps what node 2 may have granted out of stock.
#      The sale sells out, not for good while those tokens are parked (no
#      final SOLD_OUT); node 2 comes back and replays: its three users
#      hold their coupons, nothing goes to the dead letters, and what it did
#      not grant goes back to stock;
#  (b) a return with the journal declared lost puts everything back at once,
#      and the answer, the audit row, the log (error) and a metric say that
#      the node's unreplayed grants are lost with it;
#  (c) a grant whose fsync ends after the node's lease (the worker's
#      fdatasync held by strace a second past a lease of 5 s x
#      CS_TIME_SCALE) is answered UNKNOWN_OUTCOME,
#      not SEIZED; it is on disk and replayed like any other;
#  (d) the same with Redis back (the lease renewed) before the fsync ends:
#      still UNKNOWN_OUTCOME, the grant was made under the lease checked
#      before it, not the renewal.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

skip_unless_cmd cgi-fcgi || skip_all "cgi-fcgi is not installed (Debian libfcgi-bin)"
[[ -x $LOADGEN ]] || skip_all "tests/bench/loadgen is not built (make check builds it)"
K=20
export COUPON_WORKERS=2
export COUPON_CONF_OVERRIDES="fallback.reserve=$K
fallback.lease_ms=2000
${COUPON_CONF_OVERRIDES:-}"
cs_stack_up
ADMIN=$(mint_jwt 1 admin)
RETURN=/market/admin/coupon/reserve/return

# return_of ID NODE [LOST]: an admin's return of node NODE's reserve of ID.
return_of() {
    local inc
    inc=$(cat "$COUPON_DIR/$2/journal/incarnation")
    http POST "$RETURN" "{\"id\":$1,\"incarnation\":\"$inc\"${3:+,\"journalLost\":true}}" "$ADMIN"
}
returned_ok() { return_of "$@"; [[ $(json_get "$HTTP_BODY" code) == OK ]]; }
# return_settled ...: return_of, asked again while 503 (a worker whose Redis
# connection died with Redis answers its first request so).
return_settled() {
    local i
    for i in 1 2 3 4 5; do
        return_of "$@"
        [[ $HTTP_CODE != 503 ]] && return 0
        sleep 0.2
    done
}

# --- (a) the node's own lease; possibly spent tokens stay out of stock --------------------
A=4601
LEASE_A=$((10000 * CS_TIME_SCALE))
node_up n2 lease_ms=$LEASE_A
mk_activity $A 300 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check "(a) node 2 set aside its reserve" wait_for 20 field_is $A n2 $K
check "(a) ... and opened it" wait_for 20 reserves_open_on n2
L=$COUPON_DIR/a.log
: >"$L"
stack stop-redis --kill
T_CUT=$(date +%s%3N)
check "(a) node 2 seizes from its reserve while Redis is down" \
    wait_for 5 node_health_says n2 reserve
for u in 1 2 3; do seize_on n2 $A $((A * 1000 + u)) "$L"; done
check_eq "(a) node 2 told three users SEIZED" 3 "$(grep -c ' SEIZED$' "$L")"
node_down n2 KILL
stack start-redis
return_settled $A n2
check_eq "(a) within node 2's $((LEASE_A / 1000)) s lease (the caller's is 2 s): 409 LEASE_NOT_EXPIRED" \
    "409 LEASE_NOT_EXPIRED" "$HTTP_CODE $(json_get "$HTTP_BODY" code)"
check_eq "(a) ... judged by node 2's lease" "$LEASE_A" "$(json_get "$HTTP_BODY" leaseMs)"
check "(a) after node 2's lease the return is done" wait_for 30 returned_ok $A n2
diag "(a) the return: $HTTP_BODY"
check_eq "(a) nothing went back to stock; node 2's $K tokens are kept out" "0 $K false" \
    "$(json_get "$HTTP_BODY" returned) $(json_get "$HTTP_BODY" parked) $(json_get "$HTTP_BODY" journalLost)"
check "(a) stock + reserves + coupons = total" balanced $A 300
# The sale sells out through Redis and node 1.
seize_load $A 8 600 $((A * 1000 + 100)) >"$COUPON_DIR/a.json"
sold_out() { [[ $(stock_of $A) == 0 ]]; }
# Node 1 gives its reserve back at the low-water mark, perhaps only once the
# load is over: what it gives back is sold by more rounds.
for r in 1 2 3; do
    sleep 1
    sold_out && break
    seize_load $A 8 100 $((A * 1000 + 700 + r * 100)) >>"$COUPON_DIR/a.json"
done
check "(a) the sale sold out" wait_for 30 sold_out
# Node 1's reserve went back at the low-water mark; node 2's tokens stay
# parked until it replays: they may come back, so sold out is not final.
http POST /market/consumer/coupon/seize "{\"id\":$A}" "$(mint_jwt $((A * 1000 + 99)))"
check_eq "(a) with node 2's tokens parked, SOLD_OUT is not final" "409 SOLD_OUT false" \
    "$HTTP_CODE $(json_get "$HTTP_BODY" code) $(json_get "$HTTP_BODY" final)"
node_up n2 lease_ms=$LEASE_A
check "(a) node 2 replayed its journal" wait_for 30 metric_is couponseize_journal_depth 0 n2
released() { [[ $(stock_of $A) == $((K - 3)) ]]; }
check "(a) what node 2 did not grant went back to stock" wait_for 60 released
check "(a) coupon-sync drained the queue" wait_for 60 drained $((A % 10))
bad=0
for u in 1 2 3; do
    n=$(coupons_of $A $((A * 1000 + u)))
    [[ $n == 1 ]] || { bad=$((bad + 1)); diag "(a) user $((A * 1000 + u)) was told SEIZED and holds $n"; }
done
check_eq "(a) node 2's users, told SEIZED, each hold exactly one coupon" 0 "$bad"
check_eq "(a) nothing went to the dead letters" "0 0" \
    "$(metric couponseize_reserve_dead_letters_total n2) $(rcli HLEN "COUPON:RESERVE:DEAD:{$((A % 10))}")"
check "(a) stock + reserves + coupons = total" balanced $A 300
check_eq "(a) never oversold" 1 $(($(rows_of $A) <= 300))

# --- (b) the journal declared lost ----------------------------------------------------
B=4602
node_up n3
mk_activity $B 1000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check "(b) node 3 set aside its reserve" wait_for 20 field_is $B n3 $K
check "(b) ... and opened it" wait_for 20 reserves_open_on n3
LB=$COUPON_DIR/b.log
: >"$LB"
stack stop-redis --kill
check "(b) node 3 seizes from its reserve while Redis is down" \
    wait_for 5 node_health_says n3 reserve
for u in 1 2; do seize_on n3 $B $((B * 1000 + u)) "$LB"; done
node_down n3 KILL
stack start-redis
s0=$(stock_of $B)
check "(b) the return with the journal declared lost is done" wait_for 20 returned_ok $B n3 lost
diag "(b) the return: $HTTP_BODY"
check_eq "(b) everything went back to stock" "$K 0 true" \
    "$(json_get "$HTTP_BODY" returned) $(json_get "$HTTP_BODY" parked) $(json_get "$HTTP_BODY" journalLost)"
check_eq "(b) the stock rose by $K" $((s0 + K)) "$(stock_of $B)"
check_match "(b) the answer says the grants are lost" "lost with it" "$(json_get "$HTTP_BODY" msg)"
check_match "(b) ... so does the audit row" "journal declared lost.*lost with it" \
    "$(mysql_q "SELECT message FROM admin_audit WHERE activity_id = $B ORDER BY id DESC LIMIT 1")"
check "(b) ... and the log, at error level" \
    grep -q "error.*activity $B.*journal declared lost" "$COUPON_DIR/fcgi.log"
check_eq "(b) ... and a metric" 1 "$(metric couponseize_reserve_journals_declared_lost_total)"

# --- (c) a grant whose fsync ends after the lease ------------------------------------------
C=4603
# The lease scales with the machine: the first grant, the breaker's
# opening and strace's attach all come within it; each held fsync ends a
# second or two after it.
LEASE_C=$((5000 * CS_TIME_SCALE))
node_up n4 lease_ms=$LEASE_C workers=1
mk_activity $C 1000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check "(c) node 4 set aside its reserve" wait_for 20 field_is $C n4 $K
check "(c) ... and opened it" wait_for 20 reserves_open_on n4
W=""
for p in $(pgrep -P "$NODE_PID_n4"); do
    ls -l "/proc/$p/fd" 2>/dev/null | grep -q "journal/lock" || W=$p
done
jbytes() { cat "$COUPON_DIR"/n4/journal/w*-*.jnl 2>/dev/null | wc -c; }
if command -v strace >/dev/null && [[ -n $W ]]; then
    stack stop-redis --kill
    check "(c) node 4 seizes from its reserve while Redis is down" \
        wait_for 5 node_health_says n4 reserve
    seize_settled $C "$(mint_jwt $((C * 1000 + 1)))" n4
    check_eq "(c) a grant within the lease: SEIZED" SEIZED "$SEIZE_CODE"
    strace -qq -o /dev/null -p "$W" -e trace=fdatasync -e inject=fdatasync:delay_enter=$(((LEASE_C + 1000) * 1000)) &
    SPID=$!
    cs_defer stop_bg "$SPID"
    sleep 0.5
    NODE_HTTP_TIMEOUT=$((LEASE_C / 1000 + 12)) \
        node_http n4 POST /market/consumer/coupon/seize "{\"id\":$C}" "$(mint_jwt $((C * 1000 + 2)))"
    check_eq "(c) an fsync that ended after the lease: UNKNOWN_OUTCOME, not SEIZED" \
        UNKNOWN_OUTCOME "$(json_get "$HTTP_BODY" code)"
    check_eq "(c) ... though its record is on disk (two records)" 88 "$(jbytes)"
    stop_bg "$SPID"
    stack start-redis
    check "(c) node 4 replayed both grants" wait_for 20 metric_is couponseize_journal_depth 0 n4

    # (d) The same slow fsync, with Redis back (the lease renewed) before it
    # ends: the grant was made under the lease checked before it, which is
    # over by then; the renewal does not cover it.
    check "(d) node 4's reserve is open again" wait_for 20 reserves_open_on n4
    stack stop-redis --kill
    check "(d) node 4 seizes from its reserve while Redis is down" \
        wait_for 5 node_health_says n4 reserve
    strace -qq -o /dev/null -p "$W" -e trace=fdatasync -e inject=fdatasync:delay_enter=$(((LEASE_C + 2000) * 1000)) &
    SPID=$!
    cs_defer stop_bg "$SPID"
    sleep 0.5
    LD=$COUPON_DIR/d.log
    : >"$LD"
    ( NODE_HTTP_TIMEOUT=$((LEASE_C / 1000 + 12)) \
        node_http n4 POST /market/consumer/coupon/seize "{\"id\":$C}" "$(mint_jwt $((C * 1000 + 3)))"
      echo "$(json_get "$HTTP_BODY" code)" >"$LD" ) &
    QPID=$!
    sleep 1
    stack start-redis
    # Node 4's one worker is held in its fsync: the keeper's renewals are
    # judged by Redis answering, and a second of keeper passes.
    redis_up() { [[ $(rcli PING 2>/dev/null) == PONG ]]; }
    check "(d) Redis is back during the fsync" wait_for 5 redis_up
    sleep 1
    wait "$QPID"
    stop_bg "$SPID"
    check_eq "(d) an fsync that ended after the lease it was granted under, the lease renewed meanwhile: UNKNOWN_OUTCOME" \
        UNKNOWN_OUTCOME "$(cat "$LD")"
    check "(d) node 4 replayed the grant" wait_for 20 metric_is couponseize_journal_depth 0 n4
    check_match "(d) its user holds at most one coupon" '^[01]$' "$(coupons_of $C $((C * 1000 + 3)))"
else
    diag "(c) strace is not installed: not judged"
fi

finish
