/* time.c — monotonic clock. */
#include <time.h>

#include "moerun/base.h"

uint64_t mr_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
