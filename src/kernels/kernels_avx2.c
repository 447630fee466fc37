/* kernels_avx2.c — AVX2+FMA+F16C micro-kernels (compiled with -mavx2 -mfma
 * -mf16c; only called when mr_cpu() reports those features). Same contracts
 * as the generic entries in kernels.c; tile: one row x 128 columns, 8 lanes. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/kern_internal.h"

static inline int group_len(const mr_qmatrix *W, int64_t g) {
    int64_t r = W->cols - g * MR_KGROUP;
    return (int)(r < MR_KGROUP ? r : MR_KGROUP);
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* E4M3 -> fp16 bits: sign to bit 15, exponent+mantissa shifted by 7; the
 * value is then 2^-8 of the E4M3 value (exponent bias 15 vs 7), fixed by a
 * multiply by 256 (exact). Subnormals map to fp16 subnormals exactly. The
 * NaN codes 0x7F/0xFF decode to ±480 here (weights never hold NaN). */
static inline __m256 e4m3x8_to_ps(const uint8_t *s) {
    __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)s));
    __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8),
                             _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7F)), 7));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
}

static void decode_fp8_avx2(const mr_qmatrix *W, int64_t n, int64_t g, float *dst, float *gs) {
    const uint8_t *s = (const uint8_t *)W->data + n * W->cols + g * MR_KGROUP;
    int len = group_len(W, g), i = 0;
    for (; i + 8 <= len; i += 8) _mm256_storeu_ps(dst + i, e4m3x8_to_ps(s + i));
    for (; i < len; i++) dst[i] = mr__e4m3_lut[s[i]];
    int64_t kb = (W->cols + 127) / 128;
    *gs = ((const float *)W->scale)[(n / 128) * kb + g];
}

static void decode_bf16_avx2(const mr_qmatrix *W, int64_t n, int64_t g, float *dst, float *gs) {
    const uint16_t *s = (const uint16_t *)W->data + n * W->cols + g * MR_KGROUP;
    int len = group_len(W, g), i = 0;
    for (; i + 8 <= len; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; i < len; i++) {
        uint32_t u = (uint32_t)s[i] << 16;
        memcpy(dst + i, &u, 4);
    }
    *gs = 1.0f;
}

/* E2M1: magnitude from an 8-entry permute, sign from bit 3. */
static void decode_nvfp4_avx2(const mr_qmatrix *W, int64_t n, int64_t g, float *dst, float *gs) {
    const uint8_t *s = (const uint8_t *)W->data + n * (W->cols / 2) + g * (MR_KGROUP / 2);
    const uint8_t *sc = (const uint8_t *)W->scale + n * (W->cols / 16) + g * (MR_KGROUP / 16);
    int len = group_len(W, g);
    const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m256i shifts = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
    for (int b = 0; b < len / 16; b++) {
        __m256 d = _mm256_set1_ps(mr__e4m3_lut[sc[b]]);
        for (int h = 0; h < 2; h++) {
            const uint8_t *p = s + b * 8 + h * 4;
            /* lanes 2i, 2i+1 <- byte i; low nibble then high nibble */
            __m256i v = _mm256_setr_epi32(p[0], p[0], p[1], p[1], p[2], p[2], p[3], p[3]);
            v = _mm256_and_si256(_mm256_srlv_epi32(v, shifts), _mm256_set1_epi32(15));
            __m256 m = _mm256_permutevar8x32_ps(mag, v);
            __m256i sign = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(8)), 28);
            m = _mm256_or_ps(m, _mm256_castsi256_ps(sign));
            _mm256_storeu_ps(dst + b * 16 + h * 8, _mm256_mul_ps(m, d));
        }
    }
    *gs = 1.0f;
}

static float dot_f32_avx2(const float *w, const float *x, int len) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= len; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    }
    for (; i + 8 <= len; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    float s = hsum8(_mm256_add_ps(a0, a1));
    for (; i < len; i++) s += w[i] * x[i];
    return s;
}

static inline __m256 bf16x8(const uint16_t *x) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)x));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

static float dot_bf16_avx2(const float *w, const uint16_t *x, int len) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= len; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), bf16x8(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), bf16x8(x + i + 8), a1);
    }
    for (; i + 8 <= len; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), bf16x8(x + i), a0);
    float s = hsum8(_mm256_add_ps(a0, a1));
    for (; i < len; i++) {
        uint32_t u = (uint32_t)x[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        s += w[i] * f;
    }
    return s;
}

