#!/usr/bin/env bash
# reserve_admin.sh - an operator returns the reserve of a lost node
# (internals.md rule 8), with real
# servers: two coupon-fcgi nodes on one Redis and MySQL.
#  (a) GET /market/admin/coupon/reserves lists both nodes' incarnations;
#  (b) node n2 is killed (kill -9): a return before its lease is over is
#      409 LEASE_NOT_EXPIRED and changes nothing; after it, 200: the epoch
#      is closed and what n2 held stays out of stock (it may have granted it,
#      rule 16), MySQL has the epoch closed by 'admin', admin_audit has the
#      row; n2 restarted on the same journal spends nothing of the closed
#      epoch, and once it has replayed, what it held is back in stock;
#  (c) n2 grants from its reserve while Redis is down and is killed before
#      it could replay; its reserve is returned; restarted, it replays those
#      grants (from what the return kept out of stock) and every user told
#      SEIZED holds the coupon;
#  (d) n2 cut off from Redis (a proxy killed) grants from its reserve while
#      its lease lasts (on a starved machine the lease may lapse first: then
#      its users are told UNAVAILABLE, truthfully, and hold nothing); its
#      reserve is returned while it runs; back on Redis it finds its epoch
#      closed, spends no more of it and replays its grants;
#  (e) bad input: 4xx with stable codes.
# Throughout: stock + what reserves hold + seize-list entries = total.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

skip_unless_cmd cgi-fcgi || skip_all "cgi-fcgi is not installed"
K=20
LEASE=3000
TOTAL=1000
A=5001
export COUPON_WORKERS=2
export COUPON_CONF_OVERRIDES="fallback.reserve=$K
fallback.lease_ms=$LEASE
${COUPON_CONF_OVERRIDES:-}"
cs_stack_up
ADMIN=$(mint_jwt 1 admin)
SHARD=$((A % 10))
LIST="/market/admin/coupon/reserves?id=$A"
RETURN=/market/admin/coupon/reserve/return

