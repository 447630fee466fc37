/* grammar_pattern.c — the regular expressions of JSON Schema's "pattern" (and
 * of the string formats, written as patterns) as position automata
 * (Glushkov: one state per character position of the expression, no empty
 * moves), at most MR__RE_MAX positions so that a set of states is one
 * uint64 in a matcher frame.
 *
 * Symbols are characters: an ASCII byte is itself; any other character is
 * the one symbol MR__RE_NONASCII, which '.', negated classes and \D \W \S
 * match and nothing else does (a pattern with non-ASCII characters of its
 * own is refused). Syntax: literals, escapes (\d \D \w \W \s \S, \n \t \r
 * \f \v, \ before a punctuation character), '.', classes [a-z0-9_] and
 * [^...], groups (...) and (?:...), '|', quantifiers * + ? {m} {m,} {m,n}
 * (a lazy '?' after them is accepted: the language is the same), '^' at the
 * start and '$' at the end. A pattern without '^' may start anywhere in the
 * string and one without '$' end anywhere (JSON Schema's patterns search).
 * Backreferences, lookarounds and other anchors are refused. */
#include <stdio.h>
#include <string.h>

#include "text/grammar_internal.h"

/* ---- the syntax tree ---- */
enum { X_SYM, X_CAT, X_ALT, X_STAR, X_OPT, X_EMPTY };
#define MAX_X 1024

typedef struct {
    uint8_t op;
    int32_t l, r;       /* children (CAT, ALT: both; STAR, OPT: l) */
    uint8_t cls[17];    /* X_SYM: symbols 0..128 (128 = non-ASCII) */
} xnode;

typedef struct {
    const char *p, *end;
    xnode x[MAX_X];
    int n;
    char *err;
    size_t errlen;
    int depth;
} parser;

static int fail(parser *ps, const char *what) {
    if (!ps->err[0]) snprintf(ps->err, ps->errlen, "%s", what);
    return -1;
}

static int mk(parser *ps, uint8_t op, int l, int r) {
    if (l < -1 || r < -1 || (op != X_SYM && op != X_EMPTY && l < 0)) return -1;
    if (ps->n == MAX_X) return fail(ps, "the pattern is too long");
    ps->x[ps->n] = (xnode){.op = op, .l = l, .r = r};
    return ps->n++;
}

static void cls_set(uint8_t *c, int s) { c[s >> 3] |= (uint8_t)(1u << (s & 7)); }
static void cls_range(uint8_t *c, int a, int b) {
    for (int s = a; s <= b; s++) cls_set(c, s);
}
static void cls_negate(uint8_t *c) {
    for (int i = 0; i < 17; i++) c[i] = (uint8_t)~c[i];
    c[16] &= 1; /* symbols 0..128 only */
}

/* \d \w \s and their negations into c; false when e is not one of them */
static bool cls_escape(uint8_t *c, char e) {
    uint8_t t[17] = {0};
    switch (e | 0x20) {
    case 'd': cls_range(t, '0', '9'); break;
    case 'w':
        cls_range(t, '0', '9'), cls_range(t, 'a', 'z'), cls_range(t, 'A', 'Z');
        cls_set(t, '_');
        break;
    case 's':
        for (const char *q = " \t\n\r\f\v"; *q; q++) cls_set(t, *q);
        break;
    default: return false;
    }
    if (e >= 'A' && e <= 'Z') cls_negate(t);
    for (int i = 0; i < 17; i++) c[i] |= t[i];
    return true;
}

/* A single escaped character (after the backslash), or -1. */
static int esc_char(char e) {
    switch (e) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case '0': return 0;
    }
    if ((e >= 0x21 && e <= 0x2F) || (e >= 0x3A && e <= 0x40) || (e >= 0x5B && e <= 0x60) || (e >= 0x7B && e <= 0x7E))
        return (unsigned char)e; /* punctuation stands for itself */
    return -1;
}

static int parse_alt(parser *ps);

