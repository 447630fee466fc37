/* expert_packed.c — the phases of `routed` on packed weights (the 16-row
 * tile layouts of moerun/kernels.h, gate/up tiles interleaved):
 *  prepare: each token's input is prepared once in the mode's kernel form
 *     (actmode.c) into the row of its first slot and copied to its other
 *     slots (rows grouped by expert by the route phase);
 *  experts, in one OpenMP parallel region:
 *  1. GEMM1: one flat list of chunks (active expert, 128 columns of I = 8
 *     gate/up tile pairs, one contiguous run of weights); gate and up tiles
 *     through the micro-kernel, SiLU*up in the epilogue, h prepared for GEMM2
 *     (a chunk owns whole 128-column groups, as the modes need);
 *  2. GEMM2: one flat list of chunks (active expert, 128 rows of H = 8
 *     tiles); each row's down projection stored with unit weight (the
 *     routing weight is applied by the layer's finalize, at the origin).
 * Scheduling of 1 and 2 (the bandwidth-bound part): each thread owns one
 * contiguous range of the flat list (so at T = 1 it streams long runs of
 * whole experts, and the kernels' software prefetch always runs ahead into
 * weights the same thread reads next); a thread that runs dry steals the
 * back half of another thread's remaining range and walks it forward. A
 * chunk whose weights do not follow the thread's previous chunk starts with
 * a burst of prefetches over its first MR_UK_PREFETCH bytes (the kernels'
 * own prefetch distance), so no stream starts cold.
 * Few tokens on an expert take the gemv micro-kernel (weights streamed once
 * per 8 tokens), many take the gemm one (a block decoded once into L1 for
 * all tokens): kern->uk_gemm_min_m decides. Tokens are processed in chunks
 * of up to 128 per expert. Nothing is allocated here. */
#include <stdatomic.h>
#include <string.h>

#include "base/steal.h"
#include "moe/runner_routed.h"

enum { CB1 = 128, CB2 = MR__MOE_CB2, MCH = 128, T = MR_PACK_TILE };

static inline void *row_at(void *base, int64_t row, int64_t ld, int es) {
    return (char *)base + (size_t)row * (size_t)ld * (size_t)es;
}

/* a stream that does not continue the thread's previous one starts with
 * its first MR_UK_PREFETCH bytes prefetched (the kernels keep that distance) */
static inline void stream_start(const uint8_t *p, size_t bytes, const uint8_t **expect) {
    if (p != *expect) {
        const size_t n = bytes < MR_UK_PREFETCH ? bytes : MR_UK_PREFETCH;
        for (size_t o = 0; o < n; o += 64) __builtin_prefetch(p + o, 0, 1);
    }
    *expect = p + bytes;
}

/* whose rows a thread's xw buffer holds (the first row's address; reset per phase: GEMM2 rows
 * are new), and in which form: widened (mr_uk_act.xw) or times 2^112 (mr_uk_act.xd) */
typedef struct {
    const void *rows;
    bool scaled;
} xw_held;

/* the gemm kernels' fp32 copy of mm rows of bf16 x (mr_uk_act.xw), or NULL
 * where the call takes none (no buffer: the table reads x; the gemv or the
 * stream-only kernel): widened once per expert chunk and reused by every
 * tile of it, and by the thread's next chunk where that has the same rows.
 * The shift is inlined rather than mr__bf16_dequantize_row's per-value call
 * so that the loop vectorizes.
 * Rows are MR__XW_LD(ld) apart: a 16-token register block of rows 12 KiB
 * apart sat on one L1 set (dev/perf/hot_uk: 113 -> 130 G/s a thread for
 * the AVX-512 fp32-FMA fp8 gemm with the pad). */
static const float *widen_rows(const uint16_t *x, int64_t ld, int64_t mm, float *xw, bool gemm, xw_held *h) {
    if (!xw || !gemm) return NULL;
    if (h->rows == (const void *)x && !h->scaled) return xw;
    for (int64_t m = 0; m < mm; m++) {
        const uint16_t *src = x + m * ld;
        uint32_t *dst = (uint32_t *)(xw + m * MR__XW_LD(ld));
        for (int64_t i = 0; i < ld; i++) dst[i] = (uint32_t)src[i] << 16;
    }
    *h = (xw_held){x, false};
    return xw;
}

