/* dev/perf/probe_avx512.c — instruction peak probes: independent chains of
 * vfmadd231ps, vdpbf16ps and vpdpbusd (zmm), 12 accumulators each. Each
 * returns a value that depends on every chain so nothing is optimized away. */
#include <immintrin.h>
#include <stdint.h>

#include "probe.h"

#define NCH 12
double mr_pk_probe_fma(int64_t iters) {
    __m512 a[NCH], m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < NCH; i++) a[i] = _mm512_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++)
#pragma GCC unroll 16
        for (int i = 0; i < NCH; i++) a[i] = _mm512_fmadd_ps(a[i], m, c);
    __m512 s = a[0];
    for (int i = 1; i < NCH; i++) s = _mm512_add_ps(s, a[i]);
    return (double)_mm512_reduce_add_ps(s);
}
double mr_pk_probe_dpbf16(int64_t iters) {
    __m512 a[NCH];
    __m512bh w = (__m512bh)_mm512_set1_epi16(0x3F80), x = (__m512bh)_mm512_set1_epi16(0x3000);
    for (int i = 0; i < NCH; i++) a[i] = _mm512_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++)
#pragma GCC unroll 16
        for (int i = 0; i < NCH; i++) a[i] = _mm512_dpbf16_ps(a[i], w, x);
    __m512 s = a[0];
    for (int i = 1; i < NCH; i++) s = _mm512_add_ps(s, a[i]);
    return (double)_mm512_reduce_add_ps(s);
}
double mr_pk_probe_dpbusd(int64_t iters) {
    __m512i a[NCH], w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(-2);
    for (int i = 0; i < NCH; i++) a[i] = _mm512_set1_epi32(i);
    for (int64_t it = 0; it < iters; it++)
#pragma GCC unroll 16
        for (int i = 0; i < NCH; i++) a[i] = _mm512_dpbusd_epi32(a[i], w, x);
    __m512i s = a[0];
    for (int i = 1; i < NCH; i++) s = _mm512_add_epi32(s, a[i]);
    return (double)_mm512_reduce_add_epi32(s);
}
