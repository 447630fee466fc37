/* uk_avx512.c — the AVX-512 level's packed micro-kernels (F/BW/VL/DQ, VNNI,
 * VBMI; no BF16 needed), the winners of dev/perf (README there), behind the
 * contract of moerun/kernels.h (one 16-row tile, all of Kp, any M, y written
 * not read). The bf16-pair-dot kernels are written once in uk_avx512.h; here
 * their dot is two vfmadd231ps (odd product, then even), and
 * uk_avx512bf16.c puts vdpbf16ps in their place where the CPU has
 * AVX512-BF16 (the same sums, see uk_avx512.h):
 *  fp8_f32 gemv   E4M3 -> bf16 by two 128-entry vpermi2b byte LUTs (dev
 *                 fp8.v1), each line split into 4 fp32 k vectors, 4 FMAs a
 *                 token with x widened once per 128 k; tokens in register
 *                 blocks of 8; block multiplier by one FMA per 128 k; 1
 *                 token: 2 lines a step into 4 chains;
 *  fp8_f32 gemm   the 16x128 block decoded once through the bf16 LUT and
 *                 widened to fp32 in L1, 16-token blocks, 1 load + 16
 *                 vfmadd231ps a k (below); the sums of the vdpbf16ps gemm
 *                 bit for bit;
 *  nvfp4_i8       (dev nvfp4.v1) vpermb nibble -> u8 = 2*e2m1 + 12 (vpermb
 *                 instead of and + vpshufb; 1 token: split chains; up to
 *                 16 tokens a pass, xs once per 128 for w4a8),
 *                 vpdpbusd with broadcast int8 activations; the int32 sum of
 *                 a 16-k block starts at xb = -12*sum(x) (removes the bias),
 *                 then vcvtdq2ps and one FMA with the 16 row scales (E4M3 by
 *                 the exact f16 bit trick) times the activation multiplier;
 *  nvfp4 w4a16    (dev nvfp4.v2) two vpshufb LUTs give the bf16 bytes of
 *                 E2M1, the pair dot per block, FMA with the scales; the
 *                 gemv on fixed-point x (mr_uk_act.xq) instead: one vpshufb
 *                 to int8, two unpacks to int16, 8 vpdpwssd per token and
 *                 block (uk_avx512.h, nvfp4_fixq_body; T = 1 from 77-84% to
 *                 92-98% of the stream-only read, bench/README.md);
 *  bf16 x bf16    (dev bf16.v1) the pair dot per token per line; up to 16
 *                 tokens a pass (T = 512: from 55% to 74% of peak);
 *  bf16_f32       bf16 pairs widened exactly to fp32 (shift / mask),
 *                 vfmadd231ps with broadcast fp32 activations.
 * All weight streams are prefetched 16 KiB ahead into L2 (_MM_HINT_T2): the
 * measured difference between 71% and 92-98% of read bandwidth at T = 1;
 * the fp8 and nvfp4 kernels also prefetch into L1 (PF_FP8, PF_NV). */
#include <immintrin.h>

/* the bf16 pair dot on fp32 FMAs: acc + w_odd * x_odd, then + w_even * x_even (the low
 * half of a dword is the even k), each rounded, as vdpbf16ps adds them */
static inline __attribute__((always_inline)) __m512 dp_fma(__m512 acc, __m512i w, __m512 xv) {
    const __m512i hm = _mm512_set1_epi32((int)0xFFFF0000u);
    const __m512i xi = _mm512_castps_si512(xv);
    acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(w, hm)), _mm512_castsi512_ps(_mm512_and_si512(xi, hm)),
                          acc);
    return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)), _mm512_castsi512_ps(_mm512_slli_epi32(xi, 16)),
                           acc);
}
#define DP(acc, w, xv) dp_fma((acc), (w), (xv))
#include "kernels/uk_avx512.h"

/* ---------------- FP8 ---------------- */
/* the MXCSR of the sums: FTZ (bit 15) and DAZ (6), every exception masked (7-12), round to
 * nearest even (13-14 clear), as vdpbf16ps computes whatever the caller's MXCSR holds; the
 * caller's is restored after, flags and all (vdpbf16ps updates none) */
enum { MXCSR_RC = 0x6000, MXCSR_SUMS = 0x8000 | 0x1F80 | 0x0040 };
INL void sums_begin(unsigned csr) { _mm_setcsr((csr & ~(unsigned)MXCSR_RC) | MXCSR_SUMS); }
/* the sums in a[0..na) and b[0..nb) complete, then back to the caller's MXCSR (the asm
 * statements take the sums as inputs and outputs, so no FMA moves across the ldmxcsr) */
