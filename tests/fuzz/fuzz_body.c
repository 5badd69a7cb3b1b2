/* fuzz_body.c - libFuzzer harness: request bodies (http_parse_id_body,
 * http_json_check). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cs.h"
#include "req/http.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Exactly the bytes read, in a buffer of that size: ASan sees any read
     * past the body. */
    char *body = malloc(size ? size : 1);
    int64_t id = -7;
    const char *why = NULL;

    memcpy(body, data, size);
    int rc = http_parse_id_body(body, size, &id, &why);
    if (rc == CS_OK) {
        if (id < 1)
            abort();
        /* An accepted body holds the id as plain digits after "id": */
        if (memmem(body, size, "\"id\"", 4) == NULL)
            abort();
        /* Another JSON reader finds the same id (exactly, while a double
         * holds it). */
        cJSON *doc = cJSON_ParseWithLength(body, size);
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(doc, "id");
        if (!cJSON_IsNumber(v))
            abort();
        if (id < (INT64_C(1) << 53) && v->valuedouble != (double)id)
            abort();
        cJSON_Delete(doc);
    } else if (rc != CS_ERR || why == NULL || id != -7) {
        abort();
    }
    /* A body the strict reader passes is one cJSON reads too. */
    why = NULL;
    rc = http_json_check(body, size, &why);
    if (rc == CS_OK) {
        cJSON *doc = cJSON_ParseWithLength(body, size);
        if (doc == NULL)
            abort();
        cJSON_Delete(doc);
    } else if (rc != CS_ERR || why == NULL) {
        abort();
    }
    free(body);
    return 0;
}
