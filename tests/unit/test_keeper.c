/* test_keeper.c - the reserve keeper's decisions in-process, on a shared
 * memory segment and a keeper state made by each test, against a throwaway
 * redis-server: the slot phases (fcgi/keeper/keeper_slots.c), the renewal
 * (fcgi/keeper/keeper_renew.c) and the incarnation's claim (fcgi/keeper/keeper_claim.c),
 * over fcgi/keeper/keeper_base.c. MySQL is a port nothing listens on: every step
 * that needs it must then decide nothing, which the tests check too. */
#include <check.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "conf.h"
#include "cs.h"
#include "keeper/keeper_int.h"
#include "keys.h"
#include "log.h"
#include "reserve.h"
#include "scripts.h"
#include "redis_server.h"
#include "runner.h"

#define AID 4242                 /* shard 2 */
#define SHARD 2
#define EPOCH 7
#define INC "0123456789abcdef0123456789abcdef"
#define LEASE_MS 5000

static pid_t redis_pid;
static int redis_port, dead_port;
static struct cs_conf conf;
static struct keeper k;
static char shm_name[64];
static char journal_dir[64]; /* a test's journal directory, removed at teardown */

/* ---- servers -------------------------------------------------------------------- */

/* A port nothing listens on now. */
static int free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static struct rconn *redis_conn(int port)
{
    struct rconn_opts o = {.host = "127.0.0.1", .port = port, .password = "",
                           .connect_timeout_ms = 500, .command_timeout_ms = 2000,
                           .no_backoff = 1};
    return rconn_new(&o);
}

static void redis_start(void)
{
    if (system("command -v redis-server >/dev/null 2>&1") != 0)
        ck_abort_msg("redis-server is not installed (./bootstrap installs it)");
    redis_port = free_port();
    dead_port = free_port();
    redis_pid = test_redis_start(redis_port);
}

static void redis_stop(void)
{
    test_redis_stop(redis_pid);
}

/* A command that must be answered, not with an error (the reply is freed). */
#define REDIS(...) redis_ok(rconn_command(k.rc, NULL, __VA_ARGS__), #__VA_ARGS__)

static void redis_ok(redisReply *r, const char *what)
{
    ck_assert_msg(r != NULL, "%s: %s", what, k.rc->errstr);
    ck_assert_msg(r->type != REDIS_REPLY_ERROR, "%s: %s", what, r->str);
    freeReplyObject(r);
}

/* HGET key field, as a string in buf ("" when there is none). */
static const char *hget(const char *key, const char *field, char *buf, size_t len)
{
    redisReply *r = rconn_command(k.rc, NULL, "HGET %s %s", key, field);
    ck_assert_ptr_nonnull(r);
    snprintf(buf, len, "%s", r->type == REDIS_REPLY_STRING ? r->str : "");
    freeReplyObject(r);
    return buf;
}

/* ---- the keeper the tests make ------------------------------------------------------ */

/* A keeper of incarnation INC on a fresh segment and an empty Redis, its
 * claim confirmed just now, nothing renewed, no slot in use. */
static void keeper_setup(void)
{
    char err[256];

    conf_defaults(&conf);
    conf.fallback_reserve = 10;
    conf.fallback_lease_ms = LEASE_MS;
    conf.fallback_budget_ms = 1000;
    conf.redis_wait_replicas = 0;
    conf.redis_command_timeout_ms = 2000;
    conf.mysql_port = dead_port;
    conf.mysql_timeout_s = 1;
    memset(&k, 0, sizeof(k));
    k.conf = &conf;
    snprintf(shm_name, sizeof(shm_name), "/cs-test-keeper-%d", (int)getpid());
    k.shm = shm_node_open(shm_name, 1, err, sizeof(err));
    ck_assert_msg(k.shm != NULL, "%s", err);
    k.rv = &k.shm->rsv;
    memcpy(k.jd.incarnation, INC, sizeof(INC));
    k.rc = redis_conn(redis_port);
    k.mc = mconn_new(&conf);
    rscript_from_text(&k.s_renew, script_reserve_renew);
    rscript_from_text(&k.s_give, script_reserve_give_back);
    k.margin_ms = conf.fallback_budget_ms;
    k.list_gen = -2;
    for (int s = 0; s < KEYS_SHARDS; s++)
        k.restored[s] = -1;
    keeper_claim_init(&k);
    k.claimed = 1;
    k.claim_sent = cs_boot_ms();
    REDIS("FLUSHALL");
}

static void keeper_teardown(void)
{
    rscript_free(&k.s_renew);
    rscript_free(&k.s_give);
    rconn_free(k.rc);
    mconn_free(k.mc);
    free(k.closed);
    free(k.release);
    free(k.files);
    if (journal_dir[0] != '\0') {
        char cmd[128];
        journal_dir_close(&k.jd);
        snprintf(cmd, sizeof(cmd), "rm -rf %s", journal_dir);
        ck_assert_int_eq(system(cmd), 0);
        journal_dir[0] = '\0';
    }
    shm_node_close(k.shm);
    shm_node_unlink(shm_name);
    conf_free(&conf);
}

