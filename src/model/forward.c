/* forward.c — the MiniMax-M2 forward pass over a batch of sequences
 * (spec/minimax-m2.md "Forward"), the KV-cache bookkeeping and the timing
 * split (attention / MoE / other).
 *
 * Two KV layouts, one forward: the contiguous cache (mr_model_forward, a
 * slot of max_ctx fp32 rows per sequence; the reference the transformers
 * oracle checks) and the paged pool (mr_model_forward_kv, blocks of 16
 * tokens through a block table, bf16 or fp32). A call's tokens are processed
 * in chunks of at most max_tokens, in order; within a chunk every token
 * carries its own position and KV location, so prefill chunks and decode
 * steps of different sequences mix freely. Neither path allocates. */
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model/model_internal.h"
#include "moerun/kernels.h"

void mr__dense(mr__state *s, const mr_qmatrix *W, const float *x, int64_t M, float *y) {
    mr_matmul_multi_ws(1, &W, x, M, &y, s->dws, s->dws_bytes);
}


/* Appends this layer's k, v rows [T][Hkv*D] to the contiguous cache at (slot, pos). */
static void kv_store(float *kc, float *vc, const float *k, const float *v, const int32_t *slot, const int64_t *pos,
                     int64_t T, int64_t kvd, int64_t max_ctx) {
    for (int64_t t = 0; t < T; t++) {
        size_t off = ((size_t)slot[t] * (size_t)max_ctx + (size_t)pos[t]) * (size_t)kvd;
        memcpy(kc + off, k + t * kvd, (size_t)kvd * sizeof(float));
        memcpy(vc + off, v + t * kvd, (size_t)kvd * sizeof(float));
    }
}

/* n values of one row in the pool's type dt at dst (FP8: x / scale) */
static void kv_put(void *dst, mr_format dt, const float *x, int64_t n, float scale) {
    if (dt == MR_FMT_F32) {
        memcpy(dst, x, (size_t)n * sizeof(float));
    } else if (dt == MR_FMT_BF16) {
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = mr_f32_to_bf16(x[i]);
    } else if (dt == MR_FMT_E4M3) {
        for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = mr_f32_to_e4m3_sat(x[i] / scale);
    } else {
        for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = mr_f32_to_e5m2_sat(x[i] / scale);
    }
}

/* Writes this layer's k, v rows [T][Hkv][D] into the paged pool: token t at
 * position pos[t] goes to block bt[t][pos / 16], row pos % 16, of each kv head
 * (pool layout [Hkv][n_blocks][16][D], elements of dt). */
void mr__kv_store_paged(void *kp, void *vp, mr_format dt, const float *k, const float *v, const int32_t *const *bt,
                        const int64_t *pos, int64_t T, int64_t Hkv, int64_t D, int64_t n_blocks, float k_scale,
                        float v_scale) {
    const size_t es = mr_kv_elem_bytes(dt);
    for (int64_t t = 0; t < T; t++) {
        size_t blk = (size_t)bt[t][pos[t] / MR_KV_BLOCK_TOKENS], row = (size_t)(pos[t] % MR_KV_BLOCK_TOKENS);
        for (int64_t h = 0; h < Hkv; h++) {
            size_t off = (((size_t)h * (size_t)n_blocks + blk) * MR_KV_BLOCK_TOKENS + row) * (size_t)D * es;
            kv_put((char *)kp + off, dt, k + (t * Hkv + h) * D, D, k_scale);
            kv_put((char *)vp + off, dt, v + (t * Hkv + h) * D, D, v_scale);
        }
    }
}

/* One chunk of T tokens (s->pos and s->slot, or s->tok_bt when paged, filled).
 * Rows s->out_tok[i] of the final hidden state, normalized, go to s->hlast;
 * the first n_lm of them produce logits s->out_row[i][V] (consecutive:
 * out_row[i] = out_row[0] + i*V, as the callers assign them), the others wait
 * there for mr_model_extra_logits. */
