/* log.h - leveled logging to stderr or syslog, with file:line. */
#ifndef CS_LOG_H
#define CS_LOG_H

enum log_level { LOG_LVL_DEBUG, LOG_LVL_INFO, LOG_LVL_NOTICE, LOG_LVL_WARNING, LOG_LVL_ERROR };

extern int log_min_level;

/* Sets the identity, the minimum level and the target ("stderr" or "syslog").
 * Safe to call again (after a config reload). */
void log_init(const char *ident, int level, const char *target);

/* Parses "debug".."error"; returns the level or -1. */
int log_level_parse(const char *name);

void log_write(int level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The level is checked before any argument is formatted. */
#define cs_log(level, ...)                                                    \
    do {                                                                      \
        if ((level) >= log_min_level)                                         \
            log_write((level), __FILE__, __LINE__, __VA_ARGS__);              \
    } while (0)

#define log_debug(...) cs_log(LOG_LVL_DEBUG, __VA_ARGS__)
#define log_info(...) cs_log(LOG_LVL_INFO, __VA_ARGS__)
#define log_notice(...) cs_log(LOG_LVL_NOTICE, __VA_ARGS__)
#define log_warn(...) cs_log(LOG_LVL_WARNING, __VA_ARGS__)
#define log_error(...) cs_log(LOG_LVL_ERROR, __VA_ARGS__)

#endif
