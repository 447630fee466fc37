/* test_moe_seam.c — the MoE context and the layer's transport seam, on
 * small problems:
 *  - the context's life cycle for every registered runner: creation under
 *    every allocation failure (fault injection: each failure returns
 *    MR_ENOMEM and leaks nothing, which the ASan build checks), refusals
 *    (uncalibrated w4a4) and a successful run after them;
 *  - expert parallelism through the mr_a2a seam: a loopback transport (R
 *    peers in one process, one thread each, pthread barriers standing in for
 *    the collectives, rows copied between the peers' buffers as an
 *    all-to-all would) with each peer holding only its own experts and
 *    being the origin of its own slice of the tokens; every token's output
 *    must equal the one-process (`none`) output bit for bit, for uneven
 *    placements (8 experts on 3 peers), a peer no row is routed to and a
 *    peer with no token of its own (T = 0 still takes part). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moerun/moe.h"
#include "testutil.h"

enum { E = 8, K = 2, H = 128, I = 128, T = 5 };

static mr_moe_weights *make_weights(mr_format fmt, uint64_t seed) {
    mr_moe_weights *w;
    assert_int_equal(mr_moe_weights_new(&w, E, H, I, fmt), MR_OK);
    tu_rng r = {seed};
    float *a = malloc(sizeof(float) * H * I), *b = malloc(sizeof(float) * H * I);
    for (int e = 0; e < E; e++) {
        float amax = 0;
        for (int i = 0; i < H * I; i++) a[i] = tu_normal(&r) / sqrtf((float)H), amax = fmaxf(amax, fabsf(a[i]));
        for (int i = 0; i < H * I; i++) b[i] = tu_normal(&r) / sqrtf((float)H), amax = fmaxf(amax, fabsf(b[i]));
        assert_int_equal(mr_qmatrix_quantize(&w->w1[e], fmt, a, I, H, amax), MR_OK);
        assert_int_equal(mr_qmatrix_quantize(&w->w3[e], fmt, b, I, H, amax), MR_OK);
        for (int i = 0; i < H * I; i++) a[i] = tu_normal(&r) / sqrtf((float)I);
        assert_int_equal(mr_qmatrix_quantize(&w->w2[e], fmt, a, H, I, 0.0f), MR_OK);
    }
    free(a);
    free(b);
    return w;
}

static mr_moe_problem problem(mr_format fmt, mr_act_mode mode, mr_routing_id routing) {
    return (mr_moe_problem){.device = MR_DEVICE_CPU, .cpu_flags = mr_cpu()->flags, .weight_format = fmt,
                            .act_mode = mode, .act_dtype = MR_FMT_F32, .routing = routing, .n_experts = E,
                            .top_k = K, .hidden = H, .inter = I, .a2a = MR_A2A_NONE};
}

/* One call on fixed inputs: every output element written and finite. */
static void run_once(mr_moe_ctx *c, const mr_moe_weights *w) {
    float x[T * H], out[T * H], logits[T * E], wts[T * K];
    int32_t ids[T * K];
    tu_rng g = {7};
    for (int i = 0; i < T * H; i++) x[i] = tu_normal(&g);
    for (int i = 0; i < T * E; i++) logits[i] = tu_normal(&g);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) ids[t * K + j] = (t + 3 * j) % E, wts[t * K + j] = 0.5f;
    for (int i = 0; i < T * H; i++) out[i] = NAN;
    mr_routing ro = {.method = MR_ROUTING_RENORMALIZE, .n_experts = E, .top_k = K, .scale = 1.0f};
    mr_moe_args a = {.T = T, .x = x, .out = out, .ids = ids, .weights = wts, .logits = logits, .routing = &ro};
    assert_int_equal(mr_moe_run(c, w, &a), MR_OK);
    for (int i = 0; i < T * H; i++) assert_true(isfinite(out[i]));
}

/* mr_moe_ctx_new with the n-th allocation failing, for every n until it
 * succeeds: each failure is MR_ENOMEM with nothing left behind; the context
 * made at the end runs. */
