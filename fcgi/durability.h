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

#endif
