/* template_eval.c — renders a parsed template: scopes, statements,
 * expressions, attribute and item access, calls, macros; and the public
 * mr_chat_template_parse / render / free.
 *
 * Scoping follows jinja2: `set` at the top level or inside if/with/macro
 * writes the innermost scope; each for-loop iteration gets a fresh scope
 * (what is set in one iteration is gone in the next and after the loop, so
 * templates carry state in a namespace()); a macro sees the scope it was
 * defined in, at call time. Undefined names evaluate to Undefined, which
 * prints as "" and is false, and raises when used as a value (arithmetic,
 * attribute of it, call). Every evaluated node counts one step; every
 * nested evaluation one level of depth. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/template_internal.h"

struct mr_chat_template {
    mr__arena arena;
    tnode *root;
    char *src;
    size_t len;
    char name[64];
};

void mr_chat_limits_default(mr_chat_limits *l) {
    l->max_output_bytes = (size_t)16 << 20;
    l->max_memory_bytes = (size_t)256 << 20;
    l->max_steps = 20000000;
    l->max_depth = 500;
    l->now_unix = 0;
}

/* ---------------- context services ---------------- */
_Noreturn void mr__tpl_raise(mr__tpl_ctx *c, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err.msg, sizeof c->err.msg, fmt, ap);
    va_end(ap);
    c->err.status = MR_EINPUT;
    c->err.line = line ? line : c->cur_line;
    longjmp(c->err.jb, 1);
}

void mr__tpl_oom(mr__tpl_ctx *c) { mr__tpl_fail(&c->err, MR_ENOMEM, c->cur_line, "out of memory"); }

void mr__tpl_step(mr__tpl_ctx *c, uint64_t n) {
    c->steps += n;
    if (c->lim.max_steps && c->steps > c->lim.max_steps)
        mr__tpl_fail(&c->err, MR_ECAPACITY, c->cur_line,
                     "the template ran more than %llu steps (an endless or huge loop?); raise mr_chat_limits.max_steps "
                     "if this is expected",
                     (unsigned long long)c->lim.max_steps);
}

static void out_add(mr__tpl_ctx *c, const char *p, size_t n) {
    mr__buf *b = &c->outs[c->n_outs - 1];
    if (c->lim.max_output_bytes && (n > c->lim.max_output_bytes || b->n > c->lim.max_output_bytes - n))
        mr__tpl_fail(&c->err, MR_ECAPACITY, c->cur_line, "the rendered text exceeds the output limit (%zu bytes)",
                     c->lim.max_output_bytes);
    if (!mr__buf_add(b, p, n)) mr__tpl_oom(c);
}

mr__buf *mr__tpl_push_buf(mr__tpl_ctx *c) {
    if (c->n_outs >= c->cap_outs)
        mr__tpl_fail(&c->err, MR_ECAPACITY, c->cur_line,
                     "blocks that capture output (macros, set blocks, filter blocks) nest too deeply");
    mr__buf *b = &c->outs[c->n_outs++];
    memset(b, 0, sizeof *b);
    return b;
}

void mr__tpl_pop_buf(mr__tpl_ctx *c) {
    mr__buf_free(&c->outs[c->n_outs - 1]);
    c->n_outs--;
}

static void capture_begin(mr__tpl_ctx *c) { mr__tpl_push_buf(c); }

static tstr *capture_end(mr__tpl_ctx *c) {
    mr__buf *b = &c->outs[c->n_outs - 1];
    tstr *s = mr__tstr_new(&c->arena, b->p ? b->p : "", b->n);
    mr__buf_free(b);
    c->n_outs--;
    return s;
}

/* ---------------- scopes ---------------- */
static tscope *scope_new(mr__tpl_ctx *c, tscope *parent) {
    tscope *s = TPL_ALLOC(c, sizeof *s);
    s->parent = parent;
    s->vars = mr__tdict_new(&c->arena, 0);
    return s;
}

/* A scope entry holding TV_MISSING is unset: loop scopes keep their keys
 * between iterations and unset the values, so that an iteration allocates
 * nothing. */
static tv *scope_find(tscope *s, const char *name, size_t n) {
    for (; s; s = s->parent) {
        tv *v = mr__tdict_get_str(s->vars, name, n);
        if (v && v->kind != TV_MISSING) return v;
    }
    return NULL;
}

static void scope_set(mr__tpl_ctx *c, tscope *s, const char *name, tv v) {
    tv *o = mr__tdict_get_str(s->vars, name, strlen(name));
    if (o) *o = v;
    else mr__tdict_set(&c->arena, s->vars, mr__tv_cstr(&c->arena, name), v);
}

static void scope_unset_all(tscope *s) {
    for (size_t i = 0; i < s->vars->n; i++) s->vars->v[i] = tv_missing();
}

static tv undef_hint(mr__tpl_ctx *c, const char *fmt, const char *a, const char *b) {
    char msg[256];
    snprintf(msg, sizeof msg, fmt, a, b);
    tv v = tv_undef();
    v.u.s = mr__tstr_cstr(&c->arena, msg);
    return v;
}

_Noreturn static void raise_undef(mr__tpl_ctx *c, int line, tv u) {
    mr__tpl_raise(c, line, "%s", u.u.s ? u.u.s->p : "undefined value");
}

/* ---------------- attribute / item access ---------------- */
static const char *obj_desc(tv v) {
    switch (v.kind) {
    case TV_DICT: return "dict object";
    case TV_STR: return "str object";
    case TV_LIST: return v.u.l->tuple ? "tuple object" : "list object";
    case TV_NONE: return "None";
    case TV_INT: return "int object";
    case TV_FLOAT: return "float object";
    case TV_BOOL: return "bool object";
    case TV_NS: return "Namespace object";
    default: return "object";
    }
}

