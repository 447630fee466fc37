/* tokenizer_util.c — the small pieces the tokenizer shares: scratch buffers,
 * UTF-8 (validation with maximal-subpart replacement, as Python's
 * errors="replace" and Rust's from_utf8_lossy do), Unicode White_Space, the
 * ByteLevel byte <-> char map, byte-string hashing, the string -> id map and
 * the byte trie that finds added tokens leftmost-longest. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_internal.h"

void mr_tok_ids_free(mr_tok_ids *v) {
    if (!v) return;
    mr_free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

mr_status mr__tok_ids_push(mr_tok_ids *v, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64, bytes;
        if (!mr_size_mul(cap, sizeof(int32_t), &bytes)) return mr_error_set(MR_EOVERFLOW, "too many token ids");
        int32_t *p = mr_realloc(v->ids, bytes);
        if (!p) return MR_ENOMEM;
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
    return MR_OK;
}

/* ---- UTF-8 ---- */
int mr__utf8_seq(const unsigned char *s, size_t n, size_t *bad, bool *trunc) {
    *trunc = false;
    *bad = 1;
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int len;
    unsigned lo = 0x80, hi = 0xBF; /* range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    for (int k = 1; k < len; k++) {
        if ((size_t)k >= n) {
            *bad = (size_t)k;
            *trunc = true;
            return 0;
        }
        unsigned b = s[k];
        unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h) {
            *bad = (size_t)k;
            return 0;
        }
    }
    return len;
}

size_t mr_utf8_check(const char *s, size_t len) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        /* ASCII fast path: 8 bytes at a time */
        while (i + 8 <= len) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= len) break;
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        size_t bad;
        bool trunc;
        int l = mr__utf8_seq(p + i, len - i, &bad, &trunc);
        if (!l) return i;
        i += (size_t)l;
    }
    return len;
}

mr_status mr__utf8_lossy(const char *s, size_t n, bool final, mr__buf *out, size_t *used) {
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, run = 0; /* run: start of the valid stretch not yet copied */
    mr_status st;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        size_t bad;
        bool trunc;
        int l = mr__utf8_seq(p + i, n - i, &bad, &trunc);
        if (l) {
            i += (size_t)l;
            continue;
        }
        if ((st = mr__buf_put(out, s + run, i - run))) return st;
        if (trunc && !final) {
            *used = i;
            return MR_OK;
        }
        if ((st = mr__buf_put(out, fffd, 3))) return st;
        i += bad;
        run = i;
    }
    if ((st = mr__buf_put(out, s + run, n - run))) return st;
    *used = n;
    return MR_OK;
}


bool mr__is_white_space(int32_t c) {
    /* PropList.txt White_Space */
    if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
    if (c < 0x85) return false;
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ---- ByteLevel map: printable Latin-1 bytes map to themselves, the other
 * 68 bytes, in increasing order, to U+0100 + n ---- */
static uint16_t bytemap[256];
static int16_t cpmap[0x144];
static pthread_once_t bytemap_once = PTHREAD_ONCE_INIT;

static void bytemap_init(void) {
    int n = 0;
    for (int i = 0; i < 0x144; i++) cpmap[i] = -1;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        bytemap[b] = (uint16_t)(keep ? b : 256 + n++);
        cpmap[bytemap[b]] = (int16_t)b;
    }
}

const uint16_t *mr__bytemap(void) {
    pthread_once(&bytemap_once, bytemap_init);
    return bytemap;
}

int mr__cp_to_byte(int32_t cp) {
    pthread_once(&bytemap_once, bytemap_init);
    return cp >= 0 && cp < 0x144 ? cpmap[cp] : -1;
}

/* ---- hashing: 8 bytes at a time, multiply-xorshift mixing ---- */
static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 32;
    return x;
}

uint64_t mr__hash_bytes(const char *s, size_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
        h ^= h >> 29;
    }
    if (i < n) {
        uint64_t w = 0;
        memcpy(&w, s + i, n - i);
        h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    }
    return mix64(h);
}

int32_t mr__strmap_get(const mr__strmap *m, const char *s, size_t n) {
    if (!m->slots) return -1;
    uint64_t h = mr__hash_bytes(s, n);
    uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = (size_t)h & m->mask;; i = (i + 1) & m->mask) {
        uint64_t v = m->slots[i];
        if (!v) return -1;
        if ((uint32_t)(v >> 32) != tag) continue;
        uint32_t idx = (uint32_t)v - 1;
        if (m->key_lens[idx] == n && !memcmp(m->keys[idx], s, n)) return (int32_t)idx;
    }
}

/* ---- trie ---- */
typedef struct {
    int32_t parent;
    unsigned char byte;
} trie_tmp;

