/* grammar_compile.c — builds a grammar (grammar_internal.h) from a JSON
 * schema, a list of choices or a request's tools; then checks that every
 * union can be decided by its first byte. What a schema may hold is in
 * moerun/grammar.h; anything else that constrains is refused by name. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/grammar_internal.h"

/* Keywords that constrain a value in ways the matcher does not enforce. */
static const char *const UNSUPPORTED[] = {
    "multipleOf",
    "contains", "minContains", "maxContains", "patternProperties",
    "propertyNames", "dependentRequired", "dependentSchemas", "dependencies", "if", "then", "else", "not",
    "minProperties", "maxProperties", "unevaluatedProperties", "unevaluatedItems", "contentEncoding",
    "contentMediaType", NULL};

#define MAX_REFS 256

typedef struct {
    mr_grammar *g;
    const json_t *doc;
    struct {
        const json_t *target;
        int32_t node;
    } refs[MAX_REFS];
    int n_refs;
    int depth;
} cctx;

/* ---- growable arrays ---- */
static mr_status grow(void **p, int32_t *cap, int32_t need, size_t elem, int32_t limit, const char *what) {
    if (need <= *cap) return MR_OK;
    if (need > limit) return mr_error_set(MR_EINVAL, "grammar: more than %d %s", (int)limit, what);
    int32_t c = *cap ? *cap : 16;
    while (c < need) c = c > limit / 2 ? limit : c * 2;
    void *q = mr_realloc(*p, (size_t)c * elem);
    if (!q) return MR_ENOMEM;
    *p = q;
    *cap = c;
    return MR_OK;
}

static mr_status new_node(mr_grammar *g, mr__gkind k, int32_t *id) {
    mr_status st = grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof(mr__gnode), MR_GRAMMAR_MAX_NODES,
                        "schema nodes");
    if (st) return st;
    *id = g->n_nodes++;
    g->nodes[*id] = (mr__gnode){.kind = (uint8_t)k, .hi = -1, .addl = -1, .sel_from = -1, .sel_prop = -1, .re = -1};
    return MR_OK;
}

static mr_status add_lit(mr_grammar *g, const char *s, size_t n, int32_t *id) {
    mr_status st = grow((void **)&g->lits, &g->cap_lits, g->n_lits + 1, sizeof(mr__glitref), MR_GRAMMAR_MAX_LITERALS,
                        "literals (enum values, choices, keys)");
    if (st) return st;
    if (n > (1u << 20) || g->n_pool + n > (16u << 20))
        return mr_error_set(MR_EINVAL, "grammar: the literals exceed 16 MiB");
    if (g->n_pool + n > g->cap_pool) {
        size_t c = g->cap_pool ? g->cap_pool : 256;
        while (c < g->n_pool + n) c *= 2;
        char *q = mr_realloc(g->pool, c);
        if (!q) return MR_ENOMEM;
        g->pool = q;
        g->cap_pool = c;
    }
    memcpy(g->pool + g->n_pool, s, n);
    g->lits[g->n_lits] = (mr__glitref){(uint32_t)g->n_pool, (uint32_t)n};
    g->n_pool += n;
    *id = g->n_lits++;
    return MR_OK;
}

static _Thread_local const mr_grammar *tl_sort_g; /* qsort takes no context */
static int lit_cmp(const void *x, const void *y) {
    size_t la, lb;
    const char *a = mr__glit(tl_sort_g, *(const int32_t *)x, &la), *b = mr__glit(tl_sort_g, *(const int32_t *)y, &lb);
    int c = memcmp(a, b, la < lb ? la : lb);
    return c ? c : (la > lb) - (la < lb);
}

/* Sorts literals [first, first + n) bytewise and drops repeats; returns the new n. */
static int32_t sort_lits(mr_grammar *g, int32_t first, int32_t n) {
    int32_t *ix = mr_malloc((size_t)n * sizeof(int32_t));
    mr__glitref *tmp = mr_malloc((size_t)n * sizeof(mr__glitref));
    if (!ix || !tmp) {
        mr_free(ix);
        mr_free(tmp);
        return -1;
    }
    for (int32_t i = 0; i < n; i++) ix[i] = first + i;
    tl_sort_g = g;
    qsort(ix, (size_t)n, sizeof(int32_t), lit_cmp);
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++)
        if (!k || lit_cmp(&ix[i], &ix[i - 1])) tmp[k++] = g->lits[ix[i]];
    memcpy(g->lits + first, tmp, (size_t)k * sizeof(mr__glitref));
    g->n_lits = first + k;
    mr_free(ix);
    mr_free(tmp);
    return k;
}

/* A literals node over the JSON texts of the values of arr (an array) or of one value. */
/* The literals [first, first + n) just added, sorted and distinct, as a literals node. */
static mr_status lits_close(mr_grammar *g, int32_t first, int32_t n, int32_t *out) {
    const int32_t k = sort_lits(g, first, n);
    if (k < 0) return MR_ENOMEM;
    mr_status st = new_node(g, G_LITERALS, out);
    if (st) return st;
    g->nodes[*out].a = first;
    g->nodes[*out].b = k;
    return MR_OK;
}

static mr_status lits_node(mr_grammar *g, const json_t *vals, bool one, const char *path, int32_t *out) {
    int32_t first = g->n_lits, n = one ? 1 : (int32_t)json_array_size(vals);
    if (n == 0) return mr_error_set(MR_EINVAL, "%s/enum: an empty enum allows no value", path);
    for (int32_t i = 0; i < n; i++) {
        char *s = json_dumps(one ? vals : json_array_get(vals, (size_t)i), JSON_COMPACT | JSON_ENCODE_ANY);
        if (!s) return mr_error_set(MR_ENOMEM, "grammar: out of memory");
        int32_t id;
        mr_status st = add_lit(g, s, strlen(s), &id);
        free(s);
        if (st) return st;
    }
    return lits_close(g, first, n, out);
}

static mr_status any_node(mr_grammar *g, int32_t *out);

static mr_status string_node(mr_grammar *g, int32_t *out) {
    if (g->string >= 0) return (*out = g->string), MR_OK;
    mr_status st = new_node(g, G_STRING, out);
    if (!st) g->string = *out;
    return st;
}

/* The union of object (any keys, any values), array (any items), string, number, true / false / null. */
static mr_status any_node(mr_grammar *g, int32_t *out) {
    if (g->any >= 0) return (*out = g->any), MR_OK;
    int32_t u, o, a, s, n, l;
    mr_status st = new_node(g, G_UNION, &u);
    if (st) return st;
    g->any = u;
    json_t *tfn = json_pack("[bbn]", 1, 0);
    if (!tfn) return MR_ENOMEM;
    st = new_node(g, G_OBJECT, &o);
    if (!st) st = new_node(g, G_ARRAY, &a);
    if (!st) st = string_node(g, &s);
    if (!st) st = new_node(g, G_NUMBER, &n);
    if (!st) st = lits_node(g, tfn, false, "#", &l);
    json_decref(tfn);
    if (!st) st = grow((void **)&g->alts, &g->cap_alts, g->n_alts + 5, sizeof(int32_t), 1 << 20, "alternatives");
    if (st) return st;
    g->nodes[o].addl = u;
    g->nodes[a].a = u;
    g->nodes[u].a = g->n_alts;
    g->nodes[u].b = 5;
    int32_t alt[5] = {o, a, s, n, l};
    memcpy(g->alts + g->n_alts, alt, sizeof alt);
    g->n_alts += 5;
    *out = u;
    return MR_OK;
}

/* An object with any keys and values: the any node's object alternative. */
static mr_status any_object(mr_grammar *g, int32_t *out) {
    int32_t any;
    mr_status st = any_node(g, &any);
    if (!st) *out = g->alts[g->nodes[any].a];
    return st;
}

static mr_status compile(cctx *c, const json_t *s, const char *path, int32_t *out);

static mr_status get_count(const json_t *s, const char *key, const char *path, int64_t *v) {
    const json_t *x = json_object_get(s, key);
    if (!x) return MR_OK;
    if (!json_is_integer(x) || json_integer_value(x) < 0)
        return mr_error_set(MR_EINVAL, "%s/%s: must be a non-negative integer", path, key);
    *v = json_integer_value(x);
    return MR_OK;
}

