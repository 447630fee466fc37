/* moerun/formats.h — numeric formats: scalar conversions, the traits table,
 * quantized weight matrices (FP8 block-scaled, NVFP4, bf16) and the
 * activation quantizers. Reference semantics: shared/spec/formats.md.
 *
 * Everything here is the scalar reference ("_ref"); SIMD paths live in
 * kernels/ and are tested against these functions. */
#ifndef MOERUN_FORMATS_H
#define MOERUN_FORMATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moerun/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Stable numeric ids: never renumber, append only. */
typedef enum {
    MR_FMT_F32 = 0,
    MR_FMT_F16 = 1,
    MR_FMT_BF16 = 2,
    MR_FMT_E4M3 = 3,      /* FP8 E4M3FN, safetensors F8_E4M3 */
    MR_FMT_E5M2 = 4,      /* FP8 E5M2, safetensors F8_E5M2 */
    MR_FMT_E2M1 = 5,      /* FP4 element, two per byte (low nibble first) */
    MR_FMT_NVFP4 = 6,     /* E2M1 codes + E4M3 scale per 16 + f32 tensor scale (ModelOpt) */
    MR_FMT_FP8_BLOCK = 7, /* E4M3 + f32 multiplier per 128x128 block (DeepSeek-V3/MiniMax-M2) */
    MR_FMT_COUNT
} mr_format;

/* ---- scalar conversions (bit-exact per spec/formats.md) ---- */
uint16_t mr_f32_to_bf16(float x); /* RNE; any NaN -> 0x7FC0 */
float mr_bf16_to_f32(uint16_t b);
uint16_t mr_f32_to_f16(float x); /* IEEE binary16, RNE, overflow -> inf */
float mr_f16_to_f32(uint16_t h);
uint8_t mr_f32_to_e4m3(float x); /* RNE, non-saturating: |x| > 464 -> NaN (sign kept) */
float mr_e4m3_to_f32(uint8_t b);
uint8_t mr_f32_to_e5m2(float x); /* RNE, IEEE overflow to inf */
float mr_e5m2_to_f32(uint8_t b);
/* Saturating, as the KV cache stores FP8 (vLLM's and sglang's cast with a
 * scale of 1): RNE of x clamped to the largest finite value (+-448, +-57344;
 * an infinity too), a NaN stays NaN. */
uint8_t mr_f32_to_e4m3_sat(float x);
uint8_t mr_f32_to_e5m2_sat(float x);
uint8_t mr_f32_to_e2m1(float x); /* nibble 0..15, RNE, saturating at 6; sign from input; NaN -> ±6 */
float mr_e2m1_to_f32(uint8_t nibble);

/* The KV cache's element types (--kv-cache-dtype): MR_FMT_F32, MR_FMT_BF16
 * (RNE), MR_FMT_E4M3 and MR_FMT_E5M2 (the saturating conversions above).
 * mr_kv_elem_bytes: 4, 2, 1, 1, and 0 for any other format;
 * mr_kv_dtype_name: "fp32", "bf16", "fp8_e4m3", "fp8_e5m2" (the option's
 * values), NULL for any other format. */
size_t mr_kv_elem_bytes(mr_format kv_dtype);
const char *mr_kv_dtype_name(mr_format kv_dtype);

struct mr_pmatrix;

/* ---- quantized weight matrix [rows=N out][cols=K in] ---- */
typedef struct {
    mr_format fmt;      /* F32, BF16, FP8_BLOCK or NVFP4 */
    int64_t rows, cols; /* N, K */
    void *data;         /* F32 [N][K] f32 | BF16 [N][K] u16 | FP8_BLOCK [N][K] e4m3 | NVFP4 [N][K/2] packed e2m1 */
    void *scale;        /* FP8_BLOCK: f32 [ceil(N/128)][ceil(K/128)] (multiplier, "weight_scale_inv")
                           NVFP4: e4m3 [N][K/16] ("weight_scale"); otherwise NULL */
    float scale2;       /* NVFP4 "weight_scale_2" = amax/2688; 1 otherwise */
    float input_scale;  /* NVFP4 "input_scale" = activation amax/2688; 0 = not calibrated */
    bool owned;         /* data/scale were allocated by this module (mr_qmatrix_free frees them) */
    const struct mr_pmatrix *tiles; /* NULL, or W packed for the kernel table's dense path on tiles
                                       (kernels.h mr_qmatrix_tiles; not owned) */
    bool x_bf16;        /* the caller gives mr_matmul inputs of bf16 values (--dense-activation-dtype
                           bf16): it may take the table's path for them (kernels.h rows_x16) */
} mr_qmatrix;

/* Quantizes w [rows][cols] (fp32) into fmt with the reference algorithm.
 * shared_amax: for NVFP4, the amax used for scale2 when several Linears share
 * it (w1/w3, q/k/v); pass 0 to use this matrix's own amax. Ignored otherwise.
 * NVFP4 needs cols % 16 == 0. On success out owns its buffers. */
mr_status mr_qmatrix_quantize(mr_qmatrix *out, mr_format fmt, const float *w, int64_t rows, int64_t cols,
                              float shared_amax);
/* An owned, zero-filled [rows][cols] matrix in a weight format fmt (its
 * data and scale buffers sized by the traits, 64-byte aligned; scale2 1);
 * MR_EINVAL for nvfp4 with cols % 16, MR_ENOMEM with the sizes. */
