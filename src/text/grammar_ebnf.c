/* grammar_ebnf.c — EBNF grammars (the GBNF notation of llama.cpp, as
 * xgrammar reads it: vLLM's structured_outputs.grammar / guided_grammar,
 * sglang's ebnf): the parser, the compiled byte grammar, and the runtime a
 * matcher steps byte by byte.
 *
 * Compiled form. Every literal and character class becomes bytes (a class
 * over code points is a few UTF-8 byte-range sequences), so the runtime
 * reads bytes only. A rule is a run of alternatives in c->alts; an
 * alternative is a run of elements in c->el that ends with E_END:
 *   E_BYTES lo..hi   one byte in the range
 *   E_REF   rule     the rule's text
 *   E_END            the alternative ends
 * Groups, repetitions and classes of more than one byte sequence become
 * rules of their own: x* is R ::= x R | "", x+ is x R, x? is R ::= x | "",
 * x{m,n} is m copies of x and then n - m nested optional ones. Direct left
 * recursion (A ::= A a | b) is rewritten as right recursion (A ::= b A',
 * A' ::= a A' | ""): the same language. Left recursion through another rule,
 * or behind a prefix that can be empty, is refused. Alternatives that can
 * never finish (they reach a rule with no finite text) are dropped, so every
 * prefix the runtime accepts can be completed.
 *
 * Runtime. The parse is the set of stacks the text so far leaves open. A
 * stack is a chain of interned nodes (pos, parent): pos the element it reads
 * next, parent the node to go on with once the current alternative ends (0:
 * the bottom; there the text may end). A set's members are the stacks whose
 * top reads a byte (pos at an E_BYTES), plus node 0 when the text may end
 * here. Sets are interned (their sorted node ids) and each set's step on a
 * byte is cached, so the runtime is a deterministic automaton built lazily,
 * one state per distinct set: a step seen before is one table lookup. A
 * reference that ends its alternative does not push (a tail call), so x*
 * runs in constant depth. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/grammar_internal.h"

enum { E_END = 0, E_BYTES, E_REF };

typedef struct {
    uint8_t kind, lo, hi;
    int32_t rule; /* E_REF */
} cel;

typedef struct {
    int32_t alt0, n_alts; /* c->alts[alt0 .. alt0 + n_alts) */
    int32_t name;         /* offset of its name in the parser's names, or -1 for a rule the parser made */
    int32_t owner;        /* the named rule it was written in */
} crule;

struct mr__cfg {
    cel *el;
    int32_t n_el, cap_el;
    int32_t *alts;
    int32_t n_alts, cap_alts;
    crule *rules;
    int32_t n_rules, cap_rules;
    int32_t root;
};

#define CFG_MAX_ELEMENTS (1 << 18)
#define CFG_MAX_RULES (1 << 15)
#define CFG_MAX_REPEAT 1024
#define CFG_MAX_NEST 64
#define CFG_MAX_TEXT (1 << 18)

static bool grow(void **p, int32_t *cap, int32_t need, size_t size) {
    if (need <= *cap) return true;
    int32_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = mr_realloc(*p, (size_t)c * size);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

/* ---- the parser ---- */
typedef struct {
    cel *v;
    int32_t n, cap;
} celvec;

typedef struct {
    const char *s;
    size_t n, i;
    mr__cfg *c;
    char *names; /* NUL-separated */
    int32_t n_names, cap_names;
    int32_t *nhash; /* named rules by name: open addressing, -1 empty */
    int32_t nhash_cap, n_named;
    int32_t *first_use; /* [n_rules] text offset of the first reference, -1 if none */
    uint8_t *defined;   /* [n_rules] */
    int32_t cap_meta;
    int32_t cur; /* the named rule being read */
    mr_status st;
} parser;

static void line_col(const parser *p, size_t at, int *line, int *col) {
    *line = 1, *col = 1;
    for (size_t k = 0; k < at && k < p->n; k++) {
        if (p->s[k] == '\n') ++*line, *col = 1;
        else ++*col;
    }
}

__attribute__((format(printf, 3, 4))) static bool fail_at(parser *p, size_t at, const char *fmt, ...) {
    if (p->st) return false;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    line_col(p, at, &line, &col);
    p->st = mr_error_set(MR_EINVAL, "grammar, line %d column %d: %s", line, col, msg);
    return false;
}

static bool oom(parser *p) {
    if (!p->st) p->st = MR_ENOMEM;
    return false;
}

static const char *rule_name(const parser *p, int32_t r) {
    const crule *x = &p->c->rules[r];
    return p->names + p->c->rules[x->name >= 0 ? r : x->owner].name;
}

static int32_t new_rule(parser *p, int32_t name) {
    mr__cfg *c = p->c;
    if (c->n_rules >= CFG_MAX_RULES) return fail_at(p, p->i, "more than %d rules once groups and repetitions are rules", CFG_MAX_RULES), -1;
    if (!grow((void **)&c->rules, &c->cap_rules, c->n_rules + 1, sizeof(crule))) return oom(p), -1;
    if (c->n_rules + 1 > p->cap_meta) {
        int32_t cap = p->cap_meta;
        if (!grow((void **)&p->first_use, &cap, c->n_rules + 1, sizeof(int32_t))) return oom(p), -1;
        cap = p->cap_meta;
        if (!grow((void **)&p->defined, &cap, c->n_rules + 1, 1)) return oom(p), -1;
        p->cap_meta = cap;
    }
    const int32_t r = c->n_rules++;
    c->rules[r] = (crule){.alt0 = 0, .n_alts = 0, .name = name, .owner = name >= 0 ? r : p->cur};
    p->first_use[r] = -1;
    p->defined[r] = 0;
    return r;
}

static bool is_name_char(char ch, bool first) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' ||
           (!first && ((ch >= '0' && ch <= '9') || ch == '-' || ch == '.'));
}

static uint32_t name_hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

/* The rule of a name, made (undefined) on first sight. */
static int32_t rule_of(parser *p, const char *nm, size_t len) {
    if ((p->n_named + 1) * 2 > p->nhash_cap) { /* grown and rebuilt */
        const int32_t cap = p->nhash_cap ? p->nhash_cap * 2 : 256;
        int32_t *h = mr_malloc((size_t)cap * sizeof(int32_t));
        if (!h) return oom(p), -1;
        memset(h, 0xFF, (size_t)cap * sizeof(int32_t));
        for (int32_t i = 0; i < p->nhash_cap; i++) {
            if (p->nhash[i] < 0) continue;
            const char *x = p->names + p->c->rules[p->nhash[i]].name;
            uint32_t k = name_hash(x, strlen(x)) & (uint32_t)(cap - 1);
            while (h[k] >= 0) k = (k + 1) & (uint32_t)(cap - 1);
            h[k] = p->nhash[i];
        }
        mr_free(p->nhash);
        p->nhash = h, p->nhash_cap = cap;
    }
    uint32_t k = name_hash(nm, len) & (uint32_t)(p->nhash_cap - 1);
    for (; p->nhash[k] >= 0; k = (k + 1) & (uint32_t)(p->nhash_cap - 1)) {
        const char *x = p->names + p->c->rules[p->nhash[k]].name;
        if (strlen(x) == len && !memcmp(x, nm, len)) return p->nhash[k];
    }
    if (!grow((void **)&p->names, &p->cap_names, p->n_names + (int32_t)len + 1, 1)) return oom(p), -1;
    const int32_t off = p->n_names;
    memcpy(p->names + off, nm, len);
    p->names[off + (int32_t)len] = 0;
    p->n_names += (int32_t)len + 1;
    const int32_t r = new_rule(p, off);
    if (r >= 0) p->nhash[k] = r, p->n_named++;
    return r;
}

