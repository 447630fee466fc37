/* dense_hot.c — the dense projection on tiles (mr_kernels.rows_tiles, FP8: the AMX kernel of
 * src/kernels/dense_avx512amx.c) timed on one L2-resident matrix, one thread, at several token
 * counts: ns per 2 KiB block (16 rows x 128 k) and per block and token (kernel work; not part
 * of CMake).
 *
 *   make -C dev/perf dense_hot LIBDIR=../../build && dev/perf/dense_hot [--rows N] [--M 1,5,16,40]
 *
 * Before timing, each M's outputs are checked against mr_matmul of the same matrix one token at a
 * time (the library's own dense path, bit for bit: a token's bits do not depend on the batch),
 * so a broken variant cannot be timed. Prints nothing but a note where the table has no tiles. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moerun/base.h"
#include "moerun/formats.h"
#include "moerun/kernels.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
static uint64_t rs = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}

enum { K = 3072 };

int main(int argc, char **argv) {
    int64_t N = 256;
    const char *ms = "1,5,10,16,20,32,40";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rows")) N = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--M")) ms = argv[i + 1];
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (N < 16 || N % 16) {
        fprintf(stderr, "--rows must be a positive multiple of 16\n");
        return 2;
    }
    const mr_kernels *k = mr_kernels_get();
    if (!k->rows_tiles[MR_FMT_FP8_BLOCK].fn) {
        printf("dense_hot: this CPU's kernel table has no dense kernel on tiles (AMX)\n");
        return 0;
    }
    mr_qmatrix q;
    memset(&q, 0, sizeof q);
    q.fmt = MR_FMT_FP8_BLOCK, q.rows = N, q.cols = K, q.scale2 = 1.0f;
    uint8_t *d = aligned_alloc(64, (size_t)(N * K));
    const size_t ns = (size_t)((N + 127) / 128 * (K / 128));
    float *sc = malloc(sizeof(float) * ns);
    if (!d || !sc) return 1;
    for (int64_t i = 0; i < N * K; i++) {
        const uint8_t b = (uint8_t)(rnd() >> 56);
        d[i] = (b & 0x7F) == 0x7F ? (uint8_t)(b - 1) : b; /* no NaN codes */
    }
    for (size_t i = 0; i < ns; i++) sc[i] = 1e-3f * (float)(1 + rnd() % 100);
    q.data = d, q.scale = sc;
    static mr_pmatrix P;
    if (mr_qmatrix_tiles(&q, &P) != MR_OK) return 1;
    printf("%s, %lld x %d fp8 (%.0f KiB), one thread\n", k->rows_tiles[MR_FMT_FP8_BLOCK].name, (long long)N, K,
           (double)(N * K) / 1024);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", ms);
    for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
        const int64_t M = atol(t);
        if (M < 1 || M > 4096) continue;
        float *x = malloc(sizeof(float) * (size_t)(M * K)), *y = aligned_alloc(64, sizeof(float) * (size_t)(M * N));
        float *y1 = malloc(sizeof(float) * (size_t)N);
        void *xp = aligned_alloc(64, MR_XPACK_BYTES(M, K) + 64), *scr = aligned_alloc(64, MR_UK_SCRATCH);
        if (!x || !y || !y1 || !xp || !scr) return 1;
        for (int64_t i = 0; i < M * K; i++) x[i] = (float)((double)(int64_t)(rnd() >> 40) / 8388608.0 - 1.0);
        k->rows_xpack(x, M, K, 0, (M + 4) / 5, xp);
        k->rows_tiles[MR_FMT_FP8_BLOCK].fn(&P, 0, N, xp, M, y, N, scr);
        q.tiles = &P;
        for (int64_t m = 0; m < M; m++) {
            mr_matmul(&q, x + m * K, 1, y1);
            if (memcmp(y1, y + m * N, sizeof(float) * (size_t)N)) {
                fprintf(stderr, "M %lld: token %lld differs from the same token alone\n", (long long)M, (long long)m);
                return 1;
            }
        }
        const int reps = 200;
        double best = 1e9;
        for (int r = 0; r < 5; r++) {
            const double t0 = now_s();
            for (int i = 0; i < reps; i++) k->rows_tiles[MR_FMT_FP8_BLOCK].fn(&P, 0, N, xp, M, y, N, scr);
            const double dt = (now_s() - t0) / reps;
            best = dt < best ? dt : best;
        }
        const double blocks = (double)(N / 16) * (K / 128), nsb = best / blocks * 1e9;
        printf("M %4lld: %7.1f ns a block  %6.1f ns a block and token  %6.2f GB/s of weights\n", (long long)M, nsb,
               nsb / (double)M, (double)(N * K) / best / 1e9);
        free(x), free(y), free(y1), free(xp), free(scr);
    }
    free(d), free(sc);
    return 0;
}
