/* uk_avx2.c — AVX2 + FMA + F16C packed micro-kernels, behind the contract of
 * moerun/kernels.h (one 16-row tile, all of Kp, any M, y written not read),
 * on the ymm layouts declared there (fp8_y16, nvfp4_y16i, nvfp4_y16f) and on
 * bf16_r16k2. Research and timings: dev/perf/README.md (AVX2 section).
 *  fp8 gemv     32 E4M3 bytes of a k pair -> 4 x 8 fp32 rows with integer
 *               ops only (vpsllw 8, 2 vpsraw 4, 2 vpmaddwd by 2^12 of the
 *               sign-extended low word, 4 ands with 0x87F00000: value *
 *               2^-120, E4M3 subnormals on fp32 subnormals) and x
 *               converted to fp32 * 2^112 per 128 k (or so from the
 *               caller, once for many tiles: mr_uk_act.xd), so every product is
 *               the exact fp32 value w * x * 2^-8 (2^8 folded into the block
 *               multiplier); a 128-k block where some |x| >= 2^16 (or Inf /
 *               NaN) takes the weights times 2^112 (value * 2^-8) and x as
 *               is instead, which gives the same products. 2 FMAs per token
 *               per k. NaN codes survive neither: a matrix holding one
 *               (mr_pmatrix.has_nan) goes through the exact generic driver.
 *               A block with many subnormal codes (mr_pmatrix.tsub) takes
 *               e4m3x32_x and x as is: an fp32 subnormal operand costs an
 *               Intel core a microcode assist (~30 cycles an FMA, ~100 a
 *               multiply; none on Zen), and uniform random codes made the
 *               layer 30x slower there (bench/README.md).
 *  fp8 gemm     a 16x128 block decoded once into scratch (L1), then 6-token
 *               register blocks: 2 loads + 6 broadcasts + 12 FMAs per k
 *               (the shared f32_core); pipelined: where every token has
 *               x * 2^112 from the caller (mr_uk_act.xd), the next block is
 *               decoded (times 2^-120) beside the FMAs of the current one,
 *               else times 2^-8 after them (e4m3x32_x for a marked block).
 *  nvfp4_i8     vpshufb nibble -> u8 = 2*e2m1 + 12 (8 rows x 4 k per ymm),
 *               vpmaddubsw with the broadcast dword of 4 int8 activations
 *               (int16 lanes: row x pair), 4 summed in int16, vpmaddwd with
 *               ones -> one int32 per row, plus xb = -12*sum(x), then fp32
 *               and one FMA with the 16 row scales (E4M3 by
 *               the f16 trick) times the activation multiplier; w4a8 (xs
 *               shared by 8 blocks) sums the blocks first and applies xs once
 *               per 128 k. Many tokens: each block decoded once into 8
 *               registers, then every token over it (sums in y).
 *  nvfp4_bf16   two vpshufb LUTs give the bf16 bytes of E2M1, unpacked and
 *               widened to fp32 (shift / mask); gemv: 4 FMAs per token per
 *               4 k, row scales per block; gemm: the weights times their
 *               scale (exact) decoded to scratch, then f32_core. Where the
 *               caller gives x as fixed point (mr_uk_act.xq, made by
 *               xq_row_avx2 below; this table sets uk_gemv_xq), the gemv
 *               runs on integers instead (uk_avx2_nvw.h): one vpshufb to
 *               int8, two unpacks to int16, vpmaddwd + vpaddd per token.
 *  bf16         bf16 pairs widened exactly (shift / mask); gemv: FMAs with
 *               broadcast fp32 x; gemm: decoded to scratch, then f32_core.
 * The gemm kernels of the other bf16-input kinds take x widened to fp32 from
 * the caller (mr_uk_act.xw; this table sets their uk_gemm_xw): widening it here,
 * per tile, cost ~20% of a tile at 16-64 tokens (bench/README.md, Zen 2); fp8's
 * take x * 2^112 (uk_xd) instead.
 * Weight streams are prefetched MR_UK_PREFETCH bytes ahead into L2 and, for
 * the decode-heavy gemv kernels, into L1 too (PF_FP8, PF_NV below). */
#include <math.h>

#include "kernels/uk_avx2.h"

enum {
    MTF = 6,  /* tokens per register block of f32_core (12 accumulators) */
    MTV = 4,  /* fp8 gemv and bf16 gemv */
    MTB = 2,  /* nvfp4 bf16 gemv */
    XCH = 128 /* k per chunk of converted activations / decoded weights */
};

/* n bf16 values -> fp32 (exact) */
INL void bf16_to_f32(const uint16_t *x, int n, float *dst) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_store_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; i < n; i++) {
        const uint32_t u = (uint32_t)x[i] << 16;
        memcpy(dst + i, &u, 4);
    }
}

/* ---------------- the fp32 register-blocked core (gemm kernels) ----------------
 * acc[m] (rows 0-7, 8-15) = sum_{k < nk} wb[k][0..15] * x[m][k]; wb 32-byte
 * aligned [nk][16] fp32 in scratch, x fp32 rows ldx apart. */
/* column k of wb into the MT tokens' sums: 2 loads, MT broadcasts, 2 MT FMAs */
INL void f32_step(const float *wb, const float *x, int64_t ldx, int k, __m256 acc[][2], const int MT) {
    const __m256 w0 = _mm256_load_ps(wb + 16 * k), w1 = _mm256_load_ps(wb + 16 * k + 8);
    #pragma GCC unroll 8
    for (int m = 0; m < MT; m++) {
        const __m256 xv = _mm256_broadcast_ss(x + m * ldx + k);
        acc[m][0] = _mm256_fmadd_ps(w0, xv, acc[m][0]);
        acc[m][1] = _mm256_fmadd_ps(w1, xv, acc[m][1]);
    }
}
INL void f32_core(const float *wb, const float *x, int64_t ldx, int nk, __m256 acc[][2], const int MT) {
    #pragma GCC unroll 8
    for (int m = 0; m < MT; m++) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    #pragma GCC unroll 2
    for (int k = 0; k < nk; k++) f32_step(wb, x, ldx, k, acc, MT);
}

/* e4m3x32_d's constants (the and mask, 2^12 for vpmaddwd), read through a pointer the compiler
 * cannot see through: so they stay memory operands, where hoisted into registers beside 12
 * accumulators they made f32_core_dec spill */
static const uint32_t DEC_C[2][8] __attribute__((aligned(32))) = {
    {0x87F00000u, 0x87F00000u, 0x87F00000u, 0x87F00000u, 0x87F00000u, 0x87F00000u, 0x87F00000u, 0x87F00000u},
    {4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096}};
