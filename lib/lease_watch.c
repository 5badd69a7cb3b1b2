/* lease_watch.c - the table of lease stamps a node watches (see lease_watch.h). */
#include "lease_watch.h"
#include "cs.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int lease_watch_init(struct lease_watch *lw)
{
    pthread_mutexattr_t at;
    int err = pthread_mutexattr_init(&at);

    if (err == 0)
        err = pthread_mutexattr_setpshared(&at, PTHREAD_PROCESS_SHARED);
    if (err == 0)
        err = pthread_mutexattr_setrobust(&at, PTHREAD_MUTEX_ROBUST);
    if (err == 0)
        err = pthread_mutex_init(&lw->lock, &at);
    pthread_mutexattr_destroy(&at);
    if (err != 0) {
        errno = err;
        return CS_ERR;
    }
    return CS_OK;
}

int64_t lease_watch_seen(struct lease_watch *lw, const char *inc, int shard, int64_t stamp,
                         int64_t now_ms)
{
    struct lease_watch_entry *e = NULL, *spare = NULL;
    int64_t age = 0;

    /* A process that died holding the lock left whole entries behind. */
    if (pthread_mutex_lock(&lw->lock) == EOWNERDEAD)
        pthread_mutex_consistent(&lw->lock);
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
        snprintf(e->inc, sizeof(e->inc), "%s", inc);
        e->shard = shard;
        e->stamp = stamp;
        e->seen_ms = now_ms;
    } else if (e->stamp != stamp) {
        e->stamp = stamp;
        e->seen_ms = now_ms;
    } else if (now_ms > e->seen_ms) {
        age = now_ms - e->seen_ms;
    }
    if (now_ms > e->used_ms)
        e->used_ms = now_ms;
    pthread_mutex_unlock(&lw->lock);
    return age;
}
