/* test_serve.c — the server's pieces without a socket: the request parser
 * (every refusal names its field, with the right status), the stop-string
 * matcher (against a brute-force search over random texts fed in random
 * pieces), the JSON string writer (jansson reads back what it wrote),
 * percentiles (numpy's values, worked by hand), the metrics text
 * (names, labels, cumulative buckets), and the Responses API's store of
 * responses (against a model of its least-recently-used rule). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_internal.h"
#include "testutil.h"

static const sv_limits LIM = {.max_completion_tokens = 1000, .max_choices = 8, .vocab = 512};

static void expect_ok(sv_kind k, const char *body, sv_request *r) {
    sv_error e = {0};
    int rc = sv_request_parse(k, body, strlen(body), &LIM, r, &e);
    if (rc) fprintf(stderr, "unexpected refusal of %s: %d %s [%s]\n", body, e.http, e.message, e.param);
    assert_int_equal(rc, 0);
}

static void test_parse_fields(void **st) {
    (void)st;
    sv_request r;
    expect_ok(SV_COMPLETIONS,
              "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":-1,"
              "\"min_p\":0.05,\"seed\":-3,\"stop\":[\"a\",\"bc\"],\"stop_token_ids\":[5,6],\"ignore_eos\":true,\"n\":2,"
              "\"best_of\":1,\"stream\":true,\"stream_options\":{\"include_usage\":true},\"logprobs\":null,\"echo\":false,"
              "\"presence_penalty\":0,\"frequency_penalty\":0.0,\"repetition_penalty\":1.0,\"logit_bias\":{},"
              "\"user\":\"u\",\"suffix\":\"\",\"skip_special_tokens\":false,\"include_stop_str_in_output\":true,"
              "\"min_tokens\":0}",
              &r);
    assert_false(r.logprobs);
    assert_true(r.repetition_penalty == 1.0f && r.presence_penalty == 0.0f);
    assert_string_equal(r.model, "m");
    assert_int_equal(r.n_prompts, 1);
    assert_string_equal(r.prompts[0].text, "hi");
    assert_int_equal(r.max_tokens, 7);
    assert_true(r.has_temperature && fabsf(r.temperature - 0.5f) < 1e-6f);
    assert_true(r.has_top_k && r.top_k == 0);
    assert_true(r.has_seed && r.seed == (uint64_t)-3);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[1], "bc");
    assert_int_equal(r.n_stop_ids, 2);
    assert_int_equal(r.stop_ids[1], 6);
    assert_true(r.ignore_eos && r.stream && r.include_usage && !r.skip_special_tokens && r.include_stop_str);
    assert_int_equal(r.n, 2);
    sv_request_free(&r);
    /* logit_bias (token ids as decimal strings) and min_tokens */
    expect_ok(SV_COMPLETIONS, "{\"prompt\":\"a\",\"logit_bias\":{\"5\":-100,\"0\":2.5,\"511\":100},\"min_tokens\":3}", &r);
    assert_int_equal(r.n_logit_bias, 3);
    assert_int_equal(r.min_tokens, 3);
    bool seen5 = false, seen0 = false, seen511 = false;
    for (int i = 0; i < 3; i++) {
        seen5 |= r.logit_bias[i].token == 5 && r.logit_bias[i].bias == -100.0f;
        seen0 |= r.logit_bias[i].token == 0 && r.logit_bias[i].bias == 2.5f;
        seen511 |= r.logit_bias[i].token == 511 && r.logit_bias[i].bias == 100.0f;
    }
    assert_true(seen5 && seen0 && seen511);
    sv_request_free(&r);
    expect_ok(SV_CHAT,
              "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"allowed_token_ids\":[3,4,3],"
              "\"bad_words\":[\"a b\",\" c\"],\"truncate_prompt_tokens\":-1}",
              &r);
    assert_int_equal(r.n_allowed, 3);
    assert_int_equal(r.allowed[2], 3);
    assert_int_equal(r.n_bad_words, 2);
    assert_string_equal(r.bad_words[1], " c");
    assert_int_equal(r.truncate_prompt_tokens, -1);
    sv_request_free(&r);
    /* integral reals are integers; lists of prompts */
    expect_ok(SV_COMPLETIONS, "{\"prompt\":[[1,2],[3]],\"max_tokens\":16.0}", &r);
    assert_int_equal(r.n_prompts, 2);
    assert_int_equal(r.prompts[1].n_ids, 1);
    assert_int_equal(r.prompts[1].ids[0], 3);
    assert_int_equal(r.max_tokens, 16);
    sv_request_free(&r);
    /* echo with logprobs, and max_tokens 0 with echo (the prompt alone, as vLLM) */
    expect_ok(SV_COMPLETIONS, "{\"prompt\":\"a\",\"logprobs\":2,\"echo\":true,\"max_tokens\":0}", &r);
    assert_true(r.echo && r.logprobs && r.top_logprobs == 2 && r.max_tokens == 0);
    sv_request_free(&r);
    expect_ok(SV_COMPLETIONS,
              "{\"prompt\":[1],\"logprobs\":3,\"presence_penalty\":0.5,\"frequency_penalty\":-1,"
              "\"repetition_penalty\":1.3}",
              &r);
    assert_true(r.logprobs && r.top_logprobs == 3);
    assert_true(r.presence_penalty == 0.5f && r.frequency_penalty == -1.0f && fabsf(r.repetition_penalty - 1.3f) < 1e-6f);
    sv_request_free(&r);
    expect_ok(SV_COMPLETIONS, "{\"prompt\":[\"a\",\"b\",\"c\"]}", &r);
    assert_int_equal(r.n_prompts, 3);
    assert_int_equal(r.max_tokens, -1);
    sv_request_free(&r);
    /* chat: messages normalized (developer -> system, null keys dropped, arguments parsed) */
    expect_ok(SV_CHAT,
              "{\"messages\":[{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\","
              "\"text\":\"b\"}]},{\"role\":\"user\",\"content\":\"q\",\"name\":null},{\"role\":\"assistant\","
              "\"content\":null,\"refusal\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{"
              "\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":"
              "\"2\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}],"
              "\"tool_choice\":\"auto\",\"max_completion_tokens\":9,\"logprobs\":false,\"top_logprobs\":0,"
              "\"response_format\":{\"type\":\"text\"},\"parallel_tool_calls\":true,\"chat_template_kwargs\":{}}",
              &r);
    assert_int_equal(json_array_size(r.messages), 4);
    json_t *m0 = json_array_get(r.messages, 0);
    assert_string_equal(json_string_value(json_object_get(m0, "role")), "system");
    json_t *parts = json_object_get(m0, "content"); /* the template gets the parts */
    assert_int_equal(json_array_size(parts), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(parts, 1), "text")), "b");
    assert_null(json_object_get(json_array_get(r.messages, 1), "name"));
    json_t *call = json_array_get(json_object_get(json_array_get(r.messages, 2), "tool_calls"), 0);
    json_t *args = json_object_get(json_object_get(call, "function"), "arguments");
    assert_true(json_is_object(args));
    assert_int_equal(json_integer_value(json_object_get(args, "x")), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(r.messages, 2), "content")), "");
    assert_non_null(r.tools);
    assert_int_equal(r.max_tokens, 9);
    sv_request_free(&r);
}

