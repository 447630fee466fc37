/* serve_testutil.h — helpers of the end-to-end server suites (included once
 * by each): start `moerun serve` on a free loopback port (--port 0, the port
 * read from its log) and stop it, plain HTTP calls through libcurl, and the
 * check of the section-3 error shape. */
#ifndef MR_SERVE_TESTUTIL_H
#define MR_SERVE_TESTUTIL_H

#include <curl/curl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "serve/serve_internal.h"
#include "testutil.h"

#define MOERUN MR_BINARY_DIR "/moerun"

/* A whole file as a NUL-terminated string (free), or NULL. */
static char *read_text(const char *path) {
    size_t n = 0;
    char *p = tu_read_file(path, &n);
    if (!p) return NULL;
    char *t = realloc(p, n + 1);
    if (!t) {
        free(p);
        return NULL;
    }
    t[n] = 0;
    return t;
}

typedef struct {
    pid_t pid;
    char url[64];
    char log[4096];
} server;

static char *g_dir;  /* scratch */
static server g_srv; /* the suite's server */

/* ---- the server process ---- */

static int srv_start(server *s, const char *const *extra) {
    snprintf(s->log, sizeof s->log, "%s/serve_%d.log", g_dir, (int)getpid() + rand() % 100000);
    const char *argv[64];
    int n = 0;
    argv[n++] = MOERUN;
    argv[n++] = "serve";
    argv[n++] = "--port";
    argv[n++] = "0";
    for (int i = 0; extra && extra[i] && n < 62; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    s->pid = fork();
    if (s->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a test that crashed or failed */
        FILE *f = freopen(s->log, "w", stdout);
        if (!f || dup2(fileno(stdout), 2) < 0) _exit(127);
        setenv("OMP_NUM_THREADS", "1", 1);
        execv(MOERUN, (char *const *)argv);
        _exit(127);
    }
    for (int i = 0; i < 6000; i++) { /* up to 60 s (sanitizer builds are slow to start) */
        char *t = read_text(s->log);
        char *p = t ? strstr(t, "ready on http://") : NULL;
        if (p) {
            char host[32];
            int port = 0;
            sscanf(p, "ready on http://%31[^:]:%d", host, &port);
            snprintf(s->url, sizeof s->url, "http://127.0.0.1:%d", port);
            free(t);
            return 0;
        }
        free(t);
        int st;
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            s->pid = 0;
            return -1;
        }
        usleep(10000);
    }
    return -1;
}

/* Stops with SIGTERM; returns the exit status (or 128 + signal). */
static int srv_stop(server *s) {
    if (s->pid <= 0) return -1;
    kill(s->pid, SIGTERM);
    int st = 0;
    waitpid(s->pid, &st, 0);
    s->pid = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static bool log_has(const server *s, const char *what) {
    char *t = read_text(s->log);
    bool r = t && strstr(t, what);
    free(t);
    return r;
}

/* srv_start, printing the server's log when it does not start. */
static int srv_start_logged(server *s, const char *const *extra) {
    if (srv_start(s, extra) == 0) return 0;
    char *t = read_text(s->log);
    fprintf(stderr, "the server did not start:\n%s\n", t ? t : "");
    free(t);
    return -1;
}

/* srv_stop; 0 when the server exited 0 with a clean log (no sanitizer report, its stop line),
 * else -1 after printing the exit status and the log. */
static int srv_stop_clean(server *s) {
    int rc = srv_stop(s);
    bool clean = !log_has(s, "ERROR: AddressSanitizer") && !log_has(s, "runtime error:") &&
                 !log_has(s, "LeakSanitizer") && log_has(s, "moerun serve: stopped");
    if (rc == 0 && clean) return 0;
    char *t = read_text(s->log);
    fprintf(stderr, "server exit %d, log:\n%s\n", rc, t ? t : "");
    free(t);
    return -1;
}

/* ---- HTTP ---- */

static size_t sink(char *p, size_t sz, size_t nm, void *ud) {
    sv_buf *b = ud;
    return sv_buf_add(b, p, sz * nm) ? 0 : sz * nm;
}

/* method GET when body is NULL. Returns the status; *out is the body (free). */
static long http(const char *base, const char *path, const char *body, char **out) {
    CURL *h = curl_easy_init();
    char url[512];
    snprintf(url, sizeof url, "%s%s", base, path);
    sv_buf b = {0};
    struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    if (body) curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 120L);
    long code = 0;
    if (curl_easy_perform(h) == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(h);
    curl_slist_free_all(hd);
    sv_buf_lit(&b, "");
    if (out) *out = b.p;
    else sv_buf_free(&b);
    return code;
}

static json_t *http_json(const char *base, const char *path, const char *body, long *code) {
    char *t = NULL;
    *code = http(base, path, body, &t);
    json_error_t je;
    json_t *j = t ? json_loads(t, 0, &je) : NULL;
    if (!j) fprintf(stderr, "not JSON (%ld): %s\n", *code, t ? t : "(none)");
    free(t);
    return j;
}

/* The error body of section 3, with the expected status, type and param. */
static void expect_error(const char *path, const char *body, long want, const char *type, const char *param,
                         const char *msg) {
    long code;
    json_t *j = http_json(g_srv.url, path, body, &code);
    json_t *e = json_object_get(j, "error");
    const char *m = json_string_value(json_object_get(e, "message"));
    const char *p = json_string_value(json_object_get(e, "param"));
    if (code != want || !m || strcmp(json_string_value(json_object_get(e, "type")), type) ||
        (param ? !p || strcmp(p, param) : !json_is_null(json_object_get(e, "param"))) || (msg && !strstr(m, msg)) ||
        json_integer_value(json_object_get(e, "code")) != want) {
        char *d = j ? json_dumps(j, 0) : NULL;
        fprintf(stderr, "POST %s %s\n  -> %ld %s\n  want %ld %s param %s ~ %s\n", path, body ? body : "(GET)", code,
                d ? d : "", want, type, param ? param : "null", msg ? msg : "");
        free(d);
        fail();
    }
    json_decref(j);
}

#endif
