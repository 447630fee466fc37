/* probe.c — machine ceilings measured in the same run as a benchmark: the
 * multi-threaded read bandwidth of a pre-faulted buffer larger than any
 * cache (best of N), and the peak rate of the instruction a kernel's inner
 * loop uses (vfmadd231ps, vdpbf16ps, vpdpbusd zmm or ymm, vpmaddubsw; see
 * mr_uk_instr). */
#include <omp.h>
#include <string.h>
#include <sys/mman.h>

#include "kernels/kern_internal.h"

double mr__probe_fma_avx512(int64_t iters);
double mr__probe_dpbf16_avx512(int64_t iters);
double mr__probe_dpbusd_avx512(int64_t iters);
double mr__probe_fma_avx2(int64_t iters);
double mr__probe_maddubs_avx2(int64_t iters);
double mr__probe_dpbusd_avx2vnni(int64_t iters);

bool mr_probe_instr_is_int(mr_probe_instr which) {
    return which == MR_PROBE_DPBUSD || which == MR_PROBE_MADDUBS || which == MR_PROBE_DPBUSD_YMM;
}

/* Sum of 64-bit words; the optimizer vectorizes it; 8 independent sums. */
static uint64_t sum_words(const uint64_t *p, size_t n) {
    uint64_t s[8] = {0};
    for (size_t i = 0; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += p[i + j];
    return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

uint64_t *mr_probe_buf_new(size_t bytes) {
    size_t n = bytes / 8;
    /* on 2 MiB boundaries with transparent huge pages asked for, as the
     * packed expert weights are (pack.c): the same TLB conditions */
    const size_t huge = (size_t)2 << 20;
    uint64_t *buf = mr_aligned_alloc(n * 8 >= huge ? huge : 64, n ? n * 8 : 64);
    if (!buf) return NULL;
#ifdef MADV_HUGEPAGE
    if (n * 8 >= huge) (void)madvise(buf, n * 8, MADV_HUGEPAGE);
#endif
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) buf[i] = i; /* pre-fault, with the same thread split as below */
    return buf;
}

/* the probe's sums land here, so that no compiler drops the reads */
static volatile uint64_t probe_sink;

double mr_probe_read_once(const uint64_t *buf, size_t bytes) {
    const size_t n = bytes / 8;
    /* ymm loads with the kernels' prefetch on both x86 tables: zmm loads read 15% less on
     * the Intel Xeon VM of 2026-12-05, so they would understate the machine's bandwidth */
    const int vec = mr_kernels_get()->level >= MR_ISA_AVX2;
    uint64_t t0 = mr_now_ns(), tot = 0;
#pragma omp parallel reduction(+ : tot)
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        size_t chunk = n / (size_t)nt / 8 * 8, lo = chunk * (size_t)id, hi = id == nt - 1 ? n : lo + chunk;
        tot += vec ? mr__probe_read_avx2(buf + lo, hi - lo) : sum_words(buf + lo, hi - lo);
    }
    uint64_t t1 = mr_now_ns();
    probe_sink = tot;
    return (double)(n * 8) / (double)(t1 - t0);
}

double mr_probe_read_bw(size_t bytes, int reps) {
    uint64_t *buf = mr_probe_buf_new(bytes);
    if (!buf) return 0.0;
    double best = 0.0;
    for (int r = 0; r < reps; r++) {
        double gbs = mr_probe_read_once(buf, bytes);
        if (gbs > best) best = gbs;
    }
    mr_aligned_free(buf);
    return best;
}

/* the probe function of an instruction on this table's ISA, with its ops per
 * iteration (12 chains x lanes x 2 per multiply-add); NULL if none */
typedef double (*probe_fn)(int64_t);
static probe_fn peak_fn(mr_probe_instr which, double *ops, const char **name) {
    const mr_kernels *k = mr_kernels_get();
    const uint32_t f = mr_cpu()->flags;
    const bool a512 = k->level == MR_ISA_AVX512;
    *name = "scalar (not probed)";
    if (which == MR_PROBE_FMA && a512) return *ops = 12 * 16 * 2, *name = "vfmadd231ps zmm", mr__probe_fma_avx512;
    if (which == MR_PROBE_FMA && k->level == MR_ISA_AVX2)
        return *ops = 12 * 8 * 2, *name = "vfmadd231ps ymm", mr__probe_fma_avx2;
    if (which == MR_PROBE_DPBF16 && a512 && (f & MR_CPU_AVX512BF16))
        return *ops = 12 * 32 * 2, *name = "vdpbf16ps zmm", mr__probe_dpbf16_avx512;
    if (which == MR_PROBE_DPBUSD && a512 && (f & MR_CPU_AVX512VNNI))
        return *ops = 12 * 64 * 2, *name = "vpdpbusd zmm", mr__probe_dpbusd_avx512;
    if (which == MR_PROBE_MADDUBS && (a512 || k->level == MR_ISA_AVX2))
        return *ops = 12 * 32 * 2, *name = "vpmaddubsw ymm", mr__probe_maddubs_avx2;
    if (which == MR_PROBE_DPBUSD_YMM && k->level == MR_ISA_AVX2 && (f & MR_CPU_AVXVNNI))
        return *ops = 12 * 32 * 2, *name = "vpdpbusd ymm", mr__probe_dpbusd_avx2vnni;
    if (which == MR_PROBE_TDPBF16 && a512 && (f & MR_CPU_AMX_BF16) && mr__amx_ready())
        return *ops = 4 * 16 * 16 * 32 * 2, *name = "tdpbf16ps (AMX)", mr__probe_tdpbf16_amx;
    return NULL;
}

static double peak_pass(probe_fn fn, double ops, int64_t iters) {
    uint64_t t0 = mr_now_ns();
    double sink = 0;
    int nt = 1;
#pragma omp parallel reduction(+ : sink)
    {
#pragma omp single
        nt = omp_get_num_threads();
        sink += fn(iters);
    }
    uint64_t t1 = mr_now_ns();
    double g = (double)iters * nt * ops / (double)(t1 - t0 ? t1 - t0 : 1);
    if (sink == 12345.678) g += 1e-9; /* keep the result alive */
    return g;
}

double mr_probe_peak(mr_probe_instr which, const char **instr) {
    double ops = 0;
    const char *name;
    probe_fn fn = peak_fn(which, &ops, &name);
    if (instr) *instr = name;
    if (!fn) return 0.0;
    double best = 0.0;
    for (int r = 0; r < 3; r++) {
        double g = peak_pass(fn, ops, 8 * 1000 * 1000);
        if (g > best) best = g;
    }
    return best;
}

double mr_probe_peak_once(mr_probe_instr which, int64_t iters) {
    double ops = 0;
    const char *name;
    probe_fn fn = peak_fn(which, &ops, &name);
    return fn && iters > 0 ? peak_pass(fn, ops, iters) : 0.0;
}

double mr_probe_peak_gflops(const char **instr) { return mr_probe_peak(MR_PROBE_FMA, instr); }
