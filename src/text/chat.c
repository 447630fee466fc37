/* chat.c — a model's chat setup and apply_chat_template: which template
 * files a model folder has (the same precedence as transformers), which
 * template a request uses, the special tokens the template sees, and the
 * message preparation transformers does before rendering:
 *   - keys whose value is null are dropped from each message;
 *   - a message with reasoning_content / thinking / reasoning gets both
 *     `thinking` and `reasoning_content` (transformers' alias);
 *   - variables: messages, tools (or none), documents (none),
 *     add_generation_prompt, bos_token ... mask_token, then the caller's
 *     kwargs;
 *   - continue_final_message: the last message is rendered with a marker
 *     appended and the text is cut there.
 * vLLM-style convenience (off by default): tool-call arguments given as JSON
 * text are parsed into objects, the form chat templates iterate over. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/json_internal.h"
#include "moerun/chat.h"
#include "text/template_internal.h"

#define MAX_TEMPLATE_FILE ((size_t)16 << 20)

static const char *const SPECIAL_KEYS[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                           "pad_token", "cls_token", "mask_token"};
#define N_SPECIAL (sizeof SPECIAL_KEYS / sizeof SPECIAL_KEYS[0])

struct mr_chat {
    size_t n;
    char **names;
    mr_chat_template **tpls;
    char *special[N_SPECIAL];
};

/* ---------------- building ---------------- */
static mr_status add_template(mr_chat *c, const char *name, const char *src, size_t len, const char *where) {
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->names[i], name)) return mr_error_set(MR_EFORMAT, "%s: two chat templates named '%s'", where, name);
    char **nn = mr_realloc(c->names, (c->n + 1) * sizeof *nn);
    if (!nn) return MR_ENOMEM;
    c->names = nn;
    mr_chat_template **nt = mr_realloc(c->tpls, (c->n + 1) * sizeof *nt);
    if (!nt) return MR_ENOMEM;
    c->tpls = nt;
    c->names[c->n] = mr_strdup(name);
    if (!c->names[c->n]) return MR_ENOMEM;
    mr_status st = mr_chat_template_parse(src, len, name, &c->tpls[c->n]);
    if (st) {
        mr_free(c->names[c->n]);
        if (where) mr_error_set(st, "%s: %s", where, mr_error_last());
        return st;
    }
    c->n++;
    return MR_OK;
}

static mr_status read_specials(mr_chat *c, const json_t *cfg) {
    if (!cfg) return MR_OK;
    for (size_t i = 0; i < N_SPECIAL; i++) {
        const json_t *v = json_object_get(cfg, SPECIAL_KEYS[i]);
        const char *s = NULL;
        if (json_is_string(v)) s = json_string_value(v);
        else if (json_is_object(v) && json_is_string(json_object_get(v, "content")))
            s = json_string_value(json_object_get(v, "content"));
        else if (v && !json_is_null(v))
            return mr_error_set(MR_EFORMAT, "tokenizer_config.json: %s must be a string or {\"content\": ...}",
                                SPECIAL_KEYS[i]);
        if (s) {
            c->special[i] = mr_strdup(s);
            if (!c->special[i]) return MR_ENOMEM;
        }
    }
    return MR_OK;
}

static mr_status templates_from_config(mr_chat *c, const json_t *cfg) {
    const json_t *t = cfg ? json_object_get(cfg, "chat_template") : NULL;
    if (!t || json_is_null(t)) return MR_OK;
    if (json_is_string(t))
        return add_template(c, "default", json_string_value(t), json_string_length(t), "tokenizer_config.json");
    if (json_is_array(t)) {
        size_t i;
        json_t *e;
        json_array_foreach(t, i, e) {
            const json_t *n = json_object_get(e, "name"), *s = json_object_get(e, "template");
            if (!json_is_string(n) || !json_is_string(s))
                return mr_error_set(MR_EFORMAT, "tokenizer_config.json: chat_template[%zu] needs string 'name' and 'template'", i);
            mr_status st = add_template(c, json_string_value(n), json_string_value(s), json_string_length(s),
                                        "tokenizer_config.json");
            if (st) return st;
        }
        return MR_OK;
    }
    return mr_error_set(MR_EFORMAT, "tokenizer_config.json: chat_template must be a string or a list of {name, template}");
}

