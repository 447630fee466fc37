/* actq_avx512.c — AVX-512 (F/BW/VL) forms of the activation preparation of
 * the packed path (actmode.c mr__act_prepare_uk_row), bit-identical to the
 * scalar definitions there and to the formats/ reference quantizers they
 * call: the same IEEE divisions and products, integer rounding on the fp32
 * bits as formats/scalar.c does, and the same NaN rules (a group or block
 * whose values are not all finite goes through the scalar reference).
 * tests/test_kernels.c checks every mode bit for bit against formats/. */
#include <float.h>
#include <immintrin.h>
#include <math.h>

#include "moe/moe_internal.h"

static inline __mmask16 mask_n(int64_t r) { return r >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << r) - 1u); }

/* bf16 RNE of fp32 bits, any NaN -> 0x7FC0 (mr_f32_to_bf16), 16 lanes as u32 */
static inline __m512i bf16_bits(__m512i u) {
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                  _mm512_set1_epi32(0x7F800000));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF),
                                                     _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
    r = _mm512_srli_epi32(r, 16);
    return _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
}

void mr__actq_bf16_avx512(const float *x, int64_t n, uint16_t *dst) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = mask_n(n - i);
        const __m512i u = _mm512_castps_si512(_mm512_maskz_loadu_ps(m, x + i));
        _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtepi32_epi16(bf16_bits(u)));
    }
}

static inline bool all_finite(__m512 v, __mmask16 m) {
    const __m512 a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF)));
    return (_mm512_mask_cmp_ps_mask(m, a, _mm512_set1_ps(FLT_MAX), _CMP_LE_OQ) & m) == m;
}

static inline __m512 absps(__m512 v) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF)));
}

/* w8a8: per full group of 128 finite values, s = max(amax, 1e-10)/448,
 * q = e4m3(clamp(x/s, +-448)) (formats/ mr_fp8_act_quantize_row_ref), and the
 * kernel input is bf16(e4m3 value): exact, so the bf16 bits are those of the
 * E4M3-rounded fp32 value. Other groups: the scalar path. */
void mr__actq_fp8_avx512(const float *x, int64_t n, uint16_t *dst, float *scales) {
    for (int64_t g0 = 0; g0 < n; g0 += 128) {
        const int64_t len = n - g0 < 128 ? n - g0 : 128;
        __m512 v[8];
        bool ok = len == 128;
        __m512 am = _mm512_setzero_ps();
        for (int b = 0; ok && b < 8; b++) {
            v[b] = _mm512_loadu_ps(x + g0 + 16 * b);
            ok = all_finite(v[b], 0xFFFF);
            am = _mm512_max_ps(am, absps(v[b]));
        }
        if (!ok) {
            uint8_t q[128];
            mr_fp8_act_quantize_row_ref(x + g0, len, q, &scales[g0 / 128]);
            for (int64_t i = 0; i < len; i++) dst[g0 + i] = mr_f32_to_bf16(mr_e4m3_to_f32(q[i]));
            continue;
        }
        const float amax = _mm512_reduce_max_ps(am);
        const float s = (amax > 1e-10f ? amax : 1e-10f) / 448.0f;
        scales[g0 / 128] = s;
        const __m512 sv = _mm512_set1_ps(s);
        for (int b = 0; b < 8; b++) {
            __m512 q = _mm512_div_ps(v[b], sv);
            q = _mm512_min_ps(_mm512_max_ps(q, _mm512_set1_ps(-448.0f)), _mm512_set1_ps(448.0f));
            const __m512i u = _mm512_castps_si512(q);
            const __m512i sign = _mm512_and_si512(u, _mm512_set1_epi32((int)0x80000000u));
            const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
            /* normal E4M3 (>= 2^-6): round the mantissa to 3 bits, ties to even */
            __m512i r = _mm512_add_epi32(a, _mm512_add_epi32(_mm512_set1_epi32(0x7FFFF),
                                                             _mm512_and_si512(_mm512_srli_epi32(a, 20), _mm512_set1_epi32(1))));
            r = _mm512_and_si512(r, _mm512_set1_epi32((int)0xFFF00000u));
            /* subnormal: units of 2^-9, ties to even (exact scaling by 2^9) */
            const __m512 un = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(512.0f)),
                                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __m512i sub = _mm512_castps_si512(_mm512_mul_ps(un, _mm512_set1_ps(1.0f / 512.0f)));
            const __mmask16 nm = _mm512_cmpge_epu32_mask(a, _mm512_set1_epi32(0x3C800000));
            const __m512i bits = _mm512_or_si512(_mm512_mask_mov_epi32(sub, nm, r), sign);
            _mm256_storeu_si256((__m256i *)(dst + g0 + 16 * b), _mm512_cvtepi32_epi16(_mm512_srli_epi32(bits, 16)));
        }
    }
}

