/* quantize.c — `quantize`: a bf16 MiniMax-M2 checkpoint into
 *   fp8    native FP8 block (spec/formats.md "FP8 block-scaled weights"):
 *          q/k/v/o and every expert's w1/w3/w2 become F8_E4M3 `weight` plus
 *          F32 `weight_scale_inv` [ceil(N/128)][ceil(K/128)]; the router
 *          gate, the bias, norms, embeddings and lm_head are copied;
 *          config.json gets quantization_config {quant_method fp8, ...}.
 *   nvfp4  ModelOpt NVFP4, experts only: U8 `weight` [N][K/2], F8_E4M3
 *          `weight_scale` [N][K/16], F32 `weight_scale_2` [] (w1 and w3 share
 *          it: amax over both), F32 `input_scale` [] calibrated by running
 *          the bf16 model over calib_tokens tokens: for each expert, the amax
 *          of the inputs routed to it (w1/w3, shared) and of its intermediate
 *          silu(w1 x) * (w3 x) (w2), divided by 2688 = 6 * 448. An expert
 *          that no calibration token reached takes the maximum over the
 *          others. config.json gets the flat ModelOpt quantization_config and
 *          hf_quant_config.json is written too.
 * Everything is written into a scratch folder next to OUT, renamed into
 * place at the end; on failure nothing is left. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "base/json_internal.h"
#include "model/model_internal.h"
#include "model/tools_internal.h"
#include "moerun/io.h"
#include "moerun/kernels.h"

/* ---- calibration (NVFP4) ---- */
typedef struct {
    const mr_ckpt *ck;
    int64_t E, H, I;
    float *amax13; /* [layers][E] */
    float *amax2;  /* [layers][E] */
    float *g, *u;  /* [I] scratch */
} calib;

static mr_qmatrix bf16_matrix(const mr_st_tensor *t) {
    return (mr_qmatrix){.fmt = MR_FMT_BF16, .rows = t->shape[0], .cols = t->shape[1], .data = (void *)t->data,
                        .scale2 = 1.0f};
}

static void calib_hook(void *user, int layer, const float *x, const float *out, int64_t T, const int32_t *ids, int k) {
    (void)out;
    calib *c = user;
    char n1[256], n3[256];
    for (int64_t t = 0; t < T; t++) {
        const float *xt = x + t * c->H;
        float ax = 0.0f;
        for (int64_t i = 0; i < c->H; i++) ax = fmaxf(ax, fabsf(xt[i]));
        for (int j = 0; j < k; j++) {
            int e = ids[t * k + j];
            float *a13 = &c->amax13[(int64_t)layer * c->E + e], *a2 = &c->amax2[(int64_t)layer * c->E + e];
            *a13 = fmaxf(*a13, ax);
            mr_hf_name(MR_HF_EXPERT_W1, layer, e, NULL, n1, sizeof n1);
            mr_hf_name(MR_HF_EXPERT_W3, layer, e, NULL, n3, sizeof n3);
            const mr_st_tensor *t1 = mr_ckpt_find(c->ck, n1), *t3 = mr_ckpt_find(c->ck, n3);
            if (!t1 || !t3) continue; /* the loader already checked them */
            mr_qmatrix w1 = bf16_matrix(t1), w3 = bf16_matrix(t3);
            mr_matmul(&w1, xt, 1, c->g);
            mr_matmul(&w3, xt, 1, c->u);
            for (int64_t i = 0; i < c->I; i++) {
                float h = c->g[i] / (1.0f + expf(-c->g[i])) * c->u[i];
                *a2 = fmaxf(*a2, fabsf(h));
            }
        }
    }
}

