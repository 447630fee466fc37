/* io_internal.h — private helpers shared by the io/ sources: opening a file
 * under an index-given display name and UTF-8 validation. JSON is parsed
 * through base/json_internal.h (allocation failures reported as MR_ENOMEM). */
#ifndef MR_IO_INTERNAL_H
#define MR_IO_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "base/json_internal.h"
#include "moerun/io.h"

/* mr_st_open with the short name listings show (NULL: last path component). */
mr_status mr__st_open_named(const char *path, const char *display, mr_st_file **out);

/* Strict UTF-8 check (no overlongs, surrogates or code points above
 * U+10FFFF). Returns true if valid; else false and *bad = offset of the
 * first invalid byte. */
bool mr__utf8_valid(const unsigned char *s, size_t n, size_t *bad);

#endif
