/* tools_util.c — helpers of the checkpoint tools (gen-tiny, quantize):
 * atomic JSON files, scratch folders next to the target renamed into place
 * when complete (and a registry of the live ones, so that a signal handler
 * can remove them: mr_tools_remove_scratch), a terminal-only progress bar. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
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

/* ---- live scratch folders ----
 * A slot is written (path, then live = 1) by the thread that creates the
 * folder and read by a signal handler, which only looks at slots marked
 * live. gen-tiny of a quantized form holds two at once (its bf16 folder and
 * the quantizer's output). */
#define MR_SCRATCH_SLOTS 4
static char scratch_path[MR_SCRATCH_SLOTS][4096];
static volatile sig_atomic_t scratch_live[MR_SCRATCH_SLOTS];

static void scratch_remember(const char *path) {
    if (strlen(path) >= sizeof scratch_path[0]) return;
    for (int i = 0; i < MR_SCRATCH_SLOTS; i++) {
        if (scratch_live[i]) continue;
        memcpy(scratch_path[i], path, strlen(path) + 1);
        __atomic_signal_fence(__ATOMIC_SEQ_CST); /* the path is complete before a handler can see the slot */
        scratch_live[i] = 1;
        return;
    }
}

static void scratch_forget(const char *path) {
    for (int i = 0; i < MR_SCRATCH_SLOTS; i++)
        if (scratch_live[i] && !strcmp(scratch_path[i], path)) scratch_live[i] = 0;
}

/* Removes everything inside the open folder dfd, then nothing else; only
 * async-signal-safe calls (getdents64, unlinkat, openat, close). */
static void rm_contents_at(int dfd, int depth) {
    char buf[4096] __attribute__((aligned(8)));
    for (;;) {
        ssize_t n = getdents64(dfd, buf, sizeof buf);
        if (n <= 0) return;
        for (ssize_t o = 0; o < n;) {
            struct dirent64 *e = (struct dirent64 *)(void *)(buf + o);
            o += e->d_reclen;
            const char *nm = e->d_name;
            if (!strcmp(nm, ".") || !strcmp(nm, "..")) continue;
            if (unlinkat(dfd, nm, 0) == 0 || depth >= 8) continue;
            int sub = openat(dfd, nm, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0) continue;
            rm_contents_at(sub, depth + 1);
            close(sub);
            unlinkat(dfd, nm, AT_REMOVEDIR);
        }
    }
}

void mr_tools_remove_scratch(void) {
    for (int i = 0; i < MR_SCRATCH_SLOTS; i++) {
        if (!scratch_live[i]) continue;
        /* the writing thread may add a file meanwhile: retry a few times */
        for (int tries = 0; tries < 16; tries++) {
            int dfd = open(scratch_path[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (dfd < 0) break;
            rm_contents_at(dfd, 0);
            close(dfd);
            if (rmdir(scratch_path[i]) == 0 || errno == ENOENT) break;
        }
    }
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}
void mr__rmtree(const char *path) {
    if (path && *path) {
        nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
        scratch_forget(path);
    }
}

mr_status mr__tmpdir_next_to(const char *dir, char *out, size_t n) {
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--;
    if (snprintf(out, n, "%.*s.tmp.XXXXXX", (int)len, dir) >= (int)n)
        return mr_error_set(MR_EINVAL, "path too long: %s", dir);
    if (!mkdtemp(out)) return mr_error_set(MR_EIO, "cannot create a scratch folder next to %s: %s", dir, strerror(errno));
    scratch_remember(out);
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
    scratch_forget(tmp); /* after the rename: a signal in between finds no folder, which is harmless */
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
