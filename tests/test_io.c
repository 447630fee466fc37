/* test_io.c — io/: the safetensors reader (one crafted bad file per
 * validation rule, and the order of the rules), the writer (byte-exact round
 * trip, and byte-identical to the reference Python writer), sharded
 * checkpoints, atomic writes, allocation fault injection, and the golden
 * checkpoint written by tools/golden/gen_io.py with the Python safetensors
 * package (the oracle for names, dtypes, shapes, sizes and data sha256). */
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moerun/io.h"
#include "testutil.h"

/* ---------------------------------------------------------------- helpers */

/* SHA-256 (FIPS 180-4), to compare tensor data with the golden digests. */
typedef struct {
    uint32_t h[8];
    uint64_t len;
    uint8_t buf[64];
    size_t nbuf;
} sha256_ctx;

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01,
    0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc,
    0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
    0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08,
    0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
    0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha256_block(sha256_ctx *c, const uint8_t *p) {
    uint32_t w[64], a[8];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    memcpy(a, c->h, sizeof a);
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = a[7] + (ror(a[4], 6) ^ ror(a[4], 11) ^ ror(a[4], 25)) + ((a[4] & a[5]) ^ (~a[4] & a[6])) + K256[i] + w[i];
        uint32_t t2 = (ror(a[0], 2) ^ ror(a[0], 13) ^ ror(a[0], 22)) + ((a[0] & a[1]) ^ (a[0] & a[2]) ^ (a[1] & a[2]));
        memmove(a + 1, a, 7 * sizeof a[0]);
        a[4] += t1;
        a[0] = t1 + t2;
    }
    for (int i = 0; i < 8; i++) c->h[i] += a[i];
}

static void sha256_hex(const void *data, size_t n, char out[65]) {
    sha256_ctx c = {{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19}, 0, {0}, 0};
    const uint8_t *p = data;
    c.len = n;
    for (; n >= 64; n -= 64, p += 64) sha256_block(&c, p);
    uint8_t tail[128] = {0};
    memcpy(tail, p, n);
    tail[n] = 0x80;
    size_t tl = n + 9 <= 64 ? 64 : 128;
    uint64_t bits = c.len * 8;
    for (int i = 0; i < 8; i++) tail[tl - 1 - i] = (uint8_t)(bits >> (8 * i));
    sha256_block(&c, tail);
    if (tl == 128) sha256_block(&c, tail + 64);
    for (int i = 0; i < 8; i++) snprintf(out + 8 * i, 9, "%08x", c.h[i]);
}

/* A file image: u64 N, header padded with spaces to a multiple of 8, then
 * `dlen` data bytes (0, 1, 2, ...). Caller frees. */
static uint8_t *mkfile(const char *hdr, size_t dlen, size_t *len) {
    size_t hl = strlen(hdr), n = (hl + 7) & ~(size_t)7;
    uint8_t *b = malloc(8 + n + dlen + 1);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(b + 8, hdr, hl);
    memset(b + 8 + hl, ' ', n - hl);
    for (size_t i = 0; i < dlen; i++) b[8 + n + i] = (uint8_t)i;
    *len = 8 + n + dlen;
    return b;
}

