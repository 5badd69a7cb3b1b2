#!/usr/bin/env bash
# reconcile.sh - POST /market/admin/coupon/reconcile: after a lowered totalNum
# whose Redis step failed once MySQL had committed (Redis above MySQL), the
# action brings the Redis stock back to MySQL's total minus the users who
# seized, and then no more than the total is ever granted; it is safe while
# seizes run (stock + seize list = total after reconciles under load); it
# refuses while an update's own Redis step may still land, and for unknown,
# revoked and ended activities.
# shellcheck disable=SC2317 # helpers are called through check/wait_for
set -u

# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib.sh"

cs_stack_up --no-sync
ADMIN=$(mint_jwt 1 admin)
REC=/market/admin/coupon/reconcile
seized_of() { rcli HLEN "COUPON:SEIZE:LIST:${1}_{$(($1 % 10))}"; }
jv() { json_get "$HTTP_BODY" "$1" 2>/dev/null; }

A=701 B=703
mk_activity "$A" 20 -60 3600
mk_activity "$B" 3000 -60 3600
# Made a minute ago: a reconcile refuses a row changed within its guard (a
# few seconds), and on a fast machine the whole test runs inside that.
mysql_q "UPDATE activity SET updated_at = NOW() - INTERVAL 60 SECOND WHERE id = $B"
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "preheat" 200 "$HTTP_CODE"

for u in 1 2 3; do
    http POST /market/consumer/coupon/seize "{\"id\":$A}" "$(mint_jwt "$u")"
done
check_eq "three seized: Redis stock 17" 17 "$(stock_of "$A")"

# The state a PUT {"totalNum": 12} leaves when its Redis step fails after the
# commit: MySQL says 12 in all, Redis still sells from 20.
mysql_q "UPDATE activity SET total_num = 12, stock_num = stock_num - 8,
    updated_at = NOW() - INTERVAL 60 SECOND WHERE id = $A"
check_eq "Redis is above MySQL (17 left of 20, MySQL allows 9 more)" 17 "$(stock_of "$A")"

http POST "$REC" "{\"id\":$A}" "$ADMIN"
check_eq "reconcile: 200 OK" "200 OK" "$HTTP_CODE $(jv code)"
check_eq "reconcile: total, seized, Redis before and after" "12 3 17 9" \
    "$(jv totalNum) $(jv seized) $(jv redisBefore) $(jv redisAfter)"
check_eq "Redis stock is MySQL's total minus the seized" 9 "$(stock_of "$A")"
http POST "$REC" "{\"id\":$A}" "$ADMIN"
check_eq "a second reconcile: already in line" "200 9 9 already in line" \
    "$HTTP_CODE $(jv redisBefore) $(jv redisAfter) $(jv msg)"

out=$(seize_load "$A" 4 30 1000)
check_eq "30 more users: exactly 9 more coupons" 9 "$(code_count "$out" SEIZED)"
check_eq "no more granted than MySQL's total" 12 "$(seized_of "$A")"
check_eq "the stock ends at 0" 0 "$(stock_of "$A")"
check_eq "the audit trail names the action and the activity" "reconcile $A 200" \
    "$(mysql_q "SELECT action, activity_id, http_status FROM admin_audit WHERE action = 'reconcile' ORDER BY id LIMIT 1" | tr '\t' ' ')"

# An update committed just now: its Redis step may still be on its way.
mysql_q "UPDATE activity SET updated_at = NOW() + INTERVAL 30 SECOND WHERE id = $A"
http POST "$REC" "{\"id\":$A}" "$ADMIN"
check_eq "right after an update: 503, Retry-After, nothing changed" "503 UNAVAILABLE 0" \
    "$HTTP_CODE $(jv code) $(stock_of "$A")"
check_match "... with Retry-After" $'\n[Rr]etry-[Aa]fter: [0-9]+' "$HTTP_HEADERS"
mysql_q "UPDATE activity SET updated_at = NOW() - INTERVAL 60 SECOND WHERE id = $A"

# While seizes run: every reconcile counts each grant once.
rcli HINCRBY "COUPON:RESOURCE:STOCK:{$((B % 10))}" "$B" 500 >/dev/null # Redis 500 above MySQL
# 2,500 users over two connections: the load outlasts a reconcile on a fast
# machine too, and never sells out what the reconciles bring back in line
# (3,000 in MySQL, 3,500 in Redis); what a reconcile answered otherwise is
# shown.
seize_load_bg "$COUPON_DIR/load.json" "$B" 2 2500 50000
cs_defer stop_bg "$LOAD_PID"
n=0 other=""
while pid_alive "$LOAD_PID" && ((n < 20)); do
    http POST "$REC" "{\"id\":$B}" "$ADMIN"
    if [[ $HTTP_CODE == 200 ]]; then n=$((n + 1)); else other+=" $HTTP_CODE:$(jv code)"; fi
done
[[ -z $other ]] || diag "reconciles not done during the load:$other"
wait "$LOAD_PID"
diag "$n reconciles during the load; $(code_count "$(cat "$COUPON_DIR/load.json")" SEIZED) granted"
check "at least one reconcile ran during the load" test "$n" -ge 1
check_eq "after the load: Redis stock + seize list = MySQL total" 3000 \
    $(($(stock_of "$B") + $(seized_of "$B")))

http POST "$REC" '{"id":999999}' "$ADMIN"
check_eq "unknown activity" "404 NO_SUCH_ACTIVITY" "$HTTP_CODE $(jv code)"
http POST /market/admin/coupon/revoke "{\"id\":$B}" "$ADMIN"
http POST "$REC" "{\"id\":$B}" "$ADMIN"
check_eq "revoked activity" "409 VOIDED" "$HTTP_CODE $(jv code)"
mk_activity 705 10 -7200 -3600
http POST "$REC" '{"id":705}' "$ADMIN"
check_eq "ended activity" "409 ENDED" "$HTTP_CODE $(jv code)"
http POST "$REC" "{\"id\":$A}" "$(mint_jwt 5)"
check_eq "a user token" "403 FORBIDDEN" "$HTTP_CODE $(jv code)"

finish
