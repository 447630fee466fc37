/* uk_avx2_nvw.h — private to src/kernels: the AVX2 NVFP4 gemv with bf16
 * activations on its integer input mr_uk_act.xq (the activations as 16-bit
 * fixed point per 16-k block, mr_kernels.xq_row), written once for the two
 * files that build it: uk_avx2.c with vpmaddwd + vpaddd and uk_avx2vnni.c
 * with AVX-VNNI vpdpwssd. The includer defines, before including it once,
 *   NVW_DP(acc, w, x)  acc plus the dot of each int16 pair of w and x, in
 *                      int32 lanes (both forms exact here)
 *   NVW_GEMV           the name of the mr_uk_fn it defines.
 * Per 32 weights: one vpshufb turns the nibbles into 2*e2m1 as int8, two
 * unpacks under zero bytes make them int16 (2*e2m1 * 256: no sign extension
 * needed; dword lane r holds row r at k and k + 1, the pack's order), then
 * per token two pair dots (rows 0-7, 8-15) with the broadcast pair of
 * fixed-point activations at k, k + 1. A block's sums are exact integers:
 * 16 products of |2*e2m1*256| <= 3072 and |q| < 2^15 stay below 2^31, and a
 * multiple of 256 below 2^31 is exact in fp32; so one conversion and one
 * FMA with the 16 row scales (E4M3 by the f16 trick, * 2^-8) times m / 512
 * add the block into the token's total. A block in two parts takes the low
 * part's sums the same way (a second decode) and joins them at 2^-15 in one
 * FMA before the scaling; a block with m = 0 (no fixed-point form: see
 * mr_kern_xq_row_fn) runs from x on fp32 FMAs instead (mr__nvf_block_fp).
 * Both are out of line (nvw_rare), so the hot loop holds no call and no
 * address of a register value: either made gcc keep the block sums and the
 * decoded weights on the stack (hot_uk --kind nvfp4b, one thread, tiles in
 * L2: M = 1 +6%, M = 2-4 +17-20%). A call without xq runs the fp32 gemv
 * (mr__nvf_gemv_fp). Where the fp32
 * gemv spends 2 unpacks, 2 shifts, 2 ands and 4 FMAs a token per 32 weights
 * (it rounds every sum), this spends 2 pair dots a token. */
#include "kernels/uk_avx2.h"

enum { NVW_MT = 4 }; /* tokens a pass: the gemv's calls have at most 4 (uk_gemm_min_m = 5) */
static const int8_t E2X2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 16-k block j's int32 sums for M <= NVW_MT tokens: s[m][0] rows 0-7, s[m][1]
 * rows 8-15; one token keeps two chains a half (even / odd nibble) */
INL void nvw_block(const uint8_t *tile, int64_t j, const int16_t *xq, int64_t ldxq, __m256i s[][2], const int M) {
    const __m256i lut = lut16((const uint8_t *)E2X2), m0f = _mm256_set1_epi8(0x0F), z = _mm256_setzero_si256();
    __m256i acc[NVW_MT][2][2];
    #pragma GCC unroll 4
    for (int m = 0; m < M; m++) acc[m][0][0] = acc[m][0][1] = acc[m][1][0] = acc[m][1][1] = z;
    #pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        const __m256i V = _mm256_load_si256((const __m256i *)(tile + j * 128 + 32 * v));
        #pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i B = _mm256_shuffle_epi8(lut, _mm256_and_si256(h ? _mm256_srli_epi16(V, 4) : V, m0f));
            const __m256i W0 = _mm256_unpacklo_epi8(z, B), W1 = _mm256_unpackhi_epi8(z, B);
            const int c = M == 1 ? h : 0;
            #pragma GCC unroll 4
            for (int m = 0; m < M; m++) {
                int32_t p;
                memcpy(&p, xq + m * ldxq + 16 * j + 4 * v + 2 * h, 4);
                const __m256i X = _mm256_set1_epi32(p);
                acc[m][c][0] = NVW_DP(acc[m][c][0], W0, X);
                acc[m][c][1] = NVW_DP(acc[m][c][1], W1, X);
                MR_KEEP2(acc[m][c][0], acc[m][c][1]);
            }
        }
    }
    #pragma GCC unroll 4
    for (int m = 0; m < M; m++) {
        s[m][0] = M == 1 ? _mm256_add_epi32(acc[m][0][0], acc[m][1][0]) : acc[m][0][0];
        s[m][1] = M == 1 ? _mm256_add_epi32(acc[m][0][1], acc[m][1][1]) : acc[m][0][1];
    }
}

/* a token's 16 totals += f * (sc * mult): every block of every token adds
 * into its row in memory, in the block order, from +0 (the same bits as a
 * register total started at zero) */
INL void nvw_add(float *y, __m256 f0, __m256 f1, __m256 sc0, __m256 sc1, float mult) {
    const __m256 mv = _mm256_set1_ps(mult);
    _mm256_storeu_ps(y, _mm256_fmadd_ps(f0, _mm256_mul_ps(sc0, mv), _mm256_loadu_ps(y)));
    _mm256_storeu_ps(y + 8, _mm256_fmadd_ps(f1, _mm256_mul_ps(sc1, mv), _mm256_loadu_ps(y + 8)));
}

