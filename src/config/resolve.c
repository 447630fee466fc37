/* resolve.c — resolution: (user options, model config, platform) -> frozen
 * exec config + declaration log (spec/resolution.md). Owns the passes, in
 * order:
 *
 *   1 checkpoint       architecture, quantization (+ tensor header check), activation mode, routing
 *   2 platform         device, CPU features (detected or simulated), kernel_isa, threads
 *   3 model_overrides  registry keyed by architecture (overrides.c)
 *   4 moe_runner       walk the preference list, ask each predicate, record refusals
 *   5 a2a              transport, ep_size, the (a2a, runner) pair registry
 *   6 layout           what the chosen runner needs from the weights
 *   7 engine           KV cache dtype and pool size, scheduler limits (context, batch)
 *   8 validate         every explicit choice through the same predicates
 *   9 publish          freeze mr_exec in read-only pages
 *
 * The user's options are copied, never mutated. Each pass appends
 * (source, field, value, reason) declarations; the resolved value of an
 * option is the last declaration, else the user's explicit value, else the
 * default. Only config.json, hf_quant_config.json and safetensors headers
 * are read: never tensor data. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <omp.h>
#include <string.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/config_internal.h"
#include "moerun/io.h"
#include "moerun/kernels.h"

/* ---- small helpers ---- */

const char *mr_decl_kind_name(mr_decl_kind k) {
    switch (k) {
    case MR_DECL_SET: return "set";
    case MR_DECL_REFUSE: return "refuse";
    case MR_DECL_NOTE: return "note";
    case MR_DECL_ERROR: return "error";
    }
    return "?";
}

void mr__cpu_flags_str(uint32_t flags, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = 0;
    for (int b = 0; b < MR_CPU_FEATURE_COUNT; b++) {
        if (!(flags & (1u << b))) continue;
        int w = snprintf(buf + used, n - used, "%s%s", used ? " " : "", mr_cpu_feature_name(1u << b));
        if (w < 0 || (size_t)w >= n - used) break;
        used += (size_t)w;
    }
    if (used == 0) snprintf(buf, n, "(none)");
}

mr_status mr__decl(mr_resolution *r, mr_decl_kind k, const char *source, const char *field, const char *value,
                   const char *fmt, ...) {
    char reason[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    if (r->n_decls == r->cap_decls) {
        int cap = r->cap_decls ? r->cap_decls * 2 : 32;
        mr_decl *g = mr_realloc(r->decls, (size_t)cap * sizeof *g);
        if (g == NULL) return MR_ENOMEM;
        r->decls = g;
        r->cap_decls = cap;
    }
    char *v = mr_strdup(value ? value : "");
    char *why = mr_strdup(reason);
    if (v == NULL || why == NULL) {
        mr_free(v);
        mr_free(why);
        return MR_ENOMEM;
    }
    r->decls[r->n_decls++] = (mr_decl){k, source, field, v, why};
    return MR_OK;
}

/* Records a failure: an ERROR declaration plus the error detail. */
static mr_status fail(mr_resolution *r, mr_status st, const char *source, const char *field, const char *value,
                      const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;
static mr_status fail(mr_resolution *r, mr_status st, const char *source, const char *field, const char *value,
                      const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (mr__decl(r, MR_DECL_ERROR, source, field, value, "%s", msg) != MR_OK) return MR_ENOMEM;
    return mr_error_set(st, "%s", msg);
}

const char *mr__user_value(const mr_resolution *r, mr_opt_id id) { return r->user_value[id]; }

bool mr__user_fixed(const mr_resolution *r, mr_opt_id id) {
    if (r->user_source[id] == MR_SRC_DEFAULT) return false;
    const char *v = r->user_value[id];
    if (id == MR_OPT_EP_SIZE || id == MR_OPT_MAX_RUNNING_REQUESTS || id == MR_OPT_MAX_BATCH_TOKENS ||
        id == MR_OPT_CONTEXT_LENGTH || id == MR_OPT_EP_TIMEOUT)
        return strcmp(v, "0") != 0;
    return strcmp(v, "auto") != 0;
}

/* The launcher's world (mr_launcher_world): its size, this process's rank, and the variable read. */
int mr_launcher_world(int *rank, const char **from) {
    static const char *const size_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"};
    static const char *const rank_vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MPI_LOCALRANKID"};
    if (rank) *rank = 0;
    if (from) *from = NULL;
    for (size_t i = 0; i < sizeof size_vars / sizeof size_vars[0]; i++) {
        const char *v = getenv(size_vars[i]);
        long n = v && *v ? strtol(v, NULL, 10) : 0;
        if (n < 1 || n > 65536) continue;
        const char *rv = getenv(rank_vars[i]);
        long r = rv && *rv ? strtol(rv, NULL, 10) : 0;
        if (rank) *rank = r >= 0 && r < 65536 ? (int)r : 0;
        if (from) *from = size_vars[i];
        return (int)n;
    }
    return 1;
}

int mr_launcher_local(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMIX_LOCAL_SIZE",
                                       "SLURM_NTASKS_PER_NODE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        long n = v && *v ? strtol(v, NULL, 10) : 0;
        if (n >= 1 && n <= 65536) return (int)n;
    }
    return 1;
}

static int mpi_world_rank(void) {
    int r;
    mr_launcher_world(&r, NULL);
    return r;
}

static int mpi_world_size(const char **from) { return mr_launcher_world(NULL, from); }

void mr__problem(const mr_resolution *r, mr_moe_problem *p) {
    memset(p, 0, sizeof *p);
    p->device = r->w.device;
    p->cpu_flags = r->w.cpu_flags;
    p->weight_format = r->w.weight_format;
    p->act_mode = r->w.act_mode;
    p->act_dtype = MR_FMT_F32;
    p->routing = r->model.routing;
    p->n_experts = r->model.n_experts;
    p->top_k = r->model.top_k;
    p->n_group = r->model.n_group;
    p->topk_group = r->model.topk_group;
    p->hidden = r->model.hidden;
    p->inter = r->model.moe_inter;
    p->a2a = r->w.a2a;
    /* the experts this process computes: all of them, or its share of a contiguous placement */
    p->ep_size = r->w.ep_size > 0 ? r->w.ep_size : 1;
    p->ep_rank = p->ep_size > 1 ? r->w.ep_rank : 0;
    p->local_first = 0;
    p->n_local = p->n_experts;
    if (p->ep_size > 1 && p->n_experts > 0)
        mr_moe_placement_contiguous(p->n_experts, p->ep_size, p->ep_rank, &p->local_first, &p->n_local);
}

/* "routed, reference": the runners whose predicate (and pair) accepts p. */
static void working_runners(const mr_moe_problem *p, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < mr_moe_runner_count(); i++) {
        const mr_moe_runner *c = mr_moe_runner_at(i);
        char why[512];
        if (!c->supports(p, why, sizeof why) || !mr_a2a_pair_supported(p->a2a, c, why, sizeof why)) continue;
        int w = snprintf(buf + used, n - used, "%s%s", used ? ", " : "", c->name);
        if (w < 0 || (size_t)w >= n - used) break;
        used += (size_t)w;
    }
    if (used == 0) snprintf(buf, n, "none");
}

/* ---- pass 1: checkpoint ---- */

static bool is_float_dtype(mr_st_dtype d) { return d == MR_ST_BF16 || d == MR_ST_F16 || d == MR_ST_F32; }

/* Checks that the tensors' dtypes agree with the declared quantization,
 * from the headers only. Absent weights: a note. */
