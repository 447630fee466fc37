/* amx_i8_block.c — what one NVFP4 16-k block of 16 tokens x 16 rows costs on AMX-INT8 tiles, taken
 * apart, against the AVX-512 vpdpbusd form the library runs (uk_avx512.c, nvfp4_i8_body). The E4M3
 * row scale changes every 16 k, so a tile op (tdpbssd) can take one block, a quarter of its k, and
 * each block's int32 sums need their own epilogue (vcvtdq2ps + one FMA with the row scales a token):
 *   tiles      B tile (4 rows of 64 bytes) and A tile (16 tokens x 16 bytes) loads, tilezero,
 *              tdpbssd, C stored to one of two buffers (the epilogue reads the other one);
 *   decode     128 bytes of nibbles -> the B tile's 256 int8 by 4 vpermb, stored (vector stores);
 *   epilogue   16 rows: load, vcvtdq2ps, vfmadd231ps into 16 accumulators.
 * The variants drop parts, or decode the B tile 4 blocks ahead into a ring (a tile load of bytes
 * that vector stores wrote just before waits for them). Costs only: the values are not used. One
 * thread, L1-resident. Not part of CMake.
 *
 *   make -C dev/perf amx_i8_block && dev/perf/amx_i8_block */
#include "amx_tool.h" /* first: it defines _GNU_SOURCE */

#include <stdio.h>

enum { NB = 192, REPS = 20000, RING = 16, AHEAD = 4 };
static int8_t X[16 * NB * 16] __attribute__((aligned(64)));
static uint8_t W[(NB + AHEAD) * 128] __attribute__((aligned(64)));
static __m512i ring[4 * RING];
static int32_t cbuf[2 * 256] __attribute__((aligned(64)));
static volatile float sink;

/* a pass's result: ns a block from its start t0; its sums kept alive */
static double pass_end(double t0, const __m512 *ga) {
    const double t = now() - t0;
    float s = 0;
    for (int m = 0; m < 16; m++) s += _mm512_reduce_add_ps(ga[m]);
    sink = s;
    return t / ((double)REPS * NB) * 1e9;
}

/* one pass over NB blocks: dec 0 none, 1 just before its tile load, 2 AHEAD blocks ahead */
static double amx_pass(int dec, int tiles, int epi) {
    const __m512i lut = _mm512_set1_epi32(0x0C080604); /* any bytes: the values are not used */
    const __m512 sc = _mm512_set1_ps(1.0f);
    __m512 ga[16] = {0};
    const double t0 = now();
    for (int r = 0; r < REPS; r++)
        for (int64_t j = 0; j < NB; j++) {
            const int64_t jd = dec == 2 ? j + AHEAD : j;
            __m512i *bw = ring + 4 * (jd % RING);
            const __m512i *bq = ring + 4 * (j % RING);
            if (dec) {
                const __m512i v0 = _mm512_load_si512(W + jd * 128), v1 = _mm512_load_si512(W + jd * 128 + 64);
                _mm512_store_si512(bw, _mm512_permutexvar_epi8(v0, lut));
                _mm512_store_si512(bw + 1, _mm512_permutexvar_epi8(_mm512_srli_epi16(v0, 4), lut));
                _mm512_store_si512(bw + 2, _mm512_permutexvar_epi8(v1, lut));
                _mm512_store_si512(bw + 3, _mm512_permutexvar_epi8(_mm512_srli_epi16(v1, 4), lut));
            }
            if (tiles && (j & 1)) {
                _tile_loadd(5, bq, 64);
                _tile_loadd(3, X + 16 * j, NB * 16);
                _tile_zero(1);
                _tile_dpbssd(1, 3, 5);
                _tile_stored(1, cbuf + 256, 64);
            } else if (tiles) {
                _tile_loadd(4, bq, 64);
                _tile_loadd(2, X + 16 * j, NB * 16);
                _tile_zero(0);
                _tile_dpbssd(0, 2, 4);
                _tile_stored(0, cbuf, 64);
            }
            if (epi) {
                const int32_t *c = cbuf + 256 * ((j + 1) & 1);
                for (int m = 0; m < 16; m++)
                    ga[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * m)), sc, ga[m]);
            }
        }
    return pass_end(t0, ga);
}

/* the vpdpbusd form of the same block: decode to 4 registers, per token 4 vpdpbusd with the
 * broadcast dwords of its 16 int8, vcvtdq2ps and one FMA */
static double dpbusd_pass(void) {
    const __m512i lut = _mm512_set1_epi32(0x0C080604); /* any bytes: the values are not used */
    const __m512 sc = _mm512_set1_ps(1.0f);
    __m512 ga[16] = {0};
    const double t0 = now();
    for (int r = 0; r < REPS; r++)
        for (int64_t j = 0; j < NB; j++) {
            const __m512i v0 = _mm512_load_si512(W + j * 128), v1 = _mm512_load_si512(W + j * 128 + 64);
            const __m512i a = _mm512_permutexvar_epi8(v0, lut), b = _mm512_permutexvar_epi8(_mm512_srli_epi16(v0, 4), lut);
            const __m512i c = _mm512_permutexvar_epi8(v1, lut), d = _mm512_permutexvar_epi8(_mm512_srli_epi16(v1, 4), lut);
            for (int m = 0; m < 16; m++) {
                const int32_t *x4 = (const int32_t *)(X + m * NB * 16 + 16 * j);
                __m512i acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), a, _mm512_set1_epi32(x4[0]));
                acc = _mm512_dpbusd_epi32(acc, b, _mm512_set1_epi32(x4[1]));
                acc = _mm512_dpbusd_epi32(acc, c, _mm512_set1_epi32(x4[2]));
                acc = _mm512_dpbusd_epi32(acc, d, _mm512_set1_epi32(x4[3]));
                ga[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), sc, ga[m]);
            }
        }
    return pass_end(t0, ga);
}

int main(void) {
    for (size_t i = 0; i < sizeof W; i++) W[i] = (uint8_t)(i * 37 + 11);
    for (size_t i = 0; i < sizeof X; i++) X[i] = (int8_t)(i * 13 - 60);
    dpbusd_pass(); /* warm-up: the first pass ran at half speed (the core's clock ramp) */
    const double base = dpbusd_pass();
    printf("vpdpbusd form (4 vpdpbusd + cvt + FMA a token):  %5.1f ns a block of 16 tokens x 16 rows x 16 k\n", base);
    if (!amx_grant()) {
        printf("no AMX tile state granted here: the tile variants are not run\n");
        return 0;
    }
    amx_cfg c = amx_cfg_full(6);
    c.colsb[2] = c.colsb[3] = 16; /* A: 16 tokens x 16 int8 k */
    c.rows[4] = c.rows[5] = 4;    /* B: 4 rows of 16 rows x 4 k */
    amx_load_cfg(&c);
    static const struct {
        const char *what;
        int dec, tiles, epi;
    } v[] = {
        {"tiles + decode just before + epilogue", 1, 1, 1},
        {"tiles + decode 4 blocks ahead + epilogue", 2, 1, 1},
        {"tiles + epilogue (no decode)", 0, 1, 1},
        {"tiles + decode 4 ahead (no epilogue)", 2, 1, 0},
        {"tiles alone", 0, 1, 0},
        {"epilogue alone", 0, 0, 1},
        {"decode alone", 2, 0, 0},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        const double ns = amx_pass(v[i].dec, v[i].tiles, v[i].epi);
        printf("tdpbssd: %-42s %5.1f ns a block  (vpdpbusd form / this: %.2fx)\n", v[i].what, ns, base / ns);
    }
    _tile_release();
    return 0;
}
