#!/usr/bin/env bash
# lifecycle_race.sh - the coupon lifecycle under concurrency, through nginx:
# 1,000 concurrent use calls over 100 coupons from 10 orders each (exactly
# one order per coupon wins), and returns on expiry racing a burst of seizes
# for the last coupons (never oversold; total = stock + coupons that count in
# MySQL, and Redis stock + queued + coupons = total, once settled).
# shellcheck disable=SC2317 # helpers are called through check/wait_for
set -u

# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib.sh"

[[ -x $LOADGEN ]] || skip_all "tests/bench/loadgen is not built (make check builds it)"
skip_unless_cmd shuf
export COUPON_CONF_OVERRIDES="sync.status_interval_s=1"
cs_stack_up
ADMIN=$(mint_jwt 1 admin)
WORK=$COUPON_DIR/race
mkdir -p "$WORK"

# --- 1,000 use calls: 100 coupons x 10 orders --------------------------------------
mk_activity 301 100 -60 3600
mk_activity 302 50 -60 3600
mysql_q "UPDATE activity SET return_on_expiry = 1 WHERE id = 302"
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "preheat" 200 "$HTTP_CODE"

out=$(seize_load 301 20 100 10000)
check_eq "100 users seize the 100 coupons" 100 "$(code_count "$out" SEIZED)"
check "coupon-sync writes them" wait_for 30 sql_is "SELECT COUNT(*) FROM coupon WHERE activity_id = 301" 100

mysql_q "SELECT id, user_id FROM coupon WHERE activity_id = 301" |
    awk '{ for (k = 0; k < 10; k++) printf "{\"couponId\":%s,\"userId\":%s,\"orderId\":\"ord-%s-%d\"}\n", $1, $2, $1, k }' |
    shuf >"$WORK/use.bodies"
check_eq "1,000 bodies" 1000 "$(wc -l <"$WORK/use.bodies")"
out=$("$LOADGEN" -p "${COUPON_URL##*:}" -s "$COUPON_JWT_SECRET" -r service \
    -u /market/service/coupon/use -B "$WORK/use.bodies" -c 50 -n 1000 -j)
diag "$out"
check_eq "exactly 100 use calls win" 100 "$(code_count "$out" OK)"
check_eq "the other 900 are ALREADY_USED" 900 "$(code_count "$out" ALREADY_USED)"
check_eq "every coupon is used by one of its own orders" 100 \
    "$(mysql_q "SELECT COUNT(*) FROM coupon WHERE activity_id = 301 AND status = 2 AND order_id LIKE CONCAT('ord-', id, '-_')")"
# The same 1,000 again: each winner's order is answered OK (idempotent), the
# rest ALREADY_USED; nothing changes.
before=$(mysql_q "SELECT GROUP_CONCAT(order_id ORDER BY id) FROM coupon WHERE activity_id = 301")
out=$("$LOADGEN" -p "${COUPON_URL##*:}" -s "$COUPON_JWT_SECRET" -r service \
    -u /market/service/coupon/use -B "$WORK/use.bodies" -c 50 -n 1000 -j)
check_eq "replayed: the 100 winners again OK, 900 ALREADY_USED" "100 900" \
    "$(code_count "$out" OK) $(code_count "$out" ALREADY_USED)"
check_eq "replayed: no coupon changed its order" "$before" \
    "$(mysql_q "SELECT GROUP_CONCAT(order_id ORDER BY id) FROM coupon WHERE activity_id = 301")"

# --- returns on expiry racing seizes of the last coupons -------------------------------
out=$(seize_load 302 20 50 20000)
check_eq "50 users take all 50 coupons" 50 "$(code_count "$out" SEIZED)"
check "coupon-sync writes them" wait_for 30 sql_is "SELECT COUNT(*) FROM coupon WHERE activity_id = 302" 50
check_eq "sold out in Redis" 0 "$(stock_of 302)"

# A burst of new users keeps seizing while 10 coupons expire and come back.
seize_load_bg "$WORK/burst.json" 302 16 1000000 30000 -D 120
cs_defer stop_bg "$LOAD_PID"
mysql_q "UPDATE coupon SET valid_until = NOW(3) - INTERVAL 1 SECOND WHERE activity_id = 302 ORDER BY id LIMIT 10"
http PUT /market/admin/coupon/activity '{"id":302,"addStock":5}' "$ADMIN"
check_eq "a top-up of 5 during the burst" "200 updated" "$HTTP_CODE $(json_get "$HTTP_BODY" redisStock)"
check "the 10 are returned (MySQL and Redis)" wait_for 60 \
    sql_is "SELECT COUNT(*) FROM coupon WHERE activity_id = 302 AND returned = 2" 10
# The burst outlives the returns: wait until the stock they gave back is gone.
sold_again() { [[ $(stock_of 302) == 0 ]]; }
check "the burst takes what came back" wait_for 30 sold_again
kill -TERM "$LOAD_PID" 2>/dev/null
wait "$LOAD_PID"
burst=$(cat "$WORK/burst.json")
diag "$burst"
check_eq "exactly 15 SEIZED in the burst: 10 returned + 5 added (never oversold)" 15 \
    "$(code_count "$burst" SEIZED)"
check_eq "the rest SOLD_OUT" "$(($(json_get "$burst" requests) - 15))" "$(code_count "$burst" SOLD_OUT)"
check "the burst's coupons are written" wait_for 30 \
    sql_is "SELECT COUNT(*) FROM coupon WHERE activity_id = 302" 65
check_eq "MySQL: total 55 = stock_num 0 + 55 coupons that count" "55 0 55" \
    "$(mysql_q "SELECT a.total_num, a.stock_num, (SELECT COUNT(*) FROM coupon c WHERE c.activity_id = a.id AND c.returned = 0) FROM activity a WHERE a.id = 302" | tr '\t' ' ')"
check_eq "Redis: stock 0, nothing queued, 55 users in the seize list" "0 0 55" \
    "$(stock_of 302) $(rcli HKEYS 'QUEUE:COUPON:SEIZE:SYNC:{2}' | grep -c '^302:') $(rcli HLEN 'COUPON:SEIZE:LIST:302_{2}')"
check_eq "no user holds two coupons that count" 0 \
    "$(mysql_q "SELECT COUNT(*) FROM (SELECT user_id FROM coupon WHERE activity_id = 302 AND returned = 0 GROUP BY user_id HAVING COUNT(*) > 1) x")"
# Two rewrites of the metrics file after the rows appeared: a whole tick,
# reconciliation included, ran on the final state before the counter is read.
prom_m() { stat -c %y "$COUPON_DIR/sync.prom" 2>/dev/null; }
prom_moved() { [[ $(prom_m) != "$1" ]]; }
m=$(prom_m)
wait_for 30 prom_moved "$m"
m=$(prom_m)
check "coupon-sync ran a whole tick on the final state" wait_for 30 prom_moved "$m"
check_eq "reconciliation finds no mismatch" 0 \
    "$(sed -n 's/^couponseize_sync_reconcile_mismatches_total \([0-9]*\)/\1/p' "$COUPON_DIR/sync.prom")"

finish
