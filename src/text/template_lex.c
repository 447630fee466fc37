/* template_lex.c — Jinja source → tokens, with the whitespace control of the
 * environment transformers uses (trim_blocks=True, lstrip_blocks=True):
 *   - `{%-` / `{{-` / `{#-` strip all whitespace before the tag (str.rstrip);
 *   - `-%}` / `-}}` / `-#}` strip all whitespace after it;
 *   - trim_blocks: the first newline after `%}` or `#}` is removed (not after
 *     `}}`), unless the tag ends with `+%}`;
 *   - lstrip_blocks: spaces and tabs from the start of a line up to `{%` or
 *     `{#` are removed, unless the tag starts with `{%+`;
 *   - `{% raw %}...{% endraw %}` is data.
 * Inside tags: names, strings (Python escapes, decoded as jinja2 does with
 * unicode-escape), integers (0b/0o/0x, `_` separators), floats, operators.
 * `}}` / `%}` close a tag only when brackets are balanced.
 * The caller has already normalized newlines to \n and removed one trailing
 * newline (keep_trailing_newline=False). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/template_internal.h"

typedef struct {
    mr__arena *a;
    mr__tpl_err *e;
    const char *s;
    size_t n;
    size_t pos;
    int line;
    size_t line_pos; /* `line` is the line of s[line_pos] */
    ttoken *t;
    size_t nt, cap;
} lexer;

static int line_at(lexer *L, size_t q) {
    while (L->line_pos < q && L->line_pos < L->n) {
        if (L->s[L->line_pos] == '\n') L->line++;
        L->line_pos++;
    }
    return L->line;
}

static ttoken *push(lexer *L, int type, size_t at) {
    if (L->nt == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        ttoken *nt = mr__arena_alloc(L->a, cap * sizeof(ttoken));
        if (L->nt) memcpy(nt, L->t, L->nt * sizeof(ttoken));
        L->t = nt;
        L->cap = cap;
    }
    ttoken *t = &L->t[L->nt++];
    memset(t, 0, sizeof *t);
    t->type = (uint8_t)type;
    t->line = line_at(L, at);
    return t;
}

static size_t ws_len_at(const char *s, size_t n, size_t i) {
    size_t adv;
    uint32_t cp = mr__utf8_decode(s + i, n - i, &adv);
    return mr__py_isspace(cp) ? adv : 0;
}

static size_t skip_ws(const char *s, size_t n, size_t i) {
    size_t k;
    while (i < n && (k = ws_len_at(s, n, i)) > 0) i += k;
    return i;
}

/* length of text after Python str.rstrip() */
static size_t rstrip_len(const char *s, size_t n) {
    while (n > 0) {
        size_t j = n - 1;
        while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
        if (!ws_len_at(s, n, j)) break;
        n = j;
    }
    return n;
}

/* Applies the strip sign of the tag that follows text [start, start+len). */
static size_t strip_text(const lexer *L, size_t start, size_t len, char sign, bool is_var) {
    const char *text = L->s + start;
    if (sign == '-') return rstrip_len(text, len);
    if (sign == '+' || is_var) return len;
    /* lstrip_blocks */
    size_t l_pos = 0;
    for (size_t i = len; i > 0; i--)
        if (text[i - 1] == '\n') {
            l_pos = i;
            break;
        }
    bool line_starting = start == 0 || L->s[start - 1] == '\n';
    if (l_pos > 0 || line_starting) {
        if (l_pos < len && skip_ws(text, len, l_pos) == len) return l_pos;
    }
    return len;
}

static void emit_data(lexer *L, size_t start, size_t len) {
    if (len == 0) return;
    ttoken *t = push(L, TK_DATA, start);
    char *p = mr__arena_alloc(L->a, len + 1);
    memcpy(p, L->s + start, len);
    t->p = p;
    t->n = len;
}

/* "{%" sign? ws* word ws* then "-%}" ws* | "%}" (trim newline when trim) —
 * returns the end position or 0. */
