/* test_kernels.c — every kernel table the host can run (generic, AVX2,
 * AVX-512; the CTest variant's MOERUN_TEST_ISA limits which) against the
 * scalar reference: mr_gemm_rows and mr_matmul on every weight format, fp32
 * and bf16 activations, per-group activation scales, K not a multiple of 128,
 * M = 1 (GEMV) and M > 1. Reference: mr_qmatrix_dequant_row (formats/) and a
 * double-precision dot product. Tolerance: products of exactly decoded
 * weights with fp32 inputs, fp32 accumulation over K <= 400 terms in a
 * different order: |err| <= 1e-5 * sum|w*x| (K * 2^-24 ~ 2.4e-5 worst case
 * for the fp32 rounding of partial sums of this length is never reached by
 * the pairwise/blocked orders used; 1e-5 leaves margin of ~10x over what
 * was observed and still catches any decoding error, which is >= 2^-4). */
#define _DEFAULT_SOURCE /* syscall(): the AMX tile state the kernel table asked for */
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <xmmintrin.h> /* _mm_getcsr: the MXCSR of test_fp8_fma_gemm_bit_identical */

#include "kernels/kern_internal.h" /* the scalar pack decoders */
#include "moe/moe_internal.h" /* mr__act_prepare_uk_row */
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
    uint32_t levels[3] = {0, mr_kernel_isa_features(MR_ISA_AVX2), mr_cpu()->flags};
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

/* The process table picks the best ISA the mask leaves, and names it: the
 * levels written out (every feature the level's files are compiled for),
 * so AVX-512F without VNNI, VBMI or DQ is avx2; AVX512-BF16 is no part of a
 * level: the AVX-512 table takes vdpbf16ps exactly where the flags hold it. */
static void test_table_names(void **st) {
    (void)st;
    const mr_kernels *k = mr_kernels_get();
    const uint32_t f = mr_cpu()->flags, a2 = MR_CPU_AVX2 | MR_CPU_FMA | MR_CPU_F16C;
    const uint32_t a512 = a2 | MR_CPU_AVX512F | MR_CPU_AVX512BW | MR_CPU_AVX512VL | MR_CPU_AVX512DQ |
                          MR_CPU_AVX512VNNI | MR_CPU_AVX512VBMI;
    const char *want = (f & a512) == a512 ? "avx512" : (f & a2) == a2 ? "avx2" : "generic";
    assert_string_equal(k->isa, want);
    assert_string_equal(mr_kernel_isa_name(k->level), want);
    assert_non_null(strstr(k->decode[MR_FMT_FP8_BLOCK].name, k->isa));
    for (int u = 0; u < MR_UK_COUNT; u++) assert_non_null(strstr(k->uk_gemv[u].name, k->isa));
    /* the AVX2 level takes the AVX-VNNI int8 kernel exactly where the flags hold it */
    const bool vnni = k->level == MR_ISA_AVX2 && (f & MR_CPU_AVXVNNI);
    assert_int_equal(strstr(k->uk_gemm[MR_UK_NVFP4_I8].name, "avx2vnni") != NULL, vnni);
    assert_int_equal(k->uk_instr[MR_UK_NVFP4_I8] == MR_PROBE_DPBUSD_YMM, vnni);
    /* the AVX-512 level's FP8 and BF16 x BF16 kernels on AMX-BF16 (gemv and gemm alike) exactly
     * where the flags hold AMX-TILE and AMX-BF16 and Linux has granted this process the tile data
     * state (asked for by the table; read back here with ARCH_GET_XCOMP_PERM, bit 18 XTILEDATA) */
    uint64_t perm = 0;
    const bool granted = syscall(SYS_arch_prctl, 0x1022, &perm) == 0 && (perm >> 18 & 1);
    const bool amx = k->level == MR_ISA_AVX512 && (f & MR_CPU_AMX_TILE) && (f & MR_CPU_AMX_BF16) && granted;
    const mr_uk_kind amx_kinds[] = {MR_UK_FP8_BF16, MR_UK_BF16_BF16};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(strstr(k->uk_gemv[amx_kinds[i]].name, "_amx_") != NULL, amx);
        if (amx) /* one AMX kernel for every token count */
            assert_ptr_equal(k->uk_gemv[amx_kinds[i]].fn, k->uk_gemm[amx_kinds[i]].fn);
        assert_int_equal(k->uk_instr[amx_kinds[i]] == MR_PROBE_TDPBF16, amx);
    }
    /* and the dense projections on tiles (mr_qmatrix_tiles / mr_matmul) there, and only there */
    const mr_format dense[] = {MR_FMT_FP8_BLOCK, MR_FMT_BF16};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(k->rows_tiles[dense[i]].fn != NULL, amx);
        if (amx) assert_non_null(strstr(k->rows_tiles[dense[i]].name, "_amx_"));
    }
    assert_int_equal(k->rows_xpack != NULL, amx);
    assert_null(k->rows_tiles[MR_FMT_NVFP4].fn);
    /* the AVX-512 level's pair dots: vdpbf16ps ("bf16_avx512_") with BF16, fp32 FMAs without */
    const bool bf = k->level == MR_ISA_AVX512 && (f & MR_CPU_AVX512BF16);
    const mr_uk_kind dots[] = {MR_UK_FP8_BF16, MR_UK_NVFP4_BF16, MR_UK_BF16_BF16};
    for (int i = 0; i < 3 && k->level == MR_ISA_AVX512; i++) {
        if (amx && dots[i] != MR_UK_NVFP4_BF16) continue;
        assert_int_equal(strstr(k->uk_gemv[dots[i]].name, "bf16_avx512_") != NULL, bf);
        assert_int_equal(k->uk_instr[dots[i]] == MR_PROBE_DPBF16, bf && !(dots[i] == MR_UK_FP8_BF16 &&
                                                                           (f & MR_CPU_AVX512FP16)));
    }
}

/* sum_i a[i * as] * b[i * bs] in double; *mag += sum |terms| */
static double dot_ref(const float *a, int as, const float *b, int bs, int n, double *mag) {
    double ref = 0;
    for (int i = 0; i < n; i++) {
        const double t = (double)a[i * as] * b[i * bs];
        ref += t, *mag += fabs(t);
    }
    return ref;
}

/* The attention row kernels of every table against a double reference (rows
 * of fp32, bf16, FP8 E4M3 and E5M2: every finite code of the FP8 types
 * appears; head counts across the register blocks, D with tails), the
 * property mr__attention relies on: rows split into runs (the paged pool's
 * blocks) give the same bits as one call over all of them. */
static void attn_rows_check(const mr_kernels *k, mr_format kvt, int G, int D, tu_rng *r) {
    enum { NR = 37 };
    const int ld = D + 3; /* rows ld apart */
    const size_t es = mr_kv_elem_bytes(kvt);
    float *q = malloc(sizeof(float) * (size_t)(G * D));
    unsigned char *rows = malloc(es * NR * (size_t)ld);
    float *val = malloc(sizeof(float) * NR * (size_t)ld); /* the values the rows hold */
    float *s1 = malloc(sizeof(float) * (size_t)(G * NR)), *s2 = malloc(sizeof(float) * (size_t)(G * NR));
    float *o1 = calloc((size_t)(G * D), sizeof(float)), *o2 = calloc((size_t)(G * D), sizeof(float));
    float *o0 = malloc(sizeof(float) * (size_t)(G * D));
    float *wk = malloc(sizeof(float) * MR_ATTN_WK_ROWS * (size_t)D); /* widened rows, D apart */
    for (int i = 0; i < G * D; i++) q[i] = tu_normal(r);
    for (int i = 0, c = (int)(tu_next(r) % 256); i < NR * ld; i++) {
        if (kvt == MR_FMT_F32) {
            val[i] = tu_normal(r);
            memcpy(rows + 4 * (size_t)i, &val[i], 4);
        } else if (kvt == MR_FMT_BF16) {
            const uint16_t b = mr_f32_to_bf16(tu_normal(r));
            memcpy(rows + 2 * (size_t)i, &b, 2);
            val[i] = mr_bf16_to_f32(b);
        } else { /* the codes in turn from a random start, the non-finite ones skipped */
            do c = (c + 1) % 256;
            while (!isfinite(kvt == MR_FMT_E4M3 ? mr_e4m3_to_f32((uint8_t)c) : mr_e5m2_to_f32((uint8_t)c)));
            rows[i] = (unsigned char)c;
            val[i] = kvt == MR_FMT_E4M3 ? mr_e4m3_to_f32(rows[i]) : mr_e5m2_to_f32(rows[i]);
        }
    }
    const char *tn = mr_kv_dtype_name(kvt);
    k->attn_qk.fn(q, G, D, rows, ld, kvt, NR, s1, NR, wk);
    for (int j0 = 0, nr; j0 < NR; j0 += nr) { /* runs of 16 after a first of 5 */
        nr = j0 == 0 ? 5 : (NR - j0 < 16 ? NR - j0 : 16);
        k->attn_qk.fn(q, G, D, rows + (size_t)j0 * (size_t)ld * es, ld, kvt, nr, s2 + j0, NR, wk);
    }
    for (int g = 0; g < G; g++)
        for (int j = 0; j < NR; j++) {
            double mag = 0;
            const double ref = dot_ref(q + g * D, 1, val + j * ld, 1, D, &mag);
            if (!(fabs(s1[g * NR + j] - ref) <= 1e-6 * mag + 1e-30))
                fail_msg("%s G %d D %d %s: s[%d][%d] = %.9g, reference %.9g", k->attn_qk.name, G, D, tn, g, j,
                         s1[g * NR + j], ref);
        }
    assert_memory_equal(s1, s2, sizeof(float) * (size_t)(G * NR));
    for (int i = 0; i < G * NR; i++) s1[i] = tu_uniform(r); /* weights p */
    for (int i = 0; i < G * D; i++) o1[i] = o2[i] = tu_normal(r); /* accumulated onto */
    memcpy(o0, o1, sizeof(float) * (size_t)(G * D));
    k->attn_pv.fn(s1, NR, G, D, rows, ld, kvt, NR, o1, wk);
    for (int j0 = 0, nr; j0 < NR; j0 += nr) {
        nr = j0 == 0 ? 5 : (NR - j0 < 16 ? NR - j0 : 16);
        k->attn_pv.fn(s1 + j0, NR, G, D, rows + (size_t)j0 * (size_t)ld * es, ld, kvt, nr, o2, wk);
    }
    for (int g = 0; g < G; g++)
        for (int i = 0; i < D; i++) {
            double mag = fabs(o0[g * D + i]);
            const double ref = o0[g * D + i] + dot_ref(s1 + g * NR, 1, val + i, ld, NR, &mag);
            if (!(fabs(o1[g * D + i] - ref) <= 1e-6 * mag + 1e-30))
                fail_msg("%s G %d D %d %s: o[%d][%d] = %.9g, reference %.9g", k->attn_pv.name, G, D, tn, g, i,
                         o1[g * D + i], ref);
        }
    assert_memory_equal(o1, o2, sizeof(float) * (size_t)(G * D));
    free(q), free(rows), free(val), free(s1), free(s2), free(o1), free(o2), free(o0), free(wk);
}

/* Every FP8 code, finite or not, at every position class (vector body and
 * D % 8 tail): a row holding the code at one place and zeros elsewhere,
 * against a one-hot q, gives the code's value (formats.h), NaN for NaN; a
 * one-hot p over such rows adds the value to o. */
static void attn_codes_check(const mr_kernels *k, mr_format kvt) {
    enum { D = 36 };
    float q[D], s, o[D], p = 1.0f, wk[MR_ATTN_WK_ROWS * D];
    uint8_t row[D];
    for (int c = 0; c < 256; c++) {
        const int at = c % D;
        const float want = kvt == MR_FMT_E4M3 ? mr_e4m3_to_f32((uint8_t)c) : mr_e5m2_to_f32((uint8_t)c);
        memset(row, 0, sizeof row);
        row[at] = (uint8_t)c;
        for (int i = 0; i < D; i++) q[i] = i == at ? 1.0f : 0.0f, o[i] = 0.0f;
        k->attn_qk.fn(q, 1, D, row, D, kvt, 1, &s, 1, wk);
        k->attn_pv.fn(&p, 1, 1, D, row, D, kvt, 1, o, wk);
        const bool ok = isnan(want) ? isnan(s) && isnan(o[at]) : s == want && o[at] == want;
        if (!ok)
            fail_msg("%s / %s %s: code 0x%02x at %d gives %.9g / %.9g, want %.9g", k->attn_qk.name, k->attn_pv.name,
                     mr_kv_dtype_name(kvt), c, at, s, o[at], want);
    }
}

static void test_attention_kernels(void **st) {
    (void)st;
    const uint32_t a2 = mr_kernel_isa_features(MR_ISA_AVX2);
    const uint32_t levels[3] = {0, a2, mr_cpu()->flags};
    const int Gs[] = {1, 6, 7, 9, 16}, Ds[] = {16, 24, 128, 36};
    const mr_format kvts[] = {MR_FMT_F32, MR_FMT_BF16, MR_FMT_E4M3, MR_FMT_E5M2};
    tu_rng r = {0xA77};
    for (int l = 0; l < 3; l++) {
        if ((mr_cpu()->flags & levels[l]) != levels[l]) continue;
        mr_kernels k;
        mr_kernels_init(&k, levels[l]);
        for (size_t ti = 0; ti < sizeof kvts / sizeof kvts[0]; ti++) {
            for (size_t gi = 0; gi < sizeof Gs / sizeof Gs[0]; gi++)
                for (size_t di = 0; di < sizeof Ds / sizeof Ds[0]; di++) attn_rows_check(&k, kvts[ti], Gs[gi], Ds[di], &r);
            if (mr_kv_elem_bytes(kvts[ti]) == 1) attn_codes_check(&k, kvts[ti]);
        }
    }
}

/* the AVX2 tables without and with AVX-VNNI; SKIPPED where the host (or the
 * mask) lacks AVX-VNNI */
static void avx2_vnni_tables(mr_kernels *kb, mr_kernels *kv) {
    const uint32_t a2 = mr_kernel_isa_features(MR_ISA_AVX2);
    if ((mr_cpu()->flags & (a2 | MR_CPU_AVXVNNI)) != (a2 | MR_CPU_AVXVNNI)) {
        print_message("SKIPPED: this host (or MOERUN_CPU_MASK) has no AVX2 with AVX-VNNI\n");
        skip();
    }
    mr_kernels_init(kb, a2);
    mr_kernels_init(kv, a2 | MR_CPU_AVXVNNI);
}

/* N x K NVFP4 weights, every big-th one +-6 (the largest code) and the rest
 * normal, signs alternating, quantized into q and packed as k's kind takes them */
static void nvfp4_big_packed(const mr_kernels *k, mr_uk_kind kind, int64_t N, int64_t K, int big, tu_rng *r,
                             mr_qmatrix *q, mr_pmatrix *pm) {
    float *w = malloc(sizeof(float) * (size_t)(N * K));
    for (int64_t i = 0; i < N * K; i++) w[i] = (i % big == 0 ? 6.0f : tu_normal(r)) * (i % 2 ? -1.0f : 1.0f);
    memset(q, 0, sizeof *q);
    assert_int_equal(mr_qmatrix_quantize(q, MR_FMT_NVFP4, w, N, K, 0.0f), MR_OK);
    const mr_qmatrix *src[1] = {q};
    assert_int_equal(mr_pmatrix_pack(pm, k->uk_pack[kind], src, 1), MR_OK);
    free(w);
}

/* The AVX-VNNI NVFP4 int8 kernel against the vpmaddubsw one: the same exact
 * integer sums, so the same bits, for every token count of the gemv and the
 * gemm path, per-block and grouped (w4a8) activation multipliers, and
 * extreme activations (+-127, -128 never: the quantizer's range) with the
 * largest weights. SKIPPED where the host (or the mask) lacks AVX-VNNI. */
