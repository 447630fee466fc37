/* grammar_pattern.c — the regular expressions of JSON Schema's "pattern" (and
 * of the string formats, written as patterns, and regex outputs) as
 * deterministic automata: the Glushkov automaton (one state per character
 * position of the expression, no empty moves; at most MR__RE_MAXPOS
 * positions once repetitions are written out) made deterministic by the
 * subsets of positions reachable (at most MR__RE_MAXSTATES), so that a
 * matcher keeps one state index and a step is one table lookup.
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
 * Negative lookaheads at the very start, ^(?!X)R (pydantic 2.13's Decimal
 * writes one), as the product of the two automata (pat_lookahead).
 * Backreferences, other lookarounds and other anchors are refused. */
#include <stdio.h>
#include <string.h>

#include "text/grammar_internal.h"

/* ---- the syntax tree ---- */
enum { X_SYM, X_CAT, X_ALT, X_STAR, X_OPT, X_EMPTY };
#define MAX_X 8192

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

/* ---- positions (Glushkov: first, last and nullable of each subtree, follow of each position), then the
 * sets of positions reachable, each one state ---- */
typedef struct {
    int w, npos;            /* words of a set of positions; positions (npos itself is the start) */
    uint64_t *follow;       /* [npos + 1][w] */
    uint64_t *first, *last; /* [nodes][w] */
    uint8_t *nullable;      /* [nodes] */
    uint8_t (*cls)[17];     /* [npos] */
} gl;

#define BIT(set, p) ((set)[(p) >> 6] >> ((p) & 63) & 1)

static void set_or(uint64_t *d, const uint64_t *s, int w) {
    for (int i = 0; i < w; i++) d[i] |= s[i];
}

/* Bottom-up over the tree: a node's children were made before it, so their ids are smaller. */
static void positions(const parser *ps, gl *G) {
    const int w = G->w;
    int pos = 0;
    for (int t = 0; t < ps->n; t++) {
        const xnode *x = &ps->x[t];
        uint64_t *f = G->first + (size_t)t * (size_t)w, *l = G->last + (size_t)t * (size_t)w;
        const uint64_t *fa = x->l >= 0 ? G->first + (size_t)x->l * (size_t)w : NULL,
                       *la = x->l >= 0 ? G->last + (size_t)x->l * (size_t)w : NULL,
                       *fb = x->r >= 0 ? G->first + (size_t)x->r * (size_t)w : NULL,
                       *lb = x->r >= 0 ? G->last + (size_t)x->r * (size_t)w : NULL;
        switch (x->op) {
        case X_EMPTY: G->nullable[t] = 1; break;
        case X_SYM:
            memcpy(G->cls[pos], x->cls, sizeof x->cls);
            f[pos >> 6] |= 1ull << (pos & 63);
            l[pos >> 6] |= 1ull << (pos & 63);
            pos++;
            break;
        case X_CAT:
            for (int p = 0; p < G->npos; p++)
                if (BIT(la, p)) set_or(G->follow + (size_t)p * (size_t)w, fb, w);
            set_or(f, fa, w);
            if (G->nullable[x->l]) set_or(f, fb, w);
            set_or(l, lb, w);
            if (G->nullable[x->r]) set_or(l, la, w);
            G->nullable[t] = G->nullable[x->l] && G->nullable[x->r];
            break;
        case X_ALT:
            set_or(f, fa, w), set_or(f, fb, w);
            set_or(l, la, w), set_or(l, lb, w);
            G->nullable[t] = G->nullable[x->l] || G->nullable[x->r];
            break;
        case X_STAR:
        case X_OPT:
            set_or(f, fa, w);
            set_or(l, la, w);
            if (x->op == X_STAR)
                for (int p = 0; p < G->npos; p++)
                    if (BIT(la, p)) set_or(G->follow + (size_t)p * (size_t)w, fa, w);
            G->nullable[t] = 1;
            break;
        }
    }
}

