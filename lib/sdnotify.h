/* sdnotify.h - systemd readiness notification; no-ops without libsystemd. */
#ifndef CS_SDNOTIFY_H
#define CS_SDNOTIFY_H

void sdnotify_ready(void);
void sdnotify_stopping(void);
void sdnotify_reloading(void);
/* Makes pid the service's main process and says it is ready (the old
 * supervisor of an in-place upgrade, the main process until then, names
 * the new one: NotifyAccess=main takes it from no other). */
void sdnotify_mainpid(int pid);
void sdnotify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Number of sockets passed by systemd socket activation (LISTEN_FDS, for this
 * pid), starting at fd 3; 0 when none or without libsystemd. */
int sdnotify_listen_fds(void);

#endif
