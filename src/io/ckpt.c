/* ckpt.c — checkpoints: a single safetensors file, or the shards named by a
 * model.safetensors.index.json, seen as one name-sorted table of tensors.
 *
 *     model.safetensors.index.json
 *       {"metadata": {"total_size": ...},                 informational, ignored
 *        "weight_map": {"<tensor>": "<file>", ...}}       file relative to the index's folder
 *
 * Only the files the index names are opened, each once, and each tensor is
 * bound to the file the index gives it, even when another shard also holds a
 * tensor of that name. */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io_internal.h"

struct mr_ckpt {
    char *path; /* index or file */
    bool sharded;
    size_t n_files;
    mr_st_file **files;
    size_t n;
    const mr_st_tensor **t; /* [n], sorted by name */
};

void mr_ckpt_close(mr_ckpt *c) {
    if (c == NULL) return;
    for (size_t i = 0; i < c->n_files; i++) mr_st_close(c->files[i]);
    mr_free(c->files);
    mr_free((void *)c->t);
    mr_free(c->path);
    mr_free(c);
}

bool mr_ckpt_is_sharded(const mr_ckpt *c) { return c->sharded; }
const char *mr_ckpt_path(const mr_ckpt *c) { return c->path; }
size_t mr_ckpt_file_count(const mr_ckpt *c) { return c->n_files; }
const mr_st_file *mr_ckpt_file_at(const mr_ckpt *c, size_t i) { return i < c->n_files ? c->files[i] : NULL; }
size_t mr_ckpt_count(const mr_ckpt *c) { return c->n; }
const mr_st_tensor *mr_ckpt_tensor_at(const mr_ckpt *c, size_t i) { return i < c->n ? c->t[i] : NULL; }

const mr_st_tensor *mr_ckpt_find(const mr_ckpt *c, const char *name) {
    size_t lo = 0, hi = c->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int r = strcmp(name, c->t[mid]->name);
        if (r == 0) return c->t[mid];
        if (r < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

size_t mr_ckpt_release(const mr_ckpt *c, const void *p, size_t n) {
    for (size_t i = 0; c && i < c->n_files; i++) {
        size_t r = mr_st_release(c->files[i], p, n);
        if (r) return r;
    }
    return 0;
}

static int cmp_tp(const void *a, const void *b) {
    return strcmp((*(const mr_st_tensor *const *)a)->name, (*(const mr_st_tensor *const *)b)->name);
}

static int cmp_file(const void *a, const void *b) {
    return strcmp(mr_st_file_name(*(mr_st_file *const *)a), mr_st_file_name(*(mr_st_file *const *)b));
}

static char *join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name), n;
    if (!mr_size_add(a, b, &n) || !mr_size_add(n, 2, &n)) return NULL;
    char *p = mr_malloc(n);
    if (p == NULL) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* A shard name must stay inside the index's folder: relative, no ".." component. */
static bool shard_name_ok(const char *s) {
    if (*s == 0 || *s == '/') return false;
    for (const char *p = s; *p;) {
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.') return false;
        p += n + (e ? 1 : 0);
    }
    return true;
}

static mr_status open_single(const char *path, mr_ckpt *c) {
    c->files = mr_calloc(1, sizeof *c->files);
    if (c->files == NULL) return MR_ENOMEM;
    mr_status s = mr_st_open(path, &c->files[0]);
    if (s) return s;
    c->n_files = 1;
    const mr_st_file *f = c->files[0];
    c->n = mr_st_count(f);
    c->t = mr_calloc(c->n ? c->n : 1, sizeof *c->t);
    if (c->t == NULL) return MR_ENOMEM;
    for (size_t i = 0; i < c->n; i++) c->t[i] = mr_st_tensor_at(f, i); /* already name-sorted */
    return MR_OK;
}

static mr_status load_index_json(const char *path, json_t **out) {
    *out = NULL;
    json_error_t err;
    bool oom;
    json_t *root = mr__json_load_file(path, JSON_REJECT_DUPLICATES, &err, &oom);
    if (root == NULL) {
        if (oom) return MR_ENOMEM;
        if (json_error_code(&err) == json_error_cannot_open_file)
            return mr_error_set(MR_EIO, "%.300s: cannot read the index: %s", path, err.text);
        return mr_error_set(MR_EFORMAT, "%.300s: invalid index: %s (line %d, column %d)", path, err.text, err.line,
                            err.column);
    }
    if (!json_is_object(root)) {
        json_decref(root);
        return mr_error_set(MR_EFORMAT, "%.300s: invalid index: not a JSON object", path);
    }
    *out = root;
    return MR_OK;
}

static mr_status open_index(const char *path, mr_ckpt *c) {
    json_t *root = NULL;
    char *dir = NULL, *full = NULL;
    const char **fnames = NULL;
    mr_status s = load_index_json(path, &root);
    if (s) return s;
    const json_t *meta = json_object_get(root, "metadata");
    if (meta && !json_is_object(meta) && !json_is_null(meta)) {
        s = mr_error_set(MR_EFORMAT, "%.300s: invalid index: \"metadata\" must be an object", path);
        goto out;
    }
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm)) {
        s = mr_error_set(MR_EFORMAT, "%.300s: invalid index: \"weight_map\" %s", path,
                         wm ? "must be an object of tensor name -> file name" : "is missing");
        goto out;
    }
    size_t n = json_object_size(wm);
    fnames = mr_calloc(n ? n : 1, sizeof *fnames);
    c->t = mr_calloc(n ? n : 1, sizeof *c->t);
    c->files = mr_calloc(n ? n : 1, sizeof *c->files);
    const char *slash = strrchr(path, '/');
    dir = slash ? mr_malloc((size_t)(slash - path) + 2) : mr_strdup(".");
    if (!fnames || !c->t || !c->files || !dir) goto oom;
    if (slash) {
        size_t dl = slash == path ? 1 : (size_t)(slash - path);
        memcpy(dir, path, dl);
        dir[dl] = 0;
    }

    /* validate the names and collect the distinct files, in first-use order */
    size_t nf = 0;
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        if (!json_is_string(val)) {
            s = mr_error_set(MR_EFORMAT, "%.300s: invalid index: weight_map entry '%.200s' must be a file name (string)",
                             path, key);
            goto out;
        }
        const char *fn = json_string_value(val);
        if (!shard_name_ok(fn)) {
            s = mr_error_set(MR_EFORMAT,
                             "%.300s: invalid index: tensor '%.200s' names the file '%.200s', which is not a relative "
                             "path inside the index's folder",
                             path, key, fn);
            goto out;
        }
        size_t k = 0;
        while (k < nf && strcmp(fnames[k], fn) != 0) k++;
        if (k == nf) fnames[nf++] = fn;
    }

    /* open each file once */
    for (size_t k = 0; k < nf; k++) {
        full = join(dir, fnames[k]);
        if (full == NULL) goto oom;
        s = mr__st_open_named(full, fnames[k], &c->files[k]);
        if (s) goto out;
        c->n_files = k + 1;
        mr_free(full);
        full = NULL;
    }

    /* bind each tensor to the file the index gives it */
    size_t ti = 0;
    json_object_foreach(wm, key, val) {
        const char *fn = json_string_value(val);
        size_t k = 0;
        while (strcmp(fnames[k], fn) != 0) k++;
        const mr_st_tensor *t = mr_st_find(c->files[k], key);
        if (t == NULL) {
            s = mr_error_set(MR_EFORMAT, "%.300s: tensor '%.200s': the index maps it to '%.200s', which has no such tensor",
                             path, key, fn);
            goto out;
        }
        c->t[ti++] = t;
    }
    c->n = ti;
    qsort((void *)c->t, c->n, sizeof *c->t, cmp_tp);
    qsort(c->files, c->n_files, sizeof *c->files, cmp_file);
    c->sharded = true;
    goto out;