static size_t count_entries(const char *dir) {
    DIR *d = opendir(dir);
    size_t n = 0;
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static char *path_in(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

#define assert_contains(hay, needle)                                                               \
    do {                                                                                           \
        if (strstr((hay), (needle)) == NULL) fail_msg("'%s' does not contain '%s'", (hay), (needle)); \
    } while (0)

/* ---------------------------------------------------------------- dtypes */

static void test_dtype_table(void **st) {
    (void)st;
    /* the order the reference implementation lists (and sorts by) */
    static const char *order[] = {"BOOL",    "F4",          "F6_E2M3",     "F6_E3M2", "U8",  "I8",  "F8_E5M2", "F8_E4M3",
                                  "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16",     "U16", "F16", "BF16",    "I32",
                                  "U32",     "F32",         "C64",         "F64",     "I64", "U64"};
    static const int bits[] = {8, 4, 6, 6, 8, 8, 8, 8, 8, 8, 8, 16, 16, 16, 16, 32, 32, 32, 64, 64, 64, 64};
    assert_int_equal(sizeof order / sizeof order[0], MR_ST_DTYPE_COUNT);
    for (int i = 0; i < MR_ST_DTYPE_COUNT; i++) {
        assert_string_equal(mr_st_dtype_name((mr_st_dtype)i), order[i]);
        assert_int_equal(mr_st_dtype_bits((mr_st_dtype)i), bits[i]);
        mr_st_dtype d;
        assert_int_equal(mr_st_dtype_from_name(order[i], &d), MR_OK);
        assert_int_equal(d, i);
    }
    mr_st_dtype d;
    assert_int_equal(mr_st_dtype_from_name("bf16", &d), MR_ENOTFOUND);
    assert_null(mr_st_dtype_name(MR_ST_DTYPE_COUNT));
    mr_format f;
    assert_true(mr_st_dtype_to_format(MR_ST_BF16, &f) && f == MR_FMT_BF16);
    assert_true(mr_st_dtype_to_format(MR_ST_F8_E4M3, &f) && f == MR_FMT_E4M3);
    assert_true(mr_st_dtype_to_format(MR_ST_F8_E5M2, &f) && f == MR_FMT_E5M2);
    assert_true(mr_st_dtype_to_format(MR_ST_F32, &f) && f == MR_FMT_F32);
    assert_true(mr_st_dtype_to_format(MR_ST_F16, &f) && f == MR_FMT_F16);
    assert_true(mr_st_dtype_to_format(MR_ST_F4, &f) && f == MR_FMT_E2M1);
    assert_false(mr_st_dtype_to_format(MR_ST_F8_E4M3FNUZ, &f));
    assert_false(mr_st_dtype_to_format(MR_ST_U8, &f));
}

/* ---------------------------------------------------------------- bad files */

typedef struct {
    const char *id;
    const char *hdr; /* header JSON (padded by mkfile) */
    size_t dlen;     /* data bytes after the header */
    mr_status st;
    const char *rule;   /* substring the message must hold */
    const char *tensor; /* tensor the message must name, or NULL */
} bad_case;

#define T1(name, dt, shape, b, e) "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static const bad_case bad_cases[] = {
    /* rule 4: UTF-8 / JSON / types */
    {"not_json", "{\"a\":", 0, MR_EFORMAT, "not valid JSON", NULL},
    {"not_object", "[1,2,3]", 0, MR_EFORMAT, "must be a JSON object", NULL},
    {"string_root", "\"abc\"", 0, MR_EFORMAT, "not valid JSON", NULL},
    {"trailing_garbage", "{} x", 0, MR_EFORMAT, "not valid JSON", NULL},
    {"meta_not_object", "{\"__metadata__\":[1]}", 0, MR_EFORMAT, "\"__metadata__\" must be an object", NULL},
    {"meta_non_string", "{\"__metadata__\":{\"format\":\"pt\",\"n\":1}}", 0, MR_EFORMAT, "value of 'n' must be a string",
     NULL},
    {"entry_not_object", "{\"w\":[1]}", 0, MR_EFORMAT, "must be an object", "w"},
    {"missing_dtype", "{\"w\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, MR_EFORMAT, "missing \"dtype\"", "w"},
    {"dtype_not_string", "{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,1]}}", 1, MR_EFORMAT,
     "\"dtype\" must be a string", "w"},
    {"unknown_dtype", "{" T1("w", "F12", "[1]", 0, 1) "}", 1, MR_EFORMAT, "unknown dtype", "w"},
    {"fnuz_e4m3", "{" T1("w", "F8_E4M3FNUZ", "[1]", 0, 1) "}", 1, MR_EUNSUPPORTED, "FNUZ", "w"},
    {"fnuz_e5m2", "{" T1("w", "F8_E5M2FNUZ", "[1]", 0, 1) "}", 1, MR_EUNSUPPORTED, "unsupported dtype", "w"},
    {"missing_shape", "{\"w\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, MR_EFORMAT, "missing \"shape\"", "w"},
    {"shape_not_array", "{" T1("w", "U8", "1", 0, 1) "}", 1, MR_EFORMAT, "\"shape\" must be an array", "w"},
    {"shape_negative", "{" T1("w", "U8", "[-1]", 0, 1) "}", 1, MR_EFORMAT, "\"shape\"[0] is negative", "w"},
    {"shape_float", "{" T1("w", "U8", "[1.0]", 0, 1) "}", 1, MR_EFORMAT, "\"shape\"[0] must be a non-negative integer",
     "w"},
    {"shape_huge_int", "{" T1("w", "U8", "[9223372036854775808]", 0, 1) "}", 1, MR_EUNSUPPORTED, "2^63-1", NULL},
    {"offsets_three", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1, MR_EFORMAT,
     "\"data_offsets\" must have 2 elements", "w"},
    {"offsets_missing", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, MR_EFORMAT, "missing \"data_offsets\"", "w"},
    {"offsets_negative", "{" T1("w", "U8", "[1]", -1, 0) "}", 1, MR_EFORMAT, "\"data_offsets\"[0] is negative", "w"},
    {"first_bad_key_named", "{" T1("a", "U8", "[1]", 0, 1) ",\"b\":{\"dtype\":\"X\"},\"c\":{\"dtype\":1}}", 1, MR_EFORMAT,
     "unknown dtype", "b"},
    /* rule 5: offsets */
    {"first_not_zero", "{" T1("w", "U8", "[1]", 1, 2) "}", 2, MR_EFORMAT, "must begin at 0", "w"},
    {"gap", "{" T1("a", "U8", "[1]", 0, 1) "," T1("b", "U8", "[1]", 2, 3) "}", 3, MR_EFORMAT, "gap", "b"},
    {"overlap", "{" T1("a", "U8", "[2]", 0, 2) "," T1("b", "U8", "[2]", 1, 3) "}", 3, MR_EFORMAT, "overlap", "b"},
    {"end_before_begin", "{" T1("a", "U8", "[0]", 0, 0) "," T1("b", "U8", "[0]", 0, 0) "," T1("c", "U8", "[0]", 2, 1) "}",
     0, MR_EFORMAT, "invalid offsets", "c"},
    {"end_lt_begin_at_start", "{" T1("a", "U8", "[0]", 0, 0) "," T1("b", "U8", "[1]", 0, 1) "," T1("z", "U8", "[0]", 1, 0)
     "}", 1, MR_EFORMAT, "end < begin", "z"},
    /* rule 6: sizes */
    {"count_overflow", "{" T1("w", "F32", "[1099511627776,1099511627776]", 0, 4) "}", 4, MR_EFORMAT, "size overflow", "w"},
    {"bits_overflow", "{" T1("w", "F32", "[2305843009213693952]", 0, 4) "}", 4, MR_EFORMAT, "size overflow", "w"},
    {"f4_half_byte", "{" T1("w", "F4", "[3]", 0, 2) "}", 2, MR_EFORMAT, "not a whole number of bytes", "w"},
    {"f6_half_byte", "{" T1("w", "F6_E3M2", "[3]", 0, 3) "}", 3, MR_EFORMAT, "not a whole number of bytes", "w"},
    {"size_mismatch", "{" T1("w", "BF16", "[2,3]", 0, 10) "}", 10, MR_EFORMAT, "size mismatch", "w"},
    {"size_mismatch_scalar", "{" T1("w", "F32", "[]", 0, 8) "}", 8, MR_EFORMAT, "needs 4 bytes", "w"},
    /* rule 7: file size */
    {"truncated", "{" T1("w", "F32", "[4]", 0, 16) "}", 12, MR_EFORMAT, "truncated", NULL},
    {"offsets_beyond_file", "{" T1("w", "U8", "[4096]", 0, 4096) "}", 0, MR_EFORMAT, "file size mismatch", NULL},
    {"trailing_bytes", "{" T1("w", "F32", "[4]", 0, 16) "}", 17, MR_EFORMAT, "trailing bytes", NULL},
    {"empty_header_with_data", "{}", 1, MR_EFORMAT, "1 trailing bytes", NULL},
    /* rule 8: duplicates */
    {"duplicate", "{" T1("w", "U8", "[1]", 0, 1) "," T1("w", "U8", "[1]", 0, 1) "}", 1, MR_EFORMAT, "duplicate tensor name",
     NULL},
    /* order of the rules: the earliest rule is reported */
    {"order_4_before_5", "{" T1("a", "U8", "[1]", 5, 6) ",\"b\":{\"dtype\":\"Q\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
     MR_EFORMAT, "unknown dtype", "b"},
    {"order_5_before_6", "{" T1("a", "U8", "[2]", 0, 1) "," T1("b", "U8", "[1]", 2, 3) "}", 1, MR_EFORMAT,
     "invalid offsets", "b"},
    {"order_5_before_7", "{" T1("a", "U8", "[1]", 1, 2) "}", 9, MR_EFORMAT, "invalid offsets", "a"},
    {"order_6_before_7", "{" T1("a", "U8", "[2]", 0, 1) "}", 5, MR_EFORMAT, "size mismatch", "a"},
};

static void check_bad(const char *id, mr_status got, mr_status want, const char *file, const char *rule,
                      const char *tensor) {
    const char *msg = mr_error_last();
    if (got != want) fail_msg("%s: status %s, want %s (%s)", id, mr_status_name(got), mr_status_name(want), msg);
    assert_contains(msg, file);
    assert_contains(msg, rule);
    if (tensor) {
        char q[64];
        snprintf(q, sizeof q, "tensor '%s'", tensor);
        assert_contains(msg, q);
    }
}

static void test_bad_files(void **st) {
    (void)st;
    char *dir = tu_tmpdir("io_bad");
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case *c = &bad_cases[i];
        size_t len;
        uint8_t *b = mkfile(c->hdr, c->dlen, &len);
        /* from memory */
        mr_st_file *f = (mr_st_file *)1;
        check_bad(c->id, mr_st_parse(b, len, c->id, &f), c->st, c->id, c->rule, c->tensor);
        assert_null(f);
        /* from a file: the message names the path */
        char *p = path_in(dir, c->id);
        assert_int_equal(tu_write_file(p, b, len), 0);
        f = (mr_st_file *)1;
        check_bad(c->id, mr_st_open(p, &f), c->st, p, c->rule, c->tensor);
        assert_null(f);
        free(p);
        free(b);
    }
    tu_rmtree(dir);
    free(dir);
}

