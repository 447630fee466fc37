/* sample.c — one request's next token from its logits row: the finite
 * check, log-probabilities (of the raw logits: log-softmax, and the top n),
 * the masks (a constraint's, allowed ids, bad words, min_tokens), the logit bias and the
 * repetition / frequency / presence penalties, then the sampler
 * (model/sampler.c). Uses the scratch of the thread that runs it (one [vocab]
 * of each): no allocation, no per-request vocabulary arrays.
 * Penalties follow the OpenAI / vLLM definitions (engine.h mr_sampling). */
#include <math.h>
#include <string.h>

#include "engine/engine_internal.h"

mr_status mr__sampling_check(const mr_sampling *s) {
    mr_sampler_params p = {.temperature = s->temperature, .top_k = s->top_k,
                           .top_p = s->top_p == 0.0f ? 1.0f : s->top_p, .min_p = s->min_p, .seed = s->seed};
    mr_status st = mr_sampler_params_check(&p);
    if (st) return st;
    if (s->temperature < 0.0f) return mr_error_set(MR_EINVAL, "sampling: temperature %g is negative", (double)s->temperature);
    if (!(s->presence_penalty >= -2.0f && s->presence_penalty <= 2.0f))
        return mr_error_set(MR_EINVAL, "sampling: presence_penalty must be in [-2, 2]");
    if (!(s->frequency_penalty >= -2.0f && s->frequency_penalty <= 2.0f))
        return mr_error_set(MR_EINVAL, "sampling: frequency_penalty must be in [-2, 2]");
    if (!(s->repetition_penalty >= 0.0f && s->repetition_penalty <= 10.0f))
        return mr_error_set(MR_EINVAL, "sampling: repetition_penalty must be in (0, 10] (1 or 0 = off)");
    return MR_OK;
}

/* The n largest logits, descending, ties to the lower id. */
static int top_n(const float *l, int64_t V, int n, double lse, mr_token_logprob *top) {
    int k = 0;
    for (int64_t i = 0; i < V; i++) {
        if (k == n && !(l[i] > top[k - 1].logprob)) continue;
        int j = k < n ? k++ : n - 1; /* drop the last when full */
        while (j > 0 && l[i] > top[j - 1].logprob) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = (mr_token_logprob){(int32_t)i, l[i]};
    }
    for (int j = 0; j < k; j++) top[j].logprob = (float)((double)top[j].logprob - lse);
    return k;
}

/* The adjusted copy of the row in sc->work (only when something adjusts
 * it), in engine.h's order: the constraint's bitset al (NULL: none), the allowed ids, the bad words, the min_tokens
 * mask, the logit bias, the repetition penalty, then the frequency and
 * presence penalties. */
static const float *adjust(const mr_engine *e, mr__scratch *sc, const mr__req *r, const float *logits,
                           const uint32_t *al) {
    float rep = r->sp.repetition_penalty, fr = r->sp.frequency_penalty, pr = r->sp.presence_penalty;
    bool use_rep = rep > 0.0f && rep != 1.0f, use_fp = fr != 0.0f || pr != 0.0f;
    bool use_min = r->n_tok - r->n_prompt < r->min_tokens;
    if (!use_rep && !use_fp && !use_min && !r->n_bias && !r->n_allowed && !r->n_bad && !al) return logits;
    float *w = sc->work;
    int32_t *cnt = sc->count; /* zero on entry and on exit */
    if (al) /* the constraint's bitset (structured outputs): a word at a time, whole words copied or filled */
        for (int64_t i0 = 0; i0 < e->vocab; i0 += 32) {
            const uint32_t b = al[i0 >> 5];
            const int64_t n = e->vocab - i0 < 32 ? e->vocab - i0 : 32;
            if (b == UINT32_MAX && n == 32) {
                memcpy(w + i0, logits + i0, 32 * sizeof(float));
            } else if (b == 0) {
                for (int64_t i = 0; i < n; i++) w[i0 + i] = -INFINITY;
            } else {
                for (int64_t i = 0; i < n; i++) w[i0 + i] = b >> i & 1 ? logits[i0 + i] : -INFINITY;
            }
        }
    else
        memcpy(w, logits, (size_t)e->vocab * sizeof(float));
    if (r->n_allowed) { /* then only the allowed ids */
        for (int64_t i = 0; i < r->n_allowed; i++) cnt[r->allowed[i]] = 1;
        for (int64_t i = 0; i < e->vocab; i++)
            if (!cnt[i]) w[i] = -INFINITY;
        for (int64_t i = 0; i < r->n_allowed; i++) cnt[r->allowed[i]] = 0;
    }
    const int32_t *out = r->tok + r->n_prompt, *bw = r->bad;
    const int64_t n_out = r->n_tok - r->n_prompt;
    for (int i = 0; i < r->n_bad; bw += r->bad_len[i++]) { /* the last token where the output ends with the rest */
        const int32_t L = r->bad_len[i];
        if (L - 1 <= n_out && !memcmp(out + n_out - (L - 1), bw, (size_t)(L - 1) * sizeof(int32_t)))
            w[bw[L - 1]] = -INFINITY;
    }
    if (use_min) {
        for (int i = 0; i < r->n_stop; i++) w[r->stop_ids[i]] = -INFINITY;
        if (!r->ignore_eos) {
            const mr_model_config *c = mr_model_config_of(e->m);
            for (int i = 0; i < c->n_eos; i++)
                if (c->eos_ids[i] >= 0 && c->eos_ids[i] < e->vocab) w[c->eos_ids[i]] = -INFINITY;
        }
    }
    for (int i = 0; i < r->n_bias; i++) w[r->bias[i].token] += r->bias[i].bias;
    if (use_rep) { /* every distinct token of the prompt and the output, once */
        for (int64_t i = 0; i < r->n_tok; i++) {
            int32_t t = r->tok[i];
            if (cnt[t]) continue;
            cnt[t] = 1;
            w[t] = w[t] > 0.0f ? w[t] / rep : w[t] * rep;
        }
        for (int64_t i = 0; i < r->n_tok; i++) cnt[r->tok[i]] = 0;
    }
    if (use_fp) { /* output tokens: counts, then one subtraction per distinct token */
        for (int64_t i = r->n_prompt; i < r->n_tok; i++) cnt[r->tok[i]]++;
        for (int64_t i = r->n_prompt; i < r->n_tok; i++) {
            int32_t t = r->tok[i];
            if (!cnt[t]) continue;
            w[t] -= fr * (float)cnt[t] + pr;
            cnt[t] = 0;
        }
    }
    return w;
}

