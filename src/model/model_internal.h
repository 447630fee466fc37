/* model_internal.h — private to src/model: the model's three parts (config,
 * weights, state) and the fp32 ops the forward pass calls. */
#ifndef MR_MODEL_INTERNAL_H
#define MR_MODEL_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include "moerun/formats.h"
#include "moerun/kernels.h"
#include "moerun/model.h"
#include "moerun/moe.h"

/* ---- weights of one decoder layer ---- */
typedef struct {
    float *attn_norm;     /* [H] input_layernorm, fp32 copy */
    float *ffn_norm;      /* [H] post_attention_layernorm */
    float *q_norm;        /* [Hq*D] whole-q RMSNorm weight */
    float *k_norm;        /* [Hkv*D] whole-k RMSNorm weight */
    mr_qmatrix wq;        /* [Hq*D][H]  bf16 or FP8 block, in place */
    mr_qmatrix wk;        /* [Hkv*D][H] */
    mr_qmatrix wv;        /* [Hkv*D][H] */
    mr_qmatrix wo;        /* [H][Hq*D] */
    mr_qmatrix gate;      /* [E][H] router: BF16 in place, or F32 (owned copy) as the checkpoint has it */
    float *bias;          /* [E] e_score_correction_bias, fp32 */
    float k_scale, v_scale; /* an FP8 KV cache's scales: stored = x / scale, read = stored * scale
                               (the checkpoint's, where it has them; else 1) */
    mr_moe_weights *experts; /* the local experts x (w1 gate [I][H], w3 up [I][H], w2 down [H][I]), in
                                place until the runner's after-load repacks them */
    mr_pmatrix tiles[5];  /* wq, wk, wv, wo, a BF16 gate packed for the kernel table's dense path on
                             tiles, where it has one (kernels.h mr_qmatrix_tiles; the matrices' .tiles),
                             else empty */
} mr__layer;

typedef struct {
    const uint16_t *embed; /* [V][H] bf16, in place (rows may be unaligned: read via memcpy) */
    float *final_norm;     /* [H] */
    mr_qmatrix lm_head;    /* [V][H] bf16, in place */
    mr_pmatrix lm_tiles;   /* lm_head packed for the dense path on tiles, as mr__layer.tiles */
    mr__layer *layers;     /* [n_layers] */
} mr__weights;

/* ---- activations and KV cache, allocated once at open ---- */
typedef struct {
    int64_t max_tokens, max_ctx;
    int max_batch, n_threads;
    float *x;        /* [T][H] residual stream */
    float *xn;       /* [T][H] normalized input of a sublayer */
    float *q;        /* [T][Hq*D] */
    float *k;        /* [T][Hkv*D] */
    float *v;        /* [T][Hkv*D] */
    float *att;      /* [T][Hq*D] attention output (heads concatenated) */
    float *y;        /* [T][H] sublayer output */
    float *hlast;    /* [T][H] rows that go to lm_head */
    int n_extra, extra0; /* the last paged forward's extra rows: hlast rows extra0 .. extra0 + n_extra - 1 */
    float *scores;   /* [n_threads][scores_per_thread]: a query group's softmax rows [group][max_ctx],
                        then a widened K or V row [D] */
    size_t scores_per_thread;
    int64_t *pos;    /* [T] position of each token in its sequence */
    int32_t *slot;   /* [T] KV slot of each token (contiguous cache) */
    const int32_t **tok_bt; /* [T] block table of each token's sequence (paged pool) */
    int64_t *out_tok;/* [T] rows of the chunk that produce logits */
    float **out_row; /* [T] where each of those rows' logits go */
    float *inv_freq; /* [rotary_dim/2] */
    float *kcache;   /* [n_layers][max_batch][max_ctx][Hkv*D] contiguous cache (NULL when max_batch is 0) */
    float *vcache;   /* [n_layers][max_batch][max_ctx][Hkv*D] */
    int64_t *len;    /* [max_batch] tokens held per slot */
    /* paged pool: [n_layers][Hkv][kv_blocks][MR_KV_BLOCK_TOKENS][D] in kv_dtype (formats.h's mr_kv_elem_bytes) */
    void *kpool, *vpool;
    int64_t kv_blocks;
    mr_format kv_dtype;
    bool dense_bf16; /* the dense projections' inputs rounded to bf16 (exec's dense_act_dtype) */
    int kv_scales_found;      /* k_scale / v_scale tensors the checkpoint had (every layer's) */
    size_t kv_pool_bytes;     /* of each of kpool, vpool */
    unsigned char *blk_mark;  /* [kv_blocks] scratch: blocks written by the batch being checked */
    float *rlogits;  /* [T][E] router logits */
    int32_t *ids;    /* [T][k] selected experts */
    float *wts;      /* [T][k] routing weights */
    uint16_t *xb;    /* [T][H] bf16 copies when the runner's activation dtype is bf16 */
    uint16_t *ob;    /* [T][H] */
    uint8_t *emark;  /* [E] scratch: experts routed to in one MoE call */
    void *dws;       /* the dense projections' workspace (kernels.h mr_matmul_multi_ws), dws_bytes; NULL
                        where the kernel table has no dense path on tiles */
    size_t dws_bytes;
} mr__state;