/* 16 int32 lanes -> int8 store, returns their sum */
static inline int32_t store_i8(int8_t *d, __m512i q) {
    _mm_storeu_si128((__m128i *)d, _mm512_cvtepi32_epi8(q));
    return _mm512_reduce_add_epi32(q);
}

/* w4a4: per 16 (formats/ mr_nvfp4_act_quantize_row_ref, vLLM IEEE order):
 * sc = e4m3(min(gs * (vmax * (1/6)), 448)), os = 1/(e4m3(sc) * (1/gs)) (0
 * if that is 0), code = e2m1(x * os) by the reference's thresholds; kernel
 * input 2*e2m1(code) as int8, xs = e4m3(sc)/2, xb = -12 * block sum.
 * Blocks with a non-finite value or os: the scalar path. */
void mr__actq_w4a4_avx512(const float *x, int64_t n, float input_scale, int8_t *dst, float *xs, int32_t *xb) {
    const float gs = input_scale != 0.0f ? 1.0f / input_scale : 0.0f;
    const float inv_gs = gs != 0.0f ? 1.0f / gs : 0.0f;
    const float sixth = 1.0f / 6.0f;
    const __m512i lut = _mm512_setr_epi32(0, 1, 2, 3, 4, 6, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i one = _mm512_set1_epi32(1);
    for (int64_t j = 0; j < n / 16; j++) {
        const __m512 v = _mm512_loadu_ps(x + 16 * j);
        const float vmax = _mm512_reduce_max_ps(absps(v));
        float s = gs * (vmax * sixth);
        if (s > 448.0f) s = 448.0f;
        const uint8_t e = mr_f32_to_e4m3(s);
        const float pp = mr_e4m3_to_f32(e) * inv_gs;
        const float os = pp != 0.0f ? 1.0f / pp : 0.0f;
        if (!all_finite(v, 0xFFFF) || !isfinite(os)) {
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
        const __m512 y = _mm512_mul_ps(v, _mm512_set1_ps(os));
        const __m512 a = absps(y);
        __m512i c = _mm512_setzero_si512();
        c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.25f), _CMP_GT_OQ), c, one);
        c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.75f), _CMP_GE_OQ), c, one);
        c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(a, _mm512_set1_ps(1.25f), _CMP_GT_OQ), c, one);
        c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(a, _mm512_set1_ps(1.75f), _CMP_GE_OQ), c, one);
        c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(a, _mm512_set1_ps(2.5f), _CMP_GT_OQ), c, one);
        c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(a, _mm512_set1_ps(3.5f), _CMP_GE_OQ), c, one);
        c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(a, _mm512_set1_ps(5.0f), _CMP_GT_OQ), c, one);
        __m512i q = _mm512_permutexvar_epi32(c, lut);
        const __mmask16 neg = _mm512_cmplt_epi32_mask(_mm512_castps_si512(y), _mm512_setzero_si512());
        q = _mm512_mask_sub_epi32(q, neg, _mm512_setzero_si512(), q);
        xs[j] = 0.5f * mr_e4m3_to_f32(e);
        xb[j] = -12 * store_i8(dst + 16 * j, q);
    }
}

/* w4a8 (actmode.c int8_group): per group of up to 128, amax = fmaxf over |x|
 * (NaN ignored), s = max(amax, 1e-10)/127, q = min(max(rne(x/s), -127), 127)
 * (NaN -> -127, as fmaxf does); xs = s per 16, xb = -12 * block sum. */
void mr__actq_w4a8_avx512(const float *x, int64_t n, int8_t *dst, float *xs, int32_t *xb) {
    for (int64_t g0 = 0; g0 < n; g0 += 128) {
        const int64_t len = n - g0 < 128 ? n - g0 : 128; /* n % 16 == 0 */
        __m512 am = _mm512_setzero_ps();
        for (int64_t i = 0; i < len; i += 16) am = _mm512_max_ps(absps(_mm512_loadu_ps(x + g0 + i)), am);
        const float amax = _mm512_reduce_max_ps(am);
        const float s = fmaxf(amax, 1e-10f) / 127.0f;
        const __m512 sv = _mm512_set1_ps(s);
        for (int64_t i = 0; i < len; i += 16) {
            __m512 q = _mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(x + g0 + i), sv),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            q = _mm512_min_ps(_mm512_max_ps(q, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
            const int64_t j = (g0 + i) / 16;
            xs[j] = s;
            xb[j] = -12 * store_i8(dst + g0 + i, _mm512_cvtps_epi32(q));
        }
    }
}
