/* engine.c — the engine loop: the request table, the scheduler, the batch
 * description, completion (sampling, stops, events), the counters and the
 * accounting check. One step reads top to bottom (mr_engine_step):
 *
 *   schedule   sweep cancellations (queued and running: blocks freed now)
 *              -> running requests in order: a decode token, or the next
 *                 chunk of an unfinished prefill, blocks taken as needed;
 *                 when none are left, the newest running request is
 *                 preempted (blocks freed, back to the front of the queue,
 *                 its generated tokens kept, recomputed later)
 *              -> waiting requests FCFS: the longest cached prefix, then a
 *                 chunk of the rest within the budget; the first that cannot
 *                 get its blocks stops admission (no overtaking)
 *              -> the batch (mr_kv_batch): tokens, positions, block tables
 *   forward    mr_model_forward_kv, on one thread or all (threads.c)
 *   complete   per scheduled request: sample at the end of its known tokens,
 *              stop checks, an event; full blocks into the prefix table;
 *              finished requests release their blocks (tail first, so a
 *              prefix's deeper blocks are evicted before its head).
 *
 * Nothing here allocates after mr_engine_new except mr_engine_add (one
 * allocation per request: its tokens, block table and forced tokens). */
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "engine/engine_internal.h"

#define BT MR_KV_BLOCK_TOKENS

/* Defaults of mr_engine_opts (engine.h). */
#define DEF_BATCH_TOKENS 512
#define DEF_RUNNING 256
#define DEF_QUEUED 1024
#define DEF_CONTEXT 4096
#define DEF_TOP_LOGPROBS 20

const char *mr_finish_reason_name(mr_finish_reason r) {
    switch (r) {
    case MR_FINISH_NONE: return "none";
    case MR_FINISH_STOP: return "stop";
    case MR_FINISH_LENGTH: return "length";
    case MR_FINISH_CANCELLED: return "cancelled";
    case MR_FINISH_ERROR: return "error";
    case MR_FINISH_COUNT: break;
    }
    return "?";
}

static void fill_defaults(mr_engine_opts *o) {
    /* no default for kv_dtype: MR_FMT_F32 is 0, so a zero is a choice (the resolver's default is BF16) */
    if (o->max_running_requests <= 0) o->max_running_requests = DEF_RUNNING;
    if (o->max_batch_tokens <= 0)
        o->max_batch_tokens = o->max_running_requests > DEF_BATCH_TOKENS ? o->max_running_requests : DEF_BATCH_TOKENS;
    if (o->max_queued_requests <= 0) o->max_queued_requests = DEF_QUEUED;
    if (o->context_length <= 0) o->context_length = DEF_CONTEXT;
    if (o->max_top_logprobs <= 0) o->max_top_logprobs = DEF_TOP_LOGPROBS;
}

/* A step never holds more tokens than the pool, nor more running requests than it has blocks. */
static void clamp_to_pool(mr_engine_opts *o) {
    if (o->kv_blocks > 0 && o->max_batch_tokens > o->kv_blocks * MR_KV_BLOCK_TOKENS)
        o->max_batch_tokens = o->kv_blocks * MR_KV_BLOCK_TOKENS;
    if (o->kv_blocks > 0 && o->max_running_requests > o->kv_blocks) o->max_running_requests = (int)o->kv_blocks;
}

void mr_engine_opts_from_exec(const mr_exec *x, mr_engine_opts *o) {
    memset(o, 0, sizeof *o);
    o->kv_dtype = x->kv_dtype;
    o->kv_blocks = x->kv_blocks;
    o->max_batch_tokens = x->max_batch_tokens;
    o->max_running_requests = x->max_running_requests;
    o->context_length = x->context_length;
    o->fixed_threads = x->step_threads_fixed;
    fill_defaults(o);
    clamp_to_pool(o);
}

void mr_engine_model_opts(const mr_engine_opts *o_in, mr_model_opts *mo) {
    mr_engine_opts o = *o_in;
    fill_defaults(&o);
    clamp_to_pool(&o);
    mo->max_batch = 0;
    mo->kv_blocks = o.kv_blocks;
    mo->kv_dtype = o.kv_dtype;
    mo->max_tokens = o.max_batch_tokens;
    mo->max_ctx = o.context_length;
}

mr_model *mr_engine_model(mr_engine *e) { return e->m; }
const mr_engine_opts *mr_engine_opts_of(const mr_engine *e) { return &e->o; }
float *mr_engine_logits_buffer(mr_engine *e) { return e->logits; }
bool mr_engine_has_work(const mr_engine *e) { return e->n_waiting > 0 || e->n_running > 0; }

bool mr_engine_has_runnable(const mr_engine *e) {
    return e->hold == MR_HOLD_NONE ? mr_engine_has_work(e) : e->hold == MR_HOLD_ADMIT && e->n_running > 0;
}
void mr_engine_set_hold(mr_engine *e, mr_engine_hold h) { e->hold = h; }
int mr_engine_running(const mr_engine *e) { return e->n_running; }

mr_status mr_engine_flush_prefix_cache(mr_engine *e, int64_t *dropped) {
    if (dropped) *dropped = 0;
    if (e->n_running > 0 || e->pool.n_used > 0)
        return mr_error_set(MR_ESTATE, "the prefix cache is flushed only while no request is running (%d running)",
                            e->n_running);
    const int64_t n = mr__pool_flush(&e->pool);
    if (dropped) *dropped = n;
    return MR_OK;
}

mr_status mr_engine_release_kv(mr_engine *e, size_t *bytes) {
    *bytes = 0;
    if (e->ep_size > 1 && e->ep_rank != 0)
        return mr_error_set(MR_EINVAL, "mr_engine_release_kv: the leader (rank 0) releases every rank's pool");
    mr_status st = mr_engine_flush_prefix_cache(e, NULL);
    if (!st && e->ep_size > 1) st = mr__engine_ep_release(e); /* the followers drop theirs at this same step */
    if (!st) *bytes = mr_model_kv_release(e->m);
    return st;
}

static int64_t blocks_for(int64_t positions) { return (positions + BT - 1) / BT; }

/* ---- lifetime ---- */

/* The buffers of prompt log-probabilities (plp_alloc), all NULL after. */
static void plp_free(mr_engine *e) {
    mr_free(e->plp_tok);
    mr_free(e->plp_want);
    mr_free(e->plp_bad);
    mr_free(e->plp_ntop);
    mr_free(e->plp_rank);
    mr_free(e->plp_out);
    mr_free(e->plp_logits);
    e->plp_tok = NULL, e->plp_want = NULL, e->plp_bad = NULL, e->plp_ntop = NULL, e->plp_rank = NULL;
    e->plp_out = NULL, e->plp_logits = NULL;
}

void mr_engine_free(mr_engine *e) {
    if (!e) return;
    if (e->req)
        for (int i = 0; i < e->max_req; i++) mr_free(e->req[i].mem);
    mr_free(e->req);
    mr_free(e->free_slots);
    mr_free(e->waiting);
    mr_free(e->running);
    mr_free(e->sched);
    mr_free(e->b_tokens);
    mr_free(e->b_ntok);
    mr_free(e->b_start);
    mr_free(e->b_btoff);
    mr_free(e->b_blocks);
    mr_free(e->b_logits);
    mr_free(e->logits);
    for (int i = 0; e->scr && i < e->n_scr; i++) {
        mr_free(e->scr[i].work);
        mr_free(e->scr[i].prob);
        mr_free(e->scr[i].idx);
        mr_free(e->scr[i].count);
    }
    mr_free(e->scr);
    mr_free(e->pick);
    mr_free(e->pick_i);
    mr_free(e->con_bits);
    mr_free(e->con_cnt);
    mr_free(e->con_slot);
    mr_free(e->ev);
    mr_free(e->top);
    mr_free(e->idlp);
    mr_free(e->routes_buf);
    plp_free(e);
    mr_free(e->chk);
    mr__engine_ep_free(e);
    mr__pool_free(&e->pool);
    mr_free(e);
}

