#!/usr/bin/env bash
# lua_peer.sh - the benchmarks' nginx + ngx_lua seize peer
# (tests/bench/peers/nginx-lua) answers as coupon-fcgi does: SEIZED with the
# stock left, then ALREADY_SEIZED for the same user, 401 for a forged,
# expired or missing token, 400 for a bad body, NO_SUCH_ACTIVITY and
# SOLD_OUT from the script, and it runs the script again after a SCRIPT
# FLUSH (NOSCRIPT). A bare redis-server with the fields preheat writes; no
# MariaDB. Skips (77) when nginx's Lua module is not installed.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib.sh"

PEER=$top_srcdir/tests/bench/peers/nginx-lua
[[ -f /usr/lib/nginx/modules/ngx_http_lua_module.so ]] ||
    skip_all "nginx's Lua module is not installed (Debian: libnginx-mod-http-lua lua-resty-core lua-cjson)"
command -v redis-server >/dev/null 2>&1 || skip_all "redis-server is not installed"

D=$(mktemp -d "${TMPDIR:-/tmp}/couponseize-luapeer.XXXXXX")
REDIS_HOST=127.0.0.1
REDIS_PORT=$(free_port)
PORT=$(free_port)
RPID="" NPID=""
# shellcheck disable=SC2317 # run by the EXIT trap
stop() {
    [[ -n $NPID ]] && kill "$NPID" 2>/dev/null
    [[ -n $RPID ]] && kill "$RPID" 2>/dev/null
    wait 2>/dev/null
    rm -rf "$D"
}
trap stop EXIT
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$D" \
    >"$D/redis.log" 2>&1 &
RPID=$!
wait_for 10 redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 || { echo "redis did not start" >&2; exit 99; }
rcli() { redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" "$@"; }

export COUPON_JWT_SECRET=lua-peer-test-secret REDIS_HOST REDIS_PORT
export COUPON_SCRIPT=$D/seize.lua COUPON_URL=http://127.0.0.1:$PORT
lua_text seize >"$COUPON_SCRIPT"
setsid "$PEER" "$D/nginx" "$PORT" 1 2>"$D/peer.log" &
NPID=$!
if ! wait_for 10 curl -s -o /dev/null "$COUPON_URL/"; then
    wait "$NPID"
    rc=$?
    ((rc == 77)) && skip_all "$(cat "$D/peer.log")"
    cat "$D/peer.log" "$D/nginx/error.log" >&2
    exit 99
fi

# Activity 21 in stock (3 coupons), 31 sold out, both open since a minute ago.
now=$(($(date +%s) * 1000))
rcli HSET 'COUPON:ACTIVITY:WINDOW:{1}' 21 "$((now - 60000)),$((now + 3600000))" \
    31 "$((now - 60000)),$((now + 3600000))" >/dev/null
rcli HSET 'COUPON:RESOURCE:STOCK:{1}' 21 3 31 0 >/dev/null

SEIZE=/market/consumer/coupon/seize
tok=$(mint_jwt 7001)
http POST $SEIZE '{"id":21}' "$tok"
check_eq "a seize in stock: 200" 200 "$HTTP_CODE"
check_eq "a seize in stock: SEIZED and the stock left" \
    '{"code":"SEIZED","msg":"you got a coupon","activityId":21,"remaining":2}' "$HTTP_BODY"
check_match "the answer is JSON" 'Content-Type: application/json; charset=utf-8' "$HTTP_HEADERS"
http POST $SEIZE '{"id":21}' "$tok"
check_eq "the same user again: 409" 409 "$HTTP_CODE"
check_match "the same user again: ALREADY_SEIZED" '"code":"ALREADY_SEIZED"' "$HTTP_BODY"
check_eq "one entry in the seize list and the queue" "1 1" \
    "$(rcli HLEN 'COUPON:SEIZE:LIST:21_{1}') $(rcli HEXISTS 'QUEUE:COUPON:SEIZE:SYNC:{1}' 21:7001)"

http POST $SEIZE '{"id":21}' "$(JWT_SECRET=not-the-secret mint_jwt 7002)"
check_eq "a forged token: 401" 401 "$HTTP_CODE"
check_match "a forged token: UNAUTHORIZED" '"code":"UNAUTHORIZED"' "$HTTP_BODY"
http POST $SEIZE '{"id":21}' "$(mint_jwt 7002 '' -10)"
check_eq "an expired token: 401" 401 "$HTTP_CODE"
http POST $SEIZE '{"id":21}' "$(JWT_EXTRA="\"nbf\":$(($(date +%s) + 600))" mint_jwt 7002)"
check_eq "a token not valid yet (nbf): 401" 401 "$HTTP_CODE"
http POST $SEIZE '{"id":21}' "$(mint_jwt 7002 '' none)"
check_eq "a token without exp: 401" 401 "$HTTP_CODE"
http POST $SEIZE '{"id":21}' "$(JWT_ALG=HS384 mint_jwt 7002)"
check_eq "an HS384 token: 401" 401 "$HTTP_CODE"
http POST $SEIZE '{"id":21}'
check_eq "no token: 401" 401 "$HTTP_CODE"
http POST $SEIZE '{"id":21}' "$(mint_jwt 07002)"
check_eq "a sub with a leading zero: 401" 401 "$HTTP_CODE"
check_eq "no seize by a refused token" 1 "$(rcli HLEN 'COUPON:SEIZE:LIST:21_{1}')"

http POST $SEIZE '{"id":"21"}' "$(mint_jwt 7003)"
check_eq "an id that is a string: 400" 400 "$HTTP_CODE"
http GET $SEIZE '' "$(mint_jwt 7003)"
check_eq "GET: 405" 405 "$HTTP_CODE"
http POST $SEIZE '{"id":41}' "$(mint_jwt 7003)"
check_match "an activity not preheated: NO_SUCH_ACTIVITY" '^404 .*"code":"NO_SUCH_ACTIVITY"' \
    "$HTTP_CODE $HTTP_BODY"
http POST $SEIZE '{"id":31}' "$(mint_jwt 7003)"
check_match "no stock: SOLD_OUT" '^409 .*"code":"SOLD_OUT"' "$HTTP_CODE $HTTP_BODY"

rcli SCRIPT FLUSH >/dev/null
http POST $SEIZE '{"id":21}' "$(mint_jwt 7004)"
check_match "after SCRIPT FLUSH: SEIZED (EVAL on NOSCRIPT)" '^200 .*"remaining":1' "$HTTP_CODE $HTTP_BODY"
check_eq "nothing in the peer's error log" "" "$(grep -v '\[notice\]' "$D/nginx/error.log" 2>/dev/null)"
finish
