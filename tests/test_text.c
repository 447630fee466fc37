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

/* ---- refusals: each bad file gives its status and names what is wrong ---- */
#define TINY_MODEL "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}"
static void test_bad_files(void **state) {
    (void)state;
    static const struct {
        const char *json;
        mr_status st;
        const char *msg;
    } cases[] = {
        {"", MR_EFORMAT, "bad JSON"},
        {"{\"model\": {", MR_EFORMAT, "bad JSON"},
        {"[]", MR_EFORMAT, "not an object"},
        {"{}", MR_EFORMAT, "model"},
        {"{\"version\":\"2.0\"," TINY_MODEL "}", MR_EUNSUPPORTED, "version"},
        {"{\"normalizer\":{\"type\":\"BertNormalizer\"}," TINY_MODEL "}", MR_EUNSUPPORTED, "BertNormalizer"},
        {"{\"normalizer\":{\"type\":\"Precompiled\",\"precompiled_charsmap\":\"\"}," TINY_MODEL "}", MR_EUNSUPPORTED, "Precompiled"},
        {"{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},{\"type\":\"Nope\"}]}," TINY_MODEL "}", MR_EUNSUPPORTED, "Nope"},
        {"{\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"[\"},\"content\":\"x\"}," TINY_MODEL "}", MR_EFORMAT, "regex"},
        {"{\"normalizer\":{\"type\":\"Replace\",\"pattern\":{},\"content\":\"x\"}," TINY_MODEL "}", MR_EFORMAT, "pattern"},
        {"{\"pre_tokenizer\":{\"type\":\"Metaspace\"}," TINY_MODEL "}", MR_EUNSUPPORTED, "Metaspace"},
        {"{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Sideways\"}," TINY_MODEL "}", MR_EFORMAT, "Sideways"},
        {"{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\"\"},\"behavior\":\"Isolated\"}," TINY_MODEL "}", MR_EUNSUPPORTED, "empty String"},
        {"{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[a[b]]\"},\"behavior\":\"Isolated\"}," TINY_MODEL "}", MR_EUNSUPPORTED, "nested"},
        {"{\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":\"yes\"}," TINY_MODEL "}", MR_EFORMAT, "boolean"},
        {"{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", MR_EUNSUPPORTED, "WordPiece"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"0\"},\"merges\":[]}}", MR_EFORMAT, "vocab id"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}", MR_EFORMAT, "vocab id"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":99999999999},\"merges\":[]}}", MR_EFORMAT, "vocab id"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":2000000000},\"merges\":[]}}", MR_EFORMAT, "vocab id"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":16000000},\"merges\":[]}}", MR_EUNSUPPORTED, "sparse"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":{}}}", MR_EFORMAT, "merges"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a  b\"]}}", MR_EFORMAT, "one space"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"ab\"]}}", MR_EFORMAT, "one space"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[[\"a\"]]}}", MR_EFORMAT, "merge 0"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a c\"]}}", MR_EFORMAT, "not in the vocab"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}}", MR_EFORMAT, "makes \"ab\""},
        {"{\"model\":{\"type\":\"BPE\",\"dropout\":0.1,\"vocab\":{},\"merges\":[]}}", MR_EUNSUPPORTED, "dropout"},
        {"{\"added_tokens\":{}," TINY_MODEL "}", MR_EFORMAT, "added_tokens"},
        {"{\"added_tokens\":[{\"id\":3}]," TINY_MODEL "}", MR_EFORMAT, "content"},
        {"{\"added_tokens\":[{\"id\":\"3\",\"content\":\"x\"}]," TINY_MODEL "}", MR_EFORMAT, "id"},
        {"{\"added_tokens\":[{\"id\":3,\"content\":\"x\",\"special\":1}]," TINY_MODEL "}", MR_EFORMAT, "boolean"},
        {"{\"post_processor\":{\"type\":\"Weird\"}," TINY_MODEL "}", MR_EUNSUPPORTED, "Weird"},
        {"{\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}}," 
         "{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{}}," TINY_MODEL "}", MR_EFORMAT, "<s>"},
        {"{\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"Sequence\":{\"id\":\"A\"}},"
         "{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{}}," TINY_MODEL "}", MR_EUNSUPPORTED, "repeats"},
        {"{\"post_processor\":{\"type\":\"BertProcessing\",\"sep\":[\"x\",7],\"cls\":[\"y\",0]}," TINY_MODEL "}", MR_EFORMAT, "names no token"},
        {"{\"decoder\":{\"type\":\"Metaspace\"}," TINY_MODEL "}", MR_EUNSUPPORTED, "Metaspace"},
        {"{\"post_processor\":{\"type\":\"RobertaProcessing\",\"sep\":[\"x\",2],\"cls\":[\"y\",1]},"
         "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":2},\"merges\":[]}}", MR_EFORMAT, "id 1 names no token"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mr_tokenizer *t = (mr_tokenizer *)&t;
        mr_status st = mr_tokenizer_load_json(cases[i].json, strlen(cases[i].json), NULL, 0, &t);
        if (st != cases[i].st || !strstr(mr_error_last(), cases[i].msg))
            fail_msg("case %zu (%s): got %s \"%s\", want %s with \"%s\"", i, cases[i].json, mr_status_name(st),
                     mr_error_last(), mr_status_name(cases[i].st), cases[i].msg);
        assert_null(t);
    }
    /* the tiny model itself loads and merges */
    mr_tokenizer *t;
    assert_int_equal(mr_tokenizer_load_json("{" TINY_MODEL "}", strlen("{" TINY_MODEL "}"), NULL, 0, &t), MR_OK);
    mr_tok_ids v = {0};
    assert_int_equal(mr_tokenizer_encode(t, "abba", 4, 0, &v, NULL), MR_OK);
    assert_int_equal(v.n, 3);
    assert_int_equal(v.ids[0], 2);
    assert_int_equal(v.ids[1], 1);
    assert_int_equal(v.ids[2], 0);
    /* no decoder: tokens joined with spaces, as tokenizers does */
    char *out;
    size_t on;
    assert_int_equal(mr_tokenizer_decode(t, v.ids, v.n, false, &out, &on), MR_OK);
    assert_string_equal(out, "ab b a");
    mr_free(out);
    int32_t badid = 3;
    assert_int_equal(mr_tokenizer_decode(t, &badid, 1, false, &out, &on), MR_ERANGE);
    assert_non_null(strstr(mr_error_last(), "3"));
    mr_tok_ids_free(&v);
    /* no unk token and no byte fallback: an unknown character is dropped, so a
     * piece can make no tokens at all, into an output never allocated; twice,
     * the second time from the piece cache (the fuzzer found UB here) */
    for (int k = 0; k < 2; k++) {
        mr_tok_ids e = {0};
        assert_int_equal(mr_tokenizer_encode(t, "xyz", 3, 0, &e, NULL), MR_OK);
        assert_int_equal(e.n, 0);
        assert_int_equal(mr_tokenizer_encode(t, "xyzab", 5, 0, &e, NULL), MR_OK);
        assert_int_equal(e.n, 1);
        assert_int_equal(e.ids[0], 2);
        mr_tok_ids_free(&e);
    }
    mr_tokenizer_free(t);
    /* files */
    assert_int_equal(mr_tokenizer_load("/nonexistent/dir", &t), MR_EIO);
    assert_null(t);
    assert_int_equal(mr_tokenizer_load(tu_data("configs/minimax_m2_bf16"), &t), MR_EIO);
    assert_non_null(strstr(mr_error_last(), "tokenizer.json"));
}