field_of() { rcli HGET "COUPON:RESERVE:{$SHARD}" "$A:$1"; }
seized_of() { rcli HLEN "COUPON:SEIZE:LIST:${A}_{$SHARD}"; }
# balanced WHAT: Redis stock + what reserves hold + seize-list entries = total,
# read in one script (a set-aside between separate reads would count twice).
balanced() {
    local s h l
    read -r s h l < <(rcli EVAL "return {redis.call('HGET', KEYS[1], ARGV[1]) or '0',
        redis.call('HGET', KEYS[2], ARGV[1] .. ':held') or '0', redis.call('HLEN', KEYS[3])}" \
        3 "COUPON:RESOURCE:STOCK:{$SHARD}" "COUPON:RESERVE:{$SHARD}" \
        "COUPON:SEIZE:LIST:${A}_{$SHARD}" "$A" | tr '\n' ' ')
    if ((s + h + l == TOTAL)); then
        ok "$1: stock $s + held $h + seized $l = $TOTAL"
    else
        not_ok "$1: stock + held + seized = total" "stock $s + held $h + seized $l != $TOTAL"
    fi
}
# rsv INCARNATION FIELD: FIELD of that incarnation's entry in the last list
# answer (HTTP_BODY); empty when not listed.
rsv() { testkit json-find "$HTTP_BODY" reserves incarnation "$1" "$2" 2>/dev/null; }
lease_over() { http GET "$LIST" '' "$ADMIN"; [[ $(rsv "$1" leaseExpired) == true ]]; }
# in_lease NODE MS: node NODE's keeper opened its reserves and its lease has
# MS ms left: a Redis that goes away now finds them spendable.
in_lease() { reserves_open_on "$1" && lease_left_ms "$1" "$2"; }
# keeper_log NODE: the last lines of node NODE's reserve keeper (when a
# precondition on its reserve failed).
keeper_log() {
    grep -h 'reserve keeper' "$COUPON_DIR/$1/fcgi.log" 2>/dev/null | tail -n 8 | sed 's/^/#   /'
}
ret_body() { printf '{"id":%s,"incarnation":"%s"}' "$A" "$1"; }
# return_after_lease CASE WHAT [LEASE_MS]: once n2's lease (LEASE_MS, default
# LEASE) is over, an admin returns its reserve: 200 OK, the epoch closed,
# what it held (HELD2) kept out of stock until n2 replays (it may have
# granted it), the stock unchanged.
return_after_lease() {
    local s0
    require "$1 n2's lease is over" wait_for $((${3:-$LEASE} / 1000 + 12)) lease_over "$INC2"
    HELD2=$(rsv "$INC2" left)
    s0=$(stock_of "$A")
    http POST "$RETURN" "$(ret_body "$INC2")" "$ADMIN"
    check_eq "$1 $2: 200 OK, 0 back, $HELD2 kept out of stock" "200 OK 0 $HELD2" \
        "$HTTP_CODE $(json_get "$HTTP_BODY" code) $(json_get "$HTTP_BODY" returned) $(json_get "$HTTP_BODY" parked)"
    check_eq "$1 the stock is unchanged" "$s0" "$(stock_of "$A")"
}
epoch_row() {
    mysql_q "SELECT state, COALESCE(closed_by, '-'), COALESCE(returned, '-') FROM reserve_epoch
             WHERE activity_id = $A AND incarnation = '$1' AND epoch = $2" | tr '\t' ' '
}
# cut_off_asks TAG BASE ARRAY: users BASE+11..13 seize on n2 once it is cut
# off from Redis (called right after); ARRAY[u] gets each one's answer,
# SPENT what n2 spent of its reserve since spent0. n2 grants from its
# reserve while its lease lasts; nothing renews the lease now, and on a
# starved machine it may lapse before a user is asked: UNAVAILABLE is then
# the truth (a fresh-clone run: all three told so). Checked either way: a
# token spent per user told SEIZED, and nobody refused while the lease may
# still have lasted, by what n2 said was left of it when Redis went.
cut_off_asks() {
    local tag=$1 base=$2 u left t0 first="" seized=0
    local -n ans=$3
    left=$(metric couponseize_reserve_lease_left_seconds n2)
    t0=${EPOCHREALTIME/./}
    for u in 11 12 13; do
        ans[$u]=$(seize_n2 $((base + u)))
        # When the first refusal was in: the lease must have lapsed by then.
        [[ ${ans[$u]} == UNAVAILABLE && -z $first ]] && first=$(((${EPOCHREALTIME/./} - t0) / 1000))
    done
    SPENT=$(($(metric couponseize_reserve_spent_total n2) - spent0))
    for u in 11 12 13; do
        diag "$tag user $((base + u)) was told ${ans[$u]} by n2"
        [[ ${ans[$u]} == SEIZED ]] && seized=$((seized + 1))
    done
    # Unknown (no answer) cannot show the lease had lapsed: counted as long.
    left=$(awk -v v="${left:-999999}" 'BEGIN { printf "%d", v * 1000 }')
    diag "$tag n2's lease had $left ms left when Redis went; its first refusal came" \
        "${first:-(none)} ms later; it granted $SPENT from its reserve"
    check_eq "$tag n2 spent a token per user it told SEIZED" "$seized" "$SPENT"
    check "$tag n2 told nobody UNAVAILABLE while its lease ($left ms) may have lasted" \
        test -z "$first" -o "$left" -le "${first:-0}"
}
# told_hold TAG ARRAY BASE WHERE: every user told SEIZED holds the coupon,
# every user told UNAVAILABLE none; WHERE is "redis" (the seize list) or
# "mysql" (coupon rows). Prints the users who do not, and how many.
told_hold() {
    local tag=$1 base=$3 where=$4 u n bad=0
    local -n t=$2
    for u in 11 12 13; do
        if [[ $where == redis ]]; then
            n=$(rcli HEXISTS "COUPON:SEIZE:LIST:${A}_{$SHARD}" $((base + u)))
        else
            n=$(coupons_of "$A" $((base + u)))
        fi
        case ${t[$u]} in
        SEIZED) [[ $n == 1 ]] ;;
        UNAVAILABLE) [[ $n == 0 ]] ;;
        *) [[ $n == 0 || $n == 1 ]] ;;
        esac || { bad=$((bad + 1)); diag "$tag user $((base + u)) was told ${t[$u]} and holds $n" >&2; }
    done
    echo "$bad"
}
# seize_n2 USER: one user's seize on n2, asked again while the answer cannot
# say (a worker whose connection died with Redis answers UNKNOWN_OUTCOME
# once); prints the last code.
seize_n2() {
    local tok i code
    tok=$(mint_jwt "$1")
    for i in 1 2 3 4 5 6; do
        node_http n2 POST /market/consumer/coupon/seize "{\"id\":$A}" "$tok"
        code=$(json_get "$HTTP_BODY" code 2>/dev/null)
        [[ $code != UNKNOWN_OUTCOME && $code != UNAVAILABLE ]] && break
    done
    echo "$code"
}

