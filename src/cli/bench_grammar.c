/* bench_grammar.c — `moerun bench grammar`: the cost of structured outputs'
 * token mask per generated token. A vocabulary (a model folder's
 * tokenizer.json, or a synthetic one of N tokens: pseudo-words of 1-12
 * letters, a quarter with a leading space, about one in ten holding a
 * non-ASCII character, JSON punctuation or an escape) and
 * a grammar (a schema file, a regex, an EBNF file, a structural tag, an
 * OpenAI tools list as MiniMax-M2's strict tool calls, or a built-in schema
 * with strings, numbers, an enum, an array and a nested object with a
 * date) are walked, each output from --prefix (fed as bytes: a tag's begin,
 * to time the structured part of free-text grammars): at each step the mask
 * is timed, then a random allowed token is accepted, until the output is
 * complete (then again from the start) for --steps steps. The ceiling
 * printed beside it is the pass over a [vocab] row of logits that every
 * sampler makes per token anyway (an argmax), timed in the same run: the
 * ratio says what the mask adds to sampling. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "cli.h"
#include "moerun/grammar.h"

static const char DEFAULT_SCHEMA[] =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":40},\"age\":{\"type\":\"integer\","
    "\"minimum\":0,\"maximum\":150},\"kind\":{\"enum\":[\"cat\",\"dog\",\"bird\"]},\"tags\":{\"type\":\"array\",\"items\":"
    "{\"type\":\"string\"},\"maxItems\":4},\"home\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
    "\"since\":{\"type\":\"string\",\"format\":\"date\"}},\"required\":[\"city\",\"since\"]},\"note\":{\"type\":\"string\"}},"
    "\"required\":[\"name\",\"age\",\"kind\",\"tags\",\"home\"]}";

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A synthetic vocabulary: the 256 bytes, then pseudo-words. */
static mr_status synth_index(int32_t n, uint64_t seed, mr_vocab_index **out, char ***words, size_t **lens) {
    char **w = calloc((size_t)n, sizeof *w);
    size_t *l = calloc((size_t)n, sizeof *l);
    if (!w || !l) goto oom;
    static const char *const extra[] = {"é", "中", "ü", "—", "{\"", "\":", "\": \"", "\", \"", "\"}", "},", "[\"", "\"]",
                                        "\\n", "\\\"", "12", "2024-", "-01"};
    for (int32_t i = 0; i < n; i++) {
        char b[64];
        size_t k = 0;
        if (i < 256) {
            b[k++] = (char)i;
        } else {
            uint64_t r = mr_bench_rng(&seed);
            if (r % 4 == 0) b[k++] = ' ';
            int len = 1 + (int)(r >> 8) % 12;
            for (int j = 0; j < len && k < 48; j++) {
                uint64_t q = mr_bench_rng(&seed);
                if (q % 60 == 0) { /* about 1 token in 10 holds one: JSON punctuation, escapes, non-ASCII */
                    const char *e = extra[(q >> 8) % (sizeof extra / sizeof extra[0])];
                    memcpy(b + k, e, strlen(e));
                    k += strlen(e);
                } else {
                    b[k++] = (char)('a' + (q >> 8) % 26);
                }
            }
        }
        w[i] = malloc(k);
        if (!w[i]) goto oom;
        memcpy(w[i], b, k);
        l[i] = k;
    }
    *words = w;
    *lens = l;
    return mr_vocab_index_from_bytes((const char *const *)w, l, NULL, n, out);
oom:
    for (int32_t i = 0; w && i < n; i++) free(w[i]); /* calloc'd: the words not made yet are NULL */
    free(w);
    free(l);
    return MR_ENOMEM;
}

