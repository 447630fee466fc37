/* template_value.c — the Jinja interpreter's values: the arena they live in,
 * strings (UTF-8, code-point counted), lists and ordered dicts, and the
 * Python behaviour templates observe on them: truthiness, ==, <, str(),
 * repr(), float repr, json.dumps (as transformers' tojson calls it), and
 * the conversion from jansson values.
 *
 * Arena layout: blocks of at least 64 KiB, each
 *   [mr__arena_block header][bytes handed out, 16-aligned ...]
 * chained newest first; a request larger than a quarter block gets a block
 * of its own. `used` counts every block's full size against the budget. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/template_internal.h"

/* ---------------- errors ---------------- */
_Noreturn void mr__tpl_fail(mr__tpl_err *e, mr_status s, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    e->status = s;
    e->line = line;
    longjmp(e->jb, 1);
}

/* ---------------- arena ---------------- */
struct mr__arena_block {
    mr__arena_block *next;
    size_t size; /* payload bytes */
    size_t off;
    _Alignas(16) unsigned char data[];
};

#define ARENA_BLOCK (64u * 1024u)

void mr__arena_init(mr__arena *a, size_t budget, struct mr__tpl_err *err) {
    a->head = NULL;
    a->used = 0;
    a->budget = budget;
    a->err = err;
}

static void *arena_fail(mr__arena *a, mr_status s, size_t want) {
    if (a->err) {
        if (s == MR_ENOMEM) mr__tpl_fail(a->err, MR_ENOMEM, 0, "out of memory");
        mr__tpl_fail(a->err, MR_ECAPACITY, 0,
                     "the template needs more than %zu MiB of memory (a request of %zu bytes with %zu used); "
                     "raise mr_chat_limits.max_memory_bytes if this is expected",
                     a->budget >> 20, want, a->used);
    }
    return NULL;
}

void *mr__arena_alloc(mr__arena *a, size_t n) {
    size_t need = (n + 15u) & ~(size_t)15u;
    if (need < n) return arena_fail(a, MR_ECAPACITY, n);
    if (a->head && a->head->size - a->head->off >= need) {
        void *p = a->head->data + a->head->off;
        a->head->off += need;
        memset(p, 0, n);
        return p;
    }
    size_t bsize = need > ARENA_BLOCK / 4 ? need : ARENA_BLOCK;
    size_t total;
    if (!mr_size_add(bsize, sizeof(mr__arena_block), &total)) return arena_fail(a, MR_ECAPACITY, n);
    if (a->budget && (total > a->budget || a->used > a->budget - total)) return arena_fail(a, MR_ECAPACITY, n);
    mr__arena_block *b = mr_malloc(total);
    if (!b) return arena_fail(a, MR_ENOMEM, n);
    a->used += total;
    b->size = bsize;
    b->off = need;
    if (need == bsize || !a->head) {
        /* a dedicated block goes behind the current one so that the current
         * one keeps serving small requests */
        if (a->head && need == bsize) {
            b->next = a->head->next;
            a->head->next = b;
        } else {
            b->next = a->head;
            a->head = b;
        }
    } else {
        b->next = a->head;
        a->head = b;
    }
    memset(b->data, 0, n);
    return b->data;
}

void mr__arena_free(mr__arena *a) {
    mr__arena_block *b = a->head;
    while (b) {
        mr__arena_block *nx = b->next;
        mr_free(b);
        b = nx;
    }
    a->head = NULL;
    a->used = 0;
}

/* ---------------- strings ---------------- */
tstr *mr__tstr_new(mr__arena *a, const char *p, size_t n) {
    size_t sz;
    if (!mr_size_add(sizeof(tstr), n, &sz) || !mr_size_add(sz, 1, &sz)) return arena_fail(a, MR_ECAPACITY, n);
    tstr *s = mr__arena_alloc(a, sz);
    if (!s) return NULL;
    s->len = n;
    s->ncp = -1;
    if (n) memcpy(s->p, p, n);
    s->p[n] = 0;
    return s;
}

tstr *mr__tstr_cstr(mr__arena *a, const char *p) { return mr__tstr_new(a, p, strlen(p)); }

