/* serve_internal.h — private to src/serve: the parsed request, the error
 * shape, the job shared by one HTTP thread and the engine thread, the stop
 * string matcher, the metrics, and the text seam (tokenizer, chat template,
 * parsers). See moerun/serve.h for the threading model. */
#ifndef MR_SERVE_INTERNAL_H
#define MR_SERVE_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moerun/base.h"
#include "moerun/engine.h"
#include "moerun/model.h"
#include "moerun/serve.h"

/* ======================================================================
 * Errors (serving.md section 3): {"error": {"message", "type", "param", "code"}}
 * ====================================================================== */
typedef struct {
    int http;           /* 400, 404, 405, 413, 503, 500 */
    char param[96];     /* the field at fault ("" when none), e.g. "messages[1].content" */
    char message[640];
    const char *allow;  /* a 405: the methods the route takes (its Allow header; NULL: GET) */
} sv_error;

/* Fills e and returns -1 (so that parsers can `return sv_fail(...)`). */
int sv_fail(sv_error *e, int http, const char *param, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
/* The OpenAI error type of an HTTP status. */
const char *sv_error_type(int http);
/* The error body as a malloc'd JSON string (NULL on out of memory). */
char *sv_error_body(const sv_error *e);

/* ======================================================================
 * A parsed request (request.c). Every field of serving.md section 1 is read;
 * those the server does not implement are refused unless they carry their
 * neutral value.
 * ====================================================================== */
typedef enum { SV_COMPLETIONS = 0, SV_CHAT = 1 } sv_kind;
typedef enum { SV_TOOLS_AUTO = 0, SV_TOOLS_NONE = 1, SV_TOOLS_REQUIRED = 2, SV_TOOLS_NAMED = 3 } sv_tool_choice;
/* Structured outputs: where the request's grammar comes from. */
typedef enum { SV_SO_NONE = 0, SV_SO_JSON, SV_SO_CHOICE, SV_SO_REGEX, SV_SO_EBNF, SV_SO_TAGS } sv_so;

typedef struct {
    char *text;     /* a text prompt, or NULL when given as ids */
    int32_t *ids;   /* [n_ids] token-id prompt */
    int64_t n_ids;
} sv_prompt;

#define SV_MAX_STOP 16          /* stop strings per request */
#define SV_MAX_STOP_BYTES 256   /* bytes per stop string */
#define SV_MAX_STOP_IDS 16     /* the engine's MR_ENGINE_MAX_STOP_IDS */
#define SV_MAX_TOP_LOGPROBS 20  /* the engine's default max_top_logprobs */
#define SV_MAX_ID_LOGPROBS (1 << 24) /* token_ids_logprob: ids x positions of one request (64 MiB) */
#define SV_MAX_BAD_WORDS 128    /* each gives up to 2 sequences: MR_ENGINE_MAX_BAD_WORDS */
#define SV_MAX_WEIGHT_VERSION 128 /* bytes of a weight version (--weight-version, update_weights_from_disk) */

typedef struct {
    sv_kind kind;
    char *model;                  /* NULL when absent */
    char *cache_salt;             /* vLLM's cache_salt (1..MR_ENGINE_MAX_CACHE_SALT bytes), NULL when absent */
    size_t n_cache_salt;          /* its bytes (a NUL among them counts) */
    int n_prompts;                /* completions: prompts of the request (a list is a batch) */
    sv_prompt *prompts;
    json_t *messages;             /* chat: the validated messages (a reference we hold) */
    json_t *tools;                /* chat: validated tool list, or NULL */
    sv_tool_choice tool_choice;
    char *tool_name;              /* SV_TOOLS_NAMED: the function's name */
    sv_so so;                     /* response_format / guided_json / guided_choice / structured_outputs */
    char so_field[48];            /* the field that asked (for errors) */
    bool one_tool_call;           /* parallel_tool_calls false: tool_choice "required" makes one call */
    json_t *so_schema;            /* SV_SO_JSON: the schema, NULL = any JSON object; SV_SO_REGEX: the regex (a string); SV_SO_EBNF: the grammar (a string); SV_SO_TAGS: the structural tag (an object) */
    json_t *so_choice;            /* SV_SO_CHOICE: the list of strings */
    bool so_compact;              /* vLLM's structured_outputs.disable_any_whitespace: JSON without whitespace */
    struct mr_grammar *grammar;   /* compiled at the end of parsing (structured outputs or tool_choice
                                     required / named), or NULL */
    bool grammar_tools;           /* the grammar is MiniMax-M2's tool calls (strict tools, or chosen below) */
    struct mr_grammar *grammar_native; /* tool_choice required / named: the calls in MiniMax-M2's own format, which
                                          replaces grammar (the JSON form) on a model of that format, or NULL */
    json_t *chat_template_kwargs; /* chat: object or NULL */
    bool add_generation_prompt;   /* chat [true; false with continue_final_message] */
    bool agp_given;               /* add_generation_prompt was in the request */
    bool continue_final;          /* chat: continue_final_message (vLLM's): the last message left open */
    bool think_open;              /* continue_final: the rendered prompt ends inside <think> (set at render) */
    json_t *resp_echo;            /* a Responses API request (POST /v1/responses): the fields its Response echoes */
    bool resp_encrypted;          /* ... with include reasoning.encrypted_content */
    char resp_id[64];             /* ... its Response's id */
    json_t *resp_ctx;             /* ... the conversation's items before the output (sv_resp_in.ctx) */
    struct sv_store *resp_store;  /* ... where its Response is kept when it ends (NULL: not kept) */
    bool resp_background;         /* ... run in the background (http.c's driver, not its connection) */
    bool resp_truncate;           /* ... truncation "auto": a conversation past the context drops its first items */
    struct sv_store *resp_convs;  /* ... the conversations' store, when it belongs to one: */
    char resp_conv[64];           /*     its id (claimed for this response until the request is freed) */
    json_t *resp_conv_input;      /*     this input's items, added to it with the output when it ends */
    size_t resp_conv_reserved;    /*     the room reserved for them in the store */
    bool anthropic;               /* an Anthropic Messages API request (POST /v1/messages) */
    json_t *sgl_meta;             /* a sglang /generate request: {"rid"?, "batch"?} */
    int64_t max_tokens;           /* -1: the default (16 for completions, the rest of the context for chat) */
    bool has_temperature, has_top_p, has_top_k, has_min_p, has_seed, has_repetition_penalty;
    float temperature, top_p, min_p;
    int top_k;                    /* 0 = off (-1 is taken as 0) */
    uint64_t seed;
    int n_stop;
    char *stop[SV_MAX_STOP];
    int n_stop_ids;
    int32_t stop_ids[SV_MAX_STOP_IDS];
    int n;                        /* choices per prompt [1] */
    int64_t min_tokens;           /* vLLM's: no stop id, EOS or stop string before this many tokens [0] */
    int n_logit_bias;             /* OpenAI's logit_bias: [n_logit_bias] entries, malloc'd */
    mr_logit_bias *logit_bias;
    int64_t n_allowed;            /* vLLM's allowed_token_ids: [n_allowed], malloc'd; 0 = every id */
    int32_t *allowed;
    int n_bad_words;              /* vLLM's bad_words: the strings (malloc'd) ... */
    char *bad_words[SV_MAX_BAD_WORDS];
    int n_bad_seq;                /* ... tokenized by the HTTP layer: [n_bad_seq] lengths, the ids after each other */
    int32_t bad_len[2 * SV_MAX_BAD_WORDS];
    int32_t *bad_ids;
    int64_t truncate_prompt_tokens; /* vLLM's: keep the last this many prompt tokens; 0 = off, -1 = the context */
    int prompt_logprobs;          /* vLLM's: -1 absent, else the alternatives (0..SV_MAX_TOP_LOGPROBS) per prompt token */
    int64_t plp_from;             /* with prompt_logprobs: the first prompt position reported (0: every one; sglang's
                                     logprob_start_len s gives s + 1) */
    int plp_top;                  /* set by the HTTP layer: alternatives stored per prompt token (echo and/or
                                     prompt_logprobs), the stride of sv_gen.plp */
    bool ignore_eos, stream, include_usage, continuous_usage, echo;
    int64_t priority;             /* vLLM's: lower first, with --scheduling-policy priority */
    bool routes;                  /* /generate's return_routed_experts */
    bool return_token_ids;        /* vLLM's: prompt_token_ids and the choices' token_ids in the answer */
    bool tokens_as_ids;           /* vLLM's return_tokens_as_token_ids: logprobs' tokens as "token_id:N" */
    bool logprobs;                /* report the sampled token's log-probability */
    int top_logprobs;             /* and this many alternatives (0..SV_MAX_TOP_LOGPROBS) */
    float presence_penalty, frequency_penalty, repetition_penalty; /* [0, 0, 1] = off */
    bool skip_special_tokens;     /* [true] */
    bool include_stop_str;        /* vLLM's include_stop_str_in_output [false] */
    bool separate_reasoning;      /* chat: reasoning_content split out [true] */
    /* tests only (serve --debug-forced-output): the output is this text's
     * tokens (or these ids), forced through the engine, then sampled on */
    char *forced_text;
    int32_t *forced_ids;
    int64_t n_forced_ids;
} sv_request;

typedef struct {
    int64_t max_completion_tokens; /* largest max_tokens */
    int max_choices;               /* prompts x n */
    int64_t vocab;                 /* token ids must be in [0, vocab) */
    bool allow_forced;             /* accept debug_forced_output (tests); otherwise it is an unknown field */
    bool priority;                 /* the server schedules by priority (else a priority other than 0 is a 400) */
} sv_limits;

/* Parses and validates a JSON body for kind. 0 on success (free *r with
 * sv_request_free), -1 with *e filled (r is then already freed). Never
 * crashes on any input (fuzzed: tests/fuzz/fuzz_serve_request.c). */
int sv_request_parse(sv_kind kind, const char *body, size_t len, const sv_limits *lim, sv_request *r, sv_error *e);
void sv_request_free(sv_request *r);
/* Bodies nest at most this deep: checked before jansson (whose parser
 * recurses) sees them, so that a hostile body cannot exhaust a thread's stack. */
#define SV_MAX_JSON_DEPTH 64
bool sv_json_depth_ok(const char *body, size_t len, int max_depth, sv_error *e);

/* ======================================================================
 * Stop strings (stop.c): finds the first stop string a growing text
 * completes and says how much of the text is safe to send, holding back a
 * tail that could still be the start of a stop string.
 * ====================================================================== */
typedef struct {
    int n;
    const char *const *s;  /* borrowed from the request */
    size_t len[SV_MAX_STOP];
    size_t max_len;
} sv_stop;

void sv_stop_init(sv_stop *st, int n, char *const *s);
/* text[0..n): the whole decoded output so far. Returns true when a stop
 * string occurs (the one that ends first): *cut is where it starts (the output ends there) and *cut_end
 * where it ends. Otherwise *safe is the length that can be sent: all of it
 * except a suffix that is a proper prefix of some stop string. from: bytes
 * before this were already searched (a match can only end after from). */
bool sv_stop_scan(const sv_stop *st, const char *text, size_t n, size_t from, size_t *cut, size_t *cut_end,
                  size_t *safe);

/* ======================================================================
 * Metrics (metrics.c): Prometheus text, names of serving.md section 5.
 * ====================================================================== */
enum { SV_FR_STOP = 0, SV_FR_LENGTH, SV_FR_ABORT, SV_FR_ERROR, SV_FR_COUNT };
#define SV_HIST_MAX_BUCKETS 24
typedef struct {
    int n;
    const double *le;                /* upper bounds, ascending */
    uint64_t count[SV_HIST_MAX_BUCKETS + 1];
    double sum;
    uint64_t total;
} sv_hist;

/* The APIs a generation request comes through (/metrics counts them). */
enum { SV_API_COMPLETIONS, SV_API_CHAT, SV_API_RESPONSES, SV_API_MESSAGES, SV_API_GENERATE, SV_API_SCORE, SV_API_COUNT };

typedef struct {
    pthread_mutex_t mu;
    char model_name[256];
    /* gauges (set by the engine thread each step) */
    int64_t running, waiting;
    double kv_usage;        /* 0..1 */
    int64_t kv_used_blocks, kv_total_blocks;
    /* counters */
    uint64_t prompt_tokens, generation_tokens, preemptions, prefix_queries, prefix_hits;
    uint64_t steps;                      /* engine steps that ran a batch */
    uint64_t step_ns[4];                 /* their time: schedule, forward, sample, complete (mr_engine_stats) */
    uint64_t success[SV_FR_COUNT];
    uint64_t rejected_queue_full, rejected_draining, bad_requests, disconnects;
    uint64_t weight_updates;             /* /update_weights_from_disk swaps */
    int64_t paused;                      /* generation paused (0 or 1; set by /metrics before rendering) */
    uint64_t by_api[SV_API_COUNT]; /* requests admitted, by the API they came through */
    sv_hist ttft, itl, e2e, queue;
    sv_hist prefill, decode, inference;  /* scheduled -> first token -> last; scheduled -> last */
    sv_hist prompt_len, gen_len, iter;   /* tokens: a finished request's prompt, its output; a step's batch */
    /* the Responses API's store (set by /metrics before rendering; stored_cap 0: storing off) */
    int64_t stored, stored_bytes, stored_cap;
    uint64_t stored_evicted;
    /* the Conversations API's store (likewise; convs_cap 0: off) */
    int64_t convs, convs_bytes, convs_cap;
} sv_metrics;

void sv_metrics_init(sv_metrics *m, const char *model_name);
void sv_metrics_free(sv_metrics *m);
void sv_hist_observe(sv_hist *h, double v); /* caller holds mu */
/* Renders the exposition text into a malloc'd string. */
char *sv_metrics_render(sv_metrics *m);

/* ======================================================================
 * The text seam (text.c): tokenizer, streaming detokenizer, chat template
 * and the reasoning / tool-call parsers of the model folder. A checkpoint
 * without tokenizer.json serves token ids only: prompts must be ids, and
 * each choice carries the generated ids ("token_ids") with empty text.
 * ====================================================================== */
typedef struct sv_text sv_text;

/* The chat template (NULL: the folder's, or a file, or the template's text) and the output parsers asked for
 * (mr_server_opts: vLLM's and sglang's names, NULL: by the template). */
mr_status sv_text_open(const char *model_dir, const mr_server_opts *o, sv_text **out);
/* The tokenizer's ids fit the model's vocabulary. */
mr_status sv_text_check_vocab(const sv_text *t, int64_t vocab);
void sv_text_close(sv_text *t);
bool sv_text_has_tokenizer(const sv_text *t);
/* The tokenizer's model vocabulary without its added tokens (0 without a tokenizer). */
int64_t sv_text_model_vocab(const sv_text *t);
bool sv_text_has_chat_template(const sv_text *t);
/* Encodes UTF-8 text (add_special: the post-processor's BOS/EOS). *ids is mr_malloc'd. */
mr_status sv_text_encode(const sv_text *t, const char *s, size_t n, bool add_special, int32_t **ids, int64_t *n_ids);
/* The chat template's output has tags for the parser (reasoning, tool
 * calls): decode chat answers without skipping special tokens. */
bool sv_text_tagged_output(const sv_text *t);
/* The bytes one token decodes to (may be an incomplete UTF-8 sequence). */
mr_status sv_text_piece(const sv_text *t, int32_t id, const char **bytes, size_t *n);
/* Decodes ids into a malloc'd NUL-terminated string. */
mr_status sv_text_decode(const sv_text *t, const int32_t *ids, int64_t n, bool skip_special, char **out);
/* Renders the chat template over messages/tools into a malloc'd prompt. */
mr_status sv_text_render_chat(const sv_text *t, const json_t *messages, const json_t *tools,
                              const json_t *kwargs, bool add_generation_prompt, bool continue_final, char **out);
/* The text ends inside a reasoning block: its last "<think>" has no "</think>" after it. */
bool sv_text_think_open(const char *text);

/* The vocabulary by bytes for structured outputs (NULL without a tokenizer). */
const struct mr_vocab_index *sv_text_vocab_index(const sv_text *t);
/* Chat answers begin with reasoning that ends in "</think>" (the parser's reasoning format). */
bool sv_text_reasoning(const sv_text *t);

/* Streaming decode of one choice: push one id, get the bytes it completes
 * (an incomplete UTF-8 sequence is held back until the next token). */
typedef struct sv_detok sv_detok;
mr_status sv_detok_new(const sv_text *t, bool skip_special, sv_detok **out);
void sv_detok_free(sv_detok *d);
/* Appends the newly completed text to *buf (grown with mr_realloc), *len updated. */
mr_status sv_detok_push(sv_detok *d, int32_t id, char **buf, size_t *len, size_t *cap);
/* End of stream: whatever is held back (invalid tails become U+FFFD). */
mr_status sv_detok_flush(sv_detok *d, char **buf, size_t *len, size_t *cap);

/* Incremental reasoning / tool-call split of a chat answer (text may come in
 * any pieces). A tool call streams as pieces: the first carries its id and
 * name, later ones argument text, as OpenAI's deltas do. */
typedef struct sv_parse sv_parse;
typedef struct {
    int index;              /* the call's index in the message */
    const char *id, *name;  /* on a call's first piece, else NULL */
    const char *args;       /* argument JSON text piece (may be "") */
    size_t args_len;
} sv_tool_piece;
typedef struct {
    const char *reasoning;
    size_t n_reasoning;
    const char *content;
    size_t n_content;
    const sv_tool_piece *tools;
    size_t n_tools;
} sv_parse_out;
/* tools: the request's tools (NULL: tool calls stay content); reasoning:
 * split reasoning_content out. Pointers in *o live until the next call. */
/* think_open: the output starts inside the reasoning (MiniMax-M2's generation prompt ends with "<think>\n";
 * a continued final message may not). */
mr_status sv_parse_new(const sv_text *t, const json_t *tools, bool reasoning, bool think_open, sv_parse **out);
void sv_parse_free(sv_parse *p);
mr_status sv_parse_push(sv_parse *p, const char *text, size_t n, sv_parse_out *o);
mr_status sv_parse_finish(sv_parse *p, sv_parse_out *o);

/* ======================================================================
 * The job: one HTTP request as the engine sees it. A request with k prompts
 * and n choices each becomes k*n generations ("gens"), each one engine
 * sequence. The HTTP side writes the inputs before submitting and never
 * again; the engine thread appends tokens under job->mu and, when the HTTP
 * side has parked its connection (job->parked), un-parks it (job->wake,
 * called after job->mu is released: it resumes the connection in the event
 * loop).
 * ====================================================================== */
typedef enum { SV_FIN_NONE = 0, SV_FIN_STOP, SV_FIN_LENGTH, SV_FIN_ABORT, SV_FIN_ERROR } sv_fin;

/* One token's log-probabilities (only when the request asks), with room for the request's
 * top_logprobs alternatives and no more: arrays of them are sv_logprob_size(top_logprobs)
 * bytes a entry (sv_logprob_at), so that a request asking for one alternative holds 20 bytes
 * a token, not the 172 of the most a request may ask. */
typedef struct {
    float logprob;
    int n_top;
    int32_t rank;           /* prompt entries: the token's rank (vLLM's); 0 for generated tokens */
    mr_token_logprob top[]; /* [the request's top_logprobs] */
} sv_logprob;
static inline size_t sv_logprob_size(int top_logprobs) {
    return sizeof(sv_logprob) + (size_t)top_logprobs * sizeof(mr_token_logprob);
}
static inline sv_logprob *sv_logprob_at(sv_logprob *a, int top_logprobs, int64_t k) {
    return (sv_logprob *)((char *)a + (size_t)k * sv_logprob_size(top_logprobs));
}

struct sv_job;
/* sv_gen.cancel */
enum { SV_CANCEL_NONE = 0, SV_CANCEL_ABORT = 1, SV_CANCEL_DONE = 2 };

typedef struct sv_gen {
    struct sv_job *job;
    int index;                  /* choice index in the response */
    /* inputs (read-only once submitted) */
    const int32_t *prompt;
    int64_t n_prompt;
    mr_sampling sp;             /* the engine's sampling parameters */
    int64_t max_tokens;
    bool ignore_eos;
    /* HTTP thread -> engine: SV_CANCEL_ABORT when the client left or the drain ran out, SV_CANCEL_DONE
     * when a stop string ended the output (the engine ends the gen either way; metrics count the first
     * as an abort, the second as a stop); set once, from 0 */
    atomic_int cancel;
    /* engine -> HTTP thread, under job->mu */
    const int32_t *forced;      /* tests: forced output tokens (the job's), or NULL */
    int64_t n_forced;
    int32_t *out;               /* [max_tokens] */
    sv_logprob *lp;             /* [max_tokens] (sv_logprob_at) when the request asks for logprobs, else NULL */
    sv_logprob *plp;            /* echo with logprobs: [n_prompt] (sv_logprob_at), entry p the prompt token at
                                   p (from 1) */
    int64_t n_plp;              /* plp entries 1 .. n_plp - 1 are filled */
    /* sglang's token_ids_logprob (with return_logprob): the ids (the job's), and their log-probabilities at
     * each output token [max_tokens][n_lp_ids] and, with plp, at each prompt position [n_prompt][n_lp_ids]
     * (filled as lp and plp are); has_lp_ids: the answer carries the lists (given for this prompt) */
    const int32_t *lp_ids;
    int n_lp_ids;
    bool has_lp_ids;
    float *idlp, *plp_idlp;
    int32_t *routes;            /* return_routed_experts: [n_prompt + max_tokens][n_layers * top_k], rows as their
                                   positions are computed (under job->mu) */
    int64_t routes_cap;         /* rows */
    bool idlp_next;             /* echo_only: idlp's first row holds the ids at the position after the prompt
                                   (sglang's prefill-only output_token_ids_logprobs; under job->mu) */
    bool echo_only;             /* max_tokens 0 with echo: the engine's one token is not the client's */
    int64_t n_out;
    sv_fin fin;
    int64_t cached_tokens;
    char err[200];
    bool unavailable;           /* with SV_FIN_ERROR: the engine can run nothing any more (an
                                   expert-parallel rank failed): 503, not 500 */
    char wver[SV_MAX_WEIGHT_VERSION + 1]; /* the weight version when it ended (sglang's meta_info.weight_version) */
    /* engine thread only */
    struct sv_gen *next;        /* submission queue */
    struct sv_gen *lprev, *lnext; /* the engine thread's list of gens in the engine */
    uint64_t rid;               /* the engine's request id */
    uint64_t t_last_ns;         /* the previous token */
    uint64_t t_sched_ns, t_first_ns; /* first scheduled, first token (the phases' histograms) */
    bool seen_first;
    struct mr_matcher *matcher; /* structured outputs: the gen's grammar state (engine thread), or NULL */
} sv_gen;

typedef struct sv_job {
    struct mr_server *srv;
    sv_request req;
    int n_gen;
    sv_gen *gens;
    int n_prompts;              /* completions: the request's prompts; chat: 1 */
    int32_t *forced;            /* tests: the forced output tokens of every gen */
    int64_t n_forced;
    int32_t *ids;               /* all prompt ids of the gens (gens point into it) */
    int32_t *lp_ids;            /* token_ids_logprob: every prompt's ids (gens point into it), or NULL */
    float *idlp;                /* their log-probabilities: every gen's idlp and plp_idlp (gens point into it) */
    int32_t *routes;            /* return_routed_experts: every gen's rows (gens point into it) */
    int64_t *prompt_len;        /* [n_prompts] tokens per prompt */
    char **prompt_text;         /* [n_prompts] text of each prompt (for echo), may be NULL */
    pthread_mutex_t mu;
    int live;                   /* gens the engine has not finished, under mu */
    uint64_t version;           /* bumped (under mu) by every publish: the HTTP side waits for a change */
    /* under mu: the HTTP side parked its connection until the next publish (wake_each: streams
     * and stop strings) or until the last gen ends; the engine clears parked and calls
     * wake(wake_arg) once mu is released. wake is NULL once the HTTP side is gone. */
    bool parked, wake_each;
    void (*wake)(void *arg);
    void *wake_arg;
    atomic_int refs;            /* 1 for the HTTP side + 1 while the engine holds any gen */
    struct sv_job *jprev, *jnext; /* the server's list of submitted jobs (its jmu), for sglang's /abort_request */
    bool listed;
    uint64_t t_arrive_ns;
    char id[40];                /* "cmpl-..." */
    int64_t created;            /* unix seconds */
} sv_job;

void sv_job_release(sv_job *j); /* drops one reference; the last frees */

/* ======================================================================
 * The engine thread (engine.c).
 * ====================================================================== */
typedef struct sv_engine sv_engine;
/* Wraps an engine (owned from here on: freed by sv_engine_free) whose only
 * user becomes the engine thread. */
mr_status sv_engine_new(mr_engine *eng, const mr_server_opts *o, sv_metrics *metrics, sv_engine **out);
mr_status sv_engine_start(sv_engine *e);
/* Hands the job's gens to the engine thread (takes the engine reference).
 * After sv_engine_stop the gens end at once as aborted. */
void sv_engine_submit(sv_engine *e, sv_job *j);
/* Cancels everything admitted (drain timeout, shutdown). */
void sv_engine_abort_all(sv_engine *e);
/* Stops the thread after finishing the current step; finishes every gen as
 * aborted (each parked job is woken). */
void sv_engine_stop(sv_engine *e);
void sv_engine_free(sv_engine *e);
/* Drops the prefix cache (the engine thread does it between steps): 0 done (*dropped the KV blocks that
 * were cached), 1 not done because gens are admitted (it is flushed only when idle), -1 the engine thread
 * is not running. */
int sv_engine_flush(sv_engine *e, int64_t *dropped);
/* Admitted gens not yet finished (running + waiting). */
int64_t sv_engine_inflight(sv_engine *e);

/* ---- generation control, done by the engine thread between steps (sglang's /pause_generation,
 * /continue_generation and /update_weights_from_disk; vLLM's /pause and /resume) ----
 * While paused nothing is computed: requests keep arriving into the queue, cancellations still end
 * requests; the running ones (in place) keep their KV blocks. Modes:
 *   ABORT     every admitted request ends now, aborted (sglang's default, vLLM's "abort");
 *   RETRACT   the running requests go back to the queue, their KV blocks freed: they recompute (under the
 *             weights of then) when generation continues;
 *   IN_PLACE  the running requests stop where they are, their KV kept (vLLM's "keep");
 *   WAIT      no request starts; the pause begins when the running ones have ended (vLLM's "wait").
 * clear_cache (vLLM's): the prefix cache is dropped once no request runs. */
typedef enum { SV_PAUSE_ABORT = 0, SV_PAUSE_RETRACT = 1, SV_PAUSE_IN_PLACE = 2, SV_PAUSE_WAIT = 3 } sv_pause_mode;
/* Called by the engine thread when an asked pause holds (http 200, msg NULL), or did not happen (409: a
 * continue came first; 503: the engine stopped). */
typedef void (*sv_ctl_done)(void *arg, int http, const char *msg);
/* 0 asked (done is called later, once), 1 another pause is pending (nothing asked). */
int sv_engine_pause(sv_engine *e, sv_pause_mode mode, bool clear_cache, sv_ctl_done done, void *arg);
/* Generation goes on (the held requests where they stopped); a pause still pending is called off (its done:
 * 409). Returns whether it was paused. */
bool sv_engine_continue(sv_engine *e);
/* vLLM's sleep (level 1), sglang's release_memory_occupation of the KV cache: a pause in retract mode (the
 * running requests go back to the queue, to recompute when generation continues) whose hold then gives the
 * KV pool's pages back to the system (mr_engine_release_kv); done as sv_engine_pause's (500 with the reason
 * when the memory could not go back: generation is paused all the same). sv_engine_continue wakes it. */
int sv_engine_sleep(sv_engine *e, sv_ctl_done done, void *arg);
bool sv_engine_sleeping(sv_engine *e, size_t *bytes); /* *bytes: the memory the sleep gave back */
bool sv_engine_paused(sv_engine *e);
/* New weights (the model's mr_model_weights_swap) by the engine thread, between steps: after every running
 * request has ended (no new one starts meanwhile; abort_all: they end now, aborted), or at once while paused
 * (requests held in place go on under the new weights, on their KV). Then the prefix cache is dropped (flush;
 * refused, nothing swapped, while requests are held in place: their blocks cannot go), the weight version
 * set (version non-NULL), and the engine left paused (in place) with keep_pause. Blocks the calling thread
 * (not an HTTP one) until done: 200 swapped (staged then holds the old weights), 400 refused (msg says
 * why), 503 the engine stopped first. *held: requests held in place at the swap.
 * Under expert parallelism every rank swaps at that point or none does (mr_engine_ep_commit, waiting up to
 * ep_timeout_s for the other ranks' loads): a rank whose load failed makes it a 400 naming the rank. staged
 * NULL (expert parallel only): this rank's load failed, msg in says why; the other ranks drop theirs. */
typedef struct {
    bool flush, abort_all, keep_pause;
    const char *version;
    double ep_timeout_s;
} sv_swap_opts;
int sv_engine_swap(sv_engine *e, mr_model *staged, const sv_swap_opts *o, char *msg, size_t n, int *held);
/* Expert parallel: the other ranks start loading dir (mr_engine_ep_load, sent by the engine thread between
 * steps); 200 (at once in one process), or 503 with msg when the engine stopped or the group broke. */
int sv_engine_ep_load(sv_engine *e, const char *dir, char *msg, size_t n);
bool sv_engine_ep(const sv_engine *e); /* the model runs over several expert-parallel ranks */
/* The weight version (sglang's weight_version: --weight-version, then each update's). */
void sv_engine_weight_version(sv_engine *e, char *out, size_t n);
void sv_engine_set_weight_version(sv_engine *e, const char *v);

/* ---- the step profile (profile.c): sglang's /start_profile and /stop_profile ---- */
typedef struct {
    uint64_t step;                 /* the engine's step count */
    uint64_t t0, t_publish, t_end; /* mr_now_ns: the step began, its events' publishing began, it ended */
    uint64_t schedule_ns, forward_ns, sample_ns, complete_ns; /* the engine's parts (mr_engine_stats) */
    uint64_t attention_ns, moe_ns, other_ns;                  /* the forward's (mr_model_timing) */
    int64_t n_prefill, n_decode;
    int n_seq, n_preempted, n_events;
} sv_prof_step;
typedef struct sv_profile sv_profile;
sv_profile *sv_profile_new(void);
void sv_profile_free(sv_profile *p);
/* Starts recording (num_steps > 0: that many steps at most): 0, or 1 when one is running already. */
int sv_profile_start(sv_profile *p, int64_t num_steps);
/* Whether it records (the engine thread asks before each step). */
bool sv_profile_on(sv_profile *p);
/* Appends a step: its index, or -1 when it was not kept (not recording, num_steps reached, the cap). */
int64_t sv_profile_step(sv_profile *p, const sv_prof_step *s);
/* The end of step k's publishing (t_end), when k is still that step (t0) of the recording. */
void sv_profile_step_end(sv_profile *p, int64_t k, uint64_t t0, uint64_t t_end);
/* Stops and answers the recorded steps as a Chrome trace (JSON, mr_free, *len bytes); NULL when none was
 * running (*len 0) or out of memory (*len 0, and recording stopped). */
char *sv_profile_stop(sv_profile *p, const char *model, const char *runner, size_t *len);
/* The engine's profile (owned by it). */
sv_profile *sv_engine_profile(sv_engine *e);
/* NULL while the engine runs; the reason once it cannot run any more (its
 * expert-parallel group broke: every gen, and every later one, ends 503). */
const char *sv_engine_failure(sv_engine *e);
/* Reserves k gens against max_running + max_queued; false when full. */
bool sv_engine_reserve(sv_engine *e, int k);
void sv_engine_unreserve(sv_engine *e, int k);

/* ======================================================================
 * Response building (respond.c): the JSON bodies and SSE chunks.
 * ====================================================================== */
/* A growable byte buffer. */
typedef struct {
    char *p;
    size_t len, cap;
} sv_buf;
int sv_buf_add(sv_buf *b, const char *s, size_t n);   /* 0 or -1 (out of memory) */
/* Appends a string literal (its length from sizeof, never counted by hand). */
#define sv_buf_lit(b, lit) sv_buf_add((b), "" lit, sizeof(lit) - 1)
int sv_buf_printf(sv_buf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void sv_buf_free(sv_buf *b);
/* Appends s as a JSON string literal (quotes and escapes; invalid UTF-8 as U+FFFD). */
int sv_buf_json_str(sv_buf *b, const char *s, size_t n);
/* Appends the n bytes at p in standard base64 (RFC 4648, padded). */
int sv_buf_base64(sv_buf *b, const void *p, size_t n);

/* The output side of one job (respond.c), owned by its HTTP thread: per
 * choice the streaming detokenizer, the stop strings, the reasoning /
 * tool-call parser and what was sent. */
typedef struct sv_out sv_out;
mr_status sv_out_new(sv_job *j, const sv_text *t, const mr_model *m, const char *model_name, sv_out **out);
void sv_out_free(sv_out *o);
/* Takes what the engine has published since the last call. Streaming: the
 * SSE events for it are appended to sse (one event per token). Returns 1
 * when the response is complete, 0 when more is to come, -1 on out of memory. */
int sv_out_advance(sv_out *o, sv_buf *sse);
/* Once complete: the error of a choice that failed (the engine's message), or NULL. */
const char *sv_out_failure(const sv_out *o);
/* Non-streaming, once complete: the response body (malloc'd) and its status. */
char *sv_out_body(sv_out *o, int *http);
/* Sets every unfinished gen's cancel flag (client gone). */
void sv_job_cancel(sv_job *j);
/* Sets g->cancel to why (SV_CANCEL_ABORT or SV_CANCEL_DONE) unless it is set already. */
void sv_gen_cancel(sv_gen *g, int why);

/* A request body as a JSON object (nested at most SV_MAX_JSON_DEPTH, no duplicate keys); NULL with *e
 * filled (400) otherwise. */
json_t *sv_body_object(const char *body, size_t len, sv_error *e);
/* "an object", "a string", ... for messages; "nothing" for NULL. */
const char *sv_json_type(const json_t *v);

/* ---- stored responses (store.c) ---- */
typedef struct sv_store sv_store;
/* A store bounded to cap_bytes (the texts and a small overhead per entry); NULL when cap_bytes is 0 (storing
 * off) or out of memory. Thread-safe. evict: past the bound the least recently used entries go; else a put
 * that would pass it is refused. */
sv_store *sv_store_new(size_t cap_bytes, bool evict);
void sv_store_free(sv_store *st);
/* Keeps copies of the texts under id (replacing an entry of the same id); in an evicting store the least
 * recently used entries go while the bound is passed. 0, 1 when the entry alone passes the bound (not kept),
 * 2 when a store without eviction would pass it (not kept), -1 out of memory. */
int sv_store_put(sv_store *st, const char *id, const char *response, const char *items, int n_input);
/* Replaces the response text of id by fn's, made under the store's lock from the old one: fn returns a new
 * text (mr_malloc'd) or NULL with *rc set (0: nothing changes; another value is returned as is). The
 * entry becomes the most recently used. 0, 1 when id is not held, 2 when the new text would pass the bound
 * (nothing changes; grow: allowed to, the bound then refuses later puts and edits without grow), or fn's
 * *rc. */
int sv_store_edit(sv_store *st, const char *id, bool grow, char *(*fn)(const char *response, void *arg, int *rc),
                  void *arg);
/* Copies (mr_free) of what id holds, each out pointer optional; the entry becomes the most recently used.
 * 0, 1 when id is not held, -1 out of memory. */
int sv_store_get(sv_store *st, const char *id, char **response, char **items, int *n_input);
bool sv_store_delete(sv_store *st, const char *id);
/* An entry claimed for owner (at most 63 characters; in constant time, never failing): 0, 1 when id is not
 * held, 2 when another holds the claim. sv_store_unclaim gives it up when owner holds it; the claim goes
 * with its entry. */
int sv_store_claim(sv_store *st, const char *id, const char *owner);
void sv_store_unclaim(sv_store *st, const char *id, const char *owner);
/* Room for n bytes promised to an edit to come (with grow): later puts and edits without grow count it
 * against the bound until it is given back. false (nothing promised) when the bound has no such room. */
bool sv_store_reserve(sv_store *st, size_t n);
void sv_store_unreserve(sv_store *st, size_t n);
void sv_store_stats(sv_store *st, int64_t *count, size_t *bytes, uint64_t *evicted);

/* ---- the Responses API (responses.c) ---- */
/* The reasoning item's encrypted_content (asked for with include "reasoning.encrypted_content", what
 * clients that keep no server state send): not encrypted, the reasoning text behind this prefix, so that
 * the next turn's reasoning item gives it back to the template. */
#define SV_ENC_PREFIX "moerun-reasoning:"
/* 2 * n random hex digits into out (2n + 1 bytes, n <= 32): from the kernel's generator, else from the
 * clock and a counter (ids then stay unique, if guessable). */
void sv_random_hex(char *out, size_t n);
/* Responses input (a string or a list of items) appended to msgs as chat messages; 0, or -1 with *e filled
 * (the param input[i]...). */
int sv_resp_input_msgs(const json_t *in, json_t *msgs, sv_error *e);
/* Input read by sv_resp_input_msgs as conversation items, each with an id (prefix_hex_i where it had none):
 * a string is one user message, a message's string content its one text part (input_text; output_text for
 * the assistant's), as input_items lists them. NULL out of memory. */
json_t *sv_resp_ctx_items(const json_t *in, const char *hex);
/* One page of items (the first n of the list all): OpenAI's list object, limit 1..100 [20], order "asc" |
 * "desc" [desc], after an item id (`of` says what it must name, for the error). A malloc'd JSON text, or NULL
 * with *e filled. */
char *sv_item_page(const json_t *all, long n, const char *limit, const char *order, const char *after, const char *of,
                   sv_error *e);
typedef struct {
    char *chat_json; /* the chat completions request it runs as (JSON text, free()) */
    json_t *echo;    /* the fields its Response echoes */
    json_t *ctx;     /* the conversation's items before the output (the previous response's, then this input's,
                        each with an id): kept beside the Response when it is stored */
    bool encrypted;  /* include reasoning.encrypted_content */
    bool keep;       /* the Response is to be stored (a store exists, and store is not false) */
    bool background; /* background: true (then keep): answered at once, run without its connection */
    bool truncate;   /* truncation "auto" */
    char id[64];     /* "resp_" and 48 random hex digits */
    char conv[64];   /* the conversation it belongs to ("" none), claimed for it (sv_conv_claim) */
    json_t *conv_input; /* ... this input's items, added to it with the output when the Response ends */
    size_t conv_reserved; /* ... the room reserved for them */
} sv_resp_in;
/* The Responses request translated (previous_response_id read from store, conversation from convs; either
 * may be NULL: off); 0, or -1 with *e filled (and nothing in *in to free). */
int sv_responses_to_chat(const char *body, size_t len, sv_store *store, sv_store *convs, sv_resp_in *in, sv_error *e);
/* Keeps response under id in st, beside ctx (its conversation's items before the output) and its output
 * items; its text in *text when asked. sv_store_put's result (-1 also out of memory). */
int sv_resp_store(sv_store *st, const char *id, const json_t *ctx, const json_t *response, char **text);
/* ---- the Conversations API (conversations.c) ---- */
typedef struct {
    const char *limit, *order, *after; /* GET .../items (NULL: absent) */
    bool encrypted;                    /* include reasoning.encrypted_content */
    const char *bad_include;           /* an include value not served (a 400), or NULL */
} sv_conv_query;
/* A request to /v1/conversations + path ("" or "/{id}[/items[/{item}]]") on the conversations' store cv
 * (NULL: off, a 404): the answer (a malloc'd JSON text), or NULL with *e filled. */
char *sv_conv_handle(sv_store *cv, const char *method, const char *path, const char *body, size_t len,
                     const sv_conv_query *q, sv_error *e);
/* metadata (OpenAI's: at most 16 keys of at most 64 characters, string values of at most 512); 0, or -1 with
 * *e filled. */
int sv_check_metadata(const json_t *x, const char *param, sv_error *e);
/* The conversation of a Responses request (an id, or {"id"}): its id in id; 0, or -1 with *e filled. */
int sv_conv_id(sv_store *cv, const json_t *x, char id[64], sv_error *e);
/* Conversation id claimed for the response owner (one runs at a time in a conversation: another's claim is
 * a 409 until sv_conv_release), with room for `reserve` bytes of its items reserved in the store: the
 * conversation's items (a new reference). NULL with *e filled (unknown: 404; running another response: 409;
 * no room: 400), and nothing claimed. */
json_t *sv_conv_claim(sv_store *cv, const char *id, const char *owner, size_t reserve, sv_error *e);
/* The claim of owner on conversation id given up, and its reserved room given back (nothing when the
 * conversation is gone or another holds it). */
void sv_conv_release(sv_store *cv, const char *id, const char *owner, size_t reserved);
/* An ended Response's items added to conversation id: its input's, then its output. Past the bound too;
 * nothing when the conversation was deleted meanwhile. */
void sv_conv_append(sv_store *cv, const char *id, const json_t *input, const json_t *output);

/* A chat field named in an error, renamed to the Responses request's. */
void sv_responses_param(sv_error *e);
/* An error of a translated request in the words of the one the client sent: a param of from (or from.x,
 * from[i]) becomes to_param (its rest kept); with to_word, from as a word in the message becomes to_word. */
void sv_error_rename(sv_error *e, const char *from, const char *to_param, const char *to_word);
/* A typed SSE event (the Responses and Messages APIs): "event: TYPE", then "data: " and the object
 * (stolen) with "type": TYPE added. 0, or -1 out of memory. */
int sv_sse_typed(const char *type, json_t *obj, sv_buf *b);
enum { SV_RI_REASONING = 1, SV_RI_MESSAGE, SV_RI_CALL };
typedef struct {
    int kind;   /* the open output item (SV_RI_*), 0 none */
    int index;  /* output items opened so far */
    char item_id[112], call_id[48], name[128];
    sv_buf text; /* the open item's text or arguments */
    sv_buf lp;   /* a message's logprobs entries (JSON texts joined by commas) */
    json_t *done; /* the items closed so far, in order */
    int64_t seq;  /* the next sequence_number */
    bool encrypted; /* reasoning items carry encrypted_content */
} sv_resp_stream;
/* A Response (status "in_progress", "completed", ...) with the request's echoed fields, no output yet. */
json_t *sv_resp_object(const sv_job *j, const char *model, const char *status);
json_t *sv_resp_usage(int64_t in, int64_t cached, int64_t out, int64_t reasoning);
/* The output items of a whole answer: reasoning, message (also when empty and no calls; its output_text's
 * logprobs the nlp bytes of entries at lp, JSON texts joined by commas), function calls. */
json_t *sv_resp_items(const char *rid, const char *reasoning, size_t nr, const char *content, size_t nc, const char *lp,
                      size_t nlp, const json_t *calls, bool incomplete, bool encrypted);
/* Stream events: response.created + in_progress (response stolen); a parsed piece (items opened and closed
 * as the kind changes); the last event (type response.completed / incomplete / failed; response stolen,
 * its output set to the items streamed). */
int sv_resp_begin(sv_resp_stream *rs, json_t *response, sv_buf *sse);
int sv_resp_piece(sv_resp_stream *rs, const char *rid, const sv_parse_out *po, const char *lp, size_t nlp, sv_buf *sse);
int sv_resp_end(sv_resp_stream *rs, json_t *response, const char *type, sv_buf *sse, void (*done)(void *, json_t *),
                void *ctx); /* done (optional): the whole Response, before its event is written */
void sv_resp_stream_free(sv_resp_stream *rs);

/* ---- Anthropic's Messages API (anthropic.c) ---- */
/* The Messages request as a chat completions request (JSON text, free()); count_only: for
 * /v1/messages/count_tokens (no max_tokens needed). 0, or -1 with *e filled. */
int sv_anthropic_to_chat(const char *body, size_t len, bool count_only, char **chat_json, sv_error *e);
/* {"type": "error", "error": {"type", "message"}} (free()). */
char *sv_anthropic_error_body(const sv_error *e);
json_t *sv_anthropic_usage(int64_t prompt, int64_t cached, int64_t out);
/* The whole message (usage stolen): thinking, text (also when empty and no calls), tool_use blocks; with
 * content NULL (and no calls) the empty shell of message_start. */
json_t *sv_anthropic_message(const sv_job *j, const char *model, const char *reasoning, size_t nr, const char *content,
                             size_t nc, const json_t *calls, const char *stop_reason, const char *stop_seq, json_t *usage);
/* Stream events: message_start (message stolen); a parsed piece (blocks started and stopped as the kind
 * changes); message_delta and message_stop; an error event. */
int sv_anthropic_begin(json_t *message, sv_buf *sse);
int sv_anthropic_piece(sv_resp_stream *rs, const sv_parse_out *po, sv_buf *sse);
int sv_anthropic_end(sv_resp_stream *rs, const char *stop_reason, const char *stop_seq, json_t *usage, sv_buf *sse);
int sv_anthropic_fail(const char *message, sv_buf *sse);

/* ---- sglang's native API (sglang.c) ---- */
/* POST /generate as a completions request (JSON text, free()) and what its answer needs (*meta: rid,
 * batch). 0, or -1 with *e filled. */
int sv_sglang_to_completions(const char *body, size_t len, char **out_json, json_t **meta, sv_error *e);
/* What meta holds that the completions request cannot say, onto the parsed request (vLLM's checks never see
 * it): max_new_tokens 0 (max_tokens 0: the prompt alone); return_logprob with logprob_start_len s >= 0 (the
 * prompt's log-probabilities from s + 1: prompt_logprobs top_logprobs_num, plp_from s + 1, streamed too). */
void sv_sglang_apply(const json_t *meta, sv_request *r);
/* A completions field named in an error of such a request, renamed to /generate's (sampling_params.x). */
void sv_sglang_param(sv_error *e);
/* The meta_info.id of choice i (of j->n_gen) of a /generate answer, at most 95 bytes: the prompt's rid of a
 * list of them (then -k for its choice k when it has several); else the rid (or the request's id), then -i
 * when the answer has several choices. */
void sv_sglang_choice_id(const struct sv_job *j, int i, char *out, size_t cap);
/* sglang's POST /v1/score {query, items, label_token_ids, apply_softmax, item_first, model} as the completions
 * request of its prompts (query + item each, text or ids; the prompt alone) with meta as /generate's (score,
 * apply_softmax, token_ids_logprob, prefill_only, return_logprob, batch). 0, or -1 with *e filled. */
int sv_score_to_completions(const char *body, size_t len, char **out_json, json_t **meta, sv_error *e);
/* A field named in an error of such a request, renamed to /v1/score's (items, label_token_ids). */
void sv_score_param(sv_error *e);
/* The answer of a /v1/score request: {"scores": [[p per label] per item], "model", "usage", "object":
 * "scoring"}; lp[i] the labels' log-probabilities after item i (NULL: none came), each a probability
 * (exp) or, with apply_softmax, normalized over the labels. */
json_t *sv_score_object(const json_t *meta, const char *model, int n_items, const float *const *lp, int n_labels,
                        int64_t prompt_tokens);
/* One answer object (text, meta_info; output_ids when ids is given); reason NULL while streaming. */
json_t *sv_sglang_object(const char *id, const char *text, size_t n, const int32_t *ids, int64_t n_ids, const char *reason,
                         const char *matched, int32_t matched_id, int64_t prompt, int64_t completion, int64_t cached);

/* The load generator's (and its datasets') random numbers: splitmix64, the next of state *s. */
static inline uint64_t sv_splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#endif
