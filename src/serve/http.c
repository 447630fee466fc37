/* http.c — the HTTP layer of the server (libmicrohttpd's poll event loop:
 * one thread, or a pool of --threads-http, each serving its share of the
 * connections): routing, the limits where input enters (body size, header
 * and body deadlines, idle timeout, connection count, queue length), the
 * admission of a request into a job, and the streaming of its events.
 *
 * Nothing here blocks. The loop parses and validates the body, tokenizes the
 * prompt(s), reserves room in the engine's queue (503 at once when full),
 * submits the job and parks the connection (MHD_suspend_connection). The
 * engine thread resumes it when it publishes: for a stream the loop then
 * sends the SSE events of every token published since (one event per token)
 * and parks again; otherwise it parks until the last token (or, with stop
 * strings, looks at every publish) and sends the body. So one engine step
 * costs one wake-up of the loop, whatever the number of streams, instead of
 * a thread switch per stream.
 *
 * Deadlines that libmicrohttpd does not have (its timeout only sees silence,
 * and a client dribbling one byte a second is never silent) are kept by a
 * watchdog thread: a connection must deliver a request head within
 * header_timeout of its start or of its previous response, and the body
 * within body_timeout of the head; otherwise its socket is shut down. It
 * also watches the parked connections' sockets: a client that has gone
 * (hang-up, reset) while its request waits for the engine cancels the job,
 * which the engine frees at its next step. libmicrohttpd's completion
 * callback cancels it too when a write fails. */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <linux/tcp.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/json_internal.h"
#include "moerun/grammar.h"
#include "moerun/kernels.h"
#include "moerun/moe.h"
#include "serve/serve_internal.h"

enum { ST_LOADING = 0, ST_READY = 1, ST_DRAINING = 2 };

/* One TCP connection, as the watchdog sees it. */
typedef struct sv_conn {
    int fd;
    int phase;                 /* 0 waiting for a head, 1 receiving the body, 2 answering */
    uint64_t since_ns;         /* start of the phase; in phase 2, the last time the client took bytes */
    bool busy;                 /* phase 2: the server is waiting for the engine, not for the client */
    uint64_t acked;            /* phase 2: the bytes the client had acknowledged at the last look (TCP_INFO) */
    bool killed;
    struct sv_job *job;        /* phase 2: the request's job while it is in flight (the watchdog
                                  cancels it when the client hangs up); cancelled: done so */
    bool cancelled;
    struct sv_evlog *log;      /* phase 2: the events it follows, when it is a follower (a hang-up while
                                  it waits for them closes it and wakes the log's followers) */
    atomic_bool gone;          /* ... so closed: its follower ends instead of waiting again */
    struct mr_server *s;       /* for the CORS headers of its responses */
    struct sv_conn *prev, *next;
} sv_conn;

/* The events of a background response that streams (background and stream both true): what the driver
 * writes, kept whole for the connections that follow it, each from a place of its own (the request's own
 * connection from the first event; GET /v1/responses/{id}?stream=true&starting_after=N from event N + 1;
 * event i is the one of sequence_number i). Counted references: a follower still sending it outlives the job.
 * A follower with nothing left to send parks on it (suspended; it cannot complete while so) until the driver
 * appends or ends the log. */
typedef struct sv_evlog {
    pthread_mutex_t mu;
    sv_buf text;             /* the SSE events, in order */
    size_t *ends;            /* [n] the end of event i in text */
    int64_t n, cap;
    bool ended;              /* the last event is in */
    struct sv_hreq *parked;  /* followers waiting for more, linked by log_next */
    atomic_int refs;
} sv_evlog;

/* A background response (the Responses API's background: true): its job, run without a connection; the
 * driver thread reads what the engine publishes and keeps the Response when it ends. */
typedef struct sv_bg {
    sv_job *j;
    sv_out *out;
    sv_evlog *log;       /* its events when it streams, else NULL */
    bool started;        /* stored as in_progress */
    bool deleted;        /* DELETE came while it ran: cancelled, and dropped from the store when it ends */
    struct sv_bg *next;
} sv_bg;

struct mr_server {
    mr_server_opts o;
    char *name, *model_dir, *host, *api_key;
    mr_model *m;
    int64_t vocab;
    int64_t context_length, kv_blocks; /* the engine's */
    int max_running;
    mr_engine_opts eo;   /* the engine's options, for /get_server_info */
    char *resolution;    /* the resolver's decision (JSON), or NULL */
    sv_text *text;
    sv_metrics met;
    sv_store *store; /* the Responses API's stored responses, NULL when off */
    sv_store *convs; /* the Conversations API's conversations, NULL when off */
    bool cors_any;   /* CORS: every origin; else these (n_origins 0: none) */
    char **origins;
    int n_origins;
    /* background responses: the list (bgmu), the driver thread and its wake-ups (kmu) */
    pthread_mutex_t bgmu, kmu;
    pthread_cond_t kcv;
    sv_bg *bg;
    uint64_t kicks;
    pthread_t bgt;
    bool bg_started, bg_stop;
    sv_engine *eng;
    struct MHD_Daemon *d;
    int port;
    atomic_int state;
    atomic_bool stopping;
    /* unset sampling fields take generation_config.json */
    float def_temperature, def_top_p, def_min_p, def_repetition_penalty;
    int def_top_k;
    /* connections, for the watchdog */
    pthread_mutex_t cmu;
    pthread_cond_t ccv;
    sv_conn *conns;
    /* the jobs handed to the engine until their last reference goes (sglang's /abort_request finds them) */
    pthread_mutex_t jmu;
    sv_job *jobs;
    pthread_t wd;
    bool wd_started, wd_stop;
    atomic_ullong counter;
    /* the weight update under way (/update_weights_from_disk: one at a time, on its own thread) */
    atomic_bool updating;
    pthread_t upd;
    bool upd_started;
};

enum {
    R_NONE = 0, R_HEALTH, R_MODELS, R_MODEL, R_METRICS, R_COMPLETIONS, R_CHAT, R_RESPONSES, R_MESSAGES, R_TOKENIZE, R_DETOKENIZE,
    R_COUNT_TOKENS, R_PING, R_VERSION, R_GENERATE, R_RESPONSE_ID, R_FLUSH, R_RESET_PREFIX, R_SERVER_INFO,
    R_CONVERSATIONS, R_HEALTH_GENERATE, R_MODEL_INFO, R_ABORT, R_SCORE, R_EXPERT_START, R_EXPERT_STOP, R_EXPERT_DUMP,
    R_PROFILE_START, R_PROFILE_STOP, R_UPDATE_WEIGHTS, R_PAUSE, R_CONTINUE, R_VPAUSE, R_VRESUME, R_IS_PAUSED, R_SLEEP, R_WAKE, R_IS_SLEEPING,
    R_RELEASE_MEM, R_RESUME_MEM,
    R_SET_WVER, R_GET_WVER
};

/* One HTTP request. */
typedef struct sv_hreq {
    mr_server *s;
    struct MHD_Connection *mc;
    sv_conn *conn;
    int route;
    bool post;
    sv_buf body;
    bool over;                 /* the body passed max_body_bytes */
    size_t received;
    sv_job *job;
    sv_out *out;
    sv_buf sse;
    size_t sse_off;
    bool stream_done, complete;
    uint64_t t_arrive_ns;
    /* a follower of a background response's events (sv_evlog) */
    sv_evlog *log;
    int64_t log_from;          /* the first event to send */
    size_t log_off;            /* the next byte of log->text to send (SIZE_MAX: event log_from not in yet) */
    struct sv_hreq *log_next;  /* in log->parked */
    struct sv_op *op;          /* a control request answered later (a weight update, a pause that waits) */
} sv_hreq;

void mr_server_opts_default(mr_server_opts *o) {
    *o = (mr_server_opts){
        .host = "127.0.0.1",
        .port = 30000,
        .max_queued_requests = 256,
        .max_choices = 64,
        .max_body_bytes = (size_t)8 << 20,
        .header_timeout_s = 10,
        .body_timeout_s = 30,
        .idle_timeout_s = 60,
        .max_connections = 512,
        .http_threads = 1,
        .response_store_bytes = (size_t)64 << 20,
        .conversation_store_bytes = (size_t)64 << 20,
        .allowed_origins = "*",
    };
}

/* ---- jobs ---- */

/* A job handed to the engine joins the server's list (sglang's /abort_request), until its last reference. */
static void jobs_add(mr_server *s, sv_job *j) {
    pthread_mutex_lock(&s->jmu);
    j->jprev = NULL;
    j->jnext = s->jobs;
    if (s->jobs) s->jobs->jprev = j;
    s->jobs = j;
    j->listed = true;
    pthread_mutex_unlock(&s->jmu);
}

void sv_job_release(sv_job *j) {
    if (atomic_fetch_sub(&j->refs, 1) != 1) return;
    if (j->listed) { /* out of the list first: an abort that holds jmu still sees a whole job */
        mr_server *s = j->srv;
        pthread_mutex_lock(&s->jmu);
        if (j->jprev) j->jprev->jnext = j->jnext;
        else s->jobs = j->jnext;
        if (j->jnext) j->jnext->jprev = j->jprev;
        pthread_mutex_unlock(&s->jmu);
    }
    sv_request_free(&j->req);
    for (int i = 0; i < j->n_prompts && j->prompt_text; i++) mr_free(j->prompt_text[i]);
    mr_free(j->prompt_text);
    mr_free(j->prompt_len);
    mr_free(j->ids);
    mr_free(j->lp_ids);
    mr_free(j->idlp);
    mr_free(j->routes);
    mr_free(j->forced);
    for (int i = 0; j->gens && i < j->n_gen; i++) mr_matcher_free(j->gens[i].matcher);
    if (j->gens) {
        mr_free(j->gens[0].out);
        mr_free(j->gens[0].lp);
        mr_free(j->gens[0].plp);
    }
    mr_free(j->gens);
    pthread_mutex_destroy(&j->mu);
    mr_free(j);
}

/* ---- small helpers ---- */

/* The request's Origin when CORS allows it (NULL otherwise). */
static const char *cors_origin(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    const sv_conn *k = ci ? ci->socket_context : NULL;
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!k || !k->s || !origin) return NULL;
    if (k->s->cors_any) return origin;
    for (int i = 0; i < k->s->n_origins; i++)
        if (!strcmp(k->s->origins[i], origin)) return origin;
    return NULL;
}

/* Queues r with the CORS headers an allowed origin's browser needs to read it. */
static enum MHD_Result queue(struct MHD_Connection *c, unsigned status, struct MHD_Response *r) {
    const char *origin = cors_origin(c);
    if (origin) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
        MHD_add_response_header(r, "Vary", "Origin");
    }
    return MHD_queue_response(c, status, r);
}

/* a response with the header hn: hv where hn is given */
static enum MHD_Result send_text_h(struct MHD_Connection *c, int status, const char *type, const char *body, size_t n,
                                   const char *hn, const char *hv) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (hn) MHD_add_response_header(r, hn, hv);
    enum MHD_Result ok = queue(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_text(struct MHD_Connection *c, int status, const char *type, const char *body, size_t n) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ok = queue(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_json(struct MHD_Connection *c, int status, const char *body) {
    return send_text(c, status, "application/json", body, strlen(body));
}

static enum MHD_Result fail(mr_server *s, struct MHD_Connection *c, int http, const char *param, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;

/* A 200 with the JSON object o (stolen; NULL: out of memory, a 500). */
static enum MHD_Result send_object(mr_server *s, struct MHD_Connection *c, json_t *o) {
    char *b = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!b) return fail(s, c, 500, NULL, "out of memory");
    enum MHD_Result r = send_json(c, 200, b);
    free(b);
    return r;
}

static enum MHD_Result send_error(mr_server *s, struct MHD_Connection *c, const sv_error *e) {
    char *b = sv_error_body(e);
    if (e->http == 400 || e->http == 413 || e->http == 404) {
        pthread_mutex_lock(&s->met.mu);
        s->met.bad_requests++;
        pthread_mutex_unlock(&s->met.mu);
    }
    if (s->o.log_requests) fprintf(stderr, "serve: %d %s\n", e->http, e->message);
    /* a 405 names the route's methods (Allow), a 401 the scheme the key goes in (RFC 9110 15.5.6, 11.6.1) */
    const char *hn = NULL, *hv = NULL;
    if (e->http == 405) hn = "Allow", hv = e->allow ? e->allow : "GET";
    else if (e->http == 401) hn = "WWW-Authenticate", hv = "Bearer";
    enum MHD_Result ok = b ? send_text_h(c, e->http, "application/json", b, strlen(b), hn, hv) : MHD_NO;
    free(b);
    return ok;
}

/* An error in the shape of the route's API: Anthropic's for /v1/messages, else OpenAI's. */
static enum MHD_Result send_error_on(mr_server *s, struct MHD_Connection *c, int route, const sv_error *e) {
    if (route != R_MESSAGES && route != R_COUNT_TOKENS) return send_error(s, c, e);
    char *b = sv_anthropic_error_body(e);
    if (e->http == 400 || e->http == 413 || e->http == 404) {
        pthread_mutex_lock(&s->met.mu);
        s->met.bad_requests++;
        pthread_mutex_unlock(&s->met.mu);
    }
    enum MHD_Result ok = b ? send_json(c, e->http, b) : MHD_NO;
    free(b);
    return ok;
}

static enum MHD_Result fail(mr_server *s, struct MHD_Connection *c, int http, const char *param, const char *fmt, ...) {
    sv_error e = {.http = http};
    snprintf(e.param, sizeof e.param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    return send_error(s, c, &e);
}

/* Phase 2 bookkeeping for the watchdog: busy while the server waits for the
 * engine; progress when the client has taken bytes. */
static void conn_busy(sv_hreq *h, bool busy) {
    if (!h->conn) return;
    pthread_mutex_lock(&h->s->cmu);
    h->conn->busy = busy;
    if (!busy) h->conn->since_ns = mr_now_ns();
    pthread_mutex_unlock(&h->s->cmu);
}

/* The engine published for a parked job (engine thread, after the job's
 * lock is released): back into the event loop. */
static void wake_conn(void *arg) {
    sv_hreq *h = arg;
    MHD_resume_connection(h->mc);
}

/* How far the engine has published for the job. */
static uint64_t job_version(sv_job *j) {
    pthread_mutex_lock(&j->mu);
    const uint64_t v = j->version;
    pthread_mutex_unlock(&j->mu);
    return v;
}

/* Parks the connection until the engine publishes past v; false when it
 * already has, or the job has ended (look again). Only from libmicrohttpd's
 * request handler or content reader, where a connection may be suspended;
 * under the job's lock, so the engine's resume always comes after it. */
static bool park(sv_hreq *h, uint64_t v) {
    sv_job *j = h->job;
    conn_busy(h, true);
    pthread_mutex_lock(&j->mu);
    const bool p = j->version == v && j->live > 0;
    if (p) {
        j->parked = true;
        MHD_suspend_connection(h->mc);
    }
    pthread_mutex_unlock(&j->mu);
    return p;
}

/* ---- background responses ---- */

/* A streaming background response's events are kept in the response store under its id and this suffix
 * (ids with '#' are not looked up from URLs). */
#define EVENTS_SUFFIX "#events"

/* The store key of response id's events. */
static void events_key(char *key, size_t n, const char *id) { snprintf(key, n, "%s" EVENTS_SUFFIX, id); }

static void bg_wake(void *arg) {
    mr_server *s = arg;
    pthread_mutex_lock(&s->kmu);
    s->kicks++;
    pthread_cond_signal(&s->kcv);
    pthread_mutex_unlock(&s->kmu);
}

static sv_evlog *evlog_new(void) {
    sv_evlog *L = mr_calloc(1, sizeof *L);
    if (!L) return NULL;
    pthread_mutex_init(&L->mu, NULL);
    atomic_init(&L->refs, 1);
    return L;
}

static sv_evlog *evlog_ref(sv_evlog *L) {
    atomic_fetch_add(&L->refs, 1);
    return L;
}

static void evlog_release(sv_evlog *L) {
    if (!L || atomic_fetch_sub(&L->refs, 1) != 1) return;
    sv_buf_free(&L->text);
    mr_free(L->ends);
    pthread_mutex_destroy(&L->mu);
    mr_free(L);
}

/* Resumes the followers parked on L (taken under its lock, resumed after: a suspended connection cannot
 * complete, so none is freed in between). */
static void evlog_wake(sv_evlog *L) {
    pthread_mutex_lock(&L->mu);
    sv_hreq *h = L->parked;
    L->parked = NULL;
    pthread_mutex_unlock(&L->mu);
    for (sv_hreq *next; h; h = next) {
        next = h->log_next;
        h->log_next = NULL;
        MHD_resume_connection(h->mc);
    }
}

/* Whole events (each ends with a blank line) appended, then the followers woken; end: the last is in.
 * -1 out of memory. */
static int evlog_add(sv_evlog *L, const sv_buf *sse, bool end) {
    int rc = 0;
    pthread_mutex_lock(&L->mu);
    for (size_t at = 0; at < sse->len && !rc;) {
        size_t n = 0;
        while (at + n + 1 < sse->len && (sse->p[at + n] != '\n' || sse->p[at + n + 1] != '\n')) n++;
        n = at + n + 1 < sse->len ? n + 2 : sse->len - at;
        if (L->n == L->cap) {
            const int64_t cap = L->cap ? 2 * L->cap : 64;
            size_t *ends = mr_realloc(L->ends, sizeof *ends * (size_t)cap);
            if (!ends) {
                rc = -1;
                break;
            }
            L->ends = ends, L->cap = cap;
        }
        if ((rc = sv_buf_add(&L->text, sse->p + at, n))) break;
        L->ends[L->n++] = L->text.len;
        at += n;
    }
    if (end || rc) L->ended = true;
    pthread_mutex_unlock(&L->mu);
    evlog_wake(L);
    return rc;
}

/* The place of event `from` in the events text (n events ending at ends), SIZE_MAX when it is not in. */
static size_t event_start(const size_t *ends, int64_t n, int64_t from) {
    return from > n ? SIZE_MAX : from ? ends[from - 1] : 0;
}

/* A follower's content reader: the events of its log from its place on; parked while there are none yet,
 * the end of the stream after the last. */
static ssize_t follow_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    sv_hreq *h = cls;
    sv_evlog *L = h->log;
    pthread_mutex_lock(&L->mu);
    if (h->log_off == SIZE_MAX) h->log_off = event_start(L->ends, L->n, h->log_from);
    if (h->log_off != SIZE_MAX && h->log_off < L->text.len) {
        size_t n = L->text.len - h->log_off;
        if (n > max) n = max;
        memcpy(buf, L->text.p + h->log_off, n);
        h->log_off += n;
        pthread_mutex_unlock(&L->mu);
        conn_busy(h, false);
        return (ssize_t)n;
    }
    const bool ended = L->ended;
    if (ended || atomic_load(&h->s->stopping) || (h->conn && atomic_load(&h->conn->gone))) {
        /* (stopping: mr_server_close wakes every log; gone: the watchdog does, after setting it) */
        pthread_mutex_unlock(&L->mu);
        h->complete = ended;
        return ended ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
    }
    h->log_next = L->parked;
    L->parked = h;
    MHD_suspend_connection(h->mc);
    pthread_mutex_unlock(&L->mu);
    conn_busy(h, true);
    return 0;
}

/* The connection follows L from event `from` (a streamed answer, text/event-stream). */
/* A 200 of server-sent events, read from reader(h). */
static enum MHD_Result send_events(struct MHD_Connection *c, MHD_ContentReaderCallback reader, sv_hreq *h) {
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 32 * 1024, reader, h, NULL);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    enum MHD_Result ok = queue(c, 200, resp);
    MHD_destroy_response(resp);
    return ok;
}

static enum MHD_Result follow(struct MHD_Connection *c, sv_hreq *h, sv_evlog *L, int64_t from) {
    h->log = evlog_ref(L);
    h->log_from = from;
    h->log_off = SIZE_MAX;
    if (h->conn) {
        pthread_mutex_lock(&h->s->cmu);
        h->conn->log = L;
        pthread_mutex_unlock(&h->s->cmu);
    }
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u); /* the watchdog watches it instead */
    return send_events(c, follow_reader, h);
}

