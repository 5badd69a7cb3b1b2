/* idem.h - Idempotency-Key on admin writes. */
#ifndef CS_IDEM_H
#define CS_IDEM_H

struct worker;
struct req;

/* Serves an admin write that carries r->idem_key (not NULL). The caller must
 * be an admin (else the 401 / 403 of req_auth, nothing remembered). The
 * first request with a key of that admin runs handler; its answer is
 * recorded in admin_idempotency (sql/003_idempotency.sql) and answered to
 * every later request with the key (header Idempotent-Replayed: true), which
 * changes nothing. A key reused with another method, path or body answers
 * 422 IDEMPOTENCY_KEY_REUSED; one whose first request is not answered yet
 * (or whose worker died before recording it) 409 IDEMPOTENCY_KEY_IN_USE; a
 * malformed key 400; MySQL down 503 before anything was done. Keys are
 * remembered for a day. */
void idem_serve(struct worker *w, struct req *r, void (*handler)(struct worker *, struct req *));

#endif
