/* template_parse.c — tokens → AST, with jinja2's grammar and precedence:
 *   condexpr  := or ('if' or ('else' condexpr)?)*
 *   or / and / not / compare (==, !=, <, <=, >, >=, in, not in; chained)
 *   math1 (+ -) > concat (~) > math2 (* / // %) > pow (**) > unary (- +)
 *   unary     := primary postfix* (filter | test | call)*
 *   postfix   := .name | .int | [subscript / slice] | (call args)
 * Statements: if/elif/else, for (target in iter [if cond] ... else), set
 * (expression or block, with namespace attributes), macro, filter blocks,
 * with, print, break/continue, and transformers' {% generation %}.
 * Filter and test names are resolved here, so an unknown one fails the parse
 * (jinja2 does the same at compile time). Nesting depth is bounded. */
#include <stdio.h>
#include <string.h>

#include "text/template_internal.h"

#define MAX_NEST 100

typedef struct {
    mr__arena *a;
    mr__tpl_err *e;
    const ttoken *t;
    size_t n, pos;
    int depth;
    int loops; /* enclosing for loops in the current macro (for break/continue) */
    const char *tag_stack[MAX_NEST + 8];
    int n_tags;
} parser;

/* a temporary growable node list */
typedef struct {
    tnode **v;
    size_t n, cap;
} nvec;

static void nv_push(parser *P, nvec *l, tnode *x) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        tnode **nv = mr__arena_alloc(P->a, cap * sizeof *nv);
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = x;
}

static tnlist nv_done(nvec *l) {
    tnlist r = {l->v, l->n};
    return r;
}

static const ttoken *cur(parser *P) { return &P->t[P->pos]; }
static const ttoken *look(parser *P) { return &P->t[P->pos + 1 < P->n ? P->pos + 1 : P->pos]; }
static const ttoken *advance(parser *P) {
    const ttoken *t = cur(P);
    if (t->type != TK_EOF) P->pos++;
    return t;
}

static bool is_name(const ttoken *t, const char *name) { return t->type == TK_NAME && strcmp(t->p, name) == 0; }

static const char *tk_desc(const ttoken *t) {
    static const char *const names[] = {
        [TK_EOF] = "end of template", [TK_DATA] = "template data", [TK_VAR_BEGIN] = "begin of print statement",
        [TK_VAR_END] = "end of print statement", [TK_BLOCK_BEGIN] = "begin of statement block",
        [TK_BLOCK_END] = "end of statement block", [TK_NAME] = "name", [TK_STRING] = "string",
        [TK_INT] = "integer", [TK_FLOAT] = "float", [TK_ADD] = "+", [TK_SUB] = "-", [TK_MUL] = "*",
        [TK_DIV] = "/", [TK_FLOORDIV] = "//", [TK_MOD] = "%", [TK_POW] = "**", [TK_TILDE] = "~",
        [TK_LBRACKET] = "[", [TK_RBRACKET] = "]", [TK_LPAREN] = "(", [TK_RPAREN] = ")", [TK_LBRACE] = "{",
        [TK_RBRACE] = "}", [TK_EQ] = "==", [TK_NE] = "!=", [TK_GT] = ">", [TK_GTEQ] = ">=", [TK_LT] = "<",
        [TK_LTEQ] = "<=", [TK_ASSIGN] = "=", [TK_DOT] = ".", [TK_COLON] = ":", [TK_PIPE] = "|",
        [TK_COMMA] = ",", [TK_SEMICOLON] = ";",
    };
    if (t->type == TK_NAME && t->p) return t->p;
    return t->type < sizeof names / sizeof names[0] && names[t->type] ? names[t->type] : "token";
}

_Noreturn static void fail(parser *P, int line, const char *fmt, const char *arg) {
    mr__tpl_fail(P->e, MR_EINPUT, line, fmt, arg);
}

static const ttoken *expect(parser *P, int type) {
    const ttoken *t = cur(P);
    if (t->type != type) {
        char msg[160];
        ttoken want = {0};
        want.type = (uint8_t)type;
        snprintf(msg, sizeof msg, "expected token '%s', got '%s'", tk_desc(&want), tk_desc(t));
        fail(P, t->line, "%s", msg);
    }
    return advance(P);
}

static void expect_name(parser *P, const char *name) {
    const ttoken *t = cur(P);
    if (!is_name(t, name)) {
        char msg[160];
        snprintf(msg, sizeof msg, "expected '%s', got '%s'", name, tk_desc(t));
        fail(P, t->line, "%s", msg);
    }
    advance(P);
}

static tnode *node(parser *P, int kind, int line) {
    tnode *x = mr__arena_alloc(P->a, sizeof *x);
    x->kind = (uint8_t)kind;
    x->line = line;
    return x;
}

