#!/usr/bin/env bash
# many.sh - 20,000 activities on sale at once: preheat (time, idempotence),
# seize and status on a sample from every shard, the list route's pages, and
# Redis memory back to its level once an ended sale is cleaned up.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

N=20000
BASE=300000 # activities BASE .. BASE+N-1
export COUPON_CONF_OVERRIDES="sync.interval_s=1
sync.status_interval_s=1
sync.cleanup_grace_s=2
preheat.interval_s=3600"
cs_stack_up
ADMIN=$(mint_jwt 1 admin)
SEIZE=/market/consumer/coupon/seize

# py EXPR JSON: evaluates EXPR with d = the parsed JSON.
py() { python3 -c "import json, sys; d = json.loads(sys.argv[1]); print($1)" "$2" "$3"; }
seize_code() { http POST "$SEIZE" "{\"id\":$1}" "$(mint_jwt "$2")"; json_get "$HTTP_BODY" code; }
preheat() { http POST /market/admin/coupon/preheat '' "$ADMIN"; }
# digest of every META hash, the stock hashes and ACTIVITY:LIST
redis_digest() {
    local i
    {
        for ((i = 0; i < 10; i++)); do
            rcli HGETALL "COUPON:ACTIVITY:META:{$i}" | paste - - | sort
            rcli HGETALL "COUPON:RESOURCE:STOCK:{$i}" | paste - - | sort
        done
        rcli GET ACTIVITY:LIST
    } | md5sum | cut -d' ' -f1
}
used_memory() { rcli INFO memory | awk -F: '/^used_memory:/ {print $2+0}'; }

mysql_q "INSERT INTO activity (id, name, total_num, stock_num, distribute_start_time,
    distribute_end_time, validity_days, status)
    SELECT $BASE + seq, CONCAT('shop sale ', seq), 5, 5, NOW() - INTERVAL 60 SECOND,
    NOW() + INTERVAL 1 DAY, 30, 2 FROM seq_0_to_$((N - 1))"
check_eq "$N activities in MySQL" "$N" "$(mysql_q "SELECT COUNT(*) FROM activity WHERE id >= $BASE")"

# --- preheat ----------------------------------------------------------------------
t0=$(date +%s%3N)
preheat
t1=$(date +%s%3N)
check_eq "preheat of $N answers 200" 200 "$HTTP_CODE"
diag "preheat of $N activities: $((t1 - t0)) ms ($HTTP_BODY; load: $(cut -d' ' -f1-3 /proc/loadavg))"
check_eq "... loads them all" "$N" "$(json_get "$HTTP_BODY" loaded)"
check_eq "... creates every stock field" "$N" "$(json_get "$HTTP_BODY" created)"
# Generous: the target is 3 s on a quiet machine; this one is shared.
check "... within 30 s on this shared machine" test $((t1 - t0)) -lt 30000
metas=""
for ((s = 0; s < 10; s++)); do metas+="$(rcli HLEN "COUPON:ACTIVITY:META:{$s}") "; done
check_eq "every shard's META hash holds its 2,000" "2000 2000 2000 2000 2000 2000 2000 2000 2000 2000 " "$metas"
meta=$(rcli HGET "COUPON:ACTIVITY:META:{7}" $((BASE + 7)))
check_eq "a META field is the activity's JSON" "shop sale 7 5 IN_PROGRESS" \
    "$(py 'd["name"], d["totalNum"], ["", "NOT_STARTED", "IN_PROGRESS"][d["status"]]' "$meta" | tr -d "(),'")"

# --- seize and status on a sample from every shard ---------------------------------
# One Python process for the 40 requests: this machine is slow to start them.
bad=$(testkit shard-sample "$COUPON_URL" "$COUPON_JWT_SECRET" "$BASE")
check_eq "shards 0-9: SEIZED, ALREADY_SEIZED, status IN_PROGRESS remaining 4 mine.seized" "" "$bad"
check_eq "an id past the last -> NO_SUCH_ACTIVITY" NO_SUCH_ACTIVITY "$(seize_code $((BASE + N)) 7)"
check_eq "status of it -> 404" 404 "$(http_code GET "/market/consumer/coupon/status?id=$((BASE + N))")"

