/* qmatrix.c — mr_qmatrix: validation, buffer sizing and ownership, and the
 * dispatch of quantize / dequantize-row to the format files (fp8_block.c,
 * nvfp4.c; F32 and BF16 are element formats from traits.c). Buffers are
 * 64-byte aligned so SIMD kernels can read them directly. */
#include <math.h>
#include <string.h>

#include "formats/formats_internal.h"
#include "moerun/formats.h"

/* Sizes of data and scale buffers in bytes (the format's DATA and SCALE
 * tensors, formats/traits.c); false on overflow or for a format that is
 * not a weight format. */
static bool qm_sizes(mr_format fmt, int64_t rows, int64_t cols, size_t *data, size_t *scale) {
    const mr_format_tensor *d = mr_format_tensor_find(fmt, MR_FT_DATA), *s = mr_format_tensor_find(fmt, MR_FT_SCALE);
    *data = *scale = 0;
    if (!d || rows < 0 || cols < 0) return false;
    return mr_format_tensor_bytes(d, rows, cols, data) && (!s || mr_format_tensor_bytes(s, rows, cols, scale));
}

mr_status mr_qmatrix_sizes(mr_format fmt, int64_t rows, int64_t cols, size_t *data, size_t *scale) {
    const mr_format_traits *tr = mr_format_traits_get(fmt);
    if (!tr || !mr_format_tensor_find(fmt, MR_FT_DATA))
        return mr_error_set(MR_EUNSUPPORTED, "format %s is not a weight format", tr ? tr->name : "(invalid)");
    if (!qm_sizes(fmt, rows, cols, data, scale))
        return mr_error_set(MR_EOVERFLOW, "%s matrix [%lld][%lld] is too large", tr->name, (long long)rows,
                            (long long)cols);
    return MR_OK;
}

mr_status mr_qmatrix_alloc(mr_qmatrix *m, mr_format fmt, int64_t rows, int64_t cols) {
    memset(m, 0, sizeof *m);
    if (fmt == MR_FMT_NVFP4 && cols % MR__NVFP4_BLOCK)
        return mr_error_set(MR_EINVAL, "nvfp4 matrix needs cols %% %d == 0 (got %lld)", MR__NVFP4_BLOCK,
                            (long long)cols);
    size_t d = 0, s = 0;
    mr_status st = mr_qmatrix_sizes(fmt, rows, cols, &d, &s);
    if (st) return st;
    m->fmt = fmt;
    m->rows = rows;
    m->cols = cols;
    m->scale2 = 1.0f;
    m->owned = true;
    m->tiles = NULL;
    m->data = mr_aligned_alloc(64, d ? d : 1);
    m->scale = s ? mr_aligned_alloc(64, s) : NULL;
    if (!m->data || (s && !m->scale)) {
        mr_qmatrix_free(m);
        return mr_error_set(MR_ENOMEM, "out of memory for a [%lld][%lld] matrix (%zu + %zu bytes)", (long long)rows,
                            (long long)cols, d, s);
    }
    memset(m->data, 0, d);
    if (s) memset(m->scale, 0, s);
    return MR_OK;
}

