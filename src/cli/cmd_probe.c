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
#include "cli_probe.h"
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

int mr_cmd_probe(int argc, char **argv) {
    mr_options o;
    if (mr_options_init(&o) != MR_OK) return 1;
    int rc = 2;
    long n_prompts = 4, steps = 16, seed = 1;
    float tol_flag = -1.0f; /* unset: the format's default; 0 demands exact agreement */
    const char *against = NULL, *flag = "probe";
    bool explain = false;
    mr_cli_probe_set ps = {0};
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
    int64_t V = d.vocab;
    mr_model_desc_free(&d);
    step_err = malloc((size_t)(steps + 1) * sizeof(double));
    if (mr_cli_probe_set_make(&ps, (int)n_prompts, (int)steps, seed, V) || !step_err) {
        fprintf(stderr, "moerun probe: out of memory\n");
        rc = 1;
        goto out;
    }
    const mr_moe_runner *truth = mr_moe_runner_ground_truth();
    if ((rc = mr_cli_probe_open("probe", &o, model_dir, against ? NULL : truth->name, &ps, NULL, &rr, &mref, false))) goto out;
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
    if (mr_cli_probe_run(mref, &ps, false, ref)) {
        mr_cli_fail("probe", "the reference run failed");
        goto out;
    }
    mr_cli_probe_cmp c = {.step_err = step_err};
    bool pass = true;
    if (against) {
        mr_resolution *r2 = NULL;
        mr_engine *m2 = NULL;
        int e = mr_cli_probe_open("probe", &o, against, NULL, &ps, NULL, &r2, &m2, false);
        if (!e && mr_model_config_of(mr_engine_model(m2))->vocab != ps.V) {
            /* its logits rows would not fit the buffers, nor compare */
            fprintf(stderr, "moerun probe: %s has a vocabulary of %lld, %s of %lld: not the same model\n", against,
                    (long long)mr_model_config_of(mr_engine_model(m2))->vocab, model_dir, (long long)ps.V);
            e = 2;
        }
        if (!e) {
            mr_resolution_summary(r2, line, sizeof line);
            printf("against %s\n", line);
            if (mr_cli_probe_run(m2, &ps, true, got)) {
                mr_cli_fail("probe", "the run of the second checkpoint failed");
                e = 1;
            } else if (leader) {
                mr_cli_probe_compare(&ps, ref, got, tol_flag >= 0 ? tol_flag : mr_cli_probe_default_tol(xr->weight_format), &c);
                char label[600];
                snprintf(label, sizeof label, "%s vs %s", model_dir, against);
                mr_cli_probe_print(stdout, label, &ps, &c, tol_flag >= 0 ? tol_flag : mr_cli_probe_default_tol(xr->weight_format), false, &pass);
            }
        }
        mr_cli_probe_close(m2);
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
        int e = mr_cli_probe_open("probe", &o, model_dir, run->name, &ps, NULL, &r2, &m2, true);
        if (e == 2) {
            printf("runner %s: not applicable: %s\n", run->name,
                   r2 && mr_resolution_error(r2)[0] ? mr_resolution_error(r2) : mr_error_last());
        } else if (e) {
            pass = false;
        } else if (mr_cli_probe_run(m2, &ps, true, got)) {
            mr_cli_fail("probe", "runner failed");
            pass = false;
        } else if (leader) {
            const mr_exec *x2 = mr_resolution_exec(r2);
            double tol = tol_flag >= 0 ? tol_flag : mr_cli_probe_default_tol(x2->weight_format);
            mr_cli_probe_compare(&ps, ref, got, tol, &c);
            char label[200];
            snprintf(label, sizeof label, "runner %s (%s)", run->name, mr_act_mode_name(x2->act_mode));
            mr_cli_probe_print(stdout, label, &ps, &c, tol, true, &pass);
            compared++;
        }
        mr_cli_probe_close(m2);
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
    mr_cli_probe_close(mref);
    mr_resolution_free(rr);
    mr_cli_probe_set_free(&ps);
    free(ref);
    free(got);
    free(step_err);
    mr_options_free(&o);
    return rc;
}
