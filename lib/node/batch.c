/* batch.c - group commit of seizes: leader election, the per-shard queue in
 * node shared memory and the futex wake-ups of followers (see batch.h). */
#include "batch.h"
#include "cs.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* How often a waiting seize checks that its leader still lives: the longest
 * a kill -9 of a leader holds its followers before one of them takes over. */
#define BATCH_CHECK_MS 20

int batch_init(struct batch_area *b)
{
    /* Robust: a worker killed while it holds a shard's lock must not wedge
     * the shard; the next locker gets EOWNERDEAD and repairs it. */
    for (int i = 0; i < BATCH_SHARDS; i++)
        if (cs_mutex_init_shared(&b->shard[i].lock) != CS_OK)
            return CS_ERR;
    atomic_store(&b->ready, 1);
    return CS_OK;
}

/* Shared (not FUTEX_PRIVATE_FLAG): the sleeper and the waker are different
 * processes mapping the same segment. */
static void futex_wait(_Atomic uint32_t *word, uint32_t seen, int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, seen, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

enum pid_state { PID_RUNS, PID_GONE, PID_STOPPED };

/* What became of pid: gone (no such process, or killed and not yet reaped
 * by its parent: a zombie answers kill(pid, 0), but never its followers; a
 * supervisor slow to reap on a loaded machine would keep them waiting out
 * their whole budget), stopped (SIGSTOP, a debugger: it holds what it holds
 * until someone continues it), or running. */
static enum pid_state pid_state(int32_t pid)
{
    if (pid <= 0)
        return PID_RUNS;
    if (kill(pid, 0) != 0)
        return errno == ESRCH ? PID_GONE : PID_RUNS;
    char path[32], buf[128];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return PID_RUNS;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return PID_RUNS;
    buf[n] = '\0';
    /* "pid (comm) S ...": the state follows the last ')'. */
    const char *p = strrchr(buf, ')');
    if (p == NULL || p[1] != ' ')
        return PID_RUNS;
    switch (p[2]) {
    case 'Z':
    case 'X':
        return PID_GONE;
    case 'T':
    case 't':
        return PID_STOPPED;
    default:
        return PID_RUNS;
    }
}

static int pid_gone(int32_t pid)
{
    return pid_state(pid) == PID_GONE;
}

static int sh_index(const struct batch_area *b, const struct batch_shard *sh)
{
    return (int)(sh - b->shard);
}

/* sh->leader := pid (0: nobody leads). Every write of leader and
 * lead_until is atomic, though made under the lock: a waiting seize reads
 * them without it (batch_join()), and a plain store racing with that read is
 * undefined behaviour (torn or invented stores), even if every decision is
 * judged again under the lock. */
static void leader_store(struct batch_shard *sh, int32_t pid)
{
    __atomic_store_n(&sh->leader, pid, __ATOMIC_RELEASE);
}

/* The lead of sh goes to pid, whose call must end by until_ms. */
static void lead_set(struct batch_shard *sh, int32_t pid, int64_t until_ms)
{
    __atomic_store_n(&sh->lead_until, until_ms + BATCH_LEASE_GRACE_MS, __ATOMIC_RELAXED);
    leader_store(sh, pid);
}

struct cand {
    uint64_t ticket;
    int32_t entry;
};

static int cand_cmp(const void *x, const void *y)
{
    const struct cand *a = x, *b = y;
    return a->ticket < b->ticket ? -1 : a->ticket > b->ticket;
}

/* The QUEUED entries of sh (and `self`, when >= 0), oldest first, into c.
 * Returns how many. MUST be called with sh->lock held. */
static int queued_locked(struct batch_area *b, struct batch_shard *sh, int self,
                         struct cand *c)
{
    int shard = sh_index(b, sh), hi = atomic_load(&b->hi), n = 0;

    for (int i = 0; i < hi; i++) {
        struct batch_entry *e = &b->entry[i];
        if (i == self || (atomic_load_explicit(&e->state, memory_order_acquire) == BATCH_QUEUED
                          && atomic_load(&e->shard) == shard))
            c[n++] = (struct cand){atomic_load(&e->ticket), i};
    }
    qsort(c, (size_t)n, sizeof(c[0]), cand_cmp);
    return n;
}

/*
 * Gives the lead of a shard nobody leads to the QUEUED entry with the most
 * time left among the oldest sh->max (those the next call carries): state
 * LEAD, woken to take the next batch. Returns the entry to wake after the
 * lock is released, or NULL.
 * MUST be called with sh->lock held.
 */
static struct batch_entry *elect_locked(struct batch_area *b, struct batch_shard *sh)
{
    static _Thread_local struct cand c[BATCH_ENTRIES];

    if (sh->leader != 0)
        return NULL;
    for (;;) {
        int n = queued_locked(b, sh, -1, c), max = sh->max > 0 ? sh->max : 1;
        struct batch_entry *best = NULL;
        for (int i = 0; i < n && i < max; i++) {
            struct batch_entry *e = &b->entry[c[i].entry];
            if (best == NULL || e->item.deadline_ms > best->item.deadline_ms)
                best = e;
        }
        if (best == NULL)
            return NULL;
        cs_pause_point("batch-elect");
        uint32_t queued = BATCH_QUEUED;
        /* Its worker may withdraw it meanwhile (give_up() without the
         * lock): then the next best. */
        if (atomic_compare_exchange_strong(&best->state, &queued, BATCH_LEAD)) {
            lead_set(sh, atomic_load(&best->pid), best->item.deadline_ms);
            return best;
        }
    }
}

/*
 * The leader `dead` of sh is gone: clears it, drops the entries of that
 * process still waiting on sh (QUEUED or LEAD: it answers nobody now) and
 * elects the next one. Returns the entry to wake, as elect_locked().
 * MUST be called with sh->lock held.
 * MUST read an entry's state (acquire) before its shard and pid, and drop it
 * by compare-and-swap from the state it read: a worker given the dead one's
 * registry slot writes shard and pid before its QUEUED (release), so a
 * state of that new seize brings its shard with it and the entry is
 * skipped; read the other way round, a shard and pid of the dead seize
 * could go with the QUEUED or LEAD of the new one on another shard
 * (doc/internals.md G4: an entry leaves its shard only under that shard's
 * lock). The state read cannot turn into another seize's before the
 * compare-and-swap: a QUEUED or LEAD entry of sh is cleared for reuse only
 * under sh's lock, held here.
 */
static struct batch_entry *bury_locked(struct batch_area *b, struct batch_shard *sh,
                                       int32_t dead)
{
    int shard = sh_index(b, sh), hi = atomic_load(&b->hi);

    if (sh->leader != dead)
        return NULL;
    leader_store(sh, 0);
    atomic_fetch_add_explicit(&b->m.leader_deaths, 1, memory_order_relaxed);
    for (int i = 0, paused = 0; i < hi; i++) {
        struct batch_entry *e = &b->entry[i];
        uint32_t st = atomic_load_explicit(&e->state, memory_order_acquire);
        if (st != BATCH_QUEUED && st != BATCH_LEAD)
            continue;
        if (atomic_load(&e->shard) != shard || atomic_load(&e->pid) != dead)
            continue;
        /* The batch-bury pause point: a test stops here, between the reads
         * and the drop of the first entry found, to queue a seize in that
         * slot meanwhile. One getenv() per bury, none per entry. */
        if (!paused++)
            cs_pause_point("batch-bury");
        /* Fails only if its worker withdrew it meanwhile (WITHDRAWN stays). */
        atomic_compare_exchange_strong(&e->state, &st, BATCH_IDLE);
    }
    return elect_locked(b, sh);
}

/* sh's lock came back EOWNERDEAD: its last owner died holding it. Every
 * step under the lock having left the queue consistent, only the lead can
 * be stale: a dead leader is buried. Returns the entry to wake once
 * unlocked, as elect_locked().
 * MUST be called with sh->lock held. */
static struct batch_entry *sh_repair(struct batch_area *b, struct batch_shard *sh)
{
    pthread_mutex_consistent(&sh->lock);
    if (sh->leader != 0 && pid_gone(sh->leader))
        return bury_locked(b, sh, sh->leader);
    if (sh->leader == 0)
        return elect_locked(b, sh); /* it died handing the lead on */
    return NULL;
}

/* Locks sh by until_ms (monotonic), repaired (sh_repair()) if its last
 * owner died holding it; *wake: an entry to wake once unlocked. A holder
 * found stopped after BATCH_LOCK_WAIT_MS ends the wait at once: it holds
 * the lock until someone continues it. 0, or ETIMEDOUT. */
static int sh_lock_by(struct batch_area *b, struct batch_shard *sh, int64_t until_ms,
                      struct batch_entry **wake)
{
    int err;

    for (;;) {
        int64_t by = cs_mono_ms() + BATCH_LOCK_WAIT_MS;
        if (by > until_ms)
            by = until_ms;
        struct timespec ts = {(time_t)(by / 1000), (long)(by % 1000) * 1000000L};
        err = pthread_mutex_clocklock(&sh->lock, CLOCK_MONOTONIC, &ts);
        if (err != ETIMEDOUT || by >= until_ms
            || pid_state(atomic_load_explicit(&sh->owner, memory_order_relaxed)) == PID_STOPPED)
            break;
    }
    if (err == EOWNERDEAD) {
        atomic_store_explicit(&sh->owner, (int32_t)getpid(), memory_order_relaxed);
        struct batch_entry *w = sh_repair(b, sh);
        if (*wake == NULL)
            *wake = w;
        return 0;
    }
    if (err == 0)
        atomic_store_explicit(&sh->owner, (int32_t)getpid(), memory_order_relaxed);
    return err;
}

/* The lock wait of a seize with deadline_ms: BATCH_LOCK_MAX_MS at most,
 * and never past its deadline. */
static int64_t lock_until(int64_t deadline_ms)
{
    int64_t by = cs_mono_ms() + BATCH_LOCK_MAX_MS;
    return by < deadline_ms ? by : deadline_ms;
}

static void sh_unlock(struct batch_shard *sh, struct batch_entry *wake)
{
    atomic_store_explicit(&sh->owner, 0, memory_order_relaxed);
    pthread_mutex_unlock(&sh->lock);
    if (wake != NULL)
        futex_wake(&wake->state);
}

/*
 * Takes the leader's own entry `self` and the oldest other QUEUED entries of
 * sh whose deadline is no later than its own, max in all, in ticket order,
 * into take (state TAKEN, led by pid); the lead is pid's until its own
 * deadline, which ends the call. A seize with more time than the leader
 * waits for the next call instead of riding in one cut short by the
 * leader's deadline: one that queued after the election, or one past the
 * window the election judged (workers asking different batch_max after a
 * reload). doc/internals.md G5.
 * MUST be called with sh->lock held, by the worker sh->leader names.
 */
static void take_locked(struct batch_area *b, struct batch_shard *sh, int self, int max,
                        int32_t pid, struct batch_take *take)
{
    static _Thread_local struct cand c[BATCH_ENTRIES];
    int n = queued_locked(b, sh, self, c), bucket = 0;
    int64_t by = b->entry[self].item.deadline_ms;

    cs_pause_point("batch-scan");
    take->shard = sh_index(b, sh);
    take->n = 0;
    take->self = -1;
    take->handed = 0;
    take->until = 0;
    for (int i = 0; i < n && take->n < max; i++) {
        /* Its own seize always rides: the others fill what is left. */
        int left = max - take->n - (take->self < 0 ? 1 : 0);
        struct batch_entry *e = &b->entry[c[i].entry];
        if (c[i].entry != self) {
            uint32_t queued = BATCH_QUEUED;
            if (left <= 0 || e->item.deadline_ms > by)
                continue;
            /* Its leader named before it can be seen TAKEN: a worker that
             * finds its leader dead must be able to tell. */
            atomic_store(&e->leader, pid);
            /* Withdrawn by its worker since the scan: not taken. */
            if (!atomic_compare_exchange_strong(&e->state, &queued, BATCH_TAKEN))
                continue;
        }
        int k = take->n++;
        if (c[i].entry == self)
            take->self = k;
        take->entry[k] = c[i].entry;
        take->ticket[k] = c[i].ticket;
        take->item[k] = e->item;
        atomic_store(&e->leader, pid);
        if (c[i].entry == self)
            atomic_store_explicit(&e->state, BATCH_TAKEN, memory_order_release);
    }
    take->until = by;
    lead_set(sh, pid, take->until);
    while (bucket < BATCH_SIZE_BUCKETS - 1 && take->n > (1 << bucket))
        bucket++;
    atomic_fetch_add_explicit(&b->m.size[bucket], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&b->m.size_sum, (uint64_t)take->n, memory_order_relaxed);
    atomic_fetch_add_explicit(&b->m.calls, 1, memory_order_relaxed);
}

/* A waiting entry's deadline came, without the lock (another process holds
 * it past the wait): withdraws it by compare-and-swap. An entry TAKEN stays
 * so, answered UNKNOWN (its next seize clears it under the lock); a LEAD
 * given back leaves its lead to lapse (lead_until). */
static enum batch_result give_up_unlocked(struct batch_area *b, struct batch_entry *e,
                                          struct batch_item *mine)
{
    uint32_t s = atomic_load_explicit(&e->state, memory_order_acquire);

    for (;;) {
        switch (s) {
        case BATCH_DONE:
            *mine = e->item;
            atomic_store(&e->state, BATCH_IDLE);
            return BATCH_ANSWERED;
        case BATCH_TAKEN:
            atomic_fetch_add_explicit(&b->m.unknown, 1, memory_order_relaxed);
            return BATCH_UNKNOWN;
        case BATCH_QUEUED:
        case BATCH_LEAD:
            /* WITHDRAWN, not IDLE: a leader of this shard may be between
             * its scan and its compare-and-swap; the entry stays on the
             * shard until cleared under its lock (batch_join()). */
            if (!atomic_compare_exchange_weak(&e->state, &s, BATCH_WITHDRAWN))
                continue; /* s reread: taken, answered or elected meanwhile */
            /* fall through */
        default:
            atomic_fetch_add_explicit(&b->m.unsent, 1, memory_order_relaxed);
            return BATCH_UNSENT;
        }
    }
}

/* The lock wait of a seize giving up: BATCH_LOCK_WAIT_MS at most, and
 * never past its deadline (doc/internals.md G5) but for the millisecond
 * that lets a free lock be taken. */
static int64_t give_up_until(int64_t deadline_ms)
{
    int64_t now = cs_mono_ms(), by = deadline_ms;

    if (by > now + BATCH_LOCK_WAIT_MS)
        by = now + BATCH_LOCK_WAIT_MS;
    return by > now + 1 ? by : now + 1;
}

/* A waiting entry's deadline came (or its leader died while it was TAKEN,
 * gone_leader set): takes it out. An answer that came in the meantime wins.
 * mine->deadline_ms: the seize's deadline. */
static enum batch_result give_up(struct batch_area *b, struct batch_shard *sh,
                                 struct batch_entry *e, struct batch_item *mine,
                                 int32_t gone_leader)
{
    struct batch_entry *wake = NULL;
    enum batch_result res;

    if (sh_lock_by(b, sh, give_up_until(mine->deadline_ms), &wake) != 0)
        return give_up_unlocked(b, e, mine);
    uint32_t s = atomic_load_explicit(&e->state, memory_order_acquire);
    /* Judged again under the lock, as the deposing in batch_join(): during
     * the lock wait the dead leader may have been buried and reaped, and
     * its pid given to a worker that now leads or waits here, whose seizes
     * a bury would drop (doc/internals.md G4: a bury of a pid that runs
     * touches nothing). */
    if (gone_leader != 0 && wake == NULL && sh->leader == gone_leader && pid_gone(gone_leader))
        wake = bury_locked(b, sh, gone_leader);
    switch (s) {
    case BATCH_DONE:
        *mine = e->item;
        res = BATCH_ANSWERED;
        break;
    case BATCH_TAKEN:
        /* In a call that may have been sent: never "not sent". */
        atomic_fetch_add_explicit(&b->m.unknown, 1, memory_order_relaxed);
        res = BATCH_UNKNOWN;
        break;
    case BATCH_LEAD:
        /* Handed the lead with no time left to use it: the next one leads. */
        atomic_store(&e->state, BATCH_IDLE);
        if (sh->leader == e->pid)
            leader_store(sh, 0);
        if (wake == NULL)
            wake = elect_locked(b, sh);
        /* fall through */
    default:
        atomic_fetch_add_explicit(&b->m.unsent, 1, memory_order_relaxed);
        res = BATCH_UNSENT;
        break;
    }
    atomic_store(&e->state, BATCH_IDLE);
    sh_unlock(sh, wake);
    return res;
}

/* give_up(), for an entry its worker once saw TAKEN (taken_seen): that
 * seize may have been sent, so it is never answered "not sent", whatever
 * cleared the entry since. */
static enum batch_result give_up_seen(struct batch_area *b, struct batch_shard *sh,
                                      struct batch_entry *e, struct batch_item *mine,
                                      int32_t gone_leader, int taken_seen)
{
    enum batch_result res = give_up(b, sh, e, mine, gone_leader);
    if (res == BATCH_UNSENT && taken_seen) {
        atomic_fetch_sub_explicit(&b->m.unsent, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&b->m.unknown, 1, memory_order_relaxed);
        return BATCH_UNKNOWN;
    }
    return res;
}

static void hi_at_least(struct batch_area *b, int n)
{
    int32_t cur = atomic_load(&b->hi);
    while (cur < n && !atomic_compare_exchange_weak(&b->hi, &cur, n))
        ;
}

/*
 * e is still QUEUED, LEAD or TAKEN on sh (its seize given up without the
 * lock, or left by a dead worker whose registry slot this one was given):
 * clears it to IDLE, so the leader that took it skips it, and gives on a
 * lead it held. pid: the worker about to reuse it. Returns the entry to
 * wake, as elect_locked().
 * MUST be called with sh->lock held (the lock of e->shard).
 */
static struct batch_entry *reclaim_locked(struct batch_area *b, struct batch_shard *sh,
                                          struct batch_entry *e, int32_t pid)
{
    int32_t owner = atomic_load(&e->pid);

    atomic_store(&e->state, BATCH_IDLE);
    if (owner != pid && sh->leader == owner && pid_gone(owner))
        return bury_locked(b, sh, owner);
    if (owner == pid && sh->leader == pid) {
        leader_store(sh, 0);
        return elect_locked(b, sh);
    }
    return NULL;
}

static int entry_live(uint32_t s)
{
    return s == BATCH_QUEUED || s == BATCH_LEAD || s == BATCH_TAKEN || s == BATCH_WITHDRAWN;
}

/* The batch-finish pause point (cs_pause_point()): a test stops a leader
 * there, between its reads of its first follower's state and ticket and
 * its answer, to change the entry meanwhile. Like batch-scan (take_locked())
 * and batch-elect (elect_locked()), one getenv() per call, none per seize. */
static void finish_pause(void)
{
    cs_pause_point("batch-finish");
}

/*
 * Clears this worker's entry e from another shard it is still live on (its
 * slot inherited from a dead worker, or its own seize given up without the
 * lock) under that shard's lock (batch.h: an entry leaves its shard only
 * so). Returns 0, or -1 when that lock stayed held past the wait; *wake is
 * an entry to wake after the caller's next unlock.
 */
static int join_leave_old(struct batch_area *b, struct batch_entry *e, int shard, int32_t pid,
                          int64_t deadline_ms, struct batch_entry **wake)
{
    int old = atomic_load(&e->shard);

    if (!entry_live(atomic_load(&e->state)) || old == shard || old < 0 || old >= BATCH_SHARDS)
        return 0;
    struct batch_shard *osh = &b->shard[old];
    struct batch_entry *w = NULL;
    if (sh_lock_by(b, osh, lock_until(deadline_ms), &w) != 0) {
        *wake = w;
        return -1;
    }
    if (entry_live(atomic_load(&e->state)) && atomic_load(&e->shard) == old) {
        struct batch_entry *r = reclaim_locked(b, osh, e, pid);
        if (w == NULL)
            w = r;
    }
    sh_unlock(osh, w);
    return 0;
}

/*
 * Queues *mine in entry e of shard sh, with a ticket after every other.
 * MUST be called with sh->lock held; *wake as sh_lock_by() left it.
 */
static void join_queue_locked(struct batch_area *b, struct batch_shard *sh, struct batch_entry *e,
                              int shard, int max, int32_t pid, struct batch_item *mine,
                              struct batch_entry **wake)
{
    if (entry_live(atomic_load(&e->state))) {
        struct batch_entry *w = reclaim_locked(b, sh, e, pid);
        if (*wake == NULL)
            *wake = w;
    }
    /* A leader that is this very process is a lead left behind (its
     * request ended without batch_finish()); it is stale. */
    if (sh->leader == pid)
        leader_store(sh, 0);
    sh->max = max;
    mine->outcome = BATCH_OUT_NONE;
    e->item = *mine;
    atomic_store(&e->pid, pid);
    atomic_store(&e->shard, shard);
    /* The shard in the low bits: tickets are unique across shards. */
    atomic_store(&e->ticket, ++sh->next_ticket * BATCH_SHARDS + (uint64_t)shard);
    atomic_store(&e->leader, 0);
    atomic_store_explicit(&e->state, BATCH_QUEUED, memory_order_release);
}

/*
 * Entry e was made LEAD: takes the next call under the lock. Returns 1 when
 * this worker leads it (take filled, the lock released), 0 when the lead
 * went elsewhere meanwhile or the lock stayed held (e waits on).
 */
static int join_take_lead(struct batch_area *b, struct batch_shard *sh, struct batch_entry *e,
                          int slot, int max, int32_t pid, int64_t deadline_ms,
                          struct batch_take *take)
{
    struct batch_entry *wake = NULL;

    if (sh_lock_by(b, sh, lock_until(deadline_ms), &wake) != 0)
        return 0; /* held past the wait: its deadline decides */
    /* Re-read under the lock: a repair may have changed the lead. */
    if (atomic_load(&e->state) == BATCH_LEAD) {
        if (sh->leader == 0)
            leader_store(sh, pid);
        if (sh->leader == pid) {
            take_locked(b, sh, slot, max, pid, take);
            sh_unlock(sh, wake == e ? NULL : wake);
            return 1;
        }
        atomic_store(&e->state, BATCH_QUEUED); /* someone else leads */
    }
    sh_unlock(sh, wake);
    return 0;
}

/*
 * A QUEUED seize slept a whole slice: nobody leads while it waits (a worker
 * died between giving the lead up and handing it on), or the leader is
 * dead, stopped, or past its lease. Then the lead is taken from it and
 * handed on, judged again under the lock; otherwise nothing happens.
 */
static void join_check_leader(struct batch_area *b, struct batch_shard *sh, int64_t deadline_ms)
{
    int32_t l = __atomic_load_n(&sh->leader, __ATOMIC_ACQUIRE);
    int64_t until = __atomic_load_n(&sh->lead_until, __ATOMIC_RELAXED);
    enum pid_state ps = l != 0 ? pid_state(l) : PID_GONE;
    struct batch_entry *wake = NULL;

    if (l != 0 && ps == PID_RUNS && cs_mono_ms() <= until)
        return;
    if (sh_lock_by(b, sh, lock_until(deadline_ms), &wake) != 0)
        return;
    if (wake == NULL && sh->leader == l && l != 0) {
        /* Judged again under the lock: the same pid may have taken the
         * lead anew (a new lease) during the lock wait. */
        ps = pid_state(l);
        if (ps == PID_RUNS && cs_mono_ms() <= sh->lead_until)
            l = -1;
    }
    if (wake == NULL && sh->leader == l) {
        if (l == 0) {
            wake = elect_locked(b, sh);
        } else if (ps == PID_GONE) {
            wake = bury_locked(b, sh, l);
        } else {
            atomic_fetch_add_explicit(&b->m.leader_stalls, 1, memory_order_relaxed);
            leader_store(sh, 0);
            wake = elect_locked(b, sh);
        }
    }
    sh_unlock(sh, wake);
}

/*
 * Waits, queued, until a leader answers entry e, e is made to lead, or its
 * deadline: the half of batch_join() after the seize queued behind a leader.
 */
static enum batch_result join_wait(struct batch_area *b, struct batch_shard *sh,
                                   struct batch_entry *e, int slot, int max, int32_t pid,
                                   struct batch_item *mine, int64_t deadline_ms,
                                   struct batch_take *take)
{
    int taken_seen = 0;

    for (;;) {
        uint32_t s = atomic_load_explicit(&e->state, memory_order_acquire);
        if (s == BATCH_DONE) {
            *mine = e->item;
            atomic_store(&e->state, BATCH_IDLE);
            return BATCH_ANSWERED;
        }
        if (s == BATCH_LEAD) {
            /* No time left to send a call: taking the queue would answer
             * every seize in it "not sent". It passes the lead on instead. */
            if (deadline_ms - cs_mono_ms() < BATCH_LEAD_MIN_MS)
                return give_up(b, sh, e, mine, 0);
            if (join_take_lead(b, sh, e, slot, max, pid, deadline_ms, take))
                return BATCH_LEADER;
            continue;
        }
        if (s != BATCH_QUEUED && s != BATCH_TAKEN) /* dropped by a repair */
            return give_up_seen(b, sh, e, mine, 0, taken_seen);
        taken_seen |= s == BATCH_TAKEN;
        int64_t left = deadline_ms - cs_mono_ms();
        if (left <= 0)
            return give_up_seen(b, sh, e, mine, 0, taken_seen);
        futex_wait(&e->state, s, left < BATCH_CHECK_MS ? (int)left : BATCH_CHECK_MS);
        if (atomic_load(&e->state) != s)
            continue;
        /* Asleep a whole slice: does whoever this waits on still live? */
        if (s == BATCH_TAKEN) {
            /* Its call may be in flight: only a dead leader ends the wait
             * early; a stopped one may still answer. */
            int32_t l = atomic_load(&e->leader);
            if (pid_gone(l))
                return give_up_seen(b, sh, e, mine, l, 1);
            continue;
        }
        join_check_leader(b, sh, deadline_ms);
    }
}

enum batch_result batch_join(struct batch_area *b, int shard, int slot, int max,
                             struct batch_item *mine, int64_t deadline_ms,
                             struct batch_take *take)
{
    struct batch_shard *sh = &b->shard[shard];
    struct batch_entry *e = &b->entry[slot], *wake = NULL;
    int32_t pid = (int32_t)getpid();

    if (max > BATCH_MAX)
        max = BATCH_MAX;
    hi_at_least(b, slot + 1);
    mine->deadline_ms = deadline_ms;
    if (join_leave_old(b, e, shard, pid, deadline_ms, &wake) != 0
        || sh_lock_by(b, sh, lock_until(deadline_ms), &wake) != 0) {
        atomic_fetch_add_explicit(&b->m.lock_busy, 1, memory_order_relaxed);
        if (wake != NULL)
            futex_wake(&wake->state);
        return BATCH_BUSY;
    }
    join_queue_locked(b, sh, e, shard, max, pid, mine, &wake);
    if (sh->leader == 0) {
        /* No call in flight: it goes out now, with whatever waits. A wake
         * pending from a repair is moot: this worker leads. */
        leader_store(sh, pid);
        take_locked(b, sh, slot, max, pid, take);
        sh_unlock(sh, wake == e ? NULL : wake);
        return BATCH_LEADER;
    }
    sh_unlock(sh, wake);
    return join_wait(b, sh, e, slot, max, pid, mine, deadline_ms, take);
}

void batch_handoff(struct batch_area *b, struct batch_take *take)
{
    struct batch_shard *sh = &b->shard[take->shard];
    struct batch_entry *wake = NULL;
    int32_t pid = (int32_t)getpid();

    if (take->handed)
        return;
    if (sh_lock_by(b, sh, lock_until(take->until), &wake) != 0)
        return; /* batch_finish() tries again */
    if (sh->leader == pid)
        leader_store(sh, 0);
    if (wake == NULL)
        wake = elect_locked(b, sh);
    take->handed = 1;
    sh_unlock(sh, wake);
}

void batch_finish(struct batch_area *b, struct batch_take *take)
{
    struct batch_shard *sh = &b->shard[take->shard];
    struct batch_entry *wake = NULL;
    int32_t pid = (int32_t)getpid();
    int nw = 0;
    static _Thread_local struct batch_entry *woken[BATCH_MAX];
    /* By the leader's own deadline (its user waits on this), not the
     * call's latest: a follower past its own answers UNKNOWN_OUTCOME. */
    int64_t by = cs_mono_ms() + BATCH_LOCK_WAIT_MS;
    if (take->self >= 0 && by < take->item[take->self].deadline_ms)
        by = take->item[take->self].deadline_ms;
    if (sh_lock_by(b, sh, by, &wake) != 0) {
        /* Held by a stopped process, or past every deadline of the call:
         * the answers are lost, and each waiting worker says UNKNOWN_OUTCOME.
         * Its own entry is this worker's to clear, taken by nobody else. */
        atomic_fetch_add_explicit(&b->m.lock_busy, 1, memory_order_relaxed);
        if (take->self >= 0)
            atomic_store(&b->entry[take->entry[take->self]].state, BATCH_IDLE);
        return;
    }
    for (int i = 0, paused = 0; i < take->n; i++) {
        struct batch_entry *e = &b->entry[take->entry[i]];
        uint32_t taken = BATCH_TAKEN;
        if (i == take->self) {
            atomic_store(&e->state, BATCH_IDLE);
            continue;
        }
        /* The state first (acquire), then the ticket: a TAKEN of a later
         * seize in the entry brings that seize's ticket with it. */
        uint32_t st = atomic_load_explicit(&e->state, memory_order_acquire);
        if (!paused++)
            finish_pause();
        if (st != BATCH_TAKEN || atomic_load(&e->ticket) != take->ticket[i])
            continue; /* its worker gave up: it may be on another seize now */
        /* The answer only: what was asked is its worker's to write. */
        e->item.outcome = take->item[i].outcome;
        e->item.code = take->item[i].code;
        e->item.res = take->item[i].res;
        if (atomic_compare_exchange_strong(&e->state, &taken, BATCH_DONE))
            woken[nw++] = e;
    }
    if (!take->handed) {
        if (sh->leader == pid)
            leader_store(sh, 0);
        if (wake == NULL)
            wake = elect_locked(b, sh);
    }
    sh_unlock(sh, wake);
    /* Woken after the lock is let go: a follower that runs at once must
     * not find it held. A wake of an entry reused since is only spurious. */
    for (int i = 0; i < nw; i++)
        futex_wake(&woken[i]->state);
}

/* Locks sh as sh_lock_by(), without waiting: EBUSY when another process
 * holds it (a worker stopped with SIGSTOP mid-step must not hold the
 * supervisor). */
static int sh_trylock(struct batch_area *b, struct batch_shard *sh, struct batch_entry **wake)
{
    int err = pthread_mutex_trylock(&sh->lock);
    if (err == EOWNERDEAD || err == 0)
        atomic_store_explicit(&sh->owner, (int32_t)getpid(), memory_order_relaxed);
    if (err == EOWNERDEAD) {
        *wake = sh_repair(b, sh);
        err = 0;
    }
    return err;
}

/*
 * Process pid is gone: every entry of it still waiting on sh, or taken into
 * another's call, is cleared (the leader of that call skips it), and its
 * lead, if it held one, given on. A leader that others waited on counts as
 * a death found; one that led nothing but its own call does not. Returns
 * the entry to wake, as elect_locked().
 * MUST be called with sh->lock held.
 */
static struct batch_entry *reap_locked(struct batch_area *b, struct batch_shard *sh,
                                       int32_t pid)
{
    int shard = sh_index(b, sh), hi = atomic_load(&b->hi), waited = 0;

    for (int i = 0; i < hi; i++) {
        struct batch_entry *e = &b->entry[i];
        uint32_t s = atomic_load(&e->state);
        if (atomic_load(&e->shard) != shard)
            continue;
        if (entry_live(s) && atomic_load(&e->pid) == pid)
            atomic_store(&e->state, BATCH_IDLE);
        else if (atomic_load(&e->pid) != pid
                 && (s == BATCH_QUEUED || (s == BATCH_TAKEN && atomic_load(&e->leader) == pid)))
            waited = 1;
    }
    if (sh->leader != pid)
        return NULL;
    leader_store(sh, 0);
    if (waited)
        atomic_fetch_add_explicit(&b->m.leader_deaths, 1, memory_order_relaxed);
    return elect_locked(b, sh);
}

int batch_reaped(struct batch_area *b, int32_t pid)
{
    int busy = 0;

    if (pid <= 0 || !atomic_load(&b->ready))
        return 0;
    /* A pid that runs is not the process that ended (its pid given anew):
     * nothing of its is touched. */
    if (pid_state(pid) != PID_GONE)
        return 0;
    for (int i = 0; i < BATCH_SHARDS; i++) {
        struct batch_shard *sh = &b->shard[i];
        struct batch_entry *repaired = NULL;
        int err = sh_trylock(b, sh, &repaired);
        if (err != 0) {
            /* Held: tried again later. Any other error (ENOTRECOVERABLE,
             * which sh_repair() never leaves) would never clear. */
            busy |= err == EBUSY;
            continue;
        }
        struct batch_entry *wake = reap_locked(b, sh, pid);
        atomic_store_explicit(&sh->owner, 0, memory_order_relaxed);
        pthread_mutex_unlock(&sh->lock);
        if (repaired != NULL)
            futex_wake(&repaired->state);
        if (wake != NULL)
            futex_wake(&wake->state);
    }
    return busy;
}
