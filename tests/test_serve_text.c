/* test_serve_text.c — `moerun serve` with text: a checkpoint of MiniMax-M2's
 * form (gen-tiny with the 200064-id vocabulary) carrying the committed
 * MiniMax-form tokenizer.json and the MiniMax-M2 chat template of the text
 * tests. Its weights are random, so what it says is dictated: the server
 * runs with --debug-forced-output and each request names the output tokens
 * (the engine's teacher forcing), which then go through the real serving
 * path: detokenizer, stop strings, reasoning / tool-call parser, events.
 *
 * Oracles: /tokenize and /detokenize against Hugging Face's ids and text
 * (tests/data/text/minimax/golden.json); rendered chats against
 * transformers' renderings (tests/data/text/chat/golden_chat.json); outputs
 * against the literal texts the requests dictated (the cut of a stop string,
 * the split at </think>, the tool call's typed arguments); streams against
 * their non-streamed twins; usage against the tokenizer's own count. */
#include <math.h>

#include "moerun/text.h"
#include "serve_testutil.h"

static char g_model[1024];
static mr_tokenizer *g_tok;

#define EOS_TEXT "[e~["

/* ---- helpers ---- */

static json_t *post(const char *path, const char *body) {
    long code;
    json_t *j = http_json(g_srv.url, path, body, &code);
    if (code != 200) {
        char *d = j ? json_dumps(j, 0) : NULL;
        fprintf(stderr, "POST %s %s -> %ld %s\n", path, body, code, d ? d : "");
        free(d);
    }
    assert_int_equal(code, 200);
    return j;
}

/* A JSON body from a jansson value (the test writes requests as objects). */
static json_t *post_obj(const char *path, json_t *req) {
    char *b = json_dumps(req, JSON_COMPACT);
    json_t *j = post(path, b);
    free(b);
    json_decref(req);
    return j;
}

static size_t n_tokens(const char *text) {
    mr_tok_ids v = {0};
    assert_int_equal(mr_tokenizer_encode(g_tok, text, strlen(text), 0, &v, NULL), MR_OK);
    size_t n = v.n;
    mr_tok_ids_free(&v);
    return n;
}

/* Concatenated text / content / reasoning of a stream, and its last finish reason. */
typedef struct {
    sv_buf line, text, content, reasoning, args;
    char reason[32];
    char tool_name[64];
    int n_tool_ids, bad, events;
    long completion_tokens;
} tstream;

static void tline(tstream *s, const char *l, size_t n) {
    if (n == 0) return;
    if (n < 6 || memcmp(l, "data: ", 6)) {
        s->bad++;
        return;
    }
    if (n == 12 && !memcmp(l + 6, "[DONE]", 6)) return;
    json_error_t je;
    json_t *ev = json_loadb(l + 6, n - 6, 0, &je);
    if (!ev) {
        s->bad++;
        return;
    }
    s->events++;
    json_t *u = json_object_get(ev, "usage");
    if (json_is_object(u)) s->completion_tokens = (long)json_integer_value(json_object_get(u, "completion_tokens"));
    json_t *c0 = json_array_get(json_object_get(ev, "choices"), 0);
    const char *t = json_string_value(json_object_get(c0, "text"));
    if (t) sv_buf_add(&s->text, t, strlen(t));
    json_t *d = json_object_get(c0, "delta");
    t = json_string_value(json_object_get(d, "content"));
    if (t) sv_buf_add(&s->content, t, strlen(t));
    t = json_string_value(json_object_get(d, "reasoning_content"));
    if (t) sv_buf_add(&s->reasoning, t, strlen(t));
    json_t *calls = json_object_get(d, "tool_calls");
    for (size_t i = 0; i < json_array_size(calls); i++) {
        json_t *c = json_array_get(calls, i);
        if (json_object_get(c, "id")) s->n_tool_ids++;
        json_t *fn = json_object_get(c, "function");
        const char *nm = json_string_value(json_object_get(fn, "name"));
        if (nm) snprintf(s->tool_name, sizeof s->tool_name, "%s", nm);
        const char *a = json_string_value(json_object_get(fn, "arguments"));
        if (a) sv_buf_add(&s->args, a, strlen(a));
    }
    const char *r = json_string_value(json_object_get(c0, "finish_reason"));
    if (r) snprintf(s->reason, sizeof s->reason, "%s", r);
    json_decref(ev);
}

