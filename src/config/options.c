/* options.c — THE options table, and everything generated from it: the
 * generic parser (flag > environment > default), value checks, --help text
 * and docs/options.md. Adding an option is one row here plus its use in the
 * resolver; the CLI, environment and docs follow. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "moerun/config.h"

/* moe_runner_backend: "auto", then the runners built into the registry
 * (moe/), by stable id; filled once (the registry is the only list of runners). */
static const char *v_runner[MR_RUNNER_COUNT + 2] = {"auto", NULL};
static pthread_once_t runner_once = PTHREAD_ONCE_INIT;
static void runner_values_fill(void) {
    int n = 1;
    for (int id = 0; id < MR_RUNNER_COUNT; id++)
        if (mr_moe_runner_get((mr_moe_runner_id)id)) v_runner[n++] = mr_moe_runner_get((mr_moe_runner_id)id)->name;
    v_runner[n] = NULL;
}
static const char *const v_a2a[] = {"auto", "none", "mpi", NULL};
static const char *const v_quant[] = {"auto", "bf16", "fp8", "modelopt_fp4", NULL};
static const char *const v_act[] = {"auto", "w16a32", "w16a16", "w8a8", "w8a16", "w4a4", "w4a8", "w4a16", NULL};
static const char *const v_router[] = {"auto", "fp32", "bf16", NULL};
static const char *const v_isa[] = {"auto", "generic", "avx2", "avx512", NULL};
static const char *const v_device[] = {"auto", "cpu", "sm90", "sm100", "sm103", "sm110", "sm120", NULL};
static const char *const v_log[] = {"debug", "info", "warn", "error", "off", NULL};
static const char *const v_kv_dtype[] = {"auto", "bf16", "fp32", "fp8_e4m3", "fp8_e5m2", "fp8", NULL};
static const char *const v_step_threads[] = {"adaptive", "fixed", NULL};
/* an on/off option: its flag alone means on (sglang's --enable-deterministic-inference takes no
 * value); --flag=off, --flag off, and the environment give the value */
static const char *const v_onoff[] = {"off", "on", NULL};
static const char *const v_dense_dtype[] = {"auto", "fp32", "bf16", NULL};

