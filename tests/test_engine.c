/* test_engine.c — the engine: the scheduler (budget, chunked prefill in
 * order, FCFS), the paged KV path against the contiguous one (the one the
 * transformers oracle checks, tests/test_model.c), batch invariance, prefix
 * sharing, eviction, preemption by recompute, cancellation, admission
 * refusals, per-request failures, sampling features checked against
 * independent computations in this file, a random property test of the block
 * accounting, the per-step path without allocation, and the choice of one
 * thread or all per step (on a simulated clock; the tokens do not change).
 *
 * Every scenario ends with eng_close(), which checks the accounting
 * (mr_engine_check) and that no block is left referenced. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "moerun/engine.h"
#include "moerun/model.h"
#include "testutil.h"

#define V 256 /* the tiny model's vocabulary */

typedef struct {
    mr_model *m;
    mr_engine *e;
} eng;

typedef struct {
    const char *runner;
    mr_format kv;
    int64_t blocks, budget, ctx;
    int running, queued;
    bool no_prefix;
    bool adaptive_threads; /* step_threads adaptive (the tests run fixed unless they ask) */
    bool priority;         /* priority scheduling */
    mr_act_mode act;       /* the experts' activation mode (AUTO: the weights' default) */
    const char *dir;       /* the checkpoint (NULL: tests/data/model/tiny) */
} eng_cfg;

static void eng_open(eng *g, const eng_cfg *c) {
    mr_engine_opts o = {.kv_dtype = c->kv, .kv_blocks = c->blocks, .max_batch_tokens = c->budget,
                        .max_running_requests = c->running, .max_queued_requests = c->queued,
                        .context_length = c->ctx, .no_prefix_caching = c->no_prefix,
                        .fixed_threads = !c->adaptive_threads, .priority_scheduling = c->priority};
    mr_model_opts mo = {.runner = c->runner ? c->runner : "routed", .act_mode = c->act, .quiet = true};
    mr_engine_model_opts(&o, &mo);
    mr_status st = mr_model_open(c->dir ? c->dir : tu_data("model/tiny"), &mo, &g->m);
    if (st) fprintf(stderr, "open: %s\n", mr_error_last());
    assert_int_equal(st, MR_OK);
    st = mr_engine_new(g->m, &o, &g->e);
    if (st) fprintf(stderr, "engine: %s\n", mr_error_last());
    assert_int_equal(st, MR_OK);
}

/* The end of every scenario: the accounting holds and nothing is referenced. */
/* 64 blocks, 64-token steps, 4 running, context 256, fp32 KV: the sampling tests' engine */
static void eng_open_small(eng *g) {
    eng_cfg c = {.kv = MR_FMT_F32, .blocks = 64, .budget = 64, .running = 4, .ctx = 256};
    eng_open(g, &c);
}

static void eng_close(eng *g) {
    mr_status st = mr_engine_check(g->e);
    if (st) fprintf(stderr, "check: %s\n", mr_error_last());
    assert_int_equal(st, MR_OK);
    mr_engine_stats s;
    mr_engine_stats_get(g->e, &s);
    assert_false(mr_engine_has_work(g->e));
    assert_int_equal(s.kv_blocks_used, 0);
    assert_int_equal(s.kv_blocks_free + s.kv_blocks_cached, s.kv_blocks_total);
    mr_engine_free(g->e);
    mr_model_close(g->m);
}

static void check_ok(const mr_engine *e) {
    mr_status st = mr_engine_check(e);
    if (st) fprintf(stderr, "check: %s\n", mr_error_last());
    assert_int_equal(st, MR_OK);
}

static void rand_prompt(tu_rng *r, int32_t *p, int64_t n) {
    for (int64_t i = 0; i < n; i++) p[i] = 3 + (int32_t)(tu_next(r) % (V - 3)); /* no EOS (2) in prompts */
}

/* n prompts of min .. min + span - 1 tokens, prompt i at p + i * stride (length, then tokens, per prompt) */
static void rand_prompts(tu_rng *r, int32_t *p, int64_t stride, int64_t *len, int n, int64_t min, int64_t span) {
    for (int i = 0; i < n; i++) {
        len[i] = min + (int64_t)(tu_next(r) % (uint64_t)span);
        rand_prompt(r, p + i * stride, len[i]);
    }
}

/* Outputs collected per request (user = index). */
#define MAXR 128
#define MAXG 64
typedef struct {
    int32_t tok[MAXR][MAXG];
    int n[MAXR];
    mr_finish_reason fin[MAXR];
    int64_t cached[MAXR];
} outs;

static void collect(outs *o, const mr_engine_step_out *so) {
    for (int k = 0; k < so->n_events; k++) {
        const mr_engine_event *v = &so->events[k];
        int i = (int)(intptr_t)v->user;
        assert_true(i >= 0 && i < MAXR);
        if (v->n_tokens) {
            assert_true(o->n[i] < MAXG);
            o->tok[i][o->n[i]++] = v->token;
            assert_int_equal(v->n_generated, o->n[i]);
        }
        if (v->finish) o->fin[i] = v->finish;
        o->cached[i] = v->n_cached;
    }
}

static void run_until_idle(mr_engine *e, outs *o, bool check_every_step) {
    for (int guard = 0; mr_engine_has_work(e); guard++) {
        assert_true(guard < 100000);
        const mr_engine_step_out *so;
        assert_int_equal(mr_engine_step(e, &so), MR_OK);
        collect(o, so);
        if (check_every_step) check_ok(e);
    }
}

static mr_req_id add_req(mr_engine *e, const int32_t *p, int64_t n, int64_t max_tokens, int user) {
    mr_request_params rp = {.prompt = p, .n_prompt = n, .max_tokens = max_tokens, .ignore_eos = true,
                            .user = (void *)(intptr_t)user};
    mr_req_id id = 0;
    mr_status st = mr_engine_add(e, &rp, &id);
    if (st) fprintf(stderr, "add: %s\n", mr_error_last());
    assert_int_equal(st, MR_OK);
    return id;
}

/* ---- scheduler: budget, chunked prefill in order, FCFS (no forward pass) ---- */

/* Complete a scheduled step without the model: logits that make token
 * 10 + (position of the sequence in the batch) the argmax. */
static void fake_complete(mr_engine *e, const mr_kv_batch *b, const mr_engine_step_out **so) {
    float *lg = mr_engine_logits_buffer(e);
    for (int i = 0; i < b->n_logits; i++) {
        for (int v = 0; v < V; v++) lg[(size_t)i * V + (size_t)v] = 0.0f;
        lg[(size_t)i * V + 10 + (size_t)(i % 200)] = 5.0f;
    }
    assert_int_equal(mr_engine_complete(e, MR_OK, lg, so), MR_OK);
}

static void test_budget_and_chunking(void **state) {
    (void)state;
    eng g;
    eng_cfg c = {.kv = MR_FMT_F32, .blocks = 1200, .budget = 64, .running = 8, .ctx = 12000};
    eng_open(&g, &c);
    tu_rng rng = {11};
    enum { N = 6 };
    int64_t len[N] = {10000, 3, 70, 64, 1, 129};
    int32_t *prompt[N];
    mr_req_id id[N];
    for (int i = 0; i < N; i++) {
        prompt[i] = malloc((size_t)len[i] * sizeof(int32_t));
        rand_prompt(&rng, prompt[i], len[i]);
        id[i] = add_req(g.e, prompt[i], len[i], 4, i);
    }
    int64_t done[N] = {0};   /* prompt tokens seen in batches, in order */
    int first_step[N], chunks[N] = {0}, n_gen[N] = {0}, order[N], n_order = 0;
    for (int i = 0; i < N; i++) first_step[i] = -1;
    for (int step = 0; mr_engine_has_work(g.e); step++) {
        assert_true(step < 10000);
        const mr_kv_batch *b;
        assert_int_equal(mr_engine_schedule(g.e, &b), MR_OK);
        assert_true(b->n_tokens <= c.budget); /* never above the budget */
        int64_t t = 0;
        int partial = 0;
        for (int s = 0; s < b->n_seq; s++) {
            const mr__req *r = &g.e->req[g.e->sched[s].slot];
            int i = -1;
            for (int k = 0; k < N; k++)
                if (id[k] == r->id) i = k;
            assert_true(i >= 0);
            if (first_step[i] < 0) {
                first_step[i] = step;
                order[n_order++] = i;
            }
            if (done[i] < len[i]) { /* prefill: the next prompt tokens, in order */
                assert_int_equal(b->start[s], done[i]);
                assert_memory_equal(b->tokens + t, prompt[i] + done[i], (size_t)b->n_tok[s] * sizeof(int32_t));
                done[i] += b->n_tok[s];
                assert_true(done[i] <= len[i]);
                chunks[i]++;
                if (done[i] < len[i]) partial++;
                assert_int_equal(b->want_logits[s], done[i] == len[i]);
            } else { /* decode: one token, the previous output, at the next position */
                assert_int_equal(b->n_tok[s], 1);
                assert_int_equal(b->start[s], len[i] + n_gen[i] - 1);
                assert_true(b->want_logits[s]);
            }
            /* the table covers every position the sequence reads or writes */
            assert_true((int64_t)(b->bt_off[s + 1] - b->bt_off[s]) * MR_KV_BLOCK_TOKENS >= b->start[s] + b->n_tok[s]);
            t += b->n_tok[s];
        }
        assert_int_equal(t, b->n_tokens);
        assert_true(partial <= 1); /* at most one partial prefill chunk per step */
        const mr_engine_step_out *so;
        fake_complete(g.e, b, &so);
        for (int k = 0; k < so->n_events; k++) {
            int i = (int)(intptr_t)so->events[k].user;
            if (so->events[k].n_tokens) {
                assert_int_equal(done[i], len[i]); /* a token only after the whole prompt */
                n_gen[i]++;
            }
        }
        check_ok(g.e);
    }
    for (int i = 0; i < N; i++) {
        assert_int_equal(done[i], len[i]);
        assert_int_equal(n_gen[i], 4);
        assert_int_equal(order[i], i); /* first come, first served */
    }
    assert_true(chunks[0] >= 10000 / 64); /* the 10k prompt went in chunks of at most the budget */
    eng_close(&g);
    for (int i = 0; i < N; i++) free(prompt[i]);
}

/* ---- paged vs contiguous (model level) ---- */

/* The same mixed batches through the contiguous cache and the paged pool
 * (shuffled, non-contiguous blocks; or, shuffle false, each sequence's blocks
 * with consecutive ids: rows attention reads as one run across blocks);
 * returns max |logit difference| and asserts greedy agreement. */
