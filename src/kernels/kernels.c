/* kernels.c — the kernel dispatch table (generic entries first, then the
 * AVX2 and AVX-512 overrides the CPU allows), the generic scalar
 * micro-kernels, the row-block GEMM driver and the threaded dense matmul. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/steal.h"
#include "kernels/kern_internal.h"

float mr__e4m3_lut[256];
const float mr__e2m1_lut[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

static pthread_once_t lut_once = PTHREAD_ONCE_INIT;
static void lut_build(void) {
    for (int i = 0; i < 256; i++) mr__e4m3_lut[i] = mr_e4m3_to_f32((uint8_t)i);
}
void mr__kern_luts_init(void) { pthread_once(&lut_once, lut_build); }

static inline float bf16f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline int group_len(const mr_qmatrix *W, int64_t g) {
    int64_t r = W->cols - g * MR_KGROUP;
    return (int)(r < MR_KGROUP ? r : MR_KGROUP);
}

/* ---- generic micro-kernels (tile: one row x one 128-column group) ---- */
static void decode_f32_generic(const mr_qmatrix *W, int64_t n, int64_t g, float *dst, float *gs) {
    memcpy(dst, (const float *)W->data + n * W->cols + g * MR_KGROUP, (size_t)group_len(W, g) * sizeof(float));
    *gs = 1.0f;
}

static void decode_bf16_generic(const mr_qmatrix *W, int64_t n, int64_t g, float *dst, float *gs) {
    const uint16_t *s = (const uint16_t *)W->data + n * W->cols + g * MR_KGROUP;
    int len = group_len(W, g);
    for (int i = 0; i < len; i++) dst[i] = bf16f(s[i]);
    *gs = 1.0f;
}

static void decode_fp8_generic(const mr_qmatrix *W, int64_t n, int64_t g, float *dst, float *gs) {
    const uint8_t *s = (const uint8_t *)W->data + n * W->cols + g * MR_KGROUP;
    int len = group_len(W, g);
    for (int i = 0; i < len; i++) dst[i] = mr__e4m3_lut[s[i]];
    int64_t kb = (W->cols + 127) / 128;
    *gs = ((const float *)W->scale)[(n / 128) * kb + g];
}

static void decode_nvfp4_generic(const mr_qmatrix *W, int64_t n, int64_t g, float *dst, float *gs) {
    const uint8_t *s = (const uint8_t *)W->data + n * (W->cols / 2) + g * (MR_KGROUP / 2);
    const uint8_t *sc = (const uint8_t *)W->scale + n * (W->cols / 16) + g * (MR_KGROUP / 16);
    int len = group_len(W, g);
    for (int b = 0; b < len / 16; b++) {
        float d = mr__e4m3_lut[sc[b]];
        for (int i = 0; i < 8; i++) {
            uint8_t v = s[b * 8 + i];
            dst[b * 16 + 2 * i] = mr__e2m1_lut[v & 15] * d;
            dst[b * 16 + 2 * i + 1] = mr__e2m1_lut[v >> 4] * d;
        }
    }
    *gs = 1.0f;
}

static float dot_f32_generic(const float *w, const float *x, int len) {
    float a[4] = {0, 0, 0, 0};
    int i = 0;
    for (; i + 4 <= len; i += 4)
        for (int j = 0; j < 4; j++) a[j] += w[i + j] * x[i + j];
    for (; i < len; i++) a[0] += w[i] * x[i];
    return (a[0] + a[1]) + (a[2] + a[3]);
}

static float dot_bf16_generic(const float *w, const uint16_t *x, int len) {
    float a[4] = {0, 0, 0, 0};
    int i = 0;
    for (; i + 4 <= len; i += 4)
        for (int j = 0; j < 4; j++) a[j] += w[i + j] * bf16f(x[i + j]);
    for (; i < len; i++) a[0] += w[i] * bf16f(x[i]);
    return (a[0] + a[1]) + (a[2] + a[3]);
}