/* Slot i holds epoch EPOCH of activity aid: amount tokens, next the next
 * one, its window around now by Redis' clock, in shared-memory state st
 * and keeper phase ph; its shard renewed this pass, its reserve field
 * found, its stock plenty, fenced and replayed. */
static void slot(int i, int64_t aid, int amount, int next, int st, enum kphase ph)
{
    struct shm_rsv_slot *s = &k.rv->slot[i];
    atomic_store(&s->activity_id, aid);
    atomic_store(&s->epoch, EPOCH);
    atomic_store(&s->amount, amount);
    atomic_store(&s->next, next);
    atomic_store(&s->start_ms, 0);
    atomic_store(&s->end_ms, INT64_MAX / 2);
    atomic_store(&s->open_to_all, 1);
    atomic_store(&s->state, st);
    k.loc[i] = (struct kslot){.phase = ph, .fenced = 1, .pending = 0, .stock = 1000,
                              .held = amount, .field = 1};
    k.renewed[keys_shard(aid)] = 1;
}

/* Redis holds epoch EPOCH of aid open with amount tokens, left of them in
 * this node's reserve field, and a stock of stock. */
static void redis_reserve(int64_t aid, int amount, int left, int stock)
{
    char rkey[KEYS_MAX], ekey[KEYS_MAX], skey[KEYS_MAX], f[96], v[32], id[24];
    keys_reserve(rkey, keys_shard(aid));
    keys_reserve_epochs(ekey, aid);
    keys_stock(skey, keys_shard(aid));
    snprintf(id, sizeof(id), "%lld", (long long)aid);
    snprintf(f, sizeof(f), "%s:%d", INC, EPOCH);
    snprintf(v, sizeof(v), "open:%d", amount);
    REDIS("HSET %s %s %s", ekey, f, v);
    snprintf(f, sizeof(f), "%s:%s", id, INC);
    snprintf(v, sizeof(v), "%d", left);
    REDIS("HSET %s %s %s", rkey, f, v);
    REDIS("HSET %s %s %s", rkey, id, "1");
    snprintf(f, sizeof(f), "%s:held", id);
    REDIS("HSET %s %s %s", rkey, f, v);
    snprintf(v, sizeof(v), "%d", stock);
    REDIS("HSET %s %s %s", skey, id, v);
}

/* The lease of shard as a renewal just now would leave it, Redis' clock
 * at redis_ms. */
static void lease(int shard, int64_t redis_ms)
{
    struct shm_rsv_lease *l = &k.rv->lease[shard];
    int64_t now = cs_boot_ms();
    atomic_store(&l->sent_mono, now - 2);
    atomic_store(&l->recv_mono, now - 1);
    atomic_store(&l->redis_ms, redis_ms);
}

static int state(int i)
{
    return atomic_load(&k.rv->slot[i].state);
}

/* Slot i's next token, amount and activity, as plain numbers for the checks. */
static int next_token(int i)
{
    return atomic_load(&k.rv->slot[i].next);
}

static int amount(int i)
{
    return atomic_load(&k.rv->slot[i].amount);
}

static int64_t activity(int i)
{
    return atomic_load(&k.rv->slot[i].activity_id);
}

/* ---- slot phases: opening ------------------------------------------------------------ */

/* A slot opens only through resume, at what Redis' field says is left: the
 * tokens a deleted segment spent are never handed out again (rule 14). */
START_TEST(resume_opens_at_what_redis_holds)
{
    slot(0, AID, 10, 2, RSV_STOPPED, KP_RESUME);
    redis_reserve(AID, 10, 5, 1000);
    keeper_slots(&k, 0);
    ck_assert_int_eq(k.loc[0].phase, KP_LIVE);
    ck_assert_int_eq(state(0), RSV_OPEN);
    ck_assert_int_eq(next_token(0), 5);
    ck_assert_int_eq(amount(0), 10);
}
END_TEST

/* Redis' amount of the epoch is the truth when smaller; next never goes back. */
START_TEST(resume_takes_the_smaller_amount_and_keeps_next)
{
    slot(0, AID, 10, 4, RSV_STOPPED, KP_RESUME);
    redis_reserve(AID, 8, 8, 1000);
    keeper_slots(&k, 0);
    ck_assert_int_eq(k.loc[0].phase, KP_LIVE);
    ck_assert_int_eq(amount(0), 8);
    ck_assert_int_eq(next_token(0), 4);
}
END_TEST