static size_t tsink(char *p, size_t sz, size_t nm, void *ud) {
    tstream *s = ud;
    for (size_t i = 0; i < sz * nm; i++) {
        if (p[i] == '\n') {
            tline(s, s->line.p ? s->line.p : "", s->line.len);
            s->line.len = 0;
        } else {
            sv_buf_add(&s->line, p + i, 1);
        }
    }
    return sz * nm;
}

/* Streams req (stream and include_usage set here). */
static void stream_obj(const char *path, json_t *req, tstream *s) {
    memset(s, 0, sizeof *s);
    json_object_set_new(req, "stream", json_true());
    json_object_set_new(req, "stream_options", json_pack("{s:b}", "include_usage", 1));
    char *b = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    CURL *h = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "%s%s", g_srv.url, path);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, b);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, tsink);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 60L);
    assert_int_equal(curl_easy_perform(h), CURLE_OK);
    long code;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    assert_int_equal(code, 200);
    curl_easy_cleanup(h);
    free(b);
    assert_int_equal(s->bad, 0);
    sv_buf_add(&s->text, "", 0);
    sv_buf_add(&s->content, "", 0);
    sv_buf_add(&s->reasoning, "", 0);
    sv_buf_add(&s->args, "", 0);
}

static void tstream_free(tstream *s) {
    sv_buf_free(&s->line);
    sv_buf_free(&s->text);
    sv_buf_free(&s->content);
    sv_buf_free(&s->reasoning);
    sv_buf_free(&s->args);
}

static const char *choice_str(json_t *j, const char *a, const char *b) {
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    json_t *x = json_object_get(c0, a);
    return json_string_value(b ? json_object_get(x, b) : x);
}

static json_t *chat_req(const char *user, const char *forced) {
    return json_pack("{s:[{s:s,s:s}],s:i,s:s}", "messages", "role", "user", "content", user, "max_tokens", 200,
                     "debug_forced_output", forced);
}

/* ---- the cases ---- */

/* /tokenize and /detokenize give Hugging Face's ids and text. */
static void test_tokenize_golden(void **st) {
    (void)st;
    size_t len;
    char *txt = tu_read_file(tu_data("text/minimax/golden.json"), &len);
    json_error_t je;
    json_t *g = json_loadb(txt, len, 0, &je);
    free(txt);
    assert_non_null(g);
    json_t *cases = json_object_get(g, "cases");
    int tried = 0;
    for (size_t i = 0; i < json_array_size(cases) && tried < 60; i++) {
        json_t *c = json_array_get(cases, i);
        const char *hex = json_string_value(json_object_get(c, "hex"));
        size_t hn = strlen(hex) / 2;
        char *raw = malloc(hn + 1);
        for (size_t k = 0; k < hn; k++) {
            unsigned v;
            sscanf(hex + 2 * k, "%2x", &v);
            raw[k] = (char)v;
        }
        raw[hn] = 0;
        json_t *s = hn && memchr(raw, 0, hn) == NULL ? json_stringn(raw, hn) : NULL; /* valid UTF-8, no NUL */
        free(raw);
        if (!s) continue;
        tried++;
        json_t *q = json_object();
        json_object_set(q, "prompt", s);
        json_object_set_new(q, "add_special_tokens", json_true());
        json_t *r = post_obj("/tokenize", q);
        if (!json_equal(json_object_get(r, "tokens"), json_object_get(c, "ids"))) {
            char *a = json_dumps(json_object_get(r, "tokens"), 0), *b = json_dumps(json_object_get(c, "ids"), 0);
            fprintf(stderr, "case %zu (%s): /tokenize %s, HF %s\n", i, hex, a, b);
            free(a);
            free(b);
            fail();
        }
        assert_int_equal(json_integer_value(json_object_get(r, "count")), json_array_size(json_object_get(c, "ids")));
        json_decref(r);
        q = json_object();
        json_object_set(q, "prompt", s);
        json_object_set_new(q, "add_special_tokens", json_false());
        r = post_obj("/tokenize", q);
        assert_true(json_equal(json_object_get(r, "tokens"), json_object_get(c, "ids_plain")));
        json_decref(r);
        /* detokenize: HF's decode (hex) of the same ids */
        r = post_obj("/detokenize", json_pack("{s:O}", "tokens", json_object_get(c, "ids")));
        const char *d = json_string_value(json_object_get(r, "prompt"));
        const char *dh = json_string_value(json_object_get(c, "decode"));
        char *dhex = malloc(strlen(d) * 2 + 1);
        for (size_t k = 0; d[k]; k++) sprintf(dhex + 2 * k, "%02x", (unsigned char)d[k]);
        dhex[strlen(d) * 2] = 0;
        assert_string_equal(dhex, dh);
        free(dhex);
        json_decref(r);
        json_decref(s);
    }
    assert_true(tried >= 20);
    json_decref(g);
}

