/* moerun/kernels.h — compute kernels: the dispatch table of micro-kernels
 * (generic C entries first, then AVX2 and AVX-512 overrides chosen once from
 * mr_cpu()->flags), the row-block GEMM driver built on them, and the dense
 * threaded matmul used by the model (projections, router gate, lm_head).
 *
 * Micro-kernel contracts (every entry, every ISA):
 * - decode(W, n, g, dst, gscale): writes the values of row n, columns
 *   [128g, min(128g+128, K)) of W into dst as fp32. F32/BF16: the stored
 *   values, *gscale = 1. FP8_BLOCK: the E4M3 codes decoded exactly, *gscale =
 *   the 128x128 block multiplier. NVFP4: e2m1(code) * e4m3(block scale),
 *   exact in fp32, *gscale = 1 (weight_scale_2 is applied by the driver).
 *   Does not read dst; len = min(128, K - 128g) values.
 * - dot_f32(w, x, len) / dot_bf16(w, xb, len): sum_i w[i] * x[i] in fp32
 *   (summation order is the kernel's own; products are exact for the inputs
 *   above except fp32 x fp32). len <= 128, any alignment.
 * Kernel names carry the ISA and the tile, e.g. "decode_fp8_block_avx512_16". */
#ifndef MOERUN_KERNELS_H
#define MOERUN_KERNELS_H

#include <stdint.h>

#include "moerun/base.h"
#include "moerun/formats.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MR_KGROUP 128 /* columns per decode group (the FP8 block width) */

/* ---- the ISA levels: one table (src/kernels/isa.c) ----
 * A level is the set of CPU features its kernel files are compiled for
 * (CMakeLists.txt: *_avx2.c and *_avx512.c) and the table fillers it adds:
 *   generic  no feature: the scalar C entries
 *   avx2     AVX2, FMA, F16C: the avx2 entries over generic
 *   avx512   the avx2 set + AVX-512 F, BW, VL, DQ, VNNI, VBMI: the avx512 entries
 *            (Ice Lake, Zen 4 and later; AVX512-BF16 is an extension the
 *            level takes where the CPU has it: vdpbf16ps instead of fp32 FMAs)
 * A CPU gets the highest level whose every feature it has (AVX-512F without
 * VNNI or VBMI, e.g. Skylake-SP or Cascade Lake, is avx2), and the table built
 * for it says that level, so the level the resolver names is the level whose
 * kernels run. */
typedef enum { MR_ISA_GENERIC = 0, MR_ISA_AVX2 = 1, MR_ISA_AVX512 = 2, MR_ISA_COUNT } mr_kernel_isa;
const char *mr_kernel_isa_name(mr_kernel_isa i); /* "generic", "avx2", "avx512"; "unknown" */
uint32_t mr_kernel_isa_features(mr_kernel_isa i); /* every feature the level needs */
mr_kernel_isa mr_kernel_isa_best(uint32_t cpu_flags); /* the highest level the flags hold */
/* The features a process running level i must not let kernels use: those of
 * the levels above, and (below the top) the rest of the AVX-512/AMX family. */
uint32_t mr_kernel_isa_above(mr_kernel_isa i);

typedef void (*mr_kern_decode_fn)(const mr_qmatrix *W, int64_t n, int64_t g, float *dst, float *gscale);
typedef float (*mr_kern_dot_f32_fn)(const float *w, const float *x, int len);
typedef float (*mr_kern_dot_bf16_fn)(const float *w, const uint16_t *x, int len);
/* The attention row kernels (model/ops.c mr__attention), over nr K or V rows
 * of D values of type kvt (MR_FMT_F32, MR_FMT_BF16, MR_FMT_E4M3 or
 * MR_FMT_E5M2: the KV cache's dtypes, each widened exactly to fp32; an FP8
 * NaN code stays NaN), ld values apart, for the G query heads
 * of one kv head (q, o [G][D]):
 *   attn_qk: s[g * lds + r] = q_g . k_r, a fixed order that depends on D
 *            only: 8 interleaved partial sums, then ((0+4) + (1+5)) + ((2+6) +
 *            (3+7)), then the D % 8 tail
 *   attn_pv: o[g][i] += p[g * ldp + r] * v_r[i], r = 0..nr-1 in order
 * A row's result does not depend on nr, G or where the rows live, so the
 * contiguous cache and the paged pool (any block split) give the same bits.
 * wk: scratch of MR_ATTN_WK_ROWS * D floats where kvt is not MR_FMT_F32 (a
 * kernel may widen rows there first), untouched otherwise. */
