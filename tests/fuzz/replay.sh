#!/usr/bin/env bash
# replay.sh - runs every input of the fuzzing corpus (tests/fuzz/corpus/) and
# every crash ever found (tests/fuzz/crashes/) through the libFuzzer harnesses
# once: a regression test for what fuzzing found. Skipped (77) only when
# configure found no clang with libFuzzer.
set -u
src=${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
build=${top_builddir:-$src}
if [ "${HAVE_FUZZ:-no}" != yes ]; then
    echo "SKIP: configure found no clang with libFuzzer (Debian: clang libclang-rt-dev)"
    exit 77
fi

pass=0
fail=0
for n in body query token params conf; do
    bin=$build/tests/fuzz/fuzz_$n
    if [ ! -x "$bin" ]; then
        echo "FAIL: $bin was not built"
        fail=$((fail + 1))
        continue
    fi
    mapfile -t inputs < <(find "$src/tests/fuzz/corpus/$n" "$src/tests/fuzz/crashes/$n" \
        -type f ! -name .keep 2>/dev/null | sort)
    if [ ${#inputs[@]} -eq 0 ]; then
        echo "FAIL: no corpus for $n"
        fail=$((fail + 1))
        continue
    fi
    # Files as arguments: libFuzzer runs each once and does not fuzz.
    log=$(mktemp)
    if "$bin" -timeout=10 -rss_limit_mb=2048 "${inputs[@]}" >"$log" 2>&1; then
        echo "ok: fuzz_$n replayed ${#inputs[@]} inputs"
        pass=$((pass + 1))
    else
        echo "FAIL: fuzz_$n on its corpus:"
        grep -E 'ERROR|SUMMARY|Running:|runtime error' "$log" | tail -n 20
        fail=$((fail + 1))
    fi
    rm -f "$log"
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
