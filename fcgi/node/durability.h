/* durability.h - how many copies a grant on each shard waits for under the
 * durability rule (redis.wait_replicas), as the metrics and health show it. */
#ifndef CS_DURABILITY_H
#define CS_DURABILITY_H

struct cs_conf;
struct rconn;
struct shm_node;

/* Records for the metrics how many replicas a grant on shard waits for now
 * (copies; -1 unknown) under the durability rule. */
void durability_note(struct shm_node *shm, int shard, int copies);

/* On a cluster with redis.wait_replicas > 0: the durability rule for every
 * shard, read now through rc (cached per master, see rconn_copies()) into
 * copies[] (-1: its master is unknown or down) and recorded for the metrics.
 * Returns how many shards run with fewer copies than asked; 0 otherwise. */
int durability_read(const struct cs_conf *c, struct rconn *rc, struct shm_node *shm,
                    int copies[]);

/* On a single Redis (not redis.cluster): 1 when it logs every write to its
 * AOF and fsyncs it before answering (appendonly yes, appendfsync always,
 * read with CONFIG GET through rc), 0 when it does not, -1 when it cannot
 * be told (Redis unreachable, CONFIG refused). A 0 is logged as a warning
 * naming the setting, at most once per 10 minutes per process: the node
 * sells all the same, but a Redis crash may lose grants answered SEIZED.
 * -1 on a cluster (rcluster checks each node itself). */
int durability_single(const struct cs_conf *c, struct rconn *rc);

#endif
