/* test_model.c — the MiniMax-M2 model: forward pass against the Hugging Face
 * transformers oracle (tools/oracle/gen_minimax_m2.py -> tests/data/model/tiny),
 * batching and chunking, the KV-cache capacity error, loader errors (missing
 * tensor, wrong shape, wrong dtype, truncated file, NVFP4 input_scale
 * fallback, allocation failures), sampler properties, and the engine's prompt
 * log-probabilities against the same oracle.
 * Runs once per kernel level (generic / AVX2 / AVX-512, MOERUN_TEST_ISA; testutil.h). */
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine_internal.h"
#include "model/model_internal.h"
#include "moerun/config.h"
#include "moerun/engine.h"
#include "moerun/io.h"
#include "moerun/model.h"
#include "testutil.h"

/* ---- golden data ---- */
typedef struct {
    int L;
    int32_t ids[64];
    int32_t gen[64];
    float *logits; /* [L + steps][V] */
} gold_prompt;
typedef struct {
    int n, V, steps;
    gold_prompt p[8];
    void *blob;
} golden;

static void golden_load_file(golden *g, const char *name) {
    size_t len = 0;
    unsigned char *b = tu_read_file(tu_data(name), &len);
    assert_non_null(b);
    assert_memory_equal(b, "MRGOLD1\0", 8);
    size_t o = 8;
    int32_t h[3];
    memcpy(h, b + o, 12);
    o += 12;
    g->n = h[0];
    g->V = h[1];
    g->steps = h[2];
    assert_true(g->n > 0 && g->n <= 8 && g->steps < 63);
    for (int i = 0; i < g->n; i++) {
        gold_prompt *p = &g->p[i];
        memcpy(&p->L, b + o, 4);
        o += 4;
        assert_true(p->L > 0 && p->L <= 64);
        memcpy(p->ids, b + o, 4 * (size_t)p->L);
        o += 4 * (size_t)p->L;
        memcpy(p->gen, b + o, 4 * (size_t)(g->steps + 1));
        o += 4 * (size_t)(g->steps + 1);
        p->logits = (float *)(b + o); /* 4-byte aligned: every field before is 4 bytes */
        o += 4 * (size_t)(p->L + g->steps) * (size_t)g->V;
    }
    assert_int_equal(o, len);
    g->blob = b;
}
static void golden_load(golden *g) { golden_load_file(g, "model/tiny/golden.bin"); }

/* Tolerance of the oracle comparison. Both sides compute in fp32 on the same
 * bf16-exact weights, so they differ only by summation order and libm
 * (expf/cosf): about K * 2^-24 relative per dot product, ~1e-5 on logits of
 * magnitude ~5 after two layers. 2e-3 is far above that and still half a bf16
 * ulp at 1.0 (2^-8 = 3.9e-3): any activation silently rounded to bf16, a
 * wrong RoPE dim, a per-head QK-norm or a wrong expert would exceed it. */
#define ORACLE_TOL 2e-3f

static float max_abs_diff(const float *a, const float *b, int64_t n) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) m = d; /* NaN propagates */
    }
    return m;
}

/* Runs the golden prompts through runner (batched prefill with every
 * position's logits, then teacher-forced batched decode steps) and compares.
 * Returns false when the runner refused the model at open (MR_ERESOLVE). */
/* what an oracle run measured: the largest logit error, the mean one, the rows (logit vectors) with an
 * error above ORACLE_TOL of all rows */
typedef struct {
    float worst;
    double mean;
    int rows_over, rows;
} oracle_stats;

static void stats_row(oracle_stats *o, const float *a, const float *b, int64_t n) {
    const float d = max_abs_diff(a, b, n);
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += fabs((double)a[i] - b[i]);
    o->mean += sum / (double)n;
    o->rows_over += !(d <= ORACLE_TOL);
    o->rows++;
}

static bool oracle_run_stats(const char *runner, int64_t max_tokens, int steps, const char *file, mr_format dense,
                             float *worst_out, int *argmax_diff, oracle_stats *os) {
    golden g;
    golden_load_file(&g, file);
    mr_model_opts o = {.max_batch = g.n, .max_ctx = 64, .max_tokens = max_tokens, .runner = runner, .quiet = true,
                       .dense_act_dtype = dense};
    mr_model *m = NULL;
    mr_status st = mr_model_open(tu_data("model/tiny"), &o, &m);
    if (st == MR_ERESOLVE) {
        free(g.blob);
        return false;
    }
    if (st) fprintf(stderr, "open: %s\n", mr_error_last());
    assert_int_equal(st, MR_OK);
    int V = g.V;
    assert_int_equal(mr_model_config_of(m)->vocab, V);
    int seq[8];
    int64_t n_tok[8], total = 0;
    int32_t toks[512];
    for (int i = 0; i < g.n; i++) {
        seq[i] = i;
        n_tok[i] = g.p[i].L;
        memcpy(toks + total, g.p[i].ids, 4 * (size_t)g.p[i].L);
        total += g.p[i].L;
    }
    float *lg = malloc((size_t)total * (size_t)V * sizeof(float));
    mr_batch b = {.n_seq = g.n, .seq = seq, .n_tok = n_tok, .tokens = toks, .all_logits = true};
    assert_int_equal(mr_model_forward(m, &b, lg), MR_OK);
    float worst = 0.0f;
    int64_t row = 0;
    for (int i = 0; i < g.n; i++) {
        for (int t = 0; t < g.p[i].L; t++, row++) {
            float d = max_abs_diff(lg + row * V, g.p[i].logits + (size_t)t * (size_t)V, V);
            if (os) stats_row(os, lg + row * V, g.p[i].logits + (size_t)t * (size_t)V, V);
            if (d > worst) worst = d;
        }
        /* greedy token from the prefill */
        *argmax_diff += mr_argmax(lg + (row - 1) * V, V) != g.p[i].gen[0];
    }
    /* decode: every sequence one token per step, fed the golden greedy tokens */
    for (int s = 1; s <= steps; s++) {
        for (int i = 0; i < g.n; i++) {
            n_tok[i] = 1;
            toks[i] = g.p[i].gen[s - 1];
        }
        mr_batch db = {.n_seq = g.n, .seq = seq, .n_tok = n_tok, .tokens = toks};
        assert_int_equal(mr_model_forward(m, &db, lg), MR_OK);
        for (int i = 0; i < g.n; i++) {
            const float *ref = g.p[i].logits + (size_t)(g.p[i].L + s - 1) * (size_t)V;
            float d = max_abs_diff(lg + (size_t)i * (size_t)V, ref, V);
            if (os) stats_row(os, lg + (size_t)i * (size_t)V, ref, V);
            if (d > worst) worst = d;
            *argmax_diff += mr_argmax(lg + (size_t)i * (size_t)V, V) != g.p[i].gen[s]; /* greedy identical */
        }
    }
    for (int i = 0; i < g.n; i++) assert_int_equal(mr_model_seq_len(m, i), g.p[i].L + steps);
    free(lg);
    mr_model_close(m);
    free(g.blob);
    *worst_out = worst;
    if (os) os->worst = worst, os->mean /= os->rows > 0 ? os->rows : 1;
    return true;
}

static bool oracle_run(const char *runner, int64_t max_tokens, int steps, const char *file, mr_format dense,
                       float *worst_out, int *argmax_diff) {
    return oracle_run_stats(runner, max_tokens, steps, file, dense, worst_out, argmax_diff, NULL);
}

static bool run_oracle(const char *runner, int64_t max_tokens, int steps) {
    float worst = 0.0f;
    int diff = 0;
    if (!oracle_run(runner, max_tokens, steps, "model/tiny/golden.bin", MR_FMT_F32, &worst, &diff)) return false;
    if (worst > ORACLE_TOL || diff)
        fprintf(stderr, "runner %s: max |logit error| %g (tolerance %g), %d greedy differences\n", runner, worst,
                ORACLE_TOL, diff);
    assert_true(worst <= ORACLE_TOL);
    assert_int_equal(diff, 0);
    return true;
}

/* --dense-activation-dtype bf16 against transformers with the inputs of q/k/v_proj, o_proj and lm_head
 * rounded to bf16 (tools/oracle/gen_minimax_m2.py --dense-bf16), every runner that runs the model, on
 * the table's kernels (AMX tiles: the one-part pack). Rounding to bf16 magnifies the kernels' fp32 sum
 * order: an input a few fp32 ulps from a bf16 rounding boundary rounds the other way on one side, and
 * the logits downstream of it move by up to ~1e-2. So the oracle is held per row: almost every logit
 * row within ORACLE_TOL, the mean error far below it, the greedy tokens identical. And the oracle tells
 * the modes apart: each mode misses the other's file by far, in the mean and in most rows. */
static void test_dense_bf16_oracle(void **st) {
    (void)st;
    const char *runners[] = {"reference", "routed"};
    for (size_t i = 0; i < 2; i++) {
        oracle_stats m = {0}, x1 = {0}, x2 = {0};
        float w;
        int diff = 0, d2 = 0;
        assert_true(oracle_run_stats(runners[i], 0, 16, "model/tiny/golden_dense_bf16.bin", MR_FMT_BF16, &w, &diff, &m));
        assert_true(oracle_run_stats(runners[i], 0, 16, "model/tiny/golden.bin", MR_FMT_BF16, &w, &d2, &x1));
        assert_true(oracle_run_stats(runners[i], 0, 16, "model/tiny/golden_dense_bf16.bin", MR_FMT_F32, &w, &d2, &x2));
        fprintf(stderr, "%s: dense bf16 against its oracle: max %.3g, mean %.3g, %d of %d rows above %g, %d greedy "
                "differences; against the fp32 oracle: max %.3g, mean %.3g, %d rows above; fp32 against the bf16 "
                "oracle: max %.3g, mean %.3g, %d rows above\n", runners[i], m.worst, m.mean, m.rows_over, m.rows,
                ORACLE_TOL, diff, x1.worst, x1.mean, x1.rows_over, x2.worst, x2.mean, x2.rows_over);
        assert_int_equal(diff, 0);
        assert_true(m.mean <= ORACLE_TOL / 10);
        assert_true(m.rows_over * 20 <= m.rows); /* at most 5% of the rows above the tolerance */
        assert_true(m.worst <= 8 * ORACLE_TOL);
        assert_true(x1.mean >= 5 * m.mean && x1.rows_over * 2 > x1.rows);
        assert_true(x2.mean >= 5 * m.mean && x2.rows_over * 2 > x2.rows);
    }
}

/* Every registered runner against the oracle. Which ones refuse is written
 * out: fused does not implement minimax2 routing (its declared subset);
 * reference and routed must run and match. A runner added to the registry
 * without a line here fails the test. */
static void test_oracle_all_runners(void **st) {
    (void)st;
    static const struct {
        const char *name;
        bool refuses;
    } expect[] = {{"reference", false}, {"routed", false}, {"fused", true}};
    const size_t n_expect = sizeof expect / sizeof expect[0];
    assert_int_equal(mr_moe_runner_count(), (int)n_expect);
    for (int i = 0; i < mr_moe_runner_count(); i++) {
        const char *name = mr_moe_runner_at(i)->name;
        size_t j = 0;
        while (j < n_expect && strcmp(expect[j].name, name) != 0) j++;
        if (j == n_expect) fail_msg("runner %s has no expected outcome in the oracle test", name);
        bool ran = run_oracle(name, 0, 16);
        if (ran == expect[j].refuses)
            fail_msg("runner %s %s the oracle model, expected it to %s", name, ran ? "ran" : "refused",
                     expect[j].refuses ? "refuse" : "run");
    }
}

