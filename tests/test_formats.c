/* test_formats.c — formats/: scalar conversions, traits table, quantized
 * weight matrices and activation quantizers.
 *
 * Oracles: golden vectors in tests/data/formats/ written by
 * tools/golden/gen_formats.py from independent libraries (ml_dtypes for
 * e4m3/e5m2/e2m1, numpy for f16, torch for bf16, nvidia-modelopt and a
 * transliteration for NVFP4 weights, transformers' Fp8Quantize and a
 * transliteration for FP8 block weights, vLLM's reference formulas for the
 * activation quantizers); the spec's own test tables; and properties
 * (error bounds, idempotence, NaN/inf rules) looped over the traits table.
 * Comparisons are bit for bit. Where a NaN is expected, the oracle's payload
 * may differ from ours (e.g. numpy keeps signalling payloads in f16, ml_dtypes
 * quiets differently), so NaN is compared as "is NaN with the right sign". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moerun/formats.h"
#include "testutil.h"

/* ---------------------------------------------------------------- helpers */
static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static float bitsf(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Loads tests/data/formats/<name>; checks the size is count * elem. */
static void *load(const char *name, size_t elem, size_t *count) {
    char rel[256];
    size_t len = 0;
    snprintf(rel, sizeof rel, "formats/%s", name);
    void *p = tu_read_file(tu_data(rel), &len);
    if (p == NULL) fail_msg("cannot read golden file %s (run tools/golden/gen_formats.py)", tu_data(rel));
    assert_int_equal(len % elem, 0);
    if (count) *count = len / elem;
    return p;
}

/* f32 results: equal bits, or both NaN with the same sign. */
static void assert_f32_same(float got, float want, const char *what, size_t i) {
    if (isnan(want)) {
        if (!isnan(got) || signbit(got) != signbit(want))
            fail_msg("%s[%zu]: got %08x, want a NaN with sign %d", what, i, fbits(got), signbit(want) != 0);
        return;
    }
    if (fbits(got) != fbits(want))
        fail_msg("%s[%zu]: got %08x (%g), want %08x (%g)", what, i, fbits(got), (double)got, fbits(want),
                 (double)want);
}

/* ---------------------------------------------------------------- decoders */
static void test_decode_all_codes(void **st) {
    (void)st;
    size_t n;
    float *e4 = load("dec_e4m3.f32", 4, &n);
    assert_int_equal(n, 256);
    for (size_t i = 0; i < 256; i++) assert_f32_same(mr_e4m3_to_f32((uint8_t)i), e4[i], "e4m3 decode", i);
    float *e5 = load("dec_e5m2.f32", 4, &n);
    assert_int_equal(n, 256);
    for (size_t i = 0; i < 256; i++) assert_f32_same(mr_e5m2_to_f32((uint8_t)i), e5[i], "e5m2 decode", i);
    float *e2 = load("dec_e2m1.f32", 4, &n);
    assert_int_equal(n, 16);
    for (size_t i = 0; i < 16; i++) assert_f32_same(mr_e2m1_to_f32((uint8_t)i), e2[i], "e2m1 decode", i);
    float *h = load("dec_f16.f32", 4, &n);
    assert_int_equal(n, 65536);
    for (size_t i = 0; i < 65536; i++) assert_f32_same(mr_f16_to_f32((uint16_t)i), h[i], "f16 decode", i);
    free(e4);
    free(e5);
    free(e2);
    free(h);
    /* bf16 decoding is exact by definition (u32 = b << 16) */
    assert_int_equal(fbits(mr_bf16_to_f32(0x3F80)), 0x3F800000u);
    assert_int_equal(fbits(mr_bf16_to_f32(0xFF80)), 0xFF800000u);
}

/* ---------------------------------------------------------------- encoders */
typedef struct {
    const char *name;
    int bytes;                    /* 1 or 2 */
    uint32_t (*enc)(float);
    bool (*is_nan)(uint32_t code);
    bool (*is_neg)(uint32_t code);
} encoder;

static uint32_t enc_bf16(float x) { return mr_f32_to_bf16(x); }
static uint32_t enc_f16(float x) { return mr_f32_to_f16(x); }
static uint32_t enc_e4m3(float x) { return mr_f32_to_e4m3(x); }
static uint32_t enc_e5m2(float x) { return mr_f32_to_e5m2(x); }
static uint32_t enc_e2m1(float x) { return mr_f32_to_e2m1(x); }
static bool nan_bf16(uint32_t c) { return (c & 0x7FFF) > 0x7F80; }
static bool nan_f16(uint32_t c) { return (c & 0x7FFF) > 0x7C00; }
static bool nan_e4m3(uint32_t c) { return (c & 0x7F) == 0x7F; }
static bool nan_e5m2(uint32_t c) { return (c & 0x7F) > 0x7C; }
static bool nan_none(uint32_t c) { (void)c; return false; }
static bool neg16(uint32_t c) { return (c & 0x8000) != 0; }
static bool neg8(uint32_t c) { return (c & 0x80) != 0; }
static bool neg4(uint32_t c) { return (c & 0x8) != 0; }

static const encoder encoders[] = {
    {"bf16", 2, enc_bf16, nan_bf16, neg16}, {"f16", 2, enc_f16, nan_f16, neg16},
    {"e4m3", 1, enc_e4m3, nan_e4m3, neg8},  {"e5m2", 1, enc_e5m2, nan_e5m2, neg8},
    {"e2m1", 1, enc_e2m1, nan_none, neg4},
};

static void check_encoder(const encoder *e, const char *in_file, const char *out_file) {
    size_t n, m;
    float *x = load(in_file, 4, &n);
    void *want = load(out_file, (size_t)e->bytes, &m);
    assert_int_equal(n, m);
    size_t nan_cases = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t w = e->bytes == 2 ? ((uint16_t *)want)[i] : ((uint8_t *)want)[i];
        uint32_t g = e->enc(x[i]);
        if (e->is_nan(w)) { /* payload may differ from the oracle: NaN with the right sign */
            nan_cases++;
            if (!e->is_nan(g) || e->is_neg(g) != e->is_neg(w))
                fail_msg("%s(%08x) = %x, want a NaN like %x", e->name, fbits(x[i]), g, w);
        } else if (g != w) {
            fail_msg("%s(%08x = %.9g) = 0x%x, oracle 0x%x (%s #%zu)", e->name, fbits(x[i]), (double)x[i], g, w,
                     out_file, i);
        }
    }
    (void)nan_cases;
    free(x);
    free(want);
}