/* The Response of background job j at status st, without output (and with error err), kept beside the
 * conversation's items (sv_resp_store). */
static int bg_keep(mr_server *s, sv_job *j, const char *st, const char *err, char **text) {
    json_t *r = sv_resp_object(j, s->name, st);
    if (r && err) json_object_set_new(r, "error", json_pack("{s:s,s:s}", "code", "server_error", "message", err));
    const int rc = r ? sv_resp_store(s->store, j->req.resp_id, j->req.resp_ctx, r, text) : -1;
    json_decref(r);
    return rc;
}

/* Reads what the engine published for b (and parks it until the next publish); true when its job has ended
 * and its Response is kept (respond.c keeps a 200's; a failure's is kept here). */
static bool bg_advance(mr_server *s, sv_bg *b) {
    sv_buf sse = {0}; /* a streaming one's events, for its followers */
    int rc;
    for (;;) {
        const uint64_t v = job_version(b->j);
        rc = sv_out_advance(b->out, &sse);
        if (b->log && (sse.len || rc) && evlog_add(b->log, &sse, rc != 0)) rc = -1;
        sse.len = 0;
        if (rc != 0) break;
        pthread_mutex_lock(&b->j->mu);
        const bool parked = b->j->version == v && b->j->live > 0;
        if (parked) b->j->parked = true; /* the engine calls bg_wake at its next publish */
        pthread_mutex_unlock(&b->j->mu);
        if (parked) break;
    }
    sv_buf_free(&sse);
    if (rc == 0) {
        if (!b->started && !b->deleted && job_version(b->j) > 0) b->started = !bg_keep(s, b->j, "in_progress", NULL, NULL);
        return false;
    }
    if (rc < 0) sv_job_cancel(b->j); /* out of memory: it ends as failed */
    int status = 500;
    const char *failure = rc > 0 ? sv_out_failure(b->out) : "out of memory";
    char *body = rc > 0 && !failure && !b->log ? sv_out_body(b->out, &status) : NULL; /* (a stream keeps its own) */
    if (failure || (!b->log && status != 200)) {
        json_t *eb = body ? json_loads(body, 0, NULL) : NULL;
        const char *msg = json_string_value(json_object_get(json_object_get(eb, "error"), "message"));
        bg_keep(s, b->j, "failed", failure ? failure : msg ? msg : "out of memory", NULL);
        json_decref(eb);
    }
    mr_free(body);
    if (b->log) { /* its events, for a GET ?stream=true after the end */
        char key[96];
        events_key(key, sizeof key, b->j->req.resp_id);
        pthread_mutex_lock(&b->log->mu);
        if (!b->deleted && b->log->text.len && sv_buf_add(&b->log->text, "", 1) == 0) {
            sv_store_put(s->store, key, b->log->text.p, "", 0);
            b->log->text.len--;
        }
        pthread_mutex_unlock(&b->log->mu);
    }
    if (b->deleted) sv_store_delete(s->store, b->j->req.resp_id);
    return true;
}

/* The driver of background responses: each wake-up (an engine publish, a new job) reads every job on. */
static void *bg_main(void *arg) {
    mr_server *s = arg;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&s->kmu);
        while (!s->bg_stop && s->kicks == seen) pthread_cond_wait(&s->kcv, &s->kmu);
        const bool stop = s->bg_stop;
        seen = s->kicks;
        pthread_mutex_unlock(&s->kmu);
        if (stop) return NULL;
        pthread_mutex_lock(&s->bgmu);
        for (sv_bg **pp = &s->bg; *pp;) {
            sv_bg *b = *pp;
            if (!bg_advance(s, b)) {
                pp = &b->next;
                continue;
            }
            *pp = b->next;
            sv_out_free(b->out);
            sv_job_release(b->j);
            evlog_release(b->log);
            mr_free(b);
        }
        pthread_mutex_unlock(&s->bgmu);
    }
}

/* The running background response of id, under bgmu; NULL when none. */
static sv_bg *bg_find(mr_server *s, const char *id) {
    for (sv_bg *b = s->bg; b; b = b->next)
        if (!strcmp(b->j->req.resp_id, id)) return b;
    return NULL;
}

/* ---- routes ---- */

/* The route of url, whether it takes a body (post), and, where method is not one it takes, bad_method and
 * the methods it takes in *allow (a 405's Allow header). */
static int route_of(const char *url, const char *method, bool *post, bool *bad_method, const char **allow) {
    static const struct {
        const char *path;
        int route;
        bool post;
    } t[] = {{"/health", R_HEALTH, false},           {"/v1/models", R_MODELS, false},
             {"/metrics", R_METRICS, false},         {"/v1/completions", R_COMPLETIONS, true},
             {"/v1/chat/completions", R_CHAT, true}, {"/tokenize", R_TOKENIZE, true},
             {"/detokenize", R_DETOKENIZE, true},    {"/v1/responses", R_RESPONSES, true},
             {"/v1/messages", R_MESSAGES, true},     {"/v1/messages/count_tokens", R_COUNT_TOKENS, true},
             {"/ping", R_PING, false},               {"/version", R_VERSION, false},
             {"/generate", R_GENERATE, true},       {"/flush_cache", R_FLUSH, true},
             {"/reset_prefix_cache", R_RESET_PREFIX, true}, {"/get_server_info", R_SERVER_INFO, false},
             {"/server_info", R_SERVER_INFO, false}, {"/health_generate", R_HEALTH_GENERATE, false},
             {"/get_model_info", R_MODEL_INFO, false}, {"/abort_request", R_ABORT, true},
             {"/v1/score", R_SCORE, true}, {"/start_expert_distribution_record", R_EXPERT_START, true},
             {"/stop_expert_distribution_record", R_EXPERT_STOP, true},
             {"/dump_expert_distribution_record", R_EXPERT_DUMP, true}, {"/start_profile", R_PROFILE_START, true},
             {"/stop_profile", R_PROFILE_STOP, true}, {"/update_weights_from_disk", R_UPDATE_WEIGHTS, true},
             {"/pause_generation", R_PAUSE, true}, {"/continue_generation", R_CONTINUE, true},
             {"/pause", R_VPAUSE, true}, {"/resume", R_VRESUME, true}, {"/is_paused", R_IS_PAUSED, false},
             {"/update_weight_version", R_SET_WVER, true}, {"/get_weight_version", R_GET_WVER, false},
             {"/weight_info", R_GET_WVER, false}, {"/sleep", R_SLEEP, true}, {"/wake_up", R_WAKE, true},
             {"/is_sleeping", R_IS_SLEEPING, false}, {"/release_memory_occupation", R_RELEASE_MEM, true},
             {"/resume_memory_occupation", R_RESUME_MEM, true}};
    bool is_post = !strcmp(method, "POST"), is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    *bad_method = false;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        if (strcmp(url, t[i].path)) continue;
        *post = t[i].post;
        *allow = t[i].post ? "POST" : "GET, HEAD";
        if (t[i].route == R_PING && is_post) { /* vLLM's /ping (SageMaker's health check) takes both */
            *post = false;
            return R_PING;
        }
        if (t[i].route == R_PING) *allow = "GET, HEAD, POST";
        if (t[i].route == R_FLUSH) { /* sglang's /flush_cache takes both; HEAD must not flush (a safe method) */
            *allow = "GET, POST";
            if (!strcmp(method, "GET")) {
                *post = false;
                return R_FLUSH;
            }
        }
        if (t[i].route == R_EXPERT_DUMP) { /* a read: GET too */
            *allow = "GET, HEAD, POST";
            if (is_get) {
                *post = false;
                return R_EXPERT_DUMP;
            }
        }
        if (t[i].post ? !is_post : !is_get) *bad_method = true;
        return t[i].route;
    }
    if (!strncmp(url, "/v1/models/", 11) && url[11]) {
        *post = false;
        *allow = "GET, HEAD";
        if (!is_get) *bad_method = true;
        return R_MODEL;
    }
    if (!strncmp(url, "/v1/responses/", 14) && url[14]) { /* a stored response: GET, DELETE; .../input_items, .../cancel */
        const char *tail = strchr(url + 14, '/');
        *post = tail && !strcmp(tail, "/cancel");
        *allow = *post ? "POST" : tail ? "GET, HEAD" : "GET, HEAD, DELETE";
        if (*post ? !is_post : tail ? !is_get : !is_get && strcmp(method, "DELETE")) *bad_method = true;
        return R_RESPONSE_ID;
    }
    if (!strcmp(url, "/v1/conversations") || !strncmp(url, "/v1/conversations/", 18)) { /* methods: conversations.c */
        *post = is_post;
        *allow = "GET, HEAD, POST, DELETE";
        if (!is_post && !is_get && strcmp(method, "DELETE")) *bad_method = true;
        return R_CONVERSATIONS;
    }
    return R_NONE;
}

/* Ready, and the engine can still run (not after its expert-parallel group broke). */
static bool serving(mr_server *s) { return atomic_load(&s->state) == ST_READY && !sv_engine_failure(s->eng); }

static enum MHD_Result unavailable(mr_server *s, struct MHD_Connection *c) {
    const char *failure = s->eng ? sv_engine_failure(s->eng) : NULL;
    if (failure) return fail(s, c, 503, NULL, "the server stopped: %s", failure);
    int st = atomic_load(&s->state);
    if (st == ST_DRAINING) {
        pthread_mutex_lock(&s->met.mu);
        s->met.rejected_draining++;
        pthread_mutex_unlock(&s->met.mu);
    }
    return fail(s, c, 503, NULL, "%s", st == ST_LOADING ? "the server is loading the model" : "the server is shutting down");
}

static enum MHD_Result do_health(mr_server *s, struct MHD_Connection *c) {
    if (!serving(s)) return unavailable(s, c);
    return send_json(c, 200, "{\"status\":\"ok\"}");
}

static json_t *model_card(mr_server *s) {
    return json_pack("{s:s,s:s,s:I,s:s,s:s,s:I}", "id", s->name, "object", "model", "created", (json_int_t)time(NULL),
                     "owned_by", "moerun", "root", s->model_dir, "max_model_len", (json_int_t)s->context_length);
}

static enum MHD_Result do_models(mr_server *s, struct MHD_Connection *c, const char *url, int route) {
    json_t *o;
    if (route == R_MODEL) {
        if (strcmp(url + 11, s->name))
            return fail(s, c, 404, "model", "The model '%.200s' does not exist (this server serves '%s')", url + 11, s->name);
        o = model_card(s);
    } else {
        o = json_pack("{s:s,s:[o]}", "object", "list", "data", model_card(s));
    }
    return send_object(s, c, o);
}

/* A store's gauges for /metrics: entries, bytes, evictions (NULL store: none; cap 0 leaves them out). */
static void store_gauges(mr_server *s, sv_store *st, int64_t *n, int64_t *bytes, uint64_t *evicted) {
    if (!st) return;
    size_t b;
    uint64_t ev;
    int64_t k;
    sv_store_stats(st, &k, &b, &ev);
    pthread_mutex_lock(&s->met.mu);
    *n = k, *bytes = (int64_t)b;
    if (evicted) *evicted = ev;
    pthread_mutex_unlock(&s->met.mu);
}

static enum MHD_Result do_metrics(mr_server *s, struct MHD_Connection *c) {
    if (s->eng) {
        const bool p = sv_engine_paused(s->eng);
        pthread_mutex_lock(&s->met.mu);
        s->met.paused = p;
        pthread_mutex_unlock(&s->met.mu);
    }
    store_gauges(s, s->store, &s->met.stored, &s->met.stored_bytes, &s->met.stored_evicted);
    store_gauges(s, s->convs, &s->met.convs, &s->met.convs_bytes, NULL);
    char *b = sv_metrics_render(&s->met);
    if (!b) return fail(s, c, 500, NULL, "out of memory");
    enum MHD_Result r = send_text(c, 200, "text/plain; version=0.0.4; charset=utf-8", b, strlen(b));
    mr_free(b);
    return r;
}

/* sglang's GET /get_server_info (and /server_info, its newer name and vLLM's): the server's settings under
 * sglang's names where they exist (what sglang's tools read: tokenizer_path, internal_states[0].memory_usage.
 * token_capacity, disable_radix_cache), the engine's state, and the resolver's frozen decision with its
 * reasons (moerun resolve --json's object): which runner, kernels, formats, and why. */
static enum MHD_Result do_server_info(mr_server *s, struct MHD_Connection *c) {
    if (!serving(s)) return unavailable(s, c);
    pthread_mutex_lock(&s->met.mu);
    const int64_t running = s->met.running, waiting = s->met.waiting, used = s->met.kv_used_blocks;
    pthread_mutex_unlock(&s->met.mu);
    const char *kv = mr_kv_dtype_name(s->eo.kv_dtype);
    json_t *res = s->resolution ? json_loads(s->resolution, 0, NULL) : NULL;
    char wv[SV_MAX_WEIGHT_VERSION + 1];
    sv_engine_weight_version(s->eng, wv, sizeof wv);
    json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:I,s:i,s:i,s:I,s:I,s:I,s:i,s:s,s:I,s:b,s:s,s:s,s:b,s:I,s:I,s:s,s:s,s:s,s:b,s:o,"
                          "s:[{s:{s:I,s:I,s:I},s:I,s:I}]}",
                          "served_model_name", s->name, "model_path", s->model_dir, "tokenizer_path", s->model_dir,
                          "version", mr_version(), "context_length", (json_int_t)s->context_length,
                          "max_running_requests", s->max_running, "max_queued_requests", s->o.max_queued_requests,
                          "chunked_prefill_size", (json_int_t)s->eo.max_batch_tokens,
                          "max_prompt_tokens", (json_int_t)s->o.max_prompt_tokens,
                          "max_completion_tokens", (json_int_t)s->o.max_completion_tokens,
                          "page_size", MR_KV_BLOCK_TOKENS, "kv_cache_dtype", kv ? kv : "?",
                          "max_total_num_tokens", (json_int_t)(s->kv_blocks * MR_KV_BLOCK_TOKENS),
                          "disable_radix_cache", s->eo.no_prefix_caching,
                          "schedule_policy", s->eo.priority_scheduling ? "priority" : "fcfs",
                          "weight_version", wv, "is_paused", (int)sv_engine_paused(s->eng),
                          "response_store_bytes", (json_int_t)s->o.response_store_bytes,
                          "http_threads", (json_int_t)s->o.http_threads,
                          "moe_runner", mr_model_runner_name(s->m), "activation_mode", mr_act_mode_name(mr_model_act_mode(s->m)),
                          "kernels", mr_kernels_get()->isa,
                          "enable_deterministic_inference", (int)mr_kernels_get()->batch_invariant,
                          "resolution", res ? res : json_null(),
                          "internal_states", "memory_usage", "token_capacity", (json_int_t)(s->kv_blocks * MR_KV_BLOCK_TOKENS),
                          "kv_blocks", (json_int_t)s->kv_blocks, "kv_blocks_used", (json_int_t)used,
                          "running_requests", (json_int_t)running, "waiting_requests", (json_int_t)waiting);
    int ep_rank, ep_size;
    mr_model_ep(s->m, &ep_rank, &ep_size);
    if (o) { /* sglang's parallelism: the experts over ep_size ranks, attention replicated (no TP, one DP group) */
        json_object_set_new(o, "ep_size", json_integer(ep_size));
        json_object_set_new(o, "tp_size", json_integer(1));
        json_object_set_new(o, "dp_size", json_integer(1));
        json_object_set_new(o, "moe_a2a_backend", json_string(ep_size > 1 ? "mpi" : "none"));
        json_object_set_new(o, "is_sleeping", json_boolean(sv_engine_sleeping(s->eng, NULL)));
    }
    return send_object(s, c, o);
}

/* sglang's GET /get_model_info (what its frontend's RuntimeEndpoint reads first): the model's folder, a
 * generation model, no preferred sampling parameters, text only; and moerun's vocab_size (the tokenizer's
 * vocabulary without its added tokens, else the model's ids): what `moerun bench serve` draws random
 * prompts from. */
static enum MHD_Result do_model_info(mr_server *s, struct MHD_Connection *c) {
    char v[SV_MAX_WEIGHT_VERSION + 1] = "default";
    if (s->eng) sv_engine_weight_version(s->eng, v, sizeof v);
    else if (s->o.weight_version) snprintf(v, sizeof v, "%s", s->o.weight_version);
    json_t *o = json_pack("{s:s,s:s,s:b,s:n,s:s,s:b,s:b}", "model_path", s->model_dir, "tokenizer_path", s->model_dir,
                          "is_generation", 1, "preferred_sampling_params", "weight_version", v,
                          "has_image_understanding", 0, "has_audio_understanding", 0);
    const int64_t tv = sv_text_model_vocab(s->text);
    if (o) json_object_set_new(o, "vocab_size", json_integer(tv > 0 && tv <= s->vocab ? tv : s->vocab));
    return send_object(s, c, o);
}

/* sglang's expert distribution: POST /start_expert_distribution_record zeroes the model's per-layer counts of
 * the experts each token selects and records from then on, POST /stop_expert_distribution_record stops
 * (the counts kept), /dump_expert_distribution_record (POST, or GET) answers them as JSON: logical_count
 * [layers][experts], each layer's tokens and balancedness (mean / max count: 1 is an even load), and
 * whether it is recording (sglang writes them to a file of torch tensors instead). */
