/* test_config.c — the options table and parser, the HF config reader
 * (every architecture, every quantization form, malformed configs) and the
 * exclusion-pattern rule. Expected values are the published config.json
 * values (spec/minimax-m2.md, the DeepSeek-V3/Mixtral/Qwen3 model cards),
 * written out here by hand, never computed by the code under test. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moerun/config.h"
#include "testutil.h"

/* ---- options ---- */

static void test_table_shape(void **st) {
    (void)st;
    assert_int_equal(mr_option_count(), MR_OPT_COUNT);
    for (int i = 0; i < mr_option_count(); i++) {
        const mr_option_def *d = mr_option_at(i);
        assert_non_null(d);
        assert_int_equal(d->id, i);
        /* env = MOERUN_ + upper(name); flag = -- + name with '_' -> '-' */
        char env[96], flag[96];
        snprintf(env, sizeof env, "MOERUN_");
        size_t k = strlen(env);
        for (const char *c = d->name; *c; c++) env[k++] = (char)toupper((unsigned char)*c);
        env[k] = 0;
        snprintf(flag, sizeof flag, "--");
        k = 2;
        for (const char *c = d->name; *c; c++) flag[k++] = *c == '_' ? '-' : *c;
        flag[k] = 0;
        assert_string_equal(d->env, env);
        assert_string_equal(d->flag, flag);
        assert_true(d->help && *d->help);
        /* the default passes its own check */
        assert_int_equal(mr_option_check(d, d->def), MR_OK);
        assert_ptr_equal(mr_option_find(d->name), d);
        assert_ptr_equal(mr_option_find(d->flag), d);
    }
    assert_null(mr_option_find("no_such_option"));
    /* sglang flag names */
    assert_non_null(mr_option_find("--moe-runner-backend"));
    assert_non_null(mr_option_find("--moe-a2a-backend"));
    assert_non_null(mr_option_find("--ep-size"));
    assert_non_null(mr_option_find("--quantization"));
}

static void test_values_checked(void **st) {
    (void)st;
    mr_options o;
    assert_int_equal(mr_options_init(&o), MR_OK);
    assert_int_equal(mr_options_set(&o, "moe_runner_backend", "turbo", MR_SRC_FLAG), MR_EINVAL);
    assert_non_null(strstr(mr_error_last(), "auto, reference, routed, fused"));
    assert_int_equal(mr_options_set(&o, "ep_size", "-1", MR_SRC_FLAG), MR_EINVAL);
    assert_int_equal(mr_options_set(&o, "ep_size", "two", MR_SRC_FLAG), MR_EINVAL);
    assert_int_equal(mr_options_set(&o, "cpu_mask", "avx9000", MR_SRC_FLAG), MR_EINVAL);
    assert_int_equal(mr_options_set(&o, "bogus", "x", MR_SRC_FLAG), MR_EINVAL);
    assert_non_null(strstr(mr_error_last(), "moe_runner_backend"));
    /* failed sets leave the value alone */
    assert_string_equal(mr_options_get(&o, MR_OPT_MOE_RUNNER_BACKEND), "auto");
    assert_false(mr_options_is_explicit(&o, MR_OPT_MOE_RUNNER_BACKEND));
    assert_int_equal(mr_options_set(&o, "--ep-size", "4", MR_SRC_FLAG), MR_OK);
    assert_int_equal(mr_options_get_int(&o, MR_OPT_EP_SIZE), 4);
    mr_options_free(&o);
}

