/* engine.c — the engine thread of the server: the only user of the model.
 *
 * Each step reads top to bottom: take the new submissions, drop the
 * cancelled, admit waiting gens into free KV slots (FCFS), build one batch
 * (decodes of the running gens first, then prefill chunks within the token
 * budget), forward, sample, stop checks, publish the tokens to each job's
 * output queue, free the finished slots, update the gauges.
 *
 * This is the server's own small step loop over mr_model_forward's slots
 * (one contiguous KV region per slot, sized at start for max_running
 * sequences of context_length tokens). It keeps the contract the engine
 * library offers (requests with sampling params, stop ids, max tokens and a
 * cancel flag; per-step new tokens and finish reasons), so that the server
 * above it does not change when that library takes over the step.
 *
 * No allocation per token: the output arrays are sized at admission by the
 * HTTP thread, the batch arrays and the logits at start. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_internal.h"

struct sv_engine {
    mr_model *m;
    int64_t vocab;
    int max_running;
    int64_t ctx, budget;
    int64_t capacity;          /* max_running + max_queued */
    sv_metrics *met;
    pthread_t th;
    bool started;
    /* submission queue: HTTP threads -> engine thread */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sv_gen *sub_head, *sub_tail;
    bool stop, abort_all;
    atomic_llong reserved;     /* admitted, unfinished gens */
    /* engine thread only */
    sv_gen *wait_head, *wait_tail;
    int n_waiting;
    sv_gen **slot;             /* [max_running] running gen per KV slot, or NULL */
    mr_sampler *smp;           /* [max_running] */
    float *logits;             /* [max_running][vocab] */
    int *b_seq;                /* [max_running] */
    int64_t *b_ntok;           /* [max_running] */
    int32_t *b_tok;            /* [budget] */
    sv_gen **b_gen;            /* [max_running] */
    bool *b_sample;            /* [max_running] the step ends the gen's prefill or decodes it */
    uint64_t seed_counter;
};

mr_status sv_engine_new(mr_model *m, const mr_server_opts *o, sv_metrics *metrics, sv_engine **out) {
    *out = NULL;
    sv_engine *e = mr_calloc(1, sizeof *e);
    if (!e) return MR_ENOMEM;
    e->m = m;
    e->vocab = mr_model_config_of(m)->vocab;
    e->max_running = o->max_running_requests;
    e->ctx = o->context_length;
    e->budget = o->chunked_prefill_size < o->max_running_requests ? o->max_running_requests : o->chunked_prefill_size;
    e->capacity = (int64_t)o->max_running_requests + o->max_queued_requests;
    e->met = metrics;
    e->seed_counter = mr_now_ns();
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    size_t R = (size_t)e->max_running, lg;
    if (!mr_size_mul(R, (size_t)e->vocab * sizeof(float), &lg)) {
        sv_engine_free(e);
        return mr_error_set(MR_EOVERFLOW, "serve: logits of %zu sequences overflow", R);
    }
    e->slot = mr_calloc(R, sizeof *e->slot);
    e->smp = mr_calloc(R, sizeof *e->smp);
    e->logits = mr_malloc(lg);
    e->b_seq = mr_calloc(R, sizeof *e->b_seq);
    e->b_ntok = mr_calloc(R, sizeof *e->b_ntok);
    e->b_tok = mr_calloc((size_t)e->budget, sizeof *e->b_tok);
    e->b_gen = mr_calloc(R, sizeof *e->b_gen);
    e->b_sample = mr_calloc(R, sizeof *e->b_sample);
    if (!e->slot || !e->smp || !e->logits || !e->b_seq || !e->b_ntok || !e->b_tok || !e->b_gen || !e->b_sample) {
        sv_engine_free(e);
        return MR_ENOMEM;
    }
    mr_sampler_params sp = {.temperature = 0.0f, .top_p = 1.0f};
    for (size_t i = 0; i < R; i++)
        if (mr_sampler_init(&e->smp[i], &sp, e->vocab)) {
            sv_engine_free(e);
            return MR_ENOMEM;
        }
    pthread_mutex_lock(&metrics->mu);
    metrics->kv_capacity_tokens = (int64_t)R * e->ctx;
    pthread_mutex_unlock(&metrics->mu);
    *out = e;
    return MR_OK;
}

