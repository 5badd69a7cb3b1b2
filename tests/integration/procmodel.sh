#!/usr/bin/env bash
# procmodel.sh - coupon-fcgi's three process models behind nginx: spawn-fcgi
# (fd 0 is the listening socket), systemd socket activation (LISTEN_FDS), and
# the built-in supervisor's rolling reload (SIGHUP) and graceful stop (SIGTERM).
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

[[ -x $LOADGEN ]] || skip_all "tests/bench/loadgen is not built (make check builds it)"
skip_unless_cmd spawn-fcgi systemd-socket-activate || skip_all "spawn-fcgi or systemd-socket-activate missing"
cs_stack_up --no-sync
FCGI=$top_builddir/coupon-fcgi
ADMIN=$(mint_jwt 1 admin)
mk_activity 501 1000000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "preheat" 200 "$HTTP_CODE"
stack stop-fcgi
# Processes this test starts itself, stopped on every exit path.
cs_defer bash -c "pkill -KILL -f -- '$FCGI -c $COUPON_CONF' || true"

seized() { code_count "$(seize_load 501 8 200 "$1")" SEIZED; }
# Counted in this shell: a "bash -c" whose command line holds the pattern
# would count itself.
fcgi_count() { pgrep -fc -- "$FCGI -c $COUPON_CONF"; }
fcgi_count_is() { [[ $(fcgi_count) -eq $1 ]]; }

# --- spawn-fcgi: four processes, each a worker on the inherited socket --------------
rm -f "$COUPON_FCGI_SOCK"
spawn-fcgi -s "$COUPON_FCGI_SOCK" -F 4 -- "$FCGI" -c "$COUPON_CONF" >/dev/null 2>&1
check_eq "spawn-fcgi started" 0 "$?"
wait_for 5 test -S "$COUPON_FCGI_SOCK"
wait_for 10 fcgi_count_is 4
check_eq "spawn-fcgi -F 4 gives four workers" 4 "$(fcgi_count)"
check_eq "seizes through nginx to spawn-fcgi workers" 200 "$(seized 100000)"
check_eq "health through spawn-fcgi workers" 200 "$(http_code GET /market/health)"
pkill -TERM -f -- "$FCGI -c $COUPON_CONF"
wait_for 10 fcgi_count_is 0
check_eq "SIGTERM stops spawn-fcgi workers" 0 "$(fcgi_count)"

# --- A stop between a connection's accept and its request's first bytes ---------------
# What the worker has taken off the listening socket it serves, though the
# stop comes before the web server's bytes do: a connection dropped there is
# a 502 at nginx for a request no other worker could take (an upgrade or a
# reload stops workers mid-sale).
# stop_race NAME [--kept]: one worker of spawn-fcgi -F 1, told to stop while
# tests/fcgi_stop_race.py's request is on its way; its answer's status, then
# the worker gone.
stop_race() {
    local one
    rm -f "$COUPON_FCGI_SOCK"
    spawn-fcgi -s "$COUPON_FCGI_SOCK" -F 1 -- "$FCGI" -c "$COUPON_CONF" >/dev/null 2>&1
    wait_for 5 test -S "$COUPON_FCGI_SOCK"
    wait_for 10 fcgi_count_is 1
    one=$(pgrep -f -- "$FCGI -c $COUPON_CONF")
    check_eq "$1: the request is answered" 200 \
        "$(python3 "$top_srcdir/tests/fcgi_stop_race.py" ${2:-} "$COUPON_FCGI_SOCK" "$one" 2>&1)"
    wait_for 10 fcgi_count_is 0
    check_eq "... and the worker then stops" 0 "$(fcgi_count)"
    rm -f "$COUPON_FCGI_SOCK"
}
stop_race "a stop after the accept"
# A connection the web server keeps (fastcgi_keep_conn): the next request
# may be on its way when the worker is told to stop; it is served, and the
# worker goes once the web server has closed the connection.
stop_race "a stop between two requests of a kept connection" --kept

# --- systemd socket activation: the supervisor serves fd 3 ---------------------------
rm -f "$COUPON_FCGI_SOCK"
systemd-socket-activate -l "$COUPON_FCGI_SOCK" "$FCGI" -c "$COUPON_CONF" \
    >>"$COUPON_DIR/activate.log" 2>&1 &
act=$!
# systemd-socket-activate execs the service on the first connection.
wait_for 5 test -S "$COUPON_FCGI_SOCK"
check_eq "socket activation: the first request is served" 200 "$(http_code GET /market/health)"
sup=$act
wait_for 5 bash -c "[[ \$(pgrep -P $sup | wc -l) -eq ${COUPON_WORKERS:-4} ]]"
check_eq "socket activation: the supervisor forks fcgi.workers workers" "${COUPON_WORKERS:-4}" \
    "$(pgrep -P "$sup" | wc -l)"
