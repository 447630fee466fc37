/* test_moe_matrix.c — the cross-runner matrix: every (runner x weight
 * format x activation mode x routing preset the runner accepts) on the same
 * inputs against `reference`, over a table of shapes (T 1..300, E 8..256,
 * k 1..8, H/I non-multiples of 128 where the format allows, and the real
 * 3072/1536). Run once per kernel level by CTest (MOERUN_TEST_ISA: generic, AVX2, AVX-512).
 *
 * Rules: the fused runner's selected experts equal mr_route's exactly (and
 * its weights within 1e-5 relative); every output element is written (the
 * buffer is prefilled with a sentinel NaN pattern); the max error over the
 * tensor, relative to the largest reference magnitude, is within the mode's
 * tolerance (tol_for below, justified there). A mutation check turns on a
 * test-only switch and asserts that the comparison FAILS. Weights are
 * N(0, 1/H) or N(0, 1/I), activations N(0, 1). Larger shapes run with
 * MOERUN_TEST_LARGE=1. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moerun/kernels.h"
#include "moerun/moe.h"
#include "testutil.h"

/* Max |y - ref| / max |ref| allowed, per activation mode.
 * - w16a32: identical inputs; fp32 accumulation (SIMD order) vs the
 *   reference's double over K <= 3072 terms: relative error ~ sqrt(K) 2^-24,
 *   bounded by K 2^-24 = 1.8e-4. Then h goes through SiLU in fp32 and the
 *   same bound again: 4e-4.
 * - bf16-activation modes (w16a16, w8a16, w4a16): GEMM1 sees identical bf16
 *   inputs, but h is rounded to bf16 from slightly different fp32 values, so
 *   an element can land one bf16 ulp (2^-8 relative) apart; averaged over I
 *   products this stays far below 2^-8: 4e-3.
 * - w8a8: same, but a flip of the e4m3 rounding of h moves one element by
 *   2^-4 relative (3 mantissa bits): 1.5e-2.
 * - w4a8: int8 per 128 group, a flip is 1/127 of the group amax: 1e-2.
 * - w4a4: e2m1 of h, a flip moves one element by up to 1/3 of its value
 *   (2 -> 3 is the widest step relative to the value); a few flips over I
 *   terms: 4e-2.
 * - bf16 output dtype adds one bf16 ulp of each output (2^-8 of the element,
 *   at most 2^-8 of the max): + 4e-3. */
static double tol_for(mr_act_mode m, mr_format dt) {
    double t = 0;
    switch (m) {
    case MR_ACT_W16A32: t = 4e-4; break;
    case MR_ACT_W16A16:
    case MR_ACT_W8A16:
    case MR_ACT_W4A16: t = 4e-3; break;
    case MR_ACT_W8A8: t = 1.5e-2; break;
    case MR_ACT_W4A8: t = 1e-2; break;
    case MR_ACT_W4A4: t = 4e-2; break;
    default: fail_msg("mode");
    }
    return t + (dt == MR_FMT_BF16 ? 4e-3 : 0);
}

typedef struct {
    int64_t T;
    int E, k;
    int64_t H, I;
    mr_routing_id routing;
    int n_group, topk_group;
    float scale;
    bool large; /* only with MOERUN_TEST_LARGE=1 */
    bool real;  /* a real-shape case: fewer modes (see run_case) */
} mcase;