mr_status mr_qmatrix_alloc(mr_qmatrix *m, mr_format fmt, int64_t rows, int64_t cols);
/* Dequantizes row r into dst [cols] (fp32, exact products of the stored values). */
void mr_qmatrix_dequant_row(const mr_qmatrix *m, int64_t r, float *dst);
/* Bytes of data + scales; of the data alone; of the scales alone. */
size_t mr_qmatrix_bytes(const mr_qmatrix *m);
size_t mr_qmatrix_data_bytes(const mr_qmatrix *m);
size_t mr_qmatrix_scale_bytes(const mr_qmatrix *m);
void mr_qmatrix_free(mr_qmatrix *m); /* frees owned buffers; safe on zeroed structs */

/* ---- activation quantizers (reference) ---- */
/* FP8 dynamic 1x128 groups: s = max(amax,1e-10)/448 per group; q = e4m3(clamp(x/s, ±448)).
 * q [n], scales [ceil(n/128)]. The last group may be shorter than 128. */
void mr_fp8_act_quantize_row_ref(const float *x, int64_t n, uint8_t *q, float *scales);
/* NVFP4 W4A4 (vLLM IEEE reference): gs = 1/input_scale; per 16: vmax, sc = e4m3(min(gs*(vmax*(1/6)), 448)),
 * p = decode(sc)*(1/gs), os = p != 0 ? 1/p : 0, q = e2m1(x*os). q [n/2] packed, sc [n/16]. n % 16 == 0.
 * input_scale 0 gives gs = 0 and all codes ±0. */
void mr_nvfp4_act_quantize_row_ref(const float *x, int64_t n, float input_scale, uint8_t *q, uint8_t *sc);
/* Value the W4A4 GEMM sees for quantized activations: e2m1(q) * (decode(sc) * input_scale). */
void mr_nvfp4_act_dequant_row_ref(const uint8_t *q, const uint8_t *sc, int64_t n, float input_scale, float *dst);

/* ---- what a weight format stores in a checkpoint ----
 * A weight [N][K] of format f is the tensors "<module>.<suffix>" listed in
 * its traits (spec/formats.md, the HF/ModelOpt names):
 *   f32        weight F32 [N][K]
 *   bf16       weight BF16 [N][K]
 *   fp8_block  weight F8_E4M3 [N][K], weight_scale_inv F32 [ceil(N/128)][ceil(K/128)]
 *   nvfp4      weight U8 [N][K/2] (two E2M1 codes a byte), weight_scale F8_E4M3
 *              [N][K/16], weight_scale_2 F32 [], input_scale F32 [] (optional)
 * The loader, the resolver's header check, quantize (and so gen-tiny) and
 * the mr_qmatrix buffer sizes all read this list. */
typedef enum {
    MR_FT_DATA = 0,        /* -> mr_qmatrix.data */
    MR_FT_SCALE = 1,       /* -> mr_qmatrix.scale */
    MR_FT_SCALE2 = 2,      /* scalar -> mr_qmatrix.scale2 */
    MR_FT_INPUT_SCALE = 3  /* scalar -> mr_qmatrix.input_scale */
} mr_ft_role;
typedef struct {
    const char *suffix;   /* "weight", "weight_scale_inv", ... */
    mr_ft_role role;
    const char *st_dtype; /* its safetensors dtype ("F8_E4M3", "F32", "U8", "BF16") */
    int elem_bytes;       /* bytes of one stored element (also the alignment an in-place use needs) */
    int ndim;             /* 2, or 0 for a scalar */
    int row_div, col_div; /* shape [ceil(N / row_div)][ceil(K / col_div)] */
    bool optional;        /* may be absent (the loader has a fallback) */
} mr_format_tensor;
#define MR_FORMAT_MAX_TENSORS 4

/* ---- traits table, indexed by mr_format ---- */
typedef struct {
    mr_format fmt;
    const char *name;     /* "f32", "f16", "bf16", "e4m3", "e5m2", "e2m1", "nvfp4", "fp8_block" */
    const char *st_dtype; /* safetensors dtype of the data tensor ("F8_E4M3", "U8"...), NULL if none */
    int block_size;       /* elements per block along a row (1 for scalar formats, 2 for e2m1, 16 nvfp4, 128 fp8_block) */
    int bytes_per_block;  /* data bytes per block, scales excluded */
    int scale_rows, scale_cols; /* weight-scale granularity (128x128, 1x16), 0 if none */
    bool is_weight_format;      /* usable as mr_qmatrix.fmt */
    /* Element formats: convert n values. NULL for composite formats. */
    void (*quantize_row_ref)(const float *src, void *dst, int64_t n);
    void (*dequantize_row_ref)(const void *src, float *dst, int64_t n);
    /* weight formats: the tensors one weight stores (above), data first */
    int n_tensors;
    mr_format_tensor tensors[MR_FORMAT_MAX_TENSORS];
} mr_format_traits;

const mr_format_traits *mr_format_traits_get(mr_format f); /* NULL if out of range */
/* The tensor of role r that format f stores, NULL if none. */
const mr_format_tensor *mr_format_tensor_find(mr_format f, mr_ft_role r);
/* Its shape for a [N][K] weight (shape[0..ndim)); returns ndim. */
int mr_format_tensor_shape(const mr_format_tensor *t, int64_t N, int64_t K, int64_t shape[2]);
/* Its bytes for a [N][K] weight; false on overflow. */
bool mr_format_tensor_bytes(const mr_format_tensor *t, int64_t N, int64_t K, size_t *bytes);
/* The data and scale buffer bytes of a [rows][cols] mr_qmatrix in fmt (the
 * DATA and SCALE tensors); MR_EOVERFLOW / MR_EUNSUPPORTED with detail. */
mr_status mr_qmatrix_sizes(mr_format fmt, int64_t rows, int64_t cols, size_t *data, size_t *scale);
/* Looks a format up by its name ("bf16", "fp8", "fp8_block", "nvfp4", ...). */
mr_status mr_format_from_name(const char *name, mr_format *out);

#ifdef __cplusplus
}
#endif
#endif
