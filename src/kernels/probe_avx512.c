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

/* Read bandwidth kernel: 64-bit sums over zmm loads, 4 lines per step, with
 * the software prefetch 16 KiB ahead into L2 that the packed kernels use (so
 * the ceiling has the same misses in flight as the kernels can have). */
uint64_t mr__probe_read_avx512(const uint64_t *p, size_t n);
uint64_t mr__probe_read_avx512(const uint64_t *p, size_t n) {
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        _mm_prefetch((const char *)(p + i) + 16384, _MM_HINT_T2);
        _mm_prefetch((const char *)(p + i) + 16384 + 128, _MM_HINT_T2);
        s0 = _mm512_add_epi64(s0, _mm512_loadu_si512(p + i));
        s1 = _mm512_add_epi64(s1, _mm512_loadu_si512(p + i + 8));
        s2 = _mm512_add_epi64(s2, _mm512_loadu_si512(p + i + 16));
        s3 = _mm512_add_epi64(s3, _mm512_loadu_si512(p + i + 24));
    }
    uint64_t r = (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
    for (; i < n; i++) r += p[i];
    return r;
}
