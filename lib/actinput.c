/* actinput.c - checks the JSON fields of an activity sent to the admin API. */
#include "actinput.h"
#include "cs.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define ACTIN_MAX_NAME_CHARS 128   /* VARCHAR(128) */
#define ACTIN_TIME_MAX 2147483647LL /* FROM_UNIXTIME() of MariaDB 10.x stops here */

static const struct {
    unsigned bit;
    const char *name;
} actin_fields[] = {
    {ACTIN_NAME, "name"},
    {ACTIN_COUPON_NAME, "couponName"},
    {ACTIN_COUPON_TYPE, "couponType"},
    {ACTIN_COUPON_AMOUNT, "couponAmount"},
    {ACTIN_COUPON_THRESHOLD, "couponThreshold"},
    {ACTIN_TOTAL, "totalNum"},
    {ACTIN_START, "distributeStartTime"},
    {ACTIN_END, "distributeEndTime"},
    {ACTIN_VALIDITY, "validityDays"},
    {ACTIN_ADD, "addStock"},
    {ACTIN_RETURN, "returnOnExpiry"},
    {ACTIN_GROUPS, "eligibleGroups"},
};

const char *actinput_field(unsigned bit)
{
    for (size_t i = 0; i < CS_ARRAY_LEN(actin_fields); i++)
        if (actin_fields[i].bit == bit)
            return actin_fields[i].name;
    return "?";
}

static int actin_fail(struct actinput_err *e, const char *field, const char *msg)
{
    e->field = field;
    snprintf(e->msg, sizeof(e->msg), "%s %s", field, msg);
    return CS_ERR;
}

/* ---- RFC 3339 -------------------------------------------------------------- */

/* Days from 1970-01-01 to y-m-d in the proleptic Gregorian calendar
 * (H. Hinnant's days_from_civil). */
static int64_t actin_days(int64_t y, int m, int d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static int actin_digits(const char *s, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i]))
            return CS_ERR;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return CS_OK;
}

int actinput_parse_time(const char *s, int64_t *epoch_s)
{
    static const int mdays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int y, mo, d, h, mi, sec, oh = 0, om = 0, sign = 0;
    size_t n = strlen(s);

    if (n < 20 || actin_digits(s, 4, &y) || s[4] != '-' || actin_digits(s + 5, 2, &mo)
        || s[7] != '-' || actin_digits(s + 8, 2, &d)
        || (s[10] != 'T' && s[10] != 't' && s[10] != ' ') || actin_digits(s + 11, 2, &h)
        || s[13] != ':' || actin_digits(s + 14, 2, &mi) || s[16] != ':'
        || actin_digits(s + 17, 2, &sec))
        return CS_ERR;
    const char *p = s + 19;
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p))
            return CS_ERR;
        while (isdigit((unsigned char)*p))
            p++;
    }
    if ((*p == 'Z' || *p == 'z') && p[1] == '\0') {
        sign = 0;
    } else if ((*p == '+' || *p == '-') && strlen(p) == 6 && actin_digits(p + 1, 2, &oh) == 0
               && p[3] == ':' && actin_digits(p + 4, 2, &om) == 0) {
        sign = *p == '+' ? 1 : -1;
        if (oh > 23 || om > 59)
            return CS_ERR;
    } else {
        return CS_ERR;
    }
    if (mo < 1 || mo > 12 || h > 23 || mi > 59 || sec > 59)
        return CS_ERR;
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (d < 1 || d > mdays[mo - 1] + (mo == 2 && leap))
        return CS_ERR;
    int64_t t = actin_days(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec;
    t -= (int64_t)sign * (oh * 3600 + om * 60);
    if (t < 0 || t > ACTIN_TIME_MAX)
        return CS_ERR;
    *epoch_s = t;
    return CS_OK;
}

