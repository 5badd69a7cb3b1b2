#!/usr/bin/env bash
# faults.sh - Redis faults that are not a clean crash, and what users are told:
# a stalled Redis (SIGSTOP) and a busy script under load, Redis refusing writes
# (maxmemory), a revoke that Redis refused, a worker whose clock runs 2 h fast,
# and a supervisor killed with -9. Answers are checked per user: told SEIZED
# => a row in MySQL; a row => told SEIZED or UNKNOWN_OUTCOME.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

[[ -x $LOADGEN ]] || skip_all "tests/bench/loadgen is not built (make check builds it)"
skip_unless_cmd faketime cgi-fcgi >/dev/null || skip_all "faketime or cgi-fcgi is not installed"
cs_stack_up
PORT=${COUPON_URL##*:}
ADMIN=$(mint_jwt 1 admin)
now_ms() { date +%s%3N; }

# truth ACTIVITY LOG T0 T1: judges the per-response log of a load against the
# coupon rows of ACTIVITY, per user (checker.py loadgen); prints "bad_seized
# bad_holders unknown unavailable p99_us_in_window answers_in_window seized",
# the p99 over answers to requests sent between T0 and T1 (epoch ms).
truth() {
    mysql_q "SELECT user_id FROM coupon WHERE activity_id = $1" |
        checker loadgen "$2" --window "$3" "$4" bad_seized bad_holders unknown unavailable \
            window_p99_us window_answers seized
}

# drained SHARD: the sync queue of SHARD is empty.
drained() { [[ $(rcli HLEN "QUEUE:COUPON:SEIZE:SYNC:{$1}") == 0 ]]; }

# fault_under_load NAME ACTIVITY ACTION: runs a load on ACTIVITY (stock
# 1,000,000, one seize per user), runs ACTION in the middle of it, and checks
# every user's answer against MySQL.
fault_under_load() {
    local name=$1 id=$2 action=$3 log=$COUPON_DIR/$1.log lpid t0 t1
    mk_activity "$id" 1000000 -60 3600
    http POST /market/admin/coupon/preheat '' "$ADMIN"
    "$LOADGEN" -p "$PORT" -s "$COUPON_JWT_SECRET" -a "$id" -c 16 -D 60 -b $((id * 1000000)) \
        -L "$log" -j >"$COUPON_DIR/$name.json" &
    lpid=$!
    check "$name: the load is answered before the fault" wait_answers "$log" 300
    t0=$(now_ms)
    eval "$action"
    t1=$(now_ms)
    # Seizes after the fault: counted, not slept for.
    check "$name: the load is answered after the fault" wait_answers "$log" 600
    kill -TERM "$lpid"
    wait "$lpid"
    diag "$name: $(cat "$COUPON_DIR/$name.json")"
    if ! wait_for 60 drained $((id % 10)); then
        not_ok "$name: coupon-sync drained the queue"
    fi
    local bad_seized bad_holders unknown unavailable p99 n seized stock rows
    read -r bad_seized bad_holders unknown unavailable p99 n seized <<<"$(truth "$id" "$log" "$t0" "$t1")"
    diag "$name: $n answers to requests sent during the fault, p99 $p99 us;" \
        "$unknown UNKNOWN_OUTCOME, $unavailable UNAVAILABLE, $seized SEIZED"
    check_eq "$name: every user told SEIZED holds a coupon in MySQL" 0 "$bad_seized"
    check_eq "$name: every holder was told SEIZED or UNKNOWN_OUTCOME" 0 "$bad_holders"
    check "$name: the fault was felt (some answers were 503)" test $((unknown + unavailable)) -gt 0
    check "$name: seizes went on after it ($seized SEIZED)" test "$seized" -gt 100
    stock=$(stock_of "$id")
    rows=$(mysql_q "SELECT COUNT(*) FROM coupon WHERE activity_id = $id")
    check_eq "$name: Redis stock + MySQL rows = total" 1000000 "$((stock + rows))"
    FAULT_P99=$p99
}

# --- a stalled Redis: SIGSTOP for 3 s ----------------------------------------------
fault_under_load stall 701 'kill -STOP "$COUPON_REDIS_PID"; sleep 3; kill -CONT "$COUPON_REDIS_PID"'
check "stall: seize p99 during the stall under 600 ms ($FAULT_P99 us)" test "$FAULT_P99" -lt 600000

# --- a busy Redis: a script that runs for 1 s ----------------------------------------
BUSY="local t0 = redis.call('TIME') local n = 0
while true do
  n = n + 1
  local t = redis.call('TIME')
  if (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > 1000000 or n > 100000000 then return n end
end"
fault_under_load busy 702 'diag "busy script: $( { time rcli EVAL "$BUSY" 0; } 2>&1 | tr "\n" " ")"'

# --- Redis refusing writes: maxmemory under noeviction --------------------------------
mk_activity 703 100 -60 3600
mk_activity 704 100 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
# The busy script's faults fade from health by themselves: polled for.
health_ok() { [[ $(http_code GET /market/health) == 200 ]]; }
check "oom: health is 200 before" wait_for 20 health_ok
rcli CONFIG SET maxmemory-policy noeviction >/dev/null
rcli CONFIG SET maxmemory 1 >/dev/null
codes=""
for u in 1 2 3 4 5 6 7 8; do
    http POST /market/consumer/coupon/seize '{"id":703}' "$(mint_jwt $((7030000 + u)))"
    codes+="$(json_get "$HTTP_BODY" code) "
done
check_eq "oom: every seize answers UNAVAILABLE" "$(printf 'UNAVAILABLE %.0s' 1 2 3 4 5 6 7 8)" "$codes"
check_eq "oom: nothing was granted" 100 "$(stock_of 703)"
http GET /market/health
check_eq "oom: health answers 503" 503 "$HTTP_CODE"
check_eq "oom: health names the reason" oom "$(json_get "$HTTP_BODY" redis)"
http GET /market/consumer/coupon/status
check_eq "oom: status still reads live data (not stale)" "200 false" "$HTTP_CODE $(json_get "$HTTP_BODY" stale)"
for _ in 1 2 3 4 5; do http GET /market/consumer/coupon/status >/dev/null; done
http GET /market/health
check_eq "oom: successful reads do not make health 200" "503 oom" "$HTTP_CODE $(json_get "$HTTP_BODY" redis)"
http GET /market/admin/metrics '' "$ADMIN"
check_match "oom: metrics name the fault" 'couponseize_redis_fault\{fault="oom"\} 1' "$HTTP_BODY"
check_match "oom: the breaker is open" 'couponseize_breaker_state 1' "$HTTP_BODY"

# A revoke that Redis refuses changes nothing in MySQL either.
http POST /market/admin/coupon/revoke '{"id":704}' "$ADMIN"
check_eq "oom: revoke answers 503" 503 "$HTTP_CODE"
check_eq "oom: the refused revoke left MySQL alone" 2 "$(mysql_q "SELECT status FROM activity WHERE id = 704")"
rcli CONFIG SET maxmemory 0 >/dev/null
check "oom: seizes are granted again by themselves once memory is back" wait_for 10 \
    bash -c "[[ \$(curl -s -X POST -H 'Content-Type: application/json' \
        -H 'Authorization: Bearer $(mint_jwt 7039999)' --data-binary '{\"id\":703}' \
        $COUPON_URL/market/consumer/coupon/seize) == *'\"SEIZED\"'* ]]"
check_eq "oom: health is 200 again" 200 "$(http_code GET /market/health)"
check_eq "oom: exactly that one coupon was granted" 99 "$(stock_of 703)"
http POST /market/admin/coupon/revoke '{"id":704}' "$ADMIN"
check_eq "oom: the repeated revoke succeeds" 200 "$HTTP_CODE"
check_eq "oom: ... and MySQL says voided" 4 "$(mysql_q "SELECT status FROM activity WHERE id = 704")"

# A revoke that reached MySQL but not Redis (half done): the next preheat heals it.
mk_activity 705 100 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
mysql_q "UPDATE activity SET status = 4 WHERE id = 705"
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "heal: preheat puts the tombstone on a revoked activity" -1 "$(stock_of 705)"
check_eq "heal: ... and lists it as voided" 1 "$(rcli SISMEMBER ACTIVITY:VOIDED 705)"
http POST /market/consumer/coupon/seize '{"id":705}' "$(mint_jwt 7050001)"
check_eq "heal: a seize answers VOIDED" "409 VOIDED" "$HTTP_CODE $(json_get "$HTTP_BODY" code)"
check_eq "heal: no coupon was written" 0 "$(mysql_q "SELECT COUNT(*) FROM coupon WHERE activity_id = 705")"

# --- the script judges the window by Redis' clock --------------------------------------
# coupon-sync's own preheat would rewrite the windows this part sets by hand.
stack stop-sync
# A worker whose clock runs 2 h fast sees a sale that starts in 1 h as open.
mk_activity 706 100 3600 14400
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "window: preheat wrote the window" 1 "$(rcli HEXISTS 'COUPON:ACTIVITY:WINDOW:{6}' 706)"
FAST_SOCK=$COUPON_DIR/fast.sock
sed -e "s|listen = .*|listen = \"$FAST_SOCK\";|" -e "s|shm_name = .*|shm_name = \"${COUPON_SHM_NAME}-fast\";|" \
    -e 's|workers = .*|workers = 1;|' "$COUPON_CONF" >"$COUPON_DIR/fast.conf"
faketime -f '+2h' "$top_builddir/coupon-fcgi" -c "$COUPON_DIR/fast.conf" 2>"$COUPON_DIR/fast.log" &
fast_pid=$!
cs_defer stop_bg "$fast_pid"
wait_for 10 test -S "$FAST_SOCK"
# fcgi_seize SOCK ID TOKEN: a seize straight over FastCGI; prints the body.
fcgi_seize() {
    local body="{\"id\":$2}"
    printf '%s' "$body" | env -i REQUEST_METHOD=POST REQUEST_URI=/market/consumer/coupon/seize \
        CONTENT_TYPE=application/json CONTENT_LENGTH=${#body} HTTP_AUTHORIZATION="Bearer $3" \
        cgi-fcgi -bind -connect "$1" | tr -d '\r' | sed -n '/^{/p'
}
out=$(fcgi_seize "$FAST_SOCK" 706 "$(mint_jwt 7060001 '' 36000)")
check_eq "window: a worker 2 h fast answers NOT_STARTED" NOT_STARTED "$(json_get "$out" code)"
check_eq "window: the stock is untouched" 100 "$(stock_of 706)"
check_eq "window: nobody was recorded" 0 "$(rcli HLEN COUPON:SEIZE:LIST:706_{6})"
# A sale preheated before windows existed keeps selling (rolling upgrade).
mk_activity 707 100 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
rcli HDEL 'COUPON:ACTIVITY:WINDOW:{7}' 707 >/dev/null
http POST /market/consumer/coupon/seize '{"id":707}' "$(mint_jwt 7070001)"
check_eq "window: a sale without a window field keeps selling" SEIZED "$(json_get "$HTTP_BODY" code)"
check_eq "window: ... the worker wrote it from the activity list" 1 \
    "$(rcli HEXISTS 'COUPON:ACTIVITY:WINDOW:{7}' 707)"
# And an ended window in Redis wins over a worker that thinks the sale is open.
rcli HSET 'COUPON:ACTIVITY:WINDOW:{7}' 707 "1000,2000" >/dev/null
http POST /market/consumer/coupon/seize '{"id":707}' "$(mint_jwt 7070002)"
check_eq "window: Redis' window decides (ENDED)" ENDED "$(json_get "$HTTP_BODY" code)"
check_eq "window: ... with the stock untouched" 99 "$(stock_of 707)"

# --- status: mine.persisted is false for a dead-lettered entry --------------------------
rcli HSET COUPON:SEIZE:LIST:707_{7} 7070009 1 >/dev/null
rcli HSET 'QUEUE:COUPON:SEIZE:DEAD:{7}' 707:7070009 'reason=test; value=1' >/dev/null
http GET '/market/consumer/coupon/status?id=707' '' "$(mint_jwt 7070009)"
check_eq "status: a dead-lettered coupon is not persisted" '{"seized": true, "persisted": false}' \
    "$(json_get "$HTTP_BODY" mine)"

# --- the supervisor: a reload keeps its segment; a kill -9 leaves no worker --------------
sed -i "s|shm_name = .*|shm_name = \"${COUPON_SHM_NAME}-renamed\";|" "$COUPON_CONF"
kill -HUP "$COUPON_FCGI_PID"
wait_for 10 bash -c "grep -q 'workers replaced' '$COUPON_DIR/fcgi.log'"
check_eq "super: the reload still serves" 200 "$(http_code GET /market/health)"
check "super: a reload creates no second segment" test ! -e "/dev/shm/${COUPON_SHM_NAME#/}-renamed"
stack stop-fcgi
check "super: stop removes the segment it created" test ! -e "/dev/shm/${COUPON_SHM_NAME#/}"
stack start-fcgi
mapfile -t workers < <(pgrep -P "$COUPON_FCGI_PID")
check "super: workers are up (${#workers[@]})" test "${#workers[@]}" -ge 1
cs_defer rm -f "/dev/shm/${COUPON_SHM_NAME#/}" # a killed supervisor removes nothing
kill -9 "$COUPON_FCGI_PID"
gone() { local p; for p in "${workers[@]}"; do pid_alive "$p" && return 1; done; return 0; }
check "super: no worker outlives a supervisor killed with -9" wait_for 10 gone

finish