static void silu_mul_generic(const float *g, const float *u, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* ---- attention rows (kernels.h): the generic order ---- */
static inline float attn_kv(const void *row, mr_format kvt, int i) {
    switch (kvt) {
    case MR_FMT_BF16: return bf16f(((const uint16_t *)row)[i]);
    case MR_FMT_E4M3: return mr_e4m3_to_f32(((const uint8_t *)row)[i]);
    case MR_FMT_E5M2: return mr_e5m2_to_f32(((const uint8_t *)row)[i]);
    default: return ((const float *)row)[i];
    }
}

static void attn_qk_generic(const float *q, int G, int D, const void *k, int64_t ldk, mr_format kvt, int nr, float *s,
                            int64_t lds, float *wk) {
    (void)wk;
    const size_t es = mr_kv_elem_bytes(kvt);
    for (int r = 0; r < nr; r++) {
        const void *kr = (const char *)k + (size_t)r * (size_t)ldk * es;
        for (int g = 0; g < G; g++) {
            const float *a = q + (size_t)g * (size_t)D;
            float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            int i = 0;
            for (; i + 8 <= D; i += 8)
                for (int l = 0; l < 8; l++) acc[l] += a[i + l] * attn_kv(kr, kvt, i + l);
            float d = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
            for (; i < D; i++) d += a[i] * attn_kv(kr, kvt, i);
            s[g * lds + r] = d;
        }
    }
}

static void attn_pv_generic(const float *p, int64_t ldp, int G, int D, const void *v, int64_t ldv, mr_format kvt,
                            int nr, float *o, float *wk) {
    (void)wk;
    const size_t es = mr_kv_elem_bytes(kvt);
    for (int r = 0; r < nr; r++) {
        const void *vr = (const char *)v + (size_t)r * (size_t)ldv * es;
        for (int g = 0; g < G; g++) {
            const float pg = p[g * ldp + r];
            float *og = o + (size_t)g * (size_t)D;
            for (int i = 0; i < D; i++) og[i] += pg * attn_kv(vr, kvt, i);
        }
    }
}

static void attn_softmax_generic(float *s, int64_t n, float scale) {
    float mx = -INFINITY, sum = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        s[j] *= scale;
        if (s[j] > mx) mx = s[j];
    }
    for (int64_t j = 0; j < n; j++) {
        s[j] = expf(s[j] - mx);
        sum += s[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < n; j++) s[j] *= inv;
}

void mr__kernels_fill_generic(mr_kernels *k) {
    k->silu_mul.name = "silu_mul_generic_libm";
    k->silu_mul.fn = silu_mul_generic;
    k->attn_qk.name = "attn_qk_generic_8";
    k->attn_qk.fn = attn_qk_generic;
    k->attn_pv.name = "attn_pv_generic_1";
    k->attn_pv.fn = attn_pv_generic;
    k->attn_softmax.name = "attn_softmax_generic_libm";
    k->attn_softmax.fn = attn_softmax_generic;
    k->isa = "generic";
    k->decode[MR_FMT_F32].name = "decode_f32_generic_1x128";
    k->decode[MR_FMT_F32].fn = decode_f32_generic;
    k->decode[MR_FMT_BF16].name = "decode_bf16_generic_1x128";
    k->decode[MR_FMT_BF16].fn = decode_bf16_generic;
    k->decode[MR_FMT_FP8_BLOCK].name = "decode_fp8_block_generic_1x128";
    k->decode[MR_FMT_FP8_BLOCK].fn = decode_fp8_generic;
    k->decode[MR_FMT_NVFP4].name = "decode_nvfp4_generic_1x128";
    k->decode[MR_FMT_NVFP4].fn = decode_nvfp4_generic;
    k->dot_f32.name = "dot_f32_generic_4";
    k->dot_f32.fn = dot_f32_generic;
    k->dot_bf16.name = "dot_bf16_generic_4";
    k->dot_bf16.fn = dot_bf16_generic;
}

/* The table for a feature set: the highest level the flags hold, filled
 * level by level from generic up (isa.c). */
void mr_kernels_init(mr_kernels *k, uint32_t flags) {
    mr__kern_luts_init();
    memset(k, 0, sizeof *k);
    k->flags = flags;
    mr__kernels_fill_level(k, mr_kernel_isa_best(flags));
}

void mr_kernels_batch_invariant(mr_kernels *k) {
    for (int i = 0; i < MR_UK_COUNT; i++) {
        MR_ASSERT(k->uk_inv[i].fn != NULL);
        k->uk_gemv_xq[i] = false; /* (uk_xd stays: the invariant kernels that take xd read it, same bits) */
        k->uk_gemv[i].name = k->uk_gemm[i].name = k->uk_inv[i].name;
        k->uk_gemv[i].fn = k->uk_gemm[i].fn = k->uk_inv[i].fn;
    }
    k->uk_gemm_min_m = 1;
    k->batch_invariant = true;
}

/* the process tables: [0] the fastest kernels, [1] their batch-invariant form */
static mr_kernels g_kernels[2];
static pthread_once_t g_once[2] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT};
static atomic_bool g_invariant;
static void g_build(void) { mr_kernels_init(&g_kernels[0], mr_cpu()->flags); }
static void g_build_inv(void) {
    mr_kernels_init(&g_kernels[1], mr_cpu()->flags);
    mr_kernels_batch_invariant(&g_kernels[1]);
}

