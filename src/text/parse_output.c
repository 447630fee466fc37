/* parse_output.c — splits a model's streamed output into reasoning, content
 * and OpenAI tool calls (MiniMax-M2's format), incrementally.
 *
 * The output, as MiniMax-M2 writes it after a prompt that ends in "<think>\n":
 *   reasoning ... </think>  content ... <minimax:tool_call>
 *   <invoke name="f"><parameter name="k">value</parameter>...</invoke>...
 *   </minimax:tool_call> content ...
 * - Reasoning is everything before </think>, stripped of surrounding
 *   whitespace; a model that writes <think> itself at the start is handled.
 * - Content is everything else; whitespace next to a tool-call block is
 *   dropped.
 * - Each <invoke> is one tool call: its first delta carries id and name as
 *   soon as the opening tag is complete, then argument text follows. The
 *   arguments are a JSON object text with the parameters in order, values
 *   converted by the tool's JSON schema (integer, number, boolean,
 *   object/array parsed as JSON, "null" → null, string otherwise; `type`
 *   lists and anyOf/oneOf give several candidates). String values stream as
 *   they arrive; other values when their </parameter> is seen.
 * - Malformed markup (text where a tag must be, a tag that never closes, an
 *   invoke without a name) is returned as content with a warning: a call
 *   already started is closed with the arguments it has, and everything from
 *   the fault on is content again.
 *
 * Split invariance: the parser consumes input only when the decision cannot
 * depend on bytes not yet seen (a possible tag prefix, trailing whitespace,
 * an incomplete UTF-8 sequence and a string value that may still become
 * "null" are held back), so any split of the stream gives the same
 * concatenated deltas and the same final message. Invalid UTF-8 becomes
 * U+FFFD. Buffers are reused between feeds. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "moerun/chat.h"
#include "text/template_internal.h"

#define MAX_TAG 1024 /* an <invoke ...> or <parameter ...> opening tag longer than this is malformed */

static const char T_THINK_OPEN[] = "<think>";
static const char T_THINK_CLOSE[] = "</think>";
static const char T_BLOCK_OPEN[] = "<minimax:tool_call>";
static const char T_BLOCK_CLOSE[] = "</minimax:tool_call>";
static const char T_INVOKE_OPEN[] = "<invoke";
static const char T_INVOKE_CLOSE[] = "</invoke>";
static const char T_PARAM_OPEN[] = "<parameter";
static const char T_PARAM_CLOSE[] = "</parameter>";

typedef enum {
    S_START,     /* nothing decided yet: is there a <think>? */
    S_REASON,    /* inside reasoning */
    S_CONTENT,   /* plain content */
    S_BLOCK,     /* inside <minimax:tool_call>, between invokes */
    S_INVOKE,    /* inside <invoke>, between parameters */
    S_PARAM,     /* inside a parameter value */
    S_DONE,
} pstate;

typedef struct {
    char id[40];
    char *name;
    mr__buf args;
    const json_t *props; /* the tool's parameters.properties, or NULL */
} pcall;

typedef struct {
    int index;
    bool first;  /* carries id and name (copies: the call table may move) */
    char id[40];
    const char *name; /* the call's name string (its own allocation, stable) */
    mr__buf args;
} dtool;

struct mr_chat_parser {
    mr_chat_parser_opts o;
    json_t *tools;
    pstate st;
    bool finished;
    bool oom;
    uint64_t seed;
    mr__buf in; /* unconsumed input is in.p[in_off .. in.n) */
    size_t in_off;
    mr__buf raw; /* tool-markup bytes since the last commit: content again if it turns out malformed */
    /* reasoning: leading whitespace dropped, trailing held */
    bool r_started;
    mr__buf r_ws;
    /* content: trailing whitespace held (dropped before a tool-call block) */
    bool c_drop_lead;
    mr__buf c_ws;
    /* tool calls */
    pcall *calls;
    size_t n_calls, cap_calls;
    int cur;    /* the open call, or -1 */
    int nparams;
    /* the open parameter */
    char *pname;
    const json_t *pschema;
    bool p_stream, p_started, p_skip;
    mr__buf pval;
    mr__buf seen; /* the open call's parameter names, NUL-separated */
    size_t p_emitted;
    /* the message so far */
    mr__buf m_reason, m_content;
    /* this feed's delta */
    mr__buf d_reason, d_content;
    dtool *dt;
    size_t n_dt, cap_dt;
    mr_chat_tool_delta *pub;
    size_t cap_pub;
    char **warn;
    size_t n_warn, cap_warn;
    mr_chat_delta delta;
};

/* ---------------- small helpers ---------------- */
static void addb(mr_chat_parser *p, mr__buf *b, const char *s, size_t n) {
    if (!mr__buf_add(b, s, n)) p->oom = true;
}
static void adds(mr_chat_parser *p, mr__buf *b, const char *s) { addb(p, b, s, strlen(s)); }

static bool is_ws_byte(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* bytes at the end of s[0..n) that begin a UTF-8 sequence that is not complete yet */
static size_t utf8_incomplete_tail(const char *s, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation: look further back */
        int need = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c < 0xF0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 1;
        if (need <= (int)back) return 0;
        /* the bytes so far must be a valid prefix */
        size_t adv;
        char tmp[4] = {0};
        memcpy(tmp, s + n - back, back);
        /* complete it with the smallest continuation and check validity */
        for (int k = (int)back; k < need; k++) tmp[k] = (char)0x80;
        uint32_t cp = mr__utf8_decode(tmp, (size_t)need, &adv);
        if (adv == (size_t)need && cp != 0xFFFD) return back;
        /* E0 80.. / F0 80.. etc: try the largest continuation */
        for (int k = (int)back; k < need; k++) tmp[k] = (char)0xBF;
        cp = mr__utf8_decode(tmp, (size_t)need, &adv);
        return (adv == (size_t)need && cp != 0xFFFD) ? back : 0;
    }
    return 0;
}