static void enter(parser *P) {
    if (++P->depth > MAX_NEST) fail(P, cur(P)->line, "%s", "expressions or blocks nested more than 100 deep");
}
static void leave(parser *P) { P->depth--; }

static tnode *parse_expression(parser *P, bool with_condexpr);
static tnode *parse_tuple(parser *P, bool simplified, bool with_condexpr, const char *const *extra_end,
                          bool explicit_parens, bool with_namespace);
static tnode *parse_unary(parser *P, bool with_filter);
static tnode *parse_primary(parser *P, bool with_namespace);
static tnode *parse_postfix(parser *P, tnode *x);
static tnode *parse_filter(parser *P, tnode *x, bool start_inline);
static tnlist subparse(parser *P, const char *const *end_tokens);
static void parse_call_args(parser *P, tnode *x);

static tnode *parse_condexpr(parser *P);
static tnode *parse_or(parser *P);

static tnode *parse_condexpr(parser *P) {
    int line = cur(P)->line;
    tnode *e1 = parse_or(P);
    while (is_name(cur(P), "if")) {
        advance(P);
        tnode *x = node(P, N_COND, line);
        x->a = parse_or(P);
        x->b = e1;
        if (is_name(cur(P), "else")) {
            advance(P);
            enter(P);
            x->c = parse_condexpr(P);
            leave(P);
        }
        e1 = x;
        line = cur(P)->line;
    }
    return e1;
}

static tnode *parse_not(parser *P);
static tnode *parse_and(parser *P) {
    int line = cur(P)->line;
    tnode *l = parse_not(P);
    while (is_name(cur(P), "and")) {
        advance(P);
        tnode *x = node(P, N_AND, line);
        x->a = l;
        x->b = parse_not(P);
        l = x;
        line = cur(P)->line;
    }
    return l;
}

static tnode *parse_or(parser *P) {
    int line = cur(P)->line;
    tnode *l = parse_and(P);
    while (is_name(cur(P), "or")) {
        advance(P);
        tnode *x = node(P, N_OR, line);
        x->a = l;
        x->b = parse_and(P);
        l = x;
        line = cur(P)->line;
    }
    return l;
}

static tnode *parse_compare(parser *P);
static tnode *parse_not(parser *P) {
    if (is_name(cur(P), "not")) {
        int line = advance(P)->line;
        tnode *x = node(P, N_NOT, line);
        enter(P);
        x->a = parse_not(P);
        leave(P);
        return x;
    }
    return parse_compare(P);
}

static tnode *parse_math1(parser *P);
static tnode *parse_compare(parser *P) {
    int line = cur(P)->line;
    tnode *e = parse_math1(P);
    nvec ops = {0};
    uint8_t opv[64];
    size_t nops = 0;
    for (;;) {
        const ttoken *t = cur(P);
        int op = -1;
        switch (t->type) {
        case TK_EQ: op = CMP_EQ; break;
        case TK_NE: op = CMP_NE; break;
        case TK_LT: op = CMP_LT; break;
        case TK_LTEQ: op = CMP_LTEQ; break;
        case TK_GT: op = CMP_GT; break;
        case TK_GTEQ: op = CMP_GTEQ; break;
        default: break;
        }
        if (op >= 0) {
            advance(P);
        } else if (is_name(t, "in")) {
            advance(P);
            op = CMP_IN;
        } else if (is_name(t, "not") && is_name(look(P), "in")) {
            advance(P);
            advance(P);
            op = CMP_NOTIN;
        } else {
            break;
        }
        if (nops >= sizeof opv) fail(P, t->line, "%s", "too many chained comparisons");
        opv[nops++] = (uint8_t)op;
        nv_push(P, &ops, parse_math1(P));
        line = cur(P)->line;
    }
    if (!nops) return e;
    tnode *x = node(P, N_COMPARE, line);
    x->a = e;
    x->args = nv_done(&ops);
    x->ops = mr__arena_alloc(P->a, nops);
    memcpy(x->ops, opv, nops);
    return x;
}

static tnode *parse_concat(parser *P);
static tnode *parse_math1(parser *P) {
    int line = cur(P)->line;
    tnode *l = parse_concat(P);
    while (cur(P)->type == TK_ADD || cur(P)->type == TK_SUB) {
        int op = advance(P)->type == TK_ADD ? OP_ADD : OP_SUB;
        tnode *x = node(P, N_BINOP, line);
        x->op = (uint8_t)op;
        x->a = l;
        x->b = parse_concat(P);
        l = x;
        line = cur(P)->line;
    }
    return l;
}

