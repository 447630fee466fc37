/* nvi_cost.c — what limits the AVX2 NVFP4 int8 gemm (uk_nvfp4_i8 on many
 * tokens, nvi_many in src/kernels/uk_avx2_nvi.h) below the vpmaddubsw peak.
 * Not part of CMake.
 *
 *   make -C dev/perf nvi_cost && MOERUN_CPU_MASK=avx512 dev/perf/nvi_cost [rounds]
 * (the mask on an AVX-512 host: the peak is the library's probe of the AVX2 table)
 *
 * One thread, L1/L2 only: 16 tokens over 192 blocks of 16 rows x 16 k (one
 * 16 x 3072 tile), each block decoded once into 8 registers (vpshufb of the
 * nibbles, as the kernel), then per token the kernel's own 8 vpmaddubsw and 6
 * vpaddw (nvi_pairs, src/kernels/uk_avx2.h), followed by one of these tails:
 *   kernel w4a4   vpmaddwd by ones, + bias, vcvtdq2ps, vmulps (row scales x
 *                 the token's per-16 scale), vfmadd into y (the kernel, xs per 16)
 *   no vmulps     the same without the vmulps (the kernel with xs per 128)
 *   int tail      vpmaddwd by ones, + bias, vpaddd into y (no conversion)
 *   vpmaddwd      vpmaddwd by ones, vpaddd into y
 *   4 vpaddd      instead of the two vpmaddwd, four vpaddd (same op count as
 *                 "vpmaddwd" + 2, none of them on the multiply pipes)
 *   int16         vpaddw into y (no tail: this loop's ceiling)
 * Every variant but the first gives wrong sums: they only isolate costs.
 * Prints G vpmaddubsw/s and the share of the 1-thread vpmaddubsw ymm peak
 * (mr_probe_peak, as hot_uk and bench moe) measured in each round, best of
 * the rounds, the variants interleaved round by round. */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/uk_avx2.h" /* nvi_pairs: the kernel's 8 vpmaddubsw and 6 vpaddw */
#include "moerun/kernels.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

enum { M = 16, NB = 192, REPS = 400, NV = 6 };
static const char *const NAMES[NV] = {"kernel w4a4", "no vmulps", "int tail", "vpmaddwd", "4 vpaddd", "int16"};

static uint8_t tile[NB * 128] __attribute__((aligned(64)));
static float scl[NB][16] __attribute__((aligned(64)));
static int8_t xq[M][NB * 16] __attribute__((aligned(64)));
static int32_t xb[M][NB];
static float xs[M][NB];
static float y[M][16] __attribute__((aligned(64)));

/* 2*e2m1(c) + 12, the kernel's table */
static const uint8_t U8LUT[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

INL void block(int j, __m256i U[8]) {
    const __m256i lut = lut16(U8LUT);
    const __m256i m0f = _mm256_set1_epi8(0x0F);
    #pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        const __m256i V = _mm256_load_si256((const __m256i *)(tile + j * 128 + 32 * v));
        U[v] = _mm256_shuffle_epi8(lut, _mm256_and_si256(V, m0f));
        U[4 + v] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(V, 4), m0f));
    }
}

