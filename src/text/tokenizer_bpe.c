/* tokenizer_bpe.c — the BPE model (tokenizers' models/bpe/{model,word}.rs)
 * and its per-piece cache.
 *
 * A piece becomes symbols, one per character (ByteLevel pieces are mapped
 * byte by byte first): with continuing_subword_prefix on every character but
 * the first and end_of_word_suffix on the last; a character missing from the
 * vocabulary becomes its <0xXX> byte tokens (byte_fallback) or the unk token
 * (consecutive ones fused with fuse_unk), else it is dropped. Then merges
 * run from a min-heap ordered by (rank, position), skipping stale entries
 * whose pair no longer yields the same new id — the same procedure as
 * tokenizers' Word::merge_all, so equal results even where a stale entry
 * wins. With ignore_merges a piece that is itself a token is emitted whole.
 *
 * The cache maps piece bytes to ids. It has 16 shards, each a fixed table of
 * slots and a fixed arena allocated on first use; entries are appended under
 * the shard's lock and published with a release store, never changed or
 * removed, so lookups take no lock. A full shard stops caching (as
 * tokenizers' bounded cache does). Entry layout in the arena:
 *     u64 hash | u32 key_len | u32 n_ids | key bytes | pad to 4 | i32 ids[n_ids] */
#include <string.h>

#include "text/tokenizer_internal.h"

#define CACHE_SLOTS 8192u            /* per shard, power of two */
#define CACHE_MAX_USED (CACHE_SLOTS / 2)
#define CACHE_ARENA (1u << 20)       /* bytes per shard */
#define CACHE_MAX_KEY 256u

int32_t mr__merge_get(const mr_tokenizer *t, int32_t a, int32_t b, int32_t *new_id) {
    if (!t->merge_keys) return -1;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t h = key * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    for (size_t i = (size_t)h & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        uint64_t k = t->merge_keys[i];
        if (k == UINT64_MAX) return -1;
        if (k == key) {
            uint64_t v = t->merge_slots[i];
            *new_id = (int32_t)(uint32_t)v;
            return (int32_t)(v >> 32);
        }
    }
}

/* ---- cache ---- */
void mr__cache_init(mr_tokenizer *t) {
    for (int k = 0; k < MR__CACHE_SHARDS; k++) {
        memset(&t->cache[k], 0, sizeof t->cache[k]);
        pthread_mutex_init(&t->cache[k].lock, NULL);
    }
}

void mr__cache_free(mr_tokenizer *t) {
    for (int k = 0; k < MR__CACHE_SHARDS; k++) {
        pthread_mutex_destroy(&t->cache[k].lock);
        mr_free(t->cache[k].slots);
        mr_free(t->cache[k].arena);
    }
}

typedef struct {
    uint64_t hash;
    uint32_t key_len, n_ids;
} cache_head;

static size_t entry_size(size_t key_len, size_t n_ids) {
    return (sizeof(cache_head) + key_len + 3) / 4 * 4 + n_ids * 4;
}

/* Returns true and appends the cached ids on a hit. */
static bool cache_get(const mr_tokenizer *t, uint64_t h, const char *key, size_t n, mr_tok_ids *out, mr_status *st) {
    const mr__cache_shard *sh = &t->cache[h & (MR__CACHE_SHARDS - 1)];
    uint32_t *slots = __atomic_load_n(&sh->slots, __ATOMIC_ACQUIRE);
    if (!slots) return false;
    char *arena = sh->arena; /* set before slots was published */
    for (size_t i = (h >> 8) & (CACHE_SLOTS - 1);; i = (i + 1) & (CACHE_SLOTS - 1)) {
        uint32_t off = __atomic_load_n(&slots[i], __ATOMIC_ACQUIRE);
        if (!off) return false;
        const char *e = arena + off - 1;
        cache_head hd;
        memcpy(&hd, e, sizeof hd);
        if (hd.hash != h || hd.key_len != n || memcmp(e + sizeof hd, key, n)) continue;
        const char *ids = e + (sizeof hd + n + 3) / 4 * 4;
        if (out->n + hd.n_ids > out->cap) {
            size_t cap = out->cap ? out->cap : 64;
            while (cap < out->n + hd.n_ids) cap *= 2;
            int32_t *p = mr_realloc(out->ids, cap * sizeof(int32_t));
            if (!p) {
                *st = MR_ENOMEM;
                return true;
            }
            out->ids = p;
            out->cap = cap;
        }
        if (hd.n_ids) memcpy(out->ids + out->n, ids, hd.n_ids * sizeof(int32_t)); /* ids may be NULL when empty */
        out->n += hd.n_ids;
        return true;
    }
}

