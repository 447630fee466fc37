/* ep_internal.h — private to the MPI files of src/moe (ep_mpi.c, a2a_mpi.c):
 * the process group's communicator and its deadline-bounded wait, which
 * every exchange goes through. */
#ifndef MR_EP_INTERNAL_H
#define MR_EP_INTERNAL_H

#include <mpi.h>

#include "moe/moe_internal.h"

/* The group's communicator (a duplicate of MPI_COMM_WORLD whose errors
 * return as codes); MPI_COMM_NULL before mr_ep_init. */
MPI_Comm mr__ep_comm(void);

/* Before posting a collective: MR_EPEER (and the detail) when the group is
 * broken, or not started. what names the exchange for messages. */
mr_status mr__ep_check(const char *what);
/* Breaks the group with the message (the first one stays), prefixed with
 * "rank r of R: ", and returns MR_EPEER with it as the detail. */
mr_status mr__ep_break(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* An MPI call's return code as a status: MPI_SUCCESS -> MR_OK; anything
 * else breaks the group (MR_EPEER naming what and MPI's message). */
mr_status mr__ep_rc(int rc, const char *what);
/* Polls the posted request until it completes or the deadline passes
 * (timeout_s > 0: that; 0: the step deadline, and the step statistics
 * learn from it). Spins briefly, then sleeps between polls (idle: sleeps at
 * once, 1 ms). A missed deadline or an MPI error breaks the group. */
mr_status mr__ep_wait(MPI_Request *req, const char *what, double timeout_s, bool idle);

#endif