static float paged_vs_contiguous(const char *runner, mr_format kv, bool shuffle) {
    enum { NS = 4, CTX = 128, NB = 64 };
    mr_model_opts o = {.runner = runner, .quiet = true, .max_batch = NS, .max_ctx = CTX, .max_tokens = 128,
                       .kv_blocks = NB, .kv_dtype = kv};
    mr_model *m = NULL;
    assert_int_equal(mr_model_open(tu_data("model/tiny"), &o, &m), MR_OK);
    tu_rng rng = {5};
    int32_t perm[NB];
    for (int i = 0; i < NB; i++) perm[i] = i;
    for (int i = NB - 1; shuffle && i > 0; i--) {
        int j = (int)(tu_next(&rng) % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t bt[NS][8]; /* 8 blocks = 128 positions per sequence */
    for (int s = 0; s < NS; s++)
        for (int j = 0; j < 8; j++) bt[s][j] = perm[s * 8 + j];
    /* steps: new tokens per sequence (0 = not in this step) */
    static const int64_t plan[][NS] = {{37, 5, 20, 0}, {1, 12, 0, 16}, {1, 1, 1, 1}, {1, 0, 30, 1},
                                       {1, 1, 1, 1},   {15, 1, 1, 2},  {1, 1, 1, 1}, {1, 1, 1, 1}};
    int64_t len[NS] = {0};
    float worst = 0.0f;
    float *lc = malloc((size_t)NS * V * sizeof(float)), *lp = malloc((size_t)NS * V * sizeof(float));
    for (size_t st = 0; st < sizeof plan / sizeof plan[0]; st++) {
        int seq[NS], n_seq = 0;
        int64_t ntok[NS], start[NS];
        int32_t toks[256], btoff[NS + 1], blocks[NS * 8];
        uint8_t want[NS];
        int64_t total = 0;
        btoff[0] = 0;
        for (int s = 0; s < NS; s++) {
            if (!plan[st][s]) continue;
            seq[n_seq] = s;
            ntok[n_seq] = plan[st][s];
            start[n_seq] = len[s];
            rand_prompt(&rng, toks + total, plan[st][s]);
            total += plan[st][s];
            int32_t nb = (int32_t)((len[s] + plan[st][s] + 15) / 16);
            memcpy(blocks + btoff[n_seq], bt[s], (size_t)nb * sizeof(int32_t));
            btoff[n_seq + 1] = btoff[n_seq] + nb;
            want[n_seq] = 1;
            n_seq++;
        }
        mr_batch cb = {.n_seq = n_seq, .seq = seq, .n_tok = ntok, .tokens = toks};
        mr_kv_batch pb = {.n_seq = n_seq, .n_tokens = total, .tokens = toks, .n_tok = ntok, .start = start,
                          .bt_off = btoff, .block_ids = blocks, .want_logits = want, .n_logits = n_seq};
        assert_int_equal(mr_model_forward(m, &cb, lc), MR_OK);
        assert_int_equal(mr_model_forward_kv(m, &pb, lp), MR_OK);
        for (int i = 0; i < n_seq; i++) {
            for (int v = 0; v < V; v++) {
                float d = fabsf(lc[i * V + v] - lp[i * V + v]);
                if (!(d <= worst)) worst = d;
            }
            if (kv == MR_FMT_F32) assert_int_equal(mr_argmax(lc + i * V, V), mr_argmax(lp + i * V, V));
            len[seq[i]] += ntok[i];
        }
    }
    free(lc);
    free(lp);
    mr_model_close(m);
    return worst;
}

/* bf16 KV: K and V rounded to 8 mantissa bits (relative error <= 2^-9 per
 * element). Through two layers of this model the logits (|l| ~ 5) move by at
 * most ~1e-2; the bound below is 5x what was measured, and far below what a
 * wrong block (another sequence's K/V) gives (~1). */
#define BF16_KV_TOL 5e-2f

static void test_paged_vs_contiguous(void **state) {
    (void)state;
    const char *runners[] = {"reference", "routed"};
    for (int r = 0; r < 2; r++) {
        for (int shuffle = 0; shuffle < 2; shuffle++) {
            float e32 = paged_vs_contiguous(runners[r], MR_FMT_F32, shuffle);
            if (e32 != 0.0f) fprintf(stderr, "%s fp32 paged vs contiguous: %g\n", runners[r], (double)e32);
            assert_true(e32 == 0.0f); /* the same arithmetic, bit for bit */
        }
        float e16 = paged_vs_contiguous(runners[r], MR_FMT_BF16, true);
        fprintf(stderr, "  %s: bf16 KV max |logit diff| vs fp32 contiguous %.3g (tol %.3g)\n", runners[r], (double)e16,
                (double)BF16_KV_TOL);
        assert_true(e16 > 0.0f);           /* bf16 really rounds */
        assert_true(e16 <= BF16_KV_TOL);
    }
}

/* A bad paged batch is refused before anything is written. */
static void test_kv_batch_refused(void **state) {
    (void)state;
    mr_model_opts o = {.runner = "reference", .quiet = true, .max_ctx = 64, .max_tokens = 32, .kv_blocks = 8};
    mr_model *m = NULL;
    assert_int_equal(mr_model_open(tu_data("model/tiny"), &o, &m), MR_OK);
    int32_t toks[4] = {5, 6, 7, 8}, btoff[3] = {0, 1, 2}, blocks[2] = {3, 3};
    int64_t ntok[2] = {2, 2}, start[2] = {0, 0};
    uint8_t want[2] = {1, 1};
    float lg[2 * V];
    mr_kv_batch b = {.n_seq = 2, .n_tokens = 4, .tokens = toks, .n_tok = ntok, .start = start, .bt_off = btoff,
                     .block_ids = blocks, .want_logits = want, .n_logits = 2};
    assert_int_equal(mr_model_forward_kv(m, &b, lg), MR_EINVAL); /* two sequences write block 3 */
    assert_non_null(strstr(mr_error_last(), "written by two sequences"));
    blocks[1] = 8;
    assert_int_equal(mr_model_forward_kv(m, &b, lg), MR_EINVAL); /* outside the pool */
    blocks[1] = 4;
    start[1] = 15; /* positions 15, 16 need two blocks, the table has one */
    assert_int_equal(mr_model_forward_kv(m, &b, lg), MR_EINVAL);
    start[1] = 0;
    b.n_logits = 1;
    assert_int_equal(mr_model_forward_kv(m, &b, lg), MR_EINVAL);
    b.n_logits = 2;
    toks[3] = V;
    assert_int_equal(mr_model_forward_kv(m, &b, lg), MR_EINPUT);
    toks[3] = 8;
    b.n_tokens = 40;
    assert_int_equal(mr_model_forward_kv(m, &b, lg), MR_ECAPACITY);
    b.n_tokens = 4;
    assert_int_equal(mr_model_forward_kv(m, &b, lg), MR_OK);
    /* a model without a contiguous cache refuses the slot API */
    int slot = 0;
    int64_t n = 1;
    mr_batch cb = {.n_seq = 1, .seq = &slot, .n_tok = &n, .tokens = toks};
    assert_int_equal(mr_model_forward(m, &cb, lg), MR_ESTATE);
    mr_model_close(m);
}

/* ---- batch invariance ---- */

static void batch_invariance(const char *runner) {
    enum { N = 64, G = 24 };
    tu_rng rng = {99};
    int32_t prompt[N][60];
    int64_t len[N];
    rand_prompts(&rng, prompt[0], 60, len, N, 1, 60);
    eng_cfg c = {.runner = runner, .kv = MR_FMT_F32, .blocks = 512, .budget = 128, .running = 64, .ctx = 256};
    static outs alone, together;
    memset(&alone, 0, sizeof alone);
    memset(&together, 0, sizeof together);
    eng g;
    eng_open(&g, &c);
    for (int i = 0; i < N; i++) { /* each request alone */
        add_req(g.e, prompt[i], len[i], G, i);
        run_until_idle(g.e, &alone, false);
    }
    for (int i = 0; i < N; i++) add_req(g.e, prompt[i], len[i], G, i); /* all 64 at once */
    run_until_idle(g.e, &together, true);
    for (int i = 0; i < N; i++) {
        assert_int_equal(alone.n[i], G);
        assert_int_equal(together.n[i], G);
        if (memcmp(alone.tok[i], together.tok[i], G * sizeof(int32_t)))
            fail_msg("runner %s: request %d's tokens differ alone and among %d others", runner, i, N - 1);
        assert_int_equal(together.fin[i], MR_FINISH_LENGTH);
    }
    eng_close(&g);
}

static void test_batch_invariance(void **state) {
    (void)state;
    batch_invariance("reference");
    batch_invariance("routed");
}

/* ---- deterministic inference (mr_kernels_set_batch_invariant) ----
 * The oracle is the request alone: the raw logits row behind each of its tokens, bit for bit,
 * against the same request among 47 others that arrive together (prefill chunks of the 96-token
 * step, decode batches of every size as requests come and go) after the first pass filled the
 * prefix cache (cache hits of every length). Every expert kind: the tiny model's bf16 experts in
 * w16a32 (BF16_F32) and w16a16 (BF16_BF16), gen-tiny FP8 checkpoints in w8a8 and w8a16
 * (FP8_BF16) and NVFP4 ones in w4a4, w4a8 (NVFP4_I8) and w4a16 (NVFP4_BF16), on whatever kernel
 * level the process has (ctest runs this suite on each: MR_ISA_SUITES). Returns the tokens whose
 * logits differ; with the mode off that is printed, not checked (the generic and AMX kernels are
 * batch-invariant anyway). */
static uint64_t bits_hash(const float *v, int64_t n) {
    uint64_t h = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)v;
    for (size_t i = 0; i < (size_t)n * sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static int logits_differ(const char *dir, mr_act_mode act, bool invariant) {
    enum { N = 48, G = 6 };
    mr_kernels_set_batch_invariant(invariant);
    tu_rng rng = {0xD37};
    static int32_t prompt[N][60];
    int64_t len[N];
    rand_prompts(&rng, prompt[0], 60, len, N, 1, 60);
    for (int i = 1; i < N; i += 3) memcpy(prompt[i], prompt[i - 1], 30 * sizeof(int32_t)); /* shared prefixes */
    eng_cfg c = {.kv = MR_FMT_F32, .blocks = 512, .budget = 96, .running = 64, .ctx = 256, .act = act, .dir = dir};
    eng g;
    eng_open(&g, &c);
    assert_int_equal(mr_kernels_get()->batch_invariant, invariant);
    assert_int_equal(mr_model_act_mode(g.m), act);
    const int64_t vocab = mr_model_config_of(g.m)->vocab;
    static uint64_t h[2][N][G];
    int differ = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < N; i++) {
            mr_request_params rp = {.prompt = prompt[i], .n_prompt = len[i], .max_tokens = G, .ignore_eos = true,
                                    .want_logits = true, .user = (void *)(intptr_t)i};
            mr_req_id id;
            assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_OK);
            /* pass 0: each alone, to its end; pass 1: all of them at once */
            for (int guard = 0; (pass == 0 || i == N - 1) && mr_engine_has_work(g.e); guard++) {
                assert_true(guard < 100000);
                const mr_engine_step_out *so;
                assert_int_equal(mr_engine_step(g.e, &so), MR_OK);
                for (int k = 0; k < so->n_events; k++) {
                    const mr_engine_event *v = &so->events[k];
                    if (!v->n_tokens) continue;
                    assert_non_null(v->logits);
                    assert_true(v->n_generated >= 1 && v->n_generated <= G);
                    h[pass][(intptr_t)v->user][v->n_generated - 1] = bits_hash(v->logits, vocab);
                }
            }
        }
    }
    for (int i = 0; i < N; i++)
        for (int j = 0; j < G; j++) differ += h[0][i][j] != h[1][i][j];
    eng_close(&g);
    mr_kernels_set_batch_invariant(false);
    return differ;
}

static void test_deterministic_inference(void **state) {
    (void)state;
    char *tmp = tu_tmpdir("deterministic");
    char fp8[512], nvfp4[512];
    snprintf(fp8, sizeof fp8, "%s/fp8", tmp);
    snprintf(nvfp4, sizeof nvfp4, "%s/nvfp4", tmp);
    mr_tiny_params tp = {.hidden = 128, .layers = 2, .experts = 16, .top_k = 4, .inter = 128, .heads = 4, .kv_heads = 2,
                         .head_dim = 32, .rotary_dim = 16, .vocab = 256, .quant = MR_FMT_FP8_BLOCK, .seed = 5};
    assert_int_equal(mr_tiny_write(fp8, &tp), MR_OK);
    tp.quant = MR_FMT_NVFP4;
    assert_int_equal(mr_tiny_write(nvfp4, &tp), MR_OK);
    const struct {
        const char *dir;
        mr_act_mode act;
    } cases[] = {{NULL, MR_ACT_W16A32}, {NULL, MR_ACT_W16A16}, {fp8, MR_ACT_W8A8},   {fp8, MR_ACT_W8A16},
                 {nvfp4, MR_ACT_W4A4},  {nvfp4, MR_ACT_W4A8},  {nvfp4, MR_ACT_W4A16}};
    for (size_t a = 0; a < sizeof cases / sizeof cases[0]; a++) {
        const int off = logits_differ(cases[a].dir, cases[a].act, false);
        const int on = logits_differ(cases[a].dir, cases[a].act, true);
        print_message("%s %s: tokens whose logits differ alone and in the batch: %d with the fastest kernels, %d "
                      "batch-invariant\n",
                      mr_kernels_get()->isa, mr_act_mode_name(cases[a].act), off, on);
        assert_int_equal(on, 0);
    }
    tu_rmtree(tmp);
    free(tmp);
}

/* ---- threads per step (threads.c) ---- */

/* A simulated host: ns of a one-token step on count k (0 one thread, 1 all)
 * at step i. quiet: all threads 1.6x faster, the cost drifting up with the
 * context. busy (another process on a core): one thread 300 us, all threads
 * mostly 200 us but one step in 6 a 4.3 ms time slice late (mean 917 us).
 * The first step on each count pays 5 ms (thread start). */
typedef struct {
    tu_rng rng;
    bool warm[2];
} sim_host;

static uint64_t sim_cost(sim_host *h, bool busy, int k, int64_t i) {
    uint64_t ns;
    if (!busy) ns = (uint64_t)((k ? 100000.0 : 160000.0) * (1.0 + (double)i * 1e-4));
    else ns = k ? 200000 + (tu_next(&h->rng) % 6 == 0 ? 4300000 : 0) : 300000;
    if (!h->warm[k]) ns += 5000000;
    h->warm[k] = true;
    return ns;
}

typedef struct {
    double ns;         /* total simulated time */
    int64_t steps[2];  /* steps per count */
} sim_run;

/* n steps of one token from step i0, busy for steps below busy_until. */
static sim_run sim_steps(mr__thr *t, sim_host *h, uint64_t *now, int64_t i0, int64_t n, int64_t busy_until) {
    sim_run r = {0};
    for (int64_t i = i0; i < i0 + n; i++) {
        const int k = mr__thr_pick(t, 1, *now);
        assert_true(k == 0 || k == 1);
        const uint64_t ns = sim_cost(h, i < busy_until, k, i);
        mr__thr_seen(t, 1, k, ns);
        *now += ns;
        r.ns += (double)ns;
        r.steps[k]++;
    }
    return r;
}

/* What one count alone would have cost over the same steps (no thread start). */
static double sim_alone(int k, int64_t i0, int64_t n, int64_t busy_until) {
    sim_host h = {.rng = {7}, .warm = {true, true}};
    double s = 0;
    for (int64_t i = i0; i < i0 + n; i++) s += (double)sim_cost(&h, i < busy_until, k, i);
    return s;
}

static void test_step_threads(void **state) {
    (void)state;
    enum { N = 20000 };
    mr__thr t;
    /* quiet: all threads all along but for the tries, which cost about 1/64 of the time */
    mr__thr_init(&t, 2, false);
    sim_host h = {.rng = {7}};
    uint64_t now = 1;
    sim_run r = sim_steps(&t, &h, &now, 0, N, 0);
    const double quiet_all = sim_alone(1, 0, N, 0);
    printf("quiet: %lld steps on one thread of %d, %.3f x all threads' time\n", (long long)r.steps[0], N,
           r.ns / quiet_all);
    assert_true(r.ns <= 1.02 * quiet_all + 10e6); /* + the two thread starts */
    assert_true(r.steps[0] < N / 20);
    assert_int_equal(t.c[0].cur, 1);
    /* busy: one thread, soon */
    mr__thr_init(&t, 2, false);
    h = (sim_host){.rng = {7}};
    now = 1;
    r = sim_steps(&t, &h, &now, 0, N, N);
    const double busy_one = sim_alone(0, 0, N, N), busy_all = sim_alone(1, 0, N, N);
    printf("busy: %lld steps on one thread of %d, %.3f x one thread's time, %.3f x all threads'\n",
           (long long)r.steps[0], N, r.ns / busy_one, r.ns / busy_all);
    assert_true(r.ns <= 1.1 * busy_one);
    assert_int_equal(t.c[0].cur, 0);
    /* the load goes away: back to all threads within 64 x 16 of the busy all-thread steps the
     * picker expects (1.5 s here), then the quiet cost */
    sim_run q = sim_steps(&t, &h, &now, N, N / 2, N);
    const double after = sim_alone(1, N, N / 2, 0);
    printf("quiet again: %lld steps on one thread of %d, %.3f x all threads' time\n", (long long)q.steps[0], N / 2,
           q.ns / after);
    assert_int_equal(t.c[0].cur, 1);
    assert_true(q.ns <= 1.25 * after);
    q = sim_steps(&t, &h, &now, N + N / 2, N / 2, N);
    assert_true(q.ns <= 1.02 * sim_alone(1, N + N / 2, N / 2, 0));
    /* and it comes back: busy again */
    r = sim_steps(&t, &h, &now, 2 * N, N, 3 * N);
    assert_int_equal(t.c[0].cur, 0);
    assert_true(r.ns <= 1.1 * sim_alone(0, 2 * N, N, 3 * N));
    /* the classes are apart: 300-token steps keep their own choice (here never tried on one thread
     * before their clock allows: the first try waits 8 x 16 of its guessed steps) */
    for (int i = 0; i < 100; i++) {
        const int k = mr__thr_pick(&t, 300, now);
        assert_int_equal(k, 1);
        mr__thr_seen(&t, 300, k, 300 * 100000ull);
        now += 300 * 100000ull;
    }
    assert_int_equal(t.c[0].cur, 0); /* one-token steps still on one thread */
    /* fixed, or a single thread: always "all" */
    mr__thr_init(&t, 2, true);
    h = (sim_host){.rng = {7}};
    r = sim_steps(&t, &h, &now, 0, 1000, 1000);
    assert_int_equal(r.steps[0], 0);
    mr__thr_init(&t, 1, false);
    r = sim_steps(&t, &h, &now, 0, 1000, 1000);
    assert_int_equal(r.steps[0], 0);
}