static mr_status check_tensor_headers(mr_resolution *r) {
    const mr_model_desc *m = &r->model;
    static const char *const SRC = "checkpoint";
    if (m->dir[0] == 0)
        return mr__decl(r, MR_DECL_NOTE, SRC, "tensors", "unchecked", "no checkpoint folder (description given directly)");
    char p1[1100], p2[1100];
    snprintf(p1, sizeof p1, "%s/model.safetensors.index.json", m->dir);
    snprintf(p2, sizeof p2, "%s/model.safetensors", m->dir);
    if (access(p1, F_OK) != 0 && access(p2, F_OK) != 0)
        return mr__decl(r, MR_DECL_NOTE, SRC, "tensors", "unchecked",
                        "the folder holds no model.safetensors(.index.json): tensor dtypes not checked");
    mr_ckpt *ck = NULL;
    mr_status s = mr_ckpt_open(m->dir, &ck);
    if (s != MR_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", mr_error_last());
        return fail(r, s, SRC, "tensors", "unreadable", "cannot read the safetensors headers: %s", msg);
    }
    size_t n = mr_ckpt_count(ck);
    int experts = 0;
    for (size_t i = 0; i < n && s == MR_OK; i++) {
        const mr_st_tensor *t = mr_ckpt_tensor_at(ck, i);
        const char *name = t->name;
        size_t len = strlen(name);
        bool is_weight = len > 7 && !strcmp(name + len - 7, ".weight");
        bool excluded = mr_quant_is_excluded(&m->quant, name);
        if (excluded && is_weight && !is_float_dtype(t->dtype)) {
            s = fail(r, MR_ECONFIG, SRC, "tensors", "contradiction",
                     "tensor %s is %s, but the quantization config excludes it (it must stay bf16/f16/f32)", name,
                     mr_st_dtype_name(t->dtype));
            break;
        }
        if (m->quant.kind == MR_QUANT_NONE && is_weight && !is_float_dtype(t->dtype)) {
            s = fail(r, MR_ECONFIG, SRC, "tensors", "contradiction",
                     "the config declares no quantization, but tensor %s is %s", name, mr_st_dtype_name(t->dtype));
            break;
        }
        if (!is_weight || excluded || strstr(name, ".experts.") == NULL) continue;
        /* an MTP layer (index >= num_hidden_layers) is never loaded: its format does not matter (quantize
         * leaves it bf16) */
        mr_hf_tensor hk;
        int hl = -1, he = -1;
        const char *hs = NULL;
        if (mr_hf_parse(name, &hk, &hl, &he, &hs) && hl >= m->n_layers) continue;
        /* an expert weight: its dtype and companions as the declared format stores them (formats/ traits) */
        size_t stem = len - 7; /* without ".weight" */
        if (stem > 500) continue;
        experts++;
        if (m->quant.kind == MR_QUANT_NONE) continue;
        const mr_format wf = mr_quant_weight_format(m->quant.kind);
        const mr_format_traits *tr = mr_format_traits_get(wf);
        bool ok = true;
        char expect[256] = "", missing[160] = "";
        size_t eu = 0;
        for (int j = 0; j < tr->n_tensors; j++) {
            const mr_format_tensor *ft = &tr->tensors[j];
            int w = snprintf(expect + eu, sizeof expect - eu, "%s%s%s%s", j == 0 ? "" : j == 1 ? " with " : ", ",
                             ft->st_dtype, j == 0 ? "" : " ", j == 0 ? "" : ft->suffix);
            if (w > 0 && (size_t)w < sizeof expect - eu) eu += (size_t)w;
            if (ft->role == MR_FT_DATA) {
                ok = ok && !strcmp(mr_st_dtype_name(t->dtype), ft->st_dtype);
                continue;
            }
            if (ft->optional) continue;
            char comp[600];
            snprintf(comp, sizeof comp, "%.*s.%s", (int)stem, name, ft->suffix);
            const mr_st_tensor *c = mr_ckpt_find(ck, comp);
            if (c == NULL && !missing[0]) snprintf(missing, sizeof missing, " and has no %s", ft->suffix);
            ok = ok && c != NULL && !strcmp(mr_st_dtype_name(c->dtype), ft->st_dtype);
        }
        if (!ok)
            s = fail(r, MR_ECONFIG, SRC, "tensors", "contradiction",
                     "the config declares %s (%s), but expert tensor %s is %s%s (expected %s)",
                     mr_quant_name(m->quant.kind), m->quant.where, name, mr_st_dtype_name(t->dtype), missing, expect);
    }
    if (s == MR_OK) {
        r->n_tensors_checked = (int)n;
        r->n_files_checked = (int)mr_ckpt_file_count(ck);
        s = mr__decl(r, MR_DECL_NOTE, SRC, "tensors", "agree",
                     "read the headers of %zu tensors in %zu file%s (no tensor data): the %d expert weights are %s",
                     n, mr_ckpt_file_count(ck), mr_ckpt_file_count(ck) == 1 ? "" : "s", experts,
                     m->quant.kind == MR_QUANT_NVFP4      ? "U8 with F8_E4M3 + F32 scales, as NVFP4 needs"
                     : m->quant.kind == MR_QUANT_FP8_BLOCK ? "F8_E4M3 with F32 block scales, as fp8 needs"
                                                           : "unquantized");
    }
    mr_ckpt_close(ck);
    return s;
}

static const char *act_mode_story(mr_act_mode m) {
    switch (m) {
    case MR_ACT_W4A4: return "NVFP4 activations scaled by input_scale, as the GPU kernels compute";
    case MR_ACT_W8A8: return "1x128 dynamic FP8 activations, as the GPU kernels compute";
    case MR_ACT_W16A32: return "bf16 weights, fp32 activations";
    default: return "";
    }
}

static void modes_for(mr_format f, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 1; i < MR_ACT_COUNT; i++) {
        if (mr_act_mode_weight_format((mr_act_mode)i) != f) continue;
        int w = snprintf(buf + used, n - used, "%s%s", used ? ", " : "", mr_act_mode_name((mr_act_mode)i));
        if (w < 0 || (size_t)w >= n - used) break;
        used += (size_t)w;
    }
}

static mr_status pass_checkpoint(mr_resolution *r) {
    static const char *const SRC = "checkpoint";
    const mr_model_desc *m = &r->model;
    mr_status s;
    if ((s = mr__decl(r, MR_DECL_SET, SRC, "architecture", m->architecture, "config.json architectures")) != MR_OK)
        return s;
    /* quantization */
    const char *q = mr_quant_name(m->quant.kind);
    if (mr__user_fixed(r, MR_OPT_QUANTIZATION)) {
        const char *u = mr__user_value(r, MR_OPT_QUANTIZATION);
        if (strcmp(u, q) != 0)
            return fail(r, MR_ERESOLVE, SRC, "quantization", u,
                        "quantization=%s contradicts the checkpoint: %s declares %s; use --quantization auto or %s", u,
                        m->quant.where, q, q);
        s = mr__decl(r, MR_DECL_NOTE, SRC, "quantization", u, "explicit, and agrees with %s", m->quant.where);
    } else {
        s = mr__decl(r, MR_DECL_SET, SRC, "quantization", q, "%s", m->quant.where);
    }
    if (s != MR_OK) return s;
    r->w.quant = m->quant.kind;
    r->w.weight_format = mr_quant_weight_format(m->quant.kind);
    if (m->quant.n_exclude > 0) {
        char pats[400];
        size_t used = 0;
        pats[0] = 0;
        for (int i = 0; i < m->quant.n_exclude; i++) {
            int w = snprintf(pats + used, sizeof pats - used, "%s%s", i ? ", " : "", m->quant.exclude[i]);
            if (w < 0 || (size_t)w >= sizeof pats - used) break;
            used += (size_t)w;
        }
        if ((s = mr__decl(r, MR_DECL_NOTE, SRC, "quantization", "excluded", "not quantized: %s", pats)) != MR_OK)
            return s;
    }
    if ((s = check_tensor_headers(r)) != MR_OK) return s;
    /* activation mode */
    const mr_format_traits *ft = mr_format_traits_get(r->w.weight_format);
    const char *fname = ft ? ft->name : "these";
    if (mr__user_fixed(r, MR_OPT_ACTIVATION_MODE)) {
        const char *u = mr__user_value(r, MR_OPT_ACTIVATION_MODE);
        mr_act_mode am = MR_ACT_AUTO;
        mr_act_mode_from_name(u, &am);
        if (mr_act_mode_weight_format(am) != r->w.weight_format) {
            char modes[128];
            modes_for(r->w.weight_format, modes, sizeof modes);
            return fail(r, MR_ERESOLVE, SRC, "activation_mode", u,
                        "activation_mode=%s does not belong to %s weights (quantization %s); modes that do: %s", u,
                        fname, q, modes);
        }
        r->w.act_mode = am;
        s = mr__decl(r, MR_DECL_NOTE, SRC, "activation_mode", u, "explicit; belongs to %s weights", fname);
    } else {
        r->w.act_mode = mr_act_mode_default(r->w.weight_format);
        s = mr__decl(r, MR_DECL_SET, SRC, "activation_mode", mr_act_mode_name(r->w.act_mode),
                     "the default for %s weights: %s", fname, act_mode_story(r->w.act_mode));
    }
    if (s != MR_OK) return s;
    return mr__decl(r, MR_DECL_SET, SRC, "routing", mr_routing_name(m->routing), "%s", m->routing_why);
}

/* ---- pass 2: platform ---- */

