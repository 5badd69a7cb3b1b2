#!/usr/bin/env bash
# batch.sh - group commit of seizes (limits.batch_max, internals.md G1-G6)
# on a real stack, 16 workers, 64 connections on one hot sale:
# (a) the batch script itself answers in the order given; (b) a burst on a
# sale of 300: every user judged against MySQL (told SEIZED => one row,
# nobody two, nothing oversold), seizes really rode together, and first come
# first served holds by send time; (c) Redis stopped (SIGSTOP) past the
# budget, twice; (d) the leader of the call in flight killed with kill -9
# while Redis is stopped, four times, left unreaped for a second; (f) a write pause of 1.5 budgets,
# waited out with the breaker closed; (e) replies lost on the way (a proxy
# that cuts 1 in 15 of Redis' answers), last. Every answer is judged per user:
# told SEIZED => holds one; holds one => was told SEIZED or UNKNOWN_OUTCOME
# (or got no answer at all: its worker was killed).
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

[[ -x $LOADGEN ]] || skip_all "tests/bench/loadgen is not built (make check builds it)"
command -v python3 >/dev/null || skip_all "python3 is not installed"
export COUPON_WORKERS=16
export COUPON_CONF_OVERRIDES="limits.batch_max=32
fallback.reserve=0
${COUPON_CONF_OVERRIDES:-}"
cs_stack_up
PORT=${COUPON_URL##*:}
ADMIN=$(mint_jwt 1 admin)

answered() { [[ -f $2 ]] && (($(wc -l <"$2") > $1 + 1)); }
# under_load NAME ACTIVITY ACTION: 64 connections of fresh users on ACTIVITY
# (stock 1,000,000); ACTION runs once 300 answers are in; then the load stops,
# coupon-sync drains, judge, and stock + rows = total.
under_load() {
    local name=$1 id=$2 log=$COUPON_DIR/$1.log
    # A sale made beforehand (lost: before Redis is behind the lossy proxy,
    # whose cuts would leave the preheat half done) is kept as it is.
    if [[ $(mysql_q "SELECT COUNT(*) FROM activity WHERE id = $id") == 0 ]]; then
        mk_activity "$id" 1000000 -60 3600
        http POST /market/admin/coupon/preheat '' "$ADMIN"
    fi
    "$LOADGEN" -p "$PORT" -s "$COUPON_JWT_SECRET" -a "$id" -c 64 -D 60 -n 100000000 \
        -b $((id * 1000000)) -L "$log" -j >"$COUPON_DIR/$name.json" &
    local lpid=$!
    cs_defer stop_bg "$lpid"
    wait_for 30 answered 300 "$log" || not_ok "$name: the load got going"
    eval "$3"
    kill -TERM "$lpid"
    wait "$lpid"
    diag "$name: answers by code $(testkit load-codes "$COUPON_DIR/$name.json")"
    wait_for 60 drained $((id % 10)) || not_ok "$name: coupon-sync drained the queue"
    seize_judge_all "$name" "$id" "$log"
    check_eq "$name: Redis stock + MySQL rows = total" 1000000 "$(($(stock_of "$id") + $(rows_of "$id")))"
}

# --- (a) the script: one code per seize, in the order given ----------------------------
# coupon-sync stopped meanwhile: it would drain the queue this part counts
# (activity 901 has no row in MySQL; its entries would be dead letters).
stack stop-sync
rcli HSET 'COUPON:RESOURCE:STOCK:{1}' 901 2 >/dev/null
rcli HSET 'COUPON:ACTIVITY:WINDOW:{1}' 901 "0,99999999999999" >/dev/null
rcli HSET 'COUPON:SEIZE:LIST:901_{1}' 7 123 >/dev/null
out=$(rcli EVAL "$(lua_text seize_batch)" 5 'COUPON:RESOURCE:STOCK:{1}' \
    'QUEUE:COUPON:SEIZE:SYNC:{1}' 'COUPON:ACTIVITY:WINDOW:{1}' 'COUPON:SEIZE:LIST:901_{1}' \
    'COUPON:SEIZE:LIST:911_{1}' \
    901 5 4 901 7 4 901 6 4 901 5 4 901 8 4 911 9 5 | tail -n +2 | tr '\n' ' ')
# user 5: granted (1 left); 7: held one before (its grant time 123); 6: the
# last; 5 again: already (this call); 8: sold out; 9 of an unknown activity: -3.
check_match "script: first come, first served inside one call" \
    '^1 0 -1 123 0 0 -1 [0-9]+ -2 0 -3 0 $' "$out"
check_eq "script: two granted, the stock at 0" 0 "$(rcli HGET 'COUPON:RESOURCE:STOCK:{1}' 901)"
check_eq "script: the grants are queued for MySQL" 2 "$(rcli HLEN 'QUEUE:COUPON:SEIZE:SYNC:{1}')"
rcli DEL 'QUEUE:COUPON:SEIZE:SYNC:{1}' 'COUPON:SEIZE:LIST:901_{1}' >/dev/null
rcli HDEL 'COUPON:RESOURCE:STOCK:{1}' 901 >/dev/null
stack start-sync

# --- (b) a burst on a sale of 300 -----------------------------------------------------
mk_activity 2301 300 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
calls0=$(metric couponseize_batch_size_count) sum0=$(metric couponseize_batch_size_sum)
# Users who see the sale first: every worker has its metadata cached.
seize_load 2301 16 16 2301900000 >/dev/null
log=$COUPON_DIR/burst.log
"$LOADGEN" -p "$PORT" -s "$COUPON_JWT_SECRET" -a 2301 -c 64 -n 3000 -b 2301000000 -L "$log" -j \
    >"$COUPON_DIR/burst.json"
wait_for 60 drained 1 || not_ok "burst: coupon-sync drained the queue"
seize_judge_all burst 2301 "$log"
check_eq "burst: nothing oversold: 300 rows" 300 "$(rows_of 2301)"
check_eq "burst: the stock is 0" 0 "$(stock_of 2301)"
check_eq "burst: as many told SEIZED (or UNKNOWN_OUTCOME) as rows, less the first users'" \
    "$(mysql_q "SELECT COUNT(*) FROM coupon WHERE activity_id = 2301 AND user_id < 2301900000")" \
    $((SEIZED + UNKNOWN))
calls=$(($(metric couponseize_batch_size_count) - calls0)) sum=$(($(metric couponseize_batch_size_sum) - sum0))
diag "burst: $sum seizes in $calls calls"
check "burst: seizes rode together ($sum seizes in $calls calls)" test "$sum" -gt "$calls"
# First come, first served by send time: nobody sent after another user had
# already been told SOLD_OUT was granted.
late=$(checker late-grants "$log")
check_eq "burst: first come, first served: nobody sent after a SOLD_OUT answer was granted" 0 "$late"

# --- (c) Redis stopped past the budget, twice ---------------------------------------------
stall='for i in 1 2; do kill -STOP "$COUPON_REDIS_PID"; sleep 1.5; kill -CONT "$COUPON_REDIS_PID"; sleep 1.5; done'
unsent0=$(metric couponseize_batch_unsent_total)
under_load stall 2302 "$stall"
check "stall: the stall was felt ($UNKNOWN UNKNOWN_OUTCOME, $UNAVAILABLE UNAVAILABLE)" \
    test $((UNKNOWN + UNAVAILABLE)) -gt 0
check "stall: seizes went on after it ($SEIZED SEIZED)" test "$SEIZED" -gt 100
diag "stall: $(($(metric couponseize_batch_unsent_total) - unsent0)) seizes gave up queued (nothing sent)"

# --- (d) the leader killed with kill -9 mid-call, four times -------------------------------
# leaders: the workers blocked in a read (syscall 0 or 45) of a socket
# connected to Redis: a call in flight. Not those asleep on their queue
# entry's futex (202), nor those reading a request from nginx on a kept
# connection, which a read alone does not tell apart.
redis_inodes() { # the inodes of the TCP sockets connected to Redis' port
    awk -v p="$(printf ':%04X' "$REDIS_PORT")" 'substr($3, length($3) - 4) == p { print $10 }' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
leaders() {
    local p s fd link ino
    ino=" $(redis_inodes | tr '\n' ' ') "
    for p in $(pgrep -P "$COUPON_FCGI_PID"); do
        read -r s fd _ <"/proc/$p/syscall" 2>/dev/null || continue
        [[ $s == 0 || $s == 45 ]] || continue
        link=$(readlink "/proc/$p/fd/$((fd))" 2>/dev/null) || continue
        [[ $link =~ ^socket:\[([0-9]+)\]$ && $ino == *" ${BASH_REMATCH[1]} "* ]] && echo "$p"
    done
}
KILLED=0
# The supervisor is stopped meanwhile, so the killed leaders stay unreaped
# (zombies) for a while, as under a supervisor slow to reap on a loaded
# machine: their followers must see them dead all the same.
cs_defer kill -CONT "$COUPON_FCGI_PID"
# Up to eight rounds until four leaders are killed: a round that finds the
# breaker open (the stall before it) finds nobody in a call, and kills none.
kill_leaders='for i in $(seq 8); do
    ((KILLED >= 4)) && break
    kill -STOP "$COUPON_REDIS_PID"; sleep 0.3
    kill -STOP "$COUPON_FCGI_PID"
    # A leader may be between two reads (a resend connecting): looked for
    # again for up to a second, until one is blocked on Redis.
    for j in $(seq 20); do ls=$(leaders); [[ -n $ls ]] && break; nap 0.05; done
    [[ -n $ls ]] || diag "kill: round $i found no leader; workers in syscalls $(for p in $(pgrep -P "$COUPON_FCGI_PID"); do cut -d" " -f1 "/proc/$p/syscall"; done 2>/dev/null | sort | uniq -c | tr -s " \n" " ")"
    for p in $ls; do kill -9 "$p" && KILLED=$((KILLED + 1)); done
    sleep 0.2; kill -CONT "$COUPON_REDIS_PID"; sleep 1
    kill -CONT "$COUPON_FCGI_PID"
done'
deaths0=$(metric couponseize_batch_leader_deaths_total)
under_load kill 2303 "$kill_leaders"
deaths=$(($(metric couponseize_batch_leader_deaths_total) - deaths0))
diag "kill: $KILLED leaders killed; $deaths found dead by their followers"
check "kill: leaders were killed mid-call ($KILLED)" test "$KILLED" -ge 4
check "kill: their followers saw them die and went on ($deaths)" test "$deaths" -ge 1
check "kill: seizes went on after it ($SEIZED SEIZED)" test "$SEIZED" -gt 100
# Each killed worker buried, then reaped: no zombie stays (a bury held up
# by a busy lock keeps one for a second at most).
no_zombie() { ! ps -o stat= --ppid "$COUPON_FCGI_PID" | grep -q '^Z'; }
check "kill: the supervisor left no zombie" wait_for 5 no_zombie

# --- (f) a write pause of 1.5 budgets: waited out, not fled ------------------------------
# Seizes queued behind the call in flight wait their whole budget, as a lone
# seize does on its own call, and the breaker hears them by the same silence
# rule: Redis answers a PING on a new connection all along, so it stays
# closed (fallback.reserve = 0 here, so an opened breaker would answer
# UNAVAILABLE at once to everybody). Each waiter counted as a plain failure
# opened it before. Only seizes whose budget ran out before they were sent
# (while still queued, or waiting for a worker: nothing sent for them,
# couponseize_seize_budget_gone_total) are told UNAVAILABLE, truthfully.
pause='rcli CLIENT PAUSE 1500 WRITE >/dev/null
    wait_past_ms $(($(date +%s%3N) + 1500))
    wait_answers "$log" 300 || not_ok "pause: the load is answered after the pause"'
opened0=$(metric couponseize_breaker_opened_total)
alive0=$(metric couponseize_breaker_asked_alive_total)
unsent0=$(metric couponseize_batch_unsent_total)
gone0=$(metric couponseize_seize_budget_gone_total)
under_load pause 2305 "$pause"
asked=$(($(metric couponseize_breaker_asked_alive_total) - alive0))
unsent=$(($(metric couponseize_batch_unsent_total) - unsent0))
gone=$(($(metric couponseize_seize_budget_gone_total) - gone0))
diag "pause: $UNKNOWN UNKNOWN_OUTCOME, $UNAVAILABLE UNAVAILABLE, $unsent gave up queued," \
    "$gone answered unsent with their budget gone; asked whether Redis is there and it answered: $asked"
check "pause: seizes waited a budget and the breaker asked Redis ($asked)" test "$asked" -ge 1
check_eq "pause: the breaker did not open" 0 "$(($(metric couponseize_breaker_opened_total) - opened0))"
check "pause: UNAVAILABLE only for seizes never sent, their budget gone ($UNAVAILABLE <= $gone)" \
    test "$UNAVAILABLE" -le "$gone"

# --- (e) replies lost: a proxy between the workers and Redis cuts 1 in 15 answers --------
PROXY_PORT=$(free_port)
# A reply to a seize (a script answer: an array or an integer) is dropped
# and the connection cut, as a network that fails after Redis ran the command.
python3 "$CS_TESTKIT" lossy-proxy --seed 33 --one-in 15 "$PROXY_PORT" "$REDIS_PORT" \
    >"$COUPON_DIR/proxy.log" 2>&1 &
PROXY_PID=$!
cs_defer stop_bg "$PROXY_PID"
wait_for 10 bash -c "exec 3<>/dev/tcp/127.0.0.1/$PROXY_PORT" 2>/dev/null || not_ok "lost: the proxy listens"
# The sale is made and preheated on the direct connection: through the
# proxy a cut reply could leave it unpublished, and its seizes answered
# NO_SUCH_ACTIVITY until coupon-sync's next preheat pass.
mk_activity 2304 1000000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
preheated() { [[ -n $(rcli HGET 'COUPON:RESOURCE:STOCK:{4}' 2304) ]]; }
wait_for 30 preheated || not_ok "lost: sale 2304 preheated"
sed -i "/^redis = {/,/^}/ s/^\(\s*port = \)[0-9]*;/\1$PROXY_PORT;/" "$COUPON_CONF"
stack restart-fcgi >/dev/null 2>&1
cs_reload_env
resends0=$(metric couponseize_seize_resends_total)
under_load lost 2304 'sleep 4'
resends=$(($(metric couponseize_seize_resends_total) - resends0))
check "lost: replies were lost and the calls resent ($resends)" test "$resends" -gt 0
check "lost: seizes went on ($SEIZED SEIZED)" test "$SEIZED" -gt 100

finish
