/* status.c — mr_status strings and the thread-local last-error detail.
 * The out-of-memory path never allocates: it points at a static message. */
#include <stdio.h>
#include <string.h>

#include "moerun/base.h"

const char *mr_status_str(mr_status s) {
    switch (s) {
#define MR__STATUS_STR(name, code, msg) \
    case MR_##name:                      \
        return msg;
        MR_STATUS_MAP(MR__STATUS_STR)
#undef MR__STATUS_STR
    }
    return "unknown status";
}

const char *mr_status_name(mr_status s) {
    switch (s) {
#define MR__STATUS_NAME(name, code, msg) \
    case MR_##name:                       \
        return "MR_" #name;
        MR_STATUS_MAP(MR__STATUS_NAME)
#undef MR__STATUS_NAME
    }
    return "MR_UNKNOWN";
}

static const char oom_msg[] = "out of memory";
static _Thread_local char err_buf[1024];
static _Thread_local const char *err_ptr = "";

const char *mr_error_last(void) { return err_ptr; }

void mr_error_clear(void) {
    err_buf[0] = 0;
    err_ptr = "";
}

mr_status mr_error_set(mr_status s, const char *fmt, ...) {
    if (fmt == NULL) {
        if (s == MR_ENOMEM) {
            err_ptr = oom_msg;
        } else {
            snprintf(err_buf, sizeof err_buf, "%s", mr_status_str(s));
            err_ptr = err_buf;
        }
        return s;
    }
    /* Format into a scratch buffer first: callers may pass mr_error_last()
     * itself as an argument to prefix context onto the previous detail. */
    char tmp[sizeof err_buf];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    memcpy(err_buf, tmp, sizeof err_buf);
    err_ptr = err_buf;
    return s;
}
