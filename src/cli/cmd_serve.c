/* cmd_serve.c — `moerun serve`: the OpenAI-compatible server.
 *
 * Order of start: listen at once (/health answers 503 while loading),
 * resolve, run the startup self-check's reference half (a few seeded prompt
 * tokens through the reference runner, greedy), load the model with the
 * resolved runner, run the same tokens through it teacher-forced and compare
 * as `moerun probe` does (cli_probe.c): a mismatch prints the report and
 * exits 1 before any request is served. Then /health turns 200.
 *
 * Signals are taken by one thread (sigwait): SIGTERM or SIGINT starts the
 * drain (new work and /health get 503, admitted requests finish, up to
 * --shutdown-timeout seconds; then exit 0); a second one exits at once. */
#include <errno.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cli_ep.h"
#include "cli_model.h"
#include "cli_probe.h"
#include "moerun/config.h"
#include "moerun/engine.h"
#include "moerun/formats.h"
#include "moerun/kernels.h"
#include "moerun/model.h"
#include "moerun/moe.h"
#include "moerun/serve.h"

static void usage(FILE *f) {
    mr_server_opts d;
    mr_server_opts_default(&d);
    fprintf(f,
            "usage: moerun serve --model DIR [options] [resolver options]\n"
            "       moerun serve DIR [options] [resolver options]   (vLLM's form)\n\n"
            "An OpenAI-compatible HTTP server: POST /v1/completions, /v1/chat/completions, /v1/responses\n"
            "(OpenAI's Responses API), /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API),\n"
            "/generate (sglang's native API),\n"
            "/tokenize, /detokenize; GET /v1/models, /health, /ping, /version, /metrics (Prometheus).\n"
            "docs/serve.md has every field. The engine's limits are resolver\n"
            "options (below): --max-running-requests (alias --max-num-seqs), --context-length (alias\n"
            "--max-model-len), --max-batch-tokens (aliases --chunked-prefill-size, --max-num-batched-tokens),\n"
            "--kv-cache-memory, --kv-cache-dtype. The server's (default in brackets):\n"
            "  --host H                   listen address [%s]\n"
            "  --port P                   [%d]; 0 picks a free port (printed)\n"
            "  --served-model-name NAME   the model id clients send [the model folder's name]\n"
            "  --chat-template T          a Jinja file, or the template itself (holding {{ or {%%), in place\n"
            "                             of the folder's; its special tokens still come from the folder\n"
            "  --reasoning-parser P       minimax_m2 (or minimax): reasoning in reasoning_content (the default\n"
            "                             with MiniMax-M2's template); minimax_m2_append_think (or\n"
            "                             minimax-append-think): kept in content, after \"<think>\", as vLLM\n"
            "  --tool-call-parser P       minimax_m2 (or minimax-m2): tool calls into tool_calls (the default)\n"
            "  --enable-return-routed-experts  /generate's return_routed_experts: each position's experts in\n"
            "                             every layer (sglang's; RL routing replay) [off]\n"
            "  --weight-version V         the weights' version in /generate's meta_info and /get_model_info,\n"
            "                             until an update sets another (sglang's; RL) [default]\n"
            "  --scheduling-policy P      fcfs, or priority: waiting requests start by their priority field\n"
            "                             (lower first, then arrival; vLLM's order), and the least urgent running\n"
            "                             one is preempted first (vLLM's; sglang's --schedule-policy too, and\n"
            "                             --enable-priority-scheduling with --schedule-low-priority-values-first) [fcfs]\n"
            "  --disable-radix-cache      no prefix cache (sglang's; vLLM's --no-enable-prefix-caching): every\n"
            "                             prompt computed in full, e.g. to measure prefill [on]\n"
            "  --enable-auto-tool-choice, --trust-remote-code   accepted as vLLM / sglang take them: tool_choice\n"
            "                             auto is always served, and no code from a checkpoint ever runs\n"
            "  sglang's and vLLM's other names: --model-path (--model), --log-level (--log; warning, critical);\n"
            "  --enable-metrics, --disable-log-requests, --disable-log-stats have nothing to do (/metrics is\n"
            "  always on, no request is logged unless asked); --page-size / --block-size 16, --stream-interval 1\n"
            "  are how it runs (another value is refused); --mem-fraction-static\n"
            "  and --gpu-memory-utilization are refused (GPU memory; the KV pool here is --kv-cache-memory)\n",
            d.host, d.port);
    fprintf(f,
            "  --max-queued-requests N    admitted beyond the running set; past running + queued: 503 at once [%d]\n"
            "  --max-prompt-tokens N      [context length - 1]\n"
            "  --max-completion-tokens N  the largest max_tokens [context length - 1]\n"
            "  --max-choices N            prompts x n in one request [%d]\n"
            "  --max-body-bytes N         request body [%zu]\n"
            "  --header-timeout S         a request head must arrive within S seconds of the connection or of\n"
            "                             its previous response [%d]\n"
            "  --body-timeout S           the body must arrive within S seconds of its head [%d]\n"
            "  --idle-timeout S           a connection silent for S seconds, or a client that takes none of its\n"
            "                             response for S seconds, is closed [%d]\n"
            "  --max-connections N        open connections [%d]\n"
            "  --threads-http N           HTTP event-loop threads (parse, tokenize, stream), each serving\n"
            "                             its share of the connections [%d]\n"
            "  --shutdown-timeout S       on SIGTERM/SIGINT, wait up to S seconds for running requests [30]\n"
            "  --api-key KEY              require \"Authorization: Bearer KEY\"\n"
            "  --allowed-origins LIST     CORS: origins whose browser pages may call this server: \"*\", a comma\n"
            "                             list or a JSON list; \"\" for none [*]\n"
            "  --response-store-mb N      memory for the Responses API's stored responses (store,\n"
            "                             previous_response_id, GET/DELETE /v1/responses/ID), least recently\n"
            "                             used going first; 0 stores none [%zu]\n"
            "  --conversation-store-mb N  memory for the Conversations API's conversations (/v1/conversations,\n"
            "                             a response's conversation); never evicted: past it, what would add\n"
            "                             to it is refused; 0 turns the API off [%zu]\n"
            "  --skip-self-check          do not compare the resolved runner with the reference at start\n"
            "  --log-requests             one line on stderr per refused request\n\n",
            d.max_queued_requests, d.max_choices, d.max_body_bytes, d.header_timeout_s,
            d.body_timeout_s, d.idle_timeout_s, d.max_connections, d.http_threads, d.response_store_bytes >> 20,
            d.conversation_store_bytes >> 20);
    mr_options_print_help(f);
}

