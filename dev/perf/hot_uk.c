/* hot_uk.c — the library's packed micro-kernels (mr_kernels_get()) timed on
 * L2-resident tiles, one thread, next to the peak of their inner-loop
 * instruction measured in the same run (kernel work; not part of CMake).
 *
 *   make -C dev/perf hot_uk && dev/perf/hot_uk [--kind fp8|nvfp4|nvfp4b|bf16] [--M 1,8,16,64] [--xs-group G]
 *
 * For each M it calls uk_gemv (M < uk_gemm_min_m) or uk_gemm on 8 tiles of
 * 16 x 3072 (Kp = K), best of 5 x `reps` passes, and prints weight GB/s and
 * G(FL)OP/s (2 per multiply-add over 16 x Kp x M per tile call) with the
 * ratio to the instruction's 1-thread peak. Before timing, every tile is
 * checked against a double-precision sum over the packed layout's scalar
 * decode (mr__pk_*), so a wrong variant cannot be timed. nvfp4b's gemv gets
 * x in fixed point too (mr_uk_act.xq, as the routed runner gives it), fp8's
 * on AVX2 x * 2^112 (mr_uk_act.xd; HOT_UK_NOXD=1: without), and
 * HOT_UK_XSPAN=n draws |x| in [2^-n, 1), n <= 7 keeping every block in one
 * fixed-point part (unset: uniform in (-1, 1), some blocks in two). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <omp.h>

#include "moerun/base.h"
#include "moerun/formats.h"
#include "moerun/kernels.h"
#include "../../src/kernels/kern_internal.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
static uint64_t rs = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}
static float frand(void) { return (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

enum { K = 3072, MMAX = 64 };
static int64_t NT = 8; /* --tiles: 8 = L2-resident; more to leave L2 / L3 */

