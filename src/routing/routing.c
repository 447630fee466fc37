/* routing.c — routing methods as data and mr_route.
 *
 * A method is one row of `methods[]`: a preprocess that turns a raw logit
 * into a selection key, a selection (plain top-k, or grouped as DeepSeek-V3),
 * and a postprocess that turns the selected experts into weights. The public
 * presets of shared/spec/routing.md are rows of that table, indexed by
 * moerun's stable mr_routing_id.
 *
 * Rules kept here for every method:
 *  - NaN logits are read as -inf; a token whose logits are all NaN is
 *    MR_EINPUT naming the token (checked before any output is written);
 *  - selection is by key descending, ties to the lower expert index, and
 *    ids are emitted in that order;
 *  - a correction bias changes the keys only; weights are recomputed from
 *    the raw logits (sigmoid(l[i]), never key - bias);
 *  - sum-normalization divides by (sum + 1e-20).
 *
 * Selection is partial: a running top-k list of length k, written straight
 * into the caller's ids/weights rows (the weights row holds the keys until
 * the postprocess overwrites them), so mr_route never allocates. Tokens are
 * independent and run in parallel with OpenMP. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "moerun/routing.h"

/* ---- the three stages ---- */
typedef enum {
    PRE_IDENTITY,     /* key = l */
    PRE_SOFTMAX,      /* key = softmax(l)[i] over all E */
    PRE_SIGMOID,      /* key = sigmoid(l) */
    PRE_SIGMOID_BIAS, /* key = sigmoid(l) + bias (selection only) */
} pre_kind;

typedef enum {
    SEL_PLAIN,   /* top-k of the keys */
    SEL_GROUPED, /* top topk_group groups by (sum of the two largest keys), others -inf, then top-k */
} sel_kind;

typedef enum {
    W_KEY,              /* the key itself (only for unbiased preprocesses) */
    W_SIGMOID,          /* sigmoid(l[id]) recomputed from the raw logit */
    W_SOFTMAX_SELECTED, /* softmax over l[ids] */
} weight_kind;

typedef struct {
    const char *name;
    pre_kind pre;
    sel_kind sel;
    weight_kind weight;
    bool renorm;   /* w /= (sum w + 1e-20) */
    bool scaled;   /* w *= r->scale */
    bool on_input; /* the weight multiplies the expert input (llama4) */
    int fixed_k;   /* 0: any k; otherwise the only k the method defines */
} method_desc;

static const method_desc methods[MR_ROUTING_COUNT] = {
    [MR_ROUTING_UNSPECIFIED] = {.name = "unspecified"},
    [MR_ROUTING_SOFTMAX_TOPK] = {.name = "softmax_topk", .pre = PRE_SOFTMAX, .sel = SEL_PLAIN, .weight = W_KEY},
    [MR_ROUTING_RENORMALIZE] = {.name = "renormalize", .pre = PRE_SOFTMAX, .sel = SEL_PLAIN, .weight = W_KEY,
                                .renorm = true},
    [MR_ROUTING_TOPK_SOFTMAX] = {.name = "topk_softmax", .pre = PRE_IDENTITY, .sel = SEL_PLAIN,
                                 .weight = W_SOFTMAX_SELECTED},
    [MR_ROUTING_MINIMAX2] = {.name = "minimax2", .pre = PRE_SIGMOID_BIAS, .sel = SEL_PLAIN, .weight = W_SIGMOID,
                             .renorm = true, .scaled = true},
    [MR_ROUTING_DEEPSEEK_V3] = {.name = "deepseek_v3", .pre = PRE_SIGMOID_BIAS, .sel = SEL_GROUPED,
                                .weight = W_SIGMOID, .renorm = true, .scaled = true},
    [MR_ROUTING_SIGMOID_RENORM] = {.name = "sigmoid_renorm", .pre = PRE_SIGMOID, .sel = SEL_PLAIN, .weight = W_KEY,
                                   .renorm = true},
    [MR_ROUTING_SIGMOID] = {.name = "sigmoid", .pre = PRE_SIGMOID, .sel = SEL_PLAIN, .weight = W_KEY},
    [MR_ROUTING_LLAMA4] = {.name = "llama4", .pre = PRE_IDENTITY, .sel = SEL_PLAIN, .weight = W_SIGMOID,
                           .on_input = true, .fixed_k = 1},
    [MR_ROUTING_TOPK] = {.name = "topk", .pre = PRE_IDENTITY, .sel = SEL_PLAIN, .weight = W_KEY},
};