mr_status mr_engine_new(mr_model *m, const mr_engine_opts *opts, mr_engine **out) {
    *out = NULL;
    if (!m || !opts) return mr_error_set(MR_EINVAL, "engine: no model or options");
    mr_engine_opts o = *opts;
    fill_defaults(&o);
    const mr_model_config *c = mr_model_config_of(m);
    if (!mr_kv_dtype_name(o.kv_dtype))
        return mr_error_set(MR_EINVAL, "engine: the KV cache holds fp32, bf16, fp8_e4m3 or fp8_e5m2");
    if (o.kv_blocks < 1) return mr_error_set(MR_EINVAL, "engine: kv_blocks must be >= 1");
    if (o.max_batch_tokens < o.max_running_requests)
        return mr_error_set(MR_EINVAL,
                            "engine: max_batch_tokens (%lld) is below max_running_requests (%d): every running "
                            "request's decode token must fit one step",
                            (long long)o.max_batch_tokens, o.max_running_requests);
    clamp_to_pool(&o);
    if (o.max_running_requests > 1 << 20 || o.max_queued_requests > 1 << 22)
        return mr_error_set(MR_EINVAL, "engine: max_running_requests %d / max_queued_requests %d are out of range",
                            o.max_running_requests, o.max_queued_requests);
    /* the model must run this engine's steps */
    if (mr_model_kv_blocks(m) != o.kv_blocks)
        return mr_error_set(MR_EINVAL, "engine: kv_blocks is %lld, the model's pool holds %lld (open the model with "
                            "mr_engine_model_opts)", (long long)o.kv_blocks, (long long)mr_model_kv_blocks(m));
    if (mr_model_kv_dtype(m) != o.kv_dtype)
        return mr_error_set(MR_EINVAL, "engine: kv_dtype differs from the model's pool");
    if (mr_model_max_tokens(m) < o.max_batch_tokens)
        return mr_error_set(MR_EINVAL, "engine: max_batch_tokens is %lld, the model runs at most %lld tokens per call",
                            (long long)o.max_batch_tokens, (long long)mr_model_max_tokens(m));
    if (mr_model_max_ctx(m) < o.context_length)
        return mr_error_set(MR_EINVAL, "engine: context_length is %lld, the model attends to at most %lld",
                            (long long)o.context_length, (long long)mr_model_max_ctx(m));
    mr_engine *e = mr_calloc(1, sizeof *e);
    if (!e) return mr_error_set(MR_ENOMEM, NULL);
    e->o = o;
    e->m = m;
    e->vocab = c->vocab;
    mr_status st = mr__pool_init(&e->pool, o.kv_blocks);
    if (st) {
        mr_free(e);
        return st;
    }
    size_t R = (size_t)o.max_running_requests, V = (size_t)c->vocab, bpc = (size_t)blocks_for(o.context_length);
    e->max_req = o.max_running_requests + o.max_queued_requests;
    e->cap_ev = e->max_req + o.max_running_requests;
    size_t nbt;
    if (!mr_size_mul(R, bpc, &nbt) || nbt > INT32_MAX) {
        mr_engine_free(e);
        return mr_error_set(MR_ECAPACITY, "engine: %zu running requests x %zu blocks per context overflow the batch",
                            R, bpc);
    }
    e->req = mr_calloc((size_t)e->max_req, sizeof(mr__req));
    e->free_slots = mr_malloc((size_t)e->max_req * sizeof(int32_t));
    e->waiting = mr_malloc((size_t)e->max_req * sizeof(int32_t));
    e->running = mr_malloc(R * sizeof(int32_t));
    e->sched = mr_malloc(R * sizeof(mr__sched));
    e->b_tokens = mr_malloc((size_t)o.max_batch_tokens * sizeof(int32_t));
    e->b_ntok = mr_malloc(R * sizeof(int64_t));
    e->b_start = mr_malloc(R * sizeof(int64_t));
    e->b_btoff = mr_malloc((R + 1) * sizeof(int32_t));
    e->b_blocks = mr_malloc((nbt ? nbt : 1) * sizeof(int32_t));
    e->b_logits = mr_malloc(R);
    e->logits = mr_malloc(R * V * sizeof(float));
    e->pick = mr_malloc(R * sizeof(mr__pick));
    e->pick_i = mr_malloc(R * sizeof(int32_t));
    const int thr = omp_get_max_threads();
    e->n_scr = thr < MR__SAMPLE_THREADS ? thr : MR__SAMPLE_THREADS;
    e->scr = mr_calloc((size_t)e->n_scr, sizeof(mr__scratch));
    bool scr_ok = e->scr != NULL;
    for (int i = 0; scr_ok && i < e->n_scr; i++) {
        mr__scratch *sc = &e->scr[i];
        sc->work = mr_malloc(V * sizeof(float));
        sc->prob = mr_malloc(V * sizeof(float));
        sc->idx = mr_malloc(V * sizeof(int32_t));
        sc->count = mr_calloc(V, sizeof(int32_t));
        scr_ok = sc->work && sc->prob && sc->idx && sc->count;
    }
    e->ev = mr_malloc((size_t)e->cap_ev * sizeof(mr_engine_event));
    e->top = mr_malloc(R * (size_t)o.max_top_logprobs * sizeof(mr_token_logprob));
    e->chk = mr_malloc((size_t)o.kv_blocks * sizeof(int32_t));
    if (!e->chk || !e->req || !e->free_slots || !e->waiting || !e->running || !e->sched || !e->b_tokens || !e->b_ntok ||
        !e->b_start || !e->b_btoff || !e->b_blocks || !e->b_logits || !e->logits || !scr_ok || !e->pick ||
        !e->pick_i || !e->ev || !e->top) {
        mr_engine_free(e);
        return mr_error_set(MR_ENOMEM, NULL);
    }
    e->ep_max_blocks = (int64_t)nbt;
    if ((st = mr__engine_ep_init(e))) {
        mr_engine_free(e);
        return st;
    }
    for (int i = 0; i < e->max_req; i++) e->free_slots[i] = e->max_req - 1 - i;
    e->n_free_slots = e->max_req;
    /* the ranks of an expert-parallel group run every step on their resolved threads */
    mr__thr_init(&e->thr, omp_get_max_threads(), o.fixed_threads || e->ep_size > 1);
    *out = e;
    return MR_OK;
}

/* ---- requests ---- */

static mr__req *find(mr_engine *e, mr_req_id id) {
    uint64_t slot = (id & 0xffffffffu);
    if (id == 0 || slot == 0 || slot > (uint64_t)e->max_req) return NULL;
    mr__req *r = &e->req[slot - 1];
    return r->state != MR__RQ_FREE && r->id == id ? r : NULL;
}

/* t, the request's latest token, ends it (never before min_tokens: a forced
 * token can be a stop id there) */
static bool is_stop(const mr_engine *e, const mr__req *r, int32_t t) {
    if (r->n_tok - r->n_prompt < r->min_tokens) return false;
    for (int i = 0; i < r->n_stop; i++)
        if (r->stop_ids[i] == t) return true;
    return !r->ignore_eos && mr_model_is_eos(e->m, t);
}

