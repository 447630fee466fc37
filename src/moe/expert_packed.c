/* expert_packed.c — the expert compute of `routed` on packed weights (the
 * 16-row tile layouts of moerun/kernels.h, gate/up tiles interleaved):
 *  1. rows grouped by expert (mr_permutation_build); each token's input is
 *     prepared once in the mode's kernel form (actmode.c) and copied to its
 *     k slots;
 *  2. GEMM1: one flat task list of (expert, 128 columns of I = 8 gate/up tile
 *     pairs, one contiguous run of weights) over all threads; gate and up
 *     tiles through the micro-kernel, SiLU*up in the epilogue, h prepared for
 *     GEMM2 (the task owns whole 128-column groups, as the modes need);
 *  3. GEMM2: one flat task list of (expert, 64 rows of H = 4 tiles); the
 *     routing weight applied as the down projection is stored per slot;
 *  4. a deterministic reduction over each token's k slots, in selection
 *     order, into the caller's buffer in the activation dtype.
 * Few tokens on an expert take the gemv micro-kernel (weights streamed once
 * per 8 tokens), many take the gemm one (a block decoded once into L1 for
 * all tokens): kern->uk_gemm_min_m decides. Tokens are processed in chunks
 * of up to 128 per expert. Nothing is allocated here. */
#include <string.h>

#include "moe/moe_internal.h"

enum { CB1 = 128, CB2 = 64, MCH = 128, T = MR_PACK_TILE };

static inline void *row_at(void *base, int64_t row, int64_t ld, int es) {
    return (char *)base + ((size_t)row * (size_t)ld + 0) * (size_t)es;
}