/* ---- dense row-major fast path of mr_matmul (contract in moerun/kernels.h),
 * the AVX2 form of rows_avx512: a register block of R rows x MT tokens;
 * each step decodes 16 weights of each of the R rows (E4M3 by the f16 bit
 * trick, value * 2^-8; bf16 widened, in order) and loads 16 values of each
 * token once (in registers shared by the rows, or from L1 as FMA operands),
 * R*MT independent FMA chains; per 128-column
 * group (FP8) the chains fold into per-(row, token) totals with the group's
 * multiplier, so the R rows share their 128-row scale block. The FMA sequence
 * of a (row, token) does not depend on R, MT or M: a token's result does not
 * depend on the batch around it. Prefetch: the same columns of the register
 * block 16 KiB or more ahead. */
static inline __attribute__((always_inline)) void e4m3x16_rows(const uint8_t *s, __m256 *lo, __m256 *hi) {
    __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)s));
    w = _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16((short)0xBF80));
    *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(w));
    *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(w, 1));
}

static inline __attribute__((always_inline)) void rows_block(const mr_qmatrix *W, int64_t n, const float *x,
                                                             float *y, int64_t ldy, const int R, const int MT) {
    const int64_t K = W->cols;
    const bool fp8 = W->fmt == MR_FMT_FP8_BLOCK;
    const int64_t G = fp8 ? (K + 127) / 128 : 1, GL = fp8 ? 128 : K;
    const float *scl = fp8 ? (const float *)W->scale + (n / 128) * G : NULL;
    const uint8_t *w8 = (const uint8_t *)W->data + n * K;
    const uint16_t *w16 = (const uint16_t *)W->data + n * K;
    const int64_t blk = (int64_t)R * K * (fp8 ? 1 : 2), pf = blk * ((16384 + blk - 1) / blk);
    /* x in registers, shared by the R rows, while R * MT <= 4; larger blocks
     * take each x vector from L1 as an FMA operand (registers: R * MT
     * chains, 2 R weight vectors; the totals spill, touched once per group) */
    enum { XR = 3 };
    const bool xreg = MT <= XR && R * MT <= 4;
    __m256 tot[14], acc[14];
    #pragma GCC unroll 14
    for (int i = 0; i < R * MT; i++) tot[i] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        const int64_t k0 = g * GL, k1 = k0 + GL < K ? k0 + GL : K;
        #pragma GCC unroll 14
        for (int i = 0; i < R * MT; i++) acc[i] = _mm256_setzero_ps();
        int64_t i = k0;
        for (; i + 16 <= k1; i += 16) {
            __m256 xa[XR], xb[XR];
            #pragma GCC unroll 3
            for (int m = 0; xreg && m < MT; m++)
                xa[m] = _mm256_loadu_ps(x + m * K + i), xb[m] = _mm256_loadu_ps(x + m * K + i + 8);
            #pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m256 w0, w1;
                if (fp8) {
                    _mm_prefetch((const char *)(w8 + r * K + i) + pf, _MM_HINT_T0);
                    e4m3x16_rows(w8 + r * K + i, &w0, &w1);
                } else {
                    _mm_prefetch((const char *)(w16 + r * K + i) + pf, _MM_HINT_T0);
                    w0 = bf16x8(w16 + r * K + i), w1 = bf16x8(w16 + r * K + i + 8);
                }
                #pragma GCC unroll 14
                for (int m = 0; m < MT; m++) {
                    const __m256 a = xreg ? xa[m] : _mm256_loadu_ps(x + m * K + i);
                    const __m256 b = xreg ? xb[m] : _mm256_loadu_ps(x + m * K + i + 8);
                    acc[r * MT + m] = _mm256_fmadd_ps(w1, b, _mm256_fmadd_ps(w0, a, acc[r * MT + m]));
                }
            }
        }
        if (i < k1) { /* the last < 16 columns, scalar, in the same order for every R and MT */
            float t[4][8] = {{0}};
            for (; i < k1; i++)
                for (int r = 0; r < R; r++) {
                    const float wv = fp8 ? mr__e4m3_lut[w8[r * K + i]] / 256.0f
                                         : mr_bf16_to_f32(w16[r * K + i]);
                    for (int m = 0; m < MT; m++) t[r][m] += wv * x[m * K + i];
                }
            for (int r = 0; r < R; r++)
                for (int m = 0; m < MT; m++)
                    acc[r * MT + m] = _mm256_add_ps(acc[r * MT + m], _mm256_setr_ps(t[r][m], 0, 0, 0, 0, 0, 0, 0));
        }
        const __m256 gs = _mm256_set1_ps(fp8 ? 256.0f * scl[g] : 1.0f);
        #pragma GCC unroll 14
        for (int j = 0; j < R * MT; j++) tot[j] = _mm256_fmadd_ps(acc[j], gs, tot[j]);
    }
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 14
        for (int m = 0; m < MT; m++) y[m * ldy + r] = hsum8(tot[r * MT + m]);
}

