/* uk_avx512.c — AVX-512 packed micro-kernels (F/BW/VL + BF16, VNNI, VBMI),
 * the winners of dev/perf (README there), behind the contract of
 * moerun/kernels.h (one 16-row tile, all of Kp, any M, y written not read):
 *  fp8_bf16 gemv  (dev fp8.v1) E4M3 -> bf16 by two 128-entry vpermi2b byte
 *                 LUTs, 2 vdpbf16ps per token per 64-byte line; tokens in
 *                 register blocks of 8; block multiplier by one FMA per 128 k;
 *                 1 token: 2 lines a step into 4 chains (+14% hot);
 *  fp8_bf16 gemm  (dev fp8.v3) decodes a 16x128 block to bf16 once into
 *                 scratch (L1), then 8-token blocks: 1 load + 8 vdpbf16ps;
 *  fp8_f32 gemm   the same sums bit for bit on fp32 FMAs (the block widened
 *                 to fp32 in L1, 16-token blocks, 1 load + 16 vfmadd231ps a
 *                 k) where the CPU has AVX512-FP16 (Intel: vdpbf16ps zmm at
 *                 half the FMA rate);
 *  nvfp4_i8       (dev nvfp4.v1) vpermb nibble -> u8 = 2*e2m1 + 12 (vpermb
 *                 instead of and + vpshufb; 1 token: split chains; up to
 *                 16 tokens a pass, xs once per 128 for w4a8),
 *                 vpdpbusd with broadcast int8 activations; the int32 sum of
 *                 a 16-k block starts at xb = -12*sum(x) (removes the bias),
 *                 then vcvtdq2ps and one FMA with the 16 row scales (E4M3 by
 *                 the exact f16 bit trick) times the activation multiplier;
 *  nvfp4_bf16     (dev nvfp4.v2) two vpshufb LUTs give the bf16 bytes of
 *                 E2M1, vdpbf16ps per block, FMA with the scales;
 *  bf16_bf16      (dev bf16.v1) one vdpbf16ps per token per line; up to 16
 *                 tokens a pass (T = 512: from 55% to 74% of peak);
 *  bf16_f32       bf16 pairs widened exactly to fp32 (shift / mask),
 *                 vfmadd231ps with broadcast fp32 activations.
 * All weight streams are prefetched 16 KiB ahead into L2 (_MM_HINT_T2): the
 * measured difference between 71% and 92-98% of read bandwidth at T = 1;
 * the fp8 and nvfp4 kernels also prefetch into L1 (PF_FP8, PF_NV).
 * Also the dense row-major fast paths of mr_matmul (bf16, FP8 block). */
#include <immintrin.h>
#include <string.h>

#include "kernels/kern_internal.h"


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
#define DP(acc, w, xv) _mm512_dpbf16_ps((acc), (__m512bh)(w), (__m512bh)(xv))

