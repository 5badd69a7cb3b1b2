#!/usr/bin/env bash
# reserve_tokens.sh - a token is spent once, for ever (internals.md rule 14),
# with real servers, kill -9 and every answer judged per user afterwards:
#  (a) Redis killed, three users told SEIZED from node 2's reserve; Redis
#      back, the grants replayed and their segments deleted; node 2 killed
#      (kill -9 of supervisor, workers and keeper) and started again: it
#      resumes at amount - tokens spent (never above what Redis' reserve
#      field holds), not at the epoch's full amount. Redis killed again,
#      twenty users seize; after the replay every user told SEIZED holds
#      exactly one coupon, and nothing is lost silently;
#  (b) a token whose replay marker already names another user (spent
#      twice) is an anomaly: it goes to the dead letters, the metrics count
#      it and the keeper logs it at error level; it is never counted as the
#      same grant replayed. The user was told SEIZED and the sale has stock:
#      the grant takes a coupon from it, and the dead letter says so;
#  (c) a grant made after a keeper pass read the journal, in a pass that
#      then decides to give the reserve back (the last token spent): the
#      give-back waits for a pass whose replay saw it (rule 8: stop, wait
#      for grants in flight, replay to the end, give back). Before, the
#      token went back to stock with the reserve and its record was skipped
#      as "replayed before its epoch was given back": a user told SEIZED
#      held nothing. The keeper is held between its replay and its decisions
#      (COUPONSEIZE_PAUSE_AT=keeper-decide), so the interleaving is made, not
#      waited for;
#  (d) the same after a whole-node kill -9 (nemesis seed 86): node 3 sold
#      from its reserve, replayed, was killed and started again with two
#      tokens left; its fresh workers, whose metadata read times out (Redis
#      paused: CLIENT PAUSE ALL), grant both from the reserve after a keeper
#      pass read the journal. Nothing goes back to stock before those grants
#      are replayed, and both users hold their coupon.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

skip_unless_cmd cgi-fcgi || skip_all "cgi-fcgi is not installed (Debian libfcgi-bin)"
K=20
export COUPON_WORKERS=2
# breaker_open_ms is the default, written out so that (c) can lengthen it
# on one node.
export COUPON_CONF_OVERRIDES="fallback.reserve=$K
fallback.lease_ms=$((30000 * CS_TIME_SCALE))
redis.breaker_open_ms=500
${COUPON_CONF_OVERRIDES:-}"
cs_stack_up
ADMIN=$(mint_jwt 1 admin)

# told_seized LOG: the users LOG says were told SEIZED, one a line.
told_seized() { awk '$2 == "SEIZED" { print $1 }' "$1"; }
# coupons_of ID USER: the coupons of activity ID the user holds, in any status.
segments() { compgen -G "$COUPON_DIR/$1/journal/w*-*.jnl" || true; }
# no_segments NODE: node NODE has no journal segment left. A worker lets go
# of a segment the keeper moved it off after its next request, so each call
# sends it one.
no_segments() {
    node_http "$1" GET /market/health
    [[ -z $(segments "$1") ]]
}

A=4201
node_up n2
mk_activity $A 1000000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check "(a) node 2 opened its reserve of $K" wait_for 20 reserves_open_on n2
check "(a) node 1 opened its reserve too" wait_for 20 reserves_open_on
check_eq "(a) node 2's reserve in Redis" "$K" "$(field_of $A n2)"

# Outage 1: three users told SEIZED from node 2's reserve.
L1=$COUPON_DIR/outage1.log
: >"$L1"
stack stop-redis --kill
check "(a) node 2 seizes from its reserve while Redis is down" \
    wait_for 5 node_health_says n2 reserve
for u in 1 2 3; do seize_on n2 $A $((A * 1000 + u)) "$L1"; done
check_eq "(a) outage 1: the three users were told SEIZED" 3 "$(told_seized "$L1" | wc -l)"

# Redis back: replayed, durable, and the replayed segments deleted.
stack start-redis
check "(a) node 2 replayed its journal" wait_for 20 metric_is couponseize_journal_depth 0 n2
check "(a) node 2 deleted its replayed segments" wait_for 20 no_segments n2
check "(a) the keeper logged a deletion" \
    grep -q 'replayed; deleted' "$COUPON_DIR/n2/fcgi.log"
check_eq "(a) node 2's reserve in Redis is down by 3" $((K - 3)) "$(field_of $A n2)"
check_eq "(a) the tokens file in the journal directory says 3 were spent" "$A 1 3" \
    "$(cat "$COUPON_DIR/n2/journal/tokens")"

