/* cmd_probe.c — `moerun probe`: the temperature-0 correctness probe.
 *
 * The same seeded prompts go through the engine (fp32 KV unless
 * --kv-cache-dtype says otherwise) with the reference runner, which produces
 * the greedy token stream; every other runner that the resolver accepts for
 * the model is then run teacher-forced on that stream (so that every step's
 * logits are comparable) and compared with the reference: per-step max
 * |logit error|, top-1 agreement, first divergent position. A runner fails
 * when its logit error exceeds the tolerance, or when it picks another top-1
 * token where the reference's margin is larger than the tolerance (a
 * disagreement the numerics cannot explain).
 *
 * --against DIR2 compares two checkpoints of the same model (e.g. bf16 and
 * its FP8 quantization), each with its resolved runner, on DIR's greedy
 * stream, and reports without failing: quantization legitimately changes
 * tokens. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "cli.h"
#include "cli_ep.h"
#include "cli_model.h"
#include "moerun/config.h"
#include "moerun/engine.h"
#include "moerun/model.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: moerun probe --model DIR [--prompts N] [--steps N] [--seed S] [--tol R] [--against DIR2]\n"
            "                    [--explain] [resolver options]\n\n"
            "Temperature-0 probe: N seeded prompts (default 4) and N greedy steps (default 16) through every\n"
            "runner that accepts the model, teacher-forced on the reference runner's tokens and compared\n"
            "with it. Exit 1 when a runner's max |logit error| exceeds R * max(1, max|reference logit|)\n"
            "(R defaults by weight format: bf16 1e-3, fp8 2e-2, nvfp4 5e-2) or when it disagrees on a top-1\n"
            "token the reference holds by more than that. --against DIR2 compares two checkpoints and\n"
            "only reports. --tol 0 demands exact agreement. --explain prints the resolution story of DIR\n"
            "first.\n\n");
    mr_options_print_help(f);
}

typedef struct {
    int n;             /* prompts */
    int steps;         /* decode steps after the prefill */
    int64_t V;
    int32_t *ids;      /* prompts, concatenated */
    int64_t *len;      /* [n] */
    int32_t *tokens;   /* [steps + 1][n] greedy tokens of the leader (row s: chosen after step s) */
} probe_set;

/* Runs the prompts through engine e: every prompt a request (greedy, no
 * EOS stop), prefill then `steps` more tokens. With follow == false it picks
 * its own greedy tokens into ps->tokens; otherwise it is fed ps->tokens
 * (teacher forcing). logits [steps + 1][n][V]: row s of prompt i is the one
 * that chose its token s. */
static int run_leader(mr_engine *e, probe_set *ps, bool follow, float *logits) {
    int n = ps->n;
    int64_t off = 0;
    int32_t *forced = NULL;
    if (follow && !(forced = malloc((size_t)(ps->steps + 1) * sizeof(int32_t)))) return 1;
    for (int i = 0; i < n; i++) {
        mr_request_params rp = {.prompt = ps->ids + off, .n_prompt = ps->len[i], .max_tokens = ps->steps + 1,
                                .ignore_eos = true, .want_logits = true, .user = (void *)(intptr_t)i};
        if (follow) { /* the leader's tokens of prompt i (a column of ps->tokens) */
            for (int s = 0; s <= ps->steps; s++) forced[s] = ps->tokens[s * n + i];
            rp.forced = forced;
            rp.n_forced = ps->steps + 1;
        }
        mr_req_id id;
        off += ps->len[i];
        if (mr_engine_add(e, &rp, &id)) { /* the forced tokens are copied */
            free(forced);
            return 1;
        }
    }
    free(forced);
    int rc = 0;
    while (mr_engine_has_work(e)) {
        const mr_engine_step_out *so;
        if (mr_engine_step(e, &so)) return 1;
        for (int k = 0; k < so->n_events; k++) {
            const mr_engine_event *v = &so->events[k];
            int i = (int)(intptr_t)v->user;
            if (v->finish == MR_FINISH_ERROR) {
                fprintf(stderr, "moerun probe: prompt %d: %s\n", i, v->error);
                rc = 1;
            }
            if (!v->n_tokens) continue;
            int64_t s = v->n_generated - 1;
            memcpy(logits + ((size_t)s * (size_t)n + (size_t)i) * (size_t)ps->V, v->logits,
                   (size_t)ps->V * sizeof(float));
            if (!follow) ps->tokens[s * n + i] = v->token;
        }
    }
    return rc;
}

