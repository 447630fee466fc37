/* moerun/text.h — the tokenizer: Hugging Face tokenizer.json (byte-level BPE
 * and its relatives) read into an immutable object that encodes text to token
 * ids and decodes ids back to text. Semantics: shared/spec/text.md §1–2; the
 * oracle is the PyPI `tokenizers` package (tests/data/text/, written by
 * tools/golden/gen_tokenizers.py).
 *
 * Encoding, in order: added tokens split the raw text (leftmost-longest;
 * `normalized`, `lstrip`, `rstrip`, `single_word` honoured), the normalizer
 * runs on each gap, the pre-tokenizer splits it into pieces, the model (BPE)
 * turns each piece into ids, the post-processor adds BOS/EOS when asked.
 * What is supported is decided at load: anything else in the file (an unknown
 * normalizer, pre-tokenizer, model, decoder or post-processor, a bad regex,
 * a merge whose tokens are not in the vocabulary) is refused there with an
 * error that names it, never at encode time.
 *
 * Threads: a loaded mr_tokenizer is read-only except for its internal BPE
 * cache, which is locked; any number of threads may encode and decode with
 * one tokenizer at once. An mr_tokstream belongs to one thread at a time.
 *
 * Lifetimes: mr_tokenizer_load/mr_tokenizer_free; mr_tok_ids is the
 * caller's (mr_tok_ids_free releases its buffer); mr_tokstream_new/
 * mr_tokstream_free. Strings returned by lookups live as long as the
 * tokenizer. */
#ifndef MOERUN_TEXT_H
#define MOERUN_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moerun/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mr_tokenizer mr_tokenizer;

/* ---- loading ----
 * path: a model folder (reads DIR/tokenizer.json, and DIR/tokenizer_config.json
 * when present for the names of the BOS/EOS/PAD/UNK tokens) or the path of a
 * tokenizer.json itself. Errors: MR_EIO (missing or unreadable file),
 * MR_EFORMAT (bad JSON, bad field types, merges naming unknown tokens),
 * MR_EUNSUPPORTED (a component moerun does not implement, named in the
 * detail), MR_ENOMEM. */
mr_status mr_tokenizer_load(const char *path, mr_tokenizer **out);
/* The same from tokenizer.json text in memory (len bytes, need not be
 * NUL-terminated); config_json (tokenizer_config.json text) may be NULL. */
mr_status mr_tokenizer_load_json(const char *json, size_t len, const char *config_json, size_t config_len,
                                 mr_tokenizer **out);
void mr_tokenizer_free(mr_tokenizer *t); /* NULL is fine */

/* ---- encoding ---- */
typedef struct {
    int32_t *ids; /* [n] */
    size_t n, cap;
} mr_tok_ids;
void mr_tok_ids_free(mr_tok_ids *v); /* frees v->ids, zeroes *v */

enum {
    /* Run the post-processor: BOS/EOS as the file's template says
     * (HF add_special_tokens=True). */
    MR_TOK_ADD_SPECIAL = 1u << 0,
    /* Replace each invalid UTF-8 sequence in the input by U+FFFD (maximal
     * subparts, as Python's errors="replace") instead of failing. */
    MR_TOK_REPLACE_INVALID = 1u << 1,
    /* Special tokens written in the text are encoded as ordinary text, never
     * as their ids (HF encode_special_tokens=True): for untrusted content. */
    MR_TOK_SPLIT_SPECIAL = 1u << 2,
};

/* Appends the ids of text[0, len) to out (out->n grows; reuse one mr_tok_ids
 * across calls to avoid allocation). Invalid UTF-8 without
 * MR_TOK_REPLACE_INVALID: MR_EINPUT, detail "invalid UTF-8 at byte offset N",
 * *bad_offset = N when bad_offset is not NULL; out is left as it was.
 * Thread-safe. */
mr_status mr_tokenizer_encode(const mr_tokenizer *t, const char *text, size_t len, unsigned flags, mr_tok_ids *out,
                              size_t *bad_offset);

