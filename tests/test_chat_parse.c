/* test_chat_parse.c — the streaming reasoning / tool-call parser.
 * - goldens: MiniMax-M2's documented outputs and mutations of them, parsed
 *   by an independent whole-text reference (tools/golden/gen_parse.py);
 * - property: any split of an output into pieces (bytes, token-sized runs,
 *   random cuts) gives the same message and the same concatenated deltas;
 * - OpenAI streaming shape: a call's first delta has id and name, argument
 *   text follows, string values stream before their closing tag;
 * - malformed markup (hand-written expectations): content plus a warning;
 * - random tag soup: never a crash, arguments always a JSON object;
 * - allocation failures. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moerun/chat.h"
#include "testutil.h"

typedef struct {
    char *reason, *content;
    size_t rn, cn;
    char *args[64];
    size_t an[64];
    char names[64][128];
    char ids[64][64];
    int n_calls;
    int n_warn;
    bool bad; /* an invariant failed (message in why) */
    char why[256];
} stream_log;

static void cat(char **dst, size_t *n, const char *s, size_t k) {
    *dst = realloc(*dst, *n + k + 1);
    memcpy(*dst + *n, s, k);
    *n += k;
    (*dst)[*n] = 0;
}

static void log_delta(stream_log *L, const mr_chat_delta *d) {
    if (d->reasoning_len) cat(&L->reason, &L->rn, d->reasoning, d->reasoning_len);
    if (d->content_len) cat(&L->content, &L->cn, d->content, d->content_len);
    for (size_t i = 0; i < d->n_tools; i++) {
        const mr_chat_tool_delta *t = &d->tools[i];
        if (t->index < 0 || t->index >= 64) {
            L->bad = true;
            snprintf(L->why, sizeof L->why, "tool index %d", t->index);
            continue;
        }
        if (t->index >= L->n_calls) {
            if (t->index != L->n_calls || !t->id || !t->name) {
                L->bad = true;
                snprintf(L->why, sizeof L->why, "call %d first seen without id/name (or out of order)", t->index);
            }
            L->n_calls = t->index + 1;
            snprintf(L->ids[t->index], sizeof L->ids[t->index], "%s", t->id ? t->id : "");
            snprintf(L->names[t->index], sizeof L->names[t->index], "%s", t->name ? t->name : "");
        } else if (t->id || t->name) {
            L->bad = true;
            snprintf(L->why, sizeof L->why, "call %d: id/name repeated in a later delta", t->index);
        }
        cat(&L->args[t->index], &L->an[t->index], t->args, t->args_len);
    }
    L->n_warn += (int)d->n_warnings;
    json_t *j = mr_chat_delta_json(d);
    if ((d->reasoning_len || d->content_len || d->n_tools) && !j) {
        L->bad = true;
        snprintf(L->why, sizeof L->why, "a delta is not valid UTF-8 / JSON");
    }
    json_decref(j);
}

static void log_free(stream_log *L) {
    free(L->reason);
    free(L->content);
    for (int i = 0; i < 64; i++) free(L->args[i]);
    memset(L, 0, sizeof *L);
}

/* Parses text cut at cuts[0..ncuts) (increasing byte offsets); returns the
 * message and fills the log. Checks that the message equals the deltas. */
