/* sampler_cost.c — what sampling one token costs over a real vocabulary (MiniMax-M2's 200,064 ids), beside
 * one pass over the logits (argmax: the floor every sampler pays), per distribution and filter set. Best of
 * 5 rounds of 50 tokens each; run it twice, the VM is noisy.
 *   cmake --build build-perf -j2 --target moerun && make -C dev/perf sampler_cost && dev/perf/sampler_cost
 * Distributions: flat (uniform logits in [-4, 4]: a top-p of 0.95 keeps ~70% of the ids) and peaked (a
 * N(0, 2.5) bulk with 20 tokens 9-15 ahead). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "moerun/model.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t lcg(uint64_t *s) { return (*s = *s * 6364136223846793005ull + 1442695040888963407ull) >> 11; }

int main(void) {
    enum { V = 200064, N = 50, ROUNDS = 5 };
    float *l = malloc(V * sizeof(float)), *prob = malloc(V * sizeof(float));
    int32_t *idx = malloc(V * sizeof(int32_t));
    if (!l || !prob || !idx) return 1;
    const struct {
        float top_p;
        int top_k;
    } ps[] = {{1.0f, 0}, {0.95f, 0}, {0.8f, 0}, {1.0f, 40}, {0.95f, 40}};
    for (int peaked = 0; peaked < 2; peaked++) {
        uint64_t s = 1;
        for (int64_t i = 0; i < V; i++) {
            const double u1 = ((double)lcg(&s) + 1.0) / 9007199254740993.0, u2 = (double)lcg(&s) / 9007199254740992.0;
            l[i] = peaked ? (float)(2.5 * sqrt(-2.0 * log(u1)) * cos(6.283185307 * u2)) : (float)(u2 * 8.0 - 4.0);
        }
        if (peaked)
            for (int j = 0; j < 20; j++) l[(int64_t)j * 7919 % V] += 9.0f + 0.3f * (float)j;
        double floor_s = 1e9;
        int64_t sink = 0;
        for (int r = 0; r < ROUNDS; r++) {
            const double t0 = now();
            for (int i = 0; i < N; i++) sink += mr_argmax(l, V);
            const double t = (now() - t0) / N;
            floor_s = t < floor_s ? t : floor_s;
        }
        for (size_t q = 0; q < sizeof ps / sizeof ps[0]; q++) {
            mr_sampler_params p = {.temperature = 1.0f, .top_p = ps[q].top_p, .top_k = ps[q].top_k};
            uint64_t st = mr_sampler_seed_state(5);
            double best = 1e9;
            for (int r = 0; r < ROUNDS; r++) {
                const double t0 = now();
                for (int i = 0; i < N; i++) sink += mr_sample_logits(&p, &st, l, V, prob, idx);
                const double t = (now() - t0) / N;
                best = t < best ? t : best;
            }
            printf("%-6s T 1 top-p %.2f top-k %2d: %.3f ms a token, %.1fx the argmax pass (%.3f ms)\n",
                   peaked ? "peaked" : "flat", ps[q].top_p, ps[q].top_k, best * 1e3, best / floor_s, floor_s * 1e3);
        }
        if (sink == 42) puts("");
    }
    free(l), free(prob), free(idx);
    return 0;
}
