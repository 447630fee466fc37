/* test_chat_template.c — the Jinja interpreter and apply_chat_template
 * against goldens that transformers + jinja2 rendered
 * (tools/golden/gen_chat.py): byte-exact output, or an error naming the
 * same template line. Plus what the goldens cannot show: limits that stop
 * hostile templates, allocation failures, model-folder errors, and the
 * render being thread-safe. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "moerun/chat.h"
#include "testutil.h"

static json_t *load_json(const char *rel) {
    json_error_t e;
    json_t *j = json_load_file(tu_data(rel), 0, &e);
    if (!j) fprintf(stderr, "%s: line %d: %s\n", rel, e.line, e.text);
    assert_non_null(j);
    return j;
}

static void show_diff(const char *name, const char *want, size_t wn, const char *got, size_t gn) {
    size_t i = 0;
    while (i < wn && i < gn && want[i] == got[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "  %s: output differs at byte %zu (want %zu bytes, got %zu)\n    want: ", name, i, wn, gn);
    for (size_t k = from; k < wn && k < i + 40; k++) fputc(want[k] == '\n' ? '|' : want[k], stderr);
    fprintf(stderr, "\n    got:  ");
    for (size_t k = from; k < gn && k < i + 40; k++) fputc(got[k] == '\n' ? '|' : got[k], stderr);
    fprintf(stderr, "\n");
}

static mr_chat_limits golden_limits(const json_t *g) {
    mr_chat_limits lim;
    mr_chat_limits_default(&lim);
    lim.now_unix = json_integer_value(json_object_get(g, "now_unix"));
    return lim;
}

static void test_jinja_goldens(void **st) {
    (void)st;
    setenv("TZ", "UTC", 1);
    tzset();
    json_t *g = load_json("text/chat/golden_jinja.json");
    mr_chat_limits lim = golden_limits(g);
    json_t *cases = json_object_get(g, "cases");
    size_t i, failed = 0;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        const char *src = json_string_value(json_object_get(c, "template"));
        const json_t *want = json_object_get(c, "output");
        mr_chat_template *t = NULL;
        char *out = NULL;
        size_t n = 0;
        mr_status s = mr_chat_template_parse(src, strlen(src), name, &t);
        if (!s) s = mr_chat_template_render(t, json_object_get(c, "vars"), &lim, &out, &n);
        if (want) {
            if (s) {
                fprintf(stderr, "  %s: failed: %s\n", name, mr_error_last());
                failed++;
            } else if (n != json_string_length(want) || memcmp(out, json_string_value(want), n)) {
                show_diff(name, json_string_value(want), json_string_length(want), out, n);
                failed++;
            }
        } else {
            const json_t *line = json_object_get(c, "line");
            char tag[32] = "";
            if (json_is_integer(line)) snprintf(tag, sizeof tag, "line %d:", (int)json_integer_value(line));
            if (!s) {
                fprintf(stderr, "  %s: rendered, but jinja2 fails (%s)\n", name,
                        json_string_value(json_object_get(c, "error")));
                failed++;
            } else if (s != MR_EINPUT && s != MR_ECAPACITY) {
                fprintf(stderr, "  %s: wrong status %s (%s)\n", name, mr_status_name(s), mr_error_last());
                failed++;
            } else if (tag[0] && !strstr(mr_error_last(), tag)) {
                fprintf(stderr, "  %s: error does not name %s: %s\n    (jinja2: %s)\n", name, tag, mr_error_last(),
                        json_string_value(json_object_get(c, "error")));
                failed++;
            }
        }
        mr_free(out);
        mr_chat_template_free(t);
    }
    fprintf(stderr, "jinja goldens: %zu cases, %zu failed\n", json_array_size(cases), failed);
    json_decref(g);
    assert_int_equal(failed, 0);
}

static void test_chat_goldens(void **st) {
    (void)st;
    setenv("TZ", "UTC", 1);
    tzset();
    json_t *g = load_json("text/chat/golden_chat.json");
    mr_chat_limits lim = golden_limits(g);
    json_t *cases = json_object_get(g, "cases");
    size_t i, failed = 0;
    json_t *c;
    json_array_foreach(cases, i, c) {
        char dir[512], name[160];
        const char *model = json_string_value(json_object_get(c, "model"));
        snprintf(dir, sizeof dir, "%s", tu_data("text/chat/models"));
        snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "/%s", model);
        snprintf(name, sizeof name, "#%zu %s/%s", i, model, json_string_value(json_object_get(c, "conversation")));
        mr_chat *chat = NULL;
        mr_status s = mr_chat_open(dir, &chat);
        if (s) {
            fprintf(stderr, "  %s: open failed: %s\n", name, mr_error_last());
            failed++;
            continue;
        }
        const json_t *tools = json_object_get(c, "tools"), *kw = json_object_get(c, "kwargs");
        mr_chat_request r = {
            .messages = json_object_get(c, "messages"),
            .tools = json_is_null(tools) ? NULL : tools,
            .kwargs = json_is_null(kw) ? NULL : kw,
            .add_generation_prompt = json_is_true(json_object_get(c, "add_generation_prompt")),
            .continue_final_message = json_is_true(json_object_get(c, "continue_final_message")),
            .template_name = json_string_value(json_object_get(c, "template_name")),
            .limits = &lim,
        };
        char *out = NULL;
        size_t n = 0;
        s = mr_chat_apply(chat, &r, &out, &n);
        const json_t *want = json_object_get(c, "output");
        if (want) {
            if (s) {
                fprintf(stderr, "  %s: failed: %s\n", name, mr_error_last());
                failed++;
            } else if (n != json_string_length(want) || memcmp(out, json_string_value(want), n)) {
                show_diff(name, json_string_value(want), json_string_length(want), out, n);
                failed++;
            }
        } else if (!s) {
            fprintf(stderr, "  %s: rendered, but transformers fails (%s)\n", name,
                    json_string_value(json_object_get(c, "error")));
            failed++;
        }
        mr_free(out);
        mr_chat_free(chat);
    }
    fprintf(stderr, "chat goldens: %zu cases, %zu failed\n", json_array_size(cases), failed);
    json_decref(g);
    assert_int_equal(failed, 0);
}


static mr_status render_src(const char *src, const json_t *vars, const mr_chat_limits *lim, char **out) {
    mr_chat_template *t = NULL;
    mr_status s = mr_chat_template_parse(src, strlen(src), "hostile", &t);
    if (!s) s = mr_chat_template_render(t, vars, lim, out, NULL);
    mr_chat_template_free(t);
    return s;
}

/* Hostile templates stop at a limit with a clear error, quickly. */
static void test_limits(void **st) {
    (void)st;
    static const struct {
        const char *src;
        mr_status want;
        const char *msg;
    } cases[] = {
        {"{% for i in range(100000) %}{% for j in big %}{% endfor %}{% endfor %}", MR_ECAPACITY, "steps"},
        {"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", MR_ECAPACITY, "steps"},
        {"{% for i in range(100000) %}{% set x = 'x' * 1000000 %}{% endfor %}", MR_ECAPACITY, "MiB of memory"},
        {"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", MR_ECAPACITY, "deeper"},
        {"{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", MR_ECAPACITY, "output limit"},
        {"{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
         MR_ECAPACITY, "limit"},
        {"{{ 'x' * 100000000000 }}", MR_ECAPACITY, "repetition"},
        {"{{ range(10**9)|length }}", MR_EINPUT, "MAX_RANGE"},
        {"{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}", MR_EINPUT, "nested too deeply"},
        {"{% set ns = namespace() %}{% set ns.me = ns %}{{ ns|tojson }}", MR_EINPUT, "not JSON serializable"},
        {"{{ 2 ** 64 }}", MR_EINPUT, "overflow"},
        {"{{ 9223372036854775807 + 1 }}", MR_EINPUT, "overflow"},
    };
    mr_chat_limits lim;
    mr_chat_limits_default(&lim);
    lim.max_output_bytes = 1 << 20;
    lim.max_memory_bytes = 64 << 20;
    lim.max_steps = 2000000;
    lim.max_depth = 200;
    json_t *vars = json_object(), *big = json_array();
    for (int k = 0; k < 1000; k++) json_array_append_new(big, json_integer(k));
    json_object_set_new(vars, "big", big);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        uint64_t t0 = mr_now_ns();
        mr_status s = render_src(cases[i].src, vars, &lim, &out);
        double ms = (double)(mr_now_ns() - t0) / 1e6;
        if (s != cases[i].want || !strstr(mr_error_last(), cases[i].msg))
            fprintf(stderr, "  case %zu: %s: %s\n", i, mr_status_name(s), mr_error_last());
        assert_int_equal(s, cases[i].want);
        assert_non_null(strstr(mr_error_last(), cases[i].msg));
        assert_null(out);
        assert_true(ms < 20000); /* a bound on runaway work, not a timing target */
    }
    json_decref(vars);
    /* deep nesting in the source is refused by the parser, not by the stack */
    char *deep = malloc(400000);
    size_t n = 0;
    n += (size_t)sprintf(deep + n, "{{ ");
    for (int k = 0; k < 50000; k++) deep[n++] = '(';
    deep[n++] = '1';
    for (int k = 0; k < 50000; k++) deep[n++] = ')';
    n += (size_t)sprintf(deep + n, " }}");
    deep[n] = 0;
    mr_chat_template *t = NULL;
    assert_int_equal(mr_chat_template_parse(deep, n, "deep", &t), MR_EINPUT);
    assert_non_null(strstr(mr_error_last(), "nested"));
    n = 0;
    for (int k = 0; k < 20000; k++) n += (size_t)sprintf(deep + n, "{%% if x %%}");
    assert_int_equal(mr_chat_template_parse(deep, n, "deep", &t), MR_EINPUT);
    free(deep);
    /* invalid UTF-8 in the source */
    assert_int_equal(mr_chat_template_parse("ok \xff bad", 8, "bin", &t), MR_EINPUT);
    assert_non_null(strstr(mr_error_last(), "byte 3"));
    /* NUL bytes are text, as in Python */
    assert_int_equal(mr_chat_template_parse("a\0b{{ 1 }}", 10, "nul", &t), MR_OK);
    char *out = NULL;
    size_t olen = 0;
    assert_int_equal(mr_chat_template_render(t, NULL, NULL, &out, &olen), MR_OK);
    assert_int_equal(olen, 4);
    assert_memory_equal(out, "a\0b1", 4);
    mr_free(out);
    /* variables must be an object */
    json_t *arr = json_array();
    assert_int_equal(mr_chat_template_render(t, arr, NULL, &out, &olen), MR_EINVAL);
    json_decref(arr);
    mr_chat_template_free(t);
}

