/* test_batch.c - the group commit queue (lib/node/batch.c) on a segment of the
 * test's own, with real processes: election, arrival order, the cap, a
 * leader killed with kill -9 while queued or taken, deadlines, a dead lock
 * owner, a stopped or running lock holder, a stopped leader, and a dead
 * follower's entry reused while a stale leader still holds it. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "batch.h"
#include "cs.h"
#include "runner.h"

/* What the children report: per child slot, how its join ended and its
 * answer; per call led, the users it carried in order. */
struct shared {
    struct batch_area b;
    _Atomic int result[64];
    _Atomic int64_t res[64];
    _Atomic int64_t deadline[64];   /* per child slot: its seize's deadline (monotonic) */
    _Atomic int64_t finished[64];   /* ... and when its join (and its lead) ended */
    _Atomic int ncalls;
    _Atomic int calls[16][64];
    _Atomic int callsize[16];
    _Atomic int handoff;         /* leaders hand the lead on before they are held */
    _Atomic int allow;           /* calls 0..allow-1 may finish; the others are held */
    _Atomic int pause_call;      /* that call's leader stops in batch_finish() (0: none) */
    _Atomic int locked;          /* running_lock_holder() holds shard 1's lock */
};

static struct shared *s;

static void setup(void)
{
    s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert(s != MAP_FAILED);
    ck_assert_int_eq(batch_init(&s->b), CS_OK);
    for (int i = 0; i < 64; i++)
        s->result[i] = -1;
    s->allow = 1000;
}

static void teardown(void)
{
    munmap(s, sizeof(*s));
}

/* A leader answers each seize with res = user * 10, once its call may finish. */
static void lead(struct batch_take *t)
{
    int k = atomic_fetch_add(&s->ncalls, 1);
    for (int i = 0; i < t->n; i++) {
        if (k < 16)
            s->calls[k][i] = (int)t->item[i].user_id;
        t->item[i].outcome = BATCH_OUT_ANSWERED;
        t->item[i].res = t->item[i].user_id * 10;
    }
    if (k < 16)
        s->callsize[k] = t->n;
    if (atomic_load(&s->handoff))
        batch_handoff(&s->b, t);
    while (k >= atomic_load(&s->allow))
        usleep(1000);
    if (k == atomic_load(&s->pause_call))
        setenv("COUPONSEIZE_PAUSE_AT", "batch-finish", 1);
    batch_finish(&s->b, t);
}

/* A worker of registry slot `slot` seizing as user `user` on `shard`:
 * records how it ended in result[slot] (and res[slot]) and exits. */
static pid_t worker_on(int slot, int shard, int user, int max, int budget_ms)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    static struct batch_take t;
    struct batch_item mine = {.activity_id = 11, .user_id = user};
    int64_t deadline = cs_mono_ms() + budget_ms;
    s->deadline[slot] = deadline;
    enum batch_result r = batch_join(&s->b, shard, slot, max, &mine, deadline, &t);
    if (r == BATCH_LEADER) {
        s->res[slot] = t.item[t.self].user_id * 10;
        s->result[slot] = r;
        lead(&t);
    } else {
        s->res[slot] = mine.res;
        s->result[slot] = r;
    }
    s->finished[slot] = cs_mono_ms();
    _exit(0);
}

static pid_t worker(int slot, int user, int max, int budget_ms)
{
    return worker_on(slot, 1, user, max, budget_ms);
}

static void wait_state(int slot, uint32_t state)
{
    for (int i = 0; i < 5000 && atomic_load(&s->b.entry[slot].state) != state; i++)
        usleep(1000);
    ck_assert_uint_eq(atomic_load(&s->b.entry[slot].state), state);
}

static void reap(pid_t pid)
{
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
}

START_TEST(alone_leads_at_once)
{
    static struct batch_take t;
    struct batch_item mine = {.activity_id = 11, .user_id = 7};
    ck_assert_int_eq(batch_join(&s->b, 1, 0, 32, &mine, cs_mono_ms() + 1000, &t), BATCH_LEADER);
    ck_assert_int_eq(t.n, 1);
    ck_assert_int_eq(t.self, 0);
    ck_assert_int_eq(s->b.shard[1].leader, getpid());
    batch_finish(&s->b, &t);
    ck_assert_int_eq(s->b.shard[1].leader, 0);
    ck_assert_uint_eq(atomic_load(&s->b.entry[0].state), BATCH_IDLE);
    /* Again: the lead is free once given back. */
    ck_assert_int_eq(batch_join(&s->b, 1, 0, 32, &mine, cs_mono_ms() + 1000, &t), BATCH_LEADER);
    batch_finish(&s->b, &t);
    ck_assert_uint_eq(atomic_load(&s->b.m.calls), 2);
}
END_TEST

