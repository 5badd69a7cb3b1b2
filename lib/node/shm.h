/* shm.h - the node shared-memory segment every worker maps: sold-out and
 * voided flags, the Redis breaker, the node token bucket and metrics.
 *
 * Everything in it but the group commit's queues is updated with lock-free
 * atomics: a worker killed in the middle of an update never leaves a lock
 * held, and a half-written flag is only a hint (the Lua script re-checks
 * every decision). The queues (batch.h) use robust mutexes that the next
 * locker repairs. */
#ifndef CS_SHM_H
#define CS_SHM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "batch.h"
#include "keys.h"
#include "lease_watch.h"
#include "rcluster.h"

#define SHM_FLAGS 1024           /* slots per flag table, power of two */
#define SHM_ROUTES 16
#define SHM_CODES 32
#define SHM_LAT_BUCKETS 12       /* seize latency histogram, last is +Inf */

#define SHM_QUEUE_SHARDS 10      /* KEYS_SHARDS */
#define SHM_MAX_WORKERS 1024     /* fcgi.workers (up to 512) and those a reload replaces */

/* Reserves (doc/internals.md, "The reserves"): the
 * epochs this node incarnation may spend from, one slot each, and the users
 * it granted to, written by the reserve keeper (fcgi/keeper/keeper.c) and spent by
 * the workers (lib/node/reserve.c). */
#define SHM_RESERVES 256         /* open epochs at once, one per activity */
#define SHM_RGRANTS 65536        /* (activity, user) grants remembered, power of two */

enum rsv_state {
    RSV_EMPTY = 0,
    RSV_PENDING = 1,             /* being set aside or confirmed: not spendable yet */
    RSV_OPEN = 2,                /* spendable within the lease */
    RSV_STOPPED = 3,             /* no new grants: being given back, or closed */
};

struct shm_rsv_slot {
    _Atomic int state;
    _Atomic int64_t activity_id;
    _Atomic uint64_t epoch;
    _Atomic int32_t amount;      /* tokens of the epoch */
    _Atomic int32_t next;        /* the next token to hand out (may pass amount) */
    _Atomic int64_t start_ms;    /* the window by Redis' clock, from the last renewal */
    _Atomic int64_t end_ms;
    _Atomic int open_to_all;     /* the sale has no eligibleGroups (from the activity list):
                                  * a worker without its metadata may grant from it */
};

/* The lease of one shard: the last renewal that Redis answered, written by
 * the keeper under a sequence count (odd while it writes: readers retry, and
 * a keeper that died midway leaves it odd, which ends the lease). */
struct shm_rsv_lease {
    _Atomic uint32_t seq;
    _Atomic int64_t sent_mono;   /* cs_boot_ms() when it was sent; 0 never */
    _Atomic int64_t recv_mono;   /* when its answer came */
    _Atomic int64_t redis_ms;    /* Redis TIME in the answer */
};

/* A user granted from a reserve on this node: key is a hash of (activity,
 * user), 0 for a free entry; entries are only added, and the table is
 * emptied by the keeper while nothing is open. */
/* A grant's entry: WRITING (the key is claimed), PENDING (a token is taken,
 * its journal record being written), GRANTED (on disk, answered SEIZED),
 * REPLAYED (in Redis), CANCELLED (nothing was granted: reusable). */
enum {
    RGRANT_CANCELLED = -1,
    RGRANT_WRITING = 0,
    RGRANT_PENDING = 1,
    RGRANT_GRANTED = 2,
    RGRANT_REPLAYED = 3,
};

struct shm_rgrant {
    _Atomic uint64_t key;
    _Atomic int64_t activity_id;
    _Atomic int64_t user_id;
    _Atomic int state;           /* RGRANT_* */
};

