/* hfconfig.c — the Hugging Face config reader: config.json (and
 * hf_quant_config.json when present) -> mr_model_desc. Owns the per-
 * architecture field lists, the routing-method derivation (spec/routing.md
 * "No default method": an unrecognized combination is an error naming the
 * fields, never a fallback) and the quantization forms:
 *
 *   unquantized          no quantization_config, no hf_quant_config.json
 *   native FP8           quantization_config {quant_method: fp8, weight_block_size: [128,128],
 *                                             modules_to_not_convert: [...]}
 *   ModelOpt NVFP4 flat  quantization_config {quant_method: modelopt, quant_algo: NVFP4,
 *                                             group_size: 16, exclude_modules: [...]}
 *   ModelOpt NVFP4 hf    hf_quant_config.json {producer: {name: modelopt}, quantization:
 *                                             {quant_algo: NVFP4, group_size: 16, exclude_modules: [...]}}
 *   ModelOpt NVFP4 groups quantization_config {quant_method: modelopt, config_groups: {g: {weights:
 *                                             {num_bits: 4, type: float, group_size: 16}, ...}},
 *                                             ignore: [...]}
 */
#include <errno.h>
#include <fnmatch.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json_internal.h"
#include "config/config_internal.h"

/* ---- names ---- */

static const char *const arch_names[MR_ARCH_COUNT] = {
    [MR_ARCH_UNKNOWN] = "unknown",
    [MR_ARCH_MINIMAX_M2] = "MiniMaxM2ForCausalLM",
    [MR_ARCH_DEEPSEEK_V3] = "DeepseekV3ForCausalLM",
    [MR_ARCH_MIXTRAL] = "MixtralForCausalLM",
    [MR_ARCH_QWEN3_MOE] = "Qwen3MoeForCausalLM",
};

const char *mr_arch_name(mr_arch a) {
    if ((int)a < 0 || a >= MR_ARCH_COUNT) return "unknown";
    return arch_names[a];
}

static const char *const quant_names[MR_QUANT_COUNT] = {"bf16", "fp8", "modelopt_fp4"};

const char *mr_quant_name(mr_quant_kind q) {
    if ((int)q < 0 || q >= MR_QUANT_COUNT) return "unknown";
    return quant_names[q];
}

mr_format mr_quant_weight_format(mr_quant_kind q) {
    switch (q) {
    case MR_QUANT_FP8_BLOCK: return MR_FMT_FP8_BLOCK;
    case MR_QUANT_NVFP4: return MR_FMT_NVFP4;
    default: return MR_FMT_BF16;
    }
}

/* ---- exclusion patterns ---- */

bool mr_quant_is_excluded(const mr_quant_desc *q, const char *name) {
    if (q == NULL || name == NULL) return false;
    size_t len = strlen(name);
    char span[512];
    if (len >= sizeof span) return false;
    for (int p = 0; p < q->n_exclude; p++) {
        const char *pat = q->exclude[p];
        bool wild = strpbrk(pat, "*?[") != NULL;
        /* every run of whole components: [b, e) with b at a component start, e at a component end */
        for (size_t b = 0; b < len; b++) {
            if (b > 0 && name[b - 1] != '.') continue;
            for (size_t e = b + 1; e <= len; e++) {
                if (e < len && name[e] != '.') continue;
                memcpy(span, name + b, e - b);
                span[e - b] = 0;
                if (wild ? fnmatch(pat, span, 0) == 0 : strcmp(pat, span) == 0) return true;
            }
        }
    }
    return false;
}

/* ---- JSON helpers: every error names the file and the field ---- */

typedef struct {
    const char *file; /* "config.json" */
    json_t *root;
} jctx;

static mr_status missing(const jctx *c, const char *key, const char *why) {
    return mr_error_set(MR_ECONFIG, "%s: field '%s' is missing%s%s", c->file, key, why ? ": " : "", why ? why : "");
}

static mr_status wrong_type(const jctx *c, const char *key, const char *want) {
    return mr_error_set(MR_ECONFIG, "%s: field '%s' must be %s", c->file, key, want);
}

/* Present and not null? */
static json_t *get(const jctx *c, const char *key) {
    json_t *v = json_object_get(c->root, key);
    return (v && !json_is_null(v)) ? v : NULL;
}

/* eos_token_id of one file (config.json, generation_config.json): an
 * integer or a list of integers, each a token id; added to m once each, in
 * order, up to MR_MAX_EOS. The one parser of EOS ids. */
static mr_status read_eos(const jctx *c, mr_model_desc *m) {
    json_t *eos = json_object_get(c->root, "eos_token_id");
    if (eos == NULL || json_is_null(eos)) return MR_OK;
    size_t n = json_is_array(eos) ? json_array_size(eos) : 1;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_is_array(eos) ? json_array_get(eos, i) : eos;
        if (!json_is_integer(e)) return wrong_type(c, "eos_token_id", "an integer or a list of integers");
        json_int_t id = json_integer_value(e);
        if (id < 0 || id > INT32_MAX)
            return mr_error_set(MR_ECONFIG, "%s: field 'eos_token_id': %lld is not a token id", c->file, (long long)id);
        bool seen = false;
        for (int j = 0; j < m->n_eos; j++) seen = seen || m->eos_ids[j] == (int32_t)id;
        if (!seen && m->n_eos < MR_MAX_EOS) m->eos_ids[m->n_eos++] = (int32_t)id;
    }
    return MR_OK;
}

static mr_status get_int(const jctx *c, const char *key, bool required, int64_t lo, int64_t hi, int64_t *out) {
    json_t *v = get(c, key);
    if (v == NULL) return required ? missing(c, key, NULL) : MR_OK;
    if (!json_is_integer(v)) return wrong_type(c, key, "an integer");
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return mr_error_set(MR_ECONFIG, "%s: field '%s' = %lld is out of range %lld..%lld", c->file, key, (long long)x,
                            (long long)lo, (long long)hi);
    *out = (int64_t)x;
    return MR_OK;
}

static mr_status get_num(const jctx *c, const char *key, bool required, double *out, bool *present) {
    json_t *v = get(c, key);
    if (present) *present = v != NULL;
    if (v == NULL) return required ? missing(c, key, NULL) : MR_OK;
    if (!json_is_number(v)) return wrong_type(c, key, "a number");
    double d = json_number_value(v);
    if (!isfinite(d)) return wrong_type(c, key, "a finite number");
    *out = d;
    return MR_OK;
}