# A power cut: the whole node killed, started again.
node_down n2 KILL
node_up n2
check "(a) the restarted node 2 spends again" \
    wait_for 20 metric_is couponseize_reserve_epochs 1 n2
wait_for 20 reserves_open_on n2 || true
check_eq "(a) the restarted node 2 holds amount - spent = $((K - 3)), what Redis holds" \
    "$((K - 3)) $((K - 3))" "$(metric couponseize_reserve_held n2) $(field_of $A n2)"

# Outage 2: twenty users.
L2=$COUPON_DIR/outage2.log
: >"$L2"
stack stop-redis --kill
check "(a) node 2 seizes from its reserve while Redis is down again" \
    wait_for 5 node_health_says n2 reserve
for u in $(seq 101 120); do seize_on n2 $A $((A * 1000 + u)) "$L2"; done
S2=$(told_seized "$L2" | wc -l)
diag "(a) outage 2: $S2 of 20 told SEIZED: $(awk '{ print $2 }' "$L2" | sort | uniq -c | tr -s ' \n' ' ')"
check_eq "(a) outage 2: never more told SEIZED than the reserve had left" 1 $((S2 <= K - 3))
stack start-redis
check "(a) node 2 replayed its journal again" wait_for 20 metric_is couponseize_journal_depth 0 n2
check "(a) coupon-sync drained the queue" wait_for 60 drained $((A % 10))

bad=0
for u in $(told_seized "$L1") $(told_seized "$L2"); do
    n=$(coupons_of $A "$u")
    [[ $n == 1 ]] || { bad=$((bad + 1)); diag "(a) user $u was told SEIZED and holds $n"; }
done
check_eq "(a) every user told SEIZED (both outages) holds exactly one coupon" 0 "$bad"
check_eq "(a) nothing went to the dead letters" "0 0" \
    "$(metric couponseize_reserve_dead_letters_total n2) $(rcli HLEN "COUPON:RESERVE:DEAD:{$((A % 10))}")"
check_eq "(a) no replay found a marker of another user" 0 \
    "$(metric couponseize_reserve_anomalies_total n2)"
check "(a) stock + reserves + coupons = total" balanced $A 1000000
check_eq "(a) the restart needed no correction from Redis: the tokens file had it" "" \
    "$(grep 'resuming at token' "$COUPON_DIR/n2/fcgi.log")"

# --- (b) a marker of another user ---------------------------------------------------
B=4202
INC2=$(cat "$COUPON_DIR/n2/journal/incarnation")
mk_activity $B 1000000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check "(b) node 2 set a reserve of $B aside" wait_for 20 field_is $B n2 $K
check "(b) ... and opened it" wait_for 20 reserves_open_on n2
EP=$(mysql_q "SELECT epoch FROM reserve_epoch WHERE activity_id = $B AND incarnation = '$INC2'")
# The token node 2 hands out next is marked as replayed for someone else.
rcli HSET "COUPON:RESERVE:EPOCH:${B}_{$((B % 10))}" "$INC2:$EP:0" 999 >/dev/null
check_eq "(b) the planted marker" 999 "$(rcli HGET "COUPON:RESERVE:EPOCH:${B}_{$((B % 10))}" "$INC2:$EP:0")"
LB=$COUPON_DIR/b.log
: >"$LB"
stack stop-redis --kill
check "(b) node 2 seizes from its reserve while Redis is down" \
    wait_for 5 node_health_says n2 reserve
seize_on n2 $B $((B * 1000 + 1)) "$LB"
check_eq "(b) the user was told SEIZED" SEIZED "$(awk '{ print $2 }' "$LB")"
stack start-redis
check "(b) node 2 replayed its journal" wait_for 20 metric_is couponseize_journal_depth 0 n2
check_eq "(b) the anomaly is counted" "1 1" \
    "$(metric couponseize_reserve_anomalies_total n2) $(metric couponseize_reserve_dead_letters_total n2)"
check_match "(b) ... in the dead letters with the user" "^$((B * 1000 + 1)):.*spent twice.*granted from stock$" \
    "$(rcli HGET "COUPON:RESERVE:DEAD:{$((B % 10))}" "$B:$INC2:$EP:0:$((B * 1000 + 1))")"
check_eq "(b) the user told SEIZED holds a coupon from the stock" 1 \
    "$(rcli HEXISTS "COUPON:SEIZE:LIST:${B}_{$((B % 10))}" $((B * 1000 + 1)))"