static void test_ctx_new_fault_injection(void **st) {
    (void)st;
    const mr_format fmts[] = {MR_FMT_BF16, MR_FMT_FP8_BLOCK, MR_FMT_NVFP4};
    const mr_act_mode modes[] = {MR_ACT_W16A16, MR_ACT_W8A8, MR_ACT_W4A8};
    for (int i = 0; i < mr_moe_runner_count(); i++) {
        const mr_moe_runner *r = mr_moe_runner_at(i);
        for (int f = 0; f < 3; f++) {
            mr_moe_problem p = problem(fmts[f], modes[f], MR_ROUTING_RENORMALIZE);
            char why[256];
            assert_true(r->supports(&p, why, sizeof why));
            mr_moe_weights *base = make_weights(fmts[f], 11 + (uint64_t)f);
            int failures = 0;
            for (long n = 0;; n++) {
                mr_moe_weights *w = NULL;
                assert_int_equal(mr_moe_weights_clone(base, &w), MR_OK);
                mr_moe_ctx *c = NULL;
                mr_debug_alloc_fail_after(n);
                mr_status s = mr_moe_ctx_new(r, &p, T, &c);
                if (s == MR_OK) {
                    s = mr_moe_ctx_prepare(c, w);
                    if (s != MR_OK) {
                        mr_moe_ctx_free(c);
                        c = NULL;
                    }
                }
                mr_debug_alloc_fail_after(-1);
                if (s == MR_OK) {
                    assert_non_null(c);
                    run_once(c, w);
                    mr_moe_ctx_free(c);
                    mr_moe_weights_free(w);
                    break;
                }
                if (s != MR_ENOMEM) fail_msg("%s %d: allocation %ld failing gave %s: %s", r->name, f, n,
                                             mr_status_name(s), mr_error_last());
                assert_null(c);
                failures++;
                mr_moe_weights_free(w);
                if (n > 100000) fail_msg("%s: ctx_new never succeeds", r->name);
            }
            assert_true(failures > 3); /* the loop reached the workspace, not only the after-load */
            mr_moe_weights_free(base);
        }
    }
}

/* w4a4 without calibrated input_scale is refused with the values it found,
 * and the context stays usable for a calibrated set. */
static void test_w4a4_uncalibrated_refused(void **st) {
    (void)st;
    for (int i = 0; i < mr_moe_runner_count(); i++) {
        const mr_moe_runner *r = mr_moe_runner_at(i);
        mr_moe_problem p = problem(MR_FMT_NVFP4, MR_ACT_W4A4, MR_ROUTING_RENORMALIZE);
        mr_moe_weights *w = make_weights(MR_FMT_NVFP4, 3);
        for (int e = 0; e < E; e++) w->w1[e].input_scale = w->w3[e].input_scale = 0.25f;
        /* down projections left uncalibrated (input_scale 0) */
        mr_moe_ctx *c = NULL;
        assert_int_equal(mr_moe_ctx_new(r, &p, T, &c), MR_OK);
        assert_int_equal(mr_moe_ctx_prepare(c, w), MR_EINPUT);
        if (!strstr(mr_error_last(), "gate/up 0.25, down 0")) fail_msg("%s: %s", r->name, mr_error_last());
        mr_moe_weights_free(w);
        w = make_weights(MR_FMT_NVFP4, 3);
        for (int e = 0; e < E; e++) w->w1[e].input_scale = w->w3[e].input_scale = w->w2[e].input_scale = 0.25f;
        assert_int_equal(mr_moe_ctx_prepare(c, w), MR_OK);
        run_once(c, w);
        mr_moe_ctx_free(c);
        mr_moe_weights_free(w);
    }
}

/* ---- a loopback transport: R peers of one process, one thread each ---- */
enum { MAXP = 4 };
typedef struct lb_peer {
    int rank, first, n_local;
    int64_t H, cap;
    mr_moe_rowset shape;
    void *plane[MR_MOE_PLANES];
    int32_t offsets[E + 1];
    int32_t *src_peer, *src_row; /* [cap] origin and send index of each received row */
    float *y_recv, *y_send;      /* [cap][H], [max_rows][H] */
    int64_t n_recv;
} lb_peer;

static struct {
    int R;
    pthread_barrier_t bar;
    mr_a2a_xfer *x[MAXP];
    lb_peer *peer[MAXP];
    int64_t rows_moved;
} fab;