static mr_status compile_object(cctx *c, const json_t *s, const char *path, int32_t *out) {
    mr_grammar *g = c->g;
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
                 *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return mr_error_set(MR_EINVAL, "%s/properties: must be an object", path);
    if (req && !json_is_array(req)) return mr_error_set(MR_EINVAL, "%s/required: must be an array", path);
    size_t np = props ? json_object_size(props) : 0;
    if (np > MR_GRAMMAR_MAX_PROPS)
        return mr_error_set(MR_EINVAL, "%s/properties: %zu properties; at most %d", path, np, MR_GRAMMAR_MAX_PROPS);
    for (size_t i = 0; req && i < json_array_size(req); i++) {
        const json_t *r = json_array_get(req, i);
        if (!json_is_string(r)) return mr_error_set(MR_EINVAL, "%s/required/%zu: must be a string", path, i);
        if (!props || !json_object_get(props, json_string_value(r)))
            return mr_error_set(MR_EINVAL, "%s/required/%zu: \"%.60s\" is not among the properties", path, i,
                                json_string_value(r));
    }
    int32_t id;
    mr_status st = new_node(g, G_OBJECT, &id);
    if (st) return st;
    if (np == 0) {
        int32_t v = -1; /* "properties": {} without additionalProperties is strict too: only {} */
        if ((!addl && !props) || json_is_true(addl)) st = any_node(g, &v);
        else if (json_is_object(addl)) {
            char p[512];
            snprintf(p, sizeof p, "%s/additionalProperties", path);
            st = compile(c, addl, p, &v);
        } else if (addl && !json_is_false(addl))
            return mr_error_set(MR_EINVAL, "%s/additionalProperties: must be a boolean or a schema", path);
        if (st) return st;
        g->nodes[id].addl = v;
        *out = id;
        return MR_OK;
    }
    /* properties in the schema's order (jansson keeps insertion order) */
    st = grow((void **)&g->props, &g->cap_props, g->n_props + (int32_t)np, sizeof(mr__gprop), 1 << 20, "properties");
    if (st) return st;
    int32_t first = g->n_props;
    g->n_props += (int32_t)np;
    g->nodes[id].a = first;
    g->nodes[id].b = (int32_t)np;
    const char *key;
    const json_t *v;
    int32_t i = 0;
    json_object_foreach((json_t *)props, key, v) {
        char p[512];
        snprintf(p, sizeof p, "%s/properties/%.200s", path, key);
        json_t *kj = json_string(key);
        char *ks = kj ? json_dumps(kj, JSON_ENCODE_ANY) : NULL;
        json_decref(kj);
        if (!ks) return MR_ENOMEM;
        int32_t lit;
        st = add_lit(g, ks, strlen(ks), &lit);
        free(ks);
        if (st) return st;
        int32_t vn;
        st = compile(c, v, p, &vn);
        if (st) return st;
        bool required = false;
        for (size_t k = 0; req && k < json_array_size(req); k++)
            if (!strcmp(json_string_value(json_array_get(req, k)), key)) required = true;
        g->props[first + i++] = (mr__gprop){.key = lit, .value = vn, .required = required};
    }
    *out = id;
    return MR_OK;
}

/* RFC 3986's unreserved and sub-delims characters, a percent-encoded octet, and pchar */
#define F_URI_UN "-A-Za-z0-9._~!$&'()*+,;="
#define F_URI_PCT "%[0-9A-Fa-f]{2}"
#define F_URI_PCHAR "([" F_URI_UN ":@]|" F_URI_PCT ")"
#define F_HEX4 "[0-9a-fA-F]{1,4}"
#define F_IPV4 "((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
#define F_IPV6                                                                                                         \
    "((" F_HEX4 ":){7}" F_HEX4 "|(" F_HEX4 ":){1,7}:|(" F_HEX4 ":){1,6}:" F_HEX4 "|(" F_HEX4 ":){1,5}(:" F_HEX4        \
    "){1,2}|(" F_HEX4 ":){1,4}(:" F_HEX4 "){1,3}|(" F_HEX4 ":){1,3}(:" F_HEX4 "){1,4}|(" F_HEX4 ":){1,2}(:" F_HEX4    \
    "){1,5}|" F_HEX4 ":(:" F_HEX4 "){1,6}|:((:" F_HEX4 "){1,7}|:))"
#define F_DUR_T "T([0-9]+H([0-9]+M([0-9]+(\\.[0-9]+)?S)?)?|[0-9]+M([0-9]+(\\.[0-9]+)?S)?|[0-9]+(\\.[0-9]+)?S)"
#define F_LABEL "[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?"

/* The string formats served, as patterns (RFC 3339 dates, times and durations (with a fraction of the
 * seconds, as ISO 8601 and pydantic's timedelta write it), RFC 4122 UUIDs, dotted IPv4, RFC 4291 IPv6 text
 * without an embedded IPv4 part, RFC 3986 URIs (absolute: pydantic's AnyUrl / HttpUrl), RFC 1123 host names
 * (without their 253-character limit); a practical e-mail shape: something@label.label). */
static const struct {
    const char *name, *pattern;
} FORMATS[] = {
    {"date", "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$"},
    {"time", "^([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"},
    {"date-time", "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
                  "(\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"},
    {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
    {"email", "^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)+$"},
    {"ipv4", "^" F_IPV4 "$"},
    {"ipv6", "^" F_IPV6 "$"},
    {"ipvanyaddress", "^(" F_IPV4 "|" F_IPV6 ")$"}, /* pydantic's IPvAnyAddress */
    {"uri", "^[A-Za-z][-A-Za-z0-9+.]*:(//(([" F_URI_UN ":]|" F_URI_PCT ")*@)?(\\[[0-9A-Fa-f:.]+\\]|([" F_URI_UN "]|" F_URI_PCT
            ")*)(:[0-9]*)?(/" F_URI_PCHAR "*)*|/(" F_URI_PCHAR "+(/" F_URI_PCHAR "*)*)?|" F_URI_PCHAR "+(/" F_URI_PCHAR
            "*)*)?(\\?(" F_URI_PCHAR "|[/?])*)?(#(" F_URI_PCHAR "|[/?])*)?$"},
    {"duration", "^P(([0-9]+Y([0-9]+M([0-9]+D)?)?|[0-9]+M([0-9]+D)?|[0-9]+D)(" F_DUR_T ")?|" F_DUR_T "|[0-9]+W)$"},
    {"hostname", "^" F_LABEL "(\\." F_LABEL ")*$"},
    {"base64", "^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"}, /* RFC 4648, padded */
    /* formats that name no rule on the text (OpenAPI's binary: any octets; password: a hint to hide it;
     * pydantic's paths): any string */
    {"binary", ""}, {"password", ""}, {"path", ""}, {"file-path", ""}, {"directory-path", ""},
};

/* A compiled pattern in g->res; a refusal names where (the pattern's path; NULL: the message alone). */
static mr_status add_pattern(mr_grammar *g, const char *p, const char *where, int32_t *re) {
    mr_status st = grow((void **)&g->res, &g->cap_res, g->n_res + 1, sizeof(mr__pat), 256, "patterns");
    if (st) return st;
    st = mr__pat_compile(p, &g->res[g->n_res]);
    if (st) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", mr_error_last()); /* the message buffer is rewritten below */
        return st == MR_ENOMEM ? st : where ? mr_error_set(MR_EINVAL, "%s: %s", where, msg) : mr_error_set(MR_EINVAL, "%s", msg);
    }
    *re = g->n_res++;
    return MR_OK;
}