/* A position of an empty class ([^\s\S]): no symbol enters it (the start position is there already). */
static bool never_entered(const gl *G, int p) {
    if (p == G->npos) return false;
    for (int k = 0; k < 17; k++)
        if (G->cls[p][k]) return false;
    return true;
}

static uint64_t set_hash(const uint64_t *s, int w) {
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < w; i++) h = (h ^ s[i]) * 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 31);
}

/* The automaton of root: state 0 dead, 1 the start ({the start position}), then every nonempty set of live
 * positions reachable. */
static mr_status determinize(const char *pattern, gl *G, int root, mr__pat *re) {
    const int w = G->w, S0 = G->npos;
    const size_t W = (size_t)w;
    mr_status st = MR_OK;
    uint64_t *lastset = mr_calloc(W, 8), *live = mr_calloc(W, 8), *sym = mr_calloc(MR__RE_NSYM * W, 8),
             *sets = mr_calloc((MR__RE_MAXSTATES + 1) * W, 8), *fol = mr_calloc(W, 8), *t = mr_calloc(W, 8);
    const int hsize = 2 * 8192;
    int32_t *hash = mr_malloc(hsize * sizeof(int32_t));
    re->next = mr_malloc((size_t)MR__RE_NSYM * 64 * sizeof(int32_t));
    re->accept = mr_malloc(64);
    int cap = 64;
    if (!lastset || !live || !sym || !sets || !fol || !t || !hash || !re->next || !re->accept) {
        st = MR_ENOMEM;
        goto out;
    }
    memcpy(G->follow + (size_t)S0 * W, G->first + (size_t)root * W, W * 8);
    memcpy(lastset, G->last + (size_t)root * W, W * 8);
    if (G->nullable[root]) lastset[S0 >> 6] |= 1ull << (S0 & 63);
    for (int c = 0; c < MR__RE_NSYM; c++)
        for (int p = 0; p < G->npos; p++)
            if (G->cls[p][c >> 3] >> (c & 7) & 1) sym[(size_t)c * W + (size_t)(p >> 6)] |= 1ull << (p & 63);
    /* live: the positions from which a last one can be reached (a position of an empty class, [^\s\S], is
     * never entered) */
    for (int p = 0; p <= S0; p++)
        if (BIT(lastset, p) && !never_entered(G, p)) live[p >> 6] |= 1ull << (p & 63);
    for (bool grew = true; grew;) {
        grew = false;
        for (int p = 0; p <= S0; p++) {
            if (BIT(live, p) || never_entered(G, p)) continue;
            const uint64_t *fp = G->follow + (size_t)p * W;
            for (int i = 0; i < w; i++)
                if (fp[i] & live[i]) {
                    live[p >> 6] |= 1ull << (p & 63), grew = true;
                    break;
                }
        }
    }
    if (!BIT(live, S0)) {
        st = mr_error_set(MR_EINVAL, "pattern \"%.80s\" matches no string", pattern);
        goto out;
    }
    for (int i = 0; i < hsize; i++) hash[i] = -1;
    sets[1 * W + (size_t)(S0 >> 6)] = 1ull << (S0 & 63);
    hash[set_hash(sets + W, w) & (uint64_t)(hsize - 1)] = 1;
    int n = 2;
    for (int i = 0; i < n; i++) {
        const uint64_t *si = sets + (size_t)i * W;
        memset(fol, 0, W * 8);
        for (int p = 0; p <= S0; p++)
            if (BIT(si, p)) set_or(fol, G->follow + (size_t)p * W, w);
        re->accept[i] = 0;
        for (int k = 0; k < w; k++) re->accept[i] |= (si[k] & lastset[k]) != 0;
        for (int c = 0; c < MR__RE_NSYM; c++) {
            uint64_t any = 0;
            for (int k = 0; k < w; k++) any |= t[k] = fol[k] & sym[(size_t)c * W + (size_t)k] & live[k];
            int32_t to = 0;
            if (any) {
                uint64_t h = set_hash(t, w) & (uint64_t)(hsize - 1);
                while (hash[h] >= 0 && memcmp(sets + (size_t)hash[h] * W, t, W * 8)) h = (h + 1) & (uint64_t)(hsize - 1);
                if (hash[h] >= 0) {
                    to = hash[h];
                } else if (n == MR__RE_MAXSTATES) {
                    st = mr_error_set(MR_EINVAL, "pattern \"%.80s\": more than %d states once made deterministic",
                                      pattern, MR__RE_MAXSTATES);
                    goto out;
                } else {
                    memcpy(sets + (size_t)n * W, t, W * 8);
                    hash[h] = to = n++;
                }
            }
            if (n > cap) { /* the rows and flags of the states found so far */
                int ncap = cap * 2;
                int32_t *nx = mr_realloc(re->next, (size_t)ncap * MR__RE_NSYM * sizeof(int32_t));
                if (nx) re->next = nx;
                uint8_t *ac = nx ? mr_realloc(re->accept, (size_t)ncap) : NULL;
                if (ac) re->accept = ac;
                if (!nx || !ac) {
                    st = MR_ENOMEM;
                    goto out;
                }
                cap = ncap;
            }
            re->next[(size_t)i * MR__RE_NSYM + (size_t)c] = to;
        }
    }
    re->n_states = n;
out:
    mr_free(lastset), mr_free(live), mr_free(sym), mr_free(sets), mr_free(fol), mr_free(t), mr_free(hash);
    return st;
}