void actinput_format_time(int64_t epoch_s, char *buf, size_t len)
{
    struct tm tm;
    time_t t = (time_t)epoch_s;
    if (gmtime_r(&t, &tm) == NULL || strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
        snprintf(buf, len, "%s", "");
}

/* ---- members ---------------------------------------------------------------- */

/* Characters in a UTF-8 string, or -1 when it is not valid UTF-8. */
static long actin_utf8_chars(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    long n = 0;
    while (*p) {
        size_t len = *p < 0x80 ? 1 : (*p & 0xE0) == 0xC0 ? 2 : (*p & 0xF0) == 0xE0 ? 3
                   : (*p & 0xF8) == 0xF0 ? 4 : 0;
        if (len == 0 || (len == 2 && *p < 0xC2) || (len == 4 && *p > 0xF4))
            return -1;
        for (size_t i = 1; i < len; i++)
            if ((p[i] & 0xC0) != 0x80)
                return -1;
        p += len;
        n++;
    }
    return n;
}

static int actin_text(const cJSON *v, const char *field, int required, char *dst, size_t size,
                      struct actinput_err *e)
{
    if (!cJSON_IsString(v))
        return actin_fail(e, field, "must be a string");
    long chars = actin_utf8_chars(v->valuestring);
    if (chars < 0)
        return actin_fail(e, field, "must be valid UTF-8");
    if (chars > ACTIN_MAX_NAME_CHARS || strlen(v->valuestring) >= size)
        return actin_fail(e, field, "must be at most 128 characters");
    const char *s = v->valuestring;
    while (*s == ' ' || *s == '\t')
        s++;
    if (required && *s == '\0')
        return actin_fail(e, field, "must not be empty");
    for (const char *c = v->valuestring; *c; c++)
        if ((unsigned char)*c < 0x20)
            return actin_fail(e, field, "must not contain control characters");
    snprintf(dst, size, "%s", v->valuestring);
    return CS_OK;
}

/* A JSON number that is an integer in lo..hi. */
static int actin_int(const cJSON *v, const char *field, int64_t lo, int64_t hi, int64_t *out,
                     struct actinput_err *e)
{
    char msg[96];
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble)) {
        snprintf(msg, sizeof(msg), "must be an integer %lld..%lld", (long long)lo, (long long)hi);
        return actin_fail(e, field, msg);
    }
    if (v->valuedouble < (double)lo || v->valuedouble > (double)hi) {
        snprintf(msg, sizeof(msg), "must be %lld..%lld", (long long)lo, (long long)hi);
        return actin_fail(e, field, msg);
    }
    *out = (int64_t)v->valuedouble;
    return CS_OK;
}

/* Money: DECIMAL(12,2), given as a decimal string ("10", "10.5", "10.50")
 * or a JSON number; stored normalised to two decimals. */
static int actin_money(const cJSON *v, const char *field, char *dst, size_t size,
                       struct actinput_err *e)
{
    const char *bad = "must be a decimal 0..9999999999.99 with at most 2 decimals";
    char tmp[40];
    if (cJSON_IsNumber(v)) {
        if (!(v->valuedouble >= 0 && v->valuedouble < 1e10))
            return actin_fail(e, field, bad);
        double cents = v->valuedouble * 100;
        if (fabs(cents - round(cents)) > 1e-6)
            return actin_fail(e, field, bad);
        snprintf(tmp, sizeof(tmp), "%.2f", round(cents) / 100);
    } else if (cJSON_IsString(v)) {
        snprintf(tmp, sizeof(tmp), "%s", v->valuestring);
    } else {
        return actin_fail(e, field, bad);
    }
    /* digits{1,10} [. digits{1,2}] */
    const char *p = tmp, *dot = strchr(tmp, '.');
    size_t ip = dot ? (size_t)(dot - tmp) : strlen(tmp);
    size_t fp = dot ? strlen(dot + 1) : 0;
    if (ip < 1 || ip > 10 || (dot && (fp < 1 || fp > 2)))
        return actin_fail(e, field, bad);
    for (size_t i = 0; p[i]; i++)
        if (!isdigit((unsigned char)p[i]) && p + i != dot)
            return actin_fail(e, field, bad);
    /* Leading zeros are harmless for MySQL but not for comparing. */
    while (ip > 1 && *p == '0') {
        p++;
        ip--;
    }
    snprintf(dst, size, "%.*s.%c%c", (int)ip, p, fp >= 1 ? dot[1] : '0', fp >= 2 ? dot[2] : '0');
    return CS_OK;
}

static int actin_time(const cJSON *v, const char *field, int64_t *out, struct actinput_err *e)
{
    if (!cJSON_IsString(v) || actinput_parse_time(v->valuestring, out) != CS_OK)
        return actin_fail(e, field,
                          "must be an RFC 3339 time with an offset, e.g. "
                          "2026-12-01T20:00:00+08:00 (1970..2037)");
    return CS_OK;
}

/* A member name that may be quoted in a message: plain ASCII, short. */
static int actin_printable_key(const char *k)
{
    size_t n = strlen(k);
    if (n == 0 || n > 32)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)k[i]) && k[i] != '_')
            return 0;
    return 1;
}

static int actin_group_ok(const char *g)
{
    size_t n = strlen(g);
    if (n == 0 || n > ACTIN_MAX_GROUP_LEN)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)g[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
              || c == '_' || c == '.' || c == ':' || c == '-'))
            return 0;
    }
    return 1;
}

