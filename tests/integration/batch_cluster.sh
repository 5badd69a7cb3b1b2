#!/usr/bin/env bash
# batch_cluster.sh - group commit on a Redis Cluster (3 masters + 3
# replicas, wait_replicas = 1): one hot sale from 64 connections, 16 workers,
# limits.batch_max 32, while the master of its shard is killed with kill -9
# and a replica takes over. The batches route to the shard's master like a
# seize, the WAIT runs once per batch, and every answer is judged per user:
# told SEIZED => one coupon in MySQL; a holder was told SEIZED or
# UNKNOWN_OUTCOME; nobody two; stock + rows = total; the sale goes on after.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

[[ -x $LOADGEN ]] || skip_all "tests/bench/loadgen is not built (make check builds it)"
export COUPON_WORKERS=16
export COUPON_CONF_OVERRIDES="redis.command_timeout_ms=500
limits.batch_max=32
fallback.reserve=0
${COUPON_CONF_OVERRIDES:-}"
cs_stack_up --redis-cluster
ADMIN=$(mint_jwt 1 admin)
ID=2310              # shard 0: slot 13907
SLOT=13907
TOTAL=1000000
read -ra NODES <<<"${REDIS_NODES//,/ }"

mk_activity "$ID" "$TOTAL" -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "preheat on the cluster answers 200" 200 "$HTTP_CODE"
VICTIM=$(slot_owner "$SLOT")
log=$COUPON_DIR/load.log
"$LOADGEN" -p "${COUPON_URL##*:}" -s "$COUPON_JWT_SECRET" -a "$ID" -c 64 -n 100000000 -D 90 \
    -b 2310000000 -j -L "$log" >"$COUPON_DIR/load.json" 2>"$COUPON_DIR/load.err" &
LPID=$!
cs_defer stop_bg "$LPID"
answered() { [[ -f $log ]] && (($(wc -l <"$log") > $1 + 1)); }
wait_for 30 answered 500 "$log" || not_ok "the load got going"
calls0=$(metric couponseize_batch_size_count) sum0=$(metric couponseize_batch_size_sum)
sleep 2

stack "stop-redis$(node_index "$VICTIM")" --kill
DOWN_PORT=$VICTIM
promoted() {
    local o
    o=$(slot_owner "$SLOT")
    [[ -n $o && $o != "$VICTIM" ]] && [[ $(ncli "$o" cluster info) == *cluster_state:ok* ]]
}
check "a replica is promoted within 30 s" wait_for 30 promoted
NEWMASTER=$(slot_owner "$SLOT")
stack "start-redis$(node_index "$VICTIM")"
DOWN_PORT=""
has_replica() { [[ $(ncli "$NEWMASTER" info replication) =~ connected_slaves:[1-9] ]]; }
check "the old master rejoins as a replica" wait_for 60 has_replica
n0=$(wc -l <"$log")
seized_after() { (($(tail -n +"$n0" "$log" | grep -c ' SEIZED ') > 200)); }
check "the sale goes on after the failover" wait_for 30 seized_after
calls=$(($(metric couponseize_batch_size_count) - calls0)) sum=$(($(metric couponseize_batch_size_sum) - sum0))
diag "$sum seizes in $calls calls"
check "seizes rode together ($sum seizes in $calls calls)" test "$sum" -gt "$calls"
kill -TERM "$LPID"
wait "$LPID"

drained_c() { [[ $(ccli hlen "QUEUE:COUPON:SEIZE:SYNC:{0}") == 0 ]]; }
check "coupon-sync drained the shard" wait_for 90 drained_c
seize_judge_all failover "$ID" "$log"
stock=$(ccli hget "COUPON:RESOURCE:STOCK:{0}" "$ID")
check_eq "Redis stock + MySQL rows = total" "$TOTAL" $((stock + $(rows_of "$ID")))
finish
