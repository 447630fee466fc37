/* responses.c — OpenAI's Responses API (POST /v1/responses) on the chat path.
 *
 * The request becomes a chat completions request, which is then parsed,
 * checked and run as any other (one choice):
 *   input (a string: one user message; or items)  -> messages
 *     {"role", "content"} / {"type": "message", ...}   a message; content a
 *                                     string or input_text / output_text parts
 *     {"type": "function_call", "call_id", "name", "arguments"}
 *                                  -> a tool call of the assistant message
 *     {"type": "function_call_output", "call_id", "output"} -> a tool message
 *     {"type": "reasoning", "content" / "summary"} -> reasoning_content of
 *                                     the assistant message that follows
 *   instructions           -> a system message first
 *   max_output_tokens      -> max_completion_tokens
 *   tools [{"type": "function", "name", "parameters", ...}] -> chat tools
 *   tool_choice {"type": "function", "name"} -> chat's named form
 *   text.format (text | json_object | json_schema) -> response_format
 *   reasoning.effort       -> chat_template_kwargs.reasoning_effort (what
 *                              vLLM does; a template that reads it uses it)
 *   include message.output_text.logprobs, top_logprobs -> logprobs, top_logprobs
 *                             (respond.c gives the message the entries of its text's tokens)
 *   truncation "auto"      -> the request's resp_truncate (http.c drops the
 *                             conversation's first items until it fits)
 * and sampling fields as they are. With the server's response store (store.c)
 * a Response is kept unless the request says store false: its conversation
 * items (the previous response's, this input's, its output) go beside it, and
 * previous_response_id puts a kept conversation before the new input (the
 * previous instructions and tools are not carried over, as OpenAI's are not).
 * The Response object echoes the request's own fields (kept here as `echo`);
 * respond.c writes its output items, status and usage, and keeps it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "serve/serve_internal.h"

#define ENC_PREFIX SV_ENC_PREFIX

void sv_random_hex(char *out, size_t n) {
    uint8_t b[32];
    if (n > sizeof b) n = sizeof b;
    if (getrandom(b, n, GRND_NONBLOCK) != (ssize_t)n) {
        static atomic_ullong counter;
        uint64_t x = mr_now_ns() ^ (atomic_fetch_add(&counter, 1) * 0x9E3779B97F4A7C15ULL);
        for (size_t i = 0; i < n; i++, x = x * 6364136223846793005ULL + 1442695040888963407ULL) b[i] = (uint8_t)(x >> 56);
    }
    for (size_t i = 0; i < n; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
}

/* The text of a content value: a string, or a list of text parts (input_text, output_text, text; refusals
 * kept as text). NULL with *e filled otherwise. A new reference. */
static json_t *content_text(const json_t *c, const char *where, sv_error *e) {
    if (json_is_string(c)) return json_incref((json_t *)c);
    if (!json_is_array(c)) return sv_fail(e, 400, where, "%s must be a string or a list of parts, got %s", where, sv_json_type(c)), NULL;
    /* the parts' texts joined into one string (as the Messages API's text blocks): a template that reads a
     * message's content as a string (most do) must not be given a list */
    sv_buf b = {0};
    for (size_t k = 0; k < json_array_size(c); k++) {
        const json_t *p = json_array_get(c, k);
        const char *t = json_string_value(json_object_get(p, "type"));
        const json_t *txt = json_object_get(p, t && !strcmp(t, "refusal") ? "refusal" : "text");
        char w[128];
        snprintf(w, sizeof w, "%s[%zu]", where, k);
        if (!t || (strcmp(t, "input_text") && strcmp(t, "output_text") && strcmp(t, "text") && strcmp(t, "refusal"))) {
            sv_buf_free(&b);
            return sv_fail(e, 400, w, "%s.type is %s%s%s; this server reads text parts (input_text, output_text)", w,
                           t ? "\"" : "", t ? t : "missing", t ? "\"" : ""), NULL;
        }
        if (!json_is_string(txt)) {
            sv_buf_free(&b);
            return sv_fail(e, 400, w, "%s has no text string", w), NULL;
        }
        if (sv_buf_add(&b, json_string_value(txt), json_string_length(txt))) {
            sv_buf_free(&b);
            return sv_fail(e, 500, NULL, "out of memory"), NULL;
        }
    }
    json_t *out = json_stringn(b.p ? b.p : "", b.len);
    sv_buf_free(&b);
    if (!out) return sv_fail(e, 500, NULL, "out of memory"), NULL;
    return out;
}

/* The assistant message at the end of msgs that a function call or a reasoning item joins, made when the
 * last message is not one (or already has tool results after it). */
static json_t *open_assistant(json_t *msgs) {
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    const char *role = json_string_value(json_object_get(last, "role"));
    if (last && role && !strcmp(role, "assistant")) return last;
    json_t *m = json_pack("{s:s,s:s}", "role", "assistant", "content", "");
    if (!m || json_array_append_new(msgs, m)) return NULL;
    return m;
}