mr_status mr_chat_new(const json_t *config, const char *jinja, mr_chat **out) {
    *out = NULL;
    if (config && !json_is_object(config)) return mr_error_set(MR_EINVAL, "tokenizer config must be a JSON object");
    mr_chat *c = mr_calloc(1, sizeof *c);
    if (!c) return MR_ENOMEM;
    mr_status st = read_specials(c, config);
    if (!st) st = jinja ? add_template(c, "default", jinja, strlen(jinja), "chat_template.jinja") : templates_from_config(c, config);
    if (!st && c->n == 0) st = mr_error_set(MR_ENOTFOUND, "no chat template given");
    if (st) {
        mr_chat_free(c);
        return st;
    }
    *out = c;
    return MR_OK;
}

static mr_status read_text_file(const char *path, char **out, size_t *len) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return mr_error_set(MR_EIO, "%s: %s", path, strerror(errno));
    mr_status st = MR_OK;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            cap = cap ? cap * 2 : 65536 * 2;
            char *nb = mr_realloc(buf, cap);
            if (!nb) {
                st = MR_ENOMEM;
                goto out;
            }
            buf = nb;
        }
        size_t k = fread(buf + n, 1, 65536, f);
        n += k;
        if (n > MAX_TEMPLATE_FILE) {
            st = mr_error_set(MR_ECAPACITY, "%s: larger than %zu MiB, not a chat template", path, MAX_TEMPLATE_FILE >> 20);
            goto out;
        }
        if (k < 65536) {
            if (ferror(f)) st = mr_error_set(MR_EIO, "%s: read error", path);
            break;
        }
    }
out:
    fclose(f);
    if (st) {
        mr_free(buf);
        return st;
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return MR_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* dir/tokenizer_config.json as an object, or NULL when there is none. */
static mr_status load_config(const char *dir, json_t **cfg) {
    *cfg = NULL;
    size_t plen = strlen(dir) + 32;
    char *path = mr_malloc(plen);
    if (!path) return MR_ENOMEM;
    snprintf(path, plen, "%s/tokenizer_config.json", dir);
    struct stat sb;
    mr_status st = MR_OK;
    if (stat(path, &sb) == 0) {
        json_error_t je;
        bool oom = false;
        *cfg = mr__json_load_file(path, 0, &je, &oom);
        if (!*cfg) {
            st = oom ? MR_ENOMEM : mr_error_set(MR_EFORMAT, "%s: line %d: %s", path, je.line, je.text);
        } else if (!json_is_object(*cfg)) {
            st = mr_error_set(MR_EFORMAT, "%s: not a JSON object", path);
            json_decref(*cfg);
            *cfg = NULL;
        }
    }
    mr_free(path);
    return st;
}

mr_status mr_chat_open_override(const char *dir, const char *tmpl, mr_chat **out) {
    *out = NULL;
    const bool inline_text = strstr(tmpl, "{{") || strstr(tmpl, "{%");
    char *text = NULL;
    size_t len;
    json_t *cfg = NULL;
    mr_status st = inline_text ? MR_OK : read_text_file(tmpl, &text, &len);
    if (st) return st == MR_ENOMEM ? st : mr_error_set(st, "chat template %s", mr_error_last());
    st = load_config(dir, &cfg);
    if (!st) st = mr_chat_new(cfg, inline_text ? tmpl : text, out);
    json_decref(cfg);
    mr_free(text);
    if (st && st != MR_ENOMEM)
        st = inline_text ? mr_error_set(st, "the chat template given: %s", mr_error_last())
                         : mr_error_set(st, "chat template %s: %s", tmpl, mr_error_last());
    return st;
}

mr_status mr_chat_open(const char *dir, mr_chat **out) {
    *out = NULL;
    if (!dir) return mr_error_set(MR_EINVAL, "mr_chat_open: no folder");
    mr_status st = MR_OK;
    mr_chat *c = mr_calloc(1, sizeof *c);
    json_t *cfg = NULL;
    char *text = NULL, *path = NULL;
    char **names = NULL;
    size_t nnames = 0;
    DIR *d = NULL;
    if (!c) return MR_ENOMEM;
    size_t plen = strlen(dir) + 512;
    path = mr_malloc(plen);
    if (!path) {
        st = MR_ENOMEM;
        goto out;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        st = mr_error_set(MR_ENOTFOUND, "%s: not a folder", dir);
        goto out;
    }
    if ((st = load_config(dir, &cfg))) goto out;
    if (cfg && (st = read_specials(c, cfg))) {
        mr_error_set(st, "%s/tokenizer_config.json: %s", dir, mr_error_last());
        goto out;
    }
    /* chat_template.jinja and additional_chat_templates/ win over the config */
    snprintf(path, plen, "%s/chat_template.jinja", dir);
    if (stat(path, &sb) == 0) {
        size_t len;
        if ((st = read_text_file(path, &text, &len))) goto out;
        if ((st = add_template(c, "default", text, len, path))) goto out;
        mr_free(text);
        text = NULL;
    }
    snprintf(path, plen, "%s/additional_chat_templates", dir);
    d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            size_t l = strlen(e->d_name);
            if (l <= 6 || strcmp(e->d_name + l - 6, ".jinja") != 0 || l > 255) continue;
            char **nn = mr_realloc(names, (nnames + 1) * sizeof *nn);
            if (!nn) {
                st = MR_ENOMEM;
                goto out;
            }
            names = nn;
            names[nnames] = mr_strdup(e->d_name);
            if (!names[nnames]) {
                st = MR_ENOMEM;
                goto out;
            }
            nnames++;
        }
        if (nnames) qsort(names, nnames, sizeof *names, cmp_str); /* a stable order, whatever readdir gives */
        for (size_t i = 0; i < nnames; i++) {
            snprintf(path, plen, "%s/additional_chat_templates/%s", dir, names[i]);
            size_t len;
            if ((st = read_text_file(path, &text, &len))) goto out;
            names[i][strlen(names[i]) - 6] = 0;
            if ((st = add_template(c, names[i], text, len, path))) goto out;
            mr_free(text);
            text = NULL;
        }
    }
    if (c->n == 0 && (st = templates_from_config(c, cfg))) {
        mr_error_set(st, "%s: %s", dir, mr_error_last());
        goto out;
    }
    if (c->n == 0) {
        st = mr_error_set(MR_ENOTFOUND,
                          "%s has no chat template (looked for chat_template.jinja, additional_chat_templates/*.jinja "
                          "and tokenizer_config.json's chat_template)",
                          dir);
        goto out;
    }
