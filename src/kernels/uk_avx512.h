/* uk_avx512.h — what the AVX-512 packed micro-kernel files share: the
 * prefetch distances, the E4M3 -> bf16 line decode, the token-block
 * dispatch, the fp8 gemm epilogue, and the bodies whose inner product is a
 * bf16 pair dot (nvfp4 w4a16, bf16 x bf16), written once over a
 * DP(acc, w, x) that the including file defines:
 *  uk_avx512bf16.c  DP = vdpbf16ps (AVX512-BF16: Zen 4+, Intel since Cooper
 *                   Lake / Sapphire Rapids);
 *  uk_avx512.c      DP = two vfmadd231ps on the pair widened to fp32, odd
 *                   product first (the level's own kernels, for AVX-512 CPUs
 *                   without BF16: Ice Lake, and VMs that hide it).
 * vdpbf16ps adds a pair's odd product, then its even one, each rounded to
 * nearest even, input denormals taken as zero, output denormals flushed
 * (Intel SDM; checked against fmaf, see uk_fp8_f32_gemm), and bf16 x bf16
 * products are exact in fp32: so the FMA form gives the same sums wherever
 * no operand or partial sum is an fp32 denormal. Kernel notes: uk_avx512.c. */
#ifndef MOERUN_UK_AVX512_H
#define MOERUN_UK_AVX512_H
#include <immintrin.h>
#include <string.h>

#include "kernels/kern_internal.h"

#ifndef DP
#error "define DP(acc, w, x) before including uk_avx512.h"
#endif
#define INL static inline __attribute__((always_inline))
#define PFD MR_UK_PREFETCH
#define PF(p) _mm_prefetch((const char *)(p) + PFD, _MM_HINT_T2)
/* (bench/README.md) The decode-heavy kernels also prefetch into L1.
 * perf showed the fp8 kernel waiting on the first use of each line that had
 * been prefetched into L2. In interleaved A/B isolation rounds:
 *  - fp8 gemv, 4 KiB ahead into L1 instead of PF: T = 1 read 91-96% of the
 *    probe against 63-90%, T = 8 85-99% against 72-91%. Adding PF made it
 *    worse.
 *  - nvfp4 kernels, PF plus 2 KiB ahead into L1: int8 T = 1 72-88% against
 *    57-83% (6 rounds), and bf16 (w4a16) T = 8 88-98% against 59-94%. L1
 *    alone, at 2 or 4 KiB, was worse.
 *  - the bf16 kernel reads worse with any L1 prefetch and keeps PF. */
#define PF_L1(p, d) _mm_prefetch((const char *)(p) + (d), _MM_HINT_T0)
#define PF_FP8(p) PF_L1(p, 4096)
#define PF_NV(p) (PF(p), PF_L1(p, 2048))
#define MT MR_UK_MT

/* bf16 bits of the E4M3 magnitude m (0..127) as low and high bytes; 0x7F
 * (NaN) -> 0x7FC0. Exact for every code (subnormals become bf16 normals).
 * tests/test_kernels.c checks all 256 codes against mr_e4m3_to_f32. */
static const uint8_t LUT_LO[128] __attribute__((aligned(64))) = {
    0x00, 0x00, 0x80, 0xC0, 0x00, 0x20, 0x40, 0x60, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xC0};
static const uint8_t LUT_HI[128] __attribute__((aligned(64))) = {
    0x00, 0x3B, 0x3B, 0x3B, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C,
    0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D,
    0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E,
    0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F,
    0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40,
    0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41,
    0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42,
    0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x7F};

INL __m512 bcast_pair(const uint16_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return _mm512_castsi512_ps(_mm512_set1_epi32((int)v));
}
INL int32_t ld32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void apply_post(float *y, int64_t ldy, int64_t M, float post) {
    if (post == 1.0f) return;
    const __m512 p = _mm512_set1_ps(post);
    for (int64_t m = 0; m < M; m++) _mm512_storeu_ps(y + m * ldy, _mm512_mul_ps(_mm512_loadu_ps(y + m * ldy), p));
}

/* A kernel and its batch-invariant form (mr_kernels.uk_inv) over one body run(W, t, a, M, y,
 * ldy, flag): NAME with flag FAST, NAME_inv with flag INV. */
#define UK_WITH_INV(NAME, run, FAST, INV)                                                                       \
    static void NAME(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,     \
                     void *scratch) {                                                                           \
        (void)scratch;                                                                                          \
        run(W, t, a, M, y, ldy, FAST);                                                                          \
    }                                                                                                           \
    static void NAME##_inv(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y,            \
                           int64_t ldy, void *scratch) {                                                        \
        (void)scratch;                                                                                          \
        run(W, t, a, M, y, ldy, INV);                                                                           \
    }