static void test_nvfp4_i8_vnni_bit_identical(void **st) {
    (void)st;
    mr_kernels kb, kv;
    avx2_vnni_tables(&kb, &kv);
    assert_ptr_not_equal(kb.uk_gemm[MR_UK_NVFP4_I8].fn, kv.uk_gemm[MR_UK_NVFP4_I8].fn);
    assert_int_equal(kb.uk_pack[MR_UK_NVFP4_I8], kv.uk_pack[MR_UK_NVFP4_I8]);
    tu_rng r = {0x5151};
    mr_qmatrix q;
    mr_pmatrix pm;
    nvfp4_big_packed(&kv, MR_UK_NVFP4_I8, 32, 512, 7, &r, &q, &pm);
    const int64_t K = 512;
    enum { MMAX = 40 };
    const int64_t Kp = pm.Kp, nb = Kp / 16;
    int8_t *x = calloc((size_t)(MMAX * Kp), 1);
    int32_t *xb = calloc((size_t)(MMAX * nb), sizeof(int32_t));
    float *xs = malloc(sizeof(float) * (size_t)(MMAX * nb));
    for (int64_t m = 0; m < MMAX; m++)
        for (int64_t i = 0; i < K; i++) {
            const int8_t v = m % 5 == 0 ? (i % 3 ? 127 : -127) : (int8_t)(tu_uniform(&r) * 254.0f - 127.0f);
            x[m * Kp + i] = v;
            xb[m * nb + i / 16] -= 12 * v;
        }
    for (int64_t i = 0; i < MMAX * nb; i++) xs[i] = 0.25f + tu_uniform(&r);
    float *yb = malloc(sizeof(float) * MMAX * 16), *yv = malloc(sizeof(float) * MMAX * 16);
    void *scratch = mr_aligned_alloc(64, MR_UK_SCRATCH);
    const int64_t Ms[] = {1, 2, 7, 16, 33, MMAX};
    for (int g = 1; g <= 8; g += 7)
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
            for (int gemm = 0; gemm < 2; gemm++) {
                mr_uk_act a = {.x = x, .ldx = Kp, .xs = xs, .ldxs = nb, .xb = xb, .ldb = nb, .post = 0.5f, .xs_group = g};
                if (g == 8) /* the promise of xs_group: equal over each run of 8 blocks */
                    for (int64_t i = 0; i < MMAX * nb; i++) xs[i] = xs[i / 8 * 8];
                for (int64_t t = 0; t < pm.n_tiles; t++) {
                    const mr_uk_fn fb = gemm ? kb.uk_gemm[MR_UK_NVFP4_I8].fn : kb.uk_gemv[MR_UK_NVFP4_I8].fn;
                    const mr_uk_fn fv = gemm ? kv.uk_gemm[MR_UK_NVFP4_I8].fn : kv.uk_gemv[MR_UK_NVFP4_I8].fn;
                    fb(&pm, t, &a, Ms[mi], yb, 16, scratch);
                    fv(&pm, t, &a, Ms[mi], yv, 16, scratch);
                    for (int64_t i = 0; i < Ms[mi] * 16; i++)
                        if (memcmp(&yb[i], &yv[i], 4) != 0)
                            fail_msg("M %lld gemm %d group %d tile %lld y[%lld]: vpmaddubsw %.9g, vpdpbusd %.9g",
                                     (long long)Ms[mi], gemm, g, (long long)t, (long long)i, yb[i], yv[i]);
                }
            }
    mr_pmatrix_free(&pm);
    mr_qmatrix_free(&q);
    mr_aligned_free(scratch);
    free(x), free(xb), free(xs), free(yb), free(yv);
}

/* The AVX2 NVFP4 w4a16 gemv on fixed-point x, vpdpwssd (AVX-VNNI) against
 * vpmaddwd + vpaddd: exact integer block sums either way, so the same bits,
 * for 1-9 tokens over rows holding every kind of block (xq_fill), with and
 * without per-block multipliers; weights with many +-6 codes beside the
 * largest |q| give the largest sums. SKIPPED where the host (or the mask)
 * lacks AVX-VNNI. */
static void xq_fill(tu_rng *r, uint16_t *x, int64_t n);

static void test_nvfp4_fixq_vnni_bit_identical(void **st) {
    (void)st;
    mr_kernels kb, kv;
    avx2_vnni_tables(&kb, &kv);
    assert_true(kb.uk_gemv_xq[MR_UK_NVFP4_BF16] && kv.uk_gemv_xq[MR_UK_NVFP4_BF16]);
    assert_ptr_not_equal(kb.uk_gemv[MR_UK_NVFP4_BF16].fn, kv.uk_gemv[MR_UK_NVFP4_BF16].fn);
    tu_rng r = {0x5152};
    mr_qmatrix q;
    mr_pmatrix pm;
    nvfp4_big_packed(&kv, MR_UK_NVFP4_BF16, 32, 1024, 5, &r, &q, &pm);
    enum { MMAX = 9 };
    const int64_t Kp = pm.Kp, nb = Kp / 16;
    uint16_t *x = calloc((size_t)(MMAX * Kp), sizeof(uint16_t));
    int16_t *xq = malloc(sizeof(int16_t) * (size_t)(2 * MMAX * Kp));
    float *xqm = malloc(sizeof(float) * (size_t)(MMAX * nb)), *xs = malloc(sizeof(float) * (size_t)(MMAX * nb));
    for (int64_t m = 0; m < MMAX; m++) {
        xq_fill(&r, x + m * Kp, Kp);
        for (int64_t b = 0; b < nb; b++) /* Inf / NaN blocks out: their outputs would be NaN on both sides */
            for (int i = 0; i < 16; i++)
                if (!isfinite(mr_bf16_to_f32(x[m * Kp + 16 * b + i]))) x[m * Kp + 16 * b + i] = 0x4700; /* 32768 */
        kb.xq_row.fn(x + m * Kp, Kp, xq + m * Kp, xq + (MMAX + m) * Kp, xqm + m * nb);
    }
    for (int64_t i = 0; i < MMAX * nb; i++) xs[i] = 0.25f + tu_uniform(&r);
    float *yb = malloc(sizeof(float) * MMAX * 16), *yv = malloc(sizeof(float) * MMAX * 16);
    void *scratch = mr_aligned_alloc(64, MR_UK_SCRATCH);
    for (int64_t M = 1; M <= MMAX; M++)
        for (int withxs = 0; withxs < 2; withxs++) {
            const mr_uk_act a = {.x = x, .ldx = Kp, .xs = withxs ? xs : NULL, .ldxs = nb, .post = 0.5f, .xq = xq,
                                 .xql = xq + MMAX * Kp, .xqm = xqm, .ldxq = Kp, .ldxqm = nb};
            for (int64_t t = 0; t < pm.n_tiles; t++) {
                kb.uk_gemv[MR_UK_NVFP4_BF16].fn(&pm, t, &a, M, yb, 16, scratch);
                kv.uk_gemv[MR_UK_NVFP4_BF16].fn(&pm, t, &a, M, yv, 16, scratch);
                for (int64_t i = 0; i < M * 16; i++)
                    if (memcmp(&yb[i], &yv[i], 4) != 0)
                        fail_msg("M %lld xs %d tile %lld y[%lld]: vpmaddwd %.9g, vpdpwssd %.9g", (long long)M, withxs,
                                 (long long)t, (long long)i, yb[i], yv[i]);
            }
        }
    mr_pmatrix_free(&pm);
    mr_qmatrix_free(&q);
    mr_aligned_free(scratch);
    free(x), free(xq), free(xqm), free(xs), free(yb), free(yv);
}

/* a packed-kernel case: kind, source format, pack, K */
typedef struct {
    mr_uk_kind kind;
    mr_format fmt;
    mr_pack_id pack;
    int64_t K;
} ukcase;

/* FP8 kernels of two AVX-512 tables, the same bits: table a's kernel (gemv,
 * gemm, or the one its threshold picks for the call) against table b's, for
 * every token count in Ms, with and without the caller's widened x and the
 * per-block x multipliers of w8a8, under a caller's MXCSR that rounds to
 * nearest and one that rounds up, over every E4M3 code but NaN, and
 * activations whose products and sums fall below fp32's normal range
 * (vdpbf16ps takes input denormals as 0 and flushes output denormals; the
 * FMA kernels run their sums under MXCSR DAZ | FTZ) or are large. */
enum { FP8_GEMV, FP8_GEMM, FP8_PICK };
/* the kernel, its name, and whether it reads the caller's widened x (a caller passes it to
 * nothing else) */
static mr_uk_fn fp8_kernel(const mr_kernels *k, int which, int64_t M, const char **name, bool *xw) {
    const bool gemm = which == FP8_GEMM || (which == FP8_PICK && M >= k->uk_gemm_min_m);
    *name = gemm ? k->uk_gemm[MR_UK_FP8_BF16].name : k->uk_gemv[MR_UK_FP8_BF16].name;
    *xw = gemm && k->uk_gemm_xw[MR_UK_FP8_BF16];
    return gemm ? k->uk_gemm[MR_UK_FP8_BF16].fn : k->uk_gemv[MR_UK_FP8_BF16].fn;
}
static void fp8_same_bits(const mr_kernels *ka, int wa, const mr_kernels *kb, int wb, const int64_t *Ms, int nM) {
    assert_int_equal(ka->uk_pack[MR_UK_FP8_BF16], kb->uk_pack[MR_UK_FP8_BF16]);
    enum { N = 32, K = 384, MMAX = 40 };
    tu_rng r = {0xF8F8};
    uint8_t *codes = malloc((size_t)N * K);
    float scale[(N / 128 + 1) * (K / 128)];
    for (int64_t i = 0; i < (int64_t)N * K; i++) {
        codes[i] = (uint8_t)(i < 256 ? i : (int)(tu_uniform(&r) * 256.0f));
        if ((codes[i] & 0x7F) == 0x7F) codes[i] = 0x38;
    }
    for (size_t i = 0; i < sizeof scale / sizeof scale[0]; i++) scale[i] = 0.001f + tu_uniform(&r);
    mr_qmatrix q = {.fmt = MR_FMT_FP8_BLOCK, .rows = N, .cols = K, .data = codes, .scale = scale, .scale2 = 1.0f};
    const mr_qmatrix *src[1] = {&q};
    mr_pmatrix pm;
    assert_int_equal(mr_pmatrix_pack(&pm, ka->uk_pack[MR_UK_FP8_BF16], src, 1), MR_OK);
    const int64_t Kp = pm.Kp, nb = Kp / 128, ldw = Kp + 16;
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)(MMAX * Kp));
    float *xw = malloc(sizeof(float) * (size_t)(MMAX * ldw)), *xs = malloc(sizeof(float) * (size_t)(MMAX * nb));
    for (int64_t m = 0; m < MMAX; m++)
        for (int64_t i = 0; i < Kp; i++) {
            float v = tu_normal(&r);
            if (m % 4 == 1) v *= 1e-37f; /* products and sums below 2^-126 */
            if (m % 4 == 2) v *= 1e30f;
            uint16_t b = mr_f32_to_bf16(v);
            if (m % 4 == 3 && i % 5 == 0) b = (uint16_t)((b & 0x8000) | (1 + i % 120)); /* bf16 denormals */
            x[m * Kp + i] = b;
            xw[m * ldw + i] = mr_bf16_to_f32(b);
        }
    for (int64_t i = 0; i < MMAX * nb; i++) xs[i] = 0.25f + tu_uniform(&r);
    float *ya = malloc(sizeof(float) * MMAX * 16), *yb = malloc(sizeof(float) * MMAX * 16);
    void *scratch = mr_aligned_alloc(64, MR_UK_SCRATCH);
    const unsigned csr = _mm_getcsr();
    /* v & 1: the caller's widened x; v & 2: w8a8's multipliers; v & 4: the caller's MXCSR rounds
     * up (vdpbf16ps rounds its sums to nearest whatever MXCSR says; both scale into y under it) */
    for (int v = 0; v < 8; v++)
        for (int mi = 0; mi < nM; mi++) {
            const unsigned want = v & 4 ? (csr & ~0x6000u) | 0x4000u : csr;
            _mm_setcsr(want);
            const mr_uk_act a0 = {.x = x, .ldx = Kp, .xs = v & 2 ? xs : NULL, .ldxs = nb, .post = 0.5f};
            mr_uk_act aw = a0;
            if (v & 1) aw.xw = xw, aw.ldxw = ldw;
            const char *na, *nb2;
            bool xwa, xwb;
            const mr_uk_fn fa = fp8_kernel(ka, wa, Ms[mi], &na, &xwa), fb = fp8_kernel(kb, wb, Ms[mi], &nb2, &xwb);
            for (int64_t t = 0; t < pm.n_tiles; t++) {
                fa(&pm, t, xwa ? &aw : &a0, Ms[mi], ya, 16, scratch);
                const bool kept_a = _mm_getcsr() == want;
                fb(&pm, t, xwb ? &aw : &a0, Ms[mi], yb, 16, scratch);
                if ((!kept_a || _mm_getcsr() != want) && (_mm_setcsr(csr), 1))
                    fail_msg("%s / %s left MXCSR changed", na, nb2);
                for (int64_t i = 0; i < Ms[mi] * 16; i++)
                    if (memcmp(&ya[i], &yb[i], 4) != 0 && (_mm_setcsr(csr), 1))
                        fail_msg("M %lld variant %d tile %lld y[%lld]: %s %.9g, %s %.9g", (long long)Ms[mi], v,
                                 (long long)t, (long long)i, na, ya[i], nb2, yb[i]);
            }
            _mm_setcsr(csr);
        }
    mr_pmatrix_free(&pm);
    mr_aligned_free(scratch);
    free(codes), free(x), free(xw), free(xs), free(ya), free(yb);
}

/* The AVX-512 FP8 gemm on fp32 FMAs (the table's where the CPU has
 * AVX512-FP16, and the level's own without AVX512-BF16) against the
 * vdpbf16ps table's kernels: the same bits for every token count from 5
 * (below 16 against the vdpbf16ps gemv, which the FMA gemm's lower threshold
 * replaces). SKIPPED where the host lacks AVX-512 with BF16. */
static void test_fp8_fma_gemm_bit_identical(void **st) {
    (void)st;
    const uint32_t a5 = mr_kernel_isa_features(MR_ISA_AVX512) | MR_CPU_AVX512BF16;
    if ((mr_cpu()->flags & a5) != a5) {
        print_message("SKIPPED: this host (or MOERUN_CPU_MASK) has no AVX-512 with BF16\n");
        skip();
    }
    /* the FP16 flag only selects the kernel (which uses none of its instructions) */
    mr_kernels kd, kf;
    mr_kernels_init(&kd, a5);
    mr_kernels_init(&kf, a5 | MR_CPU_AVX512FP16);
    assert_ptr_not_equal(kd.uk_gemm[MR_UK_FP8_BF16].fn, kf.uk_gemm[MR_UK_FP8_BF16].fn);
    assert_true(kf.uk_gemm_xw[MR_UK_FP8_BF16]);
    /* 5-15: below the vdpbf16ps table's gemm threshold its gemv (a single chain from 5 tokens)
     * is the reference, so the FMA table's lower threshold changes no result either */
    const int64_t Ms[] = {5, 6, 9, 15, 16, 17, 31, 33, 40};
    assert_true(kf.uk_gemm_min_m >= 5);
    fp8_same_bits(&kd, FP8_PICK, &kf, FP8_GEMM, Ms, (int)(sizeof Ms / sizeof Ms[0]));
}

/* The AVX-512 level without AVX512-BF16 (its pair dots on fp32 FMAs): its
 * FP8 gemv sums as its gemm does from 5 tokens a call, so a token's result
 * does not depend on how many tokens its expert got past 4 (the gemm
 * threshold, 6, changes no result). SKIPPED where the host lacks AVX-512. */
static void test_fp8_fma_gemv_is_gemm(void **st) {
    (void)st;
    const uint32_t a5 = mr_kernel_isa_features(MR_ISA_AVX512);
    if ((mr_cpu()->flags & a5) != a5) {
        print_message("SKIPPED: this host (or MOERUN_CPU_MASK) has no AVX-512 level\n");
        skip();
    }
    mr_kernels k;
    mr_kernels_init(&k, a5);
    assert_non_null(strstr(k.uk_gemv[MR_UK_FP8_BF16].name, "f32_avx512"));
    const int64_t Ms[] = {5, 6, 7, 8, 9, 13, 16, 17, 31, 33, 40};
    fp8_same_bits(&k, FP8_GEMV, &k, FP8_GEMM, Ms, (int)(sizeof Ms / sizeof Ms[0]));
}

/* The AMX kernels give every token the bits it gets alone: token m of a call
 * of M (any M, full 16-token tile blocks and a tail block, x rows ldx = Kp +
 * 48 apart) equals a call of that token alone; FP8 with and without the w8a8
 * per-block multipliers, BF16 x BF16 with K = 200 (a last k tile of 8), so a
 * token's MoE output does not depend on how many tokens share its expert
 * (test_engine checks the same of whole requests). SKIPPED where the process
 * table has no AMX kernel. */
static void amx_tokens_independent(const mr_kernels *k, mr_uk_kind kind, const mr_qmatrix *q) {
    enum { MMAX = 40 };
    tu_rng r = {0xA3A3};
    const mr_qmatrix *src[1] = {q};
    mr_pmatrix pm;
    assert_int_equal(mr_pmatrix_pack(&pm, k->uk_pack[kind], src, 1), MR_OK);
    const bool fp8 = kind == MR_UK_FP8_BF16;
    const int64_t Kp = pm.Kp, ldx = Kp + 48, nb = fp8 ? Kp / 128 : 1;
    uint16_t *x = calloc((size_t)(MMAX * ldx), sizeof(uint16_t));
    float *xs = malloc(sizeof(float) * (size_t)(MMAX * nb));
    for (int64_t m = 0; m < MMAX; m++)
        for (int64_t i = 0; i < q->cols; i++) x[m * ldx + i] = mr_f32_to_bf16(tu_normal(&r) * (m % 3 ? 1.0f : 300.0f));
    for (int64_t i = 0; i < MMAX * nb; i++) xs[i] = 0.25f + tu_uniform(&r);
    float *y = malloc(sizeof(float) * MMAX * 16), y1[16];
    void *scratch = mr_aligned_alloc(64, MR_UK_SCRATCH);
    const int64_t Ms[] = {1, 2, 5, 15, 16, 17, 31, 33, MMAX};
    for (int w8a8 = 0; w8a8 < (fp8 ? 2 : 1); w8a8++)
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
            for (int64_t t = 0; t < pm.n_tiles; t++) {
                const int64_t M = Ms[mi];
                mr_uk_act a = {.x = x, .ldx = ldx, .xs = w8a8 ? xs : NULL, .ldxs = nb, .post = 1.0f};
                k->uk_gemm[kind].fn(&pm, t, &a, M, y, 16, scratch);
                for (int64_t m = 0; m < M; m++) {
                    mr_uk_act a1 = {.x = x + m * ldx, .ldx = ldx, .xs = w8a8 ? xs + m * nb : NULL, .ldxs = nb, .post = 1.0f};
                    k->uk_gemv[kind].fn(&pm, t, &a1, 1, y1, 16, scratch);
                    if (memcmp(y1, y + m * 16, sizeof y1))
                        fail_msg("%s: tile %lld token %lld of %lld (w8a8 %d) differs from the token alone",
                                 k->uk_gemm[kind].name, (long long)t, (long long)m, (long long)M, w8a8);
                }
            }
    mr_pmatrix_free(&pm);
    mr_aligned_free(scratch);
    free(x), free(xs), free(y);
}