static mr_status parse_features(const char *s, uint32_t *out) {
    const uint32_t avx2 = MR_CPU_SSE42 | mr_kernel_isa_features(MR_ISA_AVX2);
    const uint32_t avx512 = avx2 | mr_kernel_isa_features(MR_ISA_AVX512);
    uint32_t m = 0;
    char tok[32];
    while (*s) {
        while (*s == ',' || *s == ' ') s++;
        if (!*s) break;
        size_t n = strcspn(s, ", ");
        if (n >= sizeof tok) return mr_error_set(MR_EINVAL, "cpu_features: entry '%.*s' is too long", (int)n, s);
        memcpy(tok, s, n);
        tok[n] = 0;
        s += n;
        if (!strcmp(tok, "generic"))
            m |= MR_CPU_SSE42;
        else if (!strcmp(tok, "avx2"))
            m |= avx2;
        else if (!strcmp(tok, "avx512"))
            m |= avx512;
        else {
            uint32_t f = 0;
            for (int b = 0; b < MR_CPU_FEATURE_COUNT; b++)
                if (!strcmp(tok, mr_cpu_feature_name(1u << b))) f = 1u << b;
            if (f == 0)
                return mr_error_set(MR_EINVAL,
                                    "cpu_features: unknown feature '%s'; valid: auto, generic, avx2, avx512 or feature "
                                    "names (sse4.2, avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, "
                                    "avx512bf16, avx512fp16, avx512vbmi, amx-tile, amx-bf16, amx-int8)",
                                    tok);
            m |= f;
        }
    }
    *out = m;
    return MR_OK;
}


/* A kernel_isa note on the AVX-512 level: what runs with an extension (on) or without it. */
static mr_status avx512_note(mr_resolution *r, bool on, const char *with, const char *without) {
    return mr__decl(r, MR_DECL_NOTE, "platform", "kernel_isa", "avx512", "%s", on ? with : without);
}
static mr_status pass_platform(mr_resolution *r) {
    static const char *const SRC = "platform";
    mr_status s;
    /* device */
    if (mr__user_fixed(r, MR_OPT_DEVICE)) {
        mr_device_from_name(mr__user_value(r, MR_OPT_DEVICE), &r->w.device);
        s = mr__decl(r, MR_DECL_NOTE, SRC, "device", mr_device_name(r->w.device), "explicit (planning for it)");
    } else {
        r->w.device = MR_DEVICE_CPU;
        s = mr__decl(r, MR_DECL_SET, SRC, "device", "cpu", "this machine's CPU (no GPU runner is built into this binary)");
    }
    if (s != MR_OK) return s;
    /* CPU features: detected or simulated, then masked */
    const mr_cpu_info *ci = mr_cpu();
    const char *feat = mr__user_value(r, MR_OPT_CPU_FEATURES);
    uint32_t base = 0;
    bool simulated = strcmp(feat, "auto") != 0;
    if (simulated) {
        if ((s = parse_features(feat, &base)) != MR_OK) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", mr_error_last());
            return fail(r, MR_EINVAL, SRC, "cpu_features", feat, "%s", msg);
        }
    } else {
        base = ci->flags;
    }
    uint32_t hide = 0;
    if ((s = mr_cpu_parse_mask(mr__user_value(r, MR_OPT_CPU_MASK), &hide)) != MR_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", mr_error_last());
        return fail(r, MR_EINVAL, SRC, "cpu_mask", mr__user_value(r, MR_OPT_CPU_MASK), "%s", msg);
    }
    r->w.cpu_detected = base & ~hide;
    r->w.cpu_origin = simulated ? "simulated" : "detected";
    char fl[300];
    mr__cpu_flags_str(r->w.cpu_detected, fl, sizeof fl);
    char hidden[300] = "";
    if (hide & base) {
        char h[250];
        mr__cpu_flags_str(hide & base, h, sizeof h);
        snprintf(hidden, sizeof hidden, "; hidden by cpu_mask: %s", h);
    }
    if (simulated)
        s = mr__decl(r, MR_DECL_NOTE, SRC, "cpu", fl, "simulated by cpu_features=%s%s", feat, hidden);
    else
        s = mr__decl(r, MR_DECL_NOTE, SRC, "cpu", fl, "detected on %s%s", ci->brand[0] ? ci->brand : "this CPU", hidden);
    if (s != MR_OK) return s;
    /* kernel_isa: the kernels' level table (kernels/isa.c) */
    const mr_kernel_isa best = mr_kernel_isa_best(r->w.cpu_detected);
    if (mr__user_fixed(r, MR_OPT_KERNEL_ISA)) {
        const char *u = mr__user_value(r, MR_OPT_KERNEL_ISA);
        for (int i = 0; i < MR_ISA_COUNT; i++)
            if (!strcmp(u, mr_kernel_isa_name((mr_kernel_isa)i))) r->w.isa = (mr_kernel_isa)i;
        s = mr__decl(r, MR_DECL_NOTE, SRC, "kernel_isa", u, "explicit (checked in validate)");
    } else {
        r->w.isa = best;
        s = mr__decl(r, MR_DECL_SET, SRC, "kernel_isa", mr_kernel_isa_name(best), "the best level the %s CPU offers",
                     r->w.cpu_origin);
    }
    if (s != MR_OK) return s;
    /* flags the kernels may use: the CPU's, without what only the levels above kernel_isa use */
    const uint32_t above = mr_kernel_isa_above(r->w.isa);
    r->w.cpu_flags = r->w.cpu_detected & ~above;
    if (r->w.isa == MR_ISA_AVX2 && (r->w.cpu_flags & MR_CPU_AVXVNNI)) {
        s = mr__decl(r, MR_DECL_NOTE, SRC, "kernel_isa", "avx2",
                     "with avx-vnni: its NVFP4 int8 kernel (w4a4, w4a8) runs vpdpbusd ymm, bit-identical to "
                     "vpmaddubsw, and the w4a16 gemv's 16-bit fixed-point dots run vpdpwssd ymm, bit-identical to "
                     "vpmaddwd + vpaddd (MOERUN_CPU_MASK=avx-vnni hides it)");
        if (s != MR_OK) return s;
    }
    if (r->w.isa == MR_ISA_AVX512) {
        s = avx512_note(r, (r->w.cpu_flags & MR_CPU_AVX512BF16) != 0,
                        "with avx512bf16: the bf16 pair dots (fp8 gemv, nvfp4 w4a16 at 6+ tokens an expert, "
                        "bf16 x bf16) run vdpbf16ps "
                        "(MOERUN_CPU_MASK=avx512bf16 gives the fp32-FMA form: the same sums away from fp32 denormals)",
                        "without avx512bf16: the bf16 pair dots (fp8 gemv, nvfp4 w4a16 at 6+ tokens an expert, "
                        "bf16 x bf16) run on fp32 "
                        "FMAs, odd product first as vdpbf16ps adds them");
        if (s != MR_OK) return s;
    }
    const uint32_t amx = MR_CPU_AMX_TILE | MR_CPU_AMX_BF16;
    if (r->w.isa == MR_ISA_AVX512 && (r->w.cpu_flags & amx) == amx) {
        mr_kernels k; /* the table these flags build: it asks Linux for the tile state */
        mr_kernels_init(&k, r->w.cpu_flags);
        s = avx512_note(r, strstr(k.uk_gemm[MR_UK_FP8_BF16].name, "_amx_") != NULL,
                        "with amx-bf16: the FP8 and BF16 experts and the dense projections (q/k/v/o, lm_head; "
                        "packed for tiles at load, fp32 activations as three exact bf16 parts) run on AMX tiles "
                        "(tdpbf16ps) at every token count, so a token's sums do not depend on its batch "
                        "(MOERUN_CPU_MASK=amx gives the kernels without AMX)",
                        "amx-bf16 detected, but Linux refused this process the AMX tile state (arch_prctl "
                        "ARCH_REQ_XCOMP_PERM): the experts and the dense projections run without AMX");
        if (s != MR_OK) return s;
    }
    r->w.batch_invariant = !strcmp(mr__user_value(r, MR_OPT_DETERMINISTIC_INFERENCE), "on");
    if (r->w.batch_invariant) {
        mr_kernels k; /* the table these flags build, in its batch-invariant form */
        mr_kernels_init(&k, r->w.cpu_flags);
        mr_kernels_batch_invariant(&k);
        s = mr__decl(r, MR_DECL_NOTE, SRC, "enable_deterministic_inference", "on",
                     "every expert call takes the %s level's batch-invariant kernel at every token count (fp8: %s, "
                     "nvfp4 int8: %s, nvfp4 bf16: %s, bf16: %s / %s); the dense and attention kernels are "
                     "batch-invariant already, so a request's logits do not depend on the requests beside it",
                     k.isa, k.uk_inv[MR_UK_FP8_BF16].name, k.uk_inv[MR_UK_NVFP4_I8].name,
                     k.uk_inv[MR_UK_NVFP4_BF16].name, k.uk_inv[MR_UK_BF16_BF16].name, k.uk_inv[MR_UK_BF16_F32].name);
        if (s != MR_OK) return s;
    }
    /* the prospective transport for the capability checks that follow: explicit, else mpi when a
     * launcher started several ranks, else none */
    r->w.a2a = MR_A2A_NONE;
    if (mr__user_fixed(r, MR_OPT_MOE_A2A_BACKEND)) {
        mr_a2a_from_name(mr__user_value(r, MR_OPT_MOE_A2A_BACKEND), &r->w.a2a);
    } else {
        const char *from;
        if (mpi_world_size(&from) > 1) r->w.a2a = MR_A2A_MPI;
    }
    /* threads */
    int64_t t = strtoll(mr__user_value(r, MR_OPT_THREADS), NULL, 10);
    if (t == 0) {
        const int local = mr_launcher_local();
        const int cores = ci->n_cores > 0 ? ci->n_cores : 1;
        r->w.threads = local > 1 ? (cores / local > 0 ? cores / local : 1) : cores;
        char v[16];
        snprintf(v, sizeof v, "%d", r->w.threads);
        if (local > 1)
            s = mr__decl(r, MR_DECL_SET, SRC, "threads", v,
                         "this machine's %d cores shared by the %d ranks the launcher started on it (threads=0)", cores,
                         local);
        else
            s = mr__decl(r, MR_DECL_SET, SRC, "threads", v, "all cores of this machine (threads=0)");
    } else {
        r->w.threads = (int)t;
    }
    return s;
}

