/* actlist.h - ACTIVITY:LIST, the activities on sale as one JSON array,
 * written only by a check-and-set on its generation, so it never goes back
 * in time. */
#ifndef CS_ACTLIST_H
#define CS_ACTLIST_H

#include <stddef.h>
#include <stdint.h>

struct mconn;
struct preheat_mark;
struct preheat_vec;
struct rconn;

/* Tries at rewriting ACTIVITY:LIST before giving up to the next preheat:
 * each lost try means another writer published a newer MySQL read. */
#define ACTLIST_TRIES 5

/* The list's generation into *gen (0 before the first write): read before
 * the MySQL read a list write is made from. */
int actlist_gen(struct rconn *rc, long long *gen, char *err, size_t errlen);

/* Sets the list to the JSON array of vec, made from a MySQL read that began
 * after generation gen was read, unless it holds that already. CS_OK with
 * *stale = 1 when another writer wrote meanwhile: nothing was written, and
 * the caller reads MySQL again. */
int actlist_write(struct rconn *rc, const struct preheat_vec *vec, long long gen, int *stale,
                  char *err, size_t errlen);

/* Puts activity id's element into the list in place: vec holds it as MySQL
 * had it after generation gen was read, or nothing (it left the list). One
 * read and one write of the list. CS_OK with *stale = 1 when another writer
 * wrote since gen (nothing written); CS_ERR when the list cannot be read or
 * written, or is malformed (then *malformed = 1). */
int actlist_splice(struct rconn *rc, int64_t id, const struct preheat_vec *vec, long long gen,
                   int *stale, int *malformed, char *err, size_t errlen);

/* Rewrites the list from a fresh MySQL read, never back in time (a write
 * holds only when no one wrote since the read began). CS_ERR with a message
 * in err. */
int actlist_rewrite(struct mconn *mc, struct rconn *rc, int horizon_days, int grace_s,
                    char *err, size_t errlen);

/* Remembers in mark what the list was written with (vec). */
void actlist_mark(struct preheat_mark *mark, const struct preheat_vec *vec);

/* Whether an activity of vec is not in the list as mark remembers it. */
int actlist_differs(const struct preheat_mark *mark, const struct preheat_vec *vec);

#endif
