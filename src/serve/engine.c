/* engine.c — the engine thread of the server: the only user of the engine
 * (moerun/engine.h) and so of the model, its KV block pool and its request
 * table. HTTP threads hand it gens through a submission queue; each turn of
 * its loop reads top to bottom:
 *   take      the new submissions (waiting on the queue when there is no work)
 *   admit     each into the engine (mr_engine_add; the gen's cancel flag and
 *             the gen itself ride along as the request's flag and user pointer)
 *   step      mr_engine_step: schedule, forward, sample, stop checks; the
 *             engine reads every cancel flag at the step boundary and frees
 *             the blocks of what was cancelled in that step
 *   publish   each event's token goes to its job's output queue (g->out,
 *             under the job's lock); a job whose connection the HTTP event
 *             loop parked is woken (its connection resumed: the loop then
 *             writes all of the step's events of its connections in one
 *             wake-up); a finished gen drops its hold on the job
 *   gauges    /metrics from the engine's counters.
 * Nothing here allocates per token: g->out was sized by the HTTP thread at
 * admission.
 *
 * Expert parallelism (the model's MoE over several MPI ranks; rank 0 serves):
 * every step is broadcast to the other ranks, so the loop steps at least
 * every EP_HEARTBEAT_MS while idle (an empty step: the other ranks' deadline
 * then only fires when this rank stopped answering). When the group breaks
 * (a rank died or hung: the step's MR_EPEER) the engine can run nothing any
 * more: every gen, and every later one, ends as unavailable (503), and
 * sv_engine_failure says why (the server then exits). At the end the thread
 * tells the other ranks to stop. */
#include <errno.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moerun/grammar.h"
#include "serve/serve_internal.h"

/* A parked HTTP side to wake, taken under j->mu after a publish and called
 * once j->mu is free (the connection is parked, so its side cannot go away
 * in between). */
typedef struct wake_call {
    void (*fn)(void *);
    void *arg;
} wake_call;

struct sv_engine {
    mr_engine *eng;
    mr_model *m;
    int64_t capacity;          /* max_running + max_queued gens */
    int step_delay_ms;         /* tests: a sleep after each step that computed tokens */
    sv_metrics *met;
    pthread_t th;
    bool started;
    /* submission queue: HTTP threads -> engine thread */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sv_gen *sub_head, *sub_tail;
    bool stop, abort_all;
    bool stopped;              /* the thread has ended: a submission ends at once */
    /* a prefix-cache flush asked by an HTTP thread (one at a time: fmu), answered by the engine thread
     * between steps (fcv) */
    pthread_mutex_t fmu;
    pthread_cond_t fcv;
    bool flush_asked, flush_done;
    int flush_rc;
    int64_t flushed;
    atomic_llong reserved;     /* admitted, unfinished gens */
    /* engine thread only */
    sv_gen *live;              /* gens inside the engine */
    uint64_t seed_counter;
    /* expert parallelism */
    bool ep;                   /* several ranks: heartbeat steps, stop message at the end */
    uint64_t last_step_ns;
    atomic_int failed;         /* the group broke: fail_msg says why (written before failed is set) */
    char fail_msg[400];
    /* the parked HTTP sides a step's publishing woke, called together after it (engine thread) */
    wake_call *wakes;
    int n_wakes, cap_wakes;
    bool defer_wakes;
    sv_profile *prof;          /* /start_profile .. /stop_profile */
    /* generation control (under mu; the engine thread acts on it in control()) */
    char wver[SV_MAX_WEIGHT_VERSION + 1]; /* the weight version */
    bool paused;               /* nothing is computed */
    bool pause_asked;          /* a pause to make (pause_mode, pause_clear), answered by pause_done(pause_arg) */
    sv_pause_mode pause_mode;
    bool pause_clear, pause_started;
    bool pause_sleep;          /* the pause is a sleep: once it holds, the KV cache's memory goes back */
    bool sleeping;             /* paused with the KV pool's pages given back (slept_bytes resident), until continued */
    size_t slept_bytes;
    char pause_err[300];       /* why a sleep could not give the memory back */
    sv_ctl_done pause_done;
    void *pause_arg;
    bool flush_idle;           /* drop the prefix cache once no request runs (a pause's clear_cache) */
    bool swap_asked;           /* a swap of swap_staged (sv_engine_swap), swap_o, answered in swap_http (swap_done) */
    mr_model *swap_staged;     /* NULL: this rank's load failed (expert parallel: the others hear it) */
    sv_swap_opts swap_o;
    char swap_ver[SV_MAX_WEIGHT_VERSION + 1];
    bool swap_aborted, swap_done;
    int swap_http, swap_held;
    char swap_msg[600];
    const char *epl_dir;       /* a load for the other ranks to start (sv_engine_ep_load), answered in epl_http */
    bool epl_done;
    int epl_http;
    char epl_msg[300];
};

#define EP_HEARTBEAT_MS 500

