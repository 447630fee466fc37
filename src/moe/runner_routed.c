/* runner_routed.c — the `routed` runner: takes precomputed (ids, weights),
 * so any routing method works and it can sit behind an a2a transport. Its
 * after-load packs every expert into the 16-row tile layout of its packed
 * micro-kernels, gate and up tiles interleaved (registry.c routed_layout);
 * its state (runner_routed.h) holds the GEMM2 inputs, the chunk ranges and
 * the per-thread scratch. Compute: expert_packed.c. */
#include "moe/runner_routed.h"

static mr_status routed_after_load(const mr_moe_runner *self, const mr_moe_problem *p, mr_moe_weights *w) {
    mr_moe_layout L;
    self->required_layout(p, &L);
    /* test-only mutation: up where gate belongs (the matrix must catch it) */
    return mr__moe_pack(w, &L, (mr__moe_mutation & MR_MUT_SWAP_GATE_UP) != 0);
}

static mr_probe_instr routed_instr(const mr_moe_problem *p) { return mr_uk_instr(mr__act_uk_kind(p->act_mode)); }

static mr_status routed_ctx_new(mr_moe_ctx *c) {
    const mr_moe_problem *p = &c->p;
    const mr_act_mode m = p->act_mode;
    mr_status st = MR_OK;
    mr__routed_state *s = mr__moe_ws_alloc(c, 1, sizeof *s, &st);
    if (st) return st;
    c->rs = s;
    s->kind = mr__act_uk_kind(m);
    s->es = mr__act_uk_esize(m);
    s->blk = mr__act_uk_block(m);
    s->use_xs = s->blk != 0 && (m == MR_ACT_W8A8 || s->kind == MR_UK_NVFP4_I8);
    s->xs_group = m == MR_ACT_W4A8 ? 8 : 1;
    /* rows padded to the pack's k unit; their padding stays zero (the workspace is zeroed) */
    const int64_t unit = p->weight_format == MR_FMT_FP8_BLOCK ? 128 : p->weight_format == MR_FMT_NVFP4 ? 16 : 2;
    const int64_t Ip = c->layout.inter_padded, H = p->hidden;
    s->ld1 = (H + unit - 1) / unit * unit;
    s->ld2 = (Ip + unit - 1) / unit * unit;
    /* per-block multipliers: per 16 (nvfp4) or per 128 (at least one per 128 for the generic preparation) */
    s->nxs1 = s->blk == 16 ? s->ld1 / 16 : (s->ld1 + 127) / 128;
    s->nxs2 = s->blk == 16 ? s->ld2 / 16 : (s->ld2 + 127) / 128;
    s->nxb1 = s->ld1 / 16 + 1;
    s->nxb2 = s->ld2 / 16 + 1;
    /* the rows the transport carries: the input, and the multipliers and int8 sums where the kernels take them */
    c->rows.n_planes = 1;
    c->rows.plane[0].row_bytes = (size_t)s->ld1 * (size_t)s->es;
    /* w8a8's bf16 kernel input holds E4M3 values: a transport may send them as 1 byte each */
    c->rows.plane[0].wire = m == MR_ACT_W8A8 ? MR_WIRE_BF16_AS_E4M3 : MR_WIRE_RAW;
    if (s->use_xs) c->rows.plane[c->rows.n_planes++].row_bytes = (size_t)s->nxs1 * 4;
    if (s->kind == MR_UK_NVFP4_I8) c->rows.plane[c->rows.n_planes++].row_bytes = (size_t)s->nxb1 * 4;
    const size_t R = (size_t)c->max_recv;
    s->x2 = mr__moe_ws_alloc(c, R, (size_t)s->ld2 * (size_t)s->es, &st);
    s->xs2 = mr__moe_ws_alloc(c, R, (size_t)s->nxs2 * 4, &st);
    if (s->kind == MR_UK_NVFP4_I8) s->xb2 = mr__moe_ws_alloc(c, R, (size_t)s->nxb2 * 4, &st);
    s->act = mr__moe_ws_alloc(c, (size_t)c->n_local, 4, &st);
    const size_t big = (size_t)(H > Ip ? H : Ip);
    /* the fp32-FMA gemm kernels take x widened to fp32 once per expert chunk (expert_packed.c);
     * only the bf16-input kinds set it (test_packed_kernels_all_tables checks every table) */
    s->widen = c->kern->uk_gemm_xw[s->kind];
    /* the fp8 kernels on AVX2 take x * 2^112 once per expert chunk, in the same buffer */
    s->xd = c->kern->uk_xd[s->kind];
    const size_t nxw =
        s->widen || s->xd ? (size_t)128 * (size_t)MR__XW_LD(s->ld1 > s->ld2 ? s->ld1 : s->ld2) + 16 : 0;
    /* the gemv kernels that take x as 16-bit fixed point get it once per expert chunk too */
    s->fixq = c->kern->uk_gemv_xq[s->kind];
    const size_t nxq = s->fixq ? MR__XQ_FLOATS(s->ld1 > s->ld2 ? s->ld1 : s->ld2) + 16 : 0;
    s->tmp_stride = (int64_t)((128 * 128 * 2 + 128 * MR__MOE_CB2 + big + 64 + (size_t)s->nxs1 + (size_t)s->nxs2 +
                               MR_UK_SCRATCH / 4 + 32 + nxw + nxq + 15) /
                              16 * 16);
    s->tmp = mr__moe_ws_alloc(c, (size_t)c->n_threads, (size_t)s->tmp_stride * 4, &st);
    s->ranges = mr__moe_ws_alloc(c, (size_t)c->n_threads * 2, MR__MOE_RSTRIDE * sizeof(uint64_t), &st);
    return st;
}

const struct mr_moe_runner_ops mr__moe_ops_routed = {.after_load = routed_after_load,
                                                     .instr = routed_instr,
                                                     .ctx_new = routed_ctx_new,
                                                     .prepare = mr__routed_prepare,
                                                     .experts = mr__routed_experts};