/* Rules 1-3 and UTF-8 need raw bytes. */
static void test_bad_prefix(void **st) {
    (void)st;
    mr_st_file *f = NULL;
    uint8_t b[64] = {0};
    check_bad("empty", mr_st_parse(NULL, 0, "empty.st", &f), MR_EFORMAT, "empty.st", "header too small", NULL);
    check_bad("five", mr_st_parse(b, 5, "five.st", &f), MR_EFORMAT, "five.st", "header too small", NULL);
    check_bad("seven", mr_st_parse(b, 7, "x", &f), MR_EFORMAT, "x", "header too small", NULL);
    /* N = 100,000,001 */
    uint64_t n = 100000001;
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(n >> (8 * i));
    check_bad("large", mr_st_parse(b, 16, "big.st", &f), MR_EFORMAT, "big.st", "header too large", NULL);
    /* N = 2^64-1: rule 2 comes before rule 3 (8 + N would overflow) */
    memset(b, 0xff, 8);
    check_bad("max", mr_st_parse(b, 16, "max.st", &f), MR_EFORMAT, "max.st", "header too large", NULL);
    /* N = 100,000,000 is allowed by rule 2 but runs past the end */
    n = 100000000;
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(n >> (8 * i));
    check_bad("limit", mr_st_parse(b, 16, "lim.st", &f), MR_EFORMAT, "lim.st", "invalid header length", NULL);
    /* N = 64 with 8 bytes after the prefix */
    memset(b, 0, sizeof b);
    b[0] = 64;
    memcpy(b + 8, "{}      ", 8);
    check_bad("short", mr_st_parse(b, 16, "s.st", &f), MR_EFORMAT, "s.st", "invalid header length", NULL);
    /* N = 0: empty header is not JSON */
    b[0] = 0;
    check_bad("zero", mr_st_parse(b, 8, "z.st", &f), MR_EFORMAT, "z.st", "not valid JSON", NULL);
    /* non-UTF-8 bytes: in a name, a lone continuation byte, an overlong, a surrogate */
    static const char *bad_utf8[] = {"{\"a\xff\":1}    ", "{\"a\x80\":1}    ", "{\"\xc0\xaf\":1}   ",
                                     "{\"\xed\xa0\x80\":1}  "};
    for (size_t i = 0; i < 4; i++) {
        size_t hl = strlen(bad_utf8[i]);
        memset(b, 0, 8);
        b[0] = (uint8_t)hl;
        memcpy(b + 8, bad_utf8[i], hl);
        check_bad("utf8", mr_st_parse(b, 8 + hl, "u.st", &f), MR_EFORMAT, "u.st", "not valid UTF-8", NULL);
    }
    /* a folder, and a missing file */
    char *dir = tu_tmpdir("io_prefix");
    assert_int_equal(mr_st_open(dir, &f), MR_EIO);
    assert_contains(mr_error_last(), "not a regular file");
    char *p = path_in(dir, "missing.safetensors");
    assert_int_equal(mr_st_open(p, &f), MR_ENOTFOUND);
    assert_contains(mr_error_last(), p);
    /* a 0-byte file on disk (cannot be mapped) */
    assert_int_equal(tu_write_file(p, "", 0), 0);
    check_bad("file0", mr_st_open(p, &f), MR_EFORMAT, p, "header too small", NULL);
    free(p);
    tu_rmtree(dir);
    free(dir);
}

/* Accept what the reference reader accepts and reject what it rejects, on
 * every seed file of the fuzz corpus (verdicts recorded by gen_io.py from the
 * Python safetensors package), except moerun's deliberate, stricter choices. */
static void test_reference_verdicts(void **st) {
    (void)st;
    static const char *stricter[] = {
        "bad_dtype",    /* FNUZ dtypes are refused (spec: not interchangeable with F8_E4M3) */
        "bad_dup",      /* duplicate names are refused (the Rust reader keeps the last one) */
        "bad_huge_dim", /* integers above 2^63-1 are refused (jansson parses int64) */
    };
    json_error_t err;
    json_t *g = json_load_file(tu_data("io/corpus_verdicts.json"), 0, &err);
    if (g == NULL) fail_msg("cannot read io/corpus_verdicts.json: %s", err.text);
    const char *name;
    json_t *v;
    int n = 0;
    json_object_foreach(json_object_get(g, "verdicts"), name, v) {
        char rel[512];
        snprintf(rel, sizeof rel, "../fuzz/corpus/safetensors/%s", name);
        mr_st_file *f = NULL;
        mr_status s = mr_st_open(tu_data(rel), &f);
        bool want_ok = json_is_true(json_object_get(v, "ok"));
        for (size_t i = 0; i < sizeof stricter / sizeof stricter[0]; i++) {
            if (strcmp(name, stricter[i]) == 0) {
                assert_true(want_ok); /* still true of the reference? */
                want_ok = false;
            }
        }
        if ((s == MR_OK) != want_ok)
            fail_msg("%s: reference %s, moerun %s (%s)", name, want_ok ? "accepts" : "rejects", mr_status_name(s),
                     mr_error_last());
        if (s == MR_OK) {
            assert_int_equal(mr_st_count(f), json_integer_value(json_object_get(v, "tensors")));
            mr_st_close(f);
        }
        n++;
    }
    assert_true(n >= 20);
    json_decref(g);
}

/* ---------------------------------------------------------------- valid edge cases */

