/* uk_avx512bf16.c — the AVX-512 level's bf16-pair-dot kernels on vdpbf16ps,
 * where the CPU has AVX512-BF16 (an extension the level does not require,
 * mr_kernels.flags): the bodies of uk_avx512.h with DP = vdpbf16ps; the fp8
 * gemv (dev fp8.v1: 2 vdpbf16ps per token per line, 1 token: 2 lines a step
 * into 4 chains, +14% hot); the fp8 gemm that decodes a 16x128 block to bf16
 * once into scratch (L1), then 8-token blocks of 1 load + 8 vdpbf16ps (dev
 * fp8.v3). The level's FMA kernels (uk_avx512.c) keep these kernels' chains,
 * so they give the same sums (the fp8 gemv bit for bit; the others away from
 * fp32 denormals). On Intel's cores since Sapphire Rapids (AVX512-FP16)
 * vdpbf16ps zmm issues at half the rate of vfmadd231ps zmm, so there the
 * level's fp32-FMA fp8 gemm stays (same bits). */
#include <immintrin.h>

#define DP(acc, w, xv) _mm512_dpbf16_ps((acc), (__m512bh)(w), (__m512bh)(xv))
#include "kernels/uk_avx512.h"

/* ONE 0 (with TWO 0): one chain a token at every count (the batch-invariant uk_fp8_bf16_inv) */
INL void fp8_gemv_body(const uint8_t *tile, const float *bs, int64_t Kp, const uint16_t *x, int64_t ldx,
                       const float *xs, int64_t ldxs, float *y, int64_t ldy, const int M, const int TWO,
                       const int ONE) {
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
        if (M == 1 && ONE) { /* 4 chains over 2 lines, w pinned: +14% hot (bench/README.md) */
            __m512 a23[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
            for (int g = 0; g < 32; g += 2) {
                __m512i z0, z1, z2, z3;
                PF_FP8(p + g * 64);
                PF_FP8(p + g * 64 + 64);
                fp8_line_bf16(&t, p + g * 64, &z0, &z1, 1);
                fp8_line_bf16(&t, p + g * 64 + 64, &z2, &z3, 1);
                const uint16_t *xm = x + kb * 128 + 4 * g;
                a0[0] = DP(a0[0], z0, bcast_pair(xm));
                a1[0] = DP(a1[0], z1, bcast_pair(xm + 2));
                a23[0] = DP(a23[0], z2, bcast_pair(xm + 4));
                a23[1] = DP(a23[1], z3, bcast_pair(xm + 6));
            }
            a0[0] = _mm512_add_ps(a0[0], a23[0]);
            a1[0] = _mm512_add_ps(a1[0], a23[1]);
        }
        for (int g = 0; (M > 1 || !ONE) && g < 32; g++) {
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

INL void fp8_bf16_gemv_run(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                           const int ONE) {
    const uint8_t *tile = W->data + (size_t)t * W->tile_bytes;
    const float *bs = W->tscale + t * (W->Kp / 128);
    for (int64_t m0 = 0, mt; m0 < M; m0 += mt) {
        mt = token_block(M - m0, MT);
        const uint16_t *x = (const uint16_t *)a->x + m0 * a->ldx;
        const float *xs = a->xs ? a->xs + m0 * a->ldxs : NULL;
#define CALL(n) fp8_gemv_body(tile, bs, W->Kp, x, a->ldx, xs, a->ldxs, y + m0 * ldy, ldy, n, 1, 1)
#define CALL1(n) fp8_gemv_body(tile, bs, W->Kp, x, a->ldx, xs, a->ldxs, y + m0 * ldy, ldy, n, 0, ONE)
        if (M <= 4 && ONE) {
            DISPATCH_MT(mt, CALL)
        } else {
            DISPATCH_MT(mt, CALL1)
        }
#undef CALL
#undef CALL1
    }
    apply_post(y, ldy, M, a->post * W->scale2);
}
static void uk_fp8_bf16_gemv(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                             void *scratch) {
    (void)scratch;
    fp8_bf16_gemv_run(W, t, a, M, y, ldy, 1);
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
        fp8_block_pairs(&lut, tile + kb * 2048, b, 0);
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

/* the batch-invariant fp8 kernel (mr_kernels.uk_inv) of this table without AVX512-FP16: below the
 * gemm threshold the gemv with one chain a token at every count (its sums are the gemm's, above),
 * the gemm from there */
enum { FP8_BF16_GEMM_MIN_M = 16 };
static void uk_fp8_bf16_inv(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                            void *scratch) {
    if (M < FP8_BF16_GEMM_MIN_M)
        fp8_bf16_gemv_run(W, t, a, M, y, ldy, 0);
    else
        uk_fp8_bf16_gemm(W, t, a, M, y, ldy, scratch);
}


void mr__uk_fill_avx512bf16(mr_kernels *k) {
    k->uk_gemv[MR_UK_FP8_BF16].name = "uk_fp8_bf16_avx512_16x8";
    k->uk_gemv[MR_UK_FP8_BF16].fn = uk_fp8_bf16_gemv;
    k->uk_gemv[MR_UK_NVFP4_BF16].name = k->uk_gemm[MR_UK_NVFP4_BF16].name = "uk_nvfp4_bf16_avx512_16x8";
    k->uk_gemv[MR_UK_NVFP4_BF16].fn = k->uk_gemm[MR_UK_NVFP4_BF16].fn = uk_nvfp4_bf16;
    k->uk_gemv[MR_UK_BF16_BF16].name = k->uk_gemm[MR_UK_BF16_BF16].name = "uk_bf16_bf16_avx512_16x16";
    k->uk_gemv[MR_UK_BF16_BF16].fn = k->uk_gemm[MR_UK_BF16_BF16].fn = uk_bf16_bf16;
    k->uk_inv[MR_UK_NVFP4_BF16] = k->uk_gemm[MR_UK_NVFP4_BF16];
    k->uk_inv[MR_UK_BF16_BF16].name = "uk_bf16_bf16_avx512_16x16_inv";
    k->uk_inv[MR_UK_BF16_BF16].fn = uk_bf16_bf16_inv;
    k->uk_instr[MR_UK_FP8_BF16] = k->uk_instr[MR_UK_NVFP4_BF16] = k->uk_instr[MR_UK_BF16_BF16] = MR_PROBE_DPBF16;
    if (k->flags & MR_CPU_AVX512FP16) { /* Intel since Sapphire Rapids: the level's fp32-FMA gemm */
        k->uk_instr[MR_UK_FP8_BF16] = MR_PROBE_FMA; /* its gemm's (the gemv's: vdpbf16ps) */
        return;
    }
    k->uk_gemm[MR_UK_FP8_BF16].name = "uk_fp8_bf16_avx512_l1_16x128x8";
    k->uk_gemm[MR_UK_FP8_BF16].fn = uk_fp8_bf16_gemm;
    k->uk_inv[MR_UK_FP8_BF16] = (mr_uk_entry){"uk_fp8_bf16_avx512_16x8_l1_16x128x8_inv", uk_fp8_bf16_inv};
    k->uk_gemm_xw[MR_UK_FP8_BF16] = false; /* it takes bf16 x as it is */
    k->uk_gemm_min_m = FP8_BF16_GEMM_MIN_M; /* dev/perf: fp8.v3 equals v1 at 16 tokens per expert and wins above */
}
