/* panel_avx512.h — the state of the register blocks of the AVX-512 blocked dense forms (the FMA rows
 * of kernels_avx512.c, the bf16 pair dots of dense_avx512bf16.c): R rows x T tokens of 16-lane chains,
 * kept between column blocks in st, row r's token m at (r mc + m) 16 floats (mc: the tokens a chunk).
 * Only for files compiled for AVX-512. */
#ifndef MOERUN_PANEL_AVX512_H
#define MOERUN_PANEL_AVX512_H
#include <immintrin.h>

/* the chains at the start of a column block: zero where they start or fold into totals (fold: FP8's
 * scale groups), else as the last column block left them */
static inline __attribute__((always_inline)) void mr__panel_begin(__m512 *acc, const float *st, int mc, int fold,
                                                                  int cont, const int R, const int T) {
    #pragma GCC unroll 24
    for (int j = 0; j < R * T; j++)
        acc[j] = fold || !cont ? _mm512_setzero_ps() : _mm512_load_ps(st + ((j / T) * mc + j % T) * 16);
}

/* at its end: the chains themselves, or (fold) the totals fma(acc, gs[r], the totals so far or 0) */
static inline __attribute__((always_inline)) void mr__panel_end(const __m512 *acc, float *st, int mc,
                                                                const float *gs, int fold, int cont, const int R,
                                                                const int T) {
    #pragma GCC unroll 24
    for (int j = 0; j < R * T; j++) {
        float *p = st + ((j / T) * mc + j % T) * 16;
        _mm512_store_ps(p, fold ? _mm512_fmadd_ps(acc[j], _mm512_set1_ps(gs[j / T]),
                                                  cont ? _mm512_load_ps(p) : _mm512_setzero_ps())
                                : acc[j]);
    }
}
#endif
