/* dense_avx2.c — the dense projections (q/k/v/o, lm_head, the router: mr_matmul) on fp32 inputs
 * and vfmadd231ps ymm over the AVX2 expert kernels' packs, the kernel table's rows_f32
 * (moerun/kernels.h) at the AVX2 level. W is packed once at load (mr_qmatrix_tiles: FP8 fp8_y16,
 * BF16 bf16_r16k2) in place of the row-major copy; a ymm then holds 8 rows of one k, so one FMA is
 * 8 rows of one token with x[k] broadcast, and no lane sum is left at the end (the row-major
 * kernels of kernels_avx2.c reduce 8 lanes per output and, at one token, decode each 16 weights
 * through two vcvtph2ps). x is copied once per call, each token Kp (the pack's padded K) apart,
 * zero from K.
 *
 * The sums, one order for every M: each (row, token) has two chains, the even columns of a
 * 128-column group into chain 0 and the odd ones into chain 1 (the two k of a pack pair), in k
 * order from zero; then (c0 + c1) folds into the total with the group multiplier (FP8: 2^8 times
 * the tile's 128-row block scale; BF16: 1) as the expert kernels fold (y_update: the first group
 * a product, the rest an FMA). Two chains of two halves give one token four FMAs in flight, about
 * what the decode of an E4M3 pair (nine integer ops for its four FMAs) keeps up with at one token;
 * with four chains a register block at many tokens would hold one token (8 accumulators of the 16
 * ymm), with two it holds three.
 *
 * Up to DF_REG_M tokens run in register blocks of up to DF_MT on pairs decoded in registers:
 * e4m3x32_d, the weights times 2^-120, against the group's x times 2^112 (copied so into the
 * scratch once per tile and group, where every |x| < 2^16); else the weights times 2^-8
 * (e4m3x32_s8) and x as is; e4m3x32_x and x as is for a group mr_pmatrix.tsub marks (no fp32
 * subnormal: Intel's assists). More tokens run on each group decoded once into L1 as fp32 times
 * 2^-8 (8 KiB of the scratch), in register blocks of up to DF_MT_L1 tokens (12 accumulators, 2
 * weight loads and 3 broadcasts per 6 FMAs). Every way gives the same exact products (w * x *
 * 2^-8) in the same order, so a token's bits do not depend on M. A matrix holding an E4M3 NaN code
 * (mr_pmatrix.has_nan) takes the L1 form at every M, decoded by the exact table (the NaN stays a
 * NaN). */
#include "kernels/uk_avx2.h"

/* DF_REG_M: up to 4 tokens in register blocks of DF_MT (each block decodes the tile again, from
 * L2), more on the L1 form (bench dense --format fp8, MOERUN_CPU_MASK=avx512, Zen 4, two rounds: 4
 * tokens 131-132 GFLOP/s against 119 on the L1 form; 3 tokens 111 both ways; 5 tokens 125 against
 * 129-132) */
enum { DF_GROUP = 128, DF_MT = 2, DF_MT_L1 = 3, DF_REG_M = 4 };

/* the TK tokens' DF_GROUP values (ldx apart) times 2^112 into xs (DF_GROUP apart); returns whether
 * every |x| < 2^16 (no Inf or NaN), where the scaling is exact */
INL int df_scale(const float *x, int64_t ldx, float *xs, const int TK) {
    const __m256i am = _mm256_set1_epi32(0x7FFFFFFF);
    const __m256 up = _mm256_set1_ps(0x1p112f);
    __m256i mx = _mm256_setzero_si256();
    #pragma GCC unroll 2
    for (int m = 0; m < TK; m++)
        for (int i = 0; i < DF_GROUP; i += 8) {
            const __m256 v = _mm256_loadu_ps(x + m * ldx + i);
            mx = _mm256_max_epu32(mx, _mm256_and_si256(_mm256_castps_si256(v), am));
            _mm256_store_ps(xs + m * DF_GROUP + i, _mm256_mul_ps(v, up));
        }
    const __m256i big = _mm256_cmpgt_epi32(mx, _mm256_set1_epi32(0x477FFFFF));
    return _mm256_testz_si256(big, big);
}

/* np pairs of one group (p at its first) into the chains of TK tokens (x at the group's first
 * column, ldx apart): FP8 by form D (1: e4m3x32_d, for x times 2^112; 2: e4m3x32_x; 0: e4m3x32_s8),
 * BF16 widened */
