/* test_ep.c — expert parallelism through the real mpi transport, run under
 * `mpirun -np R` by tests/mpi/run.sh. Every rank computes the one-process
 * result itself (a2a none, every expert held) and compares the
 * expert-parallel one with it bit for bit; the ranks then agree on the
 * number of failures (rank 0 prints the summary, the exit status is 1 when
 * any rank failed).
 *
 *   test_ep moe
 *     one MoE layer (mr_moe_run) for every weight format and activation
 *     mode, routed and reference, E divisible by R and not (8 and 7
 *     experts), T from 1 (fewer tokens than ranks: ranks with no share) to
 *     13: outputs and selections bit-identical in replicated calls (every
 *     rank the same tokens) and in data-parallel calls (each rank its own
 *     tokens, rank 0 none); counts that add up (rows sent = rows computed =
 *     T * k over the ranks; each local expert computed exactly the rows the
 *     one-process selection gives it); every token routed to one rank's
 *     experts, by precomputed ids and by a crafted router bias (the other
 *     ranks receive no row and still take part).
 *   test_ep model DIR...
 *     each checkpoint opened twice on every rank, one process and mpi:
 *     prompts prefilled and decoded greedily, every layer's selection and
 *     MoE output, every step's logits and the greedy tokens compared (the
 *     first checkpoint also with the reference runner); then, with
 *     --local-copies DIR, each rank writes a copy of the checkpoint that
 *     holds none of the other ranks' expert weights (only their NVFP4
 *     input_scale scalars, which the layer's w4a4 scales take the maximum
 *     of) and runs the same prompts on it expert-parallel: the results
 *     equal the one process on the full checkpoint, so no rank read
 *     another's experts (one process on such a copy fails: the missing
 *     tensors are needed there).
 *   test_ep mismatch
 *     the ranks pass different batches to a replicated call: every rank
 *     fails with "the ranks' batches differ" instead of computing garbage
 *     or hanging (prints "MISMATCH REFUSED" per rank; the group is broken
 *     after it, so the process exits without MPI_Finalize). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/model_internal.h"
#include "moerun/config.h"
#include "moerun/io.h"
#include "moerun/model.h"
#include "moerun/moe.h"
#include "testutil.h"

static int RANK, SIZE, fails, checks;

#define CHECK(cond, ...)                                                  \
    do {                                                                  \
        checks++;                                                         \
        if (!(cond)) {                                                    \
            fprintf(stderr, "rank %d: FAIL %s:%d: ", RANK, __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                 \
            fputc('\n', stderr);                                          \
            fails++;                                                      \
        }                                                                 \
    } while (0)

#define OK(expr)                                                                                   \
    do {                                                                                           \
        mr_status st_ = (expr);                                                                    \
        if (st_ != MR_OK) {                                                                        \
            fprintf(stderr, "rank %d: FATAL %s:%d: %s: %s\n", RANK, __FILE__, __LINE__, #expr,     \
                    mr_error_last());                                                              \
            exit(1); /* the others stop at their deadline */                                       \
        }                                                                                          \
    } while (0)

enum { H = 128, I = 128, K = 2, MAXT = 16, MAXE = 8 };

static mr_moe_weights *make_weights(int E, mr_format fmt, uint64_t seed) {
    mr_moe_weights *w;
    OK(mr_moe_weights_new(&w, E, H, I, fmt));
    tu_rng r = {seed};
    float *a = malloc(sizeof(float) * H * I), *b = malloc(sizeof(float) * H * I);
    for (int e = 0; e < E; e++) {
        float amax = 0;
        for (int i = 0; i < H * I; i++) a[i] = tu_normal(&r) / sqrtf((float)H), amax = fmaxf(amax, fabsf(a[i]));
        for (int i = 0; i < H * I; i++) b[i] = tu_normal(&r) / sqrtf((float)H), amax = fmaxf(amax, fabsf(b[i]));
        OK(mr_qmatrix_quantize(&w->w1[e], fmt, a, I, H, amax));
        OK(mr_qmatrix_quantize(&w->w3[e], fmt, b, I, H, amax));
        for (int i = 0; i < H * I; i++) a[i] = tu_normal(&r) / sqrtf((float)I);
        OK(mr_qmatrix_quantize(&w->w2[e], fmt, a, H, I, 0.0f));
    }
    free(a);
    free(b);
    return w;
}