/* -1 absent, 0 false, 1 true */
static mr_status get_bool(const jctx *c, const char *key, int *out) {
    json_t *v = get(c, key);
    *out = -1;
    if (v == NULL) return MR_OK;
    if (!json_is_boolean(v)) return wrong_type(c, key, "true or false");
    *out = json_is_true(v) ? 1 : 0;
    return MR_OK;
}

static mr_status get_str(const jctx *c, const char *key, const char **out) {
    json_t *v = get(c, key);
    *out = NULL;
    if (v == NULL) return MR_OK;
    if (!json_is_string(v)) return wrong_type(c, key, "a string");
    *out = json_string_value(v);
    return MR_OK;
}

#define TRY(x)                           \
    do {                                 \
        mr_status s_ = (x);              \
        if (s_ != MR_OK) return s_;      \
    } while (0)

/* ---- routing derivation ---- */

typedef struct {
    const char *scoring;     /* "softmax" / "sigmoid" / other; NULL if absent and not implied */
    const char *scoring_src; /* "scoring_func" or "implied by <arch>" */
    int bias;                /* -1 unknown, 0, 1 */
    const char *bias_src;    /* "use_routing_bias=true", "topk_method=noaux_tc", "none in <arch>" */
    int64_t n_group, topk_group;
    double scale;
    bool has_scale;
    int norm;                /* norm_topk_prob: -1 absent, 0, 1 */
} route_fields;

static void describe_fields(const route_fields *f, char *buf, size_t n) {
    char g[64] = "n_group absent", tg[64] = "topk_group absent", sc[64] = "routed_scaling_factor absent";
    if (f->n_group >= 0) snprintf(g, sizeof g, "n_group=%lld", (long long)f->n_group);
    if (f->topk_group >= 0) snprintf(tg, sizeof tg, "topk_group=%lld", (long long)f->topk_group);
    if (f->has_scale) snprintf(sc, sizeof sc, "routed_scaling_factor=%g", f->scale);
    snprintf(buf, n, "scoring_func=%s (%s), correction bias=%s (%s), %s, %s, %s, norm_topk_prob=%s",
             f->scoring ? f->scoring : "absent", f->scoring_src, f->bias < 0 ? "unknown" : f->bias ? "yes" : "no",
             f->bias_src, g, tg, sc, f->norm < 0 ? "absent" : f->norm ? "true" : "false");
}

static mr_status unrecognized(const char *file, const route_fields *f, const char *why) {
    char d[400];
    describe_fields(f, d, sizeof d);
    return mr_error_set(MR_ECONFIG,
                        "%s: unrecognized routing combination (%s): %s; the known methods are softmax+renormalize, "
                        "softmax_topk, minimax2 (sigmoid+bias, no groups), deepseek_v3 (sigmoid+bias+groups), "
                        "sigmoid_renorm and sigmoid; there is no default",
                        file, why, d);
}

static mr_status derive_routing(const char *file, const route_fields *f, int n_experts, int top_k, mr_model_desc *m) {
    bool grouped = f->n_group > 1;
    if (f->scoring == NULL) return unrecognized(file, f, "scoring_func is missing");
    if (f->bias < 0) return unrecognized(file, f, "whether a correction bias exists is not stated");
    m->routed_scale = 1.0f;
    m->routing_bias = f->bias == 1;
    m->n_group = 0;
    m->topk_group = 0;
    if (!strcmp(f->scoring, "softmax")) {
        if (f->bias) return unrecognized(file, f, "softmax scoring with a correction bias");
        if (grouped) return unrecognized(file, f, "softmax scoring with grouped selection");
        if (f->has_scale && f->scale != 1.0) return unrecognized(file, f, "softmax scoring with a routed scaling factor");
        if (f->norm < 0) return unrecognized(file, f, "norm_topk_prob is missing (it decides renormalize vs softmax_topk)");
        m->routing = f->norm ? MR_ROUTING_RENORMALIZE : MR_ROUTING_SOFTMAX_TOPK;
        snprintf(m->routing_why, sizeof m->routing_why, "scoring softmax (%s), no correction bias, norm_topk_prob=%s",
                 f->scoring_src, f->norm ? "true" : "false");
        return MR_OK;
    }
    if (!strcmp(f->scoring, "sigmoid")) {
        if (f->bias) {
            if (f->norm == 0) return unrecognized(file, f, "sigmoid+bias without renormalization");
            if (grouped) {
                if (f->topk_group < 1 || f->topk_group > f->n_group)
                    return unrecognized(file, f, "grouped selection needs 1 <= topk_group <= n_group");
                if (n_experts % f->n_group != 0)
                    return unrecognized(file, f, "the experts do not split evenly into n_group groups");
                if ((int64_t)top_k > f->topk_group * (n_experts / f->n_group))
                    return unrecognized(file, f, "top-k is larger than the experts in the kept groups");
                if (!f->has_scale) return unrecognized(file, f, "grouped routing needs routed_scaling_factor");
                m->routing = MR_ROUTING_DEEPSEEK_V3;
                m->n_group = (int)f->n_group;
                m->topk_group = (int)f->topk_group;
                m->routed_scale = (float)f->scale;
                snprintf(m->routing_why, sizeof m->routing_why,
                         "scoring_func=sigmoid, correction bias (%s), n_group=%d, topk_group=%d, "
                         "routed_scaling_factor=%g",
                         f->bias_src, m->n_group, m->topk_group, f->scale);
                return MR_OK;
            }
            if (f->topk_group > 1) return unrecognized(file, f, "topk_group without n_group");
            m->routing = MR_ROUTING_MINIMAX2;
            m->routed_scale = f->has_scale ? (float)f->scale : 1.0f;
            snprintf(m->routing_why, sizeof m->routing_why, "scoring_func=sigmoid, correction bias (%s), no groups%s",
                     f->bias_src, f->has_scale && f->scale != 1.0 ? ", routed_scaling_factor set" : "");
            return MR_OK;
        }
        if (grouped) return unrecognized(file, f, "grouped selection without a correction bias");
        if (f->norm < 0) return unrecognized(file, f, "norm_topk_prob is missing (it decides sigmoid_renorm vs sigmoid)");
        m->routing = f->norm ? MR_ROUTING_SIGMOID_RENORM : MR_ROUTING_SIGMOID;
        if (f->has_scale) m->routed_scale = (float)f->scale;
        snprintf(m->routing_why, sizeof m->routing_why, "scoring_func=sigmoid, no correction bias, norm_topk_prob=%s",
                 f->norm ? "true" : "false");
        return MR_OK;
    }
    return unrecognized(file, f, "unknown scoring_func (known: softmax, sigmoid)");
}

