/* engine_internal.h — private to src/engine: the KV block pool with its
 * prefix table (kvpool.c), the request record, the engine (engine.c) and the
 * per-token sampling step (sample.c). */
#ifndef MR_ENGINE_INTERNAL_H
#define MR_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "moerun/engine.h"

/* ---- the block pool (kvpool.c) ----
 * Every block is in exactly one of three states:
 *   free     ref 0, not in the prefix table, on the free stack
 *   cached   ref 0, in the prefix table, on the LRU list (evictable: the
 *            least recently released is reused first)
 *   used     ref > 0 (in the prefix table or not): ref = the number of
 *            request block tables that list it.
 * A full block's key is a 128-bit hash of (its parent's key, its 16 token
 * ids); the table stores the parent key and the tokens too and a lookup
 * compares them, so a hit means the same tokens after the same prefix (two
 * different prefixes would need equal 128-bit parent keys). */
typedef struct {
    uint64_t a, b;
} mr__key;
#define MR__ROOT_KEY ((mr__key){0, 0})
/* The root of a salted request's blocks: a key from the salt's bytes (never MR__ROOT_KEY), so that its blocks'
 * keys and parents differ from every other salt's and the unsalted ones'. */
mr__key mr__salt_key(const char *salt, size_t n);

typedef struct {
    int64_t n;               /* blocks */
    int32_t *ref;            /* [n] */
    int32_t *free_stack;     /* [n] free blocks, top at n_free - 1 */
    int64_t n_free;
    int32_t *lru_prev, *lru_next; /* [n] the cached-unreferenced list, -1 ends */
    int32_t lru_head, lru_tail;   /* head: the next to evict */
    int64_t n_lru;
    uint8_t *cached;         /* [n] in the prefix table */
    mr__key *key, *parent;   /* [n] of cached blocks */
    int32_t *btok;           /* [n][MR_KV_BLOCK_TOKENS] tokens of cached blocks */
    int32_t *table;          /* [cap] open addressing (linear probing) of block ids, -1 empty */
    uint64_t cap_mask;       /* cap - 1, cap a power of two >= 2n */
    int64_t n_cached;
    int64_t n_used, peak_used;
    uint64_t evictions;
} mr__pool;

mr_status mr__pool_init(mr__pool *p, int64_t n_blocks);
void mr__pool_free(mr__pool *p);
/* Blocks a request could take now: free + cached-unreferenced. */
static inline int64_t mr__pool_available(const mr__pool *p) { return p->n_free + p->n_lru; }
/* Takes a block (ref 1): a free one, else evicts the least recently used
 * cached one. -1 when neither exists. */
int32_t mr__pool_take(mr__pool *p);
/* One more reference to a block (a prefix-cache hit). */
void mr__pool_ref(mr__pool *p, int32_t b);
/* One reference less; at 0 a cached block becomes evictable (LRU tail), another one free. */
void mr__pool_release(mr__pool *p, int32_t b);
/* The key of a full block after parent. */
mr__key mr__block_key(mr__key parent, const int32_t *tokens);
/* The cached block with these tokens after parent (key = mr__block_key), or -1. */
int32_t mr__pool_lookup(const mr__pool *p, mr__key key, mr__key parent, const int32_t *tokens);
/* Registers a used block's content; false when the key is already cached
 * (by another block: this one stays private). */
bool mr__pool_register(mr__pool *p, int32_t b, mr__key key, mr__key parent, const int32_t *tokens);
/* Empties the prefix table, every block free again (no block may be used); the blocks that were cached. */
int64_t mr__pool_flush(mr__pool *p);
/* MR_ESTATE when the pool's own structures disagree (free stack, LRU list,
 * table, counts); the references are checked by the engine. */
mr_status mr__pool_check(const mr__pool *p);

/* ---- requests ---- */
typedef enum { MR__RQ_FREE = 0, MR__RQ_WAITING = 1, MR__RQ_RUNNING = 2 } mr__rq_state;

