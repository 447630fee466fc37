/* st_read.c — the safetensors reader: maps a file read-only and validates its
 * header with the rules of shared/spec/safetensors.md, in order.
 *
 *     [0, 8)      N (u64 LE)              rule 1: file >= 8 bytes
 *                                         rule 2: N <= 100,000,000
 *                                         rule 3: 8 + N <= file size
 *     [8, 8+N)    JSON object             rule 4: UTF-8, JSON, types (first bad key named)
 *     [8+N, end)  tensor data             rule 5: sorted by begin: 0, contiguous, end >= begin
 *                                         rule 6: product(shape) * bits, whole bytes, == end - begin
 *                                         rule 7: last end + 8 + N == file size
 *                                         rule 8: no duplicate names
 *
 * Duplicate keys are refused by the JSON parser itself (jansson with
 * JSON_REJECT_DUPLICATES), so rule 8 is reported when the header is parsed;
 * the reference Rust reader silently keeps the last duplicate instead.
 * Integers are parsed as 64-bit integers; values above 2^63-1 (which the
 * Rust reader would take as usize) are refused with MR_EUNSUPPORTED.
 *
 * Opening never reads tensor data: only the header bytes are touched. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io_internal.h"

#define MR_ST_MAX_HEADER 100000000ull

struct mr_st_file {
    char *path;                 /* arena */
    char *display;              /* arena */
    const unsigned char *buf;   /* whole file image */
    uint64_t len;
    void *map;                  /* owned mapping, or NULL for mr_st_parse */
    size_t map_len;
    uint64_t header_len;        /* N */
    size_t n;
    mr_st_tensor *t;            /* [n], sorted by name */
    int64_t *shapes;            /* all shapes, concatenated */
    size_t n_meta;
    const char **meta;          /* [2 * n_meta]: key, value; sorted by key */
    char *arena;                /* names, metadata strings, path, display */
};

/* ---- error messages: "<file>: [tensor '<name>': ]<rule>: <detail>" ---- */
static mr_status fail(mr_status s, const char *file, const char *tensor, const char *rule, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;
static mr_status fail(mr_status s, const char *file, const char *tensor, const char *rule, const char *fmt, ...) {
    char detail[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    if (tensor)
        return mr_error_set(s, "%.300s: tensor '%.200s': %s: %s", file, tensor, rule, detail);
    return mr_error_set(s, "%.300s: %s: %s", file, rule, detail);
}

static const char *json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

#define RULE_JSON "invalid header"

/* Checks that v is an array of non-negative integers (of exactly `want`
 * elements if want >= 0). */
static mr_status check_uint_array(const json_t *v, const char *file, const char *tensor, const char *field, long want) {
    if (v == NULL) return fail(MR_EFORMAT, file, tensor, RULE_JSON, "missing \"%s\"", field);
    if (!json_is_array(v))
        return fail(MR_EFORMAT, file, tensor, RULE_JSON, "\"%s\" must be an array of non-negative integers, not %s",
                    field, json_type_name(v));
    size_t n = json_array_size(v);
    if (want >= 0 && n != (size_t)want)
        return fail(MR_EFORMAT, file, tensor, RULE_JSON, "\"%s\" must have %ld elements, not %zu", field, want, n);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_integer(e))
            return fail(MR_EFORMAT, file, tensor, RULE_JSON, "\"%s\"[%zu] must be a non-negative integer, not %s", field,
                        i, json_type_name(e));
        if (json_integer_value(e) < 0)
            return fail(MR_EFORMAT, file, tensor, RULE_JSON, "\"%s\"[%zu] is negative (%lld)", field, i,
                        (long long)json_integer_value(e));
    }
    return MR_OK;
}

