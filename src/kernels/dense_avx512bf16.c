/* dense_avx512bf16.c — the dense projections (q/k/v/o, lm_head: mr_matmul) on vdpbf16ps for
 * matrices whose inputs are bf16 values (--dense-activation-dtype bf16), the kernel table's
 * rows_x16 (moerun/kernels.h). Installed over the AVX512-BF16 kernels where vdpbf16ps zmm issues at
 * the vfmadd231ps zmm rate, so that it does twice the multiply-adds (Zen 4; bench/README.md "Dense
 * inputs in bf16 without AMX"): not on Intel's cores with AVX512-FP16, where it issues at half that
 * rate and AMX's rows_tiles takes these matrices. W stays row-major as loaded; x is packed once per
 * call as bf16 (rows_x16 xpack).
 *
 * The sums, one order for every M: each (row, token) has 16 lane chains; lane j of a 64-column
 * block takes its columns' pairs in the xpack order, one vdpbf16ps for the block's first 32 packed
 * columns, then one for the next 32. FP8: a 128-column scale group's chains start at zero and fold
 * into the totals with the group multiplier (fma(acc, s, tot), tot from zero); BF16: one chain over
 * all of K. A row's output is the sum of its 16 lanes (_mm512_reduce_add_ps). Up to 7 tokens run
 * as register blocks over the rows as they are in memory (the E4M3 line decoded in registers); 8 or
 * more over panels of up to 24 rows decoded once into L1 (FP8) or read in place (BF16), 6 rows x 4
 * tokens a register block, the chains kept in a state buffer between column blocks. Both forms give
 * every lane the same sequence of operations, so a token's bits do not depend on M. */
#include <string.h>

#define DP(acc, w, xv) _mm512_dpbf16_ps((acc), (__m512bh)(w), (__m512bh)(xv))
#include "kernels/uk_avx512.h"
#include "kernels/panel_avx512.h"

#define XPF(p, pf) _mm_prefetch((const char *)(p) + (pf), _MM_HINT_T0)

/* the vpermt2w index of the xpack order of a 64-column block from its natural halves (a: 0-31, b:
 * 32-63): FP8's line decode puts bytes 0-7 of each 16 in its first vector, bytes 8-15 in its second */
INL __m512i x16_perm(int half) {
    uint16_t ix[32];
    for (int i = 0; i < 32; i++) ix[i] = (uint16_t)(16 * (i / 8) + 8 * half + i % 8);
    return _mm512_loadu_si512(ix);
}

/* tokens [m0, m1) of x as bf16 (rounded to nearest even), 64 columns at a time (K % 64 == 0) */
INL void x16_pack(const float *x, int64_t K, int64_t m0, int64_t m1, uint16_t *xp, const int fp8) {
    const __m512i p0 = x16_perm(0), p1 = x16_perm(1);
    for (int64_t m = m0; m < m1; m++)
        for (int64_t i = 0; i < K; i += 64) {
            const float *s = x + m * K + i;
            const __m512i a = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + 16), _mm512_loadu_ps(s));
            const __m512i b = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + 48), _mm512_loadu_ps(s + 32));
            uint16_t *d = xp + m * K + i;
            _mm512_storeu_si512(d, fp8 ? _mm512_permutex2var_epi16(a, p0, b) : a);
            _mm512_storeu_si512(d + 32, fp8 ? _mm512_permutex2var_epi16(a, p1, b) : b);
        }
}
static void x16_pack_fp8(const float *x, int64_t K, int64_t m0, int64_t m1, uint16_t *xp) {
    x16_pack(x, K, m0, m1, xp, 1);
}
static void x16_pack_bf16(const float *x, int64_t K, int64_t m0, int64_t m1, uint16_t *xp) {
    x16_pack(x, K, m0, m1, xp, 0);
}

/* 64 E4M3 bytes of a row (any alignment) -> the bf16 values of columns 0-7, 16-23, 32-39, 48-55 (z0)
 * and 8-15, 24-31, 40-47, 56-63 (z1): uk_avx512.h's line decode on an unaligned load */
INL void e4m3x64_bf16(const fp8_lut *t, const uint8_t *p, __m512i *z0, __m512i *z1) {
    const __m512i w = _mm512_loadu_si512(p);
    const __m512i lo = _mm512_permutex2var_epi8(t->l0, w, t->l1);
    const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(t->h0, w, t->h1), w, t->m80, 0xF8);
    *z0 = _mm512_unpacklo_epi8(lo, hi);
    *z1 = _mm512_unpackhi_epi8(lo, hi);
}

