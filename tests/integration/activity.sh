#!/usr/bin/env bash
# activity.sh - preheat, status, lifecycle, revoke and restore after Redis
# data loss, against the real stack.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

[[ -x $LOADGEN ]] || skip_all "tests/bench/loadgen is not built (make check builds it)"
export COUPON_CONF_OVERRIDES="sync.status_interval_s=1
preheat.interval_s=3600"
cs_stack_up
ADMIN=$(mint_jwt 1 admin)
SEIZE=/market/consumer/coupon/seize

seize_code() { http POST "$SEIZE" "{\"id\":$1}" "$(mint_jwt "$2")"; json_get "$HTTP_BODY" code; }
status_of() {
    http GET "/market/consumer/coupon/status?id=$1"
    json_get "$(json_get "$HTTP_BODY" activity)" status
}
preheat() { http POST /market/admin/coupon/preheat '' "$ADMIN"; }
queued_for() { rcli HKEYS "QUEUE:COUPON:SEIZE:SYNC:{$(($1 % 10))}" | grep -c "^$1:"; }

# --- admin routes: 401 without a token, 403 with a user token ---------------------
check_eq "preheat without a token -> 401" 401 "$(http_code POST /market/admin/coupon/preheat)"
check_eq "preheat with a user token -> 403" 403 "$(http_code POST /market/admin/coupon/preheat '' "$(mint_jwt 5)")"
check_eq "revoke with a user token -> 403" 403 "$(http_code POST /market/admin/coupon/revoke '{"id":1}' "$(mint_jwt 5)")"
check_eq "revoke without a token -> 401" 401 "$(http_code POST /market/admin/coupon/revoke '{"id":1}')"

# --- lifecycle ---------------------------------------------------------------
mk_activity 201 1000 -60 3600       # in progress
mk_activity 202 10 3600 7200        # starts in an hour
mk_activity 204 10 -60 3600         # to be revoked
mk_activity 205 10 -200000 -100000 # ended over a day ago: not preheated
mk_activity 207 10 -60 3600 1       # on sale, but still status 1 in MySQL
# Ends in 8 s: made last, so that the preheat surely sees it on sale even on a
# busy machine; its end is then awaited by the clock (wait_past_ms).
mk_activity 203 10 -60 8
preheat
check_eq "preheat answers 200" 200 "$HTTP_CODE"
check_eq "preheat loads the live and upcoming activities" 5 "$(json_get "$HTTP_BODY" loaded)"
check_eq "ACTIVITY:LIST holds them" "201 202 203 204 207" \
    "$(rcli GET ACTIVITY:LIST | python3 -c 'import json,sys; print(" ".join(str(a["id"]) for a in sorted(json.load(sys.stdin), key=lambda a: a["id"])))')"
check_eq "stock field set from total_num" 1000 "$(stock_of 201)"

check_eq "seize before start -> NOT_STARTED" NOT_STARTED "$(seize_code 202 11)"
check_eq "status shows NOT_STARTED" NOT_STARTED "$(status_of 202)"
check_eq "seize in progress -> SEIZED" SEIZED "$(seize_code 201 11)"
check_eq "status shows IN_PROGRESS" IN_PROGRESS "$(status_of 201)"
http GET "/market/consumer/coupon/status?id=201"
check_eq "status remaining is live" 999 "$(json_get "$(json_get "$HTTP_BODY" activity)" remaining)"
check_eq "unknown id -> NO_SUCH_ACTIVITY" NO_SUCH_ACTIVITY "$(seize_code 299 11)"
check_eq "status with an empty id -> 400" 400 "$(http_code GET '/market/consumer/coupon/status?id=')"
check_eq "status with a bad id -> 400" 400 "$(http_code GET '/market/consumer/coupon/status?id=1e3')"
check_eq "status of an unknown id -> 404" 404 "$(http_code GET '/market/consumer/coupon/status?id=299')"
check_eq "never-preheated ended activity -> NO_SUCH_ACTIVITY" NO_SUCH_ACTIVITY "$(seize_code 205 11)"

