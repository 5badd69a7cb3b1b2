#!/usr/bin/env bash
# interop.sh - the service as clients and attackers meet it, checked with tools
# nobody here wrote: tokens minted by PyJWT (RFC 7519 claims, JOSE headers),
# request bodies other JSON readers would read differently, and the workers'
# queue depths in metrics that promtool accepts and that stay current with
# coupon-sync dead.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

# Debian's python3 carries python3-jwt; a python3 earlier on PATH may not.
PY=/usr/bin/python3
[[ -x $PY ]] && $PY -c 'import jwt' 2>/dev/null || skip_all "PyJWT is not installed (python3-jwt)"

export COUPON_CONF_OVERRIDES='auth.audience="coupons"
auth.issuer="https://id.example"
auth.leeway_s=5'
# No coupon-sync: what is queued stays queued, as when the daemon is dead.
cs_stack_up --no-sync

# pyjwt [JSON_CLAIMS_OVERRIDES] [JSON_HEADERS] [ALG]: a token for user 4242 from
# PyJWT, exp = time.time() + 600 (a fractional NumericDate, as PyJWT writes
# it), aud and iss as configured, then the overrides (null removes a claim).
pyjwt() {
    $PY "$top_srcdir/tests/integration/interop_jwt.py" "$COUPON_JWT_SECRET" "${1:-{\}}" "${2:-{\}}" \
        "${3:-HS256}"
}

mk_activity 701 100 -60 3600
mk_activity 702 100 -60 3600
admin=$(pyjwt '{"sub": "1", "role": "admin"}')
http POST /market/admin/coupon/preheat '' "$(mint_jwt 1 admin)"
check_eq "a token without the required aud and iss cannot preheat" 401 "$HTTP_CODE"
http POST /market/admin/coupon/preheat '' "$admin"
check_eq "preheat with a PyJWT admin token" 200 "$HTTP_CODE"

# --- tokens ---------------------------------------------------------------------
# expect CODE WHAT TOKEN: a status?id answer with that token (401 or 200).
expect() {
    http GET '/market/consumer/coupon/status?id=701' '' "$3"
    check_eq "$2: HTTP $1" "$1" "$HTTP_CODE"
    if [[ $1 == 401 ]]; then
        check_eq "$2: code" UNAUTHORIZED "$(json_get "$HTTP_BODY" code)"
    fi
}
tok=$(pyjwt)
check_match "PyJWT writes a fractional exp" '"exp": ?[0-9]+\.[0-9]+' \
    "$($PY -c 'import jwt,sys; print(jwt.decode(sys.argv[1], options={"verify_signature": False}))' "$tok" | tr "'" '"')"
http POST /market/consumer/coupon/seize '{"id":701}' "$tok"
check_eq "PyJWT token with a fractional exp: seize" 200 "$HTTP_CODE"
check_eq "PyJWT token with a fractional exp: SEIZED" SEIZED "$(json_get "$HTTP_BODY" code)"
check_eq "the seize is user 4242's" 1 "$(rcli HEXISTS 'COUPON:SEIZE:LIST:701_{1}' 4242)"
expect 200 "sub as a JSON number" "$(pyjwt '{"sub": 4243}')"
expect 200 "aud as an array holding the audience" "$(pyjwt '{"aud": ["web", "coupons"]}')"
expect 200 "nbf in the past" "$(pyjwt '{"nbf": "now-60"}')"
expect 200 "nbf 2 s ahead, within auth.leeway_s" "$(pyjwt '{"nbf": "now+2"}')"
expect 401 "nbf an hour ahead" "$(pyjwt '{"nbf": "now+3600"}')"
expect 401 "exp 10 s ago (leeway 5)" "$(pyjwt '{"exp": "now-10"}')"
expect 401 "no exp" "$(pyjwt '{"exp": null}')"
expect 401 'alg "hs256" (JOSE names are case-sensitive)' "$(pyjwt '{}' '{}' hs256)"
expect 401 "a crit header" "$(pyjwt '{}' '{"crit": ["exp"]}')"
expect 401 "aud of another service" "$(pyjwt '{"aud": "payments"}')"
expect 401 "aud array without the audience" "$(pyjwt '{"aud": ["payments", "web"]}')"
expect 401 "no aud while one is required" "$(pyjwt '{"aud": null}')"
expect 401 "iss of another issuer" "$(pyjwt '{"iss": "https://evil.example"}')"
expect 401 "no iss while one is required" "$(pyjwt '{"iss": null}')"
http POST /market/consumer/coupon/seize '{"id":702}' "$(pyjwt '{"nbf": "now+3600"}')"
check_eq "a not-yet-valid token seizes nothing" 100 "$(stock_of 702)"

