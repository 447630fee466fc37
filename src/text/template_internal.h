/* template_internal.h — private to the Jinja interpreter (template_*.c):
 * the arena, the value model, the tokens, the AST, and the calls between the
 * lexer, parser, evaluator and builtins.
 *
 * Memory. Everything a parse or a render makes lives in one arena (a list of
 * blocks) that is freed whole; values are never freed one by one, so they can
 * be shared freely (templates are immutable: the sandbox forbids mutation
 * except namespace attributes). The arena has a byte budget: a template that
 * builds too much fails with MR_ECAPACITY.
 *
 * Errors. The lexer, parser and evaluator stop at the first error with a
 * longjmp back to their entry point (mr__tpl_fail). That is safe here because
 * nothing is owned outside the arena and the context's output buffers, which
 * the entry point frees; it keeps hundreds of builtins free of error plumbing.
 *
 * Strings are UTF-8 (validated at the edges: template source, JSON input);
 * Python semantics (len, slicing, indexing) count code points. */
#ifndef MR_TEXT_TEMPLATE_INTERNAL_H
#define MR_TEXT_TEMPLATE_INTERNAL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "moerun/base.h"
#include "moerun/chat.h"
#include "text/textutil.h"

/* ---------------- arena ---------------- */
typedef struct mr__arena_block mr__arena_block;
typedef struct {
    mr__arena_block *head;
    size_t used;   /* bytes handed out + block overhead */
    size_t budget; /* 0: unlimited */
    struct mr__tpl_err *err; /* where to longjmp on exhaustion (NULL: return NULL) */
} mr__arena;

void mr__arena_init(mr__arena *a, size_t budget, struct mr__tpl_err *err);
void *mr__arena_alloc(mr__arena *a, size_t n); /* 16-aligned, zeroed */
void mr__arena_free(mr__arena *a);

/* ---------------- error state ---------------- */
typedef struct mr__tpl_err {
    jmp_buf jb;
    mr_status status;
    int line;
    char msg[512];
    const char *tpl_name;
} mr__tpl_err;

