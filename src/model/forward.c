/* forward.c — the MiniMax-M2 forward pass over a batch of sequences
 * (spec/minimax-m2.md "Forward"), the KV-cache bookkeeping and the timing
 * split (attention / MoE / other).
 *
 * A call's tokens are processed in chunks of at most max_tokens, in order;
 * within a chunk every token carries its KV slot and position, so prefill
 * and decode steps of different sequences mix freely. */
#include <string.h>

#include "model/model_internal.h"
#include "moerun/kernels.h"

void mr__dense(const mr_qmatrix *W, const float *x, int64_t M, float *y) { mr_matmul(W, x, M, y); }

/* Appends this layer's k, v rows [T][Hkv*D] to the cache at (slot, pos). */
static void kv_store(float *kc, float *vc, const float *k, const float *v, const int32_t *slot, const int64_t *pos,
                     int64_t T, int64_t kvd, int64_t max_ctx) {
    for (int64_t t = 0; t < T; t++) {
        size_t off = ((size_t)slot[t] * (size_t)max_ctx + (size_t)pos[t]) * (size_t)kvd;
        memcpy(kc + off, k + t * kvd, (size_t)kvd * sizeof(float));
        memcpy(vc + off, v + t * kvd, (size_t)kvd * sizeof(float));
    }
}

/* One chunk of T tokens (s->pos / s->slot filled). Rows out_tok[i] of the
 * final hidden state produce logits out[i][V]; the out rows are consecutive
 * (out[i] = out[0] + i*V), as mr_model_forward assigns them. */
static mr_status forward_chunk(mr_model *m, const int32_t *tokens, int64_t T, int n_out, const int64_t *out_tok,
                               float *const *out) {
    const mr_model_config *c = &m->c;
    mr__state *s = &m->s;
    int64_t H = c->hidden, Hq = c->n_heads, Hkv = c->n_kv_heads, D = c->head_dim;
    int64_t qd = Hq * D, kvd = Hkv * D;
    size_t layer_kv = (size_t)s->max_batch * (size_t)s->max_ctx * (size_t)kvd;
    uint64_t t0, t1;

    t0 = mr_now_ns();
    mr__embed(s->x, m->w.embed, tokens, T, H); /* h = embed[ids], no scaling */
    m->timing.other_ns += mr_now_ns() - t0;
    for (int64_t l = 0; l < c->n_layers; l++) {
        const mr__layer *L = &m->w.layers[l];
        float *kc = s->kcache + (size_t)l * layer_kv, *vc = s->vcache + (size_t)l * layer_kv;
        t0 = mr_now_ns();
        mr__rmsnorm(s->xn, s->x, L->attn_norm, T, H, c->rms_eps);   /* a = rmsnorm(h) */
        {                                                            /* q, k, v = q/k/v_proj(a), one parallel region */
            const mr_qmatrix *qkv[3] = {&L->wq, &L->wk, &L->wv};
            float *const out_qkv[3] = {s->q, s->k, s->v};
            mr_matmul_multi(3, qkv, s->xn, T, out_qkv);
        }
        mr__rmsnorm(s->q, s->q, L->q_norm, T, qd, c->rms_eps);       /* QK-norm over the whole q vector */
        mr__rmsnorm(s->k, s->k, L->k_norm, T, kvd, c->rms_eps);      /* ... and the whole k vector */
        mr__rope(s->q, s->pos, T, Hq, D, c->rotary_dim, s->inv_freq);  /* partial NeoX RoPE */
        mr__rope(s->k, s->pos, T, Hkv, D, c->rotary_dim, s->inv_freq);
        kv_store(kc, vc, s->k, s->v, s->slot, s->pos, T, kvd, s->max_ctx); /* append to the cache */
        mr__attention(s->att, s->q, kc, vc, s->slot, s->pos, T, Hq, Hkv, D, s->max_ctx, s->scores,
                      s->n_threads);                                 /* causal GQA softmax attention */
        mr__dense(&L->wo, s->att, T, s->y);                          /* o_proj */
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
        memcpy(s->hlast + (size_t)i * (size_t)H, s->x + out_tok[i] * H, (size_t)H * sizeof(float));
    mr__rmsnorm(s->hlast, s->hlast, m->w.final_norm, n_out, H, c->rms_eps); /* final norm */
    mr__dense(&m->w.lm_head, s->hlast, n_out, out[0]);              /* logits = lm_head . h */
    m->timing.other_ns += mr_now_ns() - t0;
    return MR_OK;
}

mr_status mr_model_forward(mr_model *m, const mr_batch *b, float *logits) {
    mr__state *s = &m->s;
    const mr_model_config *c = &m->c;
    if (!b || b->n_seq <= 0 || !b->seq || !b->n_tok || !b->tokens || !logits)
        return mr_error_set(MR_EINVAL, "forward: empty or incomplete batch");
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
    for (int64_t t = 0; t < total; t++)
        if (b->tokens[t] < 0 || b->tokens[t] >= c->vocab)
            return mr_error_set(MR_EINPUT, "forward: token id %d at %lld is outside the vocabulary (%lld)",
                                (int)b->tokens[t], (long long)t, (long long)c->vocab);
    /* chunks of up to max_tokens consecutive tokens of the flattened batch */
    int64_t *out_tok = mr_malloc((size_t)s->max_tokens * sizeof(int64_t));
    float **out = mr_malloc((size_t)s->max_tokens * sizeof(float *));
    if (!out_tok || !out) {
        mr_free(out_tok);
        mr_free(out);
        return MR_ENOMEM;
    }
    mr_status st = MR_OK;
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
                out_tok[n_out] = t;
                out[n_out++] = logits + (size_t)(b->all_logits ? start + t : seq) * (size_t)c->vocab;
            }
            if (last) {
                seq++;
                in_seq = 0;
            } else {
                in_seq++;
            }
        }
        st = forward_chunk(m, b->tokens + start, T, n_out, out_tok, out);
        m->timing.tokens += (uint64_t)T;
        start += T;
    }
    mr_free(out_tok);
    mr_free(out);
    m->timing.calls++;
    if (st) return st;
    for (int i = 0; i < b->n_seq; i++) s->len[b->seq[i]] += b->n_tok[i];
    return MR_OK;
}

int64_t mr_model_seq_len(const mr_model *m, int slot) {
    return slot >= 0 && slot < m->s.max_batch ? m->s.len[slot] : 0;
}
void mr_model_seq_reset(mr_model *m, int slot) {
    if (slot >= 0 && slot < m->s.max_batch) m->s.len[slot] = 0;
}
void mr_model_timing_get(const mr_model *m, mr_model_timing *t) { *t = m->timing; }
void mr_model_timing_reset(mr_model *m) { memset(&m->timing, 0, sizeof m->timing); }