/* Rule 4 for one tensor entry; on success *dt is its dtype. */
static mr_status check_entry(const char *file, const char *name, const json_t *v, mr_st_dtype *dt) {
    if (!json_is_object(v))
        return fail(MR_EFORMAT, file, name, RULE_JSON, "entry must be an object with dtype, shape and data_offsets, not %s",
                    json_type_name(v));
    const json_t *d = json_object_get(v, "dtype");
    if (d == NULL) return fail(MR_EFORMAT, file, name, RULE_JSON, "missing \"dtype\"");
    if (!json_is_string(d))
        return fail(MR_EFORMAT, file, name, RULE_JSON, "\"dtype\" must be a string, not %s", json_type_name(d));
    const char *ds = json_string_value(d);
    if (mr_st_dtype_from_name(ds, dt) != MR_OK)
        return fail(MR_EFORMAT, file, name, "unknown dtype", "'%.40s' is not a safetensors dtype", ds);
    if (*dt == MR_ST_F8_E4M3FNUZ || *dt == MR_ST_F8_E5M2FNUZ)
        return fail(MR_EUNSUPPORTED, file, name, "unsupported dtype",
                    "%s is AMD's FNUZ format (different exponent bias and NaN than %s) and is refused", ds,
                    *dt == MR_ST_F8_E4M3FNUZ ? "F8_E4M3" : "F8_E5M2");
    mr_status s = check_uint_array(json_object_get(v, "shape"), file, name, "shape", -1);
    if (s) return s;
    return check_uint_array(json_object_get(v, "data_offsets"), file, name, "data_offsets", 2);
}

/* Parses the header JSON (rule 4, and rule 8 through JSON_REJECT_DUPLICATES). */
static mr_status load_header(const char *file, const unsigned char *h, size_t n, json_t **out) {
    size_t bad = 0;
    *out = NULL;
    if (!mr__utf8_valid(h, n, &bad))
        return fail(MR_EFORMAT, file, NULL, RULE_JSON, "header is not valid UTF-8 (byte %zu of the header)", bad);
    json_error_t err;
    bool oom;
    json_t *root = mr__json_loadb((const char *)h, n, JSON_REJECT_DUPLICATES, &err, &oom);
    if (root == NULL) {
        if (oom) return MR_ENOMEM;
        switch (json_error_code(&err)) {
        case json_error_out_of_memory: return mr_error_set(MR_ENOMEM, NULL);
        case json_error_duplicate_key:
            return fail(MR_EFORMAT, file, NULL, "duplicate tensor name", "%s (byte %d of the header)", err.text,
                        err.position);
        case json_error_numeric_overflow:
            return fail(MR_EUNSUPPORTED, file, NULL, RULE_JSON,
                        "%s (byte %d of the header): integers above 2^63-1 are not supported", err.text, err.position);
        default:
            return fail(MR_EFORMAT, file, NULL, RULE_JSON, "header is not valid JSON: %s (byte %d of the header)", err.text,
                        err.position);
        }
    }
    if (!json_is_object(root)) {
        mr_status s = fail(MR_EFORMAT, file, NULL, RULE_JSON, "header must be a JSON object, not %s", json_type_name(root));
        json_decref(root);
        return s;
    }
    *out = root;
    return MR_OK;
}

typedef struct {
    uint64_t begin, end;
    mr_st_tensor *t;
} span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->t->name, y->t->name);
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const mr_st_tensor *)a)->name, ((const mr_st_tensor *)b)->name);
}

