/* fuzz_chat_parse.c — libFuzzer target for the streaming reasoning / tool-
 * call parser. The first input byte picks the options and a cut stride; the
 * rest is model output, fed once whole and once in pieces. Checks: both
 * runs give the same message; every tool call's arguments parse as a JSON
 * object; every delta is valid UTF-8 (it converts to JSON). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moerun/chat.h"

#define CHECK(x)               \
    do {                       \
        if (!(x)) abort();     \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static json_t *tools;

static json_t *run(const mr_chat_parser_opts *o, const char *s, size_t n, size_t stride) {
    mr_chat_parser *p = NULL;
    CHECK(mr_chat_parser_new(o, &p) == MR_OK);
    const mr_chat_delta *d;
    size_t at = 0;
    while (at < n) {
        size_t k = stride ? stride : n;
        if (k > n - at) k = n - at;
        CHECK(mr_chat_parser_feed(p, s + at, k, &d) == MR_OK);
        json_t *j = mr_chat_delta_json(d);
        CHECK(j || (!d->reasoning_len && !d->content_len && !d->n_tools));
        json_decref(j);
        at += k;
        stride = stride ? (stride * 7 + 3) % 13 + 1 : 0;
    }
    CHECK(mr_chat_parser_finish(p, &d) == MR_OK);
    json_t *m = mr_chat_parser_message(p);
    CHECK(m);
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(m, "tool_calls"), i, c) {
        const char *args = json_string_value(json_object_get(json_object_get(c, "function"), "arguments"));
        CHECK(args);
        json_t *a = json_loads(args, JSON_ALLOW_NUL, NULL); /* \u0000 is valid JSON */
        CHECK(json_is_object(a));
        json_decref(a);
    }
    mr_chat_parser_free(p);
    return m;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tools) {
        tools = json_loads("[{\"name\": \"f\", \"parameters\": {\"properties\": {\"a\": {\"type\": \"string\"}, "
                           "\"n\": {\"type\": [\"integer\", \"null\"]}, \"o\": {\"type\": \"object\"}, "
                           "\"b\": {\"anyOf\": [{\"type\": \"boolean\"}, {\"type\": \"number\"}]}}}}]",
                           0, NULL);
        CHECK(tools);
    }
    if (size == 0) return 0;
    uint8_t flags = data[0];
    mr_chat_parser_opts o;
    mr_chat_parser_opts_default(&o, MR_CHAT_FORMAT_MINIMAX_M2);
    o.think_open = flags & 1;
    o.reasoning = !(flags & 2);
    o.tool_calls = !(flags & 4);
    o.tools = (flags & 8) ? NULL : tools;
    o.id_seed = 42;
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    json_t *whole = run(&o, s, n, 0);
    json_t *cut = run(&o, s, n, 1 + (flags >> 4));
    CHECK(json_equal(whole, cut));
    json_decref(whole);
    json_decref(cut);
    return 0;
}