http GET "/market/consumer/coupon/status?id=201" '' "$(mint_jwt 11)"
mine=$(json_get "$HTTP_BODY" mine)
check_eq "mine: seized" true "$(json_get "$mine" seized)"
http GET /market/consumer/coupon/status
check_eq "status lists every preheated activity" 5 \
    "$(json_get "$HTTP_BODY" activities | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')"

# mine.persisted turns true once coupon-sync has written the row.
wait_for 15 sql_is "SELECT COUNT(*) FROM coupon WHERE activity_id=201 AND user_id=11" 1
http GET "/market/consumer/coupon/status?id=201" '' "$(mint_jwt 11)"
check_eq "mine: persisted after sync" true "$(json_get "$(json_get "$HTTP_BODY" mine)" persisted)"

wait_past_ms "$(end_ms 203)"
check_eq "seize after the end -> ENDED" ENDED "$(seize_code 203 11)"
check_eq "status shows ENDED" ENDED "$(status_of 203)"
preheat
check_eq "an activity that just ended still answers ENDED after the next preheat" ENDED "$(seize_code 203 12)"
wait_for 15 sql_is "SELECT status FROM activity WHERE id=203" 3
check_eq "status job moved the ended activity to 3" 3 "$(mysql_q 'SELECT status FROM activity WHERE id=203')"
wait_for 15 sql_is "SELECT status FROM activity WHERE id=207" 2
check_eq "status job moved the started activity from 1 to 2" 2 "$(mysql_q 'SELECT status FROM activity WHERE id=207')"

# --- revoke ----------------------------------------------------------------
check_eq "seize before revoke" SEIZED "$(seize_code 204 21)"
http POST /market/admin/coupon/revoke '{"id":204}' "$ADMIN"
check_eq "revoke answers 200" 200 "$HTTP_CODE"
for u in 22 23 24 25 26 27 28 29; do # reaches every worker
    c=$(seize_code 204 $u)
    [[ $c == VOIDED ]] || break
done
check_eq "every seize after revoke -> VOIDED" VOIDED "$c"
check_eq "status shows VOIDED" VOIDED "$(status_of 204)"
check_eq "revoked activity is status 4 in MySQL" 4 "$(mysql_q 'SELECT status FROM activity WHERE id=204')"
check_eq "revoked activity left ACTIVITY:LIST" "" "$(rcli GET ACTIVITY:LIST | python3 -c 'import json,sys; print(" ".join(str(a["id"]) for a in json.load(sys.stdin) if a["id"] == 204))')"
check_eq "the revoked stock field holds a tombstone" -1 "$(stock_of 204)"
preheat
check_eq "a later preheat does not bring the stock back" -1 "$(stock_of 204)"
check_eq "... and seizes stay VOIDED" VOIDED "$(seize_code 204 30)"
http POST /market/admin/coupon/revoke '{"id":204}' "$ADMIN"
check_eq "revoke is idempotent" 200 "$HTTP_CODE"
check_eq "revoke of an unknown activity -> 404" 404 "$(http_code POST /market/admin/coupon/revoke '{"id":298}' "$ADMIN")"
wait_for 15 sql_is "SELECT COUNT(*) FROM coupon WHERE activity_id=204" 1
check_eq "the coupon seized before the revoke is voided" 4 "$(mysql_q 'SELECT status FROM coupon WHERE activity_id=204')"

# --- ids past 2^53 stay exact ----------------------------------------------------
BIG=9007199254740993 # 2^53 + 1: a double would make it ...992
mk_activity "$BIG" 5 -60 3600
preheat
check_eq "an id past 2^53 can be seized" SEIZED "$(seize_code "$BIG" 11)"
http GET "/market/consumer/coupon/status?id=$BIG"
check_eq "its status carries the exact id" "$BIG" "$(json_get "$(json_get "$HTTP_BODY" activity)" idStr)"
check_match "... also as a JSON number" "\"id\":${BIG}[,}]" "$HTTP_BODY"
check_eq "its neighbour below is unknown" NO_SUCH_ACTIVITY "$(seize_code $((BIG - 1)) 11)"