check "(b) ... and logged at error level" \
    grep -q "error.*was replayed before for another user" "$COUPON_DIR/n2/fcgi.log"
check_eq "(b) the marker still names the first user" 999 \
    "$(rcli HGET "COUPON:RESERVE:EPOCH:${B}_{$((B % 10))}" "$INC2:$EP:0")"

# --- (c) a grant between the keeper's replay and its give-back ---------------------
# Node 3's breaker, once open, stays open (no worker probes Redis for ten
# minutes): its workers grant from the reserve while its keeper reaches
# Redis. Its keeper stops after each pass's replay; a loop lets it go on
# while $GO is there.
C=4203
GO=$COUPON_DIR/keeper-go
cs_defer rm -f "$GO"
cs_defer node_down n3 KILL # before node_up's own graceful stop: a held keeper would hang it
NODE_ENV="COUPONSEIZE_PAUSE_AT=keeper-decide" node_up n3 breaker_open_ms=600000
check_match "(c) node 3's breaker stays open for ten minutes" "breaker_open_ms = 600000;" \
    "$(cat "$COUPON_DIR/n3/couponseize.conf")"
KEEPER_NODE=n3
keeper_go
mk_activity $C 1000000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check "(c) node 3 set a reserve of $K aside" wait_for 20 field_is $C n3 $K
check "(c) ... and opened it" wait_for 20 reserves_open_on n3
INC3=$(cat "$COUPON_DIR/n3/journal/incarnation")
EP3=$(mysql_q "SELECT epoch FROM reserve_epoch WHERE activity_id = $C AND incarnation = '$INC3'")
# Warm-up through Redis: node 3's workers cache the sale, so that in the
# outage a seize goes to Redis, fails and opens the breaker (a seize whose
# metadata cannot be read goes to the reserve without counting).
LW=$COUPON_DIR/c-warm.log
: >"$LW"
for u in $(seq 101 110); do seize_on n3 $C $((C * 1000 + u)) "$LW"; done
check_eq "(c) ten warm-up users were told SEIZED by Redis" 10 "$(told_seized "$LW" | wc -l)"
opened0=$(metric couponseize_breaker_opened_total n3)
LC=$COUPON_DIR/c.log
: >"$LC"
stack stop-redis --kill
check "(c) node 3 seizes from its reserve while Redis is down" \
    wait_for 5 node_health_says n3 reserve
# All but the last token: users until K - 1 are told SEIZED (a refusal is
# shown, not judged here: every answer is judged per user below).
for ((u = 1; u <= 3 * K && $(told_seized "$LC" | wc -l) < K - 1; u++)); do
    seize_on n3 $C $((C * 1000 + u)) "$LC"
done
diag "(c) answers: $(awk '{ n[$2]++ } END { for (c in n) printf "%s:%d ", c, n[c] }' "$LC")"
check_eq "(c) $((K - 1)) users were told SEIZED from the reserve" $((K - 1)) \
    "$(told_seized "$LC" | wc -l)"
(($(told_seized "$LC" | wc -l) == K - 1)) ||
    diag "(c) node 3: $(grep -E "warning|error" "$COUPON_DIR/n3/fcgi.log" | tail -n 8)"
check "(c) node 3's breaker opened (and stays open)" \
    test "$(metric couponseize_breaker_opened_total n3)" -gt "${opened0:-0}"