struct mr_model {
    mr_model_config c;
    mr__weights w;
    mr__state s;
    mr_model_opts opts;
    const mr_moe_runner *runner;
    mr_moe_problem problem;  /* what the runner accepted */
    mr_format attn_format;   /* weights of q/k/v/o: BF16 or FP8_BLOCK (from the quantization) */
    mr_format expert_format; /* BF16, FP8_BLOCK or NVFP4 */
    mr_moe_ctx *moe;         /* the runner's context: one workspace shared by every layer */
    mr_resolution *own_res;  /* the resolution made at open when opts.exec is NULL (owns the exec) */
    mr_routing routing;      /* minimax2, k, E; bias set per layer */
    void *ckpt;          /* the open checkpoint (mapped tensors live there) */
    void **owned;        /* weight buffers allocated by the loader, freed at close (they go with the weights
                            in mr_model_weights_swap) */
    int n_owned, cap_owned;
    void **sowned;       /* the state's buffers (alloc_state), freed at close; they stay with the model */
    int n_sowned, cap_sowned;
    bool own_state;      /* alloc_state is allocating: buffers go to sowned */
    bool weights_only;   /* opened by mr_model_weights_load: no state, nothing to run */
    size_t peak_rss;
    size_t owned_bytes;      /* bytes of the loader's own buffers (copies and state) */
    mr_model_memory mem;     /* what the model holds (mr_model_memory_get) */
    mr_model_timing timing;
    /* test/calibration hook: called with each layer's MoE input and output [T][H] and its selection */
    void (*moe_input_hook)(void *user, int layer, const float *x, const float *out, int64_t T, const int32_t *ids,
                           int k);
    void *moe_input_user;
    /* expert distribution (mr_model_expert_record): [n_layers][n_experts] selections while erec_on */
    atomic_uint_least64_t *erec;
    atomic_bool erec_on;
    int32_t *routes_out;     /* mr_model_capture_routes: [T][n_layers][top_k] of the call, or NULL */
};

/* ---- ops: fp32, free functions (out, in, weights, dims) ---- */
static inline float mr__bf16f(uint16_t b) {
    union { uint32_t u; float f; } v = {(uint32_t)b << 16};
    return v.f;
}
/* out[n] = w * x * rsqrt(mean(x^2) + eps), for T rows of n (out may alias x). */
void mr__rmsnorm(float *out, const float *x, const float *w, int64_t T, int64_t n, float eps);
/* Gathers bf16 embedding rows, widened to fp32: out [T][H]. */
void mr__embed(float *out, const uint16_t *table, const int32_t *tokens, int64_t T, int64_t H);
/* NeoX RoPE in place on the first rotary_dim dims of each head of x [T][n_heads][head_dim]. */
void mr__rope(float *x, const int64_t *pos, int64_t T, int64_t n_heads, int64_t head_dim, int64_t rotary_dim,
              const float *inv_freq);
/* inv_freq[i] = 1 / theta^(2i/rotary_dim), i < rotary_dim/2 (fp32, as transformers). */
void mr__rope_freqs(float *inv_freq, int64_t rotary_dim, double theta);
/* Where one layer's K and V rows are, for mr__attention: either the
 * contiguous cache (kc/vc [max_batch][max_ctx][Hkv*D] fp32, token t reads slot
 * slot[t]) or the paged pool (kc/vc [Hkv][n_blocks][16][D] in dtype: a kv
 * head's blocks side by side, so that a sequence's consecutive block ids are
 * one contiguous run of rows; token t reads through its block table bt[t]). */
