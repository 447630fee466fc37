/* stop.c — stop strings over a growing decoded text. Generation stops at the
 * first stop string it completes (the occurrence with the smallest end; on a
 * tie the longer one), whatever pieces the text arrived in, and the output
 * ends just before it (vLLM's and OpenAI's rule: the stop string itself is
 * not returned unless asked). While no stop
 * string has occurred, the longest suffix of the text that is a proper
 * prefix of some stop string is held back, so that a stream never sends
 * bytes that a later token turns into a stop. */
#include <string.h>

#include "serve/serve_internal.h"

void sv_stop_init(sv_stop *st, int n, char *const *s) {
    st->n = n;
    st->s = (const char *const *)s;
    st->max_len = 0;
    for (int i = 0; i < n; i++) {
        st->len[i] = strlen(s[i]);
        if (st->len[i] > st->max_len) st->max_len = st->len[i];
    }
}

bool sv_stop_scan(const sv_stop *st, const char *text, size_t n, size_t from, size_t *cut, size_t *cut_end,
                  size_t *safe) {
    /* the match that completes first (smallest end; ties: the longer), which is
     * the one generation reaches first whatever the pieces the text came in;
     * a match that ends after `from` starts at or after from - (len - 1) */
    bool found = false;
    size_t best = 0, best_end = 0;
    for (int i = 0; i < st->n; i++) {
        size_t L = st->len[i];
        if (L == 0 || L > n) continue;
        size_t start = from >= L - 1 ? from - (L - 1) : 0;
        for (size_t p = start; p + L <= n; p++) {
            if (found && p + L > best_end) break;
            if (text[p] == st->s[i][0] && !memcmp(text + p, st->s[i], L)) {
                if (!found || p + L < best_end || (p + L == best_end && p < best)) {
                    best = p;
                    best_end = p + L;
                }
                found = true;
                break;
            }
        }
    }
    if (found) {
        *cut = best;
        *cut_end = best_end;
        *safe = best;
        return true;
    }
    /* hold back the longest suffix that starts some stop string */
    size_t hold = 0;
    for (int i = 0; i < st->n; i++) {
        size_t L = st->len[i];
        size_t kmax = L - 1 < n ? L - 1 : n;
        for (size_t k = kmax; k > hold; k--)
            if (!memcmp(text + n - k, st->s[i], k)) {
                hold = k;
                break;
            }
    }
    *safe = n - hold;
    return false;
}