static void test_encode_edges(void **st) {
    (void)st;
    char in[64], out[64];
    for (size_t k = 0; k < sizeof encoders / sizeof encoders[0]; k++) {
        const bool e2 = !strcmp(encoders[k].name, "e2m1"); /* its edge set excludes NaN */
        snprintf(in, sizeof in, "%s", e2 ? "enc_edge_e2m1_in.f32" : "enc_edge_in.f32");
        snprintf(out, sizeof out, "enc_edge_%s.bin", encoders[k].name);
        check_encoder(&encoders[k], in, out);
    }
}

static void test_encode_random(void **st) {
    (void)st;
    char out[64];
    size_t n;
    free(load("enc_rand_in.f32", 4, &n));
    assert_true(n >= 100000);
    for (size_t k = 0; k < sizeof encoders / sizeof encoders[0]; k++) {
        snprintf(out, sizeof out, "enc_rand_%s.bin", encoders[k].name);
        check_encoder(&encoders[k], "enc_rand_in.f32", out);
    }
}

/* The spec's own E4M3 and E2M1 tables (shared/spec/formats.md). */
static void test_spec_tables(void **st) {
    (void)st;
    static const struct {
        float x;
        uint8_t b;
    } e4[] = {{448, 0x7E},   {449, 0x7E},           {464, 0x7E},   {464.01f, 0x7F}, {480, 0x7F},
              {INFINITY, 0x7F}, {-500, 0xFF},      {0x1p-10f, 0x00}, {0.0029296875f, 0x02}, {1.0625f, 0x38},
              {1.1875f, 0x3A}, {17, 0x58},         {248, 0x78}};
    for (size_t i = 0; i < sizeof e4 / sizeof e4[0]; i++) assert_int_equal(mr_f32_to_e4m3(e4[i].x), e4[i].b);
    assert_int_equal(mr_f32_to_e4m3(NAN), 0x7F);
    assert_int_equal(mr_f32_to_e4m3(-NAN), 0xFF);
    assert_true(isnan(mr_e4m3_to_f32(0x7F)) && isnan(mr_e4m3_to_f32(0xFF)));
    assert_true(mr_e4m3_to_f32(0x7E) == 448.0f && mr_e4m3_to_f32(0x08) == 0x1p-6f && mr_e4m3_to_f32(0x01) == 0x1p-9f);
    /* E5M2: max 57344, 61440 is a tie that overflows to inf */
    assert_int_equal(mr_f32_to_e5m2(57344), 0x7B);
    assert_int_equal(mr_f32_to_e5m2(61440), 0x7C);
    assert_int_equal(mr_f32_to_e5m2(-INFINITY), 0xFC);
    /* E2M1 thresholds */
    static const struct {
        float x;
        uint8_t c;
    } e2[] = {{0.25f, 0}, {0.2500001f, 1}, {0.75f, 2}, {0.7499999f, 1}, {1.25f, 2}, {1.2500001f, 3},
              {1.75f, 4}, {2.5f, 4},       {2.5000002f, 5}, {3.5f, 6}, {5.0f, 6}, {5.0000005f, 7},
              {1e30f, 7}, {INFINITY, 7},   {-0.1f, 8},    {-0.0f, 8},   {-INFINITY, 15}};
    for (size_t i = 0; i < sizeof e2 / sizeof e2[0]; i++) assert_int_equal(mr_f32_to_e2m1(e2[i].x), e2[i].c);
    /* bf16: any NaN -> 0x7FC0 */
    assert_int_equal(mr_f32_to_bf16(NAN), 0x7FC0);
    assert_int_equal(mr_f32_to_bf16(bitsf(0xFF800001u)), 0x7FC0);
    /* f16: 65520 is a tie above 65504 and overflows */
    assert_int_equal(mr_f32_to_f16(65504), 0x7BFF);
    assert_int_equal(mr_f32_to_f16(65520), 0x7C00);
}

