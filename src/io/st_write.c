/* st_write.c — the safetensors writer and atomic file writes.
 *
 * Layout written (the reference writer's, huggingface/safetensors `serialize`):
 *     u64 LE N | {"__metadata__":{...},"<name>":{"dtype":"..","shape":[..],"data_offsets":[b,e]},...}
 *     padded with spaces so that 8 + N is a multiple of 8 | tensor bytes, back to back
 * Tensors are ordered by dtype (mr_st_dtype order, descending), then name
 * (bytewise); data_offsets follow that order. Metadata keys are sorted. The
 * JSON is compact, with strings escaped as serde_json does (", \, \b \f \n
 * \r \t, other control characters as \u00xx; everything else raw UTF-8).
 *
 * Every file goes to "<path>.tmp.XXXXXX" first, is fsync'ed and renamed over
 * path; on any failure the temp file is removed. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io_internal.h"

typedef struct {
    char *name;     /* owned; shape follows in the same block */
    mr_st_dtype dtype;
    int ndim;
    int64_t *shape;
    const void *data;
    uint64_t n_bytes;
} wtensor;

struct mr_st_writer {
    size_t n, cap;
    wtensor *t;
    size_t n_meta, meta_cap;
    char **meta; /* [2 * meta_cap]: key, value (owned) */
};

mr_status mr_st_writer_new(mr_st_writer **out) {
    *out = mr_calloc(1, sizeof **out);
    return *out ? MR_OK : MR_ENOMEM;
}

void mr_st_writer_free(mr_st_writer *w) {
    if (w == NULL) return;
    for (size_t i = 0; i < w->n; i++) mr_free(w->t[i].name);
    for (size_t i = 0; i < 2 * w->n_meta; i++) mr_free(w->meta[i]);
    mr_free(w->t);
    mr_free(w->meta);
    mr_free(w);
}

static bool grow(void **arr, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t nc = *cap ? *cap * 2 : 16, bytes;
    while (nc < need) nc *= 2;
    if (!mr_size_mul(nc, elem, &bytes)) return false;
    void *p = mr_realloc(*arr, bytes);
    if (p == NULL) return false;
    *arr = p;
    *cap = nc;
    return true;
}

static mr_status check_text(const char *what, const char *s) {
    size_t bad;
    if (!mr__utf8_valid((const unsigned char *)s, strlen(s), &bad))
        return mr_error_set(MR_EINVAL, "safetensors writer: %s is not valid UTF-8 (byte %zu)", what, bad);
    return MR_OK;
}

mr_status mr_st_writer_add(mr_st_writer *w, const char *name, mr_st_dtype dtype, const int64_t *shape, int ndim,
                           const void *data) {
    MR_ASSERT(w != NULL && name != NULL);
    if (*name == 0 || strcmp(name, "__metadata__") == 0)
        return mr_error_set(MR_EINVAL, "safetensors writer: invalid tensor name '%s'", name);
    mr_status s = check_text("tensor name", name);
    if (s) return s;
    if (mr_st_dtype_bits(dtype) == 0 || dtype == MR_ST_F8_E4M3FNUZ || dtype == MR_ST_F8_E5M2FNUZ)
        return mr_error_set(MR_EINVAL, "safetensors writer: tensor '%.200s': unsupported dtype %d", name, (int)dtype);
    if (ndim < 0 || (ndim > 0 && shape == NULL))
        return mr_error_set(MR_EINVAL, "safetensors writer: tensor '%.200s': bad rank %d", name, ndim);
    uint64_t ne = 1, bits;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return mr_error_set(MR_EINVAL, "safetensors writer: tensor '%.200s': negative dimension %lld", name,
                                (long long)shape[i]);
        if (!mr_u64_mul(ne, (uint64_t)shape[i], &ne))
            return mr_error_set(MR_EOVERFLOW, "safetensors writer: tensor '%.200s': element count overflows", name);
    }
    if (!mr_u64_mul(ne, (uint64_t)mr_st_dtype_bits(dtype), &bits) || bits / 8 > (uint64_t)INT64_MAX)
        return mr_error_set(MR_EOVERFLOW, "safetensors writer: tensor '%.200s': size overflows", name);
    if (bits % 8 != 0)
        return mr_error_set(MR_EINVAL, "safetensors writer: tensor '%.200s': %llu elements of %s are not whole bytes",
                            name, (unsigned long long)ne, mr_st_dtype_name(dtype));
    if (data == NULL && bits != 0)
        return mr_error_set(MR_EINVAL, "safetensors writer: tensor '%.200s': no data", name);
    if (!grow((void **)&w->t, &w->cap, w->n + 1, sizeof *w->t)) return MR_ENOMEM;
    size_t nl = strlen(name) + 1, pad = (nl + 7) & ~(size_t)7, bytes;
    if (!mr_size_mul((size_t)ndim, sizeof(int64_t), &bytes) || !mr_size_add(bytes, pad, &bytes))
        return mr_error_set(MR_EOVERFLOW, "safetensors writer: tensor '%.200s': rank too large", name);
    char *blk = mr_malloc(bytes);
    if (blk == NULL) return MR_ENOMEM;
    memcpy(blk, name, nl);
    wtensor *t = &w->t[w->n++];
    t->name = blk;
    t->dtype = dtype;
    t->ndim = ndim;
    t->shape = (int64_t *)(void *)(blk + pad);
    if (ndim) memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    t->data = data;
    t->n_bytes = bits / 8;
    return MR_OK;
}

