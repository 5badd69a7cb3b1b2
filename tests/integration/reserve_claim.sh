#!/usr/bin/env bash
# reserve_claim.sh - one live instance per incarnation, anywhere (internals.md
# rule 15), with real servers and every answer judged per user afterwards:
#  (a) node 2's journal directory is copied (a copied image, a restored
#      backup) and node 3 runs on the copy, with the same incarnation while
#      node 2 lives. Node 3 finds the incarnation claimed in Redis by node 2
#      (host, boot id, pid) and spends nothing: during a Redis outage node 2
#      grants from its reserve and node 3 answers UNAVAILABLE. After the
#      replay every user told SEIZED holds exactly one coupon, and no token
#      was spent twice;
#  (b) node 2 killed (kill -9) and started again on its own directory: the
#      claim of its dead keeper (same host and boot) is taken over at once;
#  (c) node 4's claim gets no answer (its key made another type: the script
#      fails) while its renewals do: the lease runs from the last claim
#      answered and ends; once the claim is answered again, it spends again;
#  (d) node 5 grants two users in an outage and is frozen (SIGSTOP) past
#      its claim before it can replay them: node 6, on a copy of its
#      journal directory made before those grants, takes the incarnation
#      over, grants three users in an outage with the same token numbers,
#      replays them and is killed (kill -9); its claim expires.
#      Node 5 thaws and claims the incarnation anew, the answer that says
#      so lost (the key set to node 5's claim, as a claim that ran): it must not go on as if it had held it
#      all along and hand out the tokens node 6 spent (the same numbers of
#      the same epoch) but resume from what Redis' field holds once
#      replayed. Its two grants then find their tokens spent for node 6's
#      users: an anomaly (dead letters, alert), and each of the two users
#      gets a coupon from the sale's stock. Every user of both nodes judged.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

skip_unless_cmd cgi-fcgi || skip_all "cgi-fcgi is not installed (Debian libfcgi-bin)"
K=20
export COUPON_WORKERS=2
export COUPON_CONF_OVERRIDES="fallback.reserve=$K
fallback.lease_ms=30000
${COUPON_CONF_OVERRIDES:-}"
cs_stack_up
ADMIN=$(mint_jwt 1 admin)


A=4701
node_up n2
mk_activity $A 1000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check "(a) node 2 set aside its reserve" wait_for 20 field_is $A n2 $K
check "(a) ... and opened it" wait_for 20 reserves_open_on n2
INC=$(cat "$COUPON_DIR/n2/journal/incarnation")
check_match "(a) node 2 claimed its incarnation in Redis (host, boot id, pid)" \
    "^$(hostname) [0-9a-f-]+ [0-9]+$" "$(rcli GET "COUPON:RESERVE:CLAIM:$INC")"

# The copy: same incarnation, same tokens file, its own lock.
mkdir -p "$COUPON_DIR/n3"
cp -a "$COUPON_DIR/n2/journal" "$COUPON_DIR/n3/journal"
node_up n3
check_eq "(a) node 3 runs the same incarnation" "$INC" "$(cat "$COUPON_DIR/n3/journal/incarnation")"
check "(a) node 3 finds it held by another live instance" \
    wait_for 10 metric_is couponseize_reserve_claim_refused 1 n3
check "(a) ... and says so at error level" \
    grep -q "error.*incarnation $INC is held by another live instance" "$COUPON_DIR/n3/fcgi.log"
check_eq "(a) node 2 still holds it" 0 "$(metric couponseize_reserve_claim_refused n2)"
check_eq "(a) node 3 holds nothing spendable" 0 "$(metric couponseize_reserve_held n3)"

L=$COUPON_DIR/a.log
: >"$L"
stack stop-redis --kill
check "(a) node 2 seizes from its reserve while Redis is down" \
    wait_for 5 node_health_says n2 reserve
node_http n3 GET /market/health
check_eq "(a) node 3 does not" none "$(json_get "$HTTP_BODY" seize)"
for u in 1 2 3; do
    seize_on n2 $A $((A * 1000 + u)) "$L"
    seize_on n3 $A $((A * 1000 + 100 + u)) "$L"