/* Seizes that queue behind a call ride the next one together, oldest first,
 * at most max in one; each gets its own answer. */
START_TEST(followers_ride_in_arrival_order_up_to_max)
{
    pid_t p[8];
    s->allow = 0;
    p[0] = worker(0, 100, 3, 5000);
    wait_state(0, BATCH_TAKEN);            /* leads a call of one, held */
    for (int i = 1; i < 6; i++) {
        p[i] = worker(i, 100 + i, 3, 5000);
        wait_state(i, BATCH_QUEUED);       /* one after the other: arrival order known */
    }
    s->allow = 1000;
    for (int i = 0; i < 6; i++)
        reap(p[i]);
    ck_assert_int_eq(s->ncalls, 3);
    ck_assert_int_eq(s->callsize[0], 1);
    ck_assert_int_eq(s->callsize[1], 3);
    ck_assert_int_eq(s->callsize[2], 2);
    int want[3][3] = {{100}, {101, 102, 103}, {104, 105}};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < s->callsize[k]; i++)
            ck_assert_int_eq(s->calls[k][i], want[k][i]);
    for (int i = 0; i < 6; i++) {
        ck_assert_int_ne(s->result[i], -1);
        ck_assert_int_eq(s->res[i], (100 + i) * 10);
    }
    /* The lead goes to the seize with the most time of those the next call
     * carries: the youngest of the oldest three, then of the two left. */
    ck_assert_int_eq(s->result[3], BATCH_LEADER);
    ck_assert_int_eq(s->result[1], BATCH_ANSWERED);
    ck_assert_int_eq(s->result[2], BATCH_ANSWERED);
    ck_assert_int_eq(s->result[5], BATCH_LEADER);
    ck_assert_int_eq(s->result[4], BATCH_ANSWERED);
    ck_assert_int_eq(s->b.shard[1].leader, 0);
}
END_TEST

/* A leader killed while others only queue behind it: the one with the most
 * time left takes over long before its deadline, and nothing is lost; reaped: the
 * dead leader is reaped at once, else only after its followers are done (a
 * zombie meanwhile, as under a supervisor slow to reap). */
static void killed_leader_queued_followers(int reaped)
{
    s->allow = 0;
    pid_t a = worker(0, 100, 32, 5000);
    wait_state(0, BATCH_TAKEN);
    pid_t b = worker(1, 101, 32, 5000), c;
    wait_state(1, BATCH_QUEUED);
    c = worker(2, 102, 32, 5000);
    wait_state(2, BATCH_QUEUED);
    int64_t t0 = cs_mono_ms();
    kill(a, SIGKILL);
    if (reaped)
        reap(a);
    s->allow = 1000;
    reap(b);
    reap(c);
    int64_t took = cs_mono_ms() - t0;
    if (!reaped)
        reap(a);
    ck_assert_int_lt(took, 1000);
    ck_assert_int_eq(s->result[2], BATCH_LEADER); /* the most time left */
    ck_assert_int_eq(s->result[1], BATCH_ANSWERED);
    ck_assert_int_eq(s->res[1], 1010);
    ck_assert_uint_ge(atomic_load(&s->b.m.leader_deaths), 1);
}

START_TEST(killed_leader_queued_followers_take_over)
{
    killed_leader_queued_followers(1);
}
END_TEST

START_TEST(killed_leader_unreaped_followers_take_over)
{
    killed_leader_queued_followers(0);
}
END_TEST

/* A leader reaped by the supervisor (batch_reaped()) leads nothing from
 * then on, whether or not a follower noticed: a process that later gets the
 * same pid is never waited on as that leader. */