mr_status sv_engine_new(mr_engine *eng, const mr_server_opts *o, sv_metrics *metrics, sv_engine **out) {
    *out = NULL;
    sv_engine *e = mr_calloc(1, sizeof *e);
    if (!e) return MR_ENOMEM;
    e->eng = eng;
    e->m = mr_engine_model(eng);
    e->capacity = (int64_t)mr_engine_opts_of(eng)->max_running_requests + o->max_queued_requests;
    e->step_delay_ms = o->debug_step_delay_ms;
    e->met = metrics;
    e->seed_counter = mr_now_ns();
    int rank, size;
    mr_model_ep(e->m, &rank, &size);
    e->ep = size > 1;
    e->cap_wakes = e->capacity < 4096 ? (int)e->capacity : 4096;
    e->wakes = mr_calloc((size_t)e->cap_wakes, sizeof *e->wakes);
    e->prof = sv_profile_new();
    snprintf(e->wver, sizeof e->wver, "%s", o->weight_version && *o->weight_version ? o->weight_version : "default");
    if (!e->wakes || !e->prof) {
        mr_free(e->wakes);
        sv_profile_free(e->prof);
        mr_free(e);
        return MR_ENOMEM;
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_mutex_init(&e->fmu, NULL);
    pthread_cond_init(&e->fcv, NULL);
    *out = e;
    return MR_OK;
}

void sv_engine_free(sv_engine *e) {
    if (!e) return;
    mr_engine_free(e->eng);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->fmu);
    pthread_cond_destroy(&e->fcv);
    mr_free(e->wakes);
    sv_profile_free(e->prof);
    mr_free(e);
}

sv_profile *sv_engine_profile(sv_engine *e) { return e->prof; }

bool sv_engine_reserve(sv_engine *e, int k) {
    long long cur = atomic_load(&e->reserved);
    do {
        if (cur + k > e->capacity) return false;
    } while (!atomic_compare_exchange_weak(&e->reserved, &cur, cur + k));
    return true;
}

void sv_engine_unreserve(sv_engine *e, int k) { atomic_fetch_sub(&e->reserved, k); }
int64_t sv_engine_inflight(sv_engine *e) { return (int64_t)atomic_load(&e->reserved); }
const char *sv_engine_failure(sv_engine *e) { return e && atomic_load(&e->failed) ? e->fail_msg : NULL; }

static void finish(sv_engine *e, sv_gen *g, sv_fin fin, const char *err);

