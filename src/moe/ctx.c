/* ctx.c — the MoE context of one model: capability check, the workspace
 * (allocated once for max_T tokens and shared by every layer, so that the
 * per-call path never allocates), the runner's private state (its
 * ops->ctx_new / ctx_free), the transport, the after-load of each layer's
 * weights, the phase profile and the test-only mutation switch. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "moe/moe_internal.h"

unsigned mr__moe_mutation = MR_MUT_NONE;

unsigned mr_moe_debug_mutation(unsigned flags) {
    unsigned old = mr__moe_mutation;
    mr__moe_mutation = flags;
    return old;
}

bool mr__moe_layout_equal(const mr_moe_layout *a, const mr_moe_layout *b) {
    return a->gateup == b->gateup && a->interleave_rows == b->interleave_rows && a->inter_padded == b->inter_padded &&
           a->pack == b->pack && a->pack_tile == b->pack_tile;
}

void mr__moe_w4a4_scales(const mr_moe_weights *w, float *s13, float *s2) {
    float a = 0.0f, b = 0.0f;
    for (int e = 0; e < w->n_experts; e++) {
        if (w->w13 && w->w13[e].data) a = fmaxf(a, w->w13[e].input_scale);
        if (w->p13 && w->p13[e].data) a = fmaxf(a, w->p13[e].input_scale);
        if (w->p2 && w->p2[e].data) b = fmaxf(b, w->p2[e].input_scale);
        if (w->w1[e].data) a = fmaxf(a, w->w1[e].input_scale);
        if (w->w3[e].data) a = fmaxf(a, w->w3[e].input_scale);
        b = fmaxf(b, w->w2[e].input_scale);
    }
    *s13 = w->in_scale13 > 0.0f ? w->in_scale13 : a;
    *s2 = w->in_scale2 > 0.0f ? w->in_scale2 : b;
}

mr_status mr_moe_weights_prepare(const mr_moe_runner *r, const mr_moe_problem *p, mr_moe_weights *w) {
    mr_moe_layout L;
    r->required_layout(p, &L);
    if (w->layout.gateup != MR_GATEUP_SEPARATE || w->prepared_by) {
        if (w->prepared_by == r && mr__moe_layout_equal(&w->layout, &L)) return MR_OK;
        return mr_error_set(MR_ESTATE, "weights are in the layout of runner %s, runner %s needs another",
                            w->layout.owner ? w->layout.owner : "?", r->name);
    }
    mr_status st = r->ops->after_load(r, p, w);
    if (st == MR_OK) w->prepared_by = r;
    return st;
}

void mr_moe_problem_local(const mr_moe_problem *p, int *first, int *n) {
    if (p->n_local > 0) {
        *first = p->local_first;
        *n = p->n_local;
    } else {
        *first = 0;
        *n = p->n_experts;
    }
}

void *mr__moe_ws_alloc(mr_moe_ctx *c, size_t n, size_t sz, mr_status *st) {
    size_t b;
    if (*st) return NULL;
    if (!mr_size_mul(n, sz, &b)) {
        *st = mr_error_set(MR_EOVERFLOW, "MoE workspace too large (%zu x %zu bytes)", n, sz);
        return NULL;
    }
    if (c->n_bufs == MR__MOE_MAX_BUFS) {
        *st = mr_error_set(MR_ECAPACITY, "MoE workspace: more than %d buffers", MR__MOE_MAX_BUFS);
        return NULL;
    }
    void *p = mr_aligned_alloc(64, b ? b : 64);
    if (!p) {
        *st = MR_ENOMEM;
        return NULL;
    }
    memset(p, 0, b ? b : 64); /* padding columns of the kernel inputs stay zero */
    c->bufs[c->n_bufs++] = p;
    c->ws_bytes += b;
    return p;
}

void mr_moe_ctx_free(mr_moe_ctx *c) {
    if (!c) return;
    if (c->a2a && c->a2a_state) c->a2a->close(c->a2a_state);
    if (c->rs && c->runner->ops->ctx_free) c->runner->ops->ctx_free(c);
    for (int i = 0; i < c->n_bufs; i++) mr_aligned_free(c->bufs[i]);
    mr_free(c);
}

size_t mr_moe_ctx_workspace_bytes(const mr_moe_ctx *c) { return c ? c->ws_bytes : 0; }