static int cmp_meta(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static char *arena_put(char **cur, const char *s) {
    size_t n = strlen(s) + 1;
    char *p = *cur;
    memcpy(p, s, n);
    *cur += n;
    return p;
}

static const char *last_component(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static void shape_str(const mr_st_tensor *t, char *buf, size_t n) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < t->ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

static mr_status parse_impl(const unsigned char *buf, size_t len, const char *path, const char *display,
                            mr_st_file **out) {
    mr_st_file *f = NULL;
    json_t *root = NULL;
    span *spans = NULL;
    mr_status s = MR_OK;
    *out = NULL;
    if (path == NULL) path = "<memory>";
    if (display == NULL) display = last_component(path);

    /* rules 1-3: the length prefix */
    if (len < 8)
        return fail(MR_EFORMAT, path, NULL, "header too small", "the file is %zu bytes; the 8-byte header length is missing",
                    len);
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--) hn = (hn << 8) | buf[i];
    if (hn > MR_ST_MAX_HEADER)
        return fail(MR_EFORMAT, path, NULL, "header too large", "the header claims %llu bytes; the limit is %llu",
                    (unsigned long long)hn, MR_ST_MAX_HEADER);
    uint64_t stop;
    if (!mr_u64_add(hn, 8, &stop) || stop > (uint64_t)len)
        return fail(MR_EFORMAT, path, NULL, "invalid header length",
                    "the header claims %llu bytes but only %llu follow the length prefix", (unsigned long long)hn,
                    (unsigned long long)(len - 8));

    /* rule 4: UTF-8, JSON, types; count what to allocate */
    s = load_header(path, buf + 8, (size_t)hn, &root);
    if (s) return s;
    size_t n_t = 0, n_dims = 0, n_meta = 0, strbytes = strlen(path) + strlen(display) + 2;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (json_is_null(val)) continue;
            if (!json_is_object(val)) {
                s = fail(MR_EFORMAT, path, NULL, RULE_JSON, "\"__metadata__\" must be an object of strings, not %s",
                         json_type_name(val));
                goto out;
            }
            const char *mk;
            json_t *mv;
            json_object_foreach(val, mk, mv) {
                if (!json_is_string(mv)) {
                    s = fail(MR_EFORMAT, path, NULL, RULE_JSON, "\"__metadata__\" value of '%.100s' must be a string, not %s",
                             mk, json_type_name(mv));
                    goto out;
                }
                n_meta++;
                strbytes += strlen(mk) + json_string_length(mv) + 2;
            }
            continue;
        }
        mr_st_dtype dt;
        s = check_entry(path, key, val, &dt);
        if (s) goto out;
        n_t++;
        n_dims += json_array_size(json_object_get(val, "shape"));
        strbytes += strlen(key) + 1;
    }

    f = mr_calloc(1, sizeof *f);
    if (f == NULL) goto oom;
    f->arena = mr_malloc(strbytes);
    f->t = mr_calloc(n_t ? n_t : 1, sizeof *f->t);
    f->shapes = mr_calloc(n_dims ? n_dims : 1, sizeof *f->shapes);
    f->meta = mr_calloc(n_meta ? 2 * n_meta : 1, sizeof *f->meta);
    spans = mr_calloc(n_t ? n_t : 1, sizeof *spans);
    if (!f->arena || !f->t || !f->shapes || !f->meta || !spans) goto oom;
    f->buf = buf;
    f->len = len;
    f->header_len = hn;
    char *cur = f->arena;
    f->path = arena_put(&cur, path);
    f->display = arena_put(&cur, display);

    /* fill the tables, in header order */
    size_t ti = 0, di = 0, mi = 0;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (json_is_null(val)) continue;
            const char *mk;
            json_t *mv;
            json_object_foreach(val, mk, mv) {
                f->meta[2 * mi] = arena_put(&cur, mk);
                f->meta[2 * mi + 1] = arena_put(&cur, json_string_value(mv));
                mi++;
            }
            continue;
        }
        mr_st_tensor *t = &f->t[ti];
        const json_t *shape = json_object_get(val, "shape");
        const json_t *offs = json_object_get(val, "data_offsets");
        t->name = arena_put(&cur, key);
        mr_st_dtype_from_name(json_string_value(json_object_get(val, "dtype")), &t->dtype);
        t->ndim = (int)json_array_size(shape);
        t->shape = f->shapes + di;
        for (int k = 0; k < t->ndim; k++) f->shapes[di++] = (int64_t)json_integer_value(json_array_get(shape, (size_t)k));
        t->file = f;
        spans[ti].begin = (uint64_t)json_integer_value(json_array_get(offs, 0));
        spans[ti].end = (uint64_t)json_integer_value(json_array_get(offs, 1));
        spans[ti].t = t;
        ti++;
    }
    f->n = n_t;
    f->n_meta = n_meta;
    json_decref(root);
    root = NULL;

    /* rule 5: sorted by begin, the spans tile [0, last end) */
    qsort(spans, n_t, sizeof *spans, cmp_span);
    uint64_t expect = 0;
    for (size_t i = 0; i < n_t; i++) {
        const span *sp = &spans[i];
        if (sp->begin != expect) {
            if (i == 0)
                s = fail(MR_EFORMAT, path, sp->t->name, "invalid offsets",
                         "data_offsets [%llu, %llu]: the first tensor must begin at 0", (unsigned long long)sp->begin,
                         (unsigned long long)sp->end);
            else
                s = fail(MR_EFORMAT, path, sp->t->name, "invalid offsets",
                         "data_offsets [%llu, %llu] %s the previous tensor '%.200s', which ends at %llu",
                         (unsigned long long)sp->begin, (unsigned long long)sp->end,
                         sp->begin > expect ? "leave a gap after" : "overlap", spans[i - 1].t->name,
                         (unsigned long long)expect);
            goto out;
        }
        if (sp->end < sp->begin) {
            s = fail(MR_EFORMAT, path, sp->t->name, "invalid offsets", "data_offsets [%llu, %llu]: end < begin",
                     (unsigned long long)sp->begin, (unsigned long long)sp->end);
            goto out;
        }
        expect = sp->end;
    }

    /* rule 6: element count x bit width, whole bytes, equal to the span */
    for (size_t i = 0; i < n_t; i++) {
        mr_st_tensor *t = spans[i].t;
        char shp[128];
        uint64_t ne = 1, bits;
        for (int k = 0; k < t->ndim; k++) {
            if (!mr_u64_mul(ne, (uint64_t)t->shape[k], &ne)) {
                shape_str(t, shp, sizeof shp);
                s = fail(MR_EFORMAT, path, t->name, "size overflow", "the element count of shape %s overflows 64 bits", shp);
                goto out;
            }
        }
        int w = mr_st_dtype_bits(t->dtype);
        if (!mr_u64_mul(ne, (uint64_t)w, &bits)) {
            s = fail(MR_EFORMAT, path, t->name, "size overflow", "%llu elements of %s: the size in bits overflows 64 bits",
                     (unsigned long long)ne, mr_st_dtype_name(t->dtype));
            goto out;
        }
        if (bits % 8 != 0) {
            s = fail(MR_EFORMAT, path, t->name, "not a whole number of bytes", "%llu elements of %s (%d bits) make %llu bits",
                     (unsigned long long)ne, mr_st_dtype_name(t->dtype), w, (unsigned long long)bits);
            goto out;
        }
        uint64_t span_bytes = spans[i].end - spans[i].begin;
        if (bits / 8 != span_bytes) {
            shape_str(t, shp, sizeof shp);
            s = fail(MR_EFORMAT, path, t->name, "size mismatch",
                     "shape %s of %s needs %llu bytes but data_offsets [%llu, %llu] hold %llu", shp,
                     mr_st_dtype_name(t->dtype), (unsigned long long)(bits / 8), (unsigned long long)spans[i].begin,
                     (unsigned long long)spans[i].end, (unsigned long long)span_bytes);
            goto out;
        }
        t->n_elements = ne;
        t->n_bytes = span_bytes;
    }

    /* rule 7: the data buffer is exactly covered */
    uint64_t avail = (uint64_t)len - stop;
    if (expect != avail) {
        if (expect > avail)
            s = fail(MR_EFORMAT, path, NULL, "file size mismatch",
                     "the tensors need %llu data bytes but only %llu follow the header (truncated file?)",
                     (unsigned long long)expect, (unsigned long long)avail);
        else
            s = fail(MR_EFORMAT, path, NULL, "file size mismatch", "%llu trailing bytes follow the last tensor",
                     (unsigned long long)(avail - expect));
        goto out;
    }
    for (size_t i = 0; i < n_t; i++) {
        spans[i].t->offset = stop + spans[i].begin;
        spans[i].t->data = buf + stop + spans[i].begin;
    }

    /* name order for lookups; rule 8 again (the parser already refused duplicates) */
    qsort(f->t, n_t, sizeof *f->t, cmp_tensor_name);
    for (size_t i = 1; i < n_t; i++) {
        if (strcmp(f->t[i - 1].name, f->t[i].name) == 0) {
            s = fail(MR_EFORMAT, path, f->t[i].name, "duplicate tensor name", "the name appears twice");
            goto out;
        }
    }
    qsort(f->meta, n_meta, 2 * sizeof *f->meta, cmp_meta);
    *out = f;
    f = NULL;
    goto out;
