/* a2a.c — the expert-parallel transports behind one interface
 * (mr_a2a_ops, moerun/moe.h) and the contiguous expert placement.
 *
 * `none` is the identity of one process: dispatch hands the origin's rows
 * to the experts phase where they are (every expert is local, the rows are
 * already grouped by expert, recv_offsets are the route phase's offsets),
 * and combine hands the result rows back where the experts wrote them. It
 * copies nothing. A transport between processes (MPI) keeps the same
 * contract: dispatch delivers each peer's rows grouped by local expert,
 * combine returns result row i of the origin's send order into y_send[i].
 * The mpi transport is a2a_mpi.c (a2a_nompi.c in a build without MPI). */
#include <pthread.h>
#include <string.h>

#include "moe/moe_internal.h"

void mr_moe_placement_contiguous(int E, int R, int r, int *first, int *n) {
    const int base = E / R, extra = E % R;
    *first = r * base + (r < extra ? r : extra);
    *n = base + (r < extra ? 1 : 0);
}

int mr_moe_placement_owner(int E, int R, int e) {
    const int base = E / R, extra = E % R;
    /* the first `extra` peers own base + 1 experts each */
    if (e < extra * (base + 1)) return e / (base + 1);
    return extra + (e - extra * (base + 1)) / (base > 0 ? base : 1);
}

void mr_moe_share(int64_t T, int R, int r, int64_t *first, int64_t *n) {
    /* T <= 2^20 and R <= 65536: no overflow */
    *first = T * r / R;
    *n = T * (r + 1) / R - *first;
}

/* ---- none: one process, identity ---- */
typedef struct {
    int n_experts;
} none_state;

static mr_status none_open(const mr_moe_problem *p, int64_t max_rows, const mr_moe_rowset *shape, void **state) {
    (void)max_rows;
    (void)shape;
    if (p->ep_size > 1)
        return mr_error_set(MR_EINVAL, "a2a transport none runs one process, not ep_size %d", p->ep_size);
    none_state *s = mr_calloc(1, sizeof *s);
    if (!s) return MR_ENOMEM;
    s->n_experts = p->n_experts;
    *state = s;
    return MR_OK;
}

static void none_close(void *state) { mr_free(state); }

static mr_status none_dispatch(void *state, mr_a2a_xfer *x) {
    (void)state;
    MR_ASSERT(x->n_peers == 1 && x->send_counts[0] == x->send.n);
    x->recv = x->send;
    x->bytes_sent = 0;
    /* recv_offsets: the origin's offsets (set by the caller) already cover every expert */
    return MR_OK;
}

static mr_status none_combine(void *state, mr_a2a_xfer *x) {
    (void)state;
    x->y_send = x->y_recv;
    x->bytes_sent = 0;
    return MR_OK;
}

static const mr_a2a_ops a2a_none = {.id = MR_A2A_NONE, .name = "none", .open = none_open, .close = none_close,
                                    .dispatch = none_dispatch, .combine = none_combine, .gather = NULL};

/* One row per transport id; NULL where this build has none (mpi: a2a_mpi.c,
 * or NULL from a2a_nompi.c). Filled on first use; tests may replace rows. */
static const mr_a2a_ops *transports[MR_A2A_COUNT];
static pthread_once_t transports_once = PTHREAD_ONCE_INIT;

static void transports_init(void) {
    transports[MR_A2A_NONE] = &a2a_none;
    transports[MR_A2A_MPI] = mr__a2a_mpi_ops();
}
static void transports_fill(void) { pthread_once(&transports_once, transports_init); }

const mr_a2a_ops *mr_a2a_ops_get(mr_a2a id) {
    if ((int)id < 0 || id >= MR_A2A_COUNT) return NULL;
    transports_fill();
    return transports[id];
}

const mr_a2a_ops *mr_a2a_debug_set(mr_a2a id, const mr_a2a_ops *ops) {
    if ((int)id < 0 || id >= MR_A2A_COUNT) return NULL;
    transports_fill();
    const mr_a2a_ops *old = transports[id];
    transports[id] = ops;
    return old;
}
