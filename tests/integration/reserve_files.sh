#!/usr/bin/env bash
# reserve_files.sh - the journal's files (internals.md rule 19), with real
# servers and the kernel's own answers bent by strace's fault injection:
#  (a) a segment deleted between a worker's open and its lock (the worker's
#      flock delayed 1.5 s, the file removed meanwhile, as the keeper removes
#      a replayed one): the grant is not written into the unlinked file; its
#      user, told SEIZED, holds one coupon after the replay;
#  (b) a new segment is made durable in its directory: the worker fsyncs
#      the journal directory after creating it, before the grant's answer;
#  (c) a worker's fdatasync fails (EIO): the answer is UNKNOWN_OUTCOME and
#      the node halts; the keeper killed (kill -9) and restarted by the
#      supervisor, the node stays halted (no SEIZED from the reserve) until
#      an operator removes <journal>/halted; then it grants again;
#  (d) the keeper killed (kill -9) while the one worker's fdatasync is held
#      6 s inside a grant: the new keeper, done waiting, logs that epoch as
#      fenced until the grant ends; the user, told SEIZED, holds one coupon;
#  (e) a worker killed (kill -9) between creating its segment and the fsync
#      of the directory (held 3 s): the next worker, finding the file there
#      and empty, fsyncs the directory before its grant's answer.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

skip_unless_cmd cgi-fcgi || skip_all "cgi-fcgi is not installed (Debian libfcgi-bin)"
skip_unless_cmd strace || skip_all "strace is not installed"
K=20
export COUPON_WORKERS=2
export COUPON_CONF_OVERRIDES="fallback.reserve=$K
fallback.lease_ms=30000
${COUPON_CONF_OVERRIDES:-}"
cs_stack_up
ADMIN=$(mint_jwt 1 admin)

segments() { compgen -G "$COUPON_DIR/$1/journal/w*-*.jnl" || true; }
# children NODE: the supervisor's children, one pid a line.
children() { pgrep -P "${!1}" || true; }
# keeper_of NODE / worker_of NODE: node NODE's keeper (the child holding the
# journal directory's lock) and its one worker.
keeper_of() {
    local p
    for p in $(children "NODE_PID_$1"); do
        ls -l "/proc/$p/fd" 2>/dev/null | grep -q "$COUPON_DIR/$1/journal/lock" && echo "$p"
    done
}
worker_of() {
    local p k
    k=$(keeper_of "$1")
    for p in $(children "NODE_PID_$1"); do [[ $p != "$k" ]] && echo "$p"; done
}
# strace_bg OUT PID ARGS...: strace attached to PID in the background (STRACE_PID).
strace_bg() {
    local out=$1 pid=$2
    shift 2
    strace -qq -f -o "$out" -p "$pid" "$@" &
    STRACE_PID=$!
    cs_defer stop_bg "$STRACE_PID"
    sleep 0.5
}

A=4501
node_up n2 workers=1
mk_activity $A 1000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check "(a) node 2 opened its reserve" wait_for 20 reserves_open_on n2
W=$(worker_of n2)
check_match "(a) node 2's one worker" '^[0-9]+$' "$W"
stack stop-redis --kill
check "(a) node 2 seizes from its reserve while Redis is down" \
    wait_for 5 node_health_says n2 reserve

# --- (a) the segment deleted between open and lock; (b) its directory fsync'd ---------
L=$COUPON_DIR/a.log
: >"$L"
strace_bg "$COUPON_DIR/a.strace" "$W" -e trace=openat,flock,fsync,fdatasync \
    -e inject=flock:delay_enter=1500000