void mr__pat_free(mr__pat *re) {
    if (!re) return;
    mr_free(re->next);
    mr_free(re->accept);
    mr_free(re->len_nx);
    memset(re, 0, sizeof *re);
}

/* R_l, the states from which exactly l more characters can end in a match, for l = 0, 1, ...: R_0 the
 * accepting states, R_{l+1} those with a step into R_l. Each set is a function of the one before, so the
 * sequence repeats from its first set seen twice: R_{l+lam} = R_l for l >= mu. len_nx[s][q] is then the least
 * l >= q with s in R_l, found for q < mu + lam by a backward scan over mu + 2 lam sets (a whole period past
 * every q). */
mr_status mr__pat_lengths(mr__pat *re) {
    if (re->len_nx) return MR_OK;
    const int32_t N = re->n_states;
    const size_t W = ((size_t)N + 63) / 64;
    int32_t *off = mr_malloc(((size_t)N + 1) * sizeof(int32_t)), *to = mr_malloc((size_t)N * MR__RE_NSYM * sizeof(int32_t));
    uint64_t *seen = mr_calloc(W, 8), *R = NULL;
    int32_t *cur = mr_malloc((size_t)N * sizeof(int32_t)), *nx = NULL;
    int32_t *ht = NULL;
    size_t cap = 0, n = 0, hsize = 0; /* sets in R; slots of ht */
    mr_status st = off && to && seen && cur ? MR_OK : MR_ENOMEM;
    /* each state's distinct successors */
    for (int32_t s = 0, e = 0; !st && s < N; s++) {
        off[s] = e;
        memset(seen, 0, W * 8);
        for (int c = 0; c < MR__RE_NSYM; c++) {
            const int32_t t = re->next[(size_t)s * MR__RE_NSYM + (size_t)c];
            if (t && !(seen[t >> 6] >> (t & 63) & 1)) seen[t >> 6] |= 1ull << (t & 63), to[e++] = t;
        }
        off[s + 1] = e;
    }
    int64_t mu = -1, lam = 0;
    while (!st && mu < 0) {
        if ((n + 1) * (size_t)N > MR__RE_LEN_CELLS) {
            st = mr_error_set(MR_EINVAL, "the lengths of its matches repeat only after more than %zu characters", n);
            break;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            uint64_t *r2 = mr_realloc(R, cap * W * 8);
            if (!r2) {
                st = MR_ENOMEM;
                break;
            }
            R = r2;
        }
        uint64_t *r = R + n * W;
        memset(r, 0, W * 8);
        for (int32_t s = 1; s < N; s++) {
            bool in = n == 0 ? re->accept[s] != 0 : false;
            for (int32_t e = off[s]; n > 0 && e < off[s + 1] && !in; e++)
                in = R[(n - 1) * W + (size_t)(to[e] >> 6)] >> (to[e] & 63) & 1;
            if (in) r[s >> 6] |= 1ull << (s & 63);
        }
        if (2 * (n + 1) > hsize) { /* the sets seen, by hash: twice their number of slots */
            const size_t h2 = hsize ? 2 * hsize : 64;
            int32_t *t2 = mr_malloc(h2 * sizeof(int32_t));
            if (!t2) {
                st = MR_ENOMEM;
                break;
            }
            for (size_t i = 0; i < h2; i++) t2[i] = -1;
            for (size_t j = 0; j < n; j++) {
                size_t h = set_hash(R + j * W, (int)W) & (h2 - 1);
                while (t2[h] >= 0) h = (h + 1) & (h2 - 1);
                t2[h] = (int32_t)j;
            }
            mr_free(ht);
            ht = t2, hsize = h2;
        }
        size_t h = set_hash(r, (int)W) & (hsize - 1);
        while (ht[h] >= 0 && memcmp(R + (size_t)ht[h] * W, r, W * 8)) h = (h + 1) & (hsize - 1);
        if (ht[h] >= 0) mu = ht[h], lam = (int64_t)n - ht[h];
        else ht[h] = (int32_t)n;
        n++;
    }
    const int64_t P = mu + lam;
    if (!st && !(nx = mr_malloc((size_t)N * (size_t)P * sizeof(int32_t)))) st = MR_ENOMEM;
    if (!st) {
        for (int32_t s = 0; s < N; s++) cur[s] = INT32_MAX;
        for (int64_t l = P + lam - 1; l >= 0; l--) {
            const uint64_t *r = R + (size_t)(l < P ? l : l - lam) * W;
            for (int32_t s = 0; s < N; s++) {
                if (r[s >> 6] >> (s & 63) & 1) cur[s] = (int32_t)l;
                if (l < P) nx[(size_t)s * (size_t)P + (size_t)l] = cur[s];
            }
        }
        re->len_nx = nx, re->len_mu = (int32_t)mu, re->len_lam = (int32_t)lam;
    }
    mr_free(off);
    mr_free(to);
    mr_free(seen);
    mr_free(cur);
    mr_free(R);
    mr_free(ht);
    return st;
}