static tnode *parse_math2(parser *P);
static tnode *parse_concat(parser *P) {
    int line = cur(P)->line;
    tnode *first = parse_math2(P);
    if (cur(P)->type != TK_TILDE) return first;
    nvec args = {0};
    nv_push(P, &args, first);
    while (cur(P)->type == TK_TILDE) {
        advance(P);
        nv_push(P, &args, parse_math2(P));
    }
    tnode *x = node(P, N_CONCAT, line);
    x->args = nv_done(&args);
    return x;
}

static tnode *parse_pow(parser *P);
static tnode *parse_math2(parser *P) {
    int line = cur(P)->line;
    tnode *l = parse_pow(P);
    for (;;) {
        int t = cur(P)->type, op;
        if (t == TK_MUL) op = OP_MUL;
        else if (t == TK_DIV) op = OP_DIV;
        else if (t == TK_FLOORDIV) op = OP_FLOORDIV;
        else if (t == TK_MOD) op = OP_MOD;
        else break;
        advance(P);
        tnode *x = node(P, N_BINOP, line);
        x->op = (uint8_t)op;
        x->a = l;
        x->b = parse_pow(P);
        l = x;
        line = cur(P)->line;
    }
    return l;
}

static tnode *parse_pow(parser *P) {
    int line = cur(P)->line;
    tnode *l = parse_unary(P, true);
    while (cur(P)->type == TK_POW) {
        advance(P);
        tnode *x = node(P, N_BINOP, line);
        x->op = OP_POW;
        x->a = l;
        x->b = parse_unary(P, true);
        l = x;
        line = cur(P)->line;
    }
    return l;
}

static tnode *parse_unary(parser *P, bool with_filter) {
    const ttoken *t = cur(P);
    tnode *x;
    enter(P);
    if (t->type == TK_SUB || t->type == TK_ADD) {
        advance(P);
        x = node(P, t->type == TK_SUB ? N_NEG : N_POS, t->line);
        x->a = parse_unary(P, false);
    } else {
        x = parse_primary(P, false);
    }
    x = parse_postfix(P, x);
    if (with_filter) {
        for (;;) {
            const ttoken *c = cur(P);
            if (c->type == TK_PIPE) {
                x = parse_filter(P, x, false);
            } else if (is_name(c, "is")) {
                /* test */
                int line = advance(P)->line;
                bool negated = false;
                if (is_name(cur(P), "not")) {
                    advance(P);
                    negated = true;
                }
                const ttoken *nt = expect(P, TK_NAME);
                tnode *tn = node(P, N_TEST, line);
                tn->a = x;
                tn->name = nt->p;
                if (cur(P)->type == TK_DOT) fail(P, line, "No test named '%s'.", nt->p);
                bool unsup = false;
                tn->id = mr__tpl_test_id(nt->p, &unsup);
                if (tn->id < 0) tn->id = unsup ? -2 : -1; /* checked after the parse (see check_names) */
                const ttoken *c2 = cur(P);
                if (c2->type == TK_LPAREN) {
                    parse_call_args(P, tn);
                } else if ((c2->type == TK_NAME || c2->type == TK_STRING || c2->type == TK_INT ||
                            c2->type == TK_FLOAT || c2->type == TK_LBRACKET || c2->type == TK_LBRACE) &&
                           !is_name(c2, "else") && !is_name(c2, "or") && !is_name(c2, "and")) {
                    if (is_name(c2, "is")) fail(P, c2->line, "%s", "You cannot chain multiple tests with is");
                    tnode *arg = parse_postfix(P, parse_primary(P, false));
                    nvec av = {0};
                    nv_push(P, &av, arg);
                    tn->args = nv_done(&av);
                }
                x = tn;
                if (negated) {
                    tnode *nn = node(P, N_NOT, line);
                    nn->a = x;
                    x = nn;
                }
            } else if (c->type == TK_LPAREN) {
                tnode *call = node(P, N_CALL, c->line);
                call->a = x;
                parse_call_args(P, call);
                x = call;
            } else {
                break;
            }
        }
    }
    leave(P);
    return x;
}

