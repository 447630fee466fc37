/* test_routing.c — routing presets against torch goldens
 * (tools/golden/gen_routing.py), against a naive scalar reference written
 * here (repeated first-argmax selection, double-precision weights), and
 * property tests: tie rule, bias only in selection, NaN handling,
 * validation messages, the permutation invariants and the packed form. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moerun/formats.h"
#include "moerun/routing.h"
#include "testutil.h"

/* ------------------------------------------------------------------ */
/* Naive reference: keys in float as the spec writes them, selection by
 * k rounds of "first index holding the maximum", weights in double.    */
static double sig_d(double x) { return 1.0 / (1.0 + exp(-x)); }
static float nanfix(float x) { return isnan(x) ? -INFINITY : x; }

static void ref_route_token(const mr_routing *r, const float *lin, int32_t *ids, double *w) {
    const int E = r->n_experts, k = r->top_k;
    float *l = malloc(sizeof(float) * (size_t)E);
    float *key = malloc(sizeof(float) * (size_t)E);
    unsigned char *taken = calloc((size_t)E, 1);
    assert_non_null(l);
    assert_non_null(key);
    assert_non_null(taken);
    for (int i = 0; i < E; i++) l[i] = nanfix(lin[i]);
    float mx = -INFINITY;
    for (int i = 0; i < E; i++) mx = l[i] > mx ? l[i] : mx;
    double sum = 0;
    for (int i = 0; i < E; i++) sum += exp((double)l[i] - (double)mx);
    for (int i = 0; i < E; i++) {
        switch (r->method) {
        case MR_ROUTING_SOFTMAX_TOPK:
        case MR_ROUTING_RENORMALIZE: key[i] = (float)(exp((double)l[i] - (double)mx) / sum); break;
        case MR_ROUTING_MINIMAX2:
        case MR_ROUTING_DEEPSEEK_V3: key[i] = (float)sig_d(l[i]) + r->bias[i]; break;
        case MR_ROUTING_SIGMOID_RENORM:
        case MR_ROUTING_SIGMOID: key[i] = (float)sig_d(l[i]); break;
        default: key[i] = l[i]; break;
        }
    }
    if (r->method == MR_ROUTING_DEEPSEEK_V3 && r->n_group > 1) {
        const int G = r->n_group, gs = E / G;
        float *score = malloc(sizeof(float) * (size_t)G);
        unsigned char *keep = calloc((size_t)G, 1);
        for (int g = 0; g < G; g++) {
            int a = -1, b = -1; /* first argmax, then first argmax of the rest */
            for (int i = g * gs; i < (g + 1) * gs; i++)
                if (a < 0 || key[i] > key[a]) a = i;
            for (int i = g * gs; i < (g + 1) * gs; i++)
                if (i != a && (b < 0 || key[i] > key[b])) b = i;
            score[g] = key[a] + key[b];
        }
        for (int round = 0; round < r->topk_group; round++) {
            int best = -1;
            for (int g = 0; g < G; g++)
                if (!keep[g] && (best < 0 || score[g] > score[best])) best = g;
            keep[best] = 1;
        }
        for (int i = 0; i < E; i++)
            if (!keep[i / gs]) key[i] = -INFINITY;
        free(score);
        free(keep);
    }
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int i = 0; i < E; i++)
            if (!taken[i] && (best < 0 || key[i] > key[best])) best = i;
        taken[best] = 1;
        ids[j] = best;
    }
    double s = 0;
    for (int j = 0; j < k; j++) {
        double x = l[ids[j]];
        switch (r->method) {
        case MR_ROUTING_SOFTMAX_TOPK:
        case MR_ROUTING_RENORMALIZE: w[j] = exp(x - (double)mx) / sum; break;
        case MR_ROUTING_TOPK_SOFTMAX: w[j] = exp(x - (double)l[ids[0]]); break;
        case MR_ROUTING_TOPK: w[j] = x; break;
        default: w[j] = sig_d(x); break;
        }
        s += w[j];
    }
    bool renorm = r->method == MR_ROUTING_RENORMALIZE || r->method == MR_ROUTING_MINIMAX2 ||
                  r->method == MR_ROUTING_DEEPSEEK_V3 || r->method == MR_ROUTING_SIGMOID_RENORM;
    for (int j = 0; j < k; j++) {
        if (r->method == MR_ROUTING_TOPK_SOFTMAX) w[j] /= s;
        if (renorm) w[j] /= (s + 1e-20);
        if (r->method == MR_ROUTING_MINIMAX2 || r->method == MR_ROUTING_DEEPSEEK_V3) w[j] *= r->scale;
    }
    free(l);
    free(key);
    free(taken);
}

static bool close_rel(double got, double want, double tol) {
    if (isinf(want)) return got == want;
    return fabs(got - want) <= tol * fmax(fabs(want), 1e-30);
}