tstr *mr__tstr_cat(mr__arena *a, const tstr *x, const tstr *y) {
    size_t n;
    if (!mr_size_add(x->len, y->len, &n)) return arena_fail(a, MR_ECAPACITY, SIZE_MAX);
    size_t sz;
    if (!mr_size_add(sizeof(tstr), n, &sz) || !mr_size_add(sz, 1, &sz)) return arena_fail(a, MR_ECAPACITY, n);
    tstr *r = mr__arena_alloc(a, sz);
    if (!r) return NULL;
    r->len = n;
    r->ncp = (x->ncp >= 0 && y->ncp >= 0) ? x->ncp + y->ncp : -1;
    memcpy(r->p, x->p, x->len);
    memcpy(r->p + x->len, y->p, y->len);
    r->p[n] = 0;
    return r;
}

tv mr__tv_str(mr__arena *a, const char *p, size_t n) { return tv_strv(mr__tstr_new(a, p, n)); }
tv mr__tv_cstr(mr__arena *a, const char *p) { return tv_strv(mr__tstr_cstr(a, p)); }

tlist *mr__tlist_new(mr__arena *a, size_t cap) {
    tlist *l = mr__arena_alloc(a, sizeof *l);
    if (!l) return NULL;
    if (cap) {
        size_t sz;
        if (!mr_size_mul(cap, sizeof(tv), &sz)) return arena_fail(a, MR_ECAPACITY, SIZE_MAX);
        l->v = mr__arena_alloc(a, sz);
        if (!l->v) return NULL;
        l->cap = cap;
    }
    return l;
}

void mr__tlist_push(mr__arena *a, tlist *l, tv v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4, sz;
        if (!mr_size_mul(cap, sizeof(tv), &sz)) {
            arena_fail(a, MR_ECAPACITY, SIZE_MAX);
            return;
        }
        tv *nv = mr__arena_alloc(a, sz);
        if (!nv) return;
        if (l->n) memcpy(nv, l->v, l->n * sizeof(tv));
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

tdict *mr__tdict_new(mr__arena *a, size_t cap) {
    tdict *d = mr__arena_alloc(a, sizeof *d);
    if (!d) return NULL;
    if (cap) {
        size_t sz;
        if (!mr_size_mul(cap, sizeof(tv), &sz)) return arena_fail(a, MR_ECAPACITY, SIZE_MAX);
        d->k = mr__arena_alloc(a, sz);
        d->v = mr__arena_alloc(a, sz);
        if (!d->k || !d->v) return NULL;
        d->cap = cap;
    }
    return d;
}

static bool is_num(const tv *v) { return v->kind == TV_BOOL || v->kind == TV_INT || v->kind == TV_FLOAT; }
static double num_d(const tv *v) {
    return v->kind == TV_FLOAT ? v->u.f : v->kind == TV_INT ? (double)v->u.i : (double)v->u.b;
}
static int64_t num_i(const tv *v) { return v->kind == TV_INT ? v->u.i : (int64_t)v->u.b; }

/* Python ==, without a context (dict keys, `in`, list.index). Depth-guarded:
 * namespaces compare by identity so no cycle can be walked. */
static bool eq_depth(tv a, tv b, int depth) {
    if (depth > 400) return false;
    if (is_num(&a) && is_num(&b)) {
        if (a.kind == TV_FLOAT || b.kind == TV_FLOAT) return num_d(&a) == num_d(&b);
        return num_i(&a) == num_i(&b);
    }
    if (a.kind != b.kind) return false;
    switch (a.kind) {
    case TV_UNDEF:
    case TV_NONE:
        return true;
    case TV_STR:
        return a.u.s->len == b.u.s->len && memcmp(a.u.s->p, b.u.s->p, a.u.s->len) == 0;
    case TV_LIST:
        if (a.u.l->tuple != b.u.l->tuple || a.u.l->n != b.u.l->n) return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!eq_depth(a.u.l->v[i], b.u.l->v[i], depth + 1)) return false;
        return true;
    case TV_DICT:
        if (a.u.d->n != b.u.d->n) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            tv *o = mr__tdict_get(b.u.d, a.u.d->k[i]);
            if (!o || !eq_depth(a.u.d->v[i], *o, depth + 1)) return false;
        }
        return true;
    case TV_NS:
        return a.u.d == b.u.d;
    case TV_MACRO:
        return a.u.m == b.u.m;
    case TV_FUNC:
        return a.u.fn == b.u.fn;
    case TV_LOOP:
        return a.u.loop == b.u.loop;
    case TV_CYCLER:
    case TV_JOINER:
        return a.u.cyc == b.u.cyc;
    case TV_METHOD:
        return a.u.meth == b.u.meth;
    default:
        return false;
    }
}

