/* log.c - leveled logging to stderr (journald) or syslog (spawn-fcgi). */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

int log_min_level = LOG_LVL_INFO;

static int log_to_syslog;
static char log_ident[32] = "couponseize";

static const char *const level_names[] = {"debug", "info", "notice", "warning", "error"};
static const int syslog_prio[] = {LOG_DEBUG, LOG_INFO, LOG_NOTICE, LOG_WARNING, LOG_ERR};

void log_init(const char *ident, int level, const char *target)
{
    if (ident != NULL)
        snprintf(log_ident, sizeof(log_ident), "%s", ident);
    log_min_level = level;
    if (log_to_syslog)
        closelog();
    log_to_syslog = target != NULL && strcmp(target, "syslog") == 0;
    if (log_to_syslog)
        openlog(log_ident, LOG_PID | LOG_NDELAY, LOG_DAEMON);
}

int log_level_parse(const char *name)
{
    for (int i = 0; i < (int)(sizeof(level_names) / sizeof(level_names[0])); i++)
        if (strcmp(name, level_names[i]) == 0)
            return i;
    return -1;
}

void log_write(int level, const char *file, int line, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    const char *base = strrchr(file, '/');

    base = base ? base + 1 : file;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    if (level < 0 || level > LOG_LVL_ERROR)
        level = LOG_LVL_ERROR;
    if (log_to_syslog) {
        syslog(syslog_prio[level], "%s:%d %s", base, line, msg);
        return;
    }
    /* One write() per line so lines of several workers do not interleave. */
    char buf[1200];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    int n = snprintf(buf, sizeof(buf), "%04d-%02d-%02d %02d:%02d:%02d.%03ld %s[%d] %s %s:%d %s\n",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, log_ident, (int)getpid(),
                     level_names[level], base, line, msg);
    if (n >= (int)sizeof(buf)) {
        /* Truncated: keep the line a line. */
        n = sizeof(buf) - 1;
        buf[n - 1] = '\n';
    }
    if (write(STDERR_FILENO, buf, (size_t)n) < 0) {
        /* Nowhere left to report it. */
    }
}
