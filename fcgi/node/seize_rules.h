/* seize_rules.h - what a seize is answered before and after its script, as
 * arithmetic on what the handler read: its deadline and waits, the checks
 * that cost no Redis call, and the one reading of the seize script's
 * answers. No connection, no shared memory: tested alone. */
#ifndef CS_SEIZE_RULES_H
#define CS_SEIZE_RULES_H

#include <stdint.h>

#include "activity.h"
#include "req/http.h"

/* The margin kept for the answer's way back: a tenth of budget_ms, at most
 * 100 ms. */
int seize_rules_margin(int budget_ms);

/*
 * The seize's deadline (monotonic ms): budget_ms from taken_ms (when the
 * worker took the request, monotonic) less the margin, and less the time it
 * waited for a worker when the web server said when it got it (got_ms,
 * epoch ms by its clock; <= 0 unknown): by the web server's clock against
 * ours (now_ms epoch, mono_ms monotonic), so only a plausible wait (under
 * ten budgets) is believed. A seize whose budget is nearly gone still
 * gets one short try of at most the margin, and never past the budget's
 * end: a deadline at or before mono_ms means the budget is gone.
 */
int64_t seize_rules_deadline(int budget_ms, int64_t taken_ms, int64_t got_ms, int64_t now_ms,
                             int64_t mono_ms);

/* How long the first EVALSHA may wait with left ms to the deadline: all but
 * the room for one resend on a fresh connection (a command timeout, at most
 * a quarter of what is left). */
int seize_rules_first_wait(int command_timeout_ms, int64_t left);

/*
 * The checks of cached facts before any Redis call, in this order: the
 * activity's groups against the caller's (NOT_ELIGIBLE), its window against
 * the bounds [lo_ms, hi_ms] of Redis' clock (VOIDED, NOT_STARTED, ENDED;
 * only a window missed by the whole bound is refused: the script, by Redis'
 * clock, is the authority), then the node's sold-out hint (SOLD_OUT).
 * CODE_OK when the seize is worth sending.
 */
enum cs_code seize_rules_admit(const struct activity *a, const char (*groups)[40], int ngroups,
                               int64_t lo_ms, int64_t hi_ms, int soldout_hint);

/* The answer of the seize script (lua/seize.lua, or one entry of
 * lua/seize_batch.lua; enum script_seize) as a request outcome: SEIZED for
 * the stock left (>= 0); CODE_INTERNAL_ERROR for an answer it never gives. */
enum cs_code seize_rules_outcome(long long answer);

#endif