static tv loop_attr(mr__tpl_ctx *c, tloop *L, const char *name, bool *found) {
    *found = true;
    if (!strcmp(name, "index")) return tv_int((int64_t)L->index0 + 1);
    if (!strcmp(name, "index0")) return tv_int((int64_t)L->index0);
    if (!strcmp(name, "revindex")) return tv_int((int64_t)(L->length - L->index0));
    if (!strcmp(name, "revindex0")) return tv_int((int64_t)(L->length - L->index0 - 1));
    if (!strcmp(name, "first")) return tv_bool(L->index0 == 0);
    if (!strcmp(name, "last")) return tv_bool(L->index0 + 1 == L->length);
    if (!strcmp(name, "length")) return tv_int((int64_t)L->length);
    if (!strcmp(name, "depth")) return tv_int(L->depth);
    if (!strcmp(name, "depth0")) return tv_int(L->depth - 1);
    if (!strcmp(name, "previtem")) return L->index0 == 0 ? undef_hint(c, "there is no previous item%s%s", "", "") : L->prev;
    if (!strcmp(name, "nextitem"))
        return L->index0 + 1 >= L->length ? undef_hint(c, "there is no next item%s%s", "", "") : L->next;
    *found = false;
    return tv_undef();
}

tv mr__tv_getattr(mr__tpl_ctx *c, int line, tv obj, const char *name, size_t n) {
    if (obj.kind == TV_UNDEF) raise_undef(c, line, obj);
    if (obj.kind == TV_LOOP) {
        bool found;
        tv v = loop_attr(c, obj.u.loop, name, &found);
        if (found) return v;
    }
    if (obj.kind == TV_NS) {
        tv *v = mr__tdict_get_str(obj.u.d, name, n);
        if (v) return *v;
        return undef_hint(c, "'%s' has no attribute '%s'", obj_desc(obj), name);
    }
    /* Python attributes first (methods), then items, as jinja2's getattr */
    tv m = mr__tpl_method_lookup(c, obj, name, n);
    if (m.kind != TV_MISSING) return m;
    if (obj.kind == TV_DICT) {
        tv *v = mr__tdict_get_str(obj.u.d, name, n);
        if (v) return *v;
    }
    return undef_hint(c, "'%s' has no attribute '%s'", obj_desc(obj), name);
}

typedef struct {
    int64_t start, stop, step, count;
} pyslice;

static int64_t slice_arg(mr__tpl_ctx *c, int line, tv v, bool *given) {
    *given = false;
    if (v.kind == TV_NONE || v.kind == TV_MISSING) return 0;
    if (v.kind == TV_INT || v.kind == TV_BOOL) {
        *given = true;
        return v.kind == TV_INT ? v.u.i : v.u.b;
    }
    if (v.kind == TV_UNDEF) raise_undef(c, line, v);
    mr__tpl_raise(c, line, "slice indices must be integers or None, not %s", mr__tv_type_name(v));
}

/* Python's slice.indices(len) and the element count */
static pyslice slice_indices(mr__tpl_ctx *c, int line, tv a, tv b, tv s, int64_t len) {
    pyslice r;
    bool ga, gb, gs;
    int64_t start = slice_arg(c, line, a, &ga), stop = slice_arg(c, line, b, &gb), step = slice_arg(c, line, s, &gs);
    if (!gs) step = 1;
    if (step == 0) mr__tpl_raise(c, line, "slice step cannot be zero");
    if (step < -INT64_MAX) step = -INT64_MAX;
    if (!ga) start = step < 0 ? len - 1 : 0;
    else {
        if (start < 0) start = start < -len ? (step < 0 ? -1 : 0) : start + len;
        else if (start >= len) start = step < 0 ? len - 1 : len;
    }
    if (!gb) stop = step < 0 ? -1 : len;
    else {
        if (stop < 0) stop = stop < -len ? (step < 0 ? -1 : 0) : stop + len;
        else if (stop >= len) stop = step < 0 ? len - 1 : len;
    }
    int64_t cnt = 0;
    if (step > 0 && start < stop) cnt = (stop - start - 1) / step + 1;
    if (step < 0 && stop < start) cnt = (start - stop - 1) / (-step) + 1;
    r.start = start;
    r.stop = stop;
    r.step = step;
    r.count = cnt;
    return r;
}

static tv do_slice(mr__tpl_ctx *c, int line, tv obj, tv a, tv b, tv s) {
    if (obj.kind == TV_UNDEF) raise_undef(c, line, obj);
    if (obj.kind == TV_LIST) {
        pyslice r = slice_indices(c, line, a, b, s, (int64_t)obj.u.l->n);
        tlist *l = mr__tlist_new(&c->arena, (size_t)r.count);
        for (int64_t k = 0, i = r.start; k < r.count; k++, i += r.step) l->v[l->n++] = obj.u.l->v[i];
        l->tuple = obj.u.l->tuple;
        tv v = {0};
        v.kind = TV_LIST;
        v.u.l = l;
        return v;
    }
    if (obj.kind == TV_STR) {
        tstr *str = obj.u.s;
        int64_t ncp = mr__tstr_ncp(str);
        pyslice r = slice_indices(c, line, a, b, s, ncp);
        if (r.step == 1) {
            size_t o1 = mr__utf8_offset(str->p, str->len, r.start);
            size_t o2 = mr__utf8_offset(str->p + o1, str->len - o1, r.count) + o1;
            return mr__tv_str(&c->arena, str->p + o1, o2 - o1);
        }
        /* general step: index the code points */
        size_t *offs = TPL_ALLOC(c, ((size_t)ncp + 1) * sizeof(size_t));
        size_t i = 0;
        for (int64_t k = 0; k < ncp; k++) {
            offs[k] = i;
            i++;
            while (i < str->len && ((unsigned char)str->p[i] & 0xC0) == 0x80) i++;
        }
        offs[ncp] = str->len;
        capture_begin(c);
        for (int64_t k = 0, j = r.start; k < r.count; k++, j += r.step)
            out_add(c, str->p + offs[j], offs[j + 1] - offs[j]);
        return tv_strv(capture_end(c));
    }
    mr__tpl_raise(c, line, "'%s' object is not subscriptable", mr__tv_type_name(obj));
}

