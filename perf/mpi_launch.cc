#include "perf/mpi_launch.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace attnperf {

namespace {

const char* env(const char* name) {
  const char* v = getenv(name);
  return v && *v ? v : nullptr;
}

// An MPI launcher's own variables (Open MPI, MPICH's Hydra, PMIx as srun
// --mpi=pmix sets it). SLURM_PROCID alone is not enough: plain srun gives
// MPI no PMI to start from. ATTN_RANK / RANK mean the user chose the
// environment path.
bool underMpiLauncher() {
  if (env("ATTN_PERF_NO_MPI") && strcmp(env("ATTN_PERF_NO_MPI"), "0") != 0) return false;
  if (env("ATTN_RANK") || env("RANK")) return false;
  return env("OMPI_COMM_WORLD_RANK") || env("PMI_RANK") || env("PMIX_RANK");
}

// The launcher's size, to catch MPI_Init falling back to a singleton.
int launcherSize() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"})
    if (const char* s = env(v)) return atoi(s);
  return 0;
}

// What rank 0 broadcasts: the id, or that it could not make one (the
// others must not wait for an id that will never come).
struct IdMessage {
  int ok;
  attnUniqueId id;
};

}  // namespace

bool launchWithMpi(const RankBody& body, int device, int* rc) {
  if (!underMpiLauncher()) return false;
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int expected = launcherSize();
  if (size == 1 && expected > 1) {
    // Each process came up as its own singleton: MPI cannot reach the
    // launcher. The environment path still can.
    MPI_Finalize();
    fprintf(stderr, "MPI_Init gave a singleton under a launcher of %d ranks: using the environment\n",
            expected);
    return false;
  }
  IdMessage msg{};
  if (rank == 0) {
    attnResult_t r = attnGetUniqueId(&msg.id);
    msg.ok = r == attnSuccess;
    if (!msg.ok)
      fprintf(stderr, "attnGetUniqueId failed: %s: %s\n", attnGetErrorString(r), attnGetLastError(nullptr));
  }
  MPI_Bcast(&msg, int(sizeof msg), MPI_BYTE, 0, MPI_COMM_WORLD);
  *rc = 2;
  if (msg.ok) {
    attnConfig_t config = ATTN_CONFIG_INITIALIZER;
    if (device != ATTN_DEVICE_HOST) config.device = device;
    attnComm_t comm = nullptr;
    attnResult_t r = attnCommInitRankConfig(&comm, size, msg.id, rank, &config);
    if (r == attnSuccess)
      *rc = body(comm);
    else
      fprintf(stderr, "attnCommInitRankConfig (rank %d of %d over MPI) failed: %s: %s\n", rank, size,
              attnGetErrorString(r), attnGetLastError(nullptr));
  }
  MPI_Finalize();
  return true;
}

}  // namespace attnperf
