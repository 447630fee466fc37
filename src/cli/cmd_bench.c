/* cmd_bench.c — `moerun bench dense` (mr_matmul on the attention projections
 * at decode, see bench_dense) and `moerun bench moe`: times one synthetic MoE layer (seeded
 * random weights in the chosen format, MiniMax-M2 shapes by default) and
 * prints each result against ceilings measured in the same run: the
 * multi-threaded read bandwidth (1 GiB probe, pre-faulted, best of 5) and the
 * peak of the instruction the kernel's inner loop uses (vdpbf16ps, vpdpbusd
 * or vfmadd231ps, 12 chains). Routing is re-drawn every iteration so that the
 * expert weights come from DRAM; all buffers are pre-faulted (a warm-up call)
 * before timing. It ends with the issue-6 targets as ratios: T = 1 and
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
#include <sys/mman.h>
#include <time.h>

#include "cli.h"
#include "cli_model.h"
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
            "                      tiles (outputs meaningless): the layer's memory-side limit\n");
}

/* An integer option value in [lo, hi]; 1 (after a message naming the option) if it is not one. */
static int num(const char *opt, const char *v, long lo, long hi, long *out) {
    if (!mr_cli_parse_long(v, lo, hi, out)) return 0;
    fprintf(stderr, "moerun bench: %s: %s\n", opt, mr_error_last());
    return 1;
}

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Fills a matrix with random codes directly (no fp32 detour): values of
 * magnitude ~1/sqrt(cols) so the layer stays finite. */
static mr_status synth_matrix(mr_qmatrix *m, mr_format fmt, int64_t rows, int64_t cols, uint64_t *s) {
    memset(m, 0, sizeof *m);
    m->fmt = fmt;
    m->rows = rows;
    m->cols = cols;
    m->scale2 = 1.0f;
    m->owned = true;
    size_t nd = (size_t)rows * (size_t)cols, ns = 0;
    if (fmt == MR_FMT_BF16) nd *= 2;
    if (fmt == MR_FMT_NVFP4) nd /= 2, ns = (size_t)rows * (size_t)(cols / 16);
    if (fmt == MR_FMT_FP8_BLOCK) ns = (size_t)((rows + 127) / 128) * (size_t)((cols + 127) / 128) * 4;
    m->data = mr_aligned_alloc(64, nd);
    m->scale = ns ? mr_aligned_alloc(64, ns) : NULL;
    if (!m->data || (ns && !m->scale)) return MR_ENOMEM;
    uint64_t *d = m->data;
    size_t nw = nd / 8;
    if (fmt == MR_FMT_BF16) {
        for (size_t i = 0; i < nw; i++) /* sign + exponent 2^-8..2^-5 + random mantissa */
            d[i] = (rng_next(s) & 0x807F807F807F807Full) | 0x3B803B803B803B80ull;
    } else if (fmt == MR_FMT_FP8_BLOCK) {
        for (size_t i = 0; i < nw; i++) d[i] = rng_next(s) & 0xF7F7F7F7F7F7F7F7ull; /* never 0x7F/0xFF (NaN) */
        float *sc = m->scale;
        for (size_t i = 0; i < ns / 4; i++) sc[i] = 1.0f / (448.0f * sqrtf((float)cols));
    } else {
        for (size_t i = 0; i < nw; i++) d[i] = rng_next(s);
        uint8_t *sc = m->scale;
        for (size_t i = 0; i < ns; i++) sc[i] = (uint8_t)(0x30 + (rng_next(s) & 7)); /* e4m3 ~0.5..0.9 */
        m->scale2 = 1.0f / (6.0f * sqrtf((float)cols));
        m->input_scale = 4.0f / 2688.0f;
    }
    for (size_t i = nw * 8; i < nd; i++) ((uint8_t *)m->data)[i] = 0;
    return MR_OK;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* k distinct experts per token; skewed: 80% of picks among the first 32 */
static void draw_routing(uint64_t *s, bool skewed, int64_t T, int E, int k, int32_t *ids, float *w, float *logits) {
    for (int64_t t = 0; t < T; t++) {
        for (int j = 0; j < k; j++) {
            int32_t e;
            bool dup;
            do {
                uint64_t r = rng_next(s);
                e = (skewed && (r >> 40) % 10 < 8 && E > 32) ? (int32_t)(r % 32) : (int32_t)(r % (uint64_t)E);
                dup = false;
                for (int q = 0; q < j; q++) dup |= ids[t * k + q] == e;
            } while (dup);
            ids[t * k + j] = e;
            w[t * k + j] = 1.0f / (float)k;
        }
        if (logits) { /* logits whose top-k are exactly these ids */
            for (int e = 0; e < E; e++) logits[t * E + e] = -4.0f - (float)(rng_next(s) % 1000) * 1e-3f;
            for (int j = 0; j < k; j++) logits[t * E + ids[t * k + j]] = 4.0f - (float)j * 0.01f;
        }
    }
}

/* The "<key> <n> kB" line of a /proc file of this process, in bytes (0 if unknown) */
static size_t proc_kb(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0, n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n)) kb = strtoull(line + n, NULL, 10);
    fclose(f);
    return kb * 1024;
}
/* VmHWM: the peak RSS */
static size_t peak_rss(void) { return proc_kb("/proc/self/status", "VmHWM:"); }
/* AnonHugePages (smaps_rollup): the transparent huge pages actually backing the packed weights */
static size_t anon_huge(void) { return proc_kb("/proc/self/smaps_rollup", "AnonHugePages:"); }

