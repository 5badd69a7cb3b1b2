/* test_http.c - request parsing, token checks and outcome mapping of coupon-fcgi. */
#include <check.h>
#include <jwt.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "req/auth.h"
#include "cs.h"
#include "req/http.h"
#include "req/params.h"
#include "req/req.h"
#include "runner.h"

static const char SECRET[] = "unit-test-secret-0123456789abcdefghijkl";

static int parse(const char *body, int64_t *id)
{
    const char *why = NULL;
    int rc = http_parse_id_body(body, strlen(body), id, &why);
    if (rc != CS_OK)
        ck_assert_ptr_nonnull(why);
    return rc;
}

START_TEST(id_body_accepts_integers)
{
    int64_t id = 0;
    ck_assert_int_eq(parse("{\"id\":1}", &id), CS_OK);
    ck_assert_int_eq(id, 1);
    ck_assert_int_eq(parse(" { \"name\" : \"x,}\\\"\" , \"nested\":{\"id\":5,\"a\":[1,{\"b\":2}]}, \"id\" : 42 } ", &id), CS_OK);
    ck_assert_int_eq(id, 42);
    ck_assert_int_eq(parse("{\"id\":9223372036854775807}", &id), CS_OK);
    ck_assert(id == INT64_MAX);
}
END_TEST

START_TEST(id_body_rejects_everything_else)
{
    static const char *const bad[] = {
        "", "not json", "{", "[1]", "1", "{\"id\":\"1\"}", "{\"id\":1.5}", "{\"id\":-1}",
        "{\"id\":0}", "{\"id\":1e3}", "{\"id\":9223372036854775808}",
        "{\"id\":99999999999999999999}", "{\"id\":null}", "{\"id\":true}", "{\"ID\":1}",
        "{\"idx\":1}", "{}", "{\"id\":1}garbage", "{\"id\":1.0}", "{\"id\":01}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int64_t id = 77;
        ck_assert_msg(parse(bad[i], &id) == CS_ERR, "accepted %s", bad[i]);
    }
}
END_TEST

/* Bodies that other JSON readers (Python's json, JavaScript's JSON.parse, a
 * gateway's) would read differently are refused, so all agree on the id. */
START_TEST(id_body_one_plain_id)
{
    static const char *const bad[] = {
        "{\"id\":701,\"id\":702}",           /* duplicate: first or last wins elsewhere */
        "{\"id\":701,\"x\":1,\"id\":701}",   /* even with the same value */
        "{\"\\u0069d\":702,\"id\":701}",     /* escaped name that decodes to id */
        "{\"i\\u0064\":702}",
        "{\"\\u0069\\u0064\":702}",
        "{\"id\":701,\"\\u0069d\":702}",
        "\xEF\xBB\xBF{\"id\":701}",          /* byte-order mark */
        "{\"id\":701}\xEF\xBB\xBF",
        "{\"id\":701,}",                     /* trailing comma */
        "{\"id\":701 \"x\":1}",
        "{'id':701}",
        "{\"id\":701}\n{\"id\":702}",
        "{\"id\":701,\"x\":\"\xC3\"}",       /* invalid UTF-8 */
        "{\"id\":701,\"x\":\"\xED\xA0\x80\"}", /* an encoded surrogate */
        "{\"id\":701,\"x\":\"\xC0\xAF\"}",   /* overlong */
        "{\"id\":701,\"x\":\"a\tb\"}",       /* raw control character */
        "{\"id\":701,\"x\":\"\\x41\"}",      /* no such escape */
        "{\"id\":701,\"x\":\"\\ud83d\"}",    /* lone surrogates */
        "{\"id\":701,\"x\":\"\\ud83dtrue\"}",
        "{\"id\":701,\"x\":\"\\ude00\\ud83d\"}",
        "{\"id\":701,\"x\":\"\\u12\"}",
        "{\"id\":701,\"x\":[1,2,]}",
        "{\"id\":701,\"x\":01}",
        "{\"id\":701,\"x\":1.}",
        "{\"id\":701,\"x\":.5}",
        "{\"id\":701,\"x\":tru}",
        "{\"id\":701,\"x\":NaN}",
        "{\"id\":-0}",
        "{\"id\":+1}",
        "{\"id\":701",
        "{\"id\":[701]}",
        "{\"id\":{\"id\":701}}",
        "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int64_t id = 77;
        ck_assert_msg(parse(bad[i], &id) == CS_ERR, "accepted %s", bad[i]);
        ck_assert_int_eq(id, 77);
    }
    /* A NUL inside the body (its length says more follows) is invalid JSON. */
    int64_t id = 77;
    const char *why = NULL;
    ck_assert_int_eq(http_parse_id_body("{\"id\":7}\0x", 10, &id, &why), CS_ERR);
    ck_assert_int_eq(http_parse_id_body("{\"id\":7\0}", 9, &id, &why), CS_ERR);
    /* Escapes elsewhere, names near "id", nested ids and valid UTF-8 are fine. */
    static const char *const good[] = {
        "{\"id\":701,\"name\":\"caf\xC3\xA9 \\u00e9 \\ud83d\\ude00 \xF0\x9F\x98\x80 \\\"x\\\"\"}",
        "{\"\\u0069dx\":1,\"id\":701}",
        "{\"i\":1,\"d\":2,\"ID\":3,\"id \":4,\"id\":701}",
        "{\"x\":{\"id\":1,\"id\":2},\"id\":701}",
        "{\"a\":[true,false,null,-1.5e+3,0,{}],\"id\":701}",
        "\r\n\t {\"id\" : 701 } \n",
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        id = 0;
        ck_assert_msg(parse(good[i], &id) == CS_OK, "refused %s", good[i]);
        ck_assert_int_eq(id, 701);
    }
}
END_TEST