/* Chunked prefill (4 tokens per internal step, prompts split across chunks) gives the same answer. */
static void test_oracle_chunked(void **st) {
    (void)st;
    assert_true(run_oracle("reference", 4, 3));
}

/* The oracle comparison must be able to fail: a perturbed weight breaks it. */
static void test_oracle_detects_wrong_weights(void **st) {
    (void)st;
    golden g;
    golden_load(&g);
    mr_model_opts o = {.max_batch = 1, .max_ctx = 64, .runner = "reference", .quiet = true};
    mr_model *m = NULL;
    assert_int_equal(mr_model_open(tu_data("model/tiny"), &o, &m), MR_OK);
    m->w.layers[1].q_norm[3] *= 1.5f; /* one weight of one norm */
    int slot = 0;
    int64_t n = g.p[0].L;
    float *lg = malloc((size_t)n * (size_t)g.V * sizeof(float));
    mr_batch b = {.n_seq = 1, .seq = &slot, .n_tok = &n, .tokens = g.p[0].ids, .all_logits = true};
    assert_int_equal(mr_model_forward(m, &b, lg), MR_OK);
    assert_true(max_abs_diff(lg + (n - 1) * g.V, g.p[0].logits + (n - 1) * g.V, g.V) > ORACLE_TOL);
    free(lg);
    mr_model_close(m);
    free(g.blob);
}

static void test_kv_overflow(void **st) {
    (void)st;
    mr_model_opts o = {.max_batch = 2, .max_ctx = 8, .runner = "reference", .quiet = true};
    mr_model *m = NULL;
    assert_int_equal(mr_model_open(tu_data("model/tiny"), &o, &m), MR_OK);
    int32_t toks[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    int slot = 1;
    int64_t n = 9;
    float *lg = malloc(256 * sizeof(float) * 9);
    mr_batch b = {.n_seq = 1, .seq = &slot, .n_tok = &n, .tokens = toks};
    assert_int_equal(mr_model_forward(m, &b, lg), MR_ECAPACITY);
    assert_non_null(strstr(mr_error_last(), "context of 8"));
    assert_int_equal(mr_model_seq_len(m, 1), 0);
    n = 8;
    assert_int_equal(mr_model_forward(m, &b, lg), MR_OK);
    assert_int_equal(mr_model_seq_len(m, 1), 8);
    n = 1;
    assert_int_equal(mr_model_forward(m, &b, lg), MR_ECAPACITY); /* one more token no longer fits */
    assert_int_equal(mr_model_seq_len(m, 1), 8);
    slot = 2; /* outside max_batch */
    assert_int_equal(mr_model_forward(m, &b, lg), MR_ECAPACITY);
    slot = 0;
    toks[0] = 256; /* outside the vocabulary */
    assert_int_equal(mr_model_forward(m, &b, lg), MR_EINPUT);
    mr_model_seq_reset(m, 1);
    assert_int_equal(mr_model_seq_len(m, 1), 0);
    free(lg);
    mr_model_close(m);
}

/* ---- loader errors: rewrite the tiny checkpoint with one change ---- */
typedef enum { EDIT_DROP, EDIT_SHAPE, EDIT_DTYPE, EDIT_DROP_GLOB } edit_kind; /* GLOB: victim is an fnmatch pattern */

/* a new scratch folder with src_dir's json files */
static char *copy_configs(const char *src_dir) {
    char *dir = tu_tmpdir("model_edit");
    assert_non_null(dir);
    char p[4096];
    const char *files[] = {"config.json", "generation_config.json", "hf_quant_config.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", src_dir, files[i]);
        size_t n;
        void *d = tu_read_file(p, &n);
        if (!d) continue;
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        assert_int_equal(tu_write_file(p, d, n), 0);
        free(d);
    }
    return dir;
}

/* A copy of the checkpoint with n more F32 scalar tensors names[i] = vals[i]. */
static char *copy_with_scalars(const char *src_dir, const char *const *names, const float *vals, int n) {
    char *dir = copy_configs(src_dir), p[4096];
    mr_ckpt *ck = NULL;
    assert_int_equal(mr_ckpt_open(src_dir, &ck), MR_OK);
    mr_st_writer *w = NULL;
    assert_int_equal(mr_st_writer_new(&w), MR_OK);
    for (size_t i = 0; i < mr_ckpt_count(ck); i++) {
        const mr_st_tensor *t = mr_ckpt_tensor_at(ck, i);
        assert_int_equal(mr_st_writer_add(w, t->name, t->dtype, t->shape, t->ndim, t->data), MR_OK);
    }
    for (int i = 0; i < n; i++) assert_int_equal(mr_st_writer_add(w, names[i], MR_ST_F32, NULL, 0, &vals[i]), MR_OK);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(mr_st_writer_write(w, p), MR_OK);
    mr_st_writer_free(w);
    mr_ckpt_close(ck);
    return dir;
}

static char *copy_with_edit(const char *src_dir, const char *victim, edit_kind kind) {
    char *dir = copy_configs(src_dir), p[4096];
    mr_ckpt *ck = NULL;
    assert_int_equal(mr_ckpt_open(src_dir, &ck), MR_OK);
    mr_st_writer *w = NULL;
    assert_int_equal(mr_st_writer_new(&w), MR_OK);
    void *extra = NULL;
    bool found = false;
    for (size_t i = 0; i < mr_ckpt_count(ck); i++) {
        const mr_st_tensor *t = mr_ckpt_tensor_at(ck, i);
        bool hit = kind == EDIT_DROP_GLOB ? fnmatch(victim, t->name, 0) == 0 : strcmp(t->name, victim) == 0;
        if (!hit) {
            assert_int_equal(mr_st_writer_add(w, t->name, t->dtype, t->shape, t->ndim, t->data), MR_OK);
            continue;
        }
        found = true;
        if (kind == EDIT_DROP || kind == EDIT_DROP_GLOB) continue;
        if (kind == EDIT_DTYPE) { /* same bytes, declared F16 instead of BF16 */
            assert_int_equal(t->dtype, MR_ST_BF16);
            assert_int_equal(mr_st_writer_add(w, t->name, MR_ST_F16, t->shape, t->ndim, t->data), MR_OK);
        } else { /* one more row */
            int64_t sh[4];
            memcpy(sh, t->shape, sizeof(int64_t) * (size_t)t->ndim);
            sh[0] += 1;
            size_t bytes = (size_t)t->n_bytes / (size_t)t->shape[0] * (size_t)sh[0];
            extra = calloc(1, bytes);
            memcpy(extra, t->data, (size_t)t->n_bytes);
            assert_int_equal(mr_st_writer_add(w, t->name, t->dtype, sh, t->ndim, extra), MR_OK);
        }
    }
    assert_true(found);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(mr_st_writer_write(w, p), MR_OK);
    mr_st_writer_free(w);
    mr_ckpt_close(ck);
    free(extra);
    return dir;
}

static void expect_open_error(const char *dir, mr_status want, const char *needle1, const char *needle2) {
    mr_model_opts o = {.runner = "reference", .quiet = true, .max_ctx = 16};
    mr_model *m = (mr_model *)(uintptr_t)1;
    mr_status st = mr_model_open(dir, &o, &m);
    if (st != want || (needle1 && !strstr(mr_error_last(), needle1)) || (needle2 && !strstr(mr_error_last(), needle2)))
        fprintf(stderr, "got %s: %s\n", mr_status_name(st), mr_error_last());
    assert_int_equal(st, want);
    assert_null(m);
    if (needle1) assert_non_null(strstr(mr_error_last(), needle1));
    if (needle2) assert_non_null(strstr(mr_error_last(), needle2));
}

static void test_loader_errors(void **st) {
    (void)st;
    const char *src = tu_data("model/tiny");
    char srcd[4096];
    snprintf(srcd, sizeof srcd, "%s", src);
    const char *t1 = "model.layers.1.block_sparse_moe.experts.5.w3.weight";
    char *d = copy_with_edit(srcd, t1, EDIT_DROP);
    expect_open_error(d, MR_ENOTFOUND, t1, "missing");
    tu_rmtree(d);
    free(d);
    const char *t2 = "model.layers.0.self_attn.k_proj.weight";
    d = copy_with_edit(srcd, t2, EDIT_SHAPE);
    expect_open_error(d, MR_EFORMAT, t2, "expected shape [32, 64], found [33, 64]");
    tu_rmtree(d);
    free(d);
    const char *t3 = "model.layers.0.self_attn.q_norm.weight";
    d = copy_with_edit(srcd, t3, EDIT_DTYPE);
    expect_open_error(d, MR_EFORMAT, t3, "found F16");
    /* truncated file: cut the last 100 bytes */
    char p[4200];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    size_t n;
    void *bytes = tu_read_file(p, &n);
    assert_non_null(bytes);
    assert_int_equal(tu_write_file(p, bytes, n - 100), 0);
    free(bytes);
    expect_open_error(d, MR_EFORMAT, "model.safetensors", NULL);
    tu_rmtree(d);
    free(d);
    /* MTP layers in the checkpoint (model.layers.2.*) were never required: the
     * untouched tiny checkpoint holds them and loads (see the oracle tests). */
}

/* Every allocation failure during open returns a clean error (ASan: no leak). */
/* One MoE workspace per model, shared by every layer: a model of 6 layers
 * holds exactly the workspace of the same model with 1 layer. */
static void test_workspace_independent_of_layers(void **st) {
    (void)st;
    char *base = tu_tmpdir("ws_layers");
    assert_non_null(base);
    size_t ws[2] = {0, 0};
    const int64_t layers[2] = {1, 6};
    for (int i = 0; i < 2; i++) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/l%lld", base, (long long)layers[i]);
        mr_tiny_params tp = {.hidden = 128, .layers = layers[i], .experts = 8, .top_k = 2, .inter = 128, .heads = 2,
                             .kv_heads = 1, .head_dim = 64, .rotary_dim = 32, .vocab = 64, .quant = MR_FMT_FP8_BLOCK,
                             .seed = 3};
        assert_int_equal(mr_tiny_write(dir, &tp), MR_OK);
        mr_model_opts o = {.runner = "routed", .quiet = true, .max_batch = 2, .max_ctx = 64, .max_tokens = 64};
        mr_model *m = NULL;
        assert_int_equal(mr_model_open(dir, &o, &m), MR_OK);
        ws[i] = mr_moe_ctx_workspace_bytes(m->moe);
        /* the layers' weight sets are all prepared for the one context */
        for (int l = 0; l < layers[i]; l++) assert_ptr_equal(m->w.layers[l].experts->prepared_by, m->runner);
        int slot = 0;
        int64_t n = 3;
        int32_t toks[3] = {1, 2, 3};
        float lg[3 * 64];
        mr_batch b = {.n_seq = 1, .seq = &slot, .n_tok = &n, .tokens = toks};
        assert_int_equal(mr_model_forward(m, &b, lg), MR_OK);
        mr_model_close(m);
    }
    assert_true(ws[0] > 0);
    if (ws[1] != ws[0]) fail_msg("MoE workspace: %zu bytes with 1 layer, %zu with 6", ws[0], ws[1]);
    tu_rmtree(base);
    free(base);
}