bool mr__pat_len_ok(const mr__pat *re, uint64_t s, int64_t n, int64_t lo, int64_t hi) {
    if (!re->len_nx) return true;
    if (hi >= 0 && n > hi) return false;
    const int64_t P = (int64_t)re->len_mu + re->len_lam, q = lo > n ? lo - n : 0;
    const int64_t q0 = q < P ? q : re->len_mu + (q - re->len_mu) % re->len_lam; /* the same place in the period */
    const int32_t l = re->len_nx[(size_t)s * (size_t)P + (size_t)q0];
    return l != INT32_MAX && (hi < 0 || (int64_t)l + (q - q0) <= hi - n);
}

/* [\s\S]*: any characters; -1 when out of room */
static int any_chars(parser *ps) {
    int s = mk(ps, X_SYM, -1, -1);
    if (s >= 0) cls_range(ps->x[s].cls, 0, 128);
    return s < 0 ? -1 : mk(ps, X_STAR, s, -1);
}

/* pattern (shown in messages as shown) without lookaheads */
static mr_status pat_plain(const char *pattern, const char *shown, mr__pat *re) {
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
    if (core >= 0 && !head) core = mk(ps, X_CAT, any_chars(ps), core);
    if (core >= 0 && !tail) {
        const int a = any_chars(ps);
        core = a < 0 ? -1 : mk(ps, X_CAT, core, a);
    }
    mr_status st = MR_OK;
    gl G = {0};
    if (core < 0) {
        st = mr_error_set(MR_EINVAL, "pattern \"%.80s\": %s", shown, err[0] ? err : "not understood");
        goto out;
    }
    for (int t = 0; t < ps->n; t++) G.npos += ps->x[t].op == X_SYM;
    if (G.npos > MR__RE_MAXPOS) {
        st = mr_error_set(MR_EINVAL, "pattern \"%.80s\": more than %d character positions once repetitions are "
                          "written out", shown, MR__RE_MAXPOS);
        goto out;
    }
    G.w = (G.npos + 1 + 63) / 64;
    G.follow = mr_calloc((size_t)(G.npos + 1) * (size_t)G.w, 8);
    G.first = mr_calloc((size_t)ps->n * (size_t)G.w, 8);
    G.last = mr_calloc((size_t)ps->n * (size_t)G.w, 8);
    G.nullable = mr_calloc((size_t)ps->n, 1);
    G.cls = mr_calloc((size_t)G.npos + 1, sizeof *G.cls);
    if (!G.follow || !G.first || !G.last || !G.nullable || !G.cls) {
        st = MR_ENOMEM;
        goto out;
    }
    positions(ps, &G);
    st = determinize(shown, &G, core, re);
out:
    mr_free(G.follow), mr_free(G.first), mr_free(G.last), mr_free(G.nullable), mr_free(G.cls);
    mr_free(ps);
    if (st) mr__pat_free(re);
    return st;
}

