/* cli_model.h — helpers shared by the model commands (generate, probe,
 * quantize, gen-tiny): number parsing, prompt lists, resolve-and-summarize. */
#ifndef MR_CLI_MODEL_H
#define MR_CLI_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "moerun/config.h"

/* Strict parsing; on error prints nothing, sets the error detail, returns nonzero. */
int mr_cli_parse_long(const char *s, long lo, long hi, long *out);
int mr_cli_parse_float(const char *s, float lo, float hi, float *out);

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

/* gen-tiny / quantize: on SIGINT, SIGTERM or SIGHUP remove the scratch
 * folders in progress (mr_tools_remove_scratch), then die of the signal as
 * usual. A signal the parent set to be ignored stays ignored. */
void mr_cli_remove_scratch_on_signal(void);

#endif
