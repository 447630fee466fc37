/* weights.c — expert weight sets: allocation, deep copy, validation, W4A4
 * calibration and the after-load conversions into a runner's layout
 * (gate/up concat or interleave, padding I; see mr_moe_layout). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "moe/moe_internal.h"

static mr_status alloc_set(mr_qmatrix **m, int E) {
    *m = mr_calloc((size_t)E, sizeof(mr_qmatrix));
    return *m ? MR_OK : MR_ENOMEM;
}

mr_status mr_moe_weights_new(mr_moe_weights **out, int E, int64_t H, int64_t I, mr_format fmt) {
    *out = NULL;
    if (E < 1 || H < 1 || I < 1) return mr_error_set(MR_EINVAL, "expert set needs E, H, I >= 1 (got %d, %lld, %lld)", E,
                                                     (long long)H, (long long)I);
    mr_moe_weights *w = mr_calloc(1, sizeof *w);
    if (!w) return MR_ENOMEM;
    w->n_experts = E;
    w->hidden = H;
    w->inter = I;
    w->fmt = fmt;
    w->layout.gateup = MR_GATEUP_SEPARATE;
    w->layout.inter_padded = I;
    w->layout.owner = "checkpoint";
    if (alloc_set(&w->w1, E) || alloc_set(&w->w3, E) || alloc_set(&w->w2, E)) {
        mr_moe_weights_free(w);
        return MR_ENOMEM;
    }
    *out = w;
    return MR_OK;
}

void mr_moe_weights_free(mr_moe_weights *w) {
    if (!w) return;
    if (w->runner_data && w->prepared_by && w->prepared_by->ops->weights_release) w->prepared_by->ops->weights_release(w);
    for (int e = 0; e < w->n_experts; e++) {
        if (w->w1) mr_qmatrix_free(&w->w1[e]);
        if (w->w3) mr_qmatrix_free(&w->w3[e]);
        if (w->w2) mr_qmatrix_free(&w->w2[e]);
        if (w->w13) mr_qmatrix_free(&w->w13[e]);
        if (w->p13) mr_pmatrix_free(&w->p13[e]);
        if (w->p2) mr_pmatrix_free(&w->p2[e]);
    }
    mr_free(w->p13);
    mr_free(w->p2);
    mr_free(w->w1);
    mr_free(w->w3);
    mr_free(w->w2);
    mr_free(w->w13);
    mr_free(w);
}

/* Byte sizes of data and scale of a [rows][cols] matrix in fmt (checked;
 * what a format stores is formats/' traits). */
static mr_status qm_sizes(mr_format fmt, int64_t rows, int64_t cols, size_t *data, size_t *scale) {
    if (fmt == MR_FMT_NVFP4 && cols % 16)
        return mr_error_set(MR_EINVAL, "nvfp4 matrix needs cols %% 16 == 0 (got %lld)", (long long)cols);
    return mr_qmatrix_sizes(fmt, rows, cols, data, scale);
}

/* Allocates an owned, zero-filled matrix. */
static mr_status qm_alloc(mr_qmatrix *m, mr_format fmt, int64_t rows, int64_t cols) {
    return mr_qmatrix_alloc(m, fmt, rows, cols);
}

static mr_status qm_clone(const mr_qmatrix *src, mr_qmatrix *dst) {
    memset(dst, 0, sizeof *dst);
    if (!src->data) return MR_OK;
    mr_status st = qm_alloc(dst, src->fmt, src->rows, src->cols);
    if (st) return st;
    size_t d = 0, s = 0;
    qm_sizes(src->fmt, src->rows, src->cols, &d, &s);
    memcpy(dst->data, src->data, d);
    if (s) memcpy(dst->scale, src->scale, s);
    dst->scale2 = src->scale2;
    dst->input_scale = src->input_scale;
    return MR_OK;
}

mr_status mr_moe_weights_clone(const mr_moe_weights *src, mr_moe_weights **out) {
    mr_moe_weights *w;
    if (src->runner_data)
        return mr_error_set(MR_EUNSUPPORTED, "the weights live in runner %s's own memory and cannot be copied",
                            src->prepared_by ? src->prepared_by->name : "?");
    mr_status st = mr_moe_weights_new(&w, src->n_experts, src->hidden, src->inter, src->fmt);
    if (st) return st;
    w->layout = src->layout;
    w->expert_first = src->expert_first;
    w->in_scale13 = src->in_scale13;
    w->in_scale2 = src->in_scale2;
    w->prepared_by = src->prepared_by;
    if (src->w13 && !(w->w13 = mr_calloc((size_t)src->n_experts, sizeof(mr_qmatrix)))) st = MR_ENOMEM;
    if (!st && src->p13 && !(w->p13 = mr_calloc((size_t)src->n_experts, sizeof(mr_pmatrix)))) st = MR_ENOMEM;
    if (!st && src->p2 && !(w->p2 = mr_calloc((size_t)src->n_experts, sizeof(mr_pmatrix)))) st = MR_ENOMEM;
    for (int e = 0; !st && e < src->n_experts; e++) {
        st = qm_clone(&src->w1[e], &w->w1[e]);
        if (!st) st = qm_clone(&src->w3[e], &w->w3[e]);
        if (!st) st = qm_clone(&src->w2[e], &w->w2[e]);
        if (!st && src->w13) st = qm_clone(&src->w13[e], &w->w13[e]);
        if (!st && src->p13) st = mr_pmatrix_clone(&src->p13[e], &w->p13[e]);
        if (!st && src->p2) st = mr_pmatrix_clone(&src->p2[e], &w->p2[e]);
    }
    if (st) {
        mr_moe_weights_free(w);
        return st;
    }
    *out = w;
    return MR_OK;
}

