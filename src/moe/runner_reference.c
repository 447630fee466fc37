/* runner_reference.c — the `reference` runner: scalar, fp32 values of
 * dequantized weights (mr_qmatrix_dequant_row) and of activations as the
 * activation mode defines them (mr__act_effective_row, built on the formats/
 * reference quantizers), dot products accumulated in double, any routing.
 * Its prepared row is the fp32 value the mode's kernels would see; its
 * experts phase computes each row on its own. Slow by design; the ground
 * truth of the cross-runner matrix. */
#include <string.h>

#include "moe/moe_internal.h"

typedef struct {
    float *tmp;         /* per thread: a row of max(H, I), h [I], h as the mode sees it [I] */
    int64_t tmp_stride;
} ref_state;

static mr_status reference_after_load(const mr_moe_runner *self, const mr_moe_problem *p, mr_moe_weights *w) {
    mr_moe_layout L;
    self->required_layout(p, &L);
    mr_status st = mr_moe_weights_validate(w);
    if (st) return st;
    w->layout = L; /* HF layout as loaded: nothing to convert */
    return MR_OK;
}

static mr_status reference_ctx_new(mr_moe_ctx *c) {
    mr_status st = MR_OK;
    ref_state *s = mr__moe_ws_alloc(c, 1, sizeof *s, &st);
    if (st) return st;
    c->rs = s;
    const size_t H = (size_t)c->p.hidden, I = (size_t)c->p.inter;
    c->rows.n_planes = 1; /* the effective fp32 row */
    c->rows.plane[0].row_bytes = H * sizeof(float);
    s->tmp_stride = (int64_t)(((H > I ? H : I) + 2 * I + 64 + 15) / 16 * 16);
    s->tmp = mr__moe_ws_alloc(c, (size_t)c->n_threads, (size_t)s->tmp_stride * 4, &st);
    return st;
}

static double dot_d(const float *a, const float *b, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
    return s;
}

static void reference_prepare(mr_moe_ctx *c, const mr_moe_weights *w, const mr_moe_args *a, const float *wts) {
    const int k = c->p.top_k;
    const int64_t H = c->p.hidden, S = a->T * k;
    const bool woi = mr_routing_weight_on_input(c->p.routing);
    float s13 = 0.0f, s2 = 0.0f;
    if (c->p.act_mode == MR_ACT_W4A4) mr__moe_w4a4_scales(w, &s13, &s2);
    float *X = c->rows.plane[0].base;
#pragma omp parallel for schedule(static) num_threads(mr__moe_threads(c))
    for (int64_t r = 0; r < S; r++) {
        float *row = c->tmp + (size_t)c->tmp_stride * (size_t)omp_get_thread_num_safe();
        const int32_t flat = c->token_of[r];
        const float *xin = mr__moe_token_row(c, a, flat / k, woi ? wts[flat] : 1.0f, row);
        mr__act_effective_row(c->p.act_mode, xin, H, s13, X + (size_t)r * (size_t)H);
    }
}

static mr_status reference_experts(mr_moe_ctx *c, const mr_moe_weights *w, const mr_a2a_xfer *x) {
    const ref_state *s = c->rs;
    const int64_t H = c->p.hidden, I = c->p.inter, n = x->recv.n;
    float s13 = 0.0f, s2 = 0.0f;
    if (c->p.act_mode == MR_ACT_W4A4) mr__moe_w4a4_scales(w, &s13, &s2);
    const float *X = x->recv.plane[0].base;
#pragma omp parallel for schedule(dynamic, 1) num_threads(mr__moe_threads(c))
    for (int64_t r = 0; r < n; r++) {
        float *row = s->tmp + (size_t)s->tmp_stride * (size_t)omp_get_thread_num_safe();
        float *h = row + (H > I ? H : I), *he = h + I;
        const int e = mr__moe_expert_of_row(x->recv_offsets, c->n_local, r);
        const float *xe = X + (size_t)r * (size_t)H;
        for (int64_t i = 0; i < I; i++) {
            mr_qmatrix_dequant_row(&w->w1[e], i, row);
            float g = (float)dot_d(row, xe, H);
            mr_qmatrix_dequant_row(&w->w3[e], i, row);
            float u = (float)dot_d(row, xe, H);
            h[i] = mr__silu(g) * u;
        }
        mr__act_effective_row(c->p.act_mode, h, I, s2, he);
        float *y = x->y_recv + (size_t)r * (size_t)H;
        for (int64_t o = 0; o < H; o++) {
            mr_qmatrix_dequant_row(&w->w2[e], o, row);
            y[o] = (float)dot_d(row, he, I);
        }
    }
    return MR_OK;
}

const struct mr_moe_runner_ops mr__moe_ops_reference = {.after_load = reference_after_load,
                                                        .ctx_new = reference_ctx_new,
                                                        .prepare = reference_prepare,
                                                        .experts = reference_experts};
