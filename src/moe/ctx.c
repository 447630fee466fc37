/* ctx.c — the MoE run context: capability check, the chosen runner's
 * after-load, the workspace (allocated once for max_T tokens so that the
 * per-call path never allocates), the layout check at dispatch and the
 * test-only mutation switch. */
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
    *s13 = a;
    *s2 = b;
}

mr_status mr_moe_weights_prepare(const mr_moe_runner *r, const mr_moe_problem *p, mr_moe_weights *w) {
    mr_moe_layout L;
    r->required_layout(p, &L);
    if (w->layout.gateup != MR_GATEUP_SEPARATE) {
        if (mr__moe_layout_equal(&w->layout, &L)) return MR_OK;
        return mr_error_set(MR_ESTATE, "weights are in the layout of runner %s, runner %s needs another",
                            w->layout.owner, r->name);
    }
    return r->ops->after_load(p, w);
}

void mr_moe_ctx_free(mr_moe_ctx *c) {
    if (!c) return;
    mr_free(c->counts);
    mr_free(c->offsets);
    mr_free(c->slot_of);
    mr_free(c->token_of);
    mr_free(c->ids);
    mr_free(c->wts);
    mr_aligned_free(c->xq);
    mr_free(c->xs);
    mr_aligned_free(c->hq);
    mr_free(c->hs);
    mr_aligned_free(c->yslot);
    mr_aligned_free(c->tmp);
    mr_free(c->tasks);
    mr_aligned_free((void *)c->ranges);
    mr_aligned_free(c->x1);
    mr_aligned_free(c->x2);
    mr_aligned_free(c->xs1);
    mr_aligned_free(c->xs2);
    mr_aligned_free(c->xb1);
    mr_aligned_free(c->xb2);
    mr_free(c);
}

static _Thread_local size_t ws_total; /* bytes ws_alloc handed out since mr_moe_ctx_new started */

/* n elements of sz bytes, overflow-checked, 64-byte aligned */
static void *ws_alloc(size_t n, size_t sz, mr_status *st) {
    size_t b;
    if (*st) return NULL;
    if (!mr_size_mul(n, sz, &b)) {
        *st = mr_error_set(MR_EOVERFLOW, "MoE workspace too large");
        return NULL;
    }
    void *p = mr_aligned_alloc(64, b ? b : 64);
    if (!p) *st = MR_ENOMEM;
    else ws_total += b;
    return p;
}

size_t mr_moe_ctx_workspace_bytes(const mr_moe_ctx *c) { return c ? c->ws_bytes : 0; }