static void test_amx_tokens_independent(void **st) {
    (void)st;
    const mr_kernels *k = mr_kernels_get();
    if (!strstr(k->uk_gemm[MR_UK_FP8_BF16].name, "_amx_")) {
        print_message("SKIPPED: this host (or MOERUN_CPU_MASK) has no AMX-BF16 kernel\n");
        skip();
    }
    enum { N = 32, K = 384, KB = 200 };
    tu_rng r = {0xA3A4};
    uint8_t *codes = malloc((size_t)N * K);
    float scale[(N / 128 + 1) * (K / 128)];
    for (int64_t i = 0; i < (int64_t)N * K; i++) {
        codes[i] = (uint8_t)(tu_uniform(&r) * 256.0f);
        if ((codes[i] & 0x7F) == 0x7F) codes[i] = 0x38;
    }
    for (size_t i = 0; i < sizeof scale / sizeof scale[0]; i++) scale[i] = 0.001f + tu_uniform(&r);
    mr_qmatrix q = {.fmt = MR_FMT_FP8_BLOCK, .rows = N, .cols = K, .data = codes, .scale = scale, .scale2 = 1.0f};
    amx_tokens_independent(k, MR_UK_FP8_BF16, &q);
    uint16_t *wb = malloc(sizeof(uint16_t) * N * KB);
    for (int64_t i = 0; i < (int64_t)N * KB; i++) wb[i] = mr_f32_to_bf16(tu_normal(&r));
    mr_qmatrix qb = {.fmt = MR_FMT_BF16, .rows = N, .cols = KB, .data = wb, .scale2 = 1.0f};
    amx_tokens_independent(k, MR_UK_BF16_BF16, &qb);
    free(codes), free(wb);
}

/* The pair-dot kernels of the AVX-512 level on fp32 FMAs against the same
 * bodies on vdpbf16ps (uk_avx512.h): the FP8 gemv bit for bit at every token
 * count, denormals included (it sums under DAZ | FTZ); NVFP4 w4a16 and
 * bf16 x bf16 bit for bit on activations in fp32's normal range (they sum
 * under the caller's MXCSR). SKIPPED where the host lacks AVX-512 with BF16. */
static void test_avx512_fma_dot_bit_identical(void **st) {
    (void)st;
    const uint32_t a5 = mr_kernel_isa_features(MR_ISA_AVX512);
    if ((mr_cpu()->flags & (a5 | MR_CPU_AVX512BF16)) != (a5 | MR_CPU_AVX512BF16)) {
        print_message("SKIPPED: this host (or MOERUN_CPU_MASK) has no AVX-512 with BF16\n");
        skip();
    }
    mr_kernels kf, kd;
    mr_kernels_init(&kf, a5);
    mr_kernels_init(&kd, a5 | MR_CPU_AVX512BF16);
    const int64_t Ms[] = {1, 2, 3, 4, 5, 8, 9, 17};
    fp8_same_bits(&kf, FP8_GEMV, &kd, FP8_GEMV, Ms, (int)(sizeof Ms / sizeof Ms[0]));
    static const ukcase cases[] = {
        {MR_UK_NVFP4_BF16, MR_FMT_NVFP4, MR_PACK_NVFP4_R16K16B, 80},
        {MR_UK_NVFP4_BF16, MR_FMT_NVFP4, MR_PACK_NVFP4_R16K16B, 3072},
        {MR_UK_BF16_BF16, MR_FMT_BF16, MR_PACK_BF16_R16K2, 131},
        {MR_UK_BF16_BF16, MR_FMT_BF16, MR_PACK_BF16_R16K2, 1536},
    };
    tu_rng r = {0xB16F};
    void *scratch = mr_aligned_alloc(64, MR_UK_SCRATCH);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const ukcase *uc = &cases[c];
        assert_ptr_not_equal(kf.uk_gemv[uc->kind].fn, kd.uk_gemv[uc->kind].fn);
        mr_qmatrix q;
        float *w = malloc(sizeof(float) * 48 * (size_t)uc->K);
        for (int64_t i = 0; i < 48 * uc->K; i++) w[i] = tu_normal(&r);
        assert_int_equal(mr_qmatrix_quantize(&q, uc->fmt, w, 48, uc->K, 0.0f), MR_OK);
        const mr_qmatrix *src[1] = {&q};
        mr_pmatrix pm;
        assert_int_equal(mr_pmatrix_pack(&pm, uc->pack, src, 1), MR_OK);
        enum { MM = 17 };
        uint16_t *x = calloc((size_t)(MM * pm.Kp), sizeof(uint16_t));
        float *xs = malloc(sizeof(float) * MM * (size_t)(pm.Kp / 16)), *ya = malloc(sizeof(float) * MM * 16),
              *yb = malloc(sizeof(float) * MM * 16);
        for (int64_t m = 0; m < MM; m++)
            for (int64_t i = 0; i < uc->K; i++) x[m * pm.Kp + i] = mr_f32_to_bf16(tu_normal(&r) * (m % 3 ? 1.0f : 1e3f));
        for (int64_t i = 0; i < MM * (pm.Kp / 16); i++) xs[i] = 0.5f + tu_uniform(&r);
        for (int mi = 0; mi < (int)(sizeof Ms / sizeof Ms[0]); mi++)
            for (int withxs = 0; withxs < 2; withxs++) {
                const mr_uk_act a = {.x = x, .ldx = pm.Kp, .xs = withxs ? xs : NULL, .ldxs = pm.Kp / 16, .post = 0.75f};
                for (int64_t t = 0; t < pm.n_tiles; t++) {
                    kf.uk_gemv[uc->kind].fn(&pm, t, &a, Ms[mi], ya, 16, scratch);
                    kd.uk_gemv[uc->kind].fn(&pm, t, &a, Ms[mi], yb, 16, scratch);
                    for (int64_t i = 0; i < Ms[mi] * 16; i++)
                        if (memcmp(&ya[i], &yb[i], 4) != 0)
                            fail_msg("%s K %lld M %lld xs %d tile %lld y[%lld]: %.9g, %s %.9g", kf.uk_gemv[uc->kind].name,
                                     (long long)uc->K, (long long)Ms[mi], withxs, (long long)t, (long long)i, ya[i],
                                     kd.uk_gemv[uc->kind].name, yb[i]);
                }
            }
        mr_pmatrix_free(&pm);
        mr_qmatrix_free(&q);
        free(w), free(x), free(xs), free(ya), free(yb);
    }
    mr_aligned_free(scratch);
}

/* y[m][n] of x . W^T against a double reference on the dequantized row;
 * tolerance: exact products, fp32 sums in another order */
static void check_matmul_out(const mr_qmatrix *q, const float *x, int64_t M, const float *y) {
    const int64_t N = q->rows, K = q->cols;
    float *row = malloc(sizeof(float) * (size_t)K);
    for (int64_t n = 0; n < N; n++) {
        mr_qmatrix_dequant_row(q, n, row);
        for (int64_t m = 0; m < M; m++) {
            double ref = 0, mag = 0;
            for (int64_t i = 0; i < K; i++) ref += (double)row[i] * x[m * K + i], mag += fabs(row[i] * x[m * K + i]);
            if (!(fabs(y[m * N + n] - ref) <= 1e-5 * mag + 1e-30))
                fail_msg("fmt %d N %lld K %lld M %lld: y[%lld][%lld] = %.9g, reference %.9g", (int)q->fmt, (long long)N,
                         (long long)K, (long long)M, (long long)m, (long long)n, y[m * N + n], ref);
        }
    }
    free(row);
}

/* The matrix on the table's dense path on tiles (mr_qmatrix_tiles) where on is set and the table has
 * one for its format; off that path otherwise. Returns whether q->tiles is set. */
static bool dense_tiles(mr_qmatrix *q, mr_pmatrix *pm, bool on) {
    if (q->tiles) mr_pmatrix_free(pm), q->tiles = NULL;
    if (on) assert_int_equal(mr_qmatrix_tiles(q, pm), MR_OK);
    return q->tiles != NULL;
}

/* mr_matmul on every weight format: M = 1..9 (the small-M fast path's token
 * passes 1-4 and 5-8 and the driver past 8), shapes with partial 16-row and
 * 8-row blocks, K not a multiple of 128 / 32 / 16, and N crossing a 128-row
 * scale block; mr_matmul_multi on q/k/v-like matrices sharing x. Where the
 * table has a dense path on tiles, every case once more on it. */
static void test_matmul(void **st) {
    (void)st;
    const mr_format fmts[] = {MR_FMT_F32, MR_FMT_BF16, MR_FMT_FP8_BLOCK, MR_FMT_NVFP4};
    const int64_t shapes[][2] = {{300, 272}, {37, 130}, {141, 48}, {9, 7}, {19, 288}};
    tu_rng r = {77};
    const int64_t maxNK = 300 * 288, maxM = 9;
    float *w = malloc(sizeof(float) * maxNK), *x = malloc(sizeof(float) * maxM * 300),
          *y = malloc(sizeof(float) * maxM * 300);
    fill(&r, x, maxM * 300, 1.0f);
    for (size_t f = 0; f < 4; f++)
        for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
            const int64_t N = shapes[sh][0], K = shapes[sh][1];
            if (fmts[f] == MR_FMT_NVFP4 && K % 16) continue;
            fill(&r, w, N * K, 0.05f);
            mr_qmatrix q;
            mr_pmatrix pm;
            memset(&q, 0, sizeof q);
            assert_int_equal(mr_qmatrix_quantize(&q, fmts[f], w, N, K, 0.0f), MR_OK);
            for (int tl = 0; tl < 2; tl++) {
                if (dense_tiles(&q, &pm, tl) != tl) break;
                for (int64_t M = 1; M <= maxM; M++) {
                    for (int64_t i = 0; i < M * N; i++) y[i] = NAN;
                    mr_matmul(&q, x, M, y);
                    check_matmul_out(&q, x, M, y);
                }
            }
            dense_tiles(&q, &pm, false);
            mr_qmatrix_free(&q);
        }
    /* three matrices sharing x (K 200): rows 144 (crosses a scale block), 40, 17 */
    const int64_t K = 200, Ns[3] = {144, 40, 17};
    for (size_t f = 0; f < 4; f++) {
        if (fmts[f] == MR_FMT_NVFP4) continue;
        mr_qmatrix q[3];
        mr_pmatrix pm[3];
        const mr_qmatrix *qp[3];
        float *ys[3];
        for (int i = 0; i < 3; i++) {
            fill(&r, w, Ns[i] * K, 0.05f);
            memset(&q[i], 0, sizeof q[i]);
            assert_int_equal(mr_qmatrix_quantize(&q[i], fmts[f], w, Ns[i], K, 0.0f), MR_OK);
            qp[i] = &q[i];
            ys[i] = malloc(sizeof(float) * (size_t)(maxM * Ns[i]));
        }
        for (int tl = 0; tl < 2; tl++) {
            bool on = true;
            for (int i = 0; i < 3; i++) on = dense_tiles(&q[i], &pm[i], tl) == tl && on;
            if (!on) break;
            for (int64_t M = 1; M <= maxM; M += 3) {
                for (int i = 0; i < 3; i++)
                    for (int64_t j = 0; j < M * Ns[i]; j++) ys[i][j] = NAN;
                mr_matmul_multi(3, qp, x, M, ys);
                for (int i = 0; i < 3; i++) check_matmul_out(&q[i], x, M, ys[i]);
            }
        }
        for (int i = 0; i < 3; i++) dense_tiles(&q[i], &pm[i], false), mr_qmatrix_free(&q[i]), free(ys[i]);
    }
    free(w), free(x), free(y);
}

/* the tables this host can run, into k (5 at most): generic, AVX2
 * (vpmaddubsw), AVX2 with AVX-VNNI (vpdpbusd), AVX-512 without BF16 (pair
 * dots on FMAs), the process table; returns how many */
static int host_tables(mr_kernels k[5]) {
    const uint32_t a2 = mr_kernel_isa_features(MR_ISA_AVX2);
    const uint32_t levels[5] = {0, a2, a2 | MR_CPU_AVXVNNI, mr_kernel_isa_features(MR_ISA_AVX512), mr_cpu()->flags};
    int n = 0;
    for (int l = 0; l < 5; l++)
        if ((mr_cpu()->flags & levels[l]) == levels[l]) mr_kernels_init(&k[n++], levels[l]);
    return n;
}

/* ---- packed micro-kernels: every kind of every table this host can run,
 * gemv and gemm entries, against a double-precision reference on the
 * dequantized source rows and the kernel-input values. Shapes: N = 40 (a
 * partial last tile), one and two interleaved sources, K not a multiple of
 * the pack unit where the format allows, M = 1, 3, 9 (crosses the 8-token
 * register block), 20 (the gemm path) and 33 (three 11-token blocks). Tolerance as above: exact
 * products (fp32 products for BF16_F32), fp32 sums in another order,
 * |err| <= 1e-5 * sum |terms|. */

/* NVFP4_BF16 activations shaped so that a gemv on fixed-point input
 * (mr_uk_act.xq) meets every kind of block, tokens side by side meeting
 * different kinds: 16-k block b of token m by (b + m) % 4 as is (one part),
 * one value 2^-20 of the others (two parts), one 2^-40 (no form), all near
 * 2^-100 (no form: below 2^-82); FP8_BF16 ones so that a gemv on x * 2^112
 * (mr_uk_act.xd) meets blocks with and without that form */
static float fixq_shape(mr_uk_kind kind, int64_t m, int64_t i) {
    if (kind == MR_UK_FP8_BF16) /* every third 128-k block, one value >= 2^16 in even tokens: no xd form */
        return i / 128 % 3 == 2 && i % 128 == 7 && m % 2 == 0 ? 0x1p20f : 1.0f;
    if (kind != MR_UK_NVFP4_BF16) return 1.0f;
    switch ((i / 16 + m) % 4) {
    case 1: return i % 16 == 3 ? 0x1p-20f : 1.0f;
    case 2: return i % 16 == 5 ? 0x1p-40f : 1.0f;
    case 3: return 0x1p-100f;
    default: return 1.0f;
    }
}

/* y[m][d] of one tile against the double reference on the dequantized rows */
static void check_uk_tile(const char *name, const char *how, const mr_qmatrix *q, int nsrc, int64_t N, int64_t K,
                          int64_t Kp, int64_t M, int64_t t, const float *xv, const float *xs, int64_t nbk, int64_t blk,
                          float post, const float *y) {
    float *row = malloc(sizeof(float) * (size_t)K);
    for (int d = 0; d < 16; d++) {
        const int64_t n = 16 * (t / nsrc) + d;
        if (n < N) mr_qmatrix_dequant_row(&q[t % nsrc], n, row);
        for (int64_t m = 0; m < M; m++) {
            double ref = 0, mag = 0;
            for (int64_t i = 0; n < N && i < K; i++) {
                double p = (double)row[i] * xv[m * Kp + i] * xs[m * nbk + i / blk] * post;
                ref += p, mag += fabs(p);
            }
            if (!(fabs(y[m * 16 + d] - ref) <= 1e-5 * mag + 1e-30))
                fail_msg("%s%s: nsrc %d K %lld M %lld tile %lld row %d token %lld: %.9g, ref %.9g", name, how, nsrc,
                         (long long)K, (long long)M, (long long)t, d, (long long)m, y[m * 16 + d], ref);
        }
    }
    free(row);
}

