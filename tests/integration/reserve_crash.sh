#!/usr/bin/env bash
# reserve_crash.sh - node reserves through crashes (internals.md rules 6, 7
# and 13), with real servers and every answer recorded per user:
#  (d) during a Redis outage a worker dies (SIGKILL) between the journal
#      append and its answer (COUPONSEIZE_FAULT=crash-after-journal): its user
#      gets no answer; the node is then restarted with that record unreplayed.
#      Once Redis is back the grant is honoured exactly once: one coupon in
#      MySQL, a repeated seize is ALREADY_SEIZED, stock + held + coupons = total;
#  (f) the whole node killed (kill -9) mid-outage after SEIZED answers from its
#      reserve, a torn record appended to a journal segment, the node started
#      again while Redis is still down: the tail is cut back to whole records,
#      the journal is replayed, every user told SEIZED holds one coupon, and
#      the reserve goes on with amount - granted tokens, not a fresh one.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

skip_unless_cmd cgi-fcgi || skip_all "cgi-fcgi is not installed (Debian libfcgi-bin)"
K=20
# The grants of an outage must come within the lease the last renewal
# before it gave; nothing here waits for the lease to end, so it scales with
# the machine: 30 s lapsed after 6 of reserve.sh (c)'s 10 users beside
# stress-ng (the breaker opened 20 s after the kill), and users were then
# told UNAVAILABLE, truthfully, by a node that still held tokens.
LEASE=$((30000 * CS_TIME_SCALE))
export COUPON_WORKERS=4
export COUPON_CONF_OVERRIDES="fallback.reserve=$K
fallback.lease_ms=$LEASE
${COUPON_CONF_OVERRIDES:-}"
cs_stack_up
ADMIN=$(mint_jwt 1 admin)
# The size of one journal record, as lib/node/journal.h says.
REC=$((8 + $(sed -n 's/^#define JOURNAL_PAYLOAD \([0-9]*\).*/\1/p' "$top_srcdir/lib/node/journal.h")))
T0=$(date +%s%N)