START_TEST(reaped_leader_is_cleared_at_once)
{
    static struct batch_take t;
    struct batch_item mine = {.activity_id = 11, .user_id = 7};
    s->allow = 0;
    pid_t a = worker(0, 100, 32, 5000);
    wait_state(0, BATCH_TAKEN);
    kill(a, SIGKILL);
    reap(a);
    ck_assert_int_eq(s->b.shard[1].leader, a); /* nobody waits: nobody noticed */
    batch_reaped(&s->b, a);
    ck_assert_int_eq(s->b.shard[1].leader, 0);
    s->allow = 1000;
    ck_assert_int_eq(batch_join(&s->b, 1, 1, 32, &mine, cs_mono_ms() + 1000, &t), BATCH_LEADER);
    batch_finish(&s->b, &t);
    /* Reaping a process that led nothing changes nothing. */
    batch_reaped(&s->b, a);
    ck_assert_int_eq(s->b.shard[1].leader, 0);
}
END_TEST

/* A follower reaped while it still waits (QUEUED) is dropped from the
 * queue: the call in flight never hands it the lead, the next call never
 * carries it, and the worker given its registry slot starts clean. */
START_TEST(reaped_follower_is_dropped)
{
    s->allow = 0;
    pid_t a = worker(0, 100, 32, 5000);
    wait_state(0, BATCH_TAKEN);
    pid_t b = worker(1, 101, 32, 5000);
    wait_state(1, BATCH_QUEUED);
    kill(b, SIGKILL);
    reap(b);
    ck_assert_int_eq(batch_reaped(&s->b, b), 0);
    ck_assert_uint_eq(atomic_load(&s->b.entry[1].state), BATCH_IDLE);
    s->allow = 1000;
    reap(a);
    /* Nobody was left to lead: the lead is free, not handed to the dead. */
    ck_assert_int_eq(s->b.shard[1].leader, 0);
    ck_assert_int_eq(atomic_load(&s->ncalls), 1);
    /* It led nothing others waited on: no leader death. */
    ck_assert_uint_eq(atomic_load(&s->b.m.leader_deaths), 0);
}
END_TEST

/* A process that holds shard 1's lock, stopped (SIGSTOP) until continued. */
static pid_t stopped_lock_holder(void)
{
    pid_t h = fork();
    if (h == 0) {
        if (pthread_mutex_lock(&s->b.shard[1].lock) == EOWNERDEAD)
            pthread_mutex_consistent(&s->b.shard[1].lock);
        raise(SIGSTOP);
        pthread_mutex_unlock(&s->b.shard[1].lock);
        _exit(0);
    }
    int st;
    ck_assert_int_eq(waitpid(h, &st, WUNTRACED), h);
    ck_assert(WIFSTOPPED(st));
    return h;
}

/* A process that holds shard 1's lock for ms, running (asleep in sleep(),
 * not stopped), then lets it go; returns once it holds it. */
static pid_t running_lock_holder(int ms)
{
    pid_t h = fork();
    if (h == 0) {
        if (pthread_mutex_lock(&s->b.shard[1].lock) == EOWNERDEAD)
            pthread_mutex_consistent(&s->b.shard[1].lock);
        s->locked = 1;
        usleep((useconds_t)ms * 1000);
        pthread_mutex_unlock(&s->b.shard[1].lock);
        _exit(0);
    }
    for (int i = 0; i < 5000 && !atomic_load(&s->locked); i++)
        usleep(1000);
    ck_assert(atomic_load(&s->locked));
    return h;
}

/* The supervisor never waits for a shard's lock: a worker stopped while it
 * holds one (SIGSTOP) leaves the reap to be tried again, and the retry,
 * once the lock is free, does it. */
START_TEST(reaped_never_waits_for_a_held_lock)
{
    s->allow = 0;
    pid_t a = worker(0, 100, 32, 5000);
    wait_state(0, BATCH_TAKEN);
    /* Killed in its call, not inside take_locked() with the lock held. */
    for (int i = 0; i < 5000 && atomic_load(&s->ncalls) == 0; i++)
        usleep(1000);
    ck_assert_int_eq(atomic_load(&s->ncalls), 1);
    kill(a, SIGKILL);
    reap(a);
    pid_t h = stopped_lock_holder();
    int64_t t0 = cs_mono_ms();
    int busy = batch_reaped(&s->b, a);
    int64_t took = cs_mono_ms() - t0;
    int32_t leader = s->b.shard[1].leader;
    /* Let the holder go before any assertion can end the test. */
    kill(h, SIGCONT);
    reap(h);
    ck_assert_int_eq(busy, 1);
    ck_assert_int_lt(took, 2000);
    ck_assert_int_eq(leader, a);
    ck_assert_int_eq(batch_reaped(&s->b, a), 0);
    ck_assert_int_eq(s->b.shard[1].leader, 0);
    /* It led nothing but its own call: no leader death. */
    ck_assert_uint_eq(atomic_load(&s->b.m.leader_deaths), 0);
    s->allow = 1000;
}
END_TEST