/* The buffers of a step's constraint masks, with the first request that has a constraint. */
static mr_status con_alloc(mr_engine *e) {
    if (e->con_bits) return MR_OK;
    const size_t R = (size_t)e->o.max_running_requests, words = (size_t)(e->vocab + 31) / 32;
    e->con_bits = mr_malloc(R * words * sizeof(uint32_t));
    e->con_cnt = mr_malloc(R * sizeof(int64_t));
    e->con_slot = mr_malloc(R * sizeof(int32_t));
    if (e->con_bits && e->con_cnt && e->con_slot) return MR_OK;
    mr_free(e->con_bits), mr_free(e->con_cnt), mr_free(e->con_slot);
    e->con_bits = NULL, e->con_cnt = NULL, e->con_slot = NULL;
    return mr_error_set(MR_ENOMEM, "request: out of memory for the constraint masks (%zu requests of %lld ids)", R,
                        (long long)e->vocab);
}

/* Priority scheduling's order: a before b (a lower priority value, or the same and an earlier arrival). */
static bool before(const mr__req *a, const mr__req *b) { return a->prio != b->prio ? a->prio < b->prio : a->seq < b->seq; }

/* Puts slot s into the waiting queue at its place in that order. */
static void wait_insert(mr_engine *e, int32_t s) {
    int i = e->n_waiting;
    for (; i > 0 && before(&e->req[s], &e->req[e->waiting[(e->wait_head + i - 1) % e->max_req]]); i--)
        e->waiting[(e->wait_head + i) % e->max_req] = e->waiting[(e->wait_head + i - 1) % e->max_req];
    e->waiting[(e->wait_head + i) % e->max_req] = s;
    e->n_waiting++;
}

/* The buffers of prompt log-probabilities, with the first request that asks. */
static mr_status plp_alloc(mr_engine *e) {
    if (e->plp_tok) return MR_OK;
    size_t P = (size_t)e->o.max_batch_tokens;
    e->plp_tok = mr_malloc(P * sizeof(int64_t));
    e->plp_want = mr_malloc(P * sizeof(int32_t));
    e->plp_bad = mr_malloc(P);
    e->plp_ntop = mr_malloc(P * sizeof(int));
    e->plp_rank = mr_malloc(P * sizeof(int32_t));
    e->plp_out = mr_malloc(P * (1 + (size_t)e->o.max_top_logprobs) * sizeof(mr_token_logprob));
    e->plp_logits = mr_malloc((size_t)MR__PLP_CHUNK * (size_t)e->vocab * sizeof(float));
    if (e->plp_tok && e->plp_want && e->plp_bad && e->plp_ntop && e->plp_rank && e->plp_out && e->plp_logits)
        return MR_OK;
    plp_free(e);
    return mr_error_set(MR_ENOMEM, "request: out of memory for the prompt log-probabilities (%d rows of %lld logits)",
                        MR__PLP_CHUNK, (long long)e->vocab);
}