/* Rows are indexed by mr_opt_id (checked by mr_option_at's assertion). */
static const mr_option_def table[MR_OPT_COUNT] = {
    [MR_OPT_MODEL] = {MR_OPT_MODEL, "model", MR_OPT_STRING, "", NULL, 0, 0, false,
                      "checkpoint folder (config.json, hf_quant_config.json, *.safetensors)", "MOERUN_MODEL",
                      "--model"},
    [MR_OPT_MOE_RUNNER_BACKEND] = {MR_OPT_MOE_RUNNER_BACKEND, "moe_runner_backend", MR_OPT_ENUM, "auto", v_runner, 0,
                                   0, true, "MoE runner: auto picks the first runner whose capability check accepts",
                                   "MOERUN_MOE_RUNNER_BACKEND", "--moe-runner-backend"},
    [MR_OPT_MOE_A2A_BACKEND] = {MR_OPT_MOE_A2A_BACKEND, "moe_a2a_backend", MR_OPT_ENUM, "auto", v_a2a, 0, 0, true,
                                "expert-parallel all-to-all transport (auto = none in one process)",
                                "MOERUN_MOE_A2A_BACKEND", "--moe-a2a-backend"},
    [MR_OPT_EP_SIZE] = {MR_OPT_EP_SIZE, "ep_size", MR_OPT_INT, "0", NULL, 0, 65536, true,
                        "expert-parallel ranks (0 = auto: 1, or the MPI world size under mpi)", "MOERUN_EP_SIZE",
                        "--ep-size"},
    [MR_OPT_QUANTIZATION] = {MR_OPT_QUANTIZATION, "quantization", MR_OPT_ENUM, "auto", v_quant, 0, 0, true,
                             "weight quantization (auto reads the checkpoint; a contradicting value is an error)",
                             "MOERUN_QUANTIZATION", "--quantization"},
    [MR_OPT_ACTIVATION_MODE] = {MR_OPT_ACTIVATION_MODE, "activation_mode", MR_OPT_ENUM, "auto", v_act, 0, 0, true,
                                "expert activation format (auto = the GPU-faithful mode of the weight format)",
                                "MOERUN_ACTIVATION_MODE", "--activation-mode"},
    [MR_OPT_ROUTER_DTYPE] = {MR_OPT_ROUTER_DTYPE, "router_dtype", MR_OPT_ENUM, "auto", v_router, 0, 0, true,
                             "dtype of the router gate GEMM and its logits", "MOERUN_ROUTER_DTYPE",
                             "--router-dtype"},
    [MR_OPT_KERNEL_ISA] = {MR_OPT_KERNEL_ISA, "kernel_isa", MR_OPT_ENUM, "auto", v_isa, 0, 0, true,
                           "kernel instruction set (auto = the best the CPU has; above it is an error)",
                           "MOERUN_KERNEL_ISA", "--kernel-isa"},
    [MR_OPT_DEVICE] = {MR_OPT_DEVICE, "device", MR_OPT_ENUM, "auto", v_device, 0, 0, true,
                       "device to plan for (GPU names are placeholders until GPU runners exist)", "MOERUN_DEVICE",
                       "--device"},
    [MR_OPT_CPU_FEATURES] = {MR_OPT_CPU_FEATURES, "cpu_features", MR_OPT_STRING, "auto", NULL, 0, 0, false,
                             "simulate a CPU: auto (detected), generic, avx2, avx512, or a comma list of features",
                             "MOERUN_CPU_FEATURES", "--cpu-features"},
    [MR_OPT_CPU_MASK] = {MR_OPT_CPU_MASK, "cpu_mask", MR_OPT_STRING, "none", NULL, 0, 0, false,
                         "CPU features to hide, e.g. avx512 (groups: avx512, avx2, amx, all, none; or features, "
                         "e.g. avx-vnni, avx512bf16)",
                         "MOERUN_CPU_MASK", "--cpu-mask"},
    [MR_OPT_THREADS] = {MR_OPT_THREADS, "threads", MR_OPT_INT, "0", NULL, 0, 4096, false,
                        "worker threads (0 = all cores)", "MOERUN_THREADS", "--threads"},
    [MR_OPT_LOG] = {MR_OPT_LOG, "log", MR_OPT_ENUM, "warn", v_log, 0, 0, false, "log level on stderr", "MOERUN_LOG",
                    "--log"},
    [MR_OPT_KV_CACHE_DTYPE] = {MR_OPT_KV_CACHE_DTYPE, "kv_cache_dtype", MR_OPT_ENUM, "auto", v_kv_dtype, 0, 0, true,
                               "element type of the paged KV cache (auto = bf16; fp32 for exactness; fp8_e4m3 (fp8) or fp8_e5m2: half of bf16's memory, scale 1, saturating)",
                               "MOERUN_KV_CACHE_DTYPE", "--kv-cache-dtype"},
    [MR_OPT_KV_CACHE_MEMORY] = {MR_OPT_KV_CACHE_MEMORY, "kv_cache_memory", MR_OPT_STRING, "auto", NULL, 0, 0, true,
                                "KV cache pool: bytes (4GiB, 512M, 1000000), a fraction of the memory free after "
                                "the weights (0.3), or auto",
                                "MOERUN_KV_CACHE_MEMORY", "--kv-cache-memory"},
    [MR_OPT_MAX_RUNNING_REQUESTS] = {MR_OPT_MAX_RUNNING_REQUESTS, "max_running_requests", MR_OPT_INT, "0", NULL, 0,
                                     65536, true, "requests batched together in one engine step (0 = auto: 256)",
                                     "MOERUN_MAX_RUNNING_REQUESTS", "--max-running-requests"},
    [MR_OPT_MAX_BATCH_TOKENS] = {MR_OPT_MAX_BATCH_TOKENS, "max_batch_tokens", MR_OPT_INT, "0", NULL, 0, 1048576,
                                 true,
                                 "tokens in one engine step, prefill chunks and decodes together (0 = auto: 512, "
                                 "at least max_running_requests)",
                                 "MOERUN_MAX_BATCH_TOKENS", "--max-batch-tokens"},
    [MR_OPT_CONTEXT_LENGTH] = {MR_OPT_CONTEXT_LENGTH, "context_length", MR_OPT_INT, "0", NULL, 0, 16777216, true,
                               "prompt + output tokens of one request (0 = the model's max_position_embeddings)",
                               "MOERUN_CONTEXT_LENGTH", "--context-length"},
    [MR_OPT_EP_TIMEOUT] = {MR_OPT_EP_TIMEOUT, "ep_timeout", MR_OPT_INT, "0", NULL, 0, 86400, true,
                           "seconds an expert-parallel exchange waits for the other ranks before they count as failed "
                           "(0 = auto: 5 s beyond twice the slowest step seen)",
                           "MOERUN_EP_TIMEOUT", "--ep-timeout"},
    [MR_OPT_STEP_THREADS] = {MR_OPT_STEP_THREADS, "step_threads", MR_OPT_ENUM, "adaptive", v_step_threads, 0, 0,
                             false,
                             "threads of an engine step: adaptive runs a step of few tokens on one thread while that "
                             "measures faster (beside other work a parallel region waits for a preempted thread); "
                             "fixed: always all of threads",
                             "MOERUN_STEP_THREADS", "--step-threads"},
    [MR_OPT_DETERMINISTIC_INFERENCE] = {MR_OPT_DETERMINISTIC_INFERENCE, "enable_deterministic_inference", MR_OPT_ENUM, "off",
                                        v_onoff, 0, 0, false,
                                        "batch-invariant kernels: a request's logits and sampled tokens do not depend "
                                        "on the requests beside it, its prompt's chunking or a prefix-cache hit, the "
                                        "same bits every run (sglang's flag; the flag alone means on; costs speed on "
                                        "the FMA kernels, none on AMX: docs/serve.md \"Determinism\")",
                                        "MOERUN_ENABLE_DETERMINISTIC_INFERENCE", "--enable-deterministic-inference"},
    [MR_OPT_DENSE_ACTIVATION_DTYPE] = {MR_OPT_DENSE_ACTIVATION_DTYPE, "dense_activation_dtype", MR_OPT_ENUM, "auto",
                                       v_dense_dtype, 0, 0, true,
                                       "input of the attention projections (q/k/v/o) and the LM head (auto = fp32: "
                                       "the activations exactly; bf16: rounded to bf16 first, as an engine running "
                                       "these layers in bf16 sees them; on AMX tiles a third of the tile operations, with "
                                       "AVX512-BF16 but no AVX512-FP16 (Zen 4) vdpbf16ps pair dots)",
                                       "MOERUN_DENSE_ACTIVATION_DTYPE", "--dense-activation-dtype"},
};