int mr_bench_grammar(int argc, char **argv) {
    const char *model = NULL, *schema_path = NULL, *json_path = NULL, *regex = NULL, *ebnf_path = NULL, *tag_path = NULL,
               *tools_path = NULL, *prefix = "";
    long synth = 200000, steps = 2000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(name) (!strcmp(a, name) && v && ++i)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: moerun bench grammar [--model DIR | --synthetic N] [--schema FILE | --regex RE | --ebnf FILE | "
                   "--structural-tag FILE | --tools FILE] [--prefix TEXT] [--steps N] [--json F]\n");
            return 0;
        } else if (OPT("--model")) model = v;
        else if (OPT("--schema")) schema_path = v;
        else if (OPT("--regex")) regex = v;
        else if (OPT("--ebnf")) ebnf_path = v;
        else if (OPT("--structural-tag")) tag_path = v;
        else if (OPT("--tools")) tools_path = v;
        else if (OPT("--prefix")) prefix = v;
        else if (OPT("--json")) json_path = v;
        else if (OPT("--synthetic")) {
            if (mr_bench_num(a, v, 300, 4000000, &synth)) return 2;
        } else if (OPT("--steps")) {
            if (mr_bench_num(a, v, 10, 10000000, &steps)) return 2;
        } else {
            fprintf(stderr, "moerun bench grammar: unknown or incomplete option '%s'\n", a);
            return 2;
        }
