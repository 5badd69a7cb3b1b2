#!/usr/bin/env bash
# skew.sh - a web node whose wall clock is wrong does not turn users away
# from an open sale (found by the nemesis, seed 100: a node restarted 53 s
# behind answered NOT_STARTED to every seize of a sale that had opened).
# The seize script judges the window by Redis' clock; the worker's fast path
# before it must not judge by a clock of its own that disagrees. Two nodes on
# one Redis with reserves on; node 2 is restarted under libfaketime:
#  (a) 300 s behind, on a sale open for a minute: SEIZED, never NOT_STARTED,
#      once its keeper has renewed its lease;
#  (b) 300 s ahead, on a sale open for two more minutes: SEIZED, never ENDED;
#  (c) node 1, with a true clock, still refuses a sale that has not started.
# It also checks that each node connects to Redis from its own address.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

[[ -n $(ls /usr/lib/*/faketime/libfaketimeMT.so.1 2>/dev/null) ]] ||
    skip_all "libfaketime is not installed (Debian: faketime)"
export COUPON_WORKERS=2
export COUPON_CONF_OVERRIDES="fallback.reserve=5
${COUPON_CONF_OVERRIDES:-}"
cs_stack_up --nodes 2
read -r URL1 URL2 <<<"$COUPON_URLS"
ADMIN=$(mint_jwt 1 admin)

# Each node reaches Redis from its own address (redis.source_addr), which is
# what lets the nemesis cut one node off by address.
clients=$(rcli CLIENT LIST)
check_match "node 1 connects to Redis from 127.0.2.1" "addr=127\.0\.2\.1:" "$clients"
check_match "node 2 connects to Redis from 127.0.2.2" "addr=127\.0\.2\.2:" "$clients"

mk_activity 5000 100000 -60 3600
mk_activity 5002 100000 600 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "preheat" 200 "$HTTP_CODE"

# seize_on URL ID USER: sets SEIZE_CODE from one seize.
seize_on() {
    COUPON_URL=$1 http POST /market/consumer/coupon/seize "{\"id\":$2}" "$(mint_jwt "$3")"
    SEIZE_CODE=$(json_get "$HTTP_BODY" code)
}

# skewed_sale OFFSET ID REFUSAL: node 2 restarted OFFSET seconds off; once a
# new user there is SEIZED (its keeper renewed its lease), 20 more are too.
skewed_sale() {
    local off=$1 id=$2 refusal=$3 got="" i codes=""
    local u=$((id * 1000))
    COUPON_FCGI_FAKETIME=$off stack restart-fcgi2
    local deadline=$((SECONDS + 20))
    while ((SECONDS < deadline)); do
        u=$((u + 1))
        seize_on "$URL2" "$id" "$u"
        [[ $SEIZE_CODE == SEIZED ]] && { got=1; break; }
        codes+=" $SEIZE_CODE"
        sleep 0.2
    done
    check "node 2 ($off s) sells sale $id (before: ${codes:-none})" test -n "$got"
    local bad=0
    for ((i = 0; i < 20; i++)); do
        u=$((u + 1))
        seize_on "$URL2" "$id" "$u"
        [[ $SEIZE_CODE == SEIZED ]] || { bad=$((bad + 1)); diag "user $u: $SEIZE_CODE"; }
    done
    check_eq "node 2 ($off s): 20 more users of sale $id SEIZED, none $refusal" 0 "$bad"
}

# --- (a) behind --------------------------------------------------------------------
skewed_sale -300 5000 NOT_STARTED
# --- (b) ahead ---------------------------------------------------------------------
# Made only now: its two minutes are (b)'s own, however long (a) took on a
# loaded machine (a sale made at the start had really ended by then).
mk_activity 5001 100000 -60 120
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "preheat of sale 5001" 200 "$HTTP_CODE"
skewed_sale +300 5001 ENDED
# --- (c) the fast path still refuses what is not open --------------------------------
seize_on "$URL1" 5002 77
check_eq "node 1: a sale that starts in 10 minutes is NOT_STARTED" NOT_STARTED "$SEIZE_CODE"
seize_on "$URL2" 5002 78
check_eq "node 2 (300 s ahead): a sale that starts in 10 minutes is NOT_STARTED" NOT_STARTED "$SEIZE_CODE"
stack restart-fcgi2
finish
