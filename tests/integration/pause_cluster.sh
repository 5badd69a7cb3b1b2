#!/usr/bin/env bash
# pause_cluster.sh - a slow master on a Redis Cluster is waited out, not
# fled (internals.md S3, the budget;
# doc/failures.md, the silence rule): with reserves on (fallback.reserve =
# 200, budget_ms = 1000) and 32 connections on one sale, the master of its
# shard takes a write pause of 1.5 budgets (CLIENT PAUSE 1500 WRITE). Seizes
# go unanswered for more than a budget, the shard's breaker asks that master
# for a PING on a new connection, hears it, and stays closed: nobody is told
# UNAVAILABLE or granted from the reserve but seizes whose budget went while
# they waited for a worker (never sent; couponseize_seize_budget_gone_total),
# every user told SEIZED holds a coupon in MySQL. Then the master is stopped (SIGSTOP) for 1.3
# budgets: the ping is not answered, the breaker opens and the reserve sells.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

[[ -x $LOADGEN ]] || skip_all "tests/bench/loadgen is not built (make check builds it)"
K=200
BUDGET=1000
export COUPON_WORKERS=4
export COUPON_CONF_OVERRIDES="fallback.reserve=$K
fallback.budget_ms=$BUDGET
fallback.lease_ms=30000
${COUPON_CONF_OVERRIDES:-}"
cs_stack_up --redis-cluster
ADMIN=$(mint_jwt 1 admin)
ID=4900              # shard 0: slot 13907
SLOT=13907
held() { local v; v=$(ccli HGET "COUPON:RESERVE:{0}" "$ID:held"); ((${v:-0} >= $1)); }
drained_c() { [[ $(ccli HLEN "QUEUE:COUPON:SEIZE:SYNC:{0}") == 0 ]]; }

mk_activity $ID 1000000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "preheat on the cluster answers 200" 200 "$HTTP_CODE"
check "the node set a reserve of $K aside" wait_for 30 held $K
MASTER=$(slot_owner $SLOT)
check "the master of slot $SLOT is known ($MASTER)" test -n "$MASTER"

# (a) A write pause of 1.5 budgets on the shard's master.
log=$COUPON_DIR/pause.log
opened0=$(metric couponseize_breaker_opened_total)
spent0=$(metric couponseize_reserve_spent_total)
alive0=$(metric couponseize_breaker_asked_alive_total)
gone0=$(metric couponseize_seize_budget_gone_total)
load_until_stopped $ID $((ID * 1000000)) "$log" || not_ok "(a) the load got going"
ncli "$MASTER" CLIENT PAUSE $((BUDGET * 3 / 2)) WRITE >/dev/null
wait_past_ms $(($(date +%s%3N) + BUDGET * 3 / 2))
wait_answers "$log" 500 || not_ok "(a) the load is answered after the pause"
kill -TERM "$LOAD_PID"
wait "$LOAD_PID"
check "(a) coupon-sync drained the shard" wait_for 60 drained_c
seize_judge_all "(a) a write pause of 1.5 budgets" $ID "$log"
asked=$(($(metric couponseize_breaker_asked_alive_total) - alive0))
diag "(a) asked whether the master is there and it answered: $asked; answers:" \
    "$(awk 'NR > 1 { n[$3]++ } END { for (c in n) printf "%s=%d ", c, n[c] }' "$log")"
check "(a) seizes went unanswered for a budget: the breaker asked the master ($asked)" \
    test "$asked" -ge 1
check_eq "(a) the shard's breaker did not open" 0 \
    "$(($(metric couponseize_breaker_opened_total) - opened0))"
gone=$(($(metric couponseize_seize_budget_gone_total) - gone0))
spent=$(($(metric couponseize_reserve_spent_total) - spent0))
diag "(a) seizes whose budget was gone when a worker took them: $gone; reserve grants: $spent"
check "(a) no UNAVAILABLE or reserve grant but for seizes whose budget was gone ($UNAVAILABLE + $spent <= $gone)" \
    test $((UNAVAILABLE + spent)) -le "$gone"

# (b) The same master stopped (SIGSTOP) for 1.3 budgets, well inside the
# cluster's node timeout (2 s), so no replica takes over: its kernel still
# accepts the ping's connection, but nothing answers the PING, the breaker
# opens and the reserve grants. Its grants are replayed once the master is
# back, and judged per user with the rest.
log2=$COUPON_DIR/stop.log
opened0=$(metric couponseize_breaker_opened_total)
spent0=$(metric couponseize_reserve_spent_total)
replayed0=$(metric couponseize_reserve_replayed_total)
load_until_stopped $ID $((ID * 1000000 + 500000)) "$log2" || not_ok "(b) the load got going"
pid=$(ncli "$MASTER" INFO server | sed -n 's/^process_id:\([0-9]*\).*/\1/p')
check "(b) the master's pid is known ($pid)" test -n "$pid"
kill -STOP "$pid"
cs_defer kill -CONT "$pid"
wait_past_ms $(($(date +%s%3N) + BUDGET * 13 / 10))
kill -CONT "$pid"
wait_answers "$log2" 500 || not_ok "(b) the load is answered after the stop"
check_eq "(b) no replica took over (the stop was shorter than the node timeout)" "$MASTER" \
    "$(slot_owner $SLOT)"
kill -TERM "$LOAD_PID"
wait "$LOAD_PID"
check "(b) the shard's breaker opened" test \
    "$(($(metric couponseize_breaker_opened_total) - opened0))" -ge 1
spent=$(($(metric couponseize_reserve_spent_total) - spent0))
check "(b) the reserve granted while the master was stopped ($spent)" test "$spent" -ge 1
replayed() { (($(metric couponseize_reserve_replayed_total) - replayed0 >= spent)); }
check "(b) the $spent reserve grants were replayed into Redis" wait_for 60 replayed
check "(b) coupon-sync drained the shard" wait_for 90 drained_c
seize_judge_all "(b) the master stopped" $ID "$log2"

finish
