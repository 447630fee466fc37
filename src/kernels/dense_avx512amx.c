/* dense_avx512amx.c — the dense projections (q/k/v/o, lm_head: mr_matmul) on AMX-BF16, the
 * kernel table's rows_tiles (moerun/kernels.h), compiled for AMX like uk_avx512amx.c and installed
 * with its kernels (isa.c) where the CPU has AMX-TILE and AMX-BF16 and Linux grants the tile data
 * state. Measured against the FMA rows kernels in bench/README.md ("Dense projections on AMX"). */
#include <string.h>

/* uk_avx512.h's pair-dot bodies are not used here; DP only has to compile */
#define DP(acc, w, xv) _mm512_add_ps(_mm512_add_ps((acc), _mm512_castsi512_ps(w)), (xv))
#include "kernels/uk_avx512.h"
#include "kernels/amx_tiles.h"

/* ---- the dense projections on tiles (moerun/kernels.h rows_tiles): W packed as the expert kernels
 * take it (FP8_R16K4, BF16_R16K2), so that its tiles are B tiles (FP8: decoded per 128 k into L1
 * as uk_fp8_bf16_amx does), and x's three exact bf16 parts stacked as A-tile rows: token i of a
 * block of 5, part p, row 3 i + p. One tdpbf16ps per 32 k serves 5 tokens' exact products (one
 * token: one tdpbf16ps, so decode stays as cheap as the expert kernels'); the epilogue adds a
 * token's three rows of C. Tokens run in slices of about 1 MiB of packed x, every tile over the
 * slice while it is in L2. ---- */

INL __mmask16 mask16(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1); }

/* token m0's block (m0 a multiple of 5, tw tokens), chunk c: 3 tw rows of 64 bytes */
INL const uint8_t *xp_rows(const void *xp, int64_t m0, int64_t Kc, int64_t tw, int64_t c) {
    return (const uint8_t *)xp + (size_t)(m0 * Kc + c * tw) * 192;
}

/* tokens a slice: at most about 1 MiB of packed x, a multiple of 5, 5-40 (40: the 4 chunks of one
 * 128-k block of the slice's x, 30 KiB, stay in L1 while the FP8 kernel runs every column tile over
 * them; bench dense at 64-512 tokens read 25 and 40 best, 55 and 80 5-10% slower) */
static int64_t dense_slice(int64_t Kc) {
    const int64_t s = ((int64_t)1 << 20) / (Kc * 192) / 5 * 5;
    return s < 5 ? 5 : s > 40 ? 40 : s;
}

/* the rows a block of tw tokens at m0 takes in the pack: a last block of fewer than 5 tokens is padded
 * to 5 with zero rows where its slice holds full blocks too (the kernels then run every block of the
 * slice on 15-row tiles), and keeps its 3 tw rows where it is alone in its slice */
INL int64_t xp_width(int64_t m0, int64_t tw, int64_t Kc) { return tw < 5 && m0 % dense_slice(Kc) ? 5 : tw; }

/* the vpermt2w index of the high words of a's 16 dwords, then b's: 32 bf16 in column order */
INL __m512i hi_words(void) {
    uint16_t ix[32];
    for (int i = 0; i < 32; i++) ix[i] = (uint16_t)(i < 16 ? 2 * i + 1 : 32 + 2 * (i - 16) + 1);
    return _mm512_loadu_si512(ix);
}

