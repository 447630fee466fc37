/* consumer.c — a program outside the tree, built against an installed
 * moerun with `pkg-config --cflags --libs moerun` (tests/install/install.sh).
 * It includes every public header (all_headers.h, listed by the script from
 * include/moerun/), checks that the library it runs is the version the .pc
 * file names, and does real work through the installed library: an FP8
 * block quantize + mr_matmul compared with a plain dot product over the
 * dequantized rows. Args: <expected version>. Exit 0 on success. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "all_headers.h"

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    if (strcmp(mr_version(), argv[1])) {
        fprintf(stderr, "consumer: library version %s, pkg-config says %s\n", mr_version(), argv[1]);
        return 1;
    }
    if (!mr_moe_runner_find("reference") || strcmp(mr_status_name(MR_EINVAL), "MR_EINVAL") != 0) {
        fprintf(stderr, "consumer: runner table or status names missing\n");
        return 1;
    }
    enum { N = 130, K = 256 };
    float *w = malloc(sizeof(float) * N * K), x[K], y[N], row[K];
    if (!w) return 1;
    uint32_t s = 12345;
    for (int i = 0; i < N * K; i++) s = s * 1664525u + 1013904223u, w[i] = (float)((int)(s >> 9) % 2001 - 1000) / 1000.0f;
    for (int k = 0; k < K; k++) x[k] = (float)(k % 7) - 3.0f;
    mr_qmatrix q;
    mr_status st = mr_qmatrix_quantize(&q, MR_FMT_FP8_BLOCK, w, N, K, 0.0f);
    if (st) {
        fprintf(stderr, "consumer: quantize: %s\n", mr_status_str(st));
        free(w);
        return 1;
    }
    mr_matmul(&q, x, 1, y);
    int bad = 0;
    for (int n = 0; n < N; n++) {
        mr_qmatrix_dequant_row(&q, n, row);
        double ref = 0, mag = 0;
        for (int k = 0; k < K; k++) ref += (double)row[k] * x[k], mag += fabs((double)row[k] * x[k]);
        if (fabs(y[n] - ref) > 1e-3 * mag + 1e-5) bad++;
    }
    printf("moerun %s (%s), kernels %s: %d of %d rows differ\n", mr_version(), mr_build_info(), mr_kernels_get()->isa,
           bad, N);
    mr_qmatrix_free(&q);
    free(w);
    return bad != 0;
}
