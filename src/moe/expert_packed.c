/* expert_packed.c — the expert compute of `routed` on packed weights (the
 * 16-row tile layouts of moerun/kernels.h, gate/up tiles interleaved), in
 * one OpenMP parallel region per call:
 *  1. rows grouped by expert (mr_permutation_build); each token's input is
 *     prepared once in the mode's kernel form (actmode.c) and copied to its
 *     k slots;
 *  2. GEMM1: one flat list of chunks (active expert, 128 columns of I = 8
 *     gate/up tile pairs, one contiguous run of weights); gate and up tiles
 *     through the micro-kernel, SiLU*up in the epilogue, h prepared for GEMM2
 *     (a chunk owns whole 128-column groups, as the modes need);
 *  3. GEMM2: one flat list of chunks (active expert, 128 rows of H = 8
 *     tiles); the routing weight applied as the down projection is stored
 *     per slot;
 *  4. a deterministic reduction over each token's k slots, in selection
 *     order, into the caller's buffer in the activation dtype.
 * Scheduling of 2 and 3 (the bandwidth-bound part): each thread owns one
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

#include "moe/moe_internal.h"

enum { CB1 = 128, CB2 = MR__MOE_CB2, MCH = 128, T = MR_PACK_TILE };

static inline void *row_at(void *base, int64_t row, int64_t ld, int es) {
    return (char *)base + (size_t)row * (size_t)ld * (size_t)es;
}

/* ---- per-thread ranges [front, back) of a chunk list, packed in 64 bits ---- */
static inline uint64_t rng_pack(uint32_t f, uint32_t b) { return (uint64_t)f << 32 | b; }

static int64_t take_front(_Atomic uint64_t *r) {
    uint64_t v = atomic_load_explicit(r, memory_order_relaxed);
    for (;;) {
        const uint32_t f = (uint32_t)(v >> 32), b = (uint32_t)v;
        if (f >= b) return -1;
        if (atomic_compare_exchange_weak_explicit(r, &v, rng_pack(f + 1, b), memory_order_acq_rel, memory_order_relaxed))
            return f;
    }
}

/* moves the back half of another thread's range into mine; false if all are empty */
static bool steal(_Atomic uint64_t *rs, int nt, int me) {
    for (int i = 1; i < nt; i++) {
        _Atomic uint64_t *v = &rs[(size_t)((me + i) % nt) * MR__MOE_RSTRIDE];
        uint64_t x = atomic_load_explicit(v, memory_order_relaxed);
        for (;;) {
            const uint32_t f = (uint32_t)(x >> 32), b = (uint32_t)x;
            if (f >= b) break;
            const uint32_t m = f + (b - f) / 2;
            if (atomic_compare_exchange_weak_explicit(v, &x, rng_pack(f, m), memory_order_acq_rel, memory_order_relaxed)) {
                atomic_store_explicit(&rs[(size_t)me * MR__MOE_RSTRIDE], rng_pack(m, b), memory_order_release);
                return true;
            }
        }
    }
    return false;
}