mr_status mr_qmatrix_quantize(mr_qmatrix *out, mr_format fmt, const float *w, int64_t rows, int64_t cols,
                              float shared_amax) {
    const mr_format_traits *tr = mr_format_traits_get(fmt);
    size_t data_bytes = 0, scale_bytes = 0;
    if (out == NULL) return mr_error_set(MR_EINVAL, "mr_qmatrix_quantize: out is NULL");
    memset(out, 0, sizeof *out);
    out->scale2 = 1.0f;
    if (tr == NULL || !tr->is_weight_format)
        return mr_error_set(MR_EUNSUPPORTED, "cannot quantize a weight matrix to format %s (use f32, bf16, "
                            "fp8_block or nvfp4)", tr ? tr->name : "(invalid)");
    if (rows <= 0 || cols <= 0)
        return mr_error_set(MR_EINVAL, "%s weight matrix has shape [%lld, %lld]; both must be positive", tr->name,
                            (long long)rows, (long long)cols);
    if (w == NULL) return mr_error_set(MR_EINVAL, "mr_qmatrix_quantize: w is NULL");
    if (fmt == MR_FMT_NVFP4 && cols % MR__NVFP4_BLOCK != 0)
        return mr_error_set(MR_EINVAL, "nvfp4 needs the input dimension K (%lld) to be a multiple of %d",
                            (long long)cols, MR__NVFP4_BLOCK);
    if (!qm_sizes(fmt, rows, cols, &data_bytes, &scale_bytes))
        return mr_error_set(MR_EOVERFLOW, "%s weight matrix [%lld, %lld] is too large", tr->name, (long long)rows,
                            (long long)cols);
    if (!(shared_amax >= 0.0f) || isinf(shared_amax))
        return mr_error_set(MR_EINVAL, "shared_amax must be finite and >= 0 (got %g)", (double)shared_amax);

    /* The block formats need finite weights; f32/bf16 store whatever they get. */
    float amax = 0.0f;
    if (fmt == MR_FMT_FP8_BLOCK || fmt == MR_FMT_NVFP4) {
        for (int64_t i = 0; i < rows * cols; i++) {
            float a = fabsf(w[i]);
            if (!isfinite(a))
                return mr_error_set(MR_EINPUT, "%s quantization: weight [%lld, %lld] is %s", tr->name,
                                    (long long)(i / cols), (long long)(i % cols), isnan(a) ? "NaN" : "infinite");
            if (a > amax) amax = a;
        }
    }

    void *data = mr_aligned_alloc(64, data_bytes);
    void *scale = scale_bytes ? mr_aligned_alloc(64, scale_bytes) : NULL;
    if (data == NULL || (scale_bytes && scale == NULL)) {
        mr_aligned_free(data);
        mr_aligned_free(scale);
        return mr_error_set(MR_ENOMEM, "out of memory quantizing a [%lld, %lld] %s matrix (%zu + %zu bytes)",
                            (long long)rows, (long long)cols, tr->name, data_bytes, scale_bytes);
    }

    switch (fmt) {
    case MR_FMT_F32:
    case MR_FMT_BF16:
        for (int64_t r = 0; r < rows; r++)
            tr->quantize_row_ref(w + r * cols, (char *)data + (size_t)r * (size_t)cols * (size_t)tr->bytes_per_block,
                                 cols);
        break;
    case MR_FMT_FP8_BLOCK:
        mr__fp8_block_quantize(w, rows, cols, data, scale);
        break;
    case MR_FMT_NVFP4:
        out->scale2 = (shared_amax > 0.0f ? shared_amax : amax) / (MR__E2M1_MAX * MR__E4M3_MAX);
        mr__nvfp4_quantize(w, rows, cols, out->scale2, data, scale);
        break;
    default:
        MR_ASSERT(0);
    }
    out->fmt = fmt;
    out->rows = rows;
    out->cols = cols;
    out->data = data;
    out->scale = scale;
    out->owned = true;
    out->tiles = NULL;
    return MR_OK;
}

void mr_qmatrix_dequant_row(const mr_qmatrix *m, int64_t r, float *dst) {
    MR_ASSERT(m != NULL && m->data != NULL && r >= 0 && r < m->rows);
    switch (m->fmt) {
    case MR_FMT_F32:
        mr__f32_dequantize_row((const float *)m->data + r * m->cols, dst, m->cols);
        break;
    case MR_FMT_BF16:
        mr__bf16_dequantize_row((const uint16_t *)m->data + r * m->cols, dst, m->cols);
        break;
    case MR_FMT_FP8_BLOCK:
        mr__fp8_block_dequant_row(m->data, m->scale, m->rows, m->cols, r, dst);
        break;
    case MR_FMT_NVFP4:
        mr__nvfp4_dequant_row(m->data, m->scale, m->scale2, m->cols, r, dst);
        break;
    default:
        MR_ASSERT(0 && "not a weight format");
    }
}

size_t mr_qmatrix_bytes(const mr_qmatrix *m) { return mr_qmatrix_data_bytes(m) + mr_qmatrix_scale_bytes(m); }

size_t mr_qmatrix_data_bytes(const mr_qmatrix *m) {
    size_t d = 0, s = 0;
    if (m == NULL || m->data == NULL || !qm_sizes(m->fmt, m->rows, m->cols, &d, &s)) return 0;
    return d;
}

size_t mr_qmatrix_scale_bytes(const mr_qmatrix *m) {
    size_t d = 0, s = 0;
    if (m == NULL || m->data == NULL || !qm_sizes(m->fmt, m->rows, m->cols, &d, &s)) return 0;
    return m->scale ? s : 0;
}

void mr_qmatrix_free(mr_qmatrix *m) {
    if (m == NULL) return;
    if (m->owned) {
        mr_aligned_free(m->data);
        mr_aligned_free(m->scale);
    }
    memset(m, 0, sizeof *m);
}