static mr_status run_calibration(const char *in_dir, const mr_ckpt *ck, const mr_model_config *mc,
                                 const mr_quantize_params *p, calib *c) {
    int64_t n_tok = p->calib_tokens > 0 ? p->calib_tokens : 256, seq = 64;
    mr_model_opts o = {.max_batch = 1, .max_ctx = seq, .max_tokens = seq, .quiet = true};
    mr_model *m = NULL;
    /* the runner resolution picks (auto) when one accepts the model, else the scalar ground truth */
    mr_status st = mr_model_open(in_dir, &o, &m);
    if (st) {
        o.runner = mr_moe_runner_ground_truth()->name;
        st = mr_model_open(in_dir, &o, &m);
    }
    if (st) return st;
    c->ck = ck;
    c->E = mc->n_experts;
    c->H = mc->hidden;
    c->I = mc->moe_inter;
    mr__model_set_moe_hook(m, calib_hook, c);
    int32_t *toks = mr_malloc((size_t)seq * sizeof(int32_t));
    float *logits = mr_malloc((size_t)mc->vocab * sizeof(float));
    if (!toks || !logits) st = MR_ENOMEM;
    uint64_t s = p->seed ^ 0xC0FFEEull;
    for (int64_t done = 0; !st && done < n_tok; done += seq) {
        int64_t n = n_tok - done < seq ? n_tok - done : seq;
        for (int64_t i = 0; i < n; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            toks[i] = (int32_t)((s >> 33) % (uint64_t)mc->vocab);
        }
        mr_model_seq_reset(m, 0);
        int slot = 0;
        mr_batch b = {.n_seq = 1, .seq = &slot, .n_tok = &n, .tokens = toks};
        st = mr_model_forward(m, &b, logits);
        mr__progress(p->progress, "calibrating", done + n, n_tok);
    }
    mr_free(toks);
    mr_free(logits);
    mr_model_close(m);
    return st;
}

/* ---- input check: every floating-point element is finite ---- */
/* MR_EINPUT naming t and the index of its first NaN or infinite element;
 * MR_OK for finite data and for non-float dtypes. A NaN weight has no
 * quantized form, and in calibration it would reach the router first. */
static mr_status check_finite(const mr_st_tensor *t) {
    const unsigned char *d = t->data;
    uint64_t bad = t->n_elements;
    bool nan = false;
    if (t->dtype == MR_ST_BF16 || t->dtype == MR_ST_F16) {
        const uint16_t exp = t->dtype == MR_ST_BF16 ? 0x7F80 : 0x7C00;
        for (uint64_t i = 0; i < t->n_elements; i++) {
            uint16_t b;
            memcpy(&b, d + 2 * i, 2);
            if ((b & exp) == exp) {
                bad = i, nan = (b & (uint16_t)~(exp | 0x8000)) != 0;
                break;
            }
        }
    } else if (t->dtype == MR_ST_F32) {
        for (uint64_t i = 0; i < t->n_elements; i++) {
            uint32_t b;
            memcpy(&b, d + 4 * i, 4);
            if ((b & 0x7F800000u) == 0x7F800000u) {
                bad = i, nan = (b & 0x007FFFFFu) != 0;
                break;
            }
        }
    }
    if (bad == t->n_elements) return MR_OK;
    char idx[160] = "";
    size_t n = 0;
    uint64_t rem = bad;
    int64_t sub[8] = {0};
    const int nd = t->ndim < 8 ? t->ndim : 8;
    for (int k = t->ndim - 1; k >= 0; k--) { /* row-major coordinates of the flat index */
        uint64_t dim = t->shape[k] > 0 ? (uint64_t)t->shape[k] : 1;
        if (k < 8) sub[k] = (int64_t)(rem % dim);
        rem /= dim;
    }
    for (int k = 0; k < nd && n < sizeof idx; k++)
        n += (size_t)snprintf(idx + n, sizeof idx - n, "%s%lld", k ? ", " : "", (long long)sub[k]);
    return mr_error_set(MR_EINPUT, "quantize: tensor %s [%s] (element %llu of %llu) is %s; the input must be finite",
                        t->name, idx, (unsigned long long)bad, (unsigned long long)t->n_elements,
                        nan ? "NaN" : "infinite");
}

/* ---- the output writer: remembers every buffer until the file is written ---- */
typedef struct {
    mr_st_writer *w;
    void **bufs;
    int n, cap;
    mr_qmatrix *qs;
    int nq, capq;
} outw;

