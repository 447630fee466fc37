/* dev/perf/bench.c — the MoE kernel experiment driver: checks every
 * numbered variant (kern.h) against the scalar reference of the library
 * (include/moerun/formats.h), then times it on MiniMax-M2 expert shapes
 * (H 3072, I 1536, top-8) with weights re-drawn from a >= 1 GiB pool, with
 * the ceilings (1 GiB read bandwidth, instruction peak) measured in the same
 * run, interleaved round by round. Prints medians and ratios.
 *
 * Usage: bench [--check-only] [--fmt fp8,nvfp4,bf16] [--var NAME,...] [--M 1,8,32,16,64]
 *              [--threads 1,2] [--rounds N] [--iters N] [--pool-mb MB]
 * M is tokens per expert: 1/8/32 = decode (all M tokens share the same 8
 * experts), 16/64 = prefill T=512/2048 (T*8/256 rows per expert; 16 experts per call). */
#define _GNU_SOURCE
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kern.h"
#include "moerun/formats.h"
#include "probe.h"

enum { H = 3072, I = 1536, TOPK = 8 };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static void *xalloc(size_t n) {
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    uint64_t x = rng_state;
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    rng_state = x;
    return x * 0x2545F4914F6CDD1Dull;
}
static float frand(void) { return (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0); }
static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmpd);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
static int64_t rup(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

/* ------------------------------------------------------------------ variants */
typedef enum { F_FP8, F_NVFP4, F_BF16 } wfmt;
typedef enum { A_BF16, A_F8, A_F32, A_I8, A_FP4 } aform; /* activation form fed to the kernel */
typedef enum { K_FP8_BF16, K_FP8_F32, K_FP8_GEMM, K_NV_I8, K_NV_BF16, K_BF16 } kern;
typedef enum { P_FMA, P_DPBF16, P_DPBUSD } instr;
static const char *instr_name[] = {"vfmadd231ps", "vdpbf16ps", "vpdpbusd"};
static const double instr_ops[] = {32, 64, 128}; /* flops (ops) per zmm instruction */

typedef struct {
    const char *name, *mode;
    wfmt fmt;
    aform act;
    kern k;
    instr ins;
    int nvb; /* nvfp4: bf16-pair layout */
} variant;

static const variant VARS[] = {
    {"fp8.v1", "w8a16", F_FP8, A_BF16, K_FP8_BF16, P_DPBF16, 0},
    {"fp8.v1", "w8a8", F_FP8, A_F8, K_FP8_BF16, P_DPBF16, 0},
    {"fp8.v2", "w8a32", F_FP8, A_F32, K_FP8_F32, P_FMA, 0},
    {"fp8.v3", "w8a16", F_FP8, A_BF16, K_FP8_GEMM, P_DPBF16, 0},
    {"fp8.v3", "w8a8", F_FP8, A_F8, K_FP8_GEMM, P_DPBF16, 0},
    {"nvfp4.v1", "w4a8", F_NVFP4, A_I8, K_NV_I8, P_DPBUSD, 0},
    {"nvfp4.v1", "w4a4", F_NVFP4, A_FP4, K_NV_I8, P_DPBUSD, 0},
    {"nvfp4.v2", "w4a16", F_NVFP4, A_BF16, K_NV_BF16, P_DPBF16, 1},
    {"bf16.v1", "a16", F_BF16, A_BF16, K_BF16, P_DPBF16, 0},
};
enum { NVARS = sizeof VARS / sizeof VARS[0] };

/* ------------------------------------------------------------------ packed matrices */
typedef struct {
    wfmt fmt;
    int64_t N, K, Kp, nt;
    size_t tile_bytes;
    uint8_t *data; /* nt tiles */
    float *bs;     /* fp8: [ceil(N/128)][Kp/128] */
    float scale2, input_scale;
} pmat;

static int64_t kunit(wfmt f) { return f == F_FP8 ? 128 : f == F_NVFP4 ? 16 : 2; }
static void pmat_shape(pmat *p, wfmt f, int64_t N, int64_t K) {
    memset(p, 0, sizeof *p);
    p->fmt = f, p->N = N, p->K = K, p->Kp = rup(K, kunit(f)), p->nt = rup(N, 16) / 16;
    p->tile_bytes = f == F_FP8 ? mr_pk_fp8_tile_bytes(p->Kp)
                    : f == F_NVFP4 ? mr_pk_nvfp4_tile_bytes(p->Kp)
                                   : mr_pk_bf16_tile_bytes(p->Kp);
    p->scale2 = 1.0f;
}
static size_t pmat_bytes(const pmat *p) {
    size_t b = p->tile_bytes * (size_t)p->nt;
    if (p->fmt == F_FP8) b += sizeof(float) * (size_t)(rup(p->N, 128) / 128 * (p->Kp / 128));
    return b;
}
static const uint8_t *tile_of(const pmat *p, int64_t t) { return p->data + (size_t)t * p->tile_bytes; }
static const float *bs_of(const pmat *p, int64_t t) { return p->bs ? p->bs + (t / 8) * (p->Kp / 128) : NULL; }

/* ------------------------------------------------------------------ activations */
typedef struct {
    aform form;
    int64_t K, Kp, M, ld, ldxs, ldb;
    uint16_t *xb16;
    float *xf;
    int8_t *xq;
    int32_t *xbias;
    float *xs;   /* NULL when unused */
    float *post; /* [M] */
    float *xval; /* [M][K] exact values the mode sees (checks only, may be NULL) */
} act;

static void act_alloc(act *a, aform f, int64_t M, int64_t K, int64_t Kp, int want_val) {
    memset(a, 0, sizeof *a);
    a->form = f, a->K = K, a->Kp = Kp, a->M = M, a->ld = Kp;
    a->ldxs = Kp / 16, a->ldb = Kp / 16;
    a->xb16 = xalloc(sizeof(uint16_t) * (size_t)(M * Kp));
    a->xf = xalloc(sizeof(float) * (size_t)(M * Kp));
    a->xq = xalloc((size_t)(M * Kp));
    a->xbias = xalloc(sizeof(int32_t) * (size_t)(M * Kp / 16));
    a->xs = xalloc(sizeof(float) * (size_t)(M * Kp / 16));
    a->post = xalloc(sizeof(float) * (size_t)M);
    a->xval = want_val ? xalloc(sizeof(float) * (size_t)(M * K)) : NULL;
}
static void act_free(act *a) {
    free(a->xb16), free(a->xf), free(a->xq), free(a->xbias), free(a->xs), free(a->post), free(a->xval);
}
/* Fills the kernel input form from x [M][ldin] fp32 (first K used). No allocation. */
static void act_prepare(act *a, const float *x, int64_t ldin, const pmat *W) {
    int64_t K = a->K, Kp = a->Kp;
    uint8_t q8[H], qs[H / 16 + 1];
    float sc8[H / 128 + 1];
    for (int64_t m = 0; m < a->M; m++) {
        const float *xm = x + m * ldin;
        uint16_t *b = a->xb16 + m * a->ld;
        float *xv = a->xval ? a->xval + m * K : NULL;
        a->post[m] = W->scale2;
        switch (a->form) {
        case A_BF16:
            for (int64_t k = 0; k < Kp; k++) b[k] = k < K ? mr_f32_to_bf16(xm[k]) : 0;
            if (xv)
                for (int64_t k = 0; k < K; k++) xv[k] = mr_bf16_to_f32(b[k]);
            break;
        case A_F32:
            for (int64_t k = 0; k < Kp; k++) a->xf[m * a->ld + k] = k < K ? xm[k] : 0.0f;
            if (xv) memcpy(xv, xm, sizeof(float) * (size_t)K);
            break;
        case A_F8: /* the reference 1x128 dynamic quantizer; bf16 of the exact E4M3 values */
            mr_fp8_act_quantize_row_ref(xm, K, q8, sc8);
            a->ldxs = Kp / 128;
            for (int64_t k = 0; k < Kp; k++) b[k] = k < K ? mr_f32_to_bf16(mr_e4m3_to_f32(q8[k])) : 0;
            for (int64_t g = 0; g < Kp / 128; g++) a->xs[m * a->ldxs + g] = sc8[g];
            if (xv)
                for (int64_t k = 0; k < K; k++) xv[k] = mr_e4m3_to_f32(q8[k]) * sc8[k / 128];
            break;
        case A_I8: /* w4a8 (this experiment's definition): symmetric int8 per 16, s = amax/127 */
            for (int64_t j = 0; j < Kp / 16; j++) {
                float amax = 0;
                for (int64_t k = 16 * j; k < 16 * j + 16 && k < K; k++) amax = fmaxf(amax, fabsf(xm[k]));
                float s = amax > 0 ? amax / 127.0f : 1.0f, inv = 1.0f / s;
                int32_t sum = 0;
                for (int64_t k = 16 * j; k < 16 * j + 16; k++) {
                    int v = k < K ? (int)lrintf(xm[k] * inv) : 0;
                    v = v > 127 ? 127 : v < -127 ? -127 : v;
                    a->xq[m * a->ld + k] = (int8_t)v, sum += v;
                    if (xv && k < K) xv[k] = (float)v * s;
                }
                a->xs[m * a->ldxs + j] = s, a->xbias[m * a->ldb + j] = -12 * sum;
            }
            break;
        case A_FP4: /* exact W4A4: reference NVFP4 activation quantizer */
            mr_nvfp4_act_quantize_row_ref(xm, K, W->input_scale, q8, qs);
            for (int64_t j = 0; j < Kp / 16; j++) {
                int32_t sum = 0;
                for (int64_t k = 16 * j; k < 16 * j + 16; k++) {
                    int v = k < K ? (int)(2.0f * mr_e2m1_to_f32((uint8_t)((q8[k / 2] >> (4 * (k & 1))) & 15))) : 0;
                    a->xq[m * a->ld + k] = (int8_t)v, sum += v;
                }
                a->xs[m * a->ldxs + j] = 0.5f * mr_e4m3_to_f32(qs[j]);
                a->xbias[m * a->ldb + j] = -12 * sum;
            }
            a->post[m] = W->scale2 * W->input_scale;
            if (xv) mr_nvfp4_act_dequant_row_ref(q8, qs, K, W->input_scale, xv);
            break;
        }
    }
}

/* One 16-row tile for tokens [m0, m0+mt) (mt <= MR_PK_MT unless the kernel is a GEMM one). */
static void tile_call(const variant *v, const pmat *W, int64_t t, const act *a, int64_t m0, int mt, float *y,
                      int64_t ldy, uint16_t *buf) {
    const uint8_t *tile = tile_of(W, t);
    const float *xs = a->form == A_F8 || a->form == A_I8 || a->form == A_FP4 ? a->xs + m0 * a->ldxs : NULL;
    switch (v->k) {
    case K_FP8_BF16:
        mr_pk_fp8_r16_bf16_avx512(tile, bs_of(W, t), W->Kp, a->xb16 + m0 * a->ld, a->ld, xs, a->ldxs, mt, y, ldy);
        break;
    case K_FP8_F32:
        mr_pk_fp8_r16_f32_avx512(tile, bs_of(W, t), W->Kp, a->xf + m0 * a->ld, a->ld, xs, a->ldxs, mt, y, ldy);
        break;
    case K_FP8_GEMM:
        mr_pk_fp8_r16_gemm_bf16_avx512(tile, bs_of(W, t), W->Kp, a->xb16 + m0 * a->ld, a->ld, xs, a->ldxs, mt, y,
                                       ldy, buf);
        break;
    case K_NV_I8:
        mr_pk_nvfp4_r16_i8_avx512(tile, W->Kp, a->xq + m0 * a->ld, a->ld, a->xbias + m0 * a->ldb, a->ldb, xs,
                                  a->ldxs, a->post + m0, mt, y, ldy);
        break;
    case K_NV_BF16:
        mr_pk_nvfp4_r16_bf16_avx512(tile, W->Kp, a->xb16 + m0 * a->ld, a->ld, NULL, 0, a->post + m0, mt, y, ldy);
        break;
    case K_BF16:
        mr_pk_bf16_r16_avx512(tile, W->Kp, a->xb16 + m0 * a->ld, a->ld, mt, y, ldy);
        break;
    }
}
/* All M tokens of one tile into y [M][ldy] (16 columns written per token). */
static void tile_all(const variant *v, const pmat *W, int64_t t, const act *a, float *y, int64_t ldy,
                     uint16_t *buf) {
    if (v->k == K_FP8_GEMM) {
        tile_call(v, W, t, a, 0, (int)a->M, y, ldy, buf);
        return;
    }
    for (int64_t m0 = 0; m0 < a->M; m0 += MR_PK_MT) {
        int mt = a->M - m0 < MR_PK_MT ? (int)(a->M - m0) : MR_PK_MT;
        tile_call(v, W, t, a, m0, mt, y + m0 * ldy, ldy, buf);
    }
}

/* ------------------------------------------------------------------ checks */
static wfmt mrfmt_to(mr_format f) { return f == MR_FMT_FP8_BLOCK ? F_FP8 : f == MR_FMT_NVFP4 ? F_NVFP4 : F_BF16; }

static int pack_from_q(pmat *p, const mr_qmatrix *q, int nvb) {
    pmat_shape(p, mrfmt_to(q->fmt), q->rows, q->cols);
    p->data = xalloc(p->tile_bytes * (size_t)p->nt);
    p->scale2 = q->scale2;
    p->input_scale = q->input_scale;
    if (p->fmt == F_FP8) {
        p->bs = xalloc(sizeof(float) * (size_t)(rup(p->N, 128) / 128 * (p->Kp / 128)));
        mr_pk_fp8_pack(q->data, q->scale, q->rows, q->cols, p->data, p->bs);
    } else if (p->fmt == F_NVFP4) {
        (nvb ? mr_pk_nvfp4b_pack : mr_pk_nvfp4_pack)(q->data, q->scale, q->rows, q->cols, p->data);
    } else {
        mr_pk_bf16_pack(q->data, q->rows, q->cols, p->data);
    }
    return 0;
}

/* Runs variant v on a random [N][K] matrix for M tokens; compares with
 * sum_k dequant(W)[n][k] * xval[m][k] in double. Tolerance: fp32 summation
 * (order differs) => |err| <= 2e-6 * sqrt(K) * sum_k |w x| + 1e-30. Returns max err/bound. */
static double check_one(const variant *v, int64_t N, int64_t K, int64_t M) {
    mr_format mf = v->fmt == F_FP8 ? MR_FMT_FP8_BLOCK : v->fmt == F_NVFP4 ? MR_FMT_NVFP4 : MR_FMT_BF16;
    float *w = xalloc(sizeof(float) * (size_t)(N * K)), *x = xalloc(sizeof(float) * (size_t)(M * K));
    for (int64_t n = 0; n < N; n++) /* per-row magnitude spread exercises the block scales */
        for (int64_t k = 0; k < K; k++) w[n * K + k] = frand() * ldexpf(1.0f, (int)(n % 7) - 3 + (int)(k / 128) % 3);
    for (int64_t i = 0; i < M * K; i++) x[i] = frand() * ldexpf(1.0f, (int)(i % 5) - 2);
    mr_qmatrix q;
    if (mr_qmatrix_quantize(&q, mf, w, N, K, 0.0f) != MR_OK) {
        fprintf(stderr, "quantize failed\n");
        exit(1);
    }
    if (mf == MR_FMT_NVFP4) { /* calibrated activation scale for w4a4 */
        float amax = 0;
        for (int64_t i = 0; i < M * K; i++) amax = fmaxf(amax, fabsf(x[i]));
        q.input_scale = amax / 2688.0f;
    }
    pmat p;
    pack_from_q(&p, &q, v->nvb);
    act a;
    act_alloc(&a, v->act, M, K, p.Kp, 1);
    act_prepare(&a, x, K, &p);
    float *y = xalloc(sizeof(float) * (size_t)(M * p.nt * 16)), *row = xalloc(sizeof(float) * (size_t)K);
    uint16_t *buf = xalloc(4096);
    float *ty = xalloc(sizeof(float) * (size_t)(M * 16));
    for (int64_t t = 0; t < p.nt; t++) {
        tile_all(v, &p, t, &a, ty, 16, buf);
        for (int64_t m = 0; m < M; m++) memcpy(y + m * p.nt * 16 + 16 * t, ty + m * 16, 64);
    }
    double worst = 0;
    for (int64_t n = 0; n < N; n++) {
        mr_qmatrix_dequant_row(&q, n, row);
        for (int64_t m = 0; m < M; m++) {
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                ref += (double)row[k] * a.xval[m * K + k];
                mag += fabs((double)row[k] * a.xval[m * K + k]);
            }
            double err = fabs((double)y[m * p.nt * 16 + n] - ref), bound = 2e-6 * sqrt((double)K) * mag + 1e-30;
            if (!(err / bound <= worst)) worst = err / bound; /* NaN propagates as failure */
        }
    }
    free(w), free(x), free(y), free(row), free(buf), free(ty), free(p.data), free(p.bs);
    act_free(&a);
    mr_qmatrix_free(&q);
    return worst;
}

