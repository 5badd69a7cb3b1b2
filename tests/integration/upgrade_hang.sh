#!/usr/bin/env bash
# upgrade_hang.sh - an upgrade in place of a node of one worker while its
# Redis hangs (SIGSTOP): the new worker's start-up check of Redis
# (durability_single(), a CONFIG GET) waits out redis.command_timeout_ms
# before the worker accepts. The new supervisor takes over only once its
# worker is registered, which it is just before it accepts, so the old worker
# answers meanwhile. Requests that need no Redis (a route that does not
# exist: 404 NOT_FOUND from the worker) are sent all along, one at a time:
# none waits for the check, none is answered by nginx instead of the
# service.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

[[ -x $top_builddir/coupon-fcgi ]] || skip_all "coupon-fcgi is not built"
upgrade_bins
export COUPON_WORKERS=1
# The check's wait follows the machine's slowness, so that on a busy machine
# a request slowed by the machine alone stays well under half of it; 6 s at
# most, well within the 10 s a new supervisor waits for its workers to
# register before it gives the upgrade up.
TIMEOUT_MS=$((3000 * (CS_TIME_SCALE < 2 ? CS_TIME_SCALE : 2)))
export COUPON_CONF_OVERRIDES="fallback.reserve=0
redis.command_timeout_ms=$TIMEOUT_MS
fallback.budget_ms=$((TIMEOUT_MS + 2000))
${COUPON_CONF_OVERRIDES:-}"
cs_stack_up --no-sync
cs_defer rm -rf "$BIN"
kill -STOP "$COUPON_REDIS_PID"
cs_defer kill -CONT "$COUPON_REDIS_PID"
log=$COUPON_DIR/hang.log
: >"$log"
# One request at a time: "STATUS SECONDS" a line, until the stop file exists.
(
    while [[ ! -e $COUPON_DIR/hang.stop ]]; do
        curl -s -o /dev/null -m 10 -w '%{http_code} %{time_total}\n' \
            "$COUPON_URL/market/no-such-route" >>"$log"
    done
) &
LOOP_PID=$!
cs_defer touch "$COUPON_DIR/hang.stop"
lines() { wc -l <"$log"; }
check "requests are answered before the upgrade" wait_for 30 eval '(($(lines) >= 20))'
upgrade_build 2
old=$COUPON_FCGI_PID
check "an upgrade in place while Redis hangs" stack upgrade-fcgi
check "... a new supervisor runs build 2" cmp -s "/proc/$COUPON_FCGI_PID/exe" "$BIN/build-2"
n0=$(lines)
check "... and answers" wait_for 30 eval '(($(lines) >= n0 + 20))'
touch "$COUPON_DIR/hang.stop"
wait "$LOOP_PID"
kill -CONT "$COUPON_REDIS_PID"
diag "answers by status: $(awk '{ print $1 }' "$log" | sort | uniq -c | tr -s ' \n' ' ')"
check_eq "every answer the service's own 404 (no 502, no 504)" "" "$(awk '$1 != 404' "$log" | head -n 5)"
# The longest answer, against the check's wait: a worker that took over
# before its check had ended would hold the requests about that long.
max=$(awk '$2 * 1000 > m { m = $2 * 1000 } END { print int(m) }' "$log")
diag "the longest answer: $max ms of $(lines) (the start-up check waits up to $TIMEOUT_MS ms)"
check "no request waited for the new worker's start-up check" test "$max" -lt $((TIMEOUT_MS / 2))
check "the old supervisor has gone" eval "! pid_alive $old"
finish
