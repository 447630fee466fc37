/* cli_model.c — see cli_model.h. */
#include "cli_model.h"

#include <errno.h>
#include <sys/types.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_ep.h"
#include "moerun/engine.h"
#include "moerun/model.h"

int mr_cli_parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        mr_error_set(MR_EINVAL, "'%s' is not an integer in [%ld, %ld]", s, lo, hi);
        return 1;
    }
    *out = v;
    return 0;
}

int mr_cli_parse_float(const char *s, float lo, float hi, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    /* ERANGE on underflow ("1e-45" is a subnormal, "1e-50" rounds to 0) is a number in
     * range all the same; on overflow v is +-inf, out of every range below */
    if (errno == ERANGE && isfinite(v)) errno = 0;
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        mr_error_set(MR_EINVAL, "'%s' is not a number in [%g, %g]", s, (double)lo, (double)hi);
        return 1;
    }
    *out = v;
    return 0;
}

int mr_cli_sampling_flag(int argc, char **argv, int *i, int mask, mr_sampling *sp) {
    enum { F_FLOAT, F_INT, F_SEED };
    static const struct {
        const char *flag;
        int set; /* MR_CLI_SAMPLING_BASIC or the rest of ALL */
        int kind;
        float lo, hi;
        size_t off;
    } flags[] = {
        {"--temperature", 1, F_FLOAT, 0.0f, 100.0f, offsetof(mr_sampling, temperature)},
        {"--top-k", 1, F_INT, 0, 0, offsetof(mr_sampling, top_k)},
        {"--top-p", 1, F_FLOAT, 1e-6f, 1.0f, offsetof(mr_sampling, top_p)},
        {"--seed", 1, F_SEED, 0, 0, offsetof(mr_sampling, seed)},
        {"--min-p", 2, F_FLOAT, 0.0f, 1.0f, offsetof(mr_sampling, min_p)},
        {"--repetition-penalty", 2, F_FLOAT, 1e-3f, 10.0f, offsetof(mr_sampling, repetition_penalty)},
        {"--presence-penalty", 2, F_FLOAT, -2.0f, 2.0f, offsetof(mr_sampling, presence_penalty)},
        {"--frequency-penalty", 2, F_FLOAT, -2.0f, 2.0f, offsetof(mr_sampling, frequency_penalty)},
    };
    const char *a = argv[*i];
    for (size_t f = 0; f < sizeof flags / sizeof flags[0]; f++) {
        if (!(flags[f].set & mask) || strcmp(a, flags[f].flag) != 0) continue;
        if (*i + 1 >= argc) return MR_CLI_FLAG_NO_VALUE;
        const char *v = argv[++*i];
        char *field = (char *)sp + flags[f].off;
        long l;
        float x;
        switch (flags[f].kind) {
        case F_FLOAT:
            if (mr_cli_parse_float(v, flags[f].lo, flags[f].hi, &x)) return MR_CLI_FLAG_BAD;
            memcpy(field, &x, sizeof x);
            break;
        case F_INT:
            if (mr_cli_parse_long(v, 0, 1 << 30, &l)) return MR_CLI_FLAG_BAD;
            *(int *)(void *)field = (int)l;
            break;
        default:
            if (mr_cli_parse_long(v, 0, INT64_MAX, &l)) return MR_CLI_FLAG_BAD;
            *(uint64_t *)(void *)field = (uint64_t)l;
            break;
        }
        return MR_CLI_FLAG_TAKEN;
    }
    return MR_CLI_FLAG_OTHER;
}

/* Copies up to 20 characters of s into buf for a message, stopping at the end
 * of the line; unprintable bytes become '?'. */