START_TEST(resume_waits_for_the_replay)
{
    slot(0, AID, 10, 2, RSV_STOPPED, KP_RESUME);
    k.loc[0].pending = 1;
    redis_reserve(AID, 10, 5, 1000);
    keeper_slots(&k, 0);
    ck_assert_int_eq(k.loc[0].phase, KP_RESUME);
    ck_assert_int_eq(state(0), RSV_STOPPED);
    k.loc[0].pending = 0;
    k.loc[0].fenced = 0; /* stopped by this pass: the next one fences it */
    keeper_slots(&k, 0);
    ck_assert_int_eq(k.loc[0].phase, KP_RESUME);
    k.loc[0].fenced = 1;
    keeper_slots(&k, 0);
    ck_assert_int_eq(k.loc[0].phase, KP_LIVE);
}
END_TEST

/* Not before a claim of this instance is confirmed (rule 15). */
START_TEST(resume_waits_for_a_confirmed_claim)
{
    slot(0, AID, 10, 2, RSV_STOPPED, KP_RESUME);
    redis_reserve(AID, 10, 5, 1000);
    k.claim_sent = 0;
    keeper_slots(&k, 0);
    ck_assert_int_eq(k.loc[0].phase, KP_RESUME);
    k.claim_sent = cs_boot_ms() - LEASE_MS - KEEPER_CLAIM_SLACK_MS;
    keeper_slots(&k, 0);
    ck_assert_int_eq(k.loc[0].phase, KP_RESUME);
    ck_assert_int_eq(state(0), RSV_STOPPED);
}
END_TEST

/* An epoch an admin closed in Redis never opens again, whatever MySQL. */
START_TEST(an_epoch_closed_in_redis_never_opens)
{
    char ekey[KEYS_MAX], f[64];
    slot(0, AID, 10, 2, RSV_STOPPED, KP_RESUME);
    redis_reserve(AID, 10, 5, 1000);
    keys_reserve_epochs(ekey, AID);
    snprintf(f, sizeof(f), "%s:%d", INC, EPOCH);
    REDIS("HSET %s %s %s", ekey, f, "closed");
    for (int pass = 0; pass < 3; pass++)
        keeper_slots(&k, 0);
    ck_assert_int_ne(k.loc[0].phase, KP_LIVE);
    ck_assert_int_eq(state(0), RSV_STOPPED);
}
END_TEST

/* A set-aside not yet durable is confirmed (a fence write, the durability
 * rule), then resumed like any other (rule 3). */
START_TEST(a_set_aside_is_confirmed_then_resumed)
{
    char fkey[KEYS_MAX], v[32];
    slot(0, AID, 10, 0, RSV_STOPPED, KP_UNCONFIRMED);
    redis_reserve(AID, 10, 10, 1000);
    keeper_slots(&k, 0);
    ck_assert_int_eq(k.loc[0].phase, KP_LIVE);
    ck_assert_int_eq(state(0), RSV_OPEN);
    keys_fence(fkey, SHARD);
    redisReply *r = rconn_command(k.rc, NULL, "GET %s", fkey);
    ck_assert_ptr_nonnull(r);
    snprintf(v, sizeof(v), "%s", r->type == REDIS_REPLY_STRING ? r->str : "");
    freeReplyObject(r);
    ck_assert_str_eq(v, "1");
}
END_TEST

/* A set-aside whose answer was lost waits for keeper_aside_pass(). */
START_TEST(in_doubt_waits_for_the_aside_pass)
{
    slot(0, AID, 10, 0, RSV_STOPPED, KP_IN_DOUBT);
    redis_reserve(AID, 10, 10, 1000);
    keeper_slots(&k, 0);
    ck_assert_int_eq(k.loc[0].phase, KP_IN_DOUBT);
    ck_assert_int_eq(state(0), RSV_STOPPED);
}
END_TEST

/* A halt (a failed journal write) or a claim not held opens nothing. */
START_TEST(halted_or_unclaimed_opens_nothing)
{
    slot(0, AID, 10, 0, RSV_STOPPED, KP_RESUME);
    redis_reserve(AID, 10, 10, 1000);
    atomic_store(&k.rv->halted, 1);
    keeper_slots(&k, 0);
    ck_assert_int_eq(k.loc[0].phase, KP_LIVE);
    ck_assert_int_eq(state(0), RSV_STOPPED);
    atomic_store(&k.rv->halted, 0);
    k.claimed = 0;
    keeper_slots(&k, 0);
    ck_assert_int_eq(state(0), RSV_STOPPED);
    k.claimed = 1;
    keeper_slots(&k, 0);
    ck_assert_int_eq(state(0), RSV_OPEN);
}
END_TEST

START_TEST(a_shard_not_renewed_decides_nothing)
{
    slot(0, AID, 10, 0, RSV_STOPPED, KP_RESUME);
    redis_reserve(AID, 10, 10, 1000);
    k.renewed[SHARD] = 0;
    keeper_slots(&k, 0);
    ck_assert_int_eq(k.loc[0].phase, KP_RESUME);
    ck_assert_int_eq(state(0), RSV_STOPPED);
}
END_TEST

