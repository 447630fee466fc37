/* scale_cost.c — what the per-block epilogue of the nvfp4 int8 kernel costs
 * next to its 4 vpdpbusd (the w4a4 prefill limit). Not part of CMake.
 *
 *   make -C dev/perf scale_cost && dev/perf/scale_cost
 *
 * 8 tokens x (int32 sum started from a broadcast, 4 vpdpbusd with broadcast
 * int8 activations, then an epilogue), one thread, registers only. The
 * epilogues:
 *   w4a4  vcvtdq2ps, vmulps (row scales x the token's per-16 scale), vfmadd: the kernel with xs per 16
 *   w4a4 mantissa table: per block the 8 products row scales x (1 + i/8), per token
 *         the product picked by the scale's mantissa and its exponent added as an
 *         integer (exact; an idea to replace the vmulps, slower here)
 *   w4a8  vcvtdq2ps, vfmadd (row scales; xs applied once per 8 blocks): the kernel with xs_group 8
 *   cvt+add   vcvtdq2ps, vaddps (no multiply: not a kernel, a probe)
 *   int add   vpaddd only (no conversion: the vpdpbusd ceiling of this loop)
 * Prints G vpdpbusd/s and the share of the vpdpbusd peak (12 independent
 * chains, no loads) measured in the same run. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
enum { N = 8 };
static int8_t xbuf[16384] __attribute__((aligned(64)));
static int32_t xbb[1024];
static float xsv[1024];

enum { W4A4, W4A4_TAB, W4A8, CVT_ADD, INT_ADD, NVAR };
static const char *names[NVAR] = {"w4a4: cvt + mul + fma", "w4a4 mantissa table + exp add", "w4a8: cvt + fma",
                                  "probe: cvt + add", "probe: int add"};

static inline __attribute__((always_inline)) float body(const int var, long iters) {
    __m512i A = _mm512_set1_epi8(3), B = _mm512_set1_epi8(5), C = _mm512_set1_epi8(7), D = _mm512_set1_epi8(9);
    __m512 sc = _mm512_set1_ps(1.0001f);
    __m512 out[N];
    __m512 tab[8]; /* W4A4_TAB: sc x (1 + i/8), rebuilt per block as the kernel would */
    const __mmask16 nz = 0xFFFF;
    for (int m = 0; m < N; m++) out[m] = _mm512_setzero_ps();
    for (long i = 0; i < iters; i++) {
        __asm__("" : "+v"(A), "+v"(B), "+v"(C), "+v"(D), "+v"(sc));
        if (var == W4A4_TAB)
            for (int t = 0; t < 8; t++) tab[t] = _mm512_mul_ps(sc, _mm512_set1_ps(1.0f + (float)t / 8));
        const int8_t *x = xbuf + (i & 63) * 16;
        #pragma GCC unroll 16
        for (int m = 0; m < N; m++) {
            const int8_t *x4 = x + m * 1024;
            int32_t a0, a1, a2, a3;
            __builtin_memcpy(&a0, x4, 4);
            __builtin_memcpy(&a1, x4 + 4, 4);
            __builtin_memcpy(&a2, x4 + 8, 4);
            __builtin_memcpy(&a3, x4 + 12, 4);
            __m512i acc = _mm512_set1_epi32(xbb[m * 64 + (i & 63)]);
            acc = _mm512_dpbusd_epi32(acc, A, _mm512_set1_epi32(a0));
            acc = _mm512_dpbusd_epi32(acc, B, _mm512_set1_epi32(a1));
            acc = _mm512_dpbusd_epi32(acc, C, _mm512_set1_epi32(a2));
            acc = _mm512_dpbusd_epi32(acc, D, _mm512_set1_epi32(a3));
            if (var == W4A4)
                out[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(sc, _mm512_set1_ps(xsv[m * 64 + (i & 63)])),
                                         out[m]);
            else if (var == W4A4_TAB) {
                uint32_t b;
                __builtin_memcpy(&b, &xsv[m * 64 + (i & 63)], 4);
                const int32_t dl = b ? (int32_t)(b & 0x7F800000u) - 0x3F800000 : 0;
                const __m512 s = _mm512_castsi512_ps(_mm512_mask_add_epi32(_mm512_castps_si512(tab[(b >> 20) & 7]), nz,
                                                                           _mm512_castps_si512(tab[(b >> 20) & 7]),
                                                                           _mm512_set1_epi32(dl)));
                out[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), s, out[m]);
            } else if (var == W4A8) out[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), sc, out[m]);
            else if (var == CVT_ADD) out[m] = _mm512_add_ps(_mm512_cvtepi32_ps(acc), out[m]);
            else out[m] = _mm512_castsi512_ps(_mm512_add_epi32(acc, _mm512_castps_si512(out[m])));
        }
    }
    float o[16], s = 0;
    for (int m = 0; m < N; m++) {
        _mm512_storeu_ps(o, out[m]);
        s += o[0];
    }
    return s;
}
__attribute__((noinline)) static float peak(long iters) {
    __m512i a[12], w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
    for (int c = 0; c < 12; c++) a[c] = _mm512_set1_epi32(c);
    for (long i = 0; i < iters; i++) {
        __asm__("" : "+v"(w), "+v"(x));
        #pragma GCC unroll 12
        for (int c = 0; c < 12; c++) a[c] = _mm512_dpbusd_epi32(a[c], w, x);
    }
    int32_t o[16], s = 0;
    for (int c = 0; c < 12; c++) {
        _mm512_storeu_si512(o, a[c]);
        s += o[0];
    }
    return (float)s;
}
#define W(n) \
    __attribute__((noinline)) static float run##n(long it) { return body(n, it); }
W(0) W(1) W(2) W(3) W(4)
static float (*const runs[NVAR])(long) = {run0, run1, run2, run3, run4};
static volatile float sink;

int main(void) {
    for (int i = 0; i < 1024; i++) xsv[i] = 0.5f + (float)(i % 7) / 8, xbb[i] = i;
    for (int i = 0; i < 16384; i++) xbuf[i] = (int8_t)(i * 37);
    const long it = 2500000;
    double rate[NVAR];
    for (int v = 0; v < NVAR; v++) {
        double best = 1e9;
        for (int r = 0; r < 5; r++) {
            double t = now();
            sink += runs[v](it);
            t = now() - t;
            if (t < best) best = t;
        }
        rate[v] = it * (double)N * 4 / best;
    }
    double pk = 1e9;
    for (int r = 0; r < 5; r++) {
        double t = now();
        sink += peak(it * 8 * 4 / 12);
        t = now() - t;
        if (t < pk) pk = t;
    }
    const double prate = (double)(it * 8 * 4 / 12) * 12 / pk;
    printf("8 tokens x 4 vpdpbusd per 16-k block, 1 thread, best of 5; vpdpbusd peak %.2f G/s:\n", prate * 1e-9);
    for (int v = 0; v < NVAR; v++)
        printf("  %-24s %5.2f G vpdpbusd/s  = %5.1f%% of peak\n", names[v], rate[v] * 1e-9, 100 * rate[v] / prate);
    return 0;
}
