/* first_touch.c — how fast fresh anonymous memory becomes usable: the first write to each 4 KiB of a
 * new mapping (the kernel allocating and zeroing it) with transparent huge pages asked for or refused,
 * then a memset of the same bytes (already mapped). The expert packs are written this way at load
 * (bench/README.md, "Loading"). Not part of CMake.
 *
 *   make -C dev/perf first_touch && dev/perf/first_touch [MiB]   (default 2048) */
#define _DEFAULT_SOURCE /* MADV_HUGEPAGE */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    const long mib = argc > 1 ? atol(argv[1]) : 2048;
    if (mib < 1 || mib > (1L << 20)) {
        fprintf(stderr, "usage: first_touch [MiB]\n");
        return 2;
    }
    const size_t n = (size_t)mib << 20;
    for (int round = 0; round < 2; round++)
        for (int huge = 1; huge >= 0; huge--) {
            char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED) {
                perror("mmap");
                return 1;
            }
            (void)madvise(p, n, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
            const double t0 = now();
            for (size_t i = 0; i < n; i += 4096) p[i] = 1;
            const double t1 = now();
            memset(p, 2, n);
            const double t2 = now();
            printf("%ld MiB, %s: first touch %.2f s (%.2f GB/s), memset after %.2f GB/s\n", mib,
                   huge ? "huge pages" : "4 KiB pages", t1 - t0, (double)n / (t1 - t0) / 1e9, (double)n / (t2 - t1) / 1e9);
            munmap(p, n);
        }
    return 0;
}