/* Every E4M3 byte through the fp8 kernels: W[r][c] = (r*128+c)&255, scale 1,
 * one-hot x at column c => y[r] must be exactly e4m3(W[r][c]) (NaN: v1 NaN, v2 skipped). */
static int check_fp8_all_codes(void) {
    const int64_t N = 16, K = 128;
    uint8_t *w = xalloc(N * K), *pk = xalloc(mr_pk_fp8_tile_bytes(K));
    float bs = 1.0f, bsp, xf[128], y[16];
    uint16_t xb[128];
    /* NaN codes would poison the zero-weighted columns; they get their own case below */
    for (int64_t i = 0; i < N * K; i++) w[i] = (i & 127) == 127 ? 0 : (uint8_t)(i & 255);
    mr_pk_fp8_pack(w, &bs, N, K, pk, &bsp);
    int bad = 0;
    for (int c = 0; c < K; c++) {
        for (int k = 0; k < K; k++) xb[k] = k == c ? 0x3F80 : 0, xf[k] = k == c ? 1.0f : 0.0f;
        for (int var = 0; var < 2; var++) {
            if (var == 0)
                mr_pk_fp8_r16_bf16_avx512(pk, &bsp, K, xb, K, NULL, 0, 1, y, 16);
            else
                mr_pk_fp8_r16_f32_avx512(pk, &bsp, K, xf, K, NULL, 0, 1, y, 16);
            for (int r = 0; r < 16; r++) {
                uint8_t b = w[r * K + c];
                float ref = mr_e4m3_to_f32(b);
                if (y[r] != ref) bad++, fprintf(stderr, "v%d code 0x%02X: %g != %g\n", var + 1, b, y[r], ref);
            }
        }
    }
    /* NaN: v1 must give NaN for 0x7F / 0xFF (v2 maps them to 480, documented) */
    for (int nb = 0; nb < 2; nb++) {
        memset(w, 0, N * K);
        w[5 * K + 7] = nb ? 0xFF : 0x7F;
        mr_pk_fp8_pack(w, &bs, N, K, pk, &bsp);
        for (int k = 0; k < K; k++) xb[k] = k == 7 ? 0x3F80 : 0;
        mr_pk_fp8_r16_bf16_avx512(pk, &bsp, K, xb, K, NULL, 0, 1, y, 16);
        if (!isnan(y[5])) bad++, fprintf(stderr, "v1 NaN code not NaN\n");
    }
    free(w), free(pk);
    return bad;
}