void mr__trie_free(mr__trie *tr) {
    mr_free(tr->nodes);
    mr_free(tr->edges);
    mr_free(tr->pattern_id);
    memset(tr, 0, sizeof *tr);
}

/* Builds a trie from n patterns: insertion into a simple child-list form,
 * then edges packed per node and sorted by byte. An empty pattern is skipped
 * (HF never matches empty tokens); the first of equal patterns wins, as
 * Aho-Corasick's leftmost-longest does. */
mr_status mr__trie_build(mr__trie *tr, const char *const *pats, const uint32_t *lens, const int32_t *ids, size_t n) {
    mr_status st = MR_OK;
    memset(tr, 0, sizeof *tr);
    size_t total = 1;
    for (size_t i = 0; i < n; i++)
        if (!mr_size_add(total, lens[i], &total)) return mr_error_set(MR_EOVERFLOW, "added tokens too long");
    if (total > INT32_MAX / 2) return mr_error_set(MR_EUNSUPPORTED, "added tokens too long (%zu bytes)", total);
    /* temporary: per node first-child / next-sibling lists */
    int32_t *first = mr_malloc(total * sizeof(int32_t));
    int32_t *next = mr_malloc(total * sizeof(int32_t));
    unsigned char *byte = mr_malloc(total);
    tr->nodes = mr_malloc(total * sizeof(mr__trie_node));
    tr->edges = mr_malloc(total * sizeof(mr__trie_edge));
    tr->pattern_id = mr_malloc((n ? n : 1) * sizeof(int32_t));
    if (!first || !next || !byte || !tr->nodes || !tr->edges || !tr->pattern_id) {
        st = MR_ENOMEM;
        goto out;
    }
    size_t nn = 1;
    first[0] = -1;
    next[0] = -1;
    tr->nodes[0].pattern = -1;
    for (size_t i = 0; i < n; i++) {
        tr->pattern_id[i] = ids[i];
        if (!lens[i]) continue;
        int32_t cur = 0;
        for (uint32_t k = 0; k < lens[i]; k++) {
            unsigned char c = (unsigned char)pats[i][k];
            int32_t ch = first[cur];
            while (ch >= 0 && byte[ch] != c) ch = next[ch];
            if (ch < 0) {
                ch = (int32_t)nn++;
                byte[ch] = c;
                first[ch] = -1;
                next[ch] = first[cur];
                first[cur] = ch;
                tr->nodes[ch].pattern = -1;
            }
            cur = ch;
        }
        if (tr->nodes[cur].pattern < 0) tr->nodes[cur].pattern = (int32_t)i;
        tr->first[(unsigned char)pats[i][0] >> 3] |= (uint8_t)(1u << ((unsigned char)pats[i][0] & 7));
    }
    tr->n_nodes = nn;
    tr->n_patterns = n;
    /* pack edges: node by node, sorted by byte (insertion sort: few children) */
    int32_t e = 0;
    for (size_t v = 0; v < nn; v++) {
        tr->nodes[v].child_base = e;
        int32_t cnt = 0;
        for (int32_t ch = first[v]; ch >= 0; ch = next[ch]) {
            mr__trie_edge ed = {byte[ch], ch};
            int32_t j = e + cnt;
            while (j > e && tr->edges[j - 1].byte > ed.byte) {
                tr->edges[j] = tr->edges[j - 1];
                j--;
            }
            tr->edges[j] = ed;
            cnt++;
        }
        tr->nodes[v].n_edges = cnt;
        e += cnt;
    }
out:
    mr_free(first);
    mr_free(next);
    mr_free(byte);
    if (st) mr__trie_free(tr);
    return st;
}

size_t mr__trie_longest(const mr__trie *tr, const unsigned char *s, size_t n, int32_t *id) {
    if (!tr->nodes || !n || !(tr->first[s[0] >> 3] & (1u << (s[0] & 7)))) return 0;
    size_t best = 0;
    int32_t cur = 0;
    for (size_t k = 0; k < n; k++) {
        const mr__trie_node *nd = &tr->nodes[cur];
        int32_t lo = nd->child_base, hi = nd->child_base + nd->n_edges, found = -1;
        while (lo < hi) {
            int32_t mid = (lo + hi) / 2;
            if (tr->edges[mid].byte < s[k]) lo = mid + 1;
            else hi = mid;
        }
        if (lo < nd->child_base + nd->n_edges && tr->edges[lo].byte == s[k]) found = tr->edges[lo].node;
        if (found < 0) break;
        cur = found;
        if (tr->nodes[cur].pattern >= 0) {
            best = k + 1;
            *id = tr->pattern_id[tr->nodes[cur].pattern];
        }
    }
    return best;
}