bool mr__tv_eq(mr__tpl_ctx *c, tv a, tv b) {
    (void)c;
    return eq_depth(a, b, 0);
}

tv *mr__tdict_get(const tdict *d, tv key) {
    if (key.kind == TV_STR) return mr__tdict_get_str(d, key.u.s->p, key.u.s->len);
    for (size_t i = 0; i < d->n; i++)
        if (eq_depth(d->k[i], key, 0)) return &d->v[i];
    return NULL;
}

tv *mr__tdict_get_str(const tdict *d, const char *key, size_t n) {
    for (size_t i = 0; i < d->n; i++) {
        const tv *k = &d->k[i];
        if (k->kind == TV_STR && k->u.s->len == n && memcmp(k->u.s->p, key, n) == 0) return &d->v[i];
    }
    return NULL;
}

void mr__tdict_set(mr__arena *a, tdict *d, tv key, tv val) {
    tv *o = mr__tdict_get(d, key);
    if (o) {
        *o = val;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4, sz;
        if (!mr_size_mul(cap, sizeof(tv), &sz)) {
            arena_fail(a, MR_ECAPACITY, SIZE_MAX);
            return;
        }
        tv *nk = mr__arena_alloc(a, sz), *nv = mr__arena_alloc(a, sz);
        if (!nk || !nv) return;
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof(tv));
            memcpy(nv, d->v, d->n * sizeof(tv));
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = key;
    d->v[d->n] = val;
    d->n++;
}

/* ---------------- UTF-8 ---------------- */

size_t mr__utf8_valid_prefix(const char *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        if ((unsigned char)p[i] < 0x80) {
            i++;
            continue;
        }
        size_t adv;
        uint32_t cp = mr__utf8_decode(p + i, n - i, &adv);
        if (cp == 0xFFFD && adv == 1) {
            /* a real U+FFFD is 3 bytes; adv 1 means invalid */
            return i;
        }
        i += adv;
    }
    return n;
}


int64_t mr__tstr_ncp(tstr *s) {
    if (s->ncp >= 0) return s->ncp;
    int64_t n = 0;
    for (size_t i = 0; i < s->len; i++)
        if (((unsigned char)s->p[i] & 0xC0) != 0x80) n++;
    s->ncp = n;
    return n;
}

size_t mr__utf8_offset(const char *p, size_t n, int64_t cpi) {
    size_t i = 0;
    int64_t k = 0;
    while (i < n && k < cpi) {
        i++;
        while (i < n && ((unsigned char)p[i] & 0xC0) == 0x80) i++;
        k++;
    }
    return i;
}

/* str.isspace() / the whitespace str.split() and str.strip() use. */
bool mr__py_isspace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ---------------- numbers ---------------- */
/* Python float(str): optional whitespace and sign, digits with single '_'
 * between them, a fraction and exponent, or inf / infinity / nan. */