/* ---- pass 3: model overrides ---- */

static mr_status pass_model_overrides(mr_resolution *r) {
    bool any = false;
    for (int i = 0; i < mr__override_count(); i++) {
        const mr__override *o = mr__override_at(i);
        if (strcmp(o->architecture, r->model.architecture) != 0) continue;
        any = true;
        mr_status s = o->fn(r);
        if (s != MR_OK) return s;
    }
    if (!any)
        return mr__decl(r, MR_DECL_NOTE, "model_overrides", "architecture", r->model.architecture,
                        "no override is registered for this architecture");
    return MR_OK;
}

/* ---- pass 4: moe_runner ---- */

static mr_status pass_moe_runner(mr_resolution *r) {
    static const char *const SRC = "moe_runner";
    mr_status s;
    if (mr__user_fixed(r, MR_OPT_MOE_RUNNER_BACKEND)) {
        r->w.runner = mr_moe_runner_find(mr__user_value(r, MR_OPT_MOE_RUNNER_BACKEND));
        if (r->w.runner == NULL)
            return fail(r, MR_ERESOLVE, SRC, "moe_runner_backend", mr__user_value(r, MR_OPT_MOE_RUNNER_BACKEND),
                        "moe_runner_backend=%s is not built into this binary",
                        mr__user_value(r, MR_OPT_MOE_RUNNER_BACKEND));
        s = mr__decl(r, MR_DECL_NOTE, SRC, "moe_runner_backend", r->w.runner->name, "explicit (checked in validate)");
    } else {
        mr_moe_problem p;
        mr__problem(r, &p);
        /* candidates: the override's preference first, then the registry's order */
        const mr_moe_runner *cand[16];
        int nc = 0;
        if (r->w.preferred) cand[nc++] = r->w.preferred;
        for (int i = 0; i < mr_moe_runner_count() && nc < 16; i++)
            if (mr_moe_runner_at(i) != r->w.preferred) cand[nc++] = mr_moe_runner_at(i);
        char refusals[1536];
        size_t used = 0;
        refusals[0] = 0;
        for (int i = 0; i < nc && r->w.runner == NULL; i++) {
            const mr_moe_runner *c = cand[i];
            char why[512];
            bool ok = true;
            if (!c->auto_eligible) {
                snprintf(why, sizeof why, "%s is never chosen by auto (it is the scalar ground truth, slow by design).",
                         c->name);
                ok = false;
            } else if (!c->supports(&p, why, sizeof why)) {
                ok = false;
            } else if (!mr_a2a_pair_supported(p.a2a, c, why, sizeof why)) {
                ok = false;
            }
            if (!ok) {
                if ((s = mr__decl(r, MR_DECL_REFUSE, SRC, "moe_runner_backend", c->name, "%s", why)) != MR_OK) return s;
                int w = snprintf(refusals + used, sizeof refusals - used, "%s%s: %s", used ? "; " : "", c->name, why);
                if (w > 0 && (size_t)w < sizeof refusals - used) used += (size_t)w;
                continue;
            }
            r->w.runner = c;
            if (c == r->w.preferred)
                s = mr__decl(r, MR_DECL_SET, SRC, "moe_runner_backend", c->name,
                             "preferred by model_overrides, and its capability check accepts %s %s on %s",
                             mr_routing_name(p.routing), mr_quant_name(r->w.quant), mr_device_name(p.device));
            else
                s = mr__decl(r, MR_DECL_SET, SRC, "moe_runner_backend", c->name,
                             "the first runner in the %s preference list that accepts %s %s", mr_device_name(p.device),
                             mr_routing_name(p.routing), mr_quant_name(r->w.quant));
            if (s != MR_OK) return s;
        }
        if (r->w.runner == NULL)
            return fail(r, MR_ERESOLVE, SRC, "moe_runner_backend", "auto",
                        "no MoE runner can run %s (%s, routing %s) on %s%s: %s", r->model.architecture,
                        mr_quant_name(r->w.quant), mr_routing_name(p.routing), mr_device_name(p.device),
                        p.device != MR_DEVICE_CPU ? " (no GPU runner is built into this binary)" : "", refusals);
        s = MR_OK;
    }
    if (s != MR_OK) return s;
    /* router dtype: a model rule may have decided it; else the routing math's fp32 */
    if (r->w.router_dtype == MR_FMT_COUNT) {
        if (mr__user_fixed(r, MR_OPT_ROUTER_DTYPE)) {
            r->w.router_dtype = !strcmp(mr__user_value(r, MR_OPT_ROUTER_DTYPE), "bf16") ? MR_FMT_BF16 : MR_FMT_F32;
        } else {
            r->w.router_dtype = MR_FMT_F32;
            s = mr__decl(r, MR_DECL_SET, SRC, "router_dtype", "fp32",
                         "no model rule decides it; routing math is fp32 (spec/routing.md)");
        }
    }
    return s;
}

/* ---- pass 5: a2a ---- */

