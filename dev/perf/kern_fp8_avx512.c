/* dev/perf/kern_fp8_avx512.c — FP8-block (E4M3, f32 per 128x128) micro-kernels
 * on the "fp8_r16k4" layout (kern.h): v1 bf16 LUT + vdpbf16ps (decode),
 * v2 f16 trick + vcvtph2ps + vfmadd231ps, v3 block-decode-to-L1 + vdpbf16ps
 * (prefill). Compiled with AVX-512 F/BW/VL/BF16/VBMI flags. */
#include <immintrin.h>
#include <string.h>

#include "kern.h"

#define INL static inline __attribute__((always_inline))

/* bf16 bits of the E4M3 magnitude m (0..127), split in low and high bytes;
 * 0x7F (NaN) maps to 0x7FC0. Exact for every code (subnormals become bf16 normals).
 * Checked against mr_e4m3_to_f32 for all 256 bytes by bench.c. */
static const uint8_t LUT_LO[128] __attribute__((aligned(64))) = {
    0x00, 0x00, 0x80, 0xC0, 0x00, 0x20, 0x40, 0x60, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xC0};
static const uint8_t LUT_HI[128] __attribute__((aligned(64))) = {
    0x00, 0x3B, 0x3B, 0x3B, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C,
    0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D,
    0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E,
    0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F,
    0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40,
    0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41,
    0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42,
    0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x7F};

INL __m512 bcast_pair(const uint16_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return _mm512_castsi512_ps(_mm512_set1_epi32((int)v));
}

#define DP(acc, w, xv) _mm512_dpbf16_ps((acc), (__m512bh)(w), (__m512bh)(xv))

typedef struct {
    __m512i l0, l1, h0, h1, m80;
} fp8_lut;

INL fp8_lut fp8_lut_load(void) {
    fp8_lut t;
    t.l0 = _mm512_load_si512(LUT_LO);
    t.l1 = _mm512_load_si512(LUT_LO + 64);
    t.h0 = _mm512_load_si512(LUT_HI);
    t.h1 = _mm512_load_si512(LUT_HI + 64);
    t.m80 = _mm512_set1_epi8((char)0x80);
    return t;
}

/* One 64-byte line -> z0 = 16 rows x (k0,k1) bf16, z1 = 16 rows x (k2,k3). */
INL void fp8_line_bf16(const fp8_lut *t, const uint8_t *p, __m512i *z0, __m512i *z1) {
    __m512i w = _mm512_load_si512(p);
    __m512i lo = _mm512_permutex2var_epi8(t->l0, w, t->l1);
    __m512i hi = _mm512_permutex2var_epi8(t->h0, w, t->h1);
    hi = _mm512_ternarylogic_epi32(hi, w, t->m80, 0xF8); /* hi | (w & 0x80) */
    *z0 = _mm512_unpacklo_epi8(lo, hi);
    *z1 = _mm512_unpackhi_epi8(lo, hi);
}

INL void fp8_bf16_body(const uint8_t *tile, const float *bs, int64_t Kp, const uint16_t *x, int64_t ldx,
                       const float *xs, int64_t ldxs, float *y, int64_t ldy, const int M) {
    const fp8_lut t = fp8_lut_load();
    const int two = M <= 4; /* two accumulator chains per token when registers allow */
    __m512 out[MR_PK_MT], a0[MR_PK_MT], a1[MR_PK_MT];
    for (int m = 0; m < M; m++) out[m] = _mm512_setzero_ps();
    for (int64_t kb = 0; kb < Kp / 128; kb++) {
        const uint8_t *p = tile + kb * 2048;
        for (int m = 0; m < M; m++) a0[m] = a1[m] = _mm512_setzero_ps();
        for (int g = 0; g < 32; g++) {
            __m512i z0, z1;
            MR_PK_PF(p + g * 64);
            fp8_line_bf16(&t, p + g * 64, &z0, &z1);
            for (int m = 0; m < M; m++) {
                const uint16_t *xm = x + m * ldx + kb * 128 + 4 * g;
                a0[m] = DP(a0[m], z0, bcast_pair(xm));
                if (two)
                    a1[m] = DP(a1[m], z1, bcast_pair(xm + 2));
                else
                    a0[m] = DP(a0[m], z1, bcast_pair(xm + 2));
            }
        }
        for (int m = 0; m < M; m++) {
            float s = bs[kb] * (xs ? xs[m * ldxs + kb] : 1.0f);
            __m512 a = two ? _mm512_add_ps(a0[m], a1[m]) : a0[m];
            out[m] = _mm512_fmadd_ps(a, _mm512_set1_ps(s), out[m]);
        }
    }
    for (int m = 0; m < M; m++) _mm512_storeu_ps(y + m * ldy, out[m]);
}