mr_status mr_engine_add(mr_engine *e, const mr_request_params *p, mr_req_id *out) {
    *out = 0;
    const mr_engine_opts *o = &e->o;
    if (!p || !p->prompt || p->n_prompt < 1) return mr_error_set(MR_EINVAL, "request: empty prompt");
    if (p->n_stop_ids < 0 || p->n_stop_ids > MR_ENGINE_MAX_STOP_IDS || (p->n_stop_ids > 0 && !p->stop_ids))
        return mr_error_set(MR_EINVAL, "request: %d stop token ids; at most %d", p->n_stop_ids, MR_ENGINE_MAX_STOP_IDS);
    if (p->top_logprobs < 0 || p->top_logprobs > o->max_top_logprobs)
        return mr_error_set(MR_EINVAL, "request: top_logprobs %d is outside 0..%d", p->top_logprobs,
                            o->max_top_logprobs);
    if (p->max_tokens < 0) return mr_error_set(MR_EINVAL, "request: max_tokens %lld is negative", (long long)p->max_tokens);
    if (p->n_forced < 0 || (p->n_forced > 0 && !p->forced)) return mr_error_set(MR_EINVAL, "request: bad forced tokens");
    if (p->n_logit_bias < 0 || p->n_logit_bias > MR_ENGINE_MAX_LOGIT_BIAS || (p->n_logit_bias > 0 && !p->logit_bias))
        return mr_error_set(MR_EINVAL, "request: %d logit_bias entries; at most %d", p->n_logit_bias,
                            MR_ENGINE_MAX_LOGIT_BIAS);
    for (int i = 0; i < p->n_logit_bias; i++) {
        const mr_logit_bias *b = &p->logit_bias[i];
        if (b->token < 0 || b->token >= e->vocab)
            return mr_error_set(MR_EINPUT, "request: logit_bias token id %d is outside the vocabulary (%lld)",
                                (int)b->token, (long long)e->vocab);
        if (!(b->bias >= -100.0f && b->bias <= 100.0f))
            return mr_error_set(MR_EINVAL, "request: logit_bias of token %d is %g; it must be in [-100, 100]",
                                (int)b->token, (double)b->bias);
    }
    if (p->min_tokens < 0) return mr_error_set(MR_EINVAL, "request: min_tokens %lld is negative", (long long)p->min_tokens);
    if (p->n_allowed < 0 || p->n_allowed > e->vocab || (p->n_allowed > 0 && !p->allowed_ids))
        return mr_error_set(MR_EINVAL, "request: %lld allowed token ids; at most the vocabulary (%lld)",
                            (long long)p->n_allowed, (long long)e->vocab);
    for (int64_t i = 0; i < p->n_allowed; i++)
        if (p->allowed_ids[i] < 0 || p->allowed_ids[i] >= e->vocab)
            return mr_error_set(MR_EINPUT, "request: allowed token id %d is outside the vocabulary (%lld)",
                                (int)p->allowed_ids[i], (long long)e->vocab);
    if (p->n_bad_words < 0 || p->n_bad_words > MR_ENGINE_MAX_BAD_WORDS ||
        (p->n_bad_words > 0 && (!p->bad_words || !p->bad_word_len)))
        return mr_error_set(MR_EINVAL, "request: %d bad words; at most %d", p->n_bad_words, MR_ENGINE_MAX_BAD_WORDS);
    int64_t n_bad_tok = 0;
    for (int i = 0; i < p->n_bad_words; i++) {
        if (p->bad_word_len[i] < 1 || p->bad_word_len[i] > MR_ENGINE_MAX_BAD_WORD_TOKENS)
            return mr_error_set(MR_EINVAL, "request: bad word %d has %d tokens; 1..%d", i, (int)p->bad_word_len[i],
                                MR_ENGINE_MAX_BAD_WORD_TOKENS);
        n_bad_tok += p->bad_word_len[i];
    }
    for (int64_t i = 0; i < n_bad_tok; i++)
        if (p->bad_words[i] < 0 || p->bad_words[i] >= e->vocab)
            return mr_error_set(MR_EINPUT, "request: bad-word token id %d is outside the vocabulary (%lld)",
                                (int)p->bad_words[i], (long long)e->vocab);
    if (p->n_logprob_ids < 0 || p->n_logprob_ids > MR_ENGINE_MAX_LOGPROB_IDS || (p->n_logprob_ids > 0 && !p->logprob_ids))
        return mr_error_set(MR_EINVAL, "request: %d logprob ids; at most %d", p->n_logprob_ids, MR_ENGINE_MAX_LOGPROB_IDS);
    for (int i = 0; i < p->n_logprob_ids; i++)
        if (p->logprob_ids[i] < 0 || p->logprob_ids[i] >= e->vocab)
            return mr_error_set(MR_EINPUT, "request: logprob token id %d is outside the vocabulary (%lld)",
                                (int)p->logprob_ids[i], (long long)e->vocab);
    if (p->priority != 0 && !o->priority_scheduling)
        return mr_error_set(MR_EINVAL, "request: priority %lld needs priority scheduling (it is first come, first "
                            "served here)", (long long)p->priority);
    if (p->n_cache_salt > MR_ENGINE_MAX_CACHE_SALT || (p->n_cache_salt > 0 && !p->cache_salt))
        return mr_error_set(MR_EINVAL, "request: a cache_salt of %zu bytes; at most %d", p->n_cache_salt,
                            MR_ENGINE_MAX_CACHE_SALT);
    mr_status st = mr__sampling_check(&p->sampling);
    if (st) return mr_error_set(st, "request: %s", mr_error_last());
    /* the context and the pool */
    if (p->n_prompt >= o->context_length)
        return mr_error_set(MR_ECAPACITY,
                            "request: the prompt has %lld tokens; the context length is %lld (prompt + at least one "
                            "generated token)",
                            (long long)p->n_prompt, (long long)o->context_length);
    int64_t max_tokens = p->max_tokens ? p->max_tokens : o->context_length - p->n_prompt;
    if (max_tokens > o->context_length - p->n_prompt)
        return mr_error_set(MR_ECAPACITY,
                            "request: %lld prompt tokens + max_tokens %lld = %lld exceed the context length of %lld",
                            (long long)p->n_prompt, (long long)max_tokens, (long long)(p->n_prompt + max_tokens),
                            (long long)o->context_length);
    /* the last generated token is never fed back: KV for prompt + max_tokens - 1 positions */
    int64_t need = blocks_for(p->n_prompt + max_tokens - 1);
    if (need > e->pool.n)
        return mr_error_set(MR_ECAPACITY,
                            "request: %lld prompt tokens + max_tokens %lld need %lld KV blocks (%lld tokens); the whole "
                            "pool holds %lld blocks (%lld tokens)",
                            (long long)p->n_prompt, (long long)max_tokens, (long long)need, (long long)(need * BT),
                            (long long)e->pool.n, (long long)(e->pool.n * BT));
    for (int64_t i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= e->vocab)
            return mr_error_set(MR_EINPUT, "request: prompt token %lld: token id %d is outside the vocabulary (%lld)",
                                (long long)i, (int)p->prompt[i], (long long)e->vocab);
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] < 0 || p->stop_ids[i] >= e->vocab)
            return mr_error_set(MR_EINPUT, "request: stop token id %d is outside the vocabulary (%lld)",
                                (int)p->stop_ids[i], (long long)e->vocab);
    if (p->min_tokens > max_tokens)
        return mr_error_set(MR_EINVAL, "request: min_tokens %lld is above max_tokens %lld", (long long)p->min_tokens,
                            (long long)max_tokens);
    int64_t n_forced = p->n_forced < max_tokens ? p->n_forced : max_tokens;
    for (int64_t i = 0; i < n_forced; i++)
        if (p->forced[i] < 0 || p->forced[i] >= e->vocab)
            return mr_error_set(MR_EINPUT, "request: forced token %lld is %d, outside the vocabulary", (long long)i,
                                (int)p->forced[i]);
    if (e->n_waiting >= o->max_queued_requests || e->n_free_slots == 0)
        return mr_error_set(MR_EBUSY, "request: %d requests are waiting already (max_queued_requests %d)",
                            e->n_waiting, o->max_queued_requests);
    if (p->prompt_logprobs && (st = plp_alloc(e))) return st;
    if (p->routes && !e->routes_buf) {
        const mr_model_config *mc = mr_model_config_of(e->m);
        e->routes_buf = mr_malloc((size_t)o->max_batch_tokens * (size_t)mc->n_layers * (size_t)mc->top_k * sizeof(int32_t));
        if (!e->routes_buf) return mr_error_set(MR_ENOMEM, "request: out of memory for the routed experts");
    }
    if (!p->constraint.mask != !p->constraint.accept)
        return mr_error_set(MR_EINVAL, "request: a token constraint needs both mask and accept");
    if (p->constraint.mask && (st = con_alloc(e))) return st;
    /* one allocation: tokens, block table, forced tokens, logit bias, ... (4-byte fields all) */
    int64_t cap = p->n_prompt + max_tokens;
    size_t bytes = ((size_t)cap + (size_t)need + (size_t)n_forced + (size_t)p->n_allowed + (size_t)n_bad_tok +
                    (size_t)p->n_bad_words + (size_t)p->n_logprob_ids) * sizeof(int32_t) +
                   (size_t)p->n_logit_bias * sizeof(mr_logit_bias);
    void *mem = mr_malloc(bytes);
    if (!mem) return mr_error_set(MR_ENOMEM, "request: out of memory for %lld tokens", (long long)cap);
    int32_t slot = e->free_slots[--e->n_free_slots];
    mr__req *r = &e->req[slot];
    memset(r, 0, sizeof *r);
    r->mem = mem;
    r->tok = mem;
    r->bt = r->tok + cap;
    int32_t *forced = r->bt + need;
    memcpy(r->tok, p->prompt, (size_t)p->n_prompt * sizeof(int32_t));
    if (n_forced) memcpy(forced, p->forced, (size_t)n_forced * sizeof(int32_t));
    r->forced = forced;
    r->n_forced = n_forced;
    mr_logit_bias *bias = (mr_logit_bias *)(forced + n_forced);
    if (p->n_logit_bias) memcpy(bias, p->logit_bias, (size_t)p->n_logit_bias * sizeof(mr_logit_bias));
    r->bias = bias;
    r->n_bias = p->n_logit_bias;
    int32_t *allowed = (int32_t *)(bias + p->n_logit_bias), *bad = allowed + p->n_allowed, *bad_len = bad + n_bad_tok;
    if (p->n_allowed) memcpy(allowed, p->allowed_ids, (size_t)p->n_allowed * sizeof(int32_t));
    if (n_bad_tok) memcpy(bad, p->bad_words, (size_t)n_bad_tok * sizeof(int32_t));
    if (p->n_bad_words) memcpy(bad_len, p->bad_word_len, (size_t)p->n_bad_words * sizeof(int32_t));
    r->allowed = allowed;
    r->n_allowed = p->n_allowed;
    r->bad = bad;
    r->bad_len = bad_len;
    r->n_bad = p->n_bad_words;
    int32_t *lp_ids = bad_len + p->n_bad_words;
    if (p->n_logprob_ids) memcpy(lp_ids, p->logprob_ids, (size_t)p->n_logprob_ids * sizeof(int32_t));
    r->lp_ids = lp_ids;
    r->n_lp_ids = p->n_logprob_ids;
    r->min_tokens = p->min_tokens;
    r->n_prompt = r->n_tok = p->n_prompt;
    r->cap = cap;
    r->max_tokens = max_tokens;
    r->max_blocks = (int32_t)need;
    r->sp = p->sampling;
    r->rng = mr_sampler_seed_state(p->sampling.seed);
    r->n_stop = p->n_stop_ids;
    if (p->n_stop_ids) memcpy(r->stop_ids, p->stop_ids, (size_t)p->n_stop_ids * sizeof(int32_t));
    r->ignore_eos = p->ignore_eos;
    r->logprobs = p->logprobs;
    r->top_logprobs = p->top_logprobs;
    r->want_logits = p->want_logits;
    r->plp_next = p->prompt_logprobs_from > 1 ? p->prompt_logprobs_from : 1;
    r->plp = p->prompt_logprobs && r->plp_next < p->n_prompt;
    r->cancel = p->cancel;
    r->con = p->constraint;
    r->con_row = -1;
    r->user = p->user;
    r->root = p->n_cache_salt ? mr__salt_key(p->cache_salt, p->n_cache_salt) : MR__ROOT_KEY;
    r->last_key = r->root;
    if (++e->gen == 0) e->gen = 1;
    r->id = ((uint64_t)e->gen << 32) | (uint64_t)(slot + 1);
    r->state = MR__RQ_WAITING;
    r->prio = p->priority;
    r->routes = p->routes;
    r->seq = e->arrivals++;
    if (e->o.priority_scheduling) {
        wait_insert(e, slot);
    } else {
        e->waiting[(e->wait_head + e->n_waiting) % e->max_req] = slot;
        e->n_waiting++;
    }
    e->st.requests_added++;
    e->st.prompt_tokens += (uint64_t)p->n_prompt;
    *out = r->id;
    return MR_OK;
}