/* appends s to b with invalid UTF-8 replaced by U+FFFD */
static void add_clean(mr_chat_parser *p, mr__buf *b, const char *s, size_t n) {
    if (!n) return;
    size_t i = 0, run = 0;
    while (i < n) {
        if ((unsigned char)s[i] < 0x80) {
            i++;
            run++;
            continue;
        }
        size_t adv;
        uint32_t cp = mr__utf8_decode(s + i, n - i, &adv);
        if (cp == 0xFFFD && adv == 1) {
            addb(p, b, s + i - run, run);
            run = 0;
            addb(p, b, "\xEF\xBF\xBD", 3);
            i++;
            continue;
        }
        i += adv;
        run += adv;
    }
    addb(p, b, s + n - run, run);
}

/* the length of s without trailing whitespace code points */
static size_t rtrim_len(const char *s, size_t n) {
    while (n > 0) {
        size_t k = n - 1;
        while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
        size_t adv;
        uint32_t cp = mr__utf8_decode(s + k, n - k, &adv);
        if (adv != n - k || !mr__py_isspace(cp)) break;
        n = k;
    }
    return n;
}

static size_t ltrim_len(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t adv;
        uint32_t cp = mr__utf8_decode(s + i, n - i, &adv);
        if (!mr__py_isspace(cp)) break;
        i += adv;
    }
    return i;
}

static void warn(mr_chat_parser *p, const char *fmt, const char *a) {
    if (p->n_warn == p->cap_warn) {
        size_t cap = p->cap_warn ? p->cap_warn * 2 : 4;
        char **nw = mr_realloc(p->warn, cap * sizeof *nw);
        if (!nw) {
            p->oom = true;
            return;
        }
        p->warn = nw;
        p->cap_warn = cap;
    }
    char msg[320];
    snprintf(msg, sizeof msg, fmt, a ? a : "");
    p->warn[p->n_warn] = mr_strdup(msg);
    if (!p->warn[p->n_warn]) p->oom = true;
    else p->n_warn++;
}

/* ---------------- output ---------------- */
static void out_reason(mr_chat_parser *p, const char *s, size_t n) {
    if (!n) return;
    if (!p->r_started) {
        size_t k = ltrim_len(s, n);
        s += k;
        n -= k;
        if (!n) return;
        p->r_started = true;
    }
    size_t j = rtrim_len(s, n);
    if (j > 0) {
        if (p->r_ws.n) {
            addb(p, &p->d_reason, p->r_ws.p, p->r_ws.n);
            addb(p, &p->m_reason, p->r_ws.p, p->r_ws.n);
            p->r_ws.n = 0;
        }
        add_clean(p, &p->d_reason, s, j);
        add_clean(p, &p->m_reason, s, j);
    }
    add_clean(p, &p->r_ws, s + j, n - j);
}

static void out_content(mr_chat_parser *p, const char *s, size_t n) {
    if (!n) return;
    if (p->c_drop_lead) {
        size_t k = ltrim_len(s, n);
        s += k;
        n -= k;
        if (!n) return;
        p->c_drop_lead = false;
    }
    size_t j = rtrim_len(s, n);
    if (j > 0) {
        if (p->c_ws.n) {
            addb(p, &p->d_content, p->c_ws.p, p->c_ws.n);
            addb(p, &p->m_content, p->c_ws.p, p->c_ws.n);
            p->c_ws.n = 0;
        }
        add_clean(p, &p->d_content, s, j);
        add_clean(p, &p->m_content, s, j);
    }
    add_clean(p, &p->c_ws, s + j, n - j);
}

static void flush_content_ws(mr_chat_parser *p) {
    if (!p->c_ws.n) return;
    addb(p, &p->d_content, p->c_ws.p, p->c_ws.n);
    addb(p, &p->m_content, p->c_ws.p, p->c_ws.n);
    p->c_ws.n = 0;
}

static dtool *dt_new(mr_chat_parser *p, int index) {
    if (p->n_dt == p->cap_dt) {
        size_t cap = p->cap_dt ? p->cap_dt * 2 : 4;
        dtool *nd = mr_realloc(p->dt, cap * sizeof *nd);
        if (!nd) {
            p->oom = true;
            return NULL;
        }
        memset(nd + p->cap_dt, 0, (cap - p->cap_dt) * sizeof *nd);
        p->dt = nd;
        p->cap_dt = cap;
    }
    dtool *d = &p->dt[p->n_dt++];
    d->index = index;
    d->first = false;
    d->id[0] = 0;
    d->name = NULL;
    d->args.n = 0;
    addb(p, &d->args, "", 0);
    return d;
}

static void out_args(mr_chat_parser *p, const char *s, size_t n) {
    if (p->cur < 0 || !n) return;
    pcall *c = &p->calls[p->cur];
    addb(p, &c->args, s, n);
    dtool *d = p->n_dt && p->dt[p->n_dt - 1].index == p->cur ? &p->dt[p->n_dt - 1] : dt_new(p, p->cur);
    if (d) addb(p, &d->args, s, n);
}
static void out_args_s(mr_chat_parser *p, const char *s) { out_args(p, s, strlen(s)); }

