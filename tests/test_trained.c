/* test_trained.c — the trained default model (models/tiny-kjv) end to end
 * against its oracle: models/tiny-kjv/golden.bin, written by
 * tools/train_tiny.py with transformers' MiniMaxM2ForCausalLM (fp32 math on
 * the committed bf16 weights) and HF tokenizers / jinja2 for the prompts.
 *   - the prompt texts, encoded by moerun's tokenizer (the chat one rendered
 *     by moerun's template interpreter first), are the golden ids;
 *   - every prefill position's logits and 24 teacher-forced decode steps
 *     match, and greedy picks the golden token, for the reference and the
 *     routed runner;
 *   - the golden greedy continuation decodes to text.
 * Runs once per kernel level (MOERUN_TEST_ISA). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "model/model_internal.h"
#include "moerun/chat.h"
#include "moerun/model.h"
#include "moerun/text.h"
#include "testutil.h"

#define MODEL_DIR "../../models/tiny-kjv"
#define MAX_PROMPTS 4
#define MAX_LEN 128

/* The prompts of tools/train_tiny.py golden_prompts(), in order. */
static const char *const PLAIN[] = {"In the beginning God created", "And the LORD spake unto Moses, saying,"};
static const char *const CHAT_USER = "John 3:16";

typedef struct {
    int L;
    int32_t ids[MAX_LEN];
    int32_t gen[MAX_LEN];
    const float *logits; /* [L + steps][V] */
} gold_prompt;
typedef struct {
    int n, V, steps;
    gold_prompt p[MAX_PROMPTS];
    void *blob;
} golden;

static void golden_load(golden *g) {
    size_t len = 0;
    unsigned char *b = tu_read_file(tu_data(MODEL_DIR "/golden.bin"), &len);
    assert_non_null(b);
    assert_true(len > 20);
    assert_memory_equal(b, "MRGOLD1\0", 8);
    size_t o = 8;
    int32_t h[3];
    memcpy(h, b + o, 12);
    o += 12;
    g->n = h[0];
    g->V = h[1];
    g->steps = h[2];
    assert_true(g->n == 3 && g->steps > 0 && g->steps < MAX_LEN - 1);
    for (int i = 0; i < g->n; i++) {
        gold_prompt *p = &g->p[i];
        assert_true(o + 4 <= len);
        memcpy(&p->L, b + o, 4);
        o += 4;
        assert_true(p->L > 0 && p->L <= MAX_LEN);
        assert_true(o + 4 * (size_t)(p->L + g->steps + 1) <= len);
        memcpy(p->ids, b + o, 4 * (size_t)p->L);
        o += 4 * (size_t)p->L;
        memcpy(p->gen, b + o, 4 * (size_t)(g->steps + 1));
        o += 4 * (size_t)(g->steps + 1);
        p->logits = (const float *)(b + o); /* 4-byte aligned: every field before is 4 bytes */
        o += 4 * (size_t)(p->L + g->steps) * (size_t)g->V;
        assert_true(o <= len);
    }
    assert_int_equal(o, len);
    g->blob = b;
}

/* Tolerance. Both sides compute in fp32 on the same bf16-exact weights; they
 * differ by summation order and libm only (measured 1e-5 on logits of
 * magnitude ~15, every kernel level). 1e-3 is well above that and far below
 * what one activation rounded to bf16 does (2^-8 relative, ~0.05 on these
 * logits), or a wrong expert, RoPE dim or norm. */
#define TRAINED_TOL 1e-3f

static float max_abs_diff(const float *a, const float *b, int64_t n) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) m = d; /* NaN propagates */
    }
    return m;
}

static void expect_ids(const mr_tok_ids *v, const gold_prompt *p, const char *what) {
    if (v->n != (size_t)p->L || memcmp(v->ids, p->ids, 4 * v->n) != 0) {
        fprintf(stderr, "%s: moerun encodes %zu ids, the golden has %d:", what, v->n, p->L);
        for (size_t i = 0; i < v->n; i++) fprintf(stderr, " %d", v->ids[i]);
        fprintf(stderr, "\n");
        fail();
    }
}