/* A comma list of at most 16 token counts in [1, max] into Ts; 0 on success. */
static int parse_tokens(const char *list, long long max, int64_t Ts[16], int *nT) {
    *nT = 0;
    for (const char *p = list; *p;) {
        char *end;
        long long t = strtoll(p, &end, 10);
        if (end == p || t < 1 || t > max || *nT == 16 || (*end && *end != ',') || (*end == ',' && !end[1])) return 1;
        Ts[(*nT)++] = t;
        p = *end == ',' ? end + 1 : end;
    }
    return *nT == 0;
}

/* path + ".tmp" into tmp (the --json file is written there and renamed); 0 if it fits */
static int json_tmp(const char *path, char *tmp, size_t n) { return snprintf(tmp, n, "%s.tmp", path) >= (int)n; }

typedef struct {
    double med, mn, mx, mean_bytes, gbs;
    mr_moe_profile prof; /* of the timed calls */
} timing;

static void print_phases(const mr_moe_profile *p) {
    static const char *nm[MR_MOE_NPH] = {"setup", "prep x", "gemm1", "gemm2", "reduce"};
    if (p->calls < 1) return;
    printf("%6s phases per call (ms wall / threads busy%%):", "");
    for (int i = 0; i < MR_MOE_NPH; i++) {
        double w = (double)p->wall_ns[i] / (double)p->calls / 1e6;
        double b = p->wall_ns[i] ? (double)p->busy_ns[i] / ((double)p->wall_ns[i] * p->n_threads) : 0.0;
        printf(" %s %.3f/%.0f%%", nm[i], w, 100.0 * b);
    }
    printf("\n");
}

static int cmp_double(const void *a, const void *b);
static void draw_routing(uint64_t *s, bool skewed, int64_t T, int E, int k, int32_t *ids, float *w, float *logits);

/* iters timed calls at T tokens, routing re-drawn before each */
static mr_status time_calls(mr_moe_ctx *ctx, mr_moe_args *a, uint64_t *s, bool skewed, int E, int k, int iters,
                            size_t expert_bytes, unsigned char *used, double *ms, timing *out) {
    const int64_t T = a->T;
    draw_routing(s, skewed, T, E, k, (int32_t *)a->ids, (float *)a->weights, (float *)a->logits);
    mr_status st = mr_moe_run(ctx, a); /* warm-up: pre-faults the workspace */
    if (st) return st;
    double bytes_sum = 0, sum_ms = 0;
    for (int it = 0; it < iters; it++) {
        draw_routing(s, skewed, T, E, k, (int32_t *)a->ids, (float *)a->weights, (float *)a->logits);
        memset(used, 0, (size_t)E);
        int nu = 0;
        for (int64_t i = 0; i < T * k; i++) nu += !used[a->ids[i]], used[a->ids[i]] = 1;
        bytes_sum += (double)nu * (double)expert_bytes;
        uint64_t a0 = mr_now_ns();
        if (it == 0) mr_moe_ctx_profile(ctx, NULL, true);
        st = mr_moe_run(ctx, a);
        ms[it] = (double)(mr_now_ns() - a0) / 1e6;
        if (st) return st;
        sum_ms += ms[it];
    }
    qsort(ms, (size_t)iters, sizeof(double), cmp_double);
    mr_moe_ctx_profile(ctx, &out->prof, true);
    out->med = iters % 2 ? ms[iters / 2] : 0.5 * (ms[iters / 2 - 1] + ms[iters / 2]);
    out->mn = ms[0];
    out->mx = ms[iters - 1];
    out->mean_bytes = bytes_sum / iters;
    out->gbs = bytes_sum / (sum_ms * 1e6); /* bytes over the same calls' time */
    return MR_OK;
}

