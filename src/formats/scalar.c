/* scalar.c — the scalar reference conversions between fp32 and the element
 * formats: bf16, f16 (IEEE binary16), FP8 E4M3FN, FP8 E5M2 and E2M1 (FP4).
 * Semantics: shared/spec/formats.md. Everything is done on the fp32 bit
 * pattern with integer arithmetic, so the result does not depend on the FPU
 * rounding mode or on flush-to-zero settings.
 *
 * Bit layouts (sign s, exponent e, mantissa m):
 *   bf16  s eeeeeeee mmmmmmm      bias 127   top half of an fp32
 *   f16   s eeeee mmmmmmmmmm      bias 15    inf 0x7C00, NaN e=31 m!=0
 *   e4m3  s eeee mmm              bias 7     no inf, NaN 0x7F/0xFF, max 448
 *   e5m2  s eeeee mm              bias 15    inf 0x7C, NaN e=31 m!=0, max 57344
 *   e2m1  s ee m (a nibble)       magnitudes {0,.5,1,1.5,2,3,4,6}, no inf/NaN
 *
 * NaN outputs: bf16 -> 0x7FC0 for any NaN (spec, torch c10 scalar path);
 * f16 -> sign|0x7E00|payload>>13 (numpy keeps the sign and top payload bits);
 * e4m3 -> sign|0x7F; e5m2 -> sign|0x7E (ml_dtypes); e2m1 has no NaN, a NaN
 * input saturates like an infinity: sign|0x7 (±6). */
#include <math.h>
#include <string.h>

#include "formats/formats_internal.h"
#include "moerun/formats.h"

static inline uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Rounds the finite magnitude with fp32 bits a (sign cleared) to an integer
 * count of units of 2^lsb_exp, ties to even. Used for targets' subnormal
 * ranges, where a is well below 2^(lsb_exp + 24), so the count fits. */
static uint32_t rne_units(uint32_t a, int lsb_exp) {
    int e = (int)(a >> 23);
    uint32_t m = a & 0x7FFFFFu;
    if (e == 0) {
        e = 1; /* fp32 subnormal: no implicit bit */
    } else {
        m |= 0x800000u;
    }
    int shift = 150 + lsb_exp - e; /* value = m * 2^(e-150); units = m * 2^-shift */
    if (shift <= 0) return m << -shift; /* not reached by the callers */
    if (shift > 25) return 0;           /* below a quarter unit */
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return q;
}

/* ---- bf16 ---- */
uint16_t mr_f32_to_bf16(float x) {
    uint32_t u = f2u(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

float mr_bf16_to_f32(uint16_t b) { return u2f((uint32_t)b << 16); }

/* ---- f16 ---- */
uint16_t mr_f32_to_f16(float x) {
    uint32_t u = f2u(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((a & 0x7FFFFFu) >> 13));
    if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* >= 65520 (tie above 65504) or inf */
    if (a >= 0x38800000u) {                                  /* normal: >= 2^-14 */
        uint32_t r = a + 0xFFFu + ((a >> 13) & 1u);
        return (uint16_t)(sign | ((r >> 13) - (112u << 10)));
    }
    return (uint16_t)(sign | rne_units(a, -24)); /* subnormal; 0x400 = min normal on carry */
}

float mr_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0) {
        float v = (float)m * 0x1p-24f; /* exact */
        return u2f(sign | f2u(v));
    }
    if (e == 31) return u2f(sign | 0x7F800000u | (m << 13));
    return u2f(sign | ((e + 112u) << 23) | (m << 13));
}

/* ---- FP8 E4M3FN ---- */
uint8_t mr_f32_to_e4m3(float x) {
    uint32_t u = f2u(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x43E80000u) return (uint8_t)(sign | 0x7Fu); /* > 464, inf, NaN -> NaN */
    if (a >= 0x3C800000u) {                              /* normal: >= 2^-6 */
        uint32_t r = a + 0x7FFFFu + ((a >> 20) & 1u);
        return (uint8_t)(sign | ((r >> 20) - (120u << 3))); /* 464 rounds (tie, even) to 0x7E */
    }
    return (uint8_t)(sign | rne_units(a, -9));
}

float mr_e4m3_to_f32(uint8_t b) {
    uint32_t sign = (uint32_t)(b & 0x80u) << 24;
    uint32_t e = (b >> 3) & 0xFu, m = b & 7u;
    if (e == 15 && m == 7) return u2f(sign | 0x7FC00000u);
    if (e == 0) return u2f(sign | f2u((float)m * 0x1p-9f));
    return u2f(sign | ((e + 120u) << 23) | (m << 20));
}

/* ---- FP8 E5M2 ---- */
uint8_t mr_f32_to_e5m2(float x) {
    uint32_t u = f2u(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint8_t)(sign | 0x7Eu);
    if (a >= 0x47700000u) return (uint8_t)(sign | 0x7Cu); /* >= 61440 (tie above 57344) or inf */
    if (a >= 0x38800000u) {                               /* normal: >= 2^-14 */
        uint32_t r = a + 0xFFFFFu + ((a >> 21) & 1u);
        return (uint8_t)(sign | ((r >> 21) - (112u << 2)));
    }
    return (uint8_t)(sign | rne_units(a, -16));
}

float mr_e5m2_to_f32(uint8_t b) { return mr_f16_to_f32((uint16_t)((uint16_t)b << 8)); }

/* ---- E2M1 ---- */
const float mr__e2m1_values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

uint8_t mr_f32_to_e2m1(float x) {
    uint8_t sign = (uint8_t)((f2u(x) >> 28) & 0x8u);
    float a = fabsf(x);
    uint8_t c;
    if (isnan(x)) c = 7; /* no NaN in E2M1: saturate like an infinity */
    else if (a <= 0.25f) c = 0;
    else if (a < 0.75f) c = 1;
    else if (a <= 1.25f) c = 2;
    else if (a < 1.75f) c = 3;
    else if (a <= 2.5f) c = 4;
    else if (a < 3.5f) c = 5;
    else if (a <= 5.0f) c = 6;
    else c = 7;
    return (uint8_t)(sign | c);
}

float mr_e2m1_to_f32(uint8_t nibble) { return mr__e2m1_values[nibble & 0xFu]; }

uint8_t mr_f32_to_e4m3_sat(float x) { return mr_f32_to_e4m3(x > 448.0f ? 448.0f : x < -448.0f ? -448.0f : x); }
uint8_t mr_f32_to_e5m2_sat(float x) {
    return mr_f32_to_e5m2(x > 57344.0f ? 57344.0f : x < -57344.0f ? -57344.0f : x);
}

size_t mr_kv_elem_bytes(mr_format kv_dtype) {
    switch (kv_dtype) {
    case MR_FMT_F32: return 4;
    case MR_FMT_BF16: return 2;
    case MR_FMT_E4M3:
    case MR_FMT_E5M2: return 1;
    default: return 0;
    }
}

const char *mr_kv_dtype_name(mr_format kv_dtype) {
    switch (kv_dtype) {
    case MR_FMT_F32: return "fp32";
    case MR_FMT_BF16: return "bf16";
    case MR_FMT_E4M3: return "fp8_e4m3";
    case MR_FMT_E5M2: return "fp8_e5m2";
    default: return NULL;
    }
}