int sv_resp_input_msgs(const json_t *in, json_t *msgs, sv_error *e) {
    if (json_is_string(in))
        return json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "user", "content", in)) ? sv_fail(e, 500, NULL, "out of memory") : 0;
    if (!json_is_array(in) || !json_array_size(in))
        return sv_fail(e, 400, "input", "input must be a string or a non-empty list of items, got %s", sv_json_type(in));
    json_t *reasoning = NULL; /* a reasoning item's text, for the assistant message that follows */
    int rc = 0;
    for (size_t i = 0; i < json_array_size(in) && !rc; i++) {
        const json_t *it = json_array_get(in, i);
        char w[64];
        snprintf(w, sizeof w, "input[%zu]", i);
        if (!json_is_object(it)) {
            rc = sv_fail(e, 400, w, "%s must be an object, got %s", w, sv_json_type(it));
            break;
        }
        const char *type = json_string_value(json_object_get(it, "type"));
        const json_t *role = json_object_get(it, "role");
        if ((!type && role) || (type && !strcmp(type, "message"))) {
            const char *r = json_string_value(role);
            if (!r || (strcmp(r, "user") && strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "assistant"))) {
                rc = sv_fail(e, 400, w, "%s.role must be \"user\", \"system\", \"developer\" or \"assistant\"", w);
                break;
            }
            char wc[80];
            snprintf(wc, sizeof wc, "%s.content", w);
            json_t *c = content_text(json_object_get(it, "content"), wc, e);
            if (!c) {
                rc = -1;
                break;
            }
            json_t *m = json_pack("{s:s,s:o}", "role", r, "content", c);
            if (m && reasoning && !strcmp(r, "assistant")) json_object_set_new(m, "reasoning_content", reasoning), reasoning = NULL;
            if (!m || json_array_append_new(msgs, m)) rc = sv_fail(e, 500, NULL, "out of memory");
        } else if (type && !strcmp(type, "function_call")) {
            const json_t *id = json_object_get(it, "call_id"), *nm = json_object_get(it, "name"), *args = json_object_get(it, "arguments");
            if (!json_is_string(id) || !json_is_string(nm) || !json_is_string(args)) {
                rc = sv_fail(e, 400, w, "%s (a function_call) needs call_id, name and arguments as strings", w);
                break;
            }
            json_t *a = open_assistant(msgs);
            json_t *calls = a ? json_object_get(a, "tool_calls") : NULL;
            if (a && !calls && !json_object_set_new(a, "tool_calls", json_array())) calls = json_object_get(a, "tool_calls");
            if (a && reasoning) json_object_set_new(a, "reasoning_content", reasoning), reasoning = NULL;
            if (!calls || json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", id, "type", "function",
                                                                 "function", "name", nm, "arguments", args)))
                rc = sv_fail(e, 500, NULL, "out of memory");
        } else if (type && !strcmp(type, "function_call_output")) {
            const json_t *id = json_object_get(it, "call_id");
            char wc[80];
            snprintf(wc, sizeof wc, "%s.output", w);
            json_t *out = json_is_string(id) ? content_text(json_object_get(it, "output"), wc, e) : NULL;
            if (!json_is_string(id)) rc = sv_fail(e, 400, w, "%s (a function_call_output) needs a call_id string", w);
            else if (!out) rc = -1;
            else if (json_array_append_new(msgs, json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id", id, "content", out)))
                rc = sv_fail(e, 500, NULL, "out of memory");
        } else if (type && !strcmp(type, "reasoning")) {
            const json_t *parts = json_object_get(it, "content");
            if (!json_array_size(parts)) parts = json_object_get(it, "summary");
            const char *enc = json_string_value(json_object_get(it, "encrypted_content"));
            sv_buf t = {0};
            if (!json_array_size(parts) && enc) { /* ours gives the text back; another server's cannot be read */
                if (strncmp(enc, ENC_PREFIX, strlen(ENC_PREFIX))) rc = sv_fail(e, 400, w, "%s.encrypted_content is not this "
                                                                              "server's (it cannot be read here)", w);
                else if (sv_buf_add(&t, enc + strlen(ENC_PREFIX), strlen(enc + strlen(ENC_PREFIX)))) rc = sv_fail(e, 500, NULL, "out of memory");
            }
            for (size_t k = 0; k < json_array_size(parts) && !rc; k++) {
                const char *s = json_string_value(json_object_get(json_array_get(parts, k), "text"));
                if (!s) rc = sv_fail(e, 400, w, "%s: each reasoning part needs a text string", w);
                else if ((k && sv_buf_lit(&t, "\n")) || sv_buf_add(&t, s, strlen(s))) rc = sv_fail(e, 500, NULL, "out of memory");
            }
            json_decref(reasoning);
            reasoning = rc ? NULL : json_stringn(t.p ? t.p : "", t.len);
            sv_buf_free(&t);
        } else {
            rc = sv_fail(e, 400, w, "%s.type is %s%s%s; this server reads messages, function_call, function_call_output "
                         "and reasoning items", w, type ? "\"" : "", type ? type : "missing", type ? "\"" : "");
        }
    }
    if (!rc && reasoning) { /* reasoning last: an assistant turn of its own */
        json_t *a = open_assistant(msgs);
        if (!a) rc = sv_fail(e, 500, NULL, "out of memory");
        else json_object_set_new(a, "reasoning_content", reasoning), reasoning = NULL;
    }
    json_decref(reasoning);
    return rc;
}

json_t *sv_resp_ctx_items(const json_t *in, const char *hex) {
    json_t *out = json_array();
    char id[96];
    if (!out) return NULL;
    if (json_is_string(in)) {
        snprintf(id, sizeof id, "msg_%s_0", hex);
        if (json_array_append_new(out, json_pack("{s:s,s:s,s:s,s:[{s:s,s:O}]}", "id", id, "type", "message", "role", "user",
                                                 "content", "type", "input_text", "text", in)))
            return json_decref(out), NULL;
        return out;
    }
    for (size_t i = 0; i < json_array_size(in); i++) {
        json_t *it = json_deep_copy(json_array_get(in, i));
        if (!it || json_array_append_new(out, it)) return json_decref(out), NULL;
        const char *type = json_string_value(json_object_get(it, "type"));
        const char *role = json_string_value(json_object_get(it, "role"));
        const bool msg = !type || !strcmp(type, "message");
        const json_t *c = json_object_get(it, "content");
        bool bad = msg && json_object_set_new(it, "type", json_string("message"));
        if (msg && json_is_string(c)) {
            const bool out_text = role && !strcmp(role, "assistant");
            json_t *part = json_pack("{s:s,s:O}", "type", out_text ? "output_text" : "input_text", "text", c);
            if (part && out_text) json_object_set_new(part, "annotations", json_array());
            bad = bad || !part || json_object_set_new(it, "content", json_pack("[o]", part));
        }
        if (!json_is_string(json_object_get(it, "id"))) {
            snprintf(id, sizeof id, "%s_%s_%zu", msg ? "msg" : !strcmp(type, "function_call") ? "fc" :
                     !strcmp(type, "function_call_output") ? "fco" : "rs", hex, i);
            bad = bad || json_object_set_new(it, "id", json_string(id));
        }
        if (bad) return json_decref(out), NULL;
    }
    return out;
}