/* Routes with mr_route and compares with the naive reference, token by token. */
static void check_against_ref(const mr_routing *r, const float *logits, int64_t T, double tol, const char *what) {
    const int k = r->top_k;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * k));
    float *w = malloc(sizeof(float) * (size_t)(T * k));
    int32_t *rid = malloc(sizeof(int32_t) * (size_t)k);
    double *rw = malloc(sizeof(double) * (size_t)k);
    mr_status st = mr_route(r, logits, T, ids, w);
    if (st != MR_OK) fail_msg("%s: mr_route failed: %s", what, mr_error_last());
    for (int64_t t = 0; t < T; t++) {
        ref_route_token(r, logits + t * r->n_experts, rid, rw);
        for (int j = 0; j < k; j++) {
            if (ids[t * k + j] != rid[j])
                fail_msg("%s (%s): token %lld choice %d: id %d, reference %d", what, mr_routing_name(r->method),
                         (long long)t, j, ids[t * k + j], rid[j]);
            if (!close_rel(w[t * k + j], rw[j], tol))
                fail_msg("%s (%s): token %lld choice %d: weight %.9g, reference %.9g", what,
                         mr_routing_name(r->method), (long long)t, j, (double)w[t * k + j], rw[j]);
        }
    }
    free(ids);
    free(w);
    free(rid);
    free(rw);
}

/* ------------------------------------------------------------------ */
/* Goldens                                                             */
static void test_goldens(void **st) {
    (void)st;
    FILE *mf = fopen(tu_data("routing/manifest.txt"), "r");
    assert_non_null(mf);
    char line[512];
    int n_cases = 0;
    bool covered[MR_ROUTING_COUNT] = {0};
    bool saw_real_m2 = false, saw_real_dsv3 = false;
    while (fgets(line, sizeof line, mf)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        char name[128], method[64], file[160];
        long long T;
        int E, k, G, TG, has_bias;
        float scale;
        assert_int_equal(sscanf(line, "%127s %63s %lld %d %d %d %d %f %d %159s", name, method, &T, &E, &k, &G, &TG,
                                &scale, &has_bias, file),
                         10);
        mr_routing r = {.n_experts = E, .top_k = k, .n_group = G, .topk_group = TG, .scale = scale};
        if (mr_routing_from_name(method, &r.method) != MR_OK) fail_msg("%s: %s", name, mr_error_last());
        char rel[256];
        snprintf(rel, sizeof rel, "routing/%s", file);
        size_t len = 0;
        unsigned char *buf = tu_read_file(tu_data(rel), &len);
        assert_non_null(buf);
        size_t nl = (size_t)T * (size_t)E, nb = has_bias ? (size_t)E : 0, no = (size_t)T * (size_t)k;
        assert_int_equal(len, 4 * (nl + nb + 2 * no));
        /* copy into aligned typed arrays (the file is little-endian, as is the host) */
        float *logits = malloc(4 * nl), *bias = nb ? malloc(4 * nb) : NULL, *want_w = malloc(4 * no);
        int32_t *want_ids = malloc(4 * no);
        memcpy(logits, buf, 4 * nl);
        if (nb) memcpy(bias, buf + 4 * nl, 4 * nb);
        memcpy(want_ids, buf + 4 * (nl + nb), 4 * no);
        memcpy(want_w, buf + 4 * (nl + nb + no), 4 * no);
        free(buf);
        r.bias = bias;

        int32_t *ids = malloc(4 * no);
        float *w = malloc(4 * no);
        mr_status s = mr_route(&r, logits, T, ids, w);
        if (s != MR_OK) fail_msg("%s: mr_route: %s", name, mr_error_last());
        for (size_t i = 0; i < no; i++) {
            if (ids[i] != want_ids[i])
                fail_msg("%s: token %zu choice %zu: id %d, torch %d", name, i / (size_t)k, i % (size_t)k, ids[i],
                         want_ids[i]);
            if (!close_rel(w[i], want_w[i], 1e-6))
                fail_msg("%s: token %zu choice %zu: weight %.9g, torch %.9g", name, i / (size_t)k, i % (size_t)k,
                         (double)w[i], (double)want_w[i]);
        }
        /* the naive reference agrees too (it is tie-free data) */
        check_against_ref(&r, logits, T, 1e-6, name);

        covered[r.method] = true;
        if (r.method == MR_ROUTING_MINIMAX2 && E == 256 && k == 8 && T >= 100) saw_real_m2 = true;
        if (r.method == MR_ROUTING_DEEPSEEK_V3 && E == 256 && k == 8 && G == 8 && TG == 4 && scale == 2.5f)
            saw_real_dsv3 = true;
        n_cases++;
        free(logits);
        free(bias);
        free(want_w);
        free(want_ids);
        free(ids);
        free(w);
    }
    fclose(mf);
    assert_true(n_cases >= 40);
    for (int m = 1; m < MR_ROUTING_COUNT; m++)
        if (!covered[m]) fail_msg("no golden case for %s", mr_routing_name((mr_routing_id)m));
    assert_true(saw_real_m2);
    assert_true(saw_real_dsv3);
}