/* Spec: e4m3 magnitude bits at f16 bit 7, sign at bit 15 = value * 2^-8,
 * subnormals included. Holds for every byte except the NaNs 0x7F/0xFF
 * (which land on a finite f16). */
static void test_e4m3_widening_trick(void **st) {
    (void)st;
    for (int b = 0; b < 256; b++) {
        if ((b & 0x7F) == 0x7F) continue;
        uint16_t h = (uint16_t)(((b & 0x80) << 8) | ((b & 0x7F) << 7));
        float v = mr_f16_to_f32(h) * 256.0f;
        assert_int_equal(fbits(v), fbits(mr_e4m3_to_f32((uint8_t)b)));
    }
}

/* ---------------------------------------------------------------- traits */
static void test_traits_table(void **st) {
    (void)st;
    for (int f = 0; f < MR_FMT_COUNT; f++) {
        const mr_format_traits *t = mr_format_traits_get((mr_format)f);
        assert_non_null(t);
        assert_int_equal(t->fmt, f);
        assert_non_null(t->name);
        assert_true(t->block_size >= 1 && t->bytes_per_block >= 1);
        mr_format back;
        assert_int_equal(mr_format_from_name(t->name, &back), MR_OK);
        assert_int_equal(back, f);
        bool composite = t->scale_cols > 0;
        assert_true(composite == (t->quantize_row_ref == NULL));
        assert_true(composite == (t->dequantize_row_ref == NULL));
    }
    assert_null(mr_format_traits_get(MR_FMT_COUNT));
    assert_null(mr_format_traits_get((mr_format)-1));
    const mr_format_traits *nv = mr_format_traits_get(MR_FMT_NVFP4);
    assert_int_equal(nv->block_size, 16);
    assert_int_equal(nv->bytes_per_block, 8);
    assert_string_equal(nv->st_dtype, "U8");
    const mr_format_traits *fb = mr_format_traits_get(MR_FMT_FP8_BLOCK);
    assert_int_equal(fb->scale_rows, 128);
    assert_int_equal(fb->scale_cols, 128);
    assert_string_equal(fb->st_dtype, "F8_E4M3");
    assert_string_equal(mr_format_traits_get(MR_FMT_E5M2)->st_dtype, "F8_E5M2");
    assert_string_equal(mr_format_traits_get(MR_FMT_BF16)->st_dtype, "BF16");

    static const struct {
        const char *s;
        mr_format f;
    } names[] = {{"fp8", MR_FMT_FP8_BLOCK}, {"FP8-Block", MR_FMT_FP8_BLOCK}, {"fp4", MR_FMT_NVFP4},
                 {"NVFP4", MR_FMT_NVFP4},   {"float32", MR_FMT_F32},          {"bfloat16", MR_FMT_BF16},
                 {"float16", MR_FMT_F16},   {"float8_e4m3fn", MR_FMT_E4M3},    {"F8_E5M2", MR_FMT_E5M2},
                 {"float4_e2m1fn", MR_FMT_E2M1}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        mr_format f;
        assert_int_equal(mr_format_from_name(names[i].s, &f), MR_OK);
        assert_int_equal(f, names[i].f);
    }
    mr_format f;
    assert_int_equal(mr_format_from_name("int3", &f), MR_EINVAL);
    assert_non_null(strstr(mr_error_last(), "int3"));
    assert_int_equal(mr_format_from_name("", &f), MR_EINVAL);
    assert_int_equal(mr_format_from_name(NULL, &f), MR_EINVAL);
}