# --- (a) two nodes, both listed -----------------------------------------------------------
# The parts run in turn on one n2 and one sale: each depends on the one
# before, and a failed precondition ends the script.
section "(a)"
mk_activity "$A" "$TOTAL" -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
node_up n2 || finish
INC1=$(cat "$COUPON_DIR/journal/incarnation")
INC2=$(cat "$COUPON_DIR/n2/journal/incarnation")
diag "node 1 is $INC1, n2 is $INC2"
require "(a) both nodes set a reserve of $K aside" wait_for 20 reserved "$A" $((2 * K))
# A node renews its lease in the pass after the set-aside (until then an
# admin may return the epoch: it was never spendable).
both_live() {
    http GET "$LIST" '' "$ADMIN"
    [[ $(rsv "$INC1" leaseExpired) == false && $(rsv "$INC2" leaseExpired) == false ]]
}
require "(a) the list shows both incarnations with a live lease" wait_for 10 both_live
diag "list: $HTTP_BODY"
check_eq "(a) the list answers 200 OK" "200 OK" "$HTTP_CODE $(json_get "$HTTP_BODY" code)"
check_eq "(a) it says what reserves hold" $((2 * K)) "$(json_get "$HTTP_BODY" held)"
check_eq "(a) node 1's reserve: epoch 1, $K of $K left, lease live" "1 $K $K false" \
    "$(rsv "$INC1" epoch) $(rsv "$INC1" amount) $(rsv "$INC1" left) $(rsv "$INC1" leaseExpired)"
check_eq "(a) n2's reserve: epoch 1, $K of $K left, lease live" "1 $K $K false" \
    "$(rsv "$INC2" epoch) $(rsv "$INC2" amount) $(rsv "$INC2" left) $(rsv "$INC2" leaseExpired)"
age=$(rsv "$INC2" leaseAgeMs)
check "(a) n2's lease was renewed just now (${age} ms ago)" test "${age:-99999}" -lt "$LEASE"
http GET /market/admin/coupon/reserves '' "$ADMIN"
check_eq "(a) without id: every open epoch, both nodes" "1 1" \
    "$(rsv "$INC1" epoch) $(rsv "$INC2" epoch)"
balanced "(a)"
# Warm-up through Redis, so that n2's workers know the sale (for (c)).
for u in 1 2 3 4 5 6; do
    node_http n2 POST /market/consumer/coupon/seize "{\"id\":$A}" "$(mint_jwt $((5001000 + u)))"
done

# --- (b) n2 killed: its reserve returned once its lease is over ------------------------------
section "(b)"
node_down n2 KILL
# n2 must not have given its reserve back by itself before it died.
if grep -q "given back" "$COUPON_DIR/n2/fcgi.log"; then
    diag "n2 gave its reserve back before it died; its log:"
    sed 's/^/#   /' "$COUPON_DIR/n2/fcgi.log"
