/* template_builtins.c — what a Jinja template can call: jinja2's builtin
 * filters and tests, the globals of transformers' chat-template environment
 * (range, dict, namespace, cycler, joiner, raise_exception, strftime_now),
 * and the Python methods of str, dict and list that the immutable sandbox
 * allows (mutating methods resolve to an Undefined that fails when called).
 *
 * Each builtin binds its arguments like the Python function it mirrors
 * (positional, then keywords, defaults) and follows its semantics; the
 * comments name the Python behaviour where it is not obvious. Case mapping
 * (upper, lower, title, capitalize) is ASCII only; everything else is
 * Unicode-aware (whitespace, lengths, slicing count code points). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/template_internal.h"

/* ---------------- name tables ---------------- */
#define MR_TPL_FILTERS(X)                                                                                         \
    X(abs) X(attr) X(batch) X(capitalize) X(center) X(count) X(d) X(default) X(dictsort) X(e) X(escape) X(first) \
    X(float) X(forceescape) X(format) X(indent) X(int) X(items) X(join) X(last) X(length) X(list) X(lower)      \
    X(map) X(max) X(min) X(reject) X(rejectattr) X(replace) X(reverse) X(round) X(safe) X(select)             \
    X(selectattr) X(sort) X(string) X(sum) X(title) X(tojson) X(trim) X(truncate) X(unique) X(upper)          \
    X(wordcount)

enum {
#define X(n) F_##n,
    MR_TPL_FILTERS(X)
#undef X
    F_COUNT
};
static const char *const filter_names[] = {
#define X(n) #n,
    MR_TPL_FILTERS(X)
#undef X
};
/* jinja2 builtins moerun leaves out */
static const char *const filter_unsupported[] = {"filesizeformat", "groupby", "pprint", "random", "slice",
                                                 "striptags", "urlencode", "urlize", "wordwrap", "xmlattr", NULL};

#define MR_TPL_TESTS(X)                                                                                    \
    X(odd, "odd") X(even, "even") X(divisibleby, "divisibleby") X(defined, "defined")                      \
    X(undefined, "undefined") X(filter, "filter") X(test, "test") X(none, "none") X(boolean, "boolean")    \
    X(false, "false") X(true, "true") X(integer, "integer") X(float, "float") X(lower, "lower")            \
    X(upper, "upper") X(string, "string") X(mapping, "mapping") X(number, "number")                       \
    X(sequence, "sequence") X(iterable, "iterable") X(callable, "callable") X(sameas, "sameas")           \
    X(escaped, "escaped") X(in, "in") X(eq, "==") X(eq2, "eq") X(eq3, "equalto") X(ne, "!=") X(ne2, "ne") \
    X(gt, ">") X(gt2, "gt") X(gt3, "greaterthan") X(ge, "ge") X(ge2, ">=") X(lt, "<") X(lt2, "lt")        \
    X(lt3, "lessthan") X(le, "<=") X(le2, "le")

enum {
#define X(id, n) T_##id,
    MR_TPL_TESTS(X)
#undef X
    T_COUNT
};
static const char *const test_names[] = {
#define X(id, n) n,
    MR_TPL_TESTS(X)
#undef X
};

#define MR_TPL_GLOBALS(X) \
    X(range) X(dict) X(namespace) X(raise_exception) X(strftime_now) X(cycler) X(joiner)
enum {
#define X(n) G_##n,
    MR_TPL_GLOBALS(X)
#undef X
    G_COUNT
};
static const char *const global_names[] = {
#define X(n) #n,
    MR_TPL_GLOBALS(X)
#undef X
};

int mr__tpl_filter_id(const char *name, bool *unsupported) {
    *unsupported = false;
    for (int i = 0; i < F_COUNT; i++)
        if (!strcmp(filter_names[i], name)) return i;
    for (int i = 0; filter_unsupported[i]; i++)
        if (!strcmp(filter_unsupported[i], name)) *unsupported = true;
    return -1;
}

int mr__tpl_test_id(const char *name, bool *unsupported) {
    *unsupported = false;
    for (int i = 0; i < T_COUNT; i++)
        if (!strcmp(test_names[i], name)) return i;
    return -1;
}

int mr__tpl_global_id(const char *name) {
    for (int i = 0; i < G_COUNT; i++)
        if (!strcmp(global_names[i], name)) return i;
    return -1;
}

/* ---------------- argument binding ---------------- */
#define ARGS tv *args, size_t nargs, const char **kwn, tv *kwv, size_t nkw
#define PASS args, nargs, kwn, kwv, nkw

static void bind(mr__tpl_ctx *c, int line, const char *fn, const char *const *names, size_t nn, ARGS, tv *out) {
    for (size_t i = 0; i < nn; i++) out[i] = tv_missing();
    if (nargs > nn) mr__tpl_raise(c, line, "%s() takes at most %zu argument(s) (%zu given)", fn, nn, nargs);
    for (size_t i = 0; i < nargs; i++) out[i] = args[i];
    for (size_t k = 0; k < nkw; k++) {
        size_t i;
        for (i = 0; i < nn; i++)
            if (!strcmp(names[i], kwn[k])) break;
        if (i == nn) mr__tpl_raise(c, line, "%s() got an unexpected keyword argument '%s'", fn, kwn[k]);
        if (out[i].kind != TV_MISSING) mr__tpl_raise(c, line, "%s() got multiple values for argument '%s'", fn, kwn[k]);
        out[i] = kwv[k];
    }
}

static bool given(tv v) { return v.kind != TV_MISSING; }

static tstr *need_str(mr__tpl_ctx *c, int line, tv v, const char *what) {
    if (v.kind == TV_STR) return v.u.s;
    if (v.kind == TV_UNDEF && v.u.s) mr__tpl_raise(c, line, "%s", v.u.s->p);
    mr__tpl_raise(c, line, "%s must be a string, not %s", what, mr__tv_type_name(v));
}

static int64_t need_int(mr__tpl_ctx *c, int line, tv v, const char *what) {
    if (v.kind == TV_INT) return v.u.i;
    if (v.kind == TV_BOOL) return v.u.b;
    if (v.kind == TV_UNDEF && v.u.s) mr__tpl_raise(c, line, "%s", v.u.s->p);
    mr__tpl_raise(c, line, "%s must be an integer, not %s", what, mr__tv_type_name(v));
}

static bool arg_bool(tv v, bool dflt) { return given(v) ? mr__tv_truthy(&v) : dflt; }

static tv mk_list(tlist *l) {
    tv v = {0};
    v.kind = TV_LIST;
    v.u.l = l;
    return v;
}

static tv mk_tuple2(mr__tpl_ctx *c, tv a, tv b) {
    tlist *l = mr__tlist_new(&c->arena, 2);
    l->v[0] = a;
    l->v[1] = b;
    l->n = 2;
    l->tuple = true;
    return mk_list(l);
}

static tv str_from_buf(mr__tpl_ctx *c, const char *p, size_t n) { return mr__tv_str(&c->arena, p, n); }

/* scratch text building in the arena (no longjmp-leak: arena owned) */
typedef struct {
    mr__tpl_ctx *c;
    char *p;
    size_t n, cap;
} sb;

static void sb_add(sb *b, const char *p, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->n + n + 1) {
            if (cap > ((size_t)1 << 40)) mr__tpl_fail(&b->c->err, MR_ECAPACITY, b->c->cur_line, "string too large");
            cap *= 2;
        }
        if (b->c->lim.max_output_bytes && cap > 2 * b->c->lim.max_output_bytes + 64)
            mr__tpl_fail(&b->c->err, MR_ECAPACITY, b->c->cur_line, "a string grew past the output limit (%zu bytes)",
                         b->c->lim.max_output_bytes);
        char *np = TPL_ALLOC(b->c, cap);
        if (b->n) memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_adds(sb *b, const char *s) { sb_add(b, s, strlen(s)); }
static void sb_addtv(sb *b, tv v) {
    tstr *s = mr__tv_to_str(b->c, v);
    sb_add(b, s->p, s->len);
}
static tv sb_done(sb *b) { return str_from_buf(b->c, b->p ? b->p : "", b->n); }

/* ---------------- string helpers (Python semantics) ---------------- */
static bool in_chars(uint32_t cp, const tstr *chars) {
    size_t i = 0;
    while (i < chars->len) {
        size_t adv;
        if (mr__utf8_decode(chars->p + i, chars->len - i, &adv) == cp) return true;
        i += adv;
    }
    return false;
}

static bool strip_match(uint32_t cp, const tstr *chars) { return chars ? in_chars(cp, chars) : mr__py_isspace(cp); }

/* which: 1 left, 2 right, 3 both */
static tv py_strip(mr__tpl_ctx *c, tstr *s, const tstr *chars, int which) {
    size_t a = 0, b = s->len;
    if (which & 1)
        while (a < b) {
            size_t adv;
            uint32_t cp = mr__utf8_decode(s->p + a, b - a, &adv);
            if (!strip_match(cp, chars)) break;
            a += adv;
        }
    if (which & 2)
        while (b > a) {
            size_t j = b - 1;
            while (j > a && ((unsigned char)s->p[j] & 0xC0) == 0x80) j--;
            size_t adv;
            uint32_t cp = mr__utf8_decode(s->p + j, b - j, &adv);
            if (!strip_match(cp, chars)) break;
            b = j;
        }
    if (a == 0 && b == s->len) return tv_strv(s);
    return str_from_buf(c, s->p + a, b - a);
}

static char ascii_upper(char ch) { return (ch >= 'a' && ch <= 'z') ? (char)(ch - 32) : ch; }
static char ascii_lower(char ch) { return (ch >= 'A' && ch <= 'Z') ? (char)(ch + 32) : ch; }
static bool ascii_alpha(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'); }

static tv str_map(mr__tpl_ctx *c, tstr *s, int mode) {
    /* mode 0 upper, 1 lower, 2 swapcase */
    tstr *r = mr__tstr_new(&c->arena, s->p, s->len);
    for (size_t i = 0; i < r->len; i++) {
        char ch = r->p[i];
        if (mode == 0) r->p[i] = ascii_upper(ch);
        else if (mode == 1) r->p[i] = ascii_lower(ch);
        else r->p[i] = (ch >= 'a' && ch <= 'z') ? ascii_upper(ch) : ascii_lower(ch);
    }
    r->ncp = s->ncp;
    mr__tpl_step(c, s->len / 64);
    return tv_strv(r);
}

static tv py_title(mr__tpl_ctx *c, tstr *s) {
    tstr *r = mr__tstr_new(&c->arena, s->p, s->len);
    bool prev_cased = false;
    for (size_t i = 0; i < r->len; i++) {
        char ch = r->p[i];
        if (ascii_alpha(ch)) {
            r->p[i] = prev_cased ? ascii_lower(ch) : ascii_upper(ch);
            prev_cased = true;
        } else if ((unsigned char)ch >= 0x80) {
            /* a non-ASCII letter continues a word in Python; treat every
             * non-ASCII byte so (it has no ASCII case to change) */
            prev_cased = true;
        } else {
            prev_cased = false;
        }
    }
    return tv_strv(r);
}

static tv py_capitalize(mr__tpl_ctx *c, tstr *s) {
    tstr *r = mr__tstr_new(&c->arena, s->p, s->len);
    for (size_t i = 0; i < r->len; i++) r->p[i] = i == 0 ? ascii_upper(r->p[i]) : ascii_lower(r->p[i]);
    return tv_strv(r);
}

/* jinja2's title filter: each chunk after a run of [-\s({[<] is capitalized */
static tv jinja_title(mr__tpl_ctx *c, tstr *s) {
    sb b = {.c = c};
    size_t i = 0;
    bool start = true;
    while (i < s->len) {
        size_t adv;
        uint32_t cp = mr__utf8_decode(s->p + i, s->len - i, &adv);
        bool sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || mr__py_isspace(cp);
        if (sep) {
            sb_add(&b, s->p + i, adv);
            start = true;
        } else {
            char ch = s->p[i];
            if (adv == 1) {
                char o = start ? ascii_upper(ch) : ascii_lower(ch);
                sb_add(&b, &o, 1);
            } else {
                sb_add(&b, s->p + i, adv);
            }
            start = false;
        }
        i += adv;
    }
    return sb_done(&b);
}

static const char *find_bytes(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn == 0) return h;
    return memmem(h, hn, n, nn);
}

static int64_t cp_index(const tstr *s, size_t byte_off) {
    int64_t k = 0;
    for (size_t i = 0; i < byte_off; i++)
        if (((unsigned char)s->p[i] & 0xC0) != 0x80) k++;
    return k;
}

