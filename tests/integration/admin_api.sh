#!/usr/bin/env bash
# admin_api.sh - /market/admin/coupon/activity through nginx: create, get,
# page, update, top-up (a sold-out sale topped up by K grants exactly K more,
# and MySQL agrees after sync), the 400 / 403 / 404 / 409 answers, exact ids
# up to 2^63-1, `now` in status answers, and one admin_audit row per action.
# shellcheck disable=SC2317 # helpers are called through check/wait_for
set -u

# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib.sh"

# A long sold-out hint, so a second node surely still holds one when the
# sale is topped up (see "on every node" below).
RECHECK=3000
# coupon-sync's periodic preheat an hour apart: every change below must show
# because the admin call published it, never because a preheat (5 s on the
# test stack) happened to run in between - nor may one run between the HDEL
# and the top-up of "top-up before preheat".
export COUPON_CONF_OVERRIDES="limits.soldout_recheck_ms=$RECHECK
preheat.interval_s=3600"
cs_stack_up

ACT=/market/admin/coupon/activity
ADMIN=$(mint_jwt 77 admin)
USER=$(mint_jwt 5)



# create NAME TOTAL START_OFF END_OFF: POSTs an activity; HTTP_* as http().
create() {
    http POST "$ACT" "{\"name\":\"$1\",\"totalNum\":$2,\"distributeStartTime\":\"$(iso "$3")\",\"distributeEndTime\":\"$(iso "$4")\",\"validityDays\":7,\"couponName\":\"$1\",\"couponAmount\":\"12.5\"}" "$ADMIN"
}

# expect NAME STATUS CODE [FIELD]: the last answer's status, code (and field).
expect() {
    local got="$HTTP_CODE $(jat "$HTTP_BODY" code)" want="$2 $3"
    if [[ -n ${4:-} ]]; then got+=" $(jat "$HTTP_BODY" field)"; want+=" $4"; fi
    if [[ $got == "$want" ]]; then ok "$1"; else not_ok "$1" "expected: $want" "     got: $got" "$HTTP_BODY"; fi
}

# --- who may call it ----------------------------------------------------------------
http GET "$ACT"
expect "GET without a token" 401 UNAUTHORIZED
http GET "$ACT" '' "$USER"
expect "GET with a user token" 403 FORBIDDEN
http POST "$ACT" '{"name":"x","totalNum":1}' "$USER"
expect "POST with a user token" 403 FORBIDDEN
http PUT "$ACT" '{"id":1,"addStock":1}' "$USER"
expect "PUT with a user token" 403 FORBIDDEN
http DELETE "$ACT" '' "$ADMIN"
expect "DELETE is not a method of the route" 405 METHOD_NOT_ALLOWED
check_match "405 names the methods" $'\n[Aa]llow: GET, HEAD, POST, PUT' "$HTTP_HEADERS"

# --- create -------------------------------------------------------------------------
create "Live sale" 5 -60 3600
expect "create: 201" 201 OK
A=$(jat "$HTTP_BODY" idStr)
check_match "create: the answer has id and idStr" '^[1-9][0-9]*$' "$A"
check_eq "create: id and idStr agree" "$A" "$(jat "$HTTP_BODY" id)"
check_eq "create: the activity comes back" "Live sale 5 IN_PROGRESS 12.50 7" \
    "$(jat "$HTTP_BODY" activity.name) $(jat "$HTTP_BODY" activity.totalNum) $(jat "$HTTP_BODY" activity.status) $(jat "$HTTP_BODY" activity.couponAmount) $(jat "$HTTP_BODY" activity.validityDays)"
check_eq "create: preheated at once (Redis stock = total)" 5 "$(stock_of "$A")"
check_eq "create: MySQL row (total, stock, status)" $'5\t5\t2' \
    "$(mysql_q "SELECT total_num, stock_num, status FROM activity WHERE id = $A")"

now0=$(date +%s%3N)
http GET /market/consumer/coupon/status
srv=$(jat "$HTTP_BODY" now)
check "status answers carry now (epoch ms, within 5 s of this clock)" \
    test "${srv:-0}" -gt $((now0 - 5000)) -a "${srv:-0}" -lt $((now0 + 5000))
