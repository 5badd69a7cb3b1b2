/* batch.h - group commit of seizes through node shared memory: per shard, a
 * queue of waiting seizes, the election of the one worker that sends them
 * together, and the waking of the others (doc/internals.md "Group commit of seizes").
 *
 * The module knows nothing of Redis: the leader gets the entries it took,
 * sends them however its caller does, writes an answer into each and hands
 * them back with batch_finish(). */
#ifndef CS_BATCH_H
#define CS_BATCH_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define BATCH_ENTRIES 1024       /* one per worker registry slot (SHM_MAX_WORKERS) */
#define BATCH_MAX 256            /* the upper bound of limits.batch_max */
#define BATCH_SHARDS 10          /* KEYS_SHARDS */
#define BATCH_LEAD_MIN_MS 10     /* a leader with less budget left sends nothing */
#define BATCH_LOCK_WAIT_MS 20    /* a seize waits no longer for a lock held by a stopped process */
#define BATCH_LOCK_MAX_MS 200    /* ... nor for one held by a running one */
#define BATCH_LEASE_GRACE_MS 50  /* a lead held this long past its call's deadline is stale */
#define BATCH_SIZE_BUCKETS 9     /* batch size histogram: le 1, 2, 4, ... 256 */

/* How a seize of a batch went, written by its leader. */
enum batch_outcome {
    BATCH_OUT_NONE = 0,          /* not answered (yet) */
    BATCH_OUT_ANSWERED,          /* res holds the script's answer, code its outcome */
    BATCH_OUT_NOT_SENT,          /* the call never reached Redis (not sent, or refused) */
    BATCH_OUT_UNKNOWN,           /* sent; no settled answer (or a grant not confirmed) */
};

/* One seize: what it asks, and (from the leader) how it was answered. */
struct batch_item {
    int64_t activity_id;
    int64_t user_id;
    int32_t outcome;             /* enum batch_outcome */
    int32_t code;                /* enum cs_code, with BATCH_OUT_ANSWERED */
    int64_t res;                 /* the script's answer, seize.lua's codes (>= 0: stock left) */
    int64_t deadline_ms;         /* monotonic: its worker answers by then, whatever comes */
};

/* States of an entry, the word its worker sleeps on (a futex). */
enum batch_state {
    BATCH_IDLE = 0,              /* in no queue */
    BATCH_QUEUED,                /* waiting for a leader to take it */
    BATCH_TAKEN,                 /* in a call its leader is making */
    BATCH_DONE,                  /* answered: item holds the answer */
    BATCH_LEAD,                  /* handed the lead: its worker takes the next batch */
    BATCH_WITHDRAWN,             /* given up without its shard's lock: still on that shard
                                    till its worker clears it under the lock (batch_join()) */
};

/*
 * One worker's seize, at the index of its registry slot. Each worker has at
 * most one seize at a time, so it has at most one entry in any queue.
 *
 * MUST: an entry leaves its shard only under that shard's lock: a worker
 *       whose entry is still QUEUED, LEAD or TAKEN on a shard (its own seize
 *       given up without the lock, or a dead worker's entry in the slot it
 *       was given) clears it to IDLE under that shard's lock before it
 *       queues it anywhere (batch_join()). So a leader, which checks an
 *       entry's ticket and state and writes its answer under the lock of the
 *       shard it took it from, never writes into an entry reused since.
 * MUST: every move out of QUEUED or LEAD is a compare-and-swap: the
 *       leader's take (QUEUED to TAKEN) and election (QUEUED to LEAD) hold
 *       the lock, but a worker whose deadline came while another process
 *       holds the lock withdraws its own entry (QUEUED or LEAD to WITHDRAWN)
 *       without it; exactly one of the two wins. WITHDRAWN, not IDLE: a
 *       leader between its scan and its compare-and-swap must never meet
 *       the entry's next seize, so it stays on its shard until cleared
 *       under that shard's lock.
 * MUST: a leader reads an entry's state before its ticket (acquire): a
 *       TAKEN of a later seize in the entry brings that seize's ticket. So
 *       does a bury of a dead worker before the entry's shard and pid: a
 *       QUEUED of a later seize brings its shard, and the bury drops only
 *       the QUEUED or LEAD it read, by compare-and-swap.
 * MUST: item, pid, shard and ticket are written before state becomes
 *       QUEUED (a release store), and item's answer before it becomes DONE,
 *       so a reader that sees the state (acquire) sees them.
 * MUST: the state word is changed before the futex wake, and a sleeper
 *       passes the value it read to FUTEX_WAIT: a change in between fails
 *       the wait (EAGAIN) instead of being lost.
 * MUST NOT: a leader writes an answer into an entry whose ticket is not the
 *       one it took, or that is no longer TAKEN: its worker has given up.
 * MUST NOT: a seize waits for a lock, or for its leader, past its own
 *       deadline: a lock held more than BATCH_LOCK_WAIT_MS by a stopped
 *       process, or BATCH_LOCK_MAX_MS by a running one, sends the seize
 *       alone (BATCH_BUSY), unqueued. A seize giving up waits for the lock
 *       by its deadline (1 ms at least, for a free lock), then withdraws
 *       without it; a leader answering its call (batch_finish()) waits by
 *       its own deadline, not its followers' (BATCH_LOCK_WAIT_MS at least:
 *       the answers of the call are lost without the lock).
 */