static tv py_replace(mr__tpl_ctx *c, tstr *s, tstr *old, tstr *new_, int64_t count) {
    sb b = {.c = c};
    if (count < 0) count = INT64_MAX;
    if (old->len == 0) {
        /* inserts new before every character and at the end */
        size_t i = 0;
        int64_t done = 0;
        while (i <= s->len) {
            if (done < count) {
                sb_add(&b, new_->p, new_->len);
                done++;
            }
            if (i == s->len) break;
            size_t adv;
            mr__utf8_decode(s->p + i, s->len - i, &adv);
            sb_add(&b, s->p + i, adv);
            i += adv;
        }
        return sb_done(&b);
    }
    size_t i = 0;
    int64_t done = 0;
    while (i <= s->len && done < count) {
        const char *h = find_bytes(s->p + i, s->len - i, old->p, old->len);
        if (!h) break;
        size_t at = (size_t)(h - s->p);
        sb_add(&b, s->p + i, at - i);
        sb_add(&b, new_->p, new_->len);
        i = at + old->len;
        done++;
    }
    sb_add(&b, s->p + i, s->len - i);
    mr__tpl_step(c, s->len / 64);
    return sb_done(&b);
}

/* str.split / str.rsplit */
static tv py_split(mr__tpl_ctx *c, int line, tstr *s, tv sepv, int64_t maxsplit, bool right) {
    tlist *l = mr__tlist_new(&c->arena, 4);
    if (maxsplit < 0) maxsplit = INT64_MAX;
    if (!given(sepv) || sepv.kind == TV_NONE) {
        /* whitespace runs */
        if (!right) {
            size_t i = 0;
            int64_t splits = 0;
            for (;;) {
                while (i < s->len) {
                    size_t adv;
                    if (!mr__py_isspace(mr__utf8_decode(s->p + i, s->len - i, &adv))) break;
                    i += adv;
                }
                if (i >= s->len) break;
                if (splits >= maxsplit) {
                    /* the rest, trailing whitespace kept */
                    mr__tlist_push(&c->arena, l, str_from_buf(c, s->p + i, s->len - i));
                    break;
                }
                size_t j = i;
                while (j < s->len) {
                    size_t adv;
                    if (mr__py_isspace(mr__utf8_decode(s->p + j, s->len - j, &adv))) break;
                    j += adv;
                }
                mr__tlist_push(&c->arena, l, str_from_buf(c, s->p + i, j - i));
                splits++;
                i = j;
            }
        } else {
            size_t e = s->len;
            int64_t splits = 0;
            tlist *rev = mr__tlist_new(&c->arena, 4);
            for (;;) {
                while (e > 0) {
                    size_t j = e - 1;
                    while (j > 0 && ((unsigned char)s->p[j] & 0xC0) == 0x80) j--;
                    size_t adv;
                    if (!mr__py_isspace(mr__utf8_decode(s->p + j, e - j, &adv))) break;
                    e = j;
                }
                if (e == 0) break;
                if (splits >= maxsplit) {
                    mr__tlist_push(&c->arena, rev, str_from_buf(c, s->p, e));
                    break;
                }
                size_t b = e;
                while (b > 0) {
                    size_t j = b - 1;
                    while (j > 0 && ((unsigned char)s->p[j] & 0xC0) == 0x80) j--;
                    size_t adv;
                    if (mr__py_isspace(mr__utf8_decode(s->p + j, e - j, &adv))) break;
                    b = j;
                }
                mr__tlist_push(&c->arena, rev, str_from_buf(c, s->p + b, e - b));
                splits++;
                e = b;
            }
            for (size_t k = rev->n; k > 0; k--) mr__tlist_push(&c->arena, l, rev->v[k - 1]);
        }
        return mk_list(l);
    }
    tstr *sep = need_str(c, line, sepv, "the separator");
    if (sep->len == 0) mr__tpl_raise(c, line, "empty separator");
    if (!right) {
        size_t i = 0;
        int64_t splits = 0;
        for (;;) {
            const char *h = splits < maxsplit ? find_bytes(s->p + i, s->len - i, sep->p, sep->len) : NULL;
            if (!h) {
                mr__tlist_push(&c->arena, l, str_from_buf(c, s->p + i, s->len - i));
                break;
            }
            size_t at = (size_t)(h - s->p);
            mr__tlist_push(&c->arena, l, str_from_buf(c, s->p + i, at - i));
            i = at + sep->len;
            splits++;
        }
    } else {
        tlist *rev = mr__tlist_new(&c->arena, 4);
        size_t e = s->len;
        int64_t splits = 0;
        for (;;) {
            /* last occurrence of sep ending at or before e */
            size_t found = SIZE_MAX;
            if (splits < maxsplit && e >= sep->len)
                for (size_t k = e - sep->len + 1; k > 0; k--)
                    if (memcmp(s->p + k - 1, sep->p, sep->len) == 0) {
                        found = k - 1;
                        break;
                    }
            if (found == SIZE_MAX) {
                mr__tlist_push(&c->arena, rev, str_from_buf(c, s->p, e));
                break;
            }
            mr__tlist_push(&c->arena, rev, str_from_buf(c, s->p + found + sep->len, e - found - sep->len));
            e = found;
            splits++;
        }
        for (size_t k = rev->n; k > 0; k--) mr__tlist_push(&c->arena, l, rev->v[k - 1]);
    }
    mr__tpl_step(c, s->len / 64);
    return mk_list(l);
}

static tv py_splitlines(mr__tpl_ctx *c, tstr *s, bool keepends) {
    tlist *l = mr__tlist_new(&c->arena, 4);
    size_t i = 0, start = 0;
    while (i < s->len) {
        size_t adv;
        uint32_t cp = mr__utf8_decode(s->p + i, s->len - i, &adv);
        bool nl = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D || cp == 0x1E ||
                  cp == 0x85 || cp == 0x2028 || cp == 0x2029;
        if (nl) {
            size_t end = i + adv;
            if (cp == '\r' && end < s->len && s->p[end] == '\n') end++;
            mr__tlist_push(&c->arena, l, str_from_buf(c, s->p + start, (keepends ? end : i) - start));
            start = i = end;
        } else {
            i += adv;
        }
    }
    if (start < s->len) mr__tlist_push(&c->arena, l, str_from_buf(c, s->p + start, s->len - start));
    return mk_list(l);
}

static bool py_startswith(mr__tpl_ctx *c, int line, tstr *s, tv pre, bool ends) {
    if (pre.kind == TV_LIST && pre.u.l->tuple) {
        for (size_t i = 0; i < pre.u.l->n; i++)
            if (py_startswith(c, line, s, pre.u.l->v[i], ends)) return true;
        return false;
    }
    tstr *p = need_str(c, line, pre, ends ? "endswith's argument" : "startswith's argument");
    if (p->len > s->len) return false;
    return memcmp(ends ? s->p + s->len - p->len : s->p, p->p, p->len) == 0;
}

/* ---------------- number formatting (str.format and % share it) ---------------- */
typedef struct {
    char fill[5];
    char align; /* 0, '<', '>', '^', '=' */
    char sign;  /* 0, '+', '-', ' ' */
    bool alt, zero, comma;
    int width;  /* -1 none */
    int prec;   /* -1 none */
    char type;  /* 0 or letter */
} fspec;

static void pad_to(sb *b, const char *body, size_t blen, const fspec *f, char dflt_align) {
    size_t ncp = 0;
    for (size_t i = 0; i < blen; i++)
        if (((unsigned char)body[i] & 0xC0) != 0x80) ncp++;
    if (f->width < 0 || (size_t)f->width <= ncp) {
        sb_add(b, body, blen);
        return;
    }
    size_t pad = (size_t)f->width - ncp;
    char align = f->align ? f->align : dflt_align;
    const char *fill = f->fill[0] ? f->fill : " ";
    size_t left = align == '<' ? 0 : align == '^' ? pad / 2 : pad;
    if (align == '=') {
        /* padding after the sign */
        size_t sl = (blen && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) ? 1 : 0;
        sb_add(b, body, sl);
        for (size_t k = 0; k < pad; k++) sb_adds(b, fill);
        sb_add(b, body + sl, blen - sl);
        return;
    }
    for (size_t k = 0; k < left; k++) sb_adds(b, fill);
    sb_add(b, body, blen);
    for (size_t k = left; k < pad; k++) sb_adds(b, fill);
}

static void fmt_value(mr__tpl_ctx *c, int line, sb *b, tv v, const fspec *f) {
    char tmp[512];
    char type = f->type;
    if (v.kind == TV_STR || (type == 0 && v.kind != TV_INT && v.kind != TV_FLOAT && v.kind != TV_BOOL) ||
        type == 's') {
        if (type && type != 's') mr__tpl_raise(c, line, "Unknown format code '%c' for object of type 'str'", type);
        tstr *s = mr__tv_to_str(c, v);
        size_t n = s->len;
        if (f->prec >= 0) n = mr__utf8_offset(s->p, s->len, f->prec);
        pad_to(b, s->p, n, f, '<');
        return;
    }
    bool isf = v.kind == TV_FLOAT;
    if (type == 0 && v.kind == TV_BOOL && !f->width && f->prec < 0) {
        sb_adds(b, v.u.b ? "True" : "False");
        return;
    }
    char signc = f->sign == '+' ? '+' : f->sign == ' ' ? ' ' : 0;
    int prec = f->prec;
    if (type == 'd' || type == 'x' || type == 'X' || type == 'o' || type == 'b' || type == 'c' ||
        (type == 0 && !isf)) {
        if (isf) mr__tpl_raise(c, line, "Unknown format code '%c' for object of type 'float'", type ? type : 'd');
        int64_t x = v.kind == TV_INT ? v.u.i : v.u.b;
        if (type == 'c') {
            char u[4];
            size_t m = mr__utf8_encode((uint32_t)x, u);
            pad_to(b, u, m, f, '<');
            return;
        }
        uint64_t ax = x < 0 ? (uint64_t)(-(x + 1)) + 1 : (uint64_t)x;
        char digits[80];
        int nd = 0;
        int base = type == 'x' || type == 'X' ? 16 : type == 'o' ? 8 : type == 'b' ? 2 : 10;
        do {
            int d = (int)(ax % (uint64_t)base);
            digits[nd++] = (char)(d < 10 ? '0' + d : (type == 'X' ? 'A' : 'a') + d - 10);
            ax /= (uint64_t)base;
        } while (ax);
        int o = 0;
        if (x < 0) tmp[o++] = '-';
        else if (signc) tmp[o++] = signc;
        if (f->alt && base != 10) {
            tmp[o++] = '0';
            tmp[o++] = type == 'X' ? 'X' : type;
        }
        int body_start = o;
        for (int k = nd - 1; k >= 0; k--) {
            tmp[o++] = digits[k];
            if (f->comma && k && k % 3 == 0) tmp[o++] = ',';
        }
        (void)body_start;
        fspec g = *f;
        if (f->zero && !f->align) {
            g.fill[0] = '0';
            g.fill[1] = 0;
            g.align = '=';
        }
        pad_to(b, tmp, (size_t)o, &g, '>');
        return;
    }
    /* floats (ints are converted) */
    double d = isf ? v.u.f : (double)(v.kind == TV_INT ? v.u.i : v.u.b);
    char cfmt[32];
    if (type == 0) {
        if (prec < 0) {
            char r[40];
            mr__py_float_repr(d, r);
            snprintf(tmp, sizeof tmp, "%s%s", (signc && d >= 0) ? (signc == '+' ? "+" : " ") : "", r);
        } else {
            snprintf(cfmt, sizeof cfmt, "%%%s%s.%dg", signc == '+' ? "+" : "", signc == ' ' ? " " : "", prec ? prec : 1);
            snprintf(tmp, sizeof tmp, cfmt, d);
        }
    } else if (type == 'f' || type == 'F' || type == 'e' || type == 'E' || type == 'g' || type == 'G' || type == '%') {
        double dd = type == '%' ? d * 100 : d;
        char t2 = type == '%' ? 'f' : type;
        snprintf(cfmt, sizeof cfmt, "%%%s%s%s%s.%d%c", signc == '+' ? "+" : "", signc == ' ' ? " " : "",
                 f->alt ? "#" : "", f->comma ? "'" : "", prec < 0 ? 6 : prec, t2);
        snprintf(tmp, sizeof tmp, cfmt, dd);
        if (type == '%') strncat(tmp, "%", sizeof tmp - strlen(tmp) - 1);
    } else {
        mr__tpl_raise(c, line, "Unknown format code '%c' for object of type '%s'", type, mr__tv_type_name(v));
    }
    fspec g = *f;
    if (f->zero && !f->align) {
        g.fill[0] = '0';
        g.fill[1] = 0;
        g.align = '=';
    }
    pad_to(b, tmp, strlen(tmp), &g, '>');
}