UA=$((A * 1000 + 1))
seize_on n2 $A $UA "$L" &
SPID=$!
# The keeper's deletion, in the window the delay holds open.
first_segment() { [[ -n $(segments n2) ]]; }
check "(a) the worker opened its segment" wait_for 5 first_segment
seg=$(segments n2)
rm -f "$seg"
diag "(a) removed $(basename "$seg") before the worker's lock"
wait "$SPID"
stop_bg "$STRACE_PID"
check_eq "(a) the user was told SEIZED" "$UA SEIZED" "$(cat "$L")"
seg_bytes() { local f n=0; for f in $(segments n2); do n=$((n + $(stat -c %s "$f"))); done; echo $n; }
check_eq "(a) the grant is in a segment that is linked: one record" 44 "$(seg_bytes)"
# (b) After the create (O_CREAT) of the segment: the directory opened and fsync'd.
dir_fsynced() { checker dir-fsynced "$1" "$COUPON_DIR/n2/journal"; }
check "(b) the worker fsync'd the journal directory after creating its segment" \
    dir_fsynced "$COUPON_DIR/a.strace"

# --- (c) an fsync error halts the node, across keeper restarts ---------------------------
LC=$COUPON_DIR/c.log
: >"$LC"
strace_bg "$COUPON_DIR/c.strace" "$W" -e trace=fdatasync -e inject=fdatasync:error=EIO
UC=$((A * 1000 + 2))
# One ask: asked again, a record on disk is ALREADY_SEIZED.
node_http n2 POST /market/consumer/coupon/seize "{\"id\":$A}" "$(mint_jwt $UC)"
echo "$UC $(json_get "$HTTP_BODY" code)" >>"$LC"
stop_bg "$STRACE_PID"
check_eq "(c) a failed fdatasync: UNKNOWN_OUTCOME" "$UC UNKNOWN_OUTCOME" "$(cat "$LC")"
check "(c) node 2 is halted" wait_for 5 metric_is couponseize_reserve_halted 1 n2
check "(c) ... and says so in its journal directory" \
    wait_for 5 test -f "$COUPON_DIR/n2/journal/halted"

# Redis back: replayed, the slot reopens, a new segment. Then the keeper dies.
stack start-redis
check "(c) node 2 replayed its journal" wait_for 20 metric_is couponseize_journal_depth 0 n2
K1=$(keeper_of n2)
kill -KILL "$K1"
new_keeper() { local p; p=$(keeper_of n2); [[ -n $p && $p != "$K1" ]]; }
check "(c) the supervisor restarted the keeper killed with -9" wait_for 20 new_keeper
check "(c) the new keeper runs" wait_for 20 metric_is couponseize_reserve_keeper_up 1 n2
sleep 1 # ten keeper passes with Redis up: an unhalted keeper reopens the reserve in one
check_eq "(c) node 2 is still halted after the keeper restart" 1 \
    "$(metric couponseize_reserve_halted n2)"
stack stop-redis --kill
UD=$((A * 1000 + 3))
seize_on n2 $A $UD "$LC"
check_eq "(c) a halted node grants nothing from its reserve" "$UD UNAVAILABLE" "$(tail -n1 "$LC")"
node_http n2 GET /market/health
check_eq "(c) its health says so" none "$(json_get "$HTTP_BODY" seize)"
stack start-redis

# The operator clears it.
rm -f "$COUPON_DIR/n2/journal/halted"
check "(c) removing <journal>/halted clears the halt" \
    wait_for 5 metric_is couponseize_reserve_halted 0 n2
check "(c) ... and the keeper logged it" grep -q 'halted removed; grants from reserves resume' \
    "$COUPON_DIR/n2/fcgi.log"
check "(c) ... and reopened the reserve" wait_for 20 reserves_open_on n2
stack stop-redis --kill
check "(c) node 2 seizes from its reserve while Redis is down" \
    wait_for 5 node_health_says n2 reserve
UE=$((A * 1000 + 4))
seize_on n2 $A $UE "$LC"
check_eq "(c) then it grants again" "$UE SEIZED" "$(tail -n1 "$LC")"
stack start-redis
check "(c) node 2 replayed its journal again" wait_for 20 metric_is couponseize_journal_depth 0 n2
check "(c) coupon-sync drained the queue" wait_for 60 drained $((A % 10))

# --- (d) the keeper restarted under a worker stuck inside a grant --------------------
stack stop-redis --kill
check "(d) node 2 seizes from its reserve while Redis is down" \
    wait_for 5 node_health_says n2 reserve