INL __m256i dec_const(int i) {
    const __m256i *c = (const __m256i *)DEC_C[i];
    __asm__ volatile("" : "+r"(c));
    return _mm256_load_si256(c);
}

/* pair g of a 16 x 128 block (p at the block) into wb by e4m3x32_d, each vector stored as made
 * (three registers beside f32_core's) */
INL void fp8_pair_store_d(const uint8_t *p, int g, float *wb) {
    const uint8_t *q = p + 32 * g;
    __m256i *d = (__m256i *)(wb + 32 * g);
    if ((g & 1) == 0) PF(q);
    const __m256i v = _mm256_load_si256((const __m256i *)q), t = _mm256_slli_epi16(v, 8);
    _mm256_store_si256(d, _mm256_and_si256(_mm256_madd_epi16(t, dec_const(1)), dec_const(0)));
    _mm256_store_si256(d + 1, _mm256_and_si256(_mm256_madd_epi16(v, dec_const(1)), dec_const(0)));
    _mm256_store_si256(d + 2, _mm256_and_si256(_mm256_srai_epi16(t, 4), dec_const(0)));
    _mm256_store_si256(d + 3, _mm256_and_si256(_mm256_srai_epi16(v, 4), dec_const(0)));
}

/* f32_core over a 128-k block, and after each k pair g, pair g of the next 16 x 128 FP8 block pn
 * decoded into wn */
INL void f32_core_dec(const float *wb, const float *x, int64_t ldx, __m256 acc[][2], const int MT, const uint8_t *pn,
                      float *wn) {
    #pragma GCC unroll 8
    for (int m = 0; m < MT; m++) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    for (int g = 0; g < 64; g++) {
        f32_step(wb, x, ldx, 2 * g, acc, MT);
        f32_step(wb, x, ldx, 2 * g + 1, acc, MT);
        fp8_pair_store_d(pn, g, wn);
    }
}

/* The token loop of the gemm kernels over one decoded chunk wb [nk][16]:
 * tokens in balanced blocks of up to MTF; x rows are bf16 (converted into
 * xf, [MTF][XCH] in scratch) or fp32 (xf32 != NULL, used in place); segments
 * of seg k (seg divides nk, or nk itself) each scaled by s(m, segment) into
 * y: y += acc * s, or y = acc * s where first (the first chunk). s is
 * ss[seg index] times xs[m][xs0 + seg index] when xs != NULL. */
typedef struct {
    const uint16_t *xb16; /* bf16 x at this chunk's first k, or NULL */
    const float *xf32;    /* fp32 x at this chunk's first k, or NULL */
    int64_t ldx;
    const float *xs; /* per-segment activation multipliers (at the chunk's first segment), or NULL */
    int64_t ldxs;
    float ss; /* the segment multiplier common to all tokens */
} gemm_in;

INL void gemm_tokens_n(const float *wb, int nk, int seg, const gemm_in *in, int64_t m0, float *y, int64_t ldy,
                       float *xf, int first, const uint8_t *pn, float *wn, const int MT) {
    const float *x;
    int64_t ldx;
    if (in->xf32) {
        x = in->xf32 + m0 * in->ldx, ldx = in->ldx;
    } else {
        for (int m = 0; m < MT; m++) bf16_to_f32(in->xb16 + (m0 + m) * in->ldx, nk, xf + m * XCH);
        x = xf, ldx = XCH;
    }
    __m256 acc[MTF][2];
    if (pn) seg = nk; /* (128: one segment) */
    for (int s0 = 0, si = 0; s0 < nk; s0 += seg, si++) {
        if (pn)
            f32_core_dec(wb, x, ldx, acc, MT, pn, wn);
        else
            f32_core(wb + 16 * s0, x + s0, ldx, seg, acc, MT);
        #pragma GCC unroll 8
        for (int m = 0; m < MT; m++) {
            const __m256 s = _mm256_set1_ps(in->ss * (in->xs ? in->xs[(m0 + m) * in->ldxs + si] : 1.0f));
            y_update(y + (m0 + m) * ldy, acc[m][0], acc[m][1], s, s, first && s0 == 0);
        }
    }
}

/* pn (or NULL): the next 16 x 128 FP8 block, decoded into wn beside the first token block's FMAs
 * (nk = seg = 128; uk_fp8_gemm) */
static void gemm_tokens(const float *wb, int nk, int seg, const gemm_in *in, int64_t M, float *y, int64_t ldy,
                        float *xf, int first, const uint8_t *pn, float *wn) {
    for (int64_t m0 = 0, mt; m0 < M; m0 += mt, pn = NULL) {
        mt = mr__uk_token_block(M - m0, MTF);
        switch (mt) {
        case 1: gemm_tokens_n(wb, nk, seg, in, m0, y, ldy, xf, first, pn, wn, 1); break;
        case 2: gemm_tokens_n(wb, nk, seg, in, m0, y, ldy, xf, first, pn, wn, 2); break;
        case 3: gemm_tokens_n(wb, nk, seg, in, m0, y, ldy, xf, first, pn, wn, 3); break;
        case 4: gemm_tokens_n(wb, nk, seg, in, m0, y, ldy, xf, first, pn, wn, 4); break;
        case 5: gemm_tokens_n(wb, nk, seg, in, m0, y, ldy, xf, first, pn, wn, 5); break;
        default: gemm_tokens_n(wb, nk, seg, in, m0, y, ldy, xf, first, pn, wn, 6); break;
        }
    }
}

/* scratch of the gemm kernels: the decoded chunk [XCH][16] fp32 (8 KiB),
 * then the converted activations [MTF][XCH] (3 KiB) */
static float *scratch_wb(void *scratch) { return (float *)scratch; }
static float *scratch_xf(void *scratch) { return (float *)scratch + XCH * 16; }

/* the exact generic driver with an FMA stage: fp8 tiles with NaN codes */
static void stage_fma(const float *w, const float *x, int nk, float *acc) {
    __m256 a0 = _mm256_loadu_ps(acc), a1 = _mm256_loadu_ps(acc + 8);
    for (int k = 0; k < nk; k++) {
        const __m256 xv = _mm256_broadcast_ss(x + k);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + 16 * k), xv, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + 16 * k + 8), xv, a1);
    }
    _mm256_storeu_ps(acc, a0);
    _mm256_storeu_ps(acc + 8, a1);
}