static void test_valid_edges(void **st) {
    (void)st;
    size_t len;
    mr_st_file *f;
    /* what the reference reader accepts: leading/trailing whitespace, unknown
     * keys inside an entry, null metadata, scalars, zero dims, F4/F6 sizes */
    uint8_t *b = mkfile("\n {\"__metadata__\":null,"
                        "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[3,7],\"extra\":{\"x\":1}},"
                        "\"e\":{\"dtype\":\"BF16\",\"shape\":[4,0,2],\"data_offsets\":[3,3]},"
                        "\"f4\":{\"dtype\":\"F4\",\"shape\":[2,3],\"data_offsets\":[0,3]},"
                        "\"f6\":{\"dtype\":\"F6_E2M3\",\"shape\":[4],\"data_offsets\":[7,10]}}\t\r\n",
                        10, &len);
    assert_int_equal(mr_st_parse(b, len, "edges", &f), MR_OK);
    assert_int_equal(mr_st_count(f), 4);
    assert_int_equal(mr_st_metadata_count(f), 0);
    assert_null(mr_st_metadata(f, "format"));
    /* name order */
    assert_string_equal(mr_st_tensor_at(f, 0)->name, "e");
    assert_string_equal(mr_st_tensor_at(f, 1)->name, "f4");
    assert_string_equal(mr_st_tensor_at(f, 2)->name, "f6");
    assert_string_equal(mr_st_tensor_at(f, 3)->name, "s");
    assert_null(mr_st_tensor_at(f, 4));
    const mr_st_tensor *s = mr_st_find(f, "s");
    assert_non_null(s);
    assert_int_equal(s->ndim, 0);
    assert_int_equal(s->n_elements, 1);
    assert_int_equal(s->n_bytes, 4);
    uint64_t hdr = mr_st_header_size(f);
    assert_int_equal(s->offset, 8 + hdr + 3);
    /* the data pointer is unaligned here: read it with memcpy */
    uint8_t v[4];
    memcpy(v, s->data, 4);
    assert_int_equal(v[0], 3);
    assert_int_equal(v[3], 6);
    assert_ptr_equal(s->data, b + 8 + hdr + 3);
    assert_ptr_equal(s->file, f);
    const mr_st_tensor *e = mr_st_find(f, "e");
    assert_int_equal(e->n_elements, 0);
    assert_int_equal(e->n_bytes, 0);
    assert_int_equal(e->ndim, 3);
    assert_int_equal(e->shape[2], 2);
    assert_int_equal(mr_st_find(f, "f4")->n_bytes, 3);
    assert_int_equal(mr_st_find(f, "f6")->n_bytes, 3);
    assert_null(mr_st_find(f, "nope"));
    assert_null(mr_st_find(f, ""));
    assert_string_equal(mr_st_file_path(f), "edges");
    assert_int_equal(mr_st_file_size(f), len);
    mr_st_close(f);
    free(b);

    /* an empty checkpoint, and metadata (sorted by key) */
    b = mkfile("{\"__metadata__\":{\"z\":\"1\",\"format\":\"pt\",\"a\":\"\\u00e9\\n\"}}", 0, &len);
    assert_int_equal(mr_st_parse(b, len, "dir/meta.safetensors", &f), MR_OK);
    assert_int_equal(mr_st_count(f), 0);
    assert_string_equal(mr_st_file_name(f), "meta.safetensors");
    assert_int_equal(mr_st_metadata_count(f), 3);
    const char *k, *val;
    assert_true(mr_st_metadata_at(f, 0, &k, &val));
    assert_string_equal(k, "a");
    assert_string_equal(val, "\xc3\xa9\n");
    assert_true(mr_st_metadata_at(f, 2, &k, &val));
    assert_string_equal(k, "z");
    assert_false(mr_st_metadata_at(f, 3, &k, &val));
    assert_string_equal(mr_st_metadata(f, "format"), "pt");
    mr_st_close(f);
    free(b);
    mr_st_close(NULL);
}

/* Opening never touches tensor data: a sparse 1 GiB tensor stays out of the
 * page cache (mincore) after open and lookups. */
static void test_open_touches_no_data(void **st) {
    (void)st;
    char *dir = tu_tmpdir("io_sparse");
    char *p = path_in(dir, "sparse.safetensors");
    const uint64_t big = 1ull << 30;
    char hdr[160];
    snprintf(hdr, sizeof hdr, "{\"w\":{\"dtype\":\"U8\",\"shape\":[%llu],\"data_offsets\":[0,%llu]}}",
             (unsigned long long)big, (unsigned long long)big);
    size_t len;
    uint8_t *b = mkfile(hdr, 0, &len);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, b, len), (ssize_t)len);
    if (ftruncate(fd, (off_t)(len + big)) != 0) {
        close(fd);
        skip();
    }
    close(fd);
    free(b);
    mr_st_file *f;
    assert_int_equal(mr_st_open(p, &f), MR_OK);
    const mr_st_tensor *t = mr_st_find(f, "w");
    assert_non_null(t);
    assert_int_equal(t->n_bytes, big);
    long pg = sysconf(_SC_PAGESIZE);
    /* pages well inside the data, away from the header page */
    uintptr_t start = ((uintptr_t)t->data + 16 * (uintptr_t)pg) & ~((uintptr_t)pg - 1);
    unsigned char vec[256];
    assert_int_equal(mincore((void *)start, 256 * (size_t)pg, vec), 0);
    for (int i = 0; i < 256; i++) assert_int_equal(vec[i] & 1, 0);
    mr_ckpt *c;
    assert_int_equal(mr_ckpt_open(p, &c), MR_OK);
    assert_int_equal(mr_ckpt_count(c), 1);
    mr_ckpt_close(c);
    mr_st_close(f);
    free(p);
    tu_rmtree(dir);
    free(dir);
}

/* ---------------------------------------------------------------- golden checkpoint */

static json_t *load_golden(void) {
    json_error_t err;
    json_t *g = json_load_file(tu_data("io/ckpt_golden.json"), 0, &err);
    if (g == NULL) fail_msg("cannot read io/ckpt_golden.json: %s", err.text);
    return g;
}

static void check_against_golden(const mr_ckpt *c, const json_t *g) {
    const json_t *gt = json_object_get(g, "tensors");
    assert_int_equal(mr_ckpt_count(c), json_array_size(gt));
    for (size_t i = 0; i < json_array_size(gt); i++) {
        const json_t *e = json_array_get(gt, i);
        const char *name = json_string_value(json_object_get(e, "name"));
        const mr_st_tensor *t = mr_ckpt_find(c, name);
        if (t == NULL) fail_msg("tensor %s missing", name);
        /* iteration is in name order, and the golden list is sorted by name */
        assert_ptr_equal(mr_ckpt_tensor_at(c, i), t);
        assert_string_equal(mr_st_dtype_name(t->dtype), json_string_value(json_object_get(e, "dtype")));
        const json_t *shape = json_object_get(e, "shape");
        assert_int_equal(t->ndim, json_array_size(shape));
        for (int d = 0; d < t->ndim; d++) assert_int_equal(t->shape[d], json_integer_value(json_array_get(shape, (size_t)d)));
        assert_int_equal(t->n_bytes, json_integer_value(json_object_get(e, "bytes")));
        assert_string_equal(mr_st_file_name(t->file), json_string_value(json_object_get(e, "file")));
        char hex[65];
        sha256_hex(t->data, t->n_bytes, hex);
        assert_string_equal(hex, json_string_value(json_object_get(e, "sha256")));
    }
}

