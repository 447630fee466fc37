/* testutil.c — see testutil.h. */
#include "testutil.h"

#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moerun/kernels.h"

const char *tu_data(const char *rel) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", MR_TEST_DATA, rel);
    return buf;
}

void *tu_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(n > 0 ? (size_t)n : 1);
    if (p && n > 0 && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p && len) *len = (size_t)n;
    return p;
}

int tu_write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = len ? fwrite(data, 1, len, f) : 0;
    int rc = fclose(f);
    return (w == len && rc == 0) ? 0 : -1;
}

char *tu_tmpdir(const char *tag) {
    char tmpl[4096];
    snprintf(tmpl, sizeof tmpl, "%s/tmp_%s_XXXXXX", MR_BINARY_DIR, tag);
    char *d = mkdtemp(tmpl);
    if (!d) return NULL;
    return strdup(d);
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

void tu_rmtree(const char *path) {
    if (path) nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

uint64_t tu_next(tu_rng *r) {
    /* splitmix64 */
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float tu_uniform(tu_rng *r) { return (float)(tu_next(r) >> 40) * (1.0f / 16777216.0f); }

float tu_normal(tu_rng *r) {
    float u1 = tu_uniform(r), u2 = tu_uniform(r);
    if (u1 < 1e-7f) u1 = 1e-7f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2);
}

/* MOERUN_TEST_ISA = a level, optionally "+" CPU extensions a level's filler
 * may take (mr_kernels.flags), e.g. "avx2+avx-vnni", "avx512+avx512bf16",
 * "avx512+avx512bf16+amx" (mr_cpu_parse_mask's names, '+' between them);
 * without them the run hides those extensions, so "avx2" tests the AVX2
 * kernels alone and "avx512" the AVX-512 level's FMA pair dots. */
void tu_isa_begin(const char *suite) {
    const char *want = getenv("MOERUN_TEST_ISA");
    if (want == NULL || *want == 0) return;
    const uint32_t extensions = MR_CPU_AVXVNNI | MR_CPU_AVX512BF16 | MR_CPU_AMX_TILE | MR_CPU_AMX_BF16 | MR_CPU_AMX_INT8;
    const char *plus = strchr(want, '+');
    const size_t ln = plus ? (size_t)(plus - want) : strlen(want);
    char exts[64] = ""; /* the extensions after the level, '+' between them */
    if (plus && strlen(plus + 1) < sizeof exts)
        for (size_t i = 0; plus[1 + i]; i++) exts[i] = plus[1 + i] == '+' ? ',' : plus[1 + i];
    uint32_t ext = 0;
    int level = -1;
    for (int i = 0; i < MR_ISA_COUNT; i++) {
        const char *nm = mr_kernel_isa_name((mr_kernel_isa)i);
        if (strlen(nm) == ln && !strncmp(want, nm, ln)) level = i;
    }
    if (level < 0 || (plus && (mr_cpu_parse_mask(exts, &ext) != MR_OK || (ext & ~extensions) || !ext))) {
        fprintf(stderr, "%s: MOERUN_TEST_ISA=%s is not a kernel level (with optional +avx-vnni, +avx512bf16, +amx)\n", suite,
                want);
        exit(2);
    }
    const mr_cpu_info *ci = mr_cpu();
    uint32_t need = mr_kernel_isa_features((mr_kernel_isa)level) | ext;
    if ((ci->flags & need) != need) {
        char miss[256] = "";
        size_t used = 0;
        for (int b = 0; b < MR_CPU_FEATURE_COUNT; b++) {
            if (!(need & ~ci->flags & (1u << b))) continue;
            int w = snprintf(miss + used, sizeof miss - used, "%s%s", used ? " " : "", mr_cpu_feature_name(1u << b));
            if (w > 0 && (size_t)w < sizeof miss - used) used += (size_t)w;
        }
        printf("SKIPPED: %s on %s kernels: this host lacks %s%s\n", suite, want, miss,
               ci->hidden & need ? " (hidden by MOERUN_CPU_MASK)" : "");
        fflush(stdout);
        exit(TU_SKIP);
    }
    mr_cpu_set_hidden(ci->hidden | mr_kernel_isa_above((mr_kernel_isa)level) | (extensions & ~ext));
    printf("%s: %s kernels (MOERUN_TEST_ISA)\n", suite, want);
}
