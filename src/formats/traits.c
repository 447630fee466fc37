/* traits.c — the format traits table (one row per mr_format, designated
 * initializers, ggml type_traits style), the element-format row converters,
 * and name lookup with aliases. Adding a format (e.g. MXFP4 with an E8M0
 * scale per 32) means one enum value, one row here and one source file. */
#include <ctype.h>
#include <string.h>

#include "formats/formats_internal.h"
#include "moerun/formats.h"

/* ---- row converters of the element formats ---- */
void mr__f32_quantize_row(const float *src, void *dst, int64_t n) {
    if (n > 0) memcpy(dst, src, (size_t)n * sizeof(float));
}
void mr__f32_dequantize_row(const void *src, float *dst, int64_t n) {
    if (n > 0) memcpy(dst, src, (size_t)n * sizeof(float));
}

void mr__bf16_quantize_row(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = mr_f32_to_bf16(src[i]);
}
void mr__bf16_dequantize_row(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = mr_bf16_to_f32(s[i]);
}

static void f16_quantize_row(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = mr_f32_to_f16(src[i]);
}
static void f16_dequantize_row(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = mr_f16_to_f32(s[i]);
}

static void e4m3_quantize_row(const float *src, void *dst, int64_t n) {
    uint8_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = mr_f32_to_e4m3(src[i]);
}
static void e4m3_dequantize_row(const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = mr_e4m3_to_f32(s[i]);
}

static void e5m2_quantize_row(const float *src, void *dst, int64_t n) {
    uint8_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = mr_f32_to_e5m2(src[i]);
}
static void e5m2_dequantize_row(const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = mr_e5m2_to_f32(s[i]);
}

/* Packed: byte i = element 2i (low nibble) | element 2i+1 (high nibble).
 * With n odd, the high nibble of the last byte is 0. */
static void e2m1_quantize_row(const float *src, void *dst, int64_t n) {
    uint8_t *d = dst;
    for (int64_t i = 0; i + 1 < n; i += 2)
        d[i / 2] = (uint8_t)(mr_f32_to_e2m1(src[i]) | (mr_f32_to_e2m1(src[i + 1]) << 4));
    if (n & 1) d[n / 2] = mr_f32_to_e2m1(src[n - 1]);
}
static void e2m1_dequantize_row(const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = mr__e2m1_values[(s[i / 2] >> (4 * (i & 1))) & 0xFu];
}

static const mr_format_traits traits[MR_FMT_COUNT] = {
    [MR_FMT_F32] = {.fmt = MR_FMT_F32, .name = "f32", .st_dtype = "F32", .block_size = 1, .bytes_per_block = 4,
                    .is_weight_format = true, .quantize_row_ref = mr__f32_quantize_row,
                    .dequantize_row_ref = mr__f32_dequantize_row, .n_tensors = 1,
                    .tensors = {{"weight", MR_FT_DATA, "F32", 4, 2, 1, 1, false}}},
    [MR_FMT_F16] = {.fmt = MR_FMT_F16, .name = "f16", .st_dtype = "F16", .block_size = 1, .bytes_per_block = 2,
                    .quantize_row_ref = f16_quantize_row, .dequantize_row_ref = f16_dequantize_row},
    [MR_FMT_BF16] = {.fmt = MR_FMT_BF16, .name = "bf16", .st_dtype = "BF16", .block_size = 1, .bytes_per_block = 2,
                     .is_weight_format = true, .quantize_row_ref = mr__bf16_quantize_row,
                     .dequantize_row_ref = mr__bf16_dequantize_row, .n_tensors = 1,
                     .tensors = {{"weight", MR_FT_DATA, "BF16", 2, 2, 1, 1, false}}},
    [MR_FMT_E4M3] = {.fmt = MR_FMT_E4M3, .name = "e4m3", .st_dtype = "F8_E4M3", .block_size = 1,
                     .bytes_per_block = 1, .quantize_row_ref = e4m3_quantize_row,
                     .dequantize_row_ref = e4m3_dequantize_row},
    [MR_FMT_E5M2] = {.fmt = MR_FMT_E5M2, .name = "e5m2", .st_dtype = "F8_E5M2", .block_size = 1,
                     .bytes_per_block = 1, .quantize_row_ref = e5m2_quantize_row,
                     .dequantize_row_ref = e5m2_dequantize_row},
    /* No safetensors dtype of its own: checkpoints store packed E2M1 as U8. */
    [MR_FMT_E2M1] = {.fmt = MR_FMT_E2M1, .name = "e2m1", .st_dtype = "U8", .block_size = 2, .bytes_per_block = 1,
                     .quantize_row_ref = e2m1_quantize_row, .dequantize_row_ref = e2m1_dequantize_row},
    [MR_FMT_NVFP4] = {.fmt = MR_FMT_NVFP4, .name = "nvfp4", .st_dtype = "U8", .block_size = MR__NVFP4_BLOCK,
                      .bytes_per_block = MR__NVFP4_BLOCK / 2, .scale_rows = 1, .scale_cols = MR__NVFP4_BLOCK,
                      .is_weight_format = true, .n_tensors = 4,
                      .tensors = {{"weight", MR_FT_DATA, "U8", 1, 2, 1, 2, false},
                                  {"weight_scale", MR_FT_SCALE, "F8_E4M3", 1, 2, 1, MR__NVFP4_BLOCK, false},
                                  {"weight_scale_2", MR_FT_SCALE2, "F32", 4, 0, 1, 1, false},
                                  {"input_scale", MR_FT_INPUT_SCALE, "F32", 4, 0, 1, 1, true}}},
    [MR_FMT_FP8_BLOCK] = {.fmt = MR_FMT_FP8_BLOCK, .name = "fp8_block", .st_dtype = "F8_E4M3",
                          .block_size = MR__FP8_BLOCK, .bytes_per_block = MR__FP8_BLOCK,
                          .scale_rows = MR__FP8_BLOCK, .scale_cols = MR__FP8_BLOCK, .is_weight_format = true,
                          .n_tensors = 2,
                          .tensors = {{"weight", MR_FT_DATA, "F8_E4M3", 1, 2, 1, 1, false},
                                      {"weight_scale_inv", MR_FT_SCALE, "F32", 4, 2, MR__FP8_BLOCK, MR__FP8_BLOCK,
                                       false}}},
};

