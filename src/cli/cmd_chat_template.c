/* cmd_chat_template.c — `moerun chat-template` (render a conversation with a
 * model folder's chat template, as transformers' apply_chat_template does)
 * and `moerun parse-output` (split a model's output into reasoning, content
 * and tool calls, whole or as the streamed deltas). Exit: 0 ok, 2 bad input
 * (usage, a bad folder, template or JSON, a template error), 1 I/O or
 * memory failure. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moerun/chat.h"

#define MAX_INPUT ((size_t)256 << 20)

static int read_all(const char *path, char **out, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "moerun: cannot open %s\n", path);
        return 2;
    }
    size_t cap = 65536, n = 0;
    char *p = malloc(cap + 1);
    int rc = 0;
    while (p) {
        size_t r = fread(p + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
        if (n == cap) {
            if (cap >= MAX_INPUT) {
                fprintf(stderr, "moerun: %s is larger than 256 MiB\n", path);
                rc = 2;
                break;
            }
            char *q = realloc(p, cap * 2 + 1);
            if (!q) {
                free(p);
                p = NULL;
                break;
            }
            p = q;
            cap *= 2;
        }
    }
    if (f != stdin) fclose(f);
    if (!p) return 1;
    if (rc) {
        free(p);
        return rc;
    }
    p[n] = 0;
    *out = p;
    *len = n;
    return 0;
}

static json_t *load_json_arg(const char *what, const char *path_or_text, bool inline_ok, int *rc) {
    json_error_t e;
    json_t *j;
    if (inline_ok && (path_or_text[0] == '{' || path_or_text[0] == '[')) {
        j = json_loads(path_or_text, JSON_DECODE_ANY, &e);
    } else {
        char *buf;
        size_t n;
        if ((*rc = read_all(path_or_text, &buf, &n))) return NULL;
        j = json_loadb(buf, n, JSON_DECODE_ANY, &e);
        free(buf);
    }
    if (!j) {
        fprintf(stderr, "moerun: %s: line %d: %s\n", what, e.line, e.text);
        *rc = 2;
    }
    return j;
}

static void ct_usage(FILE *f) {
    fprintf(f,
            "usage: moerun chat-template --model DIR --messages FILE|-|JSON [--tools FILE|JSON]\n"
            "                            [--kwargs JSON] [--add-generation-prompt] [--continue-final-message]\n"
            "                            [--template NAME] [--parse-tool-arguments] [--now UNIX] [--list]\n\n"
            "Renders a conversation with the model folder's chat template (chat_template.jinja,\n"
            "additional_chat_templates/, or tokenizer_config.json) exactly as transformers'\n"
            "apply_chat_template(tokenize=False) does, and prints the prompt text.\n"
            "  --messages       a JSON array of messages, or an OpenAI request body {\"messages\", \"tools\", ...}\n"
            "                   (a file, - for standard input, or the JSON itself)\n"
            "  --tools          a JSON array of tools (overrides the request body's)\n"
            "  --kwargs         extra template variables, a JSON object (e.g. '{\"enable_thinking\": false}')\n"
            "  --template       a named template (default: 'tool_use' with tools when present, else 'default')\n"
            "  --parse-tool-arguments  tool-call arguments given as JSON text become objects (as vLLM does)\n"
            "  --now UNIX       the clock strftime_now reads (seconds since 1970, local time); default: now\n"
            "  --list           print the template names, the special tokens and the output format instead\n");
}

int mr_cmd_chat_template(int argc, char **argv) {
    const char *model = NULL, *msgs = NULL, *tools_arg = NULL, *kwargs_arg = NULL, *tname = NULL;
    bool agp = false, cont = false, list = false, parse_args = false;
    long long now = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            ct_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--model") && has) model = argv[++i];
        else if (!strcmp(a, "--messages") && has) msgs = argv[++i];
        else if (!strcmp(a, "--tools") && has) tools_arg = argv[++i];
        else if (!strcmp(a, "--kwargs") && has) kwargs_arg = argv[++i];
        else if (!strcmp(a, "--template") && has) tname = argv[++i];
        else if (!strcmp(a, "--add-generation-prompt")) agp = true;
        else if (!strcmp(a, "--continue-final-message")) cont = true;
        else if (!strcmp(a, "--parse-tool-arguments")) parse_args = true;
        else if (!strcmp(a, "--list")) list = true;
        else if (!strcmp(a, "--now") && has) {
            char *end;
            now = strtoll(argv[++i], &end, 10);
            if (*end || now <= 0) {
                fprintf(stderr, "moerun chat-template: --now wants seconds since 1970, not '%s'\n", argv[i]);
                return 2;
            }
        }
        else {
            fprintf(stderr, "moerun chat-template: unknown or incomplete option '%s'\n\n", a);
            ct_usage(stderr);
            return 2;
        }
    }
    if (!model || (!msgs && !list)) {
        fprintf(stderr, "moerun chat-template: --model and --messages are required\n\n");
        ct_usage(stderr);
        return 2;
    }
    int rc = 0;
    mr_chat *chat = NULL;
    json_t *mj = NULL, *tj = NULL, *kj = NULL;
    char *out = NULL;
    if (mr_chat_open(model, &chat)) {
        mr_cli_fail("chat-template", model);
        return 2;
    }
    if (list) {
        for (size_t i = 0; i < mr_chat_template_count(chat); i++) printf("template: %s\n", mr_chat_template_name(chat, i));
        static const char *const keys[] = {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"};
        for (size_t i = 0; i < 7; i++)
            if (mr_chat_special_token(chat, keys[i])) printf("%s: %s\n", keys[i], mr_chat_special_token(chat, keys[i]));
        printf("output format: %s\n", mr_chat_format_of(chat) == MR_CHAT_FORMAT_MINIMAX_M2 ? "minimax_m2" : "plain");
        if (!msgs) goto out;
    }
    if (!(mj = load_json_arg("--messages", msgs, true, &rc))) goto out;
    const json_t *messages = mj, *tools = NULL;
    if (json_is_object(mj)) {
        messages = json_object_get(mj, "messages");
        tools = json_object_get(mj, "tools");
        if (!kwargs_arg) {
            const json_t *k = json_object_get(mj, "chat_template_kwargs");
            if (json_is_object(k)) kj = json_incref((json_t *)k);
        }
    }
    if (tools_arg && !(tools = tj = load_json_arg("--tools", tools_arg, true, &rc))) goto out;
    if (kwargs_arg && !(kj = load_json_arg("--kwargs", kwargs_arg, true, &rc))) goto out;
    mr_chat_limits lim;
    mr_chat_limits_default(&lim);
    lim.now_unix = now;
    mr_chat_request r = {.messages = messages,
                         .limits = &lim,
                         .tools = tools,
                         .kwargs = kj,
                         .add_generation_prompt = agp,
                         .continue_final_message = cont,
                         .parse_tool_arguments = parse_args,
                         .template_name = tname};
    size_t n = 0;
    if (mr_chat_apply(chat, &r, &out, &n)) {
        mr_cli_fail("chat-template", NULL);
        rc = 2;
        goto out;
    }
    if (fwrite(out, 1, n, stdout) != n || fflush(stdout)) rc = 1;
out:
    mr_free(out);
    json_decref(mj);
    json_decref(tj);
    json_decref(kj);
    mr_chat_free(chat);
    return rc;
}

static void po_usage(FILE *f) {
    fprintf(f,
            "usage: moerun parse-output [--format minimax_m2|plain | --model DIR] [--tools FILE|JSON]\n"
            "                           [--no-think-open] [--no-reasoning] [--no-tool-calls]\n"
            "                           [--deltas N] [--seed S] [FILE|-]\n\n"
            "Splits a model's output (a file or standard input) into reasoning, content and OpenAI\n"
            "tool calls and prints the assistant message as JSON. With --deltas N the text is fed\n"
            "N bytes at a time and every streamed delta is printed first, one JSON object a line,\n"
            "as a chat.completion.chunk's `delta` would carry it. Warnings go to standard error.\n"
            "  --model DIR       take the format from the folder's chat template\n"
            "  --tools           the request's tools: parameter values are converted by their JSON schema\n"
            "  --no-think-open   the prompt did not end inside <think> (reasoning only inside <think>...</think>)\n");
}

int mr_cmd_parse_output(int argc, char **argv) {
    const char *fmt = NULL, *model = NULL, *tools_arg = NULL, *file = "-";
    bool think_open = true, reasoning = true, tool_calls = true;
    long deltas = 0;
    unsigned long long seed = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            po_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--format") && has) fmt = argv[++i];
        else if (!strcmp(a, "--model") && has) model = argv[++i];
        else if (!strcmp(a, "--tools") && has) tools_arg = argv[++i];
        else if (!strcmp(a, "--deltas") && has) {
            char *end;
            deltas = strtol(argv[++i], &end, 10);
            if (*end || deltas <= 0 || deltas > 1 << 20) {
                fprintf(stderr, "moerun parse-output: --deltas wants a byte count from 1 to 1048576, not '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--seed") && has) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(a, "--no-think-open")) think_open = false;
        else if (!strcmp(a, "--no-reasoning")) reasoning = false;
        else if (!strcmp(a, "--no-tool-calls")) tool_calls = false;
        else if (a[0] != '-' || !strcmp(a, "-")) file = a;
        else {
            fprintf(stderr, "moerun parse-output: unknown or incomplete option '%s'\n\n", a);
            po_usage(stderr);
            return 2;
        }
    }
    mr_chat_format f = MR_CHAT_FORMAT_MINIMAX_M2;
    if (fmt && model) {
        fprintf(stderr, "moerun parse-output: give --format or --model, not both\n");
        return 2;
    }
    if (fmt) {
        if (!strcmp(fmt, "minimax_m2") || !strcmp(fmt, "minimax")) f = MR_CHAT_FORMAT_MINIMAX_M2;
        else if (!strcmp(fmt, "plain")) f = MR_CHAT_FORMAT_PLAIN;
        else {
            fprintf(stderr, "moerun parse-output: unknown --format '%s' (minimax_m2, plain)\n", fmt);
            return 2;
        }
    }
    int rc = 0;
    json_t *tj = NULL, *msg = NULL;
    char *text = NULL;
    mr_chat_parser *p = NULL;
    if (model) {
        mr_chat *chat;
        if (mr_chat_open(model, &chat)) {
            mr_cli_fail("parse-output", model);
            return 2;
        }
        f = mr_chat_format_of(chat);
        mr_chat_free(chat);
    }
    if (tools_arg && !(tj = load_json_arg("--tools", tools_arg, true, &rc))) goto out;
    size_t n;
    if ((rc = read_all(file, &text, &n))) goto out;
    mr_chat_parser_opts o;
    mr_chat_parser_opts_default(&o, f);
    if (f != MR_CHAT_FORMAT_PLAIN) {
        o.think_open = think_open;
        o.reasoning = reasoning;
        o.tool_calls = tool_calls;
    }
    o.tools = tj;
    o.id_seed = seed;
    if (mr_chat_parser_new(&o, &p)) {
        mr_cli_fail("parse-output", NULL);
        rc = 2;
        goto out;
    }
    size_t step = deltas ? (size_t)deltas : (n ? n : 1);
    const mr_chat_delta *d;
    for (size_t at = 0;; at += step) {
        bool last = at >= n;
        mr_status s = last ? mr_chat_parser_finish(p, &d) : mr_chat_parser_feed(p, text + at, at + step <= n ? step : n - at, &d);
        if (s) {
            mr_cli_fail("parse-output", NULL);
            rc = 1;
            goto out;
        }
        for (size_t w = 0; w < d->n_warnings; w++) fprintf(stderr, "moerun parse-output: warning: %s\n", d->warnings[w]);
        if (deltas) {
            json_t *dj = mr_chat_delta_json(d);
            if (dj) {
                char *s2 = json_dumps(dj, JSON_COMPACT);
                if (s2) printf("%s\n", s2);
                free(s2);
                json_decref(dj);
            }
        }
        if (last) break;
    }
    msg = mr_chat_parser_message(p);
    char *ms = msg ? json_dumps(msg, JSON_INDENT(2)) : NULL;
    if (!ms) {
        rc = 1;
        goto out;
    }
    printf("%s\n", ms);
    free(ms);
    if (fflush(stdout)) rc = 1;
out:
    free(text);
    json_decref(tj);
    json_decref(msg);
    mr_chat_parser_free(p);
    return rc;
}