/* A leader killed with seizes taken into its call: they answer UNKNOWN at
 * once (never UNSENT: the call may have gone), and one that queued behind
 * it leads the next call. */
START_TEST(killed_leader_taken_followers_are_unknown)
{
    s->allow = 0;
    pid_t a = worker(0, 100, 32, 5000);
    wait_state(0, BATCH_TAKEN);
    pid_t b = worker(1, 101, 32, 6000);
    wait_state(1, BATCH_QUEUED);
    pid_t c = worker(2, 102, 32, 5000);
    wait_state(2, BATCH_QUEUED);
    kill(a, SIGKILL);                       /* b (more time) leads, takes c, is held */
    reap(a);
    wait_state(2, BATCH_TAKEN);
    pid_t d = worker(3, 103, 32, 5000);
    wait_state(3, BATCH_QUEUED);
    int64_t t0 = cs_mono_ms();
    kill(b, SIGKILL);
    reap(b);
    s->allow = 1000;
    reap(c);
    reap(d);
    ck_assert_int_lt(cs_mono_ms() - t0, 1000);
    ck_assert_int_eq(s->result[2], BATCH_UNKNOWN);
    ck_assert_int_eq(s->result[3], BATCH_LEADER);
    ck_assert_uint_ge(atomic_load(&s->b.m.unknown), 1);
}
END_TEST

/* A deadline while queued: nothing was sent (UNSENT); while taken into a
 * call that does not end: UNKNOWN. */
START_TEST(deadlines_tell_queued_from_taken)
{
    s->allow = 0;
    pid_t a = worker(0, 100, 32, 5000);
    wait_state(0, BATCH_TAKEN);
    pid_t b = worker(1, 101, 32, 150);
    reap(b);
    ck_assert_int_eq(s->result[1], BATCH_UNSENT);
    ck_assert_uint_eq(atomic_load(&s->b.m.unsent), 1);
    /* Now one taken into a held call. */
    pid_t c = worker(2, 102, 32, 5000);
    wait_state(2, BATCH_QUEUED);
    pid_t d = worker(3, 103, 32, 600);
    wait_state(3, BATCH_QUEUED);
    s->allow = 1;                            /* a finishes; c leads, takes d, is held */
    reap(a);
    wait_state(3, BATCH_TAKEN);
    reap(d);
    ck_assert_int_eq(s->result[3], BATCH_UNKNOWN);
    s->allow = 1000;
    reap(c);
    ck_assert_int_eq(s->result[2], BATCH_LEADER);
    ck_assert_int_eq(s->b.shard[1].leader, 0);
}
END_TEST

/* A seize handed the lead with no time left to send (its budget ran out
 * while it waited, here held stopped) does not take the queue into a call
 * it cannot make: it gives up, unsent, and the next one leads. */
START_TEST(lead_without_time_passes_on)
{
    int st;
    s->allow = 0;
    pid_t a = worker(0, 100, 32, 5000);
    wait_state(0, BATCH_TAKEN);
    pid_t b = worker(1, 101, 32, 300);
    wait_state(1, BATCH_QUEUED);
    ck_assert_int_eq(kill(b, SIGSTOP), 0);
    ck_assert_int_eq(waitpid(b, &st, WUNTRACED), b);
    usleep(400 * 1000);                      /* b's budget runs out while stopped */
    s->allow = 1000;                         /* a finishes and hands the lead to b */
    reap(a);
    wait_state(1, BATCH_LEAD);
    pid_t c = worker(2, 102, 32, 5000);      /* finds b stopped: takes the lead */
    for (int i = 0; i < 5000 && s->result[2] == -1; i++)
        usleep(1000);
    ck_assert_int_eq(kill(b, SIGCONT), 0);
    reap(b);
    reap(c);
    ck_assert_int_eq(s->result[1], BATCH_UNSENT);
    ck_assert_int_eq(s->result[2], BATCH_LEADER);
    ck_assert_int_eq(s->res[2], 1020);
    ck_assert_int_eq(s->ncalls, 2);
    ck_assert_int_eq(s->callsize[1], 1);
    ck_assert_int_eq(s->calls[1][0], 102);
    ck_assert_int_eq(s->b.shard[1].leader, 0);
}
END_TEST

