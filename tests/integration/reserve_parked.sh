#!/usr/bin/env bash
# reserve_parked.sh - a restore keeps out what an operator's return kept out
# (internals.md rules 10 and 16),
# with real servers and every answer judged per user afterwards:
#  node 3, cut off from Redis, grants three users from its reserve; an admin
#  returns its reserve after its lease, keeping its tokens out of stock until
#  it replays. Redis then loses its data (no AOF, no RDB) and the preheat
#  restores the sale: stock = total - coupons - queued - open epochs - what
#  returns keep out for nodes still to replay. The sale sells out on node 1.
#  Node 3 comes back: its three grants take from what was kept out (none goes
#  to the dead letters), the rest goes back to stock, MySQL marks it
#  released, and every user told SEIZED holds exactly one coupon.
#  (b) a sale with an open reserve and no coupon in MySQL yet is restored
#  (stock = total - the open epoch), not started again at its total.
#  (c) a restore that counts tokens twice: node 4 grants five users from its
#  reserve while cut off and replays them (coupons in MySQL; its epoch stays
#  open at its full amount), node 1 sells the rest, then Redis loses its
#  data. total - coupons - the open epoch is -5: the stock is 0 and 5 is a
#  debt that what node 4 gives back pays first; after its graceful stop node
#  1 sells exactly what is left, never more than the total.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

skip_unless_cmd cgi-fcgi || skip_all "cgi-fcgi is not installed (Debian libfcgi-bin)"
K=20
TOTAL=250
LEASE=$((6000 * CS_TIME_SCALE))
export COUPON_WORKERS=2
# Only node 3 sets a reserve aside (K: at most a tenth of the stock); node 1
# sells through Redis alone.
export COUPON_CONF_OVERRIDES="fallback.reserve=0
fallback.lease_ms=$LEASE
${COUPON_CONF_OVERRIDES:-}"
cs_stack_up
ADMIN=$(mint_jwt 1 admin)

dead_of() { rcli HLEN "COUPON:RESERVE:DEAD:{$(($1 % 10))}"; }
# lose_redis: Redis loses everything (no AOF, no RDB); coupon-sync stopped,
# so that no periodic preheat restores before the test asks for one.
lose_redis() {
    stack stop-sync
    stack stop-redis --kill
    rm -rf "$COUPON_DIR/redis/appendonlydir" "$COUPON_DIR/redis/appendonly.aof" \
        "$COUPON_DIR/redis/dump.rdb"
    stack start-redis
}
# restore_of ID: an admin preheat (HTTP_CODE), and its restore's log line of
# activity ID in LINE.
restore_of() {
    local off
    off=$(stat -c %s "$COUPON_DIR/fcgi.log")
    http POST /market/admin/coupon/preheat '' "$ADMIN"
    line=$(tail -c +$((off + 1)) "$COUPON_DIR/fcgi.log" | grep -m1 "activity $1: stock restored to")
}
parked_of() { rcli HGET "COUPON:RESERVE:EPOCH:${1}_{$(($1 % 10))}" "$2:$3:parked"; }

B=4602
mk_activity $B $TOTAL -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
proxy_conf "$COUPON_DIR/n3-proxy.conf"
check "the proxy to Redis for node 3 is up" proxy_up
COUPON_CONF=$COUPON_DIR/n3-proxy.conf node_up n3 workers=1 reserve=$K || finish
INC3=$(cat "$COUPON_DIR/n3/journal/incarnation")
check "node 3 set aside a reserve of $K" wait_for 20 field_is $B n3 $K
check "... and opened it" wait_for 20 reserves_open_on n3
EP3=$(mysql_q "SELECT epoch FROM reserve_epoch WHERE activity_id = $B AND incarnation = '$INC3'")