typedef struct {
    const void *kc, *vc;
    const int32_t *slot;        /* contiguous, else NULL */
    const int32_t *const *bt;   /* paged, else NULL */
    mr_format dtype;            /* F32, or (paged only) BF16, E4M3, E5M2 */
    int64_t max_ctx;
    int64_t n_blocks;           /* paged: blocks in the pool */
    float k_scale, v_scale;     /* K and V are the rows times these (1 but for an FP8 pool) */
} mr__kv_view;
/* Causal GQA attention in fp32: q [T][Hq*D] -> out [T][Hq*D]; token t attends
 * to positions 0..pos[t] of its sequence. The arithmetic of one (token, head)
 * does not depend on where the rows live: the contiguous and the paged pool
 * (fp32) give identical results. scores: [n_threads][per_thread] scratch. */
/* Appends k, v rows [T][Hkv][D] (fp32) to the paged pool's K and V of one
 * layer ([Hkv][n_blocks][16][D], above) at (bt, pos), converted to dt as
 * formats.h says for the KV cache, an FP8 one's after division by k_scale /
 * v_scale (forward.c). */
void mr__kv_store_paged(void *kp, void *vp, mr_format dt, const float *k, const float *v, const int32_t *const *bt,
                        const int64_t *pos, int64_t T, int64_t Hkv, int64_t D, int64_t n_blocks, float k_scale,
                        float v_scale);
/* Floats of the attention kernels' per-thread scratch (kernels.h's wk), kept at
 * the end of each thread's scores region. */
static inline size_t mr__attn_wk_floats(int64_t head_dim) { return (size_t)MR_ATTN_WK_ROWS * (size_t)head_dim + 16; }
void mr__attention(float *out, const float *q, const mr__kv_view *kv, const int64_t *pos, int64_t T, int64_t n_heads,
                   int64_t n_kv_heads, int64_t head_dim, float *scores, size_t per_thread, int n_threads);
/* y += x, n values. */
void mr__add(float *y, const float *x, int64_t n);
/* x rounded to bf16 values in place (--dense-activation-dtype bf16: the dense projections' inputs) */
void mr__round_bf16(float *x, int64_t n);
/* y [M][N] = x [M][K] . W^T for W [N][K] in any weight format (kernels dispatch), through the
 * state's workspace (no allocation). */
void mr__dense(mr__state *s, const mr_qmatrix *W, const float *x, int64_t M, float *y);

/* ---- the MoE block through the runner (moe_block.c) ---- */
/* out [T][H] = MoE(xn [T][H]) for layer l. */
mr_status mr__moe_forward(mr_model *m, int l, const float *xn, int64_t T, float *out);

/* ---- loader helpers shared with the tools ---- */
/* Records a loader-owned buffer freed at close (NULL-safe; on OOM frees p). */
mr_status mr__model_own(mr_model *m, void *p);
/* Layer l's experts [first, first + n) from checkpoint ck (an mr_ckpt), in
 * HF layout, as a weight set of n experts starting at global id first;
 * only those experts' tensors are read (and every expert's NVFP4
 * input_scale, for the layer's w4a4 scales). The model's config is used. */
mr_status mr__model_load_experts(mr_model *m, const void *ck, int l, int first, int n, mr_moe_weights **out);
/* Test/calibration hook (quantize uses it to collect expert input amax;
 * the expert-parallel tests compare each layer's selection and output). */
void mr__model_set_moe_hook(mr_model *m,
                            void (*hook)(void *user, int layer, const float *x, const float *out, int64_t T,
                                         const int32_t *ids, int k),
                            void *user);

/* Test hook: the file mr_model_weights_load reads MemAvailable from (NULL: /proc/meminfo). */
void mr__model_set_meminfo(const char *path);

/* ---- the sampler's filters (sampler.c), what mr_sample_logits draws from ----
 * The candidates' weights into prob[0..n) (a filter's drop weighs 0), their ids into idx[0..n), the sum of
 * the weights into *mass; returns n. 0 where no draw is needed: the token is *pick. */
int64_t mr__sampler_weigh(const mr_sampler_params *p, const float *logits, int64_t V, float *prob, int32_t *idx,
                          double *mass, int32_t *pick);

#endif