static void parse_call_args(parser *P, tnode *x) {
    const ttoken *lp = expect(P, TK_LPAREN);
    nvec args = {0}, kwargs = {0};
    const char **names = NULL;
    size_t nn = 0, ncap = 0;
    bool require_comma = false;
    while (cur(P)->type != TK_RPAREN) {
        if (require_comma) {
            expect(P, TK_COMMA);
            if (cur(P)->type == TK_RPAREN) break;
        }
        const ttoken *t = cur(P);
        if (t->type == TK_MUL) {
            if (x->kind != N_CALL || x->b || x->c) fail(P, lp->line, "%s", "invalid syntax for function call expression");
            advance(P);
            x->b = parse_expression(P, true);
        } else if (t->type == TK_POW) {
            if (x->kind != N_CALL || x->c) fail(P, lp->line, "%s", "invalid syntax for function call expression");
            advance(P);
            x->c = parse_expression(P, true);
        } else if (t->type == TK_NAME && look(P)->type == TK_ASSIGN) {
            if (x->c) fail(P, lp->line, "%s", "invalid syntax for function call expression");
            const char *key = t->p;
            advance(P);
            advance(P);
            if (nn == ncap) {
                size_t cap = ncap ? ncap * 2 : 4;
                const char **nv = mr__arena_alloc(P->a, cap * sizeof *nv);
                if (nn) memcpy(nv, names, nn * sizeof *nv);
                names = nv;
                ncap = cap;
            }
            names[nn++] = key;
            nv_push(P, &kwargs, parse_expression(P, true));
        } else {
            if (x->b || x->c || kwargs.n) fail(P, lp->line, "%s", "invalid syntax for function call expression");
            nv_push(P, &args, parse_expression(P, true));
        }
        require_comma = true;
    }
    expect(P, TK_RPAREN);
    x->args = nv_done(&args);
    x->kwargs = nv_done(&kwargs);
    x->kwnames = names;
}

static tnode *parse_filter(parser *P, tnode *x, bool start_inline) {
    while (cur(P)->type == TK_PIPE || start_inline) {
        if (!start_inline) advance(P);
        const ttoken *t = expect(P, TK_NAME);
        if (cur(P)->type == TK_DOT) fail(P, t->line, "No filter named '%s'.", t->p);
        tnode *f = node(P, N_FILTER, t->line);
        f->a = x;
        f->name = t->p;
        bool unsup = false;
        f->id = mr__tpl_filter_id(t->p, &unsup);
        if (f->id < 0) f->id = unsup ? -2 : -1; /* checked after the parse (see check_names) */
        if (cur(P)->type == TK_LPAREN) parse_call_args(P, f);
        x = f;
        start_inline = false;
    }
    return x;
}

static tnode *parse_subscribed(parser *P) {
    int line = cur(P)->line;
    tnode *args[3] = {NULL, NULL, NULL};
    if (cur(P)->type == TK_COLON) {
        advance(P);
    } else {
        tnode *e = parse_expression(P, true);
        if (cur(P)->type != TK_COLON) return e;
        advance(P);
        args[0] = e;
    }
    if (cur(P)->type != TK_COLON && cur(P)->type != TK_RBRACKET && cur(P)->type != TK_COMMA)
        args[1] = parse_expression(P, true);
    if (cur(P)->type == TK_COLON) {
        advance(P);
        if (cur(P)->type != TK_RBRACKET && cur(P)->type != TK_COMMA) args[2] = parse_expression(P, true);
    }
    tnode *s = node(P, N_SLICE, line);
    s->a = args[0];
    s->b = args[1];
    s->c = args[2];
    return s;
}

static tnode *parse_postfix(parser *P, tnode *x) {
    for (;;) {
        const ttoken *t = cur(P);
        if (t->type == TK_DOT) {
            advance(P);
            const ttoken *at = advance(P);
            if (at->type == TK_NAME) {
                tnode *g = node(P, N_GETATTR, t->line);
                g->a = x;
                g->name = at->p;
                x = g;
            } else if (at->type == TK_INT) {
                tnode *g = node(P, N_GETITEM, t->line);
                g->a = x;
                g->b = node(P, N_CONST, at->line);
                g->b->val = tv_int(at->i);
                x = g;
            } else {
                fail(P, at->line, "%s", "expected name or number");
            }
        } else if (t->type == TK_LBRACKET) {
            advance(P);
            nvec args = {0};
            while (cur(P)->type != TK_RBRACKET) {
                if (args.n) expect(P, TK_COMMA);
                nv_push(P, &args, parse_subscribed(P));
            }
            expect(P, TK_RBRACKET);
            tnode *g = node(P, N_GETITEM, t->line);
            g->a = x;
            if (args.n == 1) {
                g->b = args.v[0];
            } else {
                g->b = node(P, N_TUPLE, t->line);
                g->b->args = nv_done(&args);
            }
            x = g;
        } else if (t->type == TK_LPAREN) {
            tnode *call = node(P, N_CALL, t->line);
            call->a = x;
            parse_call_args(P, call);
            x = call;
        } else {
            break;
        }
    }
    return x;
}