/* The conversation items a stored response holds (the previous response's, its input, its output), for
 * previous_response_id; NULL with *e filled. */
static json_t *previous_items(sv_store *store, const json_t *x, sv_error *e) {
    const char *k = "previous_response_id";
    if (!json_is_string(x)) return sv_fail(e, 400, k, "previous_response_id must be a string, got %s", sv_json_type(x)), NULL;
    if (strchr(json_string_value(x), '#')) /* (the store's other entries: a streamed response's events) */
        return sv_fail(e, 404, k, "Response with id '%.100s' not found", json_string_value(x)), NULL;
    if (!store)
        return sv_fail(e, 400, k, "previous_response_id needs the response store, which is off on this server "
                       "(--response-store-mb 0): send the whole conversation as input"), NULL;
    char *text = NULL;
    const int rc = sv_store_get(store, json_string_value(x), NULL, &text, NULL);
    if (rc > 0)
        return sv_fail(e, 404, k, "Response with id '%.100s' not found: never stored here (store false), deleted, or "
                       "evicted from the store (--response-store-mb)", json_string_value(x)), NULL;
    json_t *items = rc ? NULL : json_loads(text, 0, NULL);
    mr_free(text);
    if (!json_is_array(items)) {
        json_decref(items);
        return sv_fail(e, 500, NULL, "out of memory"), NULL;
    }
    return items;
}

static int tools_of(const json_t *v, json_t *chat, sv_error *e) {
    if (!json_is_array(v)) return sv_fail(e, 400, "tools", "tools must be a list, got %s", sv_json_type(v));
    json_t *out = json_array();
    if (!out || json_object_set_new(chat, "tools", out)) return sv_fail(e, 500, NULL, "out of memory");
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *t = json_array_get(v, i);
        const char *type = json_string_value(json_object_get(t, "type"));
        char w[32];
        snprintf(w, sizeof w, "tools[%zu]", i);
        if (!type || strcmp(type, "function"))
            return sv_fail(e, 400, w, "%s.type is %s%s%s; this server runs function tools only", w, type ? "\"" : "",
                           type ? type : "missing", type ? "\"" : "");
        json_t *fn = json_object();
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)t, k, x) {
            if (!strcmp(k, "type")) continue;
            if (strcmp(k, "name") && strcmp(k, "description") && strcmp(k, "parameters") && strcmp(k, "strict")) {
                json_decref(fn);
                return sv_fail(e, 400, w, "%s.%s is not a field of a function tool (name, description, parameters, strict)", w, k);
            }
            if (!json_is_null(x)) json_object_set(fn, k, x);
        }
        if (json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function", fn)))
            return sv_fail(e, 500, NULL, "out of memory");
    }
    return 0;
}

static int tool_choice_of(const json_t *v, json_t *chat, sv_error *e) {
    if (json_is_string(v)) return json_object_set(chat, "tool_choice", (json_t *)v) ? sv_fail(e, 500, NULL, "out of memory") : 0;
    const char *type = json_string_value(json_object_get(v, "type"));
    const json_t *nm = json_object_get(v, "name");
    if (!json_is_object(v) || !type || strcmp(type, "function") || !json_is_string(nm))
        return sv_fail(e, 400, "tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                       "\"name\": ...}");
    return json_object_set_new(chat, "tool_choice", json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", nm))
               ? sv_fail(e, 500, NULL, "out of memory") : 0;
}

/* text: {"format": {"type": "text" | "json_object" | "json_schema", "name", "schema", "strict"}, "verbosity"} */
static int text_of(const json_t *v, json_t *chat, sv_error *e) {
    if (!json_is_object(v)) return sv_fail(e, 400, "text", "text must be an object, got %s", sv_json_type(v));
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        if (!strcmp(k, "verbosity")) {
            if (!json_is_null(x) && (!json_is_string(x) || strcmp(json_string_value(x), "medium")))
                return sv_fail(e, 400, "text.verbosity", "text.verbosity other than \"medium\" is not supported");
        } else if (strcmp(k, "format")) {
            return sv_fail(e, 400, "text", "text.%s is not supported (format and verbosity are)", k);
        }
    }
    const json_t *f = json_object_get(v, "format");
    if (!f || json_is_null(f)) return 0;
    const char *type = json_string_value(json_object_get(f, "type"));
    if (!type) return sv_fail(e, 400, "text.format.type", "text.format needs a type (text, json_object, json_schema)");
    json_t *rf = NULL;
    if (!strcmp(type, "text")) return 0;
    if (!strcmp(type, "json_object")) rf = json_pack("{s:s}", "type", "json_object");
    else if (!strcmp(type, "json_schema")) {
        const json_t *sc = json_object_get(f, "schema");
        if (!json_is_object(sc)) return sv_fail(e, 400, "text.format.schema", "text.format.schema must be a JSON schema object");
        const json_t *nm = json_object_get(f, "name");
        rf = json_pack("{s:s,s:{s:s,s:O}}", "type", "json_schema", "json_schema", "name", json_is_string(nm) ? json_string_value(nm) : "schema",
                       "schema", sc);
    } else {
        return sv_fail(e, 400, "text.format.type", "text.format.type is \"%.40s\"; it must be \"text\", \"json_object\" or "
                       "\"json_schema\"", type);
    }
    return !rf || json_object_set_new(chat, "response_format", rf) ? sv_fail(e, 500, NULL, "out of memory") : 0;
}

