/* test_config_resolve.c — resolution, pinning every item of
 * spec/resolution.md "What the tests must pin":
 *   - an explicit choice is kept as it is, or fails clearly; never replaced;
 *   - MiniMax-M2 `auto` never lands on a runner whose predicate refuses
 *     minimax2, for every quantization x platform (incl. simulated masks);
 *   - other architectures are untouched by MiniMax-M2's rules;
 *   - every (a2a, runner) pair is accepted or refused as the registry says,
 *     at resolution;
 *   - the declaration log holds the exact (source, field, value) tuples;
 *   - a write to the published config is caught;
 *   - resolution reads no tensor data (sparse files declaring ~24 GB).
 * Platforms are simulated (--cpu-features), so results do not depend on the
 * host. Expected tables are written out by hand. */
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moerun/config.h"
#include "moerun/kernels.h"
#include "testutil.h"

/* Resolves configs/<dir> with option pairs (name, value, ..., NULL). */
static mr_status resolve_v(const char *dir, mr_resolution **out, va_list ap) {
    mr_options o;
    assert_int_equal(mr_options_init(&o), MR_OK);
    char path[512];
    if (dir[0] == '/')
        snprintf(path, sizeof path, "%s", dir);
    else
        snprintf(path, sizeof path, "%s/configs/%s", MR_TEST_DATA, dir);
    assert_int_equal(mr_options_set(&o, "model", path, MR_SRC_FLAG), MR_OK);
    const char *k;
    while ((k = va_arg(ap, const char *)) != NULL) {
        const char *v = va_arg(ap, const char *);
        if (mr_options_set(&o, k, v, MR_SRC_FLAG) != MR_OK) fail_msg("option %s=%s: %s", k, v, mr_error_last());
    }
    mr_status s = mr_resolve(&o, out);
    mr_options_free(&o);
    assert_non_null(*out);
    return s;
}

static mr_status resolve(const char *dir, mr_resolution **out, ...) {
    va_list ap;
    va_start(ap, out);
    mr_status s = resolve_v(dir, out, ap);
    va_end(ap);
    return s;
}

/* Can this host run kernels that use `flags`? Answered without the library's
 * cpuid code where the compiler can (__builtin_cpu_supports), minus what
 * MOERUN_CPU_MASK hides (the mask simulates a smaller host). */
static bool host_can_run(uint32_t flags) {
    __builtin_cpu_init();
    const struct {
        uint32_t bit;
        bool has;
    } known[] = {{MR_CPU_SSE42, __builtin_cpu_supports("sse4.2")},
                 {MR_CPU_AVX2, __builtin_cpu_supports("avx2")},
                 {MR_CPU_FMA, __builtin_cpu_supports("fma")},
                 {MR_CPU_AVX512F, __builtin_cpu_supports("avx512f")},
                 {MR_CPU_AVX512BW, __builtin_cpu_supports("avx512bw")},
                 {MR_CPU_AVX512VL, __builtin_cpu_supports("avx512vl")},
                 {MR_CPU_AVX512DQ, __builtin_cpu_supports("avx512dq")},
                 {MR_CPU_AVX512VNNI, __builtin_cpu_supports("avx512vnni")},
                 {MR_CPU_AVX512BF16, __builtin_cpu_supports("avx512bf16")},
                 {MR_CPU_AVX512VBMI, __builtin_cpu_supports("avx512vbmi")}};
    uint32_t host = mr_cpu()->detected, hidden = 0; /* f16c, fp16, amx: the library's own detection */
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        host = known[i].has ? host | known[i].bit : host & ~known[i].bit;
    assert_int_equal(mr_cpu_parse_mask(getenv("MOERUN_CPU_MASK"), &hidden), MR_OK);
    return (flags & ~(host & ~hidden)) == 0;
}

typedef struct {
    mr_decl_kind kind;
    const char *source, *field, *value;
} tuple;

static void expect_log(const mr_resolution *r, const tuple *want, size_t n_want, bool with_notes) {
    size_t j = 0;
    for (int i = 0; i < mr_resolution_decl_count(r); i++) {
        const mr_decl *d = mr_resolution_decl_at(r, i);
        if (!with_notes && d->kind == MR_DECL_NOTE) continue;
        if (j >= n_want) fail_msg("extra declaration (%s, %s, %s): %s", d->source, d->field, d->value, d->reason);
        const tuple *w = &want[j++];
        if (d->kind != w->kind || strcmp(d->source, w->source) || strcmp(d->field, w->field) ||
            (w->value && strcmp(d->value, w->value)))
            fail_msg("declaration %zu: got (%s %s, %s, %s), want (%s %s, %s, %s)", j - 1, mr_decl_kind_name(d->kind),
                     d->source, d->field, d->value, mr_decl_kind_name(w->kind), w->source, w->field,
                     w->value ? w->value : "*");
        assert_true(d->reason[0] != 0); /* every declaration says why */
    }
    if (j != n_want) fail_msg("%zu declarations, want %zu", j, n_want);
}

#define S MR_DECL_SET
#define X MR_DECL_REFUSE

/* The MiniMax-M2 NVFP4 story, as (source, field, value) tuples. */
static void test_log_minimax_nvfp4(void **st) {
    (void)st;
    const char *forms[] = {"minimax_m2_nvfp4_flat", "minimax_m2_nvfp4_hf", "minimax_m2_nvfp4_groups"};
    for (int f = 0; f < 3; f++) {
        mr_resolution *r;
        mr_status s = resolve(forms[f], &r, "cpu_features", "avx512", "threads", "4", NULL);
        if (s != MR_OK) fail_msg("%s", mr_resolution_error(r));
        static const tuple want[] = {
            {S, "checkpoint", "architecture", "MiniMaxM2ForCausalLM"},
            {S, "checkpoint", "quantization", "modelopt_fp4"},
            {S, "checkpoint", "activation_mode", "w4a4"},
            {S, "checkpoint", "routing", "minimax2"},
            {S, "platform", "device", "cpu"},
            {S, "platform", "kernel_isa", "avx512"},
            {S, "model_overrides", "router_dtype", "fp32"},
            {X, "model_overrides", "moe_runner_backend", "fused"},
            {S, "model_overrides", "moe_runner_backend", "routed"},
            {S, "moe_runner", "moe_runner_backend", "routed"},
            {S, "a2a", "moe_a2a_backend", "none"},
            {S, "a2a", "ep_size", "1"},
            {S, "layout", "layout", "gateup=interleaved/16 inter_padded=1536 pack=nvfp4_r16k16"},
            {S, "engine", "kv_cache_dtype", "bf16"},
            {S, "engine", "dense_activation_dtype", "fp32"},
            {S, "engine", "context_length", NULL},
            {S, "engine", "max_running_requests", "256"},
            {S, "engine", "max_batch_tokens", "512"},
            {S, "engine", "kv_cache_memory", NULL},
        };
        expect_log(r, want, sizeof want / sizeof want[0], false);
        /* the refusal says why, in the runner's own words */
        const mr_decl *ref = mr_resolution_decl_at(r, 0);
        for (int i = 0; i < mr_resolution_decl_count(r); i++)
            if (mr_resolution_decl_at(r, i)->kind == MR_DECL_REFUSE) ref = mr_resolution_decl_at(r, i);
        assert_non_null(strstr(ref->reason, "routing method minimax2 is not implemented by fused"));
        /* resolved values: last declaration, else user, else default */
        assert_string_equal(mr_resolution_value(r, MR_OPT_MOE_RUNNER_BACKEND), "routed");
        assert_string_equal(mr_resolution_value(r, MR_OPT_ROUTER_DTYPE), "fp32");
        assert_string_equal(mr_resolution_value(r, MR_OPT_THREADS), "4");
        assert_string_equal(mr_resolution_value(r, MR_OPT_LOG), "warn");
        const mr_exec *x = mr_resolution_exec(r);
        assert_non_null(x);
        assert_true(mr_exec_verify(x));
        assert_string_equal(x->runner->name, "routed");
        assert_int_equal(x->quant, MR_QUANT_NVFP4);
        assert_int_equal(x->weight_format, MR_FMT_NVFP4);
        assert_int_equal(x->act_mode, MR_ACT_W4A4);
        assert_int_equal(x->router_dtype, MR_FMT_F32);
        assert_int_equal(x->kernel_isa, MR_ISA_AVX512);
        assert_int_equal(x->threads, 4);
        assert_int_equal(x->ep_size, 1);
        assert_int_equal(x->a2a, MR_A2A_NONE);
        assert_int_equal(x->problem.routing, MR_ROUTING_MINIMAX2);
        assert_int_equal(x->problem.n_experts, 256);
        assert_int_equal(x->problem.top_k, 8);
        assert_int_equal(x->layout.gateup, MR_GATEUP_INTERLEAVED);
        assert_string_equal(x->model->architecture, "MiniMaxM2ForCausalLM");
        assert_int_equal(x->model->quant.n_exclude, 5);
        assert_true(mr_quant_is_excluded(&x->model->quant, "lm_head.weight"));
        /* the simulated CPU decides the plan above; whether it runs HERE is the real host's answer */
        if (host_can_run(x->cpu_flags)) {
            assert_int_equal(mr_exec_check_runnable(x), MR_OK);
        } else {
            assert_int_equal(mr_exec_check_runnable(x), MR_EUNSUPPORTED);
            assert_non_null(strstr(mr_error_last(), "not run here"));
        }
        mr_resolution_free(r);
    }
}

