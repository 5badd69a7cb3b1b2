#!/usr/bin/env bash
# partition.sh - one sale over all ten shards on a Redis Cluster (3 masters +
# 3 replicas, wait_replicas = 1, each node on its own loopback address) through
# (c) a replica cut off from every other node, then healed (its master sells
# nothing until the replica is too stale to be promoted, W of the durability
# rule, doc/cluster.md, and then sells on its own); (b) a master cut
# off from every other node while the workers and coupon-sync still reach it,
# for cluster-node-timeout + 3 s, then healed; (a) kill -9 of a master that
# never comes back. After each: per activity Redis stock + MySQL rows = total,
# every user told SEIZED holds a coupon, nobody told anything but SEIZED or
# UNKNOWN_OUTCOME holds one, nobody holds two; after (a) the lost master's
# shards answer SEIZED again within cluster-node-timeout + 5 s and health
# says the durability is degraded.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

[[ -x $LOADGEN ]] || skip_all "tests/bench/loadgen is not built (make check builds it)"
net_skip_unless_nft
export COUPON_CONF_OVERRIDES="redis.command_timeout_ms=500
${COUPON_CONF_OVERRIDES:-}"
cs_stack_up --redis-cluster
ADMIN=$(mint_jwt 1 admin)
BASE=900
TOTAL=1000000
NODE_TIMEOUT_MS=2000
TAG_SLOTS=(13907 9842 5649 1584 14039 9974 5781 1716 14171 10106)
LOGS=$COUPON_DIR/load
mkdir -p "$LOGS"

read -ra NODES <<<"${REDIS_NODES//,/ }"
check_eq "REDIS_NODES lists six nodes" 6 "${#NODES[@]}"
check "each node has its own address in 127.0.1.0/24" \
    test "$(printf '%s\n' "${NODES[@]%:*}" | sort -u | grep -c '^127\.0\.1\.')" -eq 6

now_ms() { date +%s%3N; }
# ncli ADDR:PORT ARGS: redis-cli on one node.
ncli() { timeout 10 redis-cli -h "${1%:*}" -p "${1##*:}" "${@:2}"; }
DEAD=""
any_node() {
    local a
    for a in "${NODES[@]}"; do
        [[ $a == "$DEAD" ]] && continue
        [[ $(ncli "$a" ping 2>/dev/null) == PONG ]] && { echo "$a"; return 0; }
    done
    return 1
}
ccli() { local a; a=$(any_node) && timeout 10 redis-cli -c -h "${a%:*}" -p "${a##*:}" "$@"; }