static mr_status forward_chunk(mr_model *m, const int32_t *tokens, int64_t T, int n_out, int n_lm, bool paged) {
    const mr_model_config *c = &m->c;
    mr__state *s = &m->s;
    int64_t H = c->hidden, Hq = c->n_heads, Hkv = c->n_kv_heads, D = c->head_dim;
    int64_t qd = Hq * D, kvd = Hkv * D;
    size_t layer_kv = (size_t)s->max_batch * (size_t)s->max_ctx * (size_t)kvd;
    size_t layer_pool = (size_t)s->kv_blocks * MR_KV_BLOCK_TOKENS * (size_t)kvd * mr_kv_elem_bytes(s->kv_dtype);
    uint64_t t0, t1;

    t0 = mr_now_ns();
    mr__embed(s->x, m->w.embed, tokens, T, H); /* h = embed[ids], no scaling */
    m->timing.other_ns += mr_now_ns() - t0;
    for (int64_t l = 0; l < c->n_layers; l++) {
        const mr__layer *L = &m->w.layers[l];
        mr__kv_view kv = {.dtype = MR_FMT_F32, .max_ctx = s->max_ctx, .k_scale = 1.0f, .v_scale = 1.0f};
        if (paged) {
            kv.kc = (const unsigned char *)s->kpool + (size_t)l * layer_pool;
            kv.vc = (const unsigned char *)s->vpool + (size_t)l * layer_pool;
            kv.bt = s->tok_bt;
            kv.dtype = s->kv_dtype;
            kv.n_blocks = s->kv_blocks;
            if (mr_kv_elem_bytes(s->kv_dtype) == 1) kv.k_scale = L->k_scale, kv.v_scale = L->v_scale;
        } else {
            kv.kc = s->kcache + (size_t)l * layer_kv;
            kv.vc = s->vcache + (size_t)l * layer_kv;
            kv.slot = s->slot;
        }
        t0 = mr_now_ns();
        mr__rmsnorm(s->xn, s->x, L->attn_norm, T, H, c->rms_eps);   /* a = rmsnorm(h) */
        if (s->dense_bf16) mr__round_bf16(s->xn, T * H);           /* --dense-activation-dtype bf16 */
        {                                                            /* q, k, v = q/k/v_proj(a), one parallel region */
            const mr_qmatrix *qkv[3] = {&L->wq, &L->wk, &L->wv};
            float *const out_qkv[3] = {s->q, s->k, s->v};
            mr_matmul_multi_ws(3, qkv, s->xn, T, out_qkv, s->dws, s->dws_bytes);
        }
        mr__rmsnorm(s->q, s->q, L->q_norm, T, qd, c->rms_eps);       /* QK-norm over the whole q vector */
        mr__rmsnorm(s->k, s->k, L->k_norm, T, kvd, c->rms_eps);      /* ... and the whole k vector */
        mr__rope(s->q, s->pos, T, Hq, D, c->rotary_dim, s->inv_freq);  /* partial NeoX RoPE */
        mr__rope(s->k, s->pos, T, Hkv, D, c->rotary_dim, s->inv_freq);
        if (paged)                                                   /* append to the cache */
            mr__kv_store_paged((void *)kv.kc, (void *)kv.vc, s->kv_dtype, s->k, s->v, s->tok_bt, s->pos, T, Hkv, D, s->kv_blocks,
                               kv.k_scale, kv.v_scale);
        else
            kv_store((float *)kv.kc, (float *)kv.vc, s->k, s->v, s->slot, s->pos, T, kvd, s->max_ctx);
        mr__attention(s->att, s->q, &kv, s->pos, T, Hq, Hkv, D, s->scores, s->scores_per_thread,
                      s->n_threads);                                 /* causal GQA softmax attention */
        if (s->dense_bf16) mr__round_bf16(s->att, T * qd);
        mr__dense(s, &L->wo, s->att, T, s->y);                       /* o_proj */
        t1 = mr_now_ns();
        m->timing.attention_ns += t1 - t0;
        mr__add(s->x, s->y, T * H);                                  /* h = h + attention(a) */
        mr__rmsnorm(s->xn, s->x, L->ffn_norm, T, H, c->rms_eps);     /* b = rmsnorm(h) */
        t0 = mr_now_ns();
        m->timing.other_ns += t0 - t1;
        mr_status st = mr__moe_forward(m, (int)l, s->xn, T, s->y);   /* MoE block via the resolved runner */
        if (st) return st;
        t1 = mr_now_ns();
        m->timing.moe_ns += t1 - t0;
        mr__add(s->x, s->y, T * H);                                  /* h = h + moe(b) */
        m->timing.other_ns += mr_now_ns() - t1;
    }
    t0 = mr_now_ns();
    for (int i = 0; i < n_out; i++)                                  /* rows that need logits */
        memcpy(s->hlast + (size_t)i * (size_t)H, s->x + s->out_tok[i] * H, (size_t)H * sizeof(float));
    mr__rmsnorm(s->hlast, s->hlast, m->w.final_norm, n_out, H, c->rms_eps); /* final norm */
    if (s->dense_bf16) mr__round_bf16(s->hlast, n_out * H);
    if (n_lm > 0) mr__dense(s, &m->w.lm_head, s->hlast, n_lm, s->out_row[0]); /* logits = lm_head . h */
    s->n_extra = n_out - n_lm;
    s->extra0 = n_lm;
    m->timing.other_ns += mr_now_ns() - t0;
    return MR_OK;
}