static mr_status lb_open(const mr_moe_problem *p, int64_t max_rows, const mr_moe_rowset *shape, void **state) {
    lb_peer *q = calloc(1, sizeof *q);
    q->rank = p->ep_rank;
    mr_moe_problem_local(p, &q->first, &q->n_local);
    q->H = p->hidden;
    q->cap = max_rows * p->ep_size;
    q->shape = *shape;
    for (int i = 0; i < shape->n_planes; i++) q->plane[i] = calloc((size_t)q->cap, shape->plane[i].row_bytes);
    q->src_peer = calloc((size_t)q->cap, 4);
    q->src_row = calloc((size_t)q->cap, 4);
    q->y_recv = calloc((size_t)(q->cap * q->H), 4);
    q->y_send = calloc((size_t)(max_rows * q->H), 4);
    fab.peer[q->rank] = q;
    *state = q;
    return MR_OK;
}

static void lb_close(void *state) {
    lb_peer *q = state;
    for (int i = 0; i < q->shape.n_planes; i++) free(q->plane[i]);
    free(q->src_peer), free(q->src_row), free(q->y_recv), free(q->y_send), free(q);
}

/* every origin's rows for my experts, grouped by my local expert, origins in order */
static mr_status lb_dispatch(void *state, mr_a2a_xfer *x) {
    lb_peer *me = state;
    fab.x[me->rank] = x;
    pthread_barrier_wait(&fab.bar);
    int64_t n = 0;
    for (int e = 0; e < me->n_local; e++) {
        me->offsets[e] = (int32_t)n;
        for (int q = 0; q < fab.R; q++) {
            const mr_a2a_xfer *o = fab.x[q];
            assert_int_equal(o->n_peers, fab.R);
            int64_t start = 0;
            for (int r = 0; r < me->rank; r++) start += o->send_counts[r];
            for (int64_t i = start; i < start + o->send_counts[me->rank]; i++) {
                if (o->send_expert[i] != me->first + e) continue;
                for (int pl = 0; pl < o->send.n_planes; pl++)
                    memcpy((char *)me->plane[pl] + (size_t)n * me->shape.plane[pl].row_bytes,
                           (const char *)o->send.plane[pl].base + (size_t)i * o->send.plane[pl].row_bytes,
                           o->send.plane[pl].row_bytes);
                me->src_peer[n] = q;
                me->src_row[n] = (int32_t)i;
                n++;
            }
        }
    }
    me->offsets[me->n_local] = (int32_t)n;
    me->n_recv = n;
    __atomic_fetch_add(&fab.rows_moved, n, __ATOMIC_RELAXED);
    x->recv = me->shape;
    x->recv.n = n;
    for (int pl = 0; pl < me->shape.n_planes; pl++) x->recv.plane[pl].base = me->plane[pl];
    x->recv_offsets = me->offsets;
    x->y_recv = me->y_recv;
    pthread_barrier_wait(&fab.bar);
    return MR_OK;
}

/* each origin pulls its rows' results from the peers that computed them */
static mr_status lb_combine(void *state, mr_a2a_xfer *x) {
    lb_peer *me = state;
    pthread_barrier_wait(&fab.bar); /* every peer's experts are done */
    for (int p = 0; p < fab.R; p++) {
        const lb_peer *q = fab.peer[p];
        for (int64_t j = 0; j < q->n_recv; j++)
            if (q->src_peer[j] == me->rank)
                memcpy(me->y_send + (size_t)q->src_row[j] * (size_t)me->H, q->y_recv + (size_t)j * (size_t)me->H,
                       (size_t)me->H * 4);
    }
    x->y_send = me->y_send;
    pthread_barrier_wait(&fab.bar); /* nobody overwrites a result row still being read */
    return MR_OK;
}

static const mr_a2a_ops lb_ops = {.id = MR_A2A_MPI, .name = "loopback", .open = lb_open, .close = lb_close,
                                  .dispatch = lb_dispatch, .combine = lb_combine, .gather = NULL};

/* The experts [first, first + n) of full, as a peer would load them (the
 * layer's w4a4 scales are the max over all its experts). */
