/* moerun/serve.h — the OpenAI-compatible HTTP server (`moerun serve`) and the
 * load generator of `moerun bench serve`. Behaviour: shared/spec/serving.md.
 *
 * Threads and ownership. One engine thread owns the model, its KV cache and
 * the table of running requests; it runs the step loop (schedule, build the
 * batch, forward, sample, stop checks, free). The HTTP event loop
 * (libmicrohttpd's poll thread, or a pool of --threads-http of them, each
 * serving its share of the connections) only parses and validates a
 * request, tokenizes it, hands it to the engine thread through the
 * submission queue and parks the connection; the engine thread un-parks it
 * when it publishes tokens to the request's output queue, and the loop turns
 * them into text and server-sent events, all of a step's events in one
 * wake-up, never blocking. A client that goes away sets the request's cancel
 * flag; the engine thread sees it at its next step boundary and frees the
 * request there. Nothing else is shared.
 *
 * Lifetime: mr_server_open -> mr_server_start (listens; /health answers 503
 * while loading) -> mr_server_attach (an open model) -> mr_server_set_ready
 * (after the startup self-check) -> ... -> mr_server_drain (503 for new
 * work, waits for the admitted requests) -> mr_server_close. */
#ifndef MOERUN_SERVE_H
#define MOERUN_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "moerun/base.h"
#include "moerun/engine.h"
#include "moerun/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Limits and settings of a server. mr_server_opts_default fills every field
 * with the default named in brackets; each is a `moerun serve` flag. */
typedef struct {
    const char *host;              /* listen address ["127.0.0.1"] */
    int port;                      /* [30000]; 0 picks a free port (see mr_server_port) */
    const char *served_model_name; /* id in /v1/models and responses [the model folder's name] */
    const char *model_dir;         /* the checkpoint folder: tokenizer and generation_config [required] */
    const char *chat_template;     /* a Jinja file, or the template itself (text holding "{{" or "{%"), in place
                                      of the folder's (vLLM's and sglang's --chat-template) [NULL] */
    const char *reasoning_parser;  /* vLLM's / sglang's names: minimax_m2, minimax (reasoning_content apart) or
                                      minimax_m2_append_think, minimax-append-think (kept in content after
                                      "<think>"); the chat template must be MiniMax-M2's [NULL: by the template] */
    const char *tool_call_parser;  /* minimax_m2, minimax-m2; the template must be MiniMax-M2's [NULL] */
    int max_queued_requests;       /* sequences admitted beyond the engine's running set; past
                                      running + queued, 503 at once [256] */
    int64_t max_prompt_tokens;     /* [0: the engine's context length - 1] */
    int64_t max_completion_tokens; /* the largest max_tokens a request may ask [0: context length - 1] */
    int max_choices;               /* prompts x n of one request [64] */
    size_t max_body_bytes;         /* request body [8 MiB] */
    int header_timeout_s;          /* a request head must arrive within this of the connection's start
                                      or of its previous response [10] */
    int body_timeout_s;            /* the body must arrive within this of the head [30] */
    int idle_timeout_s;            /* a connection that sends and takes nothing this long is closed [60] */
    int max_connections;           /* open connections, beyond which new ones are refused [512] */
    int http_threads;              /* HTTP event-loop threads, each serving its share of the
                                      connections [1] */
    const char *api_key;           /* when set, requests need "Authorization: Bearer KEY" [NULL] */
    const char *weight_version;    /* the weights' version (sglang's --weight-version), until an update
                                      sets another; at most 128 bytes ["default"] */
    const char *allowed_origins;   /* CORS (as vLLM's and sglang's defaults): "*" any origin, or origins
                                      separated by commas (or vLLM's JSON list); "" sends no CORS headers
                                      and refuses preflights ["*"] */
    size_t response_store_bytes;   /* the Responses API's stored responses (store, previous_response_id,
                                      GET / DELETE /v1/responses/{id}), least recently used going first
                                      past this; 0: none stored [64 MiB] */
    size_t conversation_store_bytes; /* the Conversations API's conversations (/v1/conversations, a
                                      Responses request's conversation); never evicted: past this a
                                      request that would add to it is refused; 0: the API is off [64 MiB] */
    bool log_requests;             /* one line per finished request on stderr [false] */
    bool return_routed_experts;    /* /generate's return_routed_experts is served (sglang's
                                      --enable-return-routed-experts; such requests skip the prefix cache) [false] */
    bool debug_forced_output;      /* tests only: requests may carry debug_forced_output [false] */
    bool debug_slow_stream;        /* tests only: the event loop sleeps 50 ms each time it sends a stream's
                                      events, so that it falls behind the engine [false] */
    int debug_step_delay_ms;       /* tests only: the engine thread sleeps this long after each step that
                                      computed tokens (requests then run long enough to act on) [0] */
} mr_server_opts;

