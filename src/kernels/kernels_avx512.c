/* kernels_avx512.c — AVX-512 (F/BW/VL) micro-kernels, compiled with the
 * AVX-512 flags and only called when mr_cpu() reports them. Same contracts
 * as the generic entries in kernels.c; tile: one row x 128 columns, 16 lanes,
 * masked tails. */
#include <immintrin.h>
#include <string.h>

#include "kernels/kern_internal.h"

/* The state of the blocked dense form's register blocks: R rows x T tokens of 16-lane chains, kept
 * between column blocks in st, row r's token m at (r mc + m) 16 floats (mc: the tokens a chunk).
 * At the start of a column block the chains are zero where they start or fold into totals (fold:
 * FP8's scale groups), else as the last column block left them. */
static inline __attribute__((always_inline)) void panel_begin(__m512 *acc, const float *st, int mc, int fold,
                                                              int cont, const int R, const int T) {
    #pragma GCC unroll 24
    for (int j = 0; j < R * T; j++)
        acc[j] = fold || !cont ? _mm512_setzero_ps() : _mm512_load_ps(st + ((j / T) * mc + j % T) * 16);
}

/* at its end: the chains themselves, or (fold) the totals fma(acc, gs[r], the totals so far or 0) */
static inline __attribute__((always_inline)) void panel_end(const __m512 *acc, float *st, int mc, const float *gs,
                                                            int fold, int cont, const int R, const int T) {
    #pragma GCC unroll 24
    for (int j = 0; j < R * T; j++) {
        float *p = st + ((j / T) * mc + j % T) * 16;
        _mm512_store_ps(p, fold ? _mm512_fmadd_ps(acc[j], _mm512_set1_ps(gs[j / T]),
                                                  cont ? _mm512_load_ps(p) : _mm512_setzero_ps())
                                : acc[j]);
    }
}

static inline int group_len(const mr_qmatrix *W, int64_t g) {
    int64_t r = W->cols - g * MR_KGROUP;
    return (int)(r < MR_KGROUP ? r : MR_KGROUP);
}

static inline __mmask16 tail_mask(int r) { return r >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << r) - 1); }

/* E4M3 -> fp16 bits (see kernels_avx2.c), then x256. */
static void decode_fp8_avx512(const mr_qmatrix *W, int64_t n, int64_t g, float *dst, float *gs) {
    const uint8_t *s = (const uint8_t *)W->data + n * W->cols + g * MR_KGROUP;
    int len = group_len(W, g);
    const __m512 k256 = _mm512_set1_ps(256.0f);
    for (int i = 0; i < len; i += 16) {
        __mmask16 m = tail_mask(len - i);
        __m256i b = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, s + i));
        __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8),
                                    _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7F)), 7));
        _mm512_mask_storeu_ps(dst + i, m, _mm512_mul_ps(_mm512_cvtph_ps(h), k256));
    }
    int64_t kb = (W->cols + 127) / 128;
    *gs = ((const float *)W->scale)[(n / 128) * kb + g];
}

static void decode_bf16_avx512(const mr_qmatrix *W, int64_t n, int64_t g, float *dst, float *gs) {
    const uint16_t *s = (const uint16_t *)W->data + n * W->cols + g * MR_KGROUP;
    int len = group_len(W, g);
    for (int i = 0; i < len; i += 16) {
        __mmask16 m = tail_mask(len - i);
        __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, s + i));
        _mm512_mask_storeu_ps(dst + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
    *gs = 1.0f;
}