static enum MHD_Result do_expert_record(mr_server *s, struct MHD_Connection *c, int route) {
    if (route == R_EXPERT_START || route == R_EXPERT_STOP) {
        mr_model_expert_record(s->m, route == R_EXPERT_START);
        MR_INFO("serve: expert distribution recording %s", route == R_EXPERT_START ? "started" : "stopped");
        const char *t = route == R_EXPERT_START ? "Start recording the expert distribution.\n"
                                                : "Stop recording the expert distribution.\n";
        return send_text(c, 200, "text/plain; charset=utf-8", t, strlen(t));
    }
    const mr_model_config *mc = mr_model_config_of(s->m);
    const int64_t L = mc->n_layers, E = mc->n_experts;
    uint64_t *cnt = mr_malloc((size_t)(L * E > 0 ? L * E : 1) * sizeof(uint64_t));
    json_t *rows = json_array(), *tok = json_array(), *bal = json_array();
    bool bad = !cnt || !rows || !tok || !bal;
    if (cnt) mr_model_expert_counts(s->m, cnt);
    for (int64_t l = 0; !bad && l < L; l++) {
        json_t *row = json_array();
        uint64_t sum = 0, mx = 0;
        for (int64_t x = 0; row && x < E; x++) {
            const uint64_t v = cnt[l * E + x];
            sum += v;
            mx = v > mx ? v : mx;
            if (json_array_append_new(row, json_integer((json_int_t)v))) json_decref(row), row = NULL;
        }
        bad = !row || json_array_append_new(rows, row) ||
              json_array_append_new(tok, json_integer((json_int_t)(mc->top_k > 0 ? sum / (uint64_t)mc->top_k : 0))) ||
              json_array_append_new(bal, mx ? json_real((double)sum / (double)E / (double)mx) : json_null());
    }
    mr_free(cnt);
    json_t *o = bad ? NULL : json_pack("{s:b,s:I,s:I,s:i,s:O,s:O,s:O}", "recording", mr_model_expert_recording(s->m),
                                       "layers", (json_int_t)L, "experts", (json_int_t)E, "top_k", (int)mc->top_k,
                                       "tokens", tok, "balancedness", bal, "logical_count", rows);
    json_decref(rows), json_decref(tok), json_decref(bal);
    return send_object(s, c, o);
}

/* sglang's POST /start_profile {num_steps, activities, with_stack, record_shapes, profile_by_stage} (all
 * optional; only num_steps changes anything here) and POST /stop_profile: the engine's steps between the two,
 * the second's answer a Chrome trace (profile.c). sglang writes torch traces to output_dir: here the trace is
 * the answer, and output_dir is refused (a client does not pick the server's files). */
static enum MHD_Result do_profile(mr_server *s, struct MHD_Connection *c, sv_hreq *h) {
    if (!serving(s)) return unavailable(s, c);
    sv_profile *p = sv_engine_profile(s->eng);
    if (h->route == R_PROFILE_STOP) {
        size_t n = 0;
        char *t = sv_profile_stop(p, s->name, mr_model_runner_name(s->m), &n);
        if (!t) return fail(s, c, 400, NULL, "no profile is recording (POST /start_profile first)");
        MR_INFO("serve: profile stopped (%zu bytes of trace)", n);
        enum MHD_Result r = send_text(c, 200, "application/json", t, n);
        mr_free(t);
        return r;
    }
    int64_t num_steps = 0;
    if (h->body.len) {
        sv_error e = {0};
        json_t *root = sv_body_object(h->body.p, h->body.len, &e);
        if (!root) return send_error(s, c, &e);
        const char *k, *why = NULL;
        json_t *v;
        json_object_foreach(root, k, v) {
            if (json_is_null(v)) continue;
            if (!strcmp(k, "num_steps")) {
                if (!json_is_integer(v) || json_integer_value(v) < 1) why = "must be a positive integer";
                else num_steps = (int64_t)json_integer_value(v);
            } else if (!strcmp(k, "activities")) {
                bool ok = json_is_array(v);
                for (size_t i = 0; ok && i < json_array_size(v); i++) ok = json_is_string(json_array_get(v, i));
                if (!ok) why = "must be a list of strings";
            } else if (!strcmp(k, "with_stack") || !strcmp(k, "record_shapes") || !strcmp(k, "profile_by_stage")) {
                if (!json_is_boolean(v)) why = "must be a boolean";
            } else if (!strcmp(k, "output_dir")) {
                why = "is not taken: the trace is /stop_profile's answer (save it there, e.g. curl -o trace.json)";
            } else {
                why = "is an unknown field";
            }
            if (why) {
                enum MHD_Result r = fail(s, c, 400, k, "%s %s", k, why);
                json_decref(root);
                return r;
            }
        }
        json_decref(root);
    }
    if (sv_profile_start(p, num_steps)) return fail(s, c, 400, NULL, "a profile is recording already (POST /stop_profile)");
    MR_INFO("serve: profile started");
    return send_text(c, 200, "text/plain; charset=utf-8", "Start profiling.\n", 17);
}

/* sglang's POST /abort_request {"rid": ID} | {"abort_all": true}: the request(s) end at the engine's next step,
 * as a client that left does, their answers finish with reason abort (what they generated so far kept). ID is
 * a /generate request's rid, or any request's id (meta_info.id, "cmpl-...", "chatcmpl-..."). 200
 * {"aborted": N}, N the requests still running that it ended (0: none matched, as sglang's 200). */
static enum MHD_Result do_abort(mr_server *s, struct MHD_Connection *c, sv_hreq *h) {
    sv_error e = {0};
    if (!serving(s)) return unavailable(s, c);
    json_t *root = sv_body_object(h->body.p ? h->body.p : "", h->body.len, &e);
    if (!root) return send_error(s, c, &e);
    const char *k, *rid = NULL;
    json_t *v;
    bool all = false;
    json_object_foreach(root, k, v) {
        const char *bad = NULL;
        if (!strcmp(k, "rid")) {
            if (json_is_string(v)) rid = json_string_value(v);
            else if (!json_is_null(v)) bad = "rid must be a string";
        } else if (!strcmp(k, "abort_all")) {
            if (json_is_boolean(v)) all = json_is_true(v);
            else if (!json_is_null(v)) bad = "abort_all must be a boolean";
        } else if (strcmp(k, "finished_reason") && strcmp(k, "abort_message")) { /* sglang's own, not used here */
            bad = "unknown field";
        }
        if (bad) {
            enum MHD_Result r = fail(s, c, 400, k, "%s (/abort_request takes rid or abort_all)", bad);
            json_decref(root);
            return r;
        }
    }
    if (!all && (!rid || !*rid)) {
        json_decref(root);
        return fail(s, c, 400, "rid", "give the request's rid, or abort_all: true");
    }
    int n = 0;
    pthread_mutex_lock(&s->jmu);
    for (sv_job *j = s->jobs; j; j = j->jnext) {
        const char *r = json_string_value(json_object_get(j->req.sgl_meta, "rid"));
        const bool whole = all || !strcmp(j->id, rid) || (r && !strcmp(r, rid));
        pthread_mutex_lock(&j->mu);
        if (whole && j->live > 0) { /* the request */
            sv_job_cancel(j);
            n++;
        }
        for (int i = 0; !whole && j->req.sgl_meta && i < j->n_gen; i++) { /* one of a /generate batch, by its id */
            char id[96];
            sv_sglang_choice_id(j, i, id, sizeof id);
            if (strcmp(id, rid) || j->gens[i].fin != SV_FIN_NONE) continue;
            sv_gen_cancel(&j->gens[i], SV_CANCEL_ABORT);
            n++;
        }
        pthread_mutex_unlock(&j->mu);
    }
    pthread_mutex_unlock(&s->jmu);
    json_decref(root);
    if (n) MR_INFO("serve: /abort_request ended %d request(s)", n);
    char b[48];
    snprintf(b, sizeof b, "{\"aborted\":%d}", n);
    return send_json(c, 200, b);
}

/* sglang's /flush_cache (GET or POST) and vLLM's POST /reset_prefix_cache: the prefix cache dropped, so
 * that a benchmark's run starts cold; only while no request is admitted (a 400 otherwise, as sglang's). */
static enum MHD_Result do_flush(mr_server *s, struct MHD_Connection *c) {
    if (!serving(s)) return unavailable(s, c);
    int64_t dropped = 0;
    const int rc = sv_engine_flush(s->eng, &dropped);
    if (rc > 0)
        return fail(s, c, 400, NULL, "the prefix cache was not flushed: %lld requests are running or waiting (it is "
                    "flushed only when none is)", (long long)sv_engine_inflight(s->eng));
    if (rc < 0) return fail(s, c, 503, NULL, "the prefix cache was not flushed: the engine is not running");
    MR_INFO("serve: prefix cache flushed (%lld KV blocks)", (long long)dropped);
    char b[96];
    const int n = snprintf(b, sizeof b, "Cache flushed (%lld KV blocks).\n", (long long)dropped);
    return send_text(c, 200, "text/plain; charset=utf-8", b, (size_t)n);
}

/* ---- generation control and new weights (sglang's and vLLM's RL endpoints) ----
 * A control request that takes time (a weight update loads a checkpoint and waits for the running requests;
 * vLLM's pause "wait" waits for them) is an op: its connection is parked until whoever does the work answers
 * it (op_answer), then the request handler, called again, sends the answer. Nothing here blocks the loop. */
typedef struct sv_op {
    pthread_mutex_t mu;
    bool done, parked, orphan;
    int http;
    char *body;                /* the answer (JSON, mr_malloc'd), or NULL: a plain error of http */
    char msg[600];             /* ... whose message */
    struct MHD_Connection *mc;
    mr_server *s;
    bool vllm;                 /* a pause through vLLM's route (its answer's shape) */
    /* a weight update's inputs */
    char *dir;
    sv_swap_opts so;
    char ver[SV_MAX_WEIGHT_VERSION + 1];
} sv_op;

static void op_free(sv_op *op) {
    if (!op) return;
    pthread_mutex_destroy(&op->mu);
    mr_free(op->body);
    mr_free(op->dir);
    mr_free(op);
}

static sv_op *op_new(mr_server *s, struct MHD_Connection *c) {
    sv_op *op = mr_calloc(1, sizeof *op);
    if (!op) return NULL;
    pthread_mutex_init(&op->mu, NULL);
    op->s = s;
    op->mc = c;
    return op;
}

/* The worker's answer (body stolen; NULL with msg: an error of http). The parked connection is resumed;
 * op is not touched after (its request may complete and free it at once). */
static void op_answer(sv_op *op, int http, char *body, const char *msg) {
    pthread_mutex_lock(&op->mu);
    if (op->orphan) { /* its connection is gone: nobody reads the answer */
        pthread_mutex_unlock(&op->mu);
        mr_free(body);
        op_free(op);
        return;
    }
    op->http = http;
    op->body = body;
    if (msg) snprintf(op->msg, sizeof op->msg, "%s", msg);
    op->done = true;
    const bool parked = op->parked;
    op->parked = false;
    struct MHD_Connection *mc = op->mc;
    pthread_mutex_unlock(&op->mu);
    if (parked) MHD_resume_connection(mc);
}

/* The handler's side: parks until the op is answered, then sends the answer. */
static enum MHD_Result op_wait(mr_server *s, struct MHD_Connection *c, sv_hreq *h) {
    sv_op *op = h->op;
    conn_busy(h, true);
    pthread_mutex_lock(&op->mu);
    if (!op->done) {
        op->parked = true;
        MHD_suspend_connection(c);
        pthread_mutex_unlock(&op->mu);
        return MHD_YES;
    }
    pthread_mutex_unlock(&op->mu);
    conn_busy(h, false);
    if (!op->body) return fail(s, c, op->http, NULL, "%s", op->msg);
    return send_json(c, op->http, op->body);
}

/* A control request's body: an object (an empty body is {}), every member one of names (NULL-terminated)
 * unless null; NULL after the error was sent (*r). */
static json_t *ctl_body(mr_server *s, struct MHD_Connection *c, sv_hreq *h, const char *const *names,
                        enum MHD_Result *r) {
    sv_error e = {0};
    json_t *root = sv_body_object(h->body.len ? h->body.p : "{}", h->body.len ? h->body.len : 2, &e);
    if (!root) {
        *r = send_error(s, c, &e);
        return NULL;
    }
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        size_t i = 0;
        while (names[i] && strcmp(names[i], k)) i++;
        if (!names[i]) {
            *r = fail(s, c, 400, k, "%.60s is an unknown field of %s", k, h->route == R_UPDATE_WEIGHTS
                                                                             ? "/update_weights_from_disk"
                                                                             : "this request");
            json_decref(root);
            return NULL;
        }
    }
    return root;
}

/* root's boolean k (absent or null: dflt); false after a 400 was sent (*r). */
static bool ctl_bool(mr_server *s, struct MHD_Connection *c, json_t *root, const char *k, bool dflt, bool *out,
                     enum MHD_Result *r) {
    json_t *v = json_object_get(root, k);
    *out = dflt;
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) {
        *r = fail(s, c, 400, k, "%s must be a boolean", k);
        return false;
    }
    *out = json_is_true(v);
    return true;
}

/* root's weight version k (absent or null: *out NULL); false after a 400 was sent (*r). */
static bool ctl_version(mr_server *s, struct MHD_Connection *c, json_t *root, const char *k, const char **out,
                        enum MHD_Result *r) {
    json_t *v = json_object_get(root, k);
    *out = NULL;
    if (!v || json_is_null(v)) return true;
    if (!json_is_string(v) || json_string_length(v) < 1 || json_string_length(v) > SV_MAX_WEIGHT_VERSION ||
        memchr(json_string_value(v), 0, json_string_length(v))) {
        *r = fail(s, c, 400, k, "%s must be a string of 1 to %d bytes", k, SV_MAX_WEIGHT_VERSION);
        return false;
    }
    *out = json_string_value(v);
    return true;
}

static void *update_main(void *arg) {
    sv_op *op = arg;
    mr_server *s = op->s;
    const uint64_t t0 = mr_now_ns();
    MR_INFO("serve: loading new weights from %s", op->dir);
    mr_model *staged = NULL;
    char msg[600];
    int held = 0;
    /* expert parallel: the other ranks load their experts meanwhile, and every rank swaps or none does */
    int http = sv_engine_ep_load(s->eng, op->dir, msg, sizeof msg);
    if (http == 200) {
        const mr_status st = mr_model_weights_load(s->m, op->dir, &staged);
        const double load_s = (double)(mr_now_ns() - t0) * 1e-9;
        if (st)
            snprintf(msg, sizeof msg, "the weights were not updated (the model runs on as before): %s", mr_error_last());
        /* the other ranks' loads may take longer than this one: a margin before the group is called broken */
        op->so.ep_timeout_s = 60.0 + 3.0 * load_s;
        http = st && !sv_engine_ep(s->eng) ? 400 : sv_engine_swap(s->eng, staged, &op->so, msg, sizeof msg, &held);
        if (http == 200) {
            MR_INFO("serve: new weights from %s in service (loaded in %.2f s, %.2f s in all)", op->dir, load_s,
                    (double)(mr_now_ns() - t0) * 1e-9);
            pthread_mutex_lock(&s->met.mu);
            s->met.weight_updates++;
            pthread_mutex_unlock(&s->met.mu);
        }
    }
    mr_model_close(staged); /* after a swap the old weights, else the new ones that did not go in */
#ifdef __GLIBC__
    malloc_trim(0); /* their pages back to the system now: glibc keeps freed heap memory otherwise, and the
                       process would hold two weight sets until the next update */
#endif
    if (http != 200) MR_WARN("serve: /update_weights_from_disk %s: %s", op->dir, msg);
    json_t *o = json_pack("{s:b,s:s,s:i}", "success", http == 200, "message", msg, "num_paused_requests", held);
    char *body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    atomic_store(&s->updating, false);
    op_answer(op, body ? http : 500, body, body ? NULL : "out of memory");
    return NULL;
}

/* sglang's POST /update_weights_from_disk {"model_path", "weight_version"?, "abort_all_requests"?,
 * "flush_cache"? [true], "keep_pause"?, "load_format"? (auto, safetensors)}: the checkpoint at model_path is
 * loaded beside the running weights (requests go on meanwhile; both sets are resident then), checked to be
 * the same model, then swapped in between steps once the running requests have ended (new ones wait; with
 * abort_all_requests they end now), or at once while generation is paused. 200 {"success": true, "message",
 * "num_paused_requests"}; a checkpoint that cannot go in is a 400 of the same shape, the model running on. */
static enum MHD_Result do_update_weights(mr_server *s, struct MHD_Connection *c, sv_hreq *h) {
    if (!serving(s)) return unavailable(s, c);
    static const char *const names[] = {"model_path", "load_format", "abort_all_requests", "weight_version",
                                        "is_async", "torch_empty_cache", "keep_pause", "recapture_cuda_graph",
                                        "token_step", "flush_cache", "manifest", "rid", NULL};
    enum MHD_Result r = MHD_NO;
    json_t *root = ctl_body(s, c, h, names, &r);
    if (!root) return r;
    json_t *mp = json_object_get(root, "model_path"), *lf = json_object_get(root, "load_format"),
           *ts = json_object_get(root, "token_step"), *mf = json_object_get(root, "manifest");
    sv_swap_opts so = {0};
    bool is_async = false, unused;
    const char *ver = NULL;
    if (!json_is_string(mp) || !json_string_length(mp) || json_string_length(mp) > 4000 ||
        memchr(json_string_value(mp), 0, json_string_length(mp)))
        r = fail(s, c, 400, "model_path", "model_path must be the checkpoint folder's path (a non-empty string)");
    else if (lf && !json_is_null(lf) &&
             (!json_is_string(lf) || (strcmp(json_string_value(lf), "auto") && strcmp(json_string_value(lf), "safetensors"))))
        r = fail(s, c, 400, "load_format", "load_format must be auto or safetensors (the checkpoint's own files)");
    else if (ts && !json_is_null(ts) && !json_is_integer(ts))
        r = fail(s, c, 400, "token_step", "token_step must be an integer");
    else if (mf && !json_is_null(mf))
        r = fail(s, c, 400, "manifest", "manifest is not taken: the checkpoint folder says what it holds");
    else if (ctl_bool(s, c, root, "abort_all_requests", false, &so.abort_all, &r) &&
             ctl_bool(s, c, root, "flush_cache", true, &so.flush, &r) &&
             ctl_bool(s, c, root, "keep_pause", false, &so.keep_pause, &r) &&
             ctl_bool(s, c, root, "is_async", false, &is_async, &r) &&
             ctl_bool(s, c, root, "torch_empty_cache", false, &unused, &r) &&
             ctl_bool(s, c, root, "recapture_cuda_graph", false, &unused, &r) &&
             ctl_version(s, c, root, "weight_version", &ver, &r)) {
        if (is_async) {
            r = fail(s, c, 400, "is_async", "is_async true is not taken: the new weights load while the requests "
                     "run, and go in between steps once the running ones have ended (every request runs under "
                     "one version)");
        } else if (atomic_exchange(&s->updating, true)) {
            r = fail(s, c, 409, NULL, "a weight update is under way: send the next once it has answered");
        } else {
            if (s->upd_started) pthread_join(s->upd, NULL); /* the previous one, done */
            s->upd_started = false;
            sv_op *op = op_new(s, c);
            if (op) op->dir = mr_strdup(json_string_value(mp));
            if (!op || !op->dir) {
                op_free(op);
                atomic_store(&s->updating, false);
                r = fail(s, c, 500, NULL, "out of memory");
            } else {
                op->so = so;
                if (ver) {
                    snprintf(op->ver, sizeof op->ver, "%s", ver);
                    op->so.version = op->ver;
                }
                h->op = op;
                if (pthread_create(&s->upd, NULL, update_main, op)) {
                    h->op = NULL;
                    op_free(op);
                    atomic_store(&s->updating, false);
                    r = fail(s, c, 500, NULL, "cannot start the weight loader's thread");
                } else {
                    s->upd_started = true;
                    r = op_wait(s, c, h);
                }
            }
        }
    }
    json_decref(root);
    return r;
}

