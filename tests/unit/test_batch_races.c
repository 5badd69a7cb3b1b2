/* test_batch_races.c - the group commit queue (lib/node/batch.c) against
 * interleavings that a preemption makes, each forced by stopping a process
 * at a pause point (COUPONSEIZE_PAUSE_AT, cs_pause_point()):
 *   batch-finish  in batch_finish(), between the reads of its first
 *                 follower's state and ticket and its answer
 *   batch-scan    in take_locked(), between the scan and the takes
 *   batch-elect   in elect_locked(), between the scan and the election
 *   batch-bury    in bury_locked(), between the reads of a dead leader's
 *                 entry and its drop
 * Each workers seizes on shard k an activity 1000 + k, so a call that
 * carries a seize of another shard is seen.
 *
 *   stale_check_never_answers_the_next_seize: a leader never answers a
 *      worker's next seize (taken by another shard's leader) with the answer
 *      of its seize before.
 *   withdrawn_entry_never_taken_into_another_shard: an entry withdrawn
 *      without the lock and queued again on shard 2 is never taken into
 *      shard 1's call.
 *   withdrawn_entry_never_elected_for_another_shard: the same through the
 *      election: shard 1's lead never goes to a worker waiting on shard 2.
 *   late_reap_never_clears_a_running_pid: a bury of a pid that runs (given
 *      anew) never clears that worker's entry taken into a call.
 *   bury_never_drops_another_shards_seize: a bury of a dead leader never
 *      drops the seize that a worker given its registry slot queued on
 *      another shard meanwhile.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "batch.h"
#include "cs.h"
#include "runner.h"

struct shared {
    struct batch_area b;
    _Atomic int result[64], result2[64];
    _Atomic int64_t res[64], res2[64];
    _Atomic int ncalls;
    _Atomic int allow;           /* calls 0..allow-1 may finish */
    _Atomic int pause_call;      /* that call's leader gets pause_name before batch_finish() */
    char pause_name[32];
    _Atomic int go2;             /* two-seize workers start their second seize */
    _Atomic int wrong_shard;     /* a call carried a seize of another shard */
};

static struct shared *s;

static void setup(void)
{
    s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert(s != MAP_FAILED);
    ck_assert_int_eq(batch_init(&s->b), CS_OK);
    for (int i = 0; i < 64; i++)
        s->result[i] = s->result2[i] = -1;
    s->allow = 1000;
    s->pause_call = -1;
}

static void teardown(void)
{
    munmap(s, sizeof(*s));
}

/* A leader answers each seize with res = user * 10, once its call may
 * finish; it notes a seize whose activity belongs to another shard. */
static void lead(struct batch_take *t)
{
    int k = atomic_fetch_add(&s->ncalls, 1);
    for (int i = 0; i < t->n; i++) {
        if (t->item[i].activity_id != 1000 + t->shard)
            atomic_fetch_add(&s->wrong_shard, 1);
        t->item[i].outcome = BATCH_OUT_ANSWERED;
        t->item[i].res = t->item[i].user_id * 10;
    }
    while (k >= atomic_load(&s->allow))
        usleep(1000);
    if (k == atomic_load(&s->pause_call))
        setenv("COUPONSEIZE_PAUSE_AT", s->pause_name, 1);
    batch_finish(&s->b, t);
    unsetenv("COUPONSEIZE_PAUSE_AT");
}

/* One seize on shard (activity 1000 + shard) as the worker of slot. */
static int seize(int slot, int shard, int user, int budget_ms, int64_t *res, _Atomic int *out)
{
    static struct batch_take t;
    struct batch_item mine = {.activity_id = 1000 + shard, .user_id = user};
    enum batch_result r = batch_join(&s->b, shard, slot, 32, &mine, cs_mono_ms() + budget_ms, &t);
    if (r == BATCH_LEADER) {
        *res = t.item[t.self].user_id * 10;
        *out = r;                 /* known before its call may finish */
        lead(&t);
    } else {
        *res = mine.res;
    }
    return r;
}

/* A worker of slot: one seize (pause: COUPONSEIZE_PAUSE_AT for it), then,
 * when user2 > 0 and go2 is set, a second one on shard2. */
