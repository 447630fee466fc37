/* io_util.c — small helpers for io/: strict UTF-8 validation and the jansson
 * allocator hook (jansson then allocates through mr_malloc, so allocation
 * fault injection also reaches JSON parsing). */
#include <jansson.h>
#include <pthread.h>

#include "io_internal.h"

bool mr__utf8_valid(const unsigned char *s, size_t n, size_t *bad) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len;
        unsigned cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            cp = c & 0x07;
        } else {
            goto fail;
        }
        if (n - i < len) goto fail;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) goto fail;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            goto fail;
        i += len;
    }
    return true;
fail:
    if (bad) *bad = i;
    return false;
}

/* jansson reports a failed allocation in the middle of parsing as a syntax
 * error, so the allocator records it in a thread-local flag that callers
 * check after a failed parse. */
static _Thread_local bool json_oom;
static void *json_alloc(size_t n) {
    void *p = mr_malloc(n);
    if (p == NULL) json_oom = true;
    return p;
}

static pthread_once_t json_once = PTHREAD_ONCE_INIT;
static void json_init_once(void) { json_set_alloc_funcs(json_alloc, mr_free); }

void mr__io_json_begin(void) {
    pthread_once(&json_once, json_init_once);
    json_oom = false;
}

bool mr__io_json_oom(void) { return json_oom; }