oom:
    s = mr_error_set(MR_ENOMEM, NULL);
out:
    mr_free(full);
    mr_free(dir);
    mr_free((void *)fnames);
    json_decref(root);
    return s;
}

static bool is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

mr_status mr_ckpt_open(const char *path, mr_ckpt **out) {
    MR_ASSERT(path != NULL && out != NULL);
    *out = NULL;
    mr_status s = MR_OK;
    char *target = NULL;
    struct stat st;
    if (stat(path, &st) != 0) {
        int e = errno;
        return mr_error_set(e == ENOENT ? MR_ENOTFOUND : MR_EIO, "%.300s: %s", path, strerror(e));
    }
    bool index;
    if (S_ISDIR(st.st_mode)) {
        target = join(path, "model.safetensors.index.json");
        if (target == NULL) return MR_ENOMEM;
        index = is_file(target);
        if (!index) {
            mr_free(target);
            target = join(path, "model.safetensors");
            if (target == NULL) return MR_ENOMEM;
            if (!is_file(target)) {
                mr_free(target);
                return mr_error_set(MR_ENOTFOUND,
                                    "%.300s: the folder holds neither model.safetensors.index.json nor model.safetensors",
                                    path);
            }
        }
    } else {
        target = mr_strdup(path);
        if (target == NULL) return MR_ENOMEM;
        index = ends_with(path, ".json");
    }
    mr_ckpt *c = mr_calloc(1, sizeof *c);
    if (c == NULL) {
        mr_free(target);
        return MR_ENOMEM;
    }
    c->path = target;
    s = index ? open_index(target, c) : open_single(target, c);
    if (s) {
        mr_ckpt_close(c);
        return s;
    }
    *out = c;
    return MR_OK;
}
