/* test_base.c — status strings, last-error detail, allocation fault
 * injection, overflow helpers, CPU feature masking, log levels. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moerun/base.h"
#include "testutil.h"

static void test_status_strings(void **st) {
    (void)st;
    assert_string_equal(mr_status_str(MR_OK), "success");
    assert_string_equal(mr_status_str(MR_ENOMEM), "out of memory");
    assert_string_equal(mr_status_name(MR_EFORMAT), "MR_EFORMAT");
    assert_string_equal(mr_status_str((mr_status)-999), "unknown status");
    /* every code in the list is negative except OK and has a distinct string */
#define CHECK(name, code, msg) assert_true((code) <= 0);
    MR_STATUS_MAP(CHECK)
#undef CHECK
}

static void test_error_detail(void **st) {
    (void)st;
    mr_error_clear();
    assert_string_equal(mr_error_last(), "");
    assert_int_equal(mr_error_set(MR_EINVAL, "bad value %d", 42), MR_EINVAL);
    assert_string_equal(mr_error_last(), "bad value 42");
    mr_error_set(MR_ENOMEM, NULL);
    assert_string_equal(mr_error_last(), "out of memory");
    /* prefixing context onto the previous detail (the argument aliases the buffer) */
    mr_error_set(MR_EINVAL, "unknown value '%s'", "x");
    mr_error_set(MR_EINVAL, "--flag: %s", mr_error_last());
    assert_string_equal(mr_error_last(), "--flag: unknown value 'x'");
}

static void test_alloc_fault_injection(void **st) {
    (void)st;
    mr_debug_alloc_fail_after(2);
    void *a = mr_malloc(16);
    void *b = mr_malloc(16);
    void *c = mr_malloc(16);
    assert_non_null(a);
    assert_non_null(b);
    assert_null(c);
    assert_string_equal(mr_error_last(), "out of memory");
    mr_debug_alloc_fail_after(-1);
    void *d = mr_aligned_alloc(64, 100);
    assert_non_null(d);
    assert_int_equal((uintptr_t)d % 64, 0);
    assert_null(mr_aligned_alloc(3, 100));
    assert_null(mr_calloc(SIZE_MAX, 2));
    mr_free(a);
    mr_free(b);
    mr_aligned_free(d);
}

static void test_overflow_helpers(void **st) {
    (void)st;
    size_t r;
    assert_true(mr_size_mul(1000, 1000, &r));
    assert_int_equal(r, 1000000);
    assert_false(mr_size_mul(SIZE_MAX / 2 + 1, 2, &r));
    assert_false(mr_size_add(SIZE_MAX, 1, &r));
    uint64_t u;
    assert_false(mr_u64_mul(1ull << 40, 1ull << 30, &u));
}

static void test_cpu_mask(void **st) {
    (void)st;
    const mr_cpu_info *ci = mr_cpu();
    assert_true(ci->n_cores >= 1);
    assert_true(strlen(ci->brand) > 0);
    uint32_t m;
    assert_int_equal(mr_cpu_parse_mask("avx512", &m), MR_OK);
    assert_true(m & MR_CPU_AVX512F);
    assert_false(m & MR_CPU_AVX2);
    assert_int_equal(mr_cpu_parse_mask("avx2", &m), MR_OK);
    assert_true((m & (MR_CPU_AVX2 | MR_CPU_AVX512BF16)) == (MR_CPU_AVX2 | MR_CPU_AVX512BF16));
    assert_int_equal(mr_cpu_parse_mask("f16c, avx512bf16", &m), MR_OK);
    assert_int_equal(m, MR_CPU_F16C | MR_CPU_AVX512BF16);
    assert_int_equal(mr_cpu_parse_mask("avx9000", &m), MR_EINVAL);
    assert_non_null(strstr(mr_error_last(), "avx9000"));
    /* hiding works and is reversible */
    uint32_t old = mr_cpu_set_hidden(0xFFFFFFFFu);
    assert_int_equal(mr_cpu()->flags, 0);
    assert_false(mr_cpu_has(MR_CPU_SSE42));
    mr_cpu_set_hidden(old);
    assert_int_equal(mr_cpu()->flags, mr_cpu()->detected & ~old);
    /* AVX-512 features imply the OS saves ZMM state, which implies AVX2 state */
    if (ci->detected & MR_CPU_AVX512F) assert_true(ci->detected & MR_CPU_F16C);
}

/* MOERUN_LOG picks the level on first use; messages below it are dropped,
 * the rest go to stderr as "moerun: <level>: <text>". Each case runs in a
 * child process (the level is read once per process) with stderr captured. */
static void log_case(const char *env, const char *want_present, const char *want_absent) {
    char *dir = tu_tmpdir("log");
    char path[4200];
    snprintf(path, sizeof path, "%s/err.txt", dir);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!freopen(path, "w", stderr)) _exit(3);
        if (env) setenv("MOERUN_LOG", env, 1); else unsetenv("MOERUN_LOG");
        MR_DEBUG("d-%d", 1);
        MR_INFO("i-%d", 2);
        MR_WARN("w-%d", 3);
        MR_ERROR("e-%d", 4);
        fflush(stderr);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    size_t n = 0;
    char *txt = tu_read_file(path, &n);
    assert_non_null(txt);
    char *z = realloc(txt, n + 1);
    assert_non_null(z);
    z[n] = 0;
    for (const char *p = want_present; *p; p += strlen(p) + 1) {
        if (!strstr(z, p)) fprintf(stderr, "MOERUN_LOG=%s: '%s' missing from:\n%s", env ? env : "(unset)", p, z);
        assert_non_null(strstr(z, p));
    }
    for (const char *p = want_absent; *p; p += strlen(p) + 1) assert_null(strstr(z, p));
    free(z);
    tu_rmtree(dir);
    free(dir);
}

static void test_log_levels(void **st) {
    (void)st;
    log_case("debug", "moerun: debug: d-1\0moerun: info: i-2\0moerun: warning: w-3\0moerun: error: e-4\0", "");
    log_case("warn", "moerun: warning: w-3\0moerun: error: e-4\0", "d-1\0i-2\0");
    log_case("error", "moerun: error: e-4\0", "d-1\0i-2\0w-3\0");
    log_case("off", "", "d-1\0i-2\0w-3\0e-4\0");
    log_case(NULL, "w-3\0e-4\0", "d-1\0i-2\0"); /* default: warn */
    log_case("loud", "is not one of\0w-3\0", "i-2\0");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_strings), cmocka_unit_test(test_error_detail),
        cmocka_unit_test(test_alloc_fault_injection), cmocka_unit_test(test_overflow_helpers),
        cmocka_unit_test(test_cpu_mask), cmocka_unit_test(test_log_levels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
