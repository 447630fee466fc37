/* sampler.c — token sampling: greedy (temperature 0, exactly argmax), or
 * temperature followed by the top-k, top-p and min-p filters in that order
 * and a draw from a seeded splitmix64 generator (same seed, same tokens). */
#include <math.h>
#include <stdlib.h>

#include "model/model_internal.h"

int32_t mr_argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best] || (x[best] != x[best] && x[i] == x[i])) best = i; /* NaN never wins */
    return (int32_t)best;
}

mr_status mr_sampler_init(mr_sampler *s, const mr_sampler_params *p, int64_t vocab) {
    *s = (mr_sampler){0};
    if (vocab <= 0 || vocab > INT32_MAX) return mr_error_set(MR_EINVAL, "sampler: vocab %lld out of range", (long long)vocab);
    if (p->top_k < 0) return mr_error_set(MR_EINVAL, "sampler: top-k %d is negative", p->top_k);
    if (!(p->top_p > 0.0f)) return mr_error_set(MR_EINVAL, "sampler: top-p must be > 0 (1 disables it)");
    if (p->min_p < 0.0f || p->min_p > 1.0f || p->min_p != p->min_p)
        return mr_error_set(MR_EINVAL, "sampler: min-p must be in [0, 1]");
    if (p->temperature != p->temperature) return mr_error_set(MR_EINVAL, "sampler: temperature is NaN");
    s->p = *p;
    s->vocab = vocab;
    s->state = p->seed ^ 0x9E3779B97F4A7C15ull;
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

/* qsort_r comparator: ids by logit descending, ties to the lower id. */
static int by_logit_desc(const void *a, const void *b, void *keys) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    float x = ((const float *)keys)[i], y = ((const float *)keys)[j];
    if (x > y) return -1;
    if (x < y) return 1;
    return (i > j) - (i < j);
}

int32_t mr_sampler_sample(mr_sampler *s, const float *logits) {
    int64_t V = s->vocab;
    if (s->p.temperature <= 0.0f) return mr_argmax(logits, V);
    /* candidates sorted by logit (NaN logits are dropped) */
    int64_t n = 0;
    for (int64_t i = 0; i < V; i++)
        if (logits[i] == logits[i]) s->idx[n++] = (int32_t)i;
    if (n == 0) return 0;
    qsort_r(s->idx, (size_t)n, sizeof(int32_t), by_logit_desc, (void *)logits);
    /* top-k */
    if (s->p.top_k > 0 && s->p.top_k < n) n = s->p.top_k;
    /* softmax of logits / temperature over the candidates */
    float inv_t = 1.0f / s->p.temperature, mx = logits[s->idx[0]] * inv_t;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        s->prob[i] = expf(logits[s->idx[i]] * inv_t - mx);
        sum += s->prob[i];
    }
    for (int64_t i = 0; i < n; i++) s->prob[i] = (float)(s->prob[i] / sum);
    /* top-p: the shortest prefix whose mass reaches top_p (at least one) */
    if (s->p.top_p < 1.0f) {
        double c = 0.0;
        int64_t keep = n;
        for (int64_t i = 0; i < n; i++) {
            c += s->prob[i];
            if (c >= s->p.top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    /* min-p: drop tokens below min_p times the most likely one */
    if (s->p.min_p > 0.0f) {
        float lim = s->p.min_p * s->prob[0];
        int64_t keep = 1;
        while (keep < n && s->prob[keep] >= lim) keep++;
        n = keep;
    }
    /* draw */
    double mass = 0.0;
    for (int64_t i = 0; i < n; i++) mass += s->prob[i];
    double u = (double)(splitmix64(&s->state) >> 11) * (1.0 / 9007199254740992.0) * mass;
    double c = 0.0;
    for (int64_t i = 0; i < n; i++) {
        c += s->prob[i];
        if (u < c) return s->idx[i];
    }
    return s->idx[n - 1];
}