# status?id latency with 20,000 listed: one activity read, never the list
lat=$(for ((k = 0; k < 50; k++)); do
    curl -s -o /dev/null -w '%{time_total}\n' \
        "$COUPON_URL/market/consumer/coupon/status?id=$((BASE + RANDOM % N))"
done | sort -n | awk '{a[NR] = $1} END {printf "%d %d", a[int(NR / 2)] * 1000, a[NR] * 1000}')
diag "status?id over 50 random activities: median ${lat% *} ms, max ${lat#* } ms"
# The bench holds it to 50 ms on a quiet machine; reading the whole list took
# 426 ms here, so this still tells the two apart on a loaded one.
check "status?id median under 200 ms" test "${lat% *}" -lt 200

# --- the list route's pages -----------------------------------------------------------
http GET /market/consumer/coupon/status
check_eq "the list answers 200" 200 "$HTTP_CODE"
check_eq "... a page of 50 by default, total $N" "50 $N 1 50" \
    "$(py 'len(d["activities"]), d["total"], d["page"], d["size"]' "$HTTP_BODY" | tr -d '(),')"
check_eq "... in list order (start time, then id)" "$BASE $((BASE + 49))" \
    "$(py 'd["activities"][0]["id"], d["activities"][-1]["id"]' "$HTTP_BODY" | tr -d '(),')"
http GET "/market/consumer/coupon/status?page=2&size=200"
check_eq "page 2 of size 200 starts at the 201st" "200 $((BASE + 200))" \
    "$(py 'len(d["activities"]), d["activities"][0]["id"]' "$HTTP_BODY" | tr -d '(),')"
http GET "/market/consumer/coupon/status?page=1&size=1000"
check_eq "size above 200 is cut to 200" "200 200" \
    "$(py 'len(d["activities"]), d["size"]' "$HTTP_BODY" | tr -d '(),')"
http GET "/market/consumer/coupon/status?page=$((N / 200 + 1))&size=200"
check_eq "past the last page: no activities, total still $N" "0 $N" \
    "$(py 'len(d["activities"]), d["total"]' "$HTTP_BODY" | tr -d '(),')"
check_eq "page=0 -> 400" 400 "$(http_code GET '/market/consumer/coupon/status?page=0')"
check_eq "size=x -> 400" 400 "$(http_code GET '/market/consumer/coupon/status?size=x')"
http GET "/market/consumer/coupon/status?page=1&size=200"
check_eq "the list shows live stock" 4 \
    "$(py '[a["remaining"] for a in d["activities"] if a["id"] == int(sys.argv[2])][0]' "$HTTP_BODY" "$BASE")"
ids=$(testkit walk-pages "$COUPON_URL" $((N / 200)))
check_eq "walking all $((N / 200)) pages of 200 shows every activity once" "$N" "$ids"

# --- preheat idempotence ----------------------------------------------------------------
before=$(redis_digest)
preheat
check_eq "a second preheat creates nothing" "0 $N" \
    "$(py 'd["created"], d["loaded"]' "$HTTP_BODY" | tr -d '(),')"
check_eq "... and leaves META, stock and ACTIVITY:LIST exactly as they were" "$before" "$(redis_digest)"
check_eq "... the seized stock stays 4" 4 "$(stock_of "$BASE")"
mysql_q "UPDATE activity SET name = 'renamed' WHERE id = $((BASE + 3))"
preheat
check_eq "a changed activity's META field follows MySQL" renamed \
    "$(json_get "$(rcli HGET "COUPON:ACTIVITY:META:{3}" $((BASE + 3)))" name)"