/* The answer of a pause (sglang's shape, or vLLM's {"status": "paused"}), from the engine thread. */
static void pause_done(void *arg, int http, const char *msg) {
    sv_op *op = arg;
    char *body = NULL;
    if (http == 200)
        body = mr_strdup(op->vllm ? "{\"status\":\"paused\"}"
                              : "{\"message\":\"Generation paused successfully.\",\"status\":\"ok\"}");
    op_answer(op, body ? http : http == 200 ? 500 : http, body, body ? NULL : msg ? msg : "out of memory");
}

/* sglang's POST /pause_generation {"mode": "abort" | "retract" | "in_place"} [abort], and vLLM's POST
 * /pause?mode=abort|wait|keep [abort]&clear_cache=true|false [true] (its older
 * wait_for_inflight_requests=true is mode wait): generation stops (serve_internal.h's sv_pause_mode); new
 * requests wait in the queue; the answer comes once the pause holds (with wait: once the running requests
 * ended). vLLM's keep with clear_cache is a retract (the kept requests recompute under the weights of then),
 * without it in place. */
static enum MHD_Result do_pause(mr_server *s, struct MHD_Connection *c, sv_hreq *h) {
    if (!serving(s)) return unavailable(s, c);
    int mode = SV_PAUSE_ABORT;
    bool clear = false;
    enum MHD_Result r = MHD_NO;
    if (h->route == R_VPAUSE) {
        const char *m = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "mode");
        const char *cc = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "clear_cache");
        const char *w = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "wait_for_inflight_requests");
        clear = true;
        if (cc && strcasecmp(cc, "true") && strcasecmp(cc, "false"))
            return fail(s, c, 400, "clear_cache", "clear_cache must be true or false, got '%.40s'", cc);
        if (cc) clear = !strcasecmp(cc, "true");
        if (w && strcasecmp(w, "true") && strcasecmp(w, "false"))
            return fail(s, c, 400, "wait_for_inflight_requests", "wait_for_inflight_requests must be true or false");
        if (w && !strcasecmp(w, "true")) mode = SV_PAUSE_WAIT;
        if (m && !strcmp(m, "wait")) mode = SV_PAUSE_WAIT;
        else if (m && !strcmp(m, "keep")) mode = clear ? SV_PAUSE_RETRACT : SV_PAUSE_IN_PLACE;
        else if (m && strcmp(m, "abort"))
            return fail(s, c, 400, "mode", "mode must be abort, wait or keep, got '%.40s'", m);
    } else {
        static const char *const names[] = {"mode", "rid", NULL};
        json_t *root = ctl_body(s, c, h, names, &r);
        if (!root) return r;
        json_t *m = json_object_get(root, "mode");
        const char *ms = json_is_string(m) ? json_string_value(m) : NULL;
        if (m && !json_is_null(m) && !ms) mode = -1;
        else if (ms && !strcmp(ms, "retract")) mode = SV_PAUSE_RETRACT;
        else if (ms && !strcmp(ms, "in_place")) mode = SV_PAUSE_IN_PLACE;
        else if (ms && strcmp(ms, "abort")) mode = -1;
        json_decref(root);
        if (mode < 0) return fail(s, c, 400, "mode", "mode must be abort, retract or in_place");
    }
    sv_op *op = op_new(s, c);
    if (!op) return fail(s, c, 500, NULL, "out of memory");
    op->vllm = h->route == R_VPAUSE;
    h->op = op;
    if (sv_engine_pause(s->eng, (sv_pause_mode)mode, clear, pause_done, op)) {
        h->op = NULL;
        op_free(op);
        return fail(s, c, 409, NULL, "a pause is under way already (it waits for the running requests)");
    }
    return op_wait(s, c, h);
}

/* sglang's POST /continue_generation, vLLM's POST /resume: generation goes on. */
static enum MHD_Result do_continue(mr_server *s, struct MHD_Connection *c, sv_hreq *h) {
    if (!serving(s)) return unavailable(s, c);
    if (h->route == R_CONTINUE) {
        static const char *const names[] = {"torch_empty_cache", "rid", NULL};
        enum MHD_Result r = MHD_NO;
        json_t *root = ctl_body(s, c, h, names, &r);
        if (!root) return r;
        bool unused;
        const bool ok = ctl_bool(s, c, root, "torch_empty_cache", true, &unused, &r);
        json_decref(root);
        if (!ok) return r;
    }
    sv_engine_continue(s->eng);
    return send_json(c, 200, h->route == R_VRESUME ? "{\"status\":\"resumed\"}"
                                                   : "{\"message\":\"Generation continued successfully.\",\"status\":\"ok\"}");
}

/* The answer of a sleep, from the engine thread: vLLM's (its /sleep answers 200), sglang's {"success"}. */
static void sleep_done(void *arg, int http, const char *msg) {
    sv_op *op = arg;
    size_t bytes = 0;
    sv_engine_sleeping(op->s->eng, &bytes);
    json_t *o = http != 200 ? NULL
                            : json_pack("{s:b,s:s,s:I}", "success", 1, "message",
                                        "The KV cache's memory was given back; generation is paused until woken.",
                                        "memory_released_bytes", (json_int_t)bytes);
    char *body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    op_answer(op, body ? http : http == 200 ? 500 : http, body, body ? NULL : msg ? msg : "out of memory");
}

/* The memory kinds asked for (vLLM's repeated ?tags=, sglang's "tags" list): 0, or 1 after a 400 (*r). A tag
 * other than kv_cache and weights is refused; weights only where weights_ok (waking: they never left). */
static int mem_tags(mr_server *s, struct MHD_Connection *c, const json_t *list, const char *one, bool weights_ok,
                    enum MHD_Result *r) {
    const size_t n = list ? json_array_size(list) : one ? 1 : 0;
    if (list && !json_is_array(list)) {
        *r = fail(s, c, 400, "tags", "tags must be a list of strings (kv_cache, weights)");
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        const char *t = list ? json_string_value(json_array_get(list, i)) : one;
        if (t && !strcmp(t, "kv_cache")) continue;
        if (t && !strcmp(t, "weights")) {
            if (weights_ok) continue;
            *r = fail(s, c, 400, "tags", "the weights stay resident: a CPU server has no device memory to free for "
                      "them (kv_cache gives the KV cache's memory back; /update_weights_from_disk replaces the weights)");
            return 1;
        }
        *r = fail(s, c, 400, "tags", "tags are kv_cache and weights, got '%.40s'", t ? t : "a non-string");
        return 1;
    }
    return 0;
}

/* vLLM's POST /sleep?level=1 and sglang's POST /release_memory_occupation {"tags": ["kv_cache"]} (no tags:
 * the KV cache): the running requests go back to the queue, generation is paused, the prefix cache is dropped
 * and the KV pool's memory goes back to the system; the answer comes once it has. vLLM's POST /wake_up
 * [?tags=...], sglang's POST /resume_memory_occupation, and /continue_generation or /resume wake it: the
 * pool's pages come back as the requests write them. GET /is_sleeping {"is_sleeping"}. */
static enum MHD_Result do_sleep(mr_server *s, struct MHD_Connection *c, sv_hreq *h) {
    if (h->route == R_IS_SLEEPING) {
        if (!s->eng) return unavailable(s, c);
        return send_json(c, 200, sv_engine_sleeping(s->eng, NULL) ? "{\"is_sleeping\":true}" : "{\"is_sleeping\":false}");
    }
    if (!serving(s)) return unavailable(s, c);
    enum MHD_Result r = MHD_NO;
    const bool wake = h->route == R_WAKE || h->route == R_RESUME_MEM;
    if (h->route == R_SLEEP || h->route == R_WAKE) { /* vLLM's: query arguments */
        const char *lv = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "level");
        if (!wake && lv && strcmp(lv, "1"))
            return fail(s, c, 400, "level", "level %.20s: only level 1 here (the KV cache's memory goes back; level 2 "
                        "also discards the weights, which a CPU server keeps resident)", lv);
        if (mem_tags(s, c, NULL, MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "tags"), wake, &r)) return r;
    } else {
        static const char *const names[] = {"tags", "rid", NULL};
        json_t *root = ctl_body(s, c, h, names, &r);
        if (!root) return r;
        const json_t *tags = json_object_get(root, "tags");
        const int bad = mem_tags(s, c, json_is_null(tags) ? NULL : tags, NULL, wake, &r);
        json_decref(root);
        if (bad) return r;
    }
    if (wake) {
        if (sv_engine_sleeping(s->eng, NULL)) sv_engine_continue(s->eng);
        return send_json(c, 200, "{\"success\":true,\"message\":\"Awake.\"}");
    }
    sv_op *op = op_new(s, c);
    if (!op) return fail(s, c, 500, NULL, "out of memory");
    h->op = op;
    if (sv_engine_sleep(s->eng, sleep_done, op)) {
        h->op = NULL;
        op_free(op);
        return fail(s, c, 409, NULL, "a pause is under way already (it waits for the running requests)");
    }
    return op_wait(s, c, h);
}

/* vLLM's GET /is_paused; sglang's POST /update_weight_version {"new_version", "abort_all_requests"?} and GET
 * /get_weight_version (vLLM's /weight_info). */
static enum MHD_Result do_weight_version(mr_server *s, struct MHD_Connection *c, sv_hreq *h) {
    if (!s->eng) return unavailable(s, c); /* loading */
    if (h->route == R_IS_PAUSED)
        return send_json(c, 200, sv_engine_paused(s->eng) ? "{\"is_paused\":true}" : "{\"is_paused\":false}");
    char v[SV_MAX_WEIGHT_VERSION + 1];
    if (h->route == R_GET_WVER) {
        sv_engine_weight_version(s->eng, v, sizeof v);
        return send_object(s, c, json_pack("{s:s}", "weight_version", v));
    }
    if (!serving(s)) return unavailable(s, c);
    static const char *const names[] = {"new_version", "abort_all_requests", "rid", NULL};
    enum MHD_Result r = MHD_NO;
    json_t *root = ctl_body(s, c, h, names, &r);
    if (!root) return r;
    const char *nv = NULL;
    bool abort_all = false;
    if (ctl_version(s, c, root, "new_version", &nv, &r) &&
        ctl_bool(s, c, root, "abort_all_requests", false, &abort_all, &r)) {
        if (!nv) {
            r = fail(s, c, 400, "new_version", "new_version is required (1 to %d bytes)", SV_MAX_WEIGHT_VERSION);
        } else {
            if (abort_all) sv_engine_abort_all(s->eng);
            sv_engine_set_weight_version(s->eng, nv);
            MR_INFO("serve: weight version set to %s", nv);
            char m[SV_MAX_WEIGHT_VERSION + 40];
            snprintf(m, sizeof m, "Weight version updated to %s", nv);
            r = send_object(s, c, json_pack("{s:b,s:s,s:s}", "success", 1, "message", m, "new_version", nv));
        }
    }
    json_decref(root);
    return r;
}

/* GET /v1/responses/{id}?stream=true[&starting_after=N]: the events of a background response created with
 * stream true, from sequence_number N + 1 (0 without N): a running one's followed to its end, an ended one's
 * given from the store. Others are a 400 (nothing was streamed to give again), unknown ids a 404. */
static enum MHD_Result stream_response(mr_server *s, struct MHD_Connection *c, sv_hreq *h, const char *id,
                                       const char *stream) {
    if (strcmp(stream, "true")) return fail(s, c, 400, "stream", "stream must be true or false, got '%.40s'", stream);
    const char *sa = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "starting_after");
    int64_t from = 0;
    if (sa) {
        char *end;
        errno = 0;
        const long long v = strtoll(sa, &end, 10);
        if (errno || end == sa || *end || v < 0 || v > INT64_MAX / 2)
            return fail(s, c, 400, "starting_after", "starting_after must be an event's sequence_number (an integer >= 0), "
                        "got '%.40s'", sa);
        from = v + 1;
    }
    pthread_mutex_lock(&s->bgmu);
    sv_bg *b = bg_find(s, id);
    sv_evlog *L = b && b->log ? evlog_ref(b->log) : NULL;
    pthread_mutex_unlock(&s->bgmu);
    if (L) {
        const enum MHD_Result r = follow(c, h, L, from);
        evlog_release(L);
        return r;
    }
    char key[200], *ev = NULL;
    events_key(key, sizeof key, id);
    if (!b && sv_store_get(s->store, key, &ev, NULL, NULL) == 0) {
        size_t at = 0;
        for (int64_t k = 0; k < from && ev[at]; k++) { /* past `from` events (each ends with a blank line) */
            const char *e = strstr(ev + at, "\n\n");
            at = e ? (size_t)(e - ev) + 2 : strlen(ev);
        }
        const enum MHD_Result r = send_text(c, 200, "text/event-stream", ev + at, strlen(ev + at));
        mr_free(ev);
        return r;
    }
    if (!b && sv_store_get(s->store, id, NULL, NULL, NULL) > 0)
        return fail(s, c, 404, "response_id", "Response with id '%s' not found", id);
    return fail(s, c, 400, "stream", "stream=true gives the events of a background response created with stream true; "
                "'%s' was not one%s: poll GET /v1/responses/{id}", id, b ? "" : " (or its events were larger than the "
                "response store)");
}

/* A stored response (the Responses API): GET /v1/responses/{id} (the Response; a background one's status
 * until it ends), DELETE (gone; a running background response is cancelled), GET .../input_items (the
 * conversation items before its output, as OpenAI lists them), POST .../cancel (a background response: a
 * running one ends with status cancelled, an ended one is given as it is; others are a 400). */
static enum MHD_Result do_response_id(mr_server *s, struct MHD_Connection *c, sv_hreq *h, const char *url,
                                      const char *method) {
    char id[160];
    const char *p = url + 14, *tail = strchr(p, '/');
    const size_t n = tail ? (size_t)(tail - p) : strlen(p);
    if (tail && strcmp(tail, "/input_items") && strcmp(tail, "/cancel"))
        return fail(s, c, 404, NULL, "no route for %.16s %.200s", method, url);
    if (!s->store)
        return fail(s, c, 404, "response_id", "Response with id '%.100s' not found: this server stores no responses "
                    "(--response-store-mb 0)", p);
    if (n >= sizeof id - strlen(EVENTS_SUFFIX) || memchr(p, '#', n))
        return fail(s, c, 404, "response_id", "Response with id '%.100s' not found", p);
    memcpy(id, p, n);
    id[n] = 0;
    const char *stream = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "stream");
    if (!tail && strcmp(method, "DELETE") && stream && strcmp(stream, "false")) return stream_response(s, c, h, id, stream);
    if (!strcmp(method, "DELETE")) {
        pthread_mutex_lock(&s->bgmu);
        sv_bg *b = bg_find(s, id);
        if (b) {
            b->deleted = true;
            sv_job_cancel(b->j);
        }
        pthread_mutex_unlock(&s->bgmu);
        char key[sizeof id + sizeof EVENTS_SUFFIX];
        events_key(key, sizeof key, id);
        sv_store_delete(s->store, key);
        if (!sv_store_delete(s->store, id) && !b) return fail(s, c, 404, "response_id", "Response with id '%s' not found", id);
        return send_object(s, c, json_pack("{s:s,s:s,s:b}", "id", id, "object", "response", "deleted", 1));
    }
    if (tail && !strcmp(tail, "/cancel")) {
        json_t *r = NULL;
        pthread_mutex_lock(&s->bgmu);
        sv_bg *b = bg_find(s, id);
        if (b) {
            sv_job_cancel(b->j); /* the engine ends it at its next step; the driver keeps it as cancelled */
            r = sv_resp_object(b->j, s->name, "cancelled");
        }
        pthread_mutex_unlock(&s->bgmu);
        if (b) return send_object(s, c, r);
    }
    char *resp = NULL, *items = NULL;
    int n_input = 0;
    const bool list = tail && !strcmp(tail, "/input_items");
    const int rc = sv_store_get(s->store, id, list ? NULL : &resp, list ? &items : NULL, &n_input);
    if (rc > 0) return fail(s, c, 404, "response_id", "Response with id '%s' not found", id);
    if (rc < 0) return fail(s, c, 500, NULL, "out of memory");
    if (tail && !strcmp(tail, "/cancel")) { /* ended: a background response as it is */
        json_t *r = json_loads(resp, 0, NULL);
        const bool bg = json_is_true(json_object_get(r, "background"));
        json_decref(r);
        enum MHD_Result ok = bg ? send_json(c, 200, resp)
                                : fail(s, c, 400, "response_id", "Only a background response can be cancelled; '%s' was "
                                       "not one", id);
        mr_free(resp);
        return ok;
    }
    enum MHD_Result r;
    if (list) {
        sv_error e;
        json_t *all = json_loads(items, 0, NULL);
        mr_free(items);
        if (!all) return fail(s, c, 500, NULL, "out of memory");
        char *b = sv_item_page(all, n_input, MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit"),
                               MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "order"),
                               MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after"), "input item of this response", &e);
        json_decref(all);
        if (!b) return send_error_on(s, c, R_RESPONSE_ID, &e);
        r = send_json(c, 200, b);
        free(b);
        return r;
    }
    r = send_json(c, 200, resp);
    mr_free(resp);
    return r;
}

/* include=... (also include[]=...) of a conversation's items: the values this server gives */
static enum MHD_Result conv_include(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    sv_conv_query *q = cls;
    if (strcmp(key, "include") && strcmp(key, "include[]")) return MHD_YES;
    if (value && !strcmp(value, "reasoning.encrypted_content")) q->encrypted = true;
    else if (!value || strcmp(value, "message.output_text.logprobs")) q->bad_include = value ? value : "";
    return MHD_YES;
}

/* The Conversations API (conversations.c): /v1/conversations and what is under it. */
static enum MHD_Result do_conversations(mr_server *s, struct MHD_Connection *c, sv_hreq *h, const char *url,
                                        const char *method) {
    sv_conv_query q = {.limit = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit"),
                       .order = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "order"),
                       .after = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after")};
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, conv_include, &q);
    sv_error e = {0};
    char *b = sv_conv_handle(s->convs, method, url + strlen("/v1/conversations"), h->body.p ? h->body.p : "", h->body.len,
                             &q, &e);
    if (!b) return send_error(s, c, &e);
    enum MHD_Result r = send_json(c, 200, b);
    mr_free(b);
    return r;
}

/* /tokenize (vLLM: prompt, add_special_tokens, or messages (+ tools,
 * add_generation_prompt) for a rendered chat; llama-server: content,
 * add_special) and /detokenize (tokens). */