INL void sums_end(unsigned csr, __m512 *a, const int na, __m512 *b, const int nb) {
    #pragma GCC unroll 16
    for (int i = 0; i < na; i++) __asm__ volatile("" : "+v"(a[i]));
    #pragma GCC unroll 16
    for (int i = 0; i < nb; i++) __asm__ volatile("" : "+v"(b[i]));
    _mm_setcsr(csr);
    #pragma GCC unroll 16
    for (int i = 0; i < na; i++) __asm__ volatile("" : "+v"(a[i]));
    #pragma GCC unroll 16
    for (int i = 0; i < nb; i++) __asm__ volatile("" : "+v"(b[i]));
}

/* fp8 gemv on fp32 FMAs: per 128-k block the tokens' x widened to fp32 in
 * scratch (exact), each line decoded through the bf16 LUT and split into
 * its four fp32 k vectors (a pair's odd k: the high halves; even: shifted
 * up), then per token the FMAs in vdpbf16ps's order (a pair's odd k first)
 * with x broadcast from L1 (an FMA's memory operand, no shuffles). The
 * chains are those of uk_avx512bf16.c's fp8_gemv_body: 4 over 2 lines at 1
 * token, 2 a token in calls of 2-4 tokens, 1 from 5, so the sums are the
 * vdpbf16ps gemv's, and from 5 tokens the FMA gemm's (its threshold changes
 * no result); they run under DAZ | FTZ, the block scaling under the
 * caller's MXCSR. */
INL void fp8_line_f32(const fp8_lut *t, const uint8_t *p, __m512 w[4], const int pin) {
    const __m512i hm = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512i z0, z1;
    fp8_line_bf16(t, p, &z0, &z1, pin);
    w[0] = _mm512_castsi512_ps(_mm512_slli_epi32(z0, 16)), w[1] = _mm512_castsi512_ps(_mm512_and_si512(z0, hm));
    w[2] = _mm512_castsi512_ps(_mm512_slli_epi32(z1, 16)), w[3] = _mm512_castsi512_ps(_mm512_and_si512(z1, hm));
}
/* acc + wo * xo, then + we * xe: one k pair, odd first */
INL __m512 fma_pair(__m512 acc, __m512 wo, __m512 we, const float *xp) {
    return _mm512_fmadd_ps(we, _mm512_set1_ps(xp[0]), _mm512_fmadd_ps(wo, _mm512_set1_ps(xp[1]), acc));
}

/* ONE 0 (with TWO 0): one chain a token at every count, the gemm's sums (the batch-invariant
 * uk_fp8_f32_inv); xw: x widened by the caller (mr_uk_act.xw), read in place of x */
