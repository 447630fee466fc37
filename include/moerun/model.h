/* moerun/model.h — MiniMax-M2 end to end: the checkpoint loader, the batched
 * forward pass with its KV cache, the sampler, and the model-level tools
 * (tiny checkpoint writer, quantizer, probe). Architecture:
 * shared/spec/minimax-m2.md.
 *
 * A model is three things owned by one mr_model: its config (dims), its
 * weights (pointers into the mapped checkpoint, or packed copies made by the
 * MoE runner's after-load step) and its state (activations and the KV cache,
 * allocated once at open for opts.max_batch sequences of opts.max_ctx
 * tokens). */
#ifndef MOERUN_MODEL_H
#define MOERUN_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moerun/base.h"
#include "moerun/config.h"
#include "moerun/formats.h"
#include "moerun/moe.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MR_MODEL_MAX_EOS MR_MAX_EOS

/* The model's hyperparameters are config/'s mr_model_desc (config.json,
 * hf_quant_config.json and generation_config.json's EOS ids): one struct,
 * read once. The model holds a copy without the quantization exclusion list. */
typedef mr_model_desc mr_model_config;

/* How to open a model. Zeroed fields take the defaults in brackets. */
typedef struct {
    int max_batch;          /* sequences held in the KV cache [1] */
    int64_t max_ctx;        /* tokens per sequence [256] */
    int64_t max_tokens;     /* tokens per forward call (longer calls are chunked) [max_batch * max_ctx, capped at 512] */
    const mr_exec *exec;    /* the resolved execution config (runner, problem, threads); the model
                               borrows it. NULL: use runner/act_mode below (tests, tools) */
    const char *runner;     /* without exec: MoE runner name ["reference"] */
    mr_act_mode act_mode;   /* without exec: AUTO = the weight format's default */
    int64_t kv_blocks;      /* paged KV pool: blocks of MR_KV_BLOCK_TOKENS tokens (0 = none). With a
                               pool and max_batch 0 there is no contiguous cache */
    mr_format kv_dtype;     /* paged pool element type: MR_FMT_BF16, MR_FMT_F32, MR_FMT_E4M3 or MR_FMT_E5M2
                               (F32 is 0) */
    mr_format dense_act_dtype; /* without exec: the input of q/k/v_proj, o_proj and lm_head, MR_FMT_F32 (0:
                               the activations exactly) or MR_FMT_BF16 (rounded to bf16 first); with exec:
                               exec's dense_act_dtype */
    bool progress;          /* draw a progress bar on stderr when it is a terminal */
    bool quiet;             /* reserved: the library prints nothing but warnings */
} mr_model_opts;

typedef struct mr_model mr_model;

/* Opens the checkpoint folder dir (config.json, model.safetensors or a
 * sharded index, hf_quant_config.json), validates every tensor (name, shape,
 * dtype), maps the weights and runs the runner's after-load. On failure
 * *out is NULL and the error names the tensor, what was expected and what
 * was found. */
mr_status mr_model_open(const char *dir, const mr_model_opts *opts, mr_model **out);
void mr_model_close(mr_model *m); /* NULL ok */

/* New weights for a running model (an RL trainer's next checkpoint; the
 * server's /update_weights_from_disk), in two steps so that the model keeps
 * serving while the new ones load:
 * - mr_model_weights_load reads checkpoint dir into *staged, a model that
 *   holds weights only (it runs nothing), loaded under m's frozen resolution
 *   (the same runner, activation mode and packing). It only reads m, so any
 *   thread may call it while another runs m. dir must describe the same model:
 *   every hyperparameter, the quantization and its exclusions, the EOS ids; the
 *   first that differs is named (MR_ECONFIG). A bad checkpoint (a tensor
 *   missing, a wrong shape or dtype) fails as mr_model_open does. m is never
 *   touched: on any error it runs on as before. Refused when the new set's
 *   own memory (packed experts, copies) is more than the machine has available (MR_ECAPACITY).
 *   Under expert parallelism each rank loads its own experts; the ranks must
 *   swap at the same point of their step sequence (mr_engine_ep_commit).
 * - mr_model_weights_swap (the thread that runs m, between forward calls)
 *   exchanges the two models' weights: m runs on the new ones with its state
 *   (KV cache, workspace, counters) as it was; staged then holds the old ones,
 *   for mr_model_close. Both weight sets are resident between the two calls. */