int main(int argc, char **argv) {
    const char *kind_s = "nvfp4", *ms = "1,8,16,64";
    int reps = 400, xs_group = 1, w4a4 = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--kind")) kind_s = argv[i + 1];
        else if (!strcmp(argv[i], "--M")) ms = argv[i + 1];
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--xs-group")) xs_group = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--w4a4")) w4a4 = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--tiles")) NT = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    mr_uk_kind kind;
    mr_format fmt;
    mr_pack_id pack;
    if (!strcmp(kind_s, "fp8")) kind = MR_UK_FP8_BF16, fmt = MR_FMT_FP8_BLOCK, pack = MR_PACK_FP8_R16K4;
    else if (!strcmp(kind_s, "nvfp4")) kind = MR_UK_NVFP4_I8, fmt = MR_FMT_NVFP4, pack = MR_PACK_NVFP4_R16K16;
    else if (!strcmp(kind_s, "nvfp4b")) kind = MR_UK_NVFP4_BF16, fmt = MR_FMT_NVFP4, pack = MR_PACK_NVFP4_R16K16B;
    else if (!strcmp(kind_s, "bf16")) kind = MR_UK_BF16_BF16, fmt = MR_FMT_BF16, pack = MR_PACK_BF16_R16K2;
    else {
        fprintf(stderr, "unknown kind %s\n", kind_s);
        return 2;
    }
    const mr_kernels *kt = mr_kernels_get();
    pack = kt->uk_pack[kind]; /* the layout this table's kernels take */
    const int64_t N = 16 * NT;
    float *w = malloc(sizeof(float) * (size_t)(N * K));
    for (int64_t i = 0; i < N * K; i++) w[i] = frand() * (float)(1 + (i / 16) % 7);
    mr_qmatrix q;
    if (mr_qmatrix_quantize(&q, fmt, w, N, K, 0) != MR_OK) return 1;
    const mr_qmatrix *src = &q;
    mr_pmatrix P;
    if (mr_pmatrix_pack(&P, pack, &src, 1) != MR_OK) return 1;
    /* activations in the kind's input type, any values the contract allows */
    const int64_t nb = kind == MR_UK_FP8_BF16 ? K / 128 : K / 16;
    void *x = mr_aligned_alloc(64, (size_t)MMAX * K * 4);
    float *xf = malloc(sizeof(float) * (size_t)(MMAX * K));
    float *xs = malloc(sizeof(float) * (size_t)(MMAX * nb));
    int32_t *xb = malloc(sizeof(int32_t) * (size_t)(MMAX * nb));
    for (int64_t m = 0; m < MMAX; m++) {
        for (int64_t k = 0; k < K; k++) {
            if (kind == MR_UK_NVFP4_I8) {
                static const int e2[8] = {0, 1, 2, 3, 4, 6, 8, 12}; /* w4a4: 2*e2m1 */
                int v = w4a4 ? e2[rnd() % 8] * (rnd() & 1 ? 1 : -1) : (int)(rnd() % 255) - 127;
                ((int8_t *)x)[m * K + k] = (int8_t)v;
                xf[m * K + k] = (float)v;
            } else {
                /* HOT_UK_XSPAN (the header) */
                static int span = -1;
                if (span < 0) span = getenv("HOT_UK_XSPAN") ? atoi(getenv("HOT_UK_XSPAN")) : 0;
                float v = frand();
                if (span > 0) v = (v < 0 ? -1.0f : 1.0f) * ldexpf(1.0f + fabsf(v), -(int)(rnd() % (uint64_t)span) - 1);
                uint16_t b = mr_f32_to_bf16(v);
                ((uint16_t *)x)[m * K + k] = b;
                xf[m * K + k] = mr_bf16_to_f32(b);
            }
        }
        for (int64_t b = 0; b < nb; b++) {
            xs[m * nb + b] = w4a4 ? mr_e4m3_to_f32((uint8_t)(rnd() % 0x7E)) / 2 /* e4m3(sc)/2 */
                                  : 0.5f + (float)((m * 7 + (b / xs_group) * 3) % 11) / 8.0f;
            int32_t s = 0;
            for (int k = 0; k < 16 && kind == MR_UK_NVFP4_I8; k++) s += ((int8_t *)x)[m * K + 16 * b + k];
            xb[m * nb + b] = -12 * s;
        }
    }
    /* a table whose gemm kernels take x widened to fp32 gets it, as the routed runner gives it */
    const bool widen = kt->uk_gemm_xw[kind];
    /* rows 16 floats past K apart, as the routed runner lays out its widened x (MR__XW_LD) */
    const int64_t LDW = K + 16;
    float *xwp = malloc(sizeof(float) * (size_t)(MMAX * LDW));
    for (int64_t m = 0; m < MMAX; m++) memcpy(xwp + m * LDW, xf + m * K, sizeof(float) * K);
    mr_uk_act a = {.x = x, .ldx = K, .xs = kind == MR_UK_BF16_BF16 ? NULL : xs, .ldxs = nb, .xb = xb, .ldb = nb,
                   .post = 1.0f, .xs_group = xs_group, .xw = widen ? xwp : NULL, .ldxw = LDW};
    /* nvfp4b: the gemv's fixed-point copy of x, as the routed runner makes it (fixq_rows) */
    int16_t *xq = malloc(sizeof(int16_t) * (size_t)(2 * MMAX * K));
    float *xqm = malloc(sizeof(float) * (size_t)(MMAX * (K / 16)));
    if (kind == MR_UK_NVFP4_BF16 && kt->xq_row.fn) {
        for (int64_t m = 0; m < MMAX; m++)
            kt->xq_row.fn((const uint16_t *)x + m * K, K, xq + m * K, xq + (MMAX + m) * K, xqm + m * (K / 16));
        a.xq = xq, a.xql = xq + MMAX * K, a.xqm = xqm, a.ldxq = K, a.ldxqm = K / 16;
        int nb2 = 0, nb0 = 0;
        for (int64_t i = 0; i < MMAX * (K / 16); i++) nb2 += xqm[i] < 0, nb0 += xqm[i] == 0;
        printf("xq: %.1f%% of blocks in two parts, %.1f%% without a form\n", 100.0 * nb2 / (MMAX * (K / 16)),
               100.0 * nb0 / (MMAX * (K / 16)));
    }
    /* fp8 on AVX2: the gemv's x * 2^112 (mr_uk_act.xd), as the routed runner gives it, unless
     * HOT_UK_NOXD is set (the kernel then scales x per tile) */
    float *xd = malloc(sizeof(float) * (size_t)(MMAX * LDW));
    if (kt->uk_xd[kind] && !getenv("HOT_UK_NOXD")) {
        for (int64_t m = 0; m < MMAX; m++) mr_uk_xd_row((const uint16_t *)x + m * K, K, xd + m * LDW);
        a.xd = xd, a.ldxd = LDW;
    }
    void *scratch = mr_aligned_alloc(64, MR_UK_SCRATCH);
    float *y = mr_aligned_alloc(64, sizeof(float) * MMAX * 16);
    /* check every tile at M = 19 against the scalar decode of the packed layout */
    {
        const int64_t M = 19;
        float *wd = malloc(sizeof(float) * 16 * K), sc[16], blk[256];
        double worst = 0;
        for (int64_t t = 0; t < 8; t++) {
            for (int pass = 0; pass < 2; pass++) {
                mr_uk_fn fn = pass ? kt->uk_gemm[kind].fn : kt->uk_gemv[kind].fn;
                fn(&P, t, &a, M, y, 16, scratch);
                const uint8_t *tile = P.data + (size_t)t * P.tile_bytes;
                for (int64_t j = 0; j < K / 16; j++) {
                    if (fmt == MR_FMT_NVFP4) {
                        mr__pk_nvfp4_block_f32(&P, tile, j, blk, sc);
                        for (int d = 0; d < 16; d++)
                            for (int k = 0; k < 16; k++) wd[d * K + 16 * j + k] = blk[k * 16 + d] * sc[d];
                    }
                }
                if (fmt == MR_FMT_FP8_BLOCK) {
                    float *b128 = malloc(sizeof(float) * 128 * 16);
                    for (int64_t kb = 0; kb < K / 128; kb++) {
                        mr__pk_fp8_block_f32(&P, tile, kb, b128);
                        for (int d = 0; d < 16; d++)
                            for (int k = 0; k < 128; k++)
                                wd[d * K + 128 * kb + k] = b128[k * 16 + d] * P.tscale[t * (K / 128) + kb];
                    }
                    free(b128);
                }
                if (fmt == MR_FMT_BF16) {
                    float *b2 = malloc(sizeof(float) * K * 16);
                    mr__pk_bf16_pairs_f32(tile, 0, K / 2, b2);
                    for (int d = 0; d < 16; d++)
                        for (int k = 0; k < K; k++) wd[d * K + k] = b2[k * 16 + d];
                    free(b2);
                }
                for (int64_t m = 0; m < M; m++)
                    for (int d = 0; d < 16; d++) {
                        double s = 0, sa = 0;
                        for (int64_t k = 0; k < K; k++) {
                            int64_t b = fmt == MR_FMT_FP8_BLOCK ? k / 128 : k / 16;
                            double v = (double)wd[d * K + k] * xf[m * K + k] *
                                       (kind == MR_UK_BF16_BF16 ? 1.0 : xs[m * nb + b]);
                            s += v;
                            sa += fabs(v);
                        }
                        s *= P.scale2;
                        sa *= P.scale2;
                        double e = fabs(y[m * 16 + d] - s) / (1e-6 * sqrt((double)K) * sa + 1e-30);
                        if (e > worst) worst = e;
                    }
            }
        }
        free(wd);
        printf("check %s: worst err/bound %.4f %s\n", kind_s, worst, worst <= 1 ? "ok" : "FAIL");
        if (worst > 1) return 1;
    }
    const char *iname;
    double peak1 = 0;
    {
        /* 1-thread peak: the library probe runs all threads; one is asked for */
        mr_probe_instr pi = mr_uk_instr(kind);
        omp_set_num_threads(1);
        peak1 = mr_probe_peak(pi, &iname);
    }
    char buf[256];
    snprintf(buf, sizeof buf, "%s", ms);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int64_t M = atoi(tok);
        if (M < 1 || M > MMAX) continue;
        mr_uk_fn fn = M >= kt->uk_gemm_min_m ? kt->uk_gemm[kind].fn : kt->uk_gemv[kind].fn;
        int r = (int)(reps * 8 / (M < 8 ? 8 : M) * 8 / NT) + 1;
        double best = 1e30;
        for (int rep = 0; rep < 5; rep++) {
            double t0 = now_s();
            for (int i = 0; i < r; i++)
                for (int64_t t = 0; t < NT; t++) fn(&P, t, &a, M, y, 16, scratch);
            double dt = now_s() - t0;
            if (dt < best) best = dt;
        }
        double calls = (double)r * NT;
        double gbs = calls * (double)P.tile_bytes / best * 1e-9;
        double gops = calls * 2.0 * 16 * (double)P.Kp * (double)M / best * 1e-9;
        printf("%-6s M=%-3lld %-34s %7.1f GB/s  %7.1f G/s  = %5.1f%% of %s 1-thread peak %.1f\n", kind_s,
               (long long)M, M >= kt->uk_gemm_min_m ? kt->uk_gemm[kind].name : kt->uk_gemv[kind].name, gbs, gops,
               100.0 * gops / peak1, iname, peak1);
    }
    return 0;
}