const mr_kernels *mr_kernels_get(void) {
    const int i = atomic_load(&g_invariant) ? 1 : 0;
    pthread_once(&g_once[i], i ? g_build_inv : g_build);
    return &g_kernels[i];
}

void mr_kernels_set_batch_invariant(bool on) { atomic_store(&g_invariant, on); }

/* ---- the row-block GEMM driver: decode one 128-column group of one row
 * once, then dot it with every activation row (weights are read once per
 * call whatever M is). ---- */
void mr_gemm_rows(const mr_kernels *k, const mr_qmatrix *W, int64_t n0, int64_t nr, mr_format xdt, const void *x,
                  int64_t ldx, const float *xs, int64_t ldxs, int64_t M, float *y, int64_t ldy) {
    MR_ASSERT(W->fmt < MR_FMT_COUNT && k->decode[W->fmt].fn);
    MR_ASSERT(xdt == MR_FMT_F32 || xdt == MR_FMT_BF16);
    mr_kern_decode_fn dec = k->decode[W->fmt].fn;
    float wbuf[MR_KGROUP] __attribute__((aligned(64)));
    int64_t G = (W->cols + MR_KGROUP - 1) / MR_KGROUP;
    float post = W->fmt == MR_FMT_NVFP4 ? W->scale2 : 1.0f;
    for (int64_t j = 0; j < nr; j++) {
        int64_t n = n0 + j;
        for (int64_t m = 0; m < M; m++) y[m * ldy + j] = 0.0f;
        for (int64_t g = 0; g < G; g++) {
            float gs;
            dec(W, n, g, wbuf, &gs);
            int len = group_len(W, g);
            for (int64_t m = 0; m < M; m++) {
                float d = xdt == MR_FMT_F32
                              ? k->dot_f32.fn(wbuf, (const float *)x + m * ldx + g * MR_KGROUP, len)
                              : k->dot_bf16.fn(wbuf, (const uint16_t *)x + m * ldx + g * MR_KGROUP, len);
                float s = xs ? gs * xs[m * ldxs + g] : gs;
                y[m * ldy + j] += d * s;
            }
        }
        if (post != 1.0f)
            for (int64_t m = 0; m < M; m++) y[m * ldy + j] *= post;
    }
}

enum { MATMUL_NB = 16, MATMUL_MAX_NT = 64 };

/* every value a finite bf16: the fp32 low 16 bits zero, the exponent not all ones (stops at the
 * first other value: an fp32 x pays one look) */
static bool x_is_bf16(const float *x, int64_t n) {
    enum { B = 256 };
    for (int64_t i = 0; i < n; i += B) {
        const int64_t e = n - i < B ? n : i + B;
        uint32_t bad = 0;
        for (int64_t j = i; j < e; j++) {
            uint32_t u;
            memcpy(&u, x + j, sizeof u);
            bad |= (u & 0xFFFFu) | ((u & 0x7F800000u) == 0x7F800000u);
        }
        if (bad) return false;
    }
    return true;
}

/* the row path a matmul_fast call takes: the row-major kernels on fp32 x, the tiles on x packed in
 * three parts or in one, the bf16 pair dots on x packed as bf16, or the FMAs on the packs on x
 * copied at the pack's K */
enum { PATH_ROWS, PATH_TILES, PATH_TILES1, PATH_X16, PATH_X32 };

/* Rows of the blocks [b0, b1) of the list of all matrices' MATMUL_NB-row blocks, in order, on the
 * path given (xp: x packed for it, where it takes a pack). */
