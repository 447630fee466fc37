/* uk.c — the packed micro-kernels' generic driver (contract in
 * moerun/kernels.h): per block of the tile (128 k for FP8, 16 k for NVFP4,
 * 64 k for bf16) the weights are decoded once by the scalar decoders of
 * pack.c into an f32 [k][16] buffer in scratch, then every token is run over
 * it by a "stage" (acc[16] += sum_k w[k][d] * x[k]): scalar C here (the
 * AVX2 kernels use it with an FMA stage for FP8 tiles holding NaN codes). The block result is scaled (block multiplier, per-row NVFP4
 * scale, the activation's per-block multiplier) into y. Also the generic
 * table entries (and their packs), which instruction each kind's kernel runs,
 * the definition of the NVFP4_BF16 gemv's fixed-point input (xq), and the
 * FP8_BF16 gemv's scaled input (xd). */
#include <math.h>
#include <string.h>

#include "kernels/kern_internal.h"

static inline float bf16f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int blk_of(mr_uk_kind kind) {
    switch (kind) {
    case MR_UK_FP8_BF16: return 128;
    case MR_UK_NVFP4_I8:
    case MR_UK_NVFP4_BF16: return 16;
    default: return 64;
    }
}

void mr__uk_drive(mr_uk_kind kind, const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y,
                  int64_t ldy, void *scratch, mr__uk_stage_fn stage) {
    const uint8_t *tile = W->data + (size_t)t * W->tile_bytes;
    const int blk = blk_of(kind);
    const int64_t Kp = W->Kp, nb = (Kp + blk - 1) / blk;
    float *wb = scratch;             /* [128][16] */
    float *xf = wb + 128 * 16;       /* [128] */
    float sc[16];
    for (int64_t m = 0; m < M; m++) memset(y + m * ldy, 0, 16 * sizeof(float));
    for (int64_t b = 0; b < nb; b++) {
        const int64_t k0 = b * blk;
        const int nk = (int)(Kp - k0 < blk ? Kp - k0 : blk);
        float bs = 1.0f;
        switch (kind) {
        case MR_UK_FP8_BF16:
            mr__pk_fp8_block_f32(W, tile, b, wb);
            bs = W->tscale[t * (Kp / 128) + b];
            for (int d = 0; d < 16; d++) sc[d] = 1.0f;
            break;
        case MR_UK_NVFP4_I8:
        case MR_UK_NVFP4_BF16: mr__pk_nvfp4_block_f32(W, tile, b, wb, sc); break;
        default:
            mr__pk_bf16_pairs_f32(tile, k0 / 2, nk / 2, wb);
            for (int d = 0; d < 16; d++) sc[d] = 1.0f;
            break;
        }
        for (int64_t m = 0; m < M; m++) {
            const int64_t xo = m * a->ldx + k0;
            if (kind == MR_UK_NVFP4_I8)
                for (int i = 0; i < nk; i++) xf[i] = (float)((const int8_t *)a->x)[xo + i];
            else if (kind == MR_UK_BF16_F32)
                memcpy(xf, (const float *)a->x + xo, (size_t)nk * sizeof(float));
            else
                for (int i = 0; i < nk; i++) xf[i] = bf16f(((const uint16_t *)a->x)[xo + i]);
            float acc[16] = {0};
            stage(wb, xf, nk, acc);
            const bool has_xs = a->xs && kind != MR_UK_BF16_BF16 && kind != MR_UK_BF16_F32;
            const float s = bs * (has_xs ? a->xs[m * a->ldxs + b] : 1.0f);
            for (int d = 0; d < 16; d++) y[m * ldy + d] += acc[d] * (sc[d] * s);
        }
    }
    const float post = a->post * W->scale2;
    if (post != 1.0f)
        for (int64_t m = 0; m < M; m++)
            for (int d = 0; d < 16; d++) y[m * ldy + d] *= post;
}

static void stage_generic(const float *w, const float *x, int nk, float *acc) {
    for (int k = 0; k < nk; k++)
        for (int d = 0; d < 16; d++) acc[d] += w[k * 16 + d] * x[k];
}

#define GEN(kind, fname)                                                                                           \
    static void fname(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,        \
                      void *scratch) {                                                                             \
        mr__uk_drive(kind, W, t, a, M, y, ldy, scratch, stage_generic);                                            \
    }
GEN(MR_UK_FP8_BF16, uk_fp8_bf16_generic)
GEN(MR_UK_NVFP4_I8, uk_nvfp4_i8_generic)
GEN(MR_UK_NVFP4_BF16, uk_nvfp4_bf16_generic)
GEN(MR_UK_BF16_BF16, uk_bf16_bf16_generic)
GEN(MR_UK_BF16_F32, uk_bf16_f32_generic)
#undef GEN

/* benchmark isolation (kernels.h uk_stream): reads the tile, computes nothing */
static void uk_stream_generic(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                              void *scratch) {
    (void)a;
    const uint64_t *p = (const uint64_t *)(W->data + (size_t)t * W->tile_bytes);
    uint64_t s = 0;
    for (size_t i = 0; i < W->tile_bytes / 8; i++) s += p[i];
    *(volatile uint64_t *)scratch = s;
    for (int64_t m = 0; m < M; m++) memset(y + m * ldy, 0, 16 * sizeof(float));
}