/* Chats render as transformers renders them (the ids of the golden text). */
static void test_chat_template_golden(void **st) {
    (void)st;
    size_t len;
    char *txt = tu_read_file(tu_data("text/chat/golden_chat.json"), &len);
    json_error_t je;
    json_t *g = json_loadb(txt, len, 0, &je);
    free(txt);
    json_t *cases = json_object_get(g, "cases");
    int n = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        if (strcmp(json_string_value(json_object_get(c, "model")), "minimax_m2")) continue;
        if (json_is_true(json_object_get(c, "continue_final_message")) || !json_is_null(json_object_get(c, "template_name")) ||
            !json_is_null(json_object_get(c, "kwargs")))
            continue;
        json_t *req = json_pack("{s:O,s:O}", "messages", json_object_get(c, "messages"), "add_generation_prompt",
                                json_object_get(c, "add_generation_prompt"));
        if (json_is_array(json_object_get(c, "tools"))) json_object_set(req, "tools", json_object_get(c, "tools"));
        char *b = json_dumps(req, JSON_COMPACT);
        json_decref(req);
        long code;
        json_t *r = http_json(g_srv.url, "/tokenize", b, &code);
        free(b);
        if (code != 200) { /* a conversation shape the OpenAI request format does not take */
            fprintf(stderr, "note: golden %s not posted: %s\n", json_string_value(json_object_get(c, "conversation")),
                    json_string_value(json_object_get(json_object_get(r, "error"), "message")));
            json_decref(r);
            continue;
        }
        const char *want = json_string_value(json_object_get(c, "output"));
        mr_tok_ids v = {0};
        assert_int_equal(mr_tokenizer_encode(g_tok, want, strlen(want), 0, &v, NULL), MR_OK);
        json_t *tk = json_object_get(r, "tokens");
        bool same = json_array_size(tk) == v.n;
        for (size_t k = 0; same && k < v.n; k++) same = json_integer_value(json_array_get(tk, k)) == v.ids[k];
        if (!same) fprintf(stderr, "golden %s: the rendering differs\n", json_string_value(json_object_get(c, "conversation")));
        assert_true(same);
        mr_tok_ids_free(&v);
        json_decref(r);
        n++;
    }
    json_decref(g);
    assert_true(n >= 8);
}

/* Completions: the dictated text comes back whole, streamed or not, with exact usage. */
static void test_completion_text(void **st) {
    (void)st;
    const char *say = "Hello, w\xc3\xb6rld! \xf0\x9f\x98\x80 Caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 the end." EOS_TEXT;
    size_t nt = n_tokens(say);
    json_t *j = post_obj("/v1/completions", json_pack("{s:s,s:i,s:s}", "prompt", "Say it:", "max_tokens", 100,
                                                      "debug_forced_output", say));
    assert_string_equal(choice_str(j, "text", NULL), "Hello, w\xc3\xb6rld! \xf0\x9f\x98\x80 Caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 the end.");
    assert_string_equal(choice_str(j, "finish_reason", NULL), "stop");
    json_t *u = json_object_get(j, "usage");
    assert_int_equal(json_integer_value(json_object_get(u, "completion_tokens")), nt); /* the EOS is counted */
    mr_tok_ids v = {0};
    mr_tokenizer_encode(g_tok, "Say it:", 7, MR_TOK_ADD_SPECIAL, &v, NULL);
    assert_int_equal(json_integer_value(json_object_get(u, "prompt_tokens")), v.n);
    mr_tok_ids_free(&v);
    json_decref(j);
    tstream s;
    stream_obj("/v1/completions",
               json_pack("{s:s,s:i,s:s}", "prompt", "Say it:", "max_tokens", 100, "debug_forced_output", say), &s);
    assert_string_equal(s.text.p, "Hello, w\xc3\xb6rld! \xf0\x9f\x98\x80 Caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 the end.");
    assert_null(strstr(s.text.p, "\xef\xbf\xbd")); /* no U+FFFD: split UTF-8 was held, not broken */
    assert_string_equal(s.reason, "stop");
    assert_int_equal(s.completion_tokens, nt);
    tstream_free(&s);
    /* max_tokens cuts at a token: the text is the decode of the first 3 tokens */
    j = post_obj("/v1/completions", json_pack("{s:s,s:i,s:s}", "prompt", "x", "max_tokens", 3, "debug_forced_output", say));
    mr_tokenizer_encode(g_tok, say, strlen(say), 0, &v, NULL);
    char *d;
    size_t dn;
    assert_int_equal(mr_tokenizer_decode(g_tok, v.ids, 3, true, &d, &dn), MR_OK);
    assert_string_equal(choice_str(j, "text", NULL), d);
    assert_string_equal(choice_str(j, "finish_reason", NULL), "length");
    mr_free(d);
    mr_tok_ids_free(&v);
    json_decref(j);
    /* echo puts the prompt before the completion */
    j = post_obj("/v1/completions", json_pack("{s:s,s:i,s:b,s:s}", "prompt", "Echo: ", "max_tokens", 20, "echo", 1,
                                              "debug_forced_output", "ok" EOS_TEXT));
    assert_string_equal(choice_str(j, "text", NULL), "Echo: ok");
    json_decref(j);
}

