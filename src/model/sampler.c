/* sampler.c — token sampling: greedy (temperature 0, exactly argmax), or
 * logits / temperature followed by the top-k, top-p and min-p filters and a
 * draw from a seeded splitmix64 generator (same seed, same tokens).
 *
 * Filters, over the candidates (non-NaN logits):
 *   top-k  the k largest logits (ties to the lower id)
 *   top-p  then the shortest run, in descending logit order, whose share of
 *          the top-k candidates' probability mass reaches top_p
 *   min-p  and only tokens whose probability is >= min_p x the largest
 * top-p and min-p both cut a prefix of the descending order, so the kept set
 * is the shorter one. The order is only materialized when top-k or top-p
 * needs it: top-k by a bounded heap, top-p by sorting only the candidates
 * above a probability threshold that is lowered until they hold top_p of
 * the mass. Without either, the draw walks the kept tokens in id order. */
#include <math.h>
#include <stdlib.h>

#include "model/model_internal.h"

int32_t mr_argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best] || (x[best] != x[best] && x[i] == x[i])) best = i; /* NaN never wins */
    return (int32_t)best;
}

mr_status mr_sampler_params_check(const mr_sampler_params *p) {
    if (p->top_k < 0) return mr_error_set(MR_EINVAL, "sampler: top-k %d is negative", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) return mr_error_set(MR_EINVAL, "sampler: top-p must be in (0, 1] (1 disables it)");
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) return mr_error_set(MR_EINVAL, "sampler: min-p must be in [0, 1]");
    if (p->temperature != p->temperature || isinf(p->temperature))
        return mr_error_set(MR_EINVAL, "sampler: temperature must be a finite number");
    return MR_OK;
}

uint64_t mr_sampler_seed_state(uint64_t seed) { return seed ^ 0x9E3779B97F4A7C15ull; }

mr_status mr_sampler_init(mr_sampler *s, const mr_sampler_params *p, int64_t vocab) {
    *s = (mr_sampler){0};
    if (vocab <= 0 || vocab > INT32_MAX) return mr_error_set(MR_EINVAL, "sampler: vocab %lld out of range", (long long)vocab);
    mr_status st = mr_sampler_params_check(p);
    if (st) return st;
    s->p = *p;
    s->vocab = vocab;
    s->state = mr_sampler_seed_state(p->seed);
    s->prob = mr_malloc((size_t)vocab * sizeof(float));
    s->idx = mr_malloc((size_t)vocab * sizeof(int32_t));
    if (!s->prob || !s->idx) {
        mr_sampler_free(s);
        return MR_ENOMEM;
    }
    return MR_OK;
}

void mr_sampler_free(mr_sampler *s) {
    mr_free(s->prob);
    mr_free(s->idx);
    s->prob = NULL;
    s->idx = NULL;
}