/* The same tokens whether steps run on one thread or two: decodes forced onto one thread, prefill
 * steps on two, against every step on two threads (fixed). */
static void test_step_threads_tokens(void **state) {
    (void)state;
    enum { N = 12, G = 20 };
    const int before = omp_get_max_threads();
    omp_set_num_threads(2);
    tu_rng rng = {5};
    int32_t prompt[N][40];
    int64_t len[N];
    rand_prompts(&rng, prompt[0], 40, len, N, 1, 40);
    static outs fixed, mixed;
    memset(&fixed, 0, sizeof fixed);
    memset(&mixed, 0, sizeof mixed);
    for (int pass = 0; pass < 2; pass++) {
        eng_cfg c = {.kv = MR_FMT_F32, .blocks = 256, .budget = 64, .running = 4, .ctx = 128,
                     .adaptive_threads = pass == 1};
        eng g;
        eng_open(&g, &c);
        if (pass == 1) { /* classes of 1-3 tokens run on one thread, never tried on two */
            assert_false(g.e->thr.fixed);
            for (int cl = 0; cl < 2; cl++) {
                mr__thr_class *tc = &g.e->thr.c[cl];
                tc->cur = 0;
                tc->cur_ns = 1e15;
                tc->n_cur = 1;
                tc->warm[0] = tc->warm[1] = true;
            }
        }
        for (int i = 0; i < N; i++) add_req(g.e, prompt[i], len[i], G, i);
        run_until_idle(g.e, pass ? &mixed : &fixed, false);
        mr_engine_stats s;
        mr_engine_stats_get(g.e, &s);
        if (pass == 0) assert_int_equal(s.steps_one_thread, 0);
        else assert_true(s.steps_one_thread > 0 && s.steps_one_thread < s.steps);
        eng_close(&g);
    }
    for (int i = 0; i < N; i++) {
        assert_int_equal(mixed.n[i], G);
        if (memcmp(fixed.tok[i], mixed.tok[i], G * sizeof(int32_t)))
            fail_msg("request %d: other tokens when its decode steps ran on one thread", i);
    }
    omp_set_num_threads(before);
}

/* ---- prefix sharing and eviction ---- */

/* A small engine (16 blocks, 2 running, context 64) and empty outputs. */
static void eng_open_tiny(eng *g, outs *o) {
    eng_cfg c = {.kv = MR_FMT_F32, .blocks = 16, .budget = 64, .running = 2, .ctx = 64};
    eng_open(g, &c);
    memset(o, 0, sizeof *o);
}

static void test_prefix_sharing(void **state) {
    (void)state;
    enum { P = 200, G = 16 };
    tu_rng rng = {7};
    int32_t a[P + 7], b[P + 30];
    rand_prompt(&rng, a, P + 7);
    memcpy(b, a, P * sizeof(int32_t)); /* a common 200-token prefix */
    rand_prompt(&rng, b + P, 30);
    outs with, without;
    for (int pass = 0; pass < 2; pass++) {
        outs *o = pass ? &without : &with;
        memset(o, 0, sizeof *o);
        eng g;
        eng_cfg c = {.kv = MR_FMT_F32, .blocks = 64, .budget = 512, .running = 4, .ctx = 512, .no_prefix = pass == 1};
        eng_open(&g, &c);
        mr_req_id ia = add_req(g.e, a, P + 7, G, 0);
        const mr_engine_step_out *so;
        assert_int_equal(mr_engine_step(g.e, &so), MR_OK); /* A's prefill: its 12 full prompt blocks are cached */
        collect(o, so);
        mr_req_id ib = add_req(g.e, b, P + 30, G, 1);
        assert_int_equal(mr_engine_step(g.e, &so), MR_OK);
        collect(o, so);
        mr_engine_stats s;
        mr_engine_stats_get(g.e, &s);
        const mr__req *ra = &g.e->req[(ia & 0xffffffffu) - 1], *rb = &g.e->req[(ib & 0xffffffffu) - 1];
        if (pass == 0) {
            assert_int_equal(s.prefix_hit_blocks, P / 16); /* 12 blocks = 192 tokens shared */
            assert_int_equal(s.prefix_hits, (P / 16) * 16);
            assert_int_equal(o->cached[1], (P / 16) * 16);
            for (int j = 0; j < P / 16; j++) assert_int_equal(ra->bt[j], rb->bt[j]);
            assert_true(ra->bt[P / 16] != rb->bt[P / 16]); /* the block holding positions 192..207 differs */
            /* blocks in use: A's 13 + B's 15 - the 12 shared */
            assert_int_equal(s.kv_blocks_used, 13 + 15 - P / 16);
        } else {
            assert_int_equal(s.prefix_hit_blocks, 0);
            assert_int_equal(s.kv_blocks_used, 13 + 15);
        }
        run_until_idle(g.e, o, true);
        eng_close(&g);
    }
    for (int i = 0; i < 2; i++) {
        assert_int_equal(with.n[i], G);
        assert_memory_equal(with.tok[i], without.tok[i], G * sizeof(int32_t)); /* sharing changes nothing */
    }
    /* a prompt cached whole (32 tokens, two full blocks): its last block is
     * computed again, for the logits of its last token; same tokens */
    eng g;
    outs o;
    eng_open_tiny(&g, &o);
    add_req(g.e, a, 32, G, 0);
    run_until_idle(g.e, &o, true);
    add_req(g.e, a, 32, G, 1);
    run_until_idle(g.e, &o, true);
    assert_int_equal(o.cached[0], 0);
    assert_int_equal(o.cached[1], 16);
    assert_int_equal(o.n[1], G);
    assert_memory_equal(o.tok[0], o.tok[1], G * sizeof(int32_t));
    eng_close(&g);
}

/* vLLM's cache_salt: a salted prompt hits only blocks cached under the same salt (bytes and length: a salt
 * differing after 64 bytes, or by a trailing NUL, is another); the unsalted cache and the salted ones never
 * share; salts change no token; a salt above the limit is refused. */
static mr_req_id add_salted(mr_engine *e, const int32_t *p, int64_t n, int user, const char *salt, size_t ns) {
    mr_request_params rp = {.prompt = p, .n_prompt = n, .max_tokens = 4, .ignore_eos = true,
                            .user = (void *)(intptr_t)user, .cache_salt = salt, .n_cache_salt = ns};
    mr_req_id id = 0;
    assert_int_equal(mr_engine_add(e, &rp, &id), MR_OK);
    return id;
}
static void test_cache_salt(void **state) {
    (void)state;
    tu_rng rng = {17};
    int32_t a[40];
    rand_prompt(&rng, a, 40);
    char long1[100], long2[100];
    memset(long1, 'k', sizeof long1);
    memcpy(long2, long1, sizeof long2);
    long2[80] = 'j'; /* differs in the second 64-byte round */
    const struct {
        const char *salt;
        size_t n;
        int64_t want; /* tokens cached: 32 (two full blocks) when the salt was seen */
    } seq[] = {{"tenant-a", 8, 0}, {"tenant-a", 8, 32}, {"tenant-b", 8, 0}, {NULL, 0, 0},   {NULL, 0, 32},
               {"tenant-a", 9, 0}, {long1, 100, 0},   {long2, 100, 0},    {long1, 100, 32}, {"tenant-b", 8, 32}};
    eng g;
    outs o;
    eng_open_tiny(&g, &o);
    for (int i = 0; i < (int)(sizeof seq / sizeof seq[0]); i++) {
        add_salted(g.e, a, 40, i, seq[i].salt, seq[i].n); /* "tenant-a" with 9 bytes: its NUL too */
        run_until_idle(g.e, &o, true);
        if (o.cached[i] != seq[i].want) fprintf(stderr, "cache_salt request %d: %lld cached\n", i, (long long)o.cached[i]);
        assert_int_equal(o.cached[i], seq[i].want);
        assert_int_equal(o.n[i], 4);
        assert_memory_equal(o.tok[i], o.tok[0], 4 * sizeof(int32_t));
    }
    assert_int_equal(mr_engine_check(g.e), MR_OK);
    char big[MR_ENGINE_MAX_CACHE_SALT + 1];
    memset(big, 's', sizeof big);
    mr_request_params rp = {.prompt = a, .n_prompt = 8, .max_tokens = 2, .cache_salt = big, .n_cache_salt = sizeof big};
    mr_req_id id;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINVAL);
    rp.cache_salt = NULL;
    rp.n_cache_salt = 3;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINVAL);
    eng_close(&g);
}

/* Flushing the prefix cache: refused (nothing changed) while a request waits or runs; when idle every
 * cached block is free again, the pool is consistent, and the same prompt then hits nothing and gives the
 * same tokens. */
static void test_prefix_flush(void **state) {
    (void)state;
    enum { G = 8 };
    tu_rng rng = {11};
    int32_t a[40];
    rand_prompt(&rng, a, 40);
    eng g;
    outs o;
    eng_open_tiny(&g, &o);
    add_req(g.e, a, 40, G, 0);
    run_until_idle(g.e, &o, true);
    mr_engine_stats s;
    mr_engine_stats_get(g.e, &s);
    const int64_t cached = s.kv_blocks_cached;
    assert_true(cached >= 2); /* the prompt's two full blocks, at least */
    add_req(g.e, a, 40, G, 1);
    const mr_engine_step_out *so;
    assert_int_equal(mr_engine_step(g.e, &so), MR_OK); /* it runs, on its cache hits */
    collect(&o, so);
    int64_t dropped = -1;
    assert_int_equal(mr_engine_flush_prefix_cache(g.e, &dropped), MR_ESTATE); /* one runs */
    assert_int_equal(dropped, 0);
    run_until_idle(g.e, &o, true);
    assert_int_equal(o.cached[1], 32); /* the cache was kept */
    mr_engine_stats_get(g.e, &s);
    assert_int_equal(mr_engine_flush_prefix_cache(g.e, &dropped), MR_OK);
    assert_int_equal(dropped, s.kv_blocks_cached);
    mr_engine_stats_get(g.e, &s);
    assert_int_equal(s.kv_blocks_cached, 0);
    assert_int_equal(s.kv_blocks_used, 0);
    assert_int_equal(mr_engine_check(g.e), MR_OK);
    add_req(g.e, a, 40, G, 2);
    run_until_idle(g.e, &o, true);
    assert_int_equal(o.cached[2], 0);
    assert_memory_equal(o.tok[0], o.tok[2], G * sizeof(int32_t));
    assert_memory_equal(o.tok[1], o.tok[2], G * sizeof(int32_t));
    assert_int_equal(mr_engine_check(g.e), MR_OK);
    eng_close(&g);
}

/* Many requests over a few shared prefixes in a pool that cannot keep them
 * all: cached blocks are evicted and reused, and every output equals the
 * one of a large pool without prefix caching. */
static void test_eviction_under_pressure(void **state) {
    (void)state;
    enum { N = 40, G = 8, NP = 5 };
    tu_rng rng = {3};
    int32_t pre[NP][48], prompt[N][80];
    int64_t len[N];
    for (int k = 0; k < NP; k++) rand_prompt(&rng, pre[k], 48);
    for (int i = 0; i < N; i++) {
        int k = (int)(tu_next(&rng) % NP);
        int64_t plen = 16 * (1 + (int64_t)(tu_next(&rng) % 3)); /* share 16, 32 or 48 tokens */
        memcpy(prompt[i], pre[k], (size_t)plen * sizeof(int32_t));
        len[i] = plen + 1 + (int64_t)(tu_next(&rng) % 20);
        rand_prompt(&rng, prompt[i] + plen, len[i] - plen);
    }
    static outs small, big;
    memset(&small, 0, sizeof small);
    memset(&big, 0, sizeof big);
    eng g;
    eng_cfg cs = {.kv = MR_FMT_F32, .blocks = 16, .budget = 64, .running = 2, .ctx = 128};
    eng_open(&g, &cs);
    for (int i = 0; i < N; i++) add_req(g.e, prompt[i], len[i], G, i);
    run_until_idle(g.e, &small, true);
    mr_engine_stats s;
    mr_engine_stats_get(g.e, &s);
    assert_true(s.evictions > 0);
    assert_true(s.prefix_hit_blocks > 0);
    eng_close(&g);
    eng_cfg cb = {.kv = MR_FMT_F32, .blocks = 1024, .budget = 64, .running = 2, .ctx = 128, .no_prefix = true};
    eng_open(&g, &cb);
    for (int i = 0; i < N; i++) add_req(g.e, prompt[i], len[i], G, i);
    run_until_idle(g.e, &big, false);
    eng_close(&g);
    for (int i = 0; i < N; i++) {
        assert_int_equal(small.n[i], G);
        assert_memory_equal(small.tok[i], big.tok[i], G * sizeof(int32_t));
    }
}

/* Holding the schedule (the server's pause and weight updates). Under MR_HOLD_ALL nothing is computed: the
 * running request keeps its blocks and produces nothing, a new one waits, a cancelled one still ends; under
 * MR_HOLD_ADMIT the running one goes on to its end while the waiting one stays; a flush is refused while one
 * runs and taken with one waiting; mr_engine_retract sends the running ones back with their blocks freed. Every
 * output equals an unheld run's (retracted requests recompute their KV). */
