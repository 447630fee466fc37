/* probe_avx512.c — instruction peak probes in zmm: 12 independent
 * accumulator chains of vfmadd231ps, vdpbf16ps or vpdpbusd (enough to cover
 * the latency x throughput of each on current cores). Each returns a value
 * that depends on every chain so nothing is optimized away. */
#include <immintrin.h>
#include <stdint.h>

double mr__probe_fma_avx512(int64_t iters);
double mr__probe_dpbf16_avx512(int64_t iters);
double mr__probe_dpbusd_avx512(int64_t iters);

#define NCH 12
double mr__probe_fma_avx512(int64_t iters) {
    __m512 a[NCH], m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < NCH; i++) a[i] = _mm512_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++)
#pragma GCC unroll 16
        for (int i = 0; i < NCH; i++) a[i] = _mm512_fmadd_ps(a[i], m, c);
    __m512 s = a[0];
    for (int i = 1; i < NCH; i++) s = _mm512_add_ps(s, a[i]);
    return (double)_mm512_reduce_add_ps(s);
}

/* AVX512-BF16 is an extension of the level (probe.c calls this only where the CPU has it) */
__attribute__((target("avx512bf16"))) double mr__probe_dpbf16_avx512(int64_t iters) {
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

double mr__probe_dpbusd_avx512(int64_t iters) {
    __m512i a[NCH], w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(-2);
    for (int i = 0; i < NCH; i++) a[i] = _mm512_set1_epi32(i);
    for (int64_t it = 0; it < iters; it++)
#pragma GCC unroll 16
        for (int i = 0; i < NCH; i++) a[i] = _mm512_dpbusd_epi32(a[i], w, x);
    __m512i s = a[0];
    for (int i = 1; i < NCH; i++) s = _mm512_add_epi32(s, a[i]); /* wraps: only kept alive */
    int32_t lanes[16];
    _mm512_storeu_si512(lanes, s);
    int64_t t = 0; /* _mm512_reduce_add_epi32 adds in signed int: overflow is undefined */
    for (int i = 0; i < 16; i++) t += lanes[i];
    return (double)t;
}