/* The loader reads only the local experts' tensors: with a tensor of expert
 * 5 gone, layer 1's experts [0, 5) and [6, 8) load, a range holding 5 does not. */
static void test_loader_local_experts(void **st) {
    (void)st;
    char srcd[4096];
    snprintf(srcd, sizeof srcd, "%s", tu_data("model/tiny"));
    const char *victim = "model.layers.1.block_sparse_moe.experts.5.w3.weight";
    char *d = copy_with_edit(srcd, victim, EDIT_DROP);
    mr_model_opts o = {.runner = "reference", .quiet = true, .max_ctx = 16};
    mr_model *m = NULL;
    assert_int_equal(mr_model_open(srcd, &o, &m), MR_OK);
    mr_ckpt *ck = NULL;
    assert_int_equal(mr_ckpt_open(d, &ck), MR_OK);
    mr_moe_weights *w = NULL;
    assert_int_equal(mr__model_load_experts(m, ck, 1, 0, 5, &w), MR_OK);
    assert_int_equal(w->n_experts, 5);
    assert_int_equal(w->expert_first, 0);
    mr_moe_weights_free(w);
    assert_int_equal(mr__model_load_experts(m, ck, 1, 6, 2, &w), MR_OK);
    assert_int_equal(w->expert_first, 6);
    /* expert 6 of the set is the checkpoint's expert 6, bound in place */
    const mr_st_tensor *t6 = mr_ckpt_find(ck, "model.layers.1.block_sparse_moe.experts.6.w1.weight");
    assert_non_null(t6);
    assert_ptr_equal(w->w1[0].data, t6->data);
    mr_moe_weights_free(w);
    assert_int_equal(mr__model_load_experts(m, ck, 1, 4, 2, &w), MR_ENOTFOUND);
    assert_non_null(strstr(mr_error_last(), victim));
    assert_null(w);
    assert_int_equal(mr__model_load_experts(m, ck, 1, 7, 2, &w), MR_EINVAL); /* past the last expert */
    mr_ckpt_close(ck);
    mr_model_close(m);
    tu_rmtree(d);
    free(d);
}

static void test_loader_alloc_failures(void **st) {
    (void)st;
    mr_model_opts o = {.runner = "reference", .quiet = true, .max_ctx = 16};
    int ok_at = -1;
    /* every early allocation, then a stride through the per-layer/per-expert ones (speed) */
    for (long n = 0; n < 20000; n += n < 400 ? 1 : 7) {
        mr_model *m = NULL;
        mr_debug_alloc_fail_after(n);
        mr_status s = mr_model_open(tu_data("model/tiny"), &o, &m);
        mr_debug_alloc_fail_after(-1);
        if (s == MR_OK) {
            mr_model_close(m);
            ok_at = (int)n;
            break;
        }
        assert_null(m);
        /* every JSON parse goes through base/json.c, which tells an
         * allocation failure inside jansson apart from bad text */
        if (s != MR_ENOMEM) fprintf(stderr, "fail at %ld: %s %s\n", n, mr_status_name(s), mr_error_last());
        assert_int_equal(s, MR_ENOMEM);
    }
    assert_true(ok_at > 10);
}

/* NVFP4: an expert without input_scale takes the maximum over the others. */
static void test_nvfp4_input_scale_fallback(void **st) {
    (void)st;
    char *base = tu_tmpdir("model_nvfp4");
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/ck", base);
    mr_tiny_params tp = {.hidden = 64, .layers = 1, .experts = 4, .top_k = 2, .inter = 32, .heads = 2, .kv_heads = 1,
                         .head_dim = 16, .rotary_dim = 8, .vocab = 64, .quant = MR_FMT_NVFP4, .seed = 7};
    mr_status s = mr_tiny_write(dir, &tp);
    if (s) fprintf(stderr, "%s\n", mr_error_last());
    assert_int_equal(s, MR_OK);
    const char *victim = "model.layers.0.block_sparse_moe.experts.2.w1.input_scale";
    char *d = copy_with_edit(dir, victim, EDIT_DROP);
    mr_model_opts o = {.runner = "reference", .quiet = true, .max_ctx = 16};
    mr_model *m = NULL, *m0 = NULL;
    assert_int_equal(mr_model_open(dir, &o, &m0), MR_OK);
    assert_int_equal(mr_model_open(d, &o, &m), MR_OK);
    float mx = 0.0f;
    for (int e = 0; e < 4; e++)
        if (e != 2) mx = fmaxf(mx, m0->w.layers[0].experts->w1[e].input_scale);
    assert_true(mx > 0.0f);
    assert_true(m->w.layers[0].experts->w1[2].input_scale == mx);
    assert_true(m->w.layers[0].experts->w1[1].input_scale == m0->w.layers[0].experts->w1[1].input_scale);
    mr_model_close(m);
    mr_model_close(m0);
    tu_rmtree(d);
    free(d);
    tu_rmtree(base);
    free(base);
}

/* NVFP4: when no expert of a layer carries the input_scale of w1/w3 (the
 * inputs of the first GEMM), there is no maximum to fall back on; the w2
 * scales are a different quantity and must not stand in (a 0 scale would
 * divide by zero in the activation quantizer). A clear error instead. */
static void test_nvfp4_input_scale_group_missing(void **st) {
    (void)st;
    char *base = tu_tmpdir("model_nvfp4b");
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/ck", base);
    mr_tiny_params tp = {.hidden = 64, .layers = 1, .experts = 4, .top_k = 2, .inter = 32, .heads = 2, .kv_heads = 1,
                         .head_dim = 16, .rotary_dim = 8, .vocab = 64, .quant = MR_FMT_NVFP4, .seed = 7};
    assert_int_equal(mr_tiny_write(dir, &tp), MR_OK);
    char *d = copy_with_edit(dir, "model.layers.0.block_sparse_moe.experts.*.w[13].input_scale", EDIT_DROP_GLOB);
    expect_open_error(d, MR_ENOTFOUND, "input_scale", "w1");
    tu_rmtree(d);
    free(d);
    d = copy_with_edit(dir, "model.layers.0.block_sparse_moe.experts.*.w2.input_scale", EDIT_DROP_GLOB);
    expect_open_error(d, MR_ENOTFOUND, "input_scale", "w2");
    tu_rmtree(d);
    free(d);
    tu_rmtree(base);
    free(base);
}

/* A token count beyond any cache is a capacity error, not an integer overflow. */
static void test_forward_huge_count(void **st) {
    (void)st;
    mr_model_opts o = {.max_batch = 1, .max_ctx = 8, .runner = "reference", .quiet = true};
    mr_model *m = NULL;
    assert_int_equal(mr_model_open(tu_data("model/tiny"), &o, &m), MR_OK);
    int32_t toks[2] = {1, 2};
    int slot = 0;
    int64_t n = 2;
    float *lg = malloc(256 * sizeof(float) * 2);
    mr_batch b = {.n_seq = 1, .seq = &slot, .n_tok = &n, .tokens = toks};
    assert_int_equal(mr_model_forward(m, &b, lg), MR_OK);
    n = INT64_MAX; /* len 2 + INT64_MAX overflows int64 */
    assert_int_equal(mr_model_forward(m, &b, lg), MR_ECAPACITY);
    assert_int_equal(mr_model_seq_len(m, 0), 2);
    free(lg);
    mr_model_close(m);
}

/* quantize follows spec/formats.md, checked from the spec's formulas on the
 * written files (not by comparing with another run of the quantizer):
 *   fp8:   attention and expert weights F8_E4M3 with F32 weight_scale_inv
 *          [ceil(N/128)][ceil(K/128)] = 1/(448 * (1/amax(block))), so the block's largest
 *          element encodes as +-448; every element dequantizes to within
 *          half an E4M3 step (2^-4 relative, or the subnormal step); the rest
 *          (norms, gate, bias, embed, lm_head) byte-identical BF16;
 *   nvfp4: only expert weights quantized; w1 and w3 share weight_scale_2 =
 *          max(amax(w1), amax(w3))/2688 and a positive input_scale. */
static float bf16_at(const mr_st_tensor *t, size_t i) {
    uint16_t b;
    memcpy(&b, (const unsigned char *)t->data + 2 * i, 2);
    return mr_bf16_to_f32(b);
}

