/* ops.c — the fp32 ops of the MiniMax-M2 forward pass that are not matmuls:
 * RMSNorm, embedding gather, partial NeoX RoPE, causal GQA attention over
 * the KV cache, residual add. Free functions (out, in, weights, dims),
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

void mr__attention(float *out, const float *q, const float *kc, const float *vc, const int32_t *slot,
                   const int64_t *pos, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                   int64_t max_ctx, float *scores, int n_threads) {
    int64_t group = n_heads / n_kv_heads, kvd = n_kv_heads * head_dim;
    float scale = 1.0f / sqrtf((float)head_dim);
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads) if (T * n_heads > 1)
    for (int64_t th = 0; th < T * n_heads; th++) {
        int64_t t = th / n_heads, h = th % n_heads, kvh = h / group, n = pos[t] + 1;
        float *sc = scores + (int64_t)omp_get_thread_num() * max_ctx;
        const float *qh = q + t * n_heads * head_dim + h * head_dim;
        const float *kbase = kc + (int64_t)slot[t] * max_ctx * kvd + kvh * head_dim;
        const float *vbase = vc + (int64_t)slot[t] * max_ctx * kvd + kvh * head_dim;
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
            const float *kj = kbase + j * kvd;
            float d = 0.0f;
            for (int64_t i = 0; i < head_dim; i++) d += qh[i] * kj[i];
            sc[j] = d * scale;
            if (sc[j] > mx) mx = sc[j];
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            sc[j] = expf(sc[j] - mx);
            sum += sc[j];
        }
        float inv = 1.0f / sum;
        float *o = out + t * n_heads * head_dim + h * head_dim;
        for (int64_t i = 0; i < head_dim; i++) o[i] = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            const float *vj = vbase + j * kvd;
            float p = sc[j] * inv;
            for (int64_t i = 0; i < head_dim; i++) o[i] += p * vj[i];
        }
    }
}

void mr__add(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}
