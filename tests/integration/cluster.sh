#!/usr/bin/env bash
# cluster.sh - one sale over all ten shards on a Redis Cluster (3 masters + 3
# replicas, wait_replicas = 1) from many connections, through (a) a slow live
# migration of one shard's slot to another master, done the way
# "redis-cli --cluster reshard" does it, so clients meet ASK and TRYAGAIN, and
# (b) kill -9 of a master, whose replica is promoted. Then, per activity and
# per user: nothing lost, nothing promised that is not in MySQL, every shard
# sells again, coupon-sync drained it all.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

[[ -x $LOADGEN ]] || skip_all "tests/bench/loadgen is not built (make check builds it)"
export COUPON_CONF_OVERRIDES="redis.command_timeout_ms=500
${COUPON_CONF_OVERRIDES:-}"
cs_stack_up --redis-cluster
ADMIN=$(mint_jwt 1 admin)
BASE=700
TOTAL=1000000
MIG_SHARD=3          # slot 1584 migrates
KILL_SHARD=0         # the master of slot 13907 is killed
TAG_SLOTS=(13907 9842 5649 1584 14039 9974 5781 1716 14171 10106)
LOGS=$COUPON_DIR/load
mkdir -p "$LOGS"

read -ra NODES <<<"${REDIS_NODES//,/ }"
check_eq "REDIS_NODES lists six nodes" 6 "${#NODES[@]}"

now_ms() { date +%s%3N; }

for ((i = 0; i < 10; i++)); do mk_activity $((BASE + i)) "$TOTAL" -60 3600; done
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "preheat on the cluster answers 200" 200 "$HTTP_CODE"
check_eq "ten activities listed" 10 "$(json_get "$HTTP_BODY" loaded)"

