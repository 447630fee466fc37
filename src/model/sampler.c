/* sampler.c — token sampling: greedy (temperature 0, exactly argmax), or
 * logits / temperature followed by the top-k, top-p and min-p filters and a
 * draw from a seeded splitmix64 generator (same seed, same tokens).
 *
 * Filters, over the candidates (non-NaN logits):
 *   top-k  the k largest logits (ties to the lower id)
 *   top-p  then the shortest run, in descending logit order, whose share of
 *          the top-k candidates' probability mass reaches top_p
 *   min-p  and only tokens whose probability is >= min_p x the largest
 * top-p and min-p both cut a prefix of the descending order, so the kept set
 * is the shorter one. Work is O(vocab) a token for a real vocabulary
 * (MiniMax-M2's 200,064 ids): top-k keeps a bounded heap and sorts only its k;
 * top-p without top-k never sorts, it finds the cut's logit by a three-level
 * radix selection over the logits' bits, weighted by probability mass, and
 * the draw walks the kept tokens in id order. The weights come from a
 * polynomial exp in plain float arithmetic that the compiler runs four lanes
 * at a time (SSE2, every x86-64 host: the same bits everywhere). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

/* The largest value of x[0..n) that is not NaN (-inf if none), four lanes at a time (a NaN never compares
 * greater, so it never enters a lane). */
static inline float max_lanes(const float *x, int64_t n) {
    float m4[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    const int64_t n4 = n - n % 4;
    for (int64_t i = 0; i < n4; i += 4)
        for (int j = 0; j < 4; j++) m4[j] = x[i + j] > m4[j] ? x[i + j] : m4[j];
    for (int64_t i = n4; i < n; i++) m4[0] = x[i] > m4[0] ? x[i] : m4[0];
    return fmaxf(fmaxf(m4[0], m4[1]), fmaxf(m4[2], m4[3]));
}

/* Two passes the compiler runs in lanes: the largest value (a NaN never compares greater; -inf where
 * every value is -inf or NaN), then the first position that holds it, 64 at a time (none: every value is
 * NaN, and 0 is the answer). */
int32_t mr_argmax(const float *x, int64_t n) {
    const float mx = max_lanes(x, n);
    for (int64_t b = 0; b < n; b += 64) {
        const int64_t e = b + 64 < n ? b + 64 : n;
        int hit = 0;
        for (int64_t i = b; i < e; i++) hit |= x[i] == mx;
        if (hit)
            for (int64_t i = b; i < e; i++)
                if (x[i] == mx) return (int32_t)i;
    }
    return 0;
}

mr_status mr_sampler_params_check(const mr_sampler_params *p) {
    if (p->top_k < 0) return mr_error_set(MR_EINVAL, "sampler: top-k %d is negative", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) return mr_error_set(MR_EINVAL, "sampler: top-p must be in (0, 1] (1 disables it)");
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) return mr_error_set(MR_EINVAL, "sampler: min-p must be in [0, 1]");
    if (p->temperature != p->temperature || isinf(p->temperature))
        return mr_error_set(MR_EINVAL, "sampler: temperature must be a finite number");
    return MR_OK;
}

uint64_t mr_sampler_seed_state(uint64_t seed) { return seed ^ 0x9E3779B97F4A7C15ull; }

mr_status mr_sampler_init(mr_sampler *s, const mr_sampler_params *p, int64_t vocab) {
    *s = (mr_sampler){0};
    if (vocab <= 0 || vocab > INT32_MAX) return mr_error_set(MR_EINVAL, "sampler: vocab %lld out of range", (long long)vocab);
    mr_status st = mr_sampler_params_check(p);
    if (st) return st;
    s->p = *p;
    s->vocab = vocab;
    s->state = mr_sampler_seed_state(p->seed);
    s->prob = mr_malloc((size_t)vocab * sizeof(float));
    s->idx = mr_malloc((size_t)vocab * sizeof(int32_t));
    if (!s->prob || !s->idx) {
        mr_sampler_free(s);
        return MR_ENOMEM;
    }
    return MR_OK;
}

void mr_sampler_free(mr_sampler *s) {
    mr_free(s->prob);
    mr_free(s->idx);
    s->prob = NULL;
    s->idx = NULL;
}