const char *mr_opt_source_name(mr_opt_source s) {
    switch (s) {
    case MR_SRC_DEFAULT: return "default";
    case MR_SRC_ENV: return "env";
    case MR_SRC_FLAG: return "flag";
    }
    return "?";
}

int mr_option_count(void) { return MR_OPT_COUNT; }

const mr_option_def *mr_option_at(int i) {
    if (i < 0 || i >= MR_OPT_COUNT) return NULL;
    MR_ASSERT(table[i].id == (mr_opt_id)i && table[i].name != NULL);
    return &table[i];
}

const mr_option_def *mr_option_find(const char *key) {
    if (key == NULL) return NULL;
    for (int i = 0; i < MR_OPT_COUNT; i++) {
        const mr_option_def *d = &table[i];
        if (!strcmp(key, d->name) || !strcmp(key, d->flag) || !strcmp(key, d->flag + 2)) return d;
    }
    return NULL;
}

static void list_values(const mr_option_def *d, char *buf, size_t n) {
    pthread_once(&runner_once, runner_values_fill);
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; d->values && d->values[i]; i++) {
        int w = snprintf(buf + used, n - used, "%s%s", i ? ", " : "", d->values[i]);
        if (w < 0 || (size_t)w >= n - used) break;
        used += (size_t)w;
    }
}

/* The value check; the detail does not name the option (callers prefix the
 * name, the flag or the environment variable, whichever the user wrote). */