/* Every allocation failing in turn: a clean MR_ENOMEM, no leak (ASan). */
static void test_alloc_failures(void **st) {
    (void)st;
    const char *src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                      "{{ m.role|upper }}: {{ m.content|trim|tojson }}{% endfor %}{{ ns.n }}{{ 'x' * 3000 }}";
    json_t *vars = json_loads("{\"messages\": [{\"role\": \"user\", \"content\": \" hi \"}, "
                              "{\"role\": \"assistant\", \"content\": \"yo\"}]}",
                              0, NULL);
    int ok = 0, oom = 0;
    for (long k = 0; k < 300; k++) {
        mr_chat_template *t = NULL;
        char *out = NULL;
        mr_debug_alloc_fail_after(k);
        mr_status s = mr_chat_template_parse(src, strlen(src), "oom", &t);
        if (!s) s = mr_chat_template_render(t, vars, NULL, &out, NULL);
        mr_debug_alloc_fail_after(-1);
        if (s) {
            assert_int_equal(s, MR_ENOMEM);
            assert_null(out);
            oom++;
        } else {
            assert_true(!strncmp(out, "USER: \"hi\"ASSISTANT: \"yo\"2xxx", 29) && strlen(out) == 3026);
            ok++;
        }
        mr_free(out);
        mr_chat_template_free(t);
    }
    assert_true(ok > 0 && oom > 0);
    json_decref(vars);
}