# slot_owner SLOT [NODE]: ADDR:PORT of the master serving SLOT as NODE sees it.
slot_owner() {
    ncli "${2:-$(any_node)}" cluster nodes | awk -v s="$1" '
        $3 ~ /master/ && $3 !~ /fail/ {
            for (i = 9; i <= NF; i++) {
                if ($i ~ /^\[/) continue
                n = split($i, r, "-"); lo = r[1]; hi = (n == 2 ? r[2] : r[1])
                if (s + 0 >= lo + 0 && s + 0 <= hi + 0) { split($2, a, "@"); print a[1]; exit }
            }
        }'
}
# replica_of MASTER: ADDR:PORT of a replica of MASTER.
replica_of() {
    local id
    id=$(ncli "$1" cluster myid)
    ncli "$(any_node)" cluster nodes | awk -v m="$id" '$4 == m && $3 !~ /fail/ { split($2, a, "@"); print a[1]; exit }'
}
others() {
    local a out=""
    for a in "${NODES[@]}"; do [[ $a == "$1" ]] || out+="$a "; done
    echo "$out"
}
node_no() {
    local i
    for i in "${!NODES[@]}"; do [[ ${NODES[$i]} == "$1" ]] && { echo $((i + 1)); return 0; }; done
    return 1
}
# stable: every live node sees the cluster ok and every master that owns
# slots has a replica online.
stable() {
    local a info masters=0 with=0
    for a in "${NODES[@]}"; do
        [[ $a == "$DEAD" ]] && continue
        [[ $(ncli "$a" cluster info 2>/dev/null) == *cluster_state:ok* ]] || return 1
        info=$(ncli "$a" info replication 2>/dev/null) || return 1
        if [[ $info == *role:master* ]]; then
            masters=$((masters + 1))
            [[ $info =~ slave0:[^$'\r']*state=online ]] && with=$((with + 1))
        fi
    done
    ((masters == 3 && with == 3))
}

for ((i = 0; i < 10; i++)); do mk_activity $((BASE + i)) "$TOTAL" -60 3600; done
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "preheat on the cluster answers 200" 200 "$HTTP_CODE"

# --- load: ten activities, two connections each, one fresh user per seize ------
LOADPIDS=()
PHASE_NO=0
start_load() {
    local i
    PHASE_NO=$((PHASE_NO + 1))
    for ((i = 0; i < 10; i++)); do
        "$LOADGEN" -p "${COUPON_URL##*:}" -s "$COUPON_JWT_SECRET" -a $((BASE + i)) -c 2 \
            -n 100000000 -D 120 -b $((PHASE_NO * 100000000 + (i + 1) * 1000000)) -j \
            -L "$LOGS/$1.$i.log" >"$LOGS/$1.$i.json" 2>"$LOGS/$1.$i.err" &
        LOADPIDS+=($!)
    done
}
stop_load() {
    local p
    for p in "${LOADPIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${LOADPIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    LOADPIDS=()
}
cs_defer stop_load

queued() {
    local i n sum=0
    for ((i = 0; i < 10; i++)); do
        n=$(ccli hlen "QUEUE:COUPON:SEIZE:SYNC:{$i}") || return 1
        sum=$((sum + n))
    done
    echo "$sum"
}
drained() { [[ $(queued) == 0 ]]; }

# check_books LABEL PHASE: the invariants, after coupon-sync drained every
# shard, over the answers of every phase so far; prints PHASE's answers by code.
check_books() {
    local phase=$1 i a stock rows
    check "$phase: coupon-sync drains every shard" wait_for 90 drained
    for ((i = 0; i < 10; i++)); do
        a=$((BASE + i))
        stock=$(ccli hget "COUPON:RESOURCE:STOCK:{$i}" "$a")
        mysql_q "SELECT user_id FROM coupon WHERE activity_id = $a" >"$LOGS/rows.$i"
        rows=$(wc -l <"$LOGS/rows.$i")
        check_eq "$phase: activity $a: Redis stock + MySQL rows == total" "$TOTAL" $((stock + rows))
    done
    check_eq "$phase: nobody holds two coupons of one activity" "" \
        "$(mysql_q "SELECT activity_id, user_id FROM coupon WHERE activity_id BETWEEN $BASE AND $((BASE + 9)) GROUP BY activity_id, user_id HAVING COUNT(*) > 1 LIMIT 3")"
    local report
    report=$(checker books "$LOGS" "$2" "$ALL_PHASES")
    printf '%s\n' "$report" | grep '^#' || true
    check_eq "$phase: every user's answer agrees with MySQL" "" \
        "$(printf '%s\n' "$report" | grep '^BAD' || true)"
}

# pauses PHASE T0 T1 SHARDS: per shard, the longest time without a SEIZED
# that ends after T0 (epoch ms), when it ended (ms after T0: selling again;
# -1 when no SEIZED came after T0) and the SEIZED answers between T0 and T1.
pauses() {
    checker pauses "$LOGS" "$1" "$2" "$3" "$4"
}

# seized_in PHASE T0 "SHARDS": every shard of SHARDS has answered SEIZED in
# PHASE's load since T0 (epoch ms). The load logs are followed as they grow,
# so a phase waits for answers, not for a number of seconds.
seized_in() {
    local sh inside n=0
    while read -r _ sh _ _ inside; do
        ((inside > 0)) || return 1
        n=$((n + 1))
    done < <(pauses "$1" "$2" "$(now_ms)" "$3" 2>/dev/null)
    ((n == $(echo "$3" | wc -w)))
}
ALL_SHARDS=$(seq -s ' ' 0 9)

check "the cluster is stable before the sale" wait_for 30 stable
ALL_PHASES=""

# --- (c) a replica cut off from every other node, then healed ------------------
M0=$(slot_owner "${TAG_SLOTS[0]}")
R0=$(replica_of "$M0")
diag "(c): replica $R0 of $M0 (shard 0's master) is cut off"
ALL_PHASES+=" replica"
SH0=""
for ((i = 0; i < 10; i++)); do [[ $(slot_owner "${TAG_SLOTS[i]}") == "$M0" ]] && SH0+="$i "; done
T=$(now_ms)
start_load replica
check "(c): the load sells on every shard" wait_for 30 seized_in replica "$T" "$ALL_SHARDS"
check "(c): the cut is in place" net_cut "$R0" "$(others "$R0")"
T_CUT=$(now_ms)
replica_failed() { ncli "$M0" cluster nodes | grep -q "^[0-9a-f]* $R0@[0-9]* slave,fail "; }
check "(c): the masters mark the cut replica failed" wait_for 20 replica_failed
T_FAILED=$(now_ms)
# W: how long a failed replica may still be promoted, from M0's settings.
cfg() { ncli "$M0" config get "$1" | sed -n 2p; }
W_MS=$(($(cfg cluster-node-timeout) * ($(cfg cluster-replica-validity-factor) + 2) + \
    ($(cfg repl-ping-replica-period) + $(cfg repl-timeout) + 3) * 1000))
diag "(c): W = $W_MS ms"
check "(c): the shards of $M0 sell again once W has passed, the cut still in place" \
    wait_for $((30 + W_MS / 1000)) seized_in replica "$((T_FAILED + 1500))" "$SH0"
net_heal
T_HEAL=$(now_ms)
check "(c): healed, every master has its replica again" wait_for 60 stable
check "(c): every shard sells after the heal" wait_for 30 seized_in replica "$(now_ms)" "$ALL_SHARDS"
stop_load
diag "(c): cut for $((T_HEAL - T_CUT)) ms; shards of $M0: $SH0"
while read -r _ sh gap first _; do
    diag "(c): shard $sh: longest pause without SEIZED $gap ms"
done < <(pauses replica "$T_CUT" "$T_HEAL" "$SH0")
seen=0
while read -r _ sh _ first inside; do
    seen=$((seen + 1))
    check "(c): shard $sh answers SEIZED once W has passed ($inside)" \
        test "$inside" -gt 0
done < <(pauses replica "$((T_FAILED + 1500))" "$T_HEAL" "$SH0")
check_eq "(c): every shard of that master was timed" "$(echo "$SH0" | wc -w)" "$seen"
# ... and not before: the replica, though marked failed, could still have been
# promoted, so no grant stood on the master alone (its last pong from the
# replica may be half a node timeout older than the cut; 1 s more for the
# count's cache and the breaker's probe).
while read -r _ sh _ _ inside; do
    check_eq "(c): shard $sh answered no SEIZED while the failed replica could be promoted" \
        0 "$inside"
done < <(pauses replica "$((T_FAILED + 1500))" "$((T_CUT + W_MS - NODE_TIMEOUT_MS / 2 - 1000))" "$SH0")
check_books "(c)" replica

# --- (b) a master cut off from every other node, clients still reach it --------
M0=$(slot_owner "${TAG_SLOTS[0]}")
diag "(b): master $M0 is cut off from the other nodes for $((NODE_TIMEOUT_MS + 3000)) ms"
ALL_PHASES+=" master"
T=$(now_ms)
start_load master
check "(b): the load sells on every shard" wait_for 30 seized_in master "$T" "$ALL_SHARDS"
check "(b): the cut is in place" net_cut "$M0" "$(others "$M0")"
T_CUT=$(now_ms)
# The cut took: another node flags the master failing (fail? or fail)
# within the cut, so (b) cannot pass on a cluster that never noticed.
OBS=$(others "$M0")
OBS=${OBS%% *}
master_failing() { ncli "$OBS" cluster nodes | grep -q "^[0-9a-f]* $M0@[0-9]* master,fail"; }
check "(b): the other nodes flag the cut master failing" \
    wait_for $(((NODE_TIMEOUT_MS + 3000) / 1000)) master_failing
# The rest of the cut: node timeout + 3 s from when the rules went in.
left=$((T_CUT + NODE_TIMEOUT_MS + 3000 - $(now_ms)))
((left > 0)) && sleep "$(printf '%d.%03d' $((left / 1000)) $((left % 1000)))"
net_heal
T_HEAL=$(now_ms)
check "(b): healed, the cluster is stable again" wait_for 60 stable
check "(b): every shard sells after the heal" wait_for 30 seized_in master "$(now_ms)" "$ALL_SHARDS"
stop_load
NEW0=$(slot_owner "${TAG_SLOTS[0]}")
diag "(b): cut for $((T_HEAL - T_CUT)) ms; shard 0 is served by $NEW0 after the heal"
while read -r _ sh gap _; do
    diag "(b): shard $sh: longest pause without SEIZED $gap ms"
done < <(pauses master "$T_CUT" "$T_HEAL" "$(seq -s ' ' 0 9)")
check_books "(b)" master

# --- (a) kill -9 of a master that never returns --------------------------------
VICTIM=$(slot_owner "${TAG_SLOTS[0]}")
LOST=""
for ((i = 0; i < 10; i++)); do [[ $(slot_owner "${TAG_SLOTS[i]}") == "$VICTIM" ]] && LOST+="$i "; done
ALL_PHASES+=" kill"
T=$(now_ms)
start_load kill
check "(a): the load sells on every shard" wait_for 30 seized_in kill "$T" "$ALL_SHARDS"
# The helper takes a while on a loaded machine: the kill is somewhere between
# T_KILL and T_DEAD. A lost shard's outage is its longest pause ending after
# T_KILL, from its last SEIZED before the kill (so no later than the kill) to
# its first SEIZED after.
T_KILL=$(now_ms)
stack "stop-redis$(node_no "$VICTIM")" --kill
T_DEAD=$(now_ms)
DEAD=$VICTIM
diag "(a): master $VICTIM (shards $LOST) killed for good"
promoted() {
    local o
    o=$(slot_owner "${TAG_SLOTS[0]}")
    [[ -n $o && $o != "$VICTIM" ]]
}
check "(a): a replica is promoted" wait_for 30 promoted
check "(a): the lost shards sell again" \
    wait_for $(((NODE_TIMEOUT_MS + 15000) / 1000)) seized_in kill "$T_DEAD" "$LOST"
degraded() { [[ $(curl -s --max-time 5 "$COUPON_URL/market/health") == *'"durability":"degraded"'* ]]; }
wait_for 30 degraded
http GET /market/health
check_match "(a): health says the durability is degraded" '"durability":"degraded"' "$HTTP_BODY"
deg=$(printf '%s' "$HTTP_BODY" | sed -n 's/.*"degraded_shards":\[\([0-9,]*\)\].*/\1/p')
check_eq "(a): health names the lost master's shards" "$(echo "$LOST" | xargs | tr ' ' ',')" "$deg"
metrics=$(curl -s --max-time 5 "$COUPON_URL/market/admin/metrics")
check_eq "(a): the metric counts them" "$(echo "$LOST" | wc -w)" \
    "$(awk '$1 == "couponseize_durability_degraded_shards" { print $2 }' <<<"$metrics")"
stop_load
seen=0
while read -r _ sh gap first _; do
    seen=$((seen + 1))
    diag "(a): shard $sh: no SEIZED for $gap ms around the kill (kill helper ran" \
        "$((T_DEAD - T_KILL)) ms; SEIZED again $first ms after it started)"
    check "(a): shard $sh answers SEIZED within cluster-node-timeout + 5 s of the kill" \
        test "$first" -ge 0 -a "$gap" -le $((NODE_TIMEOUT_MS + 5000))
done < <(pauses kill "$T_KILL" "$(now_ms)" "$LOST")
check_eq "(a): every lost shard was timed" "$(echo "$LOST" | wc -w)" "$seen"
check_books "(a)" kill

finish
