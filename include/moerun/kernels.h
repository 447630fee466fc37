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

typedef void (*mr_kern_decode_fn)(const mr_qmatrix *W, int64_t n, int64_t g, float *dst, float *gscale);
typedef float (*mr_kern_dot_f32_fn)(const float *w, const float *x, int len);
typedef float (*mr_kern_dot_bf16_fn)(const float *w, const uint16_t *x, int len);

typedef struct {
    const char *isa; /* "generic", "avx2", "avx512": the best level that filled any entry */
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
} mr_kernels;

/* The process-wide table, built on first use from mr_cpu()->flags. */
const mr_kernels *mr_kernels_get(void);
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

/* ---- ceilings for benchmarks (probe.c) ---- */
/* Best-of-reps multi-threaded read bandwidth over a pre-faulted buffer of
 * `bytes`, in GB/s (1e9 bytes/s). 0 if the buffer cannot be allocated. */
double mr_probe_read_bw(size_t bytes, int reps);
/* Peak GFLOP/s of the instruction the kernels' inner loop uses (FP32 FMA of
 * the chosen ISA), all threads; *instr names it. 0 for the generic table. */
double mr_probe_peak_gflops(const char **instr);

#ifdef __cplusplus
}
#endif
#endif
