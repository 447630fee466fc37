/* bench_moe_ep.c — `moerun bench moe --moe-a2a-backend mpi` under mpirun:
 * one synthetic MoE layer (bench_moe.c's weights and routing) expert-parallel
 * over the R ranks, each holding its own experts, the tokens replicated on
 * every rank as the model runs them (each rank the origin of its share, the
 * outputs gathered). Per T, iters rounds, each: a barrier, one expert-parallel
 * call timed on every rank, and the same call in one process of R x threads
 * on rank 0 while the other ranks wait without holding a core (interleaved,
 * so that both see the same host; in alternate order, so that neither always
 * runs second, on the experts the other just read). It prints, per T:
 *   - the step time of the layer (the slowest rank, median and range) against
 *     the one-process time, and whether the outputs are bit-identical;
 *   - dispatch and combine: bytes each rank sends to the others and the time,
 *     as the transfer (the last rank to arrive waits for the data only: the
 *     smallest time over the ranks) and with the waiting for slower ranks
 *     (the largest), beside MPI_Alltoallv alone on the same message sizes
 *     measured in this run (the ceiling), and the output gather;
 *   - rows computed per rank: max, mean and balancedness (mean / max);
 *   - the transport's share of the step (transfers over step time), against
 *     the project's target (<= 10% at T >= 8 with 2 ranks on one machine).
 * Each rank's experts and peak RSS are printed after the setup. */
#include <jansson.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "cli.h"
#include "moerun/config.h"
#include "moerun/moe.h"

/* What each rank reports for one call. */
typedef struct {
    double step_ms, dispatch_ms, combine_ms, gather_ms;
    int64_t rows;
    uint64_t dispatch_bytes, combine_bytes, rss;
} call_rec;

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), mr_bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The bytes rank me sends each rank in the dispatch (rows x wire bytes) and the combine (rows x H x 4) of a
 * replicated call with these ids. */
static void message_sizes(const int32_t *ids, int64_t T, int k, int E, int R, int me, int64_t H, size_t wire,
                          int64_t *disp, int64_t *comb) {
    for (int q = 0; q < R; q++) disp[q] = comb[q] = 0;
    for (int q = 0; q < R; q++) {
        int64_t f, n;
        mr_moe_share(T, R, q, &f, &n);
        for (int64_t i = f * k; i < (f + n) * k; i++) {
            const int owner = mr_moe_placement_owner(E, R, ids[i]);
            if (q == me) disp[owner] += (int64_t)wire;
            if (owner == me) comb[q] += H * 4;
        }
    }
}

/* The same call in one process of R x threads on rank 0, the others off the cores (waiting in an idle
 * barrier): its time into *ms (when not NULL); nonzero when the barrier failed (*rc set on a failed call). */
static int one_process(mr_moe_ctx *ctx1, mr_moe_weights *w1, const mr_moe_args *a1, bool lead, int threads, int R,
                       double *ms, int *rc) {
    if (lead) {
        omp_set_num_threads(threads * R);
        const uint64_t c0 = mr_now_ns();
        const mr_status st = mr_moe_run(ctx1, w1, a1);
        const double ms1 = (double)(mr_now_ns() - c0) / 1e6;
        omp_set_num_threads(threads);
        if (st) {
            mr_cli_fail("bench moe", "the one-process run failed");
            *rc = 1;
        }
        if (ms) *ms = ms1;
        /* the team's extra threads spin for some milliseconds after the region (libgomp's default wait
         * policy) before they sleep: on a host with one core per rank they would hold a core the next
         * expert-parallel call needs (measured: 2 ranks x 1 thread, T=1, 5.0 ms instead of 2.3 ms) */
        struct timespec gap = {0, 20 * 1000 * 1000};
        nanosleep(&gap, NULL);
    }
    return mr_ep_barrier_idle(600) != MR_OK;
}

