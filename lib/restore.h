/* restore.h - an activity's stock field, rebuilt with its seize list from
 * MySQL and the queue when Redis lost its data. Used by preheat. */
#ifndef CS_RESTORE_H
#define CS_RESTORE_H

#include <stddef.h>

struct activity;
struct mconn;
struct rconn;

/*
 * Creates the stock field of a when absent; a present one (a live sale) is
 * never touched. When MySQL or the queue already hold coupons of it (Redis
 * lost its data), the seize list is rebuilt first and the stock becomes
 * total - in MySQL - queued. *created / *restored are set when this call
 * created the field. CS_ERR with a message in err on failure.
 */
int restore_stock(struct mconn *mc, struct rconn *rc, const struct activity *a, int *created,
                  int *restored, char *err, size_t errlen);

#endif
