/* cli_ep.c — see cli_ep.h. */
#include "cli_ep.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "moerun/model.h"

/* How long the ranks wait for each other around the steps that may take a
 * rank much longer than the others: starting up and resolving (seconds),
 * and loading a checkpoint from disk. */
#define AGREE_TIMEOUT_S 300.0
#define LOAD_TIMEOUT_S 1800.0

static const char *a2a_choice(int argc, char **argv) {
    const char *v = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--moe-a2a-backend") && i + 1 < argc) v = argv[i + 1];
        else if (!strncmp(argv[i], "--moe-a2a-backend=", 18)) v = argv[i] + 18;
    }
    if (!v) v = getenv("MOERUN_MOE_A2A_BACKEND");
    return v && *v ? v : "auto";
}

bool mr_cli_ep_wanted(int argc, char **argv) {
    const char *v = a2a_choice(argc, argv);
    if (!strcmp(v, "mpi")) return true;
    if (strcmp(v, "auto") != 0) return false;
    return mr_launcher_world(NULL, NULL) > 1; /* the resolver picks mpi then */
}

static char term_msg[160];
static size_t term_len;

static void on_term(int sig) {
    (void)sig;
    if (term_len) {
        ssize_t w = write(2, term_msg, term_len);
        (void)w;
    }
    _exit(143);
}

int mr_cli_ep_start(const char *cmd) {
    /* The server on rank 0 takes SIGTERM / SIGINT in a sigwait thread (a graceful drain): they are
     * blocked before MPI starts, so that the threads MPI starts inherit the mask (a signal that one
     * of them took would end the process at once). */
    const bool server = !strcmp(cmd, "serve");
    int launch_rank = 0;
    mr_launcher_world(&launch_rank, NULL);
    const bool drains = server && launch_rank == 0;
    if (drains) {
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGINT);
        sigaddset(&set, SIGTERM);
        pthread_sigmask(SIG_BLOCK, &set, NULL);
    }
    /* the server's exchanges run on its engine thread: one thread at a time, not always the main one */
    if (mr_ep_init(server) != MR_OK) {
        mr_cli_fail(cmd, "cannot start the expert-parallel group");
        return 1;
    }
    if (mr_ep_size() > 1 && !drains) {
        int n = snprintf(term_msg, sizeof term_msg,
                         "moerun %s [rank %d/%d]: stopped by SIGTERM (mpirun ends the job when a rank fails; its "
                         "message says which)\n",
                         cmd, mr_ep_rank(), mr_ep_size());
        term_len = n > 0 && (size_t)n < sizeof term_msg ? (size_t)n : 0;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_term;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, NULL);
    }
    if (mr_ep_size() > 1) {
        if (mr_ep_rank() > 0 && !getenv("MOERUN_EP_ALL_STDOUT")) {
            fflush(stdout);
            if (!freopen("/dev/null", "w", stdout)) { /* keep printing rather than fail */
            }
        }
    }
    return 0;
}

int mr_cli_ep_end(int rc) {
    if (!mr_ep_active()) return rc;
    fflush(NULL);
    if (mr_ep_broken()) return rc ? rc : 1; /* MPI_Finalize would wait for the rank that is gone */
    if (mr_ep_finalize() != MR_OK) {
        fprintf(stderr, "moerun [rank %d/%d]: %s\n", mr_ep_rank(), mr_ep_size(), mr_error_last());
        return rc ? rc : 1;
    }
    return rc;
}

bool mr_cli_ep_multi(void) { return mr_ep_active() && mr_ep_size() > 1; }

typedef struct {
    int32_t rc;
    int32_t first, n_local;
    int32_t pad;
    uint64_t rss;
} agree_rec;

/* The records of every rank (all [size]), or nonzero after a message. */
static int gather(const char *cmd, const char *stage, const agree_rec *mine, agree_rec *all, double timeout) {
    if (mr_ep_allgather(mine, all, sizeof *mine, timeout) != MR_OK) {
        char what[96];
        snprintf(what, sizeof what, "the ranks could not agree after %s", stage);
        mr_cli_fail(cmd, what);
        return 1;
    }
    return 0;
}

static int agree_records(const char *cmd, const char *stage, agree_rec *mine, agree_rec **all_out, double timeout) {
    *all_out = NULL;
    const int R = mr_ep_size();
    agree_rec *all = calloc((size_t)R, sizeof *all);
    if (!all) {
        fprintf(stderr, "moerun %s: out of memory\n", cmd);
        return mine->rc ? mine->rc : 1; /* the others will see this rank go */
    }
    if (gather(cmd, stage, mine, all, timeout)) {
        free(all);
        return mine->rc ? mine->rc : 1;
    }
    int rc = 0;
    for (int q = 0; q < R && !rc; q++)
        if (all[q].rc) {
            rc = all[q].rc;
            if (!mine->rc)
                fprintf(stderr, "moerun %s [rank %d/%d]: rank %d failed at %s (its message says why); stopping\n", cmd,
                        mr_ep_rank(), R, q, stage);
        }
    *all_out = all;
    return rc;
}

int mr_cli_ep_agree(const char *cmd, const char *stage, int rc) {
    if (!mr_cli_ep_multi()) return rc;
    agree_rec mine = {.rc = rc};
    agree_rec *all;
    int r = agree_records(cmd, stage, &mine, &all, AGREE_TIMEOUT_S);
    free(all);
    return r;
}

