/* cmd_bench.c — `moerun bench`: picks the benchmark. Each lives in its own
 * file (bench_moe.c, bench_dense.c, bench_engine.c, bench_grammar.c); what they share is in bench_util.c. */
#include <stdio.h>
#include <string.h>

#include "bench_util.h"
#include "cli.h"

int mr_cmd_bench(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        printf("usage: moerun bench moe|dense|engine|grammar|serve [options]   (`moerun bench <name> --help`)\n");
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "moe")) return mr_bench_moe(argc - 1, argv + 1);
    if (!strcmp(argv[1], "dense")) return mr_bench_dense(argc - 1, argv + 1);
    if (!strcmp(argv[1], "engine")) return mr_bench_engine(argc - 1, argv + 1);
    if (!strcmp(argv[1], "grammar")) return mr_bench_grammar(argc - 1, argv + 1);
    if (!strcmp(argv[1], "serve")) return mr_cmd_bench_serve(argc - 1, argv + 1);
    fprintf(stderr, "moerun bench: unknown benchmark '%s' (available: moe, dense, engine, grammar, serve)\n", argv[1]);
    return 2;
}