static int64_t next_chunk(_Atomic uint64_t *rs, int nt, int me) {
    for (;;) {
        int64_t t = take_front(&rs[(size_t)me * MR__MOE_RSTRIDE]);
        if (t >= 0) return t;
        if (!steal(rs, nt, me)) return -1;
    }
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
    if (K->uk_pack[kind] != (mr_pack_id)c->layout.pack) /* packed for another CPU's kernels */
        return mr_error_set(MR_ESTATE, "the experts are packed as %s, but this CPU's %s kernels take %s",
                            mr_pack_name((mr_pack_id)c->layout.pack), K->isa, mr_pack_name(K->uk_pack[kind]));

    uint64_t tph[MR_MOE_NPH + 1];
    tph[0] = mr_now_ns();
    mr_permutation perm = {c->counts, c->offsets, c->slot_of, c->token_of};
    mr_status st = mr_permutation_build(ids, Tn, k, E, &perm);
    if (st) return st;

    /* flat chunk lists over the active experts: chunk ti is (act[ti / nb], ti % nb) */
    const int64_t nb1 = (I + CB1 - 1) / CB1, nb2 = (H + CB2 - 1) / CB2;
    int32_t *act = c->tasks;
    int64_t n_act = 0;
    for (int e = 0; e < E; e++)
        if (c->counts[e]) act[n_act++] = e;
    const float post1 = mode == MR_ACT_W4A4 ? c->s13 : 1.0f, post2 = mode == MR_ACT_W4A4 ? c->s2 : 1.0f;
    /* the multiplier and bias arrays are given to the kernels only where the mode has them */
    const bool use_xs = blk != 0 && (mode == MR_ACT_W8A8 || kind == MR_UK_NVFP4_I8);
    const int xs_group = mode == MR_ACT_W4A8 ? 8 : 1; /* w4a8: one s per 128-column group, replicated per 16 */
    const mr_uk_fn fn_stream = c->stream_only ? K->uk_stream.fn : NULL;
    const int max_nt = omp_get_max_threads() < c->n_threads ? omp_get_max_threads() : c->n_threads;
    tph[1] = mr_now_ns();
    int nthr = 1;

#pragma omp parallel num_threads(max_nt)
    {
        const int me = omp_get_thread_num(), nt = omp_get_num_threads();
        float *tmp = c->tmp + (size_t)c->tmp_stride * (size_t)me;
        float *gb = tmp, *ub = gb + MCH * CB1, *yb = ub + MCH * CB1, *row = yb + MCH * CB2;
        void *scratch = (void *)(((uintptr_t)(row + (H > c->layout.inter_padded ? H : c->layout.inter_padded) + 16) + 63) &
                                 ~(uintptr_t)63);
        _Atomic uint64_t *r1 = c->ranges, *r2 = c->ranges + (size_t)c->n_threads * MR__MOE_RSTRIDE;
        const uint8_t *expect = NULL;
        /* the two chunk lists split into nt contiguous ranges (read after the first barrier) */
        atomic_store_explicit(&r1[(size_t)me * MR__MOE_RSTRIDE],
                              rng_pack((uint32_t)(n_act * nb1 * me / nt), (uint32_t)(n_act * nb1 * (me + 1) / nt)),
                              memory_order_relaxed);
        atomic_store_explicit(&r2[(size_t)me * MR__MOE_RSTRIDE],
                              rng_pack((uint32_t)(n_act * nb2 * me / nt), (uint32_t)(n_act * nb2 * (me + 1) / nt)),
                              memory_order_relaxed);
        uint64_t tb = mr_now_ns(), te;
#define PHASE_END(ph)                                                                                                \
    te = mr_now_ns();                                                                                                \
    _Pragma("omp atomic") c->prof.busy_ns[ph] += te - tb;                                                           \
    _Pragma("omp barrier");                                                                                          \
    tb = mr_now_ns();                                                                                                \
    _Pragma("omp master") tph[ph + 1] = tb;
#pragma omp master
        nthr = nt;

        /* 1. GEMM1 input, once per token, copied to its k slots (expert-sorted order) */
#pragma omp for schedule(static) nowait
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
                const float *xin;
                if (xbf || woi) {
                    for (int64_t i = 0; i < H; i++) {
                        float v = xbf ? mr_bf16_to_f32(((const uint16_t *)a->x)[t * H + i]) : ((const float *)a->x)[t * H + i];
                        row[i] = woi ? v * wt : v;
                    }
                    xin = row;
                } else {
                    xin = (const float *)a->x + t * H;
                }
                mr__act_prepare_uk_row(mode, xin, H, c->s13, row_at(c->x1, s, c->ld1, es), c->xs1 + s * c->nxs1,
                                       c->xb1 + s * (c->ld1 / 16 + 1));
            }
        }
        PHASE_END(MR_MOE_PH_PREP)

        /* 2. GEMM1: gate and up tiles together, SiLU*up, h prepared for GEMM2 */
        for (int64_t ti; (ti = next_chunk(r1, nt, me)) >= 0;) {
            const int e = act[ti / nb1];
            const int64_t c0 = (ti % nb1) * CB1, cn = I - c0 < CB1 ? I - c0 : CB1, npair = (cn + T - 1) / T;
            const mr_pmatrix *W = &c->w->p13[e];
            const int64_t tile0 = 2 * (c0 / T);
            for (int64_t m0 = 0; m0 < c->counts[e]; m0 += MCH) {
                stream_start(W->data + (size_t)tile0 * W->tile_bytes, (size_t)(2 * npair) * W->tile_bytes, &expect);
                const int64_t mm = c->counts[e] - m0 < MCH ? c->counts[e] - m0 : MCH, s0 = c->offsets[e] + m0;
                const mr_uk_fn fn = fn_stream ? fn_stream : mm >= K->uk_gemm_min_m ? K->uk_gemm[kind].fn : K->uk_gemv[kind].fn;
                const mr_uk_act in = {.x = row_at(c->x1, s0, c->ld1, es), .ldx = c->ld1,
                                      .xs = use_xs ? c->xs1 + s0 * c->nxs1 : NULL, .ldxs = c->nxs1,
                                      .xb = c->xb1 + s0 * (c->ld1 / 16 + 1), .ldb = c->ld1 / 16 + 1, .post = post1,
                                      .xs_group = xs_group};
                for (int64_t i = 0; i < npair; i++) {
                    fn(W, tile0 + 2 * i, &in, mm, gb + i * T, CB1, scratch);
                    fn(W, tile0 + 2 * i + 1, &in, mm, ub + i * T, CB1, scratch);
                }
                for (int64_t m = 0; m < mm; m++) {
                    K->silu_mul.fn(gb + m * CB1, ub + m * CB1, cn, row);
                    const int64_t s = s0 + m;
                    mr__act_prepare_uk_row(mode, row, cn, c->s2, (char *)row_at(c->x2, s, c->ld2, es) + (size_t)c0 * (size_t)es,
                                           c->xs2 + s * c->nxs2 + (blk == 16 ? c0 / 16 : c0 / 128),
                                           c->xb2 + s * (c->ld2 / 16 + 1) + c0 / 16);
                }
            }
        }
        PHASE_END(MR_MOE_PH_GEMM1)

        /* 3. GEMM2: the routing weight applied at the store */
        for (int64_t ti; (ti = next_chunk(r2, nt, me)) >= 0;) {
            const int e = act[ti / nb2];
            const int64_t n0 = (ti % nb2) * CB2, nr = H - n0 < CB2 ? H - n0 : CB2, ntl = (nr + T - 1) / T;
            const mr_pmatrix *W = &c->w->p2[e];
            for (int64_t m0 = 0; m0 < c->counts[e]; m0 += MCH) {
                stream_start(W->data + (size_t)(n0 / T) * W->tile_bytes, (size_t)ntl * W->tile_bytes, &expect);
                const int64_t mm = c->counts[e] - m0 < MCH ? c->counts[e] - m0 : MCH, s0 = c->offsets[e] + m0;
                const mr_uk_fn fn = fn_stream ? fn_stream : mm >= K->uk_gemm_min_m ? K->uk_gemm[kind].fn : K->uk_gemv[kind].fn;
                const mr_uk_act in = {.x = row_at(c->x2, s0, c->ld2, es), .ldx = c->ld2,
                                      .xs = use_xs ? c->xs2 + s0 * c->nxs2 : NULL, .ldxs = c->nxs2,
                                      .xb = c->xb2 + s0 * (c->ld2 / 16 + 1), .ldb = c->ld2 / 16 + 1, .post = post2,
                                      .xs_group = xs_group};
                for (int64_t i = 0; i < ntl; i++) fn(W, n0 / T + i, &in, mm, yb + i * T, CB2, scratch);
                for (int64_t m = 0; m < mm; m++) {
                    const float wt = woi ? 1.0f : wts[c->token_of[s0 + m]];
                    float *dst = c->yslot + (size_t)(s0 + m) * (size_t)H + (size_t)n0;
                    for (int64_t j = 0; j < nr; j++) dst[j] = wt * yb[m * CB2 + j];
                }
            }
        }
        PHASE_END(MR_MOE_PH_GEMM2)

        /* 4. each token's k slots in selection order, stored in the activation dtype */
#pragma omp for schedule(static) nowait
        for (int64_t t = 0; t < Tn; t++) mr__moe_reduce_token(c, a, t, row);
        PHASE_END(MR_MOE_PH_REDUCE)
#undef PHASE_END
    }
    c->prof.calls++;
    c->prof.n_threads = nthr;
    c->prof.busy_ns[MR_MOE_PH_SETUP] += tph[1] - tph[0];
    for (int ph = 0; ph < MR_MOE_NPH; ph++) c->prof.wall_ns[ph] += tph[ph + 1] - tph[ph];
    return MR_OK;
}
