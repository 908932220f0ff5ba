// Perf binaries built without MPI: externally launched ranks always use
// attnCommInitFromEnv (which reads mpirun's and srun's own variables).
#include "perf/mpi_launch.h"

namespace attnperf {

bool launchWithMpi(const RankBody&, int, int*) { return false; }

}  // namespace attnperf