/* Per element format: relative error bound for normal values (half an ulp,
 * 2^-(m+1)), absolute bound below the smallest normal (half the subnormal
 * step), the largest finite value, and the NaN/inf rules of the spec. */
typedef struct {
    mr_format fmt;
    float rel, abs_sub, max;
    bool inf_kept;  /* inf -> inf (else: e4m3 -> NaN, e2m1 -> ±6) */
    bool nan_kept;  /* NaN -> NaN (e2m1 has none: NaN -> ±6) */
} elem_props;

static const elem_props props[] = {
    {MR_FMT_F32, 0.0f, 0.0f, 3.4028235e38f, true, true},
    {MR_FMT_F16, 0x1p-11f, 0x1p-25f, 65504.0f, true, true},
    {MR_FMT_BF16, 0x1p-8f, 0x1p-134f, 3.38953139e38f, true, true},
    {MR_FMT_E4M3, 0x1p-4f, 0x1p-10f, 448.0f, false, true},
    {MR_FMT_E5M2, 0x1p-3f, 0x1p-17f, 57344.0f, true, true},
    {MR_FMT_E2M1, 0x1p-2f, 0.25f, 6.0f, false, false},
};

static size_t row_bytes(const mr_format_traits *t, int64_t n) {
    return (size_t)((n + t->block_size - 1) / t->block_size) * (size_t)t->bytes_per_block;
}

static void test_element_properties(void **st) {
    (void)st;
    enum { N = 4096 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float)), *z = malloc(N * sizeof(float));
    uint8_t *q = malloc(N * 4), *q2 = malloc(N * 4);
    tu_rng rng = {12345};
    for (size_t p = 0; p < sizeof props / sizeof props[0]; p++) {
        const elem_props *pr = &props[p];
        const mr_format_traits *t = mr_format_traits_get(pr->fmt);
        assert_non_null(t->quantize_row_ref);
        /* values spread over the whole range, log-uniform, both signs */
        for (int i = 0; i < N; i++) {
            float e = (tu_uniform(&rng) * 2.0f - 1.0f) * 40.0f;
            float v = exp2f(e) * pr->max * 0x1p-20f;
            if (pr->fmt == MR_FMT_F32 || pr->fmt == MR_FMT_BF16) v = exp2f(e * 3.0f);
            if (v > pr->max) v = pr->max * tu_uniform(&rng);
            x[i] = (tu_next(&rng) & 1) ? -v : v;
        }
        x[0] = 0.0f;
        x[1] = -0.0f;
        x[2] = pr->max;
        x[3] = -pr->max;
        t->quantize_row_ref(x, q, N);
        t->dequantize_row_ref(q, y, N);
        for (int i = 0; i < N; i++) {
            float err = fabsf(y[i] - x[i]);
            float bound = fmaxf(pr->rel * fabsf(x[i]), pr->abs_sub);
            if (!(err <= bound))
                fail_msg("%s: x=%g -> %g, error %g > bound %g", t->name, (double)x[i], (double)y[i], (double)err,
                         (double)bound);
            if (x[i] != 0.0f && y[i] != 0.0f) assert_int_equal(signbit(x[i]) != 0, signbit(y[i]) != 0);
        }
        assert_true(y[2] == pr->max && y[3] == -pr->max);
        assert_int_equal(fbits(y[1]), 0x80000000u); /* -0 keeps its sign */
        /* idempotence: quantize(dequantize(q)) == q, byte for byte */
        t->quantize_row_ref(y, q2, N);
        assert_memory_equal(q, q2, row_bytes(t, N));
        t->dequantize_row_ref(q2, z, N);
        assert_memory_equal(y, z, N * sizeof(float));
        /* NaN and inf */
        float sp[4] = {INFINITY, -INFINITY, NAN, -NAN};
        float out[4];
        t->quantize_row_ref(sp, q, 4);
        t->dequantize_row_ref(q, out, 4);
        for (int i = 0; i < 2; i++) {
            float s = i ? -1.0f : 1.0f;
            if (pr->inf_kept) assert_true(out[i] == s * INFINITY);
            else if (pr->fmt == MR_FMT_E4M3) assert_true(isnan(out[i]) && (signbit(out[i]) != 0) == (i == 1));
            else assert_true(out[i] == s * 6.0f);
        }
        for (int i = 2; i < 4; i++) {
            /* bf16 maps every NaN to 0x7FC0 (spec); the others keep the sign */
            bool want_neg = i == 3 && pr->fmt != MR_FMT_BF16;
            if (pr->nan_kept) assert_true(isnan(out[i]) && (signbit(out[i]) != 0) == want_neg);
            else assert_true(fabsf(out[i]) == 6.0f && (signbit(out[i]) != 0) == (i == 3));
        }
    }
    /* e2m1 packing: element 2i in the low nibble */
    float two[3] = {1.0f, -2.0f, 6.0f};
    const mr_format_traits *t = mr_format_traits_get(MR_FMT_E2M1);
    t->quantize_row_ref(two, q, 3);
    assert_int_equal(q[0], 0xC2);
    assert_int_equal(q[1], 0x07);
    free(x);
    free(y);
    free(z);
    free(q);
    free(q2);
}

