/* moe_block.c — the MiniMax-M2 MoE block of one layer through the resolved
 * runner (spec/routing.md "MiniMax-M2 MoE block"):
 *   logits = gate(x) in fp32            [T][E]
 *   ids, w = minimax2(logits, bias, k)  unless the runner routes itself
 *   out    = runner(x, ids, w)          [T][H], in the runner's activation dtype */
#include <string.h>

#include "model/model_internal.h"

mr_status mr__moe_forward(mr_model *m, int l, const float *xn, int64_t T, float *out) {
    mr__state *s = &m->s;
    const mr__layer *L = &m->w.layers[l];
    int64_t H = m->c.hidden, k = m->c.top_k;
    mr_routing r = m->routing;
    r.bias = L->bias;
    mr__dense(&L->gate, xn, T, s->rlogits); /* router logits in fp32 */
    mr_moe_args a = {.T = T, .x = xn, .out = out};
    if (m->runner->routes_itself) {
        a.logits = s->rlogits; /* fused: routes inside the kernel */
        a.routing = &r;
        a.ids_out = s->ids;
        a.weights_out = s->wts;
    } else {
        mr_status st = mr_route(&r, s->rlogits, T, s->ids, s->wts); /* minimax2 top-k */
        if (st) return st;
        a.ids = s->ids;
        a.weights = s->wts;
    }
    if (m->problem.act_dtype == MR_FMT_BF16) { /* runner takes bf16 activations */
        for (int64_t i = 0; i < T * H; i++) s->xb[i] = mr_f32_to_bf16(xn[i]);
        a.x = s->xb;
        a.out = s->ob;
    }
    if (m->moe_input_hook) {
        if (m->runner->routes_itself) {
            mr_status st = mr_route(&r, s->rlogits, T, s->ids, s->wts);
            if (st) return st;
        }
        m->moe_input_hook(m->moe_input_user, l, xn, T, s->ids, (int)k);
    }
    mr_status st = mr_moe_run(L->moe, &a); /* experts: gate/up, SiLU*up, down, weighted sum */
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
    if (m->problem.act_dtype == MR_FMT_BF16)
        for (int64_t i = 0; i < T * H; i++) out[i] = mr_bf16_to_f32(s->ob[i]);
    return MR_OK;
}