START_TEST(json_check_refuses_nul)
{
    const char *why = NULL;
    /* Any valid document without U+0000 in a string passes, as is. */
    static const char *const good[] = {
        "{\"couponId\":1,\"userId\":\"2\",\"orderId\":\"A-1\\\"\\\\\"}",
        "[1,\"x\\u0001y\",{\"a\":null}]",
        "\"\\u0100\\\\u0000\"", /* an escaped backslash, then the text u0000 */
        " {} ",
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        ck_assert_msg(http_json_check(good[i], strlen(good[i]), &why) == CS_OK, "refused %s: %s",
                      good[i], why);
    /* cJSON would end each of these strings at the NUL. */
    static const char *const nul[] = {
        "{\"orderId\":\"Q\\u0000evil\"}",
        "{\"couponId\":\"2\\u0000 OR 1=1\"}",
        "{\"userId\\u0000\":5}",
        "[[[\"\\u0000\"]]]",
        "{\"a\":\"\\U0000\"}", /* not an escape at all: invalid */
    };
    for (size_t i = 0; i < sizeof(nul) / sizeof(nul[0]); i++)
        ck_assert_msg(http_json_check(nul[i], strlen(nul[i]), &why) == CS_ERR, "took %s", nul[i]);
    /* A raw NUL byte, in a string or after the document, and invalid JSON. */
    ck_assert_int_eq(http_json_check("{\"a\":\"x\0y\"}", 11, &why), CS_ERR);
    ck_assert_int_eq(http_json_check("{}\0", 3, &why), CS_ERR);
    ck_assert_int_eq(http_json_check("{\"a\":", 5, &why), CS_ERR);
    ck_assert_int_eq(http_json_check("\xEF\xBB\xBF{}", 5, &why), CS_ERR);
    ck_assert_int_eq(http_json_check("", 0, &why), CS_ERR);
}
END_TEST

START_TEST(content_type_and_query)
{
    char v[32];
    ck_assert(http_is_json_type("application/json"));
    ck_assert(http_is_json_type("application/json; charset=utf-8"));
    ck_assert(http_is_json_type("Application/JSON"));
    ck_assert(!http_is_json_type(NULL));
    ck_assert(!http_is_json_type("text/plain"));
    ck_assert(!http_is_json_type("application/jsonp"));
    ck_assert(!http_is_json_type("application/x-www-form-urlencoded"));
    ck_assert_int_eq(http_query_param("a=1&id=25&b=2", "id", v, sizeof(v)), CS_OK);
    ck_assert_str_eq(v, "25");
    ck_assert_int_eq(http_query_param("xid=3", "id", v, sizeof(v)), CS_ERR);
    ck_assert_int_eq(http_query_param("", "id", v, sizeof(v)), CS_ERR);
    ck_assert_int_eq(http_query_param("id=", "id", v, sizeof(v)), CS_OK);
    ck_assert_str_eq(v, "");
    ck_assert_int_eq(http_query_param("id", "id", v, sizeof(v)), CS_ERR);
}
END_TEST

START_TEST(outcome_mapping)
{
    ck_assert_int_eq(http_code_status(CODE_UNKNOWN_OUTCOME), 503);
    ck_assert_str_eq(http_code_name(CODE_UNKNOWN_OUTCOME), "UNKNOWN_OUTCOME");
    ck_assert_int_eq(http_code_status(CODE_SEIZED), 200);
    ck_assert_int_eq(http_code_status(CODE_SOLD_OUT), 409);
    ck_assert_int_eq(http_code_status(CODE_NO_SUCH_ACTIVITY), 404);
    ck_assert_int_eq(http_code_status(CODE_TOO_MANY_REQUESTS), 429);
    ck_assert_int_eq(http_code_status(CODE_UNAVAILABLE), 503);
    ck_assert_str_eq(http_code_name(CODE_UNSUPPORTED_MEDIA_TYPE), "UNSUPPORTED_MEDIA_TYPE");
    for (int c = 0; c < CODE__COUNT; c++) {
        ck_assert_ptr_nonnull(http_code_name((enum cs_code)c));
        ck_assert_int_ge(http_code_status((enum cs_code)c), 200);
    }
}
END_TEST

/* "Bearer " + the encoding of j, which it frees. */
static char *bearer_of(jwt_t *j)
{
    char *tok = jwt_encode_str(j);
    jwt_free(j);
    ck_assert_ptr_nonnull(tok);
    char *hdr = xmalloc(strlen(tok) + 8);
    sprintf(hdr, "Bearer %s", tok);
    free(tok);
    return hdr;
}

/* Mints a token with libjwt; sub NULL leaves it out, exp 0 leaves it out. */
static char *mint(jwt_alg_t alg, const char *key, const char *sub, long exp, const char *role)
{
    jwt_t *j;
    ck_assert_int_eq(jwt_new(&j), 0);
    if (sub)
        jwt_add_grant(j, "sub", sub);
    if (exp)
        jwt_add_grant_int(j, "exp", exp);
    if (role)
        jwt_add_grant(j, "role", role);
    ck_assert_int_eq(jwt_set_alg(j, alg, (const unsigned char *)key, key ? (int)strlen(key) : 0), 0);
    return bearer_of(j);
}

/* auth_check() with both verifiers (OpenSSL with a keyed context, and
 * libjwt), which must give the same answer, the same identity and the same
 * reason; returns that answer. */
static enum auth_result check_both(const char *audience, const char *issuer, int leeway,
                                   const char *hdr, struct auth_identity *id, const char **why)
{
    struct auth_cfg cfg = {.mode = AUTH_MODE_JWT, .verifier = AUTH_VERIFY_OPENSSL,
                           .secret = (const unsigned char *)SECRET, .secret_len = strlen(SECRET),
                           .leeway_s = leeway, .audience = audience, .issuer = issuer};
    struct auth_identity lid;
    const char *lwhy = NULL;
    int64_t now = time(NULL);

    ck_assert_int_eq(auth_init(&cfg), CS_OK);
    ck_assert_ptr_nonnull(cfg.mac);
    *why = NULL;
    enum auth_result r = auth_check(&cfg, hdr, NULL, NULL, now, id, why);
    auth_fini(&cfg);
    ck_assert_ptr_null(cfg.mac);

    cfg.verifier = AUTH_VERIFY_LIBJWT;
    ck_assert_int_eq(auth_init(&cfg), CS_OK);
    enum auth_result l = auth_check(&cfg, hdr, NULL, NULL, now, &lid, &lwhy);
    auth_fini(&cfg);
    ck_assert_int_eq(r, l);
    ck_assert_int_eq(id->user_id, lid.user_id);
    ck_assert_int_eq(id->is_admin, lid.is_admin);
    ck_assert_str_eq(*why ? *why : "", lwhy ? lwhy : "");
    return r;
}

static enum auth_result check(const char *hdr, struct auth_identity *id)
{
    const char *why;
    return check_both(NULL, NULL, 0, hdr, id, &why);
}

/* Mints an HS256 token from JSON texts: extra header members (or NULL) and
 * the whole claims object. */
static char *mint_json(const char *headers, const char *claims)
{
    jwt_t *j;
    ck_assert_int_eq(jwt_new(&j), 0);
    if (headers)
        ck_assert_int_eq(jwt_add_headers_json(j, headers), 0);
    ck_assert_int_eq(jwt_add_grants_json(j, claims), 0);
    ck_assert_int_eq(jwt_set_alg(j, JWT_ALG_HS256, (const unsigned char *)SECRET,
                                 (int)strlen(SECRET)), 0);
    return bearer_of(j);
}

/* Base64url without padding of n bytes, for tokens libjwt would not write. */
static void b64url(const char *in, size_t n, char *out)
{
    static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    const unsigned char *u = (const unsigned char *)in;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)u[i] << 16 | (i + 1 < n ? (unsigned)u[i + 1] << 8 : 0)
                     | (i + 2 < n ? u[i + 2] : 0);
        out[o++] = al[(v >> 18) & 63];
        out[o++] = al[(v >> 12) & 63];
        if (i + 1 < n)
            out[o++] = al[(v >> 6) & 63];
        if (i + 2 < n)
            out[o++] = al[v & 63];
    }
    out[o] = '\0';
}

