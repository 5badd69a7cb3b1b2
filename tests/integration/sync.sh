#!/usr/bin/env bash
# sync.sh - coupon-sync against a throwaway stack: queue -> MySQL exactly once through
# kill -9, a MySQL outage, bad entries and two daemons at once.
#
# The stack's own coupon-sync is stopped first; every daemon here is started by
# the test (with sync.lock_ttl_ms lowered so a killed daemon's shard locks
# expire quickly) and stopped on exit. Exit: 0 pass, 1 fail, 77 skip, 99 no stack.

# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib.sh"

SYNC_BIN=$top_builddir/coupon-sync
[[ -x $SYNC_BIN ]] || skip_all "$SYNC_BIN is not built"
command -v python3 >/dev/null 2>&1 || skip_all "python3 is not installed"

export COUPON_CONF_OVERRIDES="sync.lock_ttl_ms=2000
sync.batch=200
preheat.interval_s=3600
log.level=\"info\""
cs_stack_up --no-web
stack stop-sync

DAEMONS=()
# stop_daemons: a clean stop (SIGTERM: the current batch finishes and the shard
# locks are released), SIGKILL after 10 s. A daemon killed while it holds a
# shard lock would keep the next section's daemon off that shard until the
# lock expires (sync.lock_ttl_ms).
not_alive() { ! pid_alive "$1"; }
stop_daemons() {
    local p
    for p in "${DAEMONS[@]}"; do
        if pid_alive "$p"; then kill -TERM "$p" 2>/dev/null || true; fi
    done
    for p in "${DAEMONS[@]}"; do
        wait_for 10 not_alive "$p" || kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null # reaped here, so bash reports no "Killed" later
    done
    DAEMONS=()
}
cs_defer stop_daemons

LOG=$COUPON_DIR/sync-test.log
SHA=""

# start_daemon: a coupon-sync in the background, logging to $LOG; sets DPID.
start_daemon() {
    (eval "exec $COUPON_SYNC_CMD") >>"$LOG" 2>&1 &
    DPID=$!
    DAEMONS+=("$DPID")
}

# once: one full tick (preheat, drain, status job, reconcile).
once() { "$SYNC_BIN" -c "$COUPON_CONF" --once >>"$LOG" 2>&1; }

q1() { mysql_q "$1" | head -n 1; }


queued() {
    local s n=0
    for ((s = 0; s < 10; s++)); do n=$((n + $(rcli hlen "QUEUE:COUPON:SEIZE:SYNC:{$s}"))); done
    echo "$n"
}

coupons() { q1 "SELECT COUNT(*) FROM coupon WHERE activity_id BETWEEN $1 AND $(($1 + 9))"; }

# bad_invariant: activities where total_num != stock_num + coupons.
bad_invariant() {
    q1 "SELECT COUNT(*) FROM activity a WHERE a.total_num <>
        a.stock_num + (SELECT COUNT(*) FROM coupon c WHERE c.activity_id = a.id)"
}

drained() { [[ $(queued) == 0 ]]; }

# seize ACTIVITY USER: EVALSHA of lua/seize.lua as coupon-fcgi does it.
seize() {
    local s=$(($1 % 10))
    rcli evalsha "$SHA" 4 "COUPON:RESOURCE:STOCK:{$s}" "COUPON:SEIZE:LIST:$1_{$s}" \
        "QUEUE:COUPON:SEIZE:SYNC:{$s}" "COUPON:ACTIVITY:WINDOW:{$s}" "$1" "$2"
}

# --- configuration check ------------------------------------------------------------------

out=$("$SYNC_BIN" -t -c "$COUPON_CONF" 2>&1)
check_eq "-t accepts the stack's configuration" \
    "configuration file $COUPON_CONF test is successful" "$out"
printf 'sync = { bogus_key = 1; };\n' >"$COUPON_DIR/bad.conf"
out=$("$SYNC_BIN" -t -c "$COUPON_DIR/bad.conf" 2>&1)
check_eq "-t exits 1 on a bad file" 1 "$?"
check_match "-t names the key and the line" "bad\.conf:1: unknown key 'sync\.bogus_key'" "$out"

# --- one user, two activities of one shard ----------------------------------------------------

mk_activity 3 100 -60 86400 && mk_activity 13 100 -60 86400
once
SHA=$(rcli script load "$(lua_text seize)")
r1=$(seize 3 4242)
r2=$(seize 13 4242)
check_eq "user 4242 seizes activities 3 and 13" "99 99" "$r1 $r2"
once
check_eq "both coupons are in MySQL (same shard, same user)" "3 13" \
    "$(mysql_q "SELECT activity_id FROM coupon WHERE user_id = 4242 ORDER BY activity_id" | tr '\n' ' ' | sed 's/ $//')"
