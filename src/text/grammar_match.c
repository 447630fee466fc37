/* grammar_match.c — the byte matcher of a grammar (a pushdown automaton
 * over JSON), the vocabulary trie, and the token mask: one walk of the trie
 * per step, feeding each edge's byte to the matcher and undoing it on the
 * way back (a journal of the frames each byte changed), so that the cost is
 * the number of trie nodes whose bytes are a valid continuation.
 *
 * The matcher's state is a stack of frames, one per open value:
 *   root   free text up to opts.free_until (a = bytes of it matched), then
 *          whitespace, the value, done; a structural-tag grammar's root
 *          (grammar_tags.c) goes on instead in text (a = the triggers'
 *          automaton state, mask = a tag was written), begin (tags [a, b)
 *          still possible, n = bytes matched), whitespace, the tag's value
 *          (a = the tag from here on), end (n = bytes matched), text again
 *   object a = the next property that may come (declared properties, in
 *          order), b = the property whose value is open, n = the literal
 *          its discriminating property took
 *   array  n = items so far;  string n = characters so far, a / b / mask =
 *          the escape (\u escapes pair their surrogates) or UTF-8 sequence in
 *          progress;  number: its phase;
 *   literal  [a, b) the literals still possible, n = bytes matched
 *   key    mask = the declared properties whose key is still possible,
 *          n = bytes matched (with the opening quote)
 *   raw    (a regex grammar's text) re = the pattern's state, a / b = the
 *          UTF-8 sequence in progress
 *   cfg    (an EBNF grammar's text) re = the runtime's set (grammar_ebnf.c);
 *          its bytes are the grammar's own, UTF-8 by construction
 *   xblk   MiniMax-M2's tool-call block (G_XCALLS): a = invokes written,
 *          n = bytes of the tag in progress, mask = the tags it may be
 *   xinv   one <invoke>: a / b = the tools whose names are still possible,
 *          then re = the tool, b = its next declared parameter; n = bytes
 *          of the tag (or of "</parameter>" in raw text) in progress; mask =
 *          the tags or parameter names still possible, or in raw text what
 *          it reads as so far (null or not); a = the value's node
 * A value that ends on a byte of its own (a quote, a bracket, a literal
 * no other literal extends) pops at once; a number or a literal that could
 * still grow pops when the next byte is not its own and that byte goes to
 * the frame below. */
#include <string.h>

#include "text/grammar_internal.h"

enum { F_ROOT, F_OBJ, F_ARR, F_STR, F_NUM, F_LIT, F_KEY, F_RAW, F_CFG, F_XBLK, F_XINV };
enum { R_FREE, R_WS, R_VALUE, R_DONE, R_TEXT, R_BEGIN, R_END, R_LEAD };
enum { O_FIRST, O_KEY, O_COLON, O_VALWS, O_VAL, O_NEXT, O_COMMA };
enum { A_FIRST, A_VAL, A_NEXT, A_COMMA };
enum { S_CHARS, S_ESC, S_HEX, S_CONT, S_LOW1, S_LOW2 };
enum { N_START, N_SIGN, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };
enum { XB_WS, XB_LIT };
enum { XI_NAME, XI_WS, XI_LIT, XI_PNAME, XI_ANYNAME, XI_ANYGT, XI_RAW, XI_VAL, XI_PEND };

typedef struct {
    int32_t node;
    uint8_t kind, ph;
    uint16_t ws; /* whitespace bytes in a row, | WS_NL once one was a newline */
    int32_t a, b;
    int64_t n;
    uint64_t mask;
    uint64_t re; /* a patterned string: the pattern automaton's state */
} frame;

/* A journal entry: a frame as it was (s, i), a stack's depth and life (i -1), or the number of stacks (s -1,
 * in depth). */
typedef struct {
    int16_t s, i;
    int32_t depth;
    bool alive;
    frame f;
} jentry;

/* Unions whose alternatives may start alike (two objects, a string and an enum of strings) run as several
 * stacks side by side, one per alternative still possible (at most MAX_STACKS; past that the later
 * alternatives are dropped, which narrows the output and never lets a wrong one through). */
#define MAX_STACKS 8
#define RAW_CACHE 4
typedef struct {
    frame st[MR_GRAMMAR_MAX_DEPTH + 2];
    int depth;
    bool alive;
} mstack;

/* ---- the vocabulary trie ---- */
typedef struct {
    int32_t child, sib; /* first child, next sibling; -1 ends */
    int32_t tok;        /* first id whose bytes end here (tok_next chains the others); -1 none */
    uint8_t c;          /* the edge's byte */
} tnode;

enum { T_BYTES = 1, T_SPECIAL = 2 };

/* Three tries in one node array: every token with bytes (TR_ALL), the
 * tokens that are not plain string text (TR_STR: a quote, a backslash, a
 * control byte, or not whole UTF-8 characters; and the special tokens), and
 * the tokens holding a '<' (TR_LT). Inside a string the plain tokens are
 * allowed at once (bitset plain, their characters in chars[]) and only
 * TR_STR is walked; in free text before a "</think>"-like marker none of
 * which is matched yet, the tokens without '<' are (bitset nolt) and only
 * TR_LT is walked: the two states a model spends most tokens in cost a
 * walk of the few tokens that can change the state, not of the vocabulary. */
enum { TR_ALL, TR_STR, TR_LT, TR_COUNT };

struct mr_vocab_index {
    int32_t n_ids;
    tnode *nodes;
    int32_t n_nodes, cap_nodes;
    int32_t root[TR_COUNT];
    int32_t *tok_next[TR_COUNT]; /* [n_ids] each */
    uint8_t *flags;    /* [n_ids] T_* */
    uint32_t *off, *len; /* [n_ids] into pool */
    uint16_t *chars;   /* [n_ids] characters of a plain token */
    uint32_t *plain, *nolt, *nolt_text; /* [(n_ids + 31) / 32]; nolt_text: without '<' and not special */
    char *pool;
};

struct mr_matcher {
    const mr_grammar *g;
    const mr_vocab_index *v;
    mstack stk[MAX_STACKS];
    int n_stk, cur; /* stacks (compacted after every accepted token: the alive ones first); the one fed now */
    jentry *jr;
    size_t njr, cap_jr;
    bool oom, ended;
    bool no_ws; /* opts.no_whitespace */
    int32_t end[32];
    int n_end;
    char *until;      /* free_until, or NULL */
    int32_t *fail;    /* its KMP failure function */
    int32_t n_until;
    /* A regex grammar's text comes back to the same few states of its pattern (after every letter of
     * "[a-z ]+"): the masks of the last RAW_CACHE states, keyed by the raw frame's (re, a, b). */
    uint32_t *rc_bits; /* [RAW_CACHE][words], allocated at the first raw mask */
    uint64_t rc_re[RAW_CACHE];
    int32_t rc_a[RAW_CACHE], rc_b[RAW_CACHE];
    int64_t rc_count[RAW_CACHE];
    int rc_n, rc_next;
    mr__cfgrun *cfg; /* an EBNF grammar's runtime */
    int32_t cfg_start;
};

/* ---- frames, with the journal ---- */
#define ST(m) ((m)->stk[(m)->cur].st)
#define DEPTH(m) ((m)->stk[(m)->cur].depth)

static jentry *jnew(mr_matcher *m) {
    if (m->njr == m->cap_jr) {
        size_t c = m->cap_jr ? m->cap_jr * 2 : 256;
        jentry *q = mr_realloc(m->jr, c * sizeof *q);
        if (!q) return (m->oom = true), NULL;
        m->jr = q;
        m->cap_jr = c;
    }
    return &m->jr[m->njr++];
}

static bool journal(mr_matcher *m, int i) { /* frame i of the current stack */
    jentry *e = jnew(m);
    if (!e) return false;
    e->s = (int16_t)m->cur, e->i = (int16_t)i, e->f = ST(m)[i];
    return true;
}

static bool jhead(mr_matcher *m, int s) { /* a stack's depth and life */
    jentry *e = jnew(m);
    if (!e) return false;
    e->s = (int16_t)s, e->i = -1, e->depth = m->stk[s].depth, e->alive = m->stk[s].alive;
    return true;
}

static void undo(mr_matcher *m, size_t mark) {
    while (m->njr > mark) {
        const jentry *e = &m->jr[--m->njr];
        if (e->s < 0) {
            m->n_stk = e->depth;
        } else if (e->i < 0) {
            m->stk[e->s].depth = e->depth;
            m->stk[e->s].alive = e->alive;
        } else {
            m->stk[e->s].st[e->i] = e->f;
        }
    }
}

/* The top frame, writable (journaled). NULL when out of memory. */
static frame *top(mr_matcher *m) { return journal(m, DEPTH(m) - 1) ? &ST(m)[DEPTH(m) - 1] : NULL; }

static bool push(mr_matcher *m, frame f) {
    if (DEPTH(m) == MR_GRAMMAR_MAX_DEPTH + 2 || !jhead(m, m->cur) || !journal(m, DEPTH(m))) return false;
    ST(m)[DEPTH(m)++] = f;
    return true;
}

/* A copy of stack s for another alternative; -1 when there is no room. */
static int fork_stack(mr_matcher *m, int s) {
    if (m->n_stk == MAX_STACKS) return -1;
    jentry *e = jnew(m);
    if (!e) return -1;
    e->s = -1, e->i = -1, e->depth = m->n_stk;
    int t = m->n_stk++;
    m->stk[t].depth = m->stk[s].depth;
    m->stk[t].alive = true;
    memcpy(m->stk[t].st, m->stk[s].st, (size_t)m->stk[s].depth * sizeof(frame));
    return t;
}