/* ---- quantization ---- */

static mr_status add_excludes(mr_quant_desc *q, const jctx *c, json_t *list, const char *key) {
    if (list == NULL || json_is_null(list)) return MR_OK;
    if (!json_is_array(list)) return wrong_type(c, key, "a list of strings");
    size_t n = json_array_size(list);
    if (n > 1000000) return mr_error_set(MR_ECONFIG, "%s: '%s' has too many entries", c->file, key);
    size_t total;
    if (!mr_size_add((size_t)q->n_exclude, n, &total) || total > 1000000)
        return mr_error_set(MR_ECONFIG, "%s: too many exclusion patterns", c->file);
    char **grown = mr_realloc(q->exclude, (total ? total : 1) * sizeof *grown);
    if (grown == NULL) return MR_ENOMEM;
    q->exclude = grown;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(list, i);
        if (!json_is_string(e)) return mr_error_set(MR_ECONFIG, "%s: '%s'[%zu] must be a string", c->file, key, i);
        char *s = mr_strdup(json_string_value(e));
        if (s == NULL) return MR_ENOMEM;
        q->exclude[q->n_exclude++] = s;
    }
    return MR_OK;
}

static mr_status check_group_size(const jctx *c, json_t *obj, const char *key_path) {
    json_t *g = json_object_get(obj, "group_size");
    if (g == NULL || json_is_null(g)) return MR_OK;
    if (!json_is_integer(g)) return wrong_type(c, key_path, "an integer");
    if (json_integer_value(g) != 16)
        return mr_error_set(MR_ECONFIG, "%s: %s = %lld is not supported: NVFP4 uses blocks of 16", c->file, key_path,
                            (long long)json_integer_value(g));
    return MR_OK;
}

static mr_status algo_to_kind(const jctx *c, const char *key, const char *algo, mr_quant_kind *out) {
    if (algo && !strcmp(algo, "NVFP4")) {
        *out = MR_QUANT_NVFP4;
        return MR_OK;
    }
    return mr_error_set(MR_EUNSUPPORTED,
                        "%s: %s = %s is not supported (supported ModelOpt algorithms: NVFP4; native block FP8 uses "
                        "quant_method fp8)",
                        c->file, key, algo ? algo : "null");
}

/* quantization_config in config.json. found=false if absent. */
static mr_status parse_qc(const jctx *c, json_t *qc, mr_quant_desc *q, bool *found) {
    *found = false;
    if (qc == NULL || json_is_null(qc)) return MR_OK;
    if (!json_is_object(qc)) return wrong_type(c, "quantization_config", "an object");
    jctx qx = {c->file, qc};
    const char *method = NULL, *algo = NULL;
    TRY(get_str(&qx, "quant_method", &method));
    TRY(get_str(&qx, "quant_algo", &algo));
    if (method == NULL) return missing(c, "quantization_config.quant_method", "expected fp8 or modelopt");
    *found = true;
    if (!strcmp(method, "fp8")) {
        if (algo && strcmp(algo, "FP8") != 0)
            return mr_error_set(MR_ECONFIG,
                                "%s: contradictory quantization: quantization_config.quant_method = fp8 but quant_algo = %s",
                                c->file, algo);
        json_t *bs = json_object_get(qc, "weight_block_size");
        if (bs == NULL || json_is_null(bs))
            return missing(c, "quantization_config.weight_block_size",
                           "per-tensor FP8 is not supported; native FP8 needs [128, 128] blocks");
        if (!json_is_array(bs) || json_array_size(bs) != 2 || !json_is_integer(json_array_get(bs, 0)) ||
            !json_is_integer(json_array_get(bs, 1)))
            return wrong_type(c, "quantization_config.weight_block_size", "a list of two integers");
        long long bn = json_integer_value(json_array_get(bs, 0)), bk = json_integer_value(json_array_get(bs, 1));
        if (bn != 128 || bk != 128)
            return mr_error_set(MR_EUNSUPPORTED,
                                "%s: quantization_config.weight_block_size [%lld, %lld] is not supported: FP8 block "
                                "scales must be [128, 128]",
                                c->file, bn, bk);
        const char *fmt = NULL, *scheme = NULL;
        TRY(get_str(&qx, "fmt", &fmt));
        TRY(get_str(&qx, "activation_scheme", &scheme));
        if (fmt && strcmp(fmt, "float8_e4m3fn") != 0 && strcmp(fmt, "e4m3") != 0)
            return mr_error_set(MR_EUNSUPPORTED, "%s: quantization_config.fmt = %s is not supported (float8_e4m3fn only)",
                                c->file, fmt);
        if (scheme && strcmp(scheme, "dynamic") != 0)
            return mr_error_set(MR_EUNSUPPORTED,
                                "%s: quantization_config.activation_scheme = %s is not supported (dynamic only)",
                                c->file, scheme);
        q->kind = MR_QUANT_FP8_BLOCK;
        q->form = MR_QUANT_FORM_FP8;
        q->block_n = 128;
        q->block_k = 128;
        snprintf(q->where, sizeof q->where,
                 "config.json quantization_config: quant_method=fp8, weight_block_size=[128, 128]");
        TRY(add_excludes(q, c, json_object_get(qc, "modules_to_not_convert"), "quantization_config.modules_to_not_convert"));
        TRY(add_excludes(q, c, json_object_get(qc, "ignored_layers"), "quantization_config.ignored_layers"));
        return MR_OK;
    }
    if (!strcmp(method, "modelopt")) {
        json_t *groups = json_object_get(qc, "config_groups");
        if (groups && !json_is_null(groups)) {
            if (!json_is_object(groups) || json_object_size(groups) == 0)
                return wrong_type(c, "quantization_config.config_groups", "a non-empty object");
            const char *gname;
            json_t *g;
            json_object_foreach(groups, gname, g) {
                json_t *w = json_is_object(g) ? json_object_get(g, "weights") : NULL;
                if (!json_is_object(w))
                    return mr_error_set(MR_ECONFIG, "%s: quantization_config.config_groups.%s.weights must be an object",
                                        c->file, gname);
                json_t *nb = json_object_get(w, "num_bits"), *ty = json_object_get(w, "type");
                if (!json_is_integer(nb) || !json_is_string(ty))
                    return mr_error_set(MR_ECONFIG,
                                        "%s: quantization_config.config_groups.%s.weights needs num_bits (integer) and "
                                        "type (string)",
                                        c->file, gname);
                if (json_integer_value(nb) != 4 || strcmp(json_string_value(ty), "float") != 0)
                    return mr_error_set(MR_EUNSUPPORTED,
                                        "%s: quantization_config.config_groups.%s.weights (num_bits %lld, type %s) is "
                                        "not supported: only NVFP4 (num_bits 4, type float, group_size 16)",
                                        c->file, gname, (long long)json_integer_value(nb), json_string_value(ty));
                char path[160];
                snprintf(path, sizeof path, "quantization_config.config_groups.%s.weights.group_size", gname);
                if (json_object_get(w, "group_size") == NULL) return missing(c, path, "NVFP4 needs group_size 16");
                TRY(check_group_size(c, w, path));
            }
            if (algo && strcmp(algo, "NVFP4") != 0)
                return mr_error_set(MR_ECONFIG,
                                    "%s: contradictory quantization: config_groups describe NVFP4 but quant_algo = %s",
                                    c->file, algo);
            q->kind = MR_QUANT_NVFP4;
            q->form = MR_QUANT_FORM_MODELOPT_GROUPS;
            q->group_size = 16;
            snprintf(q->where, sizeof q->where,
                     "config.json quantization_config: quant_method=modelopt, config_groups (weights: 4-bit float, "
                     "group_size 16)");
            TRY(add_excludes(q, c, json_object_get(qc, "ignore"), "quantization_config.ignore"));
            TRY(add_excludes(q, c, json_object_get(qc, "exclude_modules"), "quantization_config.exclude_modules"));
            return MR_OK;
        }
        if (algo) {
            TRY(algo_to_kind(c, "quantization_config.quant_algo", algo, &q->kind));
            TRY(check_group_size(c, qc, "quantization_config.group_size"));
            q->form = MR_QUANT_FORM_MODELOPT_FLAT;
            q->group_size = 16;
            snprintf(q->where, sizeof q->where, "config.json quantization_config: quant_method=modelopt, quant_algo=%s",
                     algo);
            TRY(add_excludes(q, c, json_object_get(qc, "exclude_modules"), "quantization_config.exclude_modules"));
            TRY(add_excludes(q, c, json_object_get(qc, "ignore"), "quantization_config.ignore"));
            return MR_OK;
        }
        /* quant_method only: hf_quant_config.json must say what */
        *found = false;
        q->form = MR_QUANT_FORM_NONE;
        return MR_OK;
    }
    return mr_error_set(MR_EUNSUPPORTED,
                        "%s: quantization_config.quant_method = %s is not supported (supported: fp8, modelopt)", c->file,
                        method);
}