typedef struct {
    mr_req_id id;
    mr__rq_state state;
    void *user;
    const atomic_int *cancel;
    bool cancel_asked;          /* mr_engine_cancel */
    /* one allocation: tok [cap], bt [max_blocks], forced [n_forced], bias [n_bias], allowed [n_allowed],
     * bad [sum of bad_len], bad_len [n_bad], lp_ids [n_lp_ids] */
    void *mem;
    int32_t *tok;               /* prompt, then generated tokens */
    int64_t n_prompt, n_tok, cap;
    int64_t max_tokens;         /* resolved, >= 1 */
    int64_t n_computed;         /* positions 0 .. n_computed - 1 have their K, V in the blocks */
    int32_t *bt;                /* block table [max_blocks] */
    int32_t n_blocks, max_blocks;
    int32_t n_hashed;           /* leading full blocks already keyed (registered or duplicates) */
    mr__key last_key;           /* key of block n_hashed - 1 (root when 0) */
    int64_t prio;               /* priority scheduling: lower goes first */
    bool routes;                /* events carry the routed experts (mr_request_params.routes) */
    uint64_t seq;               /* arrival order (then the tie-break) */
    mr__key root;               /* the parent of block 0: MR__ROOT_KEY, or its cache salt's (mr__salt_key) */
    mr_sampling sp;
    uint64_t rng;
    int32_t stop_ids[MR_ENGINE_MAX_STOP_IDS];
    int n_stop;
    bool ignore_eos, logprobs, want_logits;
    int64_t min_tokens;         /* stop and EOS ids masked while fewer are generated */
    const mr_logit_bias *bias;  /* inside mem */
    int n_bias;
    const int32_t *allowed;     /* inside mem; n_allowed 0 = every id */
    int64_t n_allowed;
    const int32_t *bad, *bad_len; /* inside mem */
    int n_bad;
    mr_token_constraint con;    /* .mask NULL: none */
    int32_t con_row;            /* this step's row of the engine's con_bits (set before pick), -1: none */
    bool plp;                   /* prompt_logprobs */
    int64_t plp_next;           /* the next prompt position whose log-probability is owed (from 1) */
    int top_logprobs;
    const int32_t *lp_ids;      /* inside mem: the ids whose log-probabilities every reported position gives */
    int n_lp_ids;
    const int32_t *forced;      /* inside mem */
    int64_t n_forced;
    int64_t n_cached;           /* prompt tokens hit at the first schedule */
    uint64_t sched_ns;          /* when first scheduled (mr_now_ns) */
    bool scheduled_once;
    mr_finish_reason fin;       /* set by complete; the request leaves the running list at the end of it */
} mr__req;

/* Rows of prompt log-probabilities through the lm_head at a time: a vocabulary of 200k takes
 * 51 MB of logits for 64 rows, and 64 rows keep the lm_head's weights reused 64 times a read. */
#define MR__PLP_CHUNK 64

/* What the scheduler put in this step for one request. */
typedef struct {
    int32_t slot;               /* request table index */
    int64_t n;                  /* tokens of this step */
    bool sample;                /* the chunk ends at the last known token: sample after it */
    int32_t plp_row, plp_n;     /* prompt log-probabilities: rows plp_row .. of the batch's extra rows */
    int64_t plp_q0;             /* the position of the first of those rows (its token's logprob is at q0 + 1) */
    int64_t idlp_off;           /* logprob ids: the entries of e->idlp from here, plp_n rows then the sampled
                                   token's (when sample), n_lp_ids each */
} mr__sched;

/* ---- threads per step (threads.c) ----
 * A step's parallel regions wait for their slowest thread: when another
 * process or the server's own threads take a core, the step on all threads
 * can be several times slower than on one (measured: tiny-kjv decode 5000
 * tok/s on 2 threads alone, 1640 beside one busy process, 3280 on 1 thread).
 * Per size class of steps (1, 2-3, 4-7, ... tokens) the picker runs one
 * count (all threads at first) and keeps a moving mean of its forward time
 * per token (over about 16 steps: beside other work a step on all threads
 * is mostly fast and now and then a time slice late, and the mean is what
 * throughput pays); now and then it tries the other count on MR__THR_TRY_STEPS
 * steps in a row (one step is too noisy beside other work: all threads are
 * then sometimes fast, often a time slice late) and folds their mean time
 * over that mean into a ratio (one thread / all; a try at twice or half
 * the ratio replaces it: the host's load changed). It runs one
 * thread while the ratio is below MR__THR_TO_ONE, all again once it is above
 * MR__THR_TO_ALL (the gap keeps noise from flipping it): a ratio of
 * neighbouring steps, because a step's cost drifts with the context it
 * attends to. A try comes once MR__THR_BUDGET times its expected time has
 * passed since the last (an eighth of that for the first after a switch);
 * the first try of a class comes after one try's time (its one-thread time
 * guessed as all threads' x threads). Tries cost at most about
 * 1 / MR__THR_BUDGET of the time, each at most 16 steps or 2 x
 * MR__THR_LONG_NS, and a change of the host's load is seen within about
 * MR__THR_BUDGET slow steps. The first step on each count is left out
 * (thread start, page faults). A class whose step on one thread measured
 * MR__THR_LONG_NS or more (or is guessed at 4 x that) is not tried on one
 * thread. */
