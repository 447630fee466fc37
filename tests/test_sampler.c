/* test_sampler.c — the sampler's filters at a real vocabulary's size (MiniMax-M2's 200,064 ids), where it
 * selects the top-p cut without sorting (a radix selection over the logits' bits, or a sort of the few top
 * candidates) and computes its weights with its own exp. The oracles:
 *   - the weights against double-precision exp of x = (l - max) * (1 / T) (x in float, as the sampler has
 *     it), relative error <= 1e-6, exactly 1 at the largest logit and 0 at -inf;
 *   - the kept set against a reference that sorts every candidate by (logit descending, id ascending) with
 *     qsort and walks the definition (the shortest prefix holding top_p of the mass, then min-p), on the
 *     sampler's own unfiltered weights (so only the selection is under test, not a rounding of the mass);
 *   - draws land only on kept tokens.
 * Distributions: flat (every token a candidate for a top-p of 0.9: the radix path), peaked (a normal bulk
 * and a few far-ahead tokens: the few-candidates sort), logits on a coarse grid (long runs of ties cut in
 * id order), NaN and -inf entries (masks), -0 and +0 (equal logits). The small-vocabulary draws and their distribution are in
 * test_engine.c (test_sampler_filters_reference). */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "testutil.h"

enum { V = 200064 };

typedef struct {
    const char *name;
    int kind; /* 0 flat, 1 peaked, 2 ties (coarse grid), 3 masked (NaN and -inf among peaked), 4 -0 and +0 */
} dist;

static void make_logits(int kind, uint64_t seed, float *l) {
    tu_rng r = {seed};
    for (int64_t i = 0; i < V; i++) {
        switch (kind) {
        case 0: l[i] = tu_uniform(&r) * 8.0f - 4.0f; break;
        case 2: l[i] = roundf(tu_normal(&r) * 6.0f) * 0.5f; break;
        case 4: l[i] = tu_next(&r) % 2 ? -0.0f : 0.0f; break; /* equal logits: one run of ties, cut in id order */
        default: l[i] = tu_normal(&r) * 2.5f; break;
        }
    }
    if (kind == 1 || kind == 3)
        for (int j = 0; j < 20; j++) l[(int64_t)j * 7919 % V] += 9.0f + 0.3f * (float)j;
    if (kind == 3)
        for (int64_t i = 0; i < V; i += 3) l[i] = i % 2 ? -INFINITY : NAN;
}

/* ids of the non-NaN logits by (logit descending, id ascending) */
static const float *g_l;
static int desc(const void *a, const void *b) {
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (g_l[i] != g_l[j]) return g_l[i] > g_l[j] ? -1 : 1;
    return (i > j) - (i < j);
}

/* The kept set by the definition, on raw weights w[id] (the sampler's, unfiltered): top-k, the shortest
 * prefix holding top_p of the top-k mass, then min-p (the weight >= min_p x the largest, 1). */
static void ref_kept(const int32_t *order, int64_t n, const float *w, const mr_sampler_params *p, bool *kept) {
    const int64_t k = p->top_k > 0 && p->top_k < n ? p->top_k : n;
    double total = 0.0;
    for (int64_t r = 0; r < k; r++) total += w[order[r]];
    int64_t keep = k;
    if (p->top_p < 1.0f) {
        double c = 0.0;
        for (int64_t r = 0; r < k; r++)
            if ((c += w[order[r]]) >= (double)p->top_p * total) {
                keep = r + 1;
                break;
            }
    }
    memset(kept, 0, V * sizeof(bool));
    for (int64_t r = 0; r < keep; r++)
        if (r == 0 || w[order[r]] >= p->min_p) kept[order[r]] = true;
}