# field_of ID NODE: what node NAME's open reserve of activity ID holds in Redis.
# coupons_of ID USER: the coupons of activity ID the user holds, in any status.
coupons_of() {
    mysql_q "SELECT COUNT(*) FROM coupon WHERE activity_id = $1 AND user_id = $2"
}
# segments NODE: node NAME's journal segment files, one a line.
segments() { compgen -G "$COUPON_DIR/$1/journal/w*-*.jnl" || true; }
# jrecs_of NODE: jrecs of all node NAME's segments.
jrecs_of() {
    local files=()
    mapfile -t files < <(segments "$1")
    ((${#files[@]} == 0)) || jrecs "${files[@]}"
}
# jrecs FILE...: the whole records of journal files (lib/node/journal.h layout,
# little-endian; a torn tail left out), one "activity epoch token user" a line.
jrecs() { checker journal "$REC" "$@"; }

# ask WHERE ID USER LOG: one seize of activity ID by USER, through nginx
# (WHERE = web) or straight to node WHERE's socket. ANSWER is its code,
# NO_ANSWER when nothing came back (a worker that died: cgi-fcgi fails, a web
# server would answer its own error). Appends "ms status code user
# latency_us" to LOG (loadgen -L's format, so seize_judge reads it).
ask() {
    local where=$1 id=$2 user=$3 log=$4 tok t0 t1
    tok=$(mint_jwt "$user")
    [[ -f $log ]] || echo "# start_epoch_ms $((T0 / 1000000))" >"$log"
    t0=$(date +%s%N)
    if [[ $where == web ]]; then
        http POST /market/consumer/coupon/seize "{\"id\":$id}" "$tok"
    else
        node_http "$where" POST /market/consumer/coupon/seize "{\"id\":$id}" "$tok"
    fi
    t1=$(date +%s%N)
    ANSWER=$(json_get "$HTTP_BODY" code 2>/dev/null) || ANSWER=
    if [[ -z $ANSWER ]]; then ANSWER=NO_ANSWER HTTP_CODE=0; fi
    echo "$(((t0 - T0) / 1000000)) $HTTP_CODE $ANSWER $user $(((t1 - t0) / 1000))" >>"$log"
}
# ask_settled WHERE ID USER LOG: ask() again while the answer is
# UNKNOWN_OUTCOME (a worker whose connection died with Redis answers its
# first seize so: the script was written), at most 6 times.
ask_settled() {
    local i
    for i in 1 2 3 4 5 6; do
        ask "$@"
        [[ $ANSWER != UNKNOWN_OUTCOME ]] && return 0
    done
}
# judge NAME ID LOG [FIRST_USER]: seize_judge on LOG, each user's last answer, with no
# answer read as UNKNOWN_OUTCOME (what rule 13 has a web server say for a
# worker that died).
judge() {
    sed 's/ 0 NO_ANSWER / 502 UNKNOWN_OUTCOME /' "$3" >"$3.judged"
    seize_judge "$1" "$2" "$3.judged" "${4:-0}"
}
codes() { awk 'NR > 1 { n[$3]++ } END { for (c in n) printf "%s=%d ", c, n[c] }' "$1"; }

# keeper_log NODE: the last lines node NODE's reserve keeper logged (when a
# precondition on its reserve failed).
keeper_log() {
    grep -h 'reserve keeper' "$COUPON_DIR/$1/fcgi.log" 2>/dev/null | tail -n 8 | sed 's/^/#   /'
}
# in_lease NODE: node NODE's keeper opened its reserves and renews its lease
# (more than half of it left), so an outage from now finds them spendable.
in_lease() { reserves_open_on "$1" && lease_left_ms "$1" $((LEASE / 2)); }

# --- (d) a worker killed between the journal append and its answer -------------------
section "(d)"
NODE_ENV=COUPONSEIZE_FAULT=crash-after-journal node_up n2
mk_activity 4101 1000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
require "(d) both nodes set a reserve of $K aside" wait_for 15 reserved 4101 $((2 * K))
check_eq "(d) node 2's reserve is in Redis" "$K" "$(field_of 4101 n2)"
LOG_D=$COUPON_DIR/d.log
# Both nodes' workers cache the sale, through Redis (users 1-8).
for u in 1 2 3 4; do
    ask web 4101 $((4101000 + u)) "$LOG_D"
    ask n2 4101 $((4101000 + u + 4)) "$LOG_D"
done
check_eq "(d) the warm-up was granted by Redis" "SEIZED=8 " "$(codes "$LOG_D")"
# Redis in the set-aside is not yet a reserve the node may spend: its keeper
# opens it a pass later, once the set-aside is durable and its epoch read
# back from MySQL (slow beside a disk hog). Killed before that, Redis leaves
# a node that rightly sells nothing: health "none", its user told
# UNAVAILABLE, as in a fresh-clone run where nine checks then failed after
# this one (the likeliest cause: the test did not wait for the opening).
require "(d) both nodes opened their reserves, within their leases" \
    wait_for 20 eval 'in_lease n2 && in_lease ""' || keeper_log n2
stack stop-redis --kill
require "(d) node 2: seizes from the reserve while Redis is down" \
    wait_for 5 node_health_says n2 reserve || keeper_log n2
# Node 1 grants a few from its reserve meanwhile.
for u in 11 12 13 14 15; do ask_settled web 4101 $((4101000 + u)) "$LOG_D"; done
VICTIM=4101100
ask_settled n2 4101 "$VICTIM" "$LOG_D"
check_eq "(d) the user whose worker died got no answer" NO_ANSWER "$ANSWER"
check "(d) node 2's supervisor saw its worker killed by SIGKILL" \
    wait_for 5 grep -q 'killed by signal 9' "$COUPON_DIR/n2/fcgi.log"
check_eq "(d) the grant is in node 2's journal, once" "4101 1 0 $VICTIM" \
    "$(jrecs_of n2)"
check "(d) node 2 counts one journal record" wait_for 5 metric_is couponseize_journal_depth 1 n2
check_eq "(d) node 2's reserve holds $((K - 1)) spendable" $((K - 1)) \
    "$(metric couponseize_reserve_held n2)"
# Asked again on the same node: the record is on disk, so it is a grant (the
# keeper's next pass says so), and nothing is granted twice.
asked_is() { ask "$1" "$2" "$3" "$4"; [[ $ANSWER == "$5" ]]; }
check "(d) a repeated seize while Redis is down: ALREADY_SEIZED, no second grant" \
    wait_for 5 asked_is n2 4101 "$VICTIM" "$LOG_D.again" ALREADY_SEIZED
check_eq "(d) still one record in the journal" 1 "$(jrecs_of n2 | wc -l)"

# The node restarted with the record unreplayed (Redis still down), this time
# without the fault.
OVER_D=$(seizes_over 1 n2)
node_down n2
check_eq "(d) the stop left the record in the journal" "4101 1 0 $VICTIM" \
    "$(jrecs_of n2)"
check_eq "(d) node 2's epoch stays open (not given back without Redis)" "1 $K" \
    "$(mysql_q "SELECT state, amount FROM reserve_epoch WHERE activity_id = 4101
                AND incarnation = '$(cat "$COUPON_DIR/n2/journal/incarnation")'" | tr '\t' ' ')"
NODE_ENV='' node_up n2
check "(d) the restarted node 2 counts the record" wait_for 10 metric_is couponseize_journal_depth 1 n2
ask_settled n2 4101 "$VICTIM" "$LOG_D.again"
check_match "(d) a repeated seize on the restarted node: not a second grant, not UNAVAILABLE" \
    '^(ALREADY_SEIZED|UNKNOWN_OUTCOME)$' "$ANSWER"
check_eq "(d) still one record in the journal" 1 "$(jrecs_of n2 | wc -l)"

stack start-redis
check "(d) node 2 replayed its journal" wait_for 20 metric_is couponseize_journal_depth 0 n2
check "(d) node 1 replayed its journal" wait_for 20 metric_is couponseize_journal_depth 0
check "(d) coupon-sync drained the queue" wait_for 60 drained 1
check_eq "(d) the user whose worker died holds exactly one coupon" 1 "$(coupons_of 4101 "$VICTIM")"
ask_settled n2 4101 "$VICTIM" "$LOG_D.again"
check_eq "(d) a repeated seize on node 2 once replayed: ALREADY_SEIZED" ALREADY_SEIZED "$ANSWER"
ask_settled web 4101 "$VICTIM" "$LOG_D.again"
check_eq "(d) a repeated seize on node 1: ALREADY_SEIZED" ALREADY_SEIZED "$ANSWER"
check_eq "(d) node 2's reserve in Redis is down by its one token" $((K - 1)) "$(field_of 4101 n2)"
check "(d) node 2 spends again: $((K - 1)) left" wait_for 10 metric_is couponseize_reserve_held $((K - 1)) n2
judge "(d) outage" 4101 "$LOG_D" 4101000
# The budget by the nodes' own clocks; the clients' (cgi-fcgi and curl
# started per seize) is shown: beside a hog it passed 1 s by itself.
diag "(d) the slowest answer as its client saw it: $MAX_MS ms"
check_eq "(d) every seize answered within fallback.budget_ms (1 s), by node 1 and both lives of node 2" \
    "0 0 0" "$(seizes_over 1) $OVER_D $(seizes_over 1 n2)"
diag "(d) answers: $(codes "$LOG_D"); repeated seizes of the user whose worker died: $(codes "$LOG_D.again")"
check_eq "(d) nothing went to the dead letters" "0 0" \
    "$(metric couponseize_reserve_dead_letters_total) $(metric couponseize_reserve_dead_letters_total n2)"
check "(d) stock + reserves + coupons = total" balanced 4101 1000
node_down n2

# --- (f) the whole node killed mid-outage, a torn journal tail --------------------------
# (d)'s steps all ran, whatever its checks said: Redis is up, node 2 stopped.
section -i "(f)"
node_up n3
mk_activity 4102 1000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
require "(f) both nodes set a reserve of $K aside" wait_for 15 reserved 4102 $((2 * K))
# Node 3 holds a reserve of each open sale (4101 too): its gauge counts both.
require "(f) node 3 holds $((2 * K)) in all" \
    wait_for 15 metric_is couponseize_reserve_held $((2 * K)) n3
INC3=$(cat "$COUPON_DIR/n3/journal/incarnation")
LOG_F=$COUPON_DIR/f.log
for u in 1 2 3 4; do ask n3 4102 $((4102000 + u)) "$LOG_F"; done
check_eq "(f) the warm-up was granted by Redis" "SEIZED=4 " "$(codes "$LOG_F")"
require "(f) node 3 renews its lease" wait_for 20 in_lease n3 || keeper_log n3
stack stop-redis --kill
require "(f) node 3: seizes from the reserve while Redis is down" \
    wait_for 5 node_health_says n3 reserve || keeper_log n3
G=8
for u in $(seq 101 $((100 + G))); do ask_settled n3 4102 $((4102000 + u)) "$LOG_F"; done
told=$(awk 'NR > 1 && $3 == "SEIZED" && $4 > 4102100 { print $4 }' "$LOG_F" | sort -n)
S=$(wc -w <<<"$told")
check_eq "(f) node 3 told all $G users SEIZED from its reserve" "$G" "$S"
check_eq "(f) ... and holds $((K - S)) more of it" $((2 * K - S)) "$(metric couponseize_reserve_held n3)"
OVER_F=$(seizes_over 1 n3)
node_down n3 KILL
check_eq "(f) the journal holds exactly the users told SEIZED" "$told" \
    "$(jrecs_of n3 | awk '{ print $4 }' | sort -n)"
# The longest segment gets a torn record: a length, a CRC and part of a payload.
seg=$(segments n3 | while read -r f; do echo "$(stat -c %s "$f") $f"; done | sort -rn |
    head -n1 | cut -d' ' -f2-)
size0=$(stat -c %s "$seg")
good=$(jrecs "$seg" | awk '{ print $4 }' | sort -n)
printf '\x24\x00\x00\x00\xde\xad\xbe\xef\x06\x10\x00\x00\x00\x00\x00\x00\x01\x00' >>"$seg"
diag "(f) $(basename "$seg"): $size0 bytes ($((size0 / REC)) records) + 18 torn"
check_eq "(f) the segment now ends in a torn record" $((size0 + 18)) "$(stat -c %s "$seg")"
size_is() { [[ $(stat -c %s "$1") == "$2" ]]; }
node_up n3
check "(f) the restarted node cut the torn tail: $size0 bytes again" wait_for 10 size_is "$seg" "$size0"
check_eq "(f) ... a whole number of records" 0 $(($(stat -c %s "$seg") % REC))
check_eq "(f) ... the good records are all still there" "$good" \
    "$(jrecs "$seg" | awk '{ print $4 }' | sort -n)"
check_match "(f) the node logged the cut" "torn tail of 18 bytes cut off after $((size0 / REC)) records" \
    "$(grep -h 'torn tail' "$COUPON_DIR/n3/fcgi.log")"
check "(f) the restarted node counts the $S records" wait_for 10 metric_is couponseize_journal_depth "$S" n3
check_eq "(f) no fresh reserve while the journal is unreplayed" 0 "$(metric couponseize_reserve_held n3)"
# Asked again while Redis is still away: never a second grant.
for u in $(seq 101 $((100 + G))); do ask_settled n3 4102 $((4102000 + u)) "$LOG_F.again"; done
check_eq "(f) those told SEIZED, asking again before the replay: none SEIZED, none UNAVAILABLE" "" \
    "$(awk 'NR > 1 && ($3 == "SEIZED" || $3 == "UNAVAILABLE") { print $4, $3 }' "$LOG_F.again")"
ask_settled n3 4102 4102900 "$LOG_F.new"
check_eq "(f) a new user before the replay: UNAVAILABLE" UNAVAILABLE "$ANSWER"

stack start-redis
check "(f) node 3 replayed its journal" wait_for 20 metric_is couponseize_journal_depth 0 n3
check "(f) node 3 spends again: amount - granted = $((K - S)) (and $K of 4101)" \
    wait_for 10 metric_is couponseize_reserve_held $((2 * K - S)) n3
check_eq "(f) its reserve in Redis is down by the $S tokens" $((K - S)) "$(field_of 4102 n3)"
check_eq "(f) the same epoch, still open, never a fresh one" "1 1 $K" \
    "$(mysql_q "SELECT epoch, state, amount FROM reserve_epoch WHERE activity_id = 4102
                AND incarnation = '$INC3'" | tr '\t' ' ')"
check "(f) coupon-sync drained the queue" wait_for 60 drained 2
judge "(f) outage before the kill" 4102 "$LOG_F" 4102000
diag "(f) the slowest answer as its client saw it: $MAX_MS ms"
check_eq "(f) every seize answered within fallback.budget_ms (1 s), by node 3's clock" 0 "$OVER_F"
bad=0
for u in $told; do [[ $(coupons_of 4102 "$u") == 1 ]] || ((bad++)); done
check_eq "(f) every user told SEIZED holds exactly one coupon" 0 "$bad"
check "(f) stock + reserves + coupons = total" balanced 4102 1000

# What is left of the epoch is what a second outage can grant, and no more.
require "(f) node 3 reopened its reserves, within its lease" wait_for 20 in_lease n3 ||
    keeper_log n3
stack stop-redis --kill
require "(f) node 3: seizes from the reserve while Redis is down again" \
    wait_for 5 node_health_says n3 reserve || keeper_log n3
for u in $(seq 201 $((200 + K - S + 4))); do ask_settled n3 4102 $((4102000 + u)) "$LOG_F.2"; done
check_eq "(f) a second outage grants exactly amount - granted, then UNAVAILABLE" \
    "SEIZED=$((K - S)) UNAVAILABLE=4" \
    "$(awk '{ print $3 }' <(tail -n +2 "$LOG_F.2") | sort | uniq -c | awk '$2 != "UNKNOWN_OUTCOME" { printf "%s%s=%d", s, $2, $1; s = " " }')"
stack start-redis
check "(f) node 3 replayed its journal again" wait_for 20 metric_is couponseize_journal_depth 0 n3
check "(f) coupon-sync drained the queue again" wait_for 60 drained 2
judge "(f) second outage" 4102 "$LOG_F.2" 4102201
diag "(f) second outage: the slowest answer as its client saw it: $MAX_MS ms"
check_eq "(f) since the kill, every seize answered within fallback.budget_ms, by node 3's clock" 0 \
    "$(seizes_over 1 n3)"
check_eq "(f) no user holds two coupons" "" \
    "$(mysql_q "SELECT user_id FROM coupon WHERE activity_id = 4102
                GROUP BY user_id HAVING COUNT(*) > 1")"
check_eq "(f) nothing went to the dead letters" 0 "$(metric couponseize_reserve_dead_letters_total n3)"
check "(f) after it: stock + reserves + coupons = total" balanced 4102 1000
diag "(f) answers: $(codes "$LOG_F"); asked again: $(codes "$LOG_F.again"); second outage: $(codes "$LOG_F.2")"
diag "run time $((($(date +%s%N) - T0) / 1000000000)) s"

finish