#undef OPT
    }
    if (json_path && mr_bench_json_check(json_path)) return 2;
    if (!!schema_path + !!regex + !!ebnf_path + !!tag_path + !!tools_path > 1) {
        fprintf(stderr, "moerun bench grammar: give one of --schema, --regex, --ebnf, --structural-tag, --tools\n");
        return 2;
    }
    char *ebnf = NULL;
    if (ebnf_path && mr_bench_read_text("bench grammar", ebnf_path, 1 << 20, &ebnf)) return 1;
    json_error_t je;
    const char *jpath = schema_path ? schema_path : tag_path ? tag_path : tools_path;
    json_t *schema = jpath ? json_load_file(jpath, 0, &je) : json_loads(DEFAULT_SCHEMA, 0, &je);
    if (!schema) {
        free(ebnf);
        fprintf(stderr, "moerun bench grammar: %s: %s (line %d)\n", jpath ? jpath : "schema", je.text, je.line);
        return 1;
    }
    mr_grammar *g = NULL;
    mr_tokenizer *tok = NULL;
    mr_vocab_index *ix = NULL;
    char **words = NULL;
    size_t *lens = NULL;
    int rc = 1;
    double t0 = now_s();
    mr_status st = ebnf        ? mr_grammar_ebnf(ebnf, &g)
                   : regex     ? mr_grammar_regex(regex, &g)
                   : tag_path  ? mr_grammar_structural_tag(schema, &g)
                   : tools_path ? mr_grammar_minimax_tools(schema, 0, &g)
                               : mr_grammar_json_schema(schema, &g);
    if (st) {
        fprintf(stderr, "moerun bench grammar: the grammar: %s\n", mr_error_last());
        goto out;
    }
    const double t_compile = now_s() - t0;
    t0 = now_s();
    if (model) st = mr_tokenizer_load(model, &tok);
    if (!st) st = model ? mr_vocab_index_new(tok, &ix) : synth_index((int32_t)synth, 7, &ix, &words, &lens);
    if (st) {
        fprintf(stderr, "moerun bench grammar: the vocabulary: %s\n", mr_error_last());
        goto out;
    }
    const double t_index = now_s() - t0;
    const int32_t V = mr_vocab_index_size(ix);
    const int32_t eos = tok ? mr_tokenizer_special_id(tok, MR_TOK_EOS) : -1;
    const int32_t end_id = eos >= 0 ? eos : 0; /* the model's EOS, else id 0 (the NUL byte: never JSON) */
    uint32_t *allow = malloc((size_t)(V + 31) / 32 * sizeof(uint32_t));
    int32_t *ids = malloc((size_t)V * sizeof(int32_t));
    float *logits = malloc((size_t)V * sizeof(float));
    double *ms = malloc((size_t)steps * sizeof(double));
    if (!allow || !ids || !logits || !ms) {
        free(allow), free(ids), free(logits), free(ms);
        fprintf(stderr, "moerun bench grammar: out of memory\n");
        goto out;
    }
    uint64_t seed = 11;
    for (int32_t i = 0; i < V; i++) logits[i] = (float)(mr_bench_rng(&seed) % 100000) * 1e-3f;
    mr_matcher_opts mo = {.end_ids = &end_id, .n_end = 1};
    mr_matcher *m = NULL;
    long done = 0;
    double allowed_sum = 0, argmax_s = 0;
    volatile int32_t sink = 0;
    for (long s = 0; s < steps; s++) {
        if (!m && (mr_matcher_new(g, ix, &mo, &m) || !mr_matcher_feed(m, prefix, strlen(prefix)))) {
            fprintf(stderr, "moerun bench grammar: %s\n", m ? "the grammar does not take --prefix" : "out of memory");
            steps = s; /* the steps so far */
            break;
        }
        double a = now_s();
        int64_t n = mr_matcher_mask(m, allow);
        ms[s] = (now_s() - a) * 1e3;
        a = now_s(); /* the ceiling: one pass over the row, as a sampler's argmax */
        int32_t best = 0;
        for (int32_t i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        sink = best;
        argmax_s += now_s() - a;
        allowed_sum += (double)n;
        int k = 0;
        for (int32_t i = 0; i < V; i++)
            if (allow[i >> 5] >> (i & 31) & 1) ids[k++] = i;
        int32_t t = k ? ids[mr_bench_rng(&seed) % (uint64_t)k] : end_id;
        if (k && mr_matcher_complete(m) && mr_bench_rng(&seed) % 4 == 0) t = end_id;
        if (!k || t == end_id || mr_matcher_accept(m, t)) { /* complete (or stuck): start again */
            done += k > 0;
            mr_matcher_free(m);
            m = NULL;
        }
    }
    (void)sink;
    mr_matcher_free(m);
    double *sorted = steps ? malloc((size_t)steps * sizeof(double)) : NULL;
    if (sorted) {
        memcpy(sorted, ms, (size_t)steps * sizeof(double));
        qsort(sorted, (size_t)steps, sizeof(double), mr_bench_cmp_double);
        double mean = 0;
        for (long s = 0; s < steps; s++) mean += ms[s];
        mean /= (double)steps;
        const double p50 = sorted[steps / 2], p99 = sorted[steps * 99 / 100], mx = sorted[steps - 1];
        const double argmax_ms = argmax_s * 1e3 / (double)steps;
        printf("grammar: %s\n", mr_grammar_describe(g));
        printf("vocabulary: %d ids (%s), index built in %.1f ms; grammar compiled in %.3f ms\n", (int)V,
               model ? model : "synthetic", t_index * 1e3, t_compile * 1e3);
        printf("mask per token over %ld steps (%ld outputs completed): mean %.3f ms, p50 %.3f, p99 %.3f, max %.3f; "
               "%.0f ids allowed on average\n", steps, done, mean, p50, p99, mx, allowed_sum / (double)steps);
        printf("ceiling: one argmax pass over the [%d] logits %.3f ms; mask / pass: mean %.2fx, p50 %.2fx\n", (int)V,
               argmax_ms, mean / argmax_ms, p50 / argmax_ms);
        rc = 0;
        if (json_path) {
            json_t *j = json_pack("{s:s,s:i,s:s,s:f,s:f,s:i,s:i,s:f,s:f,s:f,s:f,s:f,s:f}", "grammar", mr_grammar_describe(g),
                                  "vocab", (json_int_t)V, "vocabulary", model ? model : "synthetic", "index_ms", t_index * 1e3,
                                  "compile_ms", t_compile * 1e3, "steps", (json_int_t)steps, "completed", (json_int_t)done,
                                  "mask_mean_ms", mean, "mask_p50_ms", p50, "mask_p99_ms", p99, "mask_max_ms", mx,
                                  "argmax_ms", argmax_ms, "allowed_mean", allowed_sum / (double)steps);
            if (!j || mr_bench_json_write(j, json_path)) rc = 1;
            json_decref(j);
        }
    }
    free(sorted), free(allow), free(ids), free(logits), free(ms);
out:
    free(ebnf);
    for (long i = 0; words && i < synth; i++) free(words[i]);
    free(words);
    free(lens);
    mr_vocab_index_free(ix);
    mr_tokenizer_free(tok);
    mr_grammar_free(g);
    json_decref(schema);
    return rc;
}