static void xpack_amx(const float *x, int64_t M, int64_t K, int64_t b0, int64_t b1, void *xp) {
    const int64_t Kc = (K + 127) / 128 * 4;
    const __m512i top = _mm512_set1_epi32((int)0xFFFF0000u);
    const __m512i hw = hi_words();
    for (int64_t b = b0; b < b1; b++) {
        const int64_t m0 = 5 * b, tw = M - m0 < 5 ? M - m0 : 5, lw = xp_width(m0, tw, Kc);
        for (int64_t c = 0; c < Kc; c++) {
            uint8_t *rows = (uint8_t *)xp_rows(xp, m0, Kc, lw, c);
            const int64_t k0 = c * 32;
            const __mmask16 ma = mask16(K - k0), mb = mask16(K - k0 - 16);
            for (int64_t i = 0; i < tw; i++) {
                const float *xr = x + (m0 + i) * K + k0;
                const __m512 v[2] = {_mm512_maskz_loadu_ps(ma, xr), _mm512_maskz_loadu_ps(mb, xr + 16)};
                __m512i part[3][2];
                for (int h = 0; h < 2; h++) { /* hi = trunc(x), mid = trunc(x - hi), lo = x - hi - mid (exact) */
                    const __m512 hi = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v[h]), top));
                    const __m512 r = _mm512_sub_ps(v[h], hi);
                    const __m512 mid = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(r), top));
                    part[0][h] = _mm512_castps_si512(hi);
                    part[1][h] = _mm512_castps_si512(mid);
                    part[2][h] = _mm512_castps_si512(_mm512_sub_ps(r, mid));
                }
                for (int p = 0; p < 3; p++)
                    _mm512_store_si512(rows + (3 * i + p) * 64, _mm512_permutex2var_epi16(part[p][0], hw, part[p][1]));
            }
            for (int64_t r = 3 * tw; r < 3 * lw; r++) _mm512_store_si512(rows + r * 64, _mm512_setzero_si512());
        }
    }
}

/* x of bf16 values (finite, the low 16 bits of every fp32 zero: mr_matmul checks it) as one part:
 * token blocks of 16 (of M where M < 16), a block's chunk c the block's rows of 64 bytes (16 tokens
 * a tile, three times the tokens of the three-part pack), the last block padded with zero rows where
 * M >= 16 (moerun/kernels.h MR_XPACK1_BYTES). */
INL int64_t xp1_width(int64_t M) { return M < 16 ? M : 16; }
INL const uint8_t *xp1_rows(const void *xp, int64_t m0, int64_t Kc, int64_t bw, int64_t c) {
    return (const uint8_t *)xp + (size_t)(m0 * Kc + c * bw) * 64;
}

static void xpack1_amx(const float *x, int64_t M, int64_t K, int64_t b0, int64_t b1, void *xp) {
    const int64_t Kc = (K + 127) / 128 * 4, bw = xp1_width(M);
    const __m512i hw = hi_words();
    for (int64_t b = b0; b < b1; b++) {
        const int64_t m0 = 16 * b, tw = M - m0 < 16 ? M - m0 : 16;
        for (int64_t c = 0; c < Kc; c++) {
            uint8_t *rows = (uint8_t *)xp1_rows(xp, m0, Kc, bw, c);
            const int64_t k0 = c * 32;
            const __mmask16 ma = mask16(K - k0), mb = mask16(K - k0 - 16);
            for (int64_t i = 0; i < tw; i++) {
                const float *xr = x + (m0 + i) * K + k0;
                _mm512_store_si512(rows + i * 64,
                                   _mm512_permutex2var_epi16(_mm512_castps_si512(_mm512_maskz_loadu_ps(ma, xr)), hw,
                                                             _mm512_castps_si512(_mm512_maskz_loadu_ps(mb, xr + 16))));
            }
            for (int64_t i = tw; i < bw; i++) _mm512_store_si512(rows + i * 64, _mm512_setzero_si512());
        }
    }
}

/* The tiles: tmm0-2 C (R rows: 15, or 3 sm where the slice is one short block; FP8 uses tmm0, BF16
 * one for each of three token blocks), tmm3 A (one 32-k chunk of a block), tmm4-7 B (16 pair rows x
 * 16 rows: FP8 the 128-k block's four, BF16 tmm4 a 32-k chunk, which three blocks take in turn, tmm5
 * the last kt k, tmm6 those kt k's A). */
static void dense_config(int64_t R, int bf16, int64_t kt) {
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) c.colsb[i] = 64, c.rows[i] = 16;
    c.rows[0] = c.rows[1] = c.rows[2] = c.rows[3] = (uint8_t)R;
    if (bf16 && kt) c.rows[5] = (uint8_t)(kt / 2), c.rows[6] = (uint8_t)R, c.colsb[6] = (uint16_t)(kt * 2);
    amx_load_cfg(&c);
}

/* y's row (the mask mk) = v s, or + v s where not first */
INL void dense_put(__m512 v, float s, int first, float *yr, __mmask16 mk) {
    const __m512 r = first ? _mm512_mul_ps(v, _mm512_set1_ps(s))
                           : _mm512_fmadd_ps(v, _mm512_set1_ps(s), _mm512_maskz_loadu_ps(mk, yr));
    _mm512_mask_storeu_ps(yr, mk, r);
}