/* ---------------- FP8 (fp8_y16) ---------------- */
/* n (multiple of 8) bf16 -> fp32 * 2^112 (exact while |x| < 2^16), from x16 or, where given,
 * from the same values widened (x32: mr_uk_act.xw); returns whether every |x| < 2^16 (no Inf /
 * NaN, no overflow of the scaling) */
INL int bf16_to_f32_s112(const uint16_t *x16, const float *x32, int n, float *dst) {
    const __m256 sc = _mm256_set1_ps(0x1p112f);
    const __m256i am = _mm256_set1_epi32(0x7FFF0000);
    __m256i mx = _mm256_setzero_si256();
    for (int i = 0; i < n; i += 8) {
        const __m256i v = x32 ? _mm256_castps_si256(_mm256_loadu_ps(x32 + i))
                              : _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x16 + i))), 16);
        mx = _mm256_max_epu32(mx, _mm256_and_si256(v, am));
        _mm256_store_ps(dst + i, _mm256_mul_ps(_mm256_castsi256_ps(v), sc));
    }
    const __m256i big = _mm256_cmpgt_epi32(mx, _mm256_set1_epi32(0x477FFFFF)); /* >= 2^16 */
    return _mm256_testz_si256(big, big);
}

/* one 128-k block of the fp8 gemv: D 1 (weights * 2^-120, x * 2^112) or not
 * (weights * 2^-8, x as is; D 2: by e4m3x32_x, for a block with subnormal
 * codes); the products are the same fp32 values every way, so they give
 * the same bits. NC accumulator chains per token (8 chains at M 1 and 2:
 * the FMA latency is 4 at 2 per cycle) */
INL void fp8_gemv_blk(const uint8_t *p, const float *xf, int64_t ldf, __m256 acc[][MTV][2], const int M,
                      const int NC, const int D) {
    for (int k = 0; k < 128; k += 4) {
        PF_FP8(p + 16 * k);
        #pragma GCC unroll 2
        for (int u = 0; u < 2; u++) {
            __m256 o[4];
            if (D == 1)
                e4m3x32_d(p + 16 * (k + 2 * u), o);
            else if (D == 2)
                e4m3x32_x(p + 16 * (k + 2 * u), o);
            else
                e4m3x32_s8(p + 16 * (k + 2 * u), o);
            const int c0 = NC == 4 ? 2 * u : 0, c1 = NC >= 2 ? c0 + 1 : 0;
            #pragma GCC unroll 4
            for (int m = 0; m < M; m++) {
                const __m256 x0 = _mm256_broadcast_ss(xf + m * ldf + k + 2 * u);
                acc[c0][m][0] = _mm256_fmadd_ps(o[0], x0, acc[c0][m][0]);
                acc[c0][m][1] = _mm256_fmadd_ps(o[1], x0, acc[c0][m][1]);
                const __m256 x1 = _mm256_broadcast_ss(xf + m * ldf + k + 2 * u + 1);
                acc[c1][m][0] = _mm256_fmadd_ps(o[2], x1, acc[c1][m][0]);
                acc[c1][m][1] = _mm256_fmadd_ps(o[3], x1, acc[c1][m][1]);
            }
        }
    }
}

INL void fp8_gemv_body(const uint8_t *tile, const float *bs, const uint8_t *sub, int64_t Kp, const uint16_t *x,
                       int64_t ldx, const float *xw, int64_t ldxw, const float *xd, int64_t ldxd, const float *xs,
                       int64_t ldxs, float *y, int64_t ldy, float *xf, const int M, const int INV) {
    enum { NCMAX = 4 };
    const int NC = INV ? 1 : M == 1 ? 4 : M == 2 ? 2 : 1;
    for (int64_t kb = 0; kb < Kp / 128; kb++) {
        int direct = !sub[kb], given = direct && xd; /* given: the caller's x * 2^112 (mr_uk_act.xd) */
        for (int m = 0; m < M && given; m++) given &= !isnan(xd[m * ldxd + kb * 128]);
        if (!given)
            #pragma GCC unroll 4
            for (int m = 0; m < M && direct; m++)
                direct &= bf16_to_f32_s112(x + m * ldx + kb * 128, xw ? xw + m * ldxw + kb * 128 : NULL, 128,
                                           xf + m * 128);
        if (!direct)
            #pragma GCC unroll 4
            for (int m = 0; m < M; m++) {
                if (xw)
                    memcpy(xf + m * 128, xw + m * ldxw + kb * 128, 128 * sizeof(float));
                else
                    bf16_to_f32(x + m * ldx + kb * 128, 128, xf + m * 128);
            }
        const uint8_t *p = tile + kb * 2048;
        __m256 acc[NCMAX][MTV][2];
        #pragma GCC unroll 4
        for (int m = 0; m < M; m++)
            #pragma GCC unroll 4
            for (int c = 0; c < NCMAX; c++) acc[c][m][0] = acc[c][m][1] = _mm256_setzero_ps();
        if (given)
            fp8_gemv_blk(p, xd + kb * 128, ldxd, acc, M, NC, 1);
        else if (direct)
            fp8_gemv_blk(p, xf, 128, acc, M, NC, 1);
        else if (sub[kb])
            fp8_gemv_blk(p, xf, 128, acc, M, NC, 2);
        else
            fp8_gemv_blk(p, xf, 128, acc, M, NC, 0);
        #pragma GCC unroll 4
        for (int m = 0; m < M; m++) {
            __m256 a0 = acc[0][m][0], a1 = acc[0][m][1];
            if (NC == 4) /* explicit: a loop here leaves acc in memory at M = 2 (hot_uk M=2, best of 6: 18.2 -> 12.1 GB/s) */
                a0 = _mm256_add_ps(_mm256_add_ps(a0, acc[2][m][0]), _mm256_add_ps(acc[1][m][0], acc[3][m][0])),
                a1 = _mm256_add_ps(_mm256_add_ps(a1, acc[2][m][1]), _mm256_add_ps(acc[1][m][1], acc[3][m][1]));
            else if (NC == 2)
                a0 = _mm256_add_ps(a0, acc[1][m][0]), a1 = _mm256_add_ps(a1, acc[1][m][1]);
            const __m256 s = _mm256_set1_ps(256.0f * bs[kb] * (xs ? xs[m * ldxs + kb] : 1.0f));
            y_update(y + m * ldy, a0, a1, s, s, kb == 0);
        }
    }
}

