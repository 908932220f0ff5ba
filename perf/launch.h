// Starting ranks: as threads of this process (attnCommInitAll), as forked
// processes (the unique id travels through pipes), or as one rank of an
// external launcher (attnCommInitFromEnv). Each returns the worst rank's
// status as a process exit code.
#pragma once

#include <functional>
#include <vector>

#include "attncomm.h"

namespace attnperf {

// Runs one rank on a communicator it then owns; returns 0 ok, else non-zero.
using RankBody = std::function<int(attnComm_t comm)>;

// True when a launcher set ATTN_RANK, RANK, OMPI_COMM_WORLD_RANK, PMI_RANK
// or SLURM_PROCID with a step id (srun's tasks, not a batch shell).
// launchExternal then shares the unique id over MPI where the binary has it
// (perf/mpi_launch.h), else calls attnCommInitFromEnv.
bool launchedExternally();

// `device`: ATTN_DEVICE_HOST for host communicators, else the CUDA device
// every rank's communicator uses (ranks may share it).
// `body`, except that a rank whose body fails (returns non-zero) aborts its
// communicator, so peers waiting on it fail at once instead of at the
// timeout. For bodies that never free their communicator themselves.
RankBody abortingOnFailure(RankBody body);

int launchThreads(int nranks, const RankBody& body, int device = ATTN_DEVICE_HOST);

// nccl-tests' -t/-g: `nthreads` threads, each driving `perThread` ranks
// (ranks thread*perThread ...). The communicators come from one
// attnCommInitAll, or with parallelInit (-p 1) from one attnCommInitRank
// per rank, made side by side (each blocks until every rank has joined).
// `body` gets the thread's index and its communicators and owns them.
using SlotsBody = std::function<int(int thread, const std::vector<attnComm_t>& comms)>;
int launchThreadSlots(int nthreads, int perThread, bool parallelInit, const SlotsBody& body,
                      int device = ATTN_DEVICE_HOST);
int launchProcesses(int nranks, const RankBody& body, int device = ATTN_DEVICE_HOST);
int launchExternal(const RankBody& body, int device = ATTN_DEVICE_HOST);

}  // namespace attnperf
