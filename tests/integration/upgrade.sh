#!/usr/bin/env bash
# upgrade.sh - coupon-fcgi upgraded in place (SIGUSR2, doc/operations.md
# "Upgrading in place") while users seize one sale: 20,000 users (paced at
# 500 a second, which keeps the test within 90 s on a busy 2-core machine)
# seize a sale of 12,000 over 32 connections, with node
# reserves on, while the node is upgraded to a second build, then to a
# third, then offered a fourth whose configuration check fails and a fifth
# of another segment layout (a stand-in script that answers -V as such a
# build does: the old supervisor refuses it before it runs), and last a
# sixth put in place before a reload (SIGHUP), as a package upgrade does,
# which upgrades in place as SIGUSR2 does. Judged per
# user as the nemesis does: no answer from nginx instead of the service (no
# 502, 504, nothing dropped), every SEIZED holds a coupon, every holder was
# told SEIZED or UNKNOWN_OUTCOME (so every UNAVAILABLE holds none), nothing
# oversold; the reserve passes to the new keeper without being given back
# or set aside again. Prints, per upgrade, how long it took, the longest
# time without an answer (the gap), the answers meanwhile and their codes,
# and p99 during against before.
#
# (r) Then the reserve across an upgrade made during a Redis outage: users
# granted from the node's reserve (journaled) before the upgrade, the upgrade
# taken while Redis is still down, Redis back: the new keeper replays each
# grant once (every user told SEIZED holds one coupon), a granted user
# asking the new binary again is not granted twice, the epoch stays the one
# set aside (not given back, not set aside again), and the reserve spends
# on from amount - granted.
#
# (s) Last, under socket activation (systemd-socket-activate: the socket is
# fd 3, LISTEN_FDS): an upgrade while 4,000 users seize, every one SEIZED;
# the socket file is left to its owner at the new supervisor's stop. A
# stand-in for systemd's notification socket (NOTIFY_SOCKET) records who
# says what: the old supervisor, the unit's main process, names the new
# one (MAINPID=, READY=1), as NotifyAccess=main requires.
#
# A "build" here is a copy of the build tree's coupon-fcgi with bytes
# appended (a new file at the path the node was started from, as a package
# or "make" leaves it): the new supervisor's /proc/PID/exe is compared with
# it, so the test knows the new file runs.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

[[ -x $LOADGEN ]] || skip_all "tests/bench/loadgen is not built (make check builds it)"
command -v python3 >/dev/null || skip_all "python3 is not installed"
[[ -x $top_builddir/coupon-fcgi ]] || skip_all "coupon-fcgi is not built"