/* A leader that handed the lead on (its call answered, its WAIT pending):
 * the next seize leads a call of its own at once. */
START_TEST(handoff_lets_the_next_call_go)
{
    s->allow = 0;
    s->handoff = 1;
    pid_t a = worker(0, 100, 32, 5000);
    wait_state(0, BATCH_TAKEN);
    for (int i = 0; i < 5000 && s->b.shard[1].leader != 0; i++)
        usleep(1000);
    ck_assert_int_eq(s->b.shard[1].leader, 0);
    pid_t b = worker(1, 101, 32, 5000);
    for (int i = 0; i < 5000 && s->result[1] == -1; i++)
        usleep(1000);
    ck_assert_int_eq(s->result[1], BATCH_LEADER); /* while a's call is still held */
    s->allow = 1000;
    reap(a);
    reap(b);
    ck_assert_int_eq(s->ncalls, 2);
    ck_assert_int_eq(s->b.shard[1].leader, 0);
}
END_TEST

/* Waits (5 s at most) until process pid stops; 1 if it did. */
static int wait_stopped(pid_t pid)
{
    int st;
    return waitpid(pid, &st, WUNTRACED) == pid && WIFSTOPPED(st);
}

/* The lead goes to the seize with the most time left, and the seize that
 * waited longest rides in its call, first: one short budget no longer
 * bounds the call of many. */
START_TEST(lead_goes_to_the_most_time_left)
{
    s->allow = 0;
    pid_t a = worker(0, 100, 32, 5000);
    wait_state(0, BATCH_TAKEN);
    pid_t b = worker(1, 101, 32, 400);      /* the oldest, with little time */
    wait_state(1, BATCH_QUEUED);
    pid_t c = worker(2, 102, 32, 5000);
    wait_state(2, BATCH_QUEUED);
    s->allow = 1000;
    reap(a);
    reap(b);
    reap(c);
    ck_assert_int_eq(s->result[2], BATCH_LEADER);
    ck_assert_int_eq(s->result[1], BATCH_ANSWERED);
    ck_assert_int_eq(s->res[1], 1010);
    ck_assert_int_eq(s->callsize[1], 2);
    ck_assert_int_eq(s->calls[1][0], 101);  /* arrival order within the call */
    ck_assert_int_eq(s->calls[1][1], 102);
}
END_TEST

/*
 * A follower f killed inside leader l's call on shard 1; l stopped in
 * batch_finish() between its check of f's entry and its answer; a new worker
 * n given f's registry slot seizes on shard 2, where g leads. l's answer for
 * f must never reach n: n goes alone (the entry still belongs to shard 1's
 * call) or gets its own answer, never f's.
 */
