/* cmd_tokenize.c — `moerun tokenize` (text -> ids) and `moerun detokenize`
 * (ids -> text) with a model folder's tokenizer.json. Exit: 0 ok, 2 bad
 * input (usage, a missing or bad tokenizer file, invalid UTF-8, bad ids),
 * 1 an I/O or memory failure while writing. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moerun/text.h"

#define MAX_INPUT ((size_t)1 << 30)

static void tok_usage(FILE *f) {
    fprintf(f,
            "usage: moerun tokenize --model DIR (--text S | --file F | < stdin) [--json]\n"
            "                       [--no-special] [--split-special] [--replace-invalid]\n\n"
            "Encodes text with the model's tokenizer.json and prints the ids, comma-separated.\n"
            "  --model DIR        a model folder (tokenizer.json, tokenizer_config.json) or a tokenizer.json\n"
            "  --text S           the text; else --file F, else standard input\n"
            "  --json             one JSON object: ids, and per token its piece and its text\n"
            "  --no-special       do not add the BOS/EOS the tokenizer's post-processor adds\n"
            "  --split-special    special tokens written in the text are encoded as text\n"
            "  --replace-invalid  replace invalid UTF-8 by U+FFFD (default: refuse, naming the byte offset)\n");
}

static void detok_usage(FILE *f) {
    fprintf(f,
            "usage: moerun detokenize --model DIR (--ids 1,2,3 | < stdin) [--skip-special] [--json]\n\n"
            "Decodes token ids (comma- or space-separated) with the model's tokenizer.json and\n"
            "prints the text. Invalid UTF-8 in the decoded bytes becomes U+FFFD.\n"
            "  --skip-special  leave out special tokens\n"
            "  --json          one JSON object: text, ids\n");
}

static int read_stream(FILE *f, const char *name, char **buf, size_t *len) {
    size_t cap = 65536, n = 0;
    char *p = malloc(cap);
    if (!p) return 1;
    size_t r;
    while ((r = fread(p + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            if (cap >= MAX_INPUT) {
                fprintf(stderr, "moerun: %s is larger than 1 GiB\n", name);
                free(p);
                return 2;
            }
            char *q = realloc(p, cap * 2);
            if (!q) {
                free(p);
                return 1;
            }
            p = q;
            cap *= 2;
        }
    }
    if (ferror(f)) {
        fprintf(stderr, "moerun: cannot read %s: %s\n", name, strerror(errno));
        free(p);
        return 2;
    }
    p[n] = 0; /* n < cap: the buffer grows whenever it fills */
    *buf = p;
    *len = n;
    return 0;
}

static int load(const char *cmd, const char *model, mr_tokenizer **t) {
    if (!model) {
        fprintf(stderr, "moerun %s: --model DIR is required\n", cmd);
        return 2;
    }
    mr_status st = mr_tokenizer_load(model, t);
    if (st) {
        mr_cli_fail(cmd, "cannot load the tokenizer");
        return st == MR_ENOMEM ? 1 : 2;
    }
    return 0;
}

/* Adds v to o under key; false on failure (v is consumed either way). */
static bool put(json_t *o, const char *key, json_t *v) { return v && json_object_set_new(o, key, v) == 0; }

static int print_json_ids(const mr_tokenizer *t, const mr_tok_ids *ids) {
    json_t *root = json_object(), *arr = json_array(), *toks = json_array();
    bool ok = root && arr && toks;
    for (size_t i = 0; ok && i < ids->n; i++) {
        int32_t id = ids->ids[i];
        size_t pl, bl;
        const char *piece = mr_tokenizer_id_to_piece(t, id, &pl);
        char *text = NULL;
        size_t tl;
        ok = mr_tokenizer_decode(t, &id, 1, false, &text, &tl) == MR_OK;
        (void)mr_tokenizer_id_to_bytes(t, id, &bl);
        json_t *o = json_object();
        ok = ok && o && json_array_append_new(arr, json_integer(id)) == 0 && json_array_append_new(toks, o) == 0;
        ok = ok && put(o, "id", json_integer(id)) && put(o, "piece", json_stringn(piece, pl)) &&
             put(o, "text", json_stringn(text, tl)) && put(o, "bytes", json_integer((json_int_t)bl)) &&
             put(o, "special", json_boolean(mr_tokenizer_is_special(t, id)));
        mr_free(text);
    }
    ok = put(root, "count", json_integer((json_int_t)ids->n)) && ok;
    ok = put(root, "ids", arr) && ok;
    ok = put(root, "tokens", toks) && ok;
    if (ok) ok = json_dumpf(root, stdout, JSON_COMPACT | JSON_ENSURE_ASCII) == 0 && putchar('\n') != EOF;
    json_decref(root);
    return ok ? 0 : 1;
}