/* ---- signals ---- */
static pthread_mutex_t sig_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sig_cv = PTHREAD_COND_INITIALIZER;
static int sig_count;
static bool sig_ready; /* serving: a first signal drains instead of exiting */

static void *signal_thread(void *arg) {
    sigset_t *set = arg;
    for (;;) {
        int sig;
        if (sigwait(set, &sig)) continue;
        pthread_mutex_lock(&sig_mu);
        int n = ++sig_count;
        bool ready = sig_ready;
        pthread_cond_broadcast(&sig_cv);
        pthread_mutex_unlock(&sig_mu);
        if (n >= 2 || !ready) {
            static const char msg[] = "moerun serve: exiting at once\n";
            if (write(2, msg, sizeof msg - 1) < 0) { /* nothing to do */
            }
            _exit(sig == SIGTERM && !ready && n == 1 ? 0 : 128 + sig);
        }
    }
    return NULL;
}

/* ---- the self-check ---- */

/* The reference half: greedy tokens and logits of the seeded prompts from
 * the ground-truth runner, through an engine with the serving KV dtype (so
 * that the two halves differ by the runner only). */
static int self_check_reference(const mr_options *o, const char *dir, mr_format kv_dtype, mr_cli_probe_set *ps,
                                float **ref) {
    mr_resolution *r = NULL;
    mr_engine *e = NULL;
    int rc = mr_cli_probe_open("serve", o, dir, mr_moe_runner_ground_truth()->name, ps,
                               mr_kv_dtype_name(kv_dtype), &r, &e, false);
    if (!rc) {
        size_t n = (size_t)(ps->steps + 1) * (size_t)ps->n * (size_t)ps->V;
        *ref = malloc(n * sizeof(float));
        if (!*ref) {
            fprintf(stderr, "moerun serve: out of memory for the self-check\n");
            rc = 1;
        }
        rc = mr_cli_ep_agree("serve", "the self-check", rc); /* expert parallel: every rank runs it */
        if (!rc && mr_cli_probe_run(e, ps, false, *ref)) {
            mr_cli_fail("serve", "the self-check's reference run failed");
            rc = 1;
        }
    }
    mr_cli_probe_close(e);
    mr_resolution_free(r);
    return rc;
}