tv mr__tv_getitem(mr__tpl_ctx *c, int line, tv obj, tv key) {
    if (obj.kind == TV_UNDEF) raise_undef(c, line, obj);
    switch (obj.kind) {
    case TV_LIST:
    case TV_STR:
        if (key.kind == TV_INT || key.kind == TV_BOOL) {
            int64_t i = key.kind == TV_INT ? key.u.i : key.u.b;
            int64_t n = obj.kind == TV_LIST ? (int64_t)obj.u.l->n : mr__tstr_ncp(obj.u.s);
            if (i < 0) i += n;
            if (i >= 0 && i < n) {
                if (obj.kind == TV_LIST) return obj.u.l->v[i];
                size_t o1 = mr__utf8_offset(obj.u.s->p, obj.u.s->len, i);
                size_t adv;
                mr__utf8_decode(obj.u.s->p + o1, obj.u.s->len - o1, &adv);
                return mr__tv_str(&c->arena, obj.u.s->p + o1, adv);
            }
            char num[32];
            snprintf(num, sizeof num, "%lld", (long long)(key.kind == TV_INT ? key.u.i : key.u.b));
            return undef_hint(c, "%s has no element %s", obj_desc(obj), num);
        }
        break;
    case TV_DICT: {
        tv *v = mr__tdict_get(obj.u.d, key);
        if (v) return *v;
        break;
    }
    case TV_NS:
        if (key.kind == TV_STR) return mr__tv_getattr(c, line, obj, key.u.s->p, key.u.s->len);
        break;
    default:
        break;
    }
    if (key.kind == TV_STR) {
        /* jinja2 falls back to the attribute */
        tv m = obj.kind == TV_LOOP ? mr__tv_getattr(c, line, obj, key.u.s->p, key.u.s->len)
                                   : mr__tpl_method_lookup(c, obj, key.u.s->p, key.u.s->len);
        if (m.kind != TV_MISSING && m.kind != TV_UNDEF) return m;
        return undef_hint(c, "'%s' has no attribute '%s'", obj_desc(obj), key.u.s->p);
    }
    return undef_hint(c, "'%s' has no element of that key%s", obj_desc(obj), "");
}

tlist *mr__tv_iter(mr__tpl_ctx *c, int line, tv v) {
    switch (v.kind) {
    case TV_UNDEF:
        return mr__tlist_new(&c->arena, 0);
    case TV_LIST:
        return v.u.l;
    case TV_DICT:
    case TV_NS: {
        if (v.kind == TV_NS) break;
        tlist *l = mr__tlist_new(&c->arena, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) l->v[l->n++] = v.u.d->k[i];
        return l;
    }
    case TV_STR: {
        tstr *s = v.u.s;
        tlist *l = mr__tlist_new(&c->arena, (size_t)mr__tstr_ncp(s));
        size_t i = 0;
        while (i < s->len) {
            size_t adv;
            mr__utf8_decode(s->p + i, s->len - i, &adv);
            l->v[l->n++] = mr__tv_str(&c->arena, s->p + i, adv);
            i += adv;
        }
        mr__tpl_step(c, l->n / 16);
        return l;
    }
    default:
        break;
    }
    mr__tpl_raise(c, line, "'%s' object is not iterable", mr__tv_type_name(v));
}

int64_t mr__tv_len(mr__tpl_ctx *c, int line, tv v) {
    switch (v.kind) {
    case TV_UNDEF:
        return 0;
    case TV_STR:
        return mr__tstr_ncp(v.u.s);
    case TV_LIST:
        return (int64_t)v.u.l->n;
    case TV_DICT:
        return (int64_t)v.u.d->n;
    case TV_LOOP:
        return (int64_t)v.u.loop->length;
    default:
        mr__tpl_raise(c, line, "object of type '%s' has no len()", mr__tv_type_name(v));
    }
}

/* ---------------- evaluation ---------------- */
static tv eval(mr__tpl_ctx *c, tscope *s, const tnode *x);
static void exec_body(mr__tpl_ctx *c, tscope *s, const tnlist *body);

static void enter(mr__tpl_ctx *c, int line) {
    if (++c->depth > c->lim.max_depth)
        mr__tpl_fail(&c->err, MR_ECAPACITY, line,
                     "the template nests deeper than %d levels (endless macro recursion?)", c->lim.max_depth);
}

static tv mk_list(tlist *l) {
    tv v = {0};
    v.kind = TV_LIST;
    v.u.l = l;
    return v;
}

static bool overflow_add(int64_t a, int64_t b, int64_t *r) { return __builtin_add_overflow(a, b, r); }
static bool overflow_sub(int64_t a, int64_t b, int64_t *r) { return __builtin_sub_overflow(a, b, r); }
static bool overflow_mul(int64_t a, int64_t b, int64_t *r) { return __builtin_mul_overflow(a, b, r); }

static bool is_int(tv v) { return v.kind == TV_INT || v.kind == TV_BOOL; }
static bool is_numv(tv v) { return is_int(v) || v.kind == TV_FLOAT; }
static int64_t iv(tv v) { return v.kind == TV_INT ? v.u.i : (int64_t)v.u.b; }
static double dv(tv v) { return v.kind == TV_FLOAT ? v.u.f : (double)iv(v); }

_Noreturn static void bad_operands(mr__tpl_ctx *c, int line, const char *op, tv a, tv b) {
    if (a.kind == TV_UNDEF) raise_undef(c, line, a);
    if (b.kind == TV_UNDEF) raise_undef(c, line, b);
    mr__tpl_raise(c, line, "unsupported operand type(s) for %s: '%s' and '%s'", op, mr__tv_type_name(a),
                  mr__tv_type_name(b));
}

static tv repeat(mr__tpl_ctx *c, int line, tv seq, int64_t n) {
    if (n < 0) n = 0;
    if (seq.kind == TV_STR) {
        size_t len = seq.u.s->len, total;
        if (!mr_size_mul(len, (size_t)n, &total) || (c->lim.max_memory_bytes && total > c->lim.max_memory_bytes))
            mr__tpl_fail(&c->err, MR_ECAPACITY, line, "string repetition too large (%zu x %lld)", len, (long long)n);
        tstr *r = TPL_ALLOC(c, sizeof(tstr) + total + 1);
        r->len = total;
        r->ncp = -1;
        for (int64_t k = 0; k < n; k++) memcpy(r->p + (size_t)k * len, seq.u.s->p, len);
        r->p[total] = 0;
        mr__tpl_step(c, total / 64);
        return tv_strv(r);
    }
    size_t cnt = seq.u.l->n, total;
    if (!mr_size_mul(cnt, (size_t)n, &total) || total > 100000000)
        mr__tpl_fail(&c->err, MR_ECAPACITY, line, "list repetition too large");
    tlist *l = mr__tlist_new(&c->arena, total);
    for (int64_t k = 0; k < n; k++)
        for (size_t i = 0; i < cnt; i++) l->v[l->n++] = seq.u.l->v[i];
    l->tuple = seq.u.l->tuple;
    mr__tpl_step(c, total);
    return mk_list(l);
}

