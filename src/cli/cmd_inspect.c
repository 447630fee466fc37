/* cmd_inspect.c — `moerun inspect PATH [--json]`: lists the tensors of a
 * safetensors file, a checkpoint folder or a sharded index (name, dtype,
 * shape, bytes, file) with totals per dtype and overall. The --json schema is
 * documented in docs/inspect-json.md. Exit: 0 ok, 1 bad or unreadable
 * checkpoint (the validation error is printed), 2 usage. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "moerun/io.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: moerun inspect PATH [--json]\n\n"
            "Lists the tensors of a checkpoint: name, dtype, shape, bytes and file, then\n"
            "the totals per dtype and overall. PATH is a .safetensors file, a\n"
            "model.safetensors.index.json, or a folder holding one of\n"
            "model.safetensors.index.json or model.safetensors.\n"
            "Every file is validated; on a bad file the error is printed and the\n"
            "exit status is 1.\n\n"
            "  --json   print one JSON object instead (schema: docs/inspect-json.md)\n"
            "  --help   this text\n");
}

typedef struct {
    uint64_t tensors, bytes;
} total;

static void shape_text(const mr_st_tensor *t, char *buf, size_t n) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

static int print_text(const mr_ckpt *c, const total *by, const total *all) {
    size_t nw = 4, sw = 5, fw = 4;
    char shp[256];
    for (size_t i = 0; i < mr_ckpt_count(c); i++) {
        const mr_st_tensor *t = mr_ckpt_tensor_at(c, i);
        shape_text(t, shp, sizeof shp);
        if (strlen(t->name) > nw) nw = strlen(t->name);
        if (strlen(shp) > sw) sw = strlen(shp);
        if (strlen(mr_st_file_name(t->file)) > fw) fw = strlen(mr_st_file_name(t->file));
    }
    size_t nf = mr_ckpt_file_count(c);
    printf("checkpoint: %s (%s, %zu file%s)\n", mr_ckpt_path(c), mr_ckpt_is_sharded(c) ? "sharded index" : "single file",
           nf, nf == 1 ? "" : "s");
    printf("%-*s  %-11s  %-*s  %14s  %s\n", (int)nw, "name", "dtype", (int)sw, "shape", "bytes", "file");
    for (size_t i = 0; i < mr_ckpt_count(c); i++) {
        const mr_st_tensor *t = mr_ckpt_tensor_at(c, i);
        shape_text(t, shp, sizeof shp);
        printf("%-*s  %-11s  %-*s  %14llu  %s\n", (int)nw, t->name, mr_st_dtype_name(t->dtype), (int)sw, shp,
               (unsigned long long)t->n_bytes, mr_st_file_name(t->file));
    }
    printf("\ntotals:\n  %-11s  %8s  %14s\n", "dtype", "tensors", "bytes");
    for (int d = 0; d < MR_ST_DTYPE_COUNT; d++)
        if (by[d].tensors)
            printf("  %-11s  %8llu  %14llu\n", mr_st_dtype_name((mr_st_dtype)d), (unsigned long long)by[d].tensors,
                   (unsigned long long)by[d].bytes);
    printf("  %-11s  %8llu  %14llu\n", "all", (unsigned long long)all->tensors, (unsigned long long)all->bytes);
    return 0;
}

/* Adds v to o under key; false on allocation failure (v is consumed either way). */
static bool put(json_t *o, const char *key, json_t *v) { return v != NULL && json_object_set_new(o, key, v) == 0; }