/* JSON string body (no quotes), ensure_ascii=False */
static void json_escape_to(mr_chat_parser *p, mr__buf *b, const char *s, size_t n) {
    size_t run = 0, i;
    for (i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        const char *e = NULL;
        char tmp[8];
        if (ch == '"') e = "\\\"";
        else if (ch == '\\') e = "\\\\";
        else if (ch == '\n') e = "\\n";
        else if (ch == '\r') e = "\\r";
        else if (ch == '\t') e = "\\t";
        else if (ch == '\b') e = "\\b";
        else if (ch == '\f') e = "\\f";
        else if (ch < 0x20) {
            snprintf(tmp, sizeof tmp, "\\u%04x", ch);
            e = tmp;
        }
        if (e) {
            addb(p, b, s + i - run, run);
            run = 0;
            adds(p, b, e);
        } else {
            run++;
        }
    }
    addb(p, b, s + i - run, run);
}

static void out_args_json_str(mr_chat_parser *p, const char *s, size_t n) {
    mr__buf t = {0};
    mr__buf clean = {0};
    add_clean(p, &clean, s, n);
    json_escape_to(p, &t, clean.p ? clean.p : "", clean.n);
    out_args(p, t.p ? t.p : "", t.n);
    mr__buf_free(&t);
    mr__buf_free(&clean);
}

/* ---------------- values by JSON schema ---------------- */
enum { TY_STRING = 1, TY_INTEGER = 2, TY_NUMBER = 4, TY_BOOLEAN = 8, TY_OBJECT = 16, TY_ARRAY = 32, TY_NULL = 64,
       TY_OTHER = 128 };

static unsigned type_bit(const char *t) {
    static const struct {
        const char *n;
        unsigned b;
    } map[] = {{"string", TY_STRING}, {"str", TY_STRING},   {"text", TY_STRING},   {"integer", TY_INTEGER},
               {"int", TY_INTEGER},   {"number", TY_NUMBER}, {"float", TY_NUMBER}, {"boolean", TY_BOOLEAN},
               {"bool", TY_BOOLEAN},  {"object", TY_OBJECT}, {"dict", TY_OBJECT},  {"array", TY_ARRAY},
               {"list", TY_ARRAY},    {"null", TY_NULL}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcasecmp(map[i].n, t)) return map[i].b;
    return TY_OTHER;
}

static unsigned schema_types(const json_t *s, int depth) {
    if (!json_is_object(s) || depth > 8) return 0;
    unsigned t = 0;
    const json_t *ty = json_object_get(s, "type");
    if (json_is_string(ty)) t |= type_bit(json_string_value(ty));
    else if (json_is_array(ty)) {
        size_t i;
        json_t *e;
        json_array_foreach(ty, i, e) if (json_is_string(e)) t |= type_bit(json_string_value(e));
    }
    static const char *const comb[] = {"anyOf", "oneOf", "allOf"};
    for (int k = 0; k < 3; k++) {
        const json_t *l = json_object_get(s, comb[k]);
        size_t i;
        json_t *e;
        if (json_is_array(l)) json_array_foreach(l, i, e) t |= schema_types(e, depth + 1);
    }
    if (!t) {
        /* enum / const values imply their types */
        const json_t *en = json_object_get(s, "enum");
        size_t i;
        json_t *e;
        if (json_is_array(en))
            json_array_foreach(en, i, e) t |= json_is_string(e) ? TY_STRING : json_is_integer(e) ? TY_INTEGER
                                             : json_is_real(e) ? TY_NUMBER : json_is_boolean(e) ? TY_BOOLEAN
                                             : json_is_null(e) ? TY_NULL : 0;
    }
    return t;
}

static void json_dump_py(mr_chat_parser *p, mr__buf *b, const json_t *j, int depth);

static void json_dump_py(mr_chat_parser *p, mr__buf *b, const json_t *j, int depth) {
    char num[48];
    switch (json_typeof(j)) {
    case JSON_NULL: adds(p, b, "null"); return;
    case JSON_TRUE: adds(p, b, "true"); return;
    case JSON_FALSE: adds(p, b, "false"); return;
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%lld", (long long)json_integer_value(j));
        adds(p, b, num);
        return;
    case JSON_REAL:
        mr__py_float_repr(json_real_value(j), num);
        adds(p, b, num);
        return;
    case JSON_STRING:
        adds(p, b, "\"");
        json_escape_to(p, b, json_string_value(j), json_string_length(j));
        adds(p, b, "\"");
        return;
    case JSON_ARRAY: {
        adds(p, b, "[");
        size_t i;
        json_t *e;
        json_array_foreach((json_t *)j, i, e) {
            if (i) adds(p, b, ", ");
            json_dump_py(p, b, e, depth + 1);
        }
        adds(p, b, "]");
        return;
    }
    case JSON_OBJECT: {
        adds(p, b, "{");
        const char *k;
        json_t *v;
        bool first = true;
        json_object_foreach((json_t *)j, k, v) {
            if (!first) adds(p, b, ", ");
            first = false;
            adds(p, b, "\"");
            json_escape_to(p, b, k, strlen(k));
            adds(p, b, "\": ");
            json_dump_py(p, b, v, depth + 1);
        }
        adds(p, b, "}");
        return;
    }
    }
}

/* Python int(s) for a stripped s: sign, digits, single '_' between digits.
 * Writes the canonical decimal (no leading zeros) to out. */