/* The experts [first, first + n) of full, as a rank loads them (w4a4: the layer's scales over all experts). */
static mr_moe_weights *subset(const mr_moe_weights *full, int first, int n) {
    mr_moe_weights *c, *w;
    OK(mr_moe_weights_clone(full, &c));
    OK(mr_moe_weights_new(&w, n, full->hidden, full->inter, full->fmt));
    for (int e = 0; e < n; e++) {
        w->w1[e] = c->w1[first + e], w->w3[e] = c->w3[first + e], w->w2[e] = c->w2[first + e];
        memset(&c->w1[first + e], 0, sizeof(mr_qmatrix));
        memset(&c->w3[first + e], 0, sizeof(mr_qmatrix));
        memset(&c->w2[first + e], 0, sizeof(mr_qmatrix));
    }
    for (int e = 0; e < full->n_experts; e++) {
        w->in_scale13 = fmaxf(w->in_scale13, fmaxf(full->w1[e].input_scale, full->w3[e].input_scale));
        w->in_scale2 = fmaxf(w->in_scale2, full->w2[e].input_scale);
    }
    w->expert_first = first;
    mr_moe_weights_free(c);
    return w;
}

static int64_t sum_all(int64_t v) {
    int64_t all[256];
    OK(mr_ep_allgather(&v, all, sizeof v, 60));
    int64_t s = 0;
    for (int q = 0; q < SIZE; q++) s += all[q];
    return s;
}

typedef enum { ROUTE_SPREAD, ROUTE_ONE_RANK_IDS, ROUTE_ONE_RANK_BIAS } route_kind;

typedef struct {
    mr_format fmt;
    mr_act_mode mode;
    mr_format act_dtype;
} fmt_case;

