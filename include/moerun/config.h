/* moerun/config.h — configuration: the options table and its parser, the
 * model description read from a Hugging Face config.json (+
 * hf_quant_config.json), the resolver (passes, declaration log) and the
 * frozen execution config `mr_exec` that the runtime reads.
 * Contract: shared/spec/resolution.md.
 *
 * Typical use (a CLI command):
 *     mr_options o;
 *     mr_options_init(&o);
 *     if (mr_options_parse(&o, &argc, argv, true) != MR_OK) -> exit 2
 *     ... argv now holds only the command's own flags ...
 *     mr_resolution *r = NULL;
 *     if (mr_resolve(&o, &r) != MR_OK) { mr_resolution_explain(r, stderr); exit 2 }
 *     const mr_exec *x = mr_resolution_exec(r);    (read-only, frozen)
 *     ...
 *     mr_resolution_free(r); mr_options_free(&o);
 */
#ifndef MOERUN_CONFIG_H
#define MOERUN_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "moerun/base.h"
#include "moerun/formats.h"
#include "moerun/moe.h"
#include "moerun/routing.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * Options: one table (src/config/options.c). Flags, environment variables,
 * --help and docs/options.md all come from it.
 * ====================================================================== */

typedef enum {
    MR_OPT_MODEL = 0,           /* path of the checkpoint folder */
    MR_OPT_MOE_RUNNER_BACKEND,  /* auto|reference|routed|fused */
    MR_OPT_MOE_A2A_BACKEND,     /* auto|none|mpi */
    MR_OPT_EP_SIZE,             /* 0 = auto, else >= 1 */
    MR_OPT_QUANTIZATION,        /* auto|bf16|fp8|modelopt_fp4 */
    MR_OPT_ACTIVATION_MODE,     /* auto|w16a32|w16a16|w8a8|w8a16|w4a4|w4a8|w4a16 */
    MR_OPT_ROUTER_DTYPE,        /* auto|fp32|bf16 */
    MR_OPT_KERNEL_ISA,          /* auto|generic|avx2|avx512 */
    MR_OPT_DEVICE,              /* auto|cpu|sm90|sm100|sm103|sm110|sm120 */
    MR_OPT_CPU_FEATURES,        /* auto (detected) or a simulated feature set: generic|avx2|avx512|list */
    MR_OPT_CPU_MASK,            /* features to hide (same syntax as MOERUN_CPU_MASK) */
    MR_OPT_THREADS,             /* 0 = all cores */
    MR_OPT_LOG,                 /* debug|info|warn|error|off */
    MR_OPT_KV_CACHE_DTYPE,      /* auto|bf16|fp32: element type of the paged KV cache */
    MR_OPT_KV_CACHE_MEMORY,     /* auto | bytes ("4GiB", "512M", "1000000") | fraction of free memory ("0.3") */
    MR_OPT_MAX_RUNNING_REQUESTS,/* requests in one batch (0 = auto) */
    MR_OPT_MAX_BATCH_TOKENS,    /* tokens in one engine step (0 = auto) */
    MR_OPT_CONTEXT_LENGTH,      /* prompt + output tokens of one request (0 = the model's max_position_embeddings) */
    MR_OPT_EP_TIMEOUT,          /* seconds an expert-parallel exchange may wait for the other ranks (0 = auto) */
    MR_OPT_STEP_THREADS,        /* adaptive|fixed: threads of an engine step (see mr_engine_opts.fixed_threads) */
    MR_OPT_DETERMINISTIC_INFERENCE, /* off|on: the batch-invariant kernels (mr_kernels_batch_invariant) */
    MR_OPT_DENSE_ACTIVATION_DTYPE,  /* auto|fp32|bf16: the input of the attention projections and the LM head */
    MR_OPT_COUNT
} mr_opt_id;

typedef enum { MR_OPT_ENUM = 0, MR_OPT_INT = 1, MR_OPT_STRING = 2 } mr_opt_type;

/* Where an option's current value came from (higher wins). */
typedef enum { MR_SRC_DEFAULT = 0, MR_SRC_ENV = 1, MR_SRC_FLAG = 2 } mr_opt_source;
const char *mr_opt_source_name(mr_opt_source s); /* "default", "env", "flag" */

typedef struct {
    mr_opt_id id;
    const char *name;                 /* "moe_runner_backend" */
    mr_opt_type type;
    const char *def;                  /* default, as text */
    const char *const *values;        /* ENUM: NULL-terminated allowed values; else NULL */
    int64_t min, max;                 /* INT: inclusive range */
    bool resolvable;                  /* a pass may set it when the user left it at auto */
    const char *help;                 /* one line */
    const char *env;                  /* "MOERUN_MOE_RUNNER_BACKEND" */
    const char *flag;                 /* "--moe-runner-backend" */
} mr_option_def;

