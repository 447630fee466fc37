/* moerun/moe.h — the MoE layer: problem description, activation modes,
 * expert weight sets with their layout descriptor, runners with their
 * capability predicates, the context (one per model: the runner's private
 * state, the transport and one workspace shared by every layer), the layer's
 * phases and the expert-parallel transport seam (mr_a2a_ops). See
 * shared/DESIGN.md "Runners" and shared/spec/expert-parallel.md.
 *
 * One MoE layer call (mr_moe_run), each phase a function (src/moe/layer.c):
 *   route     (ids, weights) [T][k]: precomputed by the caller, mr_route on
 *             the router logits, or the runner's own routing (fused); then the
 *             rows' order: the T*k (token, slot) rows grouped by expert
 *             (experts ascending, so by owning peer first under a contiguous
 *             placement), tokens ascending within an expert
 *   prepare   each row's activation in the runner's kernel form (quantized
 *             where the mode says so; the scale never depends on the expert)
 *   dispatch  the transport moves rows to the peers owning their experts
 *             (none: identity, the rows stay where they are)
 *   experts   the runner computes every received row with unit routing
 *             weights into fp32 rows [rows][H]
 *   combine   the transport brings each result row back to its origin
 *   finalize  out[t] = sum over slots j in selection order of w[t][j] * y[t][j],
 *             stored in the activation dtype
 * Because the routing weight is applied only at the origin, in slot order,
 * an expert-parallel run gives the single-process output bit for bit as long
 * as an expert's result for a row does not depend on the other rows.
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
    int n_experts, top_k;     /* E (all experts of the layer), k */
    int n_group, topk_group;
    int64_t hidden, inter;    /* H, I */
    mr_a2a a2a;
    /* expert parallelism: this process is peer ep_rank of ep_size (0 of 1
     * without a transport) and computes the experts [local_first,
     * local_first + n_local); n_local 0 means all E (0 and 1 for ep_size) */
    int ep_size, ep_rank;
    int local_first, n_local;
} mr_moe_problem;

/* The experts a process computes, normalized (n_local 0 -> all). */
void mr_moe_problem_local(const mr_moe_problem *p, int *first, int *n);
/* Contiguous placement (spec/expert-parallel.md): peer r of R owns experts
 * [r*E/R ...): the first E mod R peers one expert more. *first, *n. */
void mr_moe_placement_contiguous(int E, int R, int r, int *first, int *n);
/* The peer owning expert e under that placement. */
int mr_moe_placement_owner(int E, int R, int e);

/* Where the experts run: logical expert (the router's id) -> physical
 * expert (a copy of its weights held by one peer) -> the owning peer. Each
 * peer's physical experts are contiguous, [peer_first[r], peer_first[r+1]),
 * and a weight set holds one peer's physical experts in that order. A
 * context builds it from the problem: one physical copy per logical expert,
 * placed contiguously. Redundant copies of hot experts (and rebalancing)
 * would add physical experts and change phys_of; the route phase, the
 * transports and the loader already go through the table. */
typedef struct {
    int n_logical, n_physical, n_peers;
    const int32_t *phys_of;    /* [n_logical] the physical copy that serves each logical expert */
    const int32_t *logical_of; /* [n_physical] the logical expert each physical one holds */
    const int32_t *peer_of;    /* [n_physical] its owner */
    const int32_t *peer_first; /* [n_peers + 1] */
} mr_moe_placement;

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
    const char *owner;     /* name of the runner whose after-load produced it (for messages) */
} mr_moe_layout;

/* Stable runner ids (append only); the registry holds one runner per id. */
typedef enum { MR_RUNNER_REFERENCE = 0, MR_RUNNER_ROUTED = 1, MR_RUNNER_FUSED = 2, MR_RUNNER_COUNT } mr_moe_runner_id;

typedef struct mr_moe_runner mr_moe_runner;
struct mr_moe_runner {
    const char *name;     /* "reference", "routed", "fused": for options, messages and logs only */
    mr_moe_runner_id id;  /* stable */
    bool routes_itself;   /* takes router logits, not (ids, weights) */
    /* Checks, in order: device, weight+activation formats, routing method
     * (if routes_itself), E/k/alignment limits, a2a transport. On refusal
     * writes one sentence to why (n bytes) and returns false. */
    bool (*supports)(const mr_moe_problem *p, char *why, size_t n);
    /* The layout this runner needs for p (what after-load will produce). */
    void (*required_layout)(const mr_moe_problem *p, mr_moe_layout *out);
    /* Its state and phases (src/moe/moe_internal.h). */
    const struct mr_moe_runner_ops *ops;
    /* May `auto` choose it for real work? (reference: false) */
    bool auto_eligible;
    /* The scalar ground truth every other runner is checked against. */
    bool ground_truth;
    const char *help;     /* one line for --help */
};