/* Stop strings: the output ends before the first one completed, across token
 * boundaries, streamed exactly as not; completion_tokens counts to the token
 * that completed it. */
static void test_stop_strings(void **st) {
    (void)st;
    static const struct {
        const char *say, *stop[2], *want;
        bool include;
    } cases[] = {
        {"alpha beta STOP gamma", {"STOP", NULL}, "alpha beta ", false},
        {"alpha beta STOP gamma", {"STOP", NULL}, "alpha beta STOP", true},
        {"one two three four", {"o thr", "four"}, "one tw", false},          /* inside tokens */
        {"abc abd abe", {"abd", "ab"}, "", false},                             /* the first completed wins */
        {"no match here at all", {"zzz", NULL}, "no match here at all", false}, /* partial matches released at the end */
        {"caf\xc3\xa9 cr\xc3\xa8me", {"\xc3\xa8me", NULL}, "caf\xc3\xa9 cr", false},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        json_t *stops = json_array();
        for (int i = 0; i < 2 && cases[k].stop[i]; i++) json_array_append_new(stops, json_string(cases[k].stop[i]));
        char forced[256];
        snprintf(forced, sizeof forced, "%s" EOS_TEXT, cases[k].say);
        json_t *req = json_pack("{s:s,s:i,s:s,s:O,s:b}", "prompt", "go", "max_tokens", 60, "debug_forced_output", forced,
                                "stop", stops, "include_stop_str_in_output", cases[k].include);
        json_t *req2 = json_deep_copy(req);
        json_t *j = post_obj("/v1/completions", req);
        const char *got = choice_str(j, "text", NULL);
        if (strcmp(got, cases[k].want)) fprintf(stderr, "case %zu: got '%s' want '%s'\n", k, got, cases[k].want);
        assert_string_equal(got, cases[k].want);
        bool matched = strcmp(cases[k].want, cases[k].say) != 0;
        assert_string_equal(choice_str(j, "finish_reason", NULL), "stop"); /* by the string, or by the EOS */
        long ct = (long)json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens"));
        if (matched) {
            /* the count: the fewest tokens whose text holds a stop string */
            mr_tok_ids v = {0};
            mr_tokenizer_encode(g_tok, cases[k].say, strlen(cases[k].say), 0, &v, NULL);
            size_t need = 0;
            for (size_t t = 1; t <= v.n && !need; t++) {
                char *d;
                size_t dn;
                mr_tokenizer_decode(g_tok, v.ids, t, true, &d, &dn);
                for (int i = 0; i < 2 && cases[k].stop[i]; i++)
                    if (strstr(d, cases[k].stop[i])) need = t;
                mr_free(d);
            }
            mr_tok_ids_free(&v);
            assert_int_equal(ct, need);
        } else {
            assert_int_equal(ct, n_tokens(forced));
        }
        json_decref(j);
        tstream s;
        stream_obj("/v1/completions", req2, &s);
        assert_string_equal(s.text.p, cases[k].want);
        assert_int_equal(s.completion_tokens, ct);
        tstream_free(&s);
        json_decref(stops);
    }
}

