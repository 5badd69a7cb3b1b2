#!/usr/bin/env bash
# pages.sh - the buyer and operator pages (www/, served by the stack's nginx
# from the shipped snippet under /market/ui/) in headless Chromium driven over
# WebDriver (chromedriver): every sale by name with its state and a countdown
# by the server's clock; one seize per button, checked in the server's
# metrics; remaining stock falling on the operator page under load; a top-up
# done from the page; the node reserves of a sale (fallback.reserve > 0) and
# the return of a lost node's reserve from the page. Screenshots:
# tests/integration/pages-*.png in the build tree. The checks themselves are
# in pages.py.
set -u

# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib.sh"

command -v chromium >/dev/null 2>&1 || skip_all "chromium is not installed"
command -v chromedriver >/dev/null 2>&1 || skip_all "chromedriver is not installed"
[[ -x $LOADGEN ]] || skip_all "$LOADGEN is not built"

# coupon-sync's periodic preheat an hour apart: the sales created through the
# admin API must reach the pages because the API published them, not because
# a preheat (5 s on the test stack) happened to run meanwhile.
export COUPON_CONF_OVERRIDES="preheat.interval_s=3600
fallback.reserve=20"
cs_stack_up
OUT=$top_builddir/tests/integration
mkdir -p "$OUT"
rm -f "$OUT"/pages-*.png

last=""
while IFS= read -r line; do
    last=$line
    case $line in
    PASS\ *) ok "${line#PASS }" ;;
    FAIL\ *)
        line=${line#FAIL }
        not_ok "${line%% :: *}" "${line#* :: }"
        ;;
    *) printf '%s\n' "$line" ;;
    esac
done < <(timeout 240 python3 "$top_srcdir/tests/integration/pages.py" "$OUT" 2>&1; echo "EXIT $?")
# The scenario must have run to its end (an exception is a failure too).
check_eq "pages.py ran to the end" "EXIT 0" "$last"
finish
