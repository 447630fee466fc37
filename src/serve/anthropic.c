/* anthropic.c — Anthropic's Messages API (POST /v1/messages, and
 * /v1/messages/count_tokens) on the chat path: what the `anthropic` client,
 * and the coding agents built on it, send to a MiniMax-M2 server.
 *
 * The request becomes a chat completions request, which is then parsed,
 * checked and run as any other (one answer):
 *   system (a string or text blocks)      -> a system message first
 *   messages [{"role": "user" | "assistant", "content": a string or blocks}]
 *     text                                -> the message's text
 *     tool_use {"id", "name", "input"}    -> a tool call of the assistant
 *     tool_result {"tool_use_id", "content"} -> a tool message (before the
 *                                             user text of the same message)
 *     thinking {"thinking"}               -> the assistant's reasoning_content
 *   max_tokens, temperature, top_p, top_k, stop_sequences (stop), stream
 *   tools [{"name", "description", "input_schema"}] -> function tools
 *   tool_choice auto | any | tool {name} | none, disable_parallel_tool_use
 * cache_control marks are accepted anywhere (the prefix cache needs none).
 * The answer: content blocks thinking (the reasoning), text, tool_use (its
 * input the call's arguments as JSON); stop_reason end_turn, max_tokens,
 * stop_sequence (with the string) or tool_use; usage with the prompt tokens
 * the prefix cache held as cache_read_input_tokens. Streamed as Anthropic's
 * events: message_start, content_block_start / _delta / _stop per block,
 * message_delta, message_stop (an error: an error event). Errors are
 * {"type": "error", "error": {"type", "message"}}. */
#include <stdio.h>
#include <string.h>

#include "serve/serve_internal.h"

static int oom(sv_error *e) { return sv_fail(e, 500, NULL, "out of memory"); }

/* Keys of an object outside the allowed ones: 400 naming the first. */
static int only_keys(const json_t *o, const char *where, const char *const *ok, sv_error *e) {
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)o, k, x) {
        bool known = false;
        for (int i = 0; ok[i] && !known; i++) known = !strcmp(k, ok[i]);
        if (!known) return sv_fail(e, 400, where, "%s.%.60s is not supported", where, k);
    }
    return 0;
}

/* Text blocks' text, joined; or the string. -1 with *e filled for another block type. */
static int blocks_text(const json_t *c, const char *where, sv_buf *out, sv_error *e) {
    if (json_is_string(c)) return sv_buf_add(out, json_string_value(c), json_string_length(c)) ? oom(e) : 0;
    if (!json_is_array(c)) return sv_fail(e, 400, where, "%s must be a string or a list of text blocks, got %s", where, sv_json_type(c));
    for (size_t k = 0; k < json_array_size(c); k++) {
        const json_t *b = json_array_get(c, k);
        const char *t = json_string_value(json_object_get(b, "type"));
        const json_t *txt = json_object_get(b, "text");
        if (!t || strcmp(t, "text") || !json_is_string(txt))
            return sv_fail(e, 400, where, "%s[%zu] must be a text block (images and documents are not supported)", where, k);
        if (sv_buf_add(out, json_string_value(txt), json_string_length(txt))) return oom(e);
    }
    return 0;
}

