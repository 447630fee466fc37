/* cmd_chat.c — `moerun chat --model DIR`: an interactive conversation in the
 * terminal. Each line typed is a user message; the whole conversation is
 * rendered with the model's chat template and run through the engine, and
 * the answer streams back as it is generated, split by the model's output
 * parser into reasoning (shown dimmed on a terminal, or hidden with
 * --hide-reasoning) and content. Lines starting with '/' are commands:
 * /reset starts a new conversation, /exit (or end of input) leaves.
 * Ctrl-C while an answer is generated stops that answer (the engine's cancel
 * flag, read at the next step) and keeps the program; at the prompt it
 * discards the line being typed. Exit: 0 at /exit or end of input, 2 usage,
 * 1 load failure. */
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_model.h"
#include "cli_text.h"
#include "moerun/config.h"
#include "moerun/engine.h"
#include "moerun/kernels.h"
#include "moerun/model.h"

static atomic_int g_cancel;      /* the running answer's cancel flag (engine reads it per step) */
static volatile sig_atomic_t g_interrupted; /* Ctrl-C seen */

static void on_sigint(int sig) {
    (void)sig;
    atomic_store(&g_cancel, 1);
    g_interrupted = 1;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: moerun chat --model DIR [--system S] [-n N] [--temperature T] [--top-p P] [--top-k K]\n"
            "                   [--seed S] [--hide-reasoning] [--no-color] [--ignore-eos] [resolver options]\n\n"
            "An interactive conversation with the model, through its chat template. Type a message and\n"
            "press Enter; the answer streams back. Commands: /reset (new conversation), /exit.\n"
            "Ctrl-C stops the answer being generated (the program goes on); end of input leaves.\n"
            "  --system S        the system message (default: the template's own)\n"
            "  -n N              most tokens per answer (default 512)\n"
            "  --temperature T   default 0.7 (0 is greedy); --top-p P (default 0.95), --top-k K, --seed S\n"
            "  --hide-reasoning  do not print the model's reasoning (it is still generated)\n"
            "  --no-color        reasoning is not dimmed but marked [reasoning] (the default when stdout is\n"
            "                    not a terminal)\n"
            "  --ignore-eos      answers run to -n tokens (for tests)\n\n");
    mr_options_print_help(f);
}

typedef struct {
    bool color, hide_reasoning;
    bool in_reasoning; /* the dim attribute is on */
} view;

static void show(view *v, const mr_chat_delta *d) {
    if (d->reasoning_len && !v->hide_reasoning) {
        if (!v->in_reasoning) fputs(v->color ? "\033[2m" : "[reasoning] ", stdout);
        v->in_reasoning = true;
        fwrite(d->reasoning, 1, d->reasoning_len, stdout);
    }
    if (d->content_len) {
        if (v->color && v->in_reasoning) fputs("\033[0m", stdout);
        if (v->in_reasoning && !v->color) fputs("\n", stdout);
        v->in_reasoning = false;
        fwrite(d->content, 1, d->content_len, stdout);
    }
    for (size_t i = 0; i < d->n_tools; i++) {
        if (d->tools[i].name) printf("\n[tool call %s] ", d->tools[i].name);
        fwrite(d->tools[i].args, 1, d->tools[i].args_len, stdout);
    }
    fflush(stdout);
}

/* Appends a {role, content[, reasoning_content]} message; false on out of memory. */
static bool push_message(json_t *hist, const char *role, const char *content, const char *reasoning) {
    json_t *m = json_pack("{s:s,s:s}", "role", role, "content", content);
    if (!m) return false;
    if (reasoning && reasoning[0]) json_object_set_new(m, "reasoning_content", json_string(reasoning));
    return json_array_append_new(hist, m) == 0;
}

static void reset_history(json_t *hist, const char *system) {
    json_array_clear(hist);
    if (system) push_message(hist, "system", system, NULL);
}

