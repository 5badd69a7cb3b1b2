/* actinput.h - the fields of an activity as the admin API takes them: JSON
 * members checked one by one, each error naming its field; RFC 3339 times. */
#ifndef CS_ACTINPUT_H
#define CS_ACTINPUT_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

/* Bits of actinput.set: which members the body had. */
enum {
    ACTIN_NAME = 1u << 0,
    ACTIN_COUPON_NAME = 1u << 1,
    ACTIN_COUPON_TYPE = 1u << 2,
    ACTIN_COUPON_AMOUNT = 1u << 3,
    ACTIN_COUPON_THRESHOLD = 1u << 4,
    ACTIN_TOTAL = 1u << 5,
    ACTIN_START = 1u << 6,
    ACTIN_END = 1u << 7,
    ACTIN_VALIDITY = 1u << 8,
    ACTIN_ADD = 1u << 9,       /* addStock: updates only */
    ACTIN_RETURN = 1u << 10,   /* returnOnExpiry */
    ACTIN_GROUPS = 1u << 11,   /* eligibleGroups */
};

#define ACTIN_MAX_GROUPS 16
#define ACTIN_MAX_GROUP_LEN 32

#define ACTIN_MAX_TOTAL 1000000000LL   /* total_num is INT UNSIGNED; stay well inside */
#define ACTIN_MAX_VALIDITY 36500

struct actinput {
    unsigned set;
    char name[513];
    char coupon_name[513];
    int coupon_type;
    char coupon_amount[24];     /* normalised to two decimals, e.g. "10.50" */
    char coupon_threshold[24];
    int64_t total_num;
    int64_t start_s;            /* seconds since the epoch */
    int64_t end_s;
    int validity_days;
    int64_t add_stock;
    int return_on_expiry;       /* 0 or 1 */
    /* eligibleGroups as compact JSON ("[\"new\",\"vip\"]"), "" for [] (anyone):
     * 1..ACTIN_MAX_GROUPS names of 1..ACTIN_MAX_GROUP_LEN bytes of
     * [A-Za-z0-9_.:-], no name twice. */
    char groups[ACTIN_MAX_GROUPS * (ACTIN_MAX_GROUP_LEN + 3) + 3];
};

struct actinput_err {
    const char *field;          /* the JSON member at fault (a static string) */
    char msg[160];              /* safe to write into JSON unescaped */
};

/* Reads the members of the JSON object doc into *in. for_update: "id" is
 * skipped (the caller reads it exactly) and "addStock" is accepted; for a
 * create both are unknown fields. Unknown or duplicated members, wrong types
 * and out-of-range values are errors. Returns CS_OK, or CS_ERR with *e set.
 * Required members are the caller's business (see in->set). */
int actinput_parse(const cJSON *doc, int for_update, struct actinput *in,
                   struct actinput_err *e);

/* JSON member name of an ACTIN_* bit ("name", "totalNum", ...). */
const char *actinput_field(unsigned bit);

/* Parses an RFC 3339 date-time with a time offset ("2026-12-01T20:00:00+08:00",
 * "...Z"; fractions of a second are accepted and dropped) into seconds since
 * the epoch. Only 1970-01-01T00:00:00Z .. 2038-01-19T03:14:07Z, what
 * MySQL's FROM_UNIXTIME() takes. CS_OK or CS_ERR. */
int actinput_parse_time(const char *s, int64_t *epoch_s);

/* Writes epoch_s as RFC 3339 in UTC ("2026-12-01T12:00:00Z") into buf
 * (at least 24 bytes). */
void actinput_format_time(int64_t epoch_s, char *buf, size_t len);

#endif
