/* io_internal.h — private helpers shared by the io/ sources: opening a file
 * under an index-given display name, UTF-8 validation, and routing jansson's
 * allocations through mr_malloc (so fault injection reaches JSON parsing). */
#ifndef MR_IO_INTERNAL_H
#define MR_IO_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "moerun/io.h"

/* mr_st_open with the short name listings show (NULL: last path component). */
mr_status mr__st_open_named(const char *path, const char *display, mr_st_file **out);

/* Strict UTF-8 check (no overlongs, surrogates or code points above
 * U+10FFFF). Returns true if valid; else false and *bad = offset of the
 * first invalid byte. */
bool mr__utf8_valid(const unsigned char *s, size_t n, size_t *bad);

/* Makes jansson allocate through mr_malloc/mr_free (once, thread-safe) and
 * clears this thread's "a JSON allocation failed" flag; call before parsing.
 * jansson reports a failed allocation during parsing as a syntax error, so
 * after a failed parse check mr__io_json_oom() first. */
void mr__io_json_begin(void);
bool mr__io_json_oom(void);

#endif