/* The resolved runner's half, through the engine that will serve: the same
 * prompts, the reference's tokens forced, the logits of every step. */
static int self_check_compare(mr_engine *e, const mr_exec *x, mr_cli_probe_set *ps, const float *ref) {
    mr_model *m = mr_engine_model(e);
    size_t n = (size_t)(ps->steps + 1) * (size_t)ps->n * (size_t)ps->V;
    float *got = calloc(n, sizeof(float));
    double *step_err = malloc((size_t)(ps->steps + 1) * sizeof(double));
    int rc = 1;
    if (mr_cli_ep_agree("serve", "the self-check", !got || !step_err ? 1 : 0)) {
        fprintf(stderr, "moerun serve: out of memory for the self-check\n");
    } else if (mr_cli_probe_run(e, ps, true, got)) {
        mr_cli_fail("serve", "the self-check's run of the resolved runner failed");
    } else if (mr_cli_ep_multi() && mr_ep_rank() > 0) {
        rc = 0; /* the comparison is rank 0's (it has the logits); its verdict is everyone's */
    } else {
        mr_cli_probe_cmp c = {.step_err = step_err};
        double tol = mr_cli_probe_default_tol(x->weight_format);
        mr_cli_probe_compare(ps, ref, got, tol, &c);
        char label[160];
        snprintf(label, sizeof label, "self-check: runner %s (%s) vs %s", mr_model_runner_name(m),
                 mr_act_mode_name(mr_model_act_mode(m)), mr_moe_runner_ground_truth()->name);
        bool pass = true;
        mr_cli_probe_print(stdout, label, ps, &c, tol, true, &pass);
        fflush(stdout);
        if (pass) {
            rc = 0;
        } else {
            fprintf(stderr,
                    "moerun serve: refusing to serve: the resolved runner %s disagrees with the %s runner on the "
                    "self-check's tokens (report above). Check `moerun probe --model DIR`; --skip-self-check "
                    "serves anyway.\n",
                    mr_model_runner_name(m), mr_moe_runner_ground_truth()->name);
        }
    }
    free(got);
    free(step_err);
    return rc;
}

static int opt_long(const char *flag, const char *v, long lo, long hi, long *out) {
    if (!mr_cli_parse_long(v, lo, hi, out)) return 0;
    fprintf(stderr, "moerun serve: %s: %s\n", flag, mr_error_last());
    return 1;
}

/* sglang's and vLLM's flags whose one value here is fixed: accepted with that value (*i past it), 0; another
 * value, or a flag of theirs that means nothing on this engine, is said, 1; -1: not such a flag. */
static int fixed_flag(const char *a, const char *v, int *i) {
    static const struct {
        const char *flag, *value, *why;
    } F[] = {
        {"--page-size", "16", "the KV cache's pages are 16 tokens"},
        {"--block-size", "16", "the KV cache's pages are 16 tokens"},
        {"--stream-interval", "1", "each token is streamed as it is made"},
        {"--mem-fraction-static", NULL, "a GPU memory fraction; the KV pool here is --kv-cache-memory"},
        {"--gpu-memory-utilization", NULL, "a GPU memory fraction; the KV pool here is --kv-cache-memory"},
    };
    for (size_t k = 0; k < sizeof F / sizeof F[0]; k++) {
        if (strcmp(a, F[k].flag)) continue;
        if (F[k].value && !strcmp(v, F[k].value)) {
            (*i)++;
            return 0;
        }
        fprintf(stderr, "moerun serve: %s %s: %s%s%s\n", a, v, F[k].why, F[k].value ? ": only " : "",
                F[k].value ? F[k].value : "");
        return 1;
    }
    return -1;
}