static void skip_ws(parser *p) {
    while (p->i < p->n) {
        const char ch = p->s[p->i];
        if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r') p->i++;
        else if (ch == '#') while (p->i < p->n && p->s[p->i] != '\n') p->i++;
        else break;
    }
}

static size_t name_len(const parser *p, size_t at) {
    size_t k = at;
    if (k < p->n && is_name_char(p->s[k], true))
        for (k++; k < p->n && is_name_char(p->s[k], false); k++) {}
    return k - at;
}

/* A rule definition starts at `at`: a name, then "::=" (or rule options in brackets before it). */
static bool defines_at(const parser *p, size_t at) {
    size_t k = name_len(p, at);
    if (!k) return false;
    k += at;
    while (k < p->n && (p->s[k] == ' ' || p->s[k] == '\t')) k++;
    if (k < p->n && p->s[k] == '[') {
        while (k < p->n && p->s[k] != ']' && p->s[k] != '\n') k++;
        if (k < p->n && p->s[k] == ']') k++;
        while (k < p->n && (p->s[k] == ' ' || p->s[k] == '\t')) k++;
    }
    return k + 3 <= p->n && !memcmp(p->s + k, "::=", 3);
}

static bool push_el(parser *p, celvec *v, cel e) {
    if (p->c->n_el + v->n >= CFG_MAX_ELEMENTS)
        return fail_at(p, p->i, "more than %d elements once repetitions are written out", CFG_MAX_ELEMENTS);
    if (!grow((void **)&v->v, &v->cap, v->n + 1, sizeof(cel))) return oom(p);
    v->v[v->n++] = e;
    return true;
}

static bool push_bytes(parser *p, celvec *v, uint8_t lo, uint8_t hi) { return push_el(p, v, (cel){E_BYTES, lo, hi, 0}); }

/* Defines rule r by its alternatives (each a run of elements, no E_END). Direct left recursion is turned
 * into right recursion first. */
static bool define(parser *p, int32_t r, celvec *alt, int32_t n) {
    mr__cfg *c = p->c;
    int32_t rec = 0;
    for (int32_t k = 0; k < n; k++) rec += alt[k].n && alt[k].v[0].kind == E_REF && alt[k].v[0].rule == r;
    if (rec) {
        if (rec == n) return fail_at(p, p->i, "rule \"%s\" is left-recursive in every alternative: it never ends", rule_name(p, r));
        const int32_t tail = new_rule(p, -1);
        if (tail < 0) return false;
        /* A ::= A a | b  ->  A ::= b T, T ::= a T | "" */
        celvec *t = mr_calloc((size_t)rec + 1, sizeof(celvec));
        if (!t) return oom(p);
        int32_t nt = 0;
        bool ok = true;
        for (int32_t k = 0; k < n && ok; k++) {
            if (alt[k].n && alt[k].v[0].kind == E_REF && alt[k].v[0].rule == r) {
                if (alt[k].n > 1) { /* A ::= A alone says nothing */
                    for (int32_t j = 1; j < alt[k].n && ok; j++) ok = push_el(p, &t[nt], alt[k].v[j]);
                    ok = ok && push_el(p, &t[nt], (cel){E_REF, 0, 0, tail});
                    nt++;
                }
                mr_free(alt[k].v);
                alt[k] = (celvec){.cap = -1}; /* gone */
            } else {
                ok = push_el(p, &alt[k], (cel){E_REF, 0, 0, tail});
            }
        }
        nt++; /* the empty one */
        ok = ok && define(p, tail, t, nt);
        for (int32_t k = 0; k < nt; k++) mr_free(t[k].v);
        mr_free(t);
        if (!ok) return false;
    }
    int32_t live = 0;
    for (int32_t k = 0; k < n; k++) live += alt[k].cap != -1;
    if (!grow((void **)&c->alts, &c->cap_alts, c->n_alts + live, sizeof(int32_t))) return oom(p);
    c->rules[r].alt0 = c->n_alts;
    c->rules[r].n_alts = live;
    p->defined[r] = 1;
    for (int32_t k = 0; k < n; k++) {
        if (alt[k].cap == -1) continue;
        if (c->n_el + alt[k].n + 1 > CFG_MAX_ELEMENTS)
            return fail_at(p, p->i, "more than %d elements once repetitions are written out", CFG_MAX_ELEMENTS);
        if (!grow((void **)&c->el, &c->cap_el, c->n_el + alt[k].n + 1, sizeof(cel))) return oom(p);
        c->alts[c->n_alts++] = c->n_el;
        if (alt[k].n) memcpy(c->el + c->n_el, alt[k].v, (size_t)alt[k].n * sizeof(cel));
        c->n_el += alt[k].n;
        c->el[c->n_el++] = (cel){E_END, 0, 0, 0};
    }
    return true;
}

/* A rule made of the alternatives given (copied); its id, or -1. */
static int32_t rule_from(parser *p, celvec *alt, int32_t n) {
    const int32_t r = new_rule(p, -1);
    return r >= 0 && define(p, r, alt, n) ? r : -1;
}

static void free_alts(celvec *alt, int32_t n) {
    for (int32_t k = 0; k < n; k++) mr_free(alt[k].v);
}