/* C (16 floats a row, 3 rows a token) -> y rows m (a token each, the row mask mk): the sum of a
 * token's three parts, times s (FP8: the block multiplier; y = that or y + that, by first) */
INL void dense_store(const float *c, int64_t tw, float s, int first, float *y, int64_t ldy, __mmask16 mk) {
    for (int64_t i = 0; i < tw; i++) {
        const __m512 v = _mm512_add_ps(_mm512_add_ps(_mm512_load_ps(c + 48 * i), _mm512_load_ps(c + 48 * i + 16)),
                                       _mm512_load_ps(c + 48 * i + 32));
        dense_put(v, s, first, y + i * ldy, mk);
    }
}

/* C of the one-part pack (16 floats a row, a row a token) -> y rows, as dense_store: the row plus +0,
 * which is what dense_store computes for a bf16 x (its mid and lo parts are +0, and so are their C
 * rows): the same bits, -0 included */
INL void dense_store1(const float *c, int64_t tw, float s, int first, float *y, int64_t ldy, __mmask16 mk) {
    for (int64_t i = 0; i < tw; i++)
        dense_put(_mm512_add_ps(_mm512_load_ps(c + 16 * i), _mm512_setzero_ps()), s, first, y + i * ldy, mk);
}

/* one 32-k chunk ch of the group's ng token blocks (literal A and B tiles), each a block of step tokens
 * of the pack that rows() reads (width w): C j += A(block j, ch) B */
#define GROUP_DP_(A, B, ch, rows, w, step)                          \
    do {                                                            \
        AMX_LOADD(A, rows(xp, m0, Kc, w, ch), 64);                  \
        _tile_dpbf16ps(0, A, B);                                    \
        if (ng > 1) {                                               \
            AMX_LOADD(A, rows(xp, m0 + (step), Kc, w, ch), 64);     \
            _tile_dpbf16ps(1, A, B);                                \
        }                                                           \
        if (ng > 2) {                                               \
            AMX_LOADD(A, rows(xp, m0 + 2 * (step), Kc, w, ch), 64); \
            _tile_dpbf16ps(2, A, B);                                \
        }                                                           \
    } while (0)
#define GROUP_DP(A, B, ch) GROUP_DP_(A, B, ch, xp_rows, lw, 5)    /* the three-part pack */
#define GROUP_DP1(A, B, ch) GROUP_DP_(A, B, ch, xp1_rows, bw, 16) /* the one-part pack */

INL void group_zero(int ng) {
    _tile_zero(0);
    if (ng > 1) _tile_zero(1);
    if (ng > 2) _tile_zero(2);
}

/* the group's C tiles to c (1 KiB each), then each block's tokens to y */
INL void group_store(float *c, int ng, int64_t sm, int64_t i0, int step, float s, int first, float *y, int64_t ldy,
                     __mmask16 mk) {
    AMX_STORED(0, c, 64);
    if (ng > 1) AMX_STORED(1, c + 256, 64);
    if (ng > 2) AMX_STORED(2, c + 512, 64);
    for (int j = 0; j < ng; j++) {
        const int64_t i = i0 + step * j, tw = sm - i < step ? sm - i : step;
        if (step == 16) dense_store1(c + 256 * j, tw, s, first, y + i * ldy, ldy, mk); /* the one-part pack */
        else dense_store(c + 256 * j, tw, s, first, y + i * ldy, ldy, mk);
    }
}

/* a slice of sm tokens: its blocks' width in the pack (the tiles take 3 of it as rows) */
INL int64_t slice_width(int64_t sm) { return sm < 5 ? sm : 5; }

/* a token block's 128-k block kb over the four B tiles of a column tile, from the pack that rows() reads
 * (width w): C0 += A3(chunk) B4-7 */
