/* meta.h - activity metadata as a worker sees it: a W-TinyLFU cache per
 * activity id, each entry loaded and refreshed on its own from
 * COUPON:ACTIVITY:META:{i} (+ ACTIVITY:VOIDED) at most once per
 * cache.refresh_ms, and served stale while Redis is away. Nothing here reads
 * the whole activity list. */
#ifndef CS_META_H
#define CS_META_H

#include <stddef.h>
#include <stdint.h>

#include "activity.h"

struct cs_conf;
struct rconn;
struct shm_node;
struct meta;

enum meta_kind { META_FOUND, META_ABSENT, META_VOIDED, META_UNAVAILABLE };

/* A worker's cache; shm is the node's segment (its epoch, its breaker). */
struct meta *meta_new(const struct cs_conf *conf, struct shm_node *shm);
void meta_free(struct meta *m);

/* Looks up activity ID, reading Redis through rc on a miss. META_FOUND copies it into *out. *stale is set when the
 * answer comes from an entry older than the refresh interval because Redis
 * could not be read. META_UNAVAILABLE: nothing known and Redis unreachable. */
enum meta_kind meta_lookup(struct meta *m, struct rconn *rc, int64_t id, struct activity *out,
                           int *stale);

/* As meta_lookup(), but a read of Redis that failed (a timeout behind a
 * slow fsync, a reset) is tried once more on a fresh connection while the
 * monotonic time is before DEADLINE_MS, so a Redis that was slow once gives
 * neither UNAVAILABLE nor a stale entry. Reads are idempotent: the second
 * answer can only be the truer one. The caller bounds Redis by the same
 * deadline (rconn_set_deadline()). */
enum meta_kind meta_lookup_within(struct meta *m, struct rconn *rc, int64_t id,
                                  struct activity *out, int *stale, int64_t deadline_ms);

/* Last remaining stock seen for ID (-1 if never), and its update; both only
 * know the activity of the last meta_lookup(). */
int64_t meta_last_remaining(struct meta *m, int64_t id);
void meta_set_remaining(struct meta *m, int64_t id, int64_t remaining);

/* Forgets what is known of ID (Redis said it has no stock field); the next
 * lookup of it reads Redis again. */
void meta_forget(struct meta *m, int64_t id);

/* Forgets everything: every next lookup reloads (after preheat / revoke). */
void meta_invalidate(struct meta *m);

/* Forgets everything in every worker of the node: each one's next lookup
 * reloads (after an admin change, so the node reads its own writes). */
void meta_invalidate_node(struct shm_node *shm);

/* Adds the cache counters since the last push to the node metrics. */
void meta_push_stats(struct meta *m, struct shm_node *shm);

#endif