/* One layer: the one-process run, then the EP run (replicated, then data-parallel), compared. */
static void moe_case(const mr_moe_runner *run, fmt_case fc, int E, int64_t T, route_kind rk) {
    char label[160];
    snprintf(label, sizeof label, "%s %s %s E=%d T=%lld route=%d", run->name, mr_act_mode_name(fc.mode),
             fc.act_dtype == MR_FMT_BF16 ? "bf16-act" : "f32-act", E, (long long)T, (int)rk);
    const size_t esz = fc.act_dtype == MR_FMT_BF16 ? 2 : 4;
    mr_moe_weights *full = make_weights(E, fc.fmt, 100 + (uint64_t)E * 7 + (uint64_t)fc.mode);
    float xf[MAXT * H], logits[MAXT * MAXE], bias[MAXE];
    unsigned char x[MAXT * H * 4], out1[MAXT * H * 4], outp[MAXT * H * 4];
    int32_t ids[MAXT * K], ids1[MAXT * K], idsp[MAXT * K];
    float wts[MAXT * K];
    tu_rng g = {1000 + (uint64_t)T};
    for (int i = 0; i < MAXT * H; i++) xf[i] = tu_normal(&g);
    for (int i = 0; i < MAXT * H; i++) {
        if (esz == 2) {
            uint16_t b = mr_f32_to_bf16(xf[i]);
            memcpy(x + 2 * i, &b, 2);
        } else {
            memcpy(x + 4 * i, &xf[i], 4);
        }
    }
    if (fc.mode == MR_ACT_W4A4) OK(mr_moe_weights_calibrate(full, xf, MAXT));
    /* the target rank of the one-rank routings: rank 0 (it holds the most experts) */
    int f0, n0;
    mr_moe_placement_contiguous(E, SIZE, 0, &f0, &n0);
    for (int e = 0; e < E; e++) bias[e] = rk == ROUTE_ONE_RANK_BIAS && e >= f0 && e < f0 + n0 ? 8.0f : 0.0f;
    for (int64_t t = 0; t < T; t++) {
        for (int e = 0; e < E; e++) logits[t * E + e] = tu_normal(&g);
        for (int j = 0; j < K; j++) {
            ids[t * K + j] = rk == ROUTE_ONE_RANK_IDS ? f0 + (int)((t + j) % n0) : (int)((t * 3 + j * 5) % E);
            wts[t * K + j] = 0.25f + 0.5f * tu_uniform(&g);
        }
    }
    const bool precomputed = rk != ROUTE_ONE_RANK_BIAS;
    mr_routing ro = {.method = MR_ROUTING_MINIMAX2, .n_experts = E, .top_k = K, .scale = 1.0f, .bias = bias};
    mr_moe_problem p = {.device = MR_DEVICE_CPU, .cpu_flags = mr_cpu()->flags, .weight_format = fc.fmt,
                        .act_mode = fc.mode, .act_dtype = fc.act_dtype, .routing = MR_ROUTING_MINIMAX2,
                        .n_experts = E, .top_k = K, .hidden = H, .inter = I, .a2a = MR_A2A_NONE};
    /* one process */
    mr_moe_weights *w1;
    OK(mr_moe_weights_clone(full, &w1));
    mr_moe_ctx *c1;
    OK(mr_moe_ctx_new(run, &p, MAXT, &c1));
    OK(mr_moe_ctx_prepare(c1, w1));
    mr_moe_args a = {.T = T, .x = x, .out = out1, .ids = precomputed ? ids : NULL, .weights = precomputed ? wts : NULL,
                     .logits = logits, .routing = &ro, .ids_out = ids1};
    OK(mr_moe_run(c1, w1, &a));
    /* this rank of the expert-parallel run */
    mr_moe_problem pe = p;
    pe.a2a = MR_A2A_MPI;
    pe.ep_size = SIZE;
    pe.ep_rank = RANK;
    mr_moe_placement_contiguous(E, SIZE, RANK, &pe.local_first, &pe.n_local);
    mr_moe_weights *we = subset(full, pe.local_first, pe.n_local);
    mr_moe_ctx *ce;
    OK(mr_moe_ctx_new(run, &pe, MAXT, &ce));
    OK(mr_moe_ctx_prepare(ce, we));
    /* replicated: every rank the same T tokens */
    memset(outp, 0xA5, sizeof outp);
    mr_moe_args b = a;
    b.out = outp;
    b.ids_out = idsp;
    b.replicated = true;
    OK(mr_moe_run(ce, we, &b));
    CHECK(memcmp(outp, out1, (size_t)T * H * esz) == 0, "%s: replicated output differs from one process", label);
    CHECK(memcmp(idsp, ids1, (size_t)T * K * 4) == 0, "%s: replicated selection differs", label);
    mr_a2a_stats as;
    mr_moe_ctx_a2a_stats(ce, &as, false);
    CHECK(sum_all(as.rows_sent) == T * K, "%s: rows sent over the ranks != T*k", label);
    CHECK(sum_all(as.rows_recv) == T * K, "%s: rows computed over the ranks != T*k", label);
    for (int e = 0; e < pe.n_local; e++) {
        int64_t want = 0;
        for (int64_t i = 0; i < T * K; i++) want += ids1[i] == pe.local_first + e;
        CHECK(as.recv_per_expert[e] == want, "%s: expert %d computed %lld rows, the selection gives it %lld", label,
              pe.local_first + e, (long long)as.recv_per_expert[e], (long long)want);
    }
    if (rk != ROUTE_SPREAD && RANK != 0)
        CHECK(as.last_rows_recv == 0, "%s: rank %d received %lld rows, every token goes to rank 0", label, RANK,
              (long long)as.last_rows_recv);
    if (rk != ROUTE_SPREAD && RANK == 0) CHECK(as.last_rows_recv == T * K, "%s: rank 0 computed every row", label);
    if (SIZE > 1) CHECK(as.dispatch_bytes > 0 || T * K == as.rows_recv, "%s: no dispatch bytes counted", label);
    mr_moe_ctx_a2a_stats(ce, NULL, true);
    /* data-parallel: rank r the origin of its own tokens (rank 0 none when there are several ranks) */
    int64_t t0 = 0, tn = T;
    if (SIZE > 1) {
        const int64_t per = (T + SIZE - 2) / (SIZE - 1);
        t0 = RANK == 0 ? 0 : (RANK - 1) * per;
        if (t0 > T) t0 = T;
        tn = RANK == 0 ? 0 : (t0 + per > T ? T - t0 : per);
    }
    memset(outp, 0xA5, sizeof outp);
    mr_moe_args d = {.T = tn, .x = x + (size_t)t0 * H * esz, .out = outp, .ids = precomputed ? ids + t0 * K : NULL,
                     .weights = precomputed ? wts + t0 * K : NULL, .logits = logits + t0 * E, .routing = &ro,
                     .ids_out = idsp};
    OK(mr_moe_run(ce, we, &d));
    CHECK(memcmp(outp, out1 + (size_t)t0 * H * esz, (size_t)tn * H * esz) == 0,
          "%s: data-parallel output of tokens %lld..%lld differs", label, (long long)t0, (long long)(t0 + tn));
    CHECK(memcmp(idsp, ids1 + t0 * K, (size_t)tn * K * 4) == 0, "%s: data-parallel selection differs", label);
    mr_moe_ctx_a2a_stats(ce, &as, true);
    CHECK(sum_all(as.rows_recv) == T * K, "%s: data-parallel rows computed != T*k", label);
    mr_moe_ctx_free(ce);
    mr_moe_weights_free(we);
    mr_moe_ctx_free(c1);
    mr_moe_weights_free(w1);
    mr_moe_weights_free(full);
}

