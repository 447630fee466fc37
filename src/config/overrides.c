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

/* MiniMax-M2: router logits in fp32; prefer routed when fused cannot run
 * minimax2 here (its predicate says so), or when a measurement shows routed
 * faster. */
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
    const mr_moe_runner *fused = mr_moe_runner_find("fused");
    const mr_moe_runner *routed = mr_moe_runner_find("routed");
    if (routed == NULL)
        return mr__decl(r, MR_DECL_NOTE, SRC, "moe_runner_backend", "auto", "routed is not built: no preference");
    if (fused == NULL) {
        r->w.preferred = routed;
        return mr__decl(r, MR_DECL_SET, SRC, "moe_runner_backend", "routed",
                        "prefer routed: fused is not built into this binary");
    }
    mr_moe_problem p;
    mr__problem(r, &p);
    char why[512];
    if (!fused->supports(&p, why, sizeof why)) {
        s = mr__decl(r, MR_DECL_REFUSE, SRC, "moe_runner_backend", "fused", "%s", why);
        if (s != MR_OK) return s;
        r->w.preferred = routed;
        return mr__decl(r, MR_DECL_SET, SRC, "moe_runner_backend", "routed",
                        "prefer routed: fused cannot run %s on %s (its capability check refused, above)",
                        mr_routing_name(r->model.routing), mr_device_name(r->w.device));
    }
    /* fused can run minimax2 here: only a measurement could prefer routed.
     * No measurement store exists yet, so there is no preference. */
    return mr__decl(r, MR_DECL_NOTE, SRC, "moe_runner_backend", "auto",
                    "fused can run %s here and no measurement shows routed faster: no preference",
                    mr_routing_name(r->model.routing));
}

static const mr__override registry[] = {
    {"MiniMaxM2ForCausalLM", "router_dtype=fp32; prefer routed when fused cannot run minimax2", minimax_m2},
};

int mr__override_count(void) { return (int)(sizeof registry / sizeof registry[0]); }

const mr__override *mr__override_at(int i) {
    if (i < 0 || i >= mr__override_count()) return NULL;
    return &registry[i];
}
