#!/usr/bin/env bash
# valgrind.sh - coupon-fcgi under valgrind memcheck through every route and
# error path, and coupon-sync draining, dead-lettering and reconciling under
# it too: no invalid access, no uninitialised use, no leak (definitely or
# indirectly lost) in the supervisor, a worker or the daemon.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

skip_unless_cmd valgrind || skip_all "valgrind is not installed"
# An ASan build cannot run under valgrind.
if nm "$top_builddir/coupon-fcgi" 2>/dev/null | grep -q __asan_init; then
    skip_all "coupon-fcgi is built with sanitizers"
fi
export COUPON_WORKERS=2 COUPON_STACK_TIMEOUT=60
# shellcheck disable=SC2016 # expanded by tests/stack
export COUPON_STACK_FCGI_CMD='exec valgrind --quiet --leak-check=full --show-leak-kinds=definite,indirect \
    --errors-for-leak-kinds=definite,indirect --track-origins=yes \
    --log-file="$(dirname "$COUPON_CONF")/valgrind.%p.log" "$top_builddir/coupon-fcgi" -c "$COUPON_CONF"'
cs_stack_up --no-sync
ADMIN=$(mint_jwt 1 admin)
S=/market/consumer/coupon/seize

mk_activity 401 3 -60 3600
mk_activity 402 5 3600 7200
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "preheat under valgrind" 200 "$HTTP_CODE"
for u in 1 2 3 4 5 6; do http POST $S '{"id":401}' "$(mint_jwt $u)"; done
check_eq "sold out under valgrind" SOLD_OUT "$(json_get "$HTTP_BODY" code)"
http POST $S '{"id":402}' "$(mint_jwt 9)"
http POST $S '{"id":499}' "$(mint_jwt 9)"
http POST $S '{"id":"x"}' "$(mint_jwt 9)"
http POST $S 'not json' "$(mint_jwt 9)"
http POST $S '{"id":401}' "$(mint_jwt 9 '' -5)"
http POST $S '{"id":401}' "$(JWT_SECRET=wrong-secret-0123456789abcdefghijkl mint_jwt 9)"
http POST $S '{"id":401}'
http GET $S
http GET /market/nope
http GET /market/consumer/coupon/status
http GET '/market/consumer/coupon/status?id=401' '' "$(mint_jwt 1)"
http GET '/market/consumer/coupon/status?id=abc'
http GET /market/health
http GET /market/admin/metrics
check_match "metrics under valgrind" "couponseize_requests_total" "$HTTP_BODY"
http POST /market/admin/coupon/revoke '{"id":402}' "$ADMIN"
check_eq "revoke under valgrind" 200 "$HTTP_CODE"
http POST $S '{"id":402}' "$(mint_jwt 9)"
# Redis away and back: the breaker and the stale cache paths.
stack stop-redis
for u in 11 12 13 14 15 16 17; do http POST $S '{"id":401}' "$(mint_jwt $u)"; done
http GET /market/consumer/coupon/status
check_eq "stale status under valgrind" true "$(json_get "$HTTP_BODY" stale)"
stack start-redis
health_ok() { [[ $(http_code GET /market/health) == 200 ]]; }
wait_for 20 health_ok
check_eq "health after Redis is back" 200 "$(http_code GET /market/health)"
http POST $S '{"id":401}' "$(mint_jwt 21)"
# The admin activity API: create, top-up, refusals, a page, one. (After the
# Redis outage: a change empties the changing worker's activity cache, as
# preheat and revoke do, and the stale-status check above needs one.)
ACT=/market/admin/coupon/activity
http POST $ACT '{"name":"valgrind sale","totalNum":5,"distributeStartTime":"2026-01-01T00:00:00Z","distributeEndTime":"2037-01-01T00:00:00+08:00","couponAmount":"1.5"}' "$ADMIN"
check_eq "admin create under valgrind" 201 "$HTTP_CODE"
NEW=$(json_get "$HTTP_BODY" idStr)
http PUT $ACT "{\"id\":${NEW:-1},\"addStock\":2}" "$ADMIN"
check_eq "top-up under valgrind" 200 "$HTTP_CODE"
http PUT $ACT "{\"id\":${NEW:-1},\"name\":\"renamed\"}" "$ADMIN"
http POST $ACT '{"name":"x","totalNum":0,"colour":1}' "$ADMIN"
http GET "$ACT?page=1&size=10" '' "$ADMIN"
check_eq "activity page under valgrind" 200 "$HTTP_CODE"
http GET "$ACT?id=${NEW:-1}" '' "$ADMIN"
# The coupon lifecycle: mine, use, release, their refusals, a groups sale.
mysql_q "INSERT INTO coupon (activity_id, user_id, status, valid_until) VALUES (401, 77, 1, NOW(3) + INTERVAL 1 DAY)"
CID=$(mysql_q "SELECT id FROM coupon WHERE user_id = 77")
SVC=$(mint_jwt 8 service)
http GET /market/consumer/coupon/mine '' "$(mint_jwt 77)"
check_eq "mine under valgrind" "200 1" "$HTTP_CODE $(json_get "$HTTP_BODY" total)"
http GET '/market/consumer/coupon/mine?status=used&size=500' '' "$(mint_jwt 77)"
http POST /market/service/coupon/use "{\"couponId\":${CID:-1},\"userId\":77,\"orderId\":\"vg-1\"}" "$SVC"
check_eq "use under valgrind" 200 "$HTTP_CODE"
http POST /market/service/coupon/use "{\"couponId\":${CID:-1},\"userId\":77,\"orderId\":\"vg-2\"}" "$ADMIN"
http POST /market/service/coupon/use '{"couponId":"x","userId":77,"orderId":"vg-2"}' "$SVC"
http POST /market/service/coupon/use '{"couponId":1,"userId":77,"orderId":"v\u0000g"}' "$SVC"
http POST /market/service/coupon/release "{\"couponId\":${CID:-1},\"userId\":77,\"orderId\":\"vg-1\"}" "$SVC"
check_eq "release under valgrind" 200 "$HTTP_CODE"
http POST /market/service/coupon/release "{\"couponId\":${CID:-1},\"userId\":77,\"orderId\":\"vg-1\"}" "$(mint_jwt 77)"
http POST $ACT '{"name":"vip sale","totalNum":5,"distributeStartTime":"2026-01-01T00:00:00Z","distributeEndTime":"2037-01-01T00:00:00Z","eligibleGroups":["vip"],"returnOnExpiry":true}' "$ADMIN"
VIP=$(json_get "$HTTP_BODY" idStr)
http POST $S "{\"id\":${VIP:-1}}" "$(mint_jwt 31)"
check_eq "a seize outside the groups under valgrind" NOT_ELIGIBLE "$(json_get "$HTTP_BODY" code)"
http POST $S "{\"id\":${VIP:-1}}" "$(JWT_EXTRA='"groups":["vip"]' mint_jwt 32)"
check_eq "a seize inside the groups under valgrind" SEIZED "$(json_get "$HTTP_BODY" code)"
# The reserves routes: a lost node's reserve of the revoked sale (a give-back
# adds nothing to its tombstone), listed, returned, refused.
LOST=0123456789abcdef0123456789abcdef
mysql_q "INSERT INTO reserve_epoch (activity_id, incarnation, epoch, amount) VALUES (402, '$LOST', 1, 3)"
rcli HSET 'COUPON:RESERVE:{2}' "402:$LOST" 3 402 1 402:held 3 >/dev/null
rcli HSET 'COUPON:RESERVE:EPOCH:402_{2}' "$LOST:1" open:3 >/dev/null
http GET '/market/admin/coupon/reserves?id=402' '' "$ADMIN"
check_eq "reserves list under valgrind" "200 3" "$HTTP_CODE $(jat "$HTTP_BODY" reserves.0.left)"
http GET /market/admin/coupon/reserves '' "$ADMIN"
# Never seen renewing by this node: refused until its lease has passed by
# this node's clock since the first look (lib/node/lease_watch.h).
http POST /market/admin/coupon/reserve/return "{\"id\":402,\"incarnation\":\"$LOST\"}" "$ADMIN"
check_eq "reserve return under valgrind, first look" 409 "$HTTP_CODE"
returned_lost() {
    http POST /market/admin/coupon/reserve/return "{\"id\":402,\"incarnation\":\"$LOST\"}" "$ADMIN"
    [[ $HTTP_CODE == 200 ]]
}
check "reserve return under valgrind, once the lease passed" wait_for 60 returned_lost
http POST /market/admin/coupon/reserve/return "{\"id\":402,\"incarnation\":\"$LOST\"}" "$ADMIN"
http POST /market/admin/coupon/reserve/return '{"id":402,"incarnation":"x","y":1}' "$ADMIN"
# A rolling reload replaces the workers (they exit, so their leak checks run).
old_workers=$(pgrep -P "$COUPON_FCGI_PID" | sort | tr '\n' ' ')
kill -HUP "$COUPON_FCGI_PID"
# Done when none of the old workers is left and as many new ones serve.
replaced() {
    local p now
    for p in $old_workers; do pid_alive "$p" && return 1; done
    now=$(pgrep -P "$COUPON_FCGI_PID" | wc -l)
    ((now == COUPON_WORKERS)) && [[ $(http_code GET /market/health) == 200 ]]
}
check "the rolling reload under valgrind replaced both workers" wait_for 60 replaced