/* Mixtral: no MiniMax rule fires; fused routes renormalize itself. */
static void test_log_mixtral(void **st) {
    (void)st;
    mr_resolution *r;
    assert_int_equal(resolve("mixtral_bf16", &r, "cpu_features", "avx2", "threads", "2", NULL), MR_OK);
    static const tuple want[] = {
        {S, "checkpoint", "architecture", "MixtralForCausalLM"},
        {S, "checkpoint", "quantization", "bf16"},
        {S, "checkpoint", "activation_mode", "w16a32"},
        {S, "checkpoint", "routing", "renormalize"},
        {S, "platform", "device", "cpu"},
        {S, "platform", "kernel_isa", "avx2"},
        {S, "moe_runner", "moe_runner_backend", "fused"},
        {S, "moe_runner", "router_dtype", "fp32"},
        {S, "a2a", "moe_a2a_backend", "none"},
        {S, "a2a", "ep_size", "1"},
        {S, "layout", "layout", "gateup=interleaved/16 inter_padded=14336 pack=none"},
        {S, "engine", "kv_cache_dtype", "bf16"},
        {S, "engine", "dense_activation_dtype", "fp32"},
        {S, "engine", "context_length", NULL},
        {S, "engine", "max_running_requests", "256"},
        {S, "engine", "max_batch_tokens", "512"},
        {S, "engine", "kv_cache_memory", NULL},
    };
    expect_log(r, want, sizeof want / sizeof want[0], false);
    const mr_exec *x = mr_resolution_exec(r);
    assert_int_equal(x->kernel_isa, MR_ISA_AVX2);
    assert_int_equal(x->cpu_flags & MR_CPU_AVX512F, 0);
    mr_resolution_free(r);
}

static const char *const all_configs[] = {"minimax_m2_bf16",       "minimax_m2_fp8",      "minimax_m2_nvfp4_flat",
                                           "minimax_m2_nvfp4_hf",   "minimax_m2_nvfp4_groups", "deepseek_v3_fp8",
                                           "mixtral_bf16",          "qwen3_moe_bf16",      "qwen3_moe_nonorm"};
#define N_CONFIGS (sizeof all_configs / sizeof all_configs[0])

/* An explicit runner is kept as it is, or resolution fails naming it. */
static void test_explicit_runner_kept_or_fails(void **st) {
    (void)st;
    const char *runners[] = {"reference", "routed", "fused"};
    const char *a2as[] = {"none", "mpi"};
    for (size_t c = 0; c < N_CONFIGS; c++)
        for (int a = 0; a < 2; a++)
            for (int k = 0; k < 3; k++) {
                mr_resolution *r;
                mr_status s = resolve(all_configs[c], &r, "cpu_features", "avx512", "moe_runner_backend", runners[k],
                                      "moe_a2a_backend", a2as[a], NULL);
                if (s == MR_OK) {
                    assert_string_equal(mr_resolution_exec(r)->runner->name, runners[k]);
                    assert_string_equal(mr_resolution_value(r, MR_OPT_MOE_RUNNER_BACKEND), runners[k]);
                    /* no pass declared a different runner */
                    for (int i = 0; i < mr_resolution_decl_count(r); i++) {
                        const mr_decl *d = mr_resolution_decl_at(r, i);
                        if (d->kind == MR_DECL_SET && !strcmp(d->field, "moe_runner_backend"))
                            fail_msg("%s: a pass set the explicit runner to %s", all_configs[c], d->value);
                    }
                } else {
                    assert_int_equal(s, MR_ERESOLVE);
                    assert_null(mr_resolution_exec(r));
                    char needle[64];
                    snprintf(needle, sizeof needle, "moe_runner_backend=%s", runners[k]);
                    if (!strstr(mr_resolution_error(r), needle))
                        fail_msg("%s: error does not name the choice: %s", all_configs[c], mr_resolution_error(r));
                    assert_non_null(strstr(mr_resolution_error(r), "runners that can: "));
                }
                mr_resolution_free(r);
            }
    /* the spec's example, word for word */
    mr_resolution *r;
    assert_int_equal(resolve("minimax_m2_nvfp4_flat", &r, "moe_runner_backend", "fused", NULL), MR_ERESOLVE);
    assert_non_null(strstr(mr_resolution_error(r), "moe_runner_backend=fused cannot run MiniMaxM2ForCausalLM: routing "
                                                   "method minimax2 is not implemented by fused"));
    assert_non_null(strstr(mr_resolution_error(r), "; runners that can: routed, reference"));
    mr_resolution_free(r);
}

