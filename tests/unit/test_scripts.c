/* test_scripts.c - every script of lua/ on its own: it is built in, and a
 * throwaway redis-server compiles it (SCRIPT LOAD). */
#include <check.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cs.h"
#include "rconn.h"
#include "scripts.h"
#include "redis_server.h"
#include "runner.h"

static pid_t redis_pid;
static int redis_port;

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

static struct rconn *redis_conn(void)
{
    struct rconn_opts o = {.host = "127.0.0.1", .port = redis_port, .password = "",
                           .connect_timeout_ms = 500, .command_timeout_ms = 2000,
                           .no_backoff = 1};
    return rconn_new(&o);
}

static void redis_start(void)
{
    redis_port = free_port();
    redis_pid = test_redis_start(redis_port);
}

static void redis_stop(void)
{
    test_redis_stop(redis_pid);
}

/* Script _i compiles: SCRIPT LOAD answers its SHA1. */
START_TEST(script_loads)
{
    const struct script_text *s = &script_all[_i];
    if (system("command -v redis-server >/dev/null 2>&1") != 0)
        ck_abort_msg("redis-server is not installed (./bootstrap installs it)");
    struct rconn *rc = redis_conn();
    redisReply *r = rconn_command(rc, NULL, "SCRIPT LOAD %s", s->text);
    ck_assert_msg(r != NULL, "%s: %s", s->name, rc->errstr);
    ck_assert_msg(r->type == REDIS_REPLY_STRING && r->len == 40, "lua/%s.lua: %s", s->name,
                  r->type == REDIS_REPLY_ERROR ? r->str : "no SHA1");
    freeReplyObject(r);
    rconn_free(rc);
}
END_TEST

/* The text of lua/NAME.lua as built in. */
static const char *script_text(const char *name)
{
    for (int i = 0; i < script_count; i++)
        if (strcmp(script_all[i].name, name) == 0)
            return script_all[i].text;
    ck_abort_msg("no script %s", name);
    return NULL;
}

/* HSET KEY FIELD VALUE, which must succeed. */
static void hset(struct rconn *rc, const char *key, const char *field, const char *value)
{
    redisReply *r = rconn_command(rc, NULL, "HSET %s %s %s", key, field, value);
    ck_assert_ptr_nonnull(r);
    ck_assert_msg(r->type == REDIS_REPLY_INTEGER, "HSET %s: %s", key,
                  r->type == REDIS_REPLY_ERROR ? r->str : "not an integer");
    freeReplyObject(r);
}

/* HGET KEY FIELD answers WANT (NULL: no such field). */
static void hget_is(struct rconn *rc, const char *key, const char *field, const char *want)
{
    redisReply *r = rconn_command(rc, NULL, "HGET %s %s", key, field);
    ck_assert_ptr_nonnull(r);
    if (want == NULL) {
        ck_assert_int_eq(r->type, REDIS_REPLY_NIL);
    } else {
        ck_assert_msg(r->type == REDIS_REPLY_STRING, "HGET %s %s: no string", key, field);
        ck_assert_str_eq(r->str, want);
    }
    freeReplyObject(r);
}

/* How many of keys A and B exist (one named twice counts twice). */
static long long exist(struct rconn *rc, const char *a, const char *b)
{
    redisReply *r = rconn_command(rc, NULL, "EXISTS %s %s", a, b);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->type, REDIS_REPLY_INTEGER);
    long long n = r->integer;
    freeReplyObject(r);
    return n;
}

/* reserve_replay.lua once, on the keys of slot {tag}: token 0 of epoch 1
 * of incarnation inc1, activity aid, user 7, seized at 1700000000000.
 * Returns its answer. */
static long long replay_once(struct rconn *rc, int tag, int aid)
{
    redisReply *r = rconn_command(rc, NULL, "EVAL %s 6 S:{%d} L:{%d} Q:{%d} R:{%d} E:{%d} D:{%d} "
                                  "%d 7 inc1 1 0 1700000000000", script_text("reserve_replay"),
                                  tag, tag, tag, tag, tag, tag, aid);
    ck_assert_ptr_nonnull(r);
    ck_assert_msg(r->type == REDIS_REPLY_INTEGER, "%s",
                  r->type == REDIS_REPLY_ERROR ? r->str : "not an integer");
    long long res = r->integer;
    freeReplyObject(r);
    return res;
}