static int parse_class(parser *ps) {
    int id = mk(ps, X_SYM, -1, -1);
    if (id < 0) return -1;
    uint8_t *c = ps->x[id].cls;
    bool neg = ps->p < ps->end && *ps->p == '^';
    if (neg) ps->p++;
    bool first = true;
    while (ps->p < ps->end && (*ps->p != ']' || first)) {
        first = false;
        int lo;
        char ch = *ps->p++;
        if ((unsigned char)ch >= 0x80) return fail(ps, "non-ASCII characters in a pattern are not supported");
        if (ch == '\\') {
            if (ps->p == ps->end) return fail(ps, "a pattern ends in a backslash");
            char e = *ps->p++;
            if (cls_escape(c, e)) continue;
            if ((lo = esc_char(e)) < 0) return fail(ps, "an unsupported escape in a character class");
        } else {
            lo = (unsigned char)ch;
        }
        if (ps->p + 1 < ps->end && *ps->p == '-' && ps->p[1] != ']') {
            ps->p++;
            int hi = (unsigned char)*ps->p++;
            if (hi == '\\') {
                if (ps->p == ps->end || (hi = esc_char(*ps->p++)) < 0) return fail(ps, "a bad range in a class");
            }
            if (hi >= 0x80 || hi < lo) return fail(ps, "a bad range in a character class");
            cls_range(c, lo, hi);
        } else {
            cls_set(c, lo);
        }
    }
    if (ps->p == ps->end) return fail(ps, "a character class is not closed");
    ps->p++;
    if (neg) cls_negate(c);
    return id;
}

static int parse_atom(parser *ps) {
    char ch = *ps->p++;
    if (ch == '(') {
        if (ps->p < ps->end && *ps->p == '?') {
            if (ps->p + 1 < ps->end && ps->p[1] == ':') ps->p += 2;
            else return fail(ps, "lookarounds and named groups are not supported");
        }
        if (++ps->depth > 32) return fail(ps, "groups nest too deep");
        int a = parse_alt(ps);
        ps->depth--;
        if (a < 0) return -1;
        if (ps->p == ps->end || *ps->p != ')') return fail(ps, "a group is not closed");
        ps->p++;
        return a;
    }
    if (ch == '[') return parse_class(ps);
    int id = mk(ps, X_SYM, -1, -1);
    if (id < 0) return -1;
    uint8_t *c = ps->x[id].cls;
    if (ch == '.') {
        cls_range(c, 0, 128);
        c['\n' >> 3] &= (uint8_t)~(1u << ('\n' & 7));
        c['\r' >> 3] &= (uint8_t)~(1u << ('\r' & 7));
        return id;
    }
    if (ch == '\\') {
        if (ps->p == ps->end) return fail(ps, "a pattern ends in a backslash");
        char e = *ps->p++;
        if (cls_escape(c, e)) return id;
        if (e >= '1' && e <= '9') return fail(ps, "backreferences are not supported");
        int s = esc_char(e);
        if (s < 0) return fail(ps, "an unsupported escape (\\b, \\B, \\u, ... )");
        cls_set(c, s);
        return id;
    }
    if ((unsigned char)ch >= 0x80) return fail(ps, "non-ASCII characters in a pattern are not supported");
    if (strchr("*+?{", ch)) return fail(ps, "a quantifier follows nothing");
    if (ch == '^' || ch == '$') return fail(ps, "'^' and '$' are supported at the pattern's ends only");
    cls_set(c, (unsigned char)ch);
    return id;
}

/* A copy of subtree t (new positions for a repetition). */
static int clone(parser *ps, int t) {
    if (t < 0) return -1;
    xnode x = ps->x[t];
    int l = x.l >= 0 ? clone(ps, x.l) : -1, r = x.r >= 0 ? clone(ps, x.r) : -1;
    if ((x.l >= 0 && l < 0) || (x.r >= 0 && r < 0)) return -1;
    int id = mk(ps, x.op, x.op == X_SYM || x.op == X_EMPTY ? -1 : l, r);
    if (id < 0) return -1;
    ps->x[id] = x;
    ps->x[id].l = l;
    ps->x[id].r = r;
    return id;
}