static tv binop(mr__tpl_ctx *c, int line, int op, tv a, tv b) {
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
    int64_t r;
    if (is_numv(a) && is_numv(b)) {
        bool flt = a.kind == TV_FLOAT || b.kind == TV_FLOAT;
        switch (op) {
        case OP_ADD:
            if (flt) return tv_float(dv(a) + dv(b));
            if (overflow_add(iv(a), iv(b), &r)) break;
            return tv_int(r);
        case OP_SUB:
            if (flt) return tv_float(dv(a) - dv(b));
            if (overflow_sub(iv(a), iv(b), &r)) break;
            return tv_int(r);
        case OP_MUL:
            if (flt) return tv_float(dv(a) * dv(b));
            if (overflow_mul(iv(a), iv(b), &r)) break;
            return tv_int(r);
        case OP_DIV:
            if (dv(b) == 0) mr__tpl_raise(c, line, "division by zero");
            return tv_float(dv(a) / dv(b));
        case OP_FLOORDIV:
            if (flt) {
                if (dv(b) == 0) mr__tpl_raise(c, line, "float floor division by zero");
                return tv_float(floor(dv(a) / dv(b)));
            } else {
                int64_t x = iv(a), y = iv(b);
                if (y == 0) mr__tpl_raise(c, line, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) break;
                int64_t q = x / y;
                if ((x % y != 0) && ((x < 0) != (y < 0))) q--;
                return tv_int(q);
            }
        case OP_MOD:
            if (flt) {
                double x = dv(a), y = dv(b);
                if (y == 0) mr__tpl_raise(c, line, "float modulo");
                double m = fmod(x, y);
                if (m != 0 && ((m < 0) != (y < 0))) m += y;
                return tv_float(m);
            } else {
                int64_t x = iv(a), y = iv(b);
                if (y == 0) mr__tpl_raise(c, line, "integer division or modulo by zero");
                if (y == -1) return tv_int(0);
                int64_t m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) m += y;
                return tv_int(m);
            }
        case OP_POW:
            if (!flt && iv(b) >= 0) {
                int64_t base = iv(a), e = iv(b), acc = 1;
                bool ovf = false;
                while (e > 0 && !ovf) {
                    if (e & 1) ovf |= overflow_mul(acc, base, &acc);
                    e >>= 1;
                    if (e) ovf |= overflow_mul(base, base, &base);
                }
                if (ovf) break;
                return tv_int(acc);
            }
            if (dv(a) == 0 && dv(b) < 0) mr__tpl_raise(c, line, "0.0 cannot be raised to a negative power");
            return tv_float(pow(dv(a), dv(b)));
        }
        mr__tpl_raise(c, line, "integer overflow in '%s' (moerun integers are 64-bit)", names[op]);
    }
    if (op == OP_ADD) {
        if (a.kind == TV_STR && b.kind == TV_STR) return tv_strv(mr__tstr_cat(&c->arena, a.u.s, b.u.s));
        if (a.kind == TV_LIST && b.kind == TV_LIST && a.u.l->tuple == b.u.l->tuple) {
            tlist *l = mr__tlist_new(&c->arena, a.u.l->n + b.u.l->n);
            for (size_t i = 0; i < a.u.l->n; i++) l->v[l->n++] = a.u.l->v[i];
            for (size_t i = 0; i < b.u.l->n; i++) l->v[l->n++] = b.u.l->v[i];
            l->tuple = a.u.l->tuple;
            mr__tpl_step(c, l->n / 8);
            return mk_list(l);
        }
    }
    if (op == OP_MUL) {
        if ((a.kind == TV_STR || a.kind == TV_LIST) && is_int(b)) return repeat(c, line, a, iv(b));
        if ((b.kind == TV_STR || b.kind == TV_LIST) && is_int(a)) return repeat(c, line, b, iv(a));
    }
    if (op == OP_MOD && a.kind == TV_STR) return mr__tpl_percent_format(c, line, a.u.s, b);
    bad_operands(c, line, names[op], a, b);
}

static bool compare(mr__tpl_ctx *c, int line, int op, tv a, tv b) {
    switch (op) {
    case CMP_EQ:
        return mr__tv_eq(c, a, b);
    case CMP_NE:
        return !mr__tv_eq(c, a, b);
    case CMP_LT:
        return mr__tv_cmp(c, line, a, b) < 0;
    case CMP_LTEQ:
        return mr__tv_cmp(c, line, a, b) <= 0;
    case CMP_GT:
        return mr__tv_cmp(c, line, a, b) > 0;
    case CMP_GTEQ:
        return mr__tv_cmp(c, line, a, b) >= 0;
    case CMP_IN:
    case CMP_NOTIN: {
        bool in = false;
        if (b.kind == TV_STR) {
            if (a.kind != TV_STR)
                mr__tpl_raise(c, line, "'in <string>' requires string as left operand, not %s", mr__tv_type_name(a));
            in = a.u.s->len == 0 || memmem(b.u.s->p, b.u.s->len, a.u.s->p, a.u.s->len) != NULL;
            mr__tpl_step(c, b.u.s->len / 64);
        } else if (b.kind == TV_DICT || b.kind == TV_NS) {
            in = mr__tdict_get(b.u.d, a) != NULL;
            mr__tpl_step(c, b.u.d->n / 8);
        } else if (b.kind == TV_LIST) {
            for (size_t i = 0; i < b.u.l->n && !in; i++) in = mr__tv_eq(c, a, b.u.l->v[i]);
            mr__tpl_step(c, b.u.l->n / 8);
        } else if (b.kind == TV_UNDEF) {
            in = false;
        } else {
            mr__tpl_raise(c, line, "argument of type '%s' is not iterable", mr__tv_type_name(b));
        }
        return op == CMP_IN ? in : !in;
    }
    }
    return false;
}

