/* moe_internal.h — private to src/moe: the runner ops (each runner's state
 * and phases), the context every runner shares (the route, rows and
 * transport of one model, one workspace), the activation preparation of the
 * modes and the test-only mutation switch. A runner's own state lives in
 * c->rs, a struct defined in that runner's files only. */
#ifndef MR_MOE_INTERNAL_H
#define MR_MOE_INTERNAL_H

#include "base/steal.h"
#include "moerun/kernels.h"
#include "moerun/moe.h"
#include <omp.h>
static inline int omp_get_thread_num_safe(void) { return omp_get_thread_num(); }

/* What a runner implements. The phases are called by mr_moe_run
 * (layer.c) in this order: route (runners that route themselves) ->
 * prepare -> [dispatch] -> experts -> [combine] -> finalize. */
struct mr_moe_runner_ops {
    /* After-load: converts w (HF layout) into self->required_layout(p) in place. */
    mr_status (*after_load)(const mr_moe_runner *self, const mr_moe_problem *p, mr_moe_weights *w);
    /* The instruction of its inner loop on p (NULL: FMA). */
    mr_probe_instr (*instr)(const mr_moe_problem *p);
    /* Releases w->runner_data (NULL: the runner never sets it). */
    void (*weights_release)(mr_moe_weights *w);
    /* The runner's state for context c: sets c->rs (allocated with
     * mr__moe_ws_alloc, so that it counts as workspace and is freed with
     * the context) and the shape of its prepared rows (c->rows: planes and
     * row bytes; the context allocates them). */
    mr_status (*ctx_new)(mr_moe_ctx *c);
    /* Frees what ctx_new made outside the workspace (NULL: nothing). */
    void (*ctx_free)(mr_moe_ctx *c);
    /* route, for runners that route themselves: a->logits -> c->ids, c->wts. */
    mr_status (*route)(mr_moe_ctx *c, const mr_moe_args *a);
    /* prepare: token t's activation (a->x), for each slot j, into row
     * c->slot_of[t*k + j] of c->rows (wts: the routing weights, for methods
     * that weight the input). Never fails. */
    void (*prepare)(mr_moe_ctx *c, const mr_moe_weights *w, const mr_moe_args *a, const float *wts);
    /* experts: every row of x->recv, expert by expert (x->recv_offsets over
     * the local experts), into x->y_recv [rows][H] fp32, unit weights. */
    mr_status (*experts)(mr_moe_ctx *c, const mr_moe_weights *w, const mr_a2a_xfer *x);
};

extern const struct mr_moe_runner_ops mr__moe_ops_reference;
extern const struct mr_moe_runner_ops mr__moe_ops_routed;
extern const struct mr_moe_runner_ops mr__moe_ops_fused;

/* The mpi transport of this build (a2a_mpi.c), or NULL (a2a_nompi.c). */
const mr_a2a_ops *mr__a2a_mpi_ops(void);

extern unsigned mr__moe_mutation;
#define MR_MOE_FUSED_MAX_K 32
#define MR__MOE_MAX_BUFS 40

/* The context of one model: problem, layout, the route phase's buffers,
 * the prepared rows and results, the transport, the runner's state and
 * per-thread scratch, all sized for max_T tokens once (the per-call path
 * never allocates) and shared by every layer. */
struct mr_moe_ctx {
    const mr_moe_runner *runner;
    mr_moe_problem p;
    int local_first, n_local; /* the experts this process computes */
    mr_moe_layout layout;     /* required_layout(p), checked against w->layout at dispatch */
    int64_t max_T;
    int64_t max_rows;         /* max_T * k: rows one call sends */
    int64_t max_recv;         /* rows the experts phase may receive in one call */
    const mr_kernels *kern;
    int n_threads;
    /* route: the selection (when routed here) and the rows' order */
    int32_t *ids;             /* [max_T][k] */
    float *wts;               /* [max_T][k] */
    int32_t *counts, *offsets;          /* [E], [E+1] rows per expert, prefix sums */
    int32_t *slot_of, *token_of;        /* [max_rows]: row of (t, j); (t*k + j) of a row */
    int32_t *pids;                      /* [max_rows] physical expert of each (t, j) of the origin's share */
    int32_t *row_expert;                /* [max_rows] physical expert of each row */
    int64_t *peer_counts;               /* [ep_size] rows per destination peer */
    /* placement: logical -> physical -> peer (the arrays below, in the workspace) */
    mr_moe_placement place;
    int32_t *place_phys_of, *place_logical_of, *place_peer_of, *place_peer_first;
    /* prepared rows (origin) and their results */
    mr_moe_rowset rows;       /* max_rows rows; planes shaped by the runner's ctx_new */
    float *y;                 /* [max_rows][H] results of the rows, unit weights (origin) */
    /* transport */
    const mr_a2a_ops *a2a;
    void *a2a_state;
    mr_a2a_xfer xfer;
    mr_a2a_stats a2a_stats;
    int64_t *recv_per_expert; /* [n_local] (a2a_stats.recv_per_expert) */
    /* the runner's own state (its struct, its files) */
    void *rs;
    /* per thread scratch of prepare and finalize: tmp_stride floats each */
    float *tmp;
    int64_t tmp_stride;
    /* workspace: every buffer above, freed with the context */
    void *bufs[MR__MOE_MAX_BUFS];
    int n_bufs;
    size_t ws_bytes;
    /* phase profile (mr_moe_ctx_profile) and the stream-only isolation switch */
    mr_moe_profile prof;
    bool stream_only;
};
#define MR__MOE_RSTRIDE MR__STEAL_STRIDE /* uint64 per range slot (base/steal.h) */
#define MR__MOE_CB2 128   /* GEMM2 chunk: rows of H (8 tiles) */

