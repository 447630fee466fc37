/* actq_avx2.c — AVX2 (+FMA) forms of the activation preparation of the
 * packed path (actmode.c mr__act_prepare_uk_row), bit-identical to the
 * scalar definitions there and to the formats/ reference quantizers they
 * call, as actq_avx512.c is for AVX-512: the same IEEE divisions and
 * products, integer rounding on the fp32 bits as formats/scalar.c does, and
 * the same NaN rules (a group or block whose values are not all finite goes
 * through the scalar reference). tests/test_kernels.c checks every mode bit
 * for bit against formats/ on each CPU path. */
#include <float.h>
#include <immintrin.h>
#include <math.h>

#include "moe/moe_internal.h"

static inline __m256 absps(__m256 v) { return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF))); }

static inline bool all_finite(__m256 v) {
    return _mm256_movemask_ps(_mm256_cmp_ps(absps(v), _mm256_set1_ps(FLT_MAX), _CMP_LE_OQ)) == 0xFF;
}

static inline float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* bf16 RNE of fp32 bits, any NaN -> 0x7FC0 (mr_f32_to_bf16), 8 lanes as u32 */
static inline __m256i bf16_bits(__m256i u) {
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF),
                                                     _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
    r = _mm256_srli_epi32(r, 16);
    return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan);
}

/* 16 u32 lanes holding 16-bit values (a: lanes 0-7, b: 8-15) -> 16 u16 */
static inline __m256i pack16(__m256i a, __m256i b) {
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
}

void mr__actq_bf16_avx2(const float *x, int64_t n, uint16_t *dst) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i a = bf16_bits(_mm256_castps_si256(_mm256_loadu_ps(x + i)));
        const __m256i b = bf16_bits(_mm256_castps_si256(_mm256_loadu_ps(x + i + 8)));
        _mm256_storeu_si256((__m256i *)(dst + i), pack16(a, b));
    }
    for (; i < n; i++) dst[i] = mr_f32_to_bf16(x[i]);
}

/* E4M3-rounded fp32 bits of q (|q| <= 448, finite): normal (>= 2^-6): the
 * mantissa rounded to 3 bits, ties to even; subnormal: units of 2^-9, ties
 * to even (exact scaling by 2^9) */
static inline __m256i e4m3_round_bits(__m256 q) {
    const __m256i u = _mm256_castps_si256(q);
    const __m256i sign = _mm256_and_si256(u, _mm256_set1_epi32((int)0x80000000u));
    const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
    __m256i r = _mm256_add_epi32(a, _mm256_add_epi32(_mm256_set1_epi32(0x7FFFF),
                                                     _mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1))));
    r = _mm256_and_si256(r, _mm256_set1_epi32((int)0xFFF00000u));
    const __m256 un = _mm256_round_ps(_mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(512.0f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i sub = _mm256_castps_si256(_mm256_mul_ps(un, _mm256_set1_ps(1.0f / 512.0f)));
    /* a >= 0x3C800000 (2^-6), as signed compare: a has no sign bit */
    const __m256i nm = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x3C800000 - 1));
    return _mm256_or_si256(_mm256_blendv_epi8(sub, r, nm), sign);
}

/* w8a8: per full group of 128 finite values, s = max(amax, 1e-10)/448,
 * q = e4m3(clamp(x/s, +-448)) (formats/ mr_fp8_act_quantize_row_ref); the
 * kernel input is bf16(e4m3 value), exact: the top half of the E4M3-rounded
 * fp32 bits. Other groups: the scalar path. */
void mr__actq_fp8_avx2(const float *x, int64_t n, uint16_t *dst, float *scales) {
    for (int64_t g0 = 0; g0 < n; g0 += 128) {
        const int64_t len = n - g0 < 128 ? n - g0 : 128;
        __m256 v[16];
        bool ok = len == 128;
        __m256 am = _mm256_setzero_ps();
        for (int b = 0; ok && b < 16; b++) {
            v[b] = _mm256_loadu_ps(x + g0 + 8 * b);
            ok = all_finite(v[b]);
            am = _mm256_max_ps(am, absps(v[b]));
        }
        if (!ok) {
            uint8_t q[128];
            mr_fp8_act_quantize_row_ref(x + g0, len, q, &scales[g0 / 128]);
            for (int64_t i = 0; i < len; i++) dst[g0 + i] = mr_f32_to_bf16(mr_e4m3_to_f32(q[i]));
            continue;
        }
        const float amax = hmax(am);
        const float s = (amax > 1e-10f ? amax : 1e-10f) / 448.0f;
        scales[g0 / 128] = s;
        const __m256 sv = _mm256_set1_ps(s);
        for (int b = 0; b < 16; b += 2) {
            __m256i r[2];
            for (int h = 0; h < 2; h++) {
                __m256 q = _mm256_div_ps(v[b + h], sv);
                q = _mm256_min_ps(_mm256_max_ps(q, _mm256_set1_ps(-448.0f)), _mm256_set1_ps(448.0f));
                r[h] = _mm256_srli_epi32(e4m3_round_bits(q), 16);
            }
            _mm256_storeu_si256((__m256i *)(dst + g0 + 8 * b), pack16(r[0], r[1]));
        }
    }
}

