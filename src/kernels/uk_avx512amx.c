/* uk_avx512amx.c — the AVX-512 level's FP8 and BF16 x BF16 kernels on
 * AMX-BF16 (Intel Xeon since Sapphire Rapids), which this file alone is
 * compiled for (CMakeLists.txt: *_avx512amx.c). isa.c installs them over the
 * level's gemv and gemm of those kinds where the table's CPU flags hold AMX-TILE and AMX-BF16 and
 * Linux grants the process the tile data state (mr__amx_ready).
 *
 * One kernel for every token count, so that a token's sums do not depend on
 * how many other tokens share its expert (test_engine's batch invariance):
 * AMX's tdpbf16ps gives each output row the same bits whatever the tile's row
 * count (checked in tests/test_kernels.c), while its sum order is its own (it
 * matches neither vdpbf16ps's pair order nor one rounding per product; within
 * ~8 ulp of the magnitude over a 32-k step, measured against double sums).
 *
 * Per 128-k block of the tile: the 32 E4M3 lines are widened to bf16 pairs
 * with the level's decode (fp8_line_bf16), whose output is the B-tile layout
 * as it is (a line's z0 / z1: the 16 rows' (k, k+1) pairs of two consecutive
 * k pairs), into 4 KiB of scratch: four B tiles of 16 pair rows x 16 rows.
 * The tokens' bf16 x rows are the A tiles, read in place (16 tokens x 32 k, the
 * row stride ldx). Each block of up to 16 tokens: C = 0, four tdpbf16ps, C
 * stored to scratch, then y = C * s or y + C * s with the level's fp8 epilogue
 * (s: the block multiplier times the token's w8a8 scale). The block scale
 * keeps the sums per 128 k, as in every FP8 kernel. */
#define _DEFAULT_SOURCE /* syscall() */
#include <sys/syscall.h>
#include <unistd.h>

/* uk_avx512.h's pair-dot bodies are not used here; DP only has to compile */
#define DP(acc, w, xv) _mm512_add_ps(_mm512_add_ps((acc), _mm512_castsi512_ps(w)), (xv))
#include "kernels/uk_avx512.h"
#include "kernels/amx_tiles.h"

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

bool mr__amx_ready(void) {
    static int state; /* 0 unknown, 1 granted, -1 refused; the request is idempotent */
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s == 0) {
        s = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
        __atomic_store_n(&state, s, __ATOMIC_RELEASE);
    }
    return s == 1;
}

/* the FP8 kernel's tiles: tmm0 C of a 16-token block, tmm1 C of the last (tail) block, tmm2 / tmm3
 * their A tiles, tmm4-7 the block's four B tiles (k 0-31, ..., 96-127) */
static void amx_config(int tail) {
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) c.colsb[i] = 64, c.rows[i] = 16;
    c.rows[1] = c.rows[3] = (uint8_t)(tail ? tail : 16);
    amx_load_cfg(&c);
}

/* C tile -> the fp8 epilogue for M tokens (M constant for the unrolled store) */
INL void amx_epilogue(const float *c, float s0, const float *xs, int64_t ldxs, int64_t kb, float *y, int64_t ldy,
                      int first, const int M) {
    __m512 acc[MT16];
    #pragma GCC unroll 16
    for (int m = 0; m < M; m++) acc[m] = _mm512_load_ps(c + 16 * m);
    fp8_gemm_store(acc, s0, xs, ldxs, kb, y, ldy, first, M);
}

/* the block's four k tiles of 32 for one token block: C tile C, A tile A (literal operands) */
#define FP8_BLOCK(C, A)                 \
    do {                                \
        _tile_zero(C);                  \
        AMX_LOADD(A, xm, sx);         \
        _tile_dpbf16ps(C, A, 4);        \
        AMX_LOADD(A, xm + 32, sx);    \
        _tile_dpbf16ps(C, A, 5);        \
        AMX_LOADD(A, xm + 64, sx);    \
        _tile_dpbf16ps(C, A, 6);        \
        AMX_LOADD(A, xm + 96, sx);    \
        _tile_dpbf16ps(C, A, 7);        \
        AMX_STORED(C, c, 64);         \
    } while (0)

static void uk_fp8_bf16_amx(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                            void *scratch) {
    const fp8_lut lut = fp8_lut_load();
    const uint8_t *tile = W->data + (size_t)t * W->tile_bytes;
    const float *bs = W->tscale + t * (W->Kp / 128);
    __m512i *b = (__m512i *)scratch;               /* 4 B tiles: 4 KiB */
    float *c = (float *)((char *)scratch + 4096); /* one C tile: 1 KiB */
    const int64_t full = M / 16, tail = M % 16, sx = a->ldx * (int64_t)sizeof(uint16_t);
    const uint16_t *x = (const uint16_t *)a->x;
    amx_config((int)tail);
    for (int64_t kb = 0; kb < W->Kp / 128; kb++) {
        fp8_block_pairs(&lut, tile + kb * 2048, b, 1);
        AMX_LOADD(4, b, 64);
        AMX_LOADD(5, b + 16, 64);
        AMX_LOADD(6, b + 32, 64);
        AMX_LOADD(7, b + 48, 64);
        for (int64_t blk = 0; blk <= full; blk++) {
            const int64_t m0 = blk * 16;
            if (m0 >= M) break;
            const uint16_t *xm = x + m0 * a->ldx + kb * 128;
            const float *xsm = a->xs ? a->xs + m0 * a->ldxs : NULL;
            float *ym = y + m0 * ldy;
            if (blk < full) {
                FP8_BLOCK(0, 2);
                amx_epilogue(c, bs[kb], xsm, a->ldxs, kb, ym, ldy, kb == 0, 16);
            } else {
                FP8_BLOCK(1, 3);
#define CALL(n) amx_epilogue(c, bs[kb], xsm, a->ldxs, kb, ym, ldy, kb == 0, n)
                DISPATCH_MT16(tail, CALL)
#undef CALL
            }
        }
    }
    _tile_release(); /* the tile state back to init: no AMX context for the OS to save */
    apply_post(y, ldy, M, a->post * W->scale2);
}
#undef FP8_BLOCK

