/* loader.c — opens a MiniMax-M2 checkpoint folder: reads the model
 * description (config/), opens the safetensors files (io/), checks every
 * tensor by HF name (dtype, shape), binds weights in place from the mapping,
 * runs the resolved MoE runner's after-load once per layer, and allocates
 * the state (activations, KV cache) once.
 *
 * Weight forms (spec/minimax-m2.md, spec/formats.md):
 *   bf16    everything BF16 (router gate BF16 or F32, bias F32)
 *   fp8     q/k/v/o and experts: F8_E4M3 weight + F32 weight_scale_inv
 *           [ceil(N/128)][ceil(K/128)]; gate, bias, norms, embed, lm_head as bf16
 *   nvfp4   experts only: U8 weight [N][K/2], F8_E4M3 weight_scale [N][K/16],
 *           F32 weight_scale_2 [], F32 input_scale []; the rest bf16
 * MTP layers (index >= num_hidden_layers) are never looked up. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <jansson.h>
#include <omp.h>

#include "base/json_internal.h"
#include "model/model_internal.h"
#include "moerun/io.h"

mr_status mr__model_own(mr_model *m, void *p) {
    if (!p) return MR_OK;
    void ***list = m->own_state ? &m->sowned : &m->owned;
    int *n_list = m->own_state ? &m->n_sowned : &m->n_owned, *cap_list = m->own_state ? &m->cap_sowned : &m->cap_owned;
    if (*n_list == *cap_list) {
        int cap = *cap_list ? 2 * *cap_list : 64;
        void **n = mr_realloc(*list, (size_t)cap * sizeof(void *));
        if (!n) {
            mr_aligned_free(p);
            return MR_ENOMEM;
        }
        *list = n;
        *cap_list = cap;
    }
    (*list)[(*n_list)++] = p;
    return MR_OK;
}

static void *own_alloc(mr_model *m, size_t bytes) {
    void *p = mr_aligned_alloc(64, bytes ? bytes : 64);
    if (!p) return NULL;
    if (mr__model_own(m, p) != MR_OK) return NULL;
    m->owned_bytes += bytes;
    return p;
}

/* ---- tensor lookup with checks ---- */
static void shape_str(char *buf, size_t n, const int64_t *shape, int ndim) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < ndim && o < n; i++) o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

/* Finds name, which must have one of the dtypes (up to 2; -1 = unused) and
 * the given shape. The error names the tensor, what was expected and what was found. */
static mr_status get_tensor(const mr_ckpt *ck, const char *name, int dt0, int dt1, int ndim, const int64_t *shape,
                            const mr_st_tensor **out) {
    const mr_st_tensor *t = mr_ckpt_find(ck, name);
    *out = NULL;
    char es[96], fs[96];
    shape_str(es, sizeof es, shape, ndim);
    if (!t)
        return mr_error_set(MR_ENOTFOUND, "tensor %s is missing from the checkpoint (expected %s %s)", name,
                            mr_st_dtype_name((mr_st_dtype)dt0), es);
    if ((int)t->dtype != dt0 && (int)t->dtype != dt1) {
        shape_str(fs, sizeof fs, t->shape, t->ndim);
        return mr_error_set(MR_EFORMAT, "tensor %s: expected dtype %s%s%s, found %s", name,
                            mr_st_dtype_name((mr_st_dtype)dt0), dt1 >= 0 ? " or " : "",
                            dt1 >= 0 ? mr_st_dtype_name((mr_st_dtype)dt1) : "", mr_st_dtype_name(t->dtype));
    }
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        shape_str(fs, sizeof fs, t->shape, t->ndim);
        return mr_error_set(MR_EFORMAT, "tensor %s: expected shape %s, found %s", name, es, fs);
    }
    *out = t;
    return MR_OK;
}

/* Reads the pages of a mapped range into memory now, at load, so that the
 * first forward pass does not pay for page faults and disk reads (measured
 * on a 2-layer real-shape checkpoint not in the page cache: the first
 * prefill spent 1.5 s faulting in the 1.2 GB lm_head). MADV_POPULATE_READ
 * (Linux 5.14) does it in one call; older kernels get one read per page. */
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
static void prefault(const void *p, size_t n) {
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t page = pg > 0 ? (uintptr_t)pg : 4096;
    uintptr_t a = (uintptr_t)p & ~(page - 1), e = (uintptr_t)p + n;
    if (n == 0) return;
    if (madvise((void *)a, e - a, MADV_POPULATE_READ) == 0) return;
    unsigned char sink = 0;
    for (uintptr_t q = a < (uintptr_t)p ? (uintptr_t)p : a; q < e; q = (q & ~(page - 1)) + page)
        sink ^= *(const volatile unsigned char *)q;
    (void)sink;
}

/* Data used in place when aligned for its element size (its pages read in
 * now when `fault`), else copied into an aligned buffer (mapped tensors
 * carry no alignment guarantee) and the source pages given back. */
static const void *in_place_as(mr_model *m, const mr_st_tensor *t, size_t align, bool fault) {
    if (((uintptr_t)t->data % align) == 0) {
        if (fault) { /* used in place: held once, in the mapping */
            prefault(t->data, (size_t)t->n_bytes);
            m->mem.weights_mapped += (size_t)t->n_bytes;
        }
        return t->data;
    }
    void *p = own_alloc(m, (size_t)t->n_bytes);
    if (p) {
        memcpy(p, t->data, (size_t)t->n_bytes);
        mr_st_release(t->file, t->data, (size_t)t->n_bytes); /* the copy is what is kept */
    }
    return p;
}
static const void *in_place(mr_model *m, const mr_st_tensor *t, size_t align) { return in_place_as(m, t, align, true); }

/* An fp32 copy of the n elements of a BF16 or F32 tensor; the source pages
 * are given back (the copy is what is kept). */
static mr_status widen_f32(mr_model *m, const mr_st_tensor *t, int64_t n, float **out) {
    float *v = own_alloc(m, (size_t)n * sizeof(float));
    if (!v) return MR_ENOMEM;
    const unsigned char *d = t->data;
    for (int64_t i = 0; i < n; i++) {
        if (t->dtype == MR_ST_F32) {
            memcpy(&v[i], d + 4 * i, 4);
        } else {
            uint16_t b;
            memcpy(&b, d + 2 * i, 2);
            v[i] = mr__bf16f(b);
        }
    }
    mr_st_release(t->file, t->data, (size_t)t->n_bytes);
    *out = v;
    return MR_OK;
}