int mr_cmd_serve(int argc, char **argv) {
    mr_options o;
    if (mr_options_init(&o) != MR_OK) return 1;
    int rc = 2;
    mr_server_opts so;
    mr_server_opts_default(&so);
    long shutdown_timeout = 30;
    bool skip_check = false, no_prefix = false, priority = false, sgl_priority = false, sgl_low_first = false;
    const char *pos_model = NULL; /* a model folder given without --model */
    unsigned mutation = MR_MUT_NONE;
    mr_resolution *r = NULL;
    mr_model *m = NULL;
    mr_engine *eng = NULL;
    mr_server *srv = NULL;
    mr_cli_probe_set ps = {0};
    float *ref = NULL;
    /* sglang's and vLLM's names for resolver options: the step's token budget (--chunked-prefill-size,
     * --max-num-batched-tokens), the context (--max-model-len), the running set (--max-num-seqs) */
    static const char *const ALIAS[][2] = {{"--chunked-prefill-size", "--max-batch-tokens"},
                                           {"--max-num-batched-tokens", "--max-batch-tokens"},
                                           {"--max-model-len", "--context-length"},
                                           {"--max-num-seqs", "--max-running-requests"},
                                           {"--model-path", "--model"},
                                           {"--expert-parallel-size", "--ep-size"},
                                           {"--ep", "--ep-size"},
                                           {"--log-level", "--log"}};
    for (int i = 1; i < argc; i++)
        for (size_t k = 0; k < sizeof ALIAS / sizeof ALIAS[0]; k++)
            if (!strcmp(argv[i], ALIAS[k][0])) {
                argv[i] = (char *)ALIAS[k][1];
                /* sglang's and vLLM's log levels where moerun's have other names */
                if (!strcmp(ALIAS[k][0], "--log-level") && i + 1 < argc)
                    argv[i + 1] = !strcasecmp(argv[i + 1], "warning") ? "warn"
                                  : !strcasecmp(argv[i + 1], "critical") ? "error" : argv[i + 1];
            }
    if (mr_options_parse(&o, &argc, argv, true) != MR_OK) {
        mr_cli_fail("serve", NULL);
        goto out;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long x;
        int ff;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            rc = 0;
            goto out;
        } else if (!strcmp(a, "--skip-self-check")) {
            skip_check = true;
        } else if (!strcmp(a, "--log-requests")) {
            so.log_requests = true;
        } else if (!strcmp(a, "--tensor-parallel-size") || !strcmp(a, "--tp-size") || !strcmp(a, "--tp")) {
            if (!v || strcmp(v, "1")) { /* vLLM's / sglang's: one process here; the experts shard over MPI ranks */
                fprintf(stderr, "moerun serve: %s %s: moerun does not split layers by tensor parallelism; it shards the "
                        "experts over MPI ranks: mpirun -np N moerun serve ... --moe-a2a-backend mpi (README, "
                        "\"Expert parallelism\")\n", a, v ? v : "");
                goto out;
            }
            i++;
        } else if (!strcmp(a, "--enable-expert-parallel")) {
            /* vLLM's: the MoE layers' experts sharded over the ranks; here the MPI ranks (mpirun -np N) */
            if (mr_options_is_explicit(&o, MR_OPT_MOE_A2A_BACKEND) &&
                strcmp(mr_options_get(&o, MR_OPT_MOE_A2A_BACKEND), "mpi")) {
                fprintf(stderr, "moerun serve: --enable-expert-parallel shards the experts over MPI ranks, and "
                        "--moe-a2a-backend says %s\n", mr_options_get(&o, MR_OPT_MOE_A2A_BACKEND));
                goto out;
            }
            if (mr_options_set(&o, "moe_a2a_backend", "mpi", MR_SRC_FLAG)) {
                mr_cli_fail("serve", NULL);
                goto out;
            }
        } else if (!strcmp(a, "--all2all-backend") || !strcmp(a, "--enable-dp-attention") ||
                   !strcmp(a, "--data-parallel-size") || !strcmp(a, "--dp-size") || !strcmp(a, "--dp")) {
            /* vLLM's GPU all-to-all kernels, sglang's and vLLM's data-parallel attention: not here */
            const bool a2a = !strcmp(a, "--all2all-backend"), flag = !strcmp(a, "--enable-dp-attention");
            if (!flag && !a2a && v && !strcmp(v, "1")) {
                i++;
                continue;
            }
            fprintf(stderr, "moerun serve: %s%s%s: %s\n", a, flag || !v ? "" : " ", flag || !v ? "" : v,
                    a2a ? "a GPU all-to-all kernel; the experts' exchange here is MPI: mpirun -np N moerun serve ... "
                          "--enable-expert-parallel (or --moe-a2a-backend mpi)"
                        : "attention runs replicated on every rank (one data-parallel group); the experts shard "
                          "over MPI ranks: mpirun -np N moerun serve ... --moe-a2a-backend mpi");
            goto out;
        } else if ((!strcmp(a, "--scheduling-policy") || !strcmp(a, "--schedule-policy")) && v) {
            /* vLLM's (sglang's name): fcfs, or priority (the requests' priority, lower first, as vLLM orders) */
            if (strcmp(v, "fcfs") && strcmp(v, "priority")) {
                fprintf(stderr, "moerun serve: %s %s: fcfs (first come, first served) or priority (each request's "
                        "priority, lower first, then arrival)\n", a, v);
                goto out;
            }
            priority = !strcmp(v, "priority");
            i++;
        } else if (!strcmp(a, "--enable-priority-scheduling")) { /* sglang's: with its low-values-first order only */
            sgl_priority = true;
        } else if (!strcmp(a, "--schedule-low-priority-values-first")) {
            sgl_low_first = true;
        } else if (!strcmp(a, "--disable-radix-cache") || !strcmp(a, "--no-enable-prefix-caching")) {
            no_prefix = true; /* sglang's, vLLM's: every prompt computed in full, nothing kept for the next */
        } else if (!strcmp(a, "--enable-prefix-caching")) {
            no_prefix = false; /* vLLM's: on already */
        } else if (!strcmp(a, "--enable-metrics") || !strcmp(a, "--disable-log-requests") ||
                   !strcmp(a, "--disable-log-stats")) {
            /* sglang's, vLLM's: /metrics is always served; no request is logged unless --log-requests */
        } else if (v && (ff = fixed_flag(a, v, &i)) >= 0) {
            if (ff) goto out; /* a value of theirs that is not how moerun runs: said */
        } else if (!strcmp(a, "--enable-auto-tool-choice") || !strcmp(a, "--trust-remote-code")) {
            /* vLLM's and sglang's: tool_choice "auto" is always served, and no code from a checkpoint ever runs */
        } else if (!strcmp(a, "--enable-return-routed-experts")) { /* sglang's */
            so.return_routed_experts = true;
        } else if (!strcmp(a, "--debug-forced-output")) { /* tests only: requests may dictate their output */
            so.debug_forced_output = true;
        } else if (!strcmp(a, "--debug-slow-stream")) { /* tests only: the event loop lags behind the engine */
            so.debug_slow_stream = true;
        } else if (!strcmp(a, "--debug-step-delay-ms")) { /* tests only: slow steps, so that requests run long */
            if (opt_long(a, argv[++i], 1, 1000, &x)) goto out;
            so.debug_step_delay_ms = (int)x;
        } else if (!v && a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "moerun serve: %s: unknown option or missing value (see --help)\n", a);
            goto out;
        } else if (!strcmp(a, "--host")) {
            so.host = argv[++i];
        } else if (!strcmp(a, "--port")) {
            if (opt_long(a, argv[++i], 0, 65535, &x)) goto out;
            so.port = (int)x;
        } else if (!strcmp(a, "--served-model-name")) {
            so.served_model_name = argv[++i];
            if (!*so.served_model_name) {
                fprintf(stderr, "moerun serve: --served-model-name is empty: give the id clients send, or leave the "
                                "flag out for the model folder's name\n");
                goto out;
            }
        } else if (!strcmp(a, "--weight-version")) {
            so.weight_version = argv[++i];
            const size_t n = strlen(so.weight_version);
            if (!n || n > 128) {
                fprintf(stderr, "moerun serve: --weight-version takes 1 to 128 bytes, got %zu\n", n);
                goto out;
            }
        } else if (!strcmp(a, "--chat-template")) {
            so.chat_template = argv[++i];
        } else if (!strcmp(a, "--reasoning-parser") || !strcmp(a, "--tool-call-parser")) {
            const bool rp = !strcmp(a, "--reasoning-parser");
            const char *name = argv[++i];
            if (rp ? !mr_server_reasoning_parser_known(name) : !mr_server_tool_call_parser_known(name)) {
                fprintf(stderr, "moerun serve: %s %s: not a parser served here (%s)\n", a, name,
                        rp ? "minimax_m2 or minimax: reasoning_content apart; minimax_m2_append_think or "
                             "minimax-append-think: kept in content"
                           : "minimax_m2 or minimax-m2");
                goto out;
            }
            *(rp ? &so.reasoning_parser : &so.tool_call_parser) = name;
        } else if (!strcmp(a, "--api-key")) {
            so.api_key = argv[++i];
            if (!*so.api_key) { /* --api-key "$KEY" with KEY unset would otherwise serve everyone */
                fprintf(stderr, "moerun serve: --api-key is empty: give a key, or leave the flag out to serve "
                                "without one\n");
                goto out;
            }
        } else if (!strcmp(a, "--allowed-origins")) { /* vLLM's: "*", a comma list or a JSON list; "" none */
            so.allowed_origins = argv[++i];
        } else if (!strcmp(a, "--response-store-mb")) {
            if (opt_long(a, argv[++i], 0, 1 << 20, &x)) goto out;
            so.response_store_bytes = (size_t)x << 20;
        } else if (!strcmp(a, "--conversation-store-mb")) {
            if (opt_long(a, argv[++i], 0, 1 << 20, &x)) goto out;
            so.conversation_store_bytes = (size_t)x << 20;
        } else if (!strcmp(a, "--max-queued-requests")) {
            if (opt_long(a, argv[++i], 0, 1 << 20, &x)) goto out;
            so.max_queued_requests = (int)x;
        } else if (!strcmp(a, "--max-prompt-tokens")) {
            if (opt_long(a, argv[++i], 1, 1 << 24, &x)) goto out;
            so.max_prompt_tokens = x;
        } else if (!strcmp(a, "--max-completion-tokens")) {
            if (opt_long(a, argv[++i], 1, 1 << 24, &x)) goto out;
            so.max_completion_tokens = x;
        } else if (!strcmp(a, "--max-choices")) {
            if (opt_long(a, argv[++i], 1, 4096, &x)) goto out;
            so.max_choices = (int)x;
        } else if (!strcmp(a, "--max-body-bytes")) {
            if (opt_long(a, argv[++i], 64, 1L << 32, &x)) goto out;
            so.max_body_bytes = (size_t)x;
        } else if (!strcmp(a, "--header-timeout")) {
            if (opt_long(a, argv[++i], 1, 86400, &x)) goto out;
            so.header_timeout_s = (int)x;
        } else if (!strcmp(a, "--body-timeout")) {
            if (opt_long(a, argv[++i], 1, 86400, &x)) goto out;
            so.body_timeout_s = (int)x;
        } else if (!strcmp(a, "--idle-timeout")) {
            if (opt_long(a, argv[++i], 1, 86400, &x)) goto out;
            so.idle_timeout_s = (int)x;
        } else if (!strcmp(a, "--max-connections")) {
            if (opt_long(a, argv[++i], 1, 65536, &x)) goto out;
            so.max_connections = (int)x;
        } else if (!strcmp(a, "--threads-http")) {
            if (opt_long(a, argv[++i], 1, 64, &x)) goto out;
            so.http_threads = (int)x;
        } else if (!strcmp(a, "--shutdown-timeout")) {
            if (opt_long(a, argv[++i], 0, 86400, &shutdown_timeout)) goto out;
        } else if (!strcmp(a, "--debug-mutation")) { /* tests only: break the resolved runner on purpose */
            const char *mv = argv[++i];
            if (!strcmp(mv, "swap-gate-up")) mutation = MR_MUT_SWAP_GATE_UP;
            else if (!strcmp(mv, "fused-no-renorm")) mutation = MR_MUT_FUSED_NO_RENORM;
            else {
                fprintf(stderr, "moerun serve: --debug-mutation: '%s' is not swap-gate-up or fused-no-renorm\n", mv);
                goto out;
            }
        } else if (a[0] != '-' && !pos_model) {
            pos_model = a; /* vLLM's `vllm serve MODEL` */
        } else {
            fprintf(stderr, "moerun serve: unknown argument '%s' (see --help)\n", a);
            goto out;
        }
    }
    if (sgl_priority && !sgl_low_first) {
        fprintf(stderr, "moerun serve: --enable-priority-scheduling: moerun runs lower priority values first (vLLM's "
                "order; sglang's default is the reverse): add --schedule-low-priority-values-first to say so\n");
        goto out;
    }
    priority |= sgl_priority;
    if (pos_model) {
        if (mr_options_is_explicit(&o, MR_OPT_MODEL) && o.source[MR_OPT_MODEL] == MR_SRC_FLAG) {
            fprintf(stderr, "moerun serve: '%s' beside --model %s: one model (an argument without a flag is "
                    "vLLM's form of --model)\n", pos_model, mr_options_get(&o, MR_OPT_MODEL));
            goto out;
        }
        if (mr_options_set(&o, "model", pos_model, MR_SRC_FLAG)) {
            mr_cli_fail("serve", NULL);
            goto out;
        }
    }
    const char *dir = mr_options_get(&o, MR_OPT_MODEL);
    if (!dir[0]) {
        fprintf(stderr, "moerun serve: --model DIR is required (see --help)\n");
        goto out;
    }
    so.model_dir = dir;
    int64_t ctx = mr_options_get_int(&o, MR_OPT_CONTEXT_LENGTH);
    if (ctx > 0 && (so.max_prompt_tokens >= ctx || so.max_completion_tokens >= ctx)) {
        fprintf(stderr, "moerun serve: %s %lld must be below --context-length %lld\n",
                so.max_prompt_tokens >= ctx ? "--max-prompt-tokens" : "--max-completion-tokens",
                (long long)(so.max_prompt_tokens >= ctx ? so.max_prompt_tokens : so.max_completion_tokens), (long long)ctx);
        goto out;
    }

    /* expert parallel: rank 0 serves HTTP and schedules; the others run its steps */
    const bool follower = mr_cli_ep_multi() && mr_ep_rank() > 0;
    /* signals: one thread takes them all (a follower keeps the launcher's: mpirun ends the job) */
    static sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    signal(SIGPIPE, SIG_IGN);
    if (!follower) {
        pthread_sigmask(SIG_BLOCK, &set, NULL);
        pthread_t st;
        if (pthread_create(&st, NULL, signal_thread, &set)) {
            fprintf(stderr, "moerun serve: cannot start the signal thread\n");
            rc = 1;
            goto out;
        }
        pthread_detach(st);
    }

    /* listen first: /health says 503 while the model loads */
    rc = 1;
    int lrc = 0;
    if (!follower && (mr_server_open(&so, &srv) || mr_server_start(srv))) {
        mr_cli_fail("serve", NULL);
        lrc = 1;
    }
    if ((rc = mr_cli_ep_agree("serve", "listening", lrc))) goto out;
    /* an IPv6 literal goes in brackets in a URL (RFC 3986), so that the printed address works as given */
    const bool v6 = strchr(so.host, ':') != NULL;
    const char *lb = v6 ? "[" : "", *rb = v6 ? "]" : "";
    if (!follower) printf("moerun serve: listening on http://%s%s%s:%d (loading)\n", lb, so.host, rb, mr_server_port(srv));
    fflush(stdout);

    /* 1. resolve, before any weight is read (every rank; they agree) */
    rc = 2;
    if (mr_cli_ep_agree("serve", "resolution", mr_cli_resolve("serve", &o, false, &r) ? 2 : 0)) goto out;
    rc = 1;
    const mr_exec *x = mr_resolution_exec(r);
    /* 2. the self-check's reference half */
    if (!skip_check) {
        mr_model_desc d;
        memset(&d, 0, sizeof d);
        if (mr_model_desc_load(dir, &d)) {
            mr_cli_fail("serve", "cannot read the model description");
            goto out;
        }
        int64_t V = d.vocab;
        mr_model_desc_free(&d);
        if (mr_cli_probe_set_make(&ps, 2, 4, 1, V)) {
            fprintf(stderr, "moerun serve: out of memory\n");
            goto out;
        }
        int e = self_check_reference(&o, dir, x->kv_dtype, &ps, &ref);
        if (e) {
            rc = e;
            goto out;
        }
    }
    /* 3. load with the resolved runner */
    if (mr_exec_apply(x)) {
        mr_cli_fail("serve", "cannot apply the resolution");
        goto out;
    }
    if (mutation) mr_moe_debug_mutation(mutation);
    mr_engine_opts eo;
    mr_engine_opts_from_exec(x, &eo);
    eo.no_prefix_caching = no_prefix;
    eo.priority_scheduling = priority;
    /* the server admits at most running + queued sequences, so the engine's own queue never refuses */
    eo.max_queued_requests = eo.max_running_requests + so.max_queued_requests;
    if (so.max_prompt_tokens >= eo.context_length || so.max_completion_tokens >= eo.context_length) {
        fprintf(stderr, "moerun serve: --max-prompt-tokens and --max-completion-tokens must be below the context length %lld\n",
                (long long)eo.context_length);
        rc = 2;
        goto out;
    }
    /* expert parallel: the same configuration on every rank, the smallest engine limits */
    if ((rc = mr_cli_ep_check_exec("serve", x, &eo))) goto out;
    rc = 1;
    mr_model_opts mo = {.exec = x, .progress = !follower};
    mr_engine_model_opts(&eo, &mo);
    uint64_t t0 = mr_now_ns();
    int orc = 0;
    if (mr_model_open(dir, &mo, &m)) {
        mr_cli_fail("serve", "cannot load the model");
        orc = 1;
    } else if (mr_engine_new(m, &eo, &eng)) {
        mr_cli_fail("serve", "cannot start the engine");
        orc = 1;
    }
    if (mr_cli_ep_loaded("serve", orc, m)) goto out; /* every rank loaded its experts */
    const mr_model_config *c = mr_model_config_of(m);
    printf("loaded: %lld layers, %lld experts top-%lld, vocab %lld, runner %s (%s), kernels %s, %.2f s, peak RSS %.1f MiB\n",
           (long long)c->n_layers, (long long)c->n_experts, (long long)c->top_k, (long long)c->vocab,
           mr_model_runner_name(m), mr_act_mode_name(mr_model_act_mode(m)), mr_kernels_get()->isa,
           (double)(mr_now_ns() - t0) * 1e-9, (double)mr_model_peak_rss(m) / (1024.0 * 1024.0));
    /* 4. the self-check's comparison, through the engine that will serve (rank 0's verdict) */
    if (!skip_check && mr_cli_ep_agree("serve", "the self-check", self_check_compare(eng, x, &ps, ref))) goto out;
    if (skip_check) printf("self-check: skipped (--skip-self-check)\n");
    if (follower) { /* run rank 0's steps until it stops */
        rc = 0;
        if (mr_engine_follow(eng)) {
            mr_cli_fail("serve", "expert-parallel step failed");
            rc = 1;
        }
        goto out;
    }
    /* 5. open for work: the server owns the engine from here on. Loading and the self-check ran
     * parallel regions on this thread, whose pool of OpenMP workers would outlive them: with more
     * workers than cores libgomp stops spinning between regions, and the engine thread's every
     * region would then wake its workers from a futex (tiny-kjv at C = 1: ~20% of a step). */
    omp_pause_resource_all(omp_pause_soft);
    mr_status ast = mr_server_attach(srv, eng);
    eng = NULL;
    char *rj = ast ? NULL : mr_resolution_json(r);
    if (!ast && (!rj || mr_server_set_resolution(srv, rj))) ast = MR_ENOMEM;
    mr_free(rj);
    if (ast || mr_server_set_ready(srv)) {
        mr_cli_fail("serve", NULL);
        goto out;
    }
    pthread_mutex_lock(&sig_mu);
    sig_ready = true;
    int early = sig_count;
    pthread_mutex_unlock(&sig_mu);
    printf("moerun serve: ready on http://%s%s%s:%d, model '%s' (%d running + %d queued sequences, context %lld, "
           "%lld KV blocks of %d tokens in %s, %lld tokens per step%s%s)\n",
           lb, so.host, rb, mr_server_port(srv), mr_server_model_name(srv), eo.max_running_requests, so.max_queued_requests,
           (long long)eo.context_length, (long long)eo.kv_blocks, MR_KV_BLOCK_TOKENS, mr_kv_dtype_name(eo.kv_dtype),
           (long long)eo.max_batch_tokens, eo.no_prefix_caching ? ", prefix cache off" : "",
           eo.priority_scheduling ? ", by priority" : "");
    fflush(stdout);
    /* 6. serve until a signal, or until the engine cannot run any more (an expert-parallel rank failed) */
    const char *failure = NULL;
    pthread_mutex_lock(&sig_mu);
    while (sig_count == 0 && !early && !(failure = mr_server_failure(srv))) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&sig_cv, &sig_mu, &ts);
    }
    pthread_mutex_unlock(&sig_mu);
    if (failure) { /* every request now gets 503; stop */
        fprintf(stderr, "moerun %s: stopping: %s\n", mr_cli_who("serve"), failure);
        mr_server_drain(srv, 1.0);
        rc = 1;
        goto out;
    }
    printf("moerun serve: draining (up to %ld s; a second signal exits at once)\n", shutdown_timeout);
    fflush(stdout);
    int left = mr_server_drain(srv, (double)shutdown_timeout);
    if (left) printf("moerun serve: %d sequence%s still running at the timeout were cancelled\n", left, left == 1 ? "" : "s");
    printf("moerun serve: stopped\n");
    fflush(stdout);
    rc = 0;
out:
    mr_server_close(srv); /* its engine thread tells the other expert-parallel ranks to stop */
    mr_engine_free(eng);
    mr_model_close(m);
    mr_resolution_free(r);
    mr_cli_probe_set_free(&ps);
    free(ref);
    mr_options_free(&o);
    return rc;
}