typedef struct {
    sv_kind k;
    const char *body;
    int http;
    const char *param; /* "" = none */
    const char *msg;   /* a substring of the message */
} bad_case;

static const bad_case bad[] = {
    {SV_COMPLETIONS, "{\"prompt\":", 400, "", "not valid JSON"},
    {SV_COMPLETIONS, "", 400, "", "not valid JSON"},
    {SV_COMPLETIONS, "{\"lp\\\xd1\xa4", 400, "", "not valid JSON"}, /* the message quotes invalid UTF-8 */
    {SV_COMPLETIONS, "{\"\xff\":1}", 400, "", "not valid JSON"},
    {SV_COMPLETIONS, "[1,2]", 400, "", "must be a JSON object"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"prompt\":\"b\"}", 400, "", "duplicate"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"foo\":1}", 400, "foo", "unknown field 'foo'"},
    {SV_COMPLETIONS, "{\"max_tokens\":3}", 400, "prompt", "prompt is required"},
    {SV_COMPLETIONS, "{\"prompt\":[]}", 400, "prompt", "empty list"},
    {SV_COMPLETIONS, "{\"prompt\":5}", 400, "prompt", "got an integer"},
    {SV_COMPLETIONS, "{\"prompt\":[1,\"a\"]}", 400, "prompt[1]", "token id"},
    {SV_COMPLETIONS, "{\"prompt\":[[1,2],[]]}", 400, "prompt[1]", "empty list"},
    {SV_COMPLETIONS, "{\"prompt\":[\"a\",[1]]}", 400, "prompt[1]", "must be a string"},
    {SV_COMPLETIONS, "{\"prompt\":[-1]}", 400, "prompt[0]", "outside the vocabulary"},
    {SV_COMPLETIONS, "{\"prompt\":[512]}", 400, "prompt[0]", "outside the vocabulary [0, 512)"},
    {SV_COMPLETIONS, "{\"prompt\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]}", 400, "prompt", "at most 8"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":\"16\"}", 400, "max_tokens", "must be an integer, got a string"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":1.5}", 400, "max_tokens", "must be an integer"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":0}", 400, "max_tokens", "must be in"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":1001}", 400, "max_tokens", "--max-completion-tokens"},
    /* a negative count gets this server's range, not the integer type's */
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":-5}", 400, "max_tokens", "is -5; it must be in [1, 1000]"},
    {SV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":-1}", 400,
     "max_completion_tokens", "is -1; it must be in [1, 1000]"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"temperature\":2.5}", 400, "temperature", "[0, 2]"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"temperature\":true}", 400, "temperature", "must be a number"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"top_p\":0}", 400, "top_p", "(0, 1]"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"top_p\":1.01}", 400, "top_p", "(0, 1]"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"top_k\":-2}", 400, "top_k", "must be in"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"min_p\":1.5}", 400, "min_p", "[0, 1]"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"seed\":\"x\"}", 400, "seed", "must be an integer"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"n\":0}", 400, "n", "must be in"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"n\":9}", 400, "n", "must be in [1, 8]"},
    {SV_COMPLETIONS, "{\"prompt\":[\"a\",\"b\",\"c\"],\"n\":3}", 400, "n", "9 choices"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"best_of\":2}", 400, "best_of", "not supported"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"stop\":5}", 400, "stop", "string or a list"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"stop\":[\"x\",3]}", 400, "stop[1]", "must be a string"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"stop\":\"\"}", 400, "stop", "empty stop string"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\","
                     "\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}",
     400, "stop", "at most 16"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"stop_token_ids\":[600]}", 400, "stop_token_ids[0]", "outside the vocabulary"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"stop_token_ids\":7}", 400, "stop_token_ids", "list"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"ignore_eos\":1}", 400, "ignore_eos", "must be a boolean"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"stream\":\"yes\"}", 400, "stream", "must be a boolean"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":true}}", 400, "stream_options", "stream: true"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"stream\":true,\"stream_options\":{\"foo\":1}}", 400, "stream_options.foo", "unknown"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"stream\":true,\"stream_options\":{\"include_usage\":1}}", 400,
     "stream_options.include_usage", "boolean"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"frequency_penalty\":3}", 400, "frequency_penalty", "[-2, 2]"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"repetition_penalty\":0}", 400, "repetition_penalty", "(0, 10]"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"repetition_penalty\":11}", 400, "repetition_penalty", "(0, 10]"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"logit_bias\":[]}", 400, "logit_bias", "must be an object"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"logit_bias\":{\"5\":100.5}}", 400, "logit_bias[5]", "[-100, 100]"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"logit_bias\":{\"5\":\"1\"}}", 400, "logit_bias[5]", "must be a number"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"logit_bias\":{\"512\":1}}", 400, "logit_bias[512]", "outside the vocabulary"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"logit_bias\":{\"-1\":1}}", 400, "logit_bias[-1]", "decimal digits"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"logit_bias\":{\"the\":1}}", 400, "logit_bias[the]", "decimal digits"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"logit_bias\":{\"\":1}}", 400, "logit_bias[]", "decimal digits"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"logit_bias\":{\"99999999999999999999\":1}}", 400, "logit_bias[99999999999999999999]", "at most 10"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"suffix\":\"x\"}", 400, "suffix", "not supported"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"allowed_token_ids\":[]}", 400, "allowed_token_ids", "empty list"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"allowed_token_ids\":[1,512]}", 400, "allowed_token_ids[1]", "outside the vocabulary"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"allowed_token_ids\":[\"1\"]}", 400, "allowed_token_ids[0]", "an integer"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"allowed_token_ids\":5}", 400, "allowed_token_ids", "must be a list"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"bad_words\":\"x\"}", 400, "bad_words", "must be a list"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"bad_words\":[\"x\",\"\"]}", 400, "bad_words[1]", "empty string"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"bad_words\":[7]}", 400, "bad_words[0]", "must be a string"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"truncate_prompt_tokens\":0}", 400, "truncate_prompt_tokens", ">= 1, or -1"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"truncate_prompt_tokens\":-2}", 400, "truncate_prompt_tokens", "must be in"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"min_tokens\":-1}", 400, "min_tokens", "must be in"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"min_tokens\":1.5}", 400, "min_tokens", "must be an integer"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"user\":5}", 400, "user", "string"},
    {SV_COMPLETIONS, "{\"messages\":[]}", 400, "messages", "use /v1/chat/completions"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"tools\":[]}", 400, "tools", "unknown field"},
    {SV_CHAT, "{\"prompt\":\"a\"}", 400, "prompt", "chat takes messages"},
    {SV_CHAT, "{}", 400, "messages", "messages is required"},
    {SV_CHAT, "{\"messages\":[]}", 400, "messages", "empty list"},
    {SV_CHAT, "{\"messages\":{}}", 400, "messages", "must be a list"},
    {SV_CHAT, "{\"messages\":[5]}", 400, "messages[0]", "must be an object"},
    {SV_CHAT, "{\"messages\":[{\"content\":\"x\"}]}", 400, "messages[0].role", "required"},
    {SV_CHAT, "{\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}", 400, "messages[0].role", "robot"},
    {SV_CHAT, "{\"messages\":[{\"role\":\"user\"}]}", 400, "messages[0].content", "required"},
    {SV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":7}]}", 400, "messages[0].content", "string or a list"},
    {SV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}", 400,
     "messages[0].content[0]", "text only"},
    {SV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"mood\":\"happy\"}]}", 400, "messages[0].mood",
     "unknown field"},
    {SV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[]}]}", 400, "messages[0].tool_calls",
     "unknown field"},
    {SV_CHAT, "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"{x\"}}]}]}",
     400, "messages[0].tool_calls[0]", "not valid JSON"},
    {SV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"f\"}]}", 400, "tools[0]",
     "must be \"function\""},
    {SV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{}}]}",
     400, "tools[0]", "name is required"},
    {SV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\"}", 400, "tool_choice",
     "needs tools"},
    {SV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"function\"}}", 400,
     "tool_choice.function.name", "names a function"},
    {SV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"xml\"}}", 400,
     "response_format.type", "json_schema"},
    {SV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\","
              "\"json_schema\":{\"schema\":{\"type\":\"string\",\"format\":\"iri\"}}}}", 400,
     "response_format.json_schema.schema", "#/format"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"guided_json\":{\"type\":\"object\"},\"guided_choice\":[\"a\"]}", 400,
     "guided_choice", "give one"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"guided_choice\":[]}", 400, "guided_choice", "non-empty"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"guided_json\":\"{not json\"}", 400, "guided_json", "not a JSON schema"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"structured_outputs\":{\"structural_tag\":\"{}\"}}", 400,
     "structured_outputs.structural_tag", "structures: must be a non-empty list of tags"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"structural_tag\":7}", 400, "structural_tag", "must be a structural tag"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"response_format\":{\"type\":\"structural_tag\",\"format\":{\"type\":\"or\"}}}",
     400, "response_format", "format/type: a format of type \"or\" is not supported"},
    {SV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":"
     "{\"name\":\"a<b\",\"strict\":true,\"parameters\":{\"type\":\"object\",\"properties\":{}}}}]}", 400, "tools",
     "tools/0/function/name: a tool name without"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"structured_outputs\":{\"grammar\":\"root ::= b\"}}", 400,
     "structured_outputs.grammar", "line 1 column 10: rule \"b\" is not defined"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"guided_grammar\":[\"root\"]}", 400, "guided_grammar", "must be a string"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"ebnf\":\"root ::= \\\"a\\\"\",\"regex\":\"a\"}", 400, "regex", "give one"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"structured_outputs\":{\"regex\":\"(a)\\\\1\"}}", 400,
     "structured_outputs.regex", "backreferences"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"guided_regex\":\"a)|(b\"}", 400, "guided_regex", "regex"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"regex\":7}", 400, "regex", "must be a string"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"regex\":\"a+\",\"guided_choice\":[\"a\"]}", 400, "guided_choice", "give one"},
    {SV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", 400, "top_logprobs", "needs logprobs"},
    {SV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}", 400,
     "top_logprobs", "[0, 20]"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"logprobs\":21}", 400, "logprobs", "[0, 20]"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"logprobs\":true}", 400, "logprobs", "integer"},
    {SV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}", 400, "max_tokens", "only with echo"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"repetition_penalty\":11}", 400, "repetition_penalty", "must be in"},
    {SV_COMPLETIONS, "{\"prompt\":\"a\",\"stop_token_ids\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}", 400,
     "stop_token_ids", "at most 16"},
    {SV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":0}", 400,
     "max_completion_tokens", "must be in"},
    {SV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"echo\":true}", 400, "echo", "unknown field"},
    {SV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"continue_final_message\":true,"
              "\"add_generation_prompt\":true}", 400, "continue_final_message", "both true"},
    {SV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"continue_final_message\":1}", 400,
     "continue_final_message", "boolean"},
};

