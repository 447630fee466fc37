/* cmd_quantize.c — `moerun quantize IN OUT --to fp8|nvfp4`: converts a bf16
 * MiniMax-M2 checkpoint (src/model/quantize.c; spec/formats.md). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_model.h"
#include "moerun/model.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: moerun quantize IN OUT --to fp8|nvfp4 [--calib-tokens N] [--seed N]\n\n"
            "Converts the bf16 checkpoint IN into native FP8 block (128x128, attention and experts) or\n"
            "ModelOpt NVFP4 (experts only; input_scale calibrated by running the bf16 model over N\n"
            "calibration tokens, default 256). OUT is written atomically (a scratch folder renamed\n"
            "into place, removed on failure). OUT must not exist or must be an empty folder; nothing\n"
            "is ever replaced.\n"
            "Exit status: 0 written; 2 bad usage or an input that cannot be quantized (already\n"
            "quantized, not MiniMax-M2, or a NaN / infinite weight: the tensor and index are named);\n"
            "1 OUT exists (not empty), or a read / write failure.\n");
}

int mr_cmd_quantize(int argc, char **argv) {
    mr_quantize_params p = {.to = MR_FMT_COUNT, .calib_tokens = 256, .progress = true};
    const char *in = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--to") && v) {
            i++;
            if (!strcmp(v, "fp8")) p.to = MR_FMT_FP8_BLOCK;
            else if (!strcmp(v, "nvfp4")) p.to = MR_FMT_NVFP4;
            else {
                fprintf(stderr, "moerun quantize: --to must be fp8 or nvfp4 (not '%s')\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--calib-tokens") && v) {
            long n;
            if (mr_cli_parse_long(argv[++i], 1, 1 << 24, &n)) {
                fprintf(stderr, "moerun quantize: --calib-tokens: %s\n", mr_error_last());
                return 2;
            }
            p.calib_tokens = n;
        } else if (!strcmp(a, "--seed") && v) {
            long s;
            if (mr_cli_parse_long(argv[++i], 0, INT64_MAX, &s)) {
                fprintf(stderr, "moerun quantize: --seed: %s\n", mr_error_last());
                return 2;
            }
            p.seed = (uint64_t)s;
        } else if (!v && (!strcmp(a, "--to") || !strcmp(a, "--calib-tokens") || !strcmp(a, "--seed"))) {
            fprintf(stderr, "moerun quantize: %s needs a value\n", a);
            return 2;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "moerun quantize: unknown option '%s' (see --help)\n", a);
            return 2;
        } else if (!in) {
            in = a;
        } else if (!out) {
            out = a;
        } else {
            fprintf(stderr, "moerun quantize: unexpected argument '%s'\n", a);
            return 2;
        }
    }
    if (!in || !out) {
        fprintf(stderr, "moerun quantize: missing %s (usage: moerun quantize IN OUT --to fp8|nvfp4)\n",
                !in ? "IN and OUT" : "OUT");
        return 2;
    }
    if (p.to == MR_FMT_COUNT) {
        fprintf(stderr, "moerun quantize: --to fp8|nvfp4 is required\n");
        return 2;
    }
    mr_cli_remove_scratch_on_signal(); /* Ctrl-C leaves no DIR.tmp.* behind */
    mr_status st = mr_model_quantize(in, out, &p);
    if (st) {
        mr_cli_fail("quantize", "failed");
        /* the input cannot be quantized: 2, as for bad usage; I/O and the rest: 1 */
        return st == MR_EINVAL || st == MR_EINPUT || st == MR_EUNSUPPORTED ? 2 : 1;
    }
    printf("wrote %s (%s)\n", out, p.to == MR_FMT_FP8_BLOCK ? "fp8 block 128x128" : "nvfp4 (ModelOpt)");
    return 0;
}
