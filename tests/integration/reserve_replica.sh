#!/usr/bin/env bash
# reserve_replica.sh - with redis.wait_replicas set, a lease renewal makes a
# node's reserve spendable only once the durability rule holds for it
# (internals.md rules 15 and 16).
#
# An admin's return of a lost node's reserve judges the node's lease by the
# stamp the node's renewals write. A renewal that only the master holds is
# lost with it in a failover: the new master shows an older stamp, and the
# return could come while the node still spends by the renewal the old master
# acknowledged. So a renewal (and the incarnation's claim) that the replicas
# do not confirm must not extend the lease.
#
# Node 2 (reserve K, lease 3 s x CS_TIME_SCALE, wait_replicas 1) renews on a
# master whose replica is frozen (SIGSTOP): every renewal is answered, none
# is replicated. Past one lease, node 2 is cut off from Redis and seizes:
# its lease ran out with the last renewal the replica has, so nothing is
# granted from the reserve and every user is told so (and holds nothing).
# The same cut with the replica running first: the reserve sells, as the
# part above would without this rule. (e): the incarnation's claim, answered
# but not confirmed, opens no reserve (see there).
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

skip_unless_cmd cgi-fcgi || skip_all "cgi-fcgi is not installed (Debian libfcgi-bin)"
K=20
export COUPON_WORKERS=2
# The stack's own node: no reserve, no WAIT (node_up sets them for node 2:
# a line it changes must be in the stack's configuration).
export COUPON_CONF_OVERRIDES="fallback.reserve=0
fallback.lease_ms=10000
redis.wait_replicas=0
redis.wait_timeout_ms=100
${COUPON_CONF_OVERRIDES:-}"
cs_stack_up
A=4801
LEASE=$((3000 * CS_TIME_SCALE))

# A replica of the stack's Redis, on a port of its own.
RPORT=$(free_port)
mkdir -p "$COUPON_DIR/replica"
redis-server "$COUPON_DIR/redis/stack.conf" --port "$RPORT" --dir "$COUPON_DIR/replica" \
    --appendonly no --replicaof 127.0.0.1 "$REDIS_PORT" --repl-diskless-sync-delay 0 \
    --logfile "$COUPON_DIR/replica/redis.log" </dev/null &
REPLICA_PID=$!
replica_stop() {
    kill -CONT "$REPLICA_PID" 2>/dev/null
    kill -KILL "$REPLICA_PID" 2>/dev/null
    wait "$REPLICA_PID" 2>/dev/null
    return 0
}
cs_defer replica_stop
replica_online() { rcli INFO replication | grep -q '^slave0:.*state=online'; }
check "the replica is online" wait_for 30 replica_online

proxy_conf "$COUPON_DIR/n2-proxy.conf"
check "the proxy to Redis for node 2 is up" proxy_up
COUPON_CONF=$COUPON_DIR/n2-proxy.conf node_up n2 reserve=$K lease_ms=$LEASE wait_replicas=1 \
    wait_timeout_ms=100 || finish
sale_reserved "" n2 $A $K

# seize_cut N FIRST LOG: N users from FIRST seize on node 2, one each.
seize_cut() {
    local u
    for ((u = $2; u < $2 + $1; u++)); do seize_on n2 $A "$u" "$3"; done
}
# back: the proxy up again, node 2's journal replayed, the queue drained.
back() {
    check "$1: the proxy is back" proxy_up
    check "$1: node 2 replayed its journal" wait_for 30 reserves_open_on n2
    check "$1: coupon-sync drained the queue" wait_for 60 drained $((A % 10))
}

# --- (a) the replica runs: the reserve sells while node 2 is cut off -----------
proxy_kill
check "(a) node 2, cut off, seizes from its reserve" wait_for 10 node_health_says n2 reserve
LA=$COUPON_DIR/a.log
: >"$LA"
seize_cut 3 $((A * 1000 + 1)) "$LA"
check_eq "(a) three users were told SEIZED" 3 "$(grep -c ' SEIZED$' "$LA")"
back "(a)"
check_eq "(a) each user told SEIZED holds one coupon, the others none" 0 \
    "$(users_misjudged $A "(a)" "$LA")"

# --- (b) the replica frozen: renewals are answered, not replicated ----------------
kill -STOP "$REPLICA_PID"
T_STOP=$(date +%s%3N)
# Any shard's: the keeper renews every shard while a journal segment is on
# disk, the first one of a pass whose WAIT falls short is the one named, and
# the line comes at most once in 10 s.
check "(b) node 2 says its renewals are not on the replicas" wait_for 20 \
    grep -q "renewal of shard [0-9] is not on 1 replicas" "$COUPON_DIR/n2/fcgi.log"
node_http n2 GET /market/health
diag "(b) node 2's health, Redis answering, the replica frozen: $HTTP_BODY"
# Past one lease since the replica stopped (and a second of slack): by the
# last renewal the replica holds, node 2's lease is over.
wait_past_ms $((T_STOP + LEASE + 1000))
proxy_kill
LB=$COUPON_DIR/b.log
: >"$LB"
seize_cut 5 $((A * 1000 + 101)) "$LB"
diag "(b) answers: $(awk '{ n[$2]++ } END { for (c in n) printf "%s:%d ", c, n[c] }' "$LB")"
check_eq "(b) node 2, cut off past its last replicated renewal's lease, granted nothing" 0 \
    "$(grep -c ' SEIZED$' "$LB")"