static void rows_range(const mr_kernels *k, int n, const mr_qmatrix *const *W, const float *x, const void *xp,
                       int path, void *scratch, int64_t M, float *const *y, int64_t b0, int64_t b1) {
    int64_t base = 0;
    for (int i = 0; i < n && b0 < b1; i++) {
        const int64_t N = W[i]->rows, nb = (N + MATMUL_NB - 1) / MATMUL_NB;
        const int64_t lo = b0 > base ? b0 - base : 0, hi = b1 - base < nb ? b1 - base : nb;
        if (lo < hi) {
            const int64_t r0 = lo * MATMUL_NB, r1 = hi * MATMUL_NB < N ? hi * MATMUL_NB : N;
            const mr_format f = W[i]->fmt;
            if (path == PATH_X16 || path == PATH_X32)
                (path == PATH_X16 ? k->rows_x16[f].fn : k->rows_f32[f].fn)(W[i]->tiles, r0, r1 - r0, xp, M, y[i] + r0,
                                                                           N, scratch);
            else if (path != PATH_ROWS)
                (path == PATH_TILES1 ? k->rows_tiles[f].fn1 : k->rows_tiles[f].fn)(W[i]->tiles, r0, r1 - r0, xp, M,
                                                                                y[i] + r0, N, scratch);
            else
                k->rows[f].fn(W[i], r0, r1 - r0, x, M, y[i] + r0, N);
        }
        base += nb;
    }
}

/* The small-M fast path over several matrices sharing x (same K): one
 * parallel region; the 16-row blocks of all matrices, in order, form one list
 * of chunks (about 16 per thread), split into one contiguous range per thread
 * with stealing (base/steal.h): each thread streams one run of memory, and a
 * thread preempted for a moment (the server's HTTP loop on a 2-core host)
 * costs the region little, the other threads take its chunks. A row's result
 * does not depend on which thread or chunk computes it. A team other than the
 * one the ranges were made for (one thread, nesting, limits) splits statically. */