static tnode *parse_primary(parser *P, bool with_namespace) {
    const ttoken *t = cur(P);
    tnode *x;
    if (t->type == TK_NAME) {
        advance(P);
        if (!strcmp(t->p, "true") || !strcmp(t->p, "True") || !strcmp(t->p, "false") || !strcmp(t->p, "False")) {
            x = node(P, N_CONST, t->line);
            x->val = tv_bool(t->p[0] == 't' || t->p[0] == 'T');
        } else if (!strcmp(t->p, "none") || !strcmp(t->p, "None")) {
            x = node(P, N_CONST, t->line);
            x->val = tv_none();
        } else if (with_namespace && cur(P)->type == TK_DOT) {
            advance(P);
            const ttoken *attr = expect(P, TK_NAME);
            x = node(P, N_NSREF, t->line);
            x->name = t->p;
            x->attr = attr->p;
        } else {
            x = node(P, N_NAME, t->line);
            x->name = t->p;
        }
    } else if (t->type == TK_STRING) {
        advance(P);
        /* adjacent string literals concatenate */
        size_t total = t->n;
        size_t k = P->pos;
        while (P->t[k].type == TK_STRING) total += P->t[k++].n;
        tstr *s;
        if (k == P->pos) {
            s = mr__tstr_new(P->a, t->p, t->n);
        } else {
            char *buf = mr__arena_alloc(P->a, total + 1);
            memcpy(buf, t->p, t->n);
            size_t o = t->n;
            while (cur(P)->type == TK_STRING) {
                const ttoken *u = advance(P);
                memcpy(buf + o, u->p, u->n);
                o += u->n;
            }
            s = mr__tstr_new(P->a, buf, total);
        }
        x = node(P, N_CONST, t->line);
        x->val = tv_strv(s);
    } else if (t->type == TK_INT) {
        advance(P);
        x = node(P, N_CONST, t->line);
        x->val = tv_int(t->i);
    } else if (t->type == TK_FLOAT) {
        advance(P);
        x = node(P, N_CONST, t->line);
        x->val = tv_float(t->f);
    } else if (t->type == TK_LPAREN) {
        advance(P);
        enter(P);
        x = parse_tuple(P, false, true, NULL, true, false);
        leave(P);
        expect(P, TK_RPAREN);
    } else if (t->type == TK_LBRACKET) {
        advance(P);
        enter(P);
        nvec items = {0};
        while (cur(P)->type != TK_RBRACKET) {
            if (items.n) expect(P, TK_COMMA);
            if (cur(P)->type == TK_RBRACKET) break;
            nv_push(P, &items, parse_expression(P, true));
        }
        expect(P, TK_RBRACKET);
        leave(P);
        x = node(P, N_LIST, t->line);
        x->args = nv_done(&items);
    } else if (t->type == TK_LBRACE) {
        advance(P);
        enter(P);
        nvec items = {0};
        while (cur(P)->type != TK_RBRACE) {
            if (items.n) expect(P, TK_COMMA);
            if (cur(P)->type == TK_RBRACE) break;
            nv_push(P, &items, parse_expression(P, true));
            expect(P, TK_COLON);
            nv_push(P, &items, parse_expression(P, true));
        }
        expect(P, TK_RBRACE);
        leave(P);
        x = node(P, N_DICT, t->line);
        x->args = nv_done(&items);
    } else {
        fail(P, t->line, "unexpected '%s'", tk_desc(t));
    }
    return x;
}

static bool is_tuple_end(parser *P, const char *const *extra_end) {
    int ty = cur(P)->type;
    if (ty == TK_VAR_END || ty == TK_BLOCK_END || ty == TK_RPAREN) return true;
    if (extra_end)
        for (int i = 0; extra_end[i]; i++)
            if (is_name(cur(P), extra_end[i])) return true;
    return false;
}

static tnode *parse_tuple(parser *P, bool simplified, bool with_condexpr, const char *const *extra_end,
                          bool explicit_parens, bool with_namespace) {
    int line = cur(P)->line;
    nvec args = {0};
    bool is_tuple = false;
    for (;;) {
        if (args.n) expect(P, TK_COMMA);
        if (is_tuple_end(P, extra_end)) break;
        tnode *e = simplified ? parse_primary(P, with_namespace) : parse_expression(P, with_condexpr);
        nv_push(P, &args, e);
        if (cur(P)->type == TK_COMMA) is_tuple = true;
        else break;
        line = cur(P)->line;
    }
    if (!is_tuple) {
        if (args.n) return args.v[0];
        if (!explicit_parens) fail(P, cur(P)->line, "Expected an expression, got '%s'", tk_desc(cur(P)));
    }
    tnode *x = node(P, N_TUPLE, line);
    x->args = nv_done(&args);
    return x;
}