/* ---- characters ---- */
static int hexval(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* One character of a literal or a class (after its backslash, if any); -1 on error. in_class: the class
 * escapes are allowed too. */
static int32_t read_char(parser *p, bool in_class) {
    const size_t at = p->i;
    const uint8_t b = (uint8_t)p->s[p->i];
    if (b == '\n' || b == '\r')
        return fail_at(p, at, "a raw line break inside a %s; write \\n", in_class ? "character class" : "string"), -1;
    if (b != '\\') { /* a UTF-8 character as written */
        int len = b < 0x80 ? 1 : b >= 0xF0 && b <= 0xF4 ? 4 : b >= 0xE0 ? 3 : b >= 0xC2 && b < 0xE0 ? 2 : 0;
        if (!len || p->i + (size_t)len > p->n) return fail_at(p, at, "the grammar is not UTF-8 text"), -1;
        int32_t cp = len == 1 ? b : b & (0x3F >> (len - 1));
        for (int k = 1; k < len; k++) {
            const uint8_t x = (uint8_t)p->s[p->i + (size_t)k];
            if ((x & 0xC0) != 0x80) return fail_at(p, at, "the grammar is not UTF-8 text"), -1;
            cp = cp << 6 | (x & 0x3F);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
            return fail_at(p, at, "the grammar is not UTF-8 text"), -1;
        p->i += (size_t)len;
        return cp;
    }
    if (++p->i >= p->n) return fail_at(p, at, "a backslash at the end of the grammar"), -1;
    const char e = p->s[p->i++];
    switch (e) {
    case '"': case '\\': case '/': case '\'': case '?': return e;
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case 'b': return '\b';
    case 'f': return '\f';
    case 'a': return '\a';
    case 'v': return '\v';
    case '0': return 0;
    case 'e': return 0x1B;
    case 'x': case 'u': case 'U': {
        const int want = e == 'u' ? 4 : e == 'U' ? 8 : 0; /* \x: as many hex digits as follow */
        int32_t cp = 0;
        int k = 0;
        for (; p->i < p->n && hexval(p->s[p->i]) >= 0 && (want == 0 || k < want); k++, p->i++) {
            cp = cp * 16 + hexval(p->s[p->i]);
            if (cp > 0x10FFFF) return fail_at(p, at, "the escape is past U+10FFFF"), -1;
        }
        if (k == 0 || (want && k != want)) return fail_at(p, at, "\\%c needs %s hex digits", e, e == 'u' ? "4" : e == 'U' ? "8" : "its"), -1;
        if (cp >= 0xD800 && cp <= 0xDFFF) return fail_at(p, at, "the escape is a UTF-16 surrogate (U+%04X)", (unsigned)cp), -1;
        return cp;
    }
    default:
        if (in_class && strchr("^$.*+?()[]{}|-", e)) return e;
        return fail_at(p, at, "unknown escape \\%c", e), -1;
    }
}

static int utf8_put(uint8_t *o, int32_t cp) {
    if (cp < 0x80) return o[0] = (uint8_t)cp, 1;
    if (cp < 0x800) return o[0] = (uint8_t)(0xC0 | cp >> 6), o[1] = (uint8_t)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000)
        return o[0] = (uint8_t)(0xE0 | cp >> 12), o[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F)), o[2] = (uint8_t)(0x80 | (cp & 0x3F)), 3;
    o[0] = (uint8_t)(0xF0 | cp >> 18), o[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F)), o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

typedef struct {
    int32_t lo, hi;
} cprange;

static int cmp_range(const void *a, const void *b) {
    const cprange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The byte sequences of the code points [lo, hi] (one UTF-8 length, no surrogates inside), each an
 * alternative: split until every byte position is a range of its own. */
static bool utf8_seqs(parser *p, int32_t lo, int32_t hi, celvec **alt, int32_t *n, int32_t *cap) {
    const int len = lo < 0x80 ? 1 : lo < 0x800 ? 2 : lo < 0x10000 ? 3 : 4;
    for (int k = 1; k < len; k++) {
        const int32_t m = (1 << (6 * k)) - 1; /* the low k continuation bytes */
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) return utf8_seqs(p, lo, lo | m, alt, n, cap) && utf8_seqs(p, (lo | m) + 1, hi, alt, n, cap);
            if ((hi & m) != m) return utf8_seqs(p, lo, (hi & ~m) - 1, alt, n, cap) && utf8_seqs(p, hi & ~m, hi, alt, n, cap);
        }
    }
    if (!grow((void **)alt, cap, *n + 1, sizeof(celvec))) return oom(p);
    celvec *v = &(*alt)[(*n)++];
    *v = (celvec){0};
    uint8_t a[4], b[4];
    utf8_put(a, lo);
    utf8_put(b, hi);
    for (int k = 0; k < len; k++)
        if (!push_bytes(p, v, a[k], b[k])) return false;
    return true;
}

/* A set of code points as elements appended to v: its bytes when it is one sequence, else a rule of them. */
static bool class_elements(parser *p, celvec *v, cprange *rg, int32_t nr, bool negate, size_t at) {
    qsort(rg, (size_t)nr, sizeof *rg, cmp_range);
    int32_t k = 0;
    for (int32_t j = 0; j < nr; j++) { /* merged */
        if (k && rg[j].lo <= rg[k - 1].hi + 1) {
            if (rg[j].hi > rg[k - 1].hi) rg[k - 1].hi = rg[j].hi;
        } else {
            rg[k++] = rg[j];
        }
    }
    nr = k;
    cprange out[64 + 4];
    int32_t no = 0;
    if (negate) { /* the complement within [0, 0x10FFFF] */
        int32_t from = 0;
        for (int32_t j = 0; j < nr && no < 64; j++) {
            if (rg[j].lo > from) out[no++] = (cprange){from, rg[j].lo - 1};
            from = rg[j].hi + 1;
        }
        if (from <= 0x10FFFF) out[no++] = (cprange){from, 0x10FFFF};
    } else {
        for (int32_t j = 0; j < nr && no < 64; j++) out[no++] = rg[j];
    }
    if (no == 0) return fail_at(p, at, "the character class matches no character");
    celvec *alt = NULL;
    int32_t na = 0, cap = 0;
    bool ok = true;
    static const int32_t CUT[] = {0x7F, 0x7FF, 0xD7FF, 0xDFFF, 0xFFFF, 0x10FFFF}; /* one UTF-8 length each; surrogates out */
    for (int32_t j = 0; j < no && ok; j++) {
        int32_t lo = out[j].lo;
        for (int c = 0; c < 6 && ok && lo <= out[j].hi; c++) {
            if (lo > CUT[c]) continue;
            const int32_t hi = out[j].hi < CUT[c] ? out[j].hi : CUT[c];
            if (c != 3) ok = utf8_seqs(p, lo, hi, &alt, &na, &cap);
            lo = hi + 1;
        }
    }
    if (ok && na == 0) ok = fail_at(p, at, "the character class matches no character (surrogates are not characters)");
    if (ok && na == 1) {
        for (int32_t j = 0; j < alt[0].n && ok; j++) ok = push_el(p, v, alt[0].v[j]);
    } else if (ok) {
        const int32_t r = rule_from(p, alt, na);
        ok = r >= 0 && push_el(p, v, (cel){E_REF, 0, 0, r});
    }
    free_alts(alt, na);
    mr_free(alt);
    return ok;
}

static bool parse_class(parser *p, celvec *v) {
    const size_t at = p->i++; /* '[' */
    bool neg = false;
    if (p->i < p->n && p->s[p->i] == '^') neg = true, p->i++;
    cprange rg[64];
    int32_t nr = 0;
    while (p->i < p->n && p->s[p->i] != ']') {
        const int32_t lo = read_char(p, true);
        if (lo < 0) return false;
        int32_t hi = lo;
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            p->i++;
            if ((hi = read_char(p, true)) < 0) return false;
            if (hi < lo) return fail_at(p, at, "the range U+%04X-U+%04X runs backwards", (unsigned)lo, (unsigned)hi);
        }
        if (nr == 64) return fail_at(p, at, "a character class of more than 64 ranges");
        rg[nr++] = (cprange){lo, hi};
    }
    if (p->i >= p->n) return fail_at(p, at, "the character class is not closed");
    p->i++;
    if (nr == 0 && !neg) return fail_at(p, at, "an empty character class matches nothing");
    return class_elements(p, v, rg, nr, neg, at);
}

static bool parse_string(parser *p, celvec *v) {
    const size_t at = p->i++; /* '"' */
    while (p->i < p->n && p->s[p->i] != '"') {
        const int32_t cp = read_char(p, false);
        if (cp < 0) return false;
        uint8_t b[4];
        const int k = utf8_put(b, cp);
        for (int j = 0; j < k; j++)
            if (!push_bytes(p, v, b[j], b[j])) return false;
    }
    if (p->i >= p->n) return fail_at(p, at, "the string is not closed");
    p->i++;
    return true;
}

