/* kvpool.c — the KV block pool's bookkeeping and the prefix table.
 *
 * The pool owns no K/V memory (the model does: mr_model_forward_kv reads
 * and writes the blocks); it decides which block is whose. States (see
 * engine_internal.h): free (stack), cached-unreferenced (LRU list, in the
 * table), used (ref > 0). Transitions:
 *   take      free -> used, or cached (LRU head, evicted from the table) -> used
 *   ref       cached -> used (a prefix hit), or used -> used
 *   release   used -> used, or at ref 0: -> cached (LRU tail) if in the table, else -> free
 *   register  used (not in the table) -> used and in the table
 *
 * The prefix table: open addressing with linear probing over block ids,
 * capacity a power of two >= 2 x blocks (so a probe always ends), deletion by
 * backward shift (no tombstones). */
#include <string.h>

#include "engine/engine_internal.h"

mr_status mr__pool_init(mr__pool *p, int64_t n) {
    memset(p, 0, sizeof *p);
    if (n < 1 || n > INT32_MAX / 4) return mr_error_set(MR_EINVAL, "KV pool: %lld blocks is out of range", (long long)n);
    uint64_t cap = 1;
    while (cap < (uint64_t)n * 2) cap <<= 1;
    p->n = n;
    p->ref = mr_calloc((size_t)n, sizeof(int32_t));
    p->free_stack = mr_malloc((size_t)n * sizeof(int32_t));
    p->lru_prev = mr_malloc((size_t)n * sizeof(int32_t));
    p->lru_next = mr_malloc((size_t)n * sizeof(int32_t));
    p->cached = mr_calloc((size_t)n, 1);
    p->key = mr_calloc((size_t)n, sizeof(mr__key));
    p->parent = mr_calloc((size_t)n, sizeof(mr__key));
    p->btok = mr_calloc((size_t)n * MR_KV_BLOCK_TOKENS, sizeof(int32_t));
    p->table = mr_malloc((size_t)cap * sizeof(int32_t));
    if (!p->ref || !p->free_stack || !p->lru_prev || !p->lru_next || !p->cached || !p->key || !p->parent ||
        !p->btok || !p->table) {
        mr__pool_free(p);
        return mr_error_set(MR_ENOMEM, NULL);
    }
    p->cap_mask = cap - 1;
    for (uint64_t i = 0; i < cap; i++) p->table[i] = -1;
    /* free stack: block 0 on top, so that blocks are taken in id order */
    for (int64_t i = 0; i < n; i++) {
        p->free_stack[i] = (int32_t)(n - 1 - i);
        p->lru_prev[i] = p->lru_next[i] = -1;
    }
    p->n_free = n;
    p->lru_head = p->lru_tail = -1;
    return MR_OK;
}

void mr__pool_free(mr__pool *p) {
    mr_free(p->ref);
    mr_free(p->free_stack);
    mr_free(p->lru_prev);
    mr_free(p->lru_next);
    mr_free(p->cached);
    mr_free(p->key);
    mr_free(p->parent);
    mr_free(p->btok);
    mr_free(p->table);
    memset(p, 0, sizeof *p);
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

mr__key mr__salt_key(const char *salt, size_t n) {
    mr__key k = {0x6361636865ull, (uint64_t)n}; /* its own start, the length in it */
    for (size_t i = 0; i < n || i == 0; i += 4 * MR_KV_BLOCK_TOKENS) { /* 64 bytes a round, zero-padded */
        int32_t t[MR_KV_BLOCK_TOKENS] = {0};
        memcpy(t, salt + i, n - i < sizeof t ? n - i : sizeof t);
        k = mr__block_key(k, t);
    }
    return k;
}

mr__key mr__block_key(mr__key parent, const int32_t *tokens) {
    /* two independent lanes (different seeds and strides) */
    uint64_t a = mix64(parent.a ^ 0x243f6a8885a308d3ull), b = mix64(parent.b ^ 0x13198a2e03707344ull);
    for (int i = 0; i < MR_KV_BLOCK_TOKENS; i++) {
        uint64_t t = (uint64_t)(uint32_t)tokens[i];
        a = mix64(a + t + 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1));
        b = mix64(b ^ (t * 0xc2b2ae3d27d4eb4full + (uint64_t)(i + 1)));
    }
    /* never the root key */
    if (a == 0 && b == 0) a = 1;
    return (mr__key){a, b};
}

