/* upgrade.c - the in-place binary upgrade: the exec of the new binary, and
 * what the new binary reads of it (doc/operations.md, "Upgrading in place"). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "upgrade.h"
#include "cs.h"
#include "log.h"
#include "shm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "unknown"
#endif

static char **upgrade_argv;
static char upgrade_path[PATH_MAX];

void upgrade_init(int argc, char **argv)
{
    upgrade_argv = xcalloc((size_t)argc + 1, sizeof(*upgrade_argv));
    for (int i = 0; i < argc; i++)
        upgrade_argv[i] = xstrdup(argv[i]);
    /* The path, not the inode: a package or "make" puts the new build at
     * the same path, and /proc/self/exe then says "PATH (deleted)". */
    ssize_t n = readlink("/proc/self/exe", upgrade_path, sizeof(upgrade_path) - 1);
    if (n > 0 && (size_t)n < sizeof(upgrade_path) - 1) {
        upgrade_path[n] = '\0';
        static const char deleted[] = " (deleted)";
        size_t d = sizeof(deleted) - 1;
        if ((size_t)n > d && strcmp(upgrade_path + n - d, deleted) == 0)
            upgrade_path[n - d] = '\0';
    } else if (argc > 0) {
        snprintf(upgrade_path, sizeof(upgrade_path), "%s", argv[0]);
    }
}

int upgrade_binary_replaced(void)
{
    struct stat on_disk, running;

    if (upgrade_path[0] == '\0' || stat(upgrade_path, &on_disk) != 0
        || stat("/proc/self/exe", &running) != 0)
        return 0;
    return on_disk.st_dev != running.st_dev || on_disk.st_ino != running.st_ino;
}

void upgrade_print_version(FILE *f)
{
    fprintf(f, "coupon-fcgi %s upgrade-protocol %d segment-layout %u\n", PACKAGE_VERSION,
            UPGRADE_PROTO, (unsigned)shm_layout_version());
}

/* In the upgrade's child: runs "path -V" and checks its answer against this
 * build. 0 when they match; -1 after saying why on stderr. */
static int upgrade_probe(const char *path)
{
    char out[256];
    size_t got = 0;
    int p[2], status = 0, proto;
    unsigned layout;

    if (pipe2(p, O_CLOEXEC) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(p[1], STDOUT_FILENO);
        execl(path, path, "-V", (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    for (;;) {
        ssize_t n = read(p[0], out + got, sizeof(out) - 1 - got);
        if (n > 0 && (got += (size_t)n) < sizeof(out) - 1)
            continue;
        if (n < 0 && errno == EINTR)
            continue;
        break;
    }
    out[got] = '\0';
    close(p[0]);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    out[strcspn(out, "\n")] = '\0';
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0
        || upgrade_parse_version(out, &proto, &layout) != 0) {
        fprintf(stderr, "coupon-fcgi: upgrade: %s -V does not name a hand-over protocol (a "
                        "build before in-place upgrades?): stop and start the service "
                        "instead\n", path);
        return -1;
    }
    if (proto != UPGRADE_PROTO || layout != shm_layout_version()) {
        fprintf(stderr, "coupon-fcgi: upgrade: %s speaks hand-over protocol %d with segment "
                        "layout %u, this build %d with %u: it cannot run beside this one; stop "
                        "and start the service instead\n", path, proto, layout, UPGRADE_PROTO,
                (unsigned)shm_layout_version());
        return -1;
    }
    return 0;
}

pid_t upgrade_exec(int listen_fd, int own_socket)
{
    char val[64];

    if (upgrade_argv == NULL || upgrade_path[0] == '\0') {
        log_error("upgrade: the command line of this process is unknown");
        return -1;
    }
    if (access(upgrade_path, X_OK) != 0) {
        log_error("upgrade: %s: %s; keeping the running binary", upgrade_path, strerror(errno));
        return -1;
    }
    snprintf(val, sizeof(val), "%d:%d:%d:%d", UPGRADE_PROTO, (int)getpid(), listen_fd,
             own_socket ? 1 : 0);
    pid_t pid = fork();
    if (pid < 0) {
        log_error("upgrade: fork() failed: %s", strerror(errno));
        return -1;
    }
    if (pid > 0)
        return pid;
    /* The child: first the new binary says what it speaks. */
    if (upgrade_probe(upgrade_path) != 0)
        _exit(125);
    /* The socket survives the exec, nothing else of ours does (every other
     * descriptor of the supervisor is close-on-exec). The blocked signals
     * stay blocked across the exec on purpose. */
    int flags = fcntl(listen_fd, F_GETFD);
    if (flags < 0 || fcntl(listen_fd, F_SETFD, flags & ~FD_CLOEXEC) != 0)
        _exit(126);
    /* Socket activation's variables name the old pid: not for the child. */
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
    if (setenv(UPGRADE_ENV, val, 1) != 0)
        _exit(126);
    signal(SIGCHLD, SIG_DFL);
    execv(upgrade_path, upgrade_argv);
    fprintf(stderr, "coupon-fcgi: upgrade: execv(%s) failed: %s\n", upgrade_path,
            strerror(errno));
    _exit(127);
}

int upgrade_inherited(struct upgrade_from *u)
{
    const char *text = getenv(UPGRADE_ENV);
    int val = 0;
    socklen_t len = sizeof(val);

    if (text == NULL)
        return 1;
    if (upgrade_parse(text, u) != 0) {
        fprintf(stderr, "coupon-fcgi: upgrade: %s=%s is malformed\n", UPGRADE_ENV, text);
        return -1;
    }
    unsetenv(UPGRADE_ENV);
    if (u->proto != UPGRADE_PROTO) {
        fprintf(stderr, "coupon-fcgi: upgrade: the running supervisor speaks hand-over protocol "
                        "%d, this build %d: stop and start the service instead\n",
                u->proto, UPGRADE_PROTO);
        return -1;
    }
    if (getppid() != u->old_pid) {
        fprintf(stderr, "coupon-fcgi: upgrade: supervisor %d is gone (or not the parent)\n",
                (int)u->old_pid);
        return -1;
    }
    if (getsockopt(u->fd, SOL_SOCKET, SO_ACCEPTCONN, &val, &len) != 0 || !val) {
        fprintf(stderr, "coupon-fcgi: upgrade: fd %d is not a listening socket\n", u->fd);
        return -1;
    }
    /* Our own again: workers inherit it through fork, never an exec. */
    fcntl(u->fd, F_SETFD, FD_CLOEXEC);
    return 0;
}