void mr_server_opts_default(mr_server_opts *o);
/* A reasoning_parser / tool_call_parser name is one served (the CLI checks before anything is loaded). */
bool mr_server_reasoning_parser_known(const char *name);
bool mr_server_tool_call_parser_known(const char *name);

typedef struct mr_server mr_server;

/* Creates the server (nothing is loaded; every model route answers 503
 * until a model is attached and the server is set ready). Reads
 * generation_config.json from o->model_dir for the sampling defaults. */
mr_status mr_server_open(const mr_server_opts *o, mr_server **out);
/* Listens. /health is 503 ("loading") until mr_server_set_ready. */
mr_status mr_server_start(mr_server *s);
/* The port actually bound (useful with port 0). */
int mr_server_port(const mr_server *s);
/* The model id clients send (--served-model-name or the folder's name). */
const char *mr_server_model_name(const mr_server *s);
/* Hands the server an engine (moerun/engine.h), which it owns from here on
 * (freed by mr_server_close; the model under it stays the caller's and must
 * outlive the server): the engine thread becomes its only user. Reads the
 * tokenizer and chat template from o->model_dir and starts the engine thread.
 * The running set, context length and step budget are the engine's. */
mr_status mr_server_attach(mr_server *s, mr_engine *e);
/* The resolver's decision as JSON (mr_resolution_json), copied, for GET /get_server_info. */
mr_status mr_server_set_resolution(mr_server *s, const char *json);
/* Opens for work: /health turns 200. Needs a model attached. */
mr_status mr_server_set_ready(mr_server *s);
/* NULL while the engine can run; the reason once it cannot any more (its
 * expert-parallel group broke: a rank died or stopped answering). Every
 * request then ends with 503; the caller should drain and exit non-zero. */
const char *mr_server_failure(const mr_server *s);
/* Stops taking work (new generation requests and /health get 503), then waits
 * up to timeout_s seconds for the admitted requests to finish. Returns the
 * number still unfinished at the end (they are cancelled). */
int mr_server_drain(mr_server *s, double timeout_s);
/* Stops listening and the engine thread, frees everything. NULL ok. */
void mr_server_close(mr_server *s);

/* ---- the load generator (`moerun bench serve`) ----
 * Definitions of sglang's bench_serving (serving.md section 6): a semaphore
 * of `concurrency` around each request, all requests created at t = 0 (or,
 * with request_rate, arriving as a Poisson process as sglang's do), the
 * clock of a request started just before it is sent; TTFT = first chunk with
 * text (or token ids), ITL = gaps between later chunks, TPOT = (latency -
 * TTFT) / (output_len - 1), output_len from usage.completion_tokens (a server
 * that sends no usage: the number of events with output). */
#define MR_BENCH_MAX_PERCENTILES 16