/* ---- slot phases: giving back -------------------------------------------------------- */

/* At the low-water mark the reserve goes back: the script returns what is
 * left to stock and closes the epoch in Redis; the slot is freed only once
 * MySQL closed it too (unreachable here: it waits, stopped). */
START_TEST(low_water_gives_back_and_waits_for_mysql)
{
    char rkey[KEYS_MAX], skey[KEYS_MAX], ekey[KEYS_MAX], f[96], buf[64];
    slot(0, AID, 10, 4, RSV_OPEN, KP_LIVE);
    redis_reserve(AID, 10, 6, 5);
    k.loc[0].stock = 5;
    k.loc[0].held = 6;
    keeper_slots(&k, 0);
    ck_assert_int_eq(k.loc[0].phase, KP_GIVEBACK);
    ck_assert_int_eq(k.loc[0].low_water, 1);
    ck_assert_int_eq(state(0), RSV_STOPPED);
    ck_assert_int_eq(activity(0), AID); /* not freed */
    keys_reserve(rkey, SHARD);
    keys_stock(skey, SHARD);
    keys_reserve_epochs(ekey, AID);
    snprintf(f, sizeof(f), "%d:%s", AID, INC);
    ck_assert_str_eq(hget(rkey, f, buf, sizeof(buf)), "");
    ck_assert_str_eq(hget(skey, "4242", buf, sizeof(buf)), "11");
    snprintf(f, sizeof(f), "%s:%d", INC, EPOCH);
    ck_assert_str_eq(hget(ekey, f, buf, sizeof(buf)), "closed");
    ck_assert_str_eq(hget(rkey, "4242:low", buf, sizeof(buf)), "1");
}
END_TEST

/* Reasons to give back, each on a live slot that is not yet fenced (so no
 * script runs): the phase turns GIVEBACK and the workers stop. */
START_TEST(revoked_sale_gives_back)
{
    slot(0, AID, 10, 0, RSV_OPEN, KP_LIVE);
    k.loc[0].fenced = 0;
    k.loc[0].stock = -1;
    keeper_slots(&k, 0);
    ck_assert_int_eq(k.loc[0].phase, KP_GIVEBACK);
    ck_assert_int_eq(state(0), RSV_STOPPED);
}
END_TEST

START_TEST(reserve_off_gives_back)
{
    slot(0, AID, 10, 0, RSV_OPEN, KP_LIVE);
    k.loc[0].fenced = 0;
    conf.fallback_reserve = 0;
    keeper_slots(&k, 0);
    ck_assert_int_eq(k.loc[0].phase, KP_GIVEBACK);
}
END_TEST

START_TEST(spent_reserve_gives_back)
{
    slot(0, AID, 10, 10, RSV_OPEN, KP_LIVE);
    k.loc[0].fenced = 0;
    keeper_slots(&k, 0);
    ck_assert_int_eq(k.loc[0].phase, KP_GIVEBACK);
}
END_TEST

/* The sale's end, by the lease's bound on Redis' clock, less the margin. */
START_TEST(sale_end_gives_back)
{
    slot(0, AID, 10, 0, RSV_OPEN, KP_LIVE);
    k.loc[0].fenced = 0;
    lease(SHARD, 5000000);
    atomic_store(&k.rv->slot[0].end_ms, 5000000 + k.margin_ms / 2);
    keeper_slots(&k, 0);
    ck_assert_int_eq(k.loc[0].phase, KP_GIVEBACK);
}
END_TEST

/* A stock field missing (a restore under way) is no reason (rule 18), nor
 * is an end still further than the margin. */
START_TEST(restore_under_way_is_no_reason)
{
    slot(0, AID, 10, 0, RSV_OPEN, KP_LIVE);
    k.loc[0].stock = INT64_MIN;
    lease(SHARD, 5000000);
    atomic_store(&k.rv->slot[0].end_ms, 5000000 + 10 * k.margin_ms);
    keeper_slots(&k, 0);
    ck_assert_int_eq(k.loc[0].phase, KP_LIVE);
    ck_assert_int_eq(state(0), RSV_OPEN);
}
END_TEST

/* A stop gives back every slot, renewed or not, and stops them at once. */
START_TEST(stopping_stops_every_slot)
{
    slot(0, AID, 10, 0, RSV_OPEN, KP_LIVE);
    slot(1, AID + 1, 10, 0, RSV_STOPPED, KP_RESUME);
    k.renewed[keys_shard(AID + 1)] = 0;
    keeper_slots(&k, 1);
    ck_assert_int_eq(k.loc[0].phase, KP_GIVEBACK);
    ck_assert_int_eq(k.loc[1].phase, KP_GIVEBACK);
    ck_assert_int_eq(state(0), RSV_STOPPED);
    ck_assert_int_eq(state(1), RSV_STOPPED);
}
END_TEST

/* ---- slot phases: closed elsewhere ---------------------------------------------------- */