double mr__py_float_parse_ok(const char *p, size_t n, bool *ok) {
    char tmp[128];
    size_t i = 0, o = 0;
    *ok = false;
    /* strip Python whitespace (ASCII is enough for numbers, but be exact) */
    while (i < n) {
        size_t adv;
        uint32_t cp = mr__utf8_decode(p + i, n - i, &adv);
        if (!mr__py_isspace(cp)) break;
        i += adv;
    }
    while (n > i) {
        size_t j = n - 1;
        while (j > i && ((unsigned char)p[j] & 0xC0) == 0x80) j--;
        size_t adv;
        uint32_t cp = mr__utf8_decode(p + j, n - j, &adv);
        if (!mr__py_isspace(cp)) break;
        n = j;
    }
    if (i >= n || n - i >= sizeof tmp) return 0;
    if (p[i] == '+' || p[i] == '-') tmp[o++] = p[i++];
    size_t rest = n - i;
    const char *r = p + i;
    static const char *const words[] = {"inf", "infinity", "nan"};
    for (int w = 0; w < 3; w++) {
        size_t wl = strlen(words[w]);
        if (rest == wl && strncasecmp(r, words[w], wl) == 0) {
            *ok = true;
            double v = w == 2 ? NAN : INFINITY;
            return (o && tmp[0] == '-') ? -v : v;
        }
    }
    bool digits = false, prev_digit = false;
    int part = 0; /* 0 int, 1 frac, 2 exp */
    bool exp_digits = false;
    for (size_t k = 0; k < rest; k++) {
        char ch = r[k];
        if (ch >= '0' && ch <= '9') {
            tmp[o++] = ch;
            prev_digit = true;
            if (part < 2) digits = true;
            else exp_digits = true;
        } else if (ch == '_') {
            if (!prev_digit || k + 1 >= rest || r[k + 1] < '0' || r[k + 1] > '9') return 0;
            prev_digit = false;
        } else if (ch == '.' && part == 0) {
            tmp[o++] = ch;
            part = 1;
            prev_digit = false;
        } else if ((ch == 'e' || ch == 'E') && part < 2 && digits) {
            tmp[o++] = 'e';
            part = 2;
            prev_digit = false;
            if (k + 1 < rest && (r[k + 1] == '+' || r[k + 1] == '-')) tmp[o++] = r[++k];
        } else {
            return 0;
        }
    }
    if (!digits || (part == 2 && !exp_digits)) return 0;
    tmp[o] = 0;
    *ok = true;
    return strtod(tmp, NULL);
}

/* repr(float): the shortest digits that round-trip, laid out as Python's
 * float_repr_style 'short' does (fixed for 1e-4 <= |x| < 1e16). */
void mr__py_float_repr(double f, char out[40]) {
    if (isnan(f)) {
        strcpy(out, "nan");
        return;
    }
    if (isinf(f)) {
        strcpy(out, f < 0 ? "-inf" : "inf");
        return;
    }
    if (f == 0) {
        strcpy(out, signbit(f) ? "-0.0" : "0.0");
        return;
    }
    char buf[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf: [-]d[.ddd]e[+-]XX */
    char digits[24];
    int nd = 0, exp10;
    const char *q = buf;
    bool neg = false;
    if (*q == '-') {
        neg = true;
        q++;
    }
    while (*q && *q != 'e') {
        if (*q >= '0' && *q <= '9') digits[nd++] = *q;
        q++;
    }
    exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    char *o = out;
    if (neg) *o++ = '-';
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 >= 0) {
            for (int k = 0; k <= exp10; k++) *o++ = k < nd ? digits[k] : '0';
            *o++ = '.';
            if (nd > exp10 + 1)
                for (int k = exp10 + 1; k < nd; k++) *o++ = digits[k];
            else
                *o++ = '0';
        } else {
            *o++ = '0';
            *o++ = '.';
            for (int k = 0; k < -exp10 - 1; k++) *o++ = '0';
            for (int k = 0; k < nd; k++) *o++ = digits[k];
        }
        *o = 0;
    } else {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            for (int k = 1; k < nd; k++) *o++ = digits[k];
        }
        int ax = exp10 < 0 ? -exp10 : exp10; /* |exp10| <= 324 */
        *o++ = 'e';
        *o++ = exp10 < 0 ? '-' : '+';
        if (ax >= 100) *o++ = (char)('0' + ax / 100);
        *o++ = (char)('0' + (ax / 10) % 10);
        *o++ = (char)('0' + ax % 10);
        *o = 0;
    }
}

/* ---------------- Python behaviour ---------------- */
bool mr__tv_truthy(const tv *v) {
    switch (v->kind) {
    case TV_UNDEF:
    case TV_NONE:
    case TV_MISSING:
        return false;
    case TV_BOOL:
        return v->u.b;
    case TV_INT:
        return v->u.i != 0;
    case TV_FLOAT:
        return v->u.f != 0;
    case TV_STR:
        return v->u.s->len != 0;
    case TV_LIST:
        return v->u.l->n != 0;
    case TV_DICT:
        return v->u.d->n != 0;
    default:
        return true;
    }
}