static pid_t worker2(int slot, int shard, int user, int budget_ms, const char *pause, int shard2,
                     int user2, int budget2_ms)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    int64_t res = 0;
    if (pause != NULL)
        setenv("COUPONSEIZE_PAUSE_AT", pause, 1);
    int r = seize(slot, shard, user, budget_ms, &res, &s->result[slot]);
    unsetenv("COUPONSEIZE_PAUSE_AT");
    s->res[slot] = res;
    s->result[slot] = r;
    if (user2 > 0) {
        while (!atomic_load(&s->go2))
            usleep(1000);
        r = seize(slot, shard2, user2, budget2_ms, &res, &s->result2[slot]);
        s->res2[slot] = res;
        s->result2[slot] = r;
    }
    _exit(0);
}

static pid_t worker(int slot, int shard, int user, int budget_ms, const char *pause)
{
    return worker2(slot, shard, user, budget_ms, pause, 0, 0, 0);
}

static void wait_state(int slot, uint32_t state)
{
    for (int i = 0; i < 5000 && atomic_load(&s->b.entry[slot].state) != state; i++)
        usleep(1000);
    ck_assert_uint_eq(atomic_load(&s->b.entry[slot].state), state);
}

static void wait_result(_Atomic int *r)
{
    for (int i = 0; i < 10000 && atomic_load(r) == -1; i++)
        usleep(1000);
    ck_assert_int_ne(atomic_load(r), -1);
}

/* w's second seize queued, or over already (BATCH_BUSY: its entry is still
 * on a shard whose lock a stopped process holds, so it goes alone). */
static void wait_queued_or_over(int slot)
{
    for (int i = 0; i < 5000 && atomic_load(&s->b.entry[slot].state) != BATCH_QUEUED
                    && atomic_load(&s->result2[slot]) == -1; i++)
        usleep(1000);
    ck_assert(atomic_load(&s->b.entry[slot].state) == BATCH_QUEUED
              || atomic_load(&s->result2[slot]) != -1);
}

static int wait_stopped(pid_t pid)
{
    int st;
    return waitpid(pid, &st, WUNTRACED) == pid && WIFSTOPPED(st);
}

static void reap(pid_t pid)
{
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
}

/* 1 if process pid stops within ms (it must not exit meanwhile). */
static int stopped_within(pid_t pid, int ms)
{
    for (int i = 0; i < ms; i++) {
        int st;
        pid_t r = waitpid(pid, &st, WUNTRACED | WNOHANG);
        ck_assert_int_ne(r, -1);
        if (r == pid) {
            ck_assert(WIFSTOPPED(st));
            return 1;
        }
        usleep(1000);
    }
    return 0;
}

/*
 * x leads call 1 (x, f) on shard 1. f's budget ends in the call: f says
 * UNKNOWN_OUTCOME and clears its entry under shard 1's lock (give_up()).
 * x's batch_finish() stops between its reads of f's entry; f's next seize
 * queues on shard 2 and g takes it (TAKEN). When x goes on, f's old answer
 * (1020) must not reach f's new seize (user 302, activity 1002): g's does.
 */
START_TEST(stale_check_never_answers_the_next_seize)
{
    s->allow = 0;
    pid_t h = worker(0, 1, 100, 8000, NULL);            /* call 0 on shard 1, held */
    wait_state(0, BATCH_TAKEN);
    pid_t x = worker(1, 1, 101, 8000, NULL);
    wait_state(1, BATCH_QUEUED);
    pid_t f = worker2(2, 1, 102, 1500, NULL, 2, 302, 6000);
    wait_state(2, BATCH_QUEUED);
    strcpy(s->pause_name, "batch-finish");
    s->pause_call = 1;
    s->allow = 1;                                       /* x (most time left) takes x, f: call 1 */
    reap(h);
    wait_state(2, BATCH_TAKEN);
    ck_assert_int_eq(s->result[1], BATCH_LEADER);       /* x leads call 1 (x, f) */
    wait_result(&s->result[2]);                         /* f's budget ends inside call 1 */
    ck_assert_int_eq(s->result[2], BATCH_UNKNOWN);
    ck_assert_uint_eq(atomic_load(&s->b.entry[2].state), BATCH_IDLE);
    s->allow = 2;                                       /* x finishes: stops in its check */
    ck_assert(wait_stopped(x));
    pid_t g0 = worker(4, 2, 300, 8000, NULL);           /* call 2 on shard 2, held */
    wait_state(4, BATCH_TAKEN);
    pid_t g = worker(5, 2, 301, 9000, NULL);
    wait_state(5, BATCH_QUEUED);
    s->go2 = 1;                                         /* f's next seize, on shard 2 */
    wait_state(2, BATCH_QUEUED);
    s->allow = 3;                                       /* g takes g, f: call 3, held */
    reap(g0);
    wait_state(2, BATCH_TAKEN);
    kill(x, SIGCONT);                                   /* x loads the state: TAKEN */
    usleep(100 * 1000);
    s->allow = 1000;
    reap(x);
    reap(g);
    reap(f);
    ck_assert_msg(s->result2[2] == BATCH_ANSWERED && s->res2[2] == 3020,
                  "f's second seize (user 302) ended %d with res %lld: the answer of its first "
                  "seize (user 102) from a leader of shard 1", s->result2[2],
                  (long long)s->res2[2]);
}
END_TEST

