/* bench_moe.c — `moerun bench moe`: times one synthetic MoE layer (seeded
 * random weights in the chosen format, MiniMax-M2 shapes by default) and
 * prints each result against ceilings measured in the same run: the
 * multi-threaded read bandwidth (1 GiB probe, pre-faulted, best of 5) and the
 * peak of the instruction the kernel's inner loop uses (vdpbf16ps, vpdpbusd
 * or vfmadd231ps, 12 chains). Routing is re-drawn every iteration so that the
 * expert weights come from DRAM; all buffers are pre-faulted (a warm-up call)
 * before timing. It ends with the project's targets as ratios: T = 1 and
 * T = 8/32 effective bandwidth (unique experts touched), T >= 512 peak
 * ratio, 2-vs-1 thread scaling at T >= 32 (--scaling), and the peak RSS
 * against weights + activations + workspace. --phases prints the packed
 * path's per-phase profile; --isolate interleaves probe / call / stream-only
 * call (kernels replaced by a pure read of the same tiles) and prints the
 * medians of their ratios. */
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "cli.h"
#include "moerun/config.h"
#include "moerun/kernels.h"
#include "moerun/moe.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: moerun bench moe [options]\n"
            "  --runner NAME       routed (default), fused or reference\n"
            "  --format F          bf16 | fp8 (default) | nvfp4\n"
            "  --act-mode M        activation mode (default: the format's default: w16a32, w8a8, w4a4)\n"
            "  --tokens LIST       comma list of T (default 1,8,32,128,512)\n"
            "  --experts E --hidden H --inter I --topk K   (default 256, 3072, 1536, 8)\n"
            "  --threads N         OpenMP threads (default: all)\n"
            "  --routing R         uniform (default) | skewed (80%% of picks from 32 hot experts)\n"
            "  --iters N           timed iterations per T (default 10)\n"
            "  --seed S            weight/routing seed (default 1)\n"
            "  --json FILE         also write the results as JSON\n"
            "  --scaling           also time each T in 32..512 with 1 thread: the N-vs-1 thread ratio\n"
            "  --quick             tokens 1,32,512, 3 iterations (< 2 minutes)\n"
            "  --phases            print the packed path's per-phase time per call (wall, and busy\n"
            "                      share of the threads) after each T\n"
            "  --isolate           after each T, iters rounds of: the read probe (as many bytes as a call\n"
            "                      touches, from a 1 GiB buffer), one call, one\n"
            "                      stream-only call; prints the medians of the per-round ratios\n"
            "  --stream-only       isolation: replace the micro-kernels by a pure read of the same\n"
            "                      tiles (outputs meaningless): the layer's memory-side limit\n"
            "  --moe-a2a-backend mpi   under mpirun -np R: the layer expert-parallel over the R ranks (each\n"
            "                      holds its experts; replicated tokens, as the model runs), interleaved\n"
            "                      with one process of R x threads on rank 0: step times, dispatch / combine\n"
            "                      bytes and times beside MPI_Alltoallv alone on the same messages, rows\n"
            "                      per rank, each rank's RSS (--threads is per rank)\n"
            "  --no-single         with mpi: skip the one-process comparison (rank 0 then holds its\n"
            "                      experts only)\n"
            "  --enable-deterministic-inference   the batch-invariant kernels (as serve's flag)\n");
}

/* The options, and what they resolve to */
typedef struct {
    const char *runner_name, *fmt_name, *mode_name, *tokens, *json_path;
    int E, k, threads, iters;
    int64_t H, I;
    uint64_t seed;
    bool skewed, quick, scaling, phases, stream_only, isolate, ep, no_single;
    const mr_moe_runner *run;
    mr_format fmt;
    mr_act_mode mode;
    int64_t Ts[MR_BENCH_MAX_TS], maxT;
    int nT;
} moe_opts;

/* The ceilings of this run: at the start, and again after the timed calls */
typedef struct {
    double bw, peak;         /* read GB/s (all threads), G(FL)OP/s of the kernel's instruction */
    double bw1;              /* read GB/s with 1 thread (--scaling), 0 if not read */
    double bw_end, peak_end; /* after the timed calls */
    const char *instr;
    mr_probe_instr pi;
    int nthr;
} ceilings;

/* What the targets compare, < 0 when not measured: absolute rates during the
 * run, ratios against the ceilings once the run ends */
typedef struct {
    double t1_bw, t8_bw, t32_bw, pf_peak, scale_min;
} targets;

/* The timing of one T */
typedef struct {
    double med, mn, mx, mean_bytes, gbs;
    mr_moe_profile prof; /* of the timed calls */
} timing;

/* The caller's buffers of the layer, for maxT tokens */
typedef struct {
    float *x, *out, *wts, *logits; /* [maxT][H], [maxT][H], [maxT][k], [maxT][E] (logits: runners that route) */
    int32_t *ids;                  /* [maxT][k] */
    double *ms;                    /* [iters] */
    unsigned char *used;           /* [E] */
    uint64_t *iso_buf;             /* --isolate: the 1 GiB probe buffer */
    double *iso;                   /* --isolate: [4][iters] per-round ratios */
} moe_bufs;

static const size_t ISO_BYTES = (size_t)1 << 30;

