// Which launcher started this process, and what it says: rank, size and the
// bootstrap root's host:port. Pure functions over a getenv-like lookup, so
// every launcher's variables are testable without touching the environment.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace attn {

// getenv-like: nullptr when unset.
using EnvLookup = std::function<const char*(const char*)>;

struct LaunchEnv {
  int rank = -1, nranks = -1;
  int localRank = -1, localSize = -1;  // -1: the launcher did not say
  std::string root;                    // host:port
  std::string source;                  // the rank variables, e.g. "SLURM_PROCID/SLURM_NTASKS"
  std::string rootFrom;                // how the root was found, for the INFO line
};

// Ports derived from a job id, when neither ATTN_ROOT nor MASTER_PORT is
// set: kJobPortBase + x % kJobPortSpan, below Linux's ephemeral range.
inline constexpr int kJobPortBase = 29600, kJobPortSpan = 3000;
int slurmJobPort(uint64_t jobId, uint64_t stepId);  // x = jobId * 31 + stepId
int namedJobPort(std::string_view jobId);           // x = a hash of the id

// Fills *env from the variables of ATTN, torchrun, Open MPI, MPICH/PMI or
// Slurm (in that order; see the README's table). `launcherPid` is the
// parent's pid: ranks of a single-host mpiexec share it (their job port when
// no job id is set); 0 when unknown. Returns "" or one line naming the
// variable (and value) that is missing or wrong.
std::string readLaunchEnv(const EnvLookup& get, LaunchEnv* env, uint64_t launcherPid = 0);

}  // namespace attn