/* A field gone (an admin's return, Redis lost it) stops the slot at once;
 * with MySQL unreachable the keeper cannot tell which, and waits. */
START_TEST(field_gone_stops_the_slot)
{
    slot(0, AID, 10, 0, RSV_OPEN, KP_LIVE);
    k.loc[0].field = 0;
    keeper_slots(&k, 0);
    ck_assert_int_eq(state(0), RSV_STOPPED);
    ck_assert_int_eq(k.loc[0].phase, KP_LIVE);
    ck_assert_int_eq(activity(0), AID);
}
END_TEST

START_TEST(closed_slot_is_freed_once_replayed)
{
    slot(0, AID, 10, 3, RSV_STOPPED, KP_CLOSED);
    k.loc[0].pending = 2;
    keeper_slots(&k, 0);
    ck_assert_int_eq(state(0), RSV_STOPPED);
    k.loc[0].pending = 0;
    keeper_slots(&k, 0);
    ck_assert_int_eq(state(0), RSV_EMPTY);
    ck_assert_int_eq(activity(0), 0);
    ck_assert_int_eq(k.loc[0].phase, KP_LIVE); /* zeroed */
}
END_TEST

/* A worker inside a grant of the epoch holds the fence, whatever slot it
 * named (a keeper restart refills slots in another order). */
START_TEST(a_grant_in_flight_holds_a_closed_slot)
{
    slot(0, AID, 10, 3, RSV_STOPPED, KP_CLOSED);
    atomic_store(&k.shm->worker_pid[3], (int32_t)getpid()); /* a live worker's */
    atomic_store(&k.rv->busy_aid[3], AID);
    atomic_store(&k.rv->busy_epoch[3], EPOCH);
    atomic_store(&k.rv->busy[3], 5);
    keeper_slots(&k, 0);
    ck_assert_int_eq(state(0), RSV_STOPPED);
    ck_assert_int_eq(keeper_markers_down(&k), 0);
    atomic_store(&k.rv->busy[3], 0);
    keeper_slots(&k, 0);
    ck_assert_int_eq(state(0), RSV_EMPTY);
}
END_TEST

/* A worker that died inside a grant with nobody to reap it (an orphan of a
 * supervisor that died, killed) leaves its marker up: it holds nothing, and
 * must neither fence its epoch for ever nor keep a restarted keeper from
 * being named. */
START_TEST(a_dead_workers_marker_holds_nothing)
{
    pid_t dead = fork();
    if (dead == 0)
        _exit(0);
    ck_assert_int_gt(dead, 0);
    ck_assert_int_eq(waitpid(dead, NULL, 0), dead);
    slot(0, AID, 10, 3, RSV_STOPPED, KP_CLOSED);
    atomic_store(&k.shm->worker_pid[3], (int32_t)dead);
    atomic_store(&k.rv->busy_aid[3], AID);
    atomic_store(&k.rv->busy_epoch[3], EPOCH);
    atomic_store(&k.rv->busy[3], 5);
    ck_assert_int_eq(keeper_markers_down(&k), 1);
    ck_assert_int_eq(atomic_load(&k.rv->busy[3]), 0);
    atomic_store(&k.rv->busy[3], 5);
    keeper_slots(&k, 0);
    ck_assert_int_eq(state(0), RSV_EMPTY);
}
END_TEST

/* ---- renewal ---------------------------------------------------------------------------- */

/* A renewal reads the sale (field, stock, window, held) and makes the lease
 * good from the older of its send and the last confirmed claim. */
START_TEST(renewal_reads_the_sale_and_makes_the_lease)
{
    char wkey[KEYS_MAX], rkey[KEYS_MAX], f[64], buf[64];
    slot(0, AID, 10, 0, RSV_OPEN, KP_LIVE);
    k.loc[0] = (struct kslot){.phase = KP_LIVE};
    redis_reserve(AID, 10, 7, 100);
    keys_window(wkey, SHARD);
    REDIS("HSET %s %s %s", wkey, "4242", "1000,2000000000000");
    k.claim_sent = cs_boot_ms() - 100;
    int64_t before = cs_boot_ms();
    ck_assert_int_eq(keeper_renew(&k, SHARD), CS_OK);
    ck_assert_int_eq(k.loc[0].field, 1);
    ck_assert_int_eq(k.loc[0].stock, 100);
    ck_assert_int_eq(k.loc[0].held, 7);
    ck_assert_int_eq(atomic_load(&k.rv->slot[0].start_ms), 1000);
    ck_assert_int_eq(atomic_load(&k.rv->slot[0].end_ms), 2000000000000LL);
    ck_assert_int_eq(state(0), RSV_OPEN);
    struct shm_rsv_lease *l = &k.rv->lease[SHARD];
    ck_assert_int_eq(atomic_load(&l->sent_mono), k.claim_sent);
    ck_assert_int_ge(atomic_load(&l->recv_mono), before);
    ck_assert_int_gt(atomic_load(&l->redis_ms), 1700000000000LL);
    int64_t lo, hi;
    ck_assert_int_eq(reserve_lease(k.rv, SHARD, LEASE_MS, cs_boot_ms(), &lo, &hi, NULL), CS_OK);
    /* The stamp and the lease an admin's return judges this node by. */
    keys_reserve(rkey, SHARD);
    snprintf(f, sizeof(f), "lease:%s", INC);
    ck_assert_str_ne(hget(rkey, f, buf, sizeof(buf)), "");
    snprintf(f, sizeof(f), "lease:%s:ms", INC);
    ck_assert_str_eq(hget(rkey, f, buf, sizeof(buf)), "5000");
}
END_TEST