const char *mr__tv_type_name(tv v) {
    switch (v.kind) {
    case TV_UNDEF:
        return "Undefined";
    case TV_NONE:
        return "NoneType";
    case TV_BOOL:
        return "bool";
    case TV_INT:
        return "int";
    case TV_FLOAT:
        return "float";
    case TV_STR:
        return "str";
    case TV_LIST:
        return v.u.l->tuple ? "tuple" : "list";
    case TV_DICT:
        return "dict";
    case TV_NS:
        return "Namespace";
    case TV_MACRO:
        return "Macro";
    case TV_FUNC:
        return "function";
    case TV_METHOD:
        return "method";
    case TV_LOOP:
        return "LoopContext";
    case TV_CYCLER:
        return "Cycler";
    case TV_JOINER:
        return "Joiner";
    default:
        return "object";
    }
}

static int cmp_depth(mr__tpl_ctx *c, int line, tv a, tv b, int depth) {
    if (depth > 400) mr__tpl_raise(c, line, "comparison nested too deeply");
    if (a.kind == TV_UNDEF || b.kind == TV_UNDEF) {
        tv u = a.kind == TV_UNDEF ? a : b;
        mr__tpl_raise(c, line, "%s", u.u.s ? u.u.s->p : "undefined value used in a comparison");
    }
    if (is_num(&a) && is_num(&b)) {
        if (a.kind == TV_FLOAT || b.kind == TV_FLOAT) {
            double x = num_d(&a), y = num_d(&b);
            return x < y ? -1 : x > y ? 1 : 0;
        }
        int64_t x = num_i(&a), y = num_i(&b);
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.kind == TV_STR && b.kind == TV_STR) {
        size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        int r = memcmp(a.u.s->p, b.u.s->p, n); /* UTF-8 byte order is code-point order */
        if (r) return r < 0 ? -1 : 1;
        return a.u.s->len < b.u.s->len ? -1 : a.u.s->len > b.u.s->len ? 1 : 0;
    }
    if (a.kind == TV_LIST && b.kind == TV_LIST && a.u.l->tuple == b.u.l->tuple) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (eq_depth(a.u.l->v[i], b.u.l->v[i], 0)) continue;
            return cmp_depth(c, line, a.u.l->v[i], b.u.l->v[i], depth + 1);
        }
        return a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n ? 1 : 0;
    }
    mr__tpl_raise(c, line, "'<' not supported between instances of '%s' and '%s'", mr__tv_type_name(a),
                  mr__tv_type_name(b));
}

int mr__tv_cmp(mr__tpl_ctx *c, int line, tv a, tv b) { return cmp_depth(c, line, a, b, 0); }

static void buf_or_oom(mr__tpl_ctx *c, mr__buf *b, const char *p, size_t n) {
    if (!mr__buf_add(b, p, n)) mr__tpl_oom(c);
    if (b->n > c->lim.max_output_bytes && c->lim.max_output_bytes)
        mr__tpl_fail(&c->err, MR_ECAPACITY, c->cur_line, "a string grew past the output limit (%zu bytes)",
                     c->lim.max_output_bytes);
}
#define BUFS(c, b, s) buf_or_oom((c), (b), (s), strlen(s))

/* Python's str.isprintable() for a code point, closely enough for repr():
 * controls, separators other than space, format characters, surrogates and
 * private use are not printable. */
static bool py_printable(uint32_t cp) {
    if (cp < 0x20 || cp == 0x7F) return false;
    if (cp < 0x7F) return true;
    if (cp <= 0xA0 || cp == 0xAD) return false;
    if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F) ||
        (cp >= 0x205F && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF || (cp >= 0xFFF9 && cp <= 0xFFFB))
        return false;
    if ((cp >= 0xD800 && cp <= 0xDFFF) || (cp >= 0xE000 && cp <= 0xF8FF) || cp >= 0xF0000) return false;
    if (cp == 0x061C || cp == 0x180E || (cp >= 0x0600 && cp <= 0x0605) || cp == 0x06DD || cp == 0x070F) return false;
    if ((cp & 0xFFFE) == 0xFFFE) return false;
    return true;
}

