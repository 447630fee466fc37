/* cpu.c — runtime CPU feature detection (cpuid + xgetbv) and the feature mask.
 *
 * A feature counts as present only when the CPU reports it AND the OS saves
 * the register state it needs (XCR0 via xgetbv): YMM for AVX2/FMA/F16C,
 * opmask+ZMM for AVX-512, XTILECFG/XTILEDATA for AMX. MOERUN_CPU_MASK hides
 * features so that every kernel path can be exercised on one machine. */
#include <ctype.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moerun/base.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
static void cpuid2(unsigned leaf, unsigned sub, unsigned r[4]) {
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
}
static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

static mr_cpu_info info;
static pthread_once_t once = PTHREAD_ONCE_INIT;

#define BIT(x, n) ((((x) >> (n)) & 1u) != 0)

static uint32_t detect(char *brand, size_t brand_n) {
    uint32_t f = 0;
    brand[0] = 0;
#if defined(__x86_64__) || defined(__i386__)
    unsigned r[4];
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf < 1) return 0;
    cpuid2(1, 0, r);
    unsigned ecx1 = r[2];
    bool osxsave = BIT(ecx1, 27);
    uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    bool ymm = (xcr0 & 0x6) == 0x6;
    bool zmm = ymm && (xcr0 & 0xE0) == 0xE0;
    bool tile = (xcr0 & 0x60000) == 0x60000;
    if (BIT(ecx1, 20)) f |= MR_CPU_SSE42;
    if (ymm && BIT(ecx1, 12)) f |= MR_CPU_FMA;
    if (ymm && BIT(ecx1, 29)) f |= MR_CPU_F16C;
    if (max_leaf >= 7) {
        cpuid2(7, 0, r);
        unsigned ebx7 = r[1], ecx7 = r[2], edx7 = r[3], max_sub = r[0];
        if (ymm && BIT(ebx7, 5)) f |= MR_CPU_AVX2;
        if (zmm && BIT(ebx7, 16)) f |= MR_CPU_AVX512F;
        if (zmm && BIT(ebx7, 17)) f |= MR_CPU_AVX512DQ;
        if (zmm && BIT(ebx7, 30)) f |= MR_CPU_AVX512BW;
        if (zmm && BIT(ebx7, 31)) f |= MR_CPU_AVX512VL;
        if (zmm && BIT(ecx7, 1)) f |= MR_CPU_AVX512VBMI;
        if (zmm && BIT(ecx7, 11)) f |= MR_CPU_AVX512VNNI;
        if (zmm && BIT(edx7, 23)) f |= MR_CPU_AVX512FP16;
        if (tile && BIT(edx7, 24)) f |= MR_CPU_AMX_TILE;
        if (tile && BIT(edx7, 22)) f |= MR_CPU_AMX_BF16;
        if (tile && BIT(edx7, 25)) f |= MR_CPU_AMX_INT8;
        if (max_sub >= 1) {
            cpuid2(7, 1, r);
            if (ymm && BIT(r[0], 4)) f |= MR_CPU_AVXVNNI;
            if (zmm && BIT(r[0], 5)) f |= MR_CPU_AVX512BF16;
        }
    }
    if ((unsigned)__get_cpuid_max(0x80000000u, NULL) >= 0x80000004u && brand_n >= 49) {
        unsigned b[12];
        for (unsigned i = 0; i < 3; i++) cpuid2(0x80000002u + i, 0, &b[4 * i]);
        memcpy(brand, b, 48);
        brand[48] = 0;
        /* trim leading/trailing spaces */
        char *s = brand;
        while (*s == ' ') s++;
        memmove(brand, s, strlen(s) + 1);
        size_t n = strlen(brand);
        while (n > 0 && brand[n - 1] == ' ') brand[--n] = 0;
    }
#else
    (void)brand_n;
#endif
    if (brand[0] == 0) snprintf(brand, brand_n, "unknown CPU");
    return f;
}