/* ---- roles, lookups and streaming of a split character ---- */
static void test_lookups_and_stream(void **state) {
    (void)state;
    mr_tokenizer *t = load_form("minimax");
    /* shared/spec/text.md §2 */
    assert_int_equal(mr_tokenizer_special_id(t, MR_TOK_BOS), 200034);
    assert_int_equal(mr_tokenizer_special_id(t, MR_TOK_EOS), 200020);
    assert_int_equal(mr_tokenizer_special_id(t, MR_TOK_PAD), -1);
    assert_int_equal(mr_tokenizer_piece_to_id(t, "<think>", 7), 200050);
    assert_int_equal(mr_tokenizer_piece_to_id(t, "</minimax:tool_call>", 20), 200053);
    assert_true(mr_tokenizer_is_special(t, 200019));
    assert_false(mr_tokenizer_is_special(t, 100));
    assert_int_equal(mr_tokenizer_id_limit(t), 200064);
    assert_null(mr_tokenizer_id_to_piece(t, 150000, NULL)); /* the hole below the specials */
    assert_null(mr_tokenizer_id_to_piece(t, -1, NULL));
    assert_null(mr_tokenizer_id_to_bytes(t, 200064, NULL));
    size_t n;
    const char *b = mr_tokenizer_id_to_bytes(t, mr_tokenizer_piece_to_id(t, "\xc4\xa0the", 5), &n);
    assert_non_null(b);
    assert_int_equal(n, 4);
    assert_memory_equal(b, " the", 4);
    /* "ü" is two byte tokens here: the first is held back, the second completes it */
    mr_tok_ids v = {0};
    assert_int_equal(mr_tokenizer_encode(t, "\xc3\xbc", 2, 0, &v, NULL), MR_OK);
    assert_int_equal(v.n, 2);
    mr_tokstream *s;
    const char *o;
    size_t ol;
    assert_int_equal(mr_tokstream_new(t, true, &s), MR_OK);
    assert_int_equal(mr_tokstream_push(s, &v.ids[0], 1, &o, &ol), MR_OK);
    assert_int_equal(ol, 0);
    int32_t bad = 150000; /* a refused push keeps the state */
    assert_int_equal(mr_tokstream_push(s, &bad, 1, &o, &ol), MR_ERANGE);
    assert_int_equal(mr_tokstream_push(s, &v.ids[1], 1, &o, &ol), MR_OK);
    assert_int_equal(ol, 2);
    assert_memory_equal(o, "\xc3\xbc", 2);
    /* a tail that never completes becomes U+FFFD at flush; a special token is skipped */
    int32_t two[2] = {v.ids[0], 200034};
    assert_int_equal(mr_tokstream_push(s, two, 2, &o, &ol), MR_OK);
    assert_int_equal(ol, 0);
    assert_int_equal(mr_tokstream_flush(s, &o, &ol), MR_OK);
    assert_int_equal(ol, 3);
    assert_memory_equal(o, "\xef\xbf\xbd", 3);
    assert_int_equal(mr_tokstream_flush(s, &o, &ol), MR_OK);
    assert_int_equal(ol, 0);
    mr_tokstream_free(s);
    /* appending: a second encode adds to the first */
    size_t n1 = v.n;
    assert_int_equal(mr_tokenizer_encode(t, "\xc3\xbc", 2, MR_TOK_ADD_SPECIAL, &v, NULL), MR_OK);
    assert_int_equal(v.n, 2 * n1);
    mr_tok_ids_free(&v);
    assert_non_null(strstr(mr_tokenizer_describe(t), "NFC"));
    mr_tokenizer_free(t);
    t = load_form("llama3");
    assert_int_equal(mr_tokenizer_special_id(t, MR_TOK_BOS), mr_tokenizer_piece_to_id(t, "<|begin_of_text|>", 17));
    assert_int_equal(mr_tokenizer_special_id(t, MR_TOK_EOS), mr_tokenizer_piece_to_id(t, "<|eot_id|>", 10));
    mr_tokenizer_free(t);
}

