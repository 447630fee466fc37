/* runner_routed.h — private to the `routed` runner (runner_routed.c,
 * expert_packed.c): its state, which nothing else reads. */
#ifndef MR_MOE_RUNNER_ROUTED_H
#define MR_MOE_RUNNER_ROUTED_H

#include <stdatomic.h>

#include "moe/moe_internal.h"

/* the row stride of the widened x (mr_uk_act.xw) for rows of ld values: 16 floats (64 bytes)
 * past it, so that rows ld = H or I (multiples of 1024) apart do not all fall on one L1 set */
#define MR__XW_LD(ld) ((ld) + 16)
/* the floats of the fixed-point x of MR_UK_MT rows of ld values (mr_uk_act.xq: the high
 * parts, int16 rows of ld, the low parts alike, then the rows' ld / 16 block multipliers) */
#define MR__XQ_FLOATS(ld) ((size_t)MR_UK_MT * (size_t)(ld) + (size_t)MR_UK_MT * (size_t)(ld) / 16)

typedef struct {
    mr_uk_kind kind;        /* the micro-kernel kind of the mode */
    int es, blk;            /* kernel input element size, per-block multiplier width (0 none) */
    bool use_xs;            /* the kernels take the per-block multipliers */
    int xs_group;           /* w4a8: one multiplier per 128 columns, replicated per 16 */
    bool widen;             /* the gemm kernels take x widened to fp32 (mr_kernels.uk_gemm_xw[kind]) */
    bool fixq;              /* the gemv takes x as fixed point (mr_kernels.uk_gemv_xq[kind]) */
    bool xd;                /* the gemv and gemm take x * 2^112 (mr_kernels.uk_xd[kind]) */
    /* GEMM1 input rows (the context's row planes): x [ld1] elements, xs [nxs1], xb [nxb1] */
    int64_t ld1, nxs1, nxb1;
    /* GEMM2 input rows, [max_recv] each: x2 [ld2] elements, xs2 [nxs2], xb2 [nxb2] */
    int64_t ld2, nxs2, nxb2;
    void *x2;
    float *xs2;
    int32_t *xb2;
    int32_t *act;           /* [n_local] the local experts with rows in this call */
    /* per thread: gate, up [128][128], y [128][128], a row of max(H, Ip), the
     * multipliers of a row the kernels do not take, kernel scratch, where
     * widen or xd is set 128 rows of max(ld1, ld2) fp32 for the widened x (or x * 2^112),
     * and where fixq is set MR_UK_MT rows of fixed-point x and their block multipliers
     * (MR__XQ_FLOATS) */
    float *tmp;
    int64_t tmp_stride;
    /* per thread, the [front, back) of its chunk range in GEMM1 and in GEMM2,
     * one cache line apart */
    _Atomic uint64_t *ranges; /* [2][n_threads][MR__MOE_RSTRIDE] */
} mr__routed_state;

/* The packed compute (expert_packed.c): prepare writes the context's rows,
 * experts computes the received rows. */
void mr__routed_prepare(mr_moe_ctx *c, const mr_moe_weights *w, const mr_moe_args *a, const float *wts);
mr_status mr__routed_experts(mr_moe_ctx *c, const mr_moe_weights *w, const mr_a2a_xfer *x);

#endif
