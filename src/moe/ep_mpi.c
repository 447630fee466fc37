/* ep_mpi.c — the expert-parallel process group over MPI (moerun/moe.h
 * "the expert-parallel process group"): start and end of MPI, the step
 * deadline, the broken state, and the exchanges outside the MoE layer
 * (broadcast, allgather, barriers, the alltoallv probe of the benchmark).
 *
 * Every collective is nonblocking and polled by mr__ep_wait against a
 * deadline: MPI offers no way to give up a blocking collective, and a peer
 * that died or stopped (SIGSTOP, a hung filesystem) would otherwise hold
 * every other rank forever. Polling spins for 50 us (a decode step's
 * exchange takes tens of microseconds on one machine), then yields the core
 * between tests up to 5 ms (a peer still finishing its experts: other
 * runnable threads go first, and the answer is seen at once), then sleeps
 * between tests, 20 us doubling to 1 ms, so that a long wait holds no core.
 *
 * Test hook: MOERUN_EP_FAULT="RANK:N:die" (or ":hang") makes rank RANK kill
 * itself with SIGKILL (or stop answering: sleep forever) at its N-th
 * exchange, so that tests can check what the survivors do. */
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe/ep_internal.h"

typedef struct {
    bool active;
    int rank, size;
    MPI_Comm comm;
    double timeout_s;       /* fixed step deadline, 0 = automatic */
    uint64_t last_done_ns;  /* when this rank's last exchange completed, 0 before the first */
    uint64_t slowest_ns;    /* the slowest step seen (between two step exchanges) */
    char broken[512];       /* the first failure, "" while healthy */
    /* test hook */
    long exchanges;
    int fault_rank;
    long fault_at;
    int fault_kind;         /* 0 none, 1 die, 2 hang */
    char library[256];
} ep_group;

static ep_group g = {.comm = MPI_COMM_NULL, .fault_rank = -1};

bool mr_ep_built(void) { return true; }
bool mr_ep_active(void) { return g.active; }
int mr_ep_rank(void) { return g.active ? g.rank : 0; }
int mr_ep_size(void) { return g.active ? g.size : 1; }
const char *mr_ep_library(void) { return g.library; }
void mr_ep_set_timeout(double seconds) { g.timeout_s = seconds > 0 ? seconds : 0; }
double mr_ep_timeout(void) { return g.timeout_s; }
const char *mr_ep_broken(void) { return g.broken[0] ? g.broken : NULL; }
MPI_Comm mr__ep_comm(void) { return g.comm; }

static void parse_fault(void) {
    const char *v = getenv("MOERUN_EP_FAULT");
    if (!v || !*v) return;
    int r;
    long n;
    char kind[8] = "";
    if (sscanf(v, "%d:%ld:%7s", &r, &n, kind) == 3 && r >= 0 && n >= 1 &&
        (!strcmp(kind, "die") || !strcmp(kind, "hang"))) {
        g.fault_rank = r;
        g.fault_at = n;
        g.fault_kind = !strcmp(kind, "die") ? 1 : 2;
    } else {
        MR_WARN("MOERUN_EP_FAULT='%s' ignored (expected RANK:N:die or RANK:N:hang)", v);
    }
}

mr_status mr_ep_init(bool serialized) {
    if (g.active) return MR_OK;
    const int want = serialized ? MPI_THREAD_SERIALIZED : MPI_THREAD_FUNNELED;
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited && MPI_Init_thread(NULL, NULL, want, &provided) != MPI_SUCCESS)
        return mr_error_set(MR_EPEER, "MPI_Init_thread failed");
    if (inited) MPI_Query_thread(&provided);
    if (provided < want)
        return mr_error_set(MR_EUNSUPPORTED, "the MPI library offers thread level %d, moerun needs %s", provided,
                            serialized ? "MPI_THREAD_SERIALIZED" : "MPI_THREAD_FUNNELED");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (MPI_Comm_dup(MPI_COMM_WORLD, &g.comm) != MPI_SUCCESS) return mr_error_set(MR_EPEER, "MPI_Comm_dup failed");
    MPI_Comm_set_errhandler(g.comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(g.comm, &g.rank);
    MPI_Comm_size(g.comm, &g.size);
    int len = 0;
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    if (MPI_Get_library_version(lib, &len) == MPI_SUCCESS) {
        /* the name and version ("Open MPI v4.1.4", of "Open MPI v4.1.4, package: ...") */
        size_t n = strcspn(lib, ",\n");
        snprintf(g.library, sizeof g.library, "%.*s", (int)(n < sizeof g.library ? n : sizeof g.library - 1), lib);
    }
    parse_fault();
    g.active = true;
    return MR_OK;
}