static void test_parse_refusals(void **st) {
    (void)st;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sv_request r;
        sv_error e = {0};
        int rc = sv_request_parse(bad[i].k, bad[i].body, strlen(bad[i].body), &LIM, &r, &e);
        if (rc != -1 || e.http != bad[i].http || strcmp(e.param, bad[i].param) || !strstr(e.message, bad[i].msg)) {
            fprintf(stderr, "case %zu %s\n  got rc %d http %d param [%s] message: %s\n  want http %d param [%s] ~ %s\n", i,
                    bad[i].body, rc, e.http, e.param, e.message, bad[i].http, bad[i].param, bad[i].msg);
            fail();
        }
        /* the error body is the section-3 shape */
        char *b = sv_error_body(&e);
        json_error_t je;
        json_t *o = json_loads(b, 0, &je);
        json_t *er = json_object_get(o, "error");
        assert_non_null(json_string_value(json_object_get(er, "message")));
        assert_string_equal(json_string_value(json_object_get(er, "type")), "invalid_request_error");
        assert_int_equal(json_integer_value(json_object_get(er, "code")), 400);
        if (bad[i].param[0]) assert_string_equal(json_string_value(json_object_get(er, "param")), bad[i].param);
        else assert_true(json_is_null(json_object_get(er, "param")));
        json_decref(o);
        free(b);
    }
}

