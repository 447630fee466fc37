/* fp8_decode_floor.c — the floor of the AVX-512 E4M3 -> bf16 decode that the AMX FP8 kernels run
 * (uk_avx512.h fp8_line_bf16 + fp8_block_pairs: per 64-byte line 2 vpermt2b, 1 vpternlogd,
 * 2 unpacks, 2 stores into a 4 KiB block copy), over buffers from L1 to L3 size, one thread, with
 * and without an L1 prefetch; the throughput of vpermt2b zmm and vpunpcklbw zmm alone (ns an
 * instruction, independent chains); and, where the CPU has AMX-BF16 and Linux grants the tile state,
 * whether the decode overlaps tdpbf16ps: a block's decode beside 4, 8 or 16 tdpbf16ps on tiles that do
 * not depend on it, against each alone. Costs only: the table is not the library's, the values are
 * not used. Not part of CMake.
 *
 *   make -C dev/perf fp8_decode_floor && dev/perf/fp8_decode_floor */
#include "amx_tool.h" /* first: it defines _GNU_SOURCE */

#include <stdio.h>
#include <stdlib.h>

typedef struct {
    __m512i l0, l1, h0, h1, m80;
} lut_t;

static inline __attribute__((always_inline)) void line(const lut_t *t, const uint8_t *p, __m512i *z0, __m512i *z1) {
    __m512i w = _mm512_load_si512(p);
    __asm__("" : "+v"(w));
    const __m512i lo = _mm512_permutex2var_epi8(t->l0, w, t->l1);
    __m512i hi = _mm512_permutex2var_epi8(t->h0, w, t->h1);
    hi = _mm512_ternarylogic_epi32(hi, w, t->m80, 0xF8);
    *z0 = _mm512_unpacklo_epi8(lo, hi);
    *z1 = _mm512_unpackhi_epi8(lo, hi);
}

/* ns per 2 KiB block over a buffer of `bytes`, best of 7; pf: 0 none, 1 T0 4 KiB ahead */
static double decode_ns(const uint8_t *src, size_t bytes, __m512i *b, const lut_t *t, int pf) {
    double best = 1e9;
    for (int r = 0; r < 7; r++) {
        const long reps = (long)(400e6 / (double)bytes) + 1;
        const double t0 = now();
        for (long i = 0; i < reps; i++)
            for (size_t o = 0; o < bytes; o += 2048)
                for (int g = 0; g < 32; g++) {
                    const uint8_t *p = src + o + g * 64;
                    __m512i z0, z1;
                    if (pf) _mm_prefetch((const char *)p + 4096, _MM_HINT_T0);
                    line(t, p, &z0, &z1);
                    _mm512_store_si512(b + 2 * g, z0);
                    _mm512_store_si512(b + 2 * g + 1, z1);
                }
        const double dt = (now() - t0) / (double)reps / (double)(bytes / 2048);
        best = dt < best ? dt : best;
    }
    return best * 1e9;
}

#define EIGHT(op)                                                                                                \
    __asm__ volatile(op " %8, %9, %0\n\t" op " %8, %9, %1\n\t" op " %8, %9, %2\n\t" op " %8, %9, %3\n\t" op        \
                        " %8, %9, %4\n\t" op " %8, %9, %5\n\t" op " %8, %9, %6\n\t" op " %8, %9, %7"              \
                     : "+v"(a), "+v"(c), "+v"(d), "+v"(e), "+v"(f), "+v"(g), "+v"(h), "+v"(j)                     \
                     : "v"(l0), "v"(l1))

static double thr_ns(int which) {
    __m512i a = _mm512_set1_epi8(1), c = a, d = a, e = a, f = a, g = a, h = a, j = a;
    const __m512i l0 = _mm512_set1_epi8(2), l1 = _mm512_set1_epi8(3);
    const long n = 100000000;
    const double t0 = now();
    for (long i = 0; i < n; i++) {
        if (which)
            EIGHT("vpunpcklbw");
        else
            EIGHT("vpermt2b");
    }
    const double dt = now() - t0;
    volatile int sink = _mm_cvtsi128_si32(_mm512_castsi512_si128(_mm512_xor_si512(a, j)));
    (void)sink;
    return dt / (double)n / 8 * 1e9;
}