/* Tokens of the next register block when `left` remain: the blocks of a
 * call are balanced (17 = 6 + 6 + 5, not 8 + 8 + 1), because a block of 1-2
 * tokens runs at about half the compute rate of 5-8 (dev/perf/hot_uk). */
INL int64_t token_block(int64_t left, int64_t most) {
    const int64_t nb = (left + most - 1) / most;
    return (left + nb - 1) / nb;
}

enum { MT16 = 16 }; /* tokens per register block of the kernels that take 16 */

/* the switch that turns a runtime token count 1..8 into a constant for the bodies */
#define DISPATCH_MT(mt, CALL)                                                                                     \
    switch (mt) {                                                                                                  \
    case 1: CALL(1); break;                                                                                        \
    case 2: CALL(2); break;                                                                                        \
    case 3: CALL(3); break;                                                                                        \
    case 4: CALL(4); break;                                                                                        \
    case 5: CALL(5); break;                                                                                        \
    case 6: CALL(6); break;                                                                                        \
    case 7: CALL(7); break;                                                                                        \
    default: CALL(8); break;                                                                                       \
    }

#define DISPATCH_MT16(mt, CALL)                                                                                   \
    switch (mt) {                                                                                                  \
    case 9: CALL(9); break;                                                                                        \
    case 10: CALL(10); break;                                                                                      \
    case 11: CALL(11); break;                                                                                      \
    case 12: CALL(12); break;                                                                                      \
    case 13: CALL(13); break;                                                                                      \
    case 14: CALL(14); break;                                                                                      \
    case 15: CALL(15); break;                                                                                      \
    case 16: CALL(16); break;                                                                                      \
    default: DISPATCH_MT(mt, CALL)                                                                                 \
    }



/* ---------------- FP8 ---------------- */
typedef struct {
    __m512i l0, l1, h0, h1, m80;
} fp8_lut;

INL fp8_lut fp8_lut_load(void) {
    fp8_lut t;
    t.l0 = _mm512_load_si512(LUT_LO);
    t.l1 = _mm512_load_si512(LUT_LO + 64);
    t.h0 = _mm512_load_si512(LUT_HI);
    t.h1 = _mm512_load_si512(LUT_HI + 64);
    t.m80 = _mm512_set1_epi8((char)0x80);
    return t;
}

/* One line -> z0 = 16 rows x bf16 pair (k0,k1), z1 = 16 rows x (k2,k3). The
 * sign bit is ignored by the 7-bit LUT index and OR-ed back. */
INL void fp8_line_bf16(const fp8_lut *t, const uint8_t *p, __m512i *z0, __m512i *z1, const int pin) {
    __m512i w = _mm512_load_si512(p);
    /* pin: keep w in a register (gcc reloads it per use, 3 zmm loads a line);
     * +4% hot at 1 token, -8% at 2 */
    if (pin) __asm__("" : "+v"(w));
    __m512i lo = _mm512_permutex2var_epi8(t->l0, w, t->l1);
    __m512i hi = _mm512_permutex2var_epi8(t->h0, w, t->h1);
    hi = _mm512_ternarylogic_epi32(hi, w, t->m80, 0xF8); /* hi | (w & 0x80) */
    *z0 = _mm512_unpacklo_epi8(lo, hi);
    *z1 = _mm512_unpackhi_epi8(lo, hi);
}

/* a 128-k block's 32 lines -> 64 bf16-pair vectors at b (4 KiB: the gemm kernels' L1 copy, and
 * AMX's four B tiles), each line prefetched PF (l1 = 0), PF_FP8 and PF (l1 = 1: the AMX kernel;
 * with PF beside PF_FP8 its fp8 w8a8 read 88-94% of the stream-only rate at 1-32 tokens against
 * 74-86%, 4 interleaved rounds, bench/README.md "The AMX FP8 kernel with an L2 prefetch"), or not
 * (l1 = 2: the caller prefetches) */
INL void fp8_block_pairs(const fp8_lut *t, const uint8_t *p, __m512i *b, const int l1) {
    for (int g = 0; g < 32; g++) {
        __m512i z0, z1;
        if (l1 == 1)
            PF_FP8(p + g * 64), PF(p + g * 64);
        else if (l1 == 0)
            PF(p + g * 64);
        fp8_line_bf16(t, p + g * 64, &z0, &z1, 0);
        _mm512_store_si512(b + 2 * g, z0);
        _mm512_store_si512(b + 2 * g + 1, z1);
    }
}

