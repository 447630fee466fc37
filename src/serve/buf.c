/* buf.c — the growable byte buffer of the response builders, and JSON string
 * literals written straight into it (the SSE path writes one chunk per token
 * without building a jansson tree). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "serve/serve_internal.h"

static int reserve(sv_buf *b, size_t extra) {
    size_t need;
    if (!mr_size_add(b->len, extra, &need) || !mr_size_add(need, 1, &need)) return -1;
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) {
        if (!mr_size_mul(cap, 2, &cap)) return -1;
    }
    char *p = mr_realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

int sv_buf_add(sv_buf *b, const char *s, size_t n) {
    if (reserve(b, n)) return -1;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

int sv_buf_printf(sv_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || reserve(b, (size_t)n)) return -1;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

void sv_buf_free(sv_buf *b) {
    mr_free(b->p);
    *b = (sv_buf){0};
}

/* Length of the valid UTF-8 sequence at s[0..n) (1..4), or 0 if invalid. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t k;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) k = 2, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) k = 3, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) k = 4, min = 0x10000;
    else return 0;
    if (n < k) return 0;
    unsigned cp = c & (0xFFu >> (k + 1));
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return k;
}

int sv_buf_json_str(sv_buf *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    /* worst case: every byte becomes \u00XX (6) or U+FFFD (3) */
    size_t worst;
    if (!mr_size_mul(n, 6, &worst) || !mr_size_add(worst, 2, &worst) || reserve(b, worst)) return -1;
    char *o = b->p + b->len;
    *o++ = '"';
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        if (c >= 0x80) {
            size_t k = utf8_len(u + i, n - i);
            if (!k) { /* invalid byte: U+FFFD */
                *o++ = (char)0xEF, *o++ = (char)0xBF, *o++ = (char)0xBD;
                i++;
                continue;
            }
            memcpy(o, u + i, k);
            o += k;
            i += k;
            continue;
        }
        i++;
        switch (c) {
        case '"': *o++ = '\\', *o++ = '"'; break;
        case '\\': *o++ = '\\', *o++ = '\\'; break;
        case '\n': *o++ = '\\', *o++ = 'n'; break;
        case '\r': *o++ = '\\', *o++ = 'r'; break;
        case '\t': *o++ = '\\', *o++ = 't'; break;
        default:
            if (c < 0x20 || c == 0x7f) {
                *o++ = '\\', *o++ = 'u', *o++ = '0', *o++ = '0', *o++ = hex[c >> 4], *o++ = hex[c & 15];
            } else {
                *o++ = (char)c;
            }
        }
    }
    *o++ = '"';
    b->len = (size_t)(o - b->p);
    b->p[b->len] = 0;
    return 0;
}

int sv_buf_base64(sv_buf *b, const void *p, size_t n) {
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const unsigned char *s = p;
    char q[4];
    for (size_t i = 0; i < n; i += 3) {
        const unsigned v = (unsigned)s[i] << 16 | (i + 1 < n ? (unsigned)s[i + 1] << 8 : 0) | (i + 2 < n ? s[i + 2] : 0);
        q[0] = A[v >> 18 & 63], q[1] = A[v >> 12 & 63];
        q[2] = i + 1 < n ? A[v >> 6 & 63] : '=';
        q[3] = i + 2 < n ? A[v & 63] : '=';
        if (sv_buf_add(b, q, 4)) return -1;
    }
    return 0;
}
