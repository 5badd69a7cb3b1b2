/* metrics.h - node metrics from shared memory in Prometheus text format. */
#ifndef CS_METRICS_H
#define CS_METRICS_H

#include <stddef.h>

struct shm_node;

/* Renders every metric of the node into buf (NUL-terminated, truncated at
 * cap); lease_ms is fallback.lease_ms (the reserve lease's length). Returns
 * the length written. */
size_t metrics_render(const struct shm_node *node, int lease_ms, char *buf, size_t cap);

/* What metrics_emit() appends to: buf of cap bytes, len of them written
 * (always NUL-terminated; what does not fit is cut). */
struct metrics_out {
    char *buf;
    size_t cap, len;
};

/* Appends a printf-formatted piece to o. */
void metrics_emit(struct metrics_out *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Appends the node's workers from the registry in shared memory: how many
 * are alive and the resident memory of each (from /proc). */
void metrics_workers(const struct shm_node *node, struct metrics_out *o);

struct cs_conf;

/* Appends what the configuration promises, for alert rules to compare with
 * what runs: the build (couponseize_build_info), fallback.budget_ms,
 * fcgi.workers, fallback.reserve and whether sync.metrics_file is set. */
void metrics_config(const struct cs_conf *conf, struct metrics_out *o);

#endif
