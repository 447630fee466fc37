/* moerun/engine.h — the engine loop as a library: requests, the
 * continuous-batching scheduler (token budget, chunked prefill, FCFS,
 * preemption by recompute), the paged KV block pool with prefix caching,
 * sampling (with penalties and logprobs), stop conditions and cancellation.
 *
 * Ownership and threads. One thread (the engine thread) owns an mr_engine,
 * the model it drives and every request in it: mr_engine_add, _step, _cancel
 * and _stats are called from that thread only. The one exception is a
 * request's cancel flag (mr_request_params.cancel): memory the caller owns,
 * which any thread may set; the engine reads it at every step boundary, for
 * queued and running requests alike, and frees the request's blocks in that
 * step. A server keeps its own per-request state (and the flag) alive until
 * it has seen that request's finishing event.
 *
 * One step, top to bottom (mr_engine_step):
 *   schedule   cancellations; running requests first (a decode token, or the
 *              next chunk of an unfinished prefill), then waiting ones FCFS,
 *              within max_batch_tokens and max_running_requests; blocks are
 *              taken from the pool (prefix-cache hits first); when blocks run
 *              out the newest running request is preempted by recompute
 *   forward    the batch (mr_kv_batch, a plain description: token ids,
 *              positions, block tables) through mr_model_forward_kv
 *   complete   sample, stop checks, events, register full blocks in the
 *              prefix cache, free the blocks of finished requests.
 * mr_engine_schedule / mr_engine_complete are the two halves, for a caller
 * that must run the forward itself (expert parallelism: rank 0 schedules,
 * broadcasts the batch, every rank runs the forward in lockstep). The batch
 * names its blocks by index, so every rank's pool (same size, same exec)
 * holds the same K/V; sampling happens on the scheduling rank only. With
 * data-parallel attention later, the sequences of one batch would be split
 * between ranks, each with its own pool and block tables; the batch already
 * carries everything per sequence for that split.
 *
 * The per-step path does not allocate: every buffer is sized at
 * mr_engine_new from the options (mr_engine_add allocates once per request,
 * for its token list and block table). */
#ifndef MOERUN_ENGINE_H
#define MOERUN_ENGINE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moerun/base.h"
#include "moerun/config.h"
#include "moerun/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- engine options (all limits have defaults; zeroed fields take them) ---- */
typedef struct {
    mr_format kv_dtype;           /* KV cache element type (model.h's mr_kv_dtype_name): MR_FMT_BF16,
                                     MR_FMT_E4M3, MR_FMT_E5M2 or MR_FMT_F32 (exactness; F32 is 0,
                                     so zeroed options mean F32; mr_engine_opts_from_exec gives the resolver's) */
    int64_t kv_blocks;            /* pool size in blocks of MR_KV_BLOCK_TOKENS tokens (required, >= 1) */
    int64_t max_batch_tokens;     /* tokens in one step, prefill chunks and decodes together [512];
                                     must be >= max_running_requests */
    int max_running_requests;     /* requests in the running set [256] */
    int max_queued_requests;      /* waiting requests beyond which mr_engine_add says MR_EBUSY [1024] */
    int64_t context_length;       /* prompt + generated tokens of one request [4096] */
    bool no_prefix_caching;       /* prefix caching is on unless this is set */
    bool priority_scheduling;     /* requests go by mr_request_params.priority (lower first), then arrival, into
                                     the batch and out of it under preemption; else first come, first served */
    int max_top_logprobs;         /* largest top_logprobs a request may ask [20] */
    bool fixed_threads;           /* every step on all threads (the creator's omp_get_max_threads at
                                     mr_engine_new). By default a step of few tokens runs on one thread while
                                     that measures faster: a parallel region waits for its slowest thread, and
                                     beside other work on the cores that can be several times slower. The
                                     results are the same either way; expert parallel always runs fixed. */
} mr_engine_opts;

/* The engine options the resolution decided (kv_cache_dtype, kv_cache_memory
 * -> kv_blocks, max_batch_tokens, max_running_requests, context_length);
 * the rest take their defaults. */
void mr_engine_opts_from_exec(const mr_exec *x, mr_engine_opts *o);
/* Fills the KV / batch fields of model opts so that a model opened with them
 * can run this engine's steps: paged pool of o->kv_blocks in o->kv_dtype, no
 * contiguous cache, activations for max_batch_tokens, attention scratch for
 * context_length. The caller sets exec (or runner) and progress. */