/* ---- up to 7 tokens: R rows x TK tokens, the rows as they are in memory ---- */
INL void x16_block(const mr_qmatrix *W, int64_t n, const uint16_t *x, float *y, int64_t ldy, const int R,
                   const int TK) {
    const int64_t K = W->cols;
    const int fp8 = W->fmt == MR_FMT_FP8_BLOCK;
    const int64_t G = fp8 ? K / 128 + (K % 128 != 0) : 1, GL = fp8 ? 128 : K;
    const float *scl = fp8 ? (const float *)W->scale + (n / 128) * G : NULL;
    const uint8_t *w8 = (const uint8_t *)W->data + n * K;
    const uint16_t *w16 = (const uint16_t *)W->data + n * K;
    /* the same columns of a later register block, whole blocks of R rows ahead, at least 16 KiB */
    const int64_t blk = (int64_t)R * K * (fp8 ? 1 : 2), pf = blk * ((16384 + blk - 1) / blk);
    const fp8_lut t = fp8_lut_load();
    const int xreg = TK <= 3; /* x of up to 3 tokens in registers; more as vdpbf16ps memory operands */
    __m512 tot[14], acc[14];
    #pragma GCC unroll 14
    for (int j = 0; j < R * TK; j++) tot[j] = acc[j] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        const int64_t k1 = (g + 1) * GL < K ? (g + 1) * GL : K;
        if (fp8)
            #pragma GCC unroll 14
            for (int j = 0; j < R * TK; j++) acc[j] = _mm512_setzero_ps();
        for (int64_t i = g * GL; i < k1; i += 64) {
            __m512i xa[3], xb[3];
            #pragma GCC unroll 3
            for (int m = 0; xreg && m < TK; m++)
                xa[m] = _mm512_loadu_si512(x + m * K + i), xb[m] = _mm512_loadu_si512(x + m * K + i + 32);
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                __m512i z0, z1;
                if (fp8) {
                    XPF(w8 + r * K + i, pf);
                    e4m3x64_bf16(&t, w8 + r * K + i, &z0, &z1);
                } else {
                    XPF(w16 + r * K + i, pf), XPF(w16 + r * K + i + 32, pf);
                    z0 = _mm512_loadu_si512(w16 + r * K + i), z1 = _mm512_loadu_si512(w16 + r * K + i + 32);
                }
                #pragma GCC unroll 8
                for (int m = 0; m < TK; m++) {
                    const __m512i x0 = xreg ? xa[m < 3 ? m : 0] : _mm512_loadu_si512(x + m * K + i);
                    const __m512i x1 = xreg ? xb[m < 3 ? m : 0] : _mm512_loadu_si512(x + m * K + i + 32);
                    acc[r * TK + m] = DP(DP(acc[r * TK + m], z0, x0), z1, x1);
                }
            }
        }
        if (fp8) {
            const __m512 gs = _mm512_set1_ps(scl[g]);
            #pragma GCC unroll 14
            for (int j = 0; j < R * TK; j++) tot[j] = _mm512_fmadd_ps(acc[j], gs, tot[j]);
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 8
        for (int m = 0; m < TK; m++) y[m * ldy + r] = _mm512_reduce_add_ps(fp8 ? tot[r * TK + m] : acc[r * TK + m]);
}

typedef void (*x16_block_fn)(const mr_qmatrix *W, int64_t n, const uint16_t *x, float *y, int64_t ldy);
#define XB(R, TK)                                                                                             \
    static void xb_##R##_##TK(const mr_qmatrix *W, int64_t n, const uint16_t *x, float *y, int64_t ldy) {     \
        x16_block(W, n, x, y, ldy, R, TK);                                                                    \
    }
XB(8, 1)
XB(4, 2)
XB(2, 3)
XB(2, 4)
XB(1, 1)
XB(1, 2)
XB(1, 3)
XB(1, 4)
XB(1, 5)
XB(1, 6)
XB(1, 7)
XB(2, 5)
XB(2, 6)
XB(2, 7)
#undef XB

/* ---- 8 tokens or more: panels of up to XZ_NP rows x one column block (FP8: a 128-column scale group
 * decoded into L1 in the xpack order; BF16: XZ_KC columns read in place), tokens in chunks of
 * XZ_MC, register blocks of XZ_R rows x XZ_MT tokens, the chains in st between column blocks ---- */
enum { XZ_NP = 24, XZ_KC = 256, XZ_MC = 32, XZ_MT = 4, XZ_R = 6, XZ_MIN_M = 8 };

/* the chains of R rows x TK tokens over kc columns of the panel (rows ldw apart) and of the tokens
 * (ldx apart); st[(r XZ_MC + m) 16]: FP8 (fold) the group's totals, BF16 the chains themselves */