struct batch_entry {
    _Atomic uint32_t state;      /* enum batch_state; the futex word */
    _Atomic int32_t pid;         /* the worker that queued it */
    _Atomic int32_t leader;      /* TAKEN: the pid of the leader making the call */
    _Atomic int32_t shard;
    _Atomic uint64_t ticket;     /* arrival order within the shard, unique */
    struct batch_item item;
};

/*
 * One shard's queue: the entries QUEUED on it, oldest ticket first, and the
 * one call in flight.
 *
 * MUST: lock (robust, process-shared) is held to change leader, max,
 *       lead_until, next_ticket and (but for a worker withdrawing its own
 *       entry) the state of any entry of this shard. It is never held across
 *       a Redis call or a sleep.
 * MUST: every write of leader and lead_until is an atomic store (lead_set(),
 *       leader_store()), made under the lock: a waiting seize reads them
 *       without it (atomic loads), as a hint it judges again under the lock.
 * MUST: leader != 0 while a worker leads a call of this shard: it was the
 *       first to find leader == 0 or was handed the lead. While it leads, new
 *       seizes queue behind it; once Redis has run its call (batch_handoff())
 *       or when it finishes, it hands the lead on, or sets leader = 0 when
 *       none waits: one call of a shard unanswered by Redis at a time per
 *       node, while its leader runs.
 * MUST: the lead goes to the seize with the most time left among the
 *       oldest max, the call ends by that seize's deadline, and it carries
 *       no seize with a later deadline (those wait for the next call): the
 *       call of many seizes is never cut short by the one that waited
 *       longest, whatever batch_max each worker asked.
 * MUST: an entry taken into a call (TAKEN) is never sent again by another
 *       leader, and never answered NOT_SENT after its leader sent the call:
 *       a worker that loses its leader (dead, or past its own deadline)
 *       answers UNKNOWN_OUTCOME. An entry still QUEUED was sent by nobody.
 * MUST NOT: a leader that died, stopped (SIGSTOP, a debugger) or outlived
 *       its lease (lead_until: the deadline of its call, and a grace) is
 *       waited for: the waiting entries check its pid and state, bury a dead
 *       one, and take the lead from a stopped or late one; a dead owner of
 *       the lock is repaired (EOWNERDEAD: every step under the lock leaves
 *       the queue consistent). A leader whose lead was taken finishes its
 *       own call, and touches the lead no more.
 */
struct batch_shard {
    pthread_mutex_t lock;
    int32_t leader;              /* pid of the worker leading a call; 0 none (atomic stores) */
    _Atomic int32_t owner;       /* pid holding lock (read without it: a hint) */
    int32_t max;                 /* limits.batch_max as the last seize asked */
    int64_t lead_until;          /* monotonic ms: past it, the lead is stale (atomic stores) */
    uint64_t next_ticket;
};

