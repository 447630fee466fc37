/* moerun/io.h — safetensors reader and writer, sharded checkpoints, atomic
 * file writes. Format and validation rules: shared/spec/safetensors.md.
 *
 * A safetensors file is
 *
 *     [0, 8)        N, u64 little-endian
 *     [8, 8+N)      UTF-8 JSON object (padded with spaces):
 *                   {"__metadata__": {"k": "v", ...},
 *                    "name": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [b, e]}, ...}
 *     [8+N, end)    data buffer; a tensor's bytes are [8+N+b, 8+N+e), little-endian, C order
 *
 * Reading maps the file read-only and validates the header only: data pages
 * are never touched while opening, so opening a sparse 40 GB checkpoint costs
 * milliseconds. Tensor data pointers point into the mapping and have NO
 * alignment guarantee (a tensor may begin at any byte): read them with memcpy
 * or unaligned loads, or copy them into aligned buffers.
 *
 * Lifetimes: mr_st_open/mr_st_close, mr_ckpt_open/mr_ckpt_close,
 * mr_st_writer_new/mr_st_writer_free. Tensor descriptors and their names,
 * shapes and data stay valid until the file (or checkpoint) that returned them
 * is closed. */
#ifndef MOERUN_IO_H
#define MOERUN_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moerun/base.h"
#include "moerun/formats.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- dtypes ----
 * Declared in the order of the reference implementation's Dtype enum
 * (huggingface/safetensors): its writer sorts tensors by this order,
 * descending, then by name, and so does ours. Never renumber. */
typedef enum {
    MR_ST_BOOL = 0,
    MR_ST_F4,          /* FP4 E2M1, 4 bits, two per byte */
    MR_ST_F6_E2M3,     /* 6 bits */
    MR_ST_F6_E3M2,     /* 6 bits */
    MR_ST_U8,
    MR_ST_I8,
    MR_ST_F8_E5M2,
    MR_ST_F8_E4M3,     /* E4M3FN (OCP) */
    MR_ST_F8_E8M0,     /* exponent-only scale (MX) */
    MR_ST_F8_E4M3FNUZ, /* AMD: different bias and NaN; refused by the reader */
    MR_ST_F8_E5M2FNUZ, /* AMD: different bias and NaN; refused by the reader */
    MR_ST_I16,
    MR_ST_U16,
    MR_ST_F16,
    MR_ST_BF16,
    MR_ST_I32,
    MR_ST_U32,
    MR_ST_F32,
    MR_ST_C64, /* complex of two f32 */
    MR_ST_F64,
    MR_ST_I64,
    MR_ST_U64,
    MR_ST_DTYPE_COUNT
} mr_st_dtype;

/* "BF16", "F8_E4M3", ...; NULL if out of range. */
const char *mr_st_dtype_name(mr_st_dtype dt);
/* Bits per element (F4: 4, F6_*: 6, BF16: 16, C64: 64); 0 if out of range. */
int mr_st_dtype_bits(mr_st_dtype dt);
/* Exact, case-sensitive lookup of a dtype string. MR_ENOTFOUND if unknown. */
mr_status mr_st_dtype_from_name(const char *name, mr_st_dtype *out);
/* The mr_format whose elements this dtype stores (F32, F16, BF16, F8_E4M3 ->
 * MR_FMT_E4M3, F8_E5M2 -> MR_FMT_E5M2, F4 -> MR_FMT_E2M1); false if none. */
bool mr_st_dtype_to_format(mr_st_dtype dt, mr_format *out);

/* ---- one safetensors file ---- */
typedef struct mr_st_file mr_st_file;

typedef struct {
    const char *name;
    mr_st_dtype dtype;
    int ndim;              /* 0 for a scalar */
    const int64_t *shape;  /* [ndim], each >= 0 */
    uint64_t n_elements;   /* product of shape (1 for a scalar) */
    uint64_t n_bytes;      /* end - begin */
    uint64_t offset;       /* absolute byte offset of the data in the file */
    const void *data;      /* into the mapping; UNALIGNED (see above); never NULL */
    const mr_st_file *file;
} mr_st_tensor;