static const mcase cases[] = {
    {1, 8, 1, 128, 64, MR_ROUTING_RENORMALIZE, 0, 0, 1.0f, false, false},
    {3, 8, 2, 208, 80, MR_ROUTING_SOFTMAX_TOPK, 0, 0, 1.0f, false, false},
    {3, 8, 2, 100, 60, MR_ROUTING_SIGMOID, 0, 0, 1.0f, false, false}, /* H, I not multiples of 16: no nvfp4 */
    {17, 64, 8, 208, 80, MR_ROUTING_SIGMOID_RENORM, 0, 0, 1.0f, false, false},
    {17, 256, 8, 96, 32, MR_ROUTING_MINIMAX2, 0, 0, 1.0f, false, false},
    {64, 64, 2, 128, 144, MR_ROUTING_TOPK_SOFTMAX, 0, 0, 1.0f, false, false},
    {64, 64, 8, 64, 48, MR_ROUTING_DEEPSEEK_V3, 8, 4, 2.5f, false, false},
    {300, 8, 2, 64, 48, MR_ROUTING_TOPK, 0, 0, 1.0f, false, false}, /* 75 rows per expert: > one 64-row chunk */
    {300, 4, 2, 144, 80, MR_ROUTING_RENORMALIZE, 0, 0, 1.0f, false, false}, /* 150 per expert: > one 128-row chunk, gemm kernels */
    {17, 8, 1, 64, 32, MR_ROUTING_LLAMA4, 0, 0, 1.0f, false, false},
    {1, 4, 2, 3072, 1536, MR_ROUTING_MINIMAX2, 0, 0, 1.0f, false, true},
    {3, 4, 2, 3072, 1536, MR_ROUTING_RENORMALIZE, 0, 0, 1.0f, true, true},
    {300, 256, 8, 256, 128, MR_ROUTING_MINIMAX2, 0, 0, 1.0f, true, false},
};

static const mr_act_mode modes_bf16[] = {MR_ACT_W16A32, MR_ACT_W16A16};
static const mr_act_mode modes_fp8[] = {MR_ACT_W8A8, MR_ACT_W8A16};
static const mr_act_mode modes_nvfp4[] = {MR_ACT_W4A4, MR_ACT_W4A8, MR_ACT_W4A16};

static bool quiet; /* mutation runs: failures are expected, keep the log short */
static const uint32_t SENT32 = 0x7FA5A5A5u; /* a NaN no runner produces */
static const uint16_t SENT16 = 0x7FA5u;

static mr_moe_weights *make_weights(const mcase *c, mr_format fmt, uint64_t seed) {
    mr_moe_weights *w;
    assert_int_equal(mr_moe_weights_new(&w, c->E, c->H, c->I, fmt), MR_OK);
    tu_rng r = {seed};
    size_t n = (size_t)(c->H * c->I);
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    for (int e = 0; e < c->E; e++) {
        float amax = 0;
        for (size_t i = 0; i < n; i++) a[i] = tu_normal(&r) / sqrtf((float)c->H), amax = fmaxf(amax, fabsf(a[i]));
        for (size_t i = 0; i < n; i++) b[i] = tu_normal(&r) / sqrtf((float)c->H), amax = fmaxf(amax, fabsf(b[i]));
        /* w1/w3 share weight_scale_2 (NVFP4), as ModelOpt does */
        assert_int_equal(mr_qmatrix_quantize(&w->w1[e], fmt, a, c->I, c->H, amax), MR_OK);
        assert_int_equal(mr_qmatrix_quantize(&w->w3[e], fmt, b, c->I, c->H, amax), MR_OK);
        for (size_t i = 0; i < n; i++) a[i] = tu_normal(&r) / sqrtf((float)c->I);
        assert_int_equal(mr_qmatrix_quantize(&w->w2[e], fmt, a, c->H, c->I, 0.0f), MR_OK);
    }
    free(a);
    free(b);
    return w;
}

typedef struct {
    int n_compared, n_failed;
    double worst_ratio;
} tally;

/* Runs one runner and compares with ref_out. Returns the error ratio
 * (err / tol), or INFINITY on a selection mismatch / unwritten element. */
