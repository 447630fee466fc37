/* moerun/moe.h — the MoE layer: problem description, activation modes,
 * expert weight sets with their layout descriptor, and runners with their
 * capability predicates. See shared/DESIGN.md "Runners".
 *
 * The resolver (config/) only needs mr_moe_problem, the runner registry and
 * the predicates; it never runs a runner. */
#ifndef MOERUN_MOE_H
#define MOERUN_MOE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moerun/base.h"
#include "moerun/formats.h"
#include "moerun/kernels.h"
#include "moerun/routing.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Stable ids (append only). GPU devices are planning placeholders. */
typedef enum {
    MR_DEVICE_CPU = 0,
    MR_DEVICE_SM90 = 1,
    MR_DEVICE_SM100 = 2,
    MR_DEVICE_SM103 = 3,
    MR_DEVICE_SM110 = 4,
    MR_DEVICE_SM120 = 5,
    MR_DEVICE_COUNT
} mr_device;
const char *mr_device_name(mr_device d);
mr_status mr_device_from_name(const char *name, mr_device *out);

/* Expert-parallel all-to-all transports. */
typedef enum { MR_A2A_NONE = 0, MR_A2A_MPI = 1, MR_A2A_COUNT } mr_a2a;
const char *mr_a2a_name(mr_a2a a);
mr_status mr_a2a_from_name(const char *name, mr_a2a *out);
/* Does this transport need the routing (ids) before dispatch? (mpi: yes) */
bool mr_a2a_needs_routing_first(mr_a2a a);

/* Activation modes, per weight format (exact definitions in src/moe/actmode.c
 * and docs/activation-modes.md). Stable ids. */
typedef enum {
    MR_ACT_AUTO = 0,
    MR_ACT_W16A32 = 1, /* bf16 weights, fp32 activations */
    MR_ACT_W16A16 = 2, /* bf16 weights, bf16 activations */
    MR_ACT_W8A8 = 3,   /* FP8 block weights, 1x128 dynamic E4M3 activations (as GPU kernels do) */
    MR_ACT_W8A16 = 4,  /* FP8 block weights, bf16 activations */
    MR_ACT_W4A4 = 5,   /* NVFP4 weights, NVFP4 activations via input_scale (as GPU kernels do) */
    MR_ACT_W4A8 = 6,   /* NVFP4 weights, int8 activations (CPU-friendly) */
    MR_ACT_W4A16 = 7,  /* NVFP4 weights, bf16 activations (CPU-friendly) */
    MR_ACT_COUNT
} mr_act_mode;
const char *mr_act_mode_name(mr_act_mode m);
mr_status mr_act_mode_from_name(const char *name, mr_act_mode *out);
/* The weight format a mode belongs to (MR_FMT_COUNT for AUTO). */
mr_format mr_act_mode_weight_format(mr_act_mode m);
/* The default mode for a weight format (the GPU-faithful one: w8a8, w4a4, w16a32). */
mr_act_mode mr_act_mode_default(mr_format weight_format);
/* The packed micro-kernel kind the routed runner uses for a mode (not AUTO). */
mr_uk_kind mr_act_mode_uk_kind(mr_act_mode m);

/* Everything a capability predicate looks at. */
typedef struct {
    mr_device device;
    uint32_t cpu_flags;       /* mr_cpu_feature bits usable by kernels (after kernel_isa / masks) */
    mr_format weight_format;  /* BF16, FP8_BLOCK, NVFP4 */
    mr_act_mode act_mode;     /* never AUTO when asked */
    mr_format act_dtype;      /* dtype of x and out: F32 or BF16 */
    mr_routing_id routing;
    int n_experts, top_k;
    int n_group, topk_group;
    int64_t hidden, inter;    /* H, I */
    mr_a2a a2a;
} mr_moe_problem;

/* Layout descriptor of an expert weight set, produced by a runner's
 * after-load step and asserted at dispatch. */
typedef enum {
    MR_GATEUP_SEPARATE = 0,    /* HF: w1 (gate) and w3 (up) as two matrices */
    MR_GATEUP_CONCAT = 1,      /* one [2I][H] matrix: gate rows then up rows */
    MR_GATEUP_INTERLEAVED = 2  /* gate/up interleaved in blocks of interleave_rows rows */
} mr_gateup_order;