static void test_quantize_follows_spec(void **st) {
    (void)st;
    char *base = tu_tmpdir("model_quant");
    char in[4200], o8[4200], o4[4200];
    snprintf(in, sizeof in, "%s/bf16", base);
    snprintf(o8, sizeof o8, "%s/fp8", base);
    snprintf(o4, sizeof o4, "%s/nvfp4", base);
    mr_tiny_params tp = {.hidden = 128, .layers = 1, .experts = 4, .top_k = 2, .inter = 256, .heads = 2,
                         .kv_heads = 1, .head_dim = 64, .rotary_dim = 32, .vocab = 64, .seed = 5};
    assert_int_equal(mr_tiny_write(in, &tp), MR_OK);
    mr_quantize_params q8 = {.to = MR_FMT_FP8_BLOCK, .calib_tokens = 16};
    mr_quantize_params q4 = {.to = MR_FMT_NVFP4, .calib_tokens = 16};
    assert_int_equal(mr_model_quantize(in, o8, &q8), MR_OK);
    assert_int_equal(mr_model_quantize(in, o4, &q4), MR_OK);
    mr_ckpt *ci = NULL, *c8 = NULL, *c4 = NULL;
    assert_int_equal(mr_ckpt_open(in, &ci), MR_OK);
    assert_int_equal(mr_ckpt_open(o8, &c8), MR_OK);
    assert_int_equal(mr_ckpt_open(o4, &c4), MR_OK);
    int n_fp8 = 0, n_nv = 0, n_copied = 0;
    for (size_t i = 0; i < mr_ckpt_count(ci); i++) {
        const mr_st_tensor *t = mr_ckpt_tensor_at(ci, i);
        bool lin = strstr(t->name, "_proj.weight") || (strstr(t->name, ".experts.") && strstr(t->name, ".weight"));
        bool expert = strstr(t->name, ".experts.") != NULL;
        const mr_st_tensor *a = mr_ckpt_find(c8, t->name), *b = mr_ckpt_find(c4, t->name);
        assert_non_null(a);
        assert_non_null(b);
        if (!lin) { /* copied as is, in both */
            assert_int_equal(a->dtype, t->dtype);
            assert_int_equal(b->dtype, t->dtype);
            assert_memory_equal(a->data, t->data, (size_t)t->n_bytes);
            assert_memory_equal(b->data, t->data, (size_t)t->n_bytes);
            n_copied++;
            continue;
        }
        int64_t N = t->shape[0], K = t->shape[1];
        /* fp8 */
        char nm[400];
        snprintf(nm, sizeof nm, "%.*s.weight_scale_inv", (int)(strlen(t->name) - 7), t->name);
        const mr_st_tensor *si = mr_ckpt_find(c8, nm);
        assert_int_equal(a->dtype, MR_ST_F8_E4M3);
        assert_non_null(si);
        assert_int_equal(si->dtype, MR_ST_F32);
        int64_t nb = (N + 127) / 128, kb = (K + 127) / 128;
        assert_int_equal(si->shape[0], nb);
        assert_int_equal(si->shape[1], kb);
        for (int64_t bi = 0; bi < nb; bi++)
            for (int64_t bj = 0; bj < kb; bj++) {
                float amax = 0.0f, sinv, top = 0.0f;
                memcpy(&sinv, (const unsigned char *)si->data + 4 * (size_t)(bi * kb + bj), 4);
                for (int64_t r = bi * 128; r < N && r < bi * 128 + 128; r++)
                    for (int64_t c = bj * 128; c < K && c < bj * 128 + 128; c++)
                        amax = fmaxf(amax, fabsf(bf16_at(t, (size_t)(r * K + c))));
                /* scale = 448 * (1/amax), as torch evaluates HF's `448.0 / amax` (src/formats/fp8_block.c) */
                float want = amax > 0.0f ? 1.0f / (448.0f * (1.0f / amax)) : 1.0f;
                assert_true(sinv == want);
                for (int64_t r = bi * 128; r < N && r < bi * 128 + 128; r++)
                    for (int64_t c = bj * 128; c < K && c < bj * 128 + 128; c++) {
                        float w = bf16_at(t, (size_t)(r * K + c));
                        float qv = mr_e4m3_to_f32(((const uint8_t *)a->data)[r * K + c]);
                        top = fmaxf(top, fabsf(qv));
                        float err = fabsf(qv * sinv - w);
                        assert_true(err <= fabsf(w) * 0.0625f + sinv * 0x1p-10f + 1e-12f);
                    }
                if (amax > 0.0f) assert_true(top == 448.0f);
            }
        n_fp8++;
        /* nvfp4 */
        if (!expert) {
            assert_int_equal(b->dtype, MR_ST_BF16); /* attention stays bf16 */
            assert_memory_equal(b->data, t->data, (size_t)t->n_bytes);
            continue;
        }
        assert_int_equal(b->dtype, MR_ST_U8);
        snprintf(nm, sizeof nm, "%.*s.weight_scale_2", (int)(strlen(t->name) - 7), t->name);
        const mr_st_tensor *s2 = mr_ckpt_find(c4, nm);
        snprintf(nm, sizeof nm, "%.*s.input_scale", (int)(strlen(t->name) - 7), t->name);
        const mr_st_tensor *is = mr_ckpt_find(c4, nm);
        assert_non_null(s2);
        assert_non_null(is);
        float ws2, isc, amax = 0.0f;
        memcpy(&ws2, s2->data, 4);
        memcpy(&isc, is->data, 4);
        assert_true(isc > 0.0f && isfinite(isc));
        const mr_st_tensor *pair[2] = {t, NULL};
        char other[400];
        snprintf(other, sizeof other, "%s", t->name);
        char *w = strstr(other, ".w1.") ? strstr(other, ".w1.") : strstr(other, ".w3.");
        if (w) { /* w1 <-> w3 share the scale */
            w[2] = w[2] == '1' ? '3' : '1';
            pair[1] = mr_ckpt_find(ci, other);
            assert_non_null(pair[1]);
        }
        for (int k = 0; k < 2 && pair[k]; k++)
            for (size_t e = 0; e < (size_t)pair[k]->n_elements; e++) amax = fmaxf(amax, fabsf(bf16_at(pair[k], e)));
        assert_true(ws2 == amax / 2688.0f);
        n_nv++;
    }
    assert_true(n_fp8 == 4 + 3 * 4 && n_nv == 3 * 4 && n_copied > 0);
    mr_ckpt_close(ci);
    mr_ckpt_close(c8);
    mr_ckpt_close(c4);
    tu_rmtree(base);
    free(base);
}

/* A checkpoint with an MTP module (the committed tiny model: layer 2 of 2
 * decoder layers) quantized: quantize leaves the MTP layer bf16 (it is never
 * loaded), and the result resolves, opens and runs in both formats. */
static void test_quantize_mtp_checkpoint_resolves(void **st) {
    (void)st;
    char *base = tu_tmpdir("model_quant_mtp");
    const mr_format tos[2] = {MR_FMT_FP8_BLOCK, MR_FMT_NVFP4};
    for (int q = 0; q < 2; q++) {
        char out[4200];
        snprintf(out, sizeof out, "%s/%d", base, q);
        mr_quantize_params qp = {.to = tos[q], .calib_tokens = 16};
        assert_int_equal(mr_model_quantize(tu_data("model/tiny"), out, &qp), MR_OK);
        mr_ckpt *ck = NULL;
        assert_int_equal(mr_ckpt_open(out, &ck), MR_OK);
        const mr_st_tensor *mtp = mr_ckpt_find(ck, "model.layers.2.block_sparse_moe.experts.0.w1.weight");
        const mr_st_tensor *dec = mr_ckpt_find(ck, "model.layers.1.block_sparse_moe.experts.0.w1.weight");
        assert_non_null(mtp); /* the premise: an MTP expert in the file, left bf16 */
        assert_non_null(dec);
        assert_int_equal(mtp->dtype, MR_ST_BF16);
        assert_int_equal(dec->dtype, q == 0 ? MR_ST_F8_E4M3 : MR_ST_U8);
        mr_ckpt_close(ck);
        mr_options o;
        assert_int_equal(mr_options_init(&o), MR_OK);
        assert_int_equal(mr_options_set(&o, "model", out, MR_SRC_FLAG), MR_OK);
        mr_resolution *r = NULL;
        mr_status s = mr_resolve(&o, &r);
        if (s) fail_msg("%s", mr_error_last());
        mr_model_opts mo = {.exec = mr_resolution_exec(r), .max_batch = 1, .max_ctx = 16, .max_tokens = 16,
                            .quiet = true};
        mr_model *m = NULL;
        assert_int_equal(mr_model_open(out, &mo, &m), MR_OK);
        int seq = 0;
        int64_t nt = 3;
        int32_t toks[3] = {5, 6, 7};
        float logits[256];
        assert_int_equal(mr_model_config_of(m)->vocab, 256);
        mr_batch b = {.n_seq = 1, .seq = &seq, .n_tok = &nt, .tokens = toks};
        assert_int_equal(mr_model_forward(m, &b, logits), MR_OK);
        for (int i = 0; i < 256; i++) assert_true(isfinite(logits[i]));
        mr_model_close(m);
        mr_resolution_free(r);
        mr_options_free(&o);
    }
    tu_rmtree(base);
    free(base);
}

/* ---- sampler ---- */
static void fill_logits(float *l, int V, uint64_t seed) {
    tu_rng r = {seed};
    for (int i = 0; i < V; i++) l[i] = 3.0f * tu_normal(&r);
}

static void test_sampler_greedy(void **st) {
    (void)st;
    enum { V = 1000 };
    float l[V];
    for (int trial = 0; trial < 20; trial++) {
        fill_logits(l, V, 100 + (uint64_t)trial);
        int32_t am = 0;
        for (int i = 1; i < V; i++)
            if (l[i] > l[am]) am = i;
        mr_sampler s;
        mr_sampler_params p0 = {.temperature = 0.0f, .top_p = 1.0f, .seed = (uint64_t)trial};
        assert_int_equal(mr_sampler_init(&s, &p0, V), MR_OK);
        assert_int_equal(mr_sampler_sample(&s, l), am); /* temperature 0 == argmax */
        mr_sampler_free(&s);
        mr_sampler_params p1 = {.temperature = 1.7f, .top_k = 1, .top_p = 1.0f, .seed = (uint64_t)trial};
        assert_int_equal(mr_sampler_init(&s, &p1, V), MR_OK);
        for (int k = 0; k < 5; k++) assert_int_equal(mr_sampler_sample(&s, l), am); /* top-k 1 == greedy */
        mr_sampler_free(&s);
    }
    /* ties go to the lower id; NaN never wins */
    float t[4] = {NAN, 2.0f, 5.0f, 5.0f};
    assert_int_equal(mr_argmax(t, 4), 2);
}

/* A temperature near 0 is the limit of the distribution: the largest logit, or
 * a uniform draw among equal largest ones; never the first candidate because
 * l / T overflowed (T = 1e-38 with logits past +-4 once gave NaN weights and
 * token 0 every time; T = 1e-45 makes 1 / T infinite). A +inf logit wins. */
static void test_sampler_tiny_temperature(void **st) {
    (void)st;
    enum { V = 300 };
    float l[V];
    const float temps[] = {1e-45f, 1e-40f, 1e-38f, 1e-30f, 1e-20f};
    for (size_t ti = 0; ti < sizeof temps / sizeof temps[0]; ti++)
        for (int trial = 0; trial < 8; trial++) {
            fill_logits(l, V, 900 + (uint64_t)trial);
            for (int i = 0; i < V; i++) l[i] *= 25.0f; /* magnitudes up to ~200 */
            int32_t am = 0;
            for (int i = 1; i < V; i++)
                if (l[i] > l[am]) am = i;
            for (int k = 0; k < 3; k++) {
                mr_sampler_params p = {.temperature = temps[ti], .top_k = k == 1 ? 20 : 0, .top_p = k == 2 ? 0.5f : 1.0f,
                                       .seed = (uint64_t)trial};
                mr_sampler s;
                assert_int_equal(mr_sampler_init(&s, &p, V), MR_OK);
                for (int d = 0; d < 4; d++) {
                    int32_t t = mr_sampler_sample(&s, l);
                    if (t != am)
                        fail_msg("T %g top_k %d top_p %g: drew %d (logit %g), the largest is %d (logit %g)",
                                 (double)temps[ti], p.top_k, (double)p.top_p, t, (double)l[t], am, (double)l[am]);
                }
                mr_sampler_free(&s);
            }
        }
    /* two equal largest logits at T = 1e-30: both drawn, nothing else */
    for (int i = 0; i < V; i++) l[i] = -40.0f + (float)(i % 17);
    l[123] = l[250] = 45.0f;
    mr_sampler_params p = {.temperature = 1e-30f, .top_p = 1.0f, .seed = 7};
    mr_sampler s;
    assert_int_equal(mr_sampler_init(&s, &p, V), MR_OK);
    int a = 0, b = 0;
    for (int d = 0; d < 200; d++) {
        int32_t t = mr_sampler_sample(&s, l);
        assert_true(t == 123 || t == 250);
        a += t == 123, b += t == 250;
    }
    assert_true(a > 40 && b > 40);
    mr_sampler_free(&s);
    /* a +inf logit wins at any temperature */
    l[200] = INFINITY;
    p.temperature = 0.7f;
    assert_int_equal(mr_sampler_init(&s, &p, V), MR_OK);
    for (int d = 0; d < 5; d++) assert_int_equal(mr_sampler_sample(&s, l), 200);
    mr_sampler_free(&s);
}