/* ---- one tokenizer, many threads: the same ids as one thread ---- */
typedef struct {
    const mr_tokenizer *t;
    const char *text;
    size_t n;
    mr_tok_ids out;
    mr_status st;
} thr_job;

static void *thr_run(void *p) {
    thr_job *j = p;
    for (int r = 0; r < 20 && !j->st; r++) {
        j->out.n = 0;
        j->st = mr_tokenizer_encode(j->t, j->text, j->n, MR_TOK_ADD_SPECIAL, &j->out, NULL);
    }
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    size_t len, tlen;
    char *text = tu_read_file(tu_data("text/minimax/tokenizer_config.json"), &tlen);
    char *code = tu_read_file(tu_data("../test_text.c"), &len);
    assert_non_null(text);
    assert_non_null(code);
    const char *texts[4] = {text, code, "Hello there, general Kenobi! \xe4\xbd\xa0\xe5\xa5\xbd", code + len / 2};
    size_t lens[4] = {tlen, len, strlen(texts[2]), len - len / 2};
    mr_tokenizer *ref = load_form("minimax"), *t = load_form("minimax"); /* t: a cold cache shared by threads */
    thr_job jobs[8];
    pthread_t th[8];
    for (int i = 0; i < 8; i++) {
        jobs[i] = (thr_job){t, texts[i % 4], lens[i % 4], {0}, MR_OK};
        assert_int_equal(pthread_create(&th[i], NULL, thr_run, &jobs[i]), 0);
    }
    for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(jobs[i].st, MR_OK);
        mr_tok_ids want = {0};
        assert_int_equal(mr_tokenizer_encode(ref, jobs[i].text, jobs[i].n, MR_TOK_ADD_SPECIAL, &want, NULL), MR_OK);
        assert_int_equal(want.n, jobs[i].out.n);
        assert_memory_equal(want.ids, jobs[i].out.ids, want.n * sizeof(int32_t));
        mr_tok_ids_free(&want);
        mr_tok_ids_free(&jobs[i].out);
    }
    mr_tokenizer_free(ref);
    mr_tokenizer_free(t);
    free(text);
    free(code);
}

