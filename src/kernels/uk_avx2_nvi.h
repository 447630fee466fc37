/* uk_avx2_nvi.h — private to src/kernels: the AVX2 NVFP4 kernel with int8
 * activations (layout nvfp4_y16i, see uk_avx2.c), written once for the two
 * files that build it: uk_avx2.c with vpmaddubsw and uk_avx2vnni.c with
 * AVX-VNNI vpdpbusd. The includer defines, before including it once,
 *   NVI_TOKEN(U, x16, xb, f0, f1)  one token's block sums (rows 0-7, 8-15 as
 *                                  fp32 in *f0, *f1; exact integers, so both
 *                                  instructions give bit-identical results)
 *   NVI_KERNEL                     the name of the mr_uk_fn it defines. */
#include "kernels/uk_avx2.h"

/* ---------------- NVFP4, int8 activations (nvfp4_y16i) ---------------- */
/* 2*e2m1(c) + 12 for c = 0..15: an unsigned byte in [0, 24] */
static const uint8_t U8LUT[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

/* the 8 u8 weight vectors of 16-k block j: U[v] rows 0-7 and U[4 + v] rows
 * 8-15, each 8 rows x 4 k (k = 16j + 4v + 0..3, row-major: the pack's low /
 * high nibbles), and the block's row scales (* 2^-8) */
INL void nvi_block(const uint8_t *tile, const uint8_t *scp, int64_t j, __m256i U[8], __m256 *sc0, __m256 *sc1) {
    const __m256i lut = lut16(U8LUT), m0f = _mm256_set1_epi8(0x0F);
    #pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        const __m256i V = _mm256_load_si256((const __m256i *)(tile + j * 128 + 32 * v));
        U[v] = _mm256_shuffle_epi8(lut, _mm256_and_si256(V, m0f));
        U[4 + v] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(V, 4), m0f));
    }
    e4m3x16(scp + 16 * j, sc0, sc1);
}

/* the sums are of 2*e2m1(w)*x with scales * 2^-8: 2^8 / 2 = 128 folds in at the end */
#define NVI_FOLD 128.0f

/* 1 token: the running sums in registers. G = 1: one multiplier per 16-k
 * block (scales * xs); G = 8: xs equal over each run of 8 blocks (w4a8),
 * the blocks' sums go into g and xs is applied once per run. */
INL void nvi_one(const uint8_t *tile, int64_t Kp, const int8_t *xq, const int32_t *xb, const float *xs, float post,
                 float *y, const int G) {
    const uint8_t *scp = tile + 8 * Kp;
    const int64_t nblk = Kp / 16;
    __m256 o0 = _mm256_setzero_ps(), o1 = o0, g0 = o0, g1 = o0;
    for (int64_t j = 0; j < nblk; j++) {
        PF_NV(tile + j * 128);
        PF_NV(tile + j * 128 + 64);
        if ((j & 3) == 0) PF(scp + 16 * j);
        __m256i U[8];
        __m256 sc0, sc1, f0, f1;
        nvi_block(tile, scp, j, U, &sc0, &sc1);
        NVI_TOKEN(U, xq + 16 * j, xb + j, &f0, &f1);
        if (G == 1) {
            const __m256 xv = _mm256_set1_ps(xs ? xs[j] : 1.0f);
            o0 = _mm256_fmadd_ps(f0, xs ? _mm256_mul_ps(sc0, xv) : sc0, o0);
            o1 = _mm256_fmadd_ps(f1, xs ? _mm256_mul_ps(sc1, xv) : sc1, o1);
        } else {
            g0 = _mm256_fmadd_ps(f0, sc0, g0), g1 = _mm256_fmadd_ps(f1, sc1, g1);
            if ((j % G) == G - 1 || j == nblk - 1) {
                const __m256 xv = _mm256_set1_ps(xs ? xs[j] : 1.0f);
                o0 = _mm256_fmadd_ps(g0, xv, o0), o1 = _mm256_fmadd_ps(g1, xv, o1);
                g0 = g1 = _mm256_setzero_ps();
            }
        }
    }
    const __m256 f = _mm256_set1_ps(NVI_FOLD * post);
    _mm256_storeu_ps(y, _mm256_mul_ps(o0, f));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(o1, f));
}

