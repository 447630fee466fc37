/* probe.c — machine ceilings measured in the same run as a benchmark: the
 * multi-threaded read bandwidth of a buffer larger than any cache, and the
 * peak rate of the instruction the kernels' inner loop uses (FP32 FMA at the
 * widest ISA the dispatch table chose). */
#include <omp.h>
#include <string.h>

#include "kernels/kern_internal.h"

double mr__probe_fma_avx512(int64_t iters);
double mr__probe_fma_avx2(int64_t iters);

/* Sum of 64-bit words; the optimizer vectorizes it; 8 independent sums. */
static uint64_t sum_words(const uint64_t *p, size_t n) {
    uint64_t s[8] = {0};
    for (size_t i = 0; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += p[i + j];
    return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

double mr_probe_read_bw(size_t bytes, int reps) {
    size_t n = bytes / 8;
    uint64_t *buf = mr_aligned_alloc(64, n * 8);
    if (!buf) return 0.0;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) buf[i] = i; /* pre-fault, with the same thread split as below */
    double best = 0.0;
    volatile uint64_t sink = 0;
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = mr_now_ns(), tot = 0;
#pragma omp parallel reduction(+ : tot)
        {
            int nt = omp_get_num_threads(), id = omp_get_thread_num();
            size_t chunk = n / (size_t)nt / 8 * 8, lo = chunk * (size_t)id, hi = id == nt - 1 ? n : lo + chunk;
            tot += sum_words(buf + lo, hi - lo);
        }
        uint64_t t1 = mr_now_ns();
        sink += tot;
        double gbs = (double)(n * 8) / (double)(t1 - t0);
        if (gbs > best) best = gbs;
    }
    (void)sink;
    mr_aligned_free(buf);
    return best;
}

double mr_probe_peak_gflops(const char **instr) {
    const mr_kernels *k = mr_kernels_get();
    const int64_t iters = 20 * 1000 * 1000;
    double flops_per_iter;
    double (*fn)(int64_t);
    if (!strcmp(k->isa, "avx512")) {
        fn = mr__probe_fma_avx512, flops_per_iter = 10 * 16 * 2;
        if (instr) *instr = "vfmadd231ps zmm";
    } else if (!strcmp(k->isa, "avx2")) {
        fn = mr__probe_fma_avx2, flops_per_iter = 10 * 8 * 2;
        if (instr) *instr = "vfmadd231ps ymm";
    } else {
        fn = NULL, flops_per_iter = 0;
        if (instr) *instr = "scalar (not probed)";
        return 0.0;
    }
    double best = 0.0;
    for (int r = 0; r < 3; r++) {
        uint64_t t0 = mr_now_ns();
        double sink = 0;
#pragma omp parallel reduction(+ : sink)
        sink += fn(iters / omp_get_num_threads());
        uint64_t t1 = mr_now_ns();
        double g = (double)iters * flops_per_iter / (double)(t1 - t0);
        if (sink == 12345.678) g += 1e-9; /* keep the result alive */
        if (g > best) best = g;
    }
    return best;
}
