/* cmd_generate.c — `moerun generate`: resolves first, loads the model and
 * its engine, admits every prompt (token ids) as a request and steps the
 * engine (continuous batching: prefill chunks and decodes mixed within the
 * step budget, paged KV, prefix caching, preemption) until all are done;
 * prints the generated ids in prompt order and the prefill / decode
 * throughput; --stats adds the time split (attention, MoE, other, scheduling,
 * sampling) and the KV pool, prefix-cache and preemption counters. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_ep.h"
#include "cli_model.h"
#include "cli_text.h"
#include "moerun/config.h"
#include "moerun/engine.h"
#include "moerun/kernels.h"
#include "moerun/model.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: moerun generate --model DIR (--prompt TEXT [--chat [--system S]] | --prompt-ids 1,2,3 |\n"
            "                       --batch FILE) [-n N]\n"
            "                       [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--seed S]\n"
            "                       [--repetition-penalty R] [--presence-penalty P] [--frequency-penalty F]\n"
            "                       [--ignore-eos] [--stats] [--explain] [resolver options]\n\n"
            "Generates token ids through the engine (continuous batching over a paged KV cache).\n"
            "Resolution runs first and its one-line summary is printed.\n"
            "  --prompt TEXT    one prompt as text (the model's tokenizer.json); the generated text is\n"
            "                   printed as the tokens arrive, after the prompt\n"
            "  --chat           TEXT is a user message: the model's chat template renders the conversation\n"
            "                   (with --system S as the system message) and the answer is printed raw,\n"
            "                   reasoning included\n"
            "  --prompt-ids L   one prompt: comma-separated token ids\n"
            "  --batch FILE     several prompts, one comma list of ids per line, all admitted at once and\n"
            "                   scheduled together (--max-running-requests, --max-batch-tokens and\n"
            "                   --kv-cache-memory below bound the batch, the step and the KV pool)\n"
            "  -n N             tokens to generate per prompt (default 16); stops early at an EOS id\n"
            "  --temperature T  0 (default) is greedy; then --top-k, --top-p, --min-p filter\n"
            "  --seed S         sampler seed of every request (default 0)\n"
            "  --ignore-eos     generate all N tokens even past an EOS id\n"
            "  --stats          time split (attention / MoE / other / scheduling / sampling), throughput,\n"
            "                   KV blocks used, prefix-cache hits and preemptions\n"
            "  --explain        print the resolution story before running\n\n");
    mr_options_print_help(f);
}

/* Model time of the steps, split by what they held. */
typedef struct {
    mr_model_timing t;
    double wall_s;
    int64_t tokens, steps;
} phase;

static void phase_add(phase *p, const mr_model_timing *a, const mr_model_timing *b, double dt, int64_t tokens) {
    p->t.attention_ns += b->attention_ns - a->attention_ns;
    p->t.moe_ns += b->moe_ns - a->moe_ns;
    p->t.other_ns += b->other_ns - a->other_ns;
    p->wall_s += dt;
    p->tokens += tokens;
    p->steps++;
}

static void print_split(const char *label, const phase *p) {
    double s = (double)(p->t.attention_ns + p->t.moe_ns + p->t.other_ns);
    if (s <= 0) s = 1;
    printf("stats %s attention %.1f%% (%.3f s), moe %.1f%% (%.3f s), other %.1f%% (%.3f s); %lld steps\n", label,
           100.0 * (double)p->t.attention_ns / s, (double)p->t.attention_ns * 1e-9, 100.0 * (double)p->t.moe_ns / s,
           (double)p->t.moe_ns * 1e-9, 100.0 * (double)p->t.other_ns / s, (double)p->t.other_ns * 1e-9,
           (long long)p->steps);
}

