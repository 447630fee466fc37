/* kern_internal.h — private to src/kernels: the per-ISA table fillers and
 * the decode lookup tables shared by the generic and ISA files. */
#ifndef MR_KERN_INTERNAL_H
#define MR_KERN_INTERNAL_H

#include <string.h>

#include "moerun/kernels.h"

/* e4m3 byte -> fp32 (exact; NaN codes decode to NaN). Filled once. */
extern float mr__e4m3_lut[256];
/* e2m1 nibble -> fp32. */
extern const float mr__e2m1_lut[16];
void mr__kern_luts_init(void);

/* Fills k with the entries of every level up to `level` (isa.c's table), in order. */
void mr__kernels_fill_level(mr_kernels *k, mr_kernel_isa level);
void mr__kernels_fill_generic(mr_kernels *k);
void mr__kernels_fill_avx2(mr_kernels *k);   /* kernels_avx2.c */
void mr__kernels_fill_avx512(mr_kernels *k); /* kernels_avx512.c */

/* packed micro-kernels (uk*.c) */
/* Tokens of the next register block when `left` remain and a block takes at
 * most `most`: the blocks of a call are balanced (17 = 6 + 6 + 5, not
 * 8 + 8 + 1), because a block of 1-2 tokens runs at about half the compute
 * rate of 5-8 (dev/perf/hot_uk). */
static inline int64_t mr__uk_token_block(int64_t left, int64_t most) {
    const int64_t nb = (left + most - 1) / most;
    return (left + nb - 1) / nb;
}
typedef void (*mr__uk_stage_fn)(const float *w /* [nk][16] */, const float *x /* [nk] */, int nk, float *acc /* [16] */);
void mr__uk_drive(mr_uk_kind kind, const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y,
                  int64_t ldy, void *scratch, mr__uk_stage_fn stage);
void mr__uk_fill_generic(mr_kernels *k);
void mr__uk_fill_avx2(mr_kernels *k);
void mr__uk_fill_avx2vnni(mr_kernels *k); /* over mr__uk_fill_avx2 where k->flags hold AVX-VNNI */
void mr__dense_fill_avx2(mr_kernels *k); /* the level's: rows_f32, fp32 x on FMAs over the packs */
void mr__uk_fill_avx512(mr_kernels *k); /* needs AVX512 VNNI and VBMI too */
void mr__uk_fill_avx512bf16(mr_kernels *k); /* over it, where the flags hold AVX512-BF16 */
void mr__dense_fill_avx512(mr_kernels *k); /* the level's: rows_f32, fp32 x on FMAs over the packs */
void mr__dense_fill_avx512bf16(mr_kernels *k); /* with it: rows_x16, where vdpbf16ps runs at the FMA rate */
/* over those, where the flags hold AMX-TILE and AMX-BF16 and mr__amx_ready(): the FP8 kernel on tdpbf16ps */
void mr__uk_fill_avx512amx(mr_kernels *k);
void mr__dense_fill_avx512amx(mr_kernels *k); /* with it: the dense projections on tiles (rows_tiles) */
bool mr__amx_ready(void); /* Linux granted this process the AMX tile data state (asked once) */
double mr__probe_tdpbf16_amx(int64_t iters);
/* the read probe's loop (probe_avx2.c, AVX2): the 64-bit sum of n words, ymm loads with the kernels'
 * prefetch, each line's right before its loads; mr_probe_read_once and both x86 tables' uk_stream */
uint64_t mr__probe_read_avx2(const uint64_t *p, size_t n);
/* scalar decoders of the packed layouts (pack.c), every pack of the format:
 * E4M3 values of 128 k [128][16]; E2M1 values of 16-k block j [16][16] and
 * the 16 row scales; bf16 pairs g0..g0+ng-1 as [2*ng][16]. */
void mr__pk_fp8_block_f32(const mr_pmatrix *W, const uint8_t *tile, int64_t kb, float *out);
void mr__pk_nvfp4_block_f32(const mr_pmatrix *W, const uint8_t *tile, int64_t j, float *w, float *sc);
void mr__pk_bf16_pairs_f32(const uint8_t *tile, int64_t g0, int ng, float *out);

/* The row kernels' driver (kernels_avx2.c, kernels_avx512.c): rows
 * [n0, n0 + nr) of W for M tokens in chunks of 8 rows (n0 is a multiple of
 * 16 from mr_matmul, so a chunk stays inside one 128-row scale block), each
 * chunk for every group of up to max_mt tokens; a group of mt tokens takes
 * register blocks full[mt] of rows_of[mt] rows where the chunk is aligned to
 * them and blocks one[mt] of one row for the rest. */
