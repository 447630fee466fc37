/* runner_fused.c — the `fused` runner: takes router logits and does the
 * routing (its own implementation), the expert compute and the weighted
 * reduction in one call. Its declared routing subset (also in docs and
 * mr_moe_fused_supports_routing):
 *   softmax_topk, renormalize, topk_softmax, sigmoid_renorm, sigmoid, topk.
 * NOT minimax2, deepseek_v3 (bias / groups) or llama4 (weight on input),
 * mirroring the real fused kernels whose gap this project exists to catch.
 * Rules kept (spec/routing.md): NaN -> -inf, ties to the lower index, ids in
 * selection order, renormalization divides by (sum + 1e-20); an all-NaN token
 * is an input error. Its after-load interleaves gate/up in blocks of R rows
 * (R = 128 for fp8_block, 16 otherwise), I padded to R. After its own
 * routing, the rows go through the same phases as every runner's (layer.c);
 * its compute is expert_core.c. */
#include <math.h>
#include <string.h>

#include "moe/runner_fused.h"

static inline float nan_to_ninf(float x) { return isnan(x) ? -INFINITY : x; }

/* one token: logits l[E] -> ids[k], w[k]; false if all logits are NaN */
static bool fused_route_token(mr_routing_id m, const float *l, int E, int k, int32_t *ids, float *w) {
    float mx = -INFINITY;
    int n_nan = 0;
    for (int i = 0; i < E; i++) {
        n_nan += isnan(l[i]);
        mx = fmaxf(mx, nan_to_ninf(l[i]));
    }
    if (n_nan == E) return false;
    const bool soft = m == MR_ROUTING_SOFTMAX_TOPK || m == MR_ROUTING_RENORMALIZE;
    const bool sigm = m == MR_ROUTING_SIGMOID_RENORM || m == MR_ROUTING_SIGMOID;
    double sum = 0.0;
    if (soft)
        for (int i = 0; i < E; i++) sum += (double)expf(nan_to_ninf(l[i]) - mx);
    /* selection: keys are monotone in l for every method of the subset, so
     * select on the cleaned logits; strict '>' keeps ties at the lower index */
    int n = 0;
    float keys[MR_MOE_FUSED_MAX_K];
    for (int i = 0; i < E; i++) {
        float key = nan_to_ninf(l[i]);
        int pos = n;
        if (n == k) {
            if (!(key > keys[k - 1])) continue;
            pos = k - 1;
        } else {
            n++;
        }
        for (; pos > 0 && key > keys[pos - 1]; pos--) {
            keys[pos] = keys[pos - 1];
            ids[pos] = ids[pos - 1];
        }
        keys[pos] = key;
        ids[pos] = i;
    }
    for (int j = 0; j < k; j++) {
        float x = keys[j];
        if (soft) w[j] = (float)((double)expf(x - mx) / sum);
        else if (sigm) w[j] = 1.0f / (1.0f + expf(-x));
        else if (m == MR_ROUTING_TOPK_SOFTMAX) w[j] = expf(x - keys[0]);
        else w[j] = x; /* topk: raw logit */
    }
    bool renorm = m == MR_ROUTING_RENORMALIZE || m == MR_ROUTING_SIGMOID_RENORM || m == MR_ROUTING_TOPK_SOFTMAX;
    if (mr__moe_mutation & MR_MUT_FUSED_NO_RENORM) renorm = false;
    if (renorm) {
        double s = 0.0;
        for (int j = 0; j < k; j++) s += (double)w[j];
        double inv = 1.0 / (s + 1e-20);
        for (int j = 0; j < k; j++) w[j] = (float)((double)w[j] * inv);
    }
    return true;
}

static mr_status fused_after_load(const mr_moe_runner *self, const mr_moe_problem *p, mr_moe_weights *w) {
    mr_moe_layout L;
    self->required_layout(p, &L);
    return mr__moe_merge_gateup(w, &L, false);
}

static mr_status fused_route(mr_moe_ctx *c, const mr_moe_args *a) {
    const int E = c->p.n_experts, k = c->p.top_k;
    if (k > MR_MOE_FUSED_MAX_K) return mr_error_set(MR_EUNSUPPORTED, "fused supports top_k <= %d", MR_MOE_FUSED_MAX_K);
    int64_t bad = -1;
#pragma omp parallel for schedule(static) reduction(max : bad) num_threads(mr__moe_threads(c))
    for (int64_t t = 0; t < a->T; t++)
        if (!fused_route_token(c->p.routing, a->logits + t * E, E, k, c->ids + t * k, c->wts + t * k)) bad = t > bad ? t : bad;
    if (bad >= 0) return mr_error_set(MR_EINPUT, "token %lld: all router logits are NaN", (long long)bad);
    return MR_OK;
}

static mr_status fused_ctx_new(mr_moe_ctx *c) {
    const mr_moe_problem *p = &c->p;
    mr_status st = MR_OK;
    mr__fused_state *s = mr__moe_ws_alloc(c, 1, sizeof *s, &st);
    if (st) return st;
    c->rs = s;
    const size_t H = (size_t)p->hidden, Ip = (size_t)c->layout.inter_padded, E = (size_t)c->n_local;
    s->kd = mr__act_kernel_dtype(p->act_mode);
    s->esz = s->kd == MR_FMT_F32 ? 4 : 2;
    s->GH = (int64_t)(H + 127) / 128;
    s->GI = (int64_t)(Ip + 127) / 128;
    c->rows.n_planes = 2; /* the prepared x and its per-128 scales */
    c->rows.plane[0].row_bytes = H * s->esz;
    c->rows.plane[1].row_bytes = (size_t)s->GH * 4;
    const size_t R = (size_t)c->max_recv;
    size_t nb = (Ip + 127) / 128 > (H + 63) / 64 ? (Ip + 127) / 128 : (H + 63) / 64;
    s->hq = mr__moe_ws_alloc(c, R, Ip * s->esz, &st);
    s->hs = mr__moe_ws_alloc(c, R, (size_t)s->GI * 4, &st);
    s->tasks = mr__moe_ws_alloc(c, E, nb * 4, &st);
    s->tmp_stride = (int64_t)((64 * 128 * 2 + 64 * 64 + (H > Ip ? H : Ip) + 64 + 15) / 16 * 16);
    s->tmp = mr__moe_ws_alloc(c, (size_t)c->n_threads, (size_t)s->tmp_stride * 4, &st);
    return st;
}

const struct mr_moe_runner_ops mr__moe_ops_fused = {.after_load = fused_after_load,
                                                    .ctx_new = fused_ctx_new,
                                                    .route = fused_route,
                                                    .prepare = mr__fused_prepare,
                                                    .experts = mr__fused_experts};
