/* dev/perf/kern_nvfp4_avx512.c — NVFP4 (E2M1 codes, E4M3 per-16 scale) micro-kernels:
 * the int8 VNNI kernel on "nvfp4_r16k16" (w4a8 / exact w4a4) and the bf16
 * kernel on "nvfp4_r16k16b" (w4a16). Contracts in kern.h. Compiled with
 * AVX-512 F/BW/VL/VNNI/BF16 flags. */
#include <immintrin.h>
#include <string.h>

#include "kern.h"

#define INL static inline __attribute__((always_inline))


/* 16 E4M3 bytes -> 16 f32 equal to value * 2^-8 (f16 bit trick, exact). */
INL __m512 e4m3x16_f32(const uint8_t *p) {
    __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    w = _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16((short)0xBF80));
    return _mm512_cvtph_ps(w);
}

INL int32_t ld32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* 2*e2m1(c) + 12 for c = 0..15: an unsigned byte in [0, 24]. */
static const uint8_t U8LUT[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};
/* bf16 bytes of e2m1(c): high byte (sign included) and low byte. */
static const uint8_t BHI[16] = {0x00, 0x3F, 0x3F, 0x3F, 0x40, 0x40, 0x40, 0x40,
                                0x80, 0xBF, 0xBF, 0xBF, 0xC0, 0xC0, 0xC0, 0xC0};
static const uint8_t BLO[16] = {0x00, 0x00, 0x80, 0xC0, 0x00, 0x40, 0x80, 0xC0,
                                0x00, 0x00, 0x80, 0xC0, 0x00, 0x40, 0x80, 0xC0};
INL __m512i lut16(const uint8_t *t) { return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)t)); }

INL void nvfp4_i8_body(const uint8_t *tile, int64_t Kp, const int8_t *xq, int64_t ldx, const int32_t *xb,
                       int64_t ldb, const float *xs, int64_t ldxs, const float *post, float *y, int64_t ldy,
                       const int M) {
    const __m512i lut = lut16(U8LUT);
    const __m512i m0f = _mm512_set1_epi8(0x0F);
    const uint8_t *scp = tile + 8 * Kp;
    __m512 out[MR_PK_MT];
    for (int m = 0; m < M; m++) out[m] = _mm512_setzero_ps();
    for (int64_t j = 0; j < Kp / 16; j++) {
        MR_PK_PF(tile + j * 128);
        MR_PK_PF(tile + j * 128 + 64);
        if ((j & 3) == 0) MR_PK_PF(scp + 16 * j);
        __m512i v0 = _mm512_load_si512(tile + j * 128), v1 = _mm512_load_si512(tile + j * 128 + 64);
        __m512i A = _mm512_shuffle_epi8(lut, _mm512_and_si512(v0, m0f));
        __m512i B = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v0, 4), m0f));
        __m512i C = _mm512_shuffle_epi8(lut, _mm512_and_si512(v1, m0f));
        __m512i D = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v1, 4), m0f));
        __m512 sc = e4m3x16_f32(scp + 16 * j);
        for (int m = 0; m < M; m++) {
            const int8_t *x4 = xq + m * ldx + 16 * j;
            __m512i acc = _mm512_set1_epi32(xb[m * ldb + j]);
            acc = _mm512_dpbusd_epi32(acc, A, _mm512_set1_epi32(ld32(x4)));
            acc = _mm512_dpbusd_epi32(acc, B, _mm512_set1_epi32(ld32(x4 + 4)));
            acc = _mm512_dpbusd_epi32(acc, C, _mm512_set1_epi32(ld32(x4 + 8)));
            acc = _mm512_dpbusd_epi32(acc, D, _mm512_set1_epi32(ld32(x4 + 12)));
            __m512 s = xs ? _mm512_mul_ps(sc, _mm512_set1_ps(xs[m * ldxs + j])) : sc;
            out[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), s, out[m]);
        }
    }
    for (int m = 0; m < M; m++) _mm512_storeu_ps(y + m * ldy, _mm512_mul_ps(out[m], _mm512_set1_ps(128.0f * post[m])));
}