static bool parse_alts(parser *p, int32_t rule, int depth);

/* A repetition count; -1 on error. */
static int64_t read_count(parser *p) {
    int64_t x = 0;
    size_t k = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        x = x * 10 + (p->s[p->i++] - '0');
        if (x > CFG_MAX_REPEAT) return fail_at(p, p->i, "a repetition count above %d", CFG_MAX_REPEAT), -1;
        k++;
    }
    return k ? x : -1;
}

/* The element run x (v[start..]) repeated lo .. hi times (hi -1: no limit), in place. */
static bool repeat(parser *p, celvec *v, int32_t start, int64_t lo, int64_t hi) {
    celvec x = {0};
    bool ok = true;
    for (int32_t j = start; j < v->n && ok; j++) ok = push_el(p, &x, v->v[j]);
    v->n = start;
    for (int64_t k = 0; k < lo && ok; k++)
        for (int32_t j = 0; j < x.n && ok; j++) ok = push_el(p, v, x.v[j]);
    if (ok && hi != lo) {
        /* star: R ::= x R | "";  bounded: O_1 ::= x | "", O_k ::= x O_(k-1) | "" */
        int32_t r = -1;
        for (int64_t k = 0; ok && (hi < 0 ? k < 1 : k < hi - lo); k++) {
            celvec alt[2] = {{0}, {0}};
            for (int32_t j = 0; j < x.n && ok; j++) ok = push_el(p, &alt[0], x.v[j]);
            if (hi < 0) {
                r = new_rule(p, -1);
                ok = ok && r >= 0 && push_el(p, &alt[0], (cel){E_REF, 0, 0, r}) && define(p, r, alt, 2);
            } else {
                if (r >= 0) ok = ok && push_el(p, &alt[0], (cel){E_REF, 0, 0, r});
                ok = ok && (r = rule_from(p, alt, 2)) >= 0;
            }
            free_alts(alt, 2);
        }
        ok = ok && push_el(p, v, (cel){E_REF, 0, 0, r});
    }
    mr_free(x.v);
    return ok;
}

static bool parse_postfix(parser *p, celvec *v, int32_t start) {
    if (p->i >= p->n) return true;
    const size_t at = p->i;
    int64_t lo, hi;
    switch (p->s[p->i]) {
    case '*': lo = 0, hi = -1, p->i++; break;
    case '+': lo = 1, hi = -1, p->i++; break;
    case '?': lo = 0, hi = 1, p->i++; break;
    case '{':
        p->i++;
        if ((lo = read_count(p)) < 0) return fail_at(p, at, "a repetition {m}, {m,} or {m,n} needs its m");
        hi = lo;
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            hi = p->i < p->n && p->s[p->i] == '}' ? -1 : read_count(p);
            if (hi == -1 && (p->i >= p->n || p->s[p->i] != '}')) return fail_at(p, at, "a repetition {m,n} with a bad n");
        }
        if (p->i >= p->n || p->s[p->i] != '}') return fail_at(p, at, "a repetition is not closed with }");
        p->i++;
        if (hi >= 0 && hi < lo) return fail_at(p, at, "a repetition {%lld,%lld} whose maximum is below its minimum", (long long)lo, (long long)hi);
        break;
    default: return true;
    }
    if (p->i < p->n && strchr("*+?{", p->s[p->i]))
        return fail_at(p, p->i, "two repetition operators in a row; put the first in parentheses");
    return repeat(p, v, start, lo, hi);
}

/* One alternative: items until '|', ')', the end, or the next rule's definition. */
static bool parse_seq(parser *p, celvec *v, int depth) {
    for (;;) {
        skip_ws(p);
        if (p->i >= p->n) return true;
        const char ch = p->s[p->i];
        if (ch == '|' || ch == ')') return true;
        const int32_t start = v->n;
        const size_t at = p->i;
        if (ch == '"') {
            if (!parse_string(p, v)) return false;
        } else if (ch == '[') {
            if (!parse_class(p, v)) return false;
        } else if (ch == '.') { /* any character (llama.cpp's GBNF) */
            p->i++;
            cprange any = {0, 0x10FFFF};
            if (!class_elements(p, v, &any, 1, false, at)) return false;
        } else if (ch == '(') {
            p->i++;
            skip_ws(p);
            if (p->i < p->n && p->s[p->i] == '=') return fail_at(p, at, "lookahead assertions (= ...) are not supported");
            if (depth >= CFG_MAX_NEST) return fail_at(p, at, "groups nested more than %d deep", CFG_MAX_NEST);
            const int32_t r = new_rule(p, -1);
            if (r < 0 || !parse_alts(p, r, depth + 1)) return false;
            if (p->i >= p->n || p->s[p->i] != ')') return fail_at(p, at, "the group is not closed with )");
            p->i++;
            if (!push_el(p, v, (cel){E_REF, 0, 0, r})) return false;
        } else if (is_name_char(ch, true)) {
            if (defines_at(p, p->i)) {
                if (depth) return fail_at(p, at, "a rule definition inside parentheses");
                return true; /* the next rule */
            }
            const size_t len = name_len(p, p->i);
            static const char *const MACROS[] = {"TagDispatch", "TokenTagDispatch", "Token", "ExcludeToken"};
            size_t k = p->i + len;
            for (size_t j = 0; j < sizeof MACROS / sizeof MACROS[0]; j++)
                if (strlen(MACROS[j]) == len && !memcmp(MACROS[j], p->s + p->i, len) && k < p->n && p->s[k] == '(')
                    return fail_at(p, at, "the %s macro is not supported", MACROS[j]);
            const int32_t r = rule_of(p, p->s + p->i, len);
            if (r < 0) return false;
            if (p->first_use[r] < 0) p->first_use[r] = (int32_t)p->i;
            p->i += len;
            if (!push_el(p, v, (cel){E_REF, 0, 0, r})) return false;
        } else {
            return fail_at(p, at, "unexpected '%c'", ch);
        }
        if (!parse_postfix(p, v, start)) return false;
    }
}

/* Alternatives separated by '|' up to ')' (depth > 0) or the end of the rule, defining rule. */
static bool parse_alts(parser *p, int32_t rule, int depth) {
    celvec *alt = NULL;
    int32_t n = 0, cap = 0;
    bool ok = true;
    for (;;) {
        if (!grow((void **)&alt, &cap, n + 1, sizeof(celvec))) {
            ok = oom(p);
            break;
        }
        alt[n] = (celvec){0};
        ok = parse_seq(p, &alt[n++], depth);
        if (!ok) break;
        skip_ws(p);
        if (p->i < p->n && p->s[p->i] == '|') {
            p->i++;
            continue;
        }
        break;
    }
    if (ok && depth == 0 && p->i < p->n && p->s[p->i] == ')') ok = fail_at(p, p->i, "a ) without its (");
    ok = ok && define(p, rule, alt, n);
    free_alts(alt, n);
    mr_free(alt);
    return ok;
}