/* A claim answered but never confirmed makes no lease; one refused fails. */
START_TEST(no_confirmed_claim_no_lease)
{
    slot(0, AID, 10, 0, RSV_OPEN, KP_LIVE);
    redis_reserve(AID, 10, 7, 100);
    k.claim_sent = 0;
    ck_assert_int_eq(keeper_renew(&k, SHARD), CS_OK);
    ck_assert_int_eq(atomic_load(&k.rv->lease[SHARD].sent_mono), 0);
    k.claimed = 0;
    ck_assert_int_eq(keeper_renew(&k, SHARD), CS_ERR);
    ck_assert_int_eq(atomic_load(&k.rv->lease[SHARD].sent_mono), 0);
}
END_TEST

/* Its field gone, a slot stops before the renewal makes the lease good. */
START_TEST(renewal_stops_a_slot_whose_field_is_gone)
{
    slot(0, AID, 10, 0, RSV_OPEN, KP_LIVE);
    ck_assert_int_eq(keeper_renew(&k, SHARD), CS_OK);
    ck_assert_int_eq(k.loc[0].field, 0);
    ck_assert_int_eq(k.loc[0].stock, INT64_MIN);
    ck_assert_int_eq(state(0), RSV_STOPPED);
}
END_TEST

START_TEST(renewal_finds_a_field_restored)
{
    slot(0, AID, 10, 0, RSV_STOPPED, KP_AWAITS_RESTORE);
    redis_reserve(AID, 10, 7, 100);
    ck_assert_int_eq(keeper_renew(&k, SHARD), CS_OK);
    ck_assert_int_eq(k.loc[0].phase, KP_RESUME);
}
END_TEST

/* A restore generation that moved holds every slot of that shard (rule 10). */
START_TEST(a_restore_holds_the_shard)
{
    char rkey[KEYS_MAX];
    slot(0, AID, 10, 0, RSV_OPEN, KP_LIVE);
    slot(1, AID + 1, 10, 0, RSV_OPEN, KP_LIVE);
    redis_reserve(AID, 10, 7, 100);
    keys_reserve(rkey, SHARD);
    REDIS("HSET %s %s %s", rkey, "restored", "5");
    ck_assert_int_eq(keeper_renew(&k, SHARD), CS_OK);
    ck_assert_int_eq(k.restored[SHARD], 5); /* the first seen */
    ck_assert_int_eq(k.loc[0].phase, KP_LIVE);
    REDIS("HSET %s %s %s", rkey, "restored", "6");
    ck_assert_int_eq(keeper_renew(&k, SHARD), CS_OK);
    ck_assert_int_eq(k.restored[SHARD], 6);
    ck_assert_int_eq(k.loc[0].phase, KP_RESUME);
    ck_assert_int_eq(state(0), RSV_STOPPED);
    ck_assert_int_eq(k.loc[1].phase, KP_LIVE); /* another shard */
    ck_assert_int_eq(state(1), RSV_OPEN);
}
END_TEST

/* More slots of one shard than one call asks about: each is read. */
START_TEST(renewal_of_many_slots_takes_more_calls)
{
    enum { N = 25 };
    for (int i = 0; i < N; i++) {
        int64_t aid = SHARD + 10 * (i + 1);
        slot(i, aid, 10, 0, RSV_OPEN, KP_LIVE);
        k.loc[i] = (struct kslot){.phase = KP_LIVE};
        redis_reserve(aid, 10, i + 1, 100 + i);
    }
    ck_assert_int_eq(keeper_renew(&k, SHARD), CS_OK);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(k.loc[i].field, 1);
        ck_assert_int_eq(k.loc[i].stock, 100 + i);
        ck_assert_int_eq(k.loc[i].held, i + 1);
    }
}
END_TEST