static void cache_put(const mr_tokenizer *t, uint64_t h, const char *key, size_t n, const int32_t *ids, size_t n_ids) {
    if (n > CACHE_MAX_KEY || n_ids > 4096) return;
    mr__cache_shard *sh = (mr__cache_shard *)&t->cache[h & (MR__CACHE_SHARDS - 1)]; /* the cache is the one mutable part */
    size_t need = entry_size(n, n_ids);
    pthread_mutex_lock(&sh->lock);
    if (!sh->slots) {
        /* allocation failure here only means no caching: never an error */
        char *arena = mr_malloc(CACHE_ARENA);
        uint32_t *slots = arena ? mr_calloc(CACHE_SLOTS, sizeof(uint32_t)) : NULL;
        if (!slots) {
            mr_free(arena);
            mr_error_clear();
            goto out;
        }
        sh->arena = arena;
        sh->arena_cap = CACHE_ARENA;
        sh->arena_n = 0;
        __atomic_store_n(&sh->slots, slots, __ATOMIC_RELEASE);
    }
    if (sh->used >= CACHE_MAX_USED || sh->arena_n + need > sh->arena_cap) goto out;
    size_t i = (h >> 8) & (CACHE_SLOTS - 1);
    for (;; i = (i + 1) & (CACHE_SLOTS - 1)) {
        uint32_t off = sh->slots[i];
        if (!off) break;
        const char *e = sh->arena + off - 1;
        cache_head hd;
        memcpy(&hd, e, sizeof hd);
        if (hd.hash == h && hd.key_len == n && !memcmp(e + sizeof hd, key, n)) goto out; /* another thread won */
    }
    char *e = sh->arena + sh->arena_n;
    cache_head hd = {h, (uint32_t)n, (uint32_t)n_ids};
    memcpy(e, &hd, sizeof hd);
    memcpy(e + sizeof hd, key, n);
    if (n_ids) memcpy(e + (sizeof hd + n + 3) / 4 * 4, ids, n_ids * sizeof(int32_t));
    __atomic_store_n(&sh->slots[i], (uint32_t)(sh->arena_n + 1), __ATOMIC_RELEASE);
    sh->arena_n += need;
    sh->used++;
out:
    pthread_mutex_unlock(&sh->lock);
}

/* ---- the merge procedure ---- */
typedef struct {
    int32_t id;
    int32_t prev, next;
    int32_t live;
} sym;

typedef struct {
    uint32_t rank, pos;
    int32_t new_id;
} merge_ent;

static inline bool ent_less(merge_ent a, merge_ent b) { /* a pops before b */
    return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos;
}

