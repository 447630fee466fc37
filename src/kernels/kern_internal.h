/* kern_internal.h — private to src/kernels: the per-ISA table fillers and
 * the decode lookup tables shared by the generic and ISA files. */
#ifndef MR_KERN_INTERNAL_H
#define MR_KERN_INTERNAL_H

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
typedef void (*mr__uk_stage_fn)(const float *w /* [nk][16] */, const float *x /* [nk] */, int nk, float *acc /* [16] */);
void mr__uk_drive(mr_uk_kind kind, const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y,
                  int64_t ldy, void *scratch, mr__uk_stage_fn stage);
void mr__uk_fill_generic(mr_kernels *k);
void mr__uk_fill_avx2(mr_kernels *k);
void mr__uk_fill_avx512(mr_kernels *k); /* needs AVX512 BF16, VNNI and VBMI too */
/* scalar decoders of the packed layouts (pack.c): E4M3 values of 128 k
 * [128][16]; E2M1 values of 16-k block j [16][16] and the 16 row scales; bf16
 * pairs g0..g0+ng-1 as [2*ng][16]. */
void mr__pk_fp8_block_f32(const uint8_t *tile, int64_t kb, float *out);
void mr__pk_nvfp4_block_f32(const mr_pmatrix *W, const uint8_t *tile, int64_t j, float *w, float *sc);
void mr__pk_bf16_pairs_f32(const uint8_t *tile, int64_t g0, int ng, float *out);

#endif