START_TEST(no_redis_renews_nothing)
{
    slot(0, AID, 10, 0, RSV_OPEN, KP_LIVE);
    k.loc[0] = (struct kslot){.phase = KP_LIVE, .field = 1, .stock = 9};
    struct rconn *live = k.rc;
    k.rc = redis_conn(dead_port); /* nothing listens there */
    ck_assert_int_eq(keeper_renew(&k, SHARD), CS_ERR);
    rconn_free(k.rc);
    k.rc = live;
    ck_assert_int_eq(k.loc[0].stock, 9);
    ck_assert_int_eq(state(0), RSV_OPEN);
    ck_assert_int_eq(atomic_load(&k.rv->lease[SHARD].sent_mono), 0);
}
END_TEST

/* ---- the claim ---------------------------------------------------------------------------- */

static void claim_holder(const char *holder)
{
    char key[KEYS_MAX];
    keys_reserve_claim(key, INC);
    REDIS("SET %s %s", key, holder);
}

START_TEST(claim_is_taken_and_confirmed)
{
    char key[KEYS_MAX];
    slot(0, AID, 10, 0, RSV_OPEN, KP_LIVE);
    k.claimed = 0;
    k.claim_sent = 0;
    int64_t before = cs_boot_ms();
    ck_assert_int_eq(keeper_claim(&k), CS_OK);
    ck_assert_int_eq(k.claimed, 1);
    ck_assert_int_ge(k.claim_sent, before);
    ck_assert(keeper_claim_confirmed(&k, cs_boot_ms()));
    keys_reserve_claim(key, INC);
    redisReply *r = rconn_command(k.rc, NULL, "GET %s", key);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->type, REDIS_REPLY_STRING);
    ck_assert_str_eq(r->str, k.claim);
    freeReplyObject(r);
    /* Taken anew (2): another instance may have spent, so the slot that
     * was live resumes from Redis' field. Held all along (1): nothing. */
    ck_assert_int_eq(k.loc[0].phase, KP_RESUME);
    k.loc[0].phase = KP_LIVE;
    atomic_store(&k.rv->slot[0].state, RSV_OPEN);
    ck_assert_int_eq(keeper_claim(&k), CS_OK);
    ck_assert_int_eq(k.loc[0].phase, KP_LIVE);
    ck_assert_int_eq(state(0), RSV_OPEN);
}
END_TEST

/* Another live instance holds it (a copied image): nothing spends. */
START_TEST(claim_held_by_another_live_instance)
{
    slot(0, AID, 10, 0, RSV_OPEN, KP_LIVE);
    claim_holder("elsewhere 00000000-0000-0000-0000-000000000000 1");
    ck_assert_int_eq(keeper_claim(&k), CS_ERR);
    ck_assert_int_eq(k.claimed, 0);
    ck_assert_int_eq(k.claim_sent, 0);
    ck_assert_int_eq(atomic_load(&k.rv->claim_refused), 1);
    ck_assert_int_eq(k.loc[0].phase, KP_RESUME);
    ck_assert_int_eq(state(0), RSV_STOPPED);
    ck_assert(!keeper_claim_confirmed(&k, cs_boot_ms()));
}
END_TEST

/* A keeper of this incarnation that died on this machine since its boot is
 * replaced at once (a restart), not waited out. */
START_TEST(claim_of_a_dead_keeper_here_is_taken)
{
    char host[128], boot[64], holder[256];
    int pid;
    ck_assert_int_eq(sscanf(k.claim, "%127s %63s %d", host, boot, &pid), 3);
    pid_t dead = fork();
    if (dead == 0)
        _exit(0);
    waitpid(dead, NULL, 0);
    snprintf(holder, sizeof(holder), "%s %s %d", host, boot, (int)dead);
    claim_holder(holder);
    slot(0, AID, 10, 0, RSV_OPEN, KP_LIVE);
    ck_assert_int_eq(keeper_claim(&k), CS_OK);
    ck_assert_int_eq(k.claimed, 1);
    ck_assert_int_eq(k.loc[0].phase, KP_RESUME);
    ck_assert_int_eq(atomic_load(&k.rv->claim_refused), 0);
}
END_TEST

/* A claim holds for the lease and its slack from when it was sent. */
START_TEST(claim_lasts_its_lease_and_slack)
{
    int64_t now = cs_boot_ms();
    k.claim_sent = now - LEASE_MS - KEEPER_CLAIM_SLACK_MS + 100;
    ck_assert(keeper_claim_confirmed(&k, now));
    ck_assert(!keeper_claim_confirmed(&k, now + 100));
    /* A call sent now must end within it too (command timeout 2 s). */
    ck_assert(!keeper_claim_lasts(&k));
    k.claim_sent = now;
    ck_assert(keeper_claim_lasts(&k));
}
END_TEST

/* ---- the replay pass ------------------------------------------------------------------ */

/* A worker still inside its grant when a new keeper rebuilt the grants
 * table (an upgrade in place waits 3 s for it, not longer) writes its record
 * after the keeper's start-up scan: the table does not know the user. The
 * next pass, Redis away or not, makes the grant known, so the user is told
 * ALREADY_SEIZED, not granted a second token. */