/* ns per step of: a block's decode (dec), then ndp tdpbf16ps alternating between C tiles 0 and 1 on
 * A / B tiles loaded once (nothing read from the decode), best of 5 */
static double amx_ns(const uint8_t *src, __m512i *b, const lut_t *t, int dec, int ndp) {
    const amx_cfg c = amx_cfg_full(8);
    amx_load_cfg(&c);
    memset(b, 0, 4096);
    _tile_loadd(2, b, 64);
    _tile_loadd(3, b, 64);
    _tile_loadd(4, b, 64);
    _tile_loadd(5, b + 16, 64);
    _tile_zero(0);
    _tile_zero(1);
    const long n = 1000000;
    double best = 1e9;
    for (int r = 0; r < 5; r++) {
        const double t0 = now();
        for (long i = 0; i < n; i++) {
            if (dec)
                for (int g = 0; g < 32; g++) {
                    __m512i z0, z1;
                    line(t, src + (i & 7) * 2048 + g * 64, &z0, &z1);
                    _mm512_store_si512(b + 2 * g, z0);
                    _mm512_store_si512(b + 2 * g + 1, z1);
                }
            for (int k = 0; k < ndp; k += 2) {
                _tile_dpbf16ps(0, 2, 4);
                _tile_dpbf16ps(1, 3, 5);
            }
        }
        const double dt = (now() - t0) / (double)n;
        best = dt < best ? dt : best;
    }
    _tile_release();
    return best * 1e9;
}

int main(void) {
    const size_t sizes[] = {2048, 16384, 786432, 8u << 20, 64u << 20};
    uint8_t *src = aligned_alloc(64, 64u << 20);
    __m512i *b = aligned_alloc(64, 4096);
    if (!src || !b) return 1;
    for (size_t i = 0; i < (64u << 20); i++) src[i] = (uint8_t)(i * 131u);
    lut_t t;
    t.l0 = _mm512_set1_epi8(1), t.l1 = _mm512_set1_epi8(2), t.h0 = _mm512_set1_epi8(3);
    t.h1 = _mm512_set1_epi8(4), t.m80 = _mm512_set1_epi8((char)0x80);
    printf("vpermt2b zmm: %.3f ns an instruction; vpunpcklbw zmm: %.3f ns (independent chains, one thread)\n",
           thr_ns(0), thr_ns(1));
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int pf = 0; pf < 2; pf++) {
            const double ns = decode_ns(src, sizes[s], b, &t, pf);
            printf("buffer %6zu KiB, %s: %6.1f ns a 2 KiB block, %.2f ns a line, %5.1f GB/s\n", sizes[s] / 1024,
                   pf ? "L1 prefetch 4 KiB ahead" : "no prefetch            ", ns, ns / 32, 2048 / ns);
        }
    if (__builtin_cpu_supports("amx-bf16") && amx_grant()) {
        const double d = amx_ns(src, b, &t, 1, 0);
        for (int ndp = 4; ndp <= 16; ndp *= 2) {
            const double a = amx_ns(src, b, &t, 0, ndp), both = amx_ns(src, b, &t, 1, ndp);
            printf("decode %.1f ns, %2d tdpbf16ps %.1f ns, both %.1f ns (sum %.1f, max %.1f): %.0f%% of the shorter "
                   "hidden\n",
                   d, ndp, a, both, d + a, d > a ? d : a, 100.0 * (d + a - both) / (d < a ? d : a));
        }
    } else {
        printf("no AMX-BF16 here (or the tile state is not granted): the overlap test is skipped\n");
    }
    free(src), free(b);
    return 0;
}