void mr_engine_model_opts(const mr_engine_opts *o, mr_model_opts *mo);

typedef struct mr_engine mr_engine;

/* Creates an engine over m, which it borrows (close the model after
 * mr_engine_free). m must have been opened with mr_engine_model_opts(o)
 * (checked: MR_EINVAL naming the field otherwise). */
mr_status mr_engine_new(mr_model *m, const mr_engine_opts *o, mr_engine **out);
void mr_engine_free(mr_engine *e); /* NULL ok; drops every request without events */
mr_model *mr_engine_model(mr_engine *e);
const mr_engine_opts *mr_engine_opts_of(const mr_engine *e); /* with the defaults filled in */

/* ---- requests ---- */
typedef uint64_t mr_req_id; /* never 0 */

/* Sampling of one request, in this order: raw logits -> every id the
 * constraint masks (structured outputs), every id outside
 * allowed_ids (when given) and the last token of every bad word whose other
 * tokens end the output so far to -inf -> while fewer than
 * min_tokens are generated, the stop ids and (unless ignore_eos) the model's
 * EOS ids to -inf -> logit_bias added -> repetition penalty
 * (prompt and output tokens: a positive logit is divided by it, a negative
 * one multiplied) -> frequency and presence penalties (output tokens:
 * logit -= frequency * count + presence * (count > 0)) -> then temperature
 * <= 0 is greedy (argmax, ties to the lower id); otherwise logits /
 * temperature -> top-k -> top-p -> min-p -> a draw from the request's own
 * generator, seeded with seed (same seed and inputs, same tokens). The
 * order of the first seven is vLLM V1's sampler's (vllm/v1/sample/sampler.py:
 * allowed token ids, bad words, min tokens, logit bias, then the penalties);
 * log-probabilities are of the raw logits, before all of them. A step where
 * every id is masked ends the request with MR_FINISH_ERROR. */
typedef struct {
    float temperature;        /* [0] greedy */
    int top_k;                /* 0 = off */
    float top_p;              /* (0, 1]; 0 is taken as 1 = off */
    float min_p;              /* [0, 1]; 0 = off */
    uint64_t seed;
    float presence_penalty;   /* [-2, 2]; 0 = off (OpenAI semantics) */
    float frequency_penalty;  /* [-2, 2]; 0 = off */
    float repetition_penalty; /* (0, 10]; 0 or 1 = off (HF / vLLM semantics) */
} mr_sampling;

#define MR_ENGINE_MAX_STOP_IDS 16
#define MR_ENGINE_MAX_LOGIT_BIAS 1024
#define MR_ENGINE_MAX_BAD_WORDS 256      /* sequences */
#define MR_ENGINE_MAX_BAD_WORD_TOKENS 64 /* tokens in one sequence */
#define MR_ENGINE_MAX_LOGPROB_IDS 1024   /* ids whose log-probabilities a request follows (logprob_ids) */
#define MR_ENGINE_MAX_CACHE_SALT 1024    /* bytes of a request's cache_salt */

/* One entry of a request's logit bias (OpenAI's logit_bias): added to the
 * token's logit before the penalties; bias in [-100, 100]. */
typedef struct {
    int32_t token;
    float bias;
} mr_logit_bias;

/* A constraint on a request's generated tokens (structured outputs,
 * moerun/grammar.h): before sampling each token the engine thread calls
 * mask with a cleared bitset of (vocab + 31) / 32 words, in which it sets
 * bit id for each id that may come (the masks of one step's requests run
 * on the engine's threads side by side, one call per request: a mask
 * touches its own ctx only), and applies it first of all the masks; after each
 * generated token (forced ones too) it calls accept. A mask with no id set,
 * or an error from accept, ends the request with MR_FINISH_ERROR; accept
 * runs on the engine's thread. Both or neither are given (MR_EINVAL). ctx
 * is the caller's; the engine uses it until the request's last event. */
typedef struct {
    int64_t (*mask)(void *ctx, uint32_t *allow);
    mr_status (*accept)(void *ctx, int32_t token);
    void *ctx;
} mr_token_constraint;