static mr_status check_tokens(const mr_model *m, const int32_t *tokens, int64_t total) {
    for (int64_t t = 0; t < total; t++)
        if (tokens[t] < 0 || tokens[t] >= m->c.vocab)
            return mr_error_set(MR_EINPUT, "forward: token id %d at %lld is outside the vocabulary (%lld)",
                                (int)tokens[t], (long long)t, (long long)m->c.vocab);
    return MR_OK;
}

mr_status mr_model_forward(mr_model *m, const mr_batch *b, float *logits) {
    mr__state *s = &m->s;
    const mr_model_config *c = &m->c;
    if (m->weights_only) return mr_error_set(MR_ESTATE, "forward: staged weights run nothing (swap them in first)");
    if (!b || b->n_seq <= 0 || !b->seq || !b->n_tok || !b->tokens || !logits)
        return mr_error_set(MR_EINVAL, "forward: empty or incomplete batch");
    if (s->max_batch == 0)
        return mr_error_set(MR_ESTATE, "forward: this model was opened with the paged KV pool only (use "
                            "mr_model_forward_kv)");
    /* validate everything before touching the cache */
    int64_t total = 0;
    for (int i = 0; i < b->n_seq; i++) {
        int sl = b->seq[i];
        if (sl < 0 || sl >= s->max_batch)
            return mr_error_set(MR_ECAPACITY, "forward: sequence slot %d is outside the KV cache (max batch %d)", sl,
                                s->max_batch);
        for (int j = 0; j < i; j++)
            if (b->seq[j] == sl) return mr_error_set(MR_EINVAL, "forward: slot %d appears twice in one batch", sl);
        if (b->n_tok[i] < 1) return mr_error_set(MR_EINVAL, "forward: sequence %d has no new tokens", i);
        if (b->n_tok[i] > s->max_ctx - s->len[sl]) /* len <= max_ctx: no overflow */
            return mr_error_set(MR_ECAPACITY,
                                "forward: sequence in slot %d holds %lld tokens and gets %lld more; the KV cache was "
                                "allocated for a context of %lld",
                                sl, (long long)s->len[sl], (long long)b->n_tok[i], (long long)s->max_ctx);
        total += b->n_tok[i];
    }
    mr_status st = check_tokens(m, b->tokens, total);
    if (st) return st;
    /* chunks of up to max_tokens consecutive tokens of the flattened batch */
    int64_t start = 0;
    int seq = 0;
    int64_t in_seq = 0; /* tokens of sequence `seq` already placed */
    while (start < total && !st) {
        int64_t T = total - start < s->max_tokens ? total - start : s->max_tokens;
        int n_out = 0;
        for (int64_t t = 0; t < T; t++) {
            int sl = b->seq[seq];
            s->slot[t] = sl;
            s->pos[t] = s->len[sl] + in_seq;
            bool last = in_seq == b->n_tok[seq] - 1;
            if (b->all_logits || last) {
                s->out_tok[n_out] = t;
                s->out_row[n_out++] = logits + (size_t)(b->all_logits ? start + t : seq) * (size_t)c->vocab;
            }
            if (last) {
                seq++;
                in_seq = 0;
            } else {
                in_seq++;
            }
        }
        st = forward_chunk(m, b->tokens + start, T, n_out, n_out, false);
        m->timing.tokens += (uint64_t)T;
        start += T;
    }
    m->timing.calls++;
    if (st) return st;
    for (int i = 0; i < b->n_seq; i++) s->len[b->seq[i]] += b->n_tok[i];
    return MR_OK;
}

