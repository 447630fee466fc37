/* bench_dense.c — `moerun bench dense`: the attention projections of MiniMax-M2 at decode
 * (q [6144][3072], k and v [1024][3072], o [3072][6144]) through mr_matmul,
 * fp8 (128x128 block scales) or bf16 weights with seeded random values, fp32
 * activations. Enough layer copies to exceed any cache are cycled; each
 * round times one layer's q, k, v, o (and q/k/v through mr_matmul_multi) and
 * then reads as many bytes with the probe (the ceiling), so that the ratios
 * share the host's state. At many tokens (prefill) the layer is compute-bound:
 * its GFLOP/s are printed beside the peak of the kernel table's FMA (the
 * instruction probe, run before and after the rows), so both ceilings are
 * measured in the same run. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bench_util.h"
#include "cli.h"
#include "moerun/formats.h"
#include "moerun/kernels.h"

typedef struct {
    mr_qmatrix m[4]; /* q, k, v, o */
    mr_pmatrix t[4]; /* packed for the dense path on tiles, where the table has one (the model's layout) */
} dense_layer;

int mr_bench_dense(int argc, char **argv) {
    const char *fmt_name = "fp8", *tokens = "1,2,4,8";
    int threads = 0, iters = 20;
    long lv = 0;
    bool small_pages = false, xbf16 = false;
    int64_t H = 3072, QD = 6144, KVD = 1024;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(name) (!strcmp(a, name) && v && ++i)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: moerun bench dense [--format fp8|bf16] [--tokens 1,2,4,8] [--iters N] [--threads N]\n"
                   "                          [--small-pages] [--dense-activation-dtype fp32|bf16]\n"
                   "--dense-activation-dtype bf16: activations of bf16 values, as the model's dense inputs\n"
                   "under that option (on AMX tiles: the one-part pack); default fp32\n");
            return 0;
        } else if (!strcmp(a, "--small-pages")) small_pages = true;
        else if (OPT("--format")) fmt_name = v;
        else if (OPT("--dense-activation-dtype")) {
            if (strcmp(v, "fp32") && strcmp(v, "bf16")) {
                fprintf(stderr, "moerun bench dense: --dense-activation-dtype is fp32 or bf16, not '%s'\n", v);
                return 2;
            }
            xbf16 = !strcmp(v, "bf16");
        }
        else if (OPT("--tokens")) tokens = v;
        else if (OPT("--threads")) {
            if (mr_bench_num(a, v, 1, 1024, &lv)) return 2;
            threads = (int)lv;
        } else if (OPT("--iters")) {
            if (mr_bench_num(a, v, 1, 100000, &lv)) return 2;
            iters = (int)lv;
        } else {
            fprintf(stderr, "moerun bench dense: unknown or incomplete option '%s'\n", a);
            return 2;
        }