static void test_explicit_other_options(void **st) {
    (void)st;
    mr_resolution *r;
    /* router_dtype=bf16 on MiniMax-M2: kept (the rule touches only auto) */
    assert_int_equal(resolve("minimax_m2_fp8", &r, "router_dtype", "bf16", NULL), MR_OK);
    assert_int_equal(mr_resolution_exec(r)->router_dtype, MR_FMT_BF16);
    assert_string_equal(mr_resolution_value(r, MR_OPT_ROUTER_DTYPE), "bf16");
    mr_resolution_free(r);
    /* activation mode kept when it belongs to the format */
    assert_int_equal(resolve("minimax_m2_nvfp4_hf", &r, "activation_mode", "w4a16", NULL), MR_OK);
    assert_int_equal(mr_resolution_exec(r)->act_mode, MR_ACT_W4A16);
    mr_resolution_free(r);
    /* ... refused when it does not, listing the ones that do */
    assert_int_equal(resolve("minimax_m2_nvfp4_hf", &r, "activation_mode", "w8a8", NULL), MR_ERESOLVE);
    assert_non_null(strstr(mr_resolution_error(r), "activation_mode=w8a8"));
    assert_non_null(strstr(mr_resolution_error(r), "w4a4, w4a8, w4a16"));
    mr_resolution_free(r);
    /* quantization contradicting the checkpoint */
    assert_int_equal(resolve("minimax_m2_nvfp4_groups", &r, "quantization", "fp8", NULL), MR_ERESOLVE);
    assert_non_null(strstr(mr_resolution_error(r), "quantization=fp8 contradicts the checkpoint"));
    assert_non_null(strstr(mr_resolution_error(r), "modelopt_fp4"));
    mr_resolution_free(r);
    /* ... agreeing is fine */
    assert_int_equal(resolve("minimax_m2_fp8", &r, "quantization", "fp8", NULL), MR_OK);
    mr_resolution_free(r);
    /* kernel_isa above the (simulated) CPU: error; at or below: kept */
    assert_int_equal(resolve("mixtral_bf16", &r, "cpu_features", "avx2", "kernel_isa", "avx512", NULL), MR_ERESOLVE);
    assert_non_null(strstr(mr_resolution_error(r), "kernel_isa=avx512 is above what the simulated CPU has"));
    assert_non_null(strstr(mr_resolution_error(r), "levels that work: generic, avx2"));
    mr_resolution_free(r);
    assert_int_equal(resolve("mixtral_bf16", &r, "cpu_features", "avx512", "kernel_isa", "generic", NULL), MR_OK);
    assert_int_equal(mr_resolution_exec(r)->kernel_isa, MR_ISA_GENERIC);
    assert_int_equal(mr_resolution_exec(r)->cpu_flags & (MR_CPU_AVX2 | MR_CPU_AVX512F), 0);
    mr_resolution_free(r);
    /* a mask hides features from a simulated CPU */
    assert_int_equal(resolve("mixtral_bf16", &r, "cpu_features", "avx512", "cpu_mask", "avx512", NULL), MR_OK);
    assert_int_equal(mr_resolution_exec(r)->kernel_isa, MR_ISA_AVX2);
    mr_resolution_free(r);
    /* an explicit "auto" is still auto */
    assert_int_equal(resolve("minimax_m2_bf16", &r, "moe_runner_backend", "auto", NULL), MR_OK);
    assert_string_equal(mr_resolution_exec(r)->runner->name, "routed");
    mr_resolution_free(r);
}

/* The ISA level is one fact: for every subset of the features the levels
 * use, the level resolution names is the level of the kernel table built
 * from the flags it publishes, that table's kernels carry the level's name,
 * and the published flags hold nothing of a higher level. A CPU with
 * AVX-512F but without VNNI or VBMI resolves to avx2 and runs avx2; one
 * without BF16 is avx512 (BF16 is an extension the level takes). */
static void test_isa_level_is_the_table(void **st) {
    (void)st;
    static const uint32_t bits[] = {MR_CPU_AVX2,       MR_CPU_FMA,        MR_CPU_F16C,       MR_CPU_AVX512F,
                                    MR_CPU_AVX512BW,   MR_CPU_AVX512VL,   MR_CPU_AVX512DQ,   MR_CPU_AVX512VNNI,
                                    MR_CPU_AVX512BF16, MR_CPU_AVX512VBMI};
    const int nb = (int)(sizeof bits / sizeof bits[0]);
    int count[MR_ISA_COUNT] = {0};
    for (int mask = 0; mask < (1 << nb); mask++) {
        char feats[512] = "sse4.2";
        size_t used = strlen(feats);
        uint32_t want = MR_CPU_SSE42;
        for (int b = 0; b < nb; b++)
            if (mask & (1 << b)) {
                used += (size_t)snprintf(feats + used, sizeof feats - used, ",%s", mr_cpu_feature_name(bits[b]));
                want |= bits[b];
            }
        if (want & MR_CPU_AVX2) want |= MR_CPU_FMA | MR_CPU_F16C; /* "avx2" in cpu_features is the AVX2 group */
        mr_resolution *r;
        if (resolve("mixtral_bf16", &r, "cpu_features", feats, NULL) != MR_OK) fail_msg("%s: %s", feats, mr_resolution_error(r));
        const mr_exec *x = mr_resolution_exec(r);
        assert_int_equal(x->cpu_flags & ~want, 0);
        mr_kernels k;
        mr_kernels_init(&k, x->cpu_flags);
        if (k.level != x->kernel_isa)
            fail_msg("cpu %s: resolved %s, the table runs %s", feats, mr_kernel_isa_name(x->kernel_isa), k.isa);
        assert_string_equal(k.isa, mr_kernel_isa_name(x->kernel_isa));
        /* and the table a process on that CPU builds by itself (its own flags, no resolution) */
        mr_kernels kc;
        mr_kernels_init(&kc, want);
        if (kc.level != x->kernel_isa)
            fail_msg("cpu %s: resolved %s, a table built for the CPU runs %s", feats, mr_kernel_isa_name(x->kernel_isa),
                     kc.isa);
        for (int u = 0; u < MR_UK_COUNT; u++) assert_non_null(strstr(k.uk_gemv[u].name, k.isa));
        /* the AVX-512 level keeps BF16 in the flags it publishes, and its table takes vdpbf16ps by them */
        if (x->kernel_isa == MR_ISA_AVX512)
            assert_int_equal(strstr(k.uk_gemv[MR_UK_BF16_BF16].name, "avx512fma") == NULL,
                             (want & MR_CPU_AVX512BF16) != 0 && (x->cpu_flags & MR_CPU_AVX512BF16) != 0);
        assert_non_null(strstr(k.decode[MR_FMT_BF16].name, k.isa));
        /* nothing a higher level dispatches on is left in the published flags */
        assert_int_equal(x->cpu_flags & mr_kernel_isa_above(x->kernel_isa), 0);
        count[x->kernel_isa]++;
        mr_resolution_free(r);
    }
    /* avx512 needs avx2 and the 6 AVX-512 bits of the level (fma, f16c free: 4 sets; bf16 free: x 2);
     * avx2 the avx2 group without the whole AVX-512 set (4 x 126); generic everything without avx2 (2^9) */
    assert_int_equal(count[MR_ISA_AVX512], 4 * 2);
    assert_int_equal(count[MR_ISA_AVX2], 4 * 126);
    assert_int_equal(count[MR_ISA_GENERIC], 1 << 9);
    /* the case of the issue: AVX-512F/BW/VL/DQ without BF16/VNNI/VBMI */
    mr_resolution *r;
    assert_int_equal(resolve("mixtral_bf16", &r, "cpu_features", "sse4.2,avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq",
                             NULL),
                     MR_OK);
    assert_int_equal(mr_resolution_exec(r)->kernel_isa, MR_ISA_AVX2);
    mr_resolution_free(r);
    /* Ice Lake (and a VM that hides BF16): the AVX-512 level, with its FMA pair dots */
    assert_int_equal(resolve("mixtral_bf16", &r, "cpu_features",
                             "sse4.2,avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi", NULL),
                     MR_OK);
    assert_int_equal(mr_resolution_exec(r)->kernel_isa, MR_ISA_AVX512);
    assert_int_equal(mr_resolution_exec(r)->cpu_flags & MR_CPU_AVX512BF16, 0);
    mr_resolution_free(r);
}

