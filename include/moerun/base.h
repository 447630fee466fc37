/* moerun/base.h — status codes, last-error detail, logging, memory, CPU features, timers.
 *
 * Every fallible library call returns an mr_status (0 or a negative code) and
 * leaves a human-readable detail in a thread-local buffer read by
 * mr_error_last(). Library code never exits or aborts on bad input; MR_ASSERT
 * is reserved for programmer bugs. */
#ifndef MOERUN_BASE_H
#define MOERUN_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes: one X-macro list gives the enum and mr_status_str() ---- */
#define MR_STATUS_MAP(X)                                             \
    X(OK, 0, "success")                                              \
    X(EINVAL, -1, "invalid argument")                                \
    X(ENOMEM, -2, "out of memory")                                   \
    X(EIO, -3, "I/O error")                                          \
    X(EFORMAT, -4, "malformed file")                                 \
    X(EOVERFLOW, -5, "size overflow")                                \
    X(ENOTFOUND, -6, "not found")                                    \
    X(EUNSUPPORTED, -7, "not supported")                             \
    X(ECONFIG, -8, "bad model configuration")                        \
    X(ERESOLVE, -9, "resolution refused the configuration")          \
    X(ERANGE, -10, "value out of range")                             \
    X(ECAPACITY, -11, "capacity exceeded")                           \
    X(ESTATE, -12, "invalid state")                                  \
    X(EINPUT, -13, "invalid input data")                             \
    X(EBUSY, -14, "busy: try again later")                           \
    X(EPEER, -15, "an expert-parallel peer failed")

typedef enum {
#define MR__STATUS_ENUM(name, code, msg) MR_##name = (code),
    MR_STATUS_MAP(MR__STATUS_ENUM)
#undef MR__STATUS_ENUM
} mr_status;

/* Short fixed description of a status ("out of memory"); never NULL. */
const char *mr_status_str(mr_status s);
/* Symbolic name of a status ("MR_ENOMEM"); never NULL. */
const char *mr_status_name(mr_status s);

/* Detail of the last error set on this thread, or "" if none. The pointer is
 * valid until the next error is set on this thread. Never allocates. */
const char *mr_error_last(void);
/* Sets the detail message (printf-style) and returns s, so that callers can
 * write `return mr_error_set(MR_EINVAL, "...", ...)`. An MR_ENOMEM with a
 * NULL fmt uses a static message. */