/* "Bearer " + a token of exactly these header and claims texts, signed with
 * SECRET (OpenSSL's HMAC), for headers libjwt's encoder would rewrite. */
static char *mint_raw(const char *header, const char *claims)
{
    char *hdr = xmalloc(7 + (strlen(header) + strlen(claims)) * 2 + 64);
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned ml = 0;

    strcpy(hdr, "Bearer ");
    b64url(header, strlen(header), hdr + 7);
    strcat(hdr, ".");
    b64url(claims, strlen(claims), hdr + strlen(hdr));
    HMAC(EVP_sha256(), SECRET, (int)strlen(SECRET), (const unsigned char *)hdr + 7,
         strlen(hdr) - 7, mac, &ml);
    strcat(hdr, ".");
    b64url((const char *)mac, ml, hdr + strlen(hdr));
    return hdr;
}

static enum auth_result check_cfg(const char *audience, const char *issuer, int leeway,
                                  const char *hdr, const char **why)
{
    struct auth_identity id;
    enum auth_result r = check_both(audience, issuer, leeway, hdr, &id, why);
    if (r == AUTH_OK)
        ck_assert_int_eq(id.user_id, 5);
    return r;
}

/* RFC 7519 / 7515 claims and headers, doc/api.md, "Identity". */
START_TEST(jwt_claims_by_the_rfcs)
{
    char claims[256], *t;
    const char *why;
    long now = time(NULL);

    /* A fractional exp is a valid NumericDate. */
    snprintf(claims, sizeof(claims), "{\"sub\":\"5\",\"exp\":%ld.25}", now + 600);
    t = mint_json(NULL, claims);
    ck_assert_int_eq(check_cfg(NULL, NULL, 0, t, &why), AUTH_OK);
    free(t);
    snprintf(claims, sizeof(claims), "{\"sub\":5,\"exp\":%ld.75}", now - 2);
    t = mint_json(NULL, claims);
    ck_assert_int_eq(check_cfg(NULL, NULL, 0, t, &why), AUTH_INVALID);
    ck_assert_int_eq(check_cfg(NULL, NULL, 60, t, &why), AUTH_OK); /* leeway */
    free(t);
    snprintf(claims, sizeof(claims), "{\"sub\":\"5\",\"exp\":\"%ld\"}", now + 600);
    t = mint_json(NULL, claims);
    ck_assert_int_eq(check_cfg(NULL, NULL, 0, t, &why), AUTH_INVALID);
    free(t);

    /* nbf an hour ahead: not yet; within the leeway: fine; past: fine. */
    snprintf(claims, sizeof(claims), "{\"sub\":\"5\",\"exp\":%ld,\"nbf\":%ld}", now + 7200,
             now + 3600);
    t = mint_json(NULL, claims);
    ck_assert_int_eq(check_cfg(NULL, NULL, 0, t, &why), AUTH_INVALID);
    ck_assert_str_eq(why, "token not valid yet (nbf)");
    free(t);
    snprintf(claims, sizeof(claims), "{\"sub\":\"5\",\"exp\":%ld,\"nbf\":%ld.5}", now + 7200,
             now + 20);
    t = mint_json(NULL, claims);
    ck_assert_int_eq(check_cfg(NULL, NULL, 0, t, &why), AUTH_INVALID);
    ck_assert_int_eq(check_cfg(NULL, NULL, 60, t, &why), AUTH_OK);
    free(t);
    snprintf(claims, sizeof(claims), "{\"sub\":\"5\",\"exp\":%ld,\"nbf\":%ld}", now + 600,
             now - 10);
    t = mint_json(NULL, claims);
    ck_assert_int_eq(check_cfg(NULL, NULL, 0, t, &why), AUTH_OK);
    free(t);
    snprintf(claims, sizeof(claims), "{\"sub\":\"5\",\"exp\":%ld,\"nbf\":\"x\"}", now + 600);
    t = mint_json(NULL, claims);
    ck_assert_int_eq(check_cfg(NULL, NULL, 0, t, &why), AUTH_INVALID);
    free(t);

    /* crit is refused, whatever it names. */
    snprintf(claims, sizeof(claims), "{\"sub\":\"5\",\"exp\":%ld}", now + 600);
    t = mint_json("{\"crit\":[\"exp\"]}", claims);
    ck_assert_int_eq(check_cfg(NULL, NULL, 0, t, &why), AUTH_INVALID);
    ck_assert_str_eq(why, "token has a crit header");
    free(t);
    t = mint_json("{\"kid\":\"k1\"}", claims);
    ck_assert_int_eq(check_cfg(NULL, NULL, 0, t, &why), AUTH_OK);
    free(t);
    /* typ, when a string, says JWT in any case (libjwt's rule). */
    t = mint_raw("{\"alg\":\"HS256\",\"typ\":\"jwt\"}", claims);
    ck_assert_int_eq(check_cfg(NULL, NULL, 0, t, &why), AUTH_OK);
    free(t);
    t = mint_raw("{\"alg\":\"HS256\",\"typ\":1}", claims);
    ck_assert_int_eq(check_cfg(NULL, NULL, 0, t, &why), AUTH_OK);
    free(t);
    t = mint_raw("{\"alg\":\"HS256\",\"typ\":\"JOSE\"}", claims);
    ck_assert_int_eq(check_cfg(NULL, NULL, 0, t, &why), AUTH_INVALID);
    ck_assert_str_eq(why, "token typ is not JWT");
    free(t);
    /* A raw token the same signer accepts, so the refusals above are the rules'. */
    t = mint_raw("{\"alg\":\"HS256\"}", claims);
    ck_assert_int_eq(check_cfg(NULL, NULL, 0, t, &why), AUTH_OK);
    free(t);

    /* sub: a string or a JSON integer, never 5.0; a name twice at any depth
     * is refused. */
    snprintf(claims, sizeof(claims), "{\"sub\":5.0,\"exp\":%ld}", now + 600);
    t = mint_json(NULL, claims);
    ck_assert_int_eq(check_cfg(NULL, NULL, 0, t, &why), AUTH_INVALID);
    ck_assert_str_eq(why, "token sub must be a decimal user id");
    free(t);
    snprintf(claims, sizeof(claims), "{\"sub\":-5,\"exp\":%ld}", now + 600);
    t = mint_json(NULL, claims);
    ck_assert_int_eq(check_cfg(NULL, NULL, 0, t, &why), AUTH_INVALID);
    free(t);
    snprintf(claims, sizeof(claims), "{\"sub\":\"5\",\"exp\":%ld,\"x\":{\"a\":1,\"a\":2}}",
             now + 600);
    t = mint_raw("{\"alg\":\"HS256\"}", claims);
    ck_assert_int_eq(check_cfg(NULL, NULL, 0, t, &why), AUTH_INVALID);
    ck_assert_str_eq(why, "token claims are not a JSON object");
    free(t);

    /* Audience: a string or an array holding it; issuer: equal. */
    snprintf(claims, sizeof(claims),
             "{\"sub\":\"5\",\"exp\":%ld,\"aud\":\"coupons\",\"iss\":\"idp\"}", now + 600);
    t = mint_json(NULL, claims);
    ck_assert_int_eq(check_cfg("coupons", "idp", 0, t, &why), AUTH_OK);
    ck_assert_int_eq(check_cfg("other", NULL, 0, t, &why), AUTH_INVALID);
    ck_assert_int_eq(check_cfg(NULL, "idp2", 0, t, &why), AUTH_INVALID);
    ck_assert_int_eq(check_cfg("", "", 0, t, &why), AUTH_OK);
    free(t);
    snprintf(claims, sizeof(claims),
             "{\"sub\":\"5\",\"exp\":%ld,\"aud\":[\"web\",\"coupons\"]}", now + 600);
    t = mint_json(NULL, claims);
    ck_assert_int_eq(check_cfg("coupons", NULL, 0, t, &why), AUTH_OK);
    ck_assert_int_eq(check_cfg("coupon", NULL, 0, t, &why), AUTH_INVALID);
    ck_assert_int_eq(check_cfg(NULL, "idp", 0, t, &why), AUTH_INVALID); /* no iss */
    free(t);
    snprintf(claims, sizeof(claims), "{\"sub\":\"5\",\"exp\":%ld}", now + 600);
    t = mint_json(NULL, claims);
    ck_assert_int_eq(check_cfg("coupons", NULL, 0, t, &why), AUTH_INVALID); /* no aud */
    free(t);
    snprintf(claims, sizeof(claims),
             "{\"sub\":\"5\",\"exp\":%ld,\"aud\":[[\"coupons\"],5]}", now + 600);
    t = mint_json(NULL, claims);
    ck_assert_int_eq(check_cfg("coupons", NULL, 0, t, &why), AUTH_INVALID);
    free(t);
}
END_TEST

