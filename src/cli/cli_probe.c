/* cli_probe.c — see cli_probe.h. */
#include "cli_probe.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_ep.h"
#include "cli_model.h"

int mr_cli_probe_set_make(mr_cli_probe_set *ps, int n, int steps, long seed, int64_t V) {
    memset(ps, 0, sizeof *ps);
    ps->n = n;
    ps->steps = steps;
    ps->V = V;
    ps->len = calloc((size_t)n, sizeof(int64_t));
    int64_t total = 0;
    for (int i = 0; ps->len && i < n; i++) total += ps->len[i] = 3 + (i * 5) % 9;
    ps->ids = malloc((size_t)(total ? total : 1) * sizeof(int32_t));
    ps->tokens = malloc((size_t)(steps + 1) * (size_t)n * sizeof(int32_t));
    if (!ps->len || !ps->ids || !ps->tokens) {
        mr_cli_probe_set_free(ps);
        return 1;
    }
    uint64_t s = (uint64_t)seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < total; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        ps->ids[i] = (int32_t)((s >> 33) % (uint64_t)V);
    }
    return 0;
}

void mr_cli_probe_set_free(mr_cli_probe_set *ps) {
    free(ps->len);
    free(ps->ids);
    free(ps->tokens);
    ps->len = NULL;
    ps->ids = NULL;
    ps->tokens = NULL;
}

void mr_cli_probe_set_sizes(const mr_cli_probe_set *ps, int64_t *longest, int64_t *total) {
    *longest = *total = 0;
    for (int i = 0; i < ps->n; i++) {
        *total += ps->len[i];
        if (ps->len[i] > *longest) *longest = ps->len[i];
    }
}

void mr_cli_probe_compare(const mr_cli_probe_set *ps, const float *ref, const float *got, double tol_rel,
                          mr_cli_probe_cmp *c) {
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

void mr_cli_probe_print(FILE *f, const char *label, const mr_cli_probe_set *ps, const mr_cli_probe_cmp *c,
                        double tol_rel, bool judge, bool *pass) {
    double tol = tol_rel * c->scale;
    bool ok = c->max_err <= tol && c->bad_flips == 0;
    fprintf(f, "%s: max |logit err| %.3g", label, c->max_err);
    if (judge)
        fprintf(f, " (tol %.3g = %.0e x %.3g)", tol, tol_rel, c->scale);
    else
        fprintf(f, " (max |logit| %.3g; report only)", c->scale);
    fprintf(f, ", top-1 agreement %d/%d (%.1f%%), first divergent token: ", c->agree, c->total,
            100.0 * c->agree / (c->total ? c->total : 1));
    if (c->first_step < 0)
        fprintf(f, "none");
    else
        fprintf(f, "prompt %d step %d", c->first_prompt, c->first_step);
    if (judge) fprintf(f, "  %s", ok ? "PASS" : "FAIL");
    fprintf(f, "\n  per-step max err:");
    for (int s = 0; s <= ps->steps; s++) fprintf(f, " %.2g", c->step_err[s]);
    fprintf(f, "\n");
    if (judge && !ok) *pass = false;
}

double mr_cli_probe_default_tol(mr_format f) {
    return f == MR_FMT_NVFP4 ? 5e-2 : f == MR_FMT_FP8_BLOCK ? 2e-2 : 1e-3;
}

static int probe_run_leader(mr_engine *e, mr_cli_probe_set *ps, bool follow, float *logits) {
    int n = ps->n, S = ps->steps + 1;
    size_t V = (size_t)ps->V;
    int32_t *forced = follow ? malloc((size_t)n * (size_t)S * sizeof(int32_t)) : NULL;
    if (follow && !forced) return 1;
    int64_t off = 0;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        if (follow)
            for (int st = 0; st < S; st++) forced[i * S + st] = ps->tokens[st * n + i];
        mr_request_params p = {.prompt = ps->ids + off, .n_prompt = ps->len[i], .max_tokens = S, .ignore_eos = true,
                               .want_logits = true, .forced = follow ? forced + i * S : NULL, .n_forced = follow ? S : 0,
                               .user = (void *)(intptr_t)i};
        mr_req_id id;
        if (mr_engine_add(e, &p, &id)) rc = 1;
        off += ps->len[i];
    }
    int seen = 0;
    while (!rc && mr_engine_has_work(e)) {
        const mr_engine_step_out *out;
        if (mr_engine_step(e, &out)) {
            rc = 1;
            break;
        }
        for (int k = 0; k < out->n_events; k++) {
            const mr_engine_event *ev = &out->events[k];
            int i = (int)(intptr_t)ev->user;
            if (ev->finish == MR_FINISH_ERROR) {
                mr_error_set(MR_ESTATE, "%s", ev->error ? ev->error : "the engine failed");
                rc = 1;
            }
            if (ev->n_tokens == 1 && ev->logits && ev->n_generated >= 1 && ev->n_generated <= S) {
                int64_t st = ev->n_generated - 1;
                memcpy(logits + ((size_t)st * (size_t)n + (size_t)i) * V, ev->logits, V * sizeof(float));
                if (!follow) ps->tokens[st * n + i] = ev->token;
                seen++;
            }
        }
    }
    free(forced);
    if (!rc && seen != n * S) {
        mr_error_set(MR_ESTATE, "the engine returned %d of the %d logits rows", seen, n * S);
        rc = 1;
    }
    return rc;
}