START_TEST(a_record_the_table_lost_is_known_after_a_pass)
{
    char *dir = journal_dir, err[256];
    struct journal j;
    struct journal_rec rec = {.activity_id = AID, .epoch = EPOCH, .token = 0, .user_id = 99,
                              .seize_ms = 1};

    snprintf(journal_dir, sizeof(journal_dir), "/tmp/cs-test-keeper-jXXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(journal_dir));
    ck_assert_msg(journal_dir_open(&k.jd, dir, err, sizeof(err)) == CS_OK, "%s", err);
    char path[256];
    journal_segment_path(path, sizeof(path), dir, 0, 1);
    ck_assert_msg(journal_open_path(&j, path, err, sizeof(err)) == CS_OK, "%s", err);
    ck_assert_int_eq(journal_append(&j, &rec), CS_OK);
    journal_close(&j);
    ck_assert_int_lt(reserve_grant_find(k.rv, AID, 99), 0);
    keeper_journal_replay(&k); /* nothing renewed: nothing goes to Redis */
    int e = reserve_grant_find(k.rv, AID, 99);
    ck_assert_int_ge(e, 0);
    ck_assert_int_eq(atomic_load(&k.rv->grant[e].state), RGRANT_GRANTED);
    ck_assert_int_eq(atomic_load(&k.rv->journal_depth), 1);
}
END_TEST

int main(void)
{
    log_init("test_keeper", LOG_LVL_WARNING, "stderr");
    Suite *s = suite_create("keeper");
    TCase *ts = tcase_create("slots");
    tcase_add_unchecked_fixture(ts, redis_start, redis_stop);
    tcase_add_checked_fixture(ts, keeper_setup, keeper_teardown);
    tcase_add_test(ts, resume_opens_at_what_redis_holds);
    tcase_add_test(ts, resume_takes_the_smaller_amount_and_keeps_next);
    tcase_add_test(ts, resume_waits_for_the_replay);
    tcase_add_test(ts, resume_waits_for_a_confirmed_claim);
    tcase_add_test(ts, an_epoch_closed_in_redis_never_opens);
    tcase_add_test(ts, a_set_aside_is_confirmed_then_resumed);
    tcase_add_test(ts, in_doubt_waits_for_the_aside_pass);
    tcase_add_test(ts, halted_or_unclaimed_opens_nothing);
    tcase_add_test(ts, a_shard_not_renewed_decides_nothing);
    tcase_add_test(ts, low_water_gives_back_and_waits_for_mysql);
    tcase_add_test(ts, revoked_sale_gives_back);
    tcase_add_test(ts, reserve_off_gives_back);
    tcase_add_test(ts, spent_reserve_gives_back);
    tcase_add_test(ts, sale_end_gives_back);
    tcase_add_test(ts, restore_under_way_is_no_reason);
    tcase_add_test(ts, stopping_stops_every_slot);
    tcase_add_test(ts, field_gone_stops_the_slot);
    tcase_add_test(ts, closed_slot_is_freed_once_replayed);
    tcase_add_test(ts, a_grant_in_flight_holds_a_closed_slot);
    tcase_add_test(ts, a_dead_workers_marker_holds_nothing);
    suite_add_tcase(s, ts);
    TCase *tr = tcase_create("renew");
    tcase_add_unchecked_fixture(tr, redis_start, redis_stop);
    tcase_add_checked_fixture(tr, keeper_setup, keeper_teardown);
    tcase_add_test(tr, renewal_reads_the_sale_and_makes_the_lease);
    tcase_add_test(tr, no_confirmed_claim_no_lease);
    tcase_add_test(tr, renewal_stops_a_slot_whose_field_is_gone);
    tcase_add_test(tr, renewal_finds_a_field_restored);
    tcase_add_test(tr, a_restore_holds_the_shard);
    tcase_add_test(tr, renewal_of_many_slots_takes_more_calls);
    tcase_add_test(tr, no_redis_renews_nothing);
    suite_add_tcase(s, tr);
    TCase *tc = tcase_create("claim");
    tcase_add_unchecked_fixture(tc, redis_start, redis_stop);
    tcase_add_checked_fixture(tc, keeper_setup, keeper_teardown);
    tcase_add_test(tc, claim_is_taken_and_confirmed);
    tcase_add_test(tc, claim_held_by_another_live_instance);
    tcase_add_test(tc, claim_of_a_dead_keeper_here_is_taken);
    tcase_add_test(tc, claim_lasts_its_lease_and_slack);
    suite_add_tcase(s, tc);
    TCase *tj = tcase_create("replay");
    tcase_add_unchecked_fixture(tj, redis_start, redis_stop);
    tcase_add_checked_fixture(tj, keeper_setup, keeper_teardown);
    tcase_add_test(tj, a_record_the_table_lost_is_known_after_a_pass);
    suite_add_tcase(s, tj);
    /* Fork mode would kill the fixture's server with the first test child. */
    return cs_run_suite(s, 1);
}