static mr_status keep(outw *o, void *p) {
    if (!p) return MR_ENOMEM;
    if (o->n == o->cap) {
        int cap = o->cap ? 2 * o->cap : 256;
        void **b = mr_realloc(o->bufs, (size_t)cap * sizeof(void *));
        if (!b) {
            mr_free(p);
            return MR_ENOMEM;
        }
        o->bufs = b;
        o->cap = cap;
    }
    o->bufs[o->n++] = p;
    return MR_OK;
}

static mr_qmatrix *new_q(outw *o) {
    if (o->nq == o->capq) {
        int cap = o->capq ? 2 * o->capq : 256;
        mr_qmatrix *q = mr_realloc(o->qs, (size_t)cap * sizeof(mr_qmatrix));
        if (!q) return NULL;
        o->qs = q;
        o->capq = cap;
    }
    mr_qmatrix *q = &o->qs[o->nq++];
    memset(q, 0, sizeof *q);
    return q;
}

static float *widen(const mr_st_tensor *t) {
    uint64_t n = t->n_elements;
    float *f = mr_malloc((size_t)n * sizeof(float));
    if (!f) return NULL;
    const unsigned char *d = t->data;
    for (uint64_t i = 0; i < n; i++) {
        uint16_t b;
        memcpy(&b, d + 2 * i, 2);
        f[i] = mr__bf16f(b);
    }
    return f;
}

static float amax_of(const float *w, int64_t n) {
    float a = 0.0f;
    for (int64_t i = 0; i < n; i++) a = fmaxf(a, fabsf(w[i]));
    return a;
}

static mr_status add_scalar(outw *o, const char *name, float v) {
    float *p = mr_malloc(sizeof(float));
    mr_status st = keep(o, p);
    if (st) return st;
    *p = v;
    return mr_st_writer_add(o->w, name, MR_ST_F32, NULL, 0, p);
}

/* Quantizes the bf16 tensor t (named base + ".weight") into fmt and adds its tensors. */
static mr_status add_quantized(outw *o, const char *base, const mr_st_tensor *t, mr_format fmt, float shared_amax,
                               float input_scale) {
    float *f = widen(t);
    if (!f) return MR_ENOMEM;
    mr_qmatrix *q = new_q(o);
    if (!q) {
        mr_free(f);
        return MR_ENOMEM;
    }
    int64_t N = t->shape[0], K = t->shape[1];
    mr_status st = mr_qmatrix_quantize(q, fmt, f, N, K, shared_amax);
    mr_free(f);
    if (st) return st;
    /* the tensors the format stores (formats/ traits): names, dtypes, shapes */
    const mr_format_traits *tr = mr_format_traits_get(fmt);
    for (int i = 0; i < tr->n_tensors && !st; i++) {
        const mr_format_tensor *ft = &tr->tensors[i];
        char name[320];
        snprintf(name, sizeof name, "%s.%s", base, ft->suffix);
        mr_st_dtype dt;
        if ((st = mr_st_dtype_from_name(ft->st_dtype, &dt))) break;
        int64_t sh[2];
        const int nd = mr_format_tensor_shape(ft, N, K, sh);
        switch (ft->role) {
        case MR_FT_DATA: st = mr_st_writer_add(o->w, name, dt, sh, nd, q->data); break;
        case MR_FT_SCALE: st = mr_st_writer_add(o->w, name, dt, sh, nd, q->scale); break;
        case MR_FT_SCALE2: st = add_scalar(o, name, q->scale2); break;
        case MR_FT_INPUT_SCALE: st = add_scalar(o, name, input_scale); break;
        }
    }
    return st;
}