/* a 128-k block's sums of M tokens into y: y = acc * s (the first block) or
 * y + acc * s, s the block multiplier times the token's (w8a8); the one
 * epilogue of both fp8 gemm kernels, so that their results agree bit for bit */
INL void fp8_gemm_store(const __m512 *acc, float s0, const float *xs, int64_t ldxs, int64_t kb, float *y, int64_t ldy,
                        int first, const int M) {
    #pragma GCC unroll 16
    for (int m = 0; m < M; m++) {
        __m512 s = _mm512_set1_ps(s0 * (xs ? xs[m * ldxs + kb] : 1.0f));
        __m512 r = first ? _mm512_mul_ps(acc[m], s) : _mm512_fmadd_ps(acc[m], s, _mm512_loadu_ps(y + m * ldy));
        _mm512_storeu_ps(y + m * ldy, r);
    }
}

/* ---------------- NVFP4 ---------------- */
/* 16 E4M3 bytes -> 16 f32 equal to value * 2^-8 (f16 bit trick, exact). */
INL __m512 e4m3x16_f32(const uint8_t *p) {
    __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    w = _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16((short)0xBF80));
    return _mm512_cvtph_ps(w);
}

/* bf16 bytes of e2m1(c): high byte (sign included) and low byte. */
static const uint8_t BHI[16] = {0x00, 0x3F, 0x3F, 0x3F, 0x40, 0x40, 0x40, 0x40,
                                0x80, 0xBF, 0xBF, 0xBF, 0xC0, 0xC0, 0xC0, 0xC0};
static const uint8_t BLO[16] = {0x00, 0x00, 0x80, 0xC0, 0x00, 0x40, 0x80, 0xC0,
                                0x00, 0x00, 0x80, 0xC0, 0x00, 0x40, 0x80, 0xC0};
INL __m512i lut16(const uint8_t *t) { return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)t)); }
/* 2*e2m1(c) as int8, for the fixed-point gemv */
static const int8_t E2X2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 16-k block j of a tile as 8 pair vectors z[pr] (16 rows x k = 2pr, 2pr + 1
 * in each dword: the low word the even k): bf16 (i16 = 0), or 2*e2m1 * 256
 * as int16 (i16 = 1: one vpshufb, the two unpacks under zero bytes); pf:
 * the block's prefetches */
INL void nvf_block_z(const uint8_t *tile, int64_t j, __m512i z[8], const int i16, const int pf) {
    const __m512i lhi = i16 ? lut16((const uint8_t *)E2X2) : lut16(BHI), llo = lut16(BLO);
    const __m512i m0f = _mm512_set1_epi8(0x0F), zero = _mm512_setzero_si512();
    #pragma GCC unroll 16
    for (int L = 0; L < 2; L++) {
        if (pf) PF_NV(tile + j * 128 + 64 * L);
        const __m512i v = _mm512_load_si512(tile + j * 128 + 64 * L);
        #pragma GCC unroll 16
        for (int h = 0; h < 2; h++) {
            const __m512i n = _mm512_and_si512(h ? _mm512_srli_epi16(v, 4) : v, m0f);
            const __m512i hi = _mm512_shuffle_epi8(lhi, n), lo = i16 ? zero : _mm512_shuffle_epi8(llo, n);
            z[4 * L + 2 * h] = _mm512_unpacklo_epi8(lo, hi);
            z[4 * L + 2 * h + 1] = _mm512_unpackhi_epi8(lo, hi);
        }
    }
}

/* one token's bf16 pair dots over a block's z, x at the block's first k: the block sums */
INL __m512 nvf_pair_dots(const __m512i z[8], const uint16_t *xm) {
    __m512 a0 = DP(_mm512_setzero_ps(), z[0], bcast_pair(xm));
    __m512 a1 = DP(_mm512_setzero_ps(), z[1], bcast_pair(xm + 2));
    #pragma GCC unroll 16
    for (int pr = 2; pr < 8; pr += 2) {
        a0 = DP(a0, z[pr], bcast_pair(xm + 2 * pr));
        a1 = DP(a1, z[pr + 1], bcast_pair(xm + 2 * pr + 2));
    }
    return _mm512_add_ps(a0, a1);
}