/* reserve_replay.lua on a token whose marker names another user, in a
 * sale sold out: the grant goes to the dead letters once (-4); the same
 * record read again (a restarted keeper, or one held behind a record that
 * waits) changes nothing and says so (-6), so it is neither counted nor
 * logged a second time. */
START_TEST(replay_of_a_token_spent_twice_is_dead_lettered_once)
{
    struct rconn *rc = redis_conn();
    hset(rc, "E:{1}", "inc1:1:0", "999");
    hset(rc, "S:{1}", "4201", "0");
    ck_assert_int_eq(replay_once(rc, 1, 4201), SCRIPT_REPLAY_SPENT_TWICE);
    ck_assert_int_eq(replay_once(rc, 1, 4201), SCRIPT_REPLAY_SPENT_TWICE_KNOWN);
    redisReply *r = rconn_command(rc, NULL, "HLEN D:{1}");
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->integer, 1);
    freeReplyObject(r);
    hget_is(rc, "D:{1}", "4201:inc1:1:0:7", "7:1700000000000:token spent twice (marker of 999)");
    hget_is(rc, "S:{1}", "4201", "0");                 /* nothing taken */
    ck_assert_int_eq(exist(rc, "L:{1}", "Q:{1}"), 0);  /* nobody granted, nothing queued */
    hget_is(rc, "E:{1}", "inc1:1:0", "999"); /* the other user's marker is left as it was */
    rconn_free(rc);
}
END_TEST

/* The same with stock left and a user who holds no coupon: both users were
 * told SEIZED (two instances of one incarnation spent the token), so this
 * one's grant takes a coupon from stock (5) and still goes to the dead
 * letters as the anomaly it is. Read again, it is a grant replayed before
 * (0: its own marker), even when an operator has removed the dead letter. */
START_TEST(replay_of_a_token_spent_twice_takes_from_stock)
{
    struct rconn *rc = redis_conn();
    hset(rc, "E:{2}", "inc1:1:0", "999");
    hset(rc, "S:{2}", "4202", "5");
    for (int round = 0; round < 3; round++) {
        if (round == 2) {
            redisReply *r = rconn_command(rc, NULL, "DEL D:{2}");
            ck_assert_ptr_nonnull(r);
            freeReplyObject(r);
        }
        ck_assert_int_eq(replay_once(rc, 2, 4202),
                         round == 0 ? SCRIPT_REPLAY_TWICE_STOCK : SCRIPT_REPLAY_BEFORE);
        if (round == 0)
            hget_is(rc, "D:{2}", "4202:inc1:1:0:7",
                    "7:1700000000000:token spent twice (marker of 999); granted from stock");
    }
    hget_is(rc, "S:{2}", "4202", "4"); /* one coupon taken, once */
    ck_assert_int_eq(exist(rc, "D:{2}", "D:{2}"), 0); /* read again: no dead letter anew */
    hget_is(rc, "L:{2}", "7", "1700000000000");
    hget_is(rc, "Q:{2}", "4202:7", "1700000000000");
    hget_is(rc, "E:{2}", "inc1:1:0", "999");
    rconn_free(rc);
}
END_TEST

/* A token spent twice whose grant must not take from stock: a user who
 * holds a coupon already, a revoked sale (its tombstone, stock < 0), a sale
 * whose stock field is gone (cleanup under way): each to the dead letters
 * (-4), stock, seize list and queue untouched; read again, -6. */