static void apply_post(float *y, int64_t ldy, int64_t M, float post) {
    if (post == 1.0f) return;
    const __m512 p = _mm512_set1_ps(post);
    for (int64_t m = 0; m < M; m++) _mm512_storeu_ps(y + m * ldy, _mm512_mul_ps(_mm512_loadu_ps(y + m * ldy), p));
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

INL void fp8_gemv_body(const uint8_t *tile, const float *bs, int64_t Kp, const uint16_t *x, int64_t ldx,
                       const float *xs, int64_t ldxs, float *y, int64_t ldy, const int M, const int TWO) {
    const fp8_lut t = fp8_lut_load();
    /* two accumulator chains per token while registers allow, in calls of at most 4 tokens
     * only: a call of 5+ (e.g. 9 = 5 + 4) keeps one chain in every block, the sums of
     * uk_fp8_bf16_gemm and uk_fp8_f32_gemm, so that a table's gemm threshold (16 or 6)
     * changes no result */
    const int two = M <= 4 && TWO;
    __m512 out[MT], a0[MT], a1[MT];
    #pragma GCC unroll 16
    for (int m = 0; m < M; m++) out[m] = _mm512_setzero_ps();
    for (int64_t kb = 0; kb < Kp / 128; kb++) {
        const uint8_t *p = tile + kb * 2048;
        #pragma GCC unroll 16
        for (int m = 0; m < M; m++) a0[m] = a1[m] = _mm512_setzero_ps();
        if (M == 1) { /* 4 chains over 2 lines, w pinned: +14% hot (bench/README.md) */
            __m512 a2 = _mm512_setzero_ps(), a3 = a2;
            for (int g = 0; g < 32; g += 2) {
                __m512i z0, z1, z2, z3;
                PF_FP8(p + g * 64);
                PF_FP8(p + g * 64 + 64);
                fp8_line_bf16(&t, p + g * 64, &z0, &z1, 1);
                fp8_line_bf16(&t, p + g * 64 + 64, &z2, &z3, 1);
                const uint16_t *xm = x + kb * 128 + 4 * g;
                a0[0] = DP(a0[0], z0, bcast_pair(xm));
                a1[0] = DP(a1[0], z1, bcast_pair(xm + 2));
                a2 = DP(a2, z2, bcast_pair(xm + 4));
                a3 = DP(a3, z3, bcast_pair(xm + 6));
            }
            a0[0] = _mm512_add_ps(a0[0], a2);
            a1[0] = _mm512_add_ps(a1[0], a3);
        }
        for (int g = 0; M > 1 && g < 32; g++) {
            __m512i z0, z1;
            PF_FP8(p + g * 64);
            fp8_line_bf16(&t, p + g * 64, &z0, &z1, 0);
            #pragma GCC unroll 16
            for (int m = 0; m < M; m++) {
                const uint16_t *xm = x + m * ldx + kb * 128 + 4 * g;
                a0[m] = DP(a0[m], z0, bcast_pair(xm));
                if (two) a1[m] = DP(a1[m], z1, bcast_pair(xm + 2));
                else a0[m] = DP(a0[m], z1, bcast_pair(xm + 2));
            }
        }
        #pragma GCC unroll 16
        for (int m = 0; m < M; m++) {
            float s = bs[kb] * (xs ? xs[m * ldxs + kb] : 1.0f);
            __m512 acc = two ? _mm512_add_ps(a0[m], a1[m]) : a0[m];
            out[m] = _mm512_fmadd_ps(acc, _mm512_set1_ps(s), out[m]);
        }
    }
    #pragma GCC unroll 16
    for (int m = 0; m < M; m++) _mm512_storeu_ps(y + m * ldy, out[m]);
}

static void uk_fp8_bf16_gemv(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                             void *scratch) {
    (void)scratch;
    const uint8_t *tile = W->data + (size_t)t * W->tile_bytes;
    const float *bs = W->tscale + t * (W->Kp / 128);
    for (int64_t m0 = 0, mt; m0 < M; m0 += mt) {
        mt = token_block(M - m0, MT);
        const uint16_t *x = (const uint16_t *)a->x + m0 * a->ldx;
        const float *xs = a->xs ? a->xs + m0 * a->ldxs : NULL;
#define CALL(n) fp8_gemv_body(tile, bs, W->Kp, x, a->ldx, xs, a->ldxs, y + m0 * ldy, ldy, n, 1)
#define CALL1(n) fp8_gemv_body(tile, bs, W->Kp, x, a->ldx, xs, a->ldxs, y + m0 * ldy, ldy, n, 0)
        if (M <= 4) {
            DISPATCH_MT(mt, CALL)
        } else {
            DISPATCH_MT(mt, CALL1)
        }
#undef CALL
#undef CALL1
    }
    apply_post(y, ldy, M, a->post * W->scale2);
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

INL void fp8_gemm_tok(const __m512i *buf, const uint16_t *x, int64_t ldx, const float *xs, int64_t ldxs, float s0,
                      int64_t kb, float *y, int64_t ldy, int first, const int M) {
    __m512 acc[MT];
    #pragma GCC unroll 16
    for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
    #pragma GCC unroll 16
    for (int pr = 0; pr < 64; pr++) {
        __m512i w = _mm512_load_si512(buf + pr);
        #pragma GCC unroll 16
        for (int m = 0; m < M; m++) acc[m] = DP(acc[m], w, bcast_pair(x + m * ldx + kb * 128 + 2 * pr));
    }
    fp8_gemm_store(acc, s0, xs, ldxs, kb, y, ldy, first, M);
}

static void uk_fp8_bf16_gemm(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                             void *scratch) {
    const fp8_lut lut = fp8_lut_load();
    const uint8_t *tile = W->data + (size_t)t * W->tile_bytes;
    const float *bs = W->tscale + t * (W->Kp / 128);
    __m512i *b = (__m512i *)scratch; /* 16 rows x 128 k as 64 bf16-pair vectors: 4 KiB */
    for (int64_t kb = 0; kb < W->Kp / 128; kb++) {
        const uint8_t *p = tile + kb * 2048;
        for (int g = 0; g < 32; g++) {
            __m512i z0, z1;
            PF(p + g * 64);
            fp8_line_bf16(&lut, p + g * 64, &z0, &z1, 0);
            _mm512_store_si512(b + 2 * g, z0);
            _mm512_store_si512(b + 2 * g + 1, z1);
        }
        for (int64_t m0 = 0, mt; m0 < M; m0 += mt) {
            mt = token_block(M - m0, MT);
            const uint16_t *xm = (const uint16_t *)a->x + m0 * a->ldx;
            const float *xsm = a->xs ? a->xs + m0 * a->ldxs : NULL;
#define CALL(n) fp8_gemm_tok(b, xm, a->ldx, xsm, a->ldxs, bs[kb], kb, y + m0 * ldy, ldy, kb == 0, n)
            DISPATCH_MT(mt, CALL)
#undef CALL
        }
    }
    apply_post(y, ldy, M, a->post * W->scale2);
}

/* fp8 gemm on fp32 FMAs (the table's choice where the CPU has AVX512-FP16,
 * i.e. Intel's cores since Sapphire Rapids, whose vdpbf16ps zmm issues at
 * half the rate of vfmadd231ps zmm: 218-222 against 427-469 GFLOP/s on 2
 * cores here, bench/README.md). The 16x128 block is decoded through the
 * bf16 LUT and widened into scratch as [128 k][16 rows] fp32 (8 KiB); then
 * register blocks of up to 16 tokens, per k one load of the 16 rows and one
 * vfmadd231ps per token with its x broadcast from memory (x fp32 from the
 * caller, mr_uk_act.xw, or widened here per block).
 * Bit for bit uk_fp8_bf16_gemm: vdpbf16ps adds a pair's odd product, then
 * its even one, each rounded to nearest even, with input denormals taken
 * as zero and output denormals flushed (Intel SDM; the order was checked
 * on 320000 random lanes against fmaf), and bf16 products are exact in
 * fp32; so the same chain of FMAs, odd k before even k, under MXCSR DAZ |
 * FTZ (and round to nearest, exceptions masked) gives the same sums. The
 * scaling into y runs under the caller's MXCSR, as in uk_fp8_bf16_gemm. */
/* the MXCSR of the sums: FTZ (bit 15) and DAZ (6), every exception masked (7-12), round to
 * nearest even (13-14 clear), as vdpbf16ps computes whatever the caller's MXCSR holds; the
 * caller's is restored after, flags and all (vdpbf16ps updates none) */
enum { MTZ = 16, MXCSR_RC = 0x6000, MXCSR_SUMS = 0x8000 | 0x1F80 | 0x0040 };
INL void fp8_blk_f32(const fp8_lut *t, const uint8_t *p, __m512 *wb) {
    const __m512i hm = _mm512_set1_epi32((int)0xFFFF0000u);
    for (int g = 0; g < 32; g++) {
        __m512i z0, z1;
        PF(p + g * 64);
        fp8_line_bf16(t, p + g * 64, &z0, &z1, 0);
        _mm512_store_ps(wb + 4 * g, _mm512_castsi512_ps(_mm512_slli_epi32(z0, 16)));
        _mm512_store_ps(wb + 4 * g + 1, _mm512_castsi512_ps(_mm512_and_si512(z0, hm)));
        _mm512_store_ps(wb + 4 * g + 2, _mm512_castsi512_ps(_mm512_slli_epi32(z1, 16)));
        _mm512_store_ps(wb + 4 * g + 3, _mm512_castsi512_ps(_mm512_and_si512(z1, hm)));
    }
}

INL void fp8_f32_tok(const __m512 *wb, const float *x, int64_t ldx, const float *xs, int64_t ldxs, float s0,
                     int64_t kb, float *y, int64_t ldy, int first, unsigned csr, const int M) {
    __m512 acc[MTZ];
    #pragma GCC unroll 16
    for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
    _mm_setcsr((csr & ~(unsigned)MXCSR_RC) | MXCSR_SUMS);
    for (int k = 0; k < 128; k += 2) { /* the pair (k, k + 1): odd first, as vdpbf16ps */
        const __m512 w1 = _mm512_load_ps((const float *)(wb + k + 1)), w0 = _mm512_load_ps((const float *)(wb + k));
        #pragma GCC unroll 16
        for (int m = 0; m < M; m++)
            acc[m] = _mm512_fmadd_ps(w0, _mm512_set1_ps(x[m * ldx + k]),
                                     _mm512_fmadd_ps(w1, _mm512_set1_ps(x[m * ldx + k + 1]), acc[m]));
    }
    /* the sums are complete before MXCSR goes back (the asm takes them as inputs) */
    #pragma GCC unroll 16
    for (int m = 0; m < M; m++) __asm__ volatile("" : "+v"(acc[m]));
    _mm_setcsr(csr);
    #pragma GCC unroll 16
    for (int m = 0; m < M; m++) __asm__ volatile("" : "+v"(acc[m]));
    fp8_gemm_store(acc, s0, xs, ldxs, kb, y, ldy, first, M);
}

static void uk_fp8_f32_gemm(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                            void *scratch) {
    const fp8_lut lut = fp8_lut_load();
    const uint8_t *tile = W->data + (size_t)t * W->tile_bytes;
    const float *bs = W->tscale + t * (W->Kp / 128);
    const unsigned csr = _mm_getcsr();
    __m512 *wb = (__m512 *)scratch;          /* [128][16] fp32: 8 KiB */
    float *xf = (float *)scratch + 128 * 16; /* [MTZ][128] fp32 where x comes as bf16: 8 KiB */
    for (int64_t kb = 0; kb < W->Kp / 128; kb++) {
        fp8_blk_f32(&lut, tile + kb * 2048, wb);
        for (int64_t m0 = 0, mt; m0 < M; m0 += mt) {
            mt = token_block(M - m0, MTZ);
            const float *xm;
            int64_t ld;
            if (a->xw) {
                xm = a->xw + m0 * a->ldxw + kb * 128, ld = a->ldxw;
            } else {
                for (int64_t m = 0; m < mt; m++) {
                    const uint16_t *src = (const uint16_t *)a->x + (m0 + m) * a->ldx + kb * 128;
                    for (int i = 0; i < 128; i += 16) {
                        const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
                        _mm512_store_si512(xf + m * 128 + i, _mm512_slli_epi32(v, 16));
                    }
                }
                xm = xf, ld = 128;
            }
            const float *xsm = a->xs ? a->xs + m0 * a->ldxs : NULL;
#define CALL(n) fp8_f32_tok(wb, xm, ld, xsm, a->ldxs, bs[kb], kb, y + m0 * ldy, ldy, kb == 0, csr, n)
            DISPATCH_MT16(mt, CALL)
#undef CALL
        }
    }
    apply_post(y, ldy, M, a->post * W->scale2);
}

/* ---------------- NVFP4 ---------------- */
/* 16 E4M3 bytes -> 16 f32 equal to value * 2^-8 (f16 bit trick, exact). */
INL __m512 e4m3x16_f32(const uint8_t *p) {
    __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    w = _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16((short)0xBF80));
    return _mm512_cvtph_ps(w);
}

/* 2*e2m1(c) + 12 for c = 0..15: an unsigned byte in [0, 24]. */
static const uint8_t U8LUT[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};
/* bf16 bytes of e2m1(c): high byte (sign included) and low byte. */
static const uint8_t BHI[16] = {0x00, 0x3F, 0x3F, 0x3F, 0x40, 0x40, 0x40, 0x40,
                                0x80, 0xBF, 0xBF, 0xBF, 0xC0, 0xC0, 0xC0, 0xC0};
static const uint8_t BLO[16] = {0x00, 0x00, 0x80, 0xC0, 0x00, 0x40, 0x80, 0xC0,
                                0x00, 0x00, 0x80, 0xC0, 0x00, 0x40, 0x80, 0xC0};
INL __m512i lut16(const uint8_t *t) { return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)t)); }