/* The states of the automaton of a ^(?!X)R pattern: pairs of a state of ^R's (never 0) and one of ^X's (0: X
 * can match no more); their index in the pairs found. */
typedef struct {
    int32_t *r, *x; /* [n] */
    int32_t n, cap, hsize;
    int32_t *hash; /* [hsize]: index or -1 */
} pairset;

static int32_t pair_id(pairset *P, int32_t r, int32_t x) {
    uint64_t h = ((uint64_t)(uint32_t)r * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uint32_t)x * 0xBF58476D1CE4E5B9ull) >> 20;
    for (h &= (uint64_t)(P->hsize - 1); P->hash[h] >= 0; h = (h + 1) & (uint64_t)(P->hsize - 1))
        if (P->r[P->hash[h]] == r && P->x[P->hash[h]] == x) return P->hash[h];
    if (P->n == P->cap) return -1;
    P->r[P->n] = r, P->x[P->n] = x;
    return P->hash[h] = P->n++;
}

/* ^(?!X)R (pydantic's Decimal: ^(?!^[-+.]*$)...): the matches of ^R of which ^X matches no prefix (the whole
 * string where X ends with $), as the product of the two automata, trimmed to the states from which a match can
 * follow (0 dead, 1 the start). R may hold further leading lookaheads; X may hold none. */