int mr_cmd_generate(int argc, char **argv) {
    const char *cmd = "generate";
    mr_options o;
    if (mr_options_init(&o) != MR_OK) return 1;
    int rc = 2;
    mr_resolution *r = NULL;
    mr_model *m = NULL;
    mr_engine *e = NULL;
    mr_cli_prompts pr = {0};
    int32_t **out_ids = NULL; /* [B] each grown as tokens arrive */
    int64_t *n_gen = NULL, *cap_gen = NULL;
    mr_finish_reason *fin = NULL;
    mr_sampling sp = {.top_p = 1.0f};
    long n_new = 16;
    bool stats = false, explain = false, ignore_eos = false;
    const char *prompt_ids = NULL, *batch_file = NULL, *flag = cmd, *prompt_text = NULL, *system = NULL;
    bool chat = false;
    mr_tokenizer *tok = NULL;
    mr_chat *tmpl = NULL;
    mr_tokstream *tstream = NULL;

    if (mr_options_parse(&o, &argc, argv, true) != MR_OK) {
        mr_cli_fail(cmd, NULL);
        goto out;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        flag = a;
        int sf = mr_cli_sampling_flag(argc, argv, &i, MR_CLI_SAMPLING_ALL, &sp);
        if (sf == MR_CLI_FLAG_BAD) goto bad;
        if (sf == MR_CLI_FLAG_NO_VALUE) {
            fprintf(stderr, "moerun generate: %s needs a value\n", a);
            goto out;
        }
        if (sf == MR_CLI_FLAG_TAKEN) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            rc = 0;
            goto out;
        } else if (!strcmp(a, "--stats")) {
            stats = true;
        } else if (!strcmp(a, "--explain")) {
            explain = true;
        } else if (!strcmp(a, "--ignore-eos")) {
            ignore_eos = true;
        } else if (!strcmp(a, "--chat")) {
            chat = true;
        } else if (v && !strcmp(a, "--prompt")) {
            prompt_text = argv[++i];
        } else if (v && !strcmp(a, "--system")) {
            system = argv[++i];
        } else if (v && !strcmp(a, "--prompt-ids")) {
            prompt_ids = argv[++i];
        } else if (v && !strcmp(a, "--batch")) {
            batch_file = argv[++i];
        } else if (v && (!strcmp(a, "-n") || !strcmp(a, "--max-tokens"))) {
            if (mr_cli_parse_long(argv[++i], 0, 1 << 20, &n_new)) goto bad;
        } else if (!v && (!strcmp(a, "--prompt-ids") || !strcmp(a, "--prompt") || !strcmp(a, "--system") ||
                          !strcmp(a, "--batch") || !strcmp(a, "-n") || !strcmp(a, "--max-tokens"))) {
            fprintf(stderr, "moerun generate: %s needs a value\n", a);
            goto out;
        } else {
            fprintf(stderr, "moerun generate: unknown argument '%s' (see --help)\n", a);
            goto out;
        }
    }
    if (!mr_options_get(&o, MR_OPT_MODEL)[0]) {
        fprintf(stderr, "moerun generate: --model DIR is required (see --help)\n");
        goto out;
    }
    if ((prompt_text != NULL) + (prompt_ids != NULL) + (batch_file != NULL) != 1) {
        fprintf(stderr, "moerun generate: give exactly one of --prompt, --prompt-ids and --batch\n");
        goto out;
    }
    if ((chat || system) && !prompt_text) {
        fprintf(stderr, "moerun generate: %s goes with --prompt TEXT\n", chat ? "--chat" : "--system");
        goto out;
    }
    if (system && !chat) {
        fprintf(stderr, "moerun generate: --system needs --chat\n");
        goto out;
    }
    if (prompt_text) {
        /* text: the model's tokenizer (and chat template), before any weight is read */
        const char *dir = mr_options_get(&o, MR_OPT_MODEL);
        if ((rc = mr_cli_text_open(cmd, dir, chat, &tok, &tmpl)) != 0) goto out;
        rc = 2;
        mr_tok_ids ids = {0};
        int e2 = chat ? mr_cli_chat_encode(cmd, tok, tmpl, system, prompt_text, &ids)
                      : mr_cli_text_encode(cmd, tok, prompt_text, &ids);
        if (e2) {
            mr_tok_ids_free(&ids);
            rc = e2;
            goto out;
        }
        if (mr_cli_prompts_from_ids(&ids, &pr)) {
            mr_tok_ids_free(&ids);
            rc = 1;
            goto out;
        }
        if (mr_tokstream_new(tok, true, &tstream)) {
            mr_cli_fail(cmd, "cannot decode");
            rc = 1;
            goto out;
        }
    } else if (mr_cli_prompts_read(prompt_ids, batch_file, &pr)) {
        mr_cli_fail(cmd, "bad prompt");
        goto out;
    }
    /* 1. resolve, before any weight is read (every rank of an expert-parallel run, then they agree) */
    if (mr_cli_ep_agree(cmd, "resolution", mr_cli_resolve(cmd, &o, explain, &r) ? 2 : 0)) goto out;
    const mr_exec *x = mr_resolution_exec(r);
    /* 2. load the model and its engine */
    rc = 1;
    uint64_t t0 = mr_now_ns();
    if (mr_cli_engine_open(cmd, mr_options_get(&o, MR_OPT_MODEL), x, true, pr.n, &m, &e)) goto out;
    const mr_model_config *c = mr_model_config_of(m);
    printf("loaded: %lld layers, %lld experts top-%lld, runner %s (%s), kernels %s, %.2f s, peak RSS %.1f MiB\n",
           (long long)c->n_layers, (long long)c->n_experts, (long long)c->top_k, mr_model_runner_name(m),
           mr_act_mode_name(mr_model_act_mode(m)), mr_kernels_get()->isa, (double)(mr_now_ns() - t0) * 1e-9,
           (double)mr_model_peak_rss(m) / (1024.0 * 1024.0));
    if (stats) mr_cli_print_kv(e);
    if (stats) mr_cli_print_memory(m);
    if (mr_cli_ep_multi() && mr_ep_rank() > 0) { /* rank 0 schedules and samples; this rank runs its steps */
        rc = 0;
        if (mr_engine_follow(e)) {
            mr_cli_fail(cmd, "expert-parallel step failed");
            rc = 1;
        }
        goto out;
    }
    int B = pr.n;
    out_ids = calloc((size_t)B, sizeof(int32_t *));
    n_gen = calloc((size_t)B, sizeof(int64_t));
    cap_gen = calloc((size_t)B, sizeof(int64_t));
    fin = calloc((size_t)B, sizeof(mr_finish_reason));
    if (!out_ids || !n_gen || !cap_gen || !fin) {
        fprintf(stderr, "moerun generate: out of memory\n");
        goto out;
    }
    /* 3. every prompt is a request (refused ones: the reason, exit 2, nothing run) */
    for (int i = 0; i < B && n_new > 0; i++) {
        mr_request_params rp = {.prompt = pr.ids + pr.off[i], .n_prompt = pr.len[i], .max_tokens = n_new,
                                .sampling = sp, .ignore_eos = ignore_eos, .user = (void *)(intptr_t)i};
        mr_req_id id;
        mr_status st = mr_engine_add(e, &rp, &id);
        if (st) {
            fprintf(stderr, "moerun generate: prompt %d: %s\n", i, mr_error_last());
            rc = st == MR_ENOMEM ? 1 : 2;
            goto out;
        }
    }
    /* 4. the engine loop: one step at a time until every request has finished */
    if (tstream && !chat) { /* the prompt, then the generated text streams after it */
        fputs(prompt_text, stdout);
        fflush(stdout);
    }
    mr_model_timing_reset(m);
    phase prefill = {0}, decode = {0};
    uint64_t tstart = mr_now_ns();
    while (mr_engine_has_work(e)) {
        mr_model_timing ta, tb;
        mr_model_timing_get(m, &ta);
        uint64_t ts = mr_now_ns();
        const mr_engine_step_out *so;
        if (mr_engine_step(e, &so)) {
            mr_cli_fail(cmd, "engine step failed");
            goto out;
        }
        mr_model_timing_get(m, &tb);
        double dt = (double)(mr_now_ns() - ts) * 1e-9;
        if (so->n_prefill_tokens > 0)
            phase_add(&prefill, &ta, &tb, dt, so->n_prefill_tokens);
        else if (so->n_seq > 0)
            phase_add(&decode, &ta, &tb, dt, so->n_decode_tokens);
        for (int k = 0; k < so->n_events; k++) {
            const mr_engine_event *v = &so->events[k];
            int i = (int)(intptr_t)v->user;
            if (v->n_tokens == 1) {
                if (n_gen[i] == cap_gen[i]) {
                    int64_t nc = cap_gen[i] ? 2 * cap_gen[i] : 16;
                    int32_t *g = realloc(out_ids[i], (size_t)nc * sizeof(int32_t));
                    if (!g) {
                        fprintf(stderr, "moerun generate: out of memory\n");
                        goto out;
                    }
                    out_ids[i] = g;
                    cap_gen[i] = nc;
                }
                out_ids[i][n_gen[i]++] = v->token;
                if (tstream && mr_cli_stream_token(cmd, tstream, v->token)) goto out;
            }
            if (v->finish != MR_FINISH_NONE) fin[i] = v->finish;
            if (v->finish == MR_FINISH_ERROR) {
                fprintf(stderr, "moerun generate: prompt %d: %s\n", i, v->error ? v->error : "failed");
                rc = 1;
            }
        }
    }
    double total_s = (double)(mr_now_ns() - tstart) * 1e-9;
    if (tstream) {
        if (mr_cli_stream_end(cmd, tstream)) goto out;
        printf("%s\n", fin[0] == MR_FINISH_STOP ? "" : fin[0] == MR_FINISH_ERROR ? " <error>" : " ...");
    }
    for (int i = 0; i < B && !tstream; i++) {
        printf("[%d]", i);
        for (int64_t j = 0; j < n_gen[i]; j++) printf(" %d", out_ids[i][j]);
        printf("%s\n", fin[i] == MR_FINISH_STOP ? " <eos>" : fin[i] == MR_FINISH_ERROR ? " <error>" : "");
    }
    mr_engine_stats es;
    mr_engine_stats_get(e, &es);
    printf("prefill: %lld tokens in %.3f s (%.1f tok/s); decode: %lld tokens in %.3f s (%.1f tok/s)\n",
           (long long)prefill.tokens, prefill.wall_s, prefill.wall_s > 0 ? (double)prefill.tokens / prefill.wall_s : 0.0,
           (long long)decode.tokens, decode.wall_s, decode.wall_s > 0 ? (double)decode.tokens / decode.wall_s : 0.0);
    if (stats) {
        print_split("prefill:", &prefill);
        print_split("decode: ", &decode);
        double all = total_s > 0 ? total_s * 1e9 : 1;
        printf("stats engine:  %llu steps in %.3f s (%llu on one thread, step_threads=%s); scheduling %.2f%% "
               "(%.3f ms), sampling %.2f%% (%.3f ms), completion %.2f%% (%.3f ms)\n",
               (unsigned long long)es.steps, total_s, (unsigned long long)es.steps_one_thread,
               mr_engine_opts_of(e)->fixed_threads ? "fixed" : "adaptive", 100.0 * (double)es.schedule_ns / all,
               (double)es.schedule_ns * 1e-6, 100.0 * (double)es.sample_ns / all, (double)es.sample_ns * 1e-6,
               100.0 * (double)es.complete_ns / all, (double)es.complete_ns * 1e-6);
        printf("stats kv:      %lld of %lld blocks used at the peak (%.1f%%), %lld cached at the end; prefix cache %llu "
               "of %llu tokens hit (%llu blocks shared), %llu evictions; %llu preemptions; %llu tokens computed for "
               "%llu prompt + %llu generated\n",
               (long long)es.kv_blocks_peak, (long long)es.kv_blocks_total,
               100.0 * (double)es.kv_blocks_peak / (double)es.kv_blocks_total, (long long)es.kv_blocks_cached,
               (unsigned long long)es.prefix_hits, (unsigned long long)es.prefix_queries,
               (unsigned long long)es.prefix_hit_blocks, (unsigned long long)es.evictions,
               (unsigned long long)es.preemptions, (unsigned long long)es.computed_tokens,
               (unsigned long long)es.prompt_tokens, (unsigned long long)es.generation_tokens);
    }
    if (stats) mr_cli_print_memory(m); /* steady: after the run */
    if (es.requests_finished[MR_FINISH_ERROR] > 0) goto out; /* a request failed: exit 1 */
    rc = 0;
    goto out;
bad:
    fprintf(stderr, "moerun generate: %s: %s\n", flag, mr_error_last());
    rc = 2;
out:
    for (int i = 0; out_ids && i < pr.n; i++) free(out_ids[i]);
    free(out_ids);
    free(n_gen);
    free(cap_gen);
    free(fin);
    mr_engine_ep_stop(e); /* the other ranks of an expert-parallel run return from mr_engine_follow */
    mr_engine_free(e);
    mr_model_close(m);
    mr_tokstream_free(tstream);
    mr_chat_free(tmpl);
    mr_tokenizer_free(tok);
    mr_cli_prompts_free(&pr);
    mr_resolution_free(r);
    mr_options_free(&o);
    return rc;
}