static void run_moe(void) {
    const fmt_case fcs[] = {{MR_FMT_BF16, MR_ACT_W16A32, MR_FMT_F32},  {MR_FMT_BF16, MR_ACT_W16A16, MR_FMT_BF16},
                            {MR_FMT_FP8_BLOCK, MR_ACT_W8A8, MR_FMT_F32}, {MR_FMT_FP8_BLOCK, MR_ACT_W8A16, MR_FMT_F32},
                            {MR_FMT_NVFP4, MR_ACT_W4A4, MR_FMT_F32},     {MR_FMT_NVFP4, MR_ACT_W4A8, MR_FMT_BF16},
                            {MR_FMT_NVFP4, MR_ACT_W4A16, MR_FMT_F32}};
    const mr_moe_runner *routed = mr_moe_runner_get(MR_RUNNER_ROUTED), *ref = mr_moe_runner_get(MR_RUNNER_REFERENCE);
    const int64_t Ts[] = {1, 3, 13};
    for (size_t f = 0; f < sizeof fcs / sizeof fcs[0]; f++)
        for (int Ei = 0; Ei < 2; Ei++) {
            const int E = Ei ? 7 : 8; /* 7: not divisible by 2 or 4 */
            if (E < SIZE) continue;
            for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++) moe_case(routed, fcs[f], E, Ts[t], ROUTE_SPREAD);
        }
    /* every token to rank 0's experts (ids, then a router bias); the reference runner behind mpi */
    int f0, n0;
    mr_moe_placement_contiguous(7, SIZE, 0, &f0, &n0);
    for (size_t f = 0; f < sizeof fcs / sizeof fcs[0]; f += 2) {
        moe_case(routed, fcs[f], 8, 13, ROUTE_ONE_RANK_BIAS);
        if (n0 >= K) moe_case(routed, fcs[f], 7, 5, ROUTE_ONE_RANK_IDS);
    }
    moe_case(ref, fcs[2], 7, 5, ROUTE_SPREAD);
    moe_case(ref, fcs[4], 8, 3, ROUTE_ONE_RANK_BIAS);
}

/* ---- model level ---- */
typedef struct {
    int n;              /* layer calls recorded */
    int cap;
    int64_t *T;         /* [cap] */
    int *layer;         /* [cap] */
    int k;
    int32_t **ids;      /* [cap][T*k] */
    float **out;        /* [cap][T*H] */
    int64_t H;
} moe_log;

