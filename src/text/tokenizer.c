/* tokenizer.c — encoding and decoding with a loaded tokenizer.json
 * (tokenizers' tokenizer/mod.rs and added_vocabulary.rs), the streaming
 * decoder and the vocabulary lookups. Loading is tokenizer_load.c.
 *
 * encode(text):
 *   1. added tokens whose `normalized` is false are found in the raw text,
 *      leftmost-longest (single_word, lstrip, rstrip as tokenizers applies
 *      them: lstrip never reaches back past the previous token, rstrip runs
 *      on from the match, and the search resumes after the unstripped match);
 *   2. each gap is normalized, then searched for the normalized added tokens;
 *   3. each remaining gap goes through the pre-tokenizer steps (Split,
 *      ByteLevel), each piece through BPE;
 *   4. with MR_TOK_ADD_SPECIAL the post-processor's ids go around it all.
 * decode(ids): the tokens' decoded bytes joined (no decoder: joined with " ",
 * as tokenizers does), then invalid UTF-8 replaced by U+FFFD. */
#include <string.h>

#include "text/tokenizer_internal.h"

typedef struct {
    const mr_tokenizer *t;
    pcre2_match_data *md;
    unsigned flags;
    mr_tok_ids *out;
    mr__buf norm, norm_tmp;
    mr__buf level_str[MR__MAX_PRE];  /* per pre-tokenizer step: the prefixed text */
    mr__buf level_map[MR__MAX_PRE];  /* per pre-tokenizer step: the byte-mapped text */
    mr__buf level_span[MR__MAX_PRE]; /* per pre-tokenizer step: spans of the split */
} enc;

static mr_status model(enc *e, const char *s, size_t n, bool mapped) { return mr__bpe_encode(e->t, s, n, mapped, e->out); }

static mr_status pre_step(enc *e, size_t k, const char *s, size_t n);

/* The byte map of a ByteLevel step: deferred to the model (which caches on
 * the unmapped bytes) when it is the last step, else spelled out for the
 * steps after it. */
static mr_status bytelevel_map(enc *e, size_t k, const char *s, size_t n) {
    if (k + 1 == e->t->n_pre) return model(e, s, n, true);
    mr__buf *b = &e->level_map[k];
    const uint16_t *bm = mr__bytemap();
    b->n = 0;
    mr_status st = mr__buf_reserve(b, n * 2);
    if (st) return st;
    for (size_t i = 0; i < n; i++) b->n += (size_t)mr__utf8_encode(bm[(unsigned char)s[i]], b->p + b->n);
    return pre_step(e, k + 1, b->p, b->n);
}

typedef struct {
    size_t s, e;
    int m;
} span;

typedef struct {
    mr__buf *spans;
    size_t prev;
    bool invert;
} split_ctx;

static mr_status push_span(mr__buf *b, size_t s, size_t e, int m) {
    span sp = {s, e, m};
    return mr__buf_put(b, &sp, sizeof sp);
}

static mr_status split_match(size_t ms, size_t me, void *vctx) {
    split_ctx *c = vctx;
    mr_status st = MR_OK;
    if (c->prev != ms) st = push_span(c->spans, c->prev, ms, c->invert);
    if (!st) st = push_span(c->spans, ms, me, !c->invert);
    c->prev = me;
    return st;
}

/* Pattern::find_matches then SplitDelimiterBehavior, as tokenizers'
 * NormalizedString::split; then the next step on every non-empty piece. */