static mr_status check_qm(const mr_qmatrix *m, mr_format fmt, int64_t rows, int64_t cols, const char *what, int e) {
    if (!m->data) return mr_error_set(MR_EINVAL, "expert %d: %s is missing", e, what);
    if (m->fmt != fmt || m->rows != rows || m->cols != cols)
        return mr_error_set(MR_EINVAL, "expert %d: %s is %s [%lld][%lld], expected %s [%lld][%lld]", e, what,
                            mr_format_traits_get(m->fmt) ? mr_format_traits_get(m->fmt)->name : "?",
                            (long long)m->rows, (long long)m->cols,
                            mr_format_traits_get(fmt) ? mr_format_traits_get(fmt)->name : "?", (long long)rows,
                            (long long)cols);
    if ((fmt == MR_FMT_FP8_BLOCK || fmt == MR_FMT_NVFP4) && !m->scale)
        return mr_error_set(MR_EINVAL, "expert %d: %s has no scales", e, what);
    return MR_OK;
}

static mr_status check_pm(const mr_pmatrix *m, int pack, int nsrc, int64_t rows, int64_t cols, const char *what, int e) {
    if (!m->data) return mr_error_set(MR_EINVAL, "expert %d: packed %s is missing", e, what);
    if ((int)m->pack != pack || m->nsrc != nsrc || m->src_rows != rows || m->cols != cols)
        return mr_error_set(MR_EINVAL, "expert %d: packed %s is %s x%d [%lld][%lld], expected %s x%d [%lld][%lld]", e,
                            what, mr_pack_name(m->pack), m->nsrc, (long long)m->src_rows, (long long)m->cols,
                            mr_pack_name((mr_pack_id)pack), nsrc, (long long)rows, (long long)cols);
    return MR_OK;
}

size_t mr_moe_weights_expert_bytes(const mr_moe_weights *w) {
    if (w->layout.pack != MR_PACK_NONE && w->p13 && w->p2) return mr_pmatrix_bytes(&w->p13[0]) + mr_pmatrix_bytes(&w->p2[0]);
    size_t b = mr_qmatrix_bytes(&w->w2[0]);
    if (w->w13 && w->w13[0].data) return b + mr_qmatrix_bytes(&w->w13[0]);
    return b + mr_qmatrix_bytes(&w->w1[0]) + mr_qmatrix_bytes(&w->w3[0]);
}

mr_status mr_moe_weights_validate(const mr_moe_weights *w) {
    if (w->layout.pack != MR_PACK_NONE) {
        if (!w->p13 || !w->p2) return mr_error_set(MR_EINVAL, "packed layout without packed matrices");
        for (int e = 0; e < w->n_experts; e++) {
            mr_status st;
            if ((st = check_pm(&w->p13[e], w->layout.pack, 2, w->inter, w->hidden, "w13 (gate/up)", e))) return st;
            if ((st = check_pm(&w->p2[e], w->layout.pack, 1, w->hidden, w->inter, "w2 (down)", e))) return st;
        }
        return MR_OK;
    }
    for (int e = 0; e < w->n_experts; e++) {
        mr_status st;
        if (w->layout.gateup == MR_GATEUP_SEPARATE) {
            if ((st = check_qm(&w->w1[e], w->fmt, w->inter, w->hidden, "w1 (gate)", e))) return st;
            if ((st = check_qm(&w->w3[e], w->fmt, w->inter, w->hidden, "w3 (up)", e))) return st;
        } else if ((st = check_qm(&w->w13[e], w->fmt, 2 * w->layout.inter_padded, w->hidden, "w13", e)))
            return st;
        if ((st = check_qm(&w->w2[e], w->fmt, w->hidden, w->inter, "w2 (down)", e))) return st;
    }
    return MR_OK;
}

