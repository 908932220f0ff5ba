// Externally launched ranks of a perf binary built with MPI: under mpirun,
// mpiexec or srun with PMI, the unique id travels by MPI_Bcast as in
// nccl-tests, so no root address is needed. Only perf/ links MPI.
#pragma once

#include "perf/launch.h"

namespace attnperf {

// Runs `body` on a communicator made over MPI and returns true (its exit
// code in *rc) when the binary has MPI, an MPI launcher started this process
// and ATTN_PERF_NO_MPI is unset; else returns false and touches nothing, and
// the caller falls back to attnCommInitFromEnv.
bool launchWithMpi(const RankBody& body, int device, int* rc);

}  // namespace attnperf