/* MiniMax-M2 + auto never lands on a runner refusing minimax2, whatever the
 * quantization, platform and transport. */
static void test_minimax_auto_every_platform(void **st) {
    (void)st;
    const char *cfgs[] = {"minimax_m2_bf16", "minimax_m2_fp8", "minimax_m2_nvfp4_flat", "minimax_m2_nvfp4_hf",
                          "minimax_m2_nvfp4_groups"};
    const char *feats[] = {"generic", "avx2", "avx512", "sse4.2,avx2,fma,f16c,avx512f,avx512bw,avx512vl", "auto"};
    const char *masks[] = {"none", "avx512", "avx2", "all"};
    const char *devices[] = {"auto", "cpu", "sm90", "sm100", "sm103", "sm110", "sm120"};
    const char *a2as[] = {"auto", "none", "mpi"};
    int ok = 0, failed = 0;
    for (size_t c = 0; c < 5; c++)
        for (size_t f = 0; f < 5; f++)
            for (size_t m = 0; m < 4; m++)
                for (size_t d = 0; d < 7; d++)
                    for (size_t a = 0; a < 3; a++) {
                        mr_resolution *r;
                        mr_status s = resolve(cfgs[c], &r, "cpu_features", feats[f], "cpu_mask", masks[m], "device",
                                              devices[d], "moe_a2a_backend", a2as[a], NULL);
                        if (s == MR_OK) {
                            ok++;
                            const mr_exec *x = mr_resolution_exec(r);
                            char why[512];
                            assert_int_equal(x->problem.routing, MR_ROUTING_MINIMAX2);
                            if (!x->runner->supports(&x->problem, why, sizeof why))
                                fail_msg("%s/%s/%s: auto chose %s, which refuses: %s", cfgs[c], feats[f], devices[d],
                                         x->runner->name, why);
                            assert_true(x->runner->auto_eligible);
                            assert_int_equal(x->router_dtype, MR_FMT_F32);
                            assert_int_equal(x->device, MR_DEVICE_CPU);
                        } else {
                            failed++;
                            /* only GPU devices fail: no GPU runner is built */
                            assert_true(d >= 2);
                            assert_non_null(strstr(mr_resolution_error(r), "no GPU runner is built"));
                        }
                        mr_resolution_free(r);
                    }
    assert_int_equal(ok, 5 * 5 * 4 * 2 * 3);
    assert_int_equal(failed, 5 * 5 * 4 * 5 * 3);
}

/* Other architectures: no MiniMax-M2 declaration, whatever the platform. */
static void test_other_archs_untouched(void **st) {
    (void)st;
    struct {
        const char *cfg;
        const char *runner;
    } cases[] = {
        {"mixtral_bf16", "fused"},     /* fused implements renormalize */
        {"qwen3_moe_bf16", "fused"},
        {"qwen3_moe_nonorm", "fused"}, /* softmax_topk */
        {"deepseek_v3_fp8", "routed"}, /* fused refuses deepseek_v3 by its own predicate */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *feats[] = {"generic", "avx2", "avx512"};
        for (int f = 0; f < 3; f++) {
            mr_resolution *r;
            assert_int_equal(resolve(cases[i].cfg, &r, "cpu_features", feats[f], NULL), MR_OK);
            assert_string_equal(mr_resolution_exec(r)->runner->name, cases[i].runner);
            for (int j = 0; j < mr_resolution_decl_count(r); j++) {
                const mr_decl *d = mr_resolution_decl_at(r, j);
                if (!strcmp(d->source, "model_overrides")) {
                    assert_int_equal(d->kind, MR_DECL_NOTE);
                    assert_non_null(strstr(d->reason, "no override is registered"));
                }
                if (d->kind == MR_DECL_SET && !strcmp(d->field, "moe_runner_backend"))
                    assert_string_equal(d->source, "moe_runner");
                if (d->kind == MR_DECL_SET && !strcmp(d->field, "router_dtype"))
                    assert_string_equal(d->source, "moe_runner");
            }
            mr_resolution_free(r);
        }
    }
}

/* The pair registry, written out: none x every runner; mpi x routed and reference. */
static void test_a2a_pairs(void **st) {
    (void)st;
    struct {
        const char *a2a, *runner;
        bool ok;
    } pairs[] = {
        {"none", "reference", true}, {"none", "routed", true}, {"none", "fused", true},
        {"mpi", "reference", true}, {"mpi", "routed", true},  {"mpi", "fused", false},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        mr_a2a a;
        assert_int_equal(mr_a2a_from_name(pairs[i].a2a, &a), MR_OK);
        const mr_moe_runner *rn = mr_moe_runner_find(pairs[i].runner);
        assert_non_null(rn);
        char why[256];
        assert_int_equal(mr_a2a_pair_supported(a, rn, why, sizeof why), pairs[i].ok);
        assert_true(why[0] != 0);
        /* Mixtral: fused can route it, so only the pair decides */
        mr_resolution *r;
        mr_status s = resolve("mixtral_bf16", &r, "moe_a2a_backend", pairs[i].a2a, "moe_runner_backend",
                              pairs[i].runner, NULL);
        if (pairs[i].ok != (s == MR_OK)) fail_msg("(%s, %s): %s", pairs[i].a2a, pairs[i].runner, mr_resolution_error(r));
        if (s == MR_OK) {
            assert_int_equal(mr_resolution_exec(r)->a2a, a);
        } else {
            /* fails at resolution (never at the first forward), naming both and the way out */
            char needle[128];
            snprintf(needle, sizeof needle, "moe_a2a_backend=%s cannot be combined with moe_runner_backend=%s",
                     pairs[i].a2a, pairs[i].runner);
            assert_non_null(strstr(mr_resolution_error(r), needle));
            assert_non_null(strstr(mr_resolution_error(r), "runners that can: routed"));
        }
        mr_resolution_free(r);
        /* the runners' own predicates agree with the registry */
        mr_model_desc m;
        assert_int_equal(mr_model_desc_load(tu_data("configs/mixtral_bf16"), &m), MR_OK);
        mr_moe_problem p = {.device = MR_DEVICE_CPU, .weight_format = MR_FMT_BF16, .act_mode = MR_ACT_W16A32,
                            .act_dtype = MR_FMT_F32, .routing = m.routing, .n_experts = m.n_experts, .top_k = m.top_k,
                            .hidden = m.hidden, .inter = m.moe_inter, .a2a = a};
        if (!pairs[i].ok || strcmp(pairs[i].runner, "reference") != 0)
            assert_int_equal(rn->supports(&p, why, sizeof why), pairs[i].ok);
        mr_model_desc_free(&m);
    }
    /* mpi + auto resolves to routed (never the reference, never fused); it runs where the build has MPI */
    mr_resolution *r;
    assert_int_equal(resolve("mixtral_bf16", &r, "moe_a2a_backend", "mpi", NULL), MR_OK);
    const mr_exec *x = mr_resolution_exec(r);
    assert_string_equal(x->runner->name, "routed");
    if (mr_ep_built()) {
        assert_int_equal(mr_exec_check_runnable(x), MR_OK);
    } else {
        assert_int_equal(mr_exec_check_runnable(x), MR_EUNSUPPORTED);
        assert_non_null(strstr(mr_error_last(), "this build has no MPI"));
    }
    mr_resolution_free(r);
}

