/* test_quantize_edges.c — the edge cases of weight quantization
 * (spec/formats.md), in the library and through `quantize`:
 *   - an FP8 block whose amax is so small that 448 * (1/amax) overflows
 *     (below about 1.3e-36, down to the smallest subnormal): the scale is
 *     clamped to FLT_MAX, so codes and scale_inv are finite. Checked bit for
 *     bit against the spec's formula, and independently by a property: every
 *     element dequantizes to within half an E4M3 step of its input (the
 *     relative half step 2^-4, or the subnormal one 2^-10 times scale_inv);
 *     mr_matmul on such a block equals the dot product of the dequantized
 *     rows; a checkpoint with such blocks quantizes, loads and runs finite;
 *   - a NaN or infinite weight is refused with MR_EINPUT naming the tensor
 *     and the element's index, before anything is written; for NVFP4 before
 *     calibration (a NaN in the router would otherwise fail calibration
 *     first, with a routing error);
 *   - an all-zero NVFP4 tensor (weight_scale_2 = 0) dequantizes and
 *     multiplies to exact zeros; a checkpoint whose experts are all zero
 *     quantizes to weight_scale_2 = 0, loads, and gives bit for bit the
 *     logits of its bf16 form (its experts add exactly 0 in both). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "moerun/formats.h"
#include "moerun/io.h"
#include "moerun/kernels.h"
#include "moerun/model.h"
#include "testutil.h"

/* the tiny checkpoint: one 128x128 FP8 block per expert matrix, two 128-wide blocks for q */
static const mr_tiny_params TINY = {.hidden = 128, .layers = 2, .experts = 4, .top_k = 2, .inter = 128, .heads = 4,
                                    .kv_heads = 2, .head_dim = 32, .rotary_dim = 16, .vocab = 96, .seed = 7};

/* ---- helpers ---- */
static float bf16_at(const mr_st_tensor *t, size_t i) {
    uint16_t b;
    memcpy(&b, (const unsigned char *)t->data + 2 * i, 2);
    return mr_bf16_to_f32(b);
}