void mr_pk_fp8_r16_bf16_avx512(const uint8_t *tile, const float *bs, int64_t Kp, const uint16_t *x, int64_t ldx,
                               const float *xs, int64_t ldxs, int M, float *y, int64_t ldy) {
    switch (M) {
#define C(n)                                                                                                       \
    case n:                                                                                                        \
        fp8_bf16_body(tile, bs, Kp, x, ldx, xs, ldxs, y, ldy, n);                                                  \
        break;
        C(1) C(2) C(3) C(4) C(5) C(6) C(7) C(8)
#undef C
    default:
        break;
    }
}

/* ---- v2: f16 trick + vcvtph2ps + FMA ---- */
/* vpermb index: output byte 16*kk + d <- the line byte holding (row d, k kk). */
static const uint8_t DEINT[64] __attribute__((aligned(64))) = {
#define P(kk, d) (uint8_t)(16 * ((d) >> 2) + ((((d) & 3) << 1) | ((kk) & 1) | (((kk) >> 1) << 3)))
#define R(kk)                                                                                                      \
    P(kk, 0), P(kk, 1), P(kk, 2), P(kk, 3), P(kk, 4), P(kk, 5), P(kk, 6), P(kk, 7), P(kk, 8), P(kk, 9), P(kk, 10),  \
        P(kk, 11), P(kk, 12), P(kk, 13), P(kk, 14), P(kk, 15)
    R(0), R(1), R(2), R(3)
#undef R
#undef P
};

/* 16 E4M3 bytes -> 16 f32 equal to value * 2^-8 (exact, subnormals too; 0x7F -> 480*2^-8, not NaN). */
INL __m512 e4m3x16_f32(__m128i b) {
    __m256i w = _mm256_cvtepi8_epi16(b);
    w = _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16((short)0xBF80));
    return _mm512_cvtph_ps(w);
}

INL void fp8_f32_body(const uint8_t *tile, const float *bs, int64_t Kp, const float *x, int64_t ldx,
                      const float *xs, int64_t ldxs, float *y, int64_t ldy, const int M) {
    const __m512i idx = _mm512_load_si512(DEINT);
    __m512 out[MR_PK_MT], a0[MR_PK_MT], a1[MR_PK_MT];
    for (int m = 0; m < M; m++) out[m] = _mm512_setzero_ps();
    for (int64_t kb = 0; kb < Kp / 128; kb++) {
        const uint8_t *p = tile + kb * 2048;
        for (int m = 0; m < M; m++) a0[m] = a1[m] = _mm512_setzero_ps();
        for (int g = 0; g < 32; g++) {
            MR_PK_PF(p + g * 64);
            __m512i v = _mm512_permutexvar_epi8(idx, _mm512_load_si512(p + g * 64));
            __m512 w0 = e4m3x16_f32(_mm512_castsi512_si128(v));
            __m512 w1 = e4m3x16_f32(_mm512_extracti32x4_epi32(v, 1));
            __m512 w2 = e4m3x16_f32(_mm512_extracti32x4_epi32(v, 2));
            __m512 w3 = e4m3x16_f32(_mm512_extracti32x4_epi32(v, 3));
            for (int m = 0; m < M; m++) {
                const float *xm = x + m * ldx + kb * 128 + 4 * g;
                a0[m] = _mm512_fmadd_ps(w0, _mm512_set1_ps(xm[0]), a0[m]);
                a1[m] = _mm512_fmadd_ps(w1, _mm512_set1_ps(xm[1]), a1[m]);
                a0[m] = _mm512_fmadd_ps(w2, _mm512_set1_ps(xm[2]), a0[m]);
                a1[m] = _mm512_fmadd_ps(w3, _mm512_set1_ps(xm[3]), a1[m]);
            }
        }
        for (int m = 0; m < M; m++) {
            float s = 256.0f * bs[kb] * (xs ? xs[m * ldxs + kb] : 1.0f);
            out[m] = _mm512_fmadd_ps(_mm512_add_ps(a0[m], a1[m]), _mm512_set1_ps(s), out[m]);
        }
    }
    for (int m = 0; m < M; m++) _mm512_storeu_ps(y + m * ldy, out[m]);
}

