/* cmd_generate.c — `moerun generate`: resolves first, loads the model, runs
 * a batch of prompts (token ids) through prefill and decode, prints the
 * generated ids and the prefill / decode throughput; --stats adds the time
 * split (attention, MoE, other). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "cli.h"
#include "cli_model.h"
#include "moerun/config.h"
#include "moerun/kernels.h"
#include "moerun/model.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: moerun generate --model DIR (--prompt-ids 1,2,3 | --batch FILE) [-n N]\n"
            "                       [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--seed S]\n"
            "                       [--stats] [--explain] [resolver options]\n\n"
            "Generates token ids. Resolution runs first and its one-line summary is printed.\n"
            "  --prompt-ids L   one prompt: comma-separated token ids\n"
            "  --batch FILE     several prompts, one comma list of ids per line (run as one batch)\n"
            "  -n N             tokens to generate per prompt (default 16); stops early at an EOS id\n"
            "  --temperature T  0 (default) is greedy; then --top-k, --top-p, --min-p filter\n"
            "  --seed S         sampler seed (default 0)\n"
            "  --stats          time split (attention / MoE / other) and throughput\n"
            "  --explain        print the resolution story before running\n\n");
    mr_options_print_help(f);
}

int mr_cmd_generate(int argc, char **argv) {
    const char *cmd = "generate";
    mr_options o;
    if (mr_options_init(&o) != MR_OK) return 1;
    int rc = 2;
    mr_resolution *r = NULL;
    mr_model *m = NULL;
    mr_cli_prompts pr = {0};
    float *logits = NULL;
    int32_t *out_ids = NULL, *next = NULL;
    int64_t *n_gen = NULL, *n_tok = NULL;
    int *seq = NULL;
    bool *done = NULL;
    mr_sampler smp = {0};
    mr_sampler_params sp = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 0};
    long n_new = 16;
    bool stats = false, explain = false;
    const char *prompt_ids = NULL, *batch_file = NULL, *flag = cmd;

    if (mr_options_parse(&o, &argc, argv, true) != MR_OK) {
        mr_cli_fail(cmd, NULL);
        goto out;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        flag = a;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            rc = 0;
            goto out;
        } else if (!strcmp(a, "--stats")) {
            stats = true;
        } else if (!strcmp(a, "--explain")) {
            explain = true;
        } else if (v && !strcmp(a, "--prompt-ids")) {
            prompt_ids = argv[++i];
        } else if (v && !strcmp(a, "--batch")) {
            batch_file = argv[++i];
        } else if (v && (!strcmp(a, "-n") || !strcmp(a, "--max-tokens"))) {
            if (mr_cli_parse_long(argv[++i], 0, 1 << 20, &n_new)) goto bad;
        } else if (v && !strcmp(a, "--temperature")) {
            if (mr_cli_parse_float(argv[++i], 0.0f, 100.0f, &sp.temperature)) goto bad;
        } else if (v && !strcmp(a, "--top-k")) {
            long k;
            if (mr_cli_parse_long(argv[++i], 0, 1 << 30, &k)) goto bad;
            sp.top_k = (int)k;
        } else if (v && !strcmp(a, "--top-p")) {
            if (mr_cli_parse_float(argv[++i], 1e-6f, 1.0f, &sp.top_p)) goto bad;
        } else if (v && !strcmp(a, "--min-p")) {
            if (mr_cli_parse_float(argv[++i], 0.0f, 1.0f, &sp.min_p)) goto bad;
        } else if (v && !strcmp(a, "--seed")) {
            long s;
            if (mr_cli_parse_long(argv[++i], 0, INT64_MAX, &s)) goto bad;
            sp.seed = (uint64_t)s;
        } else if (!v && (!strcmp(a, "--prompt-ids") || !strcmp(a, "--batch") || !strcmp(a, "-n") ||
                          !strcmp(a, "--max-tokens") || !strcmp(a, "--temperature") || !strcmp(a, "--top-k") ||
                          !strcmp(a, "--top-p") || !strcmp(a, "--min-p") || !strcmp(a, "--seed"))) {
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
    if (!prompt_ids == !batch_file) {
        fprintf(stderr, "moerun generate: give exactly one of --prompt-ids and --batch\n");
        goto out;
    }
    if (mr_cli_prompts_read(prompt_ids, batch_file, &pr)) {
        mr_cli_fail(cmd, "bad prompt");
        goto out;
    }
    /* 1. resolve, before any weight is read */
    if (mr_cli_resolve(cmd, &o, explain, &r)) goto out;
    const mr_exec *x = mr_resolution_exec(r);
    /* 2. load */
    rc = 1;
    int64_t total = 0, longest = 0;
    for (int i = 0; i < pr.n; i++) {
        total += pr.len[i];
        if (pr.len[i] > longest) longest = pr.len[i];
    }
    mr_model_opts mo = {.exec = x, .max_batch = pr.n, .max_ctx = longest + n_new, .max_tokens = total < 512 ? total : 512,
                        .progress = true};
    if (mo.max_tokens < pr.n) mo.max_tokens = pr.n;
    uint64_t t0 = mr_now_ns();
    if (mr_model_open(mr_options_get(&o, MR_OPT_MODEL), &mo, &m)) {
        mr_cli_fail(cmd, "cannot load the model");
        goto out;
    }
    const mr_model_config *c = mr_model_config_of(m);
    printf("loaded: %lld layers, %lld experts top-%lld, runner %s (%s), kernels %s, %.2f s, peak RSS %.1f MiB\n",
           (long long)c->n_layers, (long long)c->n_experts, (long long)c->top_k, mr_model_runner_name(m),
           mr_act_mode_name(mr_model_act_mode(m)), mr_kernels_get()->isa, (double)(mr_now_ns() - t0) * 1e-9,
           (double)mr_model_peak_rss(m) / (1024.0 * 1024.0));
    for (int i = 0; i < pr.n; i++)
        for (int64_t j = 0; j < pr.len[i]; j++)
            if (pr.ids[pr.off[i] + j] < 0 || pr.ids[pr.off[i] + j] >= c->vocab) {
                fprintf(stderr, "moerun generate: prompt %d: token id %d is outside the vocabulary (%lld)\n", i,
                        pr.ids[pr.off[i] + j], (long long)c->vocab);
                rc = 2;
                goto out;
            }
    if (mr_sampler_init(&smp, &sp, c->vocab)) {
        mr_cli_fail(cmd, "bad sampler settings");
        rc = 2;
        goto out;
    }
    int B = pr.n;
    logits = malloc((size_t)B * (size_t)c->vocab * sizeof(float));
    out_ids = calloc((size_t)B * (size_t)(n_new + 1), sizeof(int32_t));
    n_gen = calloc((size_t)B, sizeof(int64_t));
    n_tok = calloc((size_t)B, sizeof(int64_t));
    seq = calloc((size_t)B, sizeof(int));
    next = calloc((size_t)B, sizeof(int32_t));
    done = calloc((size_t)B, sizeof(bool));
    if (!logits || !out_ids || !n_gen || !n_tok || !seq || !next || !done) {
        fprintf(stderr, "moerun generate: out of memory\n");
        goto out;
    }
    /* 3. prefill: every prompt in one batch */
    for (int i = 0; i < B; i++) {
        seq[i] = i;
        n_tok[i] = pr.len[i];
    }
    mr_batch b = {.n_seq = B, .seq = seq, .n_tok = n_tok, .tokens = pr.ids};
    mr_model_timing_reset(m);
    uint64_t tp = mr_now_ns();
    if (n_new > 0 && mr_model_forward(m, &b, logits)) {
        mr_cli_fail(cmd, "prefill failed");
        goto out;
    }
    double prefill_s = (double)(mr_now_ns() - tp) * 1e-9;
    mr_model_timing tprefill;
    mr_model_timing_get(m, &tprefill);
    /* 4. decode: one token per live sequence per step */
    int64_t decoded = 0;
    uint64_t td = mr_now_ns();
    for (int64_t step = 0; step < n_new; step++) {
        /* logits rows follow the last batch: the live sequences in slot order */
        int row = 0;
        for (int i = 0; i < B; i++) {
            if (done[i]) continue;
            int32_t tok = mr_sampler_sample(&smp, logits + (size_t)row++ * (size_t)c->vocab);
            out_ids[(size_t)i * (size_t)(n_new + 1) + (size_t)n_gen[i]++] = tok;
            if (mr_model_is_eos(m, tok) || n_gen[i] >= n_new) done[i] = true;
        }
        /* the next batch: live sequences in slot order */
        int n = 0;
        for (int i = 0; i < B; i++) {
            if (done[i]) continue;
            seq[n] = i;
            n_tok[n] = 1;
            next[n] = out_ids[(size_t)i * (size_t)(n_new + 1) + (size_t)n_gen[i] - 1];
            n++;
        }
        if (n == 0) break;
        mr_batch db = {.n_seq = n, .seq = seq, .n_tok = n_tok, .tokens = next};
        if (mr_model_forward(m, &db, logits)) {
            mr_cli_fail(cmd, "decode failed");
            goto out;
        }
        decoded += n;
    }
    double decode_s = (double)(mr_now_ns() - td) * 1e-9;
    for (int i = 0; i < B; i++) {
        printf("[%d]", i);
        for (int64_t j = 0; j < n_gen[i]; j++) printf(" %d", out_ids[(size_t)i * (size_t)(n_new + 1) + (size_t)j]);
        printf("%s\n", n_gen[i] < n_new ? " <eos>" : "");
    }
    printf("prefill: %lld tokens in %.3f s (%.1f tok/s); decode: %lld tokens in %.3f s (%.1f tok/s)\n",
           (long long)total, prefill_s, prefill_s > 0 ? (double)total / prefill_s : 0.0, (long long)decoded, decode_s,
           decode_s > 0 ? (double)decoded / decode_s : 0.0);
    if (stats) {
        mr_model_timing t;
        mr_model_timing_get(m, &t);
        mr_model_timing d = {t.attention_ns - tprefill.attention_ns, t.moe_ns - tprefill.moe_ns,
                             t.other_ns - tprefill.other_ns, 0, 0};
        double sp_ = (double)(tprefill.attention_ns + tprefill.moe_ns + tprefill.other_ns);
        double sd = (double)(d.attention_ns + d.moe_ns + d.other_ns);
        if (sp_ <= 0) sp_ = 1;
        if (sd <= 0) sd = 1;
        printf("stats prefill: attention %.1f%% (%.3f s), moe %.1f%% (%.3f s), other %.1f%% (%.3f s)\n",
               100.0 * (double)tprefill.attention_ns / sp_, (double)tprefill.attention_ns * 1e-9,
               100.0 * (double)tprefill.moe_ns / sp_, (double)tprefill.moe_ns * 1e-9,
               100.0 * (double)tprefill.other_ns / sp_, (double)tprefill.other_ns * 1e-9);
        printf("stats decode:  attention %.1f%% (%.3f s), moe %.1f%% (%.3f s), other %.1f%% (%.3f s)\n",
               100.0 * (double)d.attention_ns / sd, (double)d.attention_ns * 1e-9, 100.0 * (double)d.moe_ns / sd,
               (double)d.moe_ns * 1e-9, 100.0 * (double)d.other_ns / sd, (double)d.other_ns * 1e-9);
    }
    rc = 0;
    goto out;
bad:
    fprintf(stderr, "moerun generate: %s: %s\n", flag, mr_error_last());
    rc = 2;
out:
    mr_sampler_free(&smp);
    free(logits);
    free(out_ids);
    free(n_gen);
    free(n_tok);
    free(seq);
    free(next);
    free(done);
    mr_model_close(m);
    mr_cli_prompts_free(&pr);
    mr_resolution_free(r);
    mr_options_free(&o);
    return rc;
}