/* pattern or format of a string node */
static mr_status string_pattern(mr_grammar *g, const json_t *s, const char *path, int32_t id) {
    const json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    if (!pat && !fmt) return MR_OK;
    if (pat && fmt) return mr_error_set(MR_EINVAL, "%s: pattern and format together are not supported", path);
    const char *p = NULL;
    if (pat) {
        if (!json_is_string(pat)) return mr_error_set(MR_EINVAL, "%s/pattern: must be a string", path);
        p = json_string_value(pat);
    } else {
        if (!json_is_string(fmt)) return mr_error_set(MR_EINVAL, "%s/format: must be a string", path);
        size_t f = 0;
        while (f < sizeof FORMATS / sizeof FORMATS[0] && strcmp(json_string_value(fmt), FORMATS[f].name)) f++;
        if (f == sizeof FORMATS / sizeof FORMATS[0])
            return mr_error_set(MR_EINVAL, "%s/format: \"%.40s\" is not supported (date, time, date-time, duration, uuid, "
                                "email, ipv4, ipv6, ipvanyaddress, uri, hostname, base64, and binary, password and the "
                                "paths as any string are)", path, json_string_value(fmt));
        if (!*FORMATS[f].pattern) return MR_OK; /* no rule on the text */
        p = FORMATS[f].pattern;
    }
    char where[600];
    snprintf(where, sizeof where, "%s/%s", path, pat ? "pattern" : "format");
    return add_pattern(g, p, where, &g->nodes[id].re);
}

/* A patterned string with minLength or maxLength: its pattern's length table, for the matcher to take a
 * character only where a match of an allowed length can still follow (else a pattern that can go on past
 * maxLength, or stop short of minLength, would lead the output where no token can continue it); refused where
 * no match has an allowed length. */
static mr_status pattern_lengths(mr_grammar *g, const mr__gnode *n, const char *path) {
    if (n->re < 0 || (n->lo == 0 && n->hi < 0)) return MR_OK;
    mr__pat *re = &g->res[n->re];
    mr_status st = mr__pat_lengths(re);
    if (st == MR_EINVAL) {
        char why[256];
        snprintf(why, sizeof why, "%s", mr_error_last());
        return mr_error_set(MR_EINVAL, "%s: minLength / maxLength beside this pattern are not supported: %s", path, why);
    }
    if (st) return st;
    if (!mr__pat_len_ok(re, MR__RE_START, 0, n->lo, n->hi)) {
        char len[64];
        if (n->hi < 0) snprintf(len, sizeof len, "at least %lld characters (minLength)", (long long)n->lo);
        else if (n->lo == 0) snprintf(len, sizeof len, "at most %lld characters (maxLength)", (long long)n->hi);
        else snprintf(len, sizeof len, "%lld to %lld characters (minLength, maxLength)", (long long)n->lo, (long long)n->hi);
        return mr_error_set(MR_EINVAL, "%s: no string of %s matches the pattern", path, len);
    }
    return MR_OK;
}

/* x * MR__NUM_UNIT, rounded up or down, exactly (x = M 2^e with M an integer of 53 bits); |x| < 10^20. */
static mr__i128 scaled(double x, bool up) {
    int e;
    const double m = frexp(x, &e);
    const mr__i128 p = (mr__i128)(int64_t)ldexp(m, 53) * MR__NUM_UNIT;
    e -= 53;
    if (e >= 0) return p * ((mr__i128)1 << e);
    if (e < -120) return p > 0 ? up : p < 0 ? -(mr__i128)!up : 0;
    const mr__i128 d = (mr__i128)1 << -e, q = p / d, r = p % d;
    return up ? q + (r > 0) : q - (r < 0);
}

/* The integer formats OpenAPI and schema generators write (schemars, pydantic's conint, ...), as bounds;
 * a number's float / double say nothing a JSON number does not. */
static const struct {
    const char *name;
    double lo, hi;
} INT_FORMATS[] = {{"int8", -128.0, 127.0},
                   {"int16", -32768.0, 32767.0},
                   {"int32", -2147483648.0, 2147483647.0},
                   {"int64", -9223372036854775808.0, 9223372036854775807.0},
                   {"uint8", 0, 255.0},
                   {"uint16", 0, 65535.0},
                   {"uint32", 0, 4294967295.0},
                   {"uint64", 0, 18446744073709551615.0}};

static void bound_lo(mr__gnode *n, mr__i128 b) {
    if (!(n->bounds & 1) || b > n->vlo) n->vlo = b;
    n->bounds |= 1;
}

static void bound_hi(mr__gnode *n, mr__i128 b) {
    if (!(n->bounds & 2) || b < n->vhi) n->vhi = b;
    n->bounds |= 2;
}

/* minimum / maximum / exclusiveMinimum / exclusiveMaximum (numbers, or draft 4's booleans beside minimum /
 * maximum) and an integer's format, as inclusive scaled bounds. A number's bound is kept exactly as the
 * double the schema's number is: a decimal d >= that double reads as a double >= it (rounding is
 * monotone), and an exclusive bound becomes the next double inward, so that every number written in
 * range reads as one in range, whoever parses it. */
static mr_status num_bounds(const json_t *s, const char *path, mr__gnode *n) {
    static const char *const K[4] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    const bool integer = n->kind == G_INTEGER;
    const mr__i128 S = MR__NUM_UNIT;
    for (int k = 0; k < 4; k++) {
        const json_t *v = json_object_get(s, K[k]);
        if (!v || json_is_boolean(v)) continue;
        if (!json_is_number(v)) return mr_error_set(MR_EINVAL, "%s/%s: must be a number", path, K[k]);
        const double x = json_number_value(v);
        if (!(fabs(x) < 1e20)) return mr_error_set(MR_EINVAL, "%s/%s: beyond +-10^20", path, K[k]);
        const bool excl = k % 2 == 1 ? true : json_is_true(json_object_get(s, K[k + 1])); /* draft 4: a boolean */
        if (k < 2) {
            if (integer) bound_lo(n, excl ? scaled(floor(x), false) + S : scaled(ceil(x), true));
            else bound_lo(n, scaled(excl ? nextafter(x, INFINITY) : x, true));
        } else {
            if (integer) bound_hi(n, excl ? scaled(ceil(x), true) - S : scaled(floor(x), false));
            else bound_hi(n, scaled(excl ? nextafter(x, -INFINITY) : x, false));
        }
    }
    const json_t *fmt = json_object_get(s, "format");
    if (fmt) {
        const char *f = json_string_value(fmt);
        size_t i = 0, nf = sizeof INT_FORMATS / sizeof INT_FORMATS[0];
        while (f && integer && i < nf && strcmp(f, INT_FORMATS[i].name)) i++;
        if (f && integer && i < nf) {
            bound_lo(n, scaled(INT_FORMATS[i].lo, true));
            bound_hi(n, scaled(INT_FORMATS[i].hi, false));
        } else if (!f || integer || (strcmp(f, "float") && strcmp(f, "double"))) {
            return mr_error_set(MR_EINVAL, "%s/format: %s%.40s%s is not supported on %s (%s)", path, f ? "\"" : "",
                                f ? f : "not a string", f ? "\"" : "", integer ? "an integer" : "a number",
                                integer ? "int8 .. int64 and uint8 .. uint64 are" : "float and double are");
        }
    }
    /* what can be written: at most MR__NUM_INT digits before the point */
    const mr__i128 top = MR__NUM_UNIT * S; /* 10^(MR__NUM_INT + MR__NUM_FRAC) */
    if (((n->bounds & 1) && n->vlo >= top) || ((n->bounds & 2) && n->vhi <= -top) ||
        (n->bounds == 3 && n->vlo > n->vhi)) {
        const double lo = n->bounds & 1 ? (double)n->vlo / 1e18 : -INFINITY, hi = n->bounds & 2 ? (double)n->vhi / 1e18 : INFINITY;
        if (integer)
            return mr_error_set(MR_EINVAL, "%s: no integer of at most %d digits lies in [%.0f, %.0f]", path, MR__NUM_INT, lo, hi);
        return mr_error_set(MR_EINVAL, "%s: no number of at most %d digits before and %d after the point lies in "
                            "[%.17g, %.17g]", path, MR__NUM_INT, MR__NUM_FRAC, lo, hi);
    }
    return MR_OK;
}