static void parse_fspec(mr__tpl_ctx *c, int line, const char *p, size_t n, fspec *f) {
    memset(f, 0, sizeof *f);
    f->width = -1;
    f->prec = -1;
    size_t i = 0;
    /* [[fill]align] */
    if (n >= 2) {
        size_t adv;
        mr__utf8_decode(p, n, &adv);
        if (adv < n && strchr("<>^=", p[adv])) {
            memcpy(f->fill, p, adv);
            f->align = p[adv];
            i = adv + 1;
        }
    }
    if (!f->align && i < n && strchr("<>^=", p[i])) f->align = p[i++];
    if (i < n && strchr("+- ", p[i])) f->sign = p[i++];
    if (i < n && p[i] == '#') {
        f->alt = true;
        i++;
    }
    if (i < n && p[i] == '0') {
        f->zero = true;
        i++;
    }
    if (i < n && p[i] >= '0' && p[i] <= '9') {
        f->width = 0;
        while (i < n && p[i] >= '0' && p[i] <= '9') {
            f->width = f->width * 10 + (p[i++] - '0');
            if (f->width > 100000) mr__tpl_raise(c, line, "format width too large");
        }
    }
    if (i < n && p[i] == ',') {
        f->comma = true;
        i++;
    }
    if (i < n && p[i] == '.') {
        i++;
        f->prec = 0;
        if (i >= n || p[i] < '0' || p[i] > '9') mr__tpl_raise(c, line, "Format specifier missing precision");
        while (i < n && p[i] >= '0' && p[i] <= '9') {
            f->prec = f->prec * 10 + (p[i++] - '0');
            if (f->prec > 400) mr__tpl_raise(c, line, "format precision too large");
        }
    }
    if (i < n) f->type = p[i++];
    if (i < n) mr__tpl_raise(c, line, "Invalid format specifier '%.*s'", (int)n, p);
}

/* str.format(*args, **kwargs) */
static tv py_format(mr__tpl_ctx *c, int line, tstr *fmt, tv *args, size_t nargs, const char **kwn, tv *kwv,
                    size_t nkw) {
    sb b = {.c = c};
    size_t i = 0;
    int auto_idx = 0;
    bool used_auto = false, used_manual = false;
    while (i < fmt->len) {
        char ch = fmt->p[i];
        if (ch == '{' && i + 1 < fmt->len && fmt->p[i + 1] == '{') {
            sb_add(&b, "{", 1);
            i += 2;
            continue;
        }
        if (ch == '}') {
            if (i + 1 < fmt->len && fmt->p[i + 1] == '}') {
                sb_add(&b, "}", 1);
                i += 2;
                continue;
            }
            mr__tpl_raise(c, line, "Single '}' encountered in format string");
        }
        if (ch != '{') {
            size_t j = i;
            while (j < fmt->len && fmt->p[j] != '{' && fmt->p[j] != '}') j++;
            sb_add(&b, fmt->p + i, j - i);
            i = j;
            continue;
        }
        size_t j = i + 1;
        int depth = 1;
        while (j < fmt->len && depth) {
            if (fmt->p[j] == '{') depth++;
            else if (fmt->p[j] == '}') depth--;
            if (depth) j++;
        }
        if (j >= fmt->len) mr__tpl_raise(c, line, "Single '{' encountered in format string");
        const char *field = fmt->p + i + 1;
        size_t flen = j - i - 1;
        i = j + 1;
        /* field_name[!conv][:spec] */
        size_t k = 0;
        while (k < flen && field[k] != '!' && field[k] != ':' && field[k] != '.' && field[k] != '[') k++;
        tv val;
        if (k == 0) {
            if (used_manual) mr__tpl_raise(c, line, "cannot switch from manual field specification to automatic field numbering");
            used_auto = true;
            if ((size_t)auto_idx >= nargs) mr__tpl_raise(c, line, "Replacement index %d out of range for positional args tuple", auto_idx);
            val = args[auto_idx++];
        } else if (field[0] >= '0' && field[0] <= '9') {
            if (used_auto) mr__tpl_raise(c, line, "cannot switch from automatic field numbering to manual field specification");
            used_manual = true;
            long idx = strtol(field, NULL, 10);
            if (idx < 0 || (size_t)idx >= nargs) mr__tpl_raise(c, line, "Replacement index %ld out of range for positional args tuple", idx);
            val = args[idx];
        } else {
            size_t q;
            for (q = 0; q < nkw; q++)
                if (strlen(kwn[q]) == k && !memcmp(kwn[q], field, k)) break;
            if (q == nkw) mr__tpl_raise(c, line, "format: no argument named '%.*s'", (int)k, field);
            val = kwv[q];
        }
        /* .attr and [key] chains */
        while (k < flen && (field[k] == '.' || field[k] == '[')) {
            if (field[k] == '.') {
                size_t s = ++k;
                while (k < flen && field[k] != '.' && field[k] != '[' && field[k] != '!' && field[k] != ':') k++;
                val = mr__tv_getattr(c, line, val, mr__tstr_new(&c->arena, field + s, k - s)->p, k - s);
            } else {
                size_t s = ++k;
                while (k < flen && field[k] != ']') k++;
                if (k >= flen) mr__tpl_raise(c, line, "Missing ']' in format string");
                tv key;
                bool digits = k > s;
                for (size_t q = s; q < k; q++)
                    if (field[q] < '0' || field[q] > '9') digits = false;
                key = digits ? tv_int(strtoll(field + s, NULL, 10)) : str_from_buf(c, field + s, k - s);
                val = mr__tv_getitem(c, line, val, key);
                k++;
            }
        }
        if (k < flen && field[k] == '!') {
            if (k + 1 >= flen) mr__tpl_raise(c, line, "end of string while looking for conversion specifier");
            char conv = field[k + 1];
            if (conv == 'r' || conv == 'a') {
                mr__buf *ob = mr__tpl_push_buf(c);
                mr__tv_repr(c, ob, val, 0);
                tstr *r = mr__tstr_new(&c->arena, ob->p ? ob->p : "", ob->n);
                mr__tpl_pop_buf(c);
                val = tv_strv(r);
            } else if (conv == 's') {
                val = tv_strv(mr__tv_to_str(c, val));
            } else {
                mr__tpl_raise(c, line, "Unknown conversion specifier %c", conv);
            }
            k += 2;
        }
        fspec f;
        if (k < flen && field[k] == ':') parse_fspec(c, line, field + k + 1, flen - k - 1, &f);
        else if (k < flen) mr__tpl_raise(c, line, "expected ':' after conversion specifier");
        else parse_fspec(c, line, "", 0, &f);
        if (val.kind == TV_UNDEF && val.u.s) mr__tpl_raise(c, line, "%s", val.u.s->p);
        fmt_value(c, line, &b, val, &f);
    }
    return sb_done(&b);
}

/* printf-style `str % args` */
tv mr__tpl_percent_format(mr__tpl_ctx *c, int line, tstr *fmt, tv args) {
    sb b = {.c = c};
    tv *av;
    size_t an, ai = 0;
    tv single = args;
    if (args.kind == TV_LIST && args.u.l->tuple) {
        av = args.u.l->v;
        an = args.u.l->n;
    } else {
        av = &single;
        an = 1;
    }
    bool mapping = args.kind == TV_DICT;
    size_t i = 0;
    while (i < fmt->len) {
        char ch = fmt->p[i];
        if (ch != '%') {
            size_t j = i;
            while (j < fmt->len && fmt->p[j] != '%') j++;
            sb_add(&b, fmt->p + i, j - i);
            i = j;
            continue;
        }
        i++;
        if (i >= fmt->len) mr__tpl_raise(c, line, "incomplete format");
        tv val;
        bool have = false;
        if (fmt->p[i] == '(') {
            size_t s = ++i;
            while (i < fmt->len && fmt->p[i] != ')') i++;
            if (i >= fmt->len) mr__tpl_raise(c, line, "incomplete format key");
            if (!mapping) mr__tpl_raise(c, line, "format requires a mapping");
            tv *hit = mr__tdict_get_str(args.u.d, fmt->p + s, i - s);
            if (!hit) mr__tpl_raise(c, line, "format key '%.*s' not found", (int)(i - s), fmt->p + s);
            val = *hit;
            have = true;
            i++;
        }
        fspec f;
        memset(&f, 0, sizeof f);
        f.width = -1;
        f.prec = -1;
        while (i < fmt->len && strchr("-+ #0", fmt->p[i])) {
            char fl = fmt->p[i++];
            if (fl == '-') f.align = '<';
            else if (fl == '+') f.sign = '+';
            else if (fl == ' ' && f.sign != '+') f.sign = ' ';
            else if (fl == '#') f.alt = true;
            else if (fl == '0') f.zero = true;
        }
        if (f.align == '<') f.zero = false;
        if (i < fmt->len && fmt->p[i] == '*') mr__tpl_raise(c, line, "'*' widths are not supported");
        if (i < fmt->len && fmt->p[i] >= '0' && fmt->p[i] <= '9') {
            f.width = 0;
            while (i < fmt->len && fmt->p[i] >= '0' && fmt->p[i] <= '9') {
                f.width = f.width * 10 + (fmt->p[i++] - '0');
                if (f.width > 100000) mr__tpl_raise(c, line, "format width too large");
            }
        }
        if (i < fmt->len && fmt->p[i] == '.') {
            i++;
            f.prec = 0;
            while (i < fmt->len && fmt->p[i] >= '0' && fmt->p[i] <= '9') {
                f.prec = f.prec * 10 + (fmt->p[i++] - '0');
                if (f.prec > 400) mr__tpl_raise(c, line, "format precision too large");
            }
        }
        if (i >= fmt->len) mr__tpl_raise(c, line, "incomplete format");
        char type = fmt->p[i++];
        if (type == '%') {
            sb_add(&b, "%", 1);
            continue;
        }
        if (!have) {
            if (mapping) val = args;
            else {
                if (ai >= an) mr__tpl_raise(c, line, "not enough arguments for format string");
                val = av[ai++];
            }
        }
        if (type == 's' || type == 'r' || type == 'a') {
            tv sv;
            if (type == 's') sv = tv_strv(mr__tv_to_str(c, val));
            else {
                mr__buf *ob = mr__tpl_push_buf(c);
                mr__tv_repr(c, ob, val, 0);
                sv = str_from_buf(c, ob->p ? ob->p : "", ob->n);
                mr__tpl_pop_buf(c);
            }
            f.type = 's';
            fmt_value(c, line, &b, sv, &f);
            continue;
        }
        if (type == 'i' || type == 'u') type = 'd';
        if (strchr("dxXoeEfFgGc", type) == NULL) mr__tpl_raise(c, line, "unsupported format character '%c'", type);
        if (val.kind != TV_INT && val.kind != TV_FLOAT && val.kind != TV_BOOL)
            mr__tpl_raise(c, line, "%%%c format: a real number is required, not %s", type, mr__tv_type_name(val));
        if (strchr("dxXoc", type) && val.kind == TV_FLOAT) {
            if (type != 'd') mr__tpl_raise(c, line, "%%%c format: an integer is required, not float", type);
            val = tv_int((int64_t)val.u.f);
        }
        f.type = type;
        if (f.align == '<') {
            /* left-justify is the default for these when '-' is given */
        } else if (!f.align) {
            f.align = f.zero ? 0 : '>';
        }
        fmt_value(c, line, &b, val, &f);
    }
    if (!mapping && ai < an) mr__tpl_raise(c, line, "not all arguments converted during string formatting");
    return sb_done(&b);
}

/* ---------------- sorting helpers ---------------- */
typedef struct {
    mr__tpl_ctx *c;
    int line;
    bool reverse;
    tv *keys;
} sortctx;

static int key_cmp(sortctx *s, size_t a, size_t b) {
    int r = mr__tv_cmp(s->c, s->line, s->keys[a], s->keys[b]);
    return s->reverse ? -r : r;
}