/* Parses and checks the options into o and the problem into p: -1 to go on, else the exit status. */
static int parse_opts(int argc, char **argv, moe_opts *o, mr_moe_problem *p) {
    *o = (moe_opts){.runner_name = "routed", .fmt_name = "fp8", .tokens = "1,8,32,128,512", .E = 256, .k = 8,
                    .iters = 10, .H = 3072, .I = 1536, .seed = 1};
    int bad = 0;
    long lv = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(name) (!strcmp(a, name) && v && ++i)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--quick")) o->quick = true;
        else if (!strcmp(a, "--scaling")) o->scaling = true;
        else if (!strcmp(a, "--phases")) o->phases = true;
        else if (!strcmp(a, "--stream-only")) o->stream_only = true;
        else if (!strcmp(a, "--isolate")) o->isolate = true;
        else if (!strcmp(a, "--no-single")) o->no_single = true;
        else if (!strcmp(a, "--enable-deterministic-inference")) mr_kernels_set_batch_invariant(true);
        else if (OPT("--moe-a2a-backend")) {
            if (!strcmp(v, "mpi")) o->ep = true;
            else if (strcmp(v, "none")) {
                fprintf(stderr, "moerun bench moe: --moe-a2a-backend is none or mpi\n");
                return 2;
            }
        }
        else if (OPT("--runner")) o->runner_name = v;
        else if (OPT("--format")) o->fmt_name = v;
        else if (OPT("--act-mode")) o->mode_name = v;
        else if (OPT("--tokens")) o->tokens = v;
        else if (OPT("--threads")) bad = mr_bench_num(a, v, 1, 1024, &lv), o->threads = (int)lv;
        else if (OPT("--iters")) bad = mr_bench_num(a, v, 1, 100000, &lv), o->iters = (int)lv;
        else if (OPT("--experts")) bad = mr_bench_num(a, v, 1, 4096, &lv), o->E = (int)lv;
        else if (OPT("--topk")) bad = mr_bench_num(a, v, 1, 4096, &lv), o->k = (int)lv;
        else if (OPT("--hidden")) bad = mr_bench_num(a, v, 1, 65536, &lv), o->H = lv;
        else if (OPT("--inter")) bad = mr_bench_num(a, v, 1, 65536, &lv), o->I = lv;
        else if (OPT("--seed")) bad = mr_bench_num(a, v, 0, 0x7fffffffL, &lv), o->seed = (uint64_t)lv;
        else if (OPT("--json")) o->json_path = v;
        else if (OPT("--routing")) {
            if (!strcmp(v, "skewed")) o->skewed = true;
            else if (strcmp(v, "uniform")) {
                fprintf(stderr, "moerun bench moe: --routing is uniform or skewed\n");
                return 2;
            }
        } else {
            fprintf(stderr, "moerun bench moe: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
#undef OPT
        if (bad) return 2;
    }
    if (o->quick) o->tokens = "1,32,512", o->iters = 3;
    if (o->k > o->E) {
        fprintf(stderr, "moerun bench moe: --topk %d is more than --experts %d\n", o->k, o->E);
        return 2;
    }
    if (o->threads > 0) omp_set_num_threads(o->threads);
    o->run = mr_moe_runner_find(o->runner_name);
    if (!o->run) {
        fprintf(stderr, "moerun bench moe: unknown runner '%s' (", o->runner_name);
        for (int i = 0; i < mr_moe_runner_count(); i++)
            fprintf(stderr, "%s%s", i ? ", " : "", mr_moe_runner_at(i)->name);
        fprintf(stderr, ")\n");
        return 2;
    }
    if (mr_format_from_name(o->fmt_name, &o->fmt) ||
        (o->fmt != MR_FMT_BF16 && o->fmt != MR_FMT_FP8_BLOCK && o->fmt != MR_FMT_NVFP4)) {
        fprintf(stderr, "moerun bench moe: --format is bf16, fp8 or nvfp4\n");
        return 2;
    }
    o->mode = mr_act_mode_default(o->fmt);
    if (o->mode_name && mr_act_mode_from_name(o->mode_name, &o->mode)) {
        mr_cli_fail("bench moe", "bad --act-mode");
        return 2;
    }
    if (mr_bench_parse_tokens(o->tokens, 65536, o->Ts, &o->nT)) {
        fprintf(stderr, "moerun bench moe: bad --tokens list '%s' (at most %d comma-separated T in 1..65536)\n",
                o->tokens, MR_BENCH_MAX_TS);
        return 2;
    }
    for (int i = 0; i < o->nT; i++) o->maxT = o->Ts[i] > o->maxT ? o->Ts[i] : o->maxT;
    *p = (mr_moe_problem){.device = MR_DEVICE_CPU, .cpu_flags = mr_cpu()->flags, .weight_format = o->fmt,
                          .act_mode = o->mode, .act_dtype = MR_FMT_F32,
                          .routing = o->run->routes_itself ? MR_ROUTING_RENORMALIZE : MR_ROUTING_MINIMAX2,
                          .n_experts = o->E, .top_k = o->k, .hidden = o->H, .inter = o->I, .a2a = MR_A2A_NONE};
    if (o->ep) {
        p->a2a = MR_A2A_MPI;
        p->ep_size = mr_ep_size();
        p->ep_rank = mr_ep_rank();
        mr_moe_placement_contiguous(o->E, p->ep_size, p->ep_rank, &p->local_first, &p->n_local);
        if (!mr_ep_active()) {
            fprintf(stderr, "moerun bench moe: --moe-a2a-backend mpi: %s\n",
                    mr_ep_built() ? "the expert-parallel group did not start" : "this build has no MPI");
            return 2;
        }
        if (o->E < p->ep_size) {
            fprintf(stderr, "moerun bench moe: %d experts over %d ranks: every rank needs one\n", o->E, p->ep_size);
            return 2;
        }
        if (o->isolate || o->stream_only || o->scaling) {
            fprintf(stderr, "moerun bench moe: --isolate, --stream-only and --scaling time one process; not with mpi\n");
            return 2;
        }
    }
    char why[512];
    if (!o->run->supports(p, why, sizeof why) || (o->ep && !mr_a2a_pair_supported(p->a2a, o->run, why, sizeof why))) {
        /* one line in one write: under mpirun every rank prints it, and mpirun interleaves writes */
        char alt[256] = "";
        if (o->ep) { /* the alternatives, from the pair registry */
            size_t u = (size_t)snprintf(alt, sizeof alt, " Runners that can:");
            for (int i = 0, n = 0; i < mr_moe_runner_count() && u < sizeof alt; i++)
                if (mr_a2a_pair_supported(p->a2a, mr_moe_runner_at(i), NULL, 0))
                    u += (size_t)snprintf(alt + u, sizeof alt - u, "%s %s", n++ ? "," : "", mr_moe_runner_at(i)->name);
            if (u < sizeof alt) snprintf(alt + u, sizeof alt - u, ".");
        }
        fprintf(stderr, "moerun bench moe: %s%s\n", why, alt);
        return 2;
    }
    if (o->json_path && mr_bench_json_check(o->json_path)) { /* fail now, not after minutes of timing */
        fprintf(stderr, "moerun bench moe: cannot write --json %s\n", o->json_path);
        return 1;
    }
    return -1;
}

/* Fills a matrix with random codes directly (no fp32 detour): values of
 * magnitude ~1/sqrt(cols) so the layer stays finite. */
static mr_status synth_matrix(mr_qmatrix *m, mr_format fmt, int64_t rows, int64_t cols, uint64_t *s) {
    mr_status st = mr_qmatrix_alloc(m, fmt, rows, cols); /* buffers sized by the formats traits */
    if (st) return st;
    size_t nd = 0, ns = 0;
    mr_qmatrix_sizes(fmt, rows, cols, &nd, &ns);
    uint64_t *d = m->data;
    size_t nw = nd / 8;
    if (fmt == MR_FMT_BF16) {
        for (size_t i = 0; i < nw; i++) /* sign + exponent 2^-8..2^-5 + random mantissa */
            d[i] = (mr_bench_rng(s) & 0x807F807F807F807Full) | 0x3B803B803B803B80ull;
    } else if (fmt == MR_FMT_FP8_BLOCK) {
        mr_bench_fp8_codes((uint8_t *)d, nw * 8, s);
        float *sc = m->scale;
        for (size_t i = 0; i < ns / sizeof(float); i++) sc[i] = 1.0f / (MR_BENCH_FP8_SIGMA * sqrtf((float)cols));
    } else {
        for (size_t i = 0; i < nw; i++) d[i] = mr_bench_rng(s);
        uint8_t *sc = m->scale;
        for (size_t i = 0; i < ns; i++) sc[i] = (uint8_t)(0x30 + (mr_bench_rng(s) & 7)); /* e4m3 ~0.5..0.9 */
        m->scale2 = 1.0f / (6.0f * sqrtf((float)cols));
        m->input_scale = 4.0f / 2688.0f;
    }
    return MR_OK;
}

/* n experts from global id first of a layer's seeded synthetic weights into *w (freed by the
 * caller, also on failure): each expert from its own stream, so that a rank holding some of
 * them makes the same ones as a process holding all */
mr_status mr_bench_moe_weights(mr_format fmt, int first, int n, int64_t H, int64_t I, uint64_t seed,
                               mr_moe_weights **w) {
    mr_status st = mr_moe_weights_new(w, n, H, I, fmt);
    if (!st) (*w)->expert_first = first;
    for (int i = 0; !st && i < n; i++) {
        uint64_t s = seed * 0x9E3779B97F4A7C15ull + (uint64_t)(first + i) * 0xD1B54A32D192ED03ull + 1;
        st = synth_matrix(&(*w)->w1[i], fmt, I, H, &s);
        if (!st) st = synth_matrix(&(*w)->w3[i], fmt, I, H, &s);
        if (!st) (*w)->w3[i].scale2 = (*w)->w1[i].scale2;
        if (!st) st = synth_matrix(&(*w)->w2[i], fmt, H, I, &s);
        if (!st && fmt == MR_FMT_NVFP4) (*w)->w2[i].input_scale = 1.0f / 2688.0f;
    }
    return st;
}

/* k distinct experts per token; skewed: 80% of picks among the first 32 */
void mr_bench_moe_routing(uint64_t *s, bool skewed, int64_t T, int E, int k, int32_t *ids, float *w, float *logits) {
    for (int64_t t = 0; t < T; t++) {
        for (int j = 0; j < k; j++) {
            int32_t e;
            bool dup;
            do {
                uint64_t r = mr_bench_rng(s);
                e = (skewed && (r >> 40) % 10 < 8 && E > 32) ? (int32_t)(r % 32) : (int32_t)(r % (uint64_t)E);
                dup = false;
                for (int q = 0; q < j; q++) dup |= ids[t * k + q] == e;
            } while (dup);
            ids[t * k + j] = e;
            w[t * k + j] = 1.0f / (float)k;
        }
        if (logits) { /* logits whose top-k are exactly these ids */
            for (int e = 0; e < E; e++) logits[t * E + e] = -4.0f - (float)(mr_bench_rng(s) % 1000) * 1e-3f;
            for (int j = 0; j < k; j++) logits[t * E + ids[t * k + j]] = 4.0f - (float)j * 0.01f;
        }
    }
}

static void print_phases(const mr_moe_profile *p) {
    static const char *nm[MR_MOE_NPH] = {"route", "prep x", "gemm1", "gemm2", "finalize", "a2a"};
    if (p->calls < 1) return;
    printf("%6s phases per call (ms wall / threads busy%%):", "");
    for (int i = 0; i < MR_MOE_NPH; i++) {
        double w = (double)p->wall_ns[i] / (double)p->calls / 1e6;
        double b = p->wall_ns[i] ? (double)p->busy_ns[i] / ((double)p->wall_ns[i] * p->n_threads) : 0.0;
        printf(" %s %.3f/%.0f%%", nm[i], w, 100.0 * b);
    }
    printf("\n");
}

/* iters timed calls at T tokens, routing re-drawn before each */
static mr_status time_calls(mr_moe_ctx *ctx, const mr_moe_weights *w, mr_moe_args *a, uint64_t *s, bool skewed, int E, int k, int iters,
                            size_t expert_bytes, unsigned char *used, double *ms, timing *out) {
    const int64_t T = a->T;
    mr_bench_moe_routing(s, skewed, T, E, k, (int32_t *)a->ids, (float *)a->weights, (float *)a->logits);
    mr_status st = mr_moe_run(ctx, w, a); /* warm-up: pre-faults the workspace */
    if (st) return st;
    double bytes_sum = 0, sum_ms = 0;
    for (int it = 0; it < iters; it++) {
        mr_bench_moe_routing(s, skewed, T, E, k, (int32_t *)a->ids, (float *)a->weights, (float *)a->logits);
        memset(used, 0, (size_t)E);
        int nu = 0;
        for (int64_t i = 0; i < T * k; i++) nu += !used[a->ids[i]], used[a->ids[i]] = 1;
        bytes_sum += (double)nu * (double)expert_bytes;
        uint64_t a0 = mr_now_ns();
        if (it == 0) mr_moe_ctx_profile(ctx, NULL, true);
        st = mr_moe_run(ctx, w, a);
        ms[it] = (double)(mr_now_ns() - a0) / 1e6;
        if (st) return st;
        sum_ms += ms[it];
    }
    qsort(ms, (size_t)iters, sizeof(double), mr_bench_cmp_double);
    mr_moe_ctx_profile(ctx, &out->prof, true);
    out->med = iters % 2 ? ms[iters / 2] : 0.5 * (ms[iters / 2 - 1] + ms[iters / 2]);
    out->mn = ms[0];
    out->mx = ms[iters - 1];
    out->mean_bytes = bytes_sum / iters;
    out->gbs = bytes_sum / (sum_ms * 1e6); /* bytes over the same calls' time */
    return MR_OK;
}

/* Reads the starting ceilings and prints the header lines. */
static void read_ceilings(const moe_opts *o, const mr_moe_problem *p, ceilings *c) {
    /* ceilings first (they need the memory the weights will take later) */
    c->bw = mr_probe_read_bw((size_t)1 << 30, 5);
    c->pi = mr_moe_runner_instr(o->run, p); /* the runner says which instruction its inner loop runs */
    c->peak = mr_probe_peak(c->pi, &c->instr);
    c->nthr = omp_get_max_threads();
    /* --scaling: the 1-thread read bandwidth bounds what N threads can gain on a call that is
     * bandwidth-bound (decode): at most bw / bw1 */
    c->bw1 = 0;
    if (o->scaling && c->nthr > 1) {
        omp_set_num_threads(1);
        c->bw1 = mr_probe_read_bw((size_t)1 << 30, 5);
        omp_set_num_threads(c->nthr);
    }
    /* the probe's 1 GiB is freed: restart the peak-RSS count (VmHWM) from here */
    mr_bench_peak_rss_reset();
    printf("moerun bench moe: runner %s, format %s, act-mode %s, E %d H %lld I %lld k %d, %d threads, routing %s\n",
           o->run->name, o->fmt_name, mr_act_mode_name(o->mode), o->E, (long long)o->H, (long long)o->I, o->k, c->nthr,
           o->skewed ? "skewed" : "uniform");
    printf("cpu: %s; kernels: %s\n", mr_cpu()->brand, mr_kernels_get()->isa);
    if (c->bw1 > 0)
        printf("read bandwidth with 1 thread: %.1f GB/s, so a bandwidth-bound call gains at most %.2fx from %d threads\n",
               c->bw1, c->bw / c->bw1, c->nthr);
    printf("ceilings (this run): read bandwidth %.1f GB/s (1 GiB, %d threads); peak of the kernel's instruction %s: %.0f G%s/s\n",
           c->bw, c->nthr, c->instr, c->peak, mr_probe_instr_is_int(c->pi) ? "OP" : "FLOP");
}

static void bufs_free(moe_bufs *b) {
    free(b->x), free(b->out), free(b->ids), free(b->wts), free(b->logits), free(b->ms), free(b->used), free(b->iso);
    mr_aligned_free(b->iso_buf);
}

/* The caller's buffers for maxT tokens: 0, or 1 out of memory (b is to be freed either way). */
static int bufs_new(const moe_opts *o, moe_bufs *b) {
    const int64_t maxT = o->maxT;
    *b = (moe_bufs){0};
    b->x = malloc(sizeof(float) * (size_t)(maxT * o->H));
    b->out = malloc(sizeof(float) * (size_t)(maxT * o->H));
    b->ids = malloc(sizeof(int32_t) * (size_t)(maxT * o->k));
    b->wts = malloc(sizeof(float) * (size_t)(maxT * o->k));
    b->logits = o->run->routes_itself ? malloc(sizeof(float) * (size_t)(maxT * o->E)) : NULL;
    b->ms = malloc(sizeof(double) * (size_t)o->iters);
    b->used = malloc((size_t)o->E);
    b->iso_buf = o->isolate ? mr_probe_buf_new(ISO_BYTES) : NULL;
    b->iso = o->isolate ? malloc(sizeof(double) * 4 * (size_t)o->iters) : NULL;
    return !b->x || !b->out || !b->ids || !b->wts || (o->run->routes_itself && !b->logits) || !b->ms || !b->used ||
           (o->isolate && (!b->iso_buf || !b->iso));
}

/* --isolate at one T: iters rounds of probe / call / stream-only call, their
 * medians printed and added to jr. 0, or 1 if a call failed. */
static int isolate_rounds(const moe_opts *o, const ceilings *c, mr_moe_ctx *ctx, const mr_moe_weights *w, mr_moe_args *a, uint64_t *s,
                          size_t expert_bytes, const timing *tm, moe_bufs *b, json_t *jr) {
    const int iters = o->iters;
    /* rounds of probe / call / stream-only call: ratios within a round share the host's mood */
    double *rp = b->iso, *sp = b->iso + iters, *rs = b->iso + 2 * iters, *cp = b->iso + 3 * iters;
    /* the probe reads as many bytes as a call touches (a rotating window of the 1 GiB
     * buffer), so that the three measurements of a round span similar times */
    size_t pbytes = (size_t)tm->mean_bytes / ((size_t)2 << 20) * ((size_t)2 << 20);
    if (pbytes < ((size_t)32 << 20)) pbytes = (size_t)32 << 20;
    if (pbytes > ISO_BYTES) pbytes = ISO_BYTES;
    size_t poff = 0;
    int rc = 0;
    for (int it = 0; it < iters && !rc; it++) {
        if (poff + pbytes > ISO_BYTES) poff = 0;
        double pb = mr_probe_read_once(b->iso_buf + poff / 8, pbytes);
        poff += pbytes;
        timing r1, r2;
        mr_status s1 = time_calls(ctx, w, a, s, o->skewed, o->E, o->k, 1, expert_bytes, b->used, b->ms, &r1);
        mr_moe_ctx_debug_stream_only(ctx, true);
        mr_status s2 = time_calls(ctx, w, a, s, o->skewed, o->E, o->k, 1, expert_bytes, b->used, b->ms, &r2);
        mr_moe_ctx_debug_stream_only(ctx, o->stream_only);
        if (s1 || s2) rc = 1;
        rp[it] = r1.gbs / pb, sp[it] = r2.gbs / pb, rs[it] = r1.gbs / r2.gbs;
        /* ~1 ms of the kernel's instruction: the compute the host gives in this round
         * (a busy sibling hyperthread on the host slows the kernels, not a pure read) */
        cp[it] = c->peak > 0 ? mr_probe_peak_once(c->pi, 300000) / c->peak : 0.0;
    }
    if (rc) return 1;
    qsort(rp, (size_t)iters, sizeof(double), mr_bench_cmp_double);
    qsort(sp, (size_t)iters, sizeof(double), mr_bench_cmp_double);
    qsort(rs, (size_t)iters, sizeof(double), mr_bench_cmp_double);
    qsort(cp, (size_t)iters, sizeof(double), mr_bench_cmp_double);
    printf("%6s isolate (medians of %d rounds): kernels/probe %.1f%%, stream-only/probe %.1f%%, kernels/stream-only %.1f%%\n",
           "", iters, 100 * rp[iters / 2], 100 * sp[iters / 2], 100 * rs[iters / 2]);
    printf("%6s   instruction probe in the rounds / at the start: median %.1f%%, lowest %.1f%%\n", "",
           100 * cp[iters / 2], 100 * cp[0]);
    json_object_set_new(jr, "isolate_instr_over_peak", json_real(cp[iters / 2]));
    json_object_set_new(jr, "isolate_kernels_over_probe", json_real(rp[iters / 2]));
    json_object_set_new(jr, "isolate_stream_over_probe", json_real(sp[iters / 2]));
    json_object_set_new(jr, "isolate_kernels_over_stream", json_real(rs[iters / 2]));
    return 0;
}

/* The project's targets as ratios (tg already divided by the ceilings) */
static void print_targets(const moe_opts *o, const ceilings *c, const targets *tg, size_t rss, double need,
                          double rss_ratio) {
    printf("the project's targets (ratios against the higher of this run's two ceiling readings; %s, %s, %d threads):\n",
           o->fmt_name, mr_act_mode_name(o->mode), c->nthr);
    /* issue 6 (AVX-512): 90% for the quantized formats, 85% for bf16; issue 11 (the AVX2 kernels): 85% */
    const bool avx2 = !strcmp(mr_kernels_get()->isa, "avx2");
    const double t1_target = o->fmt == MR_FMT_BF16 || avx2 ? 0.85 : 0.90;
    if (tg->t1_bw >= 0)
        printf("  decode T=1 bandwidth       %5.1f%%  (target >= %.0f%%)%s\n", 100 * tg->t1_bw, 100 * t1_target,
               tg->t1_bw >= t1_target ? "" : "  NOT MET");
    if (tg->t8_bw >= 0)
        printf("  decode T=8 bandwidth       %5.1f%%  (target >= 80%%, unique experts)%s\n", 100 * tg->t8_bw,
               tg->t8_bw >= 0.8 ? "" : "  NOT MET");
    if (tg->t32_bw >= 0)
        printf("  decode T=32 bandwidth      %5.1f%%  (target >= 80%%, unique experts)%s\n", 100 * tg->t32_bw,
               tg->t32_bw >= 0.8 ? "" : "  NOT MET");
    if (tg->pf_peak >= 0)
    {
        printf("  prefill T>=512 of %-14s %5.1f%%  (target >= 60%%)%s\n", c->instr, 100 * tg->pf_peak,
               tg->pf_peak >= 0.6 ? "" : "  NOT MET");
        if (strstr(c->instr, "AMX")) /* bench/README.md "AMX: the FP8 and BF16 expert kernels on tiles" */
            printf("    (AMX: a tile op does 16x16x32 multiply-adds, while at ~16 tokens an expert a decoded weight\n"
                   "     feeds 16: the weights' bytes and decode bound the kernel, see its bw%% at T=512 above)\n");
    }
    if (tg->scale_min >= 0)
        printf("  scaling %d vs 1 thread, T>=32 %5.2fx  (target >= 1.8x)%s\n", c->nthr, tg->scale_min,
               tg->scale_min >= 1.8 ? "" : "  NOT MET");
    if (tg->scale_min >= 0 && c->bw1 > 0)
        printf("    (read bandwidth %d vs 1 thread in this run: %.2fx, the ceiling of a bandwidth-bound T)\n", c->nthr,
               c->bw / c->bw1);
    if (rss) {
        const size_t now = mr_mem_rss(); /* steady: after every timed call */
        printf("  peak RSS %.2f GB / (weights + activations + workspace %.2f GB) = %.3f  (target <= 1.10)%s\n",
               (double)rss / 1e9, need / 1e9, rss_ratio, rss_ratio <= 1.10 ? "" : "  NOT MET");
        printf("  steady RSS %.2f GB / the same = %.3f  (target <= 1.10)%s\n", (double)now / 1e9, (double)now / need,
               (double)now / need <= 1.10 ? "" : "  NOT MET");
    }
}

/* The --json file: 0, or 1 after a message (nothing left behind). */
static int write_json(const moe_opts *o, const ceilings *c, const targets *tg, const mr_moe_weights *w, size_t rss,
                      double rss_ratio, json_t *jres) {
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M", localtime(&now));
    json_t *root = json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:I, s:I, s:i, s:i, s:s, s:i, s:f, s:s, s:f, s:O}", "bench",
                             "moe", "runner", o->run->name, "format", o->fmt_name, "act_mode", mr_act_mode_name(o->mode),
                             "cpu", mr_cpu()->brand, "experts", o->E, "hidden", (json_int_t)o->H, "inter",
                             (json_int_t)o->I, "topk", o->k, "threads", c->nthr, "routing",
                             o->skewed ? "skewed" : "uniform", "iters", o->iters, "read_bw_gb_per_s", c->bw,
                             "peak_instr", c->instr, "peak_gflop_per_s", c->peak, "results", jres);
    if (root) {
        json_object_set_new(root, "date", json_string(date));
        json_object_set_new(root, "kernel_isa", json_string(mr_kernels_get()->isa));
        json_object_set_new(root, "pack", json_string(mr_pack_name((mr_pack_id)w->layout.pack)));
        json_object_set_new(root, "peak_rss_bytes", json_integer((json_int_t)rss));
        json_object_set_new(root, "rss_ratio", json_real(rss_ratio));
        if (tg->scale_min >= 0) json_object_set_new(root, "scaling_min", json_real(tg->scale_min));
        if (c->bw1 > 0) json_object_set_new(root, "read_bw_1thread_gb_per_s", json_real(c->bw1));
        json_object_set_new(root, "read_bw_end_gb_per_s", json_real(c->bw_end));
        json_object_set_new(root, "peak_end_gflop_per_s", json_real(c->peak_end));
        if (tg->t1_bw >= 0) json_object_set_new(root, "target_t1_bw_ratio", json_real(tg->t1_bw));
        if (tg->t8_bw >= 0) json_object_set_new(root, "target_t8_bw_ratio", json_real(tg->t8_bw));
        if (tg->t32_bw >= 0) json_object_set_new(root, "target_t32_bw_ratio", json_real(tg->t32_bw));
        if (tg->pf_peak >= 0) json_object_set_new(root, "target_prefill_peak_ratio", json_real(tg->pf_peak));
    }
    int rc = mr_bench_json_write(root, o->json_path);
    if (rc) fprintf(stderr, "moerun bench moe: cannot write %s\n", o->json_path);
    json_decref(root);
    return rc;
}