/* Literals i and j are equal as JSON values (1 and 1.0 too); true when either does not parse (unsure). */
static bool lits_equal(const mr_grammar *g, int32_t i, int32_t j) {
    size_t li, lj;
    const char *si = mr__glit(g, i, &li), *sj = mr__glit(g, j, &lj);
    json_t *x = json_loadb(si, li, JSON_DECODE_ANY, NULL), *y = json_loadb(sj, lj, JSON_DECODE_ANY, NULL);
    const bool same = !x || !y || json_equal(x, y) ||
                      (json_is_number(x) && json_is_number(y) && json_number_value(x) == json_number_value(y));
    json_decref(x), json_decref(y);
    return same;
}

/* uniqueItems of array node id: served where the items are one of a list of values (enum, const, boolean; at
 * most 64, no two of them equal as JSON values, 1 and 1.0 say): the matcher keeps which it took. */
static mr_status unique_items(mr_grammar *g, int32_t id, const char *path) {
    mr__gnode *n = &g->nodes[id];
    const mr__gnode *it = n->a >= 0 ? &g->nodes[n->a] : NULL;
    if (n->b || !it || it->kind != G_LITERALS || it->b > 64)
        return mr_error_set(MR_EINVAL, "%s/uniqueItems: supported where the items are one of at most 64 values (enum, "
                            "const, boolean), not on a tuple; elsewhere it would not be enforced", path);
    for (int32_t i = 0; i < it->b; i++)
        for (int32_t j = i + 1; j < it->b; j++)
            if (lits_equal(g, it->a + i, it->a + j)) {
                size_t li, lj;
                const char *si = mr__glit(g, it->a + i, &li), *sj = mr__glit(g, it->a + j, &lj);
                return mr_error_set(MR_EINVAL, "%s/uniqueItems: two of the values, %.*s and %.*s, are equal as JSON",
                                    path, (int)li, si, (int)lj, sj);
            }
    if (n->lo > it->b)
        return mr_error_set(MR_EINVAL, "%s: minItems is %lld, but only %d distinct values may be items", path,
                            (long long)n->lo, (int)it->b);
    if (n->hi < 0 || n->hi > it->b) n->hi = it->b;
    n->bounds |= G_UNIQUE;
    return MR_OK;
}

/* An array: items (a schema for every item), or a tuple: prefixItems (draft 2020-12) or items as a list
 * (drafts 4 to 2019), the items after them by items / additionalItems (absent or true: any value; false:
 * none); minItems, maxItems. */
static mr_status compile_array(cctx *c, const json_t *s, const char *path, int32_t *out) {
    mr_grammar *g = c->g;
    const json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems"), *rest = items;
    const char *rest_kw = "items";
    if (!prefix && json_is_array(items)) prefix = items, rest = json_object_get(s, "additionalItems"), rest_kw = "additionalItems";
    if (prefix && (!json_is_array(prefix) || json_array_size(prefix) > 64))
        return mr_error_set(MR_EINVAL, "%s/%s: must be a list of at most 64 schemas", path, prefix == items ? "items" : "prefixItems");
    int32_t pre[64], np = prefix ? (int32_t)json_array_size(prefix) : 0, it = -1, id;
    char p[512];
    mr_status st = MR_OK;
    for (int32_t i = 0; i < np && !st; i++) {
        snprintf(p, sizeof p, "%s/%s/%d", path, prefix == items ? "items" : "prefixItems", (int)i);
        st = compile(c, json_array_get(prefix, (size_t)i), p, &pre[i]);
    }
    if (st) return st;
    if (json_is_false(rest)) {
        it = -1; /* nothing after the prefix */
    } else if (rest && !json_is_true(rest)) {
        snprintf(p, sizeof p, "%s/%s", path, rest_kw);
        st = compile(c, rest, p, &it);
    } else {
        st = any_node(g, &it);
    }
    if (!st && np) st = grow((void **)&g->alts, &g->cap_alts, g->n_alts + np, sizeof(int32_t), 1 << 20, "alternatives");
    if (!st) st = new_node(g, G_ARRAY, &id);
    if (st) return st;
    mr__gnode *n = &g->nodes[id];
    n->a = it;
    n->b = np;
    if (np) {
        n->addl = g->n_alts;
        memcpy(g->alts + g->n_alts, pre, (size_t)np * sizeof(int32_t));
        g->n_alts += np;
    }
    n->lo = 0;
    if ((st = get_count(s, "minItems", path, &n->lo)) || (st = get_count(s, "maxItems", path, &n->hi))) return st;
    if (n->hi >= 0 && n->hi < n->lo) return mr_error_set(MR_EINVAL, "%s: maxItems is below minItems", path);
    if (it < 0 && n->lo > np)
        return mr_error_set(MR_EINVAL, "%s: minItems is %lld, but the tuple holds %d items and no more may follow", path,
                            (long long)n->lo, (int)np);
    if (it < 0 && (n->hi < 0 || n->hi > np)) n->hi = np;
    const json_t *uq = json_object_get(s, "uniqueItems");
    if (uq && !json_is_boolean(uq)) return mr_error_set(MR_EINVAL, "%s/uniqueItems: must be a boolean", path);
    if (json_is_true(uq) && (st = unique_items(g, id, path))) return st;
    *out = id;
    return MR_OK;
}

static mr_status compile_type(cctx *c, const json_t *s, const char *type, const char *path, int32_t *out) {
    mr_grammar *g = c->g;
    mr_status st;
    if (!strcmp(type, "object")) return compile_object(c, s, path, out);
    if (!strcmp(type, "array")) return compile_array(c, s, path, out);
    if (!strcmp(type, "string")) {
        int32_t id;
        if ((st = new_node(g, G_STRING, &id))) return st;
        if ((st = get_count(s, "minLength", path, &g->nodes[id].lo)) ||
            (st = get_count(s, "maxLength", path, &g->nodes[id].hi)))
            return st;
        if (g->nodes[id].hi >= 0 && g->nodes[id].hi < g->nodes[id].lo)
            return mr_error_set(MR_EINVAL, "%s: maxLength is below minLength", path);
        *out = id;
        if ((st = string_pattern(g, s, path, id))) return st;
        return pattern_lengths(g, &g->nodes[id], path);
    }
    if (!strcmp(type, "number") || !strcmp(type, "integer")) {
        if ((st = new_node(g, !strcmp(type, "number") ? G_NUMBER : G_INTEGER, out))) return st;
        return num_bounds(s, path, &g->nodes[*out]);
    }
    if (!strcmp(type, "boolean") || !strcmp(type, "null")) {
        json_t *v = !strcmp(type, "null") ? json_pack("[n]") : json_pack("[bb]", 1, 0);
        if (!v) return MR_ENOMEM;
        st = lits_node(g, v, false, path, out);
        json_decref(v);
        return st;
    }
    return mr_error_set(MR_EINVAL, "%s/type: \"%.40s\" is not a JSON schema type", path, type);
}

static mr_status union_node(mr_grammar *g, const int32_t *alt, int32_t n, int32_t *out) {
    mr_status st = grow((void **)&g->alts, &g->cap_alts, g->n_alts + n, sizeof(int32_t), 1 << 20, "alternatives");
    if (!st) st = new_node(g, G_UNION, out);
    if (st) return st;
    g->nodes[*out].a = g->n_alts;
    g->nodes[*out].b = n;
    memcpy(g->alts + g->n_alts, alt, (size_t)n * sizeof(int32_t));
    g->n_alts += n;
    return MR_OK;
}

static mr_status compile_ref(cctx *c, const char *ref, const char *path, int32_t *out) {
    const json_t *t = NULL;
    if (!strcmp(ref, "#")) {
        t = c->doc;
    } else {
        const char *name = NULL, *bag = NULL;
        if (!strncmp(ref, "#/$defs/", 8)) bag = "$defs", name = ref + 8;
        else if (!strncmp(ref, "#/definitions/", 14)) bag = "definitions", name = ref + 14;
        if (bag && !strchr(name, '/')) t = json_object_get(json_object_get(c->doc, bag), name);
        if (!t) return mr_error_set(MR_EINVAL, "%s/$ref: \"%.80s\" does not resolve (\"#\", \"#/$defs/x\" and "
                                    "\"#/definitions/x\" do)", path, ref);
    }
    for (int i = 0; i < c->n_refs; i++)
        if (c->refs[i].target == t) return (*out = c->refs[i].node), MR_OK;
    if (c->n_refs == MAX_REFS) return mr_error_set(MR_EINVAL, "%s/$ref: more than %d distinct $ref targets", path, MAX_REFS);
    int32_t id, body;
    mr_status st = new_node(c->g, G_PENDING, &id);
    if (st) return st;
    c->refs[c->n_refs].target = t;
    c->refs[c->n_refs++].node = id;
    if ((st = compile(c, t, ref, &body))) return st;
    c->g->nodes[id] = c->g->nodes[body]; /* the target's node, under the id its recursive uses hold */
    *out = id;
    return MR_OK;
}