/* Chat: reasoning up to </think>, then content; streamed the same. */
static void test_chat_reasoning(void **st) {
    (void)st;
    const char *say = "Two plus two.</think>\n\nThe answer is 4." EOS_TEXT;
    json_t *j = post_obj("/v1/chat/completions", chat_req("2+2?", say));
    assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion");
    assert_string_equal(choice_str(j, "message", "role"), "assistant");
    assert_string_equal(choice_str(j, "message", "reasoning_content"), "Two plus two.");
    assert_string_equal(choice_str(j, "message", "content"), "The answer is 4.");
    assert_string_equal(choice_str(j, "finish_reason", NULL), "stop");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), n_tokens(say));
    json_decref(j);
    tstream s;
    stream_obj("/v1/chat/completions", chat_req("2+2?", say), &s);
    assert_string_equal(s.reasoning.p, "Two plus two.");
    assert_string_equal(s.content.p, "The answer is 4.");
    assert_string_equal(s.reason, "stop");
    assert_int_equal(s.completion_tokens, n_tokens(say));
    tstream_free(&s);
    /* separate_reasoning false: all of it is content */
    json_t *req = chat_req("2+2?", say);
    json_object_set_new(req, "separate_reasoning", json_false());
    j = post_obj("/v1/chat/completions", req);
    assert_null(choice_str(j, "message", "reasoning_content"));
    assert_non_null(strstr(choice_str(j, "message", "content"), "The answer is 4."));
    assert_non_null(strstr(choice_str(j, "message", "content"), "Two plus two."));
    json_decref(j);
}

static json_t *weather_tools(void) {
    return json_pack("[{s:s,s:{s:s,s:s,s:{s:s,s:{s:{s:s},s:{s:s}},s:[s]}}}]", "type", "function", "function", "name",
                     "get_weather", "description", "Weather of a city", "parameters", "type", "object", "properties",
                     "city", "type", "string", "days", "type", "integer", "required", "city");
}

#define CALL_TEXT                                                                                              \
    "I should look it up.</think>\n\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter "        \
    "name=\"city\">Paris</parameter>\n<parameter name=\"days\">3</parameter>\n</invoke>\n</minimax:tool_call>" \
    EOS_TEXT

/* Tool calls: parsed into OpenAI tool_calls with the schema's types, finish_reason tool_calls. */
static void test_chat_tool_calls(void **st) {
    (void)st;
    json_t *req = chat_req("Weather in Paris for 3 days?", CALL_TEXT);
    json_object_set_new(req, "tools", weather_tools());
    json_t *j = post_obj("/v1/chat/completions", req);
    assert_string_equal(choice_str(j, "finish_reason", NULL), "tool_calls");
    json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    assert_true(json_is_null(json_object_get(msg, "content")));
    assert_string_equal(json_string_value(json_object_get(msg, "reasoning_content")), "I should look it up.");
    json_t *calls = json_object_get(msg, "tool_calls");
    assert_int_equal(json_array_size(calls), 1);
    json_t *c0 = json_array_get(calls, 0);
    assert_string_equal(json_string_value(json_object_get(c0, "type")), "function");
    assert_true(strlen(json_string_value(json_object_get(c0, "id"))) > 0);
    json_t *fn = json_object_get(c0, "function");
    assert_string_equal(json_string_value(json_object_get(fn, "name")), "get_weather");
    json_error_t je;
    json_t *args = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, &je);
    json_t *want = json_pack("{s:s,s:i}", "city", "Paris", "days", 3); /* "3" became the integer 3 */
    assert_true(json_equal(args, want));
    json_decref(args);
    json_decref(j);
    /* streamed: one call, its id once, the same arguments */
    req = chat_req("Weather in Paris for 3 days?", CALL_TEXT);
    json_object_set_new(req, "tools", weather_tools());
    tstream s;
    stream_obj("/v1/chat/completions", req, &s);
    assert_string_equal(s.reason, "tool_calls");
    assert_int_equal(s.n_tool_ids, 1);
    assert_string_equal(s.tool_name, "get_weather");
    args = json_loads(s.args.p, 0, &je);
    assert_true(json_equal(args, want));
    json_decref(args);
    tstream_free(&s);
    json_decref(want);
    /* tool_choice none: no parsing, the markup stays content */
    req = chat_req("Weather?", CALL_TEXT);
    json_object_set_new(req, "tools", weather_tools());
    json_object_set_new(req, "tool_choice", json_string("none"));
    j = post_obj("/v1/chat/completions", req);
    assert_string_equal(choice_str(j, "finish_reason", NULL), "stop");
    assert_non_null(strstr(choice_str(j, "message", "content"), "<invoke name=\"get_weather\">"));
    json_decref(j);
}