static int one_message(const json_t *m, size_t i, json_t *msgs, sv_error *e) {
    char w[48];
    snprintf(w, sizeof w, "messages[%zu]", i);
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!json_is_object(m) || !role || (strcmp(role, "user") && strcmp(role, "assistant")))
        return sv_fail(e, 400, w, "%s must be {\"role\": \"user\" | \"assistant\", \"content\": ...}", w);
    static const char *const KEYS[] = {"role", "content", NULL};
    if (only_keys(m, w, KEYS, e)) return -1;
    const json_t *c = json_object_get(m, "content");
    char wc[64];
    snprintf(wc, sizeof wc, "%s.content", w);
    if (json_is_string(c))
        return json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", role, "content", c)) ? oom(e) : 0;
    if (!json_is_array(c)) return sv_fail(e, 400, wc, "%s must be a string or a list of blocks, got %s", wc, sv_json_type(c));
    const bool user = !strcmp(role, "user");
    sv_buf text = {0}, think = {0};
    json_t *calls = json_array();
    int rc = calls ? 0 : oom(e);
    for (size_t k = 0; k < json_array_size(c) && !rc; k++) {
        const json_t *b = json_array_get(c, k);
        const char *t = json_string_value(json_object_get(b, "type"));
        char wb[96];
        snprintf(wb, sizeof wb, "%s[%zu]", wc, k);
        if (!t) {
            rc = sv_fail(e, 400, wb, "%s has no type", wb);
        } else if (!strcmp(t, "text")) {
            const json_t *x = json_object_get(b, "text");
            if (!json_is_string(x)) rc = sv_fail(e, 400, wb, "%s needs a text string", wb);
            else if (sv_buf_add(&text, json_string_value(x), json_string_length(x))) rc = oom(e);
        } else if (!strcmp(t, "tool_result") && user) {
            const json_t *id = json_object_get(b, "tool_use_id");
            sv_buf out = {0};
            const json_t *bc = json_object_get(b, "content");
            if (!json_is_string(id)) rc = sv_fail(e, 400, wb, "%s needs a tool_use_id string", wb);
            if (!rc && bc) rc = blocks_text(bc, wb, &out, e);
            if (!rc && json_array_append_new(msgs, json_pack("{s:s,s:O,s:s%}", "role", "tool", "tool_call_id", id, "content",
                                                             out.p ? out.p : "", out.len)))
                rc = oom(e);
            sv_buf_free(&out);
        } else if (!strcmp(t, "tool_use") && !user) {
            const json_t *id = json_object_get(b, "id"), *nm = json_object_get(b, "name"), *in = json_object_get(b, "input");
            char *args = json_is_object(in) ? json_dumps(in, JSON_COMPACT) : NULL;
            if (!json_is_string(id) || !json_is_string(nm) || !args)
                rc = sv_fail(e, 400, wb, "%s needs id and name strings and an input object", wb);
            else if (json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:s}}", "id", id, "type", "function", "function",
                                                            "name", nm, "arguments", args)))
                rc = oom(e);
            free(args);
        } else if ((!strcmp(t, "thinking") || !strcmp(t, "redacted_thinking")) && !user) {
            const json_t *x = json_object_get(b, "thinking");
            if (json_is_string(x) && sv_buf_add(&think, json_string_value(x), json_string_length(x))) rc = oom(e);
        } else {
            rc = sv_fail(e, 400, wb, "%s.type is \"%.40s\"; a %s message takes %s blocks (images and documents are not "
                         "supported)", wb, t, role, user ? "text and tool_result" : "text, thinking and tool_use");
        }
    }
    if (!rc && (text.len || (!user && (json_array_size(calls) || think.len)) || (user && !json_array_size(c)))) {
        json_t *mm = json_pack("{s:s,s:s%}", "role", role, "content", text.p ? text.p : "", text.len);
        if (mm && json_array_size(calls)) json_object_set(mm, "tool_calls", calls);
        if (mm && think.len) json_object_set_new(mm, "reasoning_content", json_stringn(think.p, think.len));
        if (!mm || json_array_append_new(msgs, mm)) rc = oom(e);
    }
    json_decref(calls);
    sv_buf_free(&text);
    sv_buf_free(&think);
    return rc;
}

static int tools_of(const json_t *v, json_t *chat, sv_error *e) {
    if (!json_is_array(v)) return sv_fail(e, 400, "tools", "tools must be a list, got %s", sv_json_type(v));
    json_t *out = json_array();
    if (!out || json_object_set_new(chat, "tools", out)) return oom(e);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *t = json_array_get(v, i);
        const char *type = json_string_value(json_object_get(t, "type"));
        char w[32];
        snprintf(w, sizeof w, "tools[%zu]", i);
        if (!json_is_object(t)) return sv_fail(e, 400, w, "%s must be an object", w);
        if (type && strcmp(type, "custom"))
            return sv_fail(e, 400, w, "%s.type is \"%.60s\"; this server runs client tools only (name, input_schema)", w, type);
        static const char *const KEYS[] = {"type", "name", "description", "input_schema", "cache_control", NULL};
        if (only_keys(t, w, KEYS, e)) return -1;
        const json_t *nm = json_object_get(t, "name"), *sc = json_object_get(t, "input_schema");
        if (!json_is_string(nm) || !json_is_object(sc)) return sv_fail(e, 400, w, "%s needs a name and an input_schema object", w);
        json_t *fn = json_pack("{s:O}", "name", nm); /* OpenAI's key order: templates print the function as JSON */
        if (fn && json_is_string(json_object_get(t, "description"))) json_object_set(fn, "description", json_object_get(t, "description"));
        if (fn) json_object_set(fn, "parameters", (json_t *)sc);
        if (!fn || json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function", fn))) return oom(e);
    }
    return 0;
}

