#!/usr/bin/env bash
# nemesis.sh - the nemesis in short: its checker on hand-written histories,
# one seeded schedule of mixed faults over two web nodes and a Redis Cluster
# that must be judged VALID, and one whose stores get the three planted
# defects (a lost row, a second coupon, a raised stock) that must each be
# judged an anomaly. The long campaign is "make nemesis".
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib.sh"

command -v python3 >/dev/null 2>&1 || skip_all "python3 is not installed"
net_skip_unless_nft
command -v redis-server >/dev/null 2>&1 || skip_all "redis-server is not installed"
[[ -x $top_builddir/coupon-fcgi ]] || skip_all "coupon-fcgi is not built"

NEM=$top_srcdir/tests/nemesis
out=$(python3 "$NEM/test_checker.py" 2>&1)
check "the checker's unit tests pass" test $? -eq 0
[[ $out == *OK* ]] || diag "$out"

work=$(mktemp -d "${TMPDIR:-/tmp}/nemcheck.XXXXXX")
cs_defer rm -rf "$work"

seed=${NEMESIS_SEED:-1}
line=$("$NEM/run" --seed "$seed" --secs "${NEMESIS_SECS:-30}" --dir "$work/a" 2>"$work/a.err" | tail -n 1)
diag "$line"
check_match "seed $seed under mixed faults: VALID" ": VALID " "$line"
[[ $line == *": VALID "* ]] || {
    grep anomaly "$work/a.err" 2>/dev/null | head -n 5 | while read -r l; do diag "$l"; done
    cat "$work/a.err" >&2 || true
}

out=$(NEMESIS_PLANT=lose-row,double,oversell "$NEM/run" --seed 2 --secs 12 --kinds kill-worker,pause-redis \
    --dir "$work/b" 2>"$work/b.err")
line=$(tail -n 1 <<<"$out")
diag "$line"
check_match "planted defects: the run is INVALID" "INVALID" "$line"
check_match "a lost row is judged lost" '"kind": "lost"' "$out"
check_match "a second coupon is judged double" '"kind": "double"' "$out"
check_match "a raised stock is judged unbalanced" '"kind": "unbalanced"' "$out"
check_match "an anomaly prints the command that replays it" \
    "reproduce: NEMESIS_PLANT=lose-row,double,oversell tests/nemesis/run --seed 2" "$line"
check "no nftables table of the nemesis is left" \
    bash -c '! nft list tables 2>/dev/null | grep -q cs_nemesis_'
finish
