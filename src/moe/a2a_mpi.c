/* a2a_mpi.c — the `mpi` expert-parallel transport (mr_a2a_ops, moerun/moe.h;
 * protocol: shared/spec/expert-parallel.md). Every rank calls each exchange
 * of every layer in the same order; an idle rank sends and receives empty
 * sets. One layer call:
 *
 *   dispatch  1. MPI_Alltoall of a header per peer: the call's identity and
 *                the rows this origin sends to each of that peer's local
 *                experts (every rank checks that all are in the same call)
 *             2. MPI_Alltoallv of the rows, each packed as one wire row:
 *                  [plane 0][plane 1][plane 2][local expert id][slot]
 *                in the wire form of each plane (a bf16 plane holding E4M3
 *                values travels as 1 byte per element), then unpacked into
 *                planes grouped by local expert, origins in rank order (so
 *                that each expert sees its rows in the one-process order)
 *   combine   3. MPI_Alltoallv of the fp32 result rows back, in the order
 *                they came: row i of the origin's send order lands in y_send[i]
 *   gather    4. replicated calls: MPI_Allgatherv of each origin's share of
 *                the finalized outputs, in place
 *
 * Headers, one block of HB int32 per peer:
 *   [0] magic  [1] context number  [2] call number  [3] the origin's tokens
 *   [4] replicated: the batch's tokens in all, else -1  [5] rows to this peer
 *   [6 + e] rows for the peer's local expert e (e < max local experts)
 * Row counts and displacements are in rows (an MPI contiguous type of one
 * wire row), so that a call's byte counts never meet MPI's int limit.
 *
 * Every exchange waits through mr__ep_wait (deadline, errors as statuses).
 * A malformed header or row (a rank in another call, counts that do not add
 * up, an expert id or slot out of range) is MR_EPEER with what was found:
 * the ranks' state no longer agrees and the group is broken. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "moe/ep_internal.h"

#define HDR_MAGIC 0x6d724132 /* "mrA2" */
#define HDR_FIXED 6

typedef struct {
    int R, rank;
    int E, k, first, n_local, max_local, HB;
    int64_t H, max_rows, cap;
    mr_moe_rowset shape;                 /* row bytes and wire form of each plane */
    size_t wire_bytes;                   /* one packed row */
    size_t wire_off[MR_MOE_PLANES + 1];  /* plane offsets in it; [n_planes]: the meta (expert, slot) */
    size_t wire_size[MR_MOE_PLANES];
    MPI_Datatype row_t, y_t, g_t;        /* a wire row, a result row, a gathered output row */
    size_t g_bytes;                      /* g_t's size (0: not made yet) */
    int32_t *hsend, *hrecv;              /* [R][HB] */
    int *scount, *sdispl, *rcount, *rdispl, *gcount, *gdispl; /* [R] */
    int32_t *recv_off;                   /* [n_local + 1] */
    int64_t *cursor;                     /* [n_local] */
    int64_t *dst_of;                     /* [cap] received (source-major) row -> expert-major row */
    char *sbuf, *rbuf;                   /* [max_rows], [cap] wire rows */
    void *plane[MR_MOE_PLANES];          /* [cap] rows of each plane, expert-major */
    float *y_recv, *y_pack, *y_send;     /* [cap][H] expert-major, [cap][H] source-major, [max_rows][H] */
    int64_t n_recv;
    int32_t ctx_no, call_no;
    void *bufs[40];
    int n_bufs;
} mpi_state;

/* ---- wire forms ---- */
static uint8_t enc_e4m3[65536]; /* bf16 bits -> E4M3 code of the same value */
static uint16_t dec_e4m3[256];  /* E4M3 code -> bf16 bits */
static pthread_once_t wire_once = PTHREAD_ONCE_INIT;

static void wire_tables(void) {
    for (int c = 0; c < 256; c++) dec_e4m3[c] = mr_f32_to_bf16(mr_e4m3_to_f32((uint8_t)c));
    for (int b = 0; b < 65536; b++) {
        union {
            uint32_t u;
            float f;
        } v = {(uint32_t)b << 16};
        enc_e4m3[b] = mr_f32_to_e4m3(v.f);
    }
}

static size_t wire_size_of(const mr_moe_rowset *sh, int p) {
    return sh->plane[p].wire == MR_WIRE_BF16_AS_E4M3 ? sh->plane[p].row_bytes / 2 : sh->plane[p].row_bytes;
}