typedef struct {
    mr_gateup_order gateup;
    int interleave_rows;   /* block size for INTERLEAVED, else 0 */
    int64_t inter_padded;  /* I rounded up to the runner's alignment (== I if none) */
    int pack;              /* packing id, an mr_pack_id (0 = row-major as stored; see moerun/kernels.h) */
    int pack_tile;         /* rows per packed tile, 0 if none */
    const char *owner;     /* name of the runner whose after-load produced it */
} mr_moe_layout;

typedef struct mr_moe_runner mr_moe_runner;
struct mr_moe_runner {
    const char *name;     /* "reference", "routed", "fused" */
    int id;               /* stable */
    bool routes_itself;   /* takes router logits, not (ids, weights) */
    /* Checks, in order: device, weight+activation formats, routing method
     * (if routes_itself), E/k/alignment limits, a2a transport. On refusal
     * writes one sentence to why (n bytes) and returns false. */
    bool (*supports)(const mr_moe_problem *p, char *why, size_t n);
    /* The layout this runner needs for p (what after-load will produce). */
    void (*required_layout)(const mr_moe_problem *p, mr_moe_layout *out);
    /* Further members (after_load, run, ...) are declared in the runner
     * implementation section below. */
    const struct mr_moe_runner_ops *ops;
    /* May `auto` choose it for real work? (reference: false) */
    bool auto_eligible;
};

/* Registry, in preference order for `auto` on CPU. */
int mr_moe_runner_count(void);
const mr_moe_runner *mr_moe_runner_at(int i);
const mr_moe_runner *mr_moe_runner_find(const char *name); /* NULL if unknown */

/* ---- expert weight sets ----
 * E experts, each with gate w1 [I][H], up w3 [I][H], down w2 [H][I] (HF
 * layout, as loaded). A runner's after-load step (mr_moe_weights_prepare)
 * turns them into its layout once; the descriptor records the result and the
 * runner checks it at dispatch. */
typedef struct {
    int n_experts;         /* E */
    int64_t hidden, inter; /* H, I */
    mr_format fmt;         /* BF16, FP8_BLOCK or NVFP4 (F32 also accepted, for tests) */
    mr_qmatrix *w1, *w3;   /* [E] gate, up [I][H]; freed (zeroed) when merged into w13 */
    mr_qmatrix *w2;        /* [E] down [H][I] */
    mr_qmatrix *w13;       /* [E] merged [2*inter_padded][H] (CONCAT/INTERLEAVED, pack 0), else NULL */
    mr_pmatrix *p13, *p2;  /* [E] packed (layout.pack != 0): gate/up tiles interleaved, down; else NULL.
                              The HF copies (w1, w3, w2) are then freed (zeroed). */
    mr_moe_layout layout;  /* as loaded: SEPARATE, owner "checkpoint" */
} mr_moe_weights;

/* Bytes of one expert's weights (gate, up, down with their scales) in the
 * set's current layout (expert 0; every expert has the same size). */
size_t mr_moe_weights_expert_bytes(const mr_moe_weights *w);

/* Empty set with E zeroed matrices of each kind; the caller fills
 * w1/w3/w2 (e.g. with mr_qmatrix_quantize). */
mr_status mr_moe_weights_new(mr_moe_weights **out, int E, int64_t H, int64_t I, mr_format fmt);
void mr_moe_weights_free(mr_moe_weights *w);
/* Deep copy (data and scales), layout included. */
mr_status mr_moe_weights_clone(const mr_moe_weights *src, mr_moe_weights **out);
/* Checks shapes and formats of every expert matrix; clear error otherwise. */
mr_status mr_moe_weights_validate(const mr_moe_weights *w);
/* Sets NVFP4 input_scale for W4A4: w1/w3 get amax(x)/2688 (one global value),
 * w2 gets amax over all experts and tokens of silu(gate)*up / 2688, computed
 * in fp32 on dequantized weights. x [T][H] fp32. For tests and the bench. */