void mr_uk_xq_row_ref(const uint16_t *x, int64_t n, int16_t *q, int16_t *ql, float *m) {
    for (int64_t b = 0; b < n / 16; b++) {
        const uint16_t *xb = x + 16 * b;
        int16_t *qb = q + 16 * b, *lb = ql + 16 * b;
        int F = 0, nonzero = 0;
        for (int i = 0; i < 16; i++) {
            const int f = (xb[i] >> 7) & 0xFF;
            F = f > F ? f : F;
            nonzero |= (xb[i] & 0x7FFF) != 0;
        }
        const int Fb = F > 1 ? F : 1;
        int parts = !nonzero ? 0 : F == 0xFF || Fb < 45 ? 3 : 1; /* 0: all zero, 3: no form */
        for (int i = 0; i < 16 && parts < 3; i++) {
            /* x / u = sig * 2^sh (sig the 8-bit significand) as hi + lo * 2^-15 */
            const int f = (xb[i] >> 7) & 0xFF, sig = f ? 128 | (xb[i] & 0x7F) : xb[i] & 0x7F;
            const int sh = (f > 1 ? f : 1) - Fb + 7;
            int hi = 0, lo = 0;
            if (sh >= 0) {
                hi = sig << sh;
            } else {
                const int r = -sh;                                /* bits of sig below u */
                hi = r >= 8 ? 0 : sig >> r;
                const int rem = r >= 8 ? sig : sig & ((1 << r) - 1); /* < 2^r */
                if (rem) parts = parts > 2 ? parts : 2;
                if (r <= 15) {
                    lo = rem << (15 - r);
                } else {
                    lo = r - 15 >= 8 ? 0 : rem >> (r - 15);
                    if (rem && (r - 15 >= 8 || lo << (r - 15) != rem)) parts = 3; /* a bit below u * 2^-15 */
                }
            }
            qb[i] = (int16_t)(xb[i] & 0x8000 ? -hi : hi);
            lb[i] = (int16_t)(xb[i] & 0x8000 ? -lo : lo);
        }
        if (parts == 3) {
            memset(qb, 0, 16 * sizeof(int16_t));
            memset(lb, 0, 16 * sizeof(int16_t));
        }
        m[b] = parts == 0 ? 1.0f : parts == 3 ? 0.0f : parts == 2 ? -ldexpf(1.0f, Fb - 141) : ldexpf(1.0f, Fb - 141);
    }
}

void mr_uk_xd_row(const uint16_t *x, int64_t n, float *dst) {
    MR_ASSERT(n % 128 == 0);
    for (int64_t b = 0; b < n; b += 128) {
        unsigned mx = 0;
        for (int i = 0; i < 128; i++) {
            const unsigned a = x[b + i] & 0x7FFFu;
            mx = a > mx ? a : mx;
        }
        if (mx >= 0x4780u) { /* 2^16, Inf, NaN */
            dst[b] = NAN;
            continue;
        }
        for (int i = 0; i < 128; i++) dst[b + i] = bf16f(x[b + i]) * 0x1p112f; /* exact: below 2^128 */
    }
}

void mr__uk_fill_generic(mr_kernels *k) {
    static const struct {
        const char *name;
        mr_uk_fn fn;
    } e[MR_UK_COUNT] = {
        {"uk_fp8_bf16_generic_16x128", uk_fp8_bf16_generic},  {"uk_nvfp4_i8_generic_16x16", uk_nvfp4_i8_generic},
        {"uk_nvfp4_bf16_generic_16x16", uk_nvfp4_bf16_generic}, {"uk_bf16_bf16_generic_16x64", uk_bf16_bf16_generic},
        {"uk_bf16_f32_generic_16x64", uk_bf16_f32_generic},
    };
    static const mr_pack_id pk[MR_UK_COUNT] = {MR_PACK_FP8_R16K4, MR_PACK_NVFP4_R16K16, MR_PACK_NVFP4_R16K16B,
                                                MR_PACK_BF16_R16K2, MR_PACK_BF16_R16K2};
    for (int i = 0; i < MR_UK_COUNT; i++) {
        k->uk_gemv[i].name = k->uk_gemm[i].name = e[i].name;
        k->uk_gemv[i].fn = k->uk_gemm[i].fn = e[i].fn;
        k->uk_inv[i].name = e[i].name; /* one kernel, the same sums per token at every M */
        k->uk_inv[i].fn = e[i].fn;
        k->uk_pack[i] = pk[i];
        k->uk_instr[i] = MR_PROBE_FMA; /* scalar: no probe (mr_probe_peak gives 0 on the generic table) */
    }
    k->uk_gemm_min_m = 1 << 30; /* one kernel: the block decode is already shared by all tokens */
    k->uk_stream.name = "uk_stream_generic";
    k->uk_stream.fn = uk_stream_generic;
    k->xq_row.name = "xq_row_generic";
    k->xq_row.fn = mr_uk_xq_row_ref;
}

mr_probe_instr mr_uk_instr(mr_uk_kind kind) { return mr_kernels_get()->uk_instr[kind]; }
