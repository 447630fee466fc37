/* expert_core.c — the SIMD expert compute shared by `routed` and `fused`:
 * rows grouped by expert (mr_permutation_build), activations prepared per
 * slot for the mode, then two flat task lists over both threads:
 *   GEMM1: (expert, 128 columns of I): gate and up rows together, SiLU*up in
 *          the epilogue, the result re-prepared for GEMM2 (per-128 groups
 *          stay inside one task);
 *   GEMM2: (expert, 64 rows of H): the routing weight applied as the down
 *          projection is stored per slot;
 * then a deterministic reduction over each token's k slots in selection
 * order into the caller's buffer, in the activation dtype.
 * Few tokens per expert is the GEMV case of the same driver (weights decoded
 * once, dotted with each row); many tokens are processed in chunks of 64 rows
 * per decoded weight group. Nothing is allocated here. */
#include <string.h>

#include "moe/moe_internal.h"

enum { CB1 = 128, CB2 = 64, MCH = 64 };

/* gate/up rows for columns [c0, c0+cn) of I, in the context's layout */
static void gateup_rows(const mr_moe_ctx *c, const mr_qmatrix *W13, int64_t c0, int64_t cn, mr_format kd,
                        const void *x, int64_t ldx, const float *xs, int64_t ldxs, int64_t M, float *g, float *u) {
    const mr_moe_layout *L = &c->layout;
    if (L->gateup == MR_GATEUP_CONCAT) {
        mr_gemm_rows(c->kern, W13, c0, cn, kd, x, ldx, xs, ldxs, M, g, CB1);
        mr_gemm_rows(c->kern, W13, L->inter_padded + c0, cn, kd, x, ldx, xs, ldxs, M, u, CB1);
        return;
    }
    MR_ASSERT(L->gateup == MR_GATEUP_INTERLEAVED);
    const int64_t R = L->interleave_rows;
    for (int64_t r0 = c0; r0 < c0 + cn; r0 += R) {
        int64_t rr = c0 + cn - r0 < R ? c0 + cn - r0 : R;
        int64_t base = (r0 / R) * 2 * R + r0 % R;
        mr_gemm_rows(c->kern, W13, base, rr, kd, x, ldx, xs, ldxs, M, g + (r0 - c0), CB1);
        mr_gemm_rows(c->kern, W13, base + R, rr, kd, x, ldx, xs, ldxs, M, u + (r0 - c0), CB1);
    }
}

void mr__moe_reduce_token(const mr_moe_ctx *c, const mr_moe_args *a, int64_t t, float *row) {
    const int k = c->p.top_k;
    const int64_t H = c->p.hidden;
    const float *y0 = c->yslot + (size_t)c->slot_of[t * k] * (size_t)H;
    for (int64_t n = 0; n < H; n++) row[n] = y0[n];
    for (int j = 1; j < k; j++) {
        const float *y = c->yslot + (size_t)c->slot_of[t * k + j] * (size_t)H;
        for (int64_t n = 0; n < H; n++) row[n] += y[n];
    }
    if (c->p.act_dtype == MR_FMT_BF16)
        for (int64_t n = 0; n < H; n++) ((uint16_t *)a->out)[t * H + n] = mr_f32_to_bf16(row[n]);
    else
        memcpy((float *)a->out + t * H, row, (size_t)H * sizeof(float));
}