mr_status mr_model_weights_load(const mr_model *m, const char *dir, mr_model **staged);
void mr_model_weights_swap(mr_model *m, mr_model *staged);
bool mr_model_is_staged(const mr_model *m);
const mr_model_config *mr_model_config_of(const mr_model *m);
/* Name of the MoE runner and activation mode in use. */
const char *mr_model_runner_name(const mr_model *m);
mr_act_mode mr_model_act_mode(const mr_model *m);
/* This process's rank and the ranks of its expert-parallel run (0 and 1 in one process). */
void mr_model_ep(const mr_model *m, int *rank, int *size);
/* Peak resident memory (getrusage maxrss, bytes) measured right after loading. */
size_t mr_model_peak_rss(const mr_model *m);

/* What the model holds, by part, and what the process held at the end of
 * the load. Weights are held once: a tensor used in place stays in the
 * mapping (and is counted once, there); a tensor the loader copies or the MoE
 * runner's after-load repacks gives its mapped pages back as soon as the copy
 * exists, layer by layer, expert by expert, so that peak and steady RSS stay
 * close to `kept`. */
typedef struct {
    size_t weights_mapped; /* checkpoint bytes used in place and read at load (attention, embeddings, lm_head) */
    size_t weights_copied; /* weights the loader copied: fp32 norms, router gate and bias, unaligned tensors */
    size_t experts;        /* the MoE runner's expert weights, every layer (packed, or in place) */
    size_t activations;    /* activations and their scratch */
    size_t kv;             /* the KV cache or pool, allocated (its pages become resident as they are used) */
    size_t moe_workspace;  /* the one MoE workspace, shared by every layer */
    size_t kept;           /* the sum of the six */
    size_t rss_peak_load;  /* VmHWM at the end of the load: the process's peak so far */
    size_t rss_load;       /* VmRSS at the end of the load */
    double load_s;         /* wall time of mr_model_open */
} mr_model_memory;
void mr_model_memory_get(const mr_model *m, mr_model_memory *out);

/* ---- forward ----
 * One call appends tokens to several sequences at once (prefill of a prompt
 * and decode steps mix freely). Sequence i is KV slot seq[i] (0 <=
 * seq < max_batch), gets n_tok[i] new tokens taken in order from tokens. The
 * logits are written for the last new token of each sequence, [n_seq][vocab],
 * or, with all_logits, for every new token, [sum n_tok][vocab]. Exceeding
 * max_ctx or max_tokens is MR_ECAPACITY and leaves the cache unchanged. */
typedef struct {
    int n_seq;
    const int *seq;         /* [n_seq] KV slots, distinct */
    const int64_t *n_tok;   /* [n_seq], each >= 1 */
    const int32_t *tokens;  /* [sum n_tok] */
    bool all_logits;
} mr_batch;
mr_status mr_model_forward(mr_model *m, const mr_batch *b, float *logits);
/* Tokens held for a slot, and forgetting them. */
int64_t mr_model_seq_len(const mr_model *m, int slot);
void mr_model_seq_reset(mr_model *m, int slot);

/* ---- forward over the paged KV cache ----
 * The pool (opts.kv_blocks blocks, every layer) holds K and V of
 * MR_KV_BLOCK_TOKENS consecutive positions per block; a sequence's position p
 * lives in block block_ids[bt_off[i] + p / MR_KV_BLOCK_TOKENS], row
 * p % MR_KV_BLOCK_TOKENS. Which block belongs to whom is the caller's (the
 * engine's) bookkeeping; the model only reads and writes the blocks it is
 * given. The batch is a plain description (flat arrays and counts) so that it
 * can be serialized and broadcast to other ranks as is.
 *
 * Sequence i has n_tok[i] new tokens at positions start[i] ..
 * start[i] + n_tok[i] - 1 (positions below start[i] are already in its blocks
 * and are read, not written); its block table must cover every position it
 * writes. Its new tokens are consecutive in tokens, sequences in order. Rows
 * of logits: for every sequence with want_logits[i], the logits of its last
 * new token, in batch order ([n_logits][vocab]); the n_extra rows' logits come
 * after the call from mr_model_extra_logits, as many rows at a time as the
 * caller has room for. Nothing is written to any
 * block, nor to logits, when the batch is refused (MR_EINVAL, MR_ECAPACITY,
 * MR_EINPUT). Two sequences of one batch must not write the same block. */