static void test_ep_size(void **st) {
    (void)st;
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("PMI_SIZE");
    unsetenv("PMIX_SIZE");
    unsetenv("MPI_LOCALNRANKS");
    mr_resolution *r;
    assert_int_equal(resolve("mixtral_bf16", &r, "ep_size", "2", NULL), MR_ERESOLVE);
    assert_non_null(strstr(mr_resolution_error(r), "ep_size=2 needs an expert-parallel transport"));
    mr_resolution_free(r);
    assert_int_equal(resolve("mixtral_bf16", &r, "ep_size", "1", NULL), MR_OK);
    mr_resolution_free(r);
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    assert_int_equal(resolve("mixtral_bf16", &r, "moe_a2a_backend", "mpi", NULL), MR_OK);
    assert_int_equal(mr_resolution_exec(r)->ep_size, 4);
    assert_string_equal(mr_resolution_value(r, MR_OPT_EP_SIZE), "4");
    mr_resolution_free(r);
    assert_int_equal(resolve("mixtral_bf16", &r, "moe_a2a_backend", "mpi", "ep_size", "2", NULL), MR_ERESOLVE);
    assert_non_null(strstr(mr_resolution_error(r), "must equal the MPI world size"));
    mr_resolution_free(r);
    /* 8 experts over 3 ranks: 3, 3, 2, each rank its own contiguous range */
    setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
    const int want_first[3] = {0, 3, 6}, want_n[3] = {3, 3, 2};
    for (int rank = 0; rank < 3; rank++) {
        char rv[8];
        snprintf(rv, sizeof rv, "%d", rank);
        setenv("OMPI_COMM_WORLD_RANK", rv, 1);
        assert_int_equal(resolve("mixtral_bf16", &r, "moe_a2a_backend", "mpi", NULL), MR_OK);
        const mr_exec *x = mr_resolution_exec(r);
        assert_int_equal(x->ep_size, 3);
        assert_int_equal(x->problem.ep_rank, rank);
        assert_int_equal(x->problem.local_first, want_first[rank]);
        assert_int_equal(x->problem.n_local, want_n[rank]);
        mr_resolution_free(r);
    }
    /* auto picks mpi when the launcher started several ranks; none stays possible explicitly */
    assert_int_equal(resolve("mixtral_bf16", &r, NULL), MR_OK);
    assert_int_equal(mr_resolution_exec(r)->a2a, MR_A2A_MPI);
    assert_int_equal(mr_resolution_exec(r)->ep_size, 3);
    mr_resolution_free(r);
    assert_int_equal(resolve("mixtral_bf16", &r, "moe_a2a_backend", "none", NULL), MR_OK);
    assert_int_equal(mr_resolution_exec(r)->ep_size, 1);
    assert_int_equal(mr_resolution_exec(r)->problem.n_local, 8);
    mr_resolution_free(r);
    /* more ranks than experts: refused with the number */
    setenv("OMPI_COMM_WORLD_SIZE", "9", 1);
    setenv("OMPI_COMM_WORLD_RANK", "0", 1);
    assert_int_equal(resolve("mixtral_bf16", &r, "moe_a2a_backend", "mpi", NULL), MR_ERESOLVE);
    assert_non_null(strstr(mr_resolution_error(r), "more than the 8 experts"));
    mr_resolution_free(r);
    /* (mpi, fused) is refused with the alternatives */
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    assert_int_equal(resolve("mixtral_bf16", &r, "moe_a2a_backend", "mpi", "moe_runner_backend", "fused", NULL),
                     MR_ERESOLVE);
    assert_non_null(strstr(mr_resolution_error(r), "runners that can: routed, reference"));
    mr_resolution_free(r);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("OMPI_COMM_WORLD_RANK");
}

/* A write to the published config faults; a changed copy fails verify. */
static void test_publish_frozen(void **st) {
    (void)st;
    mr_resolution *r;
    assert_int_equal(resolve("minimax_m2_fp8", &r, NULL), MR_OK);
    const mr_exec *x = mr_resolution_exec(r);
    assert_true(mr_exec_verify(x));
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL);
        signal(SIGBUS, SIG_DFL);
        ((mr_exec *)(uintptr_t)x)->threads = 1000; /* the programming error under test */
        ((mr_model_desc *)(uintptr_t)x->model)->top_k = 1;
        _exit(0); /* reached only if the write went through */
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) fail_msg("a write to the published exec config went through");
    assert_true(mr_exec_verify(x));
    /* a modified copy (of the struct or of what it points to) does not verify */
    mr_exec copy;
    memcpy(&copy, x, sizeof copy);
    assert_true(mr_exec_verify(&copy));
    copy.threads++;
    assert_false(mr_exec_verify(&copy));
    memcpy(&copy, x, sizeof copy);
    mr_model_desc m2;
    memcpy(&m2, x->model, sizeof m2);
    m2.top_k = 2;
    copy.model = &m2;
    assert_false(mr_exec_verify(&copy));
    assert_false(mr_exec_verify(NULL));
    mr_resolution_free(r);
}

/* ---- sparse checkpoints: valid headers, ~24 GB of data never touched ---- */

typedef struct {
    char name[128];
    const char *dtype;
    int bits;
    int64_t shape[2];
    int ndim;
} st_entry;