mr_status mr_engine_cancel(mr_engine *e, mr_req_id id) {
    mr__req *r = find(e, id);
    if (!r) return mr_error_set(MR_ENOTFOUND, "cancel: no queued or running request %llu", (unsigned long long)id);
    r->cancel_asked = true;
    return MR_OK;
}

/* ---- helpers of the step ---- */

static mr_engine_event *event(mr_engine *e, mr__req *r) {
    MR_ASSERT(e->n_ev < e->cap_ev);
    mr_engine_event *v = &e->ev[e->n_ev++];
    *v = (mr_engine_event){.id = r->id, .user = r->user, .stop_token = -1, .n_prompt = r->n_prompt,
                           .n_generated = r->n_tok - r->n_prompt, .n_cached = r->n_cached, .sched_ns = r->sched_ns,
                           .n_logprob_ids = r->n_lp_ids};
    return v;
}

/* Releases every block of r, the last first (a prefix's tail is then
 * evicted before its head). */
static void release_blocks(mr_engine *e, mr__req *r) {
    for (int32_t j = r->n_blocks - 1; j >= 0; j--) mr__pool_release(&e->pool, r->bt[j]);
    r->n_blocks = 0;
    r->n_computed = 0;
    r->n_hashed = 0;
    r->last_key = r->root;
}

static void running_remove(mr_engine *e, int idx) {
    memmove(e->running + idx, e->running + idx + 1, (size_t)(e->n_running - idx - 1) * sizeof(int32_t));
    e->n_running--;
}

/* Ends request r (already off the queues): blocks back, slot free. */
static void retire(mr_engine *e, mr__req *r, mr_finish_reason why) {
    release_blocks(e, r);
    e->st.requests_finished[why]++;
    mr_free(r->mem);
    r->mem = NULL;
    r->state = MR__RQ_FREE;
    r->id = 0;
    e->free_slots[e->n_free_slots++] = (int32_t)(r - e->req);
}

static bool cancelled(const mr__req *r) {
    return r->cancel_asked || (r->cancel && atomic_load_explicit(r->cancel, memory_order_acquire) != 0);
}

/* Cancelled requests, queued or running, end now with their blocks freed. */
static void sweep_cancelled(mr_engine *e) {
    int w = 0;
    for (int i = 0; i < e->n_waiting; i++) { /* compact the queue in place, keeping its order */
        int32_t s = e->waiting[(e->wait_head + i) % e->max_req];
        mr__req *r = &e->req[s];
        if (cancelled(r)) {
            event(e, r)->finish = MR_FINISH_CANCELLED;
            retire(e, r, MR_FINISH_CANCELLED);
        } else {
            e->waiting[(e->wait_head + w++) % e->max_req] = s;
        }
    }
    e->n_waiting = w;
    for (int i = 0; i < e->n_running;) {
        mr__req *r = &e->req[e->running[i]];
        if (cancelled(r)) {
            event(e, r)->finish = MR_FINISH_CANCELLED;
            running_remove(e, i);
            retire(e, r, MR_FINISH_CANCELLED);
        } else {
            i++;
        }
    }
}

/* Preempts the newest running request (priority scheduling: the last in (priority, arrival) order): blocks
 * freed, to the front of the queue (its place in that order). */
static void preempt_newest(mr_engine *e) {
    int32_t s = e->running[e->n_running - 1];
    mr__req *r = &e->req[s];
    e->n_running--;
    release_blocks(e, r);
    r->state = MR__RQ_WAITING;
    if (e->o.priority_scheduling) {
        wait_insert(e, s);
    } else {
        e->wait_head = (e->wait_head + e->max_req - 1) % e->max_req;
        e->waiting[e->wait_head] = s;
        e->n_waiting++;
    }
    e->st.preemptions++;
    e->out.n_preempted++;
}

int mr_engine_retract(mr_engine *e) {
    const int n = e->n_running;
    while (e->n_running > 0) preempt_newest(e); /* the newest first to the front: the oldest ends up first */
    e->out.n_preempted = 0; /* not a step's */
    return n;
}

/* Blocks so that r's table covers positions 0 .. upto - 1. false when the
 * pool has too few (nothing is taken then). */
static bool grow(mr_engine *e, mr__req *r, int64_t upto) {
    int64_t need = blocks_for(upto) - r->n_blocks;
    if (need <= 0) return true;
    if (need > mr__pool_available(&e->pool)) return false;
    MR_ASSERT(r->n_blocks + need <= r->max_blocks);
    for (int64_t i = 0; i < need; i++) r->bt[r->n_blocks++] = mr__pool_take(&e->pool);
    return true;
}

/* The longest cached prefix of r's known tokens, leaving at least one token
 * to compute (its logits are needed): referenced, into r's table. Owed prompt
 * log-probabilities need the logits from the position before the first owed
 * token: no hit past it. */
static void match_prefix(mr_engine *e, mr__req *r) {
    if (e->o.no_prefix_caching || r->routes) return; /* routes: every position computed, so that each has its own */
    int64_t full = (r->n_tok - 1) / BT;
    if (r->plp && r->plp_next < r->n_prompt && (r->plp_next - 1) / BT < full) full = (r->plp_next - 1) / BT;
    mr__key parent = r->root;
    int32_t j = 0;
    for (; j < full; j++) {
        const int32_t *t = r->tok + (size_t)j * BT;
        mr__key k = mr__block_key(parent, t);
        int32_t b = mr__pool_lookup(&e->pool, k, parent, t);
        if (b < 0) break;
        mr__pool_ref(&e->pool, b);
        r->bt[j] = b;
        parent = k;
    }
    r->n_blocks = r->n_hashed = j;
    r->n_computed = (int64_t)j * BT;
    r->last_key = parent;
}

/* Prompt log-probabilities: how many rows a chunk of n tokens from position s needs (the positions q
 * in [s, s + n) whose next token is a prompt token still owed), and the first such q. */
static int64_t plp_rows(const mr__req *r, int64_t s, int64_t n, int64_t *q0) {
    *q0 = s;
    if (!r->plp) return 0;
    int64_t lo = s > r->plp_next - 1 ? s : r->plp_next - 1, hi = s + n < r->n_prompt - 1 ? s + n : r->n_prompt - 1;
    *q0 = lo;
    return hi > lo ? hi - lo : 0;
}

static void add_sched(mr_engine *e, int32_t slot, int64_t n) {
    mr__req *r = &e->req[slot];
    int64_t q0, rows = plp_rows(r, r->n_computed, n, &q0);
    const bool sample = r->n_computed + n == r->n_tok;
    e->sched[e->n_sched++] = (mr__sched){.slot = slot, .n = n, .sample = sample, .plp_row = e->n_plp,
                                         .plp_n = (int32_t)rows, .plp_q0 = q0, .idlp_off = e->n_idlp};
    e->n_plp += (int)rows;
    e->n_idlp += (rows + sample) * r->n_lp_ids;
    e->step_routes |= r->routes;
}

/* Room in e->idlp for this step's logprob-id rows (kept for the next steps). */
static mr_status idlp_grow(mr_engine *e) {
    if (e->n_idlp <= e->cap_idlp) return MR_OK;
    int64_t cap = e->cap_idlp * 2 > e->n_idlp ? e->cap_idlp * 2 : e->n_idlp;
    float *p = mr_malloc((size_t)cap * sizeof(float));
    if (!p)
        return mr_error_set(MR_ENOMEM, "logprob ids: out of memory for %lld log-probabilities", (long long)e->n_idlp);
    mr_free(e->idlp);
    e->idlp = p;
    e->cap_idlp = cap;
    return MR_OK;
}