static void test_hold_and_retract(void **state) {
    (void)state;
    enum { G = 12 };
    tu_rng rng = {31};
    int32_t p[3][30];
    for (int i = 0; i < 3; i++) rand_prompt(&rng, p[i], 30);
    static outs ref, o;
    memset(&ref, 0, sizeof ref);
    memset(&o, 0, sizeof o);
    eng g;
    eng_cfg c = {.kv = MR_FMT_F32, .blocks = 64, .budget = 64, .running = 4, .ctx = 128};
    eng_open(&g, &c);
    for (int i = 0; i < 3; i++) add_req(g.e, p[i], 30, G, i);
    run_until_idle(g.e, &ref, true);
    eng_close(&g);
    eng_open(&g, &c);
    const mr_engine_step_out *so;
    add_req(g.e, p[0], 30, G, 0);
    for (int k = 0; k < 3; k++) { /* prefill + 2 decodes: 3 tokens */
        assert_int_equal(mr_engine_step(g.e, &so), MR_OK);
        collect(&o, so);
    }
    assert_int_equal(o.n[0], 3);
    mr_engine_set_hold(g.e, MR_HOLD_ALL);
    add_req(g.e, p[1], 30, G, 1);
    mr_req_id gone = add_req(g.e, p[2], 30, G, 2);
    assert_false(mr_engine_has_runnable(g.e));
    assert_true(mr_engine_has_work(g.e));
    assert_int_equal(mr_engine_cancel(g.e, gone), MR_OK);
    for (int k = 0; k < 4; k++) {
        assert_int_equal(mr_engine_step(g.e, &so), MR_OK);
        assert_int_equal(so->n_tokens, 0);
        collect(&o, so);
        check_ok(g.e);
    }
    assert_int_equal(o.n[0], 3);
    assert_int_equal(o.n[1], 0);
    assert_int_equal(o.fin[2], MR_FINISH_CANCELLED);
    mr_engine_stats s;
    mr_engine_stats_get(g.e, &s);
    assert_true(s.kv_blocks_used > 0); /* request 0 keeps its KV */
    assert_int_equal(mr_engine_running(g.e), 1);
    int64_t dropped;
    assert_int_equal(mr_engine_flush_prefix_cache(g.e, &dropped), MR_ESTATE);
    /* drain: request 0 ends, request 1 never starts */
    mr_engine_set_hold(g.e, MR_HOLD_ADMIT);
    for (int guard = 0; mr_engine_has_runnable(g.e); guard++) {
        assert_true(guard < 1000);
        assert_int_equal(mr_engine_step(g.e, &so), MR_OK);
        collect(&o, so);
        check_ok(g.e);
    }
    assert_int_equal(o.fin[0], MR_FINISH_LENGTH);
    assert_int_equal(o.n[1], 0);
    assert_int_equal(mr_engine_running(g.e), 0);
    assert_true(mr_engine_has_work(g.e));
    assert_int_equal(mr_engine_flush_prefix_cache(g.e, &dropped), MR_OK); /* one waits, holding nothing */
    assert_true(dropped > 0);
    /* request 1 runs 4 tokens, is retracted, and resumes */
    mr_engine_set_hold(g.e, MR_HOLD_NONE);
    for (int k = 0; k < 4; k++) {
        assert_int_equal(mr_engine_step(g.e, &so), MR_OK);
        collect(&o, so);
    }
    assert_int_equal(o.n[1], 4);
    assert_int_equal(mr_engine_retract(g.e), 1);
    assert_int_equal(mr_engine_running(g.e), 0);
    mr_engine_stats_get(g.e, &s);
    assert_int_equal(s.kv_blocks_used, 0);
    check_ok(g.e);
    run_until_idle(g.e, &o, true);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(o.n[i], G);
        if (memcmp(o.tok[i], ref.tok[i], G * sizeof(int32_t))) fail_msg("request %d: held run differs", i);
    }
    eng_close(&g);
}

/* The KV pool's memory given back (a server's sleep): refused while a request runs; after a retract the prefix
 * cache is empty, the pages are dropped, and every request then ends with the tokens of a run that never
 * released anything (the same prompts again: no stale cache entry is used). */
static void test_release_kv(void **state) {
    (void)state;
    enum { G = 10 };
    tu_rng rng = {41};
    int32_t p[3][40];
    for (int i = 0; i < 3; i++) rand_prompt(&rng, p[i], 40);
    static outs ref, o;
    memset(&ref, 0, sizeof ref);
    memset(&o, 0, sizeof o);
    eng g;
    eng_cfg c = {.kv = MR_FMT_F32, .blocks = 512, .budget = 64, .running = 4, .ctx = 128};
    eng_open(&g, &c);
    for (int i = 0; i < 3; i++) add_req(g.e, p[i], 40, G, i);
    run_until_idle(g.e, &ref, true);
    eng_close(&g);
    eng_open(&g, &c);
    const mr_engine_step_out *so;
    add_req(g.e, p[0], 40, G, 0);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(mr_engine_step(g.e, &so), MR_OK);
        collect(&o, so);
    }
    size_t bytes = 1;
    assert_int_equal(mr_engine_release_kv(g.e, &bytes), MR_ESTATE);
    assert_int_equal(bytes, 0);
    assert_int_equal(mr_engine_retract(g.e), 1);
    assert_int_equal(mr_engine_release_kv(g.e, &bytes), MR_OK);
    assert_true(bytes > 0 && bytes <= mr_model_kv_bytes(g.m));
    mr_engine_stats s;
    mr_engine_stats_get(g.e, &s);
    assert_int_equal(s.kv_blocks_cached, 0);
    assert_int_equal(s.kv_blocks_used, 0);
    check_ok(g.e);
    for (int i = 1; i < 3; i++) add_req(g.e, p[i], 40, G, i);
    run_until_idle(g.e, &o, true);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(o.n[i], G);
        if (memcmp(o.tok[i], ref.tok[i], G * sizeof(int32_t))) fail_msg("request %d: differs after the release", i);
    }
    eng_close(&g);
}

/* ---- preemption ---- */

static void test_preemption(void **state) {
    (void)state;
    enum { N = 12, G = 40 };
    tu_rng rng = {21};
    int32_t prompt[N][50];
    int64_t len[N];
    rand_prompts(&rng, prompt[0], 50, len, N, 10, 40);
    static outs tight, loose;
    memset(&tight, 0, sizeof tight);
    memset(&loose, 0, sizeof loose);
    /* 14 blocks (224 tokens): each request (<= 89 positions, 6 blocks) fits alone, a few together */
    eng g;
    eng_cfg ct = {.kv = MR_FMT_F32, .blocks = 14, .budget = 64, .running = N, .ctx = 128};
    eng_open(&g, &ct);
    for (int i = 0; i < N; i++) add_req(g.e, prompt[i], len[i], G, i);
    run_until_idle(g.e, &tight, true);
    mr_engine_stats s;
    mr_engine_stats_get(g.e, &s);
    assert_true(s.preemptions > 0);
    assert_int_equal(s.requests_finished[MR_FINISH_LENGTH], N);
    eng_close(&g);
    eng_cfg cl = {.kv = MR_FMT_F32, .blocks = 1024, .budget = 64, .running = N, .ctx = 128, .no_prefix = true};
    eng_open(&g, &cl);
    for (int i = 0; i < N; i++) add_req(g.e, prompt[i], len[i], G, i);
    run_until_idle(g.e, &loose, false);
    mr_engine_stats_get(g.e, &s);
    assert_int_equal(s.preemptions, 0);
    eng_close(&g);
    for (int i = 0; i < N; i++) {
        assert_int_equal(tight.n[i], G);
        if (memcmp(tight.tok[i], loose.tok[i], G * sizeof(int32_t)))
            fail_msg("request %d: preempted and recomputed tokens differ from the unconstrained run", i);
    }
}

/* Priority scheduling (vLLM's --scheduling-policy priority): one running at a time, the waiting requests
 * start in (priority, arrival) order (lower first, ties by arrival), a request already running is not
 * displaced; under a pool too small for two, the less urgent of the two running is the one preempted, even
 * when it came first, and its tokens stay those of a run alone. Without priority scheduling a priority other
 * than 0 is refused. */
static mr_req_id add_prio(mr_engine *e, const int32_t *p, int64_t n, int64_t g, int user, int64_t prio) {
    mr_request_params rp = {.prompt = p, .n_prompt = n, .max_tokens = g, .ignore_eos = true,
                            .user = (void *)(intptr_t)user, .priority = prio};
    mr_req_id id = 0;
    assert_int_equal(mr_engine_add(e, &rp, &id), MR_OK);
    return id;
}
static void test_priority(void **state) {
    (void)state;
    tu_rng rng = {23};
    int32_t p[6][40];
    for (int i = 0; i < 6; i++) rand_prompt(&rng, p[i], 40);
    eng g;
    eng_cfg c = {.kv = MR_FMT_F32, .blocks = 64, .budget = 64, .running = 1, .ctx = 128, .priority = true};
    eng_open(&g, &c);
    const int64_t prio[6] = {5, 5, 1, -2, 1, 0};
    add_prio(g.e, p[0], 20, 3, 0, prio[0]);
    const mr_engine_step_out *so;
    assert_int_equal(mr_engine_step(g.e, &so), MR_OK); /* 0 runs */
    for (int i = 1; i < 6; i++) add_prio(g.e, p[i], 20, 3, i, prio[i]);
    int order[6], n = 0;
    for (int guard = 0; mr_engine_has_work(g.e); guard++) {
        assert_true(guard < 1000);
        assert_int_equal(mr_engine_step(g.e, &so), MR_OK);
        for (int k = 0; k < so->n_events; k++)
            if (so->events[k].finish) order[n++] = (int)(intptr_t)so->events[k].user;
    }
    const int want[6] = {0, 3, 5, 2, 4, 1};
    assert_int_equal(n, 6);
    for (int i = 0; i < 6; i++) {
        if (order[i] != want[i]) fprintf(stderr, "priority: finished %d-th: request %d, want %d\n", i, order[i], want[i]);
        assert_int_equal(order[i], want[i]);
    }
    eng_close(&g);
    /* preemption: 8 blocks; each request needs 5 alone (40 + 40 positions), two do not fit together */
    static outs alone, both;
    memset(&alone, 0, sizeof alone);
    memset(&both, 0, sizeof both);
    for (int pass = 0; pass < 2; pass++) {
        eng_cfg ct = {.kv = MR_FMT_F32, .blocks = 8, .budget = 128, .running = 2, .ctx = 128, .priority = true,
                      .no_prefix = true};
        eng_open(&g, &ct);
        if (pass == 0) {
            for (int i = 0; i < 2; i++) {
                add_prio(g.e, p[i], 40, 40, i, 0);
                run_until_idle(g.e, &alone, true);
            }
            eng_close(&g);
            continue;
        }
        mr_req_id lo = add_prio(g.e, p[0], 40, 40, 0, 9); /* runs first: the more urgent comes a step later */
        assert_int_equal(mr_engine_step(g.e, &so), MR_OK);
        collect(&both, so);
        mr_req_id hi = add_prio(g.e, p[1], 40, 40, 1, 0);
        const mr__req *rl = &g.e->req[(lo & 0xffffffffu) - 1], *rh = &g.e->req[(hi & 0xffffffffu) - 1];
        int hi_done_step = -1, lo_done_step = -1, lo_waits = 0;
        for (int step = 0; mr_engine_has_work(g.e); step++) {
            assert_true(step < 1000);
            assert_int_equal(mr_engine_step(g.e, &so), MR_OK);
            collect(&both, so);
            for (int k = 0; k < so->n_events; k++)
                if (so->events[k].finish) *((intptr_t)so->events[k].user ? &hi_done_step : &lo_done_step) = step;
            if (hi_done_step < 0) {
                assert_true(rh->state == MR__RQ_RUNNING); /* never the one preempted */
                lo_waits += rl->state == MR__RQ_WAITING;
            }
            check_ok(g.e);
        }
        mr_engine_stats s;
        mr_engine_stats_get(g.e, &s);
        assert_true(s.preemptions > 0 && lo_waits > 0 && hi_done_step < lo_done_step);
        eng_close(&g);
    }
    for (int i = 0; i < 2; i++) {
        assert_int_equal(both.n[i], 40);
        assert_memory_equal(both.tok[i], alone.tok[i], 40 * sizeof(int32_t));
    }
    eng_cfg cf = {.kv = MR_FMT_F32, .blocks = 16, .budget = 64, .running = 2, .ctx = 128};
    eng_open(&g, &cf);
    mr_request_params rp = {.prompt = p[0], .n_prompt = 8, .max_tokens = 2, .priority = 1};
    mr_req_id id;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINVAL);
    assert_non_null(strstr(mr_error_last(), "priority 1 needs priority scheduling"));
    eng_close(&g);
}

/* ---- cancellation ---- */

static void test_cancellation(void **state) {
    (void)state;
    tu_rng rng = {4};
    int32_t p[6][40];
    for (int i = 0; i < 6; i++) rand_prompt(&rng, p[i], 40);
    eng g;
    eng_cfg c = {.kv = MR_FMT_F32, .blocks = 64, .budget = 100, .running = 3, .ctx = 128};
    eng_open(&g, &c);
    atomic_int flag[6];
    mr_req_id id[6];
    for (int i = 0; i < 6; i++) {
        atomic_init(&flag[i], 0);
        mr_request_params rp = {.prompt = p[i], .n_prompt = 40, .max_tokens = 50, .ignore_eos = true,
                                .cancel = &flag[i], .user = (void *)(intptr_t)i};
        assert_int_equal(mr_engine_add(g.e, &rp, &id[i]), MR_OK);
    }
    const mr_engine_step_out *so;
    for (int s = 0; s < 4; s++) assert_int_equal(mr_engine_step(g.e, &so), MR_OK);
    mr_engine_stats st;
    mr_engine_stats_get(g.e, &st);
    assert_int_equal(st.running, 3); /* 0, 1, 2 run; 3, 4, 5 wait */
    assert_int_equal(st.waiting, 3);
    int64_t used = st.kv_blocks_used;
    const mr__req *r1 = &g.e->req[(id[1] & 0xffffffffu) - 1];
    int32_t blocks1 = r1->n_blocks;
    assert_true(blocks1 > 0);
    atomic_store(&flag[1], 1);                          /* a running request, by its flag (another thread would) */
    assert_int_equal(mr_engine_cancel(g.e, id[4]), MR_OK); /* a queued one, by id */
    atomic_store(&flag[5], 1);                          /* a queued one, by its flag */
    assert_int_equal(mr_engine_step(g.e, &so), MR_OK);
    int seen = 0;
    for (int k = 0; k < so->n_events; k++) {
        const mr_engine_event *v = &so->events[k];
        int i = (int)(intptr_t)v->user;
        if (v->finish == MR_FINISH_CANCELLED) {
            assert_true(i == 1 || i == 4 || i == 5);
            assert_int_equal(v->n_tokens, 0);
            seen |= 1 << i;
        } else {
            assert_true(i != 1 && i != 4 && i != 5);
        }
    }
    assert_int_equal(seen, (1 << 1) | (1 << 4) | (1 << 5));
    mr_engine_stats_get(g.e, &st);
    /* request 1's blocks went back in this very step (3 was admitted in its place and took its own) */
    assert_int_equal(st.requests_finished[MR_FINISH_CANCELLED], 3);
    assert_true(st.kv_blocks_used < used + 3 - blocks1 + 1 + 3); /* sanity: no growth by the cancelled one */
    check_ok(g.e);
    for (int i = 0; i < g.e->max_req; i++) /* no trace of the cancelled requests */
        if (g.e->req[i].state != MR__RQ_FREE)
            assert_true(g.e->req[i].id != id[1] && g.e->req[i].id != id[4] && g.e->req[i].id != id[5]);
    assert_int_equal(mr_engine_cancel(g.e, id[1]), MR_ENOTFOUND); /* gone */
    /* cancel everything left: no block stays referenced */
    for (int i = 0; i < 6; i++) atomic_store(&flag[i], 1);
    assert_int_equal(mr_engine_step(g.e, &so), MR_OK);
    mr_engine_stats_get(g.e, &st);
    assert_int_equal(st.requests_finished[MR_FINISH_CANCELLED], 6);
    assert_int_equal(st.kv_blocks_used, 0);
    eng_close(&g);
}