static bool py_int_text(const char *s, size_t n, mr__buf *out, mr_chat_parser *p) {
    size_t i = 0;
    bool neg = false;
    if (i < n && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
    if (i >= n) return false;
    mr__buf d = {0};
    bool prev_digit = false, ok = true;
    for (; i < n && ok; i++) {
        if (s[i] >= '0' && s[i] <= '9') {
            if (!(d.n == 0 && s[i] == '0')) addb(p, &d, s + i, 1);
            prev_digit = true;
        } else if (s[i] == '_' && prev_digit && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '9') {
            prev_digit = false;
        } else {
            ok = false;
        }
    }
    if (ok) {
        if (d.n == 0) adds(p, out, "0");
        else {
            if (neg) adds(p, out, "-");
            addb(p, out, d.p, d.n);
        }
    }
    mr__buf_free(&d);
    return ok;
}

/* The JSON text of a parameter value (already stripped), by the schema's types. */
static void convert_value(mr_chat_parser *p, mr__buf *out, const char *s, size_t n, unsigned types) {
    if (n == 4 && !strncasecmp(s, "null", 4)) {
        adds(p, out, "null");
        return;
    }
    if (!types) types = TY_STRING; /* no type information: a string, as MiniMax's guide does */
    if (types & TY_INTEGER) {
        size_t before = out->n;
        if (py_int_text(s, n, out, p)) return;
        out->n = before;
    }
    if (types & TY_NUMBER) {
        bool ok;
        double f = mr__py_float_parse_ok(s, n, &ok);
        if (ok && isfinite(f)) {
            char num[48];
            if (f == floor(f) && fabs(f) < 9.007199254740992e15) snprintf(num, sizeof num, "%lld", (long long)f);
            else mr__py_float_repr(f, num);
            adds(p, out, num);
            return;
        }
    }
    if (types & TY_BOOLEAN) {
        if ((n == 4 && !strncasecmp(s, "true", 4)) || (n == 1 && s[0] == '1')) {
            adds(p, out, "true");
            return;
        }
        if ((n == 5 && !strncasecmp(s, "false", 5)) || (n == 1 && s[0] == '0')) {
            adds(p, out, "false");
            return;
        }
    }
    if (types & (TY_OBJECT | TY_ARRAY | TY_OTHER)) {
        json_t *j = json_loadb(s, n, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
        bool fits = j && ((types & TY_OTHER) || (json_is_object(j) && (types & TY_OBJECT)) ||
                          (json_is_array(j) && (types & TY_ARRAY)));
        if (fits) {
            json_dump_py(p, out, j, 0);
            json_decref(j);
            return;
        }
        json_decref(j);
    }
    /* a string: the declared type, or nothing else fit */
    mr__buf clean = {0};
    add_clean(p, &clean, s, n);
    adds(p, out, "\"");
    json_escape_to(p, out, clean.p ? clean.p : "", clean.n);
    adds(p, out, "\"");
    mr__buf_free(&clean);
}

/* ---------------- tool lookup ---------------- */
static const json_t *tool_props(const json_t *tools, const char *name) {
    size_t i;
    json_t *t;
    if (!json_is_array(tools)) return NULL;
    json_array_foreach(tools, i, t) {
        const json_t *f = json_object_get(t, "function");
        if (!json_is_object(f)) f = t;
        const json_t *n = json_object_get(f, "name");
        if (!json_is_string(n) || strcmp(json_string_value(n), name)) continue;
        const json_t *params = json_object_get(f, "parameters");
        if (!json_is_object(params)) params = json_object_get(f, "input_schema");
        const json_t *props = json_object_get(params, "properties");
        return json_is_object(props) ? props : NULL;
    }
    return NULL;
}

/* ---------------- tool calls ---------------- */
static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void begin_call(mr_chat_parser *p, const char *name, size_t nlen) {
    if (p->n_calls == p->cap_calls) {
        size_t cap = p->cap_calls ? p->cap_calls * 2 : 4;
        pcall *nc = mr_realloc(p->calls, cap * sizeof *nc);
        if (!nc) {
            p->oom = true;
            return;
        }
        memset(nc + p->cap_calls, 0, (cap - p->cap_calls) * sizeof *nc);
        p->calls = nc;
        p->cap_calls = cap;
    }
    int idx = (int)p->n_calls++;
    pcall *c = &p->calls[idx];
    uint64_t x = p->seed ^ ((uint64_t)idx * 0xD1B54A32D192ED03ull);
    uint64_t a = splitmix(&x), b = splitmix(&x);
    snprintf(c->id, sizeof c->id, "call_%016llx%08llx", (unsigned long long)a, (unsigned long long)(b >> 32));
    mr__buf nb = {0};
    add_clean(p, &nb, name, nlen); /* names become JSON strings: valid UTF-8 only */
    addb(p, &nb, "", 0);
    c->name = nb.p; /* NULL only after an allocation failure */
    addb(p, &c->args, "", 0);
    c->props = c->name ? tool_props(p->tools, c->name) : NULL;
    p->cur = idx;
    p->nparams = 0;
    p->seen.n = 0;
    dtool *d = dt_new(p, idx);
    if (d) {
        d->first = true;
        memcpy(d->id, c->id, sizeof d->id);
        d->name = c->name ? c->name : "";
    }
    p->raw.n = 0; /* the markup so far is now this call */
}

static void end_call(mr_chat_parser *p) {
    if (p->cur < 0) return;
    out_args_s(p, p->nparams ? "}" : "{}");
    p->cur = -1;
    p->raw.n = 0;
}

static void param_prefix(mr_chat_parser *p) {
    out_args_s(p, p->nparams ? ", \"" : "{\"");
    out_args_json_str(p, p->pname, strlen(p->pname));
    out_args_s(p, "\": ");
    p->nparams++;
}

/* streams what is safe of a string value */
static void param_stream(mr_chat_parser *p) {
    if (p->p_skip) return;
    const char *s = p->pval.p ? p->pval.p : "";
    size_t n = p->pval.n;
    size_t lead = ltrim_len(s, n);
    if (lead == n) return;
    size_t end = rtrim_len(s, n);
    if (end <= lead) return;
    if (p->p_emitted < lead) p->p_emitted = lead;
    if (!p->p_started) {
        /* it may still become null */
        size_t len = end - lead;
        if (len <= 4 && !strncasecmp(s + lead, "null", len)) return;
        param_prefix(p);
        out_args_s(p, "\"");
        p->p_started = true;
    }
    if (end > p->p_emitted) {
        out_args_json_str(p, s + p->p_emitted, end - p->p_emitted);
        p->p_emitted = end;
    }
}

static bool seen_param(mr_chat_parser *p, const char *name, size_t nlen) {
    size_t i = 0;
    while (i < p->seen.n) {
        size_t l = strlen(p->seen.p + i);
        if (l == nlen && !memcmp(p->seen.p + i, name, nlen)) return true;
        i += l + 1;
    }
    return false;
}

static void param_begin(mr_chat_parser *p, const char *name, size_t nlen) {
    p->p_skip = seen_param(p, name, nlen);
    if (!p->p_skip) {
        addb(p, &p->seen, name, nlen);
        addb(p, &p->seen, "", 1);
    }
    mr_free(p->pname);
    p->pname = mr_malloc(nlen + 1);
    if (!p->pname) {
        p->oom = true;
        return;
    }
    memcpy(p->pname, name, nlen);
    p->pname[nlen] = 0;
    pcall *c = &p->calls[p->cur];
    p->pschema = c->props ? json_object_get(c->props, p->pname) : NULL;
    unsigned t = schema_types(p->pschema, 0);
    p->p_stream = (t & ~(unsigned)(TY_STRING | TY_NULL)) == 0; /* only a string (or nothing known) */
    p->p_started = false;
    p->pval.n = 0;
    p->p_emitted = 0;
}

static void param_end(mr_chat_parser *p) {
    if (p->p_skip) {
        /* a repeated parameter: the first value stands (a JSON object has one value per key) */
        warn(p, "tool call: parameter '%s' given twice; the first value is kept", p->pname);
        mr_free(p->pname);
        p->pname = NULL;
        p->pval.n = 0;
        return;
    }
    const char *s = p->pval.p ? p->pval.p : "";
    size_t n = p->pval.n;
    size_t lead = ltrim_len(s, n), end = rtrim_len(s, n);
    if (end < lead) end = lead;
    if (p->p_started) {
        if (end > p->p_emitted) out_args_json_str(p, s + p->p_emitted, end - p->p_emitted);
        out_args_s(p, "\"");
    } else {
        param_prefix(p);
        mr__buf v = {0};
        convert_value(p, &v, s + lead, end - lead, schema_types(p->pschema, 0));
        out_args(p, v.p ? v.p : "", v.n);
        mr__buf_free(&v);
    }
    mr_free(p->pname);
    p->pname = NULL;
    p->pval.n = 0;
}

/* ---------------- scanning ---------------- */
/* Earliest occurrence of any tag in s[0..n): its index (and *which), or -1
 * with *safe = the bytes that can be released without knowing what follows
 * (no suffix that could start a tag, no incomplete UTF-8 at the end). */
static long scan(const char *s, size_t n, const char *const *tags, int ntags, int *which, size_t *safe, bool final) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '<') continue;
        for (int t = 0; t < ntags; t++) {
            size_t tl = strlen(tags[t]);
            if (i + tl <= n && !memcmp(s + i, tags[t], tl)) {
                *which = t;
                return (long)i;
            }
        }
    }
    size_t keep = 0;
    if (!final) {
        for (size_t i = n > MAX_TAG ? n - MAX_TAG : 0; i < n && !keep; i++) {
            if (s[i] != '<') continue;
            for (int t = 0; t < ntags; t++) {
                size_t tl = strlen(tags[t]);
                if (n - i < tl && !memcmp(s + i, tags[t], n - i)) {
                    keep = n - i;
                    break;
                }
            }
        }
        if (!keep) keep = utf8_incomplete_tail(s, n);
    }
    *safe = n - keep;
    return -1;
}

