/* activity.c - activities: the JSON form, status by the clock, what Redis holds
 * of them live (stock fields, queued entries), the status job. Preheat and
 * revoke are in preheat.c. */
#include "activity.h"
#include "cs.h"
#include "keys.h"
#include "mconn.h"
#include "rconn.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char SQL_STATUS_START[] =
    "UPDATE activity SET status = 2 WHERE status = 1 AND distribute_start_time <= NOW() "
    "AND distribute_end_time > NOW()";
static const char SQL_STATUS_END[] =
    "UPDATE activity SET status = 3 WHERE status IN (1,2) AND distribute_end_time <= NOW()";

/* ---- status and JSON form ------------------------------------------------ */

int activity_status_at(const struct activity *a, int64_t now_ms)
{
    if (a->status == ACT_VOIDED)
        return ACT_VOIDED;
    if (now_ms < a->start_ms)
        return ACT_NOT_STARTED;
    if (now_ms >= a->end_ms)
        return ACT_ENDED;
    return ACT_IN_PROGRESS;
}

const char *activity_status_name(int status)
{
    switch (status) {
    case ACT_NOT_STARTED:
        return "NOT_STARTED";
    case ACT_IN_PROGRESS:
        return "IN_PROGRESS";
    case ACT_ENDED:
        return "ENDED";
    case ACT_VOIDED:
        return "VOIDED";
    default:
        return "UNKNOWN";
    }
}

void activity_copy_text(char *dst, size_t size, const char *src)
{
    size_t n = src ? strlen(src) : 0;
    if (n >= size) {
        n = size - 1;
        while (n > 0 && ((unsigned char)src[n] & 0xC0) == 0x80)
            n--;
    }
    if (n > 0)
        memcpy(dst, src, n);
    dst[n] = '\0';
}

cJSON *activity_to_json(const struct activity *a)
{
    cJSON *o = cJSON_CreateObject();
    char id[24];
    /* Ids go up to 2^63-1, past what a double holds: "id" is written with
     * exact digits, and "idStr" carries them for readers (JavaScript, and
     * activity_from_json) that would round a number. Times stay below 2^53. */
    snprintf(id, sizeof(id), "%" PRId64, a->id);
    cJSON_AddItemToObject(o, "id", cJSON_CreateRaw(id));
    cJSON_AddStringToObject(o, "idStr", id);
    cJSON_AddStringToObject(o, "name", a->name);
    cJSON_AddStringToObject(o, "couponName", a->coupon_name);
    /* Money stays decimal text so no binary rounding creeps in. */
    cJSON_AddStringToObject(o, "couponAmount", a->coupon_amount);
    cJSON_AddStringToObject(o, "couponThreshold", a->coupon_threshold);
    cJSON_AddNumberToObject(o, "totalNum", (double)a->total_num);
    cJSON_AddNumberToObject(o, "startTime", (double)a->start_ms);
    cJSON_AddNumberToObject(o, "endTime", (double)a->end_ms);
    cJSON_AddNumberToObject(o, "validityDays", a->validity_days);
    cJSON_AddNumberToObject(o, "status", a->status);
    cJSON_AddBoolToObject(o, "returnOnExpiry", a->return_on_expiry);
    cJSON *g = a->groups[0] ? cJSON_Parse(a->groups) : NULL;
    cJSON_AddItemToObject(o, "eligibleGroups", cJSON_IsArray(g) ? g : cJSON_CreateArray());
    if (g != NULL && !cJSON_IsArray(g))
        cJSON_Delete(g);
    return o;
}

int activity_groups_allow(const struct activity *a, const char (*names)[40], int n)
{
    if (a->groups[0] == '\0')
        return 1;
    /* Names compared as parsed strings, never searched for in the text: a
     * search for "\",\"" would find the separator of any two names. */
    cJSON *g = cJSON_Parse(a->groups);
    const cJSON *list = cJSON_IsArray(g) ? g : NULL, *e;
    int allow = 0;
    cJSON_ArrayForEach(e, list)
    {
        if (!cJSON_IsString(e))
            continue;
        for (int i = 0; i < n && !allow; i++)
            allow = strcmp(e->valuestring, names[i]) == 0;
        if (allow)
            break;
    }
    cJSON_Delete(g);
    return allow;
}