/* A [n] fp32 copy of a BF16 or F32 vector tensor. */
static mr_status load_vec(mr_model *m, const mr_ckpt *ck, const char *name, int64_t n, float **out) {
    const mr_st_tensor *t;
    int64_t shape[1] = {n};
    mr_status st = get_tensor(ck, name, MR_ST_BF16, MR_ST_F32, 1, shape, &t);
    if (st) return st;
    return widen_f32(m, t, n, out);
}

static mr_status load_scalar_f32(const mr_ckpt *ck, const char *name, float *out, bool *found) {
    const mr_st_tensor *t = mr_ckpt_find(ck, name);
    *found = t != NULL;
    if (!t) return MR_OK;
    if (t->dtype != MR_ST_F32 || t->n_elements != 1)
        return mr_error_set(MR_EFORMAT, "tensor %s: expected a F32 scalar, found %s with %llu elements", name,
                            mr_st_dtype_name(t->dtype), (unsigned long long)t->n_elements);
    memcpy(out, t->data, 4);
    if (!isfinite(*out) || *out < 0.0f)
        return mr_error_set(MR_EFORMAT, "tensor %s: expected a finite non-negative scale, found %g", name, (double)*out);
    return MR_OK;
}

/* A linear weight [N][K] named prefix + ".weight" in format fmt, bound in
 * place. fault: read its pages in now (weights used in place); expert
 * weights are not, the after-load reads them once. */
static mr_status load_linear(mr_model *m, const mr_ckpt *ck, const char *prefix, mr_format fmt, int64_t N, int64_t K,
                             mr_qmatrix *q, bool *missing_input_scale, bool fault) {
    const mr_format_traits *tr = mr_format_traits_get(fmt);
    *q = (mr_qmatrix){.fmt = fmt, .rows = N, .cols = K, .scale2 = 1.0f};
    if (!tr || tr->n_tensors == 0 || fmt == MR_FMT_F32)
        return mr_error_set(MR_EUNSUPPORTED, "%s: weight format %s is not supported for linears", prefix,
                            tr ? tr->name : "?");
    if (fmt == MR_FMT_NVFP4 && K % 16)
        return mr_error_set(MR_ECONFIG, "%s: NVFP4 needs K %% 16 == 0, K = %lld", prefix, (long long)K);
    /* the tensors the format stores (formats/ traits): names, dtypes, shapes */
    for (int i = 0; i < tr->n_tensors; i++) {
        const mr_format_tensor *ft = &tr->tensors[i];
        char name[320];
        snprintf(name, sizeof name, "%s.%s", prefix, ft->suffix);
        mr_st_dtype dt;
        mr_status st = mr_st_dtype_from_name(ft->st_dtype, &dt);
        MR_ASSERT(st == MR_OK);
        if (ft->ndim == 0) { /* a scalar (weight_scale_2, input_scale) */
            bool found;
            float v = 0.0f;
            if ((st = load_scalar_f32(ck, name, &v, &found))) return st;
            if (!found && !ft->optional)
                return mr_error_set(MR_ENOTFOUND, "tensor %s is missing from the checkpoint (expected %s [])", name,
                                    ft->st_dtype);
            if (!found && ft->role == MR_FT_INPUT_SCALE) *missing_input_scale = true;
            if (found && ft->role == MR_FT_SCALE2) q->scale2 = v;
            if (found && ft->role == MR_FT_INPUT_SCALE) q->input_scale = v;
            continue;
        }
        int64_t sh[2];
        mr_format_tensor_shape(ft, N, K, sh);
        const mr_st_tensor *t;
        if ((st = get_tensor(ck, name, dt, -1, 2, sh, &t))) return st;
        const void *p;
        if (ft->role == MR_FT_DATA && !fault && ((uintptr_t)t->data % (uintptr_t)ft->elem_bytes) != 0) {
            /* an unaligned expert: a copy the matrix owns, freed when after-load is done with it */
            void *c = mr_aligned_alloc(64, (size_t)t->n_bytes);
            if (!c) return MR_ENOMEM;
            memcpy(c, t->data, (size_t)t->n_bytes);
            mr_st_release(t->file, t->data, (size_t)t->n_bytes);
            q->data = c;
            q->owned = tr->n_tensors == 1; /* the matrix frees only what it owns wholly */
            if (!q->owned && mr__model_own(m, c)) return MR_ENOMEM;
            if (!q->owned) m->owned_bytes += (size_t)t->n_bytes;
            continue;
        }
        if (!(p = in_place_as(m, t, (size_t)ft->elem_bytes, fault))) return MR_ENOMEM;
        if (ft->role == MR_FT_DATA) q->data = (void *)p;
        else q->scale = (void *)p;
    }
    return MR_OK;
}

/* Where the kernel table has a dense path on tiles for q's format (AMX hosts), q packed for it
 * into *store: the forward pass then reads the pack (one kernel for every token count), so the
 * source's pages in the mapping go back; they stay readable. */
static mr_status pack_dense(mr_model *m, const char *what, mr_qmatrix *q, mr_pmatrix *store) {
    const mr_status st = mr_qmatrix_tiles(q, store);
    if (st) return mr_error_set(st, "%s: packing for the dense path on tiles (%zu bytes): %s", what, mr_qmatrix_bytes(q),
                                mr_error_last());
    if (!q->tiles) return MR_OK;
    m->owned_bytes += mr_pmatrix_bytes(store);
    size_t back = mr_ckpt_release(m->ckpt, q->data, mr_qmatrix_data_bytes(q));
    if (q->scale) back += mr_ckpt_release(m->ckpt, q->scale, mr_qmatrix_scale_bytes(q));
    m->mem.weights_mapped -= back < m->mem.weights_mapped ? back : m->mem.weights_mapped;
    return MR_OK;
}

