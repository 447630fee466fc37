/* overrides.c — per-architecture model overrides (resolution pass 3): a
 * registry keyed by the architecture string, run in registration order.
 * This is where performance knowledge about one model family lives.
 * Rules (spec/resolution.md): an entry names its model, touches only options
 * the user left at auto, and declares *preferences*: pass 4 still asks the
 * runners' capability predicates. */
#include <stdio.h>
#include <string.h>

#include "config/config_internal.h"

static const char *const SRC = "model_overrides";

/* MiniMax-M2: router logits in fp32; prefer a runner that takes
 * precomputed routing (routed) when the self-routing ones (fused) cannot run
 * minimax2 here (their predicates say so). */
static mr_status minimax_m2(mr_resolution *r) {
    mr_status s;
    if (mr__user_fixed(r, MR_OPT_ROUTER_DTYPE)) {
        s = mr__decl(r, MR_DECL_NOTE, SRC, "router_dtype", mr__user_value(r, MR_OPT_ROUTER_DTYPE),
                     "explicit; the MiniMax-M2 rule (fp32) leaves it alone");
    } else {
        r->w.router_dtype = MR_FMT_F32;
        s = mr__decl(r, MR_DECL_SET, SRC, "router_dtype", "fp32",
                     "MiniMax-M2 routes on sigmoid scores plus a correction bias; the gate and bias are fp32 so that "
                     "the top-%d choice is exact",
                     r->model.top_k);
    }
    if (s != MR_OK) return s;

    if (mr__user_fixed(r, MR_OPT_MOE_RUNNER_BACKEND))
        return mr__decl(r, MR_DECL_NOTE, SRC, "moe_runner_backend", mr__user_value(r, MR_OPT_MOE_RUNNER_BACKEND),
                        "explicit; the MiniMax-M2 rule leaves it alone");
    /* Runners that route inside their kernel implement a declared subset of
     * methods; ask each such runner (in registry order) whether it can run
     * this model here. Any that can: no preference. None: prefer the first
     * auto-eligible runner that takes precomputed (ids, weights), so that any
     * routing method works. */
    mr_moe_problem p;
    mr__problem(r, &p);
    const mr_moe_runner *takes_ids = NULL;
    int n_self = 0;
    for (int i = 0; i < mr_moe_runner_count(); i++) {
        const mr_moe_runner *c = mr_moe_runner_at(i);
        if (!c->auto_eligible) continue;
        if (!c->routes_itself) {
            if (!takes_ids) takes_ids = c;
            continue;
        }
        char why[512];
        n_self++;
        if (c->supports(&p, why, sizeof why))
            return mr__decl(r, MR_DECL_NOTE, SRC, "moe_runner_backend", "auto",
                            "%s can run %s here and no measurement shows another runner faster: no preference",
                            c->name, mr_routing_name(r->model.routing));
        if ((s = mr__decl(r, MR_DECL_REFUSE, SRC, "moe_runner_backend", c->name, "%s", why)) != MR_OK) return s;
    }
    if (takes_ids == NULL)
        return mr__decl(r, MR_DECL_NOTE, SRC, "moe_runner_backend", "auto",
                        "no runner taking precomputed routing is built: no preference");
    r->w.preferred = takes_ids;
    if (n_self == 0)
        return mr__decl(r, MR_DECL_SET, SRC, "moe_runner_backend", takes_ids->name,
                        "prefer %s: no runner that routes inside its kernel is built into this binary", takes_ids->name);
    return mr__decl(r, MR_DECL_SET, SRC, "moe_runner_backend", takes_ids->name,
                    "prefer %s: the runners that route inside their kernel cannot run %s on %s (their capability "
                    "checks refused, above); %s takes precomputed (ids, weights)",
                    takes_ids->name, mr_routing_name(r->model.routing), mr_device_name(r->w.device), takes_ids->name);
}

static const mr__override registry[] = {
    {"MiniMaxM2ForCausalLM", "router_dtype=fp32; prefer a runner taking precomputed routing when the self-routing ones cannot run minimax2", minimax_m2},
};

int mr__override_count(void) { return (int)(sizeof registry / sizeof registry[0]); }

const mr__override *mr__override_at(int i) {
    if (i < 0 || i >= mr__override_count()) return NULL;
    return &registry[i];
}