static json_t *parse_cut(const mr_chat_parser_opts *o, const char *text, size_t len, const size_t *cuts, size_t ncuts,
                         stream_log *L) {
    mr_chat_parser *p = NULL;
    assert_int_equal(mr_chat_parser_new(o, &p), MR_OK);
    memset(L, 0, sizeof *L);
    size_t at = 0;
    const mr_chat_delta *d;
    for (size_t i = 0; i <= ncuts; i++) {
        size_t end = i < ncuts ? cuts[i] : len;
        assert_int_equal(mr_chat_parser_feed(p, text + at, end - at, &d), MR_OK);
        log_delta(L, d);
        at = end;
    }
    assert_int_equal(mr_chat_parser_finish(p, &d), MR_OK);
    log_delta(L, d);
    assert_int_equal(mr_chat_parser_feed(p, "x", 1, &d), MR_ESTATE);
    json_t *m = mr_chat_parser_message(p);
    assert_non_null(m);
    /* the message is what the deltas said */
    const json_t *rc = json_object_get(m, "reasoning_content"), *cc = json_object_get(m, "content");
    if ((rc ? json_string_length(rc) : 0) != L->rn || (L->rn && memcmp(json_string_value(rc), L->reason, L->rn)) ||
        (json_is_string(cc) ? json_string_length(cc) : 0) != L->cn ||
        (L->cn && memcmp(json_string_value(cc), L->content, L->cn))) {
        L->bad = true;
        snprintf(L->why, sizeof L->why, "message text differs from the concatenated deltas");
    }
    const json_t *calls = json_object_get(m, "tool_calls");
    if ((int)json_array_size(calls) != L->n_calls || (int)mr_chat_parser_tool_call_count(p) != L->n_calls) {
        L->bad = true;
        snprintf(L->why, sizeof L->why, "%zu calls in the message, %d in the deltas", json_array_size(calls), L->n_calls);
    }
    for (int i = 0; i < L->n_calls && !L->bad; i++) {
        const json_t *c = json_array_get(calls, (size_t)i), *f = json_object_get(c, "function");
        const char *args = json_string_value(json_object_get(f, "arguments"));
        if (strcmp(json_string_value(json_object_get(c, "id")), L->ids[i]) ||
            strcmp(json_string_value(json_object_get(f, "name")), L->names[i]) || !args ||
            strlen(args) != L->an[i] || memcmp(args, L->args[i] ? L->args[i] : "", L->an[i])) {
            L->bad = true;
            snprintf(L->why, sizeof L->why, "call %d differs from its deltas", i);
        }
        json_t *pa = json_loads(args, JSON_ALLOW_NUL, NULL); /* \u0000 is valid JSON */
        if (!json_is_object(pa)) {
            L->bad = true;
            snprintf(L->why, sizeof L->why, "call %d arguments are not a JSON object: %.120s", i, args);
        }
        json_decref(pa);
    }
    mr_chat_parser_free(p);
    return m;
}

static void opts_from(mr_chat_parser_opts *o, const json_t *c) {
    const json_t *op = json_object_get(c, "options");
    mr_chat_parser_opts_default(o, MR_CHAT_FORMAT_MINIMAX_M2);
    o->think_open = json_is_true(json_object_get(op, "think_open"));
    o->reasoning = json_is_true(json_object_get(op, "reasoning"));
    o->tool_calls = json_is_true(json_object_get(op, "tool_calls"));
    const json_t *tools = json_object_get(c, "tools");
    o->tools = json_is_null(tools) ? NULL : tools;
    o->id_seed = 12345;
}

static bool str_eq(const json_t *a, const json_t *b) {
    if (json_is_null(a) || !a) return json_is_null(b) || !b;
    return json_is_string(b) && json_string_length(a) == json_string_length(b) &&
           !memcmp(json_string_value(a), json_string_value(b), json_string_length(a));
}

static bool matches_expect(const json_t *m, const json_t *exp, char *why, size_t wn) {
    if (!str_eq(json_object_get(exp, "reasoning_content"), json_object_get(m, "reasoning_content"))) {
        snprintf(why, wn, "reasoning: want %s | got %s", json_string_value(json_object_get(exp, "reasoning_content")),
                 json_string_value(json_object_get(m, "reasoning_content")));
        return false;
    }
    if (!str_eq(json_object_get(exp, "content"), json_object_get(m, "content"))) {
        snprintf(why, wn, "content: want [%s] | got [%s]", json_string_value(json_object_get(exp, "content")),
                 json_string_value(json_object_get(m, "content")));
        return false;
    }
    const json_t *ec = json_object_get(exp, "tool_calls"), *mc = json_object_get(m, "tool_calls");
    if (json_array_size(ec) != json_array_size(mc)) {
        snprintf(why, wn, "want %zu calls, got %zu", json_array_size(ec), json_array_size(mc));
        return false;
    }
    for (size_t i = 0; i < json_array_size(ec); i++) {
        const json_t *e = json_array_get(ec, i), *f = json_object_get(json_array_get(mc, i), "function");
        if (!str_eq(json_object_get(e, "name"), json_object_get(f, "name")) ||
            !str_eq(json_object_get(e, "arguments"), json_object_get(f, "arguments"))) {
            snprintf(why, wn, "call %zu: want %s %s | got %s %s", i, json_string_value(json_object_get(e, "name")),
                     json_string_value(json_object_get(e, "arguments")), json_string_value(json_object_get(f, "name")),
                     json_string_value(json_object_get(f, "arguments")));
            return false;
        }
    }
    return true;
}

