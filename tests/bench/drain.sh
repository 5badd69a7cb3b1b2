#!/usr/bin/env bash
# drain.sh - how fast coupon-sync moves queued coupons into MySQL, against the per-row
# drain of the common Java design (tests/bench/drain_baseline.c).
#
# usage: tests/bench/drain.sh [--json] [-n N] [--baseline-n N]
#
# Starts a throwaway stack (tests/stack, without its own coupon-sync), queues N
# entries (default 200000) over ten activities, one per shard, and times
# `coupon-sync --once` draining them (wall clock of the whole run: preheat,
# drain, status job, reconciliation). Then queues another N (or --baseline-n)
# entries for ten other activities and times drain_baseline on them with the
# same thread count as coupon-sync (sync.threads, 10): one transaction and one
# HDEL per entry. Both results are checked (row count, total = stock + coupons).
# Prints "drain coupon-sync=<rows/s> baseline=<rows/s> ratio=<x>", or one JSON
# object with --json. Target: ratio >= 10. Exit 0, 1 when a check failed, 77
# when a tool is missing, 99 when the stack does not come up.

# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib.sh"

JSON=0 N=200000 BN=""
while (($#)); do
    case $1 in
    --json) JSON=1 ;;
    -n) N=$2; shift ;;
    --baseline-n) BN=$2; shift ;;
    -h | --help) sed -n '4,16s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "drain.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
BN=${BN:-$N}
for v in "$N" "$BN"; do
    if [[ ! $v =~ ^[1-9][0-9]*$ ]] || ((v % 10 != 0)); then
        echo "drain.sh: entry counts must be positive multiples of 10" >&2
        exit 2
    fi
done
THREADS=10 # coupon-sync's sync.threads default, given to the baseline too

SYNC_BIN=$top_builddir/coupon-sync
[[ -x $SYNC_BIN ]] || { echo "drain.sh: $SYNC_BIN is not built" >&2; exit 77; }

export COUPON_CONF_OVERRIDES='log.level="warning"
preheat.interval_s=3600'
cs_stack_up --no-web >&2
stack stop-sync >&2

# --- the baseline program ------------------------------------------------------------------

BASE_BIN=$top_builddir/tests/bench/drain_baseline
[[ -x $BASE_BIN ]] || make -C "$top_builddir" tests/bench/drain_baseline >&2 ||
    { echo "drain.sh: building drain_baseline failed" >&2; exit 1; }

# --- data ----------------------------------------------------------------------------------------


coupons() { mysql_q "SELECT COUNT(*) FROM coupon WHERE activity_id BETWEEN $1 AND $(($1 + 9))"; }

bad_invariant() {
    mysql_q "SELECT COUNT(*) FROM activity a WHERE a.id BETWEEN $1 AND $(($1 + 9)) AND
        a.total_num <> a.stock_num + (SELECT COUNT(*) FROM coupon c WHERE c.activity_id = a.id)"
}

now_ns() { date +%s%N; }

rate() { awk -v n="$1" -v ns="$2" 'BEGIN { printf "%.0f", n / (ns / 1e9) }'; }

FAILED=0
verify() {
    local who=$1 base=$2 n=$3 got bad
    got=$(coupons "$base")
    bad=$(bad_invariant "$base")
    if [[ $got != "$n" || $bad != 0 ]]; then
        echo "drain.sh: $who: $got of $n coupons in MySQL, $bad activities off the invariant" >&2
        FAILED=1
    fi
}

# --- coupon-sync ------------------------------------------------------------------------------------

mk_activities 1000 $((N / 10))
fill_queue 1000 $((N / 10)) 0
t0=$(now_ns)
"$SYNC_BIN" -c "$COUPON_CONF" --once >>"$COUPON_DIR/bench-sync.log" 2>&1 || FAILED=1
t1=$(now_ns)
verify coupon-sync 1000 "$N"
sync_rate=$(rate "$N" $((t1 - t0)))

# --- the per-row baseline ------------------------------------------------------------------------------

mk_activities 2000 $((BN / 10))
fill_queue 2000 $((BN / 10)) 0
t0=$(now_ns)
"$BASE_BIN" -c "$COUPON_CONF" -t "$THREADS" >>"$COUPON_DIR/bench-baseline.log" 2>&1 || FAILED=1
t1=$(now_ns)
verify baseline 2000 "$BN"
base_rate=$(rate "$BN" $((t1 - t0)))

ratio=$(awk -v a="$sync_rate" -v b="$base_rate" 'BEGIN { printf "%.1f", (b > 0 ? a / b : 0) }')
if ((JSON)); then
    printf '{"bench":"drain","entries":%d,"baseline_entries":%d,"threads":%d,' "$N" "$BN" "$THREADS"
    printf '"coupon_sync_rows_per_s":%s,"baseline_rows_per_s":%s,"ratio":%s,"target_ratio":10,' \
        "$sync_rate" "$base_rate" "$ratio"
    printf '"ok":%s}\n' "$([[ $FAILED == 0 ]] && echo true || echo false)"
else
    printf 'drain coupon-sync=%s baseline=%s ratio=%s\n' "$sync_rate" "$base_rate" "$ratio"
fi
awk -v r="$ratio" 'BEGIN { exit !(r < 10) }' &&
    echo "drain.sh: ratio $ratio is below the 10x target" >&2
exit "$FAILED"
