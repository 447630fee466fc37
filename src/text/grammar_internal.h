/* grammar_internal.h — private to grammar_compile.c (schema -> nodes) and
 * grammar_match.c (the byte matcher, the vocabulary trie, the token mask).
 *
 * A grammar is a graph of nodes, each a kind of JSON value:
 *   G_OBJECT    props [a, a + b) of g->props in output order; addl: the value
 *               node of any other key (-1: none; only when b == 0);
 *               sel_prop >= 0: that property's value node is
 *               g->sels[sel_first + k], k the literal (within the literal
 *               node) that property sel_from took (tool calls: the
 *               parameters follow the name)
 *   G_ARRAY     items node a, lo .. hi items (hi -1: no limit); a tuple's
 *               first b items by their own nodes [addl, addl + b) of g->alts
 *               (a -1: none after them, hi <= b); bounds G_UNIQUE: the items
 *               (a G_LITERALS node of at most 64) are distinct
 *   G_STRING    lo .. hi characters (hi -1: no limit); re >= 0: the content
 *               matches g->res[re] (pattern, format)
 *   G_NUMBER, G_INTEGER  bounds: bit 0, vlo <= the value; bit 1, the value
 *               <= vhi; both in units of 10^-MR__NUM_FRAC (exact: a decimal
 *               written with at most that many digits after the point is
 *               in range exactly when its scaled value is). A bounded value
 *               is written without an exponent, with at most MR__NUM_INT
 *               digits before the point and MR__NUM_FRAC after it
 *   G_LITERALS  literals [a, a + b) of g->lits, sorted bytewise, distinct:
 *               the value is exactly one of them
 *   G_UNION     alternatives [a, a + b) of g->alts; once the graph is built,
 *               the concrete (non-union) nodes under it, each once
 *   G_REGEX     raw text (the root of a regex grammar) that g->res[re]
 *               matches whole
 *   G_CFG       raw text (the root of an EBNF grammar) that g->cfg matches
 *   G_TAGS      free text with tagged values (the root of a structural-tag
 *               grammar): g->tags, found by g->trigs through the automaton
 *               g->ac_next (grammar_tags.c)
 *   G_XCALLS    MiniMax-M2's tool calls after "<minimax:tool_call>": invokes
 *               of g->xtools [a, a + b) (sorted by name), at most hi (-1:
 *               any), then "</minimax:tool_call>" (grammar_tags.c)
 * Node ids are int32; a $ref is its target's node (recursion is a cycle). */
#ifndef MR_TEXT_GRAMMAR_INTERNAL_H
#define MR_TEXT_GRAMMAR_INTERNAL_H

#include "moerun/grammar.h"

typedef enum { G_PENDING = 0, G_OBJECT, G_ARRAY, G_STRING, G_NUMBER, G_INTEGER, G_LITERALS, G_UNION, G_REGEX, G_CFG, G_TAGS, G_XCALLS } mr__gkind;

#define G_UNIQUE 4 /* bounds of an array: uniqueItems */
__extension__ typedef __int128 mr__i128;
#define MR__NUM_INT 18  /* digits before the point of a bounded number (scaled, below 10^36) */
#define MR__NUM_FRAC 18 /* digits after it */
#define MR__NUM_UNIT ((mr__i128)1000000000000000000) /* 10^MR__NUM_FRAC */

typedef struct {
    uint8_t kind;
    uint8_t bounds;
    int32_t a, b;
    int64_t lo, hi;
    mr__i128 vlo, vhi;
    int32_t addl;
    int32_t sel_from, sel_prop, sel_first;
    int32_t re;
    int32_t need; /* the matcher's frames that a value of this node takes to end, its own counted (finish) */
} mr__gnode;

/* A pattern as a deterministic automaton (grammar_pattern.c): a state is an
 * index, MR__RE_START before anything is read, 0 the dead state (no match
 * can follow); symbols are the ASCII bytes and MR__RE_NONASCII for any other
 * character. */
#define MR__RE_MAXPOS 1024   /* character positions once repetitions are written out */
#define MR__RE_MAXSTATES 4096 /* states of the automaton */
#define MR__RE_NONASCII 128
#define MR__RE_NSYM 129
#define MR__RE_START 1u
typedef struct {
    int32_t n_states;
    int32_t *next;   /* [n_states][MR__RE_NSYM] */
    uint8_t *accept; /* [n_states] */
    /* The lengths of the matches that can follow each state (mr__pat_lengths; NULL until made): len_nx[s][q],
     * q < len_mu + len_lam, is the least l >= q such that some l more characters lead from s to a match
     * (INT32_MAX: none); past len_mu these repeat every len_lam characters. */
    int32_t *len_nx;
    int32_t len_mu, len_lam;
} mr__pat;
mr_status mr__pat_compile(const char *pattern, mr__pat *re);
void mr__pat_free(mr__pat *re);
/* Makes re's length table (for a pattern beside minLength / maxLength); MR_EINVAL where it would take more
 * than MR__RE_LEN_CELLS cells. */
#define MR__RE_LEN_CELLS (1 << 20)
mr_status mr__pat_lengths(mr__pat *re);
/* With the table made: whether some match of lo .. hi characters in all (hi -1: no limit) can still follow
 * state s after n characters; always true without the table. */
bool mr__pat_len_ok(const mr__pat *re, uint64_t s, int64_t n, int64_t lo, int64_t hi);
/* The state after one symbol; 0 when no match can follow. */
static inline uint64_t mr__pat_step(const mr__pat *re, uint64_t s, int sym) {
    return (uint64_t)re->next[s * MR__RE_NSYM + (uint64_t)sym];
}
static inline bool mr__pat_accepts(const mr__pat *re, uint64_t s) { return re->accept[s] != 0; }