proxy_kill
check "node 3, cut off, seizes from its reserve" wait_for 10 node_health_says n3 reserve
L3=$COUPON_DIR/n3.log
: >"$L3"
for u in 1 2 3; do seize_on n3 $B $((B * 1000 + u)) "$L3"; done
check_eq "three users were told SEIZED by node 3" 3 "$(grep -c ' SEIZED$' "$L3")"
returned() {
    http POST /market/admin/coupon/reserve/return "{\"id\":$B,\"incarnation\":\"$INC3\"}" "$ADMIN"
    [[ $(json_get "$HTTP_BODY" code) == OK ]]
}
check "an admin returned node 3's reserve after its lease" wait_for 40 returned
diag "the return: $HTTP_BODY"
check_eq "the return kept its $K tokens out of stock" $K "$(json_get "$HTTP_BODY" parked)"
check_eq "MySQL says what the return kept out, not yet released" "2 admin $K NULL" \
    "$(mysql_q "SELECT state, closed_by, parked, COALESCE(released_at, 'NULL') FROM reserve_epoch
        WHERE activity_id = $B AND incarnation = '$INC3' AND epoch = $EP3" | tr '\t' ' ')"

lose_redis
check_eq "Redis came back empty" "" "$(stock_of $B)$(parked_of $B "$INC3" "$EP3")"
restore_of $B
check_eq "the preheat (restore) answers" 200 "$HTTP_CODE"
diag "${line#*: }"
check_match "restore: what the return kept out stays out" \
    "stock restored to $((TOTAL - K)) \\(total $TOTAL, 0 coupons in MySQL, 0 queued, 0 in 0 open node reserves, $K kept out by 1 returns awaiting their node's replay\\)" \
    "$line"
check_eq "... in Redis as the return wrote it" "$((TOTAL - K)) $K $K" \
    "$(stock_of $B) $(held_of $B) $(parked_of $B "$INC3" "$EP3")"
stack start-sync

# The sale sells out on node 1: more users than the stock, one seize each.
LG=$COUPON_DIR/n1.lg
seize_load $B 4 $((TOTAL + 20)) $((B * 1000 + 1000)) -L "$LG" >/dev/null
L1=$COUPON_DIR/n1.log
awk 'NR > 1 { print $4, $3 }' "$LG" >"$L1"
diag "node 1: $(awk '{ n[$2]++ } END { for (c in n) printf "%s:%d ", c, n[c] }' "$L1")"
check_eq "node 1 sold what the restore left, no more" $((TOTAL - K)) "$(grep -c ' SEIZED$' "$L1")"

# Node 3 comes back and replays.
check "the proxy is back" proxy_up
in_list() { [[ $(rcli HEXISTS "COUPON:SEIZE:LIST:${B}_{$((B % 10))}" "$1") == 1 ]]; }
for u in 1 2 3; do
    check "node 3 replayed user $u's grant" wait_for 30 in_list $((B * 1000 + u))
done
parked_gone() { [[ -z $(parked_of $B "$INC3" "$EP3") ]]; }
check "... and released the rest of what was kept out" wait_for 30 parked_gone
check_eq "MySQL marks it released" 1 \
    "$(mysql_q "SELECT released_at IS NOT NULL FROM reserve_epoch WHERE activity_id = $B
        AND incarnation = '$INC3' AND epoch = $EP3")"
check "coupon-sync drained the queue" wait_for 60 drained $((B % 10))
check_eq "nothing went to the dead letters" 0 "$(dead_of $B)"
check_eq "every user told SEIZED holds exactly one coupon, the others none" 0 \
    "$(users_misjudged $B "" "$L3" "$L1")"
check_eq "coupons: node 3's three and node 1's $((TOTAL - K))" $((TOTAL - K + 3)) "$(rows_of $B)"
check "stock + reserves + coupons = total" balanced $B $TOTAL

# --- (b) an open reserve, no coupon yet ------------------------------------------------
C=4603
mk_activity $C $TOTAL -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check "(b) node 3 set aside a reserve of $K" wait_for 20 field_is $C n3 $K
check_eq "(b) MySQL has no coupon of it" 0 "$(rows_of $C)"
lose_redis
restore_of $C
diag "(b) ${line#*: }"
check_match "(b) restore: the open reserve stays out of the stock" \
    "stock restored to $((TOTAL - K)) \\(total $TOTAL, 0 coupons in MySQL, 0 queued, $K in 1 open node reserves\\)" \
    "$line"
check_eq "(b) ... and its field is back" "$((TOTAL - K)) $K" "$(stock_of $C) $(field_of $C n3)"
stack start-sync
check "(b) stock + reserves + coupons = total" balanced $C $TOTAL