/* One model's run. Under expert parallelism rank 0 owns the requests (run_leader) and the other
 * ranks run its steps until it is done; only rank 0 has the logits (it compares and prints). */
static int run_model(mr_engine *e, probe_set *ps, bool follow, float *logits) {
    int rc = 0;
    if (mr_cli_ep_multi() && mr_ep_rank() > 0) {
        if (mr_engine_follow(e) != MR_OK) {
            mr_cli_fail("probe", "expert-parallel step failed");
            rc = 1;
        }
    } else {
        rc = run_leader(e, ps, follow, logits);
        if (mr_engine_ep_stop(e) && !rc) rc = 1;
    }
    return mr_cli_ep_agree("probe", "a run", rc); /* the leader's failure is everyone's */
}

static void close_run(mr_engine *e) {
    if (!e) return;
    mr_model *m = mr_engine_model(e);
    mr_engine_free(e);
    mr_model_close(m);
}

typedef struct {
    double max_err, scale;
    int agree, total, first_step, first_prompt, bad_flips;
    double *step_err; /* [steps + 1] */
} probe_cmp;

static void compare(const probe_set *ps, const float *ref, const float *got, double tol_rel, probe_cmp *c) {
    int n = ps->n;
    int64_t V = ps->V;
    c->max_err = 0;
    c->scale = 1.0;
    c->agree = c->total = c->bad_flips = 0;
    c->first_step = c->first_prompt = -1;
    for (size_t i = 0; i < (size_t)(ps->steps + 1) * (size_t)n * (size_t)V; i++)
        if (fabs(ref[i]) > c->scale) c->scale = fabs(ref[i]);
    double tol = tol_rel * c->scale;
    for (int s = 0; s <= ps->steps; s++) {
        c->step_err[s] = 0;
        for (int i = 0; i < n; i++) {
            const float *r = ref + ((size_t)s * (size_t)n + (size_t)i) * (size_t)V;
            const float *g = got + ((size_t)s * (size_t)n + (size_t)i) * (size_t)V;
            for (int64_t v = 0; v < V; v++) {
                double d = fabs((double)r[v] - (double)g[v]);
                if (!(d <= c->step_err[s])) c->step_err[s] = d; /* NaN counts as infinite */
            }
            int32_t tr = mr_argmax(r, V), tg = mr_argmax(g, V);
            c->total++;
            if (tr == tg) {
                c->agree++;
            } else {
                if (c->first_step < 0 || s < c->first_step) {
                    c->first_step = s;
                    c->first_prompt = i;
                }
                if ((double)r[tr] - (double)r[tg] > tol) c->bad_flips++;
            }
        }
        if (!(c->step_err[s] <= c->max_err)) c->max_err = c->step_err[s];
    }
}

static void print_cmp(const char *label, const probe_set *ps, const probe_cmp *c, double tol_rel, bool judge,
                      bool *pass) {
    double tol = tol_rel * c->scale;
    bool ok = c->max_err <= tol && c->bad_flips == 0;
    printf("%s: max |logit err| %.3g", label, c->max_err);
    if (judge)
        printf(" (tol %.3g = %.0e x %.3g)", tol, tol_rel, c->scale);
    else
        printf(" (max |logit| %.3g; report only)", c->scale);
    printf(", top-1 agreement %d/%d (%.1f%%), first divergent token: ", c->agree, c->total,
           100.0 * c->agree / (c->total ? c->total : 1));
    if (c->first_step < 0)
        printf("none");
    else
        printf("prompt %d step %d", c->first_prompt, c->first_step);
    if (judge) printf("  %s", ok ? "PASS" : "FAIL");
    printf("\n  per-step max err:");
    for (int s = 0; s <= ps->steps; s++) printf(" %.2g", c->step_err[s]);
    printf("\n");
    if (judge && !ok) *pass = false;
}

