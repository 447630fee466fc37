/* tokenizer_load.c — reading tokenizer.json (and tokenizer_config.json) into
 * an mr_tokenizer. What is read:
 *
 *   {"added_tokens": [{"id", "content", "special", "normalized", "lstrip",
 *                      "rstrip", "single_word"}, ...],
 *    "normalizer":     null | {"type": NFC|NFD|NFKC|NFKD|Lowercase|Replace|
 *                      Prepend|Strip|StripAccents|Sequence, ...},
 *    "pre_tokenizer":  null | {"type": Split|ByteLevel|Sequence, ...},
 *    "model":          {"type": "BPE", "vocab": {token: id}, "merges":
 *                      ["a b", ...] | [["a", "b"], ...], "unk_token",
 *                      "continuing_subword_prefix", "end_of_word_suffix",
 *                      "fuse_unk", "byte_fallback", "ignore_merges", "dropout"},
 *    "post_processor": null | {"type": TemplateProcessing|ByteLevel|
 *                      RobertaProcessing|BertProcessing|Sequence, ...},
 *    "decoder":        null | {"type": "ByteLevel"},
 *    "truncation", "padding": ignored (as transformers' tokenizers do
 *                      unless a call asks for them)}
 *
 * Added tokens are registered one by one in file order with tokenizers' id
 * rule: an id the content already has (added before, or in the vocabulary),
 * else the next one after the vocabulary; the file's "id" is checked against
 * it and a difference is logged, as tokenizers warns. Anything not listed
 * above is refused here with MR_EUNSUPPORTED naming it. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/json_internal.h"
#include "text/tokenizer_internal.h"

#define MAX_FILE ((size_t)1 << 30)

static const char GPT2_REGEX[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- arena of stable strings: a list of blocks ---- */
typedef struct arena_block {
    struct arena_block *next;
    size_t n, cap;
    char data[];
} arena_block;

mr_status mr__tok_arena_put(mr_tokenizer *t, const char *s, size_t n, const char **out) {
    arena_block *b = (arena_block *)(void *)t->arena;
    if (!b || b->cap - b->n < n + 1) {
        size_t cap = n + 1 > (1u << 16) ? n + 1 : (1u << 16);
        arena_block *nb = mr_malloc(sizeof(arena_block) + cap);
        if (!nb) return MR_ENOMEM;
        nb->next = b;
        nb->n = 0;
        nb->cap = cap;
        t->arena = (char *)nb;
        b = nb;
    }
    char *p = b->data + b->n;
    if (n) memcpy(p, s, n);
    p[n] = 0;
    b->n += n + 1;
    *out = p;
    return MR_OK;
}

static void arena_free(mr_tokenizer *t) {
    arena_block *b = (arena_block *)(void *)t->arena;
    while (b) {
        arena_block *nx = b->next;
        mr_free(b);
        b = nx;
    }
    t->arena = NULL;
}

/* ---- JSON helpers: every field is type-checked ---- */
static mr_status bad(const char *what, const char *why) {
    return mr_error_set(MR_EFORMAT, "tokenizer.json: %s %s", what, why);
}

static mr_status get_bool(json_t *o, const char *key, bool def, bool *out, const char *ctx) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return MR_OK;
    }
    if (!json_is_boolean(v)) return mr_error_set(MR_EFORMAT, "tokenizer.json: %s.%s is not a boolean", ctx, key);
    *out = json_is_true(v);
    return MR_OK;
}

/* *s NULL when absent or null */
static mr_status get_str(json_t *o, const char *key, const char **s, size_t *n, const char *ctx) {
    json_t *v = json_object_get(o, key);
    *s = NULL;
    *n = 0;
    if (!v || json_is_null(v)) return MR_OK;
    if (!json_is_string(v)) return mr_error_set(MR_EFORMAT, "tokenizer.json: %s.%s is not a string", ctx, key);
    *s = json_string_value(v);
    *n = json_string_length(v);
    return MR_OK;
}