static uint64_t splitmix64(uint64_t *st) {
    uint64_t z = (*st += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Does id i come before id j in descending logit order (ties: lower id first)? */
static inline bool before(const float *l, int32_t i, int32_t j) { return l[i] > l[j] || (l[i] == l[j] && i < j); }

/* qsort_r comparator: ids by logit descending, ties to the lower id. */
static int by_logit_desc(const void *a, const void *b, void *keys) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    return before(keys, i, j) ? -1 : before(keys, j, i) ? 1 : 0;
}

/* The k first candidates in descending order into idx[0..k), sorted. A
 * heap of k whose root is the last of them. */
static int64_t top_k_ids(const float *l, int64_t V, int64_t k, int32_t *idx) {
    int64_t n = 0;
    for (int64_t i = 0; i < V; i++) {
        if (l[i] != l[i]) continue;
        int32_t id = (int32_t)i;
        if (n < k) { /* sift up */
            int64_t c = n++;
            idx[c] = id;
            while (c > 0 && before(l, idx[(c - 1) / 2], idx[c])) {
                int32_t t = idx[c];
                idx[c] = idx[(c - 1) / 2];
                idx[(c - 1) / 2] = t;
                c = (c - 1) / 2;
            }
        } else if (before(l, id, idx[0])) { /* replace the root, sift down */
            idx[0] = id;
            int64_t c = 0;
            for (;;) {
                int64_t a = 2 * c + 1, b = a + 1, w = c;
                if (a < n && before(l, idx[w], idx[a])) w = a;
                if (b < n && before(l, idx[w], idx[b])) w = b;
                if (w == c) break;
                int32_t t = idx[c];
                idx[c] = idx[w];
                idx[w] = t;
                c = w;
            }
        }
    }
    qsort_r(idx, (size_t)n, sizeof(int32_t), by_logit_desc, (void *)l);
    return n;
}

int32_t mr_sample_logits(const mr_sampler_params *p, uint64_t *state, const float *logits, int64_t V, float *prob,
                         int32_t *idx) {
    if (p->temperature <= 0.0f) return mr_argmax(logits, V);
    float inv_t = 1.0f / p->temperature;
    bool top_p = p->top_p < 1.0f;
    int64_t n;          /* candidates */
    bool ordered;       /* idx[0..n) is in descending order */
    if (p->top_k > 0 && p->top_k < V) {
        n = top_k_ids(logits, V, p->top_k, idx);
        ordered = true;
    } else {
        n = 0;
        for (int64_t i = 0; i < V; i++)
            if (logits[i] == logits[i]) idx[n++] = (int32_t)i;
        ordered = false;
    }
    if (n == 0) return 0;
    /* weights exp((l - max) / T): the largest is 1. The difference comes first: l / T
     * overflows for a tiny T (1 / 1e-38 times a logit of 4 is past FLT_MAX), and
     * inf - inf gave NaN weights, so every draw fell to the first candidate */
    float mx = -INFINITY;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++)
        if (logits[idx[i]] > mx) mx = logits[idx[i]], at = i;
    /* +inf logits, or a T so small that 1 / T is infinite: the limit is the largest */
    if (isinf(mx) || isinf(inv_t)) return idx[at];
    double total = 0.0;
    for (int64_t i = 0; i < n; i++) {
        prob[i] = expf((logits[idx[i]] - mx) * inv_t);
        total += prob[i];
    }
    if (!(total > 0.0)) return idx[at]; /* not reached: the largest weighs exp(0) = 1 */
    float min_w = p->min_p > 0.0f ? p->min_p : 0.0f; /* min-p: w >= min_p x the largest weight (1) */
    int64_t keep = n;
    if (top_p && !ordered) {
        /* the descending prefix with top_p of the mass lies among the weights >= tau,
         * for the largest tau whose candidates already hold that mass */
        double want = (double)p->top_p * total;
        for (float tau = 0x1p-8f;; tau = tau > 0x1p-120f ? tau * 0x1p-16f : 0.0f) {
            if (tau < min_w) tau = min_w;
            double mass = 0.0;
            int64_t m = 0;
            for (int64_t i = 0; i < n; i++)
                if (prob[i] >= tau) {
                    mass += prob[i];
                    m++;
                }
            if (mass >= want || tau <= min_w) {
                /* compact the candidates >= tau (ids stay in id order), then sort them */
                int64_t w = 0;
                for (int64_t i = 0; i < n; i++)
                    if (prob[i] >= tau) idx[w++] = idx[i];
                n = m;
                qsort_r(idx, (size_t)n, sizeof(int32_t), by_logit_desc, (void *)logits);
                for (int64_t i = 0; i < n; i++) prob[i] = expf((logits[idx[i]] - mx) * inv_t);
                ordered = true;
                break;
            }
        }
    }
    if (ordered) {
        if (top_p) { /* shortest prefix whose share of the mass reaches top_p (at least one) */
            double c = 0.0, want = (double)p->top_p * total;
            for (int64_t i = 0; i < n; i++) {
                c += prob[i];
                if (c >= want) {
                    keep = i + 1;
                    break;
                }
            }
        }
        int64_t k = 1;
        while (k < keep && prob[k] >= min_w) k++; /* min-p: a prefix too */
        keep = k;
    }
    /* draw over the kept candidates (unordered: those with w >= min_w, in id order) */
    double mass = 0.0;
    for (int64_t i = 0; i < keep; i++)
        if (ordered || prob[i] >= min_w) mass += prob[i];
    double u = (double)(splitmix64(state) >> 11) * (1.0 / 9007199254740992.0) * mass;
    double c = 0.0;
    int32_t last = idx[0];
    for (int64_t i = 0; i < keep; i++) {
        if (!ordered && prob[i] < min_w) continue;
        c += prob[i];
        last = idx[i];
        if (u < c) return idx[i];
    }
    return last;
}

int32_t mr_sampler_sample(mr_sampler *s, const float *logits) {
    return mr_sample_logits(&s->p, &s->state, logits, s->vocab, s->prob, s->idx);
}