mr_status mr_moe_weights_calibrate(mr_moe_weights *w, const float *x, int64_t T);

/* ---- running ---- */
typedef struct {
    int64_t T;                /* tokens, 1..max_T */
    const void *x;            /* [T][H] in the problem's act_dtype (F32 or BF16) */
    void *out;                /* [T][H] in act_dtype: written, every element */
    const int32_t *ids;       /* [T][k] precomputed routing (runners that do not route) */
    const float *weights;     /* [T][k] */
    const float *logits;      /* [T][E] router logits (runners that route themselves) */
    const mr_routing *routing;/* method + bias (runners that route themselves) */
    int32_t *ids_out;         /* optional [T][k]: the selection a self-routing runner made */
    float *weights_out;       /* optional [T][k] */
} mr_moe_args;

typedef struct mr_moe_ctx mr_moe_ctx;

struct mr_moe_runner_ops {
    /* After-load: converts w (HF layout) into required_layout(p) in place. */
    mr_status (*after_load)(const mr_moe_problem *p, mr_moe_weights *w);
    mr_status (*run)(mr_moe_ctx *c, const mr_moe_args *a);
};

/* Checks supports(), runs the runner's after-load on w (which the context
 * borrows; free it after the context), and allocates the workspace for up to
 * max_T tokens, so that mr_moe_run never allocates. */
mr_status mr_moe_ctx_new(const mr_moe_runner *r, const mr_moe_problem *p, mr_moe_weights *w, int64_t max_T,
                         mr_moe_ctx **out);
/* One MoE layer call. Checks the layout (MR_ESTATE on mismatch) and args. */
mr_status mr_moe_run(mr_moe_ctx *c, const mr_moe_args *a);
void mr_moe_ctx_free(mr_moe_ctx *c);
/* Bytes of workspace the context allocated (activations, permutation, per-thread scratch). */
size_t mr_moe_ctx_workspace_bytes(const mr_moe_ctx *c);

/* Phase profile of the packed (`routed`) path, summed over the calls since
 * the last reset. wall_ns: each phase as the calling thread sees it
 * (barriers included); busy_ns: the threads' own work in it, summed over
 * threads (wall * threads - busy = time spent waiting). Phases: routing
 * permutation and task list, preparation of x, GEMM1 (gate/up + SiLU*up +
 * preparation of h), GEMM2 (down), reduction of the k slots. */
enum { MR_MOE_PH_SETUP = 0, MR_MOE_PH_PREP, MR_MOE_PH_GEMM1, MR_MOE_PH_GEMM2, MR_MOE_PH_REDUCE, MR_MOE_NPH };
typedef struct {
    int64_t calls;
    int n_threads;
    uint64_t wall_ns[MR_MOE_NPH], busy_ns[MR_MOE_NPH];
} mr_moe_profile;
void mr_moe_ctx_profile(mr_moe_ctx *c, mr_moe_profile *out, bool reset);
/* Benchmark isolation only: the packed path calls the table's uk_stream
 * (reads every weight byte of each tile as the kernels do, computes
 * nothing) instead of the micro-kernels; outputs are then meaningless. */
void mr_moe_ctx_debug_stream_only(mr_moe_ctx *c, bool on);

/* Runs the after-load of runner r on w without a context (e.g. at model load). */
mr_status mr_moe_weights_prepare(const mr_moe_runner *r, const mr_moe_problem *p, mr_moe_weights *w);

/* Routing presets the fused runner implements (its declared subset). */
bool mr_moe_fused_supports_routing(mr_routing_id id);

/* ---- test-only mutations (must make the cross-runner matrix fail) ---- */
enum {
    MR_MUT_NONE = 0,
    MR_MUT_SWAP_GATE_UP = 1u << 0, /* routed after-load swaps gate and up */
    MR_MUT_FUSED_NO_RENORM = 1u << 1 /* fused skips weight renormalization */
};
/* Sets the mutation flags; returns the previous ones. Not thread-safe. */
unsigned mr_moe_debug_mutation(unsigned flags);

#ifdef __cplusplus
}
#endif
#endif
