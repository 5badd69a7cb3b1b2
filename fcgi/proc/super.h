/* super.h - the built-in prefork supervisor of coupon-fcgi. */
#ifndef CS_SUPER_H
#define CS_SUPER_H

#include <stdint.h>

struct cs_conf;

/* The longest wait before a process that keeps dying young is started
 * again. */
#define SUPER_BACKOFF_MAX_MS 5000

/* The wait before starting again a process that ended after lived_ms, when
 * the wait before its last start was prev_ms: a process that dies within a
 * second is restarted later and later (100 ms, then twice the last, up to
 * SUPER_BACKOFF_MAX_MS); one that lived longer at once. */
static inline int64_t super_backoff(int64_t prev_ms, int64_t lived_ms)
{
    if (lived_ms >= 1000)
        return 0;
    if (prev_ms == 0)
        return 100;
    return prev_ms * 2 > SUPER_BACKOFF_MAX_MS ? SUPER_BACKOFF_MAX_MS : prev_ms * 2;
}

/* Binds fcgi.listen (a unix socket path, "unix:PATH", or HOST:PORT) and
 * returns the listening fd, or -1 after logging why. */
int super_listen(const struct cs_conf *conf);

/* Runs the supervisor on listen_fd: creates the node shared memory, forks
 * fcgi.workers workers, replaces one that dies (with backoff, logging why it
 * died), stops gracefully on SIGTERM/SIGINT (workers finish their request in
 * flight) and on SIGHUP re-reads conf_path and replaces the workers one by
 * one. On SIGUSR2 it upgrades in place (doc/operations.md, "Upgrading in
 * place"): it starts the binary now on disk on the same socket and, once
 * that one's workers accept, lets its own finish and hands the reserves over.
 * With from set this process is that new binary: it joins the node segment
 * of the supervisor it takes over from instead of creating one, and starts
 * its reserve keeper only once the old one has gone. *conf is owned by the
 * supervisor from here on. Returns the exit code. */
struct upgrade_from;
int super_run(struct cs_conf *conf, const char *conf_path, int listen_fd, int own_socket,
              const struct upgrade_from *from);

#endif