static mr_status pat_lookahead(const char *pattern, const char *shown, mr__pat *re) {
    memset(re, 0, sizeof *re);
    const char *x0 = pattern + 4, *p = x0;
    int depth = 1;
    for (bool cls = false; *p && depth; p++) { /* the group's end: escapes and classes skipped */
        if (*p == '\\' && p[1]) p++;
        else if (cls) cls = *p != ']';
        else if (*p == '[') cls = true, p += p[1] == '^', p += p[1] == ']';
        else depth += (*p == '(') - (*p == ')');
    }
    if (depth) return mr_error_set(MR_EINVAL, "pattern \"%.80s\": an unbalanced '('", shown);
    const size_t xl = (size_t)(p - 1 - x0) - (x0[0] == '^');
    char *xs = mr_malloc(xl + 2), *rs = mr_malloc(strlen(p) + 2);
    mr__pat X = {0}, R = {0};
    pairset P = {.cap = MR__RE_MAXSTATES * 4, .hsize = MR__RE_MAXSTATES * 8};
    P.r = mr_malloc((size_t)P.cap * sizeof(int32_t)), P.x = mr_malloc((size_t)P.cap * sizeof(int32_t));
    P.hash = mr_malloc((size_t)P.hsize * sizeof(int32_t));
    int32_t *next = NULL, *id = NULL;
    uint8_t *live = NULL;
    mr_status st = xs && rs && P.r && P.x && P.hash ? MR_OK : MR_ENOMEM;
    if (!st) {
        xs[0] = rs[0] = '^';
        memcpy(xs + 1, x0 + (x0[0] == '^'), xl), xs[xl + 1] = 0;
        strcpy(rs + 1, p);
        st = pat_plain(xs, shown, &X);
    }
    if (!st) st = !strncmp(rs, "^(?!", 4) ? pat_lookahead(rs, shown, &R) : pat_plain(rs, shown, &R);
    for (int32_t i = 0; !st && i < P.hsize; i++) P.hash[i] = -1;
    if (!st && (pair_id(&P, 0, 0) != 0 || pair_id(&P, (int32_t)MR__RE_START, (int32_t)MR__RE_START) != 1)) st = MR_ENOMEM;
    if (!st && !(next = mr_malloc((size_t)P.cap * MR__RE_NSYM * sizeof(int32_t)))) st = MR_ENOMEM;
    for (int32_t i = 1; !st && i < P.n; i++) /* breadth first over the pairs reached */
        for (int c = 0; c < MR__RE_NSYM && !st; c++) {
            const int32_t r = (int32_t)mr__pat_step(&R, (uint64_t)P.r[i], c);
            const int32_t x = P.x[i] ? (int32_t)mr__pat_step(&X, (uint64_t)P.x[i], c) : 0;
            const int32_t t = r ? pair_id(&P, r, x) : 0;
            if (t < 0) st = mr_error_set(MR_EINVAL, "pattern \"%.80s\": more than %d states beside its lookahead", shown, P.cap);
            next[(size_t)i * MR__RE_NSYM + (size_t)c] = t;
        }
    /* live: a match (R accepts, X has not matched) can still follow */
    if (!st && (!(live = mr_calloc((size_t)P.n, 1)) || !(id = mr_calloc((size_t)P.n, sizeof(int32_t))))) st = MR_ENOMEM;
    for (int32_t i = 1; !st && i < P.n; i++) live[i] = R.accept[P.r[i]] && !(P.x[i] && X.accept[P.x[i]]);
    for (bool grew = !st; grew;) {
        grew = false;
        for (int32_t i = 1; i < P.n; i++)
            for (int c = 0; c < MR__RE_NSYM && !live[i]; c++)
                if (live[next[(size_t)i * MR__RE_NSYM + (size_t)c]]) live[i] = 1, grew = true;
    }
    if (!st && !live[1]) st = mr_error_set(MR_EINVAL, "pattern \"%.80s\" matches no string", shown);
    int32_t n = 1;
    for (int32_t i = 1; !st && i < P.n; i++) id[i] = live[i] ? n++ : 0; /* the start stays 1 */
    if (!st && n > MR__RE_MAXSTATES)
        st = mr_error_set(MR_EINVAL, "pattern \"%.80s\": more than %d states once made deterministic", shown, MR__RE_MAXSTATES);
    if (!st && (!(re->next = mr_calloc((size_t)n * MR__RE_NSYM, sizeof(int32_t))) || !(re->accept = mr_calloc((size_t)n, 1))))
        st = MR_ENOMEM;
    for (int32_t i = 1; !st && i < P.n; i++) {
        if (!id[i]) continue;
        re->accept[id[i]] = R.accept[P.r[i]] && !(P.x[i] && X.accept[P.x[i]]);
        for (int c = 0; c < MR__RE_NSYM; c++) re->next[(size_t)id[i] * MR__RE_NSYM + (size_t)c] = id[next[(size_t)i * MR__RE_NSYM + (size_t)c]];
    }
    if (!st) re->n_states = n;
    else mr__pat_free(re);
    mr__pat_free(&X), mr__pat_free(&R);
    mr_free(xs), mr_free(rs), mr_free(P.r), mr_free(P.x), mr_free(P.hash), mr_free(next), mr_free(live), mr_free(id);
    return st;
}

mr_status mr__pat_compile(const char *pattern, mr__pat *re) {
    return !strncmp(pattern, "^(?!", 4) ? pat_lookahead(pattern, pattern, re) : pat_plain(pattern, pattern, re);
}