static mr_status pass_a2a(mr_resolution *r) {
    static const char *const SRC = "a2a";
    mr_status s;
    const char *world_from = NULL;
    const int world = mpi_world_size(&world_from);
    if (mr__user_fixed(r, MR_OPT_MOE_A2A_BACKEND))
        s = mr__decl(r, MR_DECL_NOTE, SRC, "moe_a2a_backend", mr_a2a_name(r->w.a2a), "explicit");
    else if (r->w.a2a == MR_A2A_MPI)
        s = mr__decl(r, MR_DECL_SET, SRC, "moe_a2a_backend", "mpi", "the launcher started %d ranks (%s)", world,
                     world_from);
    else
        s = mr__decl(r, MR_DECL_SET, SRC, "moe_a2a_backend", "none", "one process: no expert-parallel transport");
    if (s != MR_OK) return s;
    /* ep_size */
    int64_t ep_user = strtoll(mr__user_value(r, MR_OPT_EP_SIZE), NULL, 10);
    bool ep_fixed = mr__user_fixed(r, MR_OPT_EP_SIZE);
    char v[16];
    if (r->w.a2a == MR_A2A_NONE) {
        if (ep_fixed && ep_user != 1)
            return fail(r, MR_ERESOLVE, SRC, "ep_size", mr__user_value(r, MR_OPT_EP_SIZE),
                        "ep_size=%lld needs an expert-parallel transport, but moe_a2a_backend=none runs one rank; use "
                        "--moe-a2a-backend mpi or --ep-size 1",
                        (long long)ep_user);
        r->w.ep_size = 1;
        if (!ep_fixed && (s = mr__decl(r, MR_DECL_SET, SRC, "ep_size", "1", "one rank without a transport")) != MR_OK)
            return s;
    } else {
        const char *from = world_from;
        if (ep_fixed && ep_user != world)
            return fail(r, MR_ERESOLVE, SRC, "ep_size", mr__user_value(r, MR_OPT_EP_SIZE),
                        "ep_size=%lld must equal the MPI world size under moe_a2a_backend=mpi (%d%s%s)",
                        (long long)ep_user, world, from ? ", from " : ", not started by mpirun", from ? from : "");
        r->w.ep_size = world;
        r->w.ep_rank = mpi_world_rank();
        snprintf(v, sizeof v, "%d", world);
        if (r->w.ep_rank >= world)
            return fail(r, MR_ERESOLVE, SRC, "ep_size", v, "this process's MPI rank %d is outside the world size %d",
                        r->w.ep_rank, world);
        if (!ep_fixed &&
            (s = mr__decl(r, MR_DECL_SET, SRC, "ep_size", v, "the MPI world size (%s)",
                          from ? from : "not started by mpirun: 1")) != MR_OK)
            return s;
    }
    /* E need not divide: the first E mod ep_size ranks hold one expert more */
    if (r->model.n_experts > 0 && r->w.ep_size > r->model.n_experts) {
        snprintf(v, sizeof v, "%d", r->w.ep_size);
        return fail(r, MR_ERESOLVE, SRC, "ep_size", v,
                    "ep_size=%d is more than the %d experts: every rank needs at least one expert; use at most %d "
                    "ranks",
                    r->w.ep_size, r->model.n_experts, r->model.n_experts);
    }
    if (r->w.ep_size > 1) {
        int f, n;
        mr_moe_placement_contiguous(r->model.n_experts, r->w.ep_size, r->w.ep_rank, &f, &n);
        if ((s = mr__decl(r, MR_DECL_NOTE, SRC, "ep_size", v,
                          "contiguous placement: rank %d of %d holds experts %d..%d (%d of %d)", r->w.ep_rank,
                          r->w.ep_size, f, f + n - 1, n, r->model.n_experts)) != MR_OK)
            return s;
    }
    /* the pair registry */
    char why[512];
    if (!mr_a2a_pair_supported(r->w.a2a, r->w.runner, why, sizeof why)) {
        mr_moe_problem p;
        mr__problem(r, &p);
        char alt[256];
        working_runners(&p, alt, sizeof alt);
        return fail(r, MR_ERESOLVE, SRC, "moe_a2a_backend", mr_a2a_name(r->w.a2a),
                    "moe_a2a_backend=%s cannot be combined with moe_runner_backend=%s: %s runners that can: %s",
                    mr_a2a_name(r->w.a2a), r->w.runner->name, why, alt);
    }
    if (r->w.a2a == MR_A2A_MPI && !mr__user_fixed(r, MR_OPT_EP_TIMEOUT) &&
        (s = mr__decl(r, MR_DECL_SET, SRC, "ep_timeout", "0",
                      "automatic step deadline: 5 s beyond twice the slowest step seen")) != MR_OK)
        return s;
    s = mr__decl(r, MR_DECL_NOTE, SRC, "moe_a2a_backend", mr_a2a_name(r->w.a2a), "pair (%s, %s) is registered: %s",
                 mr_a2a_name(r->w.a2a), r->w.runner->name, why);
    if (s == MR_OK && r->w.a2a == MR_A2A_MPI && !mr_ep_built())
        s = mr__decl(r, MR_DECL_NOTE, SRC, "moe_a2a_backend", "mpi",
                     "resolves, but this build has no MPI (libopenmpi-dev): running it is refused with a clear "
                     "message");
    return s;
}

/* ---- pass 6: layout ---- */

static const char *gateup_name(mr_gateup_order g) {
    switch (g) {
    case MR_GATEUP_SEPARATE: return "separate";
    case MR_GATEUP_CONCAT: return "concat";
    case MR_GATEUP_INTERLEAVED: return "interleaved";
    }
    return "?";
}

static mr_status pass_layout(mr_resolution *r) {
    mr_moe_problem p;
    mr__problem(r, &p);
    r->w.runner->required_layout(&p, &r->w.layout);
    const mr_moe_layout *l = &r->w.layout;
    char v[160];
    if (l->gateup == MR_GATEUP_INTERLEAVED)
        snprintf(v, sizeof v, "gateup=interleaved/%d inter_padded=%lld pack=%s", l->interleave_rows,
                 (long long)l->inter_padded, mr_pack_name((mr_pack_id)l->pack));
    else
        snprintf(v, sizeof v, "gateup=%s inter_padded=%lld pack=%s", gateup_name(l->gateup), (long long)l->inter_padded,
                 mr_pack_name((mr_pack_id)l->pack));
    return mr__decl(r, MR_DECL_SET, "layout", "layout", v,
                    "what %s's after-load makes of the experts (I=%lld); recorded in the weight descriptor and "
                    "asserted at dispatch",
                    r->w.runner->name, (long long)r->model.moe_inter);
}

/* ---- pass 7: engine (KV cache, scheduler limits) ---- */

/* Bytes of the checkpoint's *.safetensors files (what the weights will
 * take, near enough, before any packing); 0 without a folder. */
static uint64_t checkpoint_bytes(const char *dir) {
    uint64_t total = 0;
    if (!dir[0]) return 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (l < 12 || strcmp(e->d_name + l - 12, ".safetensors") != 0) continue;
        char p[1400];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (stat(p, &st) == 0 && S_ISREG(st.st_mode)) total += (uint64_t)st.st_size;
    }
    closedir(d);
    return total;
}

/* MemAvailable of /proc/meminfo (bytes), else 0. */
static uint64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

static void fmt_bytes(uint64_t b, char *buf, size_t n) {
    if (b >= (1ull << 30))
        snprintf(buf, n, "%.2f GiB", (double)b / 1073741824.0);
    else if (b >= (1ull << 20))
        snprintf(buf, n, "%.1f MiB", (double)b / 1048576.0);
    else
        snprintf(buf, n, "%llu bytes", (unsigned long long)b);
}

/* Default limits of the scheduler (spec/serving.md "The scheduler"). */
#define MR__DEFAULT_RUNNING 256
#define MR__DEFAULT_BATCH_TOKENS 512
#define MR__DEFAULT_CONTEXT 4096
/* auto kv_cache_memory never takes more than this share of the memory left after the weights */
#define MR__AUTO_KV_SHARE 0.5
/* ... but never less than one request of this many tokens (or the context, if shorter) */
#define MR__AUTO_MIN_TOKENS 4096