START_TEST(replay_of_a_token_spent_twice_without_stock_to_take)
{
    static const struct {
        const char *stock;     /* the stock field, or NULL: none */
        int holds;             /* the user is in the seize list */
        const char *letter;    /* the dead letter */
    } c[] = {
        {"5", 1, "7:1700000000000:token spent twice (marker of 999); the user holds a coupon"},
        {"-1", 0, "7:1700000000000:token spent twice (marker of 999)"},
        {NULL, 0, "7:1700000000000:token spent twice (marker of 999)"},
    };
    struct rconn *rc = redis_conn();
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        redisReply *r = rconn_command(rc, NULL, "DEL S:{3} L:{3} Q:{3} E:{3} D:{3}");
        ck_assert_ptr_nonnull(r);
        freeReplyObject(r);
        hset(rc, "E:{3}", "inc1:1:0", "999");
        if (c[i].stock != NULL)
            hset(rc, "S:{3}", "4203", c[i].stock);
        if (c[i].holds)
            hset(rc, "L:{3}", "7", "1600000000000");
        ck_assert_int_eq(replay_once(rc, 3, 4203), SCRIPT_REPLAY_SPENT_TWICE);
        ck_assert_int_eq(replay_once(rc, 3, 4203), SCRIPT_REPLAY_SPENT_TWICE_KNOWN);
        hget_is(rc, "S:{3}", "4203", c[i].stock);
        /* the coupon it held, kept */
        hget_is(rc, "L:{3}", "7", c[i].holds ? "1600000000000" : NULL);
        ck_assert_int_eq(exist(rc, "Q:{3}", "Q:{3}"), 0); /* nothing queued for MySQL */
        hget_is(rc, "D:{3}", "4203:inc1:1:0:7", c[i].letter);
        hget_is(rc, "E:{3}", "inc1:1:0", "999");
    }
    rconn_free(rc);
}
END_TEST

/* Sale 11 of slot {tag} for seize_batch.lua: a stock of 5, on sale from a
 * minute ago for ten minutes. */
static void batch_sale(struct rconn *rc, int tag)
{
    char key[16], window[48];
    long long now = cs_now_ms();
    snprintf(key, sizeof(key), "S:{%d}", tag);
    hset(rc, key, "11", "5");
    snprintf(key, sizeof(key), "W:{%d}", tag);
    snprintf(window, sizeof(window), "%lld,%lld", now - 60000, now + 600000);
    hset(rc, key, "11", window);
}

/* seize_batch.lua stores each grant's time in the seize list and the sync
 * queue as the decimal milliseconds it answers (Redis' clock), the form
 * lua/coupon_return.lua compares as a string; read again, the same batch
 * answers -1 with that time for each user. */
START_TEST(seize_batch_stores_the_time_it_answers)
{
    struct rconn *rc = redis_conn();
    batch_sale(rc, 9);
    const char *text = script_text("seize_batch");
    long long first = 0;
    for (int pass = 0; pass < 2; pass++) {
        redisReply *r = rconn_command(rc, NULL,
                                      "EVAL %s 4 S:{9} Q:{9} W:{9} L:11_{9} 11 501 4 11 502 4", text);
        ck_assert_ptr_nonnull(r);
        ck_assert_msg(r->type == REDIS_REPLY_ARRAY && r->elements == 5, "%s",
                      r->type == REDIS_REPLY_ERROR ? r->str : "not 5 elements");
        if (pass == 0) {
            first = r->element[0]->integer;
            ck_assert_int_eq(r->element[1]->integer, 4);
            ck_assert_int_eq(r->element[3]->integer, 3);
        } else {
            ck_assert_int_eq(r->element[1]->integer, -1);
            ck_assert_int_eq(r->element[2]->integer, first);
            ck_assert_int_eq(r->element[3]->integer, -1);
            ck_assert_int_eq(r->element[4]->integer, first);
        }
        freeReplyObject(r);
    }
    char want[32];
    snprintf(want, sizeof(want), "%lld", first);
    hget_is(rc, "L:11_{9}", "501", want);
    hget_is(rc, "L:11_{9}", "502", want);
    hget_is(rc, "Q:{9}", "11:501", want);
    hget_is(rc, "Q:{9}", "11:502", want);
    hget_is(rc, "S:{9}", "11", "3");
    rconn_free(rc);
}
END_TEST

/* A batch that is not whole triples is refused before it reads or writes. */
START_TEST(seize_batch_refuses_a_partial_triple)
{
    struct rconn *rc = redis_conn();
    batch_sale(rc, 8);
    const char *text = script_text("seize_batch");
    /* hiredis splits the format at spaces, not the text of a %s. */
    const char *cmd[] = {"EVAL %s 4 S:{8} Q:{8} W:{8} L:11_{8} 11 601 4 11",
                         "EVAL %s 4 S:{8} Q:{8} W:{8} L:11_{8} 11 601 4 11 602",
                         "EVAL %s 4 S:{8} Q:{8} W:{8} L:11_{8}"};
    for (size_t i = 0; i < sizeof(cmd) / sizeof(cmd[0]); i++) {
        redisReply *r = rconn_command(rc, NULL, cmd[i], text);
        ck_assert_ptr_nonnull(r);
        ck_assert_msg(r->type == REDIS_REPLY_ERROR, "call %zu was not refused", i);
        freeReplyObject(r);
    }
    ck_assert_int_eq(exist(rc, "L:11_{8}", "Q:{8}"), 0);
    hget_is(rc, "S:{8}", "11", "5");
    rconn_free(rc);
}
END_TEST

