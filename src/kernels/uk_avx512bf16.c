/* uk_avx512bf16.c — the AVX-512 level's bf16-pair-dot kernels on vdpbf16ps,
 * where the CPU has AVX512-BF16 (an extension the level does not require,
 * mr_kernels.flags): the bodies of uk_avx512.h with DP = vdpbf16ps, and the
 * fp8 gemm that decodes a 16x128 block to bf16 once into scratch (L1), then
 * 8-token blocks of 1 load + 8 vdpbf16ps (dev fp8.v3). On Intel's cores
 * since Sapphire Rapids (AVX512-FP16) vdpbf16ps zmm issues at half the rate
 * of vfmadd231ps zmm, so there the level's fp32-FMA fp8 gemm stays (same
 * bits). */
#include <immintrin.h>

#define DP(acc, w, xv) _mm512_dpbf16_ps((acc), (__m512bh)(w), (__m512bh)(xv))
#define DP_MXCSR 0
#include "kernels/uk_avx512.h"

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


void mr__uk_fill_avx512bf16(mr_kernels *k) {
    k->uk_gemv[MR_UK_FP8_BF16].name = "uk_fp8_bf16_avx512_16x8";
    k->uk_gemv[MR_UK_FP8_BF16].fn = uk_fp8_bf16_gemv;
    k->uk_gemv[MR_UK_NVFP4_BF16].name = k->uk_gemm[MR_UK_NVFP4_BF16].name = "uk_nvfp4_bf16_avx512_16x8";
    k->uk_gemv[MR_UK_NVFP4_BF16].fn = k->uk_gemm[MR_UK_NVFP4_BF16].fn = uk_nvfp4_bf16;
    k->uk_gemv[MR_UK_BF16_BF16].name = k->uk_gemm[MR_UK_BF16_BF16].name = "uk_bf16_bf16_avx512_16x16";
    k->uk_gemv[MR_UK_BF16_BF16].fn = k->uk_gemm[MR_UK_BF16_BF16].fn = uk_bf16_bf16;
    k->uk_instr[MR_UK_FP8_BF16] = k->uk_instr[MR_UK_NVFP4_BF16] = k->uk_instr[MR_UK_BF16_BF16] = MR_PROBE_DPBF16;
    if (k->flags & MR_CPU_AVX512FP16) { /* Intel since Sapphire Rapids: the level's fp32-FMA gemm */
        k->uk_instr[MR_UK_FP8_BF16] = MR_PROBE_FMA; /* its gemm's (the gemv's: vdpbf16ps) */
        return;
    }
    k->uk_gemm[MR_UK_FP8_BF16].name = "uk_fp8_bf16_avx512_l1_16x128x8";
    k->uk_gemm[MR_UK_FP8_BF16].fn = uk_fp8_bf16_gemm;
    k->uk_gemm_xw[MR_UK_FP8_BF16] = false; /* it takes bf16 x as it is */
    k->uk_gemm_min_m = 16; /* dev/perf: fp8.v3 equals v1 at 16 tokens per expert and wins above */
}
