/* test_moe_seam.c — the MoE context's life cycle, on small problems, for
 * every registered runner: creation under every allocation failure
 * (fault injection: each failure returns MR_ENOMEM and leaks nothing, which
 * the ASan build checks), refusals that must not touch the context they
 * free (uncalibrated w4a4), and a successful run after the failures. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moerun/moe.h"
#include "testutil.h"

enum { E = 8, K = 2, H = 128, I = 128, T = 5 };

static mr_moe_weights *make_weights(mr_format fmt, uint64_t seed) {
    mr_moe_weights *w;
    assert_int_equal(mr_moe_weights_new(&w, E, H, I, fmt), MR_OK);
    tu_rng r = {seed};
    float *a = malloc(sizeof(float) * H * I), *b = malloc(sizeof(float) * H * I);
    for (int e = 0; e < E; e++) {
        float amax = 0;
        for (int i = 0; i < H * I; i++) a[i] = tu_normal(&r) / sqrtf((float)H), amax = fmaxf(amax, fabsf(a[i]));
        for (int i = 0; i < H * I; i++) b[i] = tu_normal(&r) / sqrtf((float)H), amax = fmaxf(amax, fabsf(b[i]));
        assert_int_equal(mr_qmatrix_quantize(&w->w1[e], fmt, a, I, H, amax), MR_OK);
        assert_int_equal(mr_qmatrix_quantize(&w->w3[e], fmt, b, I, H, amax), MR_OK);
        for (int i = 0; i < H * I; i++) a[i] = tu_normal(&r) / sqrtf((float)I);
        assert_int_equal(mr_qmatrix_quantize(&w->w2[e], fmt, a, H, I, 0.0f), MR_OK);
    }
    free(a);
    free(b);
    return w;
}

static mr_moe_problem problem(mr_format fmt, mr_act_mode mode, mr_routing_id routing) {
    return (mr_moe_problem){.device = MR_DEVICE_CPU, .cpu_flags = mr_cpu()->flags, .weight_format = fmt,
                            .act_mode = mode, .act_dtype = MR_FMT_F32, .routing = routing, .n_experts = E,
                            .top_k = K, .hidden = H, .inter = I, .a2a = MR_A2A_NONE};
}

/* One call on fixed inputs: every output element written and finite. */
static void run_once(mr_moe_ctx *c) {
    float x[T * H], out[T * H], logits[T * E], wts[T * K];
    int32_t ids[T * K];
    tu_rng g = {7};
    for (int i = 0; i < T * H; i++) x[i] = tu_normal(&g);
    for (int i = 0; i < T * E; i++) logits[i] = tu_normal(&g);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) ids[t * K + j] = (t + 3 * j) % E, wts[t * K + j] = 0.5f;
    for (int i = 0; i < T * H; i++) out[i] = NAN;
    mr_routing ro = {.method = MR_ROUTING_RENORMALIZE, .n_experts = E, .top_k = K, .scale = 1.0f};
    mr_moe_args a = {.T = T, .x = x, .out = out, .ids = ids, .weights = wts, .logits = logits, .routing = &ro};
    assert_int_equal(mr_moe_run(c, &a), MR_OK);
    for (int i = 0; i < T * H; i++) assert_true(isfinite(out[i]));
}

/* mr_moe_ctx_new with the n-th allocation failing, for every n until it
 * succeeds: each failure is MR_ENOMEM with nothing left behind; the context
 * made at the end runs. */
static void test_ctx_new_fault_injection(void **st) {
    (void)st;
    const mr_format fmts[] = {MR_FMT_BF16, MR_FMT_FP8_BLOCK, MR_FMT_NVFP4};
    const mr_act_mode modes[] = {MR_ACT_W16A16, MR_ACT_W8A8, MR_ACT_W4A8};
    for (int i = 0; i < mr_moe_runner_count(); i++) {
        const mr_moe_runner *r = mr_moe_runner_at(i);
        for (int f = 0; f < 3; f++) {
            mr_moe_problem p = problem(fmts[f], modes[f], MR_ROUTING_RENORMALIZE);
            char why[256];
            assert_true(r->supports(&p, why, sizeof why));
            mr_moe_weights *base = make_weights(fmts[f], 11 + (uint64_t)f);
            int failures = 0;
            for (long n = 0;; n++) {
                mr_moe_weights *w = NULL;
                assert_int_equal(mr_moe_weights_clone(base, &w), MR_OK);
                mr_moe_ctx *c = NULL;
                mr_debug_alloc_fail_after(n);
                mr_status s = mr_moe_ctx_new(r, &p, w, T, &c);
                mr_debug_alloc_fail_after(-1);
                if (s == MR_OK) {
                    assert_non_null(c);
                    run_once(c);
                    mr_moe_ctx_free(c);
                    mr_moe_weights_free(w);
                    break;
                }
                if (s != MR_ENOMEM) fail_msg("%s %d: allocation %ld failing gave %s: %s", r->name, f, n,
                                             mr_status_name(s), mr_error_last());
                assert_null(c);
                failures++;
                mr_moe_weights_free(w);
                if (n > 100000) fail_msg("%s: ctx_new never succeeds", r->name);
            }
            assert_true(failures > 3); /* the loop reached the workspace, not only the after-load */
            mr_moe_weights_free(base);
        }
    }
}

/* w4a4 without calibrated input_scale is refused with the values it found;
 * the refusal frees the context it had started and reads nothing from it
 * afterwards (the ASan build catches a read after free). */
static void test_w4a4_uncalibrated_refused(void **st) {
    (void)st;
    for (int i = 0; i < mr_moe_runner_count(); i++) {
        const mr_moe_runner *r = mr_moe_runner_at(i);
        mr_moe_problem p = problem(MR_FMT_NVFP4, MR_ACT_W4A4, MR_ROUTING_RENORMALIZE);
        mr_moe_weights *w = make_weights(MR_FMT_NVFP4, 3);
        for (int e = 0; e < E; e++) w->w1[e].input_scale = w->w3[e].input_scale = 0.25f;
        /* down projections left uncalibrated (input_scale 0) */
        mr_moe_ctx *c = NULL;
        assert_int_equal(mr_moe_ctx_new(r, &p, w, T, &c), MR_EINPUT);
        assert_null(c);
        if (!strstr(mr_error_last(), "gate/up 0.25, down 0")) fail_msg("%s: %s", r->name, mr_error_last());
        mr_moe_weights_free(w);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ctx_new_fault_injection),
        cmocka_unit_test(test_w4a4_uncalibrated_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
