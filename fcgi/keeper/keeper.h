/* keeper.h - the reserve keeper: one process per node, started by the
 * supervisor when reserves are configured (fallback.reserve > 0) or the
 * journal directory holds grants not yet replayed. */
#ifndef CS_KEEPER_H
#define CS_KEEPER_H

struct cs_conf;
struct shm_node;

/* Whether a keeper must run: reserves on, or a journal left to replay. */
int keeper_wanted(const struct cs_conf *conf);

/* The keeper's main loop; returns the process exit code. SIGTERM gives every
 * reserve back (replayed first) and then returns. SIGUSR2 (an in-place
 * upgrade) returns after the pass under way, giving nothing back: every
 * slot stopped, the journal's lock released; the next keeper adopts the
 * reserves as after a restart (doc/operations.md, "Upgrading in place"). */
int keeper_main(const struct cs_conf *conf, struct shm_node *shm);

#endif
