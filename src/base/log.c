/* log.c — leveled logging to stderr. The level comes from MOERUN_LOG
 * (debug|info|warn|error|off) on first use, default warn, and can be set by
 * the CLI. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moerun/base.h"

static int log_level = -1;

static mr_log_level level_from_env(void) {
    const char *e = getenv("MOERUN_LOG");
    if (e == NULL || *e == 0) return MR_LOG_WARN;
    if (!strcmp(e, "debug")) return MR_LOG_DEBUG;
    if (!strcmp(e, "info")) return MR_LOG_INFO;
    if (!strcmp(e, "warn") || !strcmp(e, "warning")) return MR_LOG_WARN;
    if (!strcmp(e, "error")) return MR_LOG_ERROR;
    if (!strcmp(e, "off") || !strcmp(e, "none")) return MR_LOG_OFF;
    fprintf(stderr, "moerun: warning: MOERUN_LOG=%s is not one of debug|info|warn|error|off; using warn\n", e);
    return MR_LOG_WARN;
}

mr_log_level mr_log_get_level(void) {
    if (log_level < 0) log_level = (int)level_from_env();
    return (mr_log_level)log_level;
}

void mr_log_set_level(mr_log_level lvl) { log_level = (int)lvl; }

void mr_log(mr_log_level lvl, const char *fmt, ...) {
    static const char *names[] = {"debug", "info", "warning", "error"};
    if (lvl < mr_log_get_level() || lvl >= MR_LOG_OFF) return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "moerun: %s: %s\n", names[lvl], buf);
}

void mr__assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "moerun: internal error: assertion `%s' failed at %s:%d\n", expr, file, line);
    abort();
}
