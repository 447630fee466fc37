/* stream_order.c — one core streaming 8 MiB buffers tile by tile (27 KiB,
 * an NVFP4 tile of 16 x 3072) with ymm loads and one software prefetch per
 * line 16 KiB ahead, the same instructions in five orders within the
 * 128-byte step (kernel work; not part of CMake):
 *
 *   make -C dev/perf stream_order && dev/perf/stream_order
 *
 * Only the place of the prefetches among the loads differs, and on the
 * Intel Xeon VM of 2026-12-05 that moved the read rate by a fifth
 * (bench/README.md, "The AVX2 stream-only read"). */
#define _DEFAULT_SOURCE
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define PFD 16384
#define LD(k) s##k = _mm256_add_epi64(s##k, _mm256_load_si256((const __m256i *)(p + i + 32 * k)))
#define PFL(o) _mm_prefetch((const char *)(p + i + (o)) + PFD, _MM_HINT_T2)
#define FENCE __asm__ volatile("" ::: "memory") /* keeps the compiler to the written order */
#define ORDER(name, BODY)                                                                                     \
    __attribute__((noinline)) static uint64_t name(const uint8_t *p, size_t n) {                               \
        __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;                                         \
        for (size_t i = 0; i + 128 <= n; i += 128) { BODY }                                                   \
        s0 = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));                              \
        return (uint64_t)_mm256_extract_epi64(s0, 0);                                                         \
    }
ORDER(o_pf_first, PFL(0); PFL(64); FENCE; LD(0); LD(1); LD(2); LD(3);)
ORDER(o_probe, LD(0); FENCE; PFL(0); FENCE; LD(1); LD(2); FENCE; PFL(64); FENCE; LD(3);)
ORDER(o_load_pf_pf, LD(0); FENCE; PFL(0); PFL(64); FENCE; LD(1); LD(2); LD(3);)
ORDER(o_pf_last, LD(0); LD(1); LD(2); LD(3); FENCE; PFL(0); PFL(64);)
ORDER(o_per_line, PFL(0); FENCE; LD(0); LD(1); FENCE; PFL(64); FENCE; LD(2); LD(3);)

enum { NB = 128, EB = 8 << 20, TB = 27648, ROUNDS = 12 };

int main(void) {
    static uint8_t *bufs[NB];
    for (int i = 0; i < NB; i++) {
        if (posix_memalign((void **)&bufs[i], (size_t)2 << 20, EB)) return 1;
        (void)madvise(bufs[i], EB, MADV_HUGEPAGE);
        memset(bufs[i], i, EB);
    }
    uint64_t (*const f[5])(const uint8_t *, size_t) = {o_pf_first, o_probe, o_load_pf_pf, o_pf_last, o_per_line};
    const char *const name[5] = {"PF PF L L L L", "L PF L L PF L (the read probe)", "L PF PF L L L",
                                 "L L L L PF PF", "PF L L PF L L (per line)"};
    unsigned seed = 3;
    volatile uint64_t sink = 0;
    double best[5] = {0}, sum[5] = {0};
    for (int round = 0; round < ROUNDS; round++)
        for (int v = 0; v < 5; v++) {
            int pick[8];
            for (int j = 0; j < 8; j++) pick[j] = rand_r(&seed) % NB;
            const double t0 = now_s();
            for (int j = 0; j < 8; j++)
                for (size_t t = 0; t < EB / TB; t++) sink += f[v](bufs[pick[j]] + t * TB, TB);
            const double g = (double)(EB / TB) * TB * 8 / (now_s() - t0) / 1e9;
            sum[v] += g;
            if (g > best[v]) best[v] = g;
        }
    printf("one core, 8 random 8 MiB buffers a round, tiles of %d bytes, %d rounds:\n", TB, ROUNDS);
    for (int v = 0; v < 5; v++) printf("  %-32s mean %5.1f GB/s, best %5.1f\n", name[v], sum[v] / ROUNDS, best[v]);
    for (int i = 0; i < NB; i++) free(bufs[i]);
    return 0;
}