INL void fp8_fma_gemv_body(const uint8_t *tile, const float *bs, int64_t Kp, const uint16_t *x, int64_t ldx,
                           const float *xw, int64_t ldxw, const float *xs, int64_t ldxs, float *y, int64_t ldy,
                           float *xf, unsigned csr, const int M, const int TWO, const int ONE) {
    const fp8_lut t = fp8_lut_load();
    const int two = M <= 4 && TWO; /* as fp8_gemv_body */
    __m512 out[MT], a0[MT], a1[MT];
    #pragma GCC unroll 16
    for (int m = 0; m < M; m++) out[m] = _mm512_setzero_ps();
    for (int64_t kb = 0; kb < Kp / 128; kb++) {
        const uint8_t *p = tile + kb * 2048;
        #pragma GCC unroll 16
        for (int m = 0; m < M; m++) {
            a0[m] = a1[m] = _mm512_setzero_ps();
            const uint16_t *src = x + m * ldx + kb * 128;
            if (xw) {
                memcpy(xf + m * 128, xw + m * ldxw + kb * 128, 128 * sizeof(float));
                continue;
            }
            for (int i = 0; i < 128; i += 16) {
                const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
                _mm512_store_si512(xf + m * 128 + i, _mm512_slli_epi32(v, 16));
            }
        }
        sums_begin(csr);
        if (M == 1 && ONE) { /* 4 chains over 2 lines, w pinned */
            a0[1] = a1[1] = _mm512_setzero_ps();
            for (int g = 0; g < 32; g += 2) {
                __m512 w[4], v[4];
                PF_FP8(p + g * 64);
                PF_FP8(p + g * 64 + 64);
                fp8_line_f32(&t, p + g * 64, w, 1);
                fp8_line_f32(&t, p + g * 64 + 64, v, 1);
                const float *xm = xf + 4 * g;
                a0[0] = fma_pair(a0[0], w[1], w[0], xm);
                a1[0] = fma_pair(a1[0], w[3], w[2], xm + 2);
                a0[1] = fma_pair(a0[1], v[1], v[0], xm + 4);
                a1[1] = fma_pair(a1[1], v[3], v[2], xm + 6);
            }
            sums_end(csr, a0, 2, a1, 2);
            a0[0] = _mm512_add_ps(a0[0], a0[1]);
            a1[0] = _mm512_add_ps(a1[0], a1[1]);
        }
        for (int g = 0; (M > 1 || !ONE) && g < 32; g++) {
            __m512 w[4];
            PF_FP8(p + g * 64);
            fp8_line_f32(&t, p + g * 64, w, 0);
            #pragma GCC unroll 16
            for (int m = 0; m < M; m++) {
                const float *xm = xf + m * 128 + 4 * g;
                a0[m] = fma_pair(a0[m], w[1], w[0], xm);
                if (two) a1[m] = fma_pair(a1[m], w[3], w[2], xm + 2);
                else a0[m] = fma_pair(a0[m], w[3], w[2], xm + 2);
            }
        }
        if (M > 1 || !ONE) sums_end(csr, a0, M, a1, two ? M : 0);
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

INL void fp8_f32_gemv_run(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                          void *scratch, const int ONE) {
    const uint8_t *tile = W->data + (size_t)t * W->tile_bytes;
    const float *bs = W->tscale + t * (W->Kp / 128);
    const unsigned csr = _mm_getcsr();
    float *xf = (float *)scratch; /* [MT][128] fp32: 4 KiB */
    for (int64_t m0 = 0, mt; m0 < M; m0 += mt) {
        mt = token_block(M - m0, MT);
        const uint16_t *x = (const uint16_t *)a->x + m0 * a->ldx;
        const float *xw = a->xw ? a->xw + m0 * a->ldxw : NULL;
        const float *xs = a->xs ? a->xs + m0 * a->ldxs : NULL;
#define CALL(n) fp8_fma_gemv_body(tile, bs, W->Kp, x, a->ldx, xw, a->ldxw, xs, a->ldxs, y + m0 * ldy, ldy, xf, csr, n, 1, 1)
#define CALL1(n) fp8_fma_gemv_body(tile, bs, W->Kp, x, a->ldx, xw, a->ldxw, xs, a->ldxs, y + m0 * ldy, ldy, xf, csr, n, 0, ONE)
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
static void uk_fp8_f32_gemv(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                            void *scratch) {
    fp8_f32_gemv_run(W, t, a, M, y, ldy, scratch, 1);
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
enum { MTZ = 16 };
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
    sums_begin(csr);
    for (int k = 0; k < 128; k += 2) { /* the pair (k, k + 1): odd first, as vdpbf16ps */
        const __m512 w1 = _mm512_load_ps((const float *)(wb + k + 1)), w0 = _mm512_load_ps((const float *)(wb + k));
        #pragma GCC unroll 16
        for (int m = 0; m < M; m++)
            acc[m] = _mm512_fmadd_ps(w0, _mm512_set1_ps(x[m * ldx + k]),
                                     _mm512_fmadd_ps(w1, _mm512_set1_ps(x[m * ldx + k + 1]), acc[m]));
    }
    sums_end(csr, acc, M, acc, 0);
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

/* the batch-invariant fp8 kernel (mr_kernels.uk_inv): below the gemm threshold the gemv with one
 * chain a token at every count (it sums as the gemm does, test_fp8_fma_gemv_is_gemm), the gemm
 * from there; both read the widened x where given */
enum { FP8_F32_GEMM_MIN_M = 6 };
static void uk_fp8_f32_inv(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                           void *scratch) {
    if (M < FP8_F32_GEMM_MIN_M)
        fp8_f32_gemv_run(W, t, a, M, y, ldy, scratch, 0);
    else
        uk_fp8_f32_gemm(W, t, a, M, y, ldy, scratch);
}


/* ---------------- NVFP4 int8 ---------------- */
/* 2*e2m1(c) + 12 for c = 0..15: an unsigned byte in [0, 24]. */
static const uint8_t U8LUT[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

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
                       const int G, const int ONE) {
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
        if (M == 1 && ONE) { /* two int32 chains (exact) and two fp32 chains: shorter latency */
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
            if (M == 1 && ONE) ga[0] = _mm512_add_ps(ga[0], out1), out1 = _mm512_setzero_ps();
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
    if (G == 1 && M == 1 && ONE) ga[0] = _mm512_add_ps(ga[0], out1);
    #pragma GCC unroll 16
    for (int m = 0; m < M; m++)
        _mm512_storeu_ps(y + m * ldy,
                         _mm512_mul_ps(G == 1 ? ga[m] : omem ? _mm512_loadu_ps(y + m * ldy) : out[m], f));
}

/* ONE 0: the batch-invariant form (mr_kernels.uk_inv): a lone token takes the chains of the
 * others, so a token's bits do not depend on how many share its call */
INL void nvfp4_i8_run(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                      const int ONE) {
    const uint8_t *tile = W->data + (size_t)t * W->tile_bytes;
    const float post = a->post * W->scale2;
    const int grouped = a->xs_group == 8;
    for (int64_t m0 = 0, mt; m0 < M; m0 += mt) {
        mt = token_block(M - m0, MT16);
        const int8_t *x = (const int8_t *)a->x + m0 * a->ldx;
        const int32_t *xb = a->xb + m0 * a->ldb;
        const float *xs = a->xs ? a->xs + m0 * a->ldxs : NULL;
#define CALL(n)                                                                                                    \
    (grouped ? nvfp4_i8_body(tile, W->Kp, x, a->ldx, xb, a->ldb, xs, a->ldxs, post, y + m0 * ldy, ldy, n, 8, ONE) \
             : nvfp4_i8_body(tile, W->Kp, x, a->ldx, xb, a->ldb, xs, a->ldxs, post, y + m0 * ldy, ldy, n, 1, ONE))
        DISPATCH_MT16(mt, CALL)
#undef CALL
    }
}
UK_WITH_INV(uk_nvfp4_i8, nvfp4_i8_run, 1, 0)

INL void bf16_f32_body(const uint8_t *tile, int64_t Kp, const float *x, int64_t ldx, float *y, int64_t ldy,
                       const int M, const int ONE) {
    const __m512i hm = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512 a0[MT], a1[MT];
    #pragma GCC unroll 16
    for (int m = 0; m < M; m++) a0[m] = a1[m] = _mm512_setzero_ps();
    int64_t g = 0;
    if (M == 1 && ONE) { /* 4 chains over 2 lines, a prefetch a line */
        __m512 a2 = _mm512_setzero_ps(), a3 = a2;
        for (; g + 2 <= Kp / 2; g += 2) {
            PF(tile + g * 64);
            PF(tile + g * 64 + 64);
            const __m512i w = _mm512_load_si512(tile + g * 64), v = _mm512_load_si512(tile + g * 64 + 64);
            a0[0] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)), _mm512_set1_ps(x[2 * g]), a0[0]);
            a1[0] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(w, hm)), _mm512_set1_ps(x[2 * g + 1]), a1[0]);
            a2 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), _mm512_set1_ps(x[2 * g + 2]), a2);
            a3 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v, hm)), _mm512_set1_ps(x[2 * g + 3]), a3);
        }
        a0[0] = _mm512_add_ps(a0[0], a2), a1[0] = _mm512_add_ps(a1[0], a3);
    }
    for (; g < Kp / 2; g++) {
        PF(tile + g * 64);
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

INL void bf16_f32_run(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                      const int ONE) {
    const uint8_t *tile = W->data + (size_t)t * W->tile_bytes;
    for (int64_t m0 = 0, mt; m0 < M; m0 += mt) {
        mt = token_block(M - m0, MT);
        const float *x = (const float *)a->x + m0 * a->ldx;
#define CALL(n) bf16_f32_body(tile, W->Kp, x, a->ldx, y + m0 * ldy, ldy, n, ONE)
        DISPATCH_MT(mt, CALL)
#undef CALL
    }
    apply_post(y, ldy, M, a->post * W->scale2);
}
UK_WITH_INV(uk_bf16_f32, bf16_f32_run, 1, 0)

/* benchmark isolation (kernels.h uk_stream): the tile read by the read
 * probe's own loop (mr__probe_read_avx2: ymm loads, each line's prefetch
 * right before its loads; zmm loads read 15% less on some hosts), nothing
 * computed */
static void uk_stream(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                      void *scratch) {
    (void)a;
    *(uint64_t *)scratch = mr__probe_read_avx2((const uint64_t *)(W->data + (size_t)t * W->tile_bytes), W->tile_bytes / 8);
    for (int64_t m = 0; m < M; m++) _mm512_storeu_ps(y + m * ldy, _mm512_setzero_ps());
}

/* the level's table: every kind, the bf16 pair dots on FMAs (names "f32" or "avx512fma") */
void mr__uk_fill_avx512(mr_kernels *k) {
    k->isa = "avx512";
    k->uk_gemv[MR_UK_FP8_BF16].name = "uk_fp8_f32_avx512_16x8";
    k->uk_gemv[MR_UK_FP8_BF16].fn = uk_fp8_f32_gemv;
    k->uk_gemm[MR_UK_FP8_BF16].name = "uk_fp8_f32_avx512_l1_16x128x16";
    k->uk_gemm[MR_UK_FP8_BF16].fn = uk_fp8_f32_gemm;
    k->uk_gemv[MR_UK_NVFP4_I8].name = k->uk_gemm[MR_UK_NVFP4_I8].name = "uk_nvfp4_i8_avx512_16x16";
    k->uk_gemv[MR_UK_NVFP4_I8].fn = k->uk_gemm[MR_UK_NVFP4_I8].fn = uk_nvfp4_i8;
    k->uk_gemv[MR_UK_NVFP4_BF16].name = k->uk_gemm[MR_UK_NVFP4_BF16].name = "uk_nvfp4_bf16_avx512fma_16x8";
    k->uk_gemv[MR_UK_NVFP4_BF16].fn = k->uk_gemm[MR_UK_NVFP4_BF16].fn = uk_nvfp4_bf16;
    k->uk_gemv[MR_UK_BF16_BF16].name = k->uk_gemm[MR_UK_BF16_BF16].name = "uk_bf16_bf16_avx512fma_16x16";
    k->uk_gemv[MR_UK_BF16_BF16].fn = k->uk_gemm[MR_UK_BF16_BF16].fn = uk_bf16_bf16;
    k->uk_gemv[MR_UK_BF16_F32].name = k->uk_gemm[MR_UK_BF16_F32].name = "uk_bf16_f32_avx512_16x8";
    k->uk_gemv[MR_UK_BF16_F32].fn = k->uk_gemm[MR_UK_BF16_F32].fn = uk_bf16_f32;
    /* batch-invariant: fp8 one chain a token at every count (uk_fp8_f32_inv), the others without
     * their one-token chains (the nvfp4 bf16 kernel has none; its fixed-point gemv input is
     * off in that table) */
    k->uk_inv[MR_UK_FP8_BF16] = (mr_uk_entry){"uk_fp8_f32_avx512_16x8_l1_16x128x16_inv", uk_fp8_f32_inv};
    k->uk_inv[MR_UK_NVFP4_I8].name = "uk_nvfp4_i8_avx512_16x16_inv";
    k->uk_inv[MR_UK_NVFP4_I8].fn = uk_nvfp4_i8_inv;
    k->uk_inv[MR_UK_NVFP4_BF16] = k->uk_gemm[MR_UK_NVFP4_BF16];
    k->uk_inv[MR_UK_BF16_BF16].name = "uk_bf16_bf16_avx512fma_16x16_inv";
    k->uk_inv[MR_UK_BF16_BF16].fn = uk_bf16_bf16_inv;
    k->uk_inv[MR_UK_BF16_F32].name = "uk_bf16_f32_avx512_16x8_inv";
    k->uk_inv[MR_UK_BF16_F32].fn = uk_bf16_f32_inv;
    /* the fp8 gemm from 6 tokens an expert (bench moe on Intel: T = 256 / 512 -8% / -14% against
     * 16); a gemv call of 5+ tokens sums as the gemm does (fp8_gemv_body), so this changes no result */
    k->uk_gemm_min_m = FP8_F32_GEMM_MIN_M;
    for (int i = 0; i < MR_UK_COUNT; i++) /* the AVX2 level below set them for its own kernels */
        k->uk_gemm_xw[i] = k->uk_gemv_xq[i] = k->uk_xd[i] = false;
    k->uk_gemv_xq[MR_UK_NVFP4_BF16] = true; /* x as fixed point for the gemv (xq_row: the AVX2 level's) */
    k->uk_gemm_xw[MR_UK_FP8_BF16] = true; /* x widened once per expert chunk */
    static const mr_pack_id pk[MR_UK_COUNT] = {MR_PACK_FP8_R16K4, MR_PACK_NVFP4_R16K16, MR_PACK_NVFP4_R16K16B,
                                                MR_PACK_BF16_R16K2, MR_PACK_BF16_R16K2};
    static const mr_probe_instr in[MR_UK_COUNT] = {MR_PROBE_FMA, MR_PROBE_DPBUSD, MR_PROBE_FMA, MR_PROBE_FMA,
                                                   MR_PROBE_FMA};
    for (int i = 0; i < MR_UK_COUNT; i++) k->uk_pack[i] = pk[i], k->uk_instr[i] = in[i];
    k->uk_stream.name = "uk_stream_avx512";
    k->uk_stream.fn = uk_stream;
}