/* E2M1 through a 16-entry permute (vpermps), scale multiplied in (exact). */
static void decode_nvfp4_avx512(const mr_qmatrix *W, int64_t n, int64_t g, float *dst, float *gs) {
    const uint8_t *s = (const uint8_t *)W->data + n * (W->cols / 2) + g * (MR_KGROUP / 2);
    const uint8_t *sc = (const uint8_t *)W->scale + n * (W->cols / 16) + g * (MR_KGROUP / 16);
    int len = group_len(W, g);
    const __m512 lut = _mm512_loadu_ps(mr__e2m1_lut);
    const __m512i shifts = _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0);
    const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    for (int b = 0; b < len / 16; b++) {
        __m128i bytes = _mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)(s + b * 8)), dup);
        __m512i v = _mm512_and_si512(_mm512_srlv_epi32(_mm512_cvtepu8_epi32(bytes), shifts), _mm512_set1_epi32(15));
        __m512 w = _mm512_permutexvar_ps(v, lut);
        _mm512_storeu_ps(dst + b * 16, _mm512_mul_ps(w, _mm512_set1_ps(mr__e4m3_lut[sc[b]])));
    }
    *gs = 1.0f;
}

static float dot_f32_avx512(const float *w, const float *x, int len) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= len; i += 32) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
    }
    for (; i < len; i += 16) {
        __mmask16 m = tail_mask(len - i);
        a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + i), _mm512_maskz_loadu_ps(m, x + i), a0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

static inline __m512 bf16x16(__mmask16 m, const uint16_t *x) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, x));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

static float dot_bf16_avx512(const float *w, const uint16_t *x, int len) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= len; i += 32) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), bf16x16(0xFFFF, x + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), bf16x16(0xFFFF, x + i + 16), a1);
    }
    for (; i < len; i += 16) {
        __mmask16 m = tail_mask(len - i);
        a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + i), bf16x16(m, x + i), a0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

/* ---- dense row-major fast paths for mr_matmul at small M (contract in
 * moerun/kernels.h). A register block of R rows x MT tokens: each step
 * decodes 32 weights of each of the R rows and loads 32 values of each of the
 * MT activation rows once, R*MT independent FMA chains; per 128-column group
 * the chains fold into per-(row, token) totals with the group's multiplier
 * (FP8), so the R rows must share their 128-row scale block (n0 % R == 0
 * within blocks of 16). Tokens past MT rerun the same R rows (then in L1).
 * Software prefetch of the same columns whole register blocks (>= 16 KiB) ahead. ---- */
#define RPF(p) _mm_prefetch((const char *)(p) + pf, _MM_HINT_T0)

/* E4M3 -> fp16 with the value * 2^-8 (exact): sign-extend the byte to a word,
 * shift left 7 (sign lands in bits 15 and 14, exponent+mantissa in 13..7),
 * clear bit 14. NaN codes give 480 * 2^-8 (weights never hold NaN). */
static inline __attribute__((always_inline)) void e4m3x32(const uint8_t *s, __m512 *w0, __m512 *w1) {
    __m512i h = _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)s)), 7),
                                 _mm512_set1_epi16((short)0xBF80));
    *w0 = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    *w1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}
static inline __attribute__((always_inline)) __m512 e4m3x16(__mmask16 m, const uint8_t *s) {
    __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_maskz_loadu_epi8(m, s)), 7),
                                 _mm256_set1_epi16((short)0xBF80));
    return _mm512_cvtph_ps(h);
}
static inline __attribute__((always_inline)) __m512 bf16w16(__mmask16 m, const uint16_t *w) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, w)), 16));
}

