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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jinja_goldens),
        cmocka_unit_test(test_chat_goldens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
