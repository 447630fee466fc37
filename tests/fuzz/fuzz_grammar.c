/* fuzz_grammar.c — libFuzzer target for structured outputs: the input is
 * a JSON schema (or a JSON string: a regex; or text that is not JSON: an
 * EBNF grammar; or an object with "structures" or "format": a structural
 * tag; or an array: tools, as MiniMax-M2's strict tool calls, forced ones
 * (tool_choice required) when its text's length is odd), a NUL byte, then
 * output bytes. The grammar compiles or is
 * refused with MR_EINVAL (never a crash); a compiled grammar's matcher takes
 * the bytes one at a time. Checks: a refused byte leaves the matcher as it
 * was (the next byte behaves the same as from a fresh matcher fed the
 * accepted bytes); whenever the matcher says complete on a JSON grammar,
 * jansson parses the accepted bytes; the token mask over a small vocabulary
 * of bytes allows exactly the bytes that feeding takes (none when it says -1:
 * the parse went past the matcher's limits). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moerun/grammar.h"

#define CHECK(x)               \
    do {                       \
        if (!(x)) abort();     \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static mr_vocab_index *vix; /* id 0: the end token; id b (1..255): the byte b */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!vix) {
        static char bytes[256];
        static const char *b[256];
        static size_t len[256];
        for (int i = 1; i < 256; i++) bytes[i] = (char)i, b[i] = &bytes[i], len[i] = 1;
        CHECK(mr_vocab_index_from_bytes(b, len, NULL, 256, &vix) == MR_OK);
    }
    const uint8_t *nul = memchr(data, 0, size);
    size_t ns = nul ? (size_t)(nul - data) : size;
    json_t *schema = json_loadb((const char *)data, ns, JSON_DECODE_ANY, NULL);
    mr_grammar *g = NULL;
    const bool tags = json_object_get(schema, "structures") || json_object_get(schema, "format");
    const bool xml = json_is_array(schema);
    const bool regex = !schema || json_is_string(schema) || tags || xml; /* a JSON string: a regex grammar; not JSON: EBNF */
    mr_status st;
    if (xml) {
        st = ns & 1 ? mr_grammar_minimax_forced(schema, NULL, (int)(ns & 2) >> 1, &g) : mr_grammar_minimax_tools(schema, 0, &g);
    } else if (tags) {
        st = mr_grammar_structural_tag(schema, &g);
    } else if (!schema) {
        char *text = malloc(ns + 1);
        memcpy(text, data, ns);
        text[ns] = 0;
        st = mr_grammar_ebnf(text, &g);
        free(text);
    } else {
        st = json_is_string(schema) ? mr_grammar_regex(json_string_value(schema), &g) : mr_grammar_json_schema(schema, &g);
    }
    json_decref(schema);
    CHECK(st == MR_OK || st == MR_EINVAL);
    if (st) return 0;
    int32_t end = 0;
    mr_matcher_opts o = {.end_ids = &end, .n_end = 1};
    mr_matcher *m = NULL;
    CHECK(mr_matcher_new(g, vix, &o, &m) == MR_OK);
    const char *out = nul ? (const char *)nul + 1 : "";
    size_t n = nul ? size - ns - 1 : 0;
    char *acc = malloc(n + 1);
    size_t na = 0;
    uint32_t allow[8];
    for (size_t i = 0; i < n && i < 4096; i++) {
        uint8_t c = (uint8_t)out[i];
        if (c == 0) continue;
        const int64_t count = i % 16 == 0 ? mr_matcher_mask(m, allow) : 0;
        bool ok = mr_matcher_feed(m, &out[i], 1);
        /* a mask of -1 (an EBNF parse past the limits at some byte: the engine ends the request) allows nothing,
         * though a byte whose own step stays within them may still feed */
        if (i % 16 == 0) CHECK(count < 0 ? !(allow[c >> 5] >> (c & 31) & 1) : ok == (bool)(allow[c >> 5] >> (c & 31) & 1));
        /* a JSON schema's output can always go on or end: no dead end */
        if (i % 16 == 0 && !regex && !xml) CHECK(count != 0);
        if (ok) acc[na++] = (char)c;
        if (mr_matcher_complete(m) && !regex) {
            json_t *x = json_loadb(acc, na, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
            /* jansson holds no numbers beyond int64 / double: those are JSON it refuses */
            if (!x) {
                bool digits = false;
                for (size_t k = 0; k < na; k++) digits |= acc[k] >= '0' && acc[k] <= '9';
                CHECK(digits);
            }
            json_decref(x);
        }
    }
    free(acc);
    mr_matcher_free(m);
    mr_grammar_free(g);
    return 0;
}