mr_status mr_moe_ctx_new(const mr_moe_runner *r, const mr_moe_problem *p, mr_moe_weights *w, int64_t max_T,
                         mr_moe_ctx **out) {
    *out = NULL;
    char why[256];
    if (!r->supports(p, why, sizeof why)) return mr_error_set(MR_EUNSUPPORTED, "%s", why);
    if (w->n_experts != p->n_experts || w->hidden != p->hidden || w->inter != p->inter || w->fmt != p->weight_format)
        return mr_error_set(MR_EINVAL, "weight set (E %d, H %lld, I %lld) does not match the problem (E %d, H %lld, I %lld)",
                            w->n_experts, (long long)w->hidden, (long long)w->inter, p->n_experts,
                            (long long)p->hidden, (long long)p->inter);
    if (max_T < 1 || max_T > (1 << 20)) return mr_error_set(MR_EINVAL, "max_T must be in 1..2^20");
    mr_status st = mr_moe_weights_prepare(r, p, w);
    if (st) return st;
    if ((st = mr_moe_weights_validate(w))) return st;

    mr_moe_ctx *c = mr_calloc(1, sizeof *c);
    if (!c) return MR_ENOMEM;
    ws_total = 0;
    c->runner = r;
    c->p = *p;
    c->w = w;
    c->max_T = max_T;
    c->kern = mr_kernels_get();
    r->required_layout(p, &c->layout);
    if (p->act_mode == MR_ACT_W4A4) {
        float s13, s2;
        mr__moe_w4a4_scales(w, &s13, &s2);
        if (!(s13 > 0.0f) || !(s2 > 0.0f) || !isfinite(s13) || !isfinite(s2)) {
            st = mr_error_set(MR_EINPUT, "w4a4 needs calibrated input_scale on every expert (gate/up %g, down %g)",
                              s13, s2);
            goto out;
        }
        c->s13 = s13;
        c->s2 = s2;
    }
    const size_t E = (size_t)p->n_experts, k = (size_t)p->top_k, H = (size_t)p->hidden;
    const size_t Ip = (size_t)c->layout.inter_padded, I = (size_t)p->inter;
    size_t S;
    if (!mr_size_mul((size_t)max_T, k, &S)) {
        st = mr_error_set(MR_EOVERFLOW, "max_T * k overflows");
        goto out;
    }
    c->n_threads = omp_get_max_threads();
    c->counts = ws_alloc(E, 4, &st);
    c->offsets = ws_alloc(E + 1, 4, &st);
    c->slot_of = ws_alloc(S, 4, &st);
    c->token_of = ws_alloc(S, 4, &st);
    c->ids = ws_alloc(S, 4, &st);
    c->wts = ws_alloc(S, 4, &st);
    size_t GH = (H + 127) / 128, GI = (Ip + 127) / 128;
    size_t SH = 0, SI = 0;
    if (!mr_size_mul(S, H, &SH) || !mr_size_mul(S, Ip, &SI)) st = mr_error_set(MR_EOVERFLOW, "workspace overflows");
    if (c->layout.pack != MR_PACK_NONE) {
        if (!st) st = mr__moe_packed_ws(c);
    } else if (strcmp(r->name, "reference") != 0) {
        c->xq = ws_alloc(SH, 4, &st);
        c->xs = ws_alloc(S, GH * 4, &st);
        c->hq = ws_alloc(SI, 4, &st);
        c->hs = ws_alloc(S, GI * 4, &st);
        c->yslot = ws_alloc(SH, 4, &st);
        size_t nb = (Ip + 127) / 128 > (H + 63) / 64 ? (Ip + 127) / 128 : (H + 63) / 64;
        c->tasks = ws_alloc(E * nb, 4, &st);
    }
    /* per thread: gate, up chunk [64][128] each, y chunk [64][64], rows of H and I */
    size_t core = 64 * 128 * 2 + 64 * 64 + 2 * H + 2 * Ip + 256;
    /* packed path: gate, up [128][128], y [128][64], a row of max(H, Ip), kernel scratch */
    size_t packed = 128 * 128 * 2 + 128 * MR__MOE_CB2 + (H > Ip ? H : Ip) + 64 + MR_UK_SCRATCH / 4 + 16;
    if (packed > core) core = packed;
    size_t ref = 5 * H + 3 * I + 256;
    c->tmp_stride = (int64_t)((core > ref ? core : ref) + 15) / 16 * 16;
    c->tmp = ws_alloc((size_t)c->n_threads, (size_t)c->tmp_stride * 4, &st);
    c->ranges = ws_alloc((size_t)c->n_threads * 2, MR__MOE_RSTRIDE * sizeof(uint64_t), &st);
out:
    if (st) {
        mr_moe_ctx_free(c); /* nothing of c is read after this */
        return st;
    }
    c->ws_bytes = ws_total;
    *out = c;
    return MR_OK;
}