static void test_precedence(void **st) {
    (void)st;
    setenv("MOERUN_MOE_RUNNER_BACKEND", "fused", 1);
    setenv("MOERUN_ROUTER_DTYPE", "bf16", 1);
    char a0[] = "resolve", a1[] = "--moe-runner-backend", a2[] = "routed", a3[] = "--explain", a4[] = "pos",
         a5[] = "--threads=3";
    char *argv[] = {a0, a1, a2, a3, a4, a5, NULL};
    int argc = 6;
    mr_options o;
    assert_int_equal(mr_options_init(&o), MR_OK);
    assert_int_equal(mr_options_parse(&o, &argc, argv, true), MR_OK);
    /* flag beats env; env beats default; default otherwise */
    assert_string_equal(mr_options_get(&o, MR_OPT_MOE_RUNNER_BACKEND), "routed");
    assert_int_equal(o.source[MR_OPT_MOE_RUNNER_BACKEND], MR_SRC_FLAG);
    assert_string_equal(mr_options_get(&o, MR_OPT_ROUTER_DTYPE), "bf16");
    assert_int_equal(o.source[MR_OPT_ROUTER_DTYPE], MR_SRC_ENV);
    assert_string_equal(mr_options_get(&o, MR_OPT_QUANTIZATION), "auto");
    assert_int_equal(o.source[MR_OPT_QUANTIZATION], MR_SRC_DEFAULT);
    assert_int_equal(mr_options_get_int(&o, MR_OPT_THREADS), 3);
    /* the command's own arguments are left, in order */
    assert_int_equal(argc, 3);
    assert_string_equal(argv[1], "--explain");
    assert_string_equal(argv[2], "pos");
    mr_options_free(&o);

    /* an on/off option (sglang's --enable-deterministic-inference): the flag alone is on and takes
     * nothing after it; =off and the environment give the value; anything else is refused */
    setenv("MOERUN_ENABLE_DETERMINISTIC_INFERENCE", "on", 1);
    char q0[] = "serve", q1[] = "--enable-deterministic-inference", q2[] = "pos", q3[] = "--threads", q4[] = "2";
    char *qv4[] = {q0, q1, q2, q3, q4, NULL};
    argc = 5;
    assert_int_equal(mr_options_init(&o), MR_OK);
    assert_int_equal(mr_options_parse(&o, &argc, qv4, true), MR_OK);
    assert_string_equal(mr_options_get(&o, MR_OPT_DETERMINISTIC_INFERENCE), "on");
    assert_int_equal(o.source[MR_OPT_DETERMINISTIC_INFERENCE], MR_SRC_FLAG);
    assert_int_equal(argc, 2);
    assert_string_equal(qv4[1], "pos");
    assert_int_equal(mr_options_get_int(&o, MR_OPT_THREADS), 2);
    mr_options_free(&o);
    char r0[] = "serve", r1[] = "--enable-deterministic-inference=off", r2[] = "--enable-deterministic-inference",
         r3[] = "off", r4[] = "pos";
    char *qv5[] = {r0, r1, NULL};
    argc = 2;
    assert_int_equal(mr_options_init(&o), MR_OK);
    assert_int_equal(mr_options_parse(&o, &argc, qv5, true), MR_OK);
    assert_string_equal(mr_options_get(&o, MR_OPT_DETERMINISTIC_INFERENCE), "off"); /* the flag beats the env */
    mr_options_free(&o);
    char *qv5b[] = {r0, r2, r3, r4, NULL}; /* a following on / off is the value; anything else is not */
    argc = 4;
    assert_int_equal(mr_options_init(&o), MR_OK);
    assert_int_equal(mr_options_parse(&o, &argc, qv5b, true), MR_OK);
    assert_string_equal(mr_options_get(&o, MR_OPT_DETERMINISTIC_INFERENCE), "off");
    assert_int_equal(argc, 2);
    assert_string_equal(qv5b[1], "pos");
    mr_options_free(&o);
    char t0[] = "serve";
    char *qv6[] = {t0, NULL};
    argc = 1;
    assert_int_equal(mr_options_init(&o), MR_OK);
    assert_int_equal(mr_options_parse(&o, &argc, qv6, true), MR_OK);
    assert_string_equal(mr_options_get(&o, MR_OPT_DETERMINISTIC_INFERENCE), "on");
    assert_int_equal(o.source[MR_OPT_DETERMINISTIC_INFERENCE], MR_SRC_ENV);
    mr_options_free(&o);
    unsetenv("MOERUN_ENABLE_DETERMINISTIC_INFERENCE");
    char u0[] = "serve", u1[] = "--enable-deterministic-inference=yes";
    char *qv7[] = {u0, u1, NULL};
    argc = 2;
    assert_int_equal(mr_options_init(&o), MR_OK);
    assert_int_equal(mr_options_parse(&o, &argc, qv7, true), MR_EINVAL);
    assert_non_null(strstr(mr_error_last(), "off, on"));
    mr_options_free(&o);

    /* strict mode: a leftover flag is an error naming the valid ones */
    char b0[] = "resolve", b1[] = "--moe-runner", b2[] = "fused";
    char *argv2[] = {b0, b1, b2, NULL};
    argc = 3;
    assert_int_equal(mr_options_init(&o), MR_OK);
    assert_int_equal(mr_options_parse(&o, &argc, argv2, false), MR_EINVAL);
    assert_non_null(strstr(mr_error_last(), "--moe-runner-backend"));
    mr_options_free(&o);

    /* a bad environment value is an error naming the variable */
    unsetenv("MOERUN_MOE_RUNNER_BACKEND");
    setenv("MOERUN_QUANTIZATION", "int3", 1);
    char c0[] = "x";
    char *argv3[] = {c0, NULL};
    argc = 1;
    assert_int_equal(mr_options_init(&o), MR_OK);
    assert_int_equal(mr_options_parse(&o, &argc, argv3, false), MR_EINVAL);
    assert_non_null(strstr(mr_error_last(), "MOERUN_QUANTIZATION"));
    assert_non_null(strstr(mr_error_last(), "auto, bf16, fp8, modelopt_fp4"));
    mr_options_free(&o);
    unsetenv("MOERUN_QUANTIZATION");
    unsetenv("MOERUN_ROUTER_DTYPE");

    /* a flag without its value */
    char d0[] = "x", d1[] = "--device";
    char *argv4[] = {d0, d1, NULL};
    argc = 2;
    assert_int_equal(mr_options_init(&o), MR_OK);
    assert_int_equal(mr_options_parse(&o, &argc, argv4, false), MR_EINVAL);
    assert_non_null(strstr(mr_error_last(), "--device needs a value"));
    mr_options_free(&o);
}

