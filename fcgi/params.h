/* params.h - the FastCGI parameters of a request mapped onto struct req. */
#ifndef CS_PARAMS_H
#define CS_PARAMS_H

#include "worker.h"

/* Fills the request fields that come from the FastCGI parameters env
 * (NULL-terminated "NAME=VALUE" strings, as libfcgi's envp): method (GET
 * when absent), content_type, authorization, x_user_id, x_user_role, query
 * (never NULL), content_length (-1 when absent or not a decimal number,
 * LONG_MAX when too large to hold) and path (REQUEST_URI up to '?', else
 * SCRIPT_NAME + PATH_INFO; cut to fit and always NUL-terminated). The
 * pointers point into env. Leaves every other field of r alone. */
void params_fill(struct req *r, char **env);

#endif
