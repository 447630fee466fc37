/* tokenizer_internal.h — private to src/text/tokenizer*.c: the loaded
 * tokenizer's parts (normalizer steps, pre-tokenizer steps, BPE model, added
 * tokens, post-processor, decoder) and the helpers shared between the
 * loader, the encoder and the decoder. Semantics follow huggingface/tokenizers
 * (shared/spec/text.md §1); each part's file says which of its rules it
 * mirrors. */
#ifndef MR_TEXT_TOKENIZER_INTERNAL_H
#define MR_TEXT_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moerun/base.h"
#include "moerun/text.h"
#include "text/textutil.h"

/* Pre-tokenizer steps after Sequences are flattened. */
#define MR__MAX_PRE 8
/* Ids above this are refused at load: the id -> token table is dense. */
#define MR__TOK_MAX_ID ((int32_t)(1 << 24))


/* ---- UTF-8 ---- */
/* Length of the valid sequence at s[0, n): 1..4, or 0 when s starts an
 * invalid or truncated sequence; *bad gets the length of the maximal subpart
 * to replace (>= 1), *trunc whether the sequence was only cut short by n. */
int mr__utf8_seq(const unsigned char *s, size_t n, size_t *bad, bool *trunc);
/* Appends the lossy conversion of s[0, n) to out (U+FFFD per maximal
 * invalid subpart). With final == false an incomplete tail is not converted:
 * *used tells how many bytes were consumed. */
mr_status mr__utf8_lossy(const char *s, size_t n, bool final, mr__buf *out, size_t *used);
bool mr__is_white_space(int32_t cp); /* Unicode White_Space (Rust char::is_whitespace) */

/* ---- regex (PCRE2, from Oniguruma/HF syntax) ---- */
typedef struct {
    pcre2_code *code;
    bool jit;
} mr__regex;
/* Compiles an HF tokenizer regex (Oniguruma syntax, as tokenizers runs it)
 * translated to PCRE2 (UTF + UCP, JIT); literal: the pattern is a plain
 * string. what names the field for errors. */
mr_status mr__regex_compile(mr__regex *re, const char *pat, size_t len, bool literal, const char *what);
void mr__regex_free(mr__regex *re);
/* Oniguruma's find_iter over s[0, n): calls fn(start, end, ctx) for every
 * match, skipping an empty match right after the previous match. fn returns
 * non-zero to stop with that status. md: match data from the caller. */
typedef mr_status (*mr__match_fn)(size_t start, size_t end, void *ctx);
mr_status mr__regex_each(const mr__regex *re, pcre2_match_data *md, const char *s, size_t n, mr__match_fn fn,
                         void *ctx);
/* Exported for the tests: the PCRE2 text an HF regex becomes. */
mr_status mr__regex_translate(const char *pat, size_t len, mr__buf *out);

/* ---- normalizers ---- */
typedef enum {
    MR__NORM_NFC,
    MR__NORM_NFD,
    MR__NORM_NFKC,
    MR__NORM_NFKD,
    MR__NORM_LOWERCASE,
    MR__NORM_REPLACE,
    MR__NORM_PREPEND,
    MR__NORM_STRIP,
    MR__NORM_STRIP_ACCENTS,
} mr__norm_kind;

typedef struct {
    mr__norm_kind kind;
    mr__regex re;       /* REPLACE */
    char *str;          /* REPLACE: content; PREPEND: prepend */
    size_t str_len;
    bool left, right;   /* STRIP */
} mr__norm_step;

/* ---- pre-tokenizers ---- */
typedef enum {
    MR__SPLIT_REMOVED,
    MR__SPLIT_ISOLATED,
    MR__SPLIT_MERGED_PREV,
    MR__SPLIT_MERGED_NEXT,
    MR__SPLIT_CONTIGUOUS,
} mr__split_behavior;

typedef enum { MR__PRE_SPLIT, MR__PRE_BYTELEVEL } mr__pre_kind;

typedef struct {
    mr__pre_kind kind;
    mr__regex re;                /* SPLIT; BYTELEVEL with use_regex: the GPT-2 regex */
    mr__split_behavior behavior; /* SPLIT */
    bool invert;                 /* SPLIT */
    bool add_prefix_space;       /* BYTELEVEL */
    bool use_regex;              /* BYTELEVEL */
} mr__pre_step;

/* ---- hash map: byte string -> int32 (open addressing, keys in an arena) ---- */
typedef struct {
    uint64_t *slots; /* hash (high 32) | index+1 (low 32); 0 = empty */
    size_t mask;
    const char *const *keys; /* the caller's key table: keys[index], key_lens[index] */
    const uint32_t *key_lens;
} mr__strmap;

/* ---- BPE cache: piece bytes -> ids, sharded, locked, bounded ---- */
#define MR__CACHE_SHARDS 16
typedef struct {
    pthread_mutex_t lock;
    uint32_t *slots;   /* offset+1 into arena of an entry; 0 empty */
    size_t mask, used; /* used: occupied slots */
    char *arena;       /* entries: u32 hash, u16 key_len, u16 n_ids, key bytes, pad, i32 ids[] */
    size_t arena_n, arena_cap;
} mr__cache_shard;