static json_t *build_json(const mr_ckpt *c, const total *by, const total *all) {
    json_t *root = json_object(), *files = json_array(), *tensors = json_array(), *totals = json_object(),
           *bydt = json_object();
    bool ok = root && files && tensors && totals && bydt;
    ok = ok && put(root, "path", json_string(mr_ckpt_path(c)));
    ok = ok && put(root, "sharded", json_boolean(mr_ckpt_is_sharded(c)));
    for (size_t i = 0; ok && i < mr_ckpt_file_count(c); i++) {
        const mr_st_file *f = mr_ckpt_file_at(c, i);
        json_t *o = json_object(), *meta = json_object();
        ok = o && meta && json_array_append_new(files, o) == 0; /* takes o, even on failure */
        if (!ok) {
            if (!meta) json_decref(o);
            json_decref(meta);
            break;
        }
        ok = put(o, "name", json_string(mr_st_file_name(f))) && put(o, "path", json_string(mr_st_file_path(f))) &&
             put(o, "size", json_integer((json_int_t)mr_st_file_size(f))) &&
             put(o, "header_size", json_integer((json_int_t)mr_st_header_size(f))) &&
             put(o, "tensors", json_integer((json_int_t)mr_st_count(f))) && put(o, "metadata", meta);
        const char *k, *v;
        for (size_t m = 0; ok && mr_st_metadata_at(f, m, &k, &v); m++) ok = put(meta, k, json_string(v));
    }
    for (size_t i = 0; ok && i < mr_ckpt_count(c); i++) {
        const mr_st_tensor *t = mr_ckpt_tensor_at(c, i);
        json_t *o = json_object(), *shape = json_array();
        ok = o && shape && json_array_append_new(tensors, o) == 0; /* takes o, even on failure */
        if (!ok) {
            if (!shape) json_decref(o);
            json_decref(shape);
            break;
        }
        ok = put(o, "name", json_string(t->name)) && put(o, "dtype", json_string(mr_st_dtype_name(t->dtype))) &&
             put(o, "shape", shape);
        for (int d = 0; ok && d < t->ndim; d++) ok = json_array_append_new(shape, json_integer(t->shape[d])) == 0;
        ok = ok && put(o, "bytes", json_integer((json_int_t)t->n_bytes)) &&
             put(o, "file", json_string(mr_st_file_name(t->file))) &&
             put(o, "offset", json_integer((json_int_t)t->offset));
    }
    for (int d = 0; ok && d < MR_ST_DTYPE_COUNT; d++) {
        if (!by[d].tensors) continue;
        json_t *o = json_object();
        ok = put(bydt, mr_st_dtype_name((mr_st_dtype)d), o) && put(o, "tensors", json_integer((json_int_t)by[d].tensors)) &&
             put(o, "bytes", json_integer((json_int_t)by[d].bytes));
    }
    ok = ok && put(totals, "tensors", json_integer((json_int_t)all->tensors)) &&
         put(totals, "bytes", json_integer((json_int_t)all->bytes));
    /* these take ownership even on failure */
    ok = put(totals, "by_dtype", bydt) && ok;
    ok = put(root, "files", files) && ok;
    ok = put(root, "tensors", tensors) && ok;
    ok = put(root, "totals", totals) && ok;
    if (!ok) {
        json_decref(root);
        return NULL;
    }
    return root;
}

int mr_cmd_inspect(int argc, char **argv) {
    const char *path = NULL;
    bool as_json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            as_json = true;
        } else if (argv[i][0] == '-' && argv[i][1] != 0) {
            fprintf(stderr, "moerun inspect: unknown option '%s' (see --help)\n", argv[i]);
            return 2;
        } else if (path == NULL) {
            path = argv[i];
        } else {
            fprintf(stderr, "moerun inspect: only one PATH may be given ('%s' and '%s'; see --help)\n", path, argv[i]);
            return 2;
        }
    }
    if (path == NULL) {
        fprintf(stderr, "moerun inspect: missing PATH (see --help)\n");
        return 2;
    }
    mr_ckpt *c = NULL;
    if (mr_ckpt_open(path, &c) != MR_OK) {
        mr_cli_fail("inspect", "cannot read the checkpoint");
        return 1;
    }
    total by[MR_ST_DTYPE_COUNT] = {{0, 0}}, all = {0, 0};
    for (size_t i = 0; i < mr_ckpt_count(c); i++) {
        const mr_st_tensor *t = mr_ckpt_tensor_at(c, i);
        by[t->dtype].tensors++;
        by[t->dtype].bytes += t->n_bytes;
        all.tensors++;
        all.bytes += t->n_bytes;
    }
    int rc = 0;
    if (as_json) {
        json_t *j = build_json(c, by, &all);
        if (j == NULL || json_dumpf(j, stdout, JSON_INDENT(2)) != 0) {
            fprintf(stderr, "moerun inspect: out of memory while building the JSON output\n");
            rc = 1;
        } else {
            fputc('\n', stdout);
        }
        json_decref(j);
    } else {
        rc = print_text(c, by, &all);
    }
    mr_ckpt_close(c);
    if (fflush(stdout) != 0) rc = 1;
    return rc;
}