typedef struct {
    const char *base_url;   /* e.g. http://127.0.0.1:30000 */
    const char *api_key;    /* sent as "Authorization: Bearer KEY" on every request [NULL: none] */
    const char *model;      /* "model" of the requests [the first of /v1/models] */
    int concurrency;
    int num_prompts;
    int64_t input_len, output_len;
    bool chat;              /* /v1/chat/completions with text prompts (else completions with token ids) */
    bool native;            /* sglang's native POST /generate (its bench_serving's default backend): input_ids or
                               text, sampling_params, the text so far per event and meta_info.completion_tokens */
    bool text_prompts;      /* completions: random text instead of token ids */
    const char *tokenizer;  /* text prompts decoded here from this model folder's tokenizer.json
                               (for servers without /detokenize) [NULL: the server's /detokenize] */
    int64_t vocab;          /* token ids are drawn in [min_id, vocab) [from the server's /tokenize, else 1000] */
    int64_t min_id;         /* [10] */
    uint64_t seed;          /* prompt generator [1] */
    bool warmup;            /* warm-up requests outside the timing [true] */
    int warmup_requests;    /* how many, sent together (sglang's --warmup-requests) [0 or 1: one] */
    bool repeat_first;      /* every request the first one's body (the warm-up: sglang's sends its first request's
                               prompt warmup_requests times) [false] */
    bool whole;             /* not streamed: each answer one JSON body; TTFT = latency, no ITL (sglang's
                               --disable-stream) [false] */
    bool keep_eos;          /* no ignore_eos: a request may end at the model's EOS before its output length
                               (sglang's --disable-ignore-eos) [false] */
    double timeout_s;       /* per request [600] */
    const char *extra_body; /* a JSON object merged into every request, its keys replacing the bench's own
                               (sglang's --extra-request-body: response_format, regex, ...) [NULL] */
    double request_rate;    /* requests/s of a Poisson arrival process (exponential gaps, the first at t = 0,
                               seeded), each still waiting for one of the C slots; 0 = inf, all at t = 0 [0] */
    double burstiness;      /* with request_rate: the gaps gamma-distributed of shape burstiness and mean
                               1 / request_rate (vLLM's --burstiness: 1 Poisson, below 1 burstier, above 1 more
                               even) [0: 1] */
    int n_percentiles;      /* more percentiles of TTFT, TPOT, ITL and E2E latency into the result's pct_*
                               (vLLM's --metric-percentiles) [0] */
    double percentiles[MR_BENCH_MAX_PERCENTILES]; /* each in [0, 100] */
    double slo_ttft_ms, slo_tpot_ms, slo_e2el_ms; /* vLLM's --goodput: a completed request within every one
                               given (> 0) is good; its TPOT (latency - TTFT) / (output_len - 1), 0 for one token */
    bool random_lengths;    /* each request's input and output lengths uniform in [max(1, floor(L * range_ratio)),
                               L] (sglang's random dataset, --random-range-ratio) [false: L and O for all] */
    double range_ratio;     /* in [0, 1], with random_lengths */
    int64_t prefix_len;     /* sglang's generated-shared-prefix dataset: each prompt starts with one of
                               prefix_groups random prefixes of this many tokens (request i: group i mod
                               prefix_groups), then its own input_len tokens [0: none] */
    int prefix_groups;      /* [1 with prefix_len] */
    int prompts_per_group;  /* sglang's dataset as its --dataset-name generated-shared-prefix makes it: num_prompts =
                               prefix_groups x prompts_per_group requests, each group's prompts_per_group in a seeded
                               shuffled order [0: request i in group i mod prefix_groups] */
    bool return_logprob;    /* /generate: ask for the output's log-probabilities (sglang's --return-logprob) */
    bool details;           /* keep each request's lengths, TTFT, ITLs, text and error in the result (sglang's
                               --output-details) [false] */
    const struct mr_bench_dataset *dataset; /* the prompts and output lengths of these rows (request i: row i; the
                               warm-up: row 0) in place of random ones; output_len then caps each row's [NULL] */
    bool dataset_tokens;    /* with dataset: the rows give only the token ids of the random prompts, each row's ids
                               repeated and cut to the drawn input length (sglang's random dataset over ShareGPT);
                               the lengths are drawn as without a dataset [false] */
} mr_bench_serve_opts;

/* One request of a run, as sglang's --output-details records it. */
typedef struct {
    int64_t input_len;   /* its prompt's tokens */
    int64_t output_len;  /* its output's tokens (0 for a failed request, as sglang counts it) */
    double ttft_s;       /* seconds to its first output (0 for a failed request) */
    double *itl_s;       /* [n_itl] seconds between its later output events */
    size_t n_itl;
    char *text;          /* [text_len] its output: completions' text, chat's reasoning_content and content,
                            /generate's text (NUL-terminated; a NUL the model wrote may come before the end) */
    size_t text_len;
    char error[256];     /* why it failed, "" when it did not */
} mr_bench_request;

typedef struct {
    int concurrency, completed, failed;
    double duration_s;
    int64_t total_input, total_output;
    double request_throughput, input_throughput, output_throughput, total_throughput, concurrency_measured;
    /* milliseconds */
    double ttft_mean, ttft_median, ttft_p99, ttft_std;
    double tpot_mean, tpot_median, tpot_p99, tpot_std;
    double itl_mean, itl_median, itl_p95, itl_p99, itl_max, itl_std;
    double e2e_mean, e2e_median, e2e_p99, e2e_std;
    double pct_ttft[MR_BENCH_MAX_PERCENTILES], pct_tpot[MR_BENCH_MAX_PERCENTILES], pct_itl[MR_BENCH_MAX_PERCENTILES],
        pct_e2e[MR_BENCH_MAX_PERCENTILES]; /* at opts.percentiles */
    int good;                  /* completed within the SLOs (opts.slo_*; every completed one without SLOs) */
    double request_goodput;    /* good / duration */
    char first_error[256];  /* what the first failed request said */
    double last_arrival_s;  /* when the last request was due to arrive (0 at request rate inf) */
    mr_bench_request *requests; /* [completed + failed] in request order, with details; else NULL */
} mr_bench_serve_result;
void mr_bench_serve_result_free(mr_bench_serve_result *r); /* its requests; the struct stays */