static void test_golden_checkpoint(void **st) {
    (void)st;
    json_t *g = load_golden();
    /* the folder, the index itself */
    const char *paths[] = {"io/ckpt", "io/ckpt/model.safetensors.index.json"};
    for (int k = 0; k < 2; k++) {
        char path[4096];
        snprintf(path, sizeof path, "%s", tu_data(paths[k]));
        mr_ckpt *c = NULL;
        assert_int_equal(mr_ckpt_open(path, &c), MR_OK);
        assert_true(mr_ckpt_is_sharded(c));
        assert_int_equal(mr_ckpt_file_count(c), 2);
        assert_contains(mr_ckpt_path(c), "model.safetensors.index.json");
        check_against_golden(c, g);
        assert_null(mr_ckpt_find(c, "nope"));
        assert_null(mr_ckpt_tensor_at(c, mr_ckpt_count(c)));
        mr_ckpt_close(c);
    }
    /* each shard alone: sizes, header size, metadata, as Python reports */
    const json_t *gf = json_object_get(g, "files");
    for (size_t i = 0; i < json_array_size(gf); i++) {
        const json_t *e = json_array_get(gf, i);
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", tu_data("io/ckpt"), json_string_value(json_object_get(e, "name")));
        mr_ckpt *c;
        assert_int_equal(mr_ckpt_open(path, &c), MR_OK);
        assert_false(mr_ckpt_is_sharded(c));
        const mr_st_file *f = mr_ckpt_file_at(c, 0);
        assert_int_equal(mr_st_file_size(f), json_integer_value(json_object_get(e, "size")));
        assert_int_equal(mr_st_header_size(f), json_integer_value(json_object_get(e, "header_size")));
        assert_int_equal(mr_st_count(f), json_array_size(json_object_get(e, "order")));
        assert_int_equal(mr_ckpt_count(c), mr_st_count(f));
        assert_string_equal(mr_st_metadata(f, "format"), "pt");
        assert_int_equal(mr_st_metadata_count(f), json_object_size(json_object_get(e, "metadata")));
        mr_ckpt_close(c);
    }
    json_decref(g);
}

/* Our writer reproduces the reference writer's bytes for the same tensors
 * and metadata, and the data order matches its header order. */
static void test_writer_matches_python(void **st) {
    (void)st;
    json_t *g = load_golden();
    char *dir = tu_tmpdir("io_pyw");
    const json_t *gf = json_object_get(g, "files");
    for (size_t i = 0; i < json_array_size(gf); i++) {
        const json_t *e = json_array_get(gf, i);
        const char *name = json_string_value(json_object_get(e, "name"));
        char src[4096];
        snprintf(src, sizeof src, "%s/%s", tu_data("io/ckpt"), name);
        mr_st_file *f;
        assert_int_equal(mr_st_open(src, &f), MR_OK);
        /* the data order of the Python file is our sort order */
        const json_t *order = json_object_get(e, "order");
        uint64_t prev = 0;
        for (size_t k = 0; k < json_array_size(order); k++) {
            const mr_st_tensor *t = mr_st_find(f, json_string_value(json_array_get(order, k)));
            assert_non_null(t);
            assert_true(t->offset >= prev);
            prev = t->offset;
        }
        mr_st_writer *w;
        assert_int_equal(mr_st_writer_new(&w), MR_OK);
        for (size_t k = 0; k < mr_st_count(f); k++) {
            const mr_st_tensor *t = mr_st_tensor_at(f, k);
            assert_int_equal(mr_st_writer_add(w, t->name, t->dtype, t->shape, t->ndim, t->data), MR_OK);
        }
        const char *mk, *mv;
        for (size_t k = 0; mr_st_metadata_at(f, k, &mk, &mv); k++)
            assert_int_equal(mr_st_writer_set_metadata(w, mk, mv), MR_OK);
        char *out = path_in(dir, name);
        assert_int_equal(mr_st_writer_write(w, out), MR_OK);
        size_t la, lb;
        void *a = tu_read_file(src, &la), *b = tu_read_file(out, &lb);
        assert_int_equal(la, lb);
        assert_memory_equal(a, b, la);
        char hex[65];
        sha256_hex(b, lb, hex);
        assert_string_equal(hex, json_string_value(json_object_get(e, "sha256")));
        free(a);
        free(b);
        free(out);
        mr_st_writer_free(w);
        mr_st_close(f);
    }
    assert_int_equal(count_entries(dir), json_array_size(gf)); /* no temp files left */
    tu_rmtree(dir);
    free(dir);
    json_decref(g);
}

/* ---------------------------------------------------------------- writer */

static void test_writer_roundtrip(void **st) {
    (void)st;
    char *dir = tu_tmpdir("io_rt");
    char *p1 = path_in(dir, "a.safetensors"), *p2 = path_in(dir, "b.safetensors");
    tu_rng r = {42};
    uint8_t buf[4096];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)tu_next(&r);
    static const struct {
        const char *name;
        mr_st_dtype dt;
        int ndim;
        int64_t shape[3];
    } ts[] = {
        {"z.bf16", MR_ST_BF16, 2, {7, 9, 0}},
        {"a.f32", MR_ST_F32, 1, {5, 0, 0}},
        {"scalar", MR_ST_F64, 0, {0, 0, 0}},
        {"empty", MR_ST_I32, 3, {2, 0, 5}},
        {"fp8", MR_ST_F8_E4M3, 2, {3, 3, 0}},
        {"e5", MR_ST_F8_E5M2, 1, {1, 0, 0}},
        {"packed", MR_ST_U8, 2, {4, 8, 0}},
        {"f4", MR_ST_F4, 1, {6, 0, 0}},
        {"f6", MR_ST_F6_E3M2, 1, {4, 0, 0}},
        {"bool", MR_ST_BOOL, 1, {3, 0, 0}},
        {"c", MR_ST_C64, 1, {2, 0, 0}},
        {"quote\"back\\slash\ttab\x01\x1f/ok", MR_ST_I8, 1, {2, 0, 0}},
        {"unicod\xc3\xa9-\xe2\x82\xac", MR_ST_U64, 1, {1, 0, 0}},
    };
    const size_t nt = sizeof ts / sizeof ts[0];
    mr_st_writer *w;
    assert_int_equal(mr_st_writer_new(&w), MR_OK);
    for (size_t i = 0; i < nt; i++)
        assert_int_equal(mr_st_writer_add(w, ts[i].name, ts[i].dt, ts[i].shape, ts[i].ndim, buf + 17 * i), MR_OK);
    assert_int_equal(mr_st_writer_set_metadata(w, "producer", "moerun \"test\""), MR_OK);
    assert_int_equal(mr_st_writer_set_metadata(w, "producer", "moerun test"), MR_OK); /* replaces */
    assert_int_equal(mr_st_writer_set_metadata(w, "aaa", "line\nbreak"), MR_OK);
    assert_int_equal(mr_st_writer_write(w, p1), MR_OK);
    /* writing again over an existing file replaces it */
    assert_int_equal(mr_st_writer_write(w, p1), MR_OK);
    mr_st_writer_free(w);

    mr_st_file *f;
    assert_int_equal(mr_st_open(p1, &f), MR_OK);
    assert_int_equal(mr_st_count(f), nt);
    assert_int_equal((8 + mr_st_header_size(f)) % 8, 0);
    assert_string_equal(mr_st_metadata(f, "format"), "pt");
    assert_string_equal(mr_st_metadata(f, "producer"), "moerun test");
    assert_string_equal(mr_st_metadata(f, "aaa"), "line\nbreak");
    for (size_t i = 0; i < nt; i++) {
        const mr_st_tensor *t = mr_st_find(f, ts[i].name);
        if (!t) fail_msg("tensor %zu missing", i);
        assert_int_equal(t->dtype, ts[i].dt);
        assert_int_equal(t->ndim, ts[i].ndim);
        uint64_t ne = 1;
        for (int d = 0; d < t->ndim; d++) {
            assert_int_equal(t->shape[d], ts[i].shape[d]);
            ne *= (uint64_t)ts[i].shape[d];
        }
        assert_int_equal(t->n_bytes, ne * (uint64_t)mr_st_dtype_bits(ts[i].dt) / 8);
        if (t->n_bytes) assert_memory_equal(t->data, buf + 17 * i, t->n_bytes);
    }
    /* data order: dtype descending, then name */
    for (size_t i = 0; i < nt; i++) {
        for (size_t j = 0; j < nt; j++) {
            const mr_st_tensor *a = mr_st_tensor_at(f, i), *b = mr_st_tensor_at(f, j);
            if (a->dtype > b->dtype) assert_true(a->offset <= b->offset);
            if (a->dtype == b->dtype && strcmp(a->name, b->name) < 0) assert_true(a->offset <= b->offset);
        }
    }
    /* rewrite from what was read: byte-identical */
    assert_int_equal(mr_st_writer_new(&w), MR_OK);
    for (size_t i = 0; i < mr_st_count(f); i++) {
        const mr_st_tensor *t = mr_st_tensor_at(f, i);
        assert_int_equal(mr_st_writer_add(w, t->name, t->dtype, t->shape, t->ndim, t->data), MR_OK);
    }
    const char *k, *v;
    for (size_t i = 0; mr_st_metadata_at(f, i, &k, &v); i++) assert_int_equal(mr_st_writer_set_metadata(w, k, v), MR_OK);
    assert_int_equal(mr_st_writer_write(w, p2), MR_OK);
    mr_st_writer_free(w);
    mr_st_close(f);
    size_t la, lb;
    void *a = tu_read_file(p1, &la), *b = tu_read_file(p2, &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(a);
    free(b);
    assert_int_equal(count_entries(dir), 2);
    free(p1);
    free(p2);
    tu_rmtree(dir);
    free(dir);
}