static void check_uk(const mr_kernels *k, const ukcase *uc, int nsrc, int64_t M, bool gemm, bool use_xs, int xs_group) {
    const int64_t N = 40, K = uc->K;
    tu_rng r = {0x77 + (uint64_t)(uc->kind * 100 + nsrc * 10 + M)};
    mr_qmatrix q[2];
    float *w = malloc(sizeof(float) * (size_t)(N * K));
    for (int i = 0; i < nsrc; i++) {
        fill(&r, w, N * K, 0.1f);
        memset(&q[i], 0, sizeof q[i]);
        assert_int_equal(mr_qmatrix_quantize(&q[i], uc->fmt, w, N, K, 3.0f), MR_OK);
    }
    const mr_qmatrix *src[2] = {&q[0], &q[1]};
    mr_pmatrix pm; /* the pack this table's kernels take (uc->pack is the generic/AVX-512 one) */
    assert_int_equal(mr_pmatrix_pack(&pm, k->uk_pack[uc->kind], src, nsrc), MR_OK);
    const int64_t Kp = pm.Kp, blk = uc->kind == MR_UK_FP8_BF16 ? 128 : 16, nbk = (Kp + blk - 1) / blk;
    /* kernel input and the values it stands for (xv), zero past K */
    const bool i8 = uc->kind == MR_UK_NVFP4_I8, f32 = uc->kind == MR_UK_BF16_F32;
    void *x = calloc((size_t)(M * Kp), 4);
    float *xv = calloc((size_t)(M * Kp), sizeof(float)), *xs = malloc(sizeof(float) * (size_t)(M * nbk));
    int32_t *xb = calloc((size_t)(M * (Kp / 16 + 1)), sizeof(int32_t));
    for (int64_t m = 0; m < M; m++)
        for (int64_t i = 0; i < K; i++) {
            if (i8) {
                int8_t v = (int8_t)(tu_uniform(&r) * 254.0f - 127.0f);
                ((int8_t *)x)[m * Kp + i] = v;
                xv[m * Kp + i] = v;
                xb[m * (Kp / 16 + 1) + i / 16] -= 12 * v;
            } else if (f32) {
                ((float *)x)[m * Kp + i] = xv[m * Kp + i] = tu_normal(&r);
            } else {
                uint16_t b = mr_f32_to_bf16(tu_normal(&r) * fixq_shape(uc->kind, m, i));
                ((uint16_t *)x)[m * Kp + i] = b;
                xv[m * Kp + i] = mr_bf16_to_f32(b);
            }
        }
    for (int64_t i = 0; i < M * nbk; i++) xs[i] = use_xs ? 0.5f + tu_uniform(&r) : 1.0f;
    if (xs_group > 1) /* the promise of mr_uk_act.xs_group: equal over each run of xs_group blocks */
        for (int64_t m = 0; m < M; m++)
            for (int64_t b = 0; b < nbk; b++) xs[m * nbk + b] = xs[m * nbk + b / xs_group * xs_group];
    const float post = i8 ? 0.75f : 1.0f;
    mr_uk_act a = {.x = x, .ldx = Kp, .xs = use_xs ? xs : NULL, .ldxs = nbk, .xb = xb, .ldb = Kp / 16 + 1, .post = post,
                   .xs_group = xs_group};
    float *y = malloc(sizeof(float) * (size_t)(M * 16));
    void *scratch = mr_aligned_alloc(64, MR_UK_SCRATCH);
    const mr_uk_fn fn = gemm ? k->uk_gemm[uc->kind].fn : k->uk_gemv[uc->kind].fn;
    const char *name = gemm ? k->uk_gemm[uc->kind].name : k->uk_gemv[uc->kind].name;
    /* a table whose gemm kernels take x widened to fp32 (mr_uk_act.xw): the
     * same tiles with xw given (rows ldxw = Kp + 8 apart, NaN between) and x
     * replaced by NaN rows, so a kernel that reads x, or xw in the wrong
     * place, gives other bits */
    if (i8 || f32) /* xw is bf16 x widened: only the bf16-input kinds may take it */
        assert_false(k->uk_gemm_xw[uc->kind]);
    const bool wid = gemm && k->uk_gemm_xw[uc->kind];
    float *xw = wid ? malloc(sizeof(float) * (size_t)(M * (Kp + 8))) : NULL;
    uint16_t *xnan = wid ? malloc(sizeof(uint16_t) * (size_t)(M * Kp)) : NULL;
    float *yw = wid ? malloc(sizeof(float) * (size_t)(M * 16)) : NULL;
    for (int64_t m = 0; wid && m < M; m++)
        for (int64_t i = 0; i < Kp + 8; i++) {
            xw[m * (Kp + 8) + i] = i < Kp ? mr_bf16_to_f32(((uint16_t *)x)[m * Kp + i]) : NAN;
            if (i < Kp) xnan[m * Kp + i] = 0x7FC0;
        }
    mr_uk_act aw = a;
    aw.x = xnan, aw.xw = xw, aw.ldxw = Kp + 8;
    /* a table whose gemv takes x as fixed point (mr_uk_act.xq, made by the
     * table's xq_row): the same tiles with it, against the reference, and
     * again with x NaN in every block that has a fixed-point form (so the
     * kernel reads xq there and x only where m = 0): the same bits */
    if (!gemm && k->uk_gemv_xq[uc->kind]) assert_int_equal(uc->kind, MR_UK_NVFP4_BF16);
    const bool fq = !gemm && k->uk_gemv_xq[uc->kind];
    int16_t *xq = fq ? malloc(sizeof(int16_t) * (size_t)(2 * M * Kp)) : NULL;
    float *xqm = fq ? malloc(sizeof(float) * (size_t)(M * Kp / 16)) : NULL, *yq = fq ? malloc(sizeof(float) * (size_t)(M * 32)) : NULL;
    uint16_t *xqnan = fq ? malloc(sizeof(uint16_t) * (size_t)(M * Kp)) : NULL;
    int kinds[3] = {0, 0, 0}; /* blocks with m > 0, m < 0, m = 0 */
    for (int64_t m = 0; fq && m < M; m++) {
        k->xq_row.fn((const uint16_t *)x + m * Kp, Kp, xq + m * Kp, xq + (M + m) * Kp, xqm + m * (Kp / 16));
        for (int64_t i = 0; i < Kp; i++) {
            const float mb = xqm[m * (Kp / 16) + i / 16];
            xqnan[m * Kp + i] = mb != 0.0f ? 0x7FC0 : ((const uint16_t *)x)[m * Kp + i];
            if (i % 16 == 0) kinds[mb > 0.0f ? 0 : mb < 0.0f ? 1 : 2]++;
        }
    }
    if (fq && K >= 64) assert_true(kinds[0] > 0 && kinds[1] > 0 && kinds[2] > 0);
    mr_uk_act aq = a;
    aq.xq = xq, aq.xql = xq + M * Kp, aq.xqm = xqm, aq.ldxq = Kp, aq.ldxqm = Kp / 16;
    mr_uk_act aqn = aq;
    aqn.x = xqnan;
    /* a table whose fp8 kernels take x * 2^112 (mr_uk_act.xd, made by mr_uk_xd_row): the same tiles
     * with it, x NaN in every 128-k block where every token has that form (the kernel then reads
     * xd there, and x where a token lacks it): the same bits as without it */
    if (k->uk_xd[uc->kind]) assert_int_equal(uc->kind, MR_UK_FP8_BF16);
    const bool fd = k->uk_xd[uc->kind];
    const int64_t ldd = Kp + 8;
    float *xd = fd ? malloc(sizeof(float) * (size_t)(M * ldd)) : NULL, *yd = fd ? malloc(sizeof(float) * (size_t)(M * 16)) : NULL;
    uint16_t *xdnan = fd ? malloc(sizeof(uint16_t) * (size_t)(M * Kp)) : NULL;
    int dkinds[2] = {0, 0}; /* blocks read from x, from xd */
    for (int64_t m = 0; fd && m < M; m++) mr_uk_xd_row((const uint16_t *)x + m * Kp, Kp, xd + m * ldd);
    for (int64_t i = 0; fd && i < Kp; i++) {
        bool all = true;
        for (int64_t m = 0; m < M; m++) all &= !isnan(xd[m * ldd + i / 128 * 128]);
        for (int64_t m = 0; m < M; m++) xdnan[m * Kp + i] = all ? 0x7FC0 : ((const uint16_t *)x)[m * Kp + i];
        if (i % 128 == 0) dkinds[all]++;
    }
    if (fd && Kp >= 384) assert_true(dkinds[0] > 0 && dkinds[1] > 0);
    mr_uk_act ad = a;
    ad.x = xdnan, ad.xd = xd, ad.ldxd = ldd;
    for (int64_t t = 0; t < pm.n_tiles; t++) {
        for (int64_t i = 0; i < M * 16; i++) y[i] = NAN; /* never read */
        fn(&pm, t, &a, M, y, 16, scratch);
        if (wid) {
            fn(&pm, t, &aw, M, yw, 16, scratch);
            if (memcmp(y, yw, sizeof(float) * (size_t)(M * 16)) != 0)
                fail_msg("%s: nsrc %d K %lld M %lld tile %lld: the widened x (mr_uk_act.xw) gives other bits", name,
                         nsrc, (long long)K, (long long)M, (long long)t);
        }
        if (fd) {
            fn(&pm, t, &ad, M, yd, 16, scratch);
            if (memcmp(y, yd, sizeof(float) * (size_t)(M * 16)) != 0)
                fail_msg("%s: nsrc %d K %lld M %lld tile %lld: x * 2^112 from the caller (mr_uk_act.xd) gives other bits",
                         name, nsrc, (long long)K, (long long)M, (long long)t);
        }
        char how[64];
        snprintf(how, sizeof how, " (xs %d group %d)", use_xs, xs_group);
        check_uk_tile(name, how, q, nsrc, N, K, Kp, M, t, xv, xs, nbk, blk, post, y);
        if (fq) {
            fn(&pm, t, &aq, M, yq, 16, scratch);
            fn(&pm, t, &aqn, M, yq + M * 16, 16, scratch);
            snprintf(how, sizeof how, " on fixed-point x (xs %d)", use_xs);
            check_uk_tile(name, how, q, nsrc, N, K, Kp, M, t, xv, xs, nbk, blk, post, yq);
            if (memcmp(yq, yq + M * 16, sizeof(float) * (size_t)(M * 16)) != 0)
                fail_msg("%s: K %lld M %lld tile %lld: reads x where the block has a fixed-point form", name,
                         (long long)K, (long long)M, (long long)t);
        }
    }
    mr_pmatrix_free(&pm);
    for (int i = 0; i < nsrc; i++) mr_qmatrix_free(&q[i]);
    mr_aligned_free(scratch);
    free(w), free(x), free(xv), free(xs), free(xb), free(y), free(xw), free(xnan), free(yw);
    free(xq), free(xqm), free(yq), free(xqnan), free(xd), free(yd), free(xdnan);
}

static void test_packed_kernels_all_tables(void **st) {
    (void)st;
    static const ukcase cases[] = {
        {MR_UK_FP8_BF16, MR_FMT_FP8_BLOCK, MR_PACK_FP8_R16K4, 200},
        {MR_UK_FP8_BF16, MR_FMT_FP8_BLOCK, MR_PACK_FP8_R16K4, 384},
        {MR_UK_NVFP4_I8, MR_FMT_NVFP4, MR_PACK_NVFP4_R16K16, 80},
        {MR_UK_NVFP4_I8, MR_FMT_NVFP4, MR_PACK_NVFP4_R16K16, 256},
        {MR_UK_NVFP4_I8, MR_FMT_NVFP4, MR_PACK_NVFP4_R16K16, 336},
        {MR_UK_NVFP4_BF16, MR_FMT_NVFP4, MR_PACK_NVFP4_R16K16B, 80},
        {MR_UK_BF16_BF16, MR_FMT_BF16, MR_PACK_BF16_R16K2, 131},
        {MR_UK_BF16_F32, MR_FMT_BF16, MR_PACK_BF16_R16K2, 131},
    };
    mr_kernels tables[5];
    const int nt = host_tables(tables);
    for (int l = 0; l < nt; l++) {
        const mr_kernels k = tables[l];
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (int nsrc = 1; nsrc <= 2; nsrc++) {
                const int64_t Ms[] = {1, 3, 9, 20, 33}; /* 33: three blocks of 11 where a kernel takes 16 */
                for (int mi = 0; mi < 5; mi++)
                    for (int gemm = 0; gemm < 2; gemm++)
                        check_uk(&k, &cases[c], nsrc, Ms[mi], gemm, mi % 2 == 1 && cases[c].fmt != MR_FMT_BF16, 1);
            }
        /* NVFP4_I8 with xs shared per 128 columns (w4a8): a partial last run
         * (K 80, 336), and token counts across the 8- and 16-token blocks */
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            if (cases[c].kind != MR_UK_NVFP4_I8) continue;
            const int64_t Ms[] = {1, 2, 9, 16, 17, 33};
            for (int mi = 0; mi < 6; mi++)
                for (int gemm = 0; gemm < 2; gemm++) check_uk(&k, &cases[c], 2, Ms[mi], gemm, true, 8);
        }
    }
}

/* ---- the batch-invariant tables (mr_kernels_batch_invariant, --enable-deterministic-inference):
 * every table this host can run, and the AVX-512 ones with BF16 but without AMX (with and without
 * AVX512-FP16) where it has them, made batch-invariant. (1) Each kind's kernel gives token m of a
 * call of M tokens the bits of a call of that token alone, for M = 1 .. 40 across every register
 * block size, with and without the per-block multipliers (and w4a8's shared ones), x rows with
 * padding between them, the widened x or x * 2^112 where the kernel reads it (with tokens that
 * lack the latter in a block). (2) The reference checks of the
 * packed kernels above on the same tables, so an invariant entry left over from a level below that
 * takes another pack fails. The fastest tables fail (1) on the FMA levels (their gemv gives 1-4
 * tokens more accumulator chains; test_engine's deterministic test counts the logits that differ). */
static void tokens_alone(const mr_kernels *k, const ukcase *uc, bool use_xs, int xs_group) {
    enum { N = 32, MMAX = 40 };
    tu_rng r = {0x1A7 + (uint64_t)uc->kind * 31 + (uint64_t)xs_group};
    float *w = malloc(sizeof(float) * (size_t)(N * uc->K));
    fill(&r, w, N * uc->K, 0.1f);
    mr_qmatrix q;
    memset(&q, 0, sizeof q);
    assert_int_equal(mr_qmatrix_quantize(&q, uc->fmt, w, N, uc->K, 3.0f), MR_OK);
    const mr_qmatrix *src[1] = {&q};
    mr_pmatrix pm;
    assert_int_equal(mr_pmatrix_pack(&pm, k->uk_pack[uc->kind], src, 1), MR_OK);
    const bool i8 = uc->kind == MR_UK_NVFP4_I8, f32 = uc->kind == MR_UK_BF16_F32;
    const int64_t Kp = pm.Kp, ldx = Kp + 32, blk = uc->kind == MR_UK_FP8_BF16 ? 128 : 16, nbk = Kp / blk;
    const int64_t ldb = Kp / 16 + 3, ldw = ldx + 16; /* xw rows apart as the runner lays them (MR__XW_LD) */
    const size_t es = i8 ? 1 : f32 ? 4 : 2;
    char *x = calloc((size_t)(MMAX * ldx), es);
    float *xw = calloc((size_t)(MMAX * ldw), sizeof(float)), *xs = malloc(sizeof(float) * (size_t)(MMAX * nbk));
    int32_t *xb = calloc((size_t)(MMAX * ldb), sizeof(int32_t));
    for (int64_t m = 0; m < MMAX; m++)
        for (int64_t i = 0; i < uc->K; i++) {
            if (i8) {
                const int8_t v = (int8_t)(tu_uniform(&r) * 254.0f - 127.0f);
                ((int8_t *)x)[m * ldx + i] = v;
                xb[m * ldb + i / 16] -= 12 * v;
            } else if (f32) {
                ((float *)x)[m * ldx + i] = tu_normal(&r) * (m % 3 ? 1.0f : 300.0f);
            } else { /* and one value >= 2^16 in the second 128-k block of every fifth token (no xd form) */
                const uint16_t b = mr_f32_to_bf16(m % 5 == 4 && i == 130 ? 1e5f : tu_normal(&r) * (m % 3 ? 1.0f : 300.0f));
                ((uint16_t *)x)[m * ldx + i] = b;
                xw[m * ldw + i] = mr_bf16_to_f32(b);
            }
        }
    for (int64_t i = 0; i < MMAX * nbk; i++) xs[i] = 0.25f + tu_uniform(&r);
    if (xs_group > 1)
        for (int64_t m = 0; m < MMAX; m++)
            for (int64_t b = 0; b < nbk; b++) xs[m * nbk + b] = xs[m * nbk + b / xs_group * xs_group];
    const bool wid = k->uk_gemm_xw[uc->kind], fd = k->uk_xd[uc->kind]; /* the caller's x * 2^112 where taken */
    float *xd = calloc((size_t)(MMAX * ldw), sizeof(float));
    for (int64_t m = 0; fd && m < MMAX; m++) mr_uk_xd_row((const uint16_t *)x + m * ldx, Kp, xd + m * ldw);
    const mr_uk_fn fn = k->uk_gemm[uc->kind].fn;
    assert_ptr_equal(fn, k->uk_gemv[uc->kind].fn);
    float *y = malloc(sizeof(float) * MMAX * 16), y1[16];
    void *scratch = mr_aligned_alloc(64, MR_UK_SCRATCH);
    const int64_t Ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 16, 17, 24, 33, MMAX};
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
        for (int64_t t = 0; t < pm.n_tiles; t++) {
            const int64_t M = Ms[mi];
            const mr_uk_act a = {.x = x, .ldx = ldx, .xs = use_xs ? xs : NULL, .ldxs = nbk, .xb = xb, .ldb = ldb,
                                 .post = i8 ? 0.75f : 1.0f, .xs_group = xs_group, .xw = wid ? xw : NULL, .ldxw = ldw,
                                 .xd = fd ? xd : NULL, .ldxd = ldw};
            fn(&pm, t, &a, M, y, 16, scratch);
            for (int64_t m = 0; m < M; m++) {
                mr_uk_act a1 = a;
                a1.x = x + (size_t)(m * ldx) * es, a1.xb = xb + m * ldb;
                a1.xs = use_xs ? xs + m * nbk : NULL;
                a1.xw = wid ? xw + m * ldw : NULL;
                a1.xd = fd ? xd + m * ldw : NULL;
                fn(&pm, t, &a1, 1, y1, 16, scratch);
                if (memcmp(y1, y + m * 16, sizeof y1))
                    fail_msg("%s (%s table, xs %d group %d): tile %lld token %lld of %lld differs from the token alone",
                             k->uk_gemm[uc->kind].name, k->isa, use_xs, xs_group, (long long)t, (long long)m,
                             (long long)M);
            }
        }
    mr_pmatrix_free(&pm);
    mr_qmatrix_free(&q);
    mr_aligned_free(scratch);
    free(w), free(x), free(xw), free(xd), free(xs), free(xb), free(y);
}