/* stable merge sort of indices */
static void msort(sortctx *s, size_t *idx, size_t *tmp, size_t n) {
    if (n < 2) return;
    size_t h = n / 2;
    msort(s, idx, tmp, h);
    msort(s, idx + h, tmp, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = key_cmp(s, idx[j], idx[i]) < 0 ? idx[j++] : idx[i++];
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
    mr__tpl_step(s->c, n);
}

static tv lower_if_str(mr__tpl_ctx *c, tv v) { return v.kind == TV_STR ? str_map(c, v.u.s, 1) : v; }

/* make_attrgetter: "a.b.0" → getitem chain (digit parts as ints) */
static tv attr_get(mr__tpl_ctx *c, int line, tv item, tv attr) {
    if (attr.kind != TV_STR) return mr__tv_getitem(c, line, item, attr);
    tstr *a = attr.u.s;
    size_t i = 0;
    for (;;) {
        size_t j = i;
        while (j < a->len && a->p[j] != '.') j++;
        bool digits = j > i;
        for (size_t k = i; k < j; k++)
            if (a->p[k] < '0' || a->p[k] > '9') digits = false;
        tv key = digits ? tv_int(strtoll(a->p + i, NULL, 10)) : str_from_buf(c, a->p + i, j - i);
        item = mr__tv_getitem(c, line, item, key);
        if (j >= a->len) break;
        i = j + 1;
    }
    return item;
}

static tlist *sorted_list(mr__tpl_ctx *c, int line, tlist *in, tv *keys, bool reverse) {
    size_t n = in->n;
    size_t *idx = TPL_ALLOC(c, (n + 1) * sizeof(size_t)), *tmp = TPL_ALLOC(c, (n + 1) * sizeof(size_t));
    for (size_t i = 0; i < n; i++) idx[i] = i;
    sortctx s = {c, line, reverse, keys};
    msort(&s, idx, tmp, n);
    tlist *out = mr__tlist_new(&c->arena, n);
    for (size_t i = 0; i < n; i++) out->v[out->n++] = in->v[idx[i]];
    return out;
}

/* ---------------- tests ---------------- */
static bool run_test(mr__tpl_ctx *c, int line, int id, tv v, ARGS);

bool mr__tpl_test_call(mr__tpl_ctx *c, int line, int id, tv v, ARGS) { return run_test(c, line, id, v, PASS); }

static tv arg1(mr__tpl_ctx *c, int line, const char *fn, ARGS) {
    static const char *const n[] = {"other"};
    tv o[1];
    bind(c, line, fn, n, 1, PASS, o);
    if (!given(o[0])) mr__tpl_raise(c, line, "the test '%s' needs an argument", fn);
    return o[0];
}

static bool run_test(mr__tpl_ctx *c, int line, int id, tv v, ARGS) {
    switch (id) {
    case T_odd:
    case T_even: {
        if (v.kind == TV_UNDEF) mr__tpl_raise(c, line, "%s", v.u.s ? v.u.s->p : "undefined");
        tv r = mr__tpl_filter_call(c, line, F_abs, v, NULL, 0, NULL, NULL, 0);
        (void)r;
        if (v.kind == TV_FLOAT) {
            double m = fmod(fabs(v.u.f), 2.0);
            return id == T_odd ? m == 1.0 : m == 0.0;
        }
        int64_t x = need_int(c, line, v, "the value");
        int64_t m = ((x % 2) + 2) % 2;
        return id == T_odd ? m == 1 : m == 0;
    }
    case T_divisibleby: {
        tv o = arg1(c, line, "divisibleby", PASS);
        if (v.kind == TV_FLOAT || o.kind == TV_FLOAT) {
            double y = o.kind == TV_FLOAT ? o.u.f : (double)need_int(c, line, o, "divisibleby's argument");
            double x = v.kind == TV_FLOAT ? v.u.f : (double)need_int(c, line, v, "the value");
            if (y == 0) mr__tpl_raise(c, line, "float modulo");
            return fmod(x, y) == 0;
        }
        int64_t x = need_int(c, line, v, "the value"), y = need_int(c, line, o, "divisibleby's argument");
        if (y == 0) mr__tpl_raise(c, line, "integer division or modulo by zero");
        return y == -1 || x % y == 0;
    }
    case T_defined:
        return v.kind != TV_UNDEF;
    case T_undefined:
        return v.kind == TV_UNDEF;
    case T_filter: {
        bool u;
        return v.kind == TV_STR && mr__tpl_filter_id(v.u.s->p, &u) >= 0;
    }
    case T_test: {
        bool u;
        return v.kind == TV_STR && mr__tpl_test_id(v.u.s->p, &u) >= 0;
    }
    case T_none:
        return v.kind == TV_NONE;
    case T_boolean:
        return v.kind == TV_BOOL;
    case T_false:
        return v.kind == TV_BOOL && !v.u.b;
    case T_true:
        return v.kind == TV_BOOL && v.u.b;
    case T_integer:
        return v.kind == TV_INT;
    case T_float:
        return v.kind == TV_FLOAT;
    case T_lower:
    case T_upper: {
        tstr *s = mr__tv_to_str(c, v);
        bool cased = false;
        for (size_t i = 0; i < s->len; i++) {
            char ch = s->p[i];
            if (ch >= 'a' && ch <= 'z') {
                if (id == T_upper) return false;
                cased = true;
            } else if (ch >= 'A' && ch <= 'Z') {
                if (id == T_lower) return false;
                cased = true;
            }
        }
        return cased;
    }
    case T_string:
        return v.kind == TV_STR;
    case T_mapping:
        return v.kind == TV_DICT;
    case T_number:
        return v.kind == TV_INT || v.kind == TV_FLOAT || v.kind == TV_BOOL;
    case T_sequence:
        return v.kind == TV_STR || v.kind == TV_LIST || v.kind == TV_DICT || v.kind == TV_UNDEF;
    case T_iterable:
        return v.kind == TV_STR || v.kind == TV_LIST || v.kind == TV_DICT || v.kind == TV_UNDEF || v.kind == TV_LOOP;
    case T_callable:
        return v.kind == TV_FUNC || v.kind == TV_MACRO || v.kind == TV_METHOD || v.kind == TV_JOINER;
    case T_sameas: {
        tv o = arg1(c, line, "sameas", PASS);
        if (v.kind != o.kind) return false;
        switch (v.kind) {
        case TV_NONE:
        case TV_UNDEF:
            return v.kind == TV_NONE || v.u.s == o.u.s;
        case TV_BOOL:
            return v.u.b == o.u.b;
        case TV_INT:
            return v.u.i == o.u.i && v.u.i >= -5 && v.u.i <= 256; /* CPython's small-int cache */
        case TV_STR:
            return v.u.s == o.u.s;
        case TV_LIST:
            return v.u.l == o.u.l;
        case TV_DICT:
        case TV_NS:
            return v.u.d == o.u.d;
        default:
            return mr__tv_eq(c, v, o);
        }
    }
    case T_escaped:
        return v.kind == TV_STR && v.safe;
    case T_in: {
        tv o = arg1(c, line, "in", PASS);
        if (o.kind == TV_STR) {
            tstr *needle = need_str(c, line, v, "the left operand of 'in <string>'");
            return needle->len == 0 || memmem(o.u.s->p, o.u.s->len, needle->p, needle->len) != NULL;
        }
        if (o.kind == TV_DICT) return mr__tdict_get(o.u.d, v) != NULL;
        if (o.kind == TV_LIST) {
            for (size_t i = 0; i < o.u.l->n; i++)
                if (mr__tv_eq(c, v, o.u.l->v[i])) return true;
            return false;
        }
        if (o.kind == TV_UNDEF) return false;
        mr__tpl_raise(c, line, "argument of type '%s' is not iterable", mr__tv_type_name(o));
    }
    case T_eq:
    case T_eq2:
    case T_eq3:
        return mr__tv_eq(c, v, arg1(c, line, "eq", PASS));
    case T_ne:
    case T_ne2:
        return !mr__tv_eq(c, v, arg1(c, line, "ne", PASS));
    case T_gt:
    case T_gt2:
    case T_gt3:
        return mr__tv_cmp(c, line, v, arg1(c, line, "gt", PASS)) > 0;
    case T_ge:
    case T_ge2:
        return mr__tv_cmp(c, line, v, arg1(c, line, "ge", PASS)) >= 0;
    case T_lt:
    case T_lt2:
    case T_lt3:
        return mr__tv_cmp(c, line, v, arg1(c, line, "lt", PASS)) < 0;
    case T_le:
    case T_le2:
        return mr__tv_cmp(c, line, v, arg1(c, line, "le", PASS)) <= 0;
    }
    mr__tpl_raise(c, line, "internal error: test %d", id);
}

/* a test named at run time (select('equalto', 3)) */
static bool test_by_name(mr__tpl_ctx *c, int line, tv name, tv v, ARGS) {
    tstr *n = need_str(c, line, name, "the test name");
    bool u;
    int id = mr__tpl_test_id(n->p, &u);
    if (id < 0) mr__tpl_raise(c, line, "No test named '%s'.", n->p);
    return run_test(c, line, id, v, PASS);
}

/* ---------------- filters ---------------- */
static tv filter_by_name(mr__tpl_ctx *c, int line, tv name, tv v, ARGS) {
    tstr *n = need_str(c, line, name, "the filter name");
    bool u;
    int id = mr__tpl_filter_id(n->p, &u);
    if (id < 0) mr__tpl_raise(c, line, u ? "the filter '%s' is not supported by moerun" : "No filter named '%s'.", n->p);
    return mr__tpl_filter_call(c, line, id, v, PASS);
}

static tv int_of(mr__tpl_ctx *c, int line, tv v, tv dflt, int64_t base) {
    (void)line;
    (void)c;
    switch (v.kind) {
    case TV_INT:
        return v;
    case TV_BOOL:
        return tv_int(v.u.b);
    case TV_FLOAT:
        if (isfinite(v.u.f) && fabs(v.u.f) < 9.2e18) return tv_int((int64_t)v.u.f);
        return dflt;
    case TV_STR: {
        tstr *s = v.u.s;
        /* int(s, base): whitespace, sign, digits (with '_'), optional 0x/0o/0b when base 16/8/2 */
        size_t i = 0, n = s->len;
        while (i < n && mr__py_isspace((unsigned char)s->p[i])) i++;
        while (n > i && mr__py_isspace((unsigned char)s->p[n - 1])) n--;
        bool neg = false;
        if (i < n && (s->p[i] == '+' || s->p[i] == '-')) neg = s->p[i++] == '-';
        if (base == 16 && i + 1 < n && s->p[i] == '0' && (s->p[i + 1] | 0x20) == 'x') i += 2;
        else if (base == 8 && i + 1 < n && s->p[i] == '0' && (s->p[i + 1] | 0x20) == 'o') i += 2;
        else if (base == 2 && i + 1 < n && s->p[i] == '0' && (s->p[i + 1] | 0x20) == 'b') i += 2;
        uint64_t acc = 0;
        bool any = false, ok = i < n;
        for (size_t k = i; k < n && ok; k++) {
            char ch = s->p[k];
            if (ch == '_' && any && k + 1 < n && s->p[k + 1] != '_') continue;
            int d = (ch >= '0' && ch <= '9') ? ch - '0' : ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'z') ? (ch | 0x20) - 'a' + 10 : 99;
            if (d >= base) {
                ok = false;
                break;
            }
            if (acc > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) {
                ok = false;
                break;
            }
            acc = acc * (uint64_t)base + (uint64_t)d;
            any = true;
        }
        if (ok && any && acc <= (uint64_t)INT64_MAX) return tv_int(neg ? -(int64_t)acc : (int64_t)acc);
        /* the quirk: "42.23"|int is 42 */
        bool fok;
        double f = mr__py_float_parse_ok(s->p, s->len, &fok);
        if (fok && isfinite(f) && fabs(f) < 9.2e18) return tv_int((int64_t)f);
        return dflt;
    }
    default:
        return dflt;
    }
}

static tv float_of(tv v, tv dflt) {
    switch (v.kind) {
    case TV_INT:
        return tv_float((double)v.u.i);
    case TV_BOOL:
        return tv_float(v.u.b);
    case TV_FLOAT:
        return v;
    case TV_STR: {
        bool ok;
        double f = mr__py_float_parse_ok(v.u.s->p, v.u.s->len, &ok);
        return ok ? tv_float(f) : dflt;
    }
    default:
        return dflt;
    }
}

static tv html_escape(mr__tpl_ctx *c, tv v, bool force) {
    if (v.kind == TV_STR && v.safe && !force) return v;
    tstr *s = mr__tv_to_str(c, v);
    sb b = {.c = c};
    size_t run = 0, i;
    for (i = 0; i < s->len; i++) {
        const char *e = NULL;
        switch (s->p[i]) {
        case '&': e = "&amp;"; break;
        case '<': e = "&lt;"; break;
        case '>': e = "&gt;"; break;
        case '"': e = "&#34;"; break;
        case '\'': e = "&#39;"; break;
        default: break;
        }
        if (e) {
            sb_add(&b, s->p + i - run, run);
            run = 0;
            sb_adds(&b, e);
        } else {
            run++;
        }
    }
    sb_add(&b, s->p + i - run, run);
    tv r = sb_done(&b);
    r.safe = 1;
    return r;
}

static tlist *to_list(mr__tpl_ctx *c, int line, tv v) { return mr__tv_iter(c, line, v); }

/* select/reject/selectattr/rejectattr */
static tv select_impl(mr__tpl_ctx *c, int line, tv v, ARGS, bool want, bool attr) {
    tlist *out = mr__tlist_new(&c->arena, 4);
    if (!mr__tv_truthy(&v)) return mk_list(out);
    size_t off = 0;
    tv attrname = tv_missing();
    if (attr) {
        if (nargs < 1) mr__tpl_raise(c, line, "Missing parameter for attribute name");
        attrname = args[0];
        off = 1;
    }
    tlist *items = to_list(c, line, v);
    for (size_t i = 0; i < items->n; i++) {
        tv x = attr ? attr_get(c, line, items->v[i], attrname) : items->v[i];
        bool r;
        if (nargs > off) r = test_by_name(c, line, args[off], x, args + off + 1, nargs - off - 1, kwn, kwv, nkw);
        else r = mr__tv_truthy(&x);
        if (r == want) mr__tlist_push(&c->arena, out, items->v[i]);
    }
    return mk_list(out);
}