static int tool_choice_of(const json_t *v, json_t *chat, sv_error *e) {
    const char *type = json_string_value(json_object_get(v, "type"));
    const json_t *dp = json_object_get(v, "disable_parallel_tool_use");
    if (!type) return sv_fail(e, 400, "tool_choice", "tool_choice must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
    if (json_is_true(dp) && json_object_set_new(chat, "parallel_tool_calls", json_false())) return oom(e);
    json_t *tc = NULL;
    if (!strcmp(type, "auto")) tc = json_string("auto");
    else if (!strcmp(type, "any")) tc = json_string("required");
    else if (!strcmp(type, "none")) tc = json_string("none");
    else if (!strcmp(type, "tool")) {
        const json_t *nm = json_object_get(v, "name");
        if (!json_is_string(nm)) return sv_fail(e, 400, "tool_choice.name", "tool_choice {\"type\": \"tool\"} needs a name");
        tc = json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", nm);
    } else {
        return sv_fail(e, 400, "tool_choice.type", "tool_choice.type is \"%.40s\"; it must be auto, any, tool or none", type);
    }
    return !tc || json_object_set_new(chat, "tool_choice", tc) ? oom(e) : 0;
}

int sv_anthropic_to_chat(const char *body, size_t len, bool count_only, char **chat_json, sv_error *e) {
    *chat_json = NULL;
    json_t *req = sv_body_object(body, len, e);
    if (!req) return -1;
    json_t *chat = json_object(), *msgs = json_array();
    int rc = !chat || !msgs ? oom(e) : 0;
    const char *k;
    json_t *x;
    if (!rc) json_object_foreach(req, k, x) {
        if (rc) break;
        if (json_is_null(x)) continue;
        static const char *const PASS[] = {"model", "temperature", "top_p", "top_k", "stream", "max_tokens",
                                           /* the chat's own extras, for benchmarks and tests */
                                           "seed", "ignore_eos", "min_tokens", "min_p", "repetition_penalty",
                                           "presence_penalty", "frequency_penalty", "debug_forced_output", NULL};
        bool pass = false;
        for (int i = 0; PASS[i] && !pass; i++) pass = !strcmp(k, PASS[i]);
        if (pass) {
            if (!(count_only && (!strcmp(k, "max_tokens") || !strcmp(k, "stream"))) && json_object_set(chat, k, x)) rc = oom(e);
        } else if (!strcmp(k, "messages") || !strcmp(k, "system")) {
            rc = 0; /* below, in order */
        } else if (!strcmp(k, "stop_sequences")) {
            if (json_object_set(chat, "stop", x)) rc = oom(e);
        } else if (!strcmp(k, "tools")) {
            rc = tools_of(x, chat, e);
        } else if (!strcmp(k, "tool_choice")) {
            rc = tool_choice_of(x, chat, e);
        } else if (!strcmp(k, "metadata")) {
            static const char *const KEYS[] = {"user_id", NULL};
            if (!json_is_object(x)) rc = sv_fail(e, 400, k, "metadata must be an object");
            else rc = only_keys(x, "metadata", KEYS, e);
        } else if (!strcmp(k, "thinking")) {
            /* MiniMax-M2 always reasons: enabled or not, its reasoning comes back as a thinking block */
            const char *t = json_string_value(json_object_get(x, "type"));
            if (!t || (strcmp(t, "enabled") && strcmp(t, "disabled") && strcmp(t, "adaptive")))
                rc = sv_fail(e, 400, "thinking", "thinking must be {\"type\": \"enabled\" | \"disabled\" | \"adaptive\", ...}");
        } else if (!strcmp(k, "service_tier")) {
            if (!json_is_string(x)) rc = sv_fail(e, 400, k, "service_tier must be a string");
        } else {
            rc = sv_fail(e, 400, k, "unknown field '%.60s'", k);
        }
    }
    if (!rc && !count_only && !json_object_get(req, "max_tokens")) rc = sv_fail(e, 400, "max_tokens", "max_tokens is required");
    const json_t *sys = rc ? NULL : json_object_get(req, "system");
    if (sys && !json_is_null(sys)) {
        sv_buf t = {0};
        if (json_is_array(sys)) { /* text blocks, with cache_control marks */
            for (size_t i = 0; i < json_array_size(sys) && !rc; i++) {
                static const char *const KEYS[] = {"type", "text", "cache_control", "citations", NULL};
                char w[32];
                snprintf(w, sizeof w, "system[%zu]", i);
                rc = only_keys(json_array_get(sys, i), w, KEYS, e);
            }
        }
        if (!rc) rc = blocks_text(sys, "system", &t, e);
        if (!rc && json_array_append_new(msgs, json_pack("{s:s,s:s%}", "role", "system", "content", t.p ? t.p : "", t.len)))
            rc = oom(e);
        sv_buf_free(&t);
    }
    const json_t *ms = rc ? NULL : json_object_get(req, "messages");
    if (!rc && (!json_is_array(ms) || !json_array_size(ms)))
        rc = sv_fail(e, 400, "messages", "messages must be a non-empty list, got %s", sv_json_type(ms));
    for (size_t i = 0; !rc && i < json_array_size(ms); i++) {
        /* cache_control marks inside the blocks are dropped: copies without them */
        json_t *m = json_deep_copy(json_array_get(ms, i));
        json_t *c = json_object_get(m, "content");
        for (size_t b = 0; json_is_array(c) && b < json_array_size(c); b++) json_object_del(json_array_get(c, b), "cache_control");
        rc = m ? one_message(m, i, msgs, e) : oom(e);
        json_decref(m);
    }
    if (!rc && json_object_set(chat, "messages", msgs)) rc = oom(e);
    if (!rc && !(*chat_json = json_dumps(chat, JSON_COMPACT))) rc = oom(e);
    json_decref(msgs);
    json_decref(chat);
    json_decref(req);
    return rc;
}

char *sv_anthropic_error_body(const sv_error *e) {
    const char *t = e->http == 401 ? "authentication_error" : e->http == 403 ? "permission_error"
                  : e->http == 404 ? "not_found_error" : e->http == 413 ? "request_too_large"
                  : e->http == 503 ? "overloaded_error" : e->http >= 500 ? "api_error" : "invalid_request_error";
    sv_buf b = {0};
    if (sv_buf_printf(&b, "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":", t) ||
        sv_buf_json_str(&b, e->message, strlen(e->message)) || sv_buf_lit(&b, "}}")) {
        sv_buf_free(&b);
        return NULL;
    }
    return b.p;
}

/* ---- the answer ---- */

static json_t *tool_input(const char *args, size_t n) {
    json_t *in = n ? json_loadb(args, n, 0, NULL) : NULL;
    if (!json_is_object(in)) { /* not an object (cut short): the text kept, as the chat path keeps it */
        json_decref(in);
        in = n ? json_pack("{s:s%}", "_raw_arguments", args, n) : json_object();
    }
    return in;
}

json_t *sv_anthropic_message(const sv_job *j, const char *model, const char *reasoning, size_t nr, const char *content,
                             size_t nc, const json_t *calls, const char *stop_reason, const char *stop_seq, json_t *usage) {
    char id[64];
    const char *dash = strchr(j->id, '-');
    snprintf(id, sizeof id, "msg_%s", dash ? dash + 1 : j->id);
    json_t *blocks = json_array();
    if (blocks && nr)
        json_array_append_new(blocks, json_pack("{s:s,s:s%,s:s}", "type", "thinking", "thinking", reasoning, nr, "signature", ""));
    if (blocks && content && (nc || !json_array_size(calls))) /* content NULL: message_start's empty shell */
        json_array_append_new(blocks, json_pack("{s:s,s:s%}", "type", "text", "text", content ? content : "", nc));
    for (size_t i = 0; blocks && i < json_array_size(calls); i++) {
        const json_t *c = json_array_get(calls, i), *f = json_object_get(c, "function");
        const char *a = json_string_value(json_object_get(f, "arguments"));
        json_array_append_new(blocks, json_pack("{s:s,s:O,s:O,s:o}", "type", "tool_use", "id", json_object_get(c, "id"), "name",
                                                json_object_get(f, "name"), "input", tool_input(a, a ? strlen(a) : 0)));
    }
    json_t *m = json_pack("{s:s,s:s,s:s,s:s,s:o,s:s?,s:s?,s:o}", "id", id, "type", "message", "role", "assistant", "model",
                          model, "content", blocks, "stop_reason", stop_reason, "stop_sequence", stop_seq, "usage", usage);
    return m; /* jansson's "o" takes the references even when packing fails */
}

json_t *sv_anthropic_usage(int64_t prompt, int64_t cached, int64_t out) {
    return json_pack("{s:I,s:I,s:I,s:I}", "input_tokens", (json_int_t)(prompt - cached), "cache_read_input_tokens",
                     (json_int_t)cached, "cache_creation_input_tokens", (json_int_t)0, "output_tokens", (json_int_t)out);
}

int sv_anthropic_begin(json_t *message, sv_buf *sse) { return sv_sse_typed("message_start", json_pack("{s:o}", "message", message), sse); }

static int block_stop(sv_resp_stream *rs, sv_buf *b) {
    if (!rs->kind) return 0;
    rs->kind = 0;
    return sv_sse_typed("content_block_stop", json_pack("{s:i}", "index", rs->index - 1), b);
}

static int block_start(sv_resp_stream *rs, int kind, const sv_tool_piece *t, sv_buf *b) {
    if (block_stop(rs, b)) return -1;
    const int i = rs->index++;
    rs->kind = kind;
    json_t *cb = kind == SV_RI_REASONING ? json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "", "signature", "")
               : kind == SV_RI_MESSAGE   ? json_pack("{s:s,s:s}", "type", "text", "text", "")
                                         : json_pack("{s:s,s:s,s:s,s:{}}", "type", "tool_use", "id", t->id, "name",
                                                     t->name ? t->name : "", "input");
    return sv_sse_typed("content_block_start", json_pack("{s:i,s:o}", "index", i, "content_block", cb), b);
}

static int block_delta(sv_resp_stream *rs, const char *dtype, const char *key, const char *d, size_t n, sv_buf *b) {
    return sv_sse_typed("content_block_delta", json_pack("{s:i,s:{s:s,s:s%}}", "index", rs->index - 1, "delta", "type", dtype,
                                                       key, d, n), b);
}

int sv_anthropic_piece(sv_resp_stream *rs, const sv_parse_out *po, sv_buf *sse) {
    if (po->n_reasoning) {
        if (rs->kind != SV_RI_REASONING && block_start(rs, SV_RI_REASONING, NULL, sse)) return -1;
        if (block_delta(rs, "thinking_delta", "thinking", po->reasoning, po->n_reasoning, sse)) return -1;
    }
    if (po->n_content) {
        if (rs->kind != SV_RI_MESSAGE && block_start(rs, SV_RI_MESSAGE, NULL, sse)) return -1;
        if (block_delta(rs, "text_delta", "text", po->content, po->n_content, sse)) return -1;
    }
    for (size_t k = 0; k < po->n_tools; k++) {
        const sv_tool_piece *t = &po->tools[k];
        if (t->id && block_start(rs, SV_RI_CALL, t, sse)) return -1;
        if (rs->kind != SV_RI_CALL || !t->args_len) continue;
        if (block_delta(rs, "input_json_delta", "partial_json", t->args, t->args_len, sse)) return -1;
    }
    return 0;
}

int sv_anthropic_end(sv_resp_stream *rs, const char *stop_reason, const char *stop_seq, json_t *usage, sv_buf *sse) {
    if (!usage || block_stop(rs, sse)) return json_decref(usage), -1;
    return sv_sse_typed("message_delta", json_pack("{s:{s:s,s:s?},s:o}", "delta", "stop_reason", stop_reason, "stop_sequence",
                                                 stop_seq, "usage", usage), sse) ||
                   sv_sse_typed("message_stop", json_object(), sse)
               ? -1
               : 0;
}

int sv_anthropic_fail(const char *message, sv_buf *sse) {
    return sv_sse_typed("error", json_pack("{s:{s:s,s:s}}", "error", "type", "api_error", "message", message), sse);
}