#define RB(R, MT)                                                                                             \
    static void rb_##R##_##MT(const mr_qmatrix *W, int64_t n, const float *x, float *y, int64_t ldy) {          \
        rows_block(W, n, x, y, ldy, R, MT);                                                                   \
    }
RB(4, 1)
RB(2, 2)
RB(1, 3)
RB(1, 1)
RB(1, 2)
RB(1, 4)
RB(1, 5)
RB(1, 6)
RB(1, 7)
RB(2, 3)
RB(2, 4)
RB(2, 5)
RB(2, 6)
RB(2, 7)
#undef RB

/* ---- the blocked form of the same sums, for many tokens (M >= BK_MIN_M,
 * K a multiple of 16): a panel of up to BK_NP rows x 128 columns is decoded
 * once into fp32 (the values rows_block's registers hold: E4M3 x 2^-8, bf16
 * widened) and kept in L1; a register block of 3 rows x 4 tokens runs over
 * it, 8 columns a step (3 weight vectors, 4 token vectors, 12 FMAs), then
 * the next 4 tokens reuse it. Each (row, token) keeps rows_block's 8 lane
 * chains: the per-128-column partial (FP8; folded into the total with the
 * group multiplier) or the running sum (BF16) waits in a state buffer
 * between column blocks. So every lane sees the same FMAs in the same order
 * as in rows_block, and the result is bit for bit the one of the small-M
 * path: a token's output does not depend on the batch around it. */
/* BK_MIN_M8: FP8 from 6 tokens (bench dense, 2026-12-03: the blocked form 6.9 / 6.8 GB/s at
 * 6 / 7 tokens against 6.5 / 5.4 for the register blocks; BF16 stays faster there up to 7) */
enum { BK_NP = 24, BK_KC = 128, BK_MC = 64, BK_MIN_M = 8, BK_MIN_M8 = 6 };

static inline __attribute__((always_inline)) void bk_kernel(const float *wp, const float *x, int64_t ldx, int kc,
                                                            float *st, const float *gs, bool fold, const int R,
                                                            const int MT) {
    __m256 acc[12];
    #pragma GCC unroll 12
    for (int j = 0; j < R * MT; j++)
        acc[j] = fold ? _mm256_setzero_ps() : _mm256_load_ps(st + ((j / MT) * BK_MC + j % MT) * 8);
    for (int s = 0; s < kc; s += 8) {
        __m256 w[3];
        #pragma GCC unroll 3
        for (int r = 0; r < R; r++) w[r] = _mm256_load_ps(wp + r * BK_KC + s);
        #pragma GCC unroll 4
        for (int m = 0; m < MT; m++) {
            const __m256 xv = _mm256_loadu_ps(x + m * ldx + s);
            #pragma GCC unroll 3
            for (int r = 0; r < R; r++) acc[r * MT + m] = _mm256_fmadd_ps(w[r], xv, acc[r * MT + m]);
        }
    }
    #pragma GCC unroll 12
    for (int j = 0; j < R * MT; j++) {
        float *p = st + ((j / MT) * BK_MC + j % MT) * 8;
        _mm256_store_ps(p, fold ? _mm256_fmadd_ps(acc[j], _mm256_set1_ps(gs[j / MT]), _mm256_load_ps(p)) : acc[j]);
    }
}

#define BK(R, MT)                                                                                              \
    static void bk_##R##_##MT(const float *wp, const float *x, int64_t ldx, int kc, float *st, const float *gs, \
                              bool fold) {                                                                     \
        bk_kernel(wp, x, ldx, kc, st, gs, fold, R, MT);                                                        \
    }
BK(3, 4)
BK(3, 3)
BK(3, 2)
BK(3, 1)
BK(1, 4)
BK(1, 3)
BK(1, 2)
BK(1, 1)
#undef BK