static void test_batch_invariant_tables(void **st) {
    (void)st;
    static const ukcase cases[] = {
        {MR_UK_FP8_BF16, MR_FMT_FP8_BLOCK, MR_PACK_FP8_R16K4, 384},
        {MR_UK_NVFP4_I8, MR_FMT_NVFP4, MR_PACK_NVFP4_R16K16, 256},
        {MR_UK_NVFP4_BF16, MR_FMT_NVFP4, MR_PACK_NVFP4_R16K16B, 80},
        {MR_UK_BF16_BF16, MR_FMT_BF16, MR_PACK_BF16_R16K2, 131},
        {MR_UK_BF16_F32, MR_FMT_BF16, MR_PACK_BF16_R16K2, 131},
    };
    mr_kernels tables[7];
    int nt = host_tables(tables);
    const uint32_t a5b = mr_kernel_isa_features(MR_ISA_AVX512) | MR_CPU_AVX512BF16;
    if ((mr_cpu()->flags & a5b) == a5b) { /* vdpbf16ps without AMX, with the vdpbf16ps and the FMA fp8 gemm */
        mr_kernels_init(&tables[nt++], a5b);
        if (mr_cpu()->flags & MR_CPU_AVX512FP16) mr_kernels_init(&tables[nt++], a5b | MR_CPU_AVX512FP16);
    }
    for (int l = 0; l < nt; l++) {
        mr_kernels k = tables[l];
        mr_kernels_batch_invariant(&k);
        assert_true(k.batch_invariant);
        assert_int_equal(k.uk_gemm_min_m, 1);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            assert_false(k.uk_gemv_xq[cases[c].kind]);
            tokens_alone(&k, &cases[c], false, 1);
            if (cases[c].fmt != MR_FMT_BF16) tokens_alone(&k, &cases[c], true, 1);
            if (cases[c].kind == MR_UK_NVFP4_I8) tokens_alone(&k, &cases[c], true, 8);
            for (int64_t M = 1; M <= 33; M += 16) check_uk(&k, &cases[c], 2, M, true, cases[c].fmt != MR_FMT_BF16, 1);
        }
    }
}

/* mr_uk_xq_row_ref against its definition (kernels.h), computed here in
 * double: u = 2^(Fb - 141) from the block's largest exponent field; one part
 * where every x / u is an integer, two where every x / u * 2^15 is (q the
 * part toward zero), none where neither is, where the block holds Inf or NaN
 * or where Fb < 45 with some x nonzero; all zero: m = 1. Then every table's
 * xq_row against the reference, bit for bit. Rows mix blocks of every kind:
 * normal values, one value 2^-8 .. 2^-40 of the others, subnormal and tiny
 * values, zeros of both signs, Inf, NaN, and the largest finite bf16. */
static void xq_fill(tu_rng *r, uint16_t *x, int64_t n) {
    for (int64_t b = 0; b < n / 16; b++) {
        const int kind = (int)(tu_uniform(r) * 9.0f);
        const float base = ldexpf(1.0f, (int)(tu_uniform(r) * 60.0f) - 30);
        for (int i = 0; i < 16; i++) {
            float v = tu_normal(r) * base;
            if (kind == 1 && i == 7) v *= ldexpf(1.0f, -8 - (int)(tu_uniform(r) * 33.0f));
            if (kind == 2) v = (i & 1) ? 0.0f : -0.0f;
            if (kind == 3) v *= 0x1p-100f;
            if (kind == 4 && i == 2) v = 0x1p-130f * (1.0f + tu_uniform(r)); /* a bf16 subnormal */
            if (kind == 5 && i == 9) v = tu_uniform(r) < 0.5f ? INFINITY : NAN;
            if (kind == 6 && i == 0) v = 3.38e38f;
            x[16 * b + i] = mr_f32_to_bf16(v);
        }
    }
}

static void test_xq_row(void **st) {
    (void)st;
    enum { N = 16 * 512 };
    uint16_t *x = malloc(sizeof(uint16_t) * N);
    int16_t *q = malloc(sizeof(int16_t) * N), *ql = malloc(sizeof(int16_t) * N), *q2 = malloc(sizeof(int16_t) * N),
            *ql2 = malloc(sizeof(int16_t) * N);
    float *m = malloc(sizeof(float) * N / 16), *m2 = malloc(sizeof(float) * N / 16);
    tu_rng r = {0x5EED};
    int kinds[4] = {0, 0, 0, 0};
    for (int round = 0; round < 8; round++) {
        xq_fill(&r, x, N);
        mr_uk_xq_row_ref(x, N, q, ql, m);
        for (int64_t b = 0; b < N / 16; b++) {
            int F = 0, special = 0, nonzero = 0;
            for (int i = 0; i < 16; i++) {
                const float v = mr_bf16_to_f32(x[16 * b + i]);
                const int f = (x[16 * b + i] >> 7) & 0xFF;
                F = f > F ? f : F;
                special |= !isfinite(v);
                nonzero |= v != 0.0f;
            }
            const int Fb = F > 1 ? F : 1;
            const double u = ldexp(1.0, Fb - 141);
            int one = 1, two = 1;
            for (int i = 0; i < 16 && !special; i++) {
                const double t = mr_bf16_to_f32(x[16 * b + i]) / u; /* exact: a bf16 over a power of 2 */
                one &= t == trunc(t) && fabs(t) < 32768.0;
                two &= t * 32768.0 == trunc(t * 32768.0) && fabs(t) < 32768.0;
            }
            const int kind = !nonzero ? 3 : special || Fb < 45 ? 2 : one ? 0 : two ? 1 : 2;
            kinds[kind]++;
            const float want = kind == 3 ? 1.0f : kind == 2 ? 0.0f : (float)(kind == 1 ? -u : u);
            if (memcmp(&m[b], &want, 4) != 0)
                fail_msg("block %lld (F %d): m %g, the definition gives %g", (long long)b, F, m[b], want);
            for (int i = 0; i < 16; i++) {
                const double t = kind >= 2 ? 0.0 : mr_bf16_to_f32(x[16 * b + i]) / u, hi = trunc(t);
                if (q[16 * b + i] != hi || ql[16 * b + i] != (kind == 1 ? (t - hi) * 32768.0 : 0.0))
                    fail_msg("block %lld value %d (%g): q %d ql %d", (long long)b, i, mr_bf16_to_f32(x[16 * b + i]),
                             q[16 * b + i], ql[16 * b + i]);
            }
        }
        mr_kernels tables[5];
        const int nt = host_tables(tables);
        for (int l = 0; l < nt; l++) {
            tables[l].xq_row.fn(x, N, q2, ql2, m2);
            if (memcmp(q, q2, 2 * N) || memcmp(ql, ql2, 2 * N) || memcmp(m, m2, 4 * (N / 16)))
                fail_msg("%s: not the bits of mr_uk_xq_row_ref", tables[l].xq_row.name);
        }
    }
    for (int i = 0; i < 4; i++) assert_true(kinds[i] > 100); /* every kind met */
    free(x), free(q), free(ql), free(q2), free(ql2), free(m), free(m2);
}

/* mr_uk_xd_row against its definition (kernels.h), computed here in double:
 * a 128-value block whose |x| are all below 2^16 holds x * 2^112 exactly,
 * any other block NaN in its first value and nothing else written (the rest
 * keeps a sentinel). Blocks from xq_fill's rows (Inf, NaN, the largest bf16,
 * subnormals) and blocks whose largest value sits on either side of 2^16
 * (65280, the largest bf16 below it, and 65536). */
static void test_xd_row(void **st) {
    (void)st;
    enum { N = 128 * 64 };
    uint16_t *x = malloc(sizeof(uint16_t) * N);
    float *d = malloc(sizeof(float) * N);
    tu_rng r = {0xD0D0};
    int kinds[2] = {0, 0};
    for (int round = 0; round < 8; round++) {
        xq_fill(&r, x, N);
        for (int64_t b = 0; b < N / 128; b++) /* a third of the blocks: values near 2^16 */
            if (b % 3 == 0) {
                for (int i = 0; i < 128; i++) x[128 * b + i] = mr_f32_to_bf16(tu_normal(&r) * 1000.0f);
                x[128 * b + (b * 7) % 128] = (uint16_t)((b & 8 ? 0x8000 : 0) | (b & 4 ? 0x4780 : 0x477F));
            }
        const float sentinel = -12345.0f;
        for (int64_t i = 0; i < N; i++) d[i] = sentinel;
        mr_uk_xd_row(x, N, d);
        for (int64_t b = 0; b < N / 128; b++) {
            bool form = true;
            for (int i = 0; i < 128; i++) form &= fabs((double)mr_bf16_to_f32(x[128 * b + i])) < 65536.0; /* NaN: false */
            kinds[form]++;
            for (int i = 0; i < 128; i++) {
                const double want = form ? ldexp((double)mr_bf16_to_f32(x[128 * b + i]), 112) : i == 0 ? NAN : sentinel;
                const float got = d[128 * b + i];
                if (!(isnan(want) ? isnan(got) : (double)got == want))
                    fail_msg("block %lld value %d (%g): %g, the definition gives %g", (long long)b, i,
                             mr_bf16_to_f32(x[128 * b + i]), got, want);
            }
        }
    }
    assert_true(kinds[0] > 20 && kinds[1] > 20); /* both kinds met */
    free(x), free(d);
}

/* The NVFP4_BF16 gemv of every table that takes fixed-point x, on one-block
 * rows (K = 16, global scale 1) against their exact sum (in double: at most
 * 16 products of 15 significant bits over a span below 2^40): a block in one
 * part sums exactly, so y is that sum rounded once, bit for bit; in two parts
 * the two exact sums are joined in fp32, then scaled: two roundings, so
 * within 2^-22 of it (a low part taken at the wrong weight is off by up to
 * 2^-15); a block with no form runs on fp32 FMAs (check_uk's tolerance).
 * 1 and 2 tokens. */
static void test_nvfp4_fixq_exact_blocks(void **st) {
    (void)st;
    enum { N = 16, K = 16, MM = 2, ROUNDS = 300 };
    mr_kernels tables[5];
    const int nt = host_tables(tables);
    int fixq = 0;
    for (int l = 0; l < nt; l++) fixq += tables[l].uk_gemv_xq[MR_UK_NVFP4_BF16];
    if (!fixq) {
        print_message("SKIPPED: no kernel table of this host (or MOERUN_CPU_MASK) takes fixed-point x\n");
        skip();
    }
    tu_rng r = {0xF1C5};
    float *w = malloc(sizeof(float) * N * K), row[K];
    uint16_t x[MM * K];
    int16_t q[2 * MM * K];
    float xqm[MM], y[MM * 16], *scratch = mr_aligned_alloc(64, MR_UK_SCRATCH);
    for (int l = 0; l < nt; l++) {
        const mr_kernels k = tables[l];
        if (!k.uk_gemv_xq[MR_UK_NVFP4_BF16]) continue;
        int parts[3] = {0, 0, 0};
        for (int round = 0; round < ROUNDS; round++) {
            fill(&r, w, N * K, 1.0f);
            mr_qmatrix qm;
            memset(&qm, 0, sizeof qm);
            assert_int_equal(mr_qmatrix_quantize(&qm, MR_FMT_NVFP4, w, N, K, 0.0f), MR_OK);
            qm.scale2 = 1.0f;
            const mr_qmatrix *src[1] = {&qm};
            mr_pmatrix pm;
            assert_int_equal(mr_pmatrix_pack(&pm, k.uk_pack[MR_UK_NVFP4_BF16], src, 1), MR_OK);
            for (int m = 0; m < MM; m++)
                for (int i = 0; i < K; i++) {
                    float v = tu_normal(&r);
                    if ((round + m) % 3 == 1 && i == (round % 16)) v *= ldexpf(1.0f, -8 - round % 24);
                    x[m * K + i] = mr_f32_to_bf16(v);
                }
            for (int m = 0; m < MM; m++) k.xq_row.fn(x + m * K, K, q + m * K, q + (MM + m) * K, xqm + m);
            for (int64_t M = 1; M <= MM; M++) {
                const mr_uk_act a = {.x = x, .ldx = K, .post = 1.0f, .xq = q, .xql = q + MM * K, .xqm = xqm,
                                     .ldxq = K, .ldxqm = 1};
                k.uk_gemv[MR_UK_NVFP4_BF16].fn(&pm, 0, &a, M, y, 16, scratch);
                for (int d = 0; d < N; d++) {
                    mr_qmatrix_dequant_row(&qm, d, row);
                    for (int m = 0; m < M; m++) {
                        double ref = 0, mag = 0;
                        for (int i = 0; i < K; i++) {
                            ref += (double)row[i] * mr_bf16_to_f32(x[m * K + i]);
                            mag += fabs((double)row[i] * mr_bf16_to_f32(x[m * K + i]));
                        }
                        const float want = (float)ref;
                        const int kind = xqm[m] > 0.0f ? 0 : xqm[m] < 0.0f ? 1 : 2;
                        if (M == 1 && d == 0) parts[kind]++;
                        const double err = fabs(y[m * 16 + d] - ref);
                        if (kind == 0 ? memcmp(&y[m * 16 + d], &want, 4) != 0
                                      : !(err <= (kind == 1 ? 0x1p-22 * fabs(ref) : 1e-5 * mag)))
                            fail_msg("%s: round %d M %lld row %d token %d (%s): %.9g, the exact sum rounded %.9g",
                                     k.uk_gemv[MR_UK_NVFP4_BF16].name, round, (long long)M, d, m,
                                     kind == 0 ? "one part" : kind == 1 ? "two parts" : "no form", y[m * 16 + d], want);
                    }
                }
            }
            mr_pmatrix_free(&pm);
            mr_qmatrix_free(&qm);
        }
        assert_true(parts[0] > 20 && parts[1] > 20 && parts[2] > 5);
    }
    free(w);
    mr_aligned_free(scratch);
}

/* All 256 E4M3 codes through every table's FP8 kernels: W[d][k] = code,
 * block multiplier 1, x = one-hot bf16 rows (token m has v at k = m):
 * y[m][d] must equal mr_e4m3_to_f32(W[d][m]) * v exactly (NaN for NaN
 * codes), for v = 1, the largest bf16 below 2^16 and 2^16 (the AVX2 gemv
 * scales x by 2^112 below 2^16 and takes another decode from there). Twice:
 * with the subnormal codes (the pack marks the block, mr_pmatrix.tsub: the
 * AVX2 kernels decode it without fp32 subnormals) and with all but
 * MR_PACK_FP8_SUBNORMALS - 1 of them set to zero (not marked: the fast
 * decode, exact on fp32 subnormals too); where the table takes x * 2^112
 * from the caller (mr_uk_act.xd), with and without it. */