const mr_format_traits *mr_format_traits_get(mr_format f) {
    if ((int)f < 0 || f >= MR_FMT_COUNT) return NULL;
    return &traits[f];
}

const mr_format_tensor *mr_format_tensor_find(mr_format f, mr_ft_role r) {
    const mr_format_traits *t = mr_format_traits_get(f);
    for (int i = 0; t && i < t->n_tensors; i++)
        if (t->tensors[i].role == r) return &t->tensors[i];
    return NULL;
}

int mr_format_tensor_shape(const mr_format_tensor *t, int64_t N, int64_t K, int64_t shape[2]) {
    if (t->ndim == 0) return 0;
    shape[0] = (N + t->row_div - 1) / t->row_div;
    shape[1] = (K + t->col_div - 1) / t->col_div;
    return 2;
}

bool mr_format_tensor_bytes(const mr_format_tensor *t, int64_t N, int64_t K, size_t *bytes) {
    int64_t sh[2] = {1, 1};
    int nd = mr_format_tensor_shape(t, N, K, sh);
    size_t n = 1;
    for (int i = 0; i < nd; i++)
        if (sh[i] < 0 || !mr_size_mul(n, (size_t)sh[i], &n)) return false;
    return mr_size_mul(n, (size_t)t->elem_bytes, bytes);
}

/* Aliases, compared after lower-casing and mapping '-' to '_'. */
static const struct {
    const char *alias;
    mr_format fmt;
} aliases[] = {
    {"float32", MR_FMT_F32},        {"fp32", MR_FMT_F32},           {"float", MR_FMT_F32},
    {"float16", MR_FMT_F16},        {"fp16", MR_FMT_F16},           {"half", MR_FMT_F16},
    {"bfloat16", MR_FMT_BF16},      {"f8_e4m3", MR_FMT_E4M3},       {"e4m3fn", MR_FMT_E4M3},
    {"float8_e4m3fn", MR_FMT_E4M3}, {"fp8_e4m3", MR_FMT_E4M3},      {"f8_e5m2", MR_FMT_E5M2},
    {"float8_e5m2", MR_FMT_E5M2},   {"fp8_e5m2", MR_FMT_E5M2},      {"float4_e2m1fn", MR_FMT_E2M1},
    {"fp4_e2m1", MR_FMT_E2M1},      {"e2m1fn", MR_FMT_E2M1},        {"fp4", MR_FMT_NVFP4},
    {"modelopt_fp4", MR_FMT_NVFP4}, {"fp8", MR_FMT_FP8_BLOCK},      {"fp8_block128", MR_FMT_FP8_BLOCK},
    {"fp8_blockwise", MR_FMT_FP8_BLOCK},
};

mr_status mr_format_from_name(const char *name, mr_format *out) {
    char buf[32];
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n >= sizeof buf) goto unknown;
    for (size_t i = 0; i <= n; i++) {
        char c = (char)tolower((unsigned char)name[i]);
        buf[i] = c == '-' ? '_' : c;
    }
    for (int f = 0; f < MR_FMT_COUNT; f++) {
        if (!strcmp(buf, traits[f].name)) {
            *out = (mr_format)f;
            return MR_OK;
        }
    }
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
        if (!strcmp(buf, aliases[i].alias)) {
            *out = aliases[i].fmt;
            return MR_OK;
        }
    }
unknown:
    return mr_error_set(MR_EINVAL,
                        "unknown format '%s'; valid: f32, f16, bf16, e4m3, e5m2, e2m1, nvfp4 (fp4), "
                        "fp8_block (fp8)",
                        name ? name : "(null)");
}