/* Records the error (status, line, printf message) and longjmps. */
_Noreturn void mr__tpl_fail(mr__tpl_err *e, mr_status s, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* ---------------- values ---------------- */
typedef enum {
    TV_UNDEF = 0, /* jinja2.Undefined: prints "", iterates empty, fails on use */
    TV_NONE,
    TV_BOOL,
    TV_INT,
    TV_FLOAT,
    TV_STR,
    TV_LIST,   /* list or tuple (flag) */
    TV_DICT,
    TV_NS,     /* namespace(): a dict whose attributes `set ns.x` may assign */
    TV_MACRO,
    TV_FUNC,   /* a global builtin (range, namespace, raise_exception, ...) */
    TV_METHOD, /* a bound method of a str/dict/list/loop/... */
    TV_LOOP,   /* the `loop` object of a for */
    TV_CYCLER,
    TV_JOINER,
    TV_MISSING, /* internal: an argument not given */
} tv_kind;

typedef struct tstr tstr;
typedef struct tlist tlist;
typedef struct tdict tdict;
typedef struct tnode tnode;
typedef struct tscope tscope;
typedef struct tloop tloop;
typedef struct tmacro tmacro;
typedef struct tmethod tmethod;
typedef struct tcycler tcycler;

typedef struct {
    uint8_t kind;
    uint8_t safe; /* a Markup string (|safe, |escape): escape is a no-op on it */
    union {
        bool b;
        int64_t i;
        double f;
        tstr *s;   /* TV_STR; TV_UNDEF: the "why" hint (may be NULL) */
        tlist *l;
        tdict *d;  /* TV_DICT, TV_NS */
        tmacro *m;
        int fn;    /* TV_FUNC: builtin id */
        tmethod *meth;
        tloop *loop;
        tcycler *cyc; /* TV_CYCLER, TV_JOINER */
    } u;
} tv;

struct tstr {
    size_t len;  /* bytes */
    int64_t ncp; /* code points; -1 until counted */
    char p[];    /* len bytes + NUL */
};

struct tlist {
    size_t n, cap;
    bool tuple;
    tv *v;
};

struct tdict {
    size_t n, cap;
    tv *k;
    tv *v;
};

struct tmacro {
    const tnode *node; /* the macro statement */
    tscope *closure;   /* where it was defined */
    const char *name;
};

struct tmethod {
    int id; /* method id (template_builtins.c) */
    tv self;
};

struct tcycler {
    tv items; /* TV_LIST (cycler) or the separator string (joiner) */
    size_t pos;
    bool used;
};

struct tloop {
    size_t index0, length;
    tv prev, next;    /* previtem / nextitem (TV_UNDEF at the ends) */
    tv changed_last;  /* loop.changed() memory */
    bool changed_any;
    int depth;
};

/* constructors (ctx-free: they take the arena) */
static inline tv tv_undef(void) { tv v = {0}; return v; }
static inline tv tv_none(void) { tv v = {0}; v.kind = TV_NONE; return v; }
static inline tv tv_bool(bool b) { tv v = {0}; v.kind = TV_BOOL; v.u.b = b; return v; }
static inline tv tv_int(int64_t i) { tv v = {0}; v.kind = TV_INT; v.u.i = i; return v; }
static inline tv tv_float(double f) { tv v = {0}; v.kind = TV_FLOAT; v.u.f = f; return v; }
static inline tv tv_missing(void) { tv v = {0}; v.kind = TV_MISSING; return v; }
static inline tv tv_strv(tstr *s) { tv v = {0}; v.kind = TV_STR; v.u.s = s; return v; }

tstr *mr__tstr_new(mr__arena *a, const char *p, size_t n);
tstr *mr__tstr_cat(mr__arena *a, const tstr *x, const tstr *y);
tstr *mr__tstr_cstr(mr__arena *a, const char *p);
tv mr__tv_str(mr__arena *a, const char *p, size_t n);
tv mr__tv_cstr(mr__arena *a, const char *p);
tlist *mr__tlist_new(mr__arena *a, size_t cap);
void mr__tlist_push(mr__arena *a, tlist *l, tv v);
tdict *mr__tdict_new(mr__arena *a, size_t cap);
/* Python dict semantics: equal keys (1 == 1.0 == True) collide. */
tv *mr__tdict_get(const tdict *d, tv key);
tv *mr__tdict_get_str(const tdict *d, const char *key, size_t n);
void mr__tdict_set(mr__arena *a, tdict *d, tv key, tv val);

/* UTF-8 helpers */
size_t mr__utf8_valid_prefix(const char *p, size_t n); /* length of the valid prefix */
int64_t mr__tstr_ncp(tstr *s);
/* byte offset of code point index i (0 <= i <= ncp) */
size_t mr__utf8_offset(const char *p, size_t n, int64_t i);
bool mr__py_isspace(uint32_t cp);

/* Python-compatible conversions; json.dumps */
double mr__py_float_parse_ok(const char *p, size_t n, bool *ok);
void mr__py_float_repr(double f, char out[40]);


/* ---------------- tokens ---------------- */
typedef enum {
    TK_EOF = 0,
    TK_DATA,      /* template text (already whitespace-processed) */
    TK_VAR_BEGIN, /* {{ */
    TK_VAR_END,   /* }} */
    TK_BLOCK_BEGIN,
    TK_BLOCK_END,
    TK_NAME,
    TK_STRING,
    TK_INT,
    TK_FLOAT,
    /* operators */
    TK_ADD, TK_SUB, TK_MUL, TK_DIV, TK_FLOORDIV, TK_MOD, TK_POW, TK_TILDE,
    TK_LBRACKET, TK_RBRACKET, TK_LPAREN, TK_RPAREN, TK_LBRACE, TK_RBRACE,
    TK_EQ, TK_NE, TK_GT, TK_GTEQ, TK_LT, TK_LTEQ, TK_ASSIGN, TK_DOT,
    TK_COLON, TK_PIPE, TK_COMMA, TK_SEMICOLON,
} tk_type;

typedef struct {
    uint8_t type;
    int line;
    const char *p; /* TK_NAME: the name (NUL-terminated, arena); TK_DATA/TK_STRING: decoded text */
    size_t n;
    int64_t i;     /* TK_INT */
    double f;      /* TK_FLOAT */
    bool int_big;  /* TK_INT did not fit in int64 */
} ttoken;

typedef struct {
    ttoken *t;
    size_t n;
} ttokens;

/* Tokenizes normalized source (newlines already \n). */
void mr__tpl_lex(mr__arena *a, mr__tpl_err *e, const char *src, size_t n, ttokens *out);

/* ---------------- AST ---------------- */
typedef enum {
    /* expressions */
    N_CONST, N_NAME, N_GETATTR, N_GETITEM, N_SLICE, N_CALL, N_FILTER, N_TEST,
    N_NOT, N_NEG, N_POS, N_BINOP, N_AND, N_OR, N_CONCAT, N_COMPARE, N_COND,
    N_LIST, N_TUPLE, N_DICT, N_NSREF,
    /* statements */
    N_DATA, N_PRINT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_CALLBLOCK, N_FILTERBLOCK,
    N_WITH, N_BREAK, N_CONTINUE, N_BODY,
} tn_kind;

typedef enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW } tn_binop;
typedef enum { CMP_EQ, CMP_NE, CMP_LT, CMP_LTEQ, CMP_GT, CMP_GTEQ, CMP_IN, CMP_NOTIN } tn_cmp;