/* Registry, in preference order for `auto` on CPU. Options, --help and the
 * resolver read the runners from here (there is no other list). */
int mr_moe_runner_count(void);
const mr_moe_runner *mr_moe_runner_at(int i);
const mr_moe_runner *mr_moe_runner_find(const char *name); /* user input -> runner; NULL if unknown */
const mr_moe_runner *mr_moe_runner_get(mr_moe_runner_id id); /* NULL if not built */
const mr_moe_runner *mr_moe_runner_ground_truth(void);      /* the reference */
/* The instruction runner r's inner loop runs on problem p with the process
 * kernel table (benchmarks compare with its peak). */
mr_probe_instr mr_moe_runner_instr(const mr_moe_runner *r, const mr_moe_problem *p);

/* ---- expert weight sets ----
 * n_experts experts (the local ones: global ids expert_first ..), each with
 * gate w1 [I][H], up w3 [I][H], down w2 [H][I] (HF layout, as loaded). A
 * runner's after-load step (mr_moe_weights_prepare) turns them into its
 * layout once; the descriptor records the result and the runner checks it at
 * dispatch. */
typedef struct {
    int n_experts;         /* experts held (the local range's count) */
    int expert_first;      /* global id of expert 0 of this set */
    int64_t hidden, inter; /* H, I */
    mr_format fmt;         /* BF16, FP8_BLOCK or NVFP4 (F32 also accepted, for tests) */
    mr_qmatrix *w1, *w3;   /* [E] gate, up [I][H]; freed (zeroed) when merged into w13 */
    mr_qmatrix *w2;        /* [E] down [H][I] */
    mr_qmatrix *w13;       /* [E] merged [2*inter_padded][H] (CONCAT/INTERLEAVED, pack 0), else NULL */
    mr_pmatrix *p13, *p2;  /* [E] packed (layout.pack != 0): gate/up tiles interleaved, down; else NULL.
                              The HF copies (w1, w3, w2) are then freed (zeroed). */
    mr_moe_layout layout;  /* as loaded: SEPARATE, owner "checkpoint" */
    /* w4a4: the layer's global input scales, max over ALL its experts (also
     * those other peers hold): gate/up and down. 0 = take the max over this
     * set at prepare time. */
    float in_scale13, in_scale2;
    /* Memory the preparing runner manages itself (a GPU's, later); NULL on
     * CPU. Released by that runner (its ops) when the set is freed. */
    void *runner_data;
    const mr_moe_runner *prepared_by; /* the runner whose after-load ran, NULL before */
    /* Called with each source matrix (the checkpoint's) once after-load no
     * longer needs it, before it is dropped: the loader releases the mapped
     * pages there (weights held once). NULL: nothing to do. */
    void (*release_source)(void *user, const mr_qmatrix *m);
    void *release_user;
} mr_moe_weights;

/* Bytes of one expert's weights (gate, up, down with their scales) in the
 * set's current layout (expert 0; every expert has the same size). */
size_t mr_moe_weights_expert_bytes(const mr_moe_weights *w);

/* Empty set with E zeroed matrices of each kind; the caller fills
 * w1/w3/w2 (e.g. with mr_qmatrix_quantize). expert_first is 0. */
mr_status mr_moe_weights_new(mr_moe_weights **out, int E, int64_t H, int64_t I, mr_format fmt);
void mr_moe_weights_free(mr_moe_weights *w);
/* Deep copy (data and scales), layout included. A set holding runner_data
 * cannot be copied (MR_EUNSUPPORTED). */
mr_status mr_moe_weights_clone(const mr_moe_weights *src, mr_moe_weights **out);
/* Checks shapes and formats of every expert matrix; clear error otherwise. */
mr_status mr_moe_weights_validate(const mr_moe_weights *w);
/* Sets NVFP4 input_scale for W4A4: w1/w3 get amax(x)/2688 (one global value),
 * w2 gets amax over all experts and tokens of silu(gate)*up / 2688, computed
 * in fp32 on dequantized weights. x [T][H] fp32. For tests and the bench. */
