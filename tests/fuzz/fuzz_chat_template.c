/* fuzz_chat_template.c — libFuzzer target for the Jinja chat-template
 * interpreter: the input is template source, parsed and (when it parses)
 * rendered against a small chat context under tight limits. Checks what the
 * API promises: a failure leaves no output and an error message that names
 * the template; a success is NUL-terminated text within the output limit.
 * A crash, a leak, a hang (libFuzzer's -timeout) or a stack overflow from a
 * hostile template is a bug. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moerun/chat.h"

#define CHECK(x)               \
    do {                       \
        if (!(x)) abort();     \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static json_t *vars;

static void init_vars(void) {
    vars = json_loads(
        "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true, \"messages\": ["
        "{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"h\\u00e9llo \\ud83d\\ude00\"},"
        "{\"role\": \"assistant\", \"content\": null, \"reasoning_content\": \"think\", \"tool_calls\": [{\"id\": \"c1\","
        "\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [true, null]}}}]},"
        "{\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": [{\"type\": \"text\", \"text\": \"ok\"}]}],"
        "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\","
        "\"properties\": {\"a\": {\"type\": \"integer\"}}}}}]}",
        0, NULL);
    CHECK(vars);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!vars) init_vars();
    mr_chat_template *t = (mr_chat_template *)&t;
    mr_status s = mr_chat_template_parse((const char *)data, size, "fuzz", &t);
    if (s) {
        CHECK(t == NULL);
        CHECK(strstr(mr_error_last(), "fuzz") || s == MR_ENOMEM);
        return 0;
    }
    mr_chat_limits lim;
    mr_chat_limits_default(&lim);
    lim.max_output_bytes = 1 << 20;
    lim.max_memory_bytes = 32 << 20;
    lim.max_steps = 200000;
    lim.max_depth = 200;
    lim.now_unix = 1741944413;
    char *out = (char *)&out;
    size_t n = 12345;
    s = mr_chat_template_render(t, vars, &lim, &out, &n);
    if (s) {
        CHECK(out == NULL && n == 0);
        CHECK(strlen(mr_error_last()) > 0);
    } else {
        CHECK(out != NULL);
        CHECK(n <= lim.max_output_bytes);
        CHECK(out[n] == 0);
        mr_free(out);
    }
    mr_chat_template_free(t);
    return 0;
}