int mr_option_count(void);
const mr_option_def *mr_option_at(int i);                 /* i == id */
/* By name ("moe_runner_backend"), flag ("--moe-runner-backend") or kebab
 * name ("moe-runner-backend"); NULL if unknown. */
const mr_option_def *mr_option_find(const char *key);
/* A memory amount as kv_cache_memory takes it: "auto" (both 0), bytes with an
 * optional unit ("4GiB", "4G" and "4g" are 4 x 2^30; "4GB" is 4 x 10^9; K, M,
 * G, T likewise), or a fraction in (0, 1] written with a '.' ("0.3"). */
mr_status mr_memory_size_parse(const char *s, uint64_t *bytes, double *fraction);
/* Checks a value against the table; MR_EINVAL listing the allowed values. */
mr_status mr_option_check(const mr_option_def *d, const char *value);

/* A set of option values. Values are text (validated against the table);
 * the typed meaning is decided by the resolver. */
typedef struct {
    char *value[MR_OPT_COUNT];        /* owned copies; never NULL after init */
    mr_opt_source source[MR_OPT_COUNT];
} mr_options;

/* All defaults. Never fails except on out-of-memory. */
mr_status mr_options_init(mr_options *o);
void mr_options_free(mr_options *o);
/* Sets one option by name, checking the value; src records its origin. */
mr_status mr_options_set(mr_options *o, const char *name, const char *value, mr_opt_source src);
/* Applies MOERUN_<NAME> environment variables (only over defaults). */
mr_status mr_options_load_env(mr_options *o);
/* Environment, then flags: `--flag value` or `--flag=value`. The table's
 * flags are consumed from argv; other arguments are kept in order
 * (argv[0] stays) and *argc is updated. If allow_other is false, a leftover
 * argument starting with "--" is an error listing the valid flags. */
mr_status mr_options_parse(mr_options *o, int *argc, char **argv, bool allow_other);
const char *mr_options_get(const mr_options *o, mr_opt_id id);
int64_t mr_options_get_int(const mr_options *o, mr_opt_id id); /* INT options */
bool mr_options_is_explicit(const mr_options *o, mr_opt_id id); /* set by flag or env */
/* `--help` text for the options (one block per option). */
void mr_options_print_help(FILE *f);
/* docs/options.md, generated from the table. */
void mr_options_print_markdown(FILE *f);

/* ======================================================================
 * Model description (from config.json and hf_quant_config.json).
 * ====================================================================== */

typedef enum {
    MR_ARCH_UNKNOWN = 0,
    MR_ARCH_MINIMAX_M2 = 1,   /* MiniMaxM2ForCausalLM */
    MR_ARCH_DEEPSEEK_V3 = 2,  /* DeepseekV3ForCausalLM */
    MR_ARCH_MIXTRAL = 3,      /* MixtralForCausalLM */
    MR_ARCH_QWEN3_MOE = 4,    /* Qwen3MoeForCausalLM */
    MR_ARCH_COUNT
} mr_arch;
const char *mr_arch_name(mr_arch a); /* the HF architecture string */

typedef enum {
    MR_QUANT_NONE = 0,        /* bf16 (or f16/f32) weights: option value "bf16" */
    MR_QUANT_FP8_BLOCK = 1,   /* native FP8, 128x128 block scales: "fp8" */
    MR_QUANT_NVFP4 = 2,       /* ModelOpt NVFP4: "modelopt_fp4" */
    MR_QUANT_COUNT
} mr_quant_kind;
const char *mr_quant_name(mr_quant_kind q);              /* option value */
mr_format mr_quant_weight_format(mr_quant_kind q);       /* BF16, FP8_BLOCK, NVFP4 */

typedef enum {
    MR_QUANT_FORM_NONE = 0,
    MR_QUANT_FORM_FP8 = 1,            /* quantization_config.quant_method = fp8 */
    MR_QUANT_FORM_MODELOPT_FLAT = 2,  /* quantization_config.quant_algo at top level */
    MR_QUANT_FORM_MODELOPT_HF = 3,    /* hf_quant_config.json quantization.quant_algo */
    MR_QUANT_FORM_MODELOPT_GROUPS = 4 /* quantization_config.config_groups, quant_method modelopt */
} mr_quant_form;

typedef struct {
    mr_quant_kind kind;
    mr_quant_form form;
    int block_n, block_k;     /* FP8: weight_block_size (128, 128) */
    int group_size;           /* NVFP4: 16 */
    char where[160];          /* what declared it, e.g. "config.json quantization_config (quant_method=fp8)" */
    char **exclude;           /* exclusion patterns (modules_to_not_convert / ignore / exclude_modules) */
    int n_exclude;
} mr_quant_desc;