/* Up to MT16 = 16 tokens per pass over the tile: the decode (4 vpermb, the
 * scales) and the tile's trip from L2 are shared by all of them.
 * G = 1: xs per 16-k block, folded into the scales per block. G = 8: xs equal
 * over each run of 8 blocks (mr_uk_act.xs_group, w4a8): the block sums go
 * into a per-run accumulator ga and xs costs one FMA per run, one FP-pipe op
 * less per token and block (bench/README.md). Above 8 tokens with G = 8,
 * ga[16] plus out[16] do not fit in 32 zmm, so out lives in y (read back
 * only after this call wrote it). */
INL void nvfp4_i8_body(const uint8_t *tile, int64_t Kp, const int8_t *xq, int64_t ldx, const int32_t *xb,
                       int64_t ldb, const float *xs, int64_t ldxs, float post, float *y, int64_t ldy, const int M,
                       const int G) {
    const __m512i lut = lut16(U8LUT);
    const uint8_t *scp = tile + 8 * Kp;
    const int omem = G > 1 && M > 8;
    const int64_t nblk = Kp / 16;
    __m512 out[MT16], ga[MT16], out1 = _mm512_setzero_ps();
    #pragma GCC unroll 16
    for (int m = 0; m < M; m++) out[m] = ga[m] = _mm512_setzero_ps();
    for (int64_t j = 0; j < nblk; j++) {
        PF_NV(tile + j * 128);
        PF_NV(tile + j * 128 + 64);
        if ((j & 3) == 0) PF(scp + 16 * j);
        __m512i v0 = _mm512_load_si512(tile + j * 128), v1 = _mm512_load_si512(tile + j * 128 + 64);
        /* vpermb reads 6 index bits and lut repeats the 16 entries 4 times, so
         * the nibbles need no mask */
        __m512i A = _mm512_permutexvar_epi8(v0, lut);
        __m512i B = _mm512_permutexvar_epi8(_mm512_srli_epi16(v0, 4), lut);
        __m512i C = _mm512_permutexvar_epi8(v1, lut);
        __m512i D = _mm512_permutexvar_epi8(_mm512_srli_epi16(v1, 4), lut);
        __m512 sc = e4m3x16_f32(scp + 16 * j);
        if (M == 1) { /* two int32 chains (exact) and two fp32 chains: shorter latency */
            const int8_t *x4 = xq + 16 * j;
            __m512i acc = _mm512_set1_epi32(xb[j]), acc2 = _mm512_setzero_si512();
            acc = _mm512_dpbusd_epi32(acc, A, _mm512_set1_epi32(ld32(x4)));
            acc2 = _mm512_dpbusd_epi32(acc2, B, _mm512_set1_epi32(ld32(x4 + 4)));
            acc = _mm512_dpbusd_epi32(acc, C, _mm512_set1_epi32(ld32(x4 + 8)));
            acc2 = _mm512_dpbusd_epi32(acc2, D, _mm512_set1_epi32(ld32(x4 + 12)));
            __m512 s = xs && G == 1 ? _mm512_mul_ps(sc, _mm512_set1_ps(xs[j])) : sc;
            __m512 v = _mm512_cvtepi32_ps(_mm512_add_epi32(acc, acc2));
            if (j & 1) out1 = _mm512_fmadd_ps(v, s, out1);
            else ga[0] = _mm512_fmadd_ps(v, s, ga[0]);
        } else {
            #pragma GCC unroll 16
            for (int m = 0; m < M; m++) {
                const int8_t *x4 = xq + m * ldx + 16 * j;
                __m512i acc = _mm512_set1_epi32(xb[m * ldb + j]);
                acc = _mm512_dpbusd_epi32(acc, A, _mm512_set1_epi32(ld32(x4)));
                acc = _mm512_dpbusd_epi32(acc, B, _mm512_set1_epi32(ld32(x4 + 4)));
                acc = _mm512_dpbusd_epi32(acc, C, _mm512_set1_epi32(ld32(x4 + 8)));
                acc = _mm512_dpbusd_epi32(acc, D, _mm512_set1_epi32(ld32(x4 + 12)));
                __m512 s = xs && G == 1 ? _mm512_mul_ps(sc, _mm512_set1_ps(xs[m * ldxs + j])) : sc;
                ga[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), s, ga[m]);
            }
        }
        if (G > 1 && ((j % G) == G - 1 || j == nblk - 1)) {
            if (M == 1) ga[0] = _mm512_add_ps(ga[0], out1), out1 = _mm512_setzero_ps();
            #pragma GCC unroll 16
            for (int m = 0; m < M; m++) {
                const __m512 xv = _mm512_set1_ps(xs ? xs[m * ldxs + j] : 1.0f);
                if (omem) {
                    const __m512 prev = j < G ? _mm512_setzero_ps() : _mm512_loadu_ps(y + m * ldy);
                    _mm512_storeu_ps(y + m * ldy, _mm512_fmadd_ps(ga[m], xv, prev));
                } else {
                    out[m] = _mm512_fmadd_ps(ga[m], xv, out[m]);
                }
                ga[m] = _mm512_setzero_ps();
            }
        }
    }
    /* the sums are of 2*e2m1(w)*x with scales * 2^-8: fold 2^8 / 2 = 128 */
    const __m512 f = _mm512_set1_ps(128.0f * post);
    if (G == 1 && M == 1) ga[0] = _mm512_add_ps(ga[0], out1);
    #pragma GCC unroll 16
    for (int m = 0; m < M; m++)
        _mm512_storeu_ps(y + m * ldy,
                         _mm512_mul_ps(G == 1 ? ga[m] : omem ? _mm512_loadu_ps(y + m * ldy) : out[m], f));
}

