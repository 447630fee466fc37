/* bench_util.h — what the `moerun bench` benchmarks (bench_moe.c,
 * bench_dense.c) share: option numbers and token lists, the seeded
 * generator, sorting for medians, the /proc readers for peak RSS and
 * transparent huge pages, and the --json file (checked before the timing
 * starts, then written beside its target and renamed, so that a failed run
 * leaves no partial file). */
#ifndef MR_BENCH_UTIL_H
#define MR_BENCH_UTIL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moerun/moe.h"

/* The most token counts one --tokens list holds. */
#define MR_BENCH_MAX_TS 16

/* Benchmark entry points (argv[0] is the benchmark's name); exit statuses as cli.h. */
int mr_bench_moe(int argc, char **argv);
int mr_bench_dense(int argc, char **argv);
int mr_bench_engine(int argc, char **argv);
int mr_bench_grammar(int argc, char **argv);

/* bench moe (bench_moe.c; bench_moe_ep.c under mpirun): the seeded synthetic
 * weights of experts [first, first + n) of a layer (each expert from its
 * own stream: any split over ranks makes the same experts), and the routing
 * of T tokens (k distinct experts each, weights 1/k; skewed: 80% of the
 * picks among the first 32; logits, when not NULL, whose top-k are those). */
mr_status mr_bench_moe_weights(mr_format fmt, int first, int n, int64_t H, int64_t I, uint64_t seed,
                               mr_moe_weights **w);
void mr_bench_moe_routing(uint64_t *s, bool skewed, int64_t T, int E, int k, int32_t *ids, float *w, float *logits);

/* bench moe --moe-a2a-backend mpi under mpirun (bench_moe_ep.c): what it runs. */
typedef struct {
    const mr_moe_runner *run;
    mr_format fmt;
    const char *fmt_name;
    mr_act_mode mode;
    int E, k, iters, threads;
    int64_t H, I;
    uint64_t seed;
    bool skewed, no_single;
    const int64_t *Ts;
    int nT;
    int64_t maxT;
    const char *json_path;
} mr_bench_moe_ep_opts;
int mr_bench_moe_ep(const mr_bench_moe_ep_opts *o);

/* An integer option value in [lo, hi] into *out: 0; otherwise 1, after a
 * message on stderr naming the option. */
int mr_bench_num(const char *opt, const char *v, long lo, long hi, long *out);

/* A comma list of at most MR_BENCH_MAX_TS token counts in [1, max] into Ts:
 * 0; 1 for a malformed or empty list. */
int mr_bench_parse_tokens(const char *list, long long max, int64_t Ts[MR_BENCH_MAX_TS], int *nT);

/* splitmix64: the seeded stream every synthetic weight and routing comes from */
uint64_t mr_bench_rng(uint64_t *s);

/* n E4M3 codes of a block-quantized trained weight into d: |N(0, 1)| * MR_BENCH_FP8_SIGMA rounded
 * to E4M3, one magnitude per 2^15-quantile, random signs (the block multiplier maps a block's
 * largest |w|, about 6 sigma, to 448). About 1.5e-4 of them are subnormal codes, as in trained FP8
 * checkpoints: uniform codes would make one in eighteen a subnormal, which no checkpoint has and
 * which the AVX2 kernels decode another, slower way (mr_pmatrix.tsub). Two draws of s per 8 codes. */
#define MR_BENCH_FP8_SIGMA 75.0f
void mr_bench_fp8_codes(uint8_t *d, size_t n, uint64_t *s);

/* qsort comparator of doubles, ascending */
int mr_bench_cmp_double(const void *a, const void *b);

/* VmHWM (the peak RSS) of this process in bytes, 0 if unknown */
size_t mr_bench_peak_rss(void);
/* Restarts the peak-RSS count (VmHWM) from the current RSS (best effort) */
void mr_bench_peak_rss_reset(void);
/* AnonHugePages (smaps_rollup) in bytes: the transparent huge pages backing anonymous memory */
size_t mr_bench_anon_huge(void);

/* Whether path's temporary file can be created (and removes it): 0 if so.
 * Run before the timing, so that a bad --json fails in a second, not after minutes. */
int mr_bench_json_check(const char *path);
/* A whole text file (at most max bytes), NUL-terminated, in *out (free()); 0, or 1 with the reason printed. */
int mr_bench_read_text(const char *cmd, const char *path, size_t max, char **out);
/* root into path through path.tmp and a rename: 0 on success; on failure
 * nothing is left at path or path.tmp. Does not take root. */
int mr_bench_json_write(json_t *root, const char *path);

#endif
