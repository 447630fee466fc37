/* dense_avx512.c — the dense projections (q/k/v/o, lm_head, the router: mr_matmul) on fp32 inputs
 * and vfmadd231ps over the expert kernels' packs, the kernel table's rows_f32 (moerun/kernels.h), at
 * the AVX-512 level (VBMI for the E4M3 line decode). W is packed once at load (mr_qmatrix_tiles:
 * FP8 fp8_r16k4, BF16 bf16_r16k2) in place of the row-major copy; a zmm then holds 16 rows of one
 * k, so one FMA is 16 rows of one token with x[k] broadcast, and no lane sum is left at the end
 * (the row-major kernels reduce 16 lanes per output, and at one token decode each 32 weights
 * through vcvtph2ps). The E4M3 line goes to bf16 pairs by the two vpermi2b tables of the expert
 * kernels (uk_avx512.h), then to fp32 by a shift and an and; BF16 lines are pairs already.
 * x is copied once per call, each token Kp (the pack's padded K) apart, zero from K.
 *
 * The sums, one order for every M: each (row, token) has four chains, column k of a 128-column
 * group into chain k % 4, in k order from zero; then ((c0 + c1) + (c2 + c3)) folds into the total
 * with the group multiplier (FP8: the tile's 128-row block scale; BF16: 1), fma(sum, s, total),
 * the total from zero. Up to 4 tokens run on lines decoded in registers (4 chains a token hide the
 * FMA latency at one token); more on each group decoded once into L1 as bf16 pairs (4 KiB), widened
 * per register block of up to 6 tokens (24 accumulators, each weight vector widened once for them).
 * Both forms give a token the same operations, so its bits do not depend on M. */
#include <string.h>

/* uk_avx512.h wants the pair dot of its bf16 bodies; none of them is used here */
#define DP(acc, w, xv) _mm512_add_ps(_mm512_add_ps((acc), _mm512_castsi512_ps(w)), (xv))
#include "kernels/uk_avx512.h"

enum { XF_MT = 4, XF_MT_L1 = 6, XF_GROUP = 128 };

/* a line's two pair vectors (16 rows x (k0, k1), x (k2, k3); the low word the even k) -> the
 * rows at k0 .. k3 as fp32 (bf16 -> fp32 is exact) */
INL void xf_widen(__m512i z0, __m512i z1, __m512 w[4]) {
    const __m512i hm = _mm512_set1_epi32((int)0xFFFF0000u);
    w[0] = _mm512_castsi512_ps(_mm512_slli_epi32(z0, 16));
    w[1] = _mm512_castsi512_ps(_mm512_and_si512(z0, hm));
    w[2] = _mm512_castsi512_ps(_mm512_slli_epi32(z1, 16));
    w[3] = _mm512_castsi512_ps(_mm512_and_si512(z1, hm));
}

/* the 4 k of step g (columns 4g .. 4g + 3 of group kb) of a tile: FP8 one line, BF16 two */
INL void xf_step(const fp8_lut *t, const uint8_t *tile, int64_t kb, int g, const int fp8, __m512 w[4],
                 const int pin) {
    __m512i z0, z1;
    if (fp8) {
        const uint8_t *p = tile + kb * 2048 + g * 64;
        PF_FP8(p);
        fp8_line_bf16(t, p, &z0, &z1, pin);
    } else {
        const uint8_t *p = tile + (kb * XF_GROUP / 2 + 2 * g) * 64;
        PF(p);
        PF(p + 64);
        z0 = _mm512_load_si512(p), z1 = _mm512_load_si512(p + 64);
    }
    xf_widen(z0, z1, w);
}

/* the group's fold of TK tokens' chains into y (TK rows of 16, ldy apart) */
INL void xf_fold(__m512 c[4][XF_MT_L1], float s0, float *y, int64_t ldy, int first, const int TK) {
    const __m512 s = _mm512_set1_ps(s0);
    #pragma GCC unroll 6
    for (int m = 0; m < TK; m++) {
        float *ym = y + m * ldy;
        const __m512 sum = _mm512_add_ps(_mm512_add_ps(c[0][m], c[1][m]), _mm512_add_ps(c[2][m], c[3][m]));
        _mm512_storeu_ps(ym, _mm512_fmadd_ps(sum, s, first ? _mm512_setzero_ps() : _mm512_loadu_ps(ym)));
    }
}

/* TK tokens (at most XF_MT) over one tile, the lines decoded in registers */
INL void xf_lines(const uint8_t *tile, const float *bs, int64_t Kp, const float *x, int64_t ldx, float *y,
                  int64_t ldy, const int fp8, const int TK) {
    const fp8_lut t = fp8_lut_load();
    for (int64_t kb = 0; kb * XF_GROUP < Kp; kb++) {
        const int ng = (int)((Kp - kb * XF_GROUP < XF_GROUP ? Kp - kb * XF_GROUP : XF_GROUP) / 4);
        __m512 c[4][XF_MT_L1];
        #pragma GCC unroll 4
        for (int m = 0; m < TK; m++) c[0][m] = c[1][m] = c[2][m] = c[3][m] = _mm512_setzero_ps();
        for (int g = 0; g < ng; g++) {
            __m512 w[4];
            xf_step(&t, tile, kb, g, fp8, w, TK == 1);
            #pragma GCC unroll 4
            for (int m = 0; m < TK; m++) {
                const float *xm = x + m * ldx + kb * XF_GROUP + 4 * g;
                #pragma GCC unroll 4
                for (int j = 0; j < 4; j++) c[j][m] = _mm512_fmadd_ps(w[j], _mm512_set1_ps(xm[j]), c[j][m]);
            }
        }
        xf_fold(c, fp8 ? bs[kb] : 1.0f, y, ldy, kb == 0, TK);
    }
}

