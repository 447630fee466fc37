/* cli_model.h — helpers shared by the model commands (generate, probe,
 * quantize, gen-tiny): number parsing, prompt lists, resolve-and-summarize. */
#ifndef MR_CLI_MODEL_H
#define MR_CLI_MODEL_H

#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>

#include "moerun/config.h"
#include "moerun/engine.h"

/* Strict parsing; on error prints nothing, sets the error detail, returns nonzero. */
int mr_cli_parse_long(const char *s, long lo, long hi, long *out);
int mr_cli_parse_float(const char *s, float lo, float hi, float *out);

/* The sampling flags of generate and chat, one table with their ranges:
 * --temperature, --top-k, --top-p, --seed (MR_CLI_SAMPLING_BASIC) and
 * --min-p, --repetition-penalty, --presence-penalty, --frequency-penalty
 * (with them, MR_CLI_SAMPLING_ALL). Looks at argv[*i]: not one of the flags
 * of mask, MR_CLI_FLAG_OTHER; parsed into *sp, its value consumed (*i moved
 * on), MR_CLI_FLAG_TAKEN; a value out of range, MR_CLI_FLAG_BAD with the
 * error detail set; no value after it, MR_CLI_FLAG_NO_VALUE. */
enum { MR_CLI_SAMPLING_BASIC = 1, MR_CLI_SAMPLING_ALL = 3 };
enum { MR_CLI_FLAG_OTHER = 0, MR_CLI_FLAG_TAKEN = 1, MR_CLI_FLAG_BAD = -1, MR_CLI_FLAG_NO_VALUE = -2 };
int mr_cli_sampling_flag(int argc, char **argv, int *i, int mask, mr_sampling *sp);

/* Prompts: ids of prompt i are ids[off[i] .. off[i] + len[i]). */
typedef struct {
    int n;
    int32_t *ids;
    int64_t *off, *len;
} mr_cli_prompts;
/* From one comma list (ids_list) or a file with one comma list per line
 * (blank lines skipped). Nonzero on a malformed list, with the detail set. */
int mr_cli_prompts_read(const char *ids_list, const char *file, mr_cli_prompts *p);
void mr_cli_prompts_free(mr_cli_prompts *p);

/* Resolves o; prints the one-line summary on stdout (and the explanation
 * with explain). On failure prints the reason on one line to stderr (plus
 * the story with explain) and returns nonzero (exit 2); *r is always to be
 * freed by the caller. */
int mr_cli_resolve(const char *cmd, const mr_options *o, bool explain, mr_resolution **r);
/* The same, with the summary (and explanation) written to summary. */
int mr_cli_resolve_to(const char *cmd, const mr_options *o, bool explain, FILE *summary, mr_resolution **r);

/* Opens the model of a resolved configuration with the engine it drives:
 * engine options from the exec (max_queued_requests when > 0), the model
 * opened to match (mr_engine_model_opts), then the engine. Prints the reason
 * on failure and returns nonzero (exit 1); *m and *e are set to NULL then. */
struct mr_model;
struct mr_engine;
int mr_cli_engine_open(const char *cmd, const char *dir, const mr_exec *x, bool progress, int max_queued, struct mr_model **m,
                       struct mr_engine **e);
/* One line about the KV pool: "kv cache: bf16, 4096 blocks of 16 tokens = 65536 tokens, 8.0 MiB". */
void mr_cli_print_kv(const struct mr_engine *e);

/* Two lines: what the model holds (weights in place, copies, experts, state,
 * MoE workspace: kept) and the process's RSS against it, after the load (its
 * peak and its end) and now (steady: VmRSS and VmHWM), as ratios to kept. */
void mr_cli_print_memory(const struct mr_model *m);

/* gen-tiny / quantize: on SIGINT, SIGTERM or SIGHUP remove the scratch
 * folders in progress (mr_tools_remove_scratch), then die of the signal as
 * usual. A signal the parent set to be ignored stays ignored. */
void mr_cli_remove_scratch_on_signal(void);

#endif
