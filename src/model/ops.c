/* ops.c — the fp32 ops of the MiniMax-M2 forward pass that are not matmuls:
 * RMSNorm, embedding gather, partial NeoX RoPE, causal GQA attention over
 * the KV cache (contiguous or paged), residual add. Free functions (out, in, weights, dims),
 * spec/minimax-m2.md "Forward". */
#include <math.h>
#include <string.h>

#include <omp.h>

#include "model/model_internal.h"

void mr__rmsnorm(float *out, const float *x, const float *w, int64_t T, int64_t n, float eps) {
#pragma omp parallel for schedule(static) if (T * n > 65536)
    for (int64_t t = 0; t < T; t++) {
        const float *xr = x + t * n;
        float *o = out + t * n;
        double ss = 0.0; /* sum of squares in double: the mean is then exact to fp32 */
        for (int64_t i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        float r = 1.0f / sqrtf((float)(ss / (double)n) + eps);
        for (int64_t i = 0; i < n; i++) o[i] = w[i] * (xr[i] * r);
    }
}

void mr__embed(float *out, const uint16_t *table, const int32_t *tokens, int64_t T, int64_t H) {
    for (int64_t t = 0; t < T; t++) {
        const unsigned char *row = (const unsigned char *)table + (size_t)tokens[t] * (size_t)H * 2;
        for (int64_t i = 0; i < H; i++) {
            uint16_t b;
            memcpy(&b, row + 2 * i, 2); /* mapped data may be unaligned */
            out[t * H + i] = mr__bf16f(b);
        }
    }
}

void mr__rope_freqs(float *inv_freq, int64_t rotary_dim, double theta) {
    for (int64_t i = 0; i < rotary_dim / 2; i++)
        inv_freq[i] = 1.0f / powf((float)theta, (float)(2 * i) / (float)rotary_dim);
}

void mr__rope(float *x, const int64_t *pos, int64_t T, int64_t n_heads, int64_t head_dim, int64_t rotary_dim,
              const float *inv_freq) {
    int64_t half = rotary_dim / 2;
    for (int64_t t = 0; t < T; t++) {
        for (int64_t i = 0; i < half; i++) {
            float ang = (float)pos[t] * inv_freq[i]; /* fp32 angle, as transformers computes it */
            float c = cosf(ang), s = sinf(ang);
            for (int64_t h = 0; h < n_heads; h++) {
                float *v = x + (t * n_heads + h) * head_dim;
                float a = v[i], b = v[i + half];
                v[i] = a * c - b * s;
                v[i + half] = b * c + a * s;
            }
        }
    }
}

/* The K (or V) rows of one token's kv head, a run at a time: the whole
 * context of the contiguous cache (rows Hkv*D apart), or, in the paged pool
 * (rows D apart), from row j0 on to the end of its block and on through the
 * blocks that follow it with the next ids (one run in memory), n rows in all. */
typedef struct {
    const void *base;
    int64_t ld;
    int nr;
} kv_run;
static inline kv_run kv_rows(const mr__kv_view *kv, const void *base, int64_t t, int64_t j0, int64_t n, int64_t kvh,
                             int64_t n_kv_heads, int64_t D) {
    const size_t es = mr_kv_elem_bytes(kv->dtype);
    if (kv->slot) { /* contiguous fp32: [slot][max_ctx][Hkv*D] */
        const size_t off = (((size_t)kv->slot[t] * (size_t)kv->max_ctx + (size_t)j0) * (size_t)n_kv_heads +
                            (size_t)kvh) * (size_t)D;
        return (kv_run){(const char *)base + off * es, n_kv_heads * D, (int)(n - j0)};
    }
    const int32_t *bt = kv->bt[t];
    const int64_t b0 = j0 / MR_KV_BLOCK_TOKENS, in = j0 % MR_KV_BLOCK_TOKENS;
    int64_t end = (b0 + 1) * MR_KV_BLOCK_TOKENS; /* the run ends before row end */
    while (end < n && bt[end / MR_KV_BLOCK_TOKENS] == bt[b0] + (end / MR_KV_BLOCK_TOKENS - b0)) end += MR_KV_BLOCK_TOKENS;
    const size_t off = (((size_t)kvh * (size_t)kv->n_blocks + (size_t)bt[b0]) * MR_KV_BLOCK_TOKENS + (size_t)in) * (size_t)D;
    return (kv_run){(const char *)base + off * es, D, (int)((end < n ? end : n) - j0)};
}

/* Asks for the rows of the run at position j0 (if any) to be brought into the
 * cache: each paged block's rows are one short run in its own page, where the
 * hardware prefetchers stop, so the next runs are fetched while this one is
 * computed (they hold no data the arithmetic depends on). */
static inline void kv_prefetch(const mr__kv_view *kv, const void *base, int64_t t, int64_t j0, int64_t n, int64_t kvh,
                               int64_t n_kv_heads, int64_t D) {
    if (j0 >= n) return;
    const kv_run r = kv_rows(kv, base, t, j0, n, kvh, n_kv_heads, D);
    const size_t es = mr_kv_elem_bytes(kv->dtype), row = (size_t)D * es;
    const int nr = r.nr < MR_KV_BLOCK_TOKENS ? r.nr : MR_KV_BLOCK_TOKENS;
    for (int i = 0; i < nr; i++)
        for (size_t b = 0; b < row; b += 64) __builtin_prefetch((const char *)r.base + (size_t)i * (size_t)r.ld * es + b);
}

/* Per (token, kv head): scores of the group's query heads against every K
 * row (the table's attn_qk, in runs of rows), times 1/sqrt(D), softmax in
 * fp32 (expf), then the V rows weighted in position order (attn_pv). The
 * kernels' order depends on D only, so a (token, head)'s result does not
 * depend on the batch, the thread or where the rows live. */
void mr__attention(float *out, const float *q, const mr__kv_view *kv, const int64_t *pos, int64_t T, int64_t n_heads,
                   int64_t n_kv_heads, int64_t head_dim, float *scores, size_t per_thread, int n_threads) {
    const mr_kernels *kt = mr_kernels_get();
    const int64_t group = n_heads / n_kv_heads, D = head_dim;
    const mr_format kvt = kv->dtype;
    const float scale = 1.0f / sqrtf((float)head_dim) * kv->k_scale; /* q . (k_r * k_scale) / sqrt(D) */
    /* one work item per (token, kv head): the group's query heads share each K and V row */
    const int nt = omp_get_max_threads() < n_threads ? omp_get_max_threads() : n_threads; /* a caller may ask fewer */
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (T * n_kv_heads > 1)
    for (int64_t tk = 0; tk < T * n_kv_heads; tk++) {
        int64_t t = tk / n_kv_heads, kvh = tk % n_kv_heads, n = pos[t] + 1;
        float *sc = scores + (size_t)omp_get_thread_num() * per_thread; /* [group][n] */
        float *wk = sc + per_thread - mr__attn_wk_floats(D);          /* the kernels' widened rows */
        const float *qg = q + (t * n_heads + kvh * group) * D;          /* [group][D] */
        float *og = out + (t * n_heads + kvh * group) * D;
        kv_prefetch(kv, kv->kc, t, 0, n, kvh, n_kv_heads, D);
        kv_prefetch(kv, kv->kc, t, MR_KV_BLOCK_TOKENS, n, kvh, n_kv_heads, D);
        for (int64_t j = 0; j < n;) { /* q . k_j */
            const kv_run kr = kv_rows(kv, kv->kc, t, j, n, kvh, n_kv_heads, D);
            kv_prefetch(kv, kv->kc, t, j + kr.nr + MR_KV_BLOCK_TOKENS, n, kvh, n_kv_heads, D);
            kt->attn_qk.fn(qg, (int)group, (int)D, kr.base, kr.ld, kvt, kr.nr, sc + j, n, wk);
            j += kr.nr;
        }
        kv_prefetch(kv, kv->vc, t, 0, n, kvh, n_kv_heads, D);
        for (int64_t g = 0; g < group; g++) { /* softmax of (q . k_j) / sqrt(D) */
            kt->attn_softmax.fn(sc + g * n, n, scale);
            for (int64_t i = 0; i < D; i++) og[g * D + i] = 0.0f;
        }
        for (int64_t j = 0; j < n;) { /* out = sum_j p_j v_j, in position order */
            const kv_run vr = kv_rows(kv, kv->vc, t, j, n, kvh, n_kv_heads, D);
            kv_prefetch(kv, kv->vc, t, j + vr.nr, n, kvh, n_kv_heads, D);
            kt->attn_pv.fn(sc + j, n, (int)group, (int)D, vr.base, vr.ld, kvt, vr.nr, og, wk);
            j += vr.nr;
        }
        if (kv->v_scale != 1.0f) /* sum_j p_j (v_j * v_scale) */
            for (int64_t i = 0; i < group * D; i++) og[i] *= kv->v_scale;
    }
}

/* x[i] = bf16(x[i]) as fp32: mr_f32_to_bf16's rounding (nearest even; a NaN becomes the quiet
 * 0x7FC0), written out so that the loop vectorizes */
void mr__round_bf16(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, sizeof u);
        const uint32_t r = (u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC00000u : (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
        memcpy(x + i, &r, sizeof r);
    }
}

void mr__add(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}
