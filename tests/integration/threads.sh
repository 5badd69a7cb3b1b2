#!/usr/bin/env bash
# threads.sh - workers of request threads (fcgi.threads = 4, 4 workers) behind
# nginx keeping its FastCGI connections (upstream keepalive, fastcgi_keep_conn),
# as doc/operations.md has an operator set them up: (a) nginx keeps its
# connections and each worker runs its threads; (b) a crowd of 64 connections
# sells out a sale of 500, every answer judged per user against MySQL;
# (c) a worker killed with kill -9 under a load of fresh users, its threads'
# requests judged per user (told SEIZED => holds one; holds one => told SEIZED
# or UNKNOWN_OUTCOME, or no answer), replaced by the supervisor; (d) a graceful
# stop (SIGTERM) while 12 seizes wait on a stopped Redis: every one of them is
# answered SEIZED by the thread that has it once Redis is back, then every
# worker ends and the supervisor exits 0.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

[[ -x $LOADGEN ]] || skip_all "tests/bench/loadgen is not built (make check builds it)"
command -v python3 >/dev/null || skip_all "python3 is not installed"
skip_unless_cmd ss || skip_all "ss (iproute2) is missing"
export COUPON_WORKERS=4
export COUPON_NGINX_KEEPALIVE=4
# A Redis stopped for seconds in (d) is waited for, not given up on.
export COUPON_CONF_OVERRIDES="fcgi.threads=4
fallback.reserve=0
redis.command_timeout_ms=4000
fallback.budget_ms=6000
${COUPON_CONF_OVERRIDES:-}"
cs_stack_up
ADMIN=$(mint_jwt 1 admin)
SUP=$COUPON_FCGI_PID

workers() { pgrep -P "$SUP" | sort | tr '\n' ' '; }
workers_are() { [[ $(pgrep -P "$SUP" | wc -l) -eq $1 ]]; }
# FastCGI connections open on the workers' side (accepted on the socket).
fcgi_conns() { ss -xpnH state established | grep -F " $COUPON_FCGI_SOCK " | grep -c '"coupon-fcgi"'; }

# --- (a) the set-up ---------------------------------------------------------------------
check_match "nginx passes on kept connections" "fastcgi_keep_conn on" \
    "$(cat "$COUPON_DIR"/nginx*/couponseize.conf 2>/dev/null || cat "$COUPON_DIR"/*/couponseize.conf)"
threads=""
for w in $(workers); do threads+="$(($(ls "/proc/$w/task" | wc -l) - 1)) "; done
check_eq "each worker runs fcgi.threads request threads" "4 4 4 4 " "$threads"
check_eq "health through a kept connection" 200 "$(http_code GET /market/health)"

# --- (b) a crowd sells out a sale of 500 ----------------------------------------------
mk_activity 6401 500 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "preheat" 200 "$HTTP_CODE"
out=$(seize_load 6401 64 3000 6401000000 -L "$COUPON_DIR/crowd.log")
diag "$out"
check_eq "crowd: every request answered" 3000 "$(answers "$COUPON_DIR/crowd.log")"
check_eq "crowd: the sale sold out, no more" 500 "$(code_count "$out" SEIZED)"
wait_for 60 drained 1 || not_ok "crowd: coupon-sync drained the queue"
seize_judge "crowd" 6401 "$COUPON_DIR/crowd.log"
check_eq "crowd: stock 0 and 500 rows" "0 500" "$(stock_of 6401) $(rows_of 6401)"
check_eq "crowd: nobody holds two" "" \
    "$(mysql_q "SELECT user_id FROM coupon WHERE activity_id = 6401 GROUP BY user_id HAVING COUNT(*) > 1")"
# Kept by nginx after the load: without fastcgi_keep_conn a worker closes
# each connection once it has answered.
conns=$(fcgi_conns)
diag "FastCGI connections open after the load: $conns"
check "nginx keeps FastCGI connections open to the workers" test "$conns" -gt 0