INL void df_pairs(const uint8_t *p, int np, const float *x, int64_t ldx, __m256 c[2][DF_MT][2], const int fp8,
                  const int D, const int TK) {
    for (int g = 0; g < np; g++) {
        __m256 o[4];
        if (fp8) {
            const uint8_t *q = p + 32 * g;
            if ((g & 1) == 0) PF_FP8(q);
            if (D == 1)
                e4m3x32_d(q, o);
            else if (D == 2)
                e4m3x32_x(q, o);
            else
                e4m3x32_s8(q, o);
        } else {
            const uint8_t *q = p + 64 * g;
            PF(q);
            bf16_pair(q, &o[0], &o[1], &o[2], &o[3]);
        }
        #pragma GCC unroll 2
        for (int m = 0; m < TK; m++) {
            const float *xm = x + m * ldx + 2 * g;
            const __m256 x0 = _mm256_broadcast_ss(xm), x1 = _mm256_broadcast_ss(xm + 1);
            c[0][m][0] = _mm256_fmadd_ps(o[0], x0, c[0][m][0]);
            c[0][m][1] = _mm256_fmadd_ps(o[1], x0, c[0][m][1]);
            c[1][m][0] = _mm256_fmadd_ps(o[2], x1, c[1][m][0]);
            c[1][m][1] = _mm256_fmadd_ps(o[3], x1, c[1][m][1]);
        }
    }
}

/* the group's fold of TK tokens' chains into y (TK rows of 16, ldy apart) */
#define DF_FOLD(c, s0, y, ldy, first, TK)                                                                          \
    do {                                                                                                           \
        const __m256 s_ = _mm256_set1_ps(s0);                                                                      \
        for (int m_ = 0; m_ < (TK); m_++)                                                                          \
            y_update((y) + m_ * (ldy), _mm256_add_ps(c[0][m_][0], c[1][m_][0]),                                    \
                     _mm256_add_ps(c[0][m_][1], c[1][m_][1]), s_, s_, (first));                                    \
    } while (0)

/* TK tokens (at most DF_MT) over one tile, the pairs decoded in registers (xs: room for the
 * tokens' group times 2^112) */
INL void df_lines(const uint8_t *tile, const float *bs, const uint8_t *sub, int64_t Kp, const float *x, int64_t ldx,
                  float *y, int64_t ldy, float *xs, const int fp8, const int TK) {
    for (int64_t kb = 0; kb * DF_GROUP < Kp; kb++) {
        const int np = (int)((Kp - kb * DF_GROUP < DF_GROUP ? Kp - kb * DF_GROUP : DF_GROUP) / 2);
        const float *xg = x + kb * DF_GROUP;
        __m256 c[2][DF_MT][2];
        #pragma GCC unroll 2
        for (int m = 0; m < TK; m++) c[0][m][0] = c[0][m][1] = c[1][m][0] = c[1][m][1] = _mm256_setzero_ps();
        if (!fp8)
            df_pairs(tile + kb * DF_GROUP * 32, np, xg, ldx, c, 0, 0, TK);
        else if (sub && sub[kb])
            df_pairs(tile + kb * 2048, np, xg, ldx, c, 1, 2, TK);
        else if (df_scale(xg, ldx, xs, TK))
            df_pairs(tile + kb * 2048, np, xs, DF_GROUP, c, 1, 1, TK);
        else
            df_pairs(tile + kb * 2048, np, xg, ldx, c, 1, 0, TK);
        DF_FOLD(c, fp8 ? 256.0f * bs[kb] : 1.0f, y, ldy, kb == 0, TK);
    }
}

/* TK tokens over one group decoded into wb (np pairs of 4 vectors: rows 0-7 and 8-15 at the even
 * k, then at the odd k), x at the group's first column: the chains and the fold of df_lines */
INL void df_l1(const float *wb, int np, const float *x, int64_t ldx, float s0, float *y, int64_t ldy, int first,
               const int TK) {
    __m256 c[2][DF_MT_L1][2];
    #pragma GCC unroll 3
    for (int m = 0; m < TK; m++) c[0][m][0] = c[0][m][1] = c[1][m][0] = c[1][m][1] = _mm256_setzero_ps();
    #pragma GCC unroll 2
    for (int g = 0; g < np; g++) {
        #pragma GCC unroll 2
        for (int j = 0; j < 2; j++) {
            const __m256 w0 = _mm256_load_ps(wb + 32 * g + 16 * j), w1 = _mm256_load_ps(wb + 32 * g + 16 * j + 8);
            #pragma GCC unroll 3
            for (int m = 0; m < TK; m++) {
                const __m256 xv = _mm256_broadcast_ss(x + m * ldx + 2 * g + j);
                c[j][m][0] = _mm256_fmadd_ps(w0, xv, c[j][m][0]);
                c[j][m][1] = _mm256_fmadd_ps(w1, xv, c[j][m][1]);
            }
        }
    }
    DF_FOLD(c, s0, y, ldy, first, TK);
}