#define FP8_BLOCK_DP_(m0, rows, w)                             \
    do {                                                       \
        _tile_zero(0);                                         \
        AMX_LOADD(3, rows(xp, m0, Kc, w, 4 * kb), 64);         \
        _tile_dpbf16ps(0, 3, 4);                               \
        AMX_LOADD(3, rows(xp, m0, Kc, w, 4 * kb + 1), 64);     \
        _tile_dpbf16ps(0, 3, 5);                               \
        AMX_LOADD(3, rows(xp, m0, Kc, w, 4 * kb + 2), 64);     \
        _tile_dpbf16ps(0, 3, 6);                               \
        AMX_LOADD(3, rows(xp, m0, Kc, w, 4 * kb + 3), 64);     \
        _tile_dpbf16ps(0, 3, 7);                               \
        AMX_STORED(0, c, 64);                                  \
    } while (0)
#define FP8_BLOCK_DP(m0, lw) FP8_BLOCK_DP_(m0, xp_rows, lw) /* the three-part pack */
#define FP8_BLOCK_DP1(m0) FP8_BLOCK_DP_(m0, xp1_rows, bw)   /* the one-part pack */

INL void fp8_load_b(const __m512i *b) {
    AMX_LOADD(4, b, 64);
    AMX_LOADD(5, b + 16, 64);
    AMX_LOADD(6, b + 32, 64);
    AMX_LOADD(7, b + 48, 64);
}

/* The 128-k block outermost: column tile t's block kb decoded into the B tiles (tmm4-7), and the block
 * the loop reaches 4 tiles later prefetched (into L2). */
INL void fp8_next_block(const mr_pmatrix *P, const fp8_lut *lut, __m512i *b, int64_t t, int64_t kb, int64_t ta,
                        int64_t tb) {
    const int64_t G = P->Kp / 128;
    const int64_t tp = t + 4 < tb ? t + 4 : kb + 1 < G ? ta + (t + 4 - tb) % (tb - ta) : -1;
    const int64_t kp = t + 4 < tb ? kb : kb + 1;
    if (tp >= 0)
        for (int g = 0; g < 32; g++)
            _mm_prefetch((const char *)P->data + (size_t)tp * P->tile_bytes + kp * 2048 + g * 64, _MM_HINT_T2);
    fp8_block_pairs(lut, P->data + (size_t)t * P->tile_bytes + kb * 2048, b, 2);
    fp8_load_b(b);
}

/* Two loop orders, the same operations for each token (so the same bits at every M):
 * - a slice of full blocks runs 128-k block outermost: block kb of every column tile in turn, over
 *   every token block. The slice's packed x for one kb (4 chunks of 960 bytes a block) then stays in
 *   L1 across the column tiles, where a column tile at a time streamed the slice's whole packed x
 *   from L2 for each of them (an A tile from L2 cost about twice a tdpbf16ps). y's rows of the
 *   slice are read and written once per kb (L2). Column tile t + 4's block is prefetched.
 * - a slice of one short block (decode) keeps the column tile outermost: each tile's bytes in order,
 *   with the expert kernels' prefetch 16 KiB ahead (29-32 GB/s at M = 1). */
static void rows_fp8_tiles(const mr_pmatrix *P, int64_t n0, int64_t nr, const void *xp, int64_t M, float *y,
                           int64_t ldy, void *scratch) {
    const fp8_lut lut = fp8_lut_load();
    const int64_t G = P->Kp / 128, Kc = 4 * G, S = dense_slice(Kc), ta = n0 / 16, tb = (n0 + nr + 15) / 16;
    __m512i *b = (__m512i *)scratch;               /* the block's 4 B tiles: 4 KiB */
    float *c = (float *)((char *)scratch + 4096); /* a C tile: 1 KiB */
    for (int64_t s0 = 0; s0 < M; s0 += S) {
        const int64_t sm = M - s0 < S ? M - s0 : S;
        const int64_t lw = slice_width(sm);
        dense_config(3 * lw, 0, 0);
        if (sm < 5) {
            for (int64_t t = ta; t < tb; t++) {
                const uint8_t *tile = P->data + (size_t)t * P->tile_bytes;
                for (int64_t kb = 0; kb < G; kb++) {
                    fp8_block_pairs(&lut, tile + kb * 2048, b, 0);
                    fp8_load_b(b);
                    FP8_BLOCK_DP(s0, lw);
                    dense_store(c, sm, P->tscale[t * G + kb], kb == 0, y + (16 * t - n0) + s0 * ldy, ldy,
                                mask16(n0 + nr - 16 * t));
                }
            }
            continue;
        }
        for (int64_t kb = 0; kb < G; kb++) {
            for (int64_t t = ta; t < tb; t++) {
                fp8_next_block(P, &lut, b, t, kb, ta, tb);
                const float s = P->tscale[t * G + kb];
                const __mmask16 mk = mask16(n0 + nr - 16 * t);
                for (int64_t i0 = 0; i0 < sm; i0 += 5) {
                    FP8_BLOCK_DP(s0 + i0, lw);
                    dense_store(c, sm - i0 < 5 ? sm - i0 : 5, s, kb == 0, y + (16 * t - n0) + (s0 + i0) * ldy, ldy, mk);
                }
            }
        }
    }
    _tile_release();
}