static void encode_plane(mr_moe_wire w, const void *src, size_t row_bytes, void *dst) {
    if (w == MR_WIRE_BF16_AS_E4M3) {
        const uint16_t *s = src;
        uint8_t *d = dst;
        for (size_t i = 0; i < row_bytes / 2; i++) d[i] = enc_e4m3[s[i]];
    } else {
        memcpy(dst, src, row_bytes);
    }
}

static void decode_plane(mr_moe_wire w, const void *src, size_t row_bytes, void *dst) {
    if (w == MR_WIRE_BF16_AS_E4M3) {
        const uint8_t *s = src;
        uint16_t *d = dst;
        for (size_t i = 0; i < row_bytes / 2; i++) d[i] = dec_e4m3[s[i]];
    } else {
        memcpy(dst, src, row_bytes);
    }
}

/* ---- open / close ---- */
static void *st_alloc(mpi_state *s, size_t n, size_t sz, mr_status *st) {
    size_t b;
    if (*st) return NULL;
    if (!mr_size_mul(n, sz, &b)) {
        *st = mr_error_set(MR_EOVERFLOW, "mpi transport: buffer of %zu x %zu bytes overflows", n, sz);
        return NULL;
    }
    MR_ASSERT(s->n_bufs < (int)(sizeof s->bufs / sizeof s->bufs[0]));
    void *p = mr_aligned_alloc(64, b ? b : 64);
    if (!p) {
        *st = MR_ENOMEM;
        return NULL;
    }
    memset(p, 0, b ? b : 64);
    s->bufs[s->n_bufs++] = p;
    return p;
}

static bool mpi_alive(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    return !fin;
}

static void mpi_close(void *state) {
    mpi_state *s = state;
    if (!s) return;
    if (mpi_alive()) {
        if (s->row_t != MPI_DATATYPE_NULL) MPI_Type_free(&s->row_t);
        if (s->y_t != MPI_DATATYPE_NULL) MPI_Type_free(&s->y_t);
        if (s->g_t != MPI_DATATYPE_NULL) MPI_Type_free(&s->g_t);
    }
    for (int i = 0; i < s->n_bufs; i++) mr_aligned_free(s->bufs[i]);
    mr_free(s);
}

static mr_status make_type(size_t bytes, MPI_Datatype *t) {
    if (bytes > (size_t)INT32_MAX) return mr_error_set(MR_EOVERFLOW, "mpi transport: a row of %zu bytes", bytes);
    mr_status st = mr__ep_rc(MPI_Type_contiguous((int)bytes, MPI_BYTE, t), "MPI_Type_contiguous");
    if (!st) st = mr__ep_rc(MPI_Type_commit(t), "MPI_Type_commit");
    return st;
}

static int32_t ctx_counter;