static mr_status broken_error(void) {
    return mr_error_set(MR_EPEER, "%s", g.broken);
}

mr_status mr__ep_break(const char *fmt, ...) {
    if (!g.broken[0]) {
        int n = snprintf(g.broken, sizeof g.broken, "rank %d of %d: ", g.rank, g.size);
        va_list ap;
        va_start(ap, fmt);
        if (n > 0 && (size_t)n < sizeof g.broken) vsnprintf(g.broken + n, sizeof g.broken - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return broken_error();
}

mr_status mr_ep_fail(const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return mr__ep_break("%s", msg);
}

mr_status mr__ep_check(const char *what) {
    if (!g.active) return mr_error_set(MR_EPEER, "%s: the expert-parallel group is not started (mr_ep_init)", what);
    if (g.broken[0]) return broken_error();
    g.exchanges++;
    if (g.fault_kind && g.rank == g.fault_rank && g.exchanges == g.fault_at) {
        fprintf(stderr, "moerun: rank %d: MOERUN_EP_FAULT: %s at exchange %ld (%s)\n", g.rank,
                g.fault_kind == 1 ? "dying" : "hanging", g.exchanges, what);
        fflush(stderr);
        if (g.fault_kind == 1) raise(SIGKILL);
        for (;;) {
            struct timespec ts = {1, 0};
            nanosleep(&ts, NULL);
        }
    }
    return MR_OK;
}

mr_status mr__ep_rc(int rc, const char *what) {
    if (rc == MPI_SUCCESS) return MR_OK;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", rc);
    return mr__ep_break("%s failed: %s", what, msg);
}

/* The deadline of a step exchange posted at `now` (seconds). */
static double step_deadline(uint64_t now) {
    if (g.timeout_s > 0) return g.timeout_s;
    uint64_t work = g.last_done_ns ? now - g.last_done_ns : 0;
    uint64_t base = work > g.slowest_ns ? work : g.slowest_ns;
    return 5.0 + 2.0 * (double)base * 1e-9;
}

mr_status mr__ep_wait(MPI_Request *req, const char *what, double timeout_s, bool idle) {
    const uint64_t t0 = mr_now_ns();
    const bool step = !(timeout_s > 0);
    const double dl = step ? step_deadline(t0) : timeout_s;
    const uint64_t dl_ns = (uint64_t)(dl * 1e9);
    long sleep_ns = idle ? 1000000 : 0;
    for (;;) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mr__ep_rc(rc, what);
        if (done) break;
        const uint64_t now = mr_now_ns();
        if (now - t0 > dl_ns)
            return mr__ep_break("%s did not complete within %.1f s: a peer rank died or stopped answering%s", what, dl,
                               step && g.timeout_s <= 0 ? " (the deadline: 5 s beyond twice the slowest step; "
                                                          "--ep-timeout sets it)"
                                                        : "");
        if (sleep_ns == 0 && now - t0 < 50000) continue; /* a short exchange: spin */
        if (sleep_ns == 0 && now - t0 < 5000000) { /* a peer still computing: give way to runnable threads */
            sched_yield();
            continue;
        }
        sleep_ns = sleep_ns == 0 ? 20000 : sleep_ns * 2 > 1000000 ? 1000000 : sleep_ns * 2;
        struct timespec ts = {0, sleep_ns};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    const uint64_t now = mr_now_ns();
    if (step && g.last_done_ns && now - g.last_done_ns > g.slowest_ns) g.slowest_ns = now - g.last_done_ns;
    g.last_done_ns = now;
    return MR_OK;
}

static mr_status check_bytes(size_t bytes, const char *what) {
    if (bytes > (size_t)INT32_MAX) return mr_error_set(MR_EOVERFLOW, "%s of %zu bytes: more than 2^31", what, bytes);
    return MR_OK;
}

mr_status mr_ep_bcast(void *buf, size_t bytes, int root, double timeout_s) {
    mr_status st;
    if ((st = check_bytes(bytes, "broadcast")) || (st = mr__ep_check("a broadcast"))) return st;
    MPI_Request rq;
    if ((st = mr__ep_rc(MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, g.comm, &rq), "MPI_Ibcast"))) return st;
    return mr__ep_wait(&rq, "a broadcast", timeout_s, false);
}

mr_status mr_ep_allgather(const void *mine, void *all, size_t bytes, double timeout_s) {
    mr_status st;
    if ((st = check_bytes(bytes, "allgather")) || (st = mr__ep_check("an allgather"))) return st;
    MPI_Request rq;
    if ((st = mr__ep_rc(MPI_Iallgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, g.comm, &rq),
                        "MPI_Iallgather")))
        return st;
    return mr__ep_wait(&rq, "an allgather", timeout_s, false);
}