#define MR_KV_BLOCK_TOKENS 16
typedef struct {
    int n_seq;
    int64_t n_tokens;               /* sum of n_tok, <= the model's max_tokens */
    const int32_t *tokens;          /* [n_tokens] */
    const int64_t *n_tok;           /* [n_seq], each >= 1 */
    const int64_t *start;           /* [n_seq] position of the sequence's first new token */
    const int32_t *bt_off;          /* [n_seq + 1] sequence i's blocks: block_ids[bt_off[i] .. bt_off[i+1]) */
    const int32_t *block_ids;       /* [bt_off[n_seq]] indices into the pool */
    const uint8_t *want_logits;     /* [n_seq] 1: a logits row for the sequence's last new token */
    int n_logits;                   /* number of sequences with want_logits */
    /* more logits rows (prompt log-probabilities): the tokens extra_tok[0 .. n_extra), indices into
     * tokens, whose logits mr_model_extra_logits gives after the call, in this order; at most
     * n_tokens - n_logits of them (none: n_extra 0, extra_tok NULL) */
    int n_extra;
    const int64_t *extra_tok;
} mr_kv_batch;
mr_status mr_model_forward_kv(mr_model *m, const mr_kv_batch *b, float *logits);
/* The logits of extra rows k0 .. k0 + n - 1 of the last mr_model_forward_kv into logits
 * [n][vocab] (the lm_head over the hidden states that call kept; valid until the next forward).
 * MR_EINVAL for rows it did not keep. */
mr_status mr_model_extra_logits(mr_model *m, int k0, int n, float *logits);
/* The pool's size in blocks (0 without one), element type, and bytes. */
int64_t mr_model_kv_blocks(const mr_model *m);
mr_format mr_model_kv_dtype(const mr_model *m);
/* The FP8 KV cache scales (k_scale, v_scale) the checkpoint carried, counted
 * over every layer; an FP8 pool uses them, others do not (0: none, scale 1). */
int mr_model_kv_scales(const mr_model *m);
size_t mr_model_kv_bytes(const mr_model *m);
/* Drops the paged KV pool's pages (madvise MADV_DONTNEED on its page-aligned
 * part): the memory goes back to the system, and a page reads as zeros until
 * written again. Only while no sequence holds a block (mr_engine_release_kv
 * makes sure). Returns the bytes dropped. */
size_t mr_model_kv_release(mr_model *m);
/* Bytes of K and V one token takes in the pool (every layer). */
size_t mr_model_kv_token_bytes(const mr_model_config *c, mr_format kv_dtype);
/* The most tokens one forward call takes, and the longest context it attends to. */
int64_t mr_model_max_tokens(const mr_model *m);
int64_t mr_model_max_ctx(const mr_model *m);

/* Accumulated time of the forward calls, split by part (ns). */
typedef struct {
    uint64_t attention_ns, moe_ns, other_ns;
    uint64_t tokens, calls;
    uint64_t experts_touched; /* distinct experts routed to, summed over the MoE calls of every layer */
} mr_model_timing;
void mr_model_timing_get(const mr_model *m, mr_model_timing *t);
void mr_model_timing_reset(mr_model *m);

/* The expert distribution (sglang's /start_expert_distribution_record): while recording, every MoE call adds
 * each token's k selected experts to per-layer counts. Any thread may call these while another runs forward
 * calls (the counts are atomic): start zeroes them and then records, stop keeps them. */
void mr_model_expert_record(mr_model *m, bool on);
bool mr_model_expert_recording(const mr_model *m);
/* The counts: out [n_layers][n_experts] (mr_model_config), how often each expert was selected in each layer
 * since the last start (layers without experts: 0). */
void mr_model_expert_counts(const mr_model *m, uint64_t *out);
/* Routing capture (sglang's routed experts): with out set, each forward call writes every token's k selected
 * experts of every layer to out [tokens of the call][n_layers][top_k] (token t of the call's batch at row t);
 * NULL stops. The caller sizes it for the calls it makes. */
void mr_model_capture_routes(mr_model *m, int32_t *out);

/* Weight bytes a forward call reads: every call reads all of the attention
 * projections, router gates and the lm_head; an expert's gate, up and down
 * are read when a token routes to it (mr_model_timing.experts_touched). */