static bool parse_rules(parser *p) {
    for (;;) {
        skip_ws(p);
        if (p->i >= p->n) return true;
        const size_t at = p->i;
        const size_t len = name_len(p, p->i);
        if (!len)
            return fail_at(p, at, "a rule name was expected (rules are written name ::= ...%s)",
                           p->s[p->i] == '?' || p->s[p->i] == '%' ? "; Lark grammars are not read" : "");
        const int32_t r = rule_of(p, p->s + p->i, len);
        if (r < 0) return false;
        if (p->defined[r]) return fail_at(p, at, "rule \"%s\" is defined twice", rule_name(p, r));
        p->i += len;
        skip_ws(p);
        if (p->i < p->n && p->s[p->i] == '[') return fail_at(p, p->i, "rule options ([temperature=...]) are not supported");
        if (p->i + 3 > p->n || memcmp(p->s + p->i, "::=", 3))
            return fail_at(p, p->i, "\"::=\" was expected after the rule name%s", p->i < p->n && p->s[p->i] == ':'
                           ? " (this is GBNF, name ::= ...; Lark grammars, name: ..., are not read)" : "");
        p->i += 3;
        p->cur = r;
        if (!parse_alts(p, r, 0)) return false;
    }
}

/* ---- checks once every rule is read ---- */

/* Nullable rules (they can match the empty text) and productive ones (they can match some finite text), by
 * worklists: each alternative counts the references that still hold it back (for nullable, an alternative
 * with a byte never counts down); a rule that turns counts down the alternatives that reference it. Linear in
 * the grammar, where sweeping to a fixpoint is quadratic on a chain of rules. False when out of memory. */
static bool fixpoints(const mr__cfg *c, uint8_t *nullable, uint8_t *productive) {
    const int32_t nr = c->n_rules, na = c->n_alts;
    int32_t *owner = mr_malloc((size_t)na * sizeof(int32_t)), *left = mr_malloc((size_t)na * 2 * sizeof(int32_t));
    int32_t *head = mr_calloc((size_t)nr + 1, sizeof(int32_t)), *occ = mr_malloc(((size_t)c->n_el + 1) * sizeof(int32_t));
    int32_t *work = mr_malloc(((size_t)nr * 2 + 1) * sizeof(int32_t));
    bool ok = owner && left && head && occ && work;
    if (ok) {
        /* occurrences: for each rule, the alternatives that reference it (once per reference) */
        for (int32_t r = 0; r < nr; r++)
            for (int32_t a = 0; a < c->rules[r].n_alts; a++) {
                const int32_t k = c->rules[r].alt0 + a;
                owner[k] = r;
                left[2 * k] = left[2 * k + 1] = 0;
                for (int32_t e = c->alts[k]; c->el[e].kind != E_END; e++) {
                    if (c->el[e].kind == E_BYTES) left[2 * k] = INT32_MIN / 2; /* never nullable */
                    else left[2 * k]++, left[2 * k + 1]++, head[c->el[e].rule + 1]++;
                }
            }
        for (int32_t r = 0; r < nr; r++) head[r + 1] += head[r];
        int32_t *fill = work; /* borrowed as a cursor per rule, before the worklist needs it */
        for (int32_t r = 0; r < nr; r++) fill[r] = head[r];
        for (int32_t r = 0; r < nr; r++)
            for (int32_t a = 0; a < c->rules[r].n_alts; a++) {
                const int32_t k = c->rules[r].alt0 + a;
                for (int32_t e = c->alts[k]; c->el[e].kind != E_END; e++)
                    if (c->el[e].kind == E_REF) occ[fill[c->el[e].rule]++] = k;
            }
        for (int prop = 0; prop < 2; prop++) { /* 0: nullable, 1: productive */
            uint8_t *flag = prop ? productive : nullable;
            int32_t nw = 0;
            for (int32_t k = 0; k < na; k++)
                if (left[2 * k + prop] == 0 && !flag[owner[k]]) flag[owner[k]] = 1, work[nw++] = owner[k];
            while (nw) {
                const int32_t r = work[--nw];
                for (int32_t i = head[r]; i < head[r + 1]; i++) {
                    const int32_t k = occ[i];
                    if (--left[2 * k + prop] == 0 && !flag[owner[k]]) flag[owner[k]] = 1, work[nw++] = owner[k];
                }
            }
        }
    }
    mr_free(owner), mr_free(left), mr_free(head), mr_free(occ), mr_free(work);
    return ok;
}

/* Left recursion the runtime cannot follow. An edge A -> B: B is referenced at the start of one of A's
 * alternatives, or after references to nullable rules only; it is a tail edge when that reference ends the
 * alternative. A cycle of tail edges alone is fine (x* of something that can be empty: the runtime meets
 * the same (pos, parent) again and stops); one with another edge pushes a frame on every pass, forever. So
 * a non-tail edge inside a strongly connected component (Kosaraju's two passes, without recursion) is
 * refused. Returns the rule it starts from, -1 for none, -2 when out of memory. */
static int32_t left_cycle(const mr__cfg *c, const uint8_t *nullable) {
    const int32_t nr = c->n_rules;
    int32_t ne = 0;
    for (int32_t r = 0; r < nr; r++)
        for (int32_t a = 0; a < c->rules[r].n_alts; a++)
            for (int32_t e = c->alts[c->rules[r].alt0 + a]; c->el[e].kind == E_REF; e++) {
                ne++;
                if (!nullable[c->el[e].rule]) break;
            }
    int32_t *buf = mr_malloc(((size_t)ne * 3 + (size_t)(nr + 1) * 2 + (size_t)nr * 5) * sizeof(int32_t));
    if (!buf) return -2;
    int32_t *from = buf, *to = from + ne, *tail = to + ne, *head = tail + ne, *rhead = head + nr + 1;
    int32_t *adj = rhead + nr + 1, *radj = adj + nr, *order = radj + nr, *comp = order + nr, *stk = comp + nr;
    /* the edges (from, to, tail), then both directions as sorted index lists */
    int32_t k = 0;
    for (int32_t r = 0; r < nr; r++)
        for (int32_t a = 0; a < c->rules[r].n_alts; a++)
            for (int32_t e = c->alts[c->rules[r].alt0 + a]; c->el[e].kind == E_REF; e++) {
                from[k] = r, to[k] = c->el[e].rule, tail[k] = c->el[e + 1].kind == E_END, k++;
                if (!nullable[c->el[e].rule]) break;
            }
    int32_t *eidx = mr_malloc((size_t)ne * 2 * sizeof(int32_t) + 1);
    if (!eidx) return mr_free(buf), -2;
    int32_t *redx = eidx + ne;
    memset(head, 0, (size_t)(nr + 1) * sizeof(int32_t));
    memset(rhead, 0, (size_t)(nr + 1) * sizeof(int32_t));
    for (int32_t i = 0; i < ne; i++) head[from[i] + 1]++, rhead[to[i] + 1]++;
    for (int32_t r = 0; r < nr; r++) head[r + 1] += head[r], rhead[r + 1] += rhead[r];
    for (int32_t r = 0; r < nr; r++) adj[r] = head[r], radj[r] = rhead[r];
    for (int32_t i = 0; i < ne; i++) eidx[adj[from[i]]++] = i, redx[radj[to[i]]++] = i;
    /* pass 1: finishing order on the graph */
    int32_t n_order = 0;
    for (int32_t r = 0; r < nr; r++) comp[r] = -1, adj[r] = head[r];
    for (int32_t s = 0; s < nr; s++) {
        if (comp[s] != -1) continue;
        int32_t sp = 0;
        stk[sp++] = s, comp[s] = -2;
        while (sp) {
            const int32_t v = stk[sp - 1];
            if (adj[v] < head[v + 1]) {
                const int32_t w = to[eidx[adj[v]++]];
                if (comp[w] == -1) stk[sp++] = w, comp[w] = -2;
            } else {
                order[n_order++] = v, sp--;
            }
        }
    }
    /* pass 2: components on the reversed graph, in reverse finishing order */
    for (int32_t r = 0; r < nr; r++) comp[r] = -1;
    for (int32_t i = nr - 1; i >= 0; i--) {
        const int32_t s = order[i];
        if (comp[s] != -1) continue;
        int32_t sp = 0;
        stk[sp++] = s, comp[s] = s;
        while (sp) {
            const int32_t v = stk[--sp];
            for (int32_t j = rhead[v]; j < rhead[v + 1]; j++) {
                const int32_t w = from[redx[j]];
                if (comp[w] == -1) comp[w] = s, stk[sp++] = w;
            }
        }
    }
    int32_t bad = -1;
    for (int32_t i = 0; i < ne && bad < 0; i++)
        if (!tail[i] && comp[from[i]] == comp[to[i]]) bad = from[i];
    mr_free(eidx);
    mr_free(buf);
    return bad;
}

