#!/usr/bin/env bash
# reserve_pause.sh - a slow Redis is waited out with reserves on (internals.md
# rule 4, and S3, the budget): under a load of 32 connections
# (fallback.reserve = 200, budget_ms = 1000), Redis write pauses of 300, 700
# and 900 ms (CLIENT PAUSE ... WRITE), ten of each, all shorter than the
# budget: no seize is answered UNAVAILABLE or granted from the reserve but
# those whose budget went while they waited for a worker (never sent to Redis,
# counted in couponseize_seize_budget_gone_total), 99 % of the answers come
# within the budget, and every user told SEIZED holds a coupon in MySQL. The
# breaker never opens on failures while Redis answers; a stretch of a budget
# with no seize answered (a machine stalled past a 900 ms pause's end) opens
# it only when Redis does not answer a PING on a new connection either, shown
# with what it answered. Then a write pause of 1.5 budgets, with the same
# load: the breaker asks, stays closed, and turns nobody away.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

[[ -x $LOADGEN ]] || skip_all "tests/bench/loadgen is not built (make check builds it)"
K=200
BUDGET=1000
export COUPON_WORKERS=4
export COUPON_ACCESS_LOG=1
export COUPON_CONF_OVERRIDES="fallback.reserve=$K
fallback.budget_ms=$BUDGET
fallback.lease_ms=30000
${COUPON_CONF_OVERRIDES:-}"
cs_stack_up
ADMIN=$(mint_jwt 1 admin)

A=4801
mk_activity $A 1000000 -60 3600
http POST /market/admin/coupon/preheat '' "$ADMIN"
check "the node set a reserve of $K aside and opened it" wait_for 20 reserves_open_on
log=$COUPON_DIR/pause.log
spent0=$(metric couponseize_reserve_spent_total)
opened0=$(metric couponseize_breaker_opened_total)
gone0=$(metric couponseize_seize_budget_gone_total)
t0=$(date +%s%3N)
load_until_stopped $A $((A * 1000000)) "$log" || not_ok "the load got going"
# Each pause ends by the clock; the next one comes once the load has been
# answered again (50 answers after the pause), so a slow machine gets no
# pauses back to back.
for round in 1 2 3 4 5 6 7 8 9 10; do
    for ms in 300 700 900; do
        rcli CLIENT PAUSE "$ms" WRITE >/dev/null
        wait_past_ms $(($(date +%s%3N) + ms))
        wait_answers "$log" 50 || not_ok "round $round: the load is answered after a $ms ms pause"
    done
done
kill -TERM "$LOAD_PID"
wait "$LOAD_PID"
t1=$(date +%s%3N)
check "coupon-sync drained the queue" wait_for 60 drained $((A % 10))
seize_judge "pauses" $A "$log" $((A * 1000000))
# How the breaker opened, if it did: by failures (a timeout inside a pause
# counted as one: the defect this test was written for) or because no seize
# at all was answered for a whole budget. The second needs the machine to
# stall past the end of a 900 ms pause (a second stack beside this one);
# then the pause was, as the node saw it, not shorter than the budget, and
# the reserve and UNAVAILABLE answers while the breaker was open are its
# rules, shown and not judged. Anything else must turn nobody away.
opens=$(grep -c 'redis breaker opened' "$COUPON_DIR/fcgi.log")
silent=$(grep -c 'redis breaker opened: no seize answered for' "$COUPON_DIR/fcgi.log")
check_eq "the breaker never opened on failures while Redis answered" "$opens" "$silent"
# A seize whose budget went while it waited for a worker is answered at
# once without Redis: from the reserve (it never reached Redis, rule 4) or
# UNAVAILABLE. No other is turned away.
gone=$(($(metric couponseize_seize_budget_gone_total) - gone0))
spent=$(($(metric couponseize_reserve_spent_total) - spent0))
diag "seizes whose budget was gone when a worker took them (answered unsent): $gone;" \
    "reserve grants: $spent"
if ((silent == 0)); then
    check "no UNAVAILABLE or reserve grant but for seizes whose budget was gone ($UNAVAILABLE + $spent <= $gone)" \
        test $((UNAVAILABLE + spent)) -le "$gone"
else
    diag "KNOWN: $silent breaker openings after a whole budget without any answer (a stalled" \
        "machine at a pause's end): $UNAVAILABLE UNAVAILABLE while it was open"
