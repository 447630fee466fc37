/* layer.c — one MoE layer call, phase by phase (moerun/moe.h):
 *
 *   route     the selection (precomputed, mr_route on the logits, or the
 *             runner's own) and the rows' order: T*k rows grouped by expert
 *   prepare   the runner writes each row's activation in its kernel form
 *   dispatch  the transport moves rows to the peers owning their experts
 *   experts   the runner computes each received row, unit weights, fp32
 *   combine   the transport brings the result rows back to their origin
 *   finalize  out[t] = sum_j w[t][j] * y[row of (t, j)], j in selection order
 *
 * The routing weight is applied in finalize only (or, for methods that
 * weight the input, in prepare), so the expert side never needs it and the
 * sum over a token's slots has one order wherever its experts ran. With
 * replicated inputs (every peer the same tokens) a peer is the origin of
 * its share of them only, and the transport gathers the shares' outputs.
 * Nothing here allocates: every buffer is the context's. */
#include <string.h>

#include "moe/moe_internal.h"

const float *mr__moe_token_row(const mr_moe_ctx *c, const mr_moe_args *a, int64_t t, float wt, float *row) {
    const int64_t H = c->p.hidden;
    const bool woi = mr_routing_weight_on_input(c->p.routing);
    if (c->p.act_dtype == MR_FMT_BF16) {
        const uint16_t *x = (const uint16_t *)a->x + t * H;
        for (int64_t i = 0; i < H; i++) row[i] = woi ? mr_bf16_to_f32(x[i]) * wt : mr_bf16_to_f32(x[i]);
        return row;
    }
    const float *x = (const float *)a->x + t * H;
    if (!woi) return x;
    for (int64_t i = 0; i < H; i++) row[i] = x[i] * wt;
    return row;
}