typedef struct {
    const int32_t *prompt;        /* [n_prompt] token ids, copied at admission */
    int64_t n_prompt;             /* >= 1 */
    int64_t max_tokens;           /* tokens to generate, >= 1; 0 = up to the context length */
    mr_sampling sampling;
    const int32_t *stop_ids;      /* [n_stop_ids] extra stop token ids (copied); the model's EOS ids stop too */
    int n_stop_ids;               /* <= MR_ENGINE_MAX_STOP_IDS */
    bool ignore_eos;              /* the model's EOS ids do not stop (stop_ids still do) */
    int64_t min_tokens;           /* no stop id or EOS id is sampled before this many tokens (<= max_tokens) */
    const mr_logit_bias *logit_bias; /* [n_logit_bias] (copied); a token listed twice gets both */
    int n_logit_bias;             /* <= MR_ENGINE_MAX_LOGIT_BIAS */
    const int32_t *allowed_ids;   /* [n_allowed] (copied): only these ids are sampled; 0 = every id */
    int64_t n_allowed;            /* <= vocab; repeats are fine */
    const int32_t *bad_words;     /* the token sequences one after the other (copied) */
    const int32_t *bad_word_len;  /* [n_bad_words] their lengths, 1..MR_ENGINE_MAX_BAD_WORD_TOKENS: a sequence's
                                     last token is masked where the output ends with the others */
    int n_bad_words;              /* <= MR_ENGINE_MAX_BAD_WORDS */
    bool logprobs;                /* report the log-probability of each generated token */
    int top_logprobs;             /* and the n most likely alternatives (0..max_top_logprobs) */
    const int32_t *logprob_ids;   /* [n_logprob_ids] (copied; repeats are fine): the log-probabilities of these ids
                                     at every position whose token's is reported (generated tokens, and the prompt
                                     positions of prompt_logprobs), in this order (sglang's token_ids_logprob) */
    int n_logprob_ids;            /* <= MR_ENGINE_MAX_LOGPROB_IDS */
    bool want_logits;             /* events carry the raw logits row [vocab] that produced the token */
    bool prompt_logprobs;         /* also the log-probability of every prompt token after the first (of the
                                     raw logits at the position before it), with top_logprobs alternatives:
                                     events before and with the first generated token (mr_engine_event.plp).
                                     The prompt is then computed from the position before the first token
                                     owed (no prefix-cache hits past it) */
    int64_t prompt_logprobs_from; /* with prompt_logprobs: the first prompt position reported (0 and 1: from the
                                     second token, every one; n_prompt or more: none, and nothing owed).
                                     sglang's logprob_start_len s is s + 1 here */
    bool routes;                  /* events carry the experts each computed position selected in every layer
                                     (mr_engine_event.routes: sglang's routed experts, for RL routing replay);
                                     the prompt is then computed whole (no prefix-cache hits) */
    int64_t priority;             /* with priority_scheduling: lower runs first (vLLM's order); else must be 0 */
    const char *cache_salt;       /* vLLM's: requests share prefix-cache blocks only with those of the same salt
                                     (its bytes, n_cache_salt of them; NULL or 0: the unsalted cache), so that a
                                     tenant cannot time another's prompts through cache hits */
    size_t n_cache_salt;          /* <= MR_ENGINE_MAX_CACHE_SALT */
    const int32_t *forced;        /* teacher forcing (tests, probe): generated token i is forced[i] */
    int64_t n_forced;             /* while i < n_forced, instead of sampling (stop checks still apply) */
    mr_token_constraint constraint; /* .mask NULL: none */
    const atomic_int *cancel;     /* optional, caller-owned: nonzero = cancel (any thread may set it) */
    void *user;                   /* returned in every event of this request */
} mr_request_params;

/* Admits a request into the waiting queue (FCFS) and returns its id. The
 * prompt, stop ids and forced tokens are copied. Refusals, each with both
 * numbers in the detail:
 *   MR_ECAPACITY  prompt + max_tokens exceed context_length, or the request
 *                 needs more KV blocks than the whole pool holds (it could not
 *                 run even alone)
 *   MR_EINPUT     a token id outside the vocabulary (prompt, stop ids,
 *                 forced tokens, logit bias, allowed ids, bad words,
 *                 logprob ids)
 *   MR_EINVAL     bad sampling parameters, empty prompt, too many stop ids
 *                 or logit-bias entries, a bias outside [-100, 100], too
 *                 many allowed ids or bad words, a bad word of 0 or too many
 *                 tokens,
 *                 min_tokens above max_tokens, top_logprobs above
 *                 max_top_logprobs, more than MR_ENGINE_MAX_LOGPROB_IDS
 *                 logprob_ids, a priority other than 0 without
 *                 priority_scheduling, a cache_salt above MR_ENGINE_MAX_CACHE_SALT
 *                 bytes
 *   MR_EBUSY      max_queued_requests are already waiting (try later)
 *   MR_ENOMEM     out of memory (this request only) */