INL void xz_kernel(const uint16_t *wp, int64_t ldw, const uint16_t *x, int64_t ldx, int kc, float *st,
                   const float *gs, const int fold, const int cont, const int R, const int TK) {
    __m512 acc[XZ_R * XZ_MT];
    mr__panel_begin(acc, st, XZ_MC, fold, cont, R, TK);
    for (int s = 0; s < kc; s += 32) {
        __m512i w[XZ_R];
        #pragma GCC unroll 6
        for (int r = 0; r < R; r++) w[r] = _mm512_loadu_si512(wp + r * ldw + s);
        #pragma GCC unroll 4
        for (int m = 0; m < TK; m++) {
            __m512i xv = _mm512_loadu_si512(x + m * ldx + s);
            __asm__("" : "+v"(xv)); /* one load per token vector, not one per row */
            #pragma GCC unroll 6
            for (int r = 0; r < R; r++) acc[r * TK + m] = DP(acc[r * TK + m], w[r], xv);
        }
    }
    mr__panel_end(acc, st, XZ_MC, gs, fold, cont, R, TK);
}

typedef void (*xz_fn)(const uint16_t *, int64_t, const uint16_t *, int64_t, int, float *, const float *, int, int);
#define XZ(R, TK)                                                                                              \
    static void xz_##R##_##TK(const uint16_t *wp, int64_t ldw, const uint16_t *x, int64_t ldx, int kc, float *st, \
                              const float *gs, int fold, int cont) {                                           \
        xz_kernel(wp, ldw, x, ldx, kc, st, gs, fold, cont, R, TK);                                             \
    }
#define XZ_ALL(R) XZ(R, 1) XZ(R, 2) XZ(R, 3) XZ(R, 4)
XZ_ALL(6)
XZ_ALL(3)
XZ_ALL(1)
#undef XZ_ALL
#undef XZ

static void x16_blocked(const mr_qmatrix *W, int64_t n0, int64_t nr, const uint16_t *x, int64_t M, float *y,
                        int64_t ldy) {
    static const xz_fn b6[XZ_MT + 1] = {NULL, xz_6_1, xz_6_2, xz_6_3, xz_6_4},
                       b3[XZ_MT + 1] = {NULL, xz_3_1, xz_3_2, xz_3_3, xz_3_4},
                       b1[XZ_MT + 1] = {NULL, xz_1_1, xz_1_2, xz_1_3, xz_1_4};
    const int fp8 = W->fmt == MR_FMT_FP8_BLOCK;
    const int KB = fp8 ? MR_KGROUP : XZ_KC;
    const int64_t K = W->cols, G = (K + KB - 1) / KB;
    const fp8_lut t = fp8_lut_load();
    uint16_t wp[XZ_NP * MR_KGROUP] __attribute__((aligned(64))); /* FP8's decoded panel (6 KiB) */
    float st[16 * XZ_NP * XZ_MC] __attribute__((aligned(64)));   /* 48 KiB */
    for (int64_t p0 = 0; p0 < nr; p0 += XZ_NP) {
        const int np = (int)(nr - p0 < XZ_NP ? nr - p0 : XZ_NP);
        for (int64_t c0 = 0; c0 < M; c0 += XZ_MC) {
            const int mc = (int)(M - c0 < XZ_MC ? M - c0 : XZ_MC);
            for (int64_t g = 0; g < G; g++) {
                const int64_t k0 = g * KB;
                const int kc = (int)(K - k0 < KB ? K - k0 : KB);
                float gs[XZ_NP];
                const uint16_t *pan = wp;
                int64_t ldw = MR_KGROUP;
                for (int r = 0; r < np; r++) {
                    const int64_t n = n0 + p0 + r;
                    if (fp8) {
                        const uint8_t *s = (const uint8_t *)W->data + n * K + k0;
                        for (int i = 0; i < kc; i += 64) {
                            __m512i z0, z1;
                            e4m3x64_bf16(&t, s + i, &z0, &z1);
                            _mm512_store_si512(wp + r * MR_KGROUP + i, z0);
                            _mm512_store_si512(wp + r * MR_KGROUP + i + 32, z1);
                        }
                        gs[r] = ((const float *)W->scale)[(n / 128) * G + g];
                        if (k0 + KB < K) /* the row's next group toward L2 */
                            for (int i = 0; i < KB && k0 + KB + i < K; i += 64)
                                _mm_prefetch((const char *)s + KB + i, _MM_HINT_T1);
                    } else if (k0 + KB < K) {
                        const char *s = (const char *)((const uint16_t *)W->data + n * K + k0 + KB);
                        for (int i = 0; i < 2 * KB && 2 * (k0 + KB) + i < 2 * K; i += 64) _mm_prefetch(s + i, _MM_HINT_T1);
                    }
                }
                if (!fp8) pan = (const uint16_t *)W->data + (n0 + p0) * K + k0, ldw = K;
                const uint16_t *xt = x + c0 * K + k0;
                for (int m0 = 0; m0 < mc; m0 += XZ_MT) {
                    const int mt = mc - m0 < XZ_MT ? mc - m0 : XZ_MT;
                    for (int r = 0; r < np;) {
                        const int R = np - r >= 6 ? 6 : np - r >= 3 ? 3 : 1;
                        const xz_fn f = (R == 6 ? b6 : R == 3 ? b3 : b1)[mt];
                        /* g 0 starts the chains (BF16) or the totals (FP8) at 0 */
                        f(pan + r * ldw, ldw, xt + m0 * K, K, kc, st + ((int64_t)r * XZ_MC + m0) * 16, gs + r, fp8, g > 0);
                        r += R;
                    }
                }
            }
            for (int r = 0; r < np; r++)
                for (int m = 0; m < mc; m++)
                    y[(c0 + m) * ldy + p0 + r] = _mm512_reduce_add_ps(_mm512_load_ps(st + ((int64_t)r * XZ_MC + m) * 16));
        }
    }
}