struct shm_reserves {
    _Atomic int keeper_pid;      /* the reserve keeper running; 0 none */
    _Atomic int halted;          /* a journal write failed: no more grants on this node */
    _Atomic uint64_t journal_seg;    /* the segment workers append to (0: none yet) */
    _Atomic int32_t busy[SHM_MAX_WORKERS];  /* per worker slot: reserve slot + 1 while granting */
    /* The activity and epoch of the grant busy[] marks, written before it.
     * A keeper fences by these, not by the slot index: a restarted keeper
     * refills its slots in another order, and a worker still inside a
     * grant from before names a slot that now holds something else. */
    _Atomic int64_t busy_aid[SHM_MAX_WORKERS];
    _Atomic uint64_t busy_epoch[SHM_MAX_WORKERS];
    struct shm_rsv_lease lease[KEYS_SHARDS];
    struct shm_rsv_slot slot[SHM_RESERVES];
    _Atomic uint32_t ngrants;
    struct shm_rgrant grant[SHM_RGRANTS];
    /* metrics */
    _Atomic uint64_t set_aside;      /* tokens set aside */
    _Atomic uint64_t spent;          /* grants answered SEIZED from a reserve */
    _Atomic uint64_t replayed;       /* journal records replayed into Redis */
    _Atomic uint64_t returned;       /* tokens given back to stock */
    _Atomic uint64_t duplicates;     /* replayed grants of users who already held one */
    _Atomic uint64_t dead_letters;   /* tokens with nothing to take them from */
    _Atomic uint64_t anomalies;      /* tokens whose replay marker names another user */
    _Atomic uint64_t journals_lost;  /* admin returns that declared a node's journal lost */
    _Atomic int claim_refused;       /* another live instance holds this incarnation */
    _Atomic uint64_t journal_failures;
    _Atomic int64_t journal_depth;   /* records not yet replayed */
    _Atomic int64_t oldest_unreplayed_ms;  /* wall clock of the oldest of them; 0 none */
    _Atomic int64_t last_replay_ms;  /* duration of the last replay pass */
};

enum breaker_state { BREAKER_CLOSED = 0, BREAKER_OPEN = 1, BREAKER_HALF_OPEN = 2 };

struct shm_flag {
    _Atomic int64_t id;
    _Atomic int64_t until_ms;    /* flag holds while cs_mono_ms() < until_ms */
};

struct shm_metrics {
    _Atomic uint64_t requests[SHM_ROUTES][SHM_CODES];
    _Atomic uint64_t seize_lat[SHM_LAT_BUCKETS];  /* non-cumulative counts */
    _Atomic uint64_t seize_lat_sum_us;
    _Atomic uint64_t seize_lat_count;
    _Atomic uint64_t redis_errors;
    _Atomic uint64_t redis_timeouts;
    _Atomic uint64_t seize_resends;     /* EVALSHAs sent again after a lost reply */
    _Atomic uint64_t seize_budget_gone; /* answered unsent: the budget went before Redis */
    _Atomic uint64_t breaker_opened;
    _Atomic uint64_t breaker_asked_alive; /* silent for a budget, but answered a PING */
    _Atomic uint64_t rate_limited;
    _Atomic uint64_t soldout_hint_hits;
    _Atomic uint64_t cache_hits;
    _Atomic uint64_t cache_misses;
    _Atomic uint64_t cache_evictions;
    _Atomic uint64_t cache_load_failures;
    _Atomic uint64_t cache_stale_served;
    _Atomic uint64_t worker_restarts;
    _Atomic uint64_t seize_shard[KEYS_SHARDS];   /* seize scripts run, by shard */
    _Atomic uint64_t seized_shard[KEYS_SHARDS];  /* coupons granted, by shard */
};

/* One circuit breaker (fcgi/node/breaker.c owns what it does): the node's on a
 * single Redis, and one per shard on a cluster, where a master failing opens
 * only the breakers of the shards it serves. */
struct shm_breaker {
    _Atomic int state;
    _Atomic int failures;
    _Atomic int64_t open_until_ms;
    _Atomic int64_t probe_until_ms;  /* lease of the one probing worker */
    _Atomic int fault;           /* the node's: rconn_fault of the last seize call
                                  * (health, metrics); a shard's stays 0 */
    _Atomic int64_t answer_ms;   /* cs_mono_ms() of the last seize Redis answered
                                  * (to within 5 ms: not a write per seize) */
};

/* Depth of each shard's sync queue (HLEN of QUEUE:COUPON:SEIZE:SYNC:{i}) for
 * the metrics route: read from Redis by one worker at a time, at most once a
 * second for the whole node, never on the seize path. */
struct shm_qdepth {
    _Atomic int64_t read_ms;                 /* wall clock of the last read; 0 never */
    _Atomic int64_t lease_ms;                /* cs_mono_ms() until which a worker reads */
    _Atomic int64_t depth[SHM_QUEUE_SHARDS];
};

struct shm_node {
    uint64_t magic;
    uint32_t version;
    uint32_t size;
    _Atomic int64_t created_ms;

    /* The node's breaker, on a single Redis: the fields (and offsets) the
     * node's breaker had before it was a struct shm_breaker. */
    struct shm_breaker breaker;

    _Atomic int64_t bucket_tat_us;           /* GCRA theoretical arrival time */