int mr__moe_expert_of_row(const int32_t *off, int n_local, int64_t r) {
    int lo = 0, hi = n_local - 1; /* the last e with off[e] <= r */
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (off[mid] <= r) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* ---- route ---- */
static mr_status check_routing(const mr_moe_ctx *c, const mr_moe_args *a) {
    if (!a->logits || !a->routing)
        return mr_error_set(MR_EINVAL, "runner %s needs %s", c->runner->name,
                            c->runner->routes_itself ? "router logits and the routing"
                                                     : "precomputed ids and weights, or router logits and the routing");
    if (a->routing->method != c->p.routing || a->routing->n_experts != c->p.n_experts ||
        a->routing->top_k != c->p.top_k)
        return mr_error_set(MR_EINVAL, "routing does not match the problem the context was made for");
    return MR_OK;
}

/* The selection of all a->T tokens into (*ids, *wts), then the rows' order
 * for the origin's share [t0, t0 + Tn) of them: the physical expert of each
 * (token, slot), counts, offsets, slot_of, token_of (relative to the
 * share), row_expert and the rows per destination peer. */
static mr_status phase_route(mr_moe_ctx *c, const mr_moe_args *a, int64_t t0, int64_t Tn, const int32_t **ids,
                             const float **wts) {
    const int k = c->p.top_k, E = c->p.n_experts;
    const int64_t S = a->T * k;
    mr_status st;
    if (c->runner->routes_itself) {
        if ((st = check_routing(c, a))) return st;
        if ((st = c->runner->ops->route(c, a))) return st;
        *ids = c->ids, *wts = c->wts;
    } else if (a->ids && a->weights) {
        for (int64_t i = 0; i < S; i++)
            if (a->ids[i] < 0 || a->ids[i] >= E)
                return mr_error_set(MR_EINPUT, "token %lld choice %d: expert id %d out of [0,%d)", (long long)(i / k),
                                    (int)(i % k), a->ids[i], E);
        *ids = a->ids, *wts = a->weights;
    } else {
        if ((st = check_routing(c, a))) return st;
        if ((st = mr_route(a->routing, a->logits, a->T, c->ids, c->wts))) return st;
        *ids = c->ids, *wts = c->wts;
    }
    if (a->ids_out && a->ids_out != *ids) memcpy(a->ids_out, *ids, (size_t)S * sizeof(int32_t));
    if (a->weights_out && a->weights_out != *wts) memcpy(a->weights_out, *wts, (size_t)S * sizeof(float));
    /* the share's rows, by physical expert (grouped by owning peer: each peer's experts are contiguous) */
    const mr_moe_placement *pl = &c->place;
    const int64_t Sn = Tn * k;
    for (int64_t i = 0; i < Sn; i++) c->pids[i] = pl->phys_of[(*ids)[t0 * k + i]];
    mr_permutation perm = {c->counts, c->offsets, c->slot_of, c->token_of};
    if ((st = mr_permutation_build(c->pids, Tn, k, pl->n_physical, &perm))) return st;
    const int R = c->p.ep_size;
    for (int r = 0; r < R; r++) c->peer_counts[r] = 0;
    for (int e = 0; e < pl->n_physical; e++) {
        for (int32_t r = c->offsets[e]; r < c->offsets[e + 1]; r++) c->row_expert[r] = e;
        c->peer_counts[pl->peer_of[e]] += c->counts[e];
    }
    return MR_OK;
}

/* ---- dispatch / combine / gather through the transport ---- */
static mr_status phase_dispatch(mr_moe_ctx *c, int64_t Tn, bool replicated, int64_t T_total) {
    mr_a2a_xfer *x = &c->xfer;
    x->n_peers = c->p.ep_size;
    x->place = &c->place;
    x->T = Tn;
    x->replicated = replicated;
    x->T_total = replicated ? T_total : Tn;
    x->send_counts = c->peer_counts;
    x->send_expert = c->row_expert;
    x->send_slot = c->token_of;
    x->send = c->rows;
    x->send.n = Tn * c->p.top_k;
    x->H = c->p.hidden;
    /* identity defaults (what `none` keeps): the origin's rows, offsets and result buffer */
    x->recv = x->send;
    x->recv_offsets = c->offsets + c->local_first;
    x->y_recv = c->y;
    x->y_send = c->y;
    x->bytes_sent = 0;
    x->row_wire_bytes = 0;
    return c->a2a->dispatch(c->a2a_state, x);
}

static mr_status phase_combine(mr_moe_ctx *c) {
    c->xfer.bytes_sent = 0;
    return c->a2a->combine(c->a2a_state, &c->xfer);
}

/* ---- finalize: each token's k result rows, weighted, in selection order ---- */
/* token t: the sum of its k result rows, each times its weight, in slot order */
static void finalize_token(const mr_moe_ctx *c, const mr_moe_args *a, const float *wts, const float *y, int64_t t,
                           float *row) {
    const int k = c->p.top_k;
    const int64_t H = c->p.hidden;
    const bool woi = mr_routing_weight_on_input(c->p.routing), bf = c->p.act_dtype == MR_FMT_BF16;
    float *dst = bf ? row : (float *)a->out + t * H;
    for (int j = 0; j < k; j++) {
        const float wt = woi ? 1.0f : wts[t * k + j];
        const float *yr = y + (size_t)c->slot_of[t * k + j] * (size_t)H;
        if (j == 0)
            for (int64_t n = 0; n < H; n++) dst[n] = wt * yr[n];
        else
            for (int64_t n = 0; n < H; n++) dst[n] += wt * yr[n];
    }
    if (bf)
        for (int64_t n = 0; n < H; n++) ((uint16_t *)a->out)[t * H + n] = mr_f32_to_bf16(row[n]);
}

static void phase_finalize(mr_moe_ctx *c, const mr_moe_args *a, const float *wts, const float *y) {
    const int64_t T = a->T;
    const uint64_t t0 = mr_now_ns();
    if (T * c->p.top_k * c->p.hidden < MR__MOE_PAR_MIN) { /* decode sizes: no parallel region at all */
        for (int64_t t = 0; t < T; t++) finalize_token(c, a, wts, y, t, c->tmp);
        c->prof.busy_ns[MR_MOE_PH_REDUCE] += mr_now_ns() - t0;
        return;
    }
    uint64_t busy = 0;
#pragma omp parallel num_threads(mr__moe_threads(c)) reduction(+ : busy)
    {
        const uint64_t tb = mr_now_ns();
        float *row = c->tmp + (size_t)c->tmp_stride * (size_t)omp_get_thread_num();
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; t++) finalize_token(c, a, wts, y, t, row);
        busy += mr_now_ns() - tb;
    }
    c->prof.busy_ns[MR_MOE_PH_REDUCE] += busy;
}