mr_status mr_moe_weights_calibrate(mr_moe_weights *w, const float *x, int64_t T) {
    if (w->layout.gateup != MR_GATEUP_SEPARATE)
        return mr_error_set(MR_ESTATE, "calibrate before the after-load step (HF layout needed)");
    mr_status st = mr_moe_weights_validate(w);
    if (st) return st;
    const int64_t H = w->hidden, I = w->inter;
    float ax = 0.0f, ah = 0.0f;
    for (int64_t i = 0; i < T * H; i++) ax = fmaxf(ax, fabsf(x[i]));
    float *row = mr_malloc((size_t)H * sizeof(float) * 2);
    if (!row) return MR_ENOMEM;
    for (int e = 0; e < w->n_experts; e++)
        for (int64_t i = 0; i < I; i++) {
            mr_qmatrix_dequant_row(&w->w1[e], i, row);
            mr_qmatrix_dequant_row(&w->w3[e], i, row + H);
            for (int64_t t = 0; t < T; t++) {
                double g = 0, u = 0;
                for (int64_t c = 0; c < H; c++) {
                    g += (double)row[c] * x[t * H + c];
                    u += (double)row[H + c] * x[t * H + c];
                }
                ah = fmaxf(ah, fabsf(mr__silu((float)g) * (float)u));
            }
        }
    mr_free(row);
    for (int e = 0; e < w->n_experts; e++) {
        w->w1[e].input_scale = w->w3[e].input_scale = ax / 2688.0f;
        w->w2[e].input_scale = ah / 2688.0f;
    }
    return MR_OK;
}

/* Ends an after-load step: on failure the set is marked unusable (nothing
 * half-converted is ever dispatched), else it takes the layout L. */
static mr_status finish_after_load(mr_moe_weights *w, const mr_moe_layout *L, mr_status st) {
    if (st) {
        w->layout.owner = "broken";
        w->layout.gateup = MR_GATEUP_CONCAT;
        w->layout.inter_padded = -1;
        return st;
    }
    w->layout = *L;
    return MR_OK;
}

/* Frees one HF matrix once its converted copy exists (keeps peak memory
 * down); the set's release_source hook gives its source pages back first. */
static void drop_hf(mr_moe_weights *w, mr_qmatrix *m) {
    if (w->release_source && m->data) w->release_source(w->release_user, m);
    mr_qmatrix_free(m);
    memset(m, 0, sizeof *m);
}

/* ---- after-load: merge w1/w3 into w13 in the required layout ----
 * Row r of the result takes row src_row(r) of gate or up; rows beyond I
 * (padding) stay zero (zero codes and, for FP8, zero scales: exactly 0). */
static int64_t merged_row_source(const mr_moe_layout *L, int64_t r, int *is_up) {
    int64_t Ip = L->inter_padded;
    if (L->gateup == MR_GATEUP_CONCAT) {
        *is_up = r >= Ip;
        return *is_up ? r - Ip : r;
    }
    int64_t R = L->interleave_rows, blk = r / (2 * R), off = r % (2 * R);
    *is_up = off >= R;
    return blk * R + (off % R);
}

static void copy_row(const mr_qmatrix *src, int64_t sr, mr_qmatrix *dst, int64_t dr) {
    int64_t K = src->cols;
    switch (src->fmt) {
    case MR_FMT_F32: memcpy((float *)dst->data + dr * K, (const float *)src->data + sr * K, (size_t)K * 4); break;
    case MR_FMT_BF16: memcpy((uint16_t *)dst->data + dr * K, (const uint16_t *)src->data + sr * K, (size_t)K * 2); break;
    case MR_FMT_FP8_BLOCK: memcpy((uint8_t *)dst->data + dr * K, (const uint8_t *)src->data + sr * K, (size_t)K); break;
    case MR_FMT_NVFP4:
        memcpy((uint8_t *)dst->data + dr * (K / 2), (const uint8_t *)src->data + sr * (K / 2), (size_t)K / 2);
        memcpy((uint8_t *)dst->scale + dr * (K / 16), (const uint8_t *)src->scale + sr * (K / 16), (size_t)K / 16);
        break;
    default: MR_ASSERT(!"format");
    }
}