/* hf_quant_config.json. */
static mr_status parse_hfq(const jctx *c, mr_quant_desc *q) {
    if (!json_is_object(c->root)) return mr_error_set(MR_ECONFIG, "%s: must be a JSON object", c->file);
    json_t *prod = json_object_get(c->root, "producer");
    if (prod && json_is_object(prod)) {
        json_t *pn = json_object_get(prod, "name");
        if (json_is_string(pn) && strcmp(json_string_value(pn), "modelopt") != 0)
            return mr_error_set(MR_EUNSUPPORTED, "%s: producer.name = %s is not supported (modelopt only)", c->file,
                                json_string_value(pn));
    }
    json_t *qz = json_object_get(c->root, "quantization");
    if (qz == NULL || !json_is_object(qz)) return missing(c, "quantization", "expected {\"quant_algo\": \"NVFP4\", ...}");
    json_t *a = json_object_get(qz, "quant_algo");
    if (a == NULL || json_is_null(a)) return missing(c, "quantization.quant_algo", "expected NVFP4");
    if (!json_is_string(a)) return wrong_type(c, "quantization.quant_algo", "a string");
    TRY(algo_to_kind(c, "quantization.quant_algo", json_string_value(a), &q->kind));
    TRY(check_group_size(c, qz, "quantization.group_size"));
    q->form = MR_QUANT_FORM_MODELOPT_HF;
    q->group_size = 16;
    snprintf(q->where, sizeof q->where, "hf_quant_config.json quantization: quant_algo=%s (ModelOpt)",
             json_string_value(a));
    TRY(add_excludes(q, c, json_object_get(qz, "exclude_modules"), "quantization.exclude_modules"));
    return MR_OK;
}

