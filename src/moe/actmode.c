/* actmode.c — the exact definition of every activation mode: how a row of
 * fp32 activations (the expert input x, or the intermediate h = silu(g)*u)
 * becomes what the GEMM consumes. Documented in docs/activation-modes.md.
 *
 *  mode    weights    kernel input          per-128-group scale    value the GEMM sees
 *  w16a32  bf16       fp32 x                1                      x
 *  w16a16  bf16       bf16(x) (RNE)         1                      bf16(x)
 *  w8a8    fp8_block  e4m3 code, as bf16    s = max(amax,1e-10)/448 e4m3(clamp(x/s,±448)) * s
 *                     (exact: E4M3 ⊂ bf16)  (formats/ 1x128 quantizer, as the GPU kernels)
 *  w8a16   fp8_block  bf16(x)               1                      bf16(x)
 *  w4a4    nvfp4      e2m1(q)*e4m3(sc) as   input_scale (global,   e2m1(q)*e4m3(sc)*input_scale
 *                     bf16 (exact: <= 6     max over experts)      (formats/ W4A4 quantizer, vLLM IEEE ref)
 *                     significant bits)
 *  w4a8    nvfp4      int8 q as bf16        s = max(amax,1e-10)/127 q = clamp(rne(x/s), ±127); q * s
 *                     (exact: |q| <= 127)   per token per 128 group
 *  w4a16   nvfp4      bf16(x)               1                      bf16(x)
 *
 * Both GEMMs use the same mode: GEMM1 on x, GEMM2 on h. Accumulation is fp32;
 * the outputs are rounded to the activation dtype at the very end. */
#include <math.h>
#include <string.h>

#include "moe/moe_internal.h"

mr_format mr__act_kernel_dtype(mr_act_mode m) { return m == MR_ACT_W16A32 ? MR_FMT_F32 : MR_FMT_BF16; }

static inline uint16_t bf16_exact(float v) { return mr_f32_to_bf16(v); }

/* w4a8: symmetric int8 of one group */
static void int8_group(const float *x, int64_t n, float *q, float *s) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    float sc = fmaxf(amax, 1e-10f) / 127.0f;
    for (int64_t i = 0; i < n; i++) {
        float v = nearbyintf(x[i] / sc); /* default rounding mode: half to even */
        q[i] = fminf(fmaxf(v, -127.0f), 127.0f);
    }
    *s = sc;
}

/* Shared body: fills vals (the kernel-input values as fp32) and scales. */
static void prepare_values(mr_act_mode m, const float *x, int64_t n, float input_scale, float *vals, float *scales) {
    int64_t G = (n + 127) / 128;
    switch (m) {
    case MR_ACT_W16A32:
        memcpy(vals, x, (size_t)n * sizeof(float));
        for (int64_t g = 0; g < G; g++) scales[g] = 1.0f;
        break;
    case MR_ACT_W16A16:
    case MR_ACT_W8A16:
    case MR_ACT_W4A16:
        for (int64_t i = 0; i < n; i++) vals[i] = mr_bf16_to_f32(mr_f32_to_bf16(x[i]));
        for (int64_t g = 0; g < G; g++) scales[g] = 1.0f;
        break;
    case MR_ACT_W8A8:
        for (int64_t g = 0; g < G; g++) {
            int64_t len = n - g * 128 < 128 ? n - g * 128 : 128;
            uint8_t q[128];
            mr_fp8_act_quantize_row_ref(x + g * 128, len, q, &scales[g]);
            for (int64_t i = 0; i < len; i++) vals[g * 128 + i] = mr_e4m3_to_f32(q[i]);
        }
        break;
    case MR_ACT_W4A4:
        for (int64_t g = 0; g < G; g++) {
            int64_t len = n - g * 128 < 128 ? n - g * 128 : 128; /* n % 16 == 0 */
            uint8_t q[64], sc[8];
            mr_nvfp4_act_quantize_row_ref(x + g * 128, len, input_scale, q, sc);
            mr_nvfp4_act_dequant_row_ref(q, sc, len, 1.0f, vals + g * 128);
            scales[g] = input_scale;
        }
        break;
    case MR_ACT_W4A8:
        for (int64_t g = 0; g < G; g++) {
            int64_t len = n - g * 128 < 128 ? n - g * 128 : 128;
            int8_group(x + g * 128, len, vals + g * 128, &scales[g]);
        }
        break;
    default: MR_ASSERT(!"activation mode");
    }
}

void mr__act_prepare_row(mr_act_mode m, const float *x, int64_t n, float input_scale, void *dst, float *scales) {
    if (mr__act_kernel_dtype(m) == MR_FMT_F32) {
        prepare_values(m, x, n, input_scale, (float *)dst, scales);
        return;
    }
    /* values are exact in bf16 for every bf16-input mode (see table) */
    uint16_t *d = (uint16_t *)dst;
    float vals[128];
    for (int64_t c = 0; c < n; c += 128) {
        int64_t len = n - c < 128 ? n - c : 128;
        prepare_values(m, x + c, len, input_scale, vals, &scales[c / 128]);
        for (int64_t i = 0; i < len; i++) d[c + i] = bf16_exact(vals[i]);
    }
}