/* ---- admission ---- */

static void test_admission(void **state) {
    (void)state;
    eng g;
    eng_cfg c = {.kv = MR_FMT_F32, .blocks = 8, .budget = 32, .running = 2, .queued = 3, .ctx = 200};
    eng_open(&g, &c);
    int32_t p[300];
    for (int i = 0; i < 300; i++) p[i] = 5;
    mr_request_params rp = {.prompt = p, .n_prompt = 100, .max_tokens = 40};
    mr_req_id id;
    /* 100 + 40 - 1 positions need 9 blocks; the pool holds 8: refused with both numbers */
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_ECAPACITY);
    assert_non_null(strstr(mr_error_last(), "need 9 KV blocks (144 tokens)"));
    assert_non_null(strstr(mr_error_last(), "pool holds 8 blocks (128 tokens)"));
    rp.max_tokens = 29; /* 128 positions: fits exactly */
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_OK);
    rp.n_prompt = 200;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_ECAPACITY);
    assert_non_null(strstr(mr_error_last(), "prompt has 200 tokens; the context length is 200"));
    rp.n_prompt = 150;
    rp.max_tokens = 60;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_ECAPACITY);
    assert_non_null(strstr(mr_error_last(), "150 prompt tokens + max_tokens 60 = 210 exceed the context length of 200"));
    rp = (mr_request_params){.prompt = p, .n_prompt = 3, .max_tokens = 2};
    p[1] = V;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINPUT);
    assert_non_null(strstr(mr_error_last(), "token id 256 is outside the vocabulary (256)"));
    p[1] = 5;
    rp.sampling.top_p = 1.5f;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINVAL);
    rp.sampling.top_p = 0.0f;
    rp.sampling.repetition_penalty = -1.0f;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINVAL);
    rp.sampling.repetition_penalty = 0.0f;
    rp.top_logprobs = 21;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINVAL);
    rp.top_logprobs = 0;
    rp.n_prompt = 0;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINVAL);
    rp.n_prompt = 3;
    int32_t stop = V + 1;
    rp.stop_ids = &stop;
    rp.n_stop_ids = 1;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINPUT);
    rp.n_stop_ids = 0;
    int32_t lp_ids[MR_ENGINE_MAX_LOGPROB_IDS + 1] = {0};
    rp.logprob_ids = lp_ids;
    rp.n_logprob_ids = MR_ENGINE_MAX_LOGPROB_IDS + 1;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINVAL);
    assert_non_null(strstr(mr_error_last(), "1025 logprob ids; at most 1024"));
    lp_ids[3] = V;
    rp.n_logprob_ids = 4;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINPUT);
    assert_non_null(strstr(mr_error_last(), "logprob token id 256 is outside the vocabulary (256)"));
    rp.logprob_ids = NULL;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINVAL);
    rp.n_logprob_ids = 0;
    /* the queue: 3 waiting at most (one is waiting already) */
    rp.user = (void *)(intptr_t)1;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_OK);
    rp.user = (void *)(intptr_t)2;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_OK);
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EBUSY);
    assert_non_null(strstr(mr_error_last(), "max_queued_requests 3"));
    check_ok(g.e);
    outs o;
    memset(&o, 0, sizeof o);
    run_until_idle(g.e, &o, true);
    eng_close(&g);
    /* an engine over a model that does not match its options is refused */
    mr_engine_opts eo = {.kv_blocks = 8, .max_batch_tokens = 32, .max_running_requests = 2, .context_length = 200};
    mr_model_opts mo = {.runner = "reference", .quiet = true};
    mr_engine_model_opts(&eo, &mo);
    mr_model *m = NULL;
    mr_engine *e = NULL;
    assert_int_equal(mr_model_open(tu_data("model/tiny"), &mo, &m), MR_OK);
    eo.kv_blocks = 9;
    assert_int_equal(mr_engine_new(m, &eo, &e), MR_EINVAL);
    eo.kv_blocks = 8;
    eo.context_length = 400;
    assert_int_equal(mr_engine_new(m, &eo, &e), MR_EINVAL);
    eo.context_length = 200;
    eo.max_running_requests = 64;
    assert_int_equal(mr_engine_new(m, &eo, &e), MR_EINVAL); /* budget 32 < 64 running */
    assert_null(e);
    mr_model_close(m);
}

/* ---- stops, logprobs, logits, penalties: checked against this file's own computations ---- */

static double ref_logsumexp(const float *l) {
    double mx = l[0], s = 0.0;
    for (int i = 1; i < V; i++)
        if (l[i] > mx) mx = l[i];
    for (int i = 0; i < V; i++) s += exp((double)l[i] - mx);
    return mx + log(s);
}

static void test_sampling_features(void **state) {
    (void)state;
    eng g;
    eng_open_small(&g);
    tu_rng rng = {8};
    int32_t p[20];
    rand_prompt(&rng, p, 20);
    /* logits, top-5 logprobs, penalties: every token is the argmax of the
     * penalized raw logits, computed here from the reported logits */
    mr_request_params rp = {.prompt = p, .n_prompt = 20, .max_tokens = 30, .ignore_eos = true, .logprobs = true,
                            .top_logprobs = 5, .want_logits = true,
                            .sampling = {.repetition_penalty = 1.7f, .frequency_penalty = 0.4f,
                                         .presence_penalty = 0.3f}};
    mr_req_id id;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_OK);
    int32_t hist[64];
    int n = 0;
    while (mr_engine_has_work(g.e)) {
        const mr_engine_step_out *so;
        assert_int_equal(mr_engine_step(g.e, &so), MR_OK);
        for (int k = 0; k < so->n_events; k++) {
            const mr_engine_event *v = &so->events[k];
            if (!v->n_tokens) continue;
            assert_non_null(v->logits);
            const float *l = v->logits;
            double lse = ref_logsumexp(l);
            assert_true(fabs((double)v->logprob - ((double)l[v->token] - lse)) < 1e-5);
            /* top 5: descending, ties to the lower id, the 5 largest */
            assert_int_equal(v->n_top, 5);
            for (int j = 0; j < 5; j++) {
                int32_t t = v->top[j].token;
                assert_true(fabs((double)v->top[j].logprob - ((double)l[t] - lse)) < 1e-5);
                int above = 0;
                for (int u = 0; u < V; u++) above += l[u] > l[t] || (l[u] == l[t] && u < t);
                assert_int_equal(above, j);
            }
            /* penalties, independently */
            float w[V];
            memcpy(w, l, sizeof w);
            for (int u = 0; u < V; u++) {
                bool seen = false;
                int cnt = 0;
                for (int j = 0; j < 20; j++) seen |= p[j] == u;
                for (int j = 0; j < n; j++) {
                    seen |= hist[j] == u;
                    cnt += hist[j] == u;
                }
                if (seen) w[u] = w[u] > 0 ? w[u] / 1.7f : w[u] * 1.7f;
                if (cnt) w[u] -= 0.4f * (float)cnt + 0.3f;
            }
            assert_int_equal(v->token, mr_argmax(w, V));
            hist[n++] = v->token;
        }
    }
    assert_int_equal(n, 30);
    /* without penalties the same prompt repeats tokens somewhere (so the check above could fail) */
    rp = (mr_request_params){.prompt = p, .n_prompt = 20, .max_tokens = 30, .ignore_eos = true, .user = (void *)0};
    outs o;
    memset(&o, 0, sizeof o);
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_OK);
    run_until_idle(g.e, &o, false);
    assert_true(memcmp(o.tok[0], hist, 30 * sizeof(int32_t)) != 0);
    /* a stop id ends the request with that token; forced tokens are taken as given */
    int32_t forced[6] = {40, 41, 42, 43, 44, 45}, stop = 43;
    rp = (mr_request_params){.prompt = p, .n_prompt = 20, .max_tokens = 10, .forced = forced, .n_forced = 6,
                             .stop_ids = &stop, .n_stop_ids = 1, .user = (void *)(intptr_t)1};
    memset(&o, 0, sizeof o);
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_OK);
    run_until_idle(g.e, &o, false);
    assert_int_equal(o.n[1], 4);
    assert_memory_equal(o.tok[1], forced, 4 * sizeof(int32_t));
    assert_int_equal(o.fin[1], MR_FINISH_STOP);
    /* the model's EOS (2) stops unless ignore_eos */
    int32_t eos_forced[3] = {9, 2, 9};
    rp = (mr_request_params){.prompt = p, .n_prompt = 20, .max_tokens = 3, .forced = eos_forced, .n_forced = 3,
                             .user = (void *)(intptr_t)2};
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_OK);
    rp.ignore_eos = true;
    rp.user = (void *)(intptr_t)3;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_OK);
    run_until_idle(g.e, &o, false);
    assert_int_equal(o.n[2], 2);
    assert_int_equal(o.fin[2], MR_FINISH_STOP);
    assert_int_equal(o.n[3], 3);
    assert_int_equal(o.fin[3], MR_FINISH_LENGTH);
    eng_close(&g);
}

/* logit_bias and min_tokens (vLLM V1's order: the min_tokens mask, then the
 * bias, before the penalties): every greedy token is the argmax of the raw
 * logits adjusted here, independently; log-probabilities stay those of the
 * raw logits; a sampled request never draws a masked id; refusals. */
static void test_logit_bias_min_tokens(void **state) {
    (void)state;
    eng g;
    eng_open_small(&g);
    tu_rng rng = {21};
    int32_t p[16];
    rand_prompt(&rng, p, 16);
    const int32_t stop = 7, eos = 2;
    /* EOS and the stop id biased far above the rest: only the mask keeps them out */
    const mr_logit_bias bias[6] = {{eos, 100.0f}, {stop, 100.0f}, {77, 3.0f}, {100, -5.0f}, {50, 1.0f}, {50, 2.0f}};
    mr_request_params rp = {.prompt = p, .n_prompt = 16, .max_tokens = 20, .min_tokens = 12, .stop_ids = &stop,
                            .n_stop_ids = 1, .logit_bias = bias, .n_logit_bias = 6, .logprobs = true,
                            .want_logits = true, .sampling = {.repetition_penalty = 1.3f}};
    mr_req_id id;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_OK);
    int32_t hist[32];
    int n = 0;
    mr_finish_reason fin = MR_FINISH_NONE;
    while (mr_engine_has_work(g.e)) {
        const mr_engine_step_out *so;
        assert_int_equal(mr_engine_step(g.e, &so), MR_OK);
        for (int k = 0; k < so->n_events; k++) {
            const mr_engine_event *v = &so->events[k];
            if (!v->n_tokens) continue;
            const float *l = v->logits;
            assert_true(fabs((double)v->logprob - ((double)l[v->token] - ref_logsumexp(l))) < 1e-5);
            float w[V];
            memcpy(w, l, sizeof w);
            if (n < 12) w[eos] = w[stop] = -INFINITY;
            for (int b = 0; b < 6; b++) w[bias[b].token] += bias[b].bias;
            for (int u = 0; u < V; u++) {
                bool seen = false;
                for (int j = 0; j < 16; j++) seen |= p[j] == u;
                for (int j = 0; j < n; j++) seen |= hist[j] == u;
                if (seen) w[u] = w[u] > 0 ? w[u] / 1.3f : w[u] * 1.3f;
            }
            assert_int_equal(v->token, mr_argmax(w, V));
            hist[n++] = v->token;
            fin = v->finish;
        }
    }
    /* 12 tokens that are neither, then the 13th is one of them and stops */
    assert_int_equal(n, 13);
    assert_int_equal(fin, MR_FINISH_STOP);
    assert_true(hist[12] == eos || hist[12] == stop);
    /* sampled at temperature 1: the masked ids are never drawn before min_tokens */
    for (int rep = 0; rep < 8; rep++) {
        outs o;
        memset(&o, 0, sizeof o);
        rp = (mr_request_params){.prompt = p, .n_prompt = 16, .max_tokens = 30, .min_tokens = 5 + rep,
                                 .stop_ids = &stop, .n_stop_ids = 1, .logit_bias = bias, .n_logit_bias = 2,
                                 .sampling = {.temperature = 1.0f, .seed = 1000u + (uint64_t)rep}};
        assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_OK);
        run_until_idle(g.e, &o, false);
        assert_int_equal(o.n[0], 5 + rep + 1); /* +100 on both: the first unmasked draw is one of them */
        for (int j = 0; j < 5 + rep; j++) assert_true(o.tok[0][j] != eos && o.tok[0][j] != stop);
        assert_int_equal(o.fin[0], MR_FINISH_STOP);
    }
    /* a forced stop id before min_tokens does not stop; at min_tokens it does */
    int32_t f1[4] = {9, eos, 9, 9}, f2[4] = {9, 9, eos, 9};
    outs o;
    memset(&o, 0, sizeof o);
    rp = (mr_request_params){.prompt = p, .n_prompt = 16, .max_tokens = 4, .min_tokens = 3, .forced = f1,
                             .n_forced = 4, .user = (void *)0};
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_OK);
    rp.forced = f2;
    rp.user = (void *)(intptr_t)1;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_OK);
    run_until_idle(g.e, &o, false);
    assert_int_equal(o.n[0], 4);
    assert_int_equal(o.fin[0], MR_FINISH_LENGTH);
    assert_int_equal(o.n[1], 3);
    assert_int_equal(o.fin[1], MR_FINISH_STOP);
    /* refusals */
    mr_logit_bias bad = {5, 100.5f};
    rp = (mr_request_params){.prompt = p, .n_prompt = 16, .max_tokens = 4, .logit_bias = &bad, .n_logit_bias = 1};
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINVAL);
    bad.bias = NAN;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINVAL);
    bad = (mr_logit_bias){V, 1.0f};
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINPUT);
    bad = (mr_logit_bias){-1, 1.0f};
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINPUT);
    rp.n_logit_bias = MR_ENGINE_MAX_LOGIT_BIAS + 1;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINVAL);
    rp.logit_bias = NULL, rp.n_logit_bias = 1;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINVAL);
    rp.n_logit_bias = 0, rp.min_tokens = 5;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINVAL);
    assert_non_null(strstr(mr_error_last(), "min_tokens 5 is above max_tokens 4"));
    rp.min_tokens = -1;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINVAL);
    rp.min_tokens = 4;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_OK);
    memset(&o, 0, sizeof o);
    run_until_idle(g.e, &o, false);
    check_ok(g.e);
    eng_close(&g);
}