static int count_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

const char *mr_cpu_feature_name(uint32_t bit) {
    switch (bit) {
#define MR__CPU_NAME(name, b, str) \
    case MR_CPU_##name:             \
        return str;
        MR_CPU_FEATURE_MAP(MR__CPU_NAME)
#undef MR__CPU_NAME
    }
    return "?";
}

#define MR__GROUP_AVX512                                                                                   \
    (MR_CPU_AVX512F | MR_CPU_AVX512BW | MR_CPU_AVX512VL | MR_CPU_AVX512DQ | MR_CPU_AVX512VNNI | MR_CPU_AVX512BF16 | \
     MR_CPU_AVX512FP16 | MR_CPU_AVX512VBMI | MR_CPU_AMX_TILE | MR_CPU_AMX_BF16 | MR_CPU_AMX_INT8)
#define MR__GROUP_AMX (MR_CPU_AMX_TILE | MR_CPU_AMX_BF16 | MR_CPU_AMX_INT8)

mr_status mr_cpu_parse_mask(const char *s, uint32_t *out) {
    uint32_t m = 0;
    char tok[32];
    *out = 0;
    if (s == NULL) return MR_OK;
    while (*s) {
        while (*s == ',' || isspace((unsigned char)*s)) s++;
        if (!*s) break;
        size_t n = 0;
        while (s[n] && s[n] != ',' && !isspace((unsigned char)s[n])) n++;
        if (n >= sizeof tok) return mr_error_set(MR_EINVAL, "CPU mask entry '%.*s' is too long", (int)n, s);
        for (size_t i = 0; i < n; i++) tok[i] = (char)tolower((unsigned char)s[i]);
        tok[n] = 0;
        s += n;
        if (!strcmp(tok, "avx512")) {
            m |= MR__GROUP_AVX512;
        } else if (!strcmp(tok, "avx2")) {
            m |= MR_CPU_AVX2 | MR_CPU_FMA | MR_CPU_F16C | MR_CPU_AVXVNNI | MR__GROUP_AVX512;
        } else if (!strcmp(tok, "amx")) {
            m |= MR__GROUP_AMX;
        } else if (!strcmp(tok, "all")) {
            m |= 0xFFFFFFFFu;
        } else if (!strcmp(tok, "none")) {
            /* nothing hidden */
        } else {
            uint32_t found = 0;
            for (int b = 0; b < MR_CPU_FEATURE_COUNT; b++)
                if (!strcmp(tok, mr_cpu_feature_name(1u << b))) found = 1u << b;
            if (!found) {
                return mr_error_set(MR_EINVAL,
                                    "unknown CPU feature '%s' in mask; valid: avx512, avx2, amx, all, none, "
                                    "sse4.2, avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, "
                                    "avx512bf16, avx512fp16, avx512vbmi, amx-tile, amx-bf16, amx-int8, avx-vnni",
                                    tok);
            }
            m |= found;
        }
    }
    *out = m;
    return MR_OK;
}

static void init_once(void) {
    info.detected = detect(info.brand, sizeof info.brand);
    info.n_cores = count_cores();
    const char *env = getenv("MOERUN_CPU_MASK");
    uint32_t hidden = 0;
    if (env && mr_cpu_parse_mask(env, &hidden) != MR_OK) {
        fprintf(stderr, "moerun: warning: ignoring MOERUN_CPU_MASK: %s\n", mr_error_last());
        mr_error_clear();
        hidden = 0;
    }
    info.hidden = hidden;
    info.host = info.detected & ~hidden;
    info.flags = info.detected & ~hidden;
}

const mr_cpu_info *mr_cpu(void) {
    pthread_once(&once, init_once);
    return &info;
}

uint32_t mr_cpu_set_hidden(uint32_t hidden) {
    pthread_once(&once, init_once);
    uint32_t old = info.hidden;
    info.hidden = hidden;
    info.flags = info.detected & ~hidden;
    return old;
}