static json_t *goldens(void) {
    json_error_t e;
    json_t *g = json_load_file(tu_data("text/chat/golden_parse.json"), 0, &e);
    if (!g) fprintf(stderr, "golden_parse.json: %s\n", e.text);
    assert_non_null(g);
    return g;
}

static void test_goldens_one_piece(void **st) {
    (void)st;
    json_t *g = goldens();
    size_t i, failed = 0;
    json_t *c;
    json_array_foreach(json_object_get(g, "cases"), i, c) {
        mr_chat_parser_opts o;
        opts_from(&o, c);
        const json_t *t = json_object_get(c, "text");
        stream_log L;
        json_t *m = parse_cut(&o, json_string_value(t), json_string_length(t), NULL, 0, &L);
        char why[2048];
        if (L.bad) {
            fprintf(stderr, "  %s: %s\n", json_string_value(json_object_get(c, "name")), L.why);
            failed++;
        } else if (!matches_expect(m, json_object_get(c, "expect"), why, sizeof why)) {
            fprintf(stderr, "  %s: %s\n", json_string_value(json_object_get(c, "name")), why);
            failed++;
        }
        json_decref(m);
        log_free(&L);
    }
    fprintf(stderr, "parse goldens: %zu cases, %zu failed\n", json_array_size(json_object_get(g, "cases")), failed);
    json_decref(g);
    assert_int_equal(failed, 0);
}

/* The same message for every split: bytes, token-sized runs, random cuts. */
static void check_splits(const mr_chat_parser_opts *o, const char *text, size_t len, const char *name, tu_rng *rng,
                         int rounds, size_t *failed) {
    stream_log L0;
    json_t *m0 = parse_cut(o, text, len, NULL, 0, &L0);
    size_t *cuts = malloc((len + 1) * sizeof *cuts);
    for (int r = 0; r < rounds; r++) {
        size_t n = 0;
        if (r == 0) {
            for (size_t k = 1; k < len; k++) cuts[n++] = k; /* every byte alone */
        } else {
            size_t at = 0;
            size_t maxrun = r % 3 == 0 ? 3 : r % 3 == 1 ? 8 : 40;
            while (at < len) {
                at += 1 + tu_next(rng) % maxrun;
                if (at < len) cuts[n++] = at;
            }
        }
        stream_log L;
        json_t *m = parse_cut(o, text, len, cuts, n, &L);
        if (L.bad || !json_equal(m, m0)) {
            char *a = json_dumps(m0, JSON_ENSURE_ASCII), *b = json_dumps(m, JSON_ENSURE_ASCII);
            fprintf(stderr, "  %s: split round %d (%zu cuts) %s\n    one piece: %.300s\n    split:     %.300s\n", name, r,
                    n, L.bad ? L.why : "differs", a, b);
            free(a);
            free(b);
            (*failed)++;
            json_decref(m);
            log_free(&L);
            break;
        }
        json_decref(m);
        log_free(&L);
    }
    free(cuts);
    json_decref(m0);
    log_free(&L0);
}

static void test_split_invariance(void **st) {
    (void)st;
    json_t *g = goldens();
    tu_rng rng = {0x5eed};
    size_t i, failed = 0;
    json_t *c;
    json_array_foreach(json_object_get(g, "cases"), i, c) {
        mr_chat_parser_opts o;
        opts_from(&o, c);
        const json_t *t = json_object_get(c, "text");
        check_splits(&o, json_string_value(t), json_string_length(t), json_string_value(json_object_get(c, "name")),
                     &rng, 40, &failed);
    }
    json_decref(g);
    assert_int_equal(failed, 0);
}

static const char *WEATHER_TOOLS =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"location\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}}}}}]";

