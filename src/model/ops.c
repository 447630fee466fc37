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

/* Dot product in a fixed order: 8 interleaved partial sums, then a fixed
 * tree (vectorizes, and gives the same bits for the same inputs wherever
 * the rows live). */
static inline float dot_f32(const float *a, const float *b, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[i + k] * b[i + k];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Row j (a [D] vector of kv head kvh) of one token's K or V: fp32 in place,
 * or widened from bf16 into tmp (exact). */
static inline const float *kv_row(const mr__kv_view *kv, const void *base, int64_t t, int64_t j, int64_t kvh,
                                  int64_t n_kv_heads, int64_t D, float *tmp) {
    if (kv->slot) { /* contiguous fp32: [slot][max_ctx][Hkv*D] */
        const float *b = base;
        return b + (((size_t)kv->slot[t] * (size_t)kv->max_ctx + (size_t)j) * (size_t)n_kv_heads + (size_t)kvh) *
                       (size_t)D;
    }
    size_t blk = (size_t)kv->bt[t][j / MR_KV_BLOCK_TOKENS];
    size_t off = ((blk * (size_t)n_kv_heads + (size_t)kvh) * MR_KV_BLOCK_TOKENS + (size_t)(j % MR_KV_BLOCK_TOKENS)) *
                 (size_t)D;
    if (kv->dtype == MR_FMT_F32) return (const float *)base + off;
    const uint16_t *h = (const uint16_t *)base + off;
    for (int64_t i = 0; i < D; i++) tmp[i] = mr__bf16f(h[i]);
    return tmp;
}

void mr__attention(float *out, const float *q, const mr__kv_view *kv, const int64_t *pos, int64_t T, int64_t n_heads,
                   int64_t n_kv_heads, int64_t head_dim, float *scores, size_t per_thread, int n_threads) {
    int64_t group = n_heads / n_kv_heads, D = head_dim;
    float scale = 1.0f / sqrtf((float)head_dim);
    /* one work item per (token, kv head): the group's query heads share each K and V row */
    const int nt = omp_get_max_threads() < n_threads ? omp_get_max_threads() : n_threads; /* a caller may ask fewer */
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (T * n_kv_heads > 1)
    for (int64_t tk = 0; tk < T * n_kv_heads; tk++) {
        int64_t t = tk / n_kv_heads, kvh = tk % n_kv_heads, n = pos[t] + 1;
        float *sc = scores + (size_t)omp_get_thread_num() * per_thread; /* [group][n] */
        float *tmp = sc + (size_t)group * (size_t)kv->max_ctx;          /* [D] */
        const float *qg = q + (t * n_heads + kvh * group) * D;          /* [group][D] */
        float *og = out + (t * n_heads + kvh * group) * D;
        float mx[64], inv[64]; /* group <= 64: checked at open */
        for (int64_t g = 0; g < group; g++) mx[g] = -INFINITY;
        for (int64_t j = 0; j < n; j++) { /* scores q . k_j / sqrt(D) */
            const float *kj = kv_row(kv, kv->kc, t, j, kvh, n_kv_heads, D, tmp);
            for (int64_t g = 0; g < group; g++) {
                float d = dot_f32(qg + g * D, kj, D) * scale;
                sc[g * n + j] = d;
                if (d > mx[g]) mx[g] = d;
            }
        }
        for (int64_t g = 0; g < group; g++) { /* softmax */
            float sum = 0.0f;
            for (int64_t j = 0; j < n; j++) {
                sc[g * n + j] = expf(sc[g * n + j] - mx[g]);
                sum += sc[g * n + j];
            }
            inv[g] = 1.0f / sum;
            for (int64_t i = 0; i < D; i++) og[g * D + i] = 0.0f;
        }
        for (int64_t j = 0; j < n; j++) { /* out = sum_j p_j v_j, in position order */
            const float *vj = kv_row(kv, kv->vc, t, j, kvh, n_kv_heads, D, tmp);
            for (int64_t g = 0; g < group; g++) {
                float p = sc[g * n + j] * inv[g];
                float *o = og + g * D;
                for (int64_t i = 0; i < D; i++) o[i] += p * vj[i];
            }
        }
    }
}

void mr__add(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}
