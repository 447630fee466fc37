/* pack.c — packed weight matrices (mr_pmatrix): the packers from the
 * checkpoint layouts (row-major E4M3 + 128x128 scales, packed E2M1 + E4M3
 * per 16, bf16) into the 16-row tile layouts of moerun/kernels.h (the zmm
 * ones of the AVX-512 kernels, the ymm ones of the AVX2 kernels), and the
 * scalar block decoders the generic driver uses on all of them.
 * Padding rows and columns are zero codes (value 0). */
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "kernels/kern_internal.h"

static int64_t rup(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

/* fp8_y16: byte q of a k pair's 32 -> its row and k (0 or 1) in the pair */
static int fp8_y16_row(int q) { return (q >> 2) + 8 * (q & 1); }
static int fp8_y16_k(int q) { return (q >> 1) & 1; }

const char *mr_pack_name(mr_pack_id p) {
    switch (p) {
    case MR_PACK_NONE: return "none";
    case MR_PACK_FP8_R16K4: return "fp8_r16k4";
    case MR_PACK_NVFP4_R16K16: return "nvfp4_r16k16";
    case MR_PACK_NVFP4_R16K16B: return "nvfp4_r16k16b";
    case MR_PACK_BF16_R16K2: return "bf16_r16k2";
    case MR_PACK_FP8_Y16: return "fp8_y16";
    case MR_PACK_NVFP4_Y16I: return "nvfp4_y16i";
    case MR_PACK_NVFP4_Y16F: return "nvfp4_y16f";
    default: return "?";
    }
}

static mr_format pack_format(mr_pack_id p) {
    switch (p) {
    case MR_PACK_FP8_R16K4:
    case MR_PACK_FP8_Y16: return MR_FMT_FP8_BLOCK;
    case MR_PACK_NVFP4_R16K16:
    case MR_PACK_NVFP4_R16K16B:
    case MR_PACK_NVFP4_Y16I:
    case MR_PACK_NVFP4_Y16F: return MR_FMT_NVFP4;
    case MR_PACK_BF16_R16K2: return MR_FMT_BF16;
    default: return MR_FMT_COUNT;
    }
}

void mr_pmatrix_free(mr_pmatrix *m) {
    if (!m) return;
    mr_aligned_free(m->data);
    mr_aligned_free(m->tscale);
    mr_aligned_free(m->tsub);
    memset(m, 0, sizeof *m);
}

size_t mr_pmatrix_bytes(const mr_pmatrix *m) {
    size_t b = (size_t)m->n_tiles * m->tile_bytes;
    if (m->tscale) b += (size_t)m->n_tiles * (size_t)(m->Kp / 128) * (sizeof(float) + 1);
    return b;
}

static size_t tile_bytes(mr_pack_id p, int64_t Kp) {
    switch (p) {
    case MR_PACK_FP8_R16K4:
    case MR_PACK_FP8_Y16: return (size_t)16 * (size_t)Kp;
    case MR_PACK_NVFP4_R16K16:
    case MR_PACK_NVFP4_R16K16B:
    case MR_PACK_NVFP4_Y16I:
    case MR_PACK_NVFP4_Y16F: /* 8*Kp code bytes + Kp e4m3 scales, rounded to 64 so every tile is aligned */
        return ((size_t)9 * (size_t)Kp + 63) / 64 * 64;
    case MR_PACK_BF16_R16K2: return (size_t)32 * (size_t)Kp;
    default: return 0;
    }
}

static mr_status alloc_like(mr_pmatrix *m) {
    size_t d, s = 0;
    if (!mr_size_mul((size_t)m->n_tiles, m->tile_bytes, &d) ||
        (m->fmt == MR_FMT_FP8_BLOCK && !mr_size_mul((size_t)m->n_tiles, (size_t)(m->Kp / 128) * 4, &s)))
        return mr_error_set(MR_EOVERFLOW, "packed matrix of %lld tiles is too large", (long long)m->n_tiles);
    /* large matrices on 2 MiB boundaries with transparent huge pages asked
     * for: the kernels stream random experts, and with 4 KiB pages every
     * 4 KiB of the stream costs a TLB walk */
    const size_t huge = (size_t)2 << 20;
    m->data = mr_aligned_alloc(d >= huge ? huge : 64, d ? d : 64);
#ifdef MADV_HUGEPAGE
    if (m->data && d >= huge) (void)madvise(m->data, d, MADV_HUGEPAGE);
#endif
    m->tscale = s ? mr_aligned_alloc(64, s) : NULL;
    m->tsub = s ? mr_aligned_alloc(64, s / 4) : NULL;
    if (!m->data || (s && (!m->tscale || !m->tsub))) {
        mr_pmatrix_free(m);
        return MR_ENOMEM;
    }
    return MR_OK;
}

mr_status mr_pmatrix_clone(const mr_pmatrix *src, mr_pmatrix *dst) {
    *dst = *src;
    dst->data = NULL;
    dst->tscale = NULL;
    dst->tsub = NULL;
    if (!src->data) return MR_OK;
    mr_status st = alloc_like(dst);
    if (st) return st;
    memcpy(dst->data, src->data, (size_t)src->n_tiles * src->tile_bytes);
    if (src->tscale) memcpy(dst->tscale, src->tscale, (size_t)src->n_tiles * (size_t)(src->Kp / 128) * 4);
    if (src->tsub) memcpy(dst->tsub, src->tsub, (size_t)src->n_tiles * (size_t)(src->Kp / 128));
    return MR_OK;
}

/* code of row n, column k of an NVFP4 source (0 outside) */
static inline uint8_t nib(const mr_qmatrix *w, int64_t n, int64_t k) {
    if (n >= w->rows || k >= w->cols) return 0;
    uint8_t b = ((const uint8_t *)w->data)[n * (w->cols / 2) + k / 2];
    return (k & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 15);
}

/* the 128x128 block multipliers of source tile st's rows, per 128 k (0 past the rows) */
static void fp8_tile_scales(const mr_qmatrix *w, int64_t st, int64_t Kp, float *ts) {
    const int64_t nbc = (w->cols + 127) / 128, rb = (16 * st) / 128;
    for (int64_t kb = 0; kb < Kp / 128; kb++) ts[kb] = 16 * st < w->rows ? ((const float *)w->scale)[rb * nbc + kb] : 0.0f;
}

/* per 128 k: whether source tile st's 16 x 128 block holds MR_PACK_FP8_SUBNORMALS or more E4M3
 * subnormal codes */
static void fp8_tile_subnormals(const mr_qmatrix *w, int64_t st, int64_t Kp, uint8_t *sub) {
    const uint8_t *src = w->data;
    for (int64_t kb = 0; kb < Kp / 128; kb++) {
        int n_sub = 0;
        const int64_t k0 = 128 * kb, nk = w->cols - k0 < 128 ? w->cols - k0 : 128; /* nk <= 0 past the columns */
        for (int64_t n = 16 * st; n < 16 * st + 16 && n < w->rows; n++) {
            const uint8_t *p = src + n * w->cols + k0;
            for (int64_t k = 0; k < nk; k++) /* branch-free, so the compiler vectorizes it (loads were 15% of a profile) */
                n_sub += ((p[k] & 0x78) == 0) & ((p[k] & 0x07) != 0);
        }
        sub[kb] = n_sub >= MR_PACK_FP8_SUBNORMALS;
    }
}

/* the e4m3 scales of source tile st, [Kp/16][16] (code 0 past the rows) */
static void nvfp4_tile_scales(const mr_qmatrix *w, int64_t st, int64_t Kp, uint8_t *sc) {
    const int64_t K = w->cols;
    if (16 * st + 16 <= w->rows && Kp == K) { /* inside the source: a transpose */
        const uint8_t *s = (const uint8_t *)w->scale + (size_t)(16 * st) * (size_t)(K / 16);
        for (int r = 0; r < 16; r++)
            for (int64_t j = 0; j < K / 16; j++) sc[j * 16 + r] = s[(size_t)r * (size_t)(K / 16) + (size_t)j];
        return;
    }
    for (int64_t j = 0; j < Kp / 16; j++)
        for (int r = 0; r < 16; r++) {
            const int64_t n = 16 * st + r;
            sc[j * 16 + r] = (n < w->rows && j < K / 16) ? ((const uint8_t *)w->scale)[n * (K / 16) + j] : 0;
        }
}

/* the NVFP4 layouts (moerun/kernels.h): nibble h of byte i of a 16-k block's 128 bytes holds the code of
 * tile row d, column kk of the block */
static void nvfp4_nibble_at(mr_pack_id pack, int i, int h, int *d, int *kk) {
    if (pack == MR_PACK_NVFP4_R16K16 || pack == MR_PACK_NVFP4_R16K16B) { /* line L, byte p */
        const int L = i >> 6, p = i & 63, lane = p >> 4, q = p & 15;
        *d = pack == MR_PACK_NVFP4_R16K16 ? p >> 2 : 4 * lane + ((q & 7) >> 1);
        *kk = pack == MR_PACK_NVFP4_R16K16 ? 8 * L + (p & 3) + 4 * h : 2 * (4 * L + 2 * h + (q >> 3)) + (q & 1);
    } else { /* Y16I / Y16F: vector v, byte q */
        const int v = i >> 5, q = i & 31;
        *d = pack == MR_PACK_NVFP4_Y16F ? 8 * ((q >> 3) & 1) + 4 * (q >> 4) + ((q >> 1) & 3) : 8 * h + (q >> 2);
        *kk = pack == MR_PACK_NVFP4_Y16F ? 4 * v + 2 * h + (q & 1) : 4 * v + (q & 3);
    }
}

/* whether source tile st's bytes (its rows, all columns) hold a NaN code (0x7F / 0xFF) */
static bool fp8_tile_nan(const mr_qmatrix *w, int64_t st) {
    const int64_t r1 = 16 * st + 16 < w->rows ? 16 * st + 16 : w->rows;
    const uint8_t *c = (const uint8_t *)w->data + (size_t)(16 * st) * (size_t)w->cols;
    const size_t n = (size_t)(r1 - 16 * st) * (size_t)w->cols;
    unsigned nan = 0;
    for (size_t e = 0; e < n; e++) nan |= (c[e] & 0x7F) == 0x7F; /* branch-free: the compiler vectorizes it */
    return nan != 0;
}

#if defined(__SSE2__)
/* 4 vectors of 4 dwords transposed: dword j of a, b, c, d to o + j * stride */
static inline void tr4_store(__m128i a, __m128i b, __m128i c, __m128i d, uint8_t *o, size_t stride) {
    const __m128i t0 = _mm_unpacklo_epi32(a, b), t1 = _mm_unpacklo_epi32(c, d);
    const __m128i t2 = _mm_unpackhi_epi32(a, b), t3 = _mm_unpackhi_epi32(c, d);
    _mm_storeu_si128((__m128i *)o, _mm_unpacklo_epi64(t0, t1));
    _mm_storeu_si128((__m128i *)(o + stride), _mm_unpackhi_epi64(t0, t1));
    _mm_storeu_si128((__m128i *)(o + 2 * stride), _mm_unpacklo_epi64(t2, t3));
    _mm_storeu_si128((__m128i *)(o + 3 * stride), _mm_unpackhi_epi64(t2, t3));
}

/* An FP8 tile whose 16 rows lie inside a source of K % 128 == 0 columns, 16 k at a time: each row's 16
 * bytes loaded once, moved into the pack's order by unpacks (R16K4: a lane's 4 rows' 16-bit halves
 * interleaved, the layout of moerun/kernels.h; Y16: rows i and i + 8 interleaved by bytes, then the 8
 * rows' dwords transposed), each 128-k block's E4M3 subnormal codes counted on the way (sub) and NaN
 * codes noted (the return). One pass over the source where the scalar form made three (the NaN scan,
 * the copy, the subnormal count): bench/README.md, "Loading". */
static bool fp8_tile_sse2(mr_pack_id pack, const uint8_t *src, int64_t K, int64_t row0, uint8_t *tile, uint8_t *sub) {
    const __m128i z = _mm_setzero_si128(), m78 = _mm_set1_epi8(0x78), m07 = _mm_set1_epi8(0x07),
                  m7f = _mm_set1_epi8(0x7F);
    __m128i nan = z;
    for (int64_t kb = 0; kb < K / 128; kb++) {
        __m128i cnt = z; /* per byte lane: at most 8 steps x 16 rows = 128 */
        for (int64_t k0 = 128 * kb; k0 < 128 * kb + 128; k0 += 16) {
            __m128i r[16];
            for (int i = 0; i < 16; i++) {
                r[i] = _mm_loadu_si128((const __m128i *)(src + (size_t)(row0 + i) * (size_t)K + (size_t)k0));
                const __m128i e0 = _mm_cmpeq_epi8(_mm_and_si128(r[i], m78), z);
                const __m128i m0 = _mm_cmpeq_epi8(_mm_and_si128(r[i], m07), z);
                cnt = _mm_sub_epi8(cnt, _mm_andnot_si128(m0, e0)); /* exponent 0, mantissa not 0 */
                nan = _mm_or_si128(nan, _mm_cmpeq_epi8(_mm_and_si128(r[i], m7f), m7f));
            }
            uint8_t *o = tile + 16 * k0; /* R16K4: 64 bytes per 4 k; Y16: 32 bytes per 2 k */
            if (pack == MR_PACK_FP8_R16K4) {
                for (int l = 0; l < 4; l++) {
                    const __m128i a = _mm_unpacklo_epi16(r[4 * l], r[4 * l + 1]);
                    const __m128i b = _mm_unpacklo_epi16(r[4 * l + 2], r[4 * l + 3]);
                    const __m128i c = _mm_unpackhi_epi16(r[4 * l], r[4 * l + 1]);
                    const __m128i d = _mm_unpackhi_epi16(r[4 * l + 2], r[4 * l + 3]);
                    _mm_storeu_si128((__m128i *)(o + 16 * l), _mm_unpacklo_epi32(a, b));
                    _mm_storeu_si128((__m128i *)(o + 64 + 16 * l), _mm_unpackhi_epi32(a, b));
                    _mm_storeu_si128((__m128i *)(o + 128 + 16 * l), _mm_unpacklo_epi32(c, d));
                    _mm_storeu_si128((__m128i *)(o + 192 + 16 * l), _mm_unpackhi_epi32(c, d));
                }
            } else {
                __m128i P[8], Q[8];
                for (int i = 0; i < 8; i++) P[i] = _mm_unpacklo_epi8(r[i], r[i + 8]), Q[i] = _mm_unpackhi_epi8(r[i], r[i + 8]);
                tr4_store(P[0], P[1], P[2], P[3], o, 32);
                tr4_store(P[4], P[5], P[6], P[7], o + 16, 32);
                tr4_store(Q[0], Q[1], Q[2], Q[3], o + 128, 32);
                tr4_store(Q[4], Q[5], Q[6], Q[7], o + 144, 32);
            }
        }
        const __m128i sum = _mm_sad_epu8(cnt, z);
        sub[kb] = _mm_cvtsi128_si32(sum) + _mm_cvtsi128_si32(_mm_unpackhi_epi64(sum, sum)) >= MR_PACK_FP8_SUBNORMALS;
    }
    return _mm_movemask_epi8(nan) != 0;
}
#endif

/* the codes of an FP8_R16K4 tile by words and bytes (a tile the SSE2 form does not take) */
static void fp8_tile_r16k4(const mr_pmatrix *m, const mr_qmatrix *w, int64_t st, uint8_t *tile) {
    const int64_t K = w->cols, N = w->rows, Kp = m->Kp;
    const uint8_t *src = w->data;
    /* the k groups whose 16 rows x 4 k lie inside the source: each 16-byte lane of the line is
     * its 4 rows' 4-byte runs (dwords d0..d3) as the low halves of d0..d3, then the high halves
     * (the layout of the header: byte q = 8 (kk >> 1) + 2 j + (kk & 1)); the rest byte by byte */
    const int64_t gfast = 16 * st + 16 <= N ? K / 4 : 0;
    for (int64_t g = 0; g < gfast; g++)
        for (int lane = 0; lane < 4; lane++) {
            uint64_t lo = 0, hi = 0;
            for (int j = 0; j < 4; j++) {
                uint32_t d;
                memcpy(&d, src + (16 * st + 4 * lane + j) * K + 4 * g, 4);
                lo |= (uint64_t)(d & 0xFFFF) << (16 * j);
                hi |= (uint64_t)(d >> 16) << (16 * j);
            }
            memcpy(tile + g * 64 + lane * 16, &lo, 8);
            memcpy(tile + g * 64 + lane * 16 + 8, &hi, 8);
        }
    for (int64_t g = gfast; g < Kp / 4; g++)
        for (int p = 0; p < 64; p++) {
            int lane = p >> 4, q = p & 15, d = 4 * lane + ((q & 7) >> 1), kk = 2 * (q >> 3) + (q & 1);
            int64_t n = 16 * st + d, k = 4 * g + kk;
            tile[g * 64 + p] = (n < N && k < K) ? src[n * K + k] : 0;
        }
}

/* the codes of an FP8_Y16 tile by bytes (a tile the SSE2 form does not take) */
static void fp8_tile_y16(const mr_pmatrix *m, const mr_qmatrix *w, int64_t st, uint8_t *tile) {
    const int64_t K = w->cols, N = w->rows, Kp = m->Kp;
    const uint8_t *src = w->data;
    /* inside the source: byte 4 i + j is row i + 8 (j & 1), k 2 g + (j >> 1), i.e. the two
     * bytes of rows i and i + 8 at 2 g, interleaved */
    const int64_t gfast = 16 * st + 16 <= N ? K / 2 : 0;
    for (int64_t g = 0; g < gfast; g++)
        for (int i = 0; i < 8; i++) {
            const uint8_t *a = src + (16 * st + i) * K + 2 * g, *b = src + (16 * st + i + 8) * K + 2 * g;
            uint8_t *o = tile + g * 32 + 4 * i;
            o[0] = a[0], o[1] = b[0], o[2] = a[1], o[3] = b[1];
        }
    for (int64_t g = gfast; g < Kp / 2; g++)
        for (int q = 0; q < 32; q++) {
            const int64_t n = 16 * st + fp8_y16_row(q), k = 2 * g + fp8_y16_k(q);
            tile[g * 32 + q] = (n < N && k < K) ? src[n * K + k] : 0;
        }
}

/* one tile of the pack; FP8: returns whether its source bytes hold a NaN code */
static bool pack_tile(const mr_pmatrix *m, const mr_qmatrix *w, int64_t st, uint8_t *tile, float *ts, uint8_t *sub) {
    const int64_t K = w->cols, N = w->rows, Kp = m->Kp;
    switch (m->pack) {
    case MR_PACK_FP8_R16K4:
    case MR_PACK_FP8_Y16:
        fp8_tile_scales(w, st, Kp, ts);
#if defined(__SSE2__)
        if (16 * st + 16 <= N && K % 128 == 0) return fp8_tile_sse2(m->pack, w->data, K, 16 * st, tile, sub);
#endif
        if (m->pack == MR_PACK_FP8_Y16)
            fp8_tile_y16(m, w, st, tile);
        else
            fp8_tile_r16k4(m, w, st, tile);
        fp8_tile_subnormals(w, st, Kp, sub);
        return fp8_tile_nan(w, st);
    case MR_PACK_NVFP4_R16K16:
    case MR_PACK_NVFP4_R16K16B:
    case MR_PACK_NVFP4_Y16I:
    case MR_PACK_NVFP4_Y16F: {
        const uint8_t *src = (const uint8_t *)w->data + (size_t)(16 * st) * (size_t)(K / 2);
        if (16 * st + 16 <= N && (m->pack == MR_PACK_NVFP4_R16K16 || m->pack == MR_PACK_NVFP4_R16K16B)) {
            /* a row's 8 bytes of block j are codes k 0-15 as nibbles 0-15; line L's 4 bytes of the row
             * are nibbles 8 L .. 8 L + 7 in the order 0 4 1 5 2 6 3 7 (a nibble shuffle of each half),
             * at 4 d in the line (R16K16), or as two byte pairs at 2 (d % 4) and 2 (d % 4) + 8 of the
             * row's 16-byte lane d / 4 (R16K16B) */
            const bool pairs = m->pack == MR_PACK_NVFP4_R16K16B;
            for (int64_t j = 0; j < Kp / 16; j++)
                for (int d = 0; d < 16; d++) {
                    uint64_t x;
                    memcpy(&x, src + (size_t)d * (size_t)(K / 2) + 8 * j, 8);
                    x = (x & 0xFF0000FFFF0000FFull) | ((x & 0x0000FF000000FF00ull) << 8) | ((x >> 8) & 0x0000FF000000FF00ull);
                    x = (x & 0xF00FF00FF00FF00Full) | ((x & 0x00F000F000F000F0ull) << 4) | ((x >> 4) & 0x00F000F000F000F0ull);
                    for (int L = 0; L < 2; L++) {
                        const uint32_t l = (uint32_t)(x >> (32 * L));
                        uint8_t *line = tile + (2 * j + L) * 64;
                        if (!pairs) {
                            memcpy(line + 4 * d, &l, 4);
                        } else {
                            const uint16_t a = (uint16_t)l, b = (uint16_t)(l >> 16);
                            memcpy(line + 16 * (d >> 2) + 2 * (d & 3), &a, 2);
                            memcpy(line + 16 * (d >> 2) + 2 * (d & 3) + 8, &b, 2);
                        }
                    }
                }
        } else if (16 * st + 16 <= N && m->pack == MR_PACK_NVFP4_Y16F) {
            /* vector v's 2 bytes of row d = 8 a + 4 b + c, at 16 b + 8 a + 2 c: nibbles 4 v .. 4 v + 3 of
             * the row in the order 0 2 1 3 */
            for (int64_t j = 0; j < Kp / 16; j++)
                for (int d = 0; d < 16; d++) {
                    uint64_t x;
                    memcpy(&x, src + (size_t)d * (size_t)(K / 2) + 8 * j, 8);
                    x = (x & 0xF00FF00FF00FF00Full) | ((x & 0x0F000F000F000F00ull) >> 4) | ((x & 0x00F000F000F000F0ull) << 4);
                    const int q0 = 16 * ((d >> 2) & 1) + 8 * (d >> 3) + 2 * (d & 3);
                    for (int v = 0; v < 4; v++) {
                        const uint16_t o = (uint16_t)(x >> (16 * v));
                        memcpy(tile + j * 128 + v * 32 + q0, &o, 2);
                    }
                }
        } else if (16 * st + 16 <= N && m->pack == MR_PACK_NVFP4_Y16I) {
            /* vector v's 4 bytes of rows d, d + 8: nibbles 4 v .. 4 v + 3 of each row, row d's low */
            for (int64_t j = 0; j < Kp / 16; j++)
                for (int d = 0; d < 8; d++) {
                    uint64_t a, b;
                    memcpy(&a, src + (size_t)d * (size_t)(K / 2) + 8 * j, 8);
                    memcpy(&b, src + (size_t)(d + 8) * (size_t)(K / 2) + 8 * j, 8);
                    for (int v = 0; v < 4; v++) {
                        uint32_t lo = (uint32_t)(a >> (16 * v)) & 0xFFFF, hi = (uint32_t)(b >> (16 * v)) & 0xFFFF;
                        lo = (lo | lo << 8) & 0x00FF00FFu, lo = (lo | lo << 4) & 0x0F0F0F0Fu;
                        hi = (hi | hi << 8) & 0x00FF00FFu, hi = (hi | hi << 4) & 0x0F0F0F0Fu;
                        const uint32_t o = lo | hi << 4;
                        memcpy(tile + j * 128 + v * 32 + 4 * d, &o, 4);
                    }
                }
        } else { /* the last tile, whose rows run past the source: nibble by nibble */
            uint8_t at[128][2]; /* byte i of a 16-k block: its two nibbles' (row, k in the block) */
            for (int i = 0; i < 128; i++)
                for (int h = 0; h < 2; h++) {
                    int d, kk;
                    nvfp4_nibble_at(m->pack, i, h, &d, &kk);
                    at[i][h] = (uint8_t)(16 * d + kk);
                }
            for (int64_t j = 0; j < Kp / 16; j++)
                for (int i = 0; i < 128; i++)
                    tile[j * 128 + i] = (uint8_t)(nib(w, 16 * st + (at[i][0] >> 4), 16 * j + (at[i][0] & 15)) |
                                                  nib(w, 16 * st + (at[i][1] >> 4), 16 * j + (at[i][1] & 15)) << 4);
        }
        nvfp4_tile_scales(w, st, Kp, tile + 8 * Kp);
        break;
    }
    case MR_PACK_BF16_R16K2: {
        uint16_t *t = (uint16_t *)tile;
        const uint16_t *src = w->data;
        const int64_t gfast = 16 * st + 16 <= N ? K / 2 : 0; /* (k, k + 1) of 16 rows inside the source */
        for (int64_t g = 0; g < gfast; g++)
            for (int d = 0; d < 16; d++) memcpy(t + g * 32 + d * 2, src + (16 * st + d) * K + 2 * g, 4);
        for (int64_t g = gfast; g < Kp / 2; g++)
            for (int d = 0; d < 16; d++)
                for (int e = 0; e < 2; e++) {
                    int64_t n = 16 * st + d, k = 2 * g + e;
                    t[g * 32 + d * 2 + e] = (n < N && k < K) ? src[n * K + k] : 0;
                }
        break;
    }
    default: MR_ASSERT(!"pack");
    }
    return false;
}

mr_status mr_pmatrix_pack(mr_pmatrix *out, mr_pack_id pack, const mr_qmatrix *const *src, int nsrc) {
    memset(out, 0, sizeof *out);
    mr_format f = pack_format(pack);
    if (f == MR_FMT_COUNT) return mr_error_set(MR_EINVAL, "unknown pack id %d", (int)pack);
    if (nsrc < 1 || nsrc > 2) return mr_error_set(MR_EINVAL, "pack takes 1 or 2 sources, not %d", nsrc);
    const mr_qmatrix *w = src[0];
    for (int i = 0; i < nsrc; i++) {
        if (!src[i]->data || src[i]->fmt != f)
            return mr_error_set(MR_EINVAL, "pack %s needs %s source matrices", mr_pack_name(pack),
                                mr_format_traits_get(f) ? mr_format_traits_get(f)->name : "?");
        if (src[i]->rows != w->rows || src[i]->cols != w->cols)
            return mr_error_set(MR_EINVAL, "packed sources differ in shape ([%lld][%lld] vs [%lld][%lld])",
                                (long long)src[i]->rows, (long long)src[i]->cols, (long long)w->rows,
                                (long long)w->cols);
        if (f == MR_FMT_NVFP4 && src[i]->scale2 != w->scale2)
            return mr_error_set(MR_EFORMAT, "nvfp4 sources packed together must share weight_scale_2 (%g vs %g)",
                                src[i]->scale2, w->scale2);
    }
    if (f == MR_FMT_NVFP4 && w->cols % 16)
        return mr_error_set(MR_EINVAL, "nvfp4 matrix needs cols %% 16 == 0 (got %lld)", (long long)w->cols);
    if (w->rows < 1 || w->cols < 1 || w->rows > ((int64_t)1 << 30) || w->cols > ((int64_t)1 << 30))
        return mr_error_set(MR_EINVAL, "cannot pack a [%lld][%lld] matrix", (long long)w->rows, (long long)w->cols);
    out->pack = pack;
    out->fmt = f;
    out->nsrc = nsrc;
    out->src_rows = w->rows;
    out->cols = w->cols;
    out->Kp = rup(w->cols, f == MR_FMT_FP8_BLOCK ? 128 : f == MR_FMT_NVFP4 ? 16 : 2);
    out->n_tiles = (int64_t)nsrc * (rup(w->rows, 16) / 16);
    out->tile_bytes = tile_bytes(pack, out->Kp);
    out->scale2 = f == MR_FMT_NVFP4 ? w->scale2 : 1.0f;
    out->input_scale = 0.0f;
    for (int i = 0; i < nsrc; i++)
        if (src[i]->input_scale > out->input_scale) out->input_scale = src[i]->input_scale;
    mr_status st = alloc_like(out);
    if (st) return st;
    const int64_t nkb = out->Kp / 128;
    bool nan = false; /* FP8: every source byte is in one tile, and each tile says whether it saw a NaN code */
    for (int64_t t = 0; t < out->n_tiles; t++)
        nan |= pack_tile(out, src[t % nsrc], t / nsrc, out->data + (size_t)t * out->tile_bytes,
                         out->tscale ? out->tscale + t * nkb : NULL, out->tsub ? out->tsub + t * nkb : NULL);
    out->has_nan = nan;
    return MR_OK;
}

/* ---- scalar block decoders (the generic driver, uk.c) ---- */
void mr__pk_fp8_block_f32(const mr_pmatrix *W, const uint8_t *tile, int64_t kb, float *out) {
    const uint8_t *p0 = tile + kb * 2048;
    if (W->pack == MR_PACK_FP8_Y16) {
        for (int g = 0; g < 64; g++)
            for (int q = 0; q < 32; q++) out[(2 * g + fp8_y16_k(q)) * 16 + fp8_y16_row(q)] = mr__e4m3_lut[p0[g * 32 + q]];
        return;
    }
    for (int g = 0; g < 32; g++)
        for (int p = 0; p < 64; p++) {
            int lane = p >> 4, q = p & 15, d = 4 * lane + ((q & 7) >> 1), kk = 2 * (q >> 3) + (q & 1);
            out[(4 * g + kk) * 16 + d] = mr__e4m3_lut[p0[g * 64 + p]];
        }
}

void mr__pk_nvfp4_block_f32(const mr_pmatrix *W, const uint8_t *tile, int64_t j, float *w, float *sc) {
    const uint8_t *p0 = tile + j * 128;
    if (W->pack == MR_PACK_NVFP4_Y16I || W->pack == MR_PACK_NVFP4_Y16F) {
        const bool f = W->pack == MR_PACK_NVFP4_Y16F;
        for (int v = 0; v < 4; v++)
            for (int q = 0; q < 32; q++)
                for (int h = 0; h < 2; h++) {
                    const int d = f ? 8 * ((q >> 3) & 1) + 4 * (q >> 4) + ((q >> 1) & 3) : 8 * h + (q >> 2);
                    const int k = f ? 4 * v + 2 * h + (q & 1) : 4 * v + (q & 3);
                    w[k * 16 + d] = mr__e2m1_lut[(p0[v * 32 + q] >> (4 * h)) & 15];
                }
    }
    for (int L = 0; L < 2 && W->pack != MR_PACK_NVFP4_Y16I && W->pack != MR_PACK_NVFP4_Y16F; L++)
        for (int p = 0; p < 64; p++) {
            uint8_t b = p0[L * 64 + p];
            for (int h = 0; h < 2; h++) {
                int d, k;
                if (W->pack == MR_PACK_NVFP4_R16K16) {
                    d = p >> 2, k = 8 * L + (p & 3) + 4 * h;
                } else {
                    int lane = p >> 4, q = p & 15;
                    d = 4 * lane + ((q & 7) >> 1), k = 2 * (4 * L + 2 * h + (q >> 3)) + (q & 1);
                }
                w[k * 16 + d] = mr__e2m1_lut[h ? b >> 4 : b & 15];
            }
        }
    const uint8_t *s = tile + 8 * W->Kp + 16 * j;
    for (int d = 0; d < 16; d++) sc[d] = mr__e4m3_lut[s[d]];
}

void mr__pk_bf16_pairs_f32(const uint8_t *tile, int64_t g0, int ng, float *out) {
    const uint16_t *t = (const uint16_t *)tile + g0 * 32;
    for (int g = 0; g < ng; g++)
        for (int d = 0; d < 16; d++)
            for (int e = 0; e < 2; e++) {
                uint32_t u = (uint32_t)t[g * 32 + d * 2 + e] << 16;
                memcpy(&out[(2 * g + e) * 16 + d], &u, 4);
            }
}
