/* dev/perf/kern.h — candidate MoE expert micro-kernels (research):
 * the packed weight layouts, their generic-C packers (kern_pack.c) and the
 * AVX-512 micro-kernels (kern_*_avx512.c). Not part of the CMake build; the
 * winners are meant to move into src/kernels/ with their contracts.
 *
 * Common contract of every micro-kernel here ("r16" = 16-row tile):
 * - One call computes one tile of 16 consecutive output rows n0..n0+15 of
 *   y = W x^T for M tokens (1 <= M <= MR_PK_MT), over the whole K.
 * - W is packed per tile: a tile's bytes are contiguous (tile stride given by
 *   the *_tile_bytes() helpers); N is padded to 16 by the packer (zero rows),
 *   K is padded to the format's k unit (128 FP8, 16 NVFP4, 2 bf16) with zeros.
 * - Activations are per token, already in the kernel's input form (below),
 *   with row stride ldx elements (>= padded K).
 * - y[m*ldy + r] = result for token m, row n0+r (r < 16): written, never read.
 *   The kernel writes all 16 rows; the caller ignores padded ones.
 * - No allocation, no globals written; reads only its arguments. Any
 *   alignment of x/y; the packed weights must be 64-byte aligned.
 */
#ifndef MR_DEV_KERN_H
#define MR_DEV_KERN_H

#include <stddef.h>
#include <stdint.h>

#define MR_PK_MT 8 /* max tokens per micro-kernel call; callers loop over token blocks */

/* Software prefetch of the weight stream, MR_PK_PFD bytes ahead, into L2
 * (_MM_HINT_T2). Measured (README): without it, or with T0, one core keeps too
 * few misses in flight on the nvfp4 stream (~11 GB/s/thread); 16 KiB ahead into
 * L2 gives >= 90% of read bandwidth. Prefetching past the end of a matrix is
 * harmless (no fault). Used by the *_avx512.c kernels (they include immintrin.h). */
#ifndef MR_PK_PFD
#define MR_PK_PFD 16384
#endif
#ifndef MR_PK_PFH
#define MR_PK_PFH _MM_HINT_T2
#endif
#define MR_PK_PF(p)                                                                                                \
    do {                                                                                                           \
        if (MR_PK_PFD) _mm_prefetch((const char *)(p) + MR_PK_PFD, MR_PK_PFH);                                     \
    } while (0)

/* ---------------- FP8 block (E4M3 + f32 per 128x128) ----------------
 * Layout "fp8_r16k4": for tile t (rows 16t..16t+15) and k-group g (k = 4g..4g+3)
 * one 64-byte line; byte p holds W[16t + d][4g + kk] with
 *   lane = p>>4, q = p&15, d = 4*lane + ((q&7)>>1), kk = 2*(q>>3) + (q&1).
 * (This is the order that vpunpck{l,h}bw of the two LUT byte planes turns into
 * two zmm of 16 rows x bf16 pairs (k0,k1) and (k2,k3).) Lines are ordered by g
 * inside a tile. K padded to 128. Scales: the original f32 [ceil(N/128)][Kp/128]
 * multiplier grid; the kernel reads row bs[kb] of the tile's 128-row block. */
size_t mr_pk_fp8_tile_bytes(int64_t Kp);
/* w: e4m3 [N][K] row-major, sc: f32 [ceil(N/128)][ceil(K/128)]. dst: ceil(N/16)
 * tiles; dsc: [ceil(N/128)][Kp/128] (copied). Kp = K rounded up to 128. */
void mr_pk_fp8_pack(const uint8_t *w, const float *sc, int64_t N, int64_t K, uint8_t *dst, float *dsc);

/* w8a16 / w8a8: x is bf16 (u16) [M][ldx]; the exact bf16 values of the
 * activation (w8a8: the decoded E4M3 codes, exact in bf16).
 * xs: optional per-token per-128-block multiplier [M][ldxs] (w8a8: the 1x128
 * activation scale), NULL = 1. bs: the tile's row of block scales [Kp/128].
 * Variant 1: E4M3 -> bf16 by two 128-entry vpermi2b byte LUTs, vdpbf16ps.  */
void mr_pk_fp8_r16_bf16_avx512(const uint8_t *tile, const float *bs, int64_t Kp, const uint16_t *x, int64_t ldx,
                               const float *xs, int64_t ldxs, int M, float *y, int64_t ldy);
/* Variant 2 (same layout, same inputs but x as f32): E4M3 -> f16 bit trick ->
 * vcvtph2ps -> vfmadd231ps. The line's 4 k are de-interleaved with vpermb. */