oom:
    s = mr_error_set(MR_ENOMEM, NULL);
out:
    if (root) json_decref(root);
    mr_free(spans);
    mr_st_close(f);
    return s;
}

mr_status mr_st_parse(const void *buf, size_t len, const char *name, mr_st_file **out) {
    MR_ASSERT(out != NULL);
    MR_ASSERT(buf != NULL || len == 0);
    static const unsigned char empty[1] = {0};
    return parse_impl(buf ? buf : empty, len, name, NULL, out);
}

mr_status mr__st_open_named(const char *path, const char *display, mr_st_file **out) {
    MR_ASSERT(path != NULL && out != NULL);
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return mr_error_set(e == ENOENT ? MR_ENOTFOUND : MR_EIO, "%.300s: cannot open: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return mr_error_set(MR_EIO, "%.300s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return mr_error_set(MR_EIO, "%.300s: not a regular file", path);
    }
    size_t size = (size_t)st.st_size;
    void *map = NULL;
    if (size > 0) {
        /* PROT_READ + MAP_PRIVATE: pages are faulted in only when read, and
         * parsing reads the header pages alone */
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return mr_error_set(MR_EIO, "%.300s: cannot map %zu bytes: %s", path, size, strerror(e));
        }
    }
    close(fd);
    static const unsigned char empty[1] = {0};
    mr_st_file *f;
    mr_status s = parse_impl(map ? map : empty, size, path, display, &f);
    if (s) {
        if (map) munmap(map, size);
        return s;
    }
    f->map = map;
    f->map_len = size;
    *out = f;
    return MR_OK;
}