/* the FP8 kernels' x * 2^112 (mr_uk_act.xd) of mm rows of bf16 x over the kp values the tiles
 * read, in the same buffer and rows as widen_rows', or NULL where the call takes none (no
 * buffer, the stream-only kernel): made once per expert chunk and reused as widen_rows' copy is,
 * in place of the gemv's own scaling of every 128 values per tile (dev/perf/hot_uk, AVX2:
 * 1.12-1.16x at 2-4 tokens) and of the widened x of the gemm */
static const float *xd_rows(const uint16_t *x, int64_t ld, int64_t kp, int64_t mm, float *xw, bool use, xw_held *h) {
    if (!xw || !use) return NULL;
    if (h->rows == (const void *)x && h->scaled) return xw;
    for (int64_t m = 0; m < mm; m++) mr_uk_xd_row(x + m * ld, kp, xw + m * MR__XW_LD(ld));
    *h = (xw_held){x, true};
    return xw;
}

/* the gemv's fixed-point copy of mm rows of bf16 x in buf (mr_uk_act.xq:
 * high parts, int16 rows of ld, low parts alike, then ld / 16 multipliers a
 * row), in *in; none where the call takes none (no buffer, not the gemv,
 * more rows than the buffer holds). Made once per expert chunk and reused
 * as widen_rows' copy is. */
static void fixq_rows(const mr_kernels *K, const uint16_t *x, int64_t ld, int64_t mm, float *buf, bool gemv,
                      const void **key, mr_uk_act *in) {
    if (!buf || !gemv || mm > MR_UK_MT) return;
    int16_t *q = (int16_t *)buf, *ql = q + (size_t)MR_UK_MT * (size_t)ld;
    float *m = buf + (size_t)MR_UK_MT * (size_t)ld;
    if (*key != (const void *)x)
        for (int64_t r = 0; r < mm; r++) K->xq_row.fn(x + r * ld, ld, q + r * ld, ql + r * ld, m + r * (ld / 16));
    *key = x;
    in->xq = q, in->xql = ql, in->xqm = m, in->ldxq = ld, in->ldxqm = ld / 16;
}

/* token t's rows: prepared once into its first slot's row, copied to the others */
static void prepare_token(const mr_moe_ctx *c, const mr_moe_args *a, const float *wts, float s13, int64_t t,
                          float *row, float *xs_unused) {
    const mr__routed_state *s = c->rs;
    const int k = c->p.top_k, es = s->es;
    const int64_t H = c->p.hidden;
    const bool woi = mr_routing_weight_on_input(c->p.routing);
    const mr_moe_rowset *R = &c->rows;
    const int pxs = s->use_xs ? 1 : -1, pxb = s->kind == MR_UK_NVFP4_I8 ? R->n_planes - 1 : -1;
    const int64_t s0 = c->slot_of[t * k];
    for (int j = 0; j < k; j++) {
        const int64_t r = c->slot_of[t * k + j];
        if (j > 0 && !woi) { /* the same values: copy the first slot's row */
            memcpy(row_at(R->plane[0].base, r, s->ld1, es), row_at(R->plane[0].base, s0, s->ld1, es),
                   (size_t)H * (size_t)es);
            for (int pl = 1; pl < R->n_planes; pl++)
                memcpy((char *)R->plane[pl].base + (size_t)r * R->plane[pl].row_bytes,
                       (char *)R->plane[pl].base + (size_t)s0 * R->plane[pl].row_bytes, R->plane[pl].row_bytes);
            continue;
        }
        const float *xin = mr__moe_token_row(c, a, t, woi ? wts[t * k + j] : 1.0f, row);
        float *xs = pxs > 0 ? (float *)R->plane[pxs].base + (size_t)r * (size_t)s->nxs1 : xs_unused;
        int32_t *xb = pxb > 0 ? (int32_t *)R->plane[pxb].base + (size_t)r * (size_t)s->nxb1 : NULL;
        mr__act_prepare_uk_row(c->p.act_mode, xin, H, s13, row_at(R->plane[0].base, r, s->ld1, es), xs, xb);
    }
}

