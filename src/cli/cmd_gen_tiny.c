/* cmd_gen_tiny.c — `moerun gen-tiny DIR`: writes a deterministic random
 * MiniMax-M2-architecture checkpoint (bf16, FP8 block or NVFP4). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_model.h"
#include "moerun/model.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: moerun gen-tiny DIR [--quant bf16|fp8|nvfp4] [--seed N] [--hidden N] [--layers N]\n"
            "                       [--experts N] [--top-k N] [--expert-dim N] [--heads N] [--kv-heads N]\n"
            "                       [--head-dim N] [--rotary-dim N] [--vocab N]\n\n"
            "Writes config.json, generation_config.json and model.safetensors (HF names; FP8 and NVFP4\n"
            "forms with their quantization_config / hf_quant_config.json) into DIR, atomically: a scratch\n"
            "folder next to DIR is renamed into place when complete, and removed on failure. DIR must not\n"
            "exist or must be an empty folder; nothing is ever replaced.\n"
            "Exit status: 0 written; 2 bad usage or shape; 1 DIR exists (not empty) or a write failed.\n"
            "Defaults: hidden 256, 4 layers, 8 q heads / 2 kv heads, head_dim 32, rotary_dim 16,\n"
            "32 experts top-4, expert dim 128, vocab 512, seed 0. FP8 needs hidden and expert dim\n"
            "multiples of 128; NVFP4 multiples of 16.\n");
}

int mr_cmd_gen_tiny(int argc, char **argv) {
    mr_tiny_params p = {.quant = MR_FMT_BF16};
    const char *dir = NULL;
    struct { const char *flag; int64_t *dst; } dims[] = {
        {"--hidden", &p.hidden}, {"--layers", &p.layers}, {"--experts", &p.experts}, {"--top-k", &p.top_k},
        {"--expert-dim", &p.inter}, {"--heads", &p.heads}, {"--kv-heads", &p.kv_heads},
        {"--head-dim", &p.head_dim}, {"--rotary-dim", &p.rotary_dim}, {"--vocab", &p.vocab}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        bool matched = false;
        for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
            if (strcmp(a, dims[d].flag)) continue;
            long x;
            if (!v) {
                fprintf(stderr, "moerun gen-tiny: %s needs a value\n", a);
                return 2;
            }
            if (mr_cli_parse_long(v, 1, 1 << 20, &x)) {
                fprintf(stderr, "moerun gen-tiny: %s: %s\n", a, mr_error_last());
                return 2;
            }
            *dims[d].dst = x;
            i++;
            matched = true;
        }
        if (matched) continue;
        if ((!strcmp(a, "--quant") || !strcmp(a, "--seed")) && !v) {
            fprintf(stderr, "moerun gen-tiny: %s needs a value\n", a);
            return 2;
        } else if (!strcmp(a, "--quant") && v) {
            i++;
            if (!strcmp(v, "bf16")) p.quant = MR_FMT_BF16;
            else if (!strcmp(v, "fp8")) p.quant = MR_FMT_FP8_BLOCK;
            else if (!strcmp(v, "nvfp4")) p.quant = MR_FMT_NVFP4;
            else {
                fprintf(stderr, "moerun gen-tiny: --quant must be bf16, fp8 or nvfp4 (not '%s')\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--seed") && v) {
            long s;
            if (mr_cli_parse_long(argv[++i], 0, INT64_MAX, &s)) {
                fprintf(stderr, "moerun gen-tiny: --seed: %s\n", mr_error_last());
                return 2;
            }
            p.seed = (uint64_t)s;
        } else if (a[0] == '-' || dir) {
            fprintf(stderr, "moerun gen-tiny: unexpected argument '%s' (see --help)\n", a);
            return 2;
        } else {
            dir = a;
        }
    }
    if (!dir) {
        fprintf(stderr, "moerun gen-tiny: missing DIR (see --help)\n");
        return 2;
    }
    if (mr_tiny_validate(&p)) {
        mr_cli_fail("gen-tiny", "invalid shape");
        return 2;
    }
    mr_cli_remove_scratch_on_signal(); /* Ctrl-C leaves no DIR.tmp.* behind */
    mr_status st = mr_tiny_write(dir, &p);
    if (st) {
        mr_cli_fail("gen-tiny", "cannot write the checkpoint");
        return st == MR_EINVAL ? 2 : 1;
    }
    printf("wrote %s\n", dir);
    return 0;
}