static mr_status parse_quant(const jctx *c, json_t *hfq_root, mr_quant_desc *q) {
    memset(q, 0, sizeof *q);
    q->kind = MR_QUANT_NONE;
    snprintf(q->where, sizeof q->where, "config.json has no quantization_config and there is no hf_quant_config.json");
    bool qc_found = false;
    json_t *qc = json_object_get(c->root, "quantization_config");
    bool qc_present = qc && !json_is_null(qc);
    TRY(parse_qc(c, qc, q, &qc_found));
    if (hfq_root == NULL) {
        if (qc_present && !qc_found)
            return mr_error_set(MR_ECONFIG,
                                "config.json: quantization_config.quant_method = modelopt names neither quant_algo nor "
                                "config_groups, and there is no hf_quant_config.json");
        return MR_OK;
    }
    jctx hc = {"hf_quant_config.json", hfq_root};
    if (!qc_found) {
        mr_quant_desc hq;
        memset(&hq, 0, sizeof hq);
        hq.exclude = q->exclude; /* keep patterns gathered so far */
        hq.n_exclude = q->n_exclude;
        mr_status s = parse_hfq(&hc, &hq);
        q->exclude = hq.exclude;
        q->n_exclude = hq.n_exclude;
        if (s != MR_OK) return s;
        q->kind = hq.kind;
        q->form = hq.form;
        q->group_size = hq.group_size;
        memcpy(q->where, hq.where, sizeof q->where);
        if (qc_present) {
            size_t l = strlen(q->where);
            snprintf(q->where + l, sizeof q->where - l, " (config.json: quant_method=modelopt)");
        }
        return MR_OK;
    }
    /* Both declare: they must agree. */
    mr_quant_desc hq;
    memset(&hq, 0, sizeof hq);
    mr_status s = parse_hfq(&hc, &hq);
    if (s == MR_OK && hq.kind != q->kind)
        s = mr_error_set(MR_ECONFIG,
                         "contradictory quantization: config.json quantization_config says %s but hf_quant_config.json "
                         "says %s",
                         mr_quant_name(q->kind), mr_quant_name(hq.kind));
    if (s == MR_OK) {
        /* union of the exclusion lists */
        for (int i = 0; i < hq.n_exclude && s == MR_OK; i++) {
            char **grown = mr_realloc(q->exclude, (size_t)(q->n_exclude + 1) * sizeof *grown);
            if (grown == NULL) {
                s = MR_ENOMEM;
                break;
            }
            q->exclude = grown;
            q->exclude[q->n_exclude++] = hq.exclude[i];
            hq.exclude[i] = NULL;
        }
        size_t l = strlen(q->where);
        snprintf(q->where + l, sizeof q->where - l, "; hf_quant_config.json agrees");
    }
    for (int i = 0; i < hq.n_exclude; i++) mr_free(hq.exclude[i]);
    mr_free(hq.exclude);
    return s;
}

/* ---- RoPE ---- */
/* The RoPE object of a config: transformers 4 writes "rope_scaling" (null for
 * plain RoPE), transformers 5 "rope_parameters" (with "rope_type" and
 * "rope_theta" inside). NULL when absent or null. */
static mr_status rope_object(const jctx *c, const char **key, json_t **obj) {
    static const char *const keys[] = {"rope_scaling", "rope_parameters"};
    *key = NULL, *obj = NULL;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        json_t *v = get(c, keys[i]);
        if (!v) continue;
        if (!json_is_object(v)) return wrong_type(c, keys[i], "an object or null");
        if (*obj) return mr_error_set(MR_ECONFIG, "%s: both rope_scaling and rope_parameters are given", c->file);
        *key = keys[i], *obj = v;
    }
    return MR_OK;
}

/* rope_theta at the top level, or inside rope_parameters; both: they agree */
static mr_status read_rope_theta(const jctx *c, mr_model_desc *m) {
    bool top = false;
    TRY(get_num(c, "rope_theta", false, &m->rope_theta, &top));
    const char *key;
    json_t *o;
    TRY(rope_object(c, &key, &o));
    json_t *t = o ? json_object_get(o, "rope_theta") : NULL;
    if (t && !json_is_null(t)) {
        if (!json_is_number(t) || !isfinite(json_number_value(t)))
            return mr_error_set(MR_ECONFIG, "%s: field '%s.rope_theta' must be a finite number", c->file, key);
        if (top && json_number_value(t) != m->rope_theta)
            return mr_error_set(MR_ECONFIG, "%s: rope_theta (%g) contradicts %s.rope_theta (%g)", c->file,
                                m->rope_theta, key, json_number_value(t));
        m->rope_theta = json_number_value(t);
        top = true;
    }
    return top ? MR_OK : missing(c, "rope_theta", NULL);
}

/* The model runtime computes plain RoPE (MiniMax-M2 ships it). A scaled RoPE
 * (yarn, linear, dynamic, llama3, longrope, ...) is another model: computing
 * it as plain RoPE would answer with plausible text that transformers would
 * not give, so it is refused. As transformers reads the object: its type is
 * "rope_type" (or "type" in older configs); "default" is plain RoPE whatever
 * else the object holds. Without a type, only rope_theta,
 * partial_rotary_factor and a factor of 1 are plain. */
static mr_status check_plain_rope(const jctx *c) {
    const char *key;
    json_t *o;
    TRY(rope_object(c, &key, &o));
    if (!o) return MR_OK;
    const char *tk = json_object_get(o, "rope_type") ? "rope_type" : "type";
    json_t *t = json_object_get(o, tk);
    if (t) {
        if (!json_is_string(t)) return mr_error_set(MR_ECONFIG, "%s: field '%s.%s' must be a string", c->file, key, tk);
        if (strcmp(json_string_value(t), "default") != 0)
            return mr_error_set(MR_EUNSUPPORTED,
                                "%s: %s.%s is \"%s\": only plain RoPE (\"default\") is supported, as MiniMax-M2 "
                                "ships it; computing it as plain RoPE would give another model's outputs",
                                c->file, key, tk, json_string_value(t));
        return MR_OK;
    }
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        if (!strcmp(k, "rope_theta") || !strcmp(k, "partial_rotary_factor")) continue;
        if (!strcmp(k, "factor") && (json_is_null(v) || (json_is_number(v) && json_number_value(v) == 1.0))) continue;
        return mr_error_set(MR_EUNSUPPORTED, "%s: %s has %s and no rope_type: only plain RoPE (\"default\") is supported",
                            c->file, key, k);
    }
    return MR_OK;
}

/* transformers' MiniMax-M2 experts apply ACT2FN[hidden_act]: anything but SiLU
 * ("silu", or its alias "swish") is another model than the one the runtime
 * computes, so it is refused rather than ignored. (sliding_window and
 * layer_types are not read there: its model builds a plain causal mask, "no
 * sliding window opposed to mixtral", so neither is here.) */
static mr_status check_silu(const jctx *c) {
    const char *act = NULL;
    TRY(get_str(c, "hidden_act", &act));
    if (act && strcmp(act, "silu") != 0 && strcmp(act, "swish") != 0)
        return mr_error_set(MR_EUNSUPPORTED, "%s: hidden_act is \"%s\": the experts compute SiLU (\"silu\") only", c->file,
                            act);
    return MR_OK;
}

/* ---- the architectures ---- */