/* "type" is t or a list holding t. */
static bool names_type(const json_t *ty, const char *t) {
    if (json_is_string(ty)) return !strcmp(json_string_value(ty), t);
    for (size_t i = 0; json_is_array(ty) && i < json_array_size(ty); i++)
        if (json_is_string(json_array_get(ty, i)) && !strcmp(json_string_value(json_array_get(ty, i)), t)) return true;
    return false;
}

/* ---- oneOf: its alternatives must exclude one another (a value of one never holds for another), or an
 * output that follows one could hold for two, which oneOf forbids; what cannot be shown is refused ---- */
enum { J_OBJ = 1, J_ARR = 2, J_STR = 4, J_NUM = 8, J_TRUE = 16, J_FALSE = 32, J_NULL = 64, J_ANY = 127 };

/* The JSON types the values of node id may have. */
static unsigned json_types(const mr_grammar *g, int32_t id, int depth) {
    const mr__gnode *n = &g->nodes[id];
    unsigned t = 0;
    switch (n->kind) {
    case G_OBJECT: return J_OBJ;
    case G_ARRAY: return J_ARR;
    case G_STRING: return J_STR;
    case G_NUMBER:
    case G_INTEGER: return J_NUM;
    case G_LITERALS:
        for (int32_t i = 0; i < n->b; i++) {
            size_t len;
            const char c = mr__glit(g, n->a + i, &len)[0];
            t |= c == '{' ? J_OBJ : c == '[' ? J_ARR : c == '"' ? J_STR : c == 't' ? J_TRUE : c == 'f' ? J_FALSE
                 : c == 'n' ? J_NULL : J_NUM;
        }
        return t;
    case G_UNION:
        for (int32_t i = 0; i < n->b && depth < 16; i++) t |= json_types(g, g->alts[n->a + i], depth + 1);
        return depth < 16 ? t : J_ANY;
    default: return J_ANY; /* a $ref still being compiled */
    }
}

static bool excludes(const mr_grammar *g, const mr__gnode *x, const mr__gnode *y, int depth);

/* No value holds for both nodes, as far as can be shown (false when unsure). */
static bool disjoint(const mr_grammar *g, int32_t x, int32_t y, int depth) {
    if (depth > 8) return false;
    if (!(json_types(g, x, 0) & json_types(g, y, 0))) return true;
    const mr__gnode *a = &g->nodes[x], *b = &g->nodes[y];
    if (a->kind == G_UNION || b->kind == G_UNION) {
        const mr__gnode *u = a->kind == G_UNION ? a : b;
        const int32_t other = a->kind == G_UNION ? y : x;
        for (int32_t i = 0; i < u->b; i++)
            if (!disjoint(g, g->alts[u->a + i], other, depth + 1)) return false;
        return true;
    }
    if (a->kind == G_LITERALS && b->kind == G_LITERALS) {
        for (int32_t i = 0; i < a->b; i++)
            for (int32_t j = 0; j < b->b; j++)
                if (lits_equal(g, a->a + i, b->a + j)) return false;
        return true;
    }
    if (a->kind == G_OBJECT && b->kind == G_OBJECT) return excludes(g, a, b, depth) && excludes(g, b, a, depth);
    return false;
}

/* Every object the matcher writes for x (its declared keys only, its required ones always) fails y. */
static bool excludes(const mr_grammar *g, const mr__gnode *x, const mr__gnode *y, int depth) {
    if (x->addl >= 0 || x->sel_prop >= 0 || y->sel_prop >= 0) return false;
    for (int32_t j = 0; j < y->b; j++) {
        const mr__gprop *q = &g->props[y->a + j];
        size_t lq;
        const char *kq = mr__glit(g, q->key, &lq);
        const mr__gprop *p = NULL;
        for (int32_t i = 0; i < x->b && !p; i++) {
            size_t lp;
            const char *kp = mr__glit(g, g->props[x->a + i].key, &lp);
            if (lp == lq && !memcmp(kp, kq, lp)) p = &g->props[x->a + i];
        }
        if (!p && q->required) return true; /* y needs a key x never writes */
        if (p && (p->required || q->required) && disjoint(g, p->value, q->value, depth + 1)) return true;
    }
    return false;
}

static mr_status compile(cctx *c, const json_t *s, const char *path, int32_t *out) {
    mr_grammar *g = c->g;
    if (json_is_true(s)) return any_node(g, out);
    if (!json_is_object(s)) return mr_error_set(MR_EINVAL, "%s: a schema must be an object or true", path);
    if (++c->depth > 64) return mr_error_set(MR_EINVAL, "%s: schemas nest more than 64 deep", path);
    mr_status st = MR_OK;
    for (int i = 0; UNSUPPORTED[i]; i++)
        if (json_object_get(s, UNSUPPORTED[i])) {
            st = mr_error_set(MR_EINVAL, "%s/%s: this keyword is not supported in structured outputs (it would not be "
                              "enforced)", path, UNSUPPORTED[i]);
            goto out;
        }
    const json_t *ty = json_object_get(s, "type");
    const bool stringy = names_type(ty, "string"), numeric = names_type(ty, "integer") || names_type(ty, "number");
    if (json_object_get(s, "pattern") && !stringy) {
        st = mr_error_set(MR_EINVAL, "%s: pattern is supported beside \"type\": \"string\" (without it, it would not be "
                          "enforced)", path);
        goto out;
    }
    if (json_is_true(json_object_get(s, "uniqueItems")) && !names_type(ty, "array")) {
        st = mr_error_set(MR_EINVAL, "%s: uniqueItems is supported beside \"type\": \"array\" (without it, it would not "
                          "be enforced)", path);
        goto out;
    }
    if (json_object_get(s, "format") && !stringy && !numeric) {
        st = mr_error_set(MR_EINVAL, "%s: format is supported beside \"type\": \"string\", \"integer\" or \"number\" "
                          "(without it, it would not be enforced)", path);
        goto out;
    }
    if ((json_object_get(s, "minimum") || json_object_get(s, "maximum") || json_object_get(s, "exclusiveMinimum") ||
         json_object_get(s, "exclusiveMaximum")) && !numeric) {
        st = mr_error_set(MR_EINVAL, "%s: minimum / maximum are supported beside \"type\": \"integer\" or \"number\" "
                          "(without it they would not be enforced)", path);
        goto out;
    }
    const json_t *ref = json_object_get(s, "$ref"), *en = json_object_get(s, "enum"), *co = json_object_get(s, "const"),
                 *any = json_object_get(s, "anyOf"), *one = json_object_get(s, "oneOf"),
                 *all = json_object_get(s, "allOf"), *type = json_object_get(s, "type");
    if (ref) {
        if (!json_is_string(ref)) st = mr_error_set(MR_EINVAL, "%s/$ref: must be a string", path);
        else st = compile_ref(c, json_string_value(ref), path, out);
    } else if (co) {
        st = lits_node(g, co, true, path, out);
    } else if (en) {
        if (!json_is_array(en)) st = mr_error_set(MR_EINVAL, "%s/enum: must be an array", path);
        else st = lits_node(g, en, false, path, out);
    } else if (all) {
        if (!json_is_array(all) || json_array_size(all) != 1)
            st = mr_error_set(MR_EINVAL, "%s/allOf: only a list of one schema is supported", path);
        else {
            char p[512];
            snprintf(p, sizeof p, "%s/allOf/0", path);
            st = compile(c, json_array_get(all, 0), p, out);
        }
    } else if (any || one) {
        const json_t *l = any ? any : one;
        const char *kw = any ? "anyOf" : "oneOf";
        size_t n = json_is_array(l) ? json_array_size(l) : 0;
        if (!n || n > 64) {
            st = mr_error_set(MR_EINVAL, "%s/%s: must be a list of 1 to 64 schemas", path, kw);
            goto out;
        }
        int32_t alt[64];
        for (size_t i = 0; i < n && !st; i++) {
            char p[512];
            snprintf(p, sizeof p, "%s/%s/%zu", path, kw, i);
            st = compile(c, json_array_get(l, i), p, &alt[i]);
        }
        for (size_t i = 0; one && !st && i < n; i++)
            for (size_t j = i + 1; j < n && !st; j++)
                if (!disjoint(g, alt[i], alt[j], 0))
                    st = mr_error_set(MR_EINVAL, "%s/oneOf: alternatives %zu and %zu may both hold for one value, which "
                                      "oneOf forbids (anyOf allows it; or tell them apart by type, or by a required "
                                      "property of different constant values)", path, i, j);
        if (!st) st = n == 1 ? ((*out = alt[0]), MR_OK) : union_node(g, alt, (int32_t)n, out);
    } else if (json_is_string(type)) {
        st = compile_type(c, s, json_string_value(type), path, out);
    } else if (json_is_array(type)) {
        size_t n = json_array_size(type);
        int32_t alt[8];
        if (!n || n > 8) {
            st = mr_error_set(MR_EINVAL, "%s/type: a list of 1 to 8 type names", path);
            goto out;
        }
        for (size_t i = 0; i < n && !st; i++) {
            const json_t *t = json_array_get(type, i);
            if (!json_is_string(t)) st = mr_error_set(MR_EINVAL, "%s/type/%zu: must be a string", path, i);
            else st = compile_type(c, s, json_string_value(t), path, &alt[i]);
        }
        if (!st) st = n == 1 ? ((*out = alt[0]), MR_OK) : union_node(g, alt, (int32_t)n, out);
    } else if (type) {
        st = mr_error_set(MR_EINVAL, "%s/type: must be a string or a list of strings", path);
    } else if (json_object_get(s, "properties")) {
        st = compile_object(c, s, path, out);
    } else if (json_object_get(s, "items")) {
        st = compile_type(c, s, "array", path, out);
    } else {
        st = any_node(g, out); /* no constraint: any value */
    }
out:
    c->depth--;
    return st;
}