static mr_status check_value(const mr_option_def *d, const char *value) {
    pthread_once(&runner_once, runner_values_fill);
    switch (d->type) {
    case MR_OPT_ENUM:
        for (int i = 0; d->values[i]; i++)
            if (!strcmp(value, d->values[i])) return MR_OK;
        {
            char vals[256];
            list_values(d, vals, sizeof vals);
            return mr_error_set(MR_EINVAL, "unknown value '%s'; valid values: %s", value, vals);
        }
    case MR_OPT_INT: {
        char *end = NULL;
        if (*value == 0) return mr_error_set(MR_EINVAL, "expected an integer, got an empty value");
        errno = 0;
        long long v = strtoll(value, &end, 10);
        if (*end != 0 || errno == ERANGE)
            return mr_error_set(MR_EINVAL, "expected an integer in %lld..%lld, got '%s'", (long long)d->min,
                                (long long)d->max, value);
        if (v < d->min || v > d->max)
            return mr_error_set(MR_EINVAL, "%lld is out of range %lld..%lld", v, (long long)d->min,
                                (long long)d->max);
        return MR_OK;
    }
    case MR_OPT_STRING: {
        if (d->id == MR_OPT_CPU_MASK) {
            uint32_t m;
            mr_status s = mr_cpu_parse_mask(value, &m);
            if (s != MR_OK) return s;
        }
        if (d->id == MR_OPT_KV_CACHE_MEMORY) {
            uint64_t b;
            double f;
            mr_status s = mr_memory_size_parse(value, &b, &f);
            if (s != MR_OK) return s;
        }
        return MR_OK;
    }
    }
    return mr_error_set(MR_EINVAL, "bad option type");
}

mr_status mr_memory_size_parse(const char *s, uint64_t *bytes, double *fraction) {
    *bytes = 0;
    *fraction = 0.0;
    if (!s || !*s) return mr_error_set(MR_EINVAL, "empty memory amount (give bytes such as 4GiB, a fraction such as 0.3, or auto)");
    if (!strcmp(s, "auto")) return MR_OK;
    if (strchr(s, '.')) {
        char *end = NULL;
        errno = 0;
        double f = strtod(s, &end);
        if (*end || errno || !(f > 0.0 && f <= 1.0))
            return mr_error_set(MR_EINVAL, "'%s' is not a fraction in (0, 1] (nor bytes such as 4GiB)", s);
        *fraction = f;
        return MR_OK;
    }
    if (*s < '0' || *s > '9') return mr_error_set(MR_EINVAL, "'%s' is not a memory amount (e.g. 4GiB, 512M, 0.3, auto)", s);
    char *end = NULL;
    errno = 0;
    unsigned long long n = strtoull(s, &end, 10);
    if (errno == ERANGE) return mr_error_set(MR_EINVAL, "'%s' is too large", s);
    static const struct { const char *u; uint64_t mul; } units[] = {
        {"", 1}, {"B", 1}, {"K", 1ull << 10}, {"KiB", 1ull << 10}, {"KB", 1000ull}, {"M", 1ull << 20},
        {"MiB", 1ull << 20}, {"MB", 1000000ull}, {"G", 1ull << 30}, {"GiB", 1ull << 30}, {"GB", 1000000000ull},
        {"T", 1ull << 40}, {"TiB", 1ull << 40}, {"TB", 1000000000000ull}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(end, units[i].u) != 0) continue;
        if (!strcmp(end, "b") || !strcmp(end, "kb") || !strcmp(end, "mb") || !strcmp(end, "gb") || !strcmp(end, "tb"))
            continue; /* lower-case b would read as bits: ask for B */
        uint64_t v;
        if (!mr_u64_mul((uint64_t)n, units[i].mul, &v)) return mr_error_set(MR_EINVAL, "'%s' is too large", s);
        if (v == 0) return mr_error_set(MR_EINVAL, "'%s' is zero bytes", s);
        *bytes = v;
        return MR_OK;
    }
    return mr_error_set(MR_EINVAL, "'%s': unknown unit '%s' (B, K/KiB, M/MiB, G/GiB, T/TiB, or KB/MB/GB/TB for powers of 1000)",
                        s, end);
}

mr_status mr_option_check(const mr_option_def *d, const char *value) {
    if (d == NULL || value == NULL) return mr_error_set(MR_EINVAL, "option check: NULL argument");
    mr_status s = check_value(d, value);
    if (s != MR_OK) return mr_error_set(s, "%s: %s", d->name, mr_error_last());
    return MR_OK;
}