typedef struct {
    size_t attn;      /* q, k, v, o projections with their scales, all layers */
    size_t router;    /* router gates and correction biases, all layers */
    size_t expert;    /* one expert's gate, up and down in the runner's layout */
    size_t lm_head;
} mr_model_weight_bytes;
void mr_model_weight_bytes_get(const mr_model *m, mr_model_weight_bytes *out);

/* ---- sampler ----
 * temperature <= 0 is greedy exactly (argmax, ties to the lower id). Otherwise
 * logits / temperature, then the filters in order top-k (0 = off), top-p
 * (>= 1 off), min-p (<= 0 off), then a draw from a seeded generator. */
typedef struct {
    float temperature;
    int top_k;
    float top_p;
    float min_p;
    uint64_t seed;
} mr_sampler_params;

typedef struct {
    mr_sampler_params p;
    uint64_t state;  /* generator state */
    int64_t vocab;
    float *prob;     /* [vocab] scratch */
    int32_t *idx;    /* [vocab] scratch */
} mr_sampler;

mr_status mr_sampler_init(mr_sampler *s, const mr_sampler_params *p, int64_t vocab);
void mr_sampler_free(mr_sampler *s);
/* Picks one token from logits [vocab]; does not modify logits. */
int32_t mr_sampler_sample(mr_sampler *s, const float *logits);
/* Checks the parameters (MR_EINVAL naming the field). */
mr_status mr_sampler_params_check(const mr_sampler_params *p);
/* The same draw with the caller's generator state and scratch (prob and idx
 * [vocab] each), for callers that sample for many sequences (the engine):
 * O(vocab) unless top-k or top-p ask for an order, then O(vocab log k) or a
 * sort of the candidates above a threshold only. */
int32_t mr_sample_logits(const mr_sampler_params *p, uint64_t *state, const float *logits, int64_t vocab,
                         float *prob, int32_t *idx);
/* The generator state for a seed. */
uint64_t mr_sampler_seed_state(uint64_t seed);
/* argmax, ties to the lower id; NaN never wins. */
int32_t mr_argmax(const float *x, int64_t n);
/* log(sum of exp(x[i])) over a finite row x[0..n), n >= 1 (the log-probabilities' normalizer): the
 * largest plus the log of the sum of exp(x[i] - largest), each term the sampler's exp (relative error
 * below 3e-7, 0 below -87), summed in double. */
double mr_logsumexp(const float *x, int64_t n);
bool mr_model_is_eos(const mr_model *m, int32_t tok);

/* ---- tools ---- */
/* gen-tiny: a deterministic random MiniMax-M2 checkpoint. Zeroed dims take
 * the defaults (hidden 256, 4 layers, 8 q / 2 kv heads, head_dim 32,
 * rotary_dim 16, 32 experts top-4, expert dim 128, vocab 512). */
typedef struct {
    int64_t hidden, layers, experts, top_k, inter, heads, kv_heads, head_dim, rotary_dim, vocab;
    mr_format quant; /* BF16 (0 means BF16 too), FP8_BLOCK or NVFP4 */
    uint64_t seed;
} mr_tiny_params;
/* Checks the dims (and the FP8 block / NVFP4 shape constraints). */
mr_status mr_tiny_validate(const mr_tiny_params *p);
/* Writes dir (created, must not hold a checkpoint already) atomically: the
 * files are written into a temp folder next to dir, which is renamed. */
mr_status mr_tiny_write(const char *dir, const mr_tiny_params *p);

/* quantize: bf16 checkpoint -> native FP8 block or ModelOpt NVFP4. NVFP4
 * input_scale is calibrated by running the bf16 model over calib_tokens
 * tokens (amax of each expert's inputs). Written atomically (temp folder
 * renamed into place). */
typedef struct {
    mr_format to;          /* FP8_BLOCK or NVFP4 */
    int64_t calib_tokens;  /* [256] */
    uint64_t seed;         /* calibration token stream */
    bool progress;
} mr_quantize_params;
mr_status mr_model_quantize(const char *in_dir, const char *out_dir, const mr_quantize_params *p);

/* Removes the scratch folders ("DIR.tmp.XXXXXX") of a gen-tiny / quantize in
 * progress, so that an interrupted tool leaves nothing behind. Meant for a
 * signal handler: async-signal-safe (getdents64, unlinkat, rmdir only); the
 * process is expected to die right after. */
void mr_tools_remove_scratch(void);

#ifdef __cplusplus
}
#endif
#endif