/* OpenAI's streaming shape, and string values streaming before </parameter>. */
static void test_streaming_shape(void **st) {
    (void)st;
    json_t *tools = json_loads(WEATHER_TOOLS, 0, NULL);
    mr_chat_parser_opts o;
    mr_chat_parser_opts_default(&o, MR_CHAT_FORMAT_MINIMAX_M2);
    o.tools = tools;
    o.id_seed = 7;
    mr_chat_parser *p;
    assert_int_equal(mr_chat_parser_new(&o, &p), MR_OK);
    const mr_chat_delta *d;
    const char *pieces[] = {"Plan", " it.\n</th", "ink>\n\nSure", ".\n<minimax:tool_call>\n<invoke name=\"get_",
                            "weather\">\n<parameter name=\"location\">San Fran", "cisco, CA", "</parameter>\n<parameter name=\"days\">3",
                            "</parameter>\n</invoke>\n</minimax:tool_call>"};
    /* what each feed must release */
    assert_int_equal(mr_chat_parser_feed(p, pieces[0], strlen(pieces[0]), &d), MR_OK);
    assert_string_equal(d->reasoning, "Plan");
    assert_int_equal(mr_chat_parser_feed(p, pieces[1], strlen(pieces[1]), &d), MR_OK);
    assert_string_equal(d->reasoning, " it."); /* "\n</th" is held: trailing whitespace and a tag prefix */
    assert_int_equal(mr_chat_parser_feed(p, pieces[2], strlen(pieces[2]), &d), MR_OK);
    assert_string_equal(d->reasoning, "");
    assert_string_equal(d->content, "Sure");
    assert_int_equal(mr_chat_parser_feed(p, pieces[3], strlen(pieces[3]), &d), MR_OK);
    assert_string_equal(d->content, ".");
    assert_int_equal(d->n_tools, 0); /* the invoke tag is not complete */
    assert_int_equal(mr_chat_parser_feed(p, pieces[4], strlen(pieces[4]), &d), MR_OK);
    assert_int_equal(d->n_tools, 1);
    assert_int_equal(d->tools[0].index, 0);
    assert_non_null(d->tools[0].id);
    assert_true(!strncmp(d->tools[0].id, "call_", 5) && strlen(d->tools[0].id) == 29);
    assert_string_equal(d->tools[0].name, "get_weather");
    assert_string_equal(d->tools[0].args, "{\"location\": \"San Fran"); /* streamed before </parameter> */
    json_t *dj = mr_chat_delta_json(d);
    char *ds = json_dumps(dj, JSON_COMPACT);
    assert_non_null(strstr(ds, "\"type\":\"function\""));
    assert_non_null(strstr(ds, "\"index\":0"));
    free(ds);
    json_decref(dj);
    assert_int_equal(mr_chat_parser_feed(p, pieces[5], strlen(pieces[5]), &d), MR_OK);
    assert_int_equal(d->n_tools, 1);
    assert_null(d->tools[0].id);
    assert_null(d->tools[0].name);
    assert_string_equal(d->tools[0].args, "cisco, CA");
    assert_int_equal(mr_chat_parser_feed(p, pieces[6], strlen(pieces[6]), &d), MR_OK);
    assert_string_equal(d->tools[0].args, "\""); /* an integer waits for its closing tag */
    assert_int_equal(mr_chat_parser_feed(p, pieces[7], strlen(pieces[7]), &d), MR_OK);
    assert_string_equal(d->tools[0].args, ", \"days\": 3}");
    assert_int_equal(mr_chat_parser_finish(p, &d), MR_OK);
    assert_int_equal(d->n_warnings, 0);
    json_t *m = mr_chat_parser_message(p);
    char *ms = json_dumps(m, JSON_COMPACT);
    char id[64];
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(json_array_get(json_object_get(m, "tool_calls"), 0), "id")));
    char want[512];
    snprintf(want, sizeof want,
             "{\"role\":\"assistant\",\"content\":\"Sure.\",\"reasoning_content\":\"Plan it.\",\"tool_calls\":[{\"id\":"
             "\"%s\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"location\\\": "
             "\\\"San Francisco, CA\\\", \\\"days\\\": 3}\"}}]}",
             id);
    assert_string_equal(ms, want);
    free(ms);
    json_decref(m);
    /* the same seed gives the same ids; another seed other ids */
    mr_chat_parser *q;
    o.id_seed = 8;
    assert_int_equal(mr_chat_parser_new(&o, &q), MR_OK);
    const char *all = "</think><minimax:tool_call><invoke name=\"a\"></invoke><invoke name=\"b\"></invoke></minimax:tool_call>";
    assert_int_equal(mr_chat_parser_feed(q, all, strlen(all), &d), MR_OK);
    assert_int_equal(d->n_tools, 2);
    assert_string_not_equal(d->tools[0].id, d->tools[1].id);
    assert_string_not_equal(d->tools[0].id, id);
    mr_chat_parser_free(q);
    mr_chat_parser_free(p);
    json_decref(tools);
}

