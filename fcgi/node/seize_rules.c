/* seize_rules.c - a seize's deadline, its checks before Redis, and the
 * meaning of the seize script's answers. */
#include "seize_rules.h"
#include "scripts.h"

int seize_rules_margin(int budget_ms)
{
    return budget_ms / 10 < 100 ? budget_ms / 10 : 100;
}

int64_t seize_rules_deadline(int budget_ms, int64_t taken_ms, int64_t got_ms, int64_t now_ms,
                             int64_t mono_ms)
{
    int margin = seize_rules_margin(budget_ms);
    int64_t deadline = taken_ms + budget_ms - margin;
    if (got_ms > 0) {
        /* The time it waited for a worker (the shipped snippets send when
         * the web server got it) counts too. It can only shorten the
         * deadline, and a clock far off changes nothing. */
        int64_t queued = now_ms - (mono_ms - taken_ms) - got_ms;
        if (queued > 0 && queued < 10 * (int64_t)budget_ms)
            deadline -= queued;
    }
    /* A seize that waited for a worker until its budget was nearly gone
     * still gets one short try, at most the margin: a Redis that answers at
     * once (another shard, a stall that just ended) serves it, a silent one
     * holds it no longer than that. The try uses the margin kept for the
     * answer's way back, never more: the answer is due when the budget
     * ends, and a seize that waited the whole budget for a worker is
     * answered at once, unsent. */
    if (deadline - mono_ms < margin) {
        int64_t end = deadline + margin;
        deadline = mono_ms + margin < end ? mono_ms + margin : end;
    }
    return deadline;
}

int seize_rules_first_wait(int command_timeout_ms, int64_t left)
{
    int64_t reserve = command_timeout_ms;
    if (reserve > left / 4)
        reserve = left / 4;
    return (int)(left - reserve);
}

enum cs_code seize_rules_admit(const struct activity *a, const char (*groups)[40], int ngroups,
                               int64_t lo_ms, int64_t hi_ms, int soldout_hint)
{
    /* Eligibility is the activity's rule alone: decided before the script,
     * so a user outside its groups never costs Redis a call. */
    if (!activity_groups_allow(a, groups, ngroups))
        return CODE_NOT_ELIGIBLE;
    if (a->status == ACT_VOIDED)
        return CODE_VOIDED;
    if (hi_ms < a->start_ms)
        return CODE_NOT_STARTED;
    if (lo_ms >= a->end_ms)
        return CODE_ENDED;
    if (soldout_hint)
        return CODE_SOLD_OUT;
    return CODE_OK;
}

enum cs_code seize_rules_outcome(long long answer)
{
    if (answer >= 0)
        return CODE_SEIZED;
    switch (answer) {
    case SCRIPT_SEIZE_ALREADY: return CODE_ALREADY_SEIZED;
    case SCRIPT_SEIZE_SOLD_OUT: return CODE_SOLD_OUT;
    case SCRIPT_SEIZE_FOR_NOW: return CODE_SOLD_OUT; /* for now: reserves are open */
    case SCRIPT_SEIZE_UNKNOWN: return CODE_NO_SUCH_ACTIVITY;
    case SCRIPT_SEIZE_NOT_STARTED: return CODE_NOT_STARTED;
    case SCRIPT_SEIZE_ENDED: return CODE_ENDED;
    default: return CODE_INTERNAL_ERROR;
    }
}