static void consume(mr_chat_parser *p, size_t k) { p->in_off += k; }

/* Parses `<invoke name="x">` / `<parameter name="x">` at s (which starts with
 * the tag word). Returns 1 with the name span, 0 when more input is needed,
 * -1 when malformed. *len is the whole tag's length. */
static int parse_open_tag(const char *s, size_t n, const char *word, bool final, const char **name, size_t *nlen,
                          size_t *len) {
    size_t wl = strlen(word);
    const char *gt = memchr(s, '>', n < MAX_TAG ? n : MAX_TAG);
    if (!gt) return (n >= MAX_TAG || final) ? -1 : 0;
    size_t i = wl, end = (size_t)(gt - s);
    if (i >= end || !is_ws_byte(s[i])) return -1;
    while (i < end && is_ws_byte(s[i])) i++;
    if (end - i < 4 || memcmp(s + i, "name", 4)) return -1;
    i += 4;
    while (i < end && is_ws_byte(s[i])) i++;
    if (i >= end || s[i] != '=') return -1;
    i++;
    size_t a = i, b = end;
    while (a < b && is_ws_byte(s[a])) a++;
    while (b > a && is_ws_byte(s[b - 1])) b--;
    if (b - a >= 2 && (s[a] == '"' || s[a] == '\'') && s[b - 1] == s[a]) {
        a++;
        b--;
    }
    if (b <= a) return -1;
    for (size_t k = a; k < b; k++)
        if (s[k] == '<' || s[k] == '\n' || s[k] == '"') return -1;
    *name = s + a;
    *nlen = b - a;
    *len = end + 1;
    return 1;
}

/* malformed markup at the current input position: what was held as tool
 * markup since the last commit, and what follows, is content again */