#define MR__THR_CLASSES 24
#define MR__THR_BUDGET 64.0
#define MR__THR_TO_ONE 0.9
#define MR__THR_TO_ALL 1.1
#define MR__THR_TRY_STEPS 16
#define MR__THR_LONG_NS 4e6
typedef struct {
    int cur;                    /* the count run now: 1 all, 0 one */
    double cur_ns;              /* its moving mean, ns per token */
    uint64_t n_cur;             /* steps measured since it became the count */
    double ratio;               /* one / all over the tries (0: none yet) */
    bool warm[2];               /* the first step on each count was seen */
    uint64_t last_try_ns;       /* when the other count was last tried (or the class first seen) */
    int try_left;               /* steps of the running try still to run */
    double try_sum;             /* its ns per token so far */
    int try_n;
    bool switched;              /* the count changed at the last try */
} mr__thr_class;
typedef struct {
    int all;                    /* threads of the engine's creator (the resolved threads) */
    bool fixed;                 /* every step on all */
    mr__thr_class c[MR__THR_CLASSES];
} mr__thr;
/* Starts the picker over: all threads, fixed or adaptive. */
void mr__thr_init(mr__thr *t, int all, bool fixed);
/* 0 (one thread) or 1 (all) for a step of tok tokens at time now_ns. */
int mr__thr_pick(mr__thr *t, int64_t tok, uint64_t now_ns);
/* The forward of that step (pick k) took ns. */
void mr__thr_seen(mr__thr *t, int64_t tok, int k, uint64_t ns);

/* One thread's sampling scratch: the adjusted row, the sampler's weights and
 * indices, and counts that are zero between uses. */
typedef struct {
    float *work, *prob;         /* [vocab] */
    int32_t *idx, *count;       /* [vocab] */
} mr__scratch;
/* Threads that sample a step's rows at most (each holds a scratch of 16 bytes per id), and the
 * ids a step's rows hold together from which they go over the threads. */
#define MR__SAMPLE_THREADS 16
#define MR__SAMPLE_PAR_IDS 65536
/* One scheduled row's sampled token, with its log-probabilities, or the error that ends it. */
typedef struct {
    int32_t tok;
    float logprob;
    int n_top;
    mr_status st;
    char err[512];              /* as long as the step's own (mr_engine.err) */
} mr__pick;

