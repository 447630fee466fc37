/* tiny.c — `gen-tiny`: writes a deterministic MiniMax-M2-architecture
 * checkpoint with random weights (config.json, generation_config.json,
 * model.safetensors with HF names). FP8 and NVFP4 forms are produced by
 * writing the bf16 form into a scratch folder and running the quantizer on
 * it (so that NVFP4 input_scale is calibrated the same way `quantize` does).
 *
 * Weights: every tensor has its own generator stream seeded by (seed, name),
 * so a tensor's values do not depend on which other tensors exist.
 *   embed N(0,1); linears N(0,1/K) (std 1/sqrt(K)); gate and lm_head twice
 *   that; norms 1 + 0.2 N(0,1); e_score_correction_bias 0.15 N(0,1) (fp32). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "model/model_internal.h"
#include "model/tools_internal.h"
#include "moerun/io.h"

static void tiny_defaults(const mr_tiny_params *in, mr_tiny_params *p) {
    *p = *in;
#define D(f, v) if (p->f <= 0) p->f = v
    D(hidden, 256);
    D(layers, 4);
    D(experts, 32);
    D(top_k, 4);
    D(inter, 128);
    D(heads, 8);
    D(kv_heads, 2);
    D(head_dim, 32);
    D(rotary_dim, 16);
    D(vocab, 512);
#undef D
    if (p->quant == MR_FMT_F32 || p->quant == 0) p->quant = MR_FMT_BF16;
}

mr_status mr_tiny_validate(const mr_tiny_params *in) {
    mr_tiny_params p;
    tiny_defaults(in, &p);
    const int64_t lim = 1 << 20;
    struct { const char *n; int64_t v; } dims[] = {
        {"hidden", p.hidden}, {"layers", p.layers}, {"experts", p.experts}, {"top-k", p.top_k},
        {"expert-dim", p.inter}, {"heads", p.heads}, {"kv-heads", p.kv_heads}, {"head-dim", p.head_dim},
        {"rotary-dim", p.rotary_dim}, {"vocab", p.vocab}};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i].v > lim) return mr_error_set(MR_EINVAL, "--%s %lld is too large (max %lld)", dims[i].n,
                                                 (long long)dims[i].v, (long long)lim);
    if (p.experts > 65535) return mr_error_set(MR_EINVAL, "--experts must be at most 65535");
    if (p.top_k > p.experts)
        return mr_error_set(MR_EINVAL, "--top-k %lld exceeds --experts %lld", (long long)p.top_k, (long long)p.experts);
    if (p.heads % p.kv_heads)
        return mr_error_set(MR_EINVAL, "--heads %lld must be a multiple of --kv-heads %lld", (long long)p.heads,
                            (long long)p.kv_heads);
    if (p.head_dim % 2 || p.rotary_dim % 2 || p.rotary_dim > p.head_dim)
        return mr_error_set(MR_EINVAL, "--rotary-dim %lld must be even and at most --head-dim %lld (even)",
                            (long long)p.rotary_dim, (long long)p.head_dim);
    if (p.vocab < 8) return mr_error_set(MR_EINVAL, "--vocab must be at least 8");
    if (p.quant == MR_FMT_FP8_BLOCK && (p.hidden % 128 || p.inter % 128))
        return mr_error_set(MR_EINVAL,
                            "FP8 block: --hidden (%lld) and --expert-dim (%lld) must be multiples of the 128x128 block "
                            "(as the FP8 block MoE kernels require)",
                            (long long)p.hidden, (long long)p.inter);
    if (p.quant == MR_FMT_NVFP4 && (p.hidden % 16 || p.inter % 16))
        return mr_error_set(MR_EINVAL, "NVFP4: --hidden (%lld) and --expert-dim (%lld) must be multiples of 16",
                            (long long)p.hidden, (long long)p.inter);
    if (p.quant != MR_FMT_BF16 && p.quant != MR_FMT_FP8_BLOCK && p.quant != MR_FMT_NVFP4)
        return mr_error_set(MR_EINVAL, "--quant must be bf16, fp8 or nvfp4");
    /* the bf16 size, before anything is allocated (each dimension is <= 2^20,
     * so double holds every product exactly enough) */
    double H = (double)p.hidden, attn = (double)(p.heads + 2 * p.kv_heads) * (double)p.head_dim * H +
                                        H * (double)p.heads * (double)p.head_dim;
    double per_layer = attn + (double)p.experts * (3.0 * (double)p.inter * H + H);
    double bytes = 2.0 * ((double)p.layers * per_layer + 2.0 * (double)p.vocab * H);
    if (bytes > 1099511627776.0)
        return mr_error_set(MR_EINVAL, "the checkpoint would hold %.0f GiB of bf16 weights (limit 1024 GiB)",
                            bytes / 1073741824.0);
    return MR_OK;
}