static size_t match_tag_word(const lexer *L, size_t q, const char *word, char *sign_out, bool trim_after) {
    const char *s = L->s;
    size_t n = L->n, i = q + 2;
    char sign = 0;
    if (i < n && (s[i] == '-' || s[i] == '+')) sign = s[i++];
    i = skip_ws(s, n, i);
    size_t wl = strlen(word);
    if (i + wl > n || memcmp(s + i, word, wl) != 0) return 0;
    i += wl;
    size_t j = skip_ws(s, n, i);
    if (trim_after && j + 3 <= n && s[j] == '+' && s[j + 1] == '%' && s[j + 2] == '}') {
        if (sign_out) *sign_out = sign;
        return j + 3;
    }
    if (j + 3 <= n && s[j] == '-' && s[j + 1] == '%' && s[j + 2] == '}') {
        if (sign_out) *sign_out = sign;
        return skip_ws(s, n, j + 3);
    }
    if (j + 2 <= n && s[j] == '%' && s[j + 1] == '}') {
        j += 2;
        if (trim_after && j < n && s[j] == '\n') j++;
        if (sign_out) *sign_out = sign;
        return j;
    }
    return 0;
}

static bool is_name_start(const char *s, size_t n, size_t i) {
    unsigned char c = (unsigned char)s[i];
    if (c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return true;
    return c >= 0x80 && !ws_len_at(s, n, i);
}

static bool is_name_char(const char *s, size_t n, size_t i) {
    unsigned char c = (unsigned char)s[i];
    return is_name_start(s, n, i) || (c >= '0' && c <= '9');
}

static bool isdig(char c) { return c >= '0' && c <= '9'; }

/* (\d+_)*\d+ at i: returns end or i when absent */
static size_t digits_us(const char *s, size_t n, size_t i) {
    size_t j = i;
    if (j >= n || !isdig(s[j])) return i;
    while (j < n && isdig(s[j])) {
        j++;
        if (j + 1 < n && s[j] == '_' && isdig(s[j + 1])) j++;
    }
    return j;
}

static size_t match_float(const char *s, size_t n, size_t i) {
    if (i > 0 && s[i - 1] == '.') return 0;
    size_t j = digits_us(s, n, i);
    if (j == i) return 0;
    /* fraction then exponent, or exponent, or fraction */
    size_t k = j;
    bool frac = false;
    if (k < n && s[k] == '.') {
        size_t f = digits_us(s, n, k + 1);
        if (f > k + 1) {
            k = f;
            frac = true;
        }
    }
    if (k < n && (s[k] == 'e' || s[k] == 'E')) {
        size_t e = k + 1;
        if (e < n && (s[e] == '+' || s[e] == '-')) e++;
        size_t d = digits_us(s, n, e);
        if (d > e) return d;
    }
    return frac ? k : 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static size_t match_int(lexer *L, size_t i, ttoken *out) {
    const char *s = L->s;
    size_t n = L->n;
    int base = 10;
    size_t j = i, dstart;
    if (s[i] == '0' && i + 1 < n && (s[i + 1] == 'b' || s[i + 1] == 'B' || s[i + 1] == 'o' || s[i + 1] == 'O' ||
                                     s[i + 1] == 'x' || s[i + 1] == 'X')) {
        char c = (char)(s[i + 1] | 0x20);
        base = c == 'b' ? 2 : c == 'o' ? 8 : 16;
        j = i + 2;
        dstart = j;
        for (;;) {
            size_t k = j;
            if (k < n && s[k] == '_') k++;
            if (k >= n) break;
            int v = hexval(s[k]);
            if (v < 0 || v >= base) break;
            j = k + 1;
        }
        if (j == dstart) {
            base = 10; /* "0x" without digits: the integer 0 */
            j = i;
        }
    }
    if (base == 10) {
        if (!isdig(s[i])) return 0;
        if (s[i] == '0') {
            j = i + 1;
            for (;;) {
                size_t k = j;
                if (k < n && s[k] == '_') k++;
                if (k < n && s[k] == '0') j = k + 1;
                else break;
            }
        } else {
            j = i + 1;
            for (;;) {
                size_t k = j;
                if (k < n && s[k] == '_') k++;
                if (k < n && isdig(s[k])) j = k + 1;
                else break;
            }
        }
        dstart = i;
    }
    uint64_t v = 0;
    bool big = false;
    for (size_t k = dstart; k < j; k++) {
        if (s[k] == '_') continue;
        int d = hexval(s[k]);
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) big = true;
        v = v * (uint64_t)base + (uint64_t)d;
    }
    if (v > (uint64_t)INT64_MAX) big = true;
    out->i = (int64_t)v;
    out->int_big = big;
    return j;
}

static void addbytes(lexer *L, char **buf, size_t *len, size_t *cap, const char *p, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t nc = (*cap ? *cap * 2 : 64);
        while (nc < *len + n + 1) nc *= 2;
        char *nb = mr__arena_alloc(L->a, nc);
        if (*len) memcpy(nb, *buf, *len);
        *buf = nb;
        *cap = nc;
    }
    memcpy(*buf + *len, p, n);
    *len += n;
    (*buf)[*len] = 0;
}