static inline __attribute__((always_inline)) void rows_block(const mr_qmatrix *W, int64_t n, const float *x,
                                                             float *y, int64_t ldy, const int R, const int MT) {
    const int64_t K = W->cols;
    const bool fp8 = W->fmt == MR_FMT_FP8_BLOCK;
    const int64_t G = fp8 ? (K + 127) / 128 : 1, GL = fp8 ? 128 : K;
    const float *scl = fp8 ? (const float *)W->scale + (n / 128) * G : NULL;
    const uint8_t *w8 = (const uint8_t *)W->data + n * K;
    const uint16_t *w16 = (const uint16_t *)W->data + n * K;
    /* prefetch the same columns of a later register block (the rows are
     * contiguous): whole blocks of R rows ahead, at least 16 KiB */
    const int64_t blk = (int64_t)R * K * (fp8 ? 1 : 2), pf = blk * ((16384 + blk - 1) / blk);
    /* x in registers, shared by the R rows, while R * MT <= 8; larger blocks
     * (2 rows x 5-7 tokens) take each x vector from L1 as an FMA operand */
    const bool xreg = R * MT <= 8;
    __m512 tot[16], acc[16];
    #pragma GCC unroll 16
    for (int i = 0; i < R * MT; i++) tot[i] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        const int64_t k0 = g * GL, k1 = k0 + GL < K ? k0 + GL : K;
        #pragma GCC unroll 16
        for (int i = 0; i < R * MT; i++) acc[i] = _mm512_setzero_ps();
        int64_t i = k0;
        for (; i + 32 <= k1; i += 32) {
            __m512 xa[8], xb[8];
            #pragma GCC unroll 8
            for (int m = 0; xreg && m < MT; m++)
                xa[m] = _mm512_loadu_ps(x + m * K + i), xb[m] = _mm512_loadu_ps(x + m * K + i + 16);
            if (xreg) {
                #pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    __m512 w0, w1;
                    if (fp8) {
                        RPF(w8 + r * K + i);
                        e4m3x32(w8 + r * K + i, &w0, &w1);
                        #pragma GCC unroll 8
                        for (int m = 0; m < MT; m++)
                            acc[r * MT + m] = _mm512_fmadd_ps(w1, xb[m], _mm512_fmadd_ps(w0, xa[m], acc[r * MT + m]));
                    } else {
                        RPF(w16 + r * K + i);
                        w0 = bf16w16(0xFFFF, w16 + r * K + i), w1 = bf16w16(0xFFFF, w16 + r * K + i + 16);
                        #pragma GCC unroll 8
                        for (int m = 0; m < MT; m++)
                            acc[r * MT + m] = _mm512_fmadd_ps(w1, xb[m], _mm512_fmadd_ps(w0, xa[m], acc[r * MT + m]));
                    }
                }
                continue;
            }
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++) { /* the same FMAs, x from L1 */
                __m512 w0, w1;
                if (fp8) {
                    RPF(w8 + r * K + i);
                    e4m3x32(w8 + r * K + i, &w0, &w1);
                } else {
                    RPF(w16 + r * K + i);
                    w0 = bf16w16(0xFFFF, w16 + r * K + i), w1 = bf16w16(0xFFFF, w16 + r * K + i + 16);
                }
                #pragma GCC unroll 8
                for (int m = 0; m < MT; m++) {
                    const __m512 xm0 = _mm512_loadu_ps(x + m * K + i), xm1 = _mm512_loadu_ps(x + m * K + i + 16);
                    acc[r * MT + m] = _mm512_fmadd_ps(w1, xm1, _mm512_fmadd_ps(w0, xm0, acc[r * MT + m]));
                }
            }
        }
        for (; i < k1; i += 16) {
            const __mmask16 mk = tail_mask((int)(k1 - i));
            __m512 xa[8];
            #pragma GCC unroll 8
            for (int m = 0; m < MT; m++) xa[m] = _mm512_maskz_loadu_ps(mk, x + m * K + i);
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const __m512 w0 = fp8 ? e4m3x16(mk, w8 + r * K + i) : bf16w16(mk, w16 + r * K + i);
                #pragma GCC unroll 8
                for (int m = 0; m < MT; m++) acc[r * MT + m] = _mm512_fmadd_ps(w0, xa[m], acc[r * MT + m]);
            }
        }
        const __m512 gs = _mm512_set1_ps(fp8 ? 256.0f * scl[g] : 1.0f);
        #pragma GCC unroll 16
        for (int j = 0; j < R * MT; j++) tot[j] = _mm512_fmadd_ps(acc[j], gs, tot[j]);
    }
    #pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 8
        for (int m = 0; m < MT; m++) y[m * ldy + r] = _mm512_reduce_add_ps(tot[r * MT + m]);
}

#define RB(R, MT)                                                                                             \
    static void rb_##R##_##MT(const mr_qmatrix *W, int64_t n, const float *x, float *y, int64_t ldy) {          \
        rows_block(W, n, x, y, ldy, R, MT);                                                                   \
    }