static const char *type_of(json_t *o) {
    json_t *v = json_object_get(o, "type");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static mr_status dup_str(const char *s, size_t n, char **out, size_t *out_n) {
    *out = mr_malloc(n + 1);
    if (!*out) return MR_ENOMEM;
    memcpy(*out, s, n);
    (*out)[n] = 0;
    if (out_n) *out_n = n;
    return MR_OK;
}

/* ---- description ---- */
static void desc(mr_tokenizer *t, const char *fmt, const char *s) {
    size_t l = strlen(t->describe);
    if (l + 1 < sizeof t->describe) snprintf(t->describe + l, sizeof t->describe - l, fmt, s);
}

/* ---- normalizers ---- */
static mr_status pattern_regex(json_t *pat, mr__regex *re, const char *ctx) {
    const char *s;
    size_t n;
    if (!json_is_object(pat)) return bad(ctx, "pattern is not an object");
    json_t *str = json_object_get(pat, "String"), *rx = json_object_get(pat, "Regex");
    if (json_is_string(str)) {
        s = json_string_value(str);
        n = json_string_length(str);
        if (!n) return mr_error_set(MR_EUNSUPPORTED, "tokenizer.json: %s: an empty String pattern is not supported", ctx);
        return mr__regex_compile(re, s, n, true, ctx);
    }
    if (json_is_string(rx)) return mr__regex_compile(re, json_string_value(rx), json_string_length(rx), false, ctx);
    return bad(ctx, "pattern has neither a String nor a Regex");
}

static mr_status add_norm(mr_tokenizer *t, json_t *o, int depth) {
    const char *ty = type_of(o);
    mr_status st = MR_OK;
    if (!json_is_object(o) || !ty) return bad("normalizer", "has no type");
    if (depth > 8) return bad("normalizer", "nests too deeply");
    if (!strcmp(ty, "Sequence")) {
        json_t *arr = json_object_get(o, "normalizers");
        if (!json_is_array(arr)) return bad("normalizer Sequence", "has no normalizers list");
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) {
            if ((st = add_norm(t, v, depth + 1))) return st;
        }
        return MR_OK;
    }
    if (t->n_norm >= 64) return bad("normalizer", "has more than 64 steps");
    mr__norm_step step;
    memset(&step, 0, sizeof step);
    if (!strcmp(ty, "NFC")) step.kind = MR__NORM_NFC;
    else if (!strcmp(ty, "NFD")) step.kind = MR__NORM_NFD;
    else if (!strcmp(ty, "NFKC")) step.kind = MR__NORM_NFKC;
    else if (!strcmp(ty, "NFKD")) step.kind = MR__NORM_NFKD;
    else if (!strcmp(ty, "Lowercase")) step.kind = MR__NORM_LOWERCASE;
    else if (!strcmp(ty, "StripAccents")) step.kind = MR__NORM_STRIP_ACCENTS;
    else if (!strcmp(ty, "Strip")) {
        step.kind = MR__NORM_STRIP;
        if ((st = get_bool(o, "strip_left", true, &step.left, "Strip")) ||
            (st = get_bool(o, "strip_right", true, &step.right, "Strip")))
            return st;
    } else if (!strcmp(ty, "Prepend") || !strcmp(ty, "Replace")) {
        const char *s;
        size_t n;
        bool prep = ty[0] == 'P';
        step.kind = prep ? MR__NORM_PREPEND : MR__NORM_REPLACE;
        if ((st = get_str(o, prep ? "prepend" : "content", &s, &n, ty))) return st;
        if (!s) return mr_error_set(MR_EFORMAT, "tokenizer.json: normalizer %s has no %s string", ty, prep ? "prepend" : "content");
        if ((st = dup_str(s, n, &step.str, &step.str_len))) return st;
        if (!prep && (st = pattern_regex(json_object_get(o, "pattern"), &step.re, "normalizer Replace"))) {
            mr_free(step.str);
            return st;
        }
    } else {
        return mr_error_set(MR_EUNSUPPORTED,
                            "tokenizer.json: normalizer \"%.60s\" is not supported (moerun implements NFC, NFD, NFKC, "
                            "NFKD, Lowercase, Replace, Prepend, Strip, StripAccents and Sequence)",
                            ty);
    }
    mr__norm_step *nv = mr_realloc(t->norm, (t->n_norm + 1) * sizeof *nv);
    if (!nv) {
        mr_free(step.str);
        mr__regex_free(&step.re);
        return MR_ENOMEM;
    }
    t->norm = nv;
    t->norm[t->n_norm++] = step;
    desc(t, t->n_norm == 1 ? "normalizer %s" : "+%s", ty);
    return MR_OK;
}

/* ---- pre-tokenizers ---- */
static mr_status add_pre(mr_tokenizer *t, json_t *o, int depth) {
    const char *ty = type_of(o);
    mr_status st = MR_OK;
    if (!json_is_object(o) || !ty) return bad("pre_tokenizer", "has no type");
    if (depth > 8) return bad("pre_tokenizer", "nests too deeply");
    if (!strcmp(ty, "Sequence")) {
        json_t *arr = json_object_get(o, "pretokenizers");
        if (!json_is_array(arr)) return bad("pre_tokenizer Sequence", "has no pretokenizers list");
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) {
            if ((st = add_pre(t, v, depth + 1))) return st;
        }
        return MR_OK;
    }
    if (t->n_pre >= MR__MAX_PRE)
        return mr_error_set(MR_EUNSUPPORTED, "tokenizer.json: more than %d pre-tokenizer steps", MR__MAX_PRE);
    mr__pre_step step;
    memset(&step, 0, sizeof step);
    if (!strcmp(ty, "Split")) {
        step.kind = MR__PRE_SPLIT;
        const char *b;
        size_t bn;
        if ((st = get_str(o, "behavior", &b, &bn, "Split"))) return st;
        if (!b) return bad("pre_tokenizer Split", "has no behavior");
        if (!strcmp(b, "Removed")) step.behavior = MR__SPLIT_REMOVED;
        else if (!strcmp(b, "Isolated")) step.behavior = MR__SPLIT_ISOLATED;
        else if (!strcmp(b, "MergedWithPrevious")) step.behavior = MR__SPLIT_MERGED_PREV;
        else if (!strcmp(b, "MergedWithNext")) step.behavior = MR__SPLIT_MERGED_NEXT;
        else if (!strcmp(b, "Contiguous")) step.behavior = MR__SPLIT_CONTIGUOUS;
        else return mr_error_set(MR_EFORMAT, "tokenizer.json: Split behavior \"%.40s\" is unknown", b);
        if ((st = get_bool(o, "invert", false, &step.invert, "Split"))) return st;
        if ((st = pattern_regex(json_object_get(o, "pattern"), &step.re, "pre_tokenizer Split"))) return st;
    } else if (!strcmp(ty, "ByteLevel")) {
        step.kind = MR__PRE_BYTELEVEL;
        if ((st = get_bool(o, "add_prefix_space", true, &step.add_prefix_space, "ByteLevel")) ||
            (st = get_bool(o, "use_regex", true, &step.use_regex, "ByteLevel")))
            return st;
        if (step.use_regex &&
            (st = mr__regex_compile(&step.re, GPT2_REGEX, sizeof GPT2_REGEX - 1, false, "ByteLevel regex")))
            return st;
    } else {
        return mr_error_set(MR_EUNSUPPORTED,
                            "tokenizer.json: pre-tokenizer \"%.60s\" is not supported (moerun implements Split, "
                            "ByteLevel and Sequence)",
                            ty);
    }
    t->pre[t->n_pre++] = step;
    desc(t, t->n_pre == 1 ? ", pre-tokenizer %s" : "+%s", ty);
    return MR_OK;
}

