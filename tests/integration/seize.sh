#!/usr/bin/env bash
# seize.sh - the seize route through nginx against the real stack: exact
# stock under concurrency, one coupon per user, the bad-input matrix, and a
# worker killed under load.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

[[ -x $LOADGEN ]] || skip_all "tests/bench/loadgen is not built (make check builds it)"
cs_stack_up --no-sync
ADMIN=$(mint_jwt 1 admin)
SEIZE=/market/consumer/coupon/seize


mk_activity 101 200 -60 3600
mk_activity 102 100000 -60 3600
mk_activity 103 50 -60 3600
mk_activity 104 300 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "preheat answers 200" 200 "$HTTP_CODE"
check_eq "four activities created in Redis" 4 "$(json_get "$HTTP_BODY" created)"

# --- 2,000 distinct users, 64 at a time, stock 200 -------------------------------
out=$(seize_load 101 64 2000 500000)
diag "$out"
check_eq "2,000 users: exactly 200 SEIZED" 200 "$(code_count "$out" SEIZED)"
check_eq "2,000 users: exactly 1,800 SOLD_OUT" 1800 "$(code_count "$out" SOLD_OUT)"
check_eq "Redis stock is 0" 0 "$(stock_of 101)"
check_eq "200 distinct users in the seize list" 200 "$(rcli HLEN 'COUPON:SEIZE:LIST:101_{1}')"
queued=$(rcli HKEYS 'QUEUE:COUPON:SEIZE:SYNC:{1}' | grep -c '^101:')
check_eq "200 entries queued for MySQL" 200 "$queued"
users=$(rcli HKEYS 'QUEUE:COUPON:SEIZE:SYNC:{1}' | grep '^101:' | cut -d: -f2 | sort -u | wc -l)
check_eq "the queued entries are 200 distinct users" 200 "$users"

# --- one user, 100 requests in parallel ------------------------------------------
out=$(seize_load 102 50 100 777 -U)
diag "$out"
check_eq "one user x100: exactly one SEIZED" 1 "$(code_count "$out" SEIZED)"
check_eq "one user x100: 99 ALREADY_SEIZED" 99 "$(code_count "$out" ALREADY_SEIZED)"
check_eq "one user x100: stock down by one" 99999 "$(stock_of 102)"