static tv min_max(mr__tpl_ctx *c, int line, tv v, ARGS, bool max) {
    static const char *const n[] = {"case_sensitive", "attribute"};
    tv o[2];
    bind(c, line, max ? "max" : "min", n, 2, PASS, o);
    tlist *items = to_list(c, line, v);
    if (items->n == 0) {
        tv u = tv_undef();
        u.u.s = mr__tstr_cstr(&c->arena, "No aggregated item, sequence was empty.");
        return u;
    }
    bool cs = arg_bool(o[0], false);
    size_t best = 0;
    tv bestk = tv_undef();
    for (size_t i = 0; i < items->n; i++) {
        tv k = given(o[1]) && o[1].kind != TV_NONE ? attr_get(c, line, items->v[i], o[1]) : items->v[i];
        if (!cs) k = lower_if_str(c, k);
        if (i == 0) {
            bestk = k;
            continue;
        }
        int r = mr__tv_cmp(c, line, k, bestk);
        if (max ? r > 0 : r < 0) {
            best = i;
            bestk = k;
        }
    }
    return items->v[best];
}

tv mr__tpl_filter_call(mr__tpl_ctx *c, int line, int id, tv v, ARGS) {
    tv o[6];
    mr__tpl_step(c, 1);
    switch (id) {
    case F_abs:
        bind(c, line, "abs", NULL, 0, PASS, o);
        if (v.kind == TV_INT) {
            if (v.u.i == INT64_MIN) mr__tpl_raise(c, line, "integer overflow");
            return tv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        }
        if (v.kind == TV_BOOL) return tv_int(v.u.b);
        if (v.kind == TV_FLOAT) return tv_float(fabs(v.u.f));
        if (v.kind == TV_UNDEF) mr__tpl_raise(c, line, "%s", v.u.s ? v.u.s->p : "undefined");
        mr__tpl_raise(c, line, "bad operand type for abs(): '%s'", mr__tv_type_name(v));
    case F_attr: {
        static const char *const n[] = {"name"};
        bind(c, line, "attr", n, 1, PASS, o);
        tstr *name = need_str(c, line, o[0], "attr's name");
        if (v.kind == TV_UNDEF) mr__tpl_raise(c, line, "%s", v.u.s ? v.u.s->p : "undefined");
        /* an attribute only, not an item */
        if (v.kind == TV_NS || v.kind == TV_LOOP) return mr__tv_getattr(c, line, v, name->p, name->len);
        tv m = mr__tpl_method_lookup(c, v, name->p, name->len);
        if (m.kind != TV_MISSING) return m;
        tv u = tv_undef();
        u.u.s = mr__tstr_cstr(&c->arena, "no such attribute");
        return u;
    }
    case F_batch: {
        static const char *const n[] = {"linecount", "fill_with"};
        bind(c, line, "batch", n, 2, PASS, o);
        int64_t lc = need_int(c, line, o[0], "batch's linecount");
        if (lc <= 0) mr__tpl_raise(c, line, "batch: linecount must be positive");
        tlist *items = to_list(c, line, v), *out = mr__tlist_new(&c->arena, 4);
        tlist *cur = NULL;
        for (size_t i = 0; i < items->n; i++) {
            if (!cur || (int64_t)cur->n == lc) {
                cur = mr__tlist_new(&c->arena, (size_t)(lc < 64 ? lc : 64));
                mr__tlist_push(&c->arena, out, mk_list(cur));
            }
            mr__tlist_push(&c->arena, cur, items->v[i]);
        }
        if (cur && given(o[1]) && o[1].kind != TV_NONE)
            while ((int64_t)cur->n < lc) mr__tlist_push(&c->arena, cur, o[1]);
        return mk_list(out);
    }
    case F_capitalize:
        bind(c, line, "capitalize", NULL, 0, PASS, o);
        return py_capitalize(c, mr__tv_to_str(c, v));
    case F_center: {
        static const char *const n[] = {"width"};
        bind(c, line, "center", n, 1, PASS, o);
        int64_t w = given(o[0]) ? need_int(c, line, o[0], "center's width") : 80;
        tstr *s = mr__tv_to_str(c, v);
        int64_t len = mr__tstr_ncp(s);
        if (w <= len) return tv_strv(s);
        if (w > 1000000) mr__tpl_raise(c, line, "center: width too large");
        int64_t marg = w - len, left = marg / 2 + (marg & w & 1);
        sb b = {.c = c};
        for (int64_t k = 0; k < left; k++) sb_add(&b, " ", 1);
        sb_add(&b, s->p, s->len);
        for (int64_t k = left; k < marg; k++) sb_add(&b, " ", 1);
        return sb_done(&b);
    }
    case F_count:
    case F_length:
        bind(c, line, "length", NULL, 0, PASS, o);
        return tv_int(mr__tv_len(c, line, v));
    case F_d:
    case F_default: {
        static const char *const n[] = {"default_value", "boolean"};
        bind(c, line, "default", n, 2, PASS, o);
        tv dflt = given(o[0]) ? o[0] : mr__tv_str(&c->arena, "", 0);
        if (v.kind == TV_UNDEF || (arg_bool(o[1], false) && !mr__tv_truthy(&v))) return dflt;
        return v;
    }
    case F_dictsort: {
        static const char *const n[] = {"case_sensitive", "by", "reverse"};
        bind(c, line, "dictsort", n, 3, PASS, o);
        if (v.kind == TV_UNDEF) mr__tpl_raise(c, line, "%s", v.u.s ? v.u.s->p : "undefined");
        if (v.kind != TV_DICT) mr__tpl_raise(c, line, "dictsort: '%s' object has no attribute 'items'", mr__tv_type_name(v));
        int pos = 0;
        if (given(o[1])) {
            tstr *by = need_str(c, line, o[1], "dictsort's by");
            if (!strcmp(by->p, "value")) pos = 1;
            else if (strcmp(by->p, "key")) mr__tpl_raise(c, line, "You can only sort by either \"key\" or \"value\"");
        }
        tdict *d = v.u.d;
        tlist *pairs = mr__tlist_new(&c->arena, d->n);
        tv *keys = TPL_ALLOC(c, (d->n + 1) * sizeof(tv));
        for (size_t i = 0; i < d->n; i++) {
            pairs->v[pairs->n++] = mk_tuple2(c, d->k[i], d->v[i]);
            tv k = pos ? d->v[i] : d->k[i];
            keys[i] = arg_bool(o[0], false) ? k : lower_if_str(c, k);
        }
        return mk_list(sorted_list(c, line, pairs, keys, arg_bool(o[2], false)));
    }
    case F_e:
    case F_escape:
        bind(c, line, "escape", NULL, 0, PASS, o);
        return html_escape(c, v, false);
    case F_forceescape:
        bind(c, line, "forceescape", NULL, 0, PASS, o);
        return html_escape(c, v, true);
    case F_first: {
        bind(c, line, "first", NULL, 0, PASS, o);
        tlist *items = to_list(c, line, v);
        if (items->n) return items->v[0];
        tv u = tv_undef();
        u.u.s = mr__tstr_cstr(&c->arena, "No first item, sequence was empty.");
        return u;
    }
    case F_last: {
        bind(c, line, "last", NULL, 0, PASS, o);
        if (v.kind != TV_LIST && v.kind != TV_STR && v.kind != TV_DICT && v.kind != TV_UNDEF)
            mr__tpl_raise(c, line, "'%s' object is not reversible", mr__tv_type_name(v));
        tlist *items = to_list(c, line, v);
        if (items->n) return items->v[items->n - 1];
        tv u = tv_undef();
        u.u.s = mr__tstr_cstr(&c->arena, "No last item, sequence was empty.");
        return u;
    }
    case F_float: {
        static const char *const n[] = {"default"};
        bind(c, line, "float", n, 1, PASS, o);
        return float_of(v, given(o[0]) ? o[0] : tv_float(0.0));
    }
    case F_int: {
        static const char *const n[] = {"default", "base"};
        bind(c, line, "int", n, 2, PASS, o);
        int64_t base = given(o[1]) ? need_int(c, line, o[1], "int's base") : 10;
        if (base < 2 || base > 36) mr__tpl_raise(c, line, "int() base must be >= 2 and <= 36");
        return int_of(c, line, v, given(o[0]) ? o[0] : tv_int(0), base);
    }
    case F_format: {
        tstr *fmt = mr__tv_to_str(c, v);
        if (nargs && nkw) mr__tpl_raise(c, line, "can't handle positional and keyword arguments at the same time");
        if (nkw) {
            tdict *d = mr__tdict_new(&c->arena, nkw);
            for (size_t i = 0; i < nkw; i++) mr__tdict_set(&c->arena, d, mr__tv_cstr(&c->arena, kwn[i]), kwv[i]);
            tv dv = {0};
            dv.kind = TV_DICT;
            dv.u.d = d;
            return mr__tpl_percent_format(c, line, fmt, dv);
        }
        tlist *t = mr__tlist_new(&c->arena, nargs);
        for (size_t i = 0; i < nargs; i++) t->v[t->n++] = args[i];
        t->tuple = true;
        return mr__tpl_percent_format(c, line, fmt, mk_list(t));
    }
    case F_indent: {
        static const char *const n[] = {"width", "first", "blank"};
        bind(c, line, "indent", n, 3, PASS, o);
        sb ind = {.c = c};
        if (given(o[0]) && o[0].kind == TV_STR) sb_add(&ind, o[0].u.s->p, o[0].u.s->len);
        else {
            int64_t w = given(o[0]) ? need_int(c, line, o[0], "indent's width") : 4;
            if (w > 10000) mr__tpl_raise(c, line, "indent: width too large");
            for (int64_t k = 0; k < w; k++) sb_add(&ind, " ", 1);
        }
        if (!ind.p) sb_add(&ind, "", 0);
        tstr *s = mr__tv_to_str(c, v);
        /* s += "\n"; then splitlines */
        tstr *s2 = mr__tstr_cat(&c->arena, s, mr__tstr_cstr(&c->arena, "\n"));
        tv lines = py_splitlines(c, s2, false);
        tlist *L = lines.u.l;
        sb b = {.c = c};
        bool blank = arg_bool(o[2], false);
        if (arg_bool(o[1], false)) sb_add(&b, ind.p, ind.n);
        for (size_t i = 0; i < L->n; i++) {
            tstr *ln = L->v[i].u.s;
            if (i) {
                sb_add(&b, "\n", 1);
                if (blank || ln->len) sb_add(&b, ind.p, ind.n);
            }
            sb_add(&b, ln->p, ln->len);
        }
        return sb_done(&b);
    }
    case F_items: {
        bind(c, line, "items", NULL, 0, PASS, o);
        tlist *out = mr__tlist_new(&c->arena, 0);
        if (v.kind == TV_UNDEF) return mk_list(out);
        if (v.kind != TV_DICT) mr__tpl_raise(c, line, "Can only get item pairs from a mapping.");
        for (size_t i = 0; i < v.u.d->n; i++) mr__tlist_push(&c->arena, out, mk_tuple2(c, v.u.d->k[i], v.u.d->v[i]));
        return mk_list(out);
    }
    case F_join: {
        static const char *const n[] = {"d", "attribute"};
        bind(c, line, "join", n, 2, PASS, o);
        tstr *sep = given(o[0]) ? mr__tv_to_str(c, o[0]) : mr__tstr_new(&c->arena, "", 0);
        tlist *items = to_list(c, line, v);
        sb b = {.c = c};
        sb_add(&b, "", 0);
        for (size_t i = 0; i < items->n; i++) {
            if (i) sb_add(&b, sep->p, sep->len);
            tv x = given(o[1]) && o[1].kind != TV_NONE ? attr_get(c, line, items->v[i], o[1]) : items->v[i];
            sb_addtv(&b, x);
        }
        mr__tpl_step(c, items->n);
        return sb_done(&b);
    }
    case F_list: {
        bind(c, line, "list", NULL, 0, PASS, o);
        tlist *items = to_list(c, line, v);
        tlist *out = mr__tlist_new(&c->arena, items->n);
        for (size_t i = 0; i < items->n; i++) out->v[out->n++] = items->v[i];
        return mk_list(out);
    }
    case F_lower:
        bind(c, line, "lower", NULL, 0, PASS, o);
        return str_map(c, mr__tv_to_str(c, v), 1);
    case F_upper:
        bind(c, line, "upper", NULL, 0, PASS, o);
        return str_map(c, mr__tv_to_str(c, v), 0);
    case F_map: {
        tlist *out = mr__tlist_new(&c->arena, 4);
        if (!mr__tv_truthy(&v)) return mk_list(out);
        tlist *items = to_list(c, line, v);
        if (nargs == 0) {
            tv attr = tv_missing(), dflt = tv_missing();
            for (size_t k = 0; k < nkw; k++) {
                if (!strcmp(kwn[k], "attribute")) attr = kwv[k];
                else if (!strcmp(kwn[k], "default")) dflt = kwv[k];
                else mr__tpl_raise(c, line, "Unexpected keyword argument '%s'", kwn[k]);
            }
            if (!given(attr)) mr__tpl_raise(c, line, "map requires a filter argument");
            for (size_t i = 0; i < items->n; i++) {
                tv x = attr_get(c, line, items->v[i], attr);
                if (x.kind == TV_UNDEF && given(dflt) && dflt.kind != TV_NONE) x = dflt;
                mr__tlist_push(&c->arena, out, x);
            }
            return mk_list(out);
        }
        for (size_t i = 0; i < items->n; i++)
            mr__tlist_push(&c->arena, out, filter_by_name(c, line, args[0], items->v[i], args + 1, nargs - 1, kwn, kwv, nkw));
        return mk_list(out);
    }
    case F_max:
        return min_max(c, line, v, PASS, true);
    case F_min:
        return min_max(c, line, v, PASS, false);
    case F_reject:
        return select_impl(c, line, v, PASS, false, false);
    case F_rejectattr:
        return select_impl(c, line, v, PASS, false, true);
    case F_select:
        return select_impl(c, line, v, PASS, true, false);
    case F_selectattr:
        return select_impl(c, line, v, PASS, true, true);
    case F_replace: {
        static const char *const n[] = {"old", "new", "count"};
        bind(c, line, "replace", n, 3, PASS, o);
        if (!given(o[0]) || !given(o[1])) mr__tpl_raise(c, line, "replace() needs old and new");
        int64_t cnt = given(o[2]) && o[2].kind != TV_NONE ? need_int(c, line, o[2], "replace's count") : -1;
        return py_replace(c, mr__tv_to_str(c, v), mr__tv_to_str(c, o[0]), mr__tv_to_str(c, o[1]), cnt);
    }
    case F_reverse: {
        bind(c, line, "reverse", NULL, 0, PASS, o);
        if (v.kind == TV_STR) {
            tlist *chars = to_list(c, line, v);
            sb b = {.c = c};
            sb_add(&b, "", 0);
            for (size_t i = chars->n; i > 0; i--) sb_add(&b, chars->v[i - 1].u.s->p, chars->v[i - 1].u.s->len);
            return sb_done(&b);
        }
        tlist *items = to_list(c, line, v);
        tlist *out = mr__tlist_new(&c->arena, items->n);
        for (size_t i = items->n; i > 0; i--) out->v[out->n++] = items->v[i - 1];
        return mk_list(out);
    }
    case F_round: {
        static const char *const n[] = {"precision", "method"};
        bind(c, line, "round", n, 2, PASS, o);
        int64_t prec = given(o[0]) ? need_int(c, line, o[0], "round's precision") : 0;
        const char *method = given(o[1]) ? need_str(c, line, o[1], "round's method")->p : "common";
        if (v.kind != TV_INT && v.kind != TV_FLOAT && v.kind != TV_BOOL)
            mr__tpl_raise(c, line, "round: type %s doesn't define __round__ method", mr__tv_type_name(v));
        double x = v.kind == TV_FLOAT ? v.u.f : (double)(v.kind == TV_INT ? v.u.i : v.u.b);
        double scale = pow(10.0, (double)prec);
        if (!strcmp(method, "common")) {
            if (v.kind != TV_FLOAT) {
                /* round(int, n) stays an int */
                if (prec >= 0) return v.kind == TV_BOOL ? tv_int(v.u.b) : v;
                double r = nearbyint(x * scale) / scale;
                return tv_int((int64_t)r);
            }
            /* Python rounds the exact binary value half-to-even; going
             * through the shortest decimal of x*10^prec is close enough */
            char buf[64];
            if (prec >= 0 && prec < 20) {
                snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
                return tv_float(strtod(buf, NULL));
            }
            return tv_float(nearbyint(x * scale) / scale);
        }
        if (!strcmp(method, "ceil")) return tv_float(ceil(x * scale) / scale);
        if (!strcmp(method, "floor")) return tv_float(floor(x * scale) / scale);
        mr__tpl_raise(c, line, "method must be common, ceil or floor");
    }
    case F_safe: {
        bind(c, line, "safe", NULL, 0, PASS, o);
        tv r = tv_strv(mr__tv_to_str(c, v));
        r.safe = 1;
        return r;
    }
    case F_sort: {
        static const char *const n[] = {"reverse", "case_sensitive", "attribute"};
        bind(c, line, "sort", n, 3, PASS, o);
        tlist *items = to_list(c, line, v);
        tv *keys = TPL_ALLOC(c, (items->n + 1) * sizeof(tv));
        bool cs = arg_bool(o[1], false);
        bool has_attr = given(o[2]) && o[2].kind != TV_NONE;
        /* "a,b" sorts by several attributes: the key is a list */
        tlist *attrs = NULL;
        if (has_attr && o[2].kind == TV_STR && memchr(o[2].u.s->p, ',', o[2].u.s->len))
            attrs = py_split(c, line, o[2].u.s, mr__tv_cstr(&c->arena, ","), -1, false).u.l;
        for (size_t i = 0; i < items->n; i++) {
            if (attrs) {
                tlist *kl = mr__tlist_new(&c->arena, attrs->n);
                for (size_t a = 0; a < attrs->n; a++) {
                    tv k = attr_get(c, line, items->v[i], attrs->v[a]);
                    kl->v[kl->n++] = cs ? k : lower_if_str(c, k);
                }
                keys[i] = mk_list(kl);
            } else {
                tv k = has_attr ? attr_get(c, line, items->v[i], o[2]) : items->v[i];
                keys[i] = cs ? k : lower_if_str(c, k);
            }
        }
        return mk_list(sorted_list(c, line, items, keys, arg_bool(o[0], false)));
    }
    case F_string: {
        bind(c, line, "string", NULL, 0, PASS, o);
        tv r = tv_strv(mr__tv_to_str(c, v));
        r.safe = v.safe;
        return r;
    }
    case F_sum: {
        static const char *const n[] = {"attribute", "start"};
        bind(c, line, "sum", n, 2, PASS, o);
        tlist *items = to_list(c, line, v);
        tv acc = given(o[1]) ? o[1] : tv_int(0);
        for (size_t i = 0; i < items->n; i++) {
            tv x = given(o[0]) && o[0].kind != TV_NONE ? attr_get(c, line, items->v[i], o[0]) : items->v[i];
            if (x.kind == TV_STR && acc.kind == TV_INT)
                mr__tpl_raise(c, line, "unsupported operand type(s) for +: 'int' and 'str'");
            acc = mr__tpl_binop_add(c, line, acc, x);
        }
        return acc;
    }
    case F_title:
        bind(c, line, "title", NULL, 0, PASS, o);
        return jinja_title(c, mr__tv_to_str(c, v));
    case F_tojson: {
        /* transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
        static const char *const n[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
        bind(c, line, "tojson", n, 4, PASS, o);
        bool ascii = arg_bool(o[0], false);
        const char *indent = NULL;
        if (given(o[1]) && o[1].kind != TV_NONE) {
            if (o[1].kind == TV_STR) indent = o[1].u.s->p;
            else {
                int64_t w = need_int(c, line, o[1], "tojson's indent");
                if (w > 1000) mr__tpl_raise(c, line, "tojson: indent too large");
                char *sp = TPL_ALLOC(c, (size_t)(w > 0 ? w : 0) + 1);
                for (int64_t k = 0; k < w; k++) sp[k] = ' ';
                indent = sp;
            }
        }
        const char *isep = indent ? "," : ", ", *ksep = ": ";
        if (given(o[2]) && o[2].kind != TV_NONE) {
            tv sp = o[2];
            if (sp.kind != TV_LIST || sp.u.l->n != 2 || sp.u.l->v[0].kind != TV_STR || sp.u.l->v[1].kind != TV_STR)
                mr__tpl_raise(c, line, "tojson: separators must be an (item_separator, key_separator) pair of strings");
            isep = sp.u.l->v[0].u.s->p;
            ksep = sp.u.l->v[1].u.s->p;
        }
        mr__buf *ob = mr__tpl_push_buf(c);
        mr__tv_json(c, line, ob, v, ascii, indent, isep, ksep, arg_bool(o[3], false), 0);
        tv r = str_from_buf(c, ob->p ? ob->p : "", ob->n);
        mr__tpl_pop_buf(c);
        return r;
    }
    case F_trim: {
        static const char *const n[] = {"chars"};
        bind(c, line, "trim", n, 1, PASS, o);
        tstr *chars = given(o[0]) && o[0].kind != TV_NONE ? need_str(c, line, o[0], "trim's chars") : NULL;
        return py_strip(c, mr__tv_to_str(c, v), chars, 3);
    }
    case F_truncate: {
        static const char *const n[] = {"length", "killwords", "end", "leeway"};
        bind(c, line, "truncate", n, 4, PASS, o);
        tstr *s = mr__tv_to_str(c, v);
        int64_t length = given(o[0]) ? need_int(c, line, o[0], "truncate's length") : 255;
        tstr *end = given(o[2]) ? need_str(c, line, o[2], "truncate's end") : mr__tstr_cstr(&c->arena, "...");
        int64_t leeway = given(o[3]) && o[3].kind != TV_NONE ? need_int(c, line, o[3], "truncate's leeway") : 5;
        int64_t endn = mr__tstr_ncp(end);
        if (length < endn) mr__tpl_raise(c, line, "expected length >= %lld, got %lld", (long long)endn, (long long)length);
        if (leeway < 0) mr__tpl_raise(c, line, "expected leeway >= 0, got %lld", (long long)leeway);
        if (mr__tstr_ncp(s) <= length + leeway) return tv_strv(s);
        size_t cut = mr__utf8_offset(s->p, s->len, length - endn);
        tstr *head = mr__tstr_new(&c->arena, s->p, cut);
        if (!arg_bool(o[1], false)) {
            /* rsplit(" ", 1)[0] */
            const char *sp = NULL;
            for (size_t k = cut; k > 0; k--)
                if (head->p[k - 1] == ' ') {
                    sp = head->p + k - 1;
                    break;
                }
            if (sp) head = mr__tstr_new(&c->arena, head->p, (size_t)(sp - head->p));
        }
        return tv_strv(mr__tstr_cat(&c->arena, head, end));
    }
    case F_unique: {
        static const char *const n[] = {"case_sensitive", "attribute"};
        bind(c, line, "unique", n, 2, PASS, o);
        tlist *items = to_list(c, line, v), *out = mr__tlist_new(&c->arena, 4), *seen = mr__tlist_new(&c->arena, 4);
        bool cs = arg_bool(o[0], false);
        for (size_t i = 0; i < items->n; i++) {
            tv k = given(o[1]) && o[1].kind != TV_NONE ? attr_get(c, line, items->v[i], o[1]) : items->v[i];
            if (!cs) k = lower_if_str(c, k);
            bool dup = false;
            for (size_t j = 0; j < seen->n && !dup; j++) dup = mr__tv_eq(c, seen->v[j], k);
            mr__tpl_step(c, seen->n / 8);
            if (!dup) {
                mr__tlist_push(&c->arena, seen, k);
                mr__tlist_push(&c->arena, out, items->v[i]);
            }
        }
        return mk_list(out);
    }
    case F_wordcount: {
        bind(c, line, "wordcount", NULL, 0, PASS, o);
        tstr *s = mr__tv_to_str(c, v);
        int64_t words = 0;
        bool in = false;
        size_t i = 0;
        while (i < s->len) {
            size_t adv;
            uint32_t cp = mr__utf8_decode(s->p + i, s->len - i, &adv);
            bool w = (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_' ||
                     (cp >= 0x80 && !mr__py_isspace(cp) && !(cp >= 0x2000 && cp <= 0x206F) && !(cp >= 0x3000 && cp <= 0x303F));
            if (w && !in) words++;
            in = w;
            i += adv;
        }
        return tv_int(words);
    }
    }
    mr__tpl_raise(c, line, "internal error: filter %d", id);
}