/* Decodes the body of a string literal the way jinja2 does:
 * value.encode("ascii", "backslashreplace").decode("unicode-escape"). */
static void decode_string(lexer *L, const char *p, size_t n, int line, ttoken *t) {
    char *buf = NULL;
    size_t len = 0, cap = 0;
    addbytes(L, &buf, &len, &cap, "", 0);
    size_t i = 0;
    while (i < n) {
        if (p[i] != '\\') {
            size_t j = i;
            while (j < n && p[j] != '\\') j++;
            addbytes(L, &buf, &len, &cap, p + i, j - i);
            i = j;
            continue;
        }
        /* backslash: the regex guarantees a following char */
        i++;
        unsigned char c = (unsigned char)p[i];
        char out[8];
        uint32_t cp = 0;
        int hexn = 0;
        switch (c) {
        case '\n':
            i++;
            continue;
        case '\\': out[0] = '\\'; break;
        case '\'': out[0] = '\''; break;
        case '"': out[0] = '"'; break;
        case 'a': out[0] = 7; break;
        case 'b': out[0] = 8; break;
        case 'f': out[0] = 12; break;
        case 'n': out[0] = '\n'; break;
        case 'r': out[0] = '\r'; break;
        case 't': out[0] = '\t'; break;
        case 'v': out[0] = 11; break;
        case 'x': hexn = 2; break;
        case 'u': hexn = 4; break;
        case 'U': hexn = 8; break;
        case 'N':
            mr__tpl_fail(L->e, MR_EINPUT, line, "\\N{...} escapes in string literals are not supported");
        default:
            if (c >= '0' && c <= '7') {
                int k = 0;
                while (k < 3 && i < n && p[i] >= '0' && p[i] <= '7') {
                    cp = cp * 8 + (uint32_t)(p[i] - '0');
                    i++;
                    k++;
                }
                size_t m = mr__utf8_encode(cp, out);
                addbytes(L, &buf, &len, &cap, out, m);
                continue;
            }
            if (c >= 0x80) {
                /* backslashreplace turns the character into \xhh / \uhhhh /
                 * \Uhhhhhhhh after this backslash, which then escapes only
                 * itself: the result is a backslash and that text */
                size_t adv;
                uint32_t u = mr__utf8_decode(p + i, n - i, &adv);
                char esc[16];
                if (u < 0x100) snprintf(esc, sizeof esc, "\\x%02x", u);
                else if (u < 0x10000) snprintf(esc, sizeof esc, "\\u%04x", u);
                else snprintf(esc, sizeof esc, "\\U%08x", u);
                addbytes(L, &buf, &len, &cap, esc, strlen(esc));
                i += adv;
                continue;
            }
            /* unknown escape: kept as written */
            out[0] = '\\';
            out[1] = (char)c;
            addbytes(L, &buf, &len, &cap, out, 2);
            i++;
            continue;
        }
        i++;
        if (hexn) {
            for (int k = 0; k < hexn; k++) {
                int v = i < n ? hexval(p[i]) : -1;
                if (v < 0)
                    mr__tpl_fail(L->e, MR_EINPUT, line, "truncated \\%c escape in a string literal", c);
                cp = cp * 16 + (uint32_t)v;
                i++;
            }
            if (cp > 0x10FFFF) mr__tpl_fail(L->e, MR_EINPUT, line, "illegal Unicode character in a string literal");
            if (cp >= 0xD800 && cp <= 0xDFFF)
                mr__tpl_fail(L->e, MR_EINPUT, line, "a lone surrogate (\\u%04x) in a string literal", cp);
            size_t m = mr__utf8_encode(cp, out);
            addbytes(L, &buf, &len, &cap, out, m);
            continue;
        }
        addbytes(L, &buf, &len, &cap, out, 1);
    }
    t->p = buf;
    t->n = len;
}

