#!/usr/bin/env bash
# lifecycle.sh - a coupon after the seize, through nginx: mine, use (idempotent
# per order, another order refused), release, use again, expiry by moving
# valid_until into the past, return on expiry and the user seizing again;
# who may use (the owner named in every call, another user's coupon answered
# as a missing one, release the order system's alone); bad bodies (order ids
# exact, no NUL, no id past 2^53-1); eligible groups compared as names.
# shellcheck disable=SC2317 # helpers are called through check/wait_for
set -u

# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib.sh"

skip_unless_cmd python3
# user_may_use stays off here; the node "own" below turns it on.
export COUPON_CONF_OVERRIDES="sync.status_interval_s=1
auth.user_may_use=false"
cs_stack_up

ACT=/market/admin/coupon/activity
MINE=/market/consumer/coupon/mine
USE=/market/service/coupon/use
REL=/market/service/coupon/release
SEIZE=/market/consumer/coupon/seize
ADMIN=$(mint_jwt 77 admin)
SVC=$(mint_jwt 9 service)
U1=$(mint_jwt 501)
U2=$(mint_jwt 502)



# expect NAME STATUS CODE: the last answer's HTTP status and code.
expect() {
    local got="$HTTP_CODE $(jat "$HTTP_BODY" code)" want="$2 $3"
    if [[ $got == "$want" ]]; then ok "$1"; else not_ok "$1" "expected: $want" "     got: $got" "$HTTP_BODY"; fi
}

# create NAME TOTAL [EXTRA_JSON_MEMBERS]: an activity on sale now; its id in NEW_ID.
create() {
    http POST "$ACT" "{\"name\":\"$1\",\"totalNum\":$2,\"distributeStartTime\":\"$(iso -60)\",\"distributeEndTime\":\"$(iso 3600)\",\"validityDays\":7,\"couponAmount\":\"5\",\"couponThreshold\":\"20\"${3:+,$3}}" "$ADMIN"
    NEW_ID=$(jat "$HTTP_BODY" idStr)
}

# invariant ID: total_num = stock_num + coupons that count (returned = 0).
invariant() {
    sql_is "SELECT a.total_num = a.stock_num + (SELECT COUNT(*) FROM coupon c WHERE c.activity_id = a.id AND c.returned = 0) FROM activity a WHERE a.id = $1" 1
}

# --- the whole life ------------------------------------------------------------------
create "Life" 3 '"returnOnExpiry":true'
A=$NEW_ID
check_match "create with returnOnExpiry: 201" '^[1-9][0-9]*$' "$A"
check_eq "returnOnExpiry shows in the activity" true "$(jat "$HTTP_BODY" activity.returnOnExpiry)"

http POST "$SEIZE" "{\"id\":$A}" "$U1"
expect "seize" 200 SEIZED
check "the coupon is written by coupon-sync" wait_for 20 sql_is "SELECT COUNT(*) FROM coupon WHERE activity_id = $A AND user_id = 501" 1
C=$(mysql_q "SELECT id FROM coupon WHERE activity_id = $A AND user_id = 501")

http GET "$MINE" '' "$U1"
expect "mine" 200 OK
check_eq "mine: one coupon with its fields" "1 $C $A Life UNUSED 1 5.00 20.00" \
    "$(jat "$HTTP_BODY" total) $(jat "$HTTP_BODY" coupons.0.idStr) $(jat "$HTTP_BODY" coupons.0.activityId) $(jat "$HTTP_BODY" coupons.0.activityName) $(jat "$HTTP_BODY" coupons.0.status) $(jat "$HTTP_BODY" coupons.0.couponType) $(jat "$HTTP_BODY" coupons.0.couponAmount) $(jat "$HTTP_BODY" coupons.0.couponThreshold)"
check_eq "mine: orderId is null while unused" null \
    "$(python3 -c 'import json, sys; print(json.dumps(json.loads(sys.argv[1])["coupons"][0]["orderId"]))' "$HTTP_BODY")"