mr_status mr_st_writer_set_metadata(mr_st_writer *w, const char *key, const char *value) {
    MR_ASSERT(w != NULL && key != NULL && value != NULL);
    mr_status s = check_text("metadata key", key);
    if (s == MR_OK) s = check_text("metadata value", value);
    if (s) return s;
    char *v = mr_strdup(value);
    if (v == NULL) return MR_ENOMEM;
    for (size_t i = 0; i < w->n_meta; i++) {
        if (strcmp(w->meta[2 * i], key) == 0) {
            mr_free(w->meta[2 * i + 1]);
            w->meta[2 * i + 1] = v;
            return MR_OK;
        }
    }
    char *k = mr_strdup(key);
    size_t cap = w->meta_cap;
    if (k == NULL || !grow((void **)&w->meta, &cap, w->n_meta + 1, 2 * sizeof *w->meta)) {
        mr_free(k);
        mr_free(v);
        return MR_ENOMEM;
    }
    w->meta_cap = cap;
    w->meta[2 * w->n_meta] = k;
    w->meta[2 * w->n_meta + 1] = v;
    w->n_meta++;
    return MR_OK;
}

/* ---- header JSON ---- */
typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    size_t need;
    if (!mr_size_add(b->n, n, &need) || !grow((void **)&b->p, &b->cap, need + 1, 1)) {
        b->oom = true;
        return;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }
static void sb_u64(sbuf *b, uint64_t v) {
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    sb_put(b, tmp, (size_t)n);
}
static void sb_json_str(sbuf *b, const char *s) {
    static const char hex[] = "0123456789abcdef";
    sb_put(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        char esc[7];
        switch (*c) {
        case '"': sb_put(b, "\\\"", 2); break;
        case '\\': sb_put(b, "\\\\", 2); break;
        case '\b': sb_put(b, "\\b", 2); break;
        case '\f': sb_put(b, "\\f", 2); break;
        case '\n': sb_put(b, "\\n", 2); break;
        case '\r': sb_put(b, "\\r", 2); break;
        case '\t': sb_put(b, "\\t", 2); break;
        default:
            if (*c < 0x20) {
                memcpy(esc, "\\u00", 4);
                esc[4] = hex[*c >> 4];
                esc[5] = hex[*c & 15];
                sb_put(b, esc, 6);
            } else {
                sb_put(b, (const char *)c, 1);
            }
        }
    }
    sb_put(b, "\"", 1);
}

static int cmp_wt(const void *a, const void *b) {
    const wtensor *x = *(const wtensor *const *)a, *y = *(const wtensor *const *)b;
    if (x->dtype != y->dtype) return x->dtype > y->dtype ? -1 : 1;
    return strcmp(x->name, y->name);
}
static int cmp_wt_name(const void *a, const void *b) {
    return strcmp((*(const wtensor *const *)a)->name, (*(const wtensor *const *)b)->name);
}
static int cmp_meta_idx(const void *a, const void *b) {
    return strcmp(**(char *const *const *)a, **(char *const *const *)b);
}

/* Builds the 8-byte prefix + padded header into *hdr (owned by caller) and
 * the write order into *order. */
