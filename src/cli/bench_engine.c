/* bench_engine.c — `moerun bench engine`: decode steps of B requests at once
 * through the engine (scheduler, paged KV, sampling) on a real checkpoint,
 * for each B of --batch. Per B and round: B requests with distinct random
 * prompts are admitted and prefilled (not timed), then --warmup decode steps,
 * then --steps timed decode steps of exactly B decode tokens each.
 *
 * Reported per B (median over the rounds, with the range):
 *   the prefill time of the B prompts (the steps from the first until every
 *   request decodes; the requests prefilled first decode meanwhile, counted
 *   as prefill_decode_tokens), which with the step time predicts a serving
 *   run of B requests at once (bench/serve-vs-engine.sh);
 *   decode tokens/s, step time, its split into attention, MoE, other
 *   (model time: norms, embedding, residuals, lm_head), scheduling (the
 *   engine's schedule + completion bookkeeping) and sampling, and the
 *   scheduling overhead as a fraction of the step (the project's target:
 *   <= 2%);
 *   the ceiling: weight and KV bytes one step reads (attention projections,
 *   router, lm_head, the distinct experts the step's tokens routed to, the K
 *   and V of every context) over the step time, against the read bandwidth
 *   measured in the same run (1 GiB probe, before and after; the higher);
 *   the CPU share the process got during the timed steps (CPU time over
 *   wall time x threads): below 100% when parts of the step run on one
 *   thread (small work) or, on a shared host, when other processes took the
 *   cores; every time above stretches with the latter. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "bench_util.h"
#include "cli.h"
#include "cli_model.h"
#include "moerun/config.h"
#include "moerun/engine.h"
#include "moerun/kernels.h"
#include "moerun/model.h"

#define MAX_B 16
#define SCHED_TARGET 0.02

static void usage(FILE *f) {
    fprintf(f,
            "usage: moerun bench engine --model DIR [--batch 1,16,64,128] [--prompt N] [--steps N] [--warmup N]\n"
            "                           [--rounds N] [--seed S] [--json FILE] [sampling options] [resolver options]\n\n"
            "Decode steps of B requests at once through the engine, for each B of --batch (default\n"
            "1,16,64,128): requests with distinct random prompts of --prompt tokens (default 32) are\n"
            "prefilled (not timed), then --warmup (default 2) and --steps (default 16) timed decode steps,\n"
            "--rounds times (default 3). Prints decode tokens/s, the step time split (attention, MoE, other,\n"
            "scheduling, sampling), the scheduling overhead as a fraction of the step (target <= 2%%), and\n"
            "the bytes a step reads against the read bandwidth measured in the same run.\n"
            "Resolver options apply (--kv-cache-dtype, --threads, --moe-runner-backend, ...); unless given,\n"
            "max_running_requests is the largest B and context_length what the run needs.\n"
            "Sampling options, as in moerun generate: --temperature T (default 0: greedy), --top-k K, --top-p P,\n"
            "--min-p P, --repetition-penalty R, --presence-penalty P, --frequency-penalty F. Every request\n"
            "samples with them, from its own seed (--seed S, which also draws the prompts, + its index).\n"
            "Over a large vocabulary the sampling column is what they cost.\n\n");
}

typedef struct {
    double tok_s, step_ms, attn, moe, other, sched, sample, gbps, bytes, sched_us;
    double prefill_ms;      /* the steps until every request decodes (the B prompts' prefill, chunked) */
    double prefill_decodes; /* decode tokens those steps ran for the requests already prefilled */
    double cpu; /* CPU time the process got during the timed steps / (wall x threads): below 1 on a busy host */
} round_res;

static double cpu_s(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru)) return 0.0;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
           1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

static int cmp_d(const void *a, const void *b) { return mr_bench_cmp_double(a, b); }