check_match "mine: seizedAt and validUntil are epoch ms, 7 days apart" '^604800000$' \
    "$(($(jat "$HTTP_BODY" coupons.0.validUntil) - $(jat "$HTTP_BODY" coupons.0.seizedAt)))"
http GET "$MINE" '' "$U2"
check_eq "another user's mine is empty" "0 []" "$(jat "$HTTP_BODY" total) $(jat "$HTTP_BODY" coupons)"
http GET "$MINE?status=used" '' "$U1"
check_eq "mine?status=used: none yet" 0 "$(jat "$HTTP_BODY" total)"
http GET "$MINE?status=bogus" '' "$U1"
expect "mine?status=bogus" 400 BAD_REQUEST
http GET "$MINE?size=101" '' "$U1"
expect "mine?size=101" 400 BAD_REQUEST
http GET "$MINE"
expect "mine without a token" 401 UNAUTHORIZED

http POST "$USE" "{\"couponId\":$C,\"userId\":501,\"orderId\":\"order-1\"}" "$SVC"
expect "use by order-1" 200 OK
check_eq "use answers the state and the owner" "USED order-1 501 501" \
    "$(jat "$HTTP_BODY" status) $(jat "$HTTP_BODY" orderId) $(jat "$HTTP_BODY" userId) $(jat "$HTTP_BODY" userIdStr)"
http POST "$USE" "{\"couponId\":$C,\"userId\":501,\"orderId\":\"order-1\"}" "$SVC"
expect "use again by order-1: idempotent" 200 OK
http POST "$USE" "{\"couponId\":$C,\"userId\":501,\"orderId\":\"order-2\"}" "$SVC"
expect "use by order-2" 409 ALREADY_USED
http GET "$MINE?status=used" '' "$U1"
check_eq "mine shows it used by order-1" "1 USED order-1" \
    "$(jat "$HTTP_BODY" total) $(jat "$HTTP_BODY" coupons.0.status) $(jat "$HTTP_BODY" coupons.0.orderId)"
http POST "$REL" "{\"couponId\":$C,\"userId\":501,\"orderId\":\"order-2\"}" "$SVC"
expect "release by order-2 (not its order)" 409 ALREADY_USED
http POST "$REL" "{\"couponId\":$C,\"userId\":501,\"orderId\":\"order-1\"}" "$SVC"
expect "release by order-1" 200 OK
check_eq "released: unused" UNUSED "$(jat "$HTTP_BODY" status)"
http POST "$REL" "{\"couponId\":$C,\"userId\":501,\"orderId\":\"order-1\"}" "$SVC"
expect "release twice: one release undoes one use" 409 UNUSED
http POST "$USE" "{\"couponId\":$C,\"userId\":501,\"orderId\":\"order-2\"}" "$SVC"
expect "use again by order-2 after the release" 200 OK
http POST "$REL" "{\"couponId\":$C,\"userId\":501,\"orderId\":\"order-2\"}" "$ADMIN"
expect "release with an admin token" 200 OK
check_eq "admin use/release leaves an audit row" 1 \
    "$(mysql_q "SELECT COUNT(*) FROM admin_audit WHERE action = 'release' AND admin_sub = '77' AND result = 'OK' AND activity_id = $A")"
check "the service route logs the owner and the order id" grep -q "coupon $C of user 501 release by order order-2" "$COUPON_DIR/fcgi.log"
http POST "$USE" "{\"couponId\":99999999,\"userId\":501,\"orderId\":\"order-1\"}" "$SVC"
expect "use of an unknown coupon" 404 NO_SUCH_COUPON

# --- who may use -----------------------------------------------------------------------
http POST "$USE" "{\"couponId\":$C,\"userId\":501,\"orderId\":\"order-3\"}" "$U1"
expect "the owner without auth.user_may_use" 403 FORBIDDEN
http POST "$USE" "{\"couponId\":$C,\"userId\":501,\"orderId\":\"order-3\"}"
expect "no token" 401 UNAUTHORIZED

