/* cli_probe.h — the temperature-0 probe shared by `moerun probe` and the
 * startup self-check of `moerun serve`: seeded prompts through a leader
 * model (greedy) and a follower teacher-forced on the leader's tokens, over
 * the model's slots or through an engine, the per-step comparison of their
 * logits and its report. */
#ifndef MR_CLI_PROBE_H
#define MR_CLI_PROBE_H

#include <stdbool.h>
#include <stdint.h>

#include "moerun/config.h"
#include "moerun/engine.h"
#include "moerun/model.h"

typedef struct {
    int n;             /* prompts */
    int steps;         /* decode steps after the prefill */
    int64_t V;
    int32_t *ids;      /* prompts, concatenated */
    int64_t *len;      /* [n] */
    int32_t *tokens;   /* [steps + 1][n] greedy tokens of the leader (row s: chosen after step s) */
} mr_cli_probe_set;

/* n seeded prompts of 3 + (i * 5) % 9 tokens in [0, V). Nonzero on out of memory. */
int mr_cli_probe_set_make(mr_cli_probe_set *ps, int n, int steps, long seed, int64_t V);
void mr_cli_probe_set_free(mr_cli_probe_set *ps);
/* Tokens of the longest prompt and of all prompts. */
void mr_cli_probe_set_sizes(const mr_cli_probe_set *ps, int64_t *longest, int64_t *total);

/* Runs m over the prompts in KV slots 0..n-1 (reset first and after):
 * prefill, then `steps` decode steps. With follow == false it picks its own
 * greedy tokens into ps->tokens; otherwise it is fed them. logits
 * [steps + 1][n][V]. Nonzero on a failed forward (detail set). */
int mr_cli_probe_run(mr_model *m, mr_cli_probe_set *ps, bool follow, float *logits);

/* The same over an engine (moerun/engine.h): the prompts as requests, the
 * logits of every generated token (want_logits); with follow, ps->tokens are
 * forced (teacher forcing), otherwise greedy tokens are recorded into them.
 * The engine must have room for ps->n requests. Nonzero on failure (detail set). */
int mr_cli_probe_run_engine(mr_engine *e, mr_cli_probe_set *ps, bool follow, float *logits);

typedef struct {
    double max_err, scale;
    int agree, total, first_step, first_prompt, bad_flips;
    double *step_err; /* [steps + 1], owned by the caller */
} mr_cli_probe_cmp;

void mr_cli_probe_compare(const mr_cli_probe_set *ps, const float *ref, const float *got, double tol_rel,
                          mr_cli_probe_cmp *c);
/* Prints one report line (and the per-step errors); with judge, PASS/FAIL,
 * and *pass = false on a failure. */
void mr_cli_probe_print(FILE *f, const char *label, const mr_cli_probe_set *ps, const mr_cli_probe_cmp *c,
                        double tol_rel, bool judge, bool *pass);
/* The tolerance of a weight format: bf16 1e-3, fp8 2e-2, nvfp4 5e-2 (relative
 * to max(1, max |reference logit|)). */
double mr_cli_probe_default_tol(mr_format f);

/* Resolves base with model_dir and runner forced (NULL: as given), applies it
 * and opens the model sized for ps. Returns 0, 2 (resolution refused; printed
 * unless quiet_fail) or 1 (load failed, printed). *r and *m are the
 * caller's to free. */
int mr_cli_probe_open(const char *cmd, const mr_options *base, const char *model_dir, const char *runner,
                      const mr_cli_probe_set *ps, mr_resolution **r, mr_model **m, bool quiet_fail);

/* As mr_cli_probe_open, for an engine sized for ps (a paged KV pool of
 * kv_dtype): *e drives *m; free *e before *m. */
int mr_cli_probe_open_engine(const char *cmd, const mr_options *base, const char *model_dir, const char *runner,
                             const mr_cli_probe_set *ps, mr_format kv_dtype, mr_resolution **r, mr_model **m,
                             mr_engine **e);

#endif
