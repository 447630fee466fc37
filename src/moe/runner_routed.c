/* runner_routed.c — the `routed` runner: takes precomputed (ids, weights),
 * so any routing method works and it can sit behind an a2a transport. Its
 * after-load packs every expert into the 16-row tile layout of its packed
 * micro-kernels, gate and up tiles interleaved (registry.c routed_layout).
 * Compute: expert_packed.c. */
#include "moe/moe_internal.h"

static mr_status routed_after_load(const mr_moe_problem *p, mr_moe_weights *w) {
    mr_moe_layout L;
    mr_moe_runner_find("routed")->required_layout(p, &L);
    /* test-only mutation: up where gate belongs (the matrix must catch it) */
    return mr__moe_pack(w, &L, (mr__moe_mutation & MR_MUT_SWAP_GATE_UP) != 0);
}

static mr_status routed_run(mr_moe_ctx *c, const mr_moe_args *a) {
    for (int64_t i = 0; i < a->T * c->p.top_k; i++)
        if (a->ids[i] < 0 || a->ids[i] >= c->p.n_experts)
            return mr_error_set(MR_EINPUT, "token %lld choice %d: expert id %d out of [0,%d)", (long long)(i / c->p.top_k),
                                (int)(i % c->p.top_k), a->ids[i], c->p.n_experts);
    return mr__moe_experts_run_packed(c, a, a->ids, a->weights);
}

const struct mr_moe_runner_ops mr__moe_ops_routed = {.after_load = routed_after_load, .run = routed_run};