static void test_sampler_seeded(void **st) {
    (void)st;
    enum { V = 500, N = 200 };
    float l[V];
    fill_logits(l, V, 42);
    mr_sampler_params p = {.temperature = 1.0f, .top_k = 50, .top_p = 0.9f, .min_p = 0.01f, .seed = 1234};
    mr_sampler a, b, c;
    assert_int_equal(mr_sampler_init(&a, &p, V), MR_OK);
    assert_int_equal(mr_sampler_init(&b, &p, V), MR_OK);
    p.seed = 1235;
    assert_int_equal(mr_sampler_init(&c, &p, V), MR_OK);
    int same_ab = 0, same_ac = 0, distinct = 0;
    int32_t seen[V] = {0};
    for (int i = 0; i < N; i++) {
        int32_t x = mr_sampler_sample(&a, l), y = mr_sampler_sample(&b, l), z = mr_sampler_sample(&c, l);
        same_ab += x == y;
        same_ac += x == z;
        if (!seen[x]++) distinct++;
    }
    assert_int_equal(same_ab, N);  /* same seed, same tokens */
    assert_true(same_ac < N);      /* another seed, another stream */
    assert_true(distinct > 1);     /* it does sample */
    mr_sampler_free(&a);
    mr_sampler_free(&b);
    mr_sampler_free(&c);
    /* bad parameters are refused */
    mr_sampler s;
    mr_sampler_params bad = {.temperature = 1.0f, .top_p = 0.0f};
    assert_int_equal(mr_sampler_init(&s, &bad, V), MR_EINVAL);
    bad = (mr_sampler_params){.temperature = 1.0f, .top_p = 1.0f, .min_p = 2.0f};
    assert_int_equal(mr_sampler_init(&s, &bad, V), MR_EINVAL);
}

/* top-p keeps the smallest most-likely set whose mass reaches p; min-p drops
 * tokens below min_p * p_max; top-k keeps k. Checked by sampling many times. */
static void test_sampler_filters(void **st) {
    (void)st;
    enum { V = 6 };
    /* probabilities at temperature 1: 0.4, 0.3, 0.15, 0.1, 0.04, 0.01 */
    const double pr[V] = {0.4, 0.3, 0.15, 0.1, 0.04, 0.01};
    float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)log(pr[i]);
    struct { float top_p, min_p; int top_k, allowed; } cases[] = {
        {0.69f, 0.0f, 0, 2},  /* 0.4 + 0.3 = 0.7 >= 0.69: two tokens */
        {0.71f, 0.0f, 0, 3},  /* needs the third */
        {1.0f, 0.3f, 0, 3},   /* >= 0.12: 0.4, 0.3, 0.15 */
        {1.0f, 0.0f, 4, 4},   /* top-k 4 */
        {0.95f, 0.0f, 0, 4},  /* 0.95 reached at the fourth (0.95) */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        mr_sampler_params p = {.temperature = 1.0f, .top_k = cases[c].top_k, .top_p = cases[c].top_p,
                               .min_p = cases[c].min_p, .seed = 99 + c};
        mr_sampler s;
        assert_int_equal(mr_sampler_init(&s, &p, V), MR_OK);
        int hist[V] = {0};
        for (int i = 0; i < 4000; i++) hist[mr_sampler_sample(&s, l)]++;
        for (int i = 0; i < V; i++) {
            if (i < cases[c].allowed)
                assert_true(hist[i] > 0);
            else
                assert_int_equal(hist[i], 0);
        }
        /* the kept mass is renormalized: token 0's share is 0.4 / kept mass (within sampling noise) */
        double kept = 0;
        for (int i = 0; i < cases[c].allowed; i++) kept += pr[i];
        double share = hist[0] / 4000.0, want = 0.4 / kept;
        assert_true(fabs(share - want) < 0.05);
        mr_sampler_free(&s);
    }
}

/* The paged forward's extra rows (mr_kv_batch.n_extra): their logits from mr_model_extra_logits
 * against the transformers oracle, a chunk of them at an offset, and the refusals: rows the last
 * forward did not keep, a token index outside the batch, too many rows. */
static void test_extra_logits_rows(void **st) {
    (void)st;
    golden g;
    golden_load(&g);
    const gold_prompt *gp = &g.p[1]; /* 9 tokens */
    const int V = g.V, L = gp->L;
    mr_engine_opts eo = {.kv_dtype = MR_FMT_F32, .kv_blocks = 4, .max_batch_tokens = 64, .max_running_requests = 4,
                         .context_length = 64};
    mr_model_opts mo = {.runner = "reference", .quiet = true};
    mr_engine_model_opts(&eo, &mo);
    mr_model *m = NULL;
    assert_int_equal(mr_model_open(tu_data("model/tiny"), &mo, &m), MR_OK);
    int64_t ntok = L, start = 0, extra[64];
    int32_t btoff[2] = {0, 1}, blocks[1] = {0};
    uint8_t want = 1;
    for (int k = 0; k < L - 1; k++) extra[k] = L - 2 - k; /* positions L-2 .. 0: any order */
    mr_kv_batch b = {.n_seq = 1, .n_tokens = L, .tokens = gp->ids, .n_tok = &ntok, .start = &start, .bt_off = btoff,
                     .block_ids = blocks, .want_logits = &want, .n_logits = 1, .n_extra = L - 1, .extra_tok = extra};
    float *lg = malloc((size_t)L * (size_t)V * sizeof(float));
    float worst = 0.0f;
    assert_int_equal(mr_model_forward_kv(m, &b, lg), MR_OK);
    worst = fmaxf(worst, max_abs_diff(lg, gp->logits + (size_t)(L - 1) * (size_t)V, V)); /* the sampled row */
    assert_int_equal(mr_model_extra_logits(m, 2, L - 3, lg), MR_OK); /* rows 2 .. L-2: positions L-4 .. 0 */
    for (int k = 2; k < L - 1; k++)
        worst = fmaxf(worst, max_abs_diff(lg + (size_t)(k - 2) * (size_t)V, gp->logits + (size_t)extra[k] * (size_t)V, V));
    assert_int_equal(mr_model_extra_logits(m, 0, 2, lg), MR_OK);
    for (int k = 0; k < 2; k++)
        worst = fmaxf(worst, max_abs_diff(lg + (size_t)k * (size_t)V, gp->logits + (size_t)extra[k] * (size_t)V, V));
    if (worst > ORACLE_TOL) fprintf(stderr, "extra rows: max |logit error| %g\n", worst);
    assert_true(worst <= ORACLE_TOL);
    assert_int_equal(mr_model_extra_logits(m, L - 2, 2, lg), MR_EINVAL); /* past the rows kept */
    assert_int_equal(mr_model_extra_logits(m, -1, 1, lg), MR_EINVAL);
    assert_int_equal(mr_model_extra_logits(m, 0, 0, lg), MR_EINVAL);
    extra[3] = L; /* outside the batch */
    start = L;    /* (the positions after the first call's) */
    assert_int_equal(mr_model_forward_kv(m, &b, lg), MR_EINVAL);
    extra[3] = 0;
    b.n_extra = L; /* with the sampled row: more rows than tokens */
    assert_int_equal(mr_model_forward_kv(m, &b, lg), MR_EINVAL);
    b.n_extra = 0; /* a forward without extra rows keeps none */
    b.extra_tok = NULL;
    blocks[0] = 1;
    start = 0;
    assert_int_equal(mr_model_forward_kv(m, &b, lg), MR_OK);
    assert_int_equal(mr_model_extra_logits(m, 0, 1, lg), MR_EINVAL);
    free(lg);
    mr_model_close(m);
    free(g.blob);
}

/* ---- prompt log-probabilities (the engine's prompt_logprobs) against the oracle ---- */

static double golden_lse(const float *row, int V) {
    double mx = row[0], s = 0.0;
    for (int i = 1; i < V; i++) mx = row[i] > mx ? row[i] : mx;
    for (int i = 0; i < V; i++) s += exp((double)row[i] - mx);
    return mx + log(s);
}

/* copies of every golden prompt, all at once, with prompt_logprobs and top 3: every prompt
 * token's log-probability against log_softmax of the transformers logits at the position
 * before it, the top 3 where the oracle has no near tie, each position once and in order,
 * the greedy first token, and the log-probability of the generated token. budget 4: the
 * prompts in chunks; 8 copies: more rows in a step than one lm_head chunk (MR__PLP_CHUNK). */
static void plp_oracle_run(int64_t budget, int copies, bool prefix_twice) {
    golden g;
    golden_load(&g);
    const int V = g.V;
    enum { NR = 64 };
    mr_engine_opts eo = {.kv_dtype = MR_FMT_F32, .kv_blocks = 256, .max_batch_tokens = budget,
                         .max_running_requests = budget < 32 ? (int)budget : 32, .max_queued_requests = NR, .context_length = 64,
                         .fixed_threads = true};
    mr_model_opts mo = {.runner = "reference", .quiet = true};
    mr_engine_model_opts(&eo, &mo);
    mr_model *m = NULL;
    mr_engine *e = NULL;
    assert_int_equal(mr_model_open(tu_data("model/tiny"), &mo, &m), MR_OK);
    assert_int_equal(mr_engine_new(m, &eo, &e), MR_OK);
    int n = 0, prompt_of[NR];
    mr_req_id ids[NR];
    int64_t next[NR];
    bool done[NR] = {false}, plain[NR] = {false};
    float worst = 0.0f;
    int top_checked = 0, ranks_checked = 0;
    for (int c = 0; c < copies; c++)
        for (int i = 0; i < g.n; i++, n++) {
            assert_true(n < NR);
            /* prefix_twice: the first copy without prompt logprobs fills the prefix cache, which
             * the others must not use for the positions they owe */
            plain[n] = prefix_twice && c == 0;
            mr_request_params p = {.prompt = g.p[i].ids, .n_prompt = g.p[i].L, .max_tokens = 1,
                                   .logprobs = true, .top_logprobs = 3, .prompt_logprobs = !plain[n]};
            assert_int_equal(mr_engine_add(e, &p, &ids[n]), MR_OK);
            prompt_of[n] = i;
            next[n] = 1;
        }
    int left = n, steps = 0, max_rows = 0;
    while (left > 0) {
        assert_true(++steps < 1000);
        const mr_engine_step_out *so = NULL;
        assert_int_equal(mr_engine_step(e, &so), MR_OK);
        int rows = 0;
        for (int k = 0; k < so->n_events; k++) {
            const mr_engine_event *ev = &so->events[k];
            int r = 0;
            while (r < n && ids[r] != ev->id) r++;
            assert_true(r < n);
            const gold_prompt *gp = &g.p[prompt_of[r]];
            assert_int_equal(ev->finish == MR_FINISH_ERROR, 0);
            if (plain[r]) assert_int_equal(ev->n_plp, 0);
            if (ev->n_plp) { /* positions in order, each once */
                assert_int_equal(ev->plp_pos, next[r]);
                assert_true(ev->plp_pos + ev->n_plp <= gp->L);
                assert_int_equal(ev->plp_ntop, 3);
                rows += ev->n_plp;
            }
            for (int q = 0; q < ev->n_plp; q++) {
                const mr_token_logprob *row = ev->plp + (size_t)q * (size_t)ev->plp_stride;
                int64_t pos = ev->plp_pos + q;
                const float *ref = gp->logits + (size_t)(pos - 1) * (size_t)V;
                double lse = golden_lse(ref, V);
                assert_int_equal(row[0].token, gp->ids[pos]);
                float d = fabsf(row[0].logprob - (float)(ref[gp->ids[pos]] - lse));
                worst = d > worst ? d : worst;
                /* the oracle's top 3 (ties to the lower id) where its gaps are clear */
                int t[4] = {-1, -1, -1, -1};
                for (int j = 0; j < 4; j++)
                    for (int v = 0; v < V; v++) {
                        bool taken = false;
                        for (int u = 0; u < j; u++) taken |= t[u] == v;
                        if (!taken && (t[j] < 0 || ref[v] > ref[t[j]])) t[j] = v;
                    }
                for (int j = 0; j < 3; j++) {
                    if (ref[t[j]] - ref[t[j + 1]] < 1e-2f || (j && ref[t[j - 1]] - ref[t[j]] < 1e-2f)) break;
                    assert_int_equal(row[1 + j].token, t[j]);
                    float dt = fabsf(row[1 + j].logprob - (float)(ref[t[j]] - lse));
                    worst = dt > worst ? dt : worst;
                    top_checked++;
                }
                /* the rank against the oracle's row: between the ids clearly above the token and
                 * those above or near it (the logits agree to ~1e-4 here) */
                const float lt = ref[gp->ids[pos]];
                int above = 0, near = 0;
                for (int v = 0; v < V; v++) {
                    if (v == gp->ids[pos]) continue;
                    above += ref[v] > lt + 1e-3f;
                    near += ref[v] >= lt - 1e-3f;
                }
                assert_true(ev->plp_rank[q] >= 1 + above && ev->plp_rank[q] <= 1 + near);
                ranks_checked += above > 0;
            }
            next[r] += ev->n_plp;
            if (ev->n_tokens == 1) { /* the first generated token: greedy, and its log-probability */
                assert_int_equal(next[r], plain[r] ? 1 : gp->L);
                assert_int_equal(ev->token, gp->gen[0]);
                const float *ref = gp->logits + (size_t)(gp->L - 1) * (size_t)V;
                float d = fabsf(ev->logprob - (float)(ref[ev->token] - golden_lse(ref, V)));
                worst = d > worst ? d : worst;
            }
            if (ev->finish != MR_FINISH_NONE) {
                assert_int_equal(ev->finish, MR_FINISH_LENGTH);
                assert_false(done[r]);
                done[r] = true;
                left--;
            }
        }
        max_rows = rows > max_rows ? rows : max_rows;
    }
    if (worst > 2 * ORACLE_TOL) fprintf(stderr, "prompt logprobs: max |error| %g > %g\n", worst, 2 * ORACLE_TOL);
    assert_true(worst <= 2 * ORACLE_TOL);
    assert_true(top_checked > 0 && ranks_checked > 0);
    int per_copy = 0;
    for (int i = 0; i < g.n; i++) per_copy += g.p[i].L - 1;
    if (copies * per_copy > MR__PLP_CHUNK && budget >= 512) assert_true(max_rows > MR__PLP_CHUNK); /* 2 chunks a step */
    mr_engine_stats es;
    mr_engine_stats_get(e, &es);
    if (prefix_twice) assert_int_equal(es.prefix_hits, 0); /* the copies computed their prompts */
    mr_engine_free(e);
    mr_model_close(m);
    free(g.blob);
}

