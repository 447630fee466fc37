/* probe_avx2.c — ceilings of the AVX2 kernels: peak probes of vfmadd231ps ymm,
 * vpmaddubsw ymm and vpdpbusd ymm (12 independent chains each, enough to cover latency x
 * throughput on current cores), and the read-bandwidth kernel with ymm loads
 * and the AVX2 kernels' software prefetch. Each probe returns a value that
 * depends on every chain so nothing is optimized away. */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "moerun/kernels.h"

double mr__probe_fma_avx2(int64_t iters);
double mr__probe_maddubs_avx2(int64_t iters);
double mr__probe_dpbusd_avx2vnni(int64_t iters);
uint64_t mr__probe_read_avx2(const uint64_t *p, size_t n);

#define NCH 12
double mr__probe_fma_avx2(int64_t iters) {
    __m256 a[NCH], m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < NCH; i++) a[i] = _mm256_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++)
#pragma GCC unroll 16
        for (int i = 0; i < NCH; i++) a[i] = _mm256_fmadd_ps(a[i], m, c);
    __m256 s = a[0];
    for (int i = 1; i < NCH; i++) s = _mm256_add_ps(s, a[i]);
    float v[8];
    _mm256_storeu_ps(v, s);
    return (double)(v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7]);
}

/* a value that depends on every integer chain */
static double chains_total(const __m256i a[NCH]) {
    __m256i s = a[0];
    for (int i = 1; i < NCH; i++) s = _mm256_xor_si256(s, a[i]);
    int32_t lanes[8];
    _mm256_storeu_si256((__m256i *)lanes, s);
    int64_t t = 0;
    for (int i = 0; i < 8; i++) t += lanes[i];
    return (double)t;
}

/* vpmaddubsw: 32 u8 x s8 products summed in pairs (saturating int16); each
 * chain feeds its own result back as the unsigned operand */
double mr__probe_maddubs_avx2(int64_t iters) {
    __m256i a[NCH];
    const __m256i x = _mm256_set1_epi8(-2);
    for (int i = 0; i < NCH; i++) a[i] = _mm256_set1_epi8((char)(i + 1));
    for (int64_t it = 0; it < iters; it++)
#pragma GCC unroll 16
        for (int i = 0; i < NCH; i++) a[i] = _mm256_maddubs_epi16(a[i], x);
    return chains_total(a);
}

/* vpdpbusd ymm (AVX-VNNI, VEX): 8 lanes of 4 u8 x s8 products added to the
 * int32 accumulator, which each chain feeds back. This one function is
 * compiled for AVX-VNNI too (probe.c calls it only where the CPU has it). */
__attribute__((target("avxvnni"))) double mr__probe_dpbusd_avx2vnni(int64_t iters) {
    __m256i a[NCH];
    const __m256i w = _mm256_set1_epi8(3), x = _mm256_set1_epi8(-2);
    for (int i = 0; i < NCH; i++) a[i] = _mm256_set1_epi32(i + 1);
    for (int64_t it = 0; it < iters; it++)
#pragma GCC unroll 16
        for (int i = 0; i < NCH; i++) a[i] = _mm256_dpbusd_avx_epi32(a[i], w, x);
    return chains_total(a);
}

/* Read bandwidth kernel (both x86 tables: the probe of mr_probe_read_once):
 * 64-bit sums over ymm loads, 4 vectors (two lines) per step, with the
 * kernels' software prefetch MR_UK_PREFETCH ahead into L2 once per line,
 * each line's prefetch right before its loads and held there by compiler
 * barriers. Prefetches ahead of both lines' loads read a fifth less on the
 * Intel Xeon VM of 2026-12-05, and zmm loads 15% less
 * (dev/perf/stream_order.c, bench/README.md "The AVX2 stream-only read"). */
uint64_t mr__probe_read_avx2(const uint64_t *p, size_t n) {
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm_prefetch((const char *)(p + i) + MR_UK_PREFETCH, _MM_HINT_T2);
        __asm__ volatile("" ::: "memory");
        s0 = _mm256_add_epi64(s0, _mm256_loadu_si256((const __m256i *)(p + i)));
        s1 = _mm256_add_epi64(s1, _mm256_loadu_si256((const __m256i *)(p + i + 4)));
        __asm__ volatile("" ::: "memory");
        _mm_prefetch((const char *)(p + i) + MR_UK_PREFETCH + 64, _MM_HINT_T2);
        __asm__ volatile("" ::: "memory");
        s2 = _mm256_add_epi64(s2, _mm256_loadu_si256((const __m256i *)(p + i + 8)));
        s3 = _mm256_add_epi64(s3, _mm256_loadu_si256((const __m256i *)(p + i + 12)));
    }
    s0 = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, s0);
    uint64_t r = lanes[0] + lanes[1] + lanes[2] + lanes[3];
    for (; i < n; i++) r += p[i];
    return r;
}
