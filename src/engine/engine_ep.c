/* engine_ep.c — the engine in lockstep over expert-parallel ranks
 * (attention replicated: every rank runs the same batch; moerun/engine.h
 * "expert parallelism"). Rank 0 (the leader) owns the requests: every
 * mr_engine_step broadcasts the step before running it, and the other ranks
 * (followers, mr_engine_follow) run each step they receive through their own
 * model, whose paged KV pool then holds the same blocks as the leader's. A
 * follower computes no logits (nobody samples there).
 *
 * One step on the wire, two broadcasts from rank 0:
 *   header  int64 [8]: magic, kind (run / idle / stop), step number, n_seq,
 *           n_tokens, n_logits, block-table entries, payload bytes
 *   payload (run only): tokens int32 [n_tokens] | n_tok int64 [n_seq] |
 *           start int64 [n_seq] | bt_off int32 [n_seq + 1] |
 *           block ids int32 [entries] | want_logits uint8 [n_seq]
 * A follower checks the header against its own limits (the engine options
 * every rank agreed on) before it receives the payload. An idle step is the
 * leader's heartbeat: a server calls mr_engine_step at least once a second
 * while it has no work, so that the followers' deadline means "the leader
 * stopped answering", never "nobody sent a request".
 *
 * New weights (mr_engine_ep_load, mr_engine_ep_commit), two more kinds:
 *   load    payload: the checkpoint folder's path (bytes = its length). Each
 *           follower starts loading its share beside its running weights on a
 *           thread of its own, and follows the next steps meanwhile.
 *   commit  payload: the deadline of the verdicts (double, seconds). Each
 *           follower waits for its load, then every rank's verdict (status
 *           int32, message) goes to every rank (allgather, that deadline):
 *           all loaded, and every rank swaps at this same point of the step
 *           sequence; else every rank drops what it loaded.
 * And the KV pool's memory given back (mr_engine_release_kv), a sixth kind:
 *   release no payload. Each follower drops its pool's pages, as the leader
 *   does (no block of the pool is in use then: the leader's engine checked). */
#include <malloc.h>
#include <stdio.h>
#include <string.h>

#include "engine/engine_internal.h"

#define EP_MAGIC 0x6d72457053746570ll /* "mrEpStep" */
enum { EP_RUN = 1, EP_IDLE = 2, EP_STOP = 3, EP_LOAD = 4, EP_COMMIT = 5, EP_RELEASE = 6 };
#define EP_MAX_DIR 4096 /* bytes of a checkpoint path on the wire */

/* One rank's verdict on a weight load. */
typedef struct {
    int32_t st;
    char msg[252];
} ep_verdict;

typedef struct {
    int64_t magic, kind, step, n_seq, n_tokens, n_logits, n_blocks, bytes;
} ep_header;

/* Payload bytes of a batch (offsets of its arrays in *off[6]). */
static size_t payload_layout(int64_t n_seq, int64_t n_tokens, int64_t n_blocks, size_t off[6]) {
    size_t o = 0;
    off[0] = o, o += (size_t)n_tokens * 4;
    o = (o + 7) & ~(size_t)7;
    off[1] = o, o += (size_t)n_seq * 8;
    off[2] = o, o += (size_t)n_seq * 8;
    off[3] = o, o += (size_t)(n_seq + 1) * 4;
    off[4] = o, o += (size_t)n_blocks * 4;
    off[5] = o, o += (size_t)n_seq;
    return o;
}

mr_status mr__engine_ep_init(mr_engine *e) {
    int rank = 0, size = 1;
    mr_model_ep(e->m, &rank, &size);
    e->ep_rank = rank;
    e->ep_size = size;
    if (size <= 1) return MR_OK;
    size_t off[6];
    e->ep_cap = payload_layout(e->o.max_running_requests, e->o.max_batch_tokens, e->ep_max_blocks, off);
    e->ep_buf = mr_malloc(e->ep_cap ? e->ep_cap : 8);
    e->ep_votes = mr_calloc((size_t)size, sizeof(ep_verdict));
    return e->ep_buf && e->ep_votes ? MR_OK : mr_error_set(MR_ENOMEM, NULL);
}

