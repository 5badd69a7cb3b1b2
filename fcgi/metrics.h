/* metrics.h - node metrics from shared memory in Prometheus text format. */
#ifndef CS_METRICS_H
#define CS_METRICS_H

#include <stddef.h>

struct shm_node;

/* Renders every metric of the node into buf (NUL-terminated, truncated at
 * cap). Returns the length written. */
size_t metrics_render(const struct shm_node *node, char *buf, size_t cap);

#endif
