#!/usr/bin/env bash
# upgrade_dead.sh - a new supervisor that asks for the hand-over (SIGQUIT)
# and dies before the old one acts on it is not handed over to: the old
# supervisor keeps its workers and keeper, and the node serves on. The old
# one is held at the pause point super-handover (COUPONSEIZE_PAUSE_AT, see
# lib/cs.h) while the test kills the new one, then let go. A SIGKILL takes a
# moment to end a process: should the old one find the new one still alive,
# it hands over, then sees it die, and serves again (new workers, its keeper
# started again); either way the node is not left to nobody.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

[[ -x $top_builddir/coupon-fcgi ]] || skip_all "coupon-fcgi is not built"
upgrade_bins
export COUPONSEIZE_PAUSE_AT=super-handover,super-handed-over
export COUPON_WORKERS=2
cs_stack_up --no-sync
cs_defer rm -rf "$BIN"
ADMIN=$(mint_jwt 1 admin)
ID=6401
mk_activity "$ID" 100 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "preheat answers 200" 200 "$HTTP_CODE"
old=$COUPON_FCGI_PID
seize_ok() { http POST /market/consumer/coupon/seize "{\"id\":$ID}" "$(mint_jwt "$1")"; [[ $HTTP_CODE == 200 ]]; }
check "a seize is answered before the upgrade" seize_ok 640001

upgrade_build 2
kill -USR2 "$old"
proc_stopped() { [[ $(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) == T ]]; }
# The child of the old supervisor that runs the new binary.
new_supervisor() {
    local p
    for p in $(pgrep -P "$old"); do
        grep -qa 'COUPON_FCGI_UPGRADE=' "/proc/$p/environ" 2>/dev/null && echo "$p"
    done
}
check "the old supervisor stops at the hand-over's pause point" wait_for 60 proc_stopped "$old"
new=$(new_supervisor)
check "the new supervisor runs" test -n "$new"
[[ -n $new ]] && kill -KILL "$new"
# Let go at every pause point it stops at, till it says what it made of it.
said() {
    proc_stopped "$old" && kill -CONT "$old"
    grep -qE "upgrade: supervisor $new asked for the hand-over but has exited|upgrade: the new supervisor \(pid $new\) ended after taking over \(signal 9\); this one serves again" \
        "$COUPON_DIR/fcgi.log"
}
check "the old supervisor says it serves on" wait_for 30 said
grep -E "upgrade: (supervisor $new asked|the new supervisor \(pid $new\) ended)" "$COUPON_DIR/fcgi.log" | sed 's/^/# /'
check "the old supervisor runs" pid_alive "$old"
check "... and its workers answer" wait_for 10 seize_ok 640002
check "... still, a moment later" seize_ok 640003

# --- the new one dies after the hand-over -------------------------------------------
# The old one has told its workers and keeper to go (held at the pause point
# super-handed-over) when the new one is killed: it serves again, with new
# workers and its keeper started again.
upgrade_build 3
kill -USR2 "$old"
check "a second upgrade: the old supervisor stops before the hand-over" wait_for 60 proc_stopped "$old"
new=$(new_supervisor)
check "... the new supervisor runs" test -n "$new"
kill -CONT "$old"
handed() { grep -q "upgrade: supervisor $new accepts" "$COUPON_DIR/fcgi.log" && proc_stopped "$old"; }
check "... the old one hands over and stops after it" wait_for 60 handed
[[ -n $new ]] && kill -KILL "$new"
zombie() { [[ $(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) == Z ]]; }
check "... the new one is killed" wait_for 30 zombie "$new"
kill -CONT "$old"
check "the old supervisor serves again" wait_for 30 grep -qE \
    "upgrade: the new supervisor \\(pid $new\\) ended after taking over \\(signal 9\\); this one serves again" \
    "$COUPON_DIR/fcgi.log"
check "... it runs" pid_alive "$old"
check "... and new workers of its own answer" wait_for 30 seize_ok 640004
workers_of_old() { [[ $(pgrep -P "$old" | wc -l) -ge 2 ]]; }
check "... its workers are running" wait_for 30 workers_of_old
check "... still, a moment later" seize_ok 640005

# --- the new one is stopped (not killed) after the hand-over ---------------------------
# A stop of the new supervisor is a stop of the node: the old one, handed
# over, does not serve again; it goes once its workers have finished.
upgrade_build 4
kill -USR2 "$old"
check "a third upgrade: the old supervisor stops before the hand-over" wait_for 60 proc_stopped "$old"
new=$(new_supervisor)
check "... the new supervisor runs" test -n "$new"
kill -CONT "$old"
check "... the old one hands over and stops after it" wait_for 60 handed
[[ -n $new ]] && kill -TERM "$new"
check "... the new one is stopped (SIGTERM) and exits" wait_for 60 zombie "$new"
kill -CONT "$old"
check "the old supervisor says the new one ended" wait_for 30 grep -q \
    "upgrade: the new supervisor (pid $new) ended after taking over" "$COUPON_DIR/fcgi.log"
check "... it goes too" wait_for 60 eval "! pid_alive $old"
check_eq "... and did not serve again" "" \
    "$(grep -F "upgrade: the new supervisor (pid $new) ended after taking over" "$COUPON_DIR/fcgi.log" |
        grep -F "this one serves again")"
finish