/* the rare blocks of token m, out of line so that the hot loop holds no call
 * (a call there made the compiler keep its totals on the stack), the block's
 * sums s0, s1 by value (an address taken would put them on the stack too):
 * mult < 0, two parts (hi + lo * 2^-15, the lo sums decoded here), or
 * mult == 0, no fixed-point form: fp32 FMAs from x */
static __attribute__((noinline)) void nvw_rare(const uint8_t *tile, int64_t j, const mr_uk_act *a, int64_t m,
                                               __m256i s0, __m256i s1, __m256 sc0, __m256 sc1, float *y) {
    float mult = a->xqm[m * a->ldxqm + j];
    __m256 f0, f1;
    if (mult < 0.0f) {
        __m256i l[1][2];
        nvw_block(tile, j, a->xql + m * a->ldxq, a->ldxq, l, 1);
        const __m256 e = _mm256_set1_ps(1.0f / 32768.0f);
        f0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l[0][0]), e, _mm256_cvtepi32_ps(s0));
        f1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l[0][1]), e, _mm256_cvtepi32_ps(s1));
        mult *= -1.0f / 512.0f;
    } else {
        mr__nvf_block_fp(tile, j, (const uint16_t *)a->x + m * a->ldx + 16 * j, &f0, &f1);
        mult = 1.0f;
    }
    if (a->xs) mult *= a->xs[m * a->ldxs + j];
    nvw_add(y, f0, f1, sc0, sc1, mult);
}

/* tokens m0 .. m0 + M - 1 (M <= NVW_MT) over the whole tile: block sums in
 * registers, the totals in ob (aligned: its loads take the stores'
 * forwarding), written to y at the end */
INL void nvw_body(const mr_pmatrix *W, const uint8_t *tile, const mr_uk_act *a, int64_t m0, float *y, int64_t ldy,
                  const int M) {
    const int64_t Kp = W->Kp;
    const uint8_t *scp = tile + 8 * Kp;
    const int16_t *xq = a->xq + m0 * a->ldxq;
    const float *xqm = a->xqm + m0 * a->ldxqm, *xs = a->xs ? a->xs + m0 * a->ldxs : NULL;
    float ob[NVW_MT][16] __attribute__((aligned(32)));
    #pragma GCC unroll 4
    for (int m = 0; m < M; m++) {
        _mm256_store_ps(ob[m], _mm256_setzero_ps());
        _mm256_store_ps(ob[m] + 8, _mm256_setzero_ps());
    }
    for (int64_t j = 0; j < Kp / 16; j++) {
        PF_NV(tile + j * 128);
        PF_NV(tile + j * 128 + 64);
        if ((j & 3) == 0) PF(scp + 16 * j);
        __m256i s[NVW_MT][2];
        nvw_block(tile, j, xq, a->ldxq, s, M);
        __m256 sc0, sc1;
        e4m3x16(scp + 16 * j, &sc0, &sc1);
        #pragma GCC unroll 4
        for (int m = 0; m < M; m++) {
            float mult = xqm[m * a->ldxqm + j];
            if (__builtin_expect(mult > 0.0f, 1)) {
                mult *= 1.0f / 512.0f;
                if (xs) mult *= xs[m * a->ldxs + j];
                nvw_add(ob[m], _mm256_cvtepi32_ps(s[m][0]), _mm256_cvtepi32_ps(s[m][1]), sc0, sc1, mult);
            } else {
                nvw_rare(tile, j, a, m0 + m, s[m][0], s[m][1], sc0, sc1, ob[m]);
            }
        }
    }
    #pragma GCC unroll 4
    for (int m = 0; m < M; m++) {
        _mm256_storeu_ps(y + m * ldy, _mm256_load_ps(ob[m]));
        _mm256_storeu_ps(y + m * ldy + 8, _mm256_load_ps(ob[m] + 8));
    }
}

static void NVW_GEMV(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                     void *scratch) {
    if (!a->xq) {
        mr__nvf_gemv_fp(W, t, a, M, y, ldy, scratch);
        return;
    }
    const uint8_t *tile = W->data + (size_t)t * W->tile_bytes;
    for (int64_t m0 = 0, mt; m0 < M; m0 += mt) {
        mt = mr__uk_token_block(M - m0, NVW_MT);
        if (mt == 1) nvw_body(W, tile, a, m0, y + m0 * ldy, ldy, 1);
        else if (mt == 2) nvw_body(W, tile, a, m0, y + m0 * ldy, ldy, 2);
        else if (mt == 3) nvw_body(W, tile, a, m0, y + m0 * ldy, ldy, 3);
        else nvw_body(W, tile, a, m0, y + m0 * ldy, ldy, 4);
    }
    apply_post(y, ldy, M, 256.0f * a->post * W->scale2);
}