/* `+` for sum(): numbers, strings, lists */
tv mr__tpl_binop_add(mr__tpl_ctx *c, int line, tv a, tv b) {
    bool an = a.kind == TV_INT || a.kind == TV_BOOL || a.kind == TV_FLOAT;
    bool bn = b.kind == TV_INT || b.kind == TV_BOOL || b.kind == TV_FLOAT;
    if (an && bn) {
        if (a.kind == TV_FLOAT || b.kind == TV_FLOAT) {
            double x = a.kind == TV_FLOAT ? a.u.f : (double)(a.kind == TV_INT ? a.u.i : a.u.b);
            double y = b.kind == TV_FLOAT ? b.u.f : (double)(b.kind == TV_INT ? b.u.i : b.u.b);
            return tv_float(x + y);
        }
        int64_t x = a.kind == TV_INT ? a.u.i : a.u.b, y = b.kind == TV_INT ? b.u.i : b.u.b, r;
        if (__builtin_add_overflow(x, y, &r)) mr__tpl_raise(c, line, "integer overflow in sum");
        return tv_int(r);
    }
    if (a.kind == TV_LIST && b.kind == TV_LIST) {
        tlist *l = mr__tlist_new(&c->arena, a.u.l->n + b.u.l->n);
        for (size_t i = 0; i < a.u.l->n; i++) l->v[l->n++] = a.u.l->v[i];
        for (size_t i = 0; i < b.u.l->n; i++) l->v[l->n++] = b.u.l->v[i];
        return mk_list(l);
    }
    if (a.kind == TV_UNDEF || b.kind == TV_UNDEF) {
        tv u = a.kind == TV_UNDEF ? a : b;
        mr__tpl_raise(c, line, "%s", u.u.s ? u.u.s->p : "undefined");
    }
    mr__tpl_raise(c, line, "unsupported operand type(s) for +: '%s' and '%s'", mr__tv_type_name(a), mr__tv_type_name(b));
}

