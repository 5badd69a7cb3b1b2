#!/usr/bin/env bash
# preheat_race.sh - derived data never goes back in time. A preheat reads
# MySQL, then writes Redis; an admin update reads, commits, then writes
# Redis. Each interleaving of the two is made, not waited for: the process
# that must be caught between two steps stops there at a pause point
# (COUPONSEIZE_PAUSE_AT, see lib/cs.h) and goes on with SIGCONT once the
# other has done its part. Whatever the order, Redis ends with what MySQL
# holds: a lower total, a top-up, a moved window, a revoke.
# Then the periodic preheat of coupon-sync: a change made in SQL by hand
# reaches Redis through the pass that reads only changed rows, one whose
# updated_at is too old for that pass through the full pass, and the expiry
# job finds ended sales by their end time.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

N=2000
BASE=2000000 # activities BASE .. BASE+N-1, on sale
T=1999999    # not started: an update lowers its total while a preheat reads
U=1999998    # not started: a preheat writes while the update waits to commit
P=1999997    # on sale: a top-up while a preheat reads
Q=1999996    # on sale: a preheat writes while the top-up waits to commit
V=1999995    # on sale: a revoke while a preheat is about to write
# The workers stop before the commit of an update of U or Q.
export COUPONSEIZE_PAUSE_AT="update-commit:$U,update-commit:$Q"
export COUPON_CONF_OVERRIDES="log.level=\"info\"
preheat.interval_s=1
preheat.horizon_days=1
preheat.full_interval_s=8
sync.interval_s=1
sync.status_interval_s=1
sync.cleanup_grace_s=1"
cs_stack_up
ADMIN=$(mint_jwt 1 admin)
ACT=/market/admin/coupon/activity
CONF=$COUPON_DIR/couponseize.conf
once() { "$top_builddir/coupon-sync" -c "$CONF" --once; }

window_of() { rcli HGET "COUPON:ACTIVITY:WINDOW:{$(($1 % 10))}" "$1"; }
meta_of() { rcli HGET "COUPON:ACTIVITY:META:{$(($1 % 10))}" "$1"; }
ver_of() { rcli HGET "COUPON:ACTIVITY:VER:{$(($1 % 10))}" "$1"; }
iso() { date -u -d "@$1" +%Y-%m-%dT%H:%M:%S+00:00; }
meta_has() { meta_of "$1" | grep -q "$2"; }
mysql_ver() { mysql_q "SELECT CAST(UNIX_TIMESTAMP(updated_at) * 1000000 AS SIGNED) FROM activity WHERE id = $1"; }
# stopped PID: the process is stopped (at its pause point).
stopped() { [[ -r /proc/$1/stat && $(sed 's/.*) //' "/proc/$1/stat" | cut -c1) == T ]]; }
# stopped_worker: sets WPID to a worker of this stack that is stopped.
stopped_worker() {
    local p
    for p in $(pgrep -P "$COUPON_FCGI_PID"); do
        if stopped "$p"; then WPID=$p; return 0; fi
    done
    return 1
}
# put_bg BODY OUT: the admin update in the background; its status code and
# body go to OUT. Sets BG.
put_bg() {
    curl -s -o "$2.body" -w '%{http_code}' --max-time 120 -X PUT \
        -H "Authorization: Bearer $ADMIN" -H 'Content-Type: application/json' \
        --data-binary "$1" "$COUPON_URL$ACT" >"$2" &
    BG=$!
}
# paused_preheat POINT LOG: coupon-sync's preheat, stopped at POINT. Sets PRE.
paused_preheat() {
    COUPONSEIZE_PAUSE_AT=$1 "$top_builddir/coupon-sync" -c "$CONF" --once 2>"$2" &
    PRE=$!
    check "the preheat stops at $1" wait_for 60 stopped "$PRE"
}
go_on() {
    kill -CONT "$1"
    wait "$1"
}

# coupon-sync would heal what this part breaks: it is stopped meanwhile.
stack stop-sync
mysql_q "INSERT INTO activity (id, name, total_num, stock_num, distribute_start_time,
    distribute_end_time, validity_days, status)
    SELECT $BASE + seq, CONCAT('shop sale ', seq), 5, 5, NOW() - INTERVAL 60 SECOND,
    NOW() + INTERVAL 1 DAY, 30, 2 FROM seq_0_to_$((N - 1))"
now=$(date +%s)
start=$((now + 3600)) end=$((now + 7200)) later=$((now + 3600 + 1800))
mysql_q "INSERT INTO activity (id, name, total_num, stock_num, distribute_start_time,
    distribute_end_time, validity_days, status) VALUES
    ($P, 'topped-up sale', 10, 10, NOW() - INTERVAL 60 SECOND, NOW() + INTERVAL 1 DAY, 30, 2),
    ($Q, 'topped-up sale 2', 10, 10, NOW() - INTERVAL 60 SECOND, NOW() + INTERVAL 1 DAY, 30, 2),
    ($V, 'revoked sale', 10, 10, NOW() - INTERVAL 60 SECOND, NOW() + INTERVAL 1 DAY, 30, 2)"