/* ------------------------------------------------------------------ timing */
typedef struct {
    wfmt fmt;
    int nexp;
    pmat *w13, *w2; /* [nexp] */
    size_t expert_bytes;
} pool;

static void fill_random_par(uint8_t *p, size_t n, uint8_t andm, uint8_t orm) {
#pragma omp parallel
    {
        uint64_t s = 0x1234567ull + 7919ull * (uint64_t)omp_get_thread_num();
#pragma omp for schedule(static)
        for (size_t i = 0; i < n / 8; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            uint64_t v = s & (0x0101010101010101ull * andm);
            v |= 0x0101010101010101ull * orm;
            memcpy(p + 8 * i, &v, 8);
        }
    }
}

static void pool_make(pool *P, wfmt f, double pool_mb) {
    pmat a, b;
    pmat_shape(&a, f, 2 * I, H);
    pmat_shape(&b, f, H, I);
    P->fmt = f;
    P->expert_bytes = pmat_bytes(&a) + pmat_bytes(&b);
    P->nexp = (int)ceil(pool_mb * 1e6 / (double)P->expert_bytes);
    if (P->nexp < 2 * TOPK) P->nexp = 2 * TOPK;
    P->w13 = xalloc(sizeof(pmat) * (size_t)P->nexp);
    P->w2 = xalloc(sizeof(pmat) * (size_t)P->nexp);
    for (int e = 0; e < P->nexp; e++) {
        pmat *ms[2] = {&P->w13[e], &P->w2[e]};
        pmat_shape(ms[0], f, 2 * I, H);
        pmat_shape(ms[1], f, H, I);
        for (int i = 0; i < 2; i++) {
            pmat *m = ms[i];
            size_t db = m->tile_bytes * (size_t)m->nt;
            m->data = xalloc(db);
            /* fp8: codes without NaN (clear bit 3 of the mantissa... keep |code| <= 0x77); nvfp4: any */
            fill_random_par(m->data, db, f == F_FP8 ? 0xF7 : f == F_BF16 ? 0xBF : 0xFF, 0);
            if (f == F_NVFP4) /* scale bytes: e4m3 in [0x30, 0x3F] */
                for (int64_t t = 0; t < m->nt; t++) fill_random_par((uint8_t *)tile_of(m, t) + 8 * m->Kp, (size_t)m->Kp, 0x0F, 0x30);
            if (f == F_FP8) {
                size_t nb = (size_t)(rup(m->N, 128) / 128 * (m->Kp / 128));
                m->bs = xalloc(sizeof(float) * nb);
                for (size_t j = 0; j < nb; j++) m->bs[j] = 1e-3f;
            }
            m->scale2 = 1e-3f;
            m->input_scale = 0.01f;
        }
    }
}
static void pool_free(pool *P) {
    for (int e = 0; e < P->nexp; e++) free(P->w13[e].data), free(P->w13[e].bs), free(P->w2[e].data), free(P->w2[e].bs);
    free(P->w13), free(P->w2);
}

