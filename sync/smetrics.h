/* smetrics.h - coupon-sync counters and gauges, the Prometheus text file, and the
 * once-per-outage log of its two dependencies. */
#ifndef CS_SMETRICS_H
#define CS_SMETRICS_H

#include <stdint.h>

/* Every function here is thread-safe (atomics); call from any thread. */

/* The counters of coupon-sync's metrics file, in the order it writes them. */
enum smetrics_counter {
    SM_ROWS,       /* coupon rows inserted */
    SM_BATCHES,    /* batches committed */
    SM_ERRORS,     /* failed tasks and jobs */
    SM_DEAD,       /* entries moved to a dead-letter hash */
    SM_EXPIRED,    /* coupons marked expired */
    SM_RETURNED,   /* expired coupons whose stock went back */
    SM_MISMATCHES, /* reconciliation mismatches */
    SM_COUNTERS
};

void smetrics_add(enum smetrics_counter c, uint64_t n);
void smetrics_set_depth(int shard, int64_t depth);
/* Records a shard task that finished without error at wall-clock now_ms. */
void smetrics_success(int64_t now_ms);

uint64_t smetrics_rows(void);
uint64_t smetrics_errors(void);

enum smetrics_dep { SM_DEP_REDIS, SM_DEP_MYSQL };

/* A call to DEP failed with WHY. Logs an error only on the first failure of an
 * outage (not on every retry) and counts an error every time. */
void smetrics_dep_fail(enum smetrics_dep dep, const char *why);

/* A call to DEP worked: logs once that the outage is over, if there was one
 * and it began at least a second ago (a success within that second may be an
 * operation that started before the outage). */
void smetrics_dep_ok(enum smetrics_dep dep);

/* Writes every metric in Prometheus text format to PATH atomically (PATH.tmp
 * then rename). CS_OK, or CS_ERR after logging why. */
int smetrics_write(const char *path);

#endif