static void log_hook(void *user, int layer, const float *x, const float *out, int64_t T, const int32_t *ids, int k) {
    (void)x;
    moe_log *L = user;
    if (L->n == L->cap) {
        L->cap = L->cap ? 2 * L->cap : 64;
        L->T = realloc(L->T, (size_t)L->cap * sizeof(int64_t));
        L->layer = realloc(L->layer, (size_t)L->cap * sizeof(int));
        L->ids = realloc(L->ids, (size_t)L->cap * sizeof(int32_t *));
        L->out = realloc(L->out, (size_t)L->cap * sizeof(float *));
    }
    L->T[L->n] = T;
    L->layer[L->n] = layer;
    L->k = k;
    L->ids[L->n] = malloc((size_t)(T * k) * sizeof(int32_t));
    L->out[L->n] = malloc((size_t)(T * L->H) * sizeof(float));
    memcpy(L->ids[L->n], ids, (size_t)(T * k) * sizeof(int32_t));
    memcpy(L->out[L->n], out, (size_t)(T * L->H) * sizeof(float));
    L->n++;
}

static void log_free(moe_log *L) {
    for (int i = 0; i < L->n; i++) free(L->ids[i]), free(L->out[i]);
    free(L->T), free(L->layer), free(L->ids), free(L->out);
    memset(L, 0, sizeof *L);
}

enum { NSEQ = 3, STEPS = 6 };

/* Opens dir with a2a (none | mpi) and runner (NULL: auto), then (swap non-NULL) loads checkpoint swap's
 * weights on every rank and swaps them in; runs the prompts, greedy; fills logits and tokens. */
static void model_run(const char *dir, const char *swap, const char *a2a, const char *runner, moe_log *L,
                      float *logits, int32_t *toks, int64_t *V_out) {
    mr_options o;
    OK(mr_options_init(&o));
    OK(mr_options_set(&o, "model", dir, MR_SRC_FLAG));
    OK(mr_options_set(&o, "moe_a2a_backend", a2a, MR_SRC_FLAG));
    OK(mr_options_set(&o, "threads", "1", MR_SRC_FLAG));
    if (runner) OK(mr_options_set(&o, "moe_runner_backend", runner, MR_SRC_FLAG));
    mr_resolution *r = NULL;
    OK(mr_resolve(&o, &r));
    const mr_exec *x = mr_resolution_exec(r);
    OK(mr_exec_apply(x));
    CHECK(x->ep_size == (!strcmp(a2a, "mpi") ? SIZE : 1), "%s %s: ep_size %d", dir, a2a, x->ep_size);
    mr_model_opts mo = {.exec = x, .max_batch = NSEQ, .max_ctx = 64, .max_tokens = 32};
    mr_model *m = NULL;
    OK(mr_model_open(dir, &mo, &m));
    if (swap) {
        mr_model *staged = NULL;
        OK(mr_model_weights_load(m, swap, &staged));
        mr_model_weights_swap(m, staged);
        mr_model_close(staged);
    }
    const mr_model_config *c = mr_model_config_of(m);
    L->H = c->hidden;
    mr__model_set_moe_hook(m, log_hook, L);
    const int64_t V = c->vocab;
    *V_out = V;
    int seq[NSEQ] = {0, 1, 2};
    int64_t nt[NSEQ] = {5, 3, 9};
    int32_t prompt[17], step_tok[NSEQ];
    for (int i = 0; i < 17; i++) prompt[i] = (int32_t)((i * 37 + 11) % V);
    mr_batch b = {.n_seq = NSEQ, .seq = seq, .n_tok = nt, .tokens = prompt};
    for (int s = 0; s <= STEPS; s++) {
        float *lg = logits + (size_t)s * NSEQ * (size_t)V;
        OK(mr_model_forward(m, &b, lg));
        for (int i = 0; i < NSEQ; i++) {
            step_tok[i] = toks[s * NSEQ + i] = mr_argmax(lg + (size_t)i * (size_t)V, V);
            nt[i] = 1;
        }
        b.tokens = step_tok;
    }
    mr_model_close(m);
    mr_resolution_free(r);
    mr_options_free(&o);
}