static uint64_t splitmix64(uint64_t *st) {
    uint64_t z = (*st += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Does id i come before id j in descending logit order (ties: lower id first)? */
static inline bool before(const float *l, int32_t i, int32_t j) { return l[i] > l[j] || (l[i] == l[j] && i < j); }

/* qsort_r comparator: ids by logit descending, ties to the lower id. */
static int by_logit_desc(const void *a, const void *b, void *keys) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    return before(keys, i, j) ? -1 : before(keys, j, i) ? 1 : 0;
}

/* The k first candidates in descending order into idx[0..k), sorted. A
 * heap of k whose root is the last of them. Once it is full, a block of 64
 * whose largest logit is not above the root's is passed whole (its ids come
 * after every id in the heap, so a tie does not enter either); the blocks'
 * largest in lanes (a NaN never compares greater). */
static int64_t top_k_ids(const float *l, int64_t V, int64_t k, int32_t *idx) {
    enum { BLK = 64 };
    int64_t n = 0;
    for (int64_t i = 0; i < V; i++) {
        if (n == k && i % BLK == 0 && i + BLK <= V) {
            if (!(max_lanes(l + i, BLK) > l[idx[0]])) {
                i += BLK - 1;
                continue;
            }
        }
        if (l[i] != l[i]) continue;
        int32_t id = (int32_t)i;
        if (n < k) { /* sift up */
            int64_t c = n++;
            idx[c] = id;
            while (c > 0 && before(l, idx[(c - 1) / 2], idx[c])) {
                int32_t t = idx[c];
                idx[c] = idx[(c - 1) / 2];
                idx[(c - 1) / 2] = t;
                c = (c - 1) / 2;
            }
        } else if (before(l, id, idx[0])) { /* replace the root, sift down */
            idx[0] = id;
            int64_t c = 0;
            for (;;) {
                int64_t a = 2 * c + 1, b = a + 1, w = c;
                if (a < n && before(l, idx[w], idx[a])) w = a;
                if (b < n && before(l, idx[w], idx[b])) w = b;
                if (w == c) break;
                int32_t t = idx[c];
                idx[c] = idx[w];
                idx[w] = t;
                c = w;
            }
        }
    }
    qsort_r(idx, (size_t)n, sizeof(int32_t), by_logit_desc, (void *)l);
    return n;
}

/* exp(x) for x <= 0 (x = (logit - max) / T), 0 below -87 and at -inf (a masked token weighs nothing).
 * x = n ln2 + r with |r| <= ln2 / 2 (Cody-Waite, ln2 in two parts), exp(r) by its Taylor polynomial of degree
 * 7 (relative error below 3e-7 here), times 2^n built in the exponent bits. Exactly 1 at 0: the largest
 * logit weighs 1. */
static inline float exp_le0(float x) {
    const float big = 12582912.0f; /* 1.5 * 2^23: x * log2(e) + big rounds to an integer, n = that - big */
    const float xc = x < -87.0f ? -87.0f : x;
    const float n = (xc * 1.44269504f + big) - big;
    const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
    float q = 1.0f / 5040.0f;
    q = q * r + 1.0f / 720.0f;
    q = q * r + 1.0f / 120.0f;
    q = q * r + 1.0f / 24.0f;
    q = q * r + 1.0f / 6.0f;
    q = q * r + 0.5f;
    q = q * r + 1.0f;
    q = q * r + 1.0f;
    const uint32_t e = (uint32_t)((int32_t)n + 127) << 23; /* n in [-126, 0] */
    float sc;
    memcpy(&sc, &e, sizeof sc);
    return x < -87.0f ? 0.0f : q * sc;
}

/* Order-preserving bits of a non-NaN float: a larger logit has a larger key. */
static inline uint32_t fkey(float f) {
    f += 0.0f; /* -0 is +0: equal logits, one key */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

/* The top-p cut over the candidates idx[0..n) (id order) with weights w[0..n): the shortest prefix in
 * descending logit order (ties to the lower id) whose mass reaches want is every candidate whose key is
 * above cut->key, and the first cut->ties (in id order) of those whose key equals it. */
typedef struct {
    uint32_t key;
    int64_t ties;
    bool all; /* the mass never reaches want (rounding): every candidate */
} p_cut;

/* The key is chosen 11, 11 and 10 bits at a time: per level the mass of each bucket of the next bits, among
 * the candidates that share the bits chosen so far, walked from the top until the mass reaches want. */
enum { CUT_BUCKETS = 2048, CUT_SMALL = 1024 };

/* The candidate at position i: its logit (ident: idx[i] == i). */
static inline float cand(const float *logits, const int32_t *idx, bool ident, int64_t i) {
    return ident ? logits[i] : logits[idx[i]];
}

/* The first level over every candidate: the mass and the count of each bucket of the keys' top 11 bits (two
 * tables each, even and odd positions: fewer adds wait on the same entry). Returns the bucket where the walk
 * from the top reaches want (-1: never), with the mass of the buckets above it in *above and the candidates
 * in it and above in *count. */
static int32_t top_bucket(const float *logits, const int32_t *idx, bool ident, const float *w, int64_t n,
                          double want, double *above, int64_t *count) {
    double mass[2][CUT_BUCKETS];
    int32_t cnt[2][CUT_BUCKETS];
    memset(mass, 0, sizeof mass);
    memset(cnt, 0, sizeof cnt);
    for (int64_t i = 0; i < n; i++) {
        const uint32_t b = fkey(cand(logits, idx, ident, i)) >> 21;
        mass[i & 1][b] += w[i];
        cnt[i & 1][b]++;
    }
    double a = 0.0;
    int64_t c = 0;
    for (int32_t b = CUT_BUCKETS - 1; b >= 0; b--) {
        const double m = mass[0][b] + mass[1][b];
        c += cnt[0][b] + cnt[1][b];
        if (a + m >= want) return (*above = a), (*count = c), b;
        a += m;
    }
    return -1;
}

/* The cut below the first level's bucket b0 (above: the mass over it). The candidates are positions pos[0..m)
 * (increasing; those of b0 and maybe others) or, pos NULL, every position 0..m). */
static p_cut top_p_cut(const float *logits, const int32_t *idx, bool ident, const int32_t *pos, int64_t m,
                       const float *w, double want, uint32_t b0, double above) {
    static const int shift[2] = {10, 0}, width[2] = {11, 10};
    double mass[2][CUT_BUCKETS + 8]; /* the 8 last entries take those outside the prefix in turn (no branch to
                                      * mispredict, no chain of adds on one entry) */
    uint32_t prefix = b0; /* the key's bits chosen so far, above shift[lv] + width[lv] */
    for (int lv = 0; lv < 2; lv++) {
        const int sh = shift[lv], hi = sh + width[lv];
        const uint32_t nb = 1u << width[lv];
        memset(mass[0], 0, (nb + 8) * sizeof(double));
        memset(mass[1], 0, (nb + 8) * sizeof(double));
        for (int64_t j = 0; j < m; j++) {
            const int64_t i = pos ? pos[j] : j;
            const uint32_t k = fkey(cand(logits, idx, ident, i));
            const bool in = k >> hi == prefix;
            mass[j & 1][in ? (k >> sh) & (nb - 1) : nb + ((j >> 1) & 7)] += w[i];
        }
        int32_t b = (int32_t)nb - 1;
        while (b >= 0 && above + (mass[0][b] + mass[1][b]) < want) above += mass[0][b] + mass[1][b], b--;
        if (b < 0) return (p_cut){.all = true};
        prefix = (prefix << width[lv]) | (uint32_t)b;
    }
    p_cut c = {.key = prefix, .ties = 0, .all = false};
    for (int64_t j = 0; j < m; j++) { /* the ties, in id order, until the mass is reached */
        const int64_t i = pos ? pos[j] : j;
        if (fkey(cand(logits, idx, ident, i)) == c.key) {
            c.ties++;
            if ((above += w[i]) >= want) return c;
        }
    }
    return (p_cut){.all = true};
}

/* qsort_r comparator: candidate positions (idx is increasing) by logit descending, ties to the lower one. */
typedef struct {
    const float *logits;
    const int32_t *idx;
} pos_order;
static int by_pos_desc(const void *a, const void *b, void *ctx) {
    const pos_order *o = ctx;
    const int32_t i = o->idx[*(const int32_t *)a], j = o->idx[*(const int32_t *)b];
    return before(o->logits, i, j) ? -1 : before(o->logits, j, i) ? 1 : 0;
}

/* The cut when the candidates whose key is at least kmin are few (at most CUT_SMALL) and hold want: they are
 * sorted and walked. */
static p_cut small_cut(const float *logits, const int32_t *idx, const float *w, int64_t n, double want,
                       uint32_t kmin) {
    int32_t pos[CUT_SMALL];
    int64_t m = 0;
    for (int64_t i = 0; i < n && m < CUT_SMALL; i++)
        if (fkey(logits[idx[i]]) >= kmin) pos[m++] = (int32_t)i;
    pos_order o = {logits, idx};
    qsort_r(pos, (size_t)m, sizeof(int32_t), by_pos_desc, &o);
    double c = 0.0;
    for (int64_t r = 0; r < m; r++)
        if ((c += w[pos[r]]) >= want) {
            p_cut cut = {.key = fkey(logits[idx[pos[r]]]), .ties = 0, .all = false};
            for (int64_t q = r; q >= 0 && fkey(logits[idx[pos[q]]]) == cut.key; q--) cut.ties++;
            return cut;
        }
    return (p_cut){.all = true};
}

/* The top-p cut: the first level over every candidate; then, when the candidates from its bucket up are
 * few, a sort of those; else the two other levels over that bucket's candidates only. Those are gathered
 * into idx itself when idx is the identity (ident), which is put back after; otherwise the levels pass over
 * every candidate. */
static p_cut find_cut(const float *logits, int32_t *idx, bool ident, const float *w, int64_t n, double want) {
    double above;
    int64_t count;
    const int32_t b0 = top_bucket(logits, idx, ident, w, n, want, &above, &count);
    if (b0 < 0) return (p_cut){.all = true};
    if (count <= CUT_SMALL) return small_cut(logits, idx, w, n, want, (uint32_t)b0 << 21);
    if (!ident) return top_p_cut(logits, idx, false, NULL, n, w, want, (uint32_t)b0, above);
    int64_t m = 0; /* idx[m] = i is no earlier than idx[i], which held i */
    for (int64_t i = 0; i < n; i++) {
        idx[m] = (int32_t)i;
        m += fkey(logits[i]) >> 21 == (uint32_t)b0;
    }
    const p_cut c = top_p_cut(logits, idx, true, idx, m, w, want, (uint32_t)b0, above);
    for (int64_t i = 0; i < m; i++) idx[i] = (int32_t)i;
    if (m < n) idx[m] = (int32_t)m; /* the last store went past the gathered ones */
    return c;
}

/* The sum of w[0..n) in double, four running sums (lanes) in a fixed order. */
static double sum_w(const float *w, int64_t n) {
    double part[4] = {0.0, 0.0, 0.0, 0.0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++) part[j] += w[i + j];
    for (; i < n; i++) part[0] += w[i];
    return (part[0] + part[1]) + (part[2] + part[3]);
}

/* The draw: u uniform in [0, mass), the first candidate whose running sum of weights passes u (weight 0: never
 * drawn). Blocks of 64 whose sum keeps the running sum at or below u are passed whole; rounding that leaves
 * u unpassed gives the last candidate of weight > 0. */
static int32_t draw(const float *w, const int32_t *idx, int64_t n, double mass, uint64_t *state) {
    enum { BLK = 64 };
    const double u = (double)(splitmix64(state) >> 11) * (1.0 / 9007199254740992.0) * mass;
    double c = 0.0;
    for (int64_t b = 0; b < n; b += BLK) {
        const int64_t e = b + BLK < n ? b + BLK : n;
        const double bs = sum_w(w + b, e - b);
        if (c + bs <= u) {
            c += bs;
            continue;
        }
        for (int64_t i = b; i < e; i++)
            if (w[i] > 0.0f && u < (c += w[i])) return idx[i];
    }
    for (int64_t i = n - 1; i > 0; i--)
        if (w[i] > 0.0f) return idx[i];
    return idx[0];
}

double mr_logsumexp(const float *l, int64_t n) {
    const float mx = max_lanes(l, n);
    double part[4] = {0.0, 0.0, 0.0, 0.0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++) part[j] += exp_le0(l[i + j] - mx);
    for (; i < n; i++) part[0] += exp_le0(l[i] - mx);
    return (double)mx + log((part[0] + part[1]) + (part[2] + part[3]));
}

/* The filters (this file's header): the candidates' weights into prob[0..n), their ids in idx[0..n) (what a
 * filter drops weighs 0), their sum into *mass; returns n. 0 where the token needs no draw (*pick): greedy,
 * +inf logits, a T so small that 1 / T is infinite, no candidate. */
int64_t mr__sampler_weigh(const mr_sampler_params *p, const float *logits, int64_t V, float *prob, int32_t *idx,
                          double *mass, int32_t *pick) {
    *pick = 0;
    if (p->temperature <= 0.0f) return (*pick = mr_argmax(logits, V)), 0;
    const float inv_t = 1.0f / p->temperature;
    const bool top_p = p->top_p < 1.0f;
    int64_t n; /* candidates: idx[0..n), their logits then weights in prob[0..n) */
    bool ordered; /* idx in descending logit order (top-k), else in id order */
    bool ident = false; /* idx[i] == i */
    float mx = -INFINITY;
    if (p->top_k > 0 && p->top_k < V) {
        n = top_k_ids(logits, V, p->top_k, idx);
        for (int64_t i = 0; i < n; i++) prob[i] = logits[idx[i]];
        if (n) mx = prob[0];
        ordered = true;
    } else {
        int nan = 0;
        for (int64_t i = 0; i < V; i++) nan |= logits[i] != logits[i];
        if (!nan) { /* the usual case, in passes the compiler runs in lanes */
            mx = max_lanes(logits, V);
            for (int64_t i = 0; i < V; i++) idx[i] = (int32_t)i;
            memcpy(prob, logits, (size_t)V * sizeof(float));
            n = V, ident = true;
        } else {
            n = 0;
            for (int64_t i = 0; i < V; i++)
                if (logits[i] == logits[i]) {
                    mx = logits[i] > mx ? logits[i] : mx;
                    idx[n] = (int32_t)i, prob[n++] = logits[i];
                }
        }
        ordered = false;
    }
    if (n == 0) return 0;
    /* +inf logits, or a T so small that 1 / T is infinite: the limit is the largest (the first of them) */
    if (isinf(mx) || isinf(inv_t)) {
        int64_t at = 0;
        while (prob[at] != mx) at++;
        return (*pick = idx[at]), 0;
    }
    /* weights exp((l - max) / T): the largest is 1. The difference comes first: l / T overflows for a tiny
     * T (1 / 1e-38 times a logit of 4 is past FLT_MAX), and inf - inf gave NaN weights */
    for (int64_t i = 0; i < n; i++) prob[i] = exp_le0((prob[i] - mx) * inv_t);
    const double total = sum_w(prob, n);
    const float min_w = p->min_p > 0.0f ? p->min_p : 0.0f; /* min-p: w >= min_p x the largest weight (1) */
    if (ordered) {
        int64_t keep = n;
        if (top_p) { /* shortest prefix whose share of the mass reaches top_p (at least one) */
            double c = 0.0, want = (double)p->top_p * total;
            for (int64_t i = 0; i < n; i++)
                if ((c += prob[i]) >= want) {
                    keep = i + 1;
                    break;
                }
        }
        int64_t k = 1;
        while (k < keep && prob[k] >= min_w) k++; /* min-p: a prefix too */
        *mass = sum_w(prob, k);
        return k;
    }
    const p_cut cut = top_p ? find_cut(logits, idx, ident, prob, n, (double)p->top_p * total) : (p_cut){.all = true};
    if (cut.all && min_w == 0.0f) return (*mass = total), n;
    /* what the filters drop weighs 0: a pass in lanes keeps the keys at or above the cut's, then, only where
     * the cut's key has more ties than the cut keeps, those past them in id order are dropped (equal logits:
     * min-p keeps all of them or none) */
    const uint32_t kc = cut.all ? 0 : cut.key;
    int64_t ties = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint32_t k = fkey(cand(logits, idx, ident, i));
        ties += k == kc;
        prob[i] = k >= kc && prob[i] >= min_w ? prob[i] : 0.0f;
    }
    if (!cut.all && ties > cut.ties)
        for (int64_t i = 0, t = 0; i < n; i++)
            if (fkey(cand(logits, idx, ident, i)) == kc && ++t > cut.ties) prob[i] = 0.0f;
    *mass = sum_w(prob, n);
    return n;
}

int32_t mr_sample_logits(const mr_sampler_params *p, uint64_t *state, const float *logits, int64_t V, float *prob,
                         int32_t *idx) {
    double mass;
    int32_t pick;
    const int64_t n = mr__sampler_weigh(p, logits, V, prob, idx, &mass, &pick);
    return n ? draw(prob, idx, n, mass, state) : pick;
}

int32_t mr_sampler_sample(mr_sampler *s, const float *logits) {
    return mr_sample_logits(&s->p, &s->state, logits, s->vocab, s->prob, s->idx);
}