mr_status mr_moe_weights_calibrate(mr_moe_weights *w, const float *x, int64_t T);

/* ---- running ---- */
typedef struct {
    int64_t T;                /* tokens, 1..max_T (0..max_T for a peer of an expert-parallel run) */
    const void *x;            /* [T][H] in the problem's act_dtype (F32 or BF16) */
    void *out;                /* [T][H] in act_dtype: written, every element */
    const int32_t *ids;       /* [T][k] precomputed routing (global expert ids), or NULL: route here */
    const float *weights;     /* [T][k] */
    const float *logits;      /* [T][E] router logits: routed here when ids is NULL (runners that
                                 route themselves always take these) */
    const mr_routing *routing;/* method + bias, with logits */
    int32_t *ids_out;         /* optional [T][k]: the selection used */
    float *weights_out;       /* optional [T][k] */
    /* Expert parallelism with replicated attention: every peer passes the
     * same T tokens. Each peer is then the origin of its share of them
     * (tokens [r*T/R, (r+1)*T/R)), and after the call out holds all T rows on
     * every peer (the transport's gather); ids_out / weights_out hold all T
     * selections. Without it (data-parallel attention) each peer passes its
     * own tokens. Ignored in one process. */
    bool replicated;
} mr_moe_args;

typedef struct mr_moe_ctx mr_moe_ctx;

/* The context of one model: checks supports(), makes the runner's private
 * state (its ops->ctx_new), opens the transport of p->a2a and allocates one
 * workspace for up to max_T tokens, shared by every layer (one layer runs
 * at a time), so that mr_moe_run never allocates. */
mr_status mr_moe_ctx_new(const mr_moe_runner *r, const mr_moe_problem *p, int64_t max_T, mr_moe_ctx **out);
void mr_moe_ctx_free(mr_moe_ctx *c); /* NULL ok */
/* Runs the context's runner's after-load on one layer's weight set (its
 * experts must be the problem's local range) and checks what it needs (w4a4
 * scales). Call once per layer, before the layer's first run. */
mr_status mr_moe_ctx_prepare(mr_moe_ctx *c, mr_moe_weights *w);
/* One MoE layer call on weight set w (prepared by this context's runner):
 * route -> prepare -> dispatch -> experts -> combine -> finalize. Checks the
 * layout (MR_ESTATE on mismatch) and args. */
mr_status mr_moe_run(mr_moe_ctx *c, const mr_moe_weights *w, const mr_moe_args *a);
/* Bytes of workspace the context allocated (rows, routing, per-thread
 * scratch, the runner's state); independent of the number of layers. */
size_t mr_moe_ctx_workspace_bytes(const mr_moe_ctx *c);

/* Phase profile, summed over the calls since the last reset. wall_ns: each
 * phase as the calling thread sees it (barriers included); busy_ns: the
 * threads' own work in it, summed over threads (wall * threads - busy = time
 * spent waiting; 0 where a runner does not measure it). Phases: route (the
 * selection and the rows' order), prepare x, GEMM1 (gate/up + SiLU*up +
 * preparation of h), GEMM2 (down), finalize (the k slots of each token),
 * a2a (dispatch + combine). */
enum {
    MR_MOE_PH_SETUP = 0,
    MR_MOE_PH_PREP,
    MR_MOE_PH_GEMM1,
    MR_MOE_PH_GEMM2,
    MR_MOE_PH_REDUCE,
    MR_MOE_PH_A2A,
    MR_MOE_NPH
};
typedef struct {
    int64_t calls;
    int n_threads;
    uint64_t wall_ns[MR_MOE_NPH], busy_ns[MR_MOE_NPH];
} mr_moe_profile;
void mr_moe_ctx_profile(mr_moe_ctx *c, mr_moe_profile *out, bool reset);
/* What the transport did, summed over the calls since the last reset:
 * rows this peer sent (its tokens' (token, slot) rows, to itself included)
 * and computed (received, from itself included); bytes it sent to other
 * peers in each exchange; wall time in each exchange (waiting for the peers
 * included); and, per local expert, the rows it computed. */