/* ---------------- methods ---------------- */
#define MR_TPL_STR_METHODS(X)                                                                                    \
    X(strip) X(lstrip) X(rstrip) X(split) X(rsplit) X(splitlines) X(startswith) X(endswith) X(replace) X(upper)  \
    X(lower) X(title) X(capitalize) X(swapcase) X(casefold) X(find) X(rfind) X(index) X(rindex) X(count) X(join) \
    X(format) X(isdigit) X(isalpha) X(isalnum) X(isspace) X(isupper) X(islower) X(isnumeric) X(isdecimal)      \
    X(istitle) X(zfill) X(center) X(ljust) X(rjust) X(removeprefix) X(removesuffix) X(partition) X(rpartition)
enum {
#define X(n) MS_##n,
    MR_TPL_STR_METHODS(X)
#undef X
    MS_COUNT
};
static const char *const str_methods[] = {
#define X(n) #n,
    MR_TPL_STR_METHODS(X)
#undef X
};
enum { MD_get = 100, MD_items, MD_keys, MD_values, MD_copy, ML_index, ML_count, ML_copy, MLOOP_cycle, MLOOP_changed,
       MC_next, MC_reset };

static tv method(mr__tpl_ctx *c, int id, tv self) {
    tmethod *m = TPL_ALLOC(c, sizeof *m);
    m->id = id;
    m->self = self;
    tv v = {0};
    v.kind = TV_METHOD;
    v.u.meth = m;
    return v;
}

static tv unsafe(mr__tpl_ctx *c, const char *name, tv obj) {
    char msg[160];
    snprintf(msg, sizeof msg,
             "access to attribute '%s' of '%s' object is unsafe (chat templates run in an immutable sandbox)", name,
             mr__tv_type_name(obj));
    tv u = tv_undef();
    u.u.s = mr__tstr_cstr(&c->arena, msg);
    return u;
}

static bool name_is(const char *name, size_t n, const char *lit) { return strlen(lit) == n && !memcmp(name, lit, n); }