done
check_eq "(a) node 2 told its three users SEIZED" 3 "$(awk '$1 < '$((A * 1000 + 100))' && $2 == "SEIZED"' "$L" | wc -l)"
check_eq "(a) node 3 told its three users UNAVAILABLE" 3 "$(awk '$1 > '$((A * 1000 + 100))' && $2 == "UNAVAILABLE"' "$L" | wc -l)"
stack start-redis
check "(a) node 2 replayed its journal" wait_for 20 metric_is couponseize_journal_depth 0 n2
check "(a) coupon-sync drained the queue" wait_for 60 drained $((A % 10))
bad=0
for u in $(awk '$2 == "SEIZED" { print $1 }' "$L"); do
    n=$(coupons_of $A "$u")
    [[ $n == 1 ]] || { bad=$((bad + 1)); diag "(a) user $u was told SEIZED and holds $n"; }
done
check_eq "(a) every user told SEIZED holds exactly one coupon" 0 "$bad"
for u in $(awk '$2 == "UNAVAILABLE" { print $1 }' "$L"); do
    [[ $(coupons_of $A "$u") == 0 ]] || bad=$((bad + 1))
done
check_eq "(a) every user told UNAVAILABLE holds none" 0 "$bad"
check_eq "(a) no token spent twice, nothing in the dead letters" "0 0 0" \
    "$(metric couponseize_reserve_anomalies_total n2) $(metric couponseize_reserve_anomalies_total n3) $(rcli HLEN "COUPON:RESERVE:DEAD:{$((A % 10))}")"
check "(a) stock + reserves + coupons = total" balanced $A 1000
node_down n3

# --- (b) a restart on this host takes its dead keeper's claim over at once ---------------
node_down n2 KILL
node_up n2
check "(b) node 2 restarted holds its incarnation again" \
    wait_for 10 metric_is couponseize_reserve_keeper_up 1 n2
check "(b) ... and reopens its reserve" wait_for 15 reserves_open_on n2
check_eq "(b) ... not refused" 0 "$(metric couponseize_reserve_claim_refused n2)"

# --- (c) a claim with no answer does not extend the lease --------------------------------
# The claim key made a hash: its script fails (WRONGTYPE), as a claim on an
# unreachable master gets no answer, while the shard's renewals go on.
C=4702
node_up n4 lease_ms=3000
sale_reserved "(c)" n4 $C $K
INC4=$(cat "$COUPON_DIR/n4/journal/incarnation")
# In one script: a claim between a DEL and an HSET would keep it a string.
rcli EVAL "redis.call('DEL', KEYS[1]); return redis.call('HSET', KEYS[1], 'x', 'y')" 1 \
    "COUPON:RESERVE:CLAIM:$INC4" >/dev/null
check_eq "(c) node 4's claim key is a hash now" hash "$(rcli TYPE "COUPON:RESERVE:CLAIM:$INC4")"
sleep 4 # past the 3 s lease, renewals answered all along
stack stop-redis --kill
node_http n4 GET /market/health
check_eq "(c) the lease ran out with the last claim answered: nothing to seize from" none \
    "$(json_get "$HTTP_BODY" seize)"
seize_settled $C "$(mint_jwt $((C * 1000 + 1)))" n4
check_eq "(c) ... and a seize is UNAVAILABLE" UNAVAILABLE "$SEIZE_CODE"
stack start-redis
rcli DEL "COUPON:RESERVE:CLAIM:$INC4" >/dev/null
claimed4() { [[ $(rcli GET "COUPON:RESERVE:CLAIM:$INC4" 2>/dev/null) == "$(hostname) "* ]]; }
check "(c) node 4 claims its incarnation again" wait_for 20 claimed4
check "(c) ... its reserve open" wait_for 20 reserves_open_on n4
sleep 1 # passes that renew the lease from the claim answered
stack stop-redis --kill
check "(c) ... and seizes from it while Redis is down" wait_for 5 node_health_says n4 reserve
stack start-redis