int sv_responses_to_chat(const char *body, size_t len, sv_store *store, sv_store *convs, sv_resp_in *in, sv_error *e) {
    memset(in, 0, sizeof *in);
    json_t *req = sv_body_object(body, len, e);
    if (!req) return -1;
    char hex[49];
    sv_random_hex(hex, 24);
    snprintf(in->id, sizeof in->id, "resp_%s", hex);
    json_t *chat = json_object(), *msgs = json_array(), *prev = NULL, *mine = NULL;
    char conv[64] = "";
    json_t *ech = json_pack("{s:n,s:n,s:{},s:b,s:n,s:n,s:s,s:[],s:{s:{s:s}},s:b,s:s,s:n,s:n,s:{s:n,s:n},s:b}", "instructions",
                            "max_output_tokens", "metadata", "parallel_tool_calls", 1, "temperature", "top_p",
                            "tool_choice", "auto", "tools", "text", "format", "type", "text", "store", 0, "truncation",
                            "disabled", "previous_response_id", "user", "reasoning", "effort", "summary", "background", 0);
    int rc = !chat || !msgs || !ech ? sv_fail(e, 500, NULL, "out of memory") : 0;
    bool logprobs = false;
    int top = 0;
    static const char *const PASS[] = {"model", "temperature", "top_p", "stream", "parallel_tool_calls", "user", "seed",
                                       "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
                                       "stop", "ignore_eos", "min_tokens", "logit_bias", "debug_forced_output",
                                       "chat_template_kwargs", "skip_special_tokens", NULL};
    static const char *const ECHO[] = {"temperature", "top_p", "parallel_tool_calls", "user", "instructions",
                                       "max_output_tokens", "metadata", "tools", "tool_choice", "text",
                                       "previous_response_id", NULL};
    const char *k;
    json_t *x;
    if (!rc) json_object_foreach(req, k, x) {
        if (rc) break;
        bool pass = false;
        for (int i = 0; PASS[i] && !pass; i++) pass = !strcmp(k, PASS[i]);
        for (int i = 0; ECHO[i]; i++)
            if (!strcmp(k, ECHO[i]) && !json_is_null(x)) json_object_set(ech, k, x);
        if (json_is_null(x) && strcmp(k, "input")) continue; /* null is absent */
        if (pass) {
            if (json_object_set(chat, k, x)) rc = sv_fail(e, 500, NULL, "out of memory");
        } else if (!strcmp(k, "input")) {
            rc = 0; /* after the instructions, below */
        } else if (!strcmp(k, "instructions")) {
            if (!json_is_string(x)) rc = sv_fail(e, 400, k, "instructions must be a string, got %s", sv_json_type(x));
        } else if (!strcmp(k, "max_output_tokens")) {
            if (json_object_set(chat, "max_completion_tokens", x)) rc = sv_fail(e, 500, NULL, "out of memory");
        } else if (!strcmp(k, "tools")) {
            rc = tools_of(x, chat, e);
        } else if (!strcmp(k, "tool_choice")) {
            rc = tool_choice_of(x, chat, e);
        } else if (!strcmp(k, "text")) {
            rc = text_of(x, chat, e);
        } else if (!strcmp(k, "reasoning")) {
            const json_t *eff = json_object_get(x, "effort"), *sum = json_object_get(x, "summary");
            if (!sum || json_is_null(sum)) sum = json_object_get(x, "generate_summary"); /* its older name */
            const char *sv = json_string_value(sum);
            const char *kk, *other = NULL;
            json_t *kv;
            json_object_foreach((json_t *)x, kk, kv)
                if (!other && strcmp(kk, "effort") && strcmp(kk, "summary") && strcmp(kk, "generate_summary")) other = kk;
            if (other) {
                rc = sv_fail(e, 400, "reasoning", "reasoning.%.40s is not a field of reasoning (effort, summary)", other);
            } else if (!json_is_object(x) || (eff && !json_is_null(eff) && !json_is_string(eff))) {
                rc = sv_fail(e, 400, "reasoning", "reasoning must be {\"effort\": ..., \"summary\": ...}");
            } else if (sum && !json_is_null(sum) && (!sv || (strcmp(sv, "auto") && strcmp(sv, "concise") && strcmp(sv, "detailed")))) {
                rc = sv_fail(e, 400, "reasoning.summary", "reasoning.summary must be \"auto\", \"concise\" or \"detailed\"");
            } else {
                /* a summary is asked for (as vLLM, taken and echoed): the reasoning comes back whole, as the
                 * reasoning item's reasoning_text, which is what a summary would stand for */
                if (sv) json_object_set(json_object_get(ech, "reasoning"), "summary", (json_t *)sum);
                if (json_is_string(eff)) {
                    json_t *kw = json_object_get(chat, "chat_template_kwargs");
                    if (!kw) json_object_set_new(chat, "chat_template_kwargs", kw = json_object());
                    json_object_set(kw, "reasoning_effort", (json_t *)eff);
                    json_object_set(json_object_get(ech, "reasoning"), "effort", (json_t *)eff);
                }
            }
        } else if (!strcmp(k, "store")) {
            if (!json_is_boolean(x)) rc = sv_fail(e, 400, k, "store must be a boolean");
        } else if (!strcmp(k, "previous_response_id")) {
            if (!json_is_null(json_object_get(req, "conversation")) && json_object_get(req, "conversation"))
                rc = sv_fail(e, 400, "conversation", "conversation and previous_response_id cannot be used together");
            else if (!(prev = previous_items(store, x, e))) rc = -1;
        } else if (!strcmp(k, "conversation")) { /* claimed below, once this input's items are known */
            if (sv_conv_id(convs, x, conv, e)) rc = -1;
            else if (json_object_set_new(ech, k, json_pack("{s:s}", "id", conv))) rc = sv_fail(e, 500, NULL, "out of memory");
        } else if (!strcmp(k, "background")) {
            if (!json_is_boolean(x)) rc = sv_fail(e, 400, k, "background must be a boolean");
            in->background = json_is_true(x);
        } else if (!strcmp(k, "truncation")) {
            const char *tv = json_string_value(x);
            if (!tv || (strcmp(tv, "disabled") && strcmp(tv, "auto")))
                rc = sv_fail(e, 400, k, "truncation must be \"auto\" or \"disabled\"");
            else if ((in->truncate = !strcmp(tv, "auto")) && json_object_set(ech, k, x))
                rc = sv_fail(e, 500, NULL, "out of memory");
        } else if (!strcmp(k, "include")) {
            if (!json_is_array(x)) rc = sv_fail(e, 400, k, "include must be a list");
            for (size_t i = 0; !rc && i < json_array_size(x); i++) {
                const char *inc = json_string_value(json_array_get(x, i));
                if (inc && !strcmp(inc, "reasoning.encrypted_content")) /* what clients that store nothing send */
                    in->encrypted = true;
                else if (inc && !strcmp(inc, "message.output_text.logprobs"))
                    logprobs = true;
                else
                    rc = sv_fail(e, 400, k, "include \"%.60s\" is not supported (reasoning.encrypted_content and "
                                 "message.output_text.logprobs are)", inc ? inc : "?");
            }
        } else if (!strcmp(k, "metadata")) {
            rc = sv_check_metadata(x, k, e);
        } else if (!strcmp(k, "service_tier")) {
            if (!json_is_string(x) || (strcmp(json_string_value(x), "auto") && strcmp(json_string_value(x), "default")))
                rc = sv_fail(e, 400, k, "service_tier must be \"auto\" or \"default\"");
        } else if (!strcmp(k, "prompt_cache_key") || !strcmp(k, "safety_identifier")) {
            if (!json_is_string(x)) rc = sv_fail(e, 400, k, "%s must be a string (the prefix cache needs no key)", k);
        } else if (!strcmp(k, "prompt_cache_retention") || !strcmp(k, "prompt_cache_options")) {
            /* hints (the prefix cache keeps what memory allows, and finds shared prefixes by itself) */
            const char *pv = json_string_value(x);
            if (!strcmp(k, "prompt_cache_options") ? !json_is_object(x)
                                                   : !pv || (strcmp(pv, "in_memory") && strcmp(pv, "in-memory") && strcmp(pv, "24h")))
                rc = sv_fail(e, 400, k, "%s must be %s", k, !strcmp(k, "prompt_cache_options") ? "an object"
                                                                                 : "\"in_memory\" or \"24h\"");
        } else if (!strcmp(k, "stream_options")) {
            if (!json_is_object(x)) rc = sv_fail(e, 400, k, "stream_options must be an object");
        } else if (!strcmp(k, "top_logprobs")) {
            if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > SV_MAX_TOP_LOGPROBS)
                rc = sv_fail(e, 400, k, "top_logprobs must be an integer from 0 to %d", SV_MAX_TOP_LOGPROBS);
            else top = (int)json_integer_value(x);
        } else if (!strcmp(k, "max_tool_calls")) { /* a bound on built-in tools' calls: this server has none */
            if (!json_is_integer(x) || json_integer_value(x) < 0) rc = sv_fail(e, 400, k, "max_tool_calls must be an integer >= 0");
            else if (json_object_set(ech, k, x)) rc = sv_fail(e, 500, NULL, "out of memory");
        } else if (!strcmp(k, "prompt")) {
            rc = sv_fail(e, 400, k, "prompt (a stored prompt template) is not supported by this server: send instructions "
                         "and input");
        } else {
            rc = sv_fail(e, 400, k, "unknown field '%.60s'", k);
        }
    }
    /* logprobs: asked for with include message.output_text.logprobs (OpenAI's, vLLM's), or by asking for
     * alternatives; they come on the message's output_text, one entry per token of its text */
    if (!rc && (json_object_set_new(ech, "top_logprobs", json_integer(top)) ||
                ((logprobs || top > 0) && (json_object_set_new(chat, "logprobs", json_true()) ||
                                           json_object_set_new(chat, "top_logprobs", json_integer(top))))))
        rc = sv_fail(e, 500, NULL, "out of memory");
    const json_t *ins = req ? json_object_get(req, "instructions") : NULL;
    if (!rc && json_is_string(ins) && json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "system", "content", ins)))
        rc = sv_fail(e, 500, NULL, "out of memory");
    if (!rc && !json_object_get(req, "input")) rc = sv_fail(e, 400, "input", "input is required");
    /* this input as conversation items (each with an id), once it is known to read as messages (its messages
     * are made again below, after the previous conversation's: a call may join the assistant turn before) */
    if (!rc) {
        json_t *scratch = json_array();
        rc = scratch ? sv_resp_input_msgs(json_object_get(req, "input"), scratch, e) : sv_fail(e, 500, NULL, "out of memory");
        json_decref(scratch);
    }
    if (!rc && !(mine = sv_resp_ctx_items(json_object_get(req, "input"), hex))) rc = sv_fail(e, 500, NULL, "out of memory");
    if (!rc && conv[0]) { /* the conversation claimed, with room for these items (its output comes past the
                             bound: one running response per conversation bounds it), until the request ends */
        const size_t need = json_dumpb(mine, NULL, 0, JSON_COMPACT) + 1024;
        if (!(prev = sv_conv_claim(convs, conv, in->id, need, e))) rc = -1;
        else snprintf(in->conv, sizeof in->conv, "%s", conv), in->conv_reserved = need;
    }
    if (!rc && json_array_size(prev) && sv_resp_input_msgs(prev, msgs, e)) rc = sv_fail(e, 500, NULL, "the stored conversation could not be read");
    if (!rc) rc = sv_resp_input_msgs(json_object_get(req, "input"), msgs, e);
    if (!rc && json_object_set(chat, "messages", msgs)) rc = sv_fail(e, 500, NULL, "out of memory");
    if (!rc && !(in->chat_json = json_dumps(chat, JSON_COMPACT))) rc = sv_fail(e, 500, NULL, "out of memory");
    const json_t *st = req ? json_object_get(req, "store") : NULL;
    in->keep = store && !json_is_false(st);
    if (!rc && in->background && !in->keep)
        rc = sv_fail(e, 400, "background", store ? "background needs store (a background response is read back with GET "
                     "/v1/responses/{id})" : "background needs the response store, which is off on this server "
                     "(--response-store-mb 0)");
    if (!rc && in->background) json_object_set_new(ech, "background", json_true());
    if (!rc) {
        in->ctx = prev ? json_incref(prev) : json_array();
        if (!in->ctx || json_array_extend(in->ctx, mine) || json_object_set_new(ech, "store", json_boolean(in->keep)))
            rc = sv_fail(e, 500, NULL, "out of memory");
        if (!rc && in->conv[0]) in->conv_input = json_incref(mine);
    }
    json_decref(mine);
    if (!rc) in->echo = json_incref(ech);
    if (rc) {
        free(in->chat_json);
        json_decref(in->ctx);
        json_decref(in->conv_input);
        if (in->conv[0]) sv_conv_release(convs, in->conv, in->id, in->conv_reserved);
        in->chat_json = NULL, in->ctx = NULL, in->conv_input = NULL, in->conv[0] = 0;
    }
    json_decref(prev);
    json_decref(ech);
    json_decref(msgs);
    json_decref(chat);
    json_decref(req);
    return rc;
}