static void malformed(mr_chat_parser *p, const char *why) {
    if (p->cur >= 0) {
        warn(p, "tool call '%s': malformed tool-call markup; the call is closed with the arguments it has and the rest is content",
             p->calls[p->cur].name);
        end_call(p);
    } else {
        warn(p, "malformed tool-call markup (%s) returned as content", why);
    }
    if (p->raw.n) {
        p->c_drop_lead = false;
        out_content(p, p->raw.p, p->raw.n);
        p->raw.n = 0;
    }
    p->c_drop_lead = false;
    p->st = S_CONTENT;
}

/* one step; returns false when it needs more input */
static bool step(mr_chat_parser *p, bool final) {
    const char *s = p->in.p ? p->in.p + p->in_off : "";
    size_t n = p->in.n - p->in_off;
    if (n == 0 && !final) return false;
    int which = 0;
    size_t safe = 0;
    long at;
    switch (p->st) {
    case S_START: {
        /* whitespace, then maybe <think> */
        size_t k = ltrim_len(s, n);
        if (k == n && !final) return false;
        /* a code point cut at the end of this piece may be whitespace yet */
        if (!final && utf8_incomplete_tail(s + k, n - k) == n - k) return false;
        size_t rest = n - k, tl = sizeof T_THINK_OPEN - 1;
        if (rest < tl && !memcmp(s + k, T_THINK_OPEN, rest) && !final) return false;
        if (rest >= tl && !memcmp(s + k, T_THINK_OPEN, tl)) {
            consume(p, k + tl);
            p->st = S_REASON;
            return true;
        }
        p->st = p->o.think_open ? S_REASON : S_CONTENT;
        return true;
    }
    case S_REASON: {
        const char *tags[] = {T_THINK_CLOSE};
        at = scan(s, n, tags, 1, &which, &safe, final);
        if (at < 0) {
            out_reason(p, s, safe);
            consume(p, safe);
            if (final) {
                p->r_ws.n = 0;
                p->st = S_DONE;
            }
            return safe > 0;
        }
        out_reason(p, s, (size_t)at);
        p->r_ws.n = 0;
        consume(p, (size_t)at + sizeof T_THINK_CLOSE - 1);
        p->st = S_CONTENT;
        p->c_drop_lead = true;
        return true;
    }
    case S_CONTENT: {
        if (!p->o.tool_calls) {
            size_t keep = final ? 0 : utf8_incomplete_tail(s, n);
            out_content(p, s, n - keep);
            consume(p, n - keep);
            if (final) {
                flush_content_ws(p);
                p->st = S_DONE;
            }
            return n - keep > 0;
        }
        const char *tags[] = {T_BLOCK_OPEN};
        at = scan(s, n, tags, 1, &which, &safe, final);
        if (at < 0) {
            out_content(p, s, safe);
            consume(p, safe);
            if (final) {
                flush_content_ws(p);
                p->st = S_DONE;
            }
            return safe > 0;
        }
        out_content(p, s, (size_t)at);
        /* whitespace before the block is dropped, unless the block is malformed */
        p->raw.n = 0;
        addb(p, &p->raw, p->c_ws.p ? p->c_ws.p : "", p->c_ws.n);
        p->c_ws.n = 0;
        addb(p, &p->raw, T_BLOCK_OPEN, sizeof T_BLOCK_OPEN - 1);
        consume(p, (size_t)at + sizeof T_BLOCK_OPEN - 1);
        p->st = S_BLOCK;
        return true;
    }
    case S_BLOCK:
    case S_INVOKE: {
        size_t k = 0;
        while (k < n && is_ws_byte(s[k])) k++;
        if (k) {
            if (p->cur < 0 && p->raw.n) addb(p, &p->raw, s, k); /* only markup not yet committed can come back */
            consume(p, k);
            return true;
        }
        if (n == 0) {
            /* end of output inside the markup */
            if (p->st == S_INVOKE) {
                warn(p, "tool call '%s': the output ended inside the call; it is closed with the arguments it has",
                     p->calls[p->cur].name);
                end_call(p);
            } else if (p->raw.n) {
                malformed(p, "the output ended inside a tool-call block");
                return true;
            } else {
                warn(p, "the output ended before </minimax:tool_call>%s", "");
            }
            p->st = S_DONE;
            return false;
        }
        const char *close = p->st == S_BLOCK ? T_BLOCK_CLOSE : T_INVOKE_CLOSE;
        const char *open = p->st == S_BLOCK ? T_INVOKE_OPEN : T_PARAM_OPEN;
        size_t cl = strlen(close), ol = strlen(open);
        /* a closing tag */
        if (n >= cl && !memcmp(s, close, cl)) {
            consume(p, cl);
            if (p->st == S_INVOKE) {
                end_call(p);
                p->st = S_BLOCK;
            } else {
                p->raw.n = 0;
                p->st = S_CONTENT;
                p->c_drop_lead = true;
            }
            return true;
        }
        /* </minimax:tool_call> without </invoke>: close both */
        size_t bl = sizeof T_BLOCK_CLOSE - 1;
        if (p->st == S_INVOKE && n >= bl && !memcmp(s, T_BLOCK_CLOSE, bl)) {
            warn(p, "tool call '%s': </invoke> is missing before </minimax:tool_call>", p->calls[p->cur].name);
            end_call(p);
            consume(p, bl);
            p->st = S_CONTENT;
            p->c_drop_lead = true;
            return true;
        }
        /* an opening tag */
        if (n >= ol && !memcmp(s, open, ol)) {
            const char *name;
            size_t nlen, len;
            int r = parse_open_tag(s, n, open, final, &name, &nlen, &len);
            if (r == 0) return false;
            if (r < 0) {
                malformed(p, p->st == S_BLOCK ? "a bad <invoke> tag" : "a bad <parameter> tag");
                return true;
            }
            if (p->st == S_BLOCK) {
                addb(p, &p->raw, s, len);
                begin_call(p, name, nlen);
                p->st = S_INVOKE;
            } else {
                param_begin(p, name, nlen);
                p->st = S_PARAM;
            }
            consume(p, len);
            return true;
        }
        /* a prefix of something we expect: wait */
        if (!final) {
            const char *cands[] = {close, open, T_BLOCK_CLOSE};
            for (int c = 0; c < 3; c++) {
                size_t tl = strlen(cands[c]);
                if (n < tl && !memcmp(s, cands[c], n)) return false;
            }
        }
        malformed(p, p->st == S_BLOCK ? "text where <invoke> was expected" : "text where <parameter> was expected");
        return true;
    }
    case S_PARAM: {
        const char *tags[] = {T_PARAM_CLOSE, T_INVOKE_CLOSE, T_BLOCK_CLOSE};
        at = scan(s, n, tags, 3, &which, &safe, final);
        size_t take = at < 0 ? safe : (size_t)at;
        addb(p, &p->pval, s, take);
        consume(p, take);
        if (at < 0) {
            if (p->p_stream) param_stream(p);
            if (final) {
                warn(p, "tool call '%s': the output ended inside a parameter; it is closed with the value so far",
                     p->calls[p->cur].name);
                param_end(p);
                end_call(p);
                p->st = S_DONE;
                return false;
            }
            return take > 0;
        }
        if (p->p_stream) param_stream(p);
        param_end(p);
        if (which == 0) {
            consume(p, sizeof T_PARAM_CLOSE - 1);
            p->st = S_INVOKE;
        } else if (which == 1) {
            warn(p, "tool call '%s': </parameter> is missing before </invoke>", p->calls[p->cur].name);
            consume(p, sizeof T_INVOKE_CLOSE - 1);
            end_call(p);
            p->st = S_BLOCK;
        } else {
            warn(p, "tool call '%s': </parameter> and </invoke> are missing before </minimax:tool_call>",
                 p->calls[p->cur].name);
            consume(p, sizeof T_BLOCK_CLOSE - 1);
            end_call(p);
            p->st = S_CONTENT;
            p->c_drop_lead = true;
        }
        return true;
    }
    case S_DONE:
        return false;
    }
    return false;
}