tv mr__tpl_method_lookup(mr__tpl_ctx *c, tv obj, const char *name, size_t n) {
    switch (obj.kind) {
    case TV_STR:
        for (int i = 0; i < MS_COUNT; i++)
            if (name_is(name, n, str_methods[i])) return method(c, i, obj);
        if (name_is(name, n, "format_map") || name_is(name, n, "encode") || name_is(name, n, "translate") ||
            name_is(name, n, "expandtabs"))
            return unsafe(c, "str method", obj);
        break;
    case TV_DICT: {
        static const char *const dm[] = {"get", "items", "keys", "values", "copy"};
        for (int i = 0; i < 5; i++)
            if (name_is(name, n, dm[i])) return method(c, MD_get + i, obj);
        static const char *const bad[] = {"update", "pop", "popitem", "setdefault", "clear", "fromkeys", NULL};
        for (int i = 0; bad[i]; i++)
            if (name_is(name, n, bad[i])) return unsafe(c, bad[i], obj);
        break;
    }
    case TV_LIST: {
        if (name_is(name, n, "index")) return method(c, ML_index, obj);
        if (name_is(name, n, "count")) return method(c, ML_count, obj);
        if (!obj.u.l->tuple && name_is(name, n, "copy")) return method(c, ML_copy, obj);
        static const char *const bad[] = {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear", NULL};
        for (int i = 0; bad[i]; i++)
            if (name_is(name, n, bad[i])) return unsafe(c, bad[i], obj);
        break;
    }
    case TV_LOOP:
        if (name_is(name, n, "cycle")) return method(c, MLOOP_cycle, obj);
        if (name_is(name, n, "changed")) return method(c, MLOOP_changed, obj);
        break;
    case TV_CYCLER:
        if (name_is(name, n, "next")) return method(c, MC_next, obj);
        if (name_is(name, n, "reset")) return method(c, MC_reset, obj);
        if (name_is(name, n, "current")) return obj.u.cyc->items.u.l->v[obj.u.cyc->pos];
        break;
    case TV_MACRO:
        if (name_is(name, n, "name")) return mr__tv_cstr(&c->arena, obj.u.m->name);
        break;
    default:
        break;
    }
    return tv_missing();
}

static int64_t find_cp(tstr *s, tstr *sub, bool right) {
    if (sub->len > s->len) return -1;
    if (!right) {
        const char *h = find_bytes(s->p, s->len, sub->p, sub->len);
        return h ? cp_index(s, (size_t)(h - s->p)) : -1;
    }
    for (size_t k = s->len - sub->len + 1; k > 0; k--)
        if (memcmp(s->p + k - 1, sub->p, sub->len) == 0) return cp_index(s, k - 1);
    return -1;
}

static bool all_cp(tstr *s, int kind) {
    if (s->len == 0) return false;
    size_t i = 0;
    while (i < s->len) {
        size_t adv;
        uint32_t cp = mr__utf8_decode(s->p + i, s->len - i, &adv);
        bool ok;
        bool digit = cp >= '0' && cp <= '9';
        bool alpha = (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= 0x80 && !mr__py_isspace(cp));
        switch (kind) {
        case 0: ok = digit; break;
        case 1: ok = alpha; break;
        case 2: ok = digit || alpha; break;
        default: ok = mr__py_isspace(cp); break;
        }
        if (!ok) return false;
        i += adv;
    }
    return true;
}

static tv pad_str(mr__tpl_ctx *c, int line, tstr *s, tv *o, int mode) {
    int64_t w = need_int(c, line, o[0], "the width");
    tstr *fill = given(o[1]) ? need_str(c, line, o[1], "the fill character") : mr__tstr_cstr(&c->arena, " ");
    if (mr__tstr_ncp(fill) != 1) mr__tpl_raise(c, line, "The fill character must be exactly one character long");
    int64_t len = mr__tstr_ncp(s);
    if (w <= len) return tv_strv(s);
    if (w > 1000000) mr__tpl_raise(c, line, "width too large");
    int64_t marg = w - len;
    int64_t left = mode == 0 ? marg / 2 + (marg & w & 1) : mode == 1 ? 0 : marg;
    sb b = {.c = c};
    for (int64_t k = 0; k < left; k++) sb_add(&b, fill->p, fill->len);
    sb_add(&b, s->p, s->len);
    for (int64_t k = left; k < marg; k++) sb_add(&b, fill->p, fill->len);
    return sb_done(&b);
}

tv mr__tpl_method_call(mr__tpl_ctx *c, int line, tmethod *m, ARGS) {
    tv o[4];
    tv self = m->self;
    mr__tpl_step(c, 1);
    if (m->id < MS_COUNT) {
        tstr *s = self.u.s;
        switch (m->id) {
        case MS_strip:
        case MS_lstrip:
        case MS_rstrip: {
            static const char *const n[] = {"chars"};
            bind(c, line, str_methods[m->id], n, 1, PASS, o);
            tstr *chars = given(o[0]) && o[0].kind != TV_NONE ? need_str(c, line, o[0], "strip's chars") : NULL;
            return py_strip(c, s, chars, m->id == MS_strip ? 3 : m->id == MS_lstrip ? 1 : 2);
        }
        case MS_split:
        case MS_rsplit: {
            static const char *const n[] = {"sep", "maxsplit"};
            bind(c, line, str_methods[m->id], n, 2, PASS, o);
            int64_t ms = given(o[1]) ? need_int(c, line, o[1], "maxsplit") : -1;
            return py_split(c, line, s, o[0], ms, m->id == MS_rsplit);
        }
        case MS_splitlines: {
            static const char *const n[] = {"keepends"};
            bind(c, line, "splitlines", n, 1, PASS, o);
            return py_splitlines(c, s, arg_bool(o[0], false));
        }
        case MS_startswith:
        case MS_endswith: {
            static const char *const n[] = {"prefix", "start", "end"};
            bind(c, line, str_methods[m->id], n, 3, PASS, o);
            if (!given(o[0])) mr__tpl_raise(c, line, "%s() takes at least 1 argument", str_methods[m->id]);
            tstr *sub = s;
            if (given(o[1]) || given(o[2])) {
                int64_t ncp = mr__tstr_ncp(s);
                int64_t a = given(o[1]) && o[1].kind != TV_NONE ? need_int(c, line, o[1], "start") : 0;
                int64_t b = given(o[2]) && o[2].kind != TV_NONE ? need_int(c, line, o[2], "end") : ncp;
                if (a < 0) a = a + ncp < 0 ? 0 : a + ncp;
                if (b < 0) b = b + ncp < 0 ? 0 : b + ncp;
                if (a > ncp) return tv_bool(false);
                if (b > ncp) b = ncp;
                if (b < a) b = a;
                size_t oa = mr__utf8_offset(s->p, s->len, a), ob = mr__utf8_offset(s->p, s->len, b);
                sub = mr__tstr_new(&c->arena, s->p + oa, ob - oa);
            }
            return tv_bool(py_startswith(c, line, sub, o[0], m->id == MS_endswith));
        }
        case MS_replace: {
            static const char *const n[] = {"old", "new", "count"};
            bind(c, line, "replace", n, 3, PASS, o);
            if (!given(o[0]) || !given(o[1])) mr__tpl_raise(c, line, "replace expected at least 2 arguments");
            int64_t cnt = given(o[2]) ? need_int(c, line, o[2], "count") : -1;
            return py_replace(c, s, need_str(c, line, o[0], "replace's old"), need_str(c, line, o[1], "replace's new"), cnt);
        }
        case MS_upper:
        case MS_lower:
        case MS_casefold:
        case MS_swapcase:
            bind(c, line, str_methods[m->id], NULL, 0, PASS, o);
            return str_map(c, s, m->id == MS_upper ? 0 : m->id == MS_swapcase ? 2 : 1);
        case MS_title:
            bind(c, line, "title", NULL, 0, PASS, o);
            return py_title(c, s);
        case MS_capitalize:
            bind(c, line, "capitalize", NULL, 0, PASS, o);
            return py_capitalize(c, s);
        case MS_find:
        case MS_rfind:
        case MS_index:
        case MS_rindex: {
            static const char *const n[] = {"sub"};
            bind(c, line, str_methods[m->id], n, 1, PASS, o);
            int64_t r = find_cp(s, need_str(c, line, o[0], "the substring"), m->id == MS_rfind || m->id == MS_rindex);
            if (r < 0 && (m->id == MS_index || m->id == MS_rindex)) mr__tpl_raise(c, line, "substring not found");
            return tv_int(r);
        }
        case MS_count: {
            static const char *const n[] = {"sub"};
            bind(c, line, "count", n, 1, PASS, o);
            tstr *sub = need_str(c, line, o[0], "the substring");
            if (sub->len == 0) return tv_int(mr__tstr_ncp(s) + 1);
            int64_t k = 0;
            size_t i = 0;
            const char *h;
            while ((h = find_bytes(s->p + i, s->len - i, sub->p, sub->len))) {
                k++;
                i = (size_t)(h - s->p) + sub->len;
            }
            return tv_int(k);
        }
        case MS_join: {
            static const char *const n[] = {"iterable"};
            bind(c, line, "join", n, 1, PASS, o);
            tlist *items = mr__tv_iter(c, line, o[0]);
            sb b = {.c = c};
            sb_add(&b, "", 0);
            for (size_t i = 0; i < items->n; i++) {
                if (items->v[i].kind != TV_STR)
                    mr__tpl_raise(c, line, "sequence item %zu: expected str instance, %s found", i,
                                  mr__tv_type_name(items->v[i]));
                if (i) sb_add(&b, s->p, s->len);
                sb_add(&b, items->v[i].u.s->p, items->v[i].u.s->len);
            }
            return sb_done(&b);
        }
        case MS_format:
            return py_format(c, line, s, PASS);
        case MS_isdigit:
        case MS_isnumeric:
        case MS_isdecimal:
            bind(c, line, str_methods[m->id], NULL, 0, PASS, o);
            return tv_bool(all_cp(s, 0));
        case MS_isalpha:
            bind(c, line, "isalpha", NULL, 0, PASS, o);
            return tv_bool(all_cp(s, 1));
        case MS_isalnum:
            bind(c, line, "isalnum", NULL, 0, PASS, o);
            return tv_bool(all_cp(s, 2));
        case MS_isspace:
            bind(c, line, "isspace", NULL, 0, PASS, o);
            return tv_bool(all_cp(s, 3));
        case MS_isupper:
        case MS_islower:
            bind(c, line, str_methods[m->id], NULL, 0, PASS, o);
            return tv_bool(run_test(c, line, m->id == MS_isupper ? T_upper : T_lower, self, NULL, 0, NULL, NULL, 0));
        case MS_istitle: {
            bind(c, line, "istitle", NULL, 0, PASS, o);
            tv t = py_title(c, s);
            bool cased = false;
            for (size_t i = 0; i < s->len; i++) cased |= ascii_alpha(s->p[i]);
            return tv_bool(cased && t.u.s->len == s->len && !memcmp(t.u.s->p, s->p, s->len));
        }
        case MS_zfill: {
            static const char *const n[] = {"width"};
            bind(c, line, "zfill", n, 1, PASS, o);
            int64_t w = need_int(c, line, o[0], "the width"), len = mr__tstr_ncp(s);
            if (w <= len) return tv_strv(s);
            if (w > 1000000) mr__tpl_raise(c, line, "width too large");
            sb b = {.c = c};
            size_t sl = s->len && (s->p[0] == '+' || s->p[0] == '-') ? 1 : 0;
            sb_add(&b, s->p, sl);
            for (int64_t k = 0; k < w - len; k++) sb_add(&b, "0", 1);
            sb_add(&b, s->p + sl, s->len - sl);
            return sb_done(&b);
        }
        case MS_center:
        case MS_ljust:
        case MS_rjust: {
            static const char *const n[] = {"width", "fillchar"};
            bind(c, line, str_methods[m->id], n, 2, PASS, o);
            return pad_str(c, line, s, o, m->id == MS_center ? 0 : m->id == MS_ljust ? 1 : 2);
        }
        case MS_removeprefix:
        case MS_removesuffix: {
            static const char *const n[] = {"prefix"};
            bind(c, line, str_methods[m->id], n, 1, PASS, o);
            tstr *p = need_str(c, line, o[0], "the affix");
            if (p->len > s->len) return tv_strv(s);
            if (m->id == MS_removeprefix && !memcmp(s->p, p->p, p->len)) return str_from_buf(c, s->p + p->len, s->len - p->len);
            if (m->id == MS_removesuffix && p->len && !memcmp(s->p + s->len - p->len, p->p, p->len))
                return str_from_buf(c, s->p, s->len - p->len);
            return tv_strv(s);
        }
        case MS_partition:
        case MS_rpartition: {
            static const char *const n[] = {"sep"};
            bind(c, line, str_methods[m->id], n, 1, PASS, o);
            tstr *sep = need_str(c, line, o[0], "the separator");
            if (sep->len == 0) mr__tpl_raise(c, line, "empty separator");
            tlist *l = mr__tlist_new(&c->arena, 3);
            l->tuple = true;
            const char *h = NULL;
            if (m->id == MS_partition) h = find_bytes(s->p, s->len, sep->p, sep->len);
            else if (sep->len <= s->len)
                for (size_t k = s->len - sep->len + 1; k > 0 && !h; k--)
                    if (!memcmp(s->p + k - 1, sep->p, sep->len)) h = s->p + k - 1;
            tv empty = str_from_buf(c, "", 0);
            if (!h) {
                l->v[0] = m->id == MS_partition ? tv_strv(s) : empty;
                l->v[1] = empty;
                l->v[2] = m->id == MS_partition ? empty : tv_strv(s);
            } else {
                size_t at = (size_t)(h - s->p);
                l->v[0] = str_from_buf(c, s->p, at);
                l->v[1] = tv_strv(sep);
                l->v[2] = str_from_buf(c, s->p + at + sep->len, s->len - at - sep->len);
            }
            l->n = 3;
            return mk_list(l);
        }
        }
    }
    switch (m->id) {
    case MD_get: {
        static const char *const n[] = {"key", "default"};
        bind(c, line, "get", n, 2, PASS, o);
        if (!given(o[0])) mr__tpl_raise(c, line, "get expected at least 1 argument, got 0");
        tv *v = mr__tdict_get(self.u.d, o[0]);
        if (v) return *v;
        return given(o[1]) ? o[1] : tv_none();
    }
    case MD_items:
    case MD_keys:
    case MD_values: {
        bind(c, line, m->id == MD_items ? "items" : m->id == MD_keys ? "keys" : "values", NULL, 0, PASS, o);
        tdict *d = self.u.d;
        tlist *l = mr__tlist_new(&c->arena, d->n);
        for (size_t i = 0; i < d->n; i++)
            l->v[l->n++] = m->id == MD_items ? mk_tuple2(c, d->k[i], d->v[i]) : m->id == MD_keys ? d->k[i] : d->v[i];
        return mk_list(l);
    }
    case MD_copy: {
        bind(c, line, "copy", NULL, 0, PASS, o);
        tdict *d = mr__tdict_new(&c->arena, self.u.d->n);
        for (size_t i = 0; i < self.u.d->n; i++) mr__tdict_set(&c->arena, d, self.u.d->k[i], self.u.d->v[i]);
        tv r = {0};
        r.kind = TV_DICT;
        r.u.d = d;
        return r;
    }
    case ML_index:
    case ML_count: {
        static const char *const n[] = {"value"};
        bind(c, line, m->id == ML_index ? "index" : "count", n, 1, PASS, o);
        if (!given(o[0])) mr__tpl_raise(c, line, "expected 1 argument");
        int64_t cnt = 0;
        for (size_t i = 0; i < self.u.l->n; i++)
            if (mr__tv_eq(c, self.u.l->v[i], o[0])) {
                if (m->id == ML_index) return tv_int((int64_t)i);
                cnt++;
            }
        if (m->id == ML_index) mr__tpl_raise(c, line, "value is not in list");
        return tv_int(cnt);
    }
    case ML_copy: {
        bind(c, line, "copy", NULL, 0, PASS, o);
        tlist *l = mr__tlist_new(&c->arena, self.u.l->n);
        for (size_t i = 0; i < self.u.l->n; i++) l->v[l->n++] = self.u.l->v[i];
        return mk_list(l);
    }
    case MLOOP_cycle: {
        if (nkw) mr__tpl_raise(c, line, "loop.cycle() takes no keyword arguments");
        if (!nargs) mr__tpl_raise(c, line, "no items for cycling given");
        return args[self.u.loop->index0 % nargs];
    }
    case MLOOP_changed: {
        if (nkw) mr__tpl_raise(c, line, "loop.changed() takes no keyword arguments");
        tlist *l = mr__tlist_new(&c->arena, nargs);
        for (size_t i = 0; i < nargs; i++) l->v[l->n++] = args[i];
        tv now = mk_list(l);
        tloop *L = self.u.loop;
        if (L->changed_any && mr__tv_eq(c, L->changed_last, now)) return tv_bool(false);
        L->changed_any = true;
        L->changed_last = now;
        return tv_bool(true);
    }
    case MC_next: {
        bind(c, line, "next", NULL, 0, PASS, o);
        tcycler *cy = self.u.cyc;
        tv r = cy->items.u.l->v[cy->pos];
        cy->pos = (cy->pos + 1) % cy->items.u.l->n;
        return r;
    }
    case MC_reset:
        bind(c, line, "reset", NULL, 0, PASS, o);
        self.u.cyc->pos = 0;
        return tv_none();
    }
    mr__tpl_raise(c, line, "internal error: method %d", m->id);
}

/* ---------------- globals ---------------- */
tv mr__tpl_global_call(mr__tpl_ctx *c, int line, int id, ARGS) {
    tv o[4];
    switch (id) {
    case G_range: {
        if (nkw) mr__tpl_raise(c, line, "range() takes no keyword arguments");
        if (nargs < 1 || nargs > 3) mr__tpl_raise(c, line, "range expected 1 to 3 arguments, got %zu", nargs);
        int64_t a = 0, b, st = 1;
        if (nargs == 1) b = need_int(c, line, args[0], "range's argument");
        else {
            a = need_int(c, line, args[0], "range's start");
            b = need_int(c, line, args[1], "range's stop");
            if (nargs == 3) st = need_int(c, line, args[2], "range's step");
        }
        if (st == 0) mr__tpl_raise(c, line, "range() arg 3 must not be zero");
        int64_t n = 0;
        if (st > 0 && a < b) n = (int64_t)(((uint64_t)b - (uint64_t)a - 1) / (uint64_t)st) + 1;
        if (st < 0 && a > b) n = (int64_t)(((uint64_t)a - (uint64_t)b - 1) / ((uint64_t)(-(st + 1)) + 1)) + 1;
        if (n > 100000 || n < 0)
            mr__tpl_raise(c, line, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        tlist *l = mr__tlist_new(&c->arena, (size_t)n);
        for (int64_t k = 0; k < n; k++) l->v[l->n++] = tv_int(a + k * st);
        mr__tpl_step(c, (uint64_t)n);
        return mk_list(l);
    }
    case G_dict:
    case G_namespace: {
        if (nargs > 1) mr__tpl_raise(c, line, "%s expected at most 1 positional argument", id == G_dict ? "dict" : "namespace");
        tdict *d = mr__tdict_new(&c->arena, nkw + 2);
        if (nargs == 1) {
            tv a = args[0];
            if (a.kind == TV_DICT || a.kind == TV_NS) {
                for (size_t i = 0; i < a.u.d->n; i++) mr__tdict_set(&c->arena, d, a.u.d->k[i], a.u.d->v[i]);
            } else if (a.kind == TV_LIST) {
                for (size_t i = 0; i < a.u.l->n; i++) {
                    tv p = a.u.l->v[i];
                    if (p.kind != TV_LIST || p.u.l->n != 2)
                        mr__tpl_raise(c, line, "dictionary update sequence element #%zu has the wrong length", i);
                    mr__tdict_set(&c->arena, d, p.u.l->v[0], p.u.l->v[1]);
                }
            } else if (a.kind != TV_NONE || id == G_dict) {
                mr__tpl_raise(c, line, "'%s' object is not iterable", mr__tv_type_name(a));
            }
        }
        for (size_t i = 0; i < nkw; i++) {
            if (id == G_namespace && kwn[i][0] == '_')
                mr__tpl_raise(c, line, "namespace attributes may not start with an underscore ('%s')", kwn[i]);
            mr__tdict_set(&c->arena, d, mr__tv_cstr(&c->arena, kwn[i]), kwv[i]);
        }
        tv r = {0};
        r.kind = id == G_dict ? TV_DICT : TV_NS;
        r.u.d = d;
        return r;
    }
    case G_raise_exception: {
        static const char *const n[] = {"message"};
        bind(c, line, "raise_exception", n, 1, PASS, o);
        tstr *msg = given(o[0]) ? mr__tv_to_str(c, o[0]) : mr__tstr_cstr(&c->arena, "");
        mr__tpl_raise(c, line, "raise_exception: %s", msg->p);
    }
    case G_strftime_now: {
        static const char *const n[] = {"format"};
        bind(c, line, "strftime_now", n, 1, PASS, o);
        tstr *fmt = need_str(c, line, o[0], "strftime_now's format");
        time_t now = c->lim.now_unix ? (time_t)c->lim.now_unix : time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        if (fmt->len > 256) mr__tpl_raise(c, line, "strftime_now: format too long");
        char buf[2048];
        size_t k = fmt->len ? strftime(buf, sizeof buf, fmt->p, &tmv) : 0;
        return str_from_buf(c, buf, k);
    }
    case G_cycler: {
        if (nkw) mr__tpl_raise(c, line, "cycler() takes no keyword arguments");
        if (!nargs) mr__tpl_raise(c, line, "at least one item has to be provided");
        tcycler *cy = TPL_ALLOC(c, sizeof *cy);
        tlist *l = mr__tlist_new(&c->arena, nargs);
        for (size_t i = 0; i < nargs; i++) l->v[l->n++] = args[i];
        cy->items = mk_list(l);
        tv r = {0};
        r.kind = TV_CYCLER;
        r.u.cyc = cy;
        return r;
    }
    case G_joiner: {
        static const char *const n[] = {"sep"};
        bind(c, line, "joiner", n, 1, PASS, o);
        tcycler *cy = TPL_ALLOC(c, sizeof *cy);
        cy->items = given(o[0]) ? tv_strv(mr__tv_to_str(c, o[0])) : mr__tv_cstr(&c->arena, ", ");
        tv r = {0};
        r.kind = TV_JOINER;
        r.u.cyc = cy;
        return r;
    }
    }
    mr__tpl_raise(c, line, "internal error: global %d", id);
}