typedef struct {
    const mr_chat_template *t;
    const json_t *vars;
    const char *want;
    int bad;
} thread_arg;

static void *render_many(void *a) {
    thread_arg *ta = a;
    for (int i = 0; i < 200; i++) {
        char *out = NULL;
        if (mr_chat_template_render(ta->t, ta->vars, NULL, &out, NULL) || strcmp(out, ta->want)) ta->bad++;
        mr_free(out);
    }
    return NULL;
}

/* One parsed template rendered from several threads at once. */
static void test_threads(void **st) {
    (void)st;
    mr_chat *chat = NULL;
    char dir[512];
    snprintf(dir, sizeof dir, "%s", tu_data("text/chat/models/minimax_m2"));
    assert_int_equal(mr_chat_open(dir, &chat), MR_OK);
    const mr_chat_template *t = mr_chat_pick(chat, NULL, false);
    assert_non_null(t);
    json_t *vars = json_loads("{\"bos_token\": \"]~!b[\", \"add_generation_prompt\": true, \"messages\": "
                              "[{\"role\": \"user\", \"content\": \"hello\"}]}",
                              0, NULL);
    char *want = NULL;
    assert_int_equal(mr_chat_template_render(t, vars, NULL, &want, NULL), MR_OK);
    assert_string_equal(want, "]~!b[]~b]system\nYou are a helpful assistant.[e~[\n]~b]user\nhello[e~[\n]~b]ai\n<think>\n");
    pthread_t th[4];
    thread_arg ta[4];
    for (int i = 0; i < 4; i++) {
        ta[i] = (thread_arg){t, vars, want, 0};
        pthread_create(&th[i], NULL, render_many, &ta[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(ta[i].bad, 0);
    }
    mr_free(want);
    json_decref(vars);
    mr_chat_free(chat);
}

static void write_file(const char *dir, const char *name, const char *text) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    assert_int_equal(tu_write_file(path, text, strlen(text)), 0);
}

/* Model folders: what is found, what is refused, and the request checks. */
static void test_folders_and_requests(void **st) {
    (void)st;
    mr_chat *c = NULL;
    assert_int_equal(mr_chat_open("/nonexistent/moerun", &c), MR_ENOTFOUND);
    char *d = tu_tmpdir("chatdir");
    assert_int_equal(mr_chat_open(d, &c), MR_ENOTFOUND);
    assert_non_null(strstr(mr_error_last(), "no chat template"));
    write_file(d, "tokenizer_config.json", "{\"chat_template\": 5}");
    assert_int_equal(mr_chat_open(d, &c), MR_EFORMAT);
    write_file(d, "tokenizer_config.json", "{\"chat_template\": [{\"name\": \"x\"}]}");
    assert_int_equal(mr_chat_open(d, &c), MR_EFORMAT);
    write_file(d, "tokenizer_config.json", "{not json");
    assert_int_equal(mr_chat_open(d, &c), MR_EFORMAT);
    write_file(d, "tokenizer_config.json", "{\"bos_token\": 3, \"chat_template\": \"x\"}");
    assert_int_equal(mr_chat_open(d, &c), MR_EFORMAT);
    /* a syntax error names the file, the template and the line */
    write_file(d, "tokenizer_config.json", "{\"eos_token\": {\"content\": \"</s>\"}}");
    write_file(d, "chat_template.jinja", "line 1\n{% if %}\n");
    assert_int_equal(mr_chat_open(d, &c), MR_EINPUT);
    assert_non_null(strstr(mr_error_last(), "chat_template.jinja"));
    assert_non_null(strstr(mr_error_last(), "line 2"));
    /* additional templates by name, and the pick rule */
    write_file(d, "chat_template.jinja", "D{{ eos_token }}");
    char sub[1536];
    snprintf(sub, sizeof sub, "%s/additional_chat_templates", d);
    assert_int_equal(mkdir(sub, 0755), 0);
    write_file(sub, "tool_use.jinja", "T{{ tools|length }}");
    write_file(sub, "notes.txt", "ignored");
    assert_int_equal(mr_chat_open(d, &c), MR_OK);
    assert_int_equal(mr_chat_template_count(c), 2);
    assert_string_equal(mr_chat_special_token(c, "eos_token"), "</s>");
    assert_null(mr_chat_special_token(c, "bos_token"));
    json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"x\"}]", 0, NULL);
    json_t *tools = json_loads("[{\"name\": \"f\"}]", 0, NULL);
    mr_chat_request r = {.messages = msgs};
    char *out = NULL;
    assert_int_equal(mr_chat_apply(c, &r, &out, NULL), MR_OK);
    assert_string_equal(out, "D</s>");
    mr_free(out);
    r.tools = tools;
    assert_int_equal(mr_chat_apply(c, &r, &out, NULL), MR_OK);
    assert_string_equal(out, "T1");
    mr_free(out);
    r.template_name = "nope";
    assert_int_equal(mr_chat_apply(c, &r, &out, NULL), MR_ENOTFOUND);
    r.template_name = NULL;
    /* bad requests */
    json_t *empty = json_array(), *notobj = json_loads("[1]", 0, NULL), *kw = json_loads("{\"messages\": 1}", 0, NULL);
    r.messages = empty;
    assert_int_equal(mr_chat_apply(c, &r, &out, NULL), MR_EINVAL);
    r.messages = notobj;
    assert_int_equal(mr_chat_apply(c, &r, &out, NULL), MR_EINVAL);
    r.messages = msgs;
    r.tools = notobj;
    assert_int_equal(mr_chat_apply(c, &r, &out, NULL), MR_EINVAL);
    r.tools = NULL;
    r.kwargs = kw;
    assert_int_equal(mr_chat_apply(c, &r, &out, NULL), MR_EINVAL);
    r.kwargs = NULL;
    r.add_generation_prompt = r.continue_final_message = true;
    assert_int_equal(mr_chat_apply(c, &r, &out, NULL), MR_EINVAL);
    json_decref(empty);
    json_decref(notobj);
    json_decref(kw);
    mr_chat_free(c);
    /* parse_tool_arguments: JSON-text arguments become objects for the template */
    json_t *cfg = json_loads("{\"chat_template\": \"{% for m in messages %}{% for t in m.tool_calls %}"
                             "{{ t.function.arguments is mapping }}{{ t.function.arguments.city if t.function.arguments is mapping }}"
                             "{% endfor %}{% endfor %}\"}",
                             0, NULL);
    assert_int_equal(mr_chat_new(cfg, NULL, &c), MR_OK);
    json_t *tm = json_loads("[{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"w\", "
                            "\"arguments\": \"{\\\"city\\\": \\\"Rome\\\"}\"}}, {\"function\": {\"name\": \"w\", "
                            "\"arguments\": \"not json\"}}]}]",
                            0, NULL);
    mr_chat_request r2 = {.messages = tm};
    assert_int_equal(mr_chat_apply(c, &r2, &out, NULL), MR_OK);
    assert_string_equal(out, "FalseFalse");
    mr_free(out);
    r2.parse_tool_arguments = true;
    assert_int_equal(mr_chat_apply(c, &r2, &out, NULL), MR_OK);
    assert_string_equal(out, "TrueRomeFalse");
    mr_free(out);
    assert_int_equal(mr_chat_format_of(c), MR_CHAT_FORMAT_PLAIN);
    mr_chat_free(c);
    json_decref(tm);
    json_decref(cfg);
    json_decref(msgs);
    json_decref(tools);
    tu_rmtree(d);
    free(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jinja_goldens),
        cmocka_unit_test(test_chat_goldens),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_folders_and_requests),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