static json_t *quant_config(mr_format to, bool hf) {
    json_t *q = json_object();
    if (to == MR_FMT_FP8_BLOCK) {
        json_object_set_new(q, "quant_method", json_string("fp8"));
        json_object_set_new(q, "fmt", json_string("float8_e4m3fn"));
        json_object_set_new(q, "activation_scheme", json_string("dynamic"));
        json_t *bs = json_array();
        json_array_append_new(bs, json_integer(128));
        json_array_append_new(bs, json_integer(128));
        json_object_set_new(q, "weight_block_size", bs);
        json_t *ex = json_array();
        json_array_append_new(ex, json_string("gate"));
        json_array_append_new(ex, json_string("e_score_correction_bias"));
        json_array_append_new(ex, json_string("lm_head"));
        json_object_set_new(q, "modules_to_not_convert", ex);
        return q;
    }
    if (!hf) json_object_set_new(q, "quant_method", json_string("modelopt"));
    json_object_set_new(q, "quant_algo", json_string("NVFP4"));
    json_object_set_new(q, "group_size", json_integer(16));
    json_t *ex = json_array();
    json_array_append_new(ex, json_string("lm_head"));
    json_array_append_new(ex, json_string("model.embed_tokens"));
    json_array_append_new(ex, json_string("model.layers.*.self_attn*"));
    json_array_append_new(ex, json_string("model.layers.*.block_sparse_moe.gate"));
    json_object_set_new(q, "exclude_modules", ex);
    return q;
}

/* The files beside the weights that a user of the model needs (its
 * tokenizer and chat template) are copied unchanged when present. */
static const char *const CARRIED_FILES[] = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                                            "special_tokens_map.json"};

static mr_status copy_if_present(const char *in_dir, const char *tmp, const char *name) {
    char src[4096], dst[4096], buf[65536];
    snprintf(src, sizeof src, "%s/%s", in_dir, name);
    snprintf(dst, sizeof dst, "%s/%s", tmp, name);
    FILE *in = fopen(src, "rb");
    if (!in) return errno == ENOENT ? MR_OK : mr_error_set(MR_EIO, "quantize: cannot open %s: %s", src, strerror(errno));
    mr_status st = MR_OK;
    FILE *out = fopen(dst, "wb");
    if (!out) {
        st = mr_error_set(MR_EIO, "quantize: cannot create %s: %s", dst, strerror(errno));
        goto out;
    }
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) {
            st = mr_error_set(MR_EIO, "quantize: cannot write %s: %s", dst, strerror(errno));
            goto out;
        }
    if (ferror(in)) st = mr_error_set(MR_EIO, "quantize: cannot read %s", src);
out:
    if (out && fclose(out) != 0 && !st) st = mr_error_set(MR_EIO, "quantize: cannot write %s: %s", dst, strerror(errno));
    fclose(in);
    return st;
}

static mr_status write_configs(const char *in_dir, const char *tmp, mr_format to) {
    char path[4096];
    json_error_t e;
    bool oom;
    snprintf(path, sizeof path, "%s/config.json", in_dir);
    json_t *c = mr__json_load_file(path, JSON_PRESERVE_ORDER, &e, &oom);
    if (!c) return oom ? MR_ENOMEM : mr_error_set(MR_ECONFIG, "%s: %s", path, e.text);
    json_object_set_new(c, "quantization_config", quant_config(to, false));
    snprintf(path, sizeof path, "%s/config.json", tmp);
    mr_status st = mr__write_json_atomic(path, c);
    if (st) return st;
    snprintf(path, sizeof path, "%s/generation_config.json", in_dir);
    json_t *g = mr__json_load_file(path, JSON_PRESERVE_ORDER, &e, &oom);
    if (!g && oom) return MR_ENOMEM;
    if (!g && json_error_code(&e) != json_error_cannot_open_file) /* present but broken: never drop it silently */
        return mr_error_set(MR_ECONFIG, "%s: not valid JSON at line %d: %s", path, e.line, e.text);
    if (g) {
        snprintf(path, sizeof path, "%s/generation_config.json", tmp);
        if ((st = mr__write_json_atomic(path, g))) return st;
    }
    if (to == MR_FMT_NVFP4) {
        json_t *h = json_object(), *prod = json_object();
        json_object_set_new(prod, "name", json_string("modelopt"));
        json_object_set_new(h, "producer", prod);
        json_object_set_new(h, "quantization", quant_config(to, true));
        snprintf(path, sizeof path, "%s/hf_quant_config.json", tmp);
        if ((st = mr__write_json_atomic(path, h))) return st;
    }
    for (size_t i = 0; i < sizeof CARRIED_FILES / sizeof CARRIED_FILES[0]; i++)
        if ((st = copy_if_present(in_dir, tmp, CARRIED_FILES[i]))) return st;
    return MR_OK;
}