static const method_desc *method_of(mr_routing_id id) {
    if ((int)id <= (int)MR_ROUTING_UNSPECIFIED || (int)id >= (int)MR_ROUTING_COUNT) return NULL;
    return &methods[id];
}

static bool method_needs_softmax(const method_desc *m) {
    return m->pre == PRE_SOFTMAX || m->weight == W_SOFTMAX_SELECTED;
}

/* ---- names and properties ---- */
const char *mr_routing_name(mr_routing_id id) {
    if ((int)id == (int)MR_ROUTING_UNSPECIFIED) return "unspecified";
    const method_desc *m = method_of(id);
    return m ? m->name : "invalid";
}

mr_status mr_routing_from_name(const char *name, mr_routing_id *out) {
    if (!name || !out) return mr_error_set(MR_EINVAL, "mr_routing_from_name: NULL argument");
    for (int i = 1; i < MR_ROUTING_COUNT; i++) {
        if (strcmp(name, methods[i].name) == 0) {
            *out = (mr_routing_id)i;
            return MR_OK;
        }
    }
    char list[256];
    size_t n = 0;
    list[0] = '\0';
    for (int i = 1; i < MR_ROUTING_COUNT && n < sizeof list; i++) {
        int w = snprintf(list + n, sizeof list - n, "%s%s", i > 1 ? ", " : "", methods[i].name);
        if (w < 0) break;
        n += (size_t)w;
    }
    return mr_error_set(MR_EINVAL, "unknown routing method '%s' (there is no default; choose one of: %s)", name,
                        list);
}

bool mr_routing_uses_bias(mr_routing_id id) {
    const method_desc *m = method_of(id);
    return m && m->pre == PRE_SIGMOID_BIAS;
}

bool mr_routing_is_grouped(mr_routing_id id) {
    const method_desc *m = method_of(id);
    return m && m->sel == SEL_GROUPED;
}

bool mr_routing_weight_on_input(mr_routing_id id) {
    const method_desc *m = method_of(id);
    return m && m->on_input;
}

/* ---- validation ---- */
mr_status mr_routing_validate(const mr_routing *r) {
    if (!r) return mr_error_set(MR_EINVAL, "routing: NULL description");
    if (r->method == MR_ROUTING_UNSPECIFIED)
        return mr_error_set(MR_EINVAL, "routing method is unspecified (there is no default method)");
    const method_desc *m = method_of(r->method);
    if (!m) return mr_error_set(MR_EINVAL, "unknown routing method id %d", (int)r->method);
    const char *nm = m->name;
    const int E = r->n_experts, k = r->top_k;

    if (E < 1) return mr_error_set(MR_EINVAL, "%s: n_experts must be >= 1 (got %d)", nm, E);
    if (k < 1 || k > E)
        return mr_error_set(MR_EINVAL, "%s: top_k must be in [1, n_experts = %d] (got %d)", nm, E, k);
    if (m->fixed_k && k != m->fixed_k)
        return mr_error_set(MR_EINVAL, "%s routes to exactly %d expert(s) per token (got top_k = %d)", nm,
                            m->fixed_k, k);

    /* groups */
    if (r->n_group > 1) {
        const int G = r->n_group, TG = r->topk_group;
        if (m->sel != SEL_GROUPED)
            return mr_error_set(MR_EINVAL, "%s does not use expert groups (n_group = %d); grouped selection is deepseek_v3",
                                nm, G);
        if (G > MR_ROUTING_MAX_GROUPS)
            return mr_error_set(MR_EINVAL, "%s: n_group = %d exceeds the supported maximum %d", nm, G,
                                MR_ROUTING_MAX_GROUPS);
        if (E % G != 0)
            return mr_error_set(MR_EINVAL, "%s: n_experts = %d is not divisible by n_group = %d", nm, E, G);
        if (E / G < 2)
            return mr_error_set(MR_EINVAL,
                                "%s: groups of %d expert(s) are too small (the group score sums the two largest keys)",
                                nm, E / G);
        if (TG < 1 || TG > G)
            return mr_error_set(MR_EINVAL, "%s: topk_group must be in [1, n_group = %d] (got %d)", nm, G, TG);
        if ((int64_t)TG * (E / G) < k)
            return mr_error_set(MR_EINVAL,
                                "%s: topk_group * n_experts / n_group = %d * %d = %lld < top_k = %d (too few experts kept)",
                                nm, TG, E / G, (long long)TG * (E / G), k);
    } else if (r->topk_group > 1) {
        return mr_error_set(MR_EINVAL, "%s: topk_group = %d needs n_group > 1 (got n_group = %d)", nm, r->topk_group,
                            r->n_group);
    }

    /* bias */
    if (m->pre == PRE_SIGMOID_BIAS) {
        if (!r->bias)
            return mr_error_set(MR_EINVAL, "%s needs the e_score_correction_bias [%d] and none was given", nm, E);
        for (int i = 0; i < E; i++)
            if (!isfinite(r->bias[i]))
                return mr_error_set(MR_EINVAL, "%s: correction bias[%d] = %g is not finite", nm, i,
                                    (double)r->bias[i]);
    } else if (r->bias) {
        return mr_error_set(MR_EINVAL, "%s does not use a correction bias, but one was given", nm);
    }

    /* scale */
    if (m->scaled) {
        if (!isfinite(r->scale) || !(r->scale > 0.0f))
            return mr_error_set(MR_EINVAL,
                                "%s: scale must be a finite positive number (1.0 for MiniMax-M2, 2.5 for DeepSeek-V3; got %g)",
                                nm, (double)r->scale);
    } else if (r->scale != 0.0f && r->scale != 1.0f) {
        return mr_error_set(MR_EINVAL, "%s applies no scaling factor; scale must be 1 (got %g)", nm,
                            (double)r->scale);
    }
    return MR_OK;
}