static mr_status read_common(const jctx *c, mr_model_desc *m) {
    TRY(get_int(c, "hidden_size", true, 1, INT64_C(1) << 20, &m->hidden));
    TRY(get_int(c, "num_hidden_layers", true, 1, 100000, &m->n_layers));
    TRY(get_int(c, "num_attention_heads", true, 1, 65536, &m->n_heads));
    m->n_kv_heads = m->n_heads;
    TRY(get_int(c, "num_key_value_heads", false, 1, 65536, &m->n_kv_heads));
    if (m->n_heads % m->n_kv_heads != 0)
        return mr_error_set(MR_ECONFIG, "%s: num_attention_heads (%lld) is not a multiple of num_key_value_heads (%lld)",
                            c->file, (long long)m->n_heads, (long long)m->n_kv_heads);
    TRY(get_int(c, "vocab_size", true, 1, INT64_C(1) << 31, &m->vocab));
    m->max_pos = 0;
    TRY(get_int(c, "max_position_embeddings", false, 1, INT64_C(1) << 40, &m->max_pos));
    TRY(read_rope_theta(c, m));
    TRY(get_num(c, "rms_norm_eps", true, &m->rms_eps, NULL));
    if (m->rope_theta <= 0) return mr_error_set(MR_ECONFIG, "%s: rope_theta must be positive", c->file);
    if (m->rms_eps <= 0) return mr_error_set(MR_ECONFIG, "%s: rms_norm_eps must be positive", c->file);
    int tie;
    TRY(get_bool(c, "tie_word_embeddings", &tie));
    m->tie_embeddings = tie == 1; /* the HF classes of all four architectures default to false */
    return read_eos(c, m);
}

static mr_status read_experts(const jctx *c, const char *e_key, mr_model_desc *m) {
    int64_t e = 0, k = 0;
    TRY(get_int(c, e_key, true, 1, 65536, &e));
    TRY(get_int(c, "num_experts_per_tok", true, 1, 65536, &k));
    if (k > e)
        return mr_error_set(MR_ECONFIG, "%s: num_experts_per_tok (%lld) exceeds %s (%lld)", c->file, (long long)k, e_key,
                            (long long)e);
    m->n_experts = (int)e;
    m->top_k = (int)k;
    return MR_OK;
}

static mr_status rotary_from(const jctx *c, mr_model_desc *m) {
    int64_t rd = -1;
    double prf = 0;
    bool has_prf = false;
    TRY(get_int(c, "rotary_dim", false, 1, m->head_dim, &rd));
    TRY(get_num(c, "partial_rotary_factor", false, &prf, &has_prf));
    const char *key;
    json_t *o;
    TRY(rope_object(c, &key, &o));
    json_t *inner = o ? json_object_get(o, "partial_rotary_factor") : NULL;
    if (inner && !json_is_null(inner)) { /* transformers 5 keeps it in rope_parameters */
        if (!json_is_number(inner)) return wrong_type(c, "partial_rotary_factor", "a number");
        if (has_prf && json_number_value(inner) != prf)
            return mr_error_set(MR_ECONFIG, "%s: partial_rotary_factor (%g) contradicts %s.partial_rotary_factor (%g)",
                                c->file, prf, key, json_number_value(inner));
        prf = json_number_value(inner), has_prf = true;
    }
    if (has_prf && (prf <= 0 || prf > 1))
        return mr_error_set(MR_ECONFIG, "%s: partial_rotary_factor = %g must be in (0, 1]", c->file, prf);
    if (rd > 0 && has_prf && (int64_t)llround(prf * (double)m->head_dim) != rd)
        return mr_error_set(MR_ECONFIG,
                            "%s: rotary_dim (%lld) contradicts partial_rotary_factor (%g) * head_dim (%lld)", c->file,
                            (long long)rd, prf, (long long)m->head_dim);
    if (rd > 0)
        m->rotary_dim = rd;
    else if (has_prf)
        m->rotary_dim = (int64_t)llround(prf * (double)m->head_dim);
    else
        m->rotary_dim = m->head_dim;
    if (m->rotary_dim % 2 != 0) return mr_error_set(MR_ECONFIG, "%s: the rotary dimension must be even", c->file);
    return MR_OK;
}

static mr_status read_minimax_m2(const jctx *c, mr_model_desc *m, route_fields *rf) {
    TRY(read_common(c, m));
    TRY(check_plain_rope(c));
    TRY(check_silu(c));
    TRY(get_int(c, "head_dim", true, 1, 65536, &m->head_dim));
    TRY(rotary_from(c, m));
    TRY(get_int(c, "intermediate_size", true, 1, INT64_C(1) << 20, &m->moe_inter));
    TRY(read_experts(c, "num_local_experts", m));
    TRY(get_int(c, "shared_intermediate_size", false, 0, INT64_C(1) << 20, &m->shared_inter));
    int qk, mtp;
    TRY(get_bool(c, "use_qk_norm", &qk));
    if (qk == 1) {
        const char *t = NULL;
        TRY(get_str(c, "qk_norm_type", &t));
        if (t == NULL) return missing(c, "qk_norm_type", "use_qk_norm is true");
        if (!strcmp(t, "per_layer"))
            m->qk_norm = MR_QK_NORM_PER_LAYER;
        else if (!strcmp(t, "per_head"))
            m->qk_norm = MR_QK_NORM_PER_HEAD;
        else
            return mr_error_set(MR_ECONFIG, "%s: qk_norm_type = %s is not known (per_layer, per_head)", c->file, t);
    }
    json_t *atl = get(c, "attn_type_list");
    if (atl) {
        if (!json_is_array(atl) || (int64_t)json_array_size(atl) < m->n_layers)
            return wrong_type(c, "attn_type_list", "a list with one entry per layer");
        for (int64_t i = 0; i < m->n_layers; i++) {
            json_t *v = json_array_get(atl, (size_t)i);
            if (!json_is_integer(v) || json_integer_value(v) != 1)
                return mr_error_set(MR_EUNSUPPORTED,
                                    "%s: attn_type_list[%lld] is not 1: only full attention layers are supported",
                                    c->file, (long long)i);
        }
    }
    TRY(get_bool(c, "use_mtp", &mtp));
    if (mtp == 1) {
        int64_t n = 0;
        TRY(get_int(c, "num_mtp_modules", false, 0, 64, &n));
        m->n_mtp = (int)n;
    }
    int bias;
    TRY(get_bool(c, "use_routing_bias", &bias));
    rf->bias = bias;
    rf->bias_src = bias == 1 ? "use_routing_bias=true" : bias == 0 ? "use_routing_bias=false" : "use_routing_bias absent";
    return MR_OK;
}