INL void nvfp4_bf16_body(const uint8_t *tile, int64_t Kp, const uint16_t *x, int64_t ldx, const float *xs,
                         int64_t ldxs, float post, float *y, int64_t ldy, const int M) {
    const uint8_t *scp = tile + 8 * Kp;
    __m512 out[MT];
    #pragma GCC unroll 16
    for (int m = 0; m < M; m++) out[m] = _mm512_setzero_ps();
    for (int64_t j = 0; j < Kp / 16; j++) {
        if ((j & 3) == 0) PF(scp + 16 * j);
        __m512i z[8];
        nvf_block_z(tile, j, z, 0, 1);
        __m512 sc = e4m3x16_f32(scp + 16 * j);
        #pragma GCC unroll 16
        for (int m = 0; m < M; m++) {
            __m512 s = xs ? _mm512_mul_ps(sc, _mm512_set1_ps(xs[m * ldxs + j])) : sc;
            out[m] = _mm512_fmadd_ps(nvf_pair_dots(z, x + m * ldx + 16 * j), s, out[m]);
        }
    }
    const __m512 f = _mm512_set1_ps(256.0f * post);
    #pragma GCC unroll 16
    for (int m = 0; m < M; m++) _mm512_storeu_ps(y + m * ldy, _mm512_mul_ps(out[m], f));
}

/* The same tiles on fixed-point x (mr_uk_act.xq; see uk_avx2_nvw.h for the
 * arithmetic): the block as int16 pair vectors (nvf_block_z), then per token
 * 8 vpdpwssd with the broadcast pairs of fixed-point activations: exact
 * integer block sums, one conversion and one FMA with the scales times
 * m / 512. A token's block in two parts takes 8 more on its low part; one
 * with no form (m = 0) takes the bf16 pair dots from x, as nvfp4_bf16_body. */

/* one token's 8 pair dots over the block's int16 weights z, from q (the block's 16 values) */
INL __m512i fixq_dots(const __m512i z[8], const int16_t *q) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0;
    #pragma GCC unroll 8
    for (int pr = 0; pr < 8; pr += 2) {
        int32_t p0, p1;
        memcpy(&p0, q + 2 * pr, 4);
        memcpy(&p1, q + 2 * pr + 2, 4);
        a0 = _mm512_dpwssd_epi32(a0, z[pr], _mm512_set1_epi32(p0));
        a1 = _mm512_dpwssd_epi32(a1, z[pr + 1], _mm512_set1_epi32(p1));
    }
    return _mm512_add_epi32(a0, a1);
}

INL void nvfp4_fixq_body(const uint8_t *tile, int64_t Kp, const mr_uk_act *a, int64_t m0, float post, float *y,
                         int64_t ldy, const int M) {
    const uint8_t *scp = tile + 8 * Kp;
    const uint16_t *x = (const uint16_t *)a->x + m0 * a->ldx;
    const int16_t *xq = a->xq + m0 * a->ldxq, *xql = a->xql + m0 * a->ldxq;
    const float *xqm = a->xqm + m0 * a->ldxqm, *xs = a->xs ? a->xs + m0 * a->ldxs : NULL;
    __m512 out[MT];
    #pragma GCC unroll 16
    for (int m = 0; m < M; m++) out[m] = _mm512_setzero_ps();
    for (int64_t j = 0; j < Kp / 16; j++) {
        if ((j & 3) == 0) PF(scp + 16 * j);
        __m512i z[8];
        nvf_block_z(tile, j, z, 1, 1);
        const __m512 sc = e4m3x16_f32(scp + 16 * j);
        #pragma GCC unroll 16
        for (int m = 0; m < M; m++) {
            float mult = xqm[m * a->ldxqm + j];
            __m512 f;
            if (__builtin_expect(mult > 0.0f, 1)) {
                f = _mm512_cvtepi32_ps(fixq_dots(z, xq + m * a->ldxq + 16 * j));
                mult *= 1.0f / 512.0f;
            } else if (mult < 0.0f) { /* two parts: hi + lo * 2^-15 */
                f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(fixq_dots(z, xql + m * a->ldxq + 16 * j)),
                                    _mm512_set1_ps(1.0f / 32768.0f),
                                    _mm512_cvtepi32_ps(fixq_dots(z, xq + m * a->ldxq + 16 * j)));
                mult *= -1.0f / 512.0f;
            } else { /* no form: the bf16 pair dots of nvfp4_bf16_body on this block */
                __m512i zb[8];
                nvf_block_z(tile, j, zb, 0, 0);
                f = nvf_pair_dots(zb, x + m * a->ldx + 16 * j);
                mult = 1.0f;
            }
            if (xs) mult *= xs[m * a->ldxs + j];
            out[m] = _mm512_fmadd_ps(f, _mm512_mul_ps(sc, _mm512_set1_ps(mult)), out[m]);
        }
    }
    const __m512 pf = _mm512_set1_ps(256.0f * post);
    #pragma GCC unroll 16
    for (int m = 0; m < M; m++) _mm512_storeu_ps(y + m * ldy, _mm512_mul_ps(out[m], pf));
}