int mr_bench_moe_ep(const mr_bench_moe_ep_opts *o) {
    const int R = mr_ep_size(), me = mr_ep_rank();
    const bool lead = me == 0, single = !o->no_single;
    int threads = o->threads;
    if (threads <= 0) {
        const int local = mr_launcher_local(), cores = mr_cpu()->n_cores > 0 ? mr_cpu()->n_cores : 1;
        threads = cores / local > 0 ? cores / local : 1;
    }
    omp_set_num_threads(threads);
    int rc = 0;
    mr_moe_weights *w = NULL, *w1 = NULL;
    mr_moe_ctx *ctx = NULL, *ctx1 = NULL;
    float *x = NULL, *out = NULL, *out1 = NULL, *wts = NULL, *logits = NULL;
    int32_t *ids = NULL;
    call_rec *all = NULL;
    double *v = NULL;
    int64_t *sizes = NULL;
    json_t *jres = json_array();
    mr_moe_problem p = {.device = MR_DEVICE_CPU, .cpu_flags = mr_cpu()->flags, .weight_format = o->fmt,
                        .act_mode = o->mode, .act_dtype = MR_FMT_F32, .routing = MR_ROUTING_MINIMAX2,
                        .n_experts = o->E, .top_k = o->k, .hidden = o->H, .inter = o->I, .a2a = MR_A2A_MPI,
                        .ep_size = R, .ep_rank = me};
    mr_moe_placement_contiguous(o->E, R, me, &p.local_first, &p.n_local);
    /* the ceiling of the read bandwidth, on rank 0 alone (the others wait off the cores) */
    double bw = 0;
    if (lead) bw = mr_probe_read_bw((size_t)1 << 30, 3);
    if (mr_ep_barrier_idle(600)) goto fail;
    mr_bench_peak_rss_reset();
    /* setup: every rank its experts; rank 0 also every expert for the one-process comparison */
    uint64_t t0 = mr_now_ns();
    mr_status st = mr_bench_moe_weights(o->fmt, p.local_first, p.n_local, o->H, o->I, o->seed, &w);
    if (!st) st = mr_moe_ctx_new(o->run, &p, o->maxT, &ctx);
    if (!st) st = mr_moe_ctx_prepare(ctx, w);
    if (!st && lead && single) {
        mr_moe_problem p1 = p;
        p1.a2a = MR_A2A_NONE;
        p1.ep_size = 1, p1.ep_rank = 0, p1.local_first = 0, p1.n_local = o->E;
        omp_set_num_threads(threads * R); /* the same threads in all */
        st = mr_bench_moe_weights(o->fmt, 0, o->E, o->H, o->I, o->seed, &w1);
        if (!st) st = mr_moe_ctx_new(o->run, &p1, o->maxT, &ctx1);
        if (!st) st = mr_moe_ctx_prepare(ctx1, w1);
        omp_set_num_threads(threads);
    }
    const size_t nx = (size_t)(o->maxT * o->H);
    x = malloc(nx * sizeof(float));
    out = malloc(nx * sizeof(float));
    out1 = lead ? malloc(nx * sizeof(float)) : NULL;
    ids = malloc((size_t)(o->maxT * o->k) * sizeof(int32_t));
    wts = malloc((size_t)(o->maxT * o->k) * sizeof(float));
    all = calloc((size_t)R, sizeof(call_rec));
    v = malloc((size_t)o->iters * 8 * sizeof(double) + 64);
    sizes = malloc((size_t)R * 2 * sizeof(int64_t));
    if (!st && (!x || !out || (lead && !out1) || !ids || !wts || !all || !v || !sizes || !jres)) st = MR_ENOMEM;
    int setup_rc = st ? 1 : 0;
    if (st) mr_cli_fail("bench moe", "setup failed");
    /* every rank set up (else all stop here), and each one's RSS */
    call_rec mine = {.rows = setup_rc, .rss = mr_bench_peak_rss()};
    /* a rank whose calloc failed still takes part (the others would wait out the timeout): on the stack */
    call_rec few[64];
    call_rec *gath = all ? all : R <= 64 ? few : NULL;
    if (!gath || mr_ep_allgather(&mine, gath, sizeof mine, 1800)) goto fail;
    for (int q = 0; q < R; q++)
        if (gath[q].rows) {
            if (!setup_rc) fprintf(stderr, "moerun bench moe [rank %d/%d]: rank %d failed to set up\n", me, R, q);
            rc = 1;
            goto out;
        }
    const size_t eb = mr_moe_weights_expert_bytes(w);
    if (lead) {
        printf("moerun bench moe, expert parallel: %d ranks (%s) x %d threads; runner %s, format %s, act-mode %s, E %d "
               "H %lld I %lld k %d, routing %s, tokens replicated on every rank\n",
               R, mr_ep_library(), threads, o->run->name, o->fmt_name, mr_act_mode_name(o->mode), o->E,
               (long long)o->H, (long long)o->I, o->k, o->skewed ? "skewed" : "uniform");
        printf("cpu: %s; kernels: %s; read bandwidth (rank 0 alone) %.1f GB/s; setup %.1f s\n", mr_cpu()->brand,
               mr_kernels_get()->isa, bw, (double)(mr_now_ns() - t0) * 1e-9);
        for (int q = 0; q < R; q++) {
            int f, n;
            mr_moe_placement_contiguous(o->E, R, q, &f, &n);
            printf("rank %d: experts %d..%d (%.2f GB of weights), peak RSS %.2f GB%s\n", q, f, f + n - 1,
                   (double)eb * n / 1e9, (double)all[q].rss / 1e9,
                   q == 0 && single ? " (with the one-process copy of every expert)" : "");
        }
        printf("\n%6s %22s %9s %6s | %-32s | %-32s | %7s | %-18s | %6s %s\n", "T", "step ms med [min-max]",
               single ? "1 proc ms" : "", single ? "EP/1p" : "", "dispatch KB  xfer/wait ms  MPI ms",
               "combine KB  xfer/wait ms  MPI ms", "gath ms", "rows max/mean bal", "a2a %", single ? "bits" : "");
    }
    uint64_t s = o->seed * 7 + 3;
    for (size_t i = 0; i < nx; i++) x[i] = (float)((double)(mr_bench_rng(&s) % 2001) / 1000.0 - 1.0);
    mr_routing ro = {.method = MR_ROUTING_MINIMAX2, .n_experts = o->E, .top_k = o->k, .scale = 1.0f};
    double t8_share = -1, worst_share = -1;
    for (int ti = 0; ti < o->nT && !rc; ti++) {
        const int64_t T = o->Ts[ti];
        mr_moe_args a = {.T = T, .x = x, .out = out, .ids = ids, .weights = wts, .routing = &ro, .logits = logits,
                         .replicated = true};
        mr_moe_args a1 = a;
        a1.out = out1;
        a1.replicated = false;
        double *step = v, *one = v + o->iters, *dx = v + 2 * o->iters, *dw = v + 3 * o->iters,
               *cx = v + 4 * o->iters, *cw = v + 5 * o->iters, *gx = v + 6 * o->iters;
        double rows_max = 0, rows_mean = 0, dkb = 0, ckb = 0;
        bool same = true;
        for (int it = -1; it < o->iters && !rc; it++) { /* it -1: the warm-up (pre-faults the buffers) */
            mr_bench_moe_routing(&s, o->skewed, T, o->E, o->k, ids, wts, NULL);
            /* the one-process call first in every other round: whichever runs second finds the same
             * experts' lines in the caches the first one left, and each side gets that in half the rounds */
            const bool one_first = (it & 1) != 0;
            if (single && one_first && one_process(ctx1, w1, &a1, lead, threads, R, it >= 0 ? &one[it] : NULL, &rc))
                goto fail;
            if (mr_ep_barrier(60)) goto fail;
            mr_moe_ctx_a2a_stats(ctx, NULL, true);
            uint64_t c0 = mr_now_ns();
            if (mr_moe_run(ctx, w, &a)) goto fail;
            mine = (call_rec){.step_ms = (double)(mr_now_ns() - c0) / 1e6};
            mr_a2a_stats as;
            mr_moe_ctx_a2a_stats(ctx, &as, false);
            mine.dispatch_ms = (double)as.dispatch_ns / 1e6;
            mine.combine_ms = (double)as.combine_ns / 1e6;
            mine.gather_ms = (double)as.gather_ns / 1e6;
            mine.rows = as.last_rows_recv;
            mine.dispatch_bytes = as.dispatch_bytes;
            mine.combine_bytes = as.combine_bytes;
            if (mr_ep_allgather(&mine, all, sizeof mine, 60)) goto fail;
            if (single && !one_first && one_process(ctx1, w1, &a1, lead, threads, R, it >= 0 ? &one[it] : NULL, &rc))
                goto fail;
            if (single && lead && memcmp(out, out1, (size_t)(T * o->H) * sizeof(float)) != 0) same = false;
            if (it < 0) continue;
            double smax = 0, dmin = 1e30, dmax = 0, cmin = 1e30, cmax = 0, gmin = 1e30, rmax = 0, rsum = 0;
            for (int q = 0; q < R; q++) {
                const call_rec *c = &all[q];
                smax = c->step_ms > smax ? c->step_ms : smax;
                dmin = c->dispatch_ms < dmin ? c->dispatch_ms : dmin;
                dmax = c->dispatch_ms > dmax ? c->dispatch_ms : dmax;
                cmin = c->combine_ms < cmin ? c->combine_ms : cmin;
                cmax = c->combine_ms > cmax ? c->combine_ms : cmax;
                gmin = c->gather_ms < gmin ? c->gather_ms : gmin;
                rmax = (double)c->rows > rmax ? (double)c->rows : rmax;
                rsum += (double)c->rows;
                dkb += (double)c->dispatch_bytes / 1e3 / R / o->iters;
                ckb += (double)c->combine_bytes / 1e3 / R / o->iters;
            }
            step[it] = smax, dx[it] = dmin, dw[it] = dmax, cx[it] = cmin, cw[it] = cmax, gx[it] = gmin;
            rows_max += rmax / o->iters;
            rows_mean += rsum / R / o->iters;
        }
        if (rc) break;
        /* MPI_Alltoallv alone on this T's message sizes (the last round's routing) */
        mr_a2a_stats as;
        mr_moe_ctx_a2a_stats(ctx, &as, false);
        message_sizes(ids, T, o->k, o->E, R, me, o->H, as.row_wire_bytes, sizes, sizes + R);
        double mpi_d = 0, mpi_c = 0;
        uint64_t bd = 0, bc = 0;
        if (mr_ep_probe_alltoallv(sizes, 20, &mpi_d, &bd) || mr_ep_probe_alltoallv(sizes + R, 20, &mpi_c, &bc))
            goto fail;
        double smin = 1e30, smx = 0;
        for (int i = 0; i < o->iters; i++) smin = step[i] < smin ? step[i] : smin, smx = step[i] > smx ? step[i] : smx;
        const double sm = median(step, o->iters), om = single ? median(one, o->iters) : 0, dxm = median(dx, o->iters),
                     dwm = median(dw, o->iters), cxm = median(cx, o->iters), cwm = median(cw, o->iters),
                     gxm = median(gx, o->iters);
        const double share = sm > 0 ? (dxm + cxm + gxm) / sm : 0, bal = rows_max > 0 ? rows_mean / rows_max : 1;
        if (T >= 8) {
            if (T == 8) t8_share = share;
            worst_share = share > worst_share ? share : worst_share;
        }
        if (lead) {
            char sp[32] = "", ratio[16] = "";
            if (single) snprintf(sp, sizeof sp, "%9.3f", om), snprintf(ratio, sizeof ratio, "%6.2f", om > 0 ? sm / om : 0);
            printf("%6lld %8.3f [%5.3f-%6.3f] %9s %6s | %9.1f %7.3f/%7.3f %7.3f | %9.1f %7.3f/%7.3f %7.3f | %7.3f | "
                   "%7.1f/%7.1f %4.2f | %5.1f%% %s\n",
                   (long long)T, sm, smin, smx, sp, ratio, dkb, dxm, dwm, mpi_d * 1e3, ckb, cxm, cwm, mpi_c * 1e3, gxm,
                   rows_max, rows_mean, bal, 100 * share, single ? (same ? "same" : "DIFFER") : "");
            fflush(stdout);
            json_t *jr = json_pack("{s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:b}",
                                   "tokens", (json_int_t)T, "step_ms", sm, "step_min_ms", smin, "step_max_ms", smx,
                                   "dispatch_kb_per_rank", dkb, "dispatch_ms", dxm, "dispatch_wait_ms", dwm,
                                   "mpi_alltoallv_dispatch_ms", mpi_d * 1e3, "combine_kb_per_rank", ckb, "combine_ms",
                                   cxm, "combine_wait_ms", cwm, "mpi_alltoallv_combine_ms", mpi_c * 1e3, "gather_ms",
                                   gxm, "rows_max", rows_max, "rows_mean", rows_mean, "transport_share", share,
                                   "bit_identical", single ? same : true);
            if (jr && single) {
                json_object_set_new(jr, "one_process_ms", json_real(om));
                json_object_set_new(jr, "ep_over_one_process", json_real(om > 0 ? sm / om : 0));
            }
            if (jr) json_array_append_new(jres, jr);
        }
        if (single && !same) rc = 1; /* the expert-parallel output must equal one process bit for bit */
        if (single && mr_ep_bcast(&rc, sizeof rc, 0, 60)) goto fail;
    }
    if (lead && !rc) {
        printf("\nthe project's target (transport <= 10%% of the layer's step at T >= 8, 2 ranks on one machine):\n");
        if (worst_share >= 0)
            printf("  transport share of the step: %.1f%% at T=8, at most %.1f%% over T >= 8 with %d ranks%s\n",
                   100 * t8_share, 100 * worst_share, R,
                   R != 2 ? " (the target is stated for 2 ranks)" : worst_share <= 0.10 ? "" : "  NOT MET");
        else
            printf("  not measured (no T >= 8 in --tokens)\n");
        printf("  (xfer: the fastest rank's exchange time, i.e. the transfer; wait: the slowest rank's, which adds\n"
               "   the time it waited for the others to arrive; MPI: MPI_Alltoallv alone on the same messages)\n");
    }
    if (lead && !rc && o->json_path) {
        char date[32];
        time_t now = time(NULL);
        strftime(date, sizeof date, "%Y-%m-%d %H:%M", localtime(&now));
        json_t *root = json_pack("{s:s, s:s, s:i, s:i, s:s, s:s, s:s, s:i, s:I, s:I, s:i, s:s, s:O}", "bench", "moe_ep",
                                 "date", date, "ranks", R, "threads_per_rank", threads, "runner", o->run->name,
                                 "format", o->fmt_name, "act_mode", mr_act_mode_name(o->mode), "experts", o->E,
                                 "hidden", (json_int_t)o->H, "inter", (json_int_t)o->I, "topk", o->k, "mpi",
                                 mr_ep_library(), "results", jres);
        if (root) {
            json_object_set_new(root, "cpu", json_string(mr_cpu()->brand));
            json_object_set_new(root, "read_bw_gb_per_s", json_real(bw));
            json_object_set_new(root, "transport_share_max_t8plus", json_real(worst_share));
        }
        if (mr_bench_json_write(root, o->json_path)) {
            fprintf(stderr, "moerun bench moe: cannot write %s\n", o->json_path);
            rc = 1;
        }
        json_decref(root);
    }
    goto out;
fail:
    mr_cli_fail("bench moe", "expert-parallel run failed");
    rc = 1;
out:
    json_decref(jres);
    free(x), free(out), free(out1), free(ids), free(wts), free(logits), free(all), free(v), free(sizes);
    mr_moe_ctx_free(ctx);
    mr_moe_ctx_free(ctx1);
    mr_moe_weights_free(w);
    mr_moe_weights_free(w1);
    return rc;
}