/* One EVAL of seize_batch.lua for sales 11 and 12 of slot {tag}, users 701
 * (sale 11) and 702 (sale 12), with list index idx12 for sale 12: must be
 * refused, with nothing written. */
static void batch_refused(struct rconn *rc, int tag, int idx12)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd),
             "EVAL %%s 5 S:{%d} Q:{%d} W:{%d} L:11_{%d} L:12_{%d} 11 701 4 12 702 %d", tag, tag,
             tag, tag, tag, idx12);
    redisReply *r = rconn_command(rc, NULL, cmd, script_text("seize_batch"));
    ck_assert_ptr_nonnull(r);
    ck_assert_msg(r->type == REDIS_REPLY_ERROR, "the batch was not refused");
    freeReplyObject(r);
    char key[32];
    snprintf(key, sizeof(key), "S:{%d}", tag);
    hget_is(rc, key, "11", "5");                   /* sale 11's grant not applied either */
    snprintf(key, sizeof(key), "L:11_{%d}", tag);
    hget_is(rc, key, "701", NULL);
}

/* seize_batch.lua checks every key it writes and every stock it takes from
 * before its first write: a batch over two sales whose second has a stock
 * HINCRBY refuses ("5.0"), a sync queue of the wrong type, or a seize list
 * index that names another sale's list is refused whole, and the first
 * sale's grant is not left applied. */
START_TEST(seize_batch_checks_before_it_writes)
{
    struct rconn *rc = redis_conn();
    long long now = cs_now_ms();
    char window[48];
    snprintf(window, sizeof(window), "%lld,%lld", now - 60000, now + 600000);
    batch_sale(rc, 7);
    hset(rc, "W:{7}", "12", window);
    hset(rc, "S:{7}", "12", "5.0");
    batch_refused(rc, 7, 5);
    hset(rc, "S:{7}", "12", "5");
    redisReply *r = rconn_command(rc, NULL, "SET Q:{7} x");
    ck_assert_ptr_nonnull(r);
    freeReplyObject(r);
    batch_refused(rc, 7, 5);
    r = rconn_command(rc, NULL, "DEL Q:{7}");
    ck_assert_ptr_nonnull(r);
    freeReplyObject(r);
    batch_refused(rc, 7, 4);                       /* sale 12's seizes into sale 11's list */
    hget_is(rc, "S:{7}", "12", "5");
    rconn_free(rc);
}
END_TEST

/* seize.lua judges as seize_batch.lua does (lua/part/judge.lua): a stock
 * that is not an integer or a sync queue of the wrong type is an error with
 * nothing written; an open sale grants. */
START_TEST(seize_checks_before_it_writes)
{
    struct rconn *rc = redis_conn();
    const char *text = script_text("seize");
    batch_sale(rc, 6);
    hset(rc, "S:{6}", "11", "5.0");
    redisReply *r = rconn_command(rc, NULL, "EVAL %s 4 S:{6} L:11_{6} Q:{6} W:{6} 11 801", text);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->type, REDIS_REPLY_ERROR);
    freeReplyObject(r);
    ck_assert_int_eq(exist(rc, "L:11_{6}", "Q:{6}"), 0);
    hset(rc, "S:{6}", "11", "5");
    r = rconn_command(rc, NULL, "SET Q:{6} x");
    ck_assert_ptr_nonnull(r);
    freeReplyObject(r);
    r = rconn_command(rc, NULL, "EVAL %s 4 S:{6} L:11_{6} Q:{6} W:{6} 11 801", text);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->type, REDIS_REPLY_ERROR);
    freeReplyObject(r);
    hget_is(rc, "S:{6}", "11", "5");
    hget_is(rc, "L:11_{6}", "801", NULL);
    r = rconn_command(rc, NULL, "DEL Q:{6}");
    ck_assert_ptr_nonnull(r);
    freeReplyObject(r);
    r = rconn_command(rc, NULL, "EVAL %s 4 S:{6} L:11_{6} Q:{6} W:{6} 11 801", text);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->type, REDIS_REPLY_INTEGER);
    ck_assert_int_eq(r->integer, 4);
    freeReplyObject(r);
    hget_is(rc, "S:{6}", "11", "4");
    rconn_free(rc);
}
END_TEST

