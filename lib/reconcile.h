/* reconcile.h - brings one activity's Redis stock back to MySQL's numbers. */
#ifndef CS_RECONCILE_H
#define CS_RECONCILE_H

#include <stddef.h>
#include <stdint.h>

struct mconn;
struct rconn;

enum reconcile_outcome {
    RECONCILE_DONE,            /* before / after / sold are set (after == before: nothing to do) */
    RECONCILE_NO_SUCH,         /* no such activity in MySQL */
    RECONCILE_ENDED,           /* the sale is over (its seize list may be cleaned up) */
    RECONCILE_VOIDED,          /* revoked: the stock field is the tombstone */
    RECONCILE_NOT_PREHEATED,   /* no stock field: preheat sets it from MySQL */
    RECONCILE_BUSY,            /* the row changed within guard_s: a top-up's Redis step may still run */
};

struct reconcile_result {
    enum reconcile_outcome outcome;
    int64_t total;             /* MySQL total_num */
    int64_t before, after;     /* Redis stock before and after */
    int64_t sold;              /* entries in the seize list */
};

/* Sets activity ID's Redis stock to MySQL's total_num minus the users in
 * its seize list (every grant, synced or still queued), in one script, so a
 * seize running beside it is counted exactly once; safe while the sale runs.
 * It holds the MySQL row lock meanwhile, so no update commits in between,
 * and refuses (RECONCILE_BUSY) when the row changed within the last guard_s
 * seconds: an update's own Redis step, which runs after its commit, may not
 * have landed yet. CS_OK with *res filled, or CS_ERR (MySQL or Redis down;
 * message in err; Redis was not changed unless the script ran). */
int reconcile_activity(struct mconn *mc, struct rconn *rc, int64_t id, int guard_s,
                       struct reconcile_result *res, char *err, size_t errlen);

#endif
