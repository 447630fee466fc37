/* uk_avx2.h — private to src/kernels: the helpers the AVX2 micro-kernel
 * files share (uk_avx2.c, uk_avx2vnni.c, dense_avx2.c): prefetch macros, the
 * per-row update of y, E4M3 row scales by the f16 trick, a 16-byte LUT in
 * both lanes, the NVFP4 int8 kernel's pair sums, the fp8_y16 and bf16_r16k2
 * tile decoders.
 * Included only by files compiled with the AVX2 flags (CMakeLists.txt; and
 * dev/perf/nvi_cost.c, its Makefile's). */
#ifndef MR_UK_AVX2_H
#define MR_UK_AVX2_H

#include <immintrin.h>
#include <string.h>

#include "kernels/kern_internal.h"

#define INL static inline __attribute__((always_inline))
/* An integer running sum (acc = acc + dot, chain after chain) is exact in
 * any order, so gcc's reassociation is free to turn the chains of a block
 * into trees: every product first, held on the stack, then the adds.
 * MR_KEEP2 after each add pins the two chains as written (an empty asm that
 * "changes" them); with it the AVX2 w4a16 gemv at 2-4 tokens ran 13-26%
 * faster, the int8 gemm at 16 tokens ~7% (hot_uk, bench/README.md). */
#define MR_KEEP2(a, b) __asm__("" : "+x"(a), "+x"(b))
#define PF(p) _mm_prefetch((const char *)(p) + MR_UK_PREFETCH, _MM_HINT_T2)
/* The L1 prefetches that won the interleaved A/B rounds of the AVX-512
 * kernels on this memory system (uk_avx512.c, bench/README.md), kept for the
 * same streams here: fp8 gemv 4 KiB ahead into L1 instead of PF; nvfp4 PF
 * plus 2 KiB ahead into L1; bf16 PF only. */
#define PF_L1(p, d) _mm_prefetch((const char *)(p) + (d), _MM_HINT_T0)
#define PF_FP8(p) PF_L1(p, 4096)
#define PF_NV(p) (PF(p), PF_L1(p, 2048))

static inline void apply_post(float *y, int64_t ldy, int64_t M, float post) {
    if (post == 1.0f) return;
    const __m256 p = _mm256_set1_ps(post);
    for (int64_t m = 0; m < M; m++) {
        _mm256_storeu_ps(y + m * ldy, _mm256_mul_ps(_mm256_loadu_ps(y + m * ldy), p));
        _mm256_storeu_ps(y + m * ldy + 8, _mm256_mul_ps(_mm256_loadu_ps(y + m * ldy + 8), p));
    }
}

/* y[0..15] = first ? a * s : y + a * s (two ymm of rows 0-7 and 8-15) */
INL void y_update(float *y, __m256 a0, __m256 a1, __m256 s0, __m256 s1, int first) {
    if (first) {
        _mm256_storeu_ps(y, _mm256_mul_ps(a0, s0));
        _mm256_storeu_ps(y + 8, _mm256_mul_ps(a1, s1));
    } else {
        _mm256_storeu_ps(y, _mm256_fmadd_ps(a0, s0, _mm256_loadu_ps(y)));
        _mm256_storeu_ps(y + 8, _mm256_fmadd_ps(a1, s1, _mm256_loadu_ps(y + 8)));
    }
}

/* 16 E4M3 bytes (16-byte aligned) -> rows 0-7 and 8-15 as fp32 * 2^-8: the
 * f16 bit trick (sign to bit 15, exponent and mantissa shifted by 7) is exact
 * for every code but the NaN codes 0x7F / 0xFF (they give +-480 * 2^-8).
 * tests/test_kernels.c pushes all 256 codes through every table. */
INL void e4m3x16(const uint8_t *p, __m256 *lo, __m256 *hi) {
    __m256i w = _mm256_cvtepi8_epi16(_mm_load_si128((const __m128i *)p));
    w = _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16((short)0xBF80));
    *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(w));
    *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(w, 1));
}

INL __m256i lut16(const uint8_t *t) { return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)t)); }

/* the NVFP4 int8 kernel's sums of one token over one 16-k block (uk_avx2.c
 * nvi_token; dev/perf/nvi_cost.c times the tails after it): the dword of the
 * 4 activations a vector meets is broadcast (a load, no shuffle), each
 * vpmaddubsw of the u8 weights U gives int16 lanes (row, pair of k), and four
 * of them sum without overflow (|.| <= 4 * 6144), as two chains pinned by
 * MR_KEEP2: *a rows 0-7, *b rows 8-15 */
INL void nvi_pairs(const __m256i U[8], const int8_t *x16, __m256i *a, __m256i *b) {
    __m256i sa = _mm256_setzero_si256(), sb = sa;
    #pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        int32_t x4;
        memcpy(&x4, x16 + 4 * v, 4);
        const __m256i X = _mm256_set1_epi32(x4);
        sa = _mm256_add_epi16(sa, _mm256_maddubs_epi16(U[v], X));
        sb = _mm256_add_epi16(sb, _mm256_maddubs_epi16(U[4 + v], X));
        MR_KEEP2(sa, sb);
    }
    *a = sa, *b = sb;
}

/* ---- the FP8 (fp8_y16) and BF16 (bf16_r16k2) tile decoders of uk_avx2.c's kernels and
 * dense_avx2.c's rows_f32 ---- */
