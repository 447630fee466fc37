/* moe_internal.h — private to src/moe: the runner ops, the context layout,
 * the shared expert compute core and the mutation switch. */
#ifndef MR_MOE_INTERNAL_H
#define MR_MOE_INTERNAL_H

#include "moerun/kernels.h"
#include "moerun/moe.h"
#include <omp.h>
static inline int omp_get_thread_num_safe(void) { return omp_get_thread_num(); }

extern const struct mr_moe_runner_ops mr__moe_ops_reference;
extern const struct mr_moe_runner_ops mr__moe_ops_routed;
extern const struct mr_moe_runner_ops mr__moe_ops_fused;

extern unsigned mr__moe_mutation;
#define MR_MOE_FUSED_MAX_K 32

/* Context: problem, borrowed weights, the runner, and a workspace sized for
 * max_T tokens at setup (the per-call path never allocates). */
struct mr_moe_ctx {
    const mr_moe_runner *runner;
    mr_moe_problem p;
    mr_moe_weights *w;
    mr_moe_layout layout; /* required_layout(p), checked against w->layout at dispatch */
    int64_t max_T;
    const mr_kernels *kern;
    /* permutation of T*k slots */
    int32_t *counts, *offsets, *slot_of, *token_of; /* [E], [E+1], [T*k], [T*k] */
    int32_t *ids;   /* [T][k] (fused: its own selection) */
    float *wts;     /* [T][k] */
    /* activations prepared for GEMM1 ([T or T*k][H]) and GEMM2 ([T*k][Ip]) */
    void *xq;       /* fp32 or bf16 rows, stride ldxq elements */
    float *xs;      /* [rows][ceil(H/128)] per-group activation scales (or NULL use) */
    void *hq;       /* [T*k][Ip] intermediate prepared for GEMM2 */
    float *hs;      /* [T*k][ceil(Ip/128)] */
    float *yslot;   /* [T*k][H] down-projection results per slot, fp32 */
    float *tmp;     /* per-thread scratch, tmp_stride floats each */
    int64_t tmp_stride;
    int n_threads;
    int32_t *tasks; /* flat task list: (expert << 16 | block), [E * max blocks] */
    float s13, s2;  /* W4A4 global input scales (0 otherwise) */
    /* packed path (layout.pack != 0; expert_packed.c): kernel inputs of
     * GEMM1 ([S][ld1] elements) and GEMM2 ([S][ld2]), per-block multipliers
     * ([S][nxs1], [S][nxs2]) and int8 bias sums ([S][ld1/16], [S][ld2/16]) */
    size_t ws_bytes; /* bytes of workspace allocated for this context */
    int64_t ld1, ld2, nxs1, nxs2;
    void *x1, *x2;
    float *xs1, *xs2;
    int32_t *xb1, *xb2;
    /* phase profile (mr_moe_ctx_profile) and the stream-only isolation switch */
    mr_moe_profile prof;
    bool stream_only;
    /* packed path scheduling: per thread, the [front, back) of its chunk
     * range in GEMM1 and in GEMM2, one cache line apart (expert_packed.c) */
    _Atomic uint64_t *ranges; /* [2][n_threads][MR__MOE_RSTRIDE] */
};
#define MR__MOE_RSTRIDE 8 /* uint64 per range slot: one 64-byte line */
#define MR__MOE_CB2 128   /* GEMM2 chunk: rows of H (8 tiles) */

/* The packed expert compute of `routed` (expert_packed.c). */
mr_status mr__moe_experts_run_packed(mr_moe_ctx *c, const mr_moe_args *a, const int32_t *ids, const float *wts);
/* After-load helper (weights.c): packs w1/w3 into p13 (tiles of gate and up
 * interleaved; swap: up first, mutation test only) and w2 into p2 with
 * L->pack, frees the HF copies, records L. */
mr_status mr__moe_pack(mr_moe_weights *w, const mr_moe_layout *L, bool swap);
/* Allocates the packed-path workspace of c (ctx.c helper). */
mr_status mr__moe_packed_ws(mr_moe_ctx *c);

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

/* The expert compute core shared by routed and fused (expert_core.c): uses
 * c->ids / c->wts for T tokens and writes a->out. */
mr_status mr__moe_experts_run(mr_moe_ctx *c, const mr_moe_args *a, const int32_t *ids, const float *wts);
/* Token t's output: the sum of its k slot rows of c->yslot in selection order
 * (fp32, row[H] as scratch), stored into a->out in the activation dtype. */
void mr__moe_reduce_token(const mr_moe_ctx *c, const mr_moe_args *a, int64_t t, float *row);

float mr__silu(float x);

/* After-load helper (weights.c): merges w1/w3 into w13 in layout L (CONCAT or
 * INTERLEAVED, padded to L->inter_padded), frees the HF copies. swap puts up
 * where gate belongs (mutation test only). */
mr_status mr__moe_merge_gateup(mr_moe_weights *w, const mr_moe_layout *L, bool swap);
/* W4A4 global input scales: max over experts of gate/up (s13) and down (s2). */
void mr__moe_w4a4_scales(const mr_moe_weights *w, float *s13, float *s2);
/* Layout equality (what dispatch checks). */
bool mr__moe_layout_equal(const mr_moe_layout *a, const mr_moe_layout *b);

#endif