/* eligibleGroups of a META / ACTIVITY:LIST entry back into compact text. */
static void act_json_groups(const cJSON *obj, char *dst, size_t size)
{
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(obj, "eligibleGroups");
    dst[0] = '\0';
    if (!cJSON_IsArray(g) || cJSON_GetArraySize(g) == 0)
        return;
    char *txt = cJSON_PrintUnformatted(g);
    if (txt != NULL && strlen(txt) < size)
        memcpy(dst, txt, strlen(txt) + 1);
    else
        snprintf(dst, size, "[\"\"]"); /* too long to hold: nobody's group matches */
    cJSON_free(txt);
}

/* Reads an integral number field (a number, or a decimal string). */
static int act_json_int(const cJSON *obj, const char *name, int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (cJSON_IsNumber(v)) {
        if (v->valuedouble < -9.2e18 || v->valuedouble > 9.2e18)
            return CS_ERR;
        *out = (int64_t)v->valuedouble;
        return CS_OK;
    }
    if (cJSON_IsString(v) && v->valuestring[0] != '\0') {
        char *end;
        long long x = strtoll(v->valuestring, &end, 10);
        if (*end != '\0')
            return CS_ERR;
        *out = x;
        return CS_OK;
    }
    return CS_ERR;
}

/* Reads an optional text field; numbers are accepted for the money fields. */
static void act_json_text(const cJSON *obj, const char *name, char *dst, size_t size,
                          const char *dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (cJSON_IsString(v))
        activity_copy_text(dst, size, v->valuestring);
    else if (cJSON_IsNumber(v))
        snprintf(dst, size, "%.2f", v->valuedouble);
    else
        activity_copy_text(dst, size, dflt);
}

int activity_from_json(const cJSON *obj, struct activity *a)
{
    int64_t v;

    memset(a, 0, sizeof(*a));
    if (!cJSON_IsObject(obj))
        return CS_ERR;
    const cJSON *idstr = cJSON_GetObjectItemCaseSensitive(obj, "idStr");
    if (cJSON_IsString(idstr)) {
        if (cs_parse_id(idstr->valuestring, strlen(idstr->valuestring), &a->id) != CS_OK)
            return CS_ERR;
    } else if (act_json_int(obj, "id", &a->id) != CS_OK || a->id <= 0) {
        return CS_ERR;
    }
    if (act_json_int(obj, "totalNum", &a->total_num) != CS_OK)
        return CS_ERR;
    if (act_json_int(obj, "startTime", &a->start_ms) != CS_OK)
        return CS_ERR;
    if (act_json_int(obj, "endTime", &a->end_ms) != CS_OK)
        return CS_ERR;
    if (act_json_int(obj, "status", &v) != CS_OK || v < ACT_NOT_STARTED || v > ACT_VOIDED)
        return CS_ERR;
    a->status = (int)v;
    a->validity_days = act_json_int(obj, "validityDays", &v) == CS_OK ? (int)v : 0;
    act_json_text(obj, "name", a->name, sizeof(a->name), "");
    act_json_text(obj, "couponName", a->coupon_name, sizeof(a->coupon_name), "");
    act_json_text(obj, "couponAmount", a->coupon_amount, sizeof(a->coupon_amount), "0.00");
    act_json_text(obj, "couponThreshold", a->coupon_threshold, sizeof(a->coupon_threshold),
                  "0.00");
    a->return_on_expiry = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(obj, "returnOnExpiry"));
    act_json_groups(obj, a->groups, sizeof(a->groups));
    return CS_OK;
}