/*
 * x, elected on shard 1, scans the queue (w QUEUED) under shard 1's lock
 * and is preempted before its CASes. w's deadline comes; the lock is held
 * past BATCH_LOCK_WAIT_MS, so w withdraws without it (QUEUED -> IDLE,
 * UNSENT), and w's next seize queues on shard 2. x resumes: its CAS
 * QUEUED -> TAKEN succeeds on w's shard-2 entry, and shard 1's call carries
 * a seize of shard 2's activity.
 */
START_TEST(withdrawn_entry_never_taken_into_another_shard)
{
    s->allow = 0;
    pid_t h = worker(0, 1, 100, 8000, NULL);            /* call 0 on shard 1, held */
    wait_state(0, BATCH_TAKEN);
    pid_t w = worker2(1, 1, 101, 700, NULL, 2, 302, 2000);
    wait_state(1, BATCH_QUEUED);
    pid_t x = worker(2, 1, 102, 8000, "batch-scan");
    wait_state(2, BATCH_QUEUED);
    s->allow = 1;                                       /* x elected; stops in its scan */
    ck_assert(wait_stopped(x));
    reap(h);
    wait_result(&s->result[1]);                         /* w withdraws, unlocked */
    ck_assert_int_eq(s->result[1], BATCH_UNSENT);
    pid_t g0 = worker(4, 2, 300, 8000, NULL);           /* call 1 on shard 2, held */
    wait_state(4, BATCH_TAKEN);
    s->go2 = 1;                                         /* w's next seize, on shard 2 */
    wait_queued_or_over(1);
    kill(x, SIGCONT);
    usleep(100 * 1000);
    s->allow = 1000;
    reap(x);
    reap(g0);
    reap(w);
    ck_assert_msg(atomic_load(&s->wrong_shard) == 0,
                  "%d seize(s) of shard 2 sent in shard 1's call (w's second seize ended %d, 3 UNKNOWN)",
                  s->wrong_shard, s->result2[1]);
}
END_TEST

/*
 * h finishes call 0 on shard 1 and is preempted in elect_locked() between
 * its scan (w QUEUED) and its CAS. w withdraws without the lock and queues
 * on shard 2. h's CAS QUEUED -> LEAD succeeds on the shard-2 entry: shard 1's
 * lead is w's pid (running, lease = w's shard-2 deadline + 50 ms), so a seize
 * z on shard 1 with nothing in flight waits out its budget, unsent.
 */
START_TEST(withdrawn_entry_never_elected_for_another_shard)
{
    s->allow = 0;
    pid_t h = worker(0, 1, 100, 8000, "batch-elect");   /* call 0 on shard 1, held */
    wait_state(0, BATCH_TAKEN);
    pid_t w = worker2(1, 1, 101, 500, NULL, 2, 302, 4000);
    wait_state(1, BATCH_QUEUED);
    s->allow = 1;                                       /* h finishes; stops electing */
    ck_assert(wait_stopped(h));
    wait_result(&s->result[1]);                         /* w withdraws, unlocked */
    ck_assert_int_eq(s->result[1], BATCH_UNSENT);
    pid_t g0 = worker(4, 2, 300, 8000, NULL);           /* call 1 on shard 2, held */
    wait_state(4, BATCH_TAKEN);
    s->go2 = 1;
    wait_queued_or_over(1);
    kill(h, SIGCONT);
    reap(h);
    int32_t l1 = s->b.shard[1].leader;
    pid_t z = worker(3, 1, 103, 800, NULL);             /* shard 1: nothing in flight */
    wait_result(&s->result[3]);
    s->allow = 1000;
    reap(z);
    reap(g0);
    reap(w);
    ck_assert_msg(l1 != w && s->result[3] == BATCH_LEADER,
                  "shard 1's lead went to w (pid %d) waiting on shard 2: %d; z on an idle "
                  "shard 1 ended %d (0 LEADER, 2 UNSENT)", (int)w, l1 == w, s->result[3]);
}
END_TEST