static void rows_blocked(const mr_qmatrix *W, int64_t n0, int64_t nr, const float *x, int64_t M, float *y,
                         int64_t ldy) {
    typedef void (*bkf)(const float *, const float *, int64_t, int, float *, const float *, bool);
    static const bkf b3[5] = {NULL, bk_3_1, bk_3_2, bk_3_3, bk_3_4}, b1[5] = {NULL, bk_1_1, bk_1_2, bk_1_3, bk_1_4};
    const int64_t K = W->cols, G = (K + BK_KC - 1) / BK_KC;
    const bool fp8 = W->fmt == MR_FMT_FP8_BLOCK;
    /* on the stack (12 + 48 KiB): the per-step path does not allocate */
    float wp[BK_NP * BK_KC] __attribute__((aligned(64)));
    float st[8 * BK_NP * BK_MC] __attribute__((aligned(64)));
    for (int64_t p0 = 0; p0 < nr; p0 += BK_NP) {
        const int np = (int)(nr - p0 < BK_NP ? nr - p0 : BK_NP);
        for (int64_t c0 = 0; c0 < M; c0 += BK_MC) {
            const int mc = (int)(M - c0 < BK_MC ? M - c0 : BK_MC);
            if (fp8) /* the totals of this chunk's (row, token) pairs start at 0 (only those: all of st is
                      * 48 KiB, more than L1) */
                for (int r = 0; r < np; r++) memset(st + (size_t)r * BK_MC * 8, 0, sizeof(float) * 8 * (size_t)mc);
            for (int64_t g = 0; g < G; g++) {
                const int64_t k0 = g * BK_KC;
                const int kc = (int)(K - k0 < BK_KC ? K - k0 : BK_KC);
                float gs[BK_NP];
                for (int r = 0; r < np; r++) { /* decode the panel's columns k0..k0+kc */
                    const int64_t n = n0 + p0 + r;
                    float *d = wp + r * BK_KC;
                    if (fp8) {
                        const uint8_t *s8 = (const uint8_t *)W->data + n * K + k0;
                        for (int i = 0; i < kc; i += 16) {
                            __m256 lo, hi;
                            e4m3x16_rows(s8 + i, &lo, &hi);
                            _mm256_store_ps(d + i, lo), _mm256_store_ps(d + i + 8, hi);
                        }
                        gs[r] = 256.0f * ((const float *)W->scale)[(n / 128) * G + g];
                    } else {
                        const uint16_t *s16 = (const uint16_t *)W->data + n * K + k0;
                        for (int i = 0; i < kc; i += 8) _mm256_store_ps(d + i, bf16x8(s16 + i));
                    }
                }
                const bool fold = fp8, init = !fp8 && g == 0;
                for (int m0 = 0; m0 < mc; m0 += 4) {
                    const int mt = mc - m0 < 4 ? mc - m0 : 4;
                    const float *xm = x + (c0 + m0) * K + k0;
                    for (int r = 0; r < np;) {
                        const int R = np - r >= 3 ? 3 : 1;
                        float *sp = st + ((int64_t)r * BK_MC + m0) * 8;
                        if (init) /* BF16: the chains start at 0 */
                            for (int i = 0; i < R; i++) memset(sp + i * BK_MC * 8, 0, sizeof(float) * 8 * (size_t)mt);
                        (R == 3 ? b3 : b1)[mt](wp + r * BK_KC, xm, K, kc, sp, gs + r, fold);
                        r += R;
                    }
                }
            }
            for (int r = 0; r < np; r++) /* the totals, as rows_block ends: (fma(acc, 1, 0) for BF16) */
                for (int m = 0; m < mc; m++) {
                    const __m256 t = _mm256_load_ps(st + ((int64_t)r * BK_MC + m) * 8);
                    y[(c0 + m) * ldy + p0 + r] =
                        hsum8(fp8 ? t : _mm256_fmadd_ps(t, _mm256_set1_ps(1.0f), _mm256_setzero_ps()));
                }
        }
    }
}

static void rows_avx2(const mr_qmatrix *W, int64_t n0, int64_t nr, const float *x, int64_t M, float *y,
                      int64_t ldy) {
    if (M >= (W->fmt == MR_FMT_FP8_BLOCK ? BK_MIN_M8 : BK_MIN_M) && W->cols % 16 == 0) {
        mr__rows_sliced(rows_blocked, BK_MC, W, n0, nr, x, M, y, ldy);
        return;
    }
    /* every weight decoded once for up to 7 tokens (before: once per 3, so 4
     * tokens decoded it twice), in 2-row blocks from 2 tokens on, so that 3+
     * tokens have 6+ FMA chains where the FMAs' latency bounded 3 chains
     * (bench/README.md "Dense decode at 2-7 tokens on AVX2") */
    static const mr__rows_block_fn full[8] = {NULL, rb_4_1, rb_2_2, rb_2_3, rb_2_4, rb_2_5, rb_2_6, rb_2_7},
                                   one[8] = {NULL, rb_1_1, rb_1_2, rb_1_3, rb_1_4, rb_1_5, rb_1_6, rb_1_7};
    static const int rows_of[8] = {0, 4, 2, 2, 2, 2, 2, 2};
    mr__rows_drive(W, n0, nr, x, M, y, ldy, 7, full, one, rows_of);
}