static void kill_stack(mr_matcher *m, int s) {
    if (jhead(m, s)) m->stk[s].alive = false;
}

static bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* A whitespace byte in a frame that allows it: one more in the run, within the limits (bit 15 of ws: the
 * run has its newline). */
#define WS_NL 0x8000u
static bool take_ws(const mr_matcher *m, frame *f, uint8_t c) {
    if (m->no_ws || (f->ws & ~WS_NL) >= MR_GRAMMAR_MAX_WS) return false;
    if (c == '\n') {
        if (f->ws & WS_NL) return false;
        f->ws |= WS_NL;
    }
    f->ws++;
    return true;
}

static const mr__gnode *gnode(const mr_matcher *m, int32_t id) { return &m->g->nodes[id]; }

static bool tagged(const mr_matcher *m) { return m->g->nodes[m->g->root].kind == G_TAGS; }
static const char *tag_end(const mr_matcher *m, int32_t tag, size_t *len) { return mr__glit(m->g, m->g->tags[tag].end, len); }

/* The current stack holds a MiniMax-M2 parameter: a JSON value in its text, whose strings must not hold "</"
 * (the parser would end the value at a closing tag in them; "<\/" says the same in JSON). */
static bool in_xml(const mr_matcher *m) {
    for (int i = DEPTH(m) - 1; i > 0; i--)
        if (ST(m)[i].kind == F_XINV) return true;
    return false;
}
#define WS_XML 2u /* a string frame's ws: inside a MiniMax-M2 parameter (feed_str) */

/* A structural tag's end was written: free text again, or the output is over. */
static void tag_done(const mr_matcher *m, frame *f) {
    f->mask = 1, f->n = 0, f->ws = 0;
    if (m->g->tag_flags & MR__TAGS_STOP_AFTER_FIRST) f->ph = R_DONE;
    else f->ph = R_TEXT, f->a = 0;
}

static int64_t str_lo(const mr_matcher *m, const frame *f) { return f->node < 0 ? 0 : gnode(m, f->node)->lo; }
static int64_t str_hi(const mr_matcher *m, const frame *f) { return f->node < 0 ? -1 : gnode(m, f->node)->hi; }
static const mr__pat *str_re(const mr_matcher *m, const frame *f) {
    return f->node < 0 || gnode(m, f->node)->re < 0 ? NULL : &m->g->res[gnode(m, f->node)->re];
}

/* A patterned string's next character (symbol), its n-th; false when the pattern cannot go on with it, or
 * when no match of the string's allowed lengths could follow it. */
static bool re_take(const mr_matcher *m, frame *f, int sym, int64_t n) {
    const mr__pat *re = str_re(m, f);
    if (!re) return true;
    uint64_t s = mr__pat_step(re, f->re, sym);
    if (!s || !mr__pat_len_ok(re, s, n, str_lo(m, f), str_hi(m, f))) return false;
    f->re = s;
    return true;
}

/* The character a simple escape stands for (after the backslash), or -1. */
static int esc_value(uint8_t c) {
    switch (c) {
    case '"': return '"';
    case '\\': return '\\';
    case '/': return '/';
    case 'b': return '\b';
    case 'f': return '\f';
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    }
    return -1;
}

/* The value frame on top ended (info: the literal a literal took, the property a key named; else -1):
 * pops it and moves the frame below on. */
static bool child_done(mr_matcher *m, int32_t info) {
    if (!jhead(m, m->cur)) return false;
    DEPTH(m)--;
    frame *p = top(m);
    if (!p) return false;
    p->ws = 0;
    switch (p->kind) {
    case F_ROOT:
        if (!tagged(m)) {
            p->ph = R_DONE;
            return true;
        }
        size_t len;
        tag_end(m, p->a, &len);
        p->ph = R_END, p->n = 0;
        if (!len) tag_done(m, p);
        return true;
    case F_ARR:
        if (gnode(m, p->node)->bounds & G_UNIQUE) p->mask |= 1ull << (info - gnode(m, gnode(m, p->node)->a)->a);
        p->n++, p->ph = A_NEXT;
        return true;
    case F_XBLK: /* an invoke ended */
        p->a++, p->ph = XB_WS;
        return true;
    case F_XINV: /* a parameter's JSON value ended: its closing tag comes */
        p->ph = XI_PEND, p->n = 0;
        return true;
    case F_OBJ: {
        const mr__gnode *o = gnode(m, p->node);
        if (p->ph == O_KEY) {
            p->b = info;
            p->ph = O_COLON;
            return true;
        }
        if (p->b >= 0) {
            if (p->b == o->sel_from) p->n = info - gnode(m, m->g->props[o->a + o->sel_from].value)->a;
            p->a = p->b + 1;
        }
        p->ph = O_NEXT;
        return true;
    }
    default: return false;
    }
}

/* Some literal of [lo, hi) is not taken yet by an earlier item, when the literal frame on top of the current
 * stack is an item of an array of distinct values (uniqueItems; the array keeps the literals its items took,
 * by index within the literal node). */
static bool lit_free(const mr_matcher *m, int32_t lo, int32_t hi) {
    if (DEPTH(m) < 2) return lo < hi;
    const frame *p = &ST(m)[DEPTH(m) - 2], *f = &ST(m)[DEPTH(m) - 1];
    const uint64_t taken = p->kind == F_ARR && (gnode(m, p->node)->bounds & G_UNIQUE) ? p->mask : 0;
    if (!taken) return lo < hi;
    const int32_t base = gnode(m, f->node)->a;
    for (int32_t i = lo; i < hi; i++)
        if (!(taken >> (i - base) & 1)) return true;
    return false;
}

/* A literal frame whose candidates [a, b) share n bytes: ends when one is left and it is complete. */
static bool lit_settle(mr_matcher *m, const frame *f) {
    size_t len;
    mr__glit(m->g, f->a, &len);
    if (f->b - f->a == 1 && (int64_t)len == f->n) return child_done(m, f->a);
    return true;
}

/* Bounds of a number. The frame of a bounded number keeps its sign (b), the digits before the point as an
 * integer (n), and those after it as an integer (re) with their count (a; -1 before any point). A byte is
 * taken only when some number written with the new prefix is in range, so that the output never reaches a
 * number it cannot finish. Values are scaled by MR__NUM_UNIT (grammar_internal.h). */
static bool in_range(const mr__gnode *n, mr__i128 v) {
    return (!(n->bounds & 1) || v >= n->vlo) && (!(n->bounds & 2) || v <= n->vhi);
}

/* The magnitudes [lo, hi] of the given sign meet the range. */
static bool meets(const mr__gnode *n, bool neg, mr__i128 lo, mr__i128 hi) {
    mr__i128 vlo = neg ? -hi : lo, vhi = neg ? -lo : hi;
    return (!(n->bounds & 2) || vlo <= n->vhi) && (!(n->bounds & 1) || vhi >= n->vlo);
}

static mr__i128 pow10i(int k) {
    mr__i128 p = 1;
    while (k-- > 0) p *= 10;
    return p;
}

static int ndigits(int64_t v) {
    int d = 1;
    for (; v >= 10; v /= 10) d++;
    return d;
}

static mr__i128 num_value(const frame *f) {
    mr__i128 v = (mr__i128)f->n * MR__NUM_UNIT + (f->a > 0 ? (mr__i128)f->re * pow10i(MR__NUM_FRAC - f->a) : 0);
    return f->b ? -v : v;
}

/* Some number that starts with the frame's digits (one at least) is in range. */
static bool num_feasible(const mr__gnode *n, const frame *f) {
    const mr__i128 S = MR__NUM_UNIT;
    if (f->a >= 0) { /* after the point: [v, v + 10^(FRAC - a) - 1] */
        const mr__i128 u = pow10i(MR__NUM_FRAC - f->a), v = (mr__i128)f->n * S + (mr__i128)f->re * u;
        return meets(n, f->b, v, v + u - 1);
    }
    /* j more digits before the point: [p 10^j, (p + 1) 10^j) and, for a number, any fraction */
    const int more = f->ph == N_ZERO ? 0 : MR__NUM_INT - ndigits(f->n);
    const mr__i128 tail = n->kind == G_NUMBER ? 1 : S;
    mr__i128 p = f->n, w = 1;
    for (int j = 0; j <= more; j++, p *= 10, w *= 10)
        if (meets(n, f->b, p * S, (p + w) * S - tail)) return true;
    return false;
}

static int feed_num(mr_matcher *m, frame *f, uint8_t c);

/* The concrete nodes of node (itself, or a union's flattened alternatives) whose value may start with c,
 * at most max. */
static int pick_all(const mr_grammar *g, int32_t node, uint8_t c, int32_t *out, int max) {
    const mr__gnode *x = &g->nodes[node];
    if (x->kind != G_UNION) return mr__gpick(g, node, c) >= 0 && max > 0 ? (out[0] = node, 1) : 0;
    int n = 0;
    for (int32_t i = 0; i < x->b && n < max; i++)
        if (mr__gpick(g, g->alts[x->a + i], c) >= 0) out[n++] = g->alts[x->a + i];
    return n;
}

static bool start_concrete(mr_matcher *m, int32_t p, uint8_t c);
static bool feed_xblk(mr_matcher *m, frame *f, uint8_t c);

/* Starts a value of node with its first byte c (the frame below already expects it): each alternative
 * that may start so after the first gets a stack of its own. */
/* A value of node can end within the frames left above those in use (a node's need counts its own). */
static bool fits(const mr_matcher *m, int32_t node) {
    return node >= 0 && DEPTH(m) + gnode(m, node)->need <= MR_GRAMMAR_MAX_DEPTH + 2;
}