/* Is a module or tensor name excluded from quantization? A pattern matches
 * when it equals, or (with '*', fnmatch-style; '*' also crosses dots)
 * matches, some run of whole dotted components of the name: "gate" matches
 * "model.layers.0.block_sparse_moe.gate.weight" but not
 * "model.layers.0.mlp.gate_proj.weight"; "model.layers.*.self_attn*"
 * matches "model.layers.3.self_attn.q_proj.weight". */
bool mr_quant_is_excluded(const mr_quant_desc *q, const char *name);

typedef enum { MR_QK_NORM_NONE = 0, MR_QK_NORM_PER_LAYER = 1, MR_QK_NORM_PER_HEAD = 2 } mr_qk_norm;

#define MR_MAX_EOS 8

typedef struct {
    mr_arch arch;
    char architecture[64];      /* as in config.json */
    char model_type[64];
    /* dimensions */
    int64_t hidden;             /* H */
    int64_t n_layers;           /* decoder layers (MTP layers excluded) */
    int64_t n_heads, n_kv_heads, head_dim;
    int64_t rotary_dim;         /* dims of each head that RoPE rotates */
    int64_t vocab;
    int64_t inter;              /* dense MLP intermediate size (0 if none) */
    int64_t moe_inter;          /* per-expert intermediate size I */
    int64_t shared_inter;       /* shared expert intermediate size (0 = none) */
    int n_experts, top_k;
    int n_dense_layers;         /* leading layers with a dense MLP (DeepSeek first_k_dense_replace) */
    int n_mtp;                  /* MTP modules present in the checkpoint (skipped) */
    int64_t max_pos;
    double rope_theta, rms_eps;
    mr_qk_norm qk_norm;
    bool tie_embeddings;
    int32_t eos_ids[MR_MAX_EOS];
    int n_eos;
    /* routing, derived from the config fields (never a default) */
    mr_routing_id routing;
    bool routing_bias;          /* e_score_correction_bias present */
    int n_group, topk_group;    /* 0/0 when not grouped */
    float routed_scale;         /* 1.0 when unused */
    char routing_why[256];      /* "scoring_func=sigmoid, use_routing_bias=true, no groups" */
    /* quantization */
    mr_quant_desc quant;
    char dir[512];              /* checkpoint folder ("" when parsed from text) */
} mr_model_desc;

/* Reads DIR/config.json and DIR/hf_quant_config.json (when present).
 * Clear errors (MR_ECONFIG / MR_EIO) name the file and the field. */
mr_status mr_model_desc_load(const char *dir, mr_model_desc *out);
/* Same from text; hf_quant_json may be NULL. */
mr_status mr_model_desc_parse(const char *config_json, const char *hf_quant_json, mr_model_desc *out);
void mr_model_desc_free(mr_model_desc *d);

/* ======================================================================
 * Resolution.
 * ====================================================================== */

/* The kernel ISA levels (mr_kernel_isa, its names and features) are the
 * kernels' own table: moerun/kernels.h. */

/* The world an MPI launcher (mpirun, srun, ...) started this process in,
 * read from its environment (OMPI_COMM_WORLD_SIZE/RANK, PMI_*, PMIX_*): the
 * number of ranks (1 when not launched), *rank (0), and the variable read
 * (*from, NULL). The resolver's ep_size and placement come from here, before
 * MPI is started. */
int mr_launcher_world(int *rank, const char **from);
/* Ranks the launcher started on this machine (1 when not launched): they
 * share its cores (threads = 0 gives each its part). */
int mr_launcher_local(void);

/* The (a2a transport, runner) pair registry (src/config/a2a_pairs.c): none
 * with every runner; mpi with routed and reference. On refusal writes one
 * sentence. */
bool mr_a2a_pair_supported(mr_a2a a, const mr_moe_runner *r, char *why, size_t n);

/* The frozen execution config. After publish it lives in read-only pages:
 * a write is a programming error and faults. Everything it points to is
 * inside the same frozen block. */
