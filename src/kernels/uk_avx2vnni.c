/* uk_avx2vnni.c — the AVX2 table's NVFP4 int8-activation kernel (layout
 * nvfp4_y16i) on AVX-VNNI: the VEX-encoded vpdpbusd ymm of Intel cores since
 * Alder Lake / Sapphire Rapids and of Zen 5, which this file alone is compiled
 * for (CMakeLists.txt: *_avx2vnni.c). It replaces uk_avx2.c's vpmaddubsw
 * token step, and the vpmaddwd + vpaddd pair dots of the bf16-activation
 * gemv on fixed-point input (uk_avx2_nvw.h) by vpdpwssd; nothing else. The
 * int8 kernel: per token and 16-k block, 8 vpdpbusd into two int32
 * accumulators that start at xb = -12*sum(x) (the bias of the u8 weights),
 * where vpmaddubsw needs 8 of those, 6 vpaddw, 2 vpmaddwd and 2 vpaddd on
 * the same ports. The integer sums are exact either way (no
 * saturation: |2*e2m1| <= 12 and |x| <= 127), so the two kernels give
 * bit-identical outputs; tests/test_kernels.c checks this one against the
 * double reference and against the vpmaddubsw table. isa.c installs it over
 * uk_avx2.c's entry where the table's CPU flags hold MR_CPU_AVXVNNI. */
#include "kernels/uk_avx2.h"

/* rows 0-7 / 8-15 of one token over block U: each dword lane of U[v] holds
 * one row's 4 k (u8), the broadcast dword of the token's 4 activations at
 * those k is the s8 operand */
INL void nvi_token_vnni(const __m256i U[8], const int8_t *x16, const int32_t *xb, __m256 *f0, __m256 *f1) {
    __m256i a = _mm256_set1_epi32(*xb), b = a;
    #pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        int32_t x4;
        memcpy(&x4, x16 + 4 * v, 4);
        const __m256i X = _mm256_set1_epi32(x4);
        a = _mm256_dpbusd_avx_epi32(a, U[v], X);
        b = _mm256_dpbusd_avx_epi32(b, U[4 + v], X);
    }
    *f0 = _mm256_cvtepi32_ps(a);
    *f1 = _mm256_cvtepi32_ps(b);
}

#define NVI_TOKEN nvi_token_vnni
#define NVI_KERNEL uk_nvfp4_i8_vnni
#include "kernels/uk_avx2_nvi.h"

#define NVW_DP(acc, w, x) _mm256_dpwssd_avx_epi32((acc), (w), (x))
#define NVW_GEMV uk_nvfp4_bf16_gemv_xq_vnni
#include "kernels/uk_avx2_nvw.h"

void mr__uk_fill_avx2vnni(mr_kernels *k) {
    k->uk_gemv[MR_UK_NVFP4_I8].name = "uk_nvfp4_i8_avx2vnni_16x1";
    k->uk_gemv[MR_UK_NVFP4_I8].fn = uk_nvfp4_i8_vnni;
    k->uk_gemm[MR_UK_NVFP4_I8].name = "uk_nvfp4_i8_avx2vnni_16xM";
    k->uk_gemm[MR_UK_NVFP4_I8].fn = uk_nvfp4_i8_vnni;
    k->uk_inv[MR_UK_NVFP4_I8] = k->uk_gemm[MR_UK_NVFP4_I8];
    k->uk_instr[MR_UK_NVFP4_I8] = MR_PROBE_DPBUSD_YMM;
    k->uk_gemv[MR_UK_NVFP4_BF16].name = "uk_nvfp4_bf16_avx2vnni_16x4";
    k->uk_gemv[MR_UK_NVFP4_BF16].fn = uk_nvfp4_bf16_gemv_xq_vnni;
}
