#!/usr/bin/env bash
# preheat_race.sh - derived data never goes back in time. With 150,000
# activities a preheat takes seconds between its read of MySQL and its
# writes to Redis; an update that commits in between (a start moved 30
# minutes later, a lower total) must still be what Redis holds at the end.
# Then the periodic preheat of coupon-sync: a change made in SQL by hand
# reaches Redis through the pass that reads only changed rows, one whose
# updated_at is too old for that pass through the full pass, and the expiry
# job finds ended sales by their end time.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

N=150000
BASE=2000000 # activities BASE .. BASE+N-1, on sale
T=1999999    # shard 9: published last by a preheat
export COUPON_CONF_OVERRIDES="log.level=\"info\"
mysql.timeout_s=120
sync.redis_timeout_ms=60000
preheat.interval_s=1
preheat.horizon_days=1
preheat.full_interval_s=8
sync.interval_s=1
sync.status_interval_s=1
sync.cleanup_grace_s=1"
cs_stack_up
ADMIN=$(mint_jwt 1 admin)
ACT=/market/admin/coupon/activity
# A preheat of 150,000 can outlast an HTTP request's timeouts on a busy
# machine: coupon-sync's own (one tick of it) is the preheat here.
once() { "$top_builddir/coupon-sync" -c "$COUPON_DIR/couponseize.conf" --once; }

window_of() { rcli HGET "COUPON:ACTIVITY:WINDOW:{$(($1 % 10))}" "$1"; }
meta_of() { rcli HGET "COUPON:ACTIVITY:META:{$(($1 % 10))}" "$1"; }
iso() { date -u -d "@$1" +%Y-%m-%dT%H:%M:%S+00:00; }
meta_has() { meta_of "$1" | grep -q "$2"; }
# the preheat's SELECT of every activity is running in MySQL
select_running() {
    mysql_q "SELECT COUNT(*) FROM information_schema.PROCESSLIST
        WHERE INFO LIKE 'SELECT id, name, coupon_name%' AND INFO LIKE '%ORDER BY%'" | grep -qv '^0$'
}
select_done() { ! select_running; }

# coupon-sync would heal what this part breaks: it is stopped meanwhile.
stack stop-sync
mysql_q "INSERT INTO activity (id, name, total_num, stock_num, distribute_start_time,
    distribute_end_time, validity_days, status)
    SELECT $BASE + seq, CONCAT('shop sale ', seq), 5, 5, NOW() - INTERVAL 60 SECOND,
    NOW() + INTERVAL 1 DAY, 30, 2 FROM seq_0_to_$((N - 1))"
check "a first preheat of $N" once 2>"$COUPON_DIR/once1.log"

# T: new, not started (start in 1 h), 100 coupons; no Redis fields yet.
now=$(date +%s)
start=$((now + 3600)) end=$((now + 7200)) later=$((now + 3600 + 1800))
mysql_q "INSERT INTO activity (id, name, total_num, stock_num, distribute_start_time,
    distribute_end_time, validity_days, status)
    VALUES ($T, 'moved sale', 100, 100, FROM_UNIXTIME($start), FROM_UNIXTIME($end), 30, 1)"

# The race: a preheat reads every activity; once its SELECT is done and it
# writes Redis shard by shard, the start moves 30 minutes later and the
# total drops to 50.
t0=$(date +%s%3N)
once 2>"$COUPON_DIR/race.log" &
PRE=$!
check "the preheat's SELECT is seen running" wait_for 60 select_running
wait_for 60 select_done
t1=$(date +%s%3N)
# Not http(): an update rewrites ACTIVITY:LIST from a read of all 150,000,
# which outlasts its 10 s on a busy machine.
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 120 -X PUT -H "Authorization: Bearer $ADMIN" \
    -H 'Content-Type: application/json' \
    --data-binary "{\"id\":$T,\"distributeStartTime\":\"$(iso "$later")\",\"totalNum\":50}" \
    "$COUPON_URL$ACT")
t2=$(date +%s%3N)
check_eq "the update answers 200" 200 "$code"
wait "$PRE"
check_eq "the racing preheat ends well" 0 "$?"
t3=$(date +%s%3N)
diag "preheat began at 0 ms, its SELECT ended by $((t1 - t0)) ms, the update ran $((t1 - t0))..$((t2 - t0)) ms, the tick ended at $((t3 - t0)) ms"
check_match "the update committed between the preheat's read and its write: it left one alone" \
    "preheat: 1 activities left as they are" "$(cat "$COUPON_DIR/race.log")"