/* ---- unions, flattened: each union's alternatives become the concrete nodes under it ---- */
/* The concrete nodes reachable from node through unions, each once, in order (color: 1 on the path, 2 done). */
static mr_status flat_visit(mr_grammar *g, int32_t node, uint8_t *color, int32_t *out, int32_t *n) {
    const mr__gnode *x = &g->nodes[node];
    if (x->kind == G_PENDING) return mr_error_set(MR_EINVAL, "grammar: a $ref used before its target is complete");
    if (color[node] == 1)
        return mr_error_set(MR_EINVAL, "grammar: a union contains itself (anyOf of a $ref to itself)");
    if (color[node] == 2) return MR_OK;
    if (x->kind != G_UNION) {
        color[node] = 2;
        out[(*n)++] = node;
        return MR_OK;
    }
    color[node] = 1;
    for (int32_t i = 0; i < x->b; i++) {
        mr_status st = flat_visit(g, g->alts[x->a + i], color, out, n);
        if (st) return st;
    }
    color[node] = 2;
    return MR_OK;
}

/* Every union's alternatives as its concrete nodes (a union of unions, shared or nested as deep as a
 * schema makes it, costs one pass: picking an alternative at run time is a loop, never a recursion); an
 * unbounded integer beside a number is the number (one alternative, not two alike); a union that
 * contains itself without consuming a byte is refused. Alternatives that start alike are fine: the
 * matcher runs them side by side. */
static mr_status flatten_unions(mr_grammar *g) {
    uint8_t *color = mr_malloc((size_t)g->n_nodes);
    int32_t *out = mr_malloc((size_t)g->n_nodes * sizeof(int32_t));
    mr_status st = color && out ? MR_OK : MR_ENOMEM;
    for (int32_t u = 0; !st && u < g->n_nodes; u++) {
        if (g->nodes[u].kind != G_UNION) continue;
        memset(color, 0, (size_t)g->n_nodes);
        int32_t n = 0;
        if ((st = flat_visit(g, u, color, out, &n))) break;
        bool has_num = false;
        for (int32_t i = 0; i < n; i++) has_num |= g->nodes[out[i]].kind == G_NUMBER;
        int32_t k = 0;
        for (int32_t i = 0; i < n; i++)
            if (!(has_num && g->nodes[out[i]].kind == G_INTEGER && !g->nodes[out[i]].bounds)) out[k++] = out[i];
        if ((st = grow((void **)&g->alts, &g->cap_alts, g->n_alts + k, sizeof(int32_t), 1 << 24, "alternatives"))) break;
        memcpy(g->alts + g->n_alts, out, (size_t)k * sizeof(int32_t));
        g->nodes[u].a = g->n_alts;
        g->nodes[u].b = k;
        g->n_alts += k;
    }
    mr_free(color);
    mr_free(out);
    return st;
}

/* ---- values that can end: a schema that requires itself without end (a $ref to itself, a required property
 * or minItems through a cycle back to the same schema) admits no JSON value, so an output held to it could
 * never be finished; and one that ends only nested deeper than the matcher's frames go could not be either.
 * need: the frames a value of the node takes to end, its own counted (NEED_NONE: it cannot end) ---- */
enum { NEED_NONE = 1 << 20 };

static int32_t prop_need(const mr_grammar *g, const mr__gnode *x, int32_t i, const int32_t *need) {
    if (i != x->sel_prop) return need[g->props[x->a + i].value];
    const mr__gnode *names = &g->nodes[g->props[x->a + x->sel_from].value]; /* chosen by the name: every tool's */
    int32_t most = 1;
    for (int32_t k = 0; k < names->b; k++) most = need[g->sels[x->sel_first + k]] > most ? need[g->sels[x->sel_first + k]] : most;
    return most;
}

/* A value of node id: the frames it takes to end, given those of the others in need (a container holds one
 * of its parts at a time above its own frame). */
static int32_t node_need(const mr_grammar *g, int32_t id, const int32_t *need) {
    const mr__gnode *x = &g->nodes[id];
    int32_t most = 1;
    switch (x->kind) {
    case G_PENDING: return NEED_NONE; /* a $ref that is its own target */
    case G_UNION:
        most = NEED_NONE;
        for (int32_t i = 0; i < x->b; i++) most = need[g->alts[x->a + i]] < most ? need[g->alts[x->a + i]] : most;
        return most;
    case G_OBJECT:
        for (int32_t i = 0; i < x->b; i++)
            if (g->props[x->a + i].required || i == x->sel_prop) {
                const int32_t v = prop_need(g, x, i, need);
                if (v >= NEED_NONE) return NEED_NONE;
                most = 1 + v > most ? 1 + v : most;
            }
        return most;
    case G_ARRAY: /* its first lo items */
        for (int64_t i = 0; i < x->lo; i++) {
            const int32_t it = i < x->b ? g->alts[x->addl + i] : x->a;
            if (it < 0 || need[it] >= NEED_NONE) return NEED_NONE;
            most = 1 + need[it] > most ? 1 + need[it] : most;
        }
        return most;
    case G_XCALLS:
        most = 2;
        for (int32_t t = x->a; t < x->a + x->b; t++)
            for (int32_t i = g->xtools[t].pa; i < g->xtools[t].pa + g->xtools[t].pb; i++) {
                const int32_t v = g->props[i].value; /* < 0: raw text */
                if (!g->props[i].required || v < 0) continue;
                if (need[v] >= NEED_NONE) return NEED_NONE;
                most = 2 + need[v] > most ? 2 + need[v] : most;
            }
        return most;
    case G_TAGS:
        for (int32_t t = 0; t < g->n_tags; t++)
            if (g->tags[t].value >= 0 && need[g->tags[t].value] >= NEED_NONE) return NEED_NONE;
        return 1;
    default: return 1;
    }
}

