/* registry.c — the MoE runner registry (in `auto` preference order on CPU),
 * the capability predicates and the layout each runner needs.
 *
 * Every predicate checks, in this order: (1) device, (2) weight format and
 * activation mode/dtype, (3) routing method (only for runners that route
 * themselves), (4) E/k/alignment limits, (5) the a2a transport. The first
 * refusal writes one sentence to `why`. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "moe/moe_internal.h"

#define MR_MOE_MAX_EXPERTS 4096
#define MR_MOE_MAX_TOPK 32

static bool refuse(char *why, size_t n, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static bool refuse(char *why, size_t n, const char *fmt, ...) {
    if (why && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, n, fmt, ap);
        va_end(ap);
    }
    return false;
}

static bool check_device(const char *rn, const mr_moe_problem *p, char *why, size_t n) {
    if (p->device != MR_DEVICE_CPU)
        return refuse(why, n, "runner %s runs on cpu only, not on device %s.", rn, mr_device_name(p->device));
    return true;
}

static bool check_formats(const char *rn, const mr_moe_problem *p, char *why, size_t n) {
    if (p->weight_format != MR_FMT_BF16 && p->weight_format != MR_FMT_FP8_BLOCK && p->weight_format != MR_FMT_NVFP4) {
        const mr_format_traits *t = mr_format_traits_get(p->weight_format);
        return refuse(why, n, "runner %s takes bf16, fp8_block or nvfp4 expert weights, not %s.", rn,
                      t ? t->name : "an unknown format");
    }
    if (p->act_mode == MR_ACT_AUTO || (int)p->act_mode < 0 || p->act_mode >= MR_ACT_COUNT)
        return refuse(why, n, "runner %s needs a concrete activation mode, not %s.", rn, mr_act_mode_name(p->act_mode));
    if (mr_act_mode_weight_format(p->act_mode) != p->weight_format) {
        const mr_format_traits *t = mr_format_traits_get(p->weight_format);
        return refuse(why, n, "activation mode %s does not belong to %s weights.", mr_act_mode_name(p->act_mode),
                      t ? t->name : "these");
    }
    if (p->act_dtype != MR_FMT_F32 && p->act_dtype != MR_FMT_BF16)
        return refuse(why, n, "runner %s takes f32 or bf16 activations only.", rn);
    return true;
}

static bool check_limits(const char *rn, const mr_moe_problem *p, char *why, size_t n) {
    if (p->n_experts < 1 || p->n_experts > MR_MOE_MAX_EXPERTS)
        return refuse(why, n, "runner %s supports 1..%d experts, not %d.", rn, MR_MOE_MAX_EXPERTS, p->n_experts);
    if (p->top_k < 1 || p->top_k > p->n_experts || p->top_k > MR_MOE_MAX_TOPK)
        return refuse(why, n, "runner %s supports top_k 1..min(E, %d), not %d.", rn, MR_MOE_MAX_TOPK, p->top_k);
    if (p->hidden < 1 || p->inter < 1 || p->hidden > (1 << 20) || p->inter > (1 << 20))
        return refuse(why, n, "runner %s needs hidden and intermediate sizes in 1..2^20.", rn);
    if (p->weight_format == MR_FMT_NVFP4 && (p->hidden % 16 || p->inter % 16))
        return refuse(why, n, "nvfp4 experts need hidden and intermediate sizes that are multiples of 16 (got %lld, %lld).",
                      (long long)p->hidden, (long long)p->inter);
    return true;
}

/* ---- reference: scalar fp32, any routing, any format, any transport ---- */
static bool reference_supports(const mr_moe_problem *p, char *why, size_t n) {
    if (!check_device("reference", p, why, n) || !check_formats("reference", p, why, n)) return false;
    if (!check_limits("reference", p, why, n)) return false;
    if ((int)p->a2a < 0 || p->a2a >= MR_A2A_COUNT) return refuse(why, n, "unknown a2a transport.");
    return true;
}

static void reference_layout(const mr_moe_problem *p, mr_moe_layout *out) {
    memset(out, 0, sizeof *out);
    out->gateup = MR_GATEUP_SEPARATE;
    out->inter_padded = p->inter;
    out->owner = "reference";
}

/* ---- routed: SIMD, takes (ids, weights): any routing, any transport ---- */
static bool routed_supports(const mr_moe_problem *p, char *why, size_t n) {
    if (!check_device("routed", p, why, n) || !check_formats("routed", p, why, n)) return false;
    if (!check_limits("routed", p, why, n)) return false;
    if ((int)p->a2a < 0 || p->a2a >= MR_A2A_COUNT) return refuse(why, n, "unknown a2a transport.");
    return true;
}

static int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

/* The packed micro-kernels' tile layouts (moerun/kernels.h): gate and up
 * interleaved per 16-row tile, I padded to 16; the pack is the one the
 * kernel table of the problem's CPU features takes for the mode's kernel
 * kind (it follows the weight format and, for NVFP4, the kernel input:
 * int8 for w4a4/w4a8, bf16 for w4a16). */