fi
s0=$(stock_of "$A")
http POST "$RETURN" "$(ret_body "$INC2")" "$ADMIN"
check_eq "(b) a return within n2's lease: 409 LEASE_NOT_EXPIRED" "409 LEASE_NOT_EXPIRED" \
    "$HTTP_CODE $(json_get "$HTTP_BODY" code)"
check_eq "(b) ... and the stock is unchanged" "$s0" "$(stock_of "$A")"
check_eq "(b) ... and the epoch still open in MySQL" "1 - -" "$(epoch_row "$INC2" 1)"
http POST "$RETURN" "$(ret_body "$INC1")" "$ADMIN"
check_eq "(b) a live node's reserve cannot be returned" "409 LEASE_NOT_EXPIRED" \
    "$HTTP_CODE $(json_get "$HTTP_BODY" code)"
require "(b) the list shows n2's lease expired" wait_for 15 lease_over "$INC2"
held2=$(rsv "$INC2" left)
s0=$(stock_of "$A")
http POST "$RETURN" "$(ret_body "$INC2")" "$ADMIN"
check_eq "(b) after the lease: 200 OK" "200 OK" "$HTTP_CODE $(json_get "$HTTP_BODY" code)"
check_eq "(b) it kept what n2 held ($held2) out of stock" "0 $held2" \
    "$(json_get "$HTTP_BODY" returned) $(json_get "$HTTP_BODY" parked)"
check_eq "(b) the stock is unchanged" "$s0" "$(stock_of "$A")"
check_eq "(b) n2's reserve field is gone from Redis" "" "$(field_of "$INC2")"
check_eq "(b) MySQL: the epoch closed by admin, 0 returned" "2 admin 0" \
    "$(epoch_row "$INC2" 1)"