out:
    if (d) closedir(d);
    for (size_t i = 0; i < nnames; i++) mr_free(names[i]);
    mr_free(names);
    mr_free(text);
    mr_free(path);
    json_decref(cfg);
    if (st) {
        mr_chat_free(c);
        return st;
    }
    *out = c;
    return MR_OK;
}

void mr_chat_free(mr_chat *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n; i++) {
        mr_free(c->names[i]);
        mr_chat_template_free(c->tpls[i]);
    }
    mr_free(c->names);
    mr_free(c->tpls);
    for (size_t i = 0; i < N_SPECIAL; i++) mr_free(c->special[i]);
    mr_free(c);
}

size_t mr_chat_template_count(const mr_chat *c) { return c ? c->n : 0; }
const char *mr_chat_template_name(const mr_chat *c, size_t i) { return c && i < c->n ? c->names[i] : NULL; }

const char *mr_chat_special_token(const mr_chat *c, const char *key) {
    if (!c || !key) return NULL;
    for (size_t i = 0; i < N_SPECIAL; i++)
        if (!strcmp(SPECIAL_KEYS[i], key)) return c->special[i];
    return NULL;
}

static const mr_chat_template *find(const mr_chat *c, const char *name) {
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->names[i], name)) return c->tpls[i];
    return NULL;
}