typedef struct {
    uint32_t magic;                 /* MR_EXEC_MAGIC */
    const mr_model_desc *model;     /* frozen copy */
    mr_quant_kind quant;
    mr_format weight_format;        /* BF16, FP8_BLOCK or NVFP4 */
    mr_act_mode act_mode;           /* never AUTO */
    mr_format router_dtype;         /* F32 or BF16 */
    mr_device device;
    uint32_t cpu_flags;             /* features kernels may use (limited to kernel_isa) */
    mr_kernel_isa kernel_isa;
    int threads;                    /* >= 1 */
    const mr_moe_runner *runner;    /* the chosen runner */
    mr_a2a a2a;
    int ep_size;                    /* >= 1 */
    mr_moe_problem problem;         /* what the runner's predicate accepted */
    mr_moe_layout layout;           /* what runner->required_layout said */
    /* the engine: KV cache and scheduler limits */
    mr_format kv_dtype;             /* BF16 or F32 */
    int64_t kv_token_bytes;         /* K + V of one token, every layer */
    int64_t kv_blocks;              /* pool size in blocks of 16 tokens (>= 1) */
    int64_t max_batch_tokens;       /* tokens per step (>= max_running_requests) */
    int max_running_requests;       /* >= 1 */
    int64_t context_length;         /* >= 1 */
    int ep_timeout_s;               /* step deadline of the expert-parallel exchanges, 0 = automatic */
    bool step_threads_fixed;        /* step_threads=fixed: every engine step on all threads */
    bool batch_invariant;           /* deterministic_inference=on: mr_exec_apply selects the
                                       batch-invariant kernel table (mr_kernels_set_batch_invariant) */
    mr_format dense_act_dtype;      /* F32 or BF16: the model rounds the inputs of q/k/v_proj, o_proj
                                       and lm_head to bf16 first (dense_activation_dtype=bf16) */
    uint64_t checksum;              /* over everything above and the frozen model copy */
} mr_exec;
#define MR_EXEC_MAGIC 0x6D724578u

/* True if the frozen block still has the checksum computed at publish. */
bool mr_exec_verify(const mr_exec *x);
/* Can this build run it? (e.g. moe_a2a_backend=mpi resolves, but the MPI
 * transport is not built yet: MR_EUNSUPPORTED with a clear message.) */
mr_status mr_exec_check_runnable(const mr_exec *x);
/* Checks runnable, then makes the process follow x: kernels see only
 * x->cpu_flags (the resolved kernel_isa and masks take effect), OpenMP
 * uses x->threads and the expert-parallel group x->ep_timeout_s. Call once,
 * before loading weights. */
mr_status mr_exec_apply(const mr_exec *x);

typedef enum {
    MR_DECL_SET = 0,      /* a pass decided a value */
    MR_DECL_REFUSE = 1,   /* a candidate was refused (value = the candidate) */
    MR_DECL_NOTE = 2,     /* information (e.g. what was checked) */
    MR_DECL_ERROR = 3     /* resolution failed here */
} mr_decl_kind;
const char *mr_decl_kind_name(mr_decl_kind k); /* "set", "refuse", "note", "error" */

typedef struct {
    mr_decl_kind kind;
    const char *source;   /* pass: "checkpoint", "platform", "model_overrides", "moe_runner",
                             "a2a", "layout", "validate", "publish" */
    const char *field;    /* option name (or "layout", "routing", ...) */
    const char *value;
    const char *reason;
} mr_decl;

typedef struct mr_resolution mr_resolution;

/* Resolves o (o->value[MR_OPT_MODEL] names the checkpoint folder). Always
 * stores a resolution in *out (even on failure, so that the log can be
 * explained) unless out-of-memory; free it with mr_resolution_free. On
 * failure returns MR_ERESOLVE / MR_ECONFIG / MR_EIO with the detail set.
 * Reads config.json, hf_quant_config.json and safetensors headers only. */
mr_status mr_resolve(const mr_options *o, mr_resolution **out);
/* Same with an already-loaded model description (o's model is ignored). */
mr_status mr_resolve_model(const mr_options *o, const mr_model_desc *m, mr_resolution **out);
void mr_resolution_free(mr_resolution *r);

/* The frozen config, or NULL if resolution failed. */
const mr_exec *mr_resolution_exec(const mr_resolution *r);
mr_status mr_resolution_status(const mr_resolution *r);
const char *mr_resolution_error(const mr_resolution *r); /* "" if ok */
int mr_resolution_decl_count(const mr_resolution *r);
const mr_decl *mr_resolution_decl_at(const mr_resolution *r, int i);
/* The resolved value of an option as text: last declaration, else the
 * user's explicit value, else the default. */
const char *mr_resolution_value(const mr_resolution *r, mr_opt_id id);
mr_opt_source mr_resolution_user_source(const mr_resolution *r, mr_opt_id id);

/* Human-readable story (what `moerun resolve --explain` prints). */
void mr_resolution_explain(const mr_resolution *r, FILE *f);
/* Plain table: every option, its final value and who set it. */
void mr_resolution_print(const mr_resolution *r, FILE *f);
/* JSON (schema docs/resolve-json.md); returns a mr_malloc'd string. */
char *mr_resolution_json(const mr_resolution *r);
/* One line for other commands' startup:
 * "resolved: MiniMaxM2ForCausalLM modelopt_fp4 w4a4 runner=routed (fused refused: ...)". */
void mr_resolution_summary(const mr_resolution *r, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