# --- (d) a claim taken over meanwhile: resumed from Redis' field -------------------------
# Node 5 spends by a lease that follows the machine's slowness now: a lease
# of 3 s lapsed between the opening and Redis' kill beside a hog (a campaign
# run: health "none", truthfully, and a chain of failures after it).
section -i "(d)"
D=4703
LEASE_D=$((3000 * $(cs_slowness 1)))
diag "(d) nodes 5 and 6 spend by a lease of $LEASE_D ms"
# in_lease NODE: NODE's reserves are open and have half a lease left.
in_lease() { reserves_open_on "$1" && lease_left_ms "$1" $((LEASE_D / 2)); }
node_up n5 lease_ms=$LEASE_D
sale_reserved "(d)" n5 $D $K
INC5=$(cat "$COUPON_DIR/n5/journal/incarnation")
CKEY5="COUPON:RESERVE:CLAIM:$INC5"
CLAIM5=$(rcli GET "$CKEY5")
mkdir -p "$COUPON_DIR/n6"
cp -a "$COUPON_DIR/n5/journal" "$COUPON_DIR/n6/journal"
node_up n6 lease_ms=$LEASE_D
check "(d) node 6, on a copy, is refused while node 5 lives" \
    wait_for 10 metric_is couponseize_reserve_claim_refused 1 n6
# Two grants node 5 holds on its disk only: frozen, supervisor first (see
# node_down), before Redis is back to take their replay; its claim expires
# (lease + 5 s).
LD=$COUPON_DIR/d.log
: >"$LD"
require "(d) node 5 holds its reserve open within its lease" wait_for 20 in_lease n5
stack stop-redis --kill
require "(d) node 5 seizes from the reserve while Redis is down" \
    wait_for 5 node_health_says n5 reserve
for u in 21 22; do seize_on n5 $D $((D * 1000 + u)) "$LD"; done
check_eq "(d) node 5 told two users SEIZED" 2 "$(grep -c ' SEIZED$' "$LD")"
cs_defer node_signal n5 CONT
node_signal n5 STOP
stack start-redis
# Node 6 takes it over once node 5's claim expired.
L6=$COUPON_DIR/d6.log
: >"$L6"
copy_grants_three "(d)" n6 $D "$CKEY5" "$CLAIM5" $K "$L6"
node_down n6 KILL
# Node 6's claim runs out too: nothing in Redis says that anyone else held
# the incarnation while node 5 was frozen.
claim_gone() { [[ -z $(rcli GET "$CKEY5") ]]; }
check "(d) node 6's claim expired" wait_for $((LEASE_D / 1000 + 17)) claim_gone
# Node 5's first claim after the thaw ran but its answer ("2": anew) was
# lost: the key names node 5 again, and its next claim reads 1. The keeper
# must still see that its last confirmed claim may have expired since.
rcli SET "$CKEY5" "$CLAIM5" PX $((LEASE_D + 5000)) >/dev/null
node_signal n5 CONT
held_by5() { [[ $(rcli GET "$CKEY5") == "$CLAIM5" ]]; }
check "(d) node 5, thawed, holds its incarnation again" wait_for 20 held_by5
check "(d) ... and resumes at what Redis holds ($((K - 3)) of $K)" wait_for 20 reserves_open_on n5
check "(d) ... after saying it was not its own all along" \
    grep -q "incarnation $INC5 was not this instance's all along" "$COUPON_DIR/n5/fcgi.log"
require "(d) node 5 renews its lease again" wait_for 20 in_lease n5
stack stop-redis --kill
require "(d) node 5 seizes from the reserve again while Redis is down" \
    wait_for 5 node_health_says n5 reserve
for u in 11 12 13 14 15; do seize_on n5 $D $((D * 1000 + u)) "$LD"; done
check_eq "(d) node 5 told five users SEIZED" 5 "$(awk '$1 > '$((D * 1000 + 10))' && $1 <= '$((D * 1000 + 15))' && $2 == "SEIZED"' "$LD" | wc -l)"
stack start-redis
check "(d) node 5 replayed its journal" wait_for 20 metric_is couponseize_journal_depth 0 n5
check "(d) coupon-sync drained the queue" wait_for 60 drained $((D % 10))
check_eq "(d) every user holds what they were told" 0 "$(users_misjudged $D "(d)" "$LD" "$L6")"
check_eq "(d) node 5's two tokens were spent twice: two anomalies, two dead letters" "2 2" \
    "$(metric couponseize_reserve_anomalies_total n5) $(rcli HLEN "COUPON:RESERVE:DEAD:{$((D % 10))}")"
check_eq "(d) ... each saying its user's coupon came from the stock" 2 \
    "$(rcli HVALS "COUPON:RESERVE:DEAD:{$((D % 10))}" | grep -c 'spent twice.*granted from stock$')"
check_eq "(d) coupons: node 5's two, node 6's three and node 5's five" 10 "$(rows_of $D)"
check "(d) stock + reserves + coupons = total" balanced $D 1000

finish