static int bench_moe(int argc, char **argv) {
    const char *runner_name = "routed", *fmt_name = "fp8", *mode_name = NULL, *tokens = "1,8,32,128,512";
    const char *json_path = NULL;
    int E = 256, k = 8, threads = 0, iters = 10, bad = 0;
    long lv = 0;
    int64_t H = 3072, I = 1536;
    uint64_t seed = 1;
    bool skewed = false, quick = false, scaling = false, phases = false, stream_only = false, isolate = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(name) (!strcmp(a, name) && v && ++i)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--quick")) quick = true;
        else if (!strcmp(a, "--scaling")) scaling = true;
        else if (!strcmp(a, "--phases")) phases = true;
        else if (!strcmp(a, "--stream-only")) stream_only = true;
        else if (!strcmp(a, "--isolate")) isolate = true;
        else if (OPT("--runner")) runner_name = v;
        else if (OPT("--format")) fmt_name = v;
        else if (OPT("--act-mode")) mode_name = v;
        else if (OPT("--tokens")) tokens = v;
        else if (OPT("--threads")) bad = num(a, v, 1, 1024, &lv), threads = (int)lv;
        else if (OPT("--iters")) bad = num(a, v, 1, 100000, &lv), iters = (int)lv;
        else if (OPT("--experts")) bad = num(a, v, 1, 4096, &lv), E = (int)lv;
        else if (OPT("--topk")) bad = num(a, v, 1, 4096, &lv), k = (int)lv;
        else if (OPT("--hidden")) bad = num(a, v, 1, 65536, &lv), H = lv;
        else if (OPT("--inter")) bad = num(a, v, 1, 65536, &lv), I = lv;
        else if (OPT("--seed")) bad = num(a, v, 0, 0x7fffffffL, &lv), seed = (uint64_t)lv;
        else if (OPT("--json")) json_path = v;
        else if (OPT("--routing")) {
            if (!strcmp(v, "skewed")) skewed = true;
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
    if (quick) tokens = "1,32,512", iters = 3;
    if (k > E) {
        fprintf(stderr, "moerun bench moe: --topk %d is more than --experts %d\n", k, E);
        return 2;
    }
    if (threads > 0) omp_set_num_threads(threads);
    const mr_moe_runner *run = mr_moe_runner_find(runner_name);
    if (!run) {
        fprintf(stderr, "moerun bench moe: unknown runner '%s' (routed, fused, reference)\n", runner_name);
        return 2;
    }
    mr_format fmt;
    if (!strcmp(fmt_name, "fp8")) fmt = MR_FMT_FP8_BLOCK;
    else if (!strcmp(fmt_name, "bf16")) fmt = MR_FMT_BF16;
    else if (!strcmp(fmt_name, "nvfp4")) fmt = MR_FMT_NVFP4;
    else {
        fprintf(stderr, "moerun bench moe: --format is bf16, fp8 or nvfp4\n");
        return 2;
    }
    mr_act_mode mode = mr_act_mode_default(fmt);
    if (mode_name && mr_act_mode_from_name(mode_name, &mode)) {
        mr_cli_fail("bench moe", "bad --act-mode");
        return 2;
    }
    int64_t Ts[16];
    int nT = 0;
    int64_t maxT = 0;
    if (parse_tokens(tokens, 65536, Ts, &nT)) {
        fprintf(stderr, "moerun bench moe: bad --tokens list '%s' (at most 16 comma-separated T in 1..65536)\n", tokens);
        return 2;
    }
    for (int i = 0; i < nT; i++) maxT = Ts[i] > maxT ? Ts[i] : maxT;
    mr_moe_problem p = {.device = MR_DEVICE_CPU, .cpu_flags = mr_cpu()->flags, .weight_format = fmt, .act_mode = mode,
                        .act_dtype = MR_FMT_F32, .routing = run->routes_itself ? MR_ROUTING_RENORMALIZE : MR_ROUTING_MINIMAX2,
                        .n_experts = E, .top_k = k, .hidden = H, .inter = I, .a2a = MR_A2A_NONE};
    char why[256];
    if (!run->supports(&p, why, sizeof why)) {
        fprintf(stderr, "moerun bench moe: %s\n", why);
        return 2;
    }

    if (json_path) { /* fail now, not after minutes of timing */
        char tmp[4096];
        FILE *jf = json_tmp(json_path, tmp, sizeof tmp) ? NULL : fopen(tmp, "w");
        if (!jf) {
            fprintf(stderr, "moerun bench moe: cannot write --json %s\n", json_path);
            return 1;
        }
        fclose(jf);
        remove(tmp);
    }
    /* ceilings first (they need the memory the weights will take later) */
    const char *instr;
    double bw = mr_probe_read_bw((size_t)1 << 30, 5);
    const mr_probe_instr pi = strcmp(run->name, "routed") ? MR_PROBE_FMA : mr_uk_instr(mr_act_mode_uk_kind(mode));
    double peak = mr_probe_peak(pi, &instr);
    int nthr = omp_get_max_threads();
    /* --scaling: the 1-thread read bandwidth bounds what N threads can gain on a call that is
     * bandwidth-bound (decode): at most bw / bw1 */
    double bw1 = 0;
    if (scaling && nthr > 1) {
        omp_set_num_threads(1);
        bw1 = mr_probe_read_bw((size_t)1 << 30, 5);
        omp_set_num_threads(nthr);
    }
    /* the probe's 1 GiB is freed: restart the peak-RSS count (VmHWM) from here */
    FILE *cr = fopen("/proc/self/clear_refs", "w");
    if (cr) fputs("5", cr), fclose(cr);
    printf("moerun bench moe: runner %s, format %s, act-mode %s, E %d H %lld I %lld k %d, %d threads, routing %s\n",
           run->name, fmt_name, mr_act_mode_name(mode), E, (long long)H, (long long)I, k, nthr,
           skewed ? "skewed" : "uniform");
    printf("cpu: %s; kernels: %s\n", mr_cpu()->brand, mr_kernels_get()->isa);
    if (bw1 > 0)
        printf("read bandwidth with 1 thread: %.1f GB/s, so a bandwidth-bound call gains at most %.2fx from %d threads\n", bw1,
               bw / bw1, nthr);
    printf("ceilings (this run): read bandwidth %.1f GB/s (1 GiB, %d threads); peak of the kernel's instruction %s: %.0f G%s/s\n",
           bw, nthr, instr, peak, pi == MR_PROBE_DPBUSD ? "OP" : "FLOP");

    uint64_t t0 = mr_now_ns(), s = seed;
    mr_moe_weights *w = NULL;
    mr_status st = mr_moe_weights_new(&w, E, H, I, fmt);
    for (int e = 0; !st && e < E; e++) {
        st = synth_matrix(&w->w1[e], fmt, I, H, &s);
        if (!st) st = synth_matrix(&w->w3[e], fmt, I, H, &s);
        if (!st) w->w3[e].scale2 = w->w1[e].scale2;
        if (!st) st = synth_matrix(&w->w2[e], fmt, H, I, &s);
        if (!st && fmt == MR_FMT_NVFP4) w->w2[e].input_scale = 1.0f / 2688.0f;
    }
    mr_moe_ctx *ctx = NULL;
    if (!st) st = mr_moe_ctx_new(run, &p, w, maxT, &ctx);
    if (st) {
        mr_cli_fail("bench moe", "setup failed");
        mr_moe_weights_free(w);
        return 1;
    }
    if (stream_only) mr_moe_ctx_debug_stream_only(ctx, true);
    size_t expert_bytes = mr_moe_weights_expert_bytes(w);
    printf("weights: %.2f GB in layout of %s (pack %s, %.1f MB per expert), generated in %.1f s\n",
           (double)expert_bytes * E / 1e9, w->layout.owner, mr_pack_name((mr_pack_id)w->layout.pack),
           (double)expert_bytes / 1e6, (double)(mr_now_ns() - t0) / 1e9);
    printf("transparent huge pages in use: %.2f GB (AnonHugePages)\n", (double)anon_huge() / 1e9);
    if (w->layout.pack != MR_PACK_NONE)
        printf("kernels: gemv %s, gemm %s (from %d tokens per expert)\n", mr_kernels_get()->uk_gemv[mr_act_mode_uk_kind(mode)].name,
               mr_kernels_get()->uk_gemm[mr_act_mode_uk_kind(mode)].name, mr_kernels_get()->uk_gemm_min_m);

    float *x = malloc(sizeof(float) * (size_t)(maxT * H)), *out = malloc(sizeof(float) * (size_t)(maxT * H));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(maxT * k));
    float *wts = malloc(sizeof(float) * (size_t)(maxT * k));
    float *logits = run->routes_itself ? malloc(sizeof(float) * (size_t)(maxT * E)) : NULL;
    double *ms = malloc(sizeof(double) * (size_t)iters);
    unsigned char *used = malloc((size_t)E);
    json_t *jres = json_array();
    const size_t iso_bytes = (size_t)1 << 30;
    uint64_t *iso_buf = isolate ? mr_probe_buf_new(iso_bytes) : NULL;
    double *iso = isolate ? malloc(sizeof(double) * 4 * (size_t)iters) : NULL;
    if (!x || !out || !ids || !wts || (run->routes_itself && !logits) || !ms || !used || !jres ||
        (isolate && (!iso_buf || !iso))) {
        fprintf(stderr, "moerun bench moe: out of memory for %lld tokens\n", (long long)maxT);
        free(x), free(out), free(ids), free(wts), free(logits), free(ms), free(used), free(iso);
        json_decref(jres);
        mr_aligned_free(iso_buf);
        mr_moe_ctx_free(ctx);
        mr_moe_weights_free(w);
        return 1;
    }
    for (int64_t i = 0; i < maxT * H; i++) x[i] = (float)((double)(rng_next(&s) % 2001) / 1000.0 - 1.0);
    memset(out, 0, sizeof(float) * (size_t)(maxT * H));
    mr_routing ro = {.method = p.routing, .n_experts = E, .top_k = k, .scale = 1.0f};

    printf("\n%6s %9s %9s %9s %10s %10s %8s %7s %9s %7s\n", "T", "median", "min", "max", "tokens/s", "uniq MB", "GB/s",
           "bw%", "G(FL)OP/s", "peak%");
    int rc = 0;
    double t1_bw = -1, t8_bw = -1, t32_bw = -1, pf_peak = -1, scale_min = -1;
    for (int ti = 0; ti < nT && !rc; ti++) {
        int64_t T = Ts[ti];
        mr_moe_args a = {.T = T, .x = x, .out = out, .ids = ids, .weights = wts, .logits = logits, .routing = &ro};
        timing tm;
        if (time_calls(ctx, &a, &s, skewed, E, k, iters, expert_bytes, used, ms, &tm)) {
            mr_cli_fail("bench moe", "run failed");
            rc = 1;
            break;
        }
        double flops = 2.0 * (double)T * k * 3.0 * (double)H * (double)I;
        double gflops = flops / (tm.med * 1e6), bwr = bw > 0 ? tm.gbs / bw : 0.0, pkr = peak > 0 ? gflops / peak : 0.0;
        printf("%6lld %7.3fms %7.3fms %7.3fms %10.1f %10.1f %8.2f %6.1f%% %9.1f %6.1f%%\n", (long long)T, tm.med, tm.mn,
               tm.mx, (double)T / (tm.med * 1e-3), tm.mean_bytes / 1e6, tm.gbs, 100.0 * bwr, gflops, 100.0 * pkr);
        if (phases) print_phases(&tm.prof);
        fflush(stdout);
        /* absolute rates for now; the targets divide by the ceilings after the run */
        if (T == 1) t1_bw = tm.gbs;
        if (T == 8) t8_bw = tm.gbs;
        if (T == 32) t32_bw = tm.gbs;
        if (T >= 512 && (pf_peak < 0 || gflops < pf_peak)) pf_peak = gflops;
        json_t *jr = json_pack("{s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "tokens", (json_int_t)T, "median_ms",
                               tm.med, "min_ms", tm.mn, "max_ms", tm.mx, "tokens_per_s", (double)T / (tm.med * 1e-3),
                               "unique_bytes", tm.mean_bytes, "gb_per_s", tm.gbs, "bw_ratio", bwr, "gflop_per_s", gflops,
                               "peak_ratio", pkr);
        if (iso_buf && iso) {
            /* rounds of probe / call / stream-only call: ratios within a round share the host's mood */
            double *rp = iso, *sp = iso + iters, *rs = iso + 2 * iters, *cp = iso + 3 * iters;
            /* the probe reads as many bytes as a call touches (a rotating window of the 1 GiB
             * buffer), so that the three measurements of a round span similar times */
            size_t pbytes = (size_t)tm.mean_bytes / ((size_t)2 << 20) * ((size_t)2 << 20);
            if (pbytes < ((size_t)32 << 20)) pbytes = (size_t)32 << 20;
            if (pbytes > iso_bytes) pbytes = iso_bytes;
            size_t poff = 0;
            for (int it = 0; it < iters && !rc; it++) {
                if (poff + pbytes > iso_bytes) poff = 0;
                double pb = mr_probe_read_once(iso_buf + poff / 8, pbytes);
                poff += pbytes;
                timing r1, r2;
                mr_status s1 = time_calls(ctx, &a, &s, skewed, E, k, 1, expert_bytes, used, ms, &r1);
                mr_moe_ctx_debug_stream_only(ctx, true);
                mr_status s2 = time_calls(ctx, &a, &s, skewed, E, k, 1, expert_bytes, used, ms, &r2);
                mr_moe_ctx_debug_stream_only(ctx, stream_only);
                if (s1 || s2) rc = 1;
                rp[it] = r1.gbs / pb, sp[it] = r2.gbs / pb, rs[it] = r1.gbs / r2.gbs;
                /* ~1 ms of the kernel's instruction: the compute the host gives in this round
                 * (a busy sibling hyperthread on the host slows the kernels, not a pure read) */
                cp[it] = peak > 0 ? mr_probe_peak_once(pi, 300000) / peak : 0.0;
            }
            if (rc) {
                mr_cli_fail("bench moe", "run failed");
                json_decref(jr);
                break;
            }
            qsort(rp, (size_t)iters, sizeof(double), cmp_double);
            qsort(sp, (size_t)iters, sizeof(double), cmp_double);
            qsort(rs, (size_t)iters, sizeof(double), cmp_double);
            qsort(cp, (size_t)iters, sizeof(double), cmp_double);
            printf("%6s isolate (medians of %d rounds): kernels/probe %.1f%%, stream-only/probe %.1f%%, kernels/stream-only %.1f%%\n",
                   "", iters, 100 * rp[iters / 2], 100 * sp[iters / 2], 100 * rs[iters / 2]);
            printf("%6s   instruction probe in the rounds / at the start: median %.1f%%, lowest %.1f%%\n", "",
                   100 * cp[iters / 2], 100 * cp[0]);
            json_object_set_new(jr, "isolate_instr_over_peak", json_real(cp[iters / 2]));
            json_object_set_new(jr, "isolate_kernels_over_probe", json_real(rp[iters / 2]));
            json_object_set_new(jr, "isolate_stream_over_probe", json_real(sp[iters / 2]));
            json_object_set_new(jr, "isolate_kernels_over_stream", json_real(rs[iters / 2]));
        }
        if (scaling && T >= 32 && T <= 512 && nthr > 1) {
            timing t1;
            omp_set_num_threads(1);
            mr_status st1 = time_calls(ctx, &a, &s, skewed, E, k, iters, expert_bytes, used, ms, &t1);
            omp_set_num_threads(nthr);
            if (st1) {
                mr_cli_fail("bench moe", "run failed");
                json_decref(jr);
                rc = 1;
                break;
            }
            double sc = t1.med / tm.med;
            printf("%6s 1 thread: %.3f ms median (%.1f GB/s of unique experts) -> %d threads are %.2fx faster\n", "",
                   t1.med, tm.mean_bytes / (t1.med * 1e-3) / 1e9, nthr, sc);
            if (phases) print_phases(&t1.prof);
            if (scale_min < 0 || sc < scale_min) scale_min = sc;
            json_object_set_new(jr, "median_ms_1thread", json_real(t1.med));
            json_object_set_new(jr, "scaling", json_real(sc));
        }
        json_array_append_new(jres, jr);
    }
    /* peak RSS against what the layer needs: weights, the caller's buffers, the context's workspace */
    const size_t rss = peak_rss();
    const double need = (double)expert_bytes * E + (double)mr_moe_ctx_workspace_bytes(ctx) +
                        (double)maxT * (double)H * 8.0 + (double)maxT * k * 8.0 + (logits ? (double)maxT * E * 4.0 : 0.0) +
                        (iso_buf ? (double)iso_bytes : 0.0);
    const double rss_ratio = rss ? (double)rss / need : 0.0;
    /* the ceilings again, after the timed calls: the host's bandwidth and compute move
     * during a run, and the targets use the higher (the harder) of the two readings */
    double bw_end = 0, peak_end = 0;
    if (!rc) {
        bw_end = mr_probe_read_bw((size_t)1 << 30, 3);
        peak_end = mr_probe_peak(pi, NULL);
        printf("\nceilings after the run: read bandwidth %.1f GB/s, %s %.0f G%s/s (start: %.1f, %.0f)\n", bw_end, instr,
               peak_end, pi == MR_PROBE_DPBUSD ? "OP" : "FLOP", bw, peak);
        const double bwc = bw_end > bw ? bw_end : bw, pkc = peak_end > peak ? peak_end : peak;
        if (t1_bw >= 0) t1_bw = bwc > 0 ? t1_bw / bwc : 0.0;
        if (t8_bw >= 0) t8_bw = bwc > 0 ? t8_bw / bwc : 0.0;
        if (t32_bw >= 0) t32_bw = bwc > 0 ? t32_bw / bwc : 0.0;
        if (pf_peak >= 0) pf_peak = pkc > 0 ? pf_peak / pkc : 0.0;
    }
    if (!rc) {
        printf("issue-6 targets (ratios against the higher of this run's two ceiling readings; %s, %s, %d threads):\n",
               fmt_name, mr_act_mode_name(mode), nthr);
        const double t1_target = fmt == MR_FMT_BF16 ? 0.85 : 0.90;
        if (t1_bw >= 0) printf("  decode T=1 bandwidth       %5.1f%%  (target >= %.0f%%)%s\n", 100 * t1_bw, 100 * t1_target, t1_bw >= t1_target ? "" : "  NOT MET");
        if (t8_bw >= 0) printf("  decode T=8 bandwidth       %5.1f%%  (target >= 80%%, unique experts)%s\n", 100 * t8_bw, t8_bw >= 0.8 ? "" : "  NOT MET");
        if (t32_bw >= 0) printf("  decode T=32 bandwidth      %5.1f%%  (target >= 80%%, unique experts)%s\n", 100 * t32_bw, t32_bw >= 0.8 ? "" : "  NOT MET");
        if (pf_peak >= 0) printf("  prefill T>=512 of %-14s %5.1f%%  (target >= 60%%)%s\n", instr, 100 * pf_peak, pf_peak >= 0.6 ? "" : "  NOT MET");
        if (scale_min >= 0) printf("  scaling %d vs 1 thread, T>=32 %5.2fx  (target >= 1.8x)%s\n", nthr, scale_min, scale_min >= 1.8 ? "" : "  NOT MET");
        if (scale_min >= 0 && bw1 > 0)
            printf("    (read bandwidth %d vs 1 thread in this run: %.2fx, the ceiling of a bandwidth-bound T)\n", nthr, bw / bw1);
        if (rss) printf("  peak RSS %.2f GB / (weights + activations + workspace %.2f GB) = %.3f  (target <= 1.10)%s\n",
                        (double)rss / 1e9, need / 1e9, rss_ratio, rss_ratio <= 1.10 ? "" : "  NOT MET");
    }
    if (!rc && json_path) {
        char date[32];
        time_t now = time(NULL);
        strftime(date, sizeof date, "%Y-%m-%d %H:%M", localtime(&now));
        json_t *root = json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:I, s:I, s:i, s:i, s:s, s:i, s:f, s:s, s:f, s:O}", "bench",
                                 "moe", "runner", run->name, "format", fmt_name, "act_mode", mr_act_mode_name(mode), "cpu",
                                 mr_cpu()->brand, "experts", E, "hidden", (json_int_t)H, "inter", (json_int_t)I, "topk", k,
                                 "threads", nthr, "routing", skewed ? "skewed" : "uniform", "iters", iters,
                                 "read_bw_gb_per_s", bw, "peak_instr", instr, "peak_gflop_per_s", peak, "results", jres);
        if (root) {
            json_object_set_new(root, "date", json_string(date));
            json_object_set_new(root, "kernel_isa", json_string(mr_kernels_get()->isa));
            json_object_set_new(root, "pack", json_string(mr_pack_name((mr_pack_id)w->layout.pack)));
            json_object_set_new(root, "peak_rss_bytes", json_integer((json_int_t)rss));
            json_object_set_new(root, "rss_ratio", json_real(rss_ratio));
            if (scale_min >= 0) json_object_set_new(root, "scaling_min", json_real(scale_min));
            if (bw1 > 0) json_object_set_new(root, "read_bw_1thread_gb_per_s", json_real(bw1));
            json_object_set_new(root, "read_bw_end_gb_per_s", json_real(bw_end));
            json_object_set_new(root, "peak_end_gflop_per_s", json_real(peak_end));
            if (t1_bw >= 0) json_object_set_new(root, "target_t1_bw_ratio", json_real(t1_bw));
            if (t8_bw >= 0) json_object_set_new(root, "target_t8_bw_ratio", json_real(t8_bw));
            if (t32_bw >= 0) json_object_set_new(root, "target_t32_bw_ratio", json_real(t32_bw));
            if (pf_peak >= 0) json_object_set_new(root, "target_prefill_peak_ratio", json_real(pf_peak));
        }
        /* written beside the target and renamed: a failed run leaves no partial file */
        char tmp[4096];
        if (!root || json_tmp(json_path, tmp, sizeof tmp) ||
            json_dump_file(root, tmp, JSON_INDENT(2)) != 0 || rename(tmp, json_path) != 0) {
            fprintf(stderr, "moerun bench moe: cannot write %s\n", json_path);
            if (root) remove(tmp);
            rc = 1;
        }
        json_decref(root);
    }
    json_decref(jres);
    mr_aligned_free(iso_buf);
    free(iso);
    free(x), free(out), free(ids), free(wts), free(logits), free(ms), free(used);
    mr_moe_ctx_free(ctx);
    mr_moe_weights_free(w);
    return rc;
}