check "a first preheat of $N" once 2>"$COUPON_DIR/once1.log"
check_eq "the sales on sale have their stock" "10 10 10" "$(stock_of $P) $(stock_of $Q) $(stock_of $V)"

# (a) The preheat reads, the update commits and writes Redis, the preheat
# writes. T is new (start in 1 h), 100 coupons, no Redis fields yet; the
# update moves its start 30 minutes later and lowers its total to 50.
mysql_q "INSERT INTO activity (id, name, total_num, stock_num, distribute_start_time,
    distribute_end_time, validity_days, status)
    VALUES ($T, 'moved sale', 100, 100, FROM_UNIXTIME($start), FROM_UNIXTIME($end), 30, 1)"
paused_preheat preheat-read "$COUPON_DIR/race.log"
http PUT "$ACT" "{\"id\":$T,\"distributeStartTime\":\"$(iso "$later")\",\"totalNum\":50}" "$ADMIN"
check_eq "(a) the update answers 200" 200 "$HTTP_CODE"
go_on "$PRE"
check_eq "(a) the preheat that read before the update ends well" 0 "$?"
check_match "(a) it left the updated sale alone" \
    "preheat: 1 activities left as they are" "$(cat "$COUPON_DIR/race.log")"
check_eq "(a) Redis holds the new window" "$((later * 1000)),$((end * 1000))" "$(window_of $T)"
check_match "(a) META holds the new start" "\"startTime\":$((later * 1000))[,}]" "$(meta_of $T)"
check_eq "(a) Redis stock is the new total" 50 "$(stock_of $T)"
check_eq "(a) the version in Redis is MySQL's updated_at" "$(mysql_ver $T)" "$(ver_of $T)"
http GET "/market/consumer/coupon/status?id=$T"
check_match "(a) status shows the new start" "\"startTime\":$((later * 1000))[,}]" "$HTTP_BODY"

# (b) The update reads Redis (no stock field yet), a preheat reads MySQL's
# old total and creates the stock field from it, then the update commits.
mysql_q "INSERT INTO activity (id, name, total_num, stock_num, distribute_start_time,
    distribute_end_time, validity_days, status)
    VALUES ($U, 'lowered sale', 100, 100, FROM_UNIXTIME($start), FROM_UNIXTIME($end), 30, 1)"
put_bg "{\"id\":$U,\"totalNum\":50}" "$COUPON_DIR/put-u"
check "(b) the update stops before its commit" wait_for 60 stopped_worker
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "(b) meanwhile a preheat creates the stock from the old total" "200 100" \
    "$HTTP_CODE $(stock_of $U)"
kill -CONT "$WPID"
wait "$BG"
check_eq "(b) the update answers 200" 200 "$(cat "$COUPON_DIR/put-u")"
check_eq "(b) Redis stock is the new total" 50 "$(stock_of $U)"
check_eq "(b) the version in Redis is MySQL's updated_at" "$(mysql_ver $U)" "$(ver_of $U)"
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "(b) a later preheat leaves it at 50" "200 50" "$HTTP_CODE $(stock_of $U)"

# (c) A top-up of a live sale while a preheat that read the old total is
# stopped: counted once, never undone.
paused_preheat preheat-read "$COUPON_DIR/race-c.log"
http PUT "$ACT" "{\"id\":$P,\"addStock\":5}" "$ADMIN"
check_eq "(c) the top-up answers" "200 updated 15" \
    "$HTTP_CODE $(json_get "$HTTP_BODY" redisStock) $(stock_of $P)"
go_on "$PRE"
check_eq "(c) the preheat that read before the top-up ends well" 0 "$?"
check_eq "(c) the stock holds the top-up once" 15 "$(stock_of $P)"
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "(c) a later preheat agrees" "200 15" "$HTTP_CODE $(stock_of $P)"

# (d) The top-up reads Redis, a preheat that read MySQL before its commit
# rewrites the sale (a rename by hand makes it differ), then the top-up
# commits: counted once.
mysql_q "UPDATE activity SET name = 'renamed before the top-up' WHERE id = $Q"
put_bg "{\"id\":$Q,\"addStock\":5}" "$COUPON_DIR/put-q"
check "(d) the top-up stops before its commit" wait_for 60 stopped_worker
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "(d) meanwhile a preheat writes the old total" "200 10" "$HTTP_CODE $(stock_of $Q)"
check "(d) ... and the rename" meta_has $Q 'renamed before the top-up'
kill -CONT "$WPID"
wait "$BG"
check_eq "(d) the top-up answers 200" 200 "$(cat "$COUPON_DIR/put-q")"
check_eq "(d) the stock holds the top-up once" 15 "$(stock_of $Q)"
check_eq "(d) MySQL agrees: total 15" 15 "$(mysql_q "SELECT total_num FROM activity WHERE id = $Q")"