static uint64_t slot_of(const mr__pool *p, mr__key k) { return (k.a ^ (k.b >> 7)) & p->cap_mask; }

static bool key_eq(mr__key x, mr__key y) { return x.a == y.a && x.b == y.b; }

static bool same_content(const mr__pool *p, int32_t b, mr__key key, mr__key parent, const int32_t *tokens) {
    return key_eq(p->key[b], key) && key_eq(p->parent[b], parent) &&
           !memcmp(p->btok + (size_t)b * MR_KV_BLOCK_TOKENS, tokens, MR_KV_BLOCK_TOKENS * sizeof(int32_t));
}

int32_t mr__pool_lookup(const mr__pool *p, mr__key key, mr__key parent, const int32_t *tokens) {
    for (uint64_t i = slot_of(p, key);; i = (i + 1) & p->cap_mask) {
        int32_t b = p->table[i];
        if (b < 0) return -1;
        if (same_content(p, b, key, parent, tokens)) return b;
    }
}

/* Removes block b from the table (backward-shift deletion). */
static void table_remove(mr__pool *p, int32_t b) {
    uint64_t i = slot_of(p, p->key[b]);
    while (p->table[i] != b) i = (i + 1) & p->cap_mask; /* b is in the table */
    uint64_t hole = i;
    for (uint64_t j = (hole + 1) & p->cap_mask; p->table[j] >= 0; j = (j + 1) & p->cap_mask) {
        uint64_t home = slot_of(p, p->key[p->table[j]]);
        /* move j into the hole unless its home lies cyclically in (hole, j] */
        bool stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            p->table[hole] = p->table[j];
            hole = j;
        }
    }
    p->table[hole] = -1;
    p->cached[b] = 0;
    p->n_cached--;
}

static void lru_unlink(mr__pool *p, int32_t b) {
    int32_t pr = p->lru_prev[b], nx = p->lru_next[b];
    if (pr >= 0) p->lru_next[pr] = nx; else p->lru_head = nx;
    if (nx >= 0) p->lru_prev[nx] = pr; else p->lru_tail = pr;
    p->lru_prev[b] = p->lru_next[b] = -1;
    p->n_lru--;
}

static void lru_append(mr__pool *p, int32_t b) {
    p->lru_prev[b] = p->lru_tail;
    p->lru_next[b] = -1;
    if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = b; else p->lru_head = b;
    p->lru_tail = b;
    p->n_lru++;
}

static void used_inc(mr__pool *p) {
    if (++p->n_used > p->peak_used) p->peak_used = p->n_used;
}

int32_t mr__pool_take(mr__pool *p) {
    int32_t b;
    if (p->n_free > 0) {
        b = p->free_stack[--p->n_free];
    } else if (p->lru_head >= 0) {
        b = p->lru_head; /* the least recently released cached block */
        lru_unlink(p, b);
        table_remove(p, b);
        p->evictions++;
    } else {
        return -1;
    }
    p->ref[b] = 1;
    used_inc(p);
    return b;
}

void mr__pool_ref(mr__pool *p, int32_t b) {
    MR_ASSERT(b >= 0 && b < p->n && (p->ref[b] > 0 || p->cached[b]));
    if (p->ref[b]++ == 0) {
        lru_unlink(p, b);
        used_inc(p);
    }
}

void mr__pool_release(mr__pool *p, int32_t b) {
    MR_ASSERT(b >= 0 && b < p->n && p->ref[b] > 0);
    if (--p->ref[b] > 0) return;
    p->n_used--;
    if (p->cached[b])
        lru_append(p, b);
    else
        p->free_stack[p->n_free++] = b;
}

bool mr__pool_register(mr__pool *p, int32_t b, mr__key key, mr__key parent, const int32_t *tokens) {
    MR_ASSERT(b >= 0 && b < p->n && p->ref[b] > 0 && !p->cached[b]);
    uint64_t i = slot_of(p, key);
    for (; p->table[i] >= 0; i = (i + 1) & p->cap_mask)
        if (key_eq(p->key[p->table[i]], key)) return false; /* this content is cached already */
    p->table[i] = b;
    p->cached[b] = 1;
    p->key[b] = key;
    p->parent[b] = parent;
    memcpy(p->btok + (size_t)b * MR_KV_BLOCK_TOKENS, tokens, MR_KV_BLOCK_TOKENS * sizeof(int32_t));
    p->n_cached++;
    return true;
}