/* ---- `moerun bench dense`: the attention projections of MiniMax-M2 at decode
 * (q [6144][3072], k and v [1024][3072], o [3072][6144]) through mr_matmul,
 * fp8 (128x128 block scales) or bf16 weights with seeded random values, fp32
 * activations. Enough layer copies to exceed any cache are cycled; each
 * round times one layer's q, k, v, o (and q/k/v through mr_matmul_multi) and
 * then reads as many bytes with the probe, so ratios share the host state. */
typedef struct {
    mr_qmatrix m[4]; /* q, k, v, o */
} dense_layer;

static int bench_dense(int argc, char **argv) {
    const char *fmt_name = "fp8", *tokens = "1,2,4,8";
    int threads = 0, iters = 20;
    long lv = 0;
    bool small_pages = false;
    int64_t H = 3072, QD = 6144, KVD = 1024;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(name) (!strcmp(a, name) && v && ++i)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: moerun bench dense [--format fp8|bf16] [--tokens 1,2,4,8] [--iters N] [--threads N]\n"
                   "                          [--small-pages]\n");
            return 0;
        } else if (!strcmp(a, "--small-pages")) small_pages = true;
        else if (OPT("--format")) fmt_name = v;
        else if (OPT("--tokens")) tokens = v;
        else if (OPT("--threads")) {
            if (num(a, v, 1, 1024, &lv)) return 2;
            threads = (int)lv;
        } else if (OPT("--iters")) {
            if (num(a, v, 1, 100000, &lv)) return 2;
            iters = (int)lv;
        } else {
            fprintf(stderr, "moerun bench dense: unknown or incomplete option '%s'\n", a);
            return 2;
        }