/* Malformed markup: expectations written from the rules in parse_output.c. */
static void test_malformed(void **st) {
    (void)st;
    static const struct {
        const char *name, *text;
        const char *content;   /* expected content (NULL: null) */
        const char *calls;     /* expected "name(args)|..." */
        int warnings;          /* at least this many */
    } cases[] = {
        {"garbage block", "<minimax:tool_call>garbage</minimax:tool_call>after",
         "<minimax:tool_call>garbage</minimax:tool_call>after", "", 1},
        {"invoke without name", "text <minimax:tool_call><invoke>x</invoke></minimax:tool_call>",
         "text <minimax:tool_call><invoke>x</invoke></minimax:tool_call>", "", 1},
        {"empty name", "<minimax:tool_call><invoke name=\"\"></invoke></minimax:tool_call>",
         "<minimax:tool_call><invoke name=\"\"></invoke></minimax:tool_call>", "", 1},
        {"garbage after a parameter",
         "<minimax:tool_call><invoke name=\"f\"><parameter name=\"a\">1</parameter>oops</invoke></minimax:tool_call>",
         "oops</invoke></minimax:tool_call>", "f({\"a\": \"1\"})", 1},
        {"second invoke broken",
         "<minimax:tool_call><invoke name=\"f\"></invoke>\n<invoke nam=\"g\"></invoke></minimax:tool_call>",
         "<invoke nam=\"g\"></invoke></minimax:tool_call>", "f({})", 1},
        {"unterminated tag at the end", "Hi\n<minimax:tool_call>\n<inv", "Hi\n<minimax:tool_call>\n<inv", "", 1},
        {"unterminated invoke", "<minimax:tool_call><invoke name=\"f\"><parameter name=\"k\">v</parameter>", NULL,
         "f({\"k\": \"v\"})", 1},
        {"unterminated value", "<minimax:tool_call><invoke name=\"f\"><parameter name=\"k\">va", NULL,
         "f({\"k\": \"va\"})", 1},
        {"block never closed", "x<minimax:tool_call><invoke name=\"f\"></invoke>", "x", "f({})", 1},
        {"quote in name", "<minimax:tool_call><invoke name=\"a\"b\"></invoke></minimax:tool_call>",
         "<minimax:tool_call><invoke name=\"a\"b\"></invoke></minimax:tool_call>", "", 1},
        {"duplicate parameter",
         "<minimax:tool_call><invoke name=\"f\"><parameter name=\"k\">1</parameter><parameter name=\"k\">2</parameter>"
         "</invoke></minimax:tool_call>",
         NULL, "f({\"k\": \"1\"})", 1},
        {"invalid UTF-8 becomes U+FFFD",
         "a\xff\xc3(b<minimax:tool_call><invoke name=\"f\"><parameter name=\"k\">\xe2\x82</parameter></invoke>"
         "</minimax:tool_call>",
         "a\xef\xbf\xbd\xef\xbf\xbd(b", "f({\"k\": \"\xef\xbf\xbd\xef\xbf\xbd\"})", 0},
        /* whitespace before <think> that is not ASCII (U+00A0, U+3000): a piece that ends inside
         * its bytes waits for the rest (the fuzzer's find: a cut after \xc2 made it content) */
        {"non-ASCII whitespace before <think>", "\xc2\xa0\xe3\x80\x80\xc2\xa0<think>r</think>c", "c", "", 0},
    };
    size_t failed = 0;
    tu_rng rng = {99};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mr_chat_parser_opts o;
        mr_chat_parser_opts_default(&o, MR_CHAT_FORMAT_MINIMAX_M2);
        o.think_open = false;
        o.id_seed = 1;
        stream_log L;
        json_t *m = parse_cut(&o, cases[i].text, strlen(cases[i].text), NULL, 0, &L);
        const json_t *content = json_object_get(m, "content");
        char calls[1024] = "";
        const json_t *tc = json_object_get(m, "tool_calls");
        for (size_t k = 0; k < json_array_size(tc); k++) {
            const json_t *f = json_object_get(json_array_get(tc, k), "function");
            snprintf(calls + strlen(calls), sizeof calls - strlen(calls), "%s%s(%s)", k ? "|" : "",
                     json_string_value(json_object_get(f, "name")), json_string_value(json_object_get(f, "arguments")));
        }
        bool ok = !L.bad && (cases[i].content ? json_is_string(content) && !strcmp(json_string_value(content), cases[i].content)
                                              : json_is_null(content)) &&
                  !strcmp(calls, cases[i].calls) && L.n_warn >= cases[i].warnings;
        if (!ok) {
            fprintf(stderr, "  %s: content [%s] calls [%s] warnings %d %s\n", cases[i].name,
                    json_is_string(content) ? json_string_value(content) : "(null)", calls, L.n_warn, L.bad ? L.why : "");
            failed++;
        }
        json_decref(m);
        log_free(&L);
        check_splits(&o, cases[i].text, strlen(cases[i].text), cases[i].name, &rng, 30, &failed);
    }
    /* an opening tag that never ends is given up after a bound, not buffered forever */
    mr_chat_parser_opts o;
    mr_chat_parser_opts_default(&o, MR_CHAT_FORMAT_MINIMAX_M2);
    o.think_open = false;
    char *big = malloc(5000);
    strcpy(big, "<minimax:tool_call><invoke name=\"");
    memset(big + strlen(big), 'a', 3000);
    big[33 + 3000] = 0;
    mr_chat_parser *p;
    const mr_chat_delta *d;
    assert_int_equal(mr_chat_parser_new(&o, &p), MR_OK);
    assert_int_equal(mr_chat_parser_feed(p, big, strlen(big), &d), MR_OK);
    assert_true(d->content_len > 2000); /* released as content without waiting for the end */
    assert_true(d->n_warnings >= 1);
    mr_chat_parser_free(p);
    free(big);
    assert_int_equal(failed, 0);
}