static void repr_str(mr__tpl_ctx *c, mr__buf *b, const tstr *s) {
    bool has_sq = memchr(s->p, '\'', s->len) != NULL, has_dq = memchr(s->p, '"', s->len) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    buf_or_oom(c, b, &q, 1);
    size_t i = 0;
    while (i < s->len) {
        size_t adv;
        uint32_t cp = mr__utf8_decode(s->p + i, s->len - i, &adv);
        char esc[16];
        if (cp == (uint32_t)q || cp == '\\') {
            esc[0] = '\\';
            esc[1] = (char)cp;
            buf_or_oom(c, b, esc, 2);
        } else if (cp == '\n') {
            BUFS(c, b, "\\n");
        } else if (cp == '\r') {
            BUFS(c, b, "\\r");
        } else if (cp == '\t') {
            BUFS(c, b, "\\t");
        } else if (!py_printable(cp)) {
            if (cp < 0x100) snprintf(esc, sizeof esc, "\\x%02x", cp);
            else if (cp < 0x10000) snprintf(esc, sizeof esc, "\\u%04x", cp);
            else snprintf(esc, sizeof esc, "\\U%08x", cp);
            BUFS(c, b, esc);
        } else {
            buf_or_oom(c, b, s->p + i, adv);
        }
        i += adv;
    }
    buf_or_oom(c, b, &q, 1);
}

void mr__tv_repr(mr__tpl_ctx *c, mr__buf *b, tv v, int depth) {
    char num[48];
    if (depth > 200) mr__tpl_raise(c, c->cur_line, "value nested too deeply to print (a namespace that contains itself?)");
    switch (v.kind) {
    case TV_UNDEF:
    case TV_MISSING:
        BUFS(c, b, "Undefined");
        return;
    case TV_NONE:
        BUFS(c, b, "None");
        return;
    case TV_BOOL:
        BUFS(c, b, v.u.b ? "True" : "False");
        return;
    case TV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v.u.i);
        BUFS(c, b, num);
        return;
    case TV_FLOAT:
        mr__py_float_repr(v.u.f, num);
        BUFS(c, b, num);
        return;
    case TV_STR:
        repr_str(c, b, v.u.s);
        return;
    case TV_LIST: {
        BUFS(c, b, v.u.l->tuple ? "(" : "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) BUFS(c, b, ", ");
            mr__tv_repr(c, b, v.u.l->v[i], depth + 1);
        }
        if (v.u.l->tuple && v.u.l->n == 1) BUFS(c, b, ",");
        BUFS(c, b, v.u.l->tuple ? ")" : "]");
        return;
    }
    case TV_DICT:
    case TV_NS: {
        if (v.kind == TV_NS) BUFS(c, b, "<Namespace ");
        BUFS(c, b, "{");
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) BUFS(c, b, ", ");
            mr__tv_repr(c, b, v.u.d->k[i], depth + 1);
            BUFS(c, b, ": ");
            mr__tv_repr(c, b, v.u.d->v[i], depth + 1);
        }
        BUFS(c, b, "}");
        if (v.kind == TV_NS) BUFS(c, b, ">");
        return;
    }
    case TV_MACRO:
        BUFS(c, b, "<Macro '");
        BUFS(c, b, v.u.m->name);
        BUFS(c, b, "'>");
        return;
    case TV_LOOP:
        snprintf(num, sizeof num, "<LoopContext %zu/%zu>", v.u.loop->index0 + 1, v.u.loop->length);
        BUFS(c, b, num);
        return;
    default:
        BUFS(c, b, "<");
        BUFS(c, b, mr__tv_type_name(v));
        BUFS(c, b, " object>");
        return;
    }
}

