#!/usr/bin/env bash
# reserve_reread.sh - a journal record replayed long ago is read again by a
# restarted keeper (kill -9: a new keeper starts every segment still on disk
# from its first record, and an idle worker keeps its segment). Its sale has
# ended and coupon-sync removed it from Redis, its replay markers with it.
# The user holds the coupon in MySQL: nothing goes to the dead letters.
#  (a) the epoch was given back by the node itself;
#  (b) the epoch was returned by an admin while the node was cut off (rule 16:
#      the tokens kept out of stock, the node's replay takes from them).
# Each sale ends (end_soon) once its user holds the coupon, not at a window
# fixed in advance.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

skip_unless_cmd cgi-fcgi || skip_all "cgi-fcgi is not installed (Debian libfcgi-bin)"
K=20
LEASE=$((6000 * CS_TIME_SCALE))
export COUPON_WORKERS=2
export COUPON_CONF_OVERRIDES="fallback.reserve=$K
fallback.lease_ms=$LEASE
sync.cleanup_grace_s=0
sync.status_interval_s=1
${COUPON_CONF_OVERRIDES:-}"
cs_stack_up
ADMIN=$(mint_jwt 1 admin)

no_stock_field() { [[ -z $(stock_of "$1") ]]; }
in_list() { [[ $(rcli HEXISTS "COUPON:SEIZE:LIST:${1}_{$(($1 % 10))}" "$2") == 1 ]]; }
has_coupon() { [[ $(coupons_of "$1" "$2") == 1 ]]; }
epochs_gone() { [[ $(rcli EXISTS "COUPON:RESERVE:EPOCH:${1}_{$(($1 % 10))}") == 0 ]]; }
segments() { compgen -G "$COUPON_DIR/$1/journal/w*-*.jnl" || true; }
dead_of() { rcli HLEN "COUPON:RESERVE:DEAD:{$(($1 % 10))}"; }
keeper_of() { # NODE: the child of its supervisor that holds the journal lock
    local p pid=NODE_PID_$1
    for p in $(pgrep -P "${!pid}"); do
        ls -l "/proc/$p/fd" 2>/dev/null | grep -q "$COUPON_DIR/$1/journal/lock" && echo "$p"
    done
}
new_keeper() { local k; k=$(keeper_of "$1"); [[ -n $k && $k != "$2" ]]; }
lease_of() { rcli HGET "COUPON:RESERVE:{$(($2 % 10))}" "lease:$(cat "$COUPON_DIR/$1/journal/incarnation")"; }
lease_past() { (($(lease_of "$1" "$2") > $3)); }
# restart_keeper NODE ID: kill -9 NODE's keeper; once the supervisor's new
# one has renewed the lease of ID's shard twice, a whole pass of it (renew,
# replay, decide) has run.
restart_keeper() {
    local k l
    k=$(keeper_of "$1")
    diag "$1: keeper $k killed; segments: $(segments "$1" | xargs -n1 basename | tr '\n' ' ')"
    kill -KILL "$k"
    check "$1: the supervisor started a new keeper" wait_for 20 new_keeper "$1" "$k"
    l=$(lease_of "$1" "$2")
    wait_for 20 lease_past "$1" "$2" "${l:-0}" || not_ok "$1: the new keeper renewed its lease"
    l=$(lease_of "$1" "$2")
    check "$1: the new keeper ran a whole pass" wait_for 20 lease_past "$1" "$2" "$l"
}

# --- (a) an epoch the node gave back itself --------------------------------------------
X=4501
node_up n2 workers=1
mk_activity $X 1000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check "(a) n2 set aside a reserve of X" wait_for 20 field_is $X n2 $K
check "(a) ... and opened it" wait_for 20 reserves_open_on n2
L=$COUPON_DIR/a.log
: >"$L"
stack stop-redis --kill
check "(a) n2 seizes from its reserve while Redis is down" wait_for 5 node_health_says n2 reserve
UX=$((X * 1000 + 1))
seize_on n2 $X $UX "$L"
check_eq "(a) the user was told SEIZED" "$UX SEIZED" "$(cat "$L")"
stack start-redis
# No request to n2 from here on: its one worker keeps its segment.
check "(a) n2 replayed the grant" wait_for 30 in_list $X $UX
check "(a) the user holds the coupon in MySQL" wait_for 60 has_coupon $X $UX
end_soon $X
wait_past_ms "$(end_ms $X)"
check "(a) X ended, n2 gave its reserve back, coupon-sync removed X" wait_for 60 no_stock_field $X
check "(a) ... and its markers" wait_for 20 epochs_gone $X
check "(a) n2's segment is still there" test -n "$(segments n2)"
restart_keeper n2 $X
check_eq "(a) no dead letter for X" 0 "$(dead_of $X)"
check_eq "(a) ... and the user still holds one coupon" 1 "$(coupons_of $X $UX)"

# --- (b) an epoch an admin returned while the node was cut off -------------------------
proxy_conf "$COUPON_DIR/n3-proxy.conf"
check "(b) the proxy to Redis for n3 is up" proxy_up
B=4502
mk_activity $B 1000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
COUPON_CONF=$COUPON_DIR/n3-proxy.conf node_up n3 workers=1 || finish
INC3=$(cat "$COUPON_DIR/n3/journal/incarnation")
check "(b) n3 set aside a reserve of B" wait_for 20 field_is $B n3 $K
check "(b) ... and opened it" wait_for 20 reserves_open_on n3
proxy_kill
check "(b) n3, cut off, seizes from its reserve" wait_for 10 node_health_says n3 reserve
UB=$((B * 1000 + 1))
L=$COUPON_DIR/b.log
: >"$L"
seize_on n3 $B $UB "$L"
check_eq "(b) the user was told SEIZED" "$UB SEIZED" "$(cat "$L")"
returned() {
    http POST /market/admin/coupon/reserve/return "{\"id\":$B,\"incarnation\":\"$INC3\"}" "$ADMIN"
    [[ $(json_get "$HTTP_BODY" code) == OK ]]
}
check "(b) an admin returned n3's reserve of B after its lease" wait_for 40 returned
diag "(b) the return: $HTTP_BODY"
check "(b) the proxy is back" proxy_up
# No request to n3 from here on.
check "(b) n3 replayed the grant (from what the return kept out)" wait_for 30 in_list $B $UB
parked_gone() { [[ -z $(rcli HGET "COUPON:RESERVE:EPOCH:${B}_{$((B % 10))}" "$INC3:1:parked") ]]; }
check "(b) ... and released the rest" wait_for 20 parked_gone
check "(b) the user holds the coupon in MySQL" wait_for 60 has_coupon $B $UB
end_soon $B
wait_past_ms "$(end_ms $B)"
check "(b) B ended and coupon-sync removed it" wait_for 60 no_stock_field $B
check "(b) ... and its markers" wait_for 20 epochs_gone $B
check "(b) n3's segment is still there" test -n "$(segments n3)"
restart_keeper n3 $B
check_eq "(b) no dead letter for B" 0 "$(dead_of $B)"
check_eq "(b) ... and the user still holds one coupon" 1 "$(coupons_of $B $UB)"
grep "dead letters\|coupon is in MySQL" "$COUPON_DIR/n3/fcgi.log" | sed 's/^/#   n3: /'
finish