mr_status mr_model_quantize(const char *in_dir, const char *out_dir, const mr_quantize_params *p) {
    if (p->to != MR_FMT_FP8_BLOCK && p->to != MR_FMT_NVFP4)
        return mr_error_set(MR_EINVAL, "quantize: the target must be fp8 or nvfp4");
    mr_model_desc d;
    memset(&d, 0, sizeof d);
    mr_status st = mr_model_desc_load(in_dir, &d);
    if (st) return st;
    mr_ckpt *ck = NULL;
    outw o = {0};
    calib cal = {0};
    char tmp[4096] = "";
    if (d.arch != MR_ARCH_MINIMAX_M2) {
        st = mr_error_set(MR_EUNSUPPORTED, "quantize: %s is not MiniMaxM2ForCausalLM", d.architecture);
        goto out;
    }
    if (d.quant.kind != MR_QUANT_NONE) {
        st = mr_error_set(MR_EINVAL, "quantize: %s is already quantized (%s); the input must be bf16", in_dir,
                          mr_quant_name(d.quant.kind));
        goto out;
    }
    if (p->to == MR_FMT_NVFP4 && (d.hidden % 16 || d.moe_inter % 16)) {
        st = mr_error_set(MR_EINVAL, "quantize: NVFP4 needs hidden (%lld) and expert dim (%lld) multiples of 16",
                          (long long)d.hidden, (long long)d.moe_inter);
        goto out;
    }
    if ((st = mr__check_target_dir(out_dir))) goto out;
    if ((st = mr_ckpt_open(in_dir, &ck))) goto out;
    /* NVFP4 runs the bf16 model for calibration first: its input is checked
     * whole before that (FP8 checks each tensor as it comes, below) */
    for (size_t i = 0; p->to == MR_FMT_NVFP4 && i < mr_ckpt_count(ck); i++)
        if ((st = check_finite(mr_ckpt_tensor_at(ck, i)))) goto out;
    if (p->to == MR_FMT_NVFP4) {
        size_t n = (size_t)(d.n_layers * d.n_experts);
        cal.amax13 = mr_calloc(n, sizeof(float));
        cal.amax2 = mr_calloc(n, sizeof(float));
        cal.g = mr_malloc((size_t)d.moe_inter * sizeof(float));
        cal.u = mr_malloc((size_t)d.moe_inter * sizeof(float));
        if (!cal.amax13 || !cal.amax2 || !cal.g || !cal.u) {
            st = MR_ENOMEM;
            goto out;
        }
        if ((st = run_calibration(in_dir, ck, &d, p, &cal))) goto out;
        /* experts no calibration token reached: the maximum over the others */
        for (int64_t l = 0; l < d.n_layers; l++) {
            float m13 = 0.0f, m2 = 0.0f;
            for (int64_t e = 0; e < d.n_experts; e++) {
                m13 = fmaxf(m13, cal.amax13[l * d.n_experts + e]);
                m2 = fmaxf(m2, cal.amax2[l * d.n_experts + e]);
            }
            for (int64_t e = 0; e < d.n_experts; e++) {
                if (cal.amax13[l * d.n_experts + e] == 0.0f) cal.amax13[l * d.n_experts + e] = m13 > 0 ? m13 : 1.0f;
                if (cal.amax2[l * d.n_experts + e] == 0.0f) cal.amax2[l * d.n_experts + e] = m2 > 0 ? m2 : 1.0f;
            }
        }
    }
    if ((st = mr_st_writer_new(&o.w))) goto out;
    size_t n = mr_ckpt_count(ck);
    for (size_t i = 0; i < n && !st; i++) {
        const mr_st_tensor *t = mr_ckpt_tensor_at(ck, i);
        if (p->to == MR_FMT_FP8_BLOCK && (st = check_finite(t))) break;
        /* what the tensor is, by its HF name (io/ map): attention and expert linears are quantized */
        mr_hf_tensor kind = MR_HF_COUNT;
        int l = -1, expert = -1;
        const char *suffix = "";
        const bool known = mr_hf_parse(t->name, &kind, &l, &expert, &suffix);
        const bool is_weight = known && !strcmp(suffix, "weight") && t->ndim == 2 && t->dtype == MR_ST_BF16 &&
                               l >= 0 && l < d.n_layers;
        char base[320] = "";
        if (known) mr_hf_name(kind, l, expert, "", base, sizeof base);
        const bool attn = is_weight && (kind == MR_HF_Q_PROJ || kind == MR_HF_K_PROJ || kind == MR_HF_V_PROJ ||
                                        kind == MR_HF_O_PROJ);
        if (!(is_weight && mr_hf_is_expert(kind))) expert = -1;
        const char which = expert < 0 ? 0 : kind == MR_HF_EXPERT_W1 ? '1' : kind == MR_HF_EXPERT_W3 ? '3' : '2';
        if (p->to == MR_FMT_FP8_BLOCK && (attn || expert >= 0) && !mr_quant_is_excluded(&d.quant, t->name)) {
            st = add_quantized(&o, base, t, MR_FMT_FP8_BLOCK, 0.0f, 0.0f);
        } else if (p->to == MR_FMT_NVFP4 && expert >= 0) {
            float in13 = cal.amax13[l * d.n_experts + expert] / 2688.0f;
            float in2 = cal.amax2[l * d.n_experts + expert] / 2688.0f;
            if (which == '2') {
                st = add_quantized(&o, base, t, MR_FMT_NVFP4, 0.0f, in2);
            } else if (which == '1') {
                /* w1 and w3 share weight_scale_2 (amax over both) and input_scale */
                char n3[400], b3[320];
                mr_hf_name(MR_HF_EXPERT_W3, l, expert, "", b3, sizeof b3);
                mr_hf_name(MR_HF_EXPERT_W3, l, expert, NULL, n3, sizeof n3);
                const mr_st_tensor *t3 = mr_ckpt_find(ck, n3);
                if (!t3 || t3->dtype != MR_ST_BF16 || t3->ndim != 2) {
                    st = mr_error_set(MR_EFORMAT, "quantize: %s is missing or not a BF16 matrix", n3);
                    break;
                }
                float *f1 = widen(t), *f3 = widen(t3);
                float shared = 0.0f;
                if (f1 && f3) shared = fmaxf(amax_of(f1, (int64_t)t->n_elements), amax_of(f3, (int64_t)t3->n_elements));
                mr_free(f1);
                mr_free(f3);
                if (!f1 || !f3) {
                    st = MR_ENOMEM;
                    break;
                }
                st = add_quantized(&o, base, t, MR_FMT_NVFP4, shared, in13);
                if (!st) st = add_quantized(&o, b3, t3, MR_FMT_NVFP4, shared, in13);
            } /* w3 was written with its w1 */
        } else {
            /* copied as is (referenced from the mapping) */
            st = mr_st_writer_add(o.w, t->name, t->dtype, t->shape, t->ndim, t->data);
        }
        mr__progress(p->progress, "quantizing", (int64_t)i + 1, (int64_t)n);
    }
    if (st) goto out;
    if ((st = mr__tmpdir_next_to(out_dir, tmp, sizeof tmp))) {
        tmp[0] = 0;
        goto out;
    }
    {
        char path[4200];
        snprintf(path, sizeof path, "%s/model.safetensors", tmp);
        if ((st = mr_st_writer_write(o.w, path))) goto out;
    }
    if ((st = write_configs(in_dir, tmp, p->to))) goto out;
    st = mr__publish_dir(tmp, out_dir);
    if (!st) tmp[0] = 0;
out:
    if (tmp[0]) mr__rmtree(tmp);
    for (int i = 0; i < o.n; i++) mr_free(o.bufs[i]);
    for (int i = 0; i < o.nq; i++) mr_qmatrix_free(&o.qs[i]);
    mr_free(o.bufs);
    mr_free(o.qs);
    mr_st_writer_free(o.w);
    mr_free(cal.amax13);
    mr_free(cal.amax2);
    mr_free(cal.g);
    mr_free(cal.u);
    mr_ckpt_close(ck);
    mr_model_desc_free(&d);
    return st;
}