#define MR_ATTN_WK_ROWS 16
/* attn_softmax: s[j] = e_j / sum_i e_i, e_j = exp(s[j] * scale - m), m the
 * largest s[j] * scale (n >= 1), in an order that depends on n only; a NaN
 * score makes every output NaN. */
typedef void (*mr_kern_attn_softmax_fn)(float *s, int64_t n, float scale);
typedef void (*mr_kern_attn_qk_fn)(const float *q, int G, int D, const void *k, int64_t ldk, mr_format kvt,
                                   int nr, float *s, int64_t lds, float *wk);
typedef void (*mr_kern_attn_pv_fn)(const float *p, int64_t ldp, int G, int D, const void *v, int64_t ldv,
                                   mr_format kvt, int nr, float *o, float *wk);

/* ---- packed weight matrices (tile layouts, produced once at load) ----
 * A packed matrix holds nsrc source matrices of the same shape [src_rows][K]
 * cut into 16-row tiles and interleaved tile by tile: tile t holds rows
 * 16*(t/nsrc) .. +15 of source t%nsrc (nsrc = 2: gate tile, up tile, gate
 * tile, ... so one task reads one contiguous run). A tile's bytes are
 * contiguous; rows past src_rows and columns past K are zero codes (value 0).
 * Layouts (byte p of a 64-byte line; d = row in the tile):
 *  MR_PACK_FP8_R16K4   one line per 4 k: lane = p>>4, q = p&15,
 *                      d = 4*lane + ((q&7)>>1), k = 4g + 2*(q>>3) + (q&1);
 *                      K padded to 128; tscale [n_tiles][Kp/128] holds the
 *                      128x128 block multiplier of each tile's rows.
 *  MR_PACK_NVFP4_R16K16 per 16-k block j two lines L: low nibble of byte p =
 *                      code(d = p>>2, k = 16j + 8L + (p&3)), high nibble =
 *                      code(d, k + 4); after the Kp*8 code bytes the tile's
 *                      e4m3 scales [Kp/16][16]. (int8 kernels: w4a4, w4a8)
 *  MR_PACK_NVFP4_R16K16B the same but each line in bf16-pair order: nibble h
 *                      of byte p: lane = p>>4, q = p&15, d = 4*lane +
 *                      ((q&7)>>1), k = 16j + 2*(4L + 2h + (q>>3)) + (q&1).
 *                      (bf16 kernels: w4a16)
 *  MR_PACK_BF16_R16K2  one line per k pair g: dword d = (W[d][2g], W[d][2g+1]);
 *                      K padded to 2.
 * The ymm layouts of the AVX2 kernels (32-byte vectors V; q = byte in V):
 *  MR_PACK_FP8_Y16     one V per k pair g: q = 4i + j holds W[i + 8(j&1)][2g +
 *                      (j>>1)] (each byte of a dword a ymm of 8 rows in
 *                      order); K padded to 128, tscale as FP8_R16K4.
 *  MR_PACK_NVFP4_Y16I  per 16-k block j four V (v = 0..3): low nibble of q =
 *                      code(d = q>>2, k = 16j + 4v + (q&3)), high nibble =
 *                      code(d + 8, k): rows 0-7 / 8-15 x 4 k, row-major, so a
 *                      broadcast dword of 4 int8 activations meets every row
 *                      pair; scales as NVFP4_R16K16. (int8: w4a4, w4a8)
 *  MR_PACK_NVFP4_Y16F  per 16-k block j four V: nibble h of q = code(d, k) with
 *                      d = 8*((q>>3)&1) + 4*(q>>4) + ((q>>1)&3), k = 16j + 4v +
 *                      2h + (q&1); scales as NVFP4_R16K16. (bf16 input: w4a16)
 * The layouts and the AVX-512 kernels come from dev/perf (README there); the
 * table says which pack each of its kernels takes (mr_kernels.uk_pack). */
typedef enum {
    MR_PACK_NONE = 0,
    MR_PACK_FP8_R16K4 = 1,
    MR_PACK_NVFP4_R16K16 = 2,
    MR_PACK_NVFP4_R16K16B = 3,
    MR_PACK_BF16_R16K2 = 4,
    MR_PACK_FP8_Y16 = 5,
    MR_PACK_NVFP4_Y16I = 6,
    MR_PACK_NVFP4_Y16F = 7,
    MR_PACK_COUNT
} mr_pack_id;
#define MR_PACK_TILE 16 /* rows per tile, every pack */
#define MR_PACK_FP8_SUBNORMALS 8 /* mr_pmatrix.tsub: subnormal codes in a 16 x 128 block from here */