/* INV: one chain a token at every count, the gemm's sums (uk_fp8_inv) */
INL void fp8_gemv_run(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                      void *scratch, const int INV) {
    if (W->has_nan) {
        mr__uk_drive(MR_UK_FP8_BF16, W, t, a, M, y, ldy, scratch, stage_fma);
        return;
    }
    const uint8_t *tile = W->data + (size_t)t * W->tile_bytes;
    const float *bs = W->tscale + t * (W->Kp / 128);
    const uint8_t *sub = W->tsub + t * (W->Kp / 128);
    float *xf = scratch;
    for (int64_t m0 = 0, mt; m0 < M; m0 += mt) {
        mt = mr__uk_token_block(M - m0, MTV);
        const uint16_t *x = (const uint16_t *)a->x + m0 * a->ldx;
        const float *xs = a->xs ? a->xs + m0 * a->ldxs : NULL;
        const float *xw = a->xw ? a->xw + m0 * a->ldxw : NULL, *xd = a->xd ? a->xd + m0 * a->ldxd : NULL;
#define CALL(n)                                                                                                        \
    fp8_gemv_body(tile, bs, sub, W->Kp, x, a->ldx, xw, a->ldxw, xd, a->ldxd, xs, a->ldxs, y + m0 * ldy, ldy, xf, n, INV)
        switch (mt) {
        case 1: CALL(1); break;
        case 2: CALL(2); break;
        case 3: CALL(3); break;
        default: CALL(4); break;
        }
#undef CALL
    }
    apply_post(y, ldy, M, a->post * W->scale2);
}
static void uk_fp8_gemv(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                        void *scratch) {
    fp8_gemv_run(W, t, a, M, y, ldy, scratch, 0);
}

/* The fp8 gemm, pipelined: the FMAs of block kb run over its decoded copy while the next block is
 * decoded beside them into the other half of the scratch (FP8_WB floats each; the bf16 x of a
 * token block converted after them, where a block reads neither xd nor xw). A block takes form 1
 * (weights * 2^-120, x * 2^112 from mr_uk_act.xd) where every token has that form and the block
 * is not marked (tsub), else the weights * 2^-8 (form 0, or 2 for a marked block) against x as is;
 * the products, and so the bits, are the same every way. Only a form-1 next block is decoded
 * beside the FMAs: its integer ops and stores then hide under them (dev/perf/hot_uk, 1 thread:
 * 1.03-1.12x at 5-16 tokens), where a form-0 decode's four vmulps a pair competed for the FMA
 * ports and gained nothing; the others are decoded after the block's FMAs. */
enum { FP8_WB = 16 * XCH };

/* the form of block kb (above) */
static int fp8_blk_form(const mr_uk_act *a, const uint8_t *sub, int64_t kb, int64_t M) {
    if (sub[kb]) return 2;
    if (!a->xd) return 0;
    for (int64_t m = 0; m < M; m++)
        if (isnan(a->xd[m * a->ldxd + kb * 128])) return 0;
    return 1;
}

static void uk_fp8_gemm(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                        void *scratch) {
    if (W->has_nan) {
        mr__uk_drive(MR_UK_FP8_BF16, W, t, a, M, y, ldy, scratch, stage_fma);
        return;
    }
    const uint8_t *tile = W->data + (size_t)t * W->tile_bytes;
    const float *bs = W->tscale + t * (W->Kp / 128);
    const uint8_t *sub = W->tsub + t * (W->Kp / 128);
    float *wbuf[2] = {(float *)scratch, (float *)scratch + FP8_WB}, *xf = (float *)scratch + 2 * FP8_WB;
    const int64_t nkb = W->Kp / 128;
    int D = fp8_blk_form(a, sub, 0, M);
    fp8_decode_blk(tile, wbuf[0], D);
    for (int64_t kb = 0; kb < nkb; kb++) {
        const int Dn = kb + 1 < nkb ? fp8_blk_form(a, sub, kb + 1, M) : -1;
        const uint8_t *pn = tile + (kb + 1) * 2048;
        float *wb = wbuf[kb & 1], *wn = wbuf[(kb + 1) & 1];
        gemm_in in = {.xb16 = (const uint16_t *)a->x + kb * 128, .xf32 = a->xw ? a->xw + kb * 128 : NULL,
                      .ldx = a->xw ? a->ldxw : a->ldx, .xs = a->xs ? a->xs + kb : NULL, .ldxs = a->ldxs,
                      .ss = 256.0f * bs[kb]};
        if (D == 1) in.xb16 = NULL, in.xf32 = a->xd + kb * 128, in.ldx = a->ldxd;
        gemm_tokens(wb, 128, 128, &in, M, y, ldy, xf, kb == 0, Dn == 1 ? pn : NULL, wn);
        if (Dn == 0 || Dn == 2) fp8_decode_blk(pn, wn, Dn);
        D = Dn;
    }
    apply_post(y, ldy, M, a->post * W->scale2);
}

/* the batch-invariant fp8 kernel (mr_kernels.uk_inv): below the table's gemm threshold the gemv
 * with one chain a token, which sums as the gemm does (the same exact products in the same
 * order, the same block scaling; tests/test_kernels.c checks it), the gemm from there. The gemm
 * alone at one token cost a third of the decode speed (bench/README.md). */
enum { FP8_GEMM_MIN_M = 5 };
static void uk_fp8_inv(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                       void *scratch) {
    if (M < FP8_GEMM_MIN_M)
        fp8_gemv_run(W, t, a, M, y, ldy, scratch, 1);
    else
        uk_fp8_gemm(W, t, a, M, y, ldy, scratch);
}

/* ---------------- NVFP4, int8 activations (nvfp4_y16i) ---------------- */
/* one token's block sums, rows 0-7 / 8-15 as fp32: the pair sums of
 * nvi_pairs (uk_avx2.h), vpmaddwd with ones adds each row's two lanes into an
 * int32, and xb = -12*sum(x) removes the bias of the u8 weights */
INL void nvi_token(const __m256i U[8], const int8_t *x16, const int32_t *xb, __m256 *f0, __m256 *f1) {
    __m256i a, b;
    nvi_pairs(U, x16, &a, &b);
    const __m256i one = _mm256_set1_epi16(1), bias = _mm256_set1_epi32(*xb);
    *f0 = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(a, one), bias));
    *f1 = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(b, one), bias));
}

#define NVI_TOKEN nvi_token
#define NVI_KERNEL uk_nvfp4_i8
#include "kernels/uk_avx2_nvi.h"