static void test_large_vocabulary(void **state) {
    (void)state;
    float *l = malloc(V * sizeof(float)), *prob = malloc(V * sizeof(float)), *raw = malloc(V * sizeof(float));
    float *w = malloc(V * sizeof(float));
    int32_t *idx = malloc(V * sizeof(int32_t)), *order = malloc(V * sizeof(int32_t));
    bool *kept = malloc(V * sizeof(bool));
    assert_true(l && prob && raw && w && idx && order && kept);
    const dist dists[] = {{"flat", 0}, {"peaked", 1}, {"ties", 2}, {"masked", 3}, {"zeros", 4}};
    const struct {
        float t, top_p, min_p;
        int top_k;
    } ps[] = {{1.0f, 0.9137f, 0.0f, 0},  {0.7f, 0.5371f, 0.0f, 0}, {2.3f, 0.9913f, 0.0f, 0},
              {1.0f, 0.9137f, 0.01f, 0}, {1.0f, 1.0f, 0.2f, 0},    {1.0f, 0.9137f, 0.0f, 1000},
              {1.0f, 0.8123f, 0.0f, 40}};
    for (size_t d = 0; d < sizeof dists / sizeof dists[0]; d++) {
        make_logits(dists[d].kind, 11 + d, l);
        int64_t n = 0;
        for (int64_t i = 0; i < V; i++)
            if (l[i] == l[i]) order[n++] = (int32_t)i;
        g_l = l;
        qsort(order, (size_t)n, sizeof(int32_t), desc);
        const float mx = l[order[0]];
        for (size_t q = 0; q < sizeof ps / sizeof ps[0]; q++) {
            /* the unfiltered weights (no top-p, no min-p), against exp in double */
            mr_sampler_params p0 = {.temperature = ps[q].t, .top_p = 1.0f, .top_k = ps[q].top_k};
            double mass;
            int32_t pick;
            int64_t m = mr__sampler_weigh(&p0, l, V, prob, idx, &mass, &pick);
            const int64_t want_n = ps[q].top_k ? ps[q].top_k : n;
            assert_int_equal(m, want_n);
            for (int64_t i = 0; i < V; i++) raw[i] = 0.0f;
            double sum = 0.0;
            for (int64_t i = 0; i < m; i++) {
                const float x = l[idx[i]];
                const double e = exp((double)((x - mx) * (1.0f / ps[q].t))); /* the sampler's float x */
                if (x == -INFINITY) assert_true(prob[i] == 0.0f);
                else if (x == mx) assert_true(prob[i] == 1.0f);
                else if (e > 1e-30 && fabs(prob[i] / e - 1.0) > 1e-6)
                    fail_msg("%s T %g: weight of %g is %.9g, exp gives %.9g", dists[d].name, ps[q].t, x, prob[i], e);
                raw[idx[i]] = prob[i];
                sum += prob[i];
            }
            assert_true(fabs(mass / sum - 1.0) < 1e-9);
            /* the filtered weights: the kept set is the reference's, each with its raw weight */
            mr_sampler_params p = {.temperature = ps[q].t, .top_p = ps[q].top_p, .min_p = ps[q].min_p,
                                   .top_k = ps[q].top_k};
            m = mr__sampler_weigh(&p, l, V, prob, idx, &mass, &pick);
            assert_true(m > 0);
            ref_kept(order, n, raw, &p, kept);
            for (int64_t i = 0; i < V; i++) w[i] = 0.0f;
            int64_t nk = 0, nref = 0;
            sum = 0.0;
            for (int64_t i = 0; i < m; i++) {
                w[idx[i]] = prob[i];
                if (prob[i] > 0.0f) nk++, sum += prob[i];
            }
            for (int64_t i = 0; i < V; i++) {
                nref += kept[i];
                if ((w[i] > 0.0f) != kept[i] || (kept[i] && w[i] != raw[i]))
                    fail_msg("%s T %g top-p %g min-p %g top-k %d: token %lld (logit %g, weight %g) %s, the "
                             "reference %s", dists[d].name, ps[q].t, ps[q].top_p, ps[q].min_p, ps[q].top_k,
                             (long long)i, l[i], raw[i], w[i] > 0.0f ? "kept" : "dropped",
                             kept[i] ? "keeps it" : "drops it");
            }
            assert_int_equal(nk, nref);
            assert_true(fabs(mass / sum - 1.0) < 1e-9);
            print_message("%-6s T %.1f top-p %.4f min-p %.2f top-k %4d: %6lld of %6lld kept\n", dists[d].name,
                          ps[q].t, ps[q].top_p, ps[q].min_p, ps[q].top_k, (long long)nk, (long long)n);
            /* draws land on kept tokens only */
            uint64_t gs = mr_sampler_seed_state(q + 7 * d);
            for (int k = 0; k < 50; k++) {
                const int32_t t = mr_sample_logits(&p, &gs, l, V, prob, idx);
                if (!kept[t]) fail_msg("%s: drew token %d outside the kept set", dists[d].name, t);
            }
        }
    }
    free(l), free(prob), free(raw), free(w), free(idx), free(order), free(kept);
}