OWNER0=()
for ((i = 0; i < 10; i++)); do OWNER0[i]=$(slot_owner "${TAG_SLOTS[i]}"); done
SRC=${OWNER0[MIG_SHARD]}
VICTIM=${OWNER0[KILL_SHARD]}
DST=""
for a in "${NODES[@]}"; do
    p=${a##*:}
    [[ $p != "$SRC" && $p != "$VICTIM" ]] || continue
    [[ $(ncli "$p" role | head -n 1) == master ]] && DST=$p
done
diag "shard owners: ${OWNER0[*]}; slot ${TAG_SLOTS[MIG_SHARD]} moves $SRC -> $DST; $VICTIM is killed"
check "the migrating shard and the killed master are on different masters" \
    test -n "$DST" -a "$SRC" != "$VICTIM"

# --- the sale: ten activities, three connections each -----------------------------
LOADPIDS=()
for ((i = 0; i < 10; i++)); do
    "$LOADGEN" -p "${COUPON_URL##*:}" -s "$COUPON_JWT_SECRET" -a $((BASE + i)) -c 3 \
        -n 100000000 -D 120 -b $(((i + 1) * 10000000)) -j -L "$LOGS/$i.log" \
        >"$LOGS/$i.json" 2>"$LOGS/$i.err" &
    LOADPIDS+=($!)
done
stop_load() {
    local p
    for p in "${LOADPIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${LOADPIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    LOADPIDS=()
}
cs_defer stop_load
# all_answered N: returns once every shard's load has answered N more
# requests than when called: load windows counted in answers, not seconds.
all_answered() {
    local i
    aa_want=()
    for ((i = 0; i < 10; i++)); do aa_want[i]=$(($(answers "$LOGS/$i.log") + $1)); done
    wait_for 60 aa_reached
}
aa_reached() {
    local i
    for ((i = 0; i < 10; i++)); do (($(answers "$LOGS/$i.log") >= aa_want[i])) || return 1; done
}
check "every shard's load is answered before the faults" all_answered 100

# --- (a) live migration of slot 1584, key by key, slowly -----------------------------
SLOT=${TAG_SLOTS[MIG_SHARD]}
SRC_ID=$(ncli "$SRC" cluster myid)
DST_ID=$(ncli "$DST" cluster myid)
MIG_START=$(now_ms)
ncli "$DST" cluster setslot "$SLOT" importing "$SRC_ID" >/dev/null
ncli "$SRC" cluster setslot "$SLOT" migrating "$DST_ID" >/dev/null
moved_keys=0
for ((round = 0; round < 50; round++)); do
    mapfile -t keys < <(ncli "$SRC" cluster getkeysinslot "$SLOT" 1)
    [[ ${#keys[@]} -gt 0 && -n ${keys[0]} ]] || break
    ncli "$SRC" migrate "$(addr_of "$DST")" "$DST" "${keys[0]}" 0 5000 >/dev/null
    moved_keys=$((moved_keys + 1))
    # Slowly: the migrating shard's load meets each state of the slot.
    wait_answers "$LOGS/$MIG_SHARD.log" 5 10
done
# Every key is on the target, the slot still on the source: ASK.
wait_answers "$LOGS/$MIG_SHARD.log" 10 10
for p in "$DST" "$SRC"; do ncli "$p" cluster setslot "$SLOT" node "$DST_ID" >/dev/null; done
for a in "${NODES[@]}"; do
    [[ $(ncli "${a##*:}" role | head -n 1) == master ]] &&
        ncli "${a##*:}" cluster setslot "$SLOT" node "$DST_ID" >/dev/null 2>&1
done
MIG_END=$(now_ms)
diag "migrated $moved_keys keys of slot $SLOT in $((MIG_END - MIG_START)) ms"
check "the slot now belongs to the target" test "$(slot_owner "$SLOT")" == "$DST"
check "every shard's load is answered after the migration" all_answered 100

# --- (b) kill -9 of a master; a replica takes over -----------------------------------
VN=$(node_index "$VICTIM")
KILL_T=$(now_ms)
stack "stop-redis$VN" --kill
DOWN_PORT=$VICTIM
promoted() {
    local o
    o=$(slot_owner "${TAG_SLOTS[KILL_SHARD]}")
    [[ -n $o && $o != "$VICTIM" ]] &&
        [[ $(ncli "$o" cluster info) == *cluster_state:ok* ]]
}
check "a replica is promoted within 30 s" wait_for 30 promoted
FAILOVER_T=$(now_ms)
NEWMASTER=$(slot_owner "${TAG_SLOTS[KILL_SHARD]}")
diag "master $VICTIM killed; $NEWMASTER took over after $((FAILOVER_T - KILL_T)) ms"
# The old master comes back as a replica of the new one, so WAIT 1 can be met.
stack "start-redis$VN"
DOWN_PORT=""
has_replica() { [[ $(ncli "$NEWMASTER" info replication) =~ connected_slaves:[1-9] ]]; }
check "the old master rejoins as a replica" wait_for 60 has_replica
REJOIN_T=$(now_ms)
diag "the old master is a replica again $((REJOIN_T - KILL_T)) ms after the kill"
check "every shard's load is answered after the rejoin" all_answered 200
stop_load

# --- the sync daemon drains everything ---------------------------------------------
queued() {
    local i n sum=0
    for ((i = 0; i < 10; i++)); do
        n=$(ccli hlen "QUEUE:COUPON:SEIZE:SYNC:{$i}") || return 1
        sum=$((sum + n))
    done
    echo "$sum"
}
drained() { [[ $(queued) == 0 ]]; }
check "coupon-sync drains every shard" wait_for 90 drained
dead=0
for ((i = 0; i < 10; i++)); do
    dead=$((dead + $(ccli hlen "QUEUE:COUPON:SEIZE:DEAD:{$i}")))
done
check_eq "no dead letters" 0 "$dead"

# --- per activity and per user -----------------------------------------------------
for ((i = 0; i < 10; i++)); do
    a=$((BASE + i))
    stock=$(ccli hget "COUPON:RESOURCE:STOCK:{$i}" "$a")
    mysql_q "SELECT user_id FROM coupon WHERE activity_id = $a ORDER BY user_id" >"$LOGS/$i.rows"
    rows=$(wc -l <"$LOGS/$i.rows")
    check_eq "activity $a: Redis stock + MySQL rows == total" "$TOTAL" $((stock + rows))
    check_eq "activity $a: stock_num in MySQL + rows == total" "$TOTAL" \
        $(($(mysql_q "SELECT stock_num FROM activity WHERE id = $a") + rows))
done

AFFECTED=" $MIG_SHARD "
for ((i = 0; i < 10; i++)); do
    [[ ${OWNER0[i]} == "$VICTIM" ]] && AFFECTED+="$i "
done
# Per shard and per user (checker.py cluster): "# ..." lines to show, "BAD ..."
# for each fault.
report=$(checker cluster "$LOGS" "$AFFECTED" "$KILL_T" "$REJOIN_T" "$MIG_START" "$MIG_END" "$MIG_SHARD")
printf '%s\n' "$report" | grep '^#' || true
check_eq "per-user checks found nothing wrong" "" "$(printf '%s\n' "$report" | grep '^BAD' || true)"

metrics=$(curl -s --max-time 5 "$COUPON_URL/market/admin/metrics")
metric() { awk -v m="$1" '$1 == m { print $2 }' <<<"$metrics"; }
ask=$(metric 'couponseize_redis_redirects_total{kind="ask"}')
moved=$(metric 'couponseize_redis_redirects_total{kind="moved"}')
tryagain=$(metric couponseize_redis_tryagain_total)
diag "redirects: ask $ask, moved $moved; tryagain retries $tryagain;" \
    "refreshes $(metric couponseize_redis_slot_map_refreshes_total);" \
    "WAIT shortfalls $(metric couponseize_redis_wait_shortfalls_total)"
check "clients met ASK during the migration" test "${ask:-0}" -gt 0
check "clients met MOVED after it" test "${moved:-0}" -gt 0
check "clients retried on TRYAGAIN" test "${tryagain:-0}" -gt 0
http GET /market/health
check_eq "health is 200 with every master up" 200 "$HTTP_CODE"
check_match "health names the masters" '"masters":\{' "$HTTP_BODY"

finish