static mr_status read_deepseek_v3(const jctx *c, mr_model_desc *m, route_fields *rf) {
    TRY(read_common(c, m));
    int64_t nope = 0, rope = 0, dense = 0, shared = 0, nextn = 0;
    TRY(get_int(c, "qk_nope_head_dim", true, 0, 65536, &nope));
    TRY(get_int(c, "qk_rope_head_dim", true, 0, 65536, &rope));
    m->head_dim = nope + rope;
    m->rotary_dim = rope;
    TRY(get_int(c, "intermediate_size", true, 1, INT64_C(1) << 20, &m->inter));
    TRY(get_int(c, "moe_intermediate_size", true, 1, INT64_C(1) << 20, &m->moe_inter));
    TRY(read_experts(c, "n_routed_experts", m));
    TRY(get_int(c, "n_shared_experts", false, 0, 64, &shared));
    m->shared_inter = shared * m->moe_inter;
    TRY(get_int(c, "first_k_dense_replace", false, 0, m->n_layers, &dense));
    m->n_dense_layers = (int)dense;
    TRY(get_int(c, "num_nextn_predict_layers", false, 0, 64, &nextn));
    m->n_mtp = (int)nextn;
    const char *tm = NULL;
    TRY(get_str(c, "topk_method", &tm));
    int ub;
    TRY(get_bool(c, "use_routing_bias", &ub));
    if (ub >= 0) {
        rf->bias = ub;
        rf->bias_src = ub ? "use_routing_bias=true" : "use_routing_bias=false";
    } else if (tm && !strcmp(tm, "noaux_tc")) {
        rf->bias = 1;
        rf->bias_src = "topk_method=noaux_tc";
    } else if (tm && (!strcmp(tm, "greedy") || !strcmp(tm, "group_limited_greedy"))) {
        rf->bias = 0;
        rf->bias_src = !strcmp(tm, "greedy") ? "topk_method=greedy" : "topk_method=group_limited_greedy";
    } else {
        rf->bias = -1;
        rf->bias_src = tm ? "topk_method not known (noaux_tc, greedy, group_limited_greedy)" : "topk_method absent";
    }
    return MR_OK;
}

static mr_status read_mixtral(const jctx *c, mr_model_desc *m, route_fields *rf) {
    TRY(read_common(c, m));
    m->head_dim = 0;
    TRY(get_int(c, "head_dim", false, 1, 65536, &m->head_dim));
    if (m->head_dim == 0) {
        if (m->hidden % m->n_heads != 0) return missing(c, "head_dim", "hidden_size is not a multiple of num_attention_heads");
        m->head_dim = m->hidden / m->n_heads;
    }
    TRY(rotary_from(c, m));
    TRY(get_int(c, "intermediate_size", true, 1, INT64_C(1) << 20, &m->moe_inter));
    TRY(read_experts(c, "num_local_experts", m));
    /* Mixtral's router is softmax + top-k + renormalize by construction. */
    rf->scoring = "softmax";
    rf->scoring_src = "implied by MixtralForCausalLM";
    rf->bias = 0;
    rf->bias_src = "none in MixtralForCausalLM";
    rf->norm = 1;
    return MR_OK;
}

static mr_status read_qwen3_moe(const jctx *c, mr_model_desc *m, route_fields *rf) {
    TRY(read_common(c, m));
    TRY(get_int(c, "head_dim", true, 1, 65536, &m->head_dim));
    TRY(rotary_from(c, m));
    TRY(get_int(c, "intermediate_size", false, 1, INT64_C(1) << 20, &m->inter));
    TRY(get_int(c, "moe_intermediate_size", true, 1, INT64_C(1) << 20, &m->moe_inter));
    TRY(read_experts(c, "num_experts", m));
    m->qk_norm = MR_QK_NORM_PER_HEAD;
    rf->scoring = "softmax";
    rf->scoring_src = "implied by Qwen3MoeForCausalLM";
    rf->bias = 0;
    rf->bias_src = "none in Qwen3MoeForCausalLM";
    /* norm_topk_prob is read below; absent is an error (transformers would
     * silently default it to false while released checkpoints set true). */
    return MR_OK;
}

void mr_model_desc_free(mr_model_desc *d) {
    if (d == NULL) return;
    for (int i = 0; i < d->quant.n_exclude; i++) mr_free(d->quant.exclude[i]);
    mr_free(d->quant.exclude);
    d->quant.exclude = NULL;
    d->quant.n_exclude = 0;
}

