/* tokenizer_regex.c — the regexes of tokenizer.json, run by PCRE2.
 *
 * huggingface/tokenizers runs its regexes with Oniguruma (Ruby syntax,
 * UTF-8, no options). PCRE2 with UTF + UCP agrees on the constructs that
 * tokenizer files use except for a few escapes, which are rewritten here
 * before compiling:
 *   \s \S   Oniguruma: White_Space (U+0009-000D, U+0085, Z*). PCRE2 also
 *           matches U+180E, so they become an explicit class.
 *   \w \W   Oniguruma: Alphabetic, M, Nd, Pc, and in Latin-1 also the
 *           superscripts 2 3 1 and the fractions 1/4 1/2 3/4 (its Latin-1
 *           ctype table; measured against tokenizers). PCRE2 10.42: L, N, '_'.
 *   \h \H   Oniguruma: hex digit. PCRE2: horizontal space.
 *   \uHHHH  Oniguruma's Unicode escape: \x{HHHH}.
 *   \p{^X}  Oniguruma's negated property: \P{X}.
 *   (?m)    Ruby's "dot matches newline": PCRE2's (?s).
 *   ^ $     Ruby anchors are per line: compiled with PCRE2_MULTILINE.
 * Inside a character class \S and \W keep PCRE2's meaning (a negated set
 * cannot be spelled inside a class); nested classes and && are refused.
 *
 * Matching mirrors Oniguruma's find_iter as tokenizers uses it: search from
 * the end of the previous match; an empty match right where the previous
 * match ended is skipped by advancing one character. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "text/tokenizer_internal.h"

#define WS_CLASS "\\t-\\r \\x{85}\\p{Z}"
#define WORD_CLASS "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}"
#define HEX_CLASS "0-9a-fA-F"

static mr_status put(mr__buf *o, const char *s) { return mr__buf_put(o, s, strlen(s)); }

mr_status mr__regex_translate(const char *p, size_t n, mr__buf *o) {
    mr_status st = MR_OK;
    int in_class = 0; /* 1 inside [...] */
    size_t i = 0;
    o->n = 0;
    if ((st = mr__buf_reserve(o, n + 16))) return st;
    o->p[0] = 0;
    while (i < n && !st) {
        char c = p[i];
        if (c == '\\') {
            if (i + 1 >= n) return mr_error_set(MR_EFORMAT, "regex ends with a lone backslash");
            char e = p[i + 1];
            const char *rep = NULL;
            switch (e) {
            case 's': rep = in_class ? WS_CLASS : "[" WS_CLASS "]"; break;
            case 'S': rep = in_class ? NULL : "[^" WS_CLASS "]"; break;
            case 'w': rep = in_class ? WORD_CLASS : "[" WORD_CLASS "]"; break;
            case 'W': rep = in_class ? NULL : "[^" WORD_CLASS "]"; break;
            case 'h': rep = in_class ? HEX_CLASS : "[" HEX_CLASS "]"; break;
            case 'H': rep = in_class ? NULL : "[^" HEX_CLASS "]"; break;
            default: break;
            }
            if (rep) {
                st = put(o, rep);
                i += 2;
                continue;
            }
            if (e == 'u') {
                size_t k = 0;
                while (k < 4 && i + 2 + k < n && strchr("0123456789abcdefABCDEF", p[i + 2 + k]) && p[i + 2 + k])
                    k++;
                if (k != 4) return mr_error_set(MR_EFORMAT, "regex escape \\u needs four hex digits");
                char tmp[16];
                snprintf(tmp, sizeof tmp, "\\x{%.4s}", p + i + 2);
                st = put(o, tmp);
                i += 6;
                continue;
            }
            if ((e == 'p' || e == 'P') && i + 3 < n && p[i + 2] == '{' && p[i + 3] == '^') {
                st = put(o, e == 'p' ? "\\P{" : "\\p{");
                i += 4;
                continue;
            }
            /* any other escape: copy the backslash and the next character
             * (whole, if it is multi-byte); \x{..} \p{..} copy on as text */
            size_t l = 1;
            unsigned char u = (unsigned char)e;
            if (u >= 0xC0) l = u >= 0xF0 ? 4 : u >= 0xE0 ? 3 : 2;
            if (i + 1 + l > n) l = n - i - 1;
            st = mr__buf_put(o, p + i, 1 + l);
            i += 1 + l;
            continue;
        }
        if (in_class) {
            if (c == '[') {
                if (i + 1 < n && p[i + 1] == ':') { /* POSIX class [:alpha:] */
                    const char *end = NULL;
                    for (size_t k = i + 2; k + 1 < n; k++)
                        if (p[k] == ':' && p[k + 1] == ']') {
                            end = p + k + 2;
                            break;
                        }
                    if (!end) return mr_error_set(MR_EFORMAT, "regex: unterminated POSIX class");
                    st = mr__buf_put(o, p + i, (size_t)(end - (p + i)));
                    i = (size_t)(end - p);
                    continue;
                }
                return mr_error_set(MR_EUNSUPPORTED, "regex: nested character classes (Oniguruma) are not supported");
            }
            if (c == '&' && i + 1 < n && p[i + 1] == '&')
                return mr_error_set(MR_EUNSUPPORTED, "regex: class intersection && is not supported");
            if (c == ']') in_class = 0;
            st = mr__buf_put(o, &c, 1);
            i++;
            continue;
        }
        if (c == '[') {
            in_class = 1;
            st = mr__buf_put(o, &c, 1);
            i++;
            /* a leading ^ and a leading ] are literal parts of the class */
            if (i < n && p[i] == '^' && !st) {
                st = mr__buf_put(o, "^", 1);
                i++;
            }
            if (i < n && p[i] == ']' && !st) {
                st = mr__buf_put(o, "]", 1);
                i++;
            }
            continue;
        }
        if (c == '(' && i + 1 < n && p[i + 1] == '?') {
            /* option group (?imx-imx) or (?imx-imx:...): Ruby m -> PCRE2 s */
            size_t k = i + 2;
            while (k < n && (p[k] == 'i' || p[k] == 'm' || p[k] == 'x' || p[k] == '-')) k++;
            if (k > i + 2 && k < n && (p[k] == ')' || p[k] == ':')) {
                st = put(o, "(?");
                for (size_t q = i + 2; q < k && !st; q++) st = mr__buf_put(o, p[q] == 'm' ? "s" : p + q, 1);
                i = k;
                continue;
            }
        }
        st = mr__buf_put(o, &c, 1);
        i++;
    }
    if (!st && in_class) return mr_error_set(MR_EFORMAT, "regex: unterminated character class");
    return st;
}