stack start-redis
check "(c) node 3 replayed them" wait_for 20 metric_is couponseize_journal_depth 0 n3
check_eq "(c) node 3's reserve in Redis holds its last token" 1 "$(field_of $C n3)"
# The keeper stops after a pass's replay, before its decisions; the last
# token is granted then, with Redis up (node 3's breaker still open).
check "(c) node 3's keeper is held after its replay" keeper_hold
seize_on n3 $C $((C * 1000 + 999)) "$LC"
check_eq "(c) the last token's user was told SEIZED" SEIZED "$(tail -n 1 "$LC" | cut -d' ' -f2)"
check "(c) ... while the keeper was still held" keeper_held
keeper_go
# spent_given_back PART ID LAST ROWS WHO LOG...: node 3 gave its spent reserve
# of ID (epoch EP3 of INC3) back with nothing back to stock once it replayed
# LAST; afterwards ROWS coupons (held by WHO), every user of the LOGs judged,
# no dead letter, the books balanced. The epoch is closed in MySQL once given
# back (the keeper may set a new reserve aside at once, under the same field).
spent_given_back() {
    local part=$1 id=$2 last=$3 rows=$4 who=$5
    shift 5
    epoch_closed() { [[ $(mysql_q "SELECT state FROM reserve_epoch WHERE activity_id = $id
        AND incarnation = '$INC3' AND epoch = $EP3") == 2 ]]; }
    check "$part node 3 gave its spent reserve back" wait_for 20 epoch_closed
    check "$part node 3 replayed $last" wait_for 20 metric_is couponseize_journal_depth 0 n3
    check_match "$part nothing went back to stock: every token was granted" \
        "activity $id epoch $EP3: 0 given back" "$(grep "activity $id epoch" "$COUPON_DIR/n3/fcgi.log")"
    check "$part coupon-sync drained the queue" wait_for 60 drained $((id % 10))
    check_eq "$part every user told SEIZED holds exactly one coupon, one refused none" 0 \
        "$(users_misjudged "$id" "$part" "$@")"
    check_eq "$part $who hold a coupon" "$rows" "$(rows_of "$id")"
    check_eq "$part nothing went to the dead letters" 0 \
        "$(rcli HLEN "COUPON:RESERVE:DEAD:{$((id % 10))}")"
    check "$part stock + reserves + coupons = total" balanced "$id" 1000000
}
spent_given_back "(c)" $C "the last grant" $((K + 10)) \
    "$K users of the reserve and ten of the warm-up" "$LW" "$LC"
rm -f "$GO"
wait "$GO_PID"
node_down n3 KILL

# --- (d) the restarted node's first workers, between a replay and a decision -----------
D=4204
NODE_ENV="COUPONSEIZE_PAUSE_AT=keeper-decide" node_up n3 breaker_open_ms=600000
keeper_go
mk_activity $D 1000000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check "(d) node 3 set a reserve of $K aside" wait_for 20 field_is $D n3 $K
check "(d) ... and opened it" wait_for 20 reserves_open_on n3
INC3=$(cat "$COUPON_DIR/n3/journal/incarnation")
EP3=$(mysql_q "SELECT epoch FROM reserve_epoch WHERE activity_id = $D AND incarnation = '$INC3'
    AND state = 1")
LD=$COUPON_DIR/d.log
: >"$LD"
stack stop-redis --kill
check "(d) node 3 seizes from its reserve while Redis is down" \
    wait_for 5 node_health_says n3 reserve
for ((u = 1; u <= 3 * K && $(told_seized "$LD" | wc -l) < K - 2; u++)); do
    seize_on n3 $D $((D * 1000 + u)) "$LD"
done
check_eq "(d) $((K - 2)) users were told SEIZED from the reserve" $((K - 2)) \
    "$(told_seized "$LD" | wc -l)"
stack start-redis
check "(d) node 3 replayed them" wait_for 20 metric_is couponseize_journal_depth 0 n3
check_eq "(d) node 3's reserve in Redis holds its last two tokens" 2 "$(field_of $D n3)"
rm -f "$GO"
wait "$GO_PID"
node_down n3 KILL
NODE_ENV="COUPONSEIZE_PAUSE_AT=keeper-decide" node_up n3 breaker_open_ms=600000
keeper_go
check "(d) node 3, started again, reopened its reserve" wait_for 20 reserves_open_on n3
check_match "(d) ... with the two tokens left" "activity $D epoch $EP3: 2 of $K tokens spendable" \
    "$(grep "activity $D epoch" "$COUPON_DIR/n3/fcgi.log")"
# A pass that began with the slot open has read the journal; its keeper is
# held before its decisions. Redis is paused for everyone: the restarted
# workers (their metadata caches cold) cannot read the sale, and grant from
# the reserve, within redis.command_timeout_ms.
check "(d) node 3's keeper is held after a replay" keeper_hold
LD2=$COUPON_DIR/d2.log
: >"$LD2"
rcli CLIENT PAUSE $((4000 * CS_TIME_SCALE)) ALL >/dev/null
seize_on n3 $D $((D * 1000 + 901)) "$LD2"
seize_on n3 $D $((D * 1000 + 902)) "$LD2"
check_eq "(d) the two users were told SEIZED from the reserve" 2 "$(told_seized "$LD2" | wc -l)"
check "(d) ... while the keeper was still held" keeper_held
# Redis answers again before the keeper decides: a give-back then would run.
rcli CLIENT UNPAUSE >/dev/null
keeper_go
spent_given_back "(d)" $D "the two grants" $K "$K users of the reserve" "$LD" "$LD2"
rm -f "$GO"
wait "$GO_PID"
node_down n3 KILL

finish