check_eq "status lists the created activity by name" "Live sale" \
    "$(jat "$HTTP_BODY" activities.0.name)"
http GET "/market/consumer/coupon/status?id=$A"
check_match "status?id carries now" '^[0-9]{13}$' "$(jat "$HTTP_BODY" now)"

# --- 400: each names the field ------------------------------------------------------------
S=$(iso 600) E=$(iso 3600)
bad() {
    http POST "$ACT" "$2" "$ADMIN"
    expect "create 400: $1" 400 BAD_REQUEST "${3:-}"
}
bad "name missing" "{\"totalNum\":5,\"distributeStartTime\":\"$S\",\"distributeEndTime\":\"$E\"}" name
bad "empty name" "{\"name\":\" \",\"totalNum\":5,\"distributeStartTime\":\"$S\",\"distributeEndTime\":\"$E\"}" name
bad "totalNum 0" "{\"name\":\"n\",\"totalNum\":0,\"distributeStartTime\":\"$S\",\"distributeEndTime\":\"$E\"}" totalNum
bad "totalNum -3" "{\"name\":\"n\",\"totalNum\":-3,\"distributeStartTime\":\"$S\",\"distributeEndTime\":\"$E\"}" totalNum
bad "totalNum 2.5" "{\"name\":\"n\",\"totalNum\":2.5,\"distributeStartTime\":\"$S\",\"distributeEndTime\":\"$E\"}" totalNum
bad "totalNum as a string" "{\"name\":\"n\",\"totalNum\":\"5\",\"distributeStartTime\":\"$S\",\"distributeEndTime\":\"$E\"}" totalNum
bad "end before start" "{\"name\":\"n\",\"totalNum\":5,\"distributeStartTime\":\"$E\",\"distributeEndTime\":\"$S\"}" distributeEndTime
bad "end equal to start" "{\"name\":\"n\",\"totalNum\":5,\"distributeStartTime\":\"$S\",\"distributeEndTime\":\"$S\"}" distributeEndTime
bad "a time without offset" "{\"name\":\"n\",\"totalNum\":5,\"distributeStartTime\":\"2026-12-01T20:00:00\",\"distributeEndTime\":\"$E\"}" distributeStartTime
bad "a time that does not exist" "{\"name\":\"n\",\"totalNum\":5,\"distributeStartTime\":\"2026-02-30T20:00:00+08:00\",\"distributeEndTime\":\"$E\"}" distributeStartTime
bad "end missing" "{\"name\":\"n\",\"totalNum\":5,\"distributeStartTime\":\"$S\"}" distributeEndTime
bad "validityDays 0" "{\"name\":\"n\",\"totalNum\":5,\"distributeStartTime\":\"$S\",\"distributeEndTime\":\"$E\",\"validityDays\":0}" validityDays
bad "couponAmount with 3 decimals" "{\"name\":\"n\",\"totalNum\":5,\"distributeStartTime\":\"$S\",\"distributeEndTime\":\"$E\",\"couponAmount\":\"1.005\"}" couponAmount
bad "name twice" "{\"name\":\"n\",\"name\":\"m\",\"totalNum\":5,\"distributeStartTime\":\"$S\",\"distributeEndTime\":\"$E\"}" name
bad "unknown field" "{\"name\":\"n\",\"totalNum\":5,\"distributeStartTime\":\"$S\",\"distributeEndTime\":\"$E\",\"colour\":1}"
check_match "unknown field: the message names it" 'colour' "$(jat "$HTTP_BODY" msg)"
bad "not JSON" '{"name":'
# cJSON would cut a string at \u0000: "a\u0000b" stored as "a", a name
# "name\u0000x" read as "name". No string may hold NUL.
bad "a NUL in the name" "{\"name\":\"a\\u0000b\",\"totalNum\":5,\"distributeStartTime\":\"$S\",\"distributeEndTime\":\"$E\"}"
bad "a NUL in a member name" "{\"name\\u0000x\":\"n\",\"totalNum\":5,\"distributeStartTime\":\"$S\",\"distributeEndTime\":\"$E\"}"
bad "a NUL in a group" "{\"name\":\"n\",\"totalNum\":5,\"distributeStartTime\":\"$S\",\"distributeEndTime\":\"$E\",\"eligibleGroups\":[\"vip\\u0000\"]}"
bad "not an object" '[1,2]'
check_eq "nothing was created by the refused requests" 1 "$(mysql_q "SELECT COUNT(*) FROM activity")"

