#!/usr/bin/env bash
# reserve_clock.sh - an admin's return of a lost node's reserve waits for the
# node's lease by a clock that only counts real time (internals.md rule 16),
# not by Redis' TIME alone, a wall clock that may jump (NTP) or belong to
# another host after a failover.
#
# Node 2 spends by a lease of 6 s (x CS_TIME_SCALE) and is killed (kill -9).
# Its last lease stamp then reads an hour older than Redis' clock, as after a
# failover to a master whose clock is an hour ahead of the old one (the stamp
# is rewritten so: libfaketime cannot start redis-server). By Redis' clock
# node 2's lease ran out an hour ago. A return with the journal declared lost (everything back to
# stock: the one that would unmake grants node 2 could still be making) is
# refused with 409 LEASE_NOT_EXPIRED and a Retry-After, and done only once
# node 2's lease has passed by the admin node's CLOCK_BOOTTIME since it last
# saw node 2's stamp change. The list shows how long that is
# (leaseWatchedMs).
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

skip_unless_cmd cgi-fcgi || skip_all "cgi-fcgi is not installed (Debian libfcgi-bin)"
[[ -n $(ls /usr/lib/*/faketime/libfaketimeMT.so.1 2>/dev/null) ]] ||
    skip_all "libfaketime is not installed (Debian: faketime)"
K=20
export COUPON_WORKERS=2
export COUPON_CONF_OVERRIDES="fallback.reserve=$K
fallback.lease_ms=2000
${COUPON_CONF_OVERRIDES:-}"
cs_stack_up
ADMIN=$(mint_jwt 1 admin)
RETURN=/market/admin/coupon/reserve/return

A=4701
LEASE=$((6000 * CS_TIME_SCALE))
INC=""
return_lost() {
    http POST "$RETURN" "{\"id\":$A,\"incarnation\":\"$INC\",\"journalLost\":true}" "$ADMIN"
}
returned_ok() { return_lost; [[ $(json_get "$HTTP_BODY" code) == OK ]]; }
# answered: a return that is not a 503 (a worker whose Redis connection died
# with Redis answers its first request so).
answered() { return_lost; [[ $HTTP_CODE != 503 ]]; }
# watched_ms: what the list says of node 2's stamp, as "leaseExpired leaseWatchedMs".
watched() {
    http GET "/market/admin/coupon/reserves?id=$A" '' "$ADMIN"
    testkit json-find "$HTTP_BODY" reserves incarnation "$INC" leaseExpired leaseWatchedMs
}

node_up n2 lease_ms=$LEASE
INC=$(cat "$COUPON_DIR/n2/journal/incarnation")
mk_activity $A 1000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check "node 2 set aside its reserve" wait_for 20 field_is $A n2 $K
check "... and opened it" wait_for 20 reserves_open_on n2
# The keeper of node 1 (the admin's node) has read node 2's stamp change.
seen_renewing() { [[ $(watched) == "false "* ]]; }
check "the admin's node watches node 2's lease" wait_for 10 seen_renewing
node_down n2 KILL
T_KILL=$(date +%s%3N)
RKEY="COUPON:RESERVE:{$((A % 10))}"
now_s=$(rcli TIME | head -n1)
rcli HSET "$RKEY" "lease:$INC" $(((now_s - 3600) * 1000)) >/dev/null
check "node 2's stamp reads an hour behind Redis' clock" \
    test "$(($(rcli TIME | head -n1) * 1000 - $(rcli HGET "$RKEY" "lease:$INC")))" -ge 3600000
check "a return is answered" wait_for 20 answered
T_FIRST=$(date +%s%3N)
if ((T_FIRST - T_KILL < LEASE)); then
    check_eq "within node 2's lease by real time, though Redis' clock says it ended an hour ago: 409 LEASE_NOT_EXPIRED" \
        "409 LEASE_NOT_EXPIRED" "$HTTP_CODE $(json_get "$HTTP_BODY" code)"
    check_match "... with a Retry-After" "^Retry-After: [0-9]" "$(grep -i '^retry-after' <<<"$HTTP_HEADERS")"
else
    diag "the first return came $((T_FIRST - T_KILL)) ms after the kill, past the lease: not judged"
fi
diag "first answer: $HTTP_CODE $HTTP_BODY"
read -r expired watched_ms <<<"$(watched)"
check_eq "the list: not expired yet, by this node's watch" false "$expired"
check "... which has seen node 2's stamp unchanged for some ms" test "${watched_ms:-x}" -ge 0
check "after node 2's lease the return is done" wait_for 60 returned_ok
T_OK=$(date +%s%3N)
diag "the return: $HTTP_BODY (done $((T_OK - T_KILL)) ms after the kill)"
check "... not before node 2's lease had passed since it was killed" test $((T_OK - T_KILL)) -ge "$LEASE"
check_eq "... everything went back to stock (journal declared lost)" "$K true" \
    "$(json_get "$HTTP_BODY" returned) $(json_get "$HTTP_BODY" journalLost)"
check "stock + reserves + coupons = total" balanced $A 1000
finish