mr_probe_instr mr_moe_runner_instr(const mr_moe_runner *r, const mr_moe_problem *p) {
    return r->ops->instr ? r->ops->instr(p) : MR_PROBE_FMA;
}

mr_status mr_moe_ctx_new(const mr_moe_runner *r, const mr_moe_problem *p, int64_t max_T, mr_moe_ctx **out) {
    *out = NULL;
    char why[256];
    if (!r || !p) return mr_error_set(MR_EINVAL, "mr_moe_ctx_new: NULL runner or problem");
    if (!r->supports(p, why, sizeof why)) return mr_error_set(MR_EUNSUPPORTED, "%s", why);
    if (max_T < 1 || max_T > (1 << 20)) return mr_error_set(MR_EINVAL, "max_T must be in 1..2^20");
    int first, n_local;
    mr_moe_problem_local(p, &first, &n_local);
    const int R = p->ep_size > 0 ? p->ep_size : 1;
    if (first < 0 || n_local < 1 || first > p->n_experts - n_local || p->ep_rank < 0 || p->ep_rank >= R)
        return mr_error_set(MR_EINVAL, "local experts [%d, %d) or peer %d of %d do not fit %d experts", first,
                            first + n_local, p->ep_rank, R, p->n_experts);
    if (R > p->n_experts)
        return mr_error_set(MR_EINVAL, "%d peers for %d experts: every peer needs at least one expert", R,
                            p->n_experts);
    if (R > 1 && p->a2a != MR_A2A_NONE) { /* the placement is contiguous: the local range is this peer's share */
        int f, n;
        mr_moe_placement_contiguous(p->n_experts, R, p->ep_rank, &f, &n);
        if (f != first || n != n_local)
            return mr_error_set(MR_EINVAL,
                                "peer %d of %d holds experts [%d, %d) under the contiguous placement, not [%d, %d)",
                                p->ep_rank, R, f, f + n, first, first + n_local);
    }
    const mr_a2a_ops *t = mr_a2a_ops_get(p->a2a);
    if (!t)
        return mr_error_set(MR_EUNSUPPORTED, "a2a transport %s is not built into this binary", mr_a2a_name(p->a2a));

    mr_moe_ctx *c = mr_calloc(1, sizeof *c);
    if (!c) return MR_ENOMEM;
    mr_status st = MR_OK;
    c->runner = r;
    c->p = *p;
    c->p.ep_size = R;
    c->local_first = first;
    c->n_local = n_local;
    c->max_T = max_T;
    c->kern = mr_kernels_get();
    c->n_threads = omp_get_max_threads();
    r->required_layout(p, &c->layout);
    const size_t E = (size_t)p->n_experts, H = (size_t)p->hidden, Ip = (size_t)c->layout.inter_padded;
    c->max_rows = max_T * p->top_k; /* <= 2^20 * 32: no overflow */
    c->max_recv = c->max_rows * R;  /* every peer may send all its rows here */
    const size_t S = (size_t)c->max_rows;
    /* route */
    c->ids = mr__moe_ws_alloc(c, S, 4, &st);
    c->wts = mr__moe_ws_alloc(c, S, 4, &st);
    c->counts = mr__moe_ws_alloc(c, E, 4, &st);
    c->offsets = mr__moe_ws_alloc(c, E + 1, 4, &st);
    c->slot_of = mr__moe_ws_alloc(c, S, 4, &st);
    c->token_of = mr__moe_ws_alloc(c, S, 4, &st);
    c->pids = mr__moe_ws_alloc(c, S, 4, &st);
    c->row_expert = mr__moe_ws_alloc(c, S, 4, &st);
    c->peer_counts = mr__moe_ws_alloc(c, (size_t)R, sizeof(int64_t), &st);
    c->recv_per_expert = mr__moe_ws_alloc(c, (size_t)n_local, sizeof(int64_t), &st);
    /* placement: one physical copy per logical expert, contiguous */
    c->place_phys_of = mr__moe_ws_alloc(c, E, 4, &st);
    c->place_logical_of = mr__moe_ws_alloc(c, E, 4, &st);
    c->place_peer_of = mr__moe_ws_alloc(c, E, 4, &st);
    c->place_peer_first = mr__moe_ws_alloc(c, (size_t)R + 1, 4, &st);
    if (!st) {
        for (int e = 0; e < p->n_experts; e++) {
            c->place_phys_of[e] = c->place_logical_of[e] = e;
            c->place_peer_of[e] = R > 1 ? mr_moe_placement_owner(p->n_experts, R, e) : 0;
        }
        for (int q = 0; q <= R; q++) {
            int f = p->n_experts, n = 0;
            if (q < R) mr_moe_placement_contiguous(p->n_experts, R, q, &f, &n);
            c->place_peer_first[q] = f;
        }
        c->place = (mr_moe_placement){.n_logical = p->n_experts, .n_physical = p->n_experts, .n_peers = R,
                                      .phys_of = c->place_phys_of, .logical_of = c->place_logical_of,
                                      .peer_of = c->place_peer_of, .peer_first = c->place_peer_first};
        c->a2a_stats.n_local = n_local;
        c->a2a_stats.recv_per_expert = c->recv_per_expert;
    }
    /* results, and prepare / finalize scratch: a row of max(H, Ip) and one of H per thread */
    c->y = mr__moe_ws_alloc(c, S, H * 4, &st);
    c->tmp_stride = (int64_t)((2 * (H > Ip ? H : Ip) + 64 + 15) / 16 * 16);
    c->tmp = mr__moe_ws_alloc(c, (size_t)c->n_threads, (size_t)c->tmp_stride * 4, &st);
    /* the runner's state, then its rows */
    if (!st) st = r->ops->ctx_new(c);
    for (int i = 0; !st && i < c->rows.n_planes; i++)
        c->rows.plane[i].base = mr__moe_ws_alloc(c, S, c->rows.plane[i].row_bytes, &st);
    c->rows.n = 0;
    if (!st) st = t->open(&c->p, c->max_rows, &c->rows, &c->a2a_state);
    if (!st) c->a2a = t;
    if (st) {
        mr_moe_ctx_free(c); /* nothing of c is read after this */
        return st;
    }
    *out = c;
    return MR_OK;
}

