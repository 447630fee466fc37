/* moe_block.c — the MiniMax-M2 MoE block of one layer through the resolved
 * runner (spec/routing.md "MiniMax-M2 MoE block"):
 *   logits = gate(x) in fp32            [T][E]
 *   out    = MoE(x, logits)             [T][H]: the MoE layer's phases (route with
 *            minimax2 unless the runner routes itself, prepare, dispatch,
 *            experts, combine, finalize; moerun/moe.h), in the runner's
 *            activation dtype, on the model's one MoE context; under expert
 *            parallelism every rank passes the same tokens (replicated
 *            attention) and gets all of them back. */
#include <string.h>

#include "model/model_internal.h"

mr_status mr__moe_forward(mr_model *m, int l, const float *xn, int64_t T, float *out) {
    mr__state *s = &m->s;
    const mr__layer *L = &m->w.layers[l];
    int64_t H = m->c.hidden, k = m->c.top_k;
    mr_routing r = m->routing;
    r.bias = L->bias;
    mr__dense(s, &L->gate, xn, T, s->rlogits); /* router logits in fp32 */
    /* attention is replicated: every rank runs the same batch, is the origin of its share of the
     * tokens and gets every token's MoE output back (moerun/moe.h mr_moe_args.replicated) */
    mr_moe_args a = {.T = T, .x = xn, .out = out, .logits = s->rlogits, .routing = &r, .ids_out = s->ids,
                     .weights_out = s->wts, .replicated = m->problem.ep_size > 1};
    if (m->problem.act_dtype == MR_FMT_BF16) { /* runner takes bf16 activations */
        for (int64_t i = 0; i < T * H; i++) s->xb[i] = mr_f32_to_bf16(xn[i]);
        a.x = s->xb;
        a.out = s->ob;
    }
    mr_status st = mr_moe_run(m->moe, L->experts, &a); /* route, experts, weighted sum */
    if (st) return st;
    uint64_t touched = 0; /* distinct experts of this call (the bench's bytes moved) */
    for (int64_t i = 0; i < T * k; i++)
        if (s->ids[i] >= 0 && s->ids[i] < m->c.n_experts && !s->emark[s->ids[i]]) {
            s->emark[s->ids[i]] = 1;
            touched++;
        }
    for (int64_t i = 0; i < T * k; i++)
        if (s->ids[i] >= 0 && s->ids[i] < m->c.n_experts) s->emark[s->ids[i]] = 0;
    m->timing.experts_touched += touched;
    if (m->routes_out) /* routing capture: row t of the call, this layer's k */
        for (int64_t t = 0; t < T; t++)
            memcpy(m->routes_out + ((size_t)t * (size_t)m->c.n_layers + (size_t)l) * (size_t)k, s->ids + (size_t)t * (size_t)k,
                   (size_t)k * sizeof(int32_t));
    if (atomic_load_explicit(&m->erec_on, memory_order_relaxed)) { /* the expert distribution */
        atomic_uint_least64_t *c = m->erec + (size_t)l * (size_t)m->c.n_experts;
        for (int64_t i = 0; i < T * k; i++)
            if (s->ids[i] >= 0 && s->ids[i] < m->c.n_experts) atomic_fetch_add_explicit(&c[s->ids[i]], 1, memory_order_relaxed);
    }
    if (m->problem.act_dtype == MR_FMT_BF16)
        for (int64_t i = 0; i < T * H; i++) out[i] = mr_bf16_to_f32(s->ob[i]);
    if (m->moe_input_hook) m->moe_input_hook(m->moe_input_user, l, xn, out, T, s->ids, (int)k);
    return MR_OK;
}