static void matmul_fast(int n, const mr_qmatrix *const *W, const float *x, int64_t M, float *const *y, void *ws,
                        size_t ws_bytes) {
    const mr_kernels *k = mr_kernels_get();
    int64_t nblk = 0, work = 0;
    for (int i = 0; i < n; i++) nblk += (W[i]->rows + MATMUL_NB - 1) / MATMUL_NB, work += W[i]->rows * W[i]->cols;
    const bool par = work * M > 65536;
    int nt0 = 1;
#ifdef _OPENMP
    if (par) nt0 = omp_get_max_threads();
#endif
    const bool steal = nt0 > 1 && nt0 <= MATMUL_MAX_NT;
    /* on tiles (every matrix packed for them): x packed once for all matrices, by the team, before
     * any row block; a scratch for each of the nt0 threads the ranges were made for (a larger team
     * leaves the rest idle) */
    bool tiles = k->rows_tiles[W[0]->fmt].fn != NULL;
    for (int i = 0; i < n; i++) tiles = tiles && W[i]->tiles && W[i]->tiles->pack == k->rows_tiles[W[0]->fmt].pack;
    /* blocks per chunk: about 16 chunks a thread, 4 on tiles at 5 tokens or more, where a call's
     * column tiles share each 128-k block's packed x in L1 (the more of them, the better) */
    int64_t cb = nblk / ((tiles && M >= 5 ? 4 : 16) * nt0);
    if (cb < 1) cb = 1;
    _Alignas(64) _Atomic uint64_t rs[MATMUL_MAX_NT * MR__STEAL_STRIDE];
    if (steal)
        for (int t = 0; t < nt0; t++) mr__rng_init(rs, (nblk + cb - 1) / cb, nt0, t); /* the fork publishes them */
    const int64_t K = W[0]->cols;
    /* x of bf16 values (the dense inputs under --dense-activation-dtype bf16) on the one-part pack:
     * the same bits, a third of the tile operations */
    const bool one = tiles && k->rows_tiles[W[0]->fmt].fn1 && x_is_bf16(x, M * K);
    /* without AMX, matrices whose callers round their inputs to bf16 on the bf16 pair dots, where the
     * table has them (packed for them at load): chosen by the matrices, never by x, so a token's path
     * (and bits) does not depend on the tokens beside it */
    bool x16 = !tiles && k->rows_x16[W[0]->fmt].fn;
    for (int i = 0; i < n; i++)
        x16 = x16 && W[i]->x_bf16 && W[i]->tiles && W[i]->tiles->pack == k->rows_x16[W[0]->fmt].pack;
    /* else the fp32 FMAs on the same packs, for the matrices packed for them (fp32 inputs) */
    bool x32 = !tiles && !x16 && k->rows_f32[W[0]->fmt].fn;
    for (int i = 0; i < n; i++) x32 = x32 && W[i]->tiles && W[i]->tiles->pack == k->rows_f32[W[0]->fmt].pack;
    const int64_t Kx = x16 || x32 ? W[0]->tiles->Kp : K; /* each token of the packed x, zero from K */
    const int64_t nxb = one ? (M + 15) / 16 : (M + 4) / 5;
    /* either tile pack's room (MR_XPACK1_BYTES is never more) or the bf16 x, and a scratch for each
     * of the nt0 threads */
    const size_t xpb = x16 ? (size_t)(M * Kx) * sizeof(uint16_t) : x32 ? (size_t)(M * Kx) * sizeof(float)
                                                                          : MR_XPACK_BYTES(M, K);
    const size_t need = xpb + (size_t)nt0 * MR_UK_SCRATCH;
    char *xp = !tiles && !x16 && !x32 ? NULL : ws && ws_bytes >= need ? ws : mr_aligned_alloc(64, need);
    const int path = !xp ? PATH_ROWS : x16 ? PATH_X16 : x32 ? PATH_X32 : one ? PATH_TILES1 : PATH_TILES;
#pragma omp parallel if (par)
    {
        int nt = 1, t = 0;
#ifdef _OPENMP
        nt = omp_get_num_threads(), t = omp_get_thread_num();
#endif
        if (path == PATH_X16) {
            k->rows_x16[W[0]->fmt].xpack(x, K, Kx, M * t / nt, M * (t + 1) / nt, (uint16_t *)xp);
#pragma omp barrier
        } else if (path == PATH_X32) {
            k->rows_f32[W[0]->fmt].xpack(x, K, Kx, M * t / nt, M * (t + 1) / nt, (float *)xp);
#pragma omp barrier
        } else if (xp) {
            (one ? k->rows_xpack1 : k->rows_xpack)(x, M, K, nxb * t / nt, nxb * (t + 1) / nt, xp);
#pragma omp barrier
        }
        const int nw = xp && nt > nt0 ? nt0 : nt; /* the threads that compute rows */
        char *scr = xp && t < nw ? xp + xpb + (size_t)t * MR_UK_SCRATCH : NULL;
        if (t < nw && (!steal || nt != nt0)) {
            rows_range(k, n, W, x, xp, path, scr, M, y, nblk * t / nw, nblk * (t + 1) / nw);
        } else if (t < nw) {
            for (int64_t c; (c = mr__rng_next(rs, nt, t)) >= 0;)
                rows_range(k, n, W, x, xp, path, scr, M, y, c * cb, (c + 1) * cb < nblk ? (c + 1) * cb : nblk);
        }
    }
    if (xp != ws) mr_aligned_free(xp);
}

void mr__rows_f32_xpack(const float *x, int64_t K, int64_t ldp, int64_t m0, int64_t m1, float *xp) {
    for (int64_t m = m0; m < m1; m++) {
        memcpy(xp + m * ldp, x + m * K, (size_t)K * sizeof(float));
        if (ldp > K) memset(xp + m * ldp + K, 0, (size_t)(ldp - K) * sizeof(float));
    }
}

mr_status mr_qmatrix_tiles(mr_qmatrix *W, mr_pmatrix *store) {
    const mr_kernels *k = mr_kernels_get();
    memset(store, 0, sizeof *store);
    W->tiles = NULL;
    if (W->fmt >= MR_FMT_COUNT) return MR_OK;
    mr_pack_id pk = k->rows_tiles[W->fmt].fn ? k->rows_tiles[W->fmt].pack : MR_PACK_NONE;
    if (!pk && W->x_bf16 && k->rows_x16[W->fmt].fn && W->cols % 64 == 0) pk = k->rows_x16[W->fmt].pack;
    if (!pk && k->rows_f32[W->fmt].fn && W->cols % 64 == 0) pk = k->rows_f32[W->fmt].pack;
    if (!pk) return MR_OK;
    const mr_qmatrix *src = W;
    const mr_status st = mr_pmatrix_pack(store, pk, &src, 1);
    if (st == MR_OK) W->tiles = store;
    return st;
}

