/* test_text.c — the tokenizer against the golden encodings and decodes that
 * huggingface/tokenizers produced (tests/data/text/<form>/golden.json,
 * written by tools/golden/gen_tokenizers.py), plus properties: streaming
 * decode equals whole decode at every split, concurrent encodes agree,
 * refusals of bad files name what is wrong, allocation failures while
 * loading return cleanly. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "moerun/text.h"
#include "testutil.h"


static unsigned char *unhex(const char *h, size_t *n) {
    size_t l = strlen(h) / 2;
    unsigned char *b = malloc(l + 1);
    for (size_t i = 0; i < l; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        b[i] = (unsigned char)v;
    }
    b[l] = 0;
    *n = l;
    return b;
}

static mr_tokenizer *load_form(const char *form) {
    char rel[128];
    snprintf(rel, sizeof rel, "text/%s", form);
    mr_tokenizer *t = NULL;
    mr_status st = mr_tokenizer_load(tu_data(rel), &t);
    if (st) fprintf(stderr, "load %s: %s\n", form, mr_error_last());
    assert_int_equal(st, MR_OK);
    return t;
}

static json_t *load_golden(const char *form) {
    char rel[128];
    snprintf(rel, sizeof rel, "text/%s/golden.json", form);
    json_error_t err;
    json_t *g = json_load_file(tu_data(rel), 0, &err);
    if (!g) fprintf(stderr, "golden %s: %s\n", form, err.text);
    assert_non_null(g);
    return g;
}

/* Compares ids with a JSON list; prints the first difference. */
static int ids_equal(const char *form, size_t ci, const char *what, const mr_tok_ids *got, json_t *want,
                     const unsigned char *text, size_t tn) {
    size_t n = json_array_size(want), i = 0;
    for (; i < n && i < got->n; i++)
        if (got->ids[i] != json_integer_value(json_array_get(want, i))) break;
    if (i == n && n == got->n) return 1;
    fprintf(stderr, "%s case %zu (%s): ids differ at %zu (got %zu ids, want %zu); text: \"%.*s\"\n", form, ci, what, i,
            got->n, n, (int)(tn > 120 ? 120 : tn), text);
    for (size_t k = i > 3 ? i - 3 : 0; k < i + 4; k++)
        fprintf(stderr, "   [%zu] got %ld want %ld\n", k, k < got->n ? (long)got->ids[k] : -1L,
                k < n ? (long)json_integer_value(json_array_get(want, k)) : -1L);
    return 0;
}

static int text_equal(const char *form, size_t ci, const char *what, const char *got, size_t gn, const char *hex) {
    size_t wn;
    unsigned char *w = unhex(hex, &wn);
    int ok = gn == wn && !memcmp(got, w, wn);
    if (!ok)
        fprintf(stderr, "%s case %zu (%s): decode differs: got \"%.*s\" want \"%.*s\"\n", form, ci, what,
                (int)(gn > 100 ? 100 : gn), got, (int)(wn > 100 ? 100 : wn), (const char *)w);
    free(w);
    return ok;
}

static void to_ids(json_t *arr, int32_t **ids, size_t *n) {
    *n = json_array_size(arr);
    *ids = malloc((*n + 1) * sizeof(int32_t));
    for (size_t i = 0; i < *n; i++) (*ids)[i] = (int32_t)json_integer_value(json_array_get(arr, i));
}

/* Streams ids through a decoder in chunks of `step`, returns the joined text. */
static char *stream_all(const mr_tokenizer *t, const int32_t *ids, size_t n, bool skip, size_t step, size_t *len) {
    mr_tokstream *s;
    assert_int_equal(mr_tokstream_new(t, skip, &s), MR_OK);
    size_t cap = 64, m = 0;
    char *all = malloc(cap);
    for (size_t i = 0; i <= n; i += step) {
        const char *o;
        size_t ol;
        if (i < n) {
            size_t k = n - i < step ? n - i : step;
            assert_int_equal(mr_tokstream_push(s, ids + i, k, &o, &ol), MR_OK);
        } else {
            assert_int_equal(mr_tokstream_flush(s, &o, &ol), MR_OK);
        }
        /* a pushed chunk is always valid UTF-8: the tail is held back */
        assert_int_equal(mr_utf8_check(o, ol), ol);
        while (m + ol + 1 > cap) all = realloc(all, cap *= 2);
        memcpy(all + m, o, ol);
        m += ol;
        if (i >= n) break;
    }
    mr_tokstream_free(s);
    all[m] = 0;
    *len = m;
    return all;
}