# --- get and page -------------------------------------------------------------------------
create "Later sale" 100 3600 7200
L=$(jat "$HTTP_BODY" idStr)
create "Third sale" 10 3600 7200
T=$(jat "$HTTP_BODY" idStr)
http GET "$ACT?id=$L" '' "$ADMIN"
expect "get one" 200 OK
check_eq "get one: the activity" "$L Later sale NOT_STARTED 100" \
    "$(jat "$HTTP_BODY" activity.idStr) $(jat "$HTTP_BODY" activity.name) $(jat "$HTTP_BODY" activity.status) $(jat "$HTTP_BODY" activity.remaining)"
http GET "$ACT?id=999999" '' "$ADMIN"
expect "get an unknown id" 404 NO_SUCH_ACTIVITY
http GET "$ACT?id=abc" '' "$ADMIN"
expect "get with a bad id" 400 BAD_REQUEST id
http GET "$ACT?page=1&size=2" '' "$ADMIN"
expect "page 1 of size 2" 200 OK
check_eq "page 1: newest first, total 3" "$T $L 3" \
    "$(jat "$HTTP_BODY" activities.0.idStr) $(jat "$HTTP_BODY" activities.1.idStr) $(jat "$HTTP_BODY" total)"
check_match "page answers carry the sync queue depth and the breaker" '^[0-9]+ closed$' \
    "$(jat "$HTTP_BODY" queueDepth) $(jat "$HTTP_BODY" breaker)"
http GET "$ACT?page=2&size=2" '' "$ADMIN"
check_eq "page 2: the oldest" "$A 1" \
    "$(jat "$HTTP_BODY" activities.0.idStr) $(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])["activities"]))' "$HTTP_BODY")"
http GET "$ACT?page=1&size=201" '' "$ADMIN"
expect "size over 200" 400 BAD_REQUEST size

# --- update before the start: any field ---------------------------------------------------
NS=$(iso 1800) NE=$(iso 9000)
http PUT "$ACT" "{\"id\":$L,\"name\":\"Later sale, renamed\",\"totalNum\":150,\"distributeStartTime\":\"$NS\",\"distributeEndTime\":\"$NE\",\"couponAmount\":3}" "$ADMIN"
expect "update before the start" 200 OK
check_eq "update: the new values" "Later sale, renamed 150 150 3.00 $NS $NE" \
    "$(jat "$HTTP_BODY" activity.name) $(jat "$HTTP_BODY" activity.totalNum) $(jat "$HTTP_BODY" activity.stockNum) $(jat "$HTTP_BODY" activity.couponAmount) $(jat "$HTTP_BODY" activity.distributeStartTime) $(jat "$HTTP_BODY" activity.distributeEndTime)"
check_eq "update: Redis stock follows the new total" 150 "$(stock_of "$L")"
http GET "/market/consumer/coupon/status?id=$L"
check_eq "update: status shows the new name and start (preheat re-ran)" \
    "Later sale, renamed $(($(date -d "$NS" +%s) * 1000))" \
    "$(jat "$HTTP_BODY" activity.name) $(jat "$HTTP_BODY" activity.startTime)"
http PUT "$ACT" "{\"id\":$L,\"totalNum\":20}" "$ADMIN"
expect "update before the start: a lower total" 200 OK
check_eq "lower total: MySQL and Redis" $'20\t20 20' \
    "$(mysql_q "SELECT total_num, stock_num FROM activity WHERE id = $L") $(stock_of "$L")"
