/* decode_cost.c — what one 64-byte line of the fp8 gemv kernel (1 token)
 * costs, op group by op group (the T = 1 limit). Not part of CMake.
 *
 *   make -C dev/perf decode_cost && dev/perf/decode_cost
 *
 * Runs the line loop of uk_fp8_bf16 at M = 1 (src/kernels/uk_avx512.c: 2 lines
 * a step, 4 vdpbf16ps chains, prefetch 16 KiB ahead) over 8 L2-resident
 * tiles, one thread, and variants that drop one group of ops. The dropped
 * variants compute wrong values on purpose: they isolate a cost, nothing
 * else. Each variant is its own function, so no run-time branch is left in
 * a loop. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
#define DP(acc, w, xv) _mm512_dpbf16_ps((acc), (__m512bh)(w), (__m512bh)(xv))
static inline __m512 bc(const uint16_t *p) {
    uint32_t v;
    __builtin_memcpy(&v, p, 4);
    return _mm512_castsi512_ps(_mm512_set1_epi32((int)v));
}
static uint8_t *tile;
static uint16_t xb[4096];

enum { FULL, NO_SIGN, NO_UNPACK, DECODE_ONLY, DP_ONLY, NO_PREFETCH, NVAR };
static const char *names[NVAR] = {"kernel line (2 vpermi2b, ternlog, 2 unpack, 2 dp)",
                                  "without the sign ternlog",
                                  "without the 2 unpacks",
                                  "decode only (no vdpbf16ps)",
                                  "load + vdpbf16ps only (no decode)",
                                  "without software prefetch"};

static inline __attribute__((always_inline)) float body(const int var, int lines, int reps) {
    const __m512i l0 = _mm512_set1_epi8(1), l1 = _mm512_set1_epi8(2), h0 = _mm512_set1_epi8(3),
                  h1 = _mm512_set1_epi8(4), m80 = _mm512_set1_epi8((char)0x80);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    __m512i acc = _mm512_setzero_si512();
    for (int r = 0; r < reps; r++) {
        for (int g = 0; g < lines; g += 2) {
            const uint8_t *p = tile + (size_t)g * 64;
            if (var != NO_PREFETCH) {
                _mm_prefetch((const char *)p + 16384, _MM_HINT_T2);
                _mm_prefetch((const char *)p + 16384 + 64, _MM_HINT_T2);
            }
            __m512i z[4];
            for (int L = 0; L < 2; L++) {
                __m512i w = _mm512_load_si512(p + 64 * L);
                __asm__("" : "+v"(w)); /* as the kernel: the line pinned in a register */
                __m512i za, zb;
                if (var == DP_ONLY) {
                    za = zb = w;
                } else {
                    __m512i lo = _mm512_permutex2var_epi8(l0, w, l1), hi = _mm512_permutex2var_epi8(h0, w, h1);
                    if (var != NO_SIGN) hi = _mm512_ternarylogic_epi32(hi, w, m80, 0xF8);
                    if (var == NO_UNPACK) za = lo, zb = hi;
                    else za = _mm512_unpacklo_epi8(lo, hi), zb = _mm512_unpackhi_epi8(lo, hi);
                }
                z[2 * L] = za, z[2 * L + 1] = zb;
            }
            const uint16_t *xm = xb + (4 * g & 4095);
            if (var == DECODE_ONLY) {
                acc = _mm512_xor_si512(acc, _mm512_xor_si512(_mm512_xor_si512(z[0], z[1]), _mm512_xor_si512(z[2], z[3])));
            } else {
                a0 = DP(a0, z[0], bc(xm));
                a1 = DP(a1, z[1], bc(xm + 2));
                a2 = DP(a2, z[2], bc(xm + 4));
                a3 = DP(a3, z[3], bc(xm + 6));
            }
        }
    }
    float o[16];
    _mm512_storeu_ps(o, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, _mm512_add_ps(a3, _mm512_castsi512_ps(acc)))));
    return o[0];
}
#define W(n) \
    __attribute__((noinline)) static float run##n(int lines, int reps) { return body(n, lines, reps); }
W(0) W(1) W(2) W(3) W(4) W(5)
static float (*const runs[NVAR])(int, int) = {run0, run1, run2, run3, run4, run5};
static volatile float sink;

int main(void) {
    const int lines = 8 * 16 * 48; /* 8 tiles of 16 x 3072 fp8: 393 KB, L2-resident */
    const size_t bytes = (size_t)lines * 64 + 65536;
    tile = aligned_alloc(64, bytes);
    if (!tile) return 1;
    for (size_t i = 0; i < bytes; i++) tile[i] = (uint8_t)(i * 131);
    for (int i = 0; i < 4096; i++) xb[i] = 0x3F80;
    printf("fp8 gemv line, 1 token, 1 thread, L2-resident, best of 5:\n");
    for (int v = 0; v < NVAR; v++) {
        double best = 1e9;
        for (int k = 0; k < 5; k++) {
            double t = now();
            sink += runs[v](lines, 200);
            t = now() - t;
            if (t < best) best = t;
        }
        printf("  %-52s %6.3f ns/line  %6.1f GB/s\n", names[v], best / (lines * 200.0) * 1e9,
               lines * 200.0 * 64 / best * 1e-9);
    }
    free(tile);
    return 0;
}