static double default_tol(mr_format f) {
    return f == MR_FMT_NVFP4 ? 5e-2 : f == MR_FMT_FP8_BLOCK ? 2e-2 : 1e-3;
}

/* Resolves o with runner forced (NULL: as given) and opens the model with
 * its engine. Unless given: the KV cache in fp32 (the probe compares
 * runners, not KV rounding), a context of the longest prompt + steps, room
 * for every prompt at once. */
static int open_with(const mr_options *base, const char *model_dir, const char *runner, const probe_set *ps,
                     mr_resolution **r, mr_engine **e, bool quiet_fail) {
    mr_options o;
    if (mr_options_init(&o)) return 1;
    for (int i = 0; i < MR_OPT_COUNT; i++)
        if (mr_options_is_explicit(base, (mr_opt_id)i)) mr_options_set(&o, mr_option_at(i)->name, base->value[i], base->source[i]);
    mr_options_set(&o, "model", model_dir, MR_SRC_FLAG);
    if (runner) mr_options_set(&o, "moe_runner_backend", runner, MR_SRC_FLAG);
    int64_t longest = 0;
    for (int i = 0; i < ps->n; i++)
        if (ps->len[i] > longest) longest = ps->len[i];
    char v[32];
    if (!mr_options_is_explicit(base, MR_OPT_KV_CACHE_DTYPE)) mr_options_set(&o, "kv_cache_dtype", "fp32", MR_SRC_FLAG);
    snprintf(v, sizeof v, "%lld", (long long)(longest + ps->steps + 1));
    if (!mr_options_is_explicit(base, MR_OPT_CONTEXT_LENGTH)) mr_options_set(&o, "context_length", v, MR_SRC_FLAG);
    snprintf(v, sizeof v, "%d", ps->n);
    if (!mr_options_is_explicit(base, MR_OPT_MAX_RUNNING_REQUESTS)) mr_options_set(&o, "max_running_requests", v, MR_SRC_FLAG);
    *r = NULL;
    *e = NULL;
    int rc = 0;
    if (mr_resolve(&o, r) != MR_OK || mr_exec_apply(mr_resolution_exec(*r)) != MR_OK) {
        if (!quiet_fail) mr_cli_fail("probe", "resolution failed");
        rc = 2;
    }
    rc = mr_cli_ep_agree("probe", "resolution", rc); /* every rank of an expert-parallel run, the same answer */
    if (!rc) {
        mr_model *m = NULL;
        if (mr_cli_engine_open("probe", model_dir, mr_resolution_exec(*r), false, ps->n, &m, e)) rc = 1;
    }
    mr_options_free(&o);
    return rc;
}