int64_t mr__pool_flush(mr__pool *p) {
    MR_ASSERT(p->n_used == 0);
    const int64_t dropped = p->n_cached;
    for (uint64_t i = 0; i <= p->cap_mask; i++) p->table[i] = -1;
    for (int64_t i = 0; i < p->n; i++) {
        p->free_stack[i] = (int32_t)(p->n - 1 - i);
        p->lru_prev[i] = p->lru_next[i] = -1;
        p->cached[i] = 0;
    }
    p->n_free = p->n;
    p->lru_head = p->lru_tail = -1;
    p->n_lru = 0;
    p->n_cached = 0;
    return dropped;
}

mr_status mr__pool_check(const mr__pool *p) {
    int64_t used = 0, cached = 0, lru = 0, free_n = 0, in_table = 0;
    for (int64_t b = 0; b < p->n; b++) {
        if (p->ref[b] < 0) return mr_error_set(MR_ESTATE, "pool: block %lld has reference count %d", (long long)b, p->ref[b]);
        used += p->ref[b] > 0;
        cached += p->cached[b] != 0;
    }
    /* the free stack: distinct, unreferenced, not cached */
    for (int64_t i = 0; i < p->n_free; i++) {
        int32_t b = p->free_stack[i];
        if (b < 0 || b >= p->n || p->ref[b] != 0 || p->cached[b])
            return mr_error_set(MR_ESTATE, "pool: free stack entry %lld (block %d) is not a free block", (long long)i,
                                (int)b);
        free_n++;
    }
    /* the LRU list: cached and unreferenced, links consistent, length n_lru */
    int32_t prev = -1;
    for (int32_t b = p->lru_head; b >= 0; b = p->lru_next[b]) {
        if (++lru > p->n) return mr_error_set(MR_ESTATE, "pool: the LRU list has a cycle");
        if (p->ref[b] != 0 || !p->cached[b])
            return mr_error_set(MR_ESTATE, "pool: LRU block %d has %d references, cached %d", (int)b, p->ref[b],
                                p->cached[b]);
        if (p->lru_prev[b] != prev) return mr_error_set(MR_ESTATE, "pool: LRU block %d has a wrong back link", (int)b);
        prev = b;
    }
    if (prev != p->lru_tail) return mr_error_set(MR_ESTATE, "pool: the LRU tail is %d, the list ends at %d", p->lru_tail, prev);
    if (lru != p->n_lru) return mr_error_set(MR_ESTATE, "pool: %lld blocks on the LRU list, counted %lld", (long long)lru, (long long)p->n_lru);
    if (used != p->n_used) return mr_error_set(MR_ESTATE, "pool: %lld blocks referenced, counted %lld", (long long)used, (long long)p->n_used);
    if (used + lru + free_n != p->n)
        return mr_error_set(MR_ESTATE, "pool: %lld used + %lld cached-unreferenced + %lld free != %lld blocks",
                            (long long)used, (long long)lru, (long long)free_n, (long long)p->n);
    /* each unreferenced cached block is on the LRU list (by the count: lru cached-unreferenced blocks exist) */
    int64_t cached_unref = 0;
    for (int64_t b = 0; b < p->n; b++) cached_unref += p->cached[b] && p->ref[b] == 0;
    if (cached_unref != lru)
        return mr_error_set(MR_ESTATE, "pool: %lld cached unreferenced blocks, %lld on the LRU list", (long long)cached_unref,
                            (long long)lru);
    /* the table: every entry is a cached block reachable from its home slot, no block twice */
    for (uint64_t i = 0; i <= p->cap_mask; i++) {
        int32_t b = p->table[i];
        if (b < 0) continue;
        if (b >= p->n || !p->cached[b]) return mr_error_set(MR_ESTATE, "pool: table slot %llu holds block %d, not cached", (unsigned long long)i, (int)b);
        in_table++;
        if (mr__pool_lookup(p, p->key[b], p->parent[b], p->btok + (size_t)b * MR_KV_BLOCK_TOKENS) != b)
            return mr_error_set(MR_ESTATE, "pool: cached block %d is not found by its own key", (int)b);
    }
    if (in_table != cached || cached != p->n_cached)
        return mr_error_set(MR_ESTATE, "pool: %lld table entries, %lld blocks marked cached, counted %lld",
                            (long long)in_table, (long long)cached, (long long)p->n_cached);
    return MR_OK;
}
