/* textutil.c — what every part of text/ (tokenizer, templates, parsers)
 * shares: the growable byte buffer and the UTF-8 primitives (a checking
 * decoder: invalid or truncated input gives U+FFFD and advances one byte; a
 * fast decoder for input already known to be valid; the encoder). */
#include <string.h>

#include "text/textutil.h"

mr_status mr__buf_reserve(mr__buf *b, size_t extra) {
    size_t need;
    if (!mr_size_add(b->n, extra, &need)) return mr_error_set(MR_EOVERFLOW, "text buffer size overflows");
    if (need + 1 <= b->cap) return MR_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need + 1) {
        if (cap > SIZE_MAX / 2) return mr_error_set(MR_EOVERFLOW, "text buffer size overflows");
        cap *= 2;
    }
    char *p = mr_realloc(b->p, cap);
    if (!p) return MR_ENOMEM;
    b->p = p;
    b->cap = cap;
    return MR_OK;
}

mr_status mr__buf_put(mr__buf *b, const void *s, size_t n) {
    mr_status st = mr__buf_reserve(b, n);
    if (st) return st;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return MR_OK;
}

void mr__buf_free(mr__buf *b) {
    mr_free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

bool mr__buf_add(mr__buf *b, const char *p, size_t n) { return mr__buf_put(b, p, n) == MR_OK; }
bool mr__buf_addc(mr__buf *b, char c) { return mr__buf_put(b, &c, 1) == MR_OK; }


uint32_t mr__utf8_decode(const char *s, size_t n, size_t *adv) {
    const unsigned char *p = (const unsigned char *)s;
    if (n == 0) {
        *adv = 0;
        return 0;
    }
    unsigned c = p[0];
    if (c < 0x80) {
        *adv = 1;
        return c;
    }
    int len = (c >= 0xF0 && c <= 0xF4) ? 4 : (c >= 0xE0) && c < 0xF0 ? 3 : (c >= 0xC2 && c < 0xE0) ? 2 : 0;
    if (len == 0 || (size_t)len > n) {
        *adv = 1;
        return 0xFFFD;
    }
    uint32_t cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
    for (int i = 1; i < len; i++) {
        if ((p[i] & 0xC0) != 0x80) {
            *adv = 1;
            return 0xFFFD;
        }
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) {
        *adv = 1;
        return 0xFFFD;
    }
    *adv = (size_t)len;
    return cp;
}

int mr__utf8_decode_valid(const unsigned char *s, int32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = (int32_t)c;
        return 1;
    }
    if (c < 0xE0) {
        *cp = (int32_t)(((c & 0x1F) << 6) | (s[1] & 0x3F));
        return 2;
    }
    if (c < 0xF0) {
        *cp = (int32_t)(((c & 0x0F) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3F));
        return 3;
    }
    *cp = (int32_t)(((c & 0x07) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3F));
    return 4;
}


size_t mr__utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}