static mr_moe_weights *subset(const mr_moe_weights *full, int first, int n) {
    mr_moe_weights *c, *w;
    assert_int_equal(mr_moe_weights_clone(full, &c), MR_OK);
    assert_int_equal(mr_moe_weights_new(&w, n, full->hidden, full->inter, full->fmt), MR_OK);
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

typedef struct {
    mr_moe_ctx *c;
    mr_moe_weights *w;
    mr_moe_args a;
    mr_status st;
} peer_job;

static void *peer_main(void *arg) {
    peer_job *j = arg;
    for (int rep = 0; rep < 2 && j->st == MR_OK; rep++) j->st = mr_moe_run(j->c, j->w, &j->a); /* twice: buffers reused */
    return NULL;
}

/* First token of peer q's slice (q = R: T); with empty_origin, peer 0 has none. */
static int slice_start(int q, int R, bool empty_origin) {
    if (!empty_origin) return q * T / R;
    return q == 0 ? 0 : (q - 1) * T / (R - 1);
}

/* One EP layer call on R loopback peers against the one-process run. */
static void ep_case(mr_format fmt, mr_act_mode mode, int R, bool idle_peer, bool empty_origin) {
    const mr_moe_runner *r = mr_moe_runner_get(MR_RUNNER_ROUTED);
    mr_moe_weights *full = make_weights(fmt, 21);
    float x[T * H], wts[T * K], out1[T * H], outp[MAXP][T * H];
    int32_t ids[T * K];
    tu_rng g = {5};
    for (int i = 0; i < T * H; i++) x[i] = tu_normal(&g);
    if (mode == MR_ACT_W4A4) assert_int_equal(mr_moe_weights_calibrate(full, x, T), MR_OK);
    int f0, n0;
    mr_moe_placement_contiguous(E, R, 0, &f0, &n0);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            /* distinct experts per token; with idle_peer every choice lands on peer 0's experts */
            ids[t * K + j] = idle_peer ? (t + j) % n0 : (t * 3 + j * 5) % E;
            wts[t * K + j] = 0.25f + 0.5f * tu_uniform(&g);
        }
    /* one process */
    mr_moe_problem p = problem(fmt, mode, MR_ROUTING_RENORMALIZE);
    mr_moe_weights *w1 = NULL;
    assert_int_equal(mr_moe_weights_clone(full, &w1), MR_OK);
    mr_moe_ctx *c1 = NULL;
    assert_int_equal(mr_moe_ctx_new(r, &p, T, &c1), MR_OK);
    assert_int_equal(mr_moe_ctx_prepare(c1, w1), MR_OK);
    mr_moe_args a = {.T = T, .x = x, .out = out1, .ids = ids, .weights = wts};
    assert_int_equal(mr_moe_run(c1, w1, &a), MR_OK);
    /* R peers, each with its own experts only */
    const mr_a2a_ops *old = mr_a2a_debug_set(MR_A2A_MPI, &lb_ops);
    memset(&fab, 0, sizeof fab);
    fab.R = R;
    pthread_barrier_init(&fab.bar, NULL, (unsigned)R);
    peer_job job[MAXP];
    pthread_t th[MAXP];
    for (int q = 0; q < R; q++) {
        mr_moe_problem pq = p;
        pq.a2a = MR_A2A_MPI;
        pq.ep_size = R;
        pq.ep_rank = q;
        mr_moe_placement_contiguous(E, R, q, &pq.local_first, &pq.n_local);
        for (int e = pq.local_first; e < pq.local_first + pq.n_local; e++)
            assert_int_equal(mr_moe_placement_owner(E, R, e), q);
        job[q] = (peer_job){.w = subset(full, pq.local_first, pq.n_local), .st = MR_OK};
        assert_int_equal(mr_moe_ctx_new(r, &pq, T, &job[q].c), MR_OK);
        assert_int_equal(mr_moe_ctx_prepare(job[q].c, job[q].w), MR_OK);
        /* each peer is the origin of its own slice of the tokens (data-parallel attention): the
         * experts see, per expert, exactly the rows one process sees */
        const int t0 = slice_start(q, R, empty_origin), t1 = slice_start(q + 1, R, empty_origin);
        job[q].a = (mr_moe_args){.T = t1 - t0, .x = x + t0 * H, .out = outp[q] + t0 * H, .ids = ids + t0 * K,
                                 .weights = wts + t0 * K};
    }
    for (int q = 0; q < R; q++) pthread_create(&th[q], NULL, peer_main, &job[q]);
    for (int q = 0; q < R; q++) pthread_join(th[q], NULL);
    /* every row reached exactly one peer, once per call (two calls) */
    assert_int_equal(fab.rows_moved, 2 * T * K);
    for (int q = 0; q < R; q++) {
        assert_int_equal(job[q].st, MR_OK);
        const int t0 = slice_start(q, R, empty_origin), t1 = slice_start(q + 1, R, empty_origin);
        if (empty_origin && q == 0) assert_int_equal(t1 - t0, 0);
        for (int i = t0 * H; i < t1 * H; i++)
            if (memcmp(&outp[q][i], &out1[i], 4) != 0)
                fail_msg("%s R=%d%s%s: peer %d element %d: %.9g, one process %.9g", mr_act_mode_name(mode), R,
                         idle_peer ? " (idle peer)" : "", empty_origin ? " (empty origin)" : "", q, i, outp[q][i],
                         out1[i]);
        if (idle_peer && q > 0) assert_int_equal(fab.peer[q]->n_recv, 0);
        mr_moe_ctx_free(job[q].c);
        mr_moe_weights_free(job[q].w);
    }
    pthread_barrier_destroy(&fab.bar);
    mr_a2a_debug_set(MR_A2A_MPI, old);
    mr_moe_ctx_free(c1);
    mr_moe_weights_free(w1);
    mr_moe_weights_free(full);
}