const mr_chat_template *mr_chat_pick(const mr_chat *c, const char *name, bool has_tools) {
    if (!c) return NULL;
    const mr_chat_template *t;
    if (name) {
        if ((t = find(c, name))) return t;
        mr_error_set(MR_ENOTFOUND, "no chat template named '%s'", name);
        return NULL;
    }
    if (c->n == 1) return c->tpls[0];
    if (has_tools && (t = find(c, "tool_use"))) return t;
    if ((t = find(c, "default"))) return t;
    char list[256] = "";
    for (size_t i = 0; i < c->n; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s'%s'", i ? ", " : "", c->names[i]);
    mr_error_set(MR_ENOTFOUND, "the model has several chat templates and none is 'default'; name one of %s", list);
    return NULL;
}

mr_chat_format mr_chat_format_detect(const char *src) {
    if (!src) return MR_CHAT_FORMAT_PLAIN;
    if (strstr(src, "<minimax:tool_call>") || strstr(src, "]~b]ai")) return MR_CHAT_FORMAT_MINIMAX_M2;
    return MR_CHAT_FORMAT_PLAIN;
}

mr_chat_format mr_chat_format_of(const mr_chat *c) {
    const mr_chat_template *t = mr_chat_pick(c, NULL, false);
    if (!t && c && c->n) t = c->tpls[0];
    return t ? mr_chat_format_detect(mr_chat_template_source(t)) : MR_CHAT_FORMAT_PLAIN;
}

/* ---------------- apply ---------------- */
static const char CONTINUE_TAG[] = "CONTINUE_FINAL_MESSAGE_TAG ";

/* Python str.strip() bounds on UTF-8 */
static void py_strip_bounds(const char *s, size_t n, size_t *a, size_t *b) {
    size_t i = 0, j = n;
    while (i < j) {
        size_t adv;
        uint32_t cp = mr__utf8_decode(s + i, j - i, &adv);
        if (!mr__py_isspace(cp)) break;
        i += adv;
    }
    while (j > i) {
        size_t k = j - 1;
        while (k > i && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
        size_t adv;
        uint32_t cp = mr__utf8_decode(s + k, j - k, &adv);
        if (!mr__py_isspace(cp)) break;
        j = k;
    }
    *a = i;
    *b = j;
}

static json_t *prepare_message(const json_t *m, bool parse_args) {
    json_t *o = json_object();
    if (!o) return NULL;
    const char *k;
    json_t *v;
    const json_t *reasoning = NULL;
    static const char *const RF[] = {"reasoning_content", "thinking", "reasoning"};
    for (int i = 0; i < 3 && !reasoning; i++) {
        const json_t *r = json_object_get(m, RF[i]);
        if (r && !json_is_null(r)) reasoning = r;
    }
    if (reasoning && json_object_set(o, "thinking", (json_t *)reasoning)) goto fail;
    json_object_foreach((json_t *)m, k, v) {
        if (json_is_null(v)) continue;
        if (parse_args && !strcmp(k, "tool_calls") && json_is_array(v)) {
            json_t *calls = json_deep_copy(v);
            if (!calls) goto fail;
            size_t i;
            json_t *call;
            json_array_foreach(calls, i, call) {
                json_t *fn = json_object_get(call, "function");
                json_t *args = fn ? json_object_get(fn, "arguments") : NULL;
                if (!json_is_string(args)) continue;
                json_t *parsed = json_loadb(json_string_value(args), json_string_length(args), JSON_DECODE_ANY, NULL);
                if (json_is_object(parsed)) json_object_set(fn, "arguments", parsed);
                json_decref(parsed);
            }
            if (json_object_set_new(o, k, calls)) goto fail;
            continue;
        }
        if (json_object_set(o, k, v)) goto fail;
    }
    if (reasoning && json_object_set(o, "reasoning_content", (json_t *)reasoning)) goto fail;
    return o;
fail:
    json_decref(o);
    return NULL;
}

mr_status mr_chat_apply(const mr_chat *c, const mr_chat_request *r, char **out, size_t *out_len) {
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    if (!c || !r || !out) return mr_error_set(MR_EINVAL, "mr_chat_apply: missing argument");
    const json_t *msgs = r->messages;
    if (!json_is_array(msgs)) return mr_error_set(MR_EINVAL, "messages must be an array of message objects");
    size_t nm = json_array_size(msgs);
    if (nm == 0) return mr_error_set(MR_EINVAL, "cannot apply the chat template to an empty conversation");
    for (size_t i = 0; i < nm; i++)
        if (!json_is_object(json_array_get(msgs, i)))
            return mr_error_set(MR_EINVAL, "messages[%zu] is not an object", i);
    bool has_tools = r->tools && !json_is_null(r->tools);
    if (has_tools) {
        if (!json_is_array(r->tools)) return mr_error_set(MR_EINVAL, "tools must be an array of tool objects");
        for (size_t i = 0; i < json_array_size(r->tools); i++)
            if (!json_is_object(json_array_get(r->tools, i)))
                return mr_error_set(MR_EINVAL, "tools[%zu] is not a JSON schema object", i);
    }
    if (r->kwargs && !json_is_null(r->kwargs)) {
        if (!json_is_object(r->kwargs)) return mr_error_set(MR_EINVAL, "template kwargs must be a JSON object");
        static const char *const reserved[] = {"messages", "tools", "documents", "add_generation_prompt"};
        for (size_t i = 0; i < 4; i++)
            if (json_object_get(r->kwargs, reserved[i]))
                return mr_error_set(MR_EINVAL, "template kwargs may not set '%s' (it is a request field)", reserved[i]);
    }
    if (r->continue_final_message && r->add_generation_prompt)
        return mr_error_set(MR_EINVAL, "continue_final_message and add_generation_prompt are not compatible: the first "
                                       "continues the last message, the second starts a new assistant message");
    const mr_chat_template *t = mr_chat_pick(c, r->template_name, has_tools);
    if (!t) return MR_ENOTFOUND;

    mr_status st = MR_OK;
    char *text = NULL;
    size_t tlen = 0;
    char *final_msg = NULL;
    json_t *vars = json_object(), *list = json_array();
    if (!vars || !list) {
        st = MR_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < nm; i++) {
        json_t *m = prepare_message(json_array_get(msgs, i), r->parse_tool_arguments);
        if (!m || json_array_append_new(list, m)) {
            st = MR_ENOMEM;
            goto out;
        }
    }
    if (r->continue_final_message) {
        json_t *last = json_array_get(list, nm - 1);
        json_t *content = json_object_get(last, "content");
        if (!content) {
            st = mr_error_set(MR_EINVAL, "continue_final_message is set but the final message has no content to continue");
            goto out;
        }
        if (!strstr(mr_chat_template_source(t), "content")) {
            st = mr_error_set(MR_EINVAL, "continue_final_message is set but the template does not read 'content'");
            goto out;
        }
        json_t *target_obj = last;
        const char *target_key = "content";
        if (json_is_array(content)) {
            target_obj = NULL;
            for (size_t i = json_array_size(content); i > 0 && !target_obj; i--) {
                json_t *blk = json_array_get(content, i - 1);
                if (json_is_object(blk) && json_object_get(blk, "text")) target_obj = blk;
            }
            if (!target_obj) {
                st = mr_error_set(MR_EINVAL, "continue_final_message is set but the final message has no text part");
                goto out;
            }
            target_key = "text";
        }
        json_t *s = json_object_get(target_obj, target_key);
        if (!json_is_string(s)) {
            st = mr_error_set(MR_EINVAL, "continue_final_message: the final message's %s is not a string", target_key);
            goto out;
        }
        size_t sl = json_string_length(s);
        final_msg = mr_malloc(sl + sizeof CONTINUE_TAG);
        if (!final_msg) {
            st = MR_ENOMEM;
            goto out;
        }
        memcpy(final_msg, json_string_value(s), sl);
        memcpy(final_msg + sl, CONTINUE_TAG, sizeof CONTINUE_TAG);
        json_t *ns = json_stringn(final_msg, sl + sizeof CONTINUE_TAG - 1);
        if (!ns || json_object_set_new(target_obj, target_key, ns)) {
            st = MR_ENOMEM;
            goto out;
        }
        final_msg[sl] = 0; /* the original text, for the check below */
    }
    if (json_object_set_new(vars, "messages", list)) {
        list = NULL;
        st = MR_ENOMEM;
        goto out;
    }
    list = NULL;
    if (json_object_set(vars, "tools", has_tools ? (json_t *)r->tools : json_null()) ||
        json_object_set_new(vars, "documents", json_null()) ||
        json_object_set_new(vars, "add_generation_prompt", json_boolean(r->add_generation_prompt))) {
        st = MR_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < N_SPECIAL; i++)
        if (c->special[i] && json_object_set_new(vars, SPECIAL_KEYS[i], json_string(c->special[i]))) {
            st = MR_ENOMEM;
            goto out;
        }
    if (r->kwargs && json_is_object(r->kwargs) && json_object_update(vars, (json_t *)r->kwargs)) {
        st = MR_ENOMEM;
        goto out;
    }
    if ((st = mr_chat_template_render(t, vars, r->limits, &text, &tlen))) goto out;
    if (r->continue_final_message) {
        size_t a, b;
        py_strip_bounds(final_msg, strlen(final_msg), &a, &b);
        const char *tag = CONTINUE_TAG;
        size_t tagl = sizeof CONTINUE_TAG - 2; /* the tag without its trailing space */
        bool has_final = memmem(text, tlen, final_msg + a, b - a) != NULL;
        const char *loc = NULL;
        for (size_t i = tlen >= tagl ? tlen - tagl + 1 : 0; i > 0; i--)
            if (!memcmp(text + i - 1, tag, tagl)) {
                loc = text + i - 1;
                break;
            }
        if (!has_final || !loc) {
            st = mr_error_set(MR_EINVAL, "continue_final_message is set but the template does not render the final "
                                         "message as it was given (it rewrites it), so it cannot be continued");
            goto out;
        }
        size_t at = (size_t)(loc - text);
        if (!(at + sizeof CONTINUE_TAG - 1 <= tlen && !memcmp(loc, CONTINUE_TAG, sizeof CONTINUE_TAG - 1))) {
            /* trailing whitespace was trimmed: rstrip what is before the tag */
            while (at > 0) {
                size_t k = at - 1;
                while (k > 0 && ((unsigned char)text[k] & 0xC0) == 0x80) k--;
                size_t adv;
                if (!mr__py_isspace(mr__utf8_decode(text + k, at - k, &adv))) break;
                at = k;
            }
        }
        tlen = at;
        text[tlen] = 0;
    }
    *out = text;
    text = NULL;
    if (out_len) *out_len = tlen;
out:
    mr_free(text);
    mr_free(final_msg);
    json_decref(list);
    json_decref(vars);
    return st;
}