static enum MHD_Result do_tokenize(mr_server *s, struct MHD_Connection *c, sv_hreq *h, bool detok) {
    sv_error e = {0};
    if (!serving(s)) return unavailable(s, c);
    if (!sv_json_depth_ok(h->body.p ? h->body.p : "", h->body.len, SV_MAX_JSON_DEPTH, &e)) return send_error(s, c, &e);
    json_error_t je;
    json_t *root = mr__json_loadb(h->body.p ? h->body.p : "", h->body.len, JSON_REJECT_DUPLICATES, &je, NULL);
    if (!json_is_object(root)) {
        json_decref(root);
        return fail(s, c, 400, NULL, "the body must be a JSON object%s%s", root ? "" : ": ", root ? "" : je.text);
    }
    enum MHD_Result res;
    char *text = NULL;
    int32_t *ids = NULL;
    int64_t n = 0;
    json_t *out = NULL;
    const char *k;
    json_t *v;
    if (!detok && json_object_get(root, "messages")) { /* vLLM's chat form: the rendered conversation's ids */
        sv_request r;
        sv_limits lim = {.max_completion_tokens = s->o.max_completion_tokens, .max_choices = s->o.max_choices,
                         .vocab = s->vocab};
        if (sv_request_parse(SV_CHAT, h->body.p, h->body.len, &lim, &r, &e)) {
            res = send_error(s, c, &e);
            goto out;
        }
        mr_status st = !sv_text_has_chat_template(s->text)
                           ? mr_error_set(MR_EUNSUPPORTED, "this model has no chat template")
                           : sv_text_render_chat(s->text, r.messages, r.tool_choice == SV_TOOLS_NONE ? NULL : r.tools,
                                                 r.chat_template_kwargs, r.add_generation_prompt, r.continue_final, &text);
        if (!st) st = sv_text_encode(s->text, text, strlen(text), false, &ids, &n);
        sv_request_free(&r);
        if (st) {
            res = fail(s, c, 400, "messages", "%s", mr_error_last());
            goto out;
        }
        goto ids_out;
    }
    json_object_foreach(root, k, v) {
        static const char *const tok_keys[] = {"model", "prompt", "content", "add_special_tokens", "add_special", NULL};
        static const char *const det_keys[] = {"model", "tokens", NULL};
        const char *const *keys = detok ? det_keys : tok_keys;
        bool known = false;
        for (int i = 0; keys[i]; i++) known |= !strcmp(keys[i], k);
        if (!known) {
            res = fail(s, c, 400, k, "unknown field '%.80s'", k);
            goto out;
        }
    }
    if (!sv_text_has_tokenizer(s->text)) {
        res = fail(s, c, 400, NULL, "this model has no tokenizer.json: the server takes and returns token ids only");
        goto out;
    }
    if (detok) {
        const json_t *t = json_object_get(root, "tokens");
        if (!json_is_array(t)) {
            res = fail(s, c, 400, "tokens", "tokens must be a list of token ids");
            goto out;
        }
        n = (int64_t)json_array_size(t);
        if (!(ids = mr_malloc((size_t)(n ? n : 1) * sizeof(int32_t)))) {
            res = fail(s, c, 500, NULL, "out of memory");
            goto out;
        }
        for (int64_t i = 0; i < n; i++) {
            const json_t *x = json_array_get(t, (size_t)i);
            if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= s->vocab) {
                res = fail(s, c, 400, "tokens", "tokens[%lld] is not a token id in [0, %lld)", (long long)i, (long long)s->vocab);
                goto out;
            }
            ids[i] = (int32_t)json_integer_value(x);
        }
        if (sv_text_decode(s->text, ids, n, false, &text)) {
            res = fail(s, c, 500, NULL, "cannot decode: %s", mr_error_last());
            goto out;
        }
        out = json_pack("{s:s,s:s}", "prompt", text, "content", text);
    } else {
        const json_t *p = json_object_get(root, "prompt");
        if (!p) p = json_object_get(root, "content");
        const json_t *as = json_object_get(root, "add_special_tokens");
        bool llama = !json_object_get(root, "prompt") && json_object_get(root, "content");
        if (!as) as = json_object_get(root, "add_special");
        if (!json_is_string(p)) {
            res = fail(s, c, 400, "prompt", "prompt must be a string");
            goto out;
        }
        if (as && !json_is_boolean(as)) {
            res = fail(s, c, 400, "add_special_tokens", "add_special_tokens must be a boolean");
            goto out;
        }
        bool add = as ? json_is_true(as) : !llama; /* vLLM's default is true, llama-server's false */
        if (sv_text_encode(s->text, json_string_value(p), json_string_length(p), add, &ids, &n)) {
            res = fail(s, c, 400, "prompt", "%s", mr_error_last());
            goto out;
        }
    ids_out:;
        json_t *arr = json_array();
        for (int64_t i = 0; arr && i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
        out = json_pack("{s:o,s:I,s:I}", "tokens", arr, "count", (json_int_t)n, "max_model_len",
                        (json_int_t)s->context_length);
    }
    char *b = out ? json_dumps(out, JSON_COMPACT) : NULL;
    res = b ? send_json(c, 200, b) : fail(s, c, 500, NULL, "out of memory");
    free(b);
out:
    json_decref(out);
    json_decref(root);
    mr_free(ids);
    free(text);
    return res;
}

/* ---- generation ---- */

/* max_tokens of a prompt of L tokens: the request's, else 16 (completions)
 * or the rest of the context (chat), within --max-completion-tokens. The
 * chat default also stops where the whole KV cache would be full: a pool
 * smaller than one context still runs a request that asks for no limit. */
static int64_t max_tokens_of(const mr_server *s, const sv_request *r, int64_t L) {
    if (r->max_tokens >= 0) return r->max_tokens;
    int64_t mt = r->kind == SV_CHAT ? s->context_length - L : 16;
    const int64_t room = s->kv_blocks * MR_KV_BLOCK_TOKENS - L; /* a prompt past the pool: its own 400 */
    if (r->kind == SV_CHAT && s->kv_blocks > 0 && room >= 1 && room < mt) mt = room;
    return mt < s->o.max_completion_tokens ? mt : s->o.max_completion_tokens;
}

/* sglang's token_ids_logprob (with return_logprob): one list of ids for every prompt, or a list per prompt of a
 * batch (null: none for it), checked against the vocabulary; the room for their log-probabilities at each
 * output token and, where the prompt's are owed, each prompt position, at most SV_MAX_ID_LOGPROBS of them. */
static int gens_lp_ids(const mr_server *s, sv_job *j, sv_error *e) {
    const sv_request *r = &j->req;
    const json_t *v = json_object_get(r->sgl_meta, "token_ids_logprob");
    if (!v || !json_is_true(json_object_get(r->sgl_meta, "return_logprob"))) return 0;
    const bool each = json_is_true(json_object_get(r->sgl_meta, "lp_ids_each"));
    if (each && (int64_t)json_array_size(v) != j->n_prompts)
        return sv_fail(e, 400, "token_ids_logprob", "token_ids_logprob holds %zu list%s for a batch of %d prompts",
                       json_array_size(v), json_array_size(v) == 1 ? "" : "s", j->n_prompts);
    size_t n_ids = 0, n_lp = 0;
    for (int i = 0; i < j->n_gen; i++) {
        const sv_gen *g = &j->gens[i];
        const json_t *l = each ? json_array_get(v, (size_t)(i / r->n)) : v;
        const size_t n = json_array_size(l), pos = (size_t)g->max_tokens + (g->plp ? (size_t)g->n_prompt : 0);
        if (i % r->n == 0) n_ids += n;
        n_lp += n * pos; /* n <= 1024 and pos below the context: no overflow */
        if (n_lp > SV_MAX_ID_LOGPROBS)
            return sv_fail(e, 400, "token_ids_logprob",
                           "token_ids_logprob asks for more than %d log-probabilities (ids x positions, over the "
                           "request); ask fewer ids or fewer tokens",
                           SV_MAX_ID_LOGPROBS);
    }
    j->lp_ids = mr_malloc((n_ids ? n_ids : 1) * sizeof(int32_t));
    j->idlp = mr_malloc((n_lp ? n_lp : 1) * sizeof(float));
    if (!j->lp_ids || !j->idlp) return sv_fail(e, 500, NULL, "out of memory");
    size_t io = 0, lo = 0;
    for (int i = 0; i < j->n_gen; i++) {
        sv_gen *g = &j->gens[i];
        const json_t *l = each ? json_array_get(v, (size_t)(i / r->n)) : v;
        if (i % r->n == 0) {
            for (size_t k = 0; k < json_array_size(l); k++) {
                const json_int_t id = json_integer_value(json_array_get(l, k));
                if (id < 0 || id >= s->vocab) {
                    char nm[64];
                    if (each) snprintf(nm, sizeof nm, "token_ids_logprob[%d][%zu]", i / r->n, k);
                    else snprintf(nm, sizeof nm, "token_ids_logprob[%zu]", k);
                    return sv_fail(e, 400, nm, "%s is token id %lld, outside the vocabulary [0, %lld)", nm,
                                   (long long)id, (long long)s->vocab);
                }
                j->lp_ids[io + k] = (int32_t)id;
            }
            io += json_array_size(l);
        }
        if (!json_is_array(l)) continue; /* null: this prompt of the batch asked none */
        g->has_lp_ids = true;
        g->n_lp_ids = (int)json_array_size(l);
        g->lp_ids = j->lp_ids + io - (size_t)g->n_lp_ids;
        g->idlp = j->idlp + lo;
        lo += (size_t)g->n_lp_ids * (size_t)g->max_tokens;
        if (g->plp) {
            g->plp_idlp = j->idlp + lo;
            lo += (size_t)g->n_lp_ids * (size_t)g->n_prompt;
        }
    }
    return 0;
}

/* sglang's return_routed_experts: room for every gen's rows (each position's experts of every layer), the
 * prompt's and the output's. */
static int gens_routes(const mr_server *s, sv_job *j, sv_error *e) {
    if (!s->o.return_routed_experts)
        return sv_fail(e, 400, "return_routed_experts", "return_routed_experts: this server does not return them (start "
                       "it with --enable-return-routed-experts)");
    const mr_model_config *mc = mr_model_config_of(s->m);
    const size_t row = (size_t)mc->n_layers * (size_t)mc->top_k;
    size_t rows = 0;
    for (int i = 0; i < j->n_gen; i++) rows += (size_t)(j->gens[i].n_prompt + j->gens[i].max_tokens);
    if (!(j->routes = mr_malloc((rows ? rows : 1) * row * sizeof(int32_t)))) return sv_fail(e, 500, NULL, "out of memory");
    size_t off = 0;
    for (int i = 0; i < j->n_gen; i++) {
        sv_gen *g = &j->gens[i];
        g->routes = j->routes + off * row;
        g->routes_cap = g->n_prompt + g->max_tokens;
        off += (size_t)g->routes_cap;
    }
    return 0;
}

/* Structured outputs: a matcher per gen over the request's grammar. The output ends with the model's
 * EOS ids or the request's stop ids, and a reasoning model's chat answer is free up to its "</think>". */
static int gens_matchers(const mr_server *s, sv_job *j, sv_error *e) {
    const sv_request *r = &j->req;
    const mr_model_config *c = mr_model_config_of(s->m);
    int32_t end[32];
    int n_end = 0;
    for (int i = 0; i < c->n_eos && n_end < 16; i++)
        if (c->eos_ids[i] >= 0) end[n_end++] = c->eos_ids[i];
    for (int i = 0; i < r->n_stop_ids && n_end < 32; i++) end[n_end++] = r->stop_ids[i];
    mr_matcher_opts o = {.end_ids = end, .n_end = n_end,
                         .free_until = r->kind == SV_CHAT && sv_text_reasoning(s->text) && (!r->continue_final || r->think_open)
                                           ? "</think>" : NULL,
                         .no_whitespace = r->so_compact};
    for (int i = 0; i < j->n_gen; i++)
        if (mr_matcher_new(r->grammar, sv_text_vocab_index(s->text), &o, &j->gens[i].matcher))
            return sv_fail(e, 500, NULL, "out of memory");
    return 0;
}

/* vLLM's bad_words (SamplingParams.update_from_tokenizer): each word,
 * left-stripped, tokenized as is and with a leading space; the second form
 * is kept too when it starts with another token and has as many. Into
 * r->bad_ids / bad_len; 0 or -1 with e filled. */
static int bad_words_tokenize(const mr_server *s, sv_request *r, sv_error *e) {
    int64_t cap = 0, used = 0;
    for (int i = 0; i < r->n_bad_words; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "bad_words[%d]", i);
        const char *w = r->bad_words[i];
        while (*w == ' ' || *w == '\t' || *w == '\n' || *w == '\r') w++;
        int32_t *ids[2] = {NULL, NULL};
        int64_t n[2] = {0, 0};
        char *spaced = mr_malloc(strlen(w) + 2);
        if (!spaced) return sv_fail(e, 500, NULL, "out of memory");
        spaced[0] = ' ';
        memcpy(spaced + 1, w, strlen(w) + 1);
        int rc = 0;
        if (sv_text_encode(s->text, w, strlen(w), false, &ids[0], &n[0]) ||
            sv_text_encode(s->text, spaced, strlen(spaced), false, &ids[1], &n[1])) {
            rc = sv_fail(e, 400, nm, "cannot tokenize %s: %s", nm, mr_error_last());
        } else if (n[0] == 0) {
            rc = sv_fail(e, 400, nm, "%s is only white space", nm);
        } else if (n[0] > MR_ENGINE_MAX_BAD_WORD_TOKENS) {
            rc = sv_fail(e, 400, nm, "%s is %lld tokens; at most %d", nm, (long long)n[0], MR_ENGINE_MAX_BAD_WORD_TOKENS);
        }
        const int forms = rc == 0 && n[1] == n[0] && ids[1][0] != ids[0][0] ? 2 : 1;
        if (rc == 0 && used + forms * n[0] > cap) {
            int64_t nc = (used + forms * n[0]) * 2;
            int32_t *nb = mr_realloc(r->bad_ids, (size_t)nc * sizeof(int32_t));
            if (!nb) rc = sv_fail(e, 500, NULL, "out of memory");
            else r->bad_ids = nb, cap = nc;
        }
        for (int f = 0; rc == 0 && f < forms; f++) {
            memcpy(r->bad_ids + used, ids[f], (size_t)n[0] * sizeof(int32_t));
            used += n[0];
            r->bad_len[r->n_bad_seq++] = (int32_t)n[0];
        }
        mr_free(spaced);
        mr_free(ids[0]);
        mr_free(ids[1]);
        if (rc) return rc;
    }
    return 0;
}

/* Whether some allowed id survives the masks known before generation (the
 * one-token bad words, and the stop and EOS ids when min_tokens > 0): a
 * request that could sample nothing is the client's error, a 400 here
 * rather than a failed step (which the engine still catches for the masks
 * that depend on the output). */
static bool allowed_left(const mr_server *s, const sv_request *r) {
    for (int64_t i = 0; i < r->n_allowed; i++) {
        const int32_t t = r->allowed[i];
        bool banned = false;
        for (int q = 0, off = 0; q < r->n_bad_seq && !banned; off += r->bad_len[q++])
            banned = r->bad_len[q] == 1 && r->bad_ids[off] == t;
        if (r->min_tokens > 0) {
            for (int q = 0; q < r->n_stop_ids && !banned; q++) banned = r->stop_ids[q] == t;
            banned |= !r->ignore_eos && mr_model_is_eos(s->m, t);
        }
        if (!banned) return true;
    }
    return false;
}

/* A chat request's messages rendered by the template and tokenized; 0 or -1 with e filled. */
static int render_chat(const mr_server *s, const sv_request *r, const json_t *msgs, char **text, int32_t **ids, int64_t *n,
                       sv_error *e) {
    if (sv_text_render_chat(s->text, msgs, r->tool_choice == SV_TOOLS_NONE ? NULL : r->tools, r->chat_template_kwargs,
                            r->add_generation_prompt, r->continue_final, text))
        return sv_fail(e, 400, r->continue_final ? "continue_final_message" : "messages",
                       "the chat template refused the messages: %s", mr_error_last());
    if (sv_text_encode(s->text, *text, strlen(*text), false, ids, n))
        return sv_fail(e, 400, "messages", "cannot tokenize the rendered chat: %s", mr_error_last());
    return 0;
}

/* A prompt of L tokens leaves room for the request's completion: the context, --max-prompt-tokens, the KV
 * cache (what make_job's checks below ask). */
static bool prompt_fits(const mr_server *s, const sv_request *r, int64_t L) {
    const int64_t mt = r->max_tokens >= 0 ? r->max_tokens : 1;
    const int64_t blocks = (L + mt + MR_KV_BLOCK_TOKENS - 1) / MR_KV_BLOCK_TOKENS;
    return L <= s->o.max_prompt_tokens && L + mt <= s->context_length && (s->kv_blocks <= 0 || blocks <= s->kv_blocks);
}

/* The messages without the first k of the conversation (the leading system / developer messages, the
 * instructions, stay), and without tool results left at its start without their call. NULL out of memory. */
static json_t *messages_from(const json_t *msgs, size_t lead, size_t k) {
    json_t *out = json_array();
    for (size_t i = 0; out && i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (i >= lead && i < lead + k) continue;
        if (i >= lead + k && json_array_size(out) == lead && role && !strcmp(role, "tool")) {
            k++;
            continue;
        }
        if (json_array_append(out, (json_t *)m)) json_decref(out), out = NULL;
    }
    return out;
}

/* The Responses API's truncation "auto" (OpenAI's): a conversation past the context drops its items from
 * the beginning, the fewest that make it fit (found by bisection: fewer items never make a longer
 * prompt; a cut the template refuses counts as too long), the last one kept; the prompt, its ids and
 * its length replaced. 0 (a prompt that still does not fit is left to the checks after, as without
 * truncation) or -1 with e filled. */
static int truncate_chat(const mr_server *s, sv_request *r, char **text, int32_t **ids, int64_t *n, sv_error *e) {
    const json_t *msgs = r->messages;
    size_t lead = 0, total = json_array_size(msgs);
    while (lead < total) {
        const char *role = json_string_value(json_object_get(json_array_get(msgs, lead), "role"));
        if (!role || (strcmp(role, "system") && strcmp(role, "developer"))) break;
        lead++;
    }
    if (total - lead < 2) return 0;
    size_t lo = 1, hi = total - lead - 1; /* drop lo..hi; hi keeps the last message */
    json_t *best = NULL;
    char *bt = NULL;
    int32_t *bi = NULL;
    int64_t bn = 0;
    while (lo <= hi) {
        const size_t k = lo + (hi - lo) / 2;
        json_t *m = messages_from(msgs, lead, k);
        char *t = NULL;
        int32_t *id = NULL;
        int64_t nn = 0;
        if (!m) return json_decref(best), mr_free(bt), mr_free(bi), sv_fail(e, 500, NULL, "out of memory");
        sv_error ignored; /* a template that refuses this cut (one that must begin with a user turn) */
        if (!render_chat(s, r, m, &t, &id, &nn, &ignored) && prompt_fits(s, r, nn)) {
            json_decref(best), mr_free(bt), mr_free(bi);
            best = m, bt = t, bi = id, bn = nn;
            hi = k - 1;
        } else {
            json_decref(m), mr_free(t), mr_free(id);
            lo = k + 1;
        }
    }
    if (!best) return 0;
    json_decref(r->messages);
    r->messages = best;
    mr_free(*text), mr_free(*ids);
    *text = bt, *ids = bi, *n = bn;
    return 0;
}