static bool start_value(mr_matcher *m, int32_t node, uint8_t c) {
    int32_t alt[MAX_STACKS];
    int na = pick_all(m->g, node, c, alt, MAX_STACKS);
    if (na == 0) return false;
    const int s = m->cur;
    for (int k = 1; k < na; k++) {
        int t = fork_stack(m, s);
        if (t < 0) break;
        m->cur = t;
        if (!start_concrete(m, alt[k], c)) kill_stack(m, t);
        m->cur = s;
    }
    return start_concrete(m, alt[0], c);
}

static bool start_concrete(mr_matcher *m, int32_t p, uint8_t c) {
    const mr__gnode *n = gnode(m, p);
    frame f = {.node = p, .a = 0, .b = -1};
    if (!fits(m, p)) return false;
    switch (n->kind) {
    case G_OBJECT: f.kind = F_OBJ, f.ph = O_FIRST; return push(m, f);
    case G_ARRAY: f.kind = F_ARR, f.ph = A_FIRST; return push(m, f);
    case G_STRING: f.kind = F_STR, f.ph = S_CHARS, f.re = MR__RE_START, f.ws = in_xml(m) ? WS_XML : 0; return push(m, f);
    case G_NUMBER:
    case G_INTEGER:
        f.kind = F_NUM, f.ph = N_START, f.b = 0;
        if (!push(m, f)) return false;
        return feed_num(m, &ST(m)[DEPTH(m) - 1], c) == 1; /* a fresh frame: nothing to journal */
    case G_XCALLS:
        f.kind = F_XBLK, f.ph = XB_WS, f.a = 0;
        if (!push(m, f)) return false;
        return feed_xblk(m, &ST(m)[DEPTH(m) - 1], c); /* a fresh frame: nothing to journal */
    case G_LITERALS: {
        int32_t lo = n->a, hi = n->a + n->b;
        size_t len;
        while (lo < hi && (uint8_t)mr__glit(m->g, lo, &len)[0] != c) lo++;
        int32_t e = lo;
        while (e < hi && (uint8_t)mr__glit(m->g, e, &len)[0] == c) e++;
        f.kind = F_LIT, f.a = lo, f.b = e, f.n = 1;
        if (!push(m, f) || !lit_free(m, lo, e)) return false;
        return lit_settle(m, &f);
    }
    default: return false;
    }
}

static bool accepting(const mr_matcher *m, const frame *f) {
    if (f->kind == F_NUM) {
        const mr__gnode *n = gnode(m, f->node);
        if (n->bounds && !in_range(n, num_value(f))) return false;
        return f->ph == N_ZERO || f->ph == N_INT || f->ph == N_FRAC || f->ph == N_EXP;
    }
    if (f->kind == F_RAW) return f->a == 0 && mr__pat_accepts(str_re(m, f), f->re);
    if (f->kind == F_CFG) return mr__cfg_accepts(m->cfg, (int32_t)f->re);
    if (f->kind == F_LIT) {
        size_t len;
        mr__glit(m->g, f->a, &len);
        return (int64_t)len == f->n;
    }
    return false;
}