/* many tokens: each block decoded once into registers, then every token over
 * it; the running sums live in y (G = 8: the run's sums in gm [M][16]) */
INL void nvi_many(const uint8_t *tile, int64_t Kp, const int8_t *xq, int64_t ldx, const int32_t *xb, int64_t ldb,
                  const float *xs, int64_t ldxs, float post, int64_t M, float *y, int64_t ldy, float *gm, const int G) {
    const uint8_t *scp = tile + 8 * Kp;
    const int64_t nblk = Kp / 16;
    for (int64_t j = 0; j < nblk; j++) {
        PF_NV(tile + j * 128);
        PF_NV(tile + j * 128 + 64);
        if ((j & 3) == 0) PF(scp + 16 * j);
        __m256i U[8];
        __m256 sc0, sc1;
        nvi_block(tile, scp, j, U, &sc0, &sc1);
        const int gend = G > 1 && ((j % G) == G - 1 || j == nblk - 1), gfirst = G > 1 && (j % G) == 0;
        for (int64_t m = 0; m < M; m++) {
            __m256 f0, f1;
            NVI_TOKEN(U, xq + m * ldx + 16 * j, xb + m * ldb + j, &f0, &f1);
            if (G == 1) {
                const __m256 xv = _mm256_set1_ps(xs ? xs[m * ldxs + j] : 1.0f);
                y_update(y + m * ldy, f0, f1, xs ? _mm256_mul_ps(sc0, xv) : sc0, xs ? _mm256_mul_ps(sc1, xv) : sc1,
                         j == 0);
            } else {
                float *g = gm + 16 * m;
                y_update(g, f0, f1, sc0, sc1, gfirst);
                if (gend) {
                    const __m256 xv = _mm256_set1_ps(xs ? xs[m * ldxs + j] : 1.0f);
                    y_update(y + m * ldy, _mm256_loadu_ps(g), _mm256_loadu_ps(g + 8), xv, xv, j < G);
                }
            }
        }
    }
    apply_post(y, ldy, M, NVI_FOLD * post);
}

static void NVI_KERNEL(const mr_pmatrix *W, int64_t t, const mr_uk_act *a, int64_t M, float *y, int64_t ldy,
                        void *scratch) {
    const uint8_t *tile = W->data + (size_t)t * W->tile_bytes;
    const float post = a->post * W->scale2;
    const int grouped = a->xs_group == 8;
    const int8_t *x = a->x;
    float *gm = scratch; /* [M][16]: M <= 128 tokens a call (the runner's chunks) fit in MR_UK_SCRATCH */
    if (M == 1) {
        if (grouped) nvi_one(tile, W->Kp, x, a->xb, a->xs, post, y, 8);
        else nvi_one(tile, W->Kp, x, a->xb, a->xs, post, y, 1);
        return;
    }
    for (int64_t m0 = 0; m0 < M; m0 += MR_UK_SCRATCH / 64) { /* gm holds MR_UK_SCRATCH / 64 tokens */
        const int64_t mt = M - m0 < MR_UK_SCRATCH / 64 ? M - m0 : MR_UK_SCRATCH / 64;
        const float *xs = a->xs ? a->xs + m0 * a->ldxs : NULL;
        if (grouped)
            nvi_many(tile, W->Kp, x + m0 * a->ldx, a->ldx, a->xb + m0 * a->ldb, a->ldb, xs, a->ldxs, post, mt,
                     y + m0 * ldy, ldy, gm, 8);
        else
            nvi_many(tile, W->Kp, x + m0 * a->ldx, a->ldx, a->xb + m0 * a->ldb, a->ldb, xs, a->ldxs, post, mt,
                     y + m0 * ldy, ldy, gm, 1);
    }
}
