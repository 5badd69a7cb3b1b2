#!/usr/bin/env bash
# nemesis.sh - the nemesis in short: its checker on hand-written histories,
# one seeded schedule of mixed faults over two web nodes and a Redis Cluster,
# one node with group commit on (batches must form there), that must be
# judged VALID, and one whose stores get the three planted defects (a lost
# row, a second coupon, a raised stock) that must each be judged an anomaly.
# The long campaign is "make nemesis".
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib.sh"

nemesis_skip_unless_ready
out=$(python3 "$NEM/test_checker.py" 2>&1)
check "the checker's unit tests pass" test $? -eq 0
[[ $out == *OK* ]] || diag "$out"
out=$(python3 "$NEM/test_generator.py" 2>&1)
check "the schedule generator's unit tests pass" test $? -eq 0
[[ $out == *OK* ]] || diag "$out"

work=$(mktemp -d "${TMPDIR:-/tmp}/nemcheck.XXXXXX")
cs_defer rm -rf "$work"

seed=${NEMESIS_SEED:-1}
nemesis_run "$work/a.out" "$work/a.err" --seed "$seed" --secs "${NEMESIS_SECS:-30}" --dir "$work/a" \
    --batch on
line=$(tail -n 1 "$work/a.out")
diag "$line"
check_match "seed $seed under mixed faults, group commit on one node: VALID" ": VALID " "$line"
mean=$(testkit json-max "$work/a/verdict.json" group_commit mean 2>/dev/null || echo 0)
check "seed $seed: seizes rode together on the batched node (mean batch $mean)" \
    python3 -c "import sys; sys.exit(not float(sys.argv[1]) > 1.2)" "$mean"
[[ $line == *": VALID "* ]] || {
    grep anomaly "$work/a.err" 2>/dev/null | head -n 5 | while read -r l; do diag "$l"; done
    cat "$work/a.err" >&2 || true
}

NEMESIS_PLANT=lose-row,double,oversell nemesis_run "$work/b.out" "$work/b.err" --seed 2 --secs 12 \
    --kinds kill-worker,pause-redis --dir "$work/b"
out=$(cat "$work/b.out")
line=$(tail -n 1 <<<"$out")
diag "$line"
check_match "planted defects: the run is INVALID" "INVALID" "$line"
check_match "a lost row is judged lost" '"kind": "lost"' "$out"
check_match "a second coupon is judged double" '"kind": "double"' "$out"
check_match "a raised stock is judged unbalanced" '"kind": "unbalanced"' "$out"
check_match "an anomaly prints the command that replays it" \
    "reproduce: NEMESIS_PLANT=lose-row,double,oversell tests/nemesis/run --seed 2" "$line"
check "no nftables table of the nemesis is left" nemesis_tables_gone
check "no strace of the nemesis is left (slow-journal)" test -z "$(pgrep -f "strace .*$work/" || true)"
finish
