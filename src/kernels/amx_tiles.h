/* amx_tiles.h — what the AMX files (*_avx512amx.c, compiled with -mamx-tile
 * -mamx-bf16) share: the tile configuration record and the B-tile prefetch.
 * Include after uk_avx512.h. */
#ifndef MOERUN_AMX_TILES_H
#define MOERUN_AMX_TILES_H

/* the tile palette 1 configuration (Intel SDM, LDTILECFG) */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

/* LDTILECFG of the whole record. GCC 12's _tile_loadconfig gives the asm only the record's first 8
 * bytes as its memory operand ("m" of a pointer-sized object), so the compiler may drop the stores to
 * the rest as dead; a scratch harness here got a #GP from exactly that (rows 8-15 left as stack
 * garbage). The whole record as the operand keeps them. */
INL void amx_load_cfg(const amx_cfg *c) { __asm__ volatile("ldtilecfg %0" : : "m"(*c)); }

/* Tile loads and stores that tell the compiler they touch memory. GCC 12's _tile_loadd and _tile_stored
 * pass the address to the asm as a register only, with no memory operand or clobber: the compiler may
 * then move or drop the vector stores that fill a B tile's scratch before its tileloadd, or reuse values
 * it loaded from a C buffer before the tilestored that rewrote it. The builds so far kept program order
 * (the kernel tests pass); these make it a guarantee. The tile numbers are literal (t is stringified
 * after the argument expands). */
#define AMX_LOADD(t, base, stride) AMX_LOADD_(t, base, stride)
#define AMX_LOADD_(t, base, stride)                                                                   \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t : : "r"((const void *)(base)), "r"((long)(stride)) \
                     : "memory")
#define AMX_STORED(t, base, stride) AMX_STORED_(t, base, stride)
#define AMX_STORED_(t, base, stride)                                                                  \
    __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" : : "r"((void *)(base)), "r"((long)(stride))   \
                     : "memory")

/* the 16 lines of a B tile, PFD ahead (L2), and with l1 also 4 KiB ahead into L1: the expert
 * kernel's stream (bench/README.md, "The AMX BF16 expert kernel with an L1 prefetch"; the dense
 * kernel, which runs each B tile for several token groups, read 12-17% less with it at 16-64 tokens) */
INL void pf_tile(const uint8_t *p, const int l1) {
    #pragma GCC unroll 16
    for (int l = 0; l < 1024; l += 64) {
        PF(p + l);
        if (l1) PF_L1(p + l, 4096);
    }
}

#endif