static void uk_nvfp4_i8(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                        void *scratch) {
    (void)scratch;
    const uint8_t *tile = W->data + (size_t)t * W->tile_bytes;
    const float post = a->post * W->scale2;
    const int grouped = a->xs_group == 8;
    for (int64_t m0 = 0, mt; m0 < M; m0 += mt) {
        mt = token_block(M - m0, MT16);
        const int8_t *x = (const int8_t *)a->x + m0 * a->ldx;
        const int32_t *xb = a->xb + m0 * a->ldb;
        const float *xs = a->xs ? a->xs + m0 * a->ldxs : NULL;
#define CALL(n)                                                                                                   \
    (grouped ? nvfp4_i8_body(tile, W->Kp, x, a->ldx, xb, a->ldb, xs, a->ldxs, post, y + m0 * ldy, ldy, n, 8)    \
             : nvfp4_i8_body(tile, W->Kp, x, a->ldx, xb, a->ldb, xs, a->ldxs, post, y + m0 * ldy, ldy, n, 1))
        DISPATCH_MT16(mt, CALL)
#undef CALL
    }
}

INL void nvfp4_bf16_body(const uint8_t *tile, int64_t Kp, const uint16_t *x, int64_t ldx, const float *xs,
                         int64_t ldxs, float post, float *y, int64_t ldy, const int M) {
    const __m512i lhi = lut16(BHI);
    const __m512i llo = lut16(BLO);
    const __m512i m0f = _mm512_set1_epi8(0x0F);
    const uint8_t *scp = tile + 8 * Kp;
    __m512 out[MT];
    #pragma GCC unroll 16
    for (int m = 0; m < M; m++) out[m] = _mm512_setzero_ps();
    for (int64_t j = 0; j < Kp / 16; j++) {
        __m512i z[8];
        #pragma GCC unroll 16
        for (int L = 0; L < 2; L++) {
            PF_NV(tile + j * 128 + 64 * L);
            if (L == 0 && (j & 3) == 0) PF(scp + 16 * j);
            __m512i v = _mm512_load_si512(tile + j * 128 + 64 * L);
            #pragma GCC unroll 16
            for (int h = 0; h < 2; h++) {
                __m512i n = _mm512_and_si512(h ? _mm512_srli_epi16(v, 4) : v, m0f);
                __m512i hi = _mm512_shuffle_epi8(lhi, n), lo = _mm512_shuffle_epi8(llo, n);
                z[4 * L + 2 * h] = _mm512_unpacklo_epi8(lo, hi);
                z[4 * L + 2 * h + 1] = _mm512_unpackhi_epi8(lo, hi);
            }
        }
        __m512 sc = e4m3x16_f32(scp + 16 * j);
        #pragma GCC unroll 16
        for (int m = 0; m < M; m++) {
            const uint16_t *xm = x + m * ldx + 16 * j;
            __m512 a0 = DP(_mm512_setzero_ps(), z[0], bcast_pair(xm));
            __m512 a1 = DP(_mm512_setzero_ps(), z[1], bcast_pair(xm + 2));
            #pragma GCC unroll 16
            for (int pr = 2; pr < 8; pr += 2) {
                a0 = DP(a0, z[pr], bcast_pair(xm + 2 * pr));
                a1 = DP(a1, z[pr + 1], bcast_pair(xm + 2 * pr + 2));
            }
            __m512 s = xs ? _mm512_mul_ps(sc, _mm512_set1_ps(xs[m * ldxs + j])) : sc;
            out[m] = _mm512_fmadd_ps(_mm512_add_ps(a0, a1), s, out[m]);
        }
    }
    const __m512 f = _mm512_set1_ps(256.0f * post);
    #pragma GCC unroll 16
    for (int m = 0; m < M; m++) _mm512_storeu_ps(y + m * ldy, _mm512_mul_ps(out[m], f));
}