int mr_bench_moe(int argc, char **argv) {
    moe_opts o;
    mr_moe_problem p;
    int rc = parse_opts(argc, argv, &o, &p);
    if (rc >= 0) return rc;
    if (o.ep) {
        const mr_bench_moe_ep_opts eo = {.run = o.run, .fmt = o.fmt, .fmt_name = o.fmt_name, .mode = o.mode, .E = o.E,
                                         .k = o.k, .iters = o.iters, .threads = o.threads, .H = o.H, .I = o.I,
                                         .seed = o.seed, .skewed = o.skewed, .no_single = o.no_single, .Ts = o.Ts,
                                         .nT = o.nT, .maxT = o.maxT, .json_path = o.json_path};
        return mr_bench_moe_ep(&eo);
    }
    rc = 0;
    ceilings c;
    read_ceilings(&o, &p, &c);

    uint64_t t0 = mr_now_ns(), s = o.seed;
    mr_moe_weights *w = NULL;
    mr_moe_ctx *ctx = NULL;
    moe_bufs b = {0};
    json_t *jres = NULL;
    mr_status st = mr_bench_moe_weights(o.fmt, 0, o.E, o.H, o.I, o.seed, &w);
    if (!st) st = mr_moe_ctx_new(o.run, &p, o.maxT, &ctx);
    if (!st) st = mr_moe_ctx_prepare(ctx, w);
    if (st) {
        mr_cli_fail("bench moe", "setup failed");
        rc = 1;
        goto out;
    }
    if (o.stream_only) mr_moe_ctx_debug_stream_only(ctx, true);
    const mr_kernels *kt = mr_kernels_get();
    const mr_uk_kind uk = mr_act_mode_uk_kind(o.mode);
    size_t expert_bytes = mr_moe_weights_expert_bytes(w);
    printf("weights: %.2f GB in layout of %s (pack %s, %.1f MB per expert), generated in %.1f s\n",
           (double)expert_bytes * o.E / 1e9, w->layout.owner, mr_pack_name((mr_pack_id)w->layout.pack),
           (double)expert_bytes / 1e6, (double)(mr_now_ns() - t0) / 1e9);
    printf("transparent huge pages in use: %.2f GB (AnonHugePages)\n", (double)mr_bench_anon_huge() / 1e9);
    if (w->layout.pack != MR_PACK_NONE)
        printf("kernels: gemv %s, gemm %s (from %d tokens per expert)\n", kt->uk_gemv[uk].name, kt->uk_gemm[uk].name,
               kt->uk_gemm_min_m);

    jres = json_array();
    if (bufs_new(&o, &b) || !jres) {
        fprintf(stderr, "moerun bench moe: out of memory for %lld tokens\n", (long long)o.maxT);
        rc = 1;
        goto out;
    }
    const int64_t H = o.H;
    for (int64_t i = 0; i < o.maxT * H; i++) b.x[i] = (float)((double)(mr_bench_rng(&s) % 2001) / 1000.0 - 1.0);
    memset(b.out, 0, sizeof(float) * (size_t)(o.maxT * H));
    mr_routing ro = {.method = p.routing, .n_experts = o.E, .top_k = o.k, .scale = 1.0f};

    printf("\n%6s %9s %9s %9s %10s %10s %8s %7s %9s %7s\n", "T", "median", "min", "max", "tokens/s", "uniq MB", "GB/s",
           "bw%", "G(FL)OP/s", "peak%");
    targets tg = {-1, -1, -1, -1, -1};
    for (int ti = 0; ti < o.nT && !rc; ti++) {
        int64_t T = o.Ts[ti];
        mr_moe_args a = {.T = T, .x = b.x, .out = b.out, .ids = b.ids, .weights = b.wts, .logits = b.logits, .routing = &ro};
        timing tm;
        if (time_calls(ctx, w, &a, &s, o.skewed, o.E, o.k, o.iters, expert_bytes, b.used, b.ms, &tm)) {
            mr_cli_fail("bench moe", "run failed");
            rc = 1;
            break;
        }
        double flops = 2.0 * (double)T * o.k * 3.0 * (double)H * (double)o.I;
        double gflops = flops / (tm.med * 1e6), bwr = c.bw > 0 ? tm.gbs / c.bw : 0.0,
               pkr = c.peak > 0 ? gflops / c.peak : 0.0;
        printf("%6lld %7.3fms %7.3fms %7.3fms %10.1f %10.1f %8.2f %6.1f%% %9.1f %6.1f%%\n", (long long)T, tm.med, tm.mn,
               tm.mx, (double)T / (tm.med * 1e-3), tm.mean_bytes / 1e6, tm.gbs, 100.0 * bwr, gflops, 100.0 * pkr);
        if (o.phases) print_phases(&tm.prof);
        fflush(stdout);
        /* absolute rates for now; the targets divide by the ceilings after the run */
        if (T == 1) tg.t1_bw = tm.gbs;
        if (T == 8) tg.t8_bw = tm.gbs;
        if (T == 32) tg.t32_bw = tm.gbs;
        if (T >= 512 && (tg.pf_peak < 0 || gflops < tg.pf_peak)) tg.pf_peak = gflops;
        json_t *jr = json_pack("{s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "tokens", (json_int_t)T, "median_ms",
                               tm.med, "min_ms", tm.mn, "max_ms", tm.mx, "tokens_per_s", (double)T / (tm.med * 1e-3),
                               "unique_bytes", tm.mean_bytes, "gb_per_s", tm.gbs, "bw_ratio", bwr, "gflop_per_s", gflops,
                               "peak_ratio", pkr);
        if (b.iso_buf && b.iso && isolate_rounds(&o, &c, ctx, w, &a, &s, expert_bytes, &tm, &b, jr)) {
            mr_cli_fail("bench moe", "run failed");
            json_decref(jr);
            rc = 1;
            break;
        }
        if (o.scaling && T >= 32 && T <= 512 && c.nthr > 1) {
            timing t1;
            omp_set_num_threads(1);
            mr_status st1 = time_calls(ctx, w, &a, &s, o.skewed, o.E, o.k, o.iters, expert_bytes, b.used, b.ms, &t1);
            omp_set_num_threads(c.nthr);
            if (st1) {
                mr_cli_fail("bench moe", "run failed");
                json_decref(jr);
                rc = 1;
                break;
            }
            double sc = t1.med / tm.med;
            printf("%6s 1 thread: %.3f ms median (%.1f GB/s of unique experts) -> %d threads are %.2fx faster\n", "",
                   t1.med, tm.mean_bytes / (t1.med * 1e-3) / 1e9, c.nthr, sc);
            if (o.phases) print_phases(&t1.prof);
            if (tg.scale_min < 0 || sc < tg.scale_min) tg.scale_min = sc;
            json_object_set_new(jr, "median_ms_1thread", json_real(t1.med));
            json_object_set_new(jr, "scaling", json_real(sc));
        }
        json_array_append_new(jres, jr);
    }
    /* peak RSS against what the layer needs: weights, the caller's buffers, the context's workspace */
    const size_t rss = mr_bench_peak_rss();
    const double maxT = (double)o.maxT;
    const double need = (double)expert_bytes * o.E + (double)mr_moe_ctx_workspace_bytes(ctx) + maxT * (double)H * 8.0 +
                        maxT * o.k * 8.0 + (b.logits ? maxT * o.E * 4.0 : 0.0) + (b.iso_buf ? (double)ISO_BYTES : 0.0);
    const double rss_ratio = rss ? (double)rss / need : 0.0;
    /* the ceilings again, after the timed calls: the host's bandwidth and compute move
     * during a run, and the targets use the higher (the harder) of the two readings */
    c.bw_end = 0, c.peak_end = 0;
    if (!rc) {
        c.bw_end = mr_probe_read_bw((size_t)1 << 30, 3);
        c.peak_end = mr_probe_peak(c.pi, NULL);
        printf("\nceilings after the run: read bandwidth %.1f GB/s, %s %.0f G%s/s (start: %.1f, %.0f)\n", c.bw_end,
               c.instr, c.peak_end, mr_probe_instr_is_int(c.pi) ? "OP" : "FLOP", c.bw, c.peak);
        const double bwc = c.bw_end > c.bw ? c.bw_end : c.bw, pkc = c.peak_end > c.peak ? c.peak_end : c.peak;
        if (tg.t1_bw >= 0) tg.t1_bw = bwc > 0 ? tg.t1_bw / bwc : 0.0;
        if (tg.t8_bw >= 0) tg.t8_bw = bwc > 0 ? tg.t8_bw / bwc : 0.0;
        if (tg.t32_bw >= 0) tg.t32_bw = bwc > 0 ? tg.t32_bw / bwc : 0.0;
        if (tg.pf_peak >= 0) tg.pf_peak = pkc > 0 ? tg.pf_peak / pkc : 0.0;
        print_targets(&o, &c, &tg, rss, need, rss_ratio);
    }
    if (!rc && o.json_path) {
        rc = write_json(&o, &c, &tg, w, rss, rss_ratio, jres);
    }
out:
    json_decref(jres);
    bufs_free(&b);
    mr_moe_ctx_free(ctx);
    mr_moe_weights_free(w);
    return rc;
}