/* Maps path read-only and validates it (spec rules 1-8, in order). On error
 * returns MR_EFORMAT (bad file), MR_EUNSUPPORTED (FNUZ dtypes, integers above
 * 2^63-1), MR_EIO / MR_ENOTFOUND (cannot open) or MR_ENOMEM, with a detail
 * naming the file, the tensor if any and the rule; *out is then NULL. */
mr_status mr_st_open(const char *path, mr_st_file **out);
/* Validates a whole file image held in memory (the same code mr_st_open
 * runs). buf must stay valid and unchanged until mr_st_close; it is not
 * freed. name is used in messages and as the file's path. */
mr_status mr_st_parse(const void *buf, size_t len, const char *name, mr_st_file **out);
void mr_st_close(mr_st_file *f); /* accepts NULL */

const char *mr_st_file_path(const mr_st_file *f); /* as given to open/parse */
/* Short name for listings: the name the index gives, else the last path component. */
const char *mr_st_file_name(const mr_st_file *f);
uint64_t mr_st_file_size(const mr_st_file *f);
uint64_t mr_st_header_size(const mr_st_file *f); /* N */

/* Tensors in name order (bytewise). */
size_t mr_st_count(const mr_st_file *f);
const mr_st_tensor *mr_st_tensor_at(const mr_st_file *f, size_t i); /* NULL if i >= count */
const mr_st_tensor *mr_st_find(const mr_st_file *f, const char *name); /* NULL if absent; sets no error */

/* __metadata__ entries in key order. */
size_t mr_st_metadata_count(const mr_st_file *f);
bool mr_st_metadata_at(const mr_st_file *f, size_t i, const char **key, const char **value);
const char *mr_st_metadata(const mr_st_file *f, const char *key); /* NULL if absent */

/* ---- writer ----
 * Tensors are referenced, not copied: their data must stay valid until
 * mr_st_writer_write returns. The file gets a compact JSON header padded with
 * spaces to a multiple of 8, "__metadata__" with {"format": "pt"} plus the
 * user's entries (keys sorted), and tensors sorted by dtype (mr_st_dtype
 * order, descending) then name — the reference writer's layout. */
typedef struct mr_st_writer mr_st_writer;

mr_status mr_st_writer_new(mr_st_writer **out);
void mr_st_writer_free(mr_st_writer *w); /* accepts NULL */
/* Adds a tensor of nbytes = product(shape) * bits / 8 bytes at data (which
 * may be NULL only when that is 0). Names must be valid UTF-8, non-empty,
 * unique and not "__metadata__"; FNUZ dtypes are refused. */
mr_status mr_st_writer_add(mr_st_writer *w, const char *name, mr_st_dtype dtype, const int64_t *shape, int ndim,
                           const void *data);
/* Sets (or replaces) a metadata entry; "format" defaults to "pt". UTF-8 only. */
mr_status mr_st_writer_set_metadata(mr_st_writer *w, const char *key, const char *value);
/* Writes to "<path>.tmp.XXXXXX", fsyncs, then renames onto path. On any
 * failure no file is left (neither path nor the temp file) and path is
 * unchanged. The writer can be written again. */
mr_status mr_st_writer_write(mr_st_writer *w, const char *path);

/* Writes len bytes to path the same atomic way (temp, fsync, rename). */
mr_status mr_write_file_atomic(const char *path, const void *data, size_t len);

/* ---- checkpoints: one file, a folder, or a sharded index ----
 * mr_ckpt_open accepts
 *   - a folder holding model.safetensors.index.json (preferred) or model.safetensors;
 *   - a path ending in ".json": a model.safetensors.index.json;
 *   - any other path: a single safetensors file.
 * With an index, only the files it names are opened (each once); file names
 * are relative to the index's folder and must not be absolute or contain a
 * ".." component. Each tensor is bound to the file the index names, even if
 * other shards also hold a tensor of that name; a tensor the index names but
 * its file lacks is an error. Tensors present in a shard but absent from the
 * index are not part of the checkpoint. */
typedef struct mr_ckpt mr_ckpt;

mr_status mr_ckpt_open(const char *path, mr_ckpt **out);
void mr_ckpt_close(mr_ckpt *c); /* accepts NULL */