static int read_int(parser *ps) {
    int v = -1;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        v = (v < 0 ? 0 : v) * 10 + (*ps->p++ - '0');
        if (v > 1000) return fail(ps, "a repetition count above 1000");
    }
    return v;
}

static int parse_repeat(parser *ps) {
    int a = parse_atom(ps);
    while (a >= 0 && ps->p < ps->end && strchr("*+?{", *ps->p)) {
        char q = *ps->p++;
        int m = 0, n = -1;
        if (q == '*') m = 0, n = -1;
        else if (q == '+') m = 1, n = -1;
        else if (q == '?') m = 0, n = 1;
        else {
            m = read_int(ps);
            if (m < 0) return fail(ps, "a bad {m,n}");
            n = m;
            if (ps->p < ps->end && *ps->p == ',') {
                ps->p++;
                n = read_int(ps);
                if (n < -1) return -1;
            }
            if (ps->p == ps->end || *ps->p != '}' || (n >= 0 && n < m)) return fail(ps, "a bad {m,n}");
            ps->p++;
        }
        if (ps->p < ps->end && *ps->p == '?') ps->p++; /* lazy: the same language */
        /* a{m,n} = a a ... a (m) then (a (a (...)?)?)? (n - m) or a* */
        int out = -1;
        for (int i = 0; i < m; i++) {
            int c = i ? clone(ps, a) : a;
            out = out < 0 ? c : mk(ps, X_CAT, out, c);
            if (out < 0) return -1;
        }
        int tail = -1;
        if (n < 0) {
            tail = mk(ps, X_STAR, m ? clone(ps, a) : a, -1);
        } else {
            for (int i = 0; i < n - m; i++) {
                int c = (m || i) ? clone(ps, a) : a;
                tail = mk(ps, X_OPT, tail < 0 ? c : mk(ps, X_CAT, c, tail), -1);
                if (tail < 0) return -1;
            }
        }
        if (tail >= 0) out = out < 0 ? tail : mk(ps, X_CAT, out, tail);
        a = out < 0 ? mk(ps, X_EMPTY, -1, -1) : out;
    }
    return a;
}

static int parse_cat(parser *ps) {
    int out = -1;
    while (ps->p < ps->end && *ps->p != '|' && *ps->p != ')') {
        if (*ps->p == '$' && ps->p + 1 == ps->end) break;
        int a = parse_repeat(ps);
        if (a < 0) return -1;
        out = out < 0 ? a : mk(ps, X_CAT, out, a);
        if (out < 0) return -1;
    }
    return out < 0 ? mk(ps, X_EMPTY, -1, -1) : out;
}

static int parse_alt(parser *ps) {
    int a = parse_cat(ps);
    while (a >= 0 && ps->p < ps->end && *ps->p == '|') {
        ps->p++;
        int b = parse_cat(ps);
        a = b < 0 ? -1 : mk(ps, X_ALT, a, b);
    }
    return a;
}

/* ---- positions: first, last, follow, nullable (Glushkov) ---- */
typedef struct {
    uint64_t first, last;
    bool nullable;
} gl;

static gl positions(parser *ps, mr__pat *re, int t, bool *over) {
    xnode *x = &ps->x[t];
    gl g = {0}, a, b;
    switch (x->op) {
    case X_EMPTY: g.nullable = true; break;
    case X_SYM:
        if (re->n == MR__RE_MAX) {
            *over = true;
            break;
        }
        memcpy(re->cls[re->n], x->cls, sizeof x->cls);
        g.first = g.last = 1ull << re->n;
        re->n++;
        break;
    case X_CAT:
        a = positions(ps, re, x->l, over);
        b = positions(ps, re, x->r, over);
        for (int p = 0; p < MR__RE_MAX; p++)
            if (a.last >> p & 1) re->follow[p] |= b.first;
        g.first = a.first | (a.nullable ? b.first : 0);
        g.last = b.last | (b.nullable ? a.last : 0);
        g.nullable = a.nullable && b.nullable;
        break;
    case X_ALT:
        a = positions(ps, re, x->l, over);
        b = positions(ps, re, x->r, over);
        g = (gl){a.first | b.first, a.last | b.last, a.nullable || b.nullable};
        break;
    case X_STAR:
    case X_OPT:
        g = positions(ps, re, x->l, over);
        if (x->op == X_STAR)
            for (int p = 0; p < MR__RE_MAX; p++)
                if (g.last >> p & 1) re->follow[p] |= g.first;
        g.nullable = true;
        break;
    }
    return g;
}