/* group kb of a tile into wb as fp32 * 2^-8 (FP8) or as is (BF16), pairs as df_l1 reads them */
static void df_decode(const mr_pmatrix *P, const uint8_t *tile, const uint8_t *sub, int64_t kb, int np, float *wb) {
    if (P->fmt != MR_FMT_FP8_BLOCK) {
        for (int g = 0; g < np; g++) {
            const uint8_t *q = tile + (kb * DF_GROUP / 2 + g) * 64;
            PF(q);
            __m256 o[4];
            bf16_pair(q, &o[0], &o[1], &o[2], &o[3]);
            _mm256_store_ps(wb + 32 * g, o[0]), _mm256_store_ps(wb + 32 * g + 8, o[1]);
            _mm256_store_ps(wb + 32 * g + 16, o[2]), _mm256_store_ps(wb + 32 * g + 24, o[3]);
        }
    } else if (P->has_nan) { /* the exact table, then 2^-8 (exact: E4M3's smallest step is 2^-9) */
        mr__pk_fp8_block_f32(P, tile, kb, wb);
        for (int i = 0; i < 16 * DF_GROUP; i += 8)
            _mm256_store_ps(wb + i, _mm256_mul_ps(_mm256_load_ps(wb + i), _mm256_set1_ps(0x1p-8f)));
    } else {
        fp8_decode_blk(tile + kb * 2048, wb, sub && sub[kb] ? 2 : 0);
    }
}

/* tile t's 16 rows for M tokens of x (Kp apart) into y (16 columns a token, ldy apart) */
static void df_tile(const mr_pmatrix *P, int64_t t, const void *xv, int64_t M, float *y, int64_t ldy, void *scratch) {
    const float *x = xv;
    const uint8_t *tile = P->data + (size_t)t * P->tile_bytes;
    const int64_t Kp = P->Kp;
    const int fp8 = P->fmt == MR_FMT_FP8_BLOCK;
    const float *bs = fp8 ? P->tscale + t * (Kp / 128) : NULL;
    const uint8_t *sub = fp8 && P->tsub ? P->tsub + t * (Kp / 128) : NULL;
    if (M <= DF_REG_M && !(fp8 && P->has_nan)) {
        float *xs = scratch; /* 1 KiB: the group's x of DF_MT tokens times 2^112 */
        for (int64_t m0 = 0, mt; m0 < M; m0 += mt) {
            mt = mr__uk_token_block(M - m0, DF_MT);
            const float *xm = x + m0 * Kp;
            float *ym = y + m0 * ldy;
            if (mt == 1)
                fp8 ? df_lines(tile, bs, sub, Kp, xm, Kp, ym, ldy, xs, 1, 1) : df_lines(tile, bs, sub, Kp, xm, Kp, ym, ldy, xs, 0, 1);
            else
                fp8 ? df_lines(tile, bs, sub, Kp, xm, Kp, ym, ldy, xs, 1, 2) : df_lines(tile, bs, sub, Kp, xm, Kp, ym, ldy, xs, 0, 2);
        }
        return;
    }
    float *wb = scratch; /* 8 KiB: a group, 64 pairs of 4 vectors */
    for (int64_t kb = 0; kb * DF_GROUP < Kp; kb++) {
        const int np = (int)((Kp - kb * DF_GROUP < DF_GROUP ? Kp - kb * DF_GROUP : DF_GROUP) / 2);
        df_decode(P, tile, sub, kb, np, wb);
        const float s0 = fp8 ? 256.0f * bs[kb] : 1.0f;
        for (int64_t m0 = 0, mt; m0 < M; m0 += mt) {
            mt = mr__uk_token_block(M - m0, DF_MT_L1);
            const float *xm = x + m0 * Kp + kb * DF_GROUP;
            float *ym = y + m0 * ldy;
            if (mt == 1)
                df_l1(wb, np, xm, Kp, s0, ym, ldy, kb == 0, 1);
            else if (mt == 2)
                df_l1(wb, np, xm, Kp, s0, ym, ldy, kb == 0, 2);
            else
                df_l1(wb, np, xm, Kp, s0, ym, ldy, kb == 0, 3);
        }
    }
}

static void rows_f32(const mr_pmatrix *P, int64_t n0, int64_t nr, const void *xp, int64_t M, float *y, int64_t ldy,
                     void *scratch) {
    mr__pk_rows(df_tile, 4, 8, P, n0, nr, xp, M, y, ldy, scratch);
}

void mr__dense_fill_avx2(mr_kernels *k) {
    mr__rows_f32_fill(k, rows_f32, "rows_f32_fp8_y16_avx2_16x2c2_l1_16x128x3", MR_PACK_FP8_Y16,
                      "rows_f32_bf16_r16k2_avx2_16x2c2_l1_16x128x3");
}
