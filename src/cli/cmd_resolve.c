/* cmd_resolve.c — `moerun resolve --model DIR [options] [--explain] [--json]`:
 * decide the MoE backend and say why. Reads config.json,
 * hf_quant_config.json and safetensors headers only, never tensor data.
 * Exit status: 0 resolved, 2 resolution failed for any reason (including a
 * missing or unreadable model folder) or bad usage, 1 out of memory or output
 * error. Hidden: --print-options-md writes docs/options.md to stdout. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "moerun/config.h"

static void usage(FILE *f) {
    fprintf(f, "usage: moerun resolve --model DIR [options] [--explain] [--json]\n\n"
               "Decides every option (MoE runner, a2a transport, quantization, activation mode,\n"
               "router dtype, kernel ISA, ...) for the model in DIR and prints each final value\n"
               "with where it came from. Reads config files and safetensors headers only.\n\n"
               "  --explain   the whole story: each pass's declarations, refusals, source chains\n"
               "  --json      machine-readable (schema: docs/resolve-json.md)\n\n"
               "Exit status: 0 resolved; 2 resolution failed (whatever the reason: a missing or\n"
               "unreadable model folder, a bad config, a refused combination) or bad usage;\n"
               "1 out of memory.\n\n"
               "options (flag > environment > default):\n");
    mr_options_print_help(f);
}

int mr_cmd_resolve(int argc, char **argv) {
    bool explain = false, json = false;
    int out = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--print-options-md")) {
            mr_options_print_markdown(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--explain"))
            explain = true;
        else if (!strcmp(argv[i], "--json"))
            json = true;
        else
            argv[out++] = argv[i];
    }
    argc = out;
    mr_options o;
    if (mr_options_init(&o) != MR_OK) {
        mr_cli_fail("resolve", "out of memory");
        return 1;
    }
    if (mr_options_parse(&o, &argc, argv, false) != MR_OK) {
        mr_cli_fail("resolve", NULL);
        mr_options_free(&o);
        return 2;
    }
    if (argc > 1) {
        fprintf(stderr, "moerun resolve: unexpected argument '%s'\n", argv[1]);
        mr_options_free(&o);
        return 2;
    }
    if (!mr_options_get(&o, MR_OPT_MODEL)[0]) {
        fprintf(stderr, "moerun resolve: --model DIR is required (see --help)\n");
        mr_options_free(&o);
        return 2;
    }
    {
        static const char *const lv[] = {"debug", "info", "warn", "error", "off"};
        for (int i = 0; i < 5; i++)
            if (!strcmp(mr_options_get(&o, MR_OPT_LOG), lv[i])) mr_log_set_level((mr_log_level)i);
    }
    mr_resolution *r = NULL;
    mr_status s = mr_resolve(&o, &r);
    int rc = 0;
    if (r == NULL) {
        mr_cli_fail("resolve", "out of memory");
        mr_options_free(&o);
        return 1;
    }
    if (json) {
        char *j = mr_resolution_json(r);
        if (j) {
            printf("%s\n", j);
            mr_free(j);
        } else {
            rc = 1;
        }
    } else if (explain) {
        mr_resolution_explain(r, stdout);
    } else {
        mr_resolution_print(r, stdout);
    }
    if (s != MR_OK) {
        fprintf(stderr, "moerun resolve: %s\n", mr_resolution_error(r));
        rc = s == MR_ENOMEM ? 1 : 2; /* any resolution failure, unreadable folders included */
    }
    mr_resolution_free(r);
    mr_options_free(&o);
    return rc;
}