/* Checks a paged batch completely before anything is written. */
static mr_status check_kv_batch(mr_model *m, const mr_kv_batch *b) {
    mr__state *s = &m->s;
    if (!b || b->n_seq <= 0 || !b->tokens || !b->n_tok || !b->start || !b->bt_off || !b->block_ids ||
        !b->want_logits)
        return mr_error_set(MR_EINVAL, "forward: empty or incomplete batch");
    if (!s->kpool) return mr_error_set(MR_ESTATE, "forward: this model was opened without a paged KV pool");
    if (b->n_tokens < 1 || b->n_tokens > s->max_tokens)
        return mr_error_set(MR_ECAPACITY, "forward: the batch holds %lld tokens; this model runs at most %lld per call",
                            (long long)b->n_tokens, (long long)s->max_tokens);
    if (b->bt_off[0] != 0) return mr_error_set(MR_EINVAL, "forward: bt_off[0] is %d, not 0", (int)b->bt_off[0]);
    int64_t total = 0;
    int n_logits = 0;
    mr_status st = MR_OK;
    int i = 0;
    for (; i < b->n_seq && !st; i++) {
        int64_t n = b->n_tok[i], p0 = b->start[i];
        int32_t nb = b->bt_off[i + 1] - b->bt_off[i];
        if (n < 1 || n > b->n_tokens - total) {
            st = mr_error_set(MR_EINVAL, "forward: sequence %d has %lld new tokens (the batch %lld in all)", i,
                              (long long)n, (long long)b->n_tokens);
            break;
        }
        if (p0 < 0 || p0 > s->max_ctx - n) {
            st = mr_error_set(MR_ECAPACITY,
                              "forward: sequence %d writes positions %lld..%lld; the model attends to a context of %lld",
                              i, (long long)p0, (long long)(p0 + n - 1), (long long)s->max_ctx);
            break;
        }
        if (nb < 0 || (int64_t)nb * MR_KV_BLOCK_TOKENS < p0 + n) {
            st = mr_error_set(MR_EINVAL, "forward: sequence %d needs %lld blocks for %lld positions, its table has %d",
                              i, (long long)((p0 + n + MR_KV_BLOCK_TOKENS - 1) / MR_KV_BLOCK_TOKENS),
                              (long long)(p0 + n), (int)nb);
            break;
        }
        const int32_t *bt = b->block_ids + b->bt_off[i];
        for (int32_t j = 0; j < nb; j++)
            if (bt[j] < 0 || bt[j] >= s->kv_blocks) {
                st = mr_error_set(MR_EINVAL, "forward: sequence %d: block %d is outside the pool (%lld blocks)", i,
                                  (int)bt[j], (long long)s->kv_blocks);
                break;
            }
        /* the blocks it writes, marked: no two sequences may write one block */
        for (int64_t j = p0 / MR_KV_BLOCK_TOKENS; !st && j <= (p0 + n - 1) / MR_KV_BLOCK_TOKENS; j++) {
            if (s->blk_mark[bt[j]]) {
                st = mr_error_set(MR_EINVAL, "forward: block %d is written by two sequences of the batch", (int)bt[j]);
                break;
            }
            s->blk_mark[bt[j]] = 1;
        }
        total += n;
        n_logits += b->want_logits[i] != 0;
    }
    /* unmark what was marked (sequences 0..i-1, and i's marks if it failed midway) */
    for (int k = 0; k < b->n_seq && k <= i; k++) {
        int32_t nb = b->bt_off[k + 1] - b->bt_off[k];
        int64_t n = b->n_tok[k], p0 = b->start[k];
        if (n < 1 || p0 < 0 || nb < 0 || (int64_t)nb * MR_KV_BLOCK_TOKENS < p0 + n) continue;
        const int32_t *bt = b->block_ids + b->bt_off[k];
        for (int64_t j = p0 / MR_KV_BLOCK_TOKENS; j <= (p0 + n - 1) / MR_KV_BLOCK_TOKENS; j++)
            if (bt[j] >= 0 && bt[j] < s->kv_blocks) s->blk_mark[bt[j]] = 0;
    }
    if (st) return st;
    if (total != b->n_tokens)
        return mr_error_set(MR_EINVAL, "forward: the sequences hold %lld tokens, the batch says %lld", (long long)total,
                            (long long)b->n_tokens);
    if (n_logits != b->n_logits)
        return mr_error_set(MR_EINVAL, "forward: %d sequences want logits, the batch says %d", n_logits, b->n_logits);
    if (b->n_extra < 0 || b->n_extra > total - n_logits || (b->n_extra > 0 && !b->extra_tok))
        return mr_error_set(MR_EINVAL, "forward: %d extra logits rows; the batch of %lld tokens allows %lld", b->n_extra,
                            (long long)total, (long long)(total - n_logits));
    for (int k = 0; k < b->n_extra; k++)
        if (b->extra_tok[k] < 0 || b->extra_tok[k] >= total)
            return mr_error_set(MR_EINVAL, "forward: extra logits row %d names token %lld of %lld", k,
                                (long long)b->extra_tok[k], (long long)total);
    return check_tokens(m, b->tokens, total);
}