/* Builds e->batch from e->sched. */
static void build_batch(mr_engine *e) {
    int64_t t = 0;
    int32_t nb = 0;
    int n_logits = 0;
    e->b_btoff[0] = 0;
    for (int i = 0; i < e->n_sched; i++) {
        const mr__sched *s = &e->sched[i];
        const mr__req *r = &e->req[s->slot];
        for (int32_t k = 0; k < s->plp_n; k++) { /* the rows of prompt logprobs: token t at position n_computed */
            e->plp_tok[s->plp_row + k] = t + (s->plp_q0 - r->n_computed) + k;
            e->plp_want[s->plp_row + k] = r->tok[s->plp_q0 + k + 1];
        }
        memcpy(e->b_tokens + t, r->tok + r->n_computed, (size_t)s->n * sizeof(int32_t));
        t += s->n;
        e->b_ntok[i] = s->n;
        e->b_start[i] = r->n_computed;
        memcpy(e->b_blocks + nb, r->bt, (size_t)r->n_blocks * sizeof(int32_t));
        nb += r->n_blocks;
        e->b_btoff[i + 1] = nb;
        e->b_logits[i] = s->sample;
        n_logits += s->sample;
    }
    e->batch = (mr_kv_batch){.n_seq = e->n_sched, .n_tokens = t, .tokens = e->b_tokens, .n_tok = e->b_ntok,
                             .start = e->b_start, .bt_off = e->b_btoff, .block_ids = e->b_blocks,
                             .want_logits = e->b_logits, .n_logits = n_logits, .n_extra = e->n_plp,
                             .extra_tok = e->n_plp ? e->plp_tok : NULL};
}

/* ---- schedule ---- */

mr_status mr_engine_schedule(mr_engine *e, const mr_kv_batch **out) {
    uint64_t t0 = mr_now_ns();
    if (e->scheduled) return mr_error_set(MR_ESTATE, "engine: schedule called twice without complete");
    e->n_ev = 0;
    e->n_sched = 0;
    e->n_plp = 0;
    e->n_idlp = 0;
    e->step_routes = false;
    e->out = (mr_engine_step_out){0};
    e->err[0] = 0;
    sweep_cancelled(e);
    int64_t budget = e->hold == MR_HOLD_ALL ? 0 : e->o.max_batch_tokens;
    /* 1. running requests, oldest first: a decode token or the next prefill chunk */
    for (int i = 0; i < e->n_running && budget > 0; i++) {
        int32_t slot = e->running[i];
        mr__req *r = &e->req[slot];
        int64_t n = r->n_tok - r->n_computed;
        if (n > budget) n = budget;
        bool ok;
        while (!(ok = grow(e, r, r->n_computed + n))) {
            /* out of blocks: preempt the newest running request (this one, last) */
            bool self = e->running[e->n_running - 1] == slot;
            preempt_newest(e);
            if (self) break;
        }
        if (!ok) break; /* r itself went back to the queue; everyone after it too */
        add_sched(e, slot, n);
        budget -= n;
    }
    /* 2. waiting requests, first come first served */
    while (e->hold == MR_HOLD_NONE && e->n_waiting > 0 && e->n_running < e->o.max_running_requests && budget > 0) {
        int32_t slot = e->waiting[e->wait_head];
        mr__req *r = &e->req[slot];
        match_prefix(e, r);
        int64_t hit = r->n_computed;
        int64_t n = r->n_tok - r->n_computed;
        if (n > budget) n = budget;
        if (!grow(e, r, r->n_computed + n)) {
            release_blocks(e, r); /* the hits go back; wait for blocks */
            break;
        }
        e->wait_head = (e->wait_head + 1) % e->max_req;
        e->n_waiting--;
        r->state = MR__RQ_RUNNING;
        if (e->o.priority_scheduling) { /* the running list in (priority, arrival) order: the last is preempted first */
            int k = e->n_running++;
            for (; k > 0 && before(r, &e->req[e->running[k - 1]]); k--) e->running[k] = e->running[k - 1];
            e->running[k] = slot;
        } else {
            e->running[e->n_running++] = slot;
        }
        if (!e->o.no_prefix_caching) {
            e->st.prefix_queries += (uint64_t)r->n_tok;
            e->st.prefix_hits += (uint64_t)hit;
            e->st.prefix_hit_blocks += (uint64_t)(hit / BT);
        }
        if (!r->scheduled_once) {
            r->scheduled_once = true;
            r->n_cached = hit < r->n_prompt ? hit : r->n_prompt;
            r->sched_ns = mr_now_ns();
        }
        add_sched(e, slot, n);
        budget -= n;
    }
    build_batch(e);
    e->out.n_seq = e->n_sched;
    e->out.n_tokens = e->batch.n_tokens;
    for (int i = 0; i < e->n_sched; i++) {
        const mr__sched *s = &e->sched[i];
        const mr__req *r = &e->req[s->slot];
        if (s->n == 1 && r->n_computed == r->n_tok - 1 && r->n_tok > r->n_prompt)
            e->out.n_decode_tokens += 1;
        else
            e->out.n_prefill_tokens += s->n;
    }
    e->scheduled = true;
    *out = &e->batch;
    uint64_t t1 = mr_now_ns();
    e->st.schedule_ns += t1 - t0;
    e->t_sched_end = t1;
    return MR_OK;
}

/* ---- complete ---- */

/* Registers r's newly full blocks in the prefix table. */
static void register_blocks(mr_engine *e, mr__req *r) {
    if (e->o.no_prefix_caching) return;
    while ((int64_t)(r->n_hashed + 1) * BT <= r->n_computed) {
        int32_t j = r->n_hashed;
        const int32_t *t = r->tok + (size_t)j * BT;
        mr__key k = mr__block_key(r->last_key, t);
        int32_t b = r->bt[j];
        if (!e->pool.cached[b]) mr__pool_register(&e->pool, b, k, r->last_key, t);
        r->last_key = k;
        r->n_hashed++;
    }
}

/* The scheduled entry whose prompt-logprob rows hold row k. */
static int plp_owner(const mr_engine *e, int k) {
    int i = 0;
    while (i < e->n_sched - 1 && !(k >= e->sched[i].plp_row && k < e->sched[i].plp_row + e->sched[i].plp_n)) i++;
    return i;
}