mr_status mr_engine_add(mr_engine *e, const mr_request_params *p, mr_req_id *out);
/* Cancels a queued or running request at the next step boundary (same as
 * its cancel flag). MR_ENOTFOUND if the id is unknown or already finished. */
mr_status mr_engine_cancel(mr_engine *e, mr_req_id id);

/* ---- events: what a step produced, per request ---- */
typedef enum {
    MR_FINISH_NONE = 0,      /* still running */
    MR_FINISH_STOP = 1,      /* a stop token was generated (stop_token; it is the event's token too) */
    MR_FINISH_LENGTH = 2,    /* max_tokens generated, or the context length reached */
    MR_FINISH_CANCELLED = 3, /* cancel flag or mr_engine_cancel; no token in this event */
    MR_FINISH_ERROR = 4,     /* this request failed (error says why); the others go on */
    MR_FINISH_COUNT
} mr_finish_reason;
/* "none", "stop", "length", "cancelled", "error" (the OpenAI finish_reason for the first three). */
const char *mr_finish_reason_name(mr_finish_reason r);

typedef struct {
    int32_t token;
    float logprob;
} mr_token_logprob;

typedef struct {
    mr_req_id id;
    void *user;
    int n_tokens;                 /* tokens generated in this step: 0 or 1 */
    int32_t token;                /* the token when n_tokens == 1 */
    float logprob;                /* its log-probability (log-softmax of the raw logits), when asked */
    int n_top;                    /* top alternatives, most likely first (ties to the lower id) */
    const mr_token_logprob *top;  /* [n_top], valid until the next step */
    int n_logprob_ids;            /* the request's logprob_ids (0: none asked) */
    const float *id_logprob;      /* with n_tokens == 1: [n_logprob_ids] the log-probability of each logprob_id at
                                     the token's position (of the raw logits); valid until the next step */
    const float *logits;          /* [vocab] raw logits (want_logits), valid until the next step */
    mr_finish_reason finish;      /* NONE while the request goes on */
    int32_t stop_token;           /* STOP: the id that matched; else -1 */
    const char *error;            /* ERROR: the reason; else NULL. Valid until the next step */
    int64_t n_prompt;             /* prompt tokens */
    int64_t n_generated;          /* tokens generated so far, this one included */
    int64_t n_cached;             /* prompt tokens served from the prefix cache when first scheduled */
    bool first_token;             /* this is the request's first generated token */
    uint64_t sched_ns;            /* when the request was first scheduled (mr_now_ns; 0: not yet) */
    /* prompt_logprobs: the prompt tokens at positions plp_pos .. plp_pos + n_plp - 1 (plp_pos >= 1), each
     * a row of plp_stride entries: [0] the prompt token and its log-probability, [1 .. plp_ntop] the
     * most likely tokens at that position (most likely first, ties to the lower id). The positions of
     * one request come in order, each once; valid until the next step. n_plp 0: none in this event
     * (an event may carry them and no token: a prefill chunk before the prompt's end). */
    int64_t plp_pos;
    int n_plp, plp_ntop, plp_stride;
    const mr_token_logprob *plp;
    const int32_t *plp_rank;      /* [n_plp] each prompt token's rank at its position: 1 + the ids whose logit is at
                                     least its own (vLLM's definition; ties count against it) */
    const float *plp_id_logprob;  /* [n_plp][n_logprob_ids] the logprob_ids' log-probabilities at those positions */
    /* routes: the positions routes_pos .. routes_pos + n_routes - 1 computed in this step (a recomputed one
     * comes again, the same), each a row of [n_layers][top_k] expert ids; valid until the next step */
    int64_t routes_pos, n_routes;
    const int32_t *routes;
} mr_engine_event;