/* evaluates call-style arguments into arena arrays */
typedef struct {
    tv *args;
    size_t nargs;
    const char **kwn;
    tv *kwv;
    size_t nkw;
} targs;

static targs eval_args(mr__tpl_ctx *c, tscope *s, const tnode *x, tv *prefix, size_t nprefix) {
    targs r = {0};
    size_t extra = 0;
    tv dyn = tv_undef(), dynkw = tv_undef();
    if (x->kind == N_CALL && x->b) {
        dyn = eval(c, s, x->b);
        if (dyn.kind != TV_LIST) mr__tpl_raise(c, x->line, "argument after * must be an iterable, not %s", mr__tv_type_name(dyn));
        extra = dyn.u.l->n;
    }
    if (x->kind == N_CALL && x->c) {
        dynkw = eval(c, s, x->c);
        if (dynkw.kind != TV_DICT)
            mr__tpl_raise(c, x->line, "argument after ** must be a mapping, not %s", mr__tv_type_name(dynkw));
    }
    r.nargs = nprefix + x->args.n + extra;
    r.args = TPL_ALLOC(c, (r.nargs + 1) * sizeof(tv));
    for (size_t i = 0; i < nprefix; i++) r.args[i] = prefix[i];
    for (size_t i = 0; i < x->args.n; i++) r.args[nprefix + i] = eval(c, s, x->args.v[i]);
    for (size_t i = 0; i < extra; i++) r.args[nprefix + x->args.n + i] = dyn.u.l->v[i];
    size_t nkw = x->kwargs.n + (dynkw.kind == TV_DICT ? dynkw.u.d->n : 0);
    r.kwn = TPL_ALLOC(c, (nkw + 1) * sizeof(char *));
    r.kwv = TPL_ALLOC(c, (nkw + 1) * sizeof(tv));
    for (size_t i = 0; i < x->kwargs.n; i++) {
        r.kwn[i] = x->kwnames[i];
        r.kwv[i] = eval(c, s, x->kwargs.v[i]);
    }
    r.nkw = x->kwargs.n;
    if (dynkw.kind == TV_DICT)
        for (size_t i = 0; i < dynkw.u.d->n; i++) {
            if (dynkw.u.d->k[i].kind != TV_STR) mr__tpl_raise(c, x->line, "keywords must be strings");
            r.kwn[r.nkw] = dynkw.u.d->k[i].u.s->p;
            r.kwv[r.nkw++] = dynkw.u.d->v[i];
        }
    return r;
}

_Noreturn static void unknown_name(mr__tpl_ctx *c, const tnode *x) {
    const char *what = x->kind == N_FILTER ? "filter" : "test";
    if (x->id == -2) mr__tpl_raise(c, x->line, "the %s '%s' is not supported by moerun", what, x->name);
    mr__tpl_raise(c, x->line, "No %s named '%s' found.", what, x->name);
}

/* applies a filter chain (innermost node has a == NULL) to v */
static tv apply_filters(mr__tpl_ctx *c, tscope *s, const tnode *f, tv v) {
    if (!f) return v;
    if (f->a) v = apply_filters(c, s, f->a, v);
    if (f->id < 0) unknown_name(c, f);
    targs a = eval_args(c, s, f, NULL, 0);
    return mr__tpl_filter_call(c, f->line, f->id, v, a.args, a.nargs, a.kwn, a.kwv, a.nkw);
}