/* exp(v) for v in [-87.3, 88.3]: 2^n * p(r), n = rne(v log2 e), r = v - n ln2
 * (two-part ln2), p the degree-7 Taylor polynomial (as kernels_avx512.c);
 * 2^n built in the exponent bits (n in [-126, 127] on this range) */
static inline __m256 exp_avx2(__m256 v) {
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), v);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* silu(g) * u = g / (1 + exp(-g)) * u; -g clamped so exp stays finite (the
 * quotient is then g/huge, about -0, or g/1 = g, as with libm); a NaN g
 * stays NaN through the quotient */
static void silu_mul_avx2(const float *g, const float *u, int64_t n, float *out) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i), y = _mm256_loadu_ps(u + i);
        const __m256 t = _mm256_min_ps(_mm256_max_ps(_mm256_sub_ps(_mm256_setzero_ps(), x), _mm256_set1_ps(-87.3f)),
                                       _mm256_set1_ps(88.3f));
        const __m256 e = exp_avx2(t);
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), y));
    }
    for (; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* ---- attention rows (kernels.h): FMAs, the same summation order as generic ---- */
#define INL static inline __attribute__((always_inline))
/* The row types as a constant template argument: KF32, KBF16, KE4M3, KE5M2 */
enum { KF32, KBF16, KE4M3, KE5M2 };
INL int kv_kind(mr_format kvt) {
    return kvt == MR_FMT_BF16 ? KBF16 : kvt == MR_FMT_E4M3 ? KE4M3 : kvt == MR_FMT_E5M2 ? KE5M2 : KF32;
}
/* 8 FP8 codes -> fp32, exactly, through their f16 bits and F16C: E5M2 is the
 * high byte of an f16; E4M3 (bias 7, f16's 15) is sign | code << 7 as an f16
 * times 2^8 (its subnormals become f16 subnormals), the NaN codes S.1111.111
 * given f16's all-ones exponent */
INL __m256 e4m3x8(const uint8_t *p) {
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    const __m128i r = _mm_and_si128(b, _mm_set1_epi16(0x7F));
    const __m128i sg = _mm_and_si128(_mm_slli_epi16(b, 8), _mm_set1_epi16((short)0x8000));
    const __m128i nan = _mm_and_si128(_mm_cmpeq_epi16(r, _mm_set1_epi16(0x7F)), _mm_set1_epi16(0x7C00));
    const __m128i h = _mm_or_si128(_mm_or_si128(sg, _mm_slli_epi16(r, 7)), nan);
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
}
INL __m256 e5m2x8(const uint8_t *p) {
    return _mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p)), 8));
}
/* bytes of one element */
INL size_t kv_es(const int KT) { return KT == KF32 ? 4 : KT == KBF16 ? 2 : 1; }
/* 8 values at i of a K/V row as fp32 (widened exactly) */
INL __m256 kv8(const void *row, const int KT, int i) {
    switch (KT) {
    case KBF16: return bf16x8((const uint16_t *)row + i);
    case KE4M3: return e4m3x8((const uint8_t *)row + i);
    case KE5M2: return e5m2x8((const uint8_t *)row + i);
    default: return _mm256_loadu_ps((const float *)row + i);
    }
}
/* one value (the D % 8 tail) */
INL float kv1(const void *row, const int KT, int i) {
    switch (KT) {
    case KBF16: return mr_bf16_to_f32(((const uint16_t *)row)[i]);
    case KE4M3: return mr_e4m3_to_f32(((const uint8_t *)row)[i]);
    case KE5M2: return mr_e5m2_to_f32(((const uint8_t *)row)[i]);
    default: return ((const float *)row)[i];
    }
}
/* lanes 0..7 of v summed as ((0+4) + (1+5)) + ((2+6) + (3+7)) */
INL float tree8(__m256 v) {
    const __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 y = _mm_add_ps(x, _mm_movehdup_ps(x)); /* x0+x1, ., x2+x3, . */
    return _mm_cvtss_f32(_mm_add_ss(y, _mm_movehl_ps(y, y)));
}