/* Tokenizes the request's prompt(s) into a job; 0 or -1 with e filled. */
static int make_job(mr_server *s, sv_request *r, sv_job **out, sv_error *e) {
    *out = NULL;
    int np = r->kind == SV_CHAT ? 1 : r->n_prompts;
    sv_job *j = mr_calloc(1, sizeof *j);
    if (!j) {
        sv_request_free(r); /* (what the job would have owned: a conversation's claim is given up) */
        return sv_fail(e, 500, NULL, "out of memory");
    }
    pthread_mutex_init(&j->mu, NULL);
    atomic_init(&j->refs, 1);
    j->srv = s;
    j->n_prompts = np;
    j->req = *r;
    memset(r, 0, sizeof *r); /* the job owns the request now */
    r = &j->req;
    int32_t **pid = mr_calloc((size_t)np, sizeof *pid);
    j->prompt_len = mr_calloc((size_t)np, sizeof *j->prompt_len);
    j->prompt_text = mr_calloc((size_t)np, sizeof *j->prompt_text);
    int rc = -1;
    if (!pid || !j->prompt_len || !j->prompt_text) {
        sv_fail(e, 500, NULL, "out of memory");
        goto out;
    }
    bool tok = sv_text_has_tokenizer(s->text);
    if (r->echo && !tok) {
        sv_fail(e, 400, "echo", "echo needs text: this model has no tokenizer.json");
        goto out;
    }
    if (r->n_stop && !tok) {
        sv_fail(e, 400, "stop", "stop strings need text: this model has no tokenizer.json (use stop_token_ids)");
        goto out;
    }
    if (r->n_bad_words && !tok) {
        sv_fail(e, 400, "bad_words", "bad_words need text: this model has no tokenizer.json");
        goto out;
    }
    if (r->n_bad_words && bad_words_tokenize(s, r, e)) goto out;
    if (r->grammar && !tok) {
        sv_fail(e, 400, r->so ? r->so_field : "tool_choice", "structured outputs need text: this model has no "
                "tokenizer.json");
        goto out;
    }
    if (r->n_allowed && !allowed_left(s, r)) {
        sv_fail(e, 400, "allowed_token_ids", "every id of allowed_token_ids is banned (a one-token bad word%s)",
                r->min_tokens ? ", or a stop or EOS id before min_tokens" : "");
        goto out;
    }
    int64_t total = 0;
    for (int i = 0; i < np; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, np > 1 ? "prompt[%d]" : "prompt", i);
        if (r->kind == SV_CHAT) {
            if (!sv_text_has_chat_template(s->text)) {
                sv_fail(e, 400, "messages", "this model has no chat template (no tokenizer_config.json chat_template "
                        "or chat_template.jinja): use /v1/completions");
                goto out;
            }
            if (render_chat(s, r, r->messages, &j->prompt_text[i], &pid[i], &j->prompt_len[i], e)) goto out;
            if (r->resp_truncate && !prompt_fits(s, r, j->prompt_len[i]) &&
                truncate_chat(s, r, &j->prompt_text[i], &pid[i], &j->prompt_len[i], e))
                goto out;
            r->think_open = sv_text_think_open(j->prompt_text[i]);
        } else if (r->prompts[i].text) {
            if (!tok) {
                sv_fail(e, 400, nm, "this model has no tokenizer.json: send the prompt as token ids");
                goto out;
            }
            if (sv_text_encode(s->text, r->prompts[i].text, strlen(r->prompts[i].text), true, &pid[i],
                               &j->prompt_len[i])) {
                sv_fail(e, 400, nm, "cannot tokenize %s: %s", nm, mr_error_last());
                goto out;
            }
            j->prompt_text[i] = mr_strdup(r->prompts[i].text);
            if (!j->prompt_text[i]) {
                sv_fail(e, 500, NULL, "out of memory");
                goto out;
            }
        } else {
            pid[i] = r->prompts[i].ids;
            r->prompts[i].ids = NULL;
            j->prompt_len[i] = r->prompts[i].n_ids;
            if (tok && r->echo && sv_text_decode(s->text, pid[i], j->prompt_len[i], r->skip_special_tokens,
                                                 &j->prompt_text[i])) {
                sv_fail(e, 500, NULL, "cannot decode the prompt for echo: %s", mr_error_last());
                goto out;
            }
        }
        const int64_t keep = r->truncate_prompt_tokens < 0 ? s->context_length : r->truncate_prompt_tokens;
        if (keep > 0 && j->prompt_len[i] > keep) { /* vLLM's truncate_prompt_tokens: the last keep tokens */
            memmove(pid[i], pid[i] + (j->prompt_len[i] - keep), (size_t)keep * sizeof(int32_t));
            j->prompt_len[i] = keep;
            if (j->prompt_text[i]) { /* echo shows what the model saw */
                mr_free(j->prompt_text[i]);
                j->prompt_text[i] = NULL;
                if (sv_text_decode(s->text, pid[i], keep, r->skip_special_tokens, &j->prompt_text[i])) {
                    sv_fail(e, 500, NULL, "cannot decode the truncated prompt: %s", mr_error_last());
                    goto out;
                }
            }
        }
        int64_t L = j->prompt_len[i];
        if (L == 0) {
            sv_fail(e, 400, r->kind == SV_CHAT ? "messages" : nm, "%s is empty (0 tokens)",
                    r->kind == SV_CHAT ? "the rendered chat" : nm);
            goto out;
        }
        if (L > s->o.max_prompt_tokens) {
            sv_fail(e, 400, r->kind == SV_CHAT ? "messages" : nm,
                    "%s is %lld tokens, above this server's limit of %lld prompt tokens (--max-prompt-tokens)",
                    r->kind == SV_CHAT ? "the prompt" : nm, (long long)L, (long long)s->o.max_prompt_tokens);
            goto out;
        }
        int64_t mt = max_tokens_of(s, r, L);
        if (r->min_tokens > mt) {
            sv_fail(e, 400, "min_tokens", "min_tokens %lld is above max_tokens %lld", (long long)r->min_tokens,
                    (long long)mt);
            goto out;
        }
        if (mt == 0 && r->max_tokens == 0) mt = 1; /* echo, or /generate's prefill: the engine's one token, not sent */
        if (mt < 1 || L + mt > s->context_length) {
            sv_fail(e, 400, r->max_tokens < 0 ? (r->kind == SV_CHAT ? "messages" : nm) : "max_tokens",
                    "This model's maximum context length is %lld tokens. However, you requested %lld tokens (%lld in the "
                    "%s, %lld in the completion). Please reduce the length of the %s or max_tokens.",
                    (long long)s->context_length, (long long)(L + mt), (long long)L,
                    r->kind == SV_CHAT ? "messages" : "prompt", (long long)mt, r->kind == SV_CHAT ? "messages" : "prompt");
            goto out;
        }
        int64_t blocks = (L + mt + MR_KV_BLOCK_TOKENS - 1) / MR_KV_BLOCK_TOKENS;
        if (s->kv_blocks > 0 && blocks > s->kv_blocks) {
            sv_fail(e, 400, r->max_tokens < 0 ? (r->kind == SV_CHAT ? "messages" : nm) : "max_tokens",
                    "%lld prompt + %lld completion tokens need %lld KV blocks; the whole cache holds %lld "
                    "(--kv-cache-memory)",
                    (long long)L, (long long)mt, (long long)blocks, (long long)s->kv_blocks);
            goto out;
        }
        if (!mr_u64_add((uint64_t)total, (uint64_t)L, (uint64_t *)&total)) {
            sv_fail(e, 400, NULL, "prompt sizes overflow");
            goto out;
        }
    }
    if (r->forced_text) { /* tests: the output's tokens, special-token text included */
        if (sv_text_encode(s->text, r->forced_text, strlen(r->forced_text), false, &j->forced, &j->n_forced)) {
            sv_fail(e, 400, "debug_forced_output", "%s", mr_error_last());
            goto out;
        }
    } else if (r->forced_ids) {
        j->forced = r->forced_ids;
        j->n_forced = r->n_forced_ids;
        r->forced_ids = NULL;
    }
    /* the gens: prompt-major, n per prompt; one out[] block for all */
    j->n_gen = np * r->n;
    j->gens = mr_calloc((size_t)j->n_gen, sizeof *j->gens);
    j->ids = mr_malloc((size_t)(total ? total : 1) * sizeof(int32_t));
    size_t n_out = 0;
    const bool echo_lp = r->kind == SV_COMPLETIONS && r->echo && r->logprobs;
    const bool plp = echo_lp || r->prompt_logprobs >= 0;
    r->plp_top = echo_lp ? r->top_logprobs : 0;
    if (r->prompt_logprobs > r->plp_top) r->plp_top = r->prompt_logprobs;
    size_t n_plp = 0; /* echo with logprobs: every gen's prompt entries */
    for (int i = 0; i < np; i++) {
        int64_t mt = max_tokens_of(s, r, j->prompt_len[i]);
        if (mt == 0) mt = 1;
        size_t add;
        if (plp && r->plp_from > j->prompt_len[i]) { /* sglang's logprob_start_len, at or past the prompt's end */
            sv_fail(e, 400, "logprob_start_len", "logprob_start_len %lld is not below the prompt's %lld tokens%s",
                    (long long)(r->plp_from - 1), (long long)j->prompt_len[i], np > 1 ? " (a prompt of the batch)" : "");
            goto out;
        }
        if (plp && (!mr_size_mul((size_t)j->prompt_len[i], (size_t)r->n, &add) || !mr_size_add(n_plp, add, &n_plp))) {
            sv_fail(e, 400, "prompt", "prompt tokens x n overflows");
            goto out;
        }
        if (!mr_size_mul((size_t)mt, (size_t)r->n, &add) || !mr_size_add(n_out, add, &n_out)) {
            sv_fail(e, 400, "max_tokens", "max_tokens x n overflows");
            goto out;
        }
    }
    int32_t *outs = j->gens ? mr_malloc(n_out * sizeof(int32_t)) : NULL;
    const size_t lpz = sv_logprob_size(r->top_logprobs); /* a product past SIZE_MAX: out of memory */
    sv_logprob *lps = r->logprobs && outs && n_out < SIZE_MAX / lpz ? mr_malloc(n_out * lpz) : NULL;
    const size_t plpz = sv_logprob_size(r->plp_top);
    sv_logprob *plps = plp && outs && n_plp < SIZE_MAX / plpz ? mr_calloc(n_plp, plpz) : NULL;
    if (!j->gens || !j->ids || !outs || (r->logprobs && !lps) || (plp && !plps)) {
        mr_free(outs);
        mr_free(lps);
        mr_free(plps);
        sv_fail(e, 500, NULL, "out of memory");
        goto out;
    }
    size_t poff = 0;
    int64_t off = 0;
    size_t ooff = 0;
    for (int i = 0; i < np; i++) {
        memcpy(j->ids + off, pid[i], (size_t)j->prompt_len[i] * sizeof(int32_t));
        int64_t mt = max_tokens_of(s, r, j->prompt_len[i]);
        const bool echo_only = mt == 0;
        if (echo_only) mt = 1;
        for (int k = 0; k < r->n; k++) {
            sv_gen *g = &j->gens[i * r->n + k];
            g->job = j;
            g->index = i * r->n + k;
            g->prompt = j->ids + off;
            g->n_prompt = j->prompt_len[i];
            g->max_tokens = mt;
            g->ignore_eos = r->ignore_eos;
            g->out = outs + ooff;
            g->forced = j->forced;
            g->n_forced = j->n_forced;
            atomic_init(&g->cancel, 0);
            g->sp = (mr_sampling){
                .temperature = r->has_temperature ? r->temperature : s->def_temperature,
                .top_p = r->has_top_p ? r->top_p : s->def_top_p,
                .top_k = r->has_top_k ? r->top_k : s->def_top_k,
                .min_p = r->has_min_p ? r->min_p : s->def_min_p,
                /* a given seed: choice k of each prompt uses seed + k, so a prompt of a list samples as it
                 * would alone (vLLM); without one the engine draws a fresh seed per choice */
                .seed = r->seed + (uint64_t)k,
                .presence_penalty = r->presence_penalty,
                .frequency_penalty = r->frequency_penalty,
                .repetition_penalty = r->has_repetition_penalty ? r->repetition_penalty : s->def_repetition_penalty,
            };
            if (lps) g->lp = sv_logprob_at(lps, r->top_logprobs, (int64_t)ooff);
            ooff += (size_t)mt;
            g->echo_only = echo_only;
            g->n_plp = 1;
            if (plps) {
                g->plp = sv_logprob_at(plps, r->plp_top, (int64_t)poff);
                poff += (size_t)g->n_prompt;
            }
        }
        off += j->prompt_len[i];
    }
    if (r->grammar_tools && !sv_text_tagged_output(s->text)) { /* no tool-call format here: nothing to hold */
        mr_grammar_free(j->req.grammar);
        j->req.grammar = NULL;
    }
    if (r->grammar_native && sv_text_tagged_output(s->text)) { /* the forced calls in the model's own format */
        mr_grammar_free(j->req.grammar);
        j->req.grammar = j->req.grammar_native;
        j->req.grammar_native = NULL;
        j->req.grammar_tools = true;
    }
    if (r->grammar && gens_matchers(s, j, e)) goto out;
    if (gens_lp_ids(s, j, e)) goto out;
    if (r->routes && gens_routes(s, j, e)) goto out;
    j->live = j->n_gen;
    unsigned long long id = atomic_fetch_add(&s->counter, 1);
    snprintf(j->id, sizeof j->id, "%s-%08llx%08llx", r->kind == SV_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)(mr_now_ns() & 0xffffffffu), id);
    j->created = (int64_t)time(NULL);
    rc = 0;