/* Overwrites n_bytes at byte off of tensor name in dir's model.safetensors with src. */
static void patch_tensor(const char *dir, const char *name, uint64_t off, const void *src, size_t n) {
    mr_ckpt *ck = NULL;
    assert_int_equal(mr_ckpt_open(dir, &ck), MR_OK);
    const mr_st_tensor *t = mr_ckpt_find(ck, name);
    assert_non_null(t);
    assert_true(off + n <= t->n_bytes);
    uint64_t at = t->offset + off;
    mr_ckpt_close(ck);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, (long)at, SEEK_SET), 0);
    assert_int_equal(fwrite(src, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* Sets one bf16 element (flat index i) of tensor name to v (any bits). */
static void patch_bf16(const char *dir, const char *name, size_t i, uint16_t bits) {
    patch_tensor(dir, name, 2 * i, &bits, 2);
}

/* Fills a whole bf16 tensor [n] of dir with fn(i). */
static void fill_bf16(const char *dir, const char *name, size_t n, float (*fn)(size_t i, void *u), void *u) {
    uint16_t *b = malloc(2 * n);
    assert_non_null(b);
    for (size_t i = 0; i < n; i++) b[i] = mr_f32_to_bf16(fn(i, u));
    patch_tensor(dir, name, 0, b, 2 * n);
    free(b);
}

/* true if no entry of dir's parent starts with the basename of dir (no OUT, no OUT.tmp.*) */
static bool nothing_written(const char *base, const char *out) {
    struct stat sb;
    if (stat(out, &sb) == 0) return false;
    char cmd[8600];
    snprintf(cmd, sizeof cmd, "ls -a '%s' | grep -q '\\.tmp\\.'", base);
    return system(cmd) != 0;
}

/* ---- FP8: tiny amax ---- */
/* The spec's scale: 448 * (1/amax) in fp32, 1 for amax 0, clamped to FLT_MAX. */
static float spec_scale(float amax) {
    if (amax == 0.0f) return 1.0f;
    volatile float r = 1.0f / amax; /* two fp32 roundings, as torch does */
    float s = 448.0f * r;
    return s > FLT_MAX ? FLT_MAX : s;
}

/* The property: |deq - w| <= max(|w| 2^-4, scale_inv 2^-10) (E4M3's half step,
 * relative or subnormal) plus the fp32 rounding of the product and of
 * scale * scale_inv != 1. Computed in double. */
static bool within_half_step(float w, float deq, float sinv) {
    double aw = fabs((double)w);
    double bound = fmax(aw * 0x1p-4, (double)sinv * 0x1p-10) * (1.0 + 0x1p-20) + aw * 0x1p-20 + 0x1p-149;
    return isfinite(deq) && fabs((double)deq - (double)w) <= bound;
}

/* Checks codes and scale of block (bi, bj) of q against w, the spec and the property. */
static void check_fp8_block(const mr_qmatrix *q, const float *w, int64_t bi, int64_t bj) {
    const int64_t N = q->rows, K = q->cols, kb = (K + 127) / 128;
    float amax = 0.0f;
    for (int64_t r = bi * 128; r < N && r < bi * 128 + 128; r++)
        for (int64_t c = bj * 128; c < K && c < bj * 128 + 128; c++) amax = fmaxf(amax, fabsf(w[r * K + c]));
    const float s = spec_scale(amax), sinv = ((const float *)q->scale)[bi * kb + bj];
    assert_true(isfinite(sinv) && sinv > 0.0f);
    assert_true(sinv == 1.0f / s);
    for (int64_t r = bi * 128; r < N && r < bi * 128 + 128; r++)
        for (int64_t c = bj * 128; c < K && c < bj * 128 + 128; c++) {
            const uint8_t code = ((const uint8_t *)q->data)[r * K + c];
            assert_true((code & 0x7F) != 0x7F); /* never NaN */
            float v = w[r * K + c] * s;
            v = v > 448.0f ? 448.0f : v < -448.0f ? -448.0f : v;
            assert_int_equal(code, mr_f32_to_e4m3(v));
            float deq = mr_e4m3_to_f32(code) * sinv;
            if (!within_half_step(w[r * K + c], deq, sinv))
                fail_msg("block (%lld, %lld), amax %g: w %g dequantizes to %g (scale_inv %g)", (long long)bi,
                         (long long)bj, (double)amax, (double)w[r * K + c], (double)deq, (double)sinv);
        }
}

static void test_fp8_tiny_amax(void **st) {
    (void)st;
    /* around the overflow (448/FLT_MAX = 1.317e-36), then down to the smallest subnormal */
    const float amaxes[] = {2e-36f, 1.32e-36f, 1.3e-36f, 1e-36f, 1e-37f, 1e-38f, 0x1p-126f, 3e-39f, 1e-40f,
                            1e-42f, 1e-44f, 0x1p-149f};
    enum { N = 136, K = 256 }; /* two block columns, a partial second block row */
    float *w = malloc(sizeof(float) * N * K), x[K], y[N], row[K];
    assert_non_null(w);
    tu_rng rng = {11};
    for (size_t a = 0; a < sizeof amaxes / sizeof amaxes[0]; a++) {
        const float A = amaxes[a];
        for (int64_t r = 0; r < N; r++)
            for (int64_t c = 0; c < K; c++) {
                float u = 2.0f * tu_uniform(&rng) - 1.0f;
                float v = c < 128 ? A * u : 0.03f * tu_normal(&rng); /* tiny block(s) | ordinary block(s) */
                if (c < 128 && (r + c) % 17 == 0) v = (r % 2) ? -0.0f : 0.0f; /* zeros: NaN codes before */
                w[r * K + c] = v;
            }
        w[5 * K + 7] = -A; /* the block's amax, exactly */
        w[130 * K + 100] = A;
        mr_qmatrix q;
        assert_int_equal(mr_qmatrix_quantize(&q, MR_FMT_FP8_BLOCK, w, N, K, 0.0f), MR_OK);
        for (int64_t bi = 0; bi < 2; bi++)
            for (int64_t bj = 0; bj < 2; bj++) check_fp8_block(&q, w, bi, bj);
        /* the tiny block's scale is the clamp: scale_inv = 1/FLT_MAX = 2^-128 */
        if (A < 1.3e-36f) assert_true(((const float *)q.scale)[0] == 0x1p-128f);
        /* mr_matmul (the host's kernels) agrees with the dequantized rows, on the tiny block alone */
        for (int k = 0; k < K; k++) x[k] = k < 128 ? (float)((k % 5) - 2) : 0.0f; /* exact in bf16 */
        mr_matmul(&q, x, 1, y);
        for (int64_t n = 0; n < N; n++) {
            mr_qmatrix_dequant_row(&q, n, row);
            double ref = 0, mag = 0;
            for (int k = 0; k < K; k++) ref += (double)row[k] * x[k], mag += fabs((double)row[k] * x[k]);
            assert_true(isfinite(y[n]));
            if (fabs((double)y[n] - ref) > 1e-3 * mag + 0x1p-140)
                fail_msg("amax %g, row %lld: matmul %g, dequantized rows %g", (double)A, (long long)n, (double)y[n],
                         ref);
        }
        mr_qmatrix_free(&q);
    }
    free(w);
}

typedef struct {
    float amax;
    uint64_t seed;
} tiny_fill;
static float tiny_value(size_t i, void *u) {
    tiny_fill *f = u;
    tu_rng r = {f->seed + i};
    return f->amax * (2.0f * tu_uniform(&r) - 1.0f) * (i % 13 == 0 ? 0.0f : 1.0f);
}

/* Through `quantize --to fp8`: blocks of tiny weights in a checkpoint */
static void test_fp8_tiny_amax_checkpoint(void **st) {
    (void)st;
    char *base = tu_tmpdir("qedge_fp8");
    char in[4200], out[4200];
    snprintf(in, sizeof in, "%s/bf16", base);
    snprintf(out, sizeof out, "%s/fp8", base);
    assert_int_equal(mr_tiny_write(in, &TINY), MR_OK);
    const struct {
        const char *name;
        size_t n;
        float amax;
    } tiny[] = {
        {"model.layers.0.block_sparse_moe.experts.1.w1.weight", 128 * 128, 1e-37f},
        {"model.layers.0.block_sparse_moe.experts.2.w2.weight", 128 * 128, 1e-40f}, /* bf16 subnormals */
        {"model.layers.1.self_attn.o_proj.weight", 128 * 128, 1e-38f},
    };
    for (size_t i = 0; i < sizeof tiny / sizeof tiny[0]; i++) {
        tiny_fill f = {tiny[i].amax, 100 * i};
        fill_bf16(in, tiny[i].name, tiny[i].n, tiny_value, &f);
    }
    mr_quantize_params qp = {.to = MR_FMT_FP8_BLOCK};
    assert_int_equal(mr_model_quantize(in, out, &qp), MR_OK);
    mr_ckpt *ci = NULL, *co = NULL;
    assert_int_equal(mr_ckpt_open(in, &ci), MR_OK);
    assert_int_equal(mr_ckpt_open(out, &co), MR_OK);
    for (size_t i = 0; i < sizeof tiny / sizeof tiny[0]; i++) {
        const mr_st_tensor *t = mr_ckpt_find(ci, tiny[i].name), *qd = mr_ckpt_find(co, tiny[i].name);
        char nm[400];
        snprintf(nm, sizeof nm, "%.*s.weight_scale_inv", (int)(strlen(tiny[i].name) - 7), tiny[i].name);
        const mr_st_tensor *qs = mr_ckpt_find(co, nm);
        assert_non_null(t);
        assert_non_null(qd);
        assert_non_null(qs);
        assert_int_equal(qd->dtype, MR_ST_F8_E4M3);
        float *w = malloc(sizeof(float) * tiny[i].n), sinv;
        uint8_t *codes = malloc(tiny[i].n);
        assert_non_null(w);
        assert_non_null(codes);
        for (size_t e = 0; e < tiny[i].n; e++) w[e] = bf16_at(t, e);
        memcpy(codes, qd->data, tiny[i].n);
        memcpy(&sinv, qs->data, 4);
        assert_true(sinv == 0x1p-128f); /* the clamped scale */
        mr_qmatrix q = {.fmt = MR_FMT_FP8_BLOCK, .rows = 128, .cols = 128, .data = codes, .scale = &sinv, .scale2 = 1.0f};
        check_fp8_block(&q, w, 0, 0);
        free(w);
        free(codes);
    }
    mr_ckpt_close(ci);
    mr_ckpt_close(co);
    /* the quantized checkpoint loads and runs to finite logits, on each runner that takes FP8 */
    const char *runners[] = {"reference", "routed"};
    for (size_t r = 0; r < 2; r++) {
        mr_model_opts o = {.max_batch = 1, .max_ctx = 16, .runner = runners[r], .quiet = true};
        mr_model *m = NULL;
        assert_int_equal(mr_model_open(out, &o, &m), MR_OK);
        assert_string_equal(mr_model_runner_name(m), runners[r]);
        int32_t toks[6] = {1, 5, 9, 33, 64, 95};
        int64_t nt = 6;
        int slot = 0;
        float *logits = malloc(sizeof(float) * (size_t)TINY.vocab);
        assert_non_null(logits);
        mr_batch b = {.n_seq = 1, .seq = &slot, .n_tok = &nt, .tokens = toks};
        assert_int_equal(mr_model_forward(m, &b, logits), MR_OK);
        for (int64_t v = 0; v < TINY.vocab; v++) assert_true(isfinite(logits[v]));
        free(logits);
        mr_model_close(m);
    }
    tu_rmtree(base);
    free(base);
}

/* ---- NaN / inf weights ---- */
static void expect_refused(const char *base, const char *in, mr_format to, const char *name, const char *idx,
                           const char *what) {
    char out[4200];
    snprintf(out, sizeof out, "%s/out_%s", base, to == MR_FMT_NVFP4 ? "nvfp4" : "fp8");
    mr_quantize_params qp = {.to = to, .calib_tokens = 16};
    assert_int_equal(mr_model_quantize(in, out, &qp), MR_EINPUT);
    const char *msg = mr_error_last();
    char want[512];
    snprintf(want, sizeof want, "%s [%s]", name, idx);
    if (!strstr(msg, want) || !strstr(msg, what)) fail_msg("expected '%s' ... '%s' in: %s", want, what, msg);
    assert_true(nothing_written(base, out));
}

static void test_nonfinite_named(void **st) {
    (void)st;
    char *base = tu_tmpdir("qedge_nan");
    char in[4200];
    snprintf(in, sizeof in, "%s/bf16", base);
    assert_int_equal(mr_tiny_write(in, &TINY), MR_OK);
    /* a NaN in the router's gate of layer 1 at [2, 77]: calibration routes through it */
    const char *gate = "model.layers.1.block_sparse_moe.gate.weight";
    patch_bf16(in, gate, 2 * 128 + 77, 0x7FC1);
    expect_refused(base, in, MR_FMT_NVFP4, gate, "2, 77", "NaN");
    expect_refused(base, in, MR_FMT_FP8_BLOCK, gate, "2, 77", "NaN");
    patch_bf16(in, gate, 2 * 128 + 77, 0x0000);
    /* -inf in an expert's w3 at [127, 0] (the tensor's last row) */
    const char *w3 = "model.layers.0.block_sparse_moe.experts.3.w3.weight";
    patch_bf16(in, w3, 127 * 128 + 0, 0xFF80);
    expect_refused(base, in, MR_FMT_FP8_BLOCK, w3, "127, 0", "infinite");
    expect_refused(base, in, MR_FMT_NVFP4, w3, "127, 0", "infinite");
    patch_bf16(in, w3, 127 * 128 + 0, 0x3C00);
    /* +inf in an F32 vector (the routing bias [4]) at [3] */
    const char *bias = "model.layers.0.block_sparse_moe.e_score_correction_bias";
    const uint32_t pinf = 0x7F800000u, one = 0x3F800000u;
    patch_tensor(in, bias, 3 * 4, &pinf, 4);
    expect_refused(base, in, MR_FMT_NVFP4, bias, "3", "infinite");
    expect_refused(base, in, MR_FMT_FP8_BLOCK, bias, "3", "infinite");
    patch_tensor(in, bias, 3 * 4, &one, 4);
    /* and, all finite again, both quantize */
    char out[4200];
    snprintf(out, sizeof out, "%s/ok", base);
    mr_quantize_params qp = {.to = MR_FMT_NVFP4, .calib_tokens = 16};
    assert_int_equal(mr_model_quantize(in, out, &qp), MR_OK);
    tu_rmtree(base);
    free(base);
}

/* ---- NVFP4: all-zero tensors ---- */
static void test_nvfp4_zero_matrix(void **st) {
    (void)st;
    enum { N = 48, K = 64 };
    float *w = calloc(N * K, sizeof(float)), x[K], y[N], row[K];
    assert_non_null(w);
    w[7] = -0.0f;
    for (int k = 0; k < K; k++) x[k] = (float)(k % 9) - 4.0f;
    mr_qmatrix q;
    assert_int_equal(mr_qmatrix_quantize(&q, MR_FMT_NVFP4, w, N, K, 0.0f), MR_OK);
    assert_true(q.scale2 == 0.0f);
    for (size_t i = 0; i < (size_t)N * K / 2; i++) assert_int_equal(((const uint8_t *)q.data)[i] & 0x77, 0); /* ±0 */
    for (size_t i = 0; i < (size_t)N * K / 16; i++) assert_true((((const uint8_t *)q.scale)[i] & 0x7F) != 0x7F);
    for (int64_t n = 0; n < N; n++) {
        mr_qmatrix_dequant_row(&q, n, row);
        for (int k = 0; k < K; k++) assert_true(row[k] == 0.0f);
    }
    q.input_scale = 1.0f / 2688.0f;
    mr_matmul(&q, x, 1, y);
    for (int64_t n = 0; n < N; n++) assert_true(y[n] == 0.0f);
    mr_qmatrix_free(&q);
    free(w);
}

static float zero_value(size_t i, void *u) {
    (void)i, (void)u;
    return 0.0f;
}

/* Logits of dir's model for a fixed prompt on runner (act mode mode) into l [vocab]. */
static void run_logits(const char *dir, const char *runner, mr_act_mode mode, float *l) {
    mr_model_opts o = {.max_batch = 1, .max_ctx = 16, .runner = runner, .act_mode = mode, .quiet = true};
    mr_model *m = NULL;
    assert_int_equal(mr_model_open(dir, &o, &m), MR_OK);
    assert_string_equal(mr_model_runner_name(m), runner); /* no silent fallback */
    if (mode != MR_ACT_AUTO) assert_int_equal(mr_model_act_mode(m), mode);
    int32_t toks[7] = {3, 1, 4, 1, 5, 9, 26};
    int64_t nt = 7;
    int slot = 0;
    mr_batch b = {.n_seq = 1, .seq = &slot, .n_tok = &nt, .tokens = toks};
    assert_int_equal(mr_model_forward(m, &b, l), MR_OK);
    /* one decode step as well (the single-token kernels) */
    int32_t t1 = 42;
    int64_t n1 = 1;
    mr_batch b1 = {.n_seq = 1, .seq = &slot, .n_tok = &n1, .tokens = &t1};
    assert_int_equal(mr_model_forward(m, &b1, l + TINY.vocab), MR_OK);
    mr_model_close(m);
}

static void test_nvfp4_zero_checkpoint(void **st) {
    (void)st;
    char *base = tu_tmpdir("qedge_zero");
    char in[4200], out[4200];
    snprintf(in, sizeof in, "%s/bf16", base);
    snprintf(out, sizeof out, "%s/nvfp4", base);
    assert_int_equal(mr_tiny_write(in, &TINY), MR_OK);
    char nm[320];
    for (int l = 0; l < TINY.layers; l++)
        for (int e = 0; e < TINY.experts; e++)
            for (int j = 1; j <= 3; j++) {
                snprintf(nm, sizeof nm, "model.layers.%d.block_sparse_moe.experts.%d.w%d.weight", l, e, j);
                fill_bf16(in, nm, 128 * 128, zero_value, NULL);
            }
    mr_quantize_params qp = {.to = MR_FMT_NVFP4, .calib_tokens = 32};
    assert_int_equal(mr_model_quantize(in, out, &qp), MR_OK);
    mr_ckpt *co = NULL;
    assert_int_equal(mr_ckpt_open(out, &co), MR_OK);
    for (int l = 0; l < TINY.layers; l++)
        for (int e = 0; e < TINY.experts; e++)
            for (int j = 1; j <= 3; j++) {
                snprintf(nm, sizeof nm, "model.layers.%d.block_sparse_moe.experts.%d.w%d.weight_scale_2", l, e, j);
                const mr_st_tensor *t = mr_ckpt_find(co, nm);
                assert_non_null(t);
                float s2;
                memcpy(&s2, t->data, 4);
                assert_true(s2 == 0.0f);
                snprintf(nm, sizeof nm, "model.layers.%d.block_sparse_moe.experts.%d.w%d.input_scale", l, e, j);
                t = mr_ckpt_find(co, nm);
                assert_non_null(t);
                memcpy(&s2, t->data, 4);
                assert_true(isfinite(s2) && s2 > 0.0f);
            }
    mr_ckpt_close(co);
    /* experts that add exactly 0 in both forms: the logits are the bf16 model's, bit for bit */
    const int64_t V = TINY.vocab;
    float *ref = malloc(sizeof(float) * 2 * (size_t)V), *got = malloc(sizeof(float) * 2 * (size_t)V);
    assert_non_null(ref);
    assert_non_null(got);
    run_logits(in, "reference", MR_ACT_AUTO, ref);
    for (int64_t v = 0; v < 2 * V; v++) assert_true(isfinite(ref[v]));
    const struct {
        const char *runner;
        mr_act_mode mode;
    } runs[] = {{"reference", MR_ACT_AUTO}, {"routed", MR_ACT_W4A4}, {"routed", MR_ACT_W4A8}, {"routed", MR_ACT_W4A16}};
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        run_logits(out, runs[r].runner, runs[r].mode, got);
        for (int64_t v = 0; v < 2 * V; v++)
            if (!(got[v] == ref[v]))
                fail_msg("%s %s: logit %lld is %g, the bf16 model's %g", runs[r].runner,
                         mr_act_mode_name(runs[r].mode), (long long)v, (double)got[v], (double)ref[v]);
    }
    /* one all-zero expert among ordinary ones: weight_scale_2 = 0 beside positive ones, finite logits */
    char in2[4200], out2[4200];
    snprintf(in2, sizeof in2, "%s/bf16_one", base);
    snprintf(out2, sizeof out2, "%s/nvfp4_one", base);
    assert_int_equal(mr_tiny_write(in2, &TINY), MR_OK);
    for (int j = 1; j <= 3; j++) {
        snprintf(nm, sizeof nm, "model.layers.0.block_sparse_moe.experts.1.w%d.weight", j);
        fill_bf16(in2, nm, 128 * 128, zero_value, NULL);
    }
    assert_int_equal(mr_model_quantize(in2, out2, &qp), MR_OK);
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        run_logits(out2, runs[r].runner, runs[r].mode, got);
        for (int64_t v = 0; v < 2 * V; v++) assert_true(isfinite(got[v]));
    }
    free(ref);
    free(got);
    tu_rmtree(base);
    free(base);
}

int main(void) {
    tu_isa_begin("test_quantize_edges");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_tiny_amax),
        cmocka_unit_test(test_fp8_tiny_amax_checkpoint),
        cmocka_unit_test(test_nonfinite_named),
        cmocka_unit_test(test_nvfp4_zero_matrix),
        cmocka_unit_test(test_nvfp4_zero_checkpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
