/* probe_avx512.c — peak probe of vfmadd231ps zmm: 10 independent chains. */
#include <immintrin.h>
#include <stdint.h>

double mr__probe_fma_avx512(int64_t iters);
double mr__probe_fma_avx512(int64_t iters) {
    __m512 a[10], m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 10; i++) a[i] = _mm512_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++)
        for (int i = 0; i < 10; i++) a[i] = _mm512_fmadd_ps(a[i], m, c);
    __m512 s = a[0];
    for (int i = 1; i < 10; i++) s = _mm512_add_ps(s, a[i]);
    return (double)_mm512_reduce_add_ps(s);
}