static mr_status split(enc *e, size_t k, const mr__regex *re, mr__split_behavior beh, bool invert, const char *s,
                       size_t n, bool bytelevel) {
    mr__buf *sp = &e->level_span[k];
    sp->n = 0;
    split_ctx c = {sp, 0, invert};
    mr_status st = mr__regex_each(re, e->md, s, n, split_match, &c);
    if (!st && c.prev != n) st = push_span(sp, c.prev, n, invert);
    if (st) return st;
    span *v = (span *)(void *)sp->p;
    size_t m = sp->n / sizeof(span), w = 0;
    bool prev_match = false;
    switch (beh) {
    case MR__SPLIT_ISOLATED: w = m; break;
    case MR__SPLIT_REMOVED:
        for (size_t i = 0; i < m; i++)
            if (!v[i].m) v[w++] = v[i];
        break;
    case MR__SPLIT_MERGED_PREV:
        for (size_t i = 0; i < m; i++) {
            if (v[i].m && !prev_match && w > 0) v[w - 1].e = v[i].e;
            else v[w++] = v[i];
            prev_match = v[i].m;
        }
        break;
    case MR__SPLIT_MERGED_NEXT: { /* the same fold from the right */
        size_t r = m;
        for (size_t i = m; i-- > 0;) {
            if (v[i].m && !prev_match && r < m) v[r].s = v[i].s;
            else v[--r] = v[i];
            prev_match = v[i].m;
        }
        memmove(v, v + r, (m - r) * sizeof(span));
        w = m - r;
        break;
    }
    case MR__SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < m; i++) {
            if (v[i].m == (int)prev_match && w > 0) v[w - 1].e = v[i].e;
            else v[w++] = v[i];
            prev_match = v[i].m;
        }
        break;
    }
    for (size_t i = 0; i < w && !st; i++) {
        span x = ((span *)(void *)sp->p)[i]; /* deeper steps use their own buffers */
        if (x.e <= x.s) continue;
        st = bytelevel ? bytelevel_map(e, k, s + x.s, x.e - x.s) : pre_step(e, k + 1, s + x.s, x.e - x.s);
    }
    return st;
}

static mr_status pre_step(enc *e, size_t k, const char *s, size_t n) {
    const mr_tokenizer *t = e->t;
    if (k == t->n_pre) return model(e, s, n, false);
    const mr__pre_step *p = &t->pre[k];
    if (p->kind == MR__PRE_SPLIT) return split(e, k, &p->re, p->behavior, p->invert, s, n, false);
    /* ByteLevel: the prefix space, the GPT-2 regex (Isolated), the byte map */
    if (p->add_prefix_space && s[0] != ' ') {
        mr__buf *b = &e->level_str[k];
        mr_status st;
        b->n = 0;
        if ((st = mr__buf_put(b, " ", 1)) || (st = mr__buf_put(b, s, n))) return st;
        s = b->p;
        n = b->n;
    }
    if (p->use_regex) return split(e, k, &p->re, MR__SPLIT_ISOLATED, false, s, n, true);
    return bytelevel_map(e, k, s, n);
}

/* ---- added tokens ---- */
static bool is_word_char(const mr_tokenizer *t, pcre2_match_data *md, const char *s, size_t n) {
    int rc = pcre2_match(t->word_re.code, (PCRE2_SPTR)s, n, 0, PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK, md, NULL);
    return rc > 0;
}

static size_t prev_char(const char *s, size_t end) {
    size_t k = end - 1;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    return k;
}

typedef mr_status (*gap_fn)(enc *e, const char *s, size_t n);

/* tokenizers' AddedVocabulary::find_matches over s[0, n) with one trie:
 * tokens are appended, gaps handed to fn. */
static mr_status scan_added(enc *e, const mr__trie *tr, const char *s, size_t n, gap_fn fn) {
    const mr_tokenizer *t = e->t;
    const unsigned char *u = (const unsigned char *)s;
    size_t pos = 0, start_offset = 0;
    mr_status st = MR_OK;
    if (tr->n_patterns) {
        while (pos < n && !st) {
            size_t i = pos, len = 0;
            int32_t id = -1;
            for (; i < n; i++) {
                if (!(tr->first[u[i] >> 3] & (1u << (u[i] & 7)))) continue;
                if ((len = mr__trie_longest(tr, u + i, n - i, &id))) break;
            }
            if (!len) break;
            size_t ms = i, me = i + len;
            pos = me;
            const mr__added *a = &t->added[t->id_added[id]];
            if ((e->flags & MR_TOK_SPLIT_SPECIAL) && a->special) continue;
            if (a->single_word) {
                bool start_space = ms == 0 || !is_word_char(t, e->md, s + prev_char(s, ms), ms - prev_char(s, ms));
                bool stop_space = me == n || !is_word_char(t, e->md, s + me, n - me);
                if (!start_space || !stop_space) continue;
            }
            size_t start = ms, stop = me;
            if (a->lstrip) {
                size_t ns = start;
                while (ns > 0) {
                    size_t k = prev_char(s, ns);
                    int32_t cp;
                    mr__utf8_decode_valid(u + k, &cp);
                    if (!mr__is_white_space(cp)) break;
                    ns = k;
                }
                start = ns > start_offset ? ns : start_offset;
            }
            if (a->rstrip) {
                while (stop < n) {
                    int32_t cp;
                    int l = mr__utf8_decode_valid(u + stop, &cp);
                    if (!mr__is_white_space(cp)) break;
                    stop += (size_t)l;
                }
            }
            if (start_offset < start) st = fn(e, s + start_offset, start - start_offset);
            if (!st) st = mr__tok_ids_push(e->out, id);
            start_offset = stop;
        }
    }
    if (!st && start_offset < n) st = fn(e, s + start_offset, n - start_offset);
    return st;
}

