/* upgrade.h - the in-place binary upgrade of coupon-fcgi (doc/operations.md,
 * "Upgrading in place"): what the old supervisor passes to the new binary. */
#ifndef CS_UPGRADE_H
#define CS_UPGRADE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

/* The environment variable that tells a coupon-fcgi it is the new binary of
 * an in-place upgrade, as nginx's NGINX variable does:
 * "PROTO:OLDPID:FD:OWN", the hand-over protocol's version, the pid of the
 * supervisor it takes over from (its parent), the listening socket it
 * inherits, and 1 when the supervisor bound that socket itself (so unlinks
 * a unix socket's path at stop) or 0 under socket activation. */
#define UPGRADE_ENV "COUPON_FCGI_UPGRADE"

/* The hand-over protocol this build speaks: the signals and their order
 * (super.c, "the in-place upgrade"). A new binary refuses an old supervisor
 * of another protocol; the node segment's layout version (lib/node/shm.c)
 * must match too, since both generations of workers share the segment. */
#define UPGRADE_PROTO 1

/* How long the new supervisor waits for its workers before it gives up
 * and leaves the old one serving. */
#define UPGRADE_READY_MS 10000

struct upgrade_from {
    int proto;
    pid_t old_pid;
    int fd;
    int own_socket;
};

/* Parses the variable's text into *u: 0, or -1 when it is malformed. */
static inline int upgrade_parse(const char *text, struct upgrade_from *u)
{
    int proto, pid, fd, own, used = 0;

    if (text == NULL || sscanf(text, "%d:%d:%d:%d%n", &proto, &pid, &fd, &own, &used) != 4
        || text[used] != '\0' || proto <= 0 || pid <= 1 || fd < 0 || (own != 0 && own != 1))
        return -1;
    u->proto = proto;
    u->old_pid = (pid_t)pid;
    u->fd = fd;
    u->own_socket = own;
    return 0;
}

/* What -V prints: "coupon-fcgi VERSION upgrade-protocol N segment-layout M".
 * The old supervisor of an upgrade runs the new binary with -V before it
 * hands it anything, and goes no further unless both numbers are its own: a
 * build that does not know the hand-over (one before it, which would bind
 * the socket and make a segment of its own beside the running ones) or
 * that lays the segment out otherwise is refused before it starts. */
void upgrade_print_version(FILE *f);

/* Parses a -V line: 0 with *proto and *layout, or -1. */
static inline int upgrade_parse_version(const char *line, int *proto, unsigned *layout)
{
    char version[64];
    return line != NULL
                   && sscanf(line, "coupon-fcgi %63s upgrade-protocol %d segment-layout %u",
                             version, proto, layout) == 3
               ? 0
               : -1;
}

/* Remembers this process's command line and the path of its executable as
 * it is now (the new build is the file at that path when the upgrade
 * comes, not the inode this process runs). Called once from main(). */
void upgrade_init(int argc, char **argv);

/* 1 when the file at the remembered path is no longer the one this
 * process runs (a package or "make install" put a new build there), else 0.
 * A reload (SIGHUP) then upgrades in place instead of rolling the workers
 * on the old build (super.c). */
int upgrade_binary_replaced(void);

/* The old supervisor's half: forks and execs the binary now at the
 * remembered path with the same command line, passing listen_fd (cleared
 * of close-on-exec in the child only) and UPGRADE_ENV. The child keeps the
 * supervisor's blocked signals (so a hand-over signal that comes early is
 * never fatal) and is not tied to the parent's death. Returns the child's
 * pid, or -1 after logging why. The child first asks the binary for its
 * -V line and exits 125 (saying why on stderr) unless it speaks this
 * build's protocol and segment layout. */
pid_t upgrade_exec(int listen_fd, int own_socket);

/* The new binary's half: 0 with *u filled when this process is the new
 * binary of an upgrade (the variable is removed from the environment, so
 * that its workers and a later upgrade do not see it), 1 when it is not,
 * -1 after printing why when the variable is there and unusable (another
 * protocol, not from the parent, not a listening socket). */
int upgrade_inherited(struct upgrade_from *u);

#endif