static mr_status pass_engine(mr_resolution *r) {
    static const char *const SRC = "engine";
    const mr_model_desc *m = &r->model;
    mr_status s;
    char v[64], a[64], b[64], c[64];
    /* kv_cache_dtype */
    const char *dt = mr__user_value(r, MR_OPT_KV_CACHE_DTYPE);
    r->w.kv_dtype = MR_FMT_BF16;
    if (mr__user_fixed(r, MR_OPT_KV_CACHE_DTYPE)) {
        const char *why = "explicit: half the memory of fp32; attention widens it to fp32";
        if (!strcmp(dt, "fp32")) {
            r->w.kv_dtype = MR_FMT_F32;
            why = "explicit: K and V kept exactly as computed (fp32), twice the memory of bf16";
        } else if (!strcmp(dt, "fp8_e4m3") || !strcmp(dt, "fp8")) {
            r->w.kv_dtype = MR_FMT_E4M3;
            why = "explicit: K and V as FP8 E4M3 (fp8 is its alias, as in vLLM), half the memory of bf16, so twice "
                  "the tokens; each value divided by its layer's k_scale / v_scale where the checkpoint has them "
                  "(as vLLM reads them), else by 1, values beyond +-448 then stored as +-448, the rest rounded to 3 "
                  "mantissa bits; attention widens them to fp32 exactly and applies the scales";
        } else if (!strcmp(dt, "fp8_e5m2")) {
            r->w.kv_dtype = MR_FMT_E5M2;
            why = "explicit: K and V as FP8 E5M2, half the memory of bf16; scaled as fp8_e4m3 is (the "
                  "checkpoint's k_scale / v_scale, else 1), values beyond +-57344 stored as +-57344, the rest rounded "
                  "to 2 mantissa bits (coarser than fp8_e4m3, a wider range); attention widens them to fp32 exactly";
        }
        s = mr__decl(r, MR_DECL_NOTE, SRC, "kv_cache_dtype", mr_kv_dtype_name(r->w.kv_dtype), "%s", why);
    } else {
        s = mr__decl(r, MR_DECL_SET, SRC, "kv_cache_dtype", "bf16",
                     "half the memory of fp32 per token, so twice the tokens in the same pool; attention reads it "
                     "widened to fp32 (--kv-cache-dtype fp32 keeps K and V exact, for exactness tests)");
    }
    if (s) return s;
    /* dense_activation_dtype */
    r->w.dense_act_dtype = !strcmp(mr__user_value(r, MR_OPT_DENSE_ACTIVATION_DTYPE), "bf16") ? MR_FMT_BF16 : MR_FMT_F32;
    mr_kernels k; /* the table these flags build: which dense path takes the inputs */
    mr_kernels_init(&k, r->w.cpu_flags);
    const mr_format af = r->w.quant == MR_QUANT_FP8_BLOCK ? MR_FMT_FP8_BLOCK : MR_FMT_BF16;
    if (r->w.dense_act_dtype == MR_FMT_BF16) {
        const char *how = k.rows_tiles[af].fn ? "on AMX tiles 16 tokens a tile operation instead of 5 (the same bits "
                                                "as the fp32 path gives such values)"
                          : k.rows_x16[af].fn ? "on vdpbf16ps pair dots, twice the multiply-adds of the FMA rows here, "
                                                "the weights packed at load as the expert kernels take them (K a "
                                                "multiple of 64), one sum order at every token count: "
                                              : "this host has no faster path for them: the fp32 path runs them ";
        s = mr__decl(r, MR_DECL_NOTE, SRC, "dense_activation_dtype", "bf16",
                     "explicit: the inputs of q/k/v_proj, o_proj and the LM head are rounded to bf16 (nearest even) "
                     "before each matmul, as an engine that runs these layers in bf16 sees them; products exact, fp32 "
                     "sums; %s%s",
                     how, k.rows_tiles[af].fn ? "" : k.rows_x16[af].fn ? k.rows_x16[af].name
                                                    : k.rows_f32[af].fn ? k.rows_f32[af].name : "(the FMA rows)");
    } else {
        const bool pk = !k.rows_tiles[af].fn && k.rows_f32[af].fn;
        s = mr__decl(r, MR_DECL_SET, SRC, "dense_activation_dtype", "fp32",
                     "%s: q/k/v_proj, o_proj and the LM head take the fp32 activations exactly (exact products, fp32 "
                     "sums), as the transformers oracle computes; --dense-activation-dtype bf16 rounds them to bf16 "
                     "first (faster prefill and batched decode on AMX, and with AVX512-BF16 on Zen 4)%s%s",
                     mr__user_fixed(r, MR_OPT_DENSE_ACTIVATION_DTYPE) ? "explicit" : "auto",
                     pk ? "; here on FMAs with the weights packed at load as the expert kernels take them (K a "
                          "multiple of 64), one sum order at every token count: "
                        : "",
                     pk ? k.rows_f32[af].name : "");
    }
    if (s) return s;
    int64_t tok_bytes = m->n_layers * 2 * m->n_kv_heads * m->head_dim * (int64_t)mr_kv_elem_bytes(r->w.kv_dtype);
    if (tok_bytes <= 0) return fail(r, MR_ECONFIG, SRC, "kv_cache_dtype", dt, "the model has no KV dimensions");
    r->w.kv_token_bytes = tok_bytes;
    /* context_length */
    int64_t ctx = strtoll(mr__user_value(r, MR_OPT_CONTEXT_LENGTH), NULL, 10);
    if (ctx > 0) {
        if (m->max_pos > 0 && ctx > m->max_pos)
            return fail(r, MR_ERESOLVE, SRC, "context_length", mr__user_value(r, MR_OPT_CONTEXT_LENGTH),
                        "context_length=%lld is above the model's max_position_embeddings (%lld)", (long long)ctx,
                        (long long)m->max_pos);
    } else {
        ctx = m->max_pos > 0 ? m->max_pos : MR__DEFAULT_CONTEXT;
        snprintf(v, sizeof v, "%lld", (long long)ctx);
        s = mr__decl(r, MR_DECL_SET, SRC, "context_length", v,
                     m->max_pos > 0 ? "the model's max_position_embeddings" : "config.json gives no "
                                                                              "max_position_embeddings: the default");
        if (s) return s;
    }
    r->w.context_length = ctx;
    /* max_running_requests and max_batch_tokens: every running request's decode fits one step */
    int64_t run = strtoll(mr__user_value(r, MR_OPT_MAX_RUNNING_REQUESTS), NULL, 10);
    int64_t bt = strtoll(mr__user_value(r, MR_OPT_MAX_BATCH_TOKENS), NULL, 10);
    if (run > 0 && bt > 0 && bt < run)
        return fail(r, MR_ERESOLVE, SRC, "max_batch_tokens", mr__user_value(r, MR_OPT_MAX_BATCH_TOKENS),
                    "max_batch_tokens=%lld is below max_running_requests=%lld: every running request's decode "
                    "token must fit one step",
                    (long long)bt, (long long)run);
    if (run <= 0) {
        run = MR__DEFAULT_RUNNING;
        const char *why = "the default";
        if (bt > 0 && bt < run) {
            run = bt;
            why = "as many as max_batch_tokens (each running request decodes one token per step)";
        }
        snprintf(v, sizeof v, "%lld", (long long)run);
        if ((s = mr__decl(r, MR_DECL_SET, SRC, "max_running_requests", v, "%s", why))) return s;
    }
    if (bt <= 0) {
        bt = run > MR__DEFAULT_BATCH_TOKENS ? run : MR__DEFAULT_BATCH_TOKENS;
        snprintf(v, sizeof v, "%lld", (long long)bt);
        if ((s = mr__decl(r, MR_DECL_SET, SRC, "max_batch_tokens", v,
                          bt == MR__DEFAULT_BATCH_TOKENS
                              ? "the default: one step's prefill chunk stays short enough that running requests keep "
                                "decoding (a longer prompt is prefilled in chunks)"
                              : "max_running_requests: every running request's decode fits one step")))
            return s;
    }
    r->w.max_running = (int)run;
    r->w.max_batch_tokens = bt;
    /* kv_cache_memory -> blocks */
    const char *km = mr__user_value(r, MR_OPT_KV_CACHE_MEMORY);
    uint64_t bytes = 0, block_bytes = (uint64_t)tok_bytes * 16, ckpt = checkpoint_bytes(m->dir);
    double frac = 0.0;
    if ((s = mr_memory_size_parse(km, &bytes, &frac))) {
        char msg[300];
        snprintf(msg, sizeof msg, "%s", mr_error_last());
        return fail(r, MR_EINVAL, SRC, "kv_cache_memory", km, "kv_cache_memory: %s", msg);
    }
    uint64_t avail = mem_available(), after = avail > ckpt ? avail - ckpt : 0;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    uint64_t phys = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
    fmt_bytes(after, a, sizeof a);
    fmt_bytes(ckpt, b, sizeof b);
    const char *how;
    char howbuf[512];
    if (bytes == 0 && frac > 0.0) {
        if (after == 0)
            return fail(r, MR_ERESOLVE, SRC, "kv_cache_memory", km,
                        "kv_cache_memory=%s is a fraction of the free memory, which cannot be read here "
                        "(/proc/meminfo); give bytes instead (e.g. 4GiB)", km);
        bytes = (uint64_t)((double)after * frac);
        snprintf(howbuf, sizeof howbuf, "%s of the %s free after the weights (%s of checkpoint)", km, a, b);
        how = howbuf;
    } else if (bytes == 0) {
        /* auto: every running request at full context, within a share of the free memory */
        uint64_t want = (uint64_t)run * (uint64_t)((ctx + 15) / 16) * block_bytes; /* whole blocks per request */
        uint64_t cap = (uint64_t)((double)after * MR__AUTO_KV_SHARE);
        fmt_bytes(want, c, sizeof c);
        if (after == 0 || want <= cap) {
            bytes = want;
            snprintf(howbuf, sizeof howbuf,
                     "auto: room for every one of the %lld running requests at the full context of %lld tokens (%s)",
                     (long long)run, (long long)ctx, c);
        } else {
            bytes = cap;
            snprintf(howbuf, sizeof howbuf,
                     "auto: %.0f%% of the %s free after the weights (%s of checkpoint); %lld full contexts would "
                     "need %s",
                     100.0 * MR__AUTO_KV_SHARE, a, b, (long long)run, c);
            /* never below one request of min(context, 4096) tokens: auto does not fail resolution (the
             * loader still refuses what the machine cannot hold) */
            int64_t floor_tok = ctx < MR__AUTO_MIN_TOKENS ? ctx : MR__AUTO_MIN_TOKENS;
            uint64_t floor_b = (uint64_t)((floor_tok + 15) / 16) * block_bytes;
            if (bytes < floor_b) {
                bytes = floor_b;
                snprintf(howbuf, sizeof howbuf,
                         "auto: the free memory after the weights (%s, %s of checkpoint) is short; the minimum of one "
                         "request of %lld tokens",
                         a, b, (long long)floor_tok);
            }
        }
        how = howbuf;
    } else {
        how = "explicit";
        if (phys > 0 && bytes > phys) {
            fmt_bytes(phys, c, sizeof c);
            return fail(r, MR_ERESOLVE, SRC, "kv_cache_memory", km,
                        "kv_cache_memory=%s is more than this machine's %s of memory", km, c);
        }
    }
    int64_t blocks = (int64_t)(bytes / block_bytes);
    if (blocks < 1) {
        fmt_bytes(block_bytes, c, sizeof c);
        return fail(r, MR_ERESOLVE, SRC, "kv_cache_memory", km,
                    "kv_cache_memory (%s) holds less than one KV block: a block of 16 tokens takes %s (%lld bytes "
                    "per token)",
                    how, c, (long long)tok_bytes);
    }
    if (blocks > INT32_MAX) blocks = INT32_MAX; /* block ids are int32 */
    r->w.kv_blocks = blocks;
    uint64_t pool = (uint64_t)blocks * block_bytes;
    fmt_bytes(pool, c, sizeof c);
    int64_t tokens = blocks * 16;
    snprintf(v, sizeof v, "%llu", (unsigned long long)pool);
    char fit[160];
    if (tokens >= ctx)
        snprintf(fit, sizeof fit, "%.1f full contexts of %lld tokens", (double)tokens / (double)ctx, (long long)ctx);
    else
        snprintf(fit, sizeof fit, "less than one full context of %lld: longer requests are refused at admission",
                 (long long)ctx);
    return mr__decl(r, strcmp(how, "explicit") ? MR_DECL_SET : MR_DECL_NOTE, SRC, "kv_cache_memory", v,
                    "%s -> %s = %lld blocks of 16 tokens = %lld tokens at %lld bytes per token (%lld layers x K,V x "
                    "%lld kv heads x %lld dims x %s); %s",
                    how, c, (long long)blocks, (long long)tokens, (long long)tok_bytes, (long long)m->n_layers,
                    (long long)m->n_kv_heads, (long long)m->head_dim, mr_kv_dtype_name(r->w.kv_dtype),
                    fit);
}