static void uk_nvfp4_bf16(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                          void *scratch) {
    (void)scratch;
    const uint8_t *tile = W->data + (size_t)t * W->tile_bytes;
    const float post = a->post * W->scale2;
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
                   const int M) {
    /* 4 chains per token for M == 1, 2 for M <= 4, 1 above (latency vs registers) */
    enum { MAXC = 4 };
    const int nc = M == 1 ? 4 : M <= 4 ? 2 : 1;
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

static void uk_bf16_bf16(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                         void *scratch) {
    (void)scratch;
    const uint8_t *tile = W->data + (size_t)t * W->tile_bytes;
    for (int64_t m0 = 0, mt; m0 < M; m0 += mt) {
        mt = token_block(M - m0, MT16); /* 16 tokens a pass: half the weight traffic per FLOP of 8 */
        const uint16_t *x = (const uint16_t *)a->x + m0 * a->ldx;
#define CALL(n) bf16_body(tile, W->Kp, x, a->ldx, y + m0 * ldy, ldy, n)
        DISPATCH_MT16(mt, CALL)
#undef CALL
    }
    apply_post(y, ldy, M, a->post * W->scale2);
}

INL void bf16_f32_body(const uint8_t *tile, int64_t Kp, const float *x, int64_t ldx, float *y, int64_t ldy,
                       const int M) {
    const __m512i hm = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512 a0[MT], a1[MT];
    #pragma GCC unroll 16
    for (int m = 0; m < M; m++) a0[m] = a1[m] = _mm512_setzero_ps();
    for (int64_t g = 0; g < Kp / 2; g++) {
        if ((g & 1) == 0) PF(tile + g * 64);
        __m512i w = _mm512_load_si512(tile + g * 64);
        __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)), hi = _mm512_castsi512_ps(_mm512_and_si512(w, hm));
        #pragma GCC unroll 16
        for (int m = 0; m < M; m++) {
            a0[m] = _mm512_fmadd_ps(lo, _mm512_set1_ps(x[m * ldx + 2 * g]), a0[m]);
            a1[m] = _mm512_fmadd_ps(hi, _mm512_set1_ps(x[m * ldx + 2 * g + 1]), a1[m]);
        }
    }
    #pragma GCC unroll 16
    for (int m = 0; m < M; m++) _mm512_storeu_ps(y + m * ldy, _mm512_add_ps(a0[m], a1[m]));
}