int sv_resp_store(sv_store *st, const char *id, const json_t *ctx, const json_t *response, char **text) {
    json_t *items = json_copy((json_t *)ctx);
    char *it = items && !json_array_extend(items, json_object_get(response, "output")) ? json_dumps(items, JSON_COMPACT) : NULL;
    char *rt = it ? json_dumps(response, JSON_COMPACT) : NULL;
    const int rc = rt ? sv_store_put(st, id, rt, it, (int)json_array_size(ctx)) : -1;
    free(it);
    json_decref(items);
    if (text && !rc) *text = rt;
    else free(rt);
    return rc;
}

static const char *nth_id(const json_t *items, long i) {
    const char *id = json_string_value(json_object_get(json_array_get(items, (size_t)i), "id"));
    return id ? id : "";
}

char *sv_item_page(const json_t *all, long n, const char *limit, const char *order, const char *after, const char *of,
                   sv_error *e) {
    long lim = 20;
    if (limit) {
        char *end;
        errno = 0;
        lim = strtol(limit, &end, 10);
        if (errno || end == limit || *end || lim < 1 || lim > 100)
            return sv_fail(e, 400, "limit", "limit must be an integer from 1 to 100, got '%.40s'", limit), NULL;
    }
    if (order && strcmp(order, "asc") && strcmp(order, "desc"))
        return sv_fail(e, 400, "order", "order must be \"asc\" or \"desc\", got '%.40s'", order), NULL;
    const bool desc = !order || !strcmp(order, "desc");
    json_t *data = json_array();
    if (n > (long)json_array_size(all)) n = (long)json_array_size(all);
    long at = 0; /* the position in the order asked */
    if (after) {
        while (at < n && strcmp(after, nth_id(all, desc ? n - 1 - at : at))) at++;
        if (at == n) {
            json_decref(data);
            return sv_fail(e, 400, "after", "after names no %s: '%.80s'", of, after), NULL;
        }
        at++;
    }
    bool bad = !data;
    for (long k = 0; !bad && k < lim && at < n; k++, at++)
        bad = json_array_append(data, json_array_get(all, (size_t)(desc ? n - 1 - at : at)));
    json_t *first = json_object_get(json_array_get(data, 0), "id"), *last = json_object_get(json_array_get(data, json_array_size(data) - 1), "id");
    json_t *o = bad ? NULL : json_pack("{s:s,s:O,s:O?,s:O?,s:b}", "object", "list", "data", data, "first_id", first, "last_id", last,
                                       "has_more", at < n);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o), json_decref(data);
    if (!text) sv_fail(e, 500, NULL, "out of memory");
    return text;
}