static void heap_push(merge_ent *h, size_t *n, merge_ent e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!ent_less(e, h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static merge_ent heap_pop(merge_ent *h, size_t *n) {
    merge_ent top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= *n) break;
        size_t c = (l + 1 < *n && ent_less(h[l + 1], h[l])) ? l + 1 : l;
        if (!ent_less(h[c], last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static void merge_all(const mr_tokenizer *t, sym *s, size_t n, merge_ent *heap) {
    size_t hn = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        int32_t nid;
        int32_t r = mr__merge_get(t, s[i].id, s[i + 1].id, &nid);
        if (r >= 0) heap_push(heap, &hn, (merge_ent){(uint32_t)r, (uint32_t)i, nid});
    }
    while (hn) {
        merge_ent top = heap_pop(heap, &hn);
        sym *cur = &s[top.pos];
        if (!cur->live || cur->next < 0) continue;
        sym *right = &s[cur->next];
        int32_t nid;
        if (mr__merge_get(t, cur->id, right->id, &nid) < 0 || nid != top.new_id) continue;
        cur->id = top.new_id;
        right->live = 0;
        cur->next = right->next;
        if (right->next >= 0) s[right->next].prev = (int32_t)top.pos;
        if (cur->prev >= 0) {
            int32_t r = mr__merge_get(t, s[cur->prev].id, cur->id, &nid);
            if (r >= 0) heap_push(heap, &hn, (merge_ent){(uint32_t)r, (uint32_t)cur->prev, nid});
        }
        if (cur->next >= 0) {
            int32_t r = mr__merge_get(t, cur->id, s[cur->next].id, &nid);
            if (r >= 0) heap_push(heap, &hn, (merge_ent){(uint32_t)r, top.pos, nid});
        }
    }
}

/* Symbols of one character c (UTF-8, cl bytes) at position i of the piece. */
static mr_status add_char(const mr_tokenizer *t, const char *c, size_t cl, bool first, bool last, sym *s, size_t *ns,
                          int32_t *unk_pending, char *tmp) {
    int32_t id;
    if (!t->cont_prefix && !t->eow_suffix) {
        id = mr__strmap_get(&t->vocab, c, cl);
    } else {
        size_t k = 0;
        if (!first && t->cont_prefix) {
            memcpy(tmp, t->cont_prefix, t->cont_prefix_len);
            k = t->cont_prefix_len;
        }
        memcpy(tmp + k, c, cl);
        k += cl;
        if (last && t->eow_suffix) {
            memcpy(tmp + k, t->eow_suffix, t->eow_suffix_len);
            k += t->eow_suffix_len;
        }
        c = tmp;
        cl = k;
        id = mr__strmap_get(&t->vocab, c, cl);
    }
    if (id >= 0) {
        if (*unk_pending >= 0) {
            s[*ns] = (sym){*unk_pending, 0, 0, 1};
            (*ns)++;
            *unk_pending = -1;
        }
        s[*ns] = (sym){t->vocab_ids[id], 0, 0, 1};
        (*ns)++;
        return MR_OK;
    }
    if (t->byte_fallback) {
        bool all = true;
        for (size_t k = 0; k < cl; k++)
            if (t->byte_fallback_id[(unsigned char)c[k]] < 0) all = false;
        if (all) {
            for (size_t k = 0; k < cl; k++) s[(*ns)++] = (sym){t->byte_fallback_id[(unsigned char)c[k]], 0, 0, 1};
            return MR_OK;
        }
    }
    if (t->unk) {
        if (t->unk_id < 0)
            return mr_error_set(MR_EINPUT, "the unknown token \"%.40s\" is not in the vocabulary", t->unk);
        if (*unk_pending >= 0 && !t->fuse_unk) s[(*ns)++] = (sym){*unk_pending, 0, 0, 1};
        *unk_pending = t->unk_id;
    }
    return MR_OK;
}

mr_status mr__bpe_encode(const mr_tokenizer *t, const char *piece, size_t n, bool mapped, mr_tok_ids *out) {
    if (!n) return MR_OK;
    mr_status st = MR_OK;
    uint64_t h = mr__hash_bytes(piece, n) ^ (mapped ? 0x5bd1e995u : 0);
    if (cache_get(t, h, piece, n, out, &st)) return st;

    const char *word = piece;
    size_t wn = n;
    char stackw[512];
    char *heapw = NULL;
    if (mapped) { /* ByteLevel: every byte becomes its char (1 or 2 bytes) */
        const uint16_t *bm = mr__bytemap();
        char *w = n * 2 <= sizeof stackw ? stackw : (heapw = mr_malloc(n * 2));
        if (!w) return MR_ENOMEM;
        size_t k = 0;
        for (size_t i = 0; i < n; i++) k += (size_t)mr__utf8_encode(bm[(unsigned char)piece[i]], w + k);
        word = w;
        wn = k;
    }
    if (t->ignore_merges) {
        int32_t idx = mr__strmap_get(&t->vocab, word, wn);
        if (idx >= 0) {
            st = mr__tok_ids_push(out, t->vocab_ids[idx]);
            mr_free(heapw);
            return st;
        }
    }
    /* at most 4 symbols per character (byte fallback), at most wn characters */
    sym stack_s[128];
    merge_ent stack_h[3 * 128];
    sym *s = stack_s;
    merge_ent *heap = stack_h;
    char tmpc[64];
    char *tmp = tmpc;
    size_t max_sym = wn * 4, ns = 0;
    size_t need_tmp = t->cont_prefix_len + t->eow_suffix_len + 4;
    if (max_sym > 128) {
        s = mr_malloc(max_sym * sizeof(sym));
        heap = mr_malloc(max_sym * 3 * sizeof(merge_ent) + 16);
    }
    if (need_tmp > sizeof tmpc) tmp = mr_malloc(need_tmp);
    if (!s || !heap || !tmp) {
        st = MR_ENOMEM;
        goto out;
    }
    int32_t unk_pending = -1;
    for (size_t i = 0; i < wn && !st;) {
        size_t bad;
        bool trunc;
        int cl = mr__utf8_seq((const unsigned char *)word + i, wn - i, &bad, &trunc);
        if (cl <= 0) cl = 1; /* cannot happen: pieces are valid UTF-8 */
        st = add_char(t, word + i, (size_t)cl, i == 0, i + (size_t)cl >= wn, s, &ns, &unk_pending, tmp);
        i += (size_t)cl;
    }
    if (st) goto out;
    if (unk_pending >= 0) s[ns++] = (sym){unk_pending, 0, 0, 1};
    for (size_t i = 0; i < ns; i++) {
        s[i].prev = (int32_t)i - 1;
        s[i].next = i + 1 < ns ? (int32_t)i + 1 : -1;
    }
    /* The heap never holds more than ns-1 initial entries plus two per merge
     * (at most ns-1 merges): under 3*ns. */
    merge_all(t, s, ns, heap);
    size_t first = out->n;
    for (size_t i = 0; i < ns && !st; i++)
        if (s[i].live) st = mr__tok_ids_push(out, s[i].id);
    /* a piece can make no tokens (every character unknown and no unk token): out->ids may still be NULL */
    if (!st) cache_put(t, h, piece, n, out->n > first ? out->ids + first : NULL, out->n - first);
out:
    if (s != stack_s) mr_free(s);
    if (heap != stack_h) mr_free(heap);
    if (tmp != tmpc) mr_free(tmp);
    mr_free(heapw);
    return st;
}