/* mr_logsumexp against the sum in double of exp in double, on finite rows of every distribution, shifted so
 * that the largest logit is far from 0 (the sum then depends on the subtraction of the largest), of every
 * length from 1 (the lanes' tail) and at 200,064 ids; -inf entries weigh 0. */
static void test_logsumexp(void **state) {
    (void)state;
    float *l = malloc(V * sizeof(float));
    assert_non_null(l);
    const int kinds[] = {0, 1, 2, 4};
    const float shifts[] = {0.0f, 37.5f, -1000.0f};
    for (size_t d = 0; d < sizeof kinds / sizeof kinds[0]; d++)
        for (size_t sh = 0; sh < sizeof shifts / sizeof shifts[0]; sh++) {
            make_logits(kinds[d], 3 + d, l);
            for (int64_t i = 0; i < V; i++) l[i] += shifts[sh];
            if (sh == 2)
                for (int64_t i = 5; i < V; i += 7) l[i] = -INFINITY;
            const int64_t lens[] = {1, 2, 3, 4, 5, 7, 9, 1000, V};
            for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
                const int64_t n = lens[k];
                double mx = -INFINITY, s = 0.0;
                for (int64_t i = 0; i < n; i++) mx = l[i] > mx ? l[i] : mx;
                for (int64_t i = 0; i < n; i++) s += exp((double)l[i] - mx);
                const double want = mx + log(s), got = mr_logsumexp(l, n);
                if (!(fabs(got - want) <= 1e-6 * fmax(1.0, fabs(want))))
                    fail_msg("kind %d shift %g n %lld: %.12g, in double %.12g", kinds[d], shifts[sh], (long long)n,
                             got, want);
            }
        }
    free(l);
}

/* mr_argmax against its definition, a scalar walk (the first of the largest non-NaN values, 0 when every
 * value is NaN), on rows of every length to 200 and at 200,064 ids, drawn from a small set of values so that
 * ties, NaN, -inf, +inf and both zeros meet in every position and lane. */
static int32_t ref_argmax(const float *x, int64_t n) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++)
        if (x[i] == x[i] && (best < 0 || x[i] > x[best])) best = i;
    return best < 0 ? 0 : (int32_t)best;
}

static void test_argmax(void **state) {
    (void)state;
    float *x = malloc(V * sizeof(float));
    assert_non_null(x);
    const float vals[] = {NAN, -INFINITY, INFINITY, -0.0f, 0.0f, 1.5f, -2.0f, 3.25f, 3.25f, -1e30f};
    tu_rng r = {99};
    for (int trial = 0; trial < 4000; trial++) {
        const int64_t n = trial < 3600 ? 1 + trial % 200 : V;
        const int nv = 1 + (int)(tu_next(&r) % 10); /* only the first nv values: rows of all NaN, of NaN and -inf */
        for (int64_t i = 0; i < n; i++) x[i] = vals[tu_next(&r) % (uint64_t)nv];
        if (trial % 7 == 0) x[tu_next(&r) % (uint64_t)n] = 7.0f + (float)(trial % 3); /* one largest */
        const int32_t want = ref_argmax(x, n), got = mr_argmax(x, n);
        if (got != want) fail_msg("trial %d, n %lld: %d, the definition %d", trial, (long long)n, got, want);
    }
    free(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_large_vocabulary),
        cmocka_unit_test(test_logsumexp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