mr_status mr_moe_ctx_prepare(mr_moe_ctx *c, mr_moe_weights *w) {
    if (!c || !w) return mr_error_set(MR_EINVAL, "mr_moe_ctx_prepare: NULL context or weights");
    const mr_moe_problem *p = &c->p;
    if (w->n_experts != c->n_local || w->expert_first != c->local_first || w->hidden != p->hidden ||
        w->inter != p->inter || w->fmt != p->weight_format)
        return mr_error_set(MR_EINVAL,
                            "weight set (experts [%d, %d), H %lld, I %lld) does not match the problem (experts [%d, "
                            "%d) of %d, H %lld, I %lld)",
                            w->expert_first, w->expert_first + w->n_experts, (long long)w->hidden, (long long)w->inter,
                            c->local_first, c->local_first + c->n_local, p->n_experts, (long long)p->hidden,
                            (long long)p->inter);
    mr_status st = mr_moe_weights_prepare(c->runner, p, w);
    if (st) return st;
    if ((st = mr_moe_weights_validate(w))) return st;
    if (p->act_mode == MR_ACT_W4A4) {
        float s13, s2;
        mr__moe_w4a4_scales(w, &s13, &s2);
        if (!(s13 > 0.0f) || !(s2 > 0.0f) || !isfinite(s13) || !isfinite(s2))
            return mr_error_set(MR_EINPUT, "w4a4 needs calibrated input_scale on every expert (gate/up %g, down %g)",
                                s13, s2);
    }
    return MR_OK;
}

void mr_moe_ctx_a2a_stats(mr_moe_ctx *c, mr_a2a_stats *out, bool reset) {
    if (out) *out = c->a2a_stats;
    if (reset) {
        const int n = c->a2a_stats.n_local;
        memset(&c->a2a_stats, 0, sizeof c->a2a_stats);
        memset(c->recv_per_expert, 0, (size_t)n * sizeof(int64_t));
        c->a2a_stats.n_local = n;
        c->a2a_stats.recv_per_expert = c->recv_per_expert;
    }
}

const mr_moe_placement *mr_moe_ctx_placement(const mr_moe_ctx *c) { return &c->place; }

void mr_moe_ctx_profile(mr_moe_ctx *c, mr_moe_profile *out, bool reset) {
    if (out) *out = c->prof;
    if (reset) memset(&c->prof, 0, sizeof c->prof);
}

void mr_moe_ctx_debug_stream_only(mr_moe_ctx *c, bool on) { c->stream_only = on; }