int mr_cmd_probe(int argc, char **argv) {
    mr_options o;
    if (mr_options_init(&o) != MR_OK) return 1;
    int rc = 2;
    long n_prompts = 4, steps = 16, seed = 1;
    float tol_flag = -1.0f; /* unset: the format's default; 0 demands exact agreement */
    const char *against = NULL, *flag = "probe";
    bool explain = false;
    probe_set ps = {0};
    float *ref = NULL, *got = NULL;
    double *step_err = NULL;
    mr_resolution *rr = NULL;
    mr_engine *mref = NULL;
    if (mr_options_parse(&o, &argc, argv, true) != MR_OK) {
        mr_cli_fail("probe", NULL);
        goto out;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        flag = a;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            rc = 0;
            goto out;
        } else if (v && !strcmp(a, "--prompts")) {
            if (mr_cli_parse_long(argv[++i], 1, 64, &n_prompts)) goto bad;
        } else if (v && !strcmp(a, "--steps")) {
            if (mr_cli_parse_long(argv[++i], 0, 4096, &steps)) goto bad;
        } else if (v && !strcmp(a, "--seed")) {
            if (mr_cli_parse_long(argv[++i], 0, INT32_MAX, &seed)) goto bad;
        } else if (v && !strcmp(a, "--tol")) {
            if (mr_cli_parse_float(argv[++i], 0.0f, 1e6f, &tol_flag)) goto bad;
        } else if (!strcmp(a, "--explain")) {
            explain = true;
        } else if (v && !strcmp(a, "--against")) {
            against = argv[++i];
        } else if (!v && (!strcmp(a, "--prompts") || !strcmp(a, "--steps") || !strcmp(a, "--seed") ||
                          !strcmp(a, "--tol") || !strcmp(a, "--against"))) {
            fprintf(stderr, "moerun probe: %s needs a value\n", a);
            goto out;
        } else {
            fprintf(stderr, "moerun probe: unknown argument '%s' (see --help)\n", a);
            goto out;
        }
    }
    const char *model_dir = mr_options_get(&o, MR_OPT_MODEL);
    if (!model_dir[0]) {
        fprintf(stderr, "moerun probe: --model DIR is required (see --help)\n");
        goto out;
    }
    /* the reference (or, with --against, DIR as resolved): resolution first */
    mr_model_desc d;
    memset(&d, 0, sizeof d);
    if (mr_model_desc_load(model_dir, &d)) {
        mr_cli_fail("probe", "cannot read the model description");
        goto out;
    }
    ps.V = d.vocab;
    mr_model_desc_free(&d);
    ps.n = (int)n_prompts;
    ps.steps = (int)steps;
    ps.len = calloc((size_t)ps.n, sizeof(int64_t));
    int64_t total = 0;
    for (int i = 0; i < ps.n; i++) total += ps.len[i] = 3 + (i * 5) % 9;
    ps.ids = malloc((size_t)total * sizeof(int32_t));
    ps.tokens = malloc((size_t)(ps.steps + 1) * (size_t)ps.n * sizeof(int32_t));
    step_err = malloc((size_t)(ps.steps + 1) * sizeof(double));
    if (!ps.len || !ps.ids || !ps.tokens || !step_err) {
        fprintf(stderr, "moerun probe: out of memory\n");
        rc = 1;
        goto out;
    }
    uint64_t s = (uint64_t)seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < total; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        ps.ids[i] = (int32_t)((s >> 33) % (uint64_t)ps.V);
    }
    const mr_moe_runner *truth = mr_moe_runner_ground_truth();
    if ((rc = open_with(&o, model_dir, against ? NULL : truth->name, &ps, &rr, &mref, false))) goto out;
    /* the logits buffers, once the loader has checked the vocabulary against
     * the embedding (V <= 2^31, n <= 64, steps <= 4096: no size_t overflow) */
    size_t nlog = (size_t)(ps.steps + 1) * (size_t)ps.n * (size_t)ps.V;
    double gib = (double)nlog * sizeof(float) / (1024.0 * 1024.0 * 1024.0);
    /* expert parallel: only rank 0 gets the logits (the others run its steps) */
    const bool leader = !(mr_cli_ep_multi() && mr_ep_rank() > 0);
    if (gib > 64.0 || (leader && (!(ref = calloc(nlog, sizeof(float))) || !(got = calloc(nlog, sizeof(float)))))) {
        fprintf(stderr,
                "moerun probe: the logits of %d prompts x %d steps x vocab %lld need 2 x %.1f GiB%s; lower --prompts "
                "or --steps\n",
                ps.n, ps.steps + 1, (long long)ps.V, gib, gib > 64.0 ? " (limit 64 GiB)" : " (out of memory)");
        rc = gib > 64.0 ? 2 : 1;
    }
    if ((rc = mr_cli_ep_agree("probe", "allocating the logits", rc))) goto out;
    const mr_exec *xr = mr_resolution_exec(rr);
    char line[1024];
    mr_resolution_summary(rr, line, sizeof line);
    printf("%s\n", line);
    if (explain) mr_resolution_explain(rr, stdout);
    printf("probe: %d prompts, prefill + %d greedy steps, teacher-forced on %s's tokens\n", ps.n, ps.steps,
           against ? model_dir : "the reference runner");
    rc = 1;
    if (run_model(mref, &ps, false, ref)) {
        mr_cli_fail("probe", "the reference run failed");
        goto out;
    }
    probe_cmp c = {.step_err = step_err};
    bool pass = true;
    if (against) {
        mr_resolution *r2 = NULL;
        mr_engine *m2 = NULL;
        int e = open_with(&o, against, NULL, &ps, &r2, &m2, false);
        if (!e && mr_model_config_of(mr_engine_model(m2))->vocab != ps.V) {
            /* its logits rows would not fit the buffers, nor compare */
            fprintf(stderr, "moerun probe: %s has a vocabulary of %lld, %s of %lld: not the same model\n", against,
                    (long long)mr_model_config_of(mr_engine_model(m2))->vocab, model_dir, (long long)ps.V);
            e = 2;
        }
        if (!e) {
            mr_resolution_summary(r2, line, sizeof line);
            printf("against %s\n", line);
            if (run_model(m2, &ps, true, got)) {
                mr_cli_fail("probe", "the run of the second checkpoint failed");
                e = 1;
            } else if (leader) {
                compare(&ps, ref, got, tol_flag >= 0 ? tol_flag : default_tol(xr->weight_format), &c);
                char label[600];
                snprintf(label, sizeof label, "%s vs %s", model_dir, against);
                print_cmp(label, &ps, &c, tol_flag >= 0 ? tol_flag : default_tol(xr->weight_format), false, &pass);
            }
        }
        close_run(m2);
        mr_resolution_free(r2);
        rc = e ? e : 0;
        goto out;
    }
    int compared = 0;
    for (int i = 0; i < mr_moe_runner_count(); i++) {
        const mr_moe_runner *run = mr_moe_runner_at(i);
        if (run->ground_truth) continue; /* the runs compare against it */
        mr_resolution *r2 = NULL;
        mr_engine *m2 = NULL;
        int e = open_with(&o, model_dir, run->name, &ps, &r2, &m2, true);
        if (e == 2) {
            printf("runner %s: not applicable: %s\n", run->name,
                   r2 && mr_resolution_error(r2)[0] ? mr_resolution_error(r2) : mr_error_last());
        } else if (e) {
            pass = false;
        } else if (run_model(m2, &ps, true, got)) {
            mr_cli_fail("probe", "runner failed");
            pass = false;
        } else if (leader) {
            const mr_exec *x2 = mr_resolution_exec(r2);
            double tol = tol_flag >= 0 ? tol_flag : default_tol(x2->weight_format);
            compare(&ps, ref, got, tol, &c);
            char label[200];
            snprintf(label, sizeof label, "runner %s (%s)", run->name, mr_act_mode_name(x2->act_mode));
            print_cmp(label, &ps, &c, tol, true, &pass);
            compared++;
        }
        close_run(m2);
        mr_resolution_free(r2);
    }
    printf("probe: %d runner%s compared with the reference: %s\n", compared, compared == 1 ? "" : "s",
           pass ? "PASS" : "FAIL");
    rc = pass ? 0 : 1;
    goto out;
bad:
    fprintf(stderr, "moerun probe: %s: %s\n", flag, mr_error_last());
    rc = 2;
out:
    /* expert parallel: the verdict is rank 0's (only it compared the logits) */
    if (mr_cli_ep_multi() && !mr_ep_broken() && mr_ep_bcast(&rc, sizeof rc, 0, 0) != MR_OK) rc = rc ? rc : 1;
    close_run(mref);
    mr_resolution_free(rr);
    free(ps.len);
    free(ps.ids);
    free(ps.tokens);
    free(ref);
    free(got);
    free(step_err);
    mr_options_free(&o);
    return rc;
}