/* ---- the BPE model ---- */
static mr_status load_bpe(mr_tokenizer *t, json_t *m) {
    mr_status st = MR_OK;
    const char *ty = type_of(m);
    if (!json_is_object(m)) return bad("model", "is missing or not an object");
    json_t *vocab = json_object_get(m, "vocab"), *merges = json_object_get(m, "merges");
    if (!ty && json_is_array(merges)) ty = "BPE"; /* older files omit the type */
    if (!ty || strcmp(ty, "BPE"))
        return mr_error_set(MR_EUNSUPPORTED, "tokenizer.json: model \"%.60s\" is not supported (moerun implements BPE)",
                            ty ? ty : "(no type)");
    if (!json_is_object(vocab)) return bad("model", "has no vocab object");
    if (!json_is_array(merges)) return bad("model", "has no merges list");
    json_t *drop = json_object_get(m, "dropout");
    if (drop && !json_is_null(drop)) {
        if (!json_is_number(drop)) return bad("model.dropout", "is not a number");
        if (json_number_value(drop) != 0.0)
            return mr_error_set(MR_EUNSUPPORTED, "tokenizer.json: BPE dropout %g is not supported (encoding would be "
                                                 "random)", json_number_value(drop));
    }
    const char *s;
    size_t n;
    if ((st = get_str(m, "unk_token", &s, &n, "model"))) return st;
    if (s && (st = dup_str(s, n, &t->unk, NULL))) return st;
    if ((st = get_str(m, "continuing_subword_prefix", &s, &n, "model"))) return st;
    if (s && (st = dup_str(s, n, &t->cont_prefix, &t->cont_prefix_len))) return st;
    if ((st = get_str(m, "end_of_word_suffix", &s, &n, "model"))) return st;
    if (s && (st = dup_str(s, n, &t->eow_suffix, &t->eow_suffix_len))) return st;
    if ((st = get_bool(m, "fuse_unk", false, &t->fuse_unk, "model")) ||
        (st = get_bool(m, "byte_fallback", false, &t->byte_fallback, "model")) ||
        (st = get_bool(m, "ignore_merges", false, &t->ignore_merges, "model")))
        return st;
    if (t->cont_prefix_len > 256 || t->eow_suffix_len > 256)
        return mr_error_set(MR_EUNSUPPORTED, "tokenizer.json: subword prefix/suffix longer than 256 bytes");

    /* vocab */
    size_t nv = json_object_size(vocab);
    if (nv > (size_t)MR__TOK_MAX_ID) return mr_error_set(MR_EUNSUPPORTED, "tokenizer.json: vocab of %zu tokens is too large", nv);
    t->vocab_keys = mr_calloc(nv ? nv : 1, sizeof(char *));
    t->vocab_lens = mr_calloc(nv ? nv : 1, sizeof(uint32_t));
    t->vocab_ids = mr_calloc(nv ? nv : 1, sizeof(int32_t));
    size_t cap = 16;
    while (cap < nv * 2) cap *= 2;
    t->vocab.slots = mr_calloc(cap, sizeof(uint64_t));
    if (!t->vocab_keys || !t->vocab_lens || !t->vocab_ids || !t->vocab.slots) return MR_ENOMEM;
    t->vocab.mask = cap - 1;
    t->vocab.keys = t->vocab_keys;
    t->vocab.key_lens = t->vocab_lens;
    const char *key;
    json_t *val;
    void *tmp;
    size_t k = 0;
    json_object_keylen_foreach_safe(vocab, tmp, key, n, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= MR__TOK_MAX_ID)
            return mr_error_set(MR_EFORMAT, "tokenizer.json: vocab id of \"%.40s\" is not an integer in [0, %d)", key,
                                (int)MR__TOK_MAX_ID);
        if (n > UINT32_MAX / 2) return bad("vocab", "has a token longer than 2 GB");
        if ((st = mr__tok_arena_put(t, key, n, &t->vocab_keys[k]))) return st;
        t->vocab_lens[k] = (uint32_t)n;
        t->vocab_ids[k] = (int32_t)json_integer_value(val);
        uint64_t h = mr__hash_bytes(key, n);
        size_t i = (size_t)h & t->vocab.mask;
        while (t->vocab.slots[i]) i = (i + 1) & t->vocab.mask;
        t->vocab.slots[i] = (h & 0xFFFFFFFF00000000ull) | (uint64_t)(k + 1);
        k++;
    }
    t->n_vocab = k;

    /* merges: rank = line; a later duplicate pair overwrites (HashMap insert) */
    size_t nm = json_array_size(merges);
    size_t mcap = 16;
    while (mcap < nm * 2) mcap *= 2;
    t->merge_keys = mr_malloc(mcap * sizeof(uint64_t));
    t->merge_slots = mr_malloc(mcap * sizeof(uint64_t));
    if (!t->merge_keys || !t->merge_slots) return MR_ENOMEM;
    memset(t->merge_keys, 0xFF, mcap * sizeof(uint64_t));
    t->merge_mask = mcap - 1;
    mr__buf cat = {0};
    for (size_t r = 0; r < nm; r++) {
        json_t *e = json_array_get(merges, r);
        const char *a, *b;
        size_t an, bn;
        if (json_is_string(e)) {
            a = json_string_value(e);
            const char *sp = memchr(a, ' ', json_string_length(e));
            if (!sp || memchr(sp + 1, ' ', json_string_length(e) - (size_t)(sp + 1 - a))) {
                st = mr_error_set(MR_EFORMAT, "tokenizer.json: merge %zu \"%.40s\" is not two tokens separated by one space",
                                  r, a);
                break;
            }
            an = (size_t)(sp - a);
            b = sp + 1;
            bn = json_string_length(e) - an - 1;
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) {
            a = json_string_value(json_array_get(e, 0));
            an = json_string_length(json_array_get(e, 0));
            b = json_string_value(json_array_get(e, 1));
            bn = json_string_length(json_array_get(e, 1));
        } else {
            st = mr_error_set(MR_EFORMAT, "tokenizer.json: merge %zu is neither \"a b\" nor [\"a\", \"b\"]", r);
            break;
        }
        int32_t ia = mr__strmap_get(&t->vocab, a, an), ib = mr__strmap_get(&t->vocab, b, bn);
        if (ia < 0 || ib < 0) {
            st = mr_error_set(MR_EFORMAT, "tokenizer.json: merge %zu names \"%.40s\", which is not in the vocab", r,
                              ia < 0 ? a : b);
            break;
        }
        /* the new token: a + b without b's continuing_subword_prefix */
        size_t skip = 0;
        if (t->cont_prefix && bn >= t->cont_prefix_len && !memcmp(b, t->cont_prefix, t->cont_prefix_len))
            skip = t->cont_prefix_len;
        else if (t->cont_prefix) {
            st = mr_error_set(MR_EFORMAT, "tokenizer.json: merge %zu: \"%.40s\" lacks the subword prefix", r, b);
            break;
        }
        cat.n = 0;
        if ((st = mr__buf_put(&cat, a, an)) || (st = mr__buf_put(&cat, b + skip, bn - skip))) break;
        int32_t inew = mr__strmap_get(&t->vocab, cat.p, cat.n);
        if (inew < 0) {
            st = mr_error_set(MR_EFORMAT, "tokenizer.json: merge %zu makes \"%.60s\", which is not in the vocab", r, cat.p);
            break;
        }
        uint64_t key64 = ((uint64_t)(uint32_t)t->vocab_ids[ia] << 32) | (uint32_t)t->vocab_ids[ib];
        uint64_t h = key64 * 0x9e3779b97f4a7c15ull;
        h ^= h >> 29;
        size_t i = (size_t)h & t->merge_mask;
        while (t->merge_keys[i] != UINT64_MAX && t->merge_keys[i] != key64) i = (i + 1) & t->merge_mask;
        if (t->merge_keys[i] == UINT64_MAX) t->n_merges++;
        t->merge_keys[i] = key64;
        t->merge_slots[i] = ((uint64_t)r << 32) | (uint32_t)t->vocab_ids[inew];
    }
    mr__buf_free(&cat);
    if (st) return st;
    if (nm > UINT32_MAX) return bad("model", "has too many merges");

    /* unk and byte fallback ids */
    t->unk_id = -1;
    if (t->unk) {
        int32_t u = mr__strmap_get(&t->vocab, t->unk, strlen(t->unk));
        if (u >= 0) t->unk_id = t->vocab_ids[u];
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        int32_t v = mr__strmap_get(&t->vocab, name, 6);
        t->byte_fallback_id[b] = v >= 0 ? t->vocab_ids[v] : -1;
    }
    char d[96];
    snprintf(d, sizeof d, "BPE (%zu tokens, %zu merges%s)", t->n_vocab, t->n_merges,
             t->ignore_merges ? ", ignore_merges" : "");
    desc(t, "%s", t->describe[0] ? ", model " : "model ");
    desc(t, "%s", d);
    return MR_OK;
}

