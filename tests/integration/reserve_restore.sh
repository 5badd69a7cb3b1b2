#!/usr/bin/env bash
# reserve_restore.sh - restore and give-back do not interleave (internals.md
# rule 18), with real servers:
#  (a) the moment inside a restore after the reserve fields are back and
#      before the stock field is: node 2's reserve field is in Redis, its
#      sale's stock field is not. The keeper renews through it and gives
#      nothing back (no give-back runs against a missing stock field); once
#      the stock field is back the reserve is still open in Redis and MySQL,
#      nothing went missing (stock + reserves + coupons = total), and node 2
#      still grants its K coupons in an outage, each honoured once.
#  (b) a return whose Redis half ran (reserve field gone, epoch closed in
#      Redis, what the node held kept out of stock) and whose MySQL step did
#      not: node 2 (alive) takes its epoch as closed, drops it and, nothing
#      being left to replay, puts what was kept out back in the stock; it
#      does not wait for a restore that never comes.
# (Since the restore now writes stock and reserve fields in one script, that
# moment no longer happens in a restore; tests/integration/reserve_fence.sh
# (g3) runs a real restore.)
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

skip_unless_cmd cgi-fcgi || skip_all "cgi-fcgi is not installed (Debian libfcgi-bin)"
K=20
export COUPON_WORKERS=2
# The lease scales with the machine: a busy run's slow fsyncs and seizes
# outlasted 30 s before the reserve was spent (19 of 20 granted, then
# UNAVAILABLE, a token left).
export COUPON_CONF_OVERRIDES="fallback.reserve=$K
fallback.lease_ms=$((30000 * CS_TIME_SCALE))
${COUPON_CONF_OVERRIDES:-}"
cs_stack_up
ADMIN=$(mint_jwt 1 admin)


A=4401
node_up n2
INC2=$(cat "$COUPON_DIR/n2/journal/incarnation")
mk_activity $A 1000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check "(a) node 2 set aside a reserve of $K" wait_for 20 field_is $A n2 $K
check "(a) ... and opened it" wait_for 20 reserves_open_on n2
SKEY="COUPON:RESOURCE:STOCK:{$((A % 10))}"
stock=$(rcli HGET "$SKEY" $A)
# A restore that wrote the reserve fields and not yet the stock field: 2 s
# of it, twenty keeper passes.
rcli HDEL "$SKEY" $A >/dev/null
sleep 2
rcli HSET "$SKEY" $A "$stock" >/dev/null
check_eq "(a) node 2's reserve is still in Redis, whole" "$K" "$(field_of $A n2)"
check_eq "(a) ... and its epoch still open in MySQL" 1 \
    "$(mysql_q "SELECT state FROM reserve_epoch WHERE activity_id = $A AND incarnation = '$INC2'")"
check_eq "(a) no give-back ran without a stock field" "" \
    "$(grep 'giving back its reserve (no stock field)' "$COUPON_DIR/n2/fcgi.log")"
check "(a) stock + reserves + coupons = total" balanced $A 1000

# What node 2 holds is still there to sell in an outage.
check "(a) node 2's reserve is open" wait_for 20 reserves_open_on n2
L=$COUPON_DIR/a.log
: >"$L"
stack stop-redis --kill
check "(a) node 2 seizes from its reserve while Redis is down" \
    wait_for 5 node_health_says n2 reserve
# Until the reserve is spent, then two more. A grant whose fsync outlasts
# the answer budget (a loaded disk) is UNKNOWN_OUTCOME and may hold a token.
S=0 U=0 after=0
for ((u = 1; u <= 2 * K + 2 && after < 2; u++)); do
    seize_settled $A "$(mint_jwt $((A * 1000 + u)))" n2
    echo "$((A * 1000 + u)) $SEIZE_CODE" >>"$L"
    case $SEIZE_CODE in
    SEIZED) S=$((S + 1)) ;;
    UNKNOWN_OUTCOME) U=$((U + 1)) ;;
    *) ((S + U >= K)) && after=$((after + 1)) ;;
    esac
