/* tools_util.c — helpers of the checkpoint tools (gen-tiny, quantize):
 * atomic JSON files, scratch folders next to the target renamed into place
 * when complete, a terminal-only progress bar. */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/tools_internal.h"
#include "moerun/io.h"

mr_status mr__write_json_atomic(const char *path, json_t *j) {
    if (!j) return MR_ENOMEM;
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (!s) return MR_ENOMEM;
    size_t n = strlen(s);
    char *t = malloc(n + 2);
    if (!t) {
        free(s);
        return MR_ENOMEM;
    }
    memcpy(t, s, n);
    t[n] = '\n';
    free(s);
    mr_status st = mr_write_file_atomic(path, t, n + 1);
    free(t);
    return st;
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}
void mr__rmtree(const char *path) {
    if (path && *path) nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

mr_status mr__tmpdir_next_to(const char *dir, char *out, size_t n) {
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--;
    if (snprintf(out, n, "%.*s.tmp.XXXXXX", (int)len, dir) >= (int)n)
        return mr_error_set(MR_EINVAL, "path too long: %s", dir);
    if (!mkdtemp(out)) return mr_error_set(MR_EIO, "cannot create a scratch folder next to %s: %s", dir, strerror(errno));
    return MR_OK;
}

/* Moves the finished scratch folder onto dir (which must be absent or an empty folder). */
mr_status mr__publish_dir(const char *tmp, const char *dir) {
    mode_t um = umask(0);
    umask(um);
    chmod(tmp, 0777 & ~um); /* mkdtemp made it 0700 */
    if (rename(tmp, dir) != 0) {
        int e = errno;
        return mr_error_set(MR_EIO, "cannot move the finished checkpoint into %s: %s%s", dir, strerror(e),
                            (e == ENOTEMPTY || e == EEXIST) ? " (the folder exists and is not empty)" : "");
    }
    return MR_OK;
}

mr_status mr__check_target_dir(const char *dir) {
    struct stat sb;
    if (!dir || !*dir) return mr_error_set(MR_EINVAL, "the output folder name is empty");
    if (lstat(dir, &sb) != 0) {
        if (errno == ENOENT) return MR_OK;
        return mr_error_set(MR_EIO, "%s: %s", dir, strerror(errno));
    }
    if (!S_ISDIR(sb.st_mode)) return mr_error_set(MR_EIO, "%s exists and is not a folder", dir);
    char p[4096];
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (access(p, F_OK) == 0)
        return mr_error_set(MR_EIO, "%s already holds a checkpoint (config.json); it is never replaced", dir);
    DIR *d = opendir(dir);
    if (!d) return mr_error_set(MR_EIO, "cannot read the folder %s: %s", dir, strerror(errno));
    struct dirent *e;
    const char *found = NULL;
    while (!found && (e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) found = e->d_name;
    if (found) {
        mr_error_set(MR_EIO, "%s exists and is not empty (it holds %.200s); the output must be a new or empty folder",
                     dir, found);
        closedir(d);
        return MR_EIO;
    }
    closedir(d);
    return MR_OK;
}

void mr__progress(bool enabled, const char *what, int64_t done, int64_t total) {
    if (!enabled || !isatty(2)) return;
    int w = 30, f = (int)(done * w / (total > 0 ? total : 1));
    fprintf(stderr, "\r%s [%.*s%*s] %lld/%lld", what, f, "==============================", w - f, "", (long long)done,
            (long long)total);
    if (done >= total) fprintf(stderr, "\n");
    fflush(stderr);
}
