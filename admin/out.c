/* out.c - couponseize-admin's exit statuses and human output. */
#include "out.h"

#include <string.h>

int out_exit_for(int status)
{
    if (status >= 200 && status < 300)
        return ADMIN_EXIT_OK;
    switch (status) {
    case 404:
        return ADMIN_EXIT_NOT_FOUND;
    case 409:
        return ADMIN_EXIT_CONFLICT;
    case 400: case 405: case 411: case 413: case 414: case 415: case 422: case 431:
        return ADMIN_EXIT_INVALID;
    case 401: case 403:
        return ADMIN_EXIT_DENIED;
    case 429: case 502: case 503: case 504:
        return ADMIN_EXIT_UNAVAILABLE;
    default:
        return ADMIN_EXIT_ERROR;
    }
}

/* A scalar as text (strings bare); 0 when v is an object or array. */
static int scalar(const cJSON *v, char *buf, size_t n)
{
    if (cJSON_IsString(v))
        snprintf(buf, n, "%s", v->valuestring);
    else if (cJSON_IsNull(v))
        snprintf(buf, n, "-");
    else if (cJSON_IsBool(v))
        snprintf(buf, n, "%s", cJSON_IsTrue(v) ? "true" : "false");
    else if (cJSON_IsNumber(v) || cJSON_IsRaw(v)) {
        char *p = cJSON_PrintUnformatted(v);
        snprintf(buf, n, "%s", p ? p : "?");
        cJSON_free(p);
    } else {
        return 0;
    }
    return 1;
}

/* Columns of the tables the tool knows; others show every scalar member of
 * their first row. */
static const char *const activity_cols[] = {"idStr", "status", "totalNum", "stockNum",
    "remaining", "distributeStartTime", "distributeEndTime", "name", NULL};
static const char *const reserve_cols[] = {"activityIdStr", "incarnation", "epoch", "amount",
    "left", "leaseAgeMs", "leaseExpired", NULL};

static void table(FILE *f, int indent, const char *name, const cJSON *arr)
{
    const char *const *cols = NULL;
    const char *found[32];
    int ncols = 0;
    char cell[256];

    if (strcmp(name, "activities") == 0)
        cols = activity_cols;
    else if (strcmp(name, "reserves") == 0)
        cols = reserve_cols;
    if (cols != NULL) {
        for (; cols[ncols] != NULL; ncols++)
            found[ncols] = cols[ncols];
    } else {
        const cJSON *m;
        cJSON_ArrayForEach(m, arr->child) {
            if (ncols < 32 && m->string != NULL && scalar(m, cell, sizeof(cell)))
                found[ncols++] = m->string;
        }
    }
    /* Widths: the widest of the header and each cell, at most 40. */
    int width[32];
    for (int c = 0; c < ncols; c++)
        width[c] = (int)strlen(found[c]);
    const cJSON *row;
    cJSON_ArrayForEach(row, arr) {
        for (int c = 0; c < ncols; c++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(row, found[c]);
            if (v != NULL && scalar(v, cell, sizeof(cell))) {
                int w = (int)strlen(cell);
                width[c] = w > width[c] ? (w > 40 ? 40 : w) : width[c];
            }
        }
    }
    fprintf(f, "%*s%s (%d):\n%*s", indent, "", name, cJSON_GetArraySize(arr), indent + 2, "");
    for (int c = 0; c < ncols; c++)
        fprintf(f, "%-*s%s", c + 1 < ncols ? width[c] : 0, found[c], c + 1 < ncols ? "  " : "\n");
    cJSON_ArrayForEach(row, arr) {
        fprintf(f, "%*s", indent + 2, "");
        for (int c = 0; c < ncols; c++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(row, found[c]);
            if (v == NULL || !scalar(v, cell, sizeof(cell)))
                snprintf(cell, sizeof(cell), "-");
            fprintf(f, "%-*.*s%s", c + 1 < ncols ? width[c] : 0, 40, cell,
                    c + 1 < ncols ? "  " : "\n");
        }
    }
}

static void members(FILE *f, int indent, const cJSON *obj)
{
    const cJSON *m;
    char buf[1024];

    cJSON_ArrayForEach(m, obj) {
        /* code and msg are said first; now (the server's clock, epoch ms)
         * tells people nothing. */
        if (m->string == NULL || (indent == 0 && (strcmp(m->string, "code") == 0
                                                  || strcmp(m->string, "msg") == 0
                                                  || strcmp(m->string, "now") == 0)))
            continue;
        if (scalar(m, buf, sizeof(buf))) {
            fprintf(f, "%*s%s: %s\n", indent, "", m->string, buf);
        } else if (cJSON_IsObject(m)) {
            fprintf(f, "%*s%s:\n", indent, "", m->string);
            members(f, indent + 2, m);
        } else if (cJSON_IsArray(m) && cJSON_IsObject(m->child)) {
            table(f, indent, m->string, m);
        } else {
            char *p = cJSON_PrintUnformatted(m);
            fprintf(f, "%*s%s: %s\n", indent, "", m->string, p ? p : "?");
            cJSON_free(p);
        }
    }
}

void out_human(FILE *f, const cJSON *root)
{
    const cJSON *code = cJSON_GetObjectItemCaseSensitive(root, "code");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(root, "msg");
    if (cJSON_IsString(msg) && strcmp(msg->valuestring, "ok") != 0)
        fprintf(f, "%s\n", msg->valuestring);
    else if (cJSON_IsString(code) && strcmp(code->valuestring, "OK") != 0)
        fprintf(f, "%s\n", code->valuestring);
    members(f, 0, root);
}

void out_members(FILE *f, const cJSON *root)
{
    members(f, 0, root);
}