/* BF16_BF16 (w16a16): the pack's pair rows (16 rows x (k, k+1) a row, 64 bytes) are B tiles as
 * they lie, 1 KiB per 32 k, so nothing is decoded: per block of up to 16 tokens, C = 0, one
 * tdpbf16ps per 32 k (the last Kp % 32 on tiles of that width), C stored into y. */
/* one token block over the whole row: C tile C, A tiles A (32 k) and AT (the last kt k); the tile
 * numbers are the AMX intrinsics' literal operands, hence a macro */
#define BF16_BLOCK(C, A, AT)                                   \
    do {                                                       \
        _tile_zero(C);                                         \
        for (int64_t k0 = 0; k0 < K32; k0 += 32) {             \
            pf_tile(tile + k0 * 32, 1);                           \
            AMX_LOADD(A, xm + k0, sx);                       \
            AMX_LOADD(4, tile + k0 * 32, 64);                \
            _tile_dpbf16ps(C, A, 4);                           \
        }                                                      \
        if (kt) {                                              \
            AMX_LOADD(AT, xm + K32, sx);                     \
            AMX_LOADD(5, tile + K32 * 32, 64);               \
            _tile_dpbf16ps(C, AT, 5);                          \
        }                                                      \
        AMX_STORED(C, y + m0 * ldy, sy);                     \
    } while (0)

static void uk_bf16_bf16_amx(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                             void *scratch) {
    (void)scratch;
    const uint8_t *tile = W->data + (size_t)t * W->tile_bytes;
    const int64_t K32 = W->Kp / 32 * 32, kt = W->Kp - K32, tail = M % 16;
    const int64_t sx = a->ldx * (int64_t)sizeof(uint16_t), sy = ldy * (int64_t)sizeof(float);
    /* tmm0-4 as the FP8 kernel; the last kt k: tmm5 B (kt / 2 pair rows), tmm6 / tmm7 A of a full
     * / the tail token block (kt bf16 a row) */
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) c.colsb[i] = 64, c.rows[i] = 16;
    c.rows[1] = c.rows[3] = c.rows[7] = (uint8_t)(tail ? tail : 16);
    c.rows[5] = (uint8_t)(kt ? kt / 2 : 16);
    c.colsb[6] = c.colsb[7] = (uint16_t)(kt ? kt * 2 : 64);
    amx_load_cfg(&c);
    const uint16_t *x = (const uint16_t *)a->x;
    for (int64_t m0 = 0; m0 < M; m0 += 16) {
        const uint16_t *xm = x + m0 * a->ldx;
        if (m0 + 16 <= M)
            BF16_BLOCK(0, 2, 6);
        else
            BF16_BLOCK(1, 3, 7);
    }
    _tile_release();
    apply_post(y, ldy, M, a->post * W->scale2);
}
#undef BF16_BLOCK

void mr__uk_fill_avx512amx(mr_kernels *k) {
    k->uk_gemv[MR_UK_FP8_BF16].name = k->uk_gemm[MR_UK_FP8_BF16].name = "uk_fp8_bf16_avx512_amx_16x16x128";
    k->uk_gemv[MR_UK_FP8_BF16].fn = k->uk_gemm[MR_UK_FP8_BF16].fn = uk_fp8_bf16_amx;
    k->uk_gemm_xw[MR_UK_FP8_BF16] = false; /* it reads the bf16 x rows in place */
    k->uk_gemv[MR_UK_BF16_BF16].name = k->uk_gemm[MR_UK_BF16_BF16].name = "uk_bf16_bf16_avx512_amx_16x16x32";
    k->uk_gemv[MR_UK_BF16_BF16].fn = k->uk_gemm[MR_UK_BF16_BF16].fn = uk_bf16_bf16_amx;
    k->uk_gemm_xw[MR_UK_BF16_BF16] = false;
    k->uk_inv[MR_UK_FP8_BF16] = k->uk_gemm[MR_UK_FP8_BF16]; /* one kernel for every M (above) */
    k->uk_inv[MR_UK_BF16_BF16] = k->uk_gemm[MR_UK_BF16_BF16];
    k->uk_instr[MR_UK_FP8_BF16] = k->uk_instr[MR_UK_BF16_BF16] = MR_PROBE_TDPBF16;
}

/* 4 C tiles, each 16 x 16 fp32 over k 32 a step: 4 * 16 * 16 * 32 * 2 ops an iteration */
double mr__probe_tdpbf16_amx(int64_t iters) {
    amx_config(0);
    uint16_t ones[16 * 32] __attribute__((aligned(64)));
    float out[16 * 16] __attribute__((aligned(64)));
    for (int i = 0; i < 16 * 32; i++) ones[i] = 0x3F80; /* bf16 1.0 */
    AMX_LOADD(4, ones, 64);
    AMX_LOADD(5, ones, 64);
    AMX_LOADD(6, ones, 64);
    AMX_LOADD(7, ones, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t it = 0; it < iters; it++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    AMX_STORED(0, out, 64);
    _tile_release();
    return (double)out[0];
}
