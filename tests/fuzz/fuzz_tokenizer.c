/* fuzz_tokenizer.c — libFuzzer target for the tokenizer.
 *
 * Input byte 0 picks the mode:
 *   even  text: byte 1 holds the encode flags and the tokenizer (one of the
 *         golden forms in tests/data/text, loaded once), the rest is the text.
 *         Checks: valid UTF-8 (or MR_TOK_REPLACE_INVALID) encodes, anything
 *         else fails at the offset mr_utf8_check names and leaves the output
 *         untouched; every id names a token; decode succeeds and is valid
 *         UTF-8; streaming decode in chunks equals decode; with the llama3
 *         form (no normalizer, no prefix space) decode(encode(text)) == text
 *         when no rstrip/lstrip token occurs in it.
 *   odd   tokenizer.json: the rest is the file. Loading either fails with a
 *         message or gives a tokenizer that encodes and decodes a few strings
 *         (and the file's own text) without error. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moerun/text.h"

#define CHECK(x)                \
    do {                        \
        if (!(x)) abort();      \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *FORMS[] = {"minimax", "gpt2", "llama3", "normseq"};
static mr_tokenizer *forms[4];

static mr_tokenizer *form(int k) {
    if (!forms[k]) {
        char path[1024];
        snprintf(path, sizeof path, "%s/text/%s", MR_TEST_DATA, FORMS[k]);
        if (mr_tokenizer_load(path, &forms[k]) != MR_OK) abort(); /* the seed tokenizers must load */
    }
    return forms[k];
}

static void check_ids(const mr_tokenizer *t, const mr_tok_ids *v) {
    for (size_t i = 0; i < v->n; i++) CHECK(mr_tokenizer_id_to_piece(t, v->ids[i], NULL) != NULL);
}

/* decode, then the same by streaming in chunks of `step` */
static void check_decode(const mr_tokenizer *t, const mr_tok_ids *v, bool skip, size_t step, char **text, size_t *tl) {
    CHECK(mr_tokenizer_decode(t, v->ids, v->n, skip, text, tl) == MR_OK);
    CHECK(mr_utf8_check(*text, *tl) == *tl);
    mr_tokstream *s;
    CHECK(mr_tokstream_new(t, skip, &s) == MR_OK);
    size_t pos = 0;
    for (size_t i = 0; i < v->n; i += step) {
        const char *o;
        size_t ol;
        size_t k = v->n - i < step ? v->n - i : step;
        CHECK(mr_tokstream_push(s, v->ids + i, k, &o, &ol) == MR_OK);
        CHECK(pos + ol <= *tl && !memcmp(*text + pos, o, ol));
        pos += ol;
    }
    const char *o;
    size_t ol;
    CHECK(mr_tokstream_flush(s, &o, &ol) == MR_OK);
    CHECK(pos + ol == *tl && !memcmp(*text + pos, o, ol));
    mr_tokstream_free(s);
}

static void fuzz_text(const uint8_t *data, size_t size) {
    if (size < 2) return;
    int k = (data[1] >> 4) & 3;
    unsigned flags = data[1] & (MR_TOK_ADD_SPECIAL | MR_TOK_REPLACE_INVALID | MR_TOK_SPLIT_SPECIAL);
    const char *text = (const char *)data + 2;
    size_t n = size - 2;
    mr_tokenizer *t = form(k);
    mr_tok_ids v = {0};
    size_t off = (size_t)-1;
    size_t bad = mr_utf8_check(text, n);
    mr_status st = mr_tokenizer_encode(t, text, n, flags, &v, &off);
    if (bad < n && !(flags & MR_TOK_REPLACE_INVALID)) {
        CHECK(st == MR_EINPUT && off == bad && v.n == 0);
        mr_tok_ids_free(&v);
        return;
    }
    CHECK(st == MR_OK);
    check_ids(t, &v);
    char *out;
    size_t ol;
    check_decode(t, &v, (data[1] >> 6) & 1, 1 + (data[1] >> 7) * 2, &out, &ol);
    if (k == 2 && bad == n && !(flags & MR_TOK_ADD_SPECIAL) && (flags & MR_TOK_SPLIT_SPECIAL) &&
        !memmem(text, n, "[TOOL]", 6) && !((data[1] >> 6) & 1)) {
        CHECK(ol == n && !memcmp(out, text, n));
    }
    mr_free(out);
    mr_tok_ids_free(&v);
}

static void fuzz_json(const uint8_t *data, size_t size) {
    mr_tokenizer *t = (mr_tokenizer *)&t;
    const char *j = (const char *)data + 1;
    size_t n = size - 1;
    mr_status st = mr_tokenizer_load_json(j, n, j, n, &t);
    if (st != MR_OK) {
        CHECK(t == NULL && st < 0 && mr_error_last()[0]);
        return;
    }
    static const char *inputs[] = {"", "Hello world!", "  a  b\n\n\tc ", "\xc3\xa9t\xc3\xa9 \xe2\x80\x94 \xf0\x9f\x98\x80",
                                   "<s>[INST] x</s>", "123456 7"};
    mr_tok_ids v = {0};
    for (size_t i = 0; i <= sizeof inputs / sizeof inputs[0]; i++) {
        const char *s = i < 6 ? inputs[i] : j;
        size_t sl = i < 6 ? strlen(s) : n;
        v.n = 0;
        st = mr_tokenizer_encode(t, s, sl, MR_TOK_ADD_SPECIAL | MR_TOK_REPLACE_INVALID, &v, NULL);
        /* a hostile regex may give up (match limits): a clean error */
        CHECK(st == MR_OK || (st == MR_EINPUT && mr_error_last()[0]));
        if (st) continue;
        check_ids(t, &v);
        char *out;
        size_t ol;
        check_decode(t, &v, i & 1, 2, &out, &ol);
        mr_free(out);
    }
    mr_tok_ids_free(&v);
    mr_tokenizer_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (data[0] & 1) fuzz_json(data, size);
    else fuzz_text(data, size);
    return 0;
}
