/* keys.h - the one place that builds Redis key names (doc/internals.md, "Redis keys"). */
#ifndef CS_KEYS_H
#define CS_KEYS_H

#include <stddef.h>
#include <stdint.h>

#define KEYS_SHARDS 10
#define KEYS_MAX 96

#define KEY_ACTIVITY_LIST "ACTIVITY:LIST"
/* Generation of ACTIVITY:LIST: bumped by every write of the list, so a writer
 * whose MySQL read is older than the last write cannot put the list back in
 * time, and a node's copy is re-read only when it changed. Its hash tag is
 * the list's own name, so both keys share one Redis Cluster slot. */
#define KEY_ACTIVITY_LIST_GEN "{" KEY_ACTIVITY_LIST "}:GEN"
/* Written by the health route's probe (a write that fails as a seize would). */
#define KEY_HEALTH "COUPON:HEALTH"
/* Set of revoked activity ids, so every node answers VOIDED (not NO_SUCH_ACTIVITY). */
#define KEY_ACTIVITY_VOIDED "ACTIVITY:VOIDED"

/* Shard of an activity: id % 10. */
static inline int keys_shard(int64_t activity_id)
{
    return (int)(activity_id % KEYS_SHARDS);
}

/* Each builder writes a NUL-terminated key into buf (at least KEYS_MAX bytes)
 * and returns its length. */
size_t keys_stock(char *buf, int shard);                       /* COUPON:RESOURCE:STOCK:{i} */
size_t keys_seize_list(char *buf, int64_t activity_id);        /* COUPON:SEIZE:LIST:<id>_{i} */
size_t keys_queue(char *buf, int shard);                       /* QUEUE:COUPON:SEIZE:SYNC:{i} */
size_t keys_dead(char *buf, int shard);                        /* QUEUE:COUPON:SEIZE:DEAD:{i} */
size_t keys_sync_lock(char *buf, int shard);                   /* LOCK:COUPON:SYNC:{i} */
/* A counter written only so that a following WAIT has a write to wait for. */
size_t keys_fence(char *buf, int shard);                       /* COUPON:FENCE:{i} */
/* COUPON:RESERVE:CLAIM:<incarnation>: "host boot-id pid" of the one live
 * instance of that node incarnation (internals.md rule 15). */
size_t keys_reserve_claim(char *buf, const char *incarnation);
size_t keys_meta(char *buf, int shard);                        /* COUPON:ACTIVITY:META:{i} */
size_t keys_window(char *buf, int shard);                      /* COUPON:ACTIVITY:WINDOW:{i} */
size_t keys_version(char *buf, int shard);                     /* COUPON:ACTIVITY:VER:{i} */
size_t keys_ends(char *buf, int shard);                        /* COUPON:ACTIVITY:ENDS:{i} */
/* Reserves (doc/internals.md, "The reserves"):
 * COUPON:RESERVE:{i} holds, per activity, "<id>:<incarnation>" -> the open
 * reserve of that node instance (tokens set aside, less those replayed),
 * "<id>" -> how many epochs of it are open, "<id>:held" -> the sum of its
 * open reserves; and "restored" -> bumped by every restore of the shard.
 * COUPON:RESERVE:EPOCH:<id>_{i} holds "<incarnation>:<epoch>" -> "open:<n>"
 * or "closed", and the replay markers "<incarnation>:<epoch>:<token>".
 * COUPON:RESERVE:DEAD:{i} holds tokens that had nothing to take them from. */
size_t keys_reserve(char *buf, int shard);                     /* COUPON:RESERVE:{i} */
size_t keys_reserve_epochs(char *buf, int64_t activity_id);    /* COUPON:RESERVE:EPOCH:<id>_{i} */
size_t keys_reserve_dead(char *buf, int shard);                /* COUPON:RESERVE:DEAD:{i} */

/* Queue field "<activityId>:<userId>". */
size_t keys_queue_field(char *buf, int64_t activity_id, int64_t user_id);

/* Parses a queue field; CS_OK with both ids, or CS_ERR when malformed. */
int keys_parse_queue_field(const char *field, size_t len, int64_t *activity_id,
                           int64_t *user_id);

/* Redis Cluster slot of a key: CRC16 of its {hash tag} (or the whole key) mod 16384. */
unsigned keys_slot(const char *key, size_t len);

/* The Redis Cluster slot of shard's keys (its {shard} tag). */
unsigned keys_shard_slot(int shard);

#endif