/* ---- added tokens ---- */
static int32_t added_find(const mr_tokenizer *t, const char *s, size_t n) { return mr__strmap_get(&t->added_map, s, n); }

static mr_status added_map_insert(mr_tokenizer *t, size_t idx) {
    /* rebuilt from scratch when the table gets half full */
    if ((idx + 1) * 2 > t->added_map.mask + 1 || !t->added_map.slots) {
        size_t cap = 16;
        while (cap < (idx + 1) * 4) cap *= 2;
        uint64_t *slots = mr_calloc(cap, sizeof(uint64_t));
        if (!slots) return MR_ENOMEM;
        mr_free(t->added_map.slots);
        t->added_map.slots = slots;
        t->added_map.mask = cap - 1;
        for (size_t j = 0; j < idx; j++) {
            uint64_t h = mr__hash_bytes(t->added_keys[j], t->added_lens[j]);
            size_t i = (size_t)h & t->added_map.mask;
            while (slots[i]) i = (i + 1) & t->added_map.mask;
            slots[i] = (h & 0xFFFFFFFF00000000ull) | (uint64_t)(j + 1);
        }
    }
    uint64_t h = mr__hash_bytes(t->added_keys[idx], t->added_lens[idx]);
    size_t i = (size_t)h & t->added_map.mask;
    while (t->added_map.slots[i]) i = (i + 1) & t->added_map.mask;
    t->added_map.slots[i] = (h & 0xFFFFFFFF00000000ull) | (uint64_t)(idx + 1);
    return MR_OK;
}

typedef struct {
    mr__added tok;
    bool is_special_list; /* which of tokenizers' two lists it went to */
} added_entry;

