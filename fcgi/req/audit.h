/* audit.h - the admin_audit trail: one row per admin action and its result. */
#ifndef CS_AUDIT_H
#define CS_AUDIT_H

struct mconn;
struct req;

/* Appends a row to admin_audit for the request just answered: the admin's
 * sub (r->who), r->audit_action, the activity (r->audit_id as the handler
 * set it once it knew the activity; NULL when 0), the body as received, and
 * what was answered
 * (r->code, r->msg). Called after the handler, so the row holds the result.
 * A failure to write is logged and otherwise ignored: the action itself has
 * already happened (or not) and was answered. */
void audit_record(struct mconn *mc, struct req *r);

#endif
