/* bench_util.c — the helpers the `moerun bench` benchmarks share
 * (bench_util.h): option parsing, the seeded generator, /proc readers and
 * the --json file's temporary-then-rename write. */
#include "bench_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_model.h"
#include "moerun/base.h"

int mr_bench_num(const char *opt, const char *v, long lo, long hi, long *out) {
    if (!mr_cli_parse_long(v, lo, hi, out)) return 0;
    fprintf(stderr, "moerun bench: %s: %s\n", opt, mr_error_last());
    return 1;
}

int mr_bench_parse_tokens(const char *list, long long max, int64_t Ts[MR_BENCH_MAX_TS], int *nT) {
    *nT = 0;
    for (const char *p = list; *p;) {
        char *end;
        long long t = strtoll(p, &end, 10);
        if (end == p || t < 1 || t > max || *nT == MR_BENCH_MAX_TS || (*end && *end != ',') || (*end == ',' && !end[1]))
            return 1;
        Ts[(*nT)++] = t;
        p = *end == ',' ? end + 1 : end;
    }
    return *nT == 0;
}

uint64_t mr_bench_rng(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* E4M3 magnitudes by 2^15-quantile of |N(0, 1)| (filled on the first call; the benchmarks draw from one thread) */
static uint8_t g_fp8_mag[1 << 15];

static void fp8_mag_table(void) {
    if (g_fp8_mag[(1 << 15) - 1]) return;
    for (int i = 0; i < 1 << 15; i++) {
        const double u = (i + 0.5) / (double)(1 << 15); /* P(|z| < q) = erf(q / sqrt 2) = u */
        double lo = 0, hi = 10;
        for (int it = 0; it < 60; it++) {
            const double mid = 0.5 * (lo + hi);
            if (erf(mid / sqrt(2.0)) < u) lo = mid;
            else hi = mid;
        }
        const float v = fminf((float)(0.5 * (lo + hi)) * MR_BENCH_FP8_SIGMA, 448.0f);
        g_fp8_mag[i] = mr_f32_to_e4m3(v);
    }
}

void mr_bench_fp8_codes(uint8_t *d, size_t n, uint64_t *s) {
    fp8_mag_table();
    for (size_t i = 0; i < n; i += 8) {
        const uint64_t r0 = mr_bench_rng(s), r1 = mr_bench_rng(s);
        for (size_t b = 0; b < 8 && i + b < n; b++) {
            const uint64_t r = (b < 4 ? r0 : r1) >> (16 * (b & 3));
            d[i + b] = (uint8_t)(g_fp8_mag[r & 0x7FFF] | ((r >> 8) & 0x80));
        }
    }
}

int mr_bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

size_t mr_bench_peak_rss(void) { return mr_mem_rss_peak(); }
void mr_bench_peak_rss_reset(void) { mr_mem_rss_peak_reset(); }
size_t mr_bench_anon_huge(void) { return mr_mem_proc_kb("/proc/self/smaps_rollup", "AnonHugePages:"); }

/* path + ".tmp" into tmp; 0 if it fits */
static int json_tmp(const char *path, char *tmp, size_t n) { return snprintf(tmp, n, "%s.tmp", path) >= (int)n; }

int mr_bench_json_check(const char *path) {
    char tmp[4096];
    FILE *jf = json_tmp(path, tmp, sizeof tmp) ? NULL : fopen(tmp, "w");
    if (!jf) return 1;
    fclose(jf);
    remove(tmp);
    return 0;
}

int mr_bench_json_write(json_t *root, const char *path) {
    char tmp[4096];
    if (!root || json_tmp(path, tmp, sizeof tmp)) return 1;
    if (json_dump_file(root, tmp, JSON_INDENT(2)) != 0 || rename(tmp, path) != 0) {
        remove(tmp);
        return 1;
    }
    return 0;
}

int mr_bench_read_text(const char *cmd, const char *path, size_t max, char **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "moerun %s: cannot open %s\n", cmd, path);
        return 1;
    }
    char *p = malloc(max + 2);
    const size_t n = p ? fread(p, 1, max + 1, f) : 0;
    const bool bad = !p || ferror(f) || n > max;
    fclose(f);
    if (bad) {
        fprintf(stderr, "moerun %s: %s: %s\n", cmd, path, !p ? "out of memory" : n > max ? "too large" : "cannot read");
        free(p);
        return 1;
    }
    p[n] = 0;
    *out = p;
    return 0;
}