/* A token constraint (structured outputs' seam): ids of the parity the
 * step asks for (even, odd, even, ...), ids above a ceiling refused by
 * accept. Every greedy token is the argmax of the raw logits masked by it
 * (and by allowed ids within it); accept sees every token once, forced ones
 * too; a refused token or an empty mask ends that request alone. */
typedef struct {
    int n_accept, n_mask;
    int32_t ceiling; /* accept refuses ids >= this */
    bool empty;      /* mask allows nothing */
    bool blocks;     /* instead of the parity: runs of 64 ids (whole words of the bitset set and clear), and id 37 */
} parity_con;

static bool con_allows(const parity_con *c, int step, int32_t i) {
    if (c->blocks) return (i / 64) % 2 == step % 2 || i == 37;
    return i % 2 == step % 2;
}

static int64_t parity_mask(void *ctx, uint32_t *allow) {
    parity_con *c = ctx;
    c->n_mask++;
    int64_t n = 0;
    memset(allow, 0, (V + 31) / 32 * sizeof(uint32_t));
    for (int32_t i = 0; i < V && !c->empty; i++)
        if (con_allows(c, c->n_accept, i)) allow[i >> 5] |= 1u << (i & 31), n++;
    return n;
}

static mr_status parity_accept(void *ctx, int32_t tok) {
    parity_con *c = ctx;
    if (tok >= c->ceiling) return mr_error_set(MR_EINPUT, "parity: token %d refused", (int)tok);
    c->n_accept++;
    return MR_OK;
}

static void test_token_constraint(void **state) {
    (void)state;
    eng g;
    eng_open_small(&g);
    tu_rng rng = {35};
    int32_t p[10];
    rand_prompt(&rng, p, 10);
    const int32_t allowed[8] = {1, 2, 3, 4, 9, 10, 40, 41};
    for (int variant = 0; variant < 4; variant++) {
        parity_con c = {.ceiling = V, .blocks = variant == 3};
        const int32_t forced[2] = {6, 7};
        mr_request_params rp = {.prompt = p, .n_prompt = 10, .max_tokens = 10, .ignore_eos = true, .want_logits = true,
                                .constraint = {parity_mask, parity_accept, &c}};
        if (variant == 1) rp.allowed_ids = allowed, rp.n_allowed = 8;
        if (variant == 2) rp.forced = forced, rp.n_forced = 2;
        if (variant == 3) rp.sampling = (mr_sampling){.temperature = 1.5f, .seed = 5}; /* sampled: only allowed ids */
        mr_req_id id;
        assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_OK);
        int n = 0;
        while (mr_engine_has_work(g.e)) {
            const mr_engine_step_out *so;
            assert_int_equal(mr_engine_step(g.e, &so), MR_OK);
            for (int k = 0; k < so->n_events; k++) {
                const mr_engine_event *v = &so->events[k];
                if (!v->n_tokens) continue;
                if (variant == 2 && n < 2) {
                    assert_int_equal(v->token, forced[n]);
                } else {
                    float w[V];
                    for (int u = 0; u < V; u++) {
                        bool ok = con_allows(&c, n, u);
                        if (variant == 1) {
                            bool in = false;
                            for (int a = 0; a < 8; a++) in |= allowed[a] == u;
                            ok &= in;
                        }
                        w[u] = ok ? v->logits[u] : -INFINITY;
                    }
                    if (variant == 3) assert_true(con_allows(&c, n, v->token));
                    else assert_int_equal(v->token, mr_argmax(w, V));
                }
                n++;
            }
        }
        assert_int_equal(n, 10);
        assert_int_equal(c.n_accept, 10);
        assert_int_equal(c.n_mask, variant == 2 ? 8 : 10);
    }
    /* a refused forced token, and an empty mask: those requests fail, a third one beside them does not */
    parity_con bad_accept = {.ceiling = 5}, empty = {.ceiling = V, .empty = true}, fine = {.ceiling = V};
    const int32_t forced_bad = 6;
    mr_request_params r1 = {.prompt = p, .n_prompt = 10, .max_tokens = 4, .forced = &forced_bad, .n_forced = 1,
                            .constraint = {parity_mask, parity_accept, &bad_accept}};
    mr_request_params r2 = {.prompt = p, .n_prompt = 10, .max_tokens = 4, .constraint = {parity_mask, parity_accept, &empty}};
    mr_request_params r3 = {.prompt = p, .n_prompt = 10, .max_tokens = 4, .ignore_eos = true,
                            .constraint = {parity_mask, parity_accept, &fine}};
    mr_req_id ids[3];
    assert_int_equal(mr_engine_add(g.e, &r1, &ids[0]), MR_OK);
    assert_int_equal(mr_engine_add(g.e, &r2, &ids[1]), MR_OK);
    assert_int_equal(mr_engine_add(g.e, &r3, &ids[2]), MR_OK);
    mr_finish_reason fin[3] = {0};
    while (mr_engine_has_work(g.e)) {
        const mr_engine_step_out *so;
        assert_int_equal(mr_engine_step(g.e, &so), MR_OK);
        for (int k = 0; k < so->n_events; k++)
            for (int j = 0; j < 3; j++)
                if (so->events[k].id == ids[j] && so->events[k].finish) fin[j] = so->events[k].finish;
    }
    assert_int_equal(fin[0], MR_FINISH_ERROR);
    assert_int_equal(fin[1], MR_FINISH_ERROR);
    assert_int_equal(fin[2], MR_FINISH_LENGTH);
    assert_int_equal(fine.n_accept, 4);
    check_ok(g.e);
    eng_close(&g);
}

/* allowed_token_ids and bad words (vLLM's): every greedy token is the
 * argmax of the raw logits masked here, independently; a step with every id
 * masked ends the request with an error; refusals. */
static void test_allowed_ids_bad_words(void **state) {
    (void)state;
    eng g;
    eng_open_small(&g);
    tu_rng rng = {33};
    int32_t p[12];
    rand_prompt(&rng, p, 12);
    /* the unconstrained greedy output: the bad words below are made of it, so that they bite */
    outs o;
    memset(&o, 0, sizeof o);
    mr_request_params rp = {.prompt = p, .n_prompt = 12, .max_tokens = 12, .ignore_eos = true};
    mr_req_id id;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_OK);
    run_until_idle(g.e, &o, false);
    assert_int_equal(o.n[0], 12);
    int32_t free_run[12];
    memcpy(free_run, o.tok[0], sizeof free_run);
    /* bad words: the free run's 3rd token alone, and its (1st, 2nd) pair */
    const int32_t bad[3] = {free_run[2], free_run[0], free_run[1]}, bad_len[2] = {1, 2};
    const int32_t allowed[6] = {free_run[0], free_run[1], free_run[2], 10, 20, 30};
    for (int variant = 0; variant < 2; variant++) {
        rp = (mr_request_params){.prompt = p, .n_prompt = 12, .max_tokens = 12, .ignore_eos = true, .want_logits = true,
                                 .bad_words = bad, .bad_word_len = bad_len, .n_bad_words = 2};
        if (variant) rp.allowed_ids = allowed, rp.n_allowed = 6;
        assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_OK);
        int32_t hist[16];
        int n = 0;
        while (mr_engine_has_work(g.e)) {
            const mr_engine_step_out *so;
            assert_int_equal(mr_engine_step(g.e, &so), MR_OK);
            for (int k = 0; k < so->n_events; k++) {
                const mr_engine_event *v = &so->events[k];
                if (!v->n_tokens) continue;
                float w[V];
                for (int u = 0; u < V; u++) {
                    bool ok = !variant;
                    for (int a = 0; a < 6 && !ok; a++) ok = allowed[a] == u;
                    w[u] = ok ? v->logits[u] : -INFINITY;
                }
                w[bad[0]] = -INFINITY;
                if (n >= 1 && hist[n - 1] == bad[1]) w[bad[2]] = -INFINITY;
                assert_int_equal(v->token, mr_argmax(w, V));
                hist[n++] = v->token;
            }
        }
        assert_int_equal(n, 12);
        assert_true(hist[0] == free_run[0]); /* nothing masks the first token's argmax */
        for (int j = 0; j < 12; j++) {
            assert_true(hist[j] != bad[0]);
            if (j) assert_false(hist[j - 1] == bad[1] && hist[j] == bad[2]);
        }
    }
    /* every id masked: the request ends with an error, the engine goes on */
    const int32_t only = 7, ban7 = 7, one = 1;
    rp = (mr_request_params){.prompt = p, .n_prompt = 12, .max_tokens = 4, .allowed_ids = &only, .n_allowed = 1,
                             .bad_words = &ban7, .bad_word_len = &one, .n_bad_words = 1};
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_OK);
    bool errored = false;
    while (mr_engine_has_work(g.e)) {
        const mr_engine_step_out *so;
        assert_int_equal(mr_engine_step(g.e, &so), MR_OK);
        for (int k = 0; k < so->n_events; k++)
            if (so->events[k].finish == MR_FINISH_ERROR) {
                errored = true;
                assert_non_null(strstr(so->events[k].error, "every token is masked"));
            }
    }
    assert_true(errored);
    check_ok(g.e);
    /* refusals */
    int32_t bad_id = V, len0 = 0, len65 = MR_ENGINE_MAX_BAD_WORD_TOKENS + 1;
    rp = (mr_request_params){.prompt = p, .n_prompt = 12, .max_tokens = 4, .allowed_ids = &bad_id, .n_allowed = 1};
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINPUT);
    rp.allowed_ids = allowed, rp.n_allowed = V + 1;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINVAL);
    rp = (mr_request_params){.prompt = p, .n_prompt = 12, .max_tokens = 4, .bad_words = bad, .bad_word_len = &len0,
                             .n_bad_words = 1};
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINVAL);
    rp.bad_word_len = &len65;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINVAL);
    rp.bad_words = &bad_id, rp.bad_word_len = &one;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINPUT);
    rp.n_bad_words = MR_ENGINE_MAX_BAD_WORDS + 1;
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_EINVAL);
    eng_close(&g);
}

/* Seeded sampling at temperature > 0: a request's tokens depend on its own
 * seed only, not on the batch around it. */
static void test_seeded_sampling_invariance(void **state) {
    (void)state;
    enum { N = 8, G = 20 };
    tu_rng rng = {17};
    int32_t p[N][30];
    for (int i = 0; i < N; i++) rand_prompt(&rng, p[i], 30);
    static outs alone, together, other_seed;
    memset(&alone, 0, sizeof alone);
    memset(&together, 0, sizeof together);
    memset(&other_seed, 0, sizeof other_seed);
    eng g;
    eng_cfg c = {.kv = MR_FMT_F32, .blocks = 128, .budget = 64, .running = 8, .ctx = 64};
    eng_open(&g, &c);
    for (int pass = 0; pass < 3; pass++) {
        outs *o = pass == 0 ? &alone : pass == 1 ? &together : &other_seed;
        for (int i = 0; i < N; i++) {
            mr_request_params rp = {.prompt = p[i], .n_prompt = 30, .max_tokens = G, .ignore_eos = true,
                                    .sampling = {.temperature = 1.0f, .top_k = 50, .top_p = 0.95f,
                                                 .seed = (uint64_t)(1000 + i + (pass == 2 ? 77 : 0))},
                                    .user = (void *)(intptr_t)i};
            mr_req_id id;
            assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_OK);
            if (pass == 0) run_until_idle(g.e, o, false);
        }
        run_until_idle(g.e, o, false);
    }
    int differ = 0;
    for (int i = 0; i < N; i++) {
        assert_memory_equal(alone.tok[i], together.tok[i], G * sizeof(int32_t));
        differ += memcmp(alone.tok[i], other_seed.tok[i], G * sizeof(int32_t)) != 0;
    }
    assert_true(differ > 0); /* the seed matters */
    eng_close(&g);
}

/* The rows of a step sampled over the threads, each on its own scratch: at a
 * 200,064-id vocabulary (MiniMax-M2's) with two threads, eight requests that
 * each use a different part of the sampling (top-p through the radix cut and
 * through the sort, top-k and min-p, greedy with top log-probabilities, the
 * penalties and the counts scratch, logit bias and min_tokens, allowed ids and
 * bad words, a constraint with its accept, a constraint that refuses, every
 * id masked) give, together, the tokens, log-probabilities and errors each
 * gives alone (alone, a step has one row: no threads). */
enum { BV = 200064 };

typedef struct {
    int mod, n_accept, refuse_at; /* mask: ids = n_accept mod `mod`; accept refuses the refuse_at-th token (0: never) */
} mod_con;

static int64_t mod_mask(void *ctx, uint32_t *allow) {
    const mod_con *c = ctx;
    int64_t n = 0;
    for (int32_t i = c->n_accept % c->mod; i < BV; i += c->mod) allow[i >> 5] |= 1u << (i & 31), n++;
    return n;
}

static mr_status mod_accept(void *ctx, int32_t tok) {
    mod_con *c = ctx;
    if (tok % c->mod != c->n_accept % c->mod) return mr_error_set(MR_EINPUT, "mod: token %d off its class", (int)tok);
    if (++c->n_accept == c->refuse_at) return mr_error_set(MR_EINPUT, "mod: refused at token %d", c->n_accept);
    return MR_OK;
}

typedef struct {
    int32_t tok[MAXG];
    float lp[MAXG];
    mr_token_logprob top[MAXG][5];
    uint64_t logits[MAXG]; /* the hash of the row behind each token */
    int n, n_top[MAXG];
    mr_finish_reason fin;
    char err[128];
} pouts;