static bool check(parser *p) {
    mr__cfg *c = p->c;
    for (int32_t r = 0; r < c->n_rules; r++)
        if (!p->defined[r]) return fail_at(p, (size_t)p->first_use[r], "rule \"%s\" is not defined", p->names + c->rules[r].name);
    c->root = -1;
    for (int32_t r = 0; r < c->n_rules; r++)
        if (c->rules[r].name >= 0 && !strcmp(p->names + c->rules[r].name, "root")) c->root = r;
    if (c->root < 0) return fail_at(p, 0, "the grammar has no rule named root (the text the output must match)");
    uint8_t *nul = mr_calloc((size_t)c->n_rules, 2);
    if (!nul) return oom(p);
    uint8_t *prod = nul + c->n_rules;
    bool ok = fixpoints(c, nul, prod) ? true : oom(p);
    const int32_t hit = ok ? left_cycle(c, nul) : -1;
    if (hit == -2) ok = oom(p);
    else if (hit >= 0)
        ok = fail_at(p, 0, "rule \"%s\" is left-recursive through another rule or behind a part that can be empty "
                     "(only direct left recursion, A ::= A x | y, is rewritten)", rule_name(p, hit));
    if (ok && !prod[c->root]) ok = fail_at(p, 0, "rule root matches no finite text");
    /* drop the alternatives that can never finish: then every prefix the runtime takes can be completed */
    for (int32_t r = 0; r < c->n_rules && ok; r++) {
        crule *x = &c->rules[r];
        int32_t k = 0;
        for (int32_t a = 0; a < x->n_alts; a++) {
            bool fin = true;
            for (int32_t e = c->alts[x->alt0 + a]; c->el[e].kind != E_END; e++)
                if (c->el[e].kind == E_REF && !prod[c->el[e].rule]) fin = false;
            if (fin) c->alts[x->alt0 + k++] = c->alts[x->alt0 + a];
        }
        x->n_alts = k;
    }
    mr_free(nul);
    return ok;
}

mr_status mr__cfg_compile(const char *text, mr__cfg **out) {
    *out = NULL;
    const size_t n = strlen(text);
    if (n > CFG_MAX_TEXT) return mr_error_set(MR_EINVAL, "grammar: %zu bytes; at most %d", n, CFG_MAX_TEXT);
    mr__cfg *c = mr_calloc(1, sizeof *c);
    if (!c) return MR_ENOMEM;
    parser p = {.s = text, .n = n, .c = c, .cur = -1};
    if (parse_rules(&p)) check(&p);
    mr_status st = p.st;
    mr_free(p.names);
    mr_free(p.nhash);
    mr_free(p.first_use);
    mr_free(p.defined);
    if (st) {
        mr__cfg_free(c);
        return st;
    }
    *out = c;
    return MR_OK;
}

void mr__cfg_free(mr__cfg *c) {
    if (!c) return;
    mr_free(c->el);
    mr_free(c->alts);
    mr_free(c->rules);
    mr_free(c);
}

int32_t mr__cfg_rules(const mr__cfg *c) { return c->n_rules; }
int32_t mr__cfg_elements(const mr__cfg *c) { return c->n_el; }

/* ---- the runtime ---- */
/* A generation's tables stay below ~16 MiB whatever the grammar: nodes (8 bytes + hash), sets (1 KiB of cached
 * steps each), their members; past half of each, the runtime keeps its current state alone (mr__cfg_tidy). */
#define RUN_MAX_NODES (1 << 19)
#define RUN_MAX_SETS (1 << 12)
#define RUN_MAX_POOL (1 << 20) /* set members, all sets together */
#define RUN_MAX_STACKS 4096    /* in one set */
#define RUN_MAX_SEEN (1u << 20) /* items one step's closure visits */
#define RUN_TIDY_NODES (RUN_MAX_NODES / 2)
#define RUN_TIDY_SETS (RUN_MAX_SETS / 2)
#define RUN_TIDY_POOL (RUN_MAX_POOL / 2)

struct mr__cfgrun {
    const mr__cfg *c;
    int32_t *npos, *npar; /* [n_nodes]; node 0 is the bottom */
    int32_t n_nodes, cap_nodes;
    int32_t *nhash; /* open addressing, node ids, -1 empty */
    uint32_t nhash_cap;
    uint32_t *soff;  /* [n_sets] into pool */
    int32_t *slen;   /* [n_sets]; set 0 is the empty set */
    int32_t n_sets, cap_sets;
    int32_t *pool;
    int32_t n_pool, cap_pool;
    int32_t *shash;
    uint32_t shash_cap;
    int32_t *trans; /* [cap_sets][256] the next set, -1 not known yet */
    /* one step's scratch */
    int32_t *out;
    int32_t n_out, cap_out;
    int32_t *work; /* (pos, parent) pairs */
    int32_t n_work, cap_work;
    uint64_t *seen; /* (pos, parent) keys of this step, with their generation */
    uint32_t *seen_gen, seen_cap, seen_n, gen;
    int64_t budget; /* closure items left before the caller's next mr__cfg_budget */
    bool full;
};

static uint32_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (uint32_t)x;
}

static uint32_t node_key(const mr__cfgrun *r, int32_t id) {
    return mix((uint64_t)(uint32_t)r->npos[id] << 32 | (uint32_t)r->npar[id]);
}
static uint32_t set_key(const mr__cfgrun *r, int32_t id);

/* An open-addressing table of ids 1 .. n - 1 (-1 empty) of cap slots, rebuilt by their hashes. */
static bool rehash(mr__cfgrun *r, int32_t **table, uint32_t *table_cap, uint32_t cap, int32_t n,
                   uint32_t (*key)(const mr__cfgrun *, int32_t)) {
    int32_t *h = mr_malloc((size_t)cap * sizeof(int32_t));
    if (!h) return false;
    memset(h, 0xFF, (size_t)cap * sizeof(int32_t));
    for (int32_t id = 1; id < n; id++) {
        uint32_t k = key(r, id) & (cap - 1);
        while (h[k] >= 0) k = (k + 1) & (cap - 1);
        h[k] = id;
    }
    mr_free(*table);
    *table = h;
    *table_cap = cap;
    return true;
}
static bool rehash_nodes(mr__cfgrun *r, uint32_t cap) { return rehash(r, &r->nhash, &r->nhash_cap, cap, r->n_nodes, node_key); }
static bool rehash_sets(mr__cfgrun *r, uint32_t cap) { return rehash(r, &r->shash, &r->shash_cap, cap, r->n_sets, set_key); }

