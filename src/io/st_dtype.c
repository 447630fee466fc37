/* st_dtype.c — the safetensors dtype table: names, bit widths and the
 * mr_format each maps to. Bit widths were checked against the Python
 * safetensors 0.8.0 reader (which accepts [8] of F4 in 4 bytes, [4] of F6_E2M3
 * in 3 bytes, [8] of C64 in 64 bytes); the enum order is the one its error
 * message lists ("expected one of `BOOL`, `F4`, ...") and its writer sorts by. */
#include <string.h>

#include "io_internal.h"

typedef struct {
    const char *name;
    int bits;
    int fmt; /* mr_format, or -1 if none */
} dtype_row;

static const dtype_row dtypes[MR_ST_DTYPE_COUNT] = {
    [MR_ST_BOOL] = {"BOOL", 8, -1},
    [MR_ST_F4] = {"F4", 4, MR_FMT_E2M1},
    [MR_ST_F6_E2M3] = {"F6_E2M3", 6, -1},
    [MR_ST_F6_E3M2] = {"F6_E3M2", 6, -1},
    [MR_ST_U8] = {"U8", 8, -1},
    [MR_ST_I8] = {"I8", 8, -1},
    [MR_ST_F8_E5M2] = {"F8_E5M2", 8, MR_FMT_E5M2},
    [MR_ST_F8_E4M3] = {"F8_E4M3", 8, MR_FMT_E4M3},
    [MR_ST_F8_E8M0] = {"F8_E8M0", 8, -1},
    [MR_ST_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8, -1},
    [MR_ST_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8, -1},
    [MR_ST_I16] = {"I16", 16, -1},
    [MR_ST_U16] = {"U16", 16, -1},
    [MR_ST_F16] = {"F16", 16, MR_FMT_F16},
    [MR_ST_BF16] = {"BF16", 16, MR_FMT_BF16},
    [MR_ST_I32] = {"I32", 32, -1},
    [MR_ST_U32] = {"U32", 32, -1},
    [MR_ST_F32] = {"F32", 32, MR_FMT_F32},
    [MR_ST_C64] = {"C64", 64, -1},
    [MR_ST_F64] = {"F64", 64, -1},
    [MR_ST_I64] = {"I64", 64, -1},
    [MR_ST_U64] = {"U64", 64, -1},
};

const char *mr_st_dtype_name(mr_st_dtype dt) {
    if ((int)dt < 0 || dt >= MR_ST_DTYPE_COUNT) return NULL;
    return dtypes[dt].name;
}

int mr_st_dtype_bits(mr_st_dtype dt) {
    if ((int)dt < 0 || dt >= MR_ST_DTYPE_COUNT) return 0;
    return dtypes[dt].bits;
}

mr_status mr_st_dtype_from_name(const char *name, mr_st_dtype *out) {
    for (int i = 0; i < MR_ST_DTYPE_COUNT; i++) {
        if (strcmp(dtypes[i].name, name) == 0) {
            *out = (mr_st_dtype)i;
            return MR_OK;
        }
    }
    return mr_error_set(MR_ENOTFOUND, "unknown safetensors dtype '%s'", name);
}

bool mr_st_dtype_to_format(mr_st_dtype dt, mr_format *out) {
    if ((int)dt < 0 || dt >= MR_ST_DTYPE_COUNT || dtypes[dt].fmt < 0) return false;
    *out = (mr_format)dtypes[dt].fmt;
    return true;
}
