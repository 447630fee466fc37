/* uk_avx2.h — private to src/kernels: the helpers the AVX2 micro-kernel
 * files share (uk_avx2.c, uk_avx2vnni.c): prefetch macros, the per-row
 * update of y, E4M3 row scales by the f16 trick, a 16-byte LUT in both lanes.
 * Included only by files compiled with the AVX2 flags (CMakeLists.txt). */
#ifndef MR_UK_AVX2_H
#define MR_UK_AVX2_H

#include <immintrin.h>
#include <string.h>

#include "kernels/kern_internal.h"

#define INL static inline __attribute__((always_inline))
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

/* uk_avx2.c's NVFP4 bf16-activation pieces that uk_avx2_nvw.h calls: the
 * fp32 gemv (the kind's gemv without mr_uk_act.xq), and one 16-k block of a
 * tile from bf16 x on fp32 FMAs (the unscaled sums of rows 0-7 / 8-15) */
void mr__nvf_gemv_fp(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                     void *scratch);
void mr__nvf_block_fp(const uint8_t *tile, int64_t j, const uint16_t *x16, __m256 *f0, __m256 *f1);

#endif