/* n elements of sz bytes of workspace (64-byte aligned, zeroed,
 * overflow-checked), counted in c->ws_bytes and freed with c. On failure
 * returns NULL and sets *st (a set *st makes it return NULL at once). */
void *mr__moe_ws_alloc(mr_moe_ctx *c, size_t n, size_t sz, mr_status *st);
/* Threads of the context's parallel regions. */
static inline int mr__moe_threads(const mr_moe_ctx *c) {
    const int m = omp_get_max_threads();
    return m < c->n_threads ? m : c->n_threads;
}
/* Rows x elements below which prepare and finalize run on the calling
 * thread: at decode sizes (T = 1: k rows of H) a parallel region costs more
 * than the work. */
#define MR__MOE_PAR_MIN 65536
/* Token t's activation as fp32 (row: [H] scratch, returned when it is
 * used), weighted by wt when the routing weights the input. */
const float *mr__moe_token_row(const mr_moe_ctx *c, const mr_moe_args *a, int64_t t, float wt, float *row);
/* The local expert whose rows [off[e], off[e+1]) hold row r (n_local experts). */
int mr__moe_expert_of_row(const int32_t *off, int n_local, int64_t r);

/* After-load helper (weights.c): packs w1/w3 into p13 (tiles of gate and up
 * interleaved; swap: up first, mutation test only) and w2 into p2 with
 * L->pack, frees the HF copies, records L. */
mr_status mr__moe_pack(mr_moe_weights *w, const mr_moe_layout *L, bool swap);
/* After-load helper (weights.c): merges w1/w3 into w13 in layout L (CONCAT or
 * INTERLEAVED, padded to L->inter_padded), frees the HF copies. swap puts up
 * where gate belongs (mutation test only). */
mr_status mr__moe_merge_gateup(mr_moe_weights *w, const mr_moe_layout *L, bool swap);
/* W4A4 global input scales of a set: w->in_scale13/in_scale2 when set,
 * else the max over the set's experts of gate/up (s13) and down (s2). */
void mr__moe_w4a4_scales(const mr_moe_weights *w, float *s13, float *s2);
/* Layout equality (what dispatch checks). */
bool mr__moe_layout_equal(const mr_moe_layout *a, const mr_moe_layout *b);

/* Activation preparation for a mode (actmode.c). Quantizes/rounds n values of
 * one row into the kernel input: dst is fp32 or bf16 per mr__act_kernel_dtype;
 * scales [ceil(n/128)] receives per-128-group scales (1 where unused).
 * post receives the factor to apply to the dot product (w4a4: input_scale). */
mr_format mr__act_kernel_dtype(mr_act_mode m);
void mr__act_prepare_row(mr_act_mode m, const float *x, int64_t n, float input_scale, void *dst, float *scales);
/* Packed-kernel form of the same values (actmode.c): the kernel kind of a
 * mode, the element size of its input (4 f32, 2 bf16, 1 int8), its
 * per-block multiplier width (128, 16 or 0 = none), and one row: dst [n]
 * elements, xs [ceil(n/block)] (ceil(n/128) for modes without a block; must
 * not be NULL), xb [n/16] for the int8 modes. */
mr_uk_kind mr__act_uk_kind(mr_act_mode m);
int mr__act_uk_esize(mr_act_mode m);
int mr__act_uk_block(mr_act_mode m);
void mr__act_prepare_uk_row(mr_act_mode m, const float *x, int64_t n, float input_scale, void *dst, float *xs,
                            int32_t *xb);
/* AVX-512 forms of the packed-path preparation (actq_avx512.c), bit-identical
 * to the scalar ones; called by mr__act_prepare_uk_row when the CPU has
 * AVX-512 F/BW/VL. bf16: dst = mr_f32_to_bf16(x); fp8 (w8a8): dst = bf16 of
 * the E4M3 values, scales per 128; w4a4 / w4a8: int8, xs and xb per 16. */
void mr__actq_bf16_avx512(const float *x, int64_t n, uint16_t *dst);
void mr__actq_fp8_avx512(const float *x, int64_t n, uint16_t *dst, float *scales);
void mr__actq_w4a4_avx512(const float *x, int64_t n, float input_scale, int8_t *dst, float *xs, int32_t *xb);
void mr__actq_w4a8_avx512(const float *x, int64_t n, int8_t *dst, float *xs, int32_t *xb);
/* The same four in AVX2 + FMA (actq_avx2.c), bit-identical too; called when
 * the CPU has those but not AVX-512 F/BW/VL. */
void mr__actq_bf16_avx2(const float *x, int64_t n, uint16_t *dst);
void mr__actq_fp8_avx2(const float *x, int64_t n, uint16_t *dst, float *scales);
void mr__actq_w4a4_avx2(const float *x, int64_t n, float input_scale, int8_t *dst, float *xs, int32_t *xb);
void mr__actq_w4a8_avx2(const float *x, int64_t n, int8_t *dst, float *xs, int32_t *xb);

/* The value each prepared element stands for (x ≈ value): fp32 [n]. */
void mr__act_effective_row(mr_act_mode m, const float *x, int64_t n, float input_scale, float *dst);

float mr__silu(float x);

#endif