/* docs/options.md is generated from the table and committed. */
static void test_docs_options_md_current(void **st) {
    (void)st;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    mr_options_print_markdown(f);
    fclose(f);
    size_t flen = 0;
    char *file = tu_read_file(tu_data("../../docs/options.md"), &flen);
    assert_non_null(file);
    if (flen != len || memcmp(file, buf, len) != 0)
        fail_msg("docs/options.md is stale: regenerate with `moerun resolve --print-options-md > docs/options.md`");
    free(file);
    free(buf);
}

/* ---- the HF config reader ---- */

static void load(const char *name, mr_model_desc *m) {
    char path[512];
    snprintf(path, sizeof path, "configs/%s", name);
    mr_status s = mr_model_desc_load(tu_data(path), m);
    if (s != MR_OK) fail_msg("%s: %s", name, mr_error_last());
}

static void test_minimax_m2_bf16(void **st) {
    (void)st;
    mr_model_desc m;
    load("minimax_m2_bf16", &m);
    assert_int_equal(m.arch, MR_ARCH_MINIMAX_M2);
    assert_string_equal(m.architecture, "MiniMaxM2ForCausalLM");
    assert_string_equal(m.model_type, "minimax_m2");
    assert_int_equal(m.hidden, 3072);
    assert_int_equal(m.n_layers, 62);
    assert_int_equal(m.n_heads, 48);
    assert_int_equal(m.n_kv_heads, 8);
    assert_int_equal(m.head_dim, 128);
    assert_int_equal(m.rotary_dim, 64);
    assert_int_equal(m.vocab, 200064);
    assert_int_equal(m.moe_inter, 1536);
    assert_int_equal(m.shared_inter, 0);
    assert_int_equal(m.n_experts, 256);
    assert_int_equal(m.top_k, 8);
    assert_int_equal(m.n_mtp, 3);
    assert_int_equal(m.max_pos, 196608);
    assert_true(m.rope_theta == 5000000.0);
    assert_true(m.rms_eps == 1e-6);
    assert_int_equal(m.qk_norm, MR_QK_NORM_PER_LAYER);
    assert_false(m.tie_embeddings);
    assert_int_equal(m.routing, MR_ROUTING_MINIMAX2);
    assert_true(m.routing_bias);
    assert_int_equal(m.n_group, 0);
    assert_true(m.routed_scale == 1.0f);
    assert_int_equal(m.quant.kind, MR_QUANT_NONE);
    assert_int_equal(m.quant.n_exclude, 0);
    mr_model_desc_free(&m);
}

static void test_minimax_m2_fp8(void **st) {
    (void)st;
    mr_model_desc m;
    load("minimax_m2_fp8", &m);
    assert_int_equal(m.quant.kind, MR_QUANT_FP8_BLOCK);
    assert_int_equal(m.quant.form, MR_QUANT_FORM_FP8);
    assert_int_equal(m.quant.block_n, 128);
    assert_int_equal(m.quant.block_k, 128);
    assert_int_equal(m.quant.n_exclude, 3);
    assert_string_equal(m.quant.exclude[0], "gate");
    assert_string_equal(m.quant.exclude[2], "lm_head");
    assert_true(mr_quant_is_excluded(&m.quant, "model.layers.7.block_sparse_moe.gate.weight"));
    assert_true(mr_quant_is_excluded(&m.quant, "model.layers.7.block_sparse_moe.e_score_correction_bias"));
    assert_true(mr_quant_is_excluded(&m.quant, "lm_head.weight"));
    assert_false(mr_quant_is_excluded(&m.quant, "model.layers.7.block_sparse_moe.experts.3.w1.weight"));
    assert_false(mr_quant_is_excluded(&m.quant, "model.layers.7.self_attn.q_proj.weight"));
    mr_model_desc_free(&m);
}