static void test_fp8_kernels_all_codes(void **st) {
    (void)st;
    const int64_t N = 16, K = 128;
    uint8_t codes[16 * 128];
    float one = 1.0f;
    /* NaN codes would poison every sum through 0 * NaN: they get their own check below */
    for (int i = 0; i < 16 * 128; i++) {
        codes[i] = (uint8_t)(i * 7 + i / 256);
        if ((codes[i] & 0x7F) == 0x7F) codes[i] = (uint8_t)(codes[i] & 0x80);
    }
    mr_qmatrix q = {.fmt = MR_FMT_FP8_BLOCK, .rows = N, .cols = K, .data = codes, .scale = &one, .scale2 = 1.0f};
    const mr_qmatrix *src[1] = {&q};
    mr_pmatrix pm;
    uint16_t *x = calloc(128 * 128, 2);
    float *y = malloc(sizeof(float) * 128 * 16), *xd = malloc(sizeof(float) * 128 * 128);
    void *scratch = mr_aligned_alloc(64, MR_UK_SCRATCH);
    int seen[256] = {0};
    /* generic, AVX2, AVX-512 without BF16, the process table */
    uint32_t levels[4] = {0, mr_kernel_isa_features(MR_ISA_AVX2), mr_kernel_isa_features(MR_ISA_AVX512),
                          mr_cpu()->flags};
    static const uint16_t xvals[3] = {0x3F80, 0x477F, 0x4780};
    for (int li = 0; li < 24; li++) {
        const int l = li / 3 % 4, nosub = li >= 12;
        if (li == 12) /* fewer subnormal codes than the pack marks a block for: the fast decode */
            for (int i = 0, n_sub = 0; i < 16 * 128; i++)
                if ((codes[i] & 0x78) == 0 && (codes[i] & 7) && ++n_sub >= MR_PACK_FP8_SUBNORMALS) codes[i] &= 0x80;
        const float xv = mr_bf16_to_f32(xvals[li % 3]);
        for (int m = 0; m < 128; m++) x[m * 128 + m] = xvals[li % 3];
        if ((mr_cpu()->flags & levels[l]) != levels[l]) continue;
        mr_kernels k;
        mr_kernels_init(&k, levels[l]);
        assert_int_equal(mr_pmatrix_pack(&pm, k.uk_pack[MR_UK_FP8_BF16], src, 1), MR_OK);
        assert_false(pm.has_nan);
        assert_int_equal(pm.tsub[0], !nosub);
        /* where the table's kernels take x * 2^112 (mr_uk_act.xd), once with it too */
        for (int m = 0; m < 128; m++) mr_uk_xd_row(x + m * 128, 128, xd + m * 128);
        for (int v = 0; v < (k.uk_xd[MR_UK_FP8_BF16] ? 4 : 2); v++) {
            const int gemm = v & 1;
            mr_uk_act a = {.x = x, .ldx = 128, .post = 1.0f, .xd = v & 2 ? xd : NULL, .ldxd = 128};
            (gemm ? k.uk_gemm : k.uk_gemv)[MR_UK_FP8_BF16].fn(&pm, 0, &a, 128, y, 16, scratch);
            for (int m = 0; m < 128; m++)
                for (int d = 0; d < 16; d++) {
                    uint8_t c = codes[d * 128 + m];
                    float want = mr_e4m3_to_f32(c) * xv, got = y[m * 16 + d];
                    seen[c] = 1;
                    if (isnan(want) ? !isnan(got) : got != want)
                        fail_msg("%s: code 0x%02X x %g gives %.9g, want %.9g", (gemm ? k.uk_gemm : k.uk_gemv)[MR_UK_FP8_BF16].name,
                                 c, xv, got, want);
                }
        }
        mr_pmatrix_free(&pm);
    }
    for (int c = 0; c < 256; c++) assert_true(seen[c] || (c & 0x7F) == 0x7F);
    for (int m = 0; m < 128; m++) x[m * 128 + m] = 0x3F80;
    /* the NaN codes decode to NaN (gemv and gemm), and only where they are
     * (0 * NaN poisons a row's sum): rows 0-7 hold one NaN code (0x7F or
     * 0xFF, at k = 3d), rows 8-15 only 1.0 (0x38) */
    for (int d = 0; d < 16; d++)
        for (int k = 0; k < 128; k++) codes[d * 128 + k] = d < 8 && k == 3 * d ? (d & 1 ? 0xFF : 0x7F) : 0x38;
    for (int l = 0; l < 4; l++) {
        if ((mr_cpu()->flags & levels[l]) != levels[l]) continue;
        mr_kernels k;
        mr_kernels_init(&k, levels[l]);
        assert_int_equal(mr_pmatrix_pack(&pm, k.uk_pack[MR_UK_FP8_BF16], src, 1), MR_OK);
        assert_true(pm.has_nan);
        for (int gemm = 0; gemm < 2; gemm++) {
            mr_uk_act a = {.x = x, .ldx = 128, .post = 1.0f};
            (gemm ? k.uk_gemm : k.uk_gemv)[MR_UK_FP8_BF16].fn(&pm, 0, &a, 20, y, 16, scratch);
            for (int m = 0; m < 20; m++) /* token m reads k = m only */
                for (int d = 0; d < 16; d++) {
                    const bool nan = d < 8;
                    if (nan ? !isnan(y[m * 16 + d]) : y[m * 16 + d] != 1.0f)
                        fail_msg("%s: NaN codes: token %d row %d gives %g", (gemm ? k.uk_gemm : k.uk_gemv)[MR_UK_FP8_BF16].name,
                                 m, d, y[m * 16 + d]);
                }
        }
        mr_pmatrix_free(&pm);
    }
    mr_aligned_free(scratch);
    free(x), free(y), free(xd);
}

/* Every pack of every format against its source: the scalar block decoders
 * of pack.c (which the generic driver runs on any pack) give back the
 * dequantized source rows exactly, padding rows and columns give 0, and the
 * NVFP4 row scales are the source's. Shapes with a partial last tile and K
 * not a multiple of the pack unit. */
static void test_pack_layouts(void **st) {
    (void)st;
    static const struct {
        mr_format fmt;
        mr_pack_id pack;
        int64_t N, K;
    } c[] = {
        {MR_FMT_FP8_BLOCK, MR_PACK_FP8_R16K4, 40, 200},   {MR_FMT_FP8_BLOCK, MR_PACK_FP8_Y16, 40, 200},
        /* K % 128 == 0: the full tiles take the SSE2 form, the last the byte-wise one */
        {MR_FMT_FP8_BLOCK, MR_PACK_FP8_R16K4, 40, 384},   {MR_FMT_FP8_BLOCK, MR_PACK_FP8_Y16, 40, 384},
        {MR_FMT_NVFP4, MR_PACK_NVFP4_R16K16, 40, 80},     {MR_FMT_NVFP4, MR_PACK_NVFP4_R16K16B, 40, 80},
        {MR_FMT_NVFP4, MR_PACK_NVFP4_Y16I, 40, 80},       {MR_FMT_NVFP4, MR_PACK_NVFP4_Y16F, 40, 80},
        {MR_FMT_BF16, MR_PACK_BF16_R16K2, 40, 131},
    };
    tu_rng r = {4242};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        const int64_t N = c[i].N, K = c[i].K;
        float *w = malloc(sizeof(float) * (size_t)(N * K)), *row = malloc(sizeof(float) * (size_t)K);
        fill(&r, w, N * K, 1.0f);
        mr_qmatrix q;
        memset(&q, 0, sizeof q);
        assert_int_equal(mr_qmatrix_quantize(&q, c[i].fmt, w, N, K, 0.0f), MR_OK);
        const mr_qmatrix *src[1] = {&q};
        mr_pmatrix pm;
        assert_int_equal(mr_pmatrix_pack(&pm, c[i].pack, src, 1), MR_OK);
        const int64_t Kp = pm.Kp, blk = c[i].fmt == MR_FMT_FP8_BLOCK ? 128 : c[i].fmt == MR_FMT_NVFP4 ? 16 : 64;
        float *b = malloc(sizeof(float) * 128 * 16), sc[16];
        for (int64_t t = 0; t < pm.n_tiles; t++) {
            const uint8_t *tile = pm.data + (size_t)t * pm.tile_bytes;
            for (int64_t k0 = 0; k0 < Kp; k0 += blk) {
                const int64_t nk = Kp - k0 < blk ? Kp - k0 : blk;
                if (c[i].fmt == MR_FMT_FP8_BLOCK) mr__pk_fp8_block_f32(&pm, tile, k0 / 128, b);
                else if (c[i].fmt == MR_FMT_NVFP4) mr__pk_nvfp4_block_f32(&pm, tile, k0 / 16, b, sc);
                else mr__pk_bf16_pairs_f32(tile, k0 / 2, (int)(nk / 2), b);
                for (int d = 0; d < 16; d++) {
                    const int64_t n = 16 * t + d;
                    if (n < N) mr_qmatrix_dequant_row(&q, n, row);
                    for (int64_t k = 0; k < nk; k++) {
                        float want = n < N && k0 + k < K ? row[k0 + k] : 0.0f, got = b[k * 16 + d];
                        if (c[i].fmt == MR_FMT_FP8_BLOCK) got *= pm.tscale[t * (Kp / 128) + k0 / 128];
                        if (c[i].fmt == MR_FMT_NVFP4) got *= sc[d] * pm.scale2; /* e2m1 * (sc * scale2), ModelOpt order */
                        if (got != want)
                            fail_msg("pack %s: tile %lld row %d k %lld: %.9g, source %.9g", mr_pack_name(c[i].pack),
                                     (long long)t, d, (long long)(k0 + k), got, want);
                    }
                }
            }
        }
        mr_pmatrix_free(&pm);
        mr_qmatrix_free(&q);
        free(w), free(row), free(b);
    }
}

/* The FP8 packs' flags against the source: mr_pmatrix.tsub of each tile and 128-k block is whether
 * its 16 x 128 codes hold MR_PACK_FP8_SUBNORMALS or more E4M3 subnormals (counted here from the
 * source), and has_nan whether any code is a NaN. Shapes whose full tiles take the SSE2 form (K %
 * 128 == 0) and whose last tile, or every tile (K % 128 != 0), does not; subnormal counts drawn
 * around the threshold per block; one NaN code in a full tile, in the last tile, or none; both
 * layouts, one source and two (gate / up interleaved). */
static void test_pack_fp8_flags(void **st) {
    (void)st;
    const mr_pack_id packs[] = {MR_PACK_FP8_R16K4, MR_PACK_FP8_Y16};
    const int64_t shapes[][2] = {{40, 384}, {32, 256}, {40, 200}, {16, 128}};
    tu_rng r = {77};
    int marked = 0, unmarked = 0;
    for (size_t pi = 0; pi < 2; pi++)
        for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
            for (int nanat = 0; nanat < 3; nanat++)
                for (int nsrc = 1; nsrc <= 2; nsrc++) {
                    const int64_t N = shapes[sh][0], K = shapes[sh][1], nkb = (K + 127) / 128;
                    uint8_t *codes[2];
                    float scales[2][4 * 4];
                    mr_qmatrix q[2];
                    const mr_qmatrix *src[2] = {&q[0], &q[1]};
                    for (int i = 0; i < nsrc; i++) {
                        codes[i] = malloc((size_t)(N * K));
                        for (int64_t e = 0; e < N * K; e++) {
                            uint8_t c = (uint8_t)(tu_next(&r) >> 24);
                            c = (uint8_t)(c | 0x08);              /* a normal code ... */
                            if ((c & 0x7F) == 0x7F) c = (uint8_t)(c ^ 1); /* ... not NaN */
                            codes[i][e] = c;
                        }
                        /* per 16 x 128 block: a subnormal count around the threshold */
                        for (int64_t t = 0; t < (N + 15) / 16; t++)
                            for (int64_t kb = 0; kb < nkb; kb++) {
                                const int want = (int)(tu_next(&r) % 3) + MR_PACK_FP8_SUBNORMALS - 1;
                                for (int j = 0; j < want; j++) {
                                    const int64_t n = 16 * t + (int64_t)(tu_next(&r) % 16), k = 128 * kb + (int64_t)(tu_next(&r) % 128);
                                    if (n < N && k < K) codes[i][n * K + k] = (uint8_t)(1 + tu_next(&r) % 7) | (j & 1 ? 0x80 : 0);
                                }
                            }
                        for (int j = 0; j < 16; j++) scales[i][j] = 1.0f;
                        q[i] = (mr_qmatrix){.fmt = MR_FMT_FP8_BLOCK, .rows = N, .cols = K, .data = codes[i],
                                            .scale = scales[i], .scale2 = 1.0f};
                    }
                    if (nanat == 1) codes[nsrc - 1][3 * K + 5] = 0xFF;         /* row 3: the first tile */
                    if (nanat == 2) codes[0][(N - 1) * K + K - 1] = 0x7F;      /* the last row */
                    mr_pmatrix pm;
                    assert_int_equal(mr_pmatrix_pack(&pm, packs[pi], src, nsrc), MR_OK);
                    assert_int_equal(pm.has_nan, nanat != 0);
                    for (int64_t t = 0; t < pm.n_tiles; t++)
                        for (int64_t kb = 0; kb < nkb; kb++) {
                            const uint8_t *c = codes[t % nsrc];
                            int n_sub = 0;
                            for (int64_t n = 16 * (t / nsrc); n < 16 * (t / nsrc) + 16 && n < N; n++)
                                for (int64_t k = 128 * kb; k < 128 * kb + 128 && k < K; k++)
                                    n_sub += (c[n * K + k] & 0x78) == 0 && (c[n * K + k] & 0x07) != 0;
                            const bool want = n_sub >= MR_PACK_FP8_SUBNORMALS;
                            if (pm.tsub[t * nkb + kb] != want)
                                fail_msg("pack %s [%lld][%lld] x %d: tile %lld block %lld has %d subnormal codes, tsub %d",
                                         mr_pack_name(packs[pi]), (long long)N, (long long)K, nsrc, (long long)t,
                                         (long long)kb, n_sub, pm.tsub[t * nkb + kb]);
                            marked += want, unmarked += !want;
                        }
                    mr_pmatrix_free(&pm);
                    for (int i = 0; i < nsrc; i++) free(codes[i]);
                }
    assert_true(marked > 20 && unmarked > 20);
}

/* Bad input to the packer: a clear error, nothing allocated left behind. */
static void test_pack_errors(void **st) {
    (void)st;
    float w[32 * 48];
    for (int i = 0; i < 32 * 48; i++) w[i] = (float)(i % 13) - 6.0f;
    mr_qmatrix a, b;
    memset(&a, 0, sizeof a), memset(&b, 0, sizeof b);
    assert_int_equal(mr_qmatrix_quantize(&a, MR_FMT_NVFP4, w, 32, 48, 0.0f), MR_OK);
    assert_int_equal(mr_qmatrix_quantize(&b, MR_FMT_NVFP4, w, 16, 48, 0.0f), MR_OK);
    const mr_qmatrix *src[2] = {&a, &b};
    mr_pmatrix pm;
    assert_int_equal(mr_pmatrix_pack(&pm, MR_PACK_FP8_R16K4, src, 1), MR_EINVAL); /* wrong format */
    assert_int_equal(mr_pmatrix_pack(&pm, MR_PACK_NVFP4_R16K16, src, 2), MR_EINVAL); /* shapes differ */
    assert_non_null(strstr(mr_error_last(), "shape"));
    assert_null(pm.data);
    b.rows = 32;
    b.scale2 = a.scale2 * 2.0f;
    assert_int_equal(mr_pmatrix_pack(&pm, MR_PACK_NVFP4_R16K16, src, 2), MR_EFORMAT); /* scale2 differs */
    b.rows = 16;
    mr_qmatrix_free(&a), mr_qmatrix_free(&b);
}

/* ---- activation preparation of the packed path (actmode.c; AVX-512 forms in
 * actq_avx512.c) against the formats/ reference quantizers, bit for bit ---- */
