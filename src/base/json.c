/* json.c — the JSON parse wrappers of json_internal.h: jansson allocates
 * through mr_malloc/mr_free, and a per-thread flag records an allocation
 * failure during a parse so that it is reported as MR_ENOMEM. */
#include <pthread.h>
#include <stdio.h>

#include "base/json_internal.h"

static _Thread_local bool json_oom;

static void *json_alloc(size_t n) {
    void *p = mr_malloc(n);
    if (p == NULL) json_oom = true;
    return p;
}

static pthread_once_t json_once = PTHREAD_ONCE_INIT;
static void json_init_once(void) { json_set_alloc_funcs(json_alloc, mr_free); }

static void begin(void) {
    pthread_once(&json_once, json_init_once);
    json_oom = false;
}

static json_t *end(json_t *root, json_error_t *err, bool *oom) {
    bool o = root == NULL && (json_oom || json_error_code(err) == json_error_out_of_memory);
    /* jansson's words name its own flag; say what the input holds (the text stays NUL-free: a string of
     * this project's never holds U+0000) */
    if (root == NULL && err && json_error_code(err) == json_error_null_character)
        snprintf(err->text, sizeof err->text, "a string holds \\u0000 (NUL), which is not accepted");
    if (oom) *oom = o;
    if (o) mr_error_set(MR_ENOMEM, NULL);
    return root;
}

json_t *mr__json_loads(const char *text, size_t flags, json_error_t *err, bool *oom) {
    begin();
    return end(json_loads(text, flags, err), err, oom);
}

json_t *mr__json_loadb(const char *buf, size_t n, size_t flags, json_error_t *err, bool *oom) {
    begin();
    return end(json_loadb(buf, n, flags, err), err, oom);
}

json_t *mr__json_load_file(const char *path, size_t flags, json_error_t *err, bool *oom) {
    begin();
    return end(json_load_file(path, flags, err), err, oom);
}
