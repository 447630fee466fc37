/* nvfp4.c — NVFP4 (NVIDIA ModelOpt) weights and the W4A4 activation
 * quantizer.
 *
 * Layout of a quantized [N][K] weight, K % 16 == 0:
 *   data   u8    [N][K/2]   E2M1 codes, element 2i in the low nibble of byte i
 *   scale  e4m3  [N][K/16]  per-16 block multiplier ("weight_scale")
 *   scale2 f32   scalar     amax/2688 ("weight_scale_2"), 2688 = 6*448
 *   W[n][k] = e2m1(code) * (e4m3(scale[n][k/16]) * scale2)
 * The dequantization order is ModelOpt's: the block multiplier
 * d = e4m3 * scale2 is rounded once, then e2m1 * d.
 *
 * Quantization follows ModelOpt 0.47 (NVFP4QTensor.quantize, fp32 IEEE):
 *   ws2 = amax/2688;  t = block_amax/(6*ws2);  t = 1 if t == 0;
 *   sc = e4m3(clamp(t, 2^-9, 448));  d = decode(sc)*ws2;  code = e2m1(w/d).
 * The clamp is ModelOpt's (_cast_per_block_scale_to_fp8); it keeps a block
 * whose amax is tiny next to the tensor's from getting a zero scale. Two
 * cases ModelOpt leaves undefined are defined here: an all-zero tensor
 * (ws2 = 0: scales 1.0, codes ±0) and d == 0 after underflow (codes ±0). */
#include <math.h>

#include "formats/formats_internal.h"
#include "moerun/formats.h"

static inline uint8_t zero_code(float x) { return signbit(x) ? 0x8 : 0x0; }

void mr__nvfp4_quantize(const float *w, int64_t rows, int64_t cols, float ws2, uint8_t *q, uint8_t *sc) {
    const int64_t nb = cols / MR__NVFP4_BLOCK;
    const float six_ws2 = MR__E2M1_MAX * ws2;
#pragma omp parallel for schedule(static) if (rows * cols >= (1 << 20))
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < nb; j++) {
            const float *blk = w + r * cols + j * MR__NVFP4_BLOCK;
            uint8_t *qb = q + r * (cols / 2) + j * (MR__NVFP4_BLOCK / 2);
            float bmax = 0.0f;
            for (int i = 0; i < MR__NVFP4_BLOCK; i++) {
                float a = fabsf(blk[i]);
                if (a > bmax) bmax = a;
            }
            float t = bmax / six_ws2;
            if (t == 0.0f || isnan(t)) t = 1.0f; /* NaN only for 0/0: the all-zero tensor */
            if (t < 0x1p-9f) t = 0x1p-9f;
            if (t > MR__E4M3_MAX) t = MR__E4M3_MAX;
            const uint8_t s = mr_f32_to_e4m3(t);
            sc[r * nb + j] = s;
            const float d = mr_e4m3_to_f32(s) * ws2;
            for (int i = 0; i < MR__NVFP4_BLOCK; i += 2) {
                uint8_t lo = d != 0.0f ? mr_f32_to_e2m1(blk[i] / d) : zero_code(blk[i]);
                uint8_t hi = d != 0.0f ? mr_f32_to_e2m1(blk[i + 1] / d) : zero_code(blk[i + 1]);
                qb[i / 2] = (uint8_t)(lo | (hi << 4));
            }
        }
    }
}

void mr__nvfp4_dequant_row(const uint8_t *q, const uint8_t *sc, float ws2, int64_t cols, int64_t r, float *dst) {
    const int64_t nb = cols / MR__NVFP4_BLOCK;
    const uint8_t *qrow = q + r * (cols / 2);
    const uint8_t *srow = sc + r * nb;
    for (int64_t j = 0; j < nb; j++) {
        const float d = mr_e4m3_to_f32(srow[j]) * ws2;
        for (int i = 0; i < MR__NVFP4_BLOCK; i++) {
            const int64_t k = j * MR__NVFP4_BLOCK + i;
            dst[k] = mr__e2m1_values[(qrow[k / 2] >> (4 * (k & 1))) & 0xFu] * d;
        }
    }
}

/* W4A4 activation quantizer, vLLM's IEEE reference (ref_nvfp4_quant):
 *   gs = 1/input_scale (0 if input_scale == 0)
 *   per 16: vmax = max|x|; sc = e4m3(min(gs * (vmax * (1/6)), 448))
 *           p = decode(sc) * (1/gs); os = p != 0 ? 1/p : 0; q = e2m1(x * os)
 * The os guard tests p (as vLLM's get_reciprocal does), not vmax: a block
 * whose scale rounds to zero gets codes ±0 instead of x*inf. */
void mr_nvfp4_act_quantize_row_ref(const float *x, int64_t n, float input_scale, uint8_t *q, uint8_t *sc) {
    const float gs = input_scale != 0.0f ? 1.0f / input_scale : 0.0f;
    const float inv_gs = gs != 0.0f ? 1.0f / gs : 0.0f;
    const float sixth = 1.0f / 6.0f;
    for (int64_t j = 0; j < n / MR__NVFP4_BLOCK; j++) {
        const float *blk = x + j * MR__NVFP4_BLOCK;
        float vmax = 0.0f;
        for (int i = 0; i < MR__NVFP4_BLOCK; i++) {
            float a = fabsf(blk[i]);
            if (a > vmax || isnan(a)) vmax = isnan(vmax) ? vmax : a;
        }
        float s = gs * (vmax * sixth);
        if (s > MR__E4M3_MAX) s = MR__E4M3_MAX;
        const uint8_t e = mr_f32_to_e4m3(s);
        sc[j] = e;
        const float p = mr_e4m3_to_f32(e) * inv_gs;
        const float os = p != 0.0f ? 1.0f / p : 0.0f;
        for (int i = 0; i < MR__NVFP4_BLOCK; i += 2) {
            uint8_t lo = mr_f32_to_e2m1(blk[i] * os), hi = mr_f32_to_e2m1(blk[i + 1] * os);
            q[(j * MR__NVFP4_BLOCK + i) / 2] = (uint8_t)(lo | (hi << 4));
        }
    }
}

/* e2m1(q) * (decode(sc) * input_scale): the block multiplier first, as for
 * the weights (the W4A4 GEMM applies input_scale through alpha). */
void mr_nvfp4_act_dequant_row_ref(const uint8_t *q, const uint8_t *sc, int64_t n, float input_scale, float *dst) {
    for (int64_t j = 0; j < n / MR__NVFP4_BLOCK; j++) {
        const float d = mr_e4m3_to_f32(sc[j]) * input_scale;
        for (int i = 0; i < MR__NVFP4_BLOCK; i++) {
            const int64_t k = j * MR__NVFP4_BLOCK + i;
            dst[k] = mr__e2m1_values[(q[k / 2] >> (4 * (k & 1))) & 0xFu] * d;
        }
    }
}