START_TEST(reused_entry_never_takes_a_stale_answer)
{
    s->allow = 0;
    pid_t h = worker(0, 100, 32, 8000);       /* holds shard 1 with call 0 */
    wait_state(0, BATCH_TAKEN);
    pid_t x = worker(1, 101, 32, 8000);
    wait_state(1, BATCH_QUEUED);
    pid_t y = worker(2, 102, 32, 8000);
    wait_state(2, BATCH_QUEUED);
    s->pause_call = 1;                         /* call 1's leader stops in batch_finish */
    s->allow = 1;                              /* call 0 ends; x or y leads call 1, held */
    reap(h);
    for (int i = 0; i < 5000 && s->result[1] != BATCH_LEADER && s->result[2] != BATCH_LEADER; i++)
        usleep(1000);
    int lslot = s->result[1] == BATCH_LEADER ? 1 : 2, fslot = 3 - lslot;
    pid_t l = lslot == 1 ? x : y, f = lslot == 1 ? y : x;
    ck_assert_int_eq(s->result[lslot], BATCH_LEADER);
    wait_state(fslot, BATCH_TAKEN);
    kill(f, SIGKILL);                          /* the follower dies inside the call */
    reap(f);
    s->allow = 2;                              /* l finishes: stops after its check */
    ck_assert(wait_stopped(l));
    /* Shard 2: g0 holds it (call 2), g queues, then n in f's slot. */
    pid_t g0 = worker_on(4, 2, 300, 32, 8000);
    wait_state(4, BATCH_TAKEN);
    pid_t g = worker_on(5, 2, 301, 32, 9000);
    wait_state(5, BATCH_QUEUED);
    s->result[fslot] = -1;
    pid_t n = worker_on(fslot, 2, 302, 32, 6000);
    for (int i = 0; i < 3000 && s->result[fslot] == -1
                    && atomic_load(&s->b.entry[fslot].state) != BATCH_QUEUED; i++)
        usleep(1000);
    s->allow = 3;                              /* g0 ends; g leads n's call 3, held */
    reap(g0);
    for (int i = 0; i < 3000 && s->result[fslot] == -1
                    && atomic_load(&s->b.entry[fslot].state) != BATCH_TAKEN; i++)
        usleep(1000);
    kill(l, SIGCONT);                          /* the stale leader writes its answer */
    usleep(50 * 1000);
    s->allow = 1000;
    reap(l);
    reap(g);
    reap(n);
    ck_assert_msg(s->result[fslot] == BATCH_BUSY
                      || (s->result[fslot] == BATCH_ANSWERED && s->res[fslot] == 3020),
                  "n ended %d with %lld: another seize's answer", s->result[fslot],
                  (long long)s->res[fslot]);
    ck_assert_int_eq(s->b.shard[1].leader, 0);
    ck_assert_int_eq(s->b.shard[2].leader, 0);
    /* The slot serves again, batched, once l let shard 1 go. */
    static struct batch_take t;
    struct batch_item mine = {.activity_id = 11, .user_id = 7};
    ck_assert_int_eq(batch_join(&s->b, 2, fslot, 32, &mine, cs_mono_ms() + 1000, &t),
                     BATCH_LEADER);
    batch_finish(&s->b, &t);
}
END_TEST

/*
 * A leader's own user waits on batch_finish(): its wait for the shard's lock
 * ends by the leader's own deadline, not by the latest of the call (a
 * follower past its own answers UNKNOWN_OUTCOME). The election judged "most
 * time left" among the first sh->max entries, and the last joiner set
 * sh->max = 1, so the leader l (1.5 s) carries f and z (6 s); a running
 * process then holds the lock 3 s (doc/internals.md G5: no wait for a lock
 * outlasts a seize's deadline).
 */
START_TEST(leader_never_waits_past_its_deadline_in_finish)
{
    s->allow = 0;
    pid_t h = worker(0, 100, 32, 8000);      /* call 0, held */
    wait_state(0, BATCH_TAKEN);
    pid_t l = worker(1, 101, 32, 1500);      /* the oldest waiting, the most time */
    wait_state(1, BATCH_QUEUED);
    pid_t f = worker(2, 102, 32, 900);
    wait_state(2, BATCH_QUEUED);
    s->allow = 1;                            /* call 0 ends: l elected */
    wait_state(2, BATCH_TAKEN);              /* l took l and f */
    ck_assert_int_eq(s->result[1], BATCH_LEADER);
    pid_t holder = running_lock_holder(3000);
    s->allow = 1000;                         /* l calls batch_finish() */
    reap(l);
    reap(holder);
    reap(h);
    reap(f);
    int64_t late = s->finished[1] - s->deadline[1];
    ck_assert_msg(late <= BATCH_LOCK_MAX_MS,
                  "leader l returned %lld ms past its own deadline, waiting in batch_finish() "
                  "for a lock held by a running process", (long long)late);
    /* Its follower lost the answer (the lock never came in time). */
    ck_assert_int_eq(s->result[2], BATCH_UNKNOWN);
}
END_TEST

/* The election judges the oldest sh->max, which the last joiner set (1
 * here); the elected seize l asked for 32. l's call carries no seize with a
 * later deadline than l's: f and z, with four times l's time left, wait for
 * the next call instead of riding in one that ends by l's deadline
 * (doc/internals.md G5). */