static void test_parse_depth(void **st) {
    (void)st;
    char body[4096];
    int n = 0;
    n += snprintf(body + n, sizeof body - (size_t)n, "{\"prompt\":\"a\",\"logit_bias\":");
    for (int i = 0; i < 1000; i++) body[n++] = '[';
    body[n] = 0;
    sv_request r;
    sv_error e = {0};
    assert_int_equal(sv_request_parse(SV_COMPLETIONS, body, strlen(body), &LIM, &r, &e), -1);
    assert_non_null(strstr(e.message, "nests deeper"));
    /* brackets inside strings do not count */
    const char *ok = "{\"prompt\":\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\\\"[[[[\"}";
    assert_int_equal(sv_request_parse(SV_COMPLETIONS, ok, strlen(ok), &LIM, &r, &e), 0);
    sv_request_free(&r);
}

/* ---- stop strings ---- */

/* Brute force: the occurrence of any stop string in t[0..n) that ends first
 * (generation reaches it first); ties: the one that starts earlier. */
static bool ref_first_stop(const char *t, size_t n, char **stops, int ns, size_t *at, size_t *end) {
    bool found = false;
    for (size_t e = 1; e <= n && !found; e++)
        for (int i = 0; i < ns; i++) {
            size_t L = strlen(stops[i]);
            if (L <= e && !memcmp(t + e - L, stops[i], L) && (!found || e - L < *at)) {
                *at = e - L;
                *end = e;
                found = true;
            }
        }
    return found;
}