#undef OPT
    }
    mr_format fmt = !strcmp(fmt_name, "fp8") ? MR_FMT_FP8_BLOCK : !strcmp(fmt_name, "bf16") ? MR_FMT_BF16 : MR_FMT_COUNT;
    if (fmt == MR_FMT_COUNT || iters < 1 || iters > 100000) {
        fprintf(stderr, "moerun bench dense: --format is fp8 or bf16; --iters 1..100000\n");
        return 2;
    }
    int64_t Ts[16];
    int nT = 0;
    if (parse_tokens(tokens, 64, Ts, &nT)) {
        fprintf(stderr, "moerun bench dense: bad --tokens list '%s' (at most 16 comma-separated T in 1..64)\n", tokens);
        return 2;
    }
    if (threads > 0) omp_set_num_threads(threads);
    const int64_t rows[4] = {QD, KVD, KVD, H}, cols[4] = {H, H, H, QD};
    size_t esz = fmt == MR_FMT_BF16 ? 2 : 1, layer_bytes = 0;
    for (int j = 0; j < 4; j++) layer_bytes += (size_t)(rows[j] * cols[j]) * esz;
    int NL = (int)(((size_t)640 << 20) / layer_bytes) + 1;
    if (NL > 64) NL = 64;
    dense_layer *L = calloc((size_t)NL, sizeof *L);
    uint64_t *slab[64 * 4] = {0};
    uint64_t s = 12345;
    int rc = 0;
    for (int l = 0; l < NL && !rc; l++)
        for (int j = 0; j < 4; j++) {
            mr_qmatrix *q = &L[l].m[j];
            size_t n = (size_t)(rows[j] * cols[j]);
            uint64_t *buf = small_pages ? mr_aligned_alloc(4096, n * esz + 8) : mr_probe_buf_new(n * esz + 8);
            if (!buf) {
                rc = 1;
                break;
            }
#ifdef MADV_NOHUGEPAGE
            if (small_pages) (void)madvise(buf, n * esz, MADV_NOHUGEPAGE);
#endif
            slab[l * 4 + j] = buf;
            q->fmt = fmt, q->rows = rows[j], q->cols = cols[j], q->data = buf, q->scale2 = 1.0f;
            if (fmt == MR_FMT_FP8_BLOCK) {
                uint8_t *d = (uint8_t *)buf;
                for (size_t i = 0; i < n; i++) {
                    uint8_t b = (uint8_t)(rng_next(&s) >> 24);
                    d[i] = (b & 0x7F) == 0x7F ? (uint8_t)(b - 1) : b;
                }
                size_t ns = (size_t)(((rows[j] + 127) / 128) * ((cols[j] + 127) / 128));
                float *sc = malloc(ns * sizeof(float));
                for (size_t i = 0; i < ns; i++) sc[i] = (float)(1e-3 * (1 + rng_next(&s) % 100));
                q->scale = sc;
            } else {
                uint16_t *d = (uint16_t *)buf;
                for (size_t i = 0; i < n; i++) {
                    float f = (float)((double)(rng_next(&s) % 20001) / 10000.0 - 1.0) * 0.05f;
                    uint32_t u;
                    memcpy(&u, &f, 4);
                    d[i] = (uint16_t)(u >> 16);
                }
            }
        }
    if (rc) {
        fprintf(stderr, "moerun bench dense: out of memory\n");
        return 1;
    }
    const size_t pbytes = (size_t)1 << 30;
    uint64_t *pbuf = mr_probe_buf_new(pbytes);
    int64_t maxT = 1;
    for (int i = 0; i < nT; i++) maxT = Ts[i] > maxT ? Ts[i] : maxT;
    float *x = malloc(sizeof(float) * (size_t)(maxT * QD)), *y = malloc(sizeof(float) * (size_t)(maxT * (QD + 2 * KVD)));
    for (int64_t i = 0; i < maxT * QD; i++) x[i] = (float)((double)(rng_next(&s) % 2001) / 1000.0 - 1.0);
    const mr_kernels *kt = mr_kernels_get();
    printf("moerun bench dense: format %s, %d threads, %d layer copies of %.1f MB (%s pages), kernel %s\n", fmt_name,
           omp_get_max_threads(), NL, (double)layer_bytes / 1e6, small_pages ? "4 KiB" : "huge",
           kt->rows[fmt].name ? kt->rows[fmt].name : "gemm_rows");
    printf("%4s %8s %8s %8s %8s %9s %9s %9s %7s   (GB/s per matrix, medians of %d rounds; probe = same bytes)\n", "T",
           "q", "k", "v", "o", "qkv-multi", "layer", "probe", "layer%", iters);
    double *med = malloc(sizeof(double) * 8 * (size_t)iters);
    int cur = 0;
    size_t poff = 0;
    for (int ti = 0; ti < nT && pbuf && x && y && med; ti++) {
        int64_t T = Ts[ti];
        for (int it = -1; it < iters; it++) {
            double t[8];
            dense_layer *ly = &L[cur];
            cur = (cur + 1) % NL;
            for (int j = 0; j < 4; j++) {
                uint64_t a0 = mr_now_ns();
                mr_matmul(&ly->m[j], x, T, y);
                t[j] = (double)(mr_now_ns() - a0);
            }
            ly = &L[cur];
            cur = (cur + 1) % NL;
            const mr_qmatrix *qkv[3] = {&ly->m[0], &ly->m[1], &ly->m[2]};
            float *ys[3] = {y, y + maxT * QD, y + maxT * (QD + KVD)};
            uint64_t a0 = mr_now_ns();
            mr_matmul_multi(3, qkv, x, T, ys);
            t[4] = (double)(mr_now_ns() - a0);
            size_t qkvb = (size_t)((QD + 2 * KVD) * H) * esz;
            t[5] = t[0] + t[1] + t[2] + t[3];
            if (poff + layer_bytes > pbytes) poff = 0;
            double pb = mr_probe_read_once(pbuf + poff / 8, layer_bytes / 4096 * 4096);
            poff += layer_bytes / 4096 * 4096;
            if (it < 0) continue;
            for (int j = 0; j < 4; j++) med[j * iters + it] = (double)(rows[j] * cols[j]) * (double)esz / t[j];
            med[4 * iters + it] = (double)qkvb / t[4];
            med[5 * iters + it] = (double)layer_bytes / t[5];
            med[6 * iters + it] = pb;
            med[7 * iters + it] = med[5 * iters + it] / pb;
        }
        double mv[8];
        for (int c = 0; c < 8; c++) {
            qsort(med + c * iters, (size_t)iters, sizeof(double), cmp_double);
            mv[c] = med[c * iters + iters / 2];
        }
        printf("%4lld %8.2f %8.2f %8.2f %8.2f %9.2f %9.2f %9.2f %6.1f%%\n", (long long)T, mv[0], mv[1], mv[2], mv[3],
               mv[4], mv[5], mv[6], 100.0 * mv[7]);
        fflush(stdout);
    }
    for (int l = 0; l < NL; l++)
        for (int j = 0; j < 4; j++) {
            mr_aligned_free(slab[l * 4 + j]);
            free(L[l].m[j].scale);
        }
    mr_aligned_free(pbuf);
    free(L), free(x), free(y), free(med);
    return 0;
}

int mr_cmd_bench(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        printf("usage: moerun bench moe|dense|serve [options]   (`moerun bench <name> --help`)\n");
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "moe")) return bench_moe(argc - 1, argv + 1);
    if (!strcmp(argv[1], "dense")) return bench_dense(argc - 1, argv + 1);
    if (!strcmp(argv[1], "serve")) return mr_cmd_bench_serve(argc - 1, argv + 1);
    fprintf(stderr, "moerun bench: unknown benchmark '%s' (available: moe, dense, serve)\n", argv[1]);
    return 2;
}