static mr_status config_from_desc(const mr_model_desc *d, mr_model_config *c) {
    if (d->arch != MR_ARCH_MINIMAX_M2)
        return mr_error_set(MR_EUNSUPPORTED, "architecture %s is not supported by the model runtime (MiniMaxM2ForCausalLM only)",
                            d->architecture);
    if (d->qk_norm != MR_QK_NORM_PER_LAYER)
        return mr_error_set(MR_EUNSUPPORTED, "%s is not supported: MiniMax-M2 normalizes q and k over each layer's "
                            "heads together (use_qk_norm true, qk_norm_type per_layer)",
                            d->qk_norm == MR_QK_NORM_NONE ? "a model without q/k norms (use_qk_norm false or absent)"
                                                          : "qk_norm_type per_head");
    if (d->shared_inter != 0 || d->n_dense_layers != 0)
        return mr_error_set(MR_EUNSUPPORTED, "shared experts and dense layers are not part of MiniMax-M2");
    if (d->tie_embeddings) return mr_error_set(MR_EUNSUPPORTED, "tie_word_embeddings=true is not supported");
    /* the one hyperparameter struct: the description itself (the exclusion list stays with d) */
    *c = *d;
    c->quant.exclude = NULL;
    c->quant.n_exclude = 0;
    if (c->vocab <= 0 || c->hidden <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 ||
        c->head_dim <= 0 || c->n_experts <= 0 || c->top_k <= 0 || c->moe_inter <= 0 || c->top_k > c->n_experts ||
        c->n_heads % c->n_kv_heads || c->rotary_dim < 0 || c->rotary_dim > c->head_dim || c->rotary_dim % 2 ||
        c->vocab > INT32_MAX)
        return mr_error_set(MR_ECONFIG, "config.json: inconsistent dimensions (hidden %lld, layers %lld, heads %lld/%lld, "
                            "head_dim %lld, rotary_dim %lld, experts %d top-%d, inter %lld, vocab %lld)",
                            (long long)c->hidden, (long long)c->n_layers, (long long)c->n_heads,
                            (long long)c->n_kv_heads, (long long)c->head_dim, (long long)c->rotary_dim, c->n_experts,
                            c->top_k, (long long)c->moe_inter, (long long)c->vocab);
    return MR_OK;
}

/* Format of one linear: the checkpoint's quantization unless excluded. */
static mr_format linear_format(const mr_model_desc *d, mr_format quantized, const char *name) {
    if (quantized == MR_FMT_BF16 || mr_quant_is_excluded(&d->quant, name)) return MR_FMT_BF16;
    return quantized;
}

static void progress(const mr_model *m, int64_t done, int64_t total) {
    if (!m->opts.progress || !isatty(2)) return;
    int w = 30, f = (int)(done * w / (total ? total : 1));
    fprintf(stderr, "\rloading [%.*s%*s] %lld/%lld layers", f, "==============================", w - f, "",
            (long long)done, (long long)total);
    if (done == total) fprintf(stderr, "\n");
    fflush(stderr);
}

/* The weight set's release hook: once the after-load no longer needs a
 * source matrix, its pages in the mapping go back (heap copies are not
 * touched here: the matrix owns those and frees them). */
static void release_source(void *user, const mr_qmatrix *q) {
    const mr_ckpt *ck = ((const mr_model *)user)->ckpt;
    mr_ckpt_release(ck, q->data, mr_qmatrix_data_bytes(q));
    if (q->scale) mr_ckpt_release(ck, q->scale, mr_qmatrix_scale_bytes(q));
}

mr_status mr__model_load_experts(mr_model *m, const void *ckv, int l, int first, int n_local, mr_moe_weights **out) {
    const mr_ckpt *ck = ckv;
    const mr_model_config *c = &m->c;
    const int64_t H = c->hidden, E = c->n_experts;
    const mr_format ef = m->expert_format;
    *out = NULL;
    if (first < 0 || n_local < 1 || first > E - n_local)
        return mr_error_set(MR_EINVAL, "layer %d: local experts [%d, %d) outside the %lld experts", l, first,
                            first + n_local, (long long)E);
    mr_moe_weights *w = NULL;
    mr_status st = mr_moe_weights_new(&w, n_local, H, c->moe_inter, ef);
    if (st) return st;
    w->expert_first = first;
    w->release_source = release_source;
    w->release_user = m;
    int missing = 0;
    float max_in13 = 0.0f, max_in2 = 0.0f;
    bool *miss = mr_calloc((size_t)E * 3, sizeof(bool));
    if (!miss) {
        mr_moe_weights_free(w);
        return MR_ENOMEM;
    }
    /* every expert's input_scale counts towards the layer's w4a4 scales; only the local ones are loaded */
    for (int64_t x = 0; x < E && !st; x++) {
        const bool local = x >= first && x < first + n_local;
        if (!local && ef != MR_FMT_NVFP4) continue;
        char wn[360];
        mr_qmatrix scratch[3];
        mr_qmatrix *q3[3] = {local ? &w->w1[x - first] : &scratch[0], local ? &w->w3[x - first] : &scratch[1],
                             local ? &w->w2[x - first] : &scratch[2]};
        static const mr_hf_tensor which[3] = {MR_HF_EXPERT_W1, MR_HF_EXPERT_W3, MR_HF_EXPERT_W2};
        const int64_t NK[3][2] = {{c->moe_inter, H}, {c->moe_inter, H}, {H, c->moe_inter}};
        for (int i = 0; i < 3 && !st; i++) {
            mr_hf_name(which[i], l, (int)x, "", wn, sizeof wn); /* the module */
            if (local) {
                st = load_linear(m, ck, wn, ef, NK[i][0], NK[i][1], q3[i], &miss[x * 3 + i], false);
            } else { /* another peer's expert: only its input_scale */
                char sn[400];
                bool found;
                snprintf(sn, sizeof sn, "%s.input_scale", wn);
                q3[i]->input_scale = 0.0f;
                st = load_scalar_f32(ck, sn, &q3[i]->input_scale, &found);
                miss[x * 3 + i] = !found;
            }
            if (!st && !miss[x * 3 + i] && ef == MR_FMT_NVFP4) {
                float *mx = i < 2 ? &max_in13 : &max_in2;
                if (q3[i]->input_scale > *mx) *mx = q3[i]->input_scale;
            }
            if (miss[x * 3 + i]) missing++;
        }
    }
    if (!st && missing) {
        /* An NVFP4 expert without input_scale takes the maximum over the
         * others of the same input: w1/w3 (the layer input) or w2 (the
         * intermediate). A group where none has one has nothing to fall back on. */
        bool miss13 = false, miss2 = false;
        for (int64_t x = 0; x < E; x++) {
            miss13 = miss13 || miss[x * 3] || miss[x * 3 + 1];
            miss2 = miss2 || miss[x * 3 + 2];
        }
        char ex[360];
        if (miss13 && max_in13 == 0.0f)
            st = mr_error_set(MR_ENOTFOUND, "layer %d: no NVFP4 expert carries a w1/w3 input_scale to fall back on "
                              "(e.g. %s, expected F32 [])", l,
                              (mr_hf_name(MR_HF_EXPERT_W1, l, 0, "input_scale", ex, sizeof ex), ex));
        else if (miss2 && max_in2 == 0.0f)
            st = mr_error_set(MR_ENOTFOUND, "layer %d: no NVFP4 expert carries a w2 input_scale to fall back on "
                              "(e.g. %s, expected F32 [])", l,
                              (mr_hf_name(MR_HF_EXPERT_W2, l, 0, "input_scale", ex, sizeof ex), ex));
        for (int64_t x = first; x < first + n_local && !st; x++) {
            for (int i = 0; i < 3; i++) {
                if (!miss[x * 3 + i]) continue;
                mr_qmatrix *q = i == 0 ? &w->w1[x - first] : i == 1 ? &w->w3[x - first] : &w->w2[x - first];
                q->input_scale = i < 2 ? max_in13 : max_in2;
            }
        }
        if (!st)
            MR_WARN("layer %d: %d NVFP4 expert weight%s without input_scale; using the maximum over the other experts",
                    l, missing, missing == 1 ? "" : "s");
    }
    mr_free(miss);
    /* w4a4's global scales: the max over all the layer's experts, wherever they run */
    w->in_scale13 = max_in13;
    w->in_scale2 = max_in2;
    if (!st) st = mr_moe_weights_validate(w);
    if (st) {
        mr_moe_weights_free(w);
        return st;
    }
    *out = w;
    return MR_OK;
}