/* ---- allocation failures: clean errors, nothing leaked (ASan checks) ---- */
static void test_alloc_failures(void **state) {
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s/../fuzz/corpus/tokenizer/json_llama3", MR_TEST_DATA);
    size_t len;
    char *j = tu_read_file(path, &len);
    assert_non_null(j);
    int n;
    mr_tokenizer *t = NULL;
    for (n = 0; n < 100000; n++) {
        mr_debug_alloc_fail_after(n);
        t = (mr_tokenizer *)&t;
        mr_status st = mr_tokenizer_load_json(j + 1, len - 1, NULL, 0, &t);
        mr_debug_alloc_fail_after(-1);
        if (st == MR_OK) break;
        if (st != MR_ENOMEM) fail_msg("load fail_after(%d): %s: %s", n, mr_status_name(st), mr_error_last());
        assert_null(t);
    }
    assert_true(n > 20);
    const char *text = "Hello <mask> world, [TOOL]  caf\xc3\xa9 \xf0\x9f\x98\x80 \xff";
    mr_tok_ids want = {0};
    assert_int_equal(mr_tokenizer_encode(t, text, strlen(text), MR_TOK_ADD_SPECIAL | MR_TOK_REPLACE_INVALID, &want, NULL), MR_OK);
    mr_tokenizer_free(t);
    /* a fresh tokenizer each time: the encode path with a cold cache */
    assert_int_equal(mr_tokenizer_load_json(j + 1, len - 1, NULL, 0, &t), MR_OK);
    for (n = 0; n < 10000; n++) {
        mr_tok_ids v = {0};
        mr_debug_alloc_fail_after(n);
        mr_status st = mr_tokenizer_encode(t, text, strlen(text), MR_TOK_ADD_SPECIAL | MR_TOK_REPLACE_INVALID, &v, NULL);
        mr_debug_alloc_fail_after(-1);
        if (st == MR_OK) {
            assert_int_equal(v.n, want.n);
            assert_memory_equal(v.ids, want.ids, v.n * sizeof(int32_t));
            mr_tok_ids_free(&v);
            break;
        }
        if (st != MR_ENOMEM) fail_msg("encode fail_after(%d): %s: %s", n, mr_status_name(st), mr_error_last());
        assert_int_equal(v.n, 0);
        mr_tok_ids_free(&v);
    }
    assert_true(n >= 1); /* the cache swallows its own failures: few allocations can fail */
    mr_tok_ids_free(&want);
    mr_tokenizer_free(t);
    free(j);
}

/* ---- the hot path: a cached text allocates a bounded number of times ---- */
static void test_allocation_light(void **state) {
    (void)state;
    mr_tokenizer *t = load_form("minimax");
    size_t len;
    char *text = tu_read_file(tu_data("../test_text.c"), &len);
    assert_non_null(text);
    mr_tok_ids v = {0};
    assert_int_equal(mr_tokenizer_encode(t, text, len, MR_TOK_ADD_SPECIAL, &v, NULL), MR_OK);
    size_t n = v.n;
    uint64_t a0 = mr_debug_alloc_count();
    v.n = 0;
    assert_int_equal(mr_tokenizer_encode(t, text, len, MR_TOK_ADD_SPECIAL, &v, NULL), MR_OK);
    uint64_t a = mr_debug_alloc_count() - a0;
    assert_int_equal(v.n, n);
    /* scratch buffers only, independent of the text's length (n tokens) */
    if (a > 16) fail_msg("%llu allocations for %zu tokens", (unsigned long long)a, n);
    mr_tok_ids_free(&v);
    free(text);
    mr_tokenizer_free(t);
}

static void test_golden_fallback(void **state) {
    (void)state;
    check_form("fallback");
}
static void test_golden_subword(void **state) {
    (void)state;
    check_form("subword");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_lookups_and_stream),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_allocation_light),
        cmocka_unit_test(test_golden_minimax),
        cmocka_unit_test(test_golden_gpt2),
        cmocka_unit_test(test_golden_llama3),
        cmocka_unit_test(test_golden_normseq),
        cmocka_unit_test(test_golden_fallback),
        cmocka_unit_test(test_golden_subword),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