# The order system names the buyer: a coupon that is not theirs answers as a
# missing one, so neither a buyer's checkout nor a prober learns other coupons.
# shape: the answer's code, msg and member names (values differ by id).
shape() { python3 -c 'import json, sys; d = json.loads(sys.argv[1]); print(d["code"], d.get("msg"), sorted(d))' "$1"; }
http POST "$USE" "{\"couponId\":99999999,\"userId\":502,\"orderId\":\"ORDER-of-502\"}" "$SVC"
expect "use of a missing coupon" 404 NO_SUCH_COUPON
missing=$(shape "$HTTP_BODY")
http POST "$USE" "{\"couponId\":$C,\"userId\":502,\"orderId\":\"ORDER-of-502\"}" "$SVC"
expect "use of user 501's coupon naming user 502" 404 NO_SUCH_COUPON
check_eq "... answered exactly as a missing coupon" "$missing" "$(shape "$HTTP_BODY")"
check_eq "... names the user it was asked for" 502 "$(jat "$HTTP_BODY" userId)"
http POST "$REL" "{\"couponId\":$C,\"userId\":502,\"orderId\":\"order-2\"}" "$SVC"
expect "release naming another user" 404 NO_SUCH_COUPON
http POST "$USE" "{\"couponId\":$C,\"orderId\":\"order-4\"}" "$SVC"
expect "a service use without userId" 400 BAD_REQUEST
check_eq "... names the field" userId "$(jat "$HTTP_BODY" field)"
http POST "$REL" "{\"couponId\":$C,\"orderId\":\"order-4\"}" "$ADMIN"
expect "an admin release without userId" 400 BAD_REQUEST
check_eq "none of these changed the coupon" "1 " \
    "$(mysql_q "SELECT status, COALESCE(order_id, '') FROM coupon WHERE id = $C" | tr '\t' ' ')"

# With auth.user_may_use = true (a node of its own): the owner uses their own
# coupon, never another's, and never releases.
node_up own user_may_use=true
node_http own POST "$USE" "{\"couponId\":$C,\"orderId\":\"ORD-1\"}" "$U2"
expect "user_may_use: user 502 using 501's coupon" 404 NO_SUCH_COUPON
node_http own POST "$USE" "{\"couponId\":$C,\"userId\":501,\"orderId\":\"ORD-1\"}" "$U2"
expect "user_may_use: user 502 naming user 501" 404 NO_SUCH_COUPON
node_http own POST "$USE" "{\"couponId\":$C,\"userId\":502,\"orderId\":\"ORD-1\"}" "$U2"
expect "user_may_use: user 502 naming themself on 501's coupon" 404 NO_SUCH_COUPON
node_http own POST "$USE" "{\"couponId\":$C,\"orderId\":\"ORD-1\"}" "$U1"
expect "user_may_use: the owner uses it (userId from the token)" 200 OK
check_eq "... the answer names the owner" 501 "$(jat "$HTTP_BODY" userId)"
node_http own POST "$REL" "{\"couponId\":$C,\"userId\":501,\"orderId\":\"ORD-1\"}" "$U1"
expect "user_may_use: the owner cannot release" 403 FORBIDDEN
node_http own POST "$REL" "{\"couponId\":$C,\"userId\":501,\"orderId\":\"ORD-1\"}" "$U2"
expect "user_may_use: another user cannot release" 403 FORBIDDEN
check_eq "still used by ORD-1" "2 ORD-1" \
    "$(mysql_q "SELECT status, order_id FROM coupon WHERE id = $C" | tr '\t' ' ')"
node_http own POST "$USE" "{\"couponId\":$C,\"userId\":501,\"orderId\":\"ORD-1\"}" "$U1"
expect "user_may_use: the owner naming themself, again: idempotent" 200 OK
node_down own