static void write_sparse_safetensors(const char *path, const st_entry *e, size_t n) {
    size_t cap = n * 200 + 64, len = 0;
    char *h = malloc(cap);
    assert_non_null(h);
    uint64_t off = 0;
    len += (size_t)snprintf(h + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < n; i++) {
        uint64_t elems = 1;
        for (int d = 0; d < e[i].ndim; d++) elems *= (uint64_t)e[i].shape[d];
        uint64_t bytes = elems * (uint64_t)e[i].bits / 8;
        len += (size_t)snprintf(h + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", e[i].name, e[i].dtype);
        for (int d = 0; d < e[i].ndim; d++)
            len += (size_t)snprintf(h + len, cap - len, "%s%lld", d ? "," : "", (long long)e[i].shape[d]);
        len += (size_t)snprintf(h + len, cap - len, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                                (unsigned long long)(off + bytes));
        off += bytes;
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    while (len % 8) h[len++] = ' ';
    assert_true(len < cap);
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    assert_true(fd >= 0);
    unsigned char n8[8];
    for (int i = 0; i < 8; i++) n8[i] = (unsigned char)((uint64_t)len >> (8 * i));
    assert_int_equal(write(fd, n8, 8), 8);
    assert_int_equal(write(fd, h, len), (ssize_t)len);
    assert_int_equal(ftruncate(fd, (off_t)(8 + len + off)), 0); /* sparse: the data is a hole */
    close(fd);
    free(h);
}

static void add(st_entry *e, size_t *n, const char *name, const char *dtype, int bits, int64_t a, int64_t b, int ndim) {
    snprintf(e[*n].name, sizeof e[*n].name, "%s", name);
    e[*n].dtype = dtype;
    e[*n].bits = bits;
    e[*n].shape[0] = a;
    e[*n].shape[1] = b;
    e[*n].ndim = ndim;
    (*n)++;
}

static void copy_config(const char *from_dir, const char *to_dir) {
    char src[512], dst[512];
    snprintf(src, sizeof src, "configs/%s/config.json", from_dir);
    size_t len;
    void *buf = tu_read_file(tu_data(src), &len);
    assert_non_null(buf);
    snprintf(dst, sizeof dst, "%s/config.json", to_dir);
    assert_int_equal(tu_write_file(dst, buf, len), 0);
    free(buf);
}

static long maxrss_kb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

static void test_sparse_reads_no_tensor_data(void **st) {
    (void)st;
    char *dir = tu_tmpdir("resolve_sparse");
    assert_non_null(dir);
    copy_config("minimax_m2_bf16", dir);
    /* 3 real-shape MiniMax-M2 bf16 MoE layers + embeddings: ~24 GB declared */
    size_t cap = 3 * (256 * 3 + 2) + 3, n = 0;
    st_entry *e = calloc(cap, sizeof *e);
    assert_non_null(e);
    char nm[128];
    add(e, &n, "model.embed_tokens.weight", "BF16", 16, 200064, 3072, 2);
    add(e, &n, "lm_head.weight", "BF16", 16, 200064, 3072, 2);
    add(e, &n, "model.norm.weight", "BF16", 16, 3072, 0, 1);
    for (int l = 0; l < 3; l++) {
        snprintf(nm, sizeof nm, "model.layers.%d.block_sparse_moe.gate.weight", l);
        add(e, &n, nm, "BF16", 16, 256, 3072, 2);
        snprintf(nm, sizeof nm, "model.layers.%d.block_sparse_moe.e_score_correction_bias", l);
        add(e, &n, nm, "F32", 32, 256, 0, 1);
        for (int x = 0; x < 256; x++) {
            snprintf(nm, sizeof nm, "model.layers.%d.block_sparse_moe.experts.%d.w1.weight", l, x);
            add(e, &n, nm, "BF16", 16, 1536, 3072, 2);
            snprintf(nm, sizeof nm, "model.layers.%d.block_sparse_moe.experts.%d.w3.weight", l, x);
            add(e, &n, nm, "BF16", 16, 1536, 3072, 2);
            snprintf(nm, sizeof nm, "model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l, x);
            add(e, &n, nm, "BF16", 16, 3072, 1536, 2);
        }
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_sparse_safetensors(path, e, n);
    free(e);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_true(sb.st_size > (off_t)20 * 1000 * 1000 * 1000); /* tens of GB declared */
    assert_true((uint64_t)sb.st_blocks * 512 < 64u << 20);     /* ... and nothing on disk */

    long before = maxrss_kb();
    uint64_t t0 = mr_now_ns();
    mr_resolution *r;
    mr_status s = resolve(dir, &r, "cpu_features", "avx2", NULL);
    uint64_t dt = mr_now_ns() - t0;
    long grown = maxrss_kb() - before;
    if (s != MR_OK) fail_msg("%s", mr_resolution_error(r));
    print_message("resolved a %.1f GB sparse checkpoint in %.1f ms, maxrss +%ld kB\n", (double)sb.st_size / 1e9,
                  (double)dt / 1e6, grown);
    assert_true(grown < 64 * 1024); /* touching the data would cost GBs */
    /* the header check ran and said so */
    bool noted = false;
    for (int i = 0; i < mr_resolution_decl_count(r); i++) {
        const mr_decl *d = mr_resolution_decl_at(r, i);
        if (!strcmp(d->field, "tensors") && !strcmp(d->value, "agree")) {
            noted = true;
            assert_non_null(strstr(d->reason, "2313 tensors in 1 file (no tensor data)"));
            assert_non_null(strstr(d->reason, "2304 expert weights"));
        }
    }
    assert_true(noted);
    mr_resolution_free(r);
    tu_rmtree(dir);
    free(dir);
}

/* The tensors' dtypes must agree with the declared quantization. */
static void test_tensor_dtype_contradiction(void **st) {
    (void)st;
    char *dir = tu_tmpdir("resolve_dtype");
    assert_non_null(dir);
    copy_config("minimax_m2_nvfp4_flat", dir);
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_entry e[8];
    size_t n = 0;
    /* a correct NVFP4 expert and an excluded bf16 gate */
    add(e, &n, "model.layers.0.block_sparse_moe.experts.0.w1.weight", "U8", 8, 1536, 1536, 2);
    add(e, &n, "model.layers.0.block_sparse_moe.experts.0.w1.weight_scale", "F8_E4M3", 8, 1536, 192, 2);
    add(e, &n, "model.layers.0.block_sparse_moe.experts.0.w1.weight_scale_2", "F32", 32, 0, 0, 0);
    add(e, &n, "model.layers.0.block_sparse_moe.experts.0.w1.input_scale", "F32", 32, 0, 0, 0);
    add(e, &n, "model.layers.0.block_sparse_moe.gate.weight", "BF16", 16, 256, 3072, 2);
    write_sparse_safetensors(path, e, n);
    mr_resolution *r;
    assert_int_equal(resolve(dir, &r, NULL), MR_OK);
    mr_resolution_free(r);
    /* an expert left in bf16 contradicts modelopt_fp4 */
    add(e, &n, "model.layers.0.block_sparse_moe.experts.1.w1.weight", "BF16", 16, 1536, 3072, 2);
    write_sparse_safetensors(path, e, n);
    assert_int_equal(resolve(dir, &r, NULL), MR_ECONFIG);
    assert_non_null(strstr(mr_resolution_error(r), "expert tensor model.layers.0.block_sparse_moe.experts.1.w1.weight is BF16"));
    /* what is expected comes from the format's tensor list (formats/ traits) */
    assert_non_null(strstr(mr_resolution_error(r), "expected U8 with F8_E4M3 weight_scale, F32 weight_scale_2"));
    assert_non_null(strstr(mr_resolution_error(r), "and has no weight_scale"));
    mr_resolution_free(r);
    /* a right dtype without its scalar scale: refused, naming it */
    n = 5;
    add(e, &n, "model.layers.0.block_sparse_moe.experts.1.w1.weight", "U8", 8, 1536, 1536, 2);
    add(e, &n, "model.layers.0.block_sparse_moe.experts.1.w1.weight_scale", "F8_E4M3", 8, 1536, 192, 2);
    write_sparse_safetensors(path, e, n);
    assert_int_equal(resolve(dir, &r, NULL), MR_ECONFIG);
    assert_non_null(strstr(mr_resolution_error(r), "experts.1.w1.weight is U8 and has no weight_scale_2"));
    mr_resolution_free(r);
    n = 5;
    /* a quantized tensor the config excludes */
    n = 4;
    add(e, &n, "model.layers.0.block_sparse_moe.gate.weight", "U8", 8, 256, 1536, 2);
    write_sparse_safetensors(path, e, n);
    assert_int_equal(resolve(dir, &r, NULL), MR_ECONFIG);
    assert_non_null(strstr(mr_resolution_error(r), "excludes it"));
    mr_resolution_free(r);
    /* a corrupt header is a clear error, exit-2 class */
    assert_int_equal(tu_write_file(path, "\x10\0\0\0\0\0\0\0{bad", 12), 0);
    assert_int_equal(resolve(dir, &r, NULL), MR_EFORMAT);
    assert_non_null(strstr(mr_resolution_error(r), "cannot read the safetensors headers"));
    mr_resolution_free(r);
    tu_rmtree(dir);
    free(dir);
}

static void test_json_and_summary(void **st) {
    (void)st;
    mr_resolution *r;
    assert_int_equal(resolve("minimax_m2_nvfp4_flat", &r, "cpu_features", "avx512", "threads", "2", NULL), MR_OK);
    char *js = mr_resolution_json(r);
    assert_non_null(js);
    json_error_t err;
    json_t *root = json_loads(js, 0, &err);
    assert_non_null(root);
    assert_string_equal(json_string_value(json_object_get(root, "schema")), "moerun.resolve/1");
    assert_true(json_is_true(json_object_get(root, "ok")));
    json_t *opt = json_object_get(json_object_get(root, "options"), "moe_runner_backend");
    assert_string_equal(json_string_value(json_object_get(opt, "value")), "routed");
    assert_false(json_is_true(json_object_get(opt, "explicit")));
    json_t *chain = json_object_get(opt, "chain");
    assert_int_equal(json_array_size(chain), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(chain, 0), "source")), "model_overrides");
    assert_string_equal(json_string_value(json_object_get(json_array_get(chain, 1), "source")), "moe_runner");
    json_t *refs = json_object_get(root, "refusals");
    assert_int_equal(json_array_size(refs), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(refs, 0), "candidate")), "fused");
    json_t *ex = json_object_get(root, "exec");
    assert_string_equal(json_string_value(json_object_get(ex, "runner")), "routed");
    assert_int_equal(json_integer_value(json_object_get(ex, "threads")), 2);
    /* the number of declarations matches the log */
    assert_int_equal((int)json_array_size(json_object_get(root, "declarations")), mr_resolution_decl_count(r));
    json_decref(root);
    mr_free(js);

    char line[512];
    mr_resolution_summary(r, line, sizeof line);
    assert_string_equal(line, "resolved: MiniMaxM2ForCausalLM modelopt_fp4 w4a4 runner=routed a2a=none isa=avx512 "
                              "threads=2 (fused refused: routing method minimax2 is not implemented by fused)");
    mr_resolution_free(r);

    /* --enable-deterministic-inference: in the summary line, the JSON and a note naming the kernels */
    assert_int_equal(resolve("minimax_m2_nvfp4_flat", &r, "enable_deterministic_inference", "on", NULL), MR_OK);
    mr_resolution_summary(r, line, sizeof line);
    assert_non_null(strstr(line, " threads=2 deterministic ("));
    js = mr_resolution_json(r);
    root = json_loads(js, 0, &err);
    assert_non_null(root);
    assert_true(json_is_true(json_object_get(json_object_get(root, "exec"), "enable_deterministic_inference")));
    json_decref(root);
    mr_free(js);
    bool noted = false;
    for (int i = 0; i < mr_resolution_decl_count(r); i++) {
        const mr_decl *d = mr_resolution_decl_at(r, i);
        noted |= !strcmp(d->field, "enable_deterministic_inference") && strstr(d->reason, "batch-invariant kernel");
    }
    assert_true(noted);
    assert_true(mr_resolution_exec(r)->batch_invariant);
    assert_int_equal(mr_resolution_exec(r)->dense_act_dtype, MR_FMT_F32);
    mr_resolution_free(r);

    /* --dense-activation-dtype bf16: the summary line, the JSON (fp32 above), a note saying what it rounds */
    assert_int_equal(resolve("minimax_m2_nvfp4_flat", &r, "dense_activation_dtype", "bf16", NULL), MR_OK);
    mr_resolution_summary(r, line, sizeof line);
    assert_non_null(strstr(line, " threads=2 dense=bf16 ("));
    js = mr_resolution_json(r);
    root = json_loads(js, 0, &err);
    assert_non_null(root);
    assert_string_equal(json_string_value(json_object_get(json_object_get(root, "exec"), "dense_activation_dtype")),
                        "bf16");
    json_decref(root);
    mr_free(js);
    noted = false;
    for (int i = 0; i < mr_resolution_decl_count(r); i++) {
        const mr_decl *d = mr_resolution_decl_at(r, i);
        noted |= !strcmp(d->field, "dense_activation_dtype") && d->kind == MR_DECL_NOTE && strstr(d->reason, "o_proj");
    }
    assert_true(noted);
    assert_int_equal(mr_resolution_exec(r)->dense_act_dtype, MR_FMT_BF16);
    mr_resolution_free(r);
    { /* a value outside the list is refused by the options, naming them */
        mr_options o;
        assert_int_equal(mr_options_init(&o), MR_OK);
        assert_int_equal(mr_options_set(&o, "dense_activation_dtype", "fp16", MR_SRC_FLAG), MR_EINVAL);
        assert_non_null(strstr(mr_error_last(), "auto, fp32, bf16"));
        mr_options_free(&o);
    }

    /* a failure explains itself in JSON too */
    assert_int_equal(resolve("minimax_m2_nvfp4_flat", &r, "moe_runner_backend", "fused", NULL), MR_ERESOLVE);
    js = mr_resolution_json(r);
    root = json_loads(js, 0, &err);
    assert_non_null(root);
    assert_true(json_is_false(json_object_get(root, "ok")));
    assert_true(json_is_null(json_object_get(root, "exec")));
    assert_non_null(strstr(json_string_value(json_object_get(root, "error")), "moe_runner_backend=fused"));
    json_decref(root);
    mr_free(js);
    mr_resolution_summary(r, line, sizeof line);
    assert_non_null(strstr(line, "resolution failed: moe_runner_backend=fused"));
    mr_resolution_free(r);
}

