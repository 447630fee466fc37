/* dense_avx512bf16.c — the dense projections (q/k/v/o, lm_head: mr_matmul) on vdpbf16ps for
 * matrices whose inputs are bf16 values (--dense-activation-dtype bf16), the kernel table's
 * rows_x16 (moerun/kernels.h). Installed over the AVX512-BF16 kernels where vdpbf16ps zmm issues at
 * the vfmadd231ps zmm rate, so that it does twice the multiply-adds (Zen 4; bench/README.md "Dense
 * inputs in bf16 on Zen 4"): not on Intel's cores with AVX512-FP16, where it issues at half that
 * rate and AMX's rows_tiles takes these matrices. W is packed once at load as the expert kernels
 * take it (mr_qmatrix_tiles: FP8 fp8_r16k4, BF16 bf16_r16k2: a zmm holds 16 rows of one k pair, so
 * one vdpbf16ps is 16 rows of one token); x is packed once per call as bf16 (rows_x16 xpack).
 *
 * The sums, one order for every M: each (row, token) has two chains, pair p of a 128-column group
 * into chain p & 1 (FP8: the E4M3 line's two decoded vectors), in k order. FP8: a group's chains
 * start at zero, their sum folds into the total with the group multiplier (fma(c0 + c1, s, total),
 * the total from zero); BF16: the chains run over all of K, then c0 + c1. Up to 8 tokens run with
 * the lines decoded in registers; more over each 128-column group decoded once into L1 (FP8) or
 * read in place (BF16), 8 tokens a register block. Both forms give every token the same sequence
 * of operations, so a token's bits do not depend on M. */
#include <string.h>

#define DP(acc, w, xv) _mm512_dpbf16_ps((acc), (__m512bh)(w), (__m512bh)(xv))
#include "kernels/uk_avx512.h"

/* tokens [m0, m1) of x [M][K] as bf16 (rounded to nearest even), 64 columns at a time (K % 64 ==
 * 0), each token ldp apart with zeros from K (an FP8 pack's K padded to 128) */
static void x16_pack(const float *x, int64_t K, int64_t ldp, int64_t m0, int64_t m1, uint16_t *xp) {
    for (int64_t m = m0; m < m1; m++) {
        uint16_t *d = xp + m * ldp;
        for (int64_t i = 0; i < K; i += 64) {
            const float *s = x + m * K + i;
            _mm512_storeu_si512(d + i, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + 16), _mm512_loadu_ps(s)));
            _mm512_storeu_si512(d + i + 32,
                                (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + 48), _mm512_loadu_ps(s + 32)));
        }
        if (ldp > K) memset(d + K, 0, (size_t)(ldp - K) * sizeof(uint16_t));
    }
}

/* tokens a register block (two chains each, 16 accumulators): 8 read 0.96-1.27x of 12 in bench dense
 * FP8 at 12-320 tokens (12 took 52-55% of the vdpbf16ps peak at 12 and 24 tokens, 8 63-71%) */
enum { XP_MT = 8 };

/* FP8, TK tokens (at most XP_MT) over one tile, the E4M3 lines decoded in registers; y (TK rows of
 * 16, ldy apart) takes each group's total */
INL void xp_fp8_lines(const uint8_t *tile, const float *bs, int64_t Kp, const uint16_t *x, float *y, int64_t ldy,
                      const int TK) {
    const fp8_lut t = fp8_lut_load();
    for (int64_t kb = 0; kb < Kp / 128; kb++) {
        const uint8_t *p = tile + kb * 2048;
        __m512 c0[XP_MT], c1[XP_MT];
        #pragma GCC unroll 8
        for (int m = 0; m < TK; m++) c0[m] = c1[m] = _mm512_setzero_ps();
        for (int g = 0; g < 32; g++) {
            __m512i z0, z1;
            PF_FP8(p + g * 64);
            fp8_line_bf16(&t, p + g * 64, &z0, &z1, TK == 1);
            #pragma GCC unroll 8
            for (int m = 0; m < TK; m++) {
                const uint16_t *xm = x + m * Kp + kb * 128 + 4 * g;
                c0[m] = DP(c0[m], z0, bcast_pair(xm));
                c1[m] = DP(c1[m], z1, bcast_pair(xm + 2));
            }
        }
        const __m512 s = _mm512_set1_ps(bs[kb]);
        #pragma GCC unroll 8
        for (int m = 0; m < TK; m++) {
            float *ym = y + m * ldy;
            _mm512_storeu_ps(ym, _mm512_fmadd_ps(_mm512_add_ps(c0[m], c1[m]), s,
                                                 kb ? _mm512_loadu_ps(ym) : _mm512_setzero_ps()));
        }
    }
}

/* FP8, TK tokens over one 128-column group decoded into buf (64 pair vectors, the lines' two
 * vectors in turn), x at the group's first column: the chains and the fold of xp_fp8_lines */