#undef OPT
    }
    mr_format fmt = MR_FMT_COUNT;
    if (mr_format_from_name(fmt_name, &fmt) || (fmt != MR_FMT_FP8_BLOCK && fmt != MR_FMT_BF16)) fmt = MR_FMT_COUNT;
    if (fmt == MR_FMT_COUNT || iters < 1 || iters > 100000) {
        fprintf(stderr, "moerun bench dense: --format is fp8 or bf16; --iters 1..100000\n");
        return 2;
    }
    int64_t Ts[MR_BENCH_MAX_TS];
    int nT = 0;
    if (mr_bench_parse_tokens(tokens, 512, Ts, &nT)) {
        fprintf(stderr, "moerun bench dense: bad --tokens list '%s' (at most 16 comma-separated T in 1..512)\n",
                tokens);
        return 2;
    }
    if (threads > 0) omp_set_num_threads(threads);
    const int64_t rows[4] = {QD, KVD, KVD, H}, cols[4] = {H, H, H, QD};
    size_t dbytes[4], sbytes[4], layer_bytes = 0; /* the buffer sizes of the formats traits */
    for (int j = 0; j < 4; j++) {
        if (mr_qmatrix_sizes(fmt, rows[j], cols[j], &dbytes[j], &sbytes[j])) {
            mr_cli_fail("bench dense", "matrix sizes");
            return 1;
        }
        layer_bytes += dbytes[j];
    }
    int NL = (int)(((size_t)640 << 20) / layer_bytes) + 1;
    if (NL > 64) NL = 64;
    dense_layer *L = calloc((size_t)NL, sizeof *L);
    uint64_t *slab[64 * 4] = {0}, *pbuf = NULL;
    float *x = NULL, *y = NULL;
    double *med = NULL;
    uint64_t s = 12345;
    int rc = !L;
    for (int l = 0; l < NL && !rc; l++)
        for (int j = 0; j < 4; j++) {
            mr_qmatrix *q = &L[l].m[j];
            size_t n = (size_t)(rows[j] * cols[j]);
            uint64_t *buf = small_pages ? mr_aligned_alloc(4096, dbytes[j] + 8) : mr_probe_buf_new(dbytes[j] + 8);
            if (!buf) {
                rc = 1;
                break;
            }
#ifdef MADV_NOHUGEPAGE
            if (small_pages) (void)madvise(buf, dbytes[j], MADV_NOHUGEPAGE);
#endif
            slab[l * 4 + j] = buf;
            q->fmt = fmt, q->rows = rows[j], q->cols = cols[j], q->data = buf, q->scale2 = 1.0f;
            if (fmt == MR_FMT_FP8_BLOCK) {
                mr_bench_fp8_codes((uint8_t *)buf, n, &s); /* as a checkpoint's (few subnormal codes) */
                size_t ns = sbytes[j] / sizeof(float);
                float *sc = malloc(ns * sizeof(float));
                if (!sc) {
                    rc = 1;
                    break;
                }
                for (size_t i = 0; i < ns; i++) sc[i] = (float)(1e-3 * (1 + mr_bench_rng(&s) % 100));
                q->scale = sc;
            } else {
                uint16_t *d = (uint16_t *)buf;
                for (size_t i = 0; i < n; i++) {
                    float f = (float)((double)(mr_bench_rng(&s) % 20001) / 10000.0 - 1.0) * 0.05f;
                    uint32_t u;
                    memcpy(&u, &f, 4);
                    d[i] = (uint16_t)(u >> 16);
                }
            }
            q->x_bf16 = xbf16; /* as the model marks its dense matrices under the option */
            if (mr_qmatrix_tiles(q, &L[l].t[j]) != MR_OK) {
                rc = 1;
                break;
            }
        }
    const size_t pbytes = (size_t)1 << 30;
    int64_t maxT = 1;
    for (int i = 0; i < nT; i++) maxT = Ts[i] > maxT ? Ts[i] : maxT;
    if (!rc) {
        pbuf = mr_probe_buf_new(pbytes);
        x = malloc(sizeof(float) * (size_t)(maxT * QD));
        y = malloc(sizeof(float) * (size_t)(maxT * (QD + 2 * KVD)));
        med = malloc(sizeof(double) * 8 * (size_t)iters);
        rc = !pbuf || !x || !y || !med;
    }
    if (rc) {
        fprintf(stderr, "moerun bench dense: out of memory\n");
        goto out;
    }
    for (int64_t i = 0; i < maxT * QD; i++) {
        x[i] = (float)((double)(mr_bench_rng(&s) % 2001) / 1000.0 - 1.0);
        if (xbf16) x[i] = mr_bf16_to_f32(mr_f32_to_bf16(x[i]));
    }
    const mr_kernels *kt = mr_kernels_get();
    /* bf16 x without AMX: the table's bf16 pair dots where it has them (mr_qmatrix_tiles packed the
     * matrices marked x_bf16 for them), against the vdpbf16ps peak */
    const bool x16 = !rc && xbf16 && L[0].m[0].tiles && kt->rows_x16[fmt].fn && L[0].m[0].tiles->pack == kt->rows_x16[fmt].pack;
    /* else the FMAs on the same packs (fp32 x, or bf16 x where the table has no pair dots) */
    const bool x32 = !rc && !x16 && !kt->rows_tiles[fmt].fn && L[0].m[0].tiles && kt->rows_f32[fmt].fn;
    printf("moerun bench dense: format %s, %s activations, %d threads, %d layer copies of %.1f MB (%s pages), kernel %s\n",
           fmt_name, xbf16 ? "bf16" : "fp32", omp_get_max_threads(), NL, (double)layer_bytes / 1e6,
           small_pages ? "4 KiB" : "huge",
           x16 ? kt->rows_x16[fmt].name
           : x32 ? kt->rows_f32[fmt].name
           : L[0].m[0].tiles ? kt->rows_tiles[fmt].name
           : kt->rows[fmt].name ? kt->rows[fmt].name
                                : "gemm_rows");
    if (L[0].m[0].tiles && !x16 && !x32) { /* AMX: its own ceiling, beside the FMA one the table would use without it */
        const double tp = mr_probe_peak(MR_PROBE_TDPBF16, NULL);
        printf("dense on tiles: tdpbf16ps peak %.0f GFLOP/s; a 15-row A tile (5 tokens x 3 exact bf16 parts) uses 5/16 "
               "of it: %.0f GFLOP/s of fp32 products at most (MOERUN_CPU_MASK=amx runs the FMA rows)\n",
               tp, tp * 5.0 / 16.0);
    }
    const char *fma_instr = "";
    const mr_probe_instr ceil_instr = x16 ? MR_PROBE_DPBF16 : MR_PROBE_FMA;
    const double peak0 = mr_probe_peak(ceil_instr, &fma_instr);
    printf("%4s %8s %8s %8s %8s %9s %9s %9s %7s %8s %6s   (GB/s per matrix, medians of %d rounds; probe = same "
           "bytes; GFLOP/s of the layer against the %s peak, %.1f GFLOP/s at the start)\n",
           "T", "q", "k", "v", "o", "qkv-multi", "layer", "probe", "layer%", "GFLOP/s", "peak%", iters, fma_instr,
           peak0);
    double lflops = 0; /* multiply-adds x 2 of one layer's four matrices, per token */
    for (int j = 0; j < 4; j++) lflops += 2.0 * (double)rows[j] * (double)cols[j];
    int cur = 0;
    size_t poff = 0;
    for (int ti = 0; ti < nT; ti++) {
        int64_t T = Ts[ti];
        for (int it = -1; it < iters; it++) {
            double t[8];
            dense_layer *ly = &L[cur];
            cur = (cur + 1) % NL;
            for (int j = 0; j < 4; j++) {
                uint64_t a0 = mr_now_ns();
                mr_matmul(&ly->m[j], x, T, y);
                t[j] = (double)(mr_now_ns() - a0);
            }
            ly = &L[cur];
            cur = (cur + 1) % NL;
            const mr_qmatrix *qkv[3] = {&ly->m[0], &ly->m[1], &ly->m[2]};
            float *ys[3] = {y, y + maxT * QD, y + maxT * (QD + KVD)};
            uint64_t a0 = mr_now_ns();
            mr_matmul_multi(3, qkv, x, T, ys);
            t[4] = (double)(mr_now_ns() - a0);
            size_t qkvb = dbytes[0] + dbytes[1] + dbytes[2];
            t[5] = t[0] + t[1] + t[2] + t[3];
            if (poff + layer_bytes > pbytes) poff = 0;
            double pb = mr_probe_read_once(pbuf + poff / 8, layer_bytes / 4096 * 4096);
            poff += layer_bytes / 4096 * 4096;
            if (it < 0) continue;
            for (int j = 0; j < 4; j++) med[j * iters + it] = (double)dbytes[j] / t[j];
            med[4 * iters + it] = (double)qkvb / t[4];
            med[5 * iters + it] = (double)layer_bytes / t[5];
            med[6 * iters + it] = pb;
            med[7 * iters + it] = med[5 * iters + it] / pb;
        }
        double mv[8];
        for (int c = 0; c < 8; c++) {
            qsort(med + c * iters, (size_t)iters, sizeof(double), mr_bench_cmp_double);
            mv[c] = med[c * iters + iters / 2];
        }
        const double gf = lflops * (double)T * mv[5] / (double)layer_bytes; /* GB/s -> GFLOP/s */
        printf("%4lld %8.2f %8.2f %8.2f %8.2f %9.2f %9.2f %9.2f %6.1f%% %8.1f %5.1f%%\n", (long long)T, mv[0], mv[1],
               mv[2], mv[3], mv[4], mv[5], mv[6], 100.0 * mv[7], gf, 100.0 * gf / peak0);
        fflush(stdout);
    }
    printf("peak %s at the end: %.1f GFLOP/s\n", fma_instr, mr_probe_peak(ceil_instr, NULL));
out:
    for (int l = 0; L && l < NL; l++)
        for (int j = 0; j < 4; j++) {
            mr_aligned_free(slab[l * 4 + j]);
            free(L[l].m[j].scale);
            mr_pmatrix_free(&L[l].t[j]);
        }
    mr_aligned_free(pbuf);
    free(L), free(x), free(y), free(med);
    return rc;
}

