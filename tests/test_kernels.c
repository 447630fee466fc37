/* test_kernels.c — every kernel table the host can run (generic, AVX2,
 * AVX-512; the CPU mask of the CTest variant limits which) against the
 * scalar reference: mr_gemm_rows and mr_matmul on every weight format, fp32
 * and bf16 activations, per-group activation scales, K not a multiple of 128,
 * M = 1 (GEMV) and M > 1. Reference: mr_qmatrix_dequant_row (formats/) and a
 * double-precision dot product. Tolerance: products of exactly decoded
 * weights with fp32 inputs, fp32 accumulation over K <= 400 terms in a
 * different order: |err| <= 1e-5 * sum|w*x| (K * 2^-24 ~ 2.4e-5 worst case
 * for the fp32 rounding of partial sums of this length is never reached by
 * the pairwise/blocked orders used; 1e-5 leaves margin of ~10x over what
 * was observed and still catches any decoding error, which is >= 2^-4). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moerun/kernels.h"
#include "testutil.h"

static void fill(tu_rng *r, float *v, int64_t n, float s) {
    for (int64_t i = 0; i < n; i++) v[i] = tu_normal(r) * s;
}

static void check_table(const mr_kernels *k, mr_format fmt, int64_t N, int64_t K, int64_t M, mr_format xdt, bool use_xs) {
    tu_rng r = {0x1234 + (uint64_t)(fmt * 1000 + K + M)};
    float *w = malloc(sizeof(float) * (size_t)(N * K));
    float *x = malloc(sizeof(float) * (size_t)(M * K));
    uint16_t *xb = malloc(2 * (size_t)(M * K));
    int64_t G = (K + 127) / 128;
    float *xs = malloc(sizeof(float) * (size_t)(M * G));
    float *y = malloc(sizeof(float) * (size_t)(M * N));
    float *row = malloc(sizeof(float) * (size_t)K);
    fill(&r, w, N * K, 0.1f);
    fill(&r, x, M * K, 1.0f);
    for (int64_t i = 0; i < M * K; i++) {
        xb[i] = mr_f32_to_bf16(x[i]);
        if (xdt == MR_FMT_BF16) x[i] = mr_bf16_to_f32(xb[i]);
    }
    for (int64_t i = 0; i < M * G; i++) xs[i] = use_xs ? 0.5f + tu_uniform(&r) : 1.0f;
    mr_qmatrix q;
    memset(&q, 0, sizeof q);
    assert_int_equal(mr_qmatrix_quantize(&q, fmt, w, N, K, 0.0f), MR_OK);
    mr_gemm_rows(k, &q, 0, N, xdt, xdt == MR_FMT_F32 ? (const void *)x : (const void *)xb, K, use_xs ? xs : NULL, G, M, y, N);
    for (int64_t n = 0; n < N; n++) {
        mr_qmatrix_dequant_row(&q, n, row);
        for (int64_t m = 0; m < M; m++) {
            double ref = 0, mag = 0;
            for (int64_t i = 0; i < K; i++) {
                double p = (double)row[i] * x[m * K + i] * xs[m * G + i / 128];
                ref += p;
                mag += fabs(p);
            }
            double err = fabs(y[m * N + n] - ref);
            if (err > 1e-5 * mag + 1e-30)
                fail_msg("%s %s: fmt %d N %lld K %lld M %lld xdt %d xs %d: y[%lld][%lld] = %.9g, ref %.9g", k->isa,
                         k->decode[fmt].name, fmt, (long long)N, (long long)K, (long long)M, xdt, use_xs, (long long)m,
                         (long long)n, y[m * N + n], ref);
        }
    }
    mr_qmatrix_free(&q);
    free(w), free(x), free(xb), free(xs), free(y), free(row);
}

static void test_gemm_rows_all_tables(void **st) {
    (void)st;
    /* the tables this host can run under the current mask, lowest first */
    uint32_t levels[3] = {0, MR_CPU_AVX2 | MR_CPU_FMA | MR_CPU_F16C, mr_cpu()->flags};
    const mr_format fmts[] = {MR_FMT_F32, MR_FMT_BF16, MR_FMT_FP8_BLOCK, MR_FMT_NVFP4};
    for (int l = 0; l < 3; l++) {
        if ((mr_cpu()->flags & levels[l]) != levels[l]) continue;
        mr_kernels k;
        mr_kernels_init(&k, levels[l]);
        for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++)
            for (int xd = 0; xd < 2; xd++) {
                mr_format xdt = xd ? MR_FMT_BF16 : MR_FMT_F32;
                check_table(&k, fmts[f], 5, 400, 1, xdt, false);   /* K = 3*128 + 16: a short last group */
                check_table(&k, fmts[f], 130, 256, 3, xdt, true);  /* N crosses a 128-row scale block */
                if (fmts[f] != MR_FMT_NVFP4) check_table(&k, fmts[f], 7, 100, 2, xdt, true); /* K < 128, odd */
            }
    }
}

/* The process table picks the best ISA the mask leaves; name it. */
static void test_table_names(void **st) {
    (void)st;
    const mr_kernels *k = mr_kernels_get();
    uint32_t f = mr_cpu()->flags;
    if (f & MR_CPU_AVX512F) assert_string_equal(k->isa, "avx512");
    else if ((f & (MR_CPU_AVX2 | MR_CPU_FMA | MR_CPU_F16C)) == (MR_CPU_AVX2 | MR_CPU_FMA | MR_CPU_F16C))
        assert_string_equal(k->isa, "avx2");
    else assert_string_equal(k->isa, "generic");
    assert_non_null(strstr(k->decode[MR_FMT_FP8_BLOCK].name, k->isa));
}

static void test_matmul(void **st) {
    (void)st;
    const mr_format fmts[] = {MR_FMT_F32, MR_FMT_BF16, MR_FMT_FP8_BLOCK, MR_FMT_NVFP4};
    const int64_t N = 300, K = 272;
    tu_rng r = {77};
    float *w = malloc(sizeof(float) * N * K), *x = malloc(sizeof(float) * 5 * K), *y = malloc(sizeof(float) * 5 * N);
    float *row = malloc(sizeof(float) * K);
    fill(&r, w, N * K, 0.05f);
    fill(&r, x, 5 * K, 1.0f);
    for (size_t f = 0; f < 4; f++)
        for (int64_t M = 1; M <= 5; M += 4) {
            mr_qmatrix q;
            memset(&q, 0, sizeof q);
            assert_int_equal(mr_qmatrix_quantize(&q, fmts[f], w, N, K, 0.0f), MR_OK);
            for (int64_t i = 0; i < M * N; i++) y[i] = NAN;
            mr_matmul(&q, x, M, y);
            for (int64_t n = 0; n < N; n++) {
                mr_qmatrix_dequant_row(&q, n, row);
                for (int64_t m = 0; m < M; m++) {
                    double ref = 0, mag = 0;
                    for (int64_t i = 0; i < K; i++) ref += (double)row[i] * x[m * K + i], mag += fabs(row[i] * x[m * K + i]);
                    assert_true(fabs(y[m * N + n] - ref) <= 1e-5 * mag);
                }
            }
            mr_qmatrix_free(&q);
        }
    free(w), free(x), free(y), free(row);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_rows_all_tables),
        cmocka_unit_test(test_table_names),
        cmocka_unit_test(test_matmul),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