/* The engine pass: KV dtype, pool size in blocks from bytes or a fraction,
 * the scheduler limits and their contradictions, each with its numbers. */
static const mr_decl *find_decl(const mr_resolution *r, const char *field) {
    const mr_decl *d = NULL;
    for (int i = 0; i < mr_resolution_decl_count(r); i++)
        if (!strcmp(mr_resolution_decl_at(r, i)->field, field)) d = mr_resolution_decl_at(r, i);
    return d;
}

static void test_engine_pass(void **st) {
    (void)st;
    mr_resolution *r;
    /* 62 layers x K,V x 8 kv heads x 128 dims x 4 bytes = 507904 bytes per token; 1 GiB = 132 blocks of 16 */
    assert_int_equal(resolve("minimax_m2_bf16", &r, "kv_cache_memory", "1GiB", "kv_cache_dtype", "fp32", NULL), MR_OK);
    const mr_exec *x = mr_resolution_exec(r);
    assert_int_equal(x->kv_dtype, MR_FMT_F32);
    assert_int_equal(x->kv_token_bytes, 507904);
    assert_int_equal(x->kv_blocks, 132);
    assert_int_equal(x->context_length, 196608); /* max_position_embeddings */
    assert_int_equal(x->max_running_requests, 256);
    assert_int_equal(x->max_batch_tokens, 512);
    const mr_decl *d = find_decl(r, "kv_cache_memory");
    assert_non_null(d);
    assert_non_null(strstr(d->reason, "132 blocks of 16 tokens = 2112 tokens at 507904 bytes per token"));
    assert_non_null(strstr(d->reason, "less than one full context of 196608"));
    mr_resolution_free(r);
    /* bf16 by default: half the bytes, twice the blocks */
    assert_int_equal(resolve("minimax_m2_bf16", &r, "kv_cache_memory", "1GiB", NULL), MR_OK);
    assert_int_equal(mr_resolution_exec(r)->kv_dtype, MR_FMT_BF16);
    assert_int_equal(mr_resolution_exec(r)->kv_blocks, 264);
    assert_string_equal(mr_resolution_value(r, MR_OPT_KV_CACHE_DTYPE), "bf16");
    mr_resolution_free(r);
    /* fp8 (vLLM's alias of fp8_e4m3) and fp8_e5m2: a byte per value, twice bf16's blocks */
    static const struct {
        const char *in, *name;
        mr_format f;
    } f8[] = {{"fp8_e4m3", "fp8_e4m3", MR_FMT_E4M3}, {"fp8", "fp8_e4m3", MR_FMT_E4M3}, {"fp8_e5m2", "fp8_e5m2", MR_FMT_E5M2}};
    for (size_t i = 0; i < sizeof f8 / sizeof f8[0]; i++) {
        assert_int_equal(resolve("minimax_m2_bf16", &r, "kv_cache_memory", "1GiB", "kv_cache_dtype", f8[i].in, NULL),
                         MR_OK);
        assert_int_equal(mr_resolution_exec(r)->kv_dtype, f8[i].f);
        assert_int_equal(mr_resolution_exec(r)->kv_token_bytes, 126976);
        assert_int_equal(mr_resolution_exec(r)->kv_blocks, 528);
        assert_string_equal(mr_resolution_value(r, MR_OPT_KV_CACHE_DTYPE), f8[i].in); /* as given */
        d = find_decl(r, "kv_cache_dtype"); /* as decided */
        assert_non_null(d);
        assert_string_equal(d->value, f8[i].name);
        d = find_decl(r, "kv_cache_memory");
        assert_non_null(d);
        assert_non_null(strstr(d->reason, "126976 bytes per token (62 layers x K,V x 8 kv heads x 128 dims x fp8_"));
        mr_resolution_free(r);
    }
    /* a budget below the running set: refused with both numbers, or the running set follows it */
    assert_int_equal(resolve("minimax_m2_bf16", &r, "max_batch_tokens", "8", "max_running_requests", "16",
                             "kv_cache_memory", "1GiB", NULL),
                     MR_ERESOLVE);
    assert_non_null(strstr(mr_resolution_error(r), "max_batch_tokens=8 is below max_running_requests=16"));
    mr_resolution_free(r);
    assert_int_equal(resolve("minimax_m2_bf16", &r, "max_batch_tokens", "8", "kv_cache_memory", "1GiB", NULL), MR_OK);
    assert_int_equal(mr_resolution_exec(r)->max_running_requests, 8);
    mr_resolution_free(r);
    /* auto: every running request at full context when that fits in half the free memory */
    assert_int_equal(resolve("minimax_m2_bf16", &r, "max_running_requests", "2", "context_length", "100", NULL), MR_OK);
    assert_int_equal(mr_resolution_exec(r)->kv_blocks, 2 * 7); /* 100 tokens = 7 blocks each */
    assert_int_equal(mr_resolution_exec(r)->max_batch_tokens, 512);
    mr_resolution_free(r);
    /* refusals */
    assert_int_equal(resolve("minimax_m2_bf16", &r, "kv_cache_memory", "1K", NULL), MR_ERESOLVE);
    assert_non_null(strstr(mr_resolution_error(r), "holds less than one KV block"));
    mr_resolution_free(r);
    assert_int_equal(resolve("minimax_m2_bf16", &r, "context_length", "200000", "kv_cache_memory", "1GiB", NULL),
                     MR_ERESOLVE);
    assert_non_null(strstr(mr_resolution_error(r), "context_length=200000 is above the model's max_position_embeddings (196608)"));
    mr_resolution_free(r);
    assert_int_equal(resolve("minimax_m2_bf16", &r, "kv_cache_memory", "1000000TiB", NULL), MR_ERESOLVE);
    assert_non_null(strstr(mr_resolution_error(r), "more than this machine's"));
    mr_resolution_free(r);
    /* the value syntax */
    uint64_t b;
    double f;
    assert_int_equal(mr_memory_size_parse("4GiB", &b, &f), MR_OK);
    assert_true(b == 4ull << 30 && f == 0.0);
    assert_int_equal(mr_memory_size_parse("4g", &b, &f), MR_OK);
    assert_true(b == 4ull << 30);
    assert_int_equal(mr_memory_size_parse("512M", &b, &f), MR_OK);
    assert_true(b == 512ull << 20);
    assert_int_equal(mr_memory_size_parse("2GB", &b, &f), MR_OK);
    assert_true(b == 2000000000ull);
    assert_int_equal(mr_memory_size_parse("123", &b, &f), MR_OK);
    assert_true(b == 123);
    assert_int_equal(mr_memory_size_parse("0.25", &b, &f), MR_OK);
    assert_true(b == 0 && f == 0.25);
    assert_int_equal(mr_memory_size_parse("auto", &b, &f), MR_OK);
    assert_true(b == 0 && f == 0.0);
    const char *bad[] = {"", "0", "1.5", "-1", "4gb", "4Q", "GiB", "0.0", "99999999999999999999", "20000000TiB"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (mr_memory_size_parse(bad[i], &b, &f) != MR_EINVAL) fail_msg("'%s' was accepted", bad[i]);
    mr_options o;
    assert_int_equal(mr_options_init(&o), MR_OK);
    assert_int_equal(mr_options_set(&o, "kv_cache_memory", "lots", MR_SRC_FLAG), MR_EINVAL);
    assert_int_equal(mr_options_set(&o, "kv_cache_dtype", "fp16", MR_SRC_FLAG), MR_EINVAL);
    mr_options_free(&o);
}

static void test_resolve_fault_injection(void **st) {
    (void)st;
    for (long k = 0; k < 400; k++) {
        mr_options o;
        assert_int_equal(mr_options_init(&o), MR_OK);
        assert_int_equal(mr_options_set(&o, "model", tu_data("configs/minimax_m2_nvfp4_hf"), MR_SRC_FLAG), MR_OK);
        mr_resolution *r = NULL;
        mr_debug_alloc_fail_after(k);
        mr_status s = mr_resolve(&o, &r);
        mr_debug_alloc_fail_after(-1);
        mr_resolution_free(r);
        mr_options_free(&o);
        if (s == MR_OK) return;
        assert_int_equal(s, MR_ENOMEM);
    }
    fail_msg("resolution never succeeded under fault injection");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_isa_level_is_the_table),
        cmocka_unit_test(test_log_minimax_nvfp4),
        cmocka_unit_test(test_log_mixtral),
        cmocka_unit_test(test_explicit_runner_kept_or_fails),
        cmocka_unit_test(test_explicit_other_options),
        cmocka_unit_test(test_minimax_auto_every_platform),
        cmocka_unit_test(test_other_archs_untouched),
        cmocka_unit_test(test_a2a_pairs),
        cmocka_unit_test(test_ep_size),
        cmocka_unit_test(test_publish_frozen),
        cmocka_unit_test(test_sparse_reads_no_tensor_data),
        cmocka_unit_test(test_tensor_dtype_contradiction),
        cmocka_unit_test(test_json_and_summary),
        cmocka_unit_test(test_engine_pass),
        cmocka_unit_test(test_resolve_fault_injection),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