/* One process on dir against the ranks on ep_dir (dir itself, or each rank's copy; swap: then that
 * checkpoint's weights swapped in on every rank): every MoE call's selection and output, every step's logits,
 * the greedy tokens. Returns the MoE calls compared. */
static int model_compare(const char *dir, const char *ep_dir, const char *swap, const char *runner) {
    moe_log A = {0}, B = {0};
    const size_t nl = (size_t)(STEPS + 1) * NSEQ * 4096 * 2;
    float *la = malloc(nl * sizeof(float)), *lb = malloc(nl * sizeof(float));
    int32_t ta[(STEPS + 1) * NSEQ], tb[(STEPS + 1) * NSEQ];
    int64_t V = 0, V2 = 0;
    model_run(dir, NULL, "none", runner, &A, la, ta, &V);
    model_run(ep_dir, swap, "mpi", runner, &B, lb, tb, &V2);
    const char *rn = runner ? runner : "auto";
    CHECK(A.n == B.n && A.n > 0, "%s %s: %d MoE calls in one process, %d expert-parallel", dir, rn, A.n, B.n);
    for (int i = 0; i < A.n && i < B.n; i++) {
        CHECK(A.T[i] == B.T[i] && A.layer[i] == B.layer[i], "%s %s: call %d shape", dir, rn, i);
        if (A.T[i] != B.T[i]) break;
        CHECK(memcmp(A.ids[i], B.ids[i], (size_t)(A.T[i] * A.k) * sizeof(int32_t)) == 0,
              "%s %s: call %d (layer %d): expert ids differ", dir, rn, i, A.layer[i]);
        CHECK(memcmp(A.out[i], B.out[i], (size_t)(A.T[i] * A.H) * sizeof(float)) == 0,
              "%s %s: call %d (layer %d): MoE output differs", dir, rn, i, A.layer[i]);
    }
    CHECK(V == V2 && memcmp(la, lb, (size_t)(STEPS + 1) * NSEQ * (size_t)V * sizeof(float)) == 0,
          "%s %s: logits differ", dir, rn);
    CHECK(memcmp(ta, tb, sizeof ta) == 0, "%s %s: greedy tokens differ", dir, rn);
    const int n = A.n;
    log_free(&A);
    log_free(&B);
    free(la);
    free(lb);
    return n;
}

static void model_case(const char *dir, const char *runner) {
    const int n = model_compare(dir, dir, NULL, runner);
    if (RANK == 0)
        printf("model %s runner %s: %d MoE calls, %d steps x %d sequences compared\n", dir, runner ? runner : "auto",
               n, STEPS + 1, NSEQ);
}

/* "...block_sparse_moe.experts.X.<rest>": X, and whether rest is an input_scale; -1 for other tensors. */
/* New weights under expert parallelism: the ranks open dir, each loads its experts of fresh (the same model,
 * other weights) and swaps them in; against one process on fresh. */
static void swap_case(const char *dir, const char *fresh) {
    const int n = model_compare(fresh, dir, fresh, NULL);
    if (RANK == 0)
        printf("model %s: new weights from %s swapped in on every rank: %d MoE calls, %d steps x %d sequences "
               "compared\n", dir, fresh, n, STEPS + 1, NSEQ);
}

static int expert_of(const char *name, bool *input_scale) {
    const char *p = strstr(name, ".block_sparse_moe.experts.");
    if (!p) return -1;
    p += strlen(".block_sparse_moe.experts.");
    char *end;
    long x = strtol(p, &end, 10);
    if (end == p || *end != '.') return -1;
    const char *tail = strrchr(end, '.');
    *input_scale = tail && !strcmp(tail, ".input_scale");
    return (int)x;
}

static void copy_file(const char *from, const char *to) {
    size_t len;
    void *buf = tu_read_file(from, &len);
    if (!buf) return; /* optional files (generation_config.json) */
    CHECK(tu_write_file(to, buf, len) == 0, "cannot write %s", to);
    free(buf);
}

/* Writes into out (created) the checkpoint dir without the weights of experts outside [first, first + n);
 * returns the number of expert tensors left out. */
