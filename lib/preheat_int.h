/* preheat_int.h - the activities a preheat reads from MySQL, shared by
 * preheat.c, actlist.c and revoke.c; not part of the library's interface. */
#ifndef CS_PREHEAT_INT_H
#define CS_PREHEAT_INT_H

#include "activity.h"

#include <stddef.h>
#include <stdint.h>

struct mconn;

struct preheat_vec {
    struct activity *v;
    unsigned char *has_coupons; /* parallel to v: MySQL holds coupons or reserves of it */
    char **txt;                /* parallel to v: activity_to_text(), made once */
    char (*win)[48];           /* parallel to v: WINDOW value "<startMs>,<endMs>" */
    int64_t *ver;              /* parallel to v: updated_at in microseconds, the version */
    size_t n, cap;
};

/* Selects the activities preheat serves (one of them when id > 0; with
 * since_s > 0 only those changed or entered the horizon since then), in one
 * query. On CS_OK vec holds them (caller frees with preheat_vec_free()). */
int preheat_select(struct mconn *mc, int horizon_days, int grace_s, int64_t id, int64_t since_s,
                   struct preheat_vec *vec, char *err, size_t errlen);

void preheat_vec_free(struct preheat_vec *vec);

#endif
