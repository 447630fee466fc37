/* cmd_version.c — `moerun version`: version, build options, CPU features. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "moerun/base.h"

int mr_cmd_version(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: moerun version\n\nPrints the version, the build options and the CPU features detected\n"
               "(MOERUN_CPU_MASK hides features, e.g. MOERUN_CPU_MASK=avx512).\n");
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "moerun version: unexpected argument '%s' (it takes none)\n", argv[1]);
        return 2;
    }
    const mr_cpu_info *ci = mr_cpu();
    printf("moerun %s\n", mr_version());
    printf("build: %s\n", mr_build_info());
    printf("cpu: %s, %d core%s\n", ci->brand, ci->n_cores, ci->n_cores == 1 ? "" : "s");
    printf("features:");
    for (int b = 0; b < MR_CPU_FEATURE_COUNT; b++) {
        uint32_t bit = 1u << b;
        if (ci->detected & bit) printf(" %s%s", mr_cpu_feature_name(bit), (ci->hidden & bit) ? "(masked)" : "");
    }
    printf("\n");
    if (ci->hidden & ci->detected) printf("MOERUN_CPU_MASK hides some features: kernels will not use those marked (masked)\n");
    return 0;
}