int mr_cmd_chat(int argc, char **argv) {
    const char *cmd = "chat";
    mr_options o;
    if (mr_options_init(&o) != MR_OK) return 1;
    int rc = 2;
    mr_resolution *r = NULL;
    mr_model *m = NULL;
    mr_engine *e = NULL;
    mr_tokenizer *tok = NULL;
    mr_chat *tmpl = NULL;
    mr_tokstream *ts = NULL;
    mr_chat_parser *parser = NULL;
    json_t *hist = NULL;
    char *line = NULL;
    size_t line_cap = 0;
    mr_sampling sp = {.temperature = 0.7f, .top_p = 0.95f};
    long n_max = 512;
    bool hide = false, no_color = false, ignore_eos = false;
    const char *system = NULL, *flag = cmd;
    struct sigaction old_int;
    bool handler = false;

    if (mr_options_parse(&o, &argc, argv, true) != MR_OK) {
        mr_cli_fail(cmd, NULL);
        goto out;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        flag = a;
        int sf = mr_cli_sampling_flag(argc, argv, &i, MR_CLI_SAMPLING_BASIC, &sp);
        if (sf == MR_CLI_FLAG_BAD) goto bad;
        if (sf == MR_CLI_FLAG_NO_VALUE) {
            fprintf(stderr, "moerun chat: %s needs a value\n", a);
            goto out;
        }
        if (sf == MR_CLI_FLAG_TAKEN) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            rc = 0;
            goto out;
        } else if (!strcmp(a, "--hide-reasoning")) {
            hide = true;
        } else if (!strcmp(a, "--no-color")) {
            no_color = true;
        } else if (!strcmp(a, "--ignore-eos")) {
            ignore_eos = true;
        } else if (v && !strcmp(a, "--system")) {
            system = argv[++i];
        } else if (v && (!strcmp(a, "-n") || !strcmp(a, "--max-tokens"))) {
            if (mr_cli_parse_long(argv[++i], 1, 1 << 20, &n_max)) goto bad;
        } else if (!v && (!strcmp(a, "--system") || !strcmp(a, "-n") || !strcmp(a, "--max-tokens"))) {
            fprintf(stderr, "moerun chat: %s needs a value\n", a);
            goto out;
        } else {
            fprintf(stderr, "moerun chat: unknown argument '%s' (see --help)\n", a);
            goto out;
        }
    }
    const char *dir = mr_options_get(&o, MR_OPT_MODEL);
    if (!dir[0]) {
        fprintf(stderr, "moerun chat: --model DIR is required (see --help)\n");
        goto out;
    }
    if ((rc = mr_cli_text_open(cmd, dir, true, &tok, &tmpl)) != 0) goto out;
    rc = 2;
    if (mr_cli_resolve(cmd, &o, false, &r)) goto out;
    rc = 1;
    if (mr_cli_engine_open(cmd, dir, mr_resolution_exec(r), true, 1, &m, &e)) goto out;
    if (mr_tokstream_new(tok, true, &ts)) {
        mr_cli_fail(cmd, "cannot decode");
        goto out;
    }
    hist = json_array();
    if (!hist) goto oom;
    reset_history(hist, system);
    view vw = {.color = !no_color && isatty(STDOUT_FILENO), .hide_reasoning = hide};
    bool interactive = isatty(STDIN_FILENO);
    const mr_model_config *c = mr_model_config_of(m);
    printf("chat with %s (%lld layers, %lld experts top-%lld). /reset starts over, /exit leaves, Ctrl-C stops an "
           "answer.\n",
           dir, (long long)c->n_layers, (long long)c->n_experts, (long long)c->top_k);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint; /* no SA_RESTART: a Ctrl-C at the prompt interrupts the read */
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGINT, &sa, &old_int) == 0) handler = true;

    for (;;) {
        printf("> ");
        fflush(stdout);
        g_interrupted = 0;
        errno = 0;
        ssize_t n = getline(&line, &line_cap, stdin);
        if (n < 0) {
            if (errno == EINTR || g_interrupted) { /* Ctrl-C at the prompt: discard the line */
                clearerr(stdin);
                printf("\n");
                continue;
            }
            printf("\n");
            break; /* end of input */
        }
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (!interactive) printf("%s\n", line); /* a transcript reads like the terminal did */
        if (n == 0) continue;
        if (line[0] == '/') {
            if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
            if (!strcmp(line, "/reset")) {
                reset_history(hist, system);
                printf("(new conversation)\n");
            } else {
                printf("(unknown command %s: /reset starts over, /exit leaves)\n", line);
            }
            continue;
        }
        if (mr_utf8_check(line, (size_t)n) != (size_t)n) {
            printf("(the line is not valid UTF-8; not sent)\n");
            continue;
        }
        if (!push_message(hist, "user", line, NULL)) goto oom;
        mr_tok_ids ids = {0};
        int er = mr_cli_messages_encode(cmd, tok, tmpl, hist, &ids);
        if (er) {
            mr_tok_ids_free(&ids);
            json_array_remove(hist, json_array_size(hist) - 1);
            if (er == 1) goto oom;
            continue;
        }
        atomic_store(&g_cancel, 0);
        g_interrupted = 0;
        mr_request_params rp = {.prompt = ids.ids, .n_prompt = (int64_t)ids.n, .max_tokens = n_max,
                                .sampling = sp, .ignore_eos = ignore_eos, .cancel = &g_cancel};
        int64_t room = mr_engine_opts_of(e)->context_length - (int64_t)ids.n;
        if (room < 1) room = 1;
        if (rp.max_tokens > room) rp.max_tokens = room; /* the answer ends at the context instead of being refused */
        mr_req_id id;
        mr_status st = mr_engine_add(e, &rp, &id);
        mr_tok_ids_free(&ids);
        if (st) {
            printf("(%s; /reset starts a new conversation)\n", mr_error_last());
            json_array_remove(hist, json_array_size(hist) - 1);
            if (st == MR_ENOMEM) goto oom;
            continue;
        }
        mr_chat_parser_opts po;
        mr_chat_parser_opts_default(&po, mr_chat_format_of(tmpl));
        mr_chat_parser_free(parser);
        parser = NULL;
        if (mr_chat_parser_new(&po, &parser)) goto oom;
        vw.in_reasoning = false;
        mr_finish_reason fin = MR_FINISH_NONE;
        int64_t n_tok = 0;
        uint64_t t0 = mr_now_ns(), t_first = 0;
        const mr_chat_delta *d;
        while (mr_engine_has_work(e)) {
            const mr_engine_step_out *so;
            if (mr_engine_step(e, &so)) {
                mr_cli_fail(cmd, "engine step failed");
                goto out;
            }
            for (int k = 0; k < so->n_events; k++) {
                const mr_engine_event *ev = &so->events[k];
                if (ev->n_tokens == 1) {
                    if (!t_first) t_first = mr_now_ns();
                    n_tok++;
                    const char *txt;
                    size_t tl;
                    if (mr_tokstream_push(ts, &ev->token, 1, &txt, &tl) || mr_chat_parser_feed(parser, txt, tl, &d)) {
                        mr_cli_fail(cmd, "cannot decode the answer");
                        goto out;
                    }
                    show(&vw, d);
                }
                if (ev->finish != MR_FINISH_NONE) fin = ev->finish;
                if (ev->finish == MR_FINISH_ERROR) printf("\n(the answer failed: %s)", ev->error ? ev->error : "?");
            }
        }
        const char *txt;
        size_t tl;
        if (mr_tokstream_flush(ts, &txt, &tl) || mr_chat_parser_feed(parser, txt, tl, &d)) goto oom;
        show(&vw, d);
        if (mr_chat_parser_finish(parser, &d)) goto oom;
        show(&vw, d);
        if (vw.color && vw.in_reasoning) fputs("\033[0m", stdout);
        double secs = (double)(mr_now_ns() - (t_first ? t_first : t0)) * 1e-9;
        printf("\n%s[%lld tokens, %.1f tok/s%s]%s\n", vw.color ? "\033[2m" : "", (long long)n_tok,
               secs > 0 && n_tok > 1 ? (double)(n_tok - 1) / secs : 0.0,
               fin == MR_FINISH_CANCELLED ? ", stopped" : fin == MR_FINISH_LENGTH ? ", length limit" : "",
               vw.color ? "\033[0m" : "");
        /* the answer (even a stopped one) joins the history */
        json_t *msg = mr_chat_parser_message(parser);
        if (!msg) goto oom;
        const char *content = json_string_value(json_object_get(msg, "content"));
        const char *reasoning = json_string_value(json_object_get(msg, "reasoning_content"));
        bool ok = push_message(hist, "assistant", content ? content : "", reasoning);
        json_decref(msg);
        if (!ok) goto oom;
    }
    rc = 0;
    goto out;
oom:
    fprintf(stderr, "moerun chat: out of memory\n");
    rc = 1;
    goto out;
bad:
    fprintf(stderr, "moerun chat: %s: %s\n", flag, mr_error_last());
    rc = 2;
out:
    if (handler) sigaction(SIGINT, &old_int, NULL);
    free(line);
    json_decref(hist);
    mr_chat_parser_free(parser);
    mr_tokstream_free(ts);
    mr_engine_free(e);
    mr_model_close(m);
    mr_chat_free(tmpl);
    mr_tokenizer_free(tok);
    mr_resolution_free(r);
    mr_options_free(&o);
    return rc;
}