static tv eval(mr__tpl_ctx *c, tscope *s, const tnode *x) {
    mr__tpl_step(c, 1);
    enter(c, x->line);
    int saved_line = c->cur_line;
    c->cur_line = x->line;
    tv r = tv_undef();
    switch (x->kind) {
    case N_CONST:
        r = x->val;
        break;
    case N_NAME: {
        size_t n = strlen(x->name);
        tv *v = scope_find(s, x->name, n);
        if (v) {
            r = *v;
            break;
        }
        int g = mr__tpl_global_id(x->name);
        if (g >= 0) {
            r.kind = TV_FUNC;
            r.u.fn = g;
            break;
        }
        r = undef_hint(c, "'%s' is undefined%s", x->name, "");
        break;
    }
    case N_GETATTR: {
        tv o = eval(c, s, x->a);
        r = mr__tv_getattr(c, x->line, o, x->name, strlen(x->name));
        break;
    }
    case N_GETITEM: {
        tv o = eval(c, s, x->a);
        if (x->b->kind == N_SLICE) {
            const tnode *sl = x->b;
            tv a = sl->a ? eval(c, s, sl->a) : tv_none();
            tv b = sl->b ? eval(c, s, sl->b) : tv_none();
            tv st = sl->c ? eval(c, s, sl->c) : tv_none();
            r = do_slice(c, x->line, o, a, b, st);
        } else {
            r = mr__tv_getitem(c, x->line, o, eval(c, s, x->b));
        }
        break;
    }
    case N_CALL: {
        tv fn = eval(c, s, x->a);
        targs a = eval_args(c, s, x, NULL, 0);
        r = mr__tv_call(c, x->line, fn, a.args, a.nargs, a.kwn, a.kwv, a.nkw);
        break;
    }
    case N_FILTER: {
        if (x->id < 0) unknown_name(c, x);
        tv v = eval(c, s, x->a);
        targs a = eval_args(c, s, x, NULL, 0);
        r = mr__tpl_filter_call(c, x->line, x->id, v, a.args, a.nargs, a.kwn, a.kwv, a.nkw);
        break;
    }
    case N_TEST: {
        if (x->id < 0) unknown_name(c, x);
        tv v = eval(c, s, x->a);
        targs a = eval_args(c, s, x, NULL, 0);
        r = tv_bool(mr__tpl_test_call(c, x->line, x->id, v, a.args, a.nargs, a.kwn, a.kwv, a.nkw));
        break;
    }
    case N_NOT: {
        tv v = eval(c, s, x->a);
        r = tv_bool(!mr__tv_truthy(&v));
        break;
    }
    case N_NEG:
    case N_POS: {
        tv v = eval(c, s, x->a);
        if (v.kind == TV_UNDEF) raise_undef(c, x->line, v);
        if (v.kind == TV_FLOAT) r = tv_float(x->kind == N_NEG ? -v.u.f : v.u.f);
        else if (is_int(v)) {
            if (x->kind == N_NEG && iv(v) == INT64_MIN) mr__tpl_raise(c, x->line, "integer overflow");
            r = tv_int(x->kind == N_NEG ? -iv(v) : iv(v));
        } else
            mr__tpl_raise(c, x->line, "bad operand type for unary %s: '%s'", x->kind == N_NEG ? "-" : "+",
                          mr__tv_type_name(v));
        break;
    }
    case N_BINOP: {
        tv a = eval(c, s, x->a);
        tv b = eval(c, s, x->b);
        r = binop(c, x->line, x->op, a, b);
        break;
    }
    case N_AND: {
        tv a = eval(c, s, x->a);
        r = mr__tv_truthy(&a) ? eval(c, s, x->b) : a;
        break;
    }
    case N_OR: {
        tv a = eval(c, s, x->a);
        r = mr__tv_truthy(&a) ? a : eval(c, s, x->b);
        break;
    }
    case N_CONCAT: {
        capture_begin(c);
        for (size_t i = 0; i < x->args.n; i++) {
            tstr *t = mr__tv_to_str(c, eval(c, s, x->args.v[i]));
            out_add(c, t->p, t->len);
        }
        r = tv_strv(capture_end(c));
        break;
    }
    case N_COMPARE: {
        tv left = eval(c, s, x->a);
        bool ok = true;
        for (size_t i = 0; i < x->args.n && ok; i++) {
            tv right = eval(c, s, x->args.v[i]);
            ok = compare(c, x->line, x->ops[i], left, right);
            left = right;
        }
        r = tv_bool(ok);
        break;
    }
    case N_COND: {
        tv t = eval(c, s, x->a);
        if (mr__tv_truthy(&t)) r = eval(c, s, x->b);
        else if (x->c) r = eval(c, s, x->c);
        else {
            char ln[24];
            snprintf(ln, sizeof ln, "%d", x->line);
            r = undef_hint(c, "the inline if-expression on line %s evaluated to false and no else section was defined.%s", ln, "");
        }
        break;
    }
    case N_LIST:
    case N_TUPLE: {
        tlist *l = mr__tlist_new(&c->arena, x->args.n);
        for (size_t i = 0; i < x->args.n; i++) l->v[l->n++] = eval(c, s, x->args.v[i]);
        l->tuple = x->kind == N_TUPLE;
        r = mk_list(l);
        break;
    }
    case N_DICT: {
        tdict *d = mr__tdict_new(&c->arena, x->args.n / 2);
        for (size_t i = 0; i + 1 < x->args.n; i += 2) {
            tv k = eval(c, s, x->args.v[i]);
            if (k.kind == TV_LIST && !k.u.l->tuple) mr__tpl_raise(c, x->line, "unhashable type: 'list'");
            if (k.kind == TV_DICT) mr__tpl_raise(c, x->line, "unhashable type: 'dict'");
            mr__tdict_set(&c->arena, d, k, eval(c, s, x->args.v[i + 1]));
        }
        r.kind = TV_DICT;
        r.u.d = d;
        break;
    }
    default:
        mr__tpl_raise(c, x->line, "internal error: node kind %d is not an expression", x->kind);
    }
    c->cur_line = saved_line;
    c->depth--;
    return r;
}

/* ---------------- assignment ---------------- */
static void assign(mr__tpl_ctx *c, tscope *s, const tnode *t, tv v) {
    if (t->kind == N_NAME) {
        scope_set(c, s, t->name, v);
        return;
    }
    if (t->kind == N_NSREF) {
        tv *ns = scope_find(s, t->name, strlen(t->name));
        if (!ns || ns->kind != TV_NS)
            mr__tpl_raise(c, t->line, "cannot assign attribute on non-namespace object '%s'", t->name);
        if (t->attr[0] == '_')
            mr__tpl_raise(c, t->line, "namespace attributes may not start with an underscore ('%s')", t->attr);
        mr__tdict_set(&c->arena, ns->u.d, mr__tv_cstr(&c->arena, t->attr), v);
        return;
    }
    /* tuple unpacking */
    tlist *items = mr__tv_iter(c, t->line, v);
    if (v.kind == TV_UNDEF) raise_undef(c, t->line, v);
    if (items->n != t->args.n)
        mr__tpl_raise(c, t->line, items->n < t->args.n ? "not enough values to unpack (expected %zu, got %zu)"
                                                       : "too many values to unpack (expected %zu, got %zu)",
                      t->args.n, items->n);
    for (size_t i = 0; i < t->args.n; i++) assign(c, s, t->args.v[i], items->v[i]);
}

/* ---------------- macros ---------------- */
tv mr__tpl_macro_call(mr__tpl_ctx *c, int line, tmacro *m, tv *args, size_t nargs, const char **kwn, tv *kwv,
                      size_t nkw, const tnode *caller_body) {
    (void)caller_body;
    const tnode *mn = m->node;
    size_t np = mn->kwargs.n, nd = mn->args.n;
    if (nargs > np)
        mr__tpl_raise(c, line, "macro '%s' takes not more than %zu argument(s)", m->name, np);
    enter(c, line);
    tscope *ms = scope_new(c, m->closure);
    bool *given = TPL_ALLOC(c, np + 1);
    for (size_t i = 0; i < nargs; i++) {
        scope_set(c, ms, mn->kwnames[i], args[i]);
        given[i] = true;
    }
    for (size_t k = 0; k < nkw; k++) {
        size_t i;
        for (i = 0; i < np; i++)
            if (!strcmp(mn->kwnames[i], kwn[k])) break;
        if (i == np) {
            if (!strcmp(kwn[k], "caller")) {
                scope_set(c, ms, "caller", kwv[k]);
                continue;
            }
            mr__tpl_raise(c, line, "macro '%s' takes no keyword argument '%s'", m->name, kwn[k]);
        }
        if (given[i]) mr__tpl_raise(c, line, "macro '%s' got multiple values for argument '%s'", m->name, kwn[k]);
        scope_set(c, ms, mn->kwnames[i], kwv[k]);
        given[i] = true;
    }
    for (size_t i = 0; i < np; i++) {
        if (given[i]) continue;
        size_t first_default = np - nd;
        tv v = i >= first_default ? eval(c, ms, mn->args.v[i - first_default])
                                  : undef_hint(c, "parameter '%s' was not provided%s", mn->kwnames[i], "");
        scope_set(c, ms, mn->kwnames[i], v);
    }
    capture_begin(c);
    int saved_ctl = c->loop_ctl;
    exec_body(c, ms, &mn->body);
    c->loop_ctl = saved_ctl;
    tv r = tv_strv(capture_end(c));
    r.safe = 1;
    c->depth--;
    return r;
}