/* eligibleGroups: an array of group names, written back as compact JSON. */
static int actin_groups(const cJSON *m, const char *f, char *out, size_t outlen,
                        struct actinput_err *e)
{
    const cJSON *g, *h;
    int n = 0;
    size_t len = 0;

    if (!cJSON_IsArray(m))
        return actin_fail(e, f, "must be an array of group names");
    out[0] = '\0';
    cJSON_ArrayForEach(g, m)
    {
        if (!cJSON_IsString(g) || !actin_group_ok(g->valuestring))
            return actin_fail(e, f, "each group is 1..32 characters of A-Z a-z 0-9 _ . : -");
        if (++n > ACTIN_MAX_GROUPS)
            return actin_fail(e, f, "at most 16 groups");
        for (h = m->child; h != g; h = h->next)
            if (strcmp(h->valuestring, g->valuestring) == 0)
                return actin_fail(e, f, "names a group twice");
        len += (size_t)snprintf(out + len, outlen - len, "%s\"%s\"", n == 1 ? "[" : ",",
                                g->valuestring);
    }
    if (n > 0)
        snprintf(out + len, outlen - len, "]");
    return CS_OK;
}

int actinput_parse(const cJSON *doc, int for_update, struct actinput *in,
                   struct actinput_err *e)
{
    const cJSON *m;
    int64_t v;

    memset(in, 0, sizeof(*in));
    memset(e, 0, sizeof(*e));
    if (!cJSON_IsObject(doc)) {
        e->field = "";
        snprintf(e->msg, sizeof(e->msg), "body must be a JSON object");
        return CS_ERR;
    }
    cJSON_ArrayForEach(m, doc)
    {
        const char *k = m->string;
        unsigned bit = 0;
        for (size_t i = 0; i < CS_ARRAY_LEN(actin_fields); i++)
            if (strcmp(k, actin_fields[i].name) == 0)
                bit = actin_fields[i].bit;
        if (for_update && strcmp(k, "id") == 0)
            continue; /* read exactly by the caller */
        if (bit == 0 || (bit == ACTIN_ADD && !for_update)) {
            e->field = "";
            if (actin_printable_key(k))
                snprintf(e->msg, sizeof(e->msg), "unknown field %s", k);
            else
                snprintf(e->msg, sizeof(e->msg), "unknown field");
            return CS_ERR;
        }
        const char *f = actinput_field(bit);
        if (in->set & bit)
            return actin_fail(e, f, "is given twice");
        in->set |= bit;
        int rc;
        switch (bit) {
        case ACTIN_NAME:
            rc = actin_text(m, f, 1, in->name, sizeof(in->name), e);
            break;
        case ACTIN_COUPON_NAME:
            rc = actin_text(m, f, 0, in->coupon_name, sizeof(in->coupon_name), e);
            break;
        case ACTIN_COUPON_TYPE:
            rc = actin_int(m, f, 1, 2, &v, e);
            in->coupon_type = (int)v;
            break;
        case ACTIN_COUPON_AMOUNT:
            rc = actin_money(m, f, in->coupon_amount, sizeof(in->coupon_amount), e);
            break;
        case ACTIN_COUPON_THRESHOLD:
            rc = actin_money(m, f, in->coupon_threshold, sizeof(in->coupon_threshold), e);
            break;
        case ACTIN_TOTAL:
            rc = actin_int(m, f, 1, ACTIN_MAX_TOTAL, &in->total_num, e);
            break;
        case ACTIN_START:
            rc = actin_time(m, f, &in->start_s, e);
            break;
        case ACTIN_END:
            rc = actin_time(m, f, &in->end_s, e);
            break;
        case ACTIN_VALIDITY:
            rc = actin_int(m, f, 1, ACTIN_MAX_VALIDITY, &v, e);
            in->validity_days = (int)v;
            break;
        case ACTIN_RETURN:
            rc = cJSON_IsBool(m) ? CS_OK : actin_fail(e, f, "must be true or false");
            in->return_on_expiry = cJSON_IsTrue(m);
            break;
        case ACTIN_GROUPS:
            rc = actin_groups(m, f, in->groups, sizeof(in->groups), e);
            break;
        default: /* ACTIN_ADD */
            rc = actin_int(m, f, 1, ACTIN_MAX_TOTAL, &in->add_stock, e);
            break;
        }
        if (rc != CS_OK)
            return CS_ERR;
    }
    return CS_OK;
}
