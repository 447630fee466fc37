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

void mr__kernels_fill_generic(mr_kernels *k);
void mr__kernels_fill_avx2(mr_kernels *k);   /* kernels_avx2.c */
void mr__kernels_fill_avx512(mr_kernels *k); /* kernels_avx512.c */

#endif