struct batch_metrics {
    _Atomic uint64_t size[BATCH_SIZE_BUCKETS];  /* calls led, by entries (non-cumulative) */
    _Atomic uint64_t size_sum;
    _Atomic uint64_t calls;
    _Atomic uint64_t unsent;     /* seizes that gave up queued (their deadline, nothing sent) */
    _Atomic uint64_t unknown;    /* seizes that lost their call's answer (leader dead or late) */
    _Atomic uint64_t leader_deaths;  /* leaders found dead by the seizes waiting on them */
    _Atomic uint64_t leader_stalls;  /* leads taken from a leader stopped or past its lease */
    _Atomic uint64_t lock_busy;  /* seizes sent alone: a shard's lock held past BATCH_LOCK_WAIT_MS */
};

struct batch_area {
    _Atomic uint32_t ready;      /* the locks are initialized */
    _Atomic int32_t hi;          /* entries [0, hi) have been used */
    struct batch_shard shard[BATCH_SHARDS];
    struct batch_entry entry[BATCH_ENTRIES];
    struct batch_metrics m;
};

/* What batch_join() gives a leader: the entries it took, oldest first, and
 * which of them is its own. */
struct batch_take {
    int shard;
    int n;
    int self;                    /* index of the leader's own seize in item[] */
    int handed;                  /* the lead was handed on (batch_handoff()) */
    int64_t until;               /* the leader's deadline: the latest of the entries taken */
    int32_t entry[BATCH_MAX];
    uint64_t ticket[BATCH_MAX];
    struct batch_item item[BATCH_MAX];
};

enum batch_result {
    BATCH_LEADER,                /* lead: send take->item[0..n), then batch_finish() */
    BATCH_ANSWERED,              /* *mine holds the answer a leader wrote */
    BATCH_UNSENT,                /* gave up while queued: nothing was sent */
    BATCH_UNKNOWN,               /* its call was sent (or may have been); no answer came */
    BATCH_BUSY,                  /* a shard's lock was held too long: nothing queued, send it alone */
};

/* Initializes the locks of a zeroed area (the segment's creator, once).
 * CS_OK, or CS_ERR with errno when the system has no robust shared mutexes. */
int batch_init(struct batch_area *b);

/*
 * Queues *mine on shard for the worker of registry slot `slot` and waits until
 * it leads a call, is answered, or deadline_ms (monotonic) comes. max (>= 1)
 * caps the entries a leader takes. BATCH_LEADER: take holds the entries this
 * worker took (its own at take->self); it MUST call batch_finish() once it
 * has answered each of them, even when the call failed, and end its call by
 * its own deadline (the latest of the entries it took). BATCH_BUSY: a lock
 * was held too long, nothing was queued, the seize goes alone. Otherwise
 * *mine holds the answer (BATCH_ANSWERED) or the outcome says why none came.
 */
enum batch_result batch_join(struct batch_area *b, int shard, int slot, int max,
                             struct batch_item *mine, int64_t deadline_ms,
                             struct batch_take *take);

/* Hands the shard's lead on before the answers are written, once Redis has
 * run the call: the next call may go out while this leader still waits for
 * its replicas (the WAIT), and runs after this one in Redis, so arrival
 * order holds. Optional; batch_finish() MUST still be called. */
void batch_handoff(struct batch_area *b, struct batch_take *take);

/* Writes each taken entry's answer (take->item[i].outcome and the rest) into
 * its entry and wakes its worker, then hands the shard's lead on (unless
 * batch_handoff() did). The
 * leader's own answer stays in take->item[take->self]. */
void batch_finish(struct batch_area *b, struct batch_take *take);

/* A process of the node ended (pid; the caller keeps it unreaped, a zombie,
 * so that no other process has its pid yet): it no longer leads any
 * shard, and its waiting entries are dropped (never sent to Redis later, nor
 * elected to lead, nor left QUEUED for the worker given its registry slot),
 * so a later process given the same pid is never taken for that leader
 * (followers tell a dead leader only by its pid). The supervisor calls it
 * for each worker it reaps. It never waits for a shard's lock: returns 1
 * when some shard's was held (call it again later; it is idempotent), else
 * 0. */
int batch_reaped(struct batch_area *b, int32_t pid);

#endif
