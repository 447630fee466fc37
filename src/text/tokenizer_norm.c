/* tokenizer_norm.c — normalizers (tokenizers' normalizers/): NFC, NFD, NFKC
 * and NFKD by utf8proc, Lowercase (Rust char::to_lowercase: the full
 * mapping, so U+0130 becomes "i\u0307"), Replace (every match of a string or
 * a regex, empty matches included), Prepend (only to a non-empty string),
 * Strip (White_Space at either end) and StripAccents (drops every
 * General_Category M character, as unicode-normalization's is_combining_mark), applied in order as a Sequence. Input and output are valid UTF-8;
 * offsets are not tracked (moerun does not report them). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "text/tokenizer_internal.h"

static mr_status map_segment(const char *s, size_t n, utf8proc_option_t opt, mr__buf *out) {
    if (n > (size_t)PTRDIFF_MAX / 8) return mr_error_set(MR_EINPUT, "text too long to normalize");
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, opt | UTF8PROC_STABLE);
    if (r < 0) {
        if (r == UTF8PROC_ERROR_NOMEM) return MR_ENOMEM;
        return mr_error_set(MR_EINPUT, "normalization failed: %s", utf8proc_errmsg(r));
    }
    mr_status st = mr__buf_put(out, dst, (size_t)r);
    free(dst);
    return st;
}

/* NFC/NFD/NFKC/NFKD. An ASCII character is a starter that never composes
 * with what comes before it and is its own normal form, so the text splits
 * before every ASCII character into pieces that normalize independently:
 * ASCII is copied, and each stretch "one ASCII character (if any) + the
 * non-ASCII characters after it" goes to utf8proc alone. */
static mr_status unicode_form(const char *s, size_t n, utf8proc_option_t opt, mr__buf *out) {
    out->n = 0;
    mr_status st = mr__buf_reserve(out, n);
    if (st) return st;
    out->p[0] = 0;
    size_t i = 0, copied = 0;
    while (i < n) {
        if (!((unsigned char)s[i] & 0x80)) {
            i++;
            continue;
        }
        size_t b = i > copied ? i - 1 : i; /* the ASCII character before belongs to the stretch */
        size_t e = i;
        while (e < n && ((unsigned char)s[e] & 0x80)) e++;
        if ((st = mr__buf_put(out, s + copied, b - copied)) || (st = map_segment(s + b, e - b, opt, out))) return st;
        copied = i = e;
    }
    return mr__buf_put(out, s + copied, n - copied);
}

static mr_status lowercase(const char *s, size_t n, mr__buf *out) {
    out->n = 0;
    mr_status st = mr__buf_reserve(out, n);
    if (st) return st;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) {
            char l = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
            if ((st = mr__buf_put(out, &l, 1))) return st;
            i++;
            continue;
        }
        int32_t cp;
        int l = mr__utf8_decode_valid((const unsigned char *)s + i, &cp);
        i += (size_t)l;
        char enc[8];
        int m;
        if (cp == 0x130) { /* SpecialCasing: the one unconditional multi-char lowercase */
            memcpy(enc, "i\xCC\x87", 3);
            m = 3;
        } else {
            m = mr__utf8_encode(utf8proc_tolower(cp), enc);
        }
        if ((st = mr__buf_put(out, enc, (size_t)m))) return st;
    }
    return MR_OK;
}

typedef struct {
    const char *s;
    mr__buf *out;
    size_t pos;
    const mr__norm_step *step;
} repl_ctx;

static mr_status repl_match(size_t ms, size_t me, void *vctx) {
    repl_ctx *c = vctx;
    mr_status st = mr__buf_put(c->out, c->s + c->pos, ms - c->pos);
    if (!st) st = mr__buf_put(c->out, c->step->str, c->step->str_len);
    c->pos = me;
    return st;
}

static mr_status replace(const mr__norm_step *step, pcre2_match_data *md, const char *s, size_t n, mr__buf *out) {
    out->n = 0;
    mr_status st = mr__buf_reserve(out, n);
    if (st) return st;
    out->p[0] = 0;
    repl_ctx c = {s, out, 0, step};
    if ((st = mr__regex_each(&step->re, md, s, n, repl_match, &c))) return st;
    return mr__buf_put(out, s + c.pos, n - c.pos);
}

static mr_status strip(const mr__norm_step *step, const char *s, size_t n, mr__buf *out) {
    size_t b = 0, e = n;
    if (step->left) {
        while (b < e) {
            int32_t cp;
            int l = mr__utf8_decode_valid((const unsigned char *)s + b, &cp);
            if (!mr__is_white_space(cp)) break;
            b += (size_t)l;
        }
    }
    if (step->right) {
        while (e > b) {
            size_t k = e - 1;
            while (k > b && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
            int32_t cp;
            mr__utf8_decode_valid((const unsigned char *)s + k, &cp);
            if (!mr__is_white_space(cp)) break;
            e = k;
        }
    }
    out->n = 0;
    return mr__buf_put(out, s + b, e - b);
}

static mr_status strip_accents(const char *s, size_t n, mr__buf *out) {
    out->n = 0;
    mr_status st = mr__buf_reserve(out, n);
    if (st) return st;
    out->p[0] = 0;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        int l = mr__utf8_decode_valid((const unsigned char *)s + i, &cp);
        utf8proc_category_t c = utf8proc_category(cp);
        bool mark = c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_MC || c == UTF8PROC_CATEGORY_ME;
        if (!mark && (st = mr__buf_put(out, s + i, (size_t)l))) return st;
        i += (size_t)l;
    }
    return MR_OK;
}

/* Applies every step; out gets the result. out and scratch alternate (both
 * stay the caller's, to be reused). */
mr_status mr__norm_apply(const mr_tokenizer *t, pcre2_match_data *md, const char *s, size_t n, mr__buf *out,
                         mr__buf *scratch) {
    mr__buf tmp = *scratch;
    out->n = 0;
    mr_status st = mr__buf_put(out, s, n);
    for (size_t k = 0; k < t->n_norm && !st; k++) {
        const mr__norm_step *step = &t->norm[k];
        const char *in = out->p;
        size_t in_n = out->n;
        switch (step->kind) {
        case MR__NORM_NFC: st = unicode_form(in, in_n, UTF8PROC_COMPOSE, &tmp); break;
        case MR__NORM_NFD: st = unicode_form(in, in_n, UTF8PROC_DECOMPOSE, &tmp); break;
        case MR__NORM_NFKC: st = unicode_form(in, in_n, UTF8PROC_COMPOSE | UTF8PROC_COMPAT, &tmp); break;
        case MR__NORM_NFKD: st = unicode_form(in, in_n, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, &tmp); break;
        case MR__NORM_LOWERCASE: st = lowercase(in, in_n, &tmp); break;
        case MR__NORM_REPLACE: st = replace(step, md, in, in_n, &tmp); break;
        case MR__NORM_PREPEND:
            tmp.n = 0;
            if (in_n) st = mr__buf_put(&tmp, step->str, step->str_len);
            if (!st) st = mr__buf_put(&tmp, in, in_n);
            break;
        case MR__NORM_STRIP: st = strip(step, in, in_n, &tmp); break;
        case MR__NORM_STRIP_ACCENTS: st = strip_accents(in, in_n, &tmp); break;
        }
        if (!st) {
            mr__buf sw = *out;
            *out = tmp;
            tmp = sw;
        }
    }
    *scratch = tmp;
    return st;
}