/* 32 E4M3 bytes of a k pair (byte j of dword i: row i + 8 (j & 1), k + (j >>
 * 1)) -> o[0] / o[1] rows 0-7 / 8-15 at k, o[2] / o[3] at k + 1, as fp32 *
 * 2^-120, integer ops only, each output an and with 0x87F00000 (sign to bit
 * 31, exponent and mantissa to 26..20) of one op that puts its byte there:
 * the high byte of each word by vpsraw 4 (bytes 3; bytes 2 after vpsllw 8)
 * or by vpmaddwd with (4096, 0), the low word sign-extended times 2^12
 * (bytes 1; bytes 0 after the same vpsllw): per 16 weights 4.5 ops beside
 * the two FMAs, against 5 and a reorder for a vpmovsxbw form. On Zen 4 the
 * shifts and ands run beside the FMAs, the two vpmaddwd on their ports, as
 * vpmovsxbw did (bench/README.md, "AVX2 kernels on Zen 4").
 * Exact for every code but the NaN codes: E4M3 subnormals land on fp32
 * subnormals with the same 2^-120 ratio. */
INL void e4m3x32_d(const uint8_t *p, __m256 o[4]) {
    const __m256i mk = _mm256_set1_epi32((int)0x87F00000u), lo12 = _mm256_set1_epi32(4096);
    const __m256i v = _mm256_load_si256((const __m256i *)p), t = _mm256_slli_epi16(v, 8);
    o[0] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_madd_epi16(t, lo12), mk));
    o[1] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_madd_epi16(v, lo12), mk));
    o[2] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi16(t, 4), mk));
    o[3] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi16(v, 4), mk));
}

/* the same as fp32 * 2^-8 (the scale of the f16 trick, e4m3x16): exact, the
 * subnormal results of e4m3x32_d times a power of two land on normals */
INL void e4m3x32_s8(const uint8_t *p, __m256 o[4]) {
    const __m256 up = _mm256_set1_ps(0x1p112f);
    e4m3x32_d(p, o);
    #pragma GCC unroll 4
    for (int i = 0; i < 4; i++) o[i] = _mm256_mul_ps(o[i], up);
}

/* the same as fp32 * 2^-8 without an fp32 subnormal anywhere (for the blocks
 * mr_pmatrix.tsub marks: an FMA or multiply on a subnormal operand takes a
 * microcode assist on Intel cores, ~30 cycles an FMA, bench/README.md "FP8
 * and subnormals on Intel"): exponents 1..15 by an integer add to the
 * exponent field, exponent 0 (zero and the subnormals, m * 2^-9) from the
 * integer m * 2^20 converted and scaled by 2^-37, both exact. */
INL void e4m3x32_x(const uint8_t *p, __m256 o[4]) {
    const __m256i up = _mm256_set1_epi32(112 << 23), ex = _mm256_set1_epi32(0x07800000);
    const __m256i mag = _mm256_set1_epi32(0x7FFFFFFF), sg = _mm256_set1_epi32((int)0x80000000u);
    const __m256 dn = _mm256_set1_ps(0x1p-37f);
    e4m3x32_d(p, o);
    #pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        const __m256i g = _mm256_castps_si256(o[i]);
        const __m256 nrm = _mm256_castsi256_ps(_mm256_add_epi32(g, up));
        const __m256 sub = _mm256_or_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(g, mag)), dn),
                                        _mm256_castsi256_ps(_mm256_and_si256(g, sg)));
        const __m256i z = _mm256_cmpeq_epi32(_mm256_and_si256(g, ex), _mm256_setzero_si256());
        o[i] = _mm256_blendv_ps(nrm, sub, _mm256_castsi256_ps(z));
    }
}

/* a 16 x 128 block to fp32 in scratch by form D: 0 e4m3x32_s8 (* 2^-8), 1 e4m3x32_d (* 2^-120,
 * for x times 2^112), 2 e4m3x32_x (* 2^-8 without an fp32 subnormal) */
INL void fp8_decode_blk(const uint8_t *p, float *wb, const int D) {
    for (int k = 0; k < 128; k += 2) {
        if ((k & 3) == 0) PF(p + 16 * k);
        __m256 o[4];
        if (D == 1)
            e4m3x32_d(p + 16 * k, o);
        else if (D == 2)
            e4m3x32_x(p + 16 * k, o);
        else
            e4m3x32_s8(p + 16 * k, o);
        #pragma GCC unroll 4
        for (int i = 0; i < 4; i++) _mm256_store_ps(wb + 16 * k + 8 * i, o[i]);
    }
}

/* bf16_r16k2 pair g: rows 0-7 / 8-15 at k = 2g (lo) and 2g + 1 (hi), exact */
INL void bf16_pair(const uint8_t *line, __m256 *l0, __m256 *l1, __m256 *h0, __m256 *h1) {
    const __m256i hm = _mm256_set1_epi32((int)0xFFFF0000u);
    const __m256i v0 = _mm256_load_si256((const __m256i *)line), v1 = _mm256_load_si256((const __m256i *)(line + 32));
    *l0 = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16));
    *h0 = _mm256_castsi256_ps(_mm256_and_si256(v0, hm));
    *l1 = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16));
    *h1 = _mm256_castsi256_ps(_mm256_and_si256(v1, hm));
}

/* uk_avx2.c's NVFP4 bf16-activation pieces that uk_avx2_nvw.h calls: the
 * fp32 gemv (the kind's gemv without mr_uk_act.xq), and one 16-k block of a
 * tile from bf16 x on fp32 FMAs (the unscaled sums of rows 0-7 / 8-15) */
void mr__nvf_gemv_fp(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                     void *scratch);
void mr__nvf_block_fp(const uint8_t *tile, int64_t j, const uint16_t *x16, __m256 *f0, __m256 *f1);

#endif