done
diag "(a) answers: $(awk '{ n[$2]++ } END { for (c in n) printf "%s:%d ", c, n[c] }' "$L")"
check "(a) node 2 granted its $K coupons (SEIZED $S, UNKNOWN_OUTCOME $U)" \
    test "$S" -le "$K" -a $((S + U)) -ge "$K"
((S + U >= K)) || diag "(a) node 2: $(grep -E "warning|error" "$COUPON_DIR/n2/fcgi.log" | tail -n 5)"
stack start-redis
check "(a) node 2 replayed its journal" wait_for 20 metric_is couponseize_journal_depth 0 n2
check "(a) coupon-sync drained the queue" wait_for 60 drained $((A % 10))
check_eq "(a) every user told SEIZED holds exactly one coupon, one refused none" 0 \
    "$(users_misjudged $A "(a)" "$L")"
check "(a) after it: stock + reserves + coupons = total" balanced $A 1000

# --- (b) a return half done: closed in Redis, open in MySQL -----------------------------------
B=4402
mk_activity $B 1000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check "(b) node 2 set aside a reserve of $B" wait_for 20 field_is $B n2 $K
check "(b) ... and opened it" wait_for 20 reserves_open_on n2
EPB=$(mysql_q "SELECT epoch FROM reserve_epoch WHERE activity_id = $B AND incarnation = '$INC2'")
epochs0=$(metric couponseize_reserve_epochs n2)
stock0=$(stock_of $B)
# What the give-back script does for an admin, without the MySQL step after it.
rcli EVAL "redis.call('HDEL', KEYS[1], ARGV[1] .. ':' .. ARGV[2])
    redis.call('HSET', KEYS[2], ARGV[2] .. ':' .. ARGV[3], 'closed')
    redis.call('HSET', KEYS[2], ARGV[2] .. ':' .. ARGV[3] .. ':parked', ARGV[4])
    redis.call('HINCRBY', KEYS[1], ARGV[1], -1)" 2 "COUPON:RESERVE:{$((B % 10))}" \
    "COUPON:RESERVE:EPOCH:${B}_{$((B % 10))}" $B "$INC2" "$EPB" $K >/dev/null
# Dropped: one epoch fewer, or as many again once the freed slot let the
# keeper set a new reserve aside for the sale (it may do so within ms, so
# the dip alone can pass between two polls).
dropped() {
    metric_is couponseize_reserve_epochs $((epochs0 - 1)) n2 && return 0
    metric_is couponseize_reserve_epochs "$epochs0" n2 \
        && [[ -n $(mysql_q "SELECT epoch FROM reserve_epoch WHERE activity_id = $B
            AND incarnation = '$INC2' AND epoch > $EPB LIMIT 1") ]]
}
check "(b) node 2 dropped the epoch closed in Redis" wait_for 10 dropped
check "(b) ... and logged why" grep -q "activity $B epoch $EPB was closed in Redis" \
    "$COUPON_DIR/n2/fcgi.log"
# Released: the parked count is gone from the epochs hash and out of
# ':held', which then holds only the open reserve fields. Not "stock back to
# stock0 + K": the freed slot lets the keeper set a new reserve aside for the
# sale, before or after the release, and that takes K from stock again.
EKEY="COUPON:RESERVE:EPOCH:${B}_{$((B % 10))}"
open_fields() {
    local f v sum=0
    while read -r f v; do
        [[ $f == "$B:"* && $f != *:held ]] && sum=$((sum + v))
    done < <(rcli HGETALL "COUPON:RESERVE:{$((B % 10))}" | paste - -)
    echo $sum
}
released() {
    [[ -z $(rcli HGET "$EKEY" "$INC2:$EPB:parked") ]] && (($(held_of $B) == $(open_fields)))
}
check "(b) what the return kept out of stock is back in it" wait_for 60 released
diag "(b) node 2 after the release: $(grep -E "activity $B( |:)" "$COUPON_DIR/n2/fcgi.log" \
    | grep -E 'kept out of stock are back|set aside' | tail -3 | tr '\n' ' ')"
check "(b) stock + reserves + coupons = total" balanced $B 1000

finish