tv mr__tv_call(mr__tpl_ctx *c, int line, tv fn, tv *args, size_t nargs, const char **kwn, tv *kwv, size_t nkw) {
    switch (fn.kind) {
    case TV_FUNC:
        return mr__tpl_global_call(c, line, fn.u.fn, args, nargs, kwn, kwv, nkw);
    case TV_METHOD:
        return mr__tpl_method_call(c, line, fn.u.meth, args, nargs, kwn, kwv, nkw);
    case TV_MACRO:
        return mr__tpl_macro_call(c, line, fn.u.m, args, nargs, kwn, kwv, nkw, NULL);
    case TV_JOINER: {
        tcycler *j = fn.u.cyc;
        if (!j->used) {
            j->used = true;
            return mr__tv_str(&c->arena, "", 0);
        }
        return j->items;
    }
    case TV_UNDEF:
        raise_undef(c, line, fn);
    default:
        mr__tpl_raise(c, line, "'%s' object is not callable", mr__tv_type_name(fn));
    }
}

/* ---------------- statements ---------------- */
static void exec_stmt(mr__tpl_ctx *c, tscope *s, const tnode *x);

static void exec_body(mr__tpl_ctx *c, tscope *s, const tnlist *body) {
    for (size_t i = 0; i < body->n; i++) {
        exec_stmt(c, s, body->v[i]);
        if (c->loop_ctl) return;
    }
}

static void exec_for(mr__tpl_ctx *c, tscope *s, const tnode *x) {
    tv it = eval(c, s, x->b);
    if (it.kind == TV_NONE) mr__tpl_raise(c, x->line, "'NoneType' object is not iterable");
    tlist *items = mr__tv_iter(c, x->line, it);
    tscope *ls = scope_new(c, s);
    if (x->c) {
        /* the loop filter sees the target, not `loop` */
        tlist *kept = mr__tlist_new(&c->arena, items->n);
        for (size_t i = 0; i < items->n; i++) {
            scope_unset_all(ls);
            assign(c, ls, x->a, items->v[i]);
            tv t = eval(c, ls, x->c);
            if (mr__tv_truthy(&t)) kept->v[kept->n++] = items->v[i];
        }
        items = kept;
    }
    if (items->n == 0) {
        exec_body(c, s, &x->orelse);
        return;
    }
    tloop *L = TPL_ALLOC(c, sizeof *L);
    L->length = items->n;
    L->depth = 1;
    tv lv = {0};
    lv.kind = TV_LOOP;
    lv.u.loop = L;
    for (size_t i = 0; i < items->n; i++) {
        mr__tpl_step(c, 1);
        scope_unset_all(ls);
        L->index0 = i;
        L->prev = i ? items->v[i - 1] : tv_undef();
        L->next = i + 1 < items->n ? items->v[i + 1] : tv_undef();
        scope_set(c, ls, "loop", lv);
        assign(c, ls, x->a, items->v[i]);
        exec_body(c, ls, &x->body);
        if (c->loop_ctl == 1) {
            c->loop_ctl = 0;
            break;
        }
        c->loop_ctl = 0;
    }
}

static void exec_stmt(mr__tpl_ctx *c, tscope *s, const tnode *x) {
    mr__tpl_step(c, 1);
    enter(c, x->line);
    int saved_line = c->cur_line;
    c->cur_line = x->line;
    switch (x->kind) {
    case N_DATA:
        out_add(c, x->val.u.s->p, x->val.u.s->len);
        break;
    case N_PRINT: {
        tstr *t = mr__tv_to_str(c, eval(c, s, x->a));
        out_add(c, t->p, t->len);
        break;
    }
    case N_IF: {
        tv t = eval(c, s, x->a);
        exec_body(c, s, mr__tv_truthy(&t) ? &x->body : &x->orelse);
        break;
    }
    case N_FOR:
        exec_for(c, s, x);
        break;
    case N_SET:
        assign(c, s, x->a, eval(c, s, x->b));
        break;
    case N_SETBLOCK: {
        capture_begin(c);
        exec_body(c, s, &x->body);
        tv v = tv_strv(capture_end(c));
        assign(c, s, x->a, apply_filters(c, s, x->b, v));
        break;
    }
    case N_FILTERBLOCK: {
        capture_begin(c);
        exec_body(c, s, &x->body);
        tv v = apply_filters(c, s, x->b, tv_strv(capture_end(c)));
        tstr *t = mr__tv_to_str(c, v);
        out_add(c, t->p, t->len);
        break;
    }
    case N_MACRO: {
        tmacro *m = TPL_ALLOC(c, sizeof *m);
        m->node = x;
        m->closure = s;
        m->name = x->name;
        tv v = {0};
        v.kind = TV_MACRO;
        v.u.m = m;
        scope_set(c, s, x->name, v);
        break;
    }
    case N_CALLBLOCK: {
        /* {% call(args) fn(...) %}body{% endcall %}: body is `caller` */
        tmacro *m = TPL_ALLOC(c, sizeof *m);
        m->node = x;
        m->closure = s;
        m->name = "caller";
        tv cv = {0};
        cv.kind = TV_MACRO;
        cv.u.m = m;
        const tnode *call = x->a;
        tv fn = eval(c, s, call->a);
        targs a = eval_args(c, s, call, NULL, 0);
        const char **kwn = TPL_ALLOC(c, (a.nkw + 1) * sizeof(char *));
        tv *kwv = TPL_ALLOC(c, (a.nkw + 1) * sizeof(tv));
        memcpy(kwn, a.kwn, a.nkw * sizeof(char *));
        memcpy(kwv, a.kwv, a.nkw * sizeof(tv));
        kwn[a.nkw] = "caller";
        kwv[a.nkw] = cv;
        tstr *t = mr__tv_to_str(c, mr__tv_call(c, x->line, fn, a.args, a.nargs, kwn, kwv, a.nkw + 1));
        out_add(c, t->p, t->len);
        break;
    }
    case N_WITH: {
        tscope *ws = scope_new(c, s);
        tv *vals = TPL_ALLOC(c, (x->kwargs.n + 1) * sizeof(tv));
        for (size_t i = 0; i < x->kwargs.n; i++) vals[i] = eval(c, s, x->kwargs.v[i]);
        for (size_t i = 0; i < x->args.n; i++) assign(c, ws, x->args.v[i], vals[i]);
        exec_body(c, ws, &x->body);
        break;
    }
    case N_BREAK:
        c->loop_ctl = 1;
        break;
    case N_CONTINUE:
        c->loop_ctl = 2;
        break;
    case N_BODY:
        exec_body(c, s, &x->body);
        break;
    default:
        mr__tpl_raise(c, x->line, "internal error: node kind %d is not a statement", x->kind);
    }
    c->cur_line = saved_line;
    c->depth--;
}