static int front(const char *header, const char *claims, const char *sig)
{
    char h[512], c[512], tok[1200];
    const char *t, *why = NULL;
    size_t len;
    b64url(header, strlen(header), h);
    b64url(claims, strlen(claims), c);
    snprintf(tok, sizeof(tok), "Bearer %s.%s.%s", h, c, sig);
    int rc = auth_token_front(tok, &t, &len, &why);
    if (rc != CS_OK)
        ck_assert_ptr_nonnull(why);
    else
        ck_assert_uint_eq(len, strlen(tok) - 7);
    return rc;
}

START_TEST(jwt_front_end)
{
    static const char sig[] = "3FmNNaAnq-AOXL_8A3bs7jEEHu1x7m12hSMZmBcZc6M";
    static const char cl[] = "{\"sub\":\"1\",\"exp\":1}";
    ck_assert_int_eq(front("{\"alg\":\"HS256\",\"typ\":\"JWT\"}", cl, sig), CS_OK);
    ck_assert_int_eq(front("{\"alg\":\"hs256\"}", cl, sig), CS_ERR);
    ck_assert_int_eq(front("{\"alg\":\"HS256 \"}", cl, sig), CS_ERR);
    ck_assert_int_eq(front("{\"alg\":\"none\"}", cl, sig), CS_ERR);
    ck_assert_int_eq(front("{\"typ\":\"JWT\"}", cl, sig), CS_ERR);
    ck_assert_int_eq(front("{\"alg\":\"HS256\",\"crit\":[]}", cl, sig), CS_ERR);
    ck_assert_int_eq(front("{\"alg\":\"HS256\",\"\\u0063rit\":[\"b64\"]}", cl, sig), CS_ERR);
    ck_assert_int_eq(front("{\"alg\":\"HS256\",\"alg\":\"none\"}", cl, sig), CS_ERR);
    ck_assert_int_eq(front("{\"alg\":\"none\",\"alg\":\"HS256\"}", cl, sig), CS_ERR);
    ck_assert_int_eq(front("[\"HS256\"]", cl, sig), CS_ERR);
    ck_assert_int_eq(front("{\"alg\":\"HS256\"}", "{\"sub\":\"1\",\"sub\":\"2\"}", sig), CS_ERR);
    ck_assert_int_eq(front("{\"alg\":\"HS256\"}", "[1]", sig), CS_ERR);
    ck_assert_int_eq(front("{\"alg\":\"HS256\"}", cl, "3FmNNaAnq-AOXL_8A3bs7jEEHu1x7m12hSMZmBcZc6"), CS_ERR);
    ck_assert_int_eq(front("{\"alg\":\"HS256\"}", cl, "3FmNNaAnq-AOXL_8A3bs7jEEHu1x7m12hSMZmBcZc6M="), CS_ERR);
    ck_assert_int_eq(front("{\"alg\":\"HS256\"}", cl, "3FmNNaAnq-AOXL_8A3bs7jEEHu1x7m12hSMZmBcZc6N"), CS_ERR);
    ck_assert_int_eq(front("{\"alg\":\"HS256\"}", cl, "3FmNNaAnq+AOXL/8A3bs7jEEHu1x7m12hSMZmBcZc6M"), CS_ERR);
    const char *t, *why;
    size_t len;
    ck_assert_int_eq(auth_token_front("Bearer a.b.c.d", &t, &len, &why), CS_ERR);
    ck_assert_int_eq(auth_token_front("Bearer abc", &t, &len, &why), CS_ERR);
    ck_assert_int_eq(auth_token_front("Token abc", &t, &len, &why), CS_ERR);
}
END_TEST