/* MR_EINPUT naming the first non-finite logit. The check is one pass without a branch (an exponent of all
 * ones, in integer lanes); the walk to the culprit only when there is one. */
static mr_status finite_row(const float *logits, int64_t V) {
    uint32_t bad = 0;
    for (int64_t i = 0; i < V; i++) {
        uint32_t u;
        memcpy(&u, logits + i, sizeof u);
        bad |= (~u & 0x7f800000u) == 0;
    }
    for (int64_t i = 0; bad && i < V; i++)
        if (!isfinite(logits[i]))
            return mr_error_set(MR_EINPUT, "the model produced a non-finite logit (%g at token %lld)", (double)logits[i],
                                (long long)i);
    return MR_OK;
}

/* The log-probabilities of ids [n] into out, lse the row's log-sum-exp. */
static void ids_logprob(const float *logits, double lse, const int32_t *ids, int n, float *out) {
    for (int k = 0; k < n; k++) out[k] = (float)((double)logits[ids[k]] - lse);
}

mr_status mr__engine_logprob(const mr_engine *e, const float *logits, int32_t tok, int n, float *logprob,
                             mr_token_logprob *top, int *n_top, const int32_t *ids, int n_ids, float *id_lp) {
    mr_status st = finite_row(logits, e->vocab);
    if (st) return st;
    double lse = mr_logsumexp(logits, e->vocab);
    *logprob = (float)((double)logits[tok] - lse);
    *n_top = n > 0 ? top_n(logits, e->vocab, n, lse, top) : 0;
    ids_logprob(logits, lse, ids, n_ids, id_lp);
    return MR_OK;
}

mr_status mr__engine_pick(const mr_engine *e, mr__scratch *sc, mr__req *r, const float *logits, int32_t *tok,
                          float *logprob, mr_token_logprob *top, int *n_top, float *id_lp) {
    int64_t V = e->vocab;
    mr_status st = finite_row(logits, V);
    if (st) return st;
    int64_t g = r->n_tok - r->n_prompt; /* tokens generated so far */
    if (g < r->n_forced) {
        *tok = r->forced[g];
    } else {
        const uint32_t *al = NULL;
        if (r->con.mask) { /* computed for the step over the threads (mr_engine_complete) */
            MR_ASSERT(r->con_row >= 0);
            al = e->con_bits + (size_t)r->con_row * (size_t)((V + 31) / 32);
            if (e->con_cnt[r->con_row] < 0)
                return mr_error_set(MR_EINVAL, "structured output: the grammar's parse went past the matcher's limits "
                                    "here (too ambiguous, or too costly to follow)");
            if (e->con_cnt[r->con_row] == 0)
                return mr_error_set(MR_EINVAL, "structured output: no token can continue the output");
        }
        const float *l = adjust(e, sc, r, logits, al);
        mr_sampler_params p = {.temperature = r->sp.temperature, .top_k = r->sp.top_k,
                               .top_p = r->sp.top_p == 0.0f ? 1.0f : r->sp.top_p, .min_p = r->sp.min_p};
        *tok = mr_sample_logits(&p, &r->rng, l, V, sc->prob, sc->idx);
        if (l[*tok] == -INFINITY) /* finite raw logits: only the masks make -inf */
            return mr_error_set(MR_EINVAL, "sampling: every token is masked (allowed_token_ids, bad_words, min_tokens, "
                                "structured output)");
    }
    *n_top = 0;
    if (r->logprobs || r->top_logprobs > 0 || r->n_lp_ids > 0) {
        double lse = mr_logsumexp(logits, V);
        *logprob = (float)((double)logits[*tok] - lse);
        if (r->top_logprobs > 0) *n_top = top_n(logits, V, r->top_logprobs, lse, top);
        ids_logprob(logits, lse, r->lp_ids, r->n_lp_ids, id_lp);
    }
    return MR_OK;
}