static void test_writer_errors(void **st) {
    (void)st;
    char *dir = tu_tmpdir("io_werr");
    char *p = path_in(dir, "x.safetensors");
    uint8_t d[8] = {0};
    int64_t shp[2] = {2, 2};
    mr_st_writer *w;
    assert_int_equal(mr_st_writer_new(&w), MR_OK);
    assert_int_equal(mr_st_writer_add(w, "", MR_ST_U8, shp, 1, d), MR_EINVAL);
    assert_int_equal(mr_st_writer_add(w, "__metadata__", MR_ST_U8, shp, 1, d), MR_EINVAL);
    assert_int_equal(mr_st_writer_add(w, "bad\xff", MR_ST_U8, shp, 1, d), MR_EINVAL);
    assert_contains(mr_error_last(), "UTF-8");
    assert_int_equal(mr_st_writer_add(w, "fnuz", MR_ST_F8_E4M3FNUZ, shp, 1, d), MR_EINVAL);
    assert_int_equal(mr_st_writer_add(w, "nodata", MR_ST_U8, shp, 1, NULL), MR_EINVAL);
    int64_t odd = 3, neg = -1, huge[2] = {INT64_MAX, 4};
    assert_int_equal(mr_st_writer_add(w, "f4", MR_ST_F4, &odd, 1, d), MR_EINVAL);
    assert_int_equal(mr_st_writer_add(w, "neg", MR_ST_U8, &neg, 1, d), MR_EINVAL);
    assert_int_equal(mr_st_writer_add(w, "huge", MR_ST_U8, huge, 2, d), MR_EOVERFLOW);
    assert_int_equal(mr_st_writer_set_metadata(w, "k", "\xc3"), MR_EINVAL);
    assert_int_equal(mr_st_writer_add(w, "dup", MR_ST_U8, shp, 2, d), MR_OK);
    assert_int_equal(mr_st_writer_add(w, "dup", MR_ST_U8, shp, 1, d), MR_OK);
    assert_int_equal(mr_st_writer_write(w, p), MR_EINVAL);
    assert_contains(mr_error_last(), "duplicate tensor name 'dup'");
    assert_int_equal(count_entries(dir), 0);
    mr_st_writer_free(w);
    /* a folder that does not exist: nothing is created */
    assert_int_equal(mr_st_writer_new(&w), MR_OK);
    char *q = path_in(dir, "no/such/dir/x.safetensors");
    assert_int_equal(mr_st_writer_write(w, q), MR_EIO);
    assert_contains(mr_error_last(), q);
    /* renaming onto a folder fails after the data is written: the temp goes */
    char *sub = path_in(dir, "sub");
    assert_int_equal(mkdir(sub, 0755), 0);
    assert_int_equal(tu_write_file(p, "x", 1), 0);
    char *inner = path_in(sub, "f");
    assert_int_equal(tu_write_file(inner, "x", 1), 0);
    assert_int_equal(mr_st_writer_write(w, sub), MR_EIO);
    assert_contains(mr_error_last(), "rename");
    assert_int_equal(count_entries(dir), 2); /* x.safetensors and sub: no temp file */
    mr_st_writer_free(w);
    free(inner);
    free(sub);
    free(q);
    free(p);
    tu_rmtree(dir);
    free(dir);
}

static void test_write_file_atomic(void **st) {
    (void)st;
    char *dir = tu_tmpdir("io_atomic");
    char *p = path_in(dir, "config.json");
    const char *a = "{\"a\": 1}\n", *b = "{}";
    assert_int_equal(mr_write_file_atomic(p, a, strlen(a)), MR_OK);
    size_t n;
    char *got = tu_read_file(p, &n);
    assert_int_equal(n, strlen(a));
    assert_memory_equal(got, a, n);
    free(got);
    assert_int_equal(mr_write_file_atomic(p, b, strlen(b)), MR_OK);
    got = tu_read_file(p, &n);
    assert_int_equal(n, 2);
    assert_memory_equal(got, b, 2);
    free(got);
    assert_int_equal(mr_write_file_atomic(p, NULL, 0), MR_OK);
    got = tu_read_file(p, &n);
    assert_int_equal(n, 0);
    free(got);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0644);
    assert_int_equal(count_entries(dir), 1);
    char *q = path_in(dir, "missing/config.json");
    assert_int_equal(mr_write_file_atomic(q, a, 1), MR_EIO);
    free(q);
    free(p);
    tu_rmtree(dir);
    free(dir);
}

/* ---------------------------------------------------------------- sharded checkpoints */

static void write_st(const char *path, const char *const *names, size_t n, const uint8_t *vals) {
    mr_st_writer *w;
    assert_int_equal(mr_st_writer_new(&w), MR_OK);
    int64_t one = 1;
    for (size_t i = 0; i < n; i++) assert_int_equal(mr_st_writer_add(w, names[i], MR_ST_U8, &one, 1, &vals[i]), MR_OK);
    assert_int_equal(mr_st_writer_write(w, path), MR_OK);
    mr_st_writer_free(w);
}

static void write_text(const char *dir, const char *name, const char *text) {
    char *p = path_in(dir, name);
    assert_int_equal(mr_write_file_atomic(p, text, strlen(text)), MR_OK);
    free(p);
}