static void uk_bf16_f32(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                        void *scratch) {
    (void)scratch;
    const uint8_t *tile = W->data + (size_t)t * W->tile_bytes;
    for (int64_t m0 = 0, mt; m0 < M; m0 += mt) {
        mt = token_block(M - m0, MT);
        const float *x = (const float *)a->x + m0 * a->ldx;
#define CALL(n) bf16_f32_body(tile, W->Kp, x, a->ldx, y + m0 * ldy, ldy, n)
        DISPATCH_MT(mt, CALL)
#undef CALL
    }
    apply_post(y, ldy, M, a->post * W->scale2);
}

/* benchmark isolation (kernels.h uk_stream): the tile read with zmm loads
 * and the kernels' prefetch, 4 lines per step, nothing computed */
static void uk_stream(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                      void *scratch) {
    (void)a;
    const uint8_t *p = W->data + (size_t)t * W->tile_bytes;
    const size_t n = W->tile_bytes / 64;
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        PF(p + i * 64);
        PF(p + i * 64 + 128);
        s0 = _mm512_add_epi64(s0, _mm512_load_si512(p + i * 64));
        s1 = _mm512_add_epi64(s1, _mm512_load_si512(p + i * 64 + 64));
        s2 = _mm512_add_epi64(s2, _mm512_load_si512(p + i * 64 + 128));
        s3 = _mm512_add_epi64(s3, _mm512_load_si512(p + i * 64 + 192));
    }
    for (; i < n; i++) s0 = _mm512_add_epi64(s0, _mm512_load_si512(p + i * 64));
    _mm512_store_si512(scratch, _mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
    for (int64_t m = 0; m < M; m++) _mm512_storeu_ps(y + m * ldy, _mm512_setzero_ps());
}