/* A chat turn with the earlier tool call and its result goes through the template. */
static void test_chat_multiturn(void **st) {
    (void)st;
    json_t *req = json_pack(
        "{s:[{s:s,s:s},{s:s,s:s},{s:s,s:n,s:[{s:s,s:s,s:{s:s,s:s}}]},{s:s,s:s,s:s}],s:o,s:i,s:s}", "messages", "role",
        "system", "content", "Be brief.", "role", "user", "content", "Weather?", "role", "assistant", "content",
        "tool_calls", "id", "call_1", "type", "function", "function", "name", "get_weather", "arguments",
        "{\"city\":\"Paris\"}", "role", "tool", "tool_call_id", "call_1", "content", "sunny", "tools", weather_tools(),
        "max_tokens", 50, "debug_forced_output", "Fine.</think>\n\nIt is sunny." EOS_TEXT);
    json_t *j = post_obj("/v1/chat/completions", req);
    assert_string_equal(choice_str(j, "message", "content"), "It is sunny.");
    json_decref(j);
}

/* Bad chats: 400 naming the field, the template's refusals included. */
static void test_chat_errors(void **st) {
    (void)st;
    expect_error("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400,
                 "invalid_request_error", "messages[0].content[0]", "text only");
    expect_error("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":5000}", 400,
                 "invalid_request_error", "max_tokens", "--max-completion-tokens");
    expect_error("/v1/completions", "{\"prompt\":\"x\",\"debug_forced_output\":[999999]}", 400, "invalid_request_error",
                 "debug_forced_output[0]", "outside the vocabulary");
}

static int setup(void **st) {
    (void)st;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    g_dir = tu_tmpdir("serve_text");
    snprintf(g_model, sizeof g_model, "%s/minimax-form", g_dir);
    char cmd[32768];
    snprintf(cmd, sizeof cmd,
             "'%s' gen-tiny '%s' --vocab 200064 --hidden 16 --layers 1 --experts 4 --top-k 2 --expert-dim 32 "
             "--heads 2 --kv-heads 1 --head-dim 32 --rotary-dim 16 >/dev/null && "
             "cp '%s/text/minimax/tokenizer.json' '%s/text/minimax/tokenizer_config.json' "
             "'%s/text/chat/models/minimax_m2/chat_template.jinja' '%s/' && "
             "printf '{\"bos_token_id\": 200034, \"eos_token_id\": [200020]}\\n' > '%s/generation_config.json' && "
             "sed -i 's/\"eos_token_id\": [0-9]*/\"eos_token_id\": 200020/; s/\"bos_token_id\": [0-9]*/\"bos_token_id\": 200034/' "
             "'%s/config.json'",
             MOERUN, g_model, MR_TEST_DATA, MR_TEST_DATA, MR_TEST_DATA, g_model, g_model, g_model);
    if (system(cmd)) return -1;
    if (mr_tokenizer_load(g_model, &g_tok)) return -1;
    const char *args[] = {"--model", g_model, "--context-length", "1024", "--max-running-requests", "8",
                          "--kv-cache-dtype", "fp32", "--debug-forced-output", NULL};
    return srv_start_logged(&g_srv, args);
}

static int teardown(void **st) {
    (void)st;
    if (srv_stop_clean(&g_srv)) return -1;
    mr_tokenizer_free(g_tok);
    tu_rmtree(g_dir);
    free(g_dir);
    curl_global_cleanup();
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenize_golden), cmocka_unit_test(test_chat_template_golden),
        cmocka_unit_test(test_completion_text), cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_chat_reasoning),  cmocka_unit_test(test_chat_tool_calls),
        cmocka_unit_test(test_chat_multiturn),  cmocka_unit_test(test_chat_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