/* A reference-runner engine over dir's model, its KV cache in kvt, 64 KV blocks, a context of 64. */
static void ref_engine_open(const char *dir, mr_format kvt, int64_t budget, int max_running, mr_model **m, mr_engine **e) {
    mr_engine_opts eo = {.kv_dtype = kvt, .kv_blocks = 64, .max_batch_tokens = budget, .max_running_requests = max_running,
                         .max_queued_requests = 8, .context_length = 64, .fixed_threads = true};
    mr_model_opts mo = {.runner = "reference", .quiet = true};
    mr_engine_model_opts(&eo, &mo);
    *m = NULL;
    *e = NULL;
    assert_int_equal(mr_model_open(dir, &mo, m), MR_OK);
    assert_int_equal(mr_engine_new(*m, &eo, e), MR_OK);
}

/* The golden prompts through an engine whose KV pool holds kvt, teacher-forced along the
 * greedy tokens of the golden file gname: the largest |log-probability error| of every prompt
 * token (prompt_logprobs) and every generated token against log_softmax of that file's logits,
 * and how many generated steps' most likely token differs from the file's where its top two are
 * 1e-2 apart or more. */
static float kv_oracle_run(const char *dir_in, mr_format kvt, const char *gname, int *argmax_diff) {
    char dir[4096]; /* tu_data's buffer is reused by golden_load_file */
    snprintf(dir, sizeof dir, "%s", dir_in);
    golden g;
    golden_load_file(&g, gname);
    const int V = g.V;
    mr_model *m;
    mr_engine *e;
    ref_engine_open(dir, kvt, 64, 8, &m, &e);
    assert_int_equal(mr_model_kv_dtype(m), kvt);
    mr_req_id ids[8];
    int64_t next_pos[8], gen_i[8];
    for (int i = 0; i < g.n; i++) {
        mr_request_params p = {.prompt = g.p[i].ids, .n_prompt = g.p[i].L, .max_tokens = g.steps + 1,
                               .ignore_eos = true, .logprobs = true, .top_logprobs = 1, .prompt_logprobs = true,
                               .forced = g.p[i].gen, .n_forced = g.steps + 1};
        assert_int_equal(mr_engine_add(e, &p, &ids[i]), MR_OK);
        next_pos[i] = 1, gen_i[i] = 0;
    }
    float worst = 0.0f;
    int left = g.n;
    *argmax_diff = 0;
    for (int steps = 0; left > 0; steps++) {
        assert_true(steps < 1000);
        const mr_engine_step_out *so = NULL;
        assert_int_equal(mr_engine_step(e, &so), MR_OK);
        for (int k = 0; k < so->n_events; k++) {
            const mr_engine_event *ev = &so->events[k];
            int r = 0;
            while (r < g.n && ids[r] != ev->id) r++;
            assert_true(r < g.n);
            const gold_prompt *gp = &g.p[r];
            assert_int_equal(ev->finish == MR_FINISH_ERROR, 0);
            if (ev->n_plp) assert_int_equal(ev->plp_pos, next_pos[r]);
            for (int q = 0; q < ev->n_plp; q++) { /* prompt token at pos: the logits of pos - 1 */
                const int64_t pos = ev->plp_pos + q;
                const float *ref = gp->logits + (size_t)(pos - 1) * (size_t)V;
                const mr_token_logprob *row = ev->plp + (size_t)q * (size_t)ev->plp_stride;
                assert_int_equal(row[0].token, gp->ids[pos]);
                const float d = fabsf(row[0].logprob - (float)(ref[gp->ids[pos]] - golden_lse(ref, V)));
                worst = d > worst ? d : worst;
            }
            next_pos[r] += ev->n_plp;
            if (ev->n_tokens == 1) { /* generated token j: the logits of row L - 1 + j */
                const int64_t j = gen_i[r]++;
                assert_int_equal(ev->token, gp->gen[j]);
                const float *ref = gp->logits + (size_t)(gp->L - 1 + j) * (size_t)V;
                const float d = fabsf(ev->logprob - (float)(ref[ev->token] - golden_lse(ref, V)));
                worst = d > worst ? d : worst;
                int a = 0, b = -1; /* the oracle's top two */
                for (int v = 1; v < V; v++)
                    if (ref[v] > ref[a]) b = a, a = v;
                    else if (b < 0 || ref[v] > ref[b]) b = v;
                assert_int_equal(ev->n_top, 1);
                if (ref[a] - ref[b] >= 1e-2f && ev->top[0].token != a) (*argmax_diff)++;
            }
            if (ev->finish != MR_FINISH_NONE) {
                assert_int_equal(ev->finish, MR_FINISH_LENGTH);
                assert_int_equal(next_pos[r], gp->L);
                assert_int_equal(gen_i[r], g.steps + 1);
                left--;
            }
        }
    }
    mr_engine_free(e);
    mr_model_close(m);
    free(g.blob);
    return worst;
}

/* An FP8 KV cache (--kv-cache-dtype fp8_e4m3 / fp8_e5m2) against transformers with the same
 * cache semantics (tools/oracle/gen_minimax_m2.py --kv-fp8: K and V clamped and cast to
 * torch's float8 types before attention reads them); and the oracle tells the types apart:
 * a bf16 cache's run against the FP8 file misses it by far (the generator checks the files
 * differ from the fp32 cache's by > 10x this tolerance). */
static void test_kv_fp8_oracle(void **st) {
    (void)st;
    static const struct {
        mr_format f;
        const char *file;
    } t[] = {{MR_FMT_E4M3, "model/tiny/golden_kv_fp8_e4m3.bin"}, {MR_FMT_E5M2, "model/tiny/golden_kv_fp8_e5m2.bin"}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        int diff = 0;
        const float w = kv_oracle_run(tu_data("model/tiny"), t[i].f, t[i].file, &diff);
        if (w > 2 * ORACLE_TOL || diff)
            fprintf(stderr, "%s: max |logprob error| %g (tolerance %g), %d argmax differences\n",
                    mr_kv_dtype_name(t[i].f), w, 2 * ORACLE_TOL, diff);
        assert_true(w <= 2 * ORACLE_TOL);
        assert_int_equal(diff, 0);
    }
    int diff = 0;
    const float w = kv_oracle_run(tu_data("model/tiny"), MR_FMT_BF16, t[0].file, &diff);
    assert_true(w > 10 * ORACLE_TOL);
}

/* A checkpoint's FP8 KV cache scales, under the names vLLM reads (layer 0
 * ModelOpt's k_proj.k_scale / v_proj.v_scale, layer 1 self_attn.k_scale /
 * v_scale), against transformers with vLLM's semantics (gen_minimax_m2.py's
 * KV_SCALES: the same values); without the scales the same file is missed by
 * far; an fp32 pool ignores them (the plain oracle); the older kv_scale serves
 * both; a scale of 0 is refused naming the tensor. */
static void test_kv_fp8_checkpoint_scales(void **st) {
    (void)st;
    const char *names[] = {"model.layers.0.self_attn.k_proj.k_scale", "model.layers.0.self_attn.v_proj.v_scale",
                           "model.layers.1.self_attn.k_scale", "model.layers.1.self_attn.v_scale"};
    const float vals[] = {0.004f, 0.01f, 0.02f, 0.002f}; /* KV_SCALES in tools/oracle/gen_minimax_m2.py */
    char *d = copy_with_scalars(tu_data("model/tiny"), names, vals, 4);
    int diff = 0;
    float w = kv_oracle_run(d, MR_FMT_E4M3, "model/tiny/golden_kv_fp8_e4m3_scaled.bin", &diff);
    if (w > 2 * ORACLE_TOL || diff) fprintf(stderr, "scaled fp8_e4m3: %g, %d argmax differences\n", w, diff);
    assert_true(w <= 2 * ORACLE_TOL);
    assert_int_equal(diff, 0);
    w = kv_oracle_run(tu_data("model/tiny"), MR_FMT_E4M3, "model/tiny/golden_kv_fp8_e4m3_scaled.bin", &diff);
    assert_true(w > 10 * ORACLE_TOL);
    w = kv_oracle_run(d, MR_FMT_F32, "model/tiny/golden.bin", &diff); /* an fp32 pool: no scales */
    assert_true(w <= 2 * ORACLE_TOL);
    tu_rmtree(d);
    free(d);
    const char *kvn[] = {"model.layers.0.self_attn.kv_scale"};
    const float kvv[] = {0.25f};
    d = copy_with_scalars(tu_data("model/tiny"), kvn, kvv, 1);
    mr_model_opts o = {.runner = "reference", .quiet = true, .max_ctx = 16};
    mr_model *m = NULL;
    assert_int_equal(mr_model_open(d, &o, &m), MR_OK);
    assert_true(m->w.layers[0].k_scale == 0.25f && m->w.layers[0].v_scale == 0.25f);
    assert_true(m->w.layers[1].k_scale == 1.0f && m->w.layers[1].v_scale == 1.0f);
    assert_int_equal(mr_model_kv_scales(m), 2);
    mr_model_close(m);
    tu_rmtree(d);
    free(d);
    const float zero[] = {0.0f};
    d = copy_with_scalars(tu_data("model/tiny"), names + 3, zero, 1);
    expect_open_error(d, MR_EFORMAT, names[3], "above 0");
    tu_rmtree(d);
    free(d);
}

