/* profile.c — sglang's POST /start_profile and /stop_profile (what `sglang.bench_serving --profile` calls
 * around its run): the engine thread's steps recorded between the two, answered as a Chrome trace (the
 * JSON that Perfetto and chrome://tracing open). Each step is a slice with its phases inside it:
 * schedule, forward (its attention, MoE and other time, summed over the layers, as arguments), complete
 * (sampling, stop checks), publish (the tokens handed to the clients); counters follow the batch's prefill
 * and decode tokens and the requests in it. The engine thread appends under the profile's lock; start and
 * stop come from HTTP threads. At most SV_PROFILE_MAX_STEPS steps are kept (the trace says it was cut). */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "serve/serve_internal.h"

#define SV_PROFILE_MAX_STEPS 200000

struct sv_profile {
    pthread_mutex_t mu;
    atomic_bool on;
    int64_t steps_left;         /* num_steps still to record (-1: until stop) */
    uint64_t t_start;           /* mr_now_ns at start: the trace's time 0 */
    sv_prof_step *s;
    size_t n, cap;
    bool cut;                   /* steps were dropped: the cap */
};

sv_profile *sv_profile_new(void) {
    sv_profile *p = mr_calloc(1, sizeof *p);
    if (!p) return NULL;
    pthread_mutex_init(&p->mu, NULL);
    atomic_init(&p->on, false);
    return p;
}

void sv_profile_free(sv_profile *p) {
    if (!p) return;
    pthread_mutex_destroy(&p->mu);
    mr_free(p->s);
    mr_free(p);
}

bool sv_profile_on(sv_profile *p) { return p && atomic_load_explicit(&p->on, memory_order_relaxed); }

int sv_profile_start(sv_profile *p, int64_t num_steps) {
    pthread_mutex_lock(&p->mu);
    const bool running = atomic_load(&p->on);
    if (!running) {
        p->n = 0;
        p->cut = false;
        p->steps_left = num_steps > 0 ? num_steps : -1;
        p->t_start = mr_now_ns();
        atomic_store(&p->on, true);
    }
    pthread_mutex_unlock(&p->mu);
    return running ? 1 : 0;
}

int64_t sv_profile_step(sv_profile *p, const sv_prof_step *st) {
    int64_t at = -1;
    pthread_mutex_lock(&p->mu);
    if (atomic_load(&p->on) && p->steps_left != 0) {
        if (p->n == p->cap && p->cap < SV_PROFILE_MAX_STEPS) {
            size_t cap = p->cap ? p->cap * 2 : 1024;
            if (cap > SV_PROFILE_MAX_STEPS) cap = SV_PROFILE_MAX_STEPS;
            sv_prof_step *s = mr_realloc(p->s, cap * sizeof *s);
            if (s) p->s = s, p->cap = cap;
        }
        if (p->n < p->cap) at = (int64_t)p->n, p->s[p->n++] = *st;
        else p->cut = true;
        if (p->steps_left > 0) p->steps_left--;
    }
    pthread_mutex_unlock(&p->mu);
    return at;
}

void sv_profile_step_end(sv_profile *p, int64_t k, uint64_t t0, uint64_t t_end) {
    pthread_mutex_lock(&p->mu);
    if (atomic_load(&p->on) && k < (int64_t)p->n && p->s[k].t0 == t0) p->s[k].t_end = t_end;
    pthread_mutex_unlock(&p->mu);
}

/* One complete ("X") slice of the trace after the events before it, times in ns from the start, written in
 * microseconds. */
static int slice(sv_buf *b, const char *name, uint64_t t0, uint64_t ts, uint64_t dur, const char *args) {
    return sv_buf_printf(b, ",\n{\"name\":\"%s\",\"cat\":\"engine\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":%.3f,"
                         "\"dur\":%.3f%s%s}", name, (double)(ts - t0) / 1e3, (double)dur / 1e3,
                         args ? ",\"args\":" : "", args ? args : "");
}

char *sv_profile_stop(sv_profile *p, const char *model, const char *runner, size_t *len) {
    *len = 0;
    pthread_mutex_lock(&p->mu);
    if (!atomic_load(&p->on)) {
        pthread_mutex_unlock(&p->mu);
        return NULL;
    }
    atomic_store(&p->on, false);
    sv_buf b = {0};
    const uint64_t t0 = p->t_start;
    int bad = sv_buf_lit(&b, "{\"traceEvents\":[\n") ||
              sv_buf_printf(&b, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"moerun serve\"}},\n"
                            "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1,\"args\":{\"name\":\"engine\"}}");
    for (size_t i = 0; !bad && i < p->n; i++) {
        const sv_prof_step *s = &p->s[i];
        char a[320];
        snprintf(a, sizeof a, "{\"step\":%llu,\"requests\":%d,\"prefill_tokens\":%lld,\"decode_tokens\":%lld,"
                 "\"preempted\":%d,\"events\":%d}", (unsigned long long)s->step, s->n_seq, (long long)s->n_prefill,
                 (long long)s->n_decode, s->n_preempted, s->n_events);
        bad |= slice(&b, "step", t0, s->t0, s->t_end - s->t0, a);
        uint64_t t = s->t0;
        bad |= slice(&b, "schedule", t0, t, s->schedule_ns, NULL);
        t += s->schedule_ns;
        snprintf(a, sizeof a, "{\"attention_ms\":%.3f,\"moe_ms\":%.3f,\"other_ms\":%.3f,\"tokens\":%lld}",
                 (double)s->attention_ns / 1e6, (double)s->moe_ns / 1e6, (double)s->other_ns / 1e6,
                 (long long)(s->n_prefill + s->n_decode));
        bad |= slice(&b, "forward", t0, t, s->forward_ns, a);
        t += s->forward_ns;
        snprintf(a, sizeof a, "{\"sample_ms\":%.3f}", (double)s->sample_ns / 1e6);
        bad |= slice(&b, "complete", t0, t, s->complete_ns, a);
        if (s->t_end > s->t_publish) bad |= slice(&b, "publish", t0, s->t_publish, s->t_end - s->t_publish, NULL);
        bad |= sv_buf_printf(&b, ",\n{\"name\":\"batch tokens\",\"ph\":\"C\",\"pid\":1,\"ts\":%.3f,\"args\":{\"prefill\":%lld,"
                             "\"decode\":%lld}}", (double)(s->t0 - t0) / 1e3, (long long)s->n_prefill, (long long)s->n_decode);
    }
    if (!bad) {
        bad = sv_buf_lit(&b, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"model\":") ||
              sv_buf_json_str(&b, model, strlen(model)) || sv_buf_lit(&b, ",\"runner\":") ||
              sv_buf_json_str(&b, runner, strlen(runner)) ||
              sv_buf_printf(&b, ",\"steps\":%zu,\"cut\":%s,\"seconds\":%.6f}}\n", p->n, p->cut ? "true" : "false",
                            (double)(mr_now_ns() - t0) / 1e9);
    }
    p->n = 0;
    pthread_mutex_unlock(&p->mu);
    if (bad) {
        sv_buf_free(&b);
        return NULL;
    }
    *len = b.len;
    return b.p;
}