/* ---- deterministic generator ---- */
static uint64_t sm64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static uint64_t name_seed(uint64_t seed, const char *name) {
    uint64_t h = 1469598103934665603ull ^ seed; /* FNV-1a over the name */
    for (const char *c = name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    return h;
}
/* n normal values (Box-Muller) * scale + offset, rounded to bf16 into dst. */
static void fill_bf16(uint16_t *dst, int64_t n, uint64_t seed, float scale, float offset) {
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i += 2) {
        double u1 = ((double)(sm64(&s) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
        double u2 = (double)(sm64(&s) >> 11) * (1.0 / 9007199254740992.0);
        double r = sqrt(-2.0 * log(u1));
        dst[i] = mr_f32_to_bf16((float)(r * cos(6.283185307179586 * u2)) * scale + offset);
        if (i + 1 < n) dst[i + 1] = mr_f32_to_bf16((float)(r * sin(6.283185307179586 * u2)) * scale + offset);
    }
}

/* ---- config.json ---- */
static json_t *tiny_config_json(const mr_tiny_params *p) {
    json_t *c = json_object();
    json_t *arch = json_array();
    json_array_append_new(arch, json_string("MiniMaxM2ForCausalLM"));
    json_object_set_new(c, "architectures", arch);
    json_object_set_new(c, "model_type", json_string("minimax_m2"));
    json_object_set_new(c, "vocab_size", json_integer(p->vocab));
    json_object_set_new(c, "hidden_size", json_integer(p->hidden));
    json_object_set_new(c, "intermediate_size", json_integer(p->inter));
    json_object_set_new(c, "num_hidden_layers", json_integer(p->layers));
    json_object_set_new(c, "num_attention_heads", json_integer(p->heads));
    json_object_set_new(c, "num_key_value_heads", json_integer(p->kv_heads));
    json_object_set_new(c, "head_dim", json_integer(p->head_dim));
    json_object_set_new(c, "rotary_dim", json_integer(p->rotary_dim));
    json_object_set_new(c, "rope_theta", json_real(5000000.0));
    json_object_set_new(c, "rms_norm_eps", json_real(1e-6));
    json_object_set_new(c, "num_local_experts", json_integer(p->experts));
    json_object_set_new(c, "num_experts_per_tok", json_integer(p->top_k));
    json_object_set_new(c, "scoring_func", json_string("sigmoid"));
    json_object_set_new(c, "use_routing_bias", json_true());
    json_object_set_new(c, "use_qk_norm", json_true());
    json_object_set_new(c, "qk_norm_type", json_string("per_layer"));
    json_object_set_new(c, "shared_intermediate_size", json_integer(0));
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "tie_word_embeddings", json_false());
    json_object_set_new(c, "max_position_embeddings", json_integer(196608));
    json_t *att = json_array();
    for (int64_t i = 0; i < p->layers; i++) json_array_append_new(att, json_integer(1));
    json_object_set_new(c, "attn_type_list", att);
    json_object_set_new(c, "use_mtp", json_false());
    json_object_set_new(c, "num_mtp_modules", json_integer(0));
    json_object_set_new(c, "bos_token_id", json_integer(1));
    json_object_set_new(c, "eos_token_id", json_integer(2));
    json_object_set_new(c, "torch_dtype", json_string("bfloat16"));
    return c;
}

/* Writes the bf16 checkpoint into folder tmp (which exists). */
static mr_status write_bf16(const char *tmp, const mr_tiny_params *p) {
    mr_st_writer *w = NULL;
    mr_status st = mr_st_writer_new(&w);
    if (st) return st;
    int64_t H = p->hidden, V = p->vocab, qd = p->heads * p->head_dim, kd = p->kv_heads * p->head_dim, E = p->experts,
            I = p->inter;
    /* every buffer lives until the file is written */
    int cap = (int)(16 * p->layers + 3 * E * p->layers + 8), nbuf = 0;
    void **bufs = mr_calloc((size_t)cap, sizeof(void *));
    if (!bufs) {
        mr_st_writer_free(w);
        return MR_ENOMEM;
    }
    char name[256];
#define ADD_BF16(nm, n0, n1, nd, scale, off)                                                  \
    do {                                                                                      \
        int64_t sh_[2] = {(n0), (n1)};                                                        \
        size_t cnt_ = (size_t)(n0) * (size_t)((nd) == 2 ? (n1) : 1);                          \
        uint16_t *b_ = mr_malloc(cnt_ * 2 + 2);                                               \
        if (!b_) { st = MR_ENOMEM; goto out; }                                                \
        bufs[nbuf++] = b_;                                                                    \
        fill_bf16(b_, (int64_t)cnt_, name_seed(p->seed, nm), (scale), (off));                \
        if ((st = mr_st_writer_add(w, nm, MR_ST_BF16, sh_, (nd), b_))) goto out;              \
    } while (0)
    /* the HF names (io/ map) */
#define N(kind, l, e) (mr_hf_name(kind, (int)(l), (int)(e), NULL, name, sizeof name), name)
    ADD_BF16(N(MR_HF_EMBED, -1, -1), V, H, 2, 1.0f, 0.0f);
    ADD_BF16(N(MR_HF_FINAL_NORM, -1, -1), H, 0, 1, 0.2f, 1.0f);
    ADD_BF16(N(MR_HF_LM_HEAD, -1, -1), V, H, 2, 2.0f / sqrtf((float)H), 0.0f);
    for (int64_t l = 0; l < p->layers; l++) {
        ADD_BF16(N(MR_HF_ATTN_NORM, l, -1), H, 0, 1, 0.2f, 1.0f);
        ADD_BF16(N(MR_HF_FFN_NORM, l, -1), H, 0, 1, 0.2f, 1.0f);
        ADD_BF16(N(MR_HF_Q_PROJ, l, -1), qd, H, 2, 1.0f / sqrtf((float)H), 0.0f);
        ADD_BF16(N(MR_HF_K_PROJ, l, -1), kd, H, 2, 1.0f / sqrtf((float)H), 0.0f);
        ADD_BF16(N(MR_HF_V_PROJ, l, -1), kd, H, 2, 1.0f / sqrtf((float)H), 0.0f);
        ADD_BF16(N(MR_HF_O_PROJ, l, -1), H, qd, 2, 1.0f / sqrtf((float)qd), 0.0f);
        ADD_BF16(N(MR_HF_Q_NORM, l, -1), qd, 0, 1, 0.2f, 1.0f);
        ADD_BF16(N(MR_HF_K_NORM, l, -1), kd, 0, 1, 0.2f, 1.0f);
        ADD_BF16(N(MR_HF_ROUTER, l, -1), E, H, 2, 2.0f / sqrtf((float)H), 0.0f);
        {
            float *bias = mr_malloc((size_t)E * sizeof(float));
            if (!bias) { st = MR_ENOMEM; goto out; }
            bufs[nbuf++] = bias;
            /* drawn as bf16 values, stored widened (the bias stays fp32 on disk) */
            uint16_t *b16 = mr_malloc((size_t)E * 2);
            if (!b16) { st = MR_ENOMEM; goto out; }
            fill_bf16(b16, E, name_seed(p->seed, N(MR_HF_ROUTER_BIAS, l, -1)), 0.15f, 0.0f);
            for (int64_t x = 0; x < E; x++) bias[x] = mr__bf16f(b16[x]);
            mr_free(b16);
            int64_t sh[1] = {E};
            if ((st = mr_st_writer_add(w, name, MR_ST_F32, sh, 1, bias))) goto out;
        }
        for (int64_t x = 0; x < E; x++) {
            ADD_BF16(N(MR_HF_EXPERT_W1, l, x), I, H, 2, 1.0f / sqrtf((float)H), 0.0f);
            ADD_BF16(N(MR_HF_EXPERT_W3, l, x), I, H, 2, 1.0f / sqrtf((float)H), 0.0f);
            ADD_BF16(N(MR_HF_EXPERT_W2, l, x), H, I, 2, 1.0f / sqrtf((float)I), 0.0f);
        }
    }
#undef N
#undef ADD_BF16
    {
        char path[4096];
        snprintf(path, sizeof path, "%s/model.safetensors", tmp);
        if ((st = mr_st_writer_write(w, path))) goto out;
        snprintf(path, sizeof path, "%s/config.json", tmp);
        if ((st = mr__write_json_atomic(path, tiny_config_json(p)))) goto out;
        snprintf(path, sizeof path, "%s/generation_config.json", tmp);
        json_t *g = json_object();
        json_object_set_new(g, "bos_token_id", json_integer(1));
        json_t *eos = json_array();
        json_array_append_new(eos, json_integer(2));
        json_object_set_new(g, "eos_token_id", eos);
        if ((st = mr__write_json_atomic(path, g))) goto out;
    }
out:
    for (int i = 0; i < nbuf; i++) mr_free(bufs[i]);
    mr_free(bufs);
    mr_st_writer_free(w);
    return st;
}

mr_status mr_tiny_write(const char *dir, const mr_tiny_params *in) {
    mr_tiny_params p;
    mr_status st = mr_tiny_validate(in);
    if (st) return st;
    tiny_defaults(in, &p);
    if ((st = mr__check_target_dir(dir))) return st;
    char tmp[4096], bf[4096 + 8];
    if ((st = mr__tmpdir_next_to(dir, tmp, sizeof tmp))) return st;
    if (p.quant == MR_FMT_BF16) {
        st = write_bf16(tmp, &p);
        if (!st) st = mr__publish_dir(tmp, dir);
        if (st) mr__rmtree(tmp);
        return st;
    }
    /* quantized forms: bf16 into tmp/bf16, then the quantizer writes dir */
    snprintf(bf, sizeof bf, "%s/bf16", tmp);
    if (mkdir(bf, 0755) != 0) {
        st = mr_error_set(MR_EIO, "cannot create %s: %s", bf, strerror(errno));
    } else if (!(st = write_bf16(bf, &p))) {
        mr_quantize_params q = {.to = p.quant, .calib_tokens = 0, .seed = p.seed};
        st = mr_model_quantize(bf, dir, &q);
    }
    mr__rmtree(tmp);
    return st;
}