# --- (c) counted twice: the debt ------------------------------------------------------
# A node of its own, started after (b)'s restore; node 4 stops first (a
# graceful stop gives its reserves back), so that only node 4 holds one.
# Node 4's keeper stops itself after each pass's replay, before its
# decisions (COUPONSEIZE_PAUSE_AT=keeper-decide), and is let go on again
# until keeper_hold: so it cannot give its reserve back at the low-water mark
# between its replay and Redis' loss.
node_down n3
GO=$COUPON_DIR/keeper-go KEEPER_NODE=n4
cs_defer rm -f "$GO"
COUPON_CONF=$COUPON_DIR/n3-proxy.conf NODE_ENV="COUPONSEIZE_PAUSE_AT=keeper-decide" \
    node_up n4 workers=1 reserve=$K || finish
keeper_go
D=4604
mk_activity $D $TOTAL -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check "(c) node 4 set aside a reserve of $K" wait_for 20 field_is $D n4 $K
check "(c) ... and opened it" wait_for 20 reserves_open_on n4
proxy_kill
check "(c) node 4, cut off, seizes from its reserve" wait_for 10 node_health_says n4 reserve
LC=$COUPON_DIR/c.log
: >"$LC"
for u in 1 2 3 4 5; do seize_on n4 $D $((D * 1000 + u)) "$LC"; done
check_eq "(c) five users were told SEIZED by node 4" 5 "$(grep -c ' SEIZED$' "$LC")"
check "(c) the proxy is back" proxy_up
in_list_d() { [[ $(rcli HEXISTS "COUPON:SEIZE:LIST:${D}_{$((D % 10))}" "$1") == 1 ]]; }
for u in 1 2 3 4 5; do
    check "(c) node 4 replayed user $u's grant" wait_for 30 in_list_d $((D * 1000 + u))
done
check "(c) node 4's keeper is held after a replay" keeper_hold
LG=$COUPON_DIR/c1.lg
seize_load $D 4 $((TOTAL - K + 10)) $((D * 1000 + 1000)) -L "$LG" >/dev/null
awk 'NR > 1 { print $4, $3 }' "$LG" >"$COUPON_DIR/c1.log"
check_eq "(c) node 1 sold the rest of the stock" $((TOTAL - K)) \
    "$(grep -c ' SEIZED$' "$COUPON_DIR/c1.log")"
rows_are() { drained $((D % 10)) && [[ $(rows_of $D) == "$1" ]]; }
check "(c) coupon-sync wrote them all" wait_for 60 rows_are $((TOTAL - K + 5))
lose_redis
restore_of $D
diag "(c) ${line#*: }"
check_match "(c) restore: stock 0 and a debt of what was counted twice" \
    "stock restored to 0 \\(total $TOTAL, $((TOTAL - K + 5)) coupons in MySQL, 0 queued, $K in 1 open node reserves; 5 counted twice" \
    "$line"
stack start-sync
keeper_go
node_down n4
no_field() { [[ -z $(field_of $D n4) ]]; }
check "(c) node 4 gave its reserve back on its graceful stop" wait_for 30 no_field
check_eq "(c) the debt is paid and the rest is stock" " $((K - 5))" \
    "$(rcli HGET "COUPON:RESERVE:{$((D % 10))}" "$D:debt") $(stock_of $D)"
LG2=$COUPON_DIR/c2.lg
seize_load $D 2 $((K + 10)) $((D * 1000 + 5000)) -L "$LG2" >/dev/null
awk 'NR > 1 { print $4, $3 }' "$LG2" >"$COUPON_DIR/c2.log"
check_eq "(c) node 1 then sold what was left, no more" $((K - 5)) \
    "$(grep -c ' SEIZED$' "$COUPON_DIR/c2.log")"
check "(c) coupon-sync wrote them" wait_for 60 rows_are $TOTAL
check_eq "(c) every user told SEIZED holds exactly one coupon, the others none" 0 \
    "$(users_misjudged $D "(c)" "$LC" "$COUPON_DIR/c1.log" "$COUPON_DIR/c2.log")"
check "(c) stock + reserves + coupons = total" balanced $D $TOTAL
finish
