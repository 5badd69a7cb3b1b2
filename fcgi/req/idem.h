/* idem.h - Idempotency-Key on admin writes. */
#ifndef CS_IDEM_H
#define CS_IDEM_H

#include "http.h"

struct mconn;
struct req;

/* What idem_begin() needs idem_end() to know: the key, its admin, and the
 * answer the handler writes meanwhile. */
struct idem_claim {
    char key[256];
    char sub[24];
    struct http_capture cap;
};

enum idem_step { IDEM_ANSWERED, IDEM_RUN };

/* Begins an admin write that carries r->idem_key (not NULL), on MySQL
 * through mc. The caller must be an admin (else the 401 / 403 of req_auth,
 * nothing remembered). The first request with a key of that admin answers
 * IDEM_RUN: the caller runs the handler, then idem_end(), which records its
 * answer in admin_idempotency (sql/003_idempotency.sql). Every later request
 * with the key is answered here with the recorded answer (header
 * Idempotent-Replayed: true), which changes nothing: IDEM_ANSWERED. So are a
 * key reused with another method, path or body (422 IDEMPOTENCY_KEY_REUSED),
 * one whose first request is not answered yet or whose worker died before
 * recording it (409 IDEMPOTENCY_KEY_IN_USE), a malformed key (400) and MySQL
 * down (503 before anything was done). Keys are remembered for a day. */
enum idem_step idem_begin(struct mconn *mc, struct req *r, struct idem_claim *ic);
void idem_end(struct mconn *mc, struct idem_claim *ic);

#endif