typedef struct mr_pmatrix {
    mr_pack_id pack;
    mr_format fmt;       /* the source format: FP8_BLOCK, NVFP4 or BF16 */
    int nsrc;            /* sources interleaved tile by tile (1 or 2) */
    int64_t src_rows, cols; /* rows of each source, K */
    int64_t Kp;          /* K padded to the pack's k unit (128, 16, 2) */
    int64_t n_tiles;     /* nsrc * ceil(src_rows / 16) */
    size_t tile_bytes;
    uint8_t *data;       /* n_tiles * tile_bytes, 64-byte aligned */
    float *tscale;       /* FP8: [n_tiles][Kp/128]; else NULL */
    float scale2;        /* NVFP4 weight_scale_2 (sources must share it); 1 otherwise */
    float input_scale;   /* max of the sources' input_scale (NVFP4 W4A4) */
    bool has_nan;        /* FP8: some code is a NaN (0x7F / 0xFF); kernels whose fast
                            decode does not give NaN take an exact path instead */
    uint8_t *tsub;       /* FP8: [n_tiles][Kp/128], 1 where the tile's 16 x 128 block holds
                            MR_PACK_FP8_SUBNORMALS or more E4M3 subnormal codes (exponent
                            0, mantissa not 0); else NULL. The AVX2 kernels' fast decode
                            hands such a code to an FMA as an fp32 subnormal, a microcode
                            assist of ~30 cycles on Intel cores: a marked block is decoded
                            without subnormals instead (slower; trained weights rarely
                            have more than one such code in a block) */
} mr_pmatrix;

/* Packs src[0..nsrc) (same format and shape) into `pack`; out owns its
 * buffers (mr_pmatrix_free). Clear errors for a format the pack does not
 * take, shapes that differ, NVFP4 sources with different scale2, overflow. */
mr_status mr_pmatrix_pack(mr_pmatrix *out, mr_pack_id pack, const mr_qmatrix *const *src, int nsrc);
void mr_pmatrix_free(mr_pmatrix *m);
mr_status mr_pmatrix_clone(const mr_pmatrix *src, mr_pmatrix *dst);
size_t mr_pmatrix_bytes(const mr_pmatrix *m); /* data + tile scales */
const char *mr_pack_name(mr_pack_id p);       /* "fp8_r16k4", ... */

/* ---- packed micro-kernels ----
 * Kinds (weight pack x kernel input):
 *  FP8_BF16   FP8_R16K4, x bf16 (w8a16: bf16(x); w8a8: the E4M3 codes as
 *             exact bf16), xs per 128-k block (w8a8: the 1x128 scale) or NULL;
 *  NVFP4_I8   NVFP4_R16K16, x int8 (w4a4: 2*e2m1 of the activation codes;
 *             w4a8: the int8 q), xb = -12 * sum of x over each 16-k block
 *             (AVX-512 uses weights biased to u8 by +12), xs per 16-k block;
 *  NVFP4_BF16 NVFP4_R16K16B, x bf16, xs per 16-k block or NULL;
 *  BF16_BF16  BF16_R16K2, x bf16;
 *  BF16_F32   BF16_R16K2, x fp32 (products rounded to fp32: FMA on widened weights).
 * Contract of every kernel (every ISA):
 *   y[m*ldy + d] = post * scale2 * sum_b xs[m][b] * wscale(d, b) * sum_{k in b} W[d][k] * x[m][k]
 * for one tile (d = 0..15, all 16 rows written, padded rows give 0), m in
 * [0, M), any M >= 1 (kernels loop over token blocks themselves), over the
 * whole Kp (x rows must hold Kp finite values, zeros past K). wscale is the
 * FP8 block multiplier or the NVFP4 e4m3 per-16 scale; the BF16 kinds have
 * neither (wscale = 1, xs is ignored). Products
 * are exact (except BF16_F32), sums are fp32 in the kernel's own order.
 * Writes y, never reads what was there before. No allocation. scratch: a
 * 64-byte aligned buffer of MR_UK_SCRATCH bytes, private to the caller's
 * thread. Two entries per kind: gemv (few tokens; streams the weights
 * once per block of 8 tokens) and gemm (many tokens; decodes a block of the
 * tile once into scratch in L1 and runs all tokens over it). */
