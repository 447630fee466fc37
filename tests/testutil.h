/* testutil.h — helpers shared by the cmocka suites: data paths, temp dirs,
 * whole-file reads, and a seeded RNG (so every test input is reproducible). */
#ifndef MR_TESTUTIL_H
#define MR_TESTUTIL_H
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* Joins MR_TEST_DATA and rel into a static buffer (valid until next call). */
const char *tu_data(const char *rel);
/* Reads a whole file; returns a malloc'd buffer (caller frees) or NULL. */
void *tu_read_file(const char *path, size_t *len);
/* Writes bytes to path; returns 0 on success. */
int tu_write_file(const char *path, const void *data, size_t len);
/* Creates a fresh empty temp directory under the build tree; returns a
 * malloc'd path (caller frees). tu_rmtree removes it recursively. */
char *tu_tmpdir(const char *tag);
void tu_rmtree(const char *path);

/* xoshiro-style 64-bit RNG. */
typedef struct { uint64_t s; } tu_rng;
uint64_t tu_next(tu_rng *r);
float tu_uniform(tu_rng *r);               /* [0,1) */
float tu_normal(tu_rng *r);                /* N(0,1) */

/* Kernel-path selection of the ISA suites (tests/CMakeLists.txt): when
 * MOERUN_TEST_ISA names a level (generic, avx2, avx512), features above that
 * level are hidden so that exactly its kernels run. A level this host lacks
 * (detected by cpuid, minus whatever MOERUN_CPU_MASK hides: the mask
 * simulates a smaller host) is not run: the suite prints what it skipped and
 * exits with TU_SKIP (ctest SKIP_RETURN_CODE). Call first in main(). */
#define TU_SKIP 77
void tu_isa_begin(const char *suite);
#endif