START_TEST(a_call_carries_no_seize_with_more_time)
{
    s->allow = 0;
    pid_t h = worker(0, 100, 32, 8000);      /* call 0, held */
    wait_state(0, BATCH_TAKEN);
    pid_t l = worker(1, 101, 32, 1500);      /* the oldest waiting */
    wait_state(1, BATCH_QUEUED);
    pid_t f = worker(2, 102, 32, 6000);
    wait_state(2, BATCH_QUEUED);
    pid_t z = worker(3, 103, 1, 6000);       /* its max 1 becomes sh->max */
    wait_state(3, BATCH_QUEUED);
    s->allow = 1000;                         /* call 0 ends: l elected among the first 1 */
    reap(h);
    reap(l);
    reap(f);
    reap(z);
    ck_assert_int_eq(s->result[1], BATCH_LEADER);
    ck_assert_int_eq(s->callsize[1], 1);     /* l's call: l alone */
    ck_assert_int_eq(s->calls[1][0], 101);
    for (int i = 2; i <= 3; i++) {
        ck_assert_msg(s->result[i] == BATCH_LEADER || s->result[i] == BATCH_ANSWERED,
                      "seize %d ended %d", i, (int)s->result[i]);
        ck_assert_int_eq(s->res[i], (100 + i) * 10);
    }
}
END_TEST

/* Seizes whose deadline comes while a running process holds their shard's
 * lock give up by their deadline, not BATCH_LOCK_WAIT_MS past it: the lock
 * wait of one giving up ends by its deadline (doc/internals.md G5). The
 * least late of three, so that a starved machine's scheduling noise does
 * not decide; each waited BATCH_LOCK_WAIT_MS before. */
START_TEST(give_up_waits_for_no_lock_past_the_deadline)
{
    s->allow = 0;
    pid_t h = worker(0, 100, 32, 8000);      /* call 0, held */
    wait_state(0, BATCH_TAKEN);
    pid_t p[3];
    for (int i = 1; i <= 3; i++) {
        p[i - 1] = worker(i, 100 + i, 32, 200 + 100 * i);
        wait_state(i, BATCH_QUEUED);
    }
    pid_t holder = running_lock_holder(1500);
    for (int i = 0; i < 3; i++)
        reap(p[i]);
    int64_t least = INT64_MAX;
    for (int i = 1; i <= 3; i++) {
        ck_assert_int_eq(s->result[i], BATCH_UNSENT);
        if (s->finished[i] - s->deadline[i] < least)
            least = s->finished[i] - s->deadline[i];
    }
    s->allow = 1000;
    reap(holder);
    reap(h);
    ck_assert_msg(least < BATCH_LOCK_WAIT_MS * 3 / 4,
                  "the least late of three seizes giving up answered %lld ms past its deadline",
                  (long long)least);
}
END_TEST

/* A worker stopped while it holds a shard's lock: a seize of that shard
 * waits BATCH_LOCK_WAIT_MS, not its budget, and goes alone. */
START_TEST(stopped_lock_holder_sends_seizes_alone)
{
    pid_t h = stopped_lock_holder();
    int64_t t0 = cs_mono_ms();
    pid_t a = worker(0, 100, 32, 1000);
    for (int i = 0; i < 3000 && s->result[0] == -1; i++)
        usleep(1000);
    int64_t took = cs_mono_ms() - t0;
    kill(h, SIGCONT);
    reap(h);
    reap(a);
    ck_assert_int_eq(s->result[0], BATCH_BUSY);
    ck_assert_int_lt(took, 500);
    ck_assert_uint_ge(atomic_load(&s->b.m.lock_busy), 1);
}
END_TEST

/* A leader stopped outside the lock (SIGSTOP mid-call): the seizes queued
 * behind it take the lead and the shard keeps selling; its own call's
 * answers come when it is continued. */
START_TEST(stopped_leader_loses_the_lead)
{
    s->allow = 0;
    pid_t a = worker(0, 100, 32, 5000);
    wait_state(0, BATCH_TAKEN);
    for (int i = 0; i < 5000 && atomic_load(&s->ncalls) == 0; i++)
        usleep(1000);
    ck_assert_int_eq(kill(a, SIGSTOP), 0);
    ck_assert(wait_stopped(a));
    s->allow = 1000;
    int64_t t0 = cs_mono_ms();
    pid_t b = worker(1, 101, 32, 3000);
    for (int i = 0; i < 3000 && s->result[1] == -1; i++)
        usleep(1000);
    int64_t took = cs_mono_ms() - t0;
    kill(a, SIGCONT);
    reap(a);
    reap(b);
    ck_assert_int_eq(s->result[1], BATCH_LEADER);
    ck_assert_int_lt(took, 1000);
    ck_assert_uint_ge(atomic_load(&s->b.m.leader_stalls), 1);
    ck_assert_int_eq(s->result[0], BATCH_LEADER);
    ck_assert_int_eq(s->b.shard[1].leader, 0);
}
END_TEST