static mr_status mpi_open(const mr_moe_problem *p, int64_t max_rows, const mr_moe_rowset *shape, void **state) {
    *state = NULL;
    if (!mr_ep_active())
        return mr_error_set(MR_ESTATE, "the mpi transport needs the expert-parallel group started first (mr_ep_init; "
                                       "the moerun commands do it under mpirun)");
    if (p->ep_size != mr_ep_size() || p->ep_rank != mr_ep_rank())
        return mr_error_set(MR_EINVAL,
                            "the problem places this process as peer %d of %d, but it is MPI rank %d of %d (was it "
                            "resolved outside this mpirun?)",
                            p->ep_rank, p->ep_size, mr_ep_rank(), mr_ep_size());
    pthread_once(&wire_once, wire_tables);
    mr_status st = MR_OK;
    mpi_state *s = mr_calloc(1, sizeof *s);
    if (!s) return MR_ENOMEM;
    s->row_t = s->y_t = s->g_t = MPI_DATATYPE_NULL;
    s->R = p->ep_size;
    s->rank = p->ep_rank;
    s->E = p->n_experts;
    s->k = p->top_k;
    mr_moe_problem_local(p, &s->first, &s->n_local);
    s->max_local = (s->E + s->R - 1) / s->R;
    s->HB = HDR_FIXED + s->max_local;
    s->H = p->hidden;
    s->max_rows = max_rows;
    s->cap = max_rows * s->R; /* every origin may send all its rows here */
    s->shape = *shape;
    s->ctx_no = ++ctx_counter;
    if (s->cap > INT32_MAX) {
        mpi_close(s);
        return mr_error_set(MR_ECAPACITY, "mpi transport: %lld rows per call from %d ranks exceed 2^31",
                            (long long)max_rows, s->R);
    }
    size_t off = 0;
    for (int i = 0; i < shape->n_planes; i++) {
        s->wire_off[i] = off;
        s->wire_size[i] = wire_size_of(shape, i);
        off += (s->wire_size[i] + 3) / 4 * 4;
    }
    s->wire_off[shape->n_planes] = off;
    s->wire_bytes = off + 8; /* local expert id and slot */
    const size_t R = (size_t)s->R, cap = (size_t)s->cap, H = (size_t)s->H;
    s->hsend = st_alloc(s, R * (size_t)s->HB, 4, &st);
    s->hrecv = st_alloc(s, R * (size_t)s->HB, 4, &st);
    s->scount = st_alloc(s, R * 6, sizeof(int), &st);
    if (!st) {
        s->sdispl = s->scount + R, s->rcount = s->scount + 2 * R, s->rdispl = s->scount + 3 * R;
        s->gcount = s->scount + 4 * R, s->gdispl = s->scount + 5 * R;
    }
    s->recv_off = st_alloc(s, (size_t)s->n_local + 1, 4, &st);
    s->cursor = st_alloc(s, (size_t)s->n_local, 8, &st);
    s->dst_of = st_alloc(s, cap, 8, &st);
    s->sbuf = st_alloc(s, (size_t)max_rows, s->wire_bytes, &st);
    s->rbuf = st_alloc(s, cap, s->wire_bytes, &st);
    for (int i = 0; i < shape->n_planes; i++) s->plane[i] = st_alloc(s, cap, shape->plane[i].row_bytes, &st);
    s->y_recv = st_alloc(s, cap, H * 4, &st);
    s->y_pack = st_alloc(s, cap, H * 4, &st);
    s->y_send = st_alloc(s, (size_t)max_rows, H * 4, &st);
    if (!st) st = make_type(s->wire_bytes, &s->row_t);
    if (!st) st = make_type(H * 4, &s->y_t);
    if (st) {
        mpi_close(s);
        return st;
    }
    *state = s;
    return MR_OK;
}

/* ---- dispatch ---- */
#define BAD(...) mr__ep_break(__VA_ARGS__)

/* Checks every origin's header (every rank sees all of them, so every rank
 * comes to the same verdict) and sets the receive counts and offsets. */
static mr_status read_headers(mpi_state *s, const mr_a2a_xfer *x) {
    const int R = s->R, HB = s->HB;
    int64_t total = 0;
    for (int q = 0; q < R; q++) {
        const int32_t *h = s->hrecv + (size_t)q * (size_t)HB;
        if (h[0] != HDR_MAGIC) return BAD("the MoE dispatch header from rank %d is malformed", q);
        if (h[1] != s->ctx_no || h[2] != s->call_no)
            return BAD("rank %d is in MoE exchange %d of context %d, this rank in exchange %d of context %d: the "
                       "ranks' layer calls are out of step",
                       q, h[2], h[1], s->call_no, s->ctx_no);
        const int64_t want_total = x->replicated ? x->T_total : -1;
        if (h[4] != want_total)
            return BAD("rank %d runs %s %d tokens in this layer call, this rank %s %lld: the ranks' batches differ", q,
                       h[4] < 0 ? "its own" : "a replicated batch of", h[4] < 0 ? h[3] : h[4],
                       x->replicated ? "a replicated batch of" : "its own",
                       (long long)(x->replicated ? x->T_total : x->T));
        int64_t sum = 0;
        for (int e = 0; e < s->max_local; e++) {
            if (h[HDR_FIXED + e] < 0 || (e >= s->n_local && h[HDR_FIXED + e] != 0))
                return BAD("rank %d announces %d rows for local expert %d of %d", q, h[HDR_FIXED + e], e, s->n_local);
            sum += h[HDR_FIXED + e];
        }
        if (h[3] < 0 || h[5] < 0 || h[5] != sum || (int64_t)h[5] > (int64_t)h[3] * s->k)
            return BAD("rank %d announces %d rows of %d tokens, and %lld rows for this rank's experts: the counts do "
                       "not add up",
                       q, h[5], h[3], (long long)sum);
        s->rcount[q] = h[5];
        s->rdispl[q] = (int)total;
        total += h[5];
    }
    if (total > s->cap) return BAD("%lld rows for this rank's experts exceed its capacity of %lld", (long long)total,
                                   (long long)s->cap);
    int32_t acc = 0;
    for (int e = 0; e < s->n_local; e++) {
        s->recv_off[e] = acc;
        s->cursor[e] = acc;
        for (int q = 0; q < R; q++) acc += s->hrecv[(size_t)q * (size_t)HB + HDR_FIXED + e];
    }
    s->recv_off[s->n_local] = acc;
    s->n_recv = total;
    return MR_OK;
}

