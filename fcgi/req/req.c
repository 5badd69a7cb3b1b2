/* req.c - the request helpers: answer, read the body, authenticate. */
#include "req.h"
#include "cs.h"
#include "log.h"
#include "mconn.h"
#include "params.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

void req_init(struct req *r, FCGX_Request *fr, char *body, long max_body,
              const struct auth_cfg *auth)
{
    memset(r, 0, sizeof(*r));
    r->fr = fr;
    r->out = fr->out;
    r->body = body;
    r->max_body = max_body;
    r->auth = auth;
    r->start_us = cs_mono_us();
    params_fill(r, fr->envp);
}

/*
 * Ends the request. libfcgi closes a connection by shutting down its write
 * side and then waiting (poll, up to 2 s) until the web server has closed
 * its end, so that input still unread cannot turn the close into a reset
 * that loses the answer. When the input has been read to its end, the web
 * server has sent all it will and there is nothing to lose: the connection
 * is closed at once (libfcgi's "detached" close), which saves shutdown,
 * poll and read per request and the wait for the web server in between.
 */
void req_finish(FCGX_Request *fr)
{
    if (!fr->keepConnection && fr->in != NULL && FCGX_GetChar(fr->in) == EOF
        && FCGX_GetError(fr->in) == 0)
        fr->detached = 1;
    FCGX_Finish_r(fr);
}

void req_reply(struct req *r, enum cs_code code, const char *msg, const char *extra,
               int retry_after_s)
{
    r->code = code;
    snprintf(r->msg, sizeof(r->msg), "%s", msg ? msg : http_code_msg(code));
    http_reply(r->out, code, msg, extra, retry_after_s);
}

int req_read_body(struct req *r)
{
    if (r->content_length <= 0) {
        req_reply(r, CODE_BAD_REQUEST, "request body is empty", NULL, 0);
        return CS_ERR;
    }
    /* Never read past the cap: a large body is refused by its length alone. */
    if (r->content_length > r->max_body) {
        req_reply(r, CODE_TOO_LARGE, NULL, NULL, 0);
        return CS_ERR;
    }
    if (!http_is_json_type(r->content_type)) {
        req_reply(r, CODE_UNSUPPORTED_MEDIA_TYPE, NULL, NULL, 0);
        return CS_ERR;
    }
    if (r->body_read)
        return CS_OK;
    return req_read_raw(r);
}

int req_read_raw(struct req *r)
{
    if (r->body_read)
        return CS_OK;
    if (r->content_length <= 0 || r->content_length > r->max_body) {
        r->body[0] = '\0';
        r->body_len = 0;
        return CS_OK;
    }
    int n = FCGX_GetStr(r->body, (int)r->content_length, r->fr->in);
    if (n != r->content_length) {
        req_reply(r, CODE_BAD_REQUEST, "request body shorter than Content-Length", NULL, 0);
        return CS_ERR;
    }
    r->body[n] = '\0';
    r->body_len = (size_t)n;
    r->body_read = 1;
    return CS_OK;
}

int req_read_optional_json(struct req *r)
{
    int typed = r->content_type != NULL && *r->content_type != '\0';
    if (typed && !http_is_json_type(r->content_type)) {
        req_reply(r, CODE_UNSUPPORTED_MEDIA_TYPE, NULL, NULL, 0);
        return CS_ERR;
    }
    if (r->content_length <= 0) {
        r->body[0] = '\0';
        r->body_len = 0;
        return CS_OK;
    }
    if (req_read_body(r) != CS_OK)
        return CS_ERR;
    cJSON *doc = cJSON_ParseWithLengthOpts(r->body, r->body_len + 1, NULL, 1);
    int is_object = cJSON_IsObject(doc);
    cJSON_Delete(doc);
    if (!is_object) {
        req_reply(r, CODE_BAD_REQUEST, "body must be a JSON object", NULL, 0);
        return CS_ERR;
    }
    return CS_OK;
}

int req_auth(struct req *r, int need, struct auth_identity *id)
{
    const char *why = "";
    enum auth_result res;
    if (r->auth->mode == AUTH_MODE_TRUSTED_HEADER && r->identity_twice) {
        /* Two copies of the identity: which one the server meant is unknown. */
        memset(id, 0, sizeof(*id));
        why = "identity param " PARAMS_USER_ID " or " PARAMS_USER_ROLE " given twice";
        res = AUTH_INVALID;
    } else {
        res = auth_check(r->auth, r->authorization, r->x_user_id, r->x_user_role,
                         cs_now_ms() / 1000, id, &why);
    }
    if (res == AUTH_MISSING && need == 0) {
        id->user_id = 0;
        return CS_OK;
    }
    if (res != AUTH_OK) {
        log_debug("auth refused on %s: %s", r->path, why);
        req_reply(r, CODE_UNAUTHORIZED, why, NULL, 0);
        return CS_ERR;
    }
    if (res == AUTH_OK)
        r->who = *id;
    if (need == 2 && !id->is_admin) {
        req_reply(r, CODE_FORBIDDEN, NULL, NULL, 0);
        return CS_ERR;
    }
    return CS_OK;
}

int req_admin_id(struct req *r, struct auth_identity *who, int64_t *id)
{
    const char *why;

    if (req_auth(r, 2, who) != CS_OK || req_read_body(r) != CS_OK)
        return CS_ERR;
    if (http_parse_id_body(r->body, r->body_len, id, &why) != CS_OK) {
        req_reply(r, CODE_BAD_REQUEST, why, NULL, 0);
        return CS_ERR;
    }
    r->audit_id = *id;
    return CS_OK;
}

void req_mysql_fail(struct req *r, const struct mconn *mc, const char *what, const char *done)
{
    if (mconn_err_is_denied(mc)) {
        log_error("%s: %s", what, mc->errstr);
        req_reply(r, CODE_INTERNAL_ERROR,
                  "MySQL refused the statement: the database user lacks a privilege", NULL, 0);
        return;
    }
    log_error("%s: %s", what, mc->errstr);
    req_reply(r, CODE_UNAVAILABLE, done != NULL ? done : "MySQL unavailable", NULL, 5);
}