RB(8, 1)
RB(4, 2)
RB(2, 3)
RB(2, 4)
RB(1, 1)
RB(1, 2)
RB(1, 3)
RB(1, 4)
RB(2, 5)
RB(2, 6)
RB(2, 7)
RB(1, 5)
RB(1, 6)
RB(1, 7)
#undef RB

/* ---- the blocked form of the same sums, for many tokens (M >= BZ_MIN_M,
 * K a multiple of 16), as rows_blocked in kernels_avx2.c with 16 lanes: a
 * panel of up to BZ_NP rows x BZ_KC columns (FP8: 128, one scale group) is
 * decoded once into fp32, the values rows_block's registers hold (FP8: E4M3
 * x 2^-8; BF16 widened; columns in order), and register blocks of 6 rows x
 * 4 tokens run over it 16 columns a step (24 chains, 6 weight vectors, one
 * token vector at a time, read in place), then the next 4 tokens reuse it.
 * Each (row, token) keeps rows_block's 16 lane chains: the per-group partial
 * (FP8, folded into the total with the group multiplier) or the running sum
 * (BF16) waits in a state buffer between column blocks, so every lane sees
 * the FMAs of rows_block in its order, and a token's output is bit for bit
 * the one of the small-M path, whatever the batch around it. */
enum { BZ_NP = 24, BZ_KC = 256, BZ_MC = 32, BZ_MT = 4, BZ_R = 6, BZ_MIN_M = 8 };

static inline __attribute__((always_inline)) void bz_kernel(const float *wp, const float *x, int64_t ldx, int kc,
                                                            float *st, const float *gs, bool fold, bool cont,
                                                            const int R, const int MT) {
    __m512 acc[BZ_R * BZ_MT];
    panel_begin(acc, st, BZ_MC, fold, cont, R, MT);
    for (int s = 0; s < kc; s += 16) {
        __m512 w[BZ_R];
        #pragma GCC unroll 6
        for (int r = 0; r < R; r++) w[r] = _mm512_load_ps(wp + r * BZ_KC + s);
        #pragma GCC unroll 8
        for (int m = 0; m < MT; m++) {
            __m512 xv = _mm512_loadu_ps(x + m * ldx + s);
            __asm__("" : "+v"(xv)); /* one load per token vector, not one per row (folded into the FMAs) */
            #pragma GCC unroll 6
            for (int r = 0; r < R; r++) acc[r * MT + m] = _mm512_fmadd_ps(w[r], xv, acc[r * MT + m]);
        }
    }
    panel_end(acc, st, BZ_MC, gs, fold, cont, R, MT);
}

typedef void (*bz_fn)(const float *, const float *, int64_t, int, float *, const float *, bool, bool);
#define BZ(R, MT)                                                                                              \
    static void bz_##R##_##MT(const float *wp, const float *x, int64_t ldx, int kc, float *st, const float *gs, \
                              bool fold, bool cont) {                                                          \
        bz_kernel(wp, x, ldx, kc, st, gs, fold, cont, R, MT);                                                  \
    }
#define BZ_ALL(R) BZ(R, 1) BZ(R, 2) BZ(R, 3) BZ(R, 4)
BZ_ALL(6)
BZ_ALL(3)
BZ_ALL(1)
#undef BZ_ALL
#undef BZ

/* the columns k0..k0+kc of one row (FP8 or BF16) into the panel's lane order */
static inline void bz_decode_row(const mr_qmatrix *W, int64_t n, int64_t k0, int kc, float *d) {
    const int64_t K = W->cols;
    int i = 0;
    if (W->fmt == MR_FMT_FP8_BLOCK) {
        const uint8_t *s = (const uint8_t *)W->data + n * K + k0;
        for (; i + 32 <= kc; i += 32) {
            __m512 w0, w1;
            e4m3x32(s + i, &w0, &w1);
            _mm512_store_ps(d + i, w0), _mm512_store_ps(d + i + 16, w1);
        }
        if (i < kc) _mm512_store_ps(d + i, e4m3x16(0xFFFF, s + i));
    } else {
        const uint16_t *s = (const uint16_t *)W->data + n * K + k0;
        for (; i < kc; i += 16) _mm512_store_ps(d + i, bf16w16(0xFFFF, s + i));
    }
}

