/* lease_watch.c - the table of lease stamps a node watches (see lease_watch.h). */
#include "lease_watch.h"
#include "cs.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int lease_watch_init(struct lease_watch *lw)
{
    return cs_mutex_init_shared(&lw->lock);
}

int64_t lease_watch_seen(struct lease_watch *lw, const char *inc, int shard, int64_t stamp,
                         int64_t lease_ms, int64_t now_ms, int64_t *longest_ms)
{
    struct lease_watch_entry *e = NULL, *spare = NULL;
    int64_t age = 0;

    *longest_ms = lease_ms;
    int err = pthread_mutex_lock(&lw->lock);
    if (err == EOWNERDEAD) {
        /* A process killed holding the lock may have left an entry half
         * written (a new stamp with an old time): every watch starts over,
         * which only makes a return wait longer. */
        memset(lw->e, 0, sizeof(lw->e));
        pthread_mutex_consistent(&lw->lock);
    } else if (err != 0) {
        return 0;
    }
    for (int i = 0; i < LEASE_WATCH_N; i++) {
        struct lease_watch_entry *c = &lw->e[i];
        if (c->shard == shard && strcmp(c->inc, inc) == 0) {
            e = c;
            break;
        }
        /* A free entry, else the least recently read. */
        if (spare == NULL || (spare->inc[0] != '\0'
                              && (c->inc[0] == '\0' || c->used_ms < spare->used_ms)))
            spare = c;
    }
    if (e == NULL) {
        e = spare;
        memset(e, 0, sizeof(*e));
        snprintf(e->inc, sizeof(e->inc), "%s", inc);
        e->shard = shard;
        e->stamp = stamp;
        e->seen_ms = now_ms;
        e->used_ms = now_ms;
    } else if (now_ms < e->used_ms) {
        /* Read before the last one recorded: it may show a stamp that was
         * replaced since, and must not set the entry back. */
    } else if (e->stamp != stamp) {
        e->stamp = stamp;
        e->seen_ms = now_ms;
    } else {
        age = now_ms - e->seen_ms;
    }
    if (now_ms > e->used_ms)
        e->used_ms = now_ms;
    /* The lease field goes with the stamp (one HSET): a lost field must not
     * make a shorter lease count. */
    if (lease_ms > e->lease_ms)
        e->lease_ms = lease_ms;
    *longest_ms = e->lease_ms;
    pthread_mutex_unlock(&lw->lock);
    return age;
}
