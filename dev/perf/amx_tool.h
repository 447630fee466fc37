/* amx_tool.h — what the standalone AMX harnesses of dev/perf (fp8_decode_floor.c, amx_i8_block.c)
 * share: a monotonic clock, the tile configuration record and its load (the whole record as the
 * asm's memory operand: GCC 12's _tile_loadconfig names only its first 8 bytes, and a harness got a
 * #GP from the stores it then dropped), and the request for the tile data state. */
#ifndef DEV_PERF_AMX_TOOL_H
#define DEV_PERF_AMX_TOOL_H
#define _GNU_SOURCE /* syscall() */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static inline double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

/* palette 1, tiles 0..n-1 of 16 rows x 64 bytes, the rest unused */
static inline amx_cfg amx_cfg_full(int n) {
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < n; i++) c.colsb[i] = 64, c.rows[i] = 16;
    return c;
}

static inline void amx_load_cfg(const amx_cfg *c) { __asm__ volatile("ldtilecfg %0" : : "m"(*c)); }

/* ARCH_REQ_XCOMP_PERM for XTILEDATA: true where Linux grants this process the tile state */
static inline int amx_grant(void) { return syscall(SYS_arch_prctl, 0x1023, 18) == 0; }

#endif