/* the next column block of row n (the panel's next decode) toward L2 */
static inline void bz_prefetch_row(const mr_qmatrix *W, int64_t n, int64_t k0, int kb) {
    const int64_t K = W->cols, es = W->fmt == MR_FMT_FP8_BLOCK ? 1 : 2;
    if (k0 >= K) return;
    const char *p = (const char *)W->data + (n * K + k0) * es;
    const int64_t len = (K - k0 < kb ? K - k0 : kb) * es;
    for (int64_t i = 0; i < len; i += 64) _mm_prefetch(p + i, _MM_HINT_T1);
}

static void rows_blocked(const mr_qmatrix *W, int64_t n0, int64_t nr, const float *x, int64_t M, float *y,
                         int64_t ldy) {
    static const bz_fn b6[BZ_MT + 1] = {NULL, bz_6_1, bz_6_2, bz_6_3, bz_6_4},
                       b3[BZ_MT + 1] = {NULL, bz_3_1, bz_3_2, bz_3_3, bz_3_4},
                       b1[BZ_MT + 1] = {NULL, bz_1_1, bz_1_2, bz_1_3, bz_1_4};
    const bool fp8 = W->fmt == MR_FMT_FP8_BLOCK;
    const int KB = fp8 ? MR_KGROUP : BZ_KC; /* FP8: one scale group per column block */
    const int64_t K = W->cols, G = (K + KB - 1) / KB;
    /* on the stack (24 + 48 KiB): the per-step path does not allocate */
    float wp[BZ_NP * BZ_KC] __attribute__((aligned(64)));
    float st[16 * BZ_NP * BZ_MC] __attribute__((aligned(64)));
    for (int64_t p0 = 0; p0 < nr; p0 += BZ_NP) {
        const int np = (int)(nr - p0 < BZ_NP ? nr - p0 : BZ_NP);
        for (int64_t c0 = 0; c0 < M; c0 += BZ_MC) {
            const int mc = (int)(M - c0 < BZ_MC ? M - c0 : BZ_MC);
            for (int64_t g = 0; g < G; g++) {
                const int64_t k0 = g * KB;
                const int kc = (int)(K - k0 < KB ? K - k0 : KB);
                float gs[BZ_NP];
                for (int r = 0; r < np; r++) {
                    bz_decode_row(W, n0 + p0 + r, k0, kc, wp + r * BZ_KC);
                    bz_prefetch_row(W, n0 + p0 + r, k0 + KB, KB);
                    gs[r] = fp8 ? 256.0f * ((const float *)W->scale)[((n0 + p0 + r) / 128) * G + g] : 1.0f;
                }
                const float *xt = x + c0 * K + k0; /* the token rows in place, K apart */
                for (int m0 = 0; m0 < mc; m0 += BZ_MT) {
                    const int mt = mc - m0 < BZ_MT ? mc - m0 : BZ_MT;
                    for (int r = 0; r < np;) {
                        const int R = np - r >= 6 ? 6 : np - r >= 3 ? 3 : 1;
                        float *sp = st + ((int64_t)r * BZ_MC + m0) * 16;
                        const bz_fn f = (R == 6 ? b6 : R == 3 ? b3 : b1)[mt];
                        /* g 0 starts the chains (BF16) or the totals (FP8) at 0 */
                        f(wp + r * BZ_KC, xt + m0 * K, K, kc, sp, gs + r, fp8, g > 0);
                        r += R;
                    }
                }
            }
            for (int r = 0; r < np; r++) /* the totals, as rows_block ends (fma(acc, 1, 0) for BF16) */
                for (int m = 0; m < mc; m++) {
                    const __m512 t = _mm512_load_ps(st + ((int64_t)r * BZ_MC + m) * 16);
                    y[(c0 + m) * ldy + p0 + r] =
                        _mm512_reduce_add_ps(fp8 ? t : _mm512_fmadd_ps(t, _mm512_set1_ps(1.0f), _mm512_setzero_ps()));
                }
        }
    }
}