/* Random tag soup: never a crash, arguments always a JSON object, splits agree. */
static void test_random_soup(void **st) {
    (void)st;
    static const char *const frags[] = {
        "<minimax:tool_call>", "</minimax:tool_call>", "<invoke name=\"f\">", "<invoke name='g'>", "</invoke>",
        "<parameter name=\"a\">", "<parameter name=\"n\">", "</parameter>", "<think>", "</think>", "null", "NULL",
        "42", "3.5", "true", "{\"x\": [1, 2]}", "[1,", " ", "\n", "<", ">", "\"", "é", "\xe2\x82\xac", "\xf0\x9f",
        "\xff", "text", "<inv", "</para", "<minimax:", "name=", "\\", "\x01"};
    const size_t nf = sizeof frags / sizeof frags[0];
    json_t *tools = json_loads("[{\"name\": \"f\", \"parameters\": {\"properties\": {\"a\": {\"type\": \"string\"}, "
                               "\"n\": {\"type\": [\"integer\", \"null\"]}}}}]",
                               0, NULL);
    tu_rng rng = {2024};
    size_t failed = 0;
    char buf[4096];
    for (int it = 0; it < 400 && !failed; it++) {
        size_t n = 0;
        int k = 1 + (int)(tu_next(&rng) % 40);
        for (int j = 0; j < k; j++) {
            const char *f = frags[tu_next(&rng) % nf];
            size_t l = strlen(f);
            if (n + l >= sizeof buf) break;
            memcpy(buf + n, f, l);
            n += l;
        }
        buf[n] = 0;
        mr_chat_parser_opts o;
        mr_chat_parser_opts_default(&o, MR_CHAT_FORMAT_MINIMAX_M2);
        o.think_open = tu_next(&rng) & 1;
        o.tools = tools;
        o.id_seed = 3;
        char name[32];
        snprintf(name, sizeof name, "soup %d", it);
        check_splits(&o, buf, n, name, &rng, 6, &failed);
    }
    json_decref(tools);
    assert_int_equal(failed, 0);
}