/* An FP8 KV cache's per-layer scales where the checkpoint has them, under the
 * names vLLM reads: ModelOpt's self_attn.k_proj.k_scale / v_proj.v_scale,
 * self_attn.k_scale / v_scale, or the older self_attn.kv_scale for both (F32
 * scalars, finite and > 0); 1 where it has none. *found: how many it had. */
static mr_status load_kv_scales(const mr_ckpt *ck, int l, mr__layer *L, int *found) {
    char attn[320], n[352];
    mr_hf_name(MR_HF_K_PROJ, l, -1, "", attn, sizeof attn); /* model.layers.L.self_attn.k_proj */
    char *dot = strrchr(attn, '.');
    if (dot) *dot = '\0';
    static const struct {
        const char *suffix;
        bool v;
    } cand[] = {{"k_proj.k_scale", false}, {"k_scale", false}, {"kv_scale", false},
                {"v_proj.v_scale", true},  {"v_scale", true},  {"kv_scale", true}};
    bool have[2] = {false, false};
    L->k_scale = L->v_scale = 1.0f;
    for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++) {
        if (have[cand[i].v]) continue;
        snprintf(n, sizeof n, "%s.%s", attn, cand[i].suffix);
        float v = 0.0f;
        bool got = false;
        mr_status st = load_scalar_f32(ck, n, &v, &got);
        if (st) return st;
        if (!got) continue;
        if (!(v > 0.0f))
            return mr_error_set(MR_EFORMAT, "tensor %s: a KV cache scale must be above 0, found %g", n, (double)v);
        *(cand[i].v ? &L->v_scale : &L->k_scale) = v;
        have[cand[i].v] = true;
        (*found)++;
    }
    return MR_OK;
}

static mr_status load_layer(mr_model *m, const mr_ckpt *ck, const mr_model_desc *d, int l) {
    const mr_model_config *c = &m->c;
    mr__layer *L = &m->w.layers[l];
    int64_t H = c->hidden, qd = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim, E = c->n_experts;
    char n[320];
    mr_status st;
    /* the layer's tensor names (io/ HF map); a suffix of "" names the module of a linear */
#define NAME(kind, suffix) (mr_hf_name(kind, l, -1, suffix, n, sizeof n), n)
    if ((st = load_vec(m, ck, NAME(MR_HF_ATTN_NORM, NULL), H, &L->attn_norm))) return st;
    if ((st = load_vec(m, ck, NAME(MR_HF_FFN_NORM, NULL), H, &L->ffn_norm))) return st;
    if ((st = load_vec(m, ck, NAME(MR_HF_Q_NORM, NULL), qd, &L->q_norm))) return st;
    if ((st = load_vec(m, ck, NAME(MR_HF_K_NORM, NULL), kd, &L->k_norm))) return st;
    struct { mr_hf_tensor kind; mr_qmatrix *q; int64_t N, K; } lin[4] = {
        {MR_HF_Q_PROJ, &L->wq, qd, H}, {MR_HF_K_PROJ, &L->wk, kd, H},
        {MR_HF_V_PROJ, &L->wv, kd, H}, {MR_HF_O_PROJ, &L->wo, H, qd}};
    for (int i = 0; i < 4; i++) {
        char wn[320];
        mr_hf_name(lin[i].kind, l, -1, NULL, wn, sizeof wn);
        mr_format f = linear_format(d, m->attn_format, wn);
        bool unused = false;
        if ((st = load_linear(m, ck, NAME(lin[i].kind, ""), f, lin[i].N, lin[i].K, lin[i].q, &unused, true))) return st;
        lin[i].q->x_bf16 = m->s.dense_bf16; /* forward.c rounds their inputs */
        if ((st = pack_dense(m, wn, lin[i].q, &L->tiles[i]))) return st;
    }
    /* router gate: a BF16 tensor stays BF16 (the same values as its fp32 widening, fp32 products
     * and sums on the dense fast paths, on tiles too: at 128 tokens 0.9 ms a layer on AMX against
     * 4.8 ms on the fp32 driver); an F32 one is kept as it is, copied */
    {
        const mr_st_tensor *t;
        int64_t sh[2] = {E, H};
        if ((st = get_tensor(ck, NAME(MR_HF_ROUTER, NULL), MR_ST_BF16, MR_ST_F32, 2, sh, &t))) return st;
        if (t->dtype == MR_ST_BF16) {
            const void *p = in_place(m, t, 2);
            if (!p) return MR_ENOMEM;
            L->gate = (mr_qmatrix){.fmt = MR_FMT_BF16, .rows = E, .cols = H, .data = (void *)p, .scale2 = 1.0f};
            if ((st = pack_dense(m, n, &L->gate, &L->tiles[4]))) return st;
        } else {
            float *g = NULL;
            if ((st = widen_f32(m, t, E * H, &g))) return st;
            L->gate = (mr_qmatrix){.fmt = MR_FMT_F32, .rows = E, .cols = H, .data = g, .scale2 = 1.0f};
        }
    }
    if ((st = load_vec(m, ck, NAME(MR_HF_ROUTER_BIAS, NULL), E, &L->bias))) return st;
    if ((st = load_kv_scales(ck, l, L, &m->s.kv_scales_found))) return st;
    /* experts: the local ones, then the runner's after-load */
    int first, n_local;
    mr_moe_problem_local(&m->problem, &first, &n_local);
    if ((st = mr__model_load_experts(m, ck, l, first, n_local, &L->experts))) return st;
    if ((st = mr_moe_ctx_prepare(m->moe, L->experts))) return st; /* its sources' pages go back as it packs */
    m->mem.experts += mr_moe_weights_expert_bytes(L->experts) * (size_t)L->experts->n_experts;
    return MR_OK;
#undef NAME
}