/* ---------------------------------------------------------------- weights */
static void check_nvfp4(const char *name, int64_t n, int64_t k, float shared) {
    char f[96];
    size_t cnt;
    snprintf(f, sizeof f, "%s_w.f32", name);
    float *w = load(f, 4, &cnt);
    assert_int_equal(cnt, (size_t)(n * k));
    snprintf(f, sizeof f, "%s_q.u8", name);
    uint8_t *wq = load(f, 1, &cnt);
    assert_int_equal(cnt, (size_t)(n * k / 2));
    snprintf(f, sizeof f, "%s_sc.u8", name);
    uint8_t *wsc = load(f, 1, &cnt);
    assert_int_equal(cnt, (size_t)(n * k / 16));
    snprintf(f, sizeof f, "%s_s2.f32", name);
    float *ws2 = load(f, 4, &cnt);
    snprintf(f, sizeof f, "%s_deq.f32", name);
    float *deq = load(f, 4, &cnt);

    mr_qmatrix m;
    assert_int_equal(mr_qmatrix_quantize(&m, MR_FMT_NVFP4, w, n, k, shared), MR_OK);
    assert_int_equal(m.fmt, MR_FMT_NVFP4);
    assert_true(m.owned);
    assert_int_equal(fbits(m.scale2), fbits(ws2[0]));
    assert_memory_equal(m.scale, wsc, (size_t)(n * k / 16));
    assert_memory_equal(m.data, wq, (size_t)(n * k / 2));
    assert_int_equal(mr_qmatrix_bytes(&m), (size_t)(n * k / 2 + n * k / 16));
    float *row = malloc((size_t)k * sizeof(float));
    for (int64_t r = 0; r < n; r++) {
        mr_qmatrix_dequant_row(&m, r, row);
        for (int64_t c = 0; c < k; c++) assert_f32_same(row[c], deq[r * k + c], name, (size_t)(r * k + c));
    }
    /* property: every element within one block step d of the input */
    for (int64_t r = 0; r < n; r++) {
        mr_qmatrix_dequant_row(&m, r, row);
        for (int64_t c = 0; c < k; c++) {
            float d = mr_e4m3_to_f32(((uint8_t *)m.scale)[r * (k / 16) + c / 16]) * m.scale2;
            assert_true(fabsf(row[c] - w[r * k + c]) <= d);
        }
    }
    free(row);
    mr_qmatrix_free(&m);
    assert_null(m.data);
    free(w);
    free(wq);
    free(wsc);
    free(ws2);
    free(deq);
}

/* The KV cache's saturating FP8 conversions against a brute-force oracle: the
 * finite code nearest to x (ties to the even code, i.e. the even mantissa),
 * which beyond the largest finite value is that value; NaN gives NaN. Inputs:
 * every midpoint between neighbouring codes and a hair either side, the
 * codes themselves, far beyond the range, infinities, and log-uniform values. */
