/* dev/perf/kern_bf16_avx512.c — bf16-weight micro-kernel on the "bf16_r16k2"
 * layout (kern.h): one 64-byte line = 16 rows x one bf16 pair, vdpbf16ps
 * against the broadcast activation pair. */
#include <immintrin.h>
#include <string.h>

#include "kern.h"

#define INL static inline __attribute__((always_inline))

INL __m512 bcast_pair(const uint16_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return _mm512_castsi512_ps(_mm512_set1_epi32((int)v));
}
#define DP(acc, w, xv) _mm512_dpbf16_ps((acc), (__m512bh)(w), (__m512bh)(xv))

INL void bf16_body(const uint8_t *tile, int64_t Kp, const uint16_t *x, int64_t ldx, float *y, int64_t ldy,
                   const int M) {
    /* 4 chains per token for M == 1, 2 for M <= 4, 1 above (latency vs registers). */
    enum { MAXC = 4 };
    const int nc = M == 1 ? 4 : M <= 4 ? 2 : 1;
    __m512 a[MR_PK_MT][MAXC];
    for (int m = 0; m < M; m++)
        for (int c = 0; c < MAXC; c++) a[m][c] = _mm512_setzero_ps();
    int64_t np = Kp / 2, g = 0;
    for (; g + 4 <= np; g += 4)
        for (int u = 0; u < 4; u++) {
            if (u == 0) MR_PK_PF(tile + g * 64);
            if (u == 0) MR_PK_PF(tile + g * 64 + 128);
            __m512i w = _mm512_load_si512(tile + (g + u) * 64);
            for (int m = 0; m < M; m++) a[m][u % nc] = DP(a[m][u % nc], w, bcast_pair(x + m * ldx + 2 * (g + u)));
        }
    for (; g < np; g++) {
        __m512i w = _mm512_load_si512(tile + g * 64);
        for (int m = 0; m < M; m++) a[m][0] = DP(a[m][0], w, bcast_pair(x + m * ldx + 2 * g));
    }
    for (int m = 0; m < M; m++) {
        __m512 s = a[m][0];
        for (int c = 1; c < nc; c++) s = _mm512_add_ps(s, a[m][c]);
        _mm512_storeu_ps(y + m * ldy, s);
    }
}

void mr_pk_bf16_r16_avx512(const uint8_t *tile, int64_t Kp, const uint16_t *x, int64_t ldx, int M, float *y,
                           int64_t ldy) {
    switch (M) {
#define C(n)                                                                                                       \
    case n:                                                                                                        \
        bf16_body(tile, Kp, x, ldx, y, ldy, n);                                                                    \
        break;
        C(1) C(2) C(3) C(4) C(5) C(6) C(7) C(8)
#undef C
    default:
        break;
    }
}