mr_status mr_options_init(mr_options *o) {
    memset(o, 0, sizeof *o);
    for (int i = 0; i < MR_OPT_COUNT; i++) {
        o->value[i] = mr_strdup(table[i].def);
        if (o->value[i] == NULL) {
            mr_options_free(o);
            return MR_ENOMEM;
        }
        o->source[i] = MR_SRC_DEFAULT;
    }
    return MR_OK;
}

void mr_options_free(mr_options *o) {
    if (o == NULL) return;
    for (int i = 0; i < MR_OPT_COUNT; i++) {
        mr_free(o->value[i]);
        o->value[i] = NULL;
    }
}

mr_status mr_options_set(mr_options *o, const char *name, const char *value, mr_opt_source src) {
    const mr_option_def *d = mr_option_find(name);
    if (d == NULL) {
        char flags[512];
        size_t used = 0;
        flags[0] = 0;
        for (int i = 0; i < MR_OPT_COUNT; i++) {
            int w = snprintf(flags + used, sizeof flags - used, "%s%s", i ? ", " : "", table[i].name);
            if (w < 0 || (size_t)w >= sizeof flags - used) break;
            used += (size_t)w;
        }
        return mr_error_set(MR_EINVAL, "unknown option '%s'; valid options: %s", name ? name : "(null)", flags);
    }
    mr_status s = mr_option_check(d, value);
    if (s != MR_OK) return s;
    char *copy = mr_strdup(value);
    if (copy == NULL) return MR_ENOMEM;
    mr_free(o->value[d->id]);
    o->value[d->id] = copy;
    o->source[d->id] = src;
    return MR_OK;
}

mr_status mr_options_load_env(mr_options *o) {
    for (int i = 0; i < MR_OPT_COUNT; i++) {
        if (o->source[i] != MR_SRC_DEFAULT) continue; /* a flag already set it */
        const char *e = getenv(table[i].env);
        if (e == NULL || *e == 0) continue;
        mr_status s = check_value(&table[i], e);
        if (s == MR_OK) s = mr_options_set(o, table[i].name, e, MR_SRC_ENV);
        if (s != MR_OK) return mr_error_set(s, "environment %s=%s: %s", table[i].env, e, mr_error_last());
    }
    return MR_OK;
}

static void all_flags(char *buf, size_t n) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < MR_OPT_COUNT; i++) {
        int w = snprintf(buf + used, n - used, "%s%s", i ? ", " : "", table[i].flag);
        if (w < 0 || (size_t)w >= n - used) break;
        used += (size_t)w;
    }
}

mr_status mr_options_parse(mr_options *o, int *argc, char **argv, bool allow_other) {
    int out = 1;
    int n = *argc;
    /* Flags first (so that they win), then the environment fills the rest. */
    for (int i = 1; i < n; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0 || a[2] == 0) {
            argv[out++] = argv[i];
            continue;
        }
        const char *eq = strchr(a, '=');
        char key[64];
        size_t klen = eq ? (size_t)(eq - a) : strlen(a);
        const mr_option_def *d = NULL;
        if (klen < sizeof key) {
            memcpy(key, a, klen);
            key[klen] = 0;
            for (int j = 0; j < MR_OPT_COUNT; j++)
                if (!strcmp(key, table[j].flag)) d = &table[j];
        }
        if (d == NULL) {
            if (!allow_other) {
                char flags[512];
                all_flags(flags, sizeof flags);
                return mr_error_set(MR_EINVAL, "unknown option '%s'; valid options: %s", a, flags);
            }
            argv[out++] = argv[i];
            continue;
        }
        const char *val;
        if (eq) {
            val = eq + 1;
        } else if (d->values == v_onoff) { /* alone: on; a following "on" or "off" is its value */
            val = i + 1 < n && (!strcmp(argv[i + 1], "on") || !strcmp(argv[i + 1], "off")) ? argv[++i] : "on";
        } else {
            if (i + 1 >= n) return mr_error_set(MR_EINVAL, "%s needs a value", d->flag);
            if (!strncmp(argv[i + 1], "--", 2))
                return mr_error_set(MR_EINVAL, "%s needs a value (found the flag '%s'; write %s=VALUE if the value "
                                    "really starts with --)", d->flag, argv[i + 1], d->flag);
            val = argv[++i];
        }
        mr_status s = check_value(d, val);
        if (s == MR_OK) s = mr_options_set(o, d->name, val, MR_SRC_FLAG);
        if (s != MR_OK) return mr_error_set(s, "%s: %s", d->flag, mr_error_last());
    }
    for (int i = out; i < n; i++) argv[i] = NULL;
    *argc = out;
    return mr_options_load_env(o);
}