START_TEST(jwt_good_tokens)
{
    struct auth_identity id;
    long exp = time(NULL) + 600;
    char *t = mint(JWT_ALG_HS256, SECRET, "4242", exp, NULL);
    ck_assert_int_eq(check(t, &id), AUTH_OK);
    ck_assert_int_eq(id.user_id, 4242);
    ck_assert_int_eq(id.is_admin, 0);
    free(t);
    t = mint(JWT_ALG_HS256, SECRET, "7", exp, "admin");
    ck_assert_int_eq(check(t, &id), AUTH_OK);
    ck_assert_int_eq(id.is_admin, 1);
    free(t);
}
END_TEST

START_TEST(jwt_bad_tokens)
{
    struct auth_identity id;
    long exp = time(NULL) + 600;
    char *t;

    ck_assert_int_eq(check(NULL, &id), AUTH_MISSING);
    ck_assert_int_eq(check("", &id), AUTH_MISSING);
    ck_assert_int_eq(check("Basic dXNlcjpwYXNz", &id), AUTH_INVALID);
    ck_assert_int_eq(check("Bearer ", &id), AUTH_INVALID);
    ck_assert_int_eq(check("Bearer a.b.c", &id), AUTH_INVALID);

    t = mint(JWT_ALG_HS256, "another-secret-0123456789abcdefghijkl", "1", exp, NULL);
    ck_assert_int_eq(check(t, &id), AUTH_INVALID); /* forged */
    free(t);
    t = mint(JWT_ALG_HS512, SECRET, "1", exp, NULL);
    ck_assert_int_eq(check(t, &id), AUTH_INVALID); /* other alg, right key */
    free(t);
    t = mint(JWT_ALG_NONE, NULL, "1", exp, NULL);
    ck_assert_int_eq(check(t, &id), AUTH_INVALID); /* alg none */
    free(t);
    t = mint(JWT_ALG_HS256, SECRET, "1", time(NULL) - 5, NULL);
    ck_assert_int_eq(check(t, &id), AUTH_INVALID); /* expired */
    free(t);
    t = mint(JWT_ALG_HS256, SECRET, "1", 0, NULL);
    ck_assert_int_eq(check(t, &id), AUTH_INVALID); /* no exp */
    free(t);
    t = mint(JWT_ALG_HS256, SECRET, "abc", exp, NULL);
    ck_assert_int_eq(check(t, &id), AUTH_INVALID); /* sub not a number */
    free(t);
    t = mint(JWT_ALG_HS256, SECRET, "-5", exp, NULL);
    ck_assert_int_eq(check(t, &id), AUTH_INVALID);
    free(t);
    t = mint(JWT_ALG_HS256, SECRET, NULL, exp, NULL);
    ck_assert_int_eq(check(t, &id), AUTH_INVALID); /* no sub */
    free(t);

    /* A valid token with its signature cut off or altered. */
    t = mint(JWT_ALG_HS256, SECRET, "1", exp, NULL);
    size_t n = strlen(t);
    t[n - 2] = t[n - 2] == 'A' ? 'B' : 'A';
    ck_assert_int_eq(check(t, &id), AUTH_INVALID);
    *strrchr(t, '.') = '\0';
    ck_assert_int_eq(check(t, &id), AUTH_INVALID);
    free(t);
}
END_TEST