mr_status mr__pat_compile(const char *pattern, mr__pat *re) {
    memset(re, 0, sizeof *re);
    parser *ps = mr_calloc(1, sizeof *ps);
    if (!ps) return MR_ENOMEM;
    char err[160] = "";
    ps->err = err;
    ps->errlen = sizeof err;
    size_t len = strlen(pattern);
    ps->p = pattern;
    ps->end = pattern + len;
    bool head = len && pattern[0] == '^';
    bool tail = len && pattern[len - 1] == '$' && !(len >= 2 && pattern[len - 2] == '\\');
    if (head) ps->p++;
    int core = parse_alt(ps);
    if (core >= 0 && ps->p < ps->end && !(tail && ps->p + 1 == ps->end)) core = fail(ps, "an unbalanced ')'");
    /* search semantics: any characters before an unanchored start and after an unanchored end */
    int any_a = -1, any_b = -1;
    if (core >= 0 && !head) {
        int s = mk(ps, X_SYM, -1, -1);
        if (s >= 0) cls_range(ps->x[s].cls, 0, 128);
        any_a = s < 0 ? -1 : mk(ps, X_STAR, s, -1);
        core = any_a < 0 ? -1 : mk(ps, X_CAT, any_a, core);
    }
    if (core >= 0 && !tail) {
        int s = mk(ps, X_SYM, -1, -1);
        if (s >= 0) cls_range(ps->x[s].cls, 0, 128);
        any_b = s < 0 ? -1 : mk(ps, X_STAR, s, -1);
        core = any_b < 0 ? -1 : mk(ps, X_CAT, core, any_b);
    }
    mr_status st = MR_OK;
    if (core < 0) {
        st = mr_error_set(MR_EINVAL, "pattern \"%.80s\": %s", pattern, err[0] ? err : "not understood");
    } else {
        bool over = false;
        gl g = positions(ps, re, core, &over);
        if (over) {
            st = mr_error_set(MR_EINVAL, "pattern \"%.80s\": more than %d character positions once repetitions are "
                              "written out", pattern, MR__RE_MAX);
        } else {
            re->first = g.first, re->last = g.last, re->nullable = g.nullable;
            for (int s = 0; s <= MR__RE_NONASCII; s++)
                for (int p = 0; p < re->n; p++)
                    if (re->cls[p][s >> 3] >> (s & 7) & 1) re->sym[s] |= 1ull << p;
            /* live: the positions from which a last one can be reached */
            uint64_t live = re->last, prev = 0;
            while (live != prev) {
                prev = live;
                for (int p = 0; p < re->n; p++)
                    if (re->follow[p] & live) live |= 1ull << p;
            }
            re->live = live;
            if (!re->nullable && !(re->first & live))
                st = mr_error_set(MR_EINVAL, "pattern \"%.80s\" matches no string", pattern);
        }
    }
    mr_free(ps);
    return st;
}

uint64_t mr__pat_step(const mr__pat *re, uint64_t s, int sym) {
    uint64_t next = s & MR__RE_START ? re->first : 0;
    for (uint64_t t = s & ~MR__RE_START; t; t &= t - 1) next |= re->follow[__builtin_ctzll(t)];
    next &= re->sym[sym] & re->live;
    return next;
}

bool mr__pat_accepts(const mr__pat *re, uint64_t s) {
    return (s & MR__RE_START ? re->nullable : false) || (s & re->last) != 0;
}
