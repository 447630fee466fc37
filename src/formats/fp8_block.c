/* fp8_block.c — FP8 block-scaled weights (DeepSeek-V3 / MiniMax-M2 native
 * FP8, HF FineGrainedFP8) and the FP8 1x128 dynamic activation quantizer.
 *
 * Layout of a quantized [N][K] weight:
 *   data   e4m3  [N][K]                       ("weight", F8_E4M3)
 *   scale  f32   [ceil(N/128)][ceil(K/128)]   ("weight_scale_inv", a multiplier)
 *   W[n][k] = e4m3(data[n][k]) * scale[n/128][k/128]
 * Edge blocks (N or K not a multiple of 128) are partial and use the amax of
 * the elements they hold; HF only quantizes divisible shapes, and the same
 * formula on the partial block is what padding with zeros would give. */
#include <float.h>
#include <math.h>

#include "formats/formats_internal.h"
#include "moerun/formats.h"

static inline float clamp448(float v) { return v > MR__E4M3_MAX ? MR__E4M3_MAX : (v < -MR__E4M3_MAX ? -MR__E4M3_MAX : v); }

/* w must be finite (checked by the caller). All arithmetic is fp32 IEEE, as
 * HF Fp8Quantize computes it: scale = 448 * (1/amax) (1 if amax == 0),
 * q = e4m3(clamp(w*scale, ±448)), scale_inv = 1/scale. HF writes
 * `448.0 / amax` with a Python float on the left, which torch evaluates as
 * reciprocal(amax) * 448 (Tensor.__rtruediv__): two roundings, and in about a
 * quarter of cases one ulp away from a true division. We match those bits.
 * A block whose amax is below 448 / FLT_MAX (about 1.3e-36) overflows the
 * scale to inf (HF then writes NaN codes for its zeros and scale_inv 0): its
 * scale is clamped to FLT_MAX instead (spec/formats.md), so that every
 * element w * FLT_MAX <= 448 stays finite and scale_inv = 1/FLT_MAX = 2^-128
 * (an fp32 subnormal) dequantizes it back to within an E4M3 step. */
void mr__fp8_block_quantize(const float *w, int64_t rows, int64_t cols, uint8_t *q, float *scale_inv) {
    const int64_t nbr = (rows + MR__FP8_BLOCK - 1) / MR__FP8_BLOCK;
    const int64_t nbc = (cols + MR__FP8_BLOCK - 1) / MR__FP8_BLOCK;
#pragma omp parallel for schedule(static) if (rows * cols >= (1 << 20))
    for (int64_t b = 0; b < nbr * nbc; b++) {
        const int64_t bi = b / nbc, bj = b % nbc;
        const int64_t r0 = bi * MR__FP8_BLOCK, c0 = bj * MR__FP8_BLOCK;
        const int64_t r1 = r0 + MR__FP8_BLOCK < rows ? r0 + MR__FP8_BLOCK : rows;
        const int64_t c1 = c0 + MR__FP8_BLOCK < cols ? c0 + MR__FP8_BLOCK : cols;
        float amax = 0.0f;
        for (int64_t r = r0; r < r1; r++)
            for (int64_t c = c0; c < c1; c++) {
                float a = fabsf(w[r * cols + c]);
                if (a > amax) amax = a;
            }
        float s = amax > 0.0f ? MR__E4M3_MAX * (1.0f / amax) : 1.0f;
        if (s > FLT_MAX) s = FLT_MAX; /* amax < 448 / FLT_MAX: inf otherwise */
        for (int64_t r = r0; r < r1; r++)
            for (int64_t c = c0; c < c1; c++) q[r * cols + c] = mr_f32_to_e4m3(clamp448(w[r * cols + c] * s));
        scale_inv[b] = 1.0f / s;
    }
}

void mr__fp8_block_dequant_row(const uint8_t *q, const float *scale_inv, int64_t rows, int64_t cols, int64_t r,
                               float *dst) {
    (void)rows;
    const int64_t nbc = (cols + MR__FP8_BLOCK - 1) / MR__FP8_BLOCK;
    const float *srow = scale_inv + (r / MR__FP8_BLOCK) * nbc;
    const uint8_t *qrow = q + r * cols;
    for (int64_t k = 0; k < cols; k++) dst[k] = mr_e4m3_to_f32(qrow[k]) * srow[k / MR__FP8_BLOCK];
}

/* Dynamic 1x128 groups (vLLM per_token_group_quant_fp8 with eps 1e-10):
 * s = max(amax, 1e-10)/448, q = e4m3(clamp(x/s, ±448)). A NaN in a group
 * makes that group's scale NaN (the max propagates it). */
void mr_fp8_act_quantize_row_ref(const float *x, int64_t n, uint8_t *q, float *scales) {
    for (int64_t g0 = 0, gi = 0; g0 < n; g0 += MR__FP8_BLOCK, gi++) {
        const int64_t g1 = g0 + MR__FP8_BLOCK < n ? g0 + MR__FP8_BLOCK : n;
        float amax = 0.0f;
        for (int64_t i = g0; i < g1; i++) {
            float a = fabsf(x[i]);
            if (a > amax || isnan(a)) amax = isnan(amax) ? amax : a;
        }
        const float s = (isnan(amax) ? amax : (amax > 1e-10f ? amax : 1e-10f)) / MR__E4M3_MAX;
        for (int64_t i = g0; i < g1; i++) q[i] = mr_f32_to_e4m3(clamp448(x[i] / s));
        scales[gi] = s;
    }
}