int mr_cli_ep_loaded(const char *cmd, int rc, const mr_model *m) {
    if (!mr_cli_ep_multi()) return rc;
    agree_rec mine = {.rc = rc, .rss = m ? mr_model_peak_rss(m) : 0};
    const mr_model_config *c = m ? mr_model_config_of(m) : NULL;
    if (c) {
        int first, n;
        mr_moe_placement_contiguous((int)c->n_experts, mr_ep_size(), mr_ep_rank(), &first, &n);
        mine.first = first, mine.n_local = n;
    }
    agree_rec *all;
    int r = agree_records(cmd, "loading", &mine, &all, LOAD_TIMEOUT_S);
    if (!r && all) {
        printf("expert parallel: %d ranks (%s)", mr_ep_size(), mr_ep_library());
        for (int q = 0; q < mr_ep_size(); q++)
            printf("%s rank %d experts %d..%d peak RSS %.1f MiB", q ? ";" : ":", q, all[q].first,
                   all[q].first + all[q].n_local - 1, (double)all[q].rss / (1024.0 * 1024.0));
        printf("\n");
    }
    free(all);
    return r;
}

/* What must be the same on every rank, and the limits that may differ (the smallest is taken). */
typedef struct {
    int32_t rc, runner, a2a, act_mode, weight_format, routing, kv_dtype, isa;
    int32_t ep_size, ep_rank, local_first, n_local;
    int64_t n_experts, top_k, hidden, inter, vocab, n_layers;
    int64_t kv_blocks, max_batch_tokens, max_running, context_length;
} exec_rec;

int mr_cli_ep_check_exec(const char *cmd, const mr_exec *x, mr_engine_opts *eo) {
    if (!mr_cli_ep_multi()) return 0;
    const int R = mr_ep_size(), me = mr_ep_rank();
    exec_rec mine = {.runner = x->runner->id, .a2a = x->a2a, .act_mode = x->act_mode,
                     .weight_format = x->weight_format, .routing = x->problem.routing, .kv_dtype = x->kv_dtype,
                     .isa = x->kernel_isa, .ep_size = x->ep_size, .ep_rank = x->problem.ep_rank,
                     .local_first = x->problem.local_first, .n_local = x->problem.n_local,
                     .n_experts = x->model->n_experts, .top_k = x->model->top_k, .hidden = x->model->hidden,
                     .inter = x->model->moe_inter, .vocab = x->model->vocab, .n_layers = x->model->n_layers};
    if (eo) {
        mine.kv_blocks = eo->kv_blocks;
        mine.max_batch_tokens = eo->max_batch_tokens;
        mine.max_running = eo->max_running_requests;
        mine.context_length = eo->context_length;
    }
    exec_rec *all = calloc((size_t)R, sizeof *all);
    if (!all) {
        fprintf(stderr, "moerun %s: out of memory\n", cmd);
        return 1;
    }
    if (mr_ep_allgather(&mine, all, sizeof mine, AGREE_TIMEOUT_S) != MR_OK) {
        mr_cli_fail(cmd, "the ranks could not compare their configurations");
        free(all);
        return 1;
    }
    int rc = 0;
    char diff[256] = "";
    for (int q = 0; q < R && !rc; q++) {
        const exec_rec *a = &all[q], *b = &all[0];
#define SAME(f, name)                                                                                          \
    if (!rc && a->f != b->f) {                                                                                 \
        snprintf(diff, sizeof diff, "%s is %lld on rank %d, %lld on rank 0", name, (long long)a->f, q,          \
                 (long long)b->f);                                                                             \
        rc = 2;                                                                                                \
    }
        SAME(runner, "the MoE runner (id)")
        SAME(a2a, "the a2a transport (id)")
        SAME(act_mode, "the activation mode (id)")
        SAME(weight_format, "the expert format (id)")
        SAME(routing, "the routing method (id)")
        SAME(kv_dtype, "the KV cache dtype (id)")
        SAME(ep_size, "ep_size")
        SAME(n_experts, "the experts")
        SAME(top_k, "top_k")
        SAME(hidden, "hidden_size")
        SAME(inter, "the expert intermediate size")
        SAME(vocab, "the vocabulary")
        SAME(n_layers, "the layers")
#undef SAME
        if (!rc && (a->ep_rank != q || a->ep_size != R)) {
            snprintf(diff, sizeof diff, "rank %d resolved itself as rank %d of %d (the launcher's environment)", q,
                     a->ep_rank, a->ep_size);
            rc = 2;
        }
    }
    if (rc) {
        fprintf(stderr, "moerun %s [rank %d/%d]: the ranks resolved different configurations: %s\n", cmd, me, R, diff);
        free(all);
        return rc;
    }
    for (int q = 1; q < R; q++)
        if (all[q].isa != all[0].isa && me == 0)
            fprintf(stderr,
                    "moerun %s: warning: rank %d runs kernel ISA %s, rank 0 %s: outputs will not equal one process "
                    "bit for bit (give every rank the same --kernel-isa)\n",
                    cmd, q, mr_kernel_isa_name((mr_kernel_isa)all[q].isa), mr_kernel_isa_name((mr_kernel_isa)all[0].isa));
    if (eo) {
        for (int q = 0; q < R; q++) {
#define MIN(f, g) \
    if (all[q].f < (int64_t)eo->g) eo->g = all[q].f
            MIN(kv_blocks, kv_blocks);
            MIN(max_batch_tokens, max_batch_tokens);
            MIN(context_length, context_length);
            if (all[q].max_running < eo->max_running_requests) eo->max_running_requests = (int)all[q].max_running;
#undef MIN
        }
    }
    free(all);
    return 0;
}