static double run_and_compare(const mr_moe_runner *r, const mr_moe_problem *p, const mr_moe_weights *base,
                              const mr_routing *ro, const float *logits, const int32_t *ids, const float *wts,
                              const void *x, int64_t T, const void *ref_out, const char *label) {
    mr_moe_weights *w;
    assert_int_equal(mr_moe_weights_clone(base, &w), MR_OK);
    mr_moe_ctx *ctx;
    mr_status st = mr_moe_ctx_new(r, p, T, &ctx);
    if (!st) st = mr_moe_ctx_prepare(ctx, w);
    if (st) fail_msg("%s: ctx: %s", label, mr_error_last());
    const int64_t H = p->hidden;
    const bool bf = p->act_dtype == MR_FMT_BF16;
    void *out = malloc((size_t)(T * H) * 4);
    for (int64_t i = 0; i < T * H; i++)
        if (bf) ((uint16_t *)out)[i] = SENT16;
        else memcpy((float *)out + i, &SENT32, 4);
    int32_t *ids_out = malloc(sizeof(int32_t) * (size_t)(T * p->top_k));
    float *w_out = malloc(sizeof(float) * (size_t)(T * p->top_k));
    mr_moe_args a = {.T = T, .x = x, .out = out, .ids = ids, .weights = wts, .logits = logits, .routing = ro,
                     .ids_out = ids_out, .weights_out = w_out};
    st = mr_moe_run(ctx, w, &a);
    if (st) fail_msg("%s: run: %s", label, mr_error_last());
    double ratio = 0;
    if (r->routes_itself) /* the selection must match mr_route exactly */
        for (int64_t i = 0; i < T * p->top_k; i++) {
            if (ids_out[i] != ids[i]) {
                if (!quiet) print_message("%s: token %lld choice %lld: fused chose %d, mr_route %d\n", label, (long long)(i / p->top_k),
                              (long long)(i % p->top_k), ids_out[i], ids[i]);
                ratio = INFINITY;
                break;
            }
            if (fabsf(w_out[i] - wts[i]) > 1e-5f * fabsf(wts[i]) + 1e-30f) {
                if (!quiet) print_message("%s: weight %lld: fused %.9g, mr_route %.9g\n", label, (long long)i, w_out[i], wts[i]);
                ratio = INFINITY;
                break;
            }
        }
    double err = 0, mag = 0;
    for (int64_t i = 0; i < T * H && isfinite(ratio); i++) {
        float y, yr;
        if (bf) {
            if (((uint16_t *)out)[i] == SENT16) {
                print_message("%s: element %lld not written\n", label, (long long)i);
                ratio = INFINITY;
                break;
            }
            y = mr_bf16_to_f32(((uint16_t *)out)[i]);
            yr = mr_bf16_to_f32(((const uint16_t *)ref_out)[i]);
        } else {
            uint32_t u;
            memcpy(&u, (float *)out + i, 4);
            if (u == SENT32) {
                print_message("%s: element %lld not written\n", label, (long long)i);
                ratio = INFINITY;
                break;
            }
            y = ((float *)out)[i];
            yr = ((const float *)ref_out)[i];
        }
        if (!isfinite(y)) {
            ratio = INFINITY;
            break;
        }
        err = fmax(err, fabs((double)y - yr));
        mag = fmax(mag, fabs((double)yr));
    }
    if (isfinite(ratio)) ratio = err / (mag > 0 ? mag : 1) / tol_for(p->act_mode, p->act_dtype);
    mr_moe_ctx_free(ctx);
    mr_moe_weights_free(w);
    free(out), free(ids_out), free(w_out);
    return ratio;
}