http PUT "$ACT" "{\"id\":$L,\"distributeEndTime\":\"$NS\"}" "$ADMIN"
expect "update: end not after start" 400 BAD_REQUEST distributeEndTime
http PUT "$ACT" "{\"id\":$L}" "$ADMIN"
expect "update with nothing to change" 400 BAD_REQUEST
http PUT "$ACT" "{\"id\":$L,\"name\":\"x\\u0000y\"}" "$ADMIN"
expect "update: a NUL in the name" 400 BAD_REQUEST
http POST /market/admin/coupon/reserve/return "{\"id\":$L,\"incarnation\":\"0123456789abcdef0123456789abcdef\\u0000x\"}" "$ADMIN"
expect "reserve return: a NUL after the incarnation" 400 BAD_REQUEST
http PUT "$ACT" '{"id":999999,"addStock":1}' "$ADMIN"
expect "update of an unknown id" 404 NO_SUCH_ACTIVITY
http PUT "$ACT" '{"addStock":1}' "$ADMIN"
expect "update without id" 400 BAD_REQUEST id
http PUT "$ACT" "{\"id\":$L,\"addStock\":0}" "$ADMIN"
expect "addStock 0" 400 BAD_REQUEST addStock

# --- update once started: a later end and addStock only ----------------------------------
http PUT "$ACT" "{\"id\":$A,\"name\":\"Renamed\"}" "$ADMIN"
expect "started: the name cannot change" 400 BAD_REQUEST name
http PUT "$ACT" "{\"id\":$A,\"totalNum\":50}" "$ADMIN"
expect "started: totalNum cannot change (addStock can)" 400 BAD_REQUEST totalNum
http PUT "$ACT" "{\"id\":$A,\"distributeEndTime\":\"$(iso 1800)\"}" "$ADMIN"
expect "started: an earlier end" 400 BAD_REQUEST distributeEndTime
LE=$(iso 7200)
http PUT "$ACT" "{\"id\":$A,\"name\":\"Live sale\",\"distributeEndTime\":\"$LE\"}" "$ADMIN"
expect "started: a later end (the name sent unchanged is fine)" 200 OK
http GET "/market/consumer/coupon/status?id=$A"
check_eq "started: status shows the later end" "$(($(date -d "$LE" +%s) * 1000))" \
    "$(jat "$HTTP_BODY" activity.endTime)"

# --- sold out, topped up by K, exactly K more, on every node ------------------------------
# A second node: another coupon-fcgi with its own shared memory (so its own
# sold-out hints) on the same Redis and MySQL, spoken to over FastCGI.
N2=$COUPON_DIR/node2
mkdir -p "$N2"
sed -e "s|^\( *listen = \).*|\1\"$N2/fcgi.sock\";|" -e "s|^\( *workers = \).*|\11;|" \
    -e "s|^\( *shm_name = \).*|\1\"/couponseize-n2-$$\";|" "$COUPON_CONF" >"$N2/couponseize.conf"