/* Lexes the inside of {{ }} or {% %} from L->pos; is_block picks the end rule. */
static void lex_tag(lexer *L, bool is_block, int open_line) {
    const char *s = L->s;
    size_t n = L->n;
    char stack[256];
    int depth = 0;
    for (;;) {
        size_t i = L->pos;
        if (i >= n)
            mr__tpl_fail(L->e, MR_EINPUT, open_line, "unexpected end of template: %s opened here is never closed",
                         is_block ? "'{%'" : "'{{'");
        if (depth == 0) {
            if (is_block) {
                if (i + 3 <= n && s[i] == '+' && s[i + 1] == '%' && s[i + 2] == '}') {
                    push(L, TK_BLOCK_END, i);
                    L->pos = i + 3;
                    return;
                }
                if (i + 3 <= n && s[i] == '-' && s[i + 1] == '%' && s[i + 2] == '}') {
                    push(L, TK_BLOCK_END, i);
                    L->pos = skip_ws(s, n, i + 3);
                    return;
                }
                if (i + 2 <= n && s[i] == '%' && s[i + 1] == '}') {
                    push(L, TK_BLOCK_END, i);
                    i += 2;
                    if (i < n && s[i] == '\n') i++;
                    L->pos = i;
                    return;
                }
            } else {
                if (i + 3 <= n && s[i] == '-' && s[i + 1] == '}' && s[i + 2] == '}') {
                    push(L, TK_VAR_END, i);
                    L->pos = skip_ws(s, n, i + 3);
                    return;
                }
                if (i + 2 <= n && s[i] == '}' && s[i + 1] == '}') {
                    push(L, TK_VAR_END, i);
                    L->pos = i + 2;
                    return;
                }
            }
        }
        size_t w = skip_ws(s, n, i);
        if (w > i) {
            L->pos = w;
            continue;
        }
        size_t e;
        if ((e = match_float(s, n, i)) > 0) {
            ttoken *t = push(L, TK_FLOAT, i);
            char tmp[128];
            size_t o = 0;
            for (size_t k = i; k < e && o + 1 < sizeof tmp; k++)
                if (s[k] != '_') tmp[o++] = s[k];
            tmp[o] = 0;
            t->f = strtod(tmp, NULL);
            L->pos = e;
            continue;
        }
        if (isdig(s[i])) {
            ttoken tk = {0};
            e = match_int(L, i, &tk);
            ttoken *t = push(L, TK_INT, i);
            t->i = tk.i;
            t->int_big = tk.int_big;
            if (tk.int_big) mr__tpl_fail(L->e, MR_EINPUT, t->line, "integer literal too large");
            L->pos = e;
            continue;
        }
        if (is_name_start(s, n, i)) {
            size_t j = i;
            while (j < n && is_name_char(s, n, j)) {
                size_t adv = 1;
                if ((unsigned char)s[j] >= 0x80) mr__utf8_decode(s + j, n - j, &adv);
                j += adv;
            }
            ttoken *t = push(L, TK_NAME, i);
            char *p = mr__arena_alloc(L->a, j - i + 1);
            memcpy(p, s + i, j - i);
            t->p = p;
            t->n = j - i;
            L->pos = j;
            continue;
        }
        if (s[i] == '\'' || s[i] == '"') {
            char q = s[i];
            size_t j = i + 1;
            while (j < n && s[j] != q) {
                if (s[j] == '\\' && j + 1 < n) j += 2;
                else j++;
            }
            if (j >= n) mr__tpl_fail(L->e, MR_EINPUT, line_at(L, i), "unterminated string literal");
            ttoken *t = push(L, TK_STRING, i);
            decode_string(L, s + i + 1, j - i - 1, t->line, t);
            L->pos = j + 1;
            continue;
        }
        static const struct {
            const char *op;
            int type;
        } ops[] = {
            {"//", TK_FLOORDIV}, {"**", TK_POW}, {"==", TK_EQ}, {"!=", TK_NE}, {">=", TK_GTEQ}, {"<=", TK_LTEQ},
            {"+", TK_ADD},       {"-", TK_SUB},  {"/", TK_DIV}, {"*", TK_MUL}, {"%", TK_MOD},   {"~", TK_TILDE},
            {"[", TK_LBRACKET},  {"]", TK_RBRACKET}, {"(", TK_LPAREN}, {")", TK_RPAREN}, {"{", TK_LBRACE},
            {"}", TK_RBRACE},    {">", TK_GT},   {"<", TK_LT},  {"=", TK_ASSIGN}, {".", TK_DOT}, {":", TK_COLON},
            {"|", TK_PIPE},      {",", TK_COMMA}, {";", TK_SEMICOLON},
        };
        int type = -1;
        size_t ol = 0;
        for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
            ol = strlen(ops[k].op);
            if (i + ol <= n && memcmp(s + i, ops[k].op, ol) == 0) {
                type = ops[k].type;
                break;
            }
        }
        if (type < 0) {
            size_t adv;
            mr__utf8_decode(s + i, n - i, &adv);
            mr__tpl_fail(L->e, MR_EINPUT, line_at(L, i), "unexpected character '%.*s'", (int)adv, s + i);
        }
        int line = line_at(L, i);
        if (type == TK_LBRACE || type == TK_LPAREN || type == TK_LBRACKET) {
            if (depth >= (int)sizeof stack) mr__tpl_fail(L->e, MR_EINPUT, line, "brackets nested too deeply");
            stack[depth++] = type == TK_LBRACE ? '}' : type == TK_LPAREN ? ')' : ']';
        } else if (type == TK_RBRACE || type == TK_RPAREN || type == TK_RBRACKET) {
            char ch = s[i];
            if (depth == 0) mr__tpl_fail(L->e, MR_EINPUT, line, "unexpected '%c'", ch);
            if (stack[depth - 1] != ch)
                mr__tpl_fail(L->e, MR_EINPUT, line, "unexpected '%c', expected '%c'", ch, stack[depth - 1]);
            depth--;
        }
        push(L, type, i);
        L->pos = i + ol;
    }
}