/* tree8 of n (<= 8) vectors at once, the same additions: out[j] = tree8(a[j]) */
INL void tree8_n(const __m256 *a, const int n, float *out) {
    __m256 v[8];
    #pragma GCC unroll 8
    for (int j = 0; j < 8; j++) v[j] = j < n ? a[j] : _mm256_setzero_ps();
    __m256 p[4]; /* p[j]: lo 128 = lanes (0+4, 1+5, 2+6, 3+7) of v[2j], hi 128 those of v[2j+1] */
    #pragma GCC unroll 4
    for (int j = 0; j < 4; j++)
        p[j] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * j], v[2 * j + 1], 0x20),
                             _mm256_permute2f128_ps(v[2 * j], v[2 * j + 1], 0x31));
    /* (x0 + x1) + (x2 + x3) per vector: lanes t0 t2 t4 t6 | t1 t3 t5 t7 */
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(p[0], p[1]), _mm256_hadd_ps(p[2], p[3]));
    float b[8];
    _mm256_storeu_ps(b, t);
    #pragma GCC unroll 8
    for (int j = 0; j < n; j++) out[j] = b[(j & 1) * 4 + j / 2];
}

/* RN (<= 2) fp32 rows, ld floats apart, x GN (<= 6) heads: 8-wide FMA chains
 * over D, each (row, head) reduced by tree8, then the D % 8 tail */
INL void qk_blk(const float *q, int D, const float *k, int64_t ld, float *s, int64_t lds, const int RN, const int GN) {
    __m256 acc[2][6];
    #pragma GCC unroll 2
    for (int r = 0; r < RN; r++)
        #pragma GCC unroll 6
        for (int g = 0; g < GN; g++) acc[r][g] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= D; i += 8) {
        __m256 kv[2];
        #pragma GCC unroll 2
        for (int r = 0; r < RN; r++) kv[r] = _mm256_loadu_ps(k + r * ld + i);
        #pragma GCC unroll 6
        for (int g = 0; g < GN; g++) {
            const __m256 qv = _mm256_loadu_ps(q + g * D + i);
            #pragma GCC unroll 2
            for (int r = 0; r < RN; r++) acc[r][g] = _mm256_fmadd_ps(qv, kv[r], acc[r][g]);
        }
    }
    float t[2][8];
    #pragma GCC unroll 2
    for (int r = 0; r < RN; r++) tree8_n(acc[r], GN, t[r]);
    #pragma GCC unroll 2
    for (int r = 0; r < RN; r++)
        #pragma GCC unroll 6
        for (int g = 0; g < GN; g++) {
            float d = t[r][g];
            for (int u = i; u < D; u++) d += q[g * D + u] * k[r * ld + u];
            s[g * lds + r] = d;
        }
}

#define QK_GN(RN)                                                                                                 \
    switch (gn) {                                                                                                 \
    case 1: qk_blk(qg, D, kr, ld, sg, lds, RN, 1); break;                                                         \
    case 2: qk_blk(qg, D, kr, ld, sg, lds, RN, 2); break;                                                         \
    case 3: qk_blk(qg, D, kr, ld, sg, lds, RN, 3); break;                                                         \
    case 4: qk_blk(qg, D, kr, ld, sg, lds, RN, 4); break;                                                         \
    case 5: qk_blk(qg, D, kr, ld, sg, lds, RN, 5); break;                                                         \
    default: qk_blk(qg, D, kr, ld, sg, lds, RN, 6); break;                                                        \
    }
/* nr fp32 rows, ld floats apart: pairs of rows x groups of 6 heads */
static void qk_f32(const float *q, int G, int D, const float *k, int64_t ld, int nr, float *s, int64_t lds) {
    for (int r = 0; r < nr; r += 2) {
        const float *kr = k + (size_t)r * (size_t)ld;
        for (int g0 = 0; g0 < G; g0 += 6) {
            const float *qg = q + (size_t)g0 * (size_t)D;
            float *sg = s + g0 * lds + r;
            const int gn = G - g0 < 6 ? G - g0 : 6;
            if (nr - r >= 2) QK_GN(2) else QK_GN(1)
        }
    }
}
#undef QK_GN

/* nr (<= KV_WIDEN) rows of a bf16 / FP8 run widened to fp32 into w [nr][D] */
enum { KV_WIDEN = MR_ATTN_WK_ROWS };
INL void kv_widen(const void *src, int64_t ld, int nr, int D, float *w, const int KT) {
    for (int r = 0; r < nr; r++) {
        const char *row = (const char *)src + (size_t)r * (size_t)ld * kv_es(KT);
        float *o = w + (size_t)r * (size_t)D;
        int i = 0;
        for (; i + 8 <= D; i += 8) _mm256_storeu_ps(o + i, kv8(row, KT, i));
        for (; i < D; i++) o[i] = kv1(row, KT, i);
    }
}
static void kv_widen_any(const void *src, int64_t ld, int nr, int D, float *w, int kt) {
    switch (kt) {
    case KBF16: kv_widen(src, ld, nr, D, w, KBF16); break;
    case KE4M3: kv_widen(src, ld, nr, D, w, KE4M3); break;
    default: kv_widen(src, ld, nr, D, w, KE5M2); break;
    }
}