stack stop-fcgi

# coupon-sync: one full tick (preheat, drain with a dead letter, status job,
# reconciliation) under memcheck; its exit status carries valgrind's verdict.
rcli HSET 'QUEUE:COUPON:SEIZE:SYNC:{1}' 'not-a-field' 1700000000000 >/dev/null
# ... and the coupon job: one plain expiry, one return on expiry.
mysql_q "UPDATE coupon SET valid_until = NOW(3) - INTERVAL 1 SECOND WHERE user_id = 77;
    INSERT INTO coupon (activity_id, user_id, status, valid_until) VALUES (${VIP:-1}, 33, 1, NOW(3) - INTERVAL 1 SECOND);
    UPDATE activity SET stock_num = stock_num - 1 WHERE id = ${VIP:-1}"
valgrind --quiet --leak-check=full --show-leak-kinds=definite,indirect \
    --errors-for-leak-kinds=definite,indirect --error-exitcode=99 \
    --log-file="$COUPON_DIR/valgrind.sync.log" \
    "$top_builddir/coupon-sync" -c "$COUPON_CONF" --once >"$COUPON_DIR/sync-once.log" 2>&1
check_eq "coupon-sync --once under valgrind exits 0" 0 "$?"
check_eq "... and wrote every coupon granted" "$((3 - $(stock_of 401)))" \
    "$(mysql_q 'SELECT COUNT(*) FROM coupon WHERE activity_id = 401 AND user_id <> 77')"
check_match "... and dead-lettered the bad entry" "malformed" \
    "$(rcli HGET 'QUEUE:COUPON:SEIZE:DEAD:{1}' not-a-field)"
check_eq "... and expired one coupon, returned the other" $'3\t0\n3\t2' \
    "$(mysql_q "SELECT status, returned FROM coupon WHERE user_id IN (77, 33) ORDER BY user_id DESC")"

logs=("$COUPON_DIR"/valgrind.*.log)
check "valgrind wrote logs for the supervisor, workers and sync (${#logs[@]})" test "${#logs[@]}" -ge 4
errs=$(cat "${logs[@]}" 2>/dev/null)
if [[ -z $errs ]]; then
    ok "no memcheck error or leak in any process"
else
    not_ok "no memcheck error or leak in any process" "$(head -c 4000 <<<"$errs")"
fi

finish