int mr_cmd_tokenize(int argc, char **argv) {
    const char *cmd = "tokenize", *model = NULL, *text = NULL, *file = NULL;
    bool json = false;
    unsigned flags = MR_TOK_ADD_SPECIAL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            tok_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--no-special")) {
            flags &= ~(unsigned)MR_TOK_ADD_SPECIAL;
        } else if (!strcmp(a, "--split-special")) {
            flags |= MR_TOK_SPLIT_SPECIAL;
        } else if (!strcmp(a, "--replace-invalid")) {
            flags |= MR_TOK_REPLACE_INVALID;
        } else if (v && (!strcmp(a, "--model") || !strcmp(a, "--text") || !strcmp(a, "--file"))) {
            if (a[2] == 'm') model = v;
            else if (a[2] == 't') text = v;
            else file = v;
            i++;
        } else if (!strcmp(a, "--model") || !strcmp(a, "--text") || !strcmp(a, "--file")) {
            fprintf(stderr, "moerun %s: %s needs a value\n", cmd, a);
            return 2;
        } else {
            fprintf(stderr, "moerun %s: unknown option '%s'\n\n", cmd, a);
            tok_usage(stderr);
            return 2;
        }
    }
    if (text && file) {
        fprintf(stderr, "moerun %s: give at most one of --text and --file\n", cmd);
        return 2;
    }
    mr_tokenizer *t = NULL;
    int rc = load(cmd, model, &t);
    if (rc) return rc;
    char *buf = NULL;
    size_t len = 0;
    if (text) {
        len = strlen(text);
    } else if (file) {
        FILE *f = fopen(file, "rb");
        if (!f) {
            fprintf(stderr, "moerun %s: cannot open %s: %s\n", cmd, file, strerror(errno));
            mr_tokenizer_free(t);
            return 2;
        }
        rc = read_stream(f, file, &buf, &len);
        fclose(f);
    } else {
        rc = read_stream(stdin, "standard input", &buf, &len);
    }
    mr_tok_ids ids = {0};
    if (!rc) {
        size_t off = 0;
        mr_status st = mr_tokenizer_encode(t, text ? text : buf, len, flags, &ids, &off);
        if (st == MR_EINPUT) {
            mr_cli_fail(cmd, file ? file : text ? "--text" : "standard input");
            if (!(flags & MR_TOK_REPLACE_INVALID)) fprintf(stderr, "  (--replace-invalid replaces it by U+FFFD)\n");
            rc = 2;
        } else if (st) {
            mr_cli_fail(cmd, NULL);
            rc = 1;
        }
    }
    if (!rc) {
        if (json) {
            rc = print_json_ids(t, &ids);
        } else {
            for (size_t i = 0; i < ids.n; i++) printf("%s%ld", i ? "," : "", (long)ids.ids[i]);
            putchar('\n');
        }
        if (fflush(stdout) != 0 || ferror(stdout)) rc = 1;
    }
    mr_tok_ids_free(&ids);
    free(buf);
    mr_tokenizer_free(t);
    return rc;
}

/* Parses "1,2, 3 4" into ids; every id must be a token. */
static int parse_ids(const char *cmd, const mr_tokenizer *t, const char *s, mr_tok_ids *out) {
    const char *p = s;
    for (;;) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || (*end && !strchr(", \t\r\n", *end))) {
            const char *e = p;
            while (*e && !strchr(", \t\r\n", *e)) e++;
            fprintf(stderr, "moerun %s: '%.*s' is not a token id\n", cmd, (int)(e - p > 40 ? 40 : e - p), p);
            return 2;
        }
        if (v < 0 || v >= mr_tokenizer_id_limit(t) || !mr_tokenizer_id_to_piece(t, (int32_t)v, NULL)) {
            fprintf(stderr, "moerun %s: token id %lld names no token (ids are 0..%ld)\n", cmd, v,
                    (long)mr_tokenizer_id_limit(t) - 1);
            return 2;
        }
        int32_t *q = realloc(out->ids, (out->n + 1) * sizeof(int32_t));
        if (!q) return 1;
        out->ids = q;
        out->ids[out->n++] = (int32_t)v;
        p = end;
    }
    return 0;
}

int mr_cmd_detokenize(int argc, char **argv) {
    const char *cmd = "detokenize", *model = NULL, *ids_arg = NULL;
    bool json = false, skip = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            detok_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--skip-special")) {
            skip = true;
        } else if (v && (!strcmp(a, "--model") || !strcmp(a, "--ids"))) {
            if (a[2] == 'm') model = v;
            else ids_arg = v;
            i++;
        } else if (!strcmp(a, "--model") || !strcmp(a, "--ids")) {
            fprintf(stderr, "moerun %s: %s needs a value\n", cmd, a);
            return 2;
        } else {
            fprintf(stderr, "moerun %s: unknown option '%s'\n\n", cmd, a);
            detok_usage(stderr);
            return 2;
        }
    }
    mr_tokenizer *t = NULL;
    int rc = load(cmd, model, &t);
    if (rc) return rc;
    char *buf = NULL;
    size_t len = 0;
    if (!ids_arg && !(rc = read_stream(stdin, "standard input", &buf, &len))) {
        if (memchr(buf, 0, len)) {
            fprintf(stderr, "moerun %s: standard input holds a NUL byte\n", cmd);
            rc = 2;
        }
    }
    mr_tok_ids ids = {0};
    if (!rc) rc = parse_ids(cmd, t, ids_arg ? ids_arg : buf, &ids);
    char *text = NULL;
    size_t tl = 0;
    if (!rc && mr_tokenizer_decode(t, ids.ids, ids.n, skip, &text, &tl) != MR_OK) {
        mr_cli_fail(cmd, NULL);
        rc = 2;
    }
    if (!rc) {
        if (json) {
            json_t *root = json_object(), *arr = json_array();
            bool ok = root && arr;
            for (size_t i = 0; ok && i < ids.n; i++) ok = json_array_append_new(arr, json_integer(ids.ids[i])) == 0;
            ok = put(root, "ids", arr) && ok;
            ok = ok && put(root, "text", json_stringn(text, tl));
            if (ok) ok = json_dumpf(root, stdout, JSON_COMPACT | JSON_ENSURE_ASCII) == 0 && putchar('\n') != EOF;
            json_decref(root);
            rc = ok ? 0 : 1;
        } else if (tl && fwrite(text, 1, tl, stdout) != tl) {
            rc = 1;
        }
        if (fflush(stdout) != 0 || ferror(stdout)) rc = 1;
    }
    mr_free(text);
    free(ids.ids);
    free(buf);
    mr_tokenizer_free(t);
    return rc;
}
