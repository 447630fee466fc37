/* ep_nompi.c — the process group and the mpi transport of a build without
 * MPI (CMakeLists.txt builds it instead of ep_mpi.c and a2a_mpi.c): one
 * process, no transport; starting MPI says how to get it. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "moe/moe_internal.h"

bool mr_ep_built(void) { return false; }
mr_status mr_ep_init(bool serialized) {
    (void)serialized;
    return mr_error_set(MR_EUNSUPPORTED, "this build has no MPI (install libopenmpi-dev and rebuild for the mpi "
                                         "expert-parallel transport)");
}
bool mr_ep_active(void) { return false; }
int mr_ep_rank(void) { return 0; }
int mr_ep_size(void) { return 1; }
const char *mr_ep_library(void) { return ""; }
void mr_ep_set_timeout(double seconds) { (void)seconds; }
double mr_ep_timeout(void) { return 0; }
const char *mr_ep_broken(void) { return NULL; }
mr_status mr_ep_fail(const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return mr_error_set(MR_EPEER, "%s", msg);
}

static mr_status not_built(void) { return mr_error_set(MR_EUNSUPPORTED, "this build has no MPI"); }

mr_status mr_ep_bcast(void *buf, size_t bytes, int root, double timeout_s) {
    (void)buf, (void)bytes, (void)timeout_s;
    return root == 0 ? MR_OK : not_built();
}
mr_status mr_ep_allgather(const void *mine, void *all, size_t bytes, double timeout_s) {
    (void)timeout_s;
    if (bytes && mine != all) memcpy(all, mine, bytes);
    return MR_OK;
}
mr_status mr_ep_barrier(double timeout_s) {
    (void)timeout_s;
    return MR_OK;
}
mr_status mr_ep_barrier_idle(double timeout_s) {
    (void)timeout_s;
    return MR_OK;
}
mr_status mr_ep_probe_alltoallv(const int64_t *send_bytes, int iters, double *median_s, uint64_t *bytes_out) {
    (void)send_bytes, (void)iters;
    *median_s = 0;
    *bytes_out = 0;
    return not_built();
}
mr_status mr_ep_finalize(void) { return MR_OK; }

const mr_a2a_ops *mr__a2a_mpi_ops(void) { return NULL; }