static void rows_bf16_tiles(const mr_pmatrix *P, int64_t n0, int64_t nr, const void *xp, int64_t M, float *y,
                            int64_t ldy, void *scratch) {
    const int64_t Kc = (P->cols + 127) / 128 * 4, S = dense_slice(Kc), K32 = P->Kp / 32 * 32, kt = P->Kp - K32;
    float *c = (float *)scratch; /* three C tiles: 3 KiB */
    for (int64_t s0 = 0; s0 < M; s0 += S) {
        const int64_t sm = M - s0 < S ? M - s0 : S;
        const int64_t lw = slice_width(sm);
        dense_config(3 * lw, 1, kt);
        for (int64_t t = n0 / 16; 16 * t < n0 + nr; t++) {
            const uint8_t *tile = P->data + (size_t)t * P->tile_bytes;
            const __mmask16 mk = mask16(n0 + nr - 16 * t);
            float *yt = y + (16 * t - n0) + s0 * ldy;
            for (int64_t i0 = 0; i0 < sm; i0 += 15) {
                const int64_t m0 = s0 + i0;
                const int ng = (int)((sm - i0 + 4) / 5 < 3 ? (sm - i0 + 4) / 5 : 3);
                group_zero(ng);
                for (int64_t ch = 0; ch < K32 / 32; ch++) {
                    if (i0 == 0) pf_tile(tile + ch * 1024, 0);
                    AMX_LOADD(4, tile + ch * 1024, 64);
                    GROUP_DP(3, 4, ch);
                }
                if (kt) {
                    AMX_LOADD(5, tile + K32 * 32, 64);
                    GROUP_DP(6, 5, K32 / 32);
                }
                group_store(c, ng, sm, i0, 5, 1.0f, 1, yt, ldy, mk);
            }
        }
    }
    _tile_release();
}

/* ---- the same on the one-part pack (xpack1_amx): 16 tokens an A tile, one tdpbf16ps per 32 k for 16
 * tokens where the three-part pack takes one for 5. A token's row of C is the hi row of the three-part
 * kernel (the same operations: AMX computes each row of C alone), and the epilogues add what the mid
 * and lo rows hold for such x (+0), so both kernels give the same bits for such a token, at every M,
 * whichever pack mr_matmul chooses for its call. ---- */

/* tokens a slice of the FP8 kernel: the slice's x for one 128-k block (256 bytes a token) stays in L1
 * across the column tiles */
enum { DENSE1_SLICE = 64 };

/* the loop orders of rows_fp8_tiles: column tile outermost below 5 tokens, else the 128-k block
 * outermost over slices of DENSE1_SLICE tokens */