static mr_status mpi_dispatch(void *state, mr_a2a_xfer *x) {
    mpi_state *s = state;
    const int R = s->R, HB = s->HB;
    const mr_moe_placement *pl = x->place;
    const int64_t n = x->send.n;
    mr_status st;
    MPI_Request rq;
    x->bytes_sent = 0;
    x->row_wire_bytes = s->wire_bytes;
    if (x->n_peers != R || x->H != s->H || n > s->max_rows || x->send.n_planes != s->shape.n_planes)
        return mr_error_set(MR_EINVAL, "mpi transport: a call of %d peers, H %lld, %lld rows does not fit the "
                            "transport opened for %d peers, H %lld, %lld rows",
                            x->n_peers, (long long)x->H, (long long)n, R, (long long)s->H, (long long)s->max_rows);
    s->call_no++;
    /* 1. headers: the rows for each peer's local experts */
    memset(s->hsend, 0, (size_t)R * (size_t)HB * 4);
    for (int r = 0; r < R; r++) {
        int32_t *h = s->hsend + (size_t)r * (size_t)HB;
        h[0] = HDR_MAGIC, h[1] = s->ctx_no, h[2] = s->call_no, h[3] = (int32_t)x->T;
        h[4] = x->replicated ? (int32_t)x->T_total : -1;
        h[5] = (int32_t)x->send_counts[r];
    }
    int last_peer = 0;
    for (int64_t i = 0; i < n; i++) {
        const int32_t e = x->send_expert[i], r = pl->peer_of[e];
        MR_ASSERT(r >= last_peer); /* the route phase groups the rows by peer */
        last_peer = r;
        s->hsend[(size_t)r * (size_t)HB + HDR_FIXED + (size_t)(e - pl->peer_first[r])]++;
    }
    if ((st = mr__ep_check("the MoE dispatch (counts)"))) return st;
    if ((st = mr__ep_rc(MPI_Ialltoall(s->hsend, HB, MPI_INT32_T, s->hrecv, HB, MPI_INT32_T, mr__ep_comm(), &rq),
                        "MPI_Ialltoall")))
        return st;
    if ((st = mr__ep_wait(&rq, "the MoE dispatch (counts)", 0, false))) return st;
    if ((st = read_headers(s, x))) return st;
    /* 2. the rows, packed */
    int64_t acc = 0;
    for (int r = 0; r < R; r++) {
        s->scount[r] = (int)x->send_counts[r];
        s->sdispl[r] = (int)acc;
        acc += x->send_counts[r];
        if (r != s->rank) x->bytes_sent += (uint64_t)x->send_counts[r] * s->wire_bytes + (uint64_t)HB * 4;
    }
    MR_ASSERT(acc == n);
    const int np = s->shape.n_planes;
#pragma omp parallel for schedule(static) if (n > 64)
    for (int64_t i = 0; i < n; i++) {
        char *w = s->sbuf + (size_t)i * s->wire_bytes;
        for (int p = 0; p < np; p++)
            encode_plane(s->shape.plane[p].wire, (const char *)x->send.plane[p].base + (size_t)i * s->shape.plane[p].row_bytes,
                         s->shape.plane[p].row_bytes, w + s->wire_off[p]);
        const int32_t e = x->send_expert[i], meta[2] = {e - pl->peer_first[pl->peer_of[e]], x->send_slot[i]};
        memcpy(w + s->wire_off[np], meta, 8);
    }
    if ((st = mr__ep_check("the MoE dispatch (rows)"))) return st;
    if ((st = mr__ep_rc(MPI_Ialltoallv(s->sbuf, s->scount, s->sdispl, s->row_t, s->rbuf, s->rcount, s->rdispl,
                                       s->row_t, mr__ep_comm(), &rq),
                        "MPI_Ialltoallv")))
        return st;
    if ((st = mr__ep_wait(&rq, "the MoE dispatch (rows)", 0, false))) return st;
    /* unpack: every row checked against its origin's header (grouped by local expert, the announced
     * count of each, a slot of the origin's tokens), placed expert-major, origins in rank order */
    for (int q = 0; q < R; q++) {
        const int32_t *h = s->hrecv + (size_t)q * (size_t)HB;
        int64_t j = s->rdispl[q];
        for (int e = 0; e < s->n_local; e++)
            for (int32_t c = 0; c < h[HDR_FIXED + e]; c++, j++) {
                int32_t meta[2];
                memcpy(meta, s->rbuf + (size_t)j * s->wire_bytes + s->wire_off[np], 8);
                if (meta[0] != e)
                    return BAD("row %lld from rank %d is for local expert %d, its header announced expert %d there",
                               (long long)(j - s->rdispl[q]), q, meta[0], e);
                if (meta[1] < 0 || (int64_t)meta[1] >= (int64_t)h[3] * s->k)
                    return BAD("row %lld from rank %d has slot %d, outside its %d tokens x top-%d",
                               (long long)(j - s->rdispl[q]), q, meta[1], h[3], s->k);
                s->dst_of[j] = s->cursor[e]++;
            }
    }
    const int64_t nr = s->n_recv;
#pragma omp parallel for schedule(static) if (nr > 64)
    for (int64_t j = 0; j < nr; j++) {
        const char *w = s->rbuf + (size_t)j * s->wire_bytes;
        const int64_t d = s->dst_of[j];
        for (int p = 0; p < np; p++)
            decode_plane(s->shape.plane[p].wire, w + s->wire_off[p], s->shape.plane[p].row_bytes,
                         (char *)s->plane[p] + (size_t)d * s->shape.plane[p].row_bytes);
    }
    x->recv = s->shape;
    x->recv.n = nr;
    for (int p = 0; p < np; p++) x->recv.plane[p].base = s->plane[p];
    x->recv_offsets = s->recv_off;
    x->y_recv = s->y_recv;
    return MR_OK;
}