static void uk_nvfp4_bf16(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                          void *scratch) {
    (void)scratch;
    const uint8_t *tile = W->data + (size_t)t * W->tile_bytes;
    const float post = a->post * W->scale2;
    if (a->xq) { /* the gemv on fixed-point x: at most MR_UK_MT tokens (expert_packed.c) */
        for (int64_t m0 = 0, mt; m0 < M; m0 += mt) {
            mt = token_block(M - m0, MT);
#define CALL(n) nvfp4_fixq_body(tile, W->Kp, a, m0, post, y + m0 * ldy, ldy, n)
            DISPATCH_MT(mt, CALL)
#undef CALL
        }
        return;
    }
    for (int64_t m0 = 0, mt; m0 < M; m0 += mt) {
        mt = token_block(M - m0, MT);
        const uint16_t *x = (const uint16_t *)a->x + m0 * a->ldx;
        const float *xs = a->xs ? a->xs + m0 * a->ldxs : NULL;
#define CALL(n) nvfp4_bf16_body(tile, W->Kp, x, a->ldx, xs, a->ldxs, post, y + m0 * ldy, ldy, n)
        DISPATCH_MT(mt, CALL)
#undef CALL
    }
}

/* ---------------- bf16 weights ---------------- */
INL void bf16_body(const uint8_t *tile, int64_t Kp, const uint16_t *x, int64_t ldx, float *y, int64_t ldy,
                   const int M, const int INV) {
    /* 4 chains per token for M == 1, 2 for M <= 4, 1 above (latency vs registers); INV: 1 at
     * every M (the batch-invariant form, mr_kernels.uk_inv) */
    enum { MAXC = 4 };
    const int nc = INV ? 1 : M == 1 ? 4 : M <= 4 ? 2 : 1;
    __m512 acc[MT16][MAXC];
    #pragma GCC unroll 16
    for (int m = 0; m < M; m++)
        #pragma GCC unroll 16
        for (int c = 0; c < MAXC; c++) acc[m][c] = _mm512_setzero_ps();
    const int64_t np = Kp / 2;
    int64_t g = 0;
    for (; g + 4 <= np; g += 4) {
        PF(tile + g * 64);
        PF(tile + g * 64 + 128);
        #pragma GCC unroll 16
        for (int u = 0; u < 4; u++) {
            __m512i w = _mm512_load_si512(tile + (g + u) * 64);
            #pragma GCC unroll 16
            for (int m = 0; m < M; m++)
                acc[m][u % nc] = DP(acc[m][u % nc], w, bcast_pair(x + m * ldx + 2 * (g + u)));
        }
    }
    for (; g < np; g++) {
        __m512i w = _mm512_load_si512(tile + g * 64);
        #pragma GCC unroll 16
        for (int m = 0; m < M; m++) acc[m][0] = DP(acc[m][0], w, bcast_pair(x + m * ldx + 2 * g));
    }
    #pragma GCC unroll 16
    for (int m = 0; m < M; m++) {
        __m512 s = acc[m][0];
        #pragma GCC unroll 16
        for (int c = 1; c < nc; c++) s = _mm512_add_ps(s, acc[m][c]);
        _mm512_storeu_ps(y + m * ldy, s);
    }
}

INL void bf16_run(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                  const int INV) {
    const uint8_t *tile = W->data + (size_t)t * W->tile_bytes;
    for (int64_t m0 = 0, mt; m0 < M; m0 += mt) {
        mt = token_block(M - m0, MT16); /* 16 tokens a pass: half the weight traffic per FLOP of 8 */
        const uint16_t *x = (const uint16_t *)a->x + m0 * a->ldx;
#define CALL(n) bf16_body(tile, W->Kp, x, a->ldx, y + m0 * ldy, ldy, n, INV)
        DISPATCH_MT16(mt, CALL)
#undef CALL
    }
    apply_post(y, ldy, M, a->post * W->scale2);
}
UK_WITH_INV(uk_bf16_bf16, bf16_run, 0, 1)

#endif