static void test_plain_and_options(void **st) {
    (void)st;
    mr_chat_parser_opts o;
    mr_chat_parser_opts_default(&o, MR_CHAT_FORMAT_PLAIN);
    stream_log L;
    const char *t = "<think>x</think><minimax:tool_call><invoke name=\"f\"></invoke></minimax:tool_call>";
    json_t *m = parse_cut(&o, t, strlen(t), NULL, 0, &L);
    assert_string_equal(json_string_value(json_object_get(m, "content")), t);
    assert_null(json_object_get(m, "tool_calls"));
    assert_null(json_object_get(m, "reasoning_content"));
    json_decref(m);
    log_free(&L);
    /* empty output: content null, no delta */
    mr_chat_parser_opts_default(&o, MR_CHAT_FORMAT_MINIMAX_M2);
    m = parse_cut(&o, "", 0, NULL, 0, &L);
    assert_true(json_is_null(json_object_get(m, "content")));
    json_decref(m);
    log_free(&L);
    mr_chat_parser *p;
    const mr_chat_delta *d;
    assert_int_equal(mr_chat_parser_new(&o, &p), MR_OK);
    assert_int_equal(mr_chat_parser_feed(p, "", 0, &d), MR_OK);
    assert_null(mr_chat_delta_json(d));
    assert_int_equal(mr_chat_parser_feed(p, NULL, 3, &d), MR_EINVAL);
    mr_chat_parser_free(p);
    json_t *bad = json_string("x");
    o.tools = bad;
    assert_int_equal(mr_chat_parser_new(&o, &p), MR_EINVAL);
    json_decref(bad);
    assert_int_equal(mr_chat_format_detect("...]~b]ai\\n<think>..."), MR_CHAT_FORMAT_MINIMAX_M2);
    assert_int_equal(mr_chat_format_detect("<|im_start|>"), MR_CHAT_FORMAT_PLAIN);
}

static void test_alloc_failures(void **st) {
    (void)st;
    json_t *tools = json_loads(WEATHER_TOOLS, 0, NULL);
    const char *t = "r</think>Sure.<minimax:tool_call><invoke name=\"get_weather\"><parameter name=\"location\">Oslo"
                    "</parameter><parameter name=\"days\">2</parameter></invoke></minimax:tool_call>";
    int ok = 0, oom = 0;
    for (long k = 0; k < 400; k++) {
        mr_chat_parser_opts o;
        mr_chat_parser_opts_default(&o, MR_CHAT_FORMAT_MINIMAX_M2);
        o.tools = tools;
        mr_chat_parser *p = NULL;
        mr_debug_alloc_fail_after(k);
        mr_status s = mr_chat_parser_new(&o, &p);
        const mr_chat_delta *d;
        for (size_t i = 0; !s && i < strlen(t); i += 5) {
            size_t l = strlen(t) - i < 5 ? strlen(t) - i : 5;
            s = mr_chat_parser_feed(p, t + i, l, &d);
        }
        if (!s) s = mr_chat_parser_finish(p, &d);
        json_t *m = s ? NULL : mr_chat_parser_message(p);
        mr_debug_alloc_fail_after(-1);
        if (s) {
            assert_int_equal(s, MR_ENOMEM);
            oom++;
        } else {
            ok++;
        }
        json_decref(m);
        mr_chat_parser_free(p);
    }
    assert_true(ok > 0 && oom > 0);
    json_decref(tools);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_goldens_one_piece), cmocka_unit_test(test_split_invariance),
        cmocka_unit_test(test_streaming_shape),   cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_random_soup),       cmocka_unit_test(test_plain_and_options),
        cmocka_unit_test(test_alloc_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
