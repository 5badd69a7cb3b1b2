#!/usr/bin/env bash
# rywrites.sh - read your writes: after an admin create / update / top-up /
# revoke has answered, `status` (the list and ?id) shows the change at once on
# the node that served it, and within cache.refresh_ms on another node, with
# the periodic preheat out of the picture (preheat.interval_s = 3600), so no
# timing can hide a change that only the next full preheat would publish.
# shellcheck disable=SC2317 # helpers are called through check/wait_for
set -u

# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib.sh"

REFRESH=1000
export COUPON_CONF_OVERRIDES="preheat.interval_s=3600
cache.refresh_ms=$REFRESH"
skip_unless_cmd cgi-fcgi || skip_all "cgi-fcgi is not installed (Debian libfcgi-bin)"
cs_stack_up

ACT=/market/admin/coupon/activity
ADMIN=$(mint_jwt 77 admin)


# names JSON: the names of a status list answer, comma-separated.
names() { testkit json-pluck --sep , "$1" activities name 2>/dev/null || echo "<not a list answer>"; }


# judge BODY WANT PATH...: "ok" when the status answer BODY shows WANT (the
# values at PATH..., space-separated); "unsure" when it says it could not
# read Redis (UNAVAILABLE, or "stale": true: what a loaded machine may give,
# doc/api.md "Read your writes"); otherwise "old[what it showed]". A change
# that has answered is never shown old by an answer that claims to be fresh.
judge() { checker fresh "$@"; }
# tally VERDICT...: sets BAD (the old answers) and SURE (how many were ok).
tally() {
    BAD="" SURE=0 UNSURE=0
    local v
    for v in "$@"; do
        case $v in
        ok) SURE=$((SURE + 1)) ;;
        unsure) UNSURE=$((UNSURE + 1)) ;;
        *) BAD+=" $v" ;;
        esac
    done
    ((UNSURE == 0)) || diag "$UNSURE answers said they could not read Redis"
    ((SURE > 0)) || BAD+=" [no answer was sure]"
}

create() {
    http POST "$ACT" "{\"name\":\"$1\",\"totalNum\":$2,\"distributeStartTime\":\"$(iso "$3")\",\"distributeEndTime\":\"$(iso "$4")\",\"validityDays\":7}" "$ADMIN"
}

# The stack's first preheat ran at start-up; the next is an hour away.
check_eq "coupon-sync's periodic preheat is an hour apart" 3600 \
    "$(sed -n 's/^ *interval_s = \([0-9]*\);.*/\1/p' "$COUPON_CONF" | sort -n | tail -n1)"

# A second node: its own coupon-fcgi and shared memory on the same Redis and
# MySQL, spoken to over FastCGI.
N2=$COUPON_DIR/node2
mkdir -p "$N2"
sed -e "s|^\( *listen = \).*|\1\"$N2/fcgi.sock\";|" -e "s|^\( *workers = \).*|\12;|" \
    -e "s|^\( *shm_name = \).*|\1\"/couponseize-rw2-$$\";|" "$COUPON_CONF" >"$N2/couponseize.conf"
"$top_builddir/coupon-fcgi" -c "$N2/couponseize.conf" >"$N2/fcgi.log" 2>&1 </dev/null &
N2_PID=$!
stop_node2() {
    kill -TERM "$N2_PID" 2>/dev/null
    wait "$N2_PID" 2>/dev/null
    rm -f "/dev/shm/couponseize-rw2-$$"*
}
cs_defer stop_node2
wait_for 20 test -S "$N2/fcgi.sock" || not_ok "node 2 starts" "$(tail -n 5 "$N2/fcgi.log")"