check_eq "Redis holds the new window" "$((later * 1000)),$((end * 1000))" "$(window_of $T)"
check_match "META holds the new start" "\"startTime\":$((later * 1000))[,}]" "$(meta_of $T)"
check_eq "Redis stock is the new total" 50 "$(stock_of $T)"
check_eq "the version in Redis is MySQL's updated_at" \
    "$(mysql_q "SELECT CAST(UNIX_TIMESTAMP(updated_at) * 1000000 AS SIGNED) FROM activity WHERE id = $T")" \
    "$(rcli HGET "COUPON:ACTIVITY:VER:{9}" $T)"
http GET "/market/consumer/coupon/status?id=$T"
check_match "status shows the new start" "\"startTime\":$((later * 1000))[,}]" "$HTTP_BODY"
# A preheat that reads MySQL now agrees, and changes nothing.
mysql_q "DELETE FROM activity WHERE id >= $BASE"
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "a later preheat answers 200" 200 "$HTTP_CODE"
check_eq "... and leaves the window" "$((later * 1000)),$((end * 1000))" "$(window_of $T)"

# --- coupon-sync's periodic passes ----------------------------------------------------
stack start-sync
# A change made in SQL by hand: reached by the pass that reads changed rows.
mysql_q "UPDATE activity SET name = 'renamed by hand' WHERE id = $T"
check "a change made in SQL reaches META" wait_for 30 meta_has $T 'renamed by hand'
# A change stamped long before it became visible (as a transaction that
# commits long after it ran looks) is older than the periodic pass reaches
# back, yet newer than the version Redis holds: the full pass finds it.
mysql_q "INSERT INTO activity (id, name, total_num, stock_num, distribute_start_time,
    distribute_end_time, validity_days, status, updated_at)
    VALUES (1999979, 'old sale', 10, 10, NOW() - INTERVAL 60 SECOND, NOW() + INTERVAL 1 DAY,
    30, 2, NOW() - INTERVAL 2 HOUR)"
check "a row stamped in the past reaches META by the full pass" \
    wait_for 60 meta_has 1999979 'old sale'
mysql_q "UPDATE activity SET name = 'stamped in the past', updated_at = NOW() - INTERVAL 1 HOUR
    WHERE id = 1999979"
check "... and a change of it stamped in the past, too" \
    wait_for 60 meta_has 1999979 'stamped in the past'
# A sale whose start enters the horizon (a day) in 40 seconds, its row
# unchanged for hours, inserted with a sentinel inside the horizon: once the
# sentinel is preheated a pass has run since, so the first sale's absence
# then means the pass left it out, not that no pass ran yet.
mysql_q "INSERT INTO activity (id, name, total_num, stock_num, distribute_start_time,
    distribute_end_time, validity_days, status, updated_at)
    VALUES (1999969, 'entering the horizon', 10, 10, NOW() + INTERVAL 1 DAY + INTERVAL 40 SECOND,
    NOW() + INTERVAL 2 DAY, 30, 1, NOW() - INTERVAL 2 HOUR),
    (1999959, 'horizon sentinel', 10, 10, NOW() + INTERVAL 1 HOUR,
    NOW() + INTERVAL 2 DAY, 30, 1, NOW())"
check "a pass ran after the insert (the sentinel is preheated)" \
    wait_for 30 meta_has 1999959 'horizon sentinel'
check_eq "a sale beyond the horizon is not preheated" "" "$(meta_of 1999969)"
check "once its start enters the horizon, it is" wait_for 90 meta_has 1999969 'entering the horizon'
# A sale ending now: the expiry job finds it by its end time and removes
# every field of it.
mk_activity 1999989 10 -60 6
has_window() { [[ -n $(window_of "$1") ]]; }
check "the ending sale is preheated" wait_for 30 has_window 1999989
check_eq "its end time is in ENDS" 1 "$(rcli ZSCORE 'COUPON:ACTIVITY:ENDS:{9}' 1999989 | grep -c .)"
gone() {
    [[ -z $(rcli HGET 'COUPON:ACTIVITY:META:{9}' 1999989) && -z $(rcli HGET 'COUPON:ACTIVITY:VER:{9}' 1999989) &&
        -z $(rcli ZSCORE 'COUPON:ACTIVITY:ENDS:{9}' 1999989) && -z $(stock_of 1999989) ]]
}
check "once ended, META, VER, ENDS and stock go" wait_for 30 gone
check_eq "the moved sale stays" "$((later * 1000)),$((end * 1000))" "$(window_of $T)"

finish