typedef enum {
    MR_UK_FP8_BF16 = 0,
    MR_UK_NVFP4_I8,
    MR_UK_NVFP4_BF16,
    MR_UK_BF16_BF16,
    MR_UK_BF16_F32,
    MR_UK_COUNT
} mr_uk_kind;
#define MR_UK_SCRATCH 20480
#define MR_UK_PREFETCH 16384 /* bytes the kernels' software prefetch runs ahead of their loads */
#define MR_UK_MT 8 /* tokens per register block of the gemv kernels */

typedef struct {
    const void *x;      /* [M][ldx] in the kind's input type */
    int64_t ldx;        /* elements */
    const float *xs;    /* [M][ldxs] per-block multipliers, NULL = 1 */
    int64_t ldxs;
    const int32_t *xb;  /* NVFP4_I8 only: [M][ldb] */
    int64_t ldb;
    float post;         /* final multiplier (w4a4: the global input_scale) */
    int xs_group;       /* NVFP4_I8: xs[m][b] is equal over each run of xs_group blocks
                           starting at a multiple of it (w4a8: 8, one 128 group), so a
                           kernel may apply it once per run; 0 or 1 = no promise */
    const float *xw;    /* the bf16-input kinds (FP8_BF16, NVFP4_BF16, BF16_BF16): NULL, or
                           x widened to fp32 (exactly), [M][ldxw], Kp values a row; a
                           gemm kernel of a kind with uk_gemm_xw[kind] reads it instead of x
                           (same values, same bits out). A caller that runs one x over
                           many tiles widens it once instead of once per tile. */
    int64_t ldxw;
    const int16_t *xq;  /* NVFP4_BF16, where uk_gemv_xq[kind]: NULL, or x as 16-bit fixed point
                           per 16-k block (mr_kernels.xq_row) for the gemv: the high and low
                           parts [M][ldxq] each, the block multipliers [M][ldxqm]. The
                           gemv's block sums are then exact integers (two of them joined
                           in fp32 where a block has two parts, fp32 sums where it has no
                           such form): within the kernels' tolerance of the sums without
                           it, not the same bits. */
    const int16_t *xql;
    const float *xqm;
    int64_t ldxq, ldxqm;
    const float *xd;    /* FP8_BF16, where uk_xd[kind]: NULL, or x times 2^112 for the gemv and
                           the gemm (and uk_inv), [M][ldxd] fp32 (mr_uk_xd_row): each 128-k
                           block whose |x| are all below 2^16 holds x * 2^112 (exact), any
                           other block NaN in its first value (the kernel forms that block
                           from x, or from xw where given). A caller that runs one x over
                           many tiles scales it once instead of once per tile. The same
                           bits as without it. */
    int64_t ldxd;
} mr_uk_act;

/* One bf16 row as the FP8_BF16 gemv's scaled input (mr_uk_act.xd), n a
 * multiple of 128: block b holds x * 2^112 where every |x| of it is below
 * 2^16 (bf16 magnitude bits < 0x4780: no Inf or NaN either), else dst[128 b]
 * = NaN and the rest of the block is not written. */
void mr_uk_xd_row(const uint16_t *x, int64_t n, float *dst);

/* One bf16 row as 16-bit fixed point per block of 16 values (n a multiple
 * of 16), the NVFP4_BF16 gemv's integer input (mr_uk_act.xq). Block b with
 * largest exponent field F (Fb = max(F, 1)) and u = 2^(Fb - 141):
 *   one part:  x[i] = q[i] * u exactly for every i of the block (|q| < 2^15):
 *              m[b] = u, ql[i] = 0;
 *   two parts: else, where x[i] = (q[i] + ql[i] * 2^-15) * u exactly, q the
 *              part of x / u toward zero and |ql| < 2^15: m[b] = -u;
 *   none:      else, or where the block holds Inf or NaN, or where Fb < 45
 *              (every |x| below 2^-82) but some x is nonzero: m[b] = 0,
 *              q = ql = 0 (the kernel reads x).
 * An all-zero block gives q = ql = 0, m = 1. mr_uk_xq_row_ref is the
 * definition; the table's entry gives its bits. */
typedef void (*mr_kern_xq_row_fn)(const uint16_t *x, int64_t n, int16_t *q, int16_t *ql, float *m);
void mr_uk_xq_row_ref(const uint16_t *x, int64_t n, int16_t *q, int16_t *ql, float *m);

/* out[i] = silu(g[i]) * u[i] = g / (1 + exp(-g)) * u, i < n (within a few
 * ulp of the libm expf form; NaN in, NaN out). */
typedef void (*mr_kern_silu_mul_fn)(const float *g, const float *u, int64_t n, float *out);