static mr_status barrier(double timeout_s, bool idle) {
    mr_status st;
    if ((st = mr__ep_check("a barrier"))) return st;
    MPI_Request rq;
    if ((st = mr__ep_rc(MPI_Ibarrier(g.comm, &rq), "MPI_Ibarrier"))) return st;
    return mr__ep_wait(&rq, "a barrier", timeout_s, idle);
}

mr_status mr_ep_barrier(double timeout_s) { return barrier(timeout_s, false); }
mr_status mr_ep_barrier_idle(double timeout_s) { return barrier(timeout_s, true); }

mr_status mr_ep_finalize(void) {
    if (!g.active) return MR_OK;
    if (g.broken[0]) return broken_error();
    mr_status st = barrier(0, false); /* a rank still inside an exchange would make MPI_Finalize hang */
    if (st) return st;
    MPI_Comm_free(&g.comm);
    MPI_Finalize();
    g.active = false;
    return MR_OK;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

mr_status mr_ep_probe_alltoallv(const int64_t *send_bytes, int iters, double *median_s, uint64_t *bytes_out) {
    const int R = mr_ep_size();
    mr_status st = MR_OK;
    *median_s = 0;
    *bytes_out = 0;
    if (iters < 1 || iters > 1000) return mr_error_set(MR_EINVAL, "alltoallv probe: iters %d out of 1..1000", iters);
    int *sc = mr_calloc((size_t)R * 4, sizeof(int));
    double *t = mr_calloc((size_t)iters, sizeof(double));
    char *sb = NULL, *rb = NULL;
    if (!sc || !t) {
        st = MR_ENOMEM;
        goto out;
    }
    int *sd = sc + R, *rc = sc + 2 * R, *rd = sc + 3 * R;
    int64_t ns = 0, nr = 0;
    for (int r = 0; r < R; r++) {
        if (send_bytes[r] < 0 || send_bytes[r] > INT32_MAX / 2) {
            st = mr_error_set(MR_EINVAL, "alltoallv probe: %lld bytes to rank %d", (long long)send_bytes[r], r);
            goto out;
        }
        sc[r] = (int)send_bytes[r];
        if (r != g.rank) *bytes_out += (uint64_t)sc[r];
    }
    if ((st = mr__ep_check("the alltoallv probe"))) goto out;
    MPI_Request rq;
    if ((st = mr__ep_rc(MPI_Ialltoall(sc, 1, MPI_INT, rc, 1, MPI_INT, g.comm, &rq), "MPI_Ialltoall"))) goto out;
    if ((st = mr__ep_wait(&rq, "the alltoallv probe's counts", 60.0, false))) goto out;
    for (int r = 0; r < R; r++) {
        sd[r] = (int)ns;
        rd[r] = (int)nr;
        ns += sc[r];
        nr += rc[r];
        if (ns > INT32_MAX || nr > INT32_MAX) {
            st = mr_error_set(MR_EOVERFLOW, "alltoallv probe: more than 2^31 bytes");
            goto out;
        }
    }
    sb = mr_aligned_alloc(64, (size_t)ns + 64);
    rb = mr_aligned_alloc(64, (size_t)nr + 64);
    if (!sb || !rb) {
        st = MR_ENOMEM;
        goto out;
    }
    memset(sb, 1, (size_t)ns + 64);
    memset(rb, 0, (size_t)nr + 64);
    for (int it = -1; it < iters && !st; it++) { /* one warm-up */
        if ((st = barrier(60.0, false)) || (st = mr__ep_check("the alltoallv probe"))) break;
        const uint64_t a = mr_now_ns();
        st = mr__ep_rc(MPI_Ialltoallv(sb, sc, sd, MPI_BYTE, rb, rc, rd, MPI_BYTE, g.comm, &rq), "MPI_Ialltoallv");
        if (!st) st = mr__ep_wait(&rq, "the alltoallv probe", 60.0, false);
        if (it >= 0) t[it] = (double)(mr_now_ns() - a) * 1e-9;
    }
    if (!st) {
        qsort(t, (size_t)iters, sizeof(double), cmp_double);
        *median_s = iters % 2 ? t[iters / 2] : 0.5 * (t[iters / 2 - 1] + t[iters / 2]);
    }
out:
    mr_free(sc);
    mr_free(t);
    mr_aligned_free(sb);
    mr_aligned_free(rb);
    return st;
}