/* softmax with exp_avx2 (a NaN score gives NaN through the exp; s - m below
 * -87.3 is taken as -87.3: e ~ 1e-38 beside the largest term's 1) */
static void attn_softmax_avx2(float *s, int64_t n, float scale) {
    const __m256 sc = _mm256_set1_ps(scale);
    __m256 mv = _mm256_set1_ps(-INFINITY), sv = _mm256_setzero_ps();
    float t[8];
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + j), sc);
        _mm256_storeu_ps(s + j, x);
        mv = _mm256_max_ps(x, mv);
    }
    _mm256_storeu_ps(t, mv);
    float mx = t[0];
    for (int i = 1; i < 8; i++) mx = t[i] > mx ? t[i] : mx;
    for (int64_t i = j; i < n; i++) {
        s[i] *= scale;
        mx = s[i] > mx ? s[i] : mx;
    }
    const __m256 m = _mm256_set1_ps(mx), lo = _mm256_set1_ps(-87.3f);
    for (j = 0; j + 8 <= n; j += 8) {
        const __m256 e = exp_avx2(_mm256_max_ps(lo, _mm256_sub_ps(_mm256_loadu_ps(s + j), m)));
        _mm256_storeu_ps(s + j, e);
        sv = _mm256_add_ps(sv, e);
    }
    if (j < n) { /* the tail through the same exp, in lanes 0 .. n - j - 1 */
        const int r = (int)(n - j);
        for (int i = 0; i < 8; i++) t[i] = i < r ? s[j + i] : mx;
        _mm256_storeu_ps(t, exp_avx2(_mm256_max_ps(lo, _mm256_sub_ps(_mm256_loadu_ps(t), m))));
        for (int i = 0; i < r; i++) s[j + i] = t[i];
    }
    float sum = tree8(sv);
    for (; j < n; j++) sum += s[j];
    const float is = 1.0f / sum;
    const __m256 inv = _mm256_set1_ps(is);
    for (j = 0; j + 8 <= n; j += 8) _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_loadu_ps(s + j), inv));
    for (; j < n; j++) s[j] *= is;
}

static void attn_qk_avx2(const float *q, int G, int D, const void *k, int64_t ldk, mr_format kvt, int nr, float *s,
                         int64_t lds, float *wk) {
    const int kt = kv_kind(kvt);
    if (kt == KF32) {
        qk_f32(q, G, D, k, ldk, nr, s, lds);
        return;
    }
    for (int r0 = 0; r0 < nr; r0 += KV_WIDEN) { /* rows widened into wk, 16 at a time */
        const int n = nr - r0 < KV_WIDEN ? nr - r0 : KV_WIDEN;
        kv_widen_any((const char *)k + (size_t)r0 * (size_t)ldk * kv_es(kt), ldk, n, D, wk, kt);
        qk_f32(q, G, D, wk, D, n, s + r0, lds);
    }
}

/* GN (<= 6) heads: o strips of W (16 or 8) values kept in registers over all
 * nr fp32 rows (ld floats apart), one FMA chain per element in row order */
INL void pv_strip(const float *p, int64_t ldp, int D, const float *v, int64_t ld, int nr, float *o, int i0,
                  const int GN, const int W) {
    __m256 acc[6][2];
    #pragma GCC unroll 6
    for (int g = 0; g < GN; g++)
        #pragma GCC unroll 2
        for (int h = 0; h < W / 8; h++) acc[g][h] = _mm256_loadu_ps(o + g * D + i0 + 8 * h);
    for (int r = 0; r < nr; r++) {
        const float *vr = v + (size_t)r * (size_t)ld + i0;
        __m256 vv[2];
        #pragma GCC unroll 2
        for (int h = 0; h < W / 8; h++) vv[h] = _mm256_loadu_ps(vr + 8 * h);
        #pragma GCC unroll 6
        for (int g = 0; g < GN; g++) {
            const __m256 pb = _mm256_broadcast_ss(p + g * ldp + r);
            #pragma GCC unroll 2
            for (int h = 0; h < W / 8; h++) acc[g][h] = _mm256_fmadd_ps(pb, vv[h], acc[g][h]);
        }
    }
    #pragma GCC unroll 6
    for (int g = 0; g < GN; g++)
        #pragma GCC unroll 2
        for (int h = 0; h < W / 8; h++) _mm256_storeu_ps(o + g * D + i0 + 8 * h, acc[g][h]);
}