/* ---- pass 8: validate ---- */

static mr_status pass_validate(mr_resolution *r) {
    static const char *const SRC = "validate";
    mr_status s = MR_OK;
    char why[512], alt[256];
    mr_moe_problem p;
    mr__problem(r, &p);
    if (mr__user_fixed(r, MR_OPT_KERNEL_ISA)) {
        uint32_t need = mr_kernel_isa_features(r->w.isa);
        if ((r->w.cpu_detected & need) != need) {
            char miss[200], ok[64] = "";
            mr__cpu_flags_str(need & ~r->w.cpu_detected, miss, sizeof miss);
            size_t used = 0;
            for (int i = 0; i < MR_ISA_COUNT; i++) {
                uint32_t f = mr_kernel_isa_features((mr_kernel_isa)i);
                if ((r->w.cpu_detected & f) != f) continue;
                int w = snprintf(ok + used, sizeof ok - used, "%s%s", used ? ", " : "", mr_kernel_isa_name((mr_kernel_isa)i));
                if (w > 0 && (size_t)w < sizeof ok - used) used += (size_t)w;
            }
            return fail(r, MR_ERESOLVE, SRC, "kernel_isa", mr_kernel_isa_name(r->w.isa),
                        "kernel_isa=%s is above what the %s CPU has (missing %s); levels that work: %s",
                        mr_kernel_isa_name(r->w.isa), r->w.cpu_origin, miss, ok);
        }
        s = mr__decl(r, MR_DECL_NOTE, SRC, "kernel_isa", mr_kernel_isa_name(r->w.isa), "explicit; the %s CPU has it",
                     r->w.cpu_origin);
        if (s != MR_OK) return s;
    }
    if (mr__user_fixed(r, MR_OPT_MOE_RUNNER_BACKEND)) {
        const mr_moe_runner *c = r->w.runner;
        if (!c->supports(&p, why, sizeof why)) {
            working_runners(&p, alt, sizeof alt);
            size_t l = strlen(why);
            if (l && why[l - 1] == '.') why[l - 1] = 0;
            return fail(r, MR_ERESOLVE, SRC, "moe_runner_backend", c->name,
                        "moe_runner_backend=%s cannot run %s: %s; runners that can: %s", c->name,
                        r->model.architecture, why, alt);
        }
        s = mr__decl(r, MR_DECL_NOTE, SRC, "moe_runner_backend", c->name,
                     "explicit; its capability check accepts %s %s %s on %s", mr_routing_name(p.routing),
                     mr_quant_name(r->w.quant), mr_act_mode_name(p.act_mode), mr_device_name(p.device));
        if (s != MR_OK) return s;
    } else {
        /* belt and braces: the auto choice passes the same check */
        if (!r->w.runner->supports(&p, why, sizeof why))
            return fail(r, MR_ERESOLVE, SRC, "moe_runner_backend", r->w.runner->name,
                        "internal: the chosen runner %s refuses the final problem: %s", r->w.runner->name, why);
        s = mr__decl(r, MR_DECL_NOTE, SRC, "moe_runner_backend", r->w.runner->name,
                     "no explicit runner; the chosen one passes the same check on the final problem");
    }
    return s;
}

/* ---- pass 9: publish ---- */

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t exec_checksum(const mr_exec *x) {
    uint64_t h = 0xcbf29ce484222325ull;
    h = fnv(h, x, offsetof(mr_exec, checksum));
    const mr_model_desc *m = x->model;
    if (m) {
        h = fnv(h, m, sizeof *m);
        for (int i = 0; i < m->quant.n_exclude; i++) h = fnv(h, m->quant.exclude[i], strlen(m->quant.exclude[i]) + 1);
    }
    return h;
}

bool mr_exec_verify(const mr_exec *x) {
    return x != NULL && x->magic == MR_EXEC_MAGIC && x->checksum == exec_checksum(x);
}

mr_status mr_exec_check_runnable(const mr_exec *x) {
    if (x == NULL || !mr_exec_verify(x))
        return mr_error_set(MR_ESTATE, "the execution config is missing or was modified after publish");
    if (x->a2a == MR_A2A_MPI && !mr_ep_built())
        return mr_error_set(MR_EUNSUPPORTED,
                            "moe_a2a_backend=mpi resolved (with runner %s, ep_size %d), but this build has no MPI "
                            "(install libopenmpi-dev and rebuild); run with --moe-a2a-backend none",
                            x->runner ? x->runner->name : "?", x->ep_size);
    if (x->a2a == MR_A2A_MPI && mr_ep_active() && (x->ep_size != mr_ep_size() || x->problem.ep_rank != mr_ep_rank()))
        return mr_error_set(MR_EUNSUPPORTED,
                            "the configuration was resolved for rank %d of %d, but this process is MPI rank %d of %d",
                            x->problem.ep_rank, x->ep_size, mr_ep_rank(), mr_ep_size());
    if (x->device != MR_DEVICE_CPU)
        return mr_error_set(MR_EUNSUPPORTED, "device %s: no GPU runner is built into this binary",
                            mr_device_name(x->device));
    uint32_t missing = x->cpu_flags & ~mr_cpu()->host;
    if (missing) {
        char names[256] = "";
        size_t used = 0;
        for (int b = 0; b < MR_CPU_FEATURE_COUNT; b++) {
            if (!(missing & (1u << b))) continue;
            int w = snprintf(names + used, sizeof names - used, "%s%s", used ? ", " : "", mr_cpu_feature_name(1u << b));
            if (w < 0 || (size_t)w >= sizeof names - used) break;
            used += (size_t)w;
        }
        return mr_error_set(MR_EUNSUPPORTED,
                            "the resolution simulates CPU features this machine lacks%s (%s): it can be planned "
                            "with `moerun resolve`, not run here",
                            (missing & mr_cpu()->detected) ? " or MOERUN_CPU_MASK hides" : "", names);
    }
    return MR_OK;
}

mr_status mr_exec_apply(const mr_exec *x) {
    mr_status s = mr_exec_check_runnable(x);
    if (s != MR_OK) return s;
    /* Kernels dispatch on mr_cpu()->flags: hide what the resolved kernel_isa
     * (or a simulated mask) excludes, so that the ISA chosen is the ISA run. */
    mr_cpu_set_hidden(mr_cpu()->detected & ~x->cpu_flags);
    omp_set_num_threads(x->threads);
    mr_ep_set_timeout((double)x->ep_timeout_s);
    mr_kernels_set_batch_invariant(x->batch_invariant);
    return MR_OK;
}

static size_t align8(size_t n) { return (n + 7) & ~(size_t)7; }