static const char *excerpt(const char *s, char *buf, size_t n) {
    size_t i = 0;
    for (; s[i] && s[i] != '\n' && s[i] != '\r' && i < 20 && i + 1 < n; i++)
        buf[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
    buf[i] = 0;
    return buf;
}

/* Appends the ids of one comma list; returns the count or -1. */
static int64_t parse_list(const char *s, mr_cli_prompts *p, int64_t *cap) {
    int64_t n = 0, base = p->n ? p->off[p->n - 1] + p->len[p->n - 1] : 0;
    const char *c = s;
    while (*c == ' ' || *c == '\t') c++;
    while (*c && *c != '\n' && *c != '\r') {
        char *end;
        errno = 0;
        long v = strtol(c, &end, 10);
        char ex[24];
        if (end == c || errno || v < 0 || v > INT32_MAX) {
            mr_error_set(MR_EINVAL, "bad token id near '%s' (expected non-negative integers separated by commas)",
                         excerpt(c, ex, sizeof ex));
            return -1;
        }
        if (base + n == *cap) {
            int64_t nc = *cap ? 2 * *cap : 64;
            int32_t *ids = realloc(p->ids, (size_t)nc * sizeof(int32_t));
            if (!ids) {
                mr_error_set(MR_ENOMEM, NULL);
                return -1;
            }
            p->ids = ids;
            *cap = nc;
        }
        p->ids[base + n++] = (int32_t)v;
        c = end;
        while (*c == ' ' || *c == '\t') c++;
        if (*c == ',') {
            c++;
            while (*c == ' ' || *c == '\t') c++;
            if (!*c || *c == '\n' || *c == '\r') {
                mr_error_set(MR_EINVAL, "the token id list ends with a comma");
                return -1;
            }
        } else if (*c && *c != '\n' && *c != '\r') {
            mr_error_set(MR_EINVAL, "unexpected '%s' in a token id list", excerpt(c, ex, sizeof ex));
            return -1;
        }
    }
    return n;
}

static int add_prompt(const char *s, mr_cli_prompts *p, int64_t *cap) {
    int64_t base = p->n ? p->off[p->n - 1] + p->len[p->n - 1] : 0;
    int64_t n = parse_list(s, p, cap);
    if (n < 0) return 1;
    if (n == 0) {
        mr_error_set(MR_EINVAL, "empty prompt");
        return 1;
    }
    int64_t *off = realloc(p->off, (size_t)(p->n + 1) * sizeof(int64_t));
    if (off) p->off = off;
    int64_t *len = realloc(p->len, (size_t)(p->n + 1) * sizeof(int64_t));
    if (len) p->len = len;
    if (!off || !len) {
        mr_error_set(MR_ENOMEM, NULL);
        return 1;
    }
    p->off[p->n] = base;
    p->len[p->n] = n;
    p->n++;
    return 0;
}

int mr_cli_prompts_read(const char *ids_list, const char *file, mr_cli_prompts *p) {
    memset(p, 0, sizeof *p);
    int64_t cap = 0;
    if (ids_list) return add_prompt(ids_list, p, &cap);
    FILE *f = fopen(file, "r");
    if (!f) {
        mr_error_set(MR_EIO, "cannot open %s: %s", file, strerror(errno));
        return 1;
    }
    char *line = NULL;
    size_t cap_line = 0;
    int rc = 0, ln = 0;
    while (!rc) {
        errno = 0;
        ssize_t got = getline(&line, &cap_line, f);
        if (got < 0) {
            if (ferror(f)) {
                mr_error_set(MR_EIO, "cannot read %s: %s", file, strerror(errno ? errno : EIO));
                rc = 1;
            }
            break;
        }
        ln++;
        if (strlen(line) != (size_t)got) {
            mr_error_set(MR_EINVAL, "%s:%d: the line holds a NUL byte (not a text file?)", file, ln);
            rc = 1;
            break;
        }
        if (p->n >= 1 << 20) {
            mr_error_set(MR_EINVAL, "%s: more than %d prompts", file, 1 << 20);
            rc = 1;
            break;
        }
        const char *c = line;
        while (*c == ' ' || *c == '\t') c++;
        if (*c == '\n' || *c == '\r' || !*c || *c == '#') continue;
        if (add_prompt(line, p, &cap)) {
            char d[300];
            snprintf(d, sizeof d, "%s", mr_error_last());
            mr_error_set(MR_EINVAL, "%s:%d: %s", file, ln, d);
            rc = 1;
        }
    }
    free(line);
    fclose(f);
    if (!rc && p->n == 0) {
        mr_error_set(MR_EINVAL, "%s holds no prompt", file);
        rc = 1;
    }
    return rc;
}

void mr_cli_prompts_free(mr_cli_prompts *p) {
    free(p->ids);
    free(p->off);
    free(p->len);
    memset(p, 0, sizeof *p);
}

int mr_cli_resolve(const char *cmd, const mr_options *o, bool explain, mr_resolution **r) {
    return mr_cli_resolve_to(cmd, o, explain, stdout, r);
}

int mr_cli_resolve_to(const char *cmd, const mr_options *o, bool explain, FILE *summary, mr_resolution **r) {
    *r = NULL;
    mr_status st = mr_resolve(o, r);
    if (st != MR_OK) {
        /* one line; the whole story only when asked for (--explain) */
        if (*r && mr_resolution_error(*r)[0])
            fprintf(stderr, "moerun %s: resolution failed: %s\n", mr_cli_who(cmd), mr_resolution_error(*r));
        else
            mr_cli_fail(cmd, "resolution failed");
        if (*r && explain) mr_resolution_explain(*r, stderr);
        return 1;
    }
    char line[1024];
    mr_resolution_summary(*r, line, sizeof line);
    fprintf(summary, "%s\n", line);
    if (explain) mr_resolution_explain(*r, summary);
    if (mr_exec_apply(mr_resolution_exec(*r)) != MR_OK) { /* threads and kernel ISA as resolved */
        mr_cli_fail(cmd, "cannot run the resolved configuration");
        return 1;
    }
    return 0;
}

static void on_fatal_signal(int sig) {
    mr_tools_remove_scratch();
    signal(sig, SIG_DFL); /* then die of it, so that the parent sees the signal */
    raise(sig);
}

void mr_cli_remove_scratch_on_signal(void) {
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old, sa;
        if (sigaction(sigs[i], NULL, &old) != 0 || old.sa_handler == SIG_IGN) continue; /* nohup & co. */
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_fatal_signal;
        sigemptyset(&sa.sa_mask);
        for (size_t j = 0; j < sizeof sigs / sizeof sigs[0]; j++) sigaddset(&sa.sa_mask, sigs[j]);
        sigaction(sigs[i], &sa, NULL);
    }
}