/* The whole matrix for one case; returns the number of failed comparisons. */
static int run_case(const mcase *c, int ci, tally *ty) {
    const int64_t T = c->T, H = c->H;
    const int E = c->E, k = c->k;
    tu_rng r = {1000 + (uint64_t)ci};
    float *x = malloc(sizeof(float) * (size_t)(T * H));
    uint16_t *xb = malloc(2 * (size_t)(T * H));
    float *xbw = malloc(sizeof(float) * (size_t)(T * H));
    for (int64_t i = 0; i < T * H; i++) {
        x[i] = tu_normal(&r);
        xb[i] = mr_f32_to_bf16(x[i]);
        xbw[i] = mr_bf16_to_f32(xb[i]);
    }
    float *logits = malloc(sizeof(float) * (size_t)(T * E)), *bias = malloc(sizeof(float) * (size_t)E);
    for (int64_t i = 0; i < T * E; i++) logits[i] = 2.0f * tu_normal(&r);
    for (int i = 0; i < E; i++) bias[i] = 0.1f * tu_normal(&r);
    mr_routing ro = {.method = c->routing, .n_experts = E, .top_k = k, .n_group = c->n_group, .topk_group = c->topk_group,
                     .scale = c->scale, .bias = mr_routing_uses_bias(c->routing) ? bias : NULL};
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * k));
    float *wts = malloc(sizeof(float) * (size_t)(T * k));
    if (mr_route(&ro, logits, T, ids, wts) != MR_OK) fail_msg("case %d: mr_route: %s", ci, mr_error_last());

    const mr_format fmts[] = {MR_FMT_BF16, MR_FMT_FP8_BLOCK, MR_FMT_NVFP4};
    int failed = 0;
    for (int f = 0; f < 3; f++) {
        mr_format fmt = fmts[f];
        if (fmt == MR_FMT_NVFP4 && (H % 16 || c->I % 16)) continue;
        const mr_act_mode *modes = fmt == MR_FMT_BF16 ? modes_bf16 : fmt == MR_FMT_FP8_BLOCK ? modes_fp8 : modes_nvfp4;
        int nm = fmt == MR_FMT_NVFP4 ? 3 : 2;
        if (c->real && !c->large && fmt == MR_FMT_BF16) continue; /* default real-shape case: fp8 + nvfp4 */
        mr_moe_weights *base = make_weights(c, fmt, 5000 + (uint64_t)(ci * 10 + f));
        for (int mi = 0; mi < nm; mi++) {
            mr_act_mode mode = modes[mi];
            if (c->real && !c->large && mi > 0) continue; /* real shape by default: the GPU-faithful mode only */
            if (mode == MR_ACT_W4A4) assert_int_equal(mr_moe_weights_calibrate(base, xbw, T), MR_OK);
            for (int dt = 0; dt < 2; dt++) {
                mr_format adt = dt ? MR_FMT_BF16 : MR_FMT_F32;
                if (dt && (mi > 0 || c->real)) continue; /* bf16 I/O: once per format */
                const void *xin = dt ? (const void *)xb : (const void *)xbw;
                mr_moe_problem p = {.device = MR_DEVICE_CPU, .cpu_flags = mr_cpu()->flags, .weight_format = fmt,
                                    .act_mode = mode, .act_dtype = adt, .routing = c->routing, .n_experts = E,
                                    .top_k = k, .n_group = c->n_group, .topk_group = c->topk_group, .hidden = H,
                                    .inter = c->I, .a2a = MR_A2A_NONE};
                /* the reference output */
                mr_moe_weights *rw;
                assert_int_equal(mr_moe_weights_clone(base, &rw), MR_OK);
                mr_moe_ctx *rc;
                if (mr_moe_ctx_new(mr_moe_runner_ground_truth(), &p, T, &rc) || mr_moe_ctx_prepare(rc, rw))
                    fail_msg("ref ctx: %s", mr_error_last());
                void *ref_out = malloc((size_t)(T * H) * 4);
                mr_moe_args ra = {.T = T, .x = xin, .out = ref_out, .ids = ids, .weights = wts};
                assert_int_equal(mr_moe_run(rc, rw, &ra), MR_OK);
                mr_moe_ctx_free(rc);
                mr_moe_weights_free(rw);
                for (int ri = 0; ri < mr_moe_runner_count(); ri++) {
                    const mr_moe_runner *run = mr_moe_runner_at(ri);
                    if (run->ground_truth) continue;
                    char why[256];
                    if (!run->supports(&p, why, sizeof why)) {
                        /* the only refusal expected here: fused and a method outside its subset */
                        assert_true(run->routes_itself && !mr_moe_fused_supports_routing(c->routing));
                        continue;
                    }
                    char label[200];
                    snprintf(label, sizeof label, "case %d (T %lld E %d k %d H %lld I %lld %s) %s %s %s", ci, (long long)T,
                             E, k, (long long)H, (long long)c->I, mr_routing_name(c->routing), run->name,
                             mr_act_mode_name(mode), dt ? "bf16-io" : "f32-io");
                    double ratio = run_and_compare(run, &p, base, &ro, logits, ids, wts, xin, T, ref_out, label);
                    ty->n_compared++;
                    if (ratio > ty->worst_ratio) ty->worst_ratio = ratio;
                    if (!(ratio <= 1.0)) {
                        if (!quiet) print_message("%s: error %.3g x tolerance\n", label, ratio);
                        failed++;
                    }
                }
                free(ref_out);
            }
        }
        mr_moe_weights_free(base);
    }
    free(x), free(xb), free(xbw), free(logits), free(bias), free(ids), free(wts);
    ty->n_failed += failed;
    return failed;
}

