#!/usr/bin/env bash
# alerts.sh - the shipped Prometheus rules (etc/prometheus/couponseize-alerts.yml)
# are valid and fire when they should: promtool check rules, then the unit
# tests beside them (promtool test rules), which include a dead coupon-sync.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

command -v promtool >/dev/null 2>&1 || skip_all "promtool is not installed (Debian: prometheus)"
dir=$top_srcdir/etc/prometheus
out=$(promtool check rules "$dir/couponseize-alerts.yml" 2>&1)
check_eq "promtool check rules ($out)" 0 $?
# promtool resolves rule_files relative to the test file.
out=$(promtool test rules "$dir/couponseize-alerts.test.yml" 2>&1)
rc=$?
check_eq "promtool test rules" 0 "$rc"
[[ $rc -eq 0 ]] || diag "$out"
# The README once carried CouponSyncStalled as `A and sum(B) > 0`: series with
# job/instance labels never match the label-less sum, so it could not fire.
# The shipped rule joins with on().
rule=$(sed -n '/alert: CouponSyncStalled/,/for:/p' "$dir/couponseize-alerts.yml")
check_match "CouponSyncStalled joins across jobs with on()" 'and on\(\)' "$rule"
finish