/* Refuses a grammar whose root has no value that ends (within the matcher's depth); elsewhere takes away the
 * ways into values that cannot end (an alternative, an optional property, more items than an array's items
 * can end in), so that an output can always be finished; the matcher takes a value, an optional property or
 * one more item only where its need fits above the frames in use. Lists change as new ranges (nodes copied
 * from a $ref share theirs). */
static mr_status keep_ending(mr_grammar *g) {
    int32_t *need = mr_malloc((size_t)g->n_nodes * sizeof(int32_t));
    if (!need) return MR_ENOMEM;
    for (int32_t id = 0; id < g->n_nodes; id++) need[id] = NEED_NONE;
    for (bool fell = true; fell;) { /* each pass lowers some node's need, never below 1 */
        fell = false;
        for (int32_t id = 0; id < g->n_nodes; id++) {
            const int32_t v = node_need(g, id, need);
            if (v < need[id]) need[id] = v, fell = true;
        }
    }
    mr_status st = MR_OK;
    if (g->root >= 0 && need[g->root] >= NEED_NONE)
        st = mr_error_set(MR_EINVAL, "grammar: the schema admits no value: it requires itself without end (a $ref to "
                          "itself, or a required property or minItems that leads back to the same schema)");
    else if (g->root >= 0 && need[g->root] > MR_GRAMMAR_MAX_DEPTH)
        st = mr_error_set(MR_EINVAL, "grammar: every value of the schema nests more than %d deep", MR_GRAMMAR_MAX_DEPTH);
#define ENDS(n) (need[n] < NEED_NONE)
    for (int32_t id = 0; id < g->n_nodes && !st; id++) {
        mr__gnode *x = &g->nodes[id];
        x->need = need[id];
        if (!ENDS(id)) continue; /* no way leads to it any more (or the grammar is refused) */
        if (x->kind == G_UNION || (x->kind == G_OBJECT && x->sel_prop < 0 && x->b > 0)) {
            const bool u = x->kind == G_UNION;
            int32_t keep = 0;
            for (int32_t i = 0; i < x->b; i++) keep += ENDS(u ? g->alts[x->a + i] : g->props[x->a + i].value);
            if (keep == x->b) continue;
            if (u) st = grow((void **)&g->alts, &g->cap_alts, g->n_alts + keep, sizeof(int32_t), 1 << 24, "alternatives");
            else st = grow((void **)&g->props, &g->cap_props, g->n_props + keep, sizeof(mr__gprop), 1 << 20, "properties");
            if (st) break;
            const int32_t a = u ? g->n_alts : g->n_props;
            for (int32_t i = 0, k = 0; i < x->b; i++) {
                if (u && ENDS(g->alts[x->a + i])) g->alts[a + k++] = g->alts[x->a + i];
                else if (!u && ENDS(g->props[x->a + i].value)) g->props[a + k++] = g->props[x->a + i];
            }
            *(u ? &g->n_alts : &g->n_props) += keep;
            x->a = a, x->b = keep; /* an object left with no property: {} alone (addl is -1 beside properties) */
        } else if (x->kind == G_OBJECT && x->addl >= 0 && !ENDS(x->addl)) {
            x->addl = -1; /* no other key: {} alone */
        } else if (x->kind == G_ARRAY) { /* as many items as end, one after another (at least lo: it ends) */
            int64_t most = -1;
            for (int32_t i = 0; i < x->b && most < 0; i++)
                if (!ENDS(g->alts[x->addl + i])) most = i;
            if (most < 0 && (x->a < 0 || !ENDS(x->a))) most = x->b;
            if (most >= 0 && (x->hi < 0 || x->hi > most)) x->hi = most;
            if (x->a >= 0 && !ENDS(x->a)) x->a = -1;
        }
    }
#undef ENDS
    mr_free(need);
    return st;
}

int32_t mr__gpick(const mr_grammar *g, int32_t node, uint8_t c) {
    const mr__gnode *n = &g->nodes[node];
    switch (n->kind) {
    case G_OBJECT: return c == '{' ? node : -1;
    case G_ARRAY: return c == '[' ? node : -1;
    case G_STRING: return c == '"' ? node : -1;
    case G_XCALLS: return c == '<' ? node : -1;
    case G_NUMBER:
    case G_INTEGER: return c == '-' || (c >= '0' && c <= '9') ? node : -1;
    case G_LITERALS:
        for (int32_t i = 0; i < n->b; i++) {
            size_t len;
            const char *s = mr__glit(g, n->a + i, &len);
            if (len && (uint8_t)s[0] == c) return node;
        }
        return -1;
    case G_UNION:
        for (int32_t i = 0; i < n->b; i++) {
            int32_t r = mr__gpick(g, g->alts[n->a + i], c);
            if (r >= 0) return r;
        }
        return -1;
    default: return -1;
    }
}

/* ---- public builders ---- */
static mr_status grammar_alloc(mr_grammar **out) {
    mr_grammar *g = mr_calloc(1, sizeof *g);
    if (!g) return MR_ENOMEM;
    g->any = g->string = g->root = -1;
    *out = g;
    return MR_OK;
}

static mr_status finish(mr_grammar *g, mr_status st, const char *what, mr_grammar **out) {
    if (!st) st = flatten_unions(g);
    if (!st) st = keep_ending(g);
    if (st) {
        mr_grammar_free(g);
        return st;
    }
    snprintf(g->desc, sizeof g->desc, "%s: %d nodes, %d literals", what, (int)g->n_nodes, (int)g->n_lits);
    *out = g;
    return MR_OK;
}

mr_status mr__grammar_new(mr_grammar **out) { return grammar_alloc(out); }
mr_status mr__grammar_raw_lits(mr_grammar *g, const char *const *s, int32_t n, int32_t *node) {
    const int32_t first = g->n_lits;
    for (int32_t i = 0; i < n; i++) {
        int32_t id;
        mr_status st = add_lit(g, s[i], strlen(s[i]), &id);
        if (st) return st;
    }
    return lits_close(g, first, n, node);
}
mr_status mr__grammar_lit(mr_grammar *g, const char *s, size_t n, int32_t *id) { return add_lit(g, s, n, id); }
mr_status mr__grammar_props(mr_grammar *g, const mr__gprop *p, int32_t n, int32_t *first) {
    mr_status st = grow((void **)&g->props, &g->cap_props, g->n_props + n, sizeof(mr__gprop), 1 << 20, "properties");
    if (st) return st;
    *first = g->n_props;
    memcpy(g->props + g->n_props, p, (size_t)n * sizeof *p);
    g->n_props += n;
    return MR_OK;
}
mr_status mr__grammar_node(mr_grammar *g, mr__gkind k, int32_t *id) { return new_node(g, k, id); }
mr_status mr__grammar_finish(mr_grammar *g, mr_status st, const char *what, mr_grammar **out) {
    return finish(g, st, what, out);
}
mr_status mr__grammar_schema(mr_grammar *g, const json_t *doc, const json_t *schema, const char *path, int32_t *node) {
    cctx *c = mr_calloc(1, sizeof *c);
    if (!c) return MR_ENOMEM;
    c->g = g;
    c->doc = doc ? doc : schema;
    mr_status st = compile(c, schema, path, node);
    mr_free(c);
    return st;
}

mr_status mr_grammar_json_schema(const json_t *schema, mr_grammar **out) {
    *out = NULL;
    mr_grammar *g;
    mr_status st = grammar_alloc(&g);
    if (st) return st;
    if (!schema) return finish(g, any_object(g, &g->root), "json object", out);
    return finish(g, mr__grammar_schema(g, NULL, schema, "#", &g->root), "json schema", out);
}