static bool large_enabled(void) {
    const char *e = getenv("MOERUN_TEST_LARGE");
    return e && !strcmp(e, "1");
}

static void test_matrix(void **st) {
    (void)st;
    tally ty = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].large && !large_enabled()) continue;
        run_case(&cases[i], (int)i, &ty);
    }
    print_message("matrix: %d comparisons, %d failed, worst error %.3g x tolerance (kernels: %s)\n", ty.n_compared,
                  ty.n_failed, ty.worst_ratio, mr_kernels_get()->isa);
    assert_int_equal(ty.n_failed, 0);
    assert_true(ty.n_compared > 50);
}

/* Mutations: the matrix must FAIL when the routed layout swaps gate and up,
 * and when fused skips renormalization. */
static void test_mutations_are_caught(void **st) {
    (void)st;
    const mcase c = {17, 64, 8, 208, 80, MR_ROUTING_RENORMALIZE, 0, 0, 1.0f, false, false};
    tally ty = {0};
    quiet = true;
    unsigned old = mr_moe_debug_mutation(MR_MUT_SWAP_GATE_UP);
    int f1 = run_case(&c, 100, &ty);
    mr_moe_debug_mutation(MR_MUT_FUSED_NO_RENORM);
    int f2 = run_case(&c, 101, &ty);
    mr_moe_debug_mutation(old);
    quiet = false;
    print_message("mutations: swap gate/up -> %d failures, fused without renorm -> %d failures\n", f1, f2);
    /* every routed comparison must fail for the swap (7 modes x ... >= 7) */
    assert_true(f1 >= 7);
    assert_true(f2 >= 7);
}

/* Layout is checked at dispatch: weights prepared for one runner are refused by another. */
static void test_layout_checked_at_dispatch(void **st) {
    (void)st;
    const mcase c = {3, 8, 2, 128, 128, MR_ROUTING_RENORMALIZE, 0, 0, 1.0f, false, false};
    mr_moe_weights *w = make_weights(&c, MR_FMT_FP8_BLOCK, 9);
    mr_moe_problem p = {.device = MR_DEVICE_CPU, .cpu_flags = mr_cpu()->flags, .weight_format = MR_FMT_FP8_BLOCK, .act_mode = MR_ACT_W8A8,
                        .act_dtype = MR_FMT_F32, .routing = MR_ROUTING_RENORMALIZE, .n_experts = 8, .top_k = 2,
                        .hidden = 128, .inter = 128};
    mr_moe_ctx *ctx, *ctx2;
    assert_int_equal(mr_moe_ctx_new(mr_moe_runner_find("routed"), &p, 4, &ctx), MR_OK);
    assert_int_equal(mr_moe_ctx_prepare(ctx, w), MR_OK);
    assert_int_equal(mr_moe_ctx_new(mr_moe_runner_find("fused"), &p, 4, &ctx2), MR_OK);
    assert_int_equal(mr_moe_ctx_prepare(ctx2, w), MR_ESTATE); /* packed for routed: fused refuses them */
    float x2[3 * 128] = {0}, out2[3 * 128], lg[3 * 8] = {0};
    mr_routing ro = {.method = MR_ROUTING_RENORMALIZE, .n_experts = 8, .top_k = 2, .scale = 1.0f};
    mr_moe_args a2 = {.T = 3, .x = x2, .out = out2, .logits = lg, .routing = &ro};
    assert_int_equal(mr_moe_run(ctx2, w, &a2), MR_ESTATE); /* and cannot run them */
    mr_moe_ctx_free(ctx2);
    /* tamper with the descriptor: the routed context refuses to run */
    w->layout.gateup = MR_GATEUP_CONCAT;
    float x[3 * 128] = {0}, out[3 * 128];
    int32_t ids[6] = {0, 1, 2, 3, 4, 5};
    float wts[6] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
    mr_moe_args a = {.T = 3, .x = x, .out = out, .ids = ids, .weights = wts};
    assert_int_equal(mr_moe_run(ctx, w, &a), MR_ESTATE);
    w->layout.gateup = MR_GATEUP_INTERLEAVED;
    const int pack = w->layout.pack; /* the CPU's fp8 pack (fp8_r16k4 or fp8_y16) */
    w->layout.pack = MR_PACK_NONE; /* same rows, but not the routed packing: refused too */
    assert_int_equal(mr_moe_run(ctx, w, &a), MR_ESTATE);
    w->layout.pack = pack;
    assert_int_equal(mr_moe_run(ctx, w, &a), MR_OK);
    ids[3] = 8; /* bad id: clean error */
    assert_int_equal(mr_moe_run(ctx, w, &a), MR_EINPUT);
    mr_moe_ctx_free(ctx);
    mr_moe_weights_free(w);
    /* a problem planned for other CPU features (none: the generic packing)
     * is refused at dispatch when this CPU's kernels take another pack */
    w = make_weights(&c, MR_FMT_FP8_BLOCK, 9);
    p.cpu_flags = 0;
    assert_int_equal(mr_moe_ctx_new(mr_moe_runner_find("routed"), &p, 4, &ctx), MR_OK);
    assert_int_equal(mr_moe_ctx_prepare(ctx, w), MR_OK);
    ids[3] = 3;
    const bool same = mr_kernels_get()->uk_pack[MR_UK_FP8_BF16] == (mr_pack_id)w->layout.pack;
    assert_int_equal(mr_moe_run(ctx, w, &a), same ? MR_OK : MR_ESTATE);
    if (!same) assert_non_null(strstr(mr_error_last(), "packed as fp8_r16k4"));
    mr_moe_ctx_free(ctx);
    mr_moe_weights_free(w);
}