/* A process killed while it holds a shard's lock does not wedge the shard. */
START_TEST(dead_lock_owner_is_repaired)
{
    pid_t p = fork();
    if (p == 0) {
        pthread_mutex_lock(&s->b.shard[1].lock);
        s->b.shard[1].leader = getpid();
        _exit(0);
    }
    reap(p);
    static struct batch_take t;
    struct batch_item mine = {.activity_id = 11, .user_id = 7};
    ck_assert_int_eq(batch_join(&s->b, 1, 0, 32, &mine, cs_mono_ms() + 1000, &t), BATCH_LEADER);
    batch_finish(&s->b, &t);
    ck_assert_int_eq(s->b.shard[1].leader, 0);
}
END_TEST

/* Many processes and rounds: every seize answered once, with its own answer. */
START_TEST(storm_answers_everyone)
{
    pid_t p[24];
    for (int i = 0; i < 24; i++) {
        p[i] = fork();
        if (p[i] == 0) {
            static struct batch_take t;
            for (int round = 0; round < 200; round++) {
                struct batch_item mine = {.activity_id = 11, .user_id = i * 1000 + round};
                enum batch_result r = batch_join(&s->b, 1, i, 8, &mine, cs_mono_ms() + 5000, &t);
                if (r == BATCH_LEADER) {
                    for (int k = 0; k < t.n; k++) {
                        t.item[k].outcome = BATCH_OUT_ANSWERED;
                        t.item[k].res = t.item[k].user_id * 10;
                    }
                    int64_t want = t.item[t.self].user_id * 10;
                    batch_finish(&s->b, &t);
                    if (want != mine.user_id * 10)
                        _exit(2);
                } else if (r == BATCH_BUSY) {
                    continue; /* a lock held 200 ms on a starved machine: sent alone */
                } else if (r != BATCH_ANSWERED || mine.res != mine.user_id * 10) {
                    _exit(3);
                }
            }
            _exit(0);
        }
    }
    for (int i = 0; i < 24; i++) {
        int st;
        ck_assert_int_eq(waitpid(p[i], &st, 0), p[i]);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker %d: status %d", i, st);
    }
    ck_assert_uint_eq(atomic_load(&s->b.m.size_sum) + atomic_load(&s->b.m.lock_busy), 24 * 200);
    ck_assert_int_eq(s->b.shard[1].leader, 0);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("batch");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, alone_leads_at_once);
    tcase_add_test(tc, followers_ride_in_arrival_order_up_to_max);
    tcase_add_test(tc, killed_leader_queued_followers_take_over);
    tcase_add_test(tc, killed_leader_unreaped_followers_take_over);
    tcase_add_test(tc, killed_leader_taken_followers_are_unknown);
    tcase_add_test(tc, reaped_leader_is_cleared_at_once);
    tcase_add_test(tc, reaped_follower_is_dropped);
    tcase_add_test(tc, reaped_never_waits_for_a_held_lock);
    tcase_add_test(tc, deadlines_tell_queued_from_taken);
    tcase_add_test(tc, lead_without_time_passes_on);
    tcase_add_test(tc, dead_lock_owner_is_repaired);
    tcase_add_test(tc, handoff_lets_the_next_call_go);
    tcase_add_test(tc, storm_answers_everyone);
    tcase_add_test(tc, lead_goes_to_the_most_time_left);
    tcase_add_test(tc, reused_entry_never_takes_a_stale_answer);
    tcase_add_test(tc, stopped_lock_holder_sends_seizes_alone);
    tcase_add_test(tc, stopped_leader_loses_the_lead);
    tcase_add_test(tc, leader_never_waits_past_its_deadline_in_finish);
    tcase_add_test(tc, a_call_carries_no_seize_with_more_time);
    tcase_add_test(tc, give_up_waits_for_no_lock_past_the_deadline);
    suite_add_tcase(su, tc);
    return cs_run_suite(su, 0);
}
