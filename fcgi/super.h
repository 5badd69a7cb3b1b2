/* super.h - the built-in prefork supervisor of coupon-fcgi. */
#ifndef CS_SUPER_H
#define CS_SUPER_H

struct cs_conf;

/* Binds fcgi.listen (a unix socket path, "unix:PATH", or HOST:PORT) and
 * returns the listening fd, or -1 after logging why. */
int super_listen(const struct cs_conf *conf);

/* Runs the supervisor on listen_fd: creates the node shared memory, forks
 * fcgi.workers workers, replaces one that dies (with backoff, logging why it
 * died), stops gracefully on SIGTERM/SIGINT (workers finish their request in
 * flight) and on SIGHUP re-reads conf_path and replaces the workers one by
 * one. *conf is owned by the supervisor from here on. Returns the exit code. */
int super_run(struct cs_conf *conf, const char *conf_path, int listen_fd, int own_socket);

#endif