LD=$COUPON_DIR/d.log
UF=$((A * 1000 + 5))
strace_bg "$COUPON_DIR/d.strace" "$W" -e trace=fdatasync -e inject=fdatasync:delay_enter=6000000
( node_http n2 POST /market/consumer/coupon/seize "{\"id\":$A}" "$(mint_jwt $UF)"
  echo "$UF $(json_get "$HTTP_BODY" code)" >"$LD" ) &
QPID=$!
sleep 1
K2=$(keeper_of n2)
kill -KILL "$K2"
other_keeper() { local p; p=$(keeper_of n2); [[ -n $p && $p != "$K2" ]]; }
check "(d) the supervisor restarted the keeper killed with -9" wait_for 20 other_keeper
check "(d) the new keeper says the epoch of the grant in flight stays fenced" \
    wait_for 10 grep -q "still inside a grant of activity $A epoch .* stays fenced" \
    "$COUPON_DIR/n2/fcgi.log"
wait "$QPID"
stop_bg "$STRACE_PID"
check_eq "(d) the grant, its fsync done within the lease: SEIZED" "$UF SEIZED" "$(cat "$LD")"
stack start-redis
check "(d) node 2 replayed its journal" wait_for 30 metric_is couponseize_journal_depth 0 n2
check "(d) coupon-sync drained the queue" wait_for 60 drained $((A % 10))
check_eq "(d) nothing went to the dead letters" 0 \
    "$(metric couponseize_reserve_dead_letters_total n2)"

# --- (e) a segment created by a worker killed before its directory fsync -----------
stack stop-redis --kill
check "(e) node 2 seizes from its reserve while Redis is down" \
    wait_for 5 node_health_says n2 reserve
W=$(worker_of n2)
strace_bg "$COUPON_DIR/e1.strace" "$W" -e trace=fsync -e inject=fsync:delay_enter=3000000
UG=$((A * 1000 + 6))
node_http n2 POST /market/consumer/coupon/seize "{\"id\":$A}" "$(mint_jwt $UG)" &
QPID=$!
new_segment() { [[ -n $(find "$COUPON_DIR/n2/journal" -name 'w*-*.jnl' -empty) ]]; }
check "(e) the worker created its segment (empty)" wait_for 5 new_segment
kill -KILL "$W"
wait "$QPID" || true
stop_bg "$STRACE_PID"
other_worker() { local p; p=$(worker_of n2); [[ -n $p && $p != "$W" ]]; }
check "(e) the supervisor started another worker" wait_for 20 other_worker
W=$(worker_of n2)
strace_bg "$COUPON_DIR/e2.strace" "$W" -e trace=openat,fsync,fdatasync
UH=$((A * 1000 + 7))
node_http n2 POST /market/consumer/coupon/seize "{\"id\":$A}" "$(mint_jwt $UH)"
echo "$UH $(json_get "$HTTP_BODY" code)" >"$COUPON_DIR/e.log"
stop_bg "$STRACE_PID"
check_eq "(e) the next worker grants into the segment found there: SEIZED" "$UH SEIZED" \
    "$(cat "$COUPON_DIR/e.log")"
check "(e) ... having fsync'd the journal directory, the segment empty when it opened it" \
    dir_fsynced "$COUPON_DIR/e2.strace"
stack start-redis
check "(e) node 2 replayed its journal" wait_for 30 metric_is couponseize_journal_depth 0 n2
check "(e) coupon-sync drained the queue" wait_for 60 drained $((A % 10))
check_eq "(e) the user whose worker was killed before its record holds none" 0 \
    "$(coupons_of $A $UG)"

for u in $UA $UE $UF $UH; do
    check_eq "user $u, told SEIZED, holds exactly one coupon" 1 "$(coupons_of $A $u)"
done
check_eq "user $UD, told UNAVAILABLE, holds none" 0 "$(coupons_of $A $UD)"
check_match "user $UC, told UNKNOWN_OUTCOME, holds at most one" '^[01]$' "$(coupons_of $A $UC)"
check "stock + reserves + coupons = total" balanced $A 1000

finish