/* A follower's weight load (its own thread; the follow loop goes on). */
static void *load_main(void *arg) {
    mr_engine *e = arg;
    const uint64_t t0 = mr_now_ns();
    e->ep_load_st = mr_model_weights_load(e->m, e->ep_dir, &e->ep_staged);
    if (e->ep_load_st) snprintf(e->ep_load_msg, sizeof e->ep_load_msg, "%s", mr_error_last());
    else MR_INFO("rank %d: new weights from %s loaded in %.2f s", e->ep_rank, e->ep_dir,
                 (double)(mr_now_ns() - t0) * 1e-9);
    return NULL;
}

/* Waits for a follower's load under way, then drops its weights (the old ones after a swap). */
static void load_drop(mr_engine *e) {
    if (e->ep_loading) pthread_join(e->ep_loader, NULL);
    e->ep_loading = false;
    mr_model_close(e->ep_staged);
    e->ep_staged = NULL;
    mr_free(e->ep_dir);
    e->ep_dir = NULL;
    e->ep_load_st = MR_OK;
    e->ep_load_msg[0] = 0;
#ifdef __GLIBC__
    malloc_trim(0); /* their pages back to the system now (glibc keeps freed heap memory otherwise) */
#endif
}

void mr__engine_ep_free(mr_engine *e) {
    load_drop(e); /* a load the leader never committed (it stopped, or the group broke) */
    mr_free(e->ep_votes);
    mr_free(e->ep_buf);
}

static mr_status send_header(mr_engine *e, int kind, const mr_kv_batch *b, size_t bytes) {
    ep_header h = {.magic = EP_MAGIC, .kind = kind, .step = ++e->ep_step};
    if (b) {
        h.n_seq = b->n_seq;
        h.n_tokens = b->n_tokens;
        h.n_logits = b->n_logits;
        h.n_blocks = b->n_seq > 0 ? b->bt_off[b->n_seq] : 0;
    }
    h.bytes = (int64_t)bytes;
    return mr_ep_bcast(&h, sizeof h, 0, 0);
}

mr_status mr__engine_ep_send(mr_engine *e, const mr_kv_batch *b) {
    e->ep_stopped = false; /* a new session of the followers (after a stop, they follow again) */
    if (b->n_seq == 0) return send_header(e, EP_IDLE, NULL, 0);
    size_t off[6];
    const int64_t nb = b->bt_off[b->n_seq];
    const size_t bytes = payload_layout(b->n_seq, b->n_tokens, nb, off);
    MR_ASSERT(bytes <= e->ep_cap); /* the scheduler keeps to the options the buffer was sized for */
    char *p = e->ep_buf;
    memcpy(p + off[0], b->tokens, (size_t)b->n_tokens * 4);
    memcpy(p + off[1], b->n_tok, (size_t)b->n_seq * 8);
    memcpy(p + off[2], b->start, (size_t)b->n_seq * 8);
    memcpy(p + off[3], b->bt_off, (size_t)(b->n_seq + 1) * 4);
    memcpy(p + off[4], b->block_ids, (size_t)nb * 4);
    memcpy(p + off[5], b->want_logits, (size_t)b->n_seq);
    mr_status st = send_header(e, EP_RUN, b, bytes);
    if (!st) st = mr_ep_bcast(p, bytes, 0, 0);
    return st;
}

mr_status mr_engine_ep_stop(mr_engine *e) {
    if (!e || e->ep_size <= 1 || e->ep_rank != 0 || e->ep_stopped) return MR_OK;
    e->ep_stopped = true;
    return send_header(e, EP_STOP, NULL, 0);
}

mr_status mr__engine_ep_release(mr_engine *e) { return send_header(e, EP_RELEASE, NULL, 0); }

mr_status mr_engine_ep_load(mr_engine *e, const char *dir) {
    if (!e || e->ep_size <= 1) return MR_OK;
    if (e->ep_rank != 0) return mr_error_set(MR_EINVAL, "mr_engine_ep_load: the leader (rank 0) sends the load");
    const size_t n = dir ? strlen(dir) : 0;
    if (n < 1 || n > EP_MAX_DIR)
        return mr_error_set(MR_EINVAL, "a checkpoint path of 1 to %d bytes, not %zu", EP_MAX_DIR, n);
    char path[EP_MAX_DIR];
    memcpy(path, dir, n);
    mr_status st = send_header(e, EP_LOAD, NULL, n);
    return st ? st : mr_ep_bcast(path, n, 0, 0);
}