/* First invalid UTF-8 byte offset of s[0, len), or len when it is valid. */
size_t mr_utf8_check(const char *s, size_t len);

/* ---- decoding ----
 * Decodes ids into *text (malloc'd, NUL-terminated, *text_len bytes without
 * the NUL; free with mr_free). Bytes that do not form valid UTF-8 become
 * U+FFFD, as HF's decode does. skip_special drops special tokens (HF
 * skip_special_tokens). An id that names no token: MR_ERANGE naming it. */
mr_status mr_tokenizer_decode(const mr_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, char **text,
                              size_t *text_len);

/* Streaming decode: push ids one (or a few) at a time, get back the text that
 * is complete so far. An incomplete UTF-8 tail is held back until the bytes
 * that complete it arrive (or flush turns it into U+FFFD). The concatenation
 * of every push and the final flush equals mr_tokenizer_decode of all ids. */
typedef struct mr_tokstream mr_tokstream;
mr_status mr_tokstream_new(const mr_tokenizer *t, bool skip_special, mr_tokstream **out);
void mr_tokstream_free(mr_tokstream *s); /* NULL is fine */
/* *out points at the new text (*out_len bytes, NUL-terminated, possibly
 * empty), valid until the next call on s. */
mr_status mr_tokstream_push(mr_tokstream *s, const int32_t *ids, size_t n, const char **out, size_t *out_len);
/* Ends the stream: the held-back tail (if any) as U+FFFD; s is reset and
 * may be reused. */
mr_status mr_tokstream_flush(mr_tokstream *s, const char **out, size_t *out_len);

/* ---- vocabulary ---- */
/* One more than the largest id (ids are in [0, id_limit)); a model's
 * embedding table must have at least this many rows. */
int32_t mr_tokenizer_id_limit(const mr_tokenizer *t);
/* Number of distinct tokens (model vocabulary plus added tokens), as HF
 * get_vocab_size(with_added_tokens=True). */
size_t mr_tokenizer_vocab_size(const mr_tokenizer *t);
/* The model's vocabulary without the added tokens, as HF's vocab_size (what
 * sglang's and vLLM's random benchmark prompts draw ids from). */
size_t mr_tokenizer_model_vocab_size(const mr_tokenizer *t);
/* The token's string as the file spells it ("Ġhello", "<think>"), or NULL
 * for an id that names no token. *len may be NULL. */
const char *mr_tokenizer_id_to_piece(const mr_tokenizer *t, int32_t id, size_t *len);
/* The bytes that this one token decodes to (ByteLevel: "Ġhello" -> " hello";
 * may be an incomplete UTF-8 sequence), or NULL for an unknown id. */
const char *mr_tokenizer_id_to_bytes(const mr_tokenizer *t, int32_t id, size_t *len);
/* Exact lookup of a token string (vocabulary or added token); -1 if none. */
int32_t mr_tokenizer_piece_to_id(const mr_tokenizer *t, const char *piece, size_t len);
/* Whether id is a special added token (skipped by skip_special). */
bool mr_tokenizer_is_special(const mr_tokenizer *t, int32_t id);

/* Named special tokens, from tokenizer_config.json (bos_token, eos_token,
 * pad_token, unk_token) or the model's unk_token; -1 when the file names
 * none or names a string that is no token. */
typedef enum { MR_TOK_BOS = 0, MR_TOK_EOS, MR_TOK_PAD, MR_TOK_UNK, MR_TOK_ROLE_COUNT } mr_tok_role;
int32_t mr_tokenizer_special_id(const mr_tokenizer *t, mr_tok_role role);

/* One line describing the pipeline, e.g. "normalizer NFC, pre-tokenizer
 * Sequence[Split(regex, Isolated), ByteLevel], model BPE (200000 tokens,
 * 199744 merges), 64 added tokens, decoder ByteLevel". */
const char *mr_tokenizer_describe(const mr_tokenizer *t);

#ifdef __cplusplus
}
#endif
#endif
