#!/usr/bin/env bash
# reserve_closed.sh - a keeper restarted (kill -9) on segments that still
# hold the records of an epoch its node replayed and gave back (an idle
# worker keeps its segment) rebuilds those users' grants from them. The
# records are marked replayed, so the status route on that node calls each
# user's coupon persisted, not pending, as MySQL holds it (nemesis seed 71,
# judged unsettled: status said pending for a coupon in MySQL).
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

K=4
LEASE=$((6000 * CS_TIME_SCALE))
export COUPON_CONF_OVERRIDES="fallback.reserve=$K
fallback.lease_ms=$LEASE
sync.status_interval_s=1
${COUPON_CONF_OVERRIDES:-}"
cs_stack_up

A=4711
SHARD=$((A % 10))
in_list() { [[ $(rcli HEXISTS "COUPON:SEIZE:LIST:${A}_{$SHARD}" "$1") == 1 ]]; }
has_coupon() { [[ $(coupons_of $A "$1") == 1 ]]; }
segments() { compgen -G "$COUPON_DIR/n2/journal/w*-*.jnl" || true; }
keeper_of() { # the child of n2's supervisor that holds the journal lock
    local p
    for p in $(pgrep -P "$NODE_PID_n2"); do
        ls -l "/proc/$p/fd" 2>/dev/null | grep -q "$COUPON_DIR/n2/journal/lock" && echo "$p"
    done
}
new_keeper() { local k; k=$(keeper_of); [[ -n $k && $k != "$1" ]]; }
lease_of() { rcli HGET "COUPON:RESERVE:{$SHARD}" "lease:$(cat "$COUPON_DIR/n2/journal/incarnation")"; }
lease_past() { (($(lease_of) > $1)); }
given_back() { grep -q "activity $A epoch 1: [0-9]* given back" "$COUPON_DIR/n2/fcgi.log"; }
closed_in_mysql() {
    [[ $(mysql_q "SELECT COUNT(*) FROM reserve_epoch WHERE activity_id = $A AND epoch = 1 AND state = 2 AND closed_by = 'node' AND incarnation = '$(cat "$COUPON_DIR/n2/journal/incarnation")'") == 1 ]]
}

node_up n2 workers=1 || finish
mk_activity $A 100000 -60 3600
http POST /market/admin/coupon/preheat '' "$(mint_jwt 1 admin)"
check "n2 set aside a reserve of $K" wait_for 20 field_is $A n2 $K
check "... and opened it" wait_for 20 reserves_open_on n2

# Redis gone: n2 spends its whole reserve, one token a user.
stack stop-redis --kill
check "n2 seizes from its reserve while Redis is down" wait_for 5 node_health_says n2 reserve
L=$COUPON_DIR/seize.log
: >"$L"
for ((u = 1; u <= K; u++)); do seize_on n2 $A $((A * 1000 + u)) "$L"; done
check_eq "each of the $K users was told SEIZED" "$K" "$(grep -c ' SEIZED$' "$L")"
stack start-redis

# No request to n2 from here on: its one worker keeps its segment.
for ((u = 1; u <= K; u++)); do
    check "user $((A * 1000 + u)): n2 replayed the grant" wait_for 30 in_list $((A * 1000 + u))
    check "user $((A * 1000 + u)): the coupon is in MySQL" wait_for 60 has_coupon $((A * 1000 + u))
done
check "n2 gave the spent epoch back" wait_for 30 given_back
check "... and MySQL has it closed" closed_in_mysql
check "n2's segment with its records is still there" test -n "$(segments)"

k=$(keeper_of)
diag "keeper $k killed; segments: $(segments | xargs -n1 basename | tr '\n' ' ')"
kill -KILL "$k"
check "the supervisor started a new keeper" wait_for 20 new_keeper "$k"
# Two renewals of the lease after the new keeper started: one whole pass
# (renew, rebuild and replay, decide) has run.
l=$(lease_of)
wait_for 20 lease_past "${l:-0}" || not_ok "the new keeper renewed its lease"
l=$(lease_of)
check "the new keeper ran a whole pass" wait_for 20 lease_past "$l"

for ((u = 1; u <= K; u++)); do
    uid=$((A * 1000 + u))
    node_http n2 GET "/market/consumer/coupon/status?id=$A" '' "$(mint_jwt $uid)"
    pending=no
    [[ $(jat "$HTTP_BODY" mine.pending) == true ]] && pending=yes
    check_eq "user $uid: status on n2 says seized, persisted, not pending ($HTTP_BODY)" \
        "true true no" "$(jat "$HTTP_BODY" mine.seized) $(jat "$HTTP_BODY" mine.persisted) $pending"
    check_eq "user $uid still holds one coupon" 1 "$(coupons_of $A $uid)"
done
check_eq "no dead letter" 0 "$(rcli HLEN "COUPON:RESERVE:DEAD:{$SHARD}")"
finish