/* ------------------------------------------------------------------ */
/* Names, ids, properties                                              */
static void test_names(void **st) {
    (void)st;
    /* stable ids: these numbers are part of the interface */
    assert_int_equal(MR_ROUTING_UNSPECIFIED, 0);
    assert_int_equal(MR_ROUTING_MINIMAX2, 4);
    assert_int_equal(MR_ROUTING_DEEPSEEK_V3, 5);
    assert_int_equal(MR_ROUTING_TOPK, 9);
    const char *names[] = {"unspecified", "softmax_topk", "renormalize", "topk_softmax", "minimax2",
                           "deepseek_v3", "sigmoid_renorm", "sigmoid",     "llama4",       "topk"};
    for (int i = 0; i < MR_ROUTING_COUNT; i++) {
        assert_string_equal(mr_routing_name((mr_routing_id)i), names[i]);
        if (i == 0) continue;
        mr_routing_id id = MR_ROUTING_UNSPECIFIED;
        assert_int_equal(mr_routing_from_name(names[i], &id), MR_OK);
        assert_int_equal(id, i);
    }
    mr_routing_id id;
    assert_int_equal(mr_routing_from_name("unspecified", &id), MR_EINVAL);
    assert_int_equal(mr_routing_from_name("deepseek", &id), MR_EINVAL);
    assert_non_null(strstr(mr_error_last(), "deepseek"));
    assert_non_null(strstr(mr_error_last(), "minimax2"));
    assert_string_equal(mr_routing_name((mr_routing_id)77), "invalid");

    for (int i = 0; i < MR_ROUTING_COUNT; i++) {
        mr_routing_id m = (mr_routing_id)i;
        assert_int_equal(mr_routing_uses_bias(m), m == MR_ROUTING_MINIMAX2 || m == MR_ROUTING_DEEPSEEK_V3);
        assert_int_equal(mr_routing_is_grouped(m), m == MR_ROUTING_DEEPSEEK_V3);
        assert_int_equal(mr_routing_weight_on_input(m), m == MR_ROUTING_LLAMA4);
    }
}