# --- bodies ---------------------------------------------------------------------
tok=$(pyjwt '{"sub": "5151"}')
bad_body() {
    http POST /market/consumer/coupon/seize "$2" "$tok"
    check_eq "$1: 400" 400 "$HTTP_CODE"
    check_eq "$1: BAD_REQUEST" BAD_REQUEST "$(json_get "$HTTP_BODY" code)"
}
bad_body "duplicate id" '{"id":701,"id":702}'
bad_body "escaped name that decodes to id" '{"\u0069d":702,"id":701}'
bad_body "escaped id alone" '{"\u0069\u0064":702}'
bad_body "byte-order mark" $'\xEF\xBB\xBF{"id":702}'
bad_body "lone surrogate" '{"id":702,"n":"\ud800"}'
# What Python's json reads from the same bodies, for the record: another id.
diag "Python reads $($PY -c 'import json; print(json.loads("{\"id\":701,\"id\":702}")["id"])') from {\"id\":701,\"id\":702}"
check_eq "no coupon of 701 went to 5151" 0 "$(rcli HEXISTS 'COUPON:SEIZE:LIST:701_{1}' 5151)"
check_eq "no coupon of 702 went to 5151" 0 "$(rcli HEXISTS 'COUPON:SEIZE:LIST:702_{2}' 5151)"
check_eq "stock of 702 untouched" 100 "$(stock_of 702)"
http POST /market/consumer/coupon/seize '{"name":"caf\u00e9","id":702}' "$tok"
check_eq "one plain id among other members: SEIZED" 200 "$HTTP_CODE"
check_eq "and it is 702" 1 "$(rcli HEXISTS 'COUPON:SEIZE:LIST:702_{2}' 5151)"

# --- queue depths in the workers' metrics ------------------------------------------
# Two seizes above, plus entries as lua/seize.lua writes them.
mk_activities 800 1000
fill_queue 800 30 100000
http POST /market/admin/coupon/preheat '' "$admin"
check_eq "preheat" 200 "$HTTP_CODE"
want3=$(rcli HLEN 'QUEUE:COUPON:SEIZE:SYNC:{3}')
want1=$(rcli HLEN 'QUEUE:COUPON:SEIZE:SYNC:{1}')
http GET /market/admin/metrics
check_eq "metrics: 200" 200 "$HTTP_CODE"
check_match "queue depth of shard 3 is its HLEN ($want3)" \
    "couponseize_queue_depth\{shard=\"3\"\} $want3"$'\n' "$HTTP_BODY"
check_match "queue depth of shard 1 is its HLEN ($want1)" \
    "couponseize_queue_depth\{shard=\"1\"\} $want1"$'\n' "$HTTP_BODY"
check_match "the read is time-stamped" \
    "couponseize_queue_depth_read_timestamp_seconds [0-9]+" "$HTTP_BODY"
if command -v promtool >/dev/null 2>&1; then
    out=$(printf '%s' "$HTTP_BODY" | promtool check metrics 2>&1)
    rc=$?
    check_eq "promtool check metrics accepts the scrape ($out)" 0 "$rc"
else
    not_ok "promtool is not installed (Debian: prometheus)"
fi
# Cached node-wide for a second: a new entry shows up after that, not before
# it is read again.
rcli HSET 'QUEUE:COUPON:SEIZE:SYNC:{3}' '803:999999' 1 >/dev/null
t_add=$(date +%s%3N)
depth_shows() {
    http GET /market/admin/metrics
    [[ $HTTP_BODY =~ couponseize_queue_depth\{shard=\"3\"\}\ $((want3 + 1))$'\n' ]]
}
check "a new queue entry shows once the cached read is a second old" wait_for 10 depth_shows
diag "it showed $(($(date +%s%3N) - t_add)) ms after it was added"
check_eq "seizes still work after the metrics read" 200 \
    "$(http_code POST /market/consumer/coupon/seize '{"id":805}' "$tok")"

finish