# --- preheat in the middle of a sale never resets the stock ----------------------
seize_load 201 32 300 100000 >/dev/null
before=$(stock_of 201)
for _ in 1 2 3; do preheat; done
check_eq "three preheats mid-sale leave the stock alone" "$before" "$(stock_of 201)"
check_eq "... and create nothing" 0 "$(json_get "$HTTP_BODY" created)"

# --- restore after Redis data loss -------------------------------------------------
mk_activity 206 200 -60 3600
preheat
out=$(seize_load 206 32 150 600000)
check_eq "150 seized before the loss" 150 "$(code_count "$out" SEIZED)"
wait_for 20 sql_is "SELECT COUNT(*) FROM coupon WHERE activity_id=206" 150
check_eq "150 coupons in MySQL" 150 "$(mysql_q 'SELECT COUNT(*) FROM coupon WHERE activity_id=206')"
wait_for 10 bash -c "[[ \$(redis-cli -h $REDIS_HOST -p $REDIS_PORT HKEYS 'QUEUE:COUPON:SEIZE:SYNC:{6}' | grep -c '^206:') == 0 ]]"
wait_for 20 sql_is "SELECT COUNT(*) FROM coupon WHERE activity_id=$BIG" 1
stack stop-sync
rcli FLUSHALL >/dev/null
preheat
# 201, $BIG and 206 had coupons in MySQL; 202 had none (created, not restored).
check_eq "preheat after the loss restores the three activities with coupons" 3 "$(json_get "$HTTP_BODY" restored)"
check_eq "restored stock = 200 - 150" 50 "$(stock_of 206)"
out=$(seize_load 206 32 150 600000)
check_eq "the 150 earlier users get ALREADY_SEIZED" 150 "$(code_count "$out" ALREADY_SEIZED)"
out=$(seize_load 206 64 2000 700000)
check_eq "a flood of new users gets exactly 50 SEIZED" 50 "$(code_count "$out" SEIZED)"
check_eq "... and the rest SOLD_OUT" 1950 "$(code_count "$out" SOLD_OUT)"
stack start-sync
wait_for 20 sql_is "SELECT COUNT(*) FROM coupon WHERE activity_id=206" 200
check_eq "MySQL ends with exactly 200 coupons" 200 "$(mysql_q 'SELECT COUNT(*) FROM coupon WHERE activity_id=206')"
check_eq "invariant total = stock + coupons holds for every activity" "" \
    "$(mysql_q 'SELECT a.id FROM activity a LEFT JOIN coupon c ON c.activity_id = a.id GROUP BY a.id HAVING MAX(a.total_num) <> MAX(a.stock_num) + COUNT(c.id)')"


# --- a Redis that is slow once: status?id still answers within its budget --------------
# CLIENT PAUSE holds every command for 300 ms, longer than a command's own
# timeout (redis.command_timeout_ms, 200): the first read of a cold cache
# times out, the second, on a fresh connection, is answered; the budget
# (fallback.budget_ms, 1000) has room for both. UNAVAILABLE would claim that
# Redis is away.
mk_activity 208 10 -60 3600
preheat # every worker's cache is dropped: the lookup below reads Redis
rcli CLIENT PAUSE 300 ALL >/dev/null
http GET "/market/consumer/coupon/status?id=208"
check_eq "status?id during a 300 ms stall answers with the activity, fresh" "200 IN_PROGRESS false" \
    "$HTTP_CODE $(jat "$HTTP_BODY" activity.status) $(jat "$HTTP_BODY" stale)"
finish