/* ------------------------------------------------------------------ */
/* Validation                                                          */
static void test_validate(void **st) {
    (void)st;
    float bias[256] = {0};
    float badbias[8] = {0, 0, 0, NAN, 0, 0, 0, 0};
    const struct {
        mr_routing r;
        mr_status want;
        const char *msg;
    } cases[] = {
        {{.method = MR_ROUTING_MINIMAX2, .n_experts = 256, .top_k = 8, .scale = 1, .bias = bias}, MR_OK, ""},
        {{.method = MR_ROUTING_DEEPSEEK_V3, .n_experts = 256, .top_k = 8, .n_group = 8, .topk_group = 4, .scale = 2.5f,
          .bias = bias},
         MR_OK, ""},
        {{.method = MR_ROUTING_RENORMALIZE, .n_experts = 8, .top_k = 2}, MR_OK, ""}, /* scale 0 = unused */
        {{.method = MR_ROUTING_RENORMALIZE, .n_experts = 8, .top_k = 2, .scale = 1}, MR_OK, ""},
        {{.method = MR_ROUTING_UNSPECIFIED, .n_experts = 8, .top_k = 2}, MR_EINVAL, "no default"},
        {{.method = (mr_routing_id)42, .n_experts = 8, .top_k = 2}, MR_EINVAL, "unknown routing method id 42"},
        {{.method = MR_ROUTING_TOPK, .n_experts = 0, .top_k = 1}, MR_EINVAL, "n_experts"},
        {{.method = MR_ROUTING_TOPK, .n_experts = 8, .top_k = 9}, MR_EINVAL, "top_k must be in [1, n_experts = 8]"},
        {{.method = MR_ROUTING_TOPK, .n_experts = 8, .top_k = 0}, MR_EINVAL, "top_k"},
        {{.method = MR_ROUTING_LLAMA4, .n_experts = 16, .top_k = 2}, MR_EINVAL, "exactly 1"},
        {{.method = MR_ROUTING_MINIMAX2, .n_experts = 256, .top_k = 8, .scale = 1}, MR_EINVAL, "bias"},
        {{.method = MR_ROUTING_MINIMAX2, .n_experts = 8, .top_k = 2, .scale = 1, .bias = badbias}, MR_EINVAL,
         "bias[3]"},
        {{.method = MR_ROUTING_SIGMOID_RENORM, .n_experts = 8, .top_k = 2, .bias = bias}, MR_EINVAL,
         "does not use a correction bias"},
        {{.method = MR_ROUTING_MINIMAX2, .n_experts = 256, .top_k = 8, .bias = bias}, MR_EINVAL, "scale"},
        {{.method = MR_ROUTING_DEEPSEEK_V3, .n_experts = 256, .top_k = 8, .n_group = 8, .topk_group = 4,
          .scale = NAN, .bias = bias},
         MR_EINVAL, "scale"},
        {{.method = MR_ROUTING_RENORMALIZE, .n_experts = 8, .top_k = 2, .scale = 2.5f}, MR_EINVAL,
         "no scaling factor"},
        {{.method = MR_ROUTING_MINIMAX2, .n_experts = 256, .top_k = 8, .n_group = 8, .topk_group = 4, .scale = 1,
          .bias = bias},
         MR_EINVAL, "does not use expert groups"},
        {{.method = MR_ROUTING_DEEPSEEK_V3, .n_experts = 250, .top_k = 8, .n_group = 8, .topk_group = 4, .scale = 1,
          .bias = bias},
         MR_EINVAL, "not divisible by n_group = 8"},
        {{.method = MR_ROUTING_DEEPSEEK_V3, .n_experts = 256, .top_k = 8, .n_group = 8, .topk_group = 0, .scale = 1,
          .bias = bias},
         MR_EINVAL, "topk_group must be in [1, n_group = 8]"},
        {{.method = MR_ROUTING_DEEPSEEK_V3, .n_experts = 256, .top_k = 8, .n_group = 8, .topk_group = 9, .scale = 1,
          .bias = bias},
         MR_EINVAL, "topk_group"},
        {{.method = MR_ROUTING_DEEPSEEK_V3, .n_experts = 16, .top_k = 8, .n_group = 8, .topk_group = 2, .scale = 1,
          .bias = bias},
         MR_EINVAL, "< top_k = 8"},
        {{.method = MR_ROUTING_DEEPSEEK_V3, .n_experts = 8, .top_k = 1, .n_group = 8, .topk_group = 2, .scale = 1,
          .bias = bias},
         MR_EINVAL, "too small"},
        {{.method = MR_ROUTING_DEEPSEEK_V3, .n_experts = 256, .top_k = 8, .n_group = 1, .topk_group = 4, .scale = 1,
          .bias = bias},
         MR_EINVAL, "needs n_group > 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mr_error_clear();
        mr_status s = mr_routing_validate(&cases[i].r);
        if (s != cases[i].want)
            fail_msg("case %zu: status %s, want %s (%s)", i, mr_status_name(s), mr_status_name(cases[i].want),
                     mr_error_last());
        if (s != MR_OK && !strstr(mr_error_last(), cases[i].msg))
            fail_msg("case %zu: message '%s' lacks '%s'", i, mr_error_last(), cases[i].msg);
    }
    assert_int_equal(mr_routing_validate(NULL), MR_EINVAL);
    /* mr_route validates too and rejects bad arguments */
    mr_routing r = {.method = MR_ROUTING_TOPK, .n_experts = 8, .top_k = 9};
    float l[8] = {0};
    int32_t ids[9];
    float w[9];
    assert_int_equal(mr_route(&r, l, 1, ids, w), MR_EINVAL);
    r.top_k = 2;
    assert_int_equal(mr_route(&r, l, -1, ids, w), MR_EINVAL);
    assert_int_equal(mr_route(&r, NULL, 1, ids, w), MR_EINVAL);
    assert_int_equal(mr_route(&r, NULL, 0, NULL, NULL), MR_OK);
}

/* ------------------------------------------------------------------ */
/* Tie rule                                                            */
static mr_routing mk(mr_routing_id m, int E, int k, const float *bias) {
    mr_routing r = {.method = m, .n_experts = E, .top_k = k, .scale = 1.0f};
    if (mr_routing_uses_bias(m)) r.bias = bias;
    return r;
}

static void test_ties(void **st) {
    (void)st;
    float zeros[64] = {0};
    /* all-equal logits: every method picks 0, 1, ..., k-1 in that order */
    float l[16];
    for (int i = 0; i < 16; i++) l[i] = 0.5f;
    for (int m = 1; m < MR_ROUTING_COUNT; m++) {
        int k = m == MR_ROUTING_LLAMA4 ? 1 : 5;
        mr_routing r = mk((mr_routing_id)m, 16, k, zeros);
        int32_t ids[8];
        float w[8];
        assert_int_equal(mr_route(&r, l, 1, ids, w), MR_OK);
        for (int j = 0; j < k; j++)
            if (ids[j] != j) fail_msg("%s: all-equal logits, choice %d is %d", mr_routing_name(r.method), j, ids[j]);
    }
    /* partial ties: the lower index wins, and comes first */
    const float l2[8] = {1, 3, 2, 3, -1, 3, 2, 0};
    const int32_t want[5] = {1, 3, 5, 2, 6};
    for (int m = 1; m < MR_ROUTING_COUNT; m++) {
        if (m == MR_ROUTING_LLAMA4) continue;
        mr_routing r = mk((mr_routing_id)m, 8, 5, zeros);
        int32_t ids[5];
        float w[5];
        assert_int_equal(mr_route(&r, l2, 1, ids, w), MR_OK);
        for (int j = 0; j < 5; j++)
            if (ids[j] != want[j]) fail_msg("%s: choice %d is %d, want %d", mr_routing_name(r.method), j, ids[j], want[j]);
    }
    /* grouped: equal group scores keep the lower groups; ties inside as well */
    float lg[16], bias[16] = {0};
    for (int i = 0; i < 16; i++) lg[i] = 0.0f;
    mr_routing r = {.method = MR_ROUTING_DEEPSEEK_V3, .n_experts = 16, .top_k = 4, .n_group = 4, .topk_group = 2,
                    .scale = 1.0f, .bias = bias};
    int32_t ids[4];
    float w[4];
    assert_int_equal(mr_route(&r, lg, 1, ids, w), MR_OK);
    for (int j = 0; j < 4; j++) assert_int_equal(ids[j], j);
    /* groups 1 and 3 tie for the best score (sum of two largest keys); group 2
     * holds the single largest key but a lower pair sum. One group kept: group 1. */
    lg[5] = lg[4] = 2.0f;   /* group 1 */
    lg[13] = lg[12] = 2.0f; /* group 3, same score */
    lg[8] = 3.0f;           /* group 2: one big key, but the pair sum is lower */
    r.topk_group = 1;
    r.top_k = 2;
    assert_int_equal(mr_route(&r, lg, 1, ids, w), MR_OK);
    assert_int_equal(ids[0], 4); /* group 1 (lower of the tied groups 1 and 3) */
    assert_int_equal(ids[1], 5);

    /* random data with many exact ties against the naive reference */
    tu_rng rng = {42};
    float biasr[64];
    for (int rep = 0; rep < 40; rep++) {
        const int E = 64;
        float *lt = malloc(sizeof(float) * 20 * E);
        for (int i = 0; i < 20 * E; i++) lt[i] = (float)((int)(tu_uniform(&rng) * 6.0f)) - 3.0f; /* 6 levels */
        for (int i = 0; i < E; i++) biasr[i] = (float)((int)(tu_uniform(&rng) * 3.0f)) * 0.25f;
        for (int m = 1; m < MR_ROUTING_COUNT; m++) {
            mr_routing rr = mk((mr_routing_id)m, E, m == MR_ROUTING_LLAMA4 ? 1 : 1 + rep % 8, biasr);
            if (m == MR_ROUTING_DEEPSEEK_V3 && rep % 2) {
                rr.n_group = 8;
                rr.topk_group = 1 + rep % 4;
            }
            if (m == MR_ROUTING_DEEPSEEK_V3 || m == MR_ROUTING_MINIMAX2) rr.scale = 2.5f;
            check_against_ref(&rr, lt, 20, 1e-6, "ties");
        }
        free(lt);
    }
}

/* ------------------------------------------------------------------ */
/* Bias affects selection only                                         */
static void test_bias_selection_only(void **st) {
    (void)st;
    enum { E = 64, K = 4 };
    float l[E], bias[E];
    tu_rng rng = {7};
    for (int i = 0; i < E; i++) {
        l[i] = tu_normal(&rng) * 2.0f;
        bias[i] = 0.0f;
    }
    /* Give four experts with very negative logits a huge bias: they are
     * selected (ties among them go to the lower index: 1e6 + s rounds to 1e6),
     * and their weights are their tiny sigmoids renormalized. */
    const int32_t chosen[K] = {3, 17, 40, 41};
    const float ll[K] = {-30.0f, -28.0f, -25.0f, -31.0f};
    for (int j = 0; j < K; j++) {
        l[chosen[j]] = ll[j];
        bias[chosen[j]] = 1e6f;
    }
    for (int m = MR_ROUTING_MINIMAX2; m <= MR_ROUTING_DEEPSEEK_V3; m++) {
        mr_routing r = {.method = (mr_routing_id)m, .n_experts = E, .top_k = K, .scale = 1.0f, .bias = bias};
        int32_t ids[K];
        float w[K];
        assert_int_equal(mr_route(&r, l, 1, ids, w), MR_OK);
        double s = 0;
        for (int j = 0; j < K; j++) s += sig_d(ll[j]);
        for (int j = 0; j < K; j++) {
            assert_int_equal(ids[j], chosen[j]);
            double want = sig_d(ll[j]) / s;
            if (!close_rel(w[j], want, 1e-6)) fail_msg("weight %d: %.9g, want %.9g", j, (double)w[j], want);
        }
        /* without the bias the same logits select other experts */
        float zero[E] = {0};
        r.bias = zero;
        assert_int_equal(mr_route(&r, l, 1, ids, w), MR_OK);
        for (int j = 0; j < K; j++) assert_true(l[ids[j]] > -20.0f);
    }
}

/* ------------------------------------------------------------------ */
/* NaN handling                                                        */
static void test_nan(void **st) {
    (void)st;
    float bias[8] = {0};
    /* NaN reads as -inf: never chosen while finite logits remain */
    const float l[8] = {NAN, 1.0f, NAN, 0.5f, -2.0f, NAN, 3.0f, NAN};
    for (int m = 1; m < MR_ROUTING_COUNT; m++) {
        int k = m == MR_ROUTING_LLAMA4 ? 1 : 4;
        mr_routing r = mk((mr_routing_id)m, 8, k, bias);
        int32_t ids[8];
        float w[8];
        assert_int_equal(mr_route(&r, l, 1, ids, w), MR_OK);
        const int32_t want[4] = {6, 1, 3, 4};
        for (int j = 0; j < k; j++) assert_int_equal(ids[j], want[j]);
        for (int j = 0; j < k; j++) assert_false(isnan(w[j]));
        /* k larger than the finite count: NaN experts come last, lower index first,
         * with weight 0 (sigmoid/softmax of -inf) or -inf (raw) */
        if (m == MR_ROUTING_LLAMA4) continue;
        r.top_k = 6;
        assert_int_equal(mr_route(&r, l, 1, ids, w), MR_OK);
        assert_int_equal(ids[4], 0);
        assert_int_equal(ids[5], 2);
        if (m == MR_ROUTING_TOPK)
            assert_true(isinf(w[4]) && w[4] < 0);
        else if (m != MR_ROUTING_MINIMAX2 && m != MR_ROUTING_DEEPSEEK_V3)
            assert_true(w[4] == 0.0f && w[5] == 0.0f);
        else
            assert_true(w[4] == 0.0f); /* sigmoid(-inf) = 0 even though its key is bias */
        check_against_ref(&r, l, 1, 1e-6, "nan");
    }
    /* an all-NaN token is an input error naming the token; nothing is written */
    float lt[3 * 8];
    for (int i = 0; i < 24; i++) lt[i] = (float)i;
    for (int i = 16; i < 24; i++) lt[i] = NAN;
    for (int m = 1; m < MR_ROUTING_COUNT; m++) {
        mr_routing r = mk((mr_routing_id)m, 8, 1, bias);
        int32_t ids[3] = {-7, -7, -7};
        float w[3];
        assert_int_equal(mr_route(&r, lt, 3, ids, w), MR_EINPUT);
        assert_non_null(strstr(mr_error_last(), "token 2"));
        assert_int_equal(ids[0], -7);
    }
    /* softmax of nothing: all -inf (or -inf and NaN) is an input error for softmax methods only */
    float li[8];
    for (int i = 0; i < 8; i++) li[i] = i % 2 ? -INFINITY : NAN;
    int32_t ids[2];
    float w[2];
    mr_routing r = mk(MR_ROUTING_RENORMALIZE, 8, 2, NULL);
    assert_int_equal(mr_route(&r, li, 1, ids, w), MR_EINPUT);
    assert_non_null(strstr(mr_error_last(), "token 0"));
    r = mk(MR_ROUTING_TOPK_SOFTMAX, 8, 2, NULL);
    assert_int_equal(mr_route(&r, li, 1, ids, w), MR_EINPUT);
    r = mk(MR_ROUTING_SIGMOID_RENORM, 8, 2, NULL);
    assert_int_equal(mr_route(&r, li, 1, ids, w), MR_OK);
    assert_int_equal(ids[0], 0); /* all keys 0: ties -> 0, 1 */
    assert_int_equal(ids[1], 1);
    assert_true(w[0] == 0.0f && w[1] == 0.0f); /* 0 / (0 + 1e-20) */
    /* +inf logits: softmax takes the limit */
    float lp[4] = {1.0f, INFINITY, 2.0f, INFINITY};
    r = mk(MR_ROUTING_SOFTMAX_TOPK, 4, 3, NULL);
    int32_t id3[3];
    float w3[3];
    assert_int_equal(mr_route(&r, lp, 1, id3, w3), MR_OK);
    assert_int_equal(id3[0], 1);
    assert_int_equal(id3[1], 3);
    assert_int_equal(id3[2], 0); /* finite logits all get p = 0: a tie, lower index */
    assert_true(w3[0] == 0.5f && w3[1] == 0.5f && w3[2] == 0.0f);
}

/* ------------------------------------------------------------------ */
/* Bigger random problems, incl. the real shapes, against the reference;
 * and the hot path does not allocate. */
static void test_random_vs_ref(void **st) {
    (void)st;
    tu_rng rng = {1234};
    enum { T = 2048, E = 256 };
    float *l = malloc(sizeof(float) * T * E);
    float bias[E];
    for (size_t i = 0; i < (size_t)T * E; i++) l[i] = tu_normal(&rng) * 2.0f;
    for (int i = 0; i < E; i++) bias[i] = tu_normal(&rng) * 0.3f;
    mr_routing m2 = {.method = MR_ROUTING_MINIMAX2, .n_experts = E, .top_k = 8, .scale = 1.0f, .bias = bias};
    mr_routing ds = {.method = MR_ROUTING_DEEPSEEK_V3, .n_experts = E, .top_k = 8, .n_group = 8, .topk_group = 4,
                     .scale = 2.5f, .bias = bias};
    int32_t *ids = malloc(sizeof(int32_t) * T * 8);
    float *w = malloc(sizeof(float) * T * 8);
    uint64_t a0 = mr_debug_alloc_count();
    assert_int_equal(mr_route(&m2, l, T, ids, w), MR_OK);
    assert_int_equal(mr_route(&ds, l, T, ids, w), MR_OK);
    assert_int_equal(mr_debug_alloc_count(), a0);
    free(ids);
    free(w);
    /* the reference is slow: check a slice (T = 300) of each method */
    for (int m = 1; m < MR_ROUTING_COUNT; m++) {
        mr_routing r = mk((mr_routing_id)m, E, m == MR_ROUTING_LLAMA4 ? 1 : 8, bias);
        if (m == MR_ROUTING_DEEPSEEK_V3) r = ds;
        check_against_ref(&r, l, 300, 1e-6, "random");
    }
    free(l);
}

/* ------------------------------------------------------------------ */
/* Permutation                                                         */
static void check_perm(const int32_t *ids, int64_t T, int k, int E) {
    const int64_t n = T * k;
    int32_t *counts = malloc(sizeof(int32_t) * (size_t)E), *offsets = malloc(sizeof(int32_t) * (size_t)(E + 1));
    int32_t *slot_of = malloc(sizeof(int32_t) * (size_t)(n + 1)), *token_of = malloc(sizeof(int32_t) * (size_t)(n + 1));
    mr_permutation p = {counts, offsets, slot_of, token_of};
    assert_int_equal(mr_permutation_build(ids, T, k, E, &p), MR_OK);
    /* counts match a direct count, and sum to T*k */
    int64_t total = 0;
    for (int e = 0; e < E; e++) {
        int c = 0;
        for (int64_t f = 0; f < n; f++) c += ids[f] == e;
        assert_int_equal(counts[e], c);
        total += counts[e];
    }
    assert_int_equal(total, n);
    /* offsets are the prefix sum */
    assert_int_equal(offsets[0], 0);
    for (int e = 0; e < E; e++) assert_int_equal(offsets[e + 1], offsets[e] + counts[e]);
    assert_int_equal(offsets[E], n);
    /* round trip both ways, uniqueness (a bijection on [0, n)) */
    unsigned char *seen = calloc((size_t)n + 1, 1);
    for (int64_t f = 0; f < n; f++) {
        assert_true(slot_of[f] >= 0 && slot_of[f] < n);
        assert_false(seen[slot_of[f]]);
        seen[slot_of[f]] = 1;
        assert_int_equal(token_of[slot_of[f]], f);
    }
    for (int64_t s = 0; s < n; s++) assert_int_equal(slot_of[token_of[s]], s);
    /* every slot lies in its expert's segment, ascending within the segment */
    for (int e = 0; e < E; e++)
        for (int32_t s = offsets[e]; s < offsets[e + 1]; s++) {
            assert_int_equal(ids[token_of[s]], e);
            if (s > offsets[e]) assert_true(token_of[s] > token_of[s - 1]);
        }
    free(seen);
    free(counts);
    free(offsets);
    free(slot_of);
    free(token_of);
}

static void test_permutation(void **st) {
    (void)st;
    tu_rng rng = {99};
    const int shapes[][3] = {{1, 1, 8}, {5, 2, 8}, {300, 8, 256}, {64, 8, 8}, {17, 3, 512}, {0, 4, 16}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        int T = shapes[c][0], k = shapes[c][1], E = shapes[c][2];
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * k + 1));
        for (int rep = 0; rep < 3; rep++) {
            /* rep 0: distinct experts per token (as routing produces) drawn from all E;
             * rep 1: distinct, crowded into the first max(k, 4) experts;
             * rep 2: duplicates allowed (external ids) */
            int range = rep == 1 ? (k > 4 ? k : 4) : E;
            if (range > E) range = E;
            for (int t = 0; t < T; t++)
                for (int j = 0; j < k; j++) {
                    int32_t e;
                    bool dup;
                    do {
                        e = (int32_t)(tu_next(&rng) % (uint64_t)range);
                        dup = false;
                        for (int q = 0; q < j && rep < 2; q++) dup |= ids[t * k + q] == e;
                    } while (dup);
                    ids[t * k + j] = e;
                }
            check_perm(ids, T, k, E);
        }
        free(ids);
    }
    /* from real routing output */
    enum { T = 100, E = 64, K = 6 };
    float *l = malloc(sizeof(float) * T * E);
    for (int i = 0; i < T * E; i++) l[i] = tu_normal(&rng);
    int32_t ids[T * K];
    float w[T * K];
    mr_routing r = mk(MR_ROUTING_RENORMALIZE, E, K, NULL);
    assert_int_equal(mr_route(&r, l, T, ids, w), MR_OK);
    check_perm(ids, T, K, E);
    free(l);

    /* out-of-range ids are an input error and leave the outputs untouched */
    int32_t bad[6] = {0, 1, 2, 3, 8, 1};
    int32_t counts[8], offsets[9], slot_of[6], token_of[6];
    for (int i = 0; i < 8; i++) counts[i] = -5;
    mr_permutation p = {counts, offsets, slot_of, token_of};
    assert_int_equal(mr_permutation_build(bad, 3, 2, 8, &p), MR_EINPUT);
    assert_non_null(strstr(mr_error_last(), "token 2"));
    assert_int_equal(counts[0], -5);
    bad[4] = -1;
    assert_int_equal(mr_permutation_build(bad, 3, 2, 8, &p), MR_EINPUT);
    assert_int_equal(mr_permutation_build(bad, 3, 0, 8, &p), MR_EINVAL);
    assert_int_equal(mr_permutation_build(bad, -1, 2, 8, &p), MR_EINVAL);
    assert_int_equal(mr_permutation_build(bad, 3, 2, 8, NULL), MR_EINVAL);
    assert_int_equal(mr_permutation_build(bad, (int64_t)1 << 31, 2, 8, &p), MR_EOVERFLOW);
}