typedef struct {
    tnode **v;
    size_t n;
} tnlist;

/* One node type for all: which fields mean what is listed per kind.
 *   N_CONST      val
 *   N_NAME       name
 *   N_GETATTR    a.name
 *   N_GETITEM    a[b]
 *   N_SLICE      a:b:c (each may be NULL)
 *   N_CALL       a(args, kwnames=kwargs, *dyn_args=b, **dyn_kwargs=c)
 *   N_FILTER     a|name(args, kwargs) (a NULL in a filter block); id = filter id
 *   N_TEST       a is name(args, kwargs); id = test id
 *   N_NOT/NEG/POS a
 *   N_BINOP      a op b
 *   N_AND/OR     a, b
 *   N_CONCAT     args
 *   N_COMPARE    a, then (ops[i], args[i])
 *   N_COND       b if a else c (c may be NULL)
 *   N_LIST/TUPLE args
 *   N_DICT       args (key, value, key, value ...)
 *   N_NSREF      name.attr  (assignment target only)
 *   N_DATA       val (a string)
 *   N_PRINT      a
 *   N_IF         a: test, body, orelse
 *   N_FOR        a: target, b: iterable, c: filter (may be NULL), body, orelse
 *   N_SET        a: target, b: value
 *   N_SETBLOCK   a: target, b: filter chain (may be NULL), body
 *   N_MACRO      name, params = kwnames, defaults = args (aligned to the end), body
 *   N_CALLBLOCK  a: the call, params/defaults of caller, body
 *   N_FILTERBLOCK b: filter chain, body
 *   N_WITH       args: targets, kwargs: values, body
 *   N_BODY       body (the template root, {% generation %})
 */
struct tnode {
    uint8_t kind;
    uint8_t op;
    int line;
    int id;
    tnode *a, *b, *c;
    tnlist args;
    tnlist kwargs;
    const char **kwnames;
    uint8_t *ops;
    tnlist body, orelse;
    const char *name;
    const char *attr;
    tv val;
};

/* Parses tokens into a template body (N_BODY). */
tnode *mr__tpl_parse(mr__arena *a, mr__tpl_err *e, const ttokens *toks);

/* ---------------- builtins (template_builtins.c) ---------------- */
/* Filter and test names → ids (or -1); resolved at parse time so that an
 * unknown name fails the parse, as in jinja2. *unsupported is set for a
 * name jinja2 has that moerun does not implement. */
int mr__tpl_filter_id(const char *name, bool *unsupported);
int mr__tpl_test_id(const char *name, bool *unsupported);
/* Global functions → ids (or -1). */
int mr__tpl_global_id(const char *name);

/* ---------------- evaluation context ---------------- */
typedef struct tframe_out tframe_out;