/* ---- kernel input of the packed micro-kernels (moerun/kernels.h) ----
 * The same values as mr__act_prepare_row, in the form the packed kernels
 * take: fp32 / bf16 rows as above (xs = the per-128 scales: w8a8's s, else
 * 1); NVFP4 int8 modes as int8 x with per-16 multipliers xs and the bias
 * sums xb = -12 * sum of x over each 16 (see the NVFP4_I8 kernel):
 *   w4a4: x = 2*e2m1(q) (exact), xs = e4m3(sc)/2 (exact), post = input_scale
 *         => the GEMM sees e2m1(q) * e4m3(sc) * input_scale, as defined above;
 *   w4a8: x = q, xs = s of its 128 group (replicated per 16), post = 1. */
mr_uk_kind mr__act_uk_kind(mr_act_mode m) {
    switch (m) {
    case MR_ACT_W16A32: return MR_UK_BF16_F32;
    case MR_ACT_W16A16: return MR_UK_BF16_BF16;
    case MR_ACT_W8A8:
    case MR_ACT_W8A16: return MR_UK_FP8_BF16;
    case MR_ACT_W4A4:
    case MR_ACT_W4A8: return MR_UK_NVFP4_I8;
    default: return MR_UK_NVFP4_BF16;
    }
}

mr_uk_kind mr_act_mode_uk_kind(mr_act_mode m) { return mr__act_uk_kind(m); }

int mr__act_uk_esize(mr_act_mode m) {
    switch (mr__act_uk_kind(m)) {
    case MR_UK_BF16_F32: return 4;
    case MR_UK_NVFP4_I8: return 1;
    default: return 2;
    }
}

int mr__act_uk_block(mr_act_mode m) {
    switch (mr__act_uk_kind(m)) {
    case MR_UK_FP8_BF16: return 128;
    case MR_UK_NVFP4_I8:
    case MR_UK_NVFP4_BF16: return 16;
    default: return 0; /* no per-block multiplier */
    }
}

static void i8_finish(const float *qv, int64_t len, int8_t *d, int32_t *xb) {
    for (int64_t b = 0; b < len / 16; b++) {
        int32_t s = 0;
        for (int i = 0; i < 16; i++) {
            d[b * 16 + i] = (int8_t)qv[b * 16 + i];
            s += d[b * 16 + i];
        }
        xb[b] = -12 * s;
    }
}

/* the AVX-512 forms run where the kernel table runs the AVX-512 level (kernels/isa.c) */
static bool simd512(void) { return mr_kernels_get()->level == MR_ISA_AVX512; }

void mr__act_prepare_uk_row(mr_act_mode m, const float *x, int64_t n, float input_scale, void *dst, float *xs,
                            int32_t *xb) {
    if (simd512()) { /* the same values, bit for bit (actq_avx512.c) */
        switch (m) {
        case MR_ACT_W16A16:
        case MR_ACT_W8A16:
        case MR_ACT_W4A16:
            mr__actq_bf16_avx512(x, n, dst);
            for (int64_t g = 0; g < (n + 127) / 128; g++) xs[g] = 1.0f;
            return;
        case MR_ACT_W8A8: mr__actq_fp8_avx512(x, n, dst, xs); return;
        case MR_ACT_W4A4: mr__actq_w4a4_avx512(x, n, input_scale, dst, xs, xb); return;
        case MR_ACT_W4A8: mr__actq_w4a8_avx512(x, n, dst, xs, xb); return;
        default: break;
        }
    }
    if (mr__act_uk_kind(m) != MR_UK_NVFP4_I8) {
        mr__act_prepare_row(m, x, n, input_scale, dst, xs); /* xs: ceil(n/128) scales */
        return;
    }
    int8_t *d = dst;
    for (int64_t c = 0; c < n; c += 128) {
        const int64_t len = n - c < 128 ? n - c : 128; /* n % 16 == 0 (nvfp4) */
        float qv[128];
        if (m == MR_ACT_W4A4) {
            uint8_t q[64], sc[8];
            mr_nvfp4_act_quantize_row_ref(x + c, len, input_scale, q, sc);
            for (int64_t i = 0; i < len; i++) qv[i] = 2.0f * mr_e2m1_to_f32((uint8_t)((q[i / 2] >> (4 * (i & 1))) & 15));
            for (int64_t b = 0; b < len / 16; b++) xs[c / 16 + b] = 0.5f * mr_e4m3_to_f32(sc[b]);
        } else {
            float s;
            int8_group(x + c, len, qv, &s);
            for (int64_t b = 0; b < len / 16; b++) xs[c / 16 + b] = s;
        }
        i8_finish(qv, len, d + c, xb + c / 16);
    }
}

void mr__act_effective_row(mr_act_mode m, const float *x, int64_t n, float input_scale, float *dst) {
    float vals[128], s;
    for (int64_t c = 0; c < n; c += 128) {
        int64_t len = n - c < 128 ? n - c : 128;
        prepare_values(m, x + c, len, input_scale, vals, &s);
        for (int64_t i = 0; i < len; i++) dst[c + i] = vals[i] * s;
    }
}

float mr__silu(float x) { return x / (1.0f + expf(-x)); }