mr_status mr_moe_run(mr_moe_ctx *c, const mr_moe_weights *w, const mr_moe_args *a) {
    if (!c || !w || !a) return mr_error_set(MR_EINVAL, "mr_moe_run: NULL context, weights or args");
    /* the layout is checked at dispatch, never inferred from a runner name */
    if (w->prepared_by != c->runner || !mr__moe_layout_equal(&w->layout, &c->layout))
        return mr_error_set(MR_ESTATE, "runner %s needs its own weight layout, but the weights are in the layout of %s",
                            c->runner->name, w->layout.owner ? w->layout.owner : "nobody");
    if (w->n_experts != c->n_local || w->expert_first != c->local_first)
        return mr_error_set(MR_EINVAL, "weight set holds experts [%d, %d), the context computes [%d, %d)",
                            w->expert_first, w->expert_first + w->n_experts, c->local_first,
                            c->local_first + c->n_local);
    /* T = 0: a peer with no token of its own still takes part in the exchange */
    const int R = c->p.ep_size;
    const int64_t min_T = R > 1 ? 0 : 1;
    if (a->T < min_T || a->T > c->max_T)
        return mr_error_set(MR_EINVAL, "T %lld out of range %lld..%lld", (long long)a->T, (long long)min_T,
                            (long long)c->max_T);
    if (!a->x || !a->out) return mr_error_set(MR_EINVAL, "mr_moe_run: x and out are required");
    const bool replicated = a->replicated && R > 1;
    if (replicated && !c->a2a->gather)
        return mr_error_set(MR_EUNSUPPORTED, "a2a transport %s cannot gather replicated outputs", c->a2a->name);
    /* the origin's share of the tokens: all of them, or its slice of a replicated batch */
    int64_t t0 = 0, Tn = a->T;
    if (replicated) mr_moe_share(a->T, R, c->p.ep_rank, &t0, &Tn);
    const size_t esz = c->p.act_dtype == MR_FMT_BF16 ? 2 : 4, row_bytes = (size_t)c->p.hidden * esz;
    mr_moe_args sh = *a; /* the share's view of the caller's buffers */
    sh.T = Tn;
    sh.x = (const char *)a->x + (size_t)t0 * row_bytes;
    sh.out = (char *)a->out + (size_t)t0 * row_bytes;
    uint64_t t[8];
    const int32_t *ids = NULL;
    const float *wts = NULL;
    t[0] = mr_now_ns();
    mr_status st = phase_route(c, a, t0, Tn, &ids, &wts); /* selection + the share's rows grouped by expert */
    if (st) return st;
    wts += t0 * c->p.top_k;
    t[1] = mr_now_ns();
    c->runner->ops->prepare(c, w, &sh, wts); /* activations in the kernel form, one row per (token, slot) */
    t[2] = mr_now_ns();
    if ((st = phase_dispatch(c, Tn, replicated, a->T))) return st; /* rows to the peers owning their experts */
    t[3] = mr_now_ns();
    mr_a2a_stats *as = &c->a2a_stats;
    as->dispatch_bytes += c->xfer.bytes_sent;
    as->rows_sent += Tn * c->p.top_k;
    as->rows_recv += as->last_rows_recv = c->xfer.recv.n;
    as->row_wire_bytes = c->xfer.row_wire_bytes;
    for (int e = 0; e < c->n_local; e++) c->recv_per_expert[e] += c->xfer.recv_offsets[e + 1] - c->xfer.recv_offsets[e];
    const uint64_t split = c->prof.wall_ns[MR_MOE_PH_GEMM1] + c->prof.wall_ns[MR_MOE_PH_GEMM2];
    if ((st = c->runner->ops->experts(c, w, &c->xfer))) return st; /* unit weights, fp32 rows */
    t[4] = mr_now_ns();
    /* a runner that does not time GEMM1 and GEMM2 apart: the whole phase counts as GEMM1 */
    if (c->prof.wall_ns[MR_MOE_PH_GEMM1] + c->prof.wall_ns[MR_MOE_PH_GEMM2] == split)
        c->prof.wall_ns[MR_MOE_PH_GEMM1] += t[4] - t[3];
    if ((st = phase_combine(c))) return st; /* result rows back to their origin */
    t[5] = mr_now_ns();
    as->combine_bytes += c->xfer.bytes_sent;
    phase_finalize(c, &sh, wts, c->xfer.y_send); /* weighted sum over the k slots, slot order */
    t[6] = mr_now_ns();
    if (replicated) { /* every peer's share into every peer's out */
        c->xfer.bytes_sent = 0;
        if ((st = c->a2a->gather(c->a2a_state, &c->xfer, a->out, a->T, row_bytes))) return st;
        as->gather_bytes += c->xfer.bytes_sent;
    }
    t[7] = mr_now_ns();
    as->calls++;
    as->dispatch_ns += t[3] - t[2];
    as->combine_ns += t[5] - t[4];
    as->gather_ns += t[7] - t[6];
    c->prof.calls++;
    c->prof.n_threads = mr__moe_threads(c);
    c->prof.wall_ns[MR_MOE_PH_SETUP] += t[1] - t[0];
    c->prof.busy_ns[MR_MOE_PH_SETUP] += t[1] - t[0];
    c->prof.wall_ns[MR_MOE_PH_PREP] += t[2] - t[1];
    c->prof.wall_ns[MR_MOE_PH_A2A] += (t[3] - t[2]) + (t[5] - t[4]) + (t[7] - t[6]);
    c->prof.busy_ns[MR_MOE_PH_A2A] += (t[3] - t[2]) + (t[5] - t[4]) + (t[7] - t[6]);
    c->prof.wall_ns[MR_MOE_PH_REDUCE] += t[6] - t[5];
    return MR_OK;
}