static mr_status load_added(mr_tokenizer *t, json_t *arr, added_entry **list_out, size_t *n_list) {
    mr_status st = MR_OK;
    if (!arr || json_is_null(arr)) return MR_OK;
    if (!json_is_array(arr)) return bad("added_tokens", "is not a list");
    size_t na = json_array_size(arr);
    if (na > (size_t)MR__TOK_MAX_ID) return bad("added_tokens", "has too many entries");
    t->added = mr_calloc(na ? na : 1, sizeof(mr__added));
    t->added_keys = mr_calloc(na ? na : 1, sizeof(char *));
    t->added_lens = mr_calloc(na ? na : 1, sizeof(uint32_t));
    added_entry *list = mr_calloc(na ? na : 1, sizeof(added_entry));
    *list_out = list;
    if (!t->added || !t->added_keys || !t->added_lens || !list) return MR_ENOMEM;
    t->added_map.keys = t->added_keys;
    t->added_map.key_lens = t->added_lens;
    int32_t max_added = -1; /* largest id handed out so far */
    for (size_t i = 0; i < na; i++) {
        json_t *o = json_array_get(arr, i);
        if (!json_is_object(o)) return bad("added_tokens", "has an entry that is not an object");
        mr__added a;
        memset(&a, 0, sizeof a);
        const char *c;
        size_t cn;
        char ctx[32];
        snprintf(ctx, sizeof ctx, "added_tokens[%zu]", i);
        if ((st = get_str(o, "content", &c, &cn, ctx))) return st;
        if (!c) return mr_error_set(MR_EFORMAT, "tokenizer.json: %s has no content", ctx);
        if ((st = get_bool(o, "special", false, &a.special, ctx)) ||
            (st = get_bool(o, "normalized", !a.special, &a.normalized, ctx)) ||
            (st = get_bool(o, "lstrip", false, &a.lstrip, ctx)) || (st = get_bool(o, "rstrip", false, &a.rstrip, ctx)) ||
            (st = get_bool(o, "single_word", false, &a.single_word, ctx)))
            return st;
        json_t *jid = json_object_get(o, "id");
        if (!json_is_integer(jid) || json_integer_value(jid) < 0 || json_integer_value(jid) >= MR__TOK_MAX_ID)
            return mr_error_set(MR_EFORMAT, "tokenizer.json: %s.id is not an integer in [0, %d)", ctx, (int)MR__TOK_MAX_ID);
        if (!cn) continue; /* tokenizers ignores empty tokens */
        if (cn > UINT32_MAX / 2) return bad(ctx, "is too long");
        int32_t idx = added_find(t, c, cn);
        /* an identical token already added: ignored */
        if (idx >= 0) {
            const mr__added *p = &t->added[idx];
            if (p->special == a.special && p->normalized == a.normalized && p->lstrip == a.lstrip &&
                p->rstrip == a.rstrip && p->single_word == a.single_word)
                continue;
        }
        int32_t id;
        if (idx >= 0) {
            id = t->added[idx].id;
        } else {
            int32_t v = mr__strmap_get(&t->vocab, c, cn);
            if (v >= 0) {
                id = t->vocab_ids[v];
            } else {
                int32_t vs = (int32_t)t->n_vocab;
                id = max_added < 0 ? vs : (max_added >= vs || vs == 0) ? max_added + 1 : vs;
            }
        }
        if (id >= MR__TOK_MAX_ID) return bad(ctx, "gets an id above the limit");
        if (id != (int32_t)json_integer_value(jid))
            MR_WARN("tokenizer.json: token \"%.40s\" was expected to have id %lld but gets id %ld (as tokenizers "
                    "assigns it)",
                    c, (long long)json_integer_value(jid), (long)id);
        if (id > max_added) max_added = id;
        a.id = id;
        if (idx < 0) {
            idx = (int32_t)t->n_added++;
            if ((st = mr__tok_arena_put(t, c, cn, &a.content))) return st;
            a.len = (uint32_t)cn;
            t->added_keys[idx] = a.content;
            t->added_lens[idx] = a.len;
            if ((st = added_map_insert(t, (size_t)idx))) return st;
        } else {
            a.content = t->added[idx].content;
            a.len = t->added[idx].len;
        }
        /* the special list keeps the first flags of a content, the other list every re-add */
        bool in_special = false;
        for (size_t j = 0; j < *n_list; j++)
            if (list[j].is_special_list && list[j].tok.len == a.len && !memcmp(list[j].tok.content, a.content, a.len))
                in_special = true;
        if (a.special && !in_special) {
            list[(*n_list)++] = (added_entry){a, true};
            in_special = true;
        }
        t->added[idx] = a; /* map_r: the latest flags */
        if (!in_special) list[(*n_list)++] = (added_entry){a, false};
    }
    return MR_OK;
}

/* The two tries: tokenizers chains its special list then its other list,
 * partitioned by `normalized`; normalized patterns are normalized first. */
static mr_status build_tries(mr_tokenizer *t, added_entry *list, size_t n) {
    mr_status st = MR_OK;
    const char **pats = mr_calloc(n ? n : 1, sizeof(char *));
    uint32_t *lens = mr_calloc(n ? n : 1, sizeof(uint32_t));
    int32_t *ids = mr_calloc(n ? n : 1, sizeof(int32_t));
    mr__buf nb = {0}, scratch = {0};
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    if (!pats || !lens || !ids || !md) {
        st = MR_ENOMEM;
        goto out;
    }
    for (int pass = 0; pass < 2 && !st; pass++) {
        size_t m = 0;
        for (int sp = 1; sp >= 0; sp--)
            for (size_t i = 0; i < n && !st; i++) {
                if (list[i].is_special_list != (sp == 1) || list[i].tok.normalized != (pass == 1)) continue;
                const mr__added *a = &list[i].tok;
                pats[m] = a->content;
                lens[m] = a->len;
                if (pass == 1 && t->n_norm) {
                    if ((st = mr__norm_apply(t, md, a->content, a->len, &nb, &scratch))) break;
                    if ((st = mr__tok_arena_put(t, nb.p, nb.n, &pats[m]))) break;
                    lens[m] = (uint32_t)nb.n;
                }
                ids[m] = a->id;
                if (a->single_word) t->need_word_re = true;
                m++;
            }
        if (!st) st = mr__trie_build(pass ? &t->norm_trie : &t->raw_trie, pats, lens, ids, m);
    }
out:
    mr_free(pats);
    mr_free(lens);
    mr_free(ids);
    mr__buf_free(&nb);
    mr__buf_free(&scratch);
    if (md) pcre2_match_data_free(md);
    return st;
}

/* ---- post-processor ---- */
static mr_status push_id(int32_t **v, size_t *n, int32_t id) {
    int32_t *p = mr_realloc(*v, (*n + 1) * sizeof(int32_t));
    if (!p) return MR_ENOMEM;
    *v = p;
    p[(*n)++] = id;
    return MR_OK;
}

/* Wraps the current prefix/suffix: new prefix = pre + old prefix, new
 * suffix = old suffix + suf (each processor of a Sequence wraps the last). */
static mr_status wrap(mr_tokenizer *t, const int32_t *pre, size_t npre, const int32_t *suf, size_t nsuf) {
    mr_status st = MR_OK;
    int32_t *np = NULL;
    size_t nn = 0;
    for (size_t i = 0; i < npre && !st; i++) st = push_id(&np, &nn, pre[i]);
    for (size_t i = 0; i < t->n_post_prefix && !st; i++) st = push_id(&np, &nn, t->post_prefix[i]);
    if (st) {
        mr_free(np);
        return st;
    }
    mr_free(t->post_prefix);
    t->post_prefix = np;
    t->n_post_prefix = nn;
    for (size_t i = 0; i < nsuf && !st; i++) st = push_id(&t->post_suffix, &t->n_post_suffix, suf[i]);
    return st;
}