mr_status mr_moe_run(mr_moe_ctx *c, const mr_moe_args *a) {
    if (!c || !a) return mr_error_set(MR_EINVAL, "mr_moe_run: NULL context or args");
    /* the layout is checked at dispatch, never inferred from a runner name */
    if (!mr__moe_layout_equal(&c->w->layout, &c->layout))
        return mr_error_set(MR_ESTATE, "runner %s needs its own weight layout, but the weights are in the layout of %s",
                            c->runner->name, c->w->layout.owner ? c->w->layout.owner : "nobody");
    if (a->T < 1 || a->T > c->max_T)
        return mr_error_set(MR_EINVAL, "T %lld out of range 1..%lld", (long long)a->T, (long long)c->max_T);
    if (!a->x || !a->out) return mr_error_set(MR_EINVAL, "mr_moe_run: x and out are required");
    if (c->runner->routes_itself) {
        if (!a->logits || !a->routing) return mr_error_set(MR_EINVAL, "runner %s needs router logits and the routing", c->runner->name);
        if (a->routing->method != c->p.routing || a->routing->n_experts != c->p.n_experts || a->routing->top_k != c->p.top_k)
            return mr_error_set(MR_EINVAL, "routing does not match the problem the context was made for");
    } else if (!a->ids || !a->weights) {
        return mr_error_set(MR_EINVAL, "runner %s needs precomputed ids and weights", c->runner->name);
    }
    return c->runner->ops->run(c, a);
}

void mr_moe_ctx_profile(mr_moe_ctx *c, mr_moe_profile *out, bool reset) {
    if (out) *out = c->prof;
    if (reset) memset(&c->prof, 0, sizeof c->prof);
}

void mr_moe_ctx_debug_stream_only(mr_moe_ctx *c, bool on) { c->stream_only = on; }

/* workspace of the packed path (expert_packed.c): rows of kernel input for
 * every slot, zeroed once so that the padding columns [n, Kp) stay 0 */
mr_status mr__moe_packed_ws(mr_moe_ctx *c) {
    const mr_moe_problem *p = &c->p;
    const mr_act_mode m = p->act_mode;
    const int64_t unit = p->weight_format == MR_FMT_FP8_BLOCK ? 128 : p->weight_format == MR_FMT_NVFP4 ? 16 : 2;
    const int64_t Ip = c->layout.inter_padded, H = p->hidden;
    c->ld1 = (H + unit - 1) / unit * unit;
    c->ld2 = (Ip + unit - 1) / unit * unit;
    /* per-block multipliers: per 16 (nvfp4) or per 128, at least one per 128 for the generic preparation */
    c->nxs1 = mr__act_uk_block(m) == 16 ? c->ld1 / 16 : (c->ld1 + 127) / 128;
    c->nxs2 = mr__act_uk_block(m) == 16 ? c->ld2 / 16 : (c->ld2 + 127) / 128;
    const size_t S = (size_t)c->max_T * (size_t)p->top_k, es = (size_t)mr__act_uk_esize(m);
    mr_status st = MR_OK;
    size_t n1, n2;
    if (!mr_size_mul(S, (size_t)c->ld1, &n1) || !mr_size_mul(S, (size_t)c->ld2, &n2))
        return mr_error_set(MR_EOVERFLOW, "MoE workspace too large");
    c->x1 = ws_alloc(n1, es, &st);
    c->x2 = ws_alloc(n2, es, &st);
    c->xs1 = ws_alloc(S, (size_t)c->nxs1 * 4, &st);
    c->xs2 = ws_alloc(S, (size_t)c->nxs2 * 4, &st);
    c->xb1 = ws_alloc(S, (size_t)(c->ld1 / 16 + 1) * 4, &st);
    c->xb2 = ws_alloc(S, (size_t)(c->ld2 / 16 + 1) * 4, &st);
    c->yslot = ws_alloc(S, (size_t)H * 4, &st);
    const size_t E = (size_t)p->n_experts;
    size_t nb1 = (size_t)(Ip + 127) / 128, nb2 = (size_t)(H + 63) / 64;
    c->tasks = ws_alloc(E, (nb1 > nb2 ? nb1 : nb2) * 4, &st);
    if (st) return st;
    memset(c->x1, 0, n1 * es);
    memset(c->x2, 0, n2 * es);
    memset(c->xs1, 0, S * (size_t)c->nxs1 * 4);
    memset(c->xs2, 0, S * (size_t)c->nxs2 * 4);
    memset(c->xb1, 0, S * (size_t)(c->ld1 / 16 + 1) * 4);
    memset(c->xb2, 0, S * (size_t)(c->ld2 / 16 + 1) * 4);
    return MR_OK;
}