static void test_stop_strings(void **st) {
    (void)st;
    tu_rng g = {12345};
    for (int trial = 0; trial < 20000; trial++) {
        char text[64];
        size_t n = 1 + tu_next(&g) % 60;
        for (size_t i = 0; i < n; i++) text[i] = "abc"[tu_next(&g) % 3];
        int ns = 1 + (int)(tu_next(&g) % 3);
        char sbuf[3][6];
        char *stops[3];
        for (int i = 0; i < ns; i++) {
            size_t L = 1 + tu_next(&g) % 5;
            for (size_t k = 0; k < L; k++) sbuf[i][k] = "abc"[tu_next(&g) % 3];
            sbuf[i][L] = 0;
            stops[i] = sbuf[i];
        }
        sv_stop sp;
        sv_stop_init(&sp, ns, stops);
        /* feed the text in random pieces, as tokens would, releasing what is safe */
        size_t have = 0, scanned = 0, sent = 0, cut = 0, cut_end = 0;
        bool stopped = false;
        while (have < n && !stopped) {
            have += 1 + tu_next(&g) % 4;
            if (have > n) have = n;
            size_t c, ce, safe;
            if (sv_stop_scan(&sp, text, have, scanned, &c, &ce, &safe)) {
                stopped = true;
                cut = c;
                cut_end = ce;
                assert_true(c >= sent); /* never retracts what was sent */
                sent = c;
            } else {
                assert_true(safe >= sent);
                assert_true(have - safe < sp.max_len); /* holds back less than the longest stop */
                /* what is held is the longest suffix that starts a stop string */
                size_t hold = have - safe, best = 0;
                for (int i = 0; i < ns; i++)
                    for (size_t k = 1; k < strlen(stops[i]) && k <= have; k++)
                        if (!memcmp(text + have - k, stops[i], k) && k > best) best = k;
                assert_int_equal(hold, best);
                sent = safe;
            }
            scanned = have;
        }
        size_t at = 0, end = 0;
        bool want = ref_first_stop(text, n, stops, ns, &at, &end);
        assert_int_equal(stopped, want);
        if (want) {
            assert_int_equal(cut, at);
            assert_int_equal(cut_end, end);
        } else {
            /* at the end everything held back is released: the whole text */
            assert_true(sent <= n);
        }
    }
}

/* ---- JSON strings ---- */

static void test_json_str(void **st) {
    (void)st;
    tu_rng g = {99};
    for (int trial = 0; trial < 5000; trial++) {
        unsigned char s[40];
        size_t n = tu_next(&g) % 40;
        bool ascii_only = trial % 2;
        for (size_t i = 0; i < n; i++) s[i] = (unsigned char)(ascii_only ? tu_next(&g) % 128 : tu_next(&g) % 256);
        sv_buf b = {0};
        assert_int_equal(sv_buf_json_str(&b, (const char *)s, n), 0);
        json_error_t je;
        json_t *v = json_loadb(b.p, b.len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!v) fprintf(stderr, "not JSON: %s (%s)\n", b.p, je.text);
        assert_non_null(v);
        assert_true(json_is_string(v));
        if (ascii_only) {
            assert_int_equal(json_string_length(v), n);
            assert_memory_equal(json_string_value(v), s, n);
        }
        json_decref(v);
        sv_buf_free(&b);
    }
    /* valid multi-byte text passes through; a lone continuation byte becomes U+FFFD */
    sv_buf b = {0};
    sv_buf_json_str(&b, "\xc3\xa9\xf0\x9f\x98\x80\x80", 7);
    assert_string_equal(b.p, "\"\xc3\xa9\xf0\x9f\x98\x80\xef\xbf\xbd\"");
    sv_buf_free(&b);
}

/* ---- percentiles (numpy.percentile, linear) ---- */

static void test_percentile(void **st) {
    (void)st;
    double a[] = {4, 1, 3, 2};
    assert_true(fabs(mr_percentile(a, 4, 50) - 2.5) < 1e-12);
    assert_true(fabs(mr_percentile(a, 4, 99) - 3.97) < 1e-12);
    double b[] = {50, 15, 40, 20, 35};
    assert_true(fabs(mr_percentile(b, 5, 40) - 29.0) < 1e-12);
    assert_true(fabs(mr_percentile(b, 5, 100) - 50.0) < 1e-12);
    assert_true(fabs(mr_percentile(b, 5, 0) - 15.0) < 1e-12);
    double c[] = {7};
    assert_true(fabs(mr_percentile(c, 1, 99) - 7.0) < 1e-12);
    assert_true(mr_percentile(NULL, 0, 50) == 0.0);
}

/* ---- arrival times: vLLM's --burstiness (gamma gaps) and sglang's Poisson process ---- */

/* The regularized lower incomplete gamma function P(a, x): its power series below a + 1, else 1 minus the
 * continued fraction of Q (Legendre's, evaluated by the modified Lentz method). */
static double gamma_p(double a, double x) {
    if (x <= 0) return 0.0;
    const double lead = exp(a * log(x) - x - lgamma(a));
    if (x < a + 1.0) {
        double term = 1.0 / a, sum = term;
        for (int n = 1; n < 10000 && fabs(term) > 1e-15 * fabs(sum); n++) sum += term *= x / (a + n);
        return sum * lead;
    }
    double b = x + 1.0 - a, c = 1e300, d = 1.0 / b, h = d;
    for (int n = 1; n < 10000; n++) {
        const double an = -n * (n - a);
        b += 2.0;
        d = an * d + b;
        d = fabs(d) < 1e-300 ? 1e-300 : d;
        c = b + an / c;
        c = fabs(c) < 1e-300 ? 1e-300 : c;
        d = 1.0 / d;
        const double del = d * c;
        h *= del;
        if (fabs(del - 1.0) < 1e-15) break;
    }
    return 1.0 - lead * h;
}