static void test_kv_fp8_saturating(void **st) {
    (void)st;
    for (int fp = 0; fp < 2; fp++) {
        float (*dec)(uint8_t) = fp ? mr_e5m2_to_f32 : mr_e4m3_to_f32;
        uint8_t (*enc)(float) = fp ? mr_f32_to_e5m2_sat : mr_f32_to_e4m3_sat;
        float xs[2048];
        int n = 0;
        for (int c = 0; c < 127; c++) { /* positive codes in order of value; their negatives below */
            const float a = dec((uint8_t)c), b = dec((uint8_t)(c + 1));
            if (!isfinite(a) || !isfinite(b)) continue;
            const float mid = (a + b) / 2.0f; /* exact: both have few mantissa bits */
            xs[n++] = a, xs[n++] = mid, xs[n++] = nextafterf(mid, 0.0f), xs[n++] = nextafterf(mid, INFINITY);
        }
        const float far[] = {1e30f, INFINITY, 465.0f, 449.0f, 57345.0f, 61440.0f, 1e-30f, 0.0f};
        for (size_t i = 0; i < sizeof far / sizeof far[0]; i++) xs[n++] = far[i];
        tu_rng r = {77 + (uint64_t)fp};
        while (n < 1024) xs[n++] = exp2f((tu_uniform(&r) * 2.0f - 1.0f) * 24.0f);
        for (int i = 0, m = n; i < m; i++) xs[n++] = -xs[i];
        for (int i = 0; i < n; i++) {
            const float x = xs[i];
            int best = -1;
            double bd = INFINITY;
            for (int c = 0; c < 256; c++) {
                const float v = dec((uint8_t)c);
                if (!isfinite(v) || ((c & 0x80) != 0) != (signbit(x) != 0)) continue; /* x's sign: never farther */
                /* exact in double below 2^40; beyond it every code is below |x|, the largest nearest */
                const double d = fabsf(x) < 0x1p40f ? fabs((double)v - (double)x) : -fabs((double)v);
                if (d < bd || (d == bd && (c & 1) == 0)) bd = d, best = c;
            }
            const float got = dec(enc(x)), want = dec((uint8_t)best);
            if (!(got == want && signbit(got) == signbit(want)))
                fail_msg("%s_sat(%.9g) decodes to %.9g, the nearest finite code (ties even) is %.9g",
                         fp ? "e5m2" : "e4m3", x, got, want);
        }
        assert_true(isnan(dec(enc(NAN))) && isnan(dec(enc(-NAN))));
        assert_true(dec(enc(-INFINITY)) == (fp ? -57344.0f : -448.0f));
    }
    assert_int_equal(mr_kv_elem_bytes(MR_FMT_E4M3), 1);
    assert_int_equal(mr_kv_elem_bytes(MR_FMT_BF16), 2);
    assert_int_equal(mr_kv_elem_bytes(MR_FMT_F32), 4);
    assert_int_equal(mr_kv_elem_bytes(MR_FMT_NVFP4), 0);
    assert_string_equal(mr_kv_dtype_name(MR_FMT_E5M2), "fp8_e5m2");
    assert_null(mr_kv_dtype_name(MR_FMT_F16));
}

static void test_nvfp4_golden(void **st) {
    (void)st;
    size_t cnt;
    float *w = load("nvfp4_c_shared_w.f32", 4, &cnt);
    float amax = 0.0f;
    for (size_t i = 0; i < cnt; i++) amax = fmaxf(amax, fabsf(w[i]));
    free(w);
    check_nvfp4("nvfp4_a", 64, 128, 0.0f);
    check_nvfp4("nvfp4_b", 96, 256, 0.0f);
    /* the generator used shared_amax = 2.5 * amax, rounded to fp32 */
    check_nvfp4("nvfp4_c_shared", 32, 64, (float)(amax * 2.5));
}

static void check_fp8_block(const char *name, int64_t n, int64_t k) {
    char f[96];
    size_t cnt;
    const int64_t nbr = (n + 127) / 128, nbc = (k + 127) / 128;
    snprintf(f, sizeof f, "%s_w.f32", name);
    float *w = load(f, 4, &cnt);
    assert_int_equal(cnt, (size_t)(n * k));
    snprintf(f, sizeof f, "%s_q.u8", name);
    uint8_t *wq = load(f, 1, &cnt);
    snprintf(f, sizeof f, "%s_s.f32", name);
    float *ws = load(f, 4, &cnt);
    assert_int_equal(cnt, (size_t)(nbr * nbc));

    mr_qmatrix m;
    assert_int_equal(mr_qmatrix_quantize(&m, MR_FMT_FP8_BLOCK, w, n, k, 0.0f), MR_OK);
    assert_memory_equal(m.data, wq, (size_t)(n * k));
    assert_memory_equal(m.scale, ws, (size_t)(nbr * nbc) * sizeof(float));
    assert_int_equal(mr_qmatrix_bytes(&m), (size_t)(n * k) + (size_t)(nbr * nbc) * 4);
    float *row = malloc((size_t)k * sizeof(float));
    for (int64_t r = 0; r < n; r++) {
        mr_qmatrix_dequant_row(&m, r, row);
        for (int64_t c = 0; c < k; c++) {
            float s = ws[(r / 128) * nbc + c / 128];
            /* exact product of the stored values, then one rounding */
            assert_int_equal(fbits(row[c]), fbits(mr_e4m3_to_f32(wq[r * k + c]) * s));
            /* within half an e4m3 ulp (2^-4 relative) or half a subnormal step */
            assert_true(fabsf(row[c] - w[r * k + c]) <= fmaxf(0x1p-4f * fabsf(w[r * k + c]), s * 0x1p-10f));
        }
    }
    free(row);
    mr_qmatrix_free(&m);
    free(w);
    free(wq);
    free(ws);
}

