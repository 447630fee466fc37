/* json_internal.h — private to libmoerun: the one place where JSON text is
 * parsed (config.json, hf_quant_config.json, generation_config.json, the
 * sharded index, safetensors headers). The wrappers route jansson's
 * allocations through mr_malloc/mr_free (installed once, thread-safe), so that
 * allocation fault injection reaches JSON parsing, and they tell an
 * allocation failure apart from bad text: jansson reports a failed
 * allocation in the middle of parsing as a syntax error. */
#ifndef MR_BASE_JSON_INTERNAL_H
#define MR_BASE_JSON_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "moerun/base.h"

/* Each returns the parsed value, or NULL with err filled in and *oom set to
 * true when the failure was (or followed) an allocation failure; callers then
 * report MR_ENOMEM, not a syntax error. oom may be NULL. */
json_t *mr__json_loads(const char *text, size_t flags, json_error_t *err, bool *oom);
json_t *mr__json_loadb(const char *buf, size_t n, size_t flags, json_error_t *err, bool *oom);
json_t *mr__json_load_file(const char *path, size_t flags, json_error_t *err, bool *oom);

#endif