static mr_status open_in(const char *dir, const char *name, mr_ckpt **c) {
    char *p = name ? path_in(dir, name) : strdup(dir);
    mr_status s = mr_ckpt_open(p, c);
    free(p);
    return s;
}

static void test_ckpt_index_rules(void **st) {
    (void)st;
    char *dir = tu_tmpdir("io_idx");
    char *sub = path_in(dir, "sub");
    assert_int_equal(mkdir(sub, 0755), 0);
    char *s1 = path_in(dir, "s1.safetensors"), *s2 = path_in(sub, "s2.safetensors");
    const char *n1[] = {"a", "shared", "only_in_file"};
    const char *n2[] = {"b", "shared"};
    const uint8_t v1[] = {1, 11, 99}, v2[] = {2, 22};
    write_st(s1, n1, 3, v1);
    write_st(s2, n2, 2, v2);
    mr_ckpt *c = NULL;

    /* a tensor in two shards is bound to the index's file; extras are not listed */
    write_text(dir, "model.safetensors.index.json",
               "{\"metadata\":{\"total_size\":12345},\"weight_map\":{\"b\":\"sub/s2.safetensors\","
               "\"shared\":\"sub/s2.safetensors\",\"a\":\"s1.safetensors\"}}");
    assert_int_equal(open_in(dir, NULL, &c), MR_OK);
    assert_int_equal(mr_ckpt_count(c), 3);
    assert_int_equal(mr_ckpt_file_count(c), 2);
    assert_string_equal(mr_st_file_name(mr_ckpt_file_at(c, 0)), "s1.safetensors"); /* name order */
    assert_string_equal(mr_st_file_name(mr_ckpt_file_at(c, 1)), "sub/s2.safetensors");
    assert_null(mr_ckpt_file_at(c, 2));
    assert_string_equal(mr_ckpt_tensor_at(c, 0)->name, "a");
    assert_string_equal(mr_ckpt_tensor_at(c, 1)->name, "b");
    assert_string_equal(mr_ckpt_tensor_at(c, 2)->name, "shared");
    const mr_st_tensor *t = mr_ckpt_find(c, "shared");
    assert_int_equal(*(const uint8_t *)t->data, 22);
    assert_string_equal(mr_st_file_name(t->file), "sub/s2.safetensors");
    assert_int_equal(*(const uint8_t *)mr_ckpt_find(c, "a")->data, 1);
    assert_null(mr_ckpt_find(c, "only_in_file"));
    mr_ckpt_close(c);

    /* the other binding of the same tensor */
    write_text(dir, "idx2.json", "{\"weight_map\":{\"shared\":\"s1.safetensors\"}}");
    assert_int_equal(open_in(dir, "idx2.json", &c), MR_OK);
    assert_int_equal(*(const uint8_t *)mr_ckpt_find(c, "shared")->data, 11);
    assert_int_equal(mr_ckpt_file_count(c), 1); /* only the files named are opened */
    mr_ckpt_close(c);

    static const struct {
        const char *json;
        mr_status st;
        const char *need;
    } bad[] = {
        {"{\"weight_map\":{\"zz\":\"s1.safetensors\"}}", MR_EFORMAT, "tensor 'zz'"},
        {"{\"weight_map\":{\"a\":\"../s1.safetensors\"}}", MR_EFORMAT, "../s1.safetensors"},
        {"{\"weight_map\":{\"a\":\"sub/../../x.safetensors\"}}", MR_EFORMAT, "not a relative path"},
        {"{\"weight_map\":{\"a\":\"/etc/passwd\"}}", MR_EFORMAT, "not a relative path"},
        {"{\"weight_map\":{\"a\":\"\"}}", MR_EFORMAT, "not a relative path"},
        {"{\"weight_map\":{\"a\":\"missing.safetensors\"}}", MR_ENOTFOUND, "missing.safetensors"},
        {"{\"weight_map\":{\"a\":1}}", MR_EFORMAT, "entry 'a'"},
        {"{\"metadata\":{}}", MR_EFORMAT, "\"weight_map\" is missing"},
        {"{\"weight_map\":[]}", MR_EFORMAT, "\"weight_map\" must be an object"},
        {"{\"metadata\":3,\"weight_map\":{}}", MR_EFORMAT, "\"metadata\" must be an object"},
        {"[]", MR_EFORMAT, "not a JSON object"},
        {"{\"weight_map\":{\"a\":\"s1.safetensors\",\"a\":\"s1.safetensors\"}}", MR_EFORMAT, "duplicate"},
        {"{\"weight_map\":", MR_EFORMAT, "invalid index"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(dir, "bad.json", bad[i].json);
        c = (mr_ckpt *)1;
        mr_status s = open_in(dir, "bad.json", &c);
        if (s != bad[i].st) fail_msg("case %zu: %s (%s)", i, mr_status_name(s), mr_error_last());
        assert_null(c);
        assert_contains(mr_error_last(), bad[i].need);
    }
    /* a bad shard: the error names the shard */
    char *s3 = path_in(dir, "s3.safetensors");
    assert_int_equal(tu_write_file(s3, "\x10\0\0", 3), 0);
    write_text(dir, "bad.json", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"q\":\"s3.safetensors\"}}");
    assert_int_equal(open_in(dir, "bad.json", &c), MR_EFORMAT);
    assert_contains(mr_error_last(), "s3.safetensors");
    assert_contains(mr_error_last(), "header too small");
    free(s3);

    /* a folder with model.safetensors only; a folder with neither; a missing path */
    char *m = path_in(sub, "model.safetensors");
    write_st(m, n2, 2, v2);
    assert_int_equal(open_in(sub, NULL, &c), MR_OK);
    assert_false(mr_ckpt_is_sharded(c));
    assert_int_equal(mr_ckpt_count(c), 2);
    assert_contains(mr_ckpt_path(c), "model.safetensors");
    mr_ckpt_close(c);
    free(m);
    char *empty = path_in(dir, "empty");
    assert_int_equal(mkdir(empty, 0755), 0);
    assert_int_equal(open_in(empty, NULL, &c), MR_ENOTFOUND);
    assert_contains(mr_error_last(), "neither");
    assert_int_equal(open_in(dir, "nothing.safetensors", &c), MR_ENOTFOUND);
    free(empty);

    free(s1);
    free(s2);
    free(sub);
    tu_rmtree(dir);
    free(dir);
}

/* ---------------------------------------------------------------- fault injection */

static void test_fault_injection_open(void **st) {
    (void)st;
    char path[4096];
    snprintf(path, sizeof path, "%s", tu_data("io/ckpt"));
    int n;
    for (n = 0; n < 10000; n++) {
        mr_debug_alloc_fail_after(n);
        mr_ckpt *c = (mr_ckpt *)1;
        mr_status s = mr_ckpt_open(path, &c);
        mr_debug_alloc_fail_after(-1);
        if (s == MR_OK) {
            assert_int_equal(mr_ckpt_count(c), 12);
            mr_ckpt_close(c);
            break;
        }
        if (s != MR_ENOMEM) fail_msg("fail_after(%d): %s: %s", n, mr_status_name(s), mr_error_last());
        assert_null(c);
    }
    assert_true(n > 5);
    /* mr_st_parse alone, with metadata */
    size_t len;
    uint8_t *b = mkfile("{\"__metadata__\":{\"format\":\"pt\",\"k\":\"v\"},\"a\":{\"dtype\":\"BF16\",\"shape\":[2,2],"
                        "\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[8,9]}}",
                        9, &len);
    for (n = 0; n < 10000; n++) {
        mr_debug_alloc_fail_after(n);
        mr_st_file *f = (mr_st_file *)1;
        mr_status s = mr_st_parse(b, len, "mem", &f);
        mr_debug_alloc_fail_after(-1);
        if (s == MR_OK) {
            assert_int_equal(mr_st_count(f), 2);
            mr_st_close(f);
            break;
        }
        if (s != MR_ENOMEM) fail_msg("fail_after(%d): %s: %s", n, mr_status_name(s), mr_error_last());
        assert_null(f);
    }
    assert_true(n > 3);
    free(b);
}

static void test_fault_injection_writer(void **st) {
    (void)st;
    char *dir = tu_tmpdir("io_wfault");
    char *p = path_in(dir, "w.safetensors");
    uint8_t d[64] = {0};
    int64_t shp[2] = {4, 8};
    int n;
    for (n = 0; n < 10000; n++) {
        mr_debug_alloc_fail_after(n);
        mr_st_writer *w = NULL;
        mr_status s = mr_st_writer_new(&w);
        char name[32];
        for (int i = 0; s == MR_OK && i < 40; i++) { /* enough to grow the arrays */
            snprintf(name, sizeof name, "t%02d", i);
            s = mr_st_writer_add(w, name, i % 2 ? MR_ST_U8 : MR_ST_BF16, shp, 1 + i % 2, d);
        }
        for (int i = 0; s == MR_OK && i < 20; i++) {
            snprintf(name, sizeof name, "k%02d", i);
            s = mr_st_writer_set_metadata(w, name, "v");
        }
        if (s == MR_OK) s = mr_st_writer_write(w, p);
        mr_debug_alloc_fail_after(-1);
        mr_st_writer_free(w);
        if (s == MR_OK) break;
        if (s != MR_ENOMEM) fail_msg("fail_after(%d): %s: %s", n, mr_status_name(s), mr_error_last());
        assert_int_equal(count_entries(dir), 0); /* neither the file nor a temp file */
    }
    assert_true(n > 5);
    mr_st_file *f;
    assert_int_equal(mr_st_open(p, &f), MR_OK);
    assert_int_equal(mr_st_count(f), 40);
    assert_int_equal(mr_st_metadata_count(f), 21);
    mr_st_close(f);
    /* the atomic text writer */
    for (n = 0; n < 100; n++) {
        mr_debug_alloc_fail_after(n);
        mr_status s = mr_write_file_atomic(p, "x", 1);
        mr_debug_alloc_fail_after(-1);
        if (s == MR_OK) break;
        assert_int_equal(s, MR_ENOMEM);
        assert_int_equal(count_entries(dir), 1);
    }
    free(p);
    tu_rmtree(dir);
    free(dir);
}

/* The HF name map: every kind written and parsed back (layer, expert,
 * suffix), the names the checkpoints use, and names outside the map. */
static void test_hf_names(void **st) {
    (void)st;
    char b[256];
    assert_true(mr_hf_name(MR_HF_EXPERT_W3, 61, 255, NULL, b, sizeof b));
    assert_string_equal(b, "model.layers.61.block_sparse_moe.experts.255.w3.weight");
    assert_true(mr_hf_name(MR_HF_EXPERT_W1, 2, 7, "weight_scale_inv", b, sizeof b));
    assert_string_equal(b, "model.layers.2.block_sparse_moe.experts.7.w1.weight_scale_inv");
    assert_true(mr_hf_name(MR_HF_ROUTER_BIAS, 0, -1, NULL, b, sizeof b));
    assert_string_equal(b, "model.layers.0.block_sparse_moe.e_score_correction_bias");
    assert_true(mr_hf_name(MR_HF_LM_HEAD, -1, -1, "", b, sizeof b));
    assert_string_equal(b, "lm_head");
    assert_true(mr_hf_name(MR_HF_Q_NORM, 3, -1, NULL, b, sizeof b));
    assert_string_equal(b, "model.layers.3.self_attn.q_norm.weight");
    assert_false(mr_hf_name(MR_HF_EMBED, -1, -1, NULL, b, 10)); /* does not fit */
    const char *sufs[] = {NULL, "weight_scale", "input_scale"};
    for (int k = 0; k < MR_HF_COUNT; k++)
        for (int si = 0; si < 3; si++) {
            const int l = 17, e = 42;
            assert_true(mr_hf_name((mr_hf_tensor)k, l, e, sufs[si], b, sizeof b));
            mr_hf_tensor t;
            int pl, pe;
            const char *suf;
            if (!mr_hf_parse(b, &t, &pl, &pe, &suf)) fail_msg("%s does not parse", b);
            assert_int_equal(t, k);
            assert_int_equal(pl, strstr(b, "layers.") ? l : -1);
            assert_int_equal(pe, mr_hf_is_expert(t) ? e : -1);
            if (sufs[si]) assert_string_equal(suf, sufs[si]);
        }
    static const char *const outside[] = {"model.layers.0.mlp.gate_proj.weight",
                                          "model.layers.01.input_layernorm.weight",
                                          "model.layers.3.block_sparse_moe.experts.x.w1.weight",
                                          "model.layers.3.block_sparse_moe.experts.1.w4.weight",
                                          "model.layers.-1.self_attn.q_proj.weight",
                                          "model.norm",
                                          "lm_head.weight.extra"};
    for (size_t i = 0; i < sizeof outside / sizeof outside[0]; i++) {
        mr_hf_tensor t;
        int pl, pe;
        const char *suf;
        if (mr_hf_parse(outside[i], &t, &pl, &pe, &suf)) fail_msg("%s parsed as kind %d", outside[i], t);
    }
    assert_true(mr_hf_is_linear(MR_HF_O_PROJ) && mr_hf_is_linear(MR_HF_EXPERT_W2) && !mr_hf_is_linear(MR_HF_ROUTER));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hf_names),
        cmocka_unit_test(test_dtype_table),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_bad_prefix),
        cmocka_unit_test(test_reference_verdicts),
        cmocka_unit_test(test_valid_edges),
        cmocka_unit_test(test_open_touches_no_data),
        cmocka_unit_test(test_golden_checkpoint),
        cmocka_unit_test(test_writer_matches_python),
        cmocka_unit_test(test_writer_roundtrip),
        cmocka_unit_test(test_writer_errors),
        cmocka_unit_test(test_write_file_atomic),
        cmocka_unit_test(test_ckpt_index_rules),
        cmocka_unit_test(test_fault_injection_open),
        cmocka_unit_test(test_fault_injection_writer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