typedef struct {
    int64_t calls;
    int64_t rows_sent, rows_recv;
    uint64_t dispatch_bytes, combine_bytes, gather_bytes;
    uint64_t dispatch_ns, combine_ns, gather_ns;
    int n_local;                  /* local experts */
    const int64_t *recv_per_expert; /* [n_local] rows computed per local expert: the context's own
                                       counters (a reset zeroes them), valid while it lives */
    int64_t last_rows_recv;       /* rows computed in the last call */
    size_t row_wire_bytes;        /* bytes of one dispatched row on the wire (activation, scales, expert, slot) */
} mr_a2a_stats;
void mr_moe_ctx_a2a_stats(mr_moe_ctx *c, mr_a2a_stats *out, bool reset);
/* The context's placement table. */
const mr_moe_placement *mr_moe_ctx_placement(const mr_moe_ctx *c);
/* Benchmark isolation only: a packed runner calls the table's uk_stream
 * (reads every weight byte of each tile as the kernels do, computes
 * nothing) instead of the micro-kernels; outputs are then meaningless. */
void mr_moe_ctx_debug_stream_only(mr_moe_ctx *c, bool on);

/* Runs the after-load of runner r on w without a context. */
mr_status mr_moe_weights_prepare(const mr_moe_runner *r, const mr_moe_problem *p, mr_moe_weights *w);

/* ---- the expert-parallel transport seam ----
 * A transport moves the prepared rows of one layer call from their origin
 * to the peers that own their experts (dispatch) and the fp32 result rows
 * back (combine). Every peer calls both in every layer, in the same order
 * (an idle peer sends and receives empty sets). `none` is the identity (one
 * process); an MPI transport plugs in here.
 *
 * A row set: n rows, each made of up to MR_MOE_PLANES planes (the kernel
 * input, its per-block multipliers, its int8 block sums; what the runner's
 * prepare writes), plane i holding row r at base + r * row_bytes. A
 * plane's wire form tells a transport how its values may travel: as they
 * are, or, where the runner's carrier is wider than the values need, in
 * the narrower exact form (the receiver restores the same bytes). */
#define MR_MOE_PLANES 3
typedef enum {
    MR_WIRE_RAW = 0,         /* the bytes as they are */
    MR_WIRE_BF16_AS_E4M3 = 1 /* bf16 elements whose values are E4M3 values exactly: 1 byte each */
} mr_moe_wire;
typedef struct {
    int64_t n;
    int n_planes;
    struct {
        void *base;
        size_t row_bytes;
        mr_moe_wire wire;
    } plane[MR_MOE_PLANES];
} mr_moe_rowset;

typedef struct {
    /* origin: the rows of this call, grouped by destination peer in peer
     * order and, within a peer, by physical expert (the route phase's order) */
    int n_peers;
    const mr_moe_placement *place; /* the context's */
    int64_t T;                   /* this origin's tokens in the call */
    bool replicated;             /* every peer passes the same tokens (mr_moe_args.replicated) ... */
    int64_t T_total;             /* ... T_total of them, of which this origin's share is T */
    const int64_t *send_counts;  /* [n_peers] */
    const int32_t *send_expert;  /* [send.n] physical expert id of each row */
    const int32_t *send_slot;    /* [send.n] token * k + slot of each row, at the origin */
    mr_moe_rowset send;
    int64_t H;                   /* elements of a result row */
    /* expert side, set by dispatch: the rows this peer computes, grouped by
     * local expert; recv_offsets [n_local + 1] delimit each expert's rows */
    mr_moe_rowset recv;
    const int32_t *recv_offsets;
    float *y_recv;               /* [recv.n][H] the experts phase writes here */
    /* origin, set by combine: y_send [send.n][H], row i the result of send row i */
    float *y_send;
    /* set by each exchange: the bytes this peer sent to other peers in it */
    uint64_t bytes_sent;
    /* set by dispatch: the bytes of one row on the wire (0 for none) */
    size_t row_wire_bytes;
} mr_a2a_xfer;

typedef struct {
    mr_a2a id;
    const char *name;
    /* Opens the transport of one context: the problem (experts, placement,
     * peers), up to max_rows rows per call from this origin, and the row
     * set shape the runner prepares (plane row bytes). *state is the
     * transport's own. */
    mr_status (*open)(const mr_moe_problem *p, int64_t max_rows, const mr_moe_rowset *shape, void **state);
    void (*close)(void *state);
    /* dispatch: x->send* (and the origin's buffers) in; x->recv, recv_offsets, y_recv out */
    mr_status (*dispatch)(void *state, mr_a2a_xfer *x);
    /* combine: x->y_recv (written by the experts) in; x->y_send out */
    mr_status (*combine)(void *state, mr_a2a_xfer *x);
    /* replicated calls (x->replicated): out [x->T total tokens][row_bytes]
     * holds this peer's share of the rows (mr_moe_share); afterwards every
     * peer's. NULL for a transport of one process. */
    mr_status (*gather)(void *state, mr_a2a_xfer *x, void *out, int64_t T, size_t row_bytes);
} mr_a2a_ops;