bool mr_ckpt_is_sharded(const mr_ckpt *c);   /* opened through an index */
const char *mr_ckpt_path(const mr_ckpt *c);  /* the index or file actually opened */
size_t mr_ckpt_file_count(const mr_ckpt *c);
const mr_st_file *mr_ckpt_file_at(const mr_ckpt *c, size_t i); /* in order of their names */
/* Tensors in name order (bytewise), across all files. */
size_t mr_ckpt_count(const mr_ckpt *c);
const mr_st_tensor *mr_ckpt_tensor_at(const mr_ckpt *c, size_t i);
const mr_st_tensor *mr_ckpt_find(const mr_ckpt *c, const char *name); /* NULL if absent; sets no error */

/* ---- the HF tensor names of a MiniMax-M2 checkpoint (the one map: io/hfnames.c) ----
 * A tensor is "<module>.<suffix>": the module of a kind (for layer L and
 * expert E where the kind has them) and a suffix, "weight" unless the kind
 * says otherwise (linear modules also carry their format's companions,
 * "weight_scale_inv", "weight_scale", ...: formats/ traits):
 *   model.embed_tokens  model.norm  lm_head
 *   model.layers.L.input_layernorm  model.layers.L.post_attention_layernorm
 *   model.layers.L.self_attn.{q,k,v,o}_proj  model.layers.L.self_attn.{q,k}_norm
 *   model.layers.L.block_sparse_moe.gate
 *   model.layers.L.block_sparse_moe (suffix e_score_correction_bias)
 *   model.layers.L.block_sparse_moe.experts.E.{w1,w3,w2}
 * The loader, quantize and gen-tiny name and recognise tensors through it. */
typedef enum {
    MR_HF_EMBED = 0,
    MR_HF_FINAL_NORM,
    MR_HF_LM_HEAD,
    MR_HF_ATTN_NORM,
    MR_HF_FFN_NORM,
    MR_HF_Q_PROJ,
    MR_HF_K_PROJ,
    MR_HF_V_PROJ,
    MR_HF_O_PROJ,
    MR_HF_Q_NORM,
    MR_HF_K_NORM,
    MR_HF_ROUTER,
    MR_HF_ROUTER_BIAS,
    MR_HF_EXPERT_W1, /* gate */
    MR_HF_EXPERT_W3, /* up */
    MR_HF_EXPERT_W2, /* down */
    MR_HF_COUNT
} mr_hf_tensor;
/* Writes "<module>.<suffix>" of kind t into buf (suffix NULL: the kind's
 * own, "weight" for most; "" : the module alone). layer / expert are used
 * where the kind has them. Returns false if it does not fit n bytes. */
bool mr_hf_name(mr_hf_tensor t, int layer, int expert, const char *suffix, char *buf, size_t n);
/* Is the kind a linear module (quantizable: a format's tensors under it)? */
bool mr_hf_is_linear(mr_hf_tensor t);
bool mr_hf_is_expert(mr_hf_tensor t);
/* Parses a tensor name: its kind, layer and expert (-1 where the kind has
 * none) and the suffix after the module (a pointer into name). false for a
 * name outside the map (MTP layers' extra tensors, other architectures). */
bool mr_hf_parse(const char *name, mr_hf_tensor *t, int *layer, int *expert, const char **suffix);

/* ---- giving mapped pages back ----
 * After a tensor has been copied or repacked, its bytes in the mapping are no
 * longer read: mr_st_release gives the pages of [p, p + n) back to the kernel
 * (madvise MADV_DONTNEED on the pages wholly inside the range; a page shared
 * with a neighbouring tensor stays) when the range lies in f's mapping, and
 * leaves any other memory alone. The data stays readable: a later read
 * faults it in again from the file. Returns the bytes given back.
 * mr_ckpt_release does the same for whichever of the checkpoint's files maps p. */
size_t mr_st_release(const mr_st_file *f, const void *p, size_t n);
size_t mr_ckpt_release(const mr_ckpt *c, const void *p, size_t n);

#ifdef __cplusplus
}
#endif
#endif