static float u2f_(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A group whose scaled values sit exactly on rounding midpoints (used with
 * input_scale 1): kind 0, w8a8: amax 448 so s = 1 and x/s = x, values halfway
 * between E4M3 neighbours (normal and subnormal); kind 1, w4a4: each 16-block
 * has vmax 6 so the block scale is 1 and x*os = x, values on the E2M1
 * thresholds 0.25 .. 5; kind 2, w4a8: amax 127 so s = 1, values k + 0.5;
 * kind 3: all zero (the 1e-10 floor). */
static void tie_group(tu_rng *r, float *x, int64_t len, int kind) {
    static const float e2[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    for (int64_t i = 0; i < len; i++) {
        const float sg = (tu_next(r) & 1) ? -1.0f : 1.0f;
        const uint64_t u = tu_next(r);
        switch (kind % 4) {
        case 0: /* (2m+1)/16 in [1,2) times 2^e, e in -6..7; or (2m+1) * 2^-10 (subnormal midpoints) */
            x[i] = sg * ((u & 1) ? (float)(2 * (int)(u >> 8 & 7) + 17) / 16.0f * ldexpf(1.0f, (int)(u >> 16 & 15) - 7 > 7 ? 7 : (int)(u >> 16 & 15) - 6)
                                 : (float)(2 * (int)(u >> 8 & 7) + 1) * ldexpf(1.0f, -10));
            if (i == 0) x[i] = 448.0f;
            break;
        case 1: x[i] = i % 16 == 0 ? 6.0f : sg * e2[u % 7]; break;
        case 2: x[i] = i == 0 ? 127.0f : sg * ((float)(u % 127) + 0.5f); break;
        default: x[i] = 0.0f;
        }
    }
}

/* rows that hit every branch: N(0,s) at several scales, all-zero and tiny
 * groups (E4M3 subnormals, the 1e-10 floor), huge values (the clamps), exact
 * bf16 ties, and (special = true) NaN and inf in single groups */
static void act_row(tu_rng *r, float *x, int64_t n, int variant, bool special) {
    const float sc[4] = {1.0f, 1e-3f, 300.0f, 1e-7f};
    for (int64_t i = 0; i < n; i++) x[i] = tu_normal(r) * sc[(i / 128 + variant) % 4];
    if (n > 256) {
        for (int64_t i = 128; i < 144; i++) x[i] = 0.0f;
        for (int64_t i = 144; i < 160; i++) x[i] = -0.0f;
        for (int64_t i = 160; i < 176; i++) x[i] = (float)(i - 168) * 1e-12f;
        for (int64_t i = 176; i < 192; i++) x[i] = u2f_(((uint32_t)tu_next(r) & 0x80000000u) | 0x3F808000u | (uint32_t)(i & 1) << 16); /* bf16 ties */
        for (int64_t i = 192; i < 200; i++) x[i] = (i & 1 ? -1.0f : 1.0f) * 3e38f;
    }
    if (variant == 4) /* exact ties of every rounding: see tie_group */
        for (int64_t g0 = 0; g0 < n; g0 += 128) tie_group(r, x + g0, n - g0 < 128 ? n - g0 : 128, (int)(g0 / 128));
    if (special && n > 512) {
        x[300] = NAN;
        x[420] = INFINITY;
        x[421] = -INFINITY;
    }
}

static void expect_row(mr_act_mode m, const float *x, int64_t n, float is, uint8_t *dst, float *xs, int32_t *xb) {
    uint16_t *d16 = (uint16_t *)dst;
    int8_t *d8 = (int8_t *)dst;
    switch (m) {
    case MR_ACT_W16A16:
    case MR_ACT_W8A16:
    case MR_ACT_W4A16:
        for (int64_t i = 0; i < n; i++) d16[i] = mr_f32_to_bf16(x[i]);
        for (int64_t g = 0; g < (n + 127) / 128; g++) xs[g] = 1.0f;
        break;
    case MR_ACT_W8A8: {
        uint8_t *q = malloc((size_t)n);
        mr_fp8_act_quantize_row_ref(x, n, q, xs);
        for (int64_t i = 0; i < n; i++) d16[i] = mr_f32_to_bf16(mr_e4m3_to_f32(q[i]));
        free(q);
        break;
    }
    case MR_ACT_W4A4: {
        uint8_t *q = malloc((size_t)n / 2), *sc = malloc((size_t)n / 16);
        mr_nvfp4_act_quantize_row_ref(x, n, is, q, sc);
        for (int64_t j = 0; j < n / 16; j++) {
            int32_t s = 0;
            for (int i = 0; i < 16; i++) {
                const int64_t e = 16 * j + i;
                d8[e] = (int8_t)(2.0f * mr_e2m1_to_f32((uint8_t)((q[e / 2] >> (4 * (e & 1))) & 15)));
                s += d8[e];
            }
            xs[j] = 0.5f * mr_e4m3_to_f32(sc[j]);
            xb[j] = -12 * s;
        }
        free(q), free(sc);
        break;
    }
    case MR_ACT_W4A8: /* docs/activation-modes.md: symmetric int8 per 128, s = max(amax, 1e-10)/127 */
        for (int64_t g0 = 0; g0 < n; g0 += 128) {
            const int64_t len = n - g0 < 128 ? n - g0 : 128;
            float amax = 0.0f;
            for (int64_t i = 0; i < len; i++)
                if (fabsf(x[g0 + i]) > amax) amax = fabsf(x[g0 + i]); /* NaN never wins */
            const float s = (amax > 1e-10f ? amax : 1e-10f) / 127.0f;
            for (int64_t i = 0; i < len; i++) {
                const float v = rintf(x[g0 + i] / s);
                d8[g0 + i] = (int8_t)(isnan(v) ? -127.0f : v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
            }
            for (int64_t j = g0 / 16; j < (g0 + len) / 16; j++) {
                int32_t sum = 0;
                for (int i = 0; i < 16; i++) sum += d8[16 * j + i];
                xs[j] = s;
                xb[j] = -12 * sum;
            }
        }
        break;
    default: fail();
    }
}

static void test_act_prepare_bit_exact(void **st) {
    (void)st;
    static const mr_act_mode modes[] = {MR_ACT_W16A16, MR_ACT_W8A16, MR_ACT_W4A16, MR_ACT_W8A8, MR_ACT_W4A4, MR_ACT_W4A8};
    static const int64_t ns[] = {3072, 1536, 128, 48, 1040, 200};
    tu_rng r = {0x5eed};
    enum { NMAX = 3072 };
    float *x = malloc(NMAX * sizeof(float));
    uint8_t *d = malloc(NMAX * 2), *e = malloc(NMAX * 2);
    float *xs = malloc(NMAX / 16 * sizeof(float)), *exs = malloc(NMAX / 16 * sizeof(float));
    int32_t *xb = malloc(NMAX / 16 * 4), *exb = malloc(NMAX / 16 * 4);
    int checked = 0;
    for (size_t mi = 0; mi < sizeof modes / sizeof *modes; mi++) {
        const mr_act_mode m = modes[mi];
        const bool i8 = m == MR_ACT_W4A4 || m == MR_ACT_W4A8;
        const size_t es = i8 ? 1 : 2;
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
            const int64_t n = ns[ni];
            if (i8 && n % 16) continue;
            for (int v = 0; v < 8; v++) {
                act_row(&r, x, n, v, v >= 6);
                const float is = v == 5 ? 0.0f : v == 4 ? 1.0f : 1.0f / (float)(1 + v * 500); /* 0: all codes 0 */
                const int64_t nx = i8 ? n / 16 : (n + 127) / 128;
                memset(d, 0xAB, NMAX * 2), memset(e, 0xCD, NMAX * 2);
                memset(xs, 0xAB, NMAX / 16 * 4), memset(exs, 0xCD, NMAX / 16 * 4);
                memset(xb, 0xAB, NMAX / 16 * 4), memset(exb, 0xCD, NMAX / 16 * 4);
                mr__act_prepare_uk_row(m, x, n, is, d, xs, xb);
                expect_row(m, x, n, is, e, exs, exb);
                if (memcmp(d, e, (size_t)n * es) || memcmp(xs, exs, (size_t)nx * 4) ||
                    (i8 && memcmp(xb, exb, (size_t)nx * 4))) {
                    for (int64_t i = 0; i < n; i++)
                        if (memcmp(d + (size_t)i * es, e + (size_t)i * es, es)) {
                            print_error("mode %s n %lld variant %d: element %lld x = %a differs\n", mr_act_mode_name(m),
                                        (long long)n, v, (long long)i, (double)x[i]);
                            break;
                        }
                    fail_msg("mode %s n %lld variant %d: prepared row differs from the formats/ reference",
                             mr_act_mode_name(m), (long long)n, v);
                }
                checked++;
            }
        }
    }
    assert_true(checked > 200);
    free(x), free(d), free(e), free(xs), free(exs), free(xb), free(exb);
}

/* mr_matmul at many tokens (the blocked form of the row path where the ISA
 * has one: panels of rows decoded once, tokens in register blocks, column
 * blocks of 128) on BF16 and FP8: against the double reference, and each
 * token's outputs bit for bit those of the same token alone (M = 1): a
 * token's result must not depend on the batch around it. Shapes: N 50 (a
 * partial panel and partial 3-row blocks), 144 (crosses a 128-row scale
 * block), K 400 (a last column block of 16), 272 and 4096 (x of 70 tokens
 * is larger than the slice of tokens the blocked forms keep in L2: the
 * slices' boundaries); M up to 70 (crosses the 64-token chunk; remainders
 * of the 4-token blocks). */
static void test_matmul_many_tokens(void **st) {
    (void)st;
    const mr_format fmts[] = {MR_FMT_BF16, MR_FMT_FP8_BLOCK};
    /* {21, 150}: K % 16 != 0 (the small-M blocks' scalar tail, and no blocked form); {40, 160}:
     * FP8 with a last scale group of 32 columns; {33, 544}: a last blocked column block of 32;
     * {16, 8192}: AMX slices of 20 tokens (40 for the others) */
    const int64_t shapes[][2] = {{50, 400}, {144, 272}, {19, 48}, {27, 4096}, {21, 150}, {40, 160}, {33, 544}, {16, 8192},
                                 {37, 192}, {144, 576}};
    /* 2-7: the small-M register blocks of up to 7 tokens; 8+: the blocked forms (the pair dots: up to
     * 8 tokens on lines decoded in registers, more on groups decoded into L1); 13 and 333: AMX slices
     * whose last 5-token block is short (padded); 42: a short block alone in the last slice; 333: more
     * than one MR_MATMUL_CHUNK (the smaller shapes only) */
    const int64_t Ms[] = {2, 3, 4, 5, 6, 7, 8, 13, 42, 70, 333};
    enum { MAXM = 333, MAXN = 144, MAXK = 8192 };
    tu_rng r = {4242};
    float *w = malloc(sizeof(float) * MAXN * MAXK), *x = malloc(sizeof(float) * MAXM * MAXK),
          *y = malloc(sizeof(float) * MAXM * MAXN), *y1 = malloc(sizeof(float) * MAXN);
    const mr_kernels *k = mr_kernels_get();
    fill(&r, x, MAXM * MAXK, 1.0f);
    /* {37, 192}: the bf16 pair dots' (rows_x16, K % 64 == 0) last FP8 group of 64 columns (x padded
     * with zeros to the pack's 256) and a last tile of 5 rows; {144, 576}: theirs across a 128-row
     * scale block */
    uint16_t *x16 = mr_aligned_alloc(64, sizeof(float) * MAXM * MAXK); /* also the fp32 x of rows_f32 */
    float *yd = malloc(sizeof(float) * MAXM * MAXN);
    void *scr = mr_aligned_alloc(64, MR_UK_SCRATCH);
    /* fp32 x, then bf16 x (the one-part pack on tiles: mr_matmul picks it for such a call; without
     * AMX, the matrix marked x_bf16 is packed for the table's bf16 pair dots where it has them) */
    for (int xb = 0; xb < 2; xb++)
    for (size_t f = 0; f < 2; f++)
        for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
            const int64_t N = shapes[sh][0], K = shapes[sh][1];
            if (xb && f == 0 && sh == 0)
                for (int64_t i = 0; i < MAXM * MAXK; i++) x[i] = mr_bf16_to_f32(mr_f32_to_bf16(x[i]));
            fill(&r, w, N * K, 0.05f);
            mr_qmatrix q;
            mr_pmatrix pm;
            memset(&q, 0, sizeof q);
            assert_int_equal(mr_qmatrix_quantize(&q, fmts[f], w, N, K, 0.0f), MR_OK);
            q.x_bf16 = xb;
            for (int tl = 0; tl < 2; tl++) {
                if (dense_tiles(&q, &pm, tl) != tl) break;
                /* on the pair dots: where the table has them, packed for them, and only then; else
                 * without AMX on the FMAs over the same packs where the table has them (fp32 x) */
                const bool pd = tl && xb && !k->rows_tiles[fmts[f]].fn && k->rows_x16[fmts[f]].fn && K % 64 == 0;
                const bool pf = tl && !pd && !k->rows_tiles[fmts[f]].fn && k->rows_f32[fmts[f]].fn && K % 64 == 0;
                if (tl)
                    assert_int_equal(q.tiles->pack, pd   ? k->rows_x16[fmts[f]].pack
                                                    : pf ? k->rows_f32[fmts[f]].pack
                                                         : k->rows_tiles[fmts[f]].pack);
                const char *name = pd   ? k->rows_x16[fmts[f]].name
                                   : pf ? k->rows_f32[fmts[f]].name
                                   : tl ? k->rows_tiles[fmts[f]].name
                                   : k->rows[fmts[f]].name ? k->rows[fmts[f]].name
                                                          : "driver";
                for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                    const int64_t M = Ms[mi];
                    if (M > MR_MATMUL_CHUNK && N * K > 20000) continue;
                    for (int64_t i = 0; i < M * N; i++) y[i] = NAN;
                    mr_matmul(&q, x, M, y);
                    check_matmul_out(&q, x, M, y);
                    if (pd && M <= MR_MATMUL_CHUNK) { /* mr_matmul took them: their bits, called directly */
                        k->rows_x16[fmts[f]].xpack(x, K, q.tiles->Kp, 0, M, x16);
                        k->rows_x16[fmts[f]].fn(q.tiles, 0, N, x16, M, yd, N, scr);
                        if (memcmp(yd, y, sizeof(float) * (size_t)(M * N)))
                            fail_msg("%s N %lld K %lld M %lld: mr_matmul did not take the pair dots", name,
                                     (long long)N, (long long)K, (long long)M);
                    }
                    if (pf && M <= MR_MATMUL_CHUNK) { /* the same for the FMAs on the packs */
                        float *xf = (float *)x16; /* room for MAXM x MAXK floats: allocated so */
                        k->rows_f32[fmts[f]].xpack(x, K, q.tiles->Kp, 0, M, xf);
                        k->rows_f32[fmts[f]].fn(q.tiles, 0, N, xf, M, yd, N, scr);
                        if (memcmp(yd, y, sizeof(float) * (size_t)(M * N)))
                            fail_msg("%s N %lld K %lld M %lld: mr_matmul did not take the FMAs on the pack", name,
                                     (long long)N, (long long)K, (long long)M);
                    }
                    for (int64_t m = 0; m < M; m++) {
                        mr_matmul(&q, x + m * K, 1, y1);
                        for (int64_t n = 0; n < N; n++)
                            if (memcmp(&y1[n], &y[m * N + n], sizeof(float)))
                                fail_msg("%s%s fmt %d N %lld K %lld: token %lld of %lld, row %lld: %.9g, alone %.9g", name,
                                         xb ? " (bf16 x)" : "", (int)fmts[f], (long long)N, (long long)K, (long long)m, (long long)M,
                                         (long long)n, y[m * N + n], y1[n]);
                    }
                }
            }
            dense_tiles(&q, &pm, false);
            mr_qmatrix_free(&q);
        }
    mr_aligned_free(x16), mr_aligned_free(scr);
    free(w), free(x), free(y), free(y1), free(yd);
}

/* The FMAs on the packs (rows_f32) of every table this host runs that has them (AVX2's; AVX-512's),
 * called directly on their pack, FP8 and BF16, N 144 (a 128-row scale block crossed, a last tile of
 * 16) and 37 (a last tile of 5 rows), K 384. FP8: tile 0's first 128-k block holds every code but
 * NaN (the pack marks it: mr_pmatrix.tsub, the AVX2 form without fp32 subnormals), tile 1's second
 * block every code with fewer subnormal codes than marks a block (the fast decode, exact on fp32
 * subnormals); once more with one NaN code (mr_pmatrix.has_nan: the exact decode at every M, and
 * the NaN reaches its row). x: token 3's second group holds 3e5 (>= 2^16: the AVX2 register
 * blocks keep that group's x unscaled and decode the weights another way), token 5 fp32 subnormals
 * and 65535.996 (the largest scaled group). Every token of M = 1-9, 17, 40 (the register forms and
 * the L1 forms, their token blocks and remainders) against the double reference, and bit for bit
 * against the same token alone: the forms must give the same bits. */