int mr_cli_engine_open(const char *cmd, const char *dir, const mr_exec *x, bool progress, int max_queued, mr_model **m,
                       mr_engine **e) {
    *m = NULL;
    *e = NULL;
    mr_engine_opts eo;
    mr_engine_opts_from_exec(x, &eo);
    if (max_queued > 0) eo.max_queued_requests = max_queued;
    /* expert parallel: the same configuration on every rank, the smallest engine limits */
    int rc = mr_cli_ep_check_exec(cmd, x, &eo);
    if (rc) return rc;
    mr_model_opts mo = {.exec = x, .progress = progress && mr_ep_rank() == 0};
    mr_engine_model_opts(&eo, &mo);
    if (mr_model_open(dir, &mo, m)) {
        mr_cli_fail(cmd, "cannot load the model");
        rc = 1;
    } else if (mr_engine_new(*m, &eo, e)) {
        mr_cli_fail(cmd, "cannot start the engine");
        rc = 1;
    }
    rc = mr_cli_ep_loaded(cmd, rc, *m); /* every rank loaded its experts (rank 0 prints where they are) */
    if (rc) {
        mr_engine_free(*e);
        mr_model_close(*m);
        *e = NULL;
        *m = NULL;
    }
    return rc;
}

void mr_cli_print_kv(const mr_engine *e) {
    const mr_engine_opts *o = mr_engine_opts_of(e);
    mr_model *m = mr_engine_model((mr_engine *)e);
    const bool f8 = mr_kv_elem_bytes(o->kv_dtype) == 1;
    printf("kv cache: %s%s, %lld blocks of %d tokens = %lld tokens, %.1f MiB; max %d running requests, %lld tokens "
           "per step, context %lld\n",
           mr_kv_dtype_name(o->kv_dtype),
           !f8 ? "" : mr_model_kv_scales(m) ? " (the checkpoint's k_scale / v_scale)" : " (scale 1)",
           (long long)o->kv_blocks, MR_KV_BLOCK_TOKENS,
           (long long)(o->kv_blocks * MR_KV_BLOCK_TOKENS), (double)mr_model_kv_bytes(m) / 1048576.0,
           o->max_running_requests, (long long)o->max_batch_tokens, (long long)o->context_length);
}

void mr_cli_print_memory(const struct mr_model *m) {
    mr_model_memory mm;
    mr_model_memory_get(m, &mm);
    const double G = 1e9, k = mm.kept > 0 ? (double)mm.kept : 1.0;
    /* without the KV allocation: a bound, since the KV pages in use count on the RSS side */
    const double kw = mm.kept > mm.kv ? (double)(mm.kept - mm.kv) : 1.0;
    const size_t rss = mr_mem_rss(), peak = mr_mem_rss_peak();
    printf("memory kept:   %.3f GB = weights in place %.3f + copies %.3f + experts %.3f + activations %.3f + KV %.3f + "
           "MoE workspace %.3f\n",
           (double)mm.kept / G, (double)mm.weights_mapped / G, (double)mm.weights_copied / G, (double)mm.experts / G,
           (double)mm.activations / G, (double)mm.kv / G, (double)mm.moe_workspace / G);
    printf("memory RSS:    load %.2f s: peak %.3f GB, at its end %.3f GB; now %.3f GB, peak %.3f GB; against kept "
           "%.3fx %.3fx %.3fx %.3fx, against kept without the KV allocation %.3fx %.3fx %.3fx %.3fx\n",
           mm.load_s, (double)mm.rss_peak_load / G, (double)mm.rss_load / G, (double)rss / G, (double)peak / G,
           (double)mm.rss_peak_load / k, (double)mm.rss_load / k, (double)rss / k, (double)peak / k,
           (double)mm.rss_peak_load / kw, (double)mm.rss_load / kw, (double)rss / kw, (double)peak / kw);
}
