/* formats_internal.h — private helpers shared by the formats/ sources:
 * the E2M1 value table, fixed constants of the NVFP4 and FP8-block formats,
 * and the element row converters used by the traits table. */
#ifndef MR_FORMATS_INTERNAL_H
#define MR_FORMATS_INTERNAL_H

#include <stdint.h>

#include "moerun/formats.h"

/* E2M1 nibble -> value, codes 0..15 (8 is -0). */
extern const float mr__e2m1_values[16];

#define MR__E2M1_MAX 6.0f
#define MR__E4M3_MAX 448.0f
#define MR__NVFP4_BLOCK 16
#define MR__FP8_BLOCK 128

/* Row converters of the element formats (traits.c). */
void mr__f32_quantize_row(const float *src, void *dst, int64_t n);
void mr__f32_dequantize_row(const void *src, float *dst, int64_t n);
void mr__bf16_quantize_row(const float *src, void *dst, int64_t n);
void mr__bf16_dequantize_row(const void *src, float *dst, int64_t n);

/* Composite weight formats (fp8_block.c, nvfp4.c). Inputs are validated by
 * mr_qmatrix_quantize: finite weights, positive dims, cols % 16 for NVFP4. */
void mr__fp8_block_quantize(const float *w, int64_t rows, int64_t cols, uint8_t *q, float *scale_inv);
void mr__fp8_block_dequant_row(const uint8_t *q, const float *scale_inv, int64_t rows, int64_t cols, int64_t r,
                               float *dst);
void mr__nvfp4_quantize(const float *w, int64_t rows, int64_t cols, float ws2, uint8_t *q, uint8_t *sc);
void mr__nvfp4_dequant_row(const uint8_t *q, const uint8_t *sc, float ws2, int64_t cols, int64_t r, float *dst);

#endif