/* A chat field named in an error, as the Responses request calls it (also in the message, for the one field
 * whose name differs and that messages quote). */
void sv_responses_param(sv_error *e) {
    static const struct {
        const char *chat, *resp;
        bool word; /* also in the message */
    } MAP[] = {{"max_completion_tokens", "max_output_tokens", true}, {"max_tokens", "max_output_tokens", true},
               {"response_format.json_schema.schema", "text.format.schema", true}, {"response_format", "text.format", true},
               {"messages", "input", false}, {"tool_choice.function.name", "tool_choice.name", true}};
    for (size_t i = 0; i < sizeof MAP / sizeof MAP[0]; i++)
        sv_error_rename(e, MAP[i].chat, MAP[i].resp, MAP[i].word ? MAP[i].resp : NULL);
}

/* ---- the Response object, its output items, its stream ---- */

json_t *sv_resp_object(const sv_job *j, const char *model, const char *status) {
    json_t *r = json_deep_copy(j->req.resp_echo);
    if (!r) return NULL;
    char id[64];
    const char *dash = strchr(j->id, '-');
    if (j->req.resp_id[0]) snprintf(id, sizeof id, "%s", j->req.resp_id);
    else snprintf(id, sizeof id, "resp_%s", dash ? dash + 1 : j->id);
    if (json_object_set_new(r, "id", json_string(id)) || json_object_set_new(r, "object", json_string("response")) ||
        json_object_set_new(r, "created_at", json_integer(j->created)) || json_object_set_new(r, "model", json_string(model)) ||
        json_object_set_new(r, "status", json_string(status)) || json_object_set_new(r, "output", json_array()) ||
        json_object_set_new(r, "error", json_null()) || json_object_set_new(r, "incomplete_details", json_null()) ||
        json_object_set_new(r, "usage", json_null())) {
        json_decref(r);
        return NULL;
    }
    return r;
}

json_t *sv_resp_usage(int64_t in, int64_t cached, int64_t out, int64_t reasoning) {
    return json_pack("{s:I,s:{s:I},s:I,s:{s:I},s:I}", "input_tokens", (json_int_t)in, "input_tokens_details", "cached_tokens",
                     (json_int_t)cached, "output_tokens", (json_int_t)out, "output_tokens_details", "reasoning_tokens",
                     (json_int_t)reasoning, "total_tokens", (json_int_t)(in + out));
}