/* The KV cache is sized by the caller's batch and context: one that cannot
 * fit this machine's memory is refused before any weight is read (rather than
 * left to the allocator, or to the kernel's OOM killer). */
static mr_status check_kv_fits(const mr_model *m) {
    const mr_model_config *c = &m->c;
    const mr__state *s = &m->s;
    size_t kv, pool;
    if (!mr_size_mul((size_t)c->n_layers * (size_t)s->max_batch, (size_t)s->max_ctx, &kv) ||
        !mr_size_mul(kv, (size_t)(c->n_kv_heads * c->head_dim) * sizeof(float) * 2, &kv))
        return mr_error_set(MR_ECAPACITY, "the KV cache for a batch of %lld x context %lld overflows",
                            (long long)s->max_batch, (long long)s->max_ctx);
    if (!mr_size_mul((size_t)s->kv_blocks * MR_KV_BLOCK_TOKENS, mr_model_kv_token_bytes(c, s->kv_dtype), &pool) ||
        !mr_size_add(kv, pool, &kv))
        return mr_error_set(MR_ECAPACITY, "the KV pool of %lld blocks overflows", (long long)s->kv_blocks);
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    double have = (double)pages * (double)psz;
    if (pages > 0 && psz > 0 && (double)kv > have)
        return mr_error_set(MR_ECAPACITY,
                            "the KV cache (a batch of %lld x context %lld, and a pool of %lld blocks of %d tokens) "
                            "needs %.1f GiB, more than this machine's %.1f GiB of memory",
                            (long long)s->max_batch, (long long)s->max_ctx, (long long)s->kv_blocks,
                            MR_KV_BLOCK_TOKENS, (double)kv / 1073741824.0, have / 1073741824.0);
    return MR_OK;
}

static mr_status alloc_state(mr_model *m) {
    const mr_model_config *c = &m->c;
    mr__state *s = &m->s;
    size_t T = (size_t)s->max_tokens, H = (size_t)c->hidden, qd = (size_t)(c->n_heads * c->head_dim),
           kd = (size_t)(c->n_kv_heads * c->head_dim), kv;
    if (!mr_size_mul((size_t)c->n_layers * (size_t)s->max_batch, (size_t)s->max_ctx, &kv) ||
        !mr_size_mul(kv, kd * sizeof(float), &kv))
        return mr_error_set(MR_EOVERFLOW, "KV cache size overflows");
    size_t bytes;
#define A(ptr, count) \
    if (!mr_size_mul((size_t)(count), sizeof(*(ptr)), &bytes) || !((ptr) = own_alloc(m, bytes))) return MR_ENOMEM
    A(s->x, T * H);
    A(s->xn, T * H);
    A(s->q, T * qd);
    A(s->k, T * kd);
    A(s->v, T * kd);
    A(s->att, T * qd);
    A(s->y, T * H);
    A(s->hlast, T * H);
    /* per thread: a query group's scores [group][max_ctx], then the kernels' rows widened to fp32 */
    int64_t group = c->n_heads / c->n_kv_heads;
    if (!mr_size_mul((size_t)group, (size_t)s->max_ctx, &s->scores_per_thread) ||
        !mr_size_add(s->scores_per_thread, mr__attn_wk_floats(c->head_dim), &s->scores_per_thread))
        return mr_error_set(MR_EOVERFLOW, "attention scratch size overflows");
    A(s->scores, (size_t)s->n_threads * s->scores_per_thread);
    A(s->pos, T);
    A(s->slot, T);
    A(s->tok_bt, T);
    A(s->out_tok, T);
    A(s->out_row, T);
    A(s->inv_freq, (size_t)c->rotary_dim / 2 + 1);
    A(s->len, (size_t)s->max_batch);
    A(s->rlogits, T * (size_t)c->n_experts);
    A(s->ids, T * (size_t)c->top_k);
    A(s->wts, T * (size_t)c->top_k);
    A(s->xb, T * H);
    A(s->ob, T * H);
    A(s->emark, (size_t)c->n_experts);
#undef A
    /* the dense path on tiles' workspace, for the widest projection input at max_tokens */
    const int nt = s->n_threads > omp_get_max_threads() ? s->n_threads : omp_get_max_threads();
    s->dws_bytes = mr_matmul_ws_bytes(s->max_tokens, (int64_t)(H > qd ? H : qd), nt);
    if (s->dws_bytes && !(s->dws = own_alloc(m, s->dws_bytes))) return MR_ENOMEM;
    if (s->max_batch > 0) {
        s->kcache = own_alloc(m, kv);
        s->vcache = own_alloc(m, kv);
        if (!s->kcache || !s->vcache)
            return mr_error_set(MR_ENOMEM, "KV cache of 2 x %zu bytes does not fit in memory", kv);
        memset(s->len, 0, (size_t)s->max_batch * sizeof(int64_t));
    }
    if (s->kv_blocks > 0) { /* sizes checked by check_kv_fits */
        s->kv_pool_bytes = (size_t)s->kv_blocks * MR_KV_BLOCK_TOKENS * mr_model_kv_token_bytes(c, s->kv_dtype) / 2;
        s->kpool = own_alloc(m, s->kv_pool_bytes);
        s->vpool = own_alloc(m, s->kv_pool_bytes);
        s->blk_mark = own_alloc(m, (size_t)s->kv_blocks);
        if (!s->kpool || !s->vpool || !s->blk_mark)
            return mr_error_set(MR_ENOMEM, "KV pool of 2 x %zu bytes does not fit in memory", s->kv_pool_bytes);
        memset(s->blk_mark, 0, (size_t)s->kv_blocks);
    }
    mr__rope_freqs(s->inv_freq, c->rotary_dim, c->rope_theta);
    return MR_OK;
}

/* Which runner runs is the frozen exec's answer, and only its: without
 * opts.exec the loader asks the resolver itself (opts.runner and
 * opts.act_mode are then the user's options) and keeps that resolution. */