INL void pass(const int V) {
    const __m256i one = _mm256_set1_epi16(1);
    for (int j = 0; j < NB; j++) {
        __m256i U[8];
        block(j, U);
        const __m256 sc0 = _mm256_load_ps(scl[j]), sc1 = _mm256_load_ps(scl[j] + 8);
        for (int m = 0; m < M; m++) {
            __m256i a, b;
            nvi_pairs(U, xq[m] + 16 * j, &a, &b);
            float *yp = y[m];
            __m256i *yi = (__m256i *)y[m];
            const __m256i bias = _mm256_set1_epi32(xb[m][j]);
            if (V <= 1) {
                const __m256 f0 = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(a, one), bias));
                const __m256 f1 = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(b, one), bias));
                const __m256 xv = _mm256_set1_ps(xs[m][j]);
                const __m256 c0 = V == 0 ? _mm256_mul_ps(sc0, xv) : sc0, c1 = V == 0 ? _mm256_mul_ps(sc1, xv) : sc1;
                _mm256_store_ps(yp, _mm256_fmadd_ps(f0, c0, _mm256_load_ps(yp)));
                _mm256_store_ps(yp + 8, _mm256_fmadd_ps(f1, c1, _mm256_load_ps(yp + 8)));
            } else if (V == 5) {
                _mm256_store_si256(yi, _mm256_add_epi16(_mm256_load_si256(yi), a));
                _mm256_store_si256(yi + 1, _mm256_add_epi16(_mm256_load_si256(yi + 1), b));
            } else {
                __m256i p, q;
                if (V == 4) {
                    p = _mm256_add_epi32(_mm256_add_epi32(a, bias), bias);
                    q = _mm256_add_epi32(_mm256_add_epi32(b, bias), bias);
                } else {
                    p = _mm256_madd_epi16(a, one), q = _mm256_madd_epi16(b, one);
                    if (V == 2) p = _mm256_add_epi32(p, bias), q = _mm256_add_epi32(q, bias);
                }
                _mm256_store_si256(yi, _mm256_add_epi32(_mm256_load_si256(yi), p));
                _mm256_store_si256(yi + 1, _mm256_add_epi32(_mm256_load_si256(yi + 1), q));
            }
        }
    }
}

/* each variant its own function so that each loop is compiled on its own */
__attribute__((noinline)) static void v0(void) { pass(0); }
__attribute__((noinline)) static void v1(void) { pass(1); }
__attribute__((noinline)) static void v2(void) { pass(2); }
__attribute__((noinline)) static void v3(void) { pass(3); }
__attribute__((noinline)) static void v4(void) { pass(4); }
__attribute__((noinline)) static void v5(void) { pass(5); }
static void (*const FN[NV])(void) = {v0, v1, v2, v3, v4, v5};

int main(int argc, char **argv) {
    const int rounds = argc > 1 ? atoi(argv[1]) : 6;
    if (rounds < 1 || rounds > 1000) {
        fprintf(stderr, "usage: nvi_cost [rounds (1-1000)]\n");
        return 2;
    }
    uint32_t r = 12345;
    for (size_t i = 0; i < sizeof tile; i++) tile[i] = (uint8_t)((r = r * 1103515245u + 12345u) >> 24);
    for (int m = 0; m < M; m++)
        for (int k = 0; k < NB * 16; k++) xq[m][k] = (int8_t)((int)((r = r * 1103515245u + 12345u) >> 25) - 64);
    for (int m = 0; m < M; m++)
        for (int j = 0; j < NB; j++) xs[m][j] = 0.5f, xb[m][j] = -12;
    for (int j = 0; j < NB; j++)
        for (int i = 0; i < 16; i++) scl[j][i] = 1.0f / 256;
    double best[NV] = {0}, peak = 0;
    int64_t sink = 0;
    if (mr_kernels_get()->level != MR_ISA_AVX2) {
        fprintf(stderr, "nvi_cost: the kernel table is %s, not avx2 (MOERUN_CPU_MASK=avx512 on an AVX-512 host)\n",
                mr_kernels_get()->isa);
        return 1;
    }
    omp_set_num_threads(1);
    for (int rd = 0; rd < rounds; rd++) {
        const char *iname = NULL;
        const double p = mr_probe_peak(MR_PROBE_MADDUBS, &iname) * 1e9 / 64; /* 64 ops an instruction */
        if (p <= 0) {
            fprintf(stderr, "nvi_cost: no vpmaddubsw probe on this table\n");
            return 1;
        }
        if (p > peak) peak = p;
        for (int v = 0; v < NV; v++) {
            memset(y, 0, sizeof y);
            const double t0 = now();
            for (int k = 0; k < REPS; k++) FN[v]();
            const double g = (double)REPS * NB * M * 8 / (now() - t0);
            if (g > best[v]) best[v] = g;
            sink += (int64_t)y[0][0];
        }
    }
    printf("vpmaddubsw ymm 1-thread peak: %.2f G/s; %d rounds, best of each\n", peak * 1e-9, rounds);
    printf("%-12s %10s %8s\n", "tail", "G/s", "of peak");
    for (int v = 0; v < NV; v++) printf("%-12s %10.2f %7.1f%%\n", NAMES[v], best[v] * 1e-9, 100.0 * best[v] / peak);
    return sink == 42 ? 3 : 0; /* keeps every result live */
}
