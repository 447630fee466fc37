/* fuzz_safetensors.c — libFuzzer target for the safetensors header parser.
 * Feeds the input, as a whole file image, to mr_st_parse (the code mr_st_open
 * runs on the mapped file) and checks the invariants a successful parse
 * promises: every tensor lies inside the buffer, the tensors tile the data
 * section exactly, sizes agree with shapes, names are sorted and found by
 * lookup. A failed parse must leave *out NULL and an error message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moerun/io.h"

#define CHECK(x) \
    do {         \
        if (!(x)) abort(); \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mr_st_file *f = (mr_st_file *)&f;
    mr_status s = mr_st_parse(data, size, "fuzz", &f);
    if (s != MR_OK) {
        CHECK(f == NULL);
        CHECK(s < 0);
        CHECK(strlen(mr_error_last()) > 0);
        return 0;
    }
    uint64_t hn = mr_st_header_size(f);
    CHECK(8 + hn <= size);
    CHECK(mr_st_file_size(f) == size);
    uint64_t total = 0;
    volatile uint8_t sink = 0;
    size_t n = mr_st_count(f);
    for (size_t i = 0; i < n; i++) {
        const mr_st_tensor *t = mr_st_tensor_at(f, i);
        CHECK(t != NULL && t->file == f);
        CHECK(mr_st_find(f, t->name) == t);
        if (i > 0) CHECK(strcmp(mr_st_tensor_at(f, i - 1)->name, t->name) < 0);
        CHECK(mr_st_dtype_name(t->dtype) != NULL);
        CHECK(t->dtype != MR_ST_F8_E4M3FNUZ && t->dtype != MR_ST_F8_E5M2FNUZ);
        uint64_t ne = 1;
        for (int d = 0; d < t->ndim; d++) {
            CHECK(t->shape[d] >= 0);
            ne *= (uint64_t)t->shape[d]; /* cannot overflow: the parser checked it */
        }
        CHECK(ne == t->n_elements);
        CHECK(ne * (uint64_t)mr_st_dtype_bits(t->dtype) == 8 * t->n_bytes);
        CHECK(t->offset >= 8 + hn);
        CHECK(t->offset <= size && t->n_bytes <= size - t->offset);
        CHECK((const uint8_t *)t->data == data + t->offset);
        if (t->n_bytes) sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->n_bytes - 1];
        total += t->n_bytes;
    }
    CHECK(total == size - 8 - hn);
    CHECK(mr_st_tensor_at(f, n) == NULL);
    const char *k, *v;
    for (size_t i = 0; mr_st_metadata_at(f, i, &k, &v); i++) CHECK(mr_st_metadata(f, k) == v);
    (void)sink;
    mr_st_close(f);
    return 0;
}