START_TEST(trusted_header_mode)
{
    struct auth_cfg cfg = {.mode = AUTH_MODE_TRUSTED_HEADER};
    struct auth_identity id;
    const char *why;
    ck_assert_int_eq(auth_check(&cfg, NULL, "123", NULL, 0, &id, &why), AUTH_OK);
    ck_assert_int_eq(id.user_id, 123);
    ck_assert_int_eq(id.is_admin, 0);
    ck_assert_int_eq(auth_check(&cfg, NULL, "9", "admin", 0, &id, &why), AUTH_OK);
    ck_assert_int_eq(id.is_admin, 1);
    ck_assert_int_eq(auth_check(&cfg, NULL, NULL, NULL, 0, &id, &why), AUTH_MISSING);
    ck_assert_int_eq(auth_check(&cfg, NULL, "12a", NULL, 0, &id, &why), AUTH_INVALID);
    ck_assert_int_eq(auth_check(&cfg, NULL, "0", NULL, 0, &id, &why), AUTH_INVALID);
}
END_TEST

/* lighttpd passes a client's X_User_Id, X.User.Id and X-User-Id all as
 * HTTP_X_USER_ID, before or after what the server set: the identity comes
 * from a param no header can produce, and a doubled one is flagged. */
START_TEST(trusted_identity_params)
{
    struct req r;
    char *spoof[] = {"HTTP_X_USER_ID=777", "HTTP_X_USER_ROLE=admin", "HTTP_X_USER_ID=42",
                     "COUPONSEIZE_USER_ID=42", "REQUEST_URI=/x", NULL};
    memset(&r, 0, sizeof(r));
    params_fill(&r, spoof);
    ck_assert_ptr_nonnull(r.x_user_id);
    ck_assert_str_eq(r.x_user_id, "42");
    ck_assert_ptr_null(r.x_user_role);
    ck_assert_int_eq(r.identity_twice, 0);

    char *twice[] = {"COUPONSEIZE_USER_ID=777", "COUPONSEIZE_USER_ID=42", NULL};
    memset(&r, 0, sizeof(r));
    params_fill(&r, twice);
    ck_assert_int_eq(r.identity_twice, 1);
    char *role_twice[] = {"COUPONSEIZE_USER_ID=42", "COUPONSEIZE_USER_ROLE=admin",
                          "COUPONSEIZE_USER_ROLE=", NULL};
    memset(&r, 0, sizeof(r));
    params_fill(&r, role_twice);
    ck_assert_int_eq(r.identity_twice, 1);
    /* A longer name sharing the prefix is another param. */
    char *longer[] = {"COUPONSEIZE_USER_ID=42", "COUPONSEIZE_USER_IDX=7", NULL};
    memset(&r, 0, sizeof(r));
    params_fill(&r, longer);
    ck_assert_int_eq(r.identity_twice, 0);
    ck_assert_str_eq(r.x_user_id, "42");
}
END_TEST