/* The predicates: order and one-sentence reasons. */
static void test_predicates(void **st) {
    (void)st;
    mr_moe_problem p = {.device = MR_DEVICE_CPU, .weight_format = MR_FMT_NVFP4, .act_mode = MR_ACT_W4A4,
                        .act_dtype = MR_FMT_BF16, .routing = MR_ROUTING_MINIMAX2, .n_experts = 256, .top_k = 8,
                        .hidden = 3072, .inter = 1536, .a2a = MR_A2A_NONE};
    char why[256];
    const mr_moe_runner *fu = mr_moe_runner_find("fused"), *ro = mr_moe_runner_find("routed"),
                        *re = mr_moe_runner_find("reference");
    assert_non_null(fu);
    assert_string_equal(mr_moe_runner_at(0)->name, "fused");
    assert_false(re->auto_eligible);
    assert_false(fu->supports(&p, why, sizeof why));
    assert_non_null(strstr(why, "minimax2"));
    assert_true(ro->supports(&p, why, sizeof why));
    assert_true(re->supports(&p, why, sizeof why));
    p.device = MR_DEVICE_SM100; /* device is checked first */
    assert_false(ro->supports(&p, why, sizeof why));
    assert_non_null(strstr(why, "sm100"));
    p.device = MR_DEVICE_CPU;
    p.act_mode = MR_ACT_W8A8; /* mode must belong to the weight format */
    assert_false(ro->supports(&p, why, sizeof why));
    assert_non_null(strstr(why, "w8a8"));
    p.act_mode = MR_ACT_W4A4;
    p.hidden = 3000; /* nvfp4 alignment */
    assert_false(ro->supports(&p, why, sizeof why));
    assert_non_null(strstr(why, "16"));
    p.hidden = 3072;
    p.routing = MR_ROUTING_RENORMALIZE;
    p.a2a = MR_A2A_MPI;
    assert_true(ro->supports(&p, why, sizeof why));
    assert_false(fu->supports(&p, why, sizeof why));
    assert_non_null(strstr(why, "mpi"));
    assert_true(re->supports(&p, why, sizeof why)); /* the reference takes (ids, weights): any transport */
    p.a2a = MR_A2A_NONE;
    assert_true(fu->supports(&p, why, sizeof why));
    mr_moe_layout L;
    ro->required_layout(&p, &L); /* nvfp4 w4a4: int8 tiles, gate/up interleaved per 16-row tile */
    assert_int_equal(L.gateup, MR_GATEUP_INTERLEAVED);
    assert_int_equal(L.interleave_rows, 16);
    assert_int_equal(L.pack, MR_PACK_NVFP4_R16K16);
    assert_int_equal(L.pack_tile, 16);
    p.act_mode = MR_ACT_W4A16;
    ro->required_layout(&p, &L);
    assert_int_equal(L.pack, MR_PACK_NVFP4_R16K16B);
    p.act_mode = MR_ACT_W4A4;
    p.weight_format = MR_FMT_FP8_BLOCK;
    p.inter = 200;
    fu->required_layout(&p, &L);
    assert_int_equal(L.gateup, MR_GATEUP_INTERLEAVED);
    assert_int_equal(L.inter_padded, 256);
    /* names round-trip */
    for (int m = 0; m < MR_ACT_COUNT; m++) {
        mr_act_mode o;
        assert_int_equal(mr_act_mode_from_name(mr_act_mode_name((mr_act_mode)m), &o), MR_OK);
        assert_int_equal(o, m);
    }
    mr_device d;
    assert_int_equal(mr_device_from_name("sm120", &d), MR_OK);
    assert_int_equal(d, MR_DEVICE_SM120);
    assert_int_equal(mr_device_from_name("tpu", &d), MR_EINVAL);
    assert_int_equal(mr_act_mode_default(MR_FMT_NVFP4), MR_ACT_W4A4);
}

