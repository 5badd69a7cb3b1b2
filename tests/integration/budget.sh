#!/usr/bin/env bash
# budget.sh - fallback.budget_ms: a slow Redis is waited for within the
# budget and every seize is answered within it. Under load (8 workers, 32
# connections): three 700 ms write pauses of Redis (CLIENT PAUSE 700 WRITE;
# 500 ms on a machine three times slower than idle) answer no UNAVAILABLE
# and open no breaker; a Redis stopped for 3 s (SIGSTOP:
# connections accepted, nothing answered) and a Redis killed (connections
# refused) are answered within the budget, the killed one UNAVAILABLE through
# the breaker. Every answer is checked per user against MySQL: told SEIZED =>
# a coupon row; a row => told SEIZED or UNKNOWN_OUTCOME.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

[[ -x $LOADGEN ]] || skip_all "tests/bench/loadgen is not built (make check builds it)"
BUDGET=1000
export COUPON_WORKERS=8
export COUPON_ACCESS_LOG=1
# The budget alone: without node reserves, whatever their default.
export COUPON_CONF_OVERRIDES="fallback.budget_ms=$BUDGET
fallback.reserve=0
${COUPON_CONF_OVERRIDES:-}"
cs_stack_up
PORT=${COUPON_URL##*:}
ADMIN=$(mint_jwt 1 admin)

# metric NAME: the value of an unlabelled metric of coupon-fcgi.
metric() {
    http GET /market/admin/metrics '' "$ADMIN"
    sed -n "s/^$1 \([0-9.e+]*\)\$/\1/p" <<<"$HTTP_BODY"
}
# answered N LOG: the load's log holds more than N answers.
answered() { [[ -f $2 ]] && (($(wc -l <"$2") > $1 + 1)); }
drained() { [[ $(rcli HLEN "QUEUE:COUPON:SEIZE:SYNC:{$1}") == 0 ]]; }

# judge NAME ACTIVITY LOG FIRST_USER FROM_MS TO_MS: seize_judge (tests/lib.sh), and
# every answer within the budget as nginx timed it, plus SLACK: 100 ms and
# 50 ms per unit of CS_TIME_SCALE for a worker's and nginx's turn on a
# loaded machine (a seize that waited for a worker the whole budget is
# answered at once, unsent; the short try of one that waited nearly that
# long ends with the budget). The client's view is shown beside it.
SLACK=$((100 + 50 * CS_TIME_SCALE))
judge() {
    seize_judge "$1" "$2" "$3" "$4"
    local smax
    smax=$(server_max_ms "$5" "$6")
    diag "$1: the slowest answer took $smax ms in nginx, $MAX_MS ms at the client"
    check "$1: every answer within the budget + $SLACK ms as nginx timed it (max $smax ms)" \
        test "$smax" -le $((BUDGET + SLACK))
}

# under_load NAME ACTIVITY ACTION: a load of one seize per user on ACTIVITY
# (stock 1,000,000) over 32 connections; ACTION runs once 200 answers are in;
# then the load stops, coupon-sync drains the queue and judge checks.
under_load() {
    local name=$1 id=$2 log=$COUPON_DIR/$1.log
    mk_activity "$id" 1000000 -60 3600
    http POST /market/admin/coupon/preheat '' "$ADMIN"
    "$LOADGEN" -p "$PORT" -s "$COUPON_JWT_SECRET" -a "$id" -c 32 -D 60 -n 100000000 \
        -b $((id * 1000000)) -L "$log" -j >"$COUPON_DIR/$name.json" &
    local lpid=$! t0
    t0=$(date +%s%3N)
    cs_defer stop_bg "$lpid"
    wait_for 30 answered 200 "$log" || not_ok "$name: the load got going"
    eval "$3"
    kill -TERM "$lpid"
    wait "$lpid"
    wait_for 60 drained $((id % 10)) || not_ok "$name: coupon-sync drained the queue"
    judge "$name" "$id" "$log" 0 "$t0" "$(date +%s%3N)"
    local stock rows
    stock=$(stock_of "$id")
    rows=$(mysql_q "SELECT COUNT(*) FROM coupon WHERE activity_id = $id")
    check_eq "$name: Redis stock + MySQL rows = total" 1000000 "$((stock + rows))"
}

# --- (a) three 700 ms write pauses: waited out, nobody turned away ------------------
opened0=$(metric couponseize_breaker_opened_total)
# Each pause is held for its 700 ms, then the load runs 1.3 s on a Redis that
# answers, before the next. On a machine three or more times slower than
# idle (stress-ng on every core beside make -j2 check) the pauses are 500
# ms: the breaker opens after a whole budget without an answer, and there a
# 700 ms pause left too little of it for the answers just before and after
# it (one such run opened the breaker). The checks stay as they are.
PAUSE=700
((CS_TIME_SCALE >= 3)) && PAUSE=500
pauses="for i in 1 2 3; do rcli CLIENT PAUSE $PAUSE WRITE >/dev/null; sleep 2; done"
under_load pause 2201 "$pauses"
check_eq "pause: no seize answered UNAVAILABLE" 0 "$UNAVAILABLE"
check "pause: the pauses were felt (max $MAX_MS ms >= $((PAUSE - 200)) ms)" \
    test "$MAX_MS" -ge $((PAUSE - 200))
check "pause: seizes were granted ($SEIZED)" test "$SEIZED" -gt 1000
check_eq "pause: a slow Redis opened no breaker" "$opened0" "$(metric couponseize_breaker_opened_total)"

# --- a Redis that answers nothing for 3 s: answered within the budget anyway ---------
stall='kill -STOP "$COUPON_REDIS_PID"; sleep 3; kill -CONT "$COUPON_REDIS_PID"; sleep 1.5'
under_load stall 2202 "$stall"
check "stall: the stall was felt ($UNKNOWN UNKNOWN_OUTCOME, $UNAVAILABLE UNAVAILABLE)" \
    test $((UNKNOWN + UNAVAILABLE)) -gt 0
check "stall: a Redis silent for a whole budget opened the breaker" \
    test "$(metric couponseize_breaker_opened_total)" -gt "$opened0"
check "stall: seizes went on after it ($SEIZED SEIZED)" test "$SEIZED" -gt 100

# --- a Redis that refuses connections: the breaker, UNAVAILABLE at once ---------------
mk_activity 2203 100000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
# Every worker has the activity cached first, so the seizes reach the breaker
# rather than failing on their metadata.
warm=$(seize_load 2203 32 800 2203000000)
granted=$(code_count "$warm" SEIZED)
opened1=$(metric couponseize_breaker_opened_total)
stack stop-redis --kill
log=$COUPON_DIR/down.log
t0=$(date +%s%3N)
"$LOADGEN" -p "$PORT" -s "$COUPON_JWT_SECRET" -a 2203 -c 32 -n 2000 -b 2203100000 -L "$log" -j \
    >"$COUPON_DIR/down.json"
judge down 2203 "$log" 2203100000 "$t0" "$(date +%s%3N)"
# A worker whose connection Redis closed when it died finds out only by
# writing to it: that seize was written, so its answer is UNKNOWN_OUTCOME
# (at most one per worker); every other one never reached Redis.
check_eq "down: every seize answered UNAVAILABLE (or UNKNOWN_OUTCOME on a dead connection)" \
    2000 $((UNAVAILABLE + UNKNOWN))
check "down: UNKNOWN_OUTCOME only on connections made before ($UNKNOWN)" test "$UNKNOWN" -le 8
check "down: the breaker opened" test "$(metric couponseize_breaker_opened_total)" -gt "$opened1"
check "down: answered at once (p99 $P99_MS ms < 300 ms)" test "$P99_MS" -lt 300
http GET /market/health
check_eq "down: health says no seize can be granted" "503 none" \
    "$HTTP_CODE $(json_get "$HTTP_BODY" seize)"
stack start-redis
health_says() {
    http GET /market/health
    [[ "$HTTP_CODE $(json_get "$HTTP_BODY" seize)" == "$1" ]]
}
check "down: health says seizes are granted from Redis once it is back (200 redis)" \
    wait_for 15 health_says "200 redis"
check_eq "down: nothing was granted while it was down" $((100000 - granted)) "$(stock_of 2203)"

finish