static void test_rows_f32_all_tables(void **st) {
    (void)st;
    enum { MAXM = 40, K = 384 };
    const int64_t Ns[] = {144, 37}, Ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, MAXM};
    const uint32_t levels[2] = {mr_kernel_isa_features(MR_ISA_AVX2), mr_cpu()->flags};
    tu_rng r = {0xD5D5};
    float *w = malloc(sizeof(float) * 144 * K), *x = malloc(sizeof(float) * MAXM * K);
    float *y = malloc(sizeof(float) * MAXM * 144), *y1 = malloc(sizeof(float) * 144), *row = malloc(sizeof(float) * K);
    float *xp = mr_aligned_alloc(64, sizeof(float) * MAXM * K);
    void *scr = mr_aligned_alloc(64, MR_UK_SCRATCH);
    fill(&r, x, MAXM * K, 1.0f);
    for (int64_t i = 128; i < 256; i += 5) x[3 * K + i] = 3e5f;
    for (int64_t i = 0; i < K; i += 3) x[5 * K + i] = i % 2 ? 1e-41f : 65535.996f;
    int tested = 0;
    for (int l = 0; l < 2; l++) {
        if ((mr_cpu()->flags & levels[l]) != levels[l]) continue;
        mr_kernels k;
        mr_kernels_init(&k, levels[l]);
        if (l == 1 && k.level == MR_ISA_AVX2) break; /* the first pass ran this table */
        for (int v = 0; v < 5; v++) { /* BF16 at each N; FP8 at each N; FP8 with a NaN code */
            const mr_format f = v < 2 ? MR_FMT_BF16 : MR_FMT_FP8_BLOCK;
            const int64_t N = Ns[v % 2];
            const bool nan = v == 4;
            if (!k.rows_f32[f].fn) continue;
            fill(&r, w, N * K, 0.05f);
            mr_qmatrix q;
            memset(&q, 0, sizeof q);
            assert_int_equal(mr_qmatrix_quantize(&q, f, w, N, K, 0.0f), MR_OK);
            if (f == MR_FMT_FP8_BLOCK) {
                uint8_t *c = q.data;
                for (int i = 0, n_sub = 0; i < 16 * 128; i++) {
                    uint8_t b = (uint8_t)(i * 7 + i / 256);
                    if ((b & 0x7F) == 0x7F) b &= 0x80;
                    c[(i / 128) * K + i % 128] = b; /* tile 0, k 0-127: marked */
                    if ((b & 0x78) == 0 && (b & 7) && ++n_sub >= MR_PACK_FP8_SUBNORMALS) b &= 0x80;
                    c[(16 + i / 128) * K + 128 + i % 128] = b; /* tile 1, k 128-255: not marked */
                }
                if (nan) c[20 * K + 200] = 0x7F;
            }
            const mr_qmatrix *src[1] = {&q};
            mr_pmatrix pm;
            assert_int_equal(mr_pmatrix_pack(&pm, k.rows_f32[f].pack, src, 1), MR_OK);
            assert_int_equal(pm.has_nan, nan);
            if (f == MR_FMT_FP8_BLOCK && pm.tsub) {
                assert_true(pm.tsub[0]);
                assert_false(pm.tsub[1 * (pm.Kp / 128) + 1]);
            }
            for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                const int64_t M = Ms[mi];
                k.rows_f32[f].xpack(x, K, pm.Kp, 0, M, xp);
                k.rows_f32[f].fn(&pm, 0, N, xp, M, y, N, scr);
                for (int64_t n = 0; n < N; n++) {
                    mr_qmatrix_dequant_row(&q, n, row);
                    for (int64_t m = 0; m < M; m++) {
                        double ref = 0, mag = 0;
                        for (int64_t i = 0; i < K; i++) ref += (double)row[i] * x[m * K + i], mag += fabs(row[i] * x[m * K + i]);
                        const bool ok = isnan(ref) ? isnan(y[m * N + n]) : fabs(y[m * N + n] - ref) <= 1e-5 * mag + 1e-30;
                        if (!ok)
                            fail_msg("%s%s N %lld M %lld: y[%lld][%lld] = %.9g, reference %.9g", k.rows_f32[f].name,
                                     nan ? " (a NaN code)" : "", (long long)N, (long long)M, (long long)m, (long long)n,
                                     y[m * N + n], ref);
                    }
                }
                for (int64_t m = 0; m < M; m++) {
                    k.rows_f32[f].xpack(x + m * K, K, pm.Kp, 0, 1, xp);
                    k.rows_f32[f].fn(&pm, 0, N, xp, 1, y1, N, scr);
                    for (int64_t n = 0; n < N; n++)
                        if (memcmp(&y1[n], &y[m * N + n], sizeof(float)))
                            fail_msg("%s%s N %lld: token %lld of %lld, row %lld: %.9g, alone %.9g", k.rows_f32[f].name,
                                     nan ? " (a NaN code)" : "", (long long)N, (long long)m, (long long)M, (long long)n,
                                     y[m * N + n], y1[n]);
                }
            }
            tested++;
            mr_pmatrix_free(&pm);
            mr_qmatrix_free(&q);
        }
    }
    mr_aligned_free(xp), mr_aligned_free(scr);
    free(w), free(x), free(y), free(y1), free(row);
    if (!tested) {
        print_message("SKIPPED: no kernel table of this host (or MOERUN_CPU_MASK) has the FMAs on the packs\n");
        skip();
    }
}

/* The dense kernels on tiles have two packs of x: three bf16 parts of any fp32 x (rows_xpack, fn) and,
 * for x of bf16 values, the values alone (rows_xpack1, fn1), which mr_matmul takes for a call whose
 * whole x is such. A token's result must not depend on which one its call took (else on its batch):
 * fn1 must give fn's bits, -0 included, at every M and for values near the ends of bf16's range. */
static void test_dense_one_part(void **st) {
    (void)st;
    const mr_kernels *k = mr_kernels_get();
    if (!k->rows_xpack1) {
        print_message("no dense path on tiles in this table (AMX): skipped\n");
        skip();
    }
    const mr_format fmts[] = {MR_FMT_BF16, MR_FMT_FP8_BLOCK};
    /* {40, 160}: FP8's last scale group of 32 columns, BF16's k tail of 0 (160 = 5 x 32); {21, 150}:
     * BF16's k tail of 22 columns; {33, 544}: a last column tile of one row */
    const int64_t shapes[][2] = {{64, 3072}, {40, 160}, {21, 150}, {33, 544}};
    const int64_t Ms[] = {1, 2, 4, 5, 7, 15, 16, 17, 31, 48, 49, 64, 65, 100, 150, 333};
    enum { MAXM = 333, MAXN = 64, MAXK = 3072 };
    tu_rng r = {5151};
    float *w = malloc(sizeof(float) * MAXN * MAXK), *x = malloc(sizeof(float) * MAXM * MAXK);
    float *y3 = malloc(sizeof(float) * MAXM * MAXN), *y1 = malloc(sizeof(float) * MAXM * MAXN);
    void *xp = mr_aligned_alloc(64, MR_XPACK_BYTES(MAXM, MAXK) + MR_UK_SCRATCH);
    for (int64_t i = 0; i < MAXM * MAXK; i++) {
        const float v = tu_normal(&r) * (i % 7 == 0 ? 1e-30f : i % 11 == 0 ? 1e30f : 1.0f);
        x[i] = mr_bf16_to_f32(mr_f32_to_bf16(v));
    }
    for (int64_t m = 0; m < MAXM; m += 9) /* whole zero tokens (+0 and -0): y = -0 needs the epilogue's + 0 */
        for (int64_t i = 0; i < MAXK; i++) x[m * MAXK + i] = m % 2 ? -0.0f : 0.0f;
    for (size_t f = 0; f < 2; f++)
        for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
            const int64_t N = shapes[sh][0], K = shapes[sh][1];
            fill(&r, w, N * K, 0.05f);
            mr_qmatrix q;
            mr_pmatrix pm;
            memset(&q, 0, sizeof q);
            assert_int_equal(mr_qmatrix_quantize(&q, fmts[f], w, N, K, 0.0f), MR_OK);
            assert_true(dense_tiles(&q, &pm, true));
            char *scr = (char *)xp + MR_XPACK_BYTES(MAXM, MAXK);
            for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                const int64_t M = Ms[mi];
                float *xm = x + (MAXM - M) * K; /* different tokens for each M */
                for (int64_t i = 0; i < M * N; i++) y3[i] = y1[i] = NAN;
                k->rows_xpack(xm, M, K, 0, (M + 4) / 5, xp);
                k->rows_tiles[fmts[f]].fn(q.tiles, 0, N, xp, M, y3, N, scr);
                k->rows_xpack1(xm, M, K, 0, (M + 15) / 16, xp);
                k->rows_tiles[fmts[f]].fn1(q.tiles, 0, N, xp, M, y1, N, scr);
                for (int64_t i = 0; i < M * N; i++)
                    if (memcmp(&y1[i], &y3[i], sizeof(float)))
                        fail_msg("fmt %d N %lld K %lld M %lld: y[%lld][%lld] one part %a, three parts %a", (int)fmts[f],
                                 (long long)N, (long long)K, (long long)M, (long long)(i / N), (long long)(i % N),
                                 (double)y1[i], (double)y3[i]);
            }
            dense_tiles(&q, &pm, false);
            mr_qmatrix_free(&q);
        }
    mr_aligned_free(xp);
    free(w), free(x), free(y3), free(y1);
}

/* The dense bf16 pair dots (rows_x16: the AVX-512 table with AVX512-BF16 where vdpbf16ps runs at the FMA
 * rate) decode every finite E4M3 code exactly, on the expert pack (mr_qmatrix_tiles), in both forms
 * (up to 8 tokens on lines decoded in registers, more on groups decoded into L1): 16 rows x 128
 * columns of codes, token m's x one-hot at column m with 1, 65280 or 65536 (bf16 values), the block
 * multiplier 2^-3; each output must be code x value x 2^-3 exactly (one product beside zeros). A BF16
 * matrix of the same codes' values checks its own pack the same way. SKIPPED where the process table
 * has none. */
static void test_x16_all_codes(void **st) {
    (void)st;
    const mr_kernels *k = mr_kernels_get();
    if (!k->rows_x16[MR_FMT_FP8_BLOCK].fn || !k->rows_x16[MR_FMT_BF16].fn) {
        print_message("SKIPPED: no dense bf16 pair dots in this table (AVX-512 with BF16, not on AVX512-FP16 cores)\n");
        skip();
    }
    enum { N = 16, K = 128, M = 128 };
    uint8_t codes[N * K];
    uint16_t wb[N * K];
    for (int i = 0; i < N * K; i++) {
        codes[i] = (uint8_t)(i * 7 + i / 256);
        if ((codes[i] & 0x7F) == 0x7F) codes[i] = (uint8_t)(codes[i] & 0x80);
        wb[i] = mr_f32_to_bf16(mr_e4m3_to_f32(codes[i])); /* exact: E4M3 values are bf16 values */
    }
    float sc = 0.125f;
    float *x = calloc(M * K, sizeof(float)), *y = malloc(sizeof(float) * M * N);
    uint16_t *xp = mr_aligned_alloc(64, sizeof(uint16_t) * M * K);
    void *scr = mr_aligned_alloc(64, MR_UK_SCRATCH);
    int seen[256] = {0};
    static const uint16_t xvals[3] = {0x3F80, 0x477F, 0x4780};
    for (int f = 0; f < 2; f++) {
        const mr_format fmt = f ? MR_FMT_BF16 : MR_FMT_FP8_BLOCK;
        mr_qmatrix q = {.fmt = fmt, .rows = N, .cols = K, .data = f ? (void *)wb : (void *)codes,
                        .scale = f ? NULL : &sc, .scale2 = 1.0f, .x_bf16 = true};
        mr_pmatrix pm;
        assert_int_equal(mr_qmatrix_tiles(&q, &pm), MR_OK);
        assert_non_null(q.tiles);
        assert_int_equal(q.tiles->pack, k->rows_x16[fmt].pack);
        for (int v = 0; v < 3; v++) {
            const float xv = mr_bf16_to_f32(xvals[v]);
            for (int m = 0; m < M; m++) x[m * K + m] = xv;
            for (int pass = 0; pass < 2; pass++) { /* all 128 tokens at once, then 5 at a time */
                const int step = pass ? 5 : M;
                for (int m0 = 0; m0 < M; m0 += step) {
                    const int mt = M - m0 < step ? M - m0 : step;
                    k->rows_x16[fmt].xpack(x + m0 * K, K, K, 0, mt, xp);
                    k->rows_x16[fmt].fn(q.tiles, 0, N, xp, mt, y + m0 * N, N, scr);
                }
                for (int m = 0; m < M; m++)
                    for (int d = 0; d < N; d++) {
                        const uint8_t c = codes[d * K + m];
                        const float want = mr_e4m3_to_f32(c) * xv * (f ? 1.0f : sc), got = y[m * N + d];
                        seen[c] = 1;
                        if (got != want)
                            fail_msg("%s, %d tokens a call: code 0x%02X x %g gives %.9g, want %.9g",
                                     k->rows_x16[fmt].name, step, c, xv, got, want);
                    }
            }
        }
        mr_pmatrix_free(&pm);
    }
    for (int c = 0; c < 256; c++) assert_true(seen[c] || (c & 0x7F) == 0x7F);
    mr_aligned_free(xp), mr_aligned_free(scr);
    free(x), free(y);
}

/* mr_matmul_multi's threads share the row blocks through ranges with stealing (base/steal.h), so
 * which thread computes a block changes from call to call: the outputs must be bit for bit those
 * of one thread, every time. Shapes like a model's: an LM head of 4096 rows (about 16 chunks per
 * thread), q/k/v of 512/128/128 rows sharing x, M = 1, 3, 16; BF16 and FP8; 12 calls each. On a
 * host with one core the team is one thread and the test says so. */
static void test_matmul_threads_exact(void **st) {
    (void)st;
    int nt = 1;
#ifdef _OPENMP
    nt = omp_get_max_threads();
#endif
    if (nt < 2) print_message("one OpenMP thread here: the stealing path is not exercised\n");
    const mr_format fmts[] = {MR_FMT_BF16, MR_FMT_FP8_BLOCK};
    enum { K = 256, MAXM = 16, NSETS = 2 };
    const int nmat[NSETS] = {1, 3};
    const int64_t rows[NSETS][3] = {{4096, 0, 0}, {512, 128, 128}};
    tu_rng r = {9090};
    float *w = malloc(sizeof(float) * 4096 * K), *x = malloc(sizeof(float) * MAXM * K);
    fill(&r, x, MAXM * K, 1.0f);
    for (size_t f = 0; f < 2; f++)
        for (int set = 0; set < NSETS; set++) {
            const int n = nmat[set];
            mr_qmatrix q[3];
            mr_pmatrix pm[3];
            const mr_qmatrix *qp[3];
            float *y[3], *ref[3];
            for (int i = 0; i < n; i++) {
                fill(&r, w, rows[set][i] * K, 0.05f);
                memset(&q[i], 0, sizeof q[i]);
                assert_int_equal(mr_qmatrix_quantize(&q[i], fmts[f], w, rows[set][i], K, 0.0f), MR_OK);
                qp[i] = &q[i];
                y[i] = malloc(sizeof(float) * (size_t)(MAXM * rows[set][i]));
                ref[i] = malloc(sizeof(float) * (size_t)(MAXM * rows[set][i]));
            }
            for (int tl = 0; tl < 2; tl++) {
            bool on = true;
            for (int i = 0; i < n; i++) on = dense_tiles(&q[i], &pm[i], tl) == tl && on;
            if (!on) break;
            for (int64_t M = 1; M <= MAXM; M = M == 1 ? 3 : M == 3 ? 16 : MAXM + 1) {
#ifdef _OPENMP
                omp_set_num_threads(1);
#endif
                mr_matmul_multi(n, qp, x, M, ref);
#ifdef _OPENMP
                omp_set_num_threads(nt);
#endif
                for (int rep = 0; rep < 12; rep++) {
                    for (int i = 0; i < n; i++)
                        for (int64_t j = 0; j < M * rows[set][i]; j++) y[i][j] = NAN;
                    mr_matmul_multi(n, qp, x, M, y);
                    for (int i = 0; i < n; i++)
                        if (memcmp(y[i], ref[i], sizeof(float) * (size_t)(M * rows[set][i])))
                            fail_msg("fmt %d, matrix %d of %d (%lld rows), M %lld, call %d on %d threads: not the "
                                     "one-thread result", (int)fmts[f], i, n, (long long)rows[set][i], (long long)M,
                                     rep, nt);
                }
            }
            }
            for (int i = 0; i < n; i++) dense_tiles(&q[i], &pm[i], false), mr_qmatrix_free(&q[i]), free(y[i]), free(ref[i]);
        }
    free(w), free(x);
}

/* silu(g)*u of the table against libm, within 8 ulp-ish relative (2^-20) plus a tiny absolute term */
static void test_silu_mul(void **st) {
    (void)st;
    const mr_kernels *k = mr_kernels_get();
    enum { N = 1000 };
    float g[N], u[N], o[N];
    tu_rng r = {77};
    for (int i = 0; i < N; i++) g[i] = tu_normal(&r) * (i < 900 ? 4.0f : 60.0f), u[i] = tu_normal(&r);
    g[0] = 0.0f, g[1] = -0.0f, g[2] = 100.0f, g[3] = -100.0f, g[4] = 88.9f, g[5] = -88.9f, g[6] = NAN;
    k->silu_mul.fn(g, u, N - 3, o); /* a length that is not a multiple of 16 */
    for (int i = 0; i < N - 3; i++) {
        const double ref = (double)g[i] / (1.0 + exp(-(double)g[i])) * (double)u[i];
        if (isnan(g[i])) {
            assert_true(isnan(o[i]));
            continue;
        }
        if (fabs(o[i] - ref) > 1e-6 * fabs(ref) + 1e-30) fail_msg("silu_mul %s: g %g u %g: %g vs %g", k->silu_mul.name, g[i], u[i], o[i], ref);
    }
}

int main(void) {
    tu_isa_begin("test_kernels");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_packed_kernels_all_tables),
        cmocka_unit_test(test_batch_invariant_tables),
        cmocka_unit_test(test_fp8_kernels_all_codes),
        cmocka_unit_test(test_xq_row),
        cmocka_unit_test(test_xd_row),
        cmocka_unit_test(test_nvfp4_fixq_exact_blocks),
        cmocka_unit_test(test_pack_layouts),
        cmocka_unit_test(test_pack_fp8_flags),
        cmocka_unit_test(test_pack_errors),
        cmocka_unit_test(test_gemm_rows_all_tables),
        cmocka_unit_test(test_table_names),
        cmocka_unit_test(test_nvfp4_i8_vnni_bit_identical),
        cmocka_unit_test(test_nvfp4_fixq_vnni_bit_identical),
        cmocka_unit_test(test_fp8_fma_gemm_bit_identical),
        cmocka_unit_test(test_fp8_fma_gemv_is_gemm),
        cmocka_unit_test(test_amx_tokens_independent),
        cmocka_unit_test(test_avx512_fma_dot_bit_identical),
        cmocka_unit_test(test_attention_kernels),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_matmul_many_tokens),
        cmocka_unit_test(test_rows_f32_all_tables),
        cmocka_unit_test(test_dense_one_part),
        cmocka_unit_test(test_x16_all_codes),
        cmocka_unit_test(test_matmul_threads_exact),
        cmocka_unit_test(test_act_prepare_bit_exact),
        cmocka_unit_test(test_silu_mul),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