/* ---- per-token routing ---- */

static inline float clean(float x) { return isnan(x) ? -INFINITY : x; }
static inline float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Softmax parameters of one row: max and sum of exp(x - max). When the max is
 * +inf, the limit puts equal mass on the +inf entries and none elsewhere. */
typedef struct {
    float max;
    float sum;    /* sum of exp(x - max) (finite max), or the count of +inf entries */
    bool inf_max; /* max == +inf */
} softmax_param;

static softmax_param softmax_prepare(const float *l, int n, const int32_t *idx) {
    softmax_param sp = {.max = -INFINITY};
    for (int j = 0; j < n; j++) {
        float x = clean(l[idx ? idx[j] : j]);
        if (x > sp.max) sp.max = x;
    }
    sp.inf_max = isinf(sp.max) && sp.max > 0;
    double s = 0.0;
    for (int j = 0; j < n; j++) {
        float x = clean(l[idx ? idx[j] : j]);
        s += sp.inf_max ? (x == INFINITY ? 1.0 : 0.0) : (double)expf(x - sp.max);
    }
    sp.sum = (float)s;
    return sp;
}

static inline float softmax_at(const softmax_param *sp, float x) {
    if (sp->inf_max) return x == INFINITY ? 1.0f / sp->sum : 0.0f;
    return expf(x - sp->max) / sp->sum;
}

/* The selection key of expert i. */
static inline float key_of(const method_desc *m, const softmax_param *sp, const float *bias, const float *l, int i) {
    float x = clean(l[i]);
    switch (m->pre) {
    case PRE_IDENTITY: return x;
    case PRE_SOFTMAX: return softmax_at(sp, x);
    case PRE_SIGMOID: return sigmoidf_(x);
    case PRE_SIGMOID_BIAS: return sigmoidf_(x) + bias[i];
    }
    return x;
}

/* Running top-k list (ids[0..n), keys[0..n) descending). Candidates arrive in
 * ascending index order, so a strict comparison keeps ties at the lower index. */
static inline void topk_push(int32_t *ids, float *keys, int *n, int k, int32_t i, float key) {
    int pos = *n;
    if (pos == k) {
        if (!(key > keys[k - 1])) return;
        pos = k - 1;
    } else {
        (*n)++;
    }
    while (pos > 0 && key > keys[pos - 1]) {
        keys[pos] = keys[pos - 1];
        ids[pos] = ids[pos - 1];
        pos--;
    }
    keys[pos] = key;
    ids[pos] = i;
}

/* Routes one token (its logits l[E]) into ids[k], w[k]. The input was
 * checked by route_check, so this cannot fail. */