/* An EBNF grammar (grammar_ebnf.c): compiled once, immutable; each matcher
 * steps it with a runtime of its own, whose states are set ids (0: no text
 * can follow; -1 from a step: a limit was reached, see mr__cfg_full). */
typedef struct mr__cfg mr__cfg;
typedef struct mr__cfgrun mr__cfgrun;
mr_status mr__cfg_compile(const char *text, mr__cfg **out);
void mr__cfg_free(mr__cfg *c);
int32_t mr__cfg_rules(const mr__cfg *c);
int32_t mr__cfg_elements(const mr__cfg *c);
mr_status mr__cfgrun_new(const mr__cfg *c, mr__cfgrun **out, int32_t *start);
void mr__cfgrun_free(mr__cfgrun *r);
int32_t mr__cfg_step(mr__cfgrun *r, int32_t set, uint8_t byte);
bool mr__cfg_accepts(const mr__cfgrun *r, int32_t set);
bool mr__cfg_full(const mr__cfgrun *r);
/* Steps may visit this many closure items until the next call (then a step gives -1 and mr__cfg_full): what
 * bounds one token mask or one accepted token of a hostile grammar; also clears the full flag. */
#define MR__CFG_BUDGET ((int64_t)1 << 22)
void mr__cfg_budget(mr__cfgrun *r, int64_t items);
int32_t mr__cfg_tidy(mr__cfgrun *r, int32_t set);

typedef struct {
    int32_t key;   /* literal: the key as JSON, with its quotes */
    int32_t value; /* node */
    bool required;
} mr__gprop;

typedef struct {
    uint32_t off, len;
} mr__glitref;

/* A structural tag: its begin and end (literals), its content's value node. */
typedef struct {
    int32_t begin, end, value;
} mr__gtag;
/* A trigger: the tags whose begin starts with it, [lo, hi) of g->tags (sorted by begin), and its length. */
typedef struct {
    int32_t lo, hi, len;
} mr__gtrig;
/* A tool of G_XCALLS: its name as the literal NAME"> (what follows <invoke name="); strict: its parameters are
 * props [pa, pa + pb) of g->props (key: the literal KEY"> after <parameter name="; value: a node, or XV_TEXT /
 * XV_TEXT_NULL for raw text that may not / may read as null), written in that order, the required ones always;
 * not strict: any parameter names, raw text values. */
typedef struct {
    int32_t name, pa, pb;
    bool strict;
} mr__gxtool;
#define XV_TEXT (-1)
#define XV_TEXT_NULL (-2)
#define MR__TAGS_AT_LEAST_ONE 1u     /* the output holds a tag at least */
#define MR__TAGS_STOP_AFTER_FIRST 2u /* the output ends with its first tag */
#define MR__TAGS_NO_TEXT 4u          /* the output is its tags: no text before the first (whitespace only) */

struct mr_grammar {
    mr__gnode *nodes;
    int32_t n_nodes, cap_nodes;
    mr__gprop *props;
    int32_t n_props, cap_props;
    int32_t *alts;
    int32_t n_alts, cap_alts;
    int32_t *sels;
    int32_t n_sels, cap_sels;
    mr__pat *res;
    int32_t n_res, cap_res;
    mr__glitref *lits; /* [n_lits] into pool */
    int32_t n_lits, cap_lits;
    char *pool;
    size_t n_pool, cap_pool;
    mr__cfg *cfg; /* G_CFG's grammar */
    mr__gtag *tags; /* G_TAGS: [n_tags], sorted by begin */
    int32_t n_tags;
    mr__gtrig *trigs; /* [n_trigs] */
    int32_t n_trigs;
    int32_t *ac_next; /* [n_ac][256]: the triggers' automaton (Aho-Corasick, complete); state 0 matches nothing yet */
    int32_t *ac_fire; /* [n_ac]: the trigger that has just ended in this state (the longest), or -1 */
    int32_t n_ac;
    mr__gxtool *xtools; /* G_XCALLS: [n_xtools] */
    int32_t n_xtools;
    uint8_t tag_flags; /* MR__TAGS_* */
    bool trig_lt;      /* every trigger starts with '<' (the mask's fast path in free text) */
    int32_t root;
    bool raw;     /* the root is raw text (choices, a regex): no whitespace around it */
    int32_t any;  /* the any-value node (-1 until needed) */
    int32_t string; /* an unlimited string (object keys of free objects; -1 until needed) */
    char desc[160];
};

static inline const char *mr__glit(const mr_grammar *g, int32_t i, size_t *len) {
    *len = g->lits[i].len;
    return g->pool + g->lits[i].off;
}

/* For grammar_tags.c: a fresh grammar; a JSON schema compiled into g (its $refs its own); a literal; the
 * checks and description once built (frees g on an error). */
mr_status mr__grammar_new(mr_grammar **out);
mr_status mr__grammar_schema(mr_grammar *g, const json_t *doc, const json_t *schema, const char *path, int32_t *node);
mr_status mr__grammar_raw_lits(mr_grammar *g, const char *const *s, int32_t n, int32_t *node); /* their bytes */
mr_status mr__grammar_lit(mr_grammar *g, const char *s, size_t n, int32_t *id);
mr_status mr__grammar_props(mr_grammar *g, const mr__gprop *p, int32_t n, int32_t *first); /* appended together */
mr_status mr__grammar_node(mr_grammar *g, mr__gkind k, int32_t *id);
mr_status mr__grammar_finish(mr_grammar *g, mr_status st, const char *what, mr_grammar **out);

/* The concrete (non-union) node whose value may start with byte c, or -1. */
int32_t mr__gpick(const mr_grammar *g, int32_t node, uint8_t c);

#endif