# Order ids are compared byte for byte, in C and in MySQL (whose collation
# pads with spaces).
http POST "$REL" "{\"couponId\":$C,\"userId\":501,\"orderId\":\"ORD-1   \"}" "$SVC"
expect "release with trailing spaces: refused" 400 BAD_REQUEST
mysql_q "UPDATE coupon SET order_id = 'ORD-1 ' WHERE id = $C"
http POST "$REL" "{\"couponId\":$C,\"userId\":501,\"orderId\":\"ORD-1\"}" "$SVC"
expect "a stored 'ORD-1 ' is not ORD-1" 409 ALREADY_USED
mysql_q "UPDATE coupon SET order_id = 'ORD-1' WHERE id = $C"
http POST "$REL" "{\"couponId\":$C,\"userId\":501,\"orderId\":\"ORD-1\"}" "$SVC"
expect "the service releases ORD-1" 200 OK

# --- bad bodies ------------------------------------------------------------------------
long=$(printf 'o%.0s' {1..65})
nul_id='"2\u0000 OR 1=1"'
big=9007199254740993
for body in "{\"couponId\":$C}" "{\"couponId\":$C,\"userId\":501,\"orderId\":\"\"}" "{\"couponId\":$C,\"userId\":501,\"orderId\":\"$long\"}" \
    "{\"couponId\":$C,\"userId\":501,\"orderId\":\"zamówienie\"}" "{\"couponId\":$C,\"userId\":501,\"orderId\":\"a\\u0001b\"}" \
    "{\"couponId\":$C,\"userId\":501,\"orderId\":7}" "{\"couponId\":\"abc\",\"orderId\":\"o\"}" \
    "{\"couponId\":1.5,\"orderId\":\"o\"}" "{\"couponId\":-1,\"orderId\":\"o\"}" \
    "{\"couponId\":0,\"orderId\":\"o\"}" "{\"orderId\":\"o\"}" "{\"couponId\":true,\"orderId\":\"o\"}" \
    "{\"couponId\":$C,\"couponId\":$C,\"orderId\":\"o\"}" "[1,2]" "{\"couponId\":$C," \
    "{\"couponId\":$C,\"userId\":501,\"orderId\":\"o-1 \"}" "{\"couponId\":$C,\"userId\":501,\"orderId\":\"o 1\"}" \
    "{\"couponId\":$C,\"userId\":501,\"orderId\":\"Q\\u0000evil\"}" \
    "{\"couponId\":$nul_id,\"userId\":501,\"orderId\":\"o\"}" \
    "{\"couponId\":$C,\"userId\":\"501\\u0000\",\"orderId\":\"o\"}" \
    "{\"couponId\":$C,\"userId\":501,\"orderId\":\"o\",\"note\":\"\\u0000\"}" \
    "{\"couponId\":$C,\"userId\\u0000\":502,\"userId\":501,\"orderId\":\"o\"}" \
    "{\"couponId\":$big,\"userId\":501,\"orderId\":\"o\"}" "{\"couponId\":1e300,\"userId\":501,\"orderId\":\"o\"}" \
    "{\"couponId\":$C,\"userId\":$big,\"orderId\":\"o\"}" "{\"couponId\":$C,\"userId\":0,\"orderId\":\"o\"}" \
    "{\"couponId\":$C,\"userId\":501,\"userId\":501,\"orderId\":\"o\"}"; do
    http POST "$USE" "$body" "$SVC"
    expect "bad body $body" 400 BAD_REQUEST
