/* test_keys.c - Redis key names, queue fields, cluster slots, ids and growable arrays. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "cs.h"
#include "keys.h"
#include "runner.h"

START_TEST(key_names)
{
    char k[KEYS_MAX];
    ck_assert_int_eq(keys_shard(13), 3);
    ck_assert_int_eq(keys_shard(10), 0);
    keys_stock(k, 3);
    ck_assert_str_eq(k, "COUPON:RESOURCE:STOCK:{3}");
    keys_seize_list(k, 13);
    ck_assert_str_eq(k, "COUPON:SEIZE:LIST:13_{3}");
    keys_queue(k, 7);
    ck_assert_str_eq(k, "QUEUE:COUPON:SEIZE:SYNC:{7}");
    keys_dead(k, 0);
    ck_assert_str_eq(k, "QUEUE:COUPON:SEIZE:DEAD:{0}");
    size_t n = keys_queue_field(k, 9223372036854775807LL, 42);
    ck_assert_str_eq(k, "9223372036854775807:42");
    ck_assert_uint_eq(n, strlen(k));
}
END_TEST

START_TEST(queue_field_parse)
{
    int64_t a, u;
    ck_assert_int_eq(keys_parse_queue_field("3:77", 4, &a, &u), CS_OK);
    ck_assert_int_eq(a, 3);
    ck_assert_int_eq(u, 77);
    static const char *const bad[] = {"", "3", "3:", ":3", "a:1", "1:b", "0:1", "1:0",
                                      "-1:2", "1:2:3", "1 :2", "99999999999999999999:1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_msg(keys_parse_queue_field(bad[i], strlen(bad[i]), &a, &u) == CS_ERR,
                      "accepted %s", bad[i]);
}
END_TEST

START_TEST(slots_follow_hash_tags)
{
    char a[KEYS_MAX], b[KEYS_MAX], c[KEYS_MAX];
    /* Redis Cluster reference values. */
    ck_assert_uint_eq(keys_slot("foo", 3), 12182);
    ck_assert_uint_eq(keys_slot("123456789", 9), 0x31C3 & 16383);
    /* Every key one seize touches lands in one slot. */
    size_t la = keys_stock(a, 4), lb = keys_seize_list(b, 14), lc = keys_queue(c, 4);
    ck_assert_uint_eq(keys_slot(a, la), keys_slot(b, lb));
    ck_assert_uint_eq(keys_slot(a, la), keys_slot(c, lc));
    ck_assert_uint_eq(keys_shard_slot(4), keys_slot(a, la));
    ck_assert_uint_eq(keys_shard_slot(0), 13907); /* the tag "0", as redis-cli says */
    lc = keys_window(c, 4);
    ck_assert_str_eq(c, "COUPON:ACTIVITY:WINDOW:{4}");
    ck_assert_uint_eq(keys_slot(a, la), keys_slot(c, lc));
    /* Preheat's script writes these beside META, WINDOW and stock. */
    lc = keys_version(c, 4);
    ck_assert_str_eq(c, "COUPON:ACTIVITY:VER:{4}");
    ck_assert_uint_eq(keys_slot(a, la), keys_slot(c, lc));
    lc = keys_ends(c, 4);
    ck_assert_str_eq(c, "COUPON:ACTIVITY:ENDS:{4}");
    ck_assert_uint_eq(keys_slot(a, la), keys_slot(c, lc));
    ck_assert_uint_eq(keys_slot(a, la), keys_slot("{4}", 3));
    /* An empty tag does not count: the whole key is hashed. */
    ck_assert_uint_eq(keys_slot("x{}y", 4), 16116);
    ck_assert_uint_eq(keys_slot("{user1000}.following", 20), keys_slot("user1000", 8));
    ck_assert_uint_eq(keys_slot("user1000", 8), 3443);
}
END_TEST

START_TEST(parse_id_bounds)
{
    int64_t v;
    ck_assert_int_eq(cs_parse_id("1", 1, &v), CS_OK);
    ck_assert_int_eq(cs_parse_id("9223372036854775807", 19, &v), CS_OK);
    ck_assert_int_eq(cs_parse_id("9223372036854775808", 19, &v), CS_ERR);
    ck_assert_int_eq(cs_parse_id("0", 1, &v), CS_ERR);
    ck_assert_int_eq(cs_parse_id("01", 2, &v), CS_ERR);
    ck_assert_int_eq(cs_parse_id("", 0, &v), CS_ERR);
    ck_assert_int_eq(cs_parse_id("+1", 2, &v), CS_ERR);
    ck_assert_int_eq(cs_parse_id("12345678901234567890", 20, &v), CS_ERR);
}
END_TEST

/* cs_grow(): room for what is asked, doubling; what was stored stays. */
START_TEST(grow_keeps_and_doubles)
{
    int64_t *v = NULL;
    size_t cap = 0, n;
    for (n = 0; n < 1000; n++) {
        v = cs_grow(v, &cap, n + 1, sizeof(*v));
        ck_assert_uint_ge(cap, n + 1);
        v[n] = (int64_t)n * 7;
    }
    ck_assert_uint_eq(cap, 1024); /* 16, 32, ... 1024: doubled, not grown by one */
    for (n = 0; n < 1000; n++)
        ck_assert_int_eq(v[n], (int64_t)n * 7);
    int64_t *same = cs_grow(v, &cap, 10, sizeof(*v));
    ck_assert_ptr_eq(same, v);
    ck_assert_uint_eq(cap, 1024);
    v = cs_grow(v, &cap, 5000, sizeof(*v)); /* past twice the room: exactly what is asked */
    ck_assert_uint_eq(cap, 5000);
    ck_assert_int_eq(v[999], 999 * 7);
    free(v);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("keys");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, key_names);
    tcase_add_test(tc, queue_field_parse);
    tcase_add_test(tc, slots_follow_hash_tags);
    tcase_add_test(tc, parse_id_bounds);
    tcase_add_test(tc, grow_keeps_and_doubles);
    suite_add_tcase(s, tc);
    return cs_run_suite(s, 0);
}