/* ---------------- NVFP4, bf16 activations (nvfp4_y16f) ---------------- */
/* bf16 bytes of e2m1(c): high byte (sign included) and low byte */
static const uint8_t BHI[16] = {0x00, 0x3F, 0x3F, 0x3F, 0x40, 0x40, 0x40, 0x40,
                                0x80, 0xBF, 0xBF, 0xBF, 0xC0, 0xC0, 0xC0, 0xC0};
static const uint8_t BLO[16] = {0x00, 0x00, 0x80, 0xC0, 0x00, 0x40, 0x80, 0xC0,
                                0x00, 0x00, 0x80, 0xC0, 0x00, 0x40, 0x80, 0xC0};

/* nibble h of the 32 bytes V -> fp32: a0/a1 = rows 0-7 / 8-15 at k, b0/b1 at
 * k + 1 (k = 16j + 4v + 2h, the pack's order) */
INL void nvf_dec(__m256i V, int h, __m256i lhi, __m256i llo, __m256 *a0, __m256 *a1, __m256 *b0, __m256 *b1) {
    const __m256i m0f = _mm256_set1_epi8(0x0F), hm = _mm256_set1_epi32((int)0xFFFF0000u);
    const __m256i idx = _mm256_and_si256(h ? _mm256_srli_epi16(V, 4) : V, m0f);
    const __m256i H = _mm256_shuffle_epi8(lhi, idx), L = _mm256_shuffle_epi8(llo, idx);
    const __m256i W0 = _mm256_unpacklo_epi8(L, H), W1 = _mm256_unpackhi_epi8(L, H);
    *a0 = _mm256_castsi256_ps(_mm256_slli_epi32(W0, 16));
    *b0 = _mm256_castsi256_ps(_mm256_and_si256(W0, hm));
    *a1 = _mm256_castsi256_ps(_mm256_slli_epi32(W1, 16));
    *b1 = _mm256_castsi256_ps(_mm256_and_si256(W1, hm));
}

/* M <= MTB tokens; chains: 1 token, 4 (k, k+1) x (nibble) per half; 2
 * tokens, 2 per half each. Out in y after each block (scale per block). */
INL void nvf_gemv_body(const uint8_t *tile, int64_t Kp, const uint16_t *x, int64_t ldx, const float *xs,
                       int64_t ldxs, float *y, int64_t ldy, float *xf, const int M) {
    const __m256i lhi = lut16(BHI), llo = lut16(BLO);
    const uint8_t *scp = tile + 8 * Kp;
    const int NC = M == 1 ? 4 : 2;
    __m256 o0 = _mm256_setzero_ps(), o1 = o0;
    for (int64_t j = 0; j < Kp / 16; j++) {
        const int64_t jc = j % (XCH / 16);
        if (jc == 0) {
            const int nk = (int)(Kp - 16 * j < XCH ? Kp - 16 * j : XCH);
            #pragma GCC unroll 2
            for (int m = 0; m < M; m++) bf16_to_f32(x + m * ldx + 16 * j, nk, xf + m * XCH);
        }
        PF_NV(tile + j * 128);
        PF_NV(tile + j * 128 + 64);
        if ((j & 3) == 0) PF(scp + 16 * j);
        __m256 acc[4][MTB][2];
        #pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            #pragma GCC unroll 2
            for (int m = 0; m < M; m++) acc[c][m][0] = acc[c][m][1] = _mm256_setzero_ps();
        #pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            const __m256i V = _mm256_load_si256((const __m256i *)(tile + j * 128 + 32 * v));
            #pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m256 a0, a1, b0, b1;
                nvf_dec(V, h, lhi, llo, &a0, &a1, &b0, &b1);
                const int ca = NC == 4 ? 2 * h : 0, cb = ca + 1;
                #pragma GCC unroll 2
                for (int m = 0; m < M; m++) {
                    const float *xk = xf + m * XCH + 16 * jc + 4 * v + 2 * h;
                    const __m256 x0 = _mm256_broadcast_ss(xk), x1 = _mm256_broadcast_ss(xk + 1);
                    acc[ca][m][0] = _mm256_fmadd_ps(a0, x0, acc[ca][m][0]);
                    acc[ca][m][1] = _mm256_fmadd_ps(a1, x0, acc[ca][m][1]);
                    acc[cb][m][0] = _mm256_fmadd_ps(b0, x1, acc[cb][m][0]);
                    acc[cb][m][1] = _mm256_fmadd_ps(b1, x1, acc[cb][m][1]);
                }
            }
        }
        __m256 sc0, sc1;
        e4m3x16(scp + 16 * j, &sc0, &sc1);
        #pragma GCC unroll 2
        for (int m = 0; m < M; m++) {
            __m256 s0 = _mm256_add_ps(acc[0][m][0], acc[1][m][0]), s1 = _mm256_add_ps(acc[0][m][1], acc[1][m][1]);
            if (NC == 4) {
                s0 = _mm256_add_ps(s0, _mm256_add_ps(acc[2][m][0], acc[3][m][0]));
                s1 = _mm256_add_ps(s1, _mm256_add_ps(acc[2][m][1], acc[3][m][1]));
            }
            const __m256 xv = _mm256_set1_ps(xs ? xs[m * ldxs + j] : 1.0f);
            const __m256 c0 = xs ? _mm256_mul_ps(sc0, xv) : sc0, c1 = xs ? _mm256_mul_ps(sc1, xv) : sc1;
            if (M == 1) o0 = _mm256_fmadd_ps(s0, c0, o0), o1 = _mm256_fmadd_ps(s1, c1, o1);
            else y_update(y + m * ldy, s0, s1, c0, c1, j == 0);
        }
    }
    if (M == 1) _mm256_storeu_ps(y, o0), _mm256_storeu_ps(y + 8, o1);
}

void mr__nvf_block_fp(const uint8_t *tile, int64_t j, const uint16_t *x16, __m256 *f0, __m256 *f1) {
    const __m256i lhi = lut16(BHI), llo = lut16(BLO);
    float xf[16];
    bf16_to_f32(x16, 16, xf);
    __m256 acc[2][2] = {{_mm256_setzero_ps(), _mm256_setzero_ps()}, {_mm256_setzero_ps(), _mm256_setzero_ps()}};
    for (int v = 0; v < 4; v++) {
        const __m256i V = _mm256_load_si256((const __m256i *)(tile + j * 128 + 32 * v));
        for (int h = 0; h < 2; h++) {
            __m256 a0, a1, b0, b1;
            nvf_dec(V, h, lhi, llo, &a0, &a1, &b0, &b1);
            const __m256 x0 = _mm256_broadcast_ss(xf + 4 * v + 2 * h), x1 = _mm256_broadcast_ss(xf + 4 * v + 2 * h + 1);
            acc[h][0] = _mm256_fmadd_ps(b0, x1, _mm256_fmadd_ps(a0, x0, acc[h][0]));
            acc[h][1] = _mm256_fmadd_ps(b1, x1, _mm256_fmadd_ps(a1, x0, acc[h][1]));
        }
    }
    *f0 = _mm256_add_ps(acc[0][0], acc[1][0]);
    *f1 = _mm256_add_ps(acc[0][1], acc[1][1]);
}