typedef void (*mr_uk_fn)(const mr_pmatrix *W, int64_t tile, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                         void *scratch);
typedef struct {
    const char *name;
    mr_uk_fn fn;
} mr_uk_entry;

/* Dense row-major fast path for small M: y[m*ldy + j] = sum_g gscale(n, g) *
 * sum_{k in g} Wdec[n][k] * x[m*K + k], n = n0 + j, j < nr, m < M; W BF16
 * (widened exactly, fp32 FMA) or FP8_BLOCK (E4M3 decoded exactly, block
 * multiplier per 128 columns). n0 is a multiple of 16. Writes y, never
 * reads it. NULL where the ISA has none; mr_matmul then uses mr_gemm_rows. */
typedef void (*mr_kern_rows_fn)(const mr_qmatrix *W, int64_t n0, int64_t nr, const float *x, int64_t M, float *y,
                                int64_t ldy);

/* Dense on tiles (AMX-BF16: the AVX-512 table where the CPU has it and Linux
 * grants the tile state). W is packed once, as the expert kernels take it
 * (mr_qmatrix_tiles: the pack rows_tiles[fmt].pack); x [M][K] fp32 once per
 * matmul by rows_xpack: three bf16 parts (hi, mid, lo: truncations, their
 * sum exactly x away from underflow) as AMX A-tile rows, token i of a block
 * of 5, part p, the row 3 i + p; each 32-column chunk c of Kc = 4
 * ceil(K / 128) (zero past K) is a block's 3 tw rows of 64 bytes at
 * (5 b Kc + c tw) * 192 bytes, MR_XPACK_BYTES(M, K) in all. A last block of
 * fewer tokens takes tw = 5 (zero rows past M) where the kernel's slice of
 * tokens (its own, a multiple of 5) holds full blocks too, tw = M - 5 b where
 * it is alone in its slice. rows_xpack packs the blocks [b0, b1). rows_tiles[fmt].fn computes the
 * rows [n0, n0 + nr) of the pack (n0 a multiple of 16) over the packed x for
 * M tokens, the contract of mr_kern_rows_fn otherwise (exact products, fp32
 * sums in AMX's order, the FP8 block multiplier per 128 columns), with
 * MR_UK_SCRATCH bytes of the calling thread's own. One kernel for every M:
 * a token's bits do not depend on the tokens beside it. */
#define MR_XPACK_BYTES(M, K) ((size_t)(((M) + 4) / 5 * 5) * (size_t)(((K) + 127) / 128 * 4) * 192u)
/* The one-part pack (rows_xpack1, for rows_tiles' fn1): where every value of x is a finite bf16
 * (its fp32 low 16 bits zero), the bf16 values themselves, token blocks of 16 (of M where M < 16)
 * as A-tile rows, one row a token; chunk c of block b at (16 b Kc + c w) * 64 bytes, w the block
 * width (16, the last block padded with zero rows, or M < 16); rows_xpack1 packs the blocks
 * [b0, b1). fn1 gives such a token the bits fn gives it, at every M (mr_matmul takes it for a call
 * whose whole x is such values). Never larger than MR_XPACK_BYTES. */
#define MR_XPACK1_BYTES(M, K) ((size_t)((M) < 16 ? (M) : ((M) + 15) / 16 * 16) * (size_t)(((K) + 127) / 128 * 4) * 64u)
typedef void (*mr_kern_xpack_fn)(const float *x, int64_t M, int64_t K, int64_t b0, int64_t b1, void *xp);
typedef void (*mr_kern_rows_tiles_fn)(const mr_pmatrix *P, int64_t n0, int64_t nr, const void *xp, int64_t M,
                                      float *y, int64_t ldy, void *scratch);
/* Dense on bf16 pair dots (vdpbf16ps: the AVX-512 table with AVX512-BF16 where it issues at the
 * vfmadd231ps rate, as on Zen 4) for matrices whose inputs are bf16 values (mr_qmatrix.x_bf16:
 * --dense-activation-dtype bf16), K a multiple of 64. W is packed once, as the expert kernels take it
 * (mr_qmatrix_tiles: the pack rows_x16[fmt].pack, in place of the row-major copy). rows_x16[fmt].xpack
 * writes the tokens [m0, m1) of x [M][K] as bf16 (each value rounded to nearest even: a bf16 value
 * stays itself) at xp + m0 ldp, each token ldp (the pack's Kp) apart, zero from K. fn computes the rows
 * [n0, n0 + nr) of the pack (n0 a multiple of 16) for M tokens of that x into y, the contract of
 * mr_kern_rows_fn otherwise (exact products, fp32 sums; vdpbf16ps takes fp32 denormals as zero), with
 * MR_UK_SCRATCH bytes of the calling thread's own. One sum order for every M: a token's bits do not
 * depend on the tokens beside it. */