/* Per-thread scratch, allocated once (no allocation in the timed path). */
typedef struct {
    float *ty; /* [Mmax][16] x 2 */
    uint16_t *buf;
} scratch;

typedef struct {
    const variant *v;
    pool *P;
    int64_t M;
    int ne;       /* experts per call */
    int *ids;     /* [ne] */
    float *rw;    /* [ne] routing weight */
    act a1;       /* input act, shared by all experts */
    act *a2;      /* [ne] down-projection act */
    float *x;     /* [M][H] */
    float *h;     /* [ne][M][I] */
    float *out;   /* [M][H] */
    scratch *sc;  /* [threads] */
} layer;

/* Tiles per task (TB x 16 rows); gate/up are interleaved per tile in the packed
 * gate+up matrix (tile 2i = gate rows 16i.., tile 2i+1 = up rows 16i..), so one
 * task reads 2*TB contiguous tiles. */
static int TB = 4;

static void layer_run(layer *L, int nth) {
    const variant *v = L->v;
    const int64_t M = L->M, ntg = I / 16, ntd = H / 16, nbg = ntg / TB, nbd = ntd / TB;
#pragma omp parallel num_threads(nth)
    {
        scratch *s = &L->sc[omp_get_thread_num()];
        /* phase 1: one flat list of (expert, block of TB 16-column blocks of I): gate+up tiles, SiLU(gate)*up */
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < L->ne * nbg; task++) {
            int e = (int)(task / nbg);
            const pmat *W = &L->P->w13[L->ids[e]];
            float *g = s->ty, *u = s->ty + M * 16;
            for (int64_t t = task % nbg * TB; t < (task % nbg + 1) * TB; t++) {
                tile_all(v, W, 2 * t, &L->a1, g, 16, s->buf);
                tile_all(v, W, 2 * t + 1, &L->a1, u, 16, s->buf);
                for (int64_t m = 0; m < M; m++)
                    for (int r = 0; r < 16; r++) {
                        float gv = g[m * 16 + r];
                        L->h[((int64_t)e * M + m) * I + 16 * t + r] = gv / (1.0f + expf(-gv)) * u[m * 16 + r];
                    }
            }
        }
        /* activation quantization of h for the down projection (per expert) */
#pragma omp for schedule(static)
        for (int e = 0; e < L->ne; e++) act_prepare(&L->a2[e], L->h + (int64_t)e * M * I, I, &L->P->w2[L->ids[e]]);
        /* phase 2: flat list of blocks of TB 16-row tiles of H; each task adds all experts
         * (expert-major inside, so each expert is read as one contiguous run), routing weight at the store */
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < nbd; b++) {
            for (int64_t m = 0; m < M; m++)
                for (int64_t r = 16 * TB * b; r < 16 * TB * (b + 1); r++) L->out[m * H + r] = 0;
            for (int e = 0; e < L->ne; e++)
                for (int64_t t = b * TB; t < (b + 1) * TB; t++) {
                    tile_all(v, &L->P->w2[L->ids[e]], t, &L->a2[e], s->ty, 16, s->buf);
                    for (int64_t m = 0; m < M; m++)
                        for (int r = 0; r < 16; r++) L->out[m * H + 16 * t + r] += L->rw[e] * s->ty[m * 16 + r];
                }
        }
    }
}