static mr_status parse_roots(json_t *root, json_t *hfq, mr_model_desc *m) {
    jctx c = {"config.json", root};
    if (!json_is_object(root)) return mr_error_set(MR_ECONFIG, "config.json: must be a JSON object");
    json_t *archs = json_object_get(root, "architectures");
    if (archs == NULL || json_is_null(archs)) return missing(&c, "architectures", "expected e.g. [\"MiniMaxM2ForCausalLM\"]");
    if (!json_is_array(archs) || json_array_size(archs) != 1 || !json_is_string(json_array_get(archs, 0)))
        return wrong_type(&c, "architectures", "a list of exactly one string");
    const char *a = json_string_value(json_array_get(archs, 0));
    snprintf(m->architecture, sizeof m->architecture, "%s", a);
    for (int i = 1; i < MR_ARCH_COUNT; i++)
        if (!strcmp(a, arch_names[i])) m->arch = (mr_arch)i;
    if (m->arch == MR_ARCH_UNKNOWN)
        return mr_error_set(MR_EUNSUPPORTED,
                            "config.json: architecture %s is not known; known architectures: MiniMaxM2ForCausalLM, "
                            "DeepseekV3ForCausalLM, MixtralForCausalLM, Qwen3MoeForCausalLM",
                            a);
    const char *mt = NULL;
    TRY(get_str(&c, "model_type", &mt));
    snprintf(m->model_type, sizeof m->model_type, "%s", mt ? mt : "");

    route_fields rf = {NULL, "scoring_func", -1, "unknown", -1, -1, 1.0, false, -1};
    switch (m->arch) {
    case MR_ARCH_MINIMAX_M2: TRY(read_minimax_m2(&c, m, &rf)); break;
    case MR_ARCH_DEEPSEEK_V3: TRY(read_deepseek_v3(&c, m, &rf)); break;
    case MR_ARCH_MIXTRAL: TRY(read_mixtral(&c, m, &rf)); break;
    case MR_ARCH_QWEN3_MOE: TRY(read_qwen3_moe(&c, m, &rf)); break;
    default: return mr_error_set(MR_EUNSUPPORTED, "config.json: architecture %s has no reader", a);
    }
    /* routing fields: read generically; architecture-implied values stand unless the config states one */
    const char *sf = NULL;
    TRY(get_str(&c, "scoring_func", &sf));
    if (sf) {
        if (rf.scoring && strcmp(sf, rf.scoring) != 0)
            return mr_error_set(MR_ECONFIG, "config.json: scoring_func = %s contradicts %s (%s)", sf, m->architecture,
                                rf.scoring);
        rf.scoring = sf;
        rf.scoring_src = "scoring_func";
    }
    TRY(get_int(&c, "n_group", false, 0, 65536, &rf.n_group));
    TRY(get_int(&c, "topk_group", false, 0, 65536, &rf.topk_group));
    TRY(get_num(&c, "routed_scaling_factor", false, &rf.scale, &rf.has_scale));
    if (rf.has_scale && rf.scale <= 0)
        return mr_error_set(MR_ECONFIG, "config.json: routed_scaling_factor = %g must be positive", rf.scale);
    int norm;
    TRY(get_bool(&c, "norm_topk_prob", &norm));
    if (norm >= 0) rf.norm = norm;
    TRY(derive_routing("config.json", &rf, m->n_experts, m->top_k, m));
    TRY(parse_quant(&c, hfq, &m->quant));
    return MR_OK;
}

static mr_status parse_text(const char *text, const char *file, json_t **out) {
    json_error_t err;
    bool oom;
    *out = mr__json_loads(text, JSON_REJECT_DUPLICATES, &err, &oom);
    if (*out == NULL && oom) return MR_ENOMEM; /* the detail is set */
    if (*out == NULL)
        return mr_error_set(MR_ECONFIG, "%s: not valid JSON at line %d column %d: %s", file, err.line, err.column,
                            err.text);
    return MR_OK;
}

mr_status mr_model_desc_parse(const char *config_json, const char *hf_quant_json, mr_model_desc *out) {
    memset(out, 0, sizeof *out);
    if (config_json == NULL) return mr_error_set(MR_EINVAL, "mr_model_desc_parse: no config.json text");
    json_t *root = NULL, *hfq = NULL;
    mr_status s = parse_text(config_json, "config.json", &root);
    if (s == MR_OK && hf_quant_json) s = parse_text(hf_quant_json, "hf_quant_config.json", &hfq);
    if (s == MR_OK) s = parse_roots(root, hfq, out);
    json_decref(root);
    json_decref(hfq);
    if (s != MR_OK) {
        mr_model_desc_free(out);
        mr_model_desc tmp;
        memset(&tmp, 0, sizeof tmp);
        *out = tmp;
    }
    return s;
}

/* Reads a small text file (config files: at most 64 MB). NULL + MR_ENOTFOUND if absent. */
mr_status mr__config_read_text(const char *path, char **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        if (errno == ENOENT) return mr_error_set(MR_ENOTFOUND, "%s: no such file", path);
        return mr_error_set(MR_EIO, "%s: cannot open: %s", path, strerror(errno));
    }
    mr_status s = MR_OK;
    char *buf = NULL;
    long n = 0;
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        s = mr_error_set(MR_EIO, "%s: cannot read: %s", path, strerror(errno));
        goto out;
    }
    if (n > (64L << 20)) {
        s = mr_error_set(MR_ECONFIG, "%s: %ld bytes is too large for a config file", path, n);
        goto out;
    }
    buf = mr_malloc((size_t)n + 1);
    if (buf == NULL) {
        s = MR_ENOMEM;
        goto out;
    }
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        s = mr_error_set(MR_EIO, "%s: short read", path);
        goto out;
    }
    buf[n] = 0;
    *out = buf;
    buf = NULL;
out:
    mr_free(buf);
    fclose(f);
    return s;
}

mr_status mr_model_desc_load(const char *dir, mr_model_desc *out) {
    memset(out, 0, sizeof *out);
    if (dir == NULL || *dir == 0) return mr_error_set(MR_EINVAL, "no model folder given (--model DIR)");
    char path[1024];
    char *cfg = NULL, *hfq = NULL, *gen = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    mr_status s = mr__config_read_text(path, &cfg);
    if (s == MR_ENOTFOUND) s = mr_error_set(MR_EIO, "%s: the model folder has no config.json", dir);
    if (s != MR_OK) goto out;
    snprintf(path, sizeof path, "%s/hf_quant_config.json", dir);
    s = mr__config_read_text(path, &hfq);
    if (s == MR_ENOTFOUND) {
        mr_error_clear();
        s = MR_OK;
    }
    if (s != MR_OK) goto out;
    s = mr_model_desc_parse(cfg, hfq, out);
    if (s == MR_OK) { /* generation_config.json (optional): more EOS ids */
        snprintf(path, sizeof path, "%s/generation_config.json", dir);
        s = mr__config_read_text(path, &gen);
        if (s == MR_ENOTFOUND) {
            mr_error_clear();
            s = MR_OK;
        } else if (s == MR_OK) {
            jctx g = {"generation_config.json", NULL};
            s = parse_text(gen, g.file, &g.root);
            if (s == MR_OK) s = read_eos(&g, out);
            json_decref(g.root);
        }
        if (s != MR_OK) mr_model_desc_free(out);
    }
    if (s != MR_OK) {
        /* prefix the folder so that the message says which model */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", mr_error_last());
        s = mr_error_set(s, "%s/%s", dir, msg);
        goto out;
    }
    snprintf(out->dir, sizeof out->dir, "%s", dir);
out:
    mr_free(cfg);
    mr_free(hfq);
    mr_free(gen);
    return s;
}
