/* dev/perf/kern_pack.c — generic-C packers from the checkpoint layouts
 * (row-major e4m3 / packed e2m1 / bf16) into the tile layouts of kern.h.
 * Padding rows and columns are zero codes (value 0). */
#include <string.h>

#include "kern.h"

static int64_t rup(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

size_t mr_pk_fp8_tile_bytes(int64_t Kp) { return (size_t)16 * (size_t)Kp; }

void mr_pk_fp8_pack(const uint8_t *w, const float *sc, int64_t N, int64_t K, uint8_t *dst, float *dsc) {
    int64_t Kp = rup(K, 128), nt = rup(N, 16) / 16, nbr = rup(N, 128) / 128, nbc = rup(K, 128) / 128;
    for (int64_t t = 0; t < nt; t++) {
        uint8_t *tile = dst + (size_t)t * mr_pk_fp8_tile_bytes(Kp);
        for (int64_t g = 0; g < Kp / 4; g++)
            for (int p = 0; p < 64; p++) {
                int lane = p >> 4, q = p & 15, d = 4 * lane + ((q & 7) >> 1), kk = 2 * (q >> 3) + (q & 1);
                int64_t n = 16 * t + d, k = 4 * g + kk;
                tile[g * 64 + p] = (n < N && k < K) ? w[n * K + k] : 0;
            }
    }
    for (int64_t i = 0; i < nbr * nbc; i++) dsc[i] = sc[i];
}

size_t mr_pk_nvfp4_tile_bytes(int64_t Kp) { return (size_t)8 * (size_t)Kp + (size_t)Kp; }

static uint8_t nib(const uint8_t *w, int64_t N, int64_t K, int64_t n, int64_t k) {
    if (n >= N || k >= K) return 0;
    uint8_t b = w[n * (K / 2) + k / 2];
    return (k & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 15);
}

static void nvfp4_scales(const uint8_t *sc, int64_t N, int64_t K, int64_t t, int64_t Kp, uint8_t *dst) {
    for (int64_t j = 0; j < Kp / 16; j++)
        for (int r = 0; r < 16; r++) {
            int64_t n = 16 * t + r;
            dst[j * 16 + r] = (n < N && j < K / 16) ? sc[n * (K / 16) + j] : 0;
        }
}

void mr_pk_nvfp4_pack(const uint8_t *w, const uint8_t *sc, int64_t N, int64_t K, uint8_t *dst) {
    int64_t Kp = rup(K, 16), nt = rup(N, 16) / 16;
    for (int64_t t = 0; t < nt; t++) {
        uint8_t *tile = dst + (size_t)t * mr_pk_nvfp4_tile_bytes(Kp);
        for (int64_t j = 0; j < Kp / 16; j++)
            for (int L = 0; L < 2; L++)
                for (int p = 0; p < 64; p++) {
                    int64_t n = 16 * t + (p >> 2), k = 16 * j + 8 * L + (p & 3);
                    tile[(j * 2 + L) * 64 + p] = (uint8_t)(nib(w, N, K, n, k) | nib(w, N, K, n, k + 4) << 4);
                }
        nvfp4_scales(sc, N, K, t, Kp, tile + (size_t)8 * Kp);
    }
}

void mr_pk_nvfp4b_pack(const uint8_t *w, const uint8_t *sc, int64_t N, int64_t K, uint8_t *dst) {
    int64_t Kp = rup(K, 16), nt = rup(N, 16) / 16;
    for (int64_t t = 0; t < nt; t++) {
        uint8_t *tile = dst + (size_t)t * mr_pk_nvfp4_tile_bytes(Kp);
        for (int64_t j = 0; j < Kp / 16; j++)
            for (int L = 0; L < 2; L++)
                for (int p = 0; p < 64; p++) {
                    int lane = p >> 4, q = p & 15, d = 4 * lane + ((q & 7) >> 1), u = q >> 3, e = q & 1;
                    int64_t n = 16 * t + d;
                    uint8_t b = 0;
                    for (int h = 0; h < 2; h++)
                        b |= (uint8_t)(nib(w, N, K, n, 16 * j + 2 * (4 * L + 2 * h + u) + e) << (4 * h));
                    tile[(j * 2 + L) * 64 + p] = b;
                }
        nvfp4_scales(sc, N, K, t, Kp, tile + (size_t)8 * Kp);
    }
}

size_t mr_pk_bf16_tile_bytes(int64_t Kp) { return (size_t)32 * (size_t)Kp; }

void mr_pk_bf16_pack(const uint16_t *w, int64_t N, int64_t K, uint8_t *dst) {
    int64_t Kp = rup(K, 2), nt = rup(N, 16) / 16;
    for (int64_t t = 0; t < nt; t++) {
        uint16_t *tile = (uint16_t *)(dst + (size_t)t * mr_pk_bf16_tile_bytes(Kp));
        for (int64_t g = 0; g < Kp / 2; g++)
            for (int d = 0; d < 16; d++)
                for (int e = 0; e < 2; e++) {
                    int64_t n = 16 * t + d, k = 2 * g + e;
                    tile[g * 32 + d * 2 + e] = (n < N && k < K) ? w[n * K + k] : 0;
                }
    }
}