check_eq "stock_num of both went down by one" "99 99" \
    "$(mysql_q "SELECT stock_num FROM activity WHERE id IN (3, 13) ORDER BY id" | tr '\n' ' ' | sed 's/ $//')"
check_eq "the shard queue is empty" 0 "$(rcli hlen 'QUEUE:COUPON:SEIZE:SYNC:{3}')"

# --- 100,000 entries, kill -9 three times during the drain --------------------------------------

mk_activities 200 10000
fill_queue 200 10000 1000000
check_eq "100000 entries queued" 100000 "$(queued)"
kills=0
for target in 10000 30000 50000; do
    start_daemon
    deadline=$((SECONDS + 60))
    until (($(coupons 200) >= target)) || ! pid_alive "$DPID" || ((SECONDS > deadline)); do
        nap 0.05
    done
    got=$(coupons 200)
    { kill -KILL "$DPID" && ((got < 100000)) && kills=$((kills + 1)); wait "$DPID"; } 2>/dev/null
    diag "kill -9 after $got rows"
done
check_eq "coupon-sync was killed with -9 three times mid-drain" 3 "$kills"
start_daemon
wait_for 120 drained
check_eq "after restart: exactly 100000 coupons" 100000 "$(coupons 200)"
check_eq "no (activity, user) twice" 100000 \
    "$(q1 "SELECT COUNT(DISTINCT activity_id, user_id) FROM coupon WHERE activity_id BETWEEN 200 AND 209")"
check_eq "total_num = stock_num + coupons for every activity" 0 "$(bad_invariant)"
check_eq "every activity sold out in MySQL" 0 \
    "$(q1 "SELECT SUM(stock_num) FROM activity WHERE id BETWEEN 200 AND 209")"

# The daemon re-executes itself once with glibc's per-thread malloc cache off.
tcache_off() { tr '\0' '\n' <"/proc/$DPID/environ" | grep -q '^GLIBC_TUNABLES=.*glibc.malloc.tcache_count=0'; }
check "the daemon runs with glibc's per-thread malloc cache off (same PID)" tcache_off

# --- SIGHUP and SIGTERM --------------------------------------------------------------------------

kill -HUP "$DPID"
check "SIGHUP: the daemon says it reloads" wait_for 10 grep -q "reloading $COUPON_CONF" "$LOG"
check "SIGHUP reloads the configuration and the daemon lives on" pid_alive "$DPID"
kill -TERM "$DPID"
wait "$DPID"
check_eq "SIGTERM: exit status 0" 0 "$?"

# --- restore after Redis lost an activity's data ---------------------------------------------------

rcli hdel 'COUPON:RESOURCE:STOCK:{0}' 200 >/dev/null
rcli del 'COUPON:SEIZE:LIST:200_{0}' >/dev/null
mysql_q "UPDATE activity SET total_num = total_num + 5, stock_num = stock_num + 5 WHERE id = 200"
once
check_eq "preheat restores stock = total - coupons in MySQL" 5 \
    "$(rcli hget 'COUPON:RESOURCE:STOCK:{0}' 200)"
check_eq "preheat rebuilds the seize list from MySQL" 10000 \
    "$(rcli hlen 'COUPON:SEIZE:LIST:200_{0}')"
check_eq "a restored user cannot seize again" -1 "$(seize 200 1000001)"

# --- MySQL killed during a drain -----------------------------------------------------------------

mk_activities 300 5000
fill_queue 300 5000 2000000
: >"$LOG.mysql"
LOG_SAVE=$LOG LOG=$LOG.mysql
start_daemon
LOG=$LOG_SAVE
# Mid-drain for sure: once shard 0 has started to drain (one quick Redis read
# per poll; a MySQL count per poll let a fast daemon finish first), the daemon
# is frozen while MySQL is killed, then thawed to find it gone.
shard0_started() { (($(rcli hlen 'QUEUE:COUPON:SEIZE:SYNC:{0}') < 5000)); }
wait_for 60 shard0_started
kill -STOP "$DPID"
stack stop-mysql --kill
kill -CONT "$DPID"
# Judged by the daemon's own progress, not by how long a sleep took: it has
# seen the outage, and then failed two ticks' worth of shard tasks (10 a tick)
# more, so a batch committed just before the kill has finished its HDEL.
check "the daemon logs the outage" wait_for 30 grep -q 'MySQL failing' "$LOG.mysql"
errors() { sed -n 's/^couponseize_sync_errors_total //p' "$COUPON_DIR/sync.prom" 2>/dev/null; }
errors_reach() { local e; e=$(errors); ((${e:-0} >= $1)); }
wait_for 60 errors_reach $(($(errors) + 20))
left=$(queued)
check "MySQL went away mid-drain ($left entries still queued)" test "$left" -gt 0
wait_for 60 errors_reach $(($(errors) + 20))
check "coupon-sync survives MySQL going away" pid_alive "$DPID"
check_eq "nothing left the queue while MySQL was down" "$left" "$(queued)"
check_eq "the outage is logged once, not every tick" 1 "$(grep -c 'MySQL failing' "$LOG.mysql")"
stack start-mysql
wait_for 60 drained
check_eq "after MySQL is back: all 50000 coupons landed" 50000 "$(coupons 300)"
check_eq "invariant after the outage" 0 "$(bad_invariant)"
check "the recovery is logged" wait_for 20 grep -q 'MySQL works again' "$LOG.mysql"
stop_daemons