static int write_local_copy(const char *dir, const char *out, int first, int n) {
    CHECK(strlen(dir) < 1000 && strlen(out) < 1000, "path too long");
    char path[1600], to[1600];
    CHECK(mkdir(out, 0755) == 0 || errno == EEXIST, "mkdir %s", out);
    static const char *const side[] = {"config.json", "generation_config.json", "tokenizer.json",
                                       "tokenizer_config.json"};
    for (size_t i = 0; i < sizeof side / sizeof side[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, side[i]);
        snprintf(to, sizeof to, "%s/%s", out, side[i]);
        copy_file(path, to);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    mr_st_file *f;
    OK(mr_st_open(path, &f));
    mr_st_writer *w;
    OK(mr_st_writer_new(&w));
    for (size_t i = 0; i < mr_st_metadata_count(f); i++) {
        const char *k, *v;
        if (mr_st_metadata_at(f, i, &k, &v)) OK(mr_st_writer_set_metadata(w, k, v));
    }
    int dropped = 0;
    for (size_t i = 0; i < mr_st_count(f); i++) {
        const mr_st_tensor *t = mr_st_tensor_at(f, i);
        bool is_scale = false;
        const int x = expert_of(t->name, &is_scale);
        if (x >= 0 && (x < first || x >= first + n) && !is_scale) {
            dropped++;
            continue;
        }
        OK(mr_st_writer_add(w, t->name, t->dtype, t->shape, t->ndim, t->data));
    }
    snprintf(to, sizeof to, "%s/model.safetensors", out);
    OK(mr_st_writer_write(w, to));
    mr_st_writer_free(w);
    mr_st_close(f);
    return dropped;
}

/* Resolves (a2a none, one thread) and opens dir in one process, then closes it: the status (the error in
 * mr_error_last) and the experts of the model. */
static mr_status open_one(const char *dir, int *E) {
    mr_options o;
    OK(mr_options_init(&o));
    OK(mr_options_set(&o, "model", dir, MR_SRC_FLAG));
    OK(mr_options_set(&o, "moe_a2a_backend", "none", MR_SRC_FLAG));
    OK(mr_options_set(&o, "threads", "1", MR_SRC_FLAG));
    mr_resolution *r = NULL;
    mr_status st = mr_resolve(&o, &r);
    if (st == MR_OK) {
        mr_model *m = NULL;
        mr_model_opts mo = {.exec = mr_resolution_exec(r), .max_batch = 1, .max_ctx = 16, .max_tokens = 16};
        st = mr_model_open(dir, &mo, &m);
        if (st == MR_OK) *E = (int)mr_model_config_of(m)->n_experts;
        mr_model_close(m);
    }
    mr_resolution_free(r);
    mr_options_free(&o);
    return st;
}

/* The expert-parallel run on per-rank copies without the other ranks' experts, against one process on dir. */
static void local_copy_case(const char *dir, const char *scratch, int idx) {
    int E = 0, first, n;
    OK(open_one(dir, &E));
    mr_moe_placement_contiguous(E, SIZE, RANK, &first, &n);
    char out[1300];
    CHECK(strlen(scratch) < 1000, "path too long");
    snprintf(out, sizeof out, "%.1000s/local%d-rank%d-of-%d", scratch, idx, RANK, SIZE);
    const int dropped = write_local_copy(dir, out, first, n);
    CHECK(SIZE == 1 || dropped > 0, "%s: the copy of rank %d left no expert out", dir, RANK);
    if (dropped > 0) { /* one process on the copy: the missing experts are needed there */
        int Ec = 0;
        const mr_status st = open_one(out, &Ec);
        CHECK(st != MR_OK && strstr(mr_error_last(), "experts."),
              "%s: one process opened a copy without %d expert tensors (%s)", out, dropped,
              st ? mr_error_last() : "no error");
    }
    const int calls = model_compare(dir, out, NULL, NULL);
    if (RANK == 0)
        printf("model %s: each rank on a copy without the other ranks' experts (rank 0 left out %d tensors): "
               "%d MoE calls compared\n", dir, dropped, calls);
}

static int run_mismatch(void) {
    if (SIZE < 2) {
        printf("MISMATCH needs 2 ranks\n");
        return 77;
    }
    const fmt_case fc = {MR_FMT_BF16, MR_ACT_W16A32, MR_FMT_F32};
    mr_moe_weights *full = make_weights(8, fc.fmt, 5);
    mr_moe_problem pe = {.device = MR_DEVICE_CPU, .cpu_flags = mr_cpu()->flags, .weight_format = fc.fmt,
                         .act_mode = fc.mode, .act_dtype = fc.act_dtype, .routing = MR_ROUTING_MINIMAX2,
                         .n_experts = 8, .top_k = K, .hidden = H, .inter = I, .a2a = MR_A2A_MPI, .ep_size = SIZE,
                         .ep_rank = RANK};
    mr_moe_placement_contiguous(8, SIZE, RANK, &pe.local_first, &pe.n_local);
    mr_moe_weights *we = subset(full, pe.local_first, pe.n_local);
    mr_moe_ctx *ce;
    OK(mr_moe_ctx_new(mr_moe_runner_get(MR_RUNNER_ROUTED), &pe, MAXT, &ce));
    OK(mr_moe_ctx_prepare(ce, we));
    float x[MAXT * H] = {0}, out[MAXT * H], wts[MAXT * K];
    int32_t ids[MAXT * K];
    for (int i = 0; i < MAXT * K; i++) ids[i] = i % 8, wts[i] = 0.5f;
    mr_moe_args a = {.T = RANK == 0 ? 5 : 4, .x = x, .out = out, .ids = ids, .weights = wts, .replicated = true};
    mr_status st = mr_moe_run(ce, we, &a);
    const bool ok = st == MR_EPEER && strstr(mr_error_last(), "the ranks' batches differ") && mr_ep_broken();
    printf("rank %d: %s: %s\n", RANK, ok ? "MISMATCH REFUSED" : "MISMATCH NOT REFUSED", mr_error_last());
    fflush(stdout);
    /* a second call fails at once with the first error */
    st = mr_moe_run(ce, we, &a);
    printf("rank %d: %s\n", RANK, st == MR_EPEER ? "BROKEN STAYS BROKEN" : "BROKEN GROUP RAN AGAIN");
    fflush(stdout);
    mr_moe_ctx_free(ce);
    mr_moe_weights_free(we);
    mr_moe_weights_free(full);
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_ep moe | model [--local-copies SCRATCH] (DIR | --swap DIR NEW)... | mismatch\n");
        return 2;
    }
    OK(mr_ep_init(false));
    RANK = mr_ep_rank();
    SIZE = mr_ep_size();
    mr_ep_set_timeout(60); /* a failed rank stops the others within a minute */
    if (!strcmp(argv[1], "mismatch")) {
        int rc = run_mismatch();
        fflush(NULL);
        _exit(rc); /* the group is broken: no MPI_Finalize */
    }
    if (!strcmp(argv[1], "moe")) {
        run_moe();
    } else if (!strcmp(argv[1], "model")) {
        int i0 = 2;
        const char *scratch = NULL;
        if (argc > 3 && !strcmp(argv[2], "--local-copies")) scratch = argv[3], i0 = 4;
        for (int i = i0; i < argc; i++) {
            if (!strcmp(argv[i], "--swap") && i + 2 < argc) {
                swap_case(argv[i + 1], argv[i + 2]);
                i += 2;
                continue;
            }
            model_case(argv[i], NULL);
            if (i == i0) model_case(argv[i], "reference");
            if (scratch) local_copy_case(argv[i], scratch, i - i0);
        }
    } else {
        fprintf(stderr, "test_ep: unknown mode '%s'\n", argv[1]);
        return 2;
    }
    int64_t total_fails = sum_all(fails), total_checks = sum_all(checks);
    if (RANK == 0)
        printf("test_ep %s: %d ranks, %lld checks, %lld failed: %s\n", argv[1], SIZE, (long long)total_checks,
               (long long)total_fails, total_fails ? "FAIL" : "PASS");
    fflush(stdout);
    OK(mr_ep_finalize());
    return total_fails ? 1 : 0;
}
