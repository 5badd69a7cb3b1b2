#!/usr/bin/env bash
# nemesis_replica.sh - the schedule of nemesis seeds 46 and 92, replayed: the
# replica of a sale's shard is cut off from everyone for 4.75 s (the cluster
# marks it failed), the admin moves a window and revokes a sale, and 1.3 s
# after the heal the shard's master is cut off in turn (its replica is
# promoted). A failed replica that is still young enough to be promoted must
# keep counting in the durability rule, and "already seized" must be held to
# that rule like a grant: else users told SEIZED or ALREADY_SEIZED lose their
# coupon in the failover. It runs under Redis' own defaults (validity factor
# 10, ping 10 s, repl-timeout 60 s), where the window in which a failed
# replica can win is widest.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib.sh"

nemesis_skip_unless_ready
work=$(mktemp -d "${TMPDIR:-/tmp}/nemrep.XXXXXX")
cs_defer rm -rf "$work"

export COUPON_REDIS_CONF_EXTRA=$'cluster-replica-validity-factor 10\nrepl-ping-replica-period 10\nrepl-timeout 60'
nemesis_run "$work/a.out" "$work/a.err" --seed 46 --secs 12 \
    --schedule "$NEM/schedules/replica-then-master.jsonl" --keep --dir "$work/a"
line=$(tail -n 1 "$work/a.out")
diag "$line"
check_match "a replica cut off, then its master: VALID" ": VALID " "$line"
[[ $line == *": VALID "* ]] || {
    grep anomaly "$work/a.err" 2>/dev/null | head -n 8 | while read -r l; do diag "$l"; done
    tail -n 40 "$work/a.err" >&2 || true
}
# role_node ROLE: the redisN the run resolved ROLE to.
role_node() { testkit jsonl-find "$work/a/schedule.jsonl" role "$1" target 2>/dev/null; }
REP=$(role_node replica-of:104) MAS=$(role_node master-of:104)
diag "the replica of shard 4: ${REP:-?}, its master: ${MAS:-?}"
check "the replica and the master were found by role" \
    bash -c '[[ $1 == redis[1-6] && $2 == redis[1-6] && $1 != "$2" ]]' _ "$REP" "$MAS"
# The schedule did what it is for: the cut replica took over from its master.
check "the cut replica won an election once its master was cut" \
    grep -q "Failover election won" "$work/a/stack/redis/${REP#redis}/redis.log"
check "the stack ran under Redis' validity defaults" \
    grep -q '^repl-timeout 60' "$work/a/stack/redis/1/node.conf"
check "no nftables table of the nemesis is left" nemesis_tables_gone
finish