/* The prompts' text through moerun's tokenizer (and chat template) gives the golden ids. */
static void test_prompts_encode_to_golden_ids(void **st) {
    (void)st;
    golden g;
    golden_load(&g);
    mr_tokenizer *t = NULL;
    assert_int_equal(mr_tokenizer_load(tu_data(MODEL_DIR), &t), MR_OK);
    mr_tok_ids v = {0};
    for (int i = 0; i < 2; i++) {
        v.n = 0;
        assert_int_equal(mr_tokenizer_encode(t, PLAIN[i], strlen(PLAIN[i]), 0, &v, NULL), MR_OK);
        expect_ids(&v, &g.p[i], PLAIN[i]);
    }
    mr_chat *c = NULL;
    assert_int_equal(mr_chat_open(tu_data(MODEL_DIR), &c), MR_OK);
    assert_int_equal(mr_chat_format_of(c), MR_CHAT_FORMAT_MINIMAX_M2);
    json_t *msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", CHAT_USER);
    mr_chat_request rq = {.messages = msgs, .add_generation_prompt = true};
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(mr_chat_apply(c, &rq, &text, &len), MR_OK);
    v.n = 0;
    assert_int_equal(mr_tokenizer_encode(t, text, len, 0, &v, NULL), MR_OK);
    expect_ids(&v, &g.p[2], "chat prompt");
    /* the golden greedy answer of the chat prompt is reasoning, then an answer */
    char *ans = NULL;
    size_t alen = 0;
    assert_int_equal(mr_tokenizer_decode(t, g.p[2].gen, (size_t)g.steps + 1, false, &ans, &alen), MR_OK);
    assert_non_null(strstr(ans, "</think>"));
    mr_free(ans);
    mr_free(text);
    json_decref(msgs);
    mr_chat_free(c);
    mr_tok_ids_free(&v);
    mr_tokenizer_free(t);
    free(g.blob);
}

static float run_golden(const char *runner, float perturb) {
    golden g;
    golden_load(&g);
    mr_model_opts o = {.max_batch = g.n, .max_ctx = 256, .runner = runner, .quiet = true};
    mr_model *m = NULL;
    mr_status st = mr_model_open(tu_data(MODEL_DIR), &o, &m);
    if (st) fprintf(stderr, "open: %s\n", mr_error_last());
    assert_int_equal(st, MR_OK);
    if (perturb != 0.0f) m->w.layers[2].q_norm[5] *= perturb; /* one weight of one norm */
    int V = g.V;
    assert_int_equal(mr_model_config_of(m)->vocab, V);
    int seq[MAX_PROMPTS];
    int64_t n_tok[MAX_PROMPTS], total = 0;
    int32_t toks[MAX_PROMPTS * MAX_LEN];
    for (int i = 0; i < g.n; i++) {
        seq[i] = i;
        n_tok[i] = g.p[i].L;
        memcpy(toks + total, g.p[i].ids, 4 * (size_t)g.p[i].L);
        total += g.p[i].L;
    }
    float *lg = malloc((size_t)total * (size_t)V * sizeof(float));
    assert_non_null(lg);
    mr_batch b = {.n_seq = g.n, .seq = seq, .n_tok = n_tok, .tokens = toks, .all_logits = true};
    assert_int_equal(mr_model_forward(m, &b, lg), MR_OK);
    float worst = 0.0f;
    int64_t row = 0;
    for (int i = 0; i < g.n; i++) {
        for (int t = 0; t < g.p[i].L; t++, row++) {
            float d = max_abs_diff(lg + row * V, g.p[i].logits + (size_t)t * (size_t)V, V);
            if (!(d <= worst)) worst = d;
        }
        if (perturb == 0.0f) assert_int_equal(mr_argmax(lg + (row - 1) * V, V), g.p[i].gen[0]);
    }
    for (int s = 1; s <= g.steps; s++) {
        for (int i = 0; i < g.n; i++) {
            n_tok[i] = 1;
            toks[i] = g.p[i].gen[s - 1];
        }
        mr_batch db = {.n_seq = g.n, .seq = seq, .n_tok = n_tok, .tokens = toks};
        assert_int_equal(mr_model_forward(m, &db, lg), MR_OK);
        for (int i = 0; i < g.n; i++) {
            const float *ref = g.p[i].logits + (size_t)(g.p[i].L + s - 1) * (size_t)V;
            float d = max_abs_diff(lg + (size_t)i * (size_t)V, ref, V);
            if (!(d <= worst)) worst = d;
            if (perturb == 0.0f) assert_int_equal(mr_argmax(lg + (size_t)i * (size_t)V, V), g.p[i].gen[s]);
        }
    }
    free(lg);
    mr_model_close(m);
    free(g.blob);
    return worst;
}

static void test_logits_match_transformers(void **st) {
    (void)st;
    const char *runners[] = {"reference", "routed"};
    for (size_t i = 0; i < 2; i++) {
        float w = run_golden(runners[i], 0.0f);
        fprintf(stderr, "runner %s: max |logit - transformers| = %.3g (tolerance %.3g)\n", runners[i], (double)w,
                (double)TRAINED_TOL);
        assert_true(w <= TRAINED_TOL);
    }
}

/* The comparison can fail: one norm weight scaled by 1.05 is caught. */
static void test_golden_detects_a_wrong_weight(void **st) {
    (void)st;
    assert_true(run_golden("reference", 1.05f) > TRAINED_TOL);
}

int main(void) {
    tu_isa_begin("test_trained");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prompts_encode_to_golden_ids),
        cmocka_unit_test(test_logits_match_transformers),
        cmocka_unit_test(test_golden_detects_a_wrong_weight),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
