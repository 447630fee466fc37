/* expert_core.c — the phases of `fused` on merged gate/up rows
 * (mr_gemm_rows over the row-major layouts): prepare writes each row's
 * activation for the mode (rows grouped by expert by the route phase), then
 * two flat task lists over the threads:
 *   GEMM1: (expert, 128 columns of I): gate and up rows together, SiLU*up in
 *          the epilogue, the result re-prepared for GEMM2 (per-128 groups
 *          stay inside one task);
 *   GEMM2: (expert, 64 rows of H): each row's down projection stored with
 *          unit weight (the layer's finalize applies the routing weight).
 * Few tokens per expert is the GEMV case of the same driver (weights decoded
 * once, dotted with each row); many tokens are processed in chunks of 64 rows
 * per decoded weight group. Nothing is allocated here. */
#include <string.h>

#include "moe/runner_fused.h"

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

void mr__fused_prepare(mr_moe_ctx *c, const mr_moe_weights *w, const mr_moe_args *a, const float *wts) {
    const mr__fused_state *s = c->rs;
    const int k = c->p.top_k;
    const int64_t H = c->p.hidden, S = a->T * k;
    const mr_act_mode mode = c->p.act_mode;
    const bool woi = mr_routing_weight_on_input(c->p.routing);
    float s13 = 0.0f, s2 = 0.0f;
    if (mode == MR_ACT_W4A4) mr__moe_w4a4_scales(w, &s13, &s2);
    char *xq = c->rows.plane[0].base;
    float *xs = c->rows.plane[1].base;
#pragma omp parallel num_threads(mr__moe_threads(c)) if (S * H >= MR__MOE_PAR_MIN)
    {
        float *row = s->tmp + (size_t)s->tmp_stride * (size_t)omp_get_thread_num() + MCH * CB1 * 2 + MCH * CB2;
        /* one row per (token, slot), in expert-grouped order */
#pragma omp for schedule(static)
        for (int64_t r = 0; r < S; r++) {
            const int32_t flat = c->token_of[r];
            const float *xin = mr__moe_token_row(c, a, flat / k, woi ? wts[flat] : 1.0f, row);
            mr__act_prepare_row(mode, xin, H, s13, xq + (size_t)r * (size_t)H * s->esz, xs + r * s->GH);
        }
    }
}

mr_status mr__fused_experts(mr_moe_ctx *c, const mr_moe_weights *w, const mr_a2a_xfer *x) {
    const mr__fused_state *s = c->rs;
    const mr_moe_problem *p = &c->p;
    const int E = c->n_local;
    const int64_t H = p->hidden, I = p->inter, Ip = c->layout.inter_padded;
    const int64_t GH = s->GH, GI = s->GI;
    const mr_act_mode mode = p->act_mode;
    const mr_format kd = s->kd;
    const size_t esz = s->esz;
    const int32_t *off = x->recv_offsets;
    const char *xq = x->recv.plane[0].base;
    const float *xs = x->recv.plane[1].base;
    float *const y = x->y_recv;
    MR_ASSERT(c->layout.gateup != MR_GATEUP_SEPARATE && w->w13);
    float s13 = 0.0f, s2 = 0.0f;
    if (mode == MR_ACT_W4A4) mr__moe_w4a4_scales(w, &s13, &s2);

    /* flat task lists: GEMM1 blocks of 128 columns of I, GEMM2 blocks of 64 rows of H */
    const int64_t nb1 = (I + CB1 - 1) / CB1, nb2 = (H + CB2 - 1) / CB2;
    int64_t nt1 = 0;
    for (int e = 0; e < E; e++)
        if (off[e + 1] > off[e])
            for (int64_t b = 0; b < nb1; b++) s->tasks[nt1++] = (int32_t)(e * nb1 + b);
    const int64_t n_active = nt1 / (nb1 ? nb1 : 1);

#pragma omp parallel num_threads(mr__moe_threads(c))
    {
        float *tmp = s->tmp + (size_t)s->tmp_stride * (size_t)omp_get_thread_num();
        float *gb = tmp, *ub = gb + MCH * CB1, *yb = ub + MCH * CB1, *row = yb + MCH * CB2;

        /* 1. GEMM1 + SiLU*up + preparation of h for GEMM2 */
#pragma omp for schedule(dynamic, 1)
        for (int64_t ti = 0; ti < nt1; ti++) {
            const int e = (int)(s->tasks[ti] / nb1);
            const int64_t c0 = (s->tasks[ti] % nb1) * CB1, cn = I - c0 < CB1 ? I - c0 : CB1, cnt = off[e + 1] - off[e];
            const mr_qmatrix *W13 = &w->w13[e];
            for (int64_t m0 = 0; m0 < cnt; m0 += MCH) {
                const int64_t mm = cnt - m0 < MCH ? cnt - m0 : MCH, s0 = off[e] + m0;
                gateup_rows(c, W13, c0, cn, kd, xq + (size_t)s0 * (size_t)H * esz, H, xs + s0 * GH, GH, mm, gb, ub);
                for (int64_t m = 0; m < mm; m++) {
                    for (int64_t i = 0; i < cn; i++) row[i] = mr__silu(gb[m * CB1 + i]) * ub[m * CB1 + i];
                    mr__act_prepare_row(mode, row, cn, s2, (char *)s->hq + ((size_t)(s0 + m) * (size_t)Ip + (size_t)c0) * esz,
                                        s->hs + (s0 + m) * GI + c0 / 128);
                }
            }
        }

        /* 2. GEMM2, unit weights */
#pragma omp for schedule(dynamic, 1)
        for (int64_t ti = 0; ti < n_active * nb2; ti++) {
            const int e = (int)(s->tasks[ti / nb2 * nb1] / nb1);
            const int64_t n0 = (ti % nb2) * CB2, nr = H - n0 < CB2 ? H - n0 : CB2, cnt = off[e + 1] - off[e];
            for (int64_t m0 = 0; m0 < cnt; m0 += MCH) {
                const int64_t mm = cnt - m0 < MCH ? cnt - m0 : MCH, s0 = off[e] + m0;
                mr_gemm_rows(c->kern, &w->w2[e], n0, nr, kd, (const char *)s->hq + (size_t)s0 * (size_t)Ip * esz, Ip,
                             s->hs + s0 * GI, GI, mm, yb, CB2);
                for (int64_t m = 0; m < mm; m++)
                    memcpy(y + (size_t)(s0 + m) * (size_t)H + (size_t)n0, yb + m * CB2, (size_t)nr * sizeof(float));
            }
        }
    }
    return MR_OK;
}