void mr__tpl_lex(mr__arena *a, mr__tpl_err *e, const char *src, size_t n, ttokens *out) {
    lexer L = {.a = a, .e = e, .s = src, .n = n, .line = 1};
    while (L.pos < n) {
        /* the next tag start */
        size_t q = L.pos;
        const char *hit = NULL;
        while (q + 1 < n) {
            hit = memchr(src + q, '{', n - q - 1);
            if (!hit) break;
            q = (size_t)(hit - src);
            char c2 = src[q + 1];
            if (c2 == '{' || c2 == '%' || c2 == '#') break;
            q++;
            hit = NULL;
        }
        if (!hit) {
            emit_data(&L, L.pos, n - L.pos);
            break;
        }
        char kind = src[q + 1];
        size_t after = q + 2;
        char sign = 0;
        if (after < n && (src[after] == '-' || src[after] == '+')) sign = src[after++];
        /* raw block? */
        size_t raw_end = 0;
        char raw_sign = 0;
        if (kind == '%') {
            raw_end = match_tag_word(&L, q, "raw", &raw_sign, false);
            if (raw_end) sign = raw_sign;
        }
        size_t tlen = strip_text(&L, L.pos, q - L.pos, sign, kind == '{');
        emit_data(&L, L.pos, tlen);
        int open_line = line_at(&L, q);
        if (raw_end) {
            /* find {% endraw %} */
            size_t r = raw_end;
            for (;;) {
                const char *h = r < n ? memchr(src + r, '{', n - r) : NULL;
                if (!h) mr__tpl_fail(e, MR_EINPUT, open_line, "missing end of raw directive");
                size_t rq = (size_t)(h - src);
                char es = 0;
                size_t ee = (rq + 1 < n && src[rq + 1] == '%') ? match_tag_word(&L, rq, "endraw", &es, true) : 0;
                if (!ee) {
                    r = rq + 1;
                    continue;
                }
                size_t rl = strip_text(&L, raw_end, rq - raw_end, es, false);
                emit_data(&L, raw_end, rl);
                L.pos = ee;
                break;
            }
            continue;
        }
        if (kind == '#') {
            size_t i = after;
            for (;;) {
                if (i + 1 >= n) mr__tpl_fail(e, MR_EINPUT, open_line, "missing end of comment tag");
                if (src[i] == '+' && i + 2 < n && src[i + 1] == '#' && src[i + 2] == '}') {
                    i += 3;
                    break;
                }
                if (src[i] == '-' && i + 2 < n && src[i + 1] == '#' && src[i + 2] == '}') {
                    i = skip_ws(src, n, i + 3);
                    break;
                }
                if (src[i] == '#' && src[i + 1] == '}') {
                    i += 2;
                    if (i < n && src[i] == '\n') i++;
                    break;
                }
                i++;
            }
            L.pos = i;
            continue;
        }
        push(&L, kind == '{' ? TK_VAR_BEGIN : TK_BLOCK_BEGIN, q);
        L.pos = after;
        lex_tag(&L, kind == '%', open_line);
    }
    push(&L, TK_EOF, n);
    out->t = L.t;
    out->n = L.nt;
}