void sv_engine_free(sv_engine *e) {
    if (!e) return;
    if (e->smp)
        for (int i = 0; i < e->max_running; i++) mr_sampler_free(&e->smp[i]);
    mr_free(e->slot);
    mr_free(e->smp);
    mr_free(e->logits);
    mr_free(e->b_seq);
    mr_free(e->b_ntok);
    mr_free(e->b_tok);
    mr_free(e->b_gen);
    mr_free(e->b_sample);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    mr_free(e);
}

bool sv_engine_reserve(sv_engine *e, int k) {
    long long cur = atomic_load(&e->reserved);
    do {
        if (cur + k > e->capacity) return false;
    } while (!atomic_compare_exchange_weak(&e->reserved, &cur, cur + k));
    return true;
}

void sv_engine_unreserve(sv_engine *e, int k) { atomic_fetch_sub(&e->reserved, k); }
int64_t sv_engine_inflight(sv_engine *e) { return (int64_t)atomic_load(&e->reserved); }

void sv_engine_submit(sv_engine *e, sv_job *j) {
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < j->n_gen; i++) {
        sv_gen *g = &j->gens[i];
        g->slot = -1;
        g->next = NULL;
        if (e->sub_tail) e->sub_tail->next = g;
        else e->sub_head = g;
        e->sub_tail = g;
    }
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void sv_engine_abort_all(sv_engine *e) {
    pthread_mutex_lock(&e->mu);
    e->abort_all = true;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

static int fin_index(sv_fin f) {
    return f == SV_FIN_STOP ? SV_FR_STOP : f == SV_FIN_LENGTH ? SV_FR_LENGTH : f == SV_FIN_ABORT ? SV_FR_ABORT : SV_FR_ERROR;
}

/* Ends a gen: publishes the reason, frees its slot, drops the job's engine
 * reference with the job's last gen. */
static void finish(sv_engine *e, sv_gen *g, sv_fin fin, const char *err) {
    sv_job *j = g->job;
    uint64_t now = mr_now_ns();
    if (g->slot >= 0) {
        mr_model_seq_reset(e->m, g->slot);
        e->slot[g->slot] = NULL;
        g->slot = -1;
    }
    pthread_mutex_lock(&e->met->mu);
    e->met->success[fin_index(fin)]++;
    if (fin != SV_FIN_ABORT && fin != SV_FIN_ERROR) sv_hist_observe(&e->met->e2e, (double)(now - j->t_arrive_ns) * 1e-9);
    pthread_mutex_unlock(&e->met->mu);
    pthread_mutex_lock(&j->mu);
    g->fin = fin;
    if (err) snprintf(g->err, sizeof g->err, "%s", err);
    bool last = --j->live == 0;
    j->version++;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    atomic_fetch_sub(&e->reserved, 1);
    if (last) sv_job_release(j);
}

static bool stop_id(const sv_gen *g, int32_t tok, mr_model *m) {
    const sv_request *r = &g->job->req;
    if (!g->ignore_eos && mr_model_is_eos(m, tok)) return true;
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] == tok) return true;
    return false;
}

/* Takes the submissions into the waiting list; false when the thread is to stop. */
static bool take_submissions(sv_engine *e, bool *abort) {
    pthread_mutex_lock(&e->mu);
    bool idle = true;
    for (int i = 0; i < e->max_running; i++)
        if (e->slot[i]) idle = false;
    while (!e->stop && !e->sub_head && !e->abort_all && idle && !e->wait_head) pthread_cond_wait(&e->cv, &e->mu);
    bool go = !e->stop;
    *abort = e->abort_all || e->stop;
    e->abort_all = false;
    if (e->sub_head) {
        if (e->wait_tail) e->wait_tail->next = e->sub_head;
        else e->wait_head = e->sub_head;
        e->wait_tail = e->sub_tail;
        for (sv_gen *g = e->sub_head; g; g = g->next) e->n_waiting++;
        e->sub_head = e->sub_tail = NULL;
    }
    pthread_mutex_unlock(&e->mu);
    return go;
}