static mr_status setup_runner(mr_model *m, const mr_model_desc *d) {
    const mr_model_opts *o = &m->opts;
    const mr_exec *x = o->exec;
    if (!x) {
        mr_options opt;
        mr_status st = mr_options_init(&opt);
        if (!st && o->runner) st = mr_options_set(&opt, "moe_runner_backend", o->runner, MR_SRC_FLAG);
        if (!st && o->act_mode != MR_ACT_AUTO)
            st = mr_options_set(&opt, "activation_mode", mr_act_mode_name(o->act_mode), MR_SRC_FLAG);
        if (!st && o->dense_act_dtype != MR_FMT_F32)
            st = o->dense_act_dtype == MR_FMT_BF16
                     ? mr_options_set(&opt, "dense_activation_dtype", "bf16", MR_SRC_FLAG)
                     : mr_error_set(MR_EINVAL, "model options: dense_act_dtype is F32 or BF16");
        if (!st) st = mr_resolve_model(&opt, d, &m->own_res);
        mr_options_free(&opt);
        if (st) return st; /* the resolver's message says why (a runner refusing the model: MR_ERESOLVE) */
        x = mr_resolution_exec(m->own_res);
    }
    m->runner = x->runner;
    m->problem = x->problem;
    m->s.dense_bf16 = x->dense_act_dtype == MR_FMT_BF16;
    if (d->routing != MR_ROUTING_MINIMAX2 || m->problem.routing != MR_ROUTING_MINIMAX2)
        return mr_error_set(MR_ECONFIG, "MiniMax-M2 routes with minimax2; the configuration says %s",
                            mr_routing_name(d->routing));
    if (m->problem.weight_format != m->expert_format)
        return mr_error_set(MR_ESTATE, "the resolved expert format %s differs from the checkpoint's %s",
                            mr_format_traits_get(m->problem.weight_format)->name,
                            mr_format_traits_get(m->expert_format)->name);
    m->routing = (mr_routing){.method = MR_ROUTING_MINIMAX2, .n_experts = (int)m->c.n_experts,
                              .top_k = (int)m->c.top_k, .scale = d->routed_scale > 0 ? d->routed_scale : 1.0f};
    return MR_OK;
}

/* weights_only: the weights alone (mr_model_weights_load): no state, a one-token MoE workspace. */
static mr_status open_model(const char *dir, const mr_model_opts *opts, bool weights_only, mr_model **out) {
    *out = NULL;
    const uint64_t t_open = mr_now_ns();
    mr_model *m = mr_calloc(1, sizeof *m);
    if (!m) return MR_ENOMEM;
    m->weights_only = weights_only;
    mr_model_desc desc_local;
    memset(&desc_local, 0, sizeof desc_local);
    const mr_model_desc *d = &desc_local;
    mr_ckpt *ck = NULL;
    mr_status st = MR_OK;
    m->opts = opts ? *opts : (mr_model_opts){0};
    if (m->opts.exec) {
        d = m->opts.exec->model;
    } else if ((st = mr_model_desc_load(dir, &desc_local))) {
        goto out;
    }
    if ((st = config_from_desc(d, &m->c))) goto out;
    if (!(m->erec = mr_calloc((size_t)m->c.n_layers * (size_t)(m->c.n_experts > 0 ? m->c.n_experts : 1),
                              sizeof *m->erec))) {
        st = mr_error_set(MR_ENOMEM, "out of memory for the expert counts");
        goto out;
    }
    m->expert_format = mr_quant_weight_format(d->quant.kind);
    m->attn_format = d->quant.kind == MR_QUANT_FP8_BLOCK ? MR_FMT_FP8_BLOCK : MR_FMT_BF16;
    /* state sizes */
    mr__state *s = &m->s;
    s->kv_blocks = m->opts.kv_blocks > 0 ? m->opts.kv_blocks : 0;
    s->kv_dtype = m->opts.kv_dtype;
    if (!mr_kv_dtype_name(s->kv_dtype)) {
        st = mr_error_set(MR_EINVAL, "the KV pool holds fp32, bf16, fp8_e4m3 or fp8_e5m2");
        goto out;
    }
    if (s->kv_blocks > INT32_MAX) {
        st = mr_error_set(MR_ECAPACITY, "a KV pool of %lld blocks: block ids are 32-bit", (long long)s->kv_blocks);
        goto out;
    }
    s->max_batch = m->opts.max_batch > 0 ? m->opts.max_batch : s->kv_blocks > 0 ? 0 : 1;
    s->max_ctx = m->opts.max_ctx > 0 ? m->opts.max_ctx : 256;
    s->n_threads = m->opts.exec && m->opts.exec->threads > 0 ? m->opts.exec->threads : omp_get_max_threads();
    if (m->c.n_heads / m->c.n_kv_heads > 64) {
        st = mr_error_set(MR_EUNSUPPORTED, "%lld query heads per kv head: attention handles up to 64",
                          (long long)(m->c.n_heads / m->c.n_kv_heads));
        goto out;
    }
    if (weights_only) {
        s->max_batch = 0;
        s->kv_blocks = 0;
        s->max_tokens = 1;
    } else {
        if ((st = check_kv_fits(m))) goto out;
        /* after the check: max_batch * max_ctx and the pool are bounded by memory
         * (no overflow); a call never holds more tokens than the caches do */
        int64_t cache_tokens = (int64_t)s->max_batch * s->max_ctx + s->kv_blocks * MR_KV_BLOCK_TOKENS;
        s->max_tokens = m->opts.max_tokens > 0 ? m->opts.max_tokens : (cache_tokens < 512 ? cache_tokens : 512);
        if (s->max_tokens > cache_tokens) s->max_tokens = cache_tokens;
    }
    if ((st = setup_runner(m, d))) goto out;
    if ((st = mr_ckpt_open(dir, &ck))) goto out;
    m->ckpt = ck;
    const mr_model_config *c = &m->c;
    {
        const mr_st_tensor *t;
        int64_t sh[2] = {c->vocab, c->hidden};
        char n[160];
        mr_hf_name(MR_HF_EMBED, -1, -1, NULL, n, sizeof n);
        if ((st = get_tensor(ck, n, MR_ST_BF16, -1, 2, sh, &t))) goto out;
        if (!(m->w.embed = in_place(m, t, 2))) {
            st = MR_ENOMEM;
            goto out;
        }
        mr_hf_name(MR_HF_FINAL_NORM, -1, -1, NULL, n, sizeof n);
        if ((st = load_vec(m, ck, n, c->hidden, &m->w.final_norm))) goto out;
        bool unused = false;
        mr_hf_name(MR_HF_LM_HEAD, -1, -1, "", n, sizeof n);
        if ((st = load_linear(m, ck, n, MR_FMT_BF16, c->vocab, c->hidden, &m->w.lm_head, &unused, true)))
            goto out;
        m->w.lm_head.x_bf16 = s->dense_bf16;
        if ((st = pack_dense(m, n, &m->w.lm_head, &m->w.lm_tiles))) goto out;
    }
    m->w.layers = mr_calloc((size_t)c->n_layers, sizeof(mr__layer));
    if (!m->w.layers) {
        st = MR_ENOMEM;
        goto out;
    }
    const size_t owned_before_state = m->owned_bytes;
    m->own_state = true;
    if (!m->weights_only && (st = alloc_state(m))) goto out;
    m->own_state = false;
    {
        const size_t state = m->owned_bytes - owned_before_state;
        size_t kvc = 0;
        if (s->max_batch > 0) /* the contiguous cache (sizes checked by check_kv_fits) */
            kvc = (size_t)c->n_layers * (size_t)s->max_batch * (size_t)s->max_ctx *
                  (size_t)(c->n_kv_heads * c->head_dim) * sizeof(float) * 2;
        if (s->kv_blocks > 0) kvc += 2 * s->kv_pool_bytes;
        m->mem.kv = kvc < state ? kvc : state;
        m->mem.activations = state - m->mem.kv;
    }
    /* one MoE context (runner state, transport, workspace) for every layer */
    {
        /* staged weights run nothing: their context packs this rank's experts (local_first, n_local) and
         * opens no transport (under expert parallelism the running model's stays the one in use) */
        mr_moe_problem p = m->problem;
        if (weights_only) p.a2a = MR_A2A_NONE, p.ep_size = 1, p.ep_rank = 0;
        if ((st = mr_moe_ctx_new(m->runner, &p, s->max_tokens, &m->moe))) goto out;
    }
    for (int l = 0; l < c->n_layers; l++) {
        if ((st = load_layer(m, ck, d, l))) goto out;
        progress(m, l + 1, c->n_layers);
    }
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) m->peak_rss = (size_t)ru.ru_maxrss * 1024;
    /* what the model holds, against what the process holds after the load */
    m->mem.moe_workspace = mr_moe_ctx_workspace_bytes(m->moe);
    m->mem.weights_copied = m->owned_bytes - m->mem.activations - m->mem.kv;
    m->mem.kept = m->mem.weights_mapped + m->mem.weights_copied + m->mem.experts + m->mem.activations + m->mem.kv +
                  m->mem.moe_workspace;
    m->mem.rss_peak_load = mr_mem_rss_peak();
    m->mem.rss_load = mr_mem_rss();
    m->mem.load_s = (double)(mr_now_ns() - t_open) * 1e-9;