/* ---------------- public API ---------------- */
void mr_chat_parser_opts_default(mr_chat_parser_opts *o, mr_chat_format f) {
    memset(o, 0, sizeof *o);
    o->format = f;
    if (f == MR_CHAT_FORMAT_MINIMAX_M2) {
        o->reasoning = true;
        o->think_open = true;
        o->tool_calls = true;
    }
}

static uint64_t fresh_seed(void) {
    static _Atomic uint64_t counter;
    uint64_t x = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ mr_now_ns();
    x ^= atomic_fetch_add(&counter, 1) * 0x9E3779B97F4A7C15ull;
    return splitmix(&x);
}

mr_status mr_chat_parser_new(const mr_chat_parser_opts *o, mr_chat_parser **out) {
    *out = NULL;
    if (!o) return mr_error_set(MR_EINVAL, "mr_chat_parser_new: no options");
    if (o->tools && !json_is_array(o->tools) && !json_is_null(o->tools))
        return mr_error_set(MR_EINVAL, "parser tools must be an array");
    mr_chat_parser *p = mr_calloc(1, sizeof *p);
    if (!p) return MR_ENOMEM;
    p->o = *o;
    if (o->format == MR_CHAT_FORMAT_PLAIN) {
        p->o.reasoning = false;
        p->o.tool_calls = false;
    }
    p->tools = o->tools && json_is_array(o->tools) ? json_deep_copy(o->tools) : NULL;
    if (o->tools && json_is_array(o->tools) && !p->tools) {
        mr_free(p);
        return MR_ENOMEM;
    }
    p->o.tools = p->tools;
    p->seed = o->id_seed ? o->id_seed : fresh_seed();
    p->cur = -1;
    p->st = p->o.reasoning ? S_START : S_CONTENT;
    *out = p;
    return MR_OK;
}

void mr_chat_parser_free(mr_chat_parser *p) {
    if (!p) return;
    json_decref(p->tools);
    mr__buf_free(&p->in);
    mr__buf_free(&p->raw);
    mr__buf_free(&p->r_ws);
    mr__buf_free(&p->c_ws);
    for (size_t i = 0; i < p->n_calls; i++) {
        mr_free(p->calls[i].name);
        mr__buf_free(&p->calls[i].args);
    }
    mr_free(p->calls);
    mr_free(p->pname);
    mr__buf_free(&p->pval);
    mr__buf_free(&p->seen);
    mr__buf_free(&p->m_reason);
    mr__buf_free(&p->m_content);
    mr__buf_free(&p->d_reason);
    mr__buf_free(&p->d_content);
    for (size_t i = 0; i < p->cap_dt; i++) mr__buf_free(&p->dt[i].args);
    mr_free(p->dt);
    mr_free(p->pub);
    for (size_t i = 0; i < p->n_warn; i++) mr_free(p->warn[i]);
    mr_free(p->warn);
    mr_free(p);
}

static void delta_reset(mr_chat_parser *p) {
    p->d_reason.n = 0;
    p->d_content.n = 0;
    p->n_dt = 0;
    for (size_t i = 0; i < p->n_warn; i++) mr_free(p->warn[i]);
    p->n_warn = 0;
}

