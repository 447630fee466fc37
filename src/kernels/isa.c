/* isa.c — the kernel ISA levels, one table (moerun/kernels.h): each level's
 * name, the CPU features its kernel files are compiled for (the flags of
 * CMakeLists.txt for *_avx2.c and *_avx512.c) and the fillers that add its
 * entries to a dispatch table. The resolver (config/) and mr_kernels_init
 * both read it, so the level resolution names is the level that runs. */
#include "kernels/kern_internal.h"

#define F_AVX2 (MR_CPU_AVX2 | MR_CPU_FMA | MR_CPU_F16C)
#define F_AVX512                                                                                              \
    (F_AVX2 | MR_CPU_AVX512F | MR_CPU_AVX512BW | MR_CPU_AVX512VL | MR_CPU_AVX512DQ | MR_CPU_AVX512VNNI | \
     MR_CPU_AVX512VBMI)
/* hidden below the top level: nothing below may dispatch on them */
#define F_FAMILY_512                                                                                    \
    ((F_AVX512 & ~F_AVX2) | MR_CPU_AVX512BF16 | MR_CPU_AVX512FP16 | MR_CPU_AMX_TILE | MR_CPU_AMX_BF16 | \
     MR_CPU_AMX_INT8)

static void fill_generic(mr_kernels *k) {
    mr__kernels_fill_generic(k);
    mr__uk_fill_generic(k);
}
static void fill_avx2(mr_kernels *k) {
    mr__kernels_fill_avx2(k);
    mr__uk_fill_avx2(k);
    mr__dense_fill_avx2(k);
    if (k->flags & MR_CPU_AVXVNNI) mr__uk_fill_avx2vnni(k); /* an extension no level requires */
}
static void fill_avx512(mr_kernels *k) {
    mr__kernels_fill_avx512(k);
    mr__uk_fill_avx512(k);
    mr__dense_fill_avx512(k);
    if (k->flags & MR_CPU_AVX512BF16) { /* an extension no level requires */
        mr__uk_fill_avx512bf16(k);
        mr__dense_fill_avx512bf16(k); /* the dense rows on vdpbf16ps for inputs of bf16 values */
    }
    const uint32_t amx = MR_CPU_AMX_TILE | MR_CPU_AMX_BF16;
    if ((k->flags & amx) == amx && mr__amx_ready()) { /* another */
        mr__uk_fill_avx512amx(k);
        mr__dense_fill_avx512amx(k);
    }
}

static const struct {
    const char *name;
    uint32_t features;
    void (*fill)(mr_kernels *k); /* adds the level's entries over the levels below */
} levels[MR_ISA_COUNT] = {
    [MR_ISA_GENERIC] = {"generic", 0, fill_generic},
    [MR_ISA_AVX2] = {"avx2", F_AVX2, fill_avx2},
    [MR_ISA_AVX512] = {"avx512", F_AVX512, fill_avx512},
};

const char *mr_kernel_isa_name(mr_kernel_isa i) {
    if ((int)i < 0 || i >= MR_ISA_COUNT) return "unknown";
    return levels[i].name;
}

uint32_t mr_kernel_isa_features(mr_kernel_isa i) {
    if ((int)i < 0 || i >= MR_ISA_COUNT) return 0;
    return levels[i].features;
}

mr_kernel_isa mr_kernel_isa_best(uint32_t flags) {
    for (int i = MR_ISA_COUNT - 1; i > 0; i--)
        if ((flags & levels[i].features) == levels[i].features) return (mr_kernel_isa)i;
    return MR_ISA_GENERIC;
}

uint32_t mr_kernel_isa_above(mr_kernel_isa i) {
    uint32_t above = 0;
    for (int j = (int)i + 1; j < MR_ISA_COUNT; j++) above |= levels[j].features;
    if (i < MR_ISA_COUNT - 1) above |= F_FAMILY_512;
    return above & ~mr_kernel_isa_features(i);
}

void mr__kernels_fill_level(mr_kernels *k, mr_kernel_isa level) {
    for (int i = 0; i <= (int)level; i++) levels[i].fill(k);
    k->level = level;
    k->isa = levels[level].name;
}