void mr__nvf_gemv_fp(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                     void *scratch) {
    const uint8_t *tile = W->data + (size_t)t * W->tile_bytes;
    float *xf = scratch;
    for (int64_t m0 = 0, mt; m0 < M; m0 += mt) {
        mt = mr__uk_token_block(M - m0, MTB);
        const uint16_t *x = (const uint16_t *)a->x + m0 * a->ldx;
        const float *xs = a->xs ? a->xs + m0 * a->ldxs : NULL;
        if (mt == 1) nvf_gemv_body(tile, W->Kp, x, a->ldx, xs, a->ldxs, y + m0 * ldy, ldy, xf, 1);
        else nvf_gemv_body(tile, W->Kp, x, a->ldx, xs, a->ldxs, y + m0 * ldy, ldy, xf, 2);
    }
    apply_post(y, ldy, M, 256.0f * a->post * W->scale2);
}

/* decoded chunk: k0 .. k0 + nk of the tile as fp32 [nk][16], each weight
 * times its row's block scale (e2m1 * e4m3 * 2^-8: exact) */
static void nvf_decode_chunk(const uint8_t *tile, int64_t Kp, int64_t k0, int nk, float *wb) {
    const __m256i lhi = lut16(BHI), llo = lut16(BLO);
    const uint8_t *scp = tile + 8 * Kp;
    for (int64_t j = k0 / 16; j < (k0 + nk) / 16; j++) {
        PF(tile + j * 128);
        PF(tile + j * 128 + 64);
        __m256 sc0, sc1;
        e4m3x16(scp + 16 * j, &sc0, &sc1);
        float *b = wb + 16 * (16 * j - k0);
        for (int v = 0; v < 4; v++) {
            const __m256i V = _mm256_load_si256((const __m256i *)(tile + j * 128 + 32 * v));
            for (int h = 0; h < 2; h++) {
                __m256 a0, a1, b0, b1;
                nvf_dec(V, h, lhi, llo, &a0, &a1, &b0, &b1);
                float *r = b + 16 * (4 * v + 2 * h);
                _mm256_store_ps(r, _mm256_mul_ps(a0, sc0));
                _mm256_store_ps(r + 8, _mm256_mul_ps(a1, sc1));
                _mm256_store_ps(r + 16, _mm256_mul_ps(b0, sc0));
                _mm256_store_ps(r + 24, _mm256_mul_ps(b1, sc1));
            }
        }
    }
}

static void uk_nvfp4_bf16_gemm(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y,
                               int64_t ldy, void *scratch) {
    const uint8_t *tile = W->data + (size_t)t * W->tile_bytes;
    float *wb = scratch_wb(scratch), *xf = scratch_xf(scratch);
    for (int64_t k0 = 0; k0 < W->Kp; k0 += XCH) {
        const int nk = (int)(W->Kp - k0 < XCH ? W->Kp - k0 : XCH);
        nvf_decode_chunk(tile, W->Kp, k0, nk, wb);
        /* with xs the multiplier changes every 16 k: segments of 16 */
        const gemm_in in = {.xb16 = (const uint16_t *)a->x + k0, .xf32 = a->xw ? a->xw + k0 : NULL,
                            .ldx = a->xw ? a->ldxw : a->ldx, .xs = a->xs ? a->xs + k0 / 16 : NULL, .ldxs = a->ldxs,
                            .ss = 1.0f};
        gemm_tokens(wb, nk, a->xs ? 16 : nk, &in, M, y, ldy, xf, k0 == 0, NULL, NULL);
    }
    apply_post(y, ldy, M, 256.0f * a->post * W->scale2);
}

#define NVW_DP(acc, w, x) _mm256_add_epi32((acc), _mm256_madd_epi16((w), (x)))
#define NVW_GEMV uk_nvfp4_bf16_gemv_xq
#include "kernels/uk_avx2_nvw.h"

/* ---------------- bf16 weights (bf16_r16k2) ---------------- */
/* M <= MTV tokens; x fp32 rows (bf16 inputs converted per chunk into xf) */
INL void bf16_gemv_body(const uint8_t *tile, int64_t Kp, const uint16_t *x16, const float *x32, int64_t ldx,
                        float *y, int64_t ldy, float *xf, const int M) {
    enum { NCMAX = 4 };
    const int NC = M == 1 ? 4 : M == 2 ? 2 : 1;
    __m256 acc[NCMAX][MTV][2];
    #pragma GCC unroll 4
    for (int c = 0; c < NCMAX; c++)
        #pragma GCC unroll 4
        for (int m = 0; m < M; m++) acc[c][m][0] = acc[c][m][1] = _mm256_setzero_ps();
    const int64_t np = Kp / 2;
    for (int64_t k0 = 0; k0 < Kp; k0 += XCH) {
        const int nk = (int)(Kp - k0 < XCH ? Kp - k0 : XCH);
        const float *xc;
        int64_t ldc;
        if (x32) {
            xc = x32 + k0, ldc = ldx;
        } else {
            #pragma GCC unroll 4
            for (int m = 0; m < M; m++) bf16_to_f32(x16 + m * ldx + k0, nk, xf + m * XCH);
            xc = xf, ldc = XCH;
        }
        for (int64_t g = k0 / 2; g < (k0 + nk) / 2; g += 2) {
            PF(tile + g * 64);
            PF(tile + g * 64 + 64);
            #pragma GCC unroll 2
            for (int u = 0; u < 2; u++) {
                if (g + u >= np) break;
                __m256 l0, l1, h0, h1;
                bf16_pair(tile + (g + u) * 64, &l0, &l1, &h0, &h1);
                const int cl = NC == 4 ? 2 * u : 0, ch = NC >= 2 ? cl + 1 : 0;
                #pragma GCC unroll 4
                for (int m = 0; m < M; m++) {
                    const float *xk = xc + m * ldc + 2 * (g + u) - k0;
                    const __m256 x0 = _mm256_broadcast_ss(xk), x1 = _mm256_broadcast_ss(xk + 1);
                    acc[cl][m][0] = _mm256_fmadd_ps(l0, x0, acc[cl][m][0]);
                    acc[cl][m][1] = _mm256_fmadd_ps(l1, x0, acc[cl][m][1]);
                    acc[ch][m][0] = _mm256_fmadd_ps(h0, x1, acc[ch][m][0]);
                    acc[ch][m][1] = _mm256_fmadd_ps(h1, x1, acc[ch][m][1]);
                }
            }
        }
    }
    #pragma GCC unroll 4
    for (int m = 0; m < M; m++) {
        __m256 s0 = acc[0][m][0], s1 = acc[0][m][1];
        #pragma GCC unroll 4
        for (int c = 1; c < NC; c++) s0 = _mm256_add_ps(s0, acc[c][m][0]), s1 = _mm256_add_ps(s1, acc[c][m][1]);
        _mm256_storeu_ps(y + m * ldy, s0);
        _mm256_storeu_ps(y + m * ldy + 8, s1);
    }
}