upgrade_bins
build() { upgrade_build "$@"; }
# other_layout N: build N is a stand-in for a build whose segment layout is
# not this one's: it answers -V so, and would leave a mark if run otherwise.
# shellcheck disable=SC2317,SC2016 # called through upgrade's MAKE; $1 is the script's
other_layout() {
    local proto layout
    read -r _ _ _ proto _ layout < <("$top_builddir/coupon-fcgi" -V)
    printf '#!/bin/sh\nif [ "$1" = -V ]; then echo "coupon-fcgi 9.9 upgrade-protocol %s segment-layout %s"; exit 0; fi\ntouch "%s/ran"; exit 1\n' \
        "$proto" $((layout + 1)) "$BIN" >"$BIN/next" &&
        cp "$BIN/next" "$BIN/build-$1" && chmod 0755 "$BIN/next" && mv -f "$BIN/next" "$BIN/coupon-fcgi"
}
K=20
# Section (r)'s grants must come within the lease of the last renewal
# before the outage: it scales with the machine, as in reserve_crash.sh.
LEASE=$((30000 * CS_TIME_SCALE))
export COUPON_CONF_OVERRIDES="fallback.reserve=$K
fallback.lease_ms=$LEASE
${COUPON_CONF_OVERRIDES:-}"
cs_stack_up
cs_defer rm -rf "$BIN"
PORT=${COUPON_URL##*:}
ADMIN=$(mint_jwt 1 admin)
ID=6201 TOTAL=12000 USERS=20000 RATE=500 BASE=6201000000

check "the node runs build 1" cmp -s "/proc/$COUPON_FCGI_PID/exe" "$BIN/build-1"
mk_activity "$ID" "$TOTAL" -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "preheat answers 200" 200 "$HTTP_CODE"
EPOCHS="SELECT COUNT(*), COALESCE(SUM(state = 1), 0) FROM reserve_epoch WHERE activity_id = $ID"
check "the keeper set a reserve aside" wait_for 20 sql_is "$EPOCHS" $'1\t1'
epoch0=$(mysql_q "SELECT CONCAT(incarnation, ':', epoch) FROM reserve_epoch WHERE activity_id = $ID")

log=$COUPON_DIR/load.log
"$LOADGEN" -p "$PORT" -s "$COUPON_JWT_SECRET" -a "$ID" -c 32 -n "$USERS" -R "$RATE" -b "$BASE" \
    -L "$log" -j >"$COUPON_DIR/load.json" &
lpid=$!
cs_defer stop_bg "$lpid"

WINDOWS="" RUNNING=1
# upgrade NAME BUILD WANT_RC [AFTER [MAKE]]: after AFTER (2,500) more answers,
# upgrades the node to build BUILD (made just before by MAKE, default
# build); WANT_RC 0: taken, 1: refused.
upgrade() {
    local name=$1 bn=$2 want=$3 old=$COUPON_FCGI_PID t0 t1 rc=0
    wait_answers "$log" "${4:-2500}" || not_ok "$name: the load is answered"
    "${5:-build}" "$bn" || not_ok "$name: build $bn made"
    t0=$(date +%s%3N)
    stack upgrade-fcgi 2>"$COUPON_DIR/$name.err" || rc=$?
    t1=$(date +%s%3N)
    sed 's/^/# /' "$COUPON_DIR/$name.err"
    WINDOWS+="$name $t0 $t1"$'\n'
    check_eq "$name: upgrade-fcgi exits $want" "$want" "$rc"
    if ((want == 0)); then
        check "$name: a new supervisor ($old -> $COUPON_FCGI_PID)" test "$old" != "$COUPON_FCGI_PID"
        check "$name: it runs build $bn" cmp -s "/proc/$COUPON_FCGI_PID/exe" "$BIN/build-$bn"
        RUNNING=$bn
        check "$name: the old supervisor has gone" eval "! pid_alive $old"
    else
        check_eq "$name: the old supervisor serves on" "$old" "$COUPON_FCGI_PID"
        check "$name: ... still on build $RUNNING" cmp -s "/proc/$COUPON_FCGI_PID/exe" "$BIN/build-$RUNNING"
    fi
}

upgrade first 2 0
upgrade second 3 0
check_eq "two upgrades: the reserve's epoch is the one set aside before them" "$epoch0" \
    "$(mysql_q "SELECT CONCAT(incarnation, ':', epoch) FROM reserve_epoch WHERE activity_id = $ID")"
check_eq "two upgrades: still open (not given back, not set aside again)" $'1\t1' "$(mysql_q "$EPOCHS")"
check_eq "two upgrades: the keepers handed over" 2 \
    "$(grep -c 'reserve keeper: handing over' "$COUPON_DIR/fcgi.log")"
check_eq "two upgrades: ... and the new ones adopted the open epoch" 2 \
    "$(grep -c 'reserve keeper: incarnation .*; 1 open epochs' "$COUPON_DIR/fcgi.log")"
check_eq "two upgrades: nothing given back at a hand-over" 0 \
    "$(grep -c 'stopping: giving every reserve back' "$COUPON_DIR/fcgi.log")"

# A reload (SIGHUP, systemctl reload) once a new build is at the binary's
# path, as after a package upgrade: the supervisor upgrades in place
# instead of forking workers of the old build again.
COUPON_UPGRADE_SIGNAL=HUP upgrade reload 6 0 500
check "reload: the supervisor said why it upgraded" \
    grep -q "reload: the binary on disk is a new build; upgrading in place" "$COUPON_DIR/fcgi.log"

# A configuration the new build refuses: the old supervisor serves on.
cp "$COUPON_CONF" "$COUPON_DIR/conf.good"
printf 'no_such_group = 1;\n' >>"$COUPON_CONF"
upgrade refused 4 1 500
cp "$COUPON_DIR/conf.good" "$COUPON_CONF"
check "refused: the old supervisor logged the refusal" \
    grep -q "upgrade refused: the new binary" "$COUPON_DIR/fcgi.log"
upgrade layout 5 1 500 other_layout
check "layout: refused on its -V answer, never started" test ! -e "$BIN/ran"
check "layout: the refusal names the layouts" grep -q "segment layout .* cannot run beside" \
    "$COUPON_DIR/fcgi.log"

wait "$lpid"
diag "load: $(testkit load-codes "$COUPON_DIR/load.json")"
check "coupon-sync drained the queue" wait_for 60 drained $((ID % 10))

# Per upgrade: answers that ended inside its window, their codes, the
# longest time without an answer (the gap), p99 against the answers before
# the first upgrade.
checker windows "$log" "$WINDOWS" >"$COUPON_DIR/windows.txt"
while read -r line; do diag "$line"; done <"$COUPON_DIR/windows.txt"
# p99 as the clients saw it (their own delays on a busy machine included).
p99=$(sed -n 's/^\(first\|second\|refused\|layout\): .* p99 \([0-9]*\) ms.*/\2/p' "$COUPON_DIR/windows.txt" |
    sort -n | tail -n 1)
check "seize p99 during each upgrade within fallback.budget_ms (1,000 ms): ${p99:-?} ms at most" \
    test "${p99:-99999}" -le 1000

seize_judge_all upgrades "$ID" "$log"
check_eq "every user got an answer from the service (no 502, 504, nothing dropped)" 0 "$NOANSWER"
check_eq "all $USERS users answered" "$USERS" "$N"
rows=$(rows_of "$ID")
check "nothing oversold ($rows rows of $TOTAL)" test "$rows" -le "$TOTAL"
check_eq "Redis stock + reserves held + MySQL rows = total" "$TOTAL" \
    "$(($(stock_of "$ID") + $(held_of "$ID") + rows))"
check "rows: at least the users told SEIZED, at most those and the UNKNOWN_OUTCOMEs" \
    test "$SEIZED" -le "$rows" -a "$rows" -le $((SEIZED + UNKNOWN))
check_eq "health 200 on the upgraded node" 200 "$(http_code GET /market/health)"
check_eq "every supervisor knew its children (the new binary of an upgrade too)" 0 \
    "$(grep -c 'which no list of the supervisor held' "$COUPON_DIR/fcgi.log")"

# --- (r) the reserve across an upgrade during a Redis outage ------------------------
section "(r)"
ID2=6202 BASE2=6202000000
health_seize_is() { http GET /market/health; [[ $(json_get "$HTTP_BODY" seize 2>/dev/null) == "$1" ]]; }
mk_activity "$ID2" 1000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
require "(r) the keeper set a reserve of $K aside" wait_for 20 field_is "$ID2" "" "$K"
require "(r) ... opened it, with more than half its lease left" \
    wait_for 20 eval 'reserves_open_on "" && lease_left_ms "" $((LEASE / 2))'
epoch2=$(mysql_q "SELECT CONCAT(incarnation, ':', epoch) FROM reserve_epoch WHERE activity_id = $ID2")
stack stop-redis --kill
require "(r) the node sells from its reserve while Redis is down" wait_for 5 health_seize_is reserve
told=()
for u in 1 2 3 4 5; do
    seize_settled "$ID2" "$(mint_jwt $((BASE2 + u)))"
    told+=("$SEIZE_CODE")
done
check_eq "(r) five users granted from the reserve" "SEIZED SEIZED SEIZED SEIZED SEIZED" "${told[*]}"
check "(r) five records in the journal" wait_for 5 metric_is couponseize_journal_depth 5
rc=0
build 6 || not_ok "(r) build 6 made"
stack upgrade-fcgi 2>"$COUPON_DIR/r.err" || rc=$?
sed 's/^/# /' "$COUPON_DIR/r.err"
check_eq "(r) the upgrade is taken while Redis is down" 0 "$rc"
check "(r) the node runs build 6" cmp -s "/proc/$COUPON_FCGI_PID/exe" "$BIN/build-6"
check "(r) the new keeper counts the five records" \
    wait_for 10 metric_is couponseize_journal_depth 5
seize_settled "$ID2" "$(mint_jwt $((BASE2 + 1)))"
check_match "(r) a granted user asking the new binary: not granted twice, not UNAVAILABLE" \
    '^(ALREADY_SEIZED|UNKNOWN_OUTCOME)$' "$SEIZE_CODE"
for u in 6 7 8; do
    seize_settled "$ID2" "$(mint_jwt $((BASE2 + u)))"
    told+=("$SEIZE_CODE")
done
diag "(r) three users after the upgrade, Redis still down: ${told[*]:5}"
stack start-redis
check "(r) the journal is replayed" wait_for 30 metric_is couponseize_journal_depth 0
check "(r) coupon-sync drained the queue" wait_for 60 drained $((ID2 % 10))
wrong=""
for u in 1 2 3 4 5 6 7 8; do
    n=$(coupons_of "$ID2" $((BASE2 + u)))
    case ${told[u - 1]} in
    SEIZED) [[ $n == 1 ]] ;;
    UNKNOWN_OUTCOME) [[ $n == 0 || $n == 1 ]] ;;
    *) [[ $n == 0 ]] ;;
    esac || wrong+="user $u told ${told[u - 1]} holds $n; "
