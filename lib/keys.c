/* keys.c - Redis key names and the cluster slot of a key. */
#include "keys.h"
#include "cs.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

size_t keys_stock(char *buf, int shard)
{
    return (size_t)snprintf(buf, KEYS_MAX, "COUPON:RESOURCE:STOCK:{%d}", shard);
}

size_t keys_seize_list(char *buf, int64_t activity_id)
{
    return (size_t)snprintf(buf, KEYS_MAX, "COUPON:SEIZE:LIST:%" PRId64 "_{%d}", activity_id,
                            keys_shard(activity_id));
}

size_t keys_queue(char *buf, int shard)
{
    return (size_t)snprintf(buf, KEYS_MAX, "QUEUE:COUPON:SEIZE:SYNC:{%d}", shard);
}

size_t keys_dead(char *buf, int shard)
{
    return (size_t)snprintf(buf, KEYS_MAX, "QUEUE:COUPON:SEIZE:DEAD:{%d}", shard);
}

size_t keys_sync_lock(char *buf, int shard)
{
    return (size_t)snprintf(buf, KEYS_MAX, "LOCK:COUPON:SYNC:{%d}", shard);
}

size_t keys_reserve_claim(char *buf, const char *incarnation)
{
    return (size_t)snprintf(buf, KEYS_MAX, "COUPON:RESERVE:CLAIM:%s", incarnation);
}

size_t keys_fence(char *buf, int shard)
{
    return (size_t)snprintf(buf, KEYS_MAX, "COUPON:FENCE:{%d}", shard);
}

size_t keys_meta(char *buf, int shard)
{
    return (size_t)snprintf(buf, KEYS_MAX, "COUPON:ACTIVITY:META:{%d}", shard);
}

size_t keys_window(char *buf, int shard)
{
    return (size_t)snprintf(buf, KEYS_MAX, "COUPON:ACTIVITY:WINDOW:{%d}", shard);
}

size_t keys_version(char *buf, int shard)
{
    return (size_t)snprintf(buf, KEYS_MAX, "COUPON:ACTIVITY:VER:{%d}", shard);
}

size_t keys_ends(char *buf, int shard)
{
    return (size_t)snprintf(buf, KEYS_MAX, "COUPON:ACTIVITY:ENDS:{%d}", shard);
}

size_t keys_reserve(char *buf, int shard)
{
    return (size_t)snprintf(buf, KEYS_MAX, "COUPON:RESERVE:{%d}", shard);
}

size_t keys_reserve_epochs(char *buf, int64_t activity_id)
{
    return (size_t)snprintf(buf, KEYS_MAX, "COUPON:RESERVE:EPOCH:%" PRId64 "_{%d}", activity_id,
                            keys_shard(activity_id));
}

size_t keys_reserve_dead(char *buf, int shard)
{
    return (size_t)snprintf(buf, KEYS_MAX, "COUPON:RESERVE:DEAD:{%d}", shard);
}

size_t keys_queue_field(char *buf, int64_t activity_id, int64_t user_id)
{
    return (size_t)snprintf(buf, KEYS_MAX, "%" PRId64 ":%" PRId64, activity_id, user_id);
}

int keys_parse_queue_field(const char *field, size_t len, int64_t *activity_id,
                           int64_t *user_id)
{
    const char *colon = memchr(field, ':', len);
    if (colon == NULL)
        return CS_ERR;
    if (cs_parse_id(field, (size_t)(colon - field), activity_id) != CS_OK)
        return CS_ERR;
    return cs_parse_id(colon + 1, len - (size_t)(colon - field) - 1, user_id);
}

/* CRC16-CCITT (XMODEM), as Redis Cluster uses. */
static uint16_t crc16(const char *buf, size_t len)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)((unsigned char)buf[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

unsigned keys_slot(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len);
    if (open != NULL) {
        const char *close = memchr(open + 1, '}', len - (size_t)(open + 1 - key));
        if (close != NULL && close > open + 1)
            return crc16(open + 1, (size_t)(close - open - 1)) & 16383;
    }
    return crc16(key, len) & 16383;
}

unsigned keys_shard_slot(int shard)
{
    char key[KEYS_MAX];
    return keys_slot(key, keys_stock(key, shard));
}