static void check_nvfp4(const char *name, mr_quant_form form) {
    mr_model_desc m;
    load(name, &m);
    assert_int_equal(m.quant.kind, MR_QUANT_NVFP4);
    assert_int_equal(m.quant.form, form);
    assert_int_equal(m.quant.group_size, 16);
    assert_int_equal(m.quant.n_exclude, 5);
    assert_int_equal(m.routing, MR_ROUTING_MINIMAX2);
    /* experts quantized; attention, gate, bias, embeddings, lm_head not */
    assert_false(mr_quant_is_excluded(&m.quant, "model.layers.0.block_sparse_moe.experts.0.w2.weight"));
    assert_true(mr_quant_is_excluded(&m.quant, "model.layers.61.self_attn.o_proj.weight"));
    assert_true(mr_quant_is_excluded(&m.quant, "model.layers.61.self_attn.q_norm.weight"));
    assert_true(mr_quant_is_excluded(&m.quant, "model.layers.3.block_sparse_moe.gate.weight"));
    assert_true(mr_quant_is_excluded(&m.quant, "model.layers.3.block_sparse_moe.e_score_correction_bias"));
    assert_true(mr_quant_is_excluded(&m.quant, "model.embed_tokens.weight"));
    assert_true(mr_quant_is_excluded(&m.quant, "lm_head.weight"));
    mr_model_desc_free(&m);
}

static void test_minimax_m2_nvfp4_forms(void **st) {
    (void)st;
    check_nvfp4("minimax_m2_nvfp4_flat", MR_QUANT_FORM_MODELOPT_FLAT);
    check_nvfp4("minimax_m2_nvfp4_hf", MR_QUANT_FORM_MODELOPT_HF);
    check_nvfp4("minimax_m2_nvfp4_groups", MR_QUANT_FORM_MODELOPT_GROUPS);
}

static void test_other_architectures(void **st) {
    (void)st;
    mr_model_desc m;
    load("deepseek_v3_fp8", &m);
    assert_int_equal(m.arch, MR_ARCH_DEEPSEEK_V3);
    assert_int_equal(m.routing, MR_ROUTING_DEEPSEEK_V3);
    assert_int_equal(m.n_group, 8);
    assert_int_equal(m.topk_group, 4);
    assert_true(m.routed_scale == 2.5f);
    assert_int_equal(m.n_experts, 256);
    assert_int_equal(m.top_k, 8);
    assert_int_equal(m.moe_inter, 2048);
    assert_int_equal(m.shared_inter, 2048);
    assert_int_equal(m.n_dense_layers, 3);
    assert_int_equal(m.head_dim, 192);
    assert_int_equal(m.rotary_dim, 64);
    assert_int_equal(m.n_mtp, 1);
    assert_int_equal(m.quant.kind, MR_QUANT_FP8_BLOCK);
    assert_int_equal(m.n_eos, 1);
    assert_int_equal(m.eos_ids[0], 1);
    mr_model_desc_free(&m);

    load("mixtral_bf16", &m);
    assert_int_equal(m.arch, MR_ARCH_MIXTRAL);
    assert_int_equal(m.routing, MR_ROUTING_RENORMALIZE);
    assert_int_equal(m.head_dim, 128);
    assert_int_equal(m.rotary_dim, 128);
    assert_int_equal(m.n_experts, 8);
    assert_int_equal(m.top_k, 2);
    assert_int_equal(m.moe_inter, 14336);
    assert_int_equal(m.quant.kind, MR_QUANT_NONE);
    mr_model_desc_free(&m);

    load("qwen3_moe_bf16", &m);
    assert_int_equal(m.arch, MR_ARCH_QWEN3_MOE);
    assert_int_equal(m.routing, MR_ROUTING_RENORMALIZE);
    assert_int_equal(m.n_experts, 128);
    assert_int_equal(m.moe_inter, 768);
    assert_int_equal(m.qk_norm, MR_QK_NORM_PER_HEAD);
    mr_model_desc_free(&m);

    load("qwen3_moe_nonorm", &m);
    assert_int_equal(m.routing, MR_ROUTING_SOFTMAX_TOPK);
    mr_model_desc_free(&m);
}

typedef struct {
    const char *dir;
    mr_status status;
    const char *needle1, *needle2;
} bad_case;