    /* The list route's per-node copy of ACTIVITY:LIST (fcgi/node/listcopy.c):
     * generation of the segment that holds it (0 = none yet), when it was
     * built (cs_mono_ms), and the lease of the one worker rebuilding it. */
    _Atomic uint64_t list_gen;
    _Atomic int64_t list_built_ms;           /* when the read behind it began */
    _Atomic int64_t list_lease_until_ms;
    _Atomic int64_t list_invalid_ms;         /* a copy read before this is stale */
    _Atomic int64_t list_redis_gen;          /* KEY_ACTIVITY_LIST_GEN it was read at */
    _Atomic int64_t list_full_ms;            /* when the list itself was last read */

    /* Bumped by an admin change on this node: every worker drops its cached
     * metadata at its next lookup, so the node reads its own writes. */
    _Atomic uint64_t meta_epoch;

    struct shm_flag soldout[SHM_FLAGS];
    struct shm_flag voided[SHM_FLAGS];

    struct shm_metrics m;

    struct shm_breaker shard_breaker[KEYS_SHARDS];

    /* Redis Cluster: map epoch, refresh throttle and routing counters. */
    struct rcluster_shared cluster;
    struct shm_qdepth qdepth;

    /* The node's worker processes, for the metrics route (worker count and
     * RSS): a pid per slot, 0 for a free slot. A crashed worker's slot is
     * cleared by the supervisor, or taken over once its pid is gone. */
    _Atomic int32_t worker_pid[SHM_MAX_WORKERS];

    struct shm_reserves rsv;

    /* Group commit of seizes (lib/node/batch.c): per shard, the seizes waiting
     * for the call in flight. Its locks and the lease watch's are the
     * segment's only locks. */
    struct batch_area batch;

    /* Lease stamps of node incarnations and how long this node has seen
     * each unchanged (lib/node/lease_watch.c), for an admin's return. */
    struct lease_watch lease_watch;
};

/* Latency bucket upper bounds in microseconds (the last is +Inf). */
extern const int64_t shm_lat_bounds_us[SHM_LAT_BUCKETS];

/* How shm_node_open() treats a segment already there. */
#define SHM_OPEN_JOIN 0          /* join it, or create one if none (spawn-fcgi workers) */
#define SHM_OPEN_FRESH 1         /* remove it, create a zeroed one (the supervisor) */
#define SHM_OPEN_EXISTING 2      /* join it only if it is there and of this layout (the
                                  * new supervisor of an in-place upgrade): never
                                  * create, never remove */

/* The segment's layout version: two builds of coupon-fcgi may share a node
 * segment (an in-place upgrade) only when theirs are the same. */
uint32_t shm_layout_version(void);

/* Maps the segment NAME ("/couponseize"), as mode (SHM_OPEN_*) says. With
 * SHM_OPEN_JOIN a segment of another layout is replaced; with
 * SHM_OPEN_EXISTING it is refused. Returns the mapping or NULL with a
 * message in err. The mapping lives until the process exits or
 * shm_node_close(). */
struct shm_node *shm_node_open(const char *name, int mode, char *err, size_t errlen);
void shm_node_close(struct shm_node *node);
int shm_node_unlink(const char *name);

/* Flag tables: set ID until UNTIL_MS; test at NOW_MS. A full table drops the
 * oldest expired slot; failing that the flag is not recorded (a hint only). */
void shm_flag_set(struct shm_flag *tab, int64_t id, int64_t until_ms);
int shm_flag_test(const struct shm_flag *tab, int64_t id, int64_t now_ms);
void shm_flag_clear(struct shm_flag *tab, int64_t id);

/* Node token bucket as GCRA: RPS per second with BURST extra. Returns 1 when
 * the request may go on, else 0 and *retry_after_s (>= 1). rps 0 = no limit. */
int shm_bucket_take(struct shm_node *node, int64_t now_us, int rps, int burst,
                    int *retry_after_s);

void shm_observe_latency(struct shm_node *node, int64_t us);

/* Worker registry: a slot per request handler (a worker, or each request
 * thread of one: a process may hold many slots, all under its pid).
 * shm_worker_register() puts PID in a free slot (or in the slot of a process
 * that no longer exists) and returns the slot, or -1 when every slot holds a
 * live process. shm_worker_unregister() frees every slot of PID, wherever
 * they are (no-op when PID holds none): the supervisor's bury of a process
 * that ended. shm_worker_unregister_slot() frees SLOT only, and only while
 * PID holds it: a thread that stops while the others of its process still
 * serve. */
int shm_worker_register(struct shm_node *node, int32_t pid);
void shm_worker_unregister(struct shm_node *node, int32_t pid);
void shm_worker_unregister_slot(struct shm_node *node, int slot, int32_t pid);

#endif