INL void xp_fp8_pairs(const __m512i *buf, const uint16_t *x, int64_t ldx, float s0, float *y, int64_t ldy,
                      int first, const int TK) {
    __m512 c0[XP_MT], c1[XP_MT];
    #pragma GCC unroll 8
    for (int m = 0; m < TK; m++) c0[m] = c1[m] = _mm512_setzero_ps();
    #pragma GCC unroll 4
    for (int pr = 0; pr < 64; pr += 2) {
        const __m512i w0 = _mm512_load_si512(buf + pr), w1 = _mm512_load_si512(buf + pr + 1);
        #pragma GCC unroll 8
        for (int m = 0; m < TK; m++) {
            c0[m] = DP(c0[m], w0, bcast_pair(x + m * ldx + 2 * pr));
            c1[m] = DP(c1[m], w1, bcast_pair(x + m * ldx + 2 * pr + 2));
        }
    }
    const __m512 s = _mm512_set1_ps(s0);
    #pragma GCC unroll 8
    for (int m = 0; m < TK; m++) {
        float *ym = y + m * ldy;
        _mm512_storeu_ps(ym, _mm512_fmadd_ps(_mm512_add_ps(c0[m], c1[m]), s,
                                             first ? _mm512_setzero_ps() : _mm512_loadu_ps(ym)));
    }
}

/* BF16, TK tokens over one tile read in place (Kp % 4 == 0) */
INL void xp_bf16_body(const uint8_t *tile, int64_t Kp, const uint16_t *x, float *y, int64_t ldy, const int TK) {
    __m512 c0[XP_MT], c1[XP_MT];
    #pragma GCC unroll 8
    for (int m = 0; m < TK; m++) c0[m] = c1[m] = _mm512_setzero_ps();
    for (int64_t g = 0; g < Kp / 2; g += 2) {
        PF(tile + g * 64);
        PF(tile + g * 64 + 64);
        const __m512i w0 = _mm512_load_si512(tile + g * 64), w1 = _mm512_load_si512(tile + g * 64 + 64);
        #pragma GCC unroll 8
        for (int m = 0; m < TK; m++) {
            c0[m] = DP(c0[m], w0, bcast_pair(x + m * Kp + 2 * g));
            c1[m] = DP(c1[m], w1, bcast_pair(x + m * Kp + 2 * g + 2));
        }
    }
    #pragma GCC unroll 8
    for (int m = 0; m < TK; m++) _mm512_storeu_ps(y + m * ldy, _mm512_add_ps(c0[m], c1[m]));
}

/* tile t's 16 rows for M tokens of x (Kp apart) into y (16 columns a token, ldy apart) */
static void x16_tile(const mr_pmatrix *P, int64_t t, const void *xv, int64_t M, float *y, int64_t ldy,
                     void *scratch) {
    const uint16_t *x = xv;
    const uint8_t *tile = P->data + (size_t)t * P->tile_bytes;
    const int64_t Kp = P->Kp;
    if (P->fmt == MR_FMT_BF16) {
        for (int64_t m0 = 0, mt; m0 < M; m0 += mt) {
            mt = token_block(M - m0, XP_MT);
#define CALL(n) xp_bf16_body(tile, Kp, x + m0 * Kp, y + m0 * ldy, ldy, n)
            DISPATCH_MT(mt, CALL)
#undef CALL
        }
        return;
    }
    const float *bs = P->tscale + t * (Kp / 128);
    if (M <= XP_MT) {
#define CALL(n) xp_fp8_lines(tile, bs, Kp, x, y, ldy, n)
        DISPATCH_MT(M, CALL)
#undef CALL
        return;
    }
    const fp8_lut lut = fp8_lut_load();
    __m512i *b = (__m512i *)scratch; /* 4 KiB */
    for (int64_t kb = 0; kb < Kp / 128; kb++) {
        fp8_block_pairs(&lut, tile + kb * 2048, b, 0);
        for (int64_t m0 = 0, mt; m0 < M; m0 += mt) {
            mt = token_block(M - m0, XP_MT);
#define CALL(n) xp_fp8_pairs(b, x + m0 * Kp + kb * 128, Kp, bs[kb], y + m0 * ldy, ldy, kb == 0, n)
            DISPATCH_MT(mt, CALL)
#undef CALL
        }
    }
}

static void rows_x16(const mr_pmatrix *P, int64_t n0, int64_t nr, const void *xp, int64_t M, float *y, int64_t ldy,
                     void *scratch) {
    mr__pk_rows(x16_tile, 2, 16, P, n0, nr, xp, M, y, ldy, scratch);
}

void mr__dense_fill_avx512bf16(mr_kernels *k) {
    if (k->flags & MR_CPU_AVX512FP16) return; /* vdpbf16ps at half the FMA rate there (uk_avx512bf16.c) */
    k->rows_x16[MR_FMT_FP8_BLOCK].name = "rows_x16_fp8_r16k4_avx512bf16_16x8_l1_16x128x8";
    k->rows_x16[MR_FMT_FP8_BLOCK].pack = MR_PACK_FP8_R16K4;
    k->rows_x16[MR_FMT_BF16].name = "rows_x16_bf16_r16k2_avx512bf16_16x8";
    k->rows_x16[MR_FMT_BF16].pack = MR_PACK_BF16_R16K2;
    for (int f = 0; f < MR_FMT_COUNT; f++)
        if (k->rows_x16[f].name) k->rows_x16[f].fn = rows_x16, k->rows_x16[f].xpack = x16_pack;
}