static int cmp_dbl(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Properties of Gamma(k, 1 / (rate k)) gaps: mean 1 / rate, squared coefficient of variation 1 / k (Poisson:
 * 1), over 200000 draws; times from 0, increasing; the same seed the same times; k 1 is the exponential of
 * the Poisson process (k 0 the same numbers). */
static void test_arrivals(void **st) {
    (void)st;
    enum { N = 200000 };
    double *t = malloc(N * sizeof *t), *u = malloc(N * sizeof *u);
    assert_non_null(t);
    assert_non_null(u);
    const double ks[] = {0.3, 1.0, 4.0, 25.0}, rate = 8.0;
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        mr_bench_arrivals(rate, ks[i], 7, N, t);
        assert_true(t[0] == 0.0);
        double s = 0, s2 = 0;
        for (int j = 1; j < N; j++) {
            const double g = t[j] - t[j - 1];
            assert_true(g >= 0.0 && isfinite(g));
            s += g;
            s2 += g * g;
        }
        const double mean = s / (N - 1), var = s2 / (N - 1) - mean * mean, cv2 = var / (mean * mean);
        if (fabs(mean * rate - 1.0) > 0.03 || fabs(cv2 * ks[i] - 1.0) > 0.1)
            fprintf(stderr, "burstiness %g: mean gap %g (want %g), cv^2 %g (want %g)\n", ks[i], mean, 1 / rate, cv2, 1 / ks[i]);
        assert_true(fabs(mean * rate - 1.0) <= 0.03);
        assert_true(fabs(cv2 * ks[i] - 1.0) <= 0.1);
        /* the whole distribution: Kolmogorov-Smirnov distance of the gaps (x rate k: Gamma(k, 1)) to the gamma
         * CDF, against 1.95 / sqrt(n) (the 0.1% critical value) */
        for (int j = 1; j < N; j++) u[j - 1] = (t[j] - t[j - 1]) * rate * ks[i];
        qsort(u, N - 1, sizeof *u, cmp_dbl);
        double ks_d = 0;
        for (int j = 0; j < N - 1; j++) {
            const double f = gamma_p(ks[i], u[j]), lo = f - (double)j / (N - 1), hi = (double)(j + 1) / (N - 1) - f;
            ks_d = fmax(ks_d, fmax(lo, hi));
        }
        if (ks_d > 1.95 / sqrt(N - 1)) fprintf(stderr, "burstiness %g: KS distance %g\n", ks[i], ks_d);
        assert_true(ks_d <= 1.95 / sqrt(N - 1));
        mr_bench_arrivals(rate, ks[i], 7, N, u);
        assert_memory_equal(t, u, N * sizeof *t);
    }
    mr_bench_arrivals(rate, 0.0, 7, 1000, t);
    mr_bench_arrivals(rate, 1.0, 7, 1000, u);
    assert_memory_equal(t, u, 1000 * sizeof *t);
    mr_bench_arrivals(rate, 1.0, 8, 1000, u);
    assert_true(memcmp(t, u, 1000 * sizeof *t) != 0);
    free(t);
    free(u);
}

/* ---- metrics text ---- */

static void test_metrics(void **st) {
    (void)st;
    sv_metrics m;
    sv_metrics_init(&m, "tiny\"model");
    pthread_mutex_lock(&m.mu);
    sv_hist_observe(&m.ttft, 0.0005);
    sv_hist_observe(&m.ttft, 0.003);
    sv_hist_observe(&m.ttft, 1e6);
    m.prompt_tokens = 42;
    m.success[SV_FR_LENGTH] = 3;
    m.step_ns[2] = 1500000000;
    pthread_mutex_unlock(&m.mu);
    char *t = sv_metrics_render(&m);
    static const char *const names[] = {
        "moerun:num_requests_running{", "moerun:num_requests_waiting{", "moerun:kv_cache_usage_perc{",
        "moerun:prompt_tokens_total{", "moerun:generation_tokens_total{", "moerun:request_success_total{",
        "moerun:num_preemptions_total{", "moerun:prefix_cache_queries_total{", "moerun:prefix_cache_hits_total{",
        "moerun:time_to_first_token_seconds_bucket{", "moerun:inter_token_latency_seconds_bucket{",
        "moerun:e2e_request_latency_seconds_bucket{", "moerun:request_queue_time_seconds_bucket{",
        "moerun:engine_steps_total{", "moerun:engine_step_seconds_total{"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (!strstr(t, names[i])) fprintf(stderr, "missing %s\n", names[i]);
        assert_non_null(strstr(t, names[i]));
    }
    assert_non_null(strstr(t, "moerun:prompt_tokens_total{model_name=\"tiny_model\"} 42\n"));
    assert_non_null(strstr(t, "moerun:engine_step_seconds_total{model_name=\"tiny_model\",phase=\"sample\"} 1.500000000\n"));
    assert_non_null(strstr(t, "moerun:request_success_total{model_name=\"tiny_model\",finished_reason=\"length\"} 3\n"));
    assert_non_null(strstr(t, "moerun:time_to_first_token_seconds_bucket{model_name=\"tiny_model\",le=\"0.001\"} 1\n"));
    assert_non_null(strstr(t, "moerun:time_to_first_token_seconds_bucket{model_name=\"tiny_model\",le=\"0.005\"} 2\n"));
    assert_non_null(strstr(t, "moerun:time_to_first_token_seconds_bucket{model_name=\"tiny_model\",le=\"640\"} 2\n"));
    assert_non_null(strstr(t, "moerun:time_to_first_token_seconds_bucket{model_name=\"tiny_model\",le=\"+Inf\"} 3\n"));
    assert_non_null(strstr(t, "moerun:time_to_first_token_seconds_count{model_name=\"tiny_model\"} 3\n"));
    /* every sample line: name{labels} value */
    for (char *l = t; *l; l = strchr(l, '\n') + 1) {
        if (*l != '#') {
            char *br = strchr(l, '}'), *nl = strchr(l, '\n');
            assert_non_null(br);
            assert_true(br < nl && br[1] == ' ');
        }
        if (!strchr(l, '\n')[1]) break;
    }
    mr_free(t);
    sv_metrics_free(&m);
}