typedef struct {
    int n_events;
    const mr_engine_event *events; /* [n_events], valid until the next step (or add/cancel/free) */
    int n_seq;                     /* requests in the batch */
    int64_t n_tokens;              /* tokens in the batch (prefill + decode) */
    int64_t n_prefill_tokens, n_decode_tokens;
    int n_preempted;               /* requests preempted while scheduling this step */
} mr_engine_step_out;

/* Runs one step (schedule, forward, complete) and reports what it produced.
 * With no work it returns at once with nothing. A failure inside the batch
 * (the forward pass, non-finite logits) ends the requests concerned with
 * MR_FINISH_ERROR and returns MR_OK; a non-OK status means the engine itself
 * is unusable (a broken invariant), never a bad request. */
mr_status mr_engine_step(mr_engine *e, const mr_engine_step_out **out);
/* Requests waiting or running. */
bool mr_engine_has_work(const mr_engine *e);

/* Holding the schedule (the server's /pause_generation and weight updates):
 *   MR_HOLD_NONE   as usual;
 *   MR_HOLD_ADMIT  no waiting request starts; the running ones go on to their end, so the running set
 *                  drains (requests keep arriving into the queue);
 *   MR_HOLD_ALL    nothing is scheduled: a step only ends the cancelled requests, the running ones keep
 *                  their KV blocks and go on where they stopped when the hold ends.
 * mr_engine_has_runnable says whether a step would compute anything under the hold. */
typedef enum { MR_HOLD_NONE = 0, MR_HOLD_ADMIT = 1, MR_HOLD_ALL = 2 } mr_engine_hold;
void mr_engine_set_hold(mr_engine *e, mr_engine_hold h);
bool mr_engine_has_runnable(const mr_engine *e);
/* Running requests. */
int mr_engine_running(const mr_engine *e);
/* Every running request back to the front of the waiting queue, in its order, its KV blocks freed (kept in
 * the prefix cache where they are full); it resumes from its tokens so far when it runs again, recomputing
 * their KV (sglang's pause mode "retract"). Returns how many; counted as preemptions. */
int mr_engine_retract(mr_engine *e);

/* The two halves of a step around the forward pass:
 *   mr_engine_schedule(e, &b);                      rank 0
 *   ... broadcast b; every rank: mr_model_forward_kv(m, b, logits) ...
 *   mr_engine_complete(e, st, logits, &out);        rank 0
 * b->n_seq == 0 when there is nothing to run (complete still reports
 * cancellations). The batch and its arrays belong to the engine and are valid
 * until mr_engine_complete. logits: [b->n_logits][vocab], the rows the batch
 * asked for, in batch order; the batch's extra rows (prompt log-probabilities)
 * complete takes from the engine's model (mr_model_extra_logits) after that
 * forward; forward_status is what the forward returned (an error ends the
 * batch's requests with MR_FINISH_ERROR). mr_engine_step is exactly these
 * three calls. */
mr_status mr_engine_schedule(mr_engine *e, const mr_kv_batch **b);
mr_status mr_engine_complete(mr_engine *e, mr_status forward_status, const float *logits,
                             const mr_engine_step_out **out);
/* The logits buffer mr_engine_step uses: [max_running_requests][vocab]. */
float *mr_engine_logits_buffer(mr_engine *e);

/* ---- expert parallelism: the ranks in lockstep ----
 * When the model's MoE runs over several expert-parallel ranks (attention
 * replicated: every rank runs the same batch), rank 0 (the leader) owns the
 * requests and every mr_engine_step there broadcasts its batch before
 * running it (an empty step too: the leader's heartbeat). The other ranks
 * create their engine with the same options and call mr_engine_follow,
 * which runs each step the leader sends (no sampling, no logits) until the
 * leader calls mr_engine_ep_stop. A leader with no work keeps calling
 * mr_engine_step at least once a second, so that the followers' step
 * deadline only fires when the leader stopped answering. A broken group
 * (a rank died or hung: MR_EPEER from mr_engine_step, mr_engine_follow) is
 * the end of the engine. In one process these do nothing. */
