/* params.h - the FastCGI parameters of a request mapped onto struct req. */
#ifndef CS_PARAMS_H
#define CS_PARAMS_H

#include <stdint.h>

struct req;

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

/* When the web server received a request, from an X-Request-Start value
 * (HTTP_X_REQUEST_START) as web servers and load balancers write it:
 * "t=" optional, then seconds with a fraction ("t=1764540000.123", nginx's
 * $msec) or whole seconds, milliseconds or microseconds since the epoch
 * (told apart by size; Apache's "%t" gives "t=<microseconds>"). Returns
 * epoch milliseconds, or -1 when v is NULL or not such a value. */
int64_t params_request_start_ms(const char *v);

#endif