static mr_status build_header(const mr_st_writer *w, sbuf *b, wtensor ***order_out) {
    mr_status s = MR_OK;
    wtensor **order = mr_calloc(w->n ? w->n : 1, sizeof *order);
    char **meta[64 + 1];
    char ***mo = w->n_meta + 1 <= 64 ? meta : mr_calloc(w->n_meta + 1, sizeof *mo);
    if (order == NULL || mo == NULL) {
        s = MR_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < w->n; i++) order[i] = &w->t[i];
    /* duplicates: sort by name first */
    qsort(order, w->n, sizeof *order, cmp_wt_name);
    for (size_t i = 1; i < w->n; i++) {
        if (strcmp(order[i - 1]->name, order[i]->name) == 0) {
            s = mr_error_set(MR_EINVAL, "safetensors writer: duplicate tensor name '%.200s'", order[i]->name);
            goto out;
        }
    }
    qsort(order, w->n, sizeof *order, cmp_wt);

    /* metadata: user entries plus format=pt unless given, sorted by key */
    static char fmt_k[] = "format", fmt_v[] = "pt";
    static char *fmt_kv[2] = {fmt_k, fmt_v};
    size_t nm = 0;
    bool has_format = false;
    for (size_t i = 0; i < w->n_meta; i++) {
        mo[nm++] = &w->meta[2 * i];
        if (strcmp(w->meta[2 * i], "format") == 0) has_format = true;
    }
    if (!has_format) mo[nm++] = fmt_kv;
    qsort(mo, nm, sizeof *mo, cmp_meta_idx);

    sb_put(b, "\0\0\0\0\0\0\0\0", 8);
    sb_str(b, "{\"__metadata__\":{");
    for (size_t i = 0; i < nm; i++) {
        if (i) sb_str(b, ",");
        sb_json_str(b, mo[i][0]);
        sb_str(b, ":");
        sb_json_str(b, mo[i][1]);
    }
    sb_str(b, "}");
    uint64_t off = 0;
    for (size_t i = 0; i < w->n; i++) {
        const wtensor *t = order[i];
        sb_str(b, ",");
        sb_json_str(b, t->name);
        sb_str(b, ":{\"dtype\":\"");
        sb_str(b, mr_st_dtype_name(t->dtype));
        sb_str(b, "\",\"shape\":[");
        for (int k = 0; k < t->ndim; k++) {
            if (k) sb_str(b, ",");
            sb_u64(b, (uint64_t)t->shape[k]);
        }
        sb_str(b, "],\"data_offsets\":[");
        sb_u64(b, off);
        sb_str(b, ",");
        if (!mr_u64_add(off, t->n_bytes, &off)) {
            s = mr_error_set(MR_EOVERFLOW, "safetensors writer: total size overflows");
            goto out;
        }
        sb_u64(b, off);
        sb_str(b, "]}");
    }
    sb_str(b, "}");
    while (!b->oom && b->n % 8 != 0) sb_put(b, " ", 1);
    if (b->oom) {
        s = mr_error_set(MR_ENOMEM, NULL);
        goto out;
    }
    uint64_t hn = b->n - 8;
    for (int i = 0; i < 8; i++) b->p[i] = (char)(unsigned char)(hn >> (8 * i));
    *order_out = order;
    order = NULL;
out:
    mr_free(order);
    if (mo != meta) mr_free(mo);
    return s;
}

/* ---- atomic write ---- */
typedef struct {
    const void *p;
    uint64_t n;
} chunk;

static bool write_all(int fd, const void *p, uint64_t n) {
    const unsigned char *c = p;
    while (n > 0) {
        size_t step = n > (1u << 30) ? (1u << 30) : (size_t)n;
        ssize_t k = write(fd, c, step);
        if (k < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        c += k;
        n -= (uint64_t)k;
    }
    return true;
}

/* Writes the chunks to "<path>.tmp.XXXXXX", fsyncs and renames it onto path. */
static mr_status write_chunks_atomic(const char *path, const chunk *ch, size_t n_ch) {
    size_t pl = strlen(path), bytes;
    if (!mr_size_add(pl, sizeof ".tmp.XXXXXX", &bytes)) return mr_error_set(MR_EINVAL, "path too long");
    char *tmp = mr_malloc(bytes);
    if (tmp == NULL) return MR_ENOMEM;
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp.XXXXXX", sizeof ".tmp.XXXXXX");
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        mr_status s = mr_error_set(MR_EIO, "%.300s: cannot create a temporary file: %s", path, strerror(e));
        mr_free(tmp);
        return s;
    }
    mr_status s = MR_OK;
    const char *what = "write";
    bool ok = true;
    for (size_t i = 0; ok && i < n_ch; i++) ok = write_all(fd, ch[i].p, ch[i].n);
    if (ok) {
        what = "fchmod";
        ok = fchmod(fd, 0644) == 0;
    }
    if (ok) {
        what = "fsync";
        ok = fsync(fd) == 0;
    }
    int e = errno;
    if (close(fd) != 0 && ok) {
        e = errno;
        what = "close";
        ok = false;
    }
    if (ok) {
        what = "rename";
        ok = rename(tmp, path) == 0;
        e = errno;
    }
    if (!ok) {
        s = mr_error_set(MR_EIO, "%.300s: %s failed: %s", path, what, strerror(e));
        unlink(tmp);
    } else {
        /* make the rename durable: fsync the folder (best effort) */
        const char *slash = strrchr(path, '/');
        if (slash) tmp[slash - path + (slash == path)] = 0;
        int dfd = open(slash ? tmp : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            (void)fsync(dfd);
            close(dfd);
        }
    }
    mr_free(tmp);
    return s;
}

mr_status mr_write_file_atomic(const char *path, const void *data, size_t len) {
    MR_ASSERT(path != NULL && (data != NULL || len == 0));
    chunk c = {data, len};
    return write_chunks_atomic(path, &c, 1);
}

mr_status mr_st_writer_write(mr_st_writer *w, const char *path) {
    MR_ASSERT(w != NULL && path != NULL);
    sbuf b = {0};
    wtensor **order = NULL;
    chunk *ch = NULL;
    mr_status s = build_header(w, &b, &order);
    if (s) goto out;
    ch = mr_calloc(w->n + 1, sizeof *ch);
    if (ch == NULL) {
        s = MR_ENOMEM;
        goto out;
    }
    ch[0].p = b.p;
    ch[0].n = b.n;
    for (size_t i = 0; i < w->n; i++) {
        ch[i + 1].p = order[i]->data;
        ch[i + 1].n = order[i]->n_bytes;
    }
    s = write_chunks_atomic(path, ch, w->n + 1);
out:
    mr_free(ch);
    mr_free(order);
    mr_free(b.p);
    return s;
}
