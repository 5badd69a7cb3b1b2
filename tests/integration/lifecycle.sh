#!/usr/bin/env bash
# lifecycle.sh - a coupon after the seize, through nginx: mine, use (idempotent
# per order, another order refused), release, use again, expiry by moving
# valid_until into the past, return on expiry and the user seizing again;
# who may use; bad bodies; eligible groups; 1,000 concurrent use calls over 100
# coupons from 10 orders each; a return racing a burst of seizes for the last
# coupons (never oversold, totals hold).
# shellcheck disable=SC2317 # helpers are called through check/wait_for
set -u

# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib.sh"

skip_unless_cmd python3
export COUPON_CONF_OVERRIDES="sync.status_interval_s=1"
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

http POST "$USE" "{\"couponId\":$C,\"orderId\":\"order-1\"}" "$SVC"
expect "use by order-1" 200 OK
check_eq "use answers the state" "USED order-1" "$(jat "$HTTP_BODY" status) $(jat "$HTTP_BODY" orderId)"
http POST "$USE" "{\"couponId\":$C,\"orderId\":\"order-1\"}" "$SVC"
expect "use again by order-1: idempotent" 200 OK
http POST "$USE" "{\"couponId\":$C,\"orderId\":\"order-2\"}" "$SVC"
expect "use by order-2" 409 ALREADY_USED
http GET "$MINE?status=used" '' "$U1"
check_eq "mine shows it used by order-1" "1 USED order-1" \
    "$(jat "$HTTP_BODY" total) $(jat "$HTTP_BODY" coupons.0.status) $(jat "$HTTP_BODY" coupons.0.orderId)"
http POST "$REL" "{\"couponId\":$C,\"orderId\":\"order-2\"}" "$SVC"
expect "release by order-2 (not its order)" 409 ALREADY_USED
http POST "$REL" "{\"couponId\":$C,\"orderId\":\"order-1\"}" "$SVC"
expect "release by order-1" 200 OK
check_eq "released: unused" UNUSED "$(jat "$HTTP_BODY" status)"
http POST "$REL" "{\"couponId\":$C,\"orderId\":\"order-1\"}" "$SVC"
expect "release twice: one release undoes one use" 409 UNUSED
http POST "$USE" "{\"couponId\":$C,\"orderId\":\"order-2\"}" "$SVC"
expect "use again by order-2 after the release" 200 OK
http POST "$REL" "{\"couponId\":$C,\"orderId\":\"order-2\"}" "$ADMIN"
expect "release with an admin token" 200 OK
check_eq "admin use/release leaves an audit row" 1 \
    "$(mysql_q "SELECT COUNT(*) FROM admin_audit WHERE action = 'release' AND admin_sub = '77' AND result = 'OK' AND activity_id = $A")"
check "the service route logs the order id" grep -q "coupon $C release by order order-2" "$COUPON_DIR/fcgi.log"
http POST "$USE" "{\"couponId\":99999999,\"orderId\":\"order-1\"}" "$SVC"
expect "use of an unknown coupon" 404 NO_SUCH_COUPON

# --- who may use -----------------------------------------------------------------------
http POST "$USE" "{\"couponId\":$C,\"orderId\":\"order-3\"}" "$U1"
expect "the owner without auth.user_may_use" 403 FORBIDDEN
http POST "$USE" "{\"couponId\":$C,\"orderId\":\"order-3\"}"
expect "no token" 401 UNAUTHORIZED

# --- bad bodies ------------------------------------------------------------------------
long=$(printf 'o%.0s' {1..65})
for body in "{\"couponId\":$C}" "{\"couponId\":$C,\"orderId\":\"\"}" "{\"couponId\":$C,\"orderId\":\"$long\"}" \
    "{\"couponId\":$C,\"orderId\":\"zamówienie\"}" "{\"couponId\":$C,\"orderId\":\"a\\u0001b\"}" \
    "{\"couponId\":$C,\"orderId\":7}" "{\"couponId\":\"abc\",\"orderId\":\"o\"}" \
    "{\"couponId\":1.5,\"orderId\":\"o\"}" "{\"couponId\":-1,\"orderId\":\"o\"}" \
    "{\"couponId\":0,\"orderId\":\"o\"}" "{\"orderId\":\"o\"}" "{\"couponId\":true,\"orderId\":\"o\"}" \
    "{\"couponId\":$C,\"couponId\":$C,\"orderId\":\"o\"}" "[1,2]" "{\"couponId\":$C,"; do
    http POST "$USE" "$body" "$SVC"
    expect "bad body $body" 400 BAD_REQUEST
done
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
http POST "$USE" "{\"couponId\":$C,\"orderId\":\"order-9\"}" "$SVC"
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
