/* sdnotify.c - sd_notify() and sd_listen_fds() when built with libsystemd. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "sdnotify.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef HAVE_LIBSYSTEMD
#include <systemd/sd-daemon.h>
#endif

void sdnotify_ready(void)
{
#ifdef HAVE_LIBSYSTEMD
    sd_notify(0, "READY=1");
#endif
}

void sdnotify_stopping(void)
{
#ifdef HAVE_LIBSYSTEMD
    sd_notify(0, "STOPPING=1");
#endif
}

void sdnotify_reloading(void)
{
#ifdef HAVE_LIBSYSTEMD
    sd_notify(0, "RELOADING=1");
#endif
}

void sdnotify_mainpid(int pid)
{
#ifdef HAVE_LIBSYSTEMD
    sd_notifyf(0, "MAINPID=%d\nREADY=1", pid);
#else
    (void)pid;
#endif
}

void sdnotify_status(const char *fmt, ...)
{
#ifdef HAVE_LIBSYSTEMD
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    sd_notifyf(0, "STATUS=%s", buf);
#else
    (void)fmt;
#endif
}

int sdnotify_listen_fds(void)
{
#ifdef HAVE_LIBSYSTEMD
    int n = sd_listen_fds(1);
    return n > 0 ? n : 0;
#else
    /* Same contract without the library: LISTEN_PID must be ours. */
    const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
    if (pid == NULL || fds == NULL || atol(pid) != (long)getpid())
        return 0;
    int n = atoi(fds);
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    return n > 0 ? n : 0;
#endif
}