# --- (c) kill -9 of a worker under a load of fresh users ----------------------------------
mk_activity 6402 1000000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
log=$COUPON_DIR/kill.log
load_until_stopped 6402 6402000000 "$log" || not_ok "kill: the load got going"
before=$(workers)
victim=$(pgrep -P "$SUP" | head -1)
kill -KILL "$victim"
n0=$(answers "$log")
wait_for 20 bash -c "[[ \$(pgrep -P $SUP | wc -l) -eq 4 ]] && ! pgrep -P $SUP | grep -qx $victim"
check "kill: the supervisor replaced the killed worker" workers_are 4
# shellcheck disable=SC2016 # expanded by wait_for's eval, in this scope
wait_for 30 eval '(($(answers "$log") >= n0 + 500))' || not_ok "kill: the load went on after the kill"
stop_bg "$LOAD_PID"
diag "kill: workers before $before, after $(workers)"
wait_for 60 drained 2 || not_ok "kill: coupon-sync drained the queue"
seize_judge_all "kill" 6402 "$log"
check_eq "kill: Redis stock + MySQL rows = total" 1000000 "$(($(stock_of 6402) + $(rows_of 6402)))"
check_eq "kill: the node's metrics count 4 workers" 4 "$(metric couponseize_workers)"

# --- (c2) a reload and an upgrade in place under load over kept connections --------------
# A worker told to stop while nginx keeps a connection to it: nginx may send
# the next request on it at any moment, and does not send a POST again
# (fastcgi_next_upstream off), so a worker that closed it then would leave
# a seize without an answer (502). Judged per answer: every one the
# service's own.
mk_activity 6404 1000000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
log=$COUPON_DIR/roll.log
load_until_stopped 6404 6404000000 "$log" || not_ok "roll: the load got going"
before=$(workers)
n0=$(answers "$log")
kill -HUP "$SUP"
replaced() { [[ -z $(comm -12 <(tr ' ' '\n' <<<"$before" | sort) <(workers | tr ' ' '\n' | sort) | tr -d '\n') ]]; }
check "roll: a reload (SIGHUP) replaces every worker under load" wait_for 60 replaced
# shellcheck disable=SC2016 # expanded by wait_for's eval, in this scope
wait_for 30 eval '(($(answers "$log") >= n0 + 500))' || not_ok "roll: the load went on after the reload"
n0=$(answers "$log")
check "roll: an upgrade in place (SIGUSR2) under load" stack upgrade-fcgi
SUP=$COUPON_FCGI_PID
# shellcheck disable=SC2016 # expanded by wait_for's eval, in this scope
wait_for 30 eval '(($(answers "$log") >= n0 + 500))' || not_ok "roll: the load went on after the upgrade"
stop_bg "$LOAD_PID"
none=$(awk 'NR > 1 && ($3 ~ /^HTTP_5/ || $3 == "CONNECTION_ERROR")' "$log")
diag "roll: $(answers "$log") answers; without a code of the service: $(printf '%s' "$none" | grep -c .)"
check_eq "roll: every answer the service's own (no 502, no connection cut)" "" "$(head -n 5 <<<"$none")"

# --- (d) graceful stop while seizes wait on Redis ---------------------------------------
mk_activity 6403 100 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
# Every worker's threads know the sale first (its metadata cached), so the
# seizes below wait on the one thing stopped: Redis.
seize_load 6403 16 64 6403100000 >/dev/null
# coupon-sync stopped meanwhile: only the workers' commands wait in Redis.
stack stop-sync
tokens=()
for i in $(seq 1 12); do tokens+=("$(mint_jwt $((6403200000 + i)))"); done
# Commands sent to Redis and not read by it: the seizes in flight.
redis_waiting() { ss -tnH state established "( sport = :$REDIS_PORT )" | awk '$1 > 0' | wc -l; }
pids=()
kill -STOP "$COUPON_REDIS_PID"
cs_defer kill -CONT "$COUPON_REDIS_PID"
for i in $(seq 1 12); do
    curl -s -o "$COUPON_DIR/stop.$i" -w '%{http_code}' -m 30 -X POST \
        -H "Authorization: Bearer ${tokens[i - 1]}" \
        -H 'Content-Type: application/json' -d '{"id": 6403}' \
        "$COUPON_URL/market/consumer/coupon/seize" >"$COUPON_DIR/stop.$i.code" &
    pids+=($!)