static double probe_bw(const uint64_t *buf, size_t n, int nth) {
    double t0 = now_s();
    uint64_t tot = 0;
#pragma omp parallel num_threads(nth) reduction(+ : tot)
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        size_t chunk = n / (size_t)nt / 8 * 8, lo = chunk * (size_t)id, hi = id == nt - 1 ? n : lo + chunk;
        uint64_t s[8] = {0};
        for (size_t i = lo; i + 8 <= hi; i += 8)
            for (int j = 0; j < 8; j++) s[j] += buf[i + j];
        tot += s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
    }
    double dt = now_s() - t0;
    if (tot == 42) dt += 1e-12;
    return (double)(n * 8) / dt / 1e9;
}
static double probe_peak(instr ins, int nth) {
    const int64_t it = 2000000;
    double t0 = now_s(), sink = 0;
#pragma omp parallel num_threads(nth) reduction(+ : sink)
    sink += ins == P_FMA ? mr_pk_probe_fma(it) : ins == P_DPBF16 ? mr_pk_probe_dpbf16(it) : mr_pk_probe_dpbusd(it);
    double dt = now_s() - t0;
    if (sink == 1.2345) dt += 1e-12;
    return (double)it * 12 * instr_ops[ins] * nth / dt / 1e9;
}

/* ------------------------------------------------------------------ main */
static int in_list(const char *list, const char *s) {
    if (!list) return 1;
    size_t n = strlen(s);
    for (const char *p = list; (p = strstr(p, s)) != NULL; p += n)
        if ((p == list || p[-1] == ',') && (p[n] == 0 || p[n] == ',')) return 1;
    return 0;
}
static int parse_ints(const char *s, int *v, int max) {
    int n = 0;
    while (s && *s && n < max) {
        v[n++] = atoi(s);
        s = strchr(s, ',');
        if (s) s++;
    }
    return n;
}

