/* listcopy.h - the list route's per-node copy of ACTIVITY:LIST. One worker at a
 * time, every cache.refresh_ms, checks the list's generation and when it
 * changed reads the list from Redis and writes it into a
 * POSIX shared-memory segment (an offset index + each activity's JSON); every
 * worker of the node answers pages from that segment, parsing only the
 * activities of the page. No worker keeps the whole list in its own memory. */
#ifndef CS_LISTCOPY_H
#define CS_LISTCOPY_H

#include <stddef.h>
#include <stdint.h>

#include "activity.h"

struct cs_conf;
struct shm_node;

/* A failed rebuild is tried again after this (ms); a good copy is checked
 * against Redis every cache.refresh_ms, and the list itself re-read when its
 * generation changed or LISTCOPY_FULL_MS passed (a list set by hand). */
#define LISTCOPY_REFRESH_MS 1000
#define LISTCOPY_FULL_MS 10000

struct listcopy_page {
    struct activity *acts;     /* xmalloc'ed, n of them */
    size_t n;
    size_t total;              /* activities in the whole list */
    int stale;                 /* the copy is old: Redis could not be read */
};

/* Fills *out with the activities [(page-1)*size, page*size) of the list, in
 * list order (start time, id), voided ones marked VOIDED. page >= 1,
 * size >= 1. CS_ERR when no copy exists and Redis cannot be read. The caller
 * frees out with listcopy_page_free(). */
int listcopy_page(const struct cs_conf *conf, struct shm_node *shm, size_t page, size_t size,
               struct listcopy_page *out);
void listcopy_page_free(struct listcopy_page *p);

/* After an admin change on this node: the copy is rebuilt from Redis before
 * this returns (within a few seconds at worst), so the node lists its own
 * writes at once. A failure leaves the copy to the next refresh. */
void listcopy_invalidate(const struct cs_conf *conf, struct shm_node *shm);

/* Removes the node's current copy (at supervisor exit). */
void listcopy_unlink(struct shm_node *shm, const char *shm_name);

#endif