static void test_ep_loopback_bit_exact(void **st) {
    (void)st;
    const struct {
        mr_format fmt;
        mr_act_mode mode;
    } modes[] = {{MR_FMT_FP8_BLOCK, MR_ACT_W8A8}, {MR_FMT_NVFP4, MR_ACT_W4A4}, {MR_FMT_NVFP4, MR_ACT_W4A8},
                 {MR_FMT_BF16, MR_ACT_W16A16}};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        ep_case(modes[m].fmt, modes[m].mode, 2, false, false);
        ep_case(modes[m].fmt, modes[m].mode, 3, false, false); /* 8 experts on 3 peers: 3, 3, 2 */
        ep_case(modes[m].fmt, modes[m].mode, 2, true, false);  /* peer 1 receives no row */
        ep_case(modes[m].fmt, modes[m].mode, 4, false, true);  /* peer 0 is the origin of no token */
    }
}

/* Placement: contiguous ranges, the first E mod R peers one expert more,
 * covering [0, E) once; the owner of each expert agrees. */
static void test_placement(void **st) {
    (void)st;
    for (int Ex = 1; Ex <= 20; Ex++)
        for (int R = 1; R <= 7; R++) {
            int next = 0;
            for (int q = 0; q < R; q++) {
                int f, n;
                mr_moe_placement_contiguous(Ex, R, q, &f, &n);
                assert_int_equal(f, next);
                assert_int_equal(n, Ex / R + (q < Ex % R ? 1 : 0));
                for (int e = f; e < f + n; e++) assert_int_equal(mr_moe_placement_owner(Ex, R, e), q);
                next = f + n;
            }
            assert_int_equal(next, Ex);
        }
    /* a context refuses a range that does not fit, and `none` refuses peers */
    mr_moe_problem p = problem(MR_FMT_BF16, MR_ACT_W16A16, MR_ROUTING_RENORMALIZE);
    mr_moe_ctx *c = NULL;
    p.local_first = 6, p.n_local = 4;
    assert_int_equal(mr_moe_ctx_new(mr_moe_runner_get(MR_RUNNER_ROUTED), &p, T, &c), MR_EINVAL);
    p.local_first = 0, p.n_local = 0, p.ep_size = 2;
    assert_int_equal(mr_moe_ctx_new(mr_moe_runner_get(MR_RUNNER_ROUTED), &p, T, &c), MR_EINVAL);
    assert_non_null(strstr(mr_error_last(), "none runs one process"));
    assert_null(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ctx_new_fault_injection),
        cmocka_unit_test(test_w4a4_uncalibrated_refused),
        cmocka_unit_test(test_placement),
        cmocka_unit_test(test_ep_loopback_bit_exact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