out:
    if (pid) {
        for (int i = 0; i < np; i++) mr_free(pid[i]);
        mr_free(pid);
    }
    if (rc) {
        sv_job_release(j);
        return -1;
    }
    *out = j;
    return 0;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    sv_hreq *h = cls;
    for (;;) {
        if (h->sse_off < h->sse.len) {
            conn_busy(h, false);
            size_t n = h->sse.len - h->sse_off;
            if (n > max) n = max;
            memcpy(buf, h->sse.p + h->sse_off, n);
            h->sse_off += n;
            if (h->sse_off == h->sse.len) h->sse_off = h->sse.len = 0;
            if (h->s->o.debug_slow_stream) nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
            return (ssize_t)n;
        }
        if (h->stream_done) {
            h->complete = true;
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (atomic_load(&h->s->stopping)) return MHD_CONTENT_READER_END_WITH_ERROR;
        const uint64_t v = job_version(h->job);
        int r = sv_out_advance(h->out, &h->sse);
        if (r < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (r == 1) h->stream_done = true;
        if (h->sse.len || r == 1) continue;
        if (park(h, v)) return 0; /* called again once the engine has published */
    }
}

/* Not streaming: the body once the job is complete; until then the
 * connection stays parked (the handler is called again when resumed). */
static enum MHD_Result await_body(mr_server *s, struct MHD_Connection *c, sv_hreq *h) {
    sv_buf none = {0};
    for (;;) {
        if (atomic_load(&s->stopping)) {
            sv_buf_free(&none);
            return MHD_NO; /* the completion callback cancels the job */
        }
        const uint64_t v = job_version(h->job);
        const int rc = sv_out_advance(h->out, &none);
        if (rc < 0) {
            sv_buf_free(&none);
            return fail(s, c, 500, NULL, "out of memory");
        }
        if (rc == 1) break;
        if (park(h, v)) {
            sv_buf_free(&none);
            return MHD_YES;
        }
    }
    sv_buf_free(&none);
    conn_busy(h, false);
    int status;
    char *body = sv_out_body(h->out, &status);
    if (!body) return fail(s, c, 500, NULL, "out of memory");
    h->complete = true;
    enum MHD_Result ok = send_json(c, status, body);
    mr_free(body);
    return ok;
}

/* A background response (admitted, its output ready in h->out): kept as queued and answered at once (one
 * that streams: its events streamed from the first, the connection a follower that may go without ending
 * it); the driver thread runs it from here, without the connection. */
static enum MHD_Result run_background(mr_server *s, struct MHD_Connection *c, sv_hreq *h, sv_job *j) {
    sv_bg *b = mr_calloc(1, sizeof *b);
    char *text = NULL;
    const int kept = b ? bg_keep(s, j, "queued", NULL, &text) : -1;
    if (kept) {
        sv_engine_unreserve(s->eng, j->n_gen);
        sv_out_free(h->out);
        h->out = NULL;
        sv_job_release(j);
        mr_free(b);
        if (kept > 0) return fail(s, c, 400, "input", "the conversation is larger than the response store (--response-store-mb)");
        return fail(s, c, 500, NULL, "out of memory");
    }
    if (j->req.stream && !(b->log = evlog_new())) {
        sv_engine_unreserve(s->eng, j->n_gen);
        sv_out_free(h->out);
        h->out = NULL;
        sv_store_delete(s->store, j->req.resp_id);
        sv_job_release(j);
        mr_free(b);
        free(text);
        return fail(s, c, 500, NULL, "out of memory");
    }
    pthread_mutex_lock(&s->met.mu);
    s->met.by_api[SV_API_RESPONSES]++;
    pthread_mutex_unlock(&s->met.mu);
    b->j = j;
    b->out = h->out;
    h->out = NULL;
    j->wake = bg_wake;
    j->wake_arg = s;
    j->wake_each = true;
    sv_evlog *L = b->log ? evlog_ref(b->log) : NULL; /* b is the driver's from here: it may end and go at once */
    pthread_mutex_lock(&s->bgmu);
    b->next = s->bg;
    s->bg = b;
    pthread_mutex_unlock(&s->bgmu);
    atomic_fetch_add(&j->refs, 1); /* the engine's */
    jobs_add(s, j);
    sv_engine_submit(s->eng, j);
    bg_wake(s);
    if (L) { /* its events are this connection's too */
        free(text);
        const enum MHD_Result r = follow(c, h, L, 0);
        evlog_release(L);
        return r;
    }
    enum MHD_Result ok = send_json(c, 200, text);
    free(text);
    return ok;
}

/* Anthropic's /v1/messages/count_tokens: the prompt tokens the same request would have. */
static enum MHD_Result do_count_tokens(mr_server *s, struct MHD_Connection *c, sv_hreq *h) {
    sv_error e = {0};
    if (!serving(s)) return unavailable(s, c);
    char *chat = NULL, *text = NULL;
    int32_t *ids = NULL;
    int64_t n = 0;
    sv_request r;
    sv_limits lim = {.max_completion_tokens = s->o.max_completion_tokens, .max_choices = s->o.max_choices, .vocab = s->vocab};
    if (sv_anthropic_to_chat(h->body.p ? h->body.p : "", h->body.len, true, &chat, &e)) return send_error_on(s, c, h->route, &e);
    const int bad = sv_request_parse(SV_CHAT, chat, strlen(chat), &lim, &r, &e);
    free(chat);
    if (bad) return send_error_on(s, c, h->route, &e);
    mr_status st = !sv_text_has_chat_template(s->text)
                       ? mr_error_set(MR_EUNSUPPORTED, "this model has no chat template")
                       : sv_text_render_chat(s->text, r.messages, r.tool_choice == SV_TOOLS_NONE ? NULL : r.tools,
                                             r.chat_template_kwargs, r.add_generation_prompt, false, &text);
    if (!st) st = sv_text_encode(s->text, text, strlen(text), false, &ids, &n);
    sv_request_free(&r);
    free(text);
    mr_free(ids);
    if (st) {
        sv_fail(&e, 400, "messages", "%s", mr_error_last());
        return send_error_on(s, c, h->route, &e);
    }
    char body[64];
    snprintf(body, sizeof body, "{\"input_tokens\":%lld}", (long long)n);
    return send_json(c, 200, body);
}

static enum MHD_Result do_generate(mr_server *s, struct MHD_Connection *c, sv_hreq *h) {
    sv_error e = {0};
    sv_request r;
    if (!serving(s)) return unavailable(s, c);
    sv_limits lim = {.max_completion_tokens = s->o.max_completion_tokens, .max_choices = s->o.max_choices,
                     .vocab = s->vocab, .allow_forced = s->o.debug_forced_output, .priority = s->eo.priority_scheduling};
    if (h->route == R_GENERATE || h->route == R_SCORE) { /* sglang's: run as the completions request it stands for */
        char *cmpl = NULL;
        json_t *meta = NULL;
        const char *body = h->body.p ? h->body.p : "";
        if (h->route == R_SCORE ? sv_score_to_completions(body, h->body.len, &cmpl, &meta, &e)
                                : sv_sglang_to_completions(body, h->body.len, &cmpl, &meta, &e)) {
            if (h->route == R_SCORE) sv_score_param(&e);
            return send_error_on(s, c, h->route, &e);
        }
        const int bad = sv_request_parse(SV_COMPLETIONS, cmpl, strlen(cmpl), &lim, &r, &e);
        free(cmpl);
        if (bad) {
            json_decref(meta);
            if (h->route == R_SCORE) sv_score_param(&e);
            else sv_sglang_param(&e);
            return send_error_on(s, c, h->route, &e);
        }
        r.sgl_meta = meta;
        sv_sglang_apply(meta, &r);
    } else if (h->route == R_MESSAGES) { /* Anthropic's Messages API: run as the chat request it translates to */
        char *chat = NULL;
        if (sv_anthropic_to_chat(h->body.p ? h->body.p : "", h->body.len, false, &chat, &e))
            return send_error_on(s, c, h->route, &e);
        const int bad = sv_request_parse(SV_CHAT, chat, strlen(chat), &lim, &r, &e);
        free(chat);
        if (bad) return send_error_on(s, c, h->route, &e);
        r.anthropic = true;
    } else if (h->route == R_RESPONSES) { /* the Responses API: run as the chat request it translates to */
        sv_resp_in in;
        if (sv_responses_to_chat(h->body.p ? h->body.p : "", h->body.len, s->store, s->convs, &in, &e))
            return send_error_on(s, c, h->route, &e);
        const int bad = sv_request_parse(SV_CHAT, in.chat_json, strlen(in.chat_json), &lim, &r, &e);
        free(in.chat_json);
        if (bad) {
            json_decref(in.echo);
            json_decref(in.ctx);
            json_decref(in.conv_input);
            if (in.conv[0]) sv_conv_release(s->convs, in.conv, in.id, in.conv_reserved);
            sv_responses_param(&e);
            return send_error_on(s, c, h->route, &e);
        }
        r.resp_echo = in.echo;
        r.resp_encrypted = in.encrypted;
        r.resp_ctx = in.ctx;
        r.resp_store = in.keep ? s->store : NULL;
        r.resp_background = in.background;
        r.resp_truncate = in.truncate;
        snprintf(r.resp_id, sizeof r.resp_id, "%s", in.id);
        if (in.conv[0]) { /* the claim and its room are the request's now */
            r.resp_convs = s->convs;
            snprintf(r.resp_conv, sizeof r.resp_conv, "%s", in.conv);
            r.resp_conv_reserved = in.conv_reserved;
        }
        r.resp_conv_input = in.conv_input;
    } else if (sv_request_parse(h->route == R_CHAT ? SV_CHAT : SV_COMPLETIONS, h->body.p ? h->body.p : "", h->body.len,
                                &lim, &r, &e)) {
        return send_error_on(s, c, h->route, &e);
    }
    if (r.model && strcmp(r.model, s->name)) {
        sv_fail(&e, 404, "model", "The model '%.200s' does not exist (this server serves '%s')", r.model, s->name);
        sv_request_free(&r);
        return send_error_on(s, c, h->route, &e);
    }
    sv_job *j;
    if (make_job(s, &r, &j, &e)) {
        if (h->route == R_RESPONSES) sv_responses_param(&e);
        if (h->route == R_GENERATE) sv_sglang_param(&e);
        if (h->route == R_SCORE) sv_score_param(&e);
        return send_error_on(s, c, h->route, &e);
    }
    j->t_arrive_ns = h->t_arrive_ns;
    if (!sv_engine_reserve(s->eng, j->n_gen)) {
        pthread_mutex_lock(&s->met.mu);
        s->met.rejected_queue_full++;
        pthread_mutex_unlock(&s->met.mu);
        sv_fail(&e, 503, NULL,
                "the server is full: %lld sequences admitted, the limit is %d running + %d queued "
                "(--max-running-requests, --max-queued-requests); retry later",
                (long long)sv_engine_inflight(s->eng), s->max_running, s->o.max_queued_requests);
        sv_job_release(j);
        return send_error_on(s, c, h->route, &e);
    }
    if (sv_out_new(j, s->text, s->m, s->name, &h->out)) {
        sv_engine_unreserve(s->eng, j->n_gen);
        sv_job_release(j);
        return fail(s, c, 500, NULL, "out of memory");
    }
    if (j->req.resp_background) return run_background(s, c, h, j);
    h->job = j;
    const int api = h->route == R_CHAT ? SV_API_CHAT : h->route == R_RESPONSES ? SV_API_RESPONSES
                  : h->route == R_MESSAGES ? SV_API_MESSAGES : h->route == R_GENERATE ? SV_API_GENERATE
                  : h->route == R_SCORE ? SV_API_SCORE : SV_API_COMPLETIONS;
    pthread_mutex_lock(&s->met.mu);
    s->met.by_api[api]++;
    pthread_mutex_unlock(&s->met.mu);
    j->wake = wake_conn;
    j->wake_arg = h;
    j->wake_each = j->req.stream || j->req.n_stop > 0; /* stop strings are matched here, token by token */
    if (h->conn) {
        pthread_mutex_lock(&s->cmu);
        h->conn->job = j;
        h->conn->cancelled = false;
        pthread_mutex_unlock(&s->cmu);
    }
    atomic_fetch_add(&j->refs, 1); /* the engine's */
    jobs_add(s, j);
    sv_engine_submit(s->eng, j);
    /* while the engine works the client may rightly hear nothing for long (a
     * queue, a long prefill): libmicrohttpd's silence timeout is off for this
     * response, and the watchdog's stalled-client check takes its place */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    conn_busy(h, true);
    if (j->req.stream) return send_events(c, stream_reader, h);
    return await_body(s, c, h);
}

/* ---- libmicrohttpd callbacks ---- */

/* Is the key a client sent ours? In a time that depends on the sent key's length only: strcmp stops at the
 * first byte that differs, which tells a caller who measures answer times how much of a guess is right
 * (CWE-208, observable timing discrepancy). */
static bool key_equal(const char *sent, const char *key) {
    const size_t n = strlen(sent), k = strlen(key);
    volatile unsigned diff = n != k;
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)sent[i] ^ (unsigned char)key[i < k ? i : 0];
    return diff == 0;
}

static bool authorized(mr_server *s, struct MHD_Connection *c) {
    if (!s->api_key) return true;
    const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key"); /* Anthropic's clients */
    if (a && !strncasecmp(a, "Bearer", 6) && (a[6] == ' ' || a[6] == '\t')) { /* the scheme is case-insensitive */
        a += 6;
        while (*a == ' ' || *a == '\t') a++;
        if (key_equal(a, s->api_key)) return true;
    }
    return x && key_equal(x, s->api_key);
}

/* The request's framing headers (RFC 9112 6.3): Content-Length values that differ, and the last
 * Transfer-Encoding. libmicrohttpd reads the first Content-Length and waits for a body whose coding it
 * does not know; both must be refused at the head (a proxy in front may read such a request otherwise).
 * And a Content-Encoding other than identity (gzip, ...): no body is decompressed here (nor by vLLM's
 * or sglang's servers), so it is a 415 that says so, not a JSON error about its first byte. */
typedef struct {
    const char *cl, *te, *ce;
    bool cl_differ;
} framing;

static enum MHD_Result framing_of(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    framing *f = cls;
    if (!value) value = "";
    if (!strcasecmp(key, "Content-Length")) {
        if (f->cl && strcmp(f->cl, value)) f->cl_differ = true;
        f->cl = value;
    } else if (!strcasecmp(key, "Transfer-Encoding")) {
        f->te = value;
    } else if (!strcasecmp(key, "Content-Encoding") && *value && strcasecmp(value, "identity")) {
        f->ce = value;
    }
    return MHD_YES;
}

/* A CORS preflight (OPTIONS with Access-Control-Request-Method), answered for any route and without the key,
 * as browsers send it: 204 with what an allowed origin may send; 403 for another origin or method. */
static enum MHD_Result preflight(mr_server *s, struct MHD_Connection *c) {
    const char *m = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Method");
    const char *hdrs = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!cors_origin(c))
        return fail(s, c, 403, NULL, "CORS: the origin %.200s is not allowed here (--allowed-origins)", origin ? origin : "(none)");
    if (strcmp(m, "GET") && strcmp(m, "HEAD") && strcmp(m, "POST") && strcmp(m, "DELETE"))
        return fail(s, c, 403, NULL, "CORS: the method %.40s is not served (GET, POST, DELETE)", m);
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
    if (hdrs) MHD_add_response_header(r, "Access-Control-Allow-Headers", hdrs); /* Authorization, Content-Type, ... */
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    enum MHD_Result ok = queue(c, 204, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    mr_server *s = cls;
    sv_hreq *h = *con_cls;
    if (!h) { /* the head is complete */
        if (!(h = mr_calloc(1, sizeof *h))) return MHD_NO;
        h->s = s;
        h->mc = c;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        h->conn = ci ? ci->socket_context : NULL;
        if (h->conn) {
            pthread_mutex_lock(&s->cmu);
            h->conn->phase = 1;
            h->conn->since_ns = mr_now_ns();
            pthread_mutex_unlock(&s->cmu);
        }
        *con_cls = h;
        if (!strcmp(method, "OPTIONS") && MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Method"))
            return preflight(s, c);
        framing fr = {0};
        MHD_get_connection_values(c, MHD_HEADER_KIND, framing_of, &fr);
        if (fr.cl_differ) return fail(s, c, 400, NULL, "the request has Content-Length headers that differ");
        if (fr.te && strcasecmp(fr.te, "chunked"))
            return fail(s, c, 501, NULL, "Transfer-Encoding '%.60s' is not supported (chunked is)", fr.te);
        if (fr.ce) /* a compressed body would read as a JSON error that names no cause */
            return fail(s, c, 415, NULL, "Content-Encoding '%.60s' is not supported: send the body uncompressed", fr.ce);
        bool bad_method;
        const char *allow = NULL;
        h->route = route_of(url, method, &h->post, &bad_method, &allow);
        if (h->route == R_NONE) return fail(s, c, 404, NULL, "no route for %.16s %.200s", method, url);
        if (bad_method) {
            sv_error e = {.allow = allow};
            sv_fail(&e, 405, NULL, "%.200s takes %s, not %.16s", url, allow, method);
            return send_error(s, c, &e);
        }
        if (h->post) {
            const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
            if (cl) {
                char *end;
                errno = 0;
                unsigned long long n = strtoull(cl, &end, 10);
                if (!errno && end != cl && n > s->o.max_body_bytes)
                    return fail(s, c, 413, NULL, "the body is %llu bytes, above this server's limit of %zu (--max-body-bytes)",
                                n, s->o.max_body_bytes);
            }
        }
        return MHD_YES;
    }
    if (*upload_size) { /* a piece of the body */
        size_t n = *upload_size;
        *upload_size = 0;
        h->received += n;
        if (h->over) return MHD_YES; /* read and dropped, so that the client sees the 413 (the body
                                        deadline bounds how long) */
        if (h->body.len + n > s->o.max_body_bytes) {
            h->over = true;
            sv_buf_free(&h->body);
            return MHD_YES;
        }
        if (sv_buf_add(&h->body, upload, n)) return fail(s, c, 500, NULL, "out of memory");
        return MHD_YES;
    }
    /* the whole request is in */
    if (h->job) return await_body(s, c, h); /* resumed: the engine has published */
    if (h->op) return op_wait(s, c, h);      /* resumed: the control request is answered */
    if (h->over)
        return fail(s, c, 413, NULL, "the body is %zu bytes, above this server's limit of %zu (--max-body-bytes)",
                    h->received, s->o.max_body_bytes);
    h->t_arrive_ns = mr_now_ns();
    if (h->conn) {
        pthread_mutex_lock(&s->cmu);
        h->conn->phase = 2;
        h->conn->busy = false;
        h->conn->since_ns = mr_now_ns();
        pthread_mutex_unlock(&s->cmu);
    }
    if (!authorized(s, c) && h->route != R_HEALTH && h->route != R_PING && h->route != R_VERSION &&
        h->route != R_HEALTH_GENERATE) {
        sv_error e;
        sv_fail(&e, 401, NULL, "a valid \"Authorization: Bearer <key>\" (or \"x-api-key: <key>\") header is required");
        return send_error_on(s, c, h->route, &e);
    }
    switch (h->route) {
    case R_HEALTH: case R_PING: return do_health(s, c);
    case R_VERSION: {
        char b[96];
        snprintf(b, sizeof b, "{\"version\":\"%s\"}", mr_version());
        return send_json(c, 200, b);
    }
    case R_MODELS: case R_MODEL: return do_models(s, c, url, h->route);
    case R_METRICS: return do_metrics(s, c);
    case R_TOKENIZE: return do_tokenize(s, c, h, false);
    case R_DETOKENIZE: return do_tokenize(s, c, h, true);
    case R_COUNT_TOKENS: return do_count_tokens(s, c, h);
    case R_RESPONSE_ID: return do_response_id(s, c, h, url, method);
    case R_CONVERSATIONS: return do_conversations(s, c, h, url, method);
    case R_FLUSH: case R_RESET_PREFIX: return do_flush(s, c);
    case R_SERVER_INFO: return do_server_info(s, c);
    case R_MODEL_INFO: return do_model_info(s, c);
    case R_ABORT: return do_abort(s, c, h);
    case R_EXPERT_START: case R_EXPERT_STOP: case R_EXPERT_DUMP: return do_expert_record(s, c, h->route);
    case R_PROFILE_START: case R_PROFILE_STOP: return do_profile(s, c, h);
    case R_UPDATE_WEIGHTS: return do_update_weights(s, c, h);
    case R_PAUSE: case R_VPAUSE: return do_pause(s, c, h);
    case R_CONTINUE: case R_VRESUME: return do_continue(s, c, h);
    case R_IS_PAUSED: case R_SET_WVER: case R_GET_WVER: return do_weight_version(s, c, h);
    case R_SLEEP: case R_WAKE: case R_IS_SLEEPING: case R_RELEASE_MEM: case R_RESUME_MEM: return do_sleep(s, c, h);
    case R_HEALTH_GENERATE: /* sglang's deep health check: one token through the engine, as a completion */
        h->body.len = 0;
        if (sv_buf_lit(&h->body, "{\"prompt\":[0],\"max_tokens\":1,\"temperature\":0}"))
            return fail(s, c, 500, NULL, "out of memory");
        h->route = R_COMPLETIONS;
        return do_generate(s, c, h);
    default: return do_generate(s, c, h);
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    mr_server *s = cls;
    sv_hreq *h = *con_cls;
    if (!h) return;
    if (h->job) {
        pthread_mutex_lock(&h->job->mu); /* the engine no longer wakes this side */
        h->job->wake = NULL;
        h->job->parked = false;
        pthread_mutex_unlock(&h->job->mu);
        bool counted = false; /* the watchdog cancelled it and counted the disconnect */
        if (h->conn) {
            pthread_mutex_lock(&s->cmu);
            h->conn->job = NULL;
            counted = h->conn->cancelled;
            pthread_mutex_unlock(&s->cmu);
        }
        if (!counted && (!h->complete || toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)) {
            sv_job_cancel(h->job);
            pthread_mutex_lock(&s->met.mu);
            s->met.disconnects++;
            pthread_mutex_unlock(&s->met.mu);
        }
        sv_out_free(h->out);
        sv_job_release(h->job);
    }
    if (h->log) { /* a follower (never parked here: a suspended connection does not complete) */
        if (h->conn) {
            pthread_mutex_lock(&s->cmu);
            h->conn->log = NULL;
            pthread_mutex_unlock(&s->cmu);
        }
        pthread_mutex_lock(&h->log->mu);
        for (sv_hreq **pp = &h->log->parked; *pp; pp = &(*pp)->log_next)
            if (*pp == h) {
                *pp = h->log_next;
                break;
            }
        pthread_mutex_unlock(&h->log->mu);
        evlog_release(h->log);
    }
    if (h->job || h->log) MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)s->o.idle_timeout_s);
    if (h->conn) {
        pthread_mutex_lock(&s->cmu);
        h->conn->phase = 0;
        h->conn->busy = false;
        h->conn->since_ns = mr_now_ns();
        pthread_mutex_unlock(&s->cmu);
    }
    if (h->op) { /* answered (a parked one cannot complete); else its worker frees it */
        pthread_mutex_lock(&h->op->mu);
        const bool done = h->op->done;
        h->op->orphan = !done;
        pthread_mutex_unlock(&h->op->mu);
        if (done) op_free(h->op);
    }
    sv_buf_free(&h->body);
    sv_buf_free(&h->sse);
    mr_free(h);
    *con_cls = NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    mr_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        sv_conn *k = mr_calloc(1, sizeof *k);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!k || !ci) {
            mr_free(k);
            return;
        }
        k->fd = ci->connect_fd;
        k->since_ns = mr_now_ns();
        k->s = s;
        pthread_mutex_lock(&s->cmu);
        k->next = s->conns;
        if (s->conns) s->conns->prev = k;
        s->conns = k;
        pthread_mutex_unlock(&s->cmu);
        *socket_context = k;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context) {
        sv_conn *k = *socket_context;
        pthread_mutex_lock(&s->cmu);
        if (k->prev) k->prev->next = k->next;
        else s->conns = k->next;
        if (k->next) k->next->prev = k->prev;
        pthread_mutex_unlock(&s->cmu);
        mr_free(k);
        *socket_context = NULL;
    }
}

/* Cancels the jobs of the parked connections whose client has gone
 * (hang-up, reset), one poll over all of them, and closes such followers of
 * a background response's events (waking their logs: wake has room for cap);
 * called with s->cmu held, which it lets go of while it wakes. */