mr_status mr_model_forward_kv(mr_model *m, const mr_kv_batch *b, float *logits) {
    mr__state *s = &m->s;
    if (m->weights_only) return mr_error_set(MR_ESTATE, "forward: staged weights run nothing (swap them in first)");
    mr_status st = check_kv_batch(m, b);
    if (st) return st;
    if (b->n_logits > 0 && !logits) return mr_error_set(MR_EINVAL, "forward: no logits buffer");
    s->n_extra = 0;
    int64_t t = 0;
    int n_out = 0;
    for (int i = 0; i < b->n_seq; i++) {
        const int32_t *bt = b->block_ids + b->bt_off[i];
        for (int64_t j = 0; j < b->n_tok[i]; j++, t++) {
            s->pos[t] = b->start[i] + j;
            s->tok_bt[t] = bt;
        }
        if (b->want_logits[i]) {
            s->out_tok[n_out] = t - 1;
            s->out_row[n_out] = logits + (size_t)n_out * (size_t)m->c.vocab;
            n_out++;
        }
    }
    const int n_lm = n_out;
    for (int k = 0; k < b->n_extra; k++) s->out_tok[n_out++] = b->extra_tok[k];
    st = forward_chunk(m, b->tokens, b->n_tokens, n_out, n_lm, true);
    m->timing.tokens += (uint64_t)b->n_tokens;
    m->timing.calls++;
    return st;
}

mr_status mr_model_extra_logits(mr_model *m, int k0, int n, float *logits) {
    mr__state *s = &m->s;
    if (k0 < 0 || n < 1 || k0 > s->n_extra - n || !logits)
        return mr_error_set(MR_EINVAL, "extra logits: rows %d..%d asked, the last forward kept %d", k0, k0 + n - 1,
                            s->n_extra);
    uint64_t t0 = mr_now_ns();
    mr__dense(s, &m->w.lm_head, s->hlast + (size_t)(s->extra0 + k0) * (size_t)m->c.hidden, n, logits);
    m->timing.other_ns += mr_now_ns() - t0;
    return MR_OK;
}

int64_t mr_model_kv_blocks(const mr_model *m) { return m->s.kv_blocks; }
mr_format mr_model_kv_dtype(const mr_model *m) { return m->s.kv_dtype; }
int mr_model_kv_scales(const mr_model *m) { return m->s.kv_scales_found; }
size_t mr_model_kv_bytes(const mr_model *m) { return 2 * m->s.kv_pool_bytes; }

/* The page-aligned part of [p, p + n) back to the system; its bytes. */
static size_t drop_pages(void *p, size_t n) {
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + pg - 1) & ~(pg - 1),
                    b = ((uintptr_t)p + n) & ~(pg - 1);
    if (!p || b <= a) return 0;
    return madvise((void *)a, b - a, MADV_DONTNEED) == 0 ? (size_t)(b - a) : 0;
}

size_t mr_model_kv_release(mr_model *m) {
    return drop_pages(m->s.kpool, m->s.kv_pool_bytes) + drop_pages(m->s.vpool, m->s.kv_pool_bytes);
}
size_t mr_model_kv_token_bytes(const mr_model_config *c, mr_format kv_dtype) {
    return (size_t)c->n_layers * 2 * (size_t)c->n_kv_heads * (size_t)c->head_dim * mr_kv_elem_bytes(kv_dtype);
}
int64_t mr_model_max_tokens(const mr_model *m) { return m->s.max_tokens; }
int64_t mr_model_max_ctx(const mr_model *m) { return m->s.max_ctx; }

int64_t mr_model_seq_len(const mr_model *m, int slot) {
    return slot >= 0 && slot < m->s.max_batch ? m->s.len[slot] : 0;
}
void mr_model_seq_reset(mr_model *m, int slot) {
    if (slot >= 0 && slot < m->s.max_batch) m->s.len[slot] = 0;
}
void mr_model_timing_get(const mr_model *m, mr_model_timing *t) { *t = m->timing; }
void mr_model_timing_reset(mr_model *m) { memset(&m->timing, 0, sizeof m->timing); }