START_TEST(request_start_forms)
{
    /* nginx's $msec, Apache's %t (microseconds), and the other spellings */
    ck_assert_int_eq(params_request_start_ms("t=1764540000.123"), 1764540000123LL);
    ck_assert_int_eq(params_request_start_ms("1764540000.1"), 1764540000100LL);
    ck_assert_int_eq(params_request_start_ms("t=1764540000.123456"), 1764540000123LL);
    ck_assert_int_eq(params_request_start_ms("t=1764540000123456"), 1764540000123LL);
    ck_assert_int_eq(params_request_start_ms("t=1764540000123"), 1764540000123LL);
    ck_assert_int_eq(params_request_start_ms("1764540000"), 1764540000000LL);
    ck_assert_int_eq(params_request_start_ms(NULL), -1);
    ck_assert_int_eq(params_request_start_ms(""), -1);
    ck_assert_int_eq(params_request_start_ms("t="), -1);
    ck_assert_int_eq(params_request_start_ms("t=1764540000."), -1);
    ck_assert_int_eq(params_request_start_ms("t=1764540000.12x"), -1);
    ck_assert_int_eq(params_request_start_ms("t=-5"), -1);
    ck_assert_int_eq(params_request_start_ms("t=17645400001234567890"), -1);
    ck_assert_int_eq(params_request_start_ms("t=1764540000123.5"), -1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("http");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, id_body_accepts_integers);
    tcase_add_test(tc, id_body_rejects_everything_else);
    tcase_add_test(tc, id_body_one_plain_id);
    tcase_add_test(tc, json_check_refuses_nul);
    tcase_add_test(tc, content_type_and_query);
    tcase_add_test(tc, outcome_mapping);
    tcase_add_test(tc, jwt_good_tokens);
    tcase_add_test(tc, jwt_bad_tokens);
    tcase_add_test(tc, jwt_claims_by_the_rfcs);
    tcase_add_test(tc, jwt_front_end);
    tcase_add_test(tc, trusted_header_mode);
    tcase_add_test(tc, trusted_identity_params);
    tcase_add_test(tc, request_start_forms);
    suite_add_tcase(s, tc);
    return cs_run_suite(s, 0);
}