/*
 * The supervisor buries an exited worker before it reaps it (its pid cannot
 * be anyone else's then); should a bury ever come for a pid given anew, to
 * a worker whose seize is TAKEN into a call that is sent, that worker must
 * not be answered UNSENT. Here the bury is called for the running n.
 */
START_TEST(late_reap_never_clears_a_running_pid)
{
    s->allow = 0;
    pid_t h = worker(0, 1, 100, 8000, NULL);            /* call 0 on shard 1, held */
    wait_state(0, BATCH_TAKEN);
    pid_t n = worker(1, 1, 101, 3000, NULL);
    wait_state(1, BATCH_QUEUED);
    pid_t l = worker(2, 1, 102, 8000, NULL);
    wait_state(2, BATCH_QUEUED);
    s->allow = 1;                                       /* l takes l, n: call 1 (sent), held */
    reap(h);
    wait_state(1, BATCH_TAKEN);
    ck_assert_int_eq(batch_reaped(&s->b, n), 0);        /* the supervisor's late retry */
    wait_result(&s->result[1]);
    s->allow = 1000;
    reap(l);
    reap(n);
    ck_assert_msg(s->result[1] != BATCH_UNSENT,
                  "n, taken into a call that was sent, answered UNSENT after a late reap of "
                  "its pid");
}
END_TEST

/*
 * d led shard 1 and died after its own seize was over (IDLE: what its
 * batch_finish() leaves when it finds the lock held), and the supervisor
 * reaped it unburied; its registry slot goes to n. q, queued behind d,
 * finds it dead and buries it; preempted between its reads of d's old
 * entry and its drop, it must not drop n's seize, queued on shard 2
 * meanwhile: n would answer UNSENT, and shard 2 stall. With the state read
 * first, that entry is no waiting seize of d's and nothing stops there.
 */
START_TEST(bury_never_drops_another_shards_seize)
{
    pid_t d = fork();
    if (d == 0)
        _exit(0);
    reap(d);
    s->b.shard[1].leader = d;
    s->b.shard[1].lead_until = cs_mono_ms() + 8000;
    atomic_store(&s->b.entry[1].pid, d);
    atomic_store(&s->b.entry[1].shard, 1);
    atomic_store(&s->b.entry[1].state, BATCH_IDLE);
    s->allow = 0;
    pid_t g0 = worker(4, 2, 300, 8000, NULL);           /* call 0 on shard 2, held */
    wait_state(4, BATCH_TAKEN);
    pid_t q = worker(3, 1, 103, 3000, "batch-bury");    /* queues behind d, buries it */
    int stopped = stopped_within(q, 1000);
    pid_t n = worker(1, 2, 301, 4000, NULL);            /* d's slot, queued on shard 2 */
    wait_state(1, BATCH_QUEUED);
    if (stopped)
        kill(q, SIGCONT);
    usleep(100 * 1000);
    s->allow = 1000;
    reap(g0);
    reap(n);
    reap(q);
    ck_assert_msg(s->result[1] == BATCH_LEADER && s->res[1] == 3010,
                  "n, queued on shard 2 in a dead leader's old slot, ended %d (2 UNSENT) after "
                  "a bury of shard 1", s->result[1]);
    ck_assert_int_eq(s->result[3], BATCH_LEADER);
    ck_assert_int_eq(s->b.shard[1].leader, 0);
    ck_assert_int_eq(s->b.shard[2].leader, 0);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("batch_races");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, stale_check_never_answers_the_next_seize);
    tcase_add_test(tc, withdrawn_entry_never_taken_into_another_shard);
    tcase_add_test(tc, withdrawn_entry_never_elected_for_another_shard);
    tcase_add_test(tc, late_reap_never_clears_a_running_pid);
    tcase_add_test(tc, bury_never_drops_another_shards_seize);
    suite_add_tcase(su, tc);
    return cs_run_suite(su, 0);
}