static mr_status normalized_gap(enc *e, const char *s, size_t n) { return pre_step(e, 0, s, n); }

static mr_status raw_gap(enc *e, const char *s, size_t n) {
    const mr_tokenizer *t = e->t;
    if (t->n_norm) {
        mr_status st = mr__norm_apply(t, e->md, s, n, &e->norm, &e->norm_tmp);
        if (st) return st;
        s = e->norm.p;
        n = e->norm.n;
        if (!n) return MR_OK;
        /* the gap's text lives in e->norm while it is scanned: the steps
         * after this never write e->norm */
    }
    return scan_added(e, &t->norm_trie, s, n, normalized_gap);
}

mr_status mr_tokenizer_encode(const mr_tokenizer *t, const char *text, size_t len, unsigned flags, mr_tok_ids *out,
                              size_t *bad_offset) {
    if (!t || !out || (!text && len)) return mr_error_set(MR_EINVAL, "mr_tokenizer_encode: NULL argument");
    enc e;
    memset(&e, 0, sizeof e);
    e.t = t;
    e.flags = flags;
    e.out = out;
    size_t n0 = out->n;
    mr__buf fixed = {0};
    mr_status st = MR_OK;
    size_t bad = mr_utf8_check(text, len);
    if (bad < len) {
        if (!(flags & MR_TOK_REPLACE_INVALID)) {
            if (bad_offset) *bad_offset = bad;
            return mr_error_set(MR_EINPUT, "invalid UTF-8 at byte offset %zu", bad);
        }
        size_t used;
        if ((st = mr__utf8_lossy(text, len, true, &fixed, &used))) goto out;
        text = fixed.p;
        len = fixed.n;
    }
    e.md = pcre2_match_data_create(4, NULL);
    if (!e.md) {
        st = MR_ENOMEM;
        goto out;
    }
    if (flags & MR_TOK_ADD_SPECIAL)
        for (size_t i = 0; i < t->n_post_prefix && !st; i++) st = mr__tok_ids_push(out, t->post_prefix[i]);
    if (!st && len) st = scan_added(&e, &t->raw_trie, text, len, raw_gap);
    if (flags & MR_TOK_ADD_SPECIAL)
        for (size_t i = 0; i < t->n_post_suffix && !st; i++) st = mr__tok_ids_push(out, t->post_suffix[i]);
out:
    if (st) out->n = n0;
    if (e.md) pcre2_match_data_free(e.md);
    mr__buf_free(&fixed);
    mr__buf_free(&e.norm);
    mr__buf_free(&e.norm_tmp);
    for (size_t k = 0; k < MR__MAX_PRE; k++) {
        mr__buf_free(&e.level_str[k]);
        mr__buf_free(&e.level_map[k]);
        mr__buf_free(&e.level_span[k]);
    }
    return st;
}

/* ---- decoding ---- */
static mr_status token_bytes(const mr_tokenizer *t, int32_t id, bool skip, bool *first, mr__buf *b) {
    if (id < 0 || id >= t->id_limit || !t->id_str[id])
        return mr_error_set(MR_ERANGE, "token id %ld names no token (ids are 0..%ld)", (long)id, (long)t->id_limit - 1);
    if (skip && t->id_special[id]) return MR_OK;
    mr_status st = MR_OK;
    if (t->decoder == MR__DEC_NONE && !*first) st = mr__buf_put(b, " ", 1);
    *first = false;
    if (!st) st = mr__buf_put(b, t->id_bytes[id], t->id_bytes_len[id]);
    return st;
}

mr_status mr_tokenizer_decode(const mr_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, char **text,
                              size_t *text_len) {
    if (!t || !text || (!ids && n)) return mr_error_set(MR_EINVAL, "mr_tokenizer_decode: NULL argument");
    mr__buf raw = {0}, out = {0};
    bool first = true;
    size_t used;
    mr_status st = mr__buf_reserve(&raw, 16);
    for (size_t i = 0; i < n && !st; i++) st = token_bytes(t, ids[i], skip_special, &first, &raw);
    if (!st) st = mr__buf_reserve(&out, raw.n + 1);
    if (!st) st = mr__utf8_lossy(raw.p, raw.n, true, &out, &used);
    mr__buf_free(&raw);
    if (st) {
        mr__buf_free(&out);
        return st;
    }
    *text = out.p;
    if (text_len) *text_len = out.n;
    return MR_OK;
}