/* ---- added tokens ---- */
typedef struct {
    const char *content; /* in the tokenizer's arena */
    uint32_t len;
    int32_t id;
    bool special, normalized, lstrip, rstrip, single_word;
} mr__added;

/* Byte trie for leftmost-longest matching. */
typedef struct {
    int32_t child_base; /* first edge index in edges[], -1 none */
    int32_t n_edges;
    int32_t pattern;    /* index into the pattern list, -1 none */
} mr__trie_node;
typedef struct {
    unsigned char byte;
    int32_t node;
} mr__trie_edge;
typedef struct {
    mr__trie_node *nodes;
    mr__trie_edge *edges; /* per node, sorted by byte */
    size_t n_nodes;
    int32_t *pattern_id;  /* pattern -> token id */
    size_t n_patterns;
    uint8_t first[32];    /* bitmap of first bytes */
} mr__trie;

/* ---- decoder ---- */
typedef enum { MR__DEC_NONE, MR__DEC_BYTELEVEL } mr__dec_kind;

struct mr_tokenizer {
    /* vocabulary: id -> token string (NULL hole), and string -> id */
    int32_t id_limit;
    size_t n_tokens;      /* distinct strings, model + added */
    const char **id_str;  /* [id_limit] */
    uint32_t *id_len;     /* [id_limit] */
    const char **id_bytes; /* [id_limit] decoded bytes of each token */
    uint32_t *id_bytes_len;
    uint8_t *id_special;  /* [id_limit] */

    /* model (BPE) */
    const char **vocab_keys; /* [n_vocab] */
    uint32_t *vocab_lens;
    int32_t *vocab_ids;
    size_t n_vocab;
    mr__strmap vocab;
    uint64_t *merge_slots; /* pair (a<<32|b) hash table -> (rank, new_id) */
    uint64_t *merge_keys;
    size_t merge_mask, n_merges;
    int32_t byte_sym[256]; /* ByteLevel fast path: id of the symbol of byte b, or -1 */
    bool byte_sym_ok;      /* no prefix/suffix: byte_sym usable */
    char *unk;             /* unk_token or NULL */
    int32_t unk_id;        /* -1: absent from the vocab */
    char *cont_prefix, *eow_suffix;
    size_t cont_prefix_len, eow_suffix_len;
    bool fuse_unk, byte_fallback, ignore_merges;
    int32_t byte_fallback_id[256];

    /* pipeline */
    mr__norm_step *norm;
    size_t n_norm;
    mr__pre_step pre[MR__MAX_PRE];
    size_t n_pre;
    bool bytelevel_last; /* the last pre-tokenizer step is ByteLevel: map at the model */

    /* added tokens */
    mr__added *added; /* map_r: one per distinct content, latest flags */
    size_t n_added;
    const char **added_keys; /* [n_added] contents, for added_map */
    uint32_t *added_lens;
    mr__strmap added_map;    /* content -> index into added[] */
    int32_t *id_added;       /* [id_limit] index into added[], or -1 */
    mr__trie raw_trie, norm_trie;
    bool need_word_re;
    mr__regex word_re; /* Rust regex \w, for single_word */

    /* post-processor: ids around the sequence when add_special_tokens */
    int32_t *post_prefix, *post_suffix;
    size_t n_post_prefix, n_post_suffix;

    mr__dec_kind decoder;
    int32_t role_id[MR_TOK_ROLE_COUNT];

    mr__cache_shard cache[MR__CACHE_SHARDS];

    char *arena; /* every token string and decoded byte string */
    size_t arena_n, arena_cap;
    char describe[512];
};

/* loader pieces */
mr_status mr__tok_arena_put(mr_tokenizer *t, const char *s, size_t n, const char **out);
int32_t mr__strmap_get(const mr__strmap *m, const char *s, size_t n);
uint64_t mr__hash_bytes(const char *s, size_t n);

/* encoder pieces */
mr_status mr__norm_apply(const mr_tokenizer *t, pcre2_match_data *md, const char *s, size_t n, mr__buf *out,
                         mr__buf *scratch);
mr_status mr__bpe_encode(const mr_tokenizer *t, const char *piece, size_t n, bool mapped, mr_tok_ids *out);
void mr__cache_init(mr_tokenizer *t);
void mr__cache_free(mr_tokenizer *t);
mr_status mr__tok_ids_push(mr_tok_ids *v, int32_t id);
int32_t mr__merge_get(const mr_tokenizer *t, int32_t a, int32_t b, int32_t *new_id);

/* added-token trie */
mr_status mr__trie_build(mr__trie *tr, const char *const *pats, const uint32_t *lens, const int32_t *ids, size_t n);
void mr__trie_free(mr__trie *tr);
/* Longest pattern starting at s[0, n): returns its length (0 none) and its id. */
size_t mr__trie_longest(const mr__trie *tr, const unsigned char *s, size_t n, int32_t *id);

/* ByteLevel byte <-> char map (shared/spec/text.md §1.4) */
const uint16_t *mr__bytemap(void); /* [256]: byte -> code point */
int mr__cp_to_byte(int32_t cp);     /* -1 when cp is no byte's char */

#endif