done
wait_for 2 bash -c "(( \$(ss -tnH state established '( sport = :$REDIS_PORT )' | awk '\$1 > 0' | wc -l) >= 12 ))"
diag "stop: commands waiting in the stopped Redis: $(redis_waiting)"
kill -TERM "$SUP"
# Short of the seize location's fastcgi_read_timeout (3 s) from the send.
sleep 0.3
check "stop: the supervisor waits for its workers' requests" pid_alive "$SUP"
kill -CONT "$COUPON_REDIS_PID"
for p in "${pids[@]}"; do wait "$p"; done
stack start-sync
seized=0
for i in $(seq 1 12); do
    grep -q '"code":"SEIZED"' "$COUPON_DIR/stop.$i" && seized=$((seized + 1))
    [[ $(cat "$COUPON_DIR/stop.$i.code") == 200 ]] || diag "stop: seize $i: $(cat "$COUPON_DIR/stop.$i.code") $(cat "$COUPON_DIR/stop.$i")"
done
check_eq "stop: every seize in flight at SIGTERM answered SEIZED" 12 "$seized"
wait_for 20 bash -c "! kill -0 $SUP 2>/dev/null"
check "stop: the supervisor exited" bash -c "! kill -0 $SUP 2>/dev/null"
check_eq "stop: no worker left" "" "$(pgrep -P "$SUP" 2>/dev/null)"
wait_for 60 drained 3 || not_ok "stop: coupon-sync drained the queue"
check_eq "stop: the 12 hold their coupons" 12 \
    "$(mysql_q "SELECT COUNT(*) FROM coupon WHERE activity_id = 6403 AND user_id > 6403200000")"

# --- (e) spawn-fcgi and socket activation with threads ----------------------------------
FCGI=$top_builddir/coupon-fcgi
fcgi_count() { pgrep -fc -- "$FCGI -c $COUPON_CONF"; }
# The processes this part starts itself (their command line names this
# test's own configuration), stopped on every exit path.
kill_ours() { local p; for p in $(pgrep -f -- "$FCGI -c $COUPON_CONF"); do kill -KILL "$p"; done; return 0; }
cs_defer kill_ours
fcgi_count_is() { [[ $(fcgi_count) -eq $1 ]]; }
if skip_unless_cmd spawn-fcgi systemd-socket-activate; then
    rm -f "$COUPON_FCGI_SOCK"
    spawn-fcgi -s "$COUPON_FCGI_SOCK" -F 2 -- "$FCGI" -c "$COUPON_CONF" >/dev/null 2>&1
    wait_for 10 fcgi_count_is 2
    threads=""
    for w in $(pgrep -f -- "$FCGI -c $COUPON_CONF"); do
        wait_for 5 test "$(ls "/proc/$w/task" | wc -l)" -eq 5
        threads+="$(($(ls "/proc/$w/task" | wc -l) - 1)) "
    done
    check_eq "spawn-fcgi: each worker runs its threads" "4 4 " "$threads"
    mk_activity 6405 1000 -60 3600
    http POST /market/admin/coupon/preheat '' "$ADMIN"
    check_eq "spawn-fcgi: preheat" 200 "$HTTP_CODE"
    check_eq "spawn-fcgi: seizes through kept connections" 40 \
        "$(code_count "$(seize_load 6405 8 40 6405000000)" SEIZED)"
    pkill -TERM -f -- "$FCGI -c $COUPON_CONF"
    wait_for 10 fcgi_count_is 0
    check_eq "spawn-fcgi: SIGTERM stops the workers and their threads" 0 "$(fcgi_count)"
    rm -f "$COUPON_FCGI_SOCK"
    systemd-socket-activate -l "$COUPON_FCGI_SOCK" "$FCGI" -c "$COUPON_CONF" \
        >>"$COUPON_DIR/activate.log" 2>&1 &
    act=$!
    wait_for 5 test -S "$COUPON_FCGI_SOCK"
    check_eq "socket activation: served by threaded workers" 200 "$(http_code GET /market/health)"
    kill -TERM "$act"
    wait_for 15 bash -c "! kill -0 $act 2>/dev/null"
    check "socket activation: SIGTERM stops the supervisor" bash -c "! kill -0 $act 2>/dev/null"
    check_eq "socket activation: no worker left" 0 "$(fcgi_count)"
else
    diag "spawn-fcgi or systemd-socket-activate missing: (e) left out"
fi

finish