struct mr_tokstream {
    const mr_tokenizer *t;
    bool skip, first;
    mr__buf pending, out;
};

mr_status mr_tokstream_new(const mr_tokenizer *t, bool skip_special, mr_tokstream **out) {
    if (!t || !out) return mr_error_set(MR_EINVAL, "mr_tokstream_new: NULL argument");
    mr_tokstream *s = mr_calloc(1, sizeof *s);
    if (!s) return MR_ENOMEM;
    s->t = t;
    s->skip = skip_special;
    s->first = true;
    *out = s;
    return MR_OK;
}

void mr_tokstream_free(mr_tokstream *s) {
    if (!s) return;
    mr__buf_free(&s->pending);
    mr__buf_free(&s->out);
    mr_free(s);
}

static mr_status stream_emit(mr_tokstream *s, bool final, const char **out, size_t *out_len) {
    size_t used = 0;
    s->out.n = 0;
    mr_status st = mr__buf_reserve(&s->out, s->pending.n + 4);
    if (!st) st = mr__utf8_lossy(s->pending.p ? s->pending.p : "", s->pending.n, final, &s->out, &used);
    if (st) return st;
    memmove(s->pending.p, s->pending.p + used, s->pending.n - used);
    s->pending.n -= used;
    s->out.p[s->out.n] = 0;
    *out = s->out.p;
    if (out_len) *out_len = s->out.n;
    return MR_OK;
}

mr_status mr_tokstream_push(mr_tokstream *s, const int32_t *ids, size_t n, const char **out, size_t *out_len) {
    if (!s || !out || (!ids && n)) return mr_error_set(MR_EINVAL, "mr_tokstream_push: NULL argument");
    mr_status st = mr__buf_reserve(&s->pending, 8);
    size_t n0 = s->pending.n;
    bool first0 = s->first;
    for (size_t i = 0; i < n && !st; i++) st = token_bytes(s->t, ids[i], s->skip, &s->first, &s->pending);
    if (st) { /* nothing of a refused push is kept */
        s->pending.n = n0;
        s->first = first0;
        return st;
    }
    return stream_emit(s, false, out, out_len);
}

mr_status mr_tokstream_flush(mr_tokstream *s, const char **out, size_t *out_len) {
    if (!s || !out) return mr_error_set(MR_EINVAL, "mr_tokstream_flush: NULL argument");
    mr_status st = mr__buf_reserve(&s->pending, 8);
    if (!st) st = stream_emit(s, true, out, out_len);
    s->first = true;
    return st;
}

/* ---- lookups ---- */
int32_t mr_tokenizer_id_limit(const mr_tokenizer *t) { return t ? t->id_limit : 0; }
size_t mr_tokenizer_vocab_size(const mr_tokenizer *t) { return t ? t->n_tokens : 0; }
size_t mr_tokenizer_model_vocab_size(const mr_tokenizer *t) { return t ? t->n_vocab : 0; }

const char *mr_tokenizer_id_to_piece(const mr_tokenizer *t, int32_t id, size_t *len) {
    if (!t || id < 0 || id >= t->id_limit || !t->id_str[id]) return NULL;
    if (len) *len = t->id_len[id];
    return t->id_str[id];
}

const char *mr_tokenizer_id_to_bytes(const mr_tokenizer *t, int32_t id, size_t *len) {
    if (!t || id < 0 || id >= t->id_limit || !t->id_str[id]) return NULL;
    if (len) *len = t->id_bytes_len[id];
    return t->id_bytes[id];
}

int32_t mr_tokenizer_piece_to_id(const mr_tokenizer *t, const char *piece, size_t len) {
    if (!t || !piece) return -1;
    int32_t a = mr__strmap_get(&t->added_map, piece, len);
    if (a >= 0) return t->added[a].id;
    int32_t v = mr__strmap_get(&t->vocab, piece, len);
    return v >= 0 ? t->vocab_ids[v] : -1;
}

bool mr_tokenizer_is_special(const mr_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->id_limit && t->id_special[id];
}

int32_t mr_tokenizer_special_id(const mr_tokenizer *t, mr_tok_role role) {
    if (!t || (int)role < 0 || role >= MR_TOK_ROLE_COUNT) return -1;
    return t->role_id[role];
}

const char *mr_tokenizer_describe(const mr_tokenizer *t) { return t ? t->describe : ""; }