/* The response store against a model of its rule, over random puts, gets and deletes: the entries held are
 * the most recently used ones whose sizes fit the bound (a put or get makes its entry the newest; an entry
 * alone over the bound is refused), every get gives back the texts put, and the byte count is the sum. */
typedef struct {
    int id, n_resp, n_items, n_input;
    uint64_t used;
} model_entry;

static size_t model_bytes(const model_entry *e) {
    char id[32];
    snprintf(id, sizeof id, "resp_%d", e->id);
    return strlen(id) + (size_t)e->n_resp + (size_t)e->n_items + 96; /* store.c's overhead per entry */
}

static char *text_of(int id, int n, char tag) {
    char *t = malloc((size_t)n + 1);
    for (int i = 0; i < n; i++) t[i] = (char)('a' + (id * 7 + i + tag) % 26);
    t[n] = 0;
    return t;
}

static void test_response_store(void **st) {
    (void)st;
    assert_null(sv_store_new(0, true));
    const size_t cap = 4096;
    sv_store *s = sv_store_new(cap, true);
    assert_non_null(s);
    model_entry held[64];
    int n_held = 0;
    uint64_t clock = 0, evicted = 0;
    srand(7);
    for (int step = 0; step < 20000; step++) {
        const int op = rand() % 10, id = rand() % 40;
        char key[32];
        snprintf(key, sizeof key, "resp_%d", id);
        int at = -1;
        for (int i = 0; i < n_held; i++)
            if (held[i].id == id) at = i;
        if (op < 5) { /* put: sizes now and then past the bound */
            model_entry e = {id, rand() % 1200, rand() % (rand() % 16 ? 900 : 5000), rand() % 9, ++clock};
            char *resp = text_of(id, e.n_resp, 'r'), *items = text_of(id, e.n_items, 'i');
            const int rc = sv_store_put(s, key, resp, items, e.n_input);
            free(resp), free(items);
            if (model_bytes(&e) > cap) {
                assert_int_equal(rc, 1);
                continue;
            }
            assert_int_equal(rc, 0);
            if (at >= 0) held[at] = held[--n_held];
            size_t bytes = model_bytes(&e);
            for (int i = 0; i < n_held; i++) bytes += model_bytes(&held[i]);
            while (bytes > cap) { /* the least recently used goes */
                int old = 0;
                for (int i = 1; i < n_held; i++)
                    if (held[i].used < held[old].used) old = i;
                bytes -= model_bytes(&held[old]);
                held[old] = held[--n_held];
                evicted++;
            }
            held[n_held++] = e;
        } else if (op < 9) { /* get */
            char *resp = NULL, *items = NULL;
            int n_input = -1;
            const int rc = sv_store_get(s, key, &resp, rand() % 2 ? &items : NULL, &n_input);
            assert_int_equal(rc, at >= 0 ? 0 : 1);
            if (at >= 0) {
                char *want = text_of(id, held[at].n_resp, 'r');
                assert_string_equal(resp, want);
                free(want);
                if (items) {
                    want = text_of(id, held[at].n_items, 'i');
                    assert_string_equal(items, want);
                    free(want);
                }
                assert_int_equal(n_input, held[at].n_input);
                held[at].used = ++clock;
            } else {
                assert_null(resp);
            }
            mr_free(resp), mr_free(items);
        } else {
            assert_int_equal(sv_store_delete(s, key), at >= 0);
            if (at >= 0) held[at] = held[--n_held];
        }
        int64_t count;
        size_t bytes, want = 0;
        uint64_t ev;
        sv_store_stats(s, &count, &bytes, &ev);
        for (int i = 0; i < n_held; i++) want += model_bytes(&held[i]);
        assert_int_equal(count, n_held);
        assert_int_equal(bytes, want);
        assert_true(bytes <= cap);
        assert_int_equal(ev, evicted);
    }
    assert_true(evicted > 100); /* the bound was reached often */
    sv_store_free(s);
}

/* The store without eviction (the Conversations API's) against a model of its rule: a put or an edit that
 * would pass the bound (counting the room reserved) is refused and nothing held changes (no entry is ever
 * dropped but by a delete); an edit with grow passes it, and one that does not grow its entry is taken over
 * the bound too; a reservation is taken where the bound has room for it; every get gives the text last put
 * or edited. */
typedef struct {
    char *text; /* NULL: not held */
} conv_entry;

static char *append_x(const char *old, void *arg, int *rc) {
    const int n = *(const int *)arg;
    if (n < 0) { /* the edit's own refusal: nothing changes */
        *rc = 7;
        return NULL;
    }
    char *t = mr_malloc(strlen(old) + (size_t)n + 1);
    memcpy(t, old, strlen(old));
    memset(t + strlen(old), 'x', (size_t)n);
    t[strlen(old) + (size_t)n] = 0;
    return t;
}