/* Cancelled gens (client gone, stop string, drain timeout) end here, waiting or running. */
static void drop_cancelled(sv_engine *e, bool abort) {
    for (int i = 0; i < e->max_running; i++)
        if (e->slot[i] && (abort || atomic_load(&e->slot[i]->cancel))) finish(e, e->slot[i], SV_FIN_ABORT, NULL);
    sv_gen **pp = &e->wait_head, *prev = NULL;
    while (*pp) {
        sv_gen *g = *pp;
        if (abort || atomic_load(&g->cancel)) {
            *pp = g->next;
            if (e->wait_tail == g) e->wait_tail = prev;
            e->n_waiting--;
            finish(e, g, SV_FIN_ABORT, NULL);
        } else {
            prev = g;
            pp = &g->next;
        }
    }
}

/* FCFS into free slots. */
static void admit(sv_engine *e) {
    uint64_t now = mr_now_ns();
    for (int i = 0; i < e->max_running && e->wait_head; i++) {
        if (e->slot[i]) continue;
        sv_gen *g = e->wait_head;
        e->wait_head = g->next;
        if (!e->wait_head) e->wait_tail = NULL;
        e->n_waiting--;
        g->next = NULL;
        g->slot = i;
        g->n_fed = 0;
        g->t_sched_ns = now;
        e->slot[i] = g;
        mr_model_seq_reset(e->m, i);
        mr_sampler_params sp = g->sp;
        if (!g->job->req.has_seed) sp.seed = e->seed_counter++ * 0x9E3779B97F4A7C15ull;
        mr_sampler_free(&e->smp[i]);
        if (mr_sampler_init(&e->smp[i], &sp, e->vocab)) {
            finish(e, g, SV_FIN_ERROR, "out of memory for the sampler");
            continue;
        }
        pthread_mutex_lock(&e->met->mu);
        sv_hist_observe(&e->met->queue, (double)(now - g->job->t_arrive_ns) * 1e-9);
        pthread_mutex_unlock(&e->met->mu);
    }
}

/* Decodes first (one token each), then prefill chunks within the budget.
 * Returns the number of sequences in the batch. */
static int build_batch(sv_engine *e, int64_t *n_prefill) {
    int n = 0;
    int64_t used = 0;
    *n_prefill = 0;
    for (int i = 0; i < e->max_running; i++) {
        sv_gen *g = e->slot[i];
        if (!g || g->n_fed < g->n_prompt) continue;
        e->b_seq[n] = i;
        e->b_ntok[n] = 1;
        e->b_tok[used++] = g->out[g->n_out - 1];
        e->b_gen[n] = g;
        e->b_sample[n] = true;
        n++;
    }
    for (int i = 0; i < e->max_running && used < e->budget; i++) {
        sv_gen *g = e->slot[i];
        if (!g || g->n_fed >= g->n_prompt) continue;
        int64_t left = g->n_prompt - g->n_fed, room = e->budget - used;
        int64_t k = left < room ? left : room;
        memcpy(e->b_tok + used, g->prompt + g->n_fed, (size_t)k * sizeof(int32_t));
        e->b_seq[n] = i;
        e->b_ntok[n] = k;
        e->b_gen[n] = g;
        e->b_sample[n] = k == left;
        used += k;
        *n_prefill += k;
        n++;
    }
    return n;
}

/* The gauges of /metrics after a step, and the step's generated tokens. */
static void gauges(sv_engine *e, int64_t generated) {
    int64_t running = 0, used = 0;
    for (int i = 0; i < e->max_running; i++)
        if (e->slot[i]) {
            running++;
            used += e->slot[i]->n_fed + e->slot[i]->n_out;
        }
    pthread_mutex_lock(&e->met->mu);
    e->met->generation_tokens += (uint64_t)generated;
    e->met->running = running;
    e->met->waiting = e->n_waiting;
    e->met->kv_used_tokens = used;
    e->met->kv_usage = (double)used / (double)((int64_t)e->max_running * e->ctx);
    pthread_mutex_unlock(&e->met->mu);
}