# --- bad input: clear 4xx with a stable code, never a stock change -----------------
before=$(stock_of 103)
USER=$(mint_jwt 4242)
# expect NAME STATUS CODE curl-args...
expect() {
    local name=$1 status=$2 code=$3 out got_code
    shift 3
    out=$(curl -s --max-time 10 -w '\n%{http_code}' "$@")
    got_code=$(json_get "${out%$'\n'*}" code 2>/dev/null)
    check_eq "$name -> $status $code" "$status $code" "${out##*$'\n'} $got_code"
}
J=(-H 'Content-Type: application/json')
A=(-H "Authorization: Bearer $USER")
U=$COUPON_URL$SEIZE
expect "no body" 400 BAD_REQUEST -X POST "${A[@]}" "${J[@]}" "$U"
expect "non-JSON" 400 BAD_REQUEST "${A[@]}" "${J[@]}" --data-binary 'id=103' "$U"
expect "id as string" 400 BAD_REQUEST "${A[@]}" "${J[@]}" --data-binary '{"id":"103"}' "$U"
expect "id 1.5" 400 BAD_REQUEST "${A[@]}" "${J[@]}" --data-binary '{"id":1.5}' "$U"
expect "id -1" 400 BAD_REQUEST "${A[@]}" "${J[@]}" --data-binary '{"id":-1}' "$U"
expect "id 0" 400 BAD_REQUEST "${A[@]}" "${J[@]}" --data-binary '{"id":0}' "$U"
expect "id 1e3" 400 BAD_REQUEST "${A[@]}" "${J[@]}" --data-binary '{"id":1e3}' "$U"
expect "id 2^63" 400 BAD_REQUEST "${A[@]}" "${J[@]}" --data-binary '{"id":9223372036854775808}' "$U"
expect "missing id" 400 BAD_REQUEST "${A[@]}" "${J[@]}" --data-binary '{"ids":103}' "$U"
big=$COUPON_DIR/big.json
head -c $((1024 * 1024)) /dev/zero | tr '\0' ' ' >"$big"
expect "1 MiB body" 413 TOO_LARGE "${A[@]}" "${J[@]}" --data-binary "@$big" "$U"
expect "2 KiB body" 413 TOO_LARGE "${A[@]}" "${J[@]}" --data-binary "{\"id\":103,\"pad\":\"$(head -c 2048 /dev/zero | tr '\0' x)\"}" "$U"
expect "wrong content type" 415 UNSUPPORTED_MEDIA_TYPE "${A[@]}" -H 'Content-Type: text/plain' --data-binary '{"id":103}' "$U"
expect "form content type" 415 UNSUPPORTED_MEDIA_TYPE "${A[@]}" --data-binary '{"id":103}' "$U"
expect "GET on seize" 405 METHOD_NOT_ALLOWED "${A[@]}" "$U"
expect "unknown route" 404 NOT_FOUND "${A[@]}" "$COUPON_URL/market/consumer/coupon/nope"
expect "missing token" 401 UNAUTHORIZED "${J[@]}" --data-binary '{"id":103}' "$U"
expect "forged signature" 401 UNAUTHORIZED -H "Authorization: Bearer $(JWT_SECRET=not-the-secret-0123456789abcdefghij mint_jwt 4242)" "${J[@]}" --data-binary '{"id":103}' "$U"
none_tok=$(printf '{"alg":"none","typ":"JWT"}' | b64url).$(printf '{"sub":"4242","exp":%d}' $(($(date +%s) + 600)) | b64url).
expect "alg:none token" 401 UNAUTHORIZED -H "Authorization: Bearer $none_tok" "${J[@]}" --data-binary '{"id":103}' "$U"
expect "alg:HS512 header" 401 UNAUTHORIZED -H "Authorization: Bearer $(JWT_ALG=HS512 mint_jwt 4242)" "${J[@]}" --data-binary '{"id":103}' "$U"
expect "expired token" 401 UNAUTHORIZED -H "Authorization: Bearer $(mint_jwt 4242 '' -10)" "${J[@]}" --data-binary '{"id":103}' "$U"
expect "token without exp" 401 UNAUTHORIZED -H "Authorization: Bearer $(mint_jwt 4242 '' none)" "${J[@]}" --data-binary '{"id":103}' "$U"
expect "sub not a number" 401 UNAUTHORIZED -H "Authorization: Bearer $(mint_jwt alice)" "${J[@]}" --data-binary '{"id":103}' "$U"
expect "Basic auth" 401 UNAUTHORIZED -H 'Authorization: Basic YTpi' "${J[@]}" --data-binary '{"id":103}' "$U"
expect "unknown activity" 404 NO_SUCH_ACTIVITY "${A[@]}" "${J[@]}" --data-binary '{"id":999999}' "$U"
expect "admin route with a user token" 403 FORBIDDEN -X POST "${A[@]}" "$COUPON_URL/market/admin/coupon/preheat"
http GET "$SEIZE" '' "$USER"
check_match "405 names the allowed method" $'[Aa]llow: POST' "$HTTP_HEADERS"
check_eq "bad input left the stock alone" "$before" "$(stock_of 103)"
check_eq "bad input queued nothing" 0 "$(rcli HKEYS 'QUEUE:COUPON:SEIZE:SYNC:{3}' | grep -c '^103:')"
expect "a good request still works" 200 SEIZED "${A[@]}" "${J[@]}" --data-binary '{"id":103}' "$U"

# --- kill -9 of a worker under load -------------------------------------------------
workers_before=$(pgrep -P "$COUPON_FCGI_PID" | sort)
seize_load_bg "$COUPON_DIR/kill.json" 104 64 6000 900000
lpid=$LOAD_PID
# The kill must land while the load runs: wait until it has taken stock (not
# for a fixed while, which a busy machine outlasts before loadgen even starts).
load_under_way() { (($(stock_of 104) < 300)); }
wait_for 30 load_under_way
victim=$(pgrep -P "$COUPON_FCGI_PID" | head -n 1)
check "the load is running when a worker is killed" pid_alive "$lpid"
kill -9 "$victim"
wait "$lpid"
out=$(cat "$COUPON_DIR/kill.json")
diag "$out"
seized=$(code_count "$out" SEIZED)
check_eq "after kill -9: Redis stock is 0" 0 "$(stock_of 104)"
check_eq "after kill -9: exactly 300 users hold a coupon" 300 "$(rcli HLEN 'COUPON:SEIZE:LIST:104_{4}')"
check_eq "after kill -9: 300 entries queued" 300 "$(rcli HKEYS 'QUEUE:COUPON:SEIZE:SYNC:{4}' | grep -c '^104:')"
if ((seized <= 300 && seized >= 299)); then
    ok "after kill -9: $seized SEIZED replies (300, or 299 if the victim died between grant and reply)"
else
    not_ok "after kill -9: SEIZED replies within stock" "got $seized"
fi
wait_for 5 bash -c "[[ \$(pgrep -P $COUPON_FCGI_PID | wc -l) -eq $(wc -l <<<"$workers_before") ]]"
check_eq "the supervisor replaced the killed worker" "$(wc -l <<<"$workers_before")" "$(pgrep -P "$COUPON_FCGI_PID" | wc -l)"
check "the supervisor logged why the worker died" \
    wait_for 10 grep -q "killed by signal 9" "$COUPON_DIR/fcgi.log"
check_eq "health still 200" 200 "$(http_code GET /market/health)"

finish