/* The frozen block, one mmap: [mr_exec][mr_model_desc][char *exclude[n]][strings]. */
static mr_status pass_publish(mr_resolution *r) {
    const mr_model_desc *m = &r->model;
    size_t need = align8(sizeof(mr_exec)) + align8(sizeof(mr_model_desc));
    size_t ptrs = (size_t)m->quant.n_exclude * sizeof(char *);
    need += align8(ptrs);
    for (int i = 0; i < m->quant.n_exclude; i++) {
        size_t l = strlen(m->quant.exclude[i]) + 1;
        if (!mr_size_add(need, l, &need)) return fail(r, MR_EOVERFLOW, "publish", "exec", "", "exec config too large");
    }
    long pg = sysconf(_SC_PAGESIZE);
    size_t page = pg > 0 ? (size_t)pg : 4096;
    size_t size = (need + page - 1) / page * page;
    void *block = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (block == MAP_FAILED) return mr_error_set(MR_ENOMEM, "cannot map %zu bytes for the exec config", size);
    char *at = block;
    mr_exec *x = (mr_exec *)at;
    at += align8(sizeof(mr_exec));
    mr_model_desc *mc = (mr_model_desc *)at;
    at += align8(sizeof(mr_model_desc));
    char **ex = (char **)at;
    at += align8(ptrs);
    memcpy(mc, m, sizeof *mc);
    mc->quant.exclude = m->quant.n_exclude ? ex : NULL;
    for (int i = 0; i < m->quant.n_exclude; i++) {
        size_t l = strlen(m->quant.exclude[i]) + 1;
        memcpy(at, m->quant.exclude[i], l);
        ex[i] = at;
        at += l;
    }
    mr_exec e;
    memset(&e, 0, sizeof e);
    e.magic = MR_EXEC_MAGIC;
    e.model = mc;
    e.quant = r->w.quant;
    e.weight_format = r->w.weight_format;
    e.act_mode = r->w.act_mode;
    e.router_dtype = r->w.router_dtype;
    e.device = r->w.device;
    e.cpu_flags = r->w.cpu_flags;
    e.kernel_isa = r->w.isa;
    e.threads = r->w.threads;
    e.runner = r->w.runner;
    e.a2a = r->w.a2a;
    e.ep_size = r->w.ep_size;
    mr__problem(r, &e.problem);
    e.layout = r->w.layout;
    e.kv_dtype = r->w.kv_dtype;
    e.kv_token_bytes = r->w.kv_token_bytes;
    e.kv_blocks = r->w.kv_blocks;
    e.max_batch_tokens = r->w.max_batch_tokens;
    e.max_running_requests = r->w.max_running;
    e.context_length = r->w.context_length;
    e.ep_timeout_s = (int)strtol(mr__user_value(r, MR_OPT_EP_TIMEOUT), NULL, 10);
    e.step_threads_fixed = !strcmp(mr__user_value(r, MR_OPT_STEP_THREADS), "fixed");
    e.batch_invariant = r->w.batch_invariant;
    e.dense_act_dtype = r->w.dense_act_dtype;
    memcpy(x, &e, sizeof e);
    x->checksum = exec_checksum(x);
    if (mprotect(block, size, PROT_READ) != 0) {
        munmap(block, size);
        return mr_error_set(MR_EIO, "cannot make the exec config read-only");
    }
    r->block = block;
    r->block_size = size;
    r->exec = x;
    char v[32];
    snprintf(v, sizeof v, "%016llx", (unsigned long long)x->checksum);
    return mr__decl(r, MR_DECL_NOTE, "publish", "exec", v,
                    "frozen: the runtime reads this config only; it lives in read-only pages (a write faults) and "
                    "carries this checksum");
}

/* ---- driver ---- */

static mr_resolution *resolution_new(const mr_options *o) {
    mr_resolution *r = mr_calloc(1, sizeof *r);
    if (r == NULL) return NULL;
    for (int i = 0; i < MR_OPT_COUNT; i++) {
        r->user_value[i] = mr_strdup(mr_options_get(o, (mr_opt_id)i));
        r->user_source[i] = o->source[i];
        if (r->user_value[i] == NULL) {
            mr_resolution_free(r);
            return NULL;
        }
    }
    r->w.router_dtype = MR_FMT_COUNT;
    r->w.act_mode = MR_ACT_AUTO;
    r->status = MR_OK;
    return r;
}

static mr_status run_passes(mr_resolution *r) {
    static mr_status (*const passes[])(mr_resolution *) = {pass_checkpoint, pass_platform, pass_model_overrides,
                                                            pass_moe_runner, pass_a2a,      pass_layout,
                                                            pass_engine,     pass_validate, pass_publish};
    for (size_t i = 0; i < sizeof passes / sizeof passes[0]; i++) {
        mr_status s = passes[i](r);
        if (s != MR_OK) return s;
    }
    return MR_OK;
}

static mr_status finish(mr_resolution *r, mr_status s) {
    r->status = s;
    if (s != MR_OK) {
        snprintf(r->error, sizeof r->error, "%s", mr_error_last());
        mr_error_set(s, "%s", r->error);
    }
    return s;
}

mr_status mr_resolve(const mr_options *o, mr_resolution **out) {
    *out = NULL;
    mr_resolution *r = resolution_new(o);
    if (r == NULL) return MR_ENOMEM;
    *out = r;
    mr_status s = mr_model_desc_load(r->user_value[MR_OPT_MODEL], &r->model);
    if (s != MR_OK) {
        char msg[1536];
        snprintf(msg, sizeof msg, "%s", mr_error_last());
        if (mr__decl(r, MR_DECL_ERROR, "checkpoint", "model", r->user_value[MR_OPT_MODEL], "%s", msg) != MR_OK)
            return finish(r, MR_ENOMEM);
        mr_error_set(s, "%s", msg);
        return finish(r, s);
    }
    r->have_model = true;
    return finish(r, run_passes(r));
}

static mr_status copy_desc(const mr_model_desc *src, mr_model_desc *dst) {
    memcpy(dst, src, sizeof *dst);
    dst->quant.exclude = NULL;
    dst->quant.n_exclude = 0;
    if (src->quant.n_exclude == 0) return MR_OK;
    dst->quant.exclude = mr_calloc((size_t)src->quant.n_exclude, sizeof(char *));
    if (dst->quant.exclude == NULL) return MR_ENOMEM;
    for (int i = 0; i < src->quant.n_exclude; i++) {
        dst->quant.exclude[i] = mr_strdup(src->quant.exclude[i]);
        if (dst->quant.exclude[i] == NULL) return MR_ENOMEM;
        dst->quant.n_exclude = i + 1;
    }
    return MR_OK;
}

mr_status mr_resolve_model(const mr_options *o, const mr_model_desc *m, mr_resolution **out) {
    *out = NULL;
    mr_resolution *r = resolution_new(o);
    if (r == NULL) return MR_ENOMEM;
    *out = r;
    if (copy_desc(m, &r->model) != MR_OK) return finish(r, mr_error_set(MR_ENOMEM, NULL));
    r->have_model = true;
    return finish(r, run_passes(r));
}

void mr_resolution_free(mr_resolution *r) {
    if (r == NULL) return;
    for (int i = 0; i < MR_OPT_COUNT; i++) mr_free(r->user_value[i]);
    for (int i = 0; i < r->n_decls; i++) {
        mr_free((void *)r->decls[i].value);
        mr_free((void *)r->decls[i].reason);
    }
    mr_free(r->decls);
    mr_model_desc_free(&r->model);
    if (r->block) munmap(r->block, r->block_size);
    mr_free(r);
}

const mr_exec *mr_resolution_exec(const mr_resolution *r) { return r && r->status == MR_OK ? r->exec : NULL; }
mr_status mr_resolution_status(const mr_resolution *r) { return r ? r->status : MR_EINVAL; }
const char *mr_resolution_error(const mr_resolution *r) { return r && r->status != MR_OK ? r->error : ""; }
int mr_resolution_decl_count(const mr_resolution *r) { return r ? r->n_decls : 0; }

const mr_decl *mr_resolution_decl_at(const mr_resolution *r, int i) {
    if (r == NULL || i < 0 || i >= r->n_decls) return NULL;
    return &r->decls[i];
}

const char *mr_resolution_value(const mr_resolution *r, mr_opt_id id) {
    if (r == NULL || (int)id < 0 || id >= MR_OPT_COUNT) return "";
    const char *name = mr_option_at((int)id)->name;
    for (int i = r->n_decls - 1; i >= 0; i--)
        if (r->decls[i].kind == MR_DECL_SET && !strcmp(r->decls[i].field, name)) return r->decls[i].value;
    return r->user_value[id];
}

mr_opt_source mr_resolution_user_source(const mr_resolution *r, mr_opt_id id) {
    if (r == NULL || (int)id < 0 || id >= MR_OPT_COUNT) return MR_SRC_DEFAULT;
    return r->user_source[id];
}