static void cancel_gone(mr_server *s, struct pollfd *pf, sv_conn **pk, sv_evlog **wake, int cap) {
    int n = 0, n_wake = 0;
    for (sv_conn *k = s->conns; k && n < cap; k = k->next)
        if (k->phase == 2 && k->busy && (k->job || k->log) && !k->cancelled && !k->killed) {
            pf[n] = (struct pollfd){.fd = k->fd, .events = POLLRDHUP};
            pk[n++] = k;
        }
    if (n == 0 || poll(pf, (nfds_t)n, 0) <= 0) return;
    for (int i = 0; i < n; i++)
        if ((pf[i].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) && !pk[i]->job) {
            /* a follower of a background response's events: it goes (the response runs on); resumed with
             * the log's others, it finds its socket shut and completes (k->log lives while set, under cmu) */
            MR_DEBUG("serve: a client left while it waited for a background response's events");
            atomic_store(&pk[i]->gone, true);
            shutdown(pk[i]->fd, SHUT_RDWR);
            pk[i]->killed = true;
            wake[n_wake++] = evlog_ref(pk[i]->log);
        } else if (pf[i].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) {
            MR_DEBUG("serve: a client left while its request waited for the engine: cancelled");
            sv_job_cancel(pk[i]->job); /* the job lives while k->job is set (cleared under cmu) */
            pk[i]->cancelled = true;
            pthread_mutex_lock(&s->met.mu);
            s->met.disconnects++;
            pthread_mutex_unlock(&s->met.mu);
        }
    if (!n_wake) return;
    pthread_mutex_unlock(&s->cmu); /* (libmicrohttpd's resume is not called under a lock of ours) */
    for (int i = 0; i < n_wake; i++) {
        evlog_wake(wake[i]);
        evlog_release(wake[i]);
    }
    pthread_mutex_lock(&s->cmu);
}

/* The head and body deadlines and the parked clients that left (see the file comment). */
static void *watchdog(void *arg) {
    mr_server *s = arg;
    const int cap = s->o.max_connections;
    struct pollfd *pf = mr_malloc((size_t)cap * sizeof *pf);
    sv_conn **pk = mr_malloc((size_t)cap * sizeof *pk);
    sv_evlog **wake = mr_malloc((size_t)cap * sizeof *wake);
    pthread_mutex_lock(&s->cmu);
    while (!s->wd_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&s->ccv, &s->cmu, &ts);
        if (pf && pk && wake) cancel_gone(s, pf, pk, wake, cap);
        uint64_t now = mr_now_ns();
        for (sv_conn *k = s->conns; k; k = k->next) {
            if (k->killed || (k->phase == 2 && k->busy)) continue;
            int secs = k->phase == 0 ? s->o.header_timeout_s : k->phase == 1 ? s->o.body_timeout_s : s->o.idle_timeout_s;
            if (now - k->since_ns > (uint64_t)secs * 1000000000ull && k->phase == 2) {
                /* a response libmicrohttpd writes from its own buffer (not a stream's reader, which
                 * refreshes since_ns) makes progress the reader never sees: a client that took bytes
                 * since the last look is not idle */
                struct tcp_info ti;
                socklen_t tl = sizeof ti;
                if (!getsockopt(k->fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) && ti.tcpi_bytes_acked != k->acked) {
                    k->acked = ti.tcpi_bytes_acked;
                    k->since_ns = now;
                    continue;
                }
            }
            if (now - k->since_ns > (uint64_t)secs * 1000000000ull) {
                MR_DEBUG("serve: closing a connection: %s in %d s",
                         k->phase == 0   ? "no complete request head"
                         : k->phase == 1 ? "no complete body"
                                         : "the client took none of its response",
                         secs);
                shutdown(k->fd, SHUT_RDWR);
                k->killed = true;
            }
        }
    }
    pthread_mutex_unlock(&s->cmu);
    mr_free(pf);
    mr_free(pk);
    mr_free(wake);
    return NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    if (mr_log_get_level() > MR_LOG_DEBUG) return;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    MR_DEBUG("libmicrohttpd: %s", line);
}

/* ---- the server's lifetime ---- */

static void read_generation_config(mr_server *s) {
    s->def_temperature = 1.0f; /* OpenAI's defaults, when the model says nothing */
    s->def_top_p = 1.0f;
    s->def_top_k = 0;
    s->def_min_p = 0.0f;
    s->def_repetition_penalty = 1.0f;
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", s->model_dir);
    json_error_t je;
    json_t *g = mr__json_load_file(path, 0, &je, NULL);
    if (!json_is_object(g)) {
        json_decref(g);
        return;
    }
    const json_t *v;
    if (json_is_number(v = json_object_get(g, "temperature")) && json_number_value(v) >= 0)
        s->def_temperature = (float)json_number_value(v);
    if (json_is_number(v = json_object_get(g, "top_p")) && json_number_value(v) > 0 && json_number_value(v) <= 1)
        s->def_top_p = (float)json_number_value(v);
    if (json_is_integer(v = json_object_get(g, "top_k")) && json_integer_value(v) >= 0)
        s->def_top_k = (int)json_integer_value(v);
    if (json_is_number(v = json_object_get(g, "min_p")) && json_number_value(v) >= 0 && json_number_value(v) <= 1)
        s->def_min_p = (float)json_number_value(v);
    if (json_is_number(v = json_object_get(g, "repetition_penalty")) && json_number_value(v) > 0 &&
        json_number_value(v) <= 10)
        s->def_repetition_penalty = (float)json_number_value(v);
    json_decref(g);
}

static char *base_name(const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    char *r = mr_malloc(n - b + 1);
    if (r) {
        memcpy(r, dir + b, n - b);
        r[n - b] = 0;
    }
    return r;
}

/* --allowed-origins: "*", "" (none), origins separated by commas, or a JSON list of them (vLLM's form); 0, or
 * -1 with the error set (a malformed list, or out of memory). */
static int parse_origins(mr_server *s, const char *spec) {
    if (!spec) spec = "*";
    json_t *list = spec[0] == '[' ? json_loads(spec, 0, NULL) : NULL;
    if (spec[0] == '[' && !json_is_array(list)) {
        mr_error_set(MR_EINVAL, "serve: --allowed-origins %.80s is not a JSON list of strings", spec);
        return -1;
    }
    const size_t n = list ? json_array_size(list) : strlen(spec) + 1; /* at most this many */
    s->origins = mr_calloc(n ? n : 1, sizeof *s->origins);
    if (!s->origins) return json_decref(list), mr_error_set(MR_ENOMEM, NULL), -1;
    for (size_t i = 0, at = 0; list ? i < n : spec[at] != 0; i++) {
        const char *o = list ? json_string_value(json_array_get(list, i)) : spec + at;
        size_t len = list ? (o ? strlen(o) : 0) : strcspn(o, ",");
        if (!list) at += len + (spec[at + len] == ',');
        while (!list && len && (o[0] == ' ' || o[len - 1] == ' ')) o += o[0] == ' ', len -= 1;
        if (list && !o) {
            json_decref(list);
            mr_error_set(MR_EINVAL, "serve: --allowed-origins: item %zu is not a string", i);
            return -1;
        }
        if (len == 1 && o[0] == '*') s->cors_any = true;
        else if (len) {
            char *d = mr_malloc(len + 1);
            if (!d) return json_decref(list), mr_error_set(MR_ENOMEM, NULL), -1;
            memcpy(d, o, len);
            d[len] = 0;
            s->origins[s->n_origins++] = d;
        }
    }
    json_decref(list);
    return 0;
}

mr_status mr_server_open(const mr_server_opts *o, mr_server **out) {
    *out = NULL;
    if (!o->model_dir) return mr_error_set(MR_EINVAL, "serve: the model folder is required");
    if (o->max_queued_requests < 0 || o->max_choices < 1 || o->max_body_bytes < 64 || o->header_timeout_s < 1 ||
        o->body_timeout_s < 1 || o->idle_timeout_s < 1 || o->max_connections < 1 || o->http_threads < 1 ||
        o->http_threads > 64 || o->port < 0 || o->port > 65535 ||
        o->max_prompt_tokens < 0 || o->max_completion_tokens < 0 || o->response_store_bytes > ((size_t)1 << 40))
        return mr_error_set(MR_EINVAL, "serve: a limit is out of range");
    mr_server *s = mr_calloc(1, sizeof *s);
    if (!s) return MR_ENOMEM;
    s->o = *o;
    s->model_dir = mr_strdup(o->model_dir);
    s->host = mr_strdup(o->host ? o->host : "127.0.0.1");
    s->name = o->served_model_name && *o->served_model_name ? mr_strdup(o->served_model_name) : base_name(o->model_dir);
    s->api_key = o->api_key && *o->api_key ? mr_strdup(o->api_key) : NULL;
    pthread_mutex_init(&s->cmu, NULL);
    pthread_cond_init(&s->ccv, NULL);
    pthread_mutex_init(&s->jmu, NULL);
    atomic_init(&s->state, ST_LOADING);
    sv_metrics_init(&s->met, s->name ? s->name : "");
    const bool cors_ok = !parse_origins(s, o->allowed_origins);
    s->store = sv_store_new(o->response_store_bytes, true);
    s->convs = sv_store_new(o->conversation_store_bytes, false);
    s->met.stored_cap = s->store ? (int64_t)o->response_store_bytes : 0;
    s->met.convs_cap = s->convs ? (int64_t)o->conversation_store_bytes : 0;
    pthread_mutex_init(&s->bgmu, NULL);
    pthread_mutex_init(&s->kmu, NULL);
    pthread_cond_init(&s->kcv, NULL);
    if (s->store && !pthread_create(&s->bgt, NULL, bg_main, s)) s->bg_started = true;
    if (!s->model_dir || !s->host || !s->name || (o->api_key && *o->api_key && !s->api_key) ||
        (o->response_store_bytes && !s->bg_started) || (o->conversation_store_bytes && !s->convs) || !cors_ok) {
        mr_server_close(s);
        return cors_ok ? mr_error_set(MR_ENOMEM, NULL) : MR_EINVAL;
    }
    s->o.model_dir = s->model_dir;
    s->o.host = s->host;
    s->o.served_model_name = s->name;
    s->o.api_key = s->api_key;
    read_generation_config(s);
    if (o->weight_version) { /* it goes into JSON answers */
        json_t *t = json_string(o->weight_version);
        const size_t n = strlen(o->weight_version);
        json_decref(t);
        if (!t || !n || n > SV_MAX_WEIGHT_VERSION) {
            mr_server_close(s);
            return mr_error_set(MR_EINVAL, "serve: the weight version must be 1 to %d bytes of UTF-8",
                                SV_MAX_WEIGHT_VERSION);
        }
    }
    mr_status st = sv_text_open(s->model_dir, o, &s->text); /* before any weight is read: fail fast */
    if (st) {
        mr_server_close(s);
        return st;
    }
    *out = s;
    return MR_OK;
}

mr_status mr_server_attach(mr_server *s, mr_engine *e) {
    if (s->eng) return mr_error_set(MR_ESTATE, "serve: an engine is attached already");
    const mr_engine_opts *eo = mr_engine_opts_of(e);
    s->m = mr_engine_model(e);
    s->vocab = mr_model_config_of(s->m)->vocab;
    s->context_length = eo->context_length;
    s->kv_blocks = eo->kv_blocks;
    s->max_running = eo->max_running_requests;
    s->eo = *eo;
    if (s->o.max_prompt_tokens <= 0 || s->o.max_prompt_tokens > s->context_length - 1)
        s->o.max_prompt_tokens = s->context_length - 1;
    if (s->o.max_completion_tokens <= 0 || s->o.max_completion_tokens > s->context_length - 1)
        s->o.max_completion_tokens = s->context_length - 1;
    mr_engine_stats_reset(e); /* /metrics counts the clients' work, not the self-check's */
    mr_status st = sv_engine_new(e, &s->o, &s->met, &s->eng);
    if (st) {
        mr_engine_free(e);
        return st;
    }
    if (!st) st = sv_text_check_vocab(s->text, s->vocab);
    if (!st) st = sv_engine_start(s->eng);
    return st;
}

mr_status mr_server_set_resolution(mr_server *s, const char *json) {
    char *t = json ? mr_strdup(json) : NULL;
    if (json && !t) return MR_ENOMEM;
    mr_free(s->resolution);
    s->resolution = t;
    return MR_OK;
}

mr_status mr_server_start(mr_server *s) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", s->o.port);
    int gai = getaddrinfo(s->host, port, &hints, &ai);
    if (gai) return mr_error_set(MR_EINVAL, "serve: cannot resolve --host %s: %s", s->host, gai_strerror(gai));
    /* the event loop (the file comment) on poll(), level-triggered; a pool of http_threads loops when
     * above 1. Not epoll: libmicrohttpd 0.9.75's epoll loop (edge-triggered) at times left the next
     * request on a kept-alive connection unread in the socket until the header deadline closed it, so
     * a client that sends requests back to back (libcurl, the openai client's pool) saw 10 s stalls and
     * re-sent requests the server had started (tests/cli/serve_keepalive.sh; bench/README.md). poll()
     * over the few hundred connections of --max-connections costs nothing measurable here. */
    unsigned flags = MHD_USE_POLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    errno = 0;
    /* a pool only for more than one thread (libmicrohttpd warns at a size of 0 or 1) */
    struct MHD_OptionItem pool[2] = {{MHD_OPTION_THREAD_POOL_SIZE, (intptr_t)s->o.http_threads, NULL},
                                     {MHD_OPTION_END, 0, NULL}};
    if (s->o.http_threads <= 1) pool[0].option = MHD_OPTION_END;
    s->d = MHD_start_daemon(flags, (uint16_t)s->o.port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_ARRAY, pool,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->o.idle_timeout_s, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)s->o.max_connections, MHD_OPTION_THREAD_STACK_SIZE, (size_t)512 * 1024,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                            MHD_OPTION_END);
    int err = errno;
    freeaddrinfo(ai);
    if (!s->d)
        return mr_error_set(MR_EIO, "serve: cannot listen on %s:%d%s%s", s->host, s->o.port, err ? ": " : "",
                            err ? strerror(err) : "");
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->o.port;
    if (pthread_create(&s->wd, NULL, watchdog, s)) return mr_error_set(MR_ESTATE, "serve: cannot start the watchdog");
    s->wd_started = true;
    return MR_OK;
}

int mr_server_port(const mr_server *s) { return s->port; }
const char *mr_server_failure(const mr_server *s) { return s && s->eng ? sv_engine_failure(s->eng) : NULL; }
const char *mr_server_model_name(const mr_server *s) { return s->name; }
mr_status mr_server_set_ready(mr_server *s) {
    if (!s->eng) return mr_error_set(MR_ESTATE, "serve: no model attached");
    atomic_store(&s->state, ST_READY);
    return MR_OK;
}

/* connections still answering a request: the event loop has not yet written all of its response
 * (a stream's last events, [DONE]) or the client has not yet taken it */
static int http_answering(mr_server *s) {
    int n = 0;
    pthread_mutex_lock(&s->cmu);
    for (sv_conn *k = s->conns; k; k = k->next) n += k->phase == 2 && !k->killed;
    pthread_mutex_unlock(&s->cmu);
    return n;
}

int mr_server_drain(mr_server *s, double timeout_s) {
    atomic_store(&s->state, ST_DRAINING);
    if (!s->eng) return 0;
    if (sv_engine_continue(s->eng)) /* the requests a pause held run to their end too */
        MR_INFO("serve: generation continued for the drain");
    uint64_t end = mr_now_ns() + (uint64_t)(timeout_s * 1e9);
    const struct timespec tick = {0, 10 * 1000 * 1000};
    while (sv_engine_inflight(s->eng) > 0 && mr_now_ns() < end) nanosleep(&tick, NULL);
    int left = (int)sv_engine_inflight(s->eng);
    if (left > 0) {
        sv_engine_abort_all(s->eng);
        for (int i = 0; i < 100 && sv_engine_inflight(s->eng) > 0; i++) nanosleep(&tick, NULL);
    }
    /* The engine has ended every request, but the event loop may not have sent all of what it
     * published: it runs on the same cores and can lag behind a fast engine by many tokens (a
     * drained stream once ended at 170 of its 200 tokens, without [DONE], on a loaded host).
     * Stopping now would cut those responses, so wait for them too: until the timeout, and at
     * least a second for what the cancellation above ended. */
    const uint64_t flush_end = (mr_now_ns() > end ? mr_now_ns() : end) + (left > 0 ? 1000000000ull : 0);
    while (http_answering(s) > 0 && mr_now_ns() < flush_end) nanosleep(&tick, NULL);
    return left;
}

void mr_server_close(mr_server *s) {
    if (!s) return;
    atomic_store(&s->stopping, true);
    /* the engine first: every job ends and every parked connection is resumed (libmicrohttpd
     * cannot stop with a connection parked for good); a request that races this ends at once */
    if (s->eng) sv_engine_stop(s->eng);
    if (s->upd_started) pthread_join(s->upd, NULL); /* a weight update: its load ends, its swap is refused */
    /* then the threads that resume connections (the watchdog wakes followers of a background response's
     * events, the driver too), so that none resumes one that libmicrohttpd's stop has freed */
    if (s->wd_started) {
        pthread_mutex_lock(&s->cmu);
        s->wd_stop = true;
        pthread_cond_signal(&s->ccv);
        pthread_mutex_unlock(&s->cmu);
        pthread_join(s->wd, NULL);
    }
    if (s->bg_started) { /* after the engine: every background job has ended */
        pthread_mutex_lock(&s->kmu);
        s->bg_stop = true;
        pthread_cond_signal(&s->kcv);
        pthread_mutex_unlock(&s->kmu);
        pthread_join(s->bgt, NULL);
    }
    pthread_mutex_lock(&s->bgmu); /* followers still parked on a background response's events: they end */
    for (sv_bg *b = s->bg; b; b = b->next)
        if (b->log) evlog_wake(b->log);
    pthread_mutex_unlock(&s->bgmu);
    if (s->d) MHD_stop_daemon(s->d); /* joins the event loop(s) */
    for (sv_bg *b = s->bg, *next; b; b = next) {
        next = b->next;
        sv_out_free(b->out);
        sv_job_release(b->j);
        evlog_release(b->log);
        mr_free(b);
    }
    pthread_mutex_destroy(&s->bgmu);
    pthread_mutex_destroy(&s->kmu);
    pthread_cond_destroy(&s->kcv);
    if (s->eng) sv_engine_free(s->eng);
    sv_text_close(s->text);
    sv_metrics_free(&s->met);
    sv_store_free(s->store);
    sv_store_free(s->convs);
    pthread_mutex_destroy(&s->cmu);
    pthread_cond_destroy(&s->ccv);
    pthread_mutex_destroy(&s->jmu); /* after the last job's release (the engine's and the background ones') */
    mr_free(s->name);
    mr_free(s->model_dir);
    mr_free(s->host);
    mr_free(s->api_key);
    mr_free(s->resolution);
    for (int i = 0; i < s->n_origins; i++) mr_free(s->origins[i]);
    mr_free(s->origins);
    mr_free(s);
}