typedef void (*mr_kern_x16pack_fn)(const float *x, int64_t K, int64_t ldp, int64_t m0, int64_t m1, uint16_t *xp);
/* Dense on fp32 x and vfmadd231ps over the expert packs (the AVX2 table; the AVX-512 table
 * without AMX, for the matrices rows_x16 does not take: fp32 inputs, the default), K a multiple of
 * 64: mr_qmatrix_tiles packs W as rows_f32[fmt].pack in place of the row-major copy;
 * rows_f32[fmt].xpack copies tokens [m0, m1) of x to xp + m0 ldp, ldp (the pack's Kp) apart, zero
 * from K; fn as rows_x16's fn on that x (exact products, fp32 sums, the FP8 block multiplier per
 * 128 columns). One sum order for every M: a token's bits do not depend on the tokens beside it. */
typedef void (*mr_kern_x32pack_fn)(const float *x, int64_t K, int64_t ldp, int64_t m0, int64_t m1, float *xp);


/* The instruction a kernel's inner loop runs (the ceilings' probes, below):
 * vfmadd231ps (ymm or zmm, by the table's ISA), vdpbf16ps zmm, vpdpbusd zmm,
 * vpmaddubsw ymm, vpdpbusd ymm (AVX-VNNI, VEX-encoded: the AVX2 table's int8
 * kernel where the CPU has it), tdpbf16ps (AMX-BF16: 16x16 fp32 outputs over
 * 32 bf16 k an instruction). */
typedef enum {
    MR_PROBE_FMA = 0,
    MR_PROBE_DPBF16 = 1,
    MR_PROBE_DPBUSD = 2,
    MR_PROBE_MADDUBS = 3,
    MR_PROBE_DPBUSD_YMM = 4,
    MR_PROBE_TDPBF16 = 5 /* AMX-BF16 tdpbf16ps (the AVX-512 table's FP8 kernel where the CPU has it) */
} mr_probe_instr;
/* true for the integer instructions (their rate is counted in G OP/s, not GFLOP/s) */
bool mr_probe_instr_is_int(mr_probe_instr which);