static void route_token(const method_desc *m, const mr_routing *r, const float *l, int32_t *ids, float *w) {
    const int E = r->n_experts, k = r->top_k;
    softmax_param sp = {0};
    if (m->pre == PRE_SOFTMAX) sp = softmax_prepare(l, E, NULL);

    int n = 0;
    if (m->sel == SEL_GROUPED && r->n_group > 1) {
        const int G = r->n_group, gs = E / G;
        int32_t gids[MR_ROUTING_MAX_GROUPS];
        float gkeys[MR_ROUTING_MAX_GROUPS];
        unsigned char keep[MR_ROUTING_MAX_GROUPS];
        int ng = 0;
        for (int g = 0; g < G; g++) {
            float a = -INFINITY, b = -INFINITY; /* the two largest keys, a >= b */
            for (int i = g * gs; i < (g + 1) * gs; i++) {
                float key = key_of(m, &sp, r->bias, l, i);
                if (key > a) {
                    b = a;
                    a = key;
                } else if (key > b) {
                    b = key;
                }
            }
            topk_push(gids, gkeys, &ng, r->topk_group, g, a + b);
            keep[g] = 0;
        }
        for (int j = 0; j < ng; j++) keep[gids[j]] = 1;
        /* Experts outside the kept groups compete with key -inf (never 0: keys can be negative). */
        for (int i = 0; i < E; i++) {
            float key = keep[i / gs] ? key_of(m, &sp, r->bias, l, i) : -INFINITY;
            topk_push(ids, w, &n, k, i, key);
        }
    } else {
        for (int i = 0; i < E; i++) topk_push(ids, w, &n, k, i, key_of(m, &sp, r->bias, l, i));
    }
    MR_ASSERT(n == k);

    /* postprocess: w holds the keys in selection order */
    switch (m->weight) {
    case W_KEY: break;
    case W_SIGMOID:
        for (int j = 0; j < k; j++) w[j] = sigmoidf_(clean(l[ids[j]]));
        break;
    case W_SOFTMAX_SELECTED: {
        softmax_param ss = softmax_prepare(l, k, ids);
        for (int j = 0; j < k; j++) w[j] = softmax_at(&ss, clean(l[ids[j]]));
        break;
    }
    }
    if (m->renorm) {
        double s = 0.0;
        for (int j = 0; j < k; j++) s += (double)w[j];
        double inv = 1.0 / (s + 1e-20);
        double sc = m->scaled ? (double)r->scale : 1.0;
        for (int j = 0; j < k; j++) w[j] = (float)((double)w[j] * inv * sc);
    } else if (m->scaled) {
        for (int j = 0; j < k; j++) w[j] *= r->scale;
    }
}

/* Rejects tokens the method cannot route, before anything is written:
 * all-NaN logits (any method), and no logit above -inf where a softmax is
 * taken (softmax of nothing is undefined). */
static mr_status route_check(const method_desc *m, const mr_routing *r, const float *logits, int64_t T) {
    const int E = r->n_experts;
    const bool sm = method_needs_softmax(m);
    for (int64_t t = 0; t < T; t++) {
        const float *l = logits + (size_t)t * (size_t)E;
        int n_nan = 0;
        bool any_above = false;
        for (int i = 0; i < E; i++) {
            n_nan += isnan(l[i]) ? 1 : 0;
            any_above |= l[i] > -INFINITY;
        }
        if (n_nan == E)
            return mr_error_set(MR_EINPUT, "routing: token %lld has all %d router logits NaN", (long long)t, E);
        if (sm && !any_above)
            return mr_error_set(MR_EINPUT, "routing (%s): token %lld has no router logit above -inf; softmax is undefined",
                                m->name, (long long)t);
    }
    return MR_OK;
}

mr_status mr_route(const mr_routing *r, const float *logits, int64_t T, int32_t *ids, float *weights) {
    mr_status st = mr_routing_validate(r);
    if (st != MR_OK) return st;
    const method_desc *m = method_of(r->method);
    if (T < 0) return mr_error_set(MR_EINVAL, "mr_route: negative token count %lld", (long long)T);
    if (T == 0) return MR_OK;
    if (!logits || !ids || !weights) return mr_error_set(MR_EINVAL, "mr_route: NULL logits, ids or weights");
    size_t n_logits, n_out;
    if (!mr_size_mul((size_t)T, (size_t)r->n_experts, &n_logits) || !mr_size_mul((size_t)T, (size_t)r->top_k, &n_out))
        return mr_error_set(MR_EOVERFLOW, "mr_route: %lld tokens x %d experts overflows", (long long)T, r->n_experts);
    (void)n_out;
    st = route_check(m, r, logits, T);
    if (st != MR_OK) return st;

    const int E = r->n_experts, k = r->top_k;
    /* Parallel only when there is enough work to pay for the team. */
    const bool par = n_logits >= (size_t)1 << 15;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t t = 0; t < T; t++)
        route_token(m, r, logits + (size_t)t * (size_t)E, ids + (size_t)t * (size_t)k, weights + (size_t)t * (size_t)k);
    return MR_OK;
}