static mr_status pair_id(json_t *o, const char *key, int32_t *id, const char *ctx) {
    json_t *v = json_object_get(o, key);
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_integer(json_array_get(v, 1)) ||
        json_integer_value(json_array_get(v, 1)) < 0 || json_integer_value(json_array_get(v, 1)) >= MR__TOK_MAX_ID)
        return mr_error_set(MR_EFORMAT, "tokenizer.json: %s.%s is not [token, id]", ctx, key);
    *id = (int32_t)json_integer_value(json_array_get(v, 1));
    return MR_OK;
}

static mr_status load_post(mr_tokenizer *t, json_t *o, int depth) {
    mr_status st = MR_OK;
    if (!o || json_is_null(o)) return MR_OK;
    const char *ty = type_of(o);
    if (!json_is_object(o) || !ty) return bad("post_processor", "has no type");
    if (depth > 8) return bad("post_processor", "nests too deeply");
    if (!strcmp(ty, "Sequence")) {
        json_t *arr = json_object_get(o, "processors");
        if (!json_is_array(arr)) return bad("post_processor Sequence", "has no processors list");
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) {
            if ((st = load_post(t, v, depth + 1))) return st;
        }
        return MR_OK;
    }
    desc(t, ", post-processor %s", ty);
    if (!strcmp(ty, "ByteLevel")) return MR_OK; /* offsets only */
    if (!strcmp(ty, "RobertaProcessing") || !strcmp(ty, "BertProcessing")) {
        int32_t cls, sep;
        if ((st = pair_id(o, "cls", &cls, ty)) || (st = pair_id(o, "sep", &sep, ty))) return st;
        return wrap(t, &cls, 1, &sep, 1);
    }
    if (!strcmp(ty, "TemplateProcessing")) {
        json_t *single = json_object_get(o, "single"), *specials = json_object_get(o, "special_tokens");
        if (!json_is_array(single)) return bad("TemplateProcessing", "has no single template");
        if (specials && !json_is_object(specials)) return bad("TemplateProcessing.special_tokens", "is not an object");
        int32_t *pre = NULL, *suf = NULL;
        size_t npre = 0, nsuf = 0, nseq = 0, i;
        json_t *item;
        json_array_foreach(single, i, item) {
            json_t *sp = json_object_get(item, "SpecialToken"), *sq = json_object_get(item, "Sequence");
            if (json_is_object(sq)) {
                json_t *sid = json_object_get(sq, "id");
                if (!json_is_string(sid) || strcmp(json_string_value(sid), "A")) {
                    st = mr_error_set(MR_EUNSUPPORTED, "tokenizer.json: TemplateProcessing single template uses a "
                                                       "sequence other than $A");
                    break;
                }
                if (++nseq > 1) {
                    st = mr_error_set(MR_EUNSUPPORTED, "tokenizer.json: TemplateProcessing repeats $A");
                    break;
                }
                continue;
            }
            json_t *name = json_is_object(sp) ? json_object_get(sp, "id") : NULL;
            if (!json_is_string(name)) {
                st = bad("TemplateProcessing", "has a template item that is neither SpecialToken nor Sequence");
                break;
            }
            json_t *def = specials ? json_object_get(specials, json_string_value(name)) : NULL;
            json_t *ids = json_is_object(def) ? json_object_get(def, "ids") : NULL;
            if (!json_is_array(ids)) {
                st = mr_error_set(MR_EFORMAT, "tokenizer.json: TemplateProcessing special token \"%.40s\" is not "
                                              "defined in special_tokens", json_string_value(name));
                break;
            }
            size_t j;
            json_t *idv;
            json_array_foreach(ids, j, idv) {
                if (!json_is_integer(idv) || json_integer_value(idv) < 0 || json_integer_value(idv) >= MR__TOK_MAX_ID) {
                    st = bad("TemplateProcessing special token ids", "are not valid ids");
                    break;
                }
                if ((st = push_id(nseq ? &suf : &pre, nseq ? &nsuf : &npre, (int32_t)json_integer_value(idv)))) break;
            }
            if (st) break;
        }
        if (!st && !nseq) st = mr_error_set(MR_EUNSUPPORTED, "tokenizer.json: TemplateProcessing single template has no $A");
        if (!st) st = wrap(t, pre, npre, suf, nsuf);
        mr_free(pre);
        mr_free(suf);
        return st;
    }
    return mr_error_set(MR_EUNSUPPORTED,
                        "tokenizer.json: post-processor \"%.60s\" is not supported (moerun implements "
                        "TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing and Sequence)",
                        ty);
}

