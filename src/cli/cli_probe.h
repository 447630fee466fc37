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

/* Runs the prompts through engine e: every prompt a request (greedy, no EOS
 * stop), prefill then `steps` more tokens, the logits of every generated
 * token (want_logits). With follow, ps->tokens are forced (teacher forcing);
 * otherwise greedy tokens are recorded into them. logits [steps + 1][n][V]:
 * row s of prompt i is the one that chose its token s. The engine must have
 * room for ps->n requests. Nonzero on failure (detail set). */
int mr_cli_probe_run(mr_engine *e, mr_cli_probe_set *ps, bool follow, float *logits);
/* Frees an engine opened by mr_cli_probe_open and its model. NULL ok. */
void mr_cli_probe_close(mr_engine *e);

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

/* Resolves base with model_dir and runner forced (NULL: as given), applies
 * it and opens the model with its engine. With kv_dtype NULL (the probe),
 * unless base says otherwise: the KV cache in fp32 (the probe compares
 * runners, not KV rounding), a context of the longest prompt + steps, room
 * for every prompt at once. With kv_dtype ("bf16" / "fp32": a server's
 * self-check) that KV dtype, and the engine sized for ps whatever base says. Returns 0, 2 (resolution refused; printed unless
 * quiet_fail) or 1 (load failed, printed). *r and *e are the caller's to
 * free (mr_cli_probe_close). */
int mr_cli_probe_open(const char *cmd, const mr_options *base, const char *model_dir, const char *runner,
                      const mr_cli_probe_set *ps, const char *kv_dtype, mr_resolution **r, mr_engine **e,
                      bool quiet_fail);

#endif