mr_status mr_grammar_choice(const char *const *choices, size_t n, mr_grammar **out) {
    *out = NULL;
    if (n == 0 || n > MR_GRAMMAR_MAX_LITERALS) return mr_error_set(MR_EINVAL, "grammar: 1 to %d choices", MR_GRAMMAR_MAX_LITERALS);
    mr_grammar *g;
    mr_status st = grammar_alloc(&g);
    if (st) return st;
    g->raw = true;
    for (size_t i = 0; i < n && !st; i++) {
        size_t len = strlen(choices[i]);
        int32_t id;
        st = len ? add_lit(g, choices[i], len, &id) : mr_error_set(MR_EINVAL, "grammar: choice %zu is empty", i);
    }
    int32_t k = st ? 0 : sort_lits(g, 0, (int32_t)n);
    if (!st && k < 0) st = MR_ENOMEM;
    if (!st) st = new_node(g, G_LITERALS, &g->root);
    if (!st) {
        g->nodes[g->root].a = 0;
        g->nodes[g->root].b = k;
    }
    return finish(g, st, "choice", out);
}

mr_status mr_grammar_regex(const char *re, mr_grammar **out) {
    *out = NULL;
    const size_t n = strlen(re);
    if (n > 4096) return mr_error_set(MR_EINVAL, "a regex of %zu bytes; at most 4096", n);
    /* the whole output matches: the pattern between anchors (its own '^' and final '$', if any, are those) */
    size_t a = re[0] == '^', b = n, bs = 0;
    while (b > a + bs + 1 && re[b - 2 - bs] == '\\') bs++;
    if (b > a && re[b - 1] == '$' && bs % 2 == 0) b--;
    char *p = mr_malloc(b - a + 8);
    if (!p) return MR_ENOMEM;
    snprintf(p, b - a + 8, "^(?:%.*s)$", (int)(b - a), re + a);
    mr_grammar *g;
    mr_status st = grammar_alloc(&g);
    if (st) {
        mr_free(p);
        return st;
    }
    g->raw = true;
    st = new_node(g, G_REGEX, &g->root);
    /* the pattern alone first: wrapped, an unbalanced ')' of its own would pair with the wrapper's */
    int32_t alone;
    char body[4100];
    snprintf(body, sizeof body, "%.*s", (int)(b - a), re + a);
    if (!st) st = add_pattern(g, body, NULL, &alone);
    if (!st) {
        mr__pat_free(&g->res[--g->n_res]); /* replaced by the anchored one */
        st = add_pattern(g, p, NULL, &g->nodes[g->root].re);
    }
    mr_free(p);
    return finish(g, st, "regex", out);
}

mr_status mr_grammar_ebnf(const char *text, mr_grammar **out) {
    *out = NULL;
    mr_grammar *g;
    mr_status st = grammar_alloc(&g);
    if (st) return st;
    g->raw = true;
    st = mr__cfg_compile(text, &g->cfg);
    if (!st) st = new_node(g, G_CFG, &g->root);
    st = finish(g, st, "ebnf", out);
    if (!st)
        snprintf((*out)->desc, sizeof (*out)->desc, "ebnf: %d rules, %d elements", (int)mr__cfg_rules((*out)->cfg),
                 (int)mr__cfg_elements((*out)->cfg));
    return st;
}

static const json_t *tool_fn(const json_t *tool) {
    const json_t *f = json_object_get(tool, "function");
    return f ? f : tool;
}

mr_status mr_grammar_tool_calls(const json_t *tools, const char *name, int max_calls, mr_grammar **out) {
    *out = NULL;
    size_t nt = json_is_array(tools) ? json_array_size(tools) : 0;
    if (!nt) return mr_error_set(MR_EINVAL, "grammar: tool calls need at least one tool");
    mr_grammar *g;
    mr_status st = grammar_alloc(&g);
    if (st) return st;
    cctx *c = mr_calloc(1, sizeof *c);
    if (!c) {
        mr_grammar_free(g);
        return MR_ENOMEM;
    }
    c->g = g;
    char path[64];
    if (name) { /* the named tool's parameters */
        size_t i = 0;
        for (; i < nt; i++) {
            const char *nm = json_string_value(json_object_get(tool_fn(json_array_get(tools, i)), "name"));
            if (nm && !strcmp(nm, name)) break;
        }
        if (i == nt) st = mr_error_set(MR_EINVAL, "grammar: no tool is named \"%.80s\"", name);
        const json_t *p = i < nt ? json_object_get(tool_fn(json_array_get(tools, i)), "parameters") : NULL;
        snprintf(path, sizeof path, "tools/%zu/parameters", i);
        c->doc = p;
        if (!st && p) st = compile(c, p, path, &g->root);
        else if (!st) st = any_object(g, &g->root);
        mr_free(c);
        return finish(g, st, "tool call", out);
    }
    /* [ {"name": one of the names, "parameters": that tool's}, ... ] */
    json_t *names = json_array();
    if (!names) st = MR_ENOMEM;
    for (size_t i = 0; i < nt && !st; i++) {
        const json_t *nm = json_object_get(tool_fn(json_array_get(tools, i)), "name");
        if (!json_is_string(nm)) st = mr_error_set(MR_EINVAL, "grammar: tools/%zu has no name", i);
        else json_array_append(names, (json_t *)nm);
    }
    int32_t name_node = -1, obj = -1, arr = -1, nprop0 = -1;
    if (!st) st = lits_node(g, names, false, "tools", &name_node);
    if (!st && g->nodes[name_node].b != (int32_t)nt) st = mr_error_set(MR_EINVAL, "grammar: two tools share a name");
    if (!st) st = grow((void **)&g->sels, &g->cap_sels, (int32_t)nt, sizeof(int32_t), 1 << 20, "tools");
    for (int32_t k = 0; k < (int32_t)nt && !st; k++) { /* sels in the names' sorted order */
        size_t len;
        const char *lit = mr__glit(g, g->nodes[name_node].a + k, &len);
        size_t i = 0;
        for (; i < nt; i++) {
            char *s = json_dumps(json_array_get(names, i), JSON_ENCODE_ANY | JSON_COMPACT);
            bool same = s && strlen(s) == len && !memcmp(s, lit, len);
            free(s);
            if (same) break;
        }
        const json_t *p = json_object_get(tool_fn(json_array_get(tools, i)), "parameters");
        snprintf(path, sizeof path, "tools/%zu/parameters", i);
        c->doc = p;
        st = p ? compile(c, p, path, &g->sels[k]) : any_object(g, &g->sels[k]);
        c->n_refs = 0; /* each tool's $refs are its own */
    }
    if (!st) g->n_sels = (int32_t)nt;
    json_decref(names);
    json_t *obj_schema = NULL;
    if (!st) {
        obj_schema = json_pack("{s:{s:{},s:{}},s:[ss]}", "properties", "name", "parameters", "required", "name",
                               "parameters");
        if (!obj_schema) st = MR_ENOMEM;
    }
    if (!st) st = compile_object(c, obj_schema, "tool_calls", &obj);
    json_decref(obj_schema);
    if (!st) {
        g->props[g->nodes[obj].a].value = name_node;
        nprop0 = g->nodes[obj].a;
        g->props[nprop0 + 1].value = -1; /* chosen by the name */
        g->nodes[obj].sel_from = 0;
        g->nodes[obj].sel_prop = 1;
        g->nodes[obj].sel_first = 0;
        st = new_node(g, G_ARRAY, &arr);
    }
    if (!st) {
        g->nodes[arr].a = obj;
        g->nodes[arr].lo = 1;
        g->nodes[arr].hi = max_calls > 0 ? max_calls : -1;
        g->root = arr;
    }
    mr_free(c);
    return finish(g, st, "tool calls", out);
}

void mr_grammar_free(mr_grammar *g) {
    if (!g) return;
    mr_free(g->nodes);
    mr_free(g->props);
    mr_free(g->alts);
    mr_free(g->sels);
    for (int32_t i = 0; i < g->n_res; i++) mr__pat_free(&g->res[i]);
    mr_free(g->res);
    mr_free(g->lits);
    mr_free(g->pool);
    mr__cfg_free(g->cfg);
    mr_free(g->tags);
    mr_free(g->trigs);
    mr_free(g->ac_next);
    mr_free(g->ac_fire);
    mr_free(g->xtools);
    mr_free(g);
}

const char *mr_grammar_describe(const mr_grammar *g) { return g->desc; }