# (e) A revoke between a preheat's read (of a renamed, on-sale row) and its
# write: the sale stays revoked, its stock the tombstone, its META not put back.
mysql_q "UPDATE activity SET name = 'renamed before the revoke' WHERE id = $V"
paused_preheat preheat-publish "$COUPON_DIR/race-e.log"
http POST /market/admin/coupon/revoke "{\"id\":$V}" "$ADMIN"
check_eq "(e) the revoke answers 200" 200 "$HTTP_CODE"
go_on "$PRE"
check_eq "(e) the preheat that read before the revoke ends well" 0 "$?"
check_eq "(e) the stock field is the tombstone" -1 "$(stock_of $V)"
check "(e) the stale META was not written" eval '! meta_has $V "renamed before the revoke"'
http POST /market/consumer/coupon/seize "{\"id\":$V}" "$(mint_jwt 77)"
check_eq "(e) a seize answers VOIDED" VOIDED "$(json_get "$HTTP_BODY" code)"

# A preheat that reads MySQL now agrees, and changes nothing.
mysql_root_q "DELETE FROM activity WHERE id >= $BASE"
http POST /market/admin/coupon/preheat '' "$ADMIN"
check_eq "a later preheat answers 200" 200 "$HTTP_CODE"
check_eq "... and leaves the window" "$((later * 1000)),$((end * 1000))" "$(window_of $T)"

# --- coupon-sync's periodic passes ----------------------------------------------------
stack start-sync
# A change made in SQL by hand: reached by the pass that reads changed rows.
mysql_q "UPDATE activity SET name = 'renamed by hand' WHERE id = $T"
check "a change made in SQL reaches META" wait_for 30 meta_has $T 'renamed by hand'
# A change stamped long before it became visible (as a transaction that
# commits long after it ran looks) is older than the periodic pass reaches
# back, yet newer than the version Redis holds: the full pass finds it.
mysql_q "INSERT INTO activity (id, name, total_num, stock_num, distribute_start_time,
    distribute_end_time, validity_days, status, updated_at)
    VALUES (1999979, 'old sale', 10, 10, NOW() - INTERVAL 60 SECOND, NOW() + INTERVAL 1 DAY,
    30, 2, NOW() - INTERVAL 2 HOUR)"
check "a row stamped in the past reaches META by the full pass" \
    wait_for 60 meta_has 1999979 'old sale'
mysql_q "UPDATE activity SET name = 'stamped in the past', updated_at = NOW() - INTERVAL 1 HOUR
    WHERE id = 1999979"
check "... and a change of it stamped in the past, too" \
    wait_for 60 meta_has 1999979 'stamped in the past'
# A sale whose start enters the horizon (a day) in 12 seconds (scaled), its row
# unchanged for hours, inserted with a sentinel inside the horizon: once the
# sentinel is preheated a pass has run since, so the first sale's absence
# then means the pass left it out, not that no pass ran yet.
mysql_q "INSERT INTO activity (id, name, total_num, stock_num, distribute_start_time,
    distribute_end_time, validity_days, status, updated_at)
    VALUES (1999969, 'entering the horizon', 10, 10, NOW() + INTERVAL 1 DAY + INTERVAL $((12 * CS_TIME_SCALE)) SECOND,
    NOW() + INTERVAL 2 DAY, 30, 1, NOW() - INTERVAL 2 HOUR),
    (1999959, 'horizon sentinel', 10, 10, NOW() + INTERVAL 1 HOUR,
    NOW() + INTERVAL 2 DAY, 30, 1, NOW())"
check "a pass ran after the insert (the sentinel is preheated)" \
    wait_for 30 meta_has 1999959 'horizon sentinel'
check_eq "a sale beyond the horizon is not preheated" "" "$(meta_of 1999969)"
check "once its start enters the horizon, it is" wait_for 90 meta_has 1999969 'entering the horizon'
# A sale ending now: the expiry job finds it by its end time and removes
# every field of it.
mk_activity 1999989 10 -60 6
has_window() { [[ -n $(window_of "$1") ]]; }
check "the ending sale is preheated" wait_for 30 has_window 1999989
check_eq "its end time is in ENDS" 1 "$(rcli ZSCORE 'COUPON:ACTIVITY:ENDS:{9}' 1999989 | grep -c .)"
gone() {
    [[ -z $(rcli HGET 'COUPON:ACTIVITY:META:{9}' 1999989) && -z $(rcli HGET 'COUPON:ACTIVITY:VER:{9}' 1999989) &&
        -z $(rcli ZSCORE 'COUPON:ACTIVITY:ENDS:{9}' 1999989) && -z $(stock_of 1999989) ]]
}
check "once ended, META, VER, ENDS and stock go" wait_for 30 gone
check_eq "the moved sale stays" "$((later * 1000)),$((end * 1000))" "$(window_of $T)"

finish