mr_status mr_engine_complete(mr_engine *e, mr_status forward_status, const float *logits,
                             const mr_engine_step_out **out) {
    if (!e->scheduled) return mr_error_set(MR_ESTATE, "engine: complete called without schedule");
    uint64_t t0 = mr_now_ns();
    e->st.forward_ns += t0 - e->t_sched_end;
    e->scheduled = false;
    if (forward_status != MR_OK) snprintf(e->err, sizeof e->err, "forward pass failed: %s", mr_error_last());
    uint64_t sample_ns = 0;
    int row = 0;
    int64_t b_off = 0; /* the batch rows of the scheduled requests before this one */
    const int stride = 1 + e->o.max_top_logprobs;
    /* the prompt rows' log-probabilities: their logits a chunk at a time from the model, the
     * rows of a chunk over the threads; a failure ends the requests of the batch that have rows */
    mr_status plp_st = MR_OK, id_st = idlp_grow(e);
    if (id_st) snprintf(e->err, sizeof e->err, "%s", mr_error_last());
    for (int k0 = 0; forward_status == MR_OK && !plp_st && k0 < e->n_plp; k0 += MR__PLP_CHUNK) {
        const int n = e->n_plp - k0 < MR__PLP_CHUNK ? e->n_plp - k0 : MR__PLP_CHUNK;
        if ((plp_st = mr_model_extra_logits(e->m, k0, n, e->plp_logits))) {
            snprintf(e->err, sizeof e->err, "prompt log-probabilities: %s", mr_error_last());
            break;
        }
        uint64_t ts = mr_now_ns();
        #pragma omp parallel for num_threads(e->thr.all) schedule(dynamic, 1) if (n > 1)
        for (int k = k0; k < k0 + n; k++) {
            mr_token_logprob *o = e->plp_out + (size_t)k * (size_t)stride;
            const mr__sched *s = &e->sched[plp_owner(e, k)];
            const mr__req *r = &e->req[s->slot];
            const float *lrow = e->plp_logits + (size_t)(k - k0) * (size_t)e->vocab;
            const int n_ids = id_st ? 0 : r->n_lp_ids;
            o->token = e->plp_want[k];
            e->plp_ntop[k] = 0;
            e->plp_bad[k] = mr__engine_logprob(e, lrow, o->token, r->top_logprobs, &o->logprob, o + 1, &e->plp_ntop[k],
                                               r->lp_ids, n_ids,
                                               n_ids ? e->idlp + s->idlp_off + (k - s->plp_row) * n_ids : NULL) != MR_OK;
            int32_t rank = 1; /* vLLM's: 1 + the ids whose logit is at least the token's, the token aside */
            for (int64_t v = 0; v < e->vocab; v++) rank += lrow[v] >= lrow[o->token] && v != o->token;
            e->plp_rank[k] = rank;
        }
        for (int k = k0; k < k0 + n; k++) /* a bad row's message, here on the engine's thread */
            if (e->plp_bad[k] && mr__engine_logprob(e, e->plp_logits + (size_t)(k - k0) * (size_t)e->vocab, 0, 0,
                                                    &(float){0}, NULL, &(int){0}, NULL, 0, NULL))
                snprintf(e->err, sizeof e->err, "%s", mr_error_last());
        sample_ns += mr_now_ns() - ts;
    }
    /* structured outputs: the masks of this step's constrained sampling rows, over the threads (each
     * request's own matcher); pick uses them */
    int n_con = 0;
    for (int i = 0; forward_status == MR_OK && e->con_bits && i < e->n_sched; i++) {
        mr__req *r = &e->req[e->sched[i].slot];
        r->con_row = -1;
        if (e->sched[i].sample && r->con.mask && r->n_tok - r->n_prompt >= r->n_forced) {
            r->con_row = n_con;
            e->con_slot[n_con++] = e->sched[i].slot;
        }
    }
    if (n_con) {
        const size_t words = (size_t)(e->vocab + 31) / 32;
        uint64_t ts = mr_now_ns();
        #pragma omp parallel for num_threads(e->thr.all) schedule(dynamic, 1) if (n_con > 1)
        for (int k = 0; k < n_con; k++) {
            const mr__req *r = &e->req[e->con_slot[k]];
            uint32_t *b = e->con_bits + (size_t)k * words;
            memset(b, 0, words * sizeof(uint32_t));
            e->con_cnt[k] = r->con.mask(r->con.ctx, b);
        }
        sample_ns += mr_now_ns() - ts;
    }
    /* the sampling rows: each request's token from its own row, rng and masks, on the scratch of the
     * thread that takes it, over the threads when the rows hold many ids together (the tokens do not
     * depend on which thread: tests/test_engine.c test_parallel_sampling) */
    int n_pick = 0;
    for (int i = 0; forward_status == MR_OK && i < e->n_sched; i++)
        if (e->sched[i].sample) e->pick_i[n_pick++] = i;
    if (n_pick) {
        uint64_t ts = mr_now_ns();
        #pragma omp parallel for num_threads(e->n_scr) schedule(dynamic, 1) \
            if (n_pick > 1 && (int64_t)n_pick * e->vocab >= MR__SAMPLE_PAR_IDS)
        for (int k = 0; k < n_pick; k++) {
            const int i = e->pick_i[k];
            mr__pick *o = &e->pick[i];
            const float *lg = logits + (size_t)k * (size_t)e->vocab; /* rows in scheduled order */
            mr_token_logprob *top = e->top + (size_t)i * (size_t)e->o.max_top_logprobs;
            const mr__sched *s = &e->sched[i];
            mr__req *r = &e->req[s->slot];
            float *id_lp = r->n_lp_ids && !id_st ? e->idlp + s->idlp_off + (int64_t)s->plp_n * r->n_lp_ids : NULL;
            o->logprob = 0.0f; /* when not asked */
            if (r->n_lp_ids && id_st) { /* no room for its ids' log-probabilities (e->err says why) */
                o->st = id_st;
                snprintf(o->err, sizeof o->err, "%s", e->err);
                continue;
            }
            o->st = mr__engine_pick(e, &e->scr[omp_get_thread_num()], r, lg, &o->tok, &o->logprob, top, &o->n_top,
                                    id_lp);
            if (o->st) snprintf(o->err, sizeof o->err, "%s", mr_error_last());
        }
        sample_ns += mr_now_ns() - ts;
    }
    for (int i = 0; i < e->n_sched; i++) {
        const mr__sched *s = &e->sched[i];
        mr__req *r = &e->req[s->slot];
        const float *lg = s->sample && logits ? logits + (size_t)row * (size_t)e->vocab : NULL;
        row += s->sample;
        const int64_t tok_off = b_off; /* this request's first row in the batch */
        b_off += s->n;
        if (forward_status != MR_OK) {
            mr_engine_event *v = event(e, r);
            v->finish = r->fin = MR_FINISH_ERROR; /* leaves the running list below */
            v->error = e->err;
            continue;
        }
        r->n_computed += s->n;
        e->st.computed_tokens += (uint64_t)s->n;
        register_blocks(e, r);
        mr_engine_event *v = NULL;
        if (s->plp_n > 0) { /* the prompt tokens' log-probabilities this chunk computed (above) */
            bool bad = plp_st != MR_OK || (id_st != MR_OK && r->n_lp_ids);
            for (int32_t k = 0; k < s->plp_n; k++) bad |= e->plp_bad[s->plp_row + k] != 0;
            const int n_top = e->plp_ntop[s->plp_row];
            v = event(e, r);
            if (bad) {
                v->finish = r->fin = MR_FINISH_ERROR;
                v->error = e->err;
                continue;
            }
            v->plp_pos = s->plp_q0 + 1;
            v->n_plp = s->plp_n;
            v->plp_ntop = n_top;
            v->plp_stride = stride;
            v->plp = e->plp_out + (size_t)s->plp_row * (size_t)stride;
            v->plp_rank = e->plp_rank + s->plp_row;
            if (r->n_lp_ids) v->plp_id_logprob = e->idlp + s->idlp_off;
            r->plp_next = s->plp_q0 + s->plp_n + 1;
        }
        if (r->routes) { /* the experts the positions computed here selected (the capture of the forward) */
            if (!v) v = event(e, r);
            const mr_model_config *mc = mr_model_config_of(e->m);
            v->routes_pos = r->n_computed - s->n;
            v->n_routes = s->n;
            v->routes = e->routes_buf + (size_t)tok_off * (size_t)mc->n_layers * (size_t)mc->top_k;
        }
        if (!s->sample) continue; /* a prefill chunk that does not reach the end yet */
        const mr__pick *pk = &e->pick[i];
        const int32_t tok = pk->tok;
        const int n_top = pk->n_top;
        mr_token_logprob *top = e->top + (size_t)i * (size_t)e->o.max_top_logprobs;
        mr_status st = pk->st;
        if (st) {
            snprintf(e->err, sizeof e->err, "%s", pk->err);
        } else if (r->con.accept) { /* the constraint follows the token, here on the engine thread */
            uint64_t ts = mr_now_ns();
            if ((st = r->con.accept(r->con.ctx, tok))) snprintf(e->err, sizeof e->err, "%s", mr_error_last());
            sample_ns += mr_now_ns() - ts;
        }
        if (!v) v = event(e, r);
        if (st) {
            v->finish = r->fin = MR_FINISH_ERROR;
            v->error = e->err;
            continue;
        }
        bool first = r->n_tok == r->n_prompt;
        r->tok[r->n_tok++] = tok;
        e->st.generation_tokens++;
        v->n_tokens = 1;
        v->token = tok;
        v->logprob = pk->logprob;
        v->n_top = n_top;
        v->top = n_top ? top : NULL;
        v->logits = r->want_logits ? lg : NULL;
        if (r->n_lp_ids) v->id_logprob = e->idlp + s->idlp_off + (int64_t)s->plp_n * r->n_lp_ids;
        v->n_generated = r->n_tok - r->n_prompt;
        v->first_token = first;
        if (is_stop(e, r, tok)) {
            v->finish = MR_FINISH_STOP;
            v->stop_token = tok;
        } else if (r->n_tok - r->n_prompt >= r->max_tokens || r->n_tok >= e->o.context_length) {
            v->finish = MR_FINISH_LENGTH;
        }
        r->fin = v->finish;
    }
    /* finished requests leave the running list (order kept) and free their blocks */
    for (int i = 0; i < e->n_running;) {
        mr__req *r = &e->req[e->running[i]];
        if (r->fin == MR_FINISH_NONE) {
            i++;
            continue;
        }
        running_remove(e, i);
        retire(e, r, r->fin);
    }
    e->out.n_events = e->n_ev;
    e->out.events = e->ev;
    if (e->n_sched > 0) e->st.steps++;
    e->st.sample_ns += sample_ns;
    e->st.complete_ns += mr_now_ns() - t0 - sample_ns;
    *out = &e->out;
    return MR_OK;
}