check_eq "(b) ... and told every user so (UNAVAILABLE)" 5 "$(grep -c ' UNAVAILABLE$' "$LB")"
check "(b) its health says nothing can be granted" node_health_says n2 none
kill -CONT "$REPLICA_PID"
check "(b) the replica is online again" wait_for 30 replica_online
back "(b)"
check_eq "(b) each user holds what they were told" 0 "$(users_misjudged $A "(b)" "$LB")"
check_eq "coupons: (a)'s three" 3 "$(rows_of $A)"
check "stock + reserves + coupons = total" balanced $A 1000
# --- (e) claims answered, never confirmed: no reserve opens on them --------------
# Node 3 is killed and started again while the replica is frozen: each claim
# of its new keeper is answered, none is confirmed. Node 4, on a copy of node
# 3's journal directory and without WAIT, takes the incarnation over (node 3
# frozen, its claim gone), grants three users in an outage, replays them and
# is killed. Node 3 thaws with the claim naming it again (as if the answer
# "2" of a claim that ran had been lost) and the replica goes on: the first
# claim confirmed counts as taken anew, so node 3 resumes at what Redis'
# field holds (K - 3), not at its own count (K), which would hand node 4's
# token numbers out again.
E=4802
node_up n3 reserve=$K lease_ms=$LEASE wait_replicas=1 wait_timeout_ms=100 || finish
sale_reserved "(e)" n3 $E $K
INC3=$(cat "$COUPON_DIR/n3/journal/incarnation")
CKEY3="COUPON:RESERVE:CLAIM:$INC3"
OLD3=$(rcli GET "$CKEY3")
node_down n3 KILL
kill -STOP "$REPLICA_PID"
LOG3=$(wc -l <"$COUPON_DIR/n3/fcgi.log")
node_up n3 reserve=$K lease_ms=$LEASE wait_replicas=1 wait_timeout_ms=100 || finish
reclaimed3() { local v; v=$(rcli GET "$CKEY3"); [[ -n $v && $v != "$OLD3" ]]; }
check "(e) node 3, started again, claims its incarnation" wait_for 20 reclaimed3
CLAIM3=$(rcli GET "$CKEY3")
unreplicated3() { tail -n +$((LOG3 + 1)) "$COUPON_DIR/n3/fcgi.log" | grep -q "is not on 1 replicas"; }
check "(e) ... which the frozen replica does not confirm" wait_for 20 unreplicated3
# Nothing must open (of this sale, nor of sale A, which node 3 reserved too):
# a bounded look, the keeper passes many times in it.
opened3() {
    local v
    v=$(metric couponseize_reserve_held n3)
    [[ -n $v && $v != 0 ]] || tail -n +$((LOG3 + 1)) "$COUPON_DIR/n3/fcgi.log" | grep -q "tokens spendable"
}
shut3() { ! wait_for 3 opened3 2>/dev/null; }
check "(e) ... so its reserve stays shut" shut3
mkdir -p "$COUPON_DIR/n4"
cp -a "$COUPON_DIR/n3/journal" "$COUPON_DIR/n4/journal"
cs_defer node_signal n3 CONT
node_signal n3 STOP
rcli DEL "$CKEY3" >/dev/null
node_up n4 reserve=$K lease_ms=$LEASE wait_replicas=0 || finish
LE=$COUPON_DIR/e.log
: >"$LE"
copy_grants_three "(e)" n4 $E "$CKEY3" "$CLAIM3" $K "$LE"
node_down n4 KILL
rcli SET "$CKEY3" "$CLAIM3" PX $((LEASE + 5000)) >/dev/null
node_signal n3 CONT
kill -CONT "$REPLICA_PID"
check "(e) the replica is online again" wait_for 30 replica_online
check "(e) node 3 resumes at what Redis holds ($((K - 3)) of $K)" wait_for 20 reserves_open_on n3
# Its lease runs from the claims and renewals the replica confirmed; on a
# busy machine the first after the thaw may come late. Redis goes once
# node 3 could grant from its reserve for half a lease at least.
check "(e) ... its lease confirmed again" wait_for 20 lease_left_ms n3 $((LEASE / 2))
stack stop-redis --kill
check "(e) node 3 seizes from the reserve while Redis is down" wait_for 5 node_health_says n3 reserve
for u in 11 12 13 14 15; do seize_on n3 $E $((E * 1000 + u)) "$LE"; done
check_eq "(e) node 3 told five users SEIZED" 5 \
    "$(awk '$1 > '$((E * 1000 + 10))' && $2 == "SEIZED"' "$LE" | wc -l)"
stack start-redis
check "(e) the replica is online after the outage" wait_for 30 replica_online
check "(e) node 3 replayed its journal" wait_for 30 metric_is couponseize_journal_depth 0 n3
check "(e) coupon-sync drained the queue" wait_for 60 drained $((E % 10))
check_eq "(e) every user holds what they were told" 0 "$(users_misjudged $E "(e)" "$LE")"
check_eq "(e) no token spent twice, nothing in the dead letters" "0 0" \
    "$(metric couponseize_reserve_anomalies_total n3) $(rcli HLEN "COUPON:RESERVE:DEAD:{$((E % 10))}")"
check "(e) stock + reserves + coupons = total" balanced $E 1000
finish
