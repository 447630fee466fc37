/* config_internal.h — private to src/config: the resolution object, the
 * declaration log, the pass context, the model-override registry and
 * helpers shared by resolve.c, overrides.c and explain.c. */
#ifndef MR_CONFIG_INTERNAL_H
#define MR_CONFIG_INTERNAL_H

#include "moerun/config.h"

/* Option values the passes work with (typed). */
typedef struct {
    mr_quant_kind quant;
    mr_format weight_format;
    mr_act_mode act_mode;
    mr_format router_dtype;   /* MR_FMT_COUNT while undecided */
    mr_device device;
    uint32_t cpu_detected;    /* the (possibly simulated) CPU's features */
    uint32_t cpu_flags;       /* limited to kernel_isa */
    const char *cpu_origin;   /* "detected" / "simulated" */
    mr_kernel_isa isa;
    bool batch_invariant;     /* enable_deterministic_inference=on (the platform pass) */
    int threads;
    const mr_moe_runner *runner; /* NULL while undecided */
    const mr_moe_runner *preferred; /* model_overrides' preference, if any */
    mr_a2a a2a;               /* prospective until the a2a pass */
    int ep_size;
    int ep_rank;              /* this process's peer index (0 without a transport) */
    mr_moe_layout layout;
    mr_format kv_dtype;       /* the engine pass */
    mr_format dense_act_dtype; /* the engine pass: F32 or BF16 */
    int64_t kv_token_bytes, kv_blocks, max_batch_tokens, context_length;
    int max_running;
} mr__work;

struct mr_resolution {
    mr_status status;
    char error[2048];
    /* the user's input (copied: never mutated) */
    char *user_value[MR_OPT_COUNT];
    mr_opt_source user_source[MR_OPT_COUNT];
    /* the model */
    mr_model_desc model;
    bool have_model;
    int n_tensors_checked, n_files_checked;
    /* declaration log */
    mr_decl *decls;
    int n_decls, cap_decls;
    /* typed working values */
    mr__work w;
    /* the published, frozen block (mmap'd, read-only) */
    void *block;
    size_t block_size;
    const mr_exec *exec;
};

/* Appends a declaration (value/reason are copied; source/field must be
 * static strings). Returns MR_ENOMEM on failure. */
mr_status mr__decl(mr_resolution *r, mr_decl_kind k, const char *source, const char *field, const char *value,
                   const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;

/* The user's value is explicit and not "auto" (nor 0 for ep_size): a pass
 * must not touch it. */
bool mr__user_fixed(const mr_resolution *r, mr_opt_id id);
const char *mr__user_value(const mr_resolution *r, mr_opt_id id);

/* The MoE problem for the current working values with runner-independent
 * fields filled. */
void mr__problem(const mr_resolution *r, mr_moe_problem *p);

/* Model overrides: a registry keyed by architecture, in registration order. */
typedef mr_status (*mr__override_fn)(mr_resolution *r);
typedef struct {
    const char *architecture;
    const char *what; /* one line: what the entry does */
    mr__override_fn fn;
} mr__override;
int mr__override_count(void);
const mr__override *mr__override_at(int i);

/* Reads a small text file; MR_ENOTFOUND if absent. *out is mr_malloc'd. */
mr_status mr__config_read_text(const char *path, char **out);

/* "avx2 fma f16c" */
void mr__cpu_flags_str(uint32_t flags, char *buf, size_t n);

#endif