static void *engine_main(void *arg) {
    sv_engine *e = arg;
    bool abort = false;
    while (take_submissions(e, &abort)) {
        /* 1. cancellations, at the step boundary, waiting and running alike */
        drop_cancelled(e, abort);
        /* 2. schedule: FCFS into free slots */
        admit(e);
        /* 3. build one batch */
        int64_t n_prefill;
        int n = build_batch(e, &n_prefill);
        if (n == 0) {
            gauges(e, 0);
            continue;
        }
        /* 4. forward */
        mr_batch b = {.n_seq = n, .seq = e->b_seq, .n_tok = e->b_ntok, .tokens = e->b_tok};
        if (mr_model_forward(e->m, &b, e->logits) != MR_OK) {
            char why[200];
            snprintf(why, sizeof why, "the forward pass failed: %s", mr_error_last());
            MR_ERROR("serve: %s", why);
            for (int i = 0; i < n; i++) finish(e, e->b_gen[i], SV_FIN_ERROR, why);
            continue;
        }
        /* 5. sample, stop checks, publish */
        uint64_t now = mr_now_ns();
        int64_t generated = 0;
        pthread_mutex_lock(&e->met->mu);
        for (int i = 0; i < n; i++) {
            sv_gen *g = e->b_gen[i];
            if (!e->b_sample[i]) continue;
            if (g->n_out == 0) sv_hist_observe(&e->met->ttft, (double)(now - g->job->t_arrive_ns) * 1e-9);
            else sv_hist_observe(&e->met->itl, (double)(now - g->t_last_ns) * 1e-9);
        }
        e->met->prompt_tokens += (uint64_t)n_prefill;
        pthread_mutex_unlock(&e->met->mu);
        for (int i = 0; i < n; i++) {
            sv_gen *g = e->b_gen[i];
            if (g->n_fed < g->n_prompt) g->n_fed += e->b_ntok[i];
            if (!e->b_sample[i]) continue;
            int32_t tok = mr_sampler_sample(&e->smp[g->slot], e->logits + (size_t)i * (size_t)e->vocab);
            generated++;
            g->t_last_ns = now;
            sv_fin fin = SV_FIN_NONE;
            if (stop_id(g, tok, e->m)) fin = SV_FIN_STOP;
            else if (g->n_out + 1 >= g->max_tokens || g->n_prompt + g->n_out + 1 >= e->ctx) fin = SV_FIN_LENGTH;
            sv_job *j = g->job;
            pthread_mutex_lock(&j->mu);
            g->out[g->n_out++] = tok;
            j->version++;
            pthread_cond_broadcast(&j->cv);
            pthread_mutex_unlock(&j->mu);
            /* 6. free what finished */
            if (fin != SV_FIN_NONE) finish(e, g, fin, NULL);
        }
        /* 7. gauges */
        gauges(e, generated);
    }
    /* stopping: everything still admitted ends as aborted */
    pthread_mutex_lock(&e->mu);
    if (e->sub_head) {
        if (e->wait_tail) e->wait_tail->next = e->sub_head;
        else e->wait_head = e->sub_head;
        e->wait_tail = e->sub_tail;
        e->sub_head = e->sub_tail = NULL;
    }
    pthread_mutex_unlock(&e->mu);
    drop_cancelled(e, true);
    pthread_mutex_lock(&e->met->mu);
    e->met->running = e->met->waiting = 0;
    e->met->kv_used_tokens = 0;
    e->met->kv_usage = 0;
    pthread_mutex_unlock(&e->met->mu);
    return NULL;
}

mr_status sv_engine_start(sv_engine *e) {
    if (pthread_create(&e->th, NULL, engine_main, e)) return mr_error_set(MR_ESTATE, "serve: cannot start the engine thread");
    e->started = true;
    return MR_OK;
}

void sv_engine_stop(sv_engine *e) {
    if (!e || !e->started) return;
    pthread_mutex_lock(&e->mu);
    e->stop = true;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->th, NULL);
    e->started = false;
}