mr_status mr__moe_experts_run_packed(mr_moe_ctx *c, const mr_moe_args *a, const int32_t *ids, const float *wts) {
    const mr_moe_problem *p = &c->p;
    const int k = p->top_k, E = p->n_experts;
    const int64_t H = p->hidden, I = p->inter, Tn = a->T;
    const mr_act_mode mode = p->act_mode;
    const mr_uk_kind kind = mr__act_uk_kind(mode);
    const int es = mr__act_uk_esize(mode), blk = mr__act_uk_block(mode);
    const bool woi = mr_routing_weight_on_input(p->routing);
    const bool xbf = p->act_dtype == MR_FMT_BF16;
    const mr_kernels *K = c->kern;
    MR_ASSERT(c->layout.pack != MR_PACK_NONE && c->w->p13 && c->w->p2);

    mr_permutation perm = {c->counts, c->offsets, c->slot_of, c->token_of};
    mr_status st = mr_permutation_build(ids, Tn, k, E, &perm);
    if (st) return st;

    /* flat task lists over the active experts */
    const int64_t nb1 = (I + CB1 - 1) / CB1, nb2 = (H + CB2 - 1) / CB2;
    int32_t *act = c->tasks; /* active experts first, then nothing else is needed: tasks are (i_active, block) */
    int64_t n_act = 0;
    for (int e = 0; e < E; e++)
        if (c->counts[e]) act[n_act++] = e;
    const float post1 = mode == MR_ACT_W4A4 ? c->s13 : 1.0f, post2 = mode == MR_ACT_W4A4 ? c->s2 : 1.0f;
    /* the multiplier and bias arrays are given to the kernels only where the mode has them */
    const bool use_xs = blk != 0 && (mode == MR_ACT_W8A8 || kind == MR_UK_NVFP4_I8);

#pragma omp parallel
    {
        float *tmp = c->tmp + (size_t)c->tmp_stride * (size_t)omp_get_thread_num();
        float *gb = tmp, *ub = gb + MCH * CB1, *yb = ub + MCH * CB1, *row = yb + MCH * CB2;
        void *scratch = (void *)(((uintptr_t)(row + (H > c->layout.inter_padded ? H : c->layout.inter_padded) + 16) + 63) &
                                 ~(uintptr_t)63);

        /* 1. GEMM1 input, once per token, copied to its k slots (expert-sorted order) */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < Tn; t++) {
            for (int j = 0; j < k; j++) {
                if (j > 0 && !woi) {
                    const int64_t s0 = c->slot_of[t * k], s = c->slot_of[t * k + j];
                    memcpy(row_at(c->x1, s, c->ld1, es), row_at(c->x1, s0, c->ld1, es), (size_t)H * (size_t)es);
                    memcpy(c->xs1 + s * c->nxs1, c->xs1 + s0 * c->nxs1, (size_t)c->nxs1 * 4);
                    if (kind == MR_UK_NVFP4_I8) memcpy(c->xb1 + s * (c->ld1 / 16 + 1), c->xb1 + s0 * (c->ld1 / 16 + 1), (size_t)(H / 16) * 4);
                    continue;
                }
                const int64_t s = c->slot_of[t * k + j];
                const float wt = woi ? wts[t * k + j] : 1.0f;
                for (int64_t i = 0; i < H; i++) {
                    float v = xbf ? mr_bf16_to_f32(((const uint16_t *)a->x)[t * H + i]) : ((const float *)a->x)[t * H + i];
                    row[i] = woi ? v * wt : v;
                }
                mr__act_prepare_uk_row(mode, row, H, c->s13, row_at(c->x1, s, c->ld1, es), c->xs1 + s * c->nxs1,
                                       c->xb1 + s * (c->ld1 / 16 + 1));
            }
        }

        /* 2. GEMM1: gate and up tiles together, SiLU*up, h prepared for GEMM2 */
#pragma omp for schedule(dynamic, 1)
        for (int64_t ti = 0; ti < n_act * nb1; ti++) {
            const int e = act[ti / nb1];
            const int64_t c0 = (ti % nb1) * CB1, cn = I - c0 < CB1 ? I - c0 : CB1, npair = (cn + T - 1) / T;
            const mr_pmatrix *W = &c->w->p13[e];
            for (int64_t m0 = 0; m0 < c->counts[e]; m0 += MCH) {
                const int64_t mm = c->counts[e] - m0 < MCH ? c->counts[e] - m0 : MCH, s0 = c->offsets[e] + m0;
                const mr_uk_fn fn = mm >= K->uk_gemm_min_m ? K->uk_gemm[kind].fn : K->uk_gemv[kind].fn;
                const mr_uk_act in = {.x = row_at(c->x1, s0, c->ld1, es), .ldx = c->ld1,
                                      .xs = use_xs ? c->xs1 + s0 * c->nxs1 : NULL, .ldxs = c->nxs1,
                                      .xb = c->xb1 + s0 * (c->ld1 / 16 + 1), .ldb = c->ld1 / 16 + 1, .post = post1};
                for (int64_t i = 0; i < npair; i++) {
                    const int64_t tile = 2 * (c0 / T + i);
                    fn(W, tile, &in, mm, gb + i * T, CB1, scratch);
                    fn(W, tile + 1, &in, mm, ub + i * T, CB1, scratch);
                }
                for (int64_t m = 0; m < mm; m++) {
                    for (int64_t i = 0; i < cn; i++) row[i] = mr__silu(gb[m * CB1 + i]) * ub[m * CB1 + i];
                    const int64_t s = s0 + m;
                    mr__act_prepare_uk_row(mode, row, cn, c->s2, (char *)row_at(c->x2, s, c->ld2, es) + (size_t)c0 * (size_t)es,
                                           c->xs2 + s * c->nxs2 + (blk == 16 ? c0 / 16 : c0 / 128),
                                           c->xb2 + s * (c->ld2 / 16 + 1) + c0 / 16);
                }
            }
        }

        /* 3. GEMM2: the routing weight applied at the store */
#pragma omp for schedule(dynamic, 1)
        for (int64_t ti = 0; ti < n_act * nb2; ti++) {
            const int e = act[ti / nb2];
            const int64_t n0 = (ti % nb2) * CB2, nr = H - n0 < CB2 ? H - n0 : CB2, nt = (nr + T - 1) / T;
            const mr_pmatrix *W = &c->w->p2[e];
            for (int64_t m0 = 0; m0 < c->counts[e]; m0 += MCH) {
                const int64_t mm = c->counts[e] - m0 < MCH ? c->counts[e] - m0 : MCH, s0 = c->offsets[e] + m0;
                const mr_uk_fn fn = mm >= K->uk_gemm_min_m ? K->uk_gemm[kind].fn : K->uk_gemv[kind].fn;
                const mr_uk_act in = {.x = row_at(c->x2, s0, c->ld2, es), .ldx = c->ld2,
                                      .xs = use_xs ? c->xs2 + s0 * c->nxs2 : NULL, .ldxs = c->nxs2,
                                      .xb = c->xb2 + s0 * (c->ld2 / 16 + 1), .ldb = c->ld2 / 16 + 1, .post = post2};
                for (int64_t i = 0; i < nt; i++) fn(W, n0 / T + i, &in, mm, yb + i * T, CB2, scratch);
                for (int64_t m = 0; m < mm; m++) {
                    const float wt = woi ? 1.0f : wts[c->token_of[s0 + m]];
                    float *dst = c->yslot + (size_t)(s0 + m) * (size_t)H + (size_t)n0;
                    for (int64_t j = 0; j < nr; j++) dst[j] = wt * yb[m * CB2 + j];
                }
            }
        }

        /* 4. each token's k slots in selection order, stored in the activation dtype */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < Tn; t++) {
            for (int64_t n = 0; n < H; n++) row[n] = 0.0f;
            for (int j = 0; j < k; j++) {
                const float *y = c->yslot + (size_t)c->slot_of[t * k + j] * (size_t)H;
                for (int64_t n = 0; n < H; n++) row[n] += y[n];
            }
            if (xbf)
                for (int64_t n = 0; n < H; n++) ((uint16_t *)a->out)[t * H + n] = mr_f32_to_bf16(row[n]);
            else
                memcpy((float *)a->out + t * H, row, (size_t)H * sizeof(float));
        }
    }
    return MR_OK;
}