static void check_form(const char *form) {
    mr_tokenizer *t = load_form(form);
    json_t *g = load_golden(form);
    assert_int_equal((long)mr_tokenizer_vocab_size(t), (long)json_integer_value(json_object_get(g, "vocab_size")));
    assert_int_equal(mr_tokenizer_id_limit(t), json_integer_value(json_object_get(g, "id_limit")));
    json_t *cases = json_object_get(g, "cases");
    size_t bad = 0, ci;
    json_t *c;
    mr_tok_ids ids = {0};
    json_array_foreach(cases, ci, c) {
        size_t tn;
        unsigned char *text = unhex(json_string_value(json_object_get(c, "hex")), &tn);
        json_t *boff = json_object_get(c, "bad_offset");
        unsigned rep = 0;
        if (boff) {
            size_t off = 12345;
            ids.n = 0;
            assert_int_equal(mr_tokenizer_encode(t, (const char *)text, tn, MR_TOK_ADD_SPECIAL, &ids, &off), MR_EINPUT);
            assert_int_equal(off, json_integer_value(boff));
            assert_int_equal(ids.n, 0);
            assert_non_null(strstr(mr_error_last(), "byte offset"));
            assert_int_equal(mr_utf8_check((const char *)text, tn), off);
            rep = MR_TOK_REPLACE_INVALID;
        }
        static const struct {
            const char *key;
            unsigned flags;
        } modes[] = {{"ids", MR_TOK_ADD_SPECIAL}, {"ids_plain", 0}, {"ids_split_special", MR_TOK_SPLIT_SPECIAL}};
        for (size_t m = 0; m < 3; m++) {
            ids.n = 0;
            mr_status st = mr_tokenizer_encode(t, (const char *)text, tn, modes[m].flags | rep, &ids, NULL);
            if (st) fprintf(stderr, "%s case %zu: %s\n", form, ci, mr_error_last());
            assert_int_equal(st, MR_OK);
            if (!ids_equal(form, ci, modes[m].key, &ids, json_object_get(c, modes[m].key), text, tn)) bad++;
        }
        int32_t *want;
        size_t wn;
        to_ids(json_object_get(c, "ids"), &want, &wn);
        for (int skip = 0; skip < 2; skip++) {
            char *out;
            size_t on;
            assert_int_equal(mr_tokenizer_decode(t, want, wn, skip, &out, &on), MR_OK);
            const char *hex = json_string_value(json_object_get(c, skip ? "decode_skip" : "decode"));
            if (!text_equal(form, ci, skip ? "decode_skip" : "decode", out, on, hex)) bad++;
            size_t sn;
            char *streamed = stream_all(t, want, wn, skip, 1 + ci % 3, &sn);
            if (sn != on || memcmp(streamed, out, on)) {
                fprintf(stderr, "%s case %zu: streamed decode differs from decode\n", form, ci);
                bad++;
            }
            free(streamed);
            mr_free(out);
        }
        free(want);
        free(text);
    }
    json_t *decs = json_object_get(g, "decodes");
    json_array_foreach(decs, ci, c) {
        int32_t *v;
        size_t n;
        to_ids(json_object_get(c, "ids"), &v, &n);
        for (int skip = 0; skip < 2; skip++) {
            char *out;
            size_t on;
            assert_int_equal(mr_tokenizer_decode(t, v, n, skip, &out, &on), MR_OK);
            if (!text_equal(form, ci, skip ? "random skip" : "random", out, on,
                            json_string_value(json_object_get(c, skip ? "skip" : "text"))))
                bad++;
            size_t sn;
            char *streamed = stream_all(t, v, n, skip, 1, &sn);
            if (sn != on || memcmp(streamed, out, on)) bad++;
            free(streamed);
            mr_free(out);
        }
        free(v);
    }
    const char *key;
    json_t *val;
    json_t *pieces = json_object_get(g, "pieces");
    json_object_foreach(pieces, key, val) {
        int32_t id = atoi(key);
        size_t pl;
        const char *p = mr_tokenizer_id_to_piece(t, id, &pl);
        assert_non_null(p);
        assert_int_equal(pl, json_string_length(val));
        assert_memory_equal(p, json_string_value(val), pl);
        assert_int_equal(mr_tokenizer_piece_to_id(t, p, pl), id);
    }
    if (bad) fprintf(stderr, "%s: %zu mismatches against %s\n", form, bad,
                     json_string_value(json_object_get(g, "oracle")));
    assert_int_equal(bad, 0);
    mr_tok_ids_free(&ids);
    json_decref(g);
    mr_tokenizer_free(t);
}

static void test_golden_minimax(void **state) {
    (void)state;
    check_form("minimax");
}
static void test_golden_gpt2(void **state) {
    (void)state;
    check_form("gpt2");
}
static void test_golden_llama3(void **state) {
    (void)state;
    check_form("llama3");
}
static void test_golden_normseq(void **state) {
    (void)state;
    check_form("normseq");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_minimax),
        cmocka_unit_test(test_golden_gpt2),
        cmocka_unit_test(test_golden_llama3),
        cmocka_unit_test(test_golden_normseq),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