tstr *mr__tv_to_str(mr__tpl_ctx *c, tv v) {
    char num[48];
    switch (v.kind) {
    case TV_STR:
        return v.u.s;
    case TV_UNDEF:
    case TV_MISSING:
        return mr__tstr_new(&c->arena, "", 0);
    case TV_NONE:
        return mr__tstr_cstr(&c->arena, "None");
    case TV_BOOL:
        return mr__tstr_cstr(&c->arena, v.u.b ? "True" : "False");
    case TV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v.u.i);
        return mr__tstr_cstr(&c->arena, num);
    case TV_FLOAT:
        mr__py_float_repr(v.u.f, num);
        return mr__tstr_cstr(&c->arena, num);
    default: {
        /* the buffer lives on the context's stack so that an error inside
         * repr (which longjmps) still frees it */
        mr__buf *t = mr__tpl_push_buf(c);
        mr__tv_repr(c, t, v, 0);
        tstr *s = mr__tstr_new(&c->arena, t->p ? t->p : "", t->n);
        mr__tpl_pop_buf(c);
        return s;
    }
    }
}

/* ---------------- json.dumps ---------------- */
static void json_str(mr__tpl_ctx *c, mr__buf *b, const char *p, size_t n, bool ascii) {
    BUFS(c, b, "\"");
    size_t i = 0, run = 0;
    while (i < n) {
        unsigned char ch = (unsigned char)p[i];
        const char *esc = NULL;
        char tmp[16];
        size_t adv = 1;
        if (ch == '"') esc = "\\\"";
        else if (ch == '\\') esc = "\\\\";
        else if (ch == '\n') esc = "\\n";
        else if (ch == '\r') esc = "\\r";
        else if (ch == '\t') esc = "\\t";
        else if (ch == '\b') esc = "\\b";
        else if (ch == '\f') esc = "\\f";
        else if (ch < 0x20 || (ascii && ch == 0x7F)) {
            snprintf(tmp, sizeof tmp, "\\u%04x", ch);
            esc = tmp;
        } else if (ascii && ch >= 0x80) {
            uint32_t cp = mr__utf8_decode(p + i, n - i, &adv);
            if (cp >= 0x10000) {
                uint32_t v = cp - 0x10000;
                snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
            } else {
                snprintf(tmp, sizeof tmp, "\\u%04x", cp);
            }
            esc = tmp;
        }
        if (esc) {
            if (run) buf_or_oom(c, b, p + i - run, run);
            run = 0;
            BUFS(c, b, esc);
            i += adv;
        } else {
            run++;
            i++;
        }
    }
    if (run) buf_or_oom(c, b, p + n - run, run);
    BUFS(c, b, "\"");
}

static void json_newline(mr__tpl_ctx *c, mr__buf *b, const char *indent, int level) {
    BUFS(c, b, "\n");
    for (int k = 0; k < level; k++) BUFS(c, b, indent);
}

static void json_key(mr__tpl_ctx *c, int line, mr__buf *b, tv k, bool ascii) {
    char num[48];
    switch (k.kind) {
    case TV_STR:
        json_str(c, b, k.u.s->p, k.u.s->len, ascii);
        return;
    case TV_INT:
        snprintf(num, sizeof num, "\"%lld\"", (long long)k.u.i);
        BUFS(c, b, num);
        return;
    case TV_FLOAT: {
        char r[40];
        mr__py_float_repr(k.u.f, r);
        if (isinf(k.u.f)) strcpy(r, k.u.f < 0 ? "-Infinity" : "Infinity");
        if (isnan(k.u.f)) strcpy(r, "NaN");
        snprintf(num, sizeof num, "\"%s\"", r);
        BUFS(c, b, num);
        return;
    }
    case TV_BOOL:
        BUFS(c, b, k.u.b ? "\"true\"" : "\"false\"");
        return;
    case TV_NONE:
        BUFS(c, b, "\"null\"");
        return;
    default:
        mr__tpl_raise(c, line, "tojson: keys must be str, int, float, bool or None, not %s", mr__tv_type_name(k));
    }
}