static void routed_layout(const mr_moe_problem *p, mr_moe_layout *out) {
    memset(out, 0, sizeof *out);
    out->gateup = MR_GATEUP_INTERLEAVED;
    out->interleave_rows = MR_PACK_TILE;
    out->inter_padded = round_up(p->inter, MR_PACK_TILE);
    out->pack_tile = MR_PACK_TILE;
    /* the pack the kernels of this CPU take for the mode's kernel kind (a
     * mode of another format, or none yet: the format's default mode) */
    mr_act_mode m = mr_act_mode_weight_format(p->act_mode) == p->weight_format ? p->act_mode
                                                                               : mr_act_mode_default(p->weight_format);
    if (m == MR_ACT_AUTO) m = MR_ACT_W16A32; /* bf16 packing, as for F32 test weights */
    mr_kernels k;
    mr_kernels_init(&k, p->cpu_flags);
    out->pack = k.uk_pack[mr_act_mode_uk_kind(m)];
    out->owner = "routed";
}

/* ---- fused: routes itself (declared subset), no routing-first transport ---- */
bool mr_moe_fused_supports_routing(mr_routing_id id) {
    switch (id) {
    case MR_ROUTING_SOFTMAX_TOPK:
    case MR_ROUTING_RENORMALIZE:
    case MR_ROUTING_TOPK_SOFTMAX:
    case MR_ROUTING_SIGMOID_RENORM:
    case MR_ROUTING_SIGMOID:
    case MR_ROUTING_TOPK: return true;
    default: return false; /* minimax2, deepseek_v3, llama4: not implemented by fused */
    }
}

static bool fused_supports(const mr_moe_problem *p, char *why, size_t n) {
    if (!check_device("fused", p, why, n) || !check_formats("fused", p, why, n)) return false;
    if (!mr_moe_fused_supports_routing(p->routing))
        return refuse(why, n,
                      "routing method %s is not implemented by fused (it implements softmax_topk, renormalize, "
                      "topk_softmax, sigmoid_renorm, sigmoid and topk).",
                      mr_routing_name(p->routing));
    if (!check_limits("fused", p, why, n)) return false;
    if (p->n_group > 1) return refuse(why, n, "runner fused does not implement grouped selection (n_group %d).", p->n_group);
    if ((int)p->a2a < 0 || p->a2a >= MR_A2A_COUNT) return refuse(why, n, "unknown a2a transport.");
    if (mr_a2a_needs_routing_first(p->a2a))
        return refuse(why, n, "runner fused routes inside the kernel, but a2a transport %s needs the routing before dispatch.",
                      mr_a2a_name(p->a2a));
    return true;
}

/* gate/up interleaved in blocks of R rows (R = 128 for FP8, keeping the
 * 128-row scale blocks whole; 16 otherwise), I padded to R. */
static void fused_layout(const mr_moe_problem *p, mr_moe_layout *out) {
    memset(out, 0, sizeof *out);
    int r = p->weight_format == MR_FMT_FP8_BLOCK ? 128 : 16;
    out->gateup = MR_GATEUP_INTERLEAVED;
    out->interleave_rows = r;
    out->inter_padded = round_up(p->inter, r);
    out->owner = "fused";
}

static const mr_moe_runner runners[] = {
    {.name = "fused", .id = MR_RUNNER_FUSED, .routes_itself = true, .supports = fused_supports,
     .required_layout = fused_layout, .ops = &mr__moe_ops_fused, .auto_eligible = true,
     .help = "SIMD, takes router logits and routes inside (softmax_topk, renormalize, topk_softmax, sigmoid_renorm, "
             "sigmoid, topk); no routing-first transport"},
    {.name = "routed", .id = MR_RUNNER_ROUTED, .routes_itself = false, .supports = routed_supports,
     .required_layout = routed_layout, .ops = &mr__moe_ops_routed, .auto_eligible = true,
     .help = "SIMD on packed tiles, takes precomputed (ids, weights): any routing, any transport"},
    {.name = "reference", .id = MR_RUNNER_REFERENCE, .routes_itself = false, .supports = reference_supports,
     .required_layout = reference_layout, .ops = &mr__moe_ops_reference, .auto_eligible = false,
     .ground_truth = true,
     .help = "scalar fp32 ground truth, any routing, format and transport; slow by design, never auto"},
};

int mr_moe_runner_count(void) { return (int)(sizeof runners / sizeof runners[0]); }

const mr_moe_runner *mr_moe_runner_at(int i) {
    if (i < 0 || i >= mr_moe_runner_count()) return NULL;
    return &runners[i];
}

const mr_moe_runner *mr_moe_runner_find(const char *name) {
    for (int i = 0; name && i < mr_moe_runner_count(); i++)
        if (!strcmp(runners[i].name, name)) return &runners[i];
    return NULL;
}

const mr_moe_runner *mr_moe_runner_get(mr_moe_runner_id id) {
    for (int i = 0; i < mr_moe_runner_count(); i++)
        if (runners[i].id == id) return &runners[i];
    return NULL;
}

const mr_moe_runner *mr_moe_runner_ground_truth(void) {
    for (int i = 0; i < mr_moe_runner_count(); i++)
        if (runners[i].ground_truth) return &runners[i];
    return NULL;
}
