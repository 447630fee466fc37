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
#endif
