/* cmd_perplexity.c — `moerun perplexity --model DIR --file F`: the model's
 * perplexity on a text file (tokenized with the model's tokenizer.json, no
 * BOS/EOS added), and the evaluation speed.
 *
 * Windows (the Hugging Face sliding-window evaluation): window w starts at
 * token w * stride and holds up to ctx tokens; it scores the tokens that no
 * earlier window scored, each given every token before it in the window (the
 * first window scores its tokens 1..n-1). stride == ctx (the default) is
 * non-overlapping windows; a smaller stride gives every scored token at
 * least ctx - stride tokens of context, at ctx / stride times the cost.
 * perplexity = exp(mean over scored tokens of -log p(token | context)).
 * The KV cache is fp32 (exact) unless --kv-cache-dtype names one: then the
 * windows go through a paged pool of that type, as the server keeps K and V.
 * Exit: 0 ok, 2 usage / resolution / bad input file, 1 load or run failure. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_model.h"
#include "moerun/config.h"
#include "moerun/kernels.h"
#include "moerun/model.h"
#include "moerun/text.h"

#define MAX_FILE ((size_t)1 << 30)

/* Every position's logits [n][V] of one window through the contiguous fp32 cache. */
static mr_status forward_contiguous(mr_model *m, const int32_t *tokens, int64_t n, float *logits) {
    int seq = 0;
    mr_model_seq_reset(m, 0);
    mr_batch bt = {.n_seq = 1, .seq = &seq, .n_tok = &n, .tokens = tokens, .all_logits = true};
    return mr_model_forward(m, &bt, logits);
}

/* The same through the paged pool (blocks 0 .. nb - 1, in the pool's type), in
 * chunks of the model's max_tokens: each chunk's last row as the batch's
 * logits, the others as extra rows. blocks [nb], rows [max_tokens]: scratch. */
static mr_status forward_paged(mr_model *m, const int32_t *tokens, int64_t n, int32_t nb, int32_t *blocks,
                               int64_t *rows, int64_t V, float *logits) {
    for (int32_t i = 0; i < nb; i++) blocks[i] = i;
    const int32_t bt_off[2] = {0, nb};
    const uint8_t want = 1;
    for (int64_t p0 = 0, k; p0 < n; p0 += k) {
        k = n - p0 < mr_model_max_tokens(m) ? n - p0 : mr_model_max_tokens(m);
        for (int64_t i = 0; i + 1 < k; i++) rows[i] = i;
        mr_kv_batch b = {.n_seq = 1, .n_tokens = k, .tokens = tokens + p0, .n_tok = &k, .start = &p0, .bt_off = bt_off,
                         .block_ids = blocks, .want_logits = &want, .n_logits = 1, .n_extra = (int)(k - 1),
                         .extra_tok = k > 1 ? rows : NULL};
        mr_status st = mr_model_forward_kv(m, &b, logits + (size_t)(p0 + k - 1) * (size_t)V);
        if (!st && k > 1) st = mr_model_extra_logits(m, 0, (int)(k - 1), logits + (size_t)p0 * (size_t)V);
        if (st) return st;
    }
    return MR_OK;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: moerun perplexity --model DIR --file F [--ctx N] [--stride S] [--max-tokens N]\n"
            "                         [--json] [--explain] [resolver options]\n\n"
            "Perplexity of the model on the text of F (UTF-8, tokenized with the model's tokenizer,\n"
            "no BOS/EOS added) and the evaluation speed in tokens/s.\n"
            "  --ctx N         tokens per window (default 512, at most the model's context)\n"
            "  --stride S      the next window starts S tokens later (default N: non-overlapping);\n"
            "                  each window scores only the tokens no earlier window scored\n"
            "  --max-tokens N  evaluate only the first N tokens of the file\n"
            "  --json          one JSON object on stdout instead of the text lines\n"
            "  --kv-cache-dtype T   evaluate with the KV cache the server would keep in T (bf16,\n"
            "                  fp8_e4m3, ...); without it the cache is fp32 (exact)\n"
            "  --explain       print the resolution story first\n\n");
    mr_options_print_help(f);
}

static int read_file(const char *path, char **buf, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "moerun perplexity: cannot open %s: %s\n", path, strerror(errno));
        return 2;
    }
    size_t cap = 1 << 16, n = 0, r;
    char *p = malloc(cap);
    int rc = 1;
    if (!p) goto out;
    while ((r = fread(p + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n < cap) continue;
        if (cap >= MAX_FILE) {
            fprintf(stderr, "moerun perplexity: %s is larger than 1 GiB\n", path);
            rc = 2;
            goto out;
        }
        char *q = realloc(p, cap * 2);
        if (!q) goto out;
        p = q;
        cap *= 2;
    }
    if (ferror(f)) {
        fprintf(stderr, "moerun perplexity: cannot read %s: %s\n", path, strerror(errno));
        rc = 2;
        goto out;
    }
    *buf = p;
    *len = n;
    p = NULL;
    rc = 0;
out:
    if (rc == 1) fprintf(stderr, "moerun perplexity: out of memory reading %s\n", path);
    free(p);
    fclose(f);
    return rc;
}

