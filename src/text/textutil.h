/* textutil.h — private to src/text: the byte buffer and UTF-8 primitives
 * that the tokenizer, the templates and the parsers share (textutil.c). */
#ifndef MR_TEXT_TEXTUTIL_H
#define MR_TEXT_TEXTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moerun/base.h"

/* A growable byte buffer (mr_malloc'd), always NUL-terminated after n bytes. */
typedef struct {
    char *p;
    size_t n, cap;
} mr__buf;
mr_status mr__buf_reserve(mr__buf *b, size_t extra);
mr_status mr__buf_put(mr__buf *b, const void *s, size_t n);
bool mr__buf_add(mr__buf *b, const char *p, size_t n); /* mr__buf_put; false on failure */
bool mr__buf_addc(mr__buf *b, char c);
void mr__buf_free(mr__buf *b);

/* One code point from p[0, n): invalid, overlong, surrogate or truncated
 * sequences give U+FFFD with *adv = 1; n == 0 gives 0 with *adv = 0. */
uint32_t mr__utf8_decode(const char *p, size_t n, size_t *adv);
/* One code point from UTF-8 that is known to be valid; returns its length. */
int mr__utf8_decode_valid(const unsigned char *s, int32_t *cp);
/* Encodes cp (<= U+10FFFF) into out; returns its length 1..4. */
size_t mr__utf8_encode(uint32_t cp, char out[4]);

#endif