const char *mr_options_get(const mr_options *o, mr_opt_id id) {
    if ((int)id < 0 || id >= MR_OPT_COUNT) return "";
    return o->value[id] ? o->value[id] : table[id].def;
}

int64_t mr_options_get_int(const mr_options *o, mr_opt_id id) {
    return strtoll(mr_options_get(o, id), NULL, 10);
}

bool mr_options_is_explicit(const mr_options *o, mr_opt_id id) {
    if ((int)id < 0 || id >= MR_OPT_COUNT) return false;
    return o->source[id] != MR_SRC_DEFAULT;
}

void mr_options_print_help(FILE *f) {
    for (int i = 0; i < MR_OPT_COUNT; i++) {
        const mr_option_def *d = &table[i];
        char vals[256];
        if (d->type == MR_OPT_ENUM)
            list_values(d, vals, sizeof vals);
        else if (d->type == MR_OPT_INT)
            snprintf(vals, sizeof vals, "integer %lld..%lld", (long long)d->min, (long long)d->max);
        else
            snprintf(vals, sizeof vals, "text");
        if (d->values == v_onoff) /* the flag alone, or =off */
            fprintf(f, "  %s [off|on]\n      %s\n      default: %s; env %s (off, on)\n", d->flag, d->help, d->def,
                    d->env);
        else
            fprintf(f, "  %s <%s>\n      %s\n      default: %s%s; env %s\n", d->flag, vals, d->help,
                    *d->def ? d->def : "(none)", d->resolvable ? " (resolvable)" : "", d->env);
        if (d->id == MR_OPT_MOE_RUNNER_BACKEND) /* the registry's own words for each runner */
            for (int id = 0; id < MR_RUNNER_COUNT; id++)
                if (mr_moe_runner_get((mr_moe_runner_id)id))
                    fprintf(f, "        %-10s %s\n", mr_moe_runner_get((mr_moe_runner_id)id)->name,
                            mr_moe_runner_get((mr_moe_runner_id)id)->help);
    }
}

void mr_options_print_markdown(FILE *f) {
    fprintf(f, "# moerun options\n\n");
    fprintf(f, "Generated from the options table in `src/config/options.c` by\n"
               "`moerun resolve --print-options-md`; a test checks that this file matches it.\n\n");
    fprintf(f, "Precedence: flag > environment > default. A value given by a flag or the\n"
               "environment is *explicit*: resolution never replaces it; if it cannot work,\n"
               "resolution fails (exit status 2) naming the alternatives. *Resolvable* options\n"
               "left at `auto` are decided by the resolver (`moerun resolve --explain` says why).\n\n");
    fprintf(f, "| option | flag | environment | type | default | values | resolvable | help |\n");
    fprintf(f, "| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (int i = 0; i < MR_OPT_COUNT; i++) {
        const mr_option_def *d = &table[i];
        char vals[256];
        const char *type = d->type == MR_OPT_ENUM ? "enum" : d->type == MR_OPT_INT ? "integer" : "text";
        if (d->type == MR_OPT_ENUM)
            list_values(d, vals, sizeof vals);
        else if (d->type == MR_OPT_INT)
            snprintf(vals, sizeof vals, "%lld..%lld", (long long)d->min, (long long)d->max);
        else
            snprintf(vals, sizeof vals, "-");
        fprintf(f, "| `%s` | `%s` | `%s` | %s | %s%s%s | %s | %s | %s |\n", d->name, d->flag, d->env, type,
                *d->def ? "`" : "", *d->def ? d->def : "(none)", *d->def ? "`" : "", vals,
                d->resolvable ? "yes" : "no", d->help);
    }
}