static void bf16_gemv(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                      void *scratch, int f32) {
    const uint8_t *tile = W->data + (size_t)t * W->tile_bytes;
    float *xf = scratch;
    for (int64_t m0 = 0, mt; m0 < M; m0 += mt) {
        mt = mr__uk_token_block(M - m0, MTV);
        const uint16_t *x16 = f32 ? NULL : (const uint16_t *)a->x + m0 * a->ldx;
        const float *x32 = f32 ? (const float *)a->x + m0 * a->ldx : NULL;
        switch (mt) {
        case 1: bf16_gemv_body(tile, W->Kp, x16, x32, a->ldx, y + m0 * ldy, ldy, xf, 1); break;
        case 2: bf16_gemv_body(tile, W->Kp, x16, x32, a->ldx, y + m0 * ldy, ldy, xf, 2); break;
        case 3: bf16_gemv_body(tile, W->Kp, x16, x32, a->ldx, y + m0 * ldy, ldy, xf, 3); break;
        default: bf16_gemv_body(tile, W->Kp, x16, x32, a->ldx, y + m0 * ldy, ldy, xf, 4); break;
        }
    }
    apply_post(y, ldy, M, a->post * W->scale2);
}

static void bf16_gemm(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                      void *scratch, int f32) {
    const uint8_t *tile = W->data + (size_t)t * W->tile_bytes;
    float *wb = scratch_wb(scratch), *xf = scratch_xf(scratch);
    for (int64_t k0 = 0; k0 < W->Kp; k0 += XCH) {
        const int nk = (int)(W->Kp - k0 < XCH ? W->Kp - k0 : XCH);
        for (int g = 0; g < nk / 2; g++) {
            const uint8_t *line = tile + (k0 / 2 + g) * 64;
            PF(line);
            __m256 l0, l1, h0, h1;
            bf16_pair(line, &l0, &l1, &h0, &h1);
            _mm256_store_ps(wb + 32 * g, l0);
            _mm256_store_ps(wb + 32 * g + 8, l1);
            _mm256_store_ps(wb + 32 * g + 16, h0);
            _mm256_store_ps(wb + 32 * g + 24, h1);
        }
        const float *x32 = f32 ? (const float *)a->x : a->xw; /* fp32 rows in place where there are */
        const gemm_in in = {.xb16 = x32 ? NULL : (const uint16_t *)a->x + k0, .xf32 = x32 ? x32 + k0 : NULL,
                            .ldx = f32 || !a->xw ? a->ldx : a->ldxw, .ss = 1.0f};
        gemm_tokens(wb, nk, nk, &in, M, y, ldy, xf, k0 == 0, NULL, NULL);
    }
    apply_post(y, ldy, M, a->post * W->scale2);
}

static void uk_bf16_bf16_gemv(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y,
                              int64_t ldy, void *scratch) {
    bf16_gemv(W, t, a, M, y, ldy, scratch, 0);
}
static void uk_bf16_f32_gemv(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                             void *scratch) {
    bf16_gemv(W, t, a, M, y, ldy, scratch, 1);
}
static void uk_bf16_bf16_gemm(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y,
                              int64_t ldy, void *scratch) {
    bf16_gemm(W, t, a, M, y, ldy, scratch, 0);
}
static void uk_bf16_f32_gemm(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                             void *scratch) {
    bf16_gemm(W, t, a, M, y, ldy, scratch, 1);
}

/* mr_uk_xq_row_ref's bits (the definition, kernels.h) per 16 values: the
 * block's largest exponent field by a horizontal max, then each value's
 * 8-bit significand shifted left by max(f, 1) - Fb + 7 where that is >= 0,
 * right by its negation R where not (the high part); the R bits shifted out
 * are the low part, shifted left by 15 - R or right by R - 15 (exact iff
 * shifting back gives them again; counts of 32 and more give 0 either way);
 * signs by vpsignd */