mr_status mr__moe_experts_run(mr_moe_ctx *c, const mr_moe_args *a, const int32_t *ids, const float *wts) {
    const mr_moe_problem *p = &c->p;
    const int k = p->top_k, E = p->n_experts;
    const int64_t H = p->hidden, I = p->inter, Ip = c->layout.inter_padded, T = a->T, S = T * k;
    const int64_t GH = (H + 127) / 128, GI = (Ip + 127) / 128;
    const mr_act_mode mode = p->act_mode;
    const mr_format kd = mr__act_kernel_dtype(mode);
    const size_t esz = kd == MR_FMT_F32 ? 4 : 2;
    const bool woi = mr_routing_weight_on_input(p->routing);
    const bool xbf = p->act_dtype == MR_FMT_BF16;
    MR_ASSERT(c->layout.gateup != MR_GATEUP_SEPARATE);

    mr_permutation perm = {c->counts, c->offsets, c->slot_of, c->token_of};
    mr_status st = mr_permutation_build(ids, T, k, E, &perm);
    if (st) return st;

    /* flat task lists: GEMM1 blocks of 128 columns of I, GEMM2 blocks of 64 rows of H */
    const int64_t nb1 = (I + CB1 - 1) / CB1, nb2 = (H + CB2 - 1) / CB2;
    int64_t nt1 = 0;
    for (int e = 0; e < E; e++)
        if (c->counts[e])
            for (int64_t b = 0; b < nb1; b++) c->tasks[nt1++] = (int32_t)(e * nb1 + b);
    int64_t n_active = nt1 / (nb1 ? nb1 : 1);

#pragma omp parallel
    {
        float *tmp = c->tmp + (size_t)c->tmp_stride * (size_t)omp_get_thread_num();
        float *gb = tmp, *ub = gb + MCH * CB1, *yb = ub + MCH * CB1, *row = yb + MCH * CB2;

        /* 1. activations for GEMM1, one row per slot (expert-sorted order) */
#pragma omp for schedule(static)
        for (int64_t s = 0; s < S; s++) {
            const int32_t flat = c->token_of[s];
            const int64_t t = flat / k;
            for (int64_t i = 0; i < H; i++) {
                float v = xbf ? mr_bf16_to_f32(((const uint16_t *)a->x)[t * H + i]) : ((const float *)a->x)[t * H + i];
                row[i] = woi ? v * wts[flat] : v;
            }
            mr__act_prepare_row(mode, row, H, c->s13, (char *)c->xq + (size_t)s * (size_t)H * esz, c->xs + s * GH);
        }

        /* 2. GEMM1 + SiLU*up + preparation of h for GEMM2 */
#pragma omp for schedule(dynamic, 1)
        for (int64_t ti = 0; ti < nt1; ti++) {
            const int e = (int)(c->tasks[ti] / nb1);
            const int64_t c0 = (c->tasks[ti] % nb1) * CB1, cn = I - c0 < CB1 ? I - c0 : CB1;
            const mr_qmatrix *W13 = &c->w->w13[e];
            for (int64_t m0 = 0; m0 < c->counts[e]; m0 += MCH) {
                const int64_t mm = c->counts[e] - m0 < MCH ? c->counts[e] - m0 : MCH, s0 = c->offsets[e] + m0;
                gateup_rows(c, W13, c0, cn, kd, (const char *)c->xq + (size_t)s0 * (size_t)H * esz, H, c->xs + s0 * GH,
                            GH, mm, gb, ub);
                for (int64_t m = 0; m < mm; m++) {
                    for (int64_t i = 0; i < cn; i++) row[i] = mr__silu(gb[m * CB1 + i]) * ub[m * CB1 + i];
                    mr__act_prepare_row(mode, row, cn, c->s2, (char *)c->hq + ((size_t)(s0 + m) * (size_t)Ip + (size_t)c0) * esz,
                                        c->hs + (s0 + m) * GI + c0 / 128);
                }
            }
        }

        /* 3. GEMM2, the routing weight applied at the store */
#pragma omp for schedule(dynamic, 1)
        for (int64_t ti = 0; ti < n_active * nb2; ti++) {
            const int e = (int)(c->tasks[ti / nb2 * nb1] / nb1);
            const int64_t n0 = (ti % nb2) * CB2, nr = H - n0 < CB2 ? H - n0 : CB2;
            for (int64_t m0 = 0; m0 < c->counts[e]; m0 += MCH) {
                const int64_t mm = c->counts[e] - m0 < MCH ? c->counts[e] - m0 : MCH, s0 = c->offsets[e] + m0;
                mr_gemm_rows(c->kern, &c->w->w2[e], n0, nr, kd, (const char *)c->hq + (size_t)s0 * (size_t)Ip * esz, Ip,
                             c->hs + s0 * GI, GI, mm, yb, CB2);
                for (int64_t m = 0; m < mm; m++) {
                    const float wt = woi ? 1.0f : wts[c->token_of[s0 + m]];
                    float *dst = c->yslot + (size_t)(s0 + m) * (size_t)H + (size_t)n0;
                    for (int64_t j = 0; j < nr; j++) dst[j] = wt * yb[m * CB2 + j];
                }
            }
        }

        /* 4. reduce each token's k slots in selection order, store in the activation dtype */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; t++) mr__moe_reduce_token(c, a, t, row);
    }
    return MR_OK;
}