void mr__routed_prepare(mr_moe_ctx *c, const mr_moe_weights *w, const mr_moe_args *a, const float *wts) {
    const mr__routed_state *s = c->rs;
    const int64_t H = c->p.hidden, Tn = a->T, big = H > c->layout.inter_padded ? H : c->layout.inter_padded;
    float s13 = 0.0f, s2 = 0.0f;
    if (c->p.act_mode == MR_ACT_W4A4) mr__moe_w4a4_scales(w, &s13, &s2);
    const uint64_t t0 = mr_now_ns();
    if (Tn * c->p.top_k * H < MR__MOE_PAR_MIN) { /* decode sizes: no parallel region at all */
        float *row = s->tmp + 128 * 128 * 2 + 128 * MR__MOE_CB2;
        for (int64_t t = 0; t < Tn; t++) prepare_token(c, a, wts, s13, t, row, row + big + 16);
        c->prof.busy_ns[MR_MOE_PH_PREP] += mr_now_ns() - t0;
        return;
    }
    uint64_t busy = 0;
#pragma omp parallel num_threads(mr__moe_threads(c)) reduction(+ : busy)
    {
        const uint64_t tb = mr_now_ns();
        float *row = s->tmp + (size_t)s->tmp_stride * (size_t)omp_get_thread_num() + 128 * 128 * 2 + 128 * MR__MOE_CB2;
#pragma omp for schedule(static)
        for (int64_t t = 0; t < Tn; t++) prepare_token(c, a, wts, s13, t, row, row + big + 16);
        busy += mr_now_ns() - tb;
    }
    c->prof.busy_ns[MR_MOE_PH_PREP] += busy;
}