mr_status mr__moe_merge_gateup(mr_moe_weights *w, const mr_moe_layout *L, bool swap) {
    if (w->layout.gateup != MR_GATEUP_SEPARATE)
        return mr_error_set(MR_ESTATE, "weights are already in layout of runner %s", w->layout.owner);
    mr_status st = mr_moe_weights_validate(w);
    if (st) return st;
    const int E = w->n_experts;
    const int64_t I = w->inter, Ip = L->inter_padded, H = w->hidden;
    if (L->gateup == MR_GATEUP_INTERLEAVED && (L->interleave_rows < 1 || Ip % L->interleave_rows))
        return mr_error_set(MR_EINVAL, "interleave of %d rows does not divide padded I %lld", L->interleave_rows,
                            (long long)Ip);
    if (w->fmt == MR_FMT_FP8_BLOCK && (Ip % 128 || (L->gateup == MR_GATEUP_INTERLEAVED && L->interleave_rows % 128)))
        return mr_error_set(MR_EINVAL, "fp8_block gate/up merge needs 128-row aligned blocks");
    w->w13 = mr_calloc((size_t)E, sizeof(mr_qmatrix));
    if (!w->w13) return MR_ENOMEM;
    for (int e = 0; e < E; e++) {
        mr_qmatrix *g = swap ? &w->w3[e] : &w->w1[e], *u = swap ? &w->w1[e] : &w->w3[e];
        if (w->fmt == MR_FMT_NVFP4 && g->scale2 != u->scale2) {
            st = mr_error_set(MR_EFORMAT, "expert %d: nvfp4 gate and up have different weight_scale_2 (%g, %g); they must share it",
                              e, g->scale2, u->scale2);
            break;
        }
        mr_qmatrix *m = &w->w13[e];
        if ((st = qm_alloc(m, w->fmt, 2 * Ip, H))) break;
        m->scale2 = g->scale2;
        m->input_scale = fmaxf(g->input_scale, u->input_scale);
        for (int64_t r = 0; r < 2 * Ip; r++) {
            int is_up;
            int64_t sr = merged_row_source(L, r, &is_up);
            if (sr < I) copy_row(is_up ? u : g, sr, m, r);
        }
        if (w->fmt == MR_FMT_FP8_BLOCK) {
            /* scale rows: blocks of 128 rows map whole (alignment checked above) */
            int64_t kb = (H + 127) / 128;
            for (int64_t rb = 0; rb < 2 * Ip / 128; rb++) {
                int is_up;
                int64_t sr = merged_row_source(L, rb * 128, &is_up);
                if (sr < I)
                    memcpy((float *)m->scale + rb * kb, (const float *)(is_up ? u : g)->scale + (sr / 128) * kb,
                           (size_t)kb * 4);
            }
        }
        /* the HF copies are no longer needed: free them as we go (peak memory) */
        drop_hf(w, &w->w1[e]);
        drop_hf(w, &w->w3[e]);
    }
    return finish_after_load(w, L, st);
}

/* ---- after-load: pack into the 16-row tile layouts (routed) ---- */
mr_status mr__moe_pack(mr_moe_weights *w, const mr_moe_layout *L, bool swap) {
    if (w->layout.gateup != MR_GATEUP_SEPARATE)
        return mr_error_set(MR_ESTATE, "weights are already in layout of runner %s", w->layout.owner);
    mr_status st = mr_moe_weights_validate(w);
    if (st) return st;
    MR_ASSERT(L->pack != MR_PACK_NONE && L->gateup == MR_GATEUP_INTERLEAVED && L->interleave_rows == MR_PACK_TILE);
    const int E = w->n_experts;
    w->p13 = mr_calloc((size_t)E, sizeof(mr_pmatrix));
    w->p2 = mr_calloc((size_t)E, sizeof(mr_pmatrix));
    if (!w->p13 || !w->p2) return finish_after_load(w, L, MR_ENOMEM);
    /* experts in parallel, each packed then its HF copies dropped (and their
     * source pages given back) at once: the transient memory is one expert per
     * thread. A failure keeps the lowest expert's message (the error detail
     * is per thread: carried out of the region here). */
    int bad = E;
    mr_status bad_st = MR_OK;
    char bad_msg[512] = "";
#pragma omp parallel for schedule(dynamic, 1)
    for (int e = 0; e < E; e++) {
        const mr_qmatrix *gu[2] = {swap ? &w->w3[e] : &w->w1[e], swap ? &w->w1[e] : &w->w3[e]};
        const mr_qmatrix *dn[1] = {&w->w2[e]};
        const char *what = "gate/up";
        mr_status es = mr_pmatrix_pack(&w->p13[e], (mr_pack_id)L->pack, gu, 2);
        if (!es) what = "down", es = mr_pmatrix_pack(&w->p2[e], (mr_pack_id)L->pack, dn, 1);
        if (es) {
#pragma omp critical(mr_moe_pack_error)
            if (e < bad) {
                bad = e;
                bad_st = es;
                snprintf(bad_msg, sizeof bad_msg, "expert %d %s: %s", e, what, mr_error_last());
            }
            continue;
        }
        /* the HF copies are no longer needed: free them as we go (peak memory) */
        drop_hf(w, &w->w1[e]);
        drop_hf(w, &w->w3[e]);
        drop_hf(w, &w->w2[e]);
    }
    if (bad_st) st = mr_error_set(bad_st, "%s", bad_msg);
    return finish_after_load(w, L, st);
}