void mr_pk_fp8_r16_f32_avx512(const uint8_t *tile, const float *bs, int64_t Kp, const float *x, int64_t ldx,
                              const float *xs, int64_t ldxs, int M, float *y, int64_t ldy);
/* Prefill variant 3: decodes one 128-k block of the tile into a caller
 * buffer of 16x128 bf16 (4 KiB, 64-aligned) once, then runs all M (any M) tokens over it in
 * blocks of up to MR_PK_MT. Same result contract; M unbounded. */
void mr_pk_fp8_r16_gemm_bf16_avx512(const uint8_t *tile, const float *bs, int64_t Kp, const uint16_t *x,
                                    int64_t ldx, const float *xs, int64_t ldxs, int M, float *y, int64_t ldy,
                                    uint16_t *buf /* [64][32] */);

/* ---------------- NVFP4 (E2M1 + E4M3 per 16 + f32 per tensor) ----------------
 * Layout "nvfp4_r16k16": for tile t and 16-k block j two 64-byte lines
 * L = 0, 1; byte p of line L holds, low nibble: code(row 16t + (p>>2), k = 16j + 8L + (p&3)),
 * high nibble: code(row 16t + (p>>2), k = 16j + 8L + 4 + (p&3)).
 * After the block's 2*Kp/16 lines (= Kp*8 bytes) come the tile's scales: [Kp/16][16]
 * e4m3 (16 rows of block j contiguous). Tile bytes = 16*Kp/2 + 16*Kp/16.
 * (For the int8 kernel each nibble plane is one zmm of 16 dword lanes = 16 rows x 4 k.) */
size_t mr_pk_nvfp4_tile_bytes(int64_t Kp);
/* w: packed e2m1 [N][K/2], sc: e4m3 [N][K/16]. K % 16 == 0. */
void mr_pk_nvfp4_pack(const uint8_t *w, const uint8_t *sc, int64_t N, int64_t K, uint8_t *dst);

/* int8 kernel (w4a8, and w4a4 exactly): weights as u8 (2*e2m1 + 12) by vpshufb,
 * vpdpbusd against signed int8 activations broadcast 4 at a time.
 * xq: int8 [M][ldx] (w4a4: 2*e2m1 of the activation codes, exact);
 * xb: int32 [M][ldb]: -12 * sum of xq over block j (the u8 bias correction);
 * xs: optional f32 [M][ldxs] per-16-block activation multiplier (w4a4: decoded
 *     e4m3 activation scale), NULL = 1;
 * post[m]: final multiplier. Result = post[m] * 2^7 * sum_j dec(sc)*2^-8 ... i.e.
 *   y = post[m] * sum_j e4m3(s_nj) * xs[m][j] * sum_k (2 e2m1(w)) xq / 2.
 * (The kernel folds the 1/2 and the 2^8 of its f16-trick scale decode itself.) */
void mr_pk_nvfp4_r16_i8_avx512(const uint8_t *tile, int64_t Kp, const int8_t *xq, int64_t ldx, const int32_t *xb,
                               int64_t ldb, const float *xs, int64_t ldxs, const float *post, int M, float *y,
                               int64_t ldy);
/* bf16 kernel (w4a16): E2M1 -> bf16 by two vpshufb byte LUTs + vpunpck, vdpbf16ps
 * per 16-k block, block result times the decoded scale (and xs) into f32.
 * Uses its own layout "nvfp4_r16k16b": like nvfp4_r16k16 but the byte order of
 * each line is the bf16-pair order: byte p of line L, nibble h (0 low, 1 high):
 *   lane = p>>4, q = p&15, d = 4*lane + ((q&7)>>1), u = q>>3, e = q&1,
 *   row d, k = 16j + 2*(4L + 2h + u) + e. */
void mr_pk_nvfp4b_pack(const uint8_t *w, const uint8_t *sc, int64_t N, int64_t K, uint8_t *dst);
void mr_pk_nvfp4_r16_bf16_avx512(const uint8_t *tile, int64_t Kp, const uint16_t *x, int64_t ldx, const float *xs,
                                 int64_t ldxs, const float *post, int M, float *y, int64_t ldy);

/* ---------------- bf16 weights ----------------
 * Layout "bf16_r16k2": per tile, per k pair g: 64 bytes = 16 dwords, dword d =
 * (W[16t+d][2g], W[16t+d][2g+1]). K padded to 2. */
size_t mr_pk_bf16_tile_bytes(int64_t Kp);
void mr_pk_bf16_pack(const uint16_t *w, int64_t N, int64_t K, uint8_t *dst);
/* x: bf16 [M][ldx]. */
void mr_pk_bf16_r16_avx512(const uint8_t *tile, int64_t Kp, const uint16_t *x, int64_t ldx, int M, float *y,
                           int64_t ldy);

#endif