/* The node (pos, parent); -1 when the limit is reached or memory is out. */
static int32_t node(mr__cfgrun *r, int32_t pos, int32_t parent) {
    const uint64_t key = (uint64_t)(uint32_t)pos << 32 | (uint32_t)parent;
    uint32_t k = mix(key) & (r->nhash_cap - 1); /* node_key's hash */
    for (; r->nhash[k] >= 0; k = (k + 1) & (r->nhash_cap - 1))
        if (r->npos[r->nhash[k]] == pos && r->npar[r->nhash[k]] == parent) return r->nhash[k];
    if (r->n_nodes >= RUN_MAX_NODES) return -1;
    if (r->n_nodes == r->cap_nodes) { /* the two arrays share one capacity */
        int32_t c1 = r->cap_nodes, c2 = r->cap_nodes;
        if (!grow((void **)&r->npos, &c1, r->n_nodes + 1, sizeof(int32_t)) || !grow((void **)&r->npar, &c2, r->n_nodes + 1, sizeof(int32_t)))
            return -1;
        r->cap_nodes = c1;
    }
    const int32_t id = r->n_nodes++;
    r->npos[id] = pos, r->npar[id] = parent;
    r->nhash[k] = id;
    if ((uint32_t)r->n_nodes * 2 > r->nhash_cap && !rehash_nodes(r, r->nhash_cap * 2)) return -1;
    return id;
}

static uint32_t set_hash(const int32_t *v, int32_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    for (int32_t i = 0; i < n; i++) h = (h ^ (uint32_t)v[i]) * 0x100000001B3ULL;
    return mix(h);
}

static uint32_t set_key(const mr__cfgrun *r, int32_t id) { return set_hash(r->pool + r->soff[id], r->slen[id]); }

/* The set of the sorted, distinct node ids v[0..n); 0 for the empty set, -1 at the limit. */
static int32_t set_of(mr__cfgrun *r, const int32_t *v, int32_t n) {
    if (n == 0) return 0;
    uint32_t k = set_hash(v, n) & (r->shash_cap - 1);
    for (; r->shash[k] >= 0; k = (k + 1) & (r->shash_cap - 1)) {
        const int32_t id = r->shash[k];
        if (r->slen[id] == n && !memcmp(r->pool + r->soff[id], v, (size_t)n * sizeof(int32_t))) return id;
    }
    if (r->n_sets >= RUN_MAX_SETS || r->n_pool + n > RUN_MAX_POOL) return -1;
    if (!grow((void **)&r->pool, &r->cap_pool, r->n_pool + n, sizeof(int32_t))) return -1;
    if (r->n_sets == r->cap_sets) { /* the three arrays share one capacity */
        int32_t c1 = r->cap_sets, c2 = r->cap_sets, c3 = r->cap_sets;
        if (!grow((void **)&r->soff, &c1, r->n_sets + 1, sizeof(uint32_t)) || !grow((void **)&r->slen, &c2, r->n_sets + 1, sizeof(int32_t)) ||
            !grow((void **)&r->trans, &c3, r->n_sets + 1, 256 * sizeof(int32_t)))
            return -1;
        r->cap_sets = c1;
    }
    const int32_t id = r->n_sets++;
    r->soff[id] = (uint32_t)r->n_pool;
    r->slen[id] = n;
    memcpy(r->pool + r->n_pool, v, (size_t)n * sizeof(int32_t));
    r->n_pool += n;
    memset(r->trans + (size_t)id * 256, 0xFF, 256 * sizeof(int32_t));
    r->shash[k] = id;
    if ((uint32_t)r->n_sets * 2 > r->shash_cap && !rehash_sets(r, r->shash_cap * 2)) return -1;
    return id;
}

/* This step has met (pos, parent) already; -1 past the budget or the limit, or out of memory. */
static int seen(mr__cfgrun *r, int32_t pos, int32_t parent) {
    if (--r->budget < 0 || r->seen_n >= RUN_MAX_SEEN) return -1;
    if ((r->seen_n + 1) * 2 > r->seen_cap) {
        const uint32_t cap = r->seen_cap * 2;
        uint64_t *k2 = mr_malloc((size_t)cap * sizeof(uint64_t));
        uint32_t *g2 = mr_calloc(cap, sizeof(uint32_t));
        if (!k2 || !g2) return mr_free(k2), mr_free(g2), -1;
        for (uint32_t i = 0; i < r->seen_cap; i++) {
            if (r->seen_gen[i] != r->gen) continue;
            uint32_t k = mix(r->seen[i]) & (cap - 1);
            while (g2[k] == r->gen) k = (k + 1) & (cap - 1);
            k2[k] = r->seen[i], g2[k] = r->gen;
        }
        mr_free(r->seen), mr_free(r->seen_gen);
        r->seen = k2, r->seen_gen = g2, r->seen_cap = cap;
    }
    const uint64_t key = (uint64_t)(uint32_t)pos << 32 | (uint32_t)parent;
    uint32_t k = mix(key) & (r->seen_cap - 1);
    for (; r->seen_gen[k] == r->gen; k = (k + 1) & (r->seen_cap - 1))
        if (r->seen[k] == key) return 1;
    r->seen[k] = key, r->seen_gen[k] = r->gen;
    r->seen_n++;
    return 0;
}

static void new_step(mr__cfgrun *r) {
    r->n_out = r->n_work = 0;
    r->seen_n = 0;
    if (++r->gen == 0) { /* the generations wrapped: clear the stamps */
        memset(r->seen_gen, 0, r->seen_cap * sizeof(uint32_t));
        r->gen = 1;
    }
}

static bool push_work(mr__cfgrun *r, int32_t pos, int32_t parent) {
    if (!grow((void **)&r->work, &r->cap_work, r->n_work + 2, sizeof(int32_t))) return false;
    r->work[r->n_work++] = pos;
    r->work[r->n_work++] = parent;
    return true;
}

static bool push_out(mr__cfgrun *r, int32_t id) {
    if (r->n_out >= RUN_MAX_STACKS || !grow((void **)&r->out, &r->cap_out, r->n_out + 1, sizeof(int32_t))) return false;
    r->out[r->n_out++] = id;
    return true;
}

