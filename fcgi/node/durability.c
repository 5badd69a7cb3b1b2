/* durability.c - the copies each shard's grants wait for, for metrics and health. */
#include "durability.h"
#include "conf.h"
#include "cs.h"
#include "keys.h"
#include "log.h"
#include "rcluster.h"
#include "rconn.h"
#include "shm.h"

#include <stdatomic.h>
#include <string.h>

/* How often a process repeats the warning about a Redis that does not
 * persist each write. */
#define DURABILITY_WARN_MS (10 * 60 * 1000)

void durability_note(struct shm_node *shm, int shard, int copies)
{
    if (shard < 0 || shard >= RCLUSTER_SHARDS)
        return;
    _Atomic int32_t *v = &shm->cluster.shard_copies[shard];
    int32_t stored = copies < 0 ? 0 : copies + 1; /* 0: unknown (a new segment is zeroed) */
    if (atomic_load_explicit(v, memory_order_relaxed) != stored)
        atomic_store(v, stored);
}

int durability_read(const struct cs_conf *c, struct rconn *rc, struct shm_node *shm,
                    int copies[])
{
    int degraded = 0;

    for (int i = 0; i < KEYS_SHARDS; i++) {
        copies[i] = -1;
        if (!c->redis_cluster || c->redis_wait_replicas <= 0)
            continue;
        copies[i] = rcluster_slot_copies(rc, keys_shard_slot(i), c->redis_wait_replicas);
        durability_note(shm, i, copies[i]);
        degraded += copies[i] >= 0 && copies[i] < c->redis_wait_replicas;
    }
    if (c->redis_cluster)
        atomic_store(&shm->cluster.copies_wanted, c->redis_wait_replicas);
    return degraded;
}

int durability_single(const struct cs_conf *c, struct rconn *rc)
{
    static const struct {
        const char *name, *want;
    } need[] = {{"appendonly", "yes"}, {"appendfsync", "always"}};
    static _Thread_local int64_t warned_ms; /* each worker (thread) warns on its own */

    if (c->redis_cluster)
        return -1;
    for (size_t k = 0; k < CS_ARRAY_LEN(need); k++) {
        redisReply *r = rconn_command(rc, NULL, "CONFIG GET %s", need[k].name);
        if (r == NULL)
            return -1;
        int known = r->type == REDIS_REPLY_ARRAY && r->elements == 2
                    && rconn_reply_is_str(r->element[1]);
        int ok = known && strcmp(r->element[1]->str, need[k].want) == 0;
        if (known && !ok) {
            int64_t now = cs_mono_ms();
            if (warned_ms == 0 || now - warned_ms >= DURABILITY_WARN_MS) {
                warned_ms = now;
                log_warn("redis %s:%d has %s %s, not %s: a Redis crash or power loss can lose "
                         "grants already answered SEIZED. This node sells all the same. Include "
                         "couponseize-redis.conf in its redis.conf (doc/operations.md, \"Redis\")",
                         c->redis_host, c->redis_port, need[k].name, r->element[1]->str,
                         need[k].want);
            }
        }
        freeReplyObject(r);
        if (!known)
            return -1;
        if (!ok)
            return 0;
    }
    return 1;
}