/* 8 int32 lanes in [-127, 127] -> 8 int8 stores; returns their sum */
static inline int32_t store_i8x8(int8_t *d, __m256i q) {
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
    _mm_storel_epi64((__m128i *)d, _mm_packs_epi16(w, w));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* E2M1 code magnitude index of |y| by the reference's thresholds, as
 * 2*e2m1 (0, 1, 2, 3, 4, 6, 8, 12), signed by y (a negative y keeps its sign
 * even when it rounds to 0: -0 is 0 in int8) */
static inline __m256i e2m1x2(__m256 y) {
    const __m256 a = absps(y);
    __m256i c = _mm256_setzero_si256();
    const __m256i one = _mm256_set1_epi32(1);
#define STEP(th, pred) c = _mm256_add_epi32(c, _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(th), pred)), one))
    STEP(0.25f, _CMP_GT_OQ);
    STEP(0.75f, _CMP_GE_OQ);
    STEP(1.25f, _CMP_GT_OQ);
    STEP(1.75f, _CMP_GE_OQ);
    STEP(2.5f, _CMP_GT_OQ);
    STEP(3.5f, _CMP_GE_OQ);
    STEP(5.0f, _CMP_GT_OQ);
#undef STEP
    const __m256i q = _mm256_permutevar8x32_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 6, 8, 12), c);
    return _mm256_sign_epi32(q, _mm256_castps_si256(y)); /* y < 0: -q; y == +-0 gives q = 0 anyway */
}

/* w4a4: per 16 (formats/ mr_nvfp4_act_quantize_row_ref, vLLM IEEE order):
 * sc = e4m3(min(gs * (vmax * (1/6)), 448)), os = 1/(e4m3(sc) * (1/gs)) (0
 * if that is 0), code = e2m1(x * os) by the reference's thresholds; kernel
 * input 2*e2m1(code) as int8, xs = e4m3(sc)/2, xb = -12 * block sum.
 * Blocks with a non-finite value or os: the scalar path. */
void mr__actq_w4a4_avx2(const float *x, int64_t n, float input_scale, int8_t *dst, float *xs, int32_t *xb) {
    const float gs = input_scale != 0.0f ? 1.0f / input_scale : 0.0f;
    const float inv_gs = gs != 0.0f ? 1.0f / gs : 0.0f;
    const float sixth = 1.0f / 6.0f;
    for (int64_t j = 0; j < n / 16; j++) {
        const __m256 v0 = _mm256_loadu_ps(x + 16 * j), v1 = _mm256_loadu_ps(x + 16 * j + 8);
        const float vmax = hmax(_mm256_max_ps(absps(v0), absps(v1)));
        float s = gs * (vmax * sixth);
        if (s > 448.0f) s = 448.0f;
        const uint8_t e = mr_f32_to_e4m3(s);
        const float pp = mr_e4m3_to_f32(e) * inv_gs;
        const float os = pp != 0.0f ? 1.0f / pp : 0.0f;
        if (!all_finite(v0) || !all_finite(v1) || !isfinite(os)) {
            uint8_t q[8], sc;
            mr_nvfp4_act_quantize_row_ref(x + 16 * j, 16, input_scale, q, &sc);
            int32_t sum = 0;
            for (int i = 0; i < 16; i++) {
                const int8_t d = (int8_t)(2.0f * mr_e2m1_to_f32((uint8_t)((q[i / 2] >> (4 * (i & 1))) & 15)));
                dst[16 * j + i] = d;
                sum += d;
            }
            xs[j] = 0.5f * mr_e4m3_to_f32(sc);
            xb[j] = -12 * sum;
            continue;
        }
        const __m256 ov = _mm256_set1_ps(os);
        const int32_t s0 = store_i8x8(dst + 16 * j, e2m1x2(_mm256_mul_ps(v0, ov)));
        const int32_t s1 = store_i8x8(dst + 16 * j + 8, e2m1x2(_mm256_mul_ps(v1, ov)));
        xs[j] = 0.5f * mr_e4m3_to_f32(e);
        xb[j] = -12 * (s0 + s1);
    }
}

/* w4a8 (actmode.c int8_group): per group of up to 128, amax = fmaxf over |x|
 * (NaN ignored: maxps returns its second operand, the running max, for a
 * NaN first one), s = max(amax, 1e-10)/127, q = min(max(rne(x/s), -127), 127)
 * (NaN -> -127, as fmaxf does); xs = s per 16, xb = -12 * block sum. */
void mr__actq_w4a8_avx2(const float *x, int64_t n, int8_t *dst, float *xs, int32_t *xb) {
    for (int64_t g0 = 0; g0 < n; g0 += 128) {
        const int64_t len = n - g0 < 128 ? n - g0 : 128; /* n % 16 == 0 */
        __m256 am = _mm256_setzero_ps();
        for (int64_t i = 0; i < len; i += 8) am = _mm256_max_ps(absps(_mm256_loadu_ps(x + g0 + i)), am);
        const float amax = hmax(am);
        const float s = fmaxf(amax, 1e-10f) / 127.0f;
        const __m256 sv = _mm256_set1_ps(s);
        for (int64_t i = 0; i < len; i += 16) {
            int32_t sum = 0;
            for (int h = 0; h < 2; h++) {
                __m256 q = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + g0 + i + 8 * h), sv),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                q = _mm256_min_ps(_mm256_max_ps(q, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
                sum += store_i8x8(dst + g0 + i + 8 * h, _mm256_cvtps_epi32(q));
            }
            const int64_t j = (g0 + i) / 16;
            xs[j] = s;
            xb[j] = -12 * sum;
        }
    }
}