/* The share of T replicated tokens that peer r of R is the origin of:
 * tokens [*first, *first + *n), r*T/R rounded down. */
void mr_moe_share(int64_t T, int R, int r, int64_t *first, int64_t *n);

/* The transport of an id, NULL when this build has none. */
const mr_a2a_ops *mr_a2a_ops_get(mr_a2a id);
/* Test only: puts ops in the table for id (NULL removes it); returns the
 * previous entry. Not thread-safe; call before contexts are made. */
const mr_a2a_ops *mr_a2a_debug_set(mr_a2a id, const mr_a2a_ops *ops);

/* ---- the expert-parallel process group ----
 * The processes of one expert-parallel run: MPI_COMM_WORLD under mpirun (or
 * any MPI launcher) in a build with MPI (mr_ep_built), else this process
 * alone. mr_ep_init starts MPI with errors returned as statuses, not
 * aborts: MPI_THREAD_FUNNELED (only the thread that called it exchanges;
 * OpenMP threads compute inside each rank), or MPI_THREAD_SERIALIZED for a
 * program whose exchanges move to another thread while it runs (the
 * server's engine thread), one thread at a time.
 *
 * Every exchange (the mpi transport's, and these) is a nonblocking MPI
 * collective polled against a deadline: a peer that died or stopped
 * answering becomes MR_EPEER on every rank that waits for it, within the
 * deadline, never a hang. The step deadline (mr_ep_set_timeout) is fixed,
 * or automatic: 5 s beyond twice the slowest step seen (a step: what this
 * rank did between two exchanges, its waiting included), and at least 5 s
 * beyond twice this rank's work since its last exchange. After a failed
 * exchange the group is broken: every later exchange fails at once with
 * the first error (a collective cannot be taken back), and the process
 * should exit without mr_ep_finalize; the launcher then ends the others. */
bool mr_ep_built(void);             /* this build has the MPI transport */
/* Starts MPI once (later calls: MR_OK). Not built: MR_EUNSUPPORTED. */
mr_status mr_ep_init(bool serialized);
bool mr_ep_active(void);            /* mr_ep_init succeeded */
int mr_ep_rank(void);               /* 0 when not active */
int mr_ep_size(void);               /* 1 when not active */
const char *mr_ep_library(void);    /* "Open MPI v4.1.4, ..." or "" */
/* The step deadline in seconds, 0 = automatic (the default). */
void mr_ep_set_timeout(double seconds);
double mr_ep_timeout(void);
/* The broken state: the first failed exchange's message, or NULL. */
const char *mr_ep_broken(void);
/* Breaks the group from above: its user found that the ranks no longer
 * agree on what comes next (a malformed step). Returns MR_EPEER with the
 * message (printf-style), which later exchanges repeat. */
mr_status mr_ep_fail(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
/* Exchanges outside the MoE layer, with an explicit deadline (seconds; 0 =
 * the step deadline): every rank passes the same bytes and root. */
mr_status mr_ep_bcast(void *buf, size_t bytes, int root, double timeout_s);
/* all [mr_ep_size()][bytes] = every rank's mine, in rank order. */
mr_status mr_ep_allgather(const void *mine, void *all, size_t bytes, double timeout_s);
mr_status mr_ep_barrier(double timeout_s);
/* Waits in a barrier without holding a core (polls every millisecond):
 * for ranks idle while another works alone (a benchmark's single-process
 * comparison). */
mr_status mr_ep_barrier_idle(double timeout_s);
/* The benchmark's ceiling: MPI_Alltoallv alone with this rank sending
 * send_bytes[r] bytes to rank r (the others pass theirs), iters timed calls
 * after a warm-up, each after a barrier. *median_s: the median call;
 * *bytes_out: the bytes this rank sent to other ranks in one call. */
mr_status mr_ep_probe_alltoallv(const int64_t *send_bytes, int iters, double *median_s, uint64_t *bytes_out);
/* Ends MPI when the group is healthy (a barrier with the step deadline,
 * then MPI_Finalize); a broken group is left as is (MR_EPEER). */
mr_status mr_ep_finalize(void);

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
