/* cli_ep.h — the moerun commands under an MPI launcher: `mpirun -np R
 * moerun generate|probe|bench moe ... --moe-a2a-backend mpi` (expert
 * parallelism; spec/expert-parallel.md). main() starts the group before the
 * command and ends it after; the command runs on every rank, rank 0 prints
 * the results (the other ranks' stdout goes to /dev/null) and every rank
 * prints its own errors, marked with its rank. Each step that can fail on
 * one rank alone (resolution, loading) ends in an agreement, so that all
 * ranks leave together with the same exit status instead of waiting for a
 * rank that has gone. */
#ifndef MR_CLI_EP_H
#define MR_CLI_EP_H

#include <stdbool.h>

#include "moerun/config.h"
#include "moerun/engine.h"

/* Does this command line ask for the mpi transport? --moe-a2a-backend mpi
 * (flag or MOERUN_MOE_A2A_BACKEND), or no choice (auto) under a launcher
 * that started several ranks. */
bool mr_cli_ep_wanted(int argc, char **argv);
/* Starts the group: MPI, rank > 0 quiet on stdout, a SIGTERM notice naming
 * the rank (mpirun ends the job's ranks with SIGTERM when one fails).
 * Nonzero (exit 1) after a message when MPI cannot start. */
int mr_cli_ep_start(const char *cmd);
/* The exit status at the end of a command: the group ended when healthy
 * (MPI_Finalize after a barrier); a broken group exits at once, non-zero. */
int mr_cli_ep_end(int rc);
/* Several ranks run this command. */
bool mr_cli_ep_multi(void);
/* Agreement after a step every rank ran (stage names it): every rank's rc,
 * the first failing rank's one returned everywhere (0 when all succeeded);
 * a rank that succeeded while another failed says which. */
int mr_cli_ep_agree(const char *cmd, const char *stage, int rc);
/* The ranks' resolutions agree (runner, activation mode, formats, the
 * model's dimensions, ep size, each rank's place); eo (may be NULL): the
 * engine limits become the smallest over the ranks (the KV pool is sized
 * from each rank's free memory). Nonzero (exit 2) after a message naming
 * the first difference. A rank whose kernel ISA differs gets a warning. */
int mr_cli_ep_check_exec(const char *cmd, const mr_exec *x, mr_engine_opts *eo);
/* After loading: agreement on rc, then rank 0 prints each rank's experts
 * and peak RSS. */
struct mr_model;
int mr_cli_ep_loaded(const char *cmd, int rc, const struct mr_model *m);

#endif