static void xq_row_avx2(const uint16_t *x, int64_t n, int16_t *q, int16_t *ql, float *m) {
    const __m256i ff = _mm256_set1_epi32(0xFF), m7f = _mm256_set1_epi32(0x7F), b80 = _mm256_set1_epi32(0x80),
                  one = _mm256_set1_epi32(1), c15 = _mm256_set1_epi32(15), z = _mm256_setzero_si256();
    for (int64_t b = 0; b < n / 16; b++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(x + 16 * b));
        const __m256i f16 = _mm256_and_si256(_mm256_srli_epi16(v, 7), _mm256_set1_epi16(0xFF));
        __m128i h = _mm_max_epu16(_mm256_castsi256_si128(f16), _mm256_extracti128_si256(f16, 1));
        h = _mm_max_epu16(h, _mm_shuffle_epi32(h, 0x4E));
        h = _mm_max_epu16(h, _mm_shuffle_epi32(h, 0xB1));
        h = _mm_max_epu16(h, _mm_srli_epi32(h, 16));
        const int F = _mm_cvtsi128_si32(h) & 0xFFFF, Fb = F > 1 ? F : 1;
        const bool nonzero = !_mm256_testz_si256(v, _mm256_set1_epi16(0x7FFF));
        __m256i *qb = (__m256i *)(q + 16 * b), *lb = (__m256i *)(ql + 16 * b);
        if (!nonzero || F == 0xFF || Fb < 45) {
            _mm256_storeu_si256(qb, z);
            _mm256_storeu_si256(lb, z);
            m[b] = nonzero ? 0.0f : 1.0f;
            continue;
        }
        const __m256i base = _mm256_set1_epi32(Fb - 7);
        __m256i qh[2], lh[2], rems = z;
        int bad = 0;
        for (int hh = 0; hh < 2; hh++) {
            const __m256i w = _mm256_cvtepi16_epi32(hh ? _mm256_extracti128_si256(v, 1) : _mm256_castsi256_si128(v));
            const __m256i f = _mm256_and_si256(_mm256_srli_epi32(w, 7), ff);
            const __m256i sig = _mm256_or_si256(_mm256_and_si256(w, m7f), _mm256_andnot_si256(_mm256_cmpeq_epi32(f, z), b80));
            const __m256i sh = _mm256_sub_epi32(_mm256_max_epi32(f, one), base);
            const __m256i L = _mm256_max_epi32(sh, z), R = _mm256_max_epi32(_mm256_sub_epi32(z, sh), z);
            const __m256i up = _mm256_sllv_epi32(sig, L), hi = _mm256_srlv_epi32(up, R);
            const __m256i rem = _mm256_sub_epi32(up, _mm256_sllv_epi32(hi, R));
            const __m256i L2 = _mm256_max_epi32(_mm256_sub_epi32(c15, R), z), R2 = _mm256_max_epi32(_mm256_sub_epi32(R, c15), z);
            const __m256i rl = _mm256_sllv_epi32(rem, L2), lo = _mm256_srlv_epi32(rl, R2);
            bad |= ~_mm256_movemask_epi8(_mm256_cmpeq_epi32(_mm256_sllv_epi32(lo, R2), rl));
            rems = _mm256_or_si256(rems, rem);
            qh[hh] = _mm256_sign_epi32(hi, w);
            lh[hh] = _mm256_sign_epi32(lo, w);
        }
        const bool two = !_mm256_testz_si256(rems, rems);
        _mm256_storeu_si256(qb, bad ? z : _mm256_permute4x64_epi64(_mm256_packs_epi32(qh[0], qh[1]), 0xD8));
        _mm256_storeu_si256(lb, bad || !two ? z : _mm256_permute4x64_epi64(_mm256_packs_epi32(lh[0], lh[1]), 0xD8));
        if (bad) {
            m[b] = 0.0f;
            continue;
        }
        const uint32_t mb = (uint32_t)(Fb - 14) << 23 | (two ? 0x80000000u : 0); /* -+2^(Fb - 141) */
        memcpy(&m[b], &mb, 4);
    }
}

/* benchmark isolation (kernels.h uk_stream): the tile read by the read
 * probe's own loop (mr__probe_read_avx2), nothing computed */
static void uk_stream(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                      void *scratch) {
    (void)a;
    *(uint64_t *)scratch = mr__probe_read_avx2((const uint64_t *)(W->data + (size_t)t * W->tile_bytes), W->tile_bytes / 8);
    for (int64_t m = 0; m < M; m++) {
        _mm256_storeu_ps(y + m * ldy, _mm256_setzero_ps());
        _mm256_storeu_ps(y + m * ldy + 8, _mm256_setzero_ps());
    }
}

void mr__uk_fill_avx2(mr_kernels *k) {
    static const struct {
        const char *gemv, *gemm;
        mr_uk_fn fv, fm;
        mr_pack_id pack;
        mr_probe_instr instr;
    } e[MR_UK_COUNT] = {
        [MR_UK_FP8_BF16] = {"uk_fp8_bf16_avx2_16x4", "uk_fp8_bf16_avx2_l1_16x128x6", uk_fp8_gemv, uk_fp8_gemm,
                            MR_PACK_FP8_Y16, MR_PROBE_FMA},
        [MR_UK_NVFP4_I8] = {"uk_nvfp4_i8_avx2_16x1", "uk_nvfp4_i8_avx2_16xM", uk_nvfp4_i8, uk_nvfp4_i8,
                            MR_PACK_NVFP4_Y16I, MR_PROBE_MADDUBS},
        [MR_UK_NVFP4_BF16] = {"uk_nvfp4_bf16_avx2_16x4", "uk_nvfp4_bf16_avx2_l1_16x128x6", uk_nvfp4_bf16_gemv_xq,
                              uk_nvfp4_bf16_gemm, MR_PACK_NVFP4_Y16F, MR_PROBE_FMA},
        [MR_UK_BF16_BF16] = {"uk_bf16_bf16_avx2_16x4", "uk_bf16_bf16_avx2_l1_16x128x6", uk_bf16_bf16_gemv,
                             uk_bf16_bf16_gemm, MR_PACK_BF16_R16K2, MR_PROBE_FMA},
        [MR_UK_BF16_F32] = {"uk_bf16_f32_avx2_16x4", "uk_bf16_f32_avx2_l1_16x128x6", uk_bf16_f32_gemv,
                            uk_bf16_f32_gemm, MR_PACK_BF16_R16K2, MR_PROBE_FMA},
    };
    for (int i = 0; i < MR_UK_COUNT; i++) {
        k->uk_gemv[i].name = e[i].gemv;
        k->uk_gemv[i].fn = e[i].fv;
        k->uk_gemm[i].name = e[i].gemm;
        k->uk_gemm[i].fn = e[i].fm;
        k->uk_inv[i] = k->uk_gemm[i]; /* one chain a token whatever M (the gemv: more below 3 tokens) */
        k->uk_pack[i] = e[i].pack;
        k->uk_instr[i] = e[i].instr;
    }
    k->uk_gemm_xw[MR_UK_NVFP4_BF16] = k->uk_gemm_xw[MR_UK_BF16_BF16] = true;
    /* fp8's: the gemv with one chain a token up to the gemm threshold, the gemm from there (both read xd) */
    k->uk_inv[MR_UK_FP8_BF16] = (mr_uk_entry){"uk_fp8_bf16_avx2_16x4_l1_16x128x6_inv", uk_fp8_inv};
    k->uk_gemm_min_m = FP8_GEMM_MIN_M; /* past MTV the gemv decodes once per 4 tokens; the gemm once */
    k->uk_gemv_xq[MR_UK_NVFP4_BF16] = true;
    /* fp8: x * 2^112 once per expert chunk for the gemv and the gemm (not per tile), in place of the widened x */
    k->uk_xd[MR_UK_FP8_BF16] = true;
    k->xq_row.name = "xq_row_avx2";
    k->xq_row.fn = xq_row_avx2;
    k->uk_stream.name = "uk_stream_avx2";
    k->uk_stream.fn = uk_stream;
}