static void rows_x16(const mr_qmatrix *W, int64_t n0, int64_t nr, const uint16_t *x, int64_t M, float *y,
                     int64_t ldy) {
    const int64_t K = W->cols;
    if (M >= XZ_MIN_M) { /* tokens in slices of about 512 KiB of packed x, each kept in L2 over every panel */
        int64_t mo = ((int64_t)1 << 19) / (K * 2) / XZ_MC * XZ_MC;
        if (mo < XZ_MC) mo = XZ_MC;
        for (int64_t o0 = 0; o0 < M; o0 += mo)
            x16_blocked(W, n0, nr, x + o0 * K, M - o0 < mo ? M - o0 : mo, y + o0 * ldy, ldy);
        return;
    }
    /* 1-7 tokens in one register block, each weight decoded once: 8 rows x 1 token, 4 x 2, 2 x 3-4,
     * FP8 1 x 5-7 (its group totals beside the chains: 2 rows would spill), BF16 2 x 5-7 (bench dense
     * BF16 at 5 tokens: 1 row read 0.92x the FMA rows); rows in chunks of 8 (inside one 128-row scale
     * block: n0 is a multiple of 16) */
    static const x16_block_fn full8[8] = {NULL, xb_8_1, xb_4_2, xb_2_3, xb_2_4, xb_1_5, xb_1_6, xb_1_7},
                              full16[8] = {NULL, xb_8_1, xb_4_2, xb_2_3, xb_2_4, xb_2_5, xb_2_6, xb_2_7},
                              one[8] = {NULL, xb_1_1, xb_1_2, xb_1_3, xb_1_4, xb_1_5, xb_1_6, xb_1_7};
    static const int rows8[8] = {0, 8, 4, 2, 2, 1, 1, 1}, rows16[8] = {0, 8, 4, 2, 2, 2, 2, 2};
    const int fp8 = W->fmt == MR_FMT_FP8_BLOCK;
    const x16_block_fn *full = fp8 ? full8 : full16;
    const int R = (fp8 ? rows8 : rows16)[M];
    for (int64_t j = 0; j < nr; j += 8) {
        const int64_t rows = nr - j < 8 ? nr - j : 8;
        int64_t r = 0;
        for (; r + R <= rows; r += R) full[M](W, n0 + j + r, x, y + j + r, ldy);
        for (; r < rows; r++) one[M](W, n0 + j + r, x, y + j + r, ldy);
    }
}

void mr__dense_fill_avx512bf16(mr_kernels *k) {
    if (k->flags & MR_CPU_AVX512FP16) return; /* vdpbf16ps at half the FMA rate there (uk_avx512bf16.c) */
    k->rows_x16[MR_FMT_FP8_BLOCK].name = "rows_x16_fp8_block_avx512bf16_8x64x1_1x64x7_p24x128x6x4";
    k->rows_x16[MR_FMT_FP8_BLOCK].fn = rows_x16;
    k->rows_x16[MR_FMT_FP8_BLOCK].xpack = x16_pack_fp8;
    k->rows_x16[MR_FMT_BF16].name = "rows_x16_bf16_avx512bf16_8x64x1_1x64x7_p24x256x6x4";
    k->rows_x16[MR_FMT_BF16].fn = rows_x16;
    k->rows_x16[MR_FMT_BF16].xpack = x16_pack_bf16;
}