static void test_fp8_block_golden(void **st) {
    (void)st;
    check_fp8_block("fp8b_a", 256, 384);
    check_fp8_block("fp8b_b", 200, 300); /* partial edge blocks */
}

static void test_qmatrix_plain_and_errors(void **st) {
    (void)st;
    float w[4 * 32];
    tu_rng rng = {7};
    for (int i = 0; i < 4 * 32; i++) w[i] = tu_normal(&rng);
    mr_qmatrix m;
    assert_int_equal(mr_qmatrix_quantize(&m, MR_FMT_F32, w, 4, 32, 0.0f), MR_OK);
    float row[32];
    mr_qmatrix_dequant_row(&m, 2, row);
    assert_memory_equal(row, w + 64, sizeof row);
    assert_int_equal(mr_qmatrix_bytes(&m), 4 * 32 * 4);
    assert_true(m.scale == NULL && m.scale2 == 1.0f);
    mr_qmatrix_free(&m);
    assert_int_equal(mr_qmatrix_quantize(&m, MR_FMT_BF16, w, 4, 32, 0.0f), MR_OK);
    mr_qmatrix_dequant_row(&m, 3, row);
    for (int i = 0; i < 32; i++) assert_int_equal(fbits(row[i]), (uint32_t)mr_f32_to_bf16(w[96 + i]) << 16);
    assert_int_equal(mr_qmatrix_bytes(&m), 4 * 32 * 2);
    mr_qmatrix_free(&m);
    mr_qmatrix_free(&m); /* safe twice / on zeroed */

    assert_int_equal(mr_qmatrix_quantize(&m, MR_FMT_NVFP4, w, 4, 24, 0.0f), MR_EINVAL);
    assert_non_null(strstr(mr_error_last(), "multiple of 16"));
    assert_int_equal(mr_qmatrix_quantize(&m, MR_FMT_E4M3, w, 4, 32, 0.0f), MR_EUNSUPPORTED);
    assert_int_equal(mr_qmatrix_quantize(&m, MR_FMT_COUNT, w, 4, 32, 0.0f), MR_EUNSUPPORTED);
    assert_int_equal(mr_qmatrix_quantize(&m, MR_FMT_FP8_BLOCK, w, 0, 32, 0.0f), MR_EINVAL);
    assert_int_equal(mr_qmatrix_quantize(&m, MR_FMT_NVFP4, w, 4, 32, INFINITY), MR_EINVAL);
    assert_int_equal(mr_qmatrix_quantize(&m, MR_FMT_NVFP4, w, 4, 32, -1.0f), MR_EINVAL);
    assert_int_equal(mr_qmatrix_quantize(&m, MR_FMT_F32, w, INT64_MAX / 2, 32, 0.0f), MR_EOVERFLOW);
    assert_null(m.data);
    w[37] = NAN;
    assert_int_equal(mr_qmatrix_quantize(&m, MR_FMT_FP8_BLOCK, w, 4, 32, 0.0f), MR_EINPUT);
    assert_non_null(strstr(mr_error_last(), "[1, 5]"));
    w[37] = -INFINITY;
    assert_int_equal(mr_qmatrix_quantize(&m, MR_FMT_NVFP4, w, 4, 32, 0.0f), MR_EINPUT);
    assert_null(m.data);

    /* all-zero tensor: ModelOpt leaves it undefined (0/0); ours is scale2 0, scales 1.0, codes ±0 */
    float z[2 * 32] = {0};
    z[5] = -0.0f;
    assert_int_equal(mr_qmatrix_quantize(&m, MR_FMT_NVFP4, z, 2, 32, 0.0f), MR_OK);
    assert_true(m.scale2 == 0.0f);
    for (int i = 0; i < 4; i++) assert_int_equal(((uint8_t *)m.scale)[i], 0x38);
    mr_qmatrix_dequant_row(&m, 0, row);
    for (int i = 0; i < 32; i++) assert_true(row[i] == 0.0f);
    mr_qmatrix_free(&m);
    assert_int_equal(mr_qmatrix_quantize(&m, MR_FMT_FP8_BLOCK, z, 2, 32, 0.0f), MR_OK);
    assert_true(((float *)m.scale)[0] == 1.0f);
    mr_qmatrix_free(&m);
}