static void test_malformed(void **st) {
    (void)st;
    static const bad_case cases[] = {
        {"bad_missing_experts", MR_ECONFIG, "num_local_experts", "missing"},
        {"bad_unknown_arch", MR_EUNSUPPORTED, "LlamaForCausalLM", "MiniMaxM2ForCausalLM, DeepseekV3ForCausalLM"},
        {"bad_routing_combo", MR_ECONFIG, "softmax scoring with a correction bias", "there is no default"},
        {"bad_missing_bias", MR_ECONFIG, "correction bias exists is not stated", "use_routing_bias absent"},
        {"bad_block_size", MR_EUNSUPPORTED, "weight_block_size [64, 64]", "[128, 128]"},
        {"bad_contradictory_quant", MR_ECONFIG, "contradictory quantization", "hf_quant_config.json says modelopt_fp4"},
        {"bad_fp8_nvfp4", MR_ECONFIG, "contradictory quantization", "quant_algo = NVFP4"},
        {"bad_qwen3_no_norm", MR_ECONFIG, "norm_topk_prob is missing", "scoring_func=softmax"},
        {"bad_deepseek_nonorm", MR_ECONFIG, "without renormalization", "n_group=8"},
        {"bad_json", MR_ECONFIG, "config.json: not valid JSON", "line"},
        {"no_such_dir", MR_EIO, "no config.json", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[256];
        snprintf(path, sizeof path, "configs/%s", cases[i].dir);
        mr_model_desc m;
        mr_status s = mr_model_desc_load(tu_data(path), &m);
        if (s != cases[i].status) fail_msg("%s: status %d (%s), expected %d", cases[i].dir, s, mr_error_last(), cases[i].status);
        const char *e = mr_error_last();
        if (!strstr(e, cases[i].needle1) || (cases[i].needle2 && !strstr(e, cases[i].needle2)))
            fail_msg("%s: message lacks '%s'/'%s': %s", cases[i].dir, cases[i].needle1,
                     cases[i].needle2 ? cases[i].needle2 : "", e);
        /* the folder is named in the message */
        assert_non_null(strstr(e, cases[i].dir));
        mr_model_desc_free(&m);
    }
}

/* Inline variations of the MiniMax-M2 config. */
static const char *mm_base =
    "{\"architectures\": [\"MiniMaxM2ForCausalLM\"], \"model_type\": \"minimax_m2\", \"hidden_size\": 64,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16,"
    " \"vocab_size\": 100, \"intermediate_size\": 32, \"num_local_experts\": 8, \"num_experts_per_tok\": 2,"
    " \"rope_theta\": 10000, \"rms_norm_eps\": 1e-6, \"scoring_func\": \"sigmoid\", \"use_routing_bias\": true%s}";

static mr_status parse_mm(const char *extra, const char *hfq, mr_model_desc *m) {
    char buf[2048];
    snprintf(buf, sizeof buf, mm_base, extra);
    return mr_model_desc_parse(buf, hfq, m);
}

static void test_inline_variations(void **st) {
    (void)st;
    mr_model_desc m;
    /* rotary from partial_rotary_factor */
    assert_int_equal(parse_mm(", \"partial_rotary_factor\": 0.5", NULL, &m), MR_OK);
    assert_int_equal(m.rotary_dim, 8);
    mr_model_desc_free(&m);
    /* both, agreeing */
    assert_int_equal(parse_mm(", \"partial_rotary_factor\": 0.5, \"rotary_dim\": 8", NULL, &m), MR_OK);
    mr_model_desc_free(&m);
    /* both, contradicting */
    assert_int_equal(parse_mm(", \"partial_rotary_factor\": 0.25, \"rotary_dim\": 8", NULL, &m), MR_ECONFIG);
    assert_non_null(strstr(mr_error_last(), "rotary_dim"));
    /* RoPE: plain (absent, null, type "default", no type and factor 1) is taken; a scaled
     * RoPE is another model and refused, whichever key (transformers 4 rope_scaling, 5
     * rope_parameters) */
    const char *plain[] = {", \"rope_scaling\": null", ", \"rope_scaling\": {\"type\": \"default\"}",
                           ", \"rope_scaling\": {\"rope_type\": \"default\", \"factor\": 1.0}",
                           ", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000}",
                           ", \"rope_parameters\": {}",
                           ", \"rope_scaling\": {\"rope_type\": \"default\", \"factor\": 2.0}", /* default ignores it */
                           ", \"rope_scaling\": {\"factor\": 1}"};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        if (parse_mm(plain[i], NULL, &m) != MR_OK) fail_msg("%s: %s", plain[i], mr_error_last());
        assert_true(m.rope_theta == 10000.0);
        mr_model_desc_free(&m);
    }
    const struct { const char *extra, *needle; mr_status st; } scaled[] = {
        {", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0}", "\"yarn\"", MR_EUNSUPPORTED},
        {", \"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 10000}", "\"llama3\"", MR_EUNSUPPORTED},
        {", \"rope_scaling\": {\"factor\": 8}", "has factor and no rope_type", MR_EUNSUPPORTED},
        {", \"rope_scaling\": {\"original_max_position_embeddings\": 4096}", "original_max_position_embeddings",
         MR_EUNSUPPORTED},
        {", \"rope_scaling\": \"yarn\"", "an object or null", MR_ECONFIG},
        {", \"rope_scaling\": {\"type\": 3}", "must be a string", MR_ECONFIG},
        {", \"rope_scaling\": null, \"rope_parameters\": {\"rope_type\": \"default\"}, \"rope_scaling\": {}",
         "not valid JSON", MR_ECONFIG}, /* duplicate key */
        {", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 5e6}", "contradicts", MR_ECONFIG},
        {", \"rope_scaling\": {\"type\": \"default\"}, \"rope_parameters\": {\"rope_type\": \"default\"}",
         "both rope_scaling and rope_parameters", MR_ECONFIG},
    };
    for (size_t i = 0; i < sizeof scaled / sizeof scaled[0]; i++) {
        mr_status sst = parse_mm(scaled[i].extra, NULL, &m);
        if (sst != scaled[i].st || !strstr(mr_error_last(), scaled[i].needle))
            fail_msg("%s: status %d, want %d with '%s': %s", scaled[i].extra, sst, scaled[i].st, scaled[i].needle,
                     mr_error_last());
        if (sst == MR_OK) mr_model_desc_free(&m);
    }
    /* the experts' activation (transformers: ACT2FN[hidden_act]): SiLU or its alias swish */
    assert_int_equal(parse_mm(", \"hidden_act\": \"swish\"", NULL, &m), MR_OK);
    mr_model_desc_free(&m);
    assert_int_equal(parse_mm(", \"hidden_act\": \"gelu\"", NULL, &m), MR_EUNSUPPORTED);
    assert_non_null(strstr(mr_error_last(), "\"gelu\""));
    assert_int_equal(parse_mm(", \"hidden_act\": 1", NULL, &m), MR_ECONFIG);
    /* read by transformers' Mixtral, not its MiniMax-M2 (a plain causal mask): ignored here too */
    assert_int_equal(parse_mm(", \"sliding_window\": 128, \"layer_types\": [\"sliding_attention\"]", NULL, &m), MR_OK);
    mr_model_desc_free(&m);
    /* transformers 5: rope_theta and partial_rotary_factor only inside rope_parameters */
    {
        const char *t = "{\"architectures\": [\"MiniMaxM2ForCausalLM\"], \"hidden_size\": 64, \"num_hidden_layers\": 2,"
                        " \"num_attention_heads\": 4, \"head_dim\": 16, \"vocab_size\": 100, \"intermediate_size\": 32,"
                        " \"num_local_experts\": 8, \"num_experts_per_tok\": 2, \"rms_norm_eps\": 1e-6,"
                        " \"scoring_func\": \"sigmoid\", \"use_routing_bias\": true, \"rope_parameters\":"
                        " {\"rope_type\": \"default\", \"rope_theta\": 5000000, \"partial_rotary_factor\": 0.5}}";
        assert_int_equal(mr_model_desc_parse(t, NULL, &m), MR_OK);
        assert_true(m.rope_theta == 5000000.0);
        assert_int_equal(m.rotary_dim, 8);
        mr_model_desc_free(&m);
    }
    /* neither: the whole head */
    assert_int_equal(parse_mm("", NULL, &m), MR_OK);
    assert_int_equal(m.rotary_dim, 16);
    assert_int_equal(m.n_eos, 0);
    mr_model_desc_free(&m);
    /* eos ids as a list */
    assert_int_equal(parse_mm(", \"eos_token_id\": [7, 9]", NULL, &m), MR_OK);
    assert_int_equal(m.n_eos, 2);
    assert_int_equal(m.eos_ids[1], 9);
    mr_model_desc_free(&m);
    /* repeated ids once; an id that is not a token id is refused */
    assert_int_equal(parse_mm(", \"eos_token_id\": [7, 9, 7]", NULL, &m), MR_OK);
    assert_int_equal(m.n_eos, 2);
    mr_model_desc_free(&m);
    assert_int_equal(parse_mm(", \"eos_token_id\": [7, -1]", NULL, &m), MR_ECONFIG);
    assert_non_null(strstr(mr_error_last(), "-1 is not a token id"));
    /* wrong types name the field */
    assert_int_equal(parse_mm(", \"rope_theta\": \"big\"", NULL, &m), MR_ECONFIG);
    mr_model_desc_free(&m);
    /* duplicate key rejected by the JSON reader */
    assert_int_equal(parse_mm(", \"hidden_size\": 128", NULL, &m), MR_ECONFIG);
    /* sigmoid without bias, with norm: sigmoid_renorm; grouped + bias: deepseek_v3 needs the scale */
    assert_int_equal(parse_mm(", \"n_group\": 2, \"topk_group\": 1", NULL, &m), MR_ECONFIG);
    assert_non_null(strstr(mr_error_last(), "routed_scaling_factor"));
    assert_int_equal(parse_mm(", \"n_group\": 2, \"topk_group\": 1, \"routed_scaling_factor\": 2.0", NULL, &m), MR_OK);
    assert_int_equal(m.routing, MR_ROUTING_DEEPSEEK_V3);
    mr_model_desc_free(&m);
    assert_int_equal(parse_mm(", \"n_group\": 2, \"topk_group\": 3, \"routed_scaling_factor\": 2.0", NULL, &m),
                     MR_ECONFIG);
    assert_int_equal(parse_mm(", \"scoring_func\": \"tanh\"", NULL, &m), MR_ECONFIG); /* duplicate key, too */
    /* unknown scoring */
    {
        const char *t = "{\"architectures\": [\"MiniMaxM2ForCausalLM\"], \"hidden_size\": 64, \"num_hidden_layers\": 2,"
                        " \"num_attention_heads\": 4, \"head_dim\": 16, \"vocab_size\": 100, \"intermediate_size\": 32,"
                        " \"num_local_experts\": 8, \"num_experts_per_tok\": 2, \"rope_theta\": 1e4, \"rms_norm_eps\": 1e-6,"
                        " \"scoring_func\": \"tanh\", \"use_routing_bias\": true}";
        assert_int_equal(mr_model_desc_parse(t, NULL, &m), MR_ECONFIG);
        assert_non_null(strstr(mr_error_last(), "unknown scoring_func"));
    }
    /* linear attention layers (MiniMax-M1 style) */
    assert_int_equal(parse_mm(", \"attn_type_list\": [1, 0]", NULL, &m), MR_EUNSUPPORTED);
    /* ModelOpt per-tensor FP8 is refused, NVFP4 group size must be 16 */
    assert_int_equal(parse_mm(", \"quantization_config\": {\"quant_method\": \"modelopt\", \"quant_algo\": \"FP8\"}", NULL, &m),
                     MR_EUNSUPPORTED);
    assert_int_equal(parse_mm(", \"quantization_config\": {\"quant_method\": \"modelopt\", \"quant_algo\": \"NVFP4\", "
                              "\"group_size\": 32}",
                              NULL, &m),
                     MR_ECONFIG);
    assert_int_equal(parse_mm(", \"quantization_config\": {\"quant_method\": \"awq\"}", NULL, &m), MR_EUNSUPPORTED);
    assert_non_null(strstr(mr_error_last(), "supported: fp8, modelopt"));
    /* quant_method modelopt with neither form and no hf_quant_config.json */
    assert_int_equal(parse_mm(", \"quantization_config\": {\"quant_method\": \"modelopt\"}", NULL, &m), MR_ECONFIG);
    /* ... but with hf_quant_config.json it is the hf form */
    assert_int_equal(parse_mm(", \"quantization_config\": {\"quant_method\": \"modelopt\"}",
                              "{\"producer\": {\"name\": \"modelopt\"}, \"quantization\": {\"quant_algo\": \"NVFP4\"}}", &m),
                     MR_OK);
    assert_int_equal(m.quant.kind, MR_QUANT_NVFP4);
    assert_int_equal(m.quant.form, MR_QUANT_FORM_MODELOPT_HF);
    mr_model_desc_free(&m);
    /* config_groups with 8-bit weights: not NVFP4 */
    assert_int_equal(parse_mm(", \"quantization_config\": {\"quant_method\": \"modelopt\", \"config_groups\": {\"g\": "
                              "{\"weights\": {\"num_bits\": 8, \"type\": \"float\"}}}}",
                              NULL, &m),
                     MR_EUNSUPPORTED);
    /* FP8 without a block size: per-tensor FP8 refused */
    assert_int_equal(parse_mm(", \"quantization_config\": {\"quant_method\": \"fp8\"}", NULL, &m), MR_ECONFIG);
    assert_non_null(strstr(mr_error_last(), "weight_block_size"));
}