mr_status mr_engine_follow(mr_engine *e);
mr_status mr_engine_ep_stop(mr_engine *e);
/* New weights on every rank (the leader's calls, between steps; each rank
 * loads only its own experts):
 * - mr_engine_ep_load tells the followers to start loading checkpoint dir
 *   beside their running weights (mr_model_weights_load, on a thread of
 *   their own: they follow the next steps meanwhile). The leader loads its
 *   own share itself, off the engine thread.
 * - mr_engine_ep_commit, once the leader's load has ended (mine: its status,
 *   why: its message when it failed), collects every rank's verdict, each
 *   follower's after its load has ended, within timeout_s (0: the step
 *   deadline; a load can take longer). MR_OK: every rank loaded, and every
 *   follower has swapped its new weights in (mr_model_weights_swap) at this
 *   point of the step sequence; the leader then swaps its own before its
 *   next step. Otherwise every follower dropped what it loaded, and the
 *   first rank that failed is named with its status and message; MR_EPEER
 *   when the group broke.
 * A follower that stops with a load under way waits for it and drops it.
 * In one process both return MR_OK at once. */
mr_status mr_engine_ep_load(mr_engine *e, const char *dir);
mr_status mr_engine_ep_commit(mr_engine *e, mr_status mine, const char *why, double timeout_s);

/* ---- counters (for /metrics and --stats) ---- */
typedef struct {
    int running, waiting;               /* requests now */
    int64_t kv_blocks_total;            /* pool size */
    int64_t kv_blocks_used;             /* referenced by a request */
    int64_t kv_blocks_cached;           /* unreferenced but kept for the prefix cache (evictable) */
    int64_t kv_blocks_free;             /* total - used - cached */
    int64_t kv_blocks_peak;             /* most blocks ever used at once */
    double kv_usage;                    /* used / total, in [0, 1] */
    uint64_t prompt_tokens;             /* prompt tokens of admitted requests (each request once) */
    uint64_t generation_tokens;         /* tokens generated */
    uint64_t computed_tokens;           /* tokens run through the forward pass (recompute included) */
    uint64_t preemptions;
    uint64_t prefix_queries;            /* prompt tokens looked up in the prefix cache */
    uint64_t prefix_hits;               /* of those, tokens found */
    uint64_t prefix_hit_blocks;         /* blocks shared through the cache */
    uint64_t evictions;                 /* cached blocks reused for other content */
    uint64_t requests_added;
    uint64_t requests_finished[MR_FINISH_COUNT];
    uint64_t steps;
    uint64_t steps_one_thread;          /* of those, run on one thread (fixed_threads off) */
    uint64_t schedule_ns, forward_ns, sample_ns, complete_ns; /* time in each part of the steps */
} mr_engine_stats;
void mr_engine_stats_get(const mr_engine *e, mr_engine_stats *s);
/* Zeros the counters (tokens, requests, lookups, evictions, steps and their times; the peak becomes the
 * blocks used now): the server calls it when it takes the engine, so that /metrics counts clients' work and
 * not its self-check's. The cache's content stays. */
void mr_engine_stats_reset(mr_engine *e);

/* Drops every block of the prefix cache (sglang's /flush_cache, vLLM's
 * /reset_prefix_cache: a benchmark's runs then start cold; new weights). Only
 * while no request is running (waiting ones hold no blocks): MR_ESTATE
 * otherwise, nothing changed.
 * *dropped (optional): the blocks that were cached. */
mr_status mr_engine_flush_prefix_cache(mr_engine *e, int64_t *dropped);
/* Gives the paged KV pool's memory back to the system (vLLM's sleep, sglang's
 * release_memory_occupation of the KV cache): the prefix cache is flushed, then
 * the pool's pages are dropped (mr_model_kv_release); they come back as
 * requests write them. Only while no request is running (MR_ESTATE, as the
 * flush). Under expert parallelism the leader's call tells the followers to
 * drop theirs too (MR_EPEER when the group broke). *bytes: the pool's bytes
 * dropped here (its address range: the resident part is what goes back). */
mr_status mr_engine_release_kv(mr_engine *e, size_t *bytes);

/* Checks the block accounting (every block free, cached or referenced,
 * reference counts equal to the block-table entries, the prefix table and
 * the LRU list consistent, request states consistent). MR_ESTATE with the
 * first broken invariant in the detail; for tests and debug builds. */
mr_status mr_engine_check(const mr_engine *e);

#ifdef __cplusplus
}
#endif
#endif