static void rows_avx512(const mr_qmatrix *W, int64_t n0, int64_t nr, const float *x, int64_t M, float *y,
                        int64_t ldy) {
    if (M >= BZ_MIN_M && W->cols % 16 == 0) {
        mr__rows_sliced(rows_blocked, BZ_MC, W, n0, nr, x, M, y, ldy);
        return;
    }
    /* up to 7 tokens in one block, so that every weight is decoded once (5-7
     * tokens ran as 4 + 1-3: twice; bench/README.md "Dense decode at 2-7 tokens") */
    static const mr__rows_block_fn full[8] = {NULL, rb_8_1, rb_4_2, rb_2_3, rb_2_4, rb_2_5, rb_2_6, rb_2_7},
                                   one[8] = {NULL, rb_1_1, rb_1_2, rb_1_3, rb_1_4, rb_1_5, rb_1_6, rb_1_7};
    static const int rows_of[8] = {0, 8, 4, 2, 2, 2, 2, 2};
    mr__rows_drive(W, n0, nr, x, M, y, ldy, 7, full, one, rows_of);
}

/* exp(v) for v in [-87.3, 88.7]: 2^n * p(r), n = rne(v log2 e), r = v - n ln2
 * (two-part ln2), p the degree-7 Taylor polynomial (|r| <= 0.347: relative
 * error < 1e-8 before rounding, so within ~2 ulp of expf overall). */
static inline __m512 exp_avx512(__m512 v) {
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), v);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* silu(g) * u = g / (1 + exp(-g)) * u; -g clamped so exp stays finite (the
 * quotient is then g/huge = -0 or g/1 = g as with libm); NaN g stays NaN */
static void silu_mul_avx512(const float *g, const float *u, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask((int)(n - i < 16 ? n - i : 16));
        const __m512 x = _mm512_maskz_loadu_ps(m, g + i), y = _mm512_maskz_loadu_ps(m, u + i);
        __m512 t = _mm512_min_ps(_mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), x), _mm512_set1_ps(-87.3f)),
                                 _mm512_set1_ps(88.7f));
        const __m512 e = exp_avx512(t);
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), y));
    }
}

void mr__kernels_fill_avx512(mr_kernels *k) {
    k->silu_mul.name = "silu_mul_avx512_16";
    k->silu_mul.fn = silu_mul_avx512;
    k->rows[MR_FMT_BF16].name = "rows_bf16_avx512_8x32x1_2x32x7_p24x256x6x4";
    k->rows[MR_FMT_BF16].fn = rows_avx512;
    k->rows[MR_FMT_FP8_BLOCK].name = "rows_fp8_block_avx512_8x32x1_2x32x7_p24x128x6x4";
    k->rows[MR_FMT_FP8_BLOCK].fn = rows_avx512;
    k->isa = "avx512";
    k->decode[MR_FMT_BF16].name = "decode_bf16_avx512_1x16";
    k->decode[MR_FMT_BF16].fn = decode_bf16_avx512;
    k->decode[MR_FMT_FP8_BLOCK].name = "decode_fp8_block_avx512_1x16";
    k->decode[MR_FMT_FP8_BLOCK].fn = decode_fp8_avx512;
    k->decode[MR_FMT_NVFP4].name = "decode_nvfp4_avx512_1x16";
    k->decode[MR_FMT_NVFP4].fn = decode_nvfp4_avx512;
    k->dot_f32.name = "dot_f32_avx512_2x16";
    k->dot_f32.fn = dot_f32_avx512;
    k->dot_bf16.name = "dot_bf16_avx512_2x16";
    k->dot_bf16.fn = dot_bf16_avx512;
}