check_eq "(b) admin_audit has the return and the refusal" "reserve_return 409 LEASE_NOT_EXPIRED
reserve_return 409 LEASE_NOT_EXPIRED
reserve_return 200 OK" \
    "$(mysql_q "SELECT action, http_status, result FROM admin_audit WHERE activity_id = $A
                AND action = 'reserve_return' ORDER BY id" | tr '\t' ' ')"
balanced "(b) after the return"
http POST "$RETURN" "$(ret_body "$INC2")" "$ADMIN"
check_eq "(b) a second return: 404 NO_OPEN_RESERVE" "404 NO_OPEN_RESERVE" \
    "$HTTP_CODE $(json_get "$HTTP_BODY" code)"
check_eq "(b) ... and the stock is unchanged" "$s0" "$(stock_of "$A")"

# n2 comes back on the same journal: its closed epoch is not spent again.
# Its lease, which (c) spends by, follows how slow the machine is now.
LEASE_C=$((LEASE * $(cs_slowness 2)))
diag "n2 restarts with a lease of $LEASE_C ms"
node_up n2 lease_ms=$LEASE_C || finish
require "(b) n2 restarted: its keeper runs" wait_for 20 metric_is couponseize_reserve_keeper_up 1 n2
# It may set a new epoch aside; epoch 1 stays closed and spends nothing.
new_epoch() { [[ $(mysql_q "SELECT COUNT(*) FROM reserve_epoch WHERE activity_id = $A
                             AND incarnation = '$INC2' AND epoch = 2 AND state = 1") == 1 ]]; }
require "(b) n2 set aside a new epoch (2)" wait_for 20 new_epoch
check_eq "(b) epoch 1 stays closed by admin" "2 admin 0" "$(epoch_row "$INC2" 1)"
parked_of() { rcli HGET "COUPON:RESERVE:EPOCH:${A}_{$SHARD}" "$1:$2:parked"; }
released() { [[ -z $(parked_of "$INC2" 1) ]]; }
check "(b) n2 replayed (nothing): what the return kept out of stock is back in it" \
    wait_for 10 released
wait_for 10 metric_is couponseize_reserve_held "$K" n2
check_eq "(b) n2 holds only the new epoch's $K" "$K" "$(metric couponseize_reserve_held n2)"
check_eq "(b) Redis: n2's field is the new epoch's" "$K" "$(field_of "$INC2")"
balanced "(b) after n2's restart"

# --- (c) grants from the reserve that n2 could not replay before it died ------------------
section "(c)"
for u in 1 2 3 4 5 6; do
    node_http n2 POST /market/consumer/coupon/seize "{\"id\":$A}" "$(mint_jwt $((5001100 + u)))"
done
require "(c) n2 opened its new reserve, within its lease" \
    wait_for 20 in_lease n2 $((LEASE_C / 2)) || keeper_log n2
spent0=$(metric couponseize_reserve_spent_total n2)
stack stop-redis --kill
# shellcheck disable=SC2034 # filled and read through namerefs (cut_off_asks, told_hold)
declare -A told
cut_off_asks "(c)" 5001100 told
spent=$SPENT
depth=$(metric couponseize_journal_depth n2)
node_down n2 KILL
check_eq "(c) ... all of them still in its journal when it died" "$spent" "$depth"
stack start-redis
health_ok() { [[ $(http_code GET /market/health) == 200 ]]; }
require "(c) Redis is back" wait_for 20 health_ok
balanced "(c) n2 dead with unreplayed grants"
return_after_lease "(c)" "its reserve returned" "$LEASE_C"
check_eq "(c) MySQL: epoch 2 closed by admin" "2 admin 0" "$(epoch_row "$INC2" 2)"
balanced "(c) after the return"
node_up n2 || finish
require "(c) n2 restarted replays its journal" wait_for 20 metric_is couponseize_journal_depth 0 n2
check_eq "(c) replayed from what the return kept out: no dead letters" 0 \
    "$(metric couponseize_reserve_dead_letters_total n2)"
check_eq "(c) every user n2 told SEIZED is in the seize list, none told UNAVAILABLE" 0 \
    "$(told_hold "(c)" told 5001100 redis)"
check_eq "(c) epoch 2 stays closed by admin" "2 admin 0" "$(epoch_row "$INC2" 2)"
unparked() { [[ -z $(parked_of "$INC2" "$1") ]]; }
check "(c) the rest of what it kept out is back in stock" wait_for 10 unparked 2
balanced "(c) after the replay"
check "(c) coupon-sync drained the queue" wait_for 60 drained "$SHARD"
check_eq "(c) MySQL holds a coupon per seize-list entry" "$(seized_of)" \
    "$(mysql_q "SELECT COUNT(*) FROM coupon WHERE activity_id = $A")"
check_eq "(c) every user told SEIZED holds one coupon in MySQL, none told UNAVAILABLE" 0 \
    "$(told_hold "(c)" told 5001100 mysql)"
check_eq "(c) nobody holds two" "" \
    "$(mysql_q "SELECT user_id FROM coupon WHERE activity_id = $A GROUP BY user_id HAVING COUNT(*) > 1")"

# --- (d) a live node cut off from Redis finds its epoch returned ----------------------------
# n2 reaches Redis through a TCP proxy that the test kills and starts again:
# n2 alone loses Redis, node 1 (serving the admin routes) keeps it.
section "(d)"
proxy_conf "$COUPON_DIR/n2-proxy.conf"
node_down n2
require "(d) the proxy to Redis for n2 is up" proxy_up
LEASE_D=$((LEASE * $(cs_slowness 2)))
diag "(d) n2 restarts with a lease of $LEASE_D ms"
COUPON_CONF=$COUPON_DIR/n2-proxy.conf node_up n2 lease_ms=$LEASE_D || finish
open_epoch() {
    E=$(mysql_q "SELECT MAX(epoch) FROM reserve_epoch WHERE activity_id = $A
                 AND incarnation = '$INC2' AND state = 1")
    [[ $E =~ ^[0-9]+$ ]]
}
require "(d) n2 (through the proxy) set a new epoch aside" wait_for 20 open_epoch
n2_live() { http GET "$LIST" '' "$ADMIN"; [[ $(rsv "$INC2" leaseExpired) == false ]]; }
require "(d) n2's lease is live" wait_for 10 n2_live
diag "(d) n2's epoch is $E"
for u in 1 2 3 4 5 6; do
    node_http n2 POST /market/consumer/coupon/seize "{\"id\":$A}" "$(mint_jwt $((5001200 + u)))"
done
# Its keeper opened the epoch, and renews it: the outage starts within a
# lease that has most of its length left.
require "(d) n2 opened its reserve, within its lease" \
    wait_for 20 in_lease n2 $((LEASE_D / 2)) || keeper_log n2
spent0=$(metric couponseize_reserve_spent_total n2)
proxy_kill
# shellcheck disable=SC2034 # as told
declare -A told2
cut_off_asks "(d)" 5001200 told2
spent=$SPENT
return_after_lease "(d)" "its reserve returned while n2 runs" "$LEASE_D"
check_eq "(d) n2's grants wait in its journal" "$spent" "$(metric couponseize_journal_depth n2)"
balanced "(d) n2 cut off with unreplayed grants, its reserve returned"
require "(d) the proxy is back: n2 reaches Redis again" proxy_up
check "(d) n2 replays its journal" wait_for 20 metric_is couponseize_journal_depth 0 n2
closed_seen() { grep -q "epoch $E was closed elsewhere (admin); this node spends no more of it" \
    "$COUPON_DIR/n2/fcgi.log"; }
check "(d) n2 found its epoch closed by admin and dropped it" wait_for 10 closed_seen
check_eq "(d) no dead letters" 0 "$(metric couponseize_reserve_dead_letters_total n2)"
check_eq "(d) n2 spent nothing more of it" "$spent" \
    "$(($(metric couponseize_reserve_spent_total n2) - spent0))"
check_eq "(d) every user n2 told SEIZED is in the seize list, none told UNAVAILABLE" 0 \
    "$(told_hold "(d)" told2 5001200 redis)"
check_eq "(d) epoch $E stays closed by admin" "2 admin 0" "$(epoch_row "$INC2" "$E")"
balanced "(d) after the replay"
next_epoch() { open_epoch && ((E > ${1})); }
check "(d) n2 goes on with a new epoch" wait_for 20 next_epoch "$E"

check "(d) coupon-sync drained the queue" wait_for 60 drained "$SHARD"
check_eq "(d) in MySQL too, and nobody holds two" "0 " \
    "$(told_hold "(d)" told2 5001200 mysql) $(mysql_q "SELECT user_id FROM coupon
        WHERE activity_id = $A GROUP BY user_id HAVING COUNT(*) > 1")"

# A lost node's reserve with nothing left (all spent and replayed) while
# other nodes hold theirs: closed, nothing back, what the others hold kept.
SPENT=fedcba9876543210fedcba9876543210
mysql_q "INSERT INTO reserve_epoch (activity_id, incarnation, epoch, amount) VALUES ($A, '$SPENT', 1, 2)"
rcli HSET "COUPON:RESERVE:{$SHARD}" "$A:$SPENT" 0 >/dev/null
rcli HINCRBY "COUPON:RESERVE:{$SHARD}" "$A" 1 >/dev/null
rcli HSET "COUPON:RESERVE:EPOCH:${A}_{$SHARD}" "$SPENT:1" open:2 >/dev/null
h0=$(held_of "$A") s0=$(stock_of "$A")
# Never seen renewing: no stamp is watched like a stamp, for the lease by
# this node's clock from its keeper's first read (Redis may have lost the
# stamps of a node that is still within its lease).
http POST "$RETURN" "$(ret_body "$SPENT")" "$ADMIN"
check_eq "(d) a lost node never seen renewing, at first: 409 LEASE_NOT_EXPIRED" \
    "409 LEASE_NOT_EXPIRED" "$HTTP_CODE $(json_get "$HTTP_BODY" code)"
spent_returned() { http POST "$RETURN" "$(ret_body "$SPENT")" "$ADMIN"; [[ $HTTP_CODE != 409 ]]; }
check "(d) ... answered once its lease passed by this node's clock" wait_for 20 spent_returned
check_eq "(d) a spent reserve of a lost node: 200 OK, 0 returned" "200 OK 0" \
    "$HTTP_CODE $(json_get "$HTTP_BODY" code) $(json_get "$HTTP_BODY" returned)"
check_eq "(d) ... stock and what the others hold unchanged" "$s0 $h0" "$(stock_of "$A") $(held_of "$A")"
check_eq "(d) ... its epoch closed by admin" "2 admin 0" "$(epoch_row "$SPENT" 1)"

# --- (e) bad input ----------------------------------------------------------------------------
section -i "(e)"
USER=$(mint_jwt 77)
bad_is() {
    local want=$1 path=$2 body=$3 tok=${4-$ADMIN}
    if [[ $path == GET* ]]; then http GET "${path#GET }" '' "$tok"; else http POST "$path" "$body" "$tok"; fi
    check_eq "(e) ${5:-$body}: $want" "$want" "$HTTP_CODE $(json_get "$HTTP_BODY" code 2>/dev/null)"
}
bad_is "400 BAD_REQUEST" "$RETURN" "{\"incarnation\":\"$INC2\"}" "$ADMIN" "missing id"
bad_is "400 BAD_REQUEST" "$RETURN" "{\"id\":$A}" "$ADMIN" "missing incarnation"
bad_is "400 BAD_REQUEST" "$RETURN" "{\"id\":$A,\"incarnation\":\"nothex\"}" "$ADMIN" "bad incarnation"
bad_is "400 BAD_REQUEST" "$RETURN" "{\"id\":$A,\"incarnation\":\"${INC2^^}\"}" "$ADMIN" \
    "upper-case incarnation"
bad_is "400 BAD_REQUEST" "$RETURN" "{\"id\":$A,\"incarnation\":\"$INC2\",\"incarnation\":\"$INC1\"}" \
    "$ADMIN" "incarnation twice"
bad_is "400 BAD_REQUEST" "$RETURN" "{\"id\":$A,\"id\":$A,\"incarnation\":\"$INC2\"}" "$ADMIN" "id twice"
bad_is "400 BAD_REQUEST" "$RETURN" "{\"id\":$A,\"incarnation\":\"$INC2\",\"x\":1}" "$ADMIN" \
    "an unknown member"
bad_is "404 NO_OPEN_RESERVE" "$RETURN" "$(ret_body 0123456789abcdef0123456789abcdef)" "$ADMIN" \
    "an incarnation with nothing open"
bad_is "403 FORBIDDEN" "$RETURN" "$(ret_body "$INC2")" "$USER" "a user's token"
bad_is "401 UNAUTHORIZED" "$RETURN" "$(ret_body "$INC2")" "" "no token"
bad_is "400 BAD_REQUEST" "GET /market/admin/coupon/reserves?id=x" "" "$ADMIN" "list ?id=x"
bad_is "403 FORBIDDEN" "GET $LIST" "" "$USER" "list with a user's token"
# An Idempotency-Key: the repeat answers the first answer, and says so.
idem() {
    curl -s -D - -o /dev/null -X POST -H "Authorization: Bearer $ADMIN" \
        -H 'Content-Type: application/json' -H 'Idempotency-Key: reserve-admin-test-1' \
        --data-binary "$(ret_body 0123456789abcdef0123456789abcdef)" "$COUPON_URL$RETURN" |
        tr -d '\r' | sed -n 's/^HTTP\/[0-9.]* \([0-9]*\).*/\1/p; s/^Idempotent-Replayed: //Ip'
}
idem >/dev/null
check_eq "(e) a repeated Idempotency-Key is answered as the first time" "404 true" \
    "$(idem | tr '\n' ' ' | sed 's/ $//')"
http GET "$RETURN" '' "$ADMIN"
check_eq "(e) GET on the return route: 405" "405 METHOD_NOT_ALLOWED" \
    "$HTTP_CODE $(json_get "$HTTP_BODY" code)"
balanced "(e) at the end"

finish
