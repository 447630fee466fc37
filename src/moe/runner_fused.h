/* runner_fused.h — private to the `fused` runner (runner_fused.c,
 * expert_core.c): its state, which nothing else reads. */
#ifndef MR_MOE_RUNNER_FUSED_H
#define MR_MOE_RUNNER_FUSED_H

#include "moe/moe_internal.h"

typedef struct {
    mr_format kd;       /* kernel input dtype of the mode (F32 or BF16) */
    size_t esz;         /* its element size */
    int64_t GH, GI;     /* 128-column groups of H and of the padded I */
    void *hq;           /* [max_recv][Ip] intermediate prepared for GEMM2 */
    float *hs;          /* [max_recv][GI] its per-group scales */
    int32_t *tasks;     /* flat task list: expert * blocks + block */
    float *tmp;         /* per thread: gate, up [64][128], y [64][64], a row of max(H, Ip) */
    int64_t tmp_stride;
} mr__fused_state;

/* The expert compute on merged gate/up rows (expert_core.c). */
void mr__fused_prepare(mr_moe_ctx *c, const mr_moe_weights *w, const mr_moe_args *a, const float *wts);
mr_status mr__fused_experts(mr_moe_ctx *c, const mr_moe_weights *w, const mr_a2a_xfer *x);

#endif