/* TK tokens over one group decoded into buf (ng steps of 2 bf16-pair vectors, widened here), x at
 * the group's first column: the chains and the fold of xf_lines */
INL void xf_l1(const __m512i *buf, int ng, const float *x, int64_t ldx, float s0, float *y, int64_t ldy, int first,
               const int TK) {
    __m512 c[4][XF_MT_L1];
    #pragma GCC unroll 6
    for (int m = 0; m < TK; m++) c[0][m] = c[1][m] = c[2][m] = c[3][m] = _mm512_setzero_ps();
    #pragma GCC unroll 2
    for (int g = 0; g < ng; g++) {
        __m512 ww[4];
        xf_widen(_mm512_load_si512(buf + 2 * g), _mm512_load_si512(buf + 2 * g + 1), ww);
        #pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const __m512 w = ww[j];
            #pragma GCC unroll 6
            for (int m = 0; m < TK; m++) c[j][m] = _mm512_fmadd_ps(w, _mm512_set1_ps(x[m * ldx + 4 * g + j]), c[j][m]);
        }
    }
    xf_fold(c, s0, y, ldy, first, TK);
}

#define XF_DISPATCH(mt, CALL)                                                                                     \
    switch (mt) {                                                                                                  \
    case 1: CALL(1); break;                                                                                        \
    case 2: CALL(2); break;                                                                                        \
    case 3: CALL(3); break;                                                                                        \
    default: CALL(4); break;                                                                                       \
    }

#define XF_DISPATCH6(mt, CALL)                                                                                    \
    switch (mt) {                                                                                                  \
    case 5: CALL(5); break;                                                                                        \
    case 6: CALL(6); break;                                                                                        \
    default: XF_DISPATCH(mt, CALL)                                                                                 \
    }

/* tile t's 16 rows for M tokens of x (Kp apart) into y (16 columns a token, ldy apart) */
static void xf_tile(const mr_pmatrix *P, int64_t t, const void *xv, int64_t M, float *y, int64_t ldy, void *scratch) {
    const float *x = xv;
    const uint8_t *tile = P->data + (size_t)t * P->tile_bytes;
    const int64_t Kp = P->Kp;
    const int fp8 = P->fmt == MR_FMT_FP8_BLOCK;
    const float *bs = fp8 ? P->tscale + t * (Kp / 128) : NULL;
    if (M <= XF_MT) {
#define CALL(n) (fp8 ? xf_lines(tile, bs, Kp, x, Kp, y, ldy, 1, n) : xf_lines(tile, bs, Kp, x, Kp, y, ldy, 0, n))
        XF_DISPATCH(M, CALL)
#undef CALL
        return;
    }
    const fp8_lut lut = fp8_lut_load();
    __m512i *b = (__m512i *)scratch; /* 4 KiB: a group, 32 steps of 2 pair vectors */
    for (int64_t kb = 0; kb * XF_GROUP < Kp; kb++) {
        const int ng = (int)((Kp - kb * XF_GROUP < XF_GROUP ? Kp - kb * XF_GROUP : XF_GROUP) / 4);
        if (fp8) {
            fp8_block_pairs(&lut, tile + kb * 2048, b, 0);
        } else {
            for (int g = 0; g < 2 * ng; g++) {
                const uint8_t *p = tile + (kb * XF_GROUP / 2 + g) * 64;
                PF(p);
                _mm512_store_si512(b + g, _mm512_load_si512(p));
            }
        }
        const float s0 = fp8 ? bs[kb] : 1.0f;
        for (int64_t m0 = 0, mt; m0 < M; m0 += mt) {
            mt = token_block(M - m0, XF_MT_L1);
#define CALL(n) xf_l1(b, ng, x + m0 * Kp + kb * XF_GROUP, Kp, s0, y + m0 * ldy, ldy, kb == 0, n)
            XF_DISPATCH6(mt, CALL)
#undef CALL
        }
    }
}

static void rows_f32(const mr_pmatrix *P, int64_t n0, int64_t nr, const void *xp, int64_t M, float *y, int64_t ldy,
                     void *scratch) {
    mr__pk_rows(xf_tile, 4, 8, P, n0, nr, xp, M, y, ldy, scratch);
}

void mr__dense_fill_avx512(mr_kernels *k) {
    mr__rows_f32_fill(k, rows_f32, "rows_f32_fp8_r16k4_avx512_16x4c4_l1_16x128x6", MR_PACK_FP8_R16K4,
                      "rows_f32_bf16_r16k2_avx512_16x4c4_l1_16x128x6");
}
