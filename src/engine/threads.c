/* threads.c — the engine's choice of one thread or all for each step (the
 * policy is described in engine_internal.h, "threads per step"). Pure
 * bookkeeping on the caller's clock: tests drive it with a simulated one. */
#include <string.h>

#include "engine/engine_internal.h"

void mr__thr_init(mr__thr *t, int all, bool fixed) {
    memset(t, 0, sizeof *t);
    t->all = all > 1 ? all : 1;
    t->fixed = fixed || t->all == 1;
    for (int i = 0; i < MR__THR_CLASSES; i++) t->c[i].cur = 1;
}

static int class_of(int64_t tok) {
    int cl = 0;
    while (cl + 1 < MR__THR_CLASSES && (int64_t)1 << (cl + 1) <= tok) cl++;
    return cl;
}

int mr__thr_pick(mr__thr *t, int64_t tok, uint64_t now_ns) {
    if (t->fixed || tok <= 0) return 1;
    mr__thr_class *c = &t->c[class_of(tok)];
    if (!c->n_cur) { /* no time of the running count yet: run it (a new class starts its clock) */
        if (!c->warm[c->cur]) c->last_try_ns = now_ns;
        return c->cur;
    }
    const int other = 1 - c->cur;
    if (c->try_left > 0) return other; /* the try goes on */
    double per_tok; /* the other's expected time per token */
    if (c->ratio > 0) per_tok = other == 0 ? c->cur_ns * c->ratio : c->cur_ns / c->ratio;
    else per_tok = other == 0 ? c->cur_ns * t->all : c->cur_ns / t->all;
    /* a class whose step on one thread is long stays on all threads: there the threads pay off, and a
     * try costs (serve, tiny-kjv at C = 64: 4.4 ms steps, 10% slower with tries). Measured, or
     * guessed 4 times as long: beside other work a small step on all threads can take 6 ms */
    if (other == 0 && per_tok * (double)tok >= (c->ratio > 0 ? 1 : 4) * MR__THR_LONG_NS) return c->cur;
    /* the first try comes at once (one try's time after the class starts: a short server run
     * should not spend its first 250 steps on the wrong count), the first after a switch (was it
     * noise?) 8 times sooner than the others */
    const double budget = c->ratio <= 0 ? 1 : c->switched ? MR__THR_BUDGET / 8 : MR__THR_BUDGET;
    /* 16 steps, fewer when their expected time passes 2 x MR__THR_LONG_NS (set here, not by what the
     * try meets: ending at a slow step would bias its mean) */
    const double step = per_tok * (double)tok;
    int n = (int)(2 * MR__THR_LONG_NS / step);
    n = n < 1 ? 1 : n > MR__THR_TRY_STEPS ? MR__THR_TRY_STEPS : n;
    if ((double)(now_ns - c->last_try_ns) >= budget * n * step) {
        c->last_try_ns = now_ns;
        c->try_left = n;
        c->switched = false;
        c->try_sum = 0;
        c->try_n = 0;
        return other;
    }
    return c->cur;
}

void mr__thr_seen(mr__thr *t, int64_t tok, int k, uint64_t ns) {
    if (t->fixed || tok <= 0 || (k != 0 && k != 1)) return;
    mr__thr_class *c = &t->c[class_of(tok)];
    const double v = (double)ns / (double)tok;
    if (!c->warm[k]) { /* the first step on a count pays for starting it (not counted: the try goes on) */
        c->warm[k] = true;
        return;
    }
    if (k == c->cur) {
        c->cur_ns = c->n_cur ? c->cur_ns + (v - c->cur_ns) / 16 : v;
        c->n_cur++;
        return;
    }
    if (c->try_left <= 0 || !c->n_cur) return; /* a try needs the running count's time beside it */
    c->try_sum += v;
    c->try_n++;
    if (--c->try_left > 0) return;
    const double m = c->try_sum / c->try_n;
    if (m <= 0) return;
    const double r = k == 0 ? m / c->cur_ns : c->cur_ns / m; /* one / all */
    /* folded by half; a try twice or half the ratio is a change of the host's load: taken as is */
    c->ratio = c->ratio > 0 && r < 2 * c->ratio && 2 * r > c->ratio ? c->ratio + (r - c->ratio) / 2 : r;
    if ((c->cur == 1 && c->ratio < MR__THR_TO_ONE) || (c->cur == 0 && c->ratio > MR__THR_TO_ALL)) {
        c->cur = k; /* the try's count runs from now on; its time is this try */
        c->cur_ns = m;
        c->n_cur = (uint64_t)c->try_n;
        c->switched = true;
    }
}