static void test_parallel_sampling(void **state) {
    (void)state;
    enum { N = 10, G = 12, P = 24 };
    char *tmp = tu_tmpdir("parallel_sampling"), dir[512];
    assert_non_null(tmp);
    snprintf(dir, sizeof dir, "%s/bigvocab", tmp);
    mr_tiny_params tp = {.hidden = 16, .layers = 1, .experts = 4, .top_k = 2, .inter = 32, .heads = 2, .kv_heads = 1,
                         .head_dim = 32, .rotary_dim = 16, .vocab = BV, .seed = 11};
    assert_int_equal(mr_tiny_write(dir, &tp), MR_OK);
    const int before = omp_get_max_threads();
    omp_set_num_threads(2);
    mr_kernels_set_batch_invariant(true); /* the same logits alone and in the batch: only the sampling can differ */
    eng g;
    eng_cfg c = {.kv = MR_FMT_F32, .blocks = 64, .budget = 2 * P, .running = N, .ctx = 64, .dir = dir};
    eng_open(&g, &c);
    assert_true(g.e->n_scr == 2);
    tu_rng rng = {41};
    int32_t p[N][P];
    for (int i = 0; i < N; i++) rand_prompt(&rng, p[i], P);
    const int32_t stop = 9, allowed[6] = {100, 2000, 30000, 150000, 200063, 5}, bad[2] = {30000, 5};
    const int32_t bad_len[2] = {1, 1}, all_bad[6] = {100, 2000, 30000, 150000, 200063, 5}, six_ones[6] = {1, 1, 1, 1, 1, 1};
    const mr_logit_bias bias[3] = {{stop, 50.0f}, {4242, 8.0f}, {17, -100.0f}};
    static pouts alone[N], together[N];
    for (int pass = 0; pass < 2; pass++) {
        pouts *o = pass ? together : alone;
        memset(o, 0, N * sizeof *o);
        mod_con con[2] = {{.mod = 3}, {.mod = 5, .refuse_at = 4}};
        for (int i = 0; i < N; i++) {
            mr_request_params rp = {.prompt = p[i], .n_prompt = P, .max_tokens = G, .ignore_eos = true,
                                    .want_logits = true, .user = (void *)(intptr_t)i,
                                    .sampling = {.temperature = 1.0f, .seed = (uint64_t)(500 + i)}};
            mr_sampling *sp = &rp.sampling;
            switch (i) {
            case 0: sp->top_p = 0.95f; break;                             /* a wide cut: the radix selection */
            case 1: sp->temperature = 0.25f, sp->top_p = 0.8f; break;    /* a narrow one: the sort */
            case 2: sp->top_k = 40, sp->min_p = 0.05f, sp->temperature = 1.3f; break;
            case 3: sp->temperature = 0.0f, rp.logprobs = true, rp.top_logprobs = 5; break;
            case 4: sp->repetition_penalty = 1.3f, sp->frequency_penalty = 0.5f, sp->presence_penalty = 0.4f,
                    rp.logprobs = true, rp.top_logprobs = 2; break;
            case 5: rp.logit_bias = bias, rp.n_logit_bias = 3, rp.min_tokens = 5, rp.stop_ids = &stop,
                    rp.n_stop_ids = 1, rp.ignore_eos = false; break;
            case 6: rp.allowed_ids = allowed, rp.n_allowed = 6, rp.bad_words = bad, rp.bad_word_len = bad_len,
                    rp.n_bad_words = 2; break;
            case 7: rp.constraint = (mr_token_constraint){mod_mask, mod_accept, &con[0]}, sp->top_p = 0.9f; break;
            case 8: rp.constraint = (mr_token_constraint){mod_mask, mod_accept, &con[1]}; break;
            case 9: rp.allowed_ids = allowed, rp.n_allowed = 6, rp.bad_words = all_bad, rp.bad_word_len = six_ones,
                    rp.n_bad_words = 6; break;
            }
            mr_req_id id;
            assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_OK);
            for (int guard = 0; (pass == 0 || i == N - 1) && mr_engine_has_work(g.e); guard++) {
                assert_true(guard < 10000);
                const mr_engine_step_out *so;
                assert_int_equal(mr_engine_step(g.e, &so), MR_OK);
                for (int k = 0; k < so->n_events; k++) {
                    const mr_engine_event *v = &so->events[k];
                    pouts *q = &o[(int)(intptr_t)v->user];
                    if (v->n_tokens) {
                        q->tok[q->n] = v->token;
                        q->lp[q->n] = v->logprob;
                        q->n_top[q->n] = v->n_top;
                        q->logits[q->n] = bits_hash(v->logits, BV);
                        if (v->n_top) memcpy(q->top[q->n], v->top, (size_t)v->n_top * sizeof *v->top);
                        q->n++;
                    }
                    if (v->finish) q->fin = v->finish;
                    if (v->error) snprintf(q->err, sizeof q->err, "%s", v->error);
                }
            }
        }
    }
    for (int i = 0; i < N; i++) {
        pouts *a = &alone[i], *t = &together[i];
        assert_int_equal(a->n, t->n);
        assert_memory_equal(a->logits, t->logits, (size_t)a->n * sizeof(uint64_t)); /* the premise */
        assert_int_equal(a->fin, t->fin);
        assert_string_equal(a->err, t->err);
        assert_memory_equal(a->tok, t->tok, (size_t)a->n * sizeof(int32_t));
        assert_memory_equal(a->lp, t->lp, (size_t)a->n * sizeof(float));
        assert_memory_equal(a->n_top, t->n_top, (size_t)a->n * sizeof(int));
        for (int j = 0; j < a->n; j++) assert_memory_equal(a->top[j], t->top[j], (size_t)a->n_top[j] * sizeof(a->top[j][0]));
    }
    /* what each case did (not the implementation's numbers: facts of the definitions) */
    assert_int_equal(alone[0].n, G);
    assert_int_equal(alone[3].n_top[0], 5);
    assert_int_equal(alone[5].fin, MR_FINISH_STOP); /* +50 on the stop id: it comes right at min_tokens */
    assert_int_equal(alone[5].n, 6);
    assert_int_equal(alone[5].tok[5], stop);
    for (int j = 0; j < alone[6].n; j++) assert_true(alone[6].tok[j] == 100 || alone[6].tok[j] == 2000 ||
                                                     alone[6].tok[j] == 150000 || alone[6].tok[j] == 200063);
    for (int j = 0; j < alone[7].n; j++) assert_int_equal(alone[7].tok[j] % 3, j % 3);
    assert_int_equal(alone[8].fin, MR_FINISH_ERROR);
    assert_int_equal(alone[8].n, 3);
    assert_non_null(strstr(alone[8].err, "mod: refused at token 4"));
    assert_int_equal(alone[9].fin, MR_FINISH_ERROR);
    assert_int_equal(alone[9].n, 0);
    assert_non_null(strstr(alone[9].err, "every token is masked"));
    int differ = 0; /* the seeds matter */
    for (int i = 0; i < 2; i++) differ += memcmp(alone[i].tok, alone[i + 1].tok, G * sizeof(int32_t)) != 0;
    assert_true(differ > 0);
    eng_close(&g);
    mr_kernels_set_batch_invariant(false);
    omp_set_num_threads(before);
    tu_rmtree(tmp);
    free(tmp);
}

/* ---- failures stay with their requests ---- */

static void test_request_errors(void **state) {
    (void)state;
    eng g;
    eng_cfg c = {.kv = MR_FMT_F32, .blocks = 64, .budget = 64, .running = 4, .ctx = 128};
    eng_open(&g, &c);
    int32_t p[10] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
    for (int i = 0; i < 3; i++) add_req(g.e, p, 10, 5, i);
    const mr_kv_batch *b;
    const mr_engine_step_out *so;
    /* the forward pass fails: the batch's requests end with an error, the engine goes on */
    assert_int_equal(mr_engine_schedule(g.e, &b), MR_OK);
    assert_int_equal(b->n_seq, 3);
    mr_error_set(MR_EIO, "injected failure");
    assert_int_equal(mr_engine_complete(g.e, MR_EIO, NULL, &so), MR_OK);
    assert_int_equal(so->n_events, 3);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(so->events[k].finish, MR_FINISH_ERROR);
        assert_non_null(strstr(so->events[k].error, "injected failure"));
    }
    check_ok(g.e);
    assert_false(mr_engine_has_work(g.e));
    /* a non-finite logit ends that request only */
    for (int i = 0; i < 3; i++) add_req(g.e, p, 10, 5, i);
    assert_int_equal(mr_engine_schedule(g.e, &b), MR_OK);
    assert_int_equal(mr_model_forward_kv(g.m, b, mr_engine_logits_buffer(g.e)), MR_OK);
    mr_engine_logits_buffer(g.e)[1 * V + 17] = NAN;
    assert_int_equal(mr_engine_complete(g.e, MR_OK, mr_engine_logits_buffer(g.e), &so), MR_OK);
    int errors = 0;
    for (int k = 0; k < so->n_events; k++)
        if (so->events[k].finish == MR_FINISH_ERROR) {
            errors++;
            assert_int_equal((int)(intptr_t)so->events[k].user, 1);
            assert_non_null(strstr(so->events[k].error, "non-finite"));
        }
    assert_int_equal(errors, 1);
    outs o;
    memset(&o, 0, sizeof o);
    collect(&o, so);
    run_until_idle(g.e, &o, true);
    assert_int_equal(o.n[0], 5); /* the others went on */
    assert_int_equal(o.n[2], 5);
    assert_int_equal(o.fin[1], MR_FINISH_ERROR);
    /* calls out of order are refused, not crashed on */
    assert_int_equal(mr_engine_complete(g.e, MR_OK, NULL, &so), MR_ESTATE);
    eng_close(&g);
}

/* ---- the property test ---- */

/* Random arrivals, lengths, cancellations (by flag and by id), stop ids and
 * pool sizes, stepped with the real model; after every step the accounting
 * holds (mr_engine_check), every request finishes exactly once, with the
 * reason its parameters imply, and no step exceeds its budget. */
static void test_property(void **state) {
    (void)state;
    tu_rng rng = {2024};
    int steps_total = 0;
    for (int round = 0; round < 6; round++) {
        eng g;
        static const mr_format kvs[4] = {MR_FMT_F32, MR_FMT_BF16, MR_FMT_E4M3, MR_FMT_E5M2};
        eng_cfg c = {.runner = "routed", .kv = kvs[round % 4], .blocks = 8 + (int64_t)(tu_next(&rng) % 40),
                     .budget = 16 + (int64_t)(tu_next(&rng) % 48), .running = 1 + (int)(tu_next(&rng) % 12),
                     .queued = 64, .ctx = 96, .no_prefix = round == 5};
        if (c.budget < c.running) c.budget = c.running;
        eng_open(&g, &c);
        enum { NR = 400 };
        static atomic_int flag[NR];
        static int64_t want_len[NR];
        static int fin_count[NR];
        static mr_finish_reason fin[NR];
        static mr_req_id ids[NR];
        int n_req = 0;
        int32_t shared[64];
        rand_prompt(&rng, shared, 64);
        for (int step = 0; step < 700 || mr_engine_has_work(g.e); step++) {
            assert_true(step < 20000);
            /* arrivals */
            int arrivals = step < 700 ? (int)(tu_next(&rng) % 3) : 0;
            for (int a = 0; a < arrivals && n_req < NR; a++) {
                int32_t p[80];
                int64_t n = 1 + (int64_t)(tu_next(&rng) % 60);
                rand_prompt(&rng, p, n);
                if (tu_next(&rng) % 2) memcpy(p, shared, (size_t)(n < 40 ? n : 40) * sizeof(int32_t));
                int64_t mt = 1 + (int64_t)(tu_next(&rng) % 20);
                int32_t stop = 3 + (int32_t)(tu_next(&rng) % (V - 3));
                atomic_init(&flag[n_req], 0);
                mr_request_params rp = {.prompt = p, .n_prompt = n, .max_tokens = mt, .ignore_eos = true,
                                        .stop_ids = &stop, .n_stop_ids = 1, .cancel = &flag[n_req],
                                        .sampling = {.temperature = (tu_next(&rng) % 2) ? 0.8f : 0.0f,
                                                     .seed = tu_next(&rng)},
                                        .user = (void *)(intptr_t)n_req};
                mr_req_id id;
                mr_status st = mr_engine_add(g.e, &rp, &id);
                if (st == MR_ECAPACITY || st == MR_EBUSY) continue; /* too big for this pool, or a full queue */
                assert_int_equal(st, MR_OK);
                ids[n_req] = id;
                want_len[n_req] = mt;
                fin_count[n_req] = 0;
                fin[n_req] = MR_FINISH_NONE;
                n_req++;
            }
            /* cancellations */
            if (n_req > 0 && tu_next(&rng) % 7 == 0) {
                int k = (int)(tu_next(&rng) % (uint64_t)n_req);
                if (tu_next(&rng) % 2)
                    atomic_store(&flag[k], 1);
                else
                    (void)mr_engine_cancel(g.e, ids[k]); /* NOTFOUND when it finished already */
            }
            const mr_engine_step_out *so;
            assert_int_equal(mr_engine_step(g.e, &so), MR_OK);
            assert_true(so->n_tokens <= c.budget);
            assert_true(so->n_seq <= c.running);
            for (int k = 0; k < so->n_events; k++) {
                const mr_engine_event *v = &so->events[k];
                int i = (int)(intptr_t)v->user;
                assert_true(v->finish != MR_FINISH_ERROR);
                assert_true(v->n_generated <= want_len[i]);
                if (v->finish) {
                    fin_count[i]++;
                    fin[i] = v->finish;
                    if (v->finish == MR_FINISH_LENGTH) assert_int_equal(v->n_generated, want_len[i]);
                    if (v->finish == MR_FINISH_STOP) assert_int_equal(v->token, v->stop_token);
                }
            }
            check_ok(g.e);
            steps_total++;
        }
        for (int i = 0; i < n_req; i++) {
            assert_int_equal(fin_count[i], 1); /* every request finished exactly once */
            assert_true(fin[i] == MR_FINISH_LENGTH || fin[i] == MR_FINISH_STOP || fin[i] == MR_FINISH_CANCELLED);
        }
        eng_close(&g);
    }
    assert_true(steps_total >= 4200);
}

/* ---- the per-step path does not allocate ---- */

