#!/usr/bin/env bash
# lifecycle.sh - numbers of the coupon lifecycle, on one throwaway stack:
#   1. seize vs use: N seizes by N users (loadgen, C connections), then, once
#      coupon-sync wrote them, N use calls, one order per coupon, through the
#      same nginx and workers: rps and p99 of each.
#   2. an expiry pass over M coupons in MySQL of which D are due: the time of
#      coupon-sync's coupon job (--once), and EXPLAIN of its statement.
#
# usage: tests/bench/lifecycle.sh [-n N] [-c C] [-m M] [-d D] [--json]
# Defaults: N 20000, C 64, M 1000000, D 10000. Exit 0, 1 when a check failed.

# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib.sh"

N=20000 C=64 M=1000000 D=10000 JSON=0
while (($#)); do
    case $1 in
    -n) N=$2; shift ;;
    -c) C=$2; shift ;;
    -m) M=$2; shift ;;
    -d) D=$2; shift ;;
    --json) JSON=1 ;;
    -h | --help) sed -n '2,10s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "lifecycle.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
    shift
done
[[ -x $LOADGEN ]] || skip_all "tests/bench/loadgen is not built (make check builds it)"
cs_stack_up
ADMIN=$(mint_jwt 1 admin)
PORT=${COUPON_URL##*:}

# --- 1. seize vs use ------------------------------------------------------------------
mk_activity 901 "$N" -60 86400
http POST /market/admin/coupon/preheat '' "$ADMIN"
seize=$(seize_load 901 "$C" "$N" 100000000)
check_eq "every seize won" "$N" "$(code_count "$seize" SEIZED)"
check "coupon-sync wrote them" wait_for 300 sql_is "SELECT COUNT(*) FROM coupon WHERE activity_id = 901" "$N"
mysql_q "SELECT id, user_id FROM coupon WHERE activity_id = 901" |
    awk '{ printf "{\"couponId\":%s,\"userId\":%s,\"orderId\":\"bench-%s\"}\n", $1, $2, $1 }' >"$COUPON_DIR/use.bodies"
use=$("$LOADGEN" -p "$PORT" -s "$COUPON_JWT_SECRET" -r service -u /market/service/coupon/use \
    -B "$COUPON_DIR/use.bodies" -c "$C" -n "$N" -j)
check_eq "every use won" "$N" "$(code_count "$use" OK)"

# --- 2. the expiry pass ---------------------------------------------------------------
stack stop-sync
mk_activity 902 "$M" -60 86400
# M coupons valid for a day, the first D of them due a second ago; stock_num
# follows, so the invariant holds as coupon-sync would have left it.
mysql_q "INSERT INTO coupon (activity_id, user_id, status, seized_at, valid_until)
    SELECT 902, seq, 1, NOW(3) - INTERVAL 1 MINUTE,
        IF(seq <= $D, NOW(3) - INTERVAL 1 SECOND, NOW(3) + INTERVAL 1 DAY) FROM seq_1_to_$M;
    UPDATE activity SET stock_num = 0 WHERE id = 902; ANALYZE TABLE coupon;" >/dev/null
explain=$(mysql_q "EXPLAIN UPDATE coupon SET status = 3 WHERE status = 1 AND valid_until <= NOW(3) AND FIND_IN_SET(activity_id, '') = 0 ORDER BY valid_until LIMIT 1000" | tr '\t' ' ')
diag "EXPLAIN: $explain"
t0=$(date +%s%3N)
"$top_builddir/coupon-sync" -c "$COUPON_DIR/couponseize.conf" --once >"$COUPON_DIR/once.log" 2>&1
t1=$(date +%s%3N)
job_ms=$(sed -n 's/.*coupon job: .*(\([0-9]*\) ms)$/\1/p' "$COUPON_DIR/once.log" | tail -n 1)
check_eq "the pass expired exactly the due coupons" "$D" \
    "$(mysql_q "SELECT COUNT(*) FROM coupon WHERE activity_id = 902 AND status = 3")"
check_match "the statement ranges over idx_coupon_due" 'idx_coupon_due' "$explain"

if ((JSON)); then
    printf '{"seize":%s,"use":%s,"expiry":{"coupons":%d,"due":%d,"job_ms":%s,"once_ms":%d}}\n' \
        "$seize" "$use" "$M" "$D" "${job_ms:-null}" $((t1 - t0))
else
    printf 'seize: %s\nuse:   %s\n' "$seize" "$use"
    printf 'expiry pass over %d coupons, %d due: coupon job %s ms (coupon-sync --once %d ms)\n' \
        "$M" "$D" "${job_ms:-?}" $((t1 - t0))
fi
finish