mr_status mr_error_set(mr_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void mr_error_clear(void);

/* ---- logging to stderr; level from MOERUN_LOG=debug|info|warn|error ---- */
typedef enum { MR_LOG_DEBUG = 0, MR_LOG_INFO = 1, MR_LOG_WARN = 2, MR_LOG_ERROR = 3, MR_LOG_OFF = 4 } mr_log_level;
void mr_log(mr_log_level lvl, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
mr_log_level mr_log_get_level(void);
void mr_log_set_level(mr_log_level lvl);
#define MR_DEBUG(...) mr_log(MR_LOG_DEBUG, __VA_ARGS__)
#define MR_INFO(...) mr_log(MR_LOG_INFO, __VA_ARGS__)
#define MR_WARN(...) mr_log(MR_LOG_WARN, __VA_ARGS__)
#define MR_ERROR(...) mr_log(MR_LOG_ERROR, __VA_ARGS__)

/* ---- invariants (programmer bugs only): file:line then abort ---- */
void mr__assert_fail(const char *expr, const char *file, int line);
#define MR_ASSERT(x) ((x) ? (void)0 : mr__assert_fail(#x, __FILE__, __LINE__))

/* ---- memory: all library allocations go through these ----
 * On failure they return NULL and set MR_ENOMEM detail. mr_free/mr_aligned_free
 * accept NULL. A test hook makes the n-th next allocation fail (fault
 * injection, as SQLite's faultsim): mr_debug_alloc_fail_after(n), n < 0 off. */
void *mr_malloc(size_t n);
void *mr_calloc(size_t count, size_t size);
void *mr_realloc(void *p, size_t n);
char *mr_strdup(const char *s);
void mr_free(void *p);
void *mr_aligned_alloc(size_t align, size_t size); /* align: power of two >= sizeof(void*) */
void mr_aligned_free(void *p);
void mr_debug_alloc_fail_after(long n);
/* Number of allocations made so far (for "no allocation in the hot path" tests). */
uint64_t mr_debug_alloc_count(void);

/* ---- resident memory of this process (/proc/self; 0 where unknown) ---- */
size_t mr_mem_rss(void);            /* VmRSS: resident now */
size_t mr_mem_rss_peak(void);       /* VmHWM: the peak since start (or the last reset) */
void mr_mem_rss_peak_reset(void);   /* restarts the peak from the current RSS (best effort) */
/* A "<key> <n> kB" field of a /proc file, in bytes (0 if absent). */
size_t mr_mem_proc_kb(const char *path, const char *key);

/* ---- overflow-checked size arithmetic: return false on overflow ---- */
static inline bool mr_size_mul(size_t a, size_t b, size_t *out) { return !__builtin_mul_overflow(a, b, out); }
static inline bool mr_size_add(size_t a, size_t b, size_t *out) { return !__builtin_add_overflow(a, b, out); }
static inline bool mr_u64_mul(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_mul_overflow(a, b, out); }
static inline bool mr_u64_add(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_add_overflow(a, b, out); }

/* ---- CPU features, detected once (cpuid + xgetbv), then masked ----
 * MOERUN_CPU_MASK hides features: a comma list of names from
 * mr_cpu_feature_name() or the groups "avx512" (all AVX-512 and AMX),
 * "avx2" (AVX2, FMA, F16C and everything above, AVX-VNNI too), "amx", "all".
 * AVX-VNNI (the VEX-encoded vpdpbusd of Intel client cores since Alder Lake
 * and of Zen 5) is not part of "avx512": such cores have no AVX-512.
 * E.g. MOERUN_CPU_MASK=avx512 forces the AVX2 paths on an AVX-512 host. */
#define MR_CPU_FEATURE_MAP(X)          \
    X(SSE42, 0, "sse4.2")              \
    X(AVX2, 1, "avx2")                 \
    X(FMA, 2, "fma")                   \
    X(F16C, 3, "f16c")                 \
    X(AVX512F, 4, "avx512f")           \
    X(AVX512BW, 5, "avx512bw")         \
    X(AVX512VL, 6, "avx512vl")         \
    X(AVX512VNNI, 7, "avx512vnni")     \
    X(AVX512BF16, 8, "avx512bf16")     \
    X(AVX512FP16, 9, "avx512fp16")     \
    X(AVX512VBMI, 10, "avx512vbmi")    \
    X(AMX_TILE, 11, "amx-tile")        \
    X(AMX_BF16, 12, "amx-bf16")        \
    X(AMX_INT8, 13, "amx-int8")        \
    X(AVX512DQ, 14, "avx512dq")        \
    X(AVXVNNI, 15, "avx-vnni")

typedef enum {
#define MR__CPU_ENUM(name, bit, str) MR_CPU_##name = 1u << (bit),
    MR_CPU_FEATURE_MAP(MR__CPU_ENUM)
#undef MR__CPU_ENUM
} mr_cpu_feature;
#define MR_CPU_FEATURE_COUNT 16

typedef struct {
    uint32_t detected; /* what the CPU and OS support */
    uint32_t host;     /* detected minus what MOERUN_CPU_MASK hides: the host this process
                          may run on (a mask simulates a smaller machine); fixed at startup */
    uint32_t hidden;   /* what MOERUN_CPU_MASK / mr_cpu_set_hidden hides */
    uint32_t flags;    /* detected & ~hidden: what kernels may use */
    int n_cores;       /* online CPUs this process may run on */
    char brand[64];    /* cpuid brand string, trimmed */
} mr_cpu_info;

/* Detected-and-masked CPU description. Thread-safe after the first call. */
const mr_cpu_info *mr_cpu(void);
/* Replace the hidden set (tests). Returns the previous one. Not thread-safe
 * with respect to running kernels; call before dispatch tables are built. */
uint32_t mr_cpu_set_hidden(uint32_t hidden);
/* Parse a mask string ("avx512,f16c") into a feature set. */
mr_status mr_cpu_parse_mask(const char *s, uint32_t *out);
const char *mr_cpu_feature_name(uint32_t single_bit);
static inline bool mr_cpu_has(uint32_t feats) { return (mr_cpu()->flags & feats) == feats; }

/* ---- time ---- */
uint64_t mr_now_ns(void);

/* ---- version ---- */
const char *mr_version(void);
const char *mr_build_info(void); /* build type, compiler, sanitizers, OpenMP */

#ifdef __cplusplus
}
#endif
#endif