/* BF16/FP8 weights take the ISA's row-major path (k->rows, see matmul_fast)
 * at any M: it reruns each 8-row chunk (in L1) per 4 tokens, and a token's
 * result does not depend on M (the same FMA sequence per row and token), so
 * a request's logits do not depend on the batch around it. Measured on a
 * 2-layer hidden-1024 FP8 model at 128 tokens (the engine's decode batch):
 * 3.2x faster than the decode-and-dot driver, which stays for the other
 * formats (threaded over blocks of 16 output columns; y rows are M apart). */
void mr_matmul(const mr_qmatrix *W, const float *x, int64_t M, float *y) {
    mr_matmul_multi(1, &W, x, M, &y);
}

size_t mr_matmul_ws_bytes(int64_t M, int64_t K, int threads) {
    const mr_kernels *k = mr_kernels_get();
    const int64_t Mc = M < MR_MATMUL_CHUNK ? M : MR_MATMUL_CHUNK;
    size_t b = 0; /* the packed x: on tiles, the bf16 x of the pair dots or the fp32 x of the FMAs (K padded as an FP8 pack's) */
    if (k->rows_tiles[MR_FMT_BF16].fn || k->rows_tiles[MR_FMT_FP8_BLOCK].fn) b = MR_XPACK_BYTES(Mc, K);
    const size_t x16b = (size_t)(Mc * ((K + 127) / 128 * 128)) * sizeof(uint16_t);
    if ((k->rows_x16[MR_FMT_BF16].fn || k->rows_x16[MR_FMT_FP8_BLOCK].fn) && x16b > b) b = x16b;
    if ((k->rows_f32[MR_FMT_BF16].fn || k->rows_f32[MR_FMT_FP8_BLOCK].fn) && 2 * x16b > b) b = 2 * x16b;
    return b ? b + (size_t)(threads > 0 ? threads : 1) * MR_UK_SCRATCH : 0; /* and a scratch a thread */
}

void mr_matmul_multi(int n, const mr_qmatrix *const *W, const float *x, int64_t M, float *const *y) {
    mr_matmul_multi_ws(n, W, x, M, y, NULL, 0);
}

void mr_matmul_multi_ws(int n, const mr_qmatrix *const *W, const float *x, int64_t M, float *const *y, void *ws,
                        size_t ws_bytes) {
    const mr_kernels *k = mr_kernels_get();
    enum { NB = 16 };
    bool fast = M >= 1;
    for (int i = 0; i < n; i++) {
        MR_ASSERT(W[i]->cols == W[0]->cols);
        fast = fast && W[i]->fmt < MR_FMT_COUNT && k->rows[W[i]->fmt].fn && W[i]->fmt == W[0]->fmt;
    }
    if (fast) {
        /* tokens in chunks of at most MR_MATMUL_CHUNK (a token's result does not depend on its
         * chunk), so that the workspace of the path on tiles stays that of MR_MATMUL_CHUNK tokens
         * whatever the batch; matrices in groups of up to 8 for the chunks' y pointers */
        for (int64_t m0 = 0; m0 < M; m0 += MR_MATMUL_CHUNK)
            for (int i0 = 0; i0 < n; i0 += 8) {
                const int64_t mc = M - m0 < MR_MATMUL_CHUNK ? M - m0 : MR_MATMUL_CHUNK;
                const int g = n - i0 < 8 ? n - i0 : 8;
                float *yc[8];
                for (int i = 0; i < g; i++) yc[i] = y[i0 + i] + m0 * W[i0 + i]->rows;
                matmul_fast(g, W + i0, x + m0 * W[0]->cols, mc, yc, ws, ws_bytes);
            }
        return;
    }
    for (int i = 0; i < n; i++) {
        const int64_t N = W[i]->rows, K = W[i]->cols;
        const int64_t nblk = (N + NB - 1) / NB;
        const mr_qmatrix *Wi = W[i];
        float *yi = y[i];
#pragma omp parallel for schedule(dynamic, 4) if (N * K * (M > 0 ? M : 1) > 65536)
        for (int64_t b = 0; b < nblk; b++) {
            int64_t n0 = b * NB, nr = N - n0 < NB ? N - n0 : NB;
            mr_gemm_rows(k, Wi, n0, nr, MR_FMT_F32, x, K, NULL, 0, M, yi + n0, N);
        }
    }
}