void mr__uk_fill_avx512(mr_kernels *k) {
    k->isa = "avx512";
    k->uk_gemv[MR_UK_FP8_BF16].name = "uk_fp8_bf16_avx512_16x8";
    k->uk_gemv[MR_UK_FP8_BF16].fn = uk_fp8_bf16_gemv;
    k->uk_gemm[MR_UK_FP8_BF16].name = "uk_fp8_bf16_avx512_l1_16x128x8";
    k->uk_gemm[MR_UK_FP8_BF16].fn = uk_fp8_bf16_gemm;
    k->uk_gemv[MR_UK_NVFP4_I8].name = k->uk_gemm[MR_UK_NVFP4_I8].name = "uk_nvfp4_i8_avx512_16x16";
    k->uk_gemv[MR_UK_NVFP4_I8].fn = k->uk_gemm[MR_UK_NVFP4_I8].fn = uk_nvfp4_i8;
    k->uk_gemv[MR_UK_NVFP4_BF16].name = k->uk_gemm[MR_UK_NVFP4_BF16].name = "uk_nvfp4_bf16_avx512_16x8";
    k->uk_gemv[MR_UK_NVFP4_BF16].fn = k->uk_gemm[MR_UK_NVFP4_BF16].fn = uk_nvfp4_bf16;
    k->uk_gemv[MR_UK_BF16_BF16].name = k->uk_gemm[MR_UK_BF16_BF16].name = "uk_bf16_bf16_avx512_16x16";
    k->uk_gemv[MR_UK_BF16_BF16].fn = k->uk_gemm[MR_UK_BF16_BF16].fn = uk_bf16_bf16;
    k->uk_gemv[MR_UK_BF16_F32].name = k->uk_gemm[MR_UK_BF16_F32].name = "uk_bf16_f32_avx512_16x8";
    k->uk_gemv[MR_UK_BF16_F32].fn = k->uk_gemm[MR_UK_BF16_F32].fn = uk_bf16_f32;
    k->uk_gemm_min_m = 16; /* dev/perf: fp8.v3 equals v1 at 16 tokens per expert and wins above */
    for (int i = 0; i < MR_UK_COUNT; i++) /* these take bf16 x as it is (vdpbf16ps); the AVX2 level below set it */
        k->uk_gemm_xw[i] = false;
    if (k->flags & MR_CPU_AVX512FP16) { /* Intel since Sapphire Rapids: same bits, fp32 FMAs (above) */
        k->uk_gemm[MR_UK_FP8_BF16].name = "uk_fp8_f32_avx512_l1_16x128x16";
        k->uk_gemm[MR_UK_FP8_BF16].fn = uk_fp8_f32_gemm;
        k->uk_gemm_xw[MR_UK_FP8_BF16] = true; /* x widened once per expert chunk */
        /* from 6 tokens an expert (bench moe: T = 256 / 512 -8% / -14% against 16). A gemv
         * call of 5+ tokens sums as the gemm does (fp8_gemv_body), so this changes no result */
        k->uk_gemm_min_m = 6;
    }
    static const mr_pack_id pk[MR_UK_COUNT] = {MR_PACK_FP8_R16K4, MR_PACK_NVFP4_R16K16, MR_PACK_NVFP4_R16K16B,
                                                MR_PACK_BF16_R16K2, MR_PACK_BF16_R16K2};
    static const mr_probe_instr in[MR_UK_COUNT] = {MR_PROBE_DPBF16, MR_PROBE_DPBUSD, MR_PROBE_DPBF16,
                                                   MR_PROBE_DPBF16, MR_PROBE_FMA};
    for (int i = 0; i < MR_UK_COUNT; i++) k->uk_pack[i] = pk[i], k->uk_instr[i] = in[i];
    if (k->flags & MR_CPU_AVX512FP16) k->uk_instr[MR_UK_FP8_BF16] = MR_PROBE_FMA; /* its gemm's (the gemv's: vdpbf16ps) */
    k->uk_stream.name = "uk_stream_avx512";
    k->uk_stream.fn = uk_stream;
}
