/* uk_avx2.c — AVX2+FMA packed micro-kernels: the generic driver of uk.c
 * (scalar block decode into L1) with an AVX2 stage: 16 rows as two ymm
 * accumulator pairs, one broadcast activation and two FMAs per k. Same
 * contract as every packed kernel (moerun/kernels.h). */
#include <immintrin.h>

#include "kernels/kern_internal.h"

static void stage_avx2(const float *w, const float *x, int nk, float *acc) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
    int k = 0;
    for (; k + 2 <= nk; k += 2) {
        __m256 x0 = _mm256_broadcast_ss(x + k), x1 = _mm256_broadcast_ss(x + k + 1);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k * 16), x0, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k * 16 + 8), x0, a1);
        b0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k * 16 + 16), x1, b0);
        b1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k * 16 + 24), x1, b1);
    }
    for (; k < nk; k++) {
        __m256 x0 = _mm256_broadcast_ss(x + k);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k * 16), x0, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k * 16 + 8), x0, a1);
    }
    _mm256_storeu_ps(acc, _mm256_add_ps(_mm256_loadu_ps(acc), _mm256_add_ps(a0, b0)));
    _mm256_storeu_ps(acc + 8, _mm256_add_ps(_mm256_loadu_ps(acc + 8), _mm256_add_ps(a1, b1)));
}

#define GEN(kind, fname)                                                                                           \
    static void fname(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,        \
                      void *scratch) {                                                                             \
        mr__uk_drive(kind, W, t, a, M, y, ldy, scratch, stage_avx2);                                               \
    }
GEN(MR_UK_FP8_BF16, uk_fp8_bf16_avx2)
GEN(MR_UK_NVFP4_I8, uk_nvfp4_i8_avx2)
GEN(MR_UK_NVFP4_BF16, uk_nvfp4_bf16_avx2)
GEN(MR_UK_BF16_BF16, uk_bf16_bf16_avx2)
GEN(MR_UK_BF16_F32, uk_bf16_f32_avx2)
#undef GEN

void mr__uk_fill_avx2(mr_kernels *k) {
    static const struct {
        const char *name;
        mr_uk_fn fn;
    } e[MR_UK_COUNT] = {
        {"uk_fp8_bf16_avx2_16x128", uk_fp8_bf16_avx2},   {"uk_nvfp4_i8_avx2_16x16", uk_nvfp4_i8_avx2},
        {"uk_nvfp4_bf16_avx2_16x16", uk_nvfp4_bf16_avx2}, {"uk_bf16_bf16_avx2_16x64", uk_bf16_bf16_avx2},
        {"uk_bf16_f32_avx2_16x64", uk_bf16_f32_avx2},
    };
    for (int i = 0; i < MR_UK_COUNT; i++) {
        k->uk_gemv[i].name = k->uk_gemm[i].name = e[i].name;
        k->uk_gemv[i].fn = k->uk_gemm[i].fn = e[i].fn;
    }
}