done
http POST "$USE" "{\"couponId\":9007199254740991,\"userId\":501,\"orderId\":\"o\"}" "$SVC"
expect "couponId 2^53-1 as a number is taken (and not found)" 404 NO_SUCH_COUPON
http POST "$USE" "{\"couponId\":\"$big\",\"userId\":\"501\",\"orderId\":\"o\"}" "$SVC"
expect "ids past 2^53-1 as decimal strings are exact (and not found)" 404 NO_SUCH_COUPON
check_eq "... and answered exactly" "$big" "$(jat "$HTTP_BODY" couponId)"
check_eq "no bad body changed the coupon" "1 " \
    "$(mysql_q "SELECT status, COALESCE(order_id, '') FROM coupon WHERE id = $C" | tr '\t' ' ')"

# --- expiry and return on expiry ----------------------------------------------------------
before=$(stock_of "$A")
mysql_q "UPDATE coupon SET valid_until = NOW(3) - INTERVAL 1 SECOND WHERE id = $C"
check "the expiry pass returns the coupon (MySQL and Redis)" wait_for 20 \
    sql_is "SELECT status, returned FROM coupon WHERE id = $C" $'3\t2'
check_eq "Redis stock up by one" $((before + 1)) "$(stock_of "$A")"
check_eq "MySQL stock_num back to 3" 3 "$(mysql_q "SELECT stock_num FROM activity WHERE id = $A")"
check "total_num = stock_num + coupons that count" invariant "$A"
check_eq "the user left the seize list" 0 "$(rcli HEXISTS "COUPON:SEIZE:LIST:${A}_{$((A % 10))}" 501)"
http POST "$USE" "{\"couponId\":$C,\"userId\":501,\"orderId\":\"order-9\"}" "$SVC"
expect "use of the expired coupon" 409 EXPIRED
http GET "$MINE" '' "$U1"
check_eq "mine still shows it, expired" "1 EXPIRED" "$(jat "$HTTP_BODY" total) $(jat "$HTTP_BODY" coupons.0.status)"
http POST "$SEIZE" "{\"id\":$A}" "$U1"
expect "the user seizes again" 200 SEIZED
check "the second coupon is written" wait_for 20 \
    sql_is "SELECT COUNT(*) FROM coupon WHERE activity_id = $A AND user_id = 501" 2
check "invariant after the second coupon" invariant "$A"
http GET "$MINE?status=unused" '' "$U1"
check_eq "mine?status=unused: the new one" 1 "$(jat "$HTTP_BODY" total)"
# A replayed queue entry of the returned coupon (a drain that crashed between
# its commit and its HDEL) must not become a second live coupon.
old_ms=$(mysql_q "SELECT CAST(UNIX_TIMESTAMP(seized_at) * 1000 AS SIGNED) FROM coupon WHERE id = $C")
rcli HSET "QUEUE:COUPON:SEIZE:SYNC:{$((A % 10))}" "$A:501" "$old_ms" >/dev/null
queue_empty() { [[ $(rcli HLEN "QUEUE:COUPON:SEIZE:SYNC:{$((A % 10))}") == 0 ]]; }
check "the replayed entry is drained" wait_for 20 queue_empty
check_eq "replay: still two coupons, one live" "2 1" \
    "$(mysql_q "SELECT COUNT(*), SUM(returned = 0) FROM coupon WHERE activity_id = $A AND user_id = 501" | tr '\t' ' ')"
check "invariant after the replay" invariant "$A"

# Plain expiry (no returnOnExpiry): expired, stock stays taken.
create "Plain" 2
P=$NEW_ID
http POST "$SEIZE" "{\"id\":$P}" "$U2"
expect "seize a plain activity" 200 SEIZED
check "written" wait_for 20 sql_is "SELECT COUNT(*) FROM coupon WHERE activity_id = $P" 1
# expired_total SYNC_PROM: couponseize_sync_coupons_expired_total (0 when absent).
expired_total() {
    local v
    v=$(sed -n 's/^couponseize_sync_coupons_expired_total \([0-9]*\).*/\1/p' "$COUPON_DIR/sync.prom" 2>/dev/null)
    echo "${v:-0}"
}
before_expired=$(expired_total)
mysql_q "UPDATE coupon SET valid_until = NOW(3) - INTERVAL 1 SECOND WHERE activity_id = $P"
check "plain expiry marks it expired" wait_for 20 \
    sql_is "SELECT status, returned FROM coupon WHERE activity_id = $P" $'3\t0'