mr_status mr_st_open(const char *path, mr_st_file **out) { return mr__st_open_named(path, NULL, out); }

void mr_st_close(mr_st_file *f) {
    if (f == NULL) return;
    if (f->map) munmap(f->map, f->map_len);
    mr_free(f->arena);
    mr_free(f->t);
    mr_free(f->shapes);
    mr_free((void *)f->meta);
    mr_free(f);
}

const char *mr_st_file_path(const mr_st_file *f) { return f->path; }
const char *mr_st_file_name(const mr_st_file *f) { return f->display; }
size_t mr_st_release(const mr_st_file *f, const void *p, size_t n) {
    if (!f || !f->map || !p || n == 0) return 0;
    const uintptr_t b = (uintptr_t)f->map, e = b + f->map_len, a0 = (uintptr_t)p;
    if (a0 < b || a0 >= e || n > e - a0) return 0; /* not (wholly) in this mapping */
    long pg = sysconf(_SC_PAGESIZE);
    const uintptr_t page = pg > 0 ? (uintptr_t)pg : 4096;
    const uintptr_t lo = (a0 + page - 1) & ~(page - 1), hi = (a0 + n) & ~(page - 1);
    if (hi <= lo) return 0;
    if (madvise((void *)lo, hi - lo, MADV_DONTNEED) != 0) return 0;
    return hi - lo;
}

uint64_t mr_st_file_size(const mr_st_file *f) { return f->len; }
uint64_t mr_st_header_size(const mr_st_file *f) { return f->header_len; }
size_t mr_st_count(const mr_st_file *f) { return f->n; }

const mr_st_tensor *mr_st_tensor_at(const mr_st_file *f, size_t i) { return i < f->n ? &f->t[i] : NULL; }

const mr_st_tensor *mr_st_find(const mr_st_file *f, const char *name) {
    size_t lo = 0, hi = f->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, f->t[mid].name);
        if (c == 0) return &f->t[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

size_t mr_st_metadata_count(const mr_st_file *f) { return f->n_meta; }

bool mr_st_metadata_at(const mr_st_file *f, size_t i, const char **key, const char **value) {
    if (i >= f->n_meta) return false;
    if (key) *key = f->meta[2 * i];
    if (value) *value = f->meta[2 * i + 1];
    return true;
}

const char *mr_st_metadata(const mr_st_file *f, const char *key) {
    for (size_t i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta[2 * i], key) == 0) return f->meta[2 * i + 1];
    return NULL;
}