/* The routed per-call path allocates nothing: a second call with another
 * routing, on the gemv (T 1) and the gemm (many tokens per expert) kernels,
 * leaves mr_debug_alloc_count unchanged. */
static void test_routed_no_alloc_per_call(void **st) {
    (void)st;
    const mcase c = {64, 8, 2, 256, 128, MR_ROUTING_RENORMALIZE, 0, 0, 1.0f, false, false};
    const mr_format fmts[] = {MR_FMT_FP8_BLOCK, MR_FMT_NVFP4, MR_FMT_BF16};
    const mr_act_mode modes[] = {MR_ACT_W8A8, MR_ACT_W4A8, MR_ACT_W16A16};
    for (int f = 0; f < 3; f++) {
        mr_moe_weights *w = make_weights(&c, fmts[f], 77);
        mr_moe_problem p = {.device = MR_DEVICE_CPU, .cpu_flags = mr_cpu()->flags, .weight_format = fmts[f], .act_mode = modes[f],
                            .act_dtype = MR_FMT_F32, .routing = c.routing, .n_experts = c.E, .top_k = c.k,
                            .hidden = c.H, .inter = c.I};
        mr_moe_ctx *ctx;
        assert_int_equal(mr_moe_ctx_new(mr_moe_runner_find("routed"), &p, c.T, &ctx), MR_OK);
        assert_int_equal(mr_moe_ctx_prepare(ctx, w), MR_OK);
        float *x = calloc((size_t)(c.T * c.H), sizeof(float)), *out = malloc(sizeof(float) * (size_t)(c.T * c.H));
        int32_t ids[64 * 2];
        float wts[64 * 2];
        for (int t = 0; t < 64; t++) ids[2 * t] = t % 8, ids[2 * t + 1] = (t + 3) % 8, wts[2 * t] = wts[2 * t + 1] = 0.5f;
        for (int i = 0; i < 64 * 256; i++) x[i] = (float)(i % 7) - 3.0f;
        mr_moe_args a = {.T = 1, .x = x, .out = out, .ids = ids, .weights = wts};
        assert_int_equal(mr_moe_run(ctx, w, &a), MR_OK);
        const uint64_t before = mr_debug_alloc_count();
        for (int64_t T = 1; T <= 64; T += 63) {
            a.T = T;
            ids[0] = 5; /* another routing */
            assert_int_equal(mr_moe_run(ctx, w, &a), MR_OK);
        }
        assert_int_equal(mr_debug_alloc_count(), before);
        mr_moe_ctx_free(ctx);
        mr_moe_weights_free(w);
        free(x), free(out);
    }
}

int main(void) {
    tu_isa_begin("test_moe_matrix");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_routed_no_alloc_per_call),
        cmocka_unit_test(test_predicates),
        cmocka_unit_test(test_layout_checked_at_dispatch),
        cmocka_unit_test(test_matrix),
        cmocka_unit_test(test_mutations_are_caught),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