static tnode *parse_expression(parser *P, bool with_condexpr) {
    enter(P);
    tnode *x = with_condexpr ? parse_condexpr(P) : parse_or(P);
    leave(P);
    return x;
}

static void check_target(parser *P, tnode *t) {
    if (t->kind == N_NAME || t->kind == N_NSREF) {
        if (t->kind == N_NAME && (!strcmp(t->name, "true") || !strcmp(t->name, "false") || !strcmp(t->name, "none")))
            fail(P, t->line, "can't assign to '%s'", t->name);
        return;
    }
    if (t->kind == N_TUPLE) {
        for (size_t i = 0; i < t->args.n; i++) {
            if (t->args.v[i]->kind == N_NSREF) fail(P, t->line, "%s", "can't assign to a namespace attribute in a tuple");
            check_target(P, t->args.v[i]);
        }
        return;
    }
    fail(P, t->line, "%s", "can't assign to this expression");
}

static tnode *parse_assign_target(parser *P, const char *const *extra_end, bool with_namespace, bool name_only) {
    if (name_only) {
        const ttoken *t = expect(P, TK_NAME);
        tnode *x = node(P, N_NAME, t->line);
        x->name = t->p;
        return x;
    }
    tnode *t = parse_tuple(P, true, true, extra_end, false, with_namespace);
    check_target(P, t);
    return t;
}

/* parse_statements: optional ':' , '%}', body until one of end_tokens. The
 * stream is left at the end token's name (drop_needle: after it). */
static tnlist parse_statements(parser *P, const char *const *end_tokens, bool drop_needle) {
    if (cur(P)->type == TK_COLON) advance(P);
    expect(P, TK_BLOCK_END);
    tnlist body = subparse(P, end_tokens);
    if (cur(P)->type == TK_EOF) {
        char msg[300];
        int o = snprintf(msg, sizeof msg, "Unexpected end of template. Jinja was looking for the following tags: ");
        for (int i = 0; end_tokens[i]; i++)
            o += snprintf(msg + o, sizeof msg - (size_t)o, "%s'%s'", i ? " or " : "", end_tokens[i]);
        if (P->n_tags)
            snprintf(msg + o, sizeof msg - (size_t)o, ". The innermost block that needs to be closed is '%s'.",
                     P->tag_stack[P->n_tags - 1]);
        fail(P, cur(P)->line, "%s", msg);
    }
    if (drop_needle) advance(P);
    return body;
}

static const char *const END_FOR[] = {"endfor", "else", NULL};
static const char *const END_FOR2[] = {"endfor", NULL};
static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_IF2[] = {"endif", NULL};
static const char *const END_SET[] = {"endset", NULL};
static const char *const END_MACRO[] = {"endmacro", NULL};
static const char *const END_FILTER[] = {"endfilter", NULL};
static const char *const END_WITH[] = {"endwith", NULL};
static const char *const END_GEN[] = {"endgeneration", NULL};
static const char *const END_CALL[] = {"endcall", NULL};
static const char *const IN_RULE[] = {"in", NULL};
static const char *const REC_RULE[] = {"recursive", NULL};

static void parse_signature(parser *P, tnode *x) {
    expect(P, TK_LPAREN);
    nvec defaults = {0};
    const char **names = NULL;
    size_t nn = 0, cap = 0;
    while (cur(P)->type != TK_RPAREN) {
        if (nn) expect(P, TK_COMMA);
        const ttoken *t = expect(P, TK_NAME);
        if (cur(P)->type == TK_ASSIGN) {
            advance(P);
            nv_push(P, &defaults, parse_expression(P, true));
        } else if (defaults.n) {
            fail(P, t->line, "%s", "non-default argument follows default argument");
        }
        if (nn == cap) {
            size_t c2 = cap ? cap * 2 : 4;
            const char **nv = mr__arena_alloc(P->a, c2 * sizeof *nv);
            if (nn) memcpy(nv, names, nn * sizeof *nv);
            names = nv;
            cap = c2;
        }
        names[nn++] = t->p;
    }
    expect(P, TK_RPAREN);
    x->kwnames = names;
    x->kwargs.n = nn; /* number of parameters */
    x->args = nv_done(&defaults);
}