/* ---- id tables ---- */
static mr_status build_ids(mr_tokenizer *t) {
    int32_t lim = 0;
    for (size_t i = 0; i < t->n_vocab; i++)
        if (t->vocab_ids[i] + 1 > lim) lim = t->vocab_ids[i] + 1;
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].id + 1 > lim) lim = t->added[i].id + 1;
    size_t count = t->n_vocab + t->n_added;
    if ((size_t)lim > (size_t)1 << 21 && (size_t)lim / 4 > count)
        return mr_error_set(MR_EUNSUPPORTED, "tokenizer.json: ids up to %ld for %zu tokens: too sparse", (long)lim - 1,
                            count);
    size_t L = (size_t)lim ? (size_t)lim : 1;
    t->id_limit = lim;
    t->id_str = mr_calloc(L, sizeof(char *));
    t->id_len = mr_calloc(L, sizeof(uint32_t));
    t->id_bytes = mr_calloc(L, sizeof(char *));
    t->id_bytes_len = mr_calloc(L, sizeof(uint32_t));
    t->id_special = mr_calloc(L, 1);
    t->id_added = mr_malloc(L * sizeof(int32_t));
    if (!t->id_str || !t->id_len || !t->id_bytes || !t->id_bytes_len || !t->id_special || !t->id_added)
        return MR_ENOMEM;
    for (size_t i = 0; i < L; i++) t->id_added[i] = -1;
    for (size_t i = 0; i < t->n_vocab; i++) {
        int32_t id = t->vocab_ids[i];
        if (t->id_str[id]) continue; /* two strings with one id: the first wins */
        t->id_str[id] = t->vocab_keys[i];
        t->id_len[id] = t->vocab_lens[i];
    }
    /* an added token's string is its content, normalized when it is a
     * normalized token (tokenizers' id_to_token and decode give that form) */
    mr__buf nb = {0}, scratch = {0};
    mr_status st = MR_OK;
    pcre2_match_data *md = t->n_norm ? pcre2_match_data_create(4, NULL) : NULL;
    if (t->n_norm && !md) return MR_ENOMEM;
    for (size_t i = 0; i < t->n_added && !st; i++) {
        int32_t id = t->added[i].id;
        t->id_str[id] = t->added[i].content;
        t->id_len[id] = t->added[i].len;
        t->id_added[id] = (int32_t)i;
        if (t->added[i].normalized && t->n_norm &&
            !(st = mr__norm_apply(t, md, t->added[i].content, t->added[i].len, &nb, &scratch)) &&
            !(st = mr__tok_arena_put(t, nb.p ? nb.p : "", nb.n, &t->id_str[id])))
            t->id_len[id] = (uint32_t)nb.n;
    }
    if (md) pcre2_match_data_free(md);
    mr__buf_free(&nb);
    mr__buf_free(&scratch);
    if (st) return st;
    /* the post-processor's ids must be tokens (tokenizers would emit them anyway) */
    for (size_t i = 0; i < t->n_post_prefix + t->n_post_suffix; i++) {
        int32_t id = i < t->n_post_prefix ? t->post_prefix[i] : t->post_suffix[i - t->n_post_prefix];
        if (id >= lim || !t->id_str[id])
            return mr_error_set(MR_EFORMAT, "tokenizer.json: post-processor id %ld names no token", (long)id);
    }
    /* distinct strings (HF get_vocab_size(true)): the vocab plus added
     * contents that are not in it */
    t->n_tokens = t->n_vocab;
    for (size_t i = 0; i < t->n_added; i++)
        if (mr__strmap_get(&t->vocab, t->added[i].content, t->added[i].len) < 0) t->n_tokens++;
    /* special: the string is a special token's content */
    for (int32_t id = 0; id < lim; id++) {
        if (!t->id_str[id]) continue;
        int32_t a = mr__strmap_get(&t->added_map, t->id_str[id], t->id_len[id]);
        t->id_special[id] = a >= 0 && t->added[a].special;
    }
    /* decoded bytes (ByteLevel: every char through the inverse map, or the
     * token's own bytes when one char is no byte's) */
    mr__buf b = {0};
    for (int32_t id = 0; id < lim && !st; id++) {
        const char *s = t->id_str[id];
        if (!s) continue;
        size_t n = t->id_len[id];
        if (t->decoder != MR__DEC_BYTELEVEL) {
            t->id_bytes[id] = s;
            t->id_bytes_len[id] = (uint32_t)n;
            continue;
        }
        b.n = 0;
        bool all = true;
        for (size_t i = 0; i < n && all;) {
            int32_t cp;
            size_t bad;
            bool trunc;
            if (mr__utf8_seq((const unsigned char *)s + i, n - i, &bad, &trunc) <= 0) {
                all = false;
                break;
            }
            i += (size_t)mr__utf8_decode_valid((const unsigned char *)s + i, &cp);
            int by = mr__cp_to_byte(cp);
            if (by < 0) all = false;
            else {
                char c = (char)by;
                st = mr__buf_put(&b, &c, 1);
            }
        }
        if (st) break;
        if (!all) {
            t->id_bytes[id] = s;
            t->id_bytes_len[id] = (uint32_t)n;
        } else {
            st = mr__tok_arena_put(t, b.p ? b.p : "", b.n, &t->id_bytes[id]);
            t->id_bytes_len[id] = (uint32_t)b.n;
        }
    }
    mr__buf_free(&b);
    return st;
}

/* tokenizer_config.json: bos_token etc. are strings or {"content": ...} */
static void load_roles(mr_tokenizer *t, const char *cfg, size_t cfg_len) {
    static const char *keys[MR_TOK_ROLE_COUNT] = {"bos_token", "eos_token", "pad_token", "unk_token"};
    for (int r = 0; r < MR_TOK_ROLE_COUNT; r++) t->role_id[r] = -1;
    if (t->unk) t->role_id[MR_TOK_UNK] = mr_tokenizer_piece_to_id(t, t->unk, strlen(t->unk));
    if (!cfg) return;
    json_error_t err;
    json_t *root = mr__json_loadb(cfg, cfg_len, 0, &err, NULL);
    if (!json_is_object(root)) {
        MR_WARN("tokenizer_config.json: not a JSON object (%s); no BOS/EOS names", root ? "wrong type" : err.text);
        json_decref(root);
        mr_error_clear();
        return;
    }
    for (int r = 0; r < MR_TOK_ROLE_COUNT; r++) {
        json_t *v = json_object_get(root, keys[r]);
        if (json_is_object(v)) v = json_object_get(v, "content");
        if (!json_is_string(v)) continue;
        int32_t id = mr_tokenizer_piece_to_id(t, json_string_value(v), json_string_length(v));
        if (id < 0) MR_WARN("tokenizer_config.json: %s \"%.40s\" is no token", keys[r], json_string_value(v));
        else t->role_id[r] = id;
    }
    json_decref(root);
}

void mr_tokenizer_free(mr_tokenizer *t) {
    if (!t) return;
    for (size_t i = 0; i < t->n_norm; i++) {
        mr__regex_free(&t->norm[i].re);
        mr_free(t->norm[i].str);
    }
    mr_free(t->norm);
    for (size_t i = 0; i < t->n_pre; i++) mr__regex_free(&t->pre[i].re);
    mr__regex_free(&t->word_re);
    mr_free(t->vocab_keys);
    mr_free(t->vocab_lens);
    mr_free(t->vocab_ids);
    mr_free(t->vocab.slots);
    mr_free(t->merge_keys);
    mr_free(t->merge_slots);
    mr_free(t->unk);
    mr_free(t->cont_prefix);
    mr_free(t->eow_suffix);
    mr_free(t->added);
    mr_free(t->added_keys);
    mr_free(t->added_lens);
    mr_free(t->added_map.slots);
    mr__trie_free(&t->raw_trie);
    mr__trie_free(&t->norm_trie);
    mr_free(t->post_prefix);
    mr_free(t->post_suffix);
    mr_free(t->id_str);
    mr_free(t->id_len);
    mr_free(t->id_bytes);
    mr_free(t->id_bytes_len);
    mr_free(t->id_special);
    mr_free(t->id_added);
    mr__cache_free(t);
    arena_free(t);
    mr_free(t);
}