/* ---------------- public API ---------------- */
static void set_error(const mr__tpl_err *e, const char *name) {
    if (e->status == MR_ENOMEM && !e->line) {
        mr_error_set(MR_ENOMEM, NULL);
        return;
    }
    if (e->line > 0)
        mr_error_set(e->status, "template '%s' line %d: %s", name, e->line, e->msg);
    else
        mr_error_set(e->status, "template '%s': %s", name, e->msg);
}

mr_status mr_chat_template_parse(const char *src, size_t len, const char *name, mr_chat_template **out) {
    *out = NULL;
    if (!src) return mr_error_set(MR_EINVAL, "mr_chat_template_parse: no source");
    mr_chat_template *t = mr_calloc(1, sizeof *t);
    if (!t) return MR_ENOMEM;
    snprintf(t->name, sizeof t->name, "%s", name ? name : "template");
    mr__tpl_err err;
    memset(&err, 0, sizeof err);
    mr__arena_init(&t->arena, 0, &err);
    size_t valid = mr__utf8_valid_prefix(src, len);
    if (valid != len) {
        mr_error_set(MR_EINPUT, "template '%s': not valid UTF-8 at byte %zu", t->name, valid);
        mr_free(t);
        return MR_EINPUT;
    }
    if (setjmp(err.jb)) {
        set_error(&err, t->name);
        mr__arena_free(&t->arena);
        mr_free(t);
        return err.status;
    }
    /* the source as given, then newlines normalized and one trailing newline
     * dropped (jinja2's keep_trailing_newline=False) */
    t->src = mr__arena_alloc(&t->arena, len + 1);
    memcpy(t->src, src, len);
    t->src[len] = 0;
    t->len = len;
    char *norm = mr__arena_alloc(&t->arena, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            norm[n++] = src[i];
        }
    }
    if (n > 0 && norm[n - 1] == '\n') n--;
    norm[n] = 0;
    ttokens toks;
    mr__tpl_lex(&t->arena, &err, norm, n, &toks);
    t->root = mr__tpl_parse(&t->arena, &err, &toks);
    *out = t;
    return MR_OK;
}

void mr_chat_template_free(mr_chat_template *t) {
    if (!t) return;
    mr__arena_free(&t->arena);
    mr_free(t);
}

const char *mr_chat_template_source(const mr_chat_template *t) { return t ? t->src : NULL; }

static void free_ctx(mr__tpl_ctx *c) {
    for (int i = 0; i < c->n_outs; i++) mr__buf_free(&c->outs[i]);
    c->n_outs = 0;
    mr_free(c->outs);
    c->outs = NULL;
    mr__arena_free(&c->arena);
}

mr_status mr_chat_template_render(const mr_chat_template *t, const json_t *vars, const mr_chat_limits *limits,
                                  char **out, size_t *out_len) {
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    if (!t || !out) return mr_error_set(MR_EINVAL, "mr_chat_template_render: no template or output");
    if (vars && !json_is_object(vars)) return mr_error_set(MR_EINVAL, "template variables must be a JSON object");
    mr__tpl_ctx *c = mr_calloc(1, sizeof *c);
    if (!c) return MR_ENOMEM;
    if (limits) c->lim = *limits;
    else mr_chat_limits_default(&c->lim);
    if (c->lim.max_depth <= 0) c->lim.max_depth = 500;
    if (c->lim.max_depth > 100000) c->lim.max_depth = 100000;
    c->cap_outs = 2 * c->lim.max_depth + 16;
    c->outs = mr_calloc((size_t)c->cap_outs, sizeof *c->outs);
    if (!c->outs) {
        mr_free(c);
        return MR_ENOMEM;
    }
    mr__arena_init(&c->arena, c->lim.max_memory_bytes, &c->err);
    c->err.tpl_name = t->name;
    if (setjmp(c->err.jb)) {
        set_error(&c->err, t->name);
        mr_status st = c->err.status;
        free_ctx(c);
        mr_free(c);
        return st;
    }
    c->n_outs = 1;
    c->root = scope_new(c, NULL);
    if (vars) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)vars, k, v) {
            mr__tdict_set(&c->arena, c->root->vars, mr__tv_cstr(&c->arena, k), mr__tv_from_json(c, v, 0));
        }
    }
    c->cur_line = 1;
    exec_stmt(c, c->root, t->root);
    mr__buf *b = &c->outs[0];
    if (!b->p && !mr__buf_add(b, "", 0)) mr__tpl_oom(c);
    *out = b->p;
    if (out_len) *out_len = b->n;
    b->p = NULL;
    free_ctx(c);
    mr_free(c);
    return MR_OK;
}