# --- an ended sale leaves Redis, and Redis memory returns to its level ----------------
# The 100,000 seizes are written straight into Redis as lua/seize.lua would
# (seize list, queue, stock), which takes a second; a real sale of that size
# through HTTP takes minutes on this machine (see make soak).
END=400001 USERS=100000
mk_activity $END $USERS -60 $((12 * CS_TIME_SCALE))
preheat
check_eq "the short sale is on" SEIZED "$(seize_code $END 1)"
wait_for 20 sql_is "SELECT COUNT(*) FROM coupon WHERE activity_id=$END" 1
mem0=$(used_memory)
now=$(date +%s%3N)
awk -v a=$END -v n=$USERS -v now="$now" '
function bulk(s) { printf "$%d\r\n%s\r\n", length(s), s }
BEGIN {
    list = "COUPON:SEIZE:LIST:" a "_{1}"; q = "QUEUE:COUPON:SEIZE:SYNC:{1}"
    for (u = 2; u <= n; u += 1000) {
        m = (n - u + 1 < 1000) ? n - u + 1 : 1000
        printf "*%d\r\n", 2 + 2 * m; bulk("HSET"); bulk(list)
        for (k = 0; k < m; k++) { bulk(u + k); bulk(now) }
        printf "*%d\r\n", 2 + 2 * m; bulk("HSET"); bulk(q)
        for (k = 0; k < m; k++) { bulk(a ":" (u + k)); bulk(now) }
    }
    printf "*4\r\n"; bulk("HINCRBY"); bulk("COUPON:RESOURCE:STOCK:{1}"); bulk(a); bulk(-(n - 1))
}' | rcli --pipe >/dev/null
mem1=$(used_memory)
diag "used_memory: $mem0 before the sale, $mem1 with $USERS seized"
check_eq "all $USERS seized" 0 "$(stock_of $END)"
# Once the sale has ended, drained and sat out its grace (2 s), coupon-sync
# removes it, and a seize answers NO_SUCH_ACTIVITY. coupon-sync is paused over
# the end so that the ENDED answer cannot lose a race with that clean-up.
stack stop-sync
wait_past_ms "$(end_ms $END)"
check_eq "a seize after the end -> ENDED" ENDED "$(seize_code $END $((USERS + 5)))"
stack start-sync
wait_for 120 sql_is "SELECT COUNT(*) FROM coupon WHERE activity_id=$END" $USERS
check_eq "coupon-sync wrote all $USERS to MySQL" $USERS "$(mysql_q "SELECT COUNT(*) FROM coupon WHERE activity_id=$END")"
gone() {
    [[ $(rcli EXISTS "COUPON:SEIZE:LIST:${END}_{1}") == 0 &&
        -z $(rcli HGET "COUPON:RESOURCE:STOCK:{1}" $END) &&
        -z $(rcli HGET "COUPON:ACTIVITY:META:{1}" $END) ]]
}
check "after the grace coupon-sync removes seize list, stock and META" wait_for 30 gone
code=$(seize_code $END 2)
check_match "a late seize answers ENDED or NO_SUCH_ACTIVITY" '^(ENDED|NO_SUCH_ACTIVITY)$' "$code"
check_eq "... and its user is not in a seize list again" 0 "$(rcli EXISTS "COUPON:SEIZE:LIST:${END}_{1}")"
# UNLINK frees in the background: give it a moment. What is left is noise
# of the clients' buffers (coupon-sync's ten connections, the CLI), which
# moves by a few hundred KiB on its own; the sale itself took ~14 MB.
back() {
    mem2=$(used_memory)
    ((mem2 <= mem0 + 262144))
}
check "used_memory is back within 256 KiB of its level before the sale" wait_for 20 back
diag "used_memory: $mem0 before, $mem1 at the peak, $mem2 after the clean-up"
check_eq "the activity's coupons stay in MySQL" $USERS \
    "$(mysql_q "SELECT COUNT(*) FROM coupon WHERE activity_id=$END")"
check_eq "other activities are untouched" 4 "$(stock_of "$BASE")"

finish