static void rows_fp8_tiles1(const mr_pmatrix *P, int64_t n0, int64_t nr, const void *xp, int64_t M, float *y,
                            int64_t ldy, void *scratch) {
    const fp8_lut lut = fp8_lut_load();
    const int64_t G = P->Kp / 128, Kc = 4 * G, ta = n0 / 16, tb = (n0 + nr + 15) / 16, bw = xp1_width(M);
    __m512i *b = (__m512i *)scratch;
    float *c = (float *)((char *)scratch + 4096);
    dense_config(bw, 0, 0);
    if (M < 5) {
        for (int64_t t = ta; t < tb; t++) {
            const uint8_t *tile = P->data + (size_t)t * P->tile_bytes;
            for (int64_t kb = 0; kb < G; kb++) {
                fp8_block_pairs(&lut, tile + kb * 2048, b, 0);
                fp8_load_b(b);
                FP8_BLOCK_DP1(0);
                dense_store1(c, M, P->tscale[t * G + kb], kb == 0, y + (16 * t - n0), ldy, mask16(n0 + nr - 16 * t));
            }
        }
        _tile_release();
        return;
    }
    for (int64_t s0 = 0; s0 < M; s0 += DENSE1_SLICE) {
        const int64_t sm = M - s0 < DENSE1_SLICE ? M - s0 : DENSE1_SLICE;
        for (int64_t kb = 0; kb < G; kb++) {
            for (int64_t t = ta; t < tb; t++) {
                fp8_next_block(P, &lut, b, t, kb, ta, tb);
                const float s = P->tscale[t * G + kb];
                const __mmask16 mk = mask16(n0 + nr - 16 * t);
                for (int64_t i0 = 0; i0 < sm; i0 += 16) {
                    FP8_BLOCK_DP1(s0 + i0);
                    dense_store1(c, sm - i0 < 16 ? sm - i0 : 16, s, kb == 0, y + (16 * t - n0) + (s0 + i0) * ldy, ldy,
                                 mk);
                }
            }
        }
    }
    _tile_release();
}
#undef FP8_BLOCK_DP1
#undef FP8_BLOCK_DP
#undef FP8_BLOCK_DP_

/* rows_bf16_tiles on the one-part pack: three blocks of 16 tokens a load of each B tile, over slices of
 * about 1 MiB of packed x (a multiple of 48 tokens) */
static void rows_bf16_tiles1(const mr_pmatrix *P, int64_t n0, int64_t nr, const void *xp, int64_t M, float *y,
                             int64_t ldy, void *scratch) {
    const int64_t Kc = (P->cols + 127) / 128 * 4, K32 = P->Kp / 32 * 32, kt = P->Kp - K32, bw = xp1_width(M);
    float *c = (float *)scratch; /* three C tiles: 3 KiB */
    int64_t S = ((int64_t)1 << 20) / (Kc * 64) / 48 * 48;
    if (S < 48) S = 48;
    dense_config(bw, 1, kt);
    for (int64_t s0 = 0; s0 < M; s0 += S) {
        const int64_t se = M - s0 < S ? M : s0 + S;
        for (int64_t t = n0 / 16; 16 * t < n0 + nr; t++) {
            const uint8_t *tile = P->data + (size_t)t * P->tile_bytes;
            const __mmask16 mk = mask16(n0 + nr - 16 * t);
            for (int64_t m0 = s0; m0 < se; m0 += 48) {
                const int ng = (int)((se - m0 + 15) / 16 < 3 ? (se - m0 + 15) / 16 : 3);
                group_zero(ng);
                for (int64_t ch = 0; ch < K32 / 32; ch++) {
                    if (m0 == s0) pf_tile(tile + ch * 1024, 0);
                    AMX_LOADD(4, tile + ch * 1024, 64);
                    GROUP_DP1(3, 4, ch);
                }
                if (kt) {
                    AMX_LOADD(5, tile + K32 * 32, 64);
                    GROUP_DP1(6, 5, K32 / 32);
                }
                group_store(c, ng, se, m0, 16, 1.0f, 1, y + (16 * t - n0), ldy, mk);
            }
        }
    }
    _tile_release();
}
#undef GROUP_DP1
#undef GROUP_DP
#undef GROUP_DP_

void mr__dense_fill_avx512amx(mr_kernels *k) {
    k->rows_tiles[MR_FMT_FP8_BLOCK].name = "rows_fp8_block_avx512_amx_5x3x16x128";
    k->rows_tiles[MR_FMT_FP8_BLOCK].fn = rows_fp8_tiles;
    k->rows_tiles[MR_FMT_FP8_BLOCK].pack = MR_PACK_FP8_R16K4;
    k->rows_tiles[MR_FMT_BF16].name = "rows_bf16_avx512_amx_5x3x16x32";
    k->rows_tiles[MR_FMT_BF16].fn = rows_bf16_tiles;
    k->rows_tiles[MR_FMT_BF16].pack = MR_PACK_BF16_R16K2;
    k->rows_xpack = xpack_amx;
    k->rows_tiles[MR_FMT_FP8_BLOCK].fn1 = rows_fp8_tiles1;
    k->rows_tiles[MR_FMT_BF16].fn1 = rows_bf16_tiles1;
    k->rows_xpack1 = xpack1_amx;
}
