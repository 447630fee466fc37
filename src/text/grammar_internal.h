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
 *   G_ARRAY     items node a, lo .. hi items (hi -1: no limit)
 *   G_STRING    lo .. hi characters (hi -1: no limit)
 *   G_NUMBER, G_INTEGER (an integer may have bounds: bit 0 of bounds, lo <=
 *               the value; bit 1, the value <= hi)
 *   G_LITERALS  literals [a, a + b) of g->lits, sorted bytewise, distinct:
 *               the value is exactly one of them
 *   G_UNION     alternatives [a, a + b) of g->alts: the first byte picks one
 *               (checked disjoint once the whole graph is built)
 * Node ids are int32; a $ref is its target's node (recursion is a cycle). */
#ifndef MR_TEXT_GRAMMAR_INTERNAL_H
#define MR_TEXT_GRAMMAR_INTERNAL_H

#include "moerun/grammar.h"

typedef enum { G_PENDING = 0, G_OBJECT, G_ARRAY, G_STRING, G_NUMBER, G_INTEGER, G_LITERALS, G_UNION } mr__gkind;

typedef struct {
    uint8_t kind;
    uint8_t bounds;
    int32_t a, b;
    int64_t lo, hi;
    int32_t addl;
    int32_t sel_from, sel_prop, sel_first;
} mr__gnode;

typedef struct {
    int32_t key;   /* literal: the key as JSON, with its quotes */
    int32_t value; /* node */
    bool required;
} mr__gprop;

typedef struct {
    uint32_t off, len;
} mr__glitref;

struct mr_grammar {
    mr__gnode *nodes;
    int32_t n_nodes, cap_nodes;
    mr__gprop *props;
    int32_t n_props, cap_props;
    int32_t *alts;
    int32_t n_alts, cap_alts;
    int32_t *sels;
    int32_t n_sels, cap_sels;
    mr__glitref *lits; /* [n_lits] into pool */
    int32_t n_lits, cap_lits;
    char *pool;
    size_t n_pool, cap_pool;
    int32_t root;
    bool raw;     /* the root is raw text (choices): no whitespace around it */
    int32_t any;  /* the any-value node (-1 until needed) */
    int32_t string; /* an unlimited string (object keys of free objects; -1 until needed) */
    char desc[160];
};

static inline const char *mr__glit(const mr_grammar *g, int32_t i, size_t *len) {
    *len = g->lits[i].len;
    return g->pool + g->lits[i].off;
}

/* The concrete (non-union) node whose value may start with byte c, or -1. */
int32_t mr__gpick(const mr_grammar *g, int32_t node, uint8_t c);

#endif