static void test_step_does_not_allocate(void **state) {
    (void)state;
    eng g;
    eng_cfg c = {.runner = "routed", .kv = MR_FMT_BF16, .blocks = 24, .budget = 40, .running = 6, .ctx = 128};
    eng_open(&g, &c);
    tu_rng rng = {1};
    int32_t p[12][70];
    atomic_int flag[12];
    for (int i = 0; i < 12; i++) {
        rand_prompt(&rng, p[i], 70);
        if (i % 3 == 0) memcpy(p[i], p[0], 48 * sizeof(int32_t)); /* prefix hits */
        atomic_init(&flag[i], 0);
        mr_request_params rp = {.prompt = p[i], .n_prompt = 20 + 4 * i, .max_tokens = 30, .ignore_eos = true,
                                .cancel = &flag[i], .logprobs = true, .top_logprobs = 3,
                                .sampling = {.temperature = i % 2 ? 0.7f : 0.0f, .top_p = 0.9f,
                                             .repetition_penalty = 1.1f},
                                .user = (void *)(intptr_t)i};
        mr_req_id id;
        assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_OK);
    }
    const mr_engine_step_out *so;
    assert_int_equal(mr_engine_step(g.e, &so), MR_OK); /* warm-up (OpenMP, first touch) */
    uint64_t before = mr_debug_alloc_count();
    int steps = 0;
    while (mr_engine_has_work(g.e)) {
        if (steps == 10) atomic_store(&flag[7], 1);
        assert_int_equal(mr_engine_step(g.e, &so), MR_OK);
        steps++;
    }
    uint64_t after = mr_debug_alloc_count();
    mr_engine_stats s;
    mr_engine_stats_get(g.e, &s);
    assert_true(s.preemptions > 0 && s.prefix_hit_blocks > 0); /* the steps covered the heavy paths */
    if (after != before) fprintf(stderr, "%llu allocations in %d steps\n", (unsigned long long)(after - before), steps);
    assert_int_equal(after, before);
    eng_close(&g);
    /* the contiguous forward does not allocate either */
    mr_model_opts o = {.runner = "routed", .quiet = true, .max_batch = 2, .max_ctx = 32};
    mr_model *m = NULL;
    assert_int_equal(mr_model_open(tu_data("model/tiny"), &o, &m), MR_OK);
    int seq[2] = {0, 1};
    int64_t nt[2] = {5, 3};
    int32_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    float lg[2 * V];
    mr_batch b = {.n_seq = 2, .seq = seq, .n_tok = nt, .tokens = toks};
    assert_int_equal(mr_model_forward(m, &b, lg), MR_OK);
    before = mr_debug_alloc_count();
    nt[0] = nt[1] = 1;
    assert_int_equal(mr_model_forward(m, &b, lg), MR_OK);
    assert_int_equal(mr_debug_alloc_count(), before);
    mr_model_close(m);
}

/* ---- the sampler's filters against a brute-force reference ---- */

static int cmp_desc(const void *a, const void *b, void *l) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    const float *x = l;
    if (x[i] != x[j]) return x[i] > x[j] ? -1 : 1;
    return (i > j) - (i < j);
}

/* The kept set by the definition: sort all, top-k, softmax, top-p prefix, min-p. */
static int ref_kept(const float *l, const mr_sampler_params *p, bool *kept) {
    int32_t idx[V];
    for (int i = 0; i < V; i++) idx[i] = i;
    qsort_r(idx, V, sizeof(int32_t), cmp_desc, (void *)l);
    int n = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    double pr[V], sum = 0;
    for (int i = 0; i < n; i++) sum += pr[i] = exp(((double)l[idx[i]] - (double)l[idx[0]]) / p->temperature);
    int keep = n;
    if (p->top_p < 1.0f) {
        double cum = 0;
        for (int i = 0; i < n; i++) {
            cum += pr[i] / sum;
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    int k = 1;
    while (k < keep && pr[k] >= p->min_p * pr[0]) k++;
    for (int i = 0; i < V; i++) kept[i] = false;
    for (int i = 0; i < k; i++) kept[idx[i]] = true;
    return k;
}

static void test_sampler_filters_reference(void **state) {
    (void)state;
    tu_rng rng = {31};
    float prob[V];
    int32_t idx[V];
    for (int trial = 0; trial < 60; trial++) {
        float l[V];
        float spread = 1.0f + (float)(trial % 5) * 2.0f;
        for (int i = 0; i < V; i++) l[i] = tu_normal(&rng) * spread;
        mr_sampler_params p = {.temperature = 0.5f + (float)(trial % 3) * 0.5f, .top_k = trial % 4 == 0 ? 0 : 40,
                               .top_p = trial % 3 == 0 ? 1.0f : 0.6f, .min_p = trial % 2 ? 0.05f : 0.0f};
        bool kept[V];
        int k = ref_kept(l, &p, kept);
        uint64_t gs = mr_sampler_seed_state((uint64_t)trial);
        int hits[V] = {0};
        for (int d = 0; d < 2000; d++) {
            int32_t t = mr_sample_logits(&p, &gs, l, V, prob, idx);
            assert_true(t >= 0 && t < V);
            if (!kept[t]) fail_msg("trial %d: drew token %d outside the kept set of %d", trial, t, k);
            hits[t]++;
        }
        /* every kept token carrying >= 2% of the kept mass shows up */
        double mx = l[0], sum = 0;
        for (int i = 0; i < V; i++)
            if (l[i] > mx) mx = l[i];
        for (int i = 0; i < V; i++)
            if (kept[i]) sum += exp(((double)l[i] - mx) / p.temperature);
        for (int i = 0; i < V; i++)
            if (kept[i] && exp(((double)l[i] - mx) / p.temperature) / sum >= 0.02) assert_true(hits[i] > 0);
    }
    /* the draw follows the kept distribution: one token far above a flat tail
     * of 255 (weight e^-6 each), top-p 0.9: the top token holds 1 / 1.47 of
     * the kept mass, the tail's first ~187 tokens the rest */
    float l[V];
    for (int i = 0; i < V; i++) l[i] = -6.0f;
    l[77] = 0.0f;
    mr_sampler_params p = {.temperature = 1.0f, .top_p = 0.9f};
    bool kept[V];
    int k = ref_kept(l, &p, kept);
    double want_top = 1.0 / (1.0 + (double)(k - 1) * exp(-6.0));
    uint64_t gs = mr_sampler_seed_state(5);
    int top = 0, N = 20000;
    for (int d = 0; d < N; d++) {
        int32_t t = mr_sample_logits(&p, &gs, l, V, prob, idx);
        assert_true(kept[t]);
        top += t == 77;
    }
    if (fabs((double)top / N - want_top) > 0.02)
        fail_msg("top token drawn %.3f of the time, its share of the kept mass is %.3f", (double)top / N, want_top);
}

/* ---- prompt log-probabilities under preemption and beside the prefix cache ---- */

enum { PLP_N = 12, PLP_L = 50, PLP_TOP = 2 };
typedef struct {
    int64_t next[PLP_N];                       /* the next position expected */
    float lp[PLP_N][PLP_L];                    /* [position] the prompt token's log-probability */
    mr_token_logprob top[PLP_N][PLP_L][PLP_TOP];
} plp_seen;

/* Each position once, in order, the token the prompt has there. */
static void plp_collect(plp_seen *o, const mr_engine_step_out *so, const int32_t (*prompt)[PLP_L]) {
    for (int k = 0; k < so->n_events; k++) {
        const mr_engine_event *v = &so->events[k];
        int i = (int)(intptr_t)v->user;
        assert_int_equal(v->finish == MR_FINISH_ERROR, 0);
        if (!v->n_plp) continue;
        assert_int_equal(v->plp_pos, o->next[i]);
        assert_int_equal(v->plp_ntop, PLP_TOP);
        for (int q = 0; q < v->n_plp; q++) {
            const mr_token_logprob *row = v->plp + (size_t)q * (size_t)v->plp_stride;
            int64_t pos = v->plp_pos + q;
            assert_int_equal(row[0].token, prompt[i][pos]);
            o->lp[i][pos] = row[0].logprob;
            memcpy(o->top[i][pos], row + 1, sizeof o->top[i][pos]);
        }
        o->next[i] += v->n_plp;
    }
}

static void plp_run(const eng_cfg *c, const int32_t (*prompt)[PLP_L], const int64_t *len, bool warm, plp_seen *o,
                    mr_engine_stats *s) {
    eng g;
    eng_open(&g, c);
    if (warm) { /* the prompts' blocks in the prefix cache first */
        for (int i = 0; i < PLP_N; i++) add_req(g.e, prompt[i], len[i], 1, i);
        outs w;
        memset(&w, 0, sizeof w);
        run_until_idle(g.e, &w, false);
    }
    mr_engine_stats s0;
    mr_engine_stats_get(g.e, &s0);
    for (int i = 0; i < PLP_N; i++) {
        o->next[i] = 1;
        mr_request_params rp = {.prompt = prompt[i], .n_prompt = len[i], .max_tokens = 40, .ignore_eos = true,
                                .top_logprobs = PLP_TOP, .prompt_logprobs = true, .user = (void *)(intptr_t)i};
        mr_req_id id;
        assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_OK);
    }
    for (int guard = 0; mr_engine_has_work(g.e); guard++) {
        assert_true(guard < 100000);
        const mr_engine_step_out *so;
        assert_int_equal(mr_engine_step(g.e, &so), MR_OK);
        plp_collect(o, so, prompt);
        check_ok(g.e);
    }
    for (int i = 0; i < PLP_N; i++) assert_int_equal(o->next[i], len[i]); /* every position 1 .. L - 1 */
    mr_engine_stats_get(g.e, s);
    s->prefix_hits -= s0.prefix_hits;
    eng_close(&g);
}

/* Preempted mid-prompt (8-token chunks, 14 blocks) and recomputed, or with the prompt's blocks in
 * the prefix cache: every prompt position's log-probability once, the same as alone in a big pool. */
static void test_prompt_logprobs_preempt(void **state) {
    (void)state;
    tu_rng rng = {33};
    int32_t prompt[PLP_N][PLP_L];
    int64_t len[PLP_N];
    rand_prompts(&rng, prompt[0], PLP_L, len, PLP_N, 17, PLP_L - 17);
    static plp_seen tight, warm, loose;
    mr_engine_stats s;
    eng_cfg ct = {.kv = MR_FMT_F32, .blocks = 14, .budget = 8, .running = 8, .ctx = 128};
    plp_run(&ct, (const int32_t(*)[PLP_L])prompt, len, false, &tight, &s);
    assert_true(s.preemptions > 0);
    eng_cfg cw = {.kv = MR_FMT_F32, .blocks = 1024, .budget = 64, .running = PLP_N, .ctx = 128};
    plp_run(&cw, (const int32_t(*)[PLP_L])prompt, len, true, &warm, &s);
    assert_int_equal(s.prefix_hits, 0); /* the owed positions were computed, not taken from the cache */
    eng_cfg cl = {.kv = MR_FMT_F32, .blocks = 1024, .budget = 64, .running = PLP_N, .ctx = 128, .no_prefix = true};
    plp_run(&cl, (const int32_t(*)[PLP_L])prompt, len, false, &loose, &s);
    assert_int_equal(s.preemptions, 0);
    for (int i = 0; i < PLP_N; i++)
        for (int64_t p = 1; p < len[i]; p++) {
            assert_float_equal(tight.lp[i][p], loose.lp[i][p], 1e-4);
            assert_float_equal(warm.lp[i][p], loose.lp[i][p], 1e-4);
            assert_true(loose.lp[i][p] <= 0.0f && loose.top[i][p][0].logprob >= loose.lp[i][p] - 1e-6f);
            for (int k = 0; k < PLP_TOP; k++) assert_int_equal(tight.top[i][p][k].token, loose.top[i][p][k].token);
        }
}

/* The prompt-logprob buffers come with the first request that asks: each of their allocations
 * failing is that request's MR_ENOMEM (nothing half-made kept: the next try works, and the
 * engine frees cleanly, under ASan too). */
static void test_prompt_logprobs_alloc_failure(void **state) {
    (void)state;
    eng g;
    eng_cfg c = {.kv = MR_FMT_F32, .blocks = 64, .budget = 64, .running = 4, .ctx = 128};
    eng_open(&g, &c);
    int32_t p[20];
    tu_rng rng = {41};
    rand_prompt(&rng, p, 20);
    mr_request_params rp = {.prompt = p, .n_prompt = 20, .max_tokens = 2, .ignore_eos = true, .top_logprobs = 1,
                            .prompt_logprobs = true};
    mr_req_id id;
    for (long k = 0; k < 7; k++) {
        mr_debug_alloc_fail_after(k);
        mr_status st = mr_engine_add(g.e, &rp, &id);
        mr_debug_alloc_fail_after(-1);
        assert_int_equal(st, MR_ENOMEM);
        eng_close(&g); /* right after the failure: nothing freed twice, nothing leaked */
        eng_open(&g, &c);
    }
    assert_int_equal(mr_engine_add(g.e, &rp, &id), MR_OK);
    int64_t next = 1;
    for (int guard = 0; mr_engine_has_work(g.e); guard++) {
        assert_true(guard < 100);
        const mr_engine_step_out *so;
        assert_int_equal(mr_engine_step(g.e, &so), MR_OK);
        for (int k = 0; k < so->n_events; k++) {
            assert_int_equal(so->events[k].finish == MR_FINISH_ERROR, 0);
            next += so->events[k].n_plp;
        }
    }
    assert_int_equal(next, 20);
    eng_close(&g);
}

int main(void) {
    tu_isa_begin("test_engine");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_and_chunking),
        cmocka_unit_test(test_paged_vs_contiguous),
        cmocka_unit_test(test_kv_batch_refused),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_deterministic_inference),
        cmocka_unit_test(test_prefix_sharing),
        cmocka_unit_test(test_cache_salt),
        cmocka_unit_test(test_prefix_flush),
        cmocka_unit_test(test_hold_and_retract),
        cmocka_unit_test(test_release_kv),
        cmocka_unit_test(test_eviction_under_pressure),
        cmocka_unit_test(test_preemption),
        cmocka_unit_test(test_priority),
        cmocka_unit_test(test_prompt_logprobs_preempt),
        cmocka_unit_test(test_prompt_logprobs_alloc_failure),
        cmocka_unit_test(test_cancellation),
        cmocka_unit_test(test_admission),
        cmocka_unit_test(test_sampling_features),
        cmocka_unit_test(test_logit_bias_min_tokens),
        cmocka_unit_test(test_allowed_ids_bad_words),
        cmocka_unit_test(test_token_constraint),
        cmocka_unit_test(test_seeded_sampling_invariance),
        cmocka_unit_test(test_parallel_sampling),
        cmocka_unit_test(test_request_errors),
        cmocka_unit_test(test_property),
        cmocka_unit_test(test_step_does_not_allocate),
        cmocka_unit_test(test_sampler_filters_reference),
        cmocka_unit_test(test_step_threads),
        cmocka_unit_test(test_step_threads_tokens),
    };
    /* One thread: the scheduler is single-threaded, and the multi-threaded
     * parts of the forward (attention, matmuls, MoE) are covered by
     * test_model; on a loaded 2-core host, OpenMP barriers between busy
     * threads cost milliseconds per region. MR_TEST_THREADS=N to change. */
    omp_set_num_threads(getenv("MR_TEST_THREADS") ? atoi(getenv("MR_TEST_THREADS")) : 1);
    if (getenv("MR_TEST_FILTER")) cmocka_set_test_filter(getenv("MR_TEST_FILTER")); /* e.g. test_prop* */
    return cmocka_run_group_tests(tests, NULL, NULL);
}