static json_t *item_reasoning(const char *id, const char *t, size_t n, const char *status, bool enc) {
    json_t *it = json_pack("{s:s,s:s,s:[],s:[{s:s,s:s%}],s:s}", "type", "reasoning", "id", id, "summary", "content", "type",
                           "reasoning_text", "text", t ? t : "", n, "status", status);
    if (it && enc) {
        sv_buf b = {0};
        if (!sv_buf_lit(&b, ENC_PREFIX) && !sv_buf_add(&b, t ? t : "", n)) json_object_set_new(it, "encrypted_content", json_stringn(b.p, b.len));
        sv_buf_free(&b);
    }
    return it;
}

/* A list of logprobs entries from their JSON texts joined by commas (respond.c writes them); NULL out of
 * memory. */
static json_t *lp_list(const char *lp, size_t n) {
    if (!n) return json_array();
    sv_buf b = {0};
    json_t *a = sv_buf_lit(&b, "[") || sv_buf_add(&b, lp, n) || sv_buf_lit(&b, "]") ? NULL : json_loadb(b.p, b.len, 0, NULL);
    sv_buf_free(&b);
    return a;
}

static json_t *item_message(const char *id, const char *t, size_t n, const char *status, const char *lp, size_t nlp) {
    json_t *l = lp_list(lp, nlp);
    return l ? json_pack("{s:s,s:s,s:s,s:s,s:[{s:s,s:s%,s:[],s:o}]}", "type", "message", "id", id, "role", "assistant", "status",
                         status, "content", "type", "output_text", "text", t ? t : "", n, "annotations", "logprobs", l)
             : NULL;
}
static json_t *item_call(const char *call_id, const char *name, const char *args, size_t n, const char *status) {
    char id[96];
    snprintf(id, sizeof id, "fc_%s", call_id);
    return json_pack("{s:s,s:s,s:s,s:s,s:s%,s:s}", "type", "function_call", "id", id, "call_id", call_id, "name", name,
                     "arguments", args ? args : "", n, "status", status);
}

json_t *sv_resp_items(const char *rid, const char *reasoning, size_t nr, const char *content, size_t nc, const char *lp,
                      size_t nlp, const json_t *calls, bool incomplete, bool enc) {
    json_t *out = json_array();
    const char *st = incomplete ? "incomplete" : "completed";
    char id[96];
    int k = 0;
    if (out && nr) {
        snprintf(id, sizeof id, "rs_%s_%d", rid, k++);
        json_array_append_new(out, item_reasoning(id, reasoning, nr, st, enc));
    }
    if (out && (nc || !json_array_size(calls))) {
        snprintf(id, sizeof id, "msg_%s_%d", rid, k++);
        json_array_append_new(out, item_message(id, content, nc, st, lp, nlp));
    }
    for (size_t i = 0; out && i < json_array_size(calls); i++) {
        const json_t *c = json_array_get(calls, i), *f = json_object_get(c, "function");
        const char *a = json_string_value(json_object_get(f, "arguments"));
        json_array_append_new(out, item_call(json_string_value(json_object_get(c, "id")),
                                             json_string_value(json_object_get(f, "name")), a, a ? strlen(a) : 0, st));
    }
    return out;
}

int sv_sse_typed(const char *type, json_t *obj, sv_buf *b) {
    if (!obj || json_object_set_new(obj, "type", json_string(type))) {
        json_decref(obj);
        return -1;
    }
    char *s = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    const int rc = !s || sv_buf_printf(b, "event: %s\ndata: ", type) || sv_buf_add(b, s, strlen(s)) || sv_buf_lit(b, "\n\n");
    free(s);
    return rc ? -1 : 0;
}

/* One stream event with its sequence number. */
static int resp_event(sv_resp_stream *rs, const char *type, json_t *obj, sv_buf *b) {
    if (obj && json_object_set_new(obj, "sequence_number", json_integer(rs->seq++))) {
        json_decref(obj);
        return -1;
    }
    return sv_sse_typed(type, obj, b);
}

int sv_resp_begin(sv_resp_stream *rs, json_t *response, sv_buf *sse) {
    rs->done = json_array();
    if (!rs->done || !response) return json_decref(response), -1;
    int rc = resp_event(rs, "response.created", json_pack("{s:O}", "response", response), sse);
    if (!rc) rc = resp_event(rs, "response.in_progress", json_pack("{s:O}", "response", response), sse);
    json_decref(response);
    return rc;
}

/* The open item's end: its done events, and the item kept for the final response. */
static int resp_close(sv_resp_stream *rs, bool incomplete, sv_buf *b) {
    if (!rs->kind) return 0;
    const int oi = rs->index - 1;
    const char *t = rs->text.p ? rs->text.p : "", *st = incomplete ? "incomplete" : "completed";
    const size_t n = rs->text.len;
    json_t *item = NULL;
    int rc = 0;
    if (rs->kind == SV_RI_REASONING) {
        rc = resp_event(rs, "response.reasoning_text.done", json_pack("{s:s,s:i,s:i,s:s%}", "item_id", rs->item_id,
                        "output_index", oi, "content_index", 0, "text", t, n), b) ||
             resp_event(rs, "response.content_part.done", json_pack("{s:s,s:i,s:i,s:{s:s,s:s%}}", "item_id", rs->item_id,
                        "output_index", oi, "content_index", 0, "part", "type", "reasoning_text", "text", t, n), b);
        item = item_reasoning(rs->item_id, t, n, st, rs->encrypted);
    } else if (rs->kind == SV_RI_MESSAGE) {
        json_t *l1 = lp_list(rs->lp.p, rs->lp.len), *l2 = lp_list(rs->lp.p, rs->lp.len);
        rc = !l1 || !l2 ||
             resp_event(rs, "response.output_text.done", json_pack("{s:s,s:i,s:i,s:s%,s:O}", "item_id", rs->item_id,
                        "output_index", oi, "content_index", 0, "text", t, n, "logprobs", l1), b) ||
             resp_event(rs, "response.content_part.done", json_pack("{s:s,s:i,s:i,s:{s:s,s:s%,s:[],s:O}}", "item_id",
                        rs->item_id, "output_index", oi, "content_index", 0, "part", "type", "output_text", "text", t, n,
                        "annotations", "logprobs", l2), b);
        json_decref(l1), json_decref(l2);
        item = item_message(rs->item_id, t, n, st, rs->lp.p, rs->lp.len);
    } else {
        rc = resp_event(rs, "response.function_call_arguments.done", json_pack("{s:s,s:i,s:s%,s:s}", "item_id", rs->item_id,
                        "output_index", oi, "arguments", t, n, "name", rs->name), b);
        item = item_call(rs->call_id, rs->name, t, n, st);
    }
    rc = rc || !item || json_array_append(rs->done, item) ||
         resp_event(rs, "response.output_item.done", json_pack("{s:i,s:O}", "output_index", oi, "item", item), b);
    json_decref(item);
    rs->kind = 0;
    rs->text.len = 0;
    rs->lp.len = 0;
    return rc ? -1 : 0;
}