static void test_qmatrix_fault_injection(void **st) {
    (void)st;
    static const mr_format fmts[] = {MR_FMT_F32, MR_FMT_BF16, MR_FMT_FP8_BLOCK, MR_FMT_NVFP4};
    float w[130 * 48];
    tu_rng rng = {99};
    for (int i = 0; i < 130 * 48; i++) w[i] = tu_normal(&rng);
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
        int failures = 0;
        for (long k = 0;; k++) {
            mr_qmatrix m;
            mr_debug_alloc_fail_after(k);
            mr_status s = mr_qmatrix_quantize(&m, fmts[f], w, 130, 48, 0.0f);
            mr_debug_alloc_fail_after(-1);
            if (s == MR_OK) {
                mr_qmatrix_free(&m);
                break;
            }
            assert_int_equal(s, MR_ENOMEM);
            assert_null(m.data);
            assert_null(m.scale);
            failures++;
            assert_true(k < 10);
        }
        assert_true(failures >= 1); /* at least one allocation was made and failed cleanly */
    }
}

/* ---------------------------------------------------------------- activations */
static void test_act_fp8_golden(void **st) {
    (void)st;
    size_t n, m, g;
    float *x = load("act_fp8_x.f32", 4, &n);
    uint8_t *wq = load("act_fp8_q.u8", 1, &m);
    float *ws = load("act_fp8_s.f32", 4, &g);
    assert_int_equal(n, 4 * 300);
    assert_int_equal(g, 4 * 3);
    uint8_t q[300];
    float s[3];
    for (int r = 0; r < 4; r++) {
        mr_fp8_act_quantize_row_ref(x + r * 300, 300, q, s);
        assert_memory_equal(q, wq + r * 300, 300);
        for (int j = 0; j < 3; j++) assert_int_equal(fbits(s[j]), fbits(ws[r * 3 + j]));
    }
    free(x);
    free(wq);
    free(ws);
}

static void test_act_nvfp4_golden(void **st) {
    (void)st;
    size_t n, c;
    float *x = load("act_nvfp4_x.f32", 4, &n);
    float *is = load("act_nvfp4_is.f32", 4, &c);
    uint8_t *wq = load("act_nvfp4_q.u8", 1, &c);
    uint8_t *wsc = load("act_nvfp4_sc.u8", 1, &c);
    float *deq = load("act_nvfp4_deq.f32", 4, &c);
    assert_int_equal(n, 4 * 256);
    uint8_t q[128], sc[16];
    float y[256];
    for (int r = 0; r < 4; r++) {
        mr_nvfp4_act_quantize_row_ref(x + r * 256, 256, is[0], q, sc);
        assert_memory_equal(sc, wsc + r * 16, 16);
        assert_memory_equal(q, wq + r * 128, 128);
        mr_nvfp4_act_dequant_row_ref(q, sc, 256, is[0], y);
        for (int i = 0; i < 256; i++) assert_f32_same(y[i], deq[r * 256 + i], "nvfp4 act dequant", (size_t)i);
    }
    /* input_scale 0 (uncalibrated): no division by zero, codes ±0 */
    mr_nvfp4_act_quantize_row_ref(x, 16, 0.0f, q, sc);
    assert_int_equal(sc[0], 0);
    for (int i = 0; i < 8; i++) assert_int_equal(q[i] & 0x77, 0);
    free(x);
    free(is);
    free(wq);
    free(wsc);
    free(deq);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_all_codes),
        cmocka_unit_test(test_encode_edges),
        cmocka_unit_test(test_encode_random),
        cmocka_unit_test(test_spec_tables),
        cmocka_unit_test(test_e4m3_widening_trick),
        cmocka_unit_test(test_traits_table),
        cmocka_unit_test(test_element_properties),
        cmocka_unit_test(test_kv_fp8_saturating),
        cmocka_unit_test(test_nvfp4_golden),
        cmocka_unit_test(test_fp8_block_golden),
        cmocka_unit_test(test_qmatrix_plain_and_errors),
        cmocka_unit_test(test_qmatrix_fault_injection),
        cmocka_unit_test(test_act_fp8_golden),
        cmocka_unit_test(test_act_nvfp4_golden),
    };
    return cmocka_run_group_tests_name("formats", tests, NULL, NULL);
}
