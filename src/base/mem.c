/* mem.c — the library's allocator wrappers, with a fault-injection hook,
 * and the one reader of this process's resident memory (/proc/self).
 * Every allocation in libmoerun goes through here, so a test can make the
 * n-th allocation fail and check that the caller cleans up and reports
 * MR_ENOMEM (SQLite faultsim style). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moerun/base.h"

static atomic_long fail_after = -1;
static atomic_uint_fast64_t alloc_count = 0;

void mr_debug_alloc_fail_after(long n) { atomic_store(&fail_after, n); }
uint64_t mr_debug_alloc_count(void) { return (uint64_t)atomic_load(&alloc_count); }

static bool should_fail(void) {
    atomic_fetch_add(&alloc_count, 1);
    long v = atomic_load(&fail_after);
    if (v < 0) return false;
    if (v == 0) return true; /* stays failing until reset */
    atomic_fetch_sub(&fail_after, 1);
    return false;
}

void *mr_malloc(size_t n) {
    void *p = should_fail() ? NULL : malloc(n ? n : 1);
    if (!p) mr_error_set(MR_ENOMEM, NULL);
    return p;
}

void *mr_calloc(size_t count, size_t size) {
    size_t total;
    if (!mr_size_mul(count, size, &total)) {
        mr_error_set(MR_ENOMEM, "allocation of %zu x %zu bytes overflows", count, size);
        return NULL;
    }
    void *p = should_fail() ? NULL : calloc(total ? count : 1, total ? size : 1);
    if (!p) mr_error_set(MR_ENOMEM, NULL);
    return p;
}

void *mr_realloc(void *old, size_t n) {
    void *p = should_fail() ? NULL : realloc(old, n ? n : 1);
    if (!p) mr_error_set(MR_ENOMEM, NULL);
    return p;
}

char *mr_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = mr_malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

void mr_free(void *p) { free(p); }

void *mr_aligned_alloc(size_t align, size_t size) {
    void *p = NULL;
    if (align < sizeof(void *) || (align & (align - 1)) != 0) {
        mr_error_set(MR_EINVAL, "alignment %zu is not a power of two >= %zu", align, sizeof(void *));
        return NULL;
    }
    if (should_fail() || posix_memalign(&p, align, size ? size : align) != 0) {
        mr_error_set(MR_ENOMEM, NULL);
        return NULL;
    }
    return p;
}

void mr_aligned_free(void *p) { free(p); }

size_t mr_mem_proc_kb(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0, n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n)) kb = strtoull(line + n, NULL, 10);
    fclose(f);
    return kb * 1024;
}

size_t mr_mem_rss(void) { return mr_mem_proc_kb("/proc/self/status", "VmRSS:"); }
size_t mr_mem_rss_peak(void) { return mr_mem_proc_kb("/proc/self/status", "VmHWM:"); }

void mr_mem_rss_peak_reset(void) {
    FILE *cr = fopen("/proc/self/clear_refs", "w"); /* "5": reset the peak RSS */
    if (cr) fputs("5", cr), fclose(cr);
}