INL void pv_heads(const float *p, int64_t ldp, int D, const float *v, int64_t ld, int nr, float *o, const int GN) {
    int i = 0;
    for (; i + 16 <= D; i += 16) pv_strip(p, ldp, D, v, ld, nr, o, i, GN, 16);
    if (i + 8 <= D) pv_strip(p, ldp, D, v, ld, nr, o, i, GN, 8), i += 8;
    for (; i < D; i++)
        for (int g = 0; g < GN; g++) {
            float a = o[g * D + i];
            for (int r = 0; r < nr; r++) a += p[g * ldp + r] * v[(size_t)r * (size_t)ld + (size_t)i];
            o[g * D + i] = a;
        }
}

static void pv_f32(const float *p, int64_t ldp, int G, int D, const float *v, int64_t ld, int nr, float *o) {
    for (int g0 = 0; g0 < G; g0 += 6) {
        const float *pg = p + g0 * ldp;
        float *og = o + (size_t)g0 * (size_t)D;
        switch (G - g0 < 6 ? G - g0 : 6) {
        case 1: pv_heads(pg, ldp, D, v, ld, nr, og, 1); break;
        case 2: pv_heads(pg, ldp, D, v, ld, nr, og, 2); break;
        case 3: pv_heads(pg, ldp, D, v, ld, nr, og, 3); break;
        case 4: pv_heads(pg, ldp, D, v, ld, nr, og, 4); break;
        case 5: pv_heads(pg, ldp, D, v, ld, nr, og, 5); break;
        default: pv_heads(pg, ldp, D, v, ld, nr, og, 6); break;
        }
    }
}

static void attn_pv_avx2(const float *p, int64_t ldp, int G, int D, const void *v, int64_t ldv, mr_format kvt, int nr,
                         float *o, float *wk) {
    const int kt = kv_kind(kvt);
    for (int r0 = 0; r0 < nr; r0 += KV_WIDEN) { /* 16 rows at a time (in L1 for every strip), */
        const int n = nr - r0 < KV_WIDEN ? nr - r0 : KV_WIDEN; /* widened into wk unless fp32 */
        const void *vr = (const char *)v + (size_t)r0 * (size_t)ldv * kv_es(kt);
        if (kt == KF32) {
            pv_f32(p + r0, ldp, G, D, vr, ldv, n, o);
        } else {
            kv_widen_any(vr, ldv, n, D, wk, kt);
            pv_f32(p + r0, ldp, G, D, wk, D, n, o);
        }
    }
}

void mr__kernels_fill_avx2(mr_kernels *k) {
    k->attn_qk.name = "attn_qk_avx2_8x8";
    k->attn_qk.fn = attn_qk_avx2;
    k->attn_pv.name = "attn_pv_avx2_6x16";
    k->attn_pv.fn = attn_pv_avx2;
    k->attn_softmax.name = "attn_softmax_avx2_8";
    k->attn_softmax.fn = attn_softmax_avx2;
    k->silu_mul.name = "silu_mul_avx2_8";
    k->silu_mul.fn = silu_mul_avx2;
    k->rows[MR_FMT_BF16].name = "rows_bf16_avx2_4x16x1_2x16x7_p24x128x3x4";
    k->rows[MR_FMT_BF16].fn = rows_avx2;
    k->rows[MR_FMT_FP8_BLOCK].name = "rows_fp8_block_avx2_4x16x1_2x16x7_p24x128x3x4";
    k->rows[MR_FMT_FP8_BLOCK].fn = rows_avx2;
    k->isa = "avx2";
    k->decode[MR_FMT_BF16].name = "decode_bf16_avx2_1x8";
    k->decode[MR_FMT_BF16].fn = decode_bf16_avx2;
    k->decode[MR_FMT_FP8_BLOCK].name = "decode_fp8_block_avx2_1x8";
    k->decode[MR_FMT_FP8_BLOCK].fn = decode_fp8_avx2;
    k->decode[MR_FMT_NVFP4].name = "decode_nvfp4_avx2_1x8";
    k->decode[MR_FMT_NVFP4].fn = decode_nvfp4_avx2;
    k->dot_f32.name = "dot_f32_avx2_2x8";
    k->dot_f32.fn = dot_f32_avx2;
    k->dot_bf16.name = "dot_bf16_avx2_2x8";
    k->dot_bf16.fn = dot_bf16_avx2;
}