typedef void (*mr__rows_block_fn)(const mr_qmatrix *W, int64_t n, const float *x, float *y, int64_t ldy);
static inline void mr__rows_drive(const mr_qmatrix *W, int64_t n0, int64_t nr, const float *x, int64_t M, float *y,
                                  int64_t ldy, int max_mt, const mr__rows_block_fn *full, const mr__rows_block_fn *one,
                                  const int *rows_of) {
    const int64_t K = W->cols;
    for (int64_t j = 0; j < nr; j += 8) {
        const int64_t rows = nr - j < 8 ? nr - j : 8;
        for (int64_t m0 = 0; m0 < M; m0 += max_mt) {
            const int mt = (int)(M - m0 < max_mt ? M - m0 : max_mt), R = rows_of[mt];
            const float *xm = x + m0 * K;
            float *ym = y + m0 * ldy + j;
            int64_t r = 0;
            if ((n0 + j) % R == 0)
                for (; r + R <= rows; r += R) full[mt](W, n0 + j + r, xm, ym + r, ldy);
            for (; r < rows; r++) one[mt](W, n0 + j + r, xm, ym + r, ldy);
        }
    }
}

/* The blocked dense forms (kernels_avx2.c, kernels_avx512.c) run a panel of rows over
 * every chunk of tokens before the next panel: tokens go to f in slices of about 512 KiB of
 * x (K fp32 columns each; a multiple of f's token chunk, at least one), so that a slice
 * stays in L2 while every panel runs over it (without slices, 512 tokens of x, 6 MB at K
 * 3072, streamed from L3 once per panel). A token's result does not depend on its slice. */
typedef void (*mr__rows_fn)(const mr_qmatrix *W, int64_t n0, int64_t nr, const float *x, int64_t M, float *y,
                            int64_t ldy);
static inline void mr__rows_sliced(mr__rows_fn f, int64_t chunk, const mr_qmatrix *W, int64_t n0, int64_t nr,
                                   const float *x, int64_t M, float *y, int64_t ldy) {
    const int64_t K = W->cols;
    int64_t mo = K > 0 ? ((int64_t)1 << 19) / (K * 4) / chunk * chunk : M;
    if (mo < chunk) mo = chunk;
    for (int64_t o0 = 0; o0 < M; o0 += mo) f(W, n0, nr, x + o0 * K, M - o0 < mo ? M - o0 : mo, y + o0 * ldy, ldy);
}

/* rows_f32's x (every x86 level's): tokens [m0, m1) of x [M][K] copied ldp apart, zero from K */
void mr__rows_f32_xpack(const float *x, int64_t K, int64_t ldp, int64_t m0, int64_t m1, float *xp);
/* a level's rows_f32 entries: fn on FP8 packed as p8 (name n8) and on BF16 as bf16_r16k2 (n16) */
static inline void mr__rows_f32_fill(mr_kernels *k, mr_kern_rows_tiles_fn fn, const char *n8, mr_pack_id p8,
                                     const char *n16) {
    k->rows_f32[MR_FMT_FP8_BLOCK].name = n8, k->rows_f32[MR_FMT_FP8_BLOCK].pack = p8;
    k->rows_f32[MR_FMT_BF16].name = n16, k->rows_f32[MR_FMT_BF16].pack = MR_PACK_BF16_R16K2;
    k->rows_f32[MR_FMT_FP8_BLOCK].fn = k->rows_f32[MR_FMT_BF16].fn = fn;
    k->rows_f32[MR_FMT_FP8_BLOCK].xpack = k->rows_f32[MR_FMT_BF16].xpack = mr__rows_f32_xpack;
}

/* The dense kernels on the expert packs (dense_avx512bf16.c rows_x16; rows_f32 of dense_avx512.c
 * and dense_avx2.c): rows [n0, n0 + nr) of P (n0 a multiple of 16) for M tokens of x packed eb bytes a value, P->Kp
 * apart, in token slices of about 512 KiB of x (at least mmin tokens; each slice stays in L2 over
 * the rows), one 16-row tile at a time by tile(P, t, x, M, y, ldy, scratch); a last tile past N
 * through a copy on the stack (M <= MR_MATMUL_CHUNK). */
typedef void (*mr__pk_tile_fn)(const mr_pmatrix *P, int64_t t, const void *x, int64_t M, float *y, int64_t ldy,
                               void *scratch);
static inline __attribute__((always_inline)) void mr__pk_rows(mr__pk_tile_fn tile, int64_t eb, int64_t mmin,
                                                              const mr_pmatrix *P, int64_t n0, int64_t nr,
                                                              const void *xp, int64_t M, float *y, int64_t ldy,
                                                              void *scratch) {
    int64_t mo = ((int64_t)1 << 19) / (P->Kp * eb);
    if (mo < mmin) mo = mmin;
    for (int64_t o0 = 0; o0 < M; o0 += mo) {
        const int64_t mc = M - o0 < mo ? M - o0 : mo;
        const char *x = (const char *)xp + o0 * P->Kp * eb;
        for (int64_t r = 0; r < nr; r += 16) {
            if (nr - r >= 16) {
                tile(P, (n0 + r) / 16, x, mc, y + o0 * ldy + r, ldy, scratch);
                continue;
            }
            float tmp[MR_MATMUL_CHUNK * 16] __attribute__((aligned(64))); /* a last tile past N */
            tile(P, (n0 + r) / 16, x, mc, tmp, 16, scratch);
            for (int64_t m = 0; m < mc; m++)
                memcpy(y + (o0 + m) * ldy + r, tmp + m * 16, (size_t)(nr - r) * sizeof(float));
        }
    }
}

#endif