static tnode *parse_statement(parser *P) {
    const ttoken *t = cur(P);
    if (t->type != TK_NAME) fail(P, t->line, "%s", "tag name expected");
    const char *tag = t->p;
    int line = t->line;
    if (P->n_tags >= MAX_NEST) fail(P, line, "%s", "blocks nested more than 100 deep");
    P->tag_stack[P->n_tags++] = tag;
    enter(P);
    tnode *x = NULL;
    if (!strcmp(tag, "if")) {
        advance(P);
        x = node(P, N_IF, line);
        tnode *curr = x;
        for (;;) {
            curr->a = parse_tuple(P, false, false, NULL, false, false);
            curr->body = parse_statements(P, END_IF, false);
            const ttoken *nt = advance(P);
            if (is_name(nt, "elif")) {
                tnode *e = node(P, N_IF, nt->line);
                nvec ov = {0};
                nv_push(P, &ov, e);
                curr->orelse = nv_done(&ov);
                curr = e;
                continue;
            }
            if (is_name(nt, "else")) curr->orelse = parse_statements(P, END_IF2, true);
            break;
        }
    } else if (!strcmp(tag, "for")) {
        advance(P);
        x = node(P, N_FOR, line);
        x->a = parse_assign_target(P, IN_RULE, false, false);
        expect_name(P, "in");
        x->b = parse_tuple(P, false, false, REC_RULE, false, false);
        if (is_name(cur(P), "if")) {
            advance(P);
            x->c = parse_expression(P, true);
        }
        if (is_name(cur(P), "recursive")) fail(P, cur(P)->line, "%s", "recursive for loops are not supported by moerun");
        P->loops++;
        x->body = parse_statements(P, END_FOR, false);
        P->loops--;
        if (is_name(advance(P), "else")) x->orelse = parse_statements(P, END_FOR2, true);
    } else if (!strcmp(tag, "set")) {
        advance(P);
        tnode *target = parse_assign_target(P, NULL, true, false);
        if (cur(P)->type == TK_ASSIGN) {
            advance(P);
            x = node(P, N_SET, line);
            x->a = target;
            x->b = parse_tuple(P, false, true, NULL, false, false);
        } else {
            x = node(P, N_SETBLOCK, line);
            x->a = target;
            if (target->kind == N_TUPLE) fail(P, line, "%s", "a block set needs a single target");
            x->b = parse_filter(P, NULL, false);
            x->body = parse_statements(P, END_SET, true);
        }
    } else if (!strcmp(tag, "macro")) {
        advance(P);
        x = node(P, N_MACRO, line);
        x->name = expect(P, TK_NAME)->p;
        parse_signature(P, x);
        int saved = P->loops;
        P->loops = 0;
        x->body = parse_statements(P, END_MACRO, true);
        P->loops = saved;
    } else if (!strcmp(tag, "call")) {
        advance(P);
        x = node(P, N_CALLBLOCK, line);
        if (cur(P)->type == TK_LPAREN) parse_signature(P, x);
        x->a = parse_expression(P, true);
        if (x->a->kind != N_CALL) fail(P, line, "%s", "expected call");
        int saved = P->loops;
        P->loops = 0;
        x->body = parse_statements(P, END_CALL, true);
        P->loops = saved;
    } else if (!strcmp(tag, "filter")) {
        advance(P);
        x = node(P, N_FILTERBLOCK, line);
        x->b = parse_filter(P, NULL, true);
        x->body = parse_statements(P, END_FILTER, true);
    } else if (!strcmp(tag, "with")) {
        advance(P);
        x = node(P, N_WITH, line);
        nvec targets = {0}, values = {0};
        while (cur(P)->type != TK_BLOCK_END) {
            if (targets.n) expect(P, TK_COMMA);
            tnode *tg = parse_assign_target(P, NULL, false, false);
            nv_push(P, &targets, tg);
            expect(P, TK_ASSIGN);
            nv_push(P, &values, parse_expression(P, true));
        }
        x->args = nv_done(&targets);
        x->kwargs = nv_done(&values);
        x->body = parse_statements(P, END_WITH, true);
    } else if (!strcmp(tag, "print")) {
        advance(P);
        /* {% print a, b %} prints each */
        x = node(P, N_BODY, line);
        nvec items = {0};
        while (cur(P)->type != TK_BLOCK_END) {
            if (items.n) expect(P, TK_COMMA);
            tnode *pn = node(P, N_PRINT, cur(P)->line);
            pn->a = parse_expression(P, true);
            nv_push(P, &items, pn);
        }
        x->body = nv_done(&items);
    } else if (!strcmp(tag, "generation")) {
        advance(P);
        x = node(P, N_BODY, line);
        x->body = parse_statements(P, END_GEN, true);
    } else if (!strcmp(tag, "break") || !strcmp(tag, "continue")) {
        advance(P);
        if (!P->loops) fail(P, line, "'%s' outside a for loop", tag);
        x = node(P, tag[0] == 'b' ? N_BREAK : N_CONTINUE, line);
    } else if (!strcmp(tag, "block") || !strcmp(tag, "extends") || !strcmp(tag, "include") ||
               !strcmp(tag, "import") || !strcmp(tag, "from") || !strcmp(tag, "autoescape") ||
               !strcmp(tag, "do")) {
        fail(P, line, "the '%s' tag is not supported in chat templates", tag);
    } else {
        char msg[300];
        snprintf(msg, sizeof msg, "Encountered unknown tag '%s'.", tag);
        if (P->n_tags > 1)
            snprintf(msg + strlen(msg), sizeof msg - strlen(msg), " The innermost block that needs to be closed is '%s'.",
                     P->tag_stack[P->n_tags - 2]);
        fail(P, line, "%s", msg);
    }
    leave(P);
    P->n_tags--;
    return x;
}