# n2_get PATH_AND_QUERY: node 2's answer body to a GET.
n2_get() {
    local path=${1%%\?*} query=""
    [[ $1 == *\?* ]] && query=${1#*\?}
    env -i REQUEST_METHOD=GET REQUEST_URI="$1" SCRIPT_NAME="$path" QUERY_STRING="$query" \
        SERVER_PROTOCOL=HTTP/1.1 GATEWAY_INTERFACE=CGI/1.1 REMOTE_ADDR=127.0.0.1 \
        SERVER_NAME=localhost timeout 10 cgi-fcgi -bind -connect "$N2/fcgi.sock" 2>/dev/null |
        sed '1,/^\r\{0,1\}$/d'
}
n2_lists() { [[ ,$(names "$(n2_get /market/consumer/coupon/status)"), == *",$1,"* ]]; }
n2_lacks() { [[ ,$(names "$(n2_get /market/consumer/coupon/status)"), != *",$1,"* ]]; }

# Both nodes have their list copy before the changes, so "at once" is
# measured against a warm copy, not a first read.
http GET /market/consumer/coupon/status
check_eq "node 1 lists nothing yet" "" "$(names "$HTTP_BODY")"
check_eq "node 2 lists nothing yet" "" "$(names "$(n2_get /market/consumer/coupon/status)")"

# after T0 MS: returns once MS milliseconds have passed since T0 (date +%s%3N).
# A request sent after that must show the change on node 2: each of its
# workers re-reads a cached entry, and the node its list copy, in the request
# that finds them cache.refresh_ms old, so a slow test client can only send
# later, never make the check pass or fail on its own.
after() {
    local left=$(($1 + $2 - $(date +%s%3N)))
    ((left > 0)) && sleep "$(printf '%d.%03d' $((left / 1000)) $((left % 1000)))"
    return 0
}
SLACK=250

# --- create ------------------------------------------------------------------------------
create "Fresh sale" 7 -60 3600
check_eq "create answers 201" 201 "$HTTP_CODE"
A=$(jat "$HTTP_BODY" idStr)
t0=$(date +%s%3N)
# Every request below may land on another worker of node 1: each must agree.
for i in 1 2 3 4 5 6; do
    http GET /market/consumer/coupon/status
    [[ ,$(names "$HTTP_BODY"), == *,Fresh\ sale,* ]] || break
done
check_eq "node 1 lists the new sale at once, on every worker (6 requests)" "Fresh sale" \
    "$(names "$HTTP_BODY")"
check_eq "Redis ACTIVITY:LIST holds it" 1 \
    "$(rcli GET ACTIVITY:LIST | grep -c '"Fresh sale"')"
http GET "/market/consumer/coupon/status?id=$A"
check_eq "node 1: status?id at once" "Fresh sale 7" \
    "$(jat "$HTTP_BODY" activity.name) $(jat "$HTTP_BODY" activity.remaining)"
after "$t0" $((REFRESH + SLACK))
check "node 2 lists it cache.refresh_ms + ${SLACK} ms after the create" n2_lists "Fresh sale"

# --- update before the start: a later start, a new name ----------------------------------
create "Later sale" 10 1800 7200
L=$(jat "$HTTP_BODY" idStr)
check "node 2 lists the later sale" wait_for 10 n2_lists "Later sale"
http GET "/market/consumer/coupon/status?id=$L"   # warm node 1's cache of it
n2_get "/market/consumer/coupon/status?id=$L" >/dev/null
NS=$(iso 3600)
http PUT "$ACT" "{\"id\":$L,\"name\":\"Renamed sale\",\"distributeStartTime\":\"$NS\"}" "$ADMIN"
check_eq "update answers 200" 200 "$HTTP_CODE"
t0=$(date +%s%3N)
want_start=$(($(date -d "$NS" +%s) * 1000))
v=()
for i in 1 2 3 4 5 6; do
    http GET "/market/consumer/coupon/status?id=$L"
    v+=("$(judge "$HTTP_BODY" "Renamed sale $want_start" activity.name activity.startTime)")
done
tally "${v[@]}"
check_eq "node 1: status?id shows the new name and start at once, on every worker" "" "$BAD"
http GET /market/consumer/coupon/status
check_match "node 1: the list shows the new name at once" 'Renamed sale' "$(names "$HTTP_BODY")"
after "$t0" $((REFRESH + SLACK))
v=()
for i in 1 2 3 4; do # node 2 has two workers, each with its own cache
    v+=("$(judge "$(n2_get "/market/consumer/coupon/status?id=$L")" "$want_start" activity.startTime)")
done
tally "${v[@]}"
check_eq "node 2: status?id shows the new start cache.refresh_ms + ${SLACK} ms after the update, on every worker" "" "$BAD"
check "node 2: the list shows the new name" n2_lists "Renamed sale"

# --- top-up --------------------------------------------------------------------------------
n2_get "/market/consumer/coupon/status?id=$A" >/dev/null
http PUT "$ACT" "{\"id\":$A,\"addStock\":5}" "$ADMIN"
check_eq "top-up answers 200" 200 "$HTTP_CODE"
t0=$(date +%s%3N)
v=()
for i in 1 2 3 4 5 6; do
    http GET "/market/consumer/coupon/status?id=$A"
    v+=("$(judge "$HTTP_BODY" "12 12" activity.totalNum activity.remaining)")
done
tally "${v[@]}"
check_eq "node 1: total and remaining after the top-up at once, on every worker" "" "$BAD"
after "$t0" $((REFRESH + SLACK))
v=()
for i in 1 2 3 4; do # node 2 has two workers, each with its own cache
    v+=("$(judge "$(n2_get "/market/consumer/coupon/status?id=$A")" 12 activity.totalNum)")
done
tally "${v[@]}"
check_eq "node 2: the new total cache.refresh_ms + ${SLACK} ms after the top-up, on every worker" "" "$BAD"

# --- revoke --------------------------------------------------------------------------------
http POST /market/admin/coupon/revoke "{\"id\":$A}" "$ADMIN"
check_eq "revoke answers 200" 200 "$HTTP_CODE"
t0=$(date +%s%3N)
http GET "/market/consumer/coupon/status?id=$A"
check_eq "node 1: status?id says VOIDED at once" VOIDED "$(jat "$HTTP_BODY" activity.status)"
http GET /market/consumer/coupon/status
check_eq "node 1: the list drops it at once" "Renamed sale" "$(names "$HTTP_BODY")"
after "$t0" $((REFRESH + SLACK))
v=()
for i in 1 2 3 4; do # node 2 has two workers, each with its own cache
    v+=("$(judge "$(n2_get "/market/consumer/coupon/status?id=$A")" VOIDED activity.status)")
done
tally "${v[@]}"
check_eq "node 2: status?id says VOIDED cache.refresh_ms + ${SLACK} ms after the revoke, on every worker" "" "$BAD"
# Answering at all: an empty answer from a dead node 2 would lack it too.
n2_dropped() { n2_lists "Renamed sale" && n2_lacks "Fresh sale"; }
check "node 2: the list drops it (and still lists the other)" n2_dropped

# --- a periodic preheat never puts the list back in time ------------------------------------
# The list's generation moves with every write; a preheat that read MySQL
# before a write must read again rather than overwrite it.
g1=$(rcli GET '{ACTIVITY:LIST}:GEN')
create "Third sale" 3 -60 3600
g2=$(rcli GET '{ACTIVITY:LIST}:GEN')
check "each list write moves the list's generation ($g1 -> $g2)" test "${g2:-0}" -gt "${g1:-0}"
http GET /market/consumer/coupon/status
check_eq "the new sale takes its place by start time" "Third sale,Renamed sale" "$(names "$HTTP_BODY")"
http POST /market/admin/coupon/preheat '{}' "$ADMIN"
check_eq "a full preheat answers 200" 200 "$HTTP_CODE"
http GET /market/consumer/coupon/status
check_eq "after it the list still holds both sales" "Renamed sale,Third sale" \
    "$(names "$HTTP_BODY" | tr ',' '\n' | sort | paste -sd,)"

finish