static bool hexdig(uint8_t c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* A continuation byte of the UTF-8 sequence of a frame (a bytes to come, b the lead byte before the first of
 * them; no overlongs, no surrogates). */
static bool cont_ok(uint8_t lead, uint8_t c) { /* lead: the lead byte before the first one, else 0 */
    uint8_t lo = 0x80, up = 0xBF; /* the second byte's range after E0, ED, F0, F4 */
    if (lead == 0xE0) lo = 0xA0;
    else if (lead == 0xED) up = 0x9F;
    else if (lead == 0xF0) lo = 0x90;
    else if (lead == 0xF4) up = 0x8F;
    return c >= lo && c <= up;
}

static bool cont_byte(frame *f, uint8_t c) {
    if (!cont_ok((uint8_t)f->b, c)) return false;
    f->b = 0;
    f->a--;
    return true;
}

/* One byte of a string's content. A patterned string feeds its automaton one symbol per character (the
 * ASCII byte, MR__RE_NONASCII at the lead byte of any other), takes no \\u escapes, and a backslash only
 * where some simple escape's character can come. */
static bool feed_str(mr_matcher *m, frame *f, uint8_t c) {
    int64_t hi = str_hi(m, f);
    const mr__pat *re = str_re(m, f);
    switch (f->ph) {
    case S_CHARS: /* ws: WS_XML inside a MiniMax-M2 parameter, | 1 after a '<' */
        if (c == '"') return f->n >= str_lo(m, f) && (!re || mr__pat_accepts(re, f->re)) ? child_done(m, -1) : false;
        if (c < 0x20 || (c >= 0x80 && c < 0xC2) || c > 0xF4) return false;
        if (hi >= 0 && f->n >= hi) return false;
        if (f->ws) {
            if (c == '/' && (f->ws & 1)) return false;
            f->ws = (uint16_t)(WS_XML | (c == '<'));
        }
        if (c == '\\') {
            bool any = !re;
            for (const char *e = "\"\\/bfnrt"; *e && !any; e++) {
                const uint64_t s = mr__pat_step(re, f->re, esc_value((uint8_t)*e));
                any = s && mr__pat_len_ok(re, s, f->n + 1, str_lo(m, f), hi);
            }
            if (!any) return false;
            f->n++;
            f->ph = S_ESC;
            return true;
        }
        if (!re_take(m, f, c < 0x80 ? c : MR__RE_NONASCII, f->n + 1)) return false;
        f->n++;
        if (c >= 0x80) f->ph = S_CONT, f->a = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1, f->b = c;
        return true;
    case S_ESC:
        if (c == 'u') return re ? false : ((f->ph = S_HEX, f->a = 4, f->b = 0, f->mask = 0), true);
        if (!c || esc_value(c) < 0 || !re_take(m, f, esc_value(c), f->n)) return false; /* counted at the backslash */
        f->ph = S_CHARS;
        return true;
    case S_HEX: /* b: the code unit so far; mask 1: this is the low half of a surrogate pair */
        if (!hexdig(c)) return false;
        f->b = f->b * 16 + (c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
        if (--f->a) { /* the values this prefix can still become: no dead end at the last digit */
            int32_t v0 = f->b << (4 * f->a), v1 = v0 + (1 << (4 * f->a)) - 1;
            return f->mask ? v1 >= 0xDC00 && v0 <= 0xDFFF : !(v0 >= 0xDC00 && v1 <= 0xDFFF);
        }
        if (f->mask) {
            if (f->b < 0xDC00 || f->b > 0xDFFF) return false;
        } else if (f->b >= 0xDC00 && f->b <= 0xDFFF) {
            return false; /* a low surrogate alone */
        } else if (f->b >= 0xD800 && f->b <= 0xDBFF) {
            return (f->ph = S_LOW1), true; /* a high one: its low half must follow */
        }
        f->ph = S_CHARS;
        return true;
    case S_LOW1: return c == '\\' ? (f->ph = S_LOW2, true) : false;
    case S_LOW2: return c == 'u' ? (f->ph = S_HEX, f->a = 4, f->b = 0, f->mask = 1, true) : false;
    case S_CONT:
        if (!cont_byte(f, c)) return false;
        if (f->a == 0) f->ph = S_CHARS;
        return true;
    }
    return false;
}

/* One byte of a regex grammar's raw text: whole UTF-8 characters, each one symbol of the pattern. */
static bool feed_raw(mr_matcher *m, frame *f, uint8_t c) {
    if (f->a > 0) return cont_byte(f, c);
    if ((c >= 0x80 && c < 0xC2) || c > 0xF4 || !re_take(m, f, c < 0x80 ? c : MR__RE_NONASCII, 0)) return false;
    if (c >= 0x80) f->a = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1, f->b = c;
    return true;
}

/* One byte of an EBNF grammar's text. */
static bool feed_cfg(mr_matcher *m, frame *f, uint8_t c) {
    const int32_t s = mr__cfg_step(m->cfg, (int32_t)f->re, c);
    if (s < 0) m->oom = true; /* a limit: mr_matcher_accept says which */
    if (s <= 0) return false;
    f->re = (uint64_t)s;
    return true;
}

/* An unbounded number's magnitude below 10^MR__NUM_MAG (its integer digits plus its exponent at most this):
 * every such number reads as a finite double (DBL_MAX is 1.8e308), where 1e999 reads as infinity in most
 * JSON readers (Python's, JavaScript's; pydantic refuses it) */
#define MR__NUM_MAG 308

/* One byte of a number; 1 taken, 0 refused, -1 the number ended before it. A bounded number has no
 * exponent and at most MR__NUM_INT / MR__NUM_FRAC digits before / after its point; an unbounded one stays
 * below 10^MR__NUM_MAG (n: its integer digits, a leading zero not counted; in the exponent, a: its sign is
 * '-', re: its value so far, held at 10^6). */
static int feed_num(mr_matcher *m, frame *f, uint8_t c) {
    const mr__gnode *node = gnode(m, f->node);
    const bool dig = c >= '0' && c <= '9', real = node->kind == G_NUMBER, bounded = node->bounds != 0;
    switch (f->ph) {
    case N_START:
    case N_SIGN:
        if (f->ph == N_START && c == '-')
            return !(node->bounds & 1) || node->vlo <= 0 ? (f->ph = N_SIGN, f->b = 1, 1) : 0;
        if (!dig) return 0;
        f->n = c - '0', f->a = -1, f->re = 0;
        f->ph = c == '0' ? N_ZERO : N_INT;
        if (!bounded) f->n = c != '0';
        return !bounded || num_feasible(node, f);
    case N_ZERO:
    case N_INT:
        if (dig) {
            if (f->ph == N_ZERO) return 0;
            if (!bounded) return real && f->n == MR__NUM_MAG ? 0 : (f->n++, 1);
            if (ndigits(f->n) == MR__NUM_INT) return 0;
            f->n = f->n * 10 + (c - '0');
            return num_feasible(node, f);
        }
        if (real && c == '.') return f->ph = N_DOT, f->a = 0, !bounded || num_feasible(node, f);
        if (real && !bounded && (c == 'e' || c == 'E')) return f->ph = N_E, f->a = 0, f->re = 0, 1;
        return bounded && !in_range(node, num_value(f)) ? 0 : -1;
    case N_DOT:
    case N_FRAC:
        if (dig) {
            f->ph = N_FRAC;
            if (!bounded) return 1;
            if (f->a == MR__NUM_FRAC) return 0;
            f->re = f->re * 10 + (uint64_t)(c - '0'), f->a++;
            return num_feasible(node, f);
        }
        if (f->ph == N_DOT) return 0;
        if (!bounded && (c == 'e' || c == 'E')) return f->ph = N_E, f->a = 0, f->re = 0, 1;
        return bounded && !in_range(node, num_value(f)) ? 0 : -1;
    case N_E:
    case N_ESIGN:
    case N_EXP:
        if (f->ph == N_E && (c == '+' || c == '-')) return f->ph = N_ESIGN, f->a = c == '-', 1;
        if (!dig) return f->ph == N_EXP ? -1 : 0;
        f->ph = N_EXP;
        f->re = f->re * 10 + (uint64_t)(c - '0');
        if (f->re > 1000000) f->re = 1000000;
        return f->a || (int64_t)f->n + (int64_t)f->re <= MR__NUM_MAG;
    }
    return 0;
}

/* Declared properties that may be named next: from the cursor up to the first required one (an optional one
 * whose value would not fit above the object's frame left out; a required one always fits, the object's
 * need counted it). */
static uint64_t key_candidates(const mr_matcher *m, const frame *f) {
    const mr__gnode *o = gnode(m, f->node);
    uint64_t mask = 0;
    for (int32_t i = f->a; i < o->b; i++) {
        const mr__gprop *p = &m->g->props[o->a + i];
        if (p->required || i == o->sel_prop || fits(m, p->value)) mask |= 1ull << i;
        if (p->required) break;
    }
    return mask;
}

static bool required_left(const mr_matcher *m, const frame *f) {
    const mr__gnode *o = gnode(m, f->node);
    for (int32_t i = f->a; i < o->b; i++)
        if (m->g->props[o->a + i].required) return true;
    return false;
}

static int32_t value_node(const mr_matcher *m, const frame *f) {
    const mr__gnode *o = gnode(m, f->node);
    if (f->b < 0) return o->addl;
    if (f->b == o->sel_prop) return m->g->sels[o->sel_first + f->n];
    return m->g->props[o->a + f->b].value;
}

/* The opening quote of a key (after '{' or ','). */
static bool start_key(mr_matcher *m, frame *f, uint8_t c) {
    const mr__gnode *o = gnode(m, f->node);
    if (c != '"') return false;
    f->ph = O_KEY;
    if (o->b == 0)
        return fits(m, o->addl) && push(m, (frame){.kind = F_STR, .ph = S_CHARS, .node = m->g->string, .ws = in_xml(m) ? WS_XML : 0});
    uint64_t mask = key_candidates(m, f);
    return mask && push(m, (frame){.kind = F_KEY, .node = f->node, .mask = mask, .n = 1});
}

static bool feed_obj(mr_matcher *m, frame *f, uint8_t c) {
    const mr__gnode *o = gnode(m, f->node);
    bool declared = o->b > 0;
    if (is_ws(c)) return take_ws(m, f, c);
    f->ws = 0;
    switch (f->ph) {
    case O_FIRST:
        if (c == '}') return declared && required_left(m, f) ? false : child_done(m, -1);
        return start_key(m, f, c);
    case O_NEXT:
        if (c == '}') return declared && required_left(m, f) ? false : child_done(m, -1);
        if (c != ',' || (declared && !key_candidates(m, f)) || (!declared && !fits(m, o->addl))) return false;
        f->ph = O_COMMA;
        return true;
    case O_COMMA: return start_key(m, f, c);
    case O_COLON:
        if (c != ':') return false;
        f->ph = O_VALWS;
        return true;
    case O_VALWS:
        f->ph = O_VAL;
        return start_value(m, value_node(m, f), c);
    default: return false;
    }
}

/* The node of an array's item i: a tuple's own, then the items node (-1: no item i; the count's bounds
 * keep it from being asked for). */
static int32_t item_node(const mr_matcher *m, const mr__gnode *a, int64_t i) {
    return i < a->b ? m->g->alts[a->addl + i] : a->a;
}

static bool feed_arr(mr_matcher *m, frame *f, uint8_t c) {
    const mr__gnode *a = gnode(m, f->node);
    if (is_ws(c)) return take_ws(m, f, c);
    f->ws = 0;
    switch (f->ph) {
    case A_FIRST:
        if (c == ']') return f->n >= a->lo ? child_done(m, -1) : false;
        if (a->hi == 0) return false;
        f->ph = A_VAL;
        return start_value(m, item_node(m, a, f->n), c);
    case A_NEXT:
        if (c == ']') return f->n >= a->lo ? child_done(m, -1) : false;
        if (c != ',' || (a->hi >= 0 && f->n >= a->hi) || !fits(m, item_node(m, a, f->n))) return false;
        f->ph = A_COMMA;
        return true;
    case A_COMMA:
        f->ph = A_VAL;
        return start_value(m, item_node(m, a, f->n), c);
    default: return false;
    }
}

static bool feed_key(mr_matcher *m, frame *f, uint8_t c) {
    const mr__gnode *o = gnode(m, f->node);
    uint64_t keep = 0;
    int32_t done = -1;
    for (uint64_t mk = f->mask; mk; mk &= mk - 1) {
        int i = __builtin_ctzll(mk);
        size_t len;
        const char *k = mr__glit(m->g, m->g->props[o->a + i].key, &len);
        if ((int64_t)len > f->n && (uint8_t)k[f->n] == c) {
            keep |= 1ull << i;
            if ((int64_t)len == f->n + 1) done = i;
        }
    }
    if (!keep) return false;
    f->mask = keep;
    f->n++;
    return done >= 0 ? child_done(m, done) : true; /* a key ends in its quote: no key extends another */
}

/* Candidate i's literal: literal i itself, tag i's begin, tool i's NAME">. */
typedef int32_t (*lit_of_fn)(const mr_grammar *g, int32_t i);
static int32_t lit_self(const mr_grammar *g, int32_t i) { return (void)g, i; }
static int32_t lit_tag_begin(const mr_grammar *g, int32_t i) { return g->tags[i].begin; }
static int32_t lit_tool_name(const mr_grammar *g, int32_t i) { return g->xtools[i].name; }

static bool lit_byte_is(const mr_grammar *g, int32_t lit, int64_t n, uint8_t c) {
    size_t len;
    const char *s = mr__glit(g, lit, &len);
    return (int64_t)len > n && (uint8_t)s[n] == c;
}

/* Of candidates [*lo, *hi), sorted by their literals, which share their first n bytes: the range whose
 * literal goes on with c as byte n (empty when none does). */
static void narrow(const mr_grammar *g, lit_of_fn lit, int32_t *lo, int32_t *hi, int64_t n, uint8_t c) {
    int32_t a = *lo, e;
    while (a < *hi && !lit_byte_is(g, lit(g, a), n, c)) a++;
    for (e = a; e < *hi && lit_byte_is(g, lit(g, e), n, c);) e++;
    *lo = a, *hi = e;
}

static bool feed_lit(mr_matcher *m, frame *f, uint8_t c, bool *refeed) {
    int32_t lo = f->a, e = f->b;
    narrow(m->g, lit_self, &lo, &e, f->n, c);
    if (lo == e) { /* no literal goes on with c: the value ends before it, if one is complete (and free) */
        if (!accepting(m, f) || !lit_free(m, f->a, f->a + 1)) return false;
        *refeed = true;
        return child_done(m, f->a);
    }
    if (!lit_free(m, lo, e)) return false;
    f->a = lo, f->b = e, f->n++;
    return lit_settle(m, f);
}

/* ---- MiniMax-M2's tool-call block (G_XCALLS, grammar_tags.c) ---- */
static const char XL_INVOKE[] = "<invoke name=\"", XL_BLOCK_END[] = "</minimax:tool_call>", XL_PARAM[] = "<parameter name=\"",
                  XL_INVOKE_END[] = "</invoke>", XL_PARAM_END[] = "</parameter>";

/* Tags [0, 2) by the bits of mask that go on with c as their byte n: the bits left (0: none). */
static uint64_t tags_step(const char *const tags[2], uint64_t mask, int64_t n, uint8_t c) {
    for (int i = 0; i < 2; i++)
        if ((mask >> i & 1) && (uint8_t)tags[i][n] != c) mask &= ~(1ull << i);
    return mask;
}

static bool feed_xblk(mr_matcher *m, frame *f, uint8_t c) {
    static const char *const TAGS[2] = {XL_INVOKE, XL_BLOCK_END};
    const mr__gnode *x = gnode(m, f->node);
    if (f->ph == XB_WS) {
        if (is_ws(c)) return take_ws(m, f, c);
        f->ph = XB_LIT, f->n = 0;
        f->mask = (uint64_t)(x->hi < 0 || f->a < x->hi) | (uint64_t)(f->a > 0) << 1;
    }
    f->mask = tags_step(TAGS, f->mask, f->n, c);
    if (!f->mask) return false;
    f->n++;
    if ((f->mask & 1) && f->n == (int64_t)sizeof XL_INVOKE - 1) {
        f->ph = XB_WS, f->ws = 0;
        return push(m, (frame){.kind = F_XINV, .node = f->node, .ph = XI_NAME, .a = x->a, .b = x->a + x->b});
    }
    if ((f->mask & 2) && f->n == (int64_t)sizeof XL_BLOCK_END - 1) return child_done(m, -1);
    return true;
}

enum { NS_LEAD, NS_N, NS_NU, NS_NUL, NS_NULL, NS_NULL_WS, NS_OTHER }; /* raw text so far, as "null" reads it */

static uint64_t null_step(uint64_t st, uint8_t c) {
    const uint8_t l = (uint8_t)(c | 0x20);
    switch (st) {
    case NS_LEAD: return is_ws(c) ? NS_LEAD : l == 'n' ? NS_N : NS_OTHER;
    case NS_N: return l == 'u' ? NS_NU : NS_OTHER;
    case NS_NU: return l == 'l' ? NS_NUL : NS_OTHER;
    case NS_NUL: return l == 'l' ? NS_NULL : NS_OTHER;
    case NS_NULL:
    case NS_NULL_WS: return is_ws(c) ? NS_NULL_WS : NS_OTHER;
    default: return NS_OTHER;
    }
}

static const mr__gxtool *xtool_of(const mr_matcher *m, const frame *f) { return &m->g->xtools[f->re]; }

/* After a parameter (or the name): the tags that may come next. */
static uint64_t xinv_next(const mr_matcher *m, const frame *f) {
    const mr__gxtool *t = xtool_of(m, f);
    if (!t->strict) return 3;
    bool req_left = false;
    for (int32_t i = f->b; i < t->pb && !req_left; i++) req_left = m->g->props[t->pa + i].required;
    return (uint64_t)(f->b < t->pb) | (uint64_t)!req_left << 1;
}

static bool feed_xinv(mr_matcher *m, frame *f, uint8_t c) {
    static const char *const TAGS[2] = {XL_PARAM, XL_INVOKE_END};
    const mr_grammar *g = m->g;
    size_t len;
    switch (f->ph) {
    case XI_NAME: { /* the tools [a, b) whose NAME"> goes on with c */
        int32_t lo = f->a, e = f->b;
        narrow(g, lit_tool_name, &lo, &e, f->n, c);
        if (lo == e) return false;
        f->a = lo, f->b = e, f->n++;
        mr__glit(g, g->xtools[lo].name, &len);
        if ((int64_t)len == f->n) f->re = (uint64_t)lo, f->b = 0, f->ph = XI_WS, f->ws = 0; /* '>' ends it: one left */
        return true;
    }
    case XI_WS:
        if (is_ws(c)) return take_ws(m, f, c);
        f->ph = XI_LIT, f->n = 0, f->mask = xinv_next(m, f);
        /* fall through */
    case XI_LIT:
        f->mask = tags_step(TAGS, f->mask, f->n, c);
        if (!f->mask) return false;
        f->n++;
        if ((f->mask & 2) && f->n == (int64_t)sizeof XL_INVOKE_END - 1) return child_done(m, -1);
        if ((f->mask & 1) && f->n == (int64_t)sizeof XL_PARAM - 1) {
            const mr__gxtool *t = xtool_of(m, f);
            f->n = 0;
            if (!t->strict) {
                f->ph = XI_ANYNAME;
                return true;
            }
            f->ph = XI_PNAME, f->mask = 0; /* the declared parameters from the next one up to the next required one */
            for (int32_t i = f->b; i < t->pb; i++) {
                f->mask |= 1ull << i;
                if (g->props[t->pa + i].required) break;
            }
        }
        return true;
    case XI_PNAME: {
        const mr__gxtool *t = xtool_of(m, f);
        int32_t done = -1;
        for (int32_t i = 0; i < t->pb; i++) {
            if (!(f->mask >> i & 1)) continue;
            const char *k = mr__glit(g, g->props[t->pa + i].key, &len);
            if ((int64_t)len <= f->n || (uint8_t)k[f->n] != c) f->mask &= ~(1ull << i);
            else if ((int64_t)len == f->n + 1) done = i;
        }
        if (!f->mask) return false;
        f->n++;
        if (done < 0) return true;
        const int32_t v = g->props[t->pa + done].value; /* KEY"> ends it: one left */
        f->b = done + 1, f->n = 0;
        if (v == XV_TEXT || v == XV_TEXT_NULL) f->ph = XI_RAW, f->mask = NS_LEAD, f->a = v == XV_TEXT_NULL; /* the text's state */
        else f->ph = XI_VAL, f->a = v;
        return true;
    }
    case XI_ANYNAME:
        if (c == '"' && f->n > 0) return (f->ph = XI_ANYGT), true;
        if (c == '"' || c == '<' || c == '>' || c == '\n') return false;
        f->n++;
        return true;
    case XI_ANYGT:
        if (c != '>') return false;
        f->ph = XI_RAW, f->n = 0, f->mask = NS_LEAD, f->a = 1;
        return true;
    case XI_RAW: { /* text up to "</parameter>"; the parser also ends it at "</invoke>" and "</minimax:tool_call>",
                      so those never come inside (none of the three has a border: a mismatch starts over) */
        static const char *const ENDS[3] = {XL_PARAM_END, XL_INVOKE_END, XL_BLOCK_END};
        uint64_t ns = f->mask & 0xFF, cand = f->mask >> 8;
        if (f->n > 0) {
            for (int i = 0; i < 3; i++)
                if ((cand >> i & 1) && (uint8_t)ENDS[i][f->n] != c) cand &= ~(1ull << i);
            if (cand) {
                f->n++;
                if ((cand & 1) && f->n == (int64_t)sizeof XL_PARAM_END - 1) {
                    if (!f->a && (ns == NS_NULL || ns == NS_NULL_WS)) return false; /* would read as null */
                    f->ph = XI_WS, f->ws = 0, f->n = 0;
                    return true;
                }
                if (((cand & 2) && f->n == (int64_t)sizeof XL_INVOKE_END - 1) ||
                    ((cand & 4) && f->n == (int64_t)sizeof XL_BLOCK_END - 1))
                    return false;
                f->mask = ns | cand << 8;
                return true;
            }
            ns = NS_OTHER; /* the "</..." so far was text */
        }
        f->n = c == '<';
        f->mask = (f->n ? ns : null_step(ns, c)) | (uint64_t)(f->n ? 7 : 0) << 8;
        return true;
    }
    case XI_VAL:
        f->ph = XI_PEND, f->n = 0;
        return start_value(m, f->a, c);
    case XI_PEND:
        if ((uint8_t)XL_PARAM_END[f->n] != c) return false;
        if (++f->n == (int64_t)sizeof XL_PARAM_END - 1) f->ph = XI_WS, f->ws = 0, f->n = 0;
        return true;
    default: return false;
    }
}

/* A regex or EBNF grammar's text is open from the start (it may be empty): the root frame f holds it as its
 * value. */
static bool open_raw(mr_matcher *m, frame *f) {
    const int kind = gnode(m, m->g->root)->kind;
    if (kind == G_TAGS) {
        f->ph = m->g->tag_flags & MR__TAGS_NO_TEXT ? R_LEAD : R_TEXT, f->a = 0, f->mask = 0, f->ws = 0;
        return true;
    }
    if (kind != G_REGEX && kind != G_CFG) return true;
    f->ph = R_VALUE;
    if (kind == G_CFG) return push(m, (frame){.kind = F_CFG, .node = m->g->root, .re = (uint64_t)m->cfg_start});
    return push(m, (frame){.kind = F_RAW, .node = m->g->root, .re = MR__RE_START});
}

/* The begins of tags [a, b) share n bytes: once one is left and whole, its value comes. */
static bool begin_settle(const mr_matcher *m, frame *f) {
    size_t len;
    mr__glit(m->g, m->g->tags[f->a].begin, &len);
    if (f->b - f->a == 1 && (int64_t)len == f->n) f->ph = R_WS, f->ws = 0;
    return true;
}

static bool feed_root(mr_matcher *m, frame *f, uint8_t c) {
    switch (f->ph) {
    case R_FREE: {
        int32_t k = f->a;
        while (k > 0 && (uint8_t)m->until[k] != c) k = m->fail[k - 1];
        if ((uint8_t)m->until[k] == c) k++;
        f->a = k;
        if (k == m->n_until) f->ph = R_WS, f->ws = 0;
        return k < m->n_until || open_raw(m, f);
    }
    case R_WS:
        if (is_ws(c) && !m->g->raw) return take_ws(m, f, c);
        f->ph = R_VALUE;
        return start_value(m, tagged(m) ? m->g->tags[f->a].value : m->g->root, c);
    case R_TEXT: {
        const int32_t s = m->g->ac_next[(size_t)f->a * 256 + c], t = m->g->ac_fire[s];
        f->a = s;
        if (t < 0) return true;
        const mr__gtrig *x = &m->g->trigs[t]; /* a trigger was written: its tags' begins go on */
        f->ph = R_BEGIN, f->a = x->lo, f->b = x->hi, f->n = x->len;
        return begin_settle(m, f);
    }
    case R_LEAD: /* whitespace, then a tag's begin at once */
        if (is_ws(c)) return take_ws(m, f, c);
        f->ph = R_BEGIN, f->a = 0, f->b = m->g->n_tags, f->n = 0;
        /* fall through */
    case R_BEGIN: {
        int32_t lo = f->a, e = f->b;
        narrow(m->g, lit_tag_begin, &lo, &e, f->n, c);
        if (lo == e) return false;
        f->a = lo, f->b = e, f->n++;
        return begin_settle(m, f);
    }
    case R_END: {
        size_t len;
        const char *e = tag_end(m, f->a, &len);
        if (f->n < (int64_t)len && (uint8_t)e[f->n] == c) {
            if (++f->n == (int64_t)len) tag_done(m, f);
            return true;
        }
        return f->n == 0 && is_ws(c) && !is_ws((uint8_t)e[0]) && take_ws(m, f, c);
    }
    default: return false;
    }
}

/* One byte on the current stack: its top frame takes it (a number or literal that ends hands it down). */
static bool feed_stack(mr_matcher *m, uint8_t c) {
    for (;;) {
        frame *f = top(m);
        if (!f) return false;
        bool refeed = false, ok;
        switch (f->kind) {
        case F_ROOT: return feed_root(m, f, c);
        case F_OBJ: return feed_obj(m, f, c);
        case F_ARR: return feed_arr(m, f, c);
        case F_STR: return feed_str(m, f, c);
        case F_KEY: return feed_key(m, f, c);
        case F_RAW: return feed_raw(m, f, c);
        case F_CFG: return feed_cfg(m, f, c);
        case F_XBLK: return feed_xblk(m, f, c);
        case F_XINV: return feed_xinv(m, f, c);
        case F_NUM: {
            int r = feed_num(m, f, c);
            if (r >= 0) return r == 1;
            if (!child_done(m, -1)) return false;
            continue;
        }
        case F_LIT:
            ok = feed_lit(m, f, c, &refeed);
            if (!ok || !refeed) return ok;
            continue;
        default: return false;
        }
    }
}

/* One byte on every live stack; a stack that refuses it dies. False when none is left. */
static bool feed(mr_matcher *m, uint8_t c) {
    const int n0 = m->n_stk; /* the stacks forked by this byte have taken it already */
    bool any = false;
    for (int s = 0; s < n0; s++) {
        if (!m->stk[s].alive) continue;
        m->cur = s;
        if (feed_stack(m, c)) any = true;
        else kill_stack(m, s);
    }
    for (int s = n0; s < m->n_stk; s++) any |= m->stk[s].alive;
    m->cur = 0;
    return any && !m->oom;
}

static bool frame_eq(const frame *a, const frame *b) {
    return a->node == b->node && a->kind == b->kind && a->ph == b->ph && a->ws == b->ws && a->a == b->a &&
           a->b == b->b && a->n == b->n && a->mask == b->mask && a->re == b->re;
}

/* After a token: the live stacks first, repeats (two alternatives that reached the same state) dropped. */
static void compact(mr_matcher *m) {
    int k = 0;
    for (int s = 0; s < m->n_stk; s++) {
        const mstack *x = &m->stk[s];
        bool dup = !x->alive;
        for (int t = 0; t < k && !dup; t++) {
            const mstack *y = &m->stk[t];
            dup = y->depth == x->depth;
            for (int i = 0; i < x->depth && dup; i++) dup = frame_eq(&x->st[i], &y->st[i]);
        }
        if (dup) continue;
        if (k != s) {
            m->stk[k].depth = x->depth;
            m->stk[k].alive = true;
            memcpy(m->stk[k].st, x->st, (size_t)x->depth * sizeof(frame));
        }
        k++;
    }
    m->n_stk = k;
}

/* ---- the matcher ---- */
mr_status mr_matcher_new(const mr_grammar *g, const mr_vocab_index *v, const mr_matcher_opts *o, mr_matcher **out) {
    *out = NULL;
    if (o && o->n_end > 32) return mr_error_set(MR_EINVAL, "matcher: more than 32 end ids");
    mr_matcher *m = mr_calloc(1, sizeof *m);
    if (!m) return MR_ENOMEM;
    m->g = g;
    m->v = v;
    m->no_ws = o && o->no_whitespace;
    m->stk[0].st[0] = (frame){.kind = F_ROOT, .ph = R_WS, .node = g->root};
    m->stk[0].depth = 1;
    m->stk[0].alive = true;
    m->n_stk = 1;
    if (o && o->n_end) memcpy(m->end, o->end_ids, (size_t)o->n_end * sizeof(int32_t)), m->n_end = o->n_end;
    if (g->nodes[g->root].kind == G_CFG) {
        mr_status st = mr__cfgrun_new(g->cfg, &m->cfg, &m->cfg_start);
        if (st) {
            mr_matcher_free(m);
            return st;
        }
    }
    if (o && o->free_until && o->free_until[0]) {
        size_t n = strlen(o->free_until);
        m->until = mr_malloc(n + 1);
        m->fail = mr_malloc(n * sizeof(int32_t));
        if (!m->until || !m->fail) {
            mr_matcher_free(m);
            return MR_ENOMEM;
        }
        memcpy(m->until, o->free_until, n + 1);
        m->n_until = (int32_t)n;
        m->fail[0] = 0;
        for (int32_t i = 1, k = 0; i < (int32_t)n; i++) {
            while (k > 0 && m->until[i] != m->until[k]) k = m->fail[k - 1];
            if (m->until[i] == m->until[k]) k++;
            m->fail[i] = k;
        }
        m->stk[0].st[0].ph = R_FREE;
    } else if (!open_raw(m, &m->stk[0].st[0])) {
        mr_matcher_free(m);
        return MR_ENOMEM;
    }
    m->njr = 0;
    *out = m;
    return MR_OK;
}

void mr_matcher_free(mr_matcher *m) {
    if (!m) return;
    mr_free(m->jr);
    mr_free(m->until);
    mr_free(m->fail);
    mr_free(m->rc_bits);
    mr__cfgrun_free(m->cfg);
    mr_free(m);
}

bool mr_matcher_complete(const mr_matcher *m) {
    if (m->ended) return false;
    for (int s = 0; s < m->n_stk; s++) {
        const mstack *k = &m->stk[s];
        if (!k->alive) continue;
        const frame *r = &k->st[0];
        if (k->depth == 1 && r->ph == R_DONE) return true;
        if (k->depth == 1 && r->ph == R_TEXT && (r->mask || !(m->g->tag_flags & MR__TAGS_AT_LEAST_ONE))) return true;
        if (k->depth == 2 && r->ph == R_VALUE && accepting(m, &k->st[1])) {
            if (!tagged(m)) return true;
            size_t len; /* a tag's value that its end (empty) closes */
            tag_end(m, r->a, &len);
            if (!len) return true;
        }
    }
    return false;
}

bool mr_matcher_ended(const mr_matcher *m) { return m->ended; }

/* An EBNF grammar's runtime past its tidy size keeps the current state alone (its set ids change: the
 * frame's is renewed, the cached masks go). Between tokens only, where the single stack is root + cfg. */
static void cfg_tidy(mr_matcher *m) {
    if (!m->cfg || m->n_stk != 1 || m->stk[0].depth != 2 || m->stk[0].st[1].kind != F_CFG) return;
    frame *f = &m->stk[0].st[1];
    const int32_t s = mr__cfg_tidy(m->cfg, (int32_t)f->re);
    if (s == (int32_t)f->re) return;
    if (s < 0) {
        m->stk[0].alive = false; /* out of memory: nothing more can be read */
        return;
    }
    f->re = (uint64_t)s;
    m->rc_n = m->rc_next = 0;
}

bool mr_matcher_feed(mr_matcher *m, const char *bytes, size_t n) {
    if (m->ended) return n == 0;
    if (m->cfg) mr__cfg_budget(m->cfg, MR__CFG_BUDGET);
    size_t mark = m->njr;
    for (size_t i = 0; i < n; i++)
        if (!feed(m, (uint8_t)bytes[i])) {
            undo(m, mark);
            return false;
        }
    m->njr = mark; /* kept: the journal is only for undoing */
    compact(m);
    cfg_tidy(m);
    return true;
}

/* Free text before the grammar or between structural tags, or a tag's begin or end (only one stack then). */
static bool free_now(const mr_matcher *m) {
    const int ph = m->stk[0].st[0].ph;
    return m->stk[0].depth == 1 && (ph == R_FREE || ph == R_TEXT || ph == R_BEGIN || ph == R_END || ph == R_LEAD);
}

/* Special tokens may come: in free text, a structural tag's begin or end, and between MiniMax-M2's invokes
 * (whose block ends with one). */
static bool specials_now(const mr_matcher *m) {
    const mstack *k = &m->stk[0];
    return free_now(m) || k->st[k->depth - 1].kind == F_XBLK;
}

static bool is_end(const mr_matcher *m, int32_t id) {
    for (int i = 0; i < m->n_end; i++)
        if (m->end[i] == id) return true;
    return false;
}

mr_status mr_matcher_accept(mr_matcher *m, int32_t token) {
    if (is_end(m, token)) {
        if (!m->ended && !mr_matcher_complete(m))
            return mr_error_set(MR_EINPUT, "structured output: the output ended before the grammar was complete");
        m->ended = true;
        return MR_OK;
    }
    const mr_vocab_index *v = m->v;
    if (token < 0 || token >= v->n_ids || !(v->flags[token] & T_BYTES) || m->ended)
        return mr_error_set(MR_EINPUT, "structured output: token %d cannot come here", (int)token);
    if ((v->flags[token] & T_SPECIAL) && !specials_now(m))
        return mr_error_set(MR_EINPUT, "structured output: special token %d inside the structured part", (int)token);
    if (!mr_matcher_feed(m, v->pool + v->off[token], v->len[token])) {
        if (m->oom && m->cfg && mr__cfg_full(m->cfg))
            return (m->oom = false), mr_error_set(MR_ENOMEM, "structured output: the grammar's parse is too ambiguous "
                                                  "here (past the matcher's limits on parse stacks and states)");
        if (m->oom) return (m->oom = false), mr_error_set(MR_ENOMEM, "structured output: out of memory");
        return mr_error_set(MR_EINPUT, "structured output: token %d does not fit the grammar here", (int)token);
    }
    return MR_OK;
}

static void dfs(mr_matcher *m, const int32_t *next, int32_t node, bool specials, uint32_t *allow) {
    const mr_vocab_index *v = m->v;
    for (int32_t ch = v->nodes[node].child; ch >= 0; ch = v->nodes[ch].sib) {
        size_t mark = m->njr;
        if (feed(m, v->nodes[ch].c)) {
            for (int32_t t = v->nodes[ch].tok; t >= 0; t = next[t])
                if (!(v->flags[t] & T_SPECIAL) || specials) allow[t >> 5] |= 1u << (t & 31);
            if (v->nodes[ch].child >= 0) dfs(m, next, ch, specials, allow);
        }
        undo(m, mark);
    }
}

/* Text through a pattern's automaton alone, down the whole trie: one table lookup a byte where the matcher's
 * feed would journal frames. A walk state is the automaton's state, the UTF-8 sequence in progress (pend
 * bytes to come after lead) and the characters so far.
 *   raw (a regex grammar's text): every byte is text; a token may end inside a character (the next one
 *     finishes it), special tokens never come;
 *   else (inside a patterned JSON string): only plain text (no quote, backslash or control byte), up to hi
 *     characters (-1: any), and only plain tokens (whole characters) are marked; the others go through the
 *     matcher (the TR_STR trie). */
typedef struct {
    const mr_vocab_index *v;
    const mr__pat *re;
    int64_t lo, hi;
    bool raw;
    uint32_t *allow;
} rewalk;

static void walk_re(const rewalk *w, int32_t node, uint64_t st, int pend, uint8_t lead, int64_t chars) {
    const mr_vocab_index *v = w->v;
    for (int32_t ch = v->nodes[node].child; ch >= 0; ch = v->nodes[ch].sib) {
        const uint8_t c = v->nodes[ch].c;
        uint64_t s2 = st;
        int p2 = pend;
        uint8_t l2 = lead;
        int64_t n2 = chars;
        if (pend > 0) { /* a continuation byte */
            if (!cont_ok(lead, c)) continue;
            p2 = pend - 1, l2 = 0;
        } else {
            if ((c >= 0x80 && c < 0xC2) || c > 0xF4) continue;
            if (!w->raw && (c < 0x20 || c == '"' || c == '\\')) continue;
            if (w->hi >= 0 && chars >= w->hi) continue;
            if (!(s2 = mr__pat_step(w->re, st, c < 0x80 ? c : MR__RE_NONASCII))) continue;
            n2 = chars + 1;
            if (!mr__pat_len_ok(w->re, s2, n2, w->lo, w->hi)) continue;
            if (c >= 0x80) p2 = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1, l2 = c;
        }
        for (int32_t t = v->nodes[ch].tok; t >= 0; t = v->tok_next[TR_ALL][t]) {
            const bool ok = w->raw ? !(v->flags[t] & T_SPECIAL) : (p2 == 0 && (v->plain[t >> 5] >> (t & 31) & 1));
            if (ok) w->allow[t >> 5] |= 1u << (t & 31);
        }
        if (v->nodes[ch].child >= 0) walk_re(w, ch, s2, p2, l2, n2);
    }
}

/* An EBNF grammar's text down the whole trie: one cached step a byte (the runtime's sets are the states of a
 * lazily built automaton); special tokens never come. */
static void walk_cfg(mr_matcher *m, int32_t node, int32_t set, uint32_t *allow) {
    const mr_vocab_index *v = m->v;
    for (int32_t ch = v->nodes[node].child; ch >= 0; ch = v->nodes[ch].sib) {
        const int32_t s2 = mr__cfg_step(m->cfg, set, v->nodes[ch].c);
        if (s2 <= 0) continue;
        for (int32_t t = v->nodes[ch].tok; t >= 0; t = v->tok_next[TR_ALL][t])
            if (!(v->flags[t] & T_SPECIAL)) allow[t >> 5] |= 1u << (t & 31);
        if (v->nodes[ch].child >= 0) walk_cfg(m, ch, s2, allow);
    }
}

/* The frame whose state keys the mask cache: a regex or EBNF grammar's raw text (the only stack: root + raw
 * frame), or a structural-tag grammar's free text (the root alone, in text: its automaton state and whether
 * a tag was written); NULL when the state is not one of those. */
static const frame *cache_frame(const mr_matcher *m) {
    if (m->ended || m->n_stk != 1) return NULL;
    const mstack *k = &m->stk[0];
    if (k->depth == 2 && (k->st[1].kind == F_RAW || k->st[1].kind == F_CFG)) return &k->st[1];
    if (k->depth == 1 && k->st[0].ph == R_TEXT) return &k->st[0];
    return NULL;
}
static uint64_t cache_key(const frame *f) { return f->kind == F_ROOT ? f->mask : f->re; }

/* The cached mask of the state (cache_frame), -1 when not cached yet, -2 when not cacheable. */
static int raw_cached(const mr_matcher *m) {
    const frame *f = cache_frame(m);
    if (!f) return -2;
    for (int i = 0; i < m->rc_n; i++)
        if (m->rc_re[i] == cache_key(f) && m->rc_a[i] == f->a && m->rc_b[i] == f->b) return i;
    return -1;
}

int64_t mr_matcher_mask(mr_matcher *m, uint32_t *allow) {
    const mr_vocab_index *v = m->v;
    const size_t words = (size_t)(v->n_ids + 31) / 32;
    const int hit = raw_cached(m);
    if (hit >= 0) {
        memcpy(allow, m->rc_bits + (size_t)hit * words, words * sizeof(uint32_t));
        return m->rc_count[hit];
    }
    memset(allow, 0, words * sizeof(uint32_t));
    if (m->cfg) mr__cfg_budget(m->cfg, MR__CFG_BUDGET);
    if (!m->ended) {
        const mstack *k0 = &m->stk[0]; /* compacted: one stack, or the fast paths are off */
        const frame *f = &k0->st[k0->depth - 1];
        const bool one = m->n_stk == 1, free_start = free_now(m);
        int tr = TR_ALL;
        if (one && free_start && f->a == 0 &&
            (f->ph == R_FREE ? m->until[0] == '<' : f->ph == R_TEXT && m->g->trig_lt)) { /* free text, no '<' yet: those without one go on */
            memcpy(allow, v->nolt, words * sizeof(uint32_t));
            tr = TR_LT;
        } else if (one && f->kind == F_XINV && f->ph == XI_RAW && f->n == 0) { /* a parameter's raw text, no '<' yet */
            memcpy(allow, v->nolt_text, words * sizeof(uint32_t));
            tr = TR_LT;
        } else if (one && f->kind == F_CFG && !free_start) { /* an EBNF grammar's text */
            walk_cfg(m, v->root[TR_ALL], (int32_t)f->re, allow);
            tr = -1;
        } else if (one && f->kind == F_RAW && f->a == 0 && !free_start) { /* a regex grammar's text */
            const rewalk w = {.v = v, .re = str_re(m, f), .lo = 0, .hi = -1, .raw = true, .allow = allow};
            walk_re(&w, v->root[TR_ALL], f->re, 0, 0, 0);
            tr = -1;
        } else if (one && f->kind == F_STR && f->ph == S_CHARS && str_re(m, f) && !in_xml(m)) { /* patterned string text */
            const rewalk w = {.v = v, .re = str_re(m, f), .lo = str_lo(m, f), .hi = str_hi(m, f), .raw = false, .allow = allow};
            walk_re(&w, v->root[TR_ALL], f->re, 0, 0, f->n);
            tr = TR_STR;
        } else if (one && f->kind == F_STR && f->ph == S_CHARS && !str_re(m, f) && !in_xml(m)) { /* string text: the plain tokens that fit */
            const int64_t hi = str_hi(m, f);
            if (hi < 0) {
                memcpy(allow, v->plain, words * sizeof(uint32_t));
            } else {
                for (int32_t t = 0; t < v->n_ids; t++)
                    if ((v->plain[t >> 5] >> (t & 31) & 1) && f->n + v->chars[t] <= hi) allow[t >> 5] |= 1u << (t & 31);
            }
            tr = TR_STR;
        }
        if (tr >= 0) {
            size_t mark = m->njr;
            dfs(m, v->tok_next[tr], v->root[tr], specials_now(m), allow);
            undo(m, mark);
            m->oom = false;
        }
    }
    if (m->cfg && mr__cfg_full(m->cfg)) { /* the walk was cut short: no mask, and the output cannot go on */
        memset(allow, 0, words * sizeof(uint32_t));
        return -1;
    }
    const bool end_ok = m->ended || mr_matcher_complete(m);
    for (int i = 0; i < m->n_end; i++) { /* the end ids: only where the output may end */
        int32_t t = m->end[i];
        if (t < 0 || t >= v->n_ids) continue;
        if (end_ok) allow[t >> 5] |= 1u << (t & 31);
        else allow[t >> 5] &= ~(1u << (t & 31));
    }
    int64_t count = 0;
    for (size_t w = 0; w < words; w++) count += __builtin_popcount(allow[w]);
    if (hit == -1 && (m->rc_bits || (m->rc_bits = mr_malloc(RAW_CACHE * words * sizeof(uint32_t))))) {
        const int i = m->rc_n < RAW_CACHE ? m->rc_n++ : (m->rc_next++ % RAW_CACHE); /* the oldest goes */
        const frame *f = cache_frame(m);
        m->rc_re[i] = cache_key(f), m->rc_a[i] = f->a, m->rc_b[i] = f->b, m->rc_count[i] = count;
        memcpy(m->rc_bits + (size_t)i * words, allow, words * sizeof(uint32_t));
    }
    return count;
}

/* ---- the vocabulary index ---- */
static int32_t trie_child(mr_vocab_index *v, int32_t node, uint8_t c) {
    for (int32_t ch = v->nodes[node].child; ch >= 0; ch = v->nodes[ch].sib)
        if (v->nodes[ch].c == c) return ch;
    if (v->n_nodes == v->cap_nodes) {
        int32_t cap = v->cap_nodes * 2;
        tnode *q = mr_realloc(v->nodes, (size_t)cap * sizeof *q);
        if (!q) return -1;
        v->nodes = q;
        v->cap_nodes = cap;
    }
    int32_t id = v->n_nodes++;
    v->nodes[id] = (tnode){.child = -1, .sib = v->nodes[node].child, .tok = -1, .c = c};
    v->nodes[node].child = id;
    return id;
}

static bool trie_add(mr_vocab_index *v, int tr, int32_t id, const char *b, size_t n) {
    int32_t node = v->root[tr];
    for (size_t k = 0; k < n && node >= 0; k++) node = trie_child(v, node, (uint8_t)b[k]);
    if (node < 0) return false;
    v->tok_next[tr][id] = v->nodes[node].tok;
    v->nodes[node].tok = id;
    return true;
}

/* Whole UTF-8 characters (mr_utf8_check's rules, the matcher's too), no control byte, quote or backslash:
 * the number of characters, or -1. */
static int64_t plain_chars(const uint8_t *b, size_t n) {
    if (mr_utf8_check((const char *)b, n) != n) return -1;
    int64_t chars = 0;
    for (size_t i = 0; i < n; i++) {
        if (b[i] < 0x20 || b[i] == '"' || b[i] == '\\') return -1;
        chars += (b[i] & 0xC0) != 0x80; /* a character starts at each byte but continuation bytes */
    }
    return chars;
}

/* The nodes renumbered in depth-first order (a node, then its first child's subtree, then the next child's):
 * the mask's walks visit them in that order, so they read the array forward instead of chasing links across
 * it (the order the tokens were added in). */
static bool trie_layout(mr_vocab_index *v) {
    const int32_t nn = v->n_nodes;
    int32_t *pos = mr_malloc((size_t)nn * sizeof(int32_t)), *stack = mr_malloc((size_t)nn * sizeof(int32_t));
    tnode *nodes = mr_malloc((size_t)nn * sizeof(tnode));
    if (!pos || !stack || !nodes) {
        mr_free(pos), mr_free(stack), mr_free(nodes);
        return false;
    }
    int32_t k = 0;
    for (int r = 0; r < TR_COUNT; r++) {
        int32_t sp = 0;
        stack[sp++] = v->root[r];
        while (sp) {
            const int32_t x = stack[--sp];
            pos[x] = k++;
            if (v->nodes[x].sib >= 0 && x != v->root[r]) stack[sp++] = v->nodes[x].sib;
            if (v->nodes[x].child >= 0) stack[sp++] = v->nodes[x].child;
        }
    }
    for (int32_t x = 0; x < nn; x++) {
        tnode t = v->nodes[x];
        t.child = t.child >= 0 ? pos[t.child] : -1;
        t.sib = t.sib >= 0 ? pos[t.sib] : -1;
        nodes[pos[x]] = t;
    }
    for (int r = 0; r < TR_COUNT; r++) v->root[r] = pos[v->root[r]];
    mr_free(v->nodes);
    v->nodes = nodes;
    v->cap_nodes = nn;
    mr_free(pos), mr_free(stack);
    return true;
}

mr_status mr_vocab_index_from_bytes(const char *const *bytes, const size_t *len, const bool *special, int32_t n,
                                    mr_vocab_index **out) {
    *out = NULL;
    if (n <= 0) return mr_error_set(MR_EINVAL, "vocabulary index: no tokens");
    mr_vocab_index *v = mr_calloc(1, sizeof *v);
    if (!v) return MR_ENOMEM;
    size_t total = 0, words = (size_t)(n + 31) / 32;
    for (int32_t i = 0; i < n; i++) total += bytes[i] ? len[i] : 0;
    v->n_ids = n;
    bool ok = true;
    for (int k = 0; k < TR_COUNT; k++) ok &= (v->tok_next[k] = mr_malloc((size_t)n * sizeof(int32_t))) != NULL;
    v->flags = mr_calloc((size_t)n, 1);
    v->off = mr_malloc((size_t)n * sizeof(uint32_t));
    v->len = mr_malloc((size_t)n * sizeof(uint32_t));
    v->chars = mr_calloc((size_t)n, sizeof(uint16_t));
    v->plain = mr_calloc(words, sizeof(uint32_t));
    v->nolt = mr_calloc(words, sizeof(uint32_t));
    v->nolt_text = mr_calloc(words, sizeof(uint32_t));
    v->pool = mr_malloc(total + 1);
    v->cap_nodes = 1024;
    v->nodes = mr_malloc((size_t)v->cap_nodes * sizeof(tnode));
    mr_status st = MR_OK;
    if (!ok || !v->flags || !v->off || !v->len || !v->chars || !v->plain || !v->nolt || !v->nolt_text || !v->pool || !v->nodes ||
        total > UINT32_MAX) {
        st = total > UINT32_MAX ? mr_error_set(MR_EINVAL, "vocabulary index: over 4 GiB of token bytes") : MR_ENOMEM;
        goto out;
    }
    for (int k = 0; k < TR_COUNT; k++) {
        v->root[k] = k;
        v->nodes[k] = (tnode){.child = -1, .sib = -1, .tok = -1};
    }
    v->n_nodes = TR_COUNT;
    size_t at = 0;
    for (int32_t i = 0; i < n; i++) {
        for (int k = 0; k < TR_COUNT; k++) v->tok_next[k][i] = -1;
        v->off[i] = (uint32_t)at;
        v->len[i] = 0;
        if (!bytes[i] || !len[i]) continue;
        memcpy(v->pool + at, bytes[i], len[i]);
        v->len[i] = (uint32_t)len[i];
        at += len[i];
        const bool sp = special && special[i];
        v->flags[i] = (uint8_t)(T_BYTES | (sp ? T_SPECIAL : 0));
        const int64_t chars = sp ? -1 : plain_chars((const uint8_t *)bytes[i], len[i]);
        const bool lt = memchr(bytes[i], '<', len[i]) != NULL;
        if (chars >= 0 && chars <= UINT16_MAX) {
            v->plain[i >> 5] |= 1u << (i & 31);
            v->chars[i] = (uint16_t)chars;
        }
        if (!lt) v->nolt[i >> 5] |= 1u << (i & 31);
        if (!lt && !sp) v->nolt_text[i >> 5] |= 1u << (i & 31);
        if (!trie_add(v, TR_ALL, i, bytes[i], len[i]) ||
            ((chars < 0 || chars > UINT16_MAX) && !trie_add(v, TR_STR, i, bytes[i], len[i])) ||
            (lt && !trie_add(v, TR_LT, i, bytes[i], len[i]))) {
            st = MR_ENOMEM;
            goto out;
        }
    }
    if (!trie_layout(v)) st = MR_ENOMEM;
out:
    if (st) {
        mr_vocab_index_free(v);
        return st;
    }
    *out = v;
    return MR_OK;
}

mr_status mr_vocab_index_new(const mr_tokenizer *t, mr_vocab_index **out) {
    int32_t n = mr_tokenizer_id_limit(t);
    const char **b = mr_malloc((size_t)(n > 0 ? n : 1) * sizeof(char *));
    size_t *len = mr_malloc((size_t)(n > 0 ? n : 1) * sizeof(size_t));
    bool *sp = mr_malloc((size_t)(n > 0 ? n : 1));
    mr_status st = MR_ENOMEM;
    if (b && len && sp) {
        for (int32_t i = 0; i < n; i++) {
            b[i] = mr_tokenizer_id_to_bytes(t, i, &len[i]);
            sp[i] = mr_tokenizer_is_special(t, i);
        }
        st = mr_vocab_index_from_bytes(b, len, sp, n, out);
    }
    mr_free(b);
    mr_free(len);
    mr_free(sp);
    return st;
}

void mr_vocab_index_free(mr_vocab_index *v) {
    if (!v) return;
    mr_free(v->nodes);
    for (int k = 0; k < TR_COUNT; k++) mr_free(v->tok_next[k]);
    mr_free(v->chars);
    mr_free(v->plain);
    mr_free(v->nolt);
    mr_free(v->nolt_text);
    mr_free(v->flags);
    mr_free(v->off);
    mr_free(v->len);
    mr_free(v->pool);
    mr_free(v);
}

int32_t mr_vocab_index_size(const mr_vocab_index *v) { return v->n_ids; }