mr_status mr__routed_experts(mr_moe_ctx *c, const mr_moe_weights *w, const mr_a2a_xfer *x) {
    const mr__routed_state *s = c->rs;
    const mr_moe_problem *p = &c->p;
    const int E = c->n_local;
    const int64_t H = p->hidden, I = p->inter;
    const mr_act_mode mode = p->act_mode;
    const mr_uk_kind kind = s->kind;
    const int es = s->es, blk = s->blk;
    const mr_kernels *K = c->kern;
    const int32_t *off = x->recv_offsets;
    MR_ASSERT(c->layout.pack != MR_PACK_NONE && w->p13 && w->p2);
    if (K->uk_pack[kind] != (mr_pack_id)c->layout.pack) /* packed for another CPU's kernels */
        return mr_error_set(MR_ESTATE, "the experts are packed as %s, but this CPU's %s kernels take %s",
                            mr_pack_name((mr_pack_id)c->layout.pack), K->isa, mr_pack_name(K->uk_pack[kind]));
    /* the received rows: kernel input, and its multipliers / int8 sums where the mode has them */
    const void *x1 = x->recv.plane[0].base;
    const float *xs1 = s->use_xs ? (const float *)x->recv.plane[1].base : NULL;
    const int32_t *xb1 = kind == MR_UK_NVFP4_I8 ? (const int32_t *)x->recv.plane[x->recv.n_planes - 1].base : NULL;
    float *const y = x->y_recv;

    uint64_t tph[3];
    tph[0] = mr_now_ns();
    /* flat chunk lists over the active experts: chunk ti is (act[ti / nb], ti % nb) */
    const int64_t nb1 = (I + CB1 - 1) / CB1, nb2 = (H + CB2 - 1) / CB2;
    int32_t *act = s->act;
    int64_t n_act = 0;
    for (int e = 0; e < E; e++)
        if (off[e + 1] > off[e]) act[n_act++] = e;
    float s13 = 1.0f, s2 = 1.0f;
    if (mode == MR_ACT_W4A4) mr__moe_w4a4_scales(w, &s13, &s2);
    const float post1 = mode == MR_ACT_W4A4 ? s13 : 1.0f, post2 = mode == MR_ACT_W4A4 ? s2 : 1.0f;
    const float in2 = mode == MR_ACT_W4A4 ? s2 : 0.0f;
    const mr_uk_fn fn_stream = c->stream_only ? K->uk_stream.fn : NULL;
    const int max_nt = mr__moe_threads(c);

#pragma omp parallel num_threads(max_nt)
    {
        const int me = omp_get_thread_num(), nt = omp_get_num_threads();
        float *tmp = s->tmp + (size_t)s->tmp_stride * (size_t)me;
        float *gb = tmp, *ub = gb + MCH * CB1, *yb = ub + MCH * CB1, *row = yb + MCH * CB2;
        void *scratch = (void *)(((uintptr_t)(row + (H > c->layout.inter_padded ? H : c->layout.inter_padded) + 16 +
                                              s->nxs1 + s->nxs2) +
                                  63) &
                                 ~(uintptr_t)63);
        float *xw = s->widen || s->xd ? (float *)((uintptr_t)((char *)scratch + MR_UK_SCRATCH + 63) & ~(uintptr_t)63)
                                       : NULL;
        /* one form a kind: where the kernels take x * 2^112 they take no widened x */
        float *xw_gemm = s->widen && !s->xd ? xw : NULL, *xw_xd = s->xd ? xw : NULL;
        xw_held held = {0};
        float *xqb = s->fixq ? (float *)((uintptr_t)((char *)scratch + MR_UK_SCRATCH + 63) & ~(uintptr_t)63) +
                                   (xw ? (size_t)128 * (size_t)MR__XW_LD(s->ld1 > s->ld2 ? s->ld1 : s->ld2) + 16 : 0)
                             : NULL;
        const void *xq_key = NULL; /* whose rows xqb holds (reset per phase as held) */
        _Atomic uint64_t *r1 = s->ranges, *r2 = s->ranges + (size_t)c->n_threads * MR__MOE_RSTRIDE;
        const uint8_t *expect = NULL;
        /* the two chunk lists split into nt contiguous ranges (read after the first barrier) */
        mr__rng_init(r1, n_act * nb1, nt, me);
        mr__rng_init(r2, n_act * nb2, nt, me);
#pragma omp barrier
        uint64_t tb = mr_now_ns(), te;
#define PHASE_END(ph, i)                                                                                             \
    te = mr_now_ns();                                                                                                \
    _Pragma("omp atomic") c->prof.busy_ns[ph] += te - tb;                                                           \
    _Pragma("omp barrier");                                                                                          \
    tb = mr_now_ns();                                                                                                \
    _Pragma("omp master") tph[i] = tb;

        /* 1. GEMM1: gate and up tiles together, SiLU*up, h prepared for GEMM2 */
        for (int64_t ti; (ti = mr__rng_next(r1, nt, me)) >= 0;) {
            const int e = act[ti / nb1];
            const int64_t c0 = (ti % nb1) * CB1, cn = I - c0 < CB1 ? I - c0 : CB1, npair = (cn + T - 1) / T;
            const mr_pmatrix *W = &w->p13[e];
            const int64_t tile0 = 2 * (c0 / T), cnt = off[e + 1] - off[e];
            for (int64_t m0 = 0; m0 < cnt; m0 += MCH) {
                stream_start(W->data + (size_t)tile0 * W->tile_bytes, (size_t)(2 * npair) * W->tile_bytes, &expect);
                const int64_t mm = cnt - m0 < MCH ? cnt - m0 : MCH, s0 = off[e] + m0;
                const mr_uk_fn fn = fn_stream ? fn_stream : mm >= K->uk_gemm_min_m ? K->uk_gemm[kind].fn : K->uk_gemv[kind].fn;
                const void *xr = row_at((void *)x1, s0, s->ld1, es);
                const bool gemm = !fn_stream && mm >= K->uk_gemm_min_m, gemv = !fn_stream && !gemm;
                const float *xwr = widen_rows(xr, s->ld1, mm, xw_gemm, gemm, &held);
                const float *xdr = xd_rows(xr, s->ld1, W->Kp, mm, xw_xd, !fn_stream, &held);
                mr_uk_act in = {.x = xr, .ldx = s->ld1, .xs = xs1 ? xs1 + s0 * s->nxs1 : NULL, .ldxs = s->nxs1,
                                      .xb = xb1 ? xb1 + s0 * s->nxb1 : NULL, .ldb = s->nxb1, .post = post1,
                                      .xs_group = s->xs_group, .xw = xwr, .ldxw = MR__XW_LD(s->ld1), .xd = xdr,
                                      .ldxd = MR__XW_LD(s->ld1)};
                fixq_rows(K, xr, s->ld1, mm, xqb, gemv, &xq_key, &in);
                for (int64_t i = 0; i < npair; i++) {
                    fn(W, tile0 + 2 * i, &in, mm, gb + i * T, CB1, scratch);
                    fn(W, tile0 + 2 * i + 1, &in, mm, ub + i * T, CB1, scratch);
                }
                for (int64_t m = 0; m < mm; m++) {
                    K->silu_mul.fn(gb + m * CB1, ub + m * CB1, cn, row);
                    const int64_t r = s0 + m;
                    mr__act_prepare_uk_row(mode, row, cn, in2,
                                           (char *)row_at(s->x2, r, s->ld2, es) + (size_t)c0 * (size_t)es,
                                           s->xs2 + r * s->nxs2 + (blk == 16 ? c0 / 16 : c0 / 128),
                                           s->xb2 ? s->xb2 + r * s->nxb2 + c0 / 16 : NULL);
                }
            }
        }
        PHASE_END(MR_MOE_PH_GEMM1, 1)
        held = (xw_held){0};
        xq_key = NULL;

        /* 2. GEMM2: each row's result with unit weight */
        for (int64_t ti; (ti = mr__rng_next(r2, nt, me)) >= 0;) {
            const int e = act[ti / nb2];
            const int64_t n0 = (ti % nb2) * CB2, nr = H - n0 < CB2 ? H - n0 : CB2, ntl = (nr + T - 1) / T;
            const mr_pmatrix *W = &w->p2[e];
            const int64_t cnt = off[e + 1] - off[e];
            for (int64_t m0 = 0; m0 < cnt; m0 += MCH) {
                stream_start(W->data + (size_t)(n0 / T) * W->tile_bytes, (size_t)ntl * W->tile_bytes, &expect);
                const int64_t mm = cnt - m0 < MCH ? cnt - m0 : MCH, s0 = off[e] + m0;
                const mr_uk_fn fn = fn_stream ? fn_stream : mm >= K->uk_gemm_min_m ? K->uk_gemm[kind].fn : K->uk_gemv[kind].fn;
                const void *xr = row_at(s->x2, s0, s->ld2, es);
                const bool gemm = !fn_stream && mm >= K->uk_gemm_min_m, gemv = !fn_stream && !gemm;
                const float *xwr = widen_rows(xr, s->ld2, mm, xw_gemm, gemm, &held);
                const float *xdr = xd_rows(xr, s->ld2, W->Kp, mm, xw_xd, !fn_stream, &held);
                mr_uk_act in = {.x = xr, .ldx = s->ld2, .xs = s->use_xs ? s->xs2 + s0 * s->nxs2 : NULL,
                                      .ldxs = s->nxs2, .xb = s->xb2 ? s->xb2 + s0 * s->nxb2 : NULL, .ldb = s->nxb2,
                                      .post = post2, .xs_group = s->xs_group, .xw = xwr, .ldxw = MR__XW_LD(s->ld2),
                                      .xd = xdr, .ldxd = MR__XW_LD(s->ld2)};
                fixq_rows(K, xr, s->ld2, mm, xqb, gemv, &xq_key, &in);
                for (int64_t i = 0; i < ntl; i++) fn(W, n0 / T + i, &in, mm, yb + i * T, CB2, scratch);
                for (int64_t m = 0; m < mm; m++)
                    memcpy(y + (size_t)(s0 + m) * (size_t)H + (size_t)n0, yb + m * CB2, (size_t)nr * sizeof(float));
            }
        }
        PHASE_END(MR_MOE_PH_GEMM2, 2)
#undef PHASE_END
    }
    c->prof.wall_ns[MR_MOE_PH_GEMM1] += tph[1] - tph[0];
    c->prof.wall_ns[MR_MOE_PH_GEMM2] += tph[2] - tph[1];
    return MR_OK;
}
