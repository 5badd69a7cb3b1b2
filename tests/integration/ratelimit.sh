#!/usr/bin/env bash
# ratelimit.sh - the node token bucket (limits.node_rps, limits.burst) shared
# by all workers: over the rate a seize gets 429 TOO_MANY_REQUESTS with
# Retry-After and touches no stock.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

[[ -x $LOADGEN ]] || skip_all "tests/bench/loadgen is not built (make check builds it)"
export COUPON_CONF_OVERRIDES="limits.node_rps=20
limits.burst=5"
cs_stack_up --no-sync
mk_activity 601 1000000 -60 3600
http POST /market/admin/coupon/preheat '' "$(mint_jwt 1 admin)"
check_eq "preheat" 200 "$HTTP_CODE"
# (No pause before the burst: the bucket holds at most limits.burst, so the
# bound below holds however full it is.)

t0=$(date +%s%3N)
out=$(seize_load 601 16 2000 100000)
t1=$(date +%s%3N)
diag "$out"
ok_n=$(code_count "$out" SEIZED)
limited=$(code_count "$out" TOO_MANY_REQUESTS)
secs=$(((t1 - t0 + 999) / 1000))
check_eq "every request is SEIZED or TOO_MANY_REQUESTS" 2000 "$((ok_n + limited))"
check "most of a burst of 2,000 is refused" test "$limited" -gt 1000
# At most burst + 1 at once, then 20 per second across all workers.
max=$((6 + 20 * secs + 2))
check "SEIZED ($ok_n in ${secs}s) stays within rate x time + burst ($max)" test "$ok_n" -le "$max"
check_eq "the stock went down only for the SEIZED" "$((1000000 - ok_n))" "$(stock_of 601)"
# One client seizing back to back while a load keeps the bucket drained (a
# slow machine must not let it refill between two requests of this test).
tok=$(mint_jwt 9)
seize_load_bg "$COUPON_DIR/drain.json" 601 8 100000 8 -U -D 4
dpid=$LOAD_PID
for _ in $(seq 60); do
    http POST /market/consumer/coupon/seize '{"id":601}' "$tok"
    [[ $HTTP_CODE == 429 ]] && break
done
kill -TERM "$dpid" 2>/dev/null; wait "$dpid" || true
check "the draining load has stopped" test -z "$(pgrep -f -- "-b 8 -j -U -D 4" || true)"
check_eq "back-to-back seizes of one client hit the limit" 429 "$HTTP_CODE"
check_eq "429 carries the stable code" TOO_MANY_REQUESTS "$(json_get "$HTTP_BODY" code)"
check_match "429 carries Retry-After" $'[Rr]etry-[Aa]fter: [1-9]' "$HTTP_HEADERS"
http GET /market/admin/metrics
check_match "the refusals are counted" "couponseize_rate_limited_total [1-9]" "$HTTP_BODY"
# passes TOKEN: a seize of TOKEN gets past the rate limit (polled at 10 a
# second, half the rate, so the polling itself lets the bucket refill).
passes() {
    http POST /market/consumer/coupon/seize '{"id":601}' "$1"
    [[ $(json_get "$HTTP_BODY" code) =~ ^(SEIZED|ALREADY_SEIZED)$ ]]
}
check "once the load has stopped the same user is served again" wait_for 10 passes "$tok"

# Requests that fail authentication or the body checks spend no rate: 200 of
# each, then a real user is still served. The bucket has refilled by then:
# a probe passes, and the flood takes longer than a token's refill.
check "a probe passes before the flood" wait_for 10 passes "$(mint_jwt 8)"
out=$(JWT_SECRET=not-the-secret-not-the-secret-0000 seize_load 601 16 200 5000000 -s not-the-secret-not-the-secret-0000)
check_eq "200 forged tokens are all refused" 200 "$(code_count "$out" UNAUTHORIZED)"
out=$(seize_load 601 16 200 6000000 -d '{"id":"601"}')
check_eq "200 malformed bodies are all refused" 200 "$(code_count "$out" BAD_REQUEST)"
http POST /market/consumer/coupon/seize '{"id":601}' "$(mint_jwt 7000001)"
check_eq "a real user after the flood is served" SEIZED "$(json_get "$HTTP_BODY" code)"

finish