# --- a malformed entry goes to the dead-letter hash ---------------------------------------------

mk_activities 500 100
rcli hset 'QUEUE:COUPON:SEIZE:SYNC:{4}' 'not-a-field' 1700000000000 >/dev/null
rcli hset 'QUEUE:COUPON:SEIZE:SYNC:{4}' '504:77' 'soon' >/dev/null
rcli hset 'QUEUE:COUPON:SEIZE:SYNC:{4}' '999994:1' 1700000000000 >/dev/null
fill_queue 500 99 5000000
once
check_eq "malformed field: dead letter with reason and value" \
    "reason=malformed field; value=1700000000000" \
    "$(rcli hget 'QUEUE:COUPON:SEIZE:DEAD:{4}' not-a-field)"
check_eq "non-numeric value: dead letter" "reason=value is not a number; value=soon" \
    "$(rcli hget 'QUEUE:COUPON:SEIZE:DEAD:{4}' 504:77)"
check_eq "unknown activity: dead letter" "reason=unknown activity; value=1700000000000" \
    "$(rcli hget 'QUEUE:COUPON:SEIZE:DEAD:{4}' 999994:1)"
check_eq "the rest drained, the dead shard's included" 990 "$(coupons 500)"
check_eq "the queue is empty" 0 "$(queued)"

# --- a coupon queued before a revoke lands voided ----------------------------------------------

mk_activity 601 10 -60 86400
rcli hsetnx 'COUPON:RESOURCE:STOCK:{1}' 601 10 >/dev/null
rcli hset 'COUPON:ACTIVITY:WINDOW:{1}' 601 0,99999999999999 >/dev/null
check_eq "user 7 seizes activity 601" 9 "$(seize 601 7)"
mysql_q "UPDATE activity SET status = 4 WHERE id = 601"
once
check_eq "its coupon is written voided (status 4)" 4 \
    "$(q1 "SELECT status FROM coupon WHERE activity_id = 601 AND user_id = 7")"

# --- two daemons at once, their locks taken away under them ---------------------------------------

mk_activities 400 5000
fill_queue 400 5000 4000000
start_daemon
start_daemon
# Deleting the shard locks makes both daemons write the same batches: the
# UNIQUE key and "decrement by rows inserted" must still give an exact result.
for ((i = 0; i < 40; i++)); do
    for ((s = 0; s < 10; s++)); do rcli del "LOCK:COUPON:SYNC:{$s}" >/dev/null; done
    drained && break
    nap 0.05
done
wait_for 60 drained
stop_daemons
check_eq "two daemons: exactly 50000 coupons" 50000 "$(coupons 400)"
check_eq "two daemons: stock decremented once per coupon" 0 "$(bad_invariant)"
check_eq "two daemons: every activity sold out once" 0 \
    "$(q1 "SELECT SUM(stock_num) FROM activity WHERE id BETWEEN 400 AND 409")"

# --- reconciliation and metrics -------------------------------------------------------------------

once
prom=$(cat "$COUPON_DIR/sync.prom" 2>/dev/null)
check_match "metrics file has the counters" "couponseize_sync_rows_total [0-9]+" "$prom"
check_match "metrics file has per-shard queue depth" \
    'couponseize_sync_queue_depth\{shard="9"\} 0' "$prom"
check_match "reconciliation finds no mismatch" \
    "couponseize_sync_reconcile_mismatches_total 0" "$prom"
rcli hincrby 'COUPON:RESOURCE:STOCK:{1}' 401 3 >/dev/null
once
check_match "reconciliation reports a stock that does not add up" \
    "couponseize_sync_reconcile_mismatches_total 1" "$(cat "$COUPON_DIR/sync.prom")"

finish