/* Under expert parallelism rank 0 owns the requests and the logits; the other ranks run its steps
 * until it is done, and the ranks agree on the outcome (the leader's failure is everyone's). */
int mr_cli_probe_run(mr_engine *e, mr_cli_probe_set *ps, bool follow, float *logits) {
    int rc = 0;
    if (mr_cli_ep_multi() && mr_ep_rank() > 0) {
        if (mr_engine_follow(e) != MR_OK) rc = 1;
    } else {
        rc = probe_run_leader(e, ps, follow, logits);
        if (mr_engine_ep_stop(e) && !rc) rc = 1;
    }
    return mr_cli_ep_agree("probe", "a probe run", rc);
}

void mr_cli_probe_close(mr_engine *e) {
    if (!e) return;
    mr_model *m = mr_engine_model(e);
    mr_engine_free(e);
    mr_model_close(m);
}

int mr_cli_probe_open(const char *cmd, const mr_options *base, const char *model_dir, const char *runner,
                      const mr_cli_probe_set *ps, const char *kv_dtype, mr_resolution **r, mr_engine **e,
                      bool quiet_fail) {
    mr_options o;
    if (mr_options_init(&o)) return 1;
    for (int i = 0; i < MR_OPT_COUNT; i++)
        if (mr_options_is_explicit(base, (mr_opt_id)i)) mr_options_set(&o, mr_option_at(i)->name, base->value[i], base->source[i]);
    mr_options_set(&o, "model", model_dir, MR_SRC_FLAG);
    if (runner) mr_options_set(&o, "moe_runner_backend", runner, MR_SRC_FLAG);
    int64_t longest, total;
    mr_cli_probe_set_sizes(ps, &longest, &total);
    char v[32];
    bool sized = kv_dtype != NULL; /* a server's self-check: small whatever the server's own sizes */
    if (kv_dtype) mr_options_set(&o, "kv_cache_dtype", kv_dtype, MR_SRC_FLAG);
    else if (!mr_options_is_explicit(base, MR_OPT_KV_CACHE_DTYPE)) mr_options_set(&o, "kv_cache_dtype", "fp32", MR_SRC_FLAG);
    snprintf(v, sizeof v, "%lld", (long long)(longest + ps->steps + 1));
    if (sized || !mr_options_is_explicit(base, MR_OPT_CONTEXT_LENGTH)) mr_options_set(&o, "context_length", v, MR_SRC_FLAG);
    snprintf(v, sizeof v, "%d", ps->n);
    if (sized || !mr_options_is_explicit(base, MR_OPT_MAX_RUNNING_REQUESTS))
        mr_options_set(&o, "max_running_requests", v, MR_SRC_FLAG);
    if (sized) {
        mr_options_set(&o, "kv_cache_memory", "auto", MR_SRC_FLAG);
        mr_options_set(&o, "max_batch_tokens", "0", MR_SRC_FLAG);
    }
    *r = NULL;
    *e = NULL;
    int rc = 0;
    if (mr_resolve(&o, r) != MR_OK || mr_exec_apply(mr_resolution_exec(*r)) != MR_OK) {
        if (!quiet_fail) mr_cli_fail(cmd, "resolution failed");
        rc = 2;
    }
    rc = mr_cli_ep_agree(cmd, "resolution", rc); /* every rank of an expert-parallel run, the same answer */
    if (!rc) {
        mr_model *m = NULL;
        if (mr_cli_engine_open(cmd, model_dir, mr_resolution_exec(*r), false, ps->n, &m, e)) rc = 1;
    }
    mr_options_free(&o);
    return rc;
}