/* Every file of lua/ is built in, none twice, and no built-in one keeps a
 * comment line. */
START_TEST(every_file_is_built_in)
{
    const char *src = getenv("top_srcdir");
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/lua", src ? src : ".");
    DIR *d = opendir(dir);
    ck_assert_msg(d != NULL, "%s", dir);
    struct dirent *e;
    int files = 0;
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 4, ".lua") != 0)
            continue;
        files++;
        int found = 0;
        for (int i = 0; i < script_count; i++)
            found += strlen(script_all[i].name) == n - 4
                     && strncmp(script_all[i].name, e->d_name, n - 4) == 0;
        ck_assert_msg(found == 1, "lua/%s is built in %d times (LUA_FILES in Makefile.am)",
                      e->d_name, found);
    }
    closedir(d);
    ck_assert_int_eq(files, script_count);
    for (int i = 0; i < script_count; i++)
        ck_assert_msg(strncmp(script_all[i].text, "--", 2) != 0
                          && strstr(script_all[i].text, "\n--") == NULL,
                      "%s keeps a comment line", script_all[i].name);
}
END_TEST

/* A script's "--#include part/NAME.lua" lines are the part's code, every
 * line of it: a part that could not be read would leave a function missing,
 * which Redis finds only when the script calls it. */
START_TEST(parts_are_joined)
{
    const char *src = getenv("top_srcdir");
    int joined = 0;
    for (int i = 0; i < script_count; i++) {
        char path[512], line[512];
        snprintf(path, sizeof(path), "%s/lua/%s.lua", src ? src : ".", script_all[i].name);
        FILE *f = fopen(path, "r");
        ck_assert_msg(f != NULL, "%s", path);
        while (fgets(line, sizeof(line), f) != NULL) {
            char name[256], part[512], pline[512];
            if (sscanf(line, "--#include %255s", name) != 1)
                continue;
            snprintf(part, sizeof(part), "%s/lua/%s", src ? src : ".", name);
            FILE *p = fopen(part, "r");
            ck_assert_msg(p != NULL, "%s: %s", script_all[i].name, part);
            int code = 0;
            while (fgets(pline, sizeof(pline), p) != NULL) {
                if (strncmp(pline, "--", 2) == 0)
                    continue;
                code++;
                ck_assert_msg(strstr(script_all[i].text, pline) != NULL, "%s lacks \"%s\" of %s",
                              script_all[i].name, pline, part);
            }
            fclose(p);
            ck_assert_int_gt(code, 0);
            joined++;
        }
        fclose(f);
    }
    ck_assert_int_ge(joined, 5); /* to_stock: give-back, release, replay; judge: the seizes */
}
END_TEST

int main(void)
{
    Suite *s = suite_create("scripts");
    TCase *tf = tcase_create("files");
    tcase_add_test(tf, every_file_is_built_in);
    tcase_add_test(tf, parts_are_joined);
    suite_add_tcase(s, tf);
    TCase *tr = tcase_create("redis");
    tcase_add_unchecked_fixture(tr, redis_start, redis_stop);
    tcase_add_loop_test(tr, script_loads, 0, script_count);
    tcase_add_test(tr, replay_of_a_token_spent_twice_is_dead_lettered_once);
    tcase_add_test(tr, replay_of_a_token_spent_twice_takes_from_stock);
    tcase_add_test(tr, replay_of_a_token_spent_twice_without_stock_to_take);
    tcase_add_test(tr, seize_batch_stores_the_time_it_answers);
    tcase_add_test(tr, seize_batch_refuses_a_partial_triple);
    tcase_add_test(tr, seize_batch_checks_before_it_writes);
    tcase_add_test(tr, seize_checks_before_it_writes);
    suite_add_tcase(s, tr);
    /* Fork mode would kill the fixture's server with the first test child. */
    return cs_run_suite(s, 1);
}