static mr_status delta_publish(mr_chat_parser *p, const mr_chat_delta **out) {
    if (p->n_dt > p->cap_pub) {
        mr_chat_tool_delta *np = mr_realloc(p->pub, p->n_dt * sizeof *np);
        if (!np) p->oom = true;
        else {
            p->pub = np;
            p->cap_pub = p->n_dt;
        }
    }
    if (!mr__buf_add(&p->d_reason, "", 0) || !mr__buf_add(&p->d_content, "", 0)) p->oom = true;
    if (p->oom) {
        *out = NULL;
        return mr_error_set(MR_ENOMEM, NULL);
    }
    for (size_t i = 0; i < p->n_dt; i++) {
        p->pub[i].index = p->dt[i].index;
        p->pub[i].id = p->dt[i].first ? p->dt[i].id : NULL;
        p->pub[i].name = p->dt[i].first ? p->dt[i].name : NULL;
        p->pub[i].args = p->dt[i].args.p ? p->dt[i].args.p : "";
        p->pub[i].args_len = p->dt[i].args.n;
    }
    p->delta.reasoning = p->d_reason.p;
    p->delta.reasoning_len = p->d_reason.n;
    p->delta.content = p->d_content.p;
    p->delta.content_len = p->d_content.n;
    p->delta.tools = p->pub;
    p->delta.n_tools = p->n_dt;
    p->delta.warnings = (const char *const *)p->warn;
    p->delta.n_warnings = p->n_warn;
    *out = &p->delta;
    return MR_OK;
}

static void compact_input(mr_chat_parser *p) {
    if (p->in_off == 0) return;
    size_t rest = p->in.n - p->in_off;
    memmove(p->in.p, p->in.p + p->in_off, rest);
    p->in.n = rest;
    p->in_off = 0;
}

mr_status mr_chat_parser_feed(mr_chat_parser *p, const char *text, size_t len, const mr_chat_delta **out) {
    if (out) *out = NULL;
    if (!p || !out || (!text && len)) return mr_error_set(MR_EINVAL, "mr_chat_parser_feed: missing argument");
    if (p->finished) return mr_error_set(MR_ESTATE, "the parser was finished; feed after finish");
    delta_reset(p);
    compact_input(p);
    if (len && !mr__buf_add(&p->in, text, len)) return mr_error_set(MR_ENOMEM, NULL);
    while (!p->oom && step(p, false)) {
    }
    return delta_publish(p, out);
}

mr_status mr_chat_parser_finish(mr_chat_parser *p, const mr_chat_delta **out) {
    if (out) *out = NULL;
    if (!p || !out) return mr_error_set(MR_EINVAL, "mr_chat_parser_finish: missing argument");
    if (p->finished) return mr_error_set(MR_ESTATE, "the parser was already finished");
    delta_reset(p);
    compact_input(p);
    int guard = 0;
    while (!p->oom && p->st != S_DONE && guard++ < 1000000) step(p, true);
    p->finished = true;
    return delta_publish(p, out);
}

json_t *mr_chat_delta_json(const mr_chat_delta *d) {
    if (!d || (!d->reasoning_len && !d->content_len && !d->n_tools)) return NULL;
    json_t *o = json_object();
    if (!o) return NULL;
    bool ok = true;
    if (d->reasoning_len) ok &= !json_object_set_new(o, "reasoning_content", json_stringn(d->reasoning, d->reasoning_len));
    if (d->content_len) ok &= !json_object_set_new(o, "content", json_stringn(d->content, d->content_len));
    if (d->n_tools) {
        json_t *arr = json_array();
        ok &= arr && !json_object_set_new(o, "tool_calls", arr);
        for (size_t i = 0; ok && i < d->n_tools; i++) {
            const mr_chat_tool_delta *t = &d->tools[i];
            json_t *tc = json_object(), *fn = json_object();
            ok &= tc && fn && !json_array_append_new(arr, tc);
            if (!ok) {
                json_decref(fn);
                break;
            }
            ok &= !json_object_set_new(tc, "index", json_integer(t->index));
            if (t->id) {
                ok &= !json_object_set_new(tc, "id", json_string(t->id));
                ok &= !json_object_set_new(tc, "type", json_string("function"));
            }
            if (t->name) ok &= !json_object_set_new(fn, "name", json_string(t->name));
            ok &= !json_object_set_new(fn, "arguments", json_stringn(t->args, t->args_len));
            ok &= !json_object_set_new(tc, "function", fn);
        }
    }
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *mr_chat_parser_message(const mr_chat_parser *p) {
    if (!p) return NULL;
    json_t *o = json_object();
    if (!o) return NULL;
    bool ok = !json_object_set_new(o, "role", json_string("assistant"));
    if (p->m_content.n) ok &= !json_object_set_new(o, "content", json_stringn(p->m_content.p, p->m_content.n));
    else ok &= !json_object_set_new(o, "content", json_null());
    if (p->m_reason.n)
        ok &= !json_object_set_new(o, "reasoning_content", json_stringn(p->m_reason.p, p->m_reason.n));
    if (p->n_calls) {
        json_t *arr = json_array();
        ok &= arr && !json_object_set_new(o, "tool_calls", arr);
        for (size_t i = 0; ok && i < p->n_calls; i++) {
            const pcall *c = &p->calls[i];
            json_t *tc = json_pack("{s:s, s:s, s:{s:s, s:s%}}", "id", c->id, "type", "function", "function", "name",
                                   c->name ? c->name : "", "arguments", c->args.p ? c->args.p : "", c->args.n);
            ok &= tc && !json_array_append_new(arr, tc);
        }
    }
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

size_t mr_chat_parser_tool_call_count(const mr_chat_parser *p) { return p ? p->n_calls : 0; }
