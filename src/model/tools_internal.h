/* tools_internal.h — private to src/model: helpers shared by the checkpoint
 * tools (gen-tiny, quantize): scratch folders renamed into place, atomic
 * JSON files. */
#ifndef MR_MODEL_TOOLS_INTERNAL_H
#define MR_MODEL_TOOLS_INTERNAL_H

#include <stddef.h>

#include <jansson.h>

#include "moerun/base.h"

/* Writes j (consumed: decref'd) as indented JSON plus a newline, atomically. */
mr_status mr__write_json_atomic(const char *path, json_t *j);
/* Removes a folder tree (best effort). */
void mr__rmtree(const char *path);
/* Creates "<dir>.tmp.XXXXXX" next to dir; out receives its path. */
mr_status mr__tmpdir_next_to(const char *dir, char *out, size_t n);
/* Renames the finished scratch folder onto dir (absent or empty). */
mr_status mr__publish_dir(const char *tmp, const char *dir);
/* The output rule of gen-tiny and quantize: dir must be absent or an empty
 * folder (nothing is ever replaced or merged); else MR_EIO naming why. */
mr_status mr__check_target_dir(const char *dir);
/* Draws a progress bar on stderr when it is a terminal (and enabled). */
void mr__progress(bool enabled, const char *what, int64_t done, int64_t total);

#endif