static void test_conversation_store(void **st) {
    (void)st;
    const size_t cap = 3000;
    sv_store *s = sv_store_new(cap, false);
    assert_non_null(s);
    conv_entry held[20] = {{0}};
    int refused = 0, passed = 0;
    size_t reserved = 0;
    srand(11);
    for (int step = 0; step < 20000; step++) {
        const int op = rand() % 10, id = rand() % 20;
        char key[32];
        snprintf(key, sizeof key, "conv_%02d", id); /* keys of one length */
        size_t bytes = 0;
        for (int i = 0; i < 20; i++)
            if (held[i].text) bytes += strlen(key) + strlen(held[i].text) + 96;
        if (op < 4) { /* put: refused past the bound, never evicting */
            const int n = rand() % 700;
            char *t = text_of(id, n, 'c');
            const size_t old = held[id].text ? strlen(key) + strlen(held[id].text) + 96 : 0, nb = strlen(key) + (size_t)n + 96;
            const int rc = sv_store_put(s, key, t, "", 0);
            if (nb > cap) assert_int_equal(rc, 1);
            else if (bytes + reserved - old + nb > cap) assert_int_equal(rc, 2), refused++;
            else assert_int_equal(rc, 0);
            if (!rc) free(held[id].text), held[id].text = t;
            else free(t);
        } else if (op < 7) { /* edit: grown by n, refused past the bound unless grow; fn may refuse itself */
            int n = rand() % 9 ? rand() % 300 : -1;
            const bool grow = rand() % 4 == 0;
            const int rc = sv_store_edit(s, key, grow, append_x, &n);
            if (!held[id].text) {
                assert_int_equal(rc, 1);
            } else if (n < 0) {
                assert_int_equal(rc, 7);
            } else if (n > 0 && bytes + reserved + (size_t)n > cap && !grow) { /* (one that does not grow is taken) */
                assert_int_equal(rc, 2);
                refused++;
            } else {
                assert_int_equal(rc, 0);
                passed += bytes + (size_t)n > cap;
                const size_t k = strlen(held[id].text);
                char *t = malloc(k + (size_t)n + 1);
                memcpy(t, held[id].text, k);
                memset(t + k, 'x', (size_t)n);
                t[k + (size_t)n] = 0;
                free(held[id].text);
                held[id].text = t;
            }
        } else if (op < 9) { /* get */
            char *t = NULL;
            assert_int_equal(sv_store_get(s, key, &t, NULL, NULL), held[id].text ? 0 : 1);
            if (held[id].text) assert_string_equal(t, held[id].text);
            mr_free(t);
        } else {
            assert_int_equal(sv_store_delete(s, key), held[id].text != NULL);
            free(held[id].text);
            held[id].text = NULL;
        }
        int64_t count, want_count = 0;
        size_t got, want = 0;
        uint64_t ev;
        sv_store_stats(s, &count, &got, &ev);
        for (int i = 0; i < 20; i++)
            if (held[i].text) want += strlen(key) + strlen(held[i].text) + 96, want_count++;
        assert_int_equal(count, want_count);
        assert_int_equal(got, want);
        assert_int_equal(ev, 0);
        if (step % 7 == 0) { /* room promised: counted against the bound until given back */
            const size_t n = (size_t)(rand() % 900);
            const bool ok = sv_store_reserve(s, n);
            assert_int_equal(ok, got + reserved + n <= cap);
            if (ok) reserved += n;
        } else if (step % 7 == 3 && reserved) {
            const size_t n = (size_t)(rand() % 900) % (reserved + 1);
            sv_store_unreserve(s, n);
            reserved -= n;
        }
    }
    assert_true(refused > 100 && passed > 10); /* the bound was met often, and passed by grown edits */
    /* claims: one holder at a time, given up only by it, gone with the entry */
    for (int i = 0; i < 20; i++) {
        char key[32];
        snprintf(key, sizeof key, "conv_%02d", i);
        sv_store_delete(s, key);
    }
    sv_store_unreserve(s, reserved);
    assert_int_equal(sv_store_put(s, "conv_c", "{}", "", 0), 0);
    assert_int_equal(sv_store_claim(s, "conv_c", "a"), 0);
    assert_int_equal(sv_store_claim(s, "conv_c", "b"), 2);
    sv_store_unclaim(s, "conv_c", "b");
    assert_int_equal(sv_store_claim(s, "conv_c", "b"), 2);
    sv_store_unclaim(s, "conv_c", "a");
    assert_int_equal(sv_store_claim(s, "conv_c", "b"), 0);
    assert_true(sv_store_delete(s, "conv_c"));
    assert_int_equal(sv_store_claim(s, "conv_c", "b"), 1);
    for (int i = 0; i < 20; i++) free(held[i].text);
    sv_store_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_response_store),
        cmocka_unit_test(test_conversation_store),
        cmocka_unit_test(test_parse_fields), cmocka_unit_test(test_parse_refusals), cmocka_unit_test(test_parse_depth),
        cmocka_unit_test(test_stop_strings), cmocka_unit_test(test_json_str),       cmocka_unit_test(test_percentile), cmocka_unit_test(test_arrivals),
        cmocka_unit_test(test_metrics),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