/* sglang's ShareGPT dataset (src/serve/dataset.c says how it is sampled): rows of a real conversation's first
 * turn (the prompt) and the token count of its second (the output length). */
typedef struct {
    char *prompt;        /* the first turn's text */
    int64_t prompt_len;  /* its tokens (the tokenizer's encode with special tokens, as sglang counts them) */
    int64_t output_len;  /* the second turn's tokens, or the fixed output length */
    int64_t source;      /* the conversation's index in the file's array */
    int32_t *ids;        /* [prompt_len]: the prompt's token ids, sent in place of its text (tokenize_prompt) */
} mr_bench_row;
typedef struct mr_bench_dataset {
    mr_bench_row *rows;  /* [n], in the shuffled order */
    int n;
    int64_t entries, usable;  /* the array's entries; those with two turns or more */
    int64_t malformed;        /* entries of another shape (not an object, a turn without a string value, a NUL) */
    int64_t visited;          /* usable entries counted before n rows were taken */
    int64_t short_pruned, long_pruned; /* a prompt or output under 2 tokens; prompt + output over context_len */
    int64_t context_len;      /* applied (0: none) */
} mr_bench_dataset;
typedef struct {
    const char *path;         /* the JSON file (nothing is downloaded) */
    int num;                  /* rows wanted (fewer where the file has fewer) */
    uint64_t seed;            /* the shuffle */
    int64_t fixed_output_len; /* >= 2 (sglang's --sharegpt-output-len) [0: the second turn's tokens] */
    int64_t context_len;      /* prune prompt + output above it (sglang's --sharegpt-context-len) [0: the server's
                                 max_model_len, where its /tokenize says it; -1: none] */
    const char *tokenizer;    /* a model folder whose tokenizer.json counts the tokens [NULL: the server's /tokenize] */
    const char *base_url;     /* the server */
    const char *api_key;      /* its key, for /tokenize [NULL: none] */
    bool apply_chat_template; /* each prompt the chat template's rendering of it as one user message, with the
                                 generation prompt and without the BOS token's text (sglang's
                                 --apply-chat-template); needs tokenizer [false] */
    bool tokenize_prompt;     /* keep each row's token ids (the tokenizer's, or the server's /tokenize
                                 "tokens"), to be sent in place of the text (sglang's --tokenize-prompt) [false] */
    bool prompts_only;        /* the source of sglang's random dataset: each row a first turn's token ids (kept), pruned
                                 only when it has none; no output counted (output_len 0), no context rule [false] */
} mr_bench_sharegpt_opts;
mr_status mr_bench_sharegpt_load(const mr_bench_sharegpt_opts *o, mr_bench_dataset **out);
void mr_bench_dataset_free(mr_bench_dataset *d); /* NULL ok */

/* Runs one sweep point (after one warm-up request when o->warmup). Failed
 * requests are counted, never fatal; the status is an error only when the
 * run could not be made (bad URL, out of memory, a failed warm-up). */
mr_status mr_bench_serve_run(const mr_bench_serve_opts *o, mr_bench_serve_result *r);
/* The warm-up alone: warmup_requests (at least one) requests of min(output_len, 32) tokens at once, outside
 * any timing (for a caller that reads the server's counters in between); an error when none succeeds. */
mr_status mr_bench_serve_warmup(const mr_bench_serve_opts *o);
/* GETs base_url + path into a NUL-terminated malloc'd buffer (*body, free
 * with free()); *http gets the status. Used for /metrics and /v1/models.
 * api_key: sent as "Authorization: Bearer KEY" [NULL: none]. */
mr_status mr_http_get(const char *base_url, const char *path, const char *api_key, double timeout_s, long *http,
                      char **body);
/* POSTs the JSON text json to base_url + path, as mr_http_get reads the answer. */
mr_status mr_http_post(const char *base_url, const char *path, const char *json, const char *api_key,
                       double timeout_s, long *http, char **body);
/* Percentile of v[0..n) with linear interpolation between closest ranks
 * (numpy's default); sorts v. 0 when n == 0. */
double mr_percentile(double *v, size_t n, double pct);
/* The arrival times of n requests at rate requests/s: t[0] = 0, then gaps gamma-distributed of shape
 * burstiness (1: exponential, a Poisson process) and mean 1 / rate, from seed (the run's). */
void mr_bench_arrivals(double rate, double burstiness, uint64_t seed, int n, double *t);

#ifdef __cplusplus
}
#endif
#endif