void mr_pk_fp8_r16_f32_avx512(const uint8_t *tile, const float *bs, int64_t Kp, const float *x, int64_t ldx,
                              const float *xs, int64_t ldxs, int M, float *y, int64_t ldy) {
    switch (M) {
#define C(n)                                                                                                       \
    case n:                                                                                                        \
        fp8_f32_body(tile, bs, Kp, x, ldx, xs, ldxs, y, ldy, n);                                                   \
        break;
        C(1) C(2) C(3) C(4) C(5) C(6) C(7) C(8)
#undef C
    default:
        break;
    }
}

/* ---- v3: prefill, decode a 16x128 block once into buf, all tokens over it ---- */
INL void fp8_gemm_tok(const __m512i *buf, const uint16_t *x, int64_t ldx, const float *xs, int64_t ldxs,
                      float s0, int64_t kb, float *y, int64_t ldy, int first, const int M) {
    __m512 a[MR_PK_MT];
    for (int m = 0; m < M; m++) a[m] = _mm512_setzero_ps();
    for (int pr = 0; pr < 64; pr++) {
        __m512i w = _mm512_load_si512(buf + pr);
        for (int m = 0; m < M; m++) a[m] = DP(a[m], w, bcast_pair(x + m * ldx + kb * 128 + 2 * pr));
    }
    for (int m = 0; m < M; m++) {
        __m512 s = _mm512_set1_ps(s0 * (xs ? xs[m * ldxs + kb] : 1.0f));
        __m512 r = first ? _mm512_mul_ps(a[m], s) : _mm512_fmadd_ps(a[m], s, _mm512_loadu_ps(y + m * ldy));
        _mm512_storeu_ps(y + m * ldy, r);
    }
}

void mr_pk_fp8_r16_gemm_bf16_avx512(const uint8_t *tile, const float *bs, int64_t Kp, const uint16_t *x,
                                    int64_t ldx, const float *xs, int64_t ldxs, int M, float *y, int64_t ldy,
                                    uint16_t *buf) {
    const fp8_lut t = fp8_lut_load();
    __m512i *b = (__m512i *)buf;
    for (int64_t kb = 0; kb < Kp / 128; kb++) {
        const uint8_t *p = tile + kb * 2048;
        for (int g = 0; g < 32; g++) {
            __m512i z0, z1;
            MR_PK_PF(p + g * 64);
            fp8_line_bf16(&t, p + g * 64, &z0, &z1);
            _mm512_store_si512(b + 2 * g, z0);
            _mm512_store_si512(b + 2 * g + 1, z1);
        }
        for (int m0 = 0; m0 < M; m0 += MR_PK_MT) {
            int mt = M - m0 < MR_PK_MT ? M - m0 : MR_PK_MT;
            const uint16_t *xm = x + m0 * ldx;
            const float *xsm = xs ? xs + m0 * ldxs : NULL;
            float *ym = y + m0 * ldy;
            if (mt == MR_PK_MT)
                fp8_gemm_tok(b, xm, ldx, xsm, ldxs, bs[kb], kb, ym, ldy, kb == 0, MR_PK_MT);
            else
                switch (mt) {
#define C(n)                                                                                                       \
    case n:                                                                                                        \
        fp8_gemm_tok(b, xm, ldx, xsm, ldxs, bs[kb], kb, ym, ldy, kb == 0, n);                                      \
        break;
                    C(1) C(2) C(3) C(4) C(5) C(6) C(7)
#undef C
                default:
                    break;
                }
        }
    }
}