static int resp_open(sv_resp_stream *rs, const char *rid, int kind, const sv_tool_piece *t, sv_buf *b) {
    if (resp_close(rs, false, b)) return -1;
    const int oi = rs->index++;
    rs->kind = kind;
    rs->text.len = 0;
    json_t *item;
    if (kind == SV_RI_CALL) {
        snprintf(rs->call_id, sizeof rs->call_id, "%s", t->id);
        snprintf(rs->name, sizeof rs->name, "%s", t->name ? t->name : "");
        snprintf(rs->item_id, sizeof rs->item_id, "fc_%s", rs->call_id);
        item = item_call(rs->call_id, rs->name, "", 0, "in_progress");
    } else {
        snprintf(rs->item_id, sizeof rs->item_id, "%s_%s_%d", kind == SV_RI_REASONING ? "rs" : "msg", rid, oi);
        item = kind == SV_RI_REASONING ? json_pack("{s:s,s:s,s:[],s:[],s:s}", "type", "reasoning", "id", rs->item_id, "summary",
                                                   "content", "status", "in_progress")
                                       : json_pack("{s:s,s:s,s:s,s:s,s:[]}", "type", "message", "id", rs->item_id, "role",
                                                   "assistant", "status", "in_progress", "content");
    }
    if (resp_event(rs, "response.output_item.added", json_pack("{s:i,s:o}", "output_index", oi, "item", item), b)) return -1;
    if (kind == SV_RI_CALL) return 0;
    json_t *part = kind == SV_RI_REASONING ? json_pack("{s:s,s:s}", "type", "reasoning_text", "text", "")
                                           : json_pack("{s:s,s:s,s:[],s:[]}", "type", "output_text", "text", "", "annotations",
                                                       "logprobs");
    return resp_event(rs, "response.content_part.added", json_pack("{s:s,s:i,s:i,s:o}", "item_id", rs->item_id,
                      "output_index", oi, "content_index", 0, "part", part), b);
}

/* A delta of the open item; a message's carries the logprobs entries of its tokens (lp: n_lp bytes of
 * them, kept for the item's end too). */
static int resp_delta(sv_resp_stream *rs, const char *type, const char *d, size_t n, const char *lp, size_t nlp, sv_buf *b) {
    if (sv_buf_add(&rs->text, d, n)) return -1;
    if (nlp && ((rs->lp.len && sv_buf_lit(&rs->lp, ",")) || sv_buf_add(&rs->lp, lp, nlp))) return -1;
    json_t *ev = rs->kind == SV_RI_CALL
                     ? json_pack("{s:s,s:i,s:s%}", "item_id", rs->item_id, "output_index", rs->index - 1, "delta", d, n)
                     : json_pack("{s:s,s:i,s:i,s:s%}", "item_id", rs->item_id, "output_index", rs->index - 1, "content_index", 0,
                                 "delta", d, n);
    if (ev && rs->kind == SV_RI_MESSAGE && json_object_set_new(ev, "logprobs", lp_list(lp, nlp))) {
        json_decref(ev);
        return -1;
    }
    return resp_event(rs, type, ev, b);
}

int sv_resp_piece(sv_resp_stream *rs, const char *rid, const sv_parse_out *po, const char *lp, size_t nlp, sv_buf *sse) {
    if (po->n_reasoning) {
        if (rs->kind != SV_RI_REASONING && resp_open(rs, rid, SV_RI_REASONING, NULL, sse)) return -1;
        if (resp_delta(rs, "response.reasoning_text.delta", po->reasoning, po->n_reasoning, NULL, 0, sse)) return -1;
    }
    if (po->n_content) {
        if (rs->kind != SV_RI_MESSAGE && resp_open(rs, rid, SV_RI_MESSAGE, NULL, sse)) return -1;
        if (resp_delta(rs, "response.output_text.delta", po->content, po->n_content, lp, nlp, sse)) return -1;
    }
    for (size_t k = 0; k < po->n_tools; k++) {
        const sv_tool_piece *t = &po->tools[k];
        if (t->id && resp_open(rs, rid, SV_RI_CALL, t, sse)) return -1;
        if (rs->kind != SV_RI_CALL) continue; /* a piece of a call that never began: nothing to add it to */
        if (t->args_len && resp_delta(rs, "response.function_call_arguments.delta", t->args, t->args_len, NULL, 0, sse))
            return -1;
    }
    return 0;
}

int sv_resp_end(sv_resp_stream *rs, json_t *response, const char *type, sv_buf *sse, void (*done)(void *, json_t *),
                void *ctx) {
    const bool incomplete = !strcmp(type, "response.incomplete");
    if (!response || resp_close(rs, incomplete, sse) || json_object_set(response, "output", rs->done)) {
        json_decref(response);
        return -1;
    }
    if (done) done(ctx, response);
    return resp_event(rs, type, json_pack("{s:o}", "response", response), sse);
}

void sv_resp_stream_free(sv_resp_stream *rs) {
    sv_buf_free(&rs->text);
    sv_buf_free(&rs->lp);
    json_decref(rs->done);
    memset(rs, 0, sizeof *rs);
}