fi
check "the pauses were felt (max $MAX_MS ms >= 800 ms)" test "$MAX_MS" -ge 800
# The pauses are waited out within the budget: 99 % of the answers are in
# by then. The slowest one is budget.sh's to judge (here one stall of the
# whole machine beside a second stack's load can hold a worker past it).
# Judged as nginx timed them (the budget is the server's promise, from when
# the web server got the request); the client's view, which on a loaded
# machine adds the load generator's own delays, is shown beside it. The
# promise is the budget plus the margin (doc/failures.md): a seize that
# waited for a worker behind a pause gets one short try of the margin, and
# with 32 connections on 4 workers about 1 % of the answers wait through a
# 900 ms pause, so the p99 sits at the budget by construction (934-1009 ms
# at the client over seven runs).
MARGIN_MS=$((BUDGET / 10 < 100 ? BUDGET / 10 : 100))
smax=$(server_max_ms "$t0" "$t1") sp99=$(server_p99_ms "$t0" "$t1")
diag "the slowest answer took $smax ms in nginx, $MAX_MS ms at the client;" \
    "p99 $sp99 ms in nginx, $P99_MS ms at the client"
check "99 % of the answers within the budget + margin (p99 $sp99 ms in nginx)" \
    test "$sp99" -ge 0 -a "$sp99" -le $((BUDGET + MARGIN_MS))
# A reserve grant needs the breaker open or the budget gone (every other
# seize reached Redis): with no breaker opened, only those; one that
# flipped for a few ms (below) may have granted a few more, truthfully.
opened=$(($(metric couponseize_breaker_opened_total) - opened0))
if ((opened == 0)); then
    check "nothing was granted from the reserve but seizes whose budget was gone ($spent <= $gone)" \
        test "$spent" -le "$gone"
elif ((silent == 0)); then
    check "nothing was granted from the reserve but while a breaker was open ($spent)" \
        test "$spent" -le $((32 + gone))
else
    check "the reserve granted no more than it holds ($spent)" test "$spent" -le "$K"
fi
# Nobody was turned away but seizes whose budget was gone (above); a
# breaker that opened and closed again within the same pass harmed no one
# and is shown, not judged: a machine that stalls past a 900 ms pause gives
# Redis a whole budget without an answer.
diag "breakers opened: $(($(metric couponseize_breaker_opened_total) - opened0))"
diag "answers: $(awk 'NR > 1 { n[$3]++ } END { for (c in n) printf "%s=%d ", c, n[c] }' "$log")"
diag "UNAVAILABLE by time (ms since start): $(awk 'NR > 1 && $3 == "UNAVAILABLE" { print int($1 / 100) * 100 }' "$log" | uniq -c | head -n 20 | tr -s ' \n' ' ')"

# A write pause of one and a half budgets: seizes go unanswered for more
# than a budget, as when the machine stalls past a pause's end, but Redis
# answers a PING on a new connection all along, so the breaker stays closed
# (a cut or stopped Redis would not answer it). Users whose budget ran out
# inside it are told UNKNOWN_OUTCOME, and those after it are granted by
# Redis. Only seizes that waited for a worker (32 connections on 4) until
# their budget was gone are answered without Redis: at once, from the
# reserve or UNAVAILABLE, each counted in couponseize_seize_budget_gone_total.
log2=$COUPON_DIR/pause-long.log
opened0=$(metric couponseize_breaker_opened_total)
spent0=$(metric couponseize_reserve_spent_total)
alive0=$(metric couponseize_breaker_asked_alive_total)
gone0=$(metric couponseize_seize_budget_gone_total)
load_until_stopped $A $((A * 1000000 + 500000)) "$log2" || not_ok "(long) the load got going"
rcli CLIENT PAUSE $((BUDGET * 3 / 2)) WRITE >/dev/null
wait_past_ms $(($(date +%s%3N) + BUDGET * 3 / 2))
wait_answers "$log2" 500 || not_ok "(long) the load is answered after the pause"
kill -TERM "$LOAD_PID"
wait "$LOAD_PID"
check "(long) coupon-sync drained the queue" wait_for 60 drained $((A % 10))
seize_judge "(long) a pause of 1.5 budgets" $A "$log2" $((A * 1000000 + 500000))
asked=$(($(metric couponseize_breaker_asked_alive_total) - alive0))
diag "(long) asked whether Redis is there and it answered: $asked; answers:" \
    "$(awk 'NR > 1 { n[$3]++ } END { for (c in n) printf "%s=%d ", c, n[c] }' "$log2")"
check "(long) seizes went unanswered for a budget: the breaker asked Redis ($asked)" \
    test "$asked" -ge 1
check_eq "(long) the breaker did not open" 0 \
    "$(($(metric couponseize_breaker_opened_total) - opened0))"
gone=$(($(metric couponseize_seize_budget_gone_total) - gone0))
spent=$(($(metric couponseize_reserve_spent_total) - spent0))
diag "(long) seizes whose budget was gone when a worker took them: $gone; reserve grants: $spent"
check "(long) no UNAVAILABLE or reserve grant but for seizes whose budget was gone ($UNAVAILABLE + $spent <= $gone)" \
    test $((UNAVAILABLE + spent)) -le "$gone"

finish