static double median_of(const round_res *r, int n, size_t field, double *lo, double *hi) {
    double v[64];
    for (int i = 0; i < n; i++) v[i] = *(const double *)((const char *)&r[i] + field);
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    *lo = v[0];
    *hi = v[n - 1];
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One round for batch size B: admit, prefill, warm up, time. 0 on success. */
static int one_round(mr_engine *e, int B, int64_t prompt, int steps, int warmup, int threads, uint64_t *seed,
                     const mr_sampling *sp, const mr_model_weight_bytes *wb, size_t kv_tok, round_res *out) {
    mr_model *m = mr_engine_model(e);
    const mr_model_config *c = mr_model_config_of(m);
    int32_t *p = malloc((size_t)prompt * sizeof(int32_t));
    if (!p) return 1;
    mr_req_id *ids = malloc((size_t)B * sizeof(mr_req_id));
    if (!ids) {
        free(p);
        return 1;
    }
    int rc = 0;
    for (int i = 0; i < B && !rc; i++) {
        for (int64_t j = 0; j < prompt; j++) p[j] = (int32_t)(mr_bench_rng(seed) % (uint64_t)c->vocab);
        /* up to the context (the first ones decode while the last are prefilled); cancelled at the end */
        mr_request_params rp = {.prompt = p, .n_prompt = prompt, .max_tokens = 0, .ignore_eos = true, .sampling = *sp};
        rp.sampling.seed += (uint64_t)i;
        if (mr_engine_add(e, &rp, &ids[i])) {
            mr_cli_fail("bench engine", NULL);
            rc = 1;
        }
    }
    free(p);
    /* prefill until every request decodes, then the warm-up steps */
    const mr_engine_step_out *so;
    int decoding = 0;
    uint64_t p0 = mr_now_ns();
    out->prefill_ms = 0;
    out->prefill_decodes = 0;
    for (int guard = 0; !rc && decoding < warmup; guard++) {
        if (guard > 1 << 20 || mr_engine_step(e, &so)) {
            rc = 1;
        } else if (so->n_prefill_tokens == 0 && so->n_decode_tokens == B) {
            decoding++;
        } else if (decoding == 0) { /* a step with prefill in it: each prompt's last one samples its first token */
            out->prefill_decodes += (double)so->n_decode_tokens;
            out->prefill_ms = (double)(mr_now_ns() - p0) * 1e-6;
        }
    }
    /* the timed steps */
    mr_model_timing t0, t1;
    mr_engine_stats s0, s1;
    mr_model_timing_get(m, &t0);
    mr_engine_stats_get(e, &s0);
    double c0 = cpu_s();
    uint64_t w0 = mr_now_ns();
    for (int i = 0; i < steps && !rc; i++) {
        if (mr_engine_step(e, &so)) {
            rc = 1;
        } else if (so->n_decode_tokens != B || so->n_prefill_tokens != 0) {
            fprintf(stderr, "moerun bench engine: a timed step held %lld decode and %lld prefill tokens, not %d decodes\n",
                    (long long)so->n_decode_tokens, (long long)so->n_prefill_tokens, B);
            rc = 1;
        }
    }
    double wall = (double)(mr_now_ns() - w0) * 1e-9;
    out->cpu = (cpu_s() - c0) / (wall * threads);
    mr_model_timing_get(m, &t1);
    mr_engine_stats_get(e, &s1);
    /* the rest goes: cancel, one step frees everything */
    for (int i = 0; i < B; i++) (void)mr_engine_cancel(e, ids[i]);
    while (mr_engine_has_work(e) && !mr_engine_step(e, &so)) {
    }
    free(ids);
    if (rc) return rc;
    double ns = wall * 1e9;
    out->tok_s = (double)B * steps / wall;
    out->step_ms = wall * 1e3 / steps;
    out->attn = (double)(t1.attention_ns - t0.attention_ns) / ns;
    out->moe = (double)(t1.moe_ns - t0.moe_ns) / ns;
    out->other = (double)(t1.other_ns - t0.other_ns) / ns;
    out->sched = (double)((s1.schedule_ns - s0.schedule_ns) + (s1.complete_ns - s0.complete_ns)) / ns;
    out->sample = (double)(s1.sample_ns - s0.sample_ns) / ns;
    out->sched_us = out->sched * ns * 1e-3 / steps;
    /* bytes read per step: the dense weights, the experts touched, the K and V of every context */
    double ctx = (double)prompt + warmup + 1 + (steps - 1) / 2.0; /* mean positions attended */
    double bytes = (double)(wb->attn + wb->router + wb->lm_head) +
                   (double)(t1.experts_touched - t0.experts_touched) / steps * (double)wb->expert +
                   (double)B * ctx * (double)kv_tok;
    out->bytes = bytes;
    out->gbps = bytes / (wall / steps) * 1e-9;
    return 0;
}

int mr_bench_engine(int argc, char **argv) {
    const char *cmd = "bench engine";
    mr_options o;
    if (mr_options_init(&o) != MR_OK) return 1;
    int rc = 2;
    mr_resolution *r = NULL;
    mr_model *m = NULL;
    mr_engine *e = NULL;
    json_t *jres = NULL;
    const char *batches = "1,16,64,128", *json_path = NULL;
    long prompt = 32, steps = 16, warmup = 2, rounds = 3;
    mr_sampling sp = {.top_p = 1.0f, .seed = 1}; /* --seed: the prompts' and the sampling's */
    if (mr_options_parse(&o, &argc, argv, true) != MR_OK) {
        mr_cli_fail(cmd, NULL);
        goto out;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int sf = mr_cli_sampling_flag(argc, argv, &i, MR_CLI_SAMPLING_ALL, &sp);
        if (sf == MR_CLI_FLAG_BAD || sf == MR_CLI_FLAG_NO_VALUE) {
            fprintf(stderr, "moerun bench engine: %s: %s\n", a, sf == MR_CLI_FLAG_BAD ? mr_error_last() : "needs a value");
            goto out;
        }
        if (sf == MR_CLI_FLAG_TAKEN) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            rc = 0;
            goto out;
        } else if (v && !strcmp(a, "--batch")) {
            batches = argv[++i];
        } else if (v && !strcmp(a, "--prompt")) {
            if (mr_bench_num(a, argv[++i], 1, 1 << 20, &prompt)) goto out;
        } else if (v && !strcmp(a, "--steps")) {
            if (mr_bench_num(a, argv[++i], 1, 100000, &steps)) goto out;
        } else if (v && !strcmp(a, "--warmup")) {
            if (mr_bench_num(a, argv[++i], 1, 100000, &warmup)) goto out;
        } else if (v && !strcmp(a, "--rounds")) {
            if (mr_bench_num(a, argv[++i], 1, 64, &rounds)) goto out;
        } else if (v && !strcmp(a, "--json")) {
            json_path = argv[++i];
        } else {
            fprintf(stderr, "moerun bench engine: unknown or incomplete option '%s' (see --help)\n", a);
            goto out;
        }
    }
    if (!mr_options_get(&o, MR_OPT_MODEL)[0]) {
        fprintf(stderr, "moerun bench engine: --model DIR is required (see --help)\n");
        goto out;
    }
    int64_t Bs[MR_BENCH_MAX_TS];
    int nB = 0;
    if (mr_bench_parse_tokens(batches, 65536, Bs, &nB)) {
        fprintf(stderr, "moerun bench engine: bad --batch list '%s' (at most %d comma-separated B in 1..65536)\n",
                batches, MR_BENCH_MAX_TS);
        goto out;
    }
    if (json_path && mr_bench_json_check(json_path)) {
        fprintf(stderr, "moerun bench engine: cannot write --json %s\n", json_path);
        goto out;
    }
    int64_t maxB = 0;
    for (int i = 0; i < nB; i++)
        if (Bs[i] > maxB) maxB = Bs[i];
    char v[32];
    if (!mr_options_is_explicit(&o, MR_OPT_MAX_RUNNING_REQUESTS)) {
        snprintf(v, sizeof v, "%lld", (long long)maxB);
        mr_options_set(&o, "max_running_requests", v, MR_SRC_FLAG);
    }
    /* the context: the prompt, the tokens decoded while the other requests of
     * the round are prefilled (budget-long steps), the warm-up and timed steps */
    if (!mr_options_is_explicit(&o, MR_OPT_CONTEXT_LENGTH)) {
        long bt = mr_options_is_explicit(&o, MR_OPT_MAX_BATCH_TOKENS) ? (long)mr_options_get_int(&o, MR_OPT_MAX_BATCH_TOKENS)
                                                                        : 0;
        if (bt <= 0) bt = maxB > 512 ? (long)maxB : 512; /* the resolver's default */
        long prefill_steps = (long)((maxB * prompt + bt - 1) / bt);
        snprintf(v, sizeof v, "%ld", prompt + prefill_steps + warmup + steps + 4);
        mr_options_set(&o, "context_length", v, MR_SRC_FLAG);
    }
    if (mr_cli_resolve(cmd, &o, false, &r)) goto out;
    const mr_exec *x = mr_resolution_exec(r);
    rc = 1;
    /* the ceiling, before the model takes memory bandwidth for loading */
    double bw0 = mr_probe_read_bw((size_t)1 << 30, 5);
    uint64_t tl = mr_now_ns();
    if (mr_cli_engine_open(cmd, mr_options_get(&o, MR_OPT_MODEL), x, true, (int)maxB, &m, &e)) goto out;
    const mr_model_config *c = mr_model_config_of(m);
    const mr_engine_opts *eo = mr_engine_opts_of(e);
    if (eo->max_running_requests < maxB) {
        fprintf(stderr, "moerun bench engine: the engine runs at most %d requests at once (B up to %lld asked)\n",
                eo->max_running_requests, (long long)maxB);
        rc = 2;
        goto out;
    }
    mr_model_weight_bytes wb;
    mr_model_weight_bytes_get(m, &wb);
    size_t kv_tok = mr_model_kv_token_bytes(c, eo->kv_dtype);
    printf("loaded in %.1f s: %lld layers, hidden %lld, %lld experts top-%lld, vocab %lld, runner %s (%s), kernels %s\n",
           (double)(mr_now_ns() - tl) * 1e-9, (long long)c->n_layers, (long long)c->hidden, (long long)c->n_experts,
           (long long)c->top_k, (long long)c->vocab, mr_model_runner_name(m), mr_act_mode_name(mr_model_act_mode(m)),
           mr_kernels_get()->isa);
    mr_cli_print_kv(e);
    printf("weights read per step: attention %.1f MiB, router %.1f MiB, lm_head %.1f MiB, + %.2f MiB per expert "
           "touched; KV %zu bytes per token attended\n",
           (double)wb.attn / 1048576.0, (double)wb.router / 1048576.0, (double)wb.lm_head / 1048576.0,
           (double)wb.expert / 1048576.0, kv_tok);
    printf("runs: prompt %ld tokens, %ld warm-up + %ld timed decode steps, %ld rounds per B, %d threads\n", prompt,
           warmup, steps, rounds, x->threads);
    round_res res[MAX_B][64];
    uint64_t sd = sp.seed * 0x9E3779B97F4A7C15ull + 7;
    for (int round = 0; round < rounds; round++) /* rounds outside, B inside: drift hits every B alike */
        for (int b = 0; b < nB; b++)
            if (one_round(e, (int)Bs[b], prompt, (int)steps, (int)warmup, x->threads, &sd, &sp, &wb, kv_tok,
                          &res[b][round])) {
                mr_cli_fail(cmd, "a round failed");
                goto out;
            }
    double bw1 = mr_probe_read_bw((size_t)1 << 30, 5), bw = bw0 > bw1 ? bw0 : bw1;
    printf("ceiling (this run): read bandwidth %.1f GB/s before, %.1f GB/s after (%d threads, 1 GiB)\n\n", bw0, bw1,
           x->threads);
    printf("%5s %22s %22s %9s %6s %6s %6s %7s %8s %9s %10s %6s %5s\n", "B", "decode tok/s", "step ms", "attention",
           "moe", "other", "sample", "sched", "sched us", "sched max", "bytes/step", "of bw", "cpu");
    printf("%5s %22s %22s %9s %6s %6s %6s %7s %8s %9s\n", "", "median (range)", "median (range)", "", "", "", "",
           "median", "median", "(<= 2%)");
    jres = json_array();
    bool met = true;
    double pf_line[MAX_B], pf_lo[MAX_B], pf_hi[MAX_B];
    for (int b = 0; b < nB; b++) {
        const round_res *rr = res[b];
        int n = (int)rounds;
        double lo, hi, tl_, th, sl, sh, gl, gh, d;
        double tok = median_of(rr, n, offsetof(round_res, tok_s), &tl_, &th);
        double ms = median_of(rr, n, offsetof(round_res, step_ms), &lo, &hi);
        double at = median_of(rr, n, offsetof(round_res, attn), &d, &d);
        double mo = median_of(rr, n, offsetof(round_res, moe), &d, &d);
        double ot = median_of(rr, n, offsetof(round_res, other), &d, &d);
        double sa = median_of(rr, n, offsetof(round_res, sample), &d, &d);
        double sc = median_of(rr, n, offsetof(round_res, sched), &sl, &sh);
        double gb = median_of(rr, n, offsetof(round_res, gbps), &gl, &gh);
        double by = median_of(rr, n, offsetof(round_res, bytes), &d, &d);
        double cp = median_of(rr, n, offsetof(round_res, cpu), &d, &d);
        double su = median_of(rr, n, offsetof(round_res, sched_us), &d, &d);
        double pl, ph;
        double pf = median_of(rr, n, offsetof(round_res, prefill_ms), &pl, &ph);
        double pd = median_of(rr, n, offsetof(round_res, prefill_decodes), &d, &d);
        met = met && sh <= SCHED_TARGET; /* every round */
        char tr[48], mr[48];
        snprintf(tr, sizeof tr, "%.1f (%.1f-%.1f)", tok, tl_, th);
        snprintf(mr, sizeof mr, "%.2f (%.2f-%.2f)", ms, lo, hi);
        printf("%5lld %22s %22s %8.1f%% %5.1f%% %5.1f%% %5.2f%% %6.3f%% %8.1f %8.3f%% %6.0f MiB %5.1f%% %4.0f%%\n",
               (long long)Bs[b], tr, mr, 100 * at, 100 * mo, 100 * ot, 100 * sa, 100 * sc, su, 100 * sh,
               by / 1048576.0, 100 * gb / bw, 100 * cp);
        json_t *jb = json_pack("{s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "B",
                               (json_int_t)Bs[b], "decode_tok_per_s", tok, "decode_tok_per_s_min", tl_,
                               "decode_tok_per_s_max", th, "step_ms_min", lo, "step_ms_max", hi, "attention", at,
                               "moe", mo, "other", ot, "sampling", sa, "scheduling", sc, "scheduling_min", sl,
                               "scheduling_max", sh, "bytes_per_step", by, "read_gb_per_s", gb);
        if (jb) json_object_set_new(jb, "cpu_share", json_real(cp));
        if (jb) json_object_set_new(jb, "scheduling_us_per_step", json_real(su));
        if (jb) json_object_set_new(jb, "prefill_ms", json_real(pf));
        if (jb) json_object_set_new(jb, "prefill_ms_min", json_real(pl));
        if (jb) json_object_set_new(jb, "prefill_ms_max", json_real(ph));
        if (jb) json_object_set_new(jb, "prefill_decode_tokens", json_real(pd));
        pf_line[b] = pf, pf_lo[b] = pl, pf_hi[b] = ph;
        if (jb) json_array_append_new(jres, jb);
    }
    printf("\nprefill of the B prompts (the steps until every request decodes, chunked), median (range):");
    for (int b = 0; b < nB; b++)
        printf("%s B %lld %.1f ms (%.1f-%.1f)", b ? "," : "", (long long)Bs[b], pf_line[b], pf_lo[b], pf_hi[b]);
    printf("\n");
    printf("\nscheduling overhead (schedule + completion bookkeeping, sampling apart) <= 2%% of the step in every "
           "round: %s\n",
           met ? "met at every B" : "NOT met at every B");
    if (json_path) {
        json_t *root = json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:i, s:f, s:f, s:O}", "bench", "engine",
                                 "model", mr_options_get(&o, MR_OPT_MODEL), "runner", mr_model_runner_name(m),
                                 "kv_dtype", mr_kv_dtype_name(eo->kv_dtype), "prompt",
                                 (json_int_t)prompt, "steps", (json_int_t)steps, "warmup", (json_int_t)warmup,
                                 "rounds", (json_int_t)rounds, "threads", x->threads, "read_bw_gb_per_s", bw0,
                                 "read_bw_end_gb_per_s", bw1, "results", jres);
        json_t *js = json_pack("{s:f, s:i, s:f, s:f, s:f, s:f, s:f, s:I}", "temperature", (double)sp.temperature,
                               "top_k", sp.top_k, "top_p", (double)sp.top_p, "min_p", (double)sp.min_p,
                               "repetition_penalty", (double)sp.repetition_penalty, "presence_penalty",
                               (double)sp.presence_penalty, "frequency_penalty", (double)sp.frequency_penalty, "seed",
                               (json_int_t)sp.seed);
        if (root && js) json_object_set_new(root, "sampling", js);
        else json_decref(js);
        if (!root || mr_bench_json_write(root, json_path)) {
            fprintf(stderr, "moerun bench engine: cannot write %s\n", json_path);
            json_decref(root);
            goto out;
        }
        json_decref(root);
    }
    rc = 0;
out:
    json_decref(jres);
    mr_engine_free(e);
    mr_model_close(m);
    mr_resolution_free(r);
    mr_options_free(&o);
    return rc;
}