int activity_list_parse(const char *json, size_t len, struct activity **out, size_t *n)
{
    cJSON *root = cJSON_ParseWithLength(json, len);
    int rc = CS_ERR;
    struct activity *arr = NULL;
    size_t cnt = 0;

    if (root == NULL || !cJSON_IsArray(root))
        goto out;
    arr = xcalloc((size_t)cJSON_GetArraySize(root) + 1, sizeof(*arr));
    const cJSON *el;
    cJSON_ArrayForEach(el, root)
    {
        if (activity_from_json(el, &arr[cnt]) != CS_OK)
            goto out;
        cnt++;
    }
    *out = arr;
    *n = cnt;
    arr = NULL;
    rc = CS_OK;
out:
    free(arr);
    cJSON_Delete(root);
    return rc;
}

char *activity_to_text(const struct activity *a)
{
    cJSON *o = activity_to_json(a);
    char *txt = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (txt == NULL)
        abort(); /* cJSON's hooks are xmalloc: only a bug gets here */
    return txt;
}

/* ---- live state in Redis ------------------------------------------------- */

int activity_stock_read(struct rconn *rc, struct activity_stock *s, size_t n)
{
    char key[KEYS_MAX], field[24];
    int ret = CS_OK;

    for (size_t i = 0; i < n; i++) {
        s[i].state = ACT_STOCK_UNKNOWN;
        s[i].value = 0;
    }
    char rkey[KEYS_MAX];
    for (size_t i = 0; i < n; i++) {
        keys_stock(key, keys_shard(s[i].id));
        keys_reserve(rkey, keys_shard(s[i].id));
        snprintf(field, sizeof(field), "%" PRId64, s[i].id);
        /* A failed append drops the connection: no reply is left to read. */
        if (rconn_append(rc, key, "HGET %s %s", key, field) != CS_OK
            || rconn_append(rc, rkey, "HGET %s %s:held", rkey, field) != CS_OK)
            return CS_ERR;
    }
    for (size_t i = 0; i < n; i++) {
        redisReply *r, *h;
        if (rconn_get_reply(rc, &r) != CS_OK)
            return CS_ERR;
        if (rconn_get_reply(rc, &h) != CS_OK) {
            freeReplyObject(r);
            return CS_ERR;
        }
        if (r->type == REDIS_REPLY_NIL) {
            s[i].state = ACT_STOCK_ABSENT;
        } else if (r->type == REDIS_REPLY_STRING) {
            s[i].state = ACT_STOCK_SET;
            s[i].value = strtoll(r->str, NULL, 10);
            /* What node reserves hold is not sold: it is still on sale. */
            if (s[i].value >= 0 && h->type == REDIS_REPLY_STRING)
                s[i].value += strtoll(h->str, NULL, 10);
        } else {
            ret = CS_ERR;
        }
        freeReplyObject(r);
        freeReplyObject(h);
    }
    return ret;
}

int activity_count_queued(struct rconn *rc, int shard, const int64_t *ids, size_t n,
                          int64_t *queued, char *err, size_t errlen)
{
    char qkey[KEYS_MAX], cursor[24] = "0";

    keys_queue(qkey, shard);
    memset(queued, 0, n * sizeof(*queued));
    do {
        redisReply *r = rconn_hscan(rc, qkey, cursor, sizeof(cursor), NULL, 1000, err, errlen);
        if (r == NULL)
            return CS_ERR;
        const redisReply *kv = r->element[1];
        for (size_t i = 0; i + 1 < kv->elements; i += 2) {
            int64_t aid, uid;
            const redisReply *f = kv->element[i];
            if (keys_parse_queue_field(f->str, f->len, &aid, &uid) != CS_OK)
                continue;
            const int64_t *hit = bsearch(&aid, ids, n, sizeof(int64_t), cs_cmp_int64);
            if (hit != NULL)
                queued[hit - ids]++;
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
    return CS_OK;
}

/* ---- the status job -------------------------------------------------------- */

int activity_advance_status(struct mconn *mc, uint64_t *changed, char *err, size_t errlen)
{
    uint64_t a = 0, b = 0;

    *changed = 0;
    if (mconn_exec(mc, SQL_STATUS_START, NULL, 0, &a) != CS_OK ||
        mconn_exec(mc, SQL_STATUS_END, NULL, 0, &b) != CS_OK) {
        snprintf(err, errlen, "status job: %s", mc->errstr);
        return CS_ERR;
    }
    *changed = a + b;
    return CS_OK;
}