mr_status mr__regex_compile(mr__regex *re, const char *pat, size_t len, bool literal, const char *what) {
    mr__buf tr = {0};
    mr_status st = MR_OK;
    memset(re, 0, sizeof *re);
    const char *src = pat;
    size_t srclen = len;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_NEVER_BACKSLASH_C;
    if (literal) {
        opts = PCRE2_UTF | PCRE2_LITERAL;
    } else {
        if ((st = mr__regex_translate(pat, len, &tr))) {
            mr_error_set(st, "%s: %s", what, mr_error_last());
            goto out;
        }
        src = tr.p;
        srclen = tr.n;
        opts |= PCRE2_MULTILINE;
    }
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (!cc) {
        st = MR_ENOMEM;
        goto out;
    }
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
    int err = 0;
    PCRE2_SIZE erroff = 0;
    re->code = pcre2_compile((PCRE2_SPTR)src, srclen, opts, &err, &erroff, cc);
    pcre2_compile_context_free(cc);
    if (!re->code) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        st = mr_error_set(MR_EFORMAT, "%s: bad regex \"%.80s\": %s (at offset %zu)", what, pat, (const char *)msg,
                          (size_t)erroff);
        goto out;
    }
    re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
out:
    mr__buf_free(&tr);
    return st;
}

void mr__regex_free(mr__regex *re) {
    if (re->code) pcre2_code_free(re->code);
    re->code = NULL;
}

/* One match context for every match: it bounds backtracking, so that a
 * hostile regex in a tokenizer file fails a match instead of hanging it. It
 * is only read while matching, so threads share it. */
#define MATCH_LIMIT 10000000u
static pcre2_match_context *match_ctx;
static pthread_once_t match_once = PTHREAD_ONCE_INIT;
static void match_ctx_init(void) {
    match_ctx = pcre2_match_context_create(NULL);
    if (match_ctx) {
        pcre2_set_match_limit(match_ctx, MATCH_LIMIT);
        pcre2_set_depth_limit(match_ctx, MATCH_LIMIT);
        pcre2_set_heap_limit(match_ctx, 64u * 1024); /* KiB */
    }
}

static int run(const mr__regex *re, pcre2_match_data *md, const char *s, size_t n, size_t start) {
    int rc;
    pthread_once(&match_once, match_ctx_init);
    if (!match_ctx) return PCRE2_ERROR_NOMEMORY;
    if (re->jit) {
        rc = pcre2_jit_match(re->code, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, md, match_ctx);
        if (rc != PCRE2_ERROR_JIT_STACKLIMIT) return rc;
    }
    return pcre2_match(re->code, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, md, match_ctx);
}

mr_status mr__regex_each(const mr__regex *re, pcre2_match_data *md, const char *s, size_t n, mr__match_fn fn,
                         void *ctx) {
    size_t last_end = 0;
    bool have_last = false;
    size_t last_match_end = 0;
    while (last_end <= n) {
        int rc = run(re, md, s, n, last_end);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return mr_error_set(MR_EINPUT, "regex match failed at byte %zu: %s", last_end, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me < ms) return mr_error_set(MR_EINPUT, "regex match ends before it starts (\\K in a lookahead)");
        if (ms == me && have_last && last_match_end == me) {
            if (last_end >= n) break;
            size_t bad;
            bool trunc;
            int l = mr__utf8_seq((const unsigned char *)s + last_end, n - last_end, &bad, &trunc);
            last_end += l > 0 ? (size_t)l : 1;
            continue;
        }
        last_end = me;
        have_last = true;
        last_match_end = me;
        mr_status st = fn(ms, me, ctx);
        if (st) return st;
    }
    return MR_OK;
}