typedef struct {
    mr_kernel_isa level; /* the level the table was built for (mr_kernel_isa_best of the flags) */
    const char *isa;     /* its name */
    uint32_t flags;      /* the CPU features it was built from: a level's filler may take an
                            extension of its own ISA that no level requires (AVX-VNNI on the
                            AVX2 level, AVX512-BF16 and AMX on the AVX-512 one) where these hold
                            it; results are the same within the kernels' fp32 sum order (the
                            integer ones and the BF16 pair dots away from denormals: the same
                            bits; AMX: its own order) */
    struct {
        const char *name;
        mr_kern_decode_fn fn;
    } decode[MR_FMT_COUNT]; /* F32, BF16, FP8_BLOCK, NVFP4 filled; others NULL */
    struct {
        const char *name;
        mr_kern_dot_f32_fn fn;
    } dot_f32;
    struct {
        const char *name;
        mr_kern_dot_bf16_fn fn;
    } dot_bf16;
    mr_uk_entry uk_gemv[MR_UK_COUNT], uk_gemm[MR_UK_COUNT];
    mr_uk_entry uk_inv[MR_UK_COUNT]; /* per kind, the level's batch-invariant kernel: token m of a call of M
                              tokens gets the bits that a call of that token alone gives, whatever M
                              (the gemv and gemm entries may give a lone token more accumulator
                              chains, or sum in another order, than a token among many). The same
                              pack and input as uk_gemm, and it reads mr_uk_act.xw (in place of x) at
                              every token count where uk_gemm_xw says the gemm does. tests/test_kernels.c
                              checks it on every table. */
    bool batch_invariant; /* mr_kernels_batch_invariant made this table */
    int uk_gemm_min_m; /* use uk_gemm at this many tokens per expert and above */
    bool uk_gemm_xw[MR_UK_COUNT]; /* per bf16-input kind: its gemm kernel reads mr_uk_act.xw
                                     (the fp32 FMA ones, which would otherwise widen x per tile) */
    bool uk_gemv_xq[MR_UK_COUNT]; /* its gemv kernel takes mr_uk_act.xq (NVFP4_BF16 on AVX2) */
    bool uk_xd[MR_UK_COUNT]; /* its gemv and gemm kernels take mr_uk_act.xd (FP8_BF16 on AVX2) */
    struct {
        const char *name;
        mr_kern_xq_row_fn fn;
    } xq_row;
    mr_pack_id uk_pack[MR_UK_COUNT];       /* the pack each kind's kernels take */
    mr_probe_instr uk_instr[MR_UK_COUNT];  /* the instruction of their inner loop */
    struct {
        const char *name;
        mr_kern_silu_mul_fn fn;
    } silu_mul; /* the SwiGLU epilogue of the MoE GEMM1 */
    struct {
        const char *name;
        mr_kern_attn_qk_fn fn;
    } attn_qk;
    struct {
        const char *name;
        mr_kern_attn_pv_fn fn;
    } attn_pv;
    struct {
        const char *name;
        mr_kern_attn_softmax_fn fn;
    } attn_softmax;
    struct {
        const char *name;
        mr_uk_fn fn;
    } uk_stream; /* benchmark isolation: reads the whole tile as the kernels do (loads
                    and prefetch), writes y = 0 for the M tokens, computes nothing */
    struct {
        const char *name;
        mr_kern_rows_fn fn;
    } rows[MR_FMT_COUNT]; /* dense row-major fast path (BF16, FP8_BLOCK), NULL if none */
    struct {
        const char *name;
        mr_kern_rows_tiles_fn fn;
        mr_kern_rows_tiles_fn fn1; /* the same on x packed by rows_xpack1 (set with fn) */
        mr_pack_id pack;
    } rows_tiles[MR_FMT_COUNT]; /* dense on tiles (BF16, FP8_BLOCK), NULL if none: mr_matmul takes it
                                   for matrices packed by mr_qmatrix_tiles */
    struct {
        const char *name;
        mr_kern_rows_tiles_fn fn;
        mr_kern_x16pack_fn xpack;
        mr_pack_id pack;
    } rows_x16[MR_FMT_COUNT]; /* dense on bf16 pair dots (BF16, FP8_BLOCK), NULL if none: mr_matmul takes
                                 it for matrices marked x_bf16 and packed by mr_qmatrix_tiles */
    struct {
        const char *name;
        mr_kern_rows_tiles_fn fn;
        mr_kern_x32pack_fn xpack;
        mr_pack_id pack;
    } rows_f32[MR_FMT_COUNT]; /* dense on fp32 FMAs over the packs (BF16, FP8_BLOCK), NULL if none:
                                 mr_matmul takes it for the matrices mr_qmatrix_tiles packed for it */
    mr_kern_xpack_fn rows_xpack;  /* x for rows_tiles' fn, set with it */
    mr_kern_xpack_fn rows_xpack1; /* x for rows_tiles' fn1, set with it */
} mr_kernels;



/* The process-wide table of the current mode (mr_kernels_set_batch_invariant), built on first
 * use from mr_cpu()->flags. */
const mr_kernels *mr_kernels_get(void);
/* A table's batch-invariant form (sglang's --enable-deterministic-inference, vLLM's
 * VLLM_BATCH_INVARIANT): every expert call of every kind takes uk_inv at every token count
 * (uk_gemv = uk_gemm = uk_inv, uk_gemm_min_m 1, no fixed-point gemv input), so a token's MoE
 * output does not depend on how many tokens share its expert, hence on the batch, the chunking of
 * its prompt or a prefix-cache hit. The rest of the table already has that property and stays:
 * the dense rows and tiles kernels (kernels.c, mr_matmul), attention (model/ops.c). */
void mr_kernels_batch_invariant(mr_kernels *k);
/* The process table's mode from now on: false (the default) the fastest kernels, true the
 * batch-invariant form. A MoE context keeps the table it was made with (moe/ctx.c), so set
 * the mode before a model is opened (mr_exec_apply does). */
void mr_kernels_set_batch_invariant(bool on);
/* Builds a table for a given feature set (tests compare ISAs with it). */
void mr_kernels_init(mr_kernels *k, uint32_t cpu_flags);

/* Row-block GEMM, single-threaded:
 *   y[m*ldy + j] = post * sum_g gscale(n,g) * xs[m*ldxs + g] * sum_{i in g} Wdec[n][i] * x[m*ldx + i]
 * for j in [0, nr), n = n0 + j, m in [0, M); post = weight_scale_2 for NVFP4,
 * else 1; xs may be NULL (all 1). x is F32 or BF16 (xdt). Writes y, never reads it. */