mr_status mr_engine_step(mr_engine *e, const mr_engine_step_out **out) {
    const mr_kv_batch *b;
    mr_status st = mr_engine_schedule(e, &b); /* cancellations, decodes, prefill chunks, preemption */
    if (st) return st;
    mr_status fst = MR_OK;
    if (e->ep_size > 1 && e->ep_rank == 0) fst = mr__engine_ep_send(e, b); /* every rank runs the same batch */
    if (!fst && b->n_seq > 0) { /* the batch through the model, on one thread or all */
        const int k = mr__thr_pick(&e->thr, b->n_tokens, e->t_sched_end);
        const int before = omp_get_max_threads();
        omp_set_num_threads(k ? e->thr.all : 1); /* set each step: a caller's thread (serve's engine thread) may differ */
        if (e->step_routes) mr_model_capture_routes(e->m, e->routes_buf);
        fst = mr_model_forward_kv(e->m, b, e->logits);
        mr_model_capture_routes(e->m, NULL);
        const uint64_t t1 = mr_now_ns();
        omp_set_num_threads(before);
        if (!fst) mr__thr_seen(&e->thr, b->n_tokens, k, t1 - e->t_sched_end);
        e->st.steps_one_thread += k == 0;
    }
    st = mr_engine_complete(e, fst, e->logits, out);                     /* sample, stops, events, free */
    /* a broken expert-parallel group is the end of this engine (the requests have their error events) */
    if (e->ep_size > 1 && mr_ep_broken()) return mr_error_set(MR_EPEER, "%s", mr_ep_broken());
    return st;
}

/* ---- counters and the accounting check ---- */

void mr_engine_stats_get(const mr_engine *e, mr_engine_stats *s) {
    *s = e->st;
    s->running = e->n_running;
    s->waiting = e->n_waiting;
    s->kv_blocks_total = e->pool.n;
    s->kv_blocks_used = e->pool.n_used;
    s->kv_blocks_cached = e->pool.n_lru;
    s->kv_blocks_free = e->pool.n_free;
    s->kv_blocks_peak = e->pool.peak_used;
    s->kv_usage = (double)e->pool.n_used / (double)e->pool.n;
    s->evictions = e->pool.evictions;
}

void mr_engine_stats_reset(mr_engine *e) {
    e->st = (mr_engine_stats){0};
    e->pool.evictions = 0;
    e->pool.peak_used = e->pool.n_used;
}

mr_status mr_engine_check(const mr_engine *e) {
    mr_status st = mr__pool_check(&e->pool);
    if (st) return st;
    /* references: each block's count equals the table entries that list it */
    int32_t *cnt = e->chk;
    memset(cnt, 0, (size_t)e->pool.n * sizeof(int32_t));
    int n_wait = 0, n_run = 0;
    for (int i = 0; i < e->max_req && !st; i++) {
        const mr__req *r = &e->req[i];
        if (r->state == MR__RQ_FREE) continue;
        n_wait += r->state == MR__RQ_WAITING;
        n_run += r->state == MR__RQ_RUNNING;
        if (r->n_blocks < 0 || r->n_blocks > r->max_blocks || r->n_computed < 0 || r->n_computed > r->n_tok ||
            (int64_t)r->n_blocks * BT < r->n_computed || r->n_hashed > r->n_blocks ||
            (int64_t)r->n_hashed * BT > r->n_computed || r->n_tok > r->cap || r->n_tok < r->n_prompt)
            st = mr_error_set(MR_ESTATE, "request %llu: %d blocks (max %d), %lld computed of %lld tokens, %d hashed",
                              (unsigned long long)r->id, r->n_blocks, r->max_blocks, (long long)r->n_computed,
                              (long long)r->n_tok, r->n_hashed);
        else if (r->state == MR__RQ_WAITING && r->n_blocks != 0)
            st = mr_error_set(MR_ESTATE, "waiting request %llu holds %d blocks", (unsigned long long)r->id, r->n_blocks);
        for (int32_t j = 0; j < r->n_blocks && !st; j++) {
            int32_t b = r->bt[j];
            if (b < 0 || b >= e->pool.n) st = mr_error_set(MR_ESTATE, "request %llu lists block %d", (unsigned long long)r->id, (int)b);
            else if (cnt[b]++ > 0 && !e->pool.cached[b])
                st = mr_error_set(MR_ESTATE, "block %d is shared but not in the prefix table", (int)b);
            else if (e->pool.cached[b] && (int64_t)(j + 1) * BT > r->n_computed)
                st = mr_error_set(MR_ESTATE, "request %llu: cached block %d holds positions it has not computed",
                                  (unsigned long long)r->id, (int)b);
        }
    }
    for (int64_t b = 0; b < e->pool.n && !st; b++)
        if (cnt[b] != e->pool.ref[b])
            st = mr_error_set(MR_ESTATE, "block %lld: reference count %d, listed by %d request tables", (long long)b,
                              e->pool.ref[b], cnt[b]);
    if (st) return st;
    if (n_wait != e->n_waiting || n_run != e->n_running)
        return mr_error_set(MR_ESTATE, "%d waiting / %d running requests, the queues hold %d / %d", n_wait, n_run,
                            e->n_waiting, e->n_running);
    for (int i = 0; i < e->n_waiting; i++)
        if (e->req[e->waiting[(e->wait_head + i) % e->max_req]].state != MR__RQ_WAITING)
            return mr_error_set(MR_ESTATE, "the queue lists a request that is not waiting");
    for (int i = 0; i < e->n_running; i++)
        if (e->req[e->running[i]].state != MR__RQ_RUNNING)
            return mr_error_set(MR_ESTATE, "the running list lists a request that is not running");
    if (e->n_free_slots + n_wait + n_run != e->max_req)
        return mr_error_set(MR_ESTATE, "%d free slots + %d requests != %d", e->n_free_slots, n_wait + n_run, e->max_req);
    return MR_OK;
}