/* ------------------------------------------------------------------ */
/* Packed form                                                         */
static void test_packed(void **st) {
    (void)st;
    /* hand-computed bf16 bits: 1.0 = 0x3F80, -1.0 = 0xBF80, -2.0 = 0xC000, 0.5 = 0x3F00 */
    assert_int_equal(mr_routing_pack(3, -1.0f), 0x0003BF80u);
    assert_int_equal(mr_routing_pack(0, 1.0f), 0x00003F80u);
    assert_int_equal(mr_routing_pack(65535, -2.0f), 0xFFFFC000u);
    assert_int_equal(mr_routing_pack(255, 0.5f), 0x00FF3F00u);
    int32_t e;
    float w;
    mr_routing_unpack(0xFFFFC000u, &e, &w); /* an int16 view of the low half would sign-extend */
    assert_int_equal(e, 65535);
    assert_true(w == -2.0f);
    mr_routing_unpack(0x0001BF80u, &e, &w);
    assert_int_equal(e, 1);
    assert_true(w == -1.0f);
    mr_routing_unpack(0x80008000u, &e, &w); /* -0.0 weight, expert 32768 */
    assert_int_equal(e, 32768);
    assert_true(w == 0.0f && signbit(w));
    /* round trip on random experts and weights of both signs */
    tu_rng rng = {5};
    for (int i = 0; i < 10000; i++) {
        int32_t ex = (int32_t)(tu_next(&rng) % 65536u);
        float wt = tu_normal(&rng) * (i % 2 ? 1.0f : 1e-3f);
        uint32_t pk = mr_routing_pack(ex, wt);
        mr_routing_unpack(pk, &e, &w);
        assert_int_equal(e, ex);
        /* bf16 keeps 8 significant bits: RNE error <= half a unit = 2^-8 relative */
        assert_true(fabsf(w - wt) <= fabsf(wt) * (1.0f / 256.0f));
        assert_true(signbit(w) == signbit(wt));
        assert_true(w == mr_bf16_to_f32((uint16_t)(pk & 0xFFFF)));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),       cmocka_unit_test(test_validate),
        cmocka_unit_test(test_goldens),     cmocka_unit_test(test_ties),
        cmocka_unit_test(test_bias_selection_only), cmocka_unit_test(test_nan),
        cmocka_unit_test(test_random_vs_ref), cmocka_unit_test(test_permutation),
        cmocka_unit_test(test_packed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