/* ---- combine ---- */
static mr_status mpi_combine(void *state, mr_a2a_xfer *x) {
    mpi_state *s = state;
    const int64_t nr = s->n_recv;
    const size_t H = (size_t)s->H;
    mr_status st;
    x->bytes_sent = 0;
#pragma omp parallel for schedule(static) if (nr > 64)
    for (int64_t j = 0; j < nr; j++) memcpy(s->y_pack + (size_t)j * H, s->y_recv + (size_t)s->dst_of[j] * H, H * 4);
    for (int q = 0; q < s->R; q++)
        if (q != s->rank) x->bytes_sent += (uint64_t)s->rcount[q] * H * 4;
    if ((st = mr__ep_check("the MoE combine"))) return st;
    MPI_Request rq;
    if ((st = mr__ep_rc(MPI_Ialltoallv(s->y_pack, s->rcount, s->rdispl, s->y_t, s->y_send, s->scount, s->sdispl,
                                       s->y_t, mr__ep_comm(), &rq),
                        "MPI_Ialltoallv")))
        return st;
    if ((st = mr__ep_wait(&rq, "the MoE combine", 0, false))) return st;
    x->y_send = s->y_send;
    return MR_OK;
}

/* ---- gather (replicated calls) ---- */
static mr_status mpi_gather(void *state, mr_a2a_xfer *x, void *out, int64_t T, size_t row_bytes) {
    mpi_state *s = state;
    mr_status st;
    x->bytes_sent = 0;
    if (s->g_bytes != row_bytes) {
        if (s->g_t != MPI_DATATYPE_NULL) MPI_Type_free(&s->g_t);
        s->g_bytes = 0;
        if ((st = make_type(row_bytes, &s->g_t))) return st;
        s->g_bytes = row_bytes;
    }
    for (int r = 0; r < s->R; r++) {
        int64_t f, n;
        mr_moe_share(T, s->R, r, &f, &n);
        s->gcount[r] = (int)n;
        s->gdispl[r] = (int)f;
        if (r == s->rank) x->bytes_sent = (uint64_t)n * row_bytes * (uint64_t)(s->R - 1);
    }
    if ((st = mr__ep_check("the MoE output gather"))) return st;
    MPI_Request rq;
    if ((st = mr__ep_rc(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, s->gcount, s->gdispl, s->g_t,
                                        mr__ep_comm(), &rq),
                        "MPI_Iallgatherv")))
        return st;
    return mr__ep_wait(&rq, "the MoE output gather", 0, false);
}

static const mr_a2a_ops a2a_mpi = {.id = MR_A2A_MPI, .name = "mpi", .open = mpi_open, .close = mpi_close,
                                   .dispatch = mpi_dispatch, .combine = mpi_combine, .gather = mpi_gather};

const mr_a2a_ops *mr__a2a_mpi_ops(void) { return &a2a_mpi; }