static tnlist subparse(parser *P, const char *const *end_tokens) {
    nvec body = {0};
    for (;;) {
        const ttoken *t = cur(P);
        if (t->type == TK_EOF) break;
        if (t->type == TK_DATA) {
            tnode *d = node(P, N_DATA, t->line);
            d->val = tv_strv(mr__tstr_new(P->a, t->p, t->n));
            nv_push(P, &body, d);
            advance(P);
        } else if (t->type == TK_VAR_BEGIN) {
            advance(P);
            tnode *pn = node(P, N_PRINT, t->line);
            pn->a = parse_tuple(P, false, true, NULL, false, false);
            expect(P, TK_VAR_END);
            nv_push(P, &body, pn);
        } else if (t->type == TK_BLOCK_BEGIN) {
            advance(P);
            if (end_tokens)
                for (int i = 0; end_tokens[i]; i++)
                    if (is_name(cur(P), end_tokens[i])) return nv_done(&body);
            tnode *s = parse_statement(P);
            nv_push(P, &body, s);
            expect(P, TK_BLOCK_END);
        } else {
            fail(P, t->line, "unexpected '%s'", tk_desc(t));
        }
    }
    return nv_done(&body);
}

/* Unknown filter and test names fail the parse, as jinja2's compiler does,
 * except directly inside an if statement or an inline if-expression (its
 * "soft" frames): there jinja2 defers the error to the moment the filter
 * runs, and so does moerun. Loops, macros, with, filter and set blocks start
 * a new frame that is not soft. */
static void check_names(parser *P, const tnode *x, bool soft);
static void check_list(parser *P, const tnlist *l, bool soft) {
    for (size_t i = 0; i < l->n; i++) check_names(P, l->v[i], soft);
}
static void check_names(parser *P, const tnode *x, bool soft) {
    if (!x) return;
    switch (x->kind) {
    case N_FILTER:
    case N_TEST:
        if (x->id < 0 && !soft) {
            const char *what = x->kind == N_FILTER ? "filter" : "test";
            char msg[200];
            if (x->id == -2) snprintf(msg, sizeof msg, "the %s '%s' is not supported by moerun", what, x->name);
            else snprintf(msg, sizeof msg, "No %s named '%s'.", what, x->name);
            fail(P, x->line, "%s", msg);
        }
        break;
    case N_IF:
    case N_COND:
        soft = true;
        break;
    case N_FOR:
        check_names(P, x->b, soft);
        check_names(P, x->a, false);
        check_names(P, x->c, false);
        check_list(P, &x->body, false);
        check_list(P, &x->orelse, false);
        return;
    case N_MACRO:
    case N_CALLBLOCK:
    case N_WITH:
    case N_FILTERBLOCK:
    case N_SETBLOCK:
        if (x->kind == N_CALLBLOCK || x->kind == N_WITH) {
            check_names(P, x->a, soft);
            check_list(P, &x->kwargs, soft);
        }
        if (x->kind == N_SETBLOCK || x->kind == N_FILTERBLOCK) check_names(P, x->b, false);
        check_list(P, &x->args, false);
        check_list(P, &x->body, false);
        return;
    default:
        break;
    }
    check_names(P, x->a, soft);
    check_names(P, x->b, soft);
    check_names(P, x->c, soft);
    check_list(P, &x->args, soft);
    check_list(P, &x->kwargs, soft);
    check_list(P, &x->body, soft);
    check_list(P, &x->orelse, soft);
}

tnode *mr__tpl_parse(mr__arena *a, mr__tpl_err *e, const ttokens *toks) {
    parser P = {.a = a, .e = e, .t = toks->t, .n = toks->n};
    tnode *root = node(&P, N_BODY, 1);
    root->body = subparse(&P, NULL);
    if (cur(&P)->type != TK_EOF) fail(&P, cur(&P)->line, "unexpected '%s'", tk_desc(cur(&P)));
    check_names(&P, root, false);
    return root;
}