int main(int argc, char **argv) {
    const char *fmts = NULL, *vars = NULL;
    int Ms[8] = {1, 8, 32, 16, 64}, nM = 5, ths[4] = {2, 1}, nth_list = 2, rounds = 5, iters = 5, check_only = 0, hot = 0;
    double pool_mb = 1100;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--check-only")) check_only = 1;
        else if (!strcmp(argv[i], "--hot")) hot = 1;
        else if (!strcmp(argv[i], "--tb") && i + 1 < argc) TB = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--fmt") && i + 1 < argc) fmts = argv[++i];
        else if (!strcmp(argv[i], "--var") && i + 1 < argc) vars = argv[++i];
        else if (!strcmp(argv[i], "--M") && i + 1 < argc) nM = parse_ints(argv[++i], Ms, 8);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) nth_list = parse_ints(argv[++i], ths, 4);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--pool-mb") && i + 1 < argc) pool_mb = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--check-only] [--hot] [--tb 4] [--fmt fp8,nvfp4,bf16] [--var fp8.v1,...] [--M 1,8,32,16,64] "
                            "[--threads 2,1] [--rounds N] [--iters N] [--pool-mb MB]\n", argv[0]);
            return 2;
        }
    }
    static const char *fname[] = {"fp8", "nvfp4", "bf16"};

    /* ---- correctness, every variant, before any timing ---- */
    int fails = check_fp8_all_codes();
    printf("check fp8 all 256 codes (v1 LUT, v2 f16 trick): %s\n", fails ? "FAIL" : "ok");
    for (int vi = 0; vi < NVARS; vi++) {
        const variant *v = &VARS[vi];
        if (!in_list(fmts, fname[v->fmt]) || !in_list(vars, v->name)) continue;
        static const int64_t shapes[][2] = {{200, 320}, {48, 3072}};
        double worst = 0;
        for (int s = 0; s < 2; s++)
            for (int mi = 0; mi < 4; mi++) {
                static const int64_t cm[] = {1, 3, 8, 19};
                int64_t K = shapes[s][1];
                if (v->fmt == F_NVFP4 && s == 0) K = 336;
                if (v->fmt == F_BF16 && s == 0) K = 331;
                double r = check_one(v, shapes[s][0], K, cm[mi]);
                if (!(r <= worst)) worst = r;
            }
        int ok = worst <= 1.0;
        fails += !ok;
        printf("check %-9s %-6s max err/bound %.3g  %s\n", v->name, v->mode, worst, ok ? "ok" : "FAIL");
    }
    if (fails) {
        printf("correctness FAILED: not timing\n");
        return 1;
    }
    if (check_only) return 0;

    /* ---- hot: kernel alone on 8 L2-resident tiles, one thread (isolates compute from DRAM) ---- */
    if (hot) {
        printf("\nhot (8 tiles of the gate/up matrix, L2-resident, 1 thread): weight GB/s the kernel can consume\n");
        for (int vi = 0; vi < NVARS; vi++) {
            const variant *v = &VARS[vi];
            if (!in_list(fmts, fname[v->fmt]) || !in_list(vars, v->name)) continue;
            pool P;
            pool_make(&P, v->fmt, 1);
            for (int mi = 0; mi < nM; mi++) {
                int64_t M = Ms[mi];
                act a;
                float *x = xalloc(sizeof(float) * (size_t)(M * H)), *y = xalloc(sizeof(float) * (size_t)(M * 16));
                uint16_t *buf = xalloc(4096);
                for (int64_t i = 0; i < M * H; i++) x[i] = frand();
                act_alloc(&a, v->act, M, H, P.w13[0].Kp, 0);
                act_prepare(&a, x, H, &P.w13[0]);
                double best = 1e30;
                for (int r = 0; r < 7; r++) {
                    double t0 = now_s();
                    for (int rep = 0; rep < 20; rep++)
                        for (int64_t t = 0; t < 8; t++) tile_all(v, &P.w13[0], t, &a, y, 16, buf);
                    double dt = (now_s() - t0) / 20;
                    if (dt < best) best = dt;
                }
                double bytes = 8.0 * (double)P.w13[0].tile_bytes, ops = 2.0 * (double)M * 8 * 16 * H;
                printf("hot %-9s %-6s M=%3lld  %8.2f GB/s  %8.1f GOP/s\n", v->name, v->mode, (long long)M,
                       bytes / best / 1e9, ops / best / 1e9);
                act_free(&a);
                free(x), free(y), free(buf);
            }
            pool_free(&P);
        }
        return 0;
    }
    /* ---- timing ---- */
    size_t bwn = ((size_t)1 << 30) / 8;
    uint64_t *bwbuf = xalloc(bwn * 8);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < bwn; i++) bwbuf[i] = i; /* pre-fault */
    printf("\nMiniMax-M2 experts H=%d I=%d; decode: M tokens share %d random experts from the pool;"
           " prefill: M tokens on each of 16 random experts\n", H, I, TOPK);
    printf("%-9s %-6s %3s %2s %9s %8s %8s %6s %9s %9s %6s  %s\n", "variant", "mode", "M", "th", "ms(med)", "GB/s",
           "bw", "GB/s%", "GOP/s", "peak", "peak%", "instr");
    for (int f = 0; f < 3; f++) {
        if (!in_list(fmts, fname[f])) continue;
        int any = 0;
        for (int vi = 0; vi < NVARS; vi++) any |= VARS[vi].fmt == (wfmt)f && in_list(vars, VARS[vi].name);
        if (!any) continue;
        pool P;
        pool_make(&P, (wfmt)f, pool_mb);
        for (int vi = 0; vi < NVARS; vi++) {
            const variant *v = &VARS[vi];
            if (v->fmt != (wfmt)f || !in_list(vars, v->name)) continue;
            for (int mi = 0; mi < nM; mi++) {
                int64_t M = Ms[mi];
                int prefill = M == 16 || M == 64;
                if (v->k == K_FP8_GEMM && !prefill) continue; /* v3 is the prefill kernel */
                layer L;
                memset(&L, 0, sizeof L);
                L.v = v, L.P = &P, L.M = M, L.ne = prefill ? 16 : TOPK;
                L.ids = xalloc(sizeof(int) * (size_t)L.ne);
                L.rw = xalloc(sizeof(float) * (size_t)L.ne);
                L.x = xalloc(sizeof(float) * (size_t)(M * H));
                L.h = xalloc(sizeof(float) * (size_t)(L.ne * M * I));
                L.out = xalloc(sizeof(float) * (size_t)(M * H));
                for (int64_t i = 0; i < M * H; i++) L.x[i] = frand();
                act_alloc(&L.a1, v->act, M, H, P.w13[0].Kp, 0);
                act_prepare(&L.a1, L.x, H, &P.w13[0]);
                L.a2 = xalloc(sizeof(act) * (size_t)L.ne);
                for (int e = 0; e < L.ne; e++) act_alloc(&L.a2[e], v->act, M, I, P.w2[0].Kp, 0);
                L.sc = xalloc(sizeof(scratch) * 4);
                for (int s = 0; s < 4; s++) L.sc[s].ty = xalloc(sizeof(float) * (size_t)(M * 32)), L.sc[s].buf = xalloc(4096);
                double t1_med = 0;
                for (int ti = 0; ti < nth_list; ti++) {
                    int nth = ths[ti];
                    int n = rounds * iters;
                    double *tk = xalloc(sizeof(double) * (size_t)n), *bw = xalloc(sizeof(double) * (size_t)rounds),
                           *pk = xalloc(sizeof(double) * (size_t)rounds);
                    for (int r = 0; r < rounds; r++) {
                        bw[r] = probe_bw(bwbuf, bwn, nth);
                        pk[r] = probe_peak(v->ins, nth);
                        for (int it = 0; it < iters; it++) {
                            for (int e = 0; e < L.ne; e++) { /* distinct random experts */
                                int id, dup;
                                do {
                                    id = (int)(rnd() % (uint64_t)P.nexp), dup = 0;
                                    for (int q = 0; q < e; q++) dup |= L.ids[q] == id;
                                } while (dup);
                                L.ids[e] = id, L.rw[e] = 0.125f;
                            }
                            double t0 = now_s();
                            layer_run(&L, nth);
                            tk[r * iters + it] = now_s() - t0;
                        }
                    }
                    double tm = median(tk, n), bwm = median(bw, rounds), pkm = median(pk, rounds);
                    double bytes = (double)P.expert_bytes * L.ne;
                    double ops = 2.0 * (double)M * L.ne * (2.0 * I * H + (double)H * I);
                    double gbs = bytes / tm / 1e9, gops = ops / tm / 1e9;
                    printf("%-9s %-6s %3lld %2d %9.3f %8.2f %8.2f %5.1f%% %9.1f %9.1f %5.1f%%  %s", v->name, v->mode,
                           (long long)M, nth, tm * 1e3, gbs, bwm, 100 * gbs / bwm, gops, pkm, 100 * gops / pkm,
                           instr_name[v->ins]);
                    if (nth == 1 && t1_med > 0) printf("  (2th speedup %.2fx)", tm / t1_med);
                    if (nth == 2) t1_med = tm;
                    printf("\n");
                    fflush(stdout);
                    free(tk), free(bw), free(pk);
                }
                for (int s = 0; s < 4; s++) free(L.sc[s].ty), free(L.sc[s].buf);
                for (int e = 0; e < L.ne; e++) act_free(&L.a2[e]);
                act_free(&L.a1);
                free(L.sc), free(L.a2), free(L.ids), free(L.rw), free(L.x), free(L.h), free(L.out);
            }
        }
        pool_free(&P);
    }
    free(bwbuf);
    return 0;
}