/* prompt_logprobs_from: each golden prompt with its 16 greedy tokens after it (the file holds the logits of
 * every position of that sequence, 19-25 tokens) first runs plain, filling the prefix cache, then with the
 * prompt's log-probabilities from F: exactly positions max(F, 1) .. L - 1 come, in order, each against the
 * oracle, the first token still greedy; the cache serves the whole 16-token blocks before position F - 1
 * (F 17 and up: one block, below it none), never a position whose logits an owed token needs. */
static void test_prompt_logprobs_from(void **st) {
    (void)st;
    golden g;
    golden_load(&g);
    const int V = g.V;
    mr_model *m;
    mr_engine *e;
    ref_engine_open(tu_data("model/tiny"), MR_FMT_F32, 512, 4, &m, &e);
    float worst = 0.0f;
    int checked = 0, checked_ids = 0;
    for (int i = 0; i < g.n; i++) {
        const gold_prompt *gp = &g.p[i];
        int32_t seq[96];
        const int L = gp->L + g.steps;
        memcpy(seq, gp->ids, (size_t)gp->L * sizeof(int32_t));
        memcpy(seq + gp->L, gp->gen, (size_t)g.steps * sizeof(int32_t));
        const int64_t from[] = {-1, 0, 1, 2, 5, 16, 17, 18, L - 1, L, L + 3, -5};
        for (size_t f = 0; f < sizeof from / sizeof from[0] + 1; f++) {
            const bool plain = f == 0; /* the first fills the cache */
            const int64_t F = plain ? 0 : from[f - 1];
            /* sglang's token_ids_logprob: these ids at every reported position, in this order (a repeat too) */
            const int32_t ids[] = {0, V - 1, seq[1], 7, 7, seq[L - 1]};
            const int n_ids = plain ? 0 : (int)(sizeof ids / sizeof ids[0]);
            mr_request_params p = {.prompt = seq, .n_prompt = L, .max_tokens = 1, .top_logprobs = 2,
                                   .prompt_logprobs = !plain, .prompt_logprobs_from = F,
                                   .logprob_ids = plain ? NULL : ids, .n_logprob_ids = n_ids};
            mr_req_id id;
            assert_int_equal(mr_engine_add(e, &p, &id), MR_OK);
            int64_t next = F > 1 ? F : 1, cached = -1;
            bool done = false;
            for (int steps = 0; !done; steps++) {
                assert_true(steps < 100);
                const mr_engine_step_out *so = NULL;
                assert_int_equal(mr_engine_step(e, &so), MR_OK);
                for (int k = 0; k < so->n_events; k++) {
                    const mr_engine_event *ev = &so->events[k];
                    assert_true(ev->id == id);
                    assert_int_equal(ev->n_logprob_ids, n_ids);
                    if (plain) assert_int_equal(ev->n_plp, 0);
                    if (plain) assert_null(ev->id_logprob);
                    if (ev->n_plp) {
                        assert_int_equal(ev->plp_pos, next);
                        assert_true(ev->plp_pos + ev->n_plp <= L);
                    }
                    for (int q = 0; q < ev->n_plp; q++) {
                        const mr_token_logprob *row = ev->plp + (size_t)q * (size_t)ev->plp_stride;
                        const int64_t pos = ev->plp_pos + q;
                        const float *ref = gp->logits + (size_t)(pos - 1) * (size_t)V;
                        assert_int_equal(row[0].token, seq[pos]);
                        const float d = fabsf(row[0].logprob - (float)(ref[seq[pos]] - golden_lse(ref, V)));
                        worst = d > worst ? d : worst;
                        checked++;
                        for (int t = 0; t < n_ids; t++) {
                            const float di = fabsf(ev->plp_id_logprob[(size_t)q * (size_t)n_ids + (size_t)t] -
                                                   (float)(ref[ids[t]] - golden_lse(ref, V)));
                            worst = di > worst ? di : worst;
                            checked_ids++;
                        }
                    }
                    next += ev->n_plp;
                    if (ev->n_tokens == 1) {
                        cached = ev->n_cached;
                        assert_int_equal(ev->token, gp->gen[g.steps]); /* greedy after the whole sequence */
                        const float *ref = gp->logits + (size_t)(L - 1) * (size_t)V;
                        for (int t = 0; t < n_ids; t++) {
                            const float di = fabsf(ev->id_logprob[t] - (float)(ref[ids[t]] - golden_lse(ref, V)));
                            worst = di > worst ? di : worst;
                            checked_ids++;
                        }
                    }
                    done |= ev->finish != MR_FINISH_NONE;
                }
            }
            /* every owed position came; the cache stopped at the block before the first owed logits */
            if (plain) continue;
            assert_int_equal(next, F >= L ? (F > 1 ? F : 1) : L);
            const int64_t want = F >= L || F < 1 ? (F >= L ? 16 : 0) : (F - 1) / 16 * 16;
            if (cached != want)
                fprintf(stderr, "prompt %d from %lld: %lld cached, want %lld\n", i, (long long)F, (long long)cached,
                        (long long)want);
            assert_int_equal(cached, want);
        }
    }
    if (worst > 2 * ORACLE_TOL) fprintf(stderr, "prompt logprobs from: max |error| %g > %g\n", worst, 2 * ORACLE_TOL);
    assert_true(worst <= 2 * ORACLE_TOL && checked > 0);
    /* the ids at every position reported: the prompt's from F, and the token's (each non-plain run) */
    assert_true(checked_ids == 6 * (checked + g.n * (int)(sizeof(int64_t[12]) / sizeof(int64_t))));
    mr_engine_free(e);
    mr_model_close(m);
    free(g.blob);
}

/* The expert distribution: the counts of an engine run equal the selections the MoE block handed to its
 * hook, layer by layer (counted here from the raw ids), sum to k per token of each call, stay frozen when
 * stopped and start from zero again; nothing is counted before the first start. */
typedef struct {
    int64_t L, E;
    uint64_t *cnt;
    uint64_t tokens;
} erec_tally;
static void erec_hook(void *user, int layer, const float *x, const float *out, int64_t T, const int32_t *ids, int k) {
    (void)x, (void)out;
    erec_tally *t = user;
    for (int64_t i = 0; i < T * k; i++) t->cnt[(size_t)layer * (size_t)t->E + (size_t)ids[i]]++;
    if (layer == 0) t->tokens += (uint64_t)T;
}
static void erec_run(mr_engine *e, int n) {
    const int32_t prompt[] = {5, 9, 2, 7, 11, 3, 4};
    for (int r = 0; r < n; r++) {
        mr_request_params p = {.prompt = prompt, .n_prompt = 7 - r % 3, .max_tokens = 5 + r};
        mr_req_id id;
        assert_int_equal(mr_engine_add(e, &p, &id), MR_OK);
    }
    for (int steps = 0; mr_engine_has_work(e); steps++) {
        assert_true(steps < 200);
        const mr_engine_step_out *so = NULL;
        assert_int_equal(mr_engine_step(e, &so), MR_OK);
    }
}
static void test_expert_distribution(void **st) {
    (void)st;
    mr_model *m;
    mr_engine *e;
    ref_engine_open(tu_data("model/tiny"), MR_FMT_F32, 64, 4, &m, &e);
    const mr_model_config *c = mr_model_config_of(m);
    const size_t n = (size_t)c->n_layers * (size_t)c->n_experts;
    erec_tally t = {c->n_layers, c->n_experts, calloc(n, sizeof(uint64_t)), 0};
    uint64_t *got = calloc(n, sizeof(uint64_t)), *frozen = calloc(n, sizeof(uint64_t));
    assert_non_null(t.cnt);
    assert_non_null(got);
    assert_non_null(frozen);
    mr__model_set_moe_hook(m, erec_hook, &t);
    erec_run(e, 2); /* not recording: nothing counted */
    mr_model_expert_counts(m, got);
    for (size_t i = 0; i < n; i++) assert_int_equal(got[i], 0);
    assert_false(mr_model_expert_recording(m));
    for (int round = 0; round < 2; round++) { /* start zeroes: the second round counts its own run only */
        memset(t.cnt, 0, n * sizeof(uint64_t));
        t.tokens = 0;
        mr_model_expert_record(m, true);
        assert_true(mr_model_expert_recording(m));
        erec_run(e, 3 + round);
        mr_model_expert_counts(m, got);
        for (int64_t l = 0; l < c->n_layers; l++) {
            uint64_t sum = 0;
            for (int64_t x = 0; x < c->n_experts; x++) {
                const size_t i = (size_t)l * (size_t)c->n_experts + (size_t)x;
                assert_int_equal(got[i], t.cnt[i]);
                sum += got[i];
            }
            assert_int_equal(sum, t.tokens * (uint64_t)c->top_k);
        }
        assert_true(t.tokens > 0);
    }
    mr_model_expert_record(m, false); /* stopped: the counts stay */
    erec_run(e, 2);
    mr_model_expert_counts(m, frozen);
    assert_memory_equal(frozen, got, n * sizeof(uint64_t));
    free(t.cnt);
    free(got);
    free(frozen);
    mr_engine_free(e);
    mr_model_close(m);
}

/* Routed experts (sglang's return_routed_experts): a request's events give, for every position computed, each
 * layer's k experts as the MoE block handed them to its hook (one request alone: a forward call's rows are its
 * positions in order, chunked prefill included); every position but the last generated one comes, once; a
 * second request of the same prompt takes nothing from the prefix cache (its positions are its own). */
