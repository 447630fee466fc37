/* runner_reference.c — the `reference` runner: scalar, fp32 values of
 * dequantized weights (mr_qmatrix_dequant_row) and of activations as the
 * activation mode defines them (mr__act_effective_row, built on the formats/
 * reference quantizers), dot products accumulated in double, any routing.
 * Slow by design; the ground truth of the cross-runner matrix. */
#include <string.h>

#include "moe/moe_internal.h"

static mr_status reference_after_load(const mr_moe_problem *p, mr_moe_weights *w) {
    mr_moe_layout L;
    memset(&L, 0, sizeof L);
    L.gateup = MR_GATEUP_SEPARATE;
    L.inter_padded = p->inter;
    L.owner = "reference";
    mr_status st = mr_moe_weights_validate(w);
    if (st) return st;
    w->layout = L; /* HF layout as loaded: nothing to convert */
    return MR_OK;
}

static double dot_d(const float *a, const float *b, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
    return s;
}

static mr_status reference_run(mr_moe_ctx *c, const mr_moe_args *a) {
    const mr_moe_problem *p = &c->p;
    const int k = p->top_k, E = p->n_experts;
    const int64_t H = p->hidden, I = p->inter, T = a->T;
    const bool woi = mr_routing_weight_on_input(p->routing);
    const bool xbf = p->act_dtype == MR_FMT_BF16;
    for (int64_t i = 0; i < T * k; i++)
        if (a->ids[i] < 0 || a->ids[i] >= E)
            return mr_error_set(MR_EINPUT, "token %lld choice %d: expert id %d out of [0,%d)", (long long)(i / k),
                                (int)(i % k), a->ids[i], E);
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t t = 0; t < T; t++) {
        float *xin = c->tmp + (size_t)c->tmp_stride * (size_t)omp_get_thread_num_safe();
        float *xe = xin + H, *acc = xe + H, *row = acc + H, *h = row + (H > I ? H : I), *he = h + I;
        memset(acc, 0, (size_t)H * sizeof(float));
        for (int j = 0; j < k; j++) {
            const int e = a->ids[t * k + j];
            const float wt = a->weights[t * k + j];
            for (int64_t i = 0; i < H; i++) {
                float v = xbf ? mr_bf16_to_f32(((const uint16_t *)a->x)[t * H + i]) : ((const float *)a->x)[t * H + i];
                xin[i] = woi ? v * wt : v;
            }
            mr__act_effective_row(p->act_mode, xin, H, c->s13, xe);
            for (int64_t i = 0; i < I; i++) {
                mr_qmatrix_dequant_row(&c->w->w1[e], i, row);
                float g = (float)dot_d(row, xe, H);
                mr_qmatrix_dequant_row(&c->w->w3[e], i, row);
                float u = (float)dot_d(row, xe, H);
                h[i] = mr__silu(g) * u;
            }
            mr__act_effective_row(p->act_mode, h, I, c->s2, he);
            for (int64_t n = 0; n < H; n++) {
                mr_qmatrix_dequant_row(&c->w->w2[e], n, row);
                float y = (float)dot_d(row, he, I);
                acc[n] += woi ? y : wt * y;
            }
        }
        for (int64_t n = 0; n < H; n++) {
            if (xbf)
                ((uint16_t *)a->out)[t * H + n] = mr_f32_to_bf16(acc[n]);
            else
                ((float *)a->out)[t * H + n] = acc[n];
        }
    }
    return MR_OK;
}

const struct mr_moe_runner_ops mr__moe_ops_reference = {.after_load = reference_after_load, .run = reference_run};
