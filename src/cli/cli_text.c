/* cli_text.c — the model folder's tokenizer and chat template for the CLI
 * commands, prompt encoding and streamed text output (cli_text.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_text.h"

int mr_cli_text_open(const char *cmd, const char *dir, bool need_chat, mr_tokenizer **t, mr_chat **c) {
    *t = NULL;
    *c = NULL;
    mr_status st = mr_tokenizer_load(dir, t);
    if (st) {
        mr_cli_fail(cmd, "cannot load the tokenizer");
        return st == MR_ENOMEM ? 1 : 2;
    }
    if (!need_chat) return 0;
    st = mr_chat_open(dir, c);
    if (st) {
        mr_cli_fail(cmd, "cannot load the chat template");
        mr_tokenizer_free(*t);
        *t = NULL;
        return st == MR_ENOMEM ? 1 : 2;
    }
    return 0;
}

static int encode(const char *cmd, const mr_tokenizer *t, const char *text, size_t len, mr_tok_ids *out) {
    mr_status st = mr_tokenizer_encode(t, text, len, 0, out, NULL);
    if (st) {
        mr_cli_fail(cmd, "cannot encode the prompt");
        return st == MR_ENOMEM ? 1 : 2;
    }
    if (out->n == 0) {
        fprintf(stderr, "moerun %s: the prompt is empty\n", cmd);
        return 2;
    }
    return 0;
}

int mr_cli_text_encode(const char *cmd, const mr_tokenizer *t, const char *text, mr_tok_ids *out) {
    return encode(cmd, t, text, strlen(text), out);
}

int mr_cli_messages_encode(const char *cmd, const mr_tokenizer *t, const mr_chat *c, const json_t *messages,
                           mr_tok_ids *out) {
    mr_chat_request rq = {.messages = messages, .add_generation_prompt = true};
    char *text = NULL;
    size_t len = 0;
    mr_status st = mr_chat_apply(c, &rq, &text, &len);
    if (st) {
        mr_cli_fail(cmd, "cannot render the chat template");
        return st == MR_ENOMEM ? 1 : 2;
    }
    int rc = encode(cmd, t, text, len, out);
    mr_free(text);
    return rc;
}

int mr_cli_chat_encode(const char *cmd, const mr_tokenizer *t, const mr_chat *c, const char *system, const char *user,
                       mr_tok_ids *out) {
    json_t *msgs = json_array();
    if (!msgs) return 1;
    if (system) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", system));
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", user));
    int rc = json_array_size(msgs) == (system ? 2u : 1u) ? mr_cli_messages_encode(cmd, t, c, msgs, out) : 2;
    if (rc == 2 && json_array_size(msgs) != (system ? 2u : 1u))
        fprintf(stderr, "moerun %s: the prompt is not valid UTF-8\n", cmd);
    json_decref(msgs);
    return rc;
}

int mr_cli_prompts_from_ids(mr_tok_ids *ids, mr_cli_prompts *p) {
    memset(p, 0, sizeof *p);
    p->ids = malloc(ids->n * sizeof(int32_t));
    p->off = calloc(1, sizeof(int64_t));
    p->len = calloc(1, sizeof(int64_t));
    if (!p->ids || !p->off || !p->len) {
        mr_cli_prompts_free(p);
        mr_tok_ids_free(ids);
        fprintf(stderr, "moerun: out of memory\n");
        return 1;
    }
    memcpy(p->ids, ids->ids, ids->n * sizeof(int32_t));
    p->n = 1;
    p->len[0] = (int64_t)ids->n;
    mr_tok_ids_free(ids);
    return 0;
}

static int write_out(const char *cmd, const char *s, size_t n) {
    if (n && fwrite(s, 1, n, stdout) != n) {
        fprintf(stderr, "moerun %s: cannot write the output\n", cmd);
        return 1;
    }
    if (fflush(stdout) != 0) {
        fprintf(stderr, "moerun %s: cannot write the output\n", cmd);
        return 1;
    }
    return 0;
}

int mr_cli_stream_token(const char *cmd, mr_tokstream *s, int32_t tok) {
    const char *txt;
    size_t n;
    if (mr_tokstream_push(s, &tok, 1, &txt, &n)) {
        mr_cli_fail(cmd, "cannot decode a generated token");
        return 1;
    }
    return write_out(cmd, txt, n);
}

int mr_cli_stream_end(const char *cmd, mr_tokstream *s) {
    const char *txt;
    size_t n;
    if (mr_tokstream_flush(s, &txt, &n)) {
        mr_cli_fail(cmd, "cannot decode the generated tokens");
        return 1;
    }
    return write_out(cmd, txt, n);
}