/* The wildcard rule on its own. */
static void test_exclusion_rule(void **st) {
    (void)st;
    char p0[] = "gate", p1[] = "model.layers.*.self_attn*", p2[] = "*.mlp.experts.1?.w2", p3[] = "lm_head";
    char *pats[] = {p0, p1, p2, p3};
    mr_quant_desc q;
    memset(&q, 0, sizeof q);
    q.exclude = pats;
    q.n_exclude = 4;
    struct {
        const char *name;
        bool excluded;
    } cases[] = {
        {"model.layers.0.block_sparse_moe.gate.weight", true}, /* whole component */
        {"model.layers.0.mlp.gate_proj.weight", false},        /* not a substring match */
        {"gate", true},
        {"model.layers.3.self_attn.q_proj.weight", true}, /* '*' crosses dots */
        {"model.layers.3.self_attn_sinks", true},          /* self_attn* matches self_attn_sinks */
        {"model.layers.3.self_attention.o.weight", false}, /* self_atte... is not self_attn... */
        {"model.layers.3.mlp.experts.12.w2.weight", true},
        {"model.layers.3.mlp.experts.2.w2.weight", false},
        {"model.layers.3.mlp.experts.123.w2.weight", false},
        {"lm_head.weight", true},
        {"model.lm_head_extra.weight", false},
        {"model.norm.weight", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (mr_quant_is_excluded(&q, cases[i].name) != cases[i].excluded)
            fail_msg("%s: expected %s", cases[i].name, cases[i].excluded ? "excluded" : "quantized");
    assert_false(mr_quant_is_excluded(NULL, "x"));
}

static void test_load_fault_injection(void **st) {
    (void)st;
    /* every allocation failure is a clean error, no leak (ASan checks) */
    for (long n = 0; n < 64; n++) {
        mr_model_desc m;
        mr_debug_alloc_fail_after(n);
        mr_status s = mr_model_desc_load(tu_data("configs/minimax_m2_nvfp4_flat"), &m);
        mr_debug_alloc_fail_after(-1);
        if (s == MR_OK) {
            mr_model_desc_free(&m);
            break;
        }
        assert_int_equal(s, MR_ENOMEM);
    }
}

/* generation_config.json's eos_token_id joins config.json's (the same
 * parser), each id once, config.json's first; a broken file is an error. */
static void test_generation_config_eos(void **st) {
    (void)st;
    char *dir = tu_tmpdir("gen_eos");
    assert_non_null(dir);
    char p[4200];
    size_t n;
    char *cfg = tu_read_file(tu_data("configs/minimax_m2_bf16/config.json"), &n);
    assert_non_null(cfg);
    /* config.json with eos [200020, 3], generation_config.json with [3, 4, 3]: 200020, 3, 4 */
    char *brace = memchr(cfg, '{', n); /* the buffer is not NUL-terminated */
    assert_non_null(brace);
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fprintf(f, "{\"eos_token_id\": [200020, 3], %.*s", (int)(n - (size_t)(brace + 1 - cfg)), brace + 1);
    fclose(f);
    free(cfg);
    cfg = tu_read_file(p, &n);
    snprintf(p, sizeof p, "%s/generation_config.json", dir);
    const char *gen = "{\"bos_token_id\": 1, \"eos_token_id\": [3, 4, 3]}";
    assert_int_equal(tu_write_file(p, gen, strlen(gen)), 0);
    mr_model_desc d, c0;
    assert_int_equal(mr_model_desc_load(dir, &d), MR_OK);
    assert_int_equal(mr_model_desc_parse(cfg, NULL, &c0), MR_OK); /* config.json alone */
    assert_int_equal(c0.n_eos, 2);
    assert_int_equal(d.n_eos, 3);
    assert_int_equal(d.eos_ids[0], 200020);
    assert_int_equal(d.eos_ids[1], 3);
    assert_int_equal(d.eos_ids[2], 4);
    mr_model_desc_free(&d);
    mr_model_desc_free(&c0);
    assert_int_equal(tu_write_file(p, "{", 1), 0);
    assert_int_equal(mr_model_desc_load(dir, &d), MR_ECONFIG);
    assert_non_null(strstr(mr_error_last(), "generation_config.json: not valid JSON"));
    const char *bad = "{\"eos_token_id\": \"x\"}";
    assert_int_equal(tu_write_file(p, bad, strlen(bad)), 0);
    assert_int_equal(mr_model_desc_load(dir, &d), MR_ECONFIG);
    assert_non_null(strstr(mr_error_last(), "generation_config.json: field 'eos_token_id'"));
    free(cfg);
    tu_rmtree(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_shape),
        cmocka_unit_test(test_generation_config_eos),
        cmocka_unit_test(test_values_checked),
        cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_docs_options_md_current),
        cmocka_unit_test(test_minimax_m2_bf16),
        cmocka_unit_test(test_minimax_m2_fp8),
        cmocka_unit_test(test_minimax_m2_nvfp4_forms),
        cmocka_unit_test(test_other_architectures),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_inline_variations),
        cmocka_unit_test(test_exclusion_rule),
        cmocka_unit_test(test_load_fault_injection),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