mr_status mr_tokenizer_load_json(const char *json, size_t len, const char *config_json, size_t config_len,
                                 mr_tokenizer **out) {
    if (!json || !out) return mr_error_set(MR_EINVAL, "mr_tokenizer_load_json: NULL argument");
    *out = NULL;
    mr_status st = MR_OK;
    json_error_t err;
    bool oom = false;
    added_entry *list = NULL;
    size_t n_list = 0;
    json_t *root = mr__json_loadb(json, len, 0, &err, &oom);
    if (!root) {
        if (oom) return MR_ENOMEM;
        return mr_error_set(MR_EFORMAT, "tokenizer.json: bad JSON at line %d column %d: %s", err.line, err.column,
                            err.text);
    }
    mr_tokenizer *t = mr_calloc(1, sizeof *t);
    if (!t) {
        json_decref(root);
        return MR_ENOMEM;
    }
    mr__cache_init(t);
    t->unk_id = -1;
    if (!json_is_object(root)) {
        st = bad("top level", "is not an object");
        goto out;
    }
    json_t *ver = json_object_get(root, "version");
    if (ver && (!json_is_string(ver) || strcmp(json_string_value(ver), "1.0"))) {
        st = mr_error_set(MR_EUNSUPPORTED, "tokenizer.json: version %s is unknown (moerun reads 1.0)",
                          json_is_string(ver) ? json_string_value(ver) : "(not a string)");
        goto out;
    }
    json_t *norm = json_object_get(root, "normalizer");
    if (norm && !json_is_null(norm) && (st = add_norm(t, norm, 0))) goto out;
    json_t *pre = json_object_get(root, "pre_tokenizer");
    if (pre && !json_is_null(pre) && (st = add_pre(t, pre, 0))) goto out;
    if ((st = load_bpe(t, json_object_get(root, "model")))) goto out;
    json_t *dec = json_object_get(root, "decoder");
    if (dec && !json_is_null(dec)) {
        const char *ty = type_of(dec);
        if (!ty || strcmp(ty, "ByteLevel")) {
            st = mr_error_set(MR_EUNSUPPORTED, "tokenizer.json: decoder \"%.60s\" is not supported (moerun implements "
                                               "ByteLevel)", ty ? ty : "(no type)");
            goto out;
        }
        t->decoder = MR__DEC_BYTELEVEL;
    }
    if ((st = load_added(t, json_object_get(root, "added_tokens"), &list, &n_list))) goto out;
    if ((st = build_tries(t, list, n_list))) goto out;
    if (t->need_word_re) {
        static const char word[] = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]";
        if ((st = mr__regex_compile(&t->word_re, word, sizeof word - 1, false, "word class"))) goto out;
    }
    if ((st = load_post(t, json_object_get(root, "post_processor"), 0))) goto out;
    if ((st = build_ids(t))) goto out;
    load_roles(t, config_json, config_len);
    {
        char d[96];
        snprintf(d, sizeof d, ", %zu added tokens, decoder %s", t->n_added, t->decoder ? "ByteLevel" : "none");
        desc(t, "%s", d);
    }
out:
    mr_free(list);
    json_decref(root);
    if (st) {
        mr_tokenizer_free(t);
        return st;
    }
    *out = t;
    return MR_OK;
}

static mr_status read_file(const char *path, char **buf, size_t *len) {
    *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return mr_error_set(MR_EIO, "cannot open %s: %s", path, strerror(errno));
    mr__buf b = {0};
    mr_status st = MR_OK;
    char chunk[65536];
    size_t r;
    while ((r = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (b.n + r > MAX_FILE) {
            st = mr_error_set(MR_EUNSUPPORTED, "%s is larger than 1 GiB", path);
            break;
        }
        if ((st = mr__buf_put(&b, chunk, r))) break;
    }
    if (!st && ferror(f)) st = mr_error_set(MR_EIO, "cannot read %s: %s", path, strerror(errno));
    fclose(f);
    if (st) {
        mr__buf_free(&b);
        return st;
    }
    if (!b.p && (st = mr__buf_put(&b, "", 0))) return st;
    *buf = b.p;
    *len = b.n;
    return MR_OK;
}

mr_status mr_tokenizer_load(const char *path, mr_tokenizer **out) {
    if (!path || !out) return mr_error_set(MR_EINVAL, "mr_tokenizer_load: NULL argument");
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) return mr_error_set(MR_EIO, "cannot open %s: %s", path, strerror(errno));
    char *tj = NULL, *cfg = NULL;
    size_t tn = 0, cn = 0;
    mr_status st;
    mr__buf p = {0};
    if (S_ISDIR(sb.st_mode)) {
        if ((st = mr__buf_put(&p, path, strlen(path))) || (st = mr__buf_put(&p, "/tokenizer.json", 15))) goto out;
        if ((st = read_file(p.p, &tj, &tn))) {
            if (st == MR_EIO) mr_error_set(MR_EIO, "%s has no readable tokenizer.json (%s)", path, mr_error_last());
            goto out;
        }
        p.n = 0;
        if ((st = mr__buf_put(&p, path, strlen(path))) || (st = mr__buf_put(&p, "/tokenizer_config.json", 22))) goto out;
        FILE *f = fopen(p.p, "rb");
        if (f) {
            fclose(f);
            if ((st = read_file(p.p, &cfg, &cn))) goto out;
        }
    } else {
        if ((st = read_file(path, &tj, &tn))) goto out;
    }
    st = mr_tokenizer_load_json(tj, tn, cfg, cn, out);
    if (st && st != MR_ENOMEM) mr_error_set(st, "%s: %s", path, mr_error_last());
out:
    mr_free(tj);
    mr_free(cfg);
    mr__buf_free(&p);
    return st;
}