/* Every rank's verdict to every rank (mine in; e->ep_votes out); the first failed rank, -1 when none. */
static mr_status votes(mr_engine *e, const ep_verdict *mine, double timeout_s, int *failed) {
    *failed = -1;
    mr_status st = mr_ep_allgather(mine, e->ep_votes, sizeof *mine, timeout_s);
    if (st) return st;
    const ep_verdict *v = e->ep_votes;
    for (int r = 0; r < e->ep_size && *failed < 0; r++)
        if (v[r].st) *failed = r;
    return MR_OK;
}

mr_status mr_engine_ep_commit(mr_engine *e, mr_status mine, const char *why, double timeout_s) {
    if (!e || e->ep_size <= 1) return MR_OK;
    if (e->ep_rank != 0) return mr_error_set(MR_EINVAL, "mr_engine_ep_commit: the leader (rank 0) commits");
    ep_verdict v = {.st = (int32_t)mine};
    snprintf(v.msg, sizeof v.msg, "%.*s", (int)sizeof v.msg - 1, mine && why ? why : "");
    int failed;
    double t = timeout_s > 0 ? timeout_s : 0; /* every rank waits for the verdicts as long */
    mr_status st = send_header(e, EP_COMMIT, NULL, sizeof t);
    if (!st) st = mr_ep_bcast(&t, sizeof t, 0, 0);
    if (!st) st = votes(e, &v, t, &failed);
    if (st) return st;
    if (failed < 0) return MR_OK;
    const ep_verdict *f = (const ep_verdict *)e->ep_votes + failed;
    return mr_error_set((mr_status)f->st, "rank %d of %d: %.*s", failed, e->ep_size, (int)sizeof f->msg, f->msg);
}

/* A follower's part of a commit: the deadline, its own verdict once its load has ended, then every rank's
 * (an explicit deadline: the wait for a load is not a step, and leaves the automatic step deadline as it
 * was); all loaded: the swap. */
static mr_status follow_commit(mr_engine *e) {
    double t;
    mr_status st = mr_ep_bcast(&t, sizeof t, 0, 0);
    if (st) return st;
    if (!(t >= 0 && t <= 1e7)) return mr_ep_fail("the leader's weight commit has a deadline of %g s", t);
    if (e->ep_loading) pthread_join(e->ep_loader, NULL);
    e->ep_loading = false;
    const bool none = !e->ep_dir && !e->ep_load_st; /* a load that could not start has its own reason */
    ep_verdict v = {.st = none ? (int32_t)MR_ESTATE : (int32_t)e->ep_load_st};
    snprintf(v.msg, sizeof v.msg, "%.*s", (int)sizeof v.msg - 1,
             none ? "no weight load was under way on this rank" : e->ep_load_msg);
    int failed;
    if ((st = votes(e, &v, t, &failed))) return st;
    if (failed < 0) {
        mr_model_weights_swap(e->m, e->ep_staged);
        MR_INFO("rank %d: new weights from %s in service", e->ep_rank, e->ep_dir);
    } else if (e->ep_dir) {
        MR_WARN("rank %d: the weights from %s were not taken (rank %d: %.*s)", e->ep_rank, e->ep_dir, failed,
                (int)sizeof v.msg, ((const ep_verdict *)e->ep_votes)[failed].msg);
    }
    load_drop(e);
    return MR_OK;
}

/* A follower's part of a load: the path, then the load on its thread. */
static mr_status follow_load(mr_engine *e, int64_t bytes) {
    char path[EP_MAX_DIR + 1];
    mr_status st = mr_ep_bcast(path, (size_t)bytes, 0, 0);
    if (st) return st;
    path[bytes] = 0;
    if (e->ep_dir || e->ep_load_st) return mr_ep_fail("the leader sent a weight load while another was under way here");
    e->ep_load_st = MR_OK;
    e->ep_load_msg[0] = 0;
    if (!(e->ep_dir = mr_strdup(path))) {
        e->ep_load_st = MR_ENOMEM;
        snprintf(e->ep_load_msg, sizeof e->ep_load_msg, "out of memory");
    } else if (pthread_create(&e->ep_loader, NULL, load_main, e)) {
        e->ep_load_st = MR_ENOMEM;
        snprintf(e->ep_load_msg, sizeof e->ep_load_msg, "cannot start a thread for the load");
    } else {
        e->ep_loading = true;
    }
    return MR_OK;
}