void mr__tv_json(mr__tpl_ctx *c, int line, mr__buf *b, tv v, bool ascii, const char *indent, const char *isep,
                 const char *ksep, bool sort_keys, int level) {
    char num[48];
    if (level > 200) mr__tpl_raise(c, line, "tojson: circular reference detected (or nesting deeper than 200)");
    mr__tpl_step(c, 1);
    switch (v.kind) {
    case TV_NONE:
        BUFS(c, b, "null");
        return;
    case TV_BOOL:
        BUFS(c, b, v.u.b ? "true" : "false");
        return;
    case TV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v.u.i);
        BUFS(c, b, num);
        return;
    case TV_FLOAT:
        if (isnan(v.u.f)) BUFS(c, b, "NaN");
        else if (isinf(v.u.f)) BUFS(c, b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else {
            mr__py_float_repr(v.u.f, num);
            BUFS(c, b, num);
        }
        return;
    case TV_STR:
        json_str(c, b, v.u.s->p, v.u.s->len, ascii);
        return;
    case TV_LIST: {
        tlist *l = v.u.l;
        if (l->n == 0) {
            BUFS(c, b, "[]");
            return;
        }
        BUFS(c, b, "[");
        for (size_t i = 0; i < l->n; i++) {
            if (i) BUFS(c, b, isep);
            if (indent) json_newline(c, b, indent, level + 1);
            mr__tv_json(c, line, b, l->v[i], ascii, indent, isep, ksep, sort_keys, level + 1);
        }
        if (indent) json_newline(c, b, indent, level);
        BUFS(c, b, "]");
        return;
    }
    case TV_DICT: {
        tdict *d = v.u.d;
        if (d->n == 0) {
            BUFS(c, b, "{}");
            return;
        }
        size_t *ord = TPL_ALLOC(c, d->n * sizeof(size_t));
        for (size_t i = 0; i < d->n; i++) ord[i] = i;
        if (sort_keys) {
            /* insertion sort keeps it stable and needs no comparator context */
            for (size_t i = 1; i < d->n; i++) {
                size_t x = ord[i], j = i;
                while (j > 0 && mr__tv_cmp(c, line, d->k[ord[j - 1]], d->k[x]) > 0) {
                    ord[j] = ord[j - 1];
                    j--;
                }
                ord[j] = x;
            }
        }
        BUFS(c, b, "{");
        for (size_t i = 0; i < d->n; i++) {
            if (i) BUFS(c, b, isep);
            if (indent) json_newline(c, b, indent, level + 1);
            json_key(c, line, b, d->k[ord[i]], ascii);
            BUFS(c, b, ksep);
            mr__tv_json(c, line, b, d->v[ord[i]], ascii, indent, isep, ksep, sort_keys, level + 1);
        }
        if (indent) json_newline(c, b, indent, level);
        BUFS(c, b, "}");
        return;
    }
    default:
        mr__tpl_raise(c, line, "tojson: Object of type %s is not JSON serializable", mr__tv_type_name(v));
    }
}

/* ---------------- jansson → values ---------------- */
tv mr__tv_str_checked(mr__tpl_ctx *c, const char *p, size_t n) { return mr__tv_str(&c->arena, p, n); }

tv mr__tv_from_json(mr__tpl_ctx *c, const json_t *j, int depth) {
    if (depth > 1000) mr__tpl_fail(&c->err, MR_EINVAL, 0, "template variables nest deeper than 1000 levels");
    mr__tpl_step(c, 1);
    switch (json_typeof(j)) {
    case JSON_NULL:
        return tv_none();
    case JSON_TRUE:
        return tv_bool(true);
    case JSON_FALSE:
        return tv_bool(false);
    case JSON_INTEGER:
        return tv_int((int64_t)json_integer_value(j));
    case JSON_REAL:
        return tv_float(json_real_value(j));
    case JSON_STRING:
        return mr__tv_str(&c->arena, json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        tlist *l = mr__tlist_new(&c->arena, n);
        for (size_t i = 0; i < n; i++) l->v[i] = mr__tv_from_json(c, json_array_get(j, i), depth + 1);
        l->n = n;
        tv v = {0};
        v.kind = TV_LIST;
        v.u.l = l;
        return v;
    }
    case JSON_OBJECT: {
        tdict *d = mr__tdict_new(&c->arena, json_object_size(j));
        const char *k;
        json_t *val;
        json_object_foreach((json_t *)j, k, val) {
            /* jansson keys are unique: append without the lookup */
            d->k[d->n] = mr__tv_str(&c->arena, k, strlen(k));
            d->v[d->n] = mr__tv_from_json(c, val, depth + 1);
            d->n++;
        }
        tv v = {0};
        v.kind = TV_DICT;
        v.u.d = d;
        return v;
    }
    }
    return tv_none();
}