/* Every stack that reads a byte next, reached from (pos, parent) without reading one, into out. */
static bool closure(mr__cfgrun *r) {
    const mr__cfg *c = r->c;
    while (r->n_work) {
        int32_t parent = r->work[--r->n_work], pos = r->work[--r->n_work];
        for (;;) {
            const int s = seen(r, pos, parent);
            if (s < 0) return false;
            if (s) break;
            const cel *e = &c->el[pos];
            if (e->kind == E_BYTES) {
                const int32_t id = node(r, pos, parent);
                if (id < 0 || !push_out(r, id)) return false;
                break;
            }
            if (e->kind == E_END) { /* the alternative ends: back to the parent's continuation */
                if (parent == 0) {
                    if (!push_out(r, 0)) return false;
                    break;
                }
                pos = r->npos[parent], parent = r->npar[parent];
                continue;
            }
            int32_t next = parent; /* a reference that ends its alternative goes on with the parent (a tail call) */
            if (c->el[pos + 1].kind != E_END && (next = node(r, pos + 1, parent)) < 0) return false;
            const crule *x = &c->rules[e->rule];
            for (int32_t a = 0; a < x->n_alts; a++)
                if (!push_work(r, c->alts[x->alt0 + a], next)) return false;
            break;
        }
    }
    return true;
}

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* out as a set: sorted, distinct, interned. */
static int32_t finish_set(mr__cfgrun *r) {
    qsort(r->out, (size_t)r->n_out, sizeof(int32_t), cmp_i32);
    int32_t k = 0;
    for (int32_t i = 0; i < r->n_out; i++)
        if (!k || r->out[k - 1] != r->out[i]) r->out[k++] = r->out[i];
    return set_of(r, r->out, k);
}

static int32_t start_set(mr__cfgrun *r) {
    new_step(r);
    const crule *x = &r->c->rules[r->c->root];
    for (int32_t a = 0; a < x->n_alts; a++)
        if (!push_work(r, r->c->alts[x->alt0 + a], 0)) return -1;
    return closure(r) ? finish_set(r) : -1;
}

/* Empty tables (node 0 and set 0 only), keeping what was allocated. */
static bool run_init(mr__cfgrun *r) {
    r->n_nodes = 1, r->n_sets = 1, r->n_pool = 0;
    if (!r->cap_nodes) {
        r->npos = mr_malloc(1024 * sizeof(int32_t));
        r->npar = mr_malloc(1024 * sizeof(int32_t));
        if (!r->npos || !r->npar) return false;
        r->cap_nodes = 1024;
    }
    r->npos[0] = -1, r->npar[0] = -1;
    if (!r->cap_sets) {
        r->soff = mr_malloc(64 * sizeof(uint32_t));
        r->slen = mr_malloc(64 * sizeof(int32_t));
        r->trans = mr_malloc(64 * 256 * sizeof(int32_t));
        if (!r->soff || !r->slen || !r->trans) return false;
        r->cap_sets = 64;
    }
    r->soff[0] = 0, r->slen[0] = 0;
    memset(r->trans, 0, 256 * sizeof(int32_t)); /* the empty set stays empty */
    if (!rehash_nodes(r, 1024) || !rehash_sets(r, 256)) return false;
    if (!r->seen_cap) {
        r->seen = mr_malloc(1024 * sizeof(uint64_t));
        r->seen_gen = mr_calloc(1024, sizeof(uint32_t));
        if (!r->seen || !r->seen_gen) return false;
        r->seen_cap = 1024;
    }
    return true;
}

void mr__cfgrun_free(mr__cfgrun *r) {
    if (!r) return;
    mr_free(r->npos), mr_free(r->npar), mr_free(r->nhash);
    mr_free(r->soff), mr_free(r->slen), mr_free(r->pool), mr_free(r->shash), mr_free(r->trans);
    mr_free(r->out), mr_free(r->work), mr_free(r->seen), mr_free(r->seen_gen);
    mr_free(r);
}

mr_status mr__cfgrun_new(const mr__cfg *c, mr__cfgrun **out, int32_t *start) {
    *out = NULL;
    mr__cfgrun *r = mr_calloc(1, sizeof *r);
    if (!r) return MR_ENOMEM;
    r->c = c;
    r->budget = MR__CFG_BUDGET;
    if (!run_init(r) || (*start = start_set(r)) < 0) {
        mr__cfgrun_free(r);
        return mr_error_set(MR_ENOMEM, "grammar: out of memory, or the grammar starts with more than %d parse stacks",
                            RUN_MAX_STACKS);
    }
    *out = r;
    return MR_OK;
}

int32_t mr__cfg_step(mr__cfgrun *r, int32_t set, uint8_t byte) {
    if (set <= 0) return 0;
    const int32_t known = r->trans[(size_t)set * 256 + byte];
    if (known >= 0) return known;
    new_step(r);
    const int32_t *v = r->pool + r->soff[set];
    const int32_t n = r->slen[set];
    const mr__cfg *c = r->c;
    for (int32_t i = 0; i < n; i++) {
        if (v[i] == 0) continue; /* the bottom: the text may end here, nothing more reads */
        const int32_t pos = r->npos[v[i]];
        if (byte < c->el[pos].lo || byte > c->el[pos].hi) continue;
        if (!push_work(r, pos + 1, r->npar[v[i]])) return (r->full = true), -1;
    }
    const int32_t next = closure(r) ? finish_set(r) : -1;
    if (next < 0) return (r->full = true), -1;
    r->trans[(size_t)set * 256 + byte] = next;
    return next;
}

bool mr__cfg_accepts(const mr__cfgrun *r, int32_t set) { return set > 0 && r->pool[r->soff[set]] == 0; }

bool mr__cfg_full(const mr__cfgrun *r) { return r->full; }

void mr__cfg_budget(mr__cfgrun *r, int64_t items) {
    r->budget = items;
    r->full = false;
}

/* The stacks of set, re-interned in fresh tables when these have grown past their tidy size; the set's new id
 * (the same when nothing was done), -1 when out of memory. Every other set id is void afterwards. */
int32_t mr__cfg_tidy(mr__cfgrun *r, int32_t set) {
    if (set <= 0 || (r->n_nodes < RUN_TIDY_NODES && r->n_sets < RUN_TIDY_SETS && r->n_pool < RUN_TIDY_POOL)) return set;
    /* each stack as its positions, bottom last: [len, pos_top, ..., pos_bottom] */
    int32_t *save = NULL, n_save = 0, cap = 0;
    const int32_t n = r->slen[set];
    for (int32_t i = 0; i < n; i++) {
        int32_t len = 0;
        for (int32_t id = r->pool[r->soff[set] + (uint32_t)i]; id != 0; id = r->npar[id]) len++;
        if (!grow((void **)&save, &cap, n_save + len + 1, sizeof(int32_t))) return mr_free(save), -1;
        save[n_save++] = len;
        for (int32_t id = r->pool[r->soff[set] + (uint32_t)i]; id != 0; id = r->npar[id]) save[n_save++] = r->npos[id];
    }
    /* the tables go back to their first size: a long generation keeps what its current state needs */
    mr_free(r->npos), mr_free(r->npar), mr_free(r->soff), mr_free(r->slen), mr_free(r->trans), mr_free(r->pool);
    r->npos = r->npar = r->slen = r->trans = r->pool = NULL;
    r->soff = NULL;
    r->cap_nodes = r->cap_sets = r->cap_pool = 0;
    if (!run_init(r)) return mr_free(save), -1;
    new_step(r);
    bool ok = true;
    for (int32_t k = 0; k < n_save && ok;) {
        const int32_t len = save[k];
        int32_t id = 0;
        for (int32_t j = len; j >= 1 && id >= 0; j--) id = node(r, save[k + j], id);
        ok = id >= 0 && push_out(r, id);
        k += len + 1;
    }
    mr_free(save);
    return ok ? finish_set(r) : -1;
}