static mr_status bad_step(const mr_engine *e, const char *what, long long got, long long limit) {
    (void)e;
    return mr_ep_fail("the leader's step %s is %lld, this rank's limit %lld: the ranks' engine options differ", what,
                      got, limit);
}

mr_status mr_engine_follow(mr_engine *e) {
    if (!e || e->ep_size <= 1 || e->ep_rank == 0)
        return mr_error_set(MR_EINVAL, "mr_engine_follow: only the ranks after 0 of an expert-parallel run follow");
    for (;;) { /* the steps are numbered over the engine's life, on the leader and here */
        ep_header h;
        mr_status st = mr_ep_bcast(&h, sizeof h, 0, 0);
        if (st) return st;
        if (h.magic != EP_MAGIC || h.step != ++e->ep_step || h.kind < EP_RUN || h.kind > EP_RELEASE)
            return mr_ep_fail("the leader's step header is malformed (step %lld, this rank expected %lld)",
                              (long long)h.step, (long long)e->ep_step);
        if (h.kind == EP_STOP) return MR_OK;
        if (h.kind == EP_IDLE) continue;
        if (h.kind == EP_LOAD) {
            if (h.bytes < 1 || h.bytes > EP_MAX_DIR) return bad_step(e, "checkpoint path length", h.bytes, EP_MAX_DIR);
            if ((st = follow_load(e, h.bytes))) return st;
            continue;
        }
        if (h.kind == EP_RELEASE) {
            const size_t b = mr_model_kv_release(e->m);
            MR_INFO("rank %d: the KV pool's %.1f MiB dropped", e->ep_rank, (double)b / 1048576.0);
            continue;
        }
        if (h.kind == EP_COMMIT) {
            if (h.bytes != (int64_t)sizeof(double)) return bad_step(e, "commit payload", h.bytes, sizeof(double));
            if ((st = follow_commit(e))) return st;
            continue;
        }
        if (h.n_seq < 1 || h.n_seq > e->o.max_running_requests)
            return bad_step(e, "sequence count", h.n_seq, e->o.max_running_requests);
        if (h.n_tokens < 1 || h.n_tokens > e->o.max_batch_tokens)
            return bad_step(e, "token count", h.n_tokens, e->o.max_batch_tokens);
        if (h.n_blocks < 0 || h.n_blocks > e->ep_max_blocks)
            return bad_step(e, "block-table size", h.n_blocks, e->ep_max_blocks);
        size_t off[6];
        const size_t bytes = payload_layout(h.n_seq, h.n_tokens, h.n_blocks, off);
        if ((int64_t)bytes != h.bytes) return bad_step(e, "payload size", h.bytes, (long long)bytes);
        if ((st = mr_ep_bcast(e->ep_buf, bytes, 0, 0))) return st;
        const char *p = e->ep_buf;
        memcpy(e->b_tokens, p + off[0], (size_t)h.n_tokens * 4);
        memcpy(e->b_ntok, p + off[1], (size_t)h.n_seq * 8);
        memcpy(e->b_start, p + off[2], (size_t)h.n_seq * 8);
        memcpy(e->b_btoff, p + off[3], (size_t)(h.n_seq + 1) * 4);
        memcpy(e->b_blocks, p + off[4], (size_t)h.n_blocks * 4);
        memset(e->b_logits, 0, (size_t)h.n_seq); /* nobody samples here: no lm_head */
        mr_kv_batch b = {.n_seq = (int)h.n_seq, .n_tokens = h.n_tokens, .tokens = e->b_tokens, .n_tok = e->b_ntok,
                         .start = e->b_start, .bt_off = e->b_btoff, .block_ids = e->b_blocks,
                         .want_logits = e->b_logits, .n_logits = 0};
        const uint64_t t0 = mr_now_ns();
        st = mr_model_forward_kv(e->m, &b, e->logits);
        e->st.forward_ns += mr_now_ns() - t0;
        e->st.steps++;
        e->st.computed_tokens += (uint64_t)h.n_tokens;
        /* a refused batch is refused on the leader too (the same checks on the same batch); a broken
         * group is the end */
        if (st && mr_ep_broken()) return st;
    }
}