void mr_pk_nvfp4_r16_i8_avx512(const uint8_t *tile, int64_t Kp, const int8_t *xq, int64_t ldx, const int32_t *xb,
                               int64_t ldb, const float *xs, int64_t ldxs, const float *post, int M, float *y,
                               int64_t ldy) {
    switch (M) {
#define C(n)                                                                                                       \
    case n:                                                                                                        \
        nvfp4_i8_body(tile, Kp, xq, ldx, xb, ldb, xs, ldxs, post, y, ldy, n);                                      \
        break;
        C(1) C(2) C(3) C(4) C(5) C(6) C(7) C(8)
#undef C
    default:
        break;
    }
}

INL __m512 bcast_pair(const uint16_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return _mm512_castsi512_ps(_mm512_set1_epi32((int)v));
}
#define DP(acc, w, xv) _mm512_dpbf16_ps((acc), (__m512bh)(w), (__m512bh)(xv))

INL void nvfp4_bf16_body(const uint8_t *tile, int64_t Kp, const uint16_t *x, int64_t ldx, const float *xs,
                         int64_t ldxs, const float *post, float *y, int64_t ldy, const int M) {
    const __m512i lhi = lut16(BHI);
    const __m512i llo = lut16(BLO);
    const __m512i m0f = _mm512_set1_epi8(0x0F);
    const uint8_t *scp = tile + 8 * Kp;
    __m512 out[MR_PK_MT], a0[MR_PK_MT], a1[MR_PK_MT];
    for (int m = 0; m < M; m++) out[m] = _mm512_setzero_ps();
    for (int64_t j = 0; j < Kp / 16; j++) {
        __m512i z[8];
        for (int L = 0; L < 2; L++) {
            MR_PK_PF(tile + j * 128 + 64 * L);
            if (L == 0 && (j & 3) == 0) MR_PK_PF(scp + 16 * j);
            __m512i v = _mm512_load_si512(tile + j * 128 + 64 * L);
            for (int h = 0; h < 2; h++) {
                __m512i n = _mm512_and_si512(h ? _mm512_srli_epi16(v, 4) : v, m0f);
                __m512i hi = _mm512_shuffle_epi8(lhi, n), lo = _mm512_shuffle_epi8(llo, n);
                z[4 * L + 2 * h] = _mm512_unpacklo_epi8(lo, hi);
                z[4 * L + 2 * h + 1] = _mm512_unpackhi_epi8(lo, hi);
            }
        }
        __m512 sc = e4m3x16_f32(scp + 16 * j);
        for (int m = 0; m < M; m++) {
            const uint16_t *xm = x + m * ldx + 16 * j;
            a0[m] = DP(_mm512_setzero_ps(), z[0], bcast_pair(xm));
            a1[m] = DP(_mm512_setzero_ps(), z[1], bcast_pair(xm + 2));
            for (int pr = 2; pr < 8; pr += 2) {
                a0[m] = DP(a0[m], z[pr], bcast_pair(xm + 2 * pr));
                a1[m] = DP(a1[m], z[pr + 1], bcast_pair(xm + 2 * pr + 2));
            }
            __m512 s = xs ? _mm512_mul_ps(sc, _mm512_set1_ps(xs[m * ldxs + j])) : sc;
            out[m] = _mm512_fmadd_ps(_mm512_add_ps(a0[m], a1[m]), s, out[m]);
        }
    }
    for (int m = 0; m < M; m++) _mm512_storeu_ps(y + m * ldy, _mm512_mul_ps(out[m], _mm512_set1_ps(256.0f * post[m])));
}

void mr_pk_nvfp4_r16_bf16_avx512(const uint8_t *tile, int64_t Kp, const uint16_t *x, int64_t ldx, const float *xs,
                                 int64_t ldxs, const float *post, int M, float *y, int64_t ldy) {
    switch (M) {
#define C(n)                                                                                                       \
    case n:                                                                                                        \
        nvfp4_bf16_body(tile, Kp, x, ldx, xs, ldxs, post, y, ldy, n);                                              \
        break;
        C(1) C(2) C(3) C(4) C(5) C(6) C(7) C(8)
#undef C
    default:
        break;
    }
}
