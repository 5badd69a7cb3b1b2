/* durability.c - the copies each shard's grants wait for, for metrics and health. */
#include "durability.h"
#include "conf.h"
#include "keys.h"
#include "rcluster.h"
#include "shm.h"

#include <stdatomic.h>

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