done
check_eq "(r) every user holds what they were told (SEIZED: one coupon, else none)" "" "$wrong"
check_eq "(r) the epoch is the one set aside before the outage" "$epoch2" \
    "$(mysql_q "SELECT CONCAT(incarnation, ':', epoch) FROM reserve_epoch WHERE activity_id = $ID2")"
check_eq "(r) ... still open" 1 "$(mysql_q "SELECT state FROM reserve_epoch WHERE activity_id = $ID2")"
spent=$(printf '%s\n' "${told[@]}" | grep -c '^SEIZED$')
check "(r) the reserve in Redis is down by the $spent grants" \
    wait_for 10 field_is "$ID2" "" $((K - spent))
check "(r) the node spends on: $((K - spent)) left" \
    wait_for 10 metric_is couponseize_reserve_held $((K - spent))
check "(r) stock + reserves + coupons = total" balanced "$ID2" 1000
check_eq "(r) nothing went to the dead letters" 0 "$(metric couponseize_reserve_dead_letters_total)"
check_eq "(r) $spent users told SEIZED, $spent coupons" "$spent" "$(rows_of "$ID2")"

# --- (s) socket activation ----------------------------------------------------------------
section -i "(s)"
if skip_unless_cmd systemd-socket-activate >/dev/null; then
    stack stop-fcgi
    rm -f "$COUPON_FCGI_SOCK"
    build 7 || not_ok "(s) build 7 made"
    alog=$COUPON_DIR/activate.log
    # "PID MESSAGE" a line per datagram, the sender's pid from its credentials.
    python3 "$CS_TESTKIT" notify-listen "$COUPON_DIR/notify.sock" "$COUPON_DIR/notify.log" &
    npid=$!
    cs_defer stop_bg "$npid"
    wait_for 5 test -S "$COUPON_DIR/notify.sock"
    # (It passes on only the environment it is told to, as systemd does.)
    systemd-socket-activate -l "$COUPON_FCGI_SOCK" -E NOTIFY_SOCKET="$COUPON_DIR/notify.sock" \
        "$BIN/coupon-fcgi" -c "$COUPON_CONF" >>"$alog" 2>&1 &
    act=$!
    cs_defer stop_bg "$act"
    wait_for 5 test -S "$COUPON_FCGI_SOCK"
    # It execs the service on the first connection: $act is the supervisor.
    check_eq "(s) the activated supervisor serves" 200 "$(http_code GET /market/health)"
    ID3=6203
    mk_activity "$ID3" 1000000 -60 3600
    http POST /market/admin/coupon/preheat '' "$ADMIN"
    seize_load_bg "$COUPON_DIR/s.json" "$ID3" 16 4000 6203000000 -R 500
    spid=$LOAD_PID
    cs_defer stop_bg "$spid"
    # shellcheck disable=SC2034 # read by wait_for's eval
    s0=$(stock_of "$ID3")
    check "(s) the load is under way" wait_for 30 eval '(($(stock_of "$ID3") <= s0 - 500))'
    build 8 || not_ok "(s) build 8 made"
    kill -USR2 "$act"
    took() { sed -n "s/.*upgrade: supervisor \([0-9]*\) took over from $act:.*/\1/p" "$alog"; }
    check "(s) a new supervisor took over" wait_for 20 eval '[[ -n $(took) ]]'
    new=$(took)
    wait "$act"
    check_eq "(s) the old supervisor exited 0" 0 "$?"
    check "(s) the new one runs build 8" cmp -s "/proc/$new/exe" "$BIN/build-8"
    check_match "(s) systemd heard the old supervisor say ready at its start" \
        "(^|"$'\n'")$act READY=1" "$(cat "$COUPON_DIR/notify.log")"
    check_match "(s) ... reloading at SIGUSR2" "(^|"$'\n'")$act RELOADING=1" \
        "$(cat "$COUPON_DIR/notify.log")"
    check_match "(s) ... then name the new one its main process, ready" \
        "(^|"$'\n'")$act MAINPID=$new\|READY=1" "$(cat "$COUPON_DIR/notify.log")"
    check_eq "(s) the new one said nothing before it was named (NotifyAccess=main)" "" \
        "$(sed -n "/^$act MAINPID=/q; /^$new /p" "$COUPON_DIR/notify.log")"
    wait "$spid"
    out=$(cat "$COUPON_DIR/s.json")
    check_eq "(s) all 4,000 seizes SEIZED across the upgrade" 4000 "$(code_count "$out" SEIZED)"
    kill -TERM "$new"
    check "(s) the new supervisor stops on SIGTERM" wait_for 40 eval '! pid_alive "$new"'
    check "(s) ... and leaves the socket file to its owner" test -S "$COUPON_FCGI_SOCK"
else
    diag "(s) skipped: systemd-socket-activate is not installed"
fi
finish