check_eq "seizes through the activated socket" 200 "$(seized 200000)"

# --- SIGHUP: workers replaced one by one while a load runs ------------------------------
before=$(pgrep -P "$sup" | sort | tr '\n' ' ')
seize_load_bg "$COUPON_DIR/hup.json" 501 16 20000 300000
lpid=$LOAD_PID
# The reload must land while the load runs: wait until it is under way (by
# the stock it has taken), not for a fixed while that a busy machine outlasts.
s0=$(stock_of 501)
load_under_way() { (($(stock_of 501) <= s0 - 100)); }
wait_for 30 load_under_way
check "the load is running when SIGHUP is sent" pid_alive "$lpid"
kill -HUP "$sup"
wait "$lpid"
out=$(cat "$COUPON_DIR/hup.json")
diag "$out"
check_eq "no request failed during the rolling reload" 20000 "$(code_count "$out" SEIZED)"
wait_for 10 bash -c "[[ \$(pgrep -P $sup | wc -l) -eq ${COUPON_WORKERS:-4} ]]"
after=$(pgrep -P "$sup" | sort | tr '\n' ' ')
check "SIGHUP replaced every worker" test -z "$(comm -12 <(tr ' ' '\n' <<<"$before" | sort) <(tr ' ' '\n' <<<"$after" | sort) | tr -d '\n')"
check_match "the reload was logged" "configuration reloaded" "$(cat "$COUPON_DIR/activate.log")"

# --- SIGHUP with a broken configuration keeps the running one -------------------------------
cp "$COUPON_CONF" "$COUPON_DIR/conf.good"
printf 'fcgi: { workers = 0; };\n' >>"$COUPON_CONF"   # out of range (1..512)
workers=$(pgrep -P "$sup" | sort | tr '\n' ' ')
kill -HUP "$sup"
wait_for 10 grep -q "reload refused" "$COUPON_DIR/activate.log"
check_match "a reload with a broken configuration is refused" "reload refused" "$(cat "$COUPON_DIR/activate.log")"
check_eq "... the workers keep running" "$workers" "$(pgrep -P "$sup" | sort | tr '\n' ' ')"
check_eq "... and serving" 200 "$(seized 400000)"
cp "$COUPON_DIR/conf.good" "$COUPON_CONF"

# --- A stop while a worker waits for a silent connection's first bytes --------------------
# A new connection has 2 s to send its first bytes (a stop does not cut
# that wait short: see above), then the worker drops it and stops.
python3 "$CS_TESTKIT" unix-silent "$COUPON_FCGI_SOCK" "$COUPON_DIR/silent.ino" 20 &
silent=$!
cs_defer kill "$silent"
# A worker has accepted the silent connection: the server end of it (the
# socket whose peer is the client's inode) belongs to a coupon-fcgi process.
held() {
    local ino
    ino=$(cat "$COUPON_DIR/silent.ino" 2>/dev/null) || return 1
    ss -xpnH | awk -v ino="$ino" '$8 == ino && /"coupon-fcgi"/ {f = 1} END {exit !f}'
}
check "a worker holds the silent connection" wait_for 10 held
workers=$(pgrep -P "$sup" | tr '\n' ' ')
kill -TERM $workers
all_gone() { local p; for p in $workers; do pid_alive "$p" && return 1; done; return 0; }
wait_for 10 all_gone
check "SIGTERM ends every worker, the one holding a silent connection too" all_gone
kill "$silent" 2>/dev/null; wait "$silent" 2>/dev/null
wait_for 10 bash -c "[[ \$(pgrep -P $sup | wc -l) -eq ${COUPON_WORKERS:-4} ]]"
check_eq "... and the supervisor's new workers serve" 200 "$(seized 500000)"

# --- SIGTERM: graceful stop, no worker left -----------------------------------------------
workers=$(pgrep -P "$sup" | tr '\n' ' ')
kill -TERM "$sup"
wait_for 15 bash -c "! kill -0 $sup 2>/dev/null || grep -q '^Z' <(awk '{print \$3}' /proc/$sup/stat 2>/dev/null)"
wait "$sup" 2>/dev/null
check_eq "SIGTERM: the supervisor exits 0" 0 "$?"
left=0
for p in $workers; do pid_alive "$p" && left=$((left + 1)); done
check_eq "SIGTERM: no worker left behind" 0 "$left"

finish