typedef struct {
    int64_t L, k, pos; /* the next position of the call's first row */
    int32_t *want;     /* [positions][L][k] */
    int64_t cap;
} route_tally;
static void route_hook(void *user, int layer, const float *x, const float *out, int64_t T, const int32_t *ids, int k) {
    (void)x, (void)out;
    route_tally *t = user;
    for (int64_t i = 0; i < T && t->pos + i < t->cap; i++)
        memcpy(t->want + ((size_t)(t->pos + i) * (size_t)t->L + (size_t)layer) * (size_t)k, ids + (size_t)i * (size_t)k,
               (size_t)k * sizeof(int32_t));
    if (layer == t->L - 1) t->pos += T;
}
static void test_routed_experts(void **st) {
    (void)st;
    mr_model *m;
    mr_engine *e;
    ref_engine_open(tu_data("model/tiny"), MR_FMT_F32, 16, 1, &m, &e);
    const mr_model_config *c = mr_model_config_of(m);
    enum { P = 37, G = 9 };
    const int64_t L = c->n_layers, k = c->top_k, row = L * k;
    route_tally t = {L, k, 0, calloc((size_t)(P + G) * (size_t)row, sizeof(int32_t)), P + G};
    int32_t *got = calloc((size_t)(P + G) * (size_t)row, sizeof(int32_t)), prompt[P];
    int seen[P + G];
    assert_non_null(t.want);
    assert_non_null(got);
    for (int i = 0; i < P; i++) prompt[i] = 3 + (i * 7) % 50;
    mr__model_set_moe_hook(m, route_hook, &t);
    for (int round = 0; round < 2; round++) {
        t.pos = 0;
        memset(seen, 0, sizeof seen);
        mr_request_params p = {.prompt = prompt, .n_prompt = P, .max_tokens = G, .ignore_eos = true, .routes = true};
        mr_req_id id;
        assert_int_equal(mr_engine_add(e, &p, &id), MR_OK);
        int64_t n_cached = -1;
        for (int steps = 0; mr_engine_has_work(e); steps++) {
            assert_true(steps < 100);
            const mr_engine_step_out *so = NULL;
            assert_int_equal(mr_engine_step(e, &so), MR_OK);
            for (int q = 0; q < so->n_events; q++) {
                const mr_engine_event *ev = &so->events[q];
                if (ev->first_token) n_cached = ev->n_cached;
                assert_true(ev->routes_pos >= 0 && ev->routes_pos + ev->n_routes <= P + G - 1);
                for (int64_t r = 0; r < ev->n_routes; r++) {
                    seen[ev->routes_pos + r]++;
                    memcpy(got + (size_t)(ev->routes_pos + r) * (size_t)row, ev->routes + (size_t)r * (size_t)row,
                           (size_t)row * sizeof(int32_t));
                }
            }
        }
        assert_int_equal(n_cached, 0);
        assert_int_equal(t.pos, P + G - 1); /* one request: every call's rows were its positions */
        for (int i = 0; i < P + G - 1; i++) assert_int_equal(seen[i], 1);
        assert_memory_equal(got, t.want, (size_t)(P + G - 1) * (size_t)row * sizeof(int32_t));
        for (int64_t i = 0; i < (P + G - 1) * row; i++) assert_true(got[i] >= 0 && got[i] < c->n_experts);
    }
    free(t.want);
    free(got);
    mr_engine_free(e);
    mr_model_close(m);
}

static void test_prompt_logprobs_oracle(void **st) {
    (void)st;
    plp_oracle_run(512, 1, false);
    plp_oracle_run(4, 2, false);  /* chunked prefill: rows across chunks */
    plp_oracle_run(512, 8, false); /* 8 x 14 rows: two lm_head chunks in a step */
    plp_oracle_run(512, 3, true);  /* after a plain copy of each prompt in the prefix cache */
}

/* New weights for a running model (mr_model_weights_load / _swap): after the swap the model gives, bit for
 * bit, what a fresh open of the new checkpoint gives (each of which the oracle tests check against
 * transformers); a checkpoint of another shape, or a broken one, is refused by name and the running model
 * answers as before; staged weights run nothing. Per packing runner (reference, routed) and format. */
static void swap_logits(mr_model *m, float *lg) {
    int slot = 0;
    int64_t n = 5;
    int32_t toks[5] = {3, 1, 4, 1, 5};
    mr_batch b = {.n_seq = 1, .seq = &slot, .n_tok = &n, .tokens = toks, .all_logits = true};
    mr_model_seq_reset(m, slot); /* a new sequence each time */
    assert_int_equal(mr_model_forward(m, &b, lg), MR_OK);
}

static void test_weights_swap(void **st) {
    (void)st;
    char *base = tu_tmpdir("weights_swap");
    assert_non_null(base);
    static const struct { const char *runner; mr_format q; } cases[] = {
        {"reference", MR_FMT_BF16}, {"routed", MR_FMT_FP8_BLOCK}, {"routed", MR_FMT_NVFP4}};
    enum { V = 64, NL = 5 * V };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        char a[4300], b[4300], other[4300];
        snprintf(a, sizeof a, "%s/a%zu", base, ci);
        snprintf(b, sizeof b, "%s/b%zu", base, ci);
        snprintf(other, sizeof other, "%s/o%zu", base, ci);
        mr_tiny_params tp = {.hidden = 128, .layers = 2, .experts = 8, .top_k = 2, .inter = 128, .heads = 2,
                             .kv_heads = 1, .head_dim = 64, .rotary_dim = 32, .vocab = V, .quant = cases[ci].q,
                             .seed = 11};
        assert_int_equal(mr_tiny_write(a, &tp), MR_OK);
        tp.seed = 12;
        assert_int_equal(mr_tiny_write(b, &tp), MR_OK);
        tp.layers = 3;
        assert_int_equal(mr_tiny_write(other, &tp), MR_OK);
        mr_model_opts o = {.runner = cases[ci].runner, .quiet = true, .max_batch = 1, .max_ctx = 32, .max_tokens = 32};
        mr_model *m = NULL, *fb = NULL, *staged = NULL;
        float la[NL], lb[NL], got[NL];
        assert_int_equal(mr_model_open(b, &o, &fb), MR_OK);
        swap_logits(fb, lb);
        mr_model_close(fb);
        assert_int_equal(mr_model_open(a, &o, &m), MR_OK);
        swap_logits(m, la);
        assert_true(memcmp(la, lb, sizeof la) != 0); /* the two checkpoints answer differently */
        /* b in */
        assert_int_equal(mr_model_weights_load(m, b, &staged), MR_OK);
        assert_true(mr_model_is_staged(staged));
        float junk[NL];
        int slot = 0;
        int64_t n1 = 1;
        int32_t t1 = 1;
        mr_batch b1 = {.n_seq = 1, .seq = &slot, .n_tok = &n1, .tokens = &t1};
        assert_int_equal(mr_model_forward(staged, &b1, junk), MR_ESTATE);
        swap_logits(m, got); /* loading alone changes nothing */
        if (memcmp(got, la, sizeof la)) fail_msg("case %zu: logits differ from %s at line %d", ci, "la", __LINE__);
        mr_model_weights_swap(m, staged);
        mr_model_close(staged);
        swap_logits(m, got);
        if (memcmp(got, lb, sizeof lb)) fail_msg("case %zu: logits differ from %s at line %d", ci, "lb", __LINE__);
        /* refusals leave b running */
        assert_int_equal(mr_model_weights_load(m, other, &staged), MR_ECONFIG);
        assert_null(staged);
        assert_non_null(strstr(mr_error_last(), "num_hidden_layers is 2 in the running model and 3"));
        char srcs[4400];
        snprintf(srcs, sizeof srcs, "%s", a);
        char *broken = copy_with_edit(srcs, "model.layers.1.self_attn.o_proj.weight", EDIT_SHAPE);
        assert_int_not_equal(mr_model_weights_load(m, broken, &staged), MR_OK);
        assert_null(staged);
        assert_non_null(strstr(mr_error_last(), "model.layers.1.self_attn.o_proj.weight"));
        tu_rmtree(broken);
        free(broken);
        assert_int_not_equal(mr_model_weights_load(m, "/nonexistent/ckpt", &staged), MR_OK);
        assert_null(staged);
        /* the memory check: refused 1 byte short of the new set's own memory (packed experts, copies), loaded
         * with it available */
        {
            mr_model_memory mem;
            mr_model_memory_get(m, &mem);
            const size_t need = mem.experts + mem.weights_copied;
            assert_true(need > 1024);
            char mi[4400];
            snprintf(mi, sizeof mi, "%s/meminfo", base);
            for (int fits = 0; fits < 2; fits++) {
                FILE *f = fopen(mi, "w");
                assert_non_null(f);
                fprintf(f, "MemTotal: 99999999 kB\nMemAvailable: %zu kB\n", fits ? (need + 1023) / 1024 : (need - 1) / 1024);
                fclose(f);
                mr__model_set_meminfo(mi);
                const mr_status ls = mr_model_weights_load(m, a, &staged);
                mr__model_set_meminfo(NULL);
                if (fits) {
                    assert_int_equal(ls, MR_OK);
                    mr_model_close(staged);
                    staged = NULL;
                } else {
                    assert_int_equal(ls, MR_ECAPACITY);
                    assert_null(staged);
                    assert_non_null(strstr(mr_error_last(), "beside the running weights needs about"));
                }
            }
        }
        swap_logits(m, got);
        if (memcmp(got, lb, sizeof lb)) fail_msg("case %zu: logits differ from %s at line %d", ci, "lb", __LINE__);
        /* and back to a, through every allocation failure of the load first (each one refused, nothing lost) */
        if (ci == 1) {
            int ok_at = -1;
            for (long n = 0; n < 20000; n += n < 300 ? 1 : 7) {
                mr_debug_alloc_fail_after(n);
                const mr_status ls = mr_model_weights_load(m, a, &staged);
                mr_debug_alloc_fail_after(-1);
                if (ls == MR_OK) {
                    mr_model_close(staged);
                    ok_at = (int)n;
                    break;
                }
                assert_int_equal(ls, MR_ENOMEM);
                assert_null(staged);
            }
            assert_true(ok_at > 10);
            swap_logits(m, got);
            if (memcmp(got, lb, sizeof lb)) fail_msg("case %zu: logits differ from %s at line %d", ci, "lb", __LINE__);
        }
        assert_int_equal(mr_model_weights_load(m, a, &staged), MR_OK);
        mr_model_weights_swap(m, staged);
        mr_model_close(staged);
        swap_logits(m, got);
        if (memcmp(got, la, sizeof la)) fail_msg("case %zu: logits differ from %s at line %d", ci, "la", __LINE__);
        mr_model_close(m);
    }
    tu_rmtree(base);
    free(base);
}

int main(void) {
    tu_isa_begin("test_model");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_oracle_all_runners),
        cmocka_unit_test(test_oracle_chunked),
        cmocka_unit_test(test_prompt_logprobs_oracle),
        cmocka_unit_test(test_prompt_logprobs_from),
        cmocka_unit_test(test_expert_distribution),
        cmocka_unit_test(test_routed_experts),
        cmocka_unit_test(test_kv_fp8_oracle),
        cmocka_unit_test(test_dense_bf16_oracle),
        cmocka_unit_test(test_kv_fp8_checkpoint_scales),
        cmocka_unit_test(test_extra_logits_rows),
        cmocka_unit_test(test_oracle_detects_wrong_weights),
        cmocka_unit_test(test_kv_overflow),
        cmocka_unit_test(test_loader_errors),
        cmocka_unit_test(test_loader_alloc_failures),
        cmocka_unit_test(test_workspace_independent_of_layers),
        cmocka_unit_test(test_weights_swap),
        cmocka_unit_test(test_loader_local_experts),
        cmocka_unit_test(test_nvfp4_input_scale_fallback),
        cmocka_unit_test(test_nvfp4_input_scale_group_missing),
        cmocka_unit_test(test_forward_huge_count),
        cmocka_unit_test(test_quantize_follows_spec),
        cmocka_unit_test(test_quantize_mtp_checkpoint_resolves),
        cmocka_unit_test(test_sampler_greedy),
        cmocka_unit_test(test_sampler_seeded),
        cmocka_unit_test(test_sampler_tiny_temperature),
        cmocka_unit_test(test_sampler_filters),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