check_eq "no stock back without returnOnExpiry" "1 1" \
    "$(mysql_q "SELECT stock_num FROM activity WHERE id = $P") $(stock_of "$P")"
expired_more() { (($(expired_total) > before_expired)); }
check "metrics count the plain expiry (expired_total above $before_expired)" \
    wait_for 20 expired_more

# --- eligible groups ---------------------------------------------------------------------
create "New users only" 5 '"eligibleGroups":["new-user","vip"]'
G=$NEW_ID
check_eq "eligibleGroups shows in the activity" '["new-user", "vip"]' "$(jat "$HTTP_BODY" activity.eligibleGroups)"
http GET "/market/consumer/coupon/status?id=$G"
check_eq "status shows eligibleGroups" '["new-user", "vip"]' "$(jat "$HTTP_BODY" activity.eligibleGroups)"
evalsha() { rcli INFO commandstats | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*/\1/p'; }
e0=$(evalsha)
http POST "$SEIZE" "{\"id\":$G}" "$(mint_jwt 601)"
expect "a token without groups" 403 NOT_ELIGIBLE
http POST "$SEIZE" "{\"id\":$G}" "$(JWT_EXTRA='"groups":["old-user"]' mint_jwt 602)"
expect "a token with the wrong group" 403 NOT_ELIGIBLE
http POST "$SEIZE" "{\"id\":$G}" "$(JWT_EXTRA='"groups":"new-user"' mint_jwt 603)"
expect "a groups claim that is not an array" 403 NOT_ELIGIBLE
http POST "$SEIZE" "{\"id\":$G}" "$(JWT_EXTRA='"groups":[","]' mint_jwt 606)"
expect "a group named , (the separator of the stored list)" 403 NOT_ELIGIBLE
http POST "$SEIZE" "{\"id\":$G}" "$(JWT_EXTRA='"groups":["new-user\",\"vip"]' mint_jwt 607)"
expect "a group named new-user\",\"vip" 403 NOT_ELIGIBLE
http POST "$SEIZE" "{\"id\":$G}" "$(JWT_EXTRA='"groups":["vip\u0000x"]' mint_jwt 608)"
expect "a group vip\\u0000x (a NUL in the name): the token is refused" 401 UNAUTHORIZED
http POST "$SEIZE" "{\"id\":$G}" "$(JWT_EXTRA='"groups":["VIP","new"]' mint_jwt 609)"
expect "names differing in case or cut short" 403 NOT_ELIGIBLE
check_eq "no refusal reached Redis' script" "${e0:-0}" "$(evalsha)"
http POST "$SEIZE" "{\"id\":$G}" "$(JWT_EXTRA='"groups":["x","vip"]' mint_jwt 604)"
expect "a token with the right group" 200 SEIZED
http POST "$SEIZE" "{\"id\":$A}" "$(mint_jwt 605)"
expect "an activity without groups: anyone" 200 SEIZED
http POST "$ACT" "{\"name\":\"g\",\"totalNum\":1,\"distributeStartTime\":\"$(iso 60)\",\"distributeEndTime\":\"$(iso 3600)\",\"eligibleGroups\":[\"a b\"]}" "$ADMIN"
expect "a group name with a space" 400 BAD_REQUEST
http POST "$ACT" "{\"name\":\"g\",\"totalNum\":1,\"distributeStartTime\":\"$(iso 60)\",\"distributeEndTime\":\"$(iso 3600)\",\"eligibleGroups\":\"vip\"}" "$ADMIN"
expect "eligibleGroups not an array" 400 BAD_REQUEST

finish