void mr_gemm_rows(const mr_kernels *k, const mr_qmatrix *W, int64_t n0, int64_t nr, mr_format xdt, const void *x,
                  int64_t ldx, const float *xs, int64_t ldxs, int64_t M, float *y, int64_t ldy);

/* Dense matmul, threaded: y[M][N] = x[M][K] . W^T for W in F32, BF16,
 * FP8_BLOCK or NVFP4 (weight-only: activations stay fp32). */
void mr_matmul(const mr_qmatrix *W, const float *x, int64_t M, float *y);
/* Where the process's table has a dense path on tiles for W's format
 * (rows_tiles), or W is marked x_bf16 (set it first) and the table has bf16
 * pair dots for its format (rows_x16, W->cols % 64 == 0), or else the table
 * has fp32 FMAs on a pack (rows_f32, W->cols % 64 == 0), packs W into *store
 * (which the caller owns: mr_pmatrix_free, after W's last matmul) and points
 * W->tiles at it; mr_matmul then takes that path for W. Elsewhere leaves
 * W->tiles NULL and *store empty. MR_ENOMEM (W unchanged) if the pack cannot
 * be allocated. */
mr_status mr_qmatrix_tiles(mr_qmatrix *W, mr_pmatrix *store);
/* n matmuls sharing x (all W[i] with the same K): y[i][M][W[i]->rows] =
 * x[M][K] . W[i]^T, the same values as n mr_matmul calls, in one parallel
 * region when the small-M fast path applies (q/k/v projections at decode). */
void mr_matmul_multi(int n, const mr_qmatrix *const *W, const float *x, int64_t M, float *const *y);
/* The same with a caller's workspace for the dense path on tiles (x packed,
 * per-thread scratch), so that the call does not allocate: ws 64-byte
 * aligned, of ws_bytes; one smaller than mr_matmul_ws_bytes(M, K, the team's
 * threads), or NULL, is replaced by an allocation for the call.
 * mr_matmul_ws_bytes is 0 where the process's table has no such path. */
size_t mr_matmul_ws_bytes(int64_t M, int64_t K, int threads);
#define MR_MATMUL_CHUNK 320 /* tokens a dense matmul takes at once (so the workspace is bounded) */
void mr_matmul_multi_ws(int n, const mr_qmatrix *const *W, const float *x, int64_t M, float *const *y, void *ws,
                        size_t ws_bytes);

/* ---- ceilings for benchmarks (probe.c) ---- */
/* Best-of-reps multi-threaded read bandwidth over a pre-faulted buffer of
 * `bytes`, in GB/s (1e9 bytes/s), under the same conditions as the packed
 * weights: 2 MiB-aligned with transparent huge pages asked for, and (AVX2 and
 * AVX-512 tables) the kernels' software prefetch 16 KiB ahead, one a line,
 * with ymm loads in the order that reads fastest (zmm loads, or both lines'
 * prefetches first, read 15-20% less on some hosts: bench/README.md). 0 if
 * the buffer cannot be allocated. */
double mr_probe_read_bw(size_t bytes, int reps);
/* The same probe in two steps, for runs that interleave it with other work:
 * a pre-faulted buffer (free with mr_aligned_free; NULL if out of memory)
 * and one timed pass over it, GB/s. */
uint64_t *mr_probe_buf_new(size_t bytes);
double mr_probe_read_once(const uint64_t *buf, size_t bytes);
/* Peak GFLOP/s of the instruction the kernels' inner loop uses (FP32 FMA of
 * the chosen ISA), all threads; *instr names it. 0 for the generic table. */
double mr_probe_peak_gflops(const char **instr);
/* Peak rate of one instruction, all threads, 12 independent accumulator
 * chains, best of 3: G ops/s counting 2 per multiply-add (vfmadd231ps zmm:
 * 32 per instruction, vdpbf16ps zmm: 64, vpdpbusd zmm: 128; ymm forms for
 * AVX2: vfmadd231ps ymm 16, vpmaddubsw ymm 64). *instr names it. 0 if the
 * table's ISA lacks it. */
double mr_probe_peak(mr_probe_instr which, const char **instr);
/* One timed pass of the same probe over `iters` iterations (12 instructions
 * each, per thread): for benchmarks that sample the compute the host gives
 * between calls (a busy sibling hyperthread on the host shows here). 0 if the
 * table's ISA lacks the instruction. */
double mr_probe_peak_once(mr_probe_instr which, int64_t iters);
/* The instruction the packed kernel of a kind runs in its inner loop on the
 * process table's ISA. */
mr_probe_instr mr_uk_instr(mr_uk_kind kind);

#ifdef __cplusplus
}
#endif
#endif
