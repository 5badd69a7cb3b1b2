/* params.h - the FastCGI parameters of a request mapped onto struct req. */
#ifndef CS_PARAMS_H
#define CS_PARAMS_H

#include "worker.h"

/* The FastCGI params auth.mode = "trusted-header" takes the caller from, set
 * by the web server. Not HTTP_*: no request header can produce them. */
#define PARAMS_USER_ID "COUPONSEIZE_USER_ID"
#define PARAMS_USER_ROLE "COUPONSEIZE_USER_ROLE"

/* Fills the request fields that come from the FastCGI parameters env
 * (NULL-terminated "NAME=VALUE" strings, as libfcgi's envp): method (GET
 * when absent), content_type, authorization, x_user_id and x_user_role
 * (PARAMS_USER_ID and PARAMS_USER_ROLE; identity_twice when either comes
 * more than once), query
 * (never NULL), content_length (-1 when absent or not a decimal number,
 * LONG_MAX when too large to hold) and path (REQUEST_URI up to '?', else
 * SCRIPT_NAME + PATH_INFO; cut to fit and always NUL-terminated). The
 * pointers point into env. Leaves every other field of r alone. */
void params_fill(struct req *r, char **env);

#endif