out:
    if (!m->opts.exec) mr_model_desc_free(&desc_local);
    if (st) {
        mr_model_close(m);
        return st;
    }
    *out = m;
    return MR_OK;
}

mr_status mr_model_open(const char *dir, const mr_model_opts *opts, mr_model **out) {
    return open_model(dir, opts, false, out);
}

/* The first hyperparameter in which the checkpoint described by nd differs from the running model's (c, and
 * the quantization of cur, which has the exclusion list), named as config.json names it; false when none. */
static bool desc_differs(const mr_model_config *c, const mr_model_desc *cur, const mr_model_desc *nd, char *why,
                         size_t n) {
    const struct {
        const char *name;
        double a, b;
    } f[] = {
        {"hidden_size", (double)c->hidden, (double)nd->hidden},
        {"num_hidden_layers", (double)c->n_layers, (double)nd->n_layers},
        {"num_attention_heads", (double)c->n_heads, (double)nd->n_heads},
        {"num_key_value_heads", (double)c->n_kv_heads, (double)nd->n_kv_heads},
        {"head_dim", (double)c->head_dim, (double)nd->head_dim},
        {"rotary_dim", (double)c->rotary_dim, (double)nd->rotary_dim},
        {"vocab_size", (double)c->vocab, (double)nd->vocab},
        {"intermediate_size", (double)c->moe_inter, (double)nd->moe_inter},
        {"num_local_experts", (double)c->n_experts, (double)nd->n_experts},
        {"num_experts_per_tok", (double)c->top_k, (double)nd->top_k},
        {"max_position_embeddings", (double)c->max_pos, (double)nd->max_pos},
        {"rope_theta", c->rope_theta, nd->rope_theta},
        {"rms_norm_eps", c->rms_eps, nd->rms_eps},
        {"routed_scaling_factor", (double)c->routed_scale, (double)nd->routed_scale},
        {"use_routing_bias", (double)c->routing_bias, (double)nd->routing_bias},
        {"n_group", (double)c->n_group, (double)nd->n_group},
        {"topk_group", (double)c->topk_group, (double)nd->topk_group},
        {"the quantization", (double)cur->quant.kind, (double)nd->quant.kind},
        {"weight_block_size[0]", (double)cur->quant.block_n, (double)nd->quant.block_n},
        {"weight_block_size[1]", (double)cur->quant.block_k, (double)nd->quant.block_k},
        {"the quantization's group_size", (double)cur->quant.group_size, (double)nd->quant.group_size},
        {"the quantization's excluded modules (count)", (double)cur->quant.n_exclude, (double)nd->quant.n_exclude},
        {"the EOS ids (count)", (double)c->n_eos, (double)nd->n_eos},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].a != f[i].b) {
            snprintf(why, n, "%s is %.9g in the running model and %.9g in the new checkpoint", f[i].name, f[i].a, f[i].b);
            return true;
        }
    if (strcmp(c->architecture, nd->architecture)) {
        snprintf(why, n, "architectures is %s in the running model and %s in the new checkpoint", c->architecture,
                 nd->architecture);
        return true;
    }
    if (c->routing != nd->routing || c->qk_norm != nd->qk_norm || c->tie_embeddings != nd->tie_embeddings) {
        snprintf(why, n, "the routing or the q/k norms differ (%s in the new checkpoint)", nd->routing_why);
        return true;
    }
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] != nd->eos_ids[i]) {
            snprintf(why, n, "EOS id %d is %d in the running model and %d in the new checkpoint", i, c->eos_ids[i],
                     nd->eos_ids[i]);
            return true;
        }
    for (int i = 0; i < cur->quant.n_exclude; i++)
        if (strcmp(cur->quant.exclude[i], nd->quant.exclude[i])) {
            snprintf(why, n, "excluded module %d is '%.80s' in the running model and '%.80s' in the new checkpoint", i,
                     cur->quant.exclude[i], nd->quant.exclude[i]);
            return true;
        }
    return false;
}

static const char *meminfo_path; /* mr__model_set_meminfo */
void mr__model_set_meminfo(const char *path) { meminfo_path = path; }