"$top_builddir/coupon-fcgi" -c "$N2/couponseize.conf" >"$N2/fcgi.log" 2>&1 </dev/null &
N2_PID=$!
stop_node2() {
    kill -TERM "$N2_PID" 2>/dev/null
    wait "$N2_PID" 2>/dev/null
    rm -f "/dev/shm/couponseize-n2-$$"
}
cs_defer stop_node2
# n2_seize ID TOKEN: the code node 2 answers.
n2_seize() {
    local body="{\"id\":$1}" tok=$2
    printf '%s' "$body" | env -i REQUEST_METHOD=POST REQUEST_URI=/market/consumer/coupon/seize \
        SCRIPT_NAME=/market/consumer/coupon/seize CONTENT_TYPE=application/json \
        CONTENT_LENGTH=${#body} HTTP_AUTHORIZATION="Bearer $tok" SERVER_PROTOCOL=HTTP/1.1 \
        GATEWAY_INTERFACE=CGI/1.1 REMOTE_ADDR=127.0.0.1 SERVER_NAME=localhost \
        timeout 10 cgi-fcgi -bind -connect "$N2/fcgi.sock" 2>/dev/null |
        grep -o '"code":"[A-Z_]*"' | cut -d'"' -f4
}
wait_for 20 test -S "$N2/fcgi.sock" || not_ok "node 2 starts" "$(tail -n 5 "$N2/fcgi.log")"

out=$(seize_load "$A" 4 20 1000)
check_eq "sale of 5: 20 users get 5 coupons" "5 15" "$(code_count "$out" SEIZED) $(code_count "$out" SOLD_OUT)"
check_eq "node 2 sees the sale sold out (and keeps a sold-out hint)" SOLD_OUT \
    "$(n2_seize "$A" "$(mint_jwt 2500)")"
t_hint=$(date +%s%3N) # node 2's hint expires before t_hint + RECHECK
K=3
http PUT "$ACT" "{\"id\":$A,\"addStock\":$K}" "$ADMIN"
t_topup=$(date +%s%3N)
expect "top-up of a sold-out sale" 200 OK
check_eq "top-up: the answer" "updated $((5 + K)) $K" \
    "$(jat "$HTTP_BODY" redisStock) $(jat "$HTTP_BODY" activity.totalNum) $(jat "$HTTP_BODY" activity.remaining)"
# This node at once, not after its sold-out hint expires.
http POST /market/consumer/coupon/seize "{\"id\":$A}" "$(mint_jwt 2001)"
expect "the sale is open again at once on the node that took the top-up" 200 SEIZED
# Node 2 within limits.soldout_recheck_ms: its hint may answer SOLD_OUT until
# it expires, Redis itself never again. Judged by when each seize was sent,
# so a slow client cannot make it pass or fail.
n2="" late="" hinted=0
for ((u = 2600; u < 2900; u++)); do
    tok=$(mint_jwt "$u")
    t_send=$(date +%s%3N)
    n2=$(n2_seize "$A" "$tok")
    [[ $n2 == SOLD_OUT ]] || break
    if ((t_send > t_hint + RECHECK + 200)); then late+=" $((t_send - t_topup))"; else hinted=1; fi
    sleep 0.1
done
diag "node 2: first grant $(($(date +%s%3N) - t_topup)) ms after the top-up; hint seen: $hinted"
check_eq "node 2 sells again after the top-up" SEIZED "$n2"
check_eq "node 2 said SOLD_OUT to no seize sent after its hint expired (ms after top-up)" "" "$late"
out=$(seize_load "$A" 4 20 3000)
check_eq "then exactly the rest of K (K-2) of 20 more users get one" "$((K - 2)) $((20 - K + 2))" \
    "$(code_count "$out" SEIZED) $(code_count "$out" SOLD_OUT)"
check_eq "Redis stock is 0" 0 "$(stock_of "$A")"
check "MySQL after sync: total $((5 + K)), stock 0, $((5 + K)) coupons" \
    wait_for 20 sql_is "SELECT a.total_num, a.stock_num, (SELECT COUNT(*) FROM coupon c WHERE c.activity_id = a.id) FROM activity a WHERE a.id = $A" "$((5 + K))	0	$((5 + K))"

# Redis without the stock field (not preheated, or lost): the top-up leaves
# it to preheat, which sets it from MySQL's new total - never total + 2K.
rcli HDEL "COUPON:RESOURCE:STOCK:{$((T % 10))}" "$T" >/dev/null
http PUT "$ACT" "{\"id\":$T,\"addStock\":4}" "$ADMIN"
check_eq "top-up before preheat: MySQL 14, Redis set by preheat to 14" "not preheated 14 14" \
    "$(jat "$HTTP_BODY" redisStock) $(mysql_q "SELECT total_num FROM activity WHERE id = $T") $(stock_of "$T")"

# Redis already has the revoke tombstone (revoke writes Redis first): a
# top-up never turns it back into stock.
rcli HSET "COUPON:RESOURCE:STOCK:{$((L % 10))}" "$L" -1 >/dev/null
http PUT "$ACT" "{\"id\":$L,\"addStock\":5}" "$ADMIN"
check_eq "top-up of a sale revoked in Redis: the tombstone stays" "revoked -1" \
    "$(jat "$HTTP_BODY" redisStock) $(stock_of "$L")"

# --- 409: ended and voided ------------------------------------------------------------------
mk_activity 880 10 -7200 -3600
http PUT "$ACT" '{"id":880,"addStock":1}' "$ADMIN"
expect "update of an ended sale" 409 ENDED
http POST /market/admin/coupon/revoke "{\"id\":$T}" "$ADMIN"
expect "revoke" 200 OK
http PUT "$ACT" "{\"id\":$T,\"addStock\":1}" "$ADMIN"
expect "update of a voided sale" 409 VOIDED
http POST /market/admin/coupon/preheat '' "$ADMIN"
expect "preheat" 200 OK

# --- Idempotency-Key on admin writes ------------------------------------------------------------
# keyed KEY METHOD PATH [BODY]: like http, with an Idempotency-Key header.
keyed() {
    local out
    local -a args=(-s -X "$2" --max-time 30 -D - -H "Authorization: Bearer $ADMIN" -H "Idempotency-Key: $1")
    if [[ -n ${4:-} ]]; then
        args+=(-H 'Content-Type: application/json' --data-binary "$4")
    else
        args+=(-H 'Content-Length: 0')
    fi
    out=$(curl "${args[@]}" -w '\n%{http_code}' "$COUPON_URL$3") || true
    HTTP_CODE=${out##*$'\n'}
    out=${out%$'\n'*}
    HTTP_HEADERS=${out%%$'\r\n\r\n'*}
    HTTP_BODY=${out#*$'\r\n\r\n'}
}
body_sans_now() { sed 's/"now":[0-9]*//' <<<"$1"; }
k1=topup-$RANDOM$RANDOM
create "Keyed" 10 -60 3600
expect "create an activity for the keyed top-ups" 201 OK
C=$(jat "$HTTP_BODY" idStr)
keyed "$k1" PUT "$ACT" "{\"id\":$C,\"addStock\":3}"
expect "top-up with a key" 200 OK
first=$HTTP_BODY
check_eq "the top-up counted once: MySQL total, stock; Redis stock" "13 13 13" \
    "$(mysql_q "SELECT CONCAT(total_num, ' ', stock_num) FROM activity WHERE id = $C") $(stock_of "$C")"
for i in 1 2; do
    keyed "$k1" PUT "$ACT" "{\"id\":$C,\"addStock\":3}"
    expect "the same key again ($i): the same answer" 200 OK
    check_eq "the same key again ($i): the body the first request got" "$first" "$HTTP_BODY"
    check_match "the same key again ($i): marked as a replay" $'\n[Ii]dempotent-[Rr]eplayed: true' "$HTTP_HEADERS"
done
check_eq "a repeated key changed nothing: MySQL total, stock; Redis stock" "13 13 13" \
    "$(mysql_q "SELECT CONCAT(total_num, ' ', stock_num) FROM activity WHERE id = $C") $(stock_of "$C")"
check_eq "one audit row for the keyed top-up" 1 \
    "$(mysql_q "SELECT COUNT(*) FROM admin_audit WHERE action = 'topup' AND activity_id = $C")"
keyed "$k1" PUT "$ACT" "{\"id\":$C,\"addStock\":4}"
expect "the key with another body" 422 IDEMPOTENCY_KEY_REUSED
keyed "\"sf-$k1\"" PUT "$ACT" "{\"id\":$C,\"addStock\":3}"
expect "a new key, written as an sf-string (quoted)" 200 OK
keyed "sf-$k1" PUT "$ACT" "{\"id\":$C,\"addStock\":3}"
check_eq "the quoted and the bare key are one key" "200 true" \
    "$HTTP_CODE $(grep -ci '^idempotent-replayed: true' <<<"$HTTP_HEADERS" | sed 's/^1$/true/')"
check_eq "two top-ups of 3 in all" "16 16" \
    "$(mysql_q "SELECT total_num FROM activity WHERE id = $C") $(stock_of "$C")"
keyed "bad key" PUT "$ACT" "{\"id\":$C,\"addStock\":3}"
expect "a key with a space" 400 BAD_REQUEST
mysql_q "INSERT INTO admin_idempotency (admin_sub, idem_key, request_method, request_path, request_body)
    VALUES ('77', 'pending-$k1', 'PUT', '$ACT', '{\"id\":$C,\"addStock\":3}')"
keyed "pending-$k1" PUT "$ACT" "{\"id\":$C,\"addStock\":3}"
expect "a key whose first request is unanswered" 409 IDEMPOTENCY_KEY_IN_USE
check_eq "... and nothing was added" 16 "$(mysql_q "SELECT total_num FROM activity WHERE id = $C")"
cbody="{\"name\":\"Keyed create\",\"totalNum\":5,\"distributeStartTime\":\"$(iso 600)\",\"distributeEndTime\":\"$(iso 3600)\"}"
keyed "create-$k1" POST "$ACT" "$cbody"
expect "create with a key" 201 OK
cid=$(jat "$HTTP_BODY" idStr)
keyed "create-$k1" POST "$ACT" "$cbody"
check_eq "a retried create answers the same id" "201 $cid" "$HTTP_CODE $(jat "$HTTP_BODY" idStr)"
check_eq "... and created one activity" 1 "$(mysql_q "SELECT COUNT(*) FROM activity WHERE name = 'Keyed create'")"
USER2=$(mint_jwt 6)
out=$(curl -s -o /dev/null -w '%{http_code}' -X PUT -H "Authorization: Bearer $USER2" \
    -H "Idempotency-Key: user-$k1" -H 'Content-Type: application/json' \
    --data-binary "{\"id\":$C,\"addStock\":3}" "$COUPON_URL$ACT")
check_eq "a user's keyed write: 403, no key remembered" "403 0" \
    "$out $(mysql_q "SELECT COUNT(*) FROM admin_idempotency WHERE idem_key = 'user-$k1'")"

# --- exact ids up to 2^63-1 -------------------------------------------------------------------
mk_activity 9223372036854775806 10 -60 3600
http GET "$ACT?id=9223372036854775806" '' "$ADMIN"
check_match "a 19-digit id is answered exactly" '"id":9223372036854775806,"idStr":"9223372036854775806"' "$HTTP_BODY"
create "Last id" 5 -60 3600
expect "create after 2^63-2" 201 OK
check_match "the next id is 2^63-1, exact" '"id":9223372036854775807,"idStr":"9223372036854775807"' "$HTTP_BODY"

# --- the audit trail ----------------------------------------------------------------------------
check_eq "no audit row for 401/403 answers" 0 \
    "$(mysql_q "SELECT COUNT(*) FROM admin_audit WHERE admin_sub <> '77'")"
check_eq "audit rows by action (create, preheat, reserve_return, revoke, topup, update)" \
    "create 26,preheat 1,reserve_return 1,revoke 1,topup 10,update 9," \
    "$(mysql_q "SELECT action, COUNT(*) FROM admin_audit GROUP BY action ORDER BY action" | tr '\t\n' ' ,')"
check_eq "the top-up's row: who, what, result" \
    "77	topup	$A	{\"id\":$A,\"addStock\":$K}	200	OK" \
    "$(mysql_q "SELECT admin_sub, action, activity_id, request_body, http_status, result FROM admin_audit WHERE action = 'topup' AND activity_id = $A")"
check_eq "a refused create is recorded with its result" "400 BAD_REQUEST totalNum must be 1..1000000000" \
    "$(mysql_q "SELECT http_status, result, message FROM admin_audit WHERE request_body LIKE '%\"totalNum\":0%'" | tr '\t' ' ')"
check_eq "the 409 is recorded" "topup VOIDED" \
    "$(mysql_q "SELECT action, result FROM admin_audit WHERE http_status = 409 AND activity_id = $T" | tr '\t' ' ')"
check_eq "the revoke's row names its activity" "$T OK" \
    "$(mysql_q "SELECT activity_id, result FROM admin_audit WHERE action = 'revoke'" | tr '\t' ' ')"

# --- a refused create names no activity in the audit trail ---------------------------------------
http POST "$ACT" "{\"id\":$A,\"name\":\"Claims $A\",\"totalNum\":5,\"distributeStartTime\":\"$(iso 60)\",\"distributeEndTime\":\"$(iso 3600)\",\"validityDays\":7}" "$ADMIN"
expect "create with an id member" 400 BAD_REQUEST
check_eq "the refused create's audit row names no activity (not the body's id $A)" "create 400 NULL" \
    "$(mysql_q "SELECT action, http_status, IFNULL(activity_id, 'NULL') FROM admin_audit WHERE request_body LIKE '%Claims $A%'" | tr '\t' ' ')"

# --- a missing privilege is a grant to fix, not "MySQL unavailable" ---------------------------
# The stack's user holds exactly the documented grant; without its one DELETE
# (admin_idempotency) a keyed write answers 500 and the log names the privilege.
grant_delete() {
    local u
    for u in "'couponseize'@'localhost'" "'couponseize'@'127.0.0.1'"; do
        mysql_root_q "$1 DELETE ON couponseize.admin_idempotency ${2} $u" || return 1
    done
}
grant_delete REVOKE FROM
keyed "denied-$RANDOM" POST /market/admin/coupon/preheat
expect "without the documented DELETE grant a keyed write answers 500" 500 INTERNAL_ERROR
check_match "... and the log says a privilege is missing, naming the statement" \
    "refused, a privilege is missing: DELETE command denied" "$(cat "$COUPON_DIR/fcgi.log")"
grant_delete GRANT TO
keyed "granted-$RANDOM" POST /market/admin/coupon/preheat
expect "with the documented grant back, the keyed write runs" 200 OK

# --- preheat refuses what a cross-site form can send, in the service itself ---------------------
# Straight on the FastCGI socket: nginx's snippet answers 415 itself, lighttpd's and
# Apache's do not.
# fcgi_post PATH CONTENT_TYPE BODY: the app's status line and body.
fcgi_post() {
    local -a env=(REQUEST_METHOD=POST REQUEST_URI="$1" QUERY_STRING= SERVER_PROTOCOL=HTTP/1.1
        GATEWAY_INTERFACE=CGI/1.1 REMOTE_ADDR=127.0.0.1 HTTP_AUTHORIZATION="Bearer $ADMIN"
        CONTENT_LENGTH="${#3}")
    [[ -n $2 ]] && env+=(CONTENT_TYPE="$2")
    printf '%s' "$3" | env -i "${env[@]}" timeout 30 cgi-fcgi -bind -connect "$COUPON_FCGI_SOCK" \
        2>/dev/null | tr -d '\r' | sed -n '/^Status:/p;/^{/p' | tr '\n' ' '
}
if command -v cgi-fcgi >/dev/null 2>&1; then
    check_match "preheat with a text/plain body: 415" '^Status: 415 .*"code":"UNSUPPORTED_MEDIA_TYPE"' \
        "$(fcgi_post /market/admin/coupon/preheat text/plain '{"x":1}')"
    check_match "preheat with an empty urlencoded form: 415" '^Status: 415 ' \
        "$(fcgi_post /market/admin/coupon/preheat application/x-www-form-urlencoded '')"
    check_match "preheat with a multipart form: 415" '^Status: 415 ' \
        "$(fcgi_post /market/admin/coupon/preheat 'multipart/form-data; boundary=x' $'--x--\r\n')"
    check_match "preheat with a JSON type but not a JSON object: 400" '^Status: 400 .*"code":"BAD_REQUEST"' \
        "$(fcgi_post /market/admin/coupon/preheat application/json 'a=1')"
    check_match "preheat with {} as application/json: 200" '"code":"OK"' \
        "$(fcgi_post /market/admin/coupon/preheat 'application/json; charset=utf-8' '{}')"
    check_match "preheat with no body and no Content-Type: 200" '"code":"OK"' \
        "$(fcgi_post /market/admin/coupon/preheat '' '')"
else
    ok "preheat body checks # SKIP cgi-fcgi is not installed"
fi

finish