/* -log softmax(row)[tok], in double. */
static double nll_of(const float *row, int64_t V, int32_t tok) {
    float mx = row[0];
    for (int64_t i = 1; i < V; i++)
        if (row[i] > mx) mx = row[i];
    double s = 0.0;
    for (int64_t i = 0; i < V; i++) s += exp((double)row[i] - (double)mx);
    return log(s) + (double)mx - (double)row[tok];
}

int mr_cmd_perplexity(int argc, char **argv) {
    const char *cmd = "perplexity";
    mr_options o;
    if (mr_options_init(&o) != MR_OK) return 1;
    int rc = 2;
    mr_resolution *r = NULL;
    mr_model *m = NULL;
    mr_tokenizer *tok = NULL;
    mr_tok_ids ids = {0};
    char *text = NULL;
    float *logits = NULL;
    int32_t *blocks = NULL;
    int64_t *rows = NULL;
    long ctx = 512, stride = 0, max_tokens = 0;
    bool json = false, explain = false;
    const char *file = NULL, *flag = cmd;

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
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--explain")) {
            explain = true;
        } else if (v && !strcmp(a, "--file")) {
            file = argv[++i];
        } else if (v && !strcmp(a, "--ctx")) {
            if (mr_cli_parse_long(argv[++i], 2, 1 << 20, &ctx)) goto bad;
        } else if (v && !strcmp(a, "--stride")) {
            if (mr_cli_parse_long(argv[++i], 1, 1 << 20, &stride)) goto bad;
        } else if (v && !strcmp(a, "--max-tokens")) {
            if (mr_cli_parse_long(argv[++i], 2, INT32_MAX, &max_tokens)) goto bad;
        } else if (!v && (!strcmp(a, "--file") || !strcmp(a, "--ctx") || !strcmp(a, "--stride") ||
                          !strcmp(a, "--max-tokens"))) {
            fprintf(stderr, "moerun perplexity: %s needs a value\n", a);
            goto out;
        } else {
            fprintf(stderr, "moerun perplexity: unknown argument '%s' (see --help)\n", a);
            goto out;
        }
    }
    const char *dir = mr_options_get(&o, MR_OPT_MODEL);
    if (!dir[0] || !file) {
        fprintf(stderr, "moerun perplexity: --model DIR and --file F are required (see --help)\n");
        goto out;
    }
    if (stride == 0) stride = ctx;
    if (stride > ctx) {
        fprintf(stderr, "moerun perplexity: --stride (%ld) must not exceed --ctx (%ld)\n", stride, ctx);
        goto out;
    }
    /* the text and its tokens, before any weight is read */
    size_t len = 0;
    if ((rc = read_file(file, &text, &len)) != 0) goto out;
    rc = 2;
    mr_status st = mr_tokenizer_load(dir, &tok);
    if (st) {
        mr_cli_fail(cmd, "cannot load the tokenizer");
        rc = st == MR_ENOMEM ? 1 : 2;
        goto out;
    }
    size_t bad_at = 0;
    st = mr_tokenizer_encode(tok, text, len, 0, &ids, &bad_at);
    if (st) {
        fprintf(stderr, "moerun perplexity: %s: %s\n", file, mr_error_last());
        rc = st == MR_ENOMEM ? 1 : 2;
        goto out;
    }
    int64_t N = (int64_t)ids.n;
    if (max_tokens > 0 && N > max_tokens) N = max_tokens;
    if (N < 2) {
        fprintf(stderr, "moerun perplexity: %s has %lld token%s; at least 2 are needed\n", file, (long long)N,
                N == 1 ? "" : "s");
        goto out;
    }
    /* --json: stdout holds the one object, the summary goes to stderr */
    if (mr_cli_resolve_to(cmd, &o, explain, json ? stderr : stdout, &r)) goto out;
    const mr_exec *x = mr_resolution_exec(r);
    rc = 1;
    uint64_t t0 = mr_now_ns();
    int64_t wctx = ctx < N ? ctx : N;
    const bool paged = mr_options_is_explicit(&o, MR_OPT_KV_CACHE_DTYPE); /* the served cache, else fp32 */
    const int32_t nb = (int32_t)((wctx + MR_KV_BLOCK_TOKENS - 1) / MR_KV_BLOCK_TOKENS);
    mr_model_opts mo = {.exec = x, .max_batch = paged ? 0 : 1, .max_ctx = wctx, .max_tokens = wctx < 512 ? wctx : 512,
                        .kv_blocks = paged ? nb : 0, .kv_dtype = x->kv_dtype, .progress = !json};
    if (mr_model_open(dir, &mo, &m)) {
        mr_cli_fail(cmd, "cannot load the model");
        goto out;
    }
    const mr_model_config *c = mr_model_config_of(m);
    if (mr_tokenizer_id_limit(tok) > c->vocab) {
        fprintf(stderr, "moerun perplexity: the tokenizer has ids up to %d, the model's vocabulary is %lld\n",
                mr_tokenizer_id_limit(tok) - 1, (long long)c->vocab);
        rc = 2;
        goto out;
    }
    const char *kvname = paged ? mr_kv_dtype_name(x->kv_dtype) : "fp32";
    if (!json)
        printf("loaded: %lld layers, %lld experts top-%lld, runner %s (%s), kernels %s, KV cache %s%s, %.2f s\n",
               (long long)c->n_layers, (long long)c->n_experts, (long long)c->top_k, mr_model_runner_name(m),
               mr_act_mode_name(mr_model_act_mode(m)), mr_kernels_get()->isa, kvname,
               paged ? " (paged, as served)" : " (exact)", (double)(mr_now_ns() - t0) * 1e-9);
    int64_t V = c->vocab;
    logits = malloc((size_t)wctx * (size_t)V * sizeof(float));
    if (paged) {
        blocks = malloc((size_t)nb * sizeof(int32_t));
        rows = malloc((size_t)mr_model_max_tokens(m) * sizeof(int64_t));
    }
    if (!logits || (paged && (!blocks || !rows))) {
        fprintf(stderr, "moerun perplexity: out of memory\n");
        goto out;
    }
    /* the windows */
    double nll = 0.0;
    int64_t scored = 0, evaluated = 0, windows = 0, prev_end = 0;
    uint64_t ts = mr_now_ns();
    for (int64_t b = 0; prev_end < N; b += stride) {
        int64_t end = b + wctx < N ? b + wctx : N;
        int64_t n = end - b;
        const mr_status fs = paged ? forward_paged(m, ids.ids + b, n, nb, blocks, rows, V, logits)
                                   : forward_contiguous(m, ids.ids + b, n, logits);
        if (fs) {
            mr_cli_fail(cmd, "forward failed");
            goto out;
        }
        int64_t from = prev_end > b + 1 ? prev_end : b + 1;
        for (int64_t p = from; p < end; p++) {
            const float *row = logits + (size_t)(p - 1 - b) * (size_t)V;
            double l = nll_of(row, V, ids.ids[p]);
            if (!isfinite(l)) {
                fprintf(stderr, "moerun perplexity: non-finite logits at token %lld\n", (long long)p);
                goto out;
            }
            nll += l;
        }
        scored += end - from;
        evaluated += n;
        windows++;
        prev_end = end;
    }
    double secs = (double)(mr_now_ns() - ts) * 1e-9;
    double ppl = exp(nll / (double)scored);
    double tps = secs > 0 ? (double)evaluated / secs : 0.0;
    if (json) {
        printf("{\"perplexity\": %.6f, \"nll_per_token\": %.6f, \"tokens_scored\": %lld, \"tokens\": %lld, "
               "\"file_tokens\": %zu, \"windows\": %lld, \"ctx\": %lld, \"stride\": %ld, \"runner\": \"%s\", "
               "\"act_mode\": \"%s\", \"seconds\": %.4f, \"tokens_per_s\": %.1f}\n",
               ppl, nll / (double)scored, (long long)scored, (long long)N, ids.n, (long long)windows, (long long)wctx,
               stride, mr_model_runner_name(m), mr_act_mode_name(mr_model_act_mode(m)), secs, tps);
    } else {
        printf("perplexity: %.4f (%.4f nats/token) over %lld scored tokens of %s (%lld tokens; %lld windows of %lld, "
               "stride %ld)\n",
               ppl, nll / (double)scored, (long long)scored, file, (long long)N, (long long)windows, (long long)wctx,
               stride);
        printf("speed: %lld tokens evaluated in %.3f s (%.1f tok/s)\n", (long long)evaluated, secs, tps);
    }
    if (fflush(stdout) != 0) goto out;
    rc = 0;
    goto out;
bad:
    fprintf(stderr, "moerun perplexity: %s: %s\n", flag, mr_error_last());
    rc = 2;
out:
    free(logits);
    free(blocks);
    free(rows);
    mr_model_close(m);
    mr_tok_ids_free(&ids);
    mr_tokenizer_free(tok);
    free(text);
    mr_resolution_free(r);
    mr_options_free(&o);
    return rc;
}