void sv_engine_submit(sv_engine *e, sv_job *j) {
    pthread_mutex_lock(&e->mu);
    if (e->stopped) { /* nobody will take them (a request that raced the shutdown) */
        pthread_mutex_unlock(&e->mu);
        for (int i = 0, n = j->n_gen; i < n; i++) finish(e, &j->gens[i], SV_FIN_ABORT, NULL);
        return;
    }
    for (int i = 0; i < j->n_gen; i++) {
        sv_gen *g = &j->gens[i];
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

static wake_call take_wake(sv_job *j) {
    wake_call w = {0};
    if (!j->parked || !j->wake || !(j->wake_each || j->live == 0)) return w;
    j->parked = false;
    w.fn = j->wake;
    w.arg = j->wake_arg;
    return w;
}

/* Wakes a parked HTTP side now, or, while a step's events are published, after the last of
 * them: the HTTP loop then finds the step's events of all its streams in one wake-up instead
 * of being woken per stream on the other core while the engine still publishes (each wake-up
 * there preempts the step's second thread and contends for the job's and the loop's locks).
 * The connection stays parked, and its side alive, until the call. */
static void wake(sv_engine *e, wake_call w) {
    if (!w.fn) return;
    if (e->defer_wakes && e->n_wakes < e->cap_wakes) e->wakes[e->n_wakes++] = w;
    else w.fn(w.arg);
}

static void wake_deferred(sv_engine *e) {
    for (int i = 0; i < e->n_wakes; i++) e->wakes[i].fn(e->wakes[i].arg);
    e->n_wakes = 0;
}

/* Ends a gen: publishes the reason, drops the job's engine hold with its last gen. */
static void finish(sv_engine *e, sv_gen *g, sv_fin fin, const char *err) {
    sv_job *j = g->job;
    if (g->echo_only && fin == SV_FIN_STOP) fin = SV_FIN_LENGTH; /* max_tokens 0 reached, whatever the unsent token */
    if (g->rid) { /* out of the live list */
        if (g->lprev) g->lprev->lnext = g->lnext;
        else e->live = g->lnext;
        if (g->lnext) g->lnext->lprev = g->lprev;
        g->lprev = g->lnext = NULL;
        g->rid = 0;
    }
    uint64_t now = mr_now_ns();
    pthread_mutex_lock(&e->met->mu);
    e->met->success[fin_index(fin)]++;
    if (fin == SV_FIN_STOP || fin == SV_FIN_LENGTH) { /* the phases of a request that ran to its end */
        sv_hist_observe(&e->met->e2e, (double)(now - j->t_arrive_ns) * 1e-9);
        if (g->t_first_ns) sv_hist_observe(&e->met->decode, (double)(now - g->t_first_ns) * 1e-9);
        if (g->t_sched_ns) sv_hist_observe(&e->met->inference, (double)(now - g->t_sched_ns) * 1e-9);
        sv_hist_observe(&e->met->prompt_len, (double)g->n_prompt);
        sv_hist_observe(&e->met->gen_len, (double)g->n_out);
    }
    pthread_mutex_unlock(&e->met->mu);
    char wver[sizeof g->wver];
    pthread_mutex_lock(&e->mu);
    memcpy(wver, e->wver, sizeof wver);
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_lock(&j->mu);
    memcpy(g->wver, wver, sizeof wver); /* the version it ended under (a weight update may come between steps) */
    g->fin = fin;
    if (err) snprintf(g->err, sizeof g->err, "%s", err);
    bool last = --j->live == 0;
    j->version++;
    const wake_call w = take_wake(j);
    pthread_mutex_unlock(&j->mu);
    wake(e, w);
    atomic_fetch_sub(&e->reserved, 1);
    if (last) sv_job_release(j);
}

/* Whether a gen in the engine was cancelled (while the schedule is held, a step is run only to end them). */
static bool any_cancelled(const sv_engine *e) {
    for (const sv_gen *g = e->live; g; g = g->lnext)
        if (atomic_load_explicit(&g->cancel, memory_order_relaxed)) return true;
    return false;
}

/* Something for the engine thread to do between steps (under mu): a flush; a pause to start, or one waiting
 * for the running requests, which have ended; a swap, likewise; a prefix cache to drop once idle. */
static bool ctl_pending(const sv_engine *e) {
    const bool idle = mr_engine_running(e->eng) == 0;
    return e->flush_asked || (e->pause_asked && (!e->pause_started || idle || e->paused)) ||
           (e->swap_asked && !e->swap_done && (idle || e->paused || !e->swap_staged)) || (e->flush_idle && idle) ||
           (e->epl_dir && !e->epl_done);
}

/* Takes the submissions; false when the thread is to stop. While the schedule is held with requests in the
 * engine it wakes every HOLD_TICK_MS to end the cancelled ones (a cancellation does not signal). */
#define HOLD_TICK_MS 50
static sv_gen *take(sv_engine *e, bool *go, bool *abort) {
    pthread_mutex_lock(&e->mu);
    const bool held = mr_engine_has_work(e->eng) && !mr_engine_has_runnable(e->eng);
    if ((e->ep && !atomic_load(&e->failed)) || held) { /* wake up in time for the heartbeat, or the tick */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (held ? HOLD_TICK_MS : EP_HEARTBEAT_MS) * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        while (!e->stop && !e->sub_head && !e->abort_all && !ctl_pending(e) && !mr_engine_has_runnable(e->eng))
            if (pthread_cond_timedwait(&e->cv, &e->mu, &ts) == ETIMEDOUT) break;
    } else {
        while (!e->stop && !e->sub_head && !e->abort_all && !ctl_pending(e) && !mr_engine_has_runnable(e->eng))
            pthread_cond_wait(&e->cv, &e->mu);
    }
    *go = !e->stop;
    *abort = e->abort_all || e->stop;
    e->abort_all = false;
    sv_gen *g = e->sub_head;
    e->sub_head = e->sub_tail = NULL;
    pthread_mutex_unlock(&e->mu);
    return g;
}

static void cancel_live(sv_engine *e) {
    for (sv_gen *g = e->live; g; g = g->lnext) sv_gen_cancel(g, SV_CANCEL_ABORT);
}

/* The engine cannot run any more (an expert-parallel rank failed, MR_EPEER): every request ends with why, as
 * unavailable (engine thread). */
static void broke(sv_engine *e, const char *why) {
    snprintf(e->fail_msg, sizeof e->fail_msg, "%s", why);
    atomic_store(&e->failed, 1);
    while (e->live) {
        e->live->unavailable = true;
        finish(e, e->live, SV_FIN_ERROR, why);
    }
}

/* The hold that the pause and a swap under way leave (under mu). */
static void set_hold(sv_engine *e) {
    const bool drain = (e->pause_asked && e->pause_mode == SV_PAUSE_WAIT) ||
                       (e->swap_asked && !e->swap_done && e->swap_staged);
    mr_engine_set_hold(e->eng, e->paused ? MR_HOLD_ALL : drain ? MR_HOLD_ADMIT : MR_HOLD_NONE);
}

/* The new weights in (under mu, between steps), running requests held in place on them. */
static void swap_in(sv_engine *e, int running) {
    int64_t dropped = 0;
    mr_model_weights_swap(e->m, e->swap_staged);
    if (e->swap_o.flush && mr_engine_flush_prefix_cache(e->eng, &dropped))
        MR_WARN("serve: the prefix cache was not flushed after the weight update: %s", mr_error_last());
    if (e->swap_o.version) snprintf(e->wver, sizeof e->wver, "%s", e->swap_ver);
    if (e->swap_o.keep_pause) e->paused = true;
    e->swap_held = running;
    snprintf(e->swap_msg, sizeof e->swap_msg, "Succeeded to update model weights (weight version %s%s).", e->wver,
             e->swap_o.flush ? ", prefix cache flushed" : "");
}

/* Expert parallel, with mu free: every rank's verdict on the swap decided in control() (swap_http 200: this
 * rank's part can go in); all agree: the swap, on every rank. */
static void ep_commit(sv_engine *e, int running) {
    pthread_mutex_lock(&e->mu);
    const int mine = e->swap_http;
    char why[sizeof e->swap_msg];
    snprintf(why, sizeof why, "%s", e->swap_msg);
    const double timeout_s = e->swap_o.ep_timeout_s;
    pthread_mutex_unlock(&e->mu);
    mr_status st = mr_engine_ep_commit(e->eng, mine == 200 ? MR_OK : MR_ECONFIG, why, timeout_s);
    char err[400] = "";
    if (st) snprintf(err, sizeof err, "%s", mr_error_last());
    if (st == MR_EPEER) {
        char b[300];
        snprintf(b, sizeof b, "the engine failed: %s", err);
        MR_ERROR("serve: %s", b);
        broke(e, b);
    }
    pthread_mutex_lock(&e->mu);
    if (!st) {
        swap_in(e, running);
    } else if (mine == 200 || st == MR_EPEER) { /* another rank refused, or the group broke: nothing changed */
        e->swap_http = st == MR_EPEER ? 503 : 400;
        snprintf(e->swap_msg, sizeof e->swap_msg, "the weights were not updated (the model runs on as before): %s", err);
    }
    e->swap_done = true;
    pthread_cond_broadcast(&e->fcv);
    set_hold(e);
    pthread_mutex_unlock(&e->mu);
}

/* A sleep's pause holds (mu free; every request retracted): the KV cache's memory goes back, on every
 * expert-parallel rank; 200, or 500 (503: the group broke) with pause_err. */
static int sleep_release(sv_engine *e) {
    size_t bytes = 0;
    const size_t rss0 = mr_mem_proc_kb("/proc/self/status", "RssAnon:");
    const mr_status st = mr_engine_release_kv(e->eng, &bytes);
    const size_t rss1 = mr_mem_proc_kb("/proc/self/status", "RssAnon:");
    if (st) {
        char b[300];
        snprintf(b, sizeof b, "the KV cache was not released: %s", mr_error_last());
        if (st == MR_EPEER) {
            MR_ERROR("serve: %s", b);
            broke(e, b);
        }
        pthread_mutex_lock(&e->mu);
        snprintf(e->pause_err, sizeof e->pause_err, "%s", b);
        pthread_mutex_unlock(&e->mu);
        return st == MR_EPEER ? 503 : 500;
    }
    pthread_mutex_lock(&e->mu);
    e->sleeping = e->paused; /* a continue that came meanwhile woke it already */
    e->slept_bytes = rss0 > rss1 ? rss0 - rss1 : 0; /* resident memory, not the pool's address range */
    pthread_mutex_unlock(&e->mu);
    MR_INFO("serve: asleep: the KV pool's %.1f MiB dropped, %.1f MiB of them resident", (double)bytes / 1048576.0,
            (double)(rss0 > rss1 ? rss0 - rss1 : 0) / 1048576.0);
    return 200;
}

/* The pause, the swap and the flush-when-idle asked for, between steps (engine thread); then the hold they
 * leave. Callbacks and the expert-parallel exchanges run with mu free. */
static void control(sv_engine *e) {
    sv_ctl_done cb = NULL;
    void *cb_arg = NULL;
    bool commit = false;
    pthread_mutex_lock(&e->mu);
    const char *load = e->epl_dir && !e->epl_done ? e->epl_dir : NULL;
    const int running = mr_engine_running(e->eng);
    if (e->pause_asked && !e->pause_started) {
        e->pause_started = true;
        if (e->pause_mode == SV_PAUSE_ABORT) cancel_live(e); /* they end at the next step */
        else if (e->pause_mode == SV_PAUSE_RETRACT) mr_engine_retract(e->eng);
    }
    int cb_http = 200;
    bool release = false;
    if (e->pause_asked && (e->pause_mode != SV_PAUSE_WAIT || running == 0 || e->paused)) { /* it holds */
        e->paused = true;
        e->flush_idle |= e->pause_clear;
        cb = e->pause_done, cb_arg = e->pause_arg;
        e->pause_asked = false;
        release = e->pause_sleep; /* retracted just now: no request holds a block */
        MR_INFO("serve: generation paused (%s)", e->pause_mode == SV_PAUSE_ABORT     ? "abort"
                                                 : e->pause_mode == SV_PAUSE_RETRACT ? "retract"
                                                 : e->pause_mode == SV_PAUSE_WAIT    ? "wait"
                                                                                     : "in place");
    }
    if (e->swap_asked && !e->swap_done) {
        if (e->swap_staged && e->swap_o.abort_all && !e->swap_aborted) {
            e->swap_aborted = true;
            cancel_live(e);
        }
        if (!e->swap_staged || e->paused || running == 0) {
            e->swap_http = 200;
            if (!e->swap_staged) {
                e->swap_http = 400; /* this rank's load failed: swap_msg says why */
            } else if (e->swap_o.flush && running > 0) {
                e->swap_http = 400;
                snprintf(e->swap_msg, sizeof e->swap_msg,
                         "%d requests are paused in place holding KV blocks, so the prefix cache cannot be flushed: "
                         "nothing was changed (flush_cache false keeps the cache, or pause with mode retract or abort)",
                         running);
            }
            if (e->ep && atomic_load(&e->failed)) { /* the group broke: no rank can hear a commit */
                e->swap_http = 503;
                snprintf(e->swap_msg, sizeof e->swap_msg, "%s", e->fail_msg);
                e->swap_done = true;
                pthread_cond_broadcast(&e->fcv);
            } else if (e->ep) {
                commit = true; /* every rank swaps, or none: ep_commit decides */
            } else {
                if (e->swap_http == 200) swap_in(e, running);
                e->swap_done = true;
                pthread_cond_broadcast(&e->fcv);
            }
        }
    }
    if (e->flush_idle && running == 0 && !mr_engine_flush_prefix_cache(e->eng, NULL)) e->flush_idle = false;
    set_hold(e);
    pthread_mutex_unlock(&e->mu);
    if (release) cb_http = sleep_release(e);
    if (cb) cb(cb_arg, cb_http, cb_http == 200 ? NULL : e->pause_err);
    if (load) { /* the other ranks start loading (the leader's own load runs on the caller's thread) */
        mr_status st = mr_engine_ep_load(e->eng, load);
        char b[300];
        if (st) snprintf(b, sizeof b, "the engine failed: %s", mr_error_last());
        if (st == MR_EPEER) {
            MR_ERROR("serve: %s", b);
            broke(e, b);
        }
        pthread_mutex_lock(&e->mu);
        e->epl_http = st ? 503 : 200;
        if (st) snprintf(e->epl_msg, sizeof e->epl_msg, "%s", b);
        e->epl_done = true;
        pthread_cond_broadcast(&e->fcv);
        pthread_mutex_unlock(&e->mu);
    }
    if (commit) ep_commit(e, running); /* on a group broken meanwhile (the load above), its exchange fails at once */
}

/* Structured outputs: the gen's matcher behind the engine's constraint seam. */
static int64_t con_mask(void *ctx, uint32_t *allow) { return mr_matcher_mask(((sv_gen *)ctx)->matcher, allow); }
static mr_status con_accept(void *ctx, int32_t tok) { return mr_matcher_accept(((sv_gen *)ctx)->matcher, tok); }

/* Into the engine; a refusal ends the gen with its reason. */
static void admit(sv_engine *e, sv_gen *g) {
    const sv_request *r = &g->job->req;
    mr_request_params p = {
        .prompt = g->prompt,
        .n_prompt = g->n_prompt,
        .max_tokens = g->max_tokens,
        .sampling = g->sp,
        .stop_ids = r->stop_ids,
        .n_stop_ids = r->n_stop_ids,
        .ignore_eos = g->ignore_eos,
        .min_tokens = r->min_tokens,
        .logit_bias = r->logit_bias,
        .n_logit_bias = r->n_logit_bias,
        .allowed_ids = r->allowed,
        .n_allowed = r->n_allowed,
        .bad_words = r->bad_ids,
        .bad_word_len = r->bad_len,
        .n_bad_words = r->n_bad_seq,
        .logprobs = r->logprobs,
        .top_logprobs = r->top_logprobs > r->plp_top ? r->top_logprobs : r->plp_top,
        .prompt_logprobs = g->plp != NULL,
        .prompt_logprobs_from = r->plp_from,
        .logprob_ids = g->lp_ids,
        .priority = r->priority,
        .routes = g->routes != NULL,
        .cache_salt = r->cache_salt,
        .n_cache_salt = r->cache_salt ? r->n_cache_salt : 0,
        .n_logprob_ids = g->n_lp_ids,
        .forced = g->forced,
        .n_forced = g->n_forced,
        .cancel = &g->cancel,
        .user = g,
    };
    if (g->matcher) p.constraint = (mr_token_constraint){con_mask, con_accept, g};
    if (!r->has_seed) p.sampling.seed = e->seed_counter++ * 0x9E3779B97F4A7C15ull;
    if (atomic_load(&e->failed)) { /* the engine can run nothing any more */
        g->unavailable = true;
        finish(e, g, SV_FIN_ERROR, e->fail_msg);
        return;
    }
    pthread_mutex_lock(&e->mu); /* its version so far (read by the HTTP side after a publish) */
    memcpy(g->wver, e->wver, sizeof g->wver);
    pthread_mutex_unlock(&e->mu);
    mr_req_id id;
    mr_status st = mr_engine_add(e->eng, &p, &id);
    if (st) {
        char why[200];
        snprintf(why, sizeof why, "the engine refused the request: %s", mr_error_last());
        finish(e, g, SV_FIN_ERROR, why);
        return;
    }
    g->rid = id;
    g->lprev = NULL;
    g->lnext = e->live;
    if (e->live) e->live->lprev = g;
    e->live = g;
}

/* the engine's reason; a cancellation because a stop string ended the output (cancel: sv_gen.cancel) is a stop */
static sv_fin fin_of(mr_finish_reason f, int cancel) {
    switch (f) {
    case MR_FINISH_STOP: return SV_FIN_STOP;
    case MR_FINISH_LENGTH: return SV_FIN_LENGTH;
    case MR_FINISH_CANCELLED: return cancel == SV_CANCEL_DONE ? SV_FIN_STOP : SV_FIN_ABORT;
    default: return SV_FIN_ERROR;
    }
}

/* One event: its token to the job's queue, then the end if it is one. */
static void publish(sv_engine *e, const mr_engine_event *ev, uint64_t now) {
    sv_gen *g = ev->user;
    sv_job *j = g->job;
    if (ev->n_plp > 0 && g->plp) { /* echo with logprobs, prompt_logprobs: the prompt tokens' entries, in order */
        pthread_mutex_lock(&j->mu);
        for (int k = 0; k < ev->n_plp; k++) {
            const int64_t p = ev->plp_pos + k;
            if (p < 1 || p >= g->n_prompt) continue;
            const mr_token_logprob *row = ev->plp + (size_t)k * (size_t)ev->plp_stride;
            sv_logprob *l = sv_logprob_at(g->plp, j->req.plp_top, p);
            l->logprob = row[0].logprob;
            l->rank = ev->plp_rank[k];
            l->n_top = ev->plp_ntop < j->req.plp_top ? ev->plp_ntop : j->req.plp_top;
            for (int t = 0; t < l->n_top; t++) l->top[t] = row[1 + t];
            if (g->plp_idlp && ev->plp_id_logprob && ev->n_logprob_ids == g->n_lp_ids)
                memcpy(g->plp_idlp + (size_t)p * (size_t)g->n_lp_ids, ev->plp_id_logprob + (size_t)k * (size_t)g->n_lp_ids,
                       (size_t)g->n_lp_ids * sizeof(float));
            if (p + 1 > g->n_plp) g->n_plp = p + 1;
        }
        j->version++;
        const wake_call w = take_wake(j);
        pthread_mutex_unlock(&j->mu);
        wake(e, w);
    }
    if (ev->n_routes > 0 && g->routes) { /* the routed experts of the positions computed */
        const mr_model_config *mc = mr_model_config_of(e->m);
        const size_t row = (size_t)mc->n_layers * (size_t)mc->top_k;
        pthread_mutex_lock(&j->mu);
        for (int64_t q = 0; q < ev->n_routes; q++)
            if (ev->routes_pos + q < g->routes_cap)
                memcpy(g->routes + (size_t)(ev->routes_pos + q) * row, ev->routes + (size_t)q * row, row * sizeof(int32_t));
        pthread_mutex_unlock(&j->mu);
    }
    if (ev->n_tokens == 1 && g->echo_only) { /* max_tokens 0: the prompt alone; the token is not counted */
        pthread_mutex_lock(&j->mu);
        g->cached_tokens = ev->n_cached;
        if (g->idlp && ev->id_logprob && ev->n_logprob_ids == g->n_lp_ids) { /* the next token's distribution */
            memcpy(g->idlp, ev->id_logprob, (size_t)g->n_lp_ids * sizeof(float));
            g->idlp_next = true;
        }
        pthread_mutex_unlock(&j->mu);
        g->seen_first = true;
    } else if (ev->n_tokens == 1) {
        pthread_mutex_lock(&e->met->mu);
        if (!g->seen_first) {
            sv_hist_observe(&e->met->ttft, (double)(now - j->t_arrive_ns) * 1e-9);
            if (ev->sched_ns) { /* ttft = queue + prefill */
                g->t_sched_ns = ev->sched_ns;
                sv_hist_observe(&e->met->queue, (double)(ev->sched_ns - j->t_arrive_ns) * 1e-9);
                sv_hist_observe(&e->met->prefill, (double)(now - ev->sched_ns) * 1e-9);
            }
            g->t_first_ns = now;
        } else {
            sv_hist_observe(&e->met->itl, (double)(now - g->t_last_ns) * 1e-9);
        }
        pthread_mutex_unlock(&e->met->mu);
        pthread_mutex_lock(&j->mu);
        if (g->n_out < g->max_tokens) {
            g->out[g->n_out] = ev->token;
            if (g->lp) {
                sv_logprob *l = sv_logprob_at(g->lp, j->req.top_logprobs, g->n_out);
                l->logprob = ev->logprob;
                l->rank = 0;
                l->n_top = ev->n_top < j->req.top_logprobs ? ev->n_top : j->req.top_logprobs;
                for (int k = 0; k < l->n_top; k++) l->top[k] = ev->top[k];
            }
            if (g->idlp && ev->id_logprob && ev->n_logprob_ids == g->n_lp_ids)
                memcpy(g->idlp + (size_t)g->n_out * (size_t)g->n_lp_ids, ev->id_logprob,
                       (size_t)g->n_lp_ids * sizeof(float));
            g->n_out++;
        }
        if (!g->seen_first) g->cached_tokens = ev->n_cached;
        j->version++;
        const wake_call w = take_wake(j);
        pthread_mutex_unlock(&j->mu);
        wake(e, w);
        g->seen_first = true;
        g->t_last_ns = now;
    }
    if (ev->finish != MR_FINISH_NONE) finish(e, g, fin_of(ev->finish, atomic_load(&g->cancel)), ev->error);
}

static void gauges(sv_engine *e) {
    mr_engine_stats st;
    mr_engine_stats_get(e->eng, &st);
    pthread_mutex_lock(&e->met->mu);
    e->met->running = st.running;
    e->met->waiting = st.waiting;
    e->met->kv_usage = st.kv_usage;
    e->met->kv_used_blocks = st.kv_blocks_used;
    e->met->kv_total_blocks = st.kv_blocks_total;
    e->met->prompt_tokens = st.prompt_tokens;
    e->met->generation_tokens = st.generation_tokens;
    e->met->preemptions = st.preemptions;
    e->met->prefix_queries = st.prefix_queries;
    e->met->prefix_hits = st.prefix_hits;
    e->met->steps = st.steps;
    e->met->step_ns[0] = st.schedule_ns;
    e->met->step_ns[1] = st.forward_ns;
    e->met->step_ns[2] = st.sample_ns;
    e->met->step_ns[3] = st.complete_ns;
    pthread_mutex_unlock(&e->met->mu);
}

static void *engine_main(void *arg) {
    sv_engine *e = arg;
    bool go = true, abort = false;
    for (;;) {
        /* 1. take the submissions */
        sv_gen *subs = take(e, &go, &abort);
        /* 2. admit them (aborting: they end here) */
        for (sv_gen *g = subs, *nx; g; g = nx) {
            nx = g->next;
            if (abort) finish(e, g, SV_FIN_ABORT, NULL);
            else admit(e, g);
        }
        if (abort) cancel_live(e);
        if (!go && !e->live) break;
        control(e);
        /* a flush asked for: only while nothing is admitted (what was just admitted counts) */
        pthread_mutex_lock(&e->mu);
        if (e->flush_asked) {
            e->flush_rc = e->live ? 1 : mr_engine_flush_prefix_cache(e->eng, &e->flushed) ? -1 : 0;
            e->flush_asked = false;
            e->flush_done = true;
            pthread_cond_broadcast(&e->fcv);
        }
        pthread_mutex_unlock(&e->mu);
        /* 3. one step (cancellations included), its parts timed while a profile records */
        const mr_engine_step_out *out = NULL;
        const bool prof = sv_profile_on(e->prof);
        mr_engine_stats s0 = {0};
        mr_model_timing m0 = {0};
        const uint64_t t_step = mr_now_ns();
        if (prof) mr_engine_stats_get(e->eng, &s0), mr_model_timing_get(e->m, &m0);
        const bool beat = e->ep && mr_now_ns() - e->last_step_ns >= (uint64_t)EP_HEARTBEAT_MS * 1000000u;
        const bool work = mr_engine_has_runnable(e->eng) || (mr_engine_has_work(e->eng) && any_cancelled(e));
        if (!atomic_load(&e->failed) && (work || beat)) {
            e->last_step_ns = mr_now_ns();
            mr_status st = mr_engine_step(e->eng, &out); /* on one thread or all: the engine picks per step */
            if (st) { /* the engine itself broke: end everything, never hang */
                char why[200];
                snprintf(why, sizeof why, "the engine failed: %s", mr_error_last());
                MR_ERROR("serve: %s", why);
                if (st == MR_EPEER) broke(e, why); /* for good: an expert-parallel rank failed */
                while (e->live) finish(e, e->live, SV_FIN_ERROR, why);
                out = NULL;
            }
        }
        /* 4. gauges, before any client hears of the step: a client that has its answer and reads
         * /metrics finds the step's tokens counted */
        gauges(e);
        if (out && out->n_tokens > 0) {
            pthread_mutex_lock(&e->met->mu);
            sv_hist_observe(&e->met->iter, (double)out->n_tokens);
            pthread_mutex_unlock(&e->met->mu);
        }
        /* 5. publish (a profile has the step first: a client that has its answer and stops the profile finds
         * every step of it; the publishing's end is added after) */
        uint64_t now = mr_now_ns();
        int64_t prof_at = -1;
        if (prof && out) {
            mr_engine_stats s1;
            mr_model_timing m1;
            mr_engine_stats_get(e->eng, &s1);
            mr_model_timing_get(e->m, &m1);
            sv_prof_step ps = {.step = s1.steps, .t0 = t_step, .t_publish = now, .t_end = now,
                               .schedule_ns = s1.schedule_ns - s0.schedule_ns, .forward_ns = s1.forward_ns - s0.forward_ns,
                               .sample_ns = s1.sample_ns - s0.sample_ns, .complete_ns = s1.complete_ns - s0.complete_ns,
                               .attention_ns = m1.attention_ns - m0.attention_ns, .moe_ns = m1.moe_ns - m0.moe_ns,
                               .other_ns = m1.other_ns - m0.other_ns, .n_prefill = out->n_prefill_tokens,
                               .n_decode = out->n_decode_tokens, .n_seq = out->n_seq, .n_preempted = out->n_preempted,
                               .n_events = out->n_events};
            prof_at = sv_profile_step(e->prof, &ps);
        }
        e->defer_wakes = true;
        for (int i = 0; out && i < out->n_events; i++) publish(e, &out->events[i], now);
        e->defer_wakes = false;
        wake_deferred(e);
        if (prof_at >= 0) sv_profile_step_end(e->prof, prof_at, t_step, mr_now_ns());
        if (e->step_delay_ms && out && out->n_tokens > 0)
            nanosleep(&(struct timespec){e->step_delay_ms / 1000, (long)(e->step_delay_ms % 1000) * 1000000L}, NULL);
        if (!go && !e->live) break;
    }
    /* stopping: what is still submitted ends as aborted, and so does every later submission */
    pthread_mutex_lock(&e->mu);
    sv_gen *g = e->sub_head;
    e->sub_head = e->sub_tail = NULL;
    e->stopped = true;
    pthread_cond_broadcast(&e->fcv); /* a flush or a swap waiting: not done */
    sv_ctl_done cb = e->pause_asked ? e->pause_done : NULL;
    void *cb_arg = e->pause_arg;
    e->pause_asked = false;
    pthread_mutex_unlock(&e->mu);
    if (cb) cb(cb_arg, 503, "the server is shutting down");
    for (sv_gen *nx; g; g = nx) {
        nx = g->next;
        finish(e, g, SV_FIN_ABORT, NULL);
    }
    /* the other expert-parallel ranks leave their follow loop (nothing to do when the group broke) */
    if (e->ep && !atomic_load(&e->failed) && mr_engine_ep_stop(e->eng))
        MR_ERROR("serve: cannot stop the other ranks: %s", mr_error_last());
    return NULL;
}

int sv_engine_flush(sv_engine *e, int64_t *dropped) {
    *dropped = 0;
    if (sv_engine_inflight(e) > 0) return 1; /* at once, without waiting for the step under way */
    pthread_mutex_lock(&e->fmu);
    pthread_mutex_lock(&e->mu);
    int rc = -1;
    if (!e->stopped) { /* started: the server serves (http.c asks only then) */
        e->flush_asked = true;
        e->flush_done = false;
        pthread_cond_signal(&e->cv);
        while (!e->flush_done && !e->stopped) pthread_cond_wait(&e->fcv, &e->mu);
        if (e->flush_done) rc = e->flush_rc, *dropped = e->flushed;
        e->flush_asked = false;
    }
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_unlock(&e->fmu);
    return rc;
}

static int pause_ask(sv_engine *e, sv_pause_mode mode, bool clear_cache, bool sleep, sv_ctl_done done, void *arg) {
    pthread_mutex_lock(&e->mu);
    if (e->pause_asked || e->stopped) {
        const bool stopped = e->stopped;
        pthread_mutex_unlock(&e->mu);
        if (stopped) done(arg, 503, "the server is shutting down");
        return stopped ? 0 : 1;
    }
    e->pause_asked = true;
    e->pause_started = false;
    e->pause_mode = mode;
    e->pause_clear = clear_cache;
    e->pause_sleep = sleep;
    e->pause_done = done;
    e->pause_arg = arg;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

int sv_engine_pause(sv_engine *e, sv_pause_mode mode, bool clear_cache, sv_ctl_done done, void *arg) {
    return pause_ask(e, mode, clear_cache, false, done, arg);
}

int sv_engine_sleep(sv_engine *e, sv_ctl_done done, void *arg) {
    return pause_ask(e, SV_PAUSE_RETRACT, false, true, done, arg);
}

bool sv_engine_sleeping(sv_engine *e, size_t *bytes) {
    pthread_mutex_lock(&e->mu);
    const bool z = e->sleeping;
    if (bytes) *bytes = e->slept_bytes;
    pthread_mutex_unlock(&e->mu);
    return z;
}

bool sv_engine_continue(sv_engine *e) {
    pthread_mutex_lock(&e->mu);
    const bool was = e->paused;
    e->sleeping = false;
    sv_ctl_done cb = e->pause_asked ? e->pause_done : NULL;
    void *cb_arg = e->pause_arg;
    e->pause_asked = false;
    e->paused = false;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (cb) cb(cb_arg, 409, "generation was continued before the pause took hold");
    if (was) MR_INFO("serve: generation continued");
    return was;
}

bool sv_engine_paused(sv_engine *e) {
    pthread_mutex_lock(&e->mu);
    const bool p = e->paused;
    pthread_mutex_unlock(&e->mu);
    return p;
}

int sv_engine_swap(sv_engine *e, mr_model *staged, const sv_swap_opts *o, char *msg, size_t n, int *held) {
    *held = 0;
    MR_ASSERT(staged || e->ep);
    pthread_mutex_lock(&e->mu);
    int http = 503;
    const bool failed = atomic_load(&e->failed);
    if (!e->stopped && !failed) {
        e->swap_asked = true;
        e->swap_staged = staged;
        e->swap_o = *o;
        if (o->version) snprintf(e->swap_ver, sizeof e->swap_ver, "%s", o->version);
        if (!staged) snprintf(e->swap_msg, sizeof e->swap_msg, "%s", msg);
        e->swap_aborted = e->swap_done = false;
        pthread_cond_signal(&e->cv);
        while (!e->swap_done && !e->stopped) pthread_cond_wait(&e->fcv, &e->mu);
        if (e->swap_done) {
            http = e->swap_http;
            *held = e->swap_held;
            snprintf(msg, n, "%s", e->swap_msg);
        }
        e->swap_asked = false;
        e->swap_staged = NULL;
        e->swap_done = false;
    }
    if (http == 503 && (e->stopped || failed)) snprintf(msg, n, "%s", failed ? e->fail_msg : "the server is shutting down");
    pthread_mutex_unlock(&e->mu);
    return http;
}

bool sv_engine_ep(const sv_engine *e) { return e->ep; }

int sv_engine_ep_load(sv_engine *e, const char *dir, char *msg, size_t n) {
    if (!e->ep) return 200;
    pthread_mutex_lock(&e->mu);
    int http = 503;
    if (atomic_load(&e->failed)) {
        snprintf(msg, n, "%s", e->fail_msg);
    } else if (e->stopped) {
        snprintf(msg, n, "the server is shutting down");
    } else {
        e->epl_dir = dir;
        e->epl_done = false;
        pthread_cond_signal(&e->cv);
        while (!e->epl_done && !e->stopped) pthread_cond_wait(&e->fcv, &e->mu);
        http = e->epl_done ? e->epl_http : 503;
        snprintf(msg, n, "%s", !e->epl_done ? "the server is shutting down" : http != 200 ? e->epl_msg : "");
        e->epl_dir = NULL;
        e->epl_done = false;
    }
    pthread_mutex_unlock(&e->mu);
    return http;
}

void sv_engine_weight_version(sv_engine *e, char *out, size_t n) {
    pthread_mutex_lock(&e->mu);
    snprintf(out, n, "%s", e->wver);
    pthread_mutex_unlock(&e->mu);
}

void sv_engine_set_weight_version(sv_engine *e, const char *v) {
    pthread_mutex_lock(&e->mu);
    snprintf(e->wver, sizeof e->wver, "%s", v);
    pthread_mutex_unlock(&e->mu);
}

mr_status sv_engine_start(sv_engine *e) {
    if (pthread_create(&e->th, NULL, engine_main, e)) return mr_error_set(MR_ESTATE, "serve: cannot start the engine thread");
    e->started = true;
    return MR_OK;
}

/* Stops the thread: every gen is cancelled and the engine runs until their
 * cancellations are reported (one step). */
void sv_engine_stop(sv_engine *e) {
    if (!e) return;
    if (!e->started) {
        pthread_mutex_lock(&e->mu);
        e->stopped = true;
        pthread_mutex_unlock(&e->mu);
        return;
    }
    pthread_mutex_lock(&e->mu);
    e->stop = true;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->th, NULL);
    e->started = false;
}
