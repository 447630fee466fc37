/* dev/perf/probe.h — ceilings measured in the same run as the kernels:
 * multi-threaded read bandwidth of a pre-faulted buffer and instruction peaks. */
#ifndef MR_DEV_PROBE_H
#define MR_DEV_PROBE_H
#include <stddef.h>
#include <stdint.h>
/* iters of 12 independent zmm instructions; returns a checksum. */
double mr_pk_probe_fma(int64_t iters);
double mr_pk_probe_dpbf16(int64_t iters);
double mr_pk_probe_dpbusd(int64_t iters);
#endif