struct mr_engine {
    mr_engine_opts o;
    mr_engine_hold hold;        /* mr_engine_set_hold */
    mr__thr thr;                /* threads per step */
    mr_model *m;
    int64_t vocab;
    mr__pool pool;
    /* request table and queues (indices into req) */
    mr__req *req;               /* [max_req] */
    int max_req;
    int32_t *free_slots;        /* [max_req] stack */
    int n_free_slots;
    uint32_t gen;               /* id generation counter */
    uint64_t arrivals;          /* requests added: each one's mr__req.seq */
    int32_t *waiting;           /* ring [max_req]: front at wait_head */
    int wait_head, n_waiting;
    int32_t *running;           /* [max_running] in scheduling order (oldest first) */
    int n_running;
    /* the step being built */
    mr__sched *sched;           /* [max_running] */
    int n_sched;
    int32_t *b_tokens;          /* [max_batch_tokens] */
    int64_t *b_ntok, *b_start;  /* [max_running] */
    int32_t *b_btoff;           /* [max_running + 1] */
    int32_t *b_blocks;          /* [max_running * blocks per context] */
    uint8_t *b_logits;          /* [max_running] */
    mr_kv_batch batch;
    bool scheduled;             /* schedule done, complete pending */
    float *logits;              /* [max_running][vocab] */
    /* sampling: a scratch per thread that samples, and each scheduled row's result */
    mr__scratch *scr;           /* [n_scr] */
    int n_scr;
    mr__pick *pick;             /* [max_running] by scheduled index */
    int32_t *pick_i;            /* [max_running] the scheduled indices that sample this step */
    /* structured outputs: the constraint masks of a step's sampling rows, computed over the threads
     * before the sampling (allocated with the first request that has a constraint) */
    uint32_t *con_bits;         /* [max_running_requests][(vocab + 31) / 32] */
    int64_t *con_cnt;           /* [max_running_requests] ids each mask allows */
    int32_t *con_slot;          /* [max_running_requests] the request of each */
    /* step output */
    mr_engine_event *ev;        /* [max_req + max_running] */
    int n_ev, cap_ev;
    mr_token_logprob *top;      /* [max_running][max_top_logprobs] */
    /* prompt log-probabilities, allocated with the first request that asks: the step's extra
     * rows (at most max_batch_tokens), their logits MR__PLP_CHUNK rows at a time, the results */
    int64_t *plp_tok;           /* [max_batch_tokens] token indices into the batch */
    int32_t *plp_want;          /* [max_batch_tokens] the prompt token each row scores */
    uint8_t *plp_bad;           /* [max_batch_tokens] the row held a non-finite logit */
    int *plp_ntop;              /* [max_batch_tokens] alternatives found */
    int32_t *plp_rank;          /* [max_batch_tokens] the prompt token's rank (1 + logits above or equal, itself aside) */
    mr_token_logprob *plp_out;  /* [max_batch_tokens][1 + max_top_logprobs] */
    float *plp_logits;          /* [MR__PLP_CHUNK][vocab] */
    int n_plp;                  /* extra rows in this step */
    /* logprob ids: each scheduled request's rows of its ids' log-probabilities (mr__sched.idlp_off), grown
     * as a step needs (kept) */
    float *idlp;                /* [cap_idlp] */
    int64_t n_idlp, cap_idlp;
    /* routed experts: the step's capture [max_batch_tokens][n_layers][top_k], with the first request that asks */
    int32_t *routes_buf;
    bool step_routes;           /* a request of this step asks */
    char err[512];              /* the error of this step's failed forward */
    int32_t *chk;               /* [kv_blocks] scratch of mr_engine_check */
    /* expert parallelism (engine_ep.c): this rank of ep_size; the step on the wire */
    int ep_rank, ep_size;
    int64_t ep_step;
    int64_t ep_max_blocks;      /* block-table entries one batch may hold */
    char *ep_buf;               /* [ep_cap] a step's payload */
    size_t ep_cap;
    bool ep_stopped;
    void *ep_votes;             /* [ep_size] every rank's verdict on a weight load */
    /* a follower's weight update under way (mr_engine_ep_load): its load thread, the staged weights and
     * the load's verdict, read after the join */
    pthread_t ep_loader;
    bool ep_loading;            /* ep_loader runs */
    char *ep_dir;               /* the checkpoint of the load under way (NULL: none) */
    mr_model *ep_staged;
    mr_status ep_load_st;
    char ep_load_msg[400];
    mr_engine_step_out out;
    mr_engine_stats st;
    uint64_t t_sched_end;       /* when schedule returned (the forward's start) */
};

/* ---- sampling one token of a request (sample.c) ---- */
/* Chooses request r's next token from its raw logits row [vocab]: forced,
 * else penalties then sampling (mr_sampling order); fills *logprob and top
 * (n_top entries) when asked. MR_EINPUT when the row holds a non-finite value.
 * Touches only r (its rng), the scratch sc and the outputs, and reads the step's
 * constraint masks: requests run side by side on their own scratch. The
 * constraint's accept is the caller's, on the engine thread. */
mr_status mr__engine_pick(const mr_engine *e, mr__scratch *sc, mr__req *r, const float *logits, int32_t *tok,
                          float *logprob, mr_token_logprob *top, int *n_top, float *id_lp);
/* The log-probability of token tok in a raw logits row [vocab], the n most likely tokens into top
 * (returns how many), and those of ids [n_ids] into id_lp. MR_EINPUT when the row holds a non-finite value. */
mr_status mr__engine_logprob(const mr_engine *e, const float *logits, int32_t tok, int n, float *logprob,
                             mr_token_logprob *top, int *n_top, const int32_t *ids, int n_ids, float *id_lp);
/* Checks sampling parameters (MR_EINVAL with the field). */
mr_status mr__sampling_check(const mr_sampling *s);

/* ---- expert parallelism (engine_ep.c) ---- */
/* Reads the model's rank and size; with several ranks, the payload buffer. */
mr_status mr__engine_ep_init(mr_engine *e);
void mr__engine_ep_free(mr_engine *e);
/* Leader: broadcasts the step's batch (an idle step when it is empty). */
mr_status mr__engine_ep_send(mr_engine *e, const mr_kv_batch *b);
/* Leader: the followers drop their KV pools' pages (mr_engine_release_kv). */
mr_status mr__engine_ep_release(mr_engine *e);

#endif
