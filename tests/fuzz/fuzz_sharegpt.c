/* fuzz_sharegpt.c — libFuzzer target for `moerun bench serve`'s ShareGPT
 * dataset (serve/dataset.c): a file from a stranger. Bytes 0 and 1 pick the
 * options (rows wanted 1-16, a fixed output length or the second turn's, a
 * context length of 24 or none, the token ids kept, the chat template applied,
 * first turns only as the random dataset's source takes them); the
 * rest is the file, counted with the MiniMax-form tokenizer of tests/data/text
 * (the default model's, with its chat template, for the template). The load
 * fails with a message, or gives rows that hold the dataset's definition,
 * checked against the file parsed here again: each row's prompt is its
 * conversation's first turn (templated: the template's rendering of it, the
 * BOS out), its lengths are the tokenizer's counts of the prompt sent (or the
 * fixed length), at least 2, within the context, its ids the tokenizer's; no
 * conversation twice; taken + pruned = counted <= usable <= entries. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moerun/serve.h"
#include "moerun/text.h"

#define CHECK(x)                \
    do {                        \
        if (!(x)) abort();      \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static mr_tokenizer *tok, *tok_kjv;
#define KJV MR_TEST_DATA "/../../models/tiny-kjv"
static char path[64];

static void remove_file(void) { unlink(path); }

/* the tokens of s; with r, they are r's ids too */
static int64_t count(const mr_tokenizer *t, const char *s, const mr_bench_row *r) {
    mr_tok_ids ids = {0};
    CHECK(!mr_tokenizer_encode(t, s, strlen(s), MR_TOK_ADD_SPECIAL, &ids, NULL));
    const int64_t n = (int64_t)ids.n;
    if (r) CHECK(r->ids && (int64_t)ids.n == r->prompt_len && !memcmp(r->ids, ids.ids, ids.n * sizeof *ids.ids));
    mr_tok_ids_free(&ids);
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tok) {
        CHECK(!mr_tokenizer_load(MR_TEST_DATA "/text/minimax", &tok));
        CHECK(!mr_tokenizer_load(KJV, &tok_kjv));
        snprintf(path, sizeof path, "/tmp/fuzz_sharegpt_%d.json", (int)getpid());
        atexit(remove_file);
    }
    if (size < 2) return 0;
    const bool keep_ids = data[1] & 1, chat = data[1] & 2, only = data[1] & 4; /* only: the random dataset's source */
    const mr_tokenizer *t = chat ? tok_kjv : tok;
    data++, size--;
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(data + 1, 1, size - 1, f) == size - 1 && !fclose(f));
    const mr_bench_sharegpt_opts o = {.path = path, .num = 1 + (data[0] & 15), .seed = data[0],
                                      .fixed_output_len = data[0] & 16 ? 3 : 0, .context_len = data[0] & 32 ? 24 : -1,
                                      .tokenizer = chat ? KJV : MR_TEST_DATA "/text/minimax",
                                      .base_url = "http://127.0.0.1:1", .tokenize_prompt = keep_ids,
                                      .apply_chat_template = chat, .prompts_only = only};
    mr_bench_dataset *d = NULL;
    if (mr_bench_sharegpt_load(&o, &d)) {
        CHECK(!d && mr_error_last() && *mr_error_last());
        return 0;
    }
    CHECK(d && d->n >= 1 && d->n <= o.num);
    CHECK(d->n + d->short_pruned + d->long_pruned == d->visited && d->visited <= d->usable && d->usable <= d->entries);
    CHECK(d->context_len == (o.context_len > 0 ? o.context_len : 0) || only);
    json_t *doc = json_load_file(path, JSON_ALLOW_NUL, NULL);
    CHECK(json_is_array(doc) && (int64_t)json_array_size(doc) == d->entries);
    for (int i = 0; i < d->n; i++) {
        const mr_bench_row *r = &d->rows[i];
        CHECK(r->source >= 0 && r->source < d->entries);
        for (int k = 0; k < i; k++) CHECK(d->rows[k].source != r->source);
        const json_t *e = json_array_get(doc, (size_t)r->source), *c = json_object_get(e, "conversations");
        if (!c) c = json_object_get(e, "conversation");
        const char *p = json_string_value(json_object_get(json_array_get(c, 0), "value"));
        const char *q = json_string_value(json_object_get(json_array_get(c, 1), "value"));
        CHECK(p && q && (chat || !strcmp(p, r->prompt)) &&
              r->prompt_len == count(t, r->prompt, keep_ids || only ? r : NULL));
        if (chat) CHECK(strlen(r->prompt) > 0 && !strstr(r->prompt, "]~!b[]~b]system")); /* the template's BOS out */
        if (!keep_ids && !only) CHECK(!r->ids);
        if (only) { /* a first turn's tokens, kept however many, no output and no context rule */
            CHECK(r->prompt_len >= 1 && r->output_len == 0);
            continue;
        }
        CHECK(r->output_len == (o.fixed_output_len ? o.fixed_output_len : count(t, q, NULL)));
        CHECK(r->prompt_len >= 2 && r->output_len >= 2 && (!d->context_len || r->prompt_len + r->output_len <= 24));
    }
    json_decref(doc);
    mr_bench_dataset_free(d);
    return 0;
}