typedef struct mr__tpl_ctx {
    mr__arena arena;
    mr__tpl_err err;
    mr_chat_limits lim;
    uint64_t steps;
    int depth;
    /* output buffers: out[0] is the result; captures push more */
    mr__buf *outs; /* cap_outs entries, sized from max_depth: captures nest only inside deeper frames */
    int n_outs, cap_outs;
    tscope *root;
    int cur_line;
    int loop_ctl; /* 0, 1 = break, 2 = continue */
} mr__tpl_ctx;

struct tscope {
    tscope *parent;
    tdict *vars;
};

/* evaluator services for builtins */
_Noreturn void mr__tpl_raise(mr__tpl_ctx *c, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
void mr__tpl_step(mr__tpl_ctx *c, uint64_t n);
bool mr__tv_truthy(const tv *v);
bool mr__tv_eq(mr__tpl_ctx *c, tv a, tv b);
int mr__tv_cmp(mr__tpl_ctx *c, int line, tv a, tv b); /* Python <, ==, > (-1, 0, 1); raises on mixed types */
tstr *mr__tv_to_str(mr__tpl_ctx *c, tv v); /* Python str() */
void mr__tv_repr(mr__tpl_ctx *c, mr__buf *b, tv v, int depth); /* Python repr() */
const char *mr__tv_type_name(tv v); /* Python type name for messages */
tv mr__tv_getattr(mr__tpl_ctx *c, int line, tv obj, const char *name, size_t n);
tv mr__tv_getitem(mr__tpl_ctx *c, int line, tv obj, tv key);
/* iterate: returns a list (dict → keys, str → characters); raises if not iterable */
tlist *mr__tv_iter(mr__tpl_ctx *c, int line, tv v);
tv mr__tv_call(mr__tpl_ctx *c, int line, tv fn, tv *args, size_t nargs, const char **kwn, tv *kwv, size_t nkw);
int64_t mr__tv_len(mr__tpl_ctx *c, int line, tv v);
tv mr__tpl_filter_call(mr__tpl_ctx *c, int line, int id, tv v, tv *args, size_t nargs, const char **kwn, tv *kwv,
                      size_t nkw);
bool mr__tpl_test_call(mr__tpl_ctx *c, int line, int id, tv v, tv *args, size_t nargs, const char **kwn, tv *kwv,
                      size_t nkw);
tv mr__tpl_global_call(mr__tpl_ctx *c, int line, int id, tv *args, size_t nargs, const char **kwn, tv *kwv,
                      size_t nkw);
tv mr__tpl_method_call(mr__tpl_ctx *c, int line, tmethod *m, tv *args, size_t nargs, const char **kwn, tv *kwv,
                      size_t nkw);
/* attribute → bound method of a builtin type, or TV_MISSING */
tv mr__tpl_method_lookup(mr__tpl_ctx *c, tv obj, const char *name, size_t n);
/* json.dumps(v, ensure_ascii, indent, separators, sort_keys) */
void mr__tv_json(mr__tpl_ctx *c, int line, mr__buf *b, tv v, bool ensure_ascii, const char *indent,
                 const char *item_sep, const char *key_sep, bool sort_keys, int level);
tv mr__tv_from_json(mr__tpl_ctx *c, const json_t *j, int depth);
tv mr__tv_str_checked(mr__tpl_ctx *c, const char *p, size_t n);
/* call a macro value */
tv mr__tpl_macro_call(mr__tpl_ctx *c, int line, tmacro *m, tv *args, size_t nargs, const char **kwn, tv *kwv,
                      size_t nkw, const tnode *caller_body);
/* `str % args` (printf style) and `+` for the sum filter */
tv mr__tpl_percent_format(mr__tpl_ctx *c, int line, tstr *fmt, tv args);
tv mr__tpl_binop_add(mr__tpl_ctx *c, int line, tv a, tv b);
/* a fresh scratch output buffer on the context's stack (freed on errors
 * with the context), and its release */
mr__buf *mr__tpl_push_buf(mr__tpl_ctx *c);
void mr__tpl_pop_buf(mr__tpl_ctx *c);
/* out-of-memory or budget: raise through the context */
void mr__tpl_oom(mr__tpl_ctx *c);

#define TPL_ALLOC(c, n) mr__arena_alloc(&(c)->arena, (n))

#endif