mr_status mr_model_weights_load(const mr_model *m, const char *dir, mr_model **out) {
    *out = NULL;
    if (m->weights_only) return mr_error_set(MR_EINVAL, "mr_model_weights_load: the model is itself staged weights");
    const mr_exec *x = m->opts.exec ? m->opts.exec : mr_resolution_exec(m->own_res);
    mr_model_desc nd;
    memset(&nd, 0, sizeof nd);
    mr_status st = mr_model_desc_load(dir, &nd);
    if (st) return st;
    char why[320];
    const bool differs = desc_differs(&m->c, x->model, &nd, why, sizeof why);
    mr_model_desc_free(&nd);
    if (differs)
        return mr_error_set(MR_ECONFIG, "%s holds another model: %s (only the weights can change; the resolved runner "
                            "and the state were made for this model)", dir, why);
    /* both weight sets are resident until the swap: the new set's own memory (packed experts, copies; the
     * mapped part is page cache the kernel can take back) must fit in what is available now */
    const size_t need = m->mem.experts + m->mem.weights_copied, avail = mr_mem_proc_kb(meminfo_path ? meminfo_path : "/proc/meminfo", "MemAvailable:");
    if (avail > 0 && need > avail)
        return mr_error_set(MR_ECAPACITY, "loading %s beside the running weights needs about %.2f GiB, and %.2f GiB are "
                            "available: free memory, or restart the server on the new checkpoint", dir,
                            (double)need / 1073741824.0, (double)avail / 1073741824.0);
    mr_model_opts o = m->opts;
    o.exec = x; /* the running model's frozen decision, whoever made it */
    o.progress = false;
    return open_model(dir, &o, true, out);
}

/* a and b exchanged, n bytes each (n <= sizeof(mr__weights)) */
static void swap_bytes(void *a, void *b, size_t n) {
    unsigned char t[sizeof(mr__weights)];
    MR_ASSERT(n <= sizeof t);
    memcpy(t, a, n);
    memcpy(a, b, n);
    memcpy(b, t, n);
}

void mr_model_weights_swap(mr_model *m, mr_model *staged) {
#define SWAP(f) swap_bytes(&m->f, &staged->f, sizeof m->f)
    SWAP(w);
    SWAP(ckpt);
    SWAP(owned);
    SWAP(n_owned);
    SWAP(cap_owned);
    SWAP(s.kv_scales_found);
    SWAP(mem.weights_mapped);
    SWAP(mem.weights_copied);
    SWAP(mem.experts);
#undef SWAP
    /* the LM head's packed form lives inside mr__weights: its pointer follows the struct */
    if (m->w.lm_head.tiles) m->w.lm_head.tiles = &m->w.lm_tiles;
    if (staged->w.lm_head.tiles) staged->w.lm_head.tiles = &staged->w.lm_tiles;
}

bool mr_model_is_staged(const mr_model *m) { return m->weights_only; }

void mr_model_expert_record(mr_model *m, bool on) {
    if (on) {
        atomic_store(&m->erec_on, false);
        for (size_t i = 0; i < (size_t)m->c.n_layers * (size_t)m->c.n_experts; i++) atomic_store(&m->erec[i], 0);
    }
    atomic_store(&m->erec_on, on);
}
bool mr_model_expert_recording(const mr_model *m) { return atomic_load(&m->erec_on); }
void mr_model_expert_counts(const mr_model *m, uint64_t *out) {
    for (size_t i = 0; i < (size_t)m->c.n_layers * (size_t)m->c.n_experts; i++) out[i] = atomic_load(&m->erec[i]);
}

void mr_model_capture_routes(mr_model *m, int32_t *out) { m->routes_out = out; }

void mr_model_close(mr_model *m) {
    if (!m) return;
    mr_free(m->erec);
    if (m->w.layers)
        for (int64_t l = 0; l < m->c.n_layers; l++) {
            mr_moe_weights_free(m->w.layers[l].experts);
            for (int i = 0; i < 5; i++) mr_pmatrix_free(&m->w.layers[l].tiles[i]);
        }
    mr_pmatrix_free(&m->w.lm_tiles);
    mr_moe_ctx_free(m->moe);
    mr_resolution_free(m->own_res);
    mr_free(m->w.layers);
    for (int i = 0; i < m->n_owned; i++) mr_aligned_free(m->owned[i]);
    mr_free(m->owned);
    for (int i = 0; i < m->n_sowned; i++) mr_aligned_free(m->sowned[i]);
    mr_free(m->sowned);
    mr_ckpt_close(m->ckpt);
    mr_free(m);
}

const mr_model_config *mr_model_config_of(const mr_model *m) { return &m->c; }
const char *mr_model_runner_name(const mr_model *m) { return m->runner->name; }
mr_act_mode mr_model_act_mode(const mr_model *m) { return m->problem.act_mode; }
size_t mr_model_peak_rss(const mr_model *m) { return m->peak_rss; }
void mr_model_memory_get(const mr_model *m, mr_model_memory *out) { *out = m->mem; }
void mr_model_ep(const mr_model *m, int *rank, int *size) {
    *rank = m->problem.ep_size > 1 ? m->problem.ep_rank : 0;
    *size = m->problem.ep_size > 1 ? m->problem.ep_size : 1;
}
void mr_model_weight_bytes_get(const mr_model *m, mr_model_weight_bytes *out) {
    memset(out, 0, sizeof *out);
    for (int64_t l = 0; l < m->c.n_layers; l++) {
        const mr__layer *L = &m->w.layers[l];
        out->attn += mr_qmatrix_bytes(&L->wq) + mr_qmatrix_bytes(&L->wk) + mr_qmatrix_bytes(&L->wv) +
                     mr_qmatrix_bytes(&L->wo);
        out->router += mr_qmatrix_bytes(&L->gate) + (size_t)m->c.n_experts * sizeof(float);
    }
    if (m->c.n_layers > 0) out->expert = mr_moe_weights_expert_bytes(m->w.layers[0].experts);
    out->lm_head = mr_qmatrix_bytes(&m->w.lm_head);
}
bool mr_model_is_eos(const mr_model *m, int32_t tok) {
    for (int i = 0; i < m->c.n_eos; i++)
        if (m->c.eos_ids[i] == tok) return true;
    return false;
}
void mr__model_set_moe_hook(mr_model *m,
                            void (*hook)(void *user, int layer, const float *x, const float *out, int64_t T,
                                         const int32_t *ids, int k),
                            void *user) {
    m->moe_input_hook = hook;
    m->moe_input_user = user;
}
